/*
 * reset_wake_test.c: a reset to a sooner deadline that lands while the
 * worker is about to sleep (it has taken the timeout into the wheel and
 * planned its sleep by the old deadline, and has not yet told producers
 * how long it will sleep) still wakes it for the new deadline.
 *
 * This program defines clock_gettime itself, so the core's clock reads
 * reach it: the worker's first read once the timeout is on the wheel (the
 * one that begins its sleep) waits until the main thread has reset the
 * timeout, which holds that moment open as a preempted worker would.
 *
 * Usage: reset_wake_test.  Exits 0 when the reset timeout is delivered
 * near its new deadline, not at its old one.
 */
#define _GNU_SOURCE
#include "hwt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define OLD_DELAY_NS INT64_C(900000000) /* under a second: no cancel wakes it */
#define NEW_DELAY_NS INT64_C(2000000)
#define LATE_LIMIT_NS INT64_C(300000000) /* generous, and well before the old one */

static pthread_t main_thread;
/* not HWT_INIT until the worker has taken it into the wheel */
static hwt_timeout watched = {.state = HWT_CANCELLED};
static _Atomic int stage; /* 0 armed, 1 worker held, 2 reset done, 3 disarmed */

static int real_clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*fn)(clockid_t, struct timespec *);
    if (!fn)
        fn = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (!fn) {
        fprintf(stderr, "reset_wake_test: no clock_gettime in the C library\n");
        abort();
    }
    return fn(id, ts);
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    if (!pthread_equal(pthread_self(), main_thread) && atomic_load(&stage) == 0 &&
        atomic_load(&watched.state) == HWT_INIT) {
        atomic_store(&stage, 1);
        while (atomic_load(&stage) != 2)
            usleep(100);
        atomic_store(&stage, 3);
    }
    return real_clock_gettime(id, ts);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    real_clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(void)
{
    main_thread = pthread_self();
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = 4096};
    hwt_timer *t = hwt_timer_new(&cfg);
    if (!t || hwt_timer_start(t) != 0) {
        fprintf(stderr, "reset_wake_test: cannot make and start a timer\n");
        return 1;
    }
    hwt_sink *sink = hwt_timer_default_sink(t);
    watched.sink = sink;
    /* the worker, idle, is woken to take it into the wheel */
    if (hwt_timer_schedule(t, &watched, OLD_DELAY_NS) != HWT_OK) {
        fprintf(stderr, "reset_wake_test: schedule failed\n");
        return 1;
    }
    while (atomic_load(&stage) != 1)
        usleep(100);
    int64_t reset_at = now_ns();
    int r = hwt_timeout_reset(&watched, NEW_DELAY_NS);
    atomic_store(&stage, 2);
    if (r != HWT_OK) {
        fprintf(stderr, "reset_wake_test: reset returned %d\n", r);
        return 1;
    }
    hwt_timeout *got = NULL;
    while (!(got = hwt_sink_take(sink)) && now_ns() - reset_at < 2 * OLD_DELAY_NS)
        usleep(200);
    int64_t late = now_ns() - reset_at - NEW_DELAY_NS;
    hwt_timeout *left = hwt_timer_stop(t);
    (void)left;
    hwt_timer_take_released(t);
    hwt_timer_decref(t);
    if (got != &watched) {
        fprintf(stderr, "reset_wake_test: the reset timeout was not delivered\n");
        return 1;
    }
    if (late > LATE_LIMIT_NS) {
        fprintf(stderr,
                "reset_wake_test: delivered %.3f s after its new deadline (its old one was "
                "%.3f s away): the reset did not wake the worker\n",
                (double)late / 1e9, (double)OLD_DELAY_NS / 1e9);
        return 1;
    }
    printf("reset_wake_test: delivered %.3f s after its new deadline\n", (double)late / 1e9);
    return 0;
}
