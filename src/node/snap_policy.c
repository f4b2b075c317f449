#include "src/node/snap_policy.h"

static uint64_t next_rand(struct ida_snap_policy *p)
{
    uint64_t x = p->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p->rng = x;
    return x;
}

static void draw(struct ida_snap_policy *p)
{
    uint64_t extra_max = p->floor_entries / 2;
    uint64_t extra = extra_max > 0 ? next_rand(p) % (extra_max + 1) : 0;
    p->threshold_entries = p->floor_entries + extra;
}

void ida_snap_policy_init(struct ida_snap_policy *p,
                          uint64_t floor_entries,
                          uint64_t seed)
{
    *p = (struct ida_snap_policy){
        .floor_entries = floor_entries > 0 ? floor_entries : 1,
        /* splitmix64 of the seed: never 0 for xorshift */
        .rng = 0,
    };
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    p->rng = z != 0 ? z : 1;
    draw(p);
}

void ida_snap_policy_applied(struct ida_snap_policy *p, size_t len)
{
    p->entries_since++;
    p->bytes_since += len;
}

int ida_snap_policy_due(const struct ida_snap_policy *p)
{
    return p->entries_since >= p->threshold_entries &&
           p->bytes_since >= p->last_bytes / IDA_SNAP_LOG_DIVISOR;
}

void ida_snap_policy_taken(struct ida_snap_policy *p, size_t bytes)
{
    p->entries_since = 0;
    p->bytes_since = 0;
    p->last_bytes = bytes;
    p->waiting = 0;
    draw(p);
}

void ida_snap_policy_encoded(struct ida_snap_policy *p, uint64_t ms)
{
    p->encode_ms = ms > 0 ? ms : 1;
}

uint64_t ida_snap_policy_wait_cap_ms(const struct ida_snap_policy *p)
{
    if (p->encode_ms == 0) {
        return 10000;
    }
    uint64_t cap = p->encode_ms < 20000 ? 3 * p->encode_ms : 60000;
    return cap < 1000 ? 1000 : cap > 60000 ? 60000 : cap;
}

int ida_snap_policy_wait(struct ida_snap_policy *p,
                         int peer_busy,
                         uint64_t now_ms,
                         uint64_t *waited_ms)
{
    *waited_ms = 0;
    if (!p->waiting) {
        p->waiting = 1;
        p->waiting_since_ms = now_ms;
        p->settle_until_ms = 0;
        p->waited_for_peer = 0;
    }
    uint64_t waited =
        now_ms > p->waiting_since_ms ? now_ms - p->waiting_since_ms : 0;
    if (waited < ida_snap_policy_wait_cap_ms(p)) {
        if (peer_busy) {
            p->settle_until_ms = 0; /* another one's turn: wait again */
            p->waited_for_peer = 1;
            return 1;
        }
        if (p->settle_until_ms == 0) {
            /* Others may be due at the same entry, or have waited for
             * the same child: go after a random pause, unless one of them
             * went first. */
            p->settle_until_ms = now_ms + 1 + next_rand(p) % IDA_SNAP_SETTLE_MS;
            return 1;
        }
        if (now_ms < p->settle_until_ms) {
            return 1;
        }
    }
    p->waiting = 0;
    if (p->waited_for_peer) {
        *waited_ms = waited > 0 ? waited : 1;
    }
    return 0;
}

/* The slot of peer @id's report in @s, s->n when none. */
static size_t peer_slot(const struct ida_snap_peers *s, uint32_t id)
{
    size_t i = 0;
    while (i < s->n && s->p[i].id != id) {
        i++;
    }
    return i;
}

void ida_snap_peers_heard(struct ida_snap_peers *s,
                          uint32_t id,
                          int own,
                          int relayed,
                          uint64_t now_ms)
{
    size_t i = peer_slot(s, id);
    if (i == s->n) {
        if (s->n < IDA_SNAP_PEERS_MAX) {
            s->n++;
        } else {
            i = 0; /* full: the report heard longest ago gives way */
            for (size_t k = 1; k < s->n; k++) {
                if (s->p[k].heard_ms < s->p[i].heard_ms) {
                    i = k;
                }
            }
        }
    }
    s->p[i].id = id;
    s->p[i].own = own != 0;
    s->p[i].relayed = relayed != 0;
    s->p[i].heard_ms = now_ms;
}

/* Whether report @i was heard within IDA_SNAP_HEARD_MS of @now_ms. */
static int heard_lately(const struct ida_snap_peers *s,
                        size_t i,
                        uint64_t now_ms)
{
    return now_ms - s->p[i].heard_ms < IDA_SNAP_HEARD_MS;
}

int ida_snap_peers_busy(const struct ida_snap_peers *s,
                        uint64_t now_ms,
                        int first_hand_only)
{
    for (size_t i = 0; i < s->n; i++) {
        int busy = s->p[i].own || (!first_hand_only && s->p[i].relayed);
        if (busy && heard_lately(s, i, now_ms)) {
            return 1;
        }
    }
    return 0;
}

int ida_snap_follower_behind(const struct ida_snap_peers *s,
                             uint32_t id,
                             int sending,
                             uint64_t match,
                             uint64_t commit,
                             uint64_t now_ms)
{
    size_t i = peer_slot(s, id);
    /* Never heard from: not catching up from this leader. */
    return i < s->n && heard_lately(s, i, now_ms) &&
           (sending || match + IDA_SNAP_CATCHUP_LAG < commit);
}

int ida_snap_hold(int leader, int behind, uint64_t since_ms, uint64_t now_ms)
{
    return leader && behind && now_ms - since_ms < IDA_SNAP_HOLD_MS;
}

uint64_t ida_snap_peers_relay_word(const struct ida_snap_peers *s,
                                   uint64_t now_ms)
{
    uint64_t n = 0, id = 0;
    for (size_t i = 0; i < s->n && n < 2; i++) {
        if (s->p[i].own && heard_lately(s, i, now_ms)) {
            n++;
            id = s->p[i].id;
        }
    }
    return n << 32 | (n == 1 ? id : 0);
}

int ida_snap_relay_to(uint64_t word, uint32_t to)
{
    uint64_t n = word >> 32;
    return n >= 2 || (n == 1 && (uint32_t)word != to);
}
