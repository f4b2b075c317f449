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
    draw(p);
}
