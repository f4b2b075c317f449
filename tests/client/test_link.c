/* Linking against the client library exactly as README.md ("The client
 * library") says: statically, and shared with LD_LIBRARY_PATH or an rpath.
 * Only protobuf-c and pthreads are needed. And the README's libuv program
 * of asynchronous calls, taken from README.md as it is, built and run
 * against a scripted server. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idalloc.h"
#include "tests/client/fakeserver.h"
#include "tests/lib/harness.h"

/* --- fixture ------------------------------------------------------------- */

static char dir[64];
static char out[4096];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/ida-link-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/app.c", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(
        "#include <stdio.h>\n#include \"idalloc.h\"\n"
        "int main(void) { printf(\"%s\\n\", idalloc_version()); return 0; "
        "}\n",
        f);
    fclose(f);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)system(cmd);
}

/* --- helpers ------------------------------------------------------------- */

/* The library directory of this build ($IDA_BINDIR's sibling lib/). */
static const char *libdir(void)
{
    static char p[512];
    const char *bin = getenv("IDA_BINDIR");
    snprintf(p, sizeof(p), "%s/../lib", bin != NULL ? bin : "bin");
    return p;
}

/* --- tests --------------------------------------------------------------- */

Test(link,
     static_and_shared_as_the_readme_says,
     .init = setup,
     .fini = teardown,
     .timeout = 60)
{
    const char *build = getenv("IDA_BUILD");
    if (build != NULL && strcmp(build, "build") != 0) {
        teardown(); /* a skipped test does not reach .fini */
        cr_skip_test("%s: a sanitizer build's library needs its runtime",
                     build);
    }
    char want[64];
    snprintf(want, sizeof(want), "%s\n", IDALLOC_VERSION);
    cr_assert_eq(
        tc_run(
            out, sizeof(out),
            "cc -Iinclude %s/app.c %s/libidalloc.a -lprotobuf-c -lssl -lcrypto "
            "-pthread -o %s/app-static 2>&1 && %s/app-static",
            dir, libdir(), dir, dir),
        0, "%s", out);
    cr_assert_str_eq(out, want);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "cc -Iinclude %s/app.c -L%s -lidalloc -pthread -o "
                        "%s/app 2>&1 && LD_LIBRARY_PATH=%s %s/app",
                        dir, libdir(), dir, libdir(), dir),
                 0, "%s", out);
    cr_assert_str_eq(out, want);
    cr_assert_neq(tc_run(out, sizeof(out), "%s/app 2>&1", dir), 0,
                  "found without LD_LIBRARY_PATH or rpath?");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "cc -Iinclude %s/app.c -L%s -lidalloc -pthread "
                        "-Wl,-rpath,$(realpath %s) -o %s/app-rpath 2>&1 && "
                        "%s/app-rpath",
                        dir, libdir(), libdir(), dir, dir),
                 0, "%s", out);
    cr_assert_str_eq(out, want);
    cr_assert_eq(tc_run(out, sizeof(out), "ldd %s/libidalloc.so", libdir()), 0);
    cr_assert_null(strstr(out, "libuv"), "%s", out);
}

Test(link,
     the_readme_libuv_example_of_asynchronous_calls,
     .init = setup,
     .fini = teardown,
     .timeout = 60)
{
    const char *build = getenv("IDA_BUILD");
    if (build != NULL && strcmp(build, "build") != 0) {
        teardown(); /* a skipped test does not reach .fini */
        cr_skip_test("%s: a sanitizer build's library needs its runtime",
                     build);
    }
    /* The ```c block after the README's marker, as it is. */
    cr_assert_eq(tc_run(out, sizeof(out),
                        "awk '/<!-- example: async-libuv/ {m = 1; next} "
                        "m && /^```c/ {c = 1; next} c && /^```/ {exit} c' "
                        "README.md > %s/app_uv.c && wc -l < %s/app_uv.c",
                        dir, dir),
                 0, "%s", out);
    cr_assert_gt(atoi(out), 40, "the example was not found in README.md");
    cr_assert_eq(tc_run(out, sizeof(out),
                        "cc -Iinclude -Wall -Werror %s/app_uv.c -L%s -lidalloc "
                        "-luv -pthread -o %s/app_uv 2>&1",
                        dir, libdir(), dir),
                 0, "%s", out);
    static struct fake_server srv;
    fake_start(&srv, FAKE_ANSWER);
    static char big[16384];
    int rv = tc_run(big, sizeof(big), "LD_LIBRARY_PATH=%s %s/app_uv %s 2>&1",
                    libdir(), dir, srv.addr);
    int seen = fake_seen(&srv);
    fake_stop(&srv);
    cr_assert_eq(rv, 0, "%s", big);
    int lines = 0;
    for (const char *p = big; (p = strstr(p, "user-")) != NULL; p++) {
        lines++;
    }
    cr_assert_eq(lines, 100, "%s", big);
    cr_assert_eq(seen, 100);
    cr_assert_eq(srv.violations, 0);
}
