/* storage/: the boot record (every open counts one start durably, with a
 * fresh nonce) and the untrusted mark (raft/admission.h, rule A4): a copy
 * of the directory put back starts with a lower count than the directory
 * had reached, and a marked directory is refused until removed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "storage/record.h"
#include "storage/storage.h"
#include "tests/storage/helpers.h"

#include "tests/storage/fixture.h"

TestSuite(boot, .init = setup, .fini = teardown);

#define COUNT(b) ((b) >> 32)
#define NONCE(b) ((b)&0xffffffffu)

Test(boot, every_open_counts_one_start_with_a_fresh_nonce)
{
    open_ok();
    uint64_t b1 = ida_storage_boot(&st);
    cr_assert_eq(COUNT(b1), 1);
    cr_assert_neq(NONCE(b1), 0);
    append(1, 3, 1);
    reopen();
    uint64_t b2 = ida_storage_boot(&st);
    cr_assert_eq(COUNT(b2), 2);
    cr_assert_neq(NONCE(b2), 0);
    reopen();
    cr_assert_eq(COUNT(ida_storage_boot(&st)), 3);
    expect_entries(1, 3, 1); /* the count's commit touched nothing else */
}

Test(boot, a_copy_put_back_starts_below_the_count_reached)
{
    open_ok();
    append(1, 2, 1);
    close_st(); /* count 1 on disk */
    char copy[400], cmd[1200];
    snprintf(copy, sizeof(copy), "%s/copy", tmp);
    snprintf(cmd, sizeof(cmd), "cp -a '%s' '%s'", dir, copy);
    cr_assert_eq(system(cmd), 0);
    open_ok(); /* 2 */
    reopen();  /* 3 */
    uint64_t reached = ida_storage_boot(&st);
    close_st();
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mv '%s' '%s'", dir, copy, dir);
    cr_assert_eq(system(cmd), 0);
    open_ok();
    uint64_t back = ida_storage_boot(&st);
    cr_assert_eq(COUNT(back), 2, "the copy counted one start");
    cr_assert_lt(COUNT(back), COUNT(reached));
    cr_assert_neq(back, reached);
}

Test(boot, an_untrusted_directory_is_refused_until_removed)
{
    open_ok();
    append(1, 2, 1);
    cr_assert_eq(ida_storage_mark_untrusted(
                     &st, "its state went back: node 2 heard a later start"),
                 0);
    close_st();
    int rv = ida_storage_open(&st, dir, &opts);
    cr_assert_eq(rv, IDA_ELOSTSTATE, "%s", idalloc_errname(rv));
    expect_msg("marked untrusted");
    expect_msg("node 2 heard a later start");
    expect_msg("remove the directory to rejoin as a new incarnation");
    /* Refused again: the refused open wrote nothing, not even a count. */
    rv = ida_storage_open(&st, dir, &opts);
    cr_assert_eq(rv, IDA_ELOSTSTATE);
    /* Removed, the directory starts afresh as a new incarnation. */
    ida_test_rmrf(dir);
    open_ok();
    cr_assert_eq(COUNT(ida_storage_boot(&st)), 1);
}

Test(boot, a_long_reason_is_cut_not_refused)
{
    open_ok();
    char why[1000];
    memset(why, 'x', sizeof(why) - 1);
    why[sizeof(why) - 1] = '\0';
    cr_assert_eq(ida_storage_mark_untrusted(&st, why), 0);
    close_st();
    cr_assert_eq(ida_storage_open(&st, dir, &opts), IDA_ELOSTSTATE);
}

Test(boot, boot_records_round_trip_and_refuse_damage)
{
    uint8_t r[IDA__REC_BOOT_BYTES];
    ida__rec_boot_encode(r, 41);
    uint64_t n = 0;
    cr_assert_eq(ida__rec_boot_decode(r, sizeof(r), &n), 0);
    cr_assert_eq(n, 41);
    r[6] ^= 1;
    cr_assert_eq(ida__rec_boot_decode(r, sizeof(r), &n), IDA_ECORRUPT);
    cr_assert_eq(ida__rec_boot_decode(r, sizeof(r) - 1, &n), IDA_ECORRUPT);
    uint8_t u[IDA__REC_UNTRUSTED_FIXED + 16];
    size_t len = ida__rec_untrusted_encode(u, "went back", 9);
    cr_assert_eq(len, IDA__REC_UNTRUSTED_FIXED + 9);
    const char *why;
    size_t wl;
    cr_assert_eq(ida__rec_untrusted_decode(u, len, &why, &wl), 0);
    cr_assert_eq(wl, 9);
    cr_assert_eq(memcmp(why, "went back", 9), 0);
    cr_assert_eq(ida__rec_untrusted_decode(u, len - 1, &why, &wl),
                 IDA_ECORRUPT);
}
