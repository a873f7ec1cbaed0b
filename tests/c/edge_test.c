/*
 * edge_test.c: the C core at the edges of its arithmetic, in manual mode on
 * a fake clock, checked against the rule of hwt.h and wheel.h: a timeout
 * is due at the first tick that ends at or after its deadline (never
 * before the tick that holds the clock at its schedule), and fires at that
 * tick's end; one whose tick would end at or past HWT_NEVER on the clock
 * never fires and its deadline reads HWT_NEVER.
 *
 *   boundaries: every delay up to 1200 ticks from many clock readings, on
 *     wheels of 1 to 8 buckets (levels 1 to 3 start every 8 to 512 ticks),
 *     each followed tick by tick and by jumps to what advance returns:
 *     deadlines just before, on and after every level's slot boundary;
 *   far: random start times, clock readings and delays up to the end of
 *     the 64-bit clock (delays on and next to powers of two), on wheels of
 *     1 to 4096 buckets and ticks of 1 ns to 1 us: each fires at its tick's
 *     end after at most one step per level, or saturates to never;
 *   stop: stop() with timeouts in every state (queued, queued and
 *     cancelled, on level 0, on an upper level, never due, reset and not
 *     yet relinked, cancelled and not yet unlinked, a periodic one in its
 *     run, one-shots delivered RUNNING to an `ends_once` sink, one of them
 *     reset): each comes back exactly once, by stop(), the released list,
 *     or its consumer's call, and the counters add up;
 *   grid: hwt_periodic_next() against a 128-bit reference of a
 *     period that is no whole ns, under each policy, for random grid
 *     points, lags, periods and runs (late, overrunning, spanning many
 *     periods, near the clock's end), and runs of 216,000 steps of a
 *     1 / 60 s grid that end on its exact point.
 *
 * Usage: edge_test [SEED].  Exits 0 when every check holds.
 */
#include "hwt.h"
#include "test_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static int64_t fake_now;
static int failures;

static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (failures++ < 20) {                                                                     \
            fprintf(stderr, "edge_test: FAIL: " __VA_ARGS__);                                      \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static hwt_timer *manual_timer(uint32_t wheel, int64_t tick_ns, int64_t start)
{
    hwt_config cfg = {.tick_ns = tick_ns, .ticks_per_wheel = wheel, .manual = true};
    cfg.clock = fake_clock;
    fake_now = start;
    hwt_timer *t = hwt_timer_new(&cfg);
    if (!t || hwt_timer_start(t) != 0) {
        fprintf(stderr, "edge_test: cannot make a timer (wheel %" PRIu32 ", tick %" PRId64 ")\n",
                wheel, tick_ns);
        exit(1);
    }
    return t;
}

/* The clock time at which a timeout scheduled at clock `at` with `delay`
   fires, or HWT_NEVER; `start` is the timer's start time. */
static int64_t expected_end(int64_t start, int64_t tick_ns, int64_t at, int64_t delay)
{
    int64_t rel = at - start, deadline, tick, end_rel, end;
    if (delay <= 0)
        deadline = rel;
    else if (__builtin_add_overflow(rel, delay, &deadline))
        return HWT_NEVER;
    tick = deadline <= 0 ? 0 : (deadline - 1) / tick_ns;
    if (tick < rel / tick_ns)
        tick = rel / tick_ns; /* the clock is inside tick rel / tick_ns, not yet ended */
    if (__builtin_mul_overflow(tick + 1, tick_ns, &end_rel) ||
        __builtin_add_overflow(start, end_rel, &end) || end == HWT_NEVER)
        return HWT_NEVER;
    return end;
}

/* Schedules one timeout at clock `at` and follows it, by single steps of
   the clock or by jumps to what advance returns, at most `max_steps` of
   them.  Returns the clock when it fired, or -1. */
static int64_t follow(hwt_timer *t, hwt_timeout *to, int64_t at, int64_t delay, bool jump,
                      unsigned max_steps, unsigned *steps)
{
    fake_now = at;
    hwt_timer_advance(t, at);
    if (hwt_timer_schedule(t, to, delay) != HWT_OK) {
        FAIL("schedule at %" PRId64 " refused", at);
        return -1;
    }
    int64_t next = hwt_timer_advance(t, at);
    for (*steps = 0; *steps < max_steps; ++*steps) {
        if (jump) {
            if (next == HWT_NEVER)
                return -1;
            if (next <= fake_now) {
                FAIL("advance at %" PRId64 " returned %" PRId64 ", not later", fake_now, next);
                return -1;
            }
            fake_now = next;
        } else {
            fake_now++;
        }
        next = hwt_timer_advance(t, fake_now);
        hwt_timeout *got = hwt_sink_take(hwt_timer_default_sink(t));
        if (got) {
            if (got != to || got->link.next)
                FAIL("something other than the one timeout was delivered");
            return fake_now;
        }
    }
    return -1;
}

static void boundaries(void)
{
    static const uint32_t wheels[] = {1, 2, 4, 8};
    unsigned runs = 0;
    for (size_t w = 0; w < sizeof(wheels) / sizeof(wheels[0]); w++)
        for (int64_t at = 0; at < 600; at += 11)
            for (int64_t delay = 0; delay < 1200; delay++)
                for (int jump = 0; jump < 2; jump++) {
                    hwt_timer *t = manual_timer(wheels[w], 1, 0);
                    hwt_timeout to = {.sink = hwt_timer_default_sink(t)};
                    unsigned steps;
                    int64_t want = expected_end(0, 1, at, delay);
                    int64_t got = follow(t, &to, at, delay, jump, 2000, &steps);
                    if (got != want)
                        FAIL("wheel %" PRIu32 ", at %" PRId64 ", delay %" PRId64
                             ", %s: fired at %" PRId64 ", due at %" PRId64,
                             wheels[w], at, delay, jump ? "jumps" : "steps", got, want);
                    hwt_timer_stop(t);
                    hwt_timer_decref(t);
                    runs++;
                }
    printf("edge_test: %u timeouts around level boundaries fire at their tick's end\n", runs);
}

/* A random magnitude: a random number cut to a random width below 63 bits. */
static int64_t any_width(uint64_t *rng)
{
    return (int64_t)(t_splitmix(rng) >> (1 + t_splitmix(rng) % 63));
}

static void far(uint64_t seed)
{
    static const uint32_t wheels[] = {1, 2, 8, 64, 4096};
    uint64_t rng = seed;
    unsigned runs = 0, never = 0;
    for (int i = 0; i < 20000; i++) {
        uint32_t wheel = wheels[t_splitmix(&rng) % 5];
        int64_t tick_ns = t_splitmix(&rng) % 4 ? (int64_t)(t_splitmix(&rng) % 1000) + 1 : 1;
        int64_t start = any_width(&rng), at;
        if (__builtin_add_overflow(start, any_width(&rng), &at) || at == HWT_NEVER)
            continue;
        /* on or next to a power of two, or any */
        int64_t delay = INT64_C(1) << (t_splitmix(&rng) % 63);
        delay += (int64_t)(t_splitmix(&rng) % 5) - 2;
        if (t_splitmix(&rng) % 3 == 0)
            delay = any_width(&rng);
        if (t_splitmix(&rng) % 16 == 0)
            delay = HWT_NEVER;
        hwt_timer *t = manual_timer(wheel, tick_ns, start);
        hwt_timeout to = {.sink = hwt_timer_default_sink(t)};
        unsigned steps, levels = 1 + (63 - (unsigned)__builtin_ctz(wheel) + 5) / 6;
        int64_t want = expected_end(start, tick_ns, at, delay);
        int64_t got = follow(t, &to, at, delay, true, levels + 1, &steps);
        if (want == HWT_NEVER) {
            never++;
            if (got != -1 || hwt_timeout_deadline(&to) != HWT_NEVER)
                FAIL("start %" PRId64 ", tick %" PRId64 ", at %" PRId64 ", delay %" PRId64
                     ": fired at %" PRId64 " with deadline %" PRId64 ", not never",
                     start, tick_ns, at, delay, got, hwt_timeout_deadline(&to));
        } else if (got != want || steps > levels) {
            FAIL("wheel %" PRIu32 ", tick %" PRId64 ", start %" PRId64 ", at %" PRId64
                 ", delay %" PRId64 ": fired at %" PRId64 " after %u steps, due at %" PRId64,
                 wheel, tick_ns, start, at, delay, got, steps, want);
        }
        hwt_timer_stop(t);
        hwt_timer_take_released(t);
        hwt_timer_decref(t);
        runs++;
    }
    printf("edge_test: %u far timeouts up to the clock's end (%u never due) fire on time, "
           "at most one step per level\n",
           runs, never);
}

/* The timeouts of stop_states(), by the state they are in at stop(). */
enum {
    LEVEL0,           /* on level 0 */
    UPPER,            /* on level 1 */
    TOP,              /* on a high level */
    NEVER_DUE,        /* on the never list */
    RESET_QUEUED,     /* RESET, its relink queued */
    CANCEL_QUEUED,    /* CANCELLED, its unlink queued */
    QUEUED,           /* QUEUED, not yet taken into the wheel */
    QUEUED_CANCELLED, /* cancelled while QUEUED */
    IN_RUN,           /* a periodic one in its run */
    DELIVERED,        /* a one-shot delivered RUNNING, its run not begun */
    DELIVERED_RESET,  /* the same, reset since: RUNNING_RESET */
    NSTATES
};

static void stop_states(void)
{
    hwt_timer *t = manual_timer(8, 1000, 0);
    hwt_sink *dflt = hwt_timer_default_sink(t), once_sink;
    if (hwt_sink_init(&once_sink, t, NULL, -1, NULL) != 0) {
        fprintf(stderr, "edge_test: no sink\n");
        exit(1);
    }
    once_sink.ends_once = true;
    static hwt_timeout to[NSTATES];
    int seen[NSTATES] = {0};
    for (int i = 0; i < NSTATES; i++)
        to[i].sink = i == DELIVERED || i == DELIVERED_RESET ? &once_sink : dflt;
    int64_t delays[NSTATES] = {0};
    delays[LEVEL0] = 5000;
    delays[UPPER] = 50000;
    delays[TOP] = INT64_C(5000000000);
    delays[NEVER_DUE] = HWT_NEVER;
    delays[RESET_QUEUED] = delays[CANCEL_QUEUED] = 6000;
    delays[DELIVERED] = delays[DELIVERED_RESET] = 1000;
    for (int i = 0; i < NSTATES; i++) {
        int r = HWT_OK;
        if (i == IN_RUN)
            r = hwt_timer_schedule_periodic(t, &to[i], 1000, HWT_MISSED_SKIP);
        else if (i != QUEUED && i != QUEUED_CANCELLED)
            r = hwt_timer_schedule(t, &to[i], delays[i]);
        if (r != HWT_OK)
            FAIL("schedule %d refused: %d", i, r);
    }
    fake_now = 2000;
    hwt_timer_advance(t, fake_now);
    hwt_timeout *run = hwt_sink_take(dflt), *handed = hwt_sink_take(&once_sink);
    if (run != &to[IN_RUN] || run->link.next)
        FAIL("the periodic timeout was not delivered alone");
    if (handed != &to[DELIVERED] || hwt_timeout_of(handed->link.next) != &to[DELIVERED_RESET])
        FAIL("the one-shots were not handed to the ends_once sink");
    if (hwt_timeout_reset(&to[DELIVERED_RESET], 500) != HWT_OK ||
        hwt_timeout_reset(&to[RESET_QUEUED], 10000) != HWT_OK ||
        hwt_timeout_cancel(&to[CANCEL_QUEUED]) != HWT_OK ||
        hwt_timer_schedule(t, &to[QUEUED], 1000) != HWT_OK ||
        hwt_timer_schedule(t, &to[QUEUED_CANCELLED], 1000) != HWT_OK ||
        hwt_timeout_cancel(&to[QUEUED_CANCELLED]) != HWT_OK)
        FAIL("a reset, cancel or schedule before stop() failed");
    if (atomic_load(&to[RESET_QUEUED].state) != HWT_RESET ||
        atomic_load(&to[DELIVERED_RESET].state) != HWT_RUNNING_RESET)
        FAIL("the reset timeouts are not in their reset states");

    for (hwt_timeout *n, *x = hwt_timer_stop(t); x; x = n) {
        n = hwt_timeout_of(x->link.next);
        seen[x - to]++;
        if (atomic_load(&x->state) != HWT_CANCELLED)
            FAIL("stop() returned %d in state %u", (int)(x - to), atomic_load(&x->state));
        if (x - to == CANCEL_QUEUED || x - to == QUEUED_CANCELLED || x - to == IN_RUN ||
            x - to == DELIVERED || x - to == DELIVERED_RESET)
            FAIL("stop() returned %d, which it does not hold pending", (int)(x - to));
    }
    for (hwt_timeout *n, *x = hwt_timer_take_released(t); x; x = n) {
        n = hwt_timeout_of(x->link.next);
        seen[x - to]++;
        if (x - to != CANCEL_QUEUED && x - to != QUEUED_CANCELLED)
            FAIL("%d released at stop()", (int)(x - to));
    }
    if (hwt_timeout_rearm(&to[IN_RUN], 1000, fake_now, fake_now, false) != HWT_ESTOPPED)
        FAIL("the periodic timeout's re-arm after stop() is not HWT_ESTOPPED");
    seen[IN_RUN]++;
    if (hwt_timeout_begin(&to[DELIVERED]) != HWT_EXPIRED)
        FAIL("the delivered one-shot does not run after stop()");
    seen[DELIVERED]++;
    if (hwt_timeout_begin(&to[DELIVERED_RESET]) != HWT_RUNNING_RESET ||
        hwt_timeout_requeue(&to[DELIVERED_RESET]) != HWT_ESTOPPED)
        FAIL("the reset one-shot's requeue after stop() is not HWT_ESTOPPED");
    seen[DELIVERED_RESET]++;
    for (int i = 0; i < NSTATES; i++)
        if (seen[i] != 1)
            FAIL("timeout %d came back %d times", i, seen[i]);
    hwt_stats s;
    hwt_timer_stats(t, &s);
    if (s.pending != 0 || s.scheduled != NSTATES || s.expired != 1 ||
        s.cancelled != NSTATES - 1 || s.revoked != 1)
        FAIL("counters after stop(): pending %" PRId64 ", scheduled %" PRIu64 ", expired %" PRIu64
             ", cancelled %" PRIu64 ", revoked %" PRIu64,
             s.pending, s.scheduled, s.expired, s.cancelled, s.revoked);
    if (hwt_sink_close(&once_sink) != NULL)
        FAIL("the ends_once sink held timeouts");
    hwt_sink_destroy(&once_sink);
    hwt_timer_decref(t);
    printf("edge_test: stop() with timeouts in every state gives each back once\n");
}

#define FRAC_ONE ((__int128)HWT_FRAC_ONE)

/* ceil(x / FRAC_ONE) for x >= 0 */
static __int128 ceil_frac(__int128 x)
{
    return (x + FRAC_ONE - 1) / FRAC_ONE;
}

/* The reference of hwt_periodic_next(), in HWT_FRAC_ONE-ths of a ns:
   the grid point that `deadline` stands for is deadline - behind, the
   period period + frac; the next deadline is the next grid point the
   policy picks, rounded up, and *behind how far that point lies before
   it.  Written from hwt.h's words. */
static int64_t ref_next(int64_t deadline, uint32_t *behind, int64_t period, uint32_t frac,
                        int missed, int64_t start, int64_t end, bool *again)
{
    __int128 g = (__int128)deadline * FRAC_ONE - *behind, p = (__int128)period * FRAC_ONE + frac;
    __int128 e = (__int128)end * FRAC_ONE, point = g + p;
    *again = false;
    if (missed == HWT_MISSED_DELAY && (__int128)start * FRAC_ONE - g >= p)
        point = (__int128)start * FRAC_ONE + p; /* late by a period: from its start */
    else if (missed == HWT_MISSED_SKIP && ceil_frac(point) <= end)
        point = g + ((e - g) / p + 1) * p; /* the first point after the end */
    __int128 next = ceil_frac(point);
    if (next >= HWT_NEVER) {
        *behind = 0;
        return HWT_NEVER;
    }
    *behind = (uint32_t)(next * FRAC_ONE - point);
    if (missed != HWT_MISSED_SKIP && next <= end) {
        *again = true;
        if (missed == HWT_MISSED_DELAY) { /* once now: the new grid starts at the end */
            *behind = 0;
            return end;
        }
    }
    return (int64_t)next;
}

static void check_grid(int64_t deadline, uint32_t behind, int64_t period, uint32_t frac,
                       int missed, int64_t start, int64_t end)
{
    uint32_t got_behind = behind, want_behind = behind;
    bool got_again, want_again;
    int64_t got =
        hwt_periodic_next(deadline, &got_behind, period, frac, missed, start, end, &got_again);
    int64_t want = ref_next(deadline, &want_behind, period, frac, missed, start, end, &want_again);
    bool behind_differs = want != HWT_NEVER && got_behind != want_behind;
    if (got != want || got_again != want_again || behind_differs) {
        if (failures++ < 10)
            fprintf(stderr,
                    "grid: deadline %" PRId64 " behind %" PRIu32 " period %" PRId64 "+%" PRIu32
                    " missed %d start %" PRId64 " end %" PRId64 ": got %" PRId64 " (%" PRIu32
                    ", again %d), want %" PRId64 " (%" PRIu32 ", again %d)\n",
                    deadline, behind, period, frac, missed, start, end, got, got_behind,
                    got_again, want, want_behind, want_again);
    }
}

static void grid(uint64_t seed)
{
    uint64_t rng = seed ^ UINT64_C(0x6772696420746573);
    for (int i = 0; i < 500000; i++) {
        uint64_t r = t_splitmix(&rng);
        int missed = (int)(r % 3);
        int64_t period = 1 + (int64_t)(t_splitmix(&rng) >> (1 + (r >> 8) % 63));
        /* whole-ns grids (the common case) as often as fractional ones */
        uint32_t frac = r & 0x10000000 ? 0 : (uint32_t)(t_splitmix(&rng) % FRAC_ONE);
        uint32_t behind = r & 0x20000000 ? 0 : (uint32_t)(t_splitmix(&rng) % FRAC_ONE);
        int64_t deadline = 1 + (int64_t)(t_splitmix(&rng) >> (1 + (r >> 16) % 63));
        /* a run that began on time or up to a few periods late, and took
           up to a few periods, or up to 2**40 of them, or one that reaches
           the clock's end */
        uint64_t periods = r & 0x40000000 ? UINT64_C(1) << (r >> 32) % 41 : 1 + (r >> 24) % 5;
        uint64_t span = (uint64_t)period > UINT64_MAX / periods ? UINT64_MAX
                                                                 : (uint64_t)period * periods;
        if (span > (uint64_t)(HWT_NEVER - deadline) / 4)
            span = (uint64_t)(HWT_NEVER - deadline) / 4;
        int64_t start = deadline + (int64_t)(t_splitmix(&rng) % (span + 1));
        int64_t end = start + (int64_t)(t_splitmix(&rng) % (span + 1));
        check_grid(deadline, behind, period, frac, missed, start, end);
    }
    /* runs of 2**50 to 2**63 periods of a few ns, up to the clock's end,
       where doubles lose whole periods */
    for (int i = 0; i < 200000; i++) {
        uint64_t r = t_splitmix(&rng);
        int missed = (int)(r % 3);
        int64_t period = 1 + (int64_t)((r >> 2) % 4);
        uint32_t frac = r & 0x40 ? 0 : (uint32_t)(t_splitmix(&rng) % FRAC_ONE);
        uint32_t behind = r & 0x80 ? 0 : (uint32_t)(t_splitmix(&rng) % FRAC_ONE);
        int64_t deadline = 1 + (int64_t)(t_splitmix(&rng) >> (1 + (r >> 8) % 63));
        int64_t end = deadline + (int64_t)(t_splitmix(&rng) % (uint64_t)(HWT_NEVER - deadline));
        int64_t start = deadline + (int64_t)(t_splitmix(&rng) % (uint64_t)(end - deadline + 1));
        check_grid(deadline, behind, period, frac, missed, start, end);
    }
    check_grid(4, 0, 1, 0, HWT_MISSED_SKIP, INT64_C(1) << 62, INT64_C(1) << 62);
    check_grid(4, 0, 1, 1, HWT_MISSED_SKIP, INT64_C(1) << 62, HWT_NEVER - 1);
    /* 1 / 60 s, as new_periodic() reads the float: 16666666 ns and the
       fraction, with the first deadline a whole ns after its grid point */
    double exact = 1.0 / 60 * 1e9;
    int64_t ns = (int64_t)exact;
    uint32_t frac = (uint32_t)((exact - (double)ns) * (double)FRAC_ONE + 0.5);
    for (int missed = 0; missed < 3; missed++) {
        uint32_t behind = (uint32_t)(FRAC_ONE - frac);
        int64_t deadline = ns + 1;
        bool again;
        for (int k = 2; k <= 216000; k++) /* each run ends on time */
            deadline = hwt_periodic_next(deadline, &behind, ns, frac, missed, deadline, deadline,
                                         &again);
        if (deadline != INT64_C(3600000000000)) {
            failures++;
            fprintf(stderr, "grid: the 216,000th run of 1 / 60 s (policy %d) at %" PRId64 "\n",
                    missed, deadline);
        }
    }
    printf("edge_test: grid: the exact grid's next run, against the reference\n");
}

int main(int argc, char **argv)
{
    uint64_t seed;
    if (argc > 1) {
        seed = strtoull(argv[1], NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
    }
    printf("edge_test: seed %" PRIu64 "\n", seed);
    boundaries();
    far(seed);
    stop_states();
    grid(seed);
    return failures != 0;
}
