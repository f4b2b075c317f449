/* A scripted idalloc server for the client library's tests: real sockets on
 * 127.0.0.1 (port chosen by the kernel), real framing and protobuf, with a
 * behaviour chosen per test (answer, redirect, stay silent, send garbage).
 * Session registrations are answered "created" in every mode (the mode
 * applies to the other requests) and counted apart.
 * It stands in for the node daemon only to provoke the failure cases the
 * client must survive; end-to-end tests run against the real idallocd. */
#ifndef IDA_TEST_FAKESERVER_H
#define IDA_TEST_FAKESERVER_H

#include <pthread.h>
#include <stdint.h>

enum fake_mode {
    FAKE_ANSWER,     /* answer every request */
    FAKE_NOT_LEADER, /* IDA_ENOTLEADER with hint_addr as the leader */
    FAKE_SILENT,     /* read requests, never answer */
    FAKE_GARBAGE,    /* answer with bytes that are not a frame */
    FAKE_ERROR,      /* answer with error `error` */
    FAKE_ACT_SILENT, /* act (with `keep` on: the answer is kept), never
                      * answer: a leader that committed, then went quiet */
    FAKE_LATE,       /* answer every request, late_ms after it came */
};

#define FAKE_SEEN_MAX  8192
#define FAKE_CONNS_MAX 64
#define FAKE_KEPT_MAX  8192

/* With `keep` on, the fake acts once per request id, as the cluster's
 * session table does: the first answer to (client_id, request_seq) is kept
 * and a repeat gets it back; fresh allocs get ids 5000, 5001, ... in the
 * order they act (not derived from the request), so a test sees whether a
 * repeat carried the first request id. */
struct fake_kept
{
    uint8_t client[16];
    uint64_t seq;
    uint64_t value; /* alloc: the id; reserve: the first id */
};

struct fake_server
{
    int listen_fd;
    char addr[64]; /* "127.0.0.1:PORT" */
    enum fake_mode mode;
    char hint_addr[64];
    uint32_t error;
    pthread_t acceptor;
    pthread_mutex_t mu;
    uint64_t seen_seq[FAKE_SEEN_MAX]; /* request_seq of each request */
    uint8_t seen_client[FAKE_SEEN_MAX][16];
    uint64_t seen_ack[FAKE_SEEN_MAX]; /* ack_below of each request */
    int nseen;
    int registers;          /* RegisterClient requests answered */
    uint8_t registered[16]; /* client_id of the last one */
    int expire_next;        /* answer this many requests IDA_EEXPIRED first */
    int violations;         /* malformed requests, too many connections */
    uint64_t next_block;    /* reserve: next first id */
    int keep;               /* act once per request id (struct fake_kept) */
    struct fake_kept kept[FAKE_KEPT_MAX];
    int nkept;
    uint64_t next_alloc; /* with keep: the next fresh alloc id - 5000 */
    unsigned late_ms;    /* FAKE_LATE's delay */
    int conns[FAKE_CONNS_MAX];
    pthread_t readers[FAKE_CONNS_MAX];
    int nconns;
};

void fake_start(struct fake_server *s, enum fake_mode mode);
void fake_stop(struct fake_server *s);
int fake_seen(struct fake_server *s); /* requests received so far */
/* The request_seq of the @i'th request received (i < fake_seen()). */
uint64_t fake_seen_seq(struct fake_server *s, int i);
void fake_set_mode(struct fake_server *s, enum fake_mode m);
/* With keep: the answer kept for (@client, @seq), or UINT64_MAX. */
uint64_t fake_kept_value(struct fake_server *s,
                         const uint8_t *client,
                         uint64_t seq);

/* The fixture of the client tests (test_client.c, test_async.c): up to
 * three fake servers and one client object of them. */
extern struct fake_server fx_srv[3];
extern int fx_nsrv;
extern struct idalloc_client *fx_cli;
/* Start servers 0..@n-1 in modes @m0, @m1, @m2. */
void fx_start(int n, enum fake_mode m0, enum fake_mode m1, enum fake_mode m2);
/* A client object of @addrs with these timeouts (fails the test if not). */
struct idalloc_client *fx_new_client(const char *addrs,
                                     unsigned attempt_ms,
                                     unsigned call_ms);
/* fx_cli: a client object of every started server. */
void fx_connect(unsigned attempt_ms, unsigned call_ms);
/* Free fx_cli, stop the servers, fail if one saw a bad request. */
void fx_teardown(void);
uint64_t fx_now_ms(void);

#endif
