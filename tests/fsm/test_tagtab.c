/* fsm/tagtab.c: the tag table's bulk loading (restore's path), against
 * the one-by-one insert it replaces: every key found where it is, a key
 * held twice refused, probe runs that cross regions and wrap around the
 * end of the table. And its growth a step at a time: every key found, and
 * none found that is not there, at every step of inserts and removes while
 * an old table is emptied into a new one. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "fsm/fsm_internal.h"
#include "idalloc_errors.h"

enum { KEYS_MAX = 60000 };

static char (*keys)[16];

static const uint8_t *key_of(const void *ctx, uint32_t ref, size_t *len)
{
    (void)ctx;
    *len = strlen(keys[ref]);
    return (const uint8_t *)keys[ref];
}

static uint64_t hash_of(uint32_t ref)
{
    return ida__hash((const uint8_t *)keys[ref], strlen(keys[ref]));
}

static void setup(void)
{
    keys = calloc(KEYS_MAX, sizeof(*keys));
    cr_assert(keys != NULL);
}

static void teardown(void)
{
    free(keys);
}

TestSuite(tagtab, .init = setup, .fini = teardown);

/* Bulk-load refs 0..@n-1 into @t in the steps fsm_internal.h gives (on one
 * thread; restore's own grouping, shared by two threads, is tested through
 * snapshots in test_fsm_snapshot.c): the words grouped by region, then
 * inserted in that order. Returns how many inserts were refused. */
static int bulk_load(struct ida__tagtab *t, uint32_t n)
{
    uint64_t *scratch = ida__tagtab_bulk_begin(t, n);
    cr_assert(scratch != NULL);
    uint64_t *count = calloc(IDA__TAGTAB_REGIONS + 1, sizeof(*count));
    uint64_t *sorted = calloc(n, sizeof(*sorted));
    cr_assert(count != NULL && sorted != NULL);
    for (uint32_t i = 0; i < n; i++) {
        scratch[i] = ida__tagtab_word(i, hash_of(i));
        count[ida__tagtab_region(t, scratch[i]) + 1]++;
    }
    for (unsigned g = 1; g <= IDA__TAGTAB_REGIONS; g++) {
        count[g] += count[g - 1];
    }
    for (uint32_t i = 0; i < n; i++) {
        sorted[count[ida__tagtab_region(t, scratch[i])]++] = scratch[i];
    }
    for (uint32_t i = 1; i < n; i++) {
        cr_assert_leq(ida__tagtab_region(t, sorted[i - 1]),
                      ida__tagtab_region(t, sorted[i]));
    }
    ida__tagtab_bulk_clear(t, 0, t->cap);
    int refused = 0;
    for (uint32_t i = 0; i < n; i++) {
        refused += !ida__tagtab_insert_word_shared(t, sorted[i]);
    }
    t->used = n - (uint32_t)refused;
    free(count);
    free(sorted);
    return refused;
}

static uint64_t home_of(const struct ida__tagtab *t, uint32_t ref)
{
    return ida__tagtab_home(t, (uint32_t)(hash_of(ref) >> 32));
}

/* A table of 16 slots, one region each: five keys whose home is the last
 * slot wrap around to the first slots, where keys of home 0 and 1 were
 * inserted before them (regions are inserted in order). */
Test(tagtab, bulk_probe_runs_wrap_around_the_end)
{
    struct ida__tagtab t;
    ida__tagtab_init(&t, key_of, NULL);
    cr_assert_not_null(ida__tagtab_bulk_begin(&t, 11));
    cr_assert_eq(t.cap, 16);
    const uint64_t want_home[11] = {15, 15, 15, 15, 15, 0, 0, 1, 7, 7, 8};
    uint32_t n = 0;
    for (uint32_t c = 0; n < 11 && c < 100000; c++) {
        snprintf(keys[n], sizeof(keys[n]), "k%u", c);
        if (home_of(&t, n) == want_home[n]) {
            n++;
        }
    }
    cr_assert_eq(n, 11, "keys of the homes wanted exist");
    ida__tagtab_close(&t);
    ida__tagtab_init(&t, key_of, NULL);
    cr_assert_eq(bulk_load(&t, n), 0);
    /* Homes 0 and 1 fill slots 0-2, homes 7 and 8 slots 7-9; the five of
     * home 15 come last: slot 15, then around the end past slots 0-2 to
     * slots 3-6. */
    uint64_t at[16];
    for (int i = 0; i < 16; i++) {
        at[i] = t.slots[i] == 0 ? 99 : home_of(&t, (uint32_t)t.slots[i] - 1);
    }
    const uint64_t want_at[16] = {0, 0, 1,  15, 15, 15, 15, 7,
                                  7, 8, 99, 99, 99, 99, 99, 15};
    for (int i = 0; i < 16; i++) {
        cr_assert_eq(at[i], want_at[i], "slot %d holds a key of home %llu", i,
                     (unsigned long long)at[i]);
    }
    /* Every key is found. */
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(
            ida__tagtab_find(&t, (const uint8_t *)keys[i], strlen(keys[i])), i,
            "key %s", keys[i]);
    }
    cr_assert_eq(ida__tagtab_find(&t, (const uint8_t *)"absent", 6),
                 IDA__REF_NONE);
    /* Removing the first of the run keeps the rest reachable. */
    ida__tagtab_remove(&t, 0);
    for (uint32_t i = 1; i < n; i++) {
        cr_assert_eq(
            ida__tagtab_find(&t, (const uint8_t *)keys[i], strlen(keys[i])), i);
    }
    ida__tagtab_close(&t);
}

/* The same key under two refs is refused once, wherever the two fall,
 * including in a run that wraps. */
Test(tagtab, bulk_refuses_a_key_held_twice)
{
    for (uint32_t twin = 1; twin < 11; twin++) {
        struct ida__tagtab t;
        ida__tagtab_init(&t, key_of, NULL);
        cr_assert_not_null(ida__tagtab_bulk_begin(&t, 11));
        uint32_t n = 0;
        for (uint32_t c = 0; n < 11; c++) {
            snprintf(keys[n], sizeof(keys[n]), "w%u", c);
            if (n >= 6 || home_of(&t, n) == 15) {
                n++; /* six of home 15: a run that wraps */
            }
        }
        ida__tagtab_close(&t);
        memcpy(keys[twin], keys[twin - 1], sizeof(keys[twin]));
        ida__tagtab_init(&t, key_of, NULL);
        cr_assert_eq(bulk_load(&t, n), 1, "twin at %u", twin);
        ida__tagtab_close(&t);
    }
}

/* Many keys: the bulk-loaded table finds what a table built one insert at
 * a time finds, and stays usable for inserts and removals after. */
Test(tagtab, bulk_finds_what_one_by_one_finds)
{
    const uint32_t n = 50000;
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        snprintf(keys[i], sizeof(keys[i]), "tag-%u", i * 7919u);
    }
    struct ida__tagtab bulk, one;
    ida__tagtab_init(&bulk, key_of, NULL);
    ida__tagtab_init(&one, key_of, NULL);
    cr_assert_eq(bulk_load(&bulk, n), 0);
    cr_assert_eq(ida__tagtab_reserve_n(&one, n), 0);
    for (uint32_t i = 0; i < n; i++) {
        ida__tagtab_insert(&one, i);
    }
    cr_assert_eq(bulk.cap, one.cap, "sized alike");
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        const uint8_t *k = (const uint8_t *)keys[i];
        uint32_t want = i < n ? i : IDA__REF_NONE;
        cr_assert_eq(ida__tagtab_find(&bulk, k, strlen(keys[i])), want);
        cr_assert_eq(ida__tagtab_find(&one, k, strlen(keys[i])), want);
    }
    /* Then as the state machine uses it: remove half, insert the rest. */
    for (uint32_t i = 0; i < n; i += 2) {
        ida__tagtab_remove(&bulk, i);
    }
    for (uint32_t i = n; i < KEYS_MAX; i++) {
        cr_assert_eq(ida__tagtab_reserve(&bulk), 0);
        ida__tagtab_insert(&bulk, i);
    }
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        uint32_t want = i < n && i % 2 == 0 ? IDA__REF_NONE : i;
        cr_assert_eq(
            ida__tagtab_find(&bulk, (const uint8_t *)keys[i], strlen(keys[i])),
            want, "key %u", i);
    }
    ida__tagtab_close(&bulk);
    ida__tagtab_close(&one);
}

/* Out of memory for the table is NULL and leaves the table empty, for a
 * small table and for one of 2 MiB and more (which ida_malloc_huge() hints
 * for huge pages). */
Test(tagtab, bulk_begin_out_of_memory)
{
    const uint64_t sizes[] = {1000, 1000000};
    for (int i = 0; i < 2; i++) {
        struct ida__tagtab t;
        ida__tagtab_init(&t, key_of, NULL);
        ida_heap_fault_set(0, 1);
        uint64_t *s = ida__tagtab_bulk_begin(&t, sizes[i]);
        ida_heap_fault_set(0, 0);
        cr_assert_null(s);
        cr_assert_eq(t.cap, 0);
        cr_assert_eq(t.slots, NULL);
        s = ida__tagtab_bulk_begin(&t, sizes[i]);
        cr_assert_not_null(s, "then it has the memory");
        cr_assert_geq(t.cap * sizeof(*t.slots), i == 0 ? 8192u : 2u << 20);
        ida__tagtab_close(&t);
    }
}

/* A table of IDA__TAGTAB_REGIONS slots or more, of any size, has that many
 * regions, and a word's region is ida__tagtab_region_full()'s: the
 * decoding of a snapshot still arriving groups words by it before it knows
 * the table's size. Below, fewer regions. */
Test(tagtab, region_full_is_every_large_tables_region)
{
    uint64_t x = 88172645463325252ull; /* xorshift64 */
    for (unsigned bits = 4; bits <= 30; bits++) {
        struct ida__tagtab t = {.cap = 1ull << bits};
        cr_assert_eq(ida__tagtab_regions(&t), bits >= IDA__TAGTAB_REGIONS_LOG2
                                                  ? IDA__TAGTAB_REGIONS
                                                  : 1u << bits);
        for (int i = 0; i < 20000 && bits >= IDA__TAGTAB_REGIONS_LOG2; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            uint64_t w = ida__tagtab_word((uint32_t)x | 1, x);
            cr_assert_eq(ida__tagtab_region(&t, w), ida__tagtab_region_full(w),
                         "cap 2^%u, word %llx", bits, (unsigned long long)w);
        }
    }
}

/* --- growth a step at a time ----------------------------------------- */

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void expect(const struct ida__tagtab *t, uint32_t ref, bool present)
{
    uint32_t got =
        ida__tagtab_find(t, (const uint8_t *)keys[ref], strlen(keys[ref]));
    cr_assert_eq(got, present ? ref : IDA__REF_NONE, "key %u %s: got %u", ref,
                 present ? "held" : "not held", got);
}

/* Random inserts (new keys and keys removed before) and removes, as a pool
 * sees them, against a model of which keys are held: after every step the
 * key it touched, and every 64th step a sample of all keys, are found
 * exactly when held. The table grows from 16 slots to 128 Ki, each time
 * through an old table emptied a step at a time; removes land in both. */
Test(tagtab, a_growing_table_finds_every_key_at_every_step)
{
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        snprintf(keys[i], sizeof(keys[i]), "g-%u", i * 2654435761u);
    }
    bool *held = calloc(KEYS_MAX, sizeof(*held));
    cr_assert(held != NULL);
    struct ida__tagtab t;
    ida__tagtab_init(&t, key_of, NULL);
    uint64_t x = 0x2545f4914f6cdd1dull, steps = 0, count = 0;
    uint32_t fresh = 0;
    unsigned growths = 0, removes_growing = 0, finds_in_old = 0;
    while (fresh < KEYS_MAX) {
        bool was_growing = ida__tagtab_growing(&t);
        uint32_t ref = (uint32_t)(next_rand(&x) % KEYS_MAX);
        if (next_rand(&x) % 10 < 7 || count == 0) {
            /* Insert: a fresh key, or one held before and removed. */
            if (held[ref] || ref >= fresh) {
                ref = fresh++;
            }
            cr_assert_eq(ida__tagtab_reserve(&t), 0);
            ida__tagtab_insert(&t, ref);
            held[ref] = true;
            count++;
        } else {
            while (!held[ref]) {
                ref = (ref + 1) % KEYS_MAX;
            }
            removes_growing += ida__tagtab_growing(&t);
            ida__tagtab_remove(&t, ref);
            held[ref] = false;
            count--;
        }
        growths += !was_growing && ida__tagtab_growing(&t);
        expect(&t, ref, held[ref]);
        /* The keys the next step moves: a step that stopped inside a
         * probe run would leave some of them behind an emptied slot. */
        for (uint64_t i = 0; t.old != NULL && i < 64; i++) {
            uint64_t w =
                t.old[(t.old_from + t.old_moved + i) & (t.old_cap - 1)];
            if (w != 0) {
                expect(&t, (uint32_t)w - 1, true);
            }
        }
        cr_assert_eq(t.used, count);
        if (++steps % 64 == 0) {
            for (int k = 0; k < 32; k++) {
                uint32_t r = (uint32_t)(next_rand(&x) % KEYS_MAX);
                expect(&t, r, held[r]);
                /* A held key the new table does not have: the old does. */
                if (held[r] && t.old != NULL) {
                    struct ida__tagtab only_new = t;
                    only_new.old = NULL;
                    finds_in_old +=
                        ida__tagtab_find(&only_new, (const uint8_t *)keys[r],
                                         strlen(keys[r])) == IDA__REF_NONE;
                }
            }
        }
    }
    cr_assert_geq(growths, 10, "grew %u times a step at a time", growths);
    cr_assert_gt(removes_growing, 100, "%u removes while growing",
                 removes_growing);
    cr_assert_gt(finds_in_old, 100, "%u keys found in the old table",
                 finds_in_old);
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        expect(&t, i, held[i]);
    }
    /* Removing every key leaves an empty table, whatever its state. */
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        if (held[i]) {
            ida__tagtab_remove(&t, i);
        }
    }
    cr_assert_eq(t.used, 0);
    cr_assert(!ida__tagtab_growing(&t), "the old table went with its keys");
    for (uint32_t i = 0; i < KEYS_MAX; i += 7) {
        expect(&t, i, false);
    }
    ida__tagtab_close(&t);
    free(held);
}

/* Keys "@prefix-0", "@prefix-1", ... */
static void name_keys(const char *prefix)
{
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        snprintf(keys[i], sizeof(keys[i]), "%s-%u", prefix, i);
    }
}

/* Fill @t with refs from *@next until it starts growing from 1024 slots
 * or more (a smaller one is emptied in a few steps); returns a few steps
 * after. */
static void fill_until_growing(struct ida__tagtab *t, uint32_t *next)
{
    while (!ida__tagtab_growing(t) || t->old_cap < 1024) {
        cr_assert_eq(ida__tagtab_reserve(t), 0);
        ida__tagtab_insert(t, (*next)++);
    }
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(ida__tagtab_reserve(t), 0);
        ida__tagtab_insert(t, (*next)++);
    }
    cr_assert(ida__tagtab_growing(t), "still moving: a test of the middle");
}

/* A reserve for more keys than the new table has room for, while the old
 * is still being emptied, first finishes that (no third table), then
 * grows again; no key is lost, and the room it promised is there. */
Test(tagtab, a_bulk_reserve_while_growing_finishes_the_growth_first)
{
    name_keys("b");
    struct ida__tagtab t;
    ida__tagtab_init(&t, key_of, NULL);
    uint32_t next = 0;
    fill_until_growing(&t, &next);
    uint64_t cap = t.cap;
    uint32_t more = KEYS_MAX - next;
    cr_assert_gt((t.used + more) * 10, cap * 7, "needs more than this table");
    cr_assert_eq(ida__tagtab_reserve_n(&t, more), 0);
    cr_assert_gt(t.cap, cap);
    for (uint32_t i = 0; i < next; i++) {
        expect(&t, i, true);
    }
    while (next < KEYS_MAX) {
        ida__tagtab_insert(&t, next++); /* asserts the room is there */
    }
    for (uint32_t i = 0; i < KEYS_MAX; i++) {
        expect(&t, i, true);
    }
    ida__tagtab_close(&t);
}

/* No memory for the new table: IDA_ENOMEM, and the table is as it was
 * (its keys found, no growth begun); the next reserve has the memory.
 * Closing a table in the middle of a growth frees both tables (valgrind
 * and AddressSanitizer see any leak). */
Test(tagtab, a_growth_without_memory_changes_nothing)
{
    name_keys("m");
    struct ida__tagtab t;
    ida__tagtab_init(&t, key_of, NULL);
    uint32_t next = 0;
    /* Up to the last insert before the table must grow. */
    while ((t.used + 1) * 10 <= t.cap * 7 || t.cap == 0 || t.cap < 4096) {
        cr_assert_eq(ida__tagtab_reserve(&t), 0);
        ida__tagtab_insert(&t, next++);
        while (ida__tagtab_growing(&t)) { /* finish any growth before */
            cr_assert_eq(ida__tagtab_reserve(&t), 0);
            ida__tagtab_insert(&t, next++);
        }
    }
    uint64_t cap = t.cap;
    ida_heap_fault_set(0, 1);
    int rv = ida__tagtab_reserve(&t);
    ida_heap_fault_set(0, 0);
    cr_assert_eq(rv, IDA_ENOMEM);
    cr_assert_eq(t.cap, cap);
    cr_assert(!ida__tagtab_growing(&t));
    for (uint32_t i = 0; i < next; i++) {
        expect(&t, i, true);
    }
    cr_assert_eq(ida__tagtab_reserve(&t), 0, "then it has the memory");
    cr_assert(ida__tagtab_growing(&t));
    ida__tagtab_insert(&t, next++);
    for (uint32_t i = 0; i < next; i++) {
        expect(&t, i, true);
    }
    ida__tagtab_close(&t);
}
