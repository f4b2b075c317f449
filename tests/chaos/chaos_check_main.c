/* build/prog/chaos_check FILE: check a recorded chaos history. */
#include <stdio.h>

#include "tests/chaos/checker.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: chaos_check HISTORY_FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (f == NULL) {
        perror(argv[1]);
        return 2;
    }
    struct history h;
    history_init(&h, 0);
    int rv = history_read(&h, f);
    fclose(f);
    if (rv != 0) {
        return 2;
    }
    struct check_report r;
    size_t v = history_check(&h, &r);
    check_report_print(&r, stdout);
    history_free(&h);
    return v == 0 ? 0 : 1;
}
