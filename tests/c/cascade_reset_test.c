/*
 * cascade_reset_test.c: resets and cancels from several threads while the
 * real worker cascades the timeouts they move, for ThreadSanitizer
 * (scripts/check-core.sh).  On wheels of one and of eight buckets a slot
 * of level 1 or above starts every tick or every eight, so nearly every
 * tick with work cascades.  The timeouts are periodic (2-20 ms), re-armed
 * by a consumer after each run, and other threads reset them again and
 * again to 0.5-30 ms (now and then to never), on the wheel or in their
 * run, so that they are moved down while their deadlines change.
 *
 * Checks: no run is delivered before its deadline (the last a reset or
 * re-arm gave it), each timeout ends exactly once (released after a cancel
 * that won while it was on the wheel, its re-arm finding a cancel or the
 * stop, or returned by stop()), a cancel that won ends it, and the
 * counters add up.
 *
 * Usage: cascade_reset_test [SEED].  Exits 0 when every check holds.
 */
#define _GNU_SOURCE
#include "hwt.h"
#include "test_util.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ITEMS     300
#define RESETTERS 3
#define RUN_NS    INT64_C(300000000)

typedef struct item {
    hwt_timeout to;
    int64_t period;
    /* how it ended: its re-arm found a cancel or the stop, stop() returned
       it, or it was released */
    _Atomic int cancelled_in_run, stopped_in_run, returned, released;
    _Atomic int cancel_wins, runs;
    _Atomic int64_t early; /* ns before its deadline that a run was delivered */
} item;

static item items[ITEMS];
static hwt_timer *timer;
static _Atomic bool done;
static uint64_t seed;
static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (failures++ < 20) {                                                                     \
            fprintf(stderr, "cascade_reset_test: FAIL: " __VA_ARGS__);                             \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *resetter(void *arg)
{
    uint64_t rng = seed * 31 + (uint64_t)(uintptr_t)arg;
    while (!atomic_load(&done)) {
        uint64_t r = t_splitmix(&rng);
        int64_t delay = (r >> 50) % 32 ? 500000 + (int64_t)((r >> 20) % 29500000) : HWT_NEVER;
        hwt_timeout_reset(&items[r % ITEMS].to, delay);
        item *victim = &items[(r >> 44) % ITEMS];
        if ((r >> 36) % 2048 == 0 && hwt_timeout_cancel(&victim->to) == HWT_OK)
            atomic_fetch_add(&victim->cancel_wins, 1);
        if ((r >> 56) % 4 == 0)
            t_sleep_ns(20000);
    }
    return NULL;
}

/* Runs each delivered timeout (it checks its deadline) and re-arms it. */
static void *consumer(void *arg)
{
    (void)arg;
    hwt_sink *sink = hwt_timer_default_sink(timer);
    for (bool finished = false; !finished;) {
        hwt_timeout *list = hwt_sink_wait(sink, &finished, NULL);
        for (hwt_timeout *next; list; list = next) {
            next = hwt_timeout_of(list->link.next);
            item *it = (item *)list;
            int64_t now = now_ns(), late = now - hwt_timer_start_time(timer);
            /* the deadline it was delivered at, unless a reset in its run
               (RUNNING -> RUNNING_RESET) has moved it since */
            uint32_t before = atomic_load(&list->state);
            late -= hwt_timeout_deadline(list);
            if (late < 0 && before == HWT_RUNNING && atomic_load(&list->state) == HWT_RUNNING)
                atomic_store(&it->early, -late);
            atomic_fetch_add(&it->runs, 1);
            int r = hwt_timeout_rearm(list, it->period, now, now, false);
            if (r == HWT_EAGAIN)
                r = hwt_timeout_requeue(list);
            if (r == HWT_ECANCELLED)
                atomic_fetch_add(&it->cancelled_in_run, 1);
            else if (r == HWT_ESTOPPED)
                atomic_fetch_add(&it->stopped_in_run, 1);
            else if (r != HWT_OK)
                FAIL("re-arm returned %d", r);
        }
    }
    return NULL;
}

static void run(uint32_t wheel)
{
    hwt_config cfg = {.tick_ns = 100000, .ticks_per_wheel = wheel, .thread_name = "hwt-cascade"};
    timer = hwt_timer_new(&cfg);
    if (!timer || hwt_timer_start(timer) != 0) {
        fprintf(stderr, "cascade_reset_test: cannot start a timer\n");
        exit(1);
    }
    memset(items, 0, sizeof(items)); /* before the threads start */
    atomic_store(&done, false);
    uint64_t rng = seed + wheel;
    for (int i = 0; i < ITEMS; i++) {
        items[i].to.sink = hwt_timer_default_sink(timer);
        items[i].period = 2000000 + (int64_t)(t_splitmix(&rng) % 18000000);
        if (hwt_timer_schedule_periodic(timer, &items[i].to, items[i].period,
                                        (int)(t_splitmix(&rng) % 3)) != HWT_OK)
            FAIL("schedule refused");
    }
    pthread_t cons, res[RESETTERS];
    if (pthread_create(&cons, NULL, consumer, NULL) != 0) {
        fprintf(stderr, "cascade_reset_test: pthread_create failed\n");
        exit(1);
    }
    for (uintptr_t i = 0; i < RESETTERS; i++)
        if (pthread_create(&res[i], NULL, resetter, (void *)i) != 0) {
            fprintf(stderr, "cascade_reset_test: pthread_create failed\n");
            exit(1);
        }
    t_sleep_ns(RUN_NS);
    atomic_store(&done, true);
    for (int i = 0; i < RESETTERS; i++)
        pthread_join(res[i], NULL);
    for (hwt_timeout *next, *x = hwt_timer_stop(timer); x; x = next) {
        next = hwt_timeout_of(x->link.next);
        atomic_fetch_add(&((item *)x)->returned, 1);
    }
    pthread_join(cons, NULL);
    for (hwt_timeout *next, *x = hwt_timer_take_released(timer); x; x = next) {
        next = hwt_timeout_of(x->link.next);
        atomic_fetch_add(&((item *)x)->released, 1);
    }
    int runs = 0, wins = 0;
    for (int i = 0; i < ITEMS; i++) {
        item *it = &items[i];
        int cancelled = atomic_load(&it->cancelled_in_run);
        int stopped = atomic_load(&it->stopped_in_run);
        int ret = atomic_load(&it->returned), rel = atomic_load(&it->released);
        int c = atomic_load(&it->cancel_wins);
        runs += atomic_load(&it->runs);
        wins += c;
        if (cancelled + stopped + ret + rel != 1 || c != cancelled + rel)
            FAIL("wheel %" PRIu32 ", timeout %d: ended %d times in its run by a cancel, %d "
                 "by the stop; returned %d, released %d times; %d cancels won",
                 wheel, i, cancelled, stopped, ret, rel, c);
        if (atomic_load(&it->early))
            FAIL("wheel %" PRIu32 ", timeout %d: a run delivered %" PRId64
                 " ns before its deadline",
                 wheel, i, atomic_load(&it->early));
    }
    hwt_stats s;
    hwt_timer_stats(timer, &s);
    if (s.pending != 0 || s.scheduled != ITEMS || s.expired != 0 || s.cancelled != ITEMS)
        FAIL("wheel %" PRIu32 ": pending %" PRId64 ", scheduled %" PRIu64 ", expired %" PRIu64
             ", cancelled %" PRIu64,
             wheel, s.pending, s.scheduled, s.expired, s.cancelled);
    hwt_timer_decref(timer);
    printf("cascade_reset_test: wheel %" PRIu32 ": %d runs, %d cancels won, %" PRIu64
           " ticks processed\n",
           wheel, runs, wins, s.ticks);
}

int main(int argc, char **argv)
{
    seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    printf("cascade_reset_test: seed %" PRIu64 "\n", seed);
    run(1);
    run(8);
    return failures != 0;
}
