/*
 * soonest_bench.c: what hwt_timer_soonest costs with many timeouts pending,
 * on a real worker (1 ms x 4096): the time one call holds the wheel, and
 * the longest a schedule + cancel pair in another thread took meanwhile,
 * beside the longest one took while no snapshot ran (producers never wait
 * for the wheel: what they see is the machine's own scheduling noise).
 *
 * Build and run (from the repository's root):
 *   gcc -O2 -pthread -Isrc tests/c/soonest_bench.c src/hwt.c src/wheel.c \
 *       -o soonest_bench && ./soonest_bench [PENDING [LIMIT]]
 */
#include "hwt.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Atomic bool snapping, done;
static _Atomic int64_t worst_pair_ns[2]; /* [1]: while a snapshot runs */

static void ignore(void *ctx, hwt_timeout *to)
{
    (void)ctx;
    (void)to;
}

#define POOL 4000000

/* Schedules and cancels, timing each pair, the worst kept apart for while
   a snapshot runs; each pair takes a fresh node, so none waits to be
   released. */
static void *producer(void *arg)
{
    hwt_timer *t = arg;
    hwt_timeout *pool = calloc(POOL, sizeof(*pool));
    for (size_t i = 0; pool && i < POOL && !atomic_load(&done);) {
        bool during = atomic_load(&snapping);
        hwt_timeout *to = &pool[i++];
        to->sink = hwt_timer_default_sink(t);
        int64_t t0 = hwt_monotonic_ns(NULL);
        if (hwt_timer_schedule(t, to, INT64_C(30000000000)) == HWT_OK)
            hwt_timeout_cancel(to);
        int64_t took = hwt_monotonic_ns(NULL) - t0;
        if (took > atomic_load(&worst_pair_ns[during]) && during == atomic_load(&snapping))
            atomic_store(&worst_pair_ns[during], took);
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    /* the pool is left to the process's exit: the timer may hold some */
    return NULL;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 0) : 1000000;
    size_t limit = argc > 2 ? strtoull(argv[2], NULL, 0) : 100;
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = 4096};
    hwt_timer *t = hwt_timer_new(&cfg);
    hwt_timeout *v = calloc(n, sizeof(*v));
    if (!t || !v || hwt_timer_start(t) != 0)
        return 1;
    uint64_t rng = 1;
    for (size_t i = 0; i < n; i++) {
        rng = rng * 6364136223846793005u + 1442695040888963407u;
        v[i].sink = hwt_timer_default_sink(t);
        hwt_timer_schedule(t, &v[i], INT64_C(3600000000000) + (int64_t)(rng >> 28) % 60000000000);
    }
    struct timespec pause = {1, 0};
    nanosleep(&pause, NULL); /* the worker moves them into the wheel */
    pthread_t th;
    pthread_create(&th, NULL, producer, t);
    nanosleep(&(struct timespec){0, 100000000}, NULL);
    int64_t best = INT64_MAX, worst = 0;
    for (int round = 0; round < 5; round++) {
        size_t found;
        nanosleep(&(struct timespec){0, 200000000}, NULL);
        atomic_store(&snapping, true);
        int64_t t0 = hwt_monotonic_ns(NULL);
        int err = hwt_timer_soonest(t, limit, ignore, NULL, &found);
        int64_t took = hwt_monotonic_ns(NULL) - t0;
        atomic_store(&snapping, false);
        if (err || found != limit)
            return 1;
        best = took < best ? took : best;
        worst = took > worst ? took : worst;
    }
    atomic_store(&done, true);
    pthread_join(th, NULL);
    printf("soonest %zu of %zu pending: %.2f to %.2f ms holding the wheel; slowest schedule + "
           "cancel meanwhile %.3f ms, %.3f ms without a snapshot\n",
           limit, n, best / 1e6, worst / 1e6, atomic_load(&worst_pair_ns[1]) / 1e6,
           atomic_load(&worst_pair_ns[0]) / 1e6);
    hwt_timer_stop(t);
    hwt_timer_decref(t);
    free(v);
    return 0;
}
