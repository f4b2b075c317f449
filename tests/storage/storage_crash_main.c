/* storage_crash [--rounds N] [--seed S] [--dir DIR]: many crash rounds
 * (make chaos-storage ROUNDS=n). Prints a summary; exit 0 on success. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/storage/crash.h"
#include "tests/storage/helpers.h"

int main(int argc, char **argv)
{
    unsigned rounds = 500;
    uint64_t seed = 1;
    const char *dir_arg = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rounds") == 0) {
            rounds = (unsigned)strtoul(argv[i + 1], NULL, 10);
        } else if (strcmp(argv[i], "--seed") == 0) {
            seed = strtoull(argv[i + 1], NULL, 10);
        } else if (strcmp(argv[i], "--dir") == 0) {
            dir_arg = argv[i + 1];
        } else {
            fprintf(stderr, "usage: %s [--rounds N] [--seed S] [--dir DIR]\n",
                    argv[0]);
            return 2;
        }
    }
    char dir[256];
    if (dir_arg != NULL) {
        snprintf(dir, sizeof(dir), "%s", dir_arg);
    } else if (ida_test_tmpdir(dir, sizeof(dir), "crash") != 0) {
        perror("mkdtemp");
        return 1;
    }
    struct ida_crash_stats st;
    char err[512] = "";
    int rv = ida_crash_run(dir, rounds, seed, &st, err, sizeof(err));
    printf(
        "storage crash: seed=%llu rounds=%u steps_reported=%lu "
        "in_flight_found=%u killed_before_first_report=%u "
        "child_finished=%u entries_checked=%lu snapshot_steps=%lu: %s\n",
        (unsigned long long)seed, st.rounds, st.batches_reported,
        st.in_flight_found, st.killed_before_first_report, st.child_finished,
        st.entries_checked, st.snapshots_reported, rv == 0 ? "ok" : "FAILED");
    if (rv != 0) {
        fprintf(stderr, "storage crash: %s (dir %s kept)\n", err, dir);
        return 1;
    }
    if (dir_arg == NULL) {
        ida_test_rmrf(dir);
    }
    return 0;
}
