/*
 * walk_race_test.c: a walk of the wheel (hwt_timer_soonest) that moves
 * queued timeouts in while the worker is about to sleep shares nothing
 * with the worker but what its locks and atomics order.  Built with
 * -fsanitize=thread, which reports any other shared access.
 *
 * This program defines clock_gettime itself, so the core's clock reads
 * reach it: the worker's first read once it has expired a timeout (the
 * one that begins its sleep, after it let go of the wheel, with nothing
 * left to wait for) waits until the main thread has walked the wheel.  The hand-over between the two is
 * relaxed on purpose, so that it orders nothing the core does not.
 *
 * Usage: walk_race_test.  Exits 0 when the first timeout was delivered,
 * the walk found the second, and stop returned it.
 */
#define _GNU_SOURCE
#include "hwt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define FAR_NS INT64_C(60000000000)

static pthread_t main_thread;
/* not HWT_EXPIRED until the worker has expired it */
static hwt_timeout watched = {.state = HWT_CANCELLED};
static _Atomic int stage; /* 0 armed, 1 worker held, 2 walked, 3 disarmed */

static int real_clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*fn)(clockid_t, struct timespec *);
    if (!fn)
        fn = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (!fn) {
        fprintf(stderr, "walk_race_test: no clock_gettime in the C library\n");
        abort();
    }
    return fn(id, ts);
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    if (!pthread_equal(pthread_self(), main_thread) &&
        atomic_load_explicit(&stage, memory_order_relaxed) == 0 &&
        atomic_load_explicit(&watched.state, memory_order_relaxed) == HWT_EXPIRED) {
        atomic_store_explicit(&stage, 1, memory_order_relaxed);
        while (atomic_load_explicit(&stage, memory_order_relaxed) != 2)
            usleep(100);
        atomic_store_explicit(&stage, 3, memory_order_relaxed);
    }
    return real_clock_gettime(id, ts);
}

static void visit(void *ctx, hwt_timeout *to)
{
    (void)to;
    (*(size_t *)ctx)++;
}

int main(void)
{
    main_thread = pthread_self();
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = 64};
    hwt_timer *t = hwt_timer_new(&cfg);
    if (!t || hwt_timer_start(t) != 0) {
        fprintf(stderr, "walk_race_test: cannot make and start a timer\n");
        return 1;
    }
    hwt_sink *sink = hwt_timer_default_sink(t);
    hwt_timeout queued = {.sink = sink};
    watched.sink = sink;
    /* the worker, idle, is woken to take it in; it expires at once */
    if (hwt_timer_schedule(t, &watched, 0) != HWT_OK) {
        fprintf(stderr, "walk_race_test: schedule failed\n");
        return 1;
    }
    while (atomic_load_explicit(&stage, memory_order_relaxed) != 1)
        usleep(100);
    /* the worker is awake: this one stays queued until the walk takes it */
    int r = hwt_timer_schedule(t, &queued, FAR_NS);
    size_t seen = 0, found = 0;
    int err = hwt_timer_soonest(t, 2, visit, &seen, &found);
    atomic_store_explicit(&stage, 2, memory_order_relaxed);
    while (atomic_load_explicit(&stage, memory_order_relaxed) != 3)
        usleep(100);
    hwt_timeout *left = hwt_timer_stop(t);
    hwt_timeout *expired = hwt_sink_take(sink);
    size_t returned = 0;
    for (hwt_timeout *to = left; to; to = hwt_timeout_of(to->link.next))
        returned++;
    hwt_timer_take_released(t);
    hwt_timer_decref(t);
    if (r != HWT_OK || err || found != 1 || seen != 1 || expired != &watched || left != &queued ||
        returned != 1) {
        fprintf(stderr,
                "walk_race_test: schedule %d, soonest %d found %zu (visited %zu), the first "
                "timeout %s, stop returned %zu (%s); expected 0, 0, 1, 1, delivered, 1, the "
                "second\n",
                r, err, found, seen, expired == &watched ? "delivered" : "not delivered",
                returned, left == &queued ? "the second" : "another");
        return 1;
    }
    printf("walk_race_test: the walk moved the queued timeout in while the worker went to "
           "sleep\n");
    return 0;
}
