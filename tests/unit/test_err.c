/* Error codes: every code has a distinct name, a message and a class. */
#include <criterion/criterion.h>
#include <string.h>

#include "idalloc_errors.h"

static const int all_codes[] = {
#define CODE(name, value, cls, text) value,
    IDA_ERRORS(CODE)
#undef CODE
};
#define NCODES (sizeof(all_codes) / sizeof(all_codes[0]))

Test(err, every_code_has_a_message_and_name)
{
    for (size_t i = 0; i < NCODES; i++) {
        int c = all_codes[i];
        cr_assert_str_neq(idalloc_strerror(c), "unknown error", "code %d", c);
        cr_assert_str_neq(idalloc_errname(c), "IDA_E?", "code %d", c);
        cr_assert_neq(idalloc_errclass(c), IDA_ERR_CLASS_OK, "code %d", c);
    }
}

Test(err, codes_are_distinct_and_nonzero)
{
    for (size_t i = 0; i < NCODES; i++) {
        cr_assert_neq(all_codes[i], 0);
        for (size_t j = i + 1; j < NCODES; j++) {
            cr_assert_neq(all_codes[i], all_codes[j]);
            cr_assert_str_neq(idalloc_errname(all_codes[i]),
                              idalloc_errname(all_codes[j]));
        }
    }
}

Test(err, wire_values_are_stable)
{
    /* These travel on the wire: renumbering breaks old clients. */
    cr_assert_eq(IDA_EINVAL, 1);
    cr_assert_eq(IDA_ENOTLEADER, 3);
    cr_assert_eq(IDA_EEXHAUSTED, 4);
    cr_assert_eq(IDA_ETIMEDOUT, 17);
    cr_assert_str_eq(idalloc_errname(IDA_ETAGMISMATCH), "IDA_ETAGMISMATCH");
}

Test(err, unknown_code)
{
    cr_assert_str_eq(idalloc_strerror(9999), "unknown error");
    cr_assert_str_eq(idalloc_strerror(-5), "unknown error");
    cr_assert_str_eq(idalloc_strerror(0), "success");
    cr_assert_eq(idalloc_errclass(9999), IDA_ERR_CLASS_INTERNAL);
}

Test(err, exit_codes_follow_the_cli_contract)
{
    cr_assert_eq(idalloc_exit_code(IDA_OK), 0);
    cr_assert_eq(idalloc_exit_code(IDA_ENOPOOL), 1);
    cr_assert_eq(idalloc_exit_code(IDA_EEXHAUSTED), 1);
    cr_assert_eq(idalloc_exit_code(IDA_ETAGMISMATCH), 1);
    cr_assert_eq(idalloc_exit_code(IDA_ENOTFOUND), 1);
    cr_assert_eq(idalloc_exit_code(IDA_EINVAL), 2);
    cr_assert_eq(idalloc_exit_code(IDA_ETIMEDOUT), 3);
    cr_assert_eq(idalloc_exit_code(IDA_EUNAVAIL), 3);
}
