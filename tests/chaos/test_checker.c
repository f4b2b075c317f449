/* The chaos checker on hand-made histories: each kind of broken promise is
 * caught, and the legitimate look-alikes (an id reused after a free, an
 * unknown alloc) are not. A checker that never fires proves nothing. */
#include <criterion/criterion.h>
#include <string.h>

#include "tests/chaos/checker.h"

static struct history h;
static struct check_report rep;

static void setup(void)
{
    history_init(&h, 100);
}

static void teardown(void)
{
    history_free(&h);
}

static void add(enum hop_kind k,
                enum hop_out out,
                const char *tag,
                uint64_t id,
                uint64_t inv,
                uint64_t done)
{
    struct hop o = {.kind = k,
                    .out = out,
                    .id = id,
                    .inv_ms = inv,
                    .done_ms = done,
                    .seq = h.n + 1};
    snprintf(o.tag, sizeof(o.tag), "%s", tag);
    history_add(&h, &o);
}

static void add_block(uint64_t first, uint64_t count)
{
    struct hop o = {.kind = H_RESERVE,
                    .out = O_OK,
                    .first = first,
                    .count = count,
                    .seq = h.n + 1};
    history_add(&h, &o);
}

static void add_prefix(const char *tag, const char *bytes, size_t n)
{
    struct hop o = {.kind = H_PREFIX, .out = O_OK, .plen = n, .seq = h.n + 1};
    snprintf(o.tag, sizeof(o.tag), "%s", tag);
    memcpy(o.prefix, bytes, n);
    history_add(&h, &o);
}

static void expect(size_t violations, const char *needle)
{
    size_t v = history_check(&h, &rep);
    cr_assert_eq(v, violations, "violations: %zu, first: %s", v,
                 v > 0 ? rep.examples[0] : "-");
    if (needle != NULL) {
        cr_assert(strstr(rep.examples[0], needle) != NULL, "%s",
                  rep.examples[0]);
    }
}

Test(checker, clean_history_passes, .init = setup, .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 0, 1, 2);
    add(H_ALLOC, O_OK, "b", 1, 3, 4);
    add(H_FREE, O_OK, "a", 0, 5, 6);
    add(H_ALLOC, O_OK, "c", 0, 7, 8);       /* reuse after the free: fine */
    add(H_ALLOC, O_UNKNOWN, "d", 0, 9, 10); /* unknown: no claim */
    add_block(1, 10);
    add_block(11, 5);
    add(H_NEXT, O_OK, "", 16, 1, 1);
    add_prefix("p", "\x01\x05", 2);
    add_prefix("q", "\x01\x06", 2);
    add_prefix("r", "\x02\x01\x00", 3);
    add_prefix("p", "\x01\x05", 2); /* the same tag again: same prefix */
    history_add_final(&h, "b", 1);
    history_add_final(&h, "c", 0);
    expect(0, NULL);
}

Test(checker, duplicate_id_is_caught, .init = setup, .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 5, 1, 10);
    add(H_ALLOC, O_OK, "b", 5, 11, 20);
    expect(1, "held by a and b at once");
}

Test(checker, reuse_before_the_free_is_caught, .init = setup, .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 5, 1, 10);
    add(H_ALLOC, O_OK, "b", 5, 11, 20);
    add(H_FREE, O_OK, "a", 5, 25, 26); /* freed only after b got it */
    expect(1, "at once");
}

Test(checker, lost_alloc_is_caught, .init = setup, .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 3, 1, 2);
    add(H_ALLOC, O_OK, "b", 4, 1, 2);
    history_add_final(&h, "b", 4);
    expect(1, "a -> 3 is lost");
}

Test(checker,
     moved_and_phantom_holdings_are_caught,
     .init = setup,
     .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 3, 1, 2);
    history_add_final(&h, "a", 4);
    history_add_final(&h, "ghost", 9);
    expect(3, NULL); /* a moved; 4 and ghost's 9 came from no alloc */
}

/* An alloc whose outcome was unknown, then learnt (@r). */
static void add_resolved(const char *tag, uint64_t id, enum hop_resolved r)
{
    add(H_ALLOC, O_UNKNOWN, tag, id, 1, 2);
    h.v[h.n - 1].resolved = r;
}

Test(checker,
     final_holdings_of_unknown_allocs_are_checked,
     .init = setup,
     .fini = teardown)
{
    add_resolved("u", 0, R_NONE);      /* still unknown: may hold anything */
    add_resolved("n", 0, R_NO_EFFECT); /* learnt: it did nothing */
    add_resolved("e", 7, R_EFFECT);    /* learnt: it returned 7 */
    history_add_final(&h, "u", 3);
    history_add_final(&h, "n", 4);
    history_add_final(&h, "e", 8);
    expect(2, NULL); /* n's 4 and e's 8 came from no alloc; u's 3 is fine */
}

Test(checker, final_id_held_twice_is_caught, .init = setup, .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 5, 1, 2);
    add_resolved("b", 0, R_NONE);
    history_add_final(&h, "a", 5);
    history_add_final(&h, "b", 5); /* b's alloc is unknown: only the id */
    expect(1, "final state: id 5 held twice");
}

Test(checker, id_outside_the_pool_is_caught, .init = setup, .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 100, 1, 2);
    expect(1, "outside");
}

Test(checker, overlapping_blocks_are_caught, .init = setup, .fini = teardown)
{
    add_block(10, 10);
    add_block(15, 10);
    expect(1, "overlaps");
}

Test(checker, next_id_inside_a_block_is_caught, .init = setup, .fini = teardown)
{
    add_block(10, 10);
    add(H_NEXT, O_OK, "", 12, 1, 1);
    expect(1, "overlaps");
}

Test(checker, repeated_next_id_is_caught, .init = setup, .fini = teardown)
{
    add(H_NEXT, O_OK, "", 7, 1, 1);
    add(H_NEXT, O_OK, "", 7, 2, 2);
    expect(1, "overlaps");
}

Test(checker, prefix_of_another_is_caught, .init = setup, .fini = teardown)
{
    add_prefix("p", "\x01\x42", 2);
    add_prefix("q", "\x01\x42\x07", 3);
    expect(1, "starts");
}

Test(checker, repeated_prefix_is_caught, .init = setup, .fini = teardown)
{
    add_prefix("p", "\x01\x42", 2);
    add_prefix("q", "\x01\x42", 2);
    expect(1, "equals");
}

Test(checker, tag_with_two_prefixes_is_caught, .init = setup, .fini = teardown)
{
    add_prefix("p", "\x01\x42", 2);
    add_prefix("z", "\x01\x50", 2);
    add_prefix("p", "\x01\x43", 2);
    expect(1, "two different prefixes");
}

Test(checker,
     replay_with_another_answer_is_caught,
     .init = setup,
     .fini = teardown)
{
    struct hop o = {.kind = H_RESERVE,
                    .out = O_OK,
                    .first = 1,
                    .count = 2,
                    .replay = P_DIFFERENT,
                    .seq = 9};
    history_add(&h, &o);
    expect(1, "first answer");
}

Test(checker, file_round_trip, .init = setup, .fini = teardown)
{
    add(H_ALLOC, O_OK, "a", 5, 1, 10);
    add(H_ALLOC, O_OK, "b", 5, 11, 20);
    add_prefix("p", "\x01\x42", 2);
    add_block(3, 4);
    history_add_final(&h, "a", 5);
    FILE *f = tmpfile();
    cr_assert_eq(history_write(&h, f), 0);
    rewind(f);
    struct history back;
    history_init(&back, 0);
    cr_assert_eq(history_read(&back, f), 0);
    fclose(f);
    cr_assert_eq(back.n, h.n);
    cr_assert_eq(back.pool_size, 100);
    cr_assert_eq(back.n_final, 1);
    cr_assert_eq(back.v[2].plen, 2);
    cr_assert_eq(memcmp(back.v[2].prefix, "\x01\x42", 2), 0);
    size_t v = history_check(&back, &rep);
    cr_assert_eq(v, 2, "the duplicate, and b missing at the end: %zu", v);
    history_free(&back);
}
