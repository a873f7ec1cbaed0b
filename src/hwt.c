/*
 * hwt.c: the timer's queues, the worker thread and the sinks, around the
 * hierarchical wheel of wheel.h.
 *
 * Netty's algorithm, with three changes that keep its behaviour: the worker
 * sleeps straight to the next tick with work (the wheel's occupancy bitmaps
 * find it) and blocks when nothing is pending; a timeout's remaining rounds
 * are not counted down but read off its deadline (it is due at the first
 * tick T with deadline <= (T + 1) * tick), which stays right across skipped
 * ticks; and deadlines beyond one turn wait on coarser levels instead of
 * being visited every turn.
 *
 * Ownership: a scheduled timeout belongs to the timer until the worker
 * delivers it to a sink (expired) or to the released list (cancelled and
 * unlinked, or expired for a closed sink), or stop() returns it.  Only the
 * worker (or, once it has exited, stop) touches the wheel; producers touch
 * the new-timeout stack and the cancel vector.
 */
#define _GNU_SOURCE
#include "hwt.h"
#include "hwt_sys.h"
#include "wheel.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LATENCY_WINDOW 4096

/* The worker moves at most this many new timeouts into the wheel per tick,
   so that a flood of schedules cannot starve expiry.  A manual timer takes
   them all: it has no worker that producers wake to transfer ahead of
   time (TRANSFER_WAKE_BATCH), so the rest would fall due a tick late, and
   each transfer takes only what was queued when it began. */
#define MAX_TRANSFER_PER_TICK 100000

/* A sleeping worker is woken for cancels when this many are queued, so
   their references are not held long; and by the first cancel when it
   would otherwise sleep longer than CANCEL_WAKE_SLEEP_NS, at most once in
   that time (else it sleeps no longer than that). */
#define CANCEL_WAKE_BATCH    4096
#define CANCEL_WAKE_SLEEP_NS INT64_C(1000000000)
enum { CANCEL_WAKE_NONE = 0, CANCEL_WAKE_AT_BATCH = 1, CANCEL_WAKE_AT_FIRST = 2 };

/* A sleeping worker is woken to transfer when this many new timeouts have
   queued, so a burst is in its buckets before it falls due: what is left
   for the due tick's transfer, in front of its first task, is less than
   this (65536 of them took 2 ms).  Counted net of the ones that their
   cancel took straight back: a schedule + cancel loop queues nothing and
   never wakes it.  One cancelled while queued but not taken back stays on
   the queue for the worker, and counts. */
#define TRANSFER_WAKE_BATCH 4096

/* The worker takes new timeouts out of the QUEUED state this many at a
   time under the cancel lock (a reset of a queued one writes its deadline
   under that lock), so that cancels wait for it a few microseconds at
   most. */
#define TRANSFER_CHUNK 256

/* A bucket with many due timeouts is handed over in slices of this many,
   so that consumers run the first while the worker walks the rest; the
   first slice is smaller, so that the first task starts after a walk of a
   few microseconds rather than of 8192 cold nodes. */
#define EXPIRE_FIRST_SLICE 256
#define EXPIRE_SLICE       8192
/* The worker expires a bucket this many timeouts at a time under the
   cancel lock (as TRANSFER_CHUNK). */
#define EXPIRE_CHUNK 256

/* Having woken a sleeping consumer for the first slice, the worker waits
   until that consumer has taken it, or this long at most (and one tick at
   most).  Where the CPUs are fewer than the threads that want one (a busy
   machine, a VM sharing its host), a woken consumer waits for a CPU while
   the worker walks on: measured here, 1-4 ms before the first task.  The
   worker giving its CPU up for the moment it takes the consumer to start
   brings that to 0.1 ms; on a machine with a CPU to spare the consumer is
   there in microseconds, and the wait is as short. */
#define HANDOVER_WAIT_NS INT64_C(1000000)

/* A worker that has just gone idle sleeps this long before it blocks for
   good: sparse traffic (a timeout scheduled and cancelled at a time) then
   costs it two wake-ups a second (the first cancel of a second, and that
   second's end: CANCEL_WAKE_SLEEP_NS) rather than two per timeout. */
#define LINGER_NS INT64_C(1000000000)

/* timeout->flags: bits 0-5 (HWT_PERIODIC, bit 1, in hwt.h); the wheel keeps
   the rest (HWT_WHEEL_FLAGS_MASK, HWT_WHEEL_INDEX_MASK) */
#define MISSED_SHIFT 4  /* a periodic's HWT_MISSED_* policy, set at schedule */
#define MISSED_MASK  0x30u

/* A reset's entry in the cancel vector: the node's address with this bit. */
#define RESET_TAG ((uintptr_t)1)

/* lifecycle */
enum { T_NEW = 0, T_STARTED = 1, T_STOPPED = 2 };

/* Marks the new-timeout stack closed by stop(). */
#define CLOSED ((hwt_timeout *)(uintptr_t)1)

struct hwt_timer {
    hwt_config cfg;
    char name[16];

    /* Producers' cache line: they push, the worker takes all (a Treiber
       stack, newest first).  `scheduled` counts accepted timeouts; pending
       is scheduled - expired - cancelled, so producers never write a line
       the worker writes. */
    _Alignas(64) _Atomic(hwt_timeout *) new_head;
    _Atomic uint64_t scheduled, rejected;
    /* cancelled while QUEUED, by any thread (fetch_add): a cancel right
       after its schedule finds this line where the schedule left it; of
       them, those taken straight back off the stack are counted apart */
    _Atomic uint64_t cancelled_queued, taken_back;

    /* Read by producers, written by the worker when it sleeps or wakes:
       producers wake it for a deadline below wake_limit. */
    _Alignas(64) _Atomic int64_t wake_limit;
    /* the queued_net() that wakes it (INT64_MAX: awake) */
    _Atomic int64_t transfer_wake_at;
    _Atomic int cancel_wake;           /* CANCEL_WAKE_*: when cancels wake the worker */
    hwt_park park;                     /* where the worker sleeps */
    _Atomic bool stopping;
    _Atomic bool released_ready; /* `released` holds timeouts to release */
    /* bumped by a thread other than the worker that moved timeouts into the
       wheel (a snapshot): a worker about to sleep on an older plan wakes */
    _Atomic uint64_t outside_transfers;

    _Alignas(64) pthread_mutex_t cancel_lock;
    hwt_timeout **cancels; /* owned, under cancel_lock */
    size_t ncancels, cancels_cap;
    /* of the ncancels entries, the cancels (the rest are resets): what
       wakes a sleeping worker (wake_for_cancels) */
    size_t ncancelled;
    /* the soonest deadline that a reset waiting there moved a timeout to
       (HWT_NEVER: none) */
    int64_t reset_soonest;
    bool cancel_closed;
    /* written under cancel_lock by cancel() (and stop), read by stats():
       on the cancellers' line, not the worker's */
    _Atomic uint64_t cancelled;
    /* one-shots counted in `expired` at their delivery to an `ends_once`
       sink that left RUNNING other than by their run (cancelled, or reset:
       pending again): under cancel_lock too */
    _Atomic uint64_t revoked;
    /* places that resets of such one-shots hold under max_pending while
       they check it, before `revoked` counts them (reset_locked) */
    _Atomic uint64_t reserved;

    /* The worker's own (after it exits, stop's). */
    _Alignas(64) hwt_timeout **cancels_spare; /* owned: swapped with cancels */
    size_t spare_cap;
    hwt_timeout *xfer_head, *xfer_tail; /* taken from new_head, FIFO */
    hwt_wheel wheel;                    /* its `elapsed` is the next tick to process */
    uint64_t expiring, expiring_once;   /* expired so far this tick; of them, one-shot */
    hwt_sink *batch_sinks;              /* sinks with a batch this tick */
    bool did_work;                      /* the last run_due() did something */
    int64_t cancel_armed_at;            /* when the first cancel last could wake it */
    uint64_t transfers_seen;            /* outside_transfers as its last run_due() saw it */
    /* written by the worker only (release), read by stats() (acquire) */
    _Atomic uint64_t expired, ticks, wakeups, max_expired;
    _Atomic int64_t tick_seen;
    /* periodic timeouts ended by their consumers, any thread (fetch_add) */
    _Atomic uint64_t expired_out, cancelled_out;

    /* held by the worker while it processes, so fork() sees a quiet wheel */
    pthread_mutex_t lock;
    pthread_t thread;
    _Atomic int state;
    bool orphaned;
    /* in a child of fork(): the errno value that kept a condition variable
       from being made again there (the timer is orphaned then), or 0 */
    int fork_err;
    /* written by start before it sets `state`, read by producers that read
       `state` first: through start_of() */
    _Atomic int64_t start_time;
    /* started once and taken back by hwt_timer_unstart: the start time
       stays, and the wheel may hold timeouts for stop() to sweep */
    bool unstarted;
    /* in a child of fork() made while another thread's stop() had not yet
       swept the timer (that thread stayed in the parent): the child's
       stop() sweeps it */
    bool unswept;

    hwt_sink default_sink;
    /* Timeouts to release, not run: cancelled ones, and expired ones whose
       sink was closed.  Whoever holds the embedder's lock next takes them. */
    hwt_sink released;
    pthread_mutex_t sinks_lock;
    hwt_sink *sinks; /* every initialised sink, default_sink included */

    /* lateness window, serialised by the embedder */
    int64_t late[LATENCY_WINDOW];
    size_t late_n, late_pos;
    int64_t task_time_max;
    uint64_t untimed;

    _Atomic int refs;
    hwt_timer *reg_next, *reg_prev; /* process registry, for fork */
};

/* ---- process registry and fork ---- */

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static hwt_timer *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
/* what pthread_atfork() returned: without the handlers a child of fork()
   would inherit locks held by other threads, so no timer is made */
static int atfork_err;

static void lock_timer_for_fork(hwt_timer *t)
{
    pthread_mutex_lock(&t->lock);
    pthread_mutex_lock(&t->cancel_lock);
    pthread_mutex_lock(&t->sinks_lock);
    for (hwt_sink *s = t->sinks; s; s = s->next_sink)
        pthread_mutex_lock(&s->lock);
    hwt_park_lock_for_fork(&t->park);
}

static void unlock_timer_after_fork(hwt_timer *t, bool child)
{
    /* The child makes the condition variables again: the parent's waiters
       did not come along.  Should that fail, the timer cannot be used in
       the child; start says why. */
    int err = hwt_park_unlock_after_fork(&t->park, child);
    for (hwt_sink *s = t->sinks; s; s = s->next_sink) {
        if (child) {
            int cond_err = hwt_cond_init(&s->ready);
            if (!err)
                err = cond_err;
        }
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&t->sinks_lock);
    pthread_mutex_unlock(&t->cancel_lock);
    pthread_mutex_unlock(&t->lock);
    /* its worker did not come along; or it had one, taken back by
       hwt_timer_unstart, and what it holds waits for the parent's next
       start: a start here would run it a second time */
    if (child && (t->state == T_STARTED || (t->state == T_NEW && t->unstarted)) && !t->cfg.manual)
        t->orphaned = true;
    /* a stop() under way, waiting for the worker or for t->lock: what it
       would have returned is still held, and the child's stop() returns it */
    if (child && t->state == T_STOPPED && !t->cancel_closed)
        t->unswept = true;
    if (child && err) {
        t->fork_err = err;
        t->orphaned = true;
    }
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&registry_lock);
    for (hwt_timer *t = registry; t; t = t->reg_next)
        lock_timer_for_fork(t);
}

static void atfork_parent(void)
{
    for (hwt_timer *t = registry; t; t = t->reg_next)
        unlock_timer_after_fork(t, false);
    pthread_mutex_unlock(&registry_lock);
}

static void atfork_child(void)
{
    for (hwt_timer *t = registry; t; t = t->reg_next)
        unlock_timer_after_fork(t, true);
    pthread_mutex_unlock(&registry_lock);
}

static void install_atfork(void)
{
    atfork_err = pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

/* ---- small helpers ---- */

int64_t hwt_monotonic_ns(void *unused)
{
    (void)unused;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int hwt_round_ticks(uint64_t n, uint32_t *rounded)
{
    if (n == 0 || n > HWT_MAX_TICKS_PER_WHEEL)
        return EINVAL;
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    *rounded = p;
    return 0;
}

/* Timeouts scheduled, `scheduled` of them, less those taken straight back
   by their cancel: what has been pushed onto the producers' stack and
   stays there until the worker takes it, give or take what other threads
   do meanwhile (so it may be read a little low, or even negative). */
static inline int64_t queued_net(hwt_timer *t, uint64_t scheduled)
{
    return (int64_t)(scheduled - atomic_load_explicit(&t->taken_back, memory_order_relaxed));
}

/* The clock reading at start (see the field). */
static inline int64_t start_of(const hwt_timer *t)
{
    return atomic_load_explicit(&((hwt_timer *)t)->start_time, memory_order_relaxed);
}

static inline int64_t now_rel(const hwt_timer *t)
{
    return t->cfg.clock(t->cfg.clock_ctx) - start_of(t);
}

/* Wakes the worker if it is sleeping; otherwise it will see the work when
   it next checks before sleeping. */
static void wake_worker(hwt_timer *t)
{
    hwt_park_wake(&t->park);
}

/* Writes the queue or batch link of a timeout that may have been on top
   of the producers' stack.  Relaxed atomic, as take_back_newest() reads it:
   a cancel that saw the timeout on top may read its link late, after the
   worker took the stack, and then fails its compare-and-swap and drops
   what it read; the write and the read must still not race. */
static inline void set_next(hwt_timeout *to, hwt_link *next)
{
    __atomic_store_n(&to->link.next, next, __ATOMIC_RELAXED);
}

/* ---- delivery to sinks (worker side) ---- */

/* Appends the chain head .. tail (its end's link NULL) to `s`'s batch. */
static void append_to_batch(hwt_sink *s, hwt_timeout *head, hwt_timeout *tail)
{
    if (s->batch_tail)
        set_next(s->batch_tail, &head->link);
    else
        s->batch_head = head;
    s->batch_tail = tail;
}

static void deliver(hwt_timer *t, hwt_timeout *to, hwt_sink *s)
{
    set_next(to, NULL);
    append_to_batch(s, to, to);
    if (s != &t->default_sink && s != &t->released && !s->in_batch) {
        s->in_batch = true;
        s->batch_next = t->batch_sinks;
        t->batch_sinks = s;
    }
}

/* Appends `s`'s batch to what it holds and wakes its consumer if it was
   empty.  Returns NULL, or the batch undelivered if the sink is closed.
   The worker does not touch `s` after this: its owner may free it as soon
   as it has taken what was delivered. */
static hwt_timeout *publish_batch(hwt_sink *s)
{
    hwt_timeout *batch = s->batch_head, *last = s->batch_tail;
    s->batch_head = s->batch_tail = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->closed) {
        pthread_mutex_unlock(&s->lock);
        return batch;
    }
    bool was_empty = s->head == NULL;
    if (s->tail)
        set_next(s->tail, &batch->link);
    else
        s->head = batch;
    s->tail = last;
    if (was_empty) {
        if (s->wake)
            s->wake(s);
        else
            pthread_cond_signal(&s->ready);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Asks the default sink's consumer to look at the released list. */
static void wake_for_released(hwt_sink *s)
{
    pthread_mutex_lock(&s->lock);
    s->released_waiting = true;
    pthread_cond_signal(&s->ready);
    pthread_mutex_unlock(&s->lock);
}

/* Adds this tick's released timeouts to the list that producers take in
   passing (they hold the lock their release needs), and tells the default
   sink's consumer, which takes them if no producer has by then. */
static void publish_released(hwt_timer *t)
{
    hwt_sink *r = &t->released;
    hwt_timeout *batch = r->batch_head, *last = r->batch_tail;
    r->batch_head = r->batch_tail = NULL;
    pthread_mutex_lock(&r->lock);
    if (r->tail)
        set_next(r->tail, &batch->link);
    else
        r->head = batch;
    r->tail = last;
    pthread_mutex_unlock(&r->lock);
    atomic_store_explicit(&t->released_ready, true, memory_order_release);
    wake_for_released(&t->default_sink);
}

/* A closed sink's consumer is gone: what publish_batch() handed back is
   released instead. */
static void release_undelivered(hwt_timer *t, hwt_timeout *to)
{
    for (hwt_timeout *n; to; to = n) {
        n = hwt_timeout_of(to->link.next);
        if (hwt_timeout_delivered_running(to))
            hwt_timeout_finish(to, HWT_CANCELLED); /* it will not run (again) */
        deliver(t, to, &t->released);
    }
}

static void publish_batches(hwt_timer *t)
{
    hwt_sink *s = t->batch_sinks;
    t->batch_sinks = NULL;
    while (s) {
        hwt_sink *next = s->batch_next;
        s->in_batch = false;
        release_undelivered(t, publish_batch(s));
        s = next;
    }
    if (t->default_sink.batch_head)
        release_undelivered(t, publish_batch(&t->default_sink));
    if (t->released.batch_head)
        publish_released(t);
}

/* ---- the tick: cancellations, transfer, expiry ---- */

/* A cancelled timeout is done with: hand it back to be released. */
static void release_cancelled(hwt_timer *t, hwt_timeout *to)
{
    deliver(t, to, &t->released);
}

/* Adds n to a counter with one writer at a time (see the fields). */
static inline void count(_Atomic uint64_t *counter, uint64_t n)
{
    atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + n,
                          memory_order_release);
}

/* Only a timeout on the wheel has a cancel entry: one cancelled while
   QUEUED has none, and its transfer releases it. */
static void process_cancel(hwt_timer *t, hwt_timeout *to)
{
    assert(hwt_wheel_linked(to));
    hwt_wheel_unlink(&t->wheel, to);
    release_cancelled(t, to);
}

/* Relinks a reset timeout at its new deadline.  Under cancel_lock, so that
   no reset moves the deadline between the read and the relink.  One that
   was cancelled since has its own cancel entry. */
static void process_reset(hwt_timer *t, hwt_timeout *to)
{
    uint32_t expect = HWT_RESET;
    if (atomic_load_explicit(&to->state, memory_order_relaxed) != HWT_RESET)
        return;
    hwt_wheel_unlink(&t->wheel, to);
    hwt_wheel_insert(&t->wheel, to);
    atomic_compare_exchange_strong(&to->state, &expect, HWT_INIT);
}

/* Processes the queued resets (relinked under the lock) and cancels. */
static void process_cancels(hwt_timer *t)
{
    pthread_mutex_lock(&t->cancel_lock);
    size_t n = t->ncancels;
    hwt_timeout **v = t->cancels;
    size_t cap = t->cancels_cap;
    for (size_t i = 0; i < n; i++) {
        if ((uintptr_t)v[i] & RESET_TAG)
            process_reset(t, (hwt_timeout *)((uintptr_t)v[i] & ~RESET_TAG));
    }
    t->cancels = t->cancels_spare;
    t->cancels_cap = t->spare_cap;
    t->ncancels = t->ncancelled = 0;
    t->reset_soonest = HWT_NEVER;
    pthread_mutex_unlock(&t->cancel_lock);
    for (size_t i = 0; i < n; i++) {
        if (!((uintptr_t)v[i] & RESET_TAG))
            process_cancel(t, v[i]); /* counted by hwt_timeout_cancel already */
    }
    if (n)
        t->did_work = true;
    t->cancels_spare = v;
    t->spare_cap = cap;
}

/* Moves what producers pushed onto the worker's FIFO list. */
static void take_new(hwt_timer *t, hwt_timeout *replacement)
{
    hwt_timeout *stack = atomic_exchange(&t->new_head, replacement);
    if (stack == CLOSED)
        stack = NULL;
    hwt_timeout *fifo = NULL, *last = stack;
    while (stack) {
        hwt_timeout *n = hwt_timeout_of(stack->link.next);
        set_next(stack, (hwt_link *)fifo);
        fifo = stack;
        stack = n;
    }
    if (!fifo)
        return;
    if (t->xfer_tail)
        set_next(t->xfer_tail, &fifo->link);
    else
        t->xfer_head = fifo;
    t->xfer_tail = last;
}

static hwt_timeout *pop_xfer(hwt_timer *t)
{
    hwt_timeout *to = t->xfer_head;
    if (to) {
        t->xfer_head = hwt_timeout_of(to->link.next);
        if (!t->xfer_head)
            t->xfer_tail = NULL;
        set_next(to, NULL);
    }
    return to;
}

/* Takes `to` out of the QUEUED state: links it into its bucket, or
   releases it if a cancel came first.  Called with cancel_lock held, so
   that the deadline read is the last a reset wrote while it was QUEUED,
   and a reset or cancel from here on queues an entry for the wheel. */
static void take_into_wheel(hwt_timer *t, hwt_timeout *to)
{
    uint32_t expect = HWT_QUEUED;
    if (atomic_compare_exchange_strong(&to->state, &expect, HWT_INIT))
        hwt_wheel_insert(&t->wheel, to);
    else /* cancelled while queued, counted by its cancel */
        release_cancelled(t, to);
}

/* Moves at most `limit` queued timeouts into their buckets. */
static void transfer(hwt_timer *t, size_t limit)
{
    take_new(t, NULL);
    while (limit && t->xfer_head) {
        size_t n = limit < TRANSFER_CHUNK ? limit : TRANSFER_CHUNK;
        limit -= n;
        t->did_work = true;
        pthread_mutex_lock(&t->cancel_lock);
        for (hwt_timeout *to; n-- && (to = pop_xfer(t));)
            take_into_wheel(t, to);
        pthread_mutex_unlock(&t->cancel_lock);
    }
}

/* After the first slice of a large bucket: if it woke the default sink's
   consumer, waits until that consumer has taken it (HANDOVER_WAIT_NS). */
static void await_handover(hwt_timer *t)
{
    hwt_sink *s = &t->default_sink;
    /* the park's handshake: a take from here on ends the wait */
    hwt_park_prepare(&t->park);
    pthread_mutex_lock(&s->lock);
    bool untaken = s->head != NULL && s->sleeping;
    s->handing_over = untaken;
    pthread_mutex_unlock(&s->lock);
    if (!untaken) {
        hwt_park_cancel(&t->park);
        return;
    }
    int64_t wait = t->cfg.tick_ns < HANDOVER_WAIT_NS ? t->cfg.tick_ns : HANDOVER_WAIT_NS;
    /* a producer's wake ends it early too, which does no harm */
    hwt_park_until(&t->park, hwt_monotonic_ns(NULL) + wait);
    pthread_mutex_lock(&s->lock);
    s->handing_over = false;
    pthread_mutex_unlock(&s->lock);
}

/* How many timeouts the walk may expire before the next slice to hand
   over ends, once `expiring` have: the first ends at EXPIRE_FIRST_SLICE,
   the others at each multiple of EXPIRE_SLICE. */
static inline size_t to_slice_end(uint64_t expiring)
{
    if (expiring < EXPIRE_FIRST_SLICE)
        return EXPIRE_FIRST_SLICE - expiring;
    return EXPIRE_SLICE - expiring % EXPIRE_SLICE;
}

/* Whether an expired timeout joins the run for the default sink, which
   leaves the bucket whole; counted if so. */
static bool joins_run(void *ctx, const hwt_timeout *to)
{
    hwt_timer *t = ctx;
    if (to->sink && to->sink != &t->default_sink)
        return false;
    t->expiring_once += !hwt_timeout_periodic(to);
    return true;
}

/* Delivers, and counts, an expired timeout bound for another sink. */
static void deliver_expired(void *ctx, hwt_timeout *to)
{
    hwt_timer *t = ctx;
    t->expiring_once += !hwt_timeout_periodic(to);
    t->expiring++;
    deliver(t, to, to->sink);
}

/* Appends the run the walk took to the default sink's batch. */
static void deliver_run(hwt_timer *t, const hwt_wheel_expiry *e)
{
    append_to_batch(&t->default_sink, e->head, e->tail);
    t->expiring += e->n;
}

/* Expires the due timeouts of the current tick, in scheduling order.
   What it expired counts before a slice is handed over: a task that runs
   meanwhile finds its own timeout no longer pending. */
static void expire_bucket(hwt_timer *t)
{
    t->expiring = t->expiring_once = 0;
    uint64_t counted = 0;
    hwt_wheel_expiry e = {.joins = joins_run, .take = deliver_expired, .ctx = t};
    bool empty;
    do {
        /* Under the cancel lock, which every other change of a state on
           the wheel takes: the wheel's walk then needs no atomic
           read-modify-write.  EXPIRE_CHUNK at a time, so that cancels wait
           a few microseconds at most, and no further than a slice's end. */
        uint64_t before = t->expiring;
        size_t left = to_slice_end(before);
        pthread_mutex_lock(&t->cancel_lock);
        empty = hwt_wheel_expire(&t->wheel, left < EXPIRE_CHUNK ? left : EXPIRE_CHUNK, &e);
        pthread_mutex_unlock(&t->cancel_lock);
        if (e.n)
            deliver_run(t, &e);
        if (t->expiring - before == left) { /* a slice ends here */
            count(&t->expired, t->expiring_once - counted);
            counted = t->expiring_once;
            publish_batches(t); /* let consumers start on a large bucket */
            if (t->expiring == EXPIRE_FIRST_SLICE)
                await_handover(t);
        }
    } while (!empty);
    uint64_t n = t->expiring;
    if (n) {
        t->did_work = true;
        count(&t->expired, t->expiring_once - counted);
        if (n > atomic_load_explicit(&t->max_expired, memory_order_relaxed))
            atomic_store_explicit(&t->max_expired, n, memory_order_relaxed);
    }
}

/* The tick whose end is the latest at or before `now`, or -1. */
static int64_t last_ended_tick(const hwt_timer *t, int64_t now)
{
    int64_t rel = now - start_of(t);
    return rel < t->cfg.tick_ns ? -1 : rel / t->cfg.tick_ns - 1;
}

/* The clock time at which tick `tick` ends, or HWT_NEVER past int64. */
static int64_t tick_end(const hwt_timer *t, int64_t tick)
{
    int64_t rel, end;
    if (tick == HWT_NEVER || __builtin_mul_overflow(tick + 1, t->cfg.tick_ns, &rel) ||
        __builtin_add_overflow(start_of(t), rel, &end))
        return HWT_NEVER;
    return end;
}

/* The tick the worker must next wake for (an expiry or a cascade), or
   HWT_NEVER. */
static int64_t next_target(const hwt_timer *t)
{
    if (t->cfg.wake_every_tick || t->xfer_head)
        return t->wheel.elapsed;
    return hwt_wheel_next_tick(&t->wheel);
}

/* Processes every tick that has ended by `now` and has work, in order,
   each as: cancellations, transfer, expiry.  Returns the next target tick.
   Called with t->lock held. */
static int64_t run_due(hwt_timer *t, int64_t now)
{
    int64_t due = last_ended_tick(t, now);
    t->did_work = false;
    t->transfers_seen = atomic_load(&t->outside_transfers);
    for (;;) {
        process_cancels(t);
        transfer(t, t->cfg.manual ? SIZE_MAX : MAX_TRANSFER_PER_TICK);
        if (t->wheel.elapsed > due)
            break;
        int64_t next = next_target(t);
        if (next > due) {
            hwt_wheel_advance(&t->wheel, due + 1); /* the ticks between hold nothing */
            break;
        }
        hwt_wheel_advance(&t->wheel, next); /* a far slot starting here cascades */
        expire_bucket(t);
        hwt_wheel_advance(&t->wheel, next + 1);
        count(&t->ticks, 1);
        publish_batches(t);
        if (atomic_load_explicit(&t->stopping, memory_order_relaxed))
            break;
    }
    publish_batches(t);
    atomic_store_explicit(&t->tick_seen, t->wheel.elapsed, memory_order_relaxed);
    return next_target(t);
}

/* ---- the worker thread ---- */

static bool cancels_queued(hwt_timer *t)
{
    pthread_mutex_lock(&t->cancel_lock);
    bool any = t->ncancels != 0;
    pthread_mutex_unlock(&t->cancel_lock);
    return any;
}

/* Whether a reset waiting for the worker moved a timeout to a deadline
   below `limit`. */
static bool reset_queued_before(hwt_timer *t, int64_t limit)
{
    pthread_mutex_lock(&t->cancel_lock);
    bool any = t->reset_soonest < limit;
    pthread_mutex_unlock(&t->cancel_lock);
    return any;
}

/* The first tick that ends at or after clock time `when`, and not before
   the current one. */
static int64_t tick_ending_by(const hwt_timer *t, int64_t when)
{
    int64_t rel = when - start_of(t);
    int64_t tick = rel <= 0 ? 0 : (rel - 1) / t->cfg.tick_ns;
    return tick > t->wheel.elapsed ? tick : t->wheel.elapsed;
}

/* Tells producers that the worker is awake: they wake it for nothing,
   neither a deadline nor a transfer, as it looks for work before it sleeps. */
static void mark_awake(hwt_timer *t)
{
    atomic_store(&t->wake_limit, -1);
    atomic_store(&t->transfer_wake_at, INT64_MAX);
}

/* Sleeps until the end of tick `target` (HWT_NEVER: until woken), unless a
   producer has work for it first; lingers first if the last run_due()
   `did_work` (read under t->lock: a snapshot's transfer writes it too). */
static void sleep_until_tick(hwt_timer *t, int64_t target, bool did_work)
{
    int64_t now = t->cfg.clock(t->cfg.clock_ctx);
    if (target == HWT_NEVER && did_work)
        target = tick_ending_by(t, now + LINGER_NS);
    int64_t wake_at = tick_end(t, target);
    /* Cancels wait for the worker: let a batch of them wake it, so that
       what they hold is released in small warm batches, and on a long
       sleep the first, once a second at most. */
    int cancel_wake = CANCEL_WAKE_AT_BATCH;
    if (wake_at == HWT_NEVER || wake_at - now > CANCEL_WAKE_SLEEP_NS) {
        if (now - t->cancel_armed_at >= CANCEL_WAKE_SLEEP_NS) {
            cancel_wake = CANCEL_WAKE_AT_FIRST;
            t->cancel_armed_at = now;
        } else {
            target = tick_ending_by(t, t->cancel_armed_at + CANCEL_WAKE_SLEEP_NS);
            wake_at = tick_end(t, target);
        }
    }
    /* a deadline at or before the start of tick `target` falls due at an
       earlier tick (wheel.c's due_tick()): it wakes the worker */
    int64_t limit = wake_at == HWT_NEVER ? HWT_NEVER : target * t->cfg.tick_ns + 1;
    hwt_park_prepare(&t->park);
    atomic_store(&t->wake_limit, limit);
    atomic_store(&t->cancel_wake, cancel_wake);
    atomic_store(&t->transfer_wake_at,
                 queued_net(t, atomic_load(&t->scheduled)) + TRANSFER_WAKE_BATCH);
    /* Dekker with the producers: they push (or queue a reset), then read
       wake_limit (or cancel_wake).  A reset queued since run_due() took the
       queue read wake_limit while the worker was awake: one to a deadline
       below the limit must not wait for the end of this sleep. */
    if (atomic_load(&t->new_head) != NULL || atomic_load(&t->stopping) ||
        atomic_load(&t->outside_transfers) != t->transfers_seen ||
        (cancel_wake == CANCEL_WAKE_AT_FIRST ? cancels_queued(t)
                                             : reset_queued_before(t, limit))) {
        hwt_park_cancel(&t->park);
        mark_awake(t);
        return;
    }
    /* the worker's clock is CLOCK_MONOTONIC, as the park's deadline */
    hwt_park_until(&t->park, wake_at == HWT_NEVER ? HWT_SYS_FOREVER : wake_at);
    mark_awake(t);
    atomic_store(&t->cancel_wake, CANCEL_WAKE_NONE);
    count(&t->wakeups, 1);
}

static void *worker_main(void *arg)
{
    hwt_timer *t = arg;
    hwt_thread_set_name(t->name);
    hwt_thread_wake_on_time(); /* a tick's timeouts run at its end, not 50 us on */
    while (!atomic_load(&t->stopping)) {
        pthread_mutex_lock(&t->lock);
        int64_t target = run_due(t, hwt_monotonic_ns(NULL));
        bool did_work = t->did_work;
        pthread_mutex_unlock(&t->lock);
        if (atomic_load(&t->stopping))
            break;
        sleep_until_tick(t, target, did_work);
    }
    return NULL;
}

/* ---- life cycle ---- */

hwt_timer *hwt_timer_new(const hwt_config *config)
{
    uint32_t n = 0;
    if (hwt_round_ticks(config->ticks_per_wheel, &n) != 0 || config->tick_ns <= 0 ||
        config->tick_ns > INT64_MAX / n || (config->clock && !config->manual)) {
        errno = EINVAL;
        return NULL;
    }
    pthread_once(&atfork_once, install_atfork);
    if (atfork_err) {
        errno = atfork_err;
        return NULL;
    }
    hwt_timer *t = calloc(1, sizeof(*t));
    if (!t) {
        errno = ENOMEM;
        return NULL;
    }
    t->cfg = *config;
    t->cfg.ticks_per_wheel = n;
    t->cfg.thread_name = NULL; /* copied into name */
    if (!t->cfg.clock)
        t->cfg.clock = hwt_monotonic_ns;
    snprintf(t->name, sizeof(t->name), "%s", config->thread_name ? config->thread_name : "hwtimer");
    atomic_init(&t->wake_limit, -1);
    atomic_init(&t->transfer_wake_at, INT64_MAX);
    atomic_init(&t->refs, 1);
    t->cancel_armed_at = INT64_MIN / 2; /* long ago */
    t->reset_soonest = HWT_NEVER;
    /* each step undoes itself when it fails, and the labels below undo the
       steps before it, in reverse */
    int err = hwt_wheel_init(&t->wheel, n, t->cfg.tick_ns);
    if (err)
        goto fail;
    if ((err = pthread_mutex_init(&t->lock, NULL)) != 0)
        goto fail_wheel;
    if ((err = pthread_mutex_init(&t->cancel_lock, NULL)) != 0)
        goto fail_lock;
    if ((err = pthread_mutex_init(&t->sinks_lock, NULL)) != 0)
        goto fail_cancel_lock;
    if ((err = hwt_park_init(&t->park)) != 0)
        goto fail_sinks_lock;
    if ((err = hwt_sink_init(&t->default_sink, t, NULL, -1, NULL)) != 0)
        goto fail_park;
    if ((err = hwt_sink_init(&t->released, t, NULL, -1, NULL)) != 0)
        goto fail_dflt;
    pthread_mutex_lock(&registry_lock);
    t->reg_next = registry;
    if (registry)
        registry->reg_prev = t;
    registry = t;
    pthread_mutex_unlock(&registry_lock);
    return t;
fail_dflt:
    hwt_sink_destroy(&t->default_sink);
fail_park:
    hwt_park_destroy(&t->park);
fail_sinks_lock:
    pthread_mutex_destroy(&t->sinks_lock);
fail_cancel_lock:
    pthread_mutex_destroy(&t->cancel_lock);
fail_lock:
    pthread_mutex_destroy(&t->lock);
fail_wheel:
    hwt_wheel_destroy(&t->wheel);
fail:
    free(t);
    errno = err;
    return NULL;
}

void hwt_timer_incref(hwt_timer *t)
{
    atomic_fetch_add(&t->refs, 1);
}

void hwt_timer_decref(hwt_timer *t)
{
    if (atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    pthread_mutex_lock(&registry_lock);
    if (t->reg_prev)
        t->reg_prev->reg_next = t->reg_next;
    else
        registry = t->reg_next;
    if (t->reg_next)
        t->reg_next->reg_prev = t->reg_prev;
    pthread_mutex_unlock(&registry_lock);
    hwt_sink_destroy(&t->default_sink);
    hwt_sink_destroy(&t->released);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->cancel_lock);
    pthread_mutex_destroy(&t->sinks_lock);
    hwt_park_destroy(&t->park);
    free(t->cancels);
    free(t->cancels_spare);
    hwt_wheel_destroy(&t->wheel);
    free(t);
}

int hwt_timer_start(hwt_timer *t)
{
    if (t->fork_err)
        return t->fork_err;
    if (t->state == T_STARTED)
        return 0;
    if (t->state == T_STOPPED)
        return EALREADY;
    if (t->orphaned) /* taken back before fork(): its timeouts are the parent's */
        return HWT_ESTOPPED;
    if (!t->unstarted) /* else deadlines already count from the first start */
        atomic_store_explicit(&t->start_time, t->cfg.clock(t->cfg.clock_ctx),
                              memory_order_relaxed);
    if (!t->cfg.manual) {
        /* the worker blocks every signal: they belong to the main thread */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int err = pthread_create(&t->thread, NULL, worker_main, t);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (err)
            return err;
    }
    t->state = T_STARTED;
    return 0;
}

void hwt_timer_unstart(hwt_timer *t)
{
    if (t->state != T_STARTED || t->orphaned)
        return;
    if (!t->cfg.manual) {
        /* what the worker holds stays where it is: on the wheel, on its
           lists, in the sinks, for the next worker or for stop() */
        atomic_store(&t->stopping, true);
        wake_worker(t);
        pthread_join(t->thread, NULL);
        atomic_store(&t->stopping, false);
    }
    t->unstarted = true;
    t->state = T_NEW;
}

bool hwt_timer_unstarted(const hwt_timer *t)
{
    return t->state == T_NEW && t->unstarted;
}

bool hwt_timer_started(const hwt_timer *t)
{
    return t->state == T_STARTED;
}
bool hwt_timer_stopped(const hwt_timer *t)
{
    return t->state == T_STOPPED;
}
bool hwt_timer_orphaned(const hwt_timer *t)
{
    return t->orphaned;
}
const hwt_config *hwt_timer_config(const hwt_timer *t)
{
    return &t->cfg;
}
int64_t hwt_timer_start_time(const hwt_timer *t)
{
    return start_of(t);
}
int64_t hwt_timer_now(const hwt_timer *t)
{
    return t->cfg.clock(t->cfg.clock_ctx);
}
hwt_sink *hwt_timer_default_sink(hwt_timer *t)
{
    return &t->default_sink;
}

bool hwt_timer_has_released(hwt_timer *t)
{
    return atomic_load_explicit(&t->released_ready, memory_order_relaxed);
}

hwt_timeout *hwt_timer_take_released(hwt_timer *t)
{
    if (!atomic_load_explicit(&t->released_ready, memory_order_relaxed))
        return NULL;
    atomic_store_explicit(&t->released_ready, false, memory_order_relaxed);
    return hwt_sink_take(&t->released);
}

/* ---- producers ---- */

/* Every timeout cancelled so far, by whichever way its cancel went: the
   one sum of the counters that stats() and pending_of() both read. */
static uint64_t cancelled_total(hwt_timer *t)
{
    return atomic_load_explicit(&t->cancelled, memory_order_acquire) +
           atomic_load_explicit(&t->cancelled_queued, memory_order_acquire) +
           atomic_load_explicit(&t->taken_back, memory_order_acquire) +
           atomic_load(&t->cancelled_out);
}

/* Timeouts scheduled and neither expired nor cancelled, counting
   `scheduled` as scheduled if it is not 0.  The worker's counters are read
   first: every timeout they count was counted as scheduled before, so the
   difference is never negative. */
static int64_t pending_of(hwt_timer *t, uint64_t scheduled)
{
    /* `revoked` is read first: what it counts was counted in `expired` or
       cancelled_total() before */
    uint64_t revoked = atomic_load(&t->revoked);
    uint64_t done = atomic_load_explicit(&t->expired, memory_order_acquire) + cancelled_total(t) +
                    atomic_load(&t->expired_out) - revoked;
    if (!scheduled)
        scheduled = atomic_load(&t->scheduled);
    return scheduled > done ? (int64_t)(scheduled - done) : 0;
}

/* Whether one more pending timeout, already counted in `scheduled` (if not
   0) or reserved, passes max_pending.  A schedule reserves its place in
   `scheduled`, a reset of a delivered one-shot in `reserved`, each before
   it reads the other's counter here: both are sequentially consistent, so
   of two that race for the last place, at least one sees the other's
   reservation, and never both pass.  `reserved` is read before pending_of()
   reads `revoked`: a reset counts `revoked` before it lets its reservation
   go, so its place is counted once or twice here, never missed. */
static bool over_bound(hwt_timer *t, uint64_t scheduled)
{
    uint64_t reserved = atomic_load(&t->reserved);
    return pending_of(t, scheduled) + (int64_t)reserved > t->cfg.max_pending;
}

/* `deadline` (ns since the start), or HWT_NEVER when the tick that runs
   it ends at or past HWT_NEVER on the clock, which stays below that: never
   reached, and read as inf, it waits with the never-due ones, not at a far
   place on the wheel that a manual timer's advance_to_next() would go to
   (and find nothing to run). */
static int64_t within_clock(const hwt_timer *t, int64_t deadline)
{
    int64_t start = start_of(t);
    int64_t room = start > 0 ? HWT_NEVER - start : HWT_NEVER;
    /* its tick, (deadline - 1) / tick_ns, ends before deadline + tick_ns */
    if (deadline <= room - t->cfg.tick_ns)
        return deadline;
    return tick_end(t, (deadline - 1) / t->cfg.tick_ns) == HWT_NEVER ? HWT_NEVER : deadline;
}

/* `delay_ns` after `now` (both ns), as schedule and reset read a delay;
   `now` may be a little below 0 in a schedule refused as start() runs. */
static int64_t deadline_after(const hwt_timer *t, int64_t now, int64_t delay_ns)
{
    int64_t deadline;
    if (delay_ns <= 0)
        return now;
    return __builtin_add_overflow(now, delay_ns, &deadline) ? HWT_NEVER
                                                            : within_clock(t, deadline);
}

/* Pushes `to` onto the producers' stack.  Returns false once stop() has
   closed it. */
static bool push_new(hwt_timer *t, hwt_timeout *to)
{
    hwt_timeout *head = atomic_load_explicit(&t->new_head, memory_order_relaxed);
    do {
        if (head == CLOSED)
            return false;
        to->link.next = head ? &head->link : NULL;
    } while (!atomic_compare_exchange_weak(&t->new_head, &head, to));
    return true;
}

/* Schedules `to` with `flags` (0, or HWT_PERIODIC and its policy). */
static int schedule(hwt_timer *t, hwt_timeout *to, int64_t delay_ns, uint32_t flags)
{
    /* the state first: start() sets it after the start time, so an
       accepted timeout reads that start time and a clock at or after it */
    bool started = t->state == T_STARTED && !t->orphaned;
    int64_t deadline = deadline_after(t, now_rel(t), delay_ns);
    atomic_store_explicit(&to->deadline, deadline, memory_order_relaxed);
    to->flags = flags;
    to->link.prev = NULL;
    /* release: a cancel or reset that sees QUEUED sees the fields above */
    atomic_store_explicit(&to->state, HWT_QUEUED, memory_order_release);
    if (!started)
        return HWT_ESTOPPED;
    /* sequentially consistent: see over_bound() */
    uint64_t scheduled = atomic_fetch_add(&t->scheduled, 1) + 1;
    if (t->cfg.max_pending > 0 && over_bound(t, scheduled)) {
        atomic_fetch_sub_explicit(&t->scheduled, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&t->rejected, 1, memory_order_relaxed);
        return HWT_EREJECTED;
    }
    if (!push_new(t, to)) {
        atomic_fetch_sub_explicit(&t->scheduled, 1, memory_order_relaxed);
        return HWT_ESTOPPED;
    }
    if (deadline < atomic_load(&t->wake_limit) ||
        queued_net(t, scheduled) >=
            atomic_load_explicit(&t->transfer_wake_at, memory_order_relaxed))
        wake_worker(t);
    return HWT_OK;
}

int hwt_timer_schedule(hwt_timer *t, hwt_timeout *to, int64_t delay_ns)
{
    return schedule(t, to, delay_ns, 0);
}

int hwt_timer_schedule_periodic(hwt_timer *t, hwt_timeout *to, int64_t delay_ns, int missed)
{
    return schedule(t, to, delay_ns,
                    HWT_PERIODIC | (((uint32_t)missed << MISSED_SHIFT) & MISSED_MASK));
}

/* Makes room for one more entry in the cancel vector (none needed once
   stop() closed it).  Returns whether there is room (none: out of memory).
   Called with cancel_lock held. */
static bool cancel_room(hwt_timer *t)
{
    if (t->cancel_closed || t->ncancels < t->cancels_cap)
        return true;
    size_t cap = t->cancels_cap ? t->cancels_cap * 2 : 64;
    hwt_timeout **v = realloc(t->cancels, cap * sizeof(*v));
    if (!v)
        return false;
    t->cancels = v;
    t->cancels_cap = cap;
    return true;
}

/* Whether `state` is a final one. */
static inline bool is_final(uint32_t state)
{
    return state == HWT_CANCELLED || state == HWT_EXPIRED;
}

/* CASes `to` from whichever live state it is in to CANCELLED.  Returns the
   state it was cancelled from, or a final state if it had one already.
   Called with cancel_lock held: then only a lock-free cancel of a QUEUED
   one races it. */
static uint32_t cancel_live(hwt_timeout *to)
{
    uint32_t s = atomic_load(&to->state);
    while (!is_final(s) && !atomic_compare_exchange_weak(&to->state, &s, HWT_CANCELLED))
        ;
    return s;
}

/* After a cancel made the `queued`th cancel waiting for the worker (one of
   a QUEUED timeout counts as the first; resets waiting there do not
   count): wakes a sleeping worker that asked for it. */
static void wake_for_cancels(hwt_timer *t, size_t queued)
{
    if (queued == 1 || queued == CANCEL_WAKE_BATCH) {
        int when = atomic_load_explicit(&t->cancel_wake, memory_order_relaxed);
        if ((queued == 1 ? when == CANCEL_WAKE_AT_FIRST : when != CANCEL_WAKE_NONE) &&
            atomic_exchange(&t->cancel_wake, CANCEL_WAKE_NONE) != CANCEL_WAKE_NONE)
            wake_worker(t);
    }
}

/* Takes `to`, just cancelled while QUEUED, back off the producers' stack
   if it is still on top: nobody has pushed since and the worker has not
   taken the stack.  `to` cannot be pushed again meanwhile (it is CANCELLED
   and its owner holds it), and only the worker, once it has taken the
   stack, writes the links of what was on it; so while the top is `to`,
   to->link.next is what lies below it, and the compare-and-swap cannot
   succeed on a stale one. */
static bool take_back_newest(hwt_timer *t, hwt_timeout *to)
{
    hwt_timeout *head = atomic_load_explicit(&t->new_head, memory_order_acquire);
    if (head != to)
        return false;
    /* the worker may be rewriting it, having just taken the stack; then
       the CAS below fails and what was read does not matter */
    hwt_link *below = __atomic_load_n(&to->link.next, __ATOMIC_RELAXED);
    return atomic_compare_exchange_strong(&t->new_head, &head, hwt_timeout_of(below));
}

static int cancel_locked(hwt_timer *t, hwt_timeout *to);

/* hwt_timeout_cancel(), and with `take` the take-back of
   hwt_timeout_cancel_take(). */
static inline int cancel(hwt_timeout *to, bool take)
{
    hwt_timer *t = to->sink->timer;
    uint32_t s = atomic_load_explicit(&to->state, memory_order_relaxed);
    if (is_final(s))
        return HWT_EFINAL;
    /* Not taken by the worker yet: the state is all there is to change, and
       the transfer (or stop()) releases it.  The request-timeout pattern,
       a cancel soon after the schedule, mostly ends here. */
    if (s == HWT_QUEUED && atomic_compare_exchange_strong(&to->state, &s, HWT_CANCELLED)) {
        if (take && take_back_newest(t, to)) {
            atomic_fetch_add_explicit(&t->taken_back, 1, memory_order_release);
            return HWT_TAKEN;
        }
        atomic_fetch_add_explicit(&t->cancelled_queued, 1, memory_order_release);
        wake_for_cancels(t, 1);
        return HWT_OK;
    }
    return cancel_locked(t, to);
}

/* cancel() of a timeout that the worker may hold: under cancel_lock.  Out
   of line, so that the common cancel of a queued one keeps few registers. */
__attribute__((noinline)) static int cancel_locked(hwt_timer *t, hwt_timeout *to)
{
    pthread_mutex_lock(&t->cancel_lock);
    /* room first: once cancelled, it must be queued */
    if (!cancel_room(t)) {
        pthread_mutex_unlock(&t->cancel_lock);
        return ENOMEM;
    }
    uint32_t was = cancel_live(to);
    if (is_final(was)) {
        pthread_mutex_unlock(&t->cancel_lock);
        return HWT_EFINAL;
    }
    /* Counted now, not when the worker unlinks it (maybe a second from
       now) nor, for a periodic one off the wheel, when its consumer ends
       its run: pending_timeouts() and max_pending see the cancel at once.
       The cancel lock serialises the writers of the counter. */
    count(&t->cancelled, 1);
    /* after the count above, which a reader of `revoked` then sees */
    if (was == HWT_RUNNING && !hwt_timeout_periodic(to))
        count(&t->revoked, 1); /* a one-shot's delivery counted it expired */
    if (t->cancel_closed || was == HWT_RUNNING || was == HWT_RUNNING_RESET || was == HWT_QUEUED) {
        /* Stopped: stop()'s sweep finds it cancelled and releases it.  Or
           off the wheel in its run: its re-arm finds it cancelled, and
           counts it.  Or queued (a periodic one re-armed since the load
           above): its transfer releases it. */
        pthread_mutex_unlock(&t->cancel_lock);
        wake_for_cancels(t, was == HWT_QUEUED);
        return HWT_OK;
    }
    t->cancels[t->ncancels++] = to;
    size_t queued = ++t->ncancelled; /* resets queued before do not count */
    pthread_mutex_unlock(&t->cancel_lock);
    wake_for_cancels(t, queued);
    return HWT_OK;
}

int hwt_timeout_cancel(hwt_timeout *to)
{
    return cancel(to, false);
}

int hwt_timeout_cancel_take(hwt_timeout *to)
{
    return cancel(to, true);
}

/* ---- re-arming: reset and periodic timeouts ---- */

/* Sets the deadline; called with cancel_lock held, in a state where the
   worker does not relink by it. */
static inline void set_deadline(hwt_timeout *to, int64_t deadline)
{
    atomic_store_explicit(&to->deadline, deadline, memory_order_relaxed);
}

/* Wakes the worker if it sleeps past `deadline`. */
static void wake_for(hwt_timer *t, int64_t deadline)
{
    if (deadline < atomic_load(&t->wake_limit))
        wake_worker(t);
}

/* Keeps the soonest deadline of a reset that waits for the worker to
   relink its timeout.  Called with cancel_lock held. */
static void note_reset(hwt_timer *t, int64_t deadline)
{
    if (deadline < t->reset_soonest)
        t->reset_soonest = deadline;
}

/* Re-arms `to` at `deadline`, under cancel_lock.  Returns what
   hwt_timeout_reset returns. */
static int reset_locked(hwt_timer *t, hwt_timeout *to, int64_t deadline)
{
    uint32_t s = atomic_load(&to->state);
    for (;;) {
        uint32_t next;
        switch (s) {
        case HWT_QUEUED: /* the worker reads the deadline under this lock */
            set_deadline(to, deadline);
            return HWT_OK;
        case HWT_INIT: /* on the wheel: the worker relinks it */
            next = HWT_RESET;
            break;
        case HWT_RUNNING: /* in its run: re-arm takes this deadline */
            next = HWT_RUNNING_RESET;
            break;
        case HWT_RESET:
        case HWT_RUNNING_RESET: /* moved already, and not yet relinked */
            if (s == HWT_RESET)
                note_reset(t, deadline);
            set_deadline(to, deadline);
            return HWT_OK;
        default:
            return HWT_EFINAL;
        }
        if (s == HWT_INIT && !cancel_room(t))
            return ENOMEM;
        /* a one-shot delivered and not yet begun counts as expired: the
           reset would make it pending again, which the bound refuses as
           for a new one (over_bound()); it runs as delivered */
        bool revokes = s == HWT_RUNNING && !hwt_timeout_periodic(to);
        bool holds = revokes && t->cfg.max_pending > 0;
        if (holds) {
            atomic_fetch_add(&t->reserved, 1);
            if (over_bound(t, 0)) {
                atomic_fetch_sub(&t->reserved, 1);
                atomic_fetch_add_explicit(&t->rejected, 1, memory_order_relaxed);
                return HWT_EFINAL;
            }
        }
        /* Expiry (INIT -> EXPIRED or RUNNING) holds this lock too: only
           a lock-free cancel of a QUEUED one races this, and the consumer
           beginning a RUNNING one's run (hwt_timeout_begin()). */
        bool changed = atomic_compare_exchange_strong(&to->state, &s, next);
        if (changed && revokes)
            count(&t->revoked, 1); /* pending again */
        if (holds)
            atomic_fetch_sub(&t->reserved, 1); /* counted in `revoked`, or not pending */
        if (changed)
            break;
    }
    set_deadline(to, deadline);
    if (s == HWT_INIT) { /* the worker relinks it at its next tick */
        t->cancels[t->ncancels++] = (hwt_timeout *)((uintptr_t)to | RESET_TAG);
        note_reset(t, deadline);
    }
    return HWT_OK;
}

int hwt_timeout_reset(hwt_timeout *to, int64_t delay_ns)
{
    hwt_timer *t = to->sink->timer;
    if (is_final(atomic_load_explicit(&to->state, memory_order_relaxed)))
        return HWT_EFINAL;
    int64_t deadline = deadline_after(t, now_rel(t), delay_ns);
    pthread_mutex_lock(&t->cancel_lock);
    /* once stop() has closed the queue, what it sweeps is not pending */
    int r = t->cancel_closed ? HWT_EFINAL : reset_locked(t, to, deadline);
    pthread_mutex_unlock(&t->cancel_lock);
    /* also when a reset queued earlier still waits: this one may be sooner */
    if (r == HWT_OK)
        wake_for(t, deadline);
    return r;
}

/* HWT_FRAC_ONE in 64 bits, where it and what it multiplies pass 32 */
#define FRAC_ONE ((uint64_t)HWT_FRAC_ONE)

/* m periods of period + frac / FRAC_ONE ns, as whole ns (rounded down) in
   *whole and the FRAC_ONE-ths of a ns left in *sub.  Returns false past
   int64. */
static bool periods(int64_t m, int64_t period, uint32_t frac, int64_t *whole, uint32_t *sub)
{
    int64_t ns;
    if (__builtin_mul_overflow(m, period, &ns))
        return false;
    /* m * frac, up to 2**93, in two parts: the low and high 32 bits of m */
    uint64_t um = (uint64_t)m;
    uint64_t lo = (um & UINT32_MAX) * frac; /* < 2**62 */
    uint64_t hi = (um >> 32) * frac;        /* < 2**61: m < 2**63 */
    /* hi counts 2**32 FRAC_ONE-ths, a whole number of ns */
    uint64_t extra = (hi << (32 - HWT_FRAC_BITS)) + (lo >> HWT_FRAC_BITS);
    if (extra > (uint64_t)INT64_MAX || __builtin_add_overflow(ns, (int64_t)extra, &ns))
        return false;
    *whole = ns;
    *sub = (uint32_t)(lo & (FRAC_ONE - 1));
    return true;
}

/* The grid point m periods after the one that `deadline` stands for, which
   lies behind / FRAC_ONE ns before it: the deadline it rounds up to (never
   early), with how far that point lies before it in *behind_out; HWT_NEVER
   past int64. */
static int64_t grid_point(int64_t deadline, uint32_t behind, int64_t m, int64_t period,
                          uint32_t frac, uint32_t *behind_out)
{
    int64_t step, next;
    uint32_t sub;
    *behind_out = 0;
    if (!periods(m, period, frac, &step, &sub) || __builtin_add_overflow(deadline, step, &next) ||
        next == HWT_NEVER)
        return HWT_NEVER;
    if (sub > behind) {
        *behind_out = (uint32_t)(FRAC_ONE - (sub - behind));
        return next + 1;
    }
    *behind_out = behind - sub;
    return next;
}

/* Whether the grid point m periods after `deadline`'s lies past `end`. */
static bool past_end(int64_t deadline, uint32_t behind, int64_t m, int64_t period, uint32_t frac,
                     int64_t end)
{
    uint32_t unused;
    return grid_point(deadline, behind, m, period, frac, &unused) > end;
}

int64_t hwt_periodic_next(int64_t deadline, uint32_t *behind, int64_t period, uint32_t frac,
                          int missed, int64_t start, int64_t end, bool *again)
{
    uint32_t lag = *behind;
    int64_t next = grid_point(deadline, lag, 1, period, frac, behind);
    *again = false;
    switch (missed) {
    case HWT_MISSED_BURST: /* every grid point, the missed ones back to back */
        *again = next <= end;
        return next;
    case HWT_MISSED_DELAY: {
        /* a run late by a period is the one "now": the grid restarts from
           its start; one that overran the next point is followed by one
           now, which starts the new grid (its deadline is its start) */
        int64_t late = start - deadline;
        if (late > period || (late == period && lag >= frac))
            next = grid_point(start, 0, 1, period, frac, behind);
        *again = next <= end;
        if (*again)
            *behind = 0;
        return *again ? end : next;
    }
    default: { /* skip: the first grid point after the run ended */
        if (next > end)
            return next;
        int64_t span = end - deadline; /* > 0, as next <= end */
        if (frac == 0) /* whole ns, exact: lag stays as it is */
            return grid_point(deadline, lag, span / period + 1, period, 0, behind);
        /* the first m > 1 whose point is past the end: estimated in
           doubles (off by at most about m / 2**51), then found exactly by
           bisection around the estimate; a point past int64 is
           HWT_NEVER, past any end */
        double estimate = (double)span / ((double)period + (double)frac / (double)FRAC_ONE) + 1;
        int64_t m = estimate < 0x1p62 ? (int64_t)estimate : INT64_C(1) << 62;
        int64_t slack = (m >> 49) + 2;
        int64_t before = m - slack > 1 ? m - slack : 1; /* its point is not past the end */
        int64_t past = m + slack;                       /* its point is */
        if (past_end(deadline, lag, before, period, frac, end))
            before = 1; /* not reached: the estimate is within its bounds */
        if (!past_end(deadline, lag, past, period, frac, end))
            past = INT64_MAX;
        while (past - before > 1) {
            int64_t mid = before + (past - before) / 2;
            if (past_end(deadline, lag, mid, period, frac, end))
                past = mid;
            else
                before = mid;
        }
        return grid_point(deadline, lag, past, period, frac, behind);
    }
    }
}

/* Counts a periodic timeout that its consumer ended. */
static void count_out(hwt_timer *t, uint32_t final)
{
    atomic_fetch_add(final == HWT_EXPIRED ? &t->expired_out : &t->cancelled_out, 1);
}

/* hwt_timeout_rearm(), and with `next_run` false hwt_timeout_requeue():
   back on the wheel at the deadline it has. */
static int rearm(hwt_timeout *to, bool next_run, int64_t period_ns, uint32_t period_frac,
                 uint32_t *behind, int64_t start, int64_t end, bool catch_up)
{
    hwt_timer *t = to->sink->timer;
    start -= start_of(t);
    end -= start_of(t);
    pthread_mutex_lock(&t->cancel_lock);
    uint32_t s = atomic_load(&to->state);
    int r = HWT_OK;
    int64_t next = 0;
    /* a one-shot delivered RUNNING that leaves RUNNING unrun no longer
       counts as expired (one reset counts as pending since its reset) */
    bool once = !hwt_timeout_periodic(to) && s == HWT_RUNNING;
    if (s == HWT_CANCELLED || t->cancel_closed) {
        /* a cancel during the run (which counted it), or stop(), which
           did not see it */
        atomic_store(&to->state, HWT_CANCELLED);
        r = s == HWT_CANCELLED ? HWT_ECANCELLED : HWT_ESTOPPED;
        if (s != HWT_CANCELLED) {
            count_out(t, HWT_CANCELLED);
            if (once)
                count(&t->revoked, 1);
        }
    } else if (s == HWT_RUNNING && next_run) {
        bool again;
        int missed = (int)((to->flags & MISSED_MASK) >> MISSED_SHIFT);
        /* delay's run after an overrun starts the new grid where it
           began, if that was later than its deadline (it waited) */
        int64_t from = hwt_timeout_deadline(to);
        if (catch_up && missed == HWT_MISSED_DELAY && start > from) {
            from = start;
            *behind = 0;
        }
        set_deadline(to, within_clock(t, hwt_periodic_next(from, behind, period_ns, period_frac,
                                                            missed, start, end, &again)));
        r = again ? HWT_EAGAIN : HWT_OK;
    } /* RUNNING_RESET: the reset set the next deadline; a requeue keeps it */
    if (r == HWT_OK) {
        /* pushed under the lock: stop() closes the stack only after it
           has set cancel_closed, so it is open, and stop() will sweep it */
        next = hwt_timeout_deadline(to); /* once pushed, it is the worker's */
        if (once)
            count(&t->revoked, 1); /* a one-shot put back without a reset */
        to->link.prev = NULL;
        atomic_store(&to->state, HWT_QUEUED);
        push_new(t, to);
    }
    pthread_mutex_unlock(&t->cancel_lock);
    if (r == HWT_OK)
        wake_for(t, next);
    return r;
}

int hwt_timeout_rearm(hwt_timeout *to, int64_t period_ns, int64_t start, int64_t end,
                      bool catch_up)
{
    uint32_t behind = 0;
    return rearm(to, true, period_ns, 0, &behind, start, end, catch_up);
}

int hwt_timeout_rearm_exact(hwt_timeout *to, int64_t period_ns, uint32_t period_frac,
                            uint32_t *behind, int64_t start, int64_t end, bool catch_up)
{
    return rearm(to, true, period_ns, period_frac, behind, start, end, catch_up);
}

int hwt_timeout_requeue(hwt_timeout *to)
{
    return rearm(to, false, 0, 0, NULL, 0, 0, false);
}

uint32_t hwt_timeout_finish(hwt_timeout *to, uint32_t final)
{
    hwt_timer *t = to->sink->timer;
    bool once = !hwt_timeout_periodic(to);
    pthread_mutex_lock(&t->cancel_lock);
    uint32_t s = atomic_load(&to->state), was = s;
    /* else cancel() ended and counted it (or, a one-shot, it began) */
    bool ends = s != HWT_CANCELLED && !(once && s == HWT_EXPIRED);
    if (ends) {
        atomic_store(&to->state, s = final);
        /* a one-shot's delivery counted it expired, unless a reset made
           it pending again */
        if (once && final == HWT_CANCELLED) {
            count_out(t, s);
            if (was == HWT_RUNNING)
                count(&t->revoked, 1);
        }
    }
    pthread_mutex_unlock(&t->cancel_lock);
    if (ends && !once)
        count_out(t, s);
    return s;
}

uint32_t hwt_timeout_begin(hwt_timeout *to)
{
    uint32_t s = HWT_RUNNING;
    /* cancel and reset change a RUNNING state with a CAS too (under the
       cancel lock, which this does not need): whichever comes first wins */
    if (atomic_compare_exchange_strong(&to->state, &s, HWT_EXPIRED))
        return HWT_EXPIRED;
    return s; /* EXPIRED (delivered so), CANCELLED or RUNNING_RESET */
}

int64_t hwt_timer_pending(hwt_timer *t)
{
    return pending_of(t, 0);
}

void hwt_timer_stats(hwt_timer *t, hwt_stats *out)
{
    uint64_t revoked = atomic_load(&t->revoked);
    uint64_t expired = atomic_load_explicit(&t->expired, memory_order_acquire);
    out->expired_periodic = atomic_load(&t->expired_out);
    /* a cancel may revoke an expiry the worker has yet to count */
    out->expired = (expired > revoked ? expired - revoked : 0) + out->expired_periodic;
    out->revoked = revoked;
    out->cancelled = cancelled_total(t);
    out->scheduled = atomic_load_explicit(&t->scheduled, memory_order_relaxed);
    out->pending = out->scheduled > out->expired + out->cancelled
                       ? (int64_t)(out->scheduled - out->expired - out->cancelled)
                       : 0;
    out->rejected = atomic_load_explicit(&t->rejected, memory_order_relaxed);
    out->ticks = atomic_load_explicit(&t->ticks, memory_order_relaxed);
    out->wakeups = atomic_load_explicit(&t->wakeups, memory_order_relaxed);
    out->max_expired_per_tick = atomic_load_explicit(&t->max_expired, memory_order_relaxed);
    out->tick = atomic_load_explicit(&t->tick_seen, memory_order_relaxed);
}

/* ---- the soonest pending timeouts ---- */

/* A candidate: ordered by deadline, then by when it was met in scheduling
   order. */
typedef struct soon {
    int64_t deadline;
    uint64_t order;
    hwt_timeout *to;
} soon;

/* A max-heap of the `limit` soonest candidates met so far. */
typedef struct soon_heap {
    soon *v; /* owned */
    size_t n, cap, limit;
    uint64_t order;
    int err;
} soon_heap;

static inline bool soon_before(const soon *a, const soon *b)
{
    return a->deadline < b->deadline || (a->deadline == b->deadline && a->order < b->order);
}

static void soon_sift_down(soon *v, size_t n, size_t i)
{
    for (size_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && soon_before(&v[c], &v[c + 1]))
            c++;
        if (!soon_before(&v[i], &v[c]))
            return;
        soon tmp = v[i];
        v[i] = v[c];
        v[c] = tmp;
    }
}

/* Offers `to`, met at position `order`, if it is in state INIT or (when
   `reset` says so) RESET. */
static void soon_offer(soon_heap *h, hwt_timeout *to, uint64_t order, bool reset)
{
    uint32_t s = atomic_load_explicit(&to->state, memory_order_acquire);
    if (!(s == HWT_INIT || (reset && s == HWT_RESET)) || !h->limit || h->err)
        return;
    soon e = {hwt_timeout_deadline(to), order, to};
    if (h->n == h->limit) {
        if (soon_before(&e, &h->v[0])) {
            h->v[0] = e;
            soon_sift_down(h->v, h->n, 0);
        }
        return;
    }
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        if (cap > h->limit)
            cap = h->limit;
        soon *v = realloc(h->v, cap * sizeof(*v));
        if (!v) {
            h->err = ENOMEM;
            return;
        }
        h->v = v;
        h->cap = cap;
    }
    size_t i = h->n++;
    h->v[i] = e;
    while (i && soon_before(&h->v[(i - 1) / 2], &h->v[i])) {
        soon tmp = h->v[i];
        h->v[i] = h->v[(i - 1) / 2];
        h->v[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
}

/* The wheel's visitor: later lists fall due later, so a full heap at the
   end of a list holds the answer as far as the wheel goes.  A reset one is
   not where its deadline says: the reset queue offers it. */
static bool soon_visit(void *ctx, hwt_timeout *to)
{
    soon_heap *h = ctx;
    if (!to)
        return h->n < h->limit && !h->err;
    soon_offer(h, to, h->order++, false);
    return true;
}

/* Does what the worker's next tick would begin with, the queued resets
   and cancels, then the transfer of what waits in the producers' queue,
   so that the walk finds every pending timeout in the wheel: the queue
   itself cannot be walked while a cancel may take its newest timeout back.
   A worker that planned its sleep before this is woken to plan again.
   Called with t->lock held. */
static void transfer_for_walk(hwt_timer *t)
{
    if (atomic_load(&t->new_head) == NULL && !t->xfer_head && !cancels_queued(t))
        return;
    process_cancels(t);
    transfer(t, SIZE_MAX);
    /* the cancelled ones it unlinked go to be released now, not at the
       worker's next tick (a ManualTimer's next advance()) */
    if (t->released.batch_head)
        publish_released(t);
    atomic_fetch_add(&t->outside_transfers, 1);
    wake_worker(t);
}

/* Whether the wheel may take in what waits in the producers' queue: not
   once stopped, nor before a first start(), which gives deadlines their
   start time (a timer taken back by hwt_timer_unstart() keeps its). */
static bool may_transfer(const hwt_timer *t)
{
    return t->state == T_STARTED || (t->state == T_NEW && t->unstarted);
}

void hwt_timer_stats_occupancy(hwt_timer *t, hwt_stats *stats, hwt_occupancy *out)
{
    pthread_mutex_lock(&t->lock);
    /* a worker asleep until a far deadline, or for good, has yet to take
       what was scheduled since: count it where it will go */
    if (may_transfer(t))
        transfer_for_walk(t);
    hwt_wheel_occupancy(&t->wheel, out);
    /* with the wheel held, the worker expires nothing in between */
    if (stats)
        hwt_timer_stats(t, stats);
    pthread_mutex_unlock(&t->lock);
}

void hwt_timer_occupancy(hwt_timer *t, hwt_occupancy *out)
{
    hwt_timer_stats_occupancy(t, NULL, out);
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(hwt_timeout *const *)a, y = (uintptr_t)*(hwt_timeout *const *)b;
    return (x > y) - (x < y);
}

/* Offers the timeouts reset since transfer_for_walk() (a moment under the
   cancel lock): they are not where their deadline says.  The walk held the
   wheel, not the cancel lock: one reset after the walk met it at its old
   deadline is offered once, as the walk saw it. */
static void soon_offer_reset(hwt_timer *t, soon_heap *h)
{
    if (h->err || !cancels_queued(t))
        return;
    /* the walk's finds, by address; taken outside the cancel lock */
    size_t nmet = h->n;
    hwt_timeout **met = NULL;
    if (nmet) {
        met = malloc(nmet * sizeof(*met));
        if (!met) {
            h->err = ENOMEM;
            return;
        }
        for (size_t i = 0; i < nmet; i++)
            met[i] = h->v[i].to;
        qsort(met, nmet, sizeof(*met), cmp_ptr);
    }
    pthread_mutex_lock(&t->cancel_lock);
    for (size_t i = 0; i < t->ncancels; i++) {
        hwt_timeout *to = (hwt_timeout *)((uintptr_t)t->cancels[i] & ~RESET_TAG);
        if ((uintptr_t)t->cancels[i] & RESET_TAG && hwt_wheel_linked(to) &&
            !(nmet && bsearch(&to, met, nmet, sizeof(*met), cmp_ptr)))
            soon_offer(h, to, h->order++, true);
    }
    pthread_mutex_unlock(&t->cancel_lock);
    free(met);
}

int hwt_timer_soonest(hwt_timer *t, size_t limit, hwt_visit_fn fn, void *ctx, size_t *found)
{
    soon_heap h = {.limit = limit};
    *found = 0;
    pthread_mutex_lock(&t->lock);
    if (may_transfer(t))
        transfer_for_walk(t);
    hwt_wheel_visit(&t->wheel, soon_visit, &h);
    soon_offer_reset(t, &h);
    if (!h.err) {
        /* heap sort: the largest goes last */
        for (size_t n = h.n; n > 1; n--) {
            soon tmp = h.v[0];
            h.v[0] = h.v[n - 1];
            h.v[n - 1] = tmp;
            soon_sift_down(h.v, n - 1, 0);
        }
        for (size_t i = 0; i < h.n; i++)
            fn(ctx, h.v[i].to);
        *found = h.n;
    }
    pthread_mutex_unlock(&t->lock);
    free(h.v);
    return h.err;
}

/* ---- what a manual timer holds ---- */

typedef struct held_walk {
    hwt_held_fn fn;
    void *ctx;
    int r;
} held_walk;

static int visit_chain(held_walk *w, hwt_timeout *to)
{
    for (; to && !w->r; to = hwt_timeout_of(to->link.next))
        w->r = w->fn(w->ctx, to);
    return w->r;
}

static bool visit_linked(void *ctx, hwt_timeout *to)
{
    held_walk *w = ctx;
    if (to)
        w->r = w->fn(w->ctx, to);
    return w->r == 0;
}

/* What `s` holds for its consumer, under its lock. */
static int visit_published(held_walk *w, hwt_sink *s)
{
    if (w->r)
        return w->r; /* the walk was stopped */
    pthread_mutex_lock(&s->lock);
    visit_chain(w, s->head);
    pthread_mutex_unlock(&s->lock);
    return w->r;
}

int hwt_timer_visit_held(hwt_timer *t, hwt_held_fn fn, void *ctx)
{
    if (!t->cfg.manual)
        return 0;
    held_walk w = {.fn = fn, .ctx = ctx};
    pthread_mutex_lock(&t->lock);
    hwt_timeout *stack = atomic_load(&t->new_head);
    visit_chain(&w, stack == CLOSED ? NULL : stack);
    visit_chain(&w, t->xfer_head);
    if (!w.r)
        hwt_wheel_visit_all(&t->wheel, visit_linked, &w);
    /* batches are published before the lock is let go; were one not, its
       timeouts are the timer's still */
    for (hwt_sink *s = t->batch_sinks; s && !w.r; s = s->batch_next)
        visit_chain(&w, s->batch_head);
    visit_chain(&w, t->default_sink.batch_head);
    visit_chain(&w, t->released.batch_head);
    pthread_mutex_unlock(&t->lock);
    visit_published(&w, &t->default_sink);
    visit_published(&w, &t->released);
    return w.r;
}

/* ---- stop ---- */

/* Takes a timeout still held at stop, in state `held` (QUEUED or INIT):
   an unprocessed one is cancelled and returned; one a late cancel() got
   first is released. */
static void take_at_stop(hwt_timer *t, hwt_timeout *to, uint32_t held, hwt_timeout **out_tail)
{
    uint32_t expect = held;
    bool mine = atomic_compare_exchange_strong(&to->state, &expect, HWT_CANCELLED);
    if (!mine) { /* counted by its cancel() */
        release_cancelled(t, to);
        return;
    }
    to->link.next = NULL;
    (*out_tail)->link.next = &to->link;
    *out_tail = to;
}

/* Tells every sink's consumer that nothing more will arrive. */
static void finish_sinks(hwt_timer *t)
{
    pthread_mutex_lock(&t->sinks_lock);
    for (hwt_sink *s = t->sinks; s; s = s->next_sink) {
        pthread_mutex_lock(&s->lock);
        s->finished = true;
        if (!s->closed) { /* a closed sink's wake-up may be gone */
            if (s->wake)
                s->wake(s);
            else
                pthread_cond_broadcast(&s->ready);
        }
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&t->sinks_lock);
}

hwt_timeout *hwt_timer_stop(hwt_timer *t)
{
    hwt_timeout *out;
    hwt_timer_stop_to(t, &out);
    return out;
}

void hwt_timer_stop_to(hwt_timer *t, hwt_timeout **out)
{
    if ((t->state == T_STOPPED && !t->unswept) || (t->state == T_NEW && !t->unstarted)) {
        t->state = T_STOPPED;
        *out = NULL;
        finish_sinks(t); /* their consumers, if any, are done waiting */
        return;
    }
    /* else unstarted, or unswept in a child of fork(): no worker, but maybe timeouts */
    bool worker = t->state == T_STARTED;
    t->unswept = false;
    t->state = T_STOPPED;
    atomic_store(&t->stopping, true);
    wake_worker(t);
    if (worker && !t->cfg.manual && !t->orphaned)
        pthread_join(t->thread, NULL);

    pthread_mutex_lock(&t->lock);
    /* From here no cancel is queued and nothing new is accepted. */
    pthread_mutex_lock(&t->cancel_lock);
    t->cancel_closed = true;
    pthread_mutex_unlock(&t->cancel_lock);
    process_cancels(t);
    take_new(t, CLOSED);

    hwt_timeout out_head = {0}, *out_tail = &out_head;
    for (hwt_timeout *to; (to = pop_xfer(t));)
        take_at_stop(t, to, HWT_QUEUED, &out_tail);
    for (hwt_timeout *to = hwt_wheel_drain(&t->wheel), *next; to; to = next) {
        next = hwt_timeout_of(to->link.next);
        take_at_stop(t, to, HWT_INIT, &out_tail);
    }
    uint64_t returned = 0;
    for (hwt_timeout *to = hwt_timeout_of(out_head.link.next); to;
         to = hwt_timeout_of(to->link.next))
        returned++;
    /* the cancel lock orders this with late cancel() calls, which count too */
    pthread_mutex_lock(&t->cancel_lock);
    count(&t->cancelled, returned);
    pthread_mutex_unlock(&t->cancel_lock);
    /* stored with the lock held, which a fork() takes first: a child made
       once the sweep is done finds the list where the caller keeps it */
    *out = hwt_timeout_of(out_head.link.next);
    publish_batches(t);
    finish_sinks(t);
    pthread_mutex_unlock(&t->lock);
}

int64_t hwt_timer_advance(hwt_timer *t, int64_t now)
{
    if (t->state != T_STARTED)
        return HWT_NEVER;
    pthread_mutex_lock(&t->lock);
    int64_t target = run_due(t, now);
    pthread_mutex_unlock(&t->lock);
    return tick_end(t, target);
}

/* ---- sinks ---- */

int hwt_sink_init(hwt_sink *s, hwt_timer *t, hwt_wake_fn wake, int wake_fd, void *owner)
{
    memset(s, 0, sizeof(*s));
    s->timer = t;
    s->owner = owner;
    s->wake = wake;
    s->wake_fd = wake_fd;
    int err = pthread_mutex_init(&s->lock, NULL);
    if (err)
        return err;
    err = hwt_cond_init(&s->ready);
    if (err) {
        pthread_mutex_destroy(&s->lock);
        return err;
    }
    pthread_mutex_lock(&t->sinks_lock);
    s->next_sink = t->sinks;
    if (t->sinks)
        t->sinks->prev_sink = s;
    t->sinks = s;
    s->finished = t->state == T_STOPPED;
    pthread_mutex_unlock(&t->sinks_lock);
    return 0;
}

/* Ends what a closed sink will not run: periodic ones delivered to it will
   not run again, and one-shots delivered RUNNING will not run. */
static hwt_timeout *end_unrun(hwt_timeout *list)
{
    for (hwt_timeout *to = list; to; to = hwt_timeout_of(to->link.next)) {
        if (hwt_timeout_delivered_running(to))
            hwt_timeout_finish(to, HWT_CANCELLED);
    }
    return list;
}

hwt_timeout *hwt_sink_close(hwt_sink *s)
{
    pthread_mutex_lock(&s->lock);
    s->closed = true;
    hwt_timeout *list = s->head;
    s->head = s->tail = NULL;
    pthread_mutex_unlock(&s->lock);
    return end_unrun(list);
}

void hwt_sink_destroy(hwt_sink *s)
{
    hwt_timer *t = s->timer;
    pthread_mutex_lock(&t->sinks_lock);
    if (s->prev_sink)
        s->prev_sink->next_sink = s->next_sink;
    else
        t->sinks = s->next_sink;
    if (s->next_sink)
        s->next_sink->prev_sink = s->prev_sink;
    pthread_mutex_unlock(&t->sinks_lock);
    pthread_cond_destroy(&s->ready);
    pthread_mutex_destroy(&s->lock);
}

hwt_timeout *hwt_sink_take(hwt_sink *s)
{
    pthread_mutex_lock(&s->lock);
    hwt_timeout *list = s->head;
    s->head = s->tail = NULL;
    pthread_mutex_unlock(&s->lock);
    return list;
}

bool hwt_sink_has_work(hwt_sink *s)
{
    pthread_mutex_lock(&s->lock);
    bool work = s->head != NULL;
    pthread_mutex_unlock(&s->lock);
    return work;
}

hwt_timeout *hwt_sink_put_back(hwt_sink *s, hwt_timeout *list)
{
    if (!list)
        return NULL;
    hwt_timeout *last = list;
    while (last->link.next)
        last = hwt_timeout_of(last->link.next);
    pthread_mutex_lock(&s->lock);
    bool closed = s->closed;
    if (!closed) {
        last->link.next = s->head ? &s->head->link : NULL;
        if (!s->head)
            s->tail = last;
        s->head = list;
    }
    pthread_mutex_unlock(&s->lock);
    return closed ? end_unrun(list) : NULL;
}

hwt_timeout *hwt_sink_wait(hwt_sink *s, bool *finished, hwt_timeout **taken)
{
    pthread_mutex_lock(&s->lock);
    s->sleeping = true;
    while (!s->head && !s->finished && !s->released_waiting)
        pthread_cond_wait(&s->ready, &s->lock);
    s->sleeping = false;
    s->released_waiting = false;
    hwt_timeout *list = s->head;
    s->head = s->tail = NULL;
    if (taken)
        *taken = list; /* under the lock, which fork() takes too */
    if (s->handing_over) {
        s->handing_over = false;
        hwt_park_wake(&s->timer->park);
    }
    *finished = list == NULL && s->finished;
    pthread_mutex_unlock(&s->lock);
    return list;
}

/* ---- lateness window ---- */

void hwt_timer_record_task(hwt_timer *t, int64_t late_ns, int64_t run_ns)
{
    t->late[t->late_pos] = late_ns;
    t->late_pos = (t->late_pos + 1) % LATENCY_WINDOW;
    if (t->late_n < LATENCY_WINDOW)
        t->late_n++;
    if (run_ns > t->task_time_max)
        t->task_time_max = run_ns;
}

void hwt_timer_record_untimed(hwt_timer *t)
{
    t->untimed++;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

int hwt_timer_latency(hwt_timer *t, hwt_latency *out)
{
    /* on the heap: the window is 32 KiB, as much as the whole stack of a
       thread made with Python's smallest threading.stack_size() */
    size_t n = t->late_n;
    int64_t *sorted = NULL;
    if (n) {
        sorted = malloc(n * sizeof(int64_t));
        if (!sorted)
            return ENOMEM;
        memcpy(sorted, t->late, n * sizeof(int64_t));
        qsort(sorted, n, sizeof(int64_t), cmp_i64);
    }
    out->samples = n;
    out->late_p50 = n ? sorted[(n - 1) / 2] : 0;
    out->late_p99 = n ? sorted[(n - 1) * 99 / 100] : 0;
    out->late_max = n ? sorted[n - 1] : 0;
    out->task_time_max = t->task_time_max;
    out->untimed = t->untimed;
    free(sorted);
    return 0;
}
