#include "src/node/errtop.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/assert.h"
#include "base/fdio.h"
#include "base/heap.h"
#include "base/log.h"
#include "idalloc_errors.h"
#include "proto/idalloc.pb-c.h"
#include "src/pool/pool.h"

#define DUMP_VERSION   1
#define DUMP_BYTES_MAX (1u << 20)

int ida_errtop_init(struct ida_errtop *t,
                    const char *path,
                    uint32_t node_id,
                    int64_t dump_interval_ms,
                    int64_t keep_ms)
{
    IDA_ASSERT(t != NULL);
    memset(t, 0, sizeof(*t));
    if (path != NULL) {
        t->path = ida_strndup(path, strlen(path));
        if (t->path == NULL) {
            return IDA_ENOMEM;
        }
    }
    t->node_id = node_id;
    t->keep_ms = keep_ms;
    ida_wtimer_init(&t->dump_timer, dump_interval_ms * 1000000, NULL, NULL);
    ida_pclock_init(&t->clock, ida_clock_realtime_ns, NULL);
    return 0;
}

void ida_errtop_close(struct ida_errtop *t)
{
    ida_free(t->path);
    t->path = NULL;
    t->n = 0;
}

static void remove_at(struct ida_errtop *t, size_t i)
{
    IDA_ASSERT(i < t->n);
    t->e[i] = t->e[t->n - 1];
    t->n--;
}

/* Forget errors not seen for keep_ms. */
static void remove_old(struct ida_errtop *t, uint64_t now_ms)
{
    if (t->keep_ms <= 0 || now_ms < (uint64_t)t->keep_ms) {
        return;
    }
    uint64_t oldest_kept = now_ms - (uint64_t)t->keep_ms;
    for (size_t i = 0; i < t->n;) {
        if (t->e[i].last_seen_ms < oldest_kept) {
            remove_at(t, i);
        } else {
            i++;
        }
    }
}

/* The entry to give up for a new one: least frequent, then seen longest
 * ago. */
static size_t victim(const struct ida_errtop *t)
{
    size_t v = 0;
    for (size_t i = 1; i < t->n; i++) {
        const struct ida_errtop_entry *a = &t->e[i], *b = &t->e[v];
        if (a->count < b->count ||
            (a->count == b->count && a->last_seen_ms < b->last_seen_ms)) {
            v = i;
        }
    }
    return v;
}

static size_t find_index(const struct ida_errtop *t, int code, const char *text)
{
    for (size_t i = 0; i < t->n; i++) {
        if (t->e[i].code == (uint32_t)code &&
            strncmp(t->e[i].text, text, IDA_ERRTOP_TEXT_MAX) == 0) {
            return i;
        }
    }
    return t->n;
}

const struct ida_errtop_entry *ida_errtop_find(const struct ida_errtop *t,
                                               int code,
                                               const char *text)
{
    size_t i = find_index(t, code, text);
    return i < t->n ? &t->e[i] : NULL;
}

void ida_errtop_add(struct ida_errtop *t,
                    int code,
                    const char *text,
                    uint64_t now_ms)
{
    IDA_ASSERT(t != NULL);
    if (text == NULL) {
        text = "";
    }
    if (now_ms == 0) {
        now_ms = (uint64_t)(ida_pclock_now(&t->clock) / 1000000);
    }
    remove_old(t, now_ms);
    size_t i = find_index(t, code, text);
    if (i == t->n) {
        if (t->n == IDA_ERRTOP_SIZE) {
            remove_at(t, victim(t));
        }
        i = t->n++;
        t->e[i].code = (uint32_t)code;
        snprintf(t->e[i].text, sizeof(t->e[i].text), "%s", text);
        t->e[i].count = 0;
    }
    t->e[i].count++;
    t->e[i].last_seen_ms = now_ms;
    t->dirty = true;
    IDA_ASSERT(t->n <= IDA_ERRTOP_SIZE);
    if (t->path != NULL && ida_wtimer_check(&t->dump_timer)) {
        if (ida_errtop_dump(t) == 0) {
            ida_wtimer_reset(&t->dump_timer);
        }
    }
}

static int fsync_dir_of(const char *path)
{
    char *copy = ida_strndup(path, strlen(path));
    if (copy == NULL) {
        return IDA_ENOMEM;
    }
    int rv = ida_fsync_dir(dirname(copy));
    ida_free(copy);
    return rv;
}

/* Encode the top; *@buf_out is ida_malloc'ed. */
static int encode(const struct ida_errtop *t, uint8_t **buf_out, size_t *len)
{
    Idalloc__ErrorCount counts[IDA_ERRTOP_SIZE];
    Idalloc__ErrorCount *ptrs[IDA_ERRTOP_SIZE];
    for (size_t i = 0; i < t->n; i++) {
        idalloc__error_count__init(&counts[i]);
        counts[i].code = t->e[i].code;
        counts[i].text = (char *)t->e[i].text;
        counts[i].count = t->e[i].count;
        counts[i].last_seen_unix_ms = t->e[i].last_seen_ms;
        ptrs[i] = &counts[i];
    }
    Idalloc__ErrorTopDump d;
    idalloc__error_top_dump__init(&d);
    d.version = DUMP_VERSION;
    d.node_id = t->node_id;
    d.dumped_at_unix_ms = (uint64_t)(ida_clock_realtime_ns(NULL) / 1000000);
    d.n_errors = t->n;
    d.errors = ptrs;
    *len = idalloc__error_top_dump__get_packed_size(&d);
    *buf_out = ida_malloc(*len > 0 ? *len : 1);
    if (*buf_out == NULL) {
        return IDA_ENOMEM;
    }
    idalloc__error_top_dump__pack(&d, *buf_out);
    return 0;
}

void ida_errtop_tick(struct ida_errtop *t)
{
    if (t->path != NULL && t->dirty && ida_wtimer_check(&t->dump_timer)) {
        if (ida_errtop_dump(t) == 0) {
            ida_wtimer_reset(&t->dump_timer);
        }
    }
}

int ida_errtop_dump(struct ida_errtop *t)
{
    IDA_ASSERT(t != NULL);
    if (t->path == NULL) {
        return IDA_EINVAL;
    }
    uint8_t *buf;
    size_t len;
    int rv = encode(t, &buf, &len);
    if (rv != 0) {
        return rv;
    }
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", t->path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rv = IDA_EIO;
        goto err_after_encode;
    }
    rv = ida_write_all(fd, buf, len);
    if (rv == 0 && fsync(fd) != 0) {
        rv = IDA_EIO;
    }
    if (close(fd) != 0 && rv == 0) {
        rv = IDA_EIO;
    }
    if (rv != 0) {
        goto err_after_open;
    }
    /* rename() is atomic: readers see the old or the new dump. */
    if (rename(tmp, t->path) != 0) {
        rv = IDA_EIO;
        goto err_after_open;
    }
    ida_free(buf);
    t->dirty = false;
    return fsync_dir_of(t->path);

err_after_open:
    unlink(tmp);
err_after_encode:
    ida_free(buf);
    return rv;
}

/* Read the whole file at @path into a fresh buffer. */
static int read_file(const char *path, uint8_t **buf_out, size_t *len_out)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return errno == ENOENT ? IDA_ENOTFOUND : IDA_EIO;
    }
    struct stat st;
    int rv = 0;
    uint8_t *buf = NULL;
    if (fstat(fd, &st) != 0) {
        rv = IDA_EIO;
        goto out;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size > DUMP_BYTES_MAX) {
        rv = IDA_ECORRUPT;
        goto out;
    }
    size_t len = (size_t)st.st_size;
    buf = ida_malloc(len > 0 ? len : 1);
    if (buf == NULL) {
        rv = IDA_ENOMEM;
        goto out;
    }
    if (ida_read_all(fd, buf, len) != 0) {
        rv = IDA_EIO;
        ida_free(buf);
        buf = NULL;
        goto out;
    }
    *buf_out = buf;
    *len_out = len;
out:
    close(fd);
    return rv;
}

/* Decode @path into @out sorted by count (most frequent first). */
static int load(const char *path,
                struct ida_errtop_entry *out,
                size_t max,
                size_t *count_out)
{
    uint8_t *buf;
    size_t len;
    int rv = read_file(path, &buf, &len);
    if (rv != 0) {
        return rv;
    }
    Idalloc__ErrorTopDump *d = idalloc__error_top_dump__unpack(NULL, len, buf);
    ida_free(buf);
    if (d == NULL) {
        return IDA_ECORRUPT;
    }
    if (d->version != DUMP_VERSION) {
        idalloc__error_top_dump__free_unpacked(d, NULL);
        return IDA_ECORRUPT;
    }
    size_t n = 0;
    for (size_t i = 0; i < d->n_errors && n < max; i++) {
        struct ida_errtop_entry *e = &out[n++];
        e->code = d->errors[i]->code;
        snprintf(e->text, sizeof(e->text), "%s",
                 d->errors[i]->text != NULL ? d->errors[i]->text : "");
        e->count = d->errors[i]->count;
        e->last_seen_ms = d->errors[i]->last_seen_unix_ms;
    }
    idalloc__error_top_dump__free_unpacked(d, NULL);
    ida_errtop_sort(out, n);
    *count_out = n;
    return 0;
}

void ida_errtop_sort(struct ida_errtop_entry *e, size_t n)
{
    /* Insertion sort: n <= a few dozen. */
    for (size_t i = 1; i < n; i++) {
        struct ida_errtop_entry x = e[i];
        size_t j = i;
        while (j > 0 && e[j - 1].count < x.count) {
            e[j] = e[j - 1];
            j--;
        }
        e[j] = x;
    }
}

int ida_errtop_restore(struct ida_errtop *t)
{
    IDA_ASSERT(t != NULL);
    if (t->path == NULL) {
        return IDA_EINVAL;
    }
    struct ida_errtop_entry *tmp = ida_malloc(IDA_ERRTOP_SIZE * sizeof(*tmp));
    if (tmp == NULL) {
        return IDA_ENOMEM;
    }
    size_t n = 0;
    int rv = load(t->path, tmp, IDA_ERRTOP_SIZE, &n);
    if (rv == IDA_ENOTFOUND) {
        rv = 0;
        n = 0;
    }
    if (rv == 0) {
        memcpy(t->e, tmp, n * sizeof(*tmp));
        t->n = n;
        t->dirty = false;
    }
    ida_free(tmp);
    return rv;
}

int ida_errtop_read_file(const char *path,
                         struct ida_errtop_entry *out,
                         size_t max,
                         size_t *count_out)
{
    IDA_ASSERT(path != NULL && out != NULL && count_out != NULL);
    int rv = load(path, out, max, count_out);
    return rv == IDA_ENOTFOUND ? IDA_EIO : rv;
}

/* --- the pool's error sink ------------------------------------------------ */

#define SINK_DUMP_INTERVAL_MS 1000
#define SINK_KEEP_MS          (7LL * 24 * 3600 * 1000)

static void *sink_open(void *arg, uint32_t worker)
{
    const struct ida_errtop_where *a = arg;
    struct ida_errtop *t = ida_malloc(sizeof(*t));
    if (t == NULL) {
        IDA_WARN("error top of worker %u not kept: out of memory", worker);
        return NULL;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/errtop-%u.pb", a->dir, worker);
    if (ida_errtop_init(t, path, a->node_id, SINK_DUMP_INTERVAL_MS,
                        SINK_KEEP_MS) != 0) {
        IDA_WARN("error top of worker %u not kept: out of memory", worker);
        ida_free(t);
        return NULL;
    }
    int rv = ida_errtop_restore(t);
    if (rv != 0) {
        IDA_WARN("error top %s not restored (%s); starting an empty one", path,
                 idalloc_strerror(rv));
    }
    return t;
}

static void sink_add(void *wctx, int code, const char *text)
{
    ida_errtop_add(wctx, code, text, 0);
}

static void sink_tick(void *wctx)
{
    ida_errtop_tick(wctx);
}

static void sink_flush(void *wctx)
{
    struct ida_errtop *t = wctx;
    if (t->dirty) {
        (void)ida_errtop_dump(t);
    }
}

static void sink_close(void *wctx)
{
    ida_errtop_close(wctx);
    ida_free(wctx);
}

void ida_errtop_sink(struct ida_pool_error_sink *out,
                     const struct ida_errtop_where *where)
{
    *out = (struct ida_pool_error_sink){sink_open,  sink_add,   sink_tick,
                                        sink_flush, sink_close, (void *)where};
}
