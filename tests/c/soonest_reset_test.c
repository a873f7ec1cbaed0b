/*
 * soonest_reset_test.c: a reset that lands while hwt_timer_soonest() walks
 * the wheel, after the walk has met the timeout at its old deadline, does
 * not make the walk report that timeout twice.
 *
 * The walk holds the wheel, not the cancel lock, so resets go on
 * meanwhile (hwt.h).  One timeout sits alone in an early bucket, so the
 * walk meets it first; a long bucket behind it keeps the walk busy while
 * another thread resets it to a deadline still before that bucket.  The
 * walk asks for the two soonest.  The timing is left to the scheduler, so
 * the round is repeated; a round whose reset came too early or too late
 * proves nothing either way.
 *
 * Usage: soonest_reset_test.  Exits 0 when no walk reported a timeout
 * twice.
 */
#include "hwt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define BEHIND        100000 /* timeouts in the long bucket */
#define ROUNDS        200
#define FIRST_NS      INT64_C(10000000000) /* the watched one's deadline */
#define BEHIND_NS     INT64_C(20000000000) /* the long bucket's */
#define RESET_NS      INT64_C(15000000000) /* between the two */
#define RESET_WAIT_NS INT64_C(200000)      /* after the walk began */

static hwt_timeout watched;
static _Atomic int round_go;   /* the round whose walk has begun */
static _Atomic int round_done; /* the last round whose reset was made */
static _Atomic int reset_err;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *resetter(void *arg)
{
    (void)arg;
    for (int r = 1; r <= ROUNDS; r++) {
        while (atomic_load(&round_go) != r)
            ;
        int64_t until = now_ns() + RESET_WAIT_NS;
        while (now_ns() < until)
            ;
        int err = hwt_timeout_reset(&watched, RESET_NS + (r & 1));
        if (err != HWT_OK)
            atomic_store(&reset_err, err);
        atomic_store(&round_done, r);
    }
    return NULL;
}

typedef struct seen {
    hwt_timeout *to[2];
    size_t n;
} seen;

static void visit(void *ctx, hwt_timeout *to)
{
    seen *s = ctx;
    if (s->n < 2)
        s->to[s->n] = to;
    s->n++;
}

int main(void)
{
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = 512};
    hwt_timer *t = hwt_timer_new(&cfg);
    hwt_timeout *behind = calloc(BEHIND, sizeof(*behind));
    if (!t || !behind || hwt_timer_start(t) != 0) {
        fprintf(stderr, "soonest_reset_test: cannot make and start a timer\n");
        return 1;
    }
    hwt_sink *sink = hwt_timer_default_sink(t);
    watched.sink = sink;
    int err = hwt_timer_schedule(t, &watched, FIRST_NS);
    for (size_t i = 0; i < BEHIND && err == HWT_OK; i++) {
        behind[i].sink = sink;
        err = hwt_timer_schedule(t, &behind[i], BEHIND_NS);
    }
    pthread_t thread;
    if (err != HWT_OK || pthread_create(&thread, NULL, resetter, NULL) != 0) {
        fprintf(stderr, "soonest_reset_test: cannot schedule, or start a thread\n");
        return 1;
    }
    int twice = 0, soonest_err = 0;
    for (int r = 1; r <= ROUNDS; r++) {
        seen s = {{NULL, NULL}, 0};
        size_t found = 0;
        atomic_store(&round_go, r);
        int e = hwt_timer_soonest(t, 2, visit, &s, &found);
        if (e)
            soonest_err = e;
        else if (found != 2 || s.n != 2)
            soonest_err = -1;
        else if (s.to[0] == s.to[1])
            twice++;
        while (atomic_load(&round_done) != r)
            ;
    }
    pthread_join(thread, NULL);
    hwt_timer_stop(t);
    hwt_timer_take_released(t);
    hwt_timer_decref(t);
    free(behind);
    if (soonest_err || atomic_load(&reset_err)) {
        fprintf(stderr, "soonest_reset_test: soonest returned %d, a reset %d\n", soonest_err,
                atomic_load(&reset_err));
        return 1;
    }
    if (twice) {
        fprintf(stderr,
                "soonest_reset_test: in %d of %d walks the timeout reset during the walk was "
                "reported twice, in place of the next soonest\n",
                twice, ROUNDS);
        return 1;
    }
    printf("soonest_reset_test: %d walks, each timeout reported once\n", ROUNDS);
    return 0;
}
