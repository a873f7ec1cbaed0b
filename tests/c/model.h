/*
 * model.h: a reference model of the hwtimer C core and the checks that hold
 * src/hwt.c to it, shared by model_test.c (seeded random sequences) and
 * fuzz_core.c (libFuzzer input).
 *
 * The timer runs in manual mode on a fake clock.  An operation source (a
 * seeded generator, or the fuzzer's bytes) picks a configuration and then a
 * sequence of schedules (one-shot and periodic), cancels, resets and clock
 * advances; after every step the core's deliveries, states and counters
 * must equal the model's.  The model is a plain array of items: an item is
 * due at the first tick that ends at or after its deadline (tick
 * ceil(deadline / tick) - 1, 0 for a deadline <= 0), or at the wheel's
 * tick when it was linked if that is later, is delivered by the first
 * advance whose clock has reached the end of that tick, and within one
 * advance and one sink expiries come by tick, then in link order.  An
 * advance links the items reset while in a bucket first (in reset order),
 * then the queued ones (in the order they were queued).
 * A delivered periodic item is "run" at once: the clock moves by a chosen
 * run time, a cancel, reset or failure may come during the run, and the
 * re-arm must give the deadline and result that m_next() computes.
 * A wide run has thousands of items and schedules, cancels or resets many
 * at once, so that one tick expires more than the core's walk takes at a
 * time or hands over in one slice.
 *
 * Include it from one file only; define MODEL_ON_FAILURE() first to choose
 * what a mismatch does after it has been printed (default: exit(1)).
 */
#ifndef HWT_MODEL_H
#define HWT_MODEL_H

#include "hwt.h"
#include "test_util.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MODEL_ON_FAILURE
#define MODEL_ON_FAILURE() exit(1)
#endif

#define M_MAGIC       0x6877744du /* marks an item that is ours */
#define M_TRACE       32          /* operations shown on a mismatch */
#define M_CLOCK_LIMIT (INT64_C(1) << 62)

/* ---- where the operations come from ---- */

/* Either a splitmix64 generator or the fuzzer's bytes, read as needed. */
typedef struct m_source {
    const uint8_t *data; /* borrowed; NULL: use the generator */
    size_t len, pos;
    uint64_t rng;
    bool exhausted; /* the bytes ran out: the run ends after this step */
} m_source;

static inline void m_source_seed(m_source *src, uint64_t seed)
{
    memset(src, 0, sizeof(*src));
    src->rng = seed;
}

static inline void m_source_bytes(m_source *src, const uint8_t *data, size_t len)
{
    memset(src, 0, sizeof(*src));
    src->data = data;
    src->len = len;
}

/* Returns a value in [0, n); n > 0.  From bytes it reads as few as cover
   n, little-endian, and returns 0 once they have run out. */
static uint64_t m_below(m_source *src, uint64_t n)
{
    if (n <= 1)
        return 0;
    if (!src->data)
        return t_splitmix(&src->rng) % n;
    uint64_t v = 0;
    unsigned shift = 0;
    for (uint64_t span = n - 1; span; span >>= 8, shift += 8) {
        if (src->pos >= src->len) {
            src->exhausted = true;
            return 0;
        }
        v |= (uint64_t)src->data[src->pos++] << shift;
    }
    return v % n;
}

/* ---- the model ---- */

/* Where an item is, as the model sees it. */
enum {
    M_FREE = 0,     /* ours: never scheduled, delivered, or rejected */
    M_LIVE = 1,     /* owned by the timer, neither expired nor cancelled */
    M_CANCELLED = 2 /* cancel() returned 1; delivered back at the next advance */
};

typedef struct m_item {
    uint32_t magic; /* before the timeout, so that finding the item matters */
    uint32_t id;
    hwt_timeout to;
    int where;
    bool cancellable;    /* a cancel() is legal: it was scheduled with HWT_OK */
    bool transferred;    /* the model has fixed its due tick */
    int target;          /* 0: the default sink, 1: the second sink */
    int64_t deadline;    /* relative ns, as the core must have computed it */
    int64_t due;         /* the tick it expires at, once transferred */
    uint64_t queued;     /* when it was queued (scheduled or re-armed) */
    uint64_t relink;     /* reset while in a bucket: the reset's order, else 0 */
    uint64_t seq;        /* link order, fixed by the advance that links it */
    uint64_t seen_stamp; /* the delivery check that last saw it */
    int64_t period;      /* > 0: periodic */
    int missed;          /* its HWT_MISSED_* */
    bool delivered;      /* periodic, or one-shot to an ends_once sink, delivered
                            by the last advance: to run */
    bool linked_never;   /* linked (transferred) with deadline HWT_NEVER */
    bool catch_up;       /* periodic: its next run is the one its last re-arm
                            asked for at once (HWT_EAGAIN), not reset since */
} m_item;

#define m_item_of(tp) ((m_item *)(void *)((char *)(tp) - offsetof(m_item, to)))

typedef struct m_run {
    m_source *src;
    const char *what; /* how to reproduce, printed on a mismatch */
    hwt_config cfg;
    uint32_t wheel; /* ticks_per_wheel after rounding */
    hwt_timer *t;   /* owned */
    hwt_sink sink2;
    bool sink2_ready, sink2_closed;
    int64_t clock; /* the fake clock's reading */
    int64_t start;
    int64_t last_ret; /* what the last advance returned */
    int64_t tick;     /* the wheel's tick as the model has it */
    int64_t max_jump; /* ns: keeps the ticks one advance walks bounded */
    m_item **items;   /* owned */
    m_item **by_addr; /* owned: the items again, by address, for m_owner */
    size_t nitems;
    uint64_t seq, stamp, queue_order, reset_order;
    uint64_t resets, reruns; /* resets that re-armed, periodic runs re-armed */
    uint64_t scheduled, expired, cancelled, rejected;
    int64_t pending;  /* M_LIVE and M_CANCELLED items */
    m_item **scratch; /* owned: nitems + 1 entries */
    size_t nscratch;
    size_t step;
    char trace[M_TRACE][120];
    size_t ntrace;
} m_run;

static void m_trace(m_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void m_trace(m_run *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->trace[r->ntrace++ % M_TRACE], sizeof(r->trace[0]), fmt, ap);
    va_end(ap);
}

static void m_fail(m_run *r, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
static void m_fail(m_run *r, int line, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "\nMODEL MISMATCH (model.h:%d) at step %zu: ", line, r->step);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "\n  run: %s\n  config: tick_ns=%" PRId64 " ticks_per_wheel=%" PRIu32
            " max_pending=%" PRId64 " wake_every_tick=%d items=%zu\n"
            "  clock=%" PRId64 " start=%" PRId64 " (rel %" PRId64 ") model tick=%" PRId64 "\n",
            r->what ? r->what : "?", r->cfg.tick_ns, r->wheel, r->cfg.max_pending,
            (int)r->cfg.wake_every_tick, r->nitems, r->clock, r->start, r->clock - r->start,
            r->tick);
    size_t first = r->ntrace > M_TRACE ? r->ntrace - M_TRACE : 0;
    fprintf(stderr, "  last operations, oldest first:\n");
    for (size_t i = first; i < r->ntrace; i++)
        fprintf(stderr, "    %s\n", r->trace[i % M_TRACE]);
    fflush(stderr);
    MODEL_ON_FAILURE();
    abort();
}

#define M_CHECK(r, cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond))                                                                               \
            m_fail((r), __LINE__, __VA_ARGS__);                                                    \
    } while (0)

static int64_t m_clock_fn(void *ctx)
{
    return ((m_run *)ctx)->clock;
}

static inline int64_t m_rel(const m_run *r)
{
    return r->clock - r->start;
}

/* The tick the core reaches after advancing to relative time `rel`. */
static inline int64_t m_tick_after(const m_run *r, int64_t rel)
{
    int64_t reached = rel < r->cfg.tick_ns ? 0 : rel / r->cfg.tick_ns;
    return reached > r->tick ? reached : r->tick;
}

/* Checks the core's counters against the model's. */
static void m_check_counts(m_run *r)
{
    hwt_stats st;
    hwt_timer_stats(r->t, &st);
    int64_t pending = hwt_timer_pending(r->t);
    M_CHECK(r, pending == r->pending, "hwt_timer_pending %" PRId64 ", model %" PRId64, pending,
            r->pending);
    M_CHECK(r, st.pending == r->pending, "stats.pending %" PRId64 ", model %" PRId64, st.pending,
            r->pending);
    M_CHECK(r, st.scheduled == r->scheduled, "stats.scheduled %" PRIu64 ", model %" PRIu64,
            st.scheduled, r->scheduled);
    M_CHECK(r, st.expired == r->expired, "stats.expired %" PRIu64 ", model %" PRIu64, st.expired,
            r->expired);
    M_CHECK(r, st.cancelled == r->cancelled, "stats.cancelled %" PRIu64 ", model %" PRIu64,
            st.cancelled, r->cancelled);
    M_CHECK(r, st.rejected == r->rejected, "stats.rejected %" PRIu64 ", model %" PRIu64,
            st.rejected, r->rejected);
}

static int m_cmp_addr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(m_item *const *)a, y = (uintptr_t)*(m_item *const *)b;
    return (x > y) - (x < y);
}

/* Returns the item a delivered timeout belongs to, failing on a stranger. */
static m_item *m_owner(m_run *r, hwt_timeout *to, const char *where)
{
    M_CHECK(r, to != NULL, "%s: NULL timeout in a list", where);
    m_item *it = m_item_of(to);
    bool ours = bsearch(&it, r->by_addr, r->nitems, sizeof(*r->by_addr), m_cmp_addr) != NULL;
    M_CHECK(r, ours && it->magic == M_MAGIC, "%s: %p is not one of the test's timeouts", where,
            (void *)to);
    return it;
}

/* Walks a delivered or returned list into r->scratch.  Returns its length;
   a list longer than the item count (a cycle, a duplicate) fails. */
static size_t m_walk(m_run *r, hwt_timeout *list, const char *where)
{
    size_t n = 0;
    for (hwt_timeout *to = list; to; to = hwt_timeout_of(to->link.next)) {
        M_CHECK(r, n < r->nitems, "%s: list longer than the %zu items (cycle or duplicate)", where,
                r->nitems);
        r->scratch[n++] = m_owner(r, to, where);
    }
    return n;
}

/* Takes a sink's list, sometimes via hwt_sink_put_back in two pieces and a
   second take, which must give back the very same list. */
static size_t m_take(m_run *r, hwt_sink *s, const char *where)
{
    hwt_timeout *list = hwt_sink_take(s);
    size_t n = m_walk(r, list, where);
    if (n >= 2 && m_below(r->src, 4) == 0) {
        size_t cut = 1 + (size_t)m_below(r->src, n - 1);
        hwt_timeout *tail = &r->scratch[cut]->to;
        r->scratch[cut - 1]->to.link.next = NULL;
        hwt_sink_put_back(s, tail);
        hwt_sink_put_back(s, list);
        hwt_timeout *again = hwt_sink_take(s);
        size_t i = 0;
        for (hwt_timeout *to = again; to; to = hwt_timeout_of(to->link.next), i++)
            M_CHECK(r, i < n && to == &r->scratch[i]->to,
                    "%s: hwt_sink_put_back then take changed the list at position %zu", where, i);
        M_CHECK(r, i == n, "%s: put back %zu timeouts, took %zu", where, n, i);
    }
    return n;
}

/* Checks one sink's list after an advance to relative time `rel`: every
   entry is an expected delivery seen once; expiries come by due tick, and
   in scheduling order within one tick and one target. */
/* Where a list came from. */
enum { M_FROM_DEFAULT, M_FROM_SECOND, M_FROM_RELEASED };

static void m_check_list(m_run *r, size_t n, int from, int64_t rel, const char *where)
{
    int64_t last_due = INT64_MIN;
    int64_t last_due_of[2] = {INT64_MIN, INT64_MIN};
    uint64_t last_seq_of[2] = {0, 0};
    for (size_t i = 0; i < n; i++) {
        m_item *it = r->scratch[i];
        uint32_t state = atomic_load(&it->to.state);
        M_CHECK(r, it->seen_stamp != r->stamp, "%s: item %u delivered twice", where, it->id);
        it->seen_stamp = r->stamp;
        if (it->where == M_CANCELLED) {
            M_CHECK(r, from == M_FROM_RELEASED, "%s: cancelled item %u delivered, not released",
                    where, it->id);
            M_CHECK(r, state == HWT_CANCELLED, "%s: cancelled item %u delivered with state %u",
                    where, it->id, state);
            continue;
        }
        M_CHECK(r, it->where == M_LIVE, "%s: item %u delivered but the model holds it free", where,
                it->id);
        M_CHECK(r, it->transferred && it->due < rel / r->cfg.tick_ns,
                "%s: item %u (deadline %" PRId64 ", due tick %" PRId64
                ") expired early: clock rel %" PRId64,
                where, it->id, it->deadline, it->due, rel);
        M_CHECK(r, it->deadline <= rel, "%s: item %u deadline %" PRId64 " after now %" PRId64,
                where, it->id, it->deadline, rel);
        int routed = it->target == 0   ? M_FROM_DEFAULT
                     : r->sink2_closed ? M_FROM_RELEASED
                                       : M_FROM_SECOND;
        /* a periodic one runs, unless its sink is gone: it ends cancelled;
           so does a one-shot bound for a sink with ends_once */
        bool ended_by_consumer = it->period || (it->target == 1 && r->sink2.ends_once);
        uint32_t expect = !ended_by_consumer          ? HWT_EXPIRED
                          : routed == M_FROM_RELEASED ? HWT_CANCELLED
                                                      : HWT_RUNNING;
        M_CHECK(r, state == expect, "%s: expired item %u has state %u, expected %u", where, it->id,
                state, expect);
        M_CHECK(r, hwt_timeout_periodic(&it->to) == (it->period != 0),
                "%s: item %u (period %" PRId64 ") delivered with the periodic flag %s", where,
                it->id, it->period, hwt_timeout_periodic(&it->to) ? "set" : "clear");
        M_CHECK(r, routed == from, "%s: item %u (target %d) delivered to the wrong sink", where,
                it->id, it->target);
        M_CHECK(r, it->due >= last_due,
                "%s: item %u due at tick %" PRId64 " delivered after one due at %" PRId64, where,
                it->id, it->due, last_due);
        last_due = it->due;
        int k = it->target;
        M_CHECK(r, it->due > last_due_of[k] || it->seq > last_seq_of[k],
                "%s: item %u (seq %" PRIu64 ") delivered after seq %" PRIu64
                " of the same tick %" PRId64,
                where, it->id, it->seq, last_seq_of[k], it->due);
        last_due_of[k] = it->due;
        last_seq_of[k] = it->seq;
    }
}

/* ---- operations ---- */

static m_item *m_pick(m_run *r, int where)
{
    size_t n = r->nitems, first = (size_t)m_below(r->src, n);
    for (size_t i = 0; i < n; i++) {
        m_item *it = r->items[(first + i) % n];
        if (it->where == where)
            return it;
    }
    return NULL;
}

static int64_t m_pick_delay(m_run *r)
{
    m_source *src = r->src;
    int64_t tick = r->cfg.tick_ns, rev = tick * (int64_t)r->wheel, rel = m_rel(r);
    switch (m_below(src, 14)) {
    case 0:
        return -(int64_t)m_below(src, 3 * (uint64_t)tick + 1);
    case 12: /* anything from now to centuries: every level of the wheel */
    case 13:
        return (int64_t)m_below(src, UINT64_C(1) << m_below(src, 63));
    case 1:
        return m_below(src, 2) ? 0 : INT64_MIN;
    case 2:
        return 1 + (int64_t)m_below(src, (uint64_t)tick); /* within a tick */
    case 3:                                               /* on and beside tick boundaries */
        return (int64_t)m_below(src, 4 * (uint64_t)r->wheel + 2) * tick - 1 +
               (int64_t)m_below(src, 3);
    case 4:
    case 5:
        return 1 + (int64_t)m_below(src, (uint64_t)rev);
    case 6: /* several turns of the wheel */
        return 1 + (int64_t)m_below(src, 8 * (uint64_t)rev);
    case 7: { /* never, or as good as */
        static const int64_t far[] = {HWT_NEVER, HWT_NEVER - 1, INT64_MAX / 2, INT64_C(1) << 62};
        uint64_t k = m_below(src, 6);
        if (k < 4)
            return far[k];
        return HWT_NEVER - rel - (int64_t)(k - 4); /* where the deadline saturates */
    }
    case 8: /* at the time the last advance said work would be due */
        if (r->last_ret != HWT_NEVER && r->last_ret - r->clock > -tick)
            return r->last_ret - r->clock - 1 + (int64_t)m_below(src, 3);
        return tick;
    default:
        return 1 + (int64_t)m_below(src, 4 * (uint64_t)tick);
    }
}

/* `deadline` (relative), or HWT_NEVER if the tick that runs it ends at or
   past HWT_NEVER on the clock: never reached.  In 128 bits. */
static int64_t m_within_clock(const m_run *r, int64_t deadline)
{
    if (deadline <= 0 || deadline == HWT_NEVER)
        return deadline;
    __int128 tick = r->cfg.tick_ns;
    __int128 end = (__int128)r->start + ((__int128)(deadline - 1) / tick + 1) * tick;
    return end >= (__int128)HWT_NEVER ? HWT_NEVER : deadline;
}

/* The deadline after `rel` by `delay`, saturated, as the core reads one. */
static int64_t m_deadline_after(const m_run *r, int64_t rel, int64_t delay)
{
    return delay <= 0                ? rel
           : delay >= HWT_NEVER - rel ? HWT_NEVER
                                      : m_within_clock(r, rel + delay);
}

/* a + b in 128 bits, saturated at HWT_NEVER. */
static int64_t m_sat(__int128 v)
{
    return v >= (__int128)HWT_NEVER ? HWT_NEVER : (int64_t)v;
}

/* The reference of hwt_periodic_next: a run at grid point `d` that began
   at `start` and ended at `end` (relative ns).  Written from API.md's
   words, apart from the core's arithmetic. */
static int64_t m_next(const m_item *it, int64_t d, int64_t start, int64_t end, bool *again)
{
    __int128 p = it->period;
    *again = false;
    if (it->missed == HWT_MISSED_BURST) { /* every grid point, late ones at once */
        int64_t next = m_sat((__int128)d + p);
        *again = next <= end;
        return next;
    }
    if (it->missed == HWT_MISSED_DELAY) {
        /* late by a period: the grid restarts from this run's start; a
           run that overran the next point: once now, at its end, and the
           grid restarts from that run (whose deadline is its start) */
        bool late = (__int128)start - d >= p;
        int64_t next = m_sat((late ? (__int128)start : (__int128)d) + p);
        if (next > end)
            return next;
        *again = true;
        return end;
    }
    /* skip: the smallest d + k * p (k >= 1) after end */
    __int128 k = (__int128)end < (__int128)d + p ? 1 : ((__int128)end - d) / p + 1;
    return m_sat((__int128)d + k * p);
}

static int m_pick_missed(m_run *r)
{
    return (int)m_below(r->src, 3);
}

static int64_t m_pick_period(m_run *r)
{
    int64_t tick = r->cfg.tick_ns, rev = tick * (int64_t)r->wheel;
    switch (m_below(r->src, 6)) {
    case 0:
        return 1 + (int64_t)m_below(r->src, (uint64_t)tick); /* within a tick */
    case 1:
        return tick * (1 + (int64_t)m_below(r->src, 4));
    case 2:
        return 1 + (int64_t)m_below(r->src, 2 * (uint64_t)rev);
    case 3:
        return m_below(r->src, 2) ? HWT_NEVER : HWT_NEVER / 2;
    default:
        return 1 + (int64_t)m_below(r->src, 8 * (uint64_t)tick);
    }
}

/* Schedules free item `it` after `delay`, one-shot or periodic (every
   missed policy), to either sink. */
static void m_schedule(m_run *r, m_item *it, int64_t delay, bool periodic)
{
    int64_t period = periodic ? m_pick_period(r) : 0;
    int missed = periodic ? m_pick_missed(r) : HWT_MISSED_SKIP;
    int target = r->sink2_ready && m_below(r->src, 3) == 0;
    it->target = target;
    it->to.sink = target ? &r->sink2 : hwt_timer_default_sink(r->t);
    int64_t rel = m_rel(r);
    int64_t deadline = m_deadline_after(r, rel, delay);
    bool reject = r->cfg.max_pending > 0 && r->pending + 1 > r->cfg.max_pending;
    int rc = periodic ? hwt_timer_schedule_periodic(r->t, &it->to, delay, missed)
                      : hwt_timer_schedule(r->t, &it->to, delay);
    m_trace(r,
            "schedule item %u delay %" PRId64 " period %" PRId64 " missed %d target %d -> %d "
            "(deadline %" PRId64 ")",
            it->id, delay, period, missed, target, rc, hwt_timeout_deadline(&it->to));
    M_CHECK(r, hwt_timeout_deadline(&it->to) == deadline,
            "schedule: deadline %" PRId64 ", model %" PRId64 " (rel %" PRId64 ", delay %" PRId64
            ")",
            hwt_timeout_deadline(&it->to), deadline, rel, delay);
    if (reject) {
        M_CHECK(r, rc == HWT_EREJECTED, "schedule: returned %d past max_pending, expected %d", rc,
                HWT_EREJECTED);
        r->rejected++;
        it->cancellable = false; /* never the timer's: a cancel would be misuse */
        return;
    }
    M_CHECK(r, rc == HWT_OK, "schedule: returned %d, expected HWT_OK", rc);
    it->where = M_LIVE;
    it->cancellable = true;
    it->transferred = false;
    it->deadline = deadline;
    it->period = period;
    it->missed = missed;
    it->catch_up = false;
    it->queued = ++r->queue_order;
    it->relink = 0;
    r->scheduled++;
    r->pending++;
}

static void m_op_schedule(m_run *r, bool periodic)
{
    m_item *it = m_pick(r, M_FREE);
    if (!it) {
        m_trace(r, "schedule: no free item");
        return;
    }
    m_schedule(r, it, m_pick_delay(r), periodic);
}

/* Resets a pending item: the worker relinks it at the next advance. */
static void m_reset_live(m_run *r, m_item *it, int64_t delay)
{
    it->deadline = m_deadline_after(r, m_rel(r), delay);
    it->catch_up = false; /* its next run is at the reset's deadline */
    if (it->transferred) { /* in a bucket: relinked before what is queued */
        it->relink = ++r->reset_order;
        it->transferred = false;
    }
}

/* Resets item `it` to `delay`, if it was ever scheduled. */
static void m_reset(m_run *r, m_item *it, int64_t delay)
{
    if (!it->cancellable)
        return;
    int rc = hwt_timeout_reset(&it->to, delay);
    m_trace(r, "reset item %u (model %d) delay %" PRId64 " -> %d (deadline %" PRId64 ")", it->id,
            it->where, delay, rc, hwt_timeout_deadline(&it->to));
    int expect = it->where == M_LIVE ? HWT_OK : HWT_EFINAL;
    M_CHECK(r, rc == expect, "reset of item %u (model state %d) returned %d, expected %d", it->id,
            it->where, rc, expect);
    if (rc != HWT_OK)
        return;
    m_reset_live(r, it, delay);
    r->resets++;
    M_CHECK(r, hwt_timeout_deadline(&it->to) == it->deadline,
            "reset: deadline %" PRId64 ", model %" PRId64, hwt_timeout_deadline(&it->to),
            it->deadline);
}

static void m_op_reset(m_run *r)
{
    m_item *it = r->items[m_below(r->src, r->nitems)];
    if (it->cancellable) /* a delay is drawn only for one ever scheduled */
        m_reset(r, it, m_pick_delay(r));
}

/* Cancels item `it`, or takes it back, if it was ever scheduled. */
static void m_cancel(m_run *r, m_item *it)
{
    if (!it->cancellable) {
        m_trace(r, "cancel: item %u never scheduled", it->id);
        return;
    }
    /* the take-back, too: the newest queued comes back at once */
    bool take = m_below(r->src, 2);
    int rc = take ? hwt_timeout_cancel_take(&it->to) : hwt_timeout_cancel(&it->to);
    m_trace(r, "cancel%s item %u (model %d) -> %d", take ? "_take" : "", it->id, it->where, rc);
    if (rc == HWT_TAKEN) {
        M_CHECK(r, take && it->where == M_LIVE && !it->transferred,
                "cancel of item %u (model state %d, transferred %d) took it back", it->id,
                it->where, it->transferred);
        it->where = M_FREE; /* never delivered, nor returned by stop */
        r->cancelled++;
        r->pending--;
        return;
    }
    int expect = it->where == M_LIVE ? HWT_OK : HWT_EFINAL;
    M_CHECK(r, rc == expect, "cancel of item %u (model state %d) returned %d, expected %d", it->id,
            it->where, rc, expect);
    if (rc == HWT_OK) {
        it->where = M_CANCELLED;
        r->cancelled++; /* a cancel counts at once */
        r->pending--;
    }
}

static void m_op_cancel(m_run *r)
{
    m_cancel(r, r->items[m_below(r->src, r->nitems)]);
}

/* The wide runs' operations, on many items at once, so that one tick holds
   more than the walk takes under one hold of the cancel lock or hands over
   in one slice (src/hwt.c): a burst of free items scheduled with one delay
   (a few periodic, to either sink), or a share of the items, one in 2, 8
   or 64 taken in turn, cancelled or reset with one delay. */
static void m_op_many(m_run *r)
{
    uint64_t kind = m_below(r->src, 3);
    int64_t delay = m_pick_delay(r);
    if (kind == 0) {
        size_t want = 1 + (size_t)m_below(r->src, r->nitems), done = 0;
        m_trace(r, "schedule up to %zu items, delay %" PRId64, want, delay);
        for (size_t i = 0; i < r->nitems && done < want; i++) {
            m_item *it = r->items[i];
            if (it->where == M_FREE) {
                m_schedule(r, it, delay, m_below(r->src, 8) == 0);
                done++;
            }
        }
        return;
    }
    static const size_t every[] = {2, 8, 64};
    size_t step = every[m_below(r->src, 3)], first = (size_t)m_below(r->src, step);
    m_trace(r, "%s one item in %zu from item %zu", kind == 1 ? "cancel" : "reset", step, first);
    for (size_t i = first; i < r->nitems; i += step) {
        if (kind == 1)
            m_cancel(r, r->items[i]);
        else
            m_reset(r, r->items[i], delay);
    }
}

static int64_t m_pick_jump(m_run *r)
{
    m_source *src = r->src;
    int64_t tick = r->cfg.tick_ns, rev = tick * (int64_t)r->wheel, rel = m_rel(r);
    int64_t jump;
    switch (m_below(src, 14)) {
    case 0:
        jump = 0;
        break;
    case 12: /* far: the levels above the wheel cascade on the way */
        jump = (int64_t)m_below(src, UINT64_C(1) << m_below(src, 60));
        break;
    case 13: /* onto the next tick that holds work, as a sleeping worker does */
        jump = r->last_ret != HWT_NEVER ? r->last_ret - r->clock : (int64_t)m_below(src, 1000);
        break;
    case 1:
        jump = 1 + (int64_t)m_below(src, (uint64_t)tick);
        break;
    case 2: /* onto a tick boundary, or beside it */
        jump = ((rel / tick) + 1 + (int64_t)m_below(src, 3)) * tick - rel - 1 +
               (int64_t)m_below(src, 3);
        break;
    case 3: /* to what the last advance returned */
        jump =
            r->last_ret != HWT_NEVER ? r->last_ret - r->clock - 1 + (int64_t)m_below(src, 3) : tick;
        break;
    case 4:
    case 5:
    case 6:
        jump = (int64_t)m_below(src, 4 * (uint64_t)tick);
        break;
    case 7:
        jump = (int64_t)m_below(src, 2 * (uint64_t)rev);
        break;
    case 8:
        jump = (int64_t)m_below(src, 9) * rev + (int64_t)m_below(src, 3) - 1;
        break;
    case 9: /* many turns of the wheel */
        jump = (int64_t)m_below(src, 64) * rev + (int64_t)m_below(src, (uint64_t)rev);
        break;
    case 10: /* rarely, very many */
        jump = m_below(src, 8) == 0 ? (int64_t)m_below(src, 1024) * rev : tick;
        break;
    default:
        jump = (int64_t)m_below(src, (uint64_t)tick * 16);
        break;
    }
    if (jump < 0)
        jump = 0;
    if (jump > r->max_jump)
        jump = r->max_jump;
    if (jump > M_CLOCK_LIMIT - r->clock)
        jump = 0;
    return jump;
}

/* Advances the core to `now` and checks what it delivered. */
/* Ends item `it`'s run at clock `end`: whatever came during it, then the
   re-arm, checked against m_next().  Returns whether it runs again now. */
static bool m_rearm(m_run *r, m_item *it, int64_t start, int64_t end, int during, int64_t delay)
{
    int64_t d = it->deadline, rs = start - r->start, re = end - r->start;
    if (during == 1) { /* cancelled in its run: it ends, counted at once */
        M_CHECK(r, hwt_timeout_cancel(&it->to) == HWT_OK, "cancel of running item %u failed",
                it->id);
        M_CHECK(r, hwt_timeout_cancel(&it->to) == HWT_EFINAL, "second cancel of item %u", it->id);
        r->cancelled++;
        r->pending--;
        m_check_counts(r);
    } else if (during == 2) { /* reset in its run: the next run is there */
        M_CHECK(r, hwt_timeout_reset(&it->to, delay) == HWT_OK, "reset of running item %u", it->id);
        it->deadline = m_deadline_after(r, m_rel(r), delay);
        it->catch_up = false;
    } else if (during == 3) { /* its task failed: it ends as expired */
        uint32_t s = hwt_timeout_finish(&it->to, HWT_EXPIRED);
        M_CHECK(r, s == HWT_EXPIRED, "finish of item %u gave state %u", it->id, s);
        it->where = M_FREE;
        it->delivered = false;
        r->expired++;
        r->pending--;
        return false;
    }
    int rc = hwt_timeout_rearm(&it->to, it->period, start, end, it->catch_up);
    r->reruns++;
    m_trace(r, "rearm item %u run %" PRId64 "..%" PRId64 " during %d -> %d (deadline %" PRId64 ")",
            it->id, rs, re, during, rc, hwt_timeout_deadline(&it->to));
    if (during == 1) {
        M_CHECK(r, rc == HWT_ECANCELLED, "rearm of cancelled item %u returned %d", it->id, rc);
        M_CHECK(r, atomic_load(&it->to.state) == HWT_CANCELLED, "item %u not cancelled", it->id);
        it->where = M_FREE;
        it->delivered = false;
        m_check_counts(r); /* the re-arm counted it no second time */
        return false;
    }
    bool again = false;
    /* delay's run after an overrun, which waited: its grid starts at its start */
    int64_t from = it->catch_up && it->missed == HWT_MISSED_DELAY && rs > d ? rs : d;
    if (during != 2)
        it->deadline = m_within_clock(r, m_next(it, from, rs, re, &again));
    it->catch_up = again;
    M_CHECK(r, rc == (again ? HWT_EAGAIN : HWT_OK), "rearm of item %u returned %d, model %s",
            it->id, rc, again ? "again" : "ok");
    M_CHECK(r, hwt_timeout_deadline(&it->to) == it->deadline,
            "rearm of item %u (period %" PRId64 " missed %d, run at %" PRId64 " from %" PRId64
            " to %" PRId64 "): deadline %" PRId64 ", model %" PRId64,
            it->id, it->period, it->missed, d, rs, re, hwt_timeout_deadline(&it->to), it->deadline);
    M_CHECK(r, it->deadline > d || during == 2, "item %u re-armed at or before its run", it->id);
    if (again)
        return true;
    it->delivered = false;
    it->transferred = false;
    it->relink = 0;
    it->queued = ++r->queue_order;
    return false;
}

/* Runs a delivered periodic item, and again while its policy says so:
   each run takes a chosen time on the clock, and may see a cancel, a
   reset or a failure. */
static void m_run_periodic(m_run *r, m_item *it)
{
    /* a run's length, bounded so that 4 of them stay far inside int64 */
    int64_t cap = r->max_jump < M_CLOCK_LIMIT / 8 ? r->max_jump : M_CLOCK_LIMIT / 8;
    int64_t p = it->period < cap ? it->period : cap;
    for (int runs = 0;; runs++) {
        int64_t start = r->clock, run;
        switch (m_below(r->src, 6)) {
        case 0:
            run = 0;
            break;
        case 1: /* past the next grid point, or several */
            run = p + (int64_t)m_below(r->src, 3 * (uint64_t)p + 1);
            break;
        default:
            run = (int64_t)m_below(r->src, (uint64_t)p);
            break;
        }
        if (run > r->max_jump)
            run = r->max_jump;
        if (run > M_CLOCK_LIMIT - r->clock || runs > 64)
            run = 0; /* a burst that would not catch up: let it */
        r->clock += run;
        uint64_t k = m_below(r->src, 16);
        int during = k == 0 ? 1 : k == 1 ? 2 : k == 2 ? 3 : 0;
        int64_t delay = during == 2 ? m_pick_delay(r) : 0;
        if (runs > 64 && during == 0)
            during = 1; /* end a burst that does not catch up */
        if (!m_rearm(r, it, start, r->clock, during, delay))
            return;
        if (it->missed == HWT_MISSED_DELAY && m_below(r->src, 4) == 0) {
            /* due again, but other work waits: back on the wheel, due
               now; it runs at a later advance, past its deadline, and
               its grid starts there (it->catch_up) */
            int rc = hwt_timeout_requeue(&it->to);
            m_trace(r, "requeue due item %u -> %d", it->id, rc);
            M_CHECK(r, rc == HWT_OK, "requeue of due item %u returned %d", it->id, rc);
            M_CHECK(r, hwt_timeout_deadline(&it->to) == it->deadline,
                    "requeue of due item %u: deadline %" PRId64 ", model %" PRId64, it->id,
                    hwt_timeout_deadline(&it->to), it->deadline);
            it->delivered = false;
            it->transferred = false;
            it->relink = 0;
            it->queued = ++r->queue_order;
            return;
        }
    }
}

/* Runs, or does not, a one-shot item delivered RUNNING to the second sink
   (ends_once): before its run begins a cancel or a reset still wins (and
   takes it back out of `expired`), or its consumer ends it unrun; once
   hwt_timeout_begin() has made it EXPIRED, neither does. */
static void m_run_once(m_run *r, m_item *it)
{
    uint64_t k = m_below(r->src, 6);
    m_trace(r, "deliver item %u to ends_once: %s", it->id,
            k == 0   ? "cancel"
            : k == 1 ? "reset"
            : k == 2 ? "finish"
                     : "run");
    it->delivered = false;
    if (k == 1 && r->cfg.max_pending > 0 && r->pending >= r->cfg.max_pending) {
        /* pending again past the bound: refused as a schedule would be,
           and it runs as delivered */
        M_CHECK(r, hwt_timeout_reset(&it->to, m_pick_delay(r)) == HWT_EFINAL,
                "reset of delivered item %u past max_pending", it->id);
        r->rejected++;
        k = 3;
    }
    if (k == 0) {
        M_CHECK(r, hwt_timeout_cancel(&it->to) == HWT_OK, "cancel of delivered item %u failed",
                it->id);
        M_CHECK(r, hwt_timeout_cancel(&it->to) == HWT_EFINAL, "second cancel of item %u", it->id);
        r->expired--;
        r->cancelled++;
        m_check_counts(r);
        uint32_t s = hwt_timeout_begin(&it->to);
        M_CHECK(r, s == HWT_CANCELLED, "begin of cancelled item %u gave %u", it->id, s);
        it->where = M_FREE;
    } else if (k == 1) {
        int64_t delay = m_pick_delay(r);
        M_CHECK(r, hwt_timeout_reset(&it->to, delay) == HWT_OK, "reset of delivered item %u",
                it->id);
        it->deadline = m_deadline_after(r, m_rel(r), delay);
        r->expired--;
        r->pending++;
        m_check_counts(r); /* pending again from the reset on */
        uint32_t s = hwt_timeout_begin(&it->to);
        M_CHECK(r, s == HWT_RUNNING_RESET, "begin of reset item %u gave %u", it->id, s);
        int rc = hwt_timeout_requeue(&it->to);
        M_CHECK(r, rc == HWT_OK, "requeue of reset item %u returned %d", it->id, rc);
        M_CHECK(r, hwt_timeout_deadline(&it->to) == it->deadline,
                "requeue of item %u: deadline %" PRId64 ", model %" PRId64, it->id,
                hwt_timeout_deadline(&it->to), it->deadline);
        it->transferred = false;
        it->relink = 0;
        it->queued = ++r->queue_order;
    } else if (k == 2) { /* its consumer went away: it will not run */
        uint32_t s = hwt_timeout_finish(&it->to, HWT_CANCELLED);
        M_CHECK(r, s == HWT_CANCELLED, "finish of delivered item %u gave %u", it->id, s);
        r->expired--;
        r->cancelled++;
        it->where = M_FREE;
    } else {
        uint32_t s = hwt_timeout_begin(&it->to);
        M_CHECK(r, s == HWT_EXPIRED, "begin of delivered item %u gave %u", it->id, s);
        M_CHECK(r, hwt_timeout_cancel(&it->to) == HWT_EFINAL, "cancel of begun item %u", it->id);
        M_CHECK(r, hwt_timeout_reset(&it->to, 1) == HWT_EFINAL, "reset of begun item %u", it->id);
        it->where = M_FREE;
    }
    m_check_counts(r);
}

/* Whether the core would link `a` before `b` (both pending): linked ones
   by link order, then reset ones by reset order, then queued ones. */
static bool m_linked_before(const m_item *a, const m_item *b)
{
    int ka = a->transferred ? 0 : a->relink ? 1 : 2, kb = b->transferred ? 0 : b->relink ? 1 : 2;
    uint64_t oa = ka == 0 ? a->seq : ka == 1 ? a->relink : a->queued;
    uint64_t ob = kb == 0 ? b->seq : kb == 1 ? b->relink : b->queued;
    return ka < kb || (ka == kb && oa < ob);
}

/* Links what is waiting: reset items in reset order, then queued ones in
   queue order. */
static int m_cmp_waiting(const void *a, const void *b)
{
    const m_item *x = *(m_item *const *)a, *y = *(m_item *const *)b;
    return m_linked_before(x, y) ? -1 : m_linked_before(y, x) ? 1 : 0;
}

static void m_link_waiting(m_run *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = r->items[i];
        if (it->where == M_LIVE && !it->transferred)
            r->scratch[n++] = it;
    }
    qsort(r->scratch, n, sizeof(*r->scratch), m_cmp_waiting);
    for (size_t i = 0; i < n; i++) {
        m_item *next = r->scratch[i];
        int64_t calc = next->deadline <= 0 ? 0 : (next->deadline - 1) / r->cfg.tick_ns;
        next->due = calc > r->tick ? calc : r->tick;
        next->transferred = true;
        next->linked_never = next->deadline == HWT_NEVER;
        next->relink = 0;
        next->seq = ++r->seq;
    }
}

static void m_advance_to(m_run *r, int64_t now)
{
    int64_t rel = now - r->start;
    /* the core links waiting timeouts first, at the wheel's current tick */
    m_link_waiting(r);
    int64_t ret = hwt_timer_advance(r->t, now);
    r->stamp++;
    size_t n_default = m_take(r, hwt_timer_default_sink(r->t), "default sink");
    m_check_list(r, n_default, M_FROM_DEFAULT, rel, "default sink");
    /* the default sink's entries are marked seen: reuse the scratch */
    size_t n_released = m_walk(r, hwt_timer_take_released(r->t), "released");
    m_check_list(r, n_released, M_FROM_RELEASED, rel, "released");
    size_t n_second = 0;
    if (r->sink2_ready) {
        /* the default sink's entries are marked seen: reuse the scratch */
        n_second = m_take(r, &r->sink2, "second sink");
        m_check_list(r, n_second, M_FROM_SECOND, rel, "second sink");
    }
    m_trace(r, "advance to rel %" PRId64 " -> %" PRId64 ", delivered %zu + %zu", rel, ret,
            n_default, n_second);

    /* everything expected was seen; the model moves on */
    int64_t reached = rel < r->cfg.tick_ns ? -1 : rel / r->cfg.tick_ns - 1;
    int64_t min_due = INT64_MAX;
    size_t live = 0;
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = r->items[i];
        if (it->where == M_CANCELLED) {
            M_CHECK(r, it->seen_stamp == r->stamp,
                    "item %u cancelled before this advance was not delivered back", it->id);
            it->where = M_FREE;
        } else if (it->where == M_LIVE && it->due <= reached) {
            M_CHECK(r, it->seen_stamp == r->stamp,
                    "item %u (deadline %" PRId64 ", due tick %" PRId64 ", seq %" PRIu64
                    ") was not delivered by an advance to rel %" PRId64,
                    it->id, it->deadline, it->due, it->seq, rel);
            if (it->period && !(it->target == 1 && r->sink2_closed)) {
                it->delivered = true; /* runs below, then comes back */
                continue;
            }
            bool once_live = !it->period && it->target == 1 && r->sink2.ends_once;
            if (once_live && !r->sink2_closed) {
                it->delivered = true; /* runs below; expired until then */
                r->expired++;
                r->pending--;
                continue;
            }
            it->where = M_FREE;
            if (it->period || once_live)
                r->cancelled++; /* its sink is gone */
            else
                r->expired++;
            r->pending--;
        } else if (it->where == M_LIVE && it->deadline != HWT_NEVER) {
            live++; /* one that may fall due some day */
            if (it->due < min_due)
                min_due = it->due;
        }
    }
    r->tick = m_tick_after(r, rel);
    r->last_ret = ret;

    hwt_stats st;
    hwt_timer_stats(r->t, &st);
    M_CHECK(r, st.tick == r->tick, "stats.tick %" PRId64 ", model %" PRId64, st.tick, r->tick);
    int64_t tick = r->cfg.tick_ns, next_end = r->start + (r->tick + 1) * tick;
    if (r->cfg.wake_every_tick) {
        M_CHECK(r, ret == next_end,
                "advance returned %" PRId64 ", ticking every tick expects %" PRId64, ret, next_end);
    } else if (!live) {
        M_CHECK(r, ret == HWT_NEVER,
                "advance returned %" PRId64 " with nothing pending that ever falls due", ret);
    } else {
        /* a due tick whose end is past int64's clock may read as never */
        if (min_due < (INT64_MAX - r->start) / tick - 1)
            M_CHECK(r, ret != HWT_NEVER, "advance returned HWT_NEVER with %zu pending", live);
        M_CHECK(r, ret == HWT_NEVER || (ret >= next_end && (ret - r->start) % tick == 0),
                "advance returned %" PRId64 ": not a tick end at or after %" PRId64, ret, next_end);
        if (min_due < (M_CLOCK_LIMIT - r->start) / tick)
            M_CHECK(r, ret <= r->start + (min_due + 1) * tick,
                    "advance returned %" PRId64 ", after the end %" PRId64 " of due tick %" PRId64,
                    ret, r->start + (min_due + 1) * tick, min_due);
    }
    for (size_t i = 0; i < r->nitems; i++) {
        if (r->items[i]->delivered && r->items[i]->period)
            m_run_periodic(r, r->items[i]);
        else if (r->items[i]->delivered)
            m_run_once(r, r->items[i]);
    }
}

static void m_op_advance(m_run *r)
{
    uint64_t kind = m_below(r->src, 20);
    if (kind == 0) { /* an older `now`: only queued work is processed */
        int64_t back = (int64_t)m_below(r->src, 4 * (uint64_t)r->cfg.tick_ns);
        m_advance_to(r, r->clock - back);
    } else if (kind == 1) { /* a `now` ahead of the clock */
        m_advance_to(r, r->clock + m_pick_jump(r));
    } else {
        r->clock += m_pick_jump(r);
        m_advance_to(r, r->clock);
    }
}

/* ---- what the core shows of its wheel ---- */

/* Where the model says a timeout due at tick `due` sits in the wheel at
   tick r->tick: level 0 for the ticks of the current turn, else the level
   of the highest bit in which `due` and the tick differ, 6 bits a level
   (src/wheel.h). */
static void m_place(const m_run *r, int64_t due, unsigned *level, uint64_t *slot)
{
    unsigned bits = (unsigned)__builtin_ctz(r->wheel);
    uint64_t differ = (uint64_t)due ^ (uint64_t)r->tick;
    if (!(differ >> bits)) {
        *level = 0;
        *slot = (uint64_t)due & (r->wheel - 1);
        return;
    }
    *level = (63 - (unsigned)__builtin_clzll(differ) - bits) / 6 + 1;
    *slot = ((uint64_t)due >> (bits + 6 * (*level - 1))) & 63;
}

/* Whether the core holds `it` in its wheel: linked and not yet expired or
   released; a reset one waits at its old place until the next advance. */
static bool m_in_wheel(const m_item *it)
{
    return it->where != M_FREE && !it->delivered && (it->transferred || it->relink);
}

/* Whether the soonest call must give `a` before `b`. */
static bool m_sooner(const m_item *a, const m_item *b)
{
    return a->deadline < b->deadline || (a->deadline == b->deadline && m_linked_before(a, b));
}

/* What hwt_timer_soonest and hwt_timer_occupancy do first, as an advance
   does: the core processes the cancels (cancelled items leave the wheel)
   and links what is waiting. */
static void m_take_waiting(m_run *r)
{
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = r->items[i];
        if (it->where == M_CANCELLED) {
            it->transferred = false;
            it->relink = 0;
        }
    }
    m_link_waiting(r);
}

/* Checks hwt_timer_occupancy against where the model places each timeout
   that is in the wheel (transferred, and not yet expired or released)
   once the core has taken what waits: every pending one. */
typedef struct m_bucket {
    unsigned level;
    uint64_t slot;
} m_bucket;

static int m_cmp_bucket(const void *a, const void *b)
{
    const m_bucket *x = a, *y = b;
    if (x->level != y->level)
        return x->level < y->level ? -1 : 1;
    return (x->slot > y->slot) - (x->slot < y->slot);
}

static void m_check_occupancy(m_run *r)
{
    hwt_occupancy occ;
    m_take_waiting(r);
    hwt_timer_occupancy(r->t, &occ);
    unsigned bits = (unsigned)__builtin_ctz(r->wheel);
    M_CHECK(r, occ.levels == 1 + (63 - bits + 5) / 6 && occ.levels <= HWT_MAX_LEVELS,
            "occupancy: %u levels for a wheel of %" PRIu32, occ.levels, r->wheel);
    M_CHECK(r, occ.tick == r->tick, "occupancy: tick %" PRId64 ", model %" PRId64, occ.tick,
            r->tick);
    uint64_t never = 0, timeouts[HWT_MAX_LEVELS] = {0}, occupied[HWT_MAX_LEVELS] = {0},
             fullest[HWT_MAX_LEVELS] = {0};
    /* each placed timeout's bucket, sorted: a bucket's timeouts side by side */
    m_bucket *placed = malloc((r->nitems + 1) * sizeof(*placed));
    M_CHECK(r, placed != NULL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = r->items[i];
        if (!m_in_wheel(it))
            continue;
        if (it->linked_never) {
            never++;
            continue;
        }
        m_place(r, it->due, &placed[n].level, &placed[n].slot);
        n++;
    }
    qsort(placed, n, sizeof(*placed), m_cmp_bucket);
    for (size_t i = 0, same = 0; i < n; i++) {
        unsigned level = placed[i].level;
        timeouts[level]++;
        same = i && !m_cmp_bucket(&placed[i - 1], &placed[i]) ? same + 1 : 1;
        occupied[level] += same == 1;
        if (same > fullest[level])
            fullest[level] = same;
    }
    free(placed);
    M_CHECK(r, occ.never == never, "occupancy: %" PRIu64 " never due, model %" PRIu64, occ.never,
            never);
    for (unsigned k = 0; k < occ.levels; k++) {
        const hwt_level_occupancy *l = &occ.level[k];
        M_CHECK(
            r, l->timeouts == timeouts[k] && l->occupied == occupied[k] && l->fullest == fullest[k],
            "occupancy of level %u: %" PRIu64 " timeouts in %" PRIu64 " buckets, fullest %" PRIu64
            "; model %" PRIu64 ", %" PRIu64 ", %" PRIu64,
            k, l->timeouts, l->occupied, l->fullest, timeouts[k], occupied[k], fullest[k]);
        M_CHECK(r,
                l->buckets == (k ? 64 : r->wheel) &&
                    l->bucket_ticks == (k ? INT64_C(1) << (bits + 6 * (k - 1)) : 1),
                "occupancy of level %u: %" PRIu64 " buckets of %" PRId64 " ticks", k, l->buckets,
                l->bucket_ticks);
    }
}

static void m_collect(void *ctx, hwt_timeout *to)
{
    m_run *r = ctx;
    r->scratch[r->nscratch++] = m_owner(r, to, "soonest");
}

/* Asks the core for the soonest pending timeouts and checks them against
   the model's pending items in deadline order, ties in scheduling order. */
static void m_op_soonest(m_run *r)
{
    size_t limit = (size_t)m_below(r->src, r->nitems + 2), found = 0;
    r->nscratch = 0;
    m_take_waiting(r);
    int rc = hwt_timer_soonest(r->t, limit, m_collect, r, &found);
    m_trace(r, "soonest %zu -> %d, %zu found", limit, rc, found);
    M_CHECK(r, rc == 0 && found == r->nscratch, "soonest returned %d, found %zu, visited %zu", rc,
            found, r->nscratch);
    size_t expect = 0;
    m_item *prev = NULL;
    r->stamp++;
    for (size_t i = 0; i < found; i++) {
        m_item *it = r->scratch[i];
        it->seen_stamp = r->stamp;
        M_CHECK(r, it->where == M_LIVE, "soonest gave item %u, which the model holds as %d", it->id,
                it->where);
        M_CHECK(r, !prev || m_sooner(prev, it),
                "soonest gave item %u (deadline %" PRId64 ", seq %" PRIu64
                ") after item %u (deadline %" PRId64 ", seq %" PRIu64 ")",
                it->id, it->deadline, it->seq, prev->id, prev->deadline, prev->seq);
        prev = it;
    }
    /* nothing left out comes before the last one given */
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = r->items[i];
        if (it->where != M_LIVE || it->delivered)
            continue;
        expect++;
        bool given = it->seen_stamp == r->stamp;
        M_CHECK(r, given || (found == limit && (!found || m_sooner(prev, it))),
                "soonest %zu left out item %u (deadline %" PRId64 ", seq %" PRIu64 ")", limit,
                it->id, it->deadline, it->seq);
    }
    M_CHECK(r, found == (limit < expect ? limit : expect), "soonest %zu found %zu of %zu pending",
            limit, found, expect);
}

static void m_op_close_sink2(m_run *r)
{
    if (!r->sink2_ready || r->sink2_closed)
        return;
    hwt_timeout *held = hwt_sink_close(&r->sink2);
    m_trace(r, "close second sink");
    M_CHECK(r, held == NULL, "hwt_sink_close returned a timeout nobody delivered");
    r->sink2_closed = true;
}

/* Stops the timer and checks what it returns and releases; then that the
   stopped timer refuses work.  Ends the run's use of the core. */
static void m_stop(m_run *r)
{
    hwt_timeout *ret = hwt_timer_stop(r->t);
    m_trace(r, "stop");
    r->stamp++;
    size_t n = m_walk(r, ret, "stop's list");
    size_t returned = 0, released = 0;
    m_item *first_returned = n ? r->scratch[0] : NULL;
    for (size_t i = 0; i < n; i++) {
        m_item *it = r->scratch[i];
        M_CHECK(r, it->seen_stamp != r->stamp, "stop returned item %u twice", it->id);
        it->seen_stamp = r->stamp;
        M_CHECK(r, it->where == M_LIVE, "stop returned item %u that the model holds as %d", it->id,
                it->where);
        uint32_t state = atomic_load(&it->to.state);
        M_CHECK(r, state == HWT_CANCELLED, "stop returned item %u in state %u", it->id, state);
        returned++;
    }
    M_CHECK(r, hwt_sink_take(hwt_timer_default_sink(r->t)) == NULL,
            "stop delivered to the default sink");
    n = m_walk(r, hwt_timer_take_released(r->t), "released at stop");
    for (size_t i = 0; i < n; i++) {
        m_item *it = r->scratch[i];
        M_CHECK(r, it->seen_stamp != r->stamp, "item %u both returned and released by stop",
                it->id);
        it->seen_stamp = r->stamp;
        M_CHECK(r, it->where == M_CANCELLED, "stop released item %u, which the model holds as %d",
                it->id, it->where);
        uint32_t state = atomic_load(&it->to.state);
        M_CHECK(r, state == HWT_CANCELLED, "stop released item %u in state %u", it->id, state);
        released++;
    }
    if (r->sink2_ready) {
        hwt_timeout *more = hwt_sink_take(&r->sink2);
        M_CHECK(r, more == NULL, "stop delivered to the second sink");
    }
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = r->items[i];
        if (it->where == M_FREE)
            continue;
        M_CHECK(r, it->seen_stamp == r->stamp,
                "item %u (model %d) neither returned nor released by stop", it->id, it->where);
        it->where = M_FREE;
    }
    r->cancelled += returned; /* the released ones counted at their cancel */
    r->pending = 0;
    m_check_counts(r);
    M_CHECK(r, hwt_timer_stopped(r->t), "hwt_timer_stopped is false after stop");

    /* a stopped timer: nothing is accepted, nothing is cancelled, it stays stopped */
    m_item *it = r->items[0];
    if (first_returned)
        M_CHECK(r, hwt_timeout_cancel(&first_returned->to) == HWT_EFINAL,
                "cancel of a timeout stop returned");
    it->to.sink = hwt_timer_default_sink(r->t);
    int rc = hwt_timer_schedule(r->t, &it->to, 1);
    M_CHECK(r, rc == HWT_ESTOPPED, "schedule after stop returned %d", rc);
    it->cancellable = false;
    M_CHECK(r, hwt_timer_advance(r->t, r->clock + r->cfg.tick_ns) == HWT_NEVER,
            "advance after stop did not return HWT_NEVER");
    M_CHECK(r, hwt_timer_stop(r->t) == NULL, "a second stop returned timeouts");
    M_CHECK(r, hwt_timer_start(r->t) != 0, "start after stop succeeded");
    bool finished = false;
    M_CHECK(r, hwt_sink_wait(hwt_timer_default_sink(r->t), &finished, NULL) == NULL && finished,
            "the default sink is not finished after stop");
    if (r->sink2_ready && !r->sink2_closed) {
        finished = false;
        M_CHECK(r, hwt_sink_wait(&r->sink2, &finished, NULL) == NULL && finished,
                "the second sink is not finished after stop");
    }
    m_check_counts(r);
}

/* ---- a whole run ---- */

/* What runs did, summed, so that a driver can show the checks had work. */
typedef struct m_totals {
    uint64_t runs, steps, scheduled, expired, cancelled, rejected, returned, advances;
    uint64_t resets, reruns;
    uint64_t largest_tick; /* the most timeouts one tick expired */
} m_totals;

/* Picks a configuration from the source and makes the timer and items. */
static void m_setup(m_run *r, m_source *src, const char *what, size_t max_items, bool wide)
{
    static const uint32_t wheels[] = {1, 2, 8, 512, 3, 64, 100, 4096, 16384};
    static const int64_t ticks[] = {1, 1000000, 1000000000, 7, 1000, 999983};
    memset(r, 0, sizeof(*r));
    r->src = src;
    r->what = what;
    r->cfg.ticks_per_wheel = wheels[m_below(src, sizeof(wheels) / sizeof(wheels[0]))];
    uint64_t k = m_below(src, sizeof(ticks) / sizeof(ticks[0]) + 1);
    r->cfg.tick_ns =
        k < sizeof(ticks) / sizeof(ticks[0]) ? ticks[k] : 1 + (int64_t)m_below(src, 1000000);
    r->nitems = wide ? max_items : 1 + (size_t)m_below(src, max_items);
    r->cfg.max_pending = m_below(src, 5) == 0 ? 1 + (int64_t)m_below(src, r->nitems) : 0;
    r->cfg.wake_every_tick = m_below(src, 8) == 0;
    r->cfg.manual = true;
    r->cfg.clock = m_clock_fn;
    r->cfg.clock_ctx = r;
    r->cfg.thread_name = "hwt-model";
    static const int64_t bases[] = {0, 1, INT64_C(1000000000000), INT64_C(1) << 61};
    k = m_below(src, 5);
    r->clock = k < 4 ? bases[k] : (int64_t)m_below(src, UINT64_C(1) << 40);
    M_CHECK(r, hwt_round_ticks(r->cfg.ticks_per_wheel, &r->wheel) == 0, "ticks_per_wheel %u",
            r->cfg.ticks_per_wheel);
    /* ticks one advance may walk: ticking every tick visits every tick;
       otherwise only ticks with work are visited, and a timeout makes at
       most one per level, so any jump goes */
    r->max_jump = r->cfg.wake_every_tick ? 2000 * r->cfg.tick_ns : M_CLOCK_LIMIT;
    r->last_ret = HWT_NEVER;

    r->t = hwt_timer_new(&r->cfg);
    M_CHECK(r, r->t != NULL, "hwt_timer_new failed");
    M_CHECK(r, hwt_timer_config(r->t)->ticks_per_wheel == r->wheel,
            "ticks_per_wheel %" PRIu32 " rounded to %" PRIu32 ", expected %" PRIu32,
            r->cfg.ticks_per_wheel, hwt_timer_config(r->t)->ticks_per_wheel, r->wheel);
    r->items = calloc(r->nitems, sizeof(*r->items));
    r->scratch = calloc(r->nitems + 1, sizeof(*r->scratch));
    r->by_addr = calloc(r->nitems, sizeof(*r->by_addr));
    M_CHECK(r, r->items && r->scratch && r->by_addr, "out of memory");
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = calloc(1, sizeof(*it));
        M_CHECK(r, it != NULL, "out of memory");
        it->magic = M_MAGIC;
        it->id = (uint32_t)i;
        r->items[i] = r->by_addr[i] = it;
    }
    qsort(r->by_addr, r->nitems, sizeof(*r->by_addr), m_cmp_addr);

    /* not started: refused */
    m_item *it = r->items[0];
    it->to.sink = hwt_timer_default_sink(r->t);
    M_CHECK(r, hwt_timer_schedule(r->t, &it->to, 1) == HWT_ESTOPPED,
            "schedule before start was not refused");
    M_CHECK(r, hwt_timer_advance(r->t, r->clock) == HWT_NEVER, "advance before start");
    M_CHECK(r, !hwt_timer_started(r->t), "started before start");

    M_CHECK(r, hwt_timer_start(r->t) == 0, "hwt_timer_start failed");
    M_CHECK(r, hwt_timer_started(r->t), "hwt_timer_started is false after start");
    M_CHECK(r, hwt_timer_start(r->t) == 0, "a second start failed");
    r->start = r->clock;
    M_CHECK(r, hwt_timer_start_time(r->t) == r->start, "start time %" PRId64 ", clock %" PRId64,
            hwt_timer_start_time(r->t), r->start);
    M_CHECK(r, hwt_timer_now(r->t) == r->clock, "hwt_timer_now is not the injected clock");
    if (m_below(src, 2)) {
        M_CHECK(r, hwt_sink_init(&r->sink2, r->t, NULL, -1, r) == 0, "hwt_sink_init failed");
        r->sink2.ends_once = m_below(src, 2); /* one-shots delivered RUNNING */
        r->sink2_ready = true;
    }
    m_trace(r,
            "setup: tick %" PRId64 " wheel %" PRIu32 " items %zu max_pending %" PRId64
            " every_tick %d base %" PRId64 " sink2 %d ends_once %d",
            r->cfg.tick_ns, r->wheel, r->nitems, r->cfg.max_pending, (int)r->cfg.wake_every_tick,
            r->clock, (int)r->sink2_ready, (int)r->sink2.ends_once);
}

static void m_teardown(m_run *r)
{
    if (r->sink2_ready) {
        if (!r->sink2_closed)
            M_CHECK(r, hwt_sink_close(&r->sink2) == NULL,
                    "the second sink held timeouts at the end");
        hwt_sink_destroy(&r->sink2);
    }
    hwt_timer_decref(r->t);
    for (size_t i = 0; i < r->nitems; i++)
        free(r->items[i]);
    free(r->items);
    free(r->scratch);
    free(r->by_addr);
}

/* ---- what the core holds (hwt_timer_visit_held) ---- */

static int m_visit_held(void *ctx, hwt_timeout *to)
{
    m_run *r = ctx;
    m_item *it = m_owner(r, to, "visit_held");
    M_CHECK(r, it->seen_stamp != r->stamp, "visit_held gave item %u twice", it->id);
    M_CHECK(r, it->where == M_LIVE || it->where == M_CANCELLED,
            "visit_held gave item %u, which the timer no longer holds (model state %d)", it->id,
            it->where);
    it->seen_stamp = r->stamp;
    return 0;
}

/* Every timeout the timer holds is visited once: those live or cancelled
   (until an advance hands them back), queued ones and far ones included;
   none that it handed back.  An embedder's collector counts on that. */
static void m_check_held(m_run *r)
{
    r->stamp++;
    M_CHECK(r, hwt_timer_visit_held(r->t, m_visit_held, r) == 0, "visit_held stopped");
    for (size_t i = 0; i < r->nitems; i++) {
        m_item *it = r->items[i];
        M_CHECK(r, it->seen_stamp == r->stamp || (it->where != M_LIVE && it->where != M_CANCELLED),
                "visit_held missed item %u (model state %d, transferred %d)", it->id, it->where,
                it->transferred);
    }
}

/* Runs one configuration for at most `max_ops` operations (fewer if the
   source's bytes run out), checking after each, then stops the timer.  A
   wide run has `max_items` items, not up to that many, and one operation
   in four is on many of them (m_op_many). */
static void m_run_sequence(m_source *src, const char *what, size_t max_items, size_t max_ops,
                           bool wide, m_totals *totals)
{
    m_run r;
    uint64_t advances = 0;
    m_setup(&r, src, what, max_items, wide);
    for (r.step = 1; r.step <= max_ops && !src->exhausted; r.step++) {
        uint64_t op = m_below(src, 100);
        if (wide && m_below(src, 4) == 0)
            m_op_many(&r);
        else if (op < 40)
            m_op_schedule(&r, op >= 32);
        else if (op < 55)
            m_op_cancel(&r);
        else if (op < 62)
            m_op_reset(&r);
        else if (op < 95)
            m_op_advance(&r), advances++;
        else if (op < 97)
            m_op_soonest(&r);
        else if (op < 99)
            m_check_occupancy(&r);
        else
            m_op_close_sink2(&r);
        m_check_counts(&r);
        m_check_held(&r);
    }
    uint64_t cancelled_before_stop = r.cancelled;
    hwt_stats st;
    hwt_timer_stats(r.t, &st);
    m_stop(&r);
    if (totals) {
        totals->runs++;
        totals->steps += r.step - 1;
        totals->scheduled += r.scheduled;
        totals->expired += r.expired;
        totals->cancelled += cancelled_before_stop;
        totals->rejected += r.rejected;
        totals->returned += r.cancelled - cancelled_before_stop;
        totals->advances += advances;
        totals->resets += r.resets;
        totals->reruns += r.reruns;
        if (st.max_expired_per_tick > totals->largest_tick)
            totals->largest_tick = st.max_expired_per_tick;
    }
    m_teardown(&r);
}

#endif /* HWT_MODEL_H */
