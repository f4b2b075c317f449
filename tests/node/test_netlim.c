/* The client port's bookkeeping (src/node/netlim.h) on a virtual clock:
 * admission with the status reserve and eviction, idle and frame timeouts,
 * the summary line, the descriptor clamp. */
#include <criterion/criterion.h>
#include <string.h>

#include "src/node/netlim.h"

static struct ida_netlim l;
static struct ida_netlim_entry e[16];

static void setup(void)
{
    struct ida_netlim_config c = {
        .client_max = 3,
        .reserve_max = 1,
        .peer_max = 2,
        .idle_timeout_ms = 10000,
        .frame_timeout_ms = 500,
        .peer_frame_timeout_ms = 2000,
        .evict_idle_ms = 1000,
        .summary_ms = 1000,
    };
    ida_netlim_init(&l, &c, 0);
    memset(e, 0, sizeof(e));
}

/* Admit e[i] as a client at @now; its class or -1. */
static int admit(int i, uint64_t now, struct ida_netlim_entry **victim)
{
    int cls = ida_netlim_admit(&l, IDA_NETLIM_CLIENT, now, victim);
    if (cls >= 0) {
        ida_netlim_add(&l, &e[i], (enum ida_netlim_class)cls, now);
    }
    return cls;
}

Test(netlim, slots_then_reserve_then_eviction_then_refusal, .init = setup)
{
    struct ida_netlim_entry *v;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(admit(i, 0, &v), IDA_NETLIM_CLIENT);
        cr_assert_null(v);
    }
    /* All three active within the last second: the fourth gets the
     * status-only reserve, the fifth is refused. */
    cr_assert_eq(admit(3, 500, &v), IDA_NETLIM_RESERVE);
    cr_assert_null(v);
    cr_assert_eq(admit(4, 600, &v), -1);
    cr_assert_null(v);
    cr_assert_eq(l.closed[IDA_NETLIM_REFUSED], 1);
    /* At 1200 the least recently active client, e[0], has a request
     * awaiting its reply, so it is not evicted; the reserve's e[3] has been
     * idle only 700 ms: refused again. */
    e[0].pending = 1;
    ida_netlim_touch(&l, &e[1], 900);
    cr_assert_eq(admit(5, 1200, &v), -1);
    /* Once e[0] is answered it is the least recently active and idle for
     * 1.3 s: it makes room. */
    e[0].pending = 0;
    cr_assert_eq(admit(5, 1300, &v), IDA_NETLIM_CLIENT);
    cr_assert_eq(v, &e[0]);
    cr_assert_not(e[0].linked);
    cr_assert_eq(l.closed[IDA_NETLIM_EVICTED], 1);
    cr_assert_eq(l.lru[IDA_NETLIM_CLIENT].count, 3);
}

Test(netlim, peers_evict_only_idle_peers, .init = setup)
{
    struct ida_netlim_entry *v;
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(ida_netlim_admit(&l, IDA_NETLIM_PEER, 0, &v),
                     IDA_NETLIM_PEER);
        ida_netlim_add(&l, &e[i], IDA_NETLIM_PEER, 0);
    }
    cr_assert_eq(ida_netlim_admit(&l, IDA_NETLIM_PEER, 500, &v), -1);
    /* e[0] carries heartbeats; e[1] stays silent and is evicted. */
    ida_netlim_input(&l, &e[0], 0, 1, 1400);
    cr_assert_eq(ida_netlim_admit(&l, IDA_NETLIM_PEER, 1500, &v),
                 IDA_NETLIM_PEER);
    cr_assert_eq(v, &e[1]);
}

Test(netlim, frame_and_idle_timeouts, .init = setup)
{
    struct ida_netlim_entry *v;
    enum ida_netlim_reason why;
    admit(0, 0, &v);
    admit(1, 0, &v);
    ida_netlim_add(&l, &e[2], IDA_NETLIM_PEER, 0);
    /* e[0] sends a header and nothing more at 100; e[2] (a peer) too. */
    ida_netlim_input(&l, &e[0], 1, 0, 100);
    ida_netlim_input(&l, &e[2], 1, 0, 100);
    cr_assert_null(ida_netlim_expired(&l, 599, &why));
    cr_assert_eq(ida_netlim_expired(&l, 600, &why), &e[0]);
    cr_assert_eq(why, IDA_NETLIM_FRAME_TIMEOUT);
    cr_assert_null(ida_netlim_expired(&l, 600, &why));
    /* A connection that keeps completing frames restarts its clock with
     * each new partial one. */
    ida_netlim_input(&l, &e[1], 1, 0, 1000);
    ida_netlim_input(&l, &e[1], 1, 1, 1400);
    cr_assert_null(ida_netlim_expired(&l, 1899, &why));
    /* e[1] finishes its frame: no frame clock; idle from 1800. */
    ida_netlim_input(&l, &e[1], 0, 1, 1800);
    cr_assert_null(ida_netlim_expired(&l, 2099, &why));
    /* The peer's frame timeout is its own (2 s). */
    cr_assert_eq(ida_netlim_expired(&l, 2100, &why), &e[2]);
    cr_assert_eq(why, IDA_NETLIM_FRAME_TIMEOUT);
    cr_assert_null(ida_netlim_expired(&l, 11799, &why));
    cr_assert_eq(ida_netlim_expired(&l, 11800, &why), &e[1]);
    cr_assert_eq(why, IDA_NETLIM_IDLE);
    cr_assert_eq(l.lru[IDA_NETLIM_CLIENT].count, 0);
    cr_assert_eq(l.partial[IDA_NETLIM_CLIENT].count, 0);
    /* Removing what is already unlinked is a no-op. */
    ida_netlim_remove(&l, &e[1]);
}

Test(netlim, one_summary_line_per_second, .init = setup)
{
    char line[256];
    cr_assert_not(ida_netlim_summary(&l, 5000, line, sizeof(line)),
                  "nothing closed: no line");
    for (int i = 0; i < 1000; i++) {
        ida_netlim_count(&l, IDA_NETLIM_FRAME_TIMEOUT);
    }
    ida_netlim_count(&l, IDA_NETLIM_IDLE);
    cr_assert(ida_netlim_summary(&l, 5000, line, sizeof(line)));
    cr_assert_str_eq(line,
                     "closed 1001 connection(s) in the last 5.0 s: 1 idle "
                     "timeout, 1000 frame timeout");
    ida_netlim_count(&l, IDA_NETLIM_QUEUE);
    cr_assert_not(ida_netlim_summary(&l, 5999, line, sizeof(line)),
                  "at most one line per summary_ms");
    cr_assert(ida_netlim_summary(&l, 6000, line, sizeof(line)));
    cr_assert(strstr(line, "1 output queue cap") != NULL, "%s", line);
    cr_assert_eq(l.closed_total[IDA_NETLIM_FRAME_TIMEOUT], 1000);
}

Test(netlim, descriptors_clamp_the_client_slots)
{
    uint64_t c = 4096, r = 16;
    cr_assert_eq(ida_netlim_clamp(20000, 100, &c, &r), 0);
    cr_assert_eq(c, 4096);
    cr_assert_eq(r, 16);
    cr_assert_eq(ida_netlim_clamp(1024, 100, &c, &r), 1);
    cr_assert_eq(r, 16);
    cr_assert_eq(c, 1024 - 100 - 16);
    c = 4096, r = 16;
    cr_assert_eq(ida_netlim_clamp(110, 100, &c, &r), 1);
    cr_assert_eq(r, 5);
    cr_assert_eq(c, 5);
    c = 4096, r = 16;
    cr_assert_eq(ida_netlim_clamp(50, 100, &c, &r), 1);
    cr_assert_eq(r, 0);
    cr_assert_eq(c, 1, "at least one client connection");
}
