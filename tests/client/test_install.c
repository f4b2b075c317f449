/* `make install` into a temporary DESTDIR, as a package build does: every
 * file lands where README says, the shared library has its SONAME and
 * exports only the idalloc_* API, a program compiles and links with
 * `pkg-config --cflags --libs idalloc` alone and runs against the installed
 * library; `make uninstall` removes every file again. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idalloc.h"
#include "tests/lib/harness.h"

static char dir[64];
static char out[65536];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/ida-install-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)system(cmd);
}

Test(install,
     destdir_pkg_config_link_and_uninstall,
     .init = setup,
     .fini = teardown,
     .timeout = 300)
{
    const char *build = getenv("IDA_BUILD");
    if (build != NULL && strcmp(build, "build") != 0) {
        teardown(); /* a skipped test does not reach .fini */
        cr_skip_test("%s: installs the default build only", build);
    }
    int rv = tc_run(out, sizeof(out),
                    "make --no-print-directory -s install DESTDIR=%s/root "
                    "PREFIX=/usr 2>&1",
                    dir);
    cr_assert_eq(rv, 0, "make install: %s", out);

    static const char *const files[] = {
        "usr/bin/idallocd",
        "usr/bin/idalloc",
        "usr/lib/libidalloc.a",
        "usr/lib/libidalloc.so." IDALLOC_VERSION,
        "usr/lib/libidalloc.so.1",
        "usr/lib/libidalloc.so",
        "usr/include/idalloc.h",
        "usr/include/idalloc_errors.h",
        "usr/include/idalloc_version.h",
        "usr/lib/pkgconfig/idalloc.pc",
        "usr/share/man/man1/idalloc.1.gz",
        "usr/share/man/man3/libidalloc.3.gz",
        "usr/share/man/man5/idalloc.conf.5.gz",
        "usr/share/man/man8/idallocd.8.gz",
        "usr/lib/systemd/system/idallocd@.service",
        "usr/share/doc/idalloc/examples/cluster.conf",
    };
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        cr_assert_eq(
            tc_run(out, sizeof(out), "test -e %s/root/%s", dir, files[i]), 0,
            "%s not installed", files[i]);
    }
    /* The SONAME, and the links pointing down to the real file. */
    cr_assert_eq(tc_run(out, sizeof(out),
                        "readelf -d %s/root/usr/lib/libidalloc.so | grep "
                        "SONAME",
                        dir),
                 0);
    cr_assert_not_null(strstr(out, "[libidalloc.so.1]"), "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "readlink %s/root/usr/lib/libidalloc.so.1", dir),
                 0);
    cr_assert_str_eq(out, "libidalloc.so." IDALLOC_VERSION "\n");
    /* Only the API is exported: no internal ida_*, no protobuf-c
     * idalloc__*; and no libuv, LMDB or jansson behind it. */
    cr_assert_eq(tc_run(out, sizeof(out),
                        "nm -D --defined-only %s/root/usr/lib/libidalloc.so "
                        "| awk '{print $3}' | grep -v '^idalloc_[a-z]' ; true",
                        dir),
                 0);
    cr_assert_str_eq(out, "", "exported beyond the API: %s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "nm -D --defined-only %s/root/usr/lib/libidalloc.so "
                        "| grep -c ' T idalloc_'",
                        dir),
                 0);
    cr_assert_gt(atoi(out), 20, "%s", out);
    cr_assert_eq(tc_run(out, sizeof(out),
                        "readelf -d %s/root/usr/lib/libidalloc.so | grep "
                        "NEEDED",
                        dir),
                 0);
    cr_assert_null(strstr(out, "libuv"), "%s", out);
    cr_assert_null(strstr(out, "liblmdb"), "%s", out);
    cr_assert_null(strstr(out, "libjansson"), "%s", out);
    /* The unit runs the installed daemon for node %i as its own user. */
    cr_assert_eq(
        tc_run(out, sizeof(out),
               "cat %s/root/usr/lib/systemd/system/idallocd@.service", dir),
        0);
    cr_assert_not_null(strstr(out,
                              "ExecStart=/usr/bin/idallocd --config "
                              "/etc/idalloc/cluster.conf --node %i"));
    cr_assert_not_null(strstr(out, "User=idalloc"));

    /* A client built with pkg-config only, against the installed files. */
    char app[128];
    snprintf(app, sizeof(app), "%s/app.c", dir);
    FILE *f = fopen(app, "w");
    cr_assert_not_null(f);
    fputs(
        "#include <stdio.h>\n#include <idalloc.h>\n"
        "int main(void) {\n"
        "    struct idalloc_options o;\n"
        "    idalloc_options_init(&o);\n"
        "    printf(\"%s %s\\n\", idalloc_version(),\n"
        "           idalloc_errname(IDA_ENOTFOUND));\n"
        "    return 0;\n"
        "}\n",
        f);
    fclose(f);
    rv = tc_run(out, sizeof(out),
                "export PKG_CONFIG_PATH=%s/root/usr/lib/pkgconfig "
                "PKG_CONFIG_SYSROOT_DIR=%s/root && "
                "cc %s $(pkg-config --cflags --libs idalloc) -o %s/app 2>&1 && "
                "LD_LIBRARY_PATH=%s/root/usr/lib %s/app",
                dir, dir, app, dir, dir, dir);
    cr_assert_eq(rv, 0, "%s", out);
    cr_assert_str_eq(out, IDALLOC_VERSION " IDA_ENOTFOUND\n");
    /* Statically too, with --static (Libs.private). */
    rv = tc_run(out, sizeof(out),
                "export PKG_CONFIG_PATH=%s/root/usr/lib/pkgconfig "
                "PKG_CONFIG_SYSROOT_DIR=%s/root && "
                "cc %s $(pkg-config --cflags idalloc) %s/root/usr/lib/"
                "libidalloc.a $(pkg-config --static --libs-only-l idalloc | "
                "sed 's/-lidalloc//') -pthread -o %s/app-static 2>&1 && "
                "%s/app-static",
                dir, dir, app, dir, dir, dir);
    cr_assert_eq(rv, 0, "%s", out);
    cr_assert_str_eq(out, IDALLOC_VERSION " IDA_ENOTFOUND\n");

    rv = tc_run(out, sizeof(out),
                "make --no-print-directory -s uninstall DESTDIR=%s/root "
                "PREFIX=/usr 2>&1 && find %s/root ! -type d",
                dir, dir);
    cr_assert_eq(rv, 0, "make uninstall: %s", out);
    cr_assert_str_eq(out, "", "left behind: %s", out);
}
