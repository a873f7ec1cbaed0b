/*
 * stress_core.c: the hwtimer C core with its real worker thread under
 * concurrent use, meant for ThreadSanitizer (scripts/check-core.sh) but
 * useful anywhere.  Producer threads schedule timeouts and cancel their own
 * and each other's while consumers drain the default sink (blocking in
 * hwt_sink_wait) and a second sink (woken through a pipe by its wake
 * function), and a monitor reads the counters and looks at the wheel
 * (the soonest pending timeouts, its occupancy).
 *
 * Each round checks: every scheduled timeout is delivered exactly once, or
 * returned by stop() exactly once; an expired one never before its
 * deadline; a cancel() that returned 1 means a cancelled delivery; pending
 * returns to 0; the counters add up.  Settle rounds let everything fire or
 * be cancelled before stopping; race rounds call stop() while producers are
 * still scheduling and cancelling, and a consumer closes its sink midway.
 *
 * Re-arm rounds (rearm_round) race resets against expiry and cancels from
 * several threads on one-shot timeouts, and run periodic timeouts of every
 * missed-run policy on two consumer threads while others cancel them
 * (a run due again at once sometimes goes back on the wheel instead, as
 * the binding's runner does when other work waits):
 * a timeout never expires before its current deadline (so never at the
 * old one once a reset moved it later), a one-shot at most once, a
 * periodic one's runs never overlap, come in rising grid order (exactly
 * every point for a burst), and each ends exactly once; pending returns
 * to 0 and the counters add up.
 *
 * Hand-over rounds (handover_round) deliver one-shots to a sink with
 * ends_once, as the binding's loop sinks do, whose consumer begins each
 * run with hwt_timeout_begin() (sometimes late, as a busy loop does) while
 * other threads cancel and reset them: a cancel that returned HWT_OK and a
 * run never both happen, each one-shot runs or is cancelled exactly once,
 * a reset one goes back and runs at its new deadline, and the counters add
 * up: expired the runs, cancelled the cancels, pending 0.
 *
 * A start race schedules from several threads while the timer starts:
 * each schedule is refused or counts from the start time.
 *
 * Usage: stress_core [SEED [ROUNDS]]; exits 1 on the first failed check.
 */
#define _GNU_SOURCE
#include "hwt.h"
#include "test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PRODUCERS        4
#define PER_PRODUCER     2000
#define NITEMS           (PRODUCERS * PER_PRODUCER)
#define BURST_LEAD_NS    INT64_C(80000000) /* from a round's start to its burst's deadline */
#define SETTLE_LIMIT_NS  (INT64_C(60) * 1000000000) /* generous: TSan is slow */
#define WATCHDOG_SECONDS 300

typedef struct item {
    hwt_timeout to;
    int sched_rc;                /* schedule's result; written before the item is published */
    bool far;                    /* scheduled not to fire within the round */
    _Atomic int delivered;       /* times a consumer took it */
    _Atomic int cancel_wins;     /* cancel() calls that returned 1 */
    _Atomic int returned;        /* times stop() returned it */
    _Atomic uint32_t seen_state; /* its state when a consumer took it */
} item;

typedef struct round_cfg {
    int64_t tick_ns;
    uint32_t wheel;
    int64_t max_pending;
    bool wake_every_tick;
    bool race_stop; /* stop while producers run, instead of settling first */
} round_cfg;

typedef struct shared {
    round_cfg cfg;
    hwt_timer *t;
    hwt_sink s2; /* woken through pipe_fd[1] */
    int pipe_fd[2];
    item *items;                       /* owned, NITEMS */
    _Atomic(item *) published[NITEMS]; /* scheduled items others may cancel */
    _Atomic bool s2_closed;
    _Atomic bool producers_done, monitor_stop;
    _Atomic int64_t consumed;
    _Atomic uint64_t eph_scheduled, eph_rejected; /* the ephemeral sinks' */
    _Atomic(hwt_timeout *) eph_tos;               /* their timeouts, EPHEMERAL_TIMEOUTS */
    uint64_t seed;
    int64_t burst_at; /* clock time at which the burst items fall due together */
} shared;

static _Atomic int failures;
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&report_lock);
    if (atomic_fetch_add(&failures, 1) < 20) {
        fprintf(stderr, "stress_core: FAIL: ");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
    }
    pthread_mutex_unlock(&report_lock);
}

static void on_watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "stress_core: FAIL: timed out (a hang: stop, a sink or the worker)\n";
    ssize_t r = write(2, msg, sizeof(msg) - 1);
    (void)r;
    _exit(1);
}

/* ---- consumers ---- */

/* Accounts for one delivered timeout; `second` when it came from s2. */
static void consume(shared *sh, hwt_timeout *to, bool second)
{
    item *it = (item *)(void *)to;
    if (it < sh->items || it >= sh->items + NITEMS) {
        fail("a sink delivered %p, not one of ours", (void *)to);
        return;
    }
    uint32_t state = atomic_load(&to->state);
    atomic_store(&it->seen_state, state);
    if (atomic_fetch_add(&it->delivered, 1) != 0)
        fail("item %td delivered twice", it - sh->items);
    if (state == HWT_EXPIRED) {
        int64_t rel = hwt_monotonic_ns(NULL) - hwt_timer_start_time(sh->t);
        if (rel < to->deadline)
            fail("item %td expired early: now %" PRId64 " ns, deadline %" PRId64, it - sh->items,
                 rel, to->deadline);
        bool to_s2 = to->sink == &sh->s2;
        if (second ? !to_s2 : to_s2 && !atomic_load(&sh->s2_closed))
            fail("item %td expired into the wrong sink", it - sh->items);
    } else if (state == HWT_CANCELLED) {
        if (second)
            fail("item %td: a cancelled timeout was delivered to its own sink", it - sh->items);
    } else {
        fail("item %td delivered in state %u", it - sh->items, state);
    }
    atomic_fetch_add(&sh->consumed, 1);
}

/* Cancels `v` by hwt_timeout_cancel(), or with `take` by
   hwt_timeout_cancel_take(): one taken back is this thread's at once, and
   counts as delivered, cancelled. */
static void cancel_item(item *v, bool take)
{
    int rc = take ? hwt_timeout_cancel_take(&v->to) : hwt_timeout_cancel(&v->to);
    if (rc == HWT_TAKEN) {
        if (atomic_load(&v->to.state) != HWT_CANCELLED)
            fail("item taken back in state %u", atomic_load(&v->to.state));
        atomic_store(&v->seen_state, HWT_CANCELLED);
        if (atomic_fetch_add(&v->delivered, 1) != 0)
            fail("an item taken back was delivered too");
    }
    if (rc == HWT_OK || rc == HWT_TAKEN)
        atomic_fetch_add(&v->cancel_wins, 1);
    else if (rc != HWT_EFINAL)
        fail("cancel returned %d", rc);
}

static void consume_list(shared *sh, hwt_timeout *list, bool second)
{
    while (list) {
        hwt_timeout *next = hwt_timeout_of(list->link.next);
        consume(sh, list, second);
        list = next;
    }
}

static void *default_consumer(void *arg)
{
    shared *sh = arg;
    bool finished = false;
    while (!finished) {
        consume_list(sh, hwt_sink_wait(hwt_timer_default_sink(sh->t), &finished, NULL), false);
        consume_list(sh, hwt_timer_take_released(sh->t), false);
    }
    return NULL;
}

/* s2's wake function: called by the worker with s2's lock held. */
static void wake_pipe(hwt_sink *s)
{
    char c = 1;
    ssize_t r = write(s->wake_fd, &c, 1); /* EAGAIN: a wake is already pending */
    (void)r;
}

static void *second_consumer(void *arg)
{
    shared *sh = arg;
    uint64_t rng = sh->seed ^ 0x5eed;
    /* in a race round, close the sink after a random share of the work */
    int64_t close_after = sh->cfg.race_stop ? (int64_t)(t_splitmix(&rng) % (NITEMS / 4)) : -1;
    int64_t taken = 0;
    for (;;) {
        struct pollfd p = {sh->pipe_fd[0], POLLIN, 0};
        poll(&p, 1, 50);
        char buf[64];
        while (read(sh->pipe_fd[0], buf, sizeof(buf)) > 0)
            ;
        hwt_timeout *list = hwt_sink_take(&sh->s2);
        for (hwt_timeout *to = list; to; to = hwt_timeout_of(to->link.next))
            taken++;
        consume_list(sh, list, true);
        if (close_after >= 0 && taken >= close_after) {
            atomic_store(&sh->s2_closed, true);
            consume_list(sh, hwt_sink_close(&sh->s2), true);
            return NULL;
        }
        pthread_mutex_lock(&sh->s2.lock);
        bool finished = sh->s2.finished && !sh->s2.head;
        pthread_mutex_unlock(&sh->s2.lock);
        if (finished)
            return NULL;
    }
}

/* ---- sinks that come and go ---- */

#define EPHEMERAL_ROUNDS   40
#define EPHEMERAL_TIMEOUTS 8

/* Makes a sink on the heap, schedules a few timeouts into it, takes them
   all back and frees the sink at once, as an embedder whose consumer (an
   event loop) goes away does: once it has taken everything delivered, the
   worker must no longer touch the sink. */
static void *ephemeral_sinks(void *arg)
{
    shared *sh = arg;
    hwt_timeout tos[EPHEMERAL_TIMEOUTS];
    uint64_t rng = sh->seed ^ 0xe4e;
    atomic_store(&sh->eph_tos, tos);
    for (int round = 0; round < EPHEMERAL_ROUNDS; round++) {
        hwt_sink *s = malloc(sizeof(*s));
        if (!s || hwt_sink_init(s, sh->t, NULL, -1, NULL) != 0) {
            fail("ephemeral sink: setup failed");
            free(s);
            return NULL;
        }
        int want = 0;
        for (int i = 0; i < EPHEMERAL_TIMEOUTS; i++) {
            memset(&tos[i], 0, sizeof(tos[i]));
            tos[i].sink = s;
            int64_t delay = (int64_t)(t_splitmix(&rng) % (uint64_t)(3 * sh->cfg.tick_ns));
            int rc = hwt_timer_schedule(sh->t, &tos[i], delay);
            if (rc == HWT_OK)
                want++;
            else if (rc == HWT_EREJECTED)
                atomic_fetch_add(&sh->eph_rejected, 1);
            else
                fail("ephemeral sink: schedule returned %d", rc);
        }
        int got = 0;
        bool finished = false;
        while (got < want && !finished) {
            for (hwt_timeout *to = hwt_sink_wait(s, &finished, NULL); to;
                 to = hwt_timeout_of(to->link.next)) {
                if (to < tos || to >= tos + EPHEMERAL_TIMEOUTS ||
                    atomic_load(&to->state) != HWT_EXPIRED)
                    fail("ephemeral sink: a stranger or a non-expired timeout");
                got++;
            }
        }
        if (got != want)
            fail("ephemeral sink: %d of %d timeouts came back", got, want);
        atomic_fetch_add(&sh->eph_scheduled, (uint64_t)want);
        if (hwt_sink_close(s) != NULL)
            fail("ephemeral sink: close returned timeouts");
        hwt_sink_destroy(s);
        free(s); /* at once: a worker still writing to it is a race */
    }
    return NULL;
}

/* ---- producers and the monitor ---- */

typedef struct producer_arg {
    shared *sh;
    int index;
} producer_arg;

static void *producer(void *arg)
{
    producer_arg *pa = arg;
    shared *sh = pa->sh;
    uint64_t rng = sh->seed * 31 + (uint64_t)pa->index;
    int64_t tick = sh->cfg.tick_ns;
    for (int i = 0; i < PER_PRODUCER; i++) {
        size_t idx = (size_t)pa->index * PER_PRODUCER + (size_t)i;
        item *it = &sh->items[idx];
        uint64_t r = t_splitmix(&rng);
        int64_t delay;
        switch (r % 16) {
        case 0:
            delay = -(int64_t)(r >> 8) % (2 * tick);
            break;
        case 1:
            delay = 0;
            break;
        case 2:
            it->far = true;
            delay = (r >> 8) & 1 ? HWT_NEVER : INT64_C(3600) * 1000000000;
            break;
        case 3: /* a few hundred ticks: across the levels of a small wheel */
            delay = (int64_t)((r >> 8) % (uint64_t)(600 * tick));
            break;
        case 4:
        case 5:
        case 6: /* due together: a bucket handed over in slices */
            delay = sh->burst_at - hwt_monotonic_ns(NULL);
            break;
        default: /* within a few dozen ticks */
            delay = (int64_t)((r >> 8) % (uint64_t)(40 * tick));
            break;
        }
        it->to.sink = (r >> 40) % 3 == 0 ? &sh->s2 : hwt_timer_default_sink(sh->t);
        it->sched_rc = hwt_timer_schedule(sh->t, &it->to, delay);
        if (it->sched_rc == HWT_OK)
            atomic_store_explicit(&sh->published[idx], it, memory_order_release);
        else if (it->sched_rc == HWT_EREJECTED && sh->cfg.max_pending <= 0)
            fail("schedule rejected without a max_pending");
        /* cancel one's own at once, now and then, as a request that is
           answered quickly does: it may be taken back off the queue */
        if (it->sched_rc == HWT_OK && (r >> 32) % 10 == 0)
            cancel_item(it, true);
        /* cancel someone's timeout, now and then */
        if ((r >> 48) % 10 < 3) {
            size_t victim = (size_t)(t_splitmix(&rng) % NITEMS);
            item *v = atomic_load_explicit(&sh->published[victim], memory_order_acquire);
            if (v)
                cancel_item(v, (r >> 56) & 1);
        }
        /* pace: a producer runs for tens of ms, so stop() lands mid-stream */
        if (i % 16 == 15)
            t_sleep_ns((int64_t)(t_splitmix(&rng) % 1000000));
    }
    /* settle: the far ones would otherwise stay pending */
    for (int i = 0; i < PER_PRODUCER; i++) {
        item *it = &sh->items[(size_t)pa->index * PER_PRODUCER + (size_t)i];
        if (it->far && it->sched_rc == HWT_OK && hwt_timeout_cancel(&it->to) == HWT_OK)
            atomic_fetch_add(&it->cancel_wins, 1);
    }
    return NULL;
}

/* What hwt_timer_soonest hands the monitor: ours, in deadline order, and
   not expired (expiry needs the wheel, which the call holds). */
typedef struct soonest_seen {
    shared *sh;
    int64_t last_deadline;
} soonest_seen;

static void check_soonest(void *ctx, hwt_timeout *to)
{
    soonest_seen *seen = ctx;
    item *it = (item *)(void *)to;
    hwt_timeout *eph = atomic_load(&seen->sh->eph_tos);
    bool ephemeral = eph && to >= eph && to < eph + EPHEMERAL_TIMEOUTS;
    if (!ephemeral && (it < seen->sh->items || it >= seen->sh->items + NITEMS)) {
        fail("soonest gave %p, not one of ours", (void *)to);
        return;
    }
    if (to->deadline < seen->last_deadline)
        fail("soonest gave deadline %" PRId64 " after %" PRId64, to->deadline, seen->last_deadline);
    seen->last_deadline = to->deadline;
    if (atomic_load(&to->state) == HWT_EXPIRED)
        fail("soonest gave %p, which had expired", (void *)to);
}

/* Looks at the wheel the way an operator's snapshot does, while the worker
   and producers run. */
static void look_at_wheel(shared *sh)
{
    soonest_seen seen = {sh, INT64_MIN};
    size_t found;
    if (hwt_timer_soonest(sh->t, 16, check_soonest, &seen, &found) != 0 || found > 16)
        fail("soonest failed or found %zu of 16", found);
    hwt_occupancy occ;
    hwt_timer_occupancy(sh->t, &occ);
    uint64_t held = occ.never;
    for (unsigned k = 0; k < occ.levels; k++) {
        held += occ.level[k].timeouts;
        if (occ.level[k].fullest > occ.level[k].timeouts ||
            occ.level[k].occupied > occ.level[k].buckets)
            fail("occupancy of level %u out of range", k);
    }
    if (held > NITEMS + EPHEMERAL_TIMEOUTS)
        fail("occupancy: %" PRIu64 " timeouts in the wheel, of %d", held,
             NITEMS + EPHEMERAL_TIMEOUTS);
}

static void *monitor(void *arg)
{
    shared *sh = arg;
    while (!atomic_load(&sh->monitor_stop)) {
        look_at_wheel(sh);
        hwt_stats st;
        hwt_timer_stats(sh->t, &st);
        int64_t pending = hwt_timer_pending(sh->t);
        if (pending < 0 || st.expired + st.cancelled > st.scheduled + (uint64_t)NITEMS)
            fail("counters out of range: pending %" PRId64 " expired %" PRIu64 " cancelled %" PRIu64
                 " scheduled %" PRIu64,
                 pending, st.expired, st.cancelled, st.scheduled);
        t_sleep_ns(200000);
    }
    return NULL;
}

/* ---- one round ---- */

static void run_round(const round_cfg *cfg, uint64_t seed)
{
    shared *sh = calloc(1, sizeof(*sh));
    if (!sh) {
        fail("out of memory");
        return;
    }
    sh->cfg = *cfg;
    sh->seed = seed;
    sh->items = calloc(NITEMS, sizeof(item));
    hwt_config hc = {
        .tick_ns = cfg->tick_ns,
        .ticks_per_wheel = cfg->wheel,
        .max_pending = cfg->max_pending,
        .thread_name = "hwt-stress",
        .wake_every_tick = cfg->wake_every_tick,
    };
    sh->t = hwt_timer_new(&hc);
    if (!sh->items || !sh->t || pipe2(sh->pipe_fd, O_NONBLOCK | O_CLOEXEC) != 0) {
        fail("setup failed");
        exit(1);
    }
    if (hwt_sink_init(&sh->s2, sh->t, wake_pipe, sh->pipe_fd[1], sh) != 0 ||
        hwt_timer_start(sh->t) != 0) {
        fail("sink init or start failed");
        exit(1);
    }

    /* producers run for tens of ms: most burst items are scheduled before */
    sh->burst_at = hwt_monotonic_ns(NULL) + BURST_LEAD_NS;
    pthread_t prod[PRODUCERS], cons1, cons2, mon, eph_thread;
    producer_arg pa[PRODUCERS];
    pthread_create(&cons1, NULL, default_consumer, sh);
    pthread_create(&cons2, NULL, second_consumer, sh);
    pthread_create(&mon, NULL, monitor, sh);
    if (!cfg->race_stop)
        pthread_create(&eph_thread, NULL, ephemeral_sinks, sh);
    for (int i = 0; i < PRODUCERS; i++) {
        pa[i] = (producer_arg){sh, i};
        pthread_create(&prod[i], NULL, producer, &pa[i]);
    }

    hwt_timeout *returned = NULL;
    if (cfg->race_stop) {
        uint64_t rng = seed;
        t_sleep_ns((int64_t)(t_splitmix(&rng) % 50000000));
        returned = hwt_timer_stop(sh->t);
        for (int i = 0; i < PRODUCERS; i++)
            pthread_join(prod[i], NULL);
    } else {
        for (int i = 0; i < PRODUCERS; i++)
            pthread_join(prod[i], NULL);
        pthread_join(eph_thread, NULL);
        /* everything fires or is cancelled: pending drains to 0 */
        int64_t give_up = hwt_monotonic_ns(NULL) + SETTLE_LIMIT_NS;
        while (hwt_timer_pending(sh->t) != 0 && hwt_monotonic_ns(NULL) < give_up)
            t_sleep_ns(1000000);
        if (hwt_timer_pending(sh->t) != 0)
            fail("pending is %" PRId64 " after settling", hwt_timer_pending(sh->t));
        returned = hwt_timer_stop(sh->t);
        if (returned)
            fail("stop returned timeouts after everything settled");
    }
    if (hwt_timer_stop(sh->t) != NULL)
        fail("a second stop returned timeouts");
    pthread_join(cons1, NULL);
    pthread_join(cons2, NULL);
    atomic_store(&sh->monitor_stop, true);
    pthread_join(mon, NULL);

    for (hwt_timeout *to = returned; to; to = hwt_timeout_of(to->link.next)) {
        item *it = (item *)(void *)to;
        if (it < sh->items || it >= sh->items + NITEMS) {
            fail("stop returned %p, not one of ours", (void *)to);
            break;
        }
        if (atomic_fetch_add(&it->returned, 1) != 0) {
            fail("stop returned item %td twice", it - sh->items);
            break;
        }
        if (atomic_load(&to->state) != HWT_CANCELLED)
            fail("stop returned item %td in state %u", it - sh->items, atomic_load(&to->state));
    }

    /* every item: exactly one fate */
    uint64_t ok = 0, rejected = 0, expired = 0;
    for (size_t i = 0; i < NITEMS; i++) {
        item *it = &sh->items[i];
        int delivered = atomic_load(&it->delivered), ret = atomic_load(&it->returned);
        int wins = atomic_load(&it->cancel_wins);
        if (it->sched_rc == HWT_EREJECTED)
            rejected++;
        if (it->sched_rc != HWT_OK) {
            if (delivered || ret || wins)
                fail("item %zu was not scheduled (rc %d) yet turned up", i, it->sched_rc);
            continue;
        }
        ok++;
        if (delivered + ret != 1) {
            fail("item %zu: delivered %d times, returned by stop %d times", i, delivered, ret);
            continue;
        }
        if (wins > 1)
            fail("item %zu: %d cancels returned 1", i, wins);
        uint32_t seen = atomic_load(&it->seen_state);
        if (ret && wins)
            fail("item %zu: returned by stop though a cancel had won", i);
        if (delivered && (seen == HWT_CANCELLED) != (wins == 1))
            fail("item %zu: delivered %s but %d cancels won", i,
                 seen == HWT_CANCELLED ? "cancelled" : "expired", wins);
        if (delivered && seen == HWT_EXPIRED)
            expired++;
        if (!cfg->race_stop && it->far && seen != HWT_CANCELLED)
            fail("item %zu: a far timeout fired", i);
    }
    hwt_stats st;
    hwt_timer_stats(sh->t, &st);
    if (st.pending != 0 || hwt_timer_pending(sh->t) != 0)
        fail("pending is %" PRId64 " after stop", st.pending);
    /* the ephemeral sinks' timeouts all expire */
    uint64_t eph = atomic_load(&sh->eph_scheduled);
    if (st.scheduled != ok + eph || st.rejected != rejected + atomic_load(&sh->eph_rejected) ||
        st.expired != expired + eph || st.expired + st.cancelled != st.scheduled)
        fail("stats: scheduled %" PRIu64 " (expected %" PRIu64 " + ephemeral), rejected %" PRIu64
             " (%" PRIu64 "), expired %" PRIu64 " (%" PRIu64 "), cancelled %" PRIu64,
             st.scheduled, ok, st.rejected, rejected, st.expired, expired, st.cancelled);
    printf("stress_core: round tick=%" PRId64 "ns wheel=%" PRIu32 " max_pending=%" PRId64
           " every_tick=%d %s: %" PRIu64 " scheduled, %" PRIu64 " expired, %" PRIu64
           " cancelled, %" PRIu64 " rejected, %" PRId64 " consumed\n",
           cfg->tick_ns, cfg->wheel, cfg->max_pending, (int)cfg->wake_every_tick,
           cfg->race_stop ? "stop-race" : "settle", ok, expired, st.cancelled, rejected,
           atomic_load(&sh->consumed));
    fflush(stdout);

    if (!atomic_load(&sh->s2_closed))
        hwt_sink_close(&sh->s2);
    hwt_sink_destroy(&sh->s2);
    hwt_timer_decref(sh->t);
    close(sh->pipe_fd[0]);
    close(sh->pipe_fd[1]);
    free(sh->items);
    free(sh);
}

/* ---- re-arm rounds: reset and periodic timeouts ---- */

#define RA_ONESHOT   512
#define RA_PERIODIC  48
#define RA_RESETTERS 3
#define RA_CONSUMERS 2

typedef struct ra_item {
    hwt_timeout to;
    bool periodic;
    int64_t period; /* a periodic one's, ns: kept here, as an embedder does */
    int missed;     /* and its HWT_MISSED_* policy */
    int64_t first;  /* a periodic one's first deadline: its grid's origin */
    bool moved;     /* a reset moved its grid (or delay restarted it) */
    int64_t last_deadline;
    _Atomic int running;     /* runs going on now: never above 1 */
    _Atomic int delivered;   /* a one-shot's expiries */
    _Atomic int armed;       /* a one-shot is scheduled and has not expired */
    _Atomic int generations; /* a one-shot's schedules: again after each expiry */
    _Atomic int ends;        /* a periodic one's ends (cancelled, failed, stopped) */
    _Atomic int cancel_wins;
    uint64_t runs;
} ra_item;

typedef struct ra_shared {
    hwt_timer *t;
    ra_item *items; /* owned: RA_ONESHOT one-shots, then RA_PERIODIC periodic */
    _Atomic bool done;
    pthread_mutex_t resched_lock; /* no re-schedule once `done` is set */
    _Atomic uint64_t reset_wins, periodic_runs, early_checks;
    uint64_t seed;
} ra_shared;

#define RA_TOTAL (RA_ONESHOT + RA_PERIODIC)

static int64_t ra_rel(ra_shared *sh)
{
    return hwt_monotonic_ns(NULL) - hwt_timer_start_time(sh->t);
}

/* Checks one run of a periodic item at deadline `d` (rel ns), started at
   `now`: early only before its deadline (one on a tick boundary runs at
   that tick's end, a back-to-back one at once). */
static void ra_check_run(ra_shared *sh, ra_item *it, int64_t d, int64_t now)
{
    int64_t p = it->period;
    int missed = it->missed;
    if (!hwt_timeout_periodic(&it->to))
        fail("periodic %td delivered without its flag", it - sh->items);
    if (now < d)
        fail("periodic %td ran early: now %" PRId64 ", deadline %" PRId64, it - sh->items, now, d);
    if (it->runs && d <= it->last_deadline)
        fail("periodic %td: run at %" PRId64 " after one at %" PRId64, it - sh->items, d,
             it->last_deadline);
    if (!it->moved && missed != HWT_MISSED_DELAY && (d - it->first) % p != 0)
        fail("periodic %td: deadline %" PRId64 " off its grid from %" PRId64, it - sh->items, d,
             it->first);
    if (it->runs && !it->moved && missed == HWT_MISSED_BURST && d != it->last_deadline + p)
        fail("periodic %td (burst): run at %" PRId64 " skipped from %" PRId64, it - sh->items, d,
             it->last_deadline);
    it->last_deadline = d;
    it->runs++;
    atomic_fetch_add(&sh->periodic_runs, 1);
}

/* Runs a delivered periodic item, as a binding's runner does. */
static void ra_run(ra_shared *sh, ra_item *it, uint64_t *rng)
{
    uint32_t state = atomic_load(&it->to.state);
    if (state == HWT_CANCELLED) {
        hwt_timeout_finish(&it->to, HWT_CANCELLED);
        atomic_fetch_add(&it->ends, 1);
        return;
    }
    if (state == HWT_RUNNING_RESET) { /* reset before its run began: moved */
        if (hwt_timeout_requeue(&it->to) != HWT_OK)
            atomic_fetch_add(&it->ends, 1);
        return;
    }
    for (;;) {
        if (atomic_fetch_add(&it->running, 1) != 0)
            fail("periodic %td: runs overlap", it - sh->items);
        int64_t start = hwt_monotonic_ns(NULL), d = hwt_timeout_deadline(&it->to);
        ra_check_run(sh, it, d, start - hwt_timer_start_time(sh->t));
        uint64_t r = t_splitmix(rng);
        if (r % 8 == 0) /* a run longer than its period */
            t_sleep_ns(it->period + (int64_t)(r >> 8) % (2 * it->period));
        if (r % 64 == 1 && hwt_timeout_reset(&it->to, (int64_t)(r >> 8) % 5000000) == HWT_OK)
            it->moved = true; /* from inside its run: moves the next one */
        atomic_fetch_sub(&it->running, 1);
        if (r % 97 == 2) { /* its task failed */
            hwt_timeout_finish(&it->to, HWT_EXPIRED);
            atomic_fetch_add(&it->ends, 1);
            return;
        }
        int rc = hwt_timeout_rearm(&it->to, it->period, start, hwt_monotonic_ns(NULL), false);
        if (rc == HWT_OK)
            return;
        if (rc == HWT_EAGAIN && t_splitmix(rng) % 4 == 0) {
            /* due again, but other work waits: back on the wheel, due */
            rc = hwt_timeout_requeue(&it->to);
            if (rc != HWT_OK)
                atomic_fetch_add(&it->ends, 1);
            return;
        }
        if (rc == HWT_EAGAIN && !atomic_load(&sh->done))
            continue;
        if (rc == HWT_EAGAIN)
            hwt_timeout_finish(&it->to, HWT_CANCELLED);
        atomic_fetch_add(&it->ends, 1);
        return;
    }
}

/* Schedules a one-shot (again, after it expired), so resets keep racing
   fresh expiries. */
static void ra_reschedule(ra_shared *sh, ra_item *it, uint64_t *rng)
{
    pthread_mutex_lock(&sh->resched_lock);
    if (!atomic_load(&sh->done)) {
        atomic_store(&it->armed, 1);
        atomic_fetch_add(&it->generations, 1);
        int rc = hwt_timer_schedule(sh->t, &it->to, (int64_t)(t_splitmix(rng) % 4000000));
        if (rc != HWT_OK)
            fail("one-shot %td: schedule returned %d", it - sh->items, rc);
    }
    pthread_mutex_unlock(&sh->resched_lock);
}

static void *ra_consumer(void *arg)
{
    ra_shared *sh = arg;
    uint64_t rng = sh->seed ^ (uint64_t)(uintptr_t)&rng;
    bool finished = false;
    while (!finished) {
        hwt_timeout *list = hwt_sink_wait(hwt_timer_default_sink(sh->t), &finished, NULL);
        while (list) {
            hwt_timeout *next = hwt_timeout_of(list->link.next);
            ra_item *it = (ra_item *)(void *)list;
            if (it->periodic) {
                ra_run(sh, it, &rng);
            } else {
                int64_t now = ra_rel(sh), d = hwt_timeout_deadline(list);
                if (now < d)
                    fail("one-shot %td expired early (or at an old deadline): now %" PRId64
                         ", deadline %" PRId64,
                         it - sh->items, now, d);
                if (hwt_timeout_periodic(list))
                    fail("one-shot %td delivered with the periodic flag", it - sh->items);
                if (atomic_exchange(&it->armed, 0) != 1)
                    fail("one-shot %td expired twice", it - sh->items);
                if (atomic_load(&it->cancel_wins))
                    fail("one-shot %td expired after a cancel won", it - sh->items);
                atomic_fetch_add(&it->delivered, 1);
                atomic_fetch_add(&sh->early_checks, 1);
                ra_reschedule(sh, it, &rng);
            }
            list = next;
        }
        /* cancelled on the wheel: a periodic one ends there */
        for (hwt_timeout *to = hwt_timer_take_released(sh->t); to;
             to = hwt_timeout_of(to->link.next))
            if (((ra_item *)(void *)to)->periodic)
                atomic_fetch_add(&((ra_item *)(void *)to)->ends, 1);
    }
    return NULL;
}

typedef struct ra_arg {
    ra_shared *sh;
    int index;
} ra_arg;

/* Resets its share of the one-shots again and again, and cancels any
   timeout now and then. */
static void *ra_resetter(void *arg)
{
    ra_arg *a = arg;
    ra_shared *sh = a->sh;
    uint64_t rng = sh->seed * 77 + (uint64_t)a->index;
    while (!atomic_load(&sh->done)) {
        uint64_t r = t_splitmix(&rng);
        ra_item *it =
            &sh->items[(size_t)(r % (RA_ONESHOT / RA_RESETTERS)) * RA_RESETTERS + (size_t)a->index];
        int64_t delay = (int64_t)((r >> 16) % 4000000);
        if (hwt_timeout_reset(&it->to, delay) == HWT_OK)
            atomic_fetch_add(&sh->reset_wins, 1);
        if ((r >> 40) % 16 == 0) {
            ra_item *v = &sh->items[(r >> 44) % RA_TOTAL];
            if (hwt_timeout_cancel(&v->to) == HWT_OK)
                atomic_fetch_add(&v->cancel_wins, 1);
        }
        if ((r >> 50) % 8 == 0)
            t_sleep_ns((int64_t)((r >> 53) % 200000));
    }
    return NULL;
}

/* Every item has had exactly one fate; the counters add up. */
static void rearm_check(ra_shared *sh, bool race_stop)
{
    uint64_t expired = 0;
    for (size_t i = 0; i < RA_TOTAL; i++) {
        ra_item *it = &sh->items[i];
        uint32_t state = atomic_load(&it->to.state);
        int wins = atomic_load(&it->cancel_wins);
        if (wins > 1)
            fail("rearm item %zu: %d cancels won", i, wins);
        if (it->periodic) {
            int ends = atomic_load(&it->ends);
            if (ends != 1)
                fail("periodic %zu ended %d times (state %u)", i, ends, state);
            expired += state == HWT_EXPIRED;
        } else {
            int got = atomic_load(&it->delivered), gens = atomic_load(&it->generations);
            if (got + (state == HWT_CANCELLED) != gens)
                fail("one-shot %zu: expired %d times in %d schedules, state %u", i, got, gens,
                     state);
            expired += got;
        }
        if (state != HWT_CANCELLED && state != HWT_EXPIRED)
            fail("rearm item %zu left in state %u", i, state);
    }
    hwt_stats st;
    hwt_timer_stats(sh->t, &st);
    uint64_t scheduled = RA_PERIODIC;
    for (size_t i = 0; i < RA_ONESHOT; i++)
        scheduled += (uint64_t)atomic_load(&sh->items[i].generations);
    if (st.pending != 0 || st.scheduled != scheduled || st.expired != expired ||
        st.expired + st.cancelled != st.scheduled)
        fail("rearm round: pending %" PRId64 ", scheduled %" PRIu64 ", expired %" PRIu64
             " (counted %" PRIu64 "), cancelled %" PRIu64,
             st.pending, st.scheduled, st.expired, expired, st.cancelled);
    printf("stress_core: rearm round %s: %" PRIu64 " resets won, %" PRIu64
           " periodic runs, %" PRIu64 " one-shots expired\n",
           race_stop ? "stop-race" : "settle", atomic_load(&sh->reset_wins),
           atomic_load(&sh->periodic_runs), atomic_load(&sh->early_checks));
    fflush(stdout);
}

/* One re-arm round; stops mid-stream when `race_stop`. */
static void rearm_round(int64_t tick_ns, bool race_stop, uint64_t seed)
{
    ra_shared *sh = calloc(1, sizeof(*sh));
    hwt_config hc = {.tick_ns = tick_ns, .ticks_per_wheel = 64, .thread_name = "hwt-rearm"};
    if (!sh || !(sh->items = calloc(RA_TOTAL, sizeof(ra_item))) || !(sh->t = hwt_timer_new(&hc)) ||
        hwt_timer_start(sh->t) != 0) {
        fail("rearm round: setup failed");
        exit(1);
    }
    sh->seed = seed;
    pthread_mutex_init(&sh->resched_lock, NULL);
    uint64_t rng = seed;
    for (size_t i = 0; i < RA_TOTAL; i++) {
        ra_item *it = &sh->items[i];
        it->to.sink = hwt_timer_default_sink(sh->t);
        it->periodic = i >= RA_ONESHOT;
        uint64_t r = t_splitmix(&rng);
        if (!it->periodic) {
            ra_reschedule(sh, it, &rng);
            continue;
        }
        it->period = 200000 + (int64_t)((r >> 20) % 3000000);
        it->missed = (int)((r >> 40) % 3);
        int rc = hwt_timer_schedule_periodic(sh->t, &it->to, (int64_t)(r % 3000000), it->missed);
        if (rc != HWT_OK)
            fail("rearm round: schedule returned %d", rc);
        it->first = hwt_timeout_deadline(&it->to);
    }
    pthread_t cons[RA_CONSUMERS], res[RA_RESETTERS];
    ra_arg args[RA_RESETTERS];
    for (int i = 0; i < RA_CONSUMERS; i++)
        pthread_create(&cons[i], NULL, ra_consumer, sh);
    for (int i = 0; i < RA_RESETTERS; i++) {
        args[i] = (ra_arg){sh, i};
        pthread_create(&res[i], NULL, ra_resetter, &args[i]);
    }
    t_sleep_ns(race_stop ? (int64_t)(t_splitmix(&rng) % 100000000) : 150000000);
    hwt_timeout *returned = NULL;
    pthread_mutex_lock(&sh->resched_lock);
    atomic_store(&sh->done, true); /* periodic runs, resets, cancels go on */
    pthread_mutex_unlock(&sh->resched_lock);
    if (race_stop)
        returned = hwt_timer_stop(sh->t);
    for (int i = 0; i < RA_RESETTERS; i++)
        pthread_join(res[i], NULL);
    if (!race_stop) {
        for (size_t i = 0; i < RA_TOTAL; i++) /* what still repeats or waits ends now */
            if (hwt_timeout_cancel(&sh->items[i].to) == HWT_OK)
                atomic_fetch_add(&sh->items[i].cancel_wins, 1);
        int64_t give_up = hwt_monotonic_ns(NULL) + SETTLE_LIMIT_NS;
        while (hwt_timer_pending(sh->t) != 0 && hwt_monotonic_ns(NULL) < give_up)
            t_sleep_ns(1000000);
        returned = hwt_timer_stop(sh->t);
        if (returned)
            fail("rearm round: stop returned timeouts after all were cancelled");
    }
    for (int i = 0; i < RA_CONSUMERS; i++)
        pthread_join(cons[i], NULL);
    for (hwt_timeout *to = returned; to; to = hwt_timeout_of(to->link.next))
        atomic_fetch_add(&((ra_item *)(void *)to)->ends, 1);
    rearm_check(sh, race_stop);
    hwt_timer_decref(sh->t);
    pthread_mutex_destroy(&sh->resched_lock);
    free(sh->items);
    free(sh);
}

/* ---- one-shots handed over to an ends_once sink ---- */

#define HO_ITEMS      1024
#define HO_CANCELLERS 2

typedef struct ho_item {
    hwt_timeout to;
    _Atomic int outcome; /* 0, 1 ran, 2 a cancel won */
} ho_item;

typedef struct ho_shared {
    hwt_timer *t;
    hwt_sink sink;
    ho_item *items;
    _Atomic bool done;
    _Atomic uint64_t ran, cancel_wins, requeued, resets;
    _Atomic size_t scheduled; /* items[0 .. scheduled - 1] were scheduled */
    uint64_t seed;
} ho_shared;

static void *ho_consumer(void *arg)
{
    ho_shared *sh = arg;
    uint64_t rng = sh->seed ^ 0x5bd1e995u;
    bool finished = false;
    while (!finished) {
        hwt_timeout *list = hwt_sink_wait(&sh->sink, &finished, NULL);
        while (list) {
            hwt_timeout *next = hwt_timeout_of(list->link.next);
            ho_item *it = (ho_item *)(void *)list;
            uint64_t r = t_splitmix(&rng);
            if (r % 4 == 0) /* a busy loop: the cancels get their chance */
                t_sleep_ns((int64_t)(r >> 8) % 50000);
            uint32_t s = hwt_timeout_begin(list);
            if (s == HWT_EXPIRED) {
                int64_t now = hwt_monotonic_ns(NULL) - hwt_timer_start_time(sh->t);
                if (now < hwt_timeout_deadline(list))
                    fail("handover item %td ran before its deadline", it - sh->items);
                if (atomic_exchange(&it->outcome, 1) != 0)
                    fail("handover item %td ran after a cancel won, or twice", it - sh->items);
                if (hwt_timeout_cancel(list) != HWT_EFINAL)
                    fail("handover item %td cancelled in its run", it - sh->items);
                atomic_fetch_add(&sh->ran, 1);
            } else if (s == HWT_RUNNING_RESET) {
                int rc = hwt_timeout_requeue(list);
                if (rc != HWT_OK && rc != HWT_ECANCELLED)
                    fail("handover item %td: requeue returned %d", it - sh->items, rc);
                atomic_fetch_add(&sh->requeued, 1);
            } else if (s != HWT_CANCELLED) {
                fail("handover item %td: begin gave state %u", it - sh->items, s);
            }
            list = next;
        }
        (void)hwt_timer_take_released(sh->t); /* cancelled on the wheel */
    }
    return NULL;
}

static void *ho_canceller(void *arg)
{
    ho_shared *sh = arg;
    uint64_t rng = sh->seed ^ (uint64_t)(uintptr_t)&rng;
    while (!atomic_load(&sh->done)) {
        uint64_t r = t_splitmix(&rng);
        size_t n = atomic_load(&sh->scheduled);
        ho_item *it = &sh->items[n ? (r >> 16) % n : 0];
        if (!n) {
            t_sleep_ns(10000);
            continue;
        }
        if (r % 8 == 0) {
            if (hwt_timeout_cancel(&it->to) == HWT_OK) {
                if (atomic_exchange(&it->outcome, 2) != 0)
                    fail("handover item %td: a cancel won after its run began", it - sh->items);
                atomic_fetch_add(&sh->cancel_wins, 1);
            }
        } else if (r % 8 == 1) {
            if (hwt_timeout_reset(&it->to, (int64_t)(r >> 24) % 2000000) == HWT_OK)
                atomic_fetch_add(&sh->resets, 1);
        }
        t_sleep_ns((int64_t)(r >> 32) % 20000);
    }
    return NULL;
}

static void handover_round(uint64_t seed)
{
    ho_shared *sh = calloc(1, sizeof(*sh));
    hwt_config hc = {.tick_ns = 100000, .ticks_per_wheel = 64, .thread_name = "hwt-handover"};
    if (!sh || !(sh->items = calloc(HO_ITEMS, sizeof(ho_item))) || !(sh->t = hwt_timer_new(&hc)) ||
        hwt_timer_start(sh->t) != 0 || hwt_sink_init(&sh->sink, sh->t, NULL, -1, NULL) != 0) {
        fail("handover round: setup failed");
        exit(1);
    }
    sh->sink.ends_once = true;
    sh->seed = seed;
    uint64_t rng = seed;
    pthread_t cons, can[HO_CANCELLERS];
    pthread_create(&cons, NULL, ho_consumer, sh);
    for (int i = 0; i < HO_CANCELLERS; i++)
        pthread_create(&can[i], NULL, ho_canceller, sh);
    for (size_t i = 0; i < HO_ITEMS; i++) {
        sh->items[i].to.sink = &sh->sink;
        int rc = hwt_timer_schedule(sh->t, &sh->items[i].to, (int64_t)(t_splitmix(&rng) % 3000000));
        if (rc != HWT_OK)
            fail("handover round: schedule returned %d", rc);
        atomic_store(&sh->scheduled, i + 1);
        if (i % 64 == 0)
            t_sleep_ns(100000);
    }
    int64_t give_up = hwt_monotonic_ns(NULL) + SETTLE_LIMIT_NS;
    while (atomic_load(&sh->ran) + atomic_load(&sh->cancel_wins) < HO_ITEMS &&
           hwt_monotonic_ns(NULL) < give_up)
        t_sleep_ns(1000000);
    atomic_store(&sh->done, true);
    for (int i = 0; i < HO_CANCELLERS; i++)
        pthread_join(can[i], NULL);
    hwt_timeout *returned = hwt_timer_stop(sh->t);
    pthread_join(cons, NULL);
    if (returned)
        fail("handover round: stop returned timeouts after all ran or were cancelled");
    uint64_t ran = atomic_load(&sh->ran), wins = atomic_load(&sh->cancel_wins);
    for (size_t i = 0; i < HO_ITEMS; i++)
        if (atomic_load(&sh->items[i].outcome) == 0)
            fail("handover item %zu neither ran nor was cancelled", i);
    hwt_stats st;
    hwt_timer_stats(sh->t, &st);
    if (st.scheduled != HO_ITEMS || st.expired != ran || st.cancelled != wins || st.pending != 0)
        fail("handover round: stats scheduled %" PRIu64 " expired %" PRIu64 " cancelled %" PRIu64
             " pending %" PRId64 ", counted %d / %" PRIu64 " ran / %" PRIu64 " cancelled",
             st.scheduled, st.expired, st.cancelled, st.pending, HO_ITEMS, ran, wins);
    printf("stress_core: handover round: %" PRIu64 " ran, %" PRIu64 " cancelled, %" PRIu64
           " resets won, %" PRIu64 " requeued after a reset\n",
           ran, wins, atomic_load(&sh->resets), atomic_load(&sh->requeued));
    (void)hwt_sink_close(&sh->sink);
    hwt_sink_destroy(&sh->sink);
    hwt_timer_decref(sh->t);
    free(sh->items);
    free(sh);
}

/* ---- schedules racing the start ---- */

#define START_RACERS 3
#define START_ITEMS  64 /* per racer */
#define START_DELAY  (INT64_C(3600) * 1000000000)

typedef struct start_racer {
    hwt_timer *t;
    _Atomic bool *go;
    hwt_timeout tos[START_ITEMS];
} start_racer;

/* Schedules each of its timeouts until the timer, started meanwhile,
   accepts it. */
static void *start_race(void *arg)
{
    start_racer *r = arg;
    while (!atomic_load(r->go))
        ;
    for (int i = 0; i < START_ITEMS;) {
        r->tos[i].sink = hwt_timer_default_sink(r->t);
        int rc = hwt_timer_schedule(r->t, &r->tos[i], START_DELAY);
        if (rc == HWT_OK)
            i++;
        else if (rc != HWT_ESTOPPED) {
            fail("start race: schedule returned %d", rc);
            break;
        }
    }
    return NULL;
}

/* Schedules from several threads while the timer starts: each is refused
   or counts its deadline from the start time (not from before it), and
   stop() returns every accepted one once. */
static void start_race_round(void)
{
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = 64};
    hwt_timer *t = hwt_timer_new(&cfg);
    if (!t) {
        fail("start race: hwt_timer_new failed: errno %d", errno);
        return;
    }
    static start_racer racers[START_RACERS];
    pthread_t threads[START_RACERS];
    _Atomic bool go = false;
    for (int i = 0; i < START_RACERS; i++) {
        racers[i] = (start_racer){.t = t, .go = &go};
        if (pthread_create(&threads[i], NULL, start_race, &racers[i]) != 0) {
            fail("start race: pthread_create failed");
            return;
        }
    }
    atomic_store(&go, true);
    t_sleep_ns(200000); /* some schedules are refused first */
    if (hwt_timer_start(t) != 0)
        fail("start race: hwt_timer_start failed");
    for (int i = 0; i < START_RACERS; i++)
        pthread_join(threads[i], NULL);
    int64_t rel = hwt_monotonic_ns(NULL) - hwt_timer_start_time(t);
    int returned = 0;
    for (hwt_timeout *to = hwt_timer_stop(t); to; to = hwt_timeout_of(to->link.next))
        returned++;
    if (returned != START_RACERS * START_ITEMS)
        fail("start race: stop returned %d timeouts of %d", returned, START_RACERS * START_ITEMS);
    for (int i = 0; i < START_RACERS; i++) {
        for (int k = 0; k < START_ITEMS; k++) {
            int64_t d = hwt_timeout_deadline(&racers[i].tos[k]);
            if (d > rel + START_DELAY || d < START_DELAY)
                fail("start race: a deadline %" PRId64 " ns from the start, not within %" PRId64
                     " ns of the delay",
                     d, rel);
        }
    }
    hwt_timer_take_released(t);
    hwt_timer_decref(t);
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    int rounds = argc > 2 ? atoi(argv[2]) : 6;
    static const round_cfg kinds[] = {
        {1000000, 512, 0, false, false},  {100000, 8, 0, false, true},
        {1000000, 64, 600, false, false}, {1000000, 1, 0, true, true},
        {200000, 2, 0, false, true},      {1000000, 512, 0, true, false},
    };
    signal(SIGALRM, on_watchdog);
    alarm(WATCHDOG_SECONDS);
    printf("stress_core: seed %" PRIu64 ", %d rounds\n", seed, rounds);
    start_race_round();
    for (int i = 0; i < rounds && !atomic_load(&failures); i++) {
        run_round(&kinds[i % (int)(sizeof(kinds) / sizeof(kinds[0]))], seed + (uint64_t)i);
        if (!atomic_load(&failures))
            rearm_round(i % 2 ? 200000 : 1000000, i % 2 == 1, seed + (uint64_t)i);
        if (!atomic_load(&failures))
            handover_round(seed + (uint64_t)i);
    }
    if (atomic_load(&failures)) {
        fprintf(stderr, "stress_core: %d failed checks (seed %" PRIu64 ")\n",
                atomic_load(&failures), seed);
        return 1;
    }
    printf("stress_core: all rounds passed\n");
    return 0;
}
