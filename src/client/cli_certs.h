/* `idalloc certs`: a development CA and the certificates of a cluster.
 *
 *   idalloc certs create DIR --nodes N [--clients K] [--force]
 *   idalloc certs add DIR (--node I | --client J) [--force]
 *
 * create writes into DIR (made if missing): ca.crt, ca.key (a new CA),
 * nodeI.crt/nodeI.key for I = 1..N and clientJ.crt/clientJ.key for
 * J = 1..K. add signs one more certificate with DIR/ca.key (a node id
 * added to the cluster later). Keys are EC P-256, PEM, mode 0600;
 * certificates PEM, mode 0644, valid for 10 years, SHA-256. Subjects:
 * O=idalloc, CN=idalloc-ca | idalloc-node-I | idalloc-client-J (the
 * identities of src/common/tls.h); node certificates also carry
 * subjectAltName DNS:idalloc-node-I and extendedKeyUsage serverAuth and
 * clientAuth, client certificates clientAuth only.
 *
 * An existing file is never overwritten without --force: the command
 * checks every file it would write first and writes nothing when one
 * exists.
 */
#ifndef IDA_CERTS_H
#define IDA_CERTS_H

#define IDA_CERTS_MAX 1000 /* nodes or clients in one create */

/* Write a new CA, @nodes node and @clients client certificates into @dir.
 * Returns 0, IDA_EINVAL (counts out of range), IDA_EEXIST (a file exists
 * and !@force: @errmsg names it), IDA_EIO (@errmsg names the file) or
 * IDA_ENOMEM. */
int ida_certs_create(const char *dir,
                     unsigned nodes,
                     unsigned clients,
                     int force,
                     char *errmsg);

/* Sign one more certificate, of node @id (@client 0) or client @id, with
 * @dir's CA. Same returns, IDA_ECONFIG when the CA files are unusable. */
int ida_certs_add(const char *dir,
                  int client,
                  unsigned id,
                  int force,
                  char *errmsg);

/* The `certs` command: @argv[0] is "certs". Prints what it wrote, or one
 * line on stderr; returns the exit code (0, 1 refused or failed, 2
 * usage). */
int ida_certs_main(int argc, char **argv);

#endif /* IDA_CERTS_H */
