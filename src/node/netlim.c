#include "src/node/netlim.h"

#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "base/assert.h"

static const char *const reason_names[IDA_NETLIM_REASONS] = {
    [IDA_NETLIM_REFUSED] = "refused (every slot active)",
    [IDA_NETLIM_EVICTED] = "evicted idle",
    [IDA_NETLIM_IDLE] = "idle timeout",
    [IDA_NETLIM_FRAME_TIMEOUT] = "frame timeout",
    [IDA_NETLIM_QUEUE] = "output queue cap (not reading)",
    [IDA_NETLIM_OUTPUT] = "total output cap",
    [IDA_NETLIM_INPUT] = "total input cap",
    [IDA_NETLIM_PROTOCOL] = "protocol error",
    [IDA_NETLIM_RESERVE_ONLY] = "not status on a reserve connection",
};

const char *ida_netlim_reason_name(enum ida_netlim_reason r)
{
    return (unsigned)r < IDA_NETLIM_REASONS ? reason_names[r] : "?";
}

void ida_netlim_init(struct ida_netlim *l,
                     const struct ida_netlim_config *cfg,
                     uint64_t now_ms)
{
    IDA_ASSERT(cfg->client_max >= 1 && cfg->peer_max >= 1);
    memset(l, 0, sizeof(*l));
    l->cfg = *cfg;
    l->last_summary_ms = now_ms;
}

/* --- the two intrusive lists -------------------------------------------- */

static void lru_unlink(struct ida_netlim_list *q, struct ida_netlim_entry *e)
{
    if (e->prev != NULL) {
        e->prev->next = e->next;
    } else {
        q->head = e->next;
    }
    if (e->next != NULL) {
        e->next->prev = e->prev;
    } else {
        q->tail = e->prev;
    }
    e->prev = e->next = NULL;
    q->count--;
}

static void lru_append(struct ida_netlim_list *q, struct ida_netlim_entry *e)
{
    e->next = NULL;
    e->prev = q->tail;
    if (q->tail != NULL) {
        q->tail->next = e;
    } else {
        q->head = e;
    }
    q->tail = e;
    q->count++;
}

static void part_unlink(struct ida_netlim_list *q, struct ida_netlim_entry *e)
{
    if (e->pprev != NULL) {
        e->pprev->pnext = e->pnext;
    } else {
        q->head = e->pnext;
    }
    if (e->pnext != NULL) {
        e->pnext->pprev = e->pprev;
    } else {
        q->tail = e->pprev;
    }
    e->pprev = e->pnext = NULL;
    q->count--;
}

static void part_append(struct ida_netlim_list *q, struct ida_netlim_entry *e)
{
    e->pnext = NULL;
    e->pprev = q->tail;
    if (q->tail != NULL) {
        q->tail->pnext = e;
    } else {
        q->head = e;
    }
    q->tail = e;
    q->count++;
}

/* --- membership --------------------------------------------------------- */

void ida_netlim_add(struct ida_netlim *l,
                    struct ida_netlim_entry *e,
                    enum ida_netlim_class cls,
                    uint64_t now_ms)
{
    IDA_ASSERT(!e->linked && (unsigned)cls < IDA_NETLIM_CLASSES);
    e->cls = cls;
    e->last_active_ms = now_ms;
    e->linked = 1;
    lru_append(&l->lru[cls], e);
}

void ida_netlim_remove(struct ida_netlim *l, struct ida_netlim_entry *e)
{
    if (e->in_partial) {
        part_unlink(&l->partial[e->cls], e);
        e->in_partial = 0;
    }
    if (e->linked) {
        lru_unlink(&l->lru[e->cls], e);
        e->linked = 0;
    }
}

void ida_netlim_touch(struct ida_netlim *l,
                      struct ida_netlim_entry *e,
                      uint64_t now_ms)
{
    if (!e->linked) {
        return;
    }
    e->last_active_ms = now_ms;
    if (l->lru[e->cls].tail != e) {
        lru_unlink(&l->lru[e->cls], e);
        lru_append(&l->lru[e->cls], e);
    }
}

void ida_netlim_input(struct ida_netlim *l,
                      struct ida_netlim_entry *e,
                      int busy,
                      unsigned frames,
                      uint64_t now_ms)
{
    if (!e->linked) {
        return;
    }
    if (frames > 0) {
        ida_netlim_touch(l, e, now_ms);
    }
    struct ida_netlim_list *q = &l->partial[e->cls];
    if (e->in_partial && (!busy || frames > 0)) {
        part_unlink(q, e); /* done, or a newer frame started */
        e->in_partial = 0;
    }
    if (busy && !e->in_partial) {
        e->frame_start_ms = now_ms;
        e->in_partial = 1;
        part_append(q, e);
    }
}

/* --- admission, timeouts ------------------------------------------------ */

/* The head of @cls if it may be evicted at @now. */
static struct ida_netlim_entry *evictable(struct ida_netlim *l,
                                          enum ida_netlim_class cls,
                                          uint64_t now_ms)
{
    struct ida_netlim_entry *h = l->lru[cls].head;
    if (h == NULL || h->pending > 0 ||
        now_ms - h->last_active_ms < l->cfg.evict_idle_ms) {
        return NULL;
    }
    return h;
}

static int take(struct ida_netlim *l,
                enum ida_netlim_class cls,
                uint64_t max,
                uint64_t now_ms,
                struct ida_netlim_entry **victim)
{
    if (l->lru[cls].count < max) {
        return 1;
    }
    struct ida_netlim_entry *h = evictable(l, cls, now_ms);
    if (h == NULL) {
        return 0;
    }
    ida_netlim_remove(l, h);
    ida_netlim_count(l, IDA_NETLIM_EVICTED);
    *victim = h;
    return 1;
}

int ida_netlim_admit(struct ida_netlim *l,
                     enum ida_netlim_class cls,
                     uint64_t now_ms,
                     struct ida_netlim_entry **victim)
{
    *victim = NULL;
    if (cls == IDA_NETLIM_PEER) {
        if (take(l, IDA_NETLIM_PEER, l->cfg.peer_max, now_ms, victim)) {
            return IDA_NETLIM_PEER;
        }
    } else {
        if (take(l, IDA_NETLIM_CLIENT, l->cfg.client_max, now_ms, victim)) {
            return IDA_NETLIM_CLIENT;
        }
        if (take(l, IDA_NETLIM_RESERVE, l->cfg.reserve_max, now_ms, victim)) {
            return IDA_NETLIM_RESERVE;
        }
    }
    ida_netlim_count(l, IDA_NETLIM_REFUSED);
    return -1;
}

struct ida_netlim_entry *ida_netlim_expired(struct ida_netlim *l,
                                            uint64_t now_ms,
                                            enum ida_netlim_reason *reason)
{
    for (int c = 0; c < IDA_NETLIM_CLASSES; c++) {
        uint64_t limit = c == IDA_NETLIM_PEER ? l->cfg.peer_frame_timeout_ms
                                              : l->cfg.frame_timeout_ms;
        struct ida_netlim_entry *h = l->partial[c].head;
        if (h != NULL && now_ms - h->frame_start_ms >= limit) {
            *reason = IDA_NETLIM_FRAME_TIMEOUT;
        } else {
            h = c == IDA_NETLIM_PEER ? NULL : l->lru[c].head;
            if (h == NULL ||
                now_ms - h->last_active_ms < l->cfg.idle_timeout_ms) {
                continue;
            }
            *reason = IDA_NETLIM_IDLE;
        }
        ida_netlim_remove(l, h);
        ida_netlim_count(l, *reason);
        return h;
    }
    return NULL;
}

void ida_netlim_count(struct ida_netlim *l, enum ida_netlim_reason reason)
{
    IDA_ASSERT((unsigned)reason < IDA_NETLIM_REASONS);
    l->closed[reason]++;
    l->closed_total[reason]++;
}

int ida_netlim_summary(struct ida_netlim *l,
                       uint64_t now_ms,
                       char *buf,
                       size_t cap)
{
    uint64_t total = 0;
    for (int r = 0; r < IDA_NETLIM_REASONS; r++) {
        total += l->closed[r];
    }
    if (total == 0 || now_ms - l->last_summary_ms < l->cfg.summary_ms) {
        return 0;
    }
    uint64_t span = now_ms - l->last_summary_ms;
    size_t n = (size_t)snprintf(
        buf, cap, "closed %llu connection(s) in the last %llu.%llu s:",
        (unsigned long long)total, (unsigned long long)(span / 1000),
        (unsigned long long)(span % 1000 / 100));
    const char *sep = " ";
    for (int r = 0; r < IDA_NETLIM_REASONS && n < cap; r++) {
        if (l->closed[r] > 0) {
            n += (size_t)snprintf(buf + n, cap - n, "%s%llu %s", sep,
                                  (unsigned long long)l->closed[r],
                                  reason_names[r]);
            sep = ", ";
        }
    }
    memset(l->closed, 0, sizeof(l->closed));
    l->last_summary_ms = now_ms;
    return 1;
}

/* --- descriptors -------------------------------------------------------- */

uint64_t ida_netlim_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return 0;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) {
            rl = want;
        }
    }
    return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}

int ida_netlim_clamp(uint64_t nofile,
                     uint64_t fd_reserve,
                     uint64_t *client_max,
                     uint64_t *reserve_max)
{
    uint64_t avail = nofile > fd_reserve ? nofile - fd_reserve : 0;
    if (*client_max <= avail && *reserve_max <= avail - *client_max) {
        return 0;
    }
    if (*reserve_max > avail / 2) {
        *reserve_max = avail / 2;
    }
    uint64_t left = avail - *reserve_max;
    if (*client_max > left) {
        *client_max = left;
    }
    if (*client_max < 1) {
        *client_max = 1;
    }
    return 1;
}
