/* Free-list multi-level allocator: alignment, no overlap (content survives),
 * split and merge (everything freed merges back to whole segments), big
 * requests, out of memory. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ida/heap.h"
#include "src/pool/flalloc.h"

static struct ida_flalloc fl;

static void setup(void)
{
    cr_assert_eq(ida_flalloc_init(&fl), 0);
}

static void teardown(void)
{
    ida_flalloc_close(&fl);
}

TestSuite(flalloc, .init = setup, .fini = teardown);

Test(flalloc, zero_size_is_null)
{
    cr_assert_null(ida_flalloc_alloc(&fl, 0));
    ida_flalloc_free(&fl, NULL);
}

Test(flalloc, random_mix_keeps_contents_and_merges_back)
{
    enum { N = 2000 };
    static unsigned char *p[N];
    static size_t sz[N];
    unsigned seed = 1;
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < N; i++) {
            if (p[i] != NULL && rand_r(&seed) % 2) {
                for (size_t k = 0; k < sz[i]; k++) {
                    cr_assert_eq(p[i][k], (unsigned char)(i + sz[i]),
                                 "block %d overwritten", i);
                }
                ida_flalloc_free(&fl, p[i]);
                p[i] = NULL;
            }
            if (p[i] == NULL) {
                sz[i] = 1 + (size_t)(rand_r(&seed) % 3000);
                p[i] = ida_flalloc_alloc(&fl, sz[i]);
                cr_assert_not_null(p[i]);
                cr_assert_eq((uintptr_t)p[i] % 16, 0, "aligned");
                memset(p[i], (unsigned char)(i + sz[i]), sz[i]);
            }
        }
    }
    for (int i = 0; i < N; i++) {
        ida_flalloc_free(&fl, p[i]);
    }
    size_t whole = 0;
    size_t n = ida_flalloc_free_blocks(&fl, &whole);
    cr_assert_gt(fl.segment_count, 1, "the mix needed several segments");
    cr_assert_eq(n, fl.segment_count, "one free block per segment");
    cr_assert_eq(whole, n, "every segment merged back into one block");
}

Test(flalloc, big_request_gets_its_own_segment)
{
    void *big = ida_flalloc_alloc(&fl, 3u << 20);
    cr_assert_not_null(big);
    memset(big, 7, 3u << 20);
    void *small = ida_flalloc_alloc(&fl, 100);
    cr_assert_not_null(small);
    cr_assert_eq(fl.segment_count, 2);
    size_t whole = 9;
    cr_assert_eq(ida_flalloc_free_blocks(&fl, &whole), 1, "rest of small's");
    cr_assert_eq(whole, 0);
    ida_flalloc_free(&fl, big);
    ida_flalloc_free(&fl, small);
    cr_assert_eq(ida_flalloc_free_blocks(&fl, &whole), 2);
    cr_assert_eq(whole, 2);
}

Test(flalloc, out_of_memory_returns_null_and_changes_nothing)
{
    ida_heap_fault_set(0, 1);
    cr_assert_null(ida_flalloc_alloc(&fl, 64));
    cr_assert_eq(fl.segment_count, 0);
    ida_heap_fault_set(0, 0);
    void *p = ida_flalloc_alloc(&fl, 64);
    cr_assert_not_null(p);
    ida_flalloc_free(&fl, p);
}
