/*
 * model_test.c: drives the hwtimer C core (src/hwt.c and src/wheel.c, manual mode, fake
 * clock) with seeded random sequences of schedules (one-shot and periodic,
 * all three missed-run policies), cancels, resets and clock advances, and checks it step by step
 * against the model in model.h.
 *
 * Usage: model_test [SEED [ITERATIONS [OPS [WIDE]]]]
 * Iteration i runs with seed SEED + i, so `model_test S 1` reproduces the
 * iteration whose seed S a mismatch reports.  Then WIDE wide runs (each of
 * WIDE_ITEMS items, many scheduled, cancelled or reset at once, so that a
 * tick's bucket spans the walk's chunks and slices), wide run j with seed
 * SEED + j: `model_test S 0 0 1` reproduces the wide run of seed S.
 * Without SEED the seed comes from the time and is printed first.  Exits 0
 * when every run agrees, 1 on the first mismatch (after printing it and
 * the operations before it).
 */
#include "model.h"

#include <time.h>

#define DEFAULT_ITERATIONS 2000
#define DEFAULT_OPS        400
#define MAX_ITEMS          128
#define DEFAULT_WIDE       40
#define WIDE_ITEMS         12000 /* past a slice of 8192 (src/hwt.c) */
#define WIDE_OPS           80

static int64_t far_clock;

static int64_t far_clock_fn(void *ctx)
{
    (void)ctx;
    return far_clock;
}

/* A far timeout, followed as a sleeping worker follows it (to each time
   advance returns): it fires at the very end of its tick after at most one
   wake-up per level, and a second one of the same deadline, scheduled
   once the first has cascaded, fires right after it.  Returns 0 or 1. */
static int far_walk(uint32_t wheel, int64_t delay)
{
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = wheel, .manual = true};
    cfg.clock = far_clock_fn;
    far_clock = 0;
    hwt_timer *t = hwt_timer_new(&cfg);
    hwt_timeout a = {0}, b = {0};
    if (!t || hwt_timer_start(t) != 0)
        return 1;
    a.sink = b.sink = hwt_timer_default_sink(t);
    hwt_timer_schedule(t, &a, delay);
    int64_t end = ((delay - 1) / cfg.tick_ns + 1) * cfg.tick_ns, next = hwt_timer_advance(t, 0);
    unsigned steps = 0, levels = 1 + (63 - (unsigned)__builtin_ctz(wheel) + 5) / 6;
    hwt_timeout *got = NULL;
    while (!got && next != HWT_NEVER && steps <= levels) {
        far_clock = next;
        next = hwt_timer_advance(t, next);
        got = hwt_sink_take(hwt_timer_default_sink(t));
        if (++steps == 1 && !got)
            hwt_timer_schedule(t, &b, delay - far_clock);
    }
    bool ok = got == &a && hwt_timeout_of(a.link.next) == &b && !b.link.next && far_clock == end &&
              steps <= levels;
    if (!ok)
        fprintf(stderr,
                "far_walk: wheel %" PRIu32 " delay %" PRId64 ": %s after %u steps at %" PRId64
                ", due at %" PRId64 "\n",
                wheel, delay, got == &a ? "fired" : "did not fire", steps, far_clock, end);
    hwt_timer_stop(t);
    hwt_timer_decref(t);
    return !ok;
}

static int far_walks(void)
{
    static const uint32_t wheels[] = {1, 8, 512, 4096};
    static const int64_t delays[] = {
        INT64_C(5000000000), INT64_C(3600000000000), INT64_C(31536000000000000),
        INT64_C(3153600000000000000)}; /* 5 s, an hour, a year, a century */
    int failed = 0;
    for (size_t w = 0; w < sizeof(wheels) / sizeof(wheels[0]); w++)
        for (size_t d = 0; d < sizeof(delays) / sizeof(delays[0]); d++)
            failed |= far_walk(wheels[w], delays[d]);
    if (!failed)
        printf("model_test: far timeouts fire on time, at most one wake-up per level\n");
    return failed;
}

/* Returns 0 and sets *out, or -1 if `s` is not a whole unsigned number. */
static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s)
        return -1;
    *out = strtoull(s, &end, 0);
    return *end ? -1 : 0;
}

int main(int argc, char **argv)
{
    uint64_t seed, iterations = DEFAULT_ITERATIONS, ops = DEFAULT_OPS, wide = DEFAULT_WIDE;
    if (argc > 5 || (argc > 1 && parse_u64(argv[1], &seed)) ||
        (argc > 2 && parse_u64(argv[2], &iterations)) || (argc > 3 && parse_u64(argv[3], &ops)) ||
        (argc > 4 && parse_u64(argv[4], &wide))) {
        fprintf(stderr, "usage: %s [SEED [ITERATIONS [OPS [WIDE]]]]\n", argv[0]);
        return 2;
    }
    if (argc < 2) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
    }
    printf("model_test: seed %" PRIu64 ", %" PRIu64 " iterations of up to %" PRIu64
           " operations, %" PRIu64 " wide runs of %d items\n",
           seed, iterations, ops, wide, WIDE_ITEMS);
    fflush(stdout);
    m_totals totals = {0};
    for (uint64_t i = 0; i < iterations; i++) {
        char what[96];
        snprintf(what, sizeof(what), "reproduce with: model_test %" PRIu64 " 1 %" PRIu64, seed + i,
                 ops);
        m_source src;
        m_source_seed(&src, seed + i);
        m_run_sequence(&src, what, MAX_ITEMS, (size_t)ops, false, &totals);
    }
    for (uint64_t j = 0; j < wide; j++) {
        char what[96];
        snprintf(what, sizeof(what), "reproduce with: model_test %" PRIu64 " 0 0 1", seed + j);
        m_source src;
        m_source_seed(&src, seed + j);
        m_run_sequence(&src, what, WIDE_ITEMS, WIDE_OPS, true, &totals);
    }
    printf("model_test: %" PRIu64 " runs agree with the model: %" PRIu64 " steps, %" PRIu64
           " advances, %" PRIu64 " scheduled, %" PRIu64 " expired, %" PRIu64 " cancelled, %" PRIu64
           " rejected, %" PRIu64 " returned or released by stop, %" PRIu64 " resets, %" PRIu64
           " periodic runs re-armed; at most %" PRIu64 " expired in one tick\n",
           totals.runs, totals.steps, totals.advances, totals.scheduled, totals.expired,
           totals.cancelled, totals.rejected, totals.returned, totals.resets, totals.reruns,
           totals.largest_tick);
    return far_walks();
}
