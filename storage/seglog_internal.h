/* Internals of the segment log (storage/seglog.h), shared by seglog.c
 * (appends, flushes, the spare, reads) and seglog_open.c (recovery). */
#ifndef IDA_STORAGE_SEGLOG_INTERNAL_H
#define IDA_STORAGE_SEGLOG_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "storage/seglog.h"

#define IDA__SEGLOG_NAME_MAX 64

struct seg
{
    uint64_t seq;
    uint64_t first_lsn; /* its first record's LSN */
    uint64_t last_lsn;  /* its last one's (first_lsn - 1: none yet) */
    size_t bytes;       /* the file's size */
    int fd;
    bool dirty; /* written since the last sync */
};

struct ida_seglog
{
    char *dir;
    struct ida_seglog_options o;
    struct seg *segs; /* in sequence order; the last takes the appends */
    size_t n, cap;
    size_t off; /* where the next record goes in the last segment */
    uint64_t next_lsn;
    uint64_t synced_lsn;
    uint64_t next_seq; /* of the next segment made */
    int failed;        /* sticky: a write or a flush failed */
    /* The next segment, being made (spare_fd >= 0) or made (ready). */
    int spare_fd;
    size_t spare_bytes; /* its size */
    size_t spare_done;
    bool spare_small; /* make the next one of open_segment_bytes */
    bool spare_ready;
    uint64_t spare_seq;
    struct ida__seglog_maker *maker; /* at work (o.behind), or NULL */
    /* Released segments not yet handed to a maker (o.behind), in order;
     * the first failure of removing some, for every later release (none
     * is removed from then on). */
    uint64_t *gone;
    size_t n_gone, cap_gone;
    int gone_rv;
};

/* @prefix-<16 hex digits of @seq> into @buf (IDA__SEGLOG_NAME_MAX). */
void ida__seglog_name(char *buf, const char *prefix, uint64_t seq);
/* @dir/@name into @buf; false if it does not fit. */
bool ida__seglog_join(char *buf,
                      size_t size,
                      const char *dir,
                      const char *name);
/* A one-line message into @err (NULL or @errlen 0: none). */
void ida__seglog_say(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Remove @name from the log's directory @dir (absent is fine): 0 or
 * IDA_EIO. */
int ida__seglog_unlink(const char *dir, const char *name);
/* The header @h of the segment named with @seq: 0 with *@first_lsn, 1 for
 * bytes that are no header, or IDA_EVERSION, IDA_EFOREIGN, IDA_ECORRUPT. */
int ida__seglog_header_decode(const struct ida_seglog *l,
                              const uint8_t *h,
                              uint64_t seq,
                              uint64_t *first_lsn);
/* A record's bytes in a segment, its header and padding included. */
size_t ida__seglog_record_bytes(size_t len);
/* The record at @p (@avail bytes to the segment's end), if it checks. */
bool ida__seglog_record_check(const uint8_t *p,
                              size_t avail,
                              uint64_t *lsn,
                              uint64_t *synced,
                              size_t *len);
/* Add @s to the segments kept: 0 or IDA_ENOMEM. */
int ida__seglog_push(struct ida_seglog *l, const struct seg *s);
/* Make the spare (made whole first if need be) the segment appends go to,
 * its first record next_lsn. */
int ida__seglog_switch(struct ida_seglog *l);

#endif /* IDA_STORAGE_SEGLOG_INTERNAL_H */
