/* ida__raft_ticks_due() (src/node/raft_proc.c): a raft processor that ran a
 * little late catches its ticks up (heartbeats keep their pace); one that
 * ran late by half an election timeout or more runs one tick and forgets
 * the rest, so it reads its inbox before its timers judge anything. */
#include <criterion/criterion.h>

#include "src/node/raft_proc.h"

#define TICK 10
#define DROP 150

Test(ticks, the_first_look_starts_the_clock)
{
    uint64_t last = 0, late = 7;
    cr_assert_eq(ida__raft_ticks_due(&last, 5000, TICK, DROP, &late), 0);
    cr_assert_eq(last, 5000);
    cr_assert_eq(late, 0);
}

Test(ticks, on_time_and_a_little_late_are_caught_up)
{
    uint64_t last = 5000, late;
    cr_assert_eq(ida__raft_ticks_due(&last, 5009, TICK, DROP, &late), 0);
    cr_assert_eq(last, 5000);
    cr_assert_eq(ida__raft_ticks_due(&last, 5010, TICK, DROP, &late), 1);
    cr_assert_eq(last, 5010);
    /* 105 ms on: 10 ticks, the remainder kept for the next look. */
    cr_assert_eq(ida__raft_ticks_due(&last, 5115, TICK, DROP, &late), 10);
    cr_assert_eq(last, 5110);
    cr_assert_eq(late, 0);
    /* Pings 60 ms apart (a loaded machine): every tick still runs, so a
     * leader's heartbeats (every 5 ticks) keep their pace. */
    uint64_t ticks = 0;
    for (uint64_t now = 5170; now <= 5170 + 60 * 100; now += 60) {
        ticks += ida__raft_ticks_due(&last, now, TICK, DROP, &late);
        cr_assert_eq(late, 0);
    }
    cr_assert_eq(ticks, 6 * 101);
}

Test(ticks, late_by_half_an_election_timeout_runs_one)
{
    uint64_t last = 5000, late;
    /* The first tick due at 5010 runs at 5160: 150 ms late. */
    cr_assert_eq(ida__raft_ticks_due(&last, 5160, TICK, DROP, &late), 1);
    cr_assert_eq(late, 150);
    cr_assert_eq(last, 5160);
    /* Just under: caught up. */
    cr_assert_eq(ida__raft_ticks_due(&last, 5160 + 159, TICK, DROP, &late), 15);
    cr_assert_eq(late, 0);
    /* A paused process: 2 s. */
    last = 5000;
    cr_assert_eq(ida__raft_ticks_due(&last, 7000, TICK, DROP, &late), 1);
    cr_assert_eq(late, 1990);
    cr_assert_eq(last, 7000);
    cr_assert_eq(ida__raft_ticks_due(&last, 7010, TICK, DROP, &late), 1);
    cr_assert_eq(late, 0);
}
