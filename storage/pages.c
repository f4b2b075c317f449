/* storage/: does every page data.mdb's B-trees use lie inside the file?
 *
 * Open reads data.mdb's meta pages with read(2) before LMDB maps the file
 * (identity.c). When the newer one names pages past the end of the file,
 * either they are free pages LMDB never wrote (a page allocated and freed
 * by one transaction, P_LOOSE: storage.h), or the file was cut short and
 * LMDB would stop the process with SIGBUS when it reads one. This tells the
 * two apart by walking, with pread(2), every tree the meta page reaches:
 * the free list's, the main database's and each named database's, down to
 * their leaves and the overflow pages their big values take. The file is
 * refused only when a page one of them uses is missing, or when the walk
 * finds a page that is not what its parent says. A free page is never
 * read, so a missing one is never a reason.
 *
 * The walk reads each branch and leaf page once (an overflow run only by
 * the range its node names) and runs only on a file that ends short of
 * its last page, which LMDB leaves so now and then (about 1 commit in 170
 * of random puts and deletes; tests/storage/test_storage_identity.c).
 *
 * LMDB 0.9's page layout as liblmdb 0.9.24 writes it on x86-64 (mdb.c:
 * MDB_page, MDB_node, MDB_db; native byte order, 8-byte pgno_t), offsets
 * from the start of a page or node: */
#include "storage/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idalloc_errors.h"

#define PG_PGNO   0  /* u64 mp_pgno */
#define PG_FLAGS  10 /* u16 mp_flags */
#define PG_LOWER  12 /* u16 mp_lower: end of the node offsets */
#define PG_UPPER  14 /* u16 mp_upper: start of the nodes */
#define PAGEHDRSZ 16 /* then u16 mp_ptrs[]: each node's offset */
#define P_BRANCH  0x01
#define P_LEAF    0x02
#define P_LEAF2   0x20 /* MDB_DUPFIXED: keys only, no nodes */
#define N_LO      0    /* u16 mn_lo: low bits of data size or child */
#define N_HI      2    /* u16 mn_hi */
#define N_FLAGS   4    /* u16 mn_flags; a branch's child's bits 32..47 */
#define N_KSIZE   6    /* u16 mn_ksize */
#define NODESIZE  8    /* then the key, then the data */
#define F_BIGDATA 0x01 /* data: u64 pgno of its first overflow page */
#define F_SUBDATA 0x02 /* data: an MDB_db, a database of its own */
#define DB_ROOT   40   /* u64 md_root in MDB_db */
#define DB_BYTES  48
#define DEPTH_MAX 32 /* LMDB's CURSOR_STACK */
#define NAME_MAX_ 40 /* bytes of a database's name shown in a message */

struct walk
{
    struct ida_storage *s;
    const char *dir;
    int fd;
    uint32_t psize;
    uint64_t pages;   /* in the file */
    uint64_t visited; /* branch and leaf pages read: at most @pages */
    char tree[NAME_MAX_ + 32];
};

static int missing(struct walk *w, const char *what, uint64_t pgno)
{
    return ida__storage_fail(w->s, w->dir, IDA_ECORRUPT,
                             "data.mdb's %s uses %s %llu but the file has "
                             "%llu pages (truncated?)" DAMAGE_TAIL,
                             w->tree, what, (unsigned long long)pgno,
                             (unsigned long long)w->pages);
}

static int damaged(struct walk *w, uint64_t pgno, const char *why)
{
    return ida__storage_fail(w->s, w->dir, IDA_ECORRUPT,
                             "data.mdb page %llu, in the %s, %s" DAMAGE_TAIL,
                             (unsigned long long)pgno, w->tree, why);
}

/* Name the tree a database record's key @k (@n bytes) opens, for messages. */
static void name_tree(struct walk *w, const uint8_t *k, size_t n)
{
    char name[NAME_MAX_ + 1];
    size_t len = n < NAME_MAX_ ? n : NAME_MAX_;
    for (size_t i = 0; i < len; i++) {
        name[i] = k[i] >= 0x20 && k[i] < 0x7f && k[i] != '"' ? (char)k[i] : '?';
    }
    name[len] = '\0';
    snprintf(w->tree, sizeof(w->tree), "database \"%s\"", name);
}

static int walk_tree(struct walk *w, uint64_t pgno, int level);

/* Node @i of page @p (@pgno; its mp_lower @lower): NULL, with the damage
 * recorded (*@rv), when its header or key lies outside the page. */
static const uint8_t *node_at(struct walk *w,
                              const uint8_t *p,
                              uint64_t pgno,
                              uint32_t i,
                              uint16_t lower,
                              int *rv)
{
    uint32_t off = ida__le16(p + PAGEHDRSZ + 2 * i);
    if (off < lower || off + NODESIZE > w->psize ||
        off + NODESIZE + ida__le16(p + off + N_KSIZE) > w->psize) {
        *rv = damaged(w, pgno, "has a node outside the page");
        return NULL;
    }
    return p + off;
}

/* The leaf page @p (@pgno): a value's overflow run must be in the file, a
 * database record's tree is walked. */
static int walk_leaf(struct walk *w, const uint8_t *p, uint64_t pgno, int level)
{
    uint16_t lower = ida__le16(p + PG_LOWER);
    for (uint32_t i = 0; PAGEHDRSZ + 2 * i < lower; i++) {
        int rv = 0;
        const uint8_t *n = node_at(w, p, pgno, i, lower, &rv);
        if (n == NULL) {
            return rv;
        }
        uint64_t off = (uint64_t)(n - p);
        uint32_t ksize = ida__le16(n + N_KSIZE);
        uint32_t flags = ida__le16(n + N_FLAGS);
        uint64_t dsize =
            (uint64_t)ida__le16(n + N_LO) | (uint64_t)ida__le16(n + N_HI) << 16;
        uint64_t data_at = off + NODESIZE + ksize;
        if (flags & F_BIGDATA) {
            if (data_at + 8 > w->psize) {
                return damaged(w, pgno, "has a node outside the page");
            }
            uint64_t first = ida__le64(p + data_at);
            uint64_t count = (PAGEHDRSZ - 1 + dsize) / w->psize + 1;
            if (first < 2) {
                return damaged(w, pgno,
                               "names a meta page as a value's first page");
            }
            if (first >= w->pages || count > w->pages - first) {
                return missing(
                    w, "value pages up to",
                    first + count - 1 < first ? UINT64_MAX : first + count - 1);
            }
            continue;
        }
        if (data_at + dsize > w->psize) {
            return damaged(w, pgno, "has a node outside the page");
        }
        if (flags & F_SUBDATA) {
            if (dsize != DB_BYTES) {
                return damaged(w, pgno,
                               "has a database record of the "
                               "wrong size");
            }
            uint64_t root = ida__le64(p + data_at + DB_ROOT);
            if (root == P_INVALID_PG) {
                continue; /* an empty database */
            }
            char outer[sizeof(w->tree)];
            memcpy(outer, w->tree, sizeof(outer));
            name_tree(w, n + NODESIZE, ksize);
            rv = walk_tree(w, root, level + 1);
            if (rv != 0) {
                return rv;
            }
            memcpy(w->tree, outer, sizeof(outer));
        }
        /* Any other value (a sub-page of duplicates included) lies in this
         * page. */
    }
    return 0;
}

/* The page @pgno at depth @level of all the trees walked so far. */
static int walk_tree(struct walk *w, uint64_t pgno, int level)
{
    if (pgno < 2) {
        return damaged(w, pgno, "is a meta page where a tree page belongs");
    }
    if (pgno >= w->pages) {
        return missing(w, "page", pgno);
    }
    /* Trees within trees: the main database, a named database, a
     * database of duplicates; @visited bounds the work anyway. */
    if (level >= 3 * DEPTH_MAX) {
        return damaged(w, pgno, "lies deeper than LMDB's trees go (a loop?)");
    }
    if (++w->visited > w->pages) {
        return damaged(w, pgno, "is reached twice (a loop?)");
    }
    uint8_t *p = malloc(w->psize);
    if (p == NULL) {
        return ida__storage_fail(w->s, w->dir, IDA_ENOMEM,
                                 "out of memory checking data.mdb's pages");
    }
    int rv = 0;
    int r = ida__storage_read_at(w->fd, p, w->psize, (off_t)(pgno * w->psize));
    if (r != 1) {
        rv =
            ida__storage_fail(w->s, w->dir, IDA_EIO, "cannot read data.mdb: %s",
                              r < 0 ? strerror(-r) : "short read");
        goto out;
    }
    uint16_t flags = ida__le16(p + PG_FLAGS);
    uint16_t lower = ida__le16(p + PG_LOWER), upper = ida__le16(p + PG_UPPER);
    if (ida__le64(p + PG_PGNO) != pgno) {
        rv = damaged(w, pgno, "carries another page's number");
    } else if ((flags & (P_BRANCH | P_LEAF)) == 0 ||
               (flags & (P_BRANCH | P_LEAF)) == (P_BRANCH | P_LEAF)) {
        rv = damaged(w, pgno, "is neither a branch nor a leaf");
    } else if (lower < PAGEHDRSZ || lower > upper || upper > w->psize ||
               (lower - PAGEHDRSZ) % 2 != 0) {
        rv = damaged(w, pgno, "has a bad page header");
    } else if ((flags & P_LEAF2) && !(flags & P_LEAF)) {
        rv = damaged(w, pgno, "is a branch marked as a leaf of keys only");
    } else if (flags & P_LEAF2) {
        rv = 0; /* keys only, nothing points out of it */
    } else if (flags & P_LEAF) {
        rv = walk_leaf(w, p, pgno, level);
    } else {
        for (uint32_t i = 0; rv == 0 && PAGEHDRSZ + 2 * i < lower; i++) {
            const uint8_t *n = node_at(w, p, pgno, i, lower, &rv);
            if (n == NULL) {
                break;
            }
            uint64_t child = (uint64_t)ida__le16(n + N_LO) |
                             (uint64_t)ida__le16(n + N_HI) << 16 |
                             (uint64_t)ida__le16(n + N_FLAGS) << 32;
            rv = walk_tree(w, child, level + 1);
        }
    }
out:
    free(p);
    return rv;
}

int ida__storage_check_pages(struct ida_storage *s,
                             const char *dir,
                             int fd,
                             uint32_t psize,
                             uint64_t pages,
                             uint64_t free_root,
                             uint64_t main_root)
{
    struct walk w = {
        .s = s, .dir = dir, .fd = fd, .psize = psize, .pages = pages};
    int rv = 0;
    if (free_root != P_INVALID_PG) {
        snprintf(w.tree, sizeof(w.tree), "free list");
        rv = walk_tree(&w, free_root, 0);
    }
    if (rv == 0 && main_root != P_INVALID_PG) {
        snprintf(w.tree, sizeof(w.tree), "main database");
        rv = walk_tree(&w, main_root, 0);
    }
    return rv;
}
