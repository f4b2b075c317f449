/* The README walkthrough, driven as a user would: scripts/run-cluster.sh
 * (what `make run` runs) on a cluster file with free ports, kill -9 of one
 * node, an alloc that still succeeds, the node restarted with
 * `run-cluster.sh --node ID` (what `make node N=ID` runs), `idalloc status`
 * showing it caught up, then SIGINT (Ctrl-C) to the scripts: every node is
 * gone and the scripts exit 0. */
#define _GNU_SOURCE /* close_range() */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/harness.h"

/* --- fixture ------------------------------------------------------------- */

static struct tc c;
static pid_t scripts[2]; /* run-cluster.sh processes (own process groups) */

static void teardown(void)
{
    for (int i = 0; i < 2; i++) {
        if (scripts[i] > 0) {
            kill(-scripts[i], SIGKILL); /* the script and its nodes */
            waitpid(scripts[i], NULL, 0);
            scripts[i] = 0;
        }
    }
    tc_destroy(&c);
}

/* --- helpers ------------------------------------------------------------- */

/* Start scripts/run-cluster.sh ARGS... with stderr into @log. */
static pid_t start_script(const char *log, const char *node)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        dup2(fd, 2);
        dup2(fd, 1);
        close_range(3, ~0u, 0);
        if (node != NULL) {
            execl("/bin/bash", "bash", "scripts/run-cluster.sh", "--node", node,
                  c.conf, (char *)NULL);
        } else {
            execl("/bin/bash", "bash", "scripts/run-cluster.sh", c.conf,
                  (char *)NULL);
        }
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

static void read_file(const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        size_t n = fread(buf, 1, cap - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
}

/* Wait up to @ms for "node ID pid N" in @log; N, or 0. */
static pid_t wait_node_pid(const char *log, int id, unsigned ms)
{
    char want[32];
    snprintf(want, sizeof(want), "node %d pid ", id);
    static char buf[65536];
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        read_file(log, buf, sizeof(buf));
        const char *p = strstr(buf, want);
        if (p != NULL) {
            return (pid_t)atoi(p + strlen(want));
        }
        tc_sleep_ms(50);
    }
    return 0;
}

static int wait_text(const char *log, const char *want, unsigned ms)
{
    static char buf[65536];
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        read_file(log, buf, sizeof(buf));
        if (strstr(buf, want) != NULL) {
            return 1;
        }
        tc_sleep_ms(50);
    }
    return 0;
}

/* `idalloc status` until it exits 0 (a leader and every node answered)
 * with every node at the same applied index, at least @min. */
static int wait_caught_up(uint64_t min, unsigned ms, char *out, size_t cap)
{
    for (uint64_t end = tc_now_ms() + ms; tc_now_ms() < end;) {
        int rv = tc_run(out, cap, "%s --cluster %s --timeout 3000 status",
                        tc_bin("idalloc"), c.addrs);
        uint64_t applied[3];
        int n = 0;
        for (const char *p = strstr(out, "applied="); p != NULL && n < 3;
             p = strstr(p + 1, "applied=")) {
            applied[n++] = strtoull(p + strlen("applied="), NULL, 10);
        }
        if (rv == 0 && n == 3 && applied[0] >= min &&
            applied[0] == applied[1] && applied[1] == applied[2]) {
            return 1;
        }
        tc_sleep_ms(200);
    }
    return 0;
}

static int alive(pid_t pid)
{
    return kill(pid, 0) == 0 || errno != ESRCH;
}

/* --- tests --------------------------------------------------------------- */

Test(walkthrough,
     kill_restart_catch_up_ctrl_c,
     .fini = teardown,
     .timeout = 120)
{
    tc_setup(&c, 3, NULL);
    char log1[400], log2[400], out[8192];
    snprintf(log1, sizeof(log1), "%s/run.log", c.dir);
    snprintf(log2, sizeof(log2), "%s/node2.log", c.dir);
    scripts[0] = start_script(log1, NULL);
    pid_t node[3];
    for (int i = 0; i < 3; i++) {
        node[i] = wait_node_pid(log1, i + 1, 20000);
        cr_assert_gt(node[i], 0, "run-cluster.sh printed no pid of node %d",
                     i + 1);
    }
    const char *cli = tc_bin("idalloc");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster %s --timeout 20000 pool create users "
                        "--kind bounded --size 100",
                        cli, c.addrs),
                 0, "pool create: %s", out);

    /* kill -9 node 2: reported with how to bring it back; others serve. */
    cr_assert_eq(kill(node[1], SIGKILL), 0);
    cr_assert(wait_text(log1, "node 2 (pid", 20000),
              "the death of node 2 was not reported");
    cr_assert(wait_text(log1, "--node 2", 5000),
              "no restart command was printed");
    cr_assert(alive(scripts[0]), "run-cluster.sh stopped with one node dead");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "%s --cluster %s --timeout 20000 alloc users --tag "
                        "alice",
                        cli, c.addrs),
                 0, "alloc with node 2 dead: %s", out);
    cr_assert_str_eq(out, "0\n");

    /* Restart it the documented way; status shows it caught up. */
    scripts[1] = start_script(log2, "2");
    pid_t again = wait_node_pid(log2, 2, 20000);
    cr_assert_gt(again, 0, "run-cluster.sh --node 2 printed no pid");
    cr_assert(wait_caught_up(3, 30000, out, sizeof(out)),
              "node 2 did not catch up; last status:\n%s", out);

    /* Ctrl-C: every node stops, the scripts exit 0. */
    for (int i = 0; i < 2; i++) {
        int st = 0;
        cr_assert_eq(kill(scripts[i], SIGINT), 0);
        cr_assert_eq(waitpid(scripts[i], &st, 0), scripts[i]);
        scripts[i] = 0;
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "run-cluster.sh #%d: status %d", i + 1, st);
    }
    pid_t all[] = {node[0], node[2], again};
    for (int i = 0; i < 3; i++) {
        cr_assert(!alive(all[i]), "node pid %d still running after Ctrl-C",
                  (int)all[i]);
    }
}
