#include "idalloc_errors.h"

#include <stddef.h>

struct err_info
{
    int code;
    enum ida_err_class cls;
    const char *name;
    const char *text;
};

static const struct err_info err_table[] = {
#define ROW(name, value, cls, text) {value, IDA_ERR_CLASS_##cls, #name, text},
    IDA_ERRORS(ROW)
#undef ROW
};

static const struct err_info *find(int code)
{
    for (size_t i = 0; i < sizeof(err_table) / sizeof(err_table[0]); i++) {
        if (err_table[i].code == code) {
            return &err_table[i];
        }
    }
    return NULL;
}

const char *idalloc_strerror(int code)
{
    if (code == IDA_OK) {
        return "success";
    }
    const struct err_info *e = find(code);
    return e != NULL ? e->text : "unknown error";
}

const char *idalloc_errname(int code)
{
    if (code == IDA_OK) {
        return "IDA_OK";
    }
    const struct err_info *e = find(code);
    return e != NULL ? e->name : "IDA_E?";
}

enum ida_err_class idalloc_errclass(int code)
{
    if (code == IDA_OK) {
        return IDA_ERR_CLASS_OK;
    }
    const struct err_info *e = find(code);
    return e != NULL ? e->cls : IDA_ERR_CLASS_INTERNAL;
}

int idalloc_exit_code(int code)
{
    switch (idalloc_errclass(code)) {
        case IDA_ERR_CLASS_OK:
            return 0;
        case IDA_ERR_CLASS_DEFINITE:
            return 1;
        case IDA_ERR_CLASS_USAGE:
            return 2;
        case IDA_ERR_CLASS_UNKNOWN:
        case IDA_ERR_CLASS_INTERNAL:
            return 3;
    }
    return 3;
}
