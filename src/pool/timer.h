/* Low-overhead timers.
 *
 * DESIGN
 *
 * ida_ptimer_passed() answers "how much time passed since my last call"
 * without reading the clock on every call. It reads the clock once every
 * `counter` calls (a wind-up) and, in between, returns a predicted step: the
 * average interval between calls over the last wind-up period, corrected so
 * that the accumulated error (`balance` = real time - sum of returned times)
 * is paid back over the next period. The number of calls between wind-ups
 * adapts so that wind-ups are about IDA_PTIMER_MIN_CLOCK_PERIOD_NS apart, and
 * is at most IDA_PTIMER_MAX_WIND_UP_STEPS. When calls are further apart than
 * that period, every call winds up and the answer is exact.
 *
 * Error bounds (tests/pool/test_timer.c checks them with an injected clock):
 *   - every returned value is >= IDA_PTIMER_MIN_MEASURED_NS, so a clock built
 *     on it (ida_pclock) is strictly increasing;
 *   - right after each wind-up, sum(returned) = real elapsed - balance, where
 *     the balance is the error not yet paid back;
 *   - the sum of returned times runs ahead of real time by at most about one
 *     wind-up period (IDA_PTIMER_MIN_CLOCK_PERIOD_NS) when the call rate
 *     suddenly rises, and lags behind it when the call rate drops or the
 *     thread is preempted: the timer cannot know before its next wind-up (at
 *     most IDA_PTIMER_MAX_WIND_UP_STEPS calls later), and each wind-up then
 *     repays all but about 1/(counter + 1) of the lag, so a few wind-ups
 *     later it is back within one period (test: four periods after a 10 ms
 *     pause, within 2 * IDA_PTIMER_MIN_CLOCK_PERIOD_NS).
 *
 * As in the seed, each timer must be called from one call site (the
 * prediction assumes similar intervals between calls) and is not thread-safe:
 * one owner at a time (in the pool: the processor that owns it).
 *
 * Times are int64 nanoseconds of CLOCK_MONOTONIC, except that a timer may be
 * given another clock (tests inject a virtual one; the error top keeper uses
 * CLOCK_REALTIME for "last seen" stamps).
 */
#ifndef IDA_POOL_TIMER_H
#define IDA_POOL_TIMER_H

#include <stdbool.h>
#include <stdint.h>

#define IDA_PTIMER_MIN_CLOCK_PERIOD_NS 20000 /* wind up about every 20 us */
#define IDA_PTIMER_MAX_WIND_UP_STEPS   64
#define IDA_PTIMER_MIN_MEASURED_NS     1

/* A clock: returns nanoseconds; @arg is the clock's own state. */
typedef int64_t (*ida_clock_fn)(void *arg);

/* CLOCK_MONOTONIC and CLOCK_REALTIME in nanoseconds (one clock_gettime). */
int64_t ida_clock_monotonic_ns(void *arg);
int64_t ida_clock_realtime_ns(void *arg);

struct ida_ptimer
{
    ida_clock_fn clock;
    void *clock_arg;
    int64_t wind_up_counter;
    int64_t wind_up_balance;
    int64_t last_wind_up_counter;
    int64_t last_system_time;
    int64_t approx_time_step;
};

/* Initialise @t on @clock (NULL: CLOCK_MONOTONIC). Cannot fail. */
void ida_ptimer_init(struct ida_ptimer *t, ida_clock_fn clock, void *arg);
/* Back to the state right after init (the next call returns the clock's
 * absolute value, as in the seed). */
void ida_ptimer_reset(struct ida_ptimer *t);
/* Time passed since the previous call (see DESIGN); the first call after
 * init/reset returns the clock's current absolute value. */
int64_t ida_ptimer_passed(struct ida_ptimer *t);

/* Start-finish timer: durations of a code block. */
struct ida_sftimer
{
    struct ida_ptimer start_timer;
    struct ida_ptimer finish_timer;
    uint64_t count;
    int64_t last_duration;
    int64_t duration_sum;
};

void ida_sftimer_init(struct ida_sftimer *t, ida_clock_fn clock, void *arg);
void ida_sftimer_reset(struct ida_sftimer *t);
void ida_sftimer_start(struct ida_sftimer *t);
/* Ends the block begun by the last start; returns its (approximate)
 * duration, which may be <= 0 for a very short block. */
int64_t ida_sftimer_finish(struct ida_sftimer *t);
uint64_t ida_sftimer_count(const struct ida_sftimer *t);
/* Sum of durations, at least IDA_PTIMER_MIN_MEASURED_NS. */
int64_t ida_sftimer_sum(const struct ida_sftimer *t);

/* Waiting timer: "has @period_ns passed since the last reset?" */
struct ida_wtimer
{
    int64_t period_ns;
    int64_t elapsed_ns;
    struct ida_ptimer timer;
};

void ida_wtimer_init(struct ida_wtimer *t,
                     int64_t period_ns,
                     ida_clock_fn clock,
                     void *arg);
void ida_wtimer_reset(struct ida_wtimer *t);
bool ida_wtimer_check(struct ida_wtimer *t);

/* Periodic clock: an approximate, strictly increasing "now". */
struct ida_pclock
{
    int64_t now_ns;
    struct ida_ptimer timer;
};

void ida_pclock_init(struct ida_pclock *c, ida_clock_fn clock, void *arg);
int64_t ida_pclock_now(struct ida_pclock *c);

#endif /* IDA_POOL_TIMER_H */
