/* One idallocd per data directory: a second one for the same directory
 * fails with one line naming the holder, touching nothing; a node killed
 * with kill -9 leaves no lock behind. Real processes. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "tests/lib/harness.h"

/* --- fixture ------------------------------------------------------------- */

static struct tc c;
static char out[16384];

static void teardown(void)
{
    tc_destroy(&c);
}

/* --- helpers ------------------------------------------------------------- */

static int wait_log(int i, const char *needle, unsigned ms)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "grep -c '%s' %s/node%d.log", needle, c.dir,
             i + 1);
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        if (tc_run(out, sizeof(out), "%s", cmd) == 0) {
            return 1;
        }
        tc_sleep_ms(100);
    }
    return 0;
}

/* A listing of node 1's directory: names, sizes, modification times. */
static void listing(char *buf, size_t cap)
{
    tc_run(buf, cap, "ls -l --full-time %s/data/node1", c.dir);
}

/* --- tests --------------------------------------------------------------- */

Test(datalock,
     second_node_on_a_directory_fails_touching_nothing,
     .fini = teardown,
     .timeout = 60)
{
    tc_setup(&c, 3, NULL);
    tc_spawn(&c, 0);
    cr_assert(wait_log(0, "node: started", 20000), "node 1 did not start");
    /* Node 1 stopped meanwhile (it still holds the lock): its own work,
     * such as making the next log segment on a thread of its own, changes
     * its directory at any moment. */
    cr_assert_eq(tc_signal(&c, 0, SIGSTOP), 0);
    for (int t = 0; t < 200 && tc_proc_state(c.pid[0]) != 'T'; t++) {
        tc_sleep_ms(10);
    }
    cr_assert_eq(tc_proc_state(c.pid[0]), 'T', "node 1 did not stop");
    char before[4096], after[4096];
    listing(before, sizeof(before));

    int rv = tc_run(out, sizeof(out), "%s --config %s --node 1 2>&1",
                    tc_bin("idallocd"), c.conf);
    cr_assert_eq(rv, 1, "exit %d: %s", rv, out);
    char want[128];
    snprintf(want, sizeof(want), "is in use by another idallocd (pid %d)",
             (int)c.pid[0]);
    cr_assert(strstr(out, want) != NULL, "%s", out);
    cr_assert(strstr(out, "data/node1") != NULL, "names the directory: %s",
              out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    cr_assert_null(strstr(out, "restored"), "it read the directory: %s", out);
    listing(after, sizeof(after));
    cr_assert_str_eq(before, after, "the directory changed");
    cr_assert_eq(tc_signal(&c, 0, SIGCONT), 0);

    /* kill -9 leaves no lock: the node starts again at once (its log is
     * appended to: a second "restored" line, and it answers). */
    int restored = tc_log_count(&c, 0, "node: restored");
    cr_assert_geq(restored, 1);
    tc_signal(&c, 0, SIGKILL);
    tc_spawn(&c, 0);
    for (uint64_t end = tc_now_ms() + 20000;
         tc_log_count(&c, 0, "node: restored") <= restored &&
         tc_now_ms() < end;) {
        tc_sleep_ms(100);
    }
    cr_assert_gt(tc_log_count(&c, 0, "node: restored"), restored,
                 "node 1 did not restart");
    cr_assert_eq(tc_log_count(&c, 0, "is in use by another idallocd"), 0,
                 "the killed node's lock held the restart back");
    int st = tc_signal(&c, 0, SIGTERM);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "node 1 did not run until stopped");
}
