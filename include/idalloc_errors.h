/* idalloc error codes: the one error type of the project.
 *
 * Every layer (raft/, fsm/, storage/, src/) and the installed client library
 * return these codes. The numeric values travel on the wire (the `error`
 * field of ClientResponse) and are therefore stable: never renumber a code,
 * only append new ones.
 *
 * Each code belongs to one class, which decides what a caller (and the CLI's
 * exit code) does with it:
 *   DEFINITE - the cluster said a definite "no"; nothing changed (exit 1).
 *   USAGE    - the request itself was bad; nothing changed (exit 2).
 *   UNKNOWN  - the outcome is unknown; retrying with the same
 *              (client_id, request_seq) is safe (exit 3).
 *   INTERNAL - a local failure (I/O, memory, corrupt data) (exit 3 for the
 *              CLI: the cluster's state was not learned).
 *
 * Server-only codes: IDA_ECORRUPT, IDA_EFOREIGN, IDA_EVERSION (as a storage
 * result), IDA_ENOSPC, IDA_ELOSTSTATE and IDA_EEXIST are returned by the
 * node's storage and never by a libidalloc call; they share the enum so
 * that one table names every code. IDA_EEXPIRED is a server answer that the
 * library turns into IDA_ESESSION (outcome unknown) for a call it had sent
 * before, and into a fresh session and a retry for one it had not.
 */
#ifndef IDALLOC_ERRORS_H
#define IDALLOC_ERRORS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, class, message) */
#define IDA_ERRORS(X)                                                     \
    X(IDA_EINVAL, 1, USAGE, "invalid argument")                           \
    X(IDA_ENOMEM, 2, INTERNAL, "out of memory")                           \
    X(IDA_ENOTLEADER, 3, UNKNOWN, "this node is not the leader")          \
    X(IDA_EEXHAUSTED, 4, DEFINITE, "pool is exhausted")                   \
    X(IDA_ENOPOOL, 5, DEFINITE, "no such pool")                           \
    X(IDA_EPOOLEXISTS, 6, DEFINITE,                                       \
      "a pool with this name already exists with other parameters")       \
    X(IDA_EKIND, 7, DEFINITE, "operation does not fit the pool's kind")   \
    X(IDA_ENOTFOUND, 8, DEFINITE, "not found")                            \
    X(IDA_ETAGMISMATCH, 9, DEFINITE, "id is held by another tag")         \
    X(IDA_ETOOBIG, 10, USAGE, "message or value too large")               \
    X(IDA_EPROTO, 11, USAGE, "malformed message")                         \
    X(IDA_EIO, 12, INTERNAL, "I/O error")                                 \
    X(IDA_ECORRUPT, 13, INTERNAL, "corrupt data")                         \
    X(IDA_EFOREIGN, 14, INTERNAL,                                         \
      "data directory belongs to another cluster or node")                \
    X(IDA_EVERSION, 15, INTERNAL, "unsupported format version")           \
    X(IDA_ECONFIG, 16, USAGE, "bad configuration")                        \
    X(IDA_ETIMEDOUT, 17, UNKNOWN, "timed out, outcome unknown")           \
    X(IDA_EUNAVAIL, 18, UNKNOWN, "no leader reachable, nothing was done") \
    X(IDA_ELEADERLOST, 19, UNKNOWN,                                       \
      "leadership lost before the request committed, outcome unknown")    \
    X(IDA_EBUSY, 20, UNKNOWN, "node overloaded, try again")               \
    X(IDA_ESESSION, 21, UNKNOWN,                                          \
      "the answer to this request is no longer kept, outcome unknown")    \
    X(IDA_ESTOPPED, 22, UNKNOWN, "node is stopping or cannot persist")    \
    X(IDA_ENOSPC, 23, INTERNAL, "no space left for data")                 \
    X(IDA_ECLOSED, 24, UNKNOWN, "connection closed, outcome unknown")     \
    X(IDA_EEXIST, 25, DEFINITE, "already exists")                         \
    X(IDA_EINTERNAL, 26, INTERNAL, "internal error")                      \
    X(IDA_ELOSTSTATE, 27, INTERNAL, "data directory lost its state")      \
    X(IDA_EREFUSED, 28, DEFINITE, "membership change refused")            \
    X(IDA_EEXPIRED, 29, DEFINITE,                                         \
      "client session unknown or expired, the request was not executed")  \
    X(IDA_EREUSED, 30, DEFINITE,                                          \
      "request id reused for another operation, nothing was done")        \
    X(IDA_ELIMIT, 31, DEFINITE,                                           \
      "a per-client or cluster limit was reached, nothing was done")

enum ida_err {
    IDA_OK = 0,
#define IDA__ERR_ENUM(name, value, cls, text) name = value,
    IDA_ERRORS(IDA__ERR_ENUM)
#undef IDA__ERR_ENUM
};

enum ida_err_class {
    IDA_ERR_CLASS_OK = 0,
    IDA_ERR_CLASS_DEFINITE,
    IDA_ERR_CLASS_USAGE,
    IDA_ERR_CLASS_UNKNOWN,
    IDA_ERR_CLASS_INTERNAL,
};

/* A static, human-readable message for @code; never NULL. Unknown codes get
 * "unknown error". */
const char *idalloc_strerror(int code);

/* The symbolic name of @code ("IDA_EINVAL"); "IDA_E?" for unknown codes. */
const char *idalloc_errname(int code);

/* The class of @code (see the top of this file). Unknown nonzero codes are
 * IDA_ERR_CLASS_INTERNAL. */
enum ida_err_class idalloc_errclass(int code);

/* The CLI exit code for @code: 0 OK, 1 definite, 2 usage, 3 unknown and
 * internal. */
int idalloc_exit_code(int code);

#ifdef __cplusplus
}
#endif

#endif /* IDALLOC_ERRORS_H */
