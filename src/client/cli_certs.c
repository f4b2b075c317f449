#include "src/client/cli_certs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "idalloc_errors.h"
#include "src/common/config.h"

#define CERT_DAYS 3650

static int fail(char *errmsg, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *errmsg, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, IDA_ERRMSG_MAX, fmt, ap);
    va_end(ap);
    ERR_clear_error();
    return code;
}

static int add_ext(X509 *x, X509 *issuer, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer, x, NULL, NULL, 0);
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (e == NULL) {
        return -1;
    }
    int ok = X509_add_ext(x, e, -1);
    X509_EXTENSION_free(e);
    return ok == 1 ? 0 : -1;
}

/* A certificate for @key named @cn, signed by @ca_key (@ca NULL: self
 * signed, a CA). @what: 0 CA, 1 node, 2 client. */
static X509 *make_cert(EVP_PKEY *key,
                       const char *cn,
                       int what,
                       X509 *ca,
                       EVP_PKEY *ca_key)
{
    X509 *x = X509_new();
    BIGNUM *bn = BN_new();
    int ok = x != NULL && bn != NULL && X509_set_version(x, 2) == 1 &&
             BN_rand(bn, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
             BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) != NULL &&
             X509_gmtime_adj(X509_getm_notBefore(x), -3600) != NULL &&
             X509_gmtime_adj(X509_getm_notAfter(x),
                             (long)CERT_DAYS * 24 * 3600) != NULL &&
             X509_set_pubkey(x, key) == 1;
    X509_NAME *nm = ok ? X509_get_subject_name(x) : NULL;
    ok = ok &&
         X509_NAME_add_entry_by_txt(nm, "O", MBSTRING_ASC,
                                    (const unsigned char *)"idalloc", -1, -1,
                                    0) == 1 &&
         X509_NAME_add_entry_by_txt(nm, "CN", MBSTRING_ASC,
                                    (const unsigned char *)cn, -1, -1, 0) == 1;
    X509 *issuer = ca != NULL ? ca : x;
    ok = ok && X509_set_issuer_name(x, X509_get_subject_name(issuer)) == 1 &&
         add_ext(x, issuer, NID_subject_key_identifier, "hash") == 0;
    if (ok && what == 0) {
        ok = add_ext(x, issuer, NID_basic_constraints, "critical,CA:TRUE") ==
                 0 &&
             add_ext(x, issuer, NID_key_usage,
                     "critical,keyCertSign,cRLSign") == 0;
    } else if (ok) {
        char san[80];
        snprintf(san, sizeof(san), "DNS:%s", cn);
        ok = add_ext(x, issuer, NID_basic_constraints, "critical,CA:FALSE") ==
                 0 &&
             add_ext(x, issuer, NID_key_usage, "critical,digitalSignature") ==
                 0 &&
             add_ext(x, issuer, NID_ext_key_usage,
                     what == 1 ? "serverAuth,clientAuth" : "clientAuth") == 0 &&
             add_ext(x, issuer, NID_authority_key_identifier, "keyid") == 0 &&
             add_ext(x, issuer, NID_subject_alt_name, san) == 0;
    }
    ok = ok && X509_sign(x, ca_key != NULL ? ca_key : key, EVP_sha256()) > 0;
    BN_free(bn);
    if (!ok) {
        X509_free(x);
        return NULL;
    }
    return x;
}

/* Open @path for writing with @mode (exactly: an old file's mode is
 * replaced). */
static FILE *open_out(const char *path, mode_t mode, char *errmsg)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0 || fchmod(fd, mode) != 0) {
        fail(errmsg, IDA_EIO, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return NULL;
    }
    FILE *f = fdopen(fd, "w");
    if (f == NULL) {
        close(fd);
        fail(errmsg, IDA_EIO, "cannot write %s: %s", path, strerror(errno));
    }
    return f;
}

static int write_pair(const char *dir,
                      const char *base,
                      X509 *x,
                      EVP_PKEY *key,
                      char *errmsg)
{
    char path[IDA_PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s.key", dir, base);
    FILE *f = open_out(path, 0600, errmsg);
    if (f == NULL) {
        return IDA_EIO;
    }
    int ok = PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) == 1;
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        return fail(errmsg, IDA_EIO, "cannot write %s", path);
    }
    snprintf(path, sizeof(path), "%s/%s.crt", dir, base);
    f = open_out(path, 0644, errmsg);
    if (f == NULL) {
        return IDA_EIO;
    }
    ok = PEM_write_X509(f, x) == 1;
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        return fail(errmsg, IDA_EIO, "cannot write %s", path);
    }
    return 0;
}

/* Make and write @base.{crt,key}, signed by @ca/@ca_key (NULL: the CA). */
static int issue(const char *dir,
                 const char *base,
                 const char *cn,
                 int what,
                 X509 *ca,
                 EVP_PKEY *ca_key,
                 X509 **cert_out,
                 EVP_PKEY **key_out,
                 char *errmsg)
{
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = key != NULL ? make_cert(key, cn, what, ca, ca_key) : NULL;
    if (x == NULL) {
        EVP_PKEY_free(key);
        return fail(errmsg, IDA_ENOMEM, "cannot make the certificate of %s",
                    cn);
    }
    int rv = write_pair(dir, base, x, key, errmsg);
    if (rv == 0 && cert_out != NULL) {
        *cert_out = x;
        *key_out = key;
        return 0;
    }
    X509_free(x);
    EVP_PKEY_free(key);
    return rv;
}

/* Refuse to overwrite: @names (base names) must not exist in @dir. */
static int check_free(const char *dir,
                      const char *const *names,
                      size_t n,
                      int force,
                      char *errmsg)
{
    if (force) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            char path[IDA_PATH_MAX + 64];
            snprintf(path, sizeof(path), "%s/%s.%s", dir, names[i],
                     k == 0 ? "crt" : "key");
            if (access(path, F_OK) == 0) {
                return fail(errmsg, IDA_EEXIST,
                            "%s exists: refusing to overwrite it (--force "
                            "replaces the files)",
                            path);
            }
        }
    }
    return 0;
}

static int make_dir(const char *dir, char *errmsg)
{
    if (strlen(dir) >= IDA_PATH_MAX) {
        return fail(errmsg, IDA_EINVAL, "directory name too long");
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        return fail(errmsg, IDA_EIO, "cannot create %s: %s", dir,
                    strerror(errno));
    }
    return 0;
}

static void name_of(char *buf, size_t cap, int client, unsigned id, int cn)
{
    /* Files node3.crt; CN idalloc-node-3, the form src/common/tls.h
     * parses. */
    snprintf(buf, cap, cn ? "idalloc-%s-%u" : "%s%u",
             client ? "client" : "node", id);
}

int ida_certs_create(const char *dir,
                     unsigned nodes,
                     unsigned clients,
                     int force,
                     char *errmsg)
{
    if (nodes < 1 || nodes > IDA_CERTS_MAX || clients > IDA_CERTS_MAX) {
        return fail(errmsg, IDA_EINVAL,
                    "--nodes must be 1 to %d and --clients 0 to %d",
                    IDA_CERTS_MAX, IDA_CERTS_MAX);
    }
    int rv = make_dir(dir, errmsg);
    if (rv != 0) {
        return rv;
    }
    size_t total = 1 + nodes + clients;
    char(*names)[32] = calloc(total, sizeof(*names));
    const char **ptrs = calloc(total, sizeof(*ptrs));
    if (names == NULL || ptrs == NULL) {
        free(names);
        free(ptrs);
        return IDA_ENOMEM;
    }
    snprintf(names[0], sizeof(names[0]), "ca");
    for (size_t i = 1; i < total; i++) {
        int client = i > nodes;
        name_of(names[i], sizeof(names[i]), client,
                (unsigned)(client ? i - nodes : i), 0);
    }
    for (size_t i = 0; i < total; i++) {
        ptrs[i] = names[i];
    }
    rv = check_free(dir, ptrs, total, force, errmsg);
    X509 *ca = NULL;
    EVP_PKEY *ca_key = NULL;
    if (rv == 0) {
        rv =
            issue(dir, "ca", "idalloc-ca", 0, NULL, NULL, &ca, &ca_key, errmsg);
    }
    for (size_t i = 1; rv == 0 && i < total; i++) {
        int client = i > nodes;
        char cn[40];
        name_of(cn, sizeof(cn), client, (unsigned)(client ? i - nodes : i), 1);
        rv = issue(dir, names[i], cn, client ? 2 : 1, ca, ca_key, NULL, NULL,
                   errmsg);
    }
    X509_free(ca);
    EVP_PKEY_free(ca_key);
    free(names);
    free(ptrs);
    return rv;
}

int ida_certs_add(const char *dir,
                  int client,
                  unsigned id,
                  int force,
                  char *errmsg)
{
    if (id < 1 || id > 65535) {
        return fail(errmsg, IDA_EINVAL, "the id must be 1 to 65535");
    }
    char base[32], cn[40], path[IDA_PATH_MAX + 64];
    name_of(base, sizeof(base), client, id, 0);
    name_of(cn, sizeof(cn), client, id, 1);
    const char *names[] = {base};
    int rv = check_free(dir, names, 1, force, errmsg);
    if (rv != 0) {
        return rv;
    }
    snprintf(path, sizeof(path), "%s/ca.crt", dir);
    FILE *f = fopen(path, "r");
    X509 *ca = f != NULL ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f != NULL) {
        fclose(f);
    }
    if (ca == NULL) {
        return fail(errmsg, IDA_ECONFIG, "cannot read the CA certificate %s",
                    path);
    }
    snprintf(path, sizeof(path), "%s/ca.key", dir);
    f = fopen(path, "r");
    EVP_PKEY *ca_key =
        f != NULL ? PEM_read_PrivateKey(f, NULL, NULL, NULL) : NULL;
    if (f != NULL) {
        fclose(f);
    }
    if (ca_key == NULL || X509_check_private_key(ca, ca_key) != 1) {
        X509_free(ca);
        EVP_PKEY_free(ca_key);
        return fail(errmsg, IDA_ECONFIG,
                    "cannot use the CA key %s (missing, unreadable or not the "
                    "key of ca.crt)",
                    path);
    }
    rv = issue(dir, base, cn, client ? 2 : 1, ca, ca_key, NULL, NULL, errmsg);
    X509_free(ca);
    EVP_PKEY_free(ca_key);
    return rv;
}

/* --- the command ---------------------------------------------------------- */

static const char certs_usage[] =
    "usage: idalloc certs create DIR --nodes N [--clients K] [--force]\n"
    "       idalloc certs add DIR (--node I | --client J) [--force]\n"
    "create: a new development CA and certificates in DIR (made if "
    "missing):\n"
    "  ca.crt ca.key, nodeI.crt nodeI.key (I = 1..N), clientJ.crt "
    "clientJ.key\n"
    "  (J = 1..K). EC P-256 keys (mode 0600), certificates valid 10 years,\n"
    "  CN=idalloc-node-I / idalloc-client-J (README, \"TLS\").\n"
    "add: one more node or client certificate signed by DIR/ca.key (a node\n"
    "  id added to the cluster later).\n"
    "Existing files are never overwritten unless --force is given.\n";

static int parse_count(const char *opt, const char *v, unsigned *out)
{
    char *end;
    errno = 0;
    unsigned long x = v != NULL ? strtoul(v, &end, 10) : 0;
    if (v == NULL || v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 ||
        x > 65535) {
        fprintf(stderr,
                "idalloc: certs: bad %s \"%s\" (see idalloc certs "
                "--help)\n",
                opt, v != NULL ? v : "");
        return -1;
    }
    *out = (unsigned)x;
    return 0;
}

int ida_certs_main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(certs_usage, stdout);
            return 0;
        }
    }
    if (argc < 3 ||
        (strcmp(argv[1], "create") != 0 && strcmp(argv[1], "add") != 0)) {
        fprintf(stderr,
                "idalloc: certs: expected `certs create DIR ...` or "
                "`certs add DIR ...` (see idalloc certs --help)\n");
        return 2;
    }
    int create = strcmp(argv[1], "create") == 0;
    const char *dir = argv[2];
    unsigned nodes = 0, clients = 0, node = 0, client = 0;
    int force = 0, have_nodes = 0, have_node = 0, have_client = 0;
    for (int i = 3; i < argc; i++) {
        /* A value follows its option, or an `=` (--nodes=3), as in the
         * other commands. */
        char name[16];
        const char *s = argv[i];
        const char *eq = strncmp(s, "--", 2) == 0 ? strchr(s, '=') : NULL;
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (eq != NULL && (size_t)(eq - s) < sizeof(name)) {
            memcpy(name, s, (size_t)(eq - s));
            name[eq - s] = '\0';
            s = name;
            v = eq + 1;
        }
        int rv = 0;
        if (strcmp(s, "--force") == 0) {
            if (eq != NULL) {
                fprintf(stderr,
                        "idalloc: certs %s: --force takes no value (see "
                        "idalloc certs --help)\n",
                        argv[1]);
                return 2;
            }
            force = 1;
            continue;
        } else if (create && strcmp(s, "--nodes") == 0) {
            rv = parse_count(s, v, &nodes);
            have_nodes = 1;
        } else if (create && strcmp(s, "--clients") == 0) {
            rv = parse_count(s, v, &clients);
        } else if (!create && strcmp(s, "--node") == 0) {
            rv = parse_count(s, v, &node);
            have_node = 1;
        } else if (!create && strcmp(s, "--client") == 0) {
            rv = parse_count(s, v, &client);
            have_client = 1;
        } else {
            fprintf(stderr,
                    "idalloc: certs %s: unknown option %s (see idalloc certs "
                    "--help)\n",
                    argv[1], s);
            return 2;
        }
        if (rv != 0) {
            return 2;
        }
        if (eq == NULL) {
            i++; /* the value was the next argument */
        }
    }
    char err[IDA_ERRMSG_MAX];
    int rv;
    if (create) {
        if (!have_nodes) {
            fprintf(stderr, "idalloc: certs create: --nodes N is needed\n");
            return 2;
        }
        rv = ida_certs_create(dir, nodes, clients, force, err);
    } else {
        if (have_node == have_client) {
            fprintf(stderr,
                    "idalloc: certs add: give one of --node I and --client "
                    "J\n");
            return 2;
        }
        rv = ida_certs_add(dir, have_client, have_node ? node : client, force,
                           err);
    }
    if (rv != 0) {
        fprintf(stderr, "idalloc: certs %s: %s\n", argv[1],
                rv == IDA_ENOMEM ? idalloc_strerror(rv) : err);
        return rv == IDA_EINVAL ? 2 : 1;
    }
    if (create) {
        printf("wrote %s: ca.crt ca.key, node1%s%.0u.crt/.key, ", dir,
               nodes > 1 ? "..node" : "", nodes > 1 ? nodes : 0);
        if (clients > 0) {
            printf("client1%s%.0u.crt/.key\n", clients > 1 ? "..client" : "",
                   clients > 1 ? clients : 0);
        } else {
            printf("no client certificates\n");
        }
    } else {
        printf("wrote %s/%s%u.crt and .key\n", dir,
               have_client ? "client" : "node", have_node ? node : client);
    }
    return 0;
}
