/* Low-overhead timers against a virtual clock (exact checks) and against
 * clock_gettime (monotonic, never ahead by more than one wind-up period).
 *
 * The virtual clock stands for real time: the test advances it between calls
 * as a program's work would, and the timer reads it only at wind-ups. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "src/pool/timer.h"

/* --- helpers ----------------------------------------------------------------
 */

struct vclock
{
    int64_t now;
    uint64_t reads;
};

static int64_t vclock_read(void *arg)
{
    struct vclock *c = arg;
    c->reads++;
    return c->now;
}

/* Virtual clocks start where a real one would be: far from 0. The first
 * call of a timer returns the clock's absolute value, and a small absolute
 * value would look like very frequent calls. */
#define T0 1000000000000LL

static int64_t llabs64(int64_t v)
{
    return v < 0 ? -v : v;
}

/* Run @calls calls @step_ns apart; return max |sum(returned) - real| seen
 * right after each call, counting from the first call. */
static int64_t max_error(struct ida_ptimer *t,
                         struct vclock *c,
                         int64_t step_ns,
                         int calls,
                         int64_t *sum_io,
                         int64_t start)
{
    int64_t worst = 0;
    for (int i = 0; i < calls; i++) {
        c->now += step_ns;
        *sum_io += ida_ptimer_passed(t);
        int64_t err = llabs64(*sum_io - (c->now - start));
        if (err > worst) {
            worst = err;
        }
    }
    return worst;
}

/* --- periodic timer ----------------------------------------------------------
 */

Test(timer, first_call_returns_the_clock)
{
    struct vclock c = {T0 + 123456789, 0};
    struct ida_ptimer t;
    ida_ptimer_init(&t, vclock_read, &c);
    cr_assert_eq(ida_ptimer_passed(&t), T0 + 123456789);
    c.now += 5000000; /* 5 ms: slower than a wind-up period, exact */
    cr_assert_eq(ida_ptimer_passed(&t), 5000000);
    ida_ptimer_reset(&t);
    cr_assert_eq(ida_ptimer_passed(&t), c.now, "reset starts over");
}

Test(timer, rare_calls_are_exact_and_read_the_clock_each_time)
{
    struct vclock c = {T0, 0};
    struct ida_ptimer t;
    ida_ptimer_init(&t, vclock_read, &c);
    (void)ida_ptimer_passed(&t);
    for (int i = 0; i < 1000; i++) {
        int64_t step = IDA_PTIMER_MIN_CLOCK_PERIOD_NS + (i % 7) * 1000;
        c.now += step;
        cr_assert_eq(ida_ptimer_passed(&t), step);
    }
    cr_assert_eq(c.reads, 1001);
}

Test(timer, frequent_calls_read_the_clock_rarely_and_stay_close)
{
    struct vclock c = {T0, 0};
    struct ida_ptimer t;
    ida_ptimer_init(&t, vclock_read, &c);
    int64_t start = ida_ptimer_passed(&t);
    int64_t sum = 0;
    /* 100 ns between calls: a wind-up every 200 calls would be wanted, so the
     * cap applies: one clock read per IDA_PTIMER_MAX_WIND_UP_STEPS calls. */
    int64_t err = max_error(&t, &c, 100, 100000, &sum, start);
    cr_assert_lt(c.reads, 100000 / IDA_PTIMER_MAX_WIND_UP_STEPS + 20,
                 "clock reads: %lu", (unsigned long)c.reads);
    /* Stated bound: within one wind-up period of real time. */
    cr_assert_leq(err, IDA_PTIMER_MIN_CLOCK_PERIOD_NS, "error %ld", (long)err);
}

Test(timer, jittery_calls_stay_within_bound)
{
    struct vclock c = {T0, 0};
    struct ida_ptimer t;
    ida_ptimer_init(&t, vclock_read, &c);
    int64_t start = ida_ptimer_passed(&t);
    int64_t sum = 0, worst = 0;
    unsigned seed = 42;
    for (int i = 0; i < 200000; i++) {
        /* Steps between 10 ns and 1 us. */
        c.now += 10 + rand_r(&seed) % 990;
        sum += ida_ptimer_passed(&t);
        int64_t err = llabs64(sum - (c.now - start));
        worst = err > worst ? err : worst;
    }
    cr_assert_leq(worst, 2 * IDA_PTIMER_MIN_CLOCK_PERIOD_NS, "error %ld",
                  (long)worst);
}

Test(timer, lag_after_a_pause_is_repaid_within_max_steps)
{
    struct vclock c = {T0, 0};
    struct ida_ptimer t;
    ida_ptimer_init(&t, vclock_read, &c);
    int64_t start = ida_ptimer_passed(&t);
    int64_t sum = 0;
    (void)max_error(&t, &c, 50, 10000, &sum, start);
    /* The thread is preempted for 10 ms between two calls. */
    c.now += 10000000;
    int64_t lag = (c.now - start) - sum;
    cr_assert_gt(lag, 9000000, "the timer cannot know before a wind-up");
    /* Each wind-up repays all but about 1/(counter + 1) of the lag, so after
     * four wind-up periods it is back within the bound. */
    (void)max_error(&t, &c, 50, 4 * IDA_PTIMER_MAX_WIND_UP_STEPS, &sum, start);
    int64_t after = llabs64((c.now - start) - sum);
    cr_assert_leq(after, 2 * IDA_PTIMER_MIN_CLOCK_PERIOD_NS, "error %ld",
                  (long)after);
}

Test(timer, every_value_is_at_least_the_minimum)
{
    struct vclock c = {T0, 0};
    struct ida_ptimer t;
    ida_ptimer_init(&t, vclock_read, &c);
    (void)ida_ptimer_passed(&t);
    for (int i = 0; i < 10000; i++) {
        /* The clock stands still: a coarse clock. */
        cr_assert_geq(ida_ptimer_passed(&t), IDA_PTIMER_MIN_MEASURED_NS);
    }
}

/* --- start-finish, waiting, periodic clock -----------------------------------
 */

Test(timer, start_finish_measures_blocks)
{
    struct vclock c = {T0, 0};
    struct ida_sftimer t;
    ida_sftimer_init(&t, vclock_read, &c);
    int64_t total = 0;
    for (int i = 0; i < 100; i++) {
        ida_sftimer_start(&t);
        int64_t d = 100000 + i * 1000; /* blocks longer than a period */
        c.now += d;
        cr_assert_eq(ida_sftimer_finish(&t), d, "block %d", i);
        total += d;
        c.now += 50000; /* between blocks */
    }
    cr_assert_eq(ida_sftimer_count(&t), 100);
    cr_assert_eq(ida_sftimer_sum(&t), total);
    ida_sftimer_reset(&t);
    cr_assert_eq(ida_sftimer_count(&t), 0);
    cr_assert_eq(ida_sftimer_sum(&t), IDA_PTIMER_MIN_MEASURED_NS);
}

Test(timer, waiting_timer_fires_after_its_period)
{
    struct vclock c = {T0, 0};
    struct ida_wtimer w;
    ida_wtimer_init(&w, 1000000, vclock_read, &c);
    c.now += 400000;
    cr_assert_not(ida_wtimer_check(&w));
    c.now += 400000;
    cr_assert_not(ida_wtimer_check(&w));
    c.now += 400000;
    cr_assert(ida_wtimer_check(&w), "1.2 ms > 1 ms");
    ida_wtimer_reset(&w);
    c.now += 100000;
    cr_assert_not(ida_wtimer_check(&w), "reset starts a new period");
}

Test(timer, periodic_clock_is_strictly_increasing_and_close)
{
    struct vclock c = {T0, 0};
    struct ida_pclock pc;
    ida_pclock_init(&pc, vclock_read, &c);
    int64_t prev = ida_pclock_now(&pc);
    cr_assert_eq(prev, T0);
    for (int i = 0; i < 100000; i++) {
        c.now += i % 3 == 0 ? 0 : 200;
        int64_t now = ida_pclock_now(&pc);
        cr_assert_gt(now, prev);
        prev = now;
    }
    cr_assert_leq(llabs64(prev - c.now), 2 * IDA_PTIMER_MIN_CLOCK_PERIOD_NS);
}

/* Against the real clock: strictly increasing, and never ahead of
 * clock_gettime by more than the stated bound. (Lagging is allowed: the
 * process may be preempted at any point of this loop.) */
Test(timer, periodic_clock_against_clock_gettime)
{
    struct ida_pclock pc;
    ida_pclock_init(&pc, NULL, NULL);
    int64_t prev = ida_pclock_now(&pc);
    for (int i = 0; i < 1000000; i++) {
        int64_t now = ida_pclock_now(&pc);
        int64_t real = ida_clock_monotonic_ns(NULL);
        cr_assert_gt(now, prev);
        cr_assert_leq(now - real, 2 * IDA_PTIMER_MIN_CLOCK_PERIOD_NS,
                      "ahead by %ld ns", (long)(now - real));
        prev = now;
    }
}
