#include "src/pool/timer.h"

#include <time.h>

#include "base/assert.h"

int64_t ida_clock_monotonic_ns(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ida_clock_realtime_ns(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ida_ptimer_init(struct ida_ptimer *t, ida_clock_fn clock, void *arg)
{
    IDA_ASSERT(t != NULL);
    t->clock = clock != NULL ? clock : ida_clock_monotonic_ns;
    t->clock_arg = arg;
    ida_ptimer_reset(t);
}

void ida_ptimer_reset(struct ida_ptimer *t)
{
    t->wind_up_counter = 1;
    t->wind_up_balance = 0;
    t->last_wind_up_counter = 1;
    t->last_system_time = 0;
    t->approx_time_step = 0;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

/* Read the clock and re-plan the next period (a wind-up). */
static void wind_up(struct ida_ptimer *t)
{
    int64_t now = t->clock(t->clock_arg);
    int64_t passed = now - t->last_system_time;
    int64_t next_counter;
    if (passed <= 0) {
        /* Clock did not move (coarse clock): call the clock less often. */
        next_counter = IDA_PTIMER_MAX_WIND_UP_STEPS;
    } else {
        /* period / passed * counter, without overflow (passed > 0). */
        int64_t scaled =
            (int64_t)((double)IDA_PTIMER_MIN_CLOCK_PERIOD_NS / (double)passed *
                      (double)t->last_wind_up_counter);
        next_counter = max64(1, min64(scaled, IDA_PTIMER_MAX_WIND_UP_STEPS));
    }
    t->wind_up_balance += passed;
    /* Solves step = passed/last + (balance - step)/next: the next @next
     * calls repay the balance. */
    t->approx_time_step =
        (passed / t->last_wind_up_counter + t->wind_up_balance / next_counter) *
        next_counter / (next_counter + 1);
    t->last_wind_up_counter = next_counter;
    t->wind_up_counter = next_counter;
    t->last_system_time = now;
}

int64_t ida_ptimer_passed(struct ida_ptimer *t)
{
    t->wind_up_counter--;
    if (t->wind_up_counter <= 0) {
        wind_up(t);
    }
    int64_t result = max64(IDA_PTIMER_MIN_MEASURED_NS, t->approx_time_step);
    t->wind_up_balance -= result;
    IDA_ASSERT(result >= IDA_PTIMER_MIN_MEASURED_NS);
    return result;
}

/* --- start-finish timer --------------------------------------------------- */

void ida_sftimer_init(struct ida_sftimer *t, ida_clock_fn clock, void *arg)
{
    ida_ptimer_init(&t->start_timer, clock, arg);
    ida_ptimer_init(&t->finish_timer, clock, arg);
    ida_sftimer_reset(t);
}

void ida_sftimer_reset(struct ida_sftimer *t)
{
    ida_ptimer_reset(&t->start_timer);
    ida_ptimer_reset(&t->finish_timer);
    t->count = 0;
    t->last_duration = 0;
    t->duration_sum = 0;
}

void ida_sftimer_start(struct ida_sftimer *t)
{
    /* last_duration telescopes to finish_n - start_n: both timers return
     * their clock's absolute value on their first call. */
    t->last_duration -= ida_ptimer_passed(&t->start_timer);
}

int64_t ida_sftimer_finish(struct ida_sftimer *t)
{
    t->last_duration += ida_ptimer_passed(&t->finish_timer);
    t->duration_sum += t->last_duration;
    t->count++;
    return t->last_duration;
}

uint64_t ida_sftimer_count(const struct ida_sftimer *t)
{
    return t->count;
}

int64_t ida_sftimer_sum(const struct ida_sftimer *t)
{
    return max64(IDA_PTIMER_MIN_MEASURED_NS, t->duration_sum);
}

/* --- waiting timer -------------------------------------------------------- */

void ida_wtimer_init(struct ida_wtimer *t,
                     int64_t period_ns,
                     ida_clock_fn clock,
                     void *arg)
{
    IDA_ASSERT(period_ns >= 0);
    t->period_ns = period_ns;
    ida_ptimer_init(&t->timer, clock, arg);
    ida_wtimer_reset(t);
}

void ida_wtimer_reset(struct ida_wtimer *t)
{
    /* Fix the point from which time is counted. */
    (void)ida_ptimer_passed(&t->timer);
    t->elapsed_ns = 0;
}

bool ida_wtimer_check(struct ida_wtimer *t)
{
    t->elapsed_ns += ida_ptimer_passed(&t->timer);
    return t->elapsed_ns > t->period_ns;
}

/* --- periodic clock ------------------------------------------------------- */

void ida_pclock_init(struct ida_pclock *c, ida_clock_fn clock, void *arg)
{
    ida_ptimer_init(&c->timer, clock, arg);
    c->now_ns = 0;
}

int64_t ida_pclock_now(struct ida_pclock *c)
{
    c->now_ns += ida_ptimer_passed(&c->timer);
    return c->now_ns;
}
