/* Linking against the client library exactly as README.md ("The client
 * library") says: statically, and shared with LD_LIBRARY_PATH or an rpath.
 * Only protobuf-c and pthreads are needed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idalloc.h"
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
