/*
 * hwt.h: the C core of hwtimer, Netty's HashedWheelTimer without Python.
 *
 * A timer owns a power-of-two wheel of buckets (intrusive doubly linked
 * lists) with coarser levels above it for far deadlines (wheel.h), a
 * lock-free multi-producer queue of new timeouts, a short-locked
 * queue of cancellations, and one worker thread that ticks.  Expired
 * timeouts are handed, a batch per tick, to "sinks": queues that a consumer
 * (a dispatch thread, an event loop) drains; cancelled ones come back on a
 * released list that any thread may take.  The core never allocates a
 * timeout: the embedder embeds `hwt_timeout` in its own objects.
 *
 * A timeout is re-armed in place: a reset moves a pending one to a new
 * deadline (the worker relinks the same node), and a periodic one comes back
 * to the wheel after each run at the next point of its grid, so neither
 * allocates and neither drifts.
 *
 * Threads: schedule, cancel, reset, re-arm and the sink calls are safe from
 * any thread.
 * Everything else about a timer (start, stop, advance, free) is called by
 * one thread at a time.
 *
 * Errors: one rule for the whole core (wheel.h and hwt_sys.h too), and each
 * contract below says which part of it the call uses.
 *   - A constructor (hwt_timer_new) returns the new object, or NULL with
 *     errno set.
 *   - Any other call that can fail returns an int: 0 when it succeeded, a
 *     positive errno value (ENOMEM, a pthread error, EINVAL) when it did
 *     not, and then it changed nothing.
 *   - Where the caller must tell apart outcomes that are not failures of
 *     the system (rejected, stopped, already expired or cancelled), that int
 *     is a named HWT_* code instead: HWT_OK (0), or a negative HWT_E* value,
 *     which no errno value equals, so that the same int may also carry a
 *     positive errno value.
 * A call that cannot fail returns what it computes (a bool, a count, a
 * list that is NULL when empty, HWT_NEVER for a deadline never reached).
 */
#ifndef HWT_H
#define HWT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HWT_NEVER               INT64_MAX /* a deadline that is never reached */
#define HWT_MAX_TICKS_PER_WHEEL (1u << 30)
#define HWT_MAX_LEVELS          12 /* level 0 and at most 11 of 64 slots (wheel.h) */

typedef struct hwt_timer hwt_timer;
typedef struct hwt_sink hwt_sink;

typedef struct hwt_link {
    struct hwt_link *next;
    struct hwt_link *prev; /* NULL while the timeout is not in a bucket */
} hwt_link;

/* States, changed under the timer's cancel lock, but for a cancel of a
   QUEUED one, a CAS without it (so every change from QUEUED is a CAS), so
   that cancel, reset and expiry exclude each other.  CANCELLED and EXPIRED
   are final.
     QUEUED   scheduled, not yet taken into the wheel by the worker: a
              cancel then needs no queue entry (the transfer releases it),
              and a reset only moves its deadline
     INIT     on the wheel
     RESET    on the wheel, a reset queued for the worker to relink it;
              never expired in this state, so never at the old deadline
     RUNNING  periodic: delivered, its run about to start or going; off the
              wheel until hwt_timeout_rearm() or _requeue() puts it back.
              One-shot, delivered to a sink with `ends_once`: its run not
              yet begun (hwt_timeout_begin() ends it)
     RUNNING_RESET  the same, with a reset already fixing the next deadline
   QUEUED -> INIT (the worker's transfer), INIT -> RESET -> INIT (the
   worker), INIT -> EXPIRED (one-shot expiry), INIT -> RUNNING -> QUEUED
   (periodic expiry, or a one-shot's to an `ends_once` sink, then re-arm or
   requeue), any but EXPIRED -> CANCELLED, RUNNING -> EXPIRED (the run
   ended it, or a one-shot's run begins). */
enum {
    HWT_INIT = 0,
    HWT_CANCELLED = 1,
    HWT_EXPIRED = 2,
    HWT_RESET = 3,
    HWT_RUNNING = 4,
    HWT_RUNNING_RESET = 5,
    HWT_QUEUED = 6,
};

/* What a periodic timeout does with runs it missed (its `flags`). */
enum { HWT_MISSED_SKIP = 0, HWT_MISSED_DELAY = 1, HWT_MISSED_BURST = 2 };

/* Embedded in the embedder's object; 40 bytes on 64-bit platforms.  A
   periodic timeout's period is not here but the embedder's, which passes it
   to each hwt_timeout_rearm(): a one-shot timeout, the common kind, does not
   carry it. */
typedef struct hwt_timeout {
    /* In a bucket: the bucket's list.  Queued or delivered: `link.next`
       chains the queue or the batch (cast back with hwt_timeout_of). */
    hwt_link link;
    /* ns since the timer's start; HWT_NEVER saturates.  Written by
       schedule, reset and re-arm, read by the worker: use the accessor. */
    _Atomic int64_t deadline;
    _Atomic uint32_t state; /* HWT_INIT ... HWT_QUEUED */
    /* bits 0-5 hwt.c's (HWT_PERIODIC, the worker's, a periodic's policy),
       6-31 the wheel's (wheel.h); rewritten by the worker while it links
       the timeout, so read HWT_PERIODIC only through the accessor below */
    uint32_t flags;
    hwt_sink *sink; /* borrowed: where its expiry is delivered */
} hwt_timeout;

/* The flag hwt_timer_schedule_periodic() sets, fixed until it is scheduled
   again. */
#define HWT_PERIODIC 2u

/* Whether `to` was scheduled periodic.  Read it while the timer does not
   hold `to` on its wheel: before scheduling, once delivered (a sink's
   batch, a run), or, inside the core, on the worker. */
static inline bool hwt_timeout_periodic(const hwt_timeout *to)
{
    return (to->flags & HWT_PERIODIC) != 0;
}

/* Whether `to` expires as HWT_RUNNING, not final, its consumer to end it:
   periodic, or one-shot bound for a sink with `ends_once` (defined below).
   Read it when hwt_timeout_periodic() may be read. */
static inline bool hwt_timeout_delivered_running(const hwt_timeout *to);

/* The deadline (ns since the timer's start) it is due at now. */
static inline int64_t hwt_timeout_deadline(const hwt_timeout *to)
{
    return atomic_load_explicit(&((hwt_timeout *)to)->deadline, memory_order_relaxed);
}

#define hwt_timeout_of(l) ((hwt_timeout *)(void *)(l))

/* Returns the time in ns on a monotonic clock. */
typedef int64_t (*hwt_clock_fn)(void *ctx);

typedef struct hwt_config {
    int64_t tick_ns;          /* > 0; tick_ns * ticks_per_wheel fits in int64 */
    uint32_t ticks_per_wheel; /* rounded up to a power of two, <= 2**30 */
    int64_t max_pending;      /* <= 0: no limit */
    const char *thread_name;  /* copied; NULL: "hwtimer" */
    bool wake_every_tick;     /* tick like Netty even when idle (for comparison) */
    bool manual;              /* no worker thread: hwt_timer_advance() drives it */
    hwt_clock_fn clock;       /* NULL: CLOCK_MONOTONIC */
    void *clock_ctx;
} hwt_config;

typedef struct hwt_stats {
    int64_t pending;
    uint64_t scheduled, expired, cancelled, rejected;
    /* of `expired`, the periodic timeouts that ended so (hwt_timeout_finish
       with HWT_EXPIRED): their runs are not expiries of the wheel.  A
       one-shot delivered to an `ends_once` sink counts as expired from its
       delivery, and moves to `cancelled` if a cancel comes before its run
       begins (back to pending if a reset does) */
    uint64_t expired_periodic;
    /* such one-shots that a cancel or reset took back out of `expired`:
       expired + revoked - expired_periodic counts the one-shot deliveries */
    uint64_t revoked;
    uint64_t ticks;   /* ticks processed: a bucket expired, or a far level cascaded */
    uint64_t wakeups; /* times the worker woke from sleep */
    uint64_t max_expired_per_tick;
    int64_t tick; /* the wheel's current tick */
} hwt_stats;

/* How the pending timeouts spread over the wheel (hwt_timer_occupancy). */
typedef struct hwt_level_occupancy {
    int64_t bucket_ticks; /* ticks a bucket spans: 1, level 0's size on level 1, then 64x */
    uint64_t buckets;     /* level 0's size (ticks_per_wheel, at most 2**22), 64 above */
    uint64_t occupied;    /* buckets holding at least one timeout */
    uint64_t timeouts;    /* timeouts held, cancelled ones not yet unlinked included */
    uint64_t fullest;     /* timeouts in the fullest bucket */
} hwt_level_occupancy;

typedef struct hwt_occupancy {
    unsigned levels; /* level[0 .. levels - 1] are filled in */
    hwt_level_occupancy level[HWT_MAX_LEVELS];
    uint64_t never; /* timeouts that never fall due: on no level, never visited */
    int64_t tick;   /* the wheel's current tick */
} hwt_occupancy;

/* The outcomes a caller tells apart (see "Errors" above): negative, so that
   no errno value is one of them. */
enum {
    HWT_OK = 0,
    HWT_EREJECTED = -1,  /* pending would pass max_pending */
    HWT_ESTOPPED = -2,   /* the timer is stopped, or was never started */
    HWT_ECANCELLED = -3, /* cancelled during its run */
    HWT_EAGAIN = -4,     /* a periodic's next run is due now */
    HWT_EFINAL = -5,     /* it had expired or been cancelled already: nothing changed */
    HWT_TAKEN = -6,      /* cancelled and taken back at once: the caller's now */
};

/* Sets *rounded to the wheel size for n buckets: n rounded up to a power
   of two.  Returns 0, or EINVAL (n is 0 or above HWT_MAX_TICKS_PER_WHEEL). */
int hwt_round_ticks(uint64_t n, uint32_t *rounded);

/* The default clock: CLOCK_MONOTONIC in ns. */
int64_t hwt_monotonic_ns(void *unused);

/* Returns a new stopped timer, or NULL with errno set: EINVAL for a bad
   config, ENOMEM, or the error of the pthread call that failed (what was
   made before it is undone; a failure of the process's one
   pthread_atfork() call fails every timer after it).  It holds one reference, dropped by
   hwt_timer_decref. */
hwt_timer *hwt_timer_new(const hwt_config *config);
void hwt_timer_incref(hwt_timer *t);
/* Frees the timer when the last reference goes; it must be stopped or
   never started by then. */
void hwt_timer_decref(hwt_timer *t);

/* Starts the worker (or, in manual mode, only the clock).  Returns 0, or
   an errno value: EALREADY once stopped, pthread_create's error, or, in a
   child of fork(), the error that kept the timer from being made usable
   there (hwt_timer_orphaned is then true), or HWT_ESTOPPED for one taken
   back by hwt_timer_unstart before the fork. */
int hwt_timer_start(hwt_timer *t);
/* Takes a started timer back to not started, for an embedder whose own
   start failed after hwt_timer_start: stops the worker and waits for it.
   Every timeout scheduled meanwhile stays as it was (on the wheel, queued,
   or delivered to a sink and not yet taken): a later hwt_timer_start runs
   them, with deadlines still counted from the first start, and
   hwt_timer_stop returns them.  No schedule is accepted until then.  A
   no-op unless started (and not orphaned).  Must not be called from the
   worker, nor race hwt_timer_start or hwt_timer_stop. */
void hwt_timer_unstart(hwt_timer *t);
bool hwt_timer_started(const hwt_timer *t);
bool hwt_timer_stopped(const hwt_timer *t);
/* True once hwt_timer_unstart has taken the timer back: not started, but
   it may hold timeouts, with deadlines counted from its first start. */
bool hwt_timer_unstarted(const hwt_timer *t);
/* True in a child of fork() for a timer started in the parent (it has no
   worker; one taken back by hwt_timer_unstart too, whose timeouts are the
   parent's, and whose hwt_timer_start returns HWT_ESTOPPED there), or for
   one the child could not make usable (hwt_timer_start returns why): it
   cannot be started again. */
bool hwt_timer_orphaned(const hwt_timer *t);

const hwt_config *hwt_timer_config(const hwt_timer *t);
/* The clock reading at start; deadlines count from it. */
int64_t hwt_timer_start_time(const hwt_timer *t);
int64_t hwt_timer_now(const hwt_timer *t);

/* Queues `to` (whose `sink` the caller has set) to expire `delay_ns` from
   now; `delay_ns` <= 0 means the next tick, HWT_NEVER never.  Returns
   an HWT_* code (it cannot fail): HWT_OK, HWT_EREJECTED (pending would
   pass max_pending) or HWT_ESTOPPED.
   On HWT_OK the timer owns `to` until it is delivered or returned by stop;
   `to->deadline` is set either way. */
int hwt_timer_schedule(hwt_timer *t, hwt_timeout *to, int64_t delay_ns);

/* The same for a periodic timeout: first due `delay_ns` from now, then on
   the grid of the period its consumer keeps, with `missed` (HWT_MISSED_*)
   for runs it misses.  It expires as HWT_RUNNING, counts once in pending,
   and its consumer calls hwt_timeout_rearm() (with that period) or
   hwt_timeout_finish() after each run. */
int hwt_timer_schedule_periodic(hwt_timer *t, hwt_timeout *to, int64_t delay_ns, int missed);

/* Moves a pending timeout's deadline to `delay_ns` from now (the rules of
   hwt_timer_schedule).  Returns an HWT_* code or an errno value:
   HWT_OK if it was pending and is re-armed (it will not expire before the
   new deadline, nor at the old one), HWT_EFINAL if it had expired or been
   cancelled, ENOMEM if the reset could not be queued (nothing changed
   either way).  On a periodic timeout during its run it moves the next
   run. */
int hwt_timeout_reset(hwt_timeout *to, int64_t delay_ns);

/* A period's fraction of a ns, and how far a grid point lies before its
   deadline, are counted in HWT_FRAC_ONE-ths of a ns (each below it). */
#define HWT_FRAC_BITS 30
#define HWT_FRAC_ONE  (UINT32_C(1) << HWT_FRAC_BITS)

/* The next deadline (ns since the timer's start) of a periodic timeout
   whose run at grid point `deadline` began at `start` and ended at `end`
   (ns since the timer's start too), by its `missed` policy.  Sets *again
   when that next run is due already and the policy wants it now (the
   missed runs of a burst; delay's one run after an overrun, which starts
   its new grid).  The period is period + period_frac / HWT_FRAC_ONE ns, a
   whole ns or not, so that runs k periods apart are k exact periods apart:
   `deadline` is its grid point rounded up to a whole ns, and *behind
   (HWT_FRAC_ONE-ths of a ns) how far the grid point lies before it, both
   read and updated; both fractions are 0 on a grid of whole ns. */
int64_t hwt_periodic_next(int64_t deadline, uint32_t *behind, int64_t period, uint32_t period_frac,
                          int missed, int64_t start, int64_t end, bool *again);

/* Ends a periodic timeout's run (state RUNNING or RUNNING_RESET) that
   began at clock time `start` and ended at `end`; `period_ns` (> 0) is its
   period, the same at every re-arm (the embedder keeps it).  `catch_up`
   says that this run is the one the re-arm before it asked for with
   HWT_EAGAIN, not reset since (the embedder keeps that too): for the delay
   policy its grid starts at `start`, which comes after its deadline if
   the run waited (hwt_timeout_requeue()).  Returns an HWT_* code (it
   cannot fail):
     HWT_OK         back on the wheel at its next deadline (the timer owns it);
     HWT_EAGAIN     the next run is due now (burst, delay): still RUNNING,
                    its deadline moved: run it again, then re-arm again;
     HWT_ECANCELLED cancelled during the run: counted, the caller's;
     HWT_ESTOPPED   the timer is stopped: now CANCELLED, counted, the
                    caller's (stop() did not see it: hand it to the user). */
int hwt_timeout_rearm(hwt_timeout *to, int64_t period_ns, int64_t start, int64_t end,
                      bool catch_up);
/* hwt_timeout_rearm() on a period of period_ns + period_frac / HWT_FRAC_ONE
   ns (hwt_periodic_next()): *behind, the embedder's, says how far the
   grid point of the run that ended lies before its deadline, and is set
   for the next one; 0 for a deadline that reset() set, or a first one
   that is a whole ns from its schedule. */
int hwt_timeout_rearm_exact(hwt_timeout *to, int64_t period_ns, uint32_t period_frac,
                            uint32_t *behind, int64_t start, int64_t end, bool catch_up);

/* Puts a delivered periodic timeout (RUNNING or RUNNING_RESET) back on the
   wheel at the deadline it has, as due already or as reset, without a run:
   one reset before its run began, or one whose next run hwt_timeout_rearm()
   found due at once and that must wait behind other due work.  Returns
   HWT_OK, HWT_ECANCELLED or HWT_ESTOPPED, as hwt_timeout_rearm() does. */
int hwt_timeout_requeue(hwt_timeout *to);

/* Ends a delivered periodic timeout for good (its task raised: `final`
   HWT_EXPIRED; it will not run: HWT_CANCELLED) and counts it, unless a
   cancel came first (which counted it).  Returns its final state; the
   caller owns it.  Also ends a one-shot delivered RUNNING that will not
   run (HWT_CANCELLED). */
uint32_t hwt_timeout_finish(hwt_timeout *to, uint32_t final);

/* Begins the run of a one-shot timeout delivered RUNNING to an `ends_once`
   sink: one compare-and-swap, RUNNING -> EXPIRED, after which cancel and
   reset find it expired.  Returns the state it found or made:
     HWT_EXPIRED        run it now (also for one delivered EXPIRED);
     HWT_CANCELLED      a cancel came first (and counted it): do not run it;
     HWT_RUNNING_RESET  a reset moved it: hwt_timeout_requeue() it, do not
                        run it. */
uint32_t hwt_timeout_begin(hwt_timeout *to);

/* Returns an HWT_* code or an errno value: HWT_OK if this call cancelled
   `to`, HWT_EFINAL if it had expired or been cancelled already, ENOMEM if
   the cancel could not be queued (nothing changed either way).  The
   worker unlinks it at its next tick (or, if it was still QUEUED, drops it
   when it transfers) and hands it back through hwt_timer_take_released().
   A QUEUED one is cancelled without the cancel lock. */
int hwt_timeout_cancel(hwt_timeout *to);

/* As hwt_timeout_cancel(), and when `to` is still the newest timeout
   queued (a cancel right after its schedule, nothing pushed since), takes
   it back off the queue: then returns HWT_TAKEN, and `to` is the caller's
   at once, as if hwt_timer_take_released() had returned it; the worker
   never sees it. */
int hwt_timeout_cancel_take(hwt_timeout *to);

int64_t hwt_timer_pending(hwt_timer *t);
void hwt_timer_stats(hwt_timer *t, hwt_stats *out);

/* Fills `out` with the wheel's occupancy.  What the worker has yet to
   take from the producers' queue is taken into the wheel first, as
   hwt_timer_soonest() does (a sleeping worker is woken to plan again), so
   every pending timeout counts.  It holds the wheel while it counts (a few
   microseconds; longer only for a huge, sparse level 0, or a long queue),
   so the worker waits that long; producers are never held up. */
void hwt_timer_occupancy(hwt_timer *t, hwt_occupancy *out);

/* hwt_timer_occupancy(), and `stats` (if not NULL) filled as
   hwt_timer_stats() does, both read while the wheel is held: the worker
   expires nothing in between, so a caller that keeps producers and
   cancellers out meanwhile (the GIL) gets counts that match the spread. */
void hwt_timer_stats_occupancy(hwt_timer *t, hwt_stats *stats, hwt_occupancy *out);

/* Called by hwt_timer_soonest for each timeout it found, in order. */
typedef void (*hwt_visit_fn)(void *ctx, hwt_timeout *to);

/* Finds the `limit` pending timeouts (neither expired nor cancelled) that
   fall due first, those not yet moved into the wheel and those reset
   included (at their new deadline; a periodic one in its run is not on
   the wheel and not included), and calls
   fn for each, once, in deadline order, ties in scheduling order; sets
   *found to how many (one reset while the walk runs is found at the
   deadline the walk met it at).  It holds the wheel, not the producers' queues: schedule and
   cancel go on meanwhile, the worker waits.  It first does the worker's
   part of its next tick that comes before expiry (queued cancels and
   resets, the transfer of new timeouts into the wheel), then walks the
   wheel, and stops at the first bucket that completes `limit`, so it
   costs the timeouts due up to there plus those queued, whatever the
   pending count.  While fn runs each timeout it is given is alive (the
   worker cannot release it), but it may be cancelled or expire the moment
   this returns: fn takes what it keeps (a reference) and must not call
   stop or advance.  Returns 0, or an
   errno value, ENOMEM (nothing was visited). */
int hwt_timer_soonest(hwt_timer *t, size_t limit, hwt_visit_fn fn, void *ctx, size_t *found);

/* Called by hwt_timer_visit_held for each timeout; a nonzero return stops
   the walk, and is returned. */
typedef int (*hwt_held_fn)(void *ctx, hwt_timeout *to);

/* Manual mode: calls fn once for each timeout the timer holds, each that
   the embedder scheduled and has not had back: queued, on the wheel
   (cancelled ones not yet unlinked included), in a batch being built,
   delivered to the default sink and not yet taken, or released and not yet
   taken.  Not those published to another sink (its consumer holds them),
   nor those taken out (a batch taken from a sink, a periodic one in its
   run).  A timeout is on one list at a time, so none is visited twice.
   The caller keeps every other thread from changing the timer meanwhile
   (the embedder's lock), and fn changes nothing of it.  Returns 0, or the
   first nonzero value fn returned.  A timer with a worker is not walked
   (its worker changes the lists): 0. */
int hwt_timer_visit_held(hwt_timer *t, hwt_held_fn fn, void *ctx);

/* Stops the worker and waits for it (after hwt_timer_unstart, there is
   none: it sweeps what was kept).  Returns the timeouts that had
   neither expired nor been cancelled, each now CANCELLED and owned by the
   caller, chained by link.next.  Cancelled ones still held are released
   (hwt_timer_take_released), and every sink is marked finished.  A second
   call returns NULL; but in a child of fork() made while another thread's
   call was under way, the child's first call returns what that one had
   not yet swept.  Must not be called from the worker. */
hwt_timeout *hwt_timer_stop(hwt_timer *t);
/* hwt_timer_stop(), storing its list in *out before it lets go of the
   timer's lock, which fork() takes first: in a child of a fork() made by
   another thread while this call ran, *out holds what it swept, or the
   child's hwt_timer_stop() returns it (it had not swept yet). */
void hwt_timer_stop_to(hwt_timer *t, hwt_timeout **out);

/* Manual mode: processes every tick whose end is at or before `now`.
   Returns the clock value at which the next tick with work ends, or
   HWT_NEVER if nothing is pending.  That work may be a cascade of a far
   level, after which nothing has expired yet: call again with what it
   returns then (a far timeout takes at most one such step per level). */
int64_t hwt_timer_advance(hwt_timer *t, int64_t now);

/* ---- sinks: where expired (and released) timeouts are delivered ---- */

/* Wakes a sink's consumer.  Called by the worker with the sink's lock held,
   once per batch that makes an empty sink non-empty. */
typedef void (*hwt_wake_fn)(hwt_sink *s);

struct hwt_sink {
    hwt_timer *timer; /* borrowed: the timer it belongs to */
    void *owner;      /* the embedder's, never touched by the core */
    hwt_wake_fn wake; /* NULL: signal `ready` */
    int wake_fd;      /* for the embedder's wake function; -1 if unused */
    pthread_mutex_t lock;
    pthread_cond_t ready;
    /* under lock */
    hwt_timeout *head, *tail;
    bool closed;           /* deliveries are released instead */
    bool finished;         /* the timer stopped: nothing more will arrive */
    bool released_waiting; /* hwt_sink_wait returns: released timeouts wait */
    bool sleeping;         /* its consumer waits in hwt_sink_wait */
    bool handing_over;     /* the worker waits for what it woke the consumer for */
    /* set by the embedder before anything is scheduled for the sink, fixed
       from then on: one-shot timeouts are delivered here RUNNING, not
       EXPIRED, and stay cancellable until the consumer begins each run
       with hwt_timeout_begin() (or ends it with hwt_timeout_finish, or
       puts a reset one back with hwt_timeout_requeue) */
    bool ends_once;
    /* the worker's own: the batch it is building this tick */
    hwt_timeout *batch_head, *batch_tail;
    hwt_sink *batch_next;
    bool in_batch;
    /* the timer's list of sinks, under the timer's sinks lock */
    hwt_sink *next_sink, *prev_sink;
};

static inline bool hwt_timeout_delivered_running(const hwt_timeout *to)
{
    return hwt_timeout_periodic(to) || (to->sink && to->sink->ends_once);
}

/* The sink for timeouts without one of their own.  Owned by the timer. */
hwt_sink *hwt_timer_default_sink(hwt_timer *t);

/* Takes the timeouts handed back to be released, not run (cancelled ones,
   and expired ones whose sink was closed), oldest first, or NULL; cheap
   when there are none, so producers call it in passing.  Each batch also
   wakes the default sink's consumer (hwt_sink_wait returns), which takes
   them if nobody has. */
hwt_timeout *hwt_timer_take_released(hwt_timer *t);
/* Whether released timeouts wait to be taken. */
bool hwt_timer_has_released(hwt_timer *t);

/* Initialises `s` for timer `t`.  Returns 0, or an errno value (a pthread
   init's: nothing is left to destroy). */
int hwt_sink_init(hwt_sink *s, hwt_timer *t, hwt_wake_fn wake, int wake_fd, void *owner);
/* Closes `s` and returns what was delivered and not yet taken; later
   expiries for it go to the released list.  Call before hwt_sink_destroy. */
hwt_timeout *hwt_sink_close(hwt_sink *s);
void hwt_sink_destroy(hwt_sink *s);

/* Takes everything delivered, oldest first (NULL if nothing). */
hwt_timeout *hwt_sink_take(hwt_sink *s);
/* Whether something delivered waits to be taken. */
bool hwt_sink_has_work(hwt_sink *s);
/* Puts `list` (oldest first) back in front of what is queued, and returns
   NULL; or, if the sink was closed meanwhile, which nothing takes from
   again, ends it as hwt_sink_close() ends what it held and returns it: the
   caller releases it. */
hwt_timeout *hwt_sink_put_back(hwt_sink *s, hwt_timeout *list);
/* Blocks until something is delivered, the sink is finished, or (the
   default sink) released timeouts wait to be taken; takes what was
   delivered (maybe NULL).  Sets *finished when nothing more will arrive.
   When `taken` is not NULL, stores what it takes there too before it lets
   go of the sink, so that a child of fork() finds a delivered timeout in
   the sink or in *taken, never in neither. */
hwt_timeout *hwt_sink_wait(hwt_sink *s, bool *finished, hwt_timeout **taken);

/* Recent task lateness, kept by the embedder through the core so that
   stats() reads one place.  Callers serialise (the binding holds the GIL).
   A task the embedder ran without reading the clock around it is counted
   by hwt_timer_record_untimed() instead. */
void hwt_timer_record_task(hwt_timer *t, int64_t late_ns, int64_t run_ns);
void hwt_timer_record_untimed(hwt_timer *t);
typedef struct hwt_latency {
    int64_t late_p50, late_p99, late_max, task_time_max;
    size_t samples;
    uint64_t untimed; /* tasks run untimed, since the timer was made */
} hwt_latency;
/* Returns 0, or ENOMEM (then *out is not filled in). */
int hwt_timer_latency(hwt_timer *t, hwt_latency *out);

#endif /* HWT_H */
