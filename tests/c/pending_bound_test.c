/*
 * pending_bound_test.c: max_pending holds when a reset and a schedule race
 * for the last place.  A one-shot delivered RUNNING to an `ends_once` sink
 * and not yet begun counts as expired; a reset makes it pending again, so
 * the bound refuses that reset as it refuses a new timeout.  With one
 * place left, a reset of such a one-shot on one thread and a schedule on
 * another may not both be accepted: one of them is refused.
 *
 * Each round sets that up on a fresh manual timer, then starts the two at
 * once, each after a random pause, so that over the rounds their checks
 * of the bound fall on each other.  The reset's pause has a base that
 * follows the outcomes: it grows while the reset comes first (and wins)
 * and shrinks while the schedule does, so that the two meet whatever the
 * machine, or a sanitizer, makes of each one's speed.  The timing is left
 * to the scheduler: a round whose two calls did not overlap proves nothing
 * either way.
 *
 * Usage: pending_bound_test [SEED [ROUNDS]].  Exits 0 when no round
 * accepted both, and the pending count never passed the bound.
 */
#include "hwt.h"
#include "test_util.h"

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_PENDING 2
#define FAR_NS      INT64_C(1000000000)
#define MAX_PAUSE   256 /* spins before each side's call, at random */

static _Atomic int64_t fake_now;

static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return atomic_load_explicit(&fake_now, memory_order_relaxed);
}

/* what the scheduling thread shares with the main one, round by round */
static hwt_timer *_Atomic round_timer;
static hwt_timeout scheduled;
static _Atomic int round_go, round_done, schedule_rc;
static _Atomic unsigned round_pause;

static int fail(const char *what, int code)
{
    fprintf(stderr, "pending_bound_test: %s (%d)\n", what, code);
    return 1;
}

static void pause_for(unsigned spins)
{
    for (volatile unsigned i = 0; i < spins; i++)
        ;
}

static void *scheduler(void *arg)
{
    int rounds = *(int *)arg;
    for (int r = 1; r <= rounds; r++) {
        while (atomic_load(&round_go) != r)
            sched_yield(); /* on one core, the main thread needs it */
        pause_for(atomic_load(&round_pause));
        hwt_timer *t = atomic_load(&round_timer);
        atomic_store(&schedule_rc, hwt_timer_schedule(t, &scheduled, FAR_NS));
        atomic_store(&round_done, r);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    int rounds = argc > 2 ? atoi(argv[2]) : 20000;
    pthread_t thread;
    if (pthread_create(&thread, NULL, scheduler, &rounds) != 0)
        return fail("no thread", 0);
    int both = 0, resets = 0, schedules = 0;
    unsigned base = 0; /* the reset's pause before its random part */
    int64_t worst = 0;
    for (int r = 1; r <= rounds; r++) {
        hwt_config cfg = {
            .tick_ns = 1000, .ticks_per_wheel = 8, .max_pending = MAX_PENDING, .manual = true};
        cfg.clock = fake_clock;
        atomic_store(&fake_now, 0);
        hwt_timer *t = hwt_timer_new(&cfg);
        hwt_sink once_sink;
        if (!t || hwt_timer_start(t) != 0 || hwt_sink_init(&once_sink, t, NULL, -1, NULL) != 0)
            return fail("cannot make a timer and a sink", r);
        once_sink.ends_once = true;
        hwt_timeout delivered = {.sink = &once_sink}, filler = {.sink = hwt_timer_default_sink(t)};
        scheduled = (hwt_timeout){.sink = hwt_timer_default_sink(t)};
        /* the one-shot delivered, its run not begun; then one place left */
        if (hwt_timer_schedule(t, &delivered, 1000) != HWT_OK)
            return fail("schedule refused in round", r);
        atomic_store(&fake_now, 2000);
        hwt_timer_advance(t, 2000);
        if (hwt_sink_take(&once_sink) != &delivered ||
            hwt_timer_schedule(t, &filler, FAR_NS) != HWT_OK ||
            hwt_timer_pending(t) != MAX_PENDING - 1)
            return fail("the setup failed in round", r);

        uint64_t pauses = t_splitmix(&seed);
        atomic_store(&round_pause, (unsigned)(pauses % MAX_PAUSE));
        atomic_store(&round_timer, t);
        atomic_store(&round_go, r);
        pause_for(base + (unsigned)((pauses >> 32) % MAX_PAUSE));
        int reset_rc = hwt_timeout_reset(&delivered, FAR_NS);
        while (atomic_load(&round_done) != r)
            sched_yield();
        int64_t pending = hwt_timer_pending(t);
        bool reset_ok = reset_rc == HWT_OK, schedule_ok = atomic_load(&schedule_rc) == HWT_OK;
        resets += reset_ok;
        schedules += schedule_ok;
        if (reset_ok && schedule_ok)
            both++;
        else if (reset_ok && base < 1000 * MAX_PAUSE)
            base += MAX_PAUSE / 16; /* the reset came first: later next time */
        else if (schedule_ok && base >= MAX_PAUSE / 16)
            base -= MAX_PAUSE / 16;
        if (pending > worst)
            worst = pending;
        if (reset_rc != HWT_OK && reset_rc != HWT_EFINAL)
            return fail("reset returned", reset_rc);
        if (!schedule_ok && atomic_load(&schedule_rc) != HWT_EREJECTED)
            return fail("schedule returned", atomic_load(&schedule_rc));

        /* what is left: the filler and the scheduled one pending, the
           delivered one as the reset left it */
        for (hwt_timeout *n, *x = hwt_timer_stop(t); x; x = n)
            n = hwt_timeout_of(x->link.next);
        uint32_t began = hwt_timeout_begin(&delivered);
        if (began == HWT_RUNNING_RESET)
            hwt_timeout_requeue(&delivered);
        else if (began != HWT_EXPIRED)
            return fail("the delivered one's state is", (int)began);
        hwt_sink_close(&once_sink);
        hwt_sink_destroy(&once_sink);
        hwt_timer_decref(t);
    }
    pthread_join(thread, NULL);
    printf("pending_bound_test: %d rounds, %d resets and %d schedules accepted, %d both; "
           "pending at most %" PRId64 " of %d\n",
           rounds, resets, schedules, both, worst, MAX_PENDING);
    if (both || worst > MAX_PENDING)
        return fail("FAIL: the bound was passed; rounds that accepted both:", both);
    return 0;
}
