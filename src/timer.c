/*
 * timer.c: hwtimer.HashedWheelTimer: construction, start and stop (with
 * the dispatch thread of dispatch.c), and the methods that schedule.
 */
#include "binding.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>
#include <time.h>
#include <unistd.h>

#define MAX_LIVE_TIMERS 64

/* ---- start and stop ---- */

/* Links `self` at the head of the list *head (running_timers or
   stopping_timers), through running_next and running_prev. */
static void timers_link(TimerObject **head, TimerObject *self)
{
    self->running_prev = NULL;
    self->running_next = *head;
    if (*head)
        (*head)->running_prev = self;
    *head = self;
}

static void timers_unlink(TimerObject **head, TimerObject *self)
{
    if (self->running_prev)
        self->running_prev->running_next = self->running_next;
    else
        *head = self->running_next;
    if (self->running_next)
        self->running_next->running_prev = self->running_prev;
}

/* How many running timers with threads run here: in a child of fork(),
   those the parent started stay listed (the atexit hook stops them) but
   have no worker, and run nothing. */
static Py_ssize_t running_here(hwtimer_state *st)
{
    Py_ssize_t n = 0;
    for (TimerObject *t = st->running_timers; t; t = t->running_next)
        n += !t->manual && !hwt_timer_orphaned(t->core);
    return n;
}

/* Lists `self` as running.  Returns true if it is the first timer with
   threads (a ManualTimer has none) past MAX_LIVE_TIMERS in this process
   (a child of fork() has its own), for the caller to warn_too_many() once
   its start is done: the warning runs Python code (logging's handlers),
   which may stop this timer, and a stop() waits for a dispatch thread the
   start has yet to start. */
static bool running_add(TimerObject *self)
{
    hwtimer_state *st = self->module_state;
    self->running = true;
    timers_link(&st->running_timers, self);
    if (self->manual)
        return false;
    if (++st->nrunning > MAX_LIVE_TIMERS && st->too_many_logged_by != getpid() &&
        running_here(st) > MAX_LIVE_TIMERS) {
        st->too_many_logged_by = getpid();
        return true;
    }
    return false;
}

static void warn_too_many(hwtimer_state *st)
{
    hwtimer_log_error(st, "more than 64 HashedWheelTimer instances are running: a timer is a "
                          "shared resource; share one per process (hwtimer.default_timer())");
}

static void running_remove(TimerObject *self)
{
    hwtimer_state *st = self->module_state;
    if (!self->running)
        return;
    self->running = false;
    timers_unlink(&st->running_timers, self);
    if (!self->manual)
        st->nrunning--;
}

/* A timer no longer running whose dispatch thread may still run a task:
   one whose stop() waits for it (in another thread, a daemon one say, at
   exit), or whose stop() a signal interrupted.  The atexit hook waits for
   it there. */
static void stopping_add(TimerObject *self)
{
    if (self->stopping)
        return;
    self->stopping = true;
    timers_link(&self->module_state->stopping_timers, self);
}

void hwtimer_timer_unlist_running(TimerObject *self)
{
    running_remove(self);
}

void hwtimer_timer_unlist_stopping(TimerObject *self)
{
    if (!self->stopping)
        return;
    self->stopping = false;
    timers_unlink(&self->module_state->stopping_timers, self);
}

/* ---- a manual timer's start and stop: no threads ---- */

/* In a fork child, the first time it is locked there: a thread of the
   parent that held advance_lock (in an advance() or waiting for the GIL
   with it) did not come along, and would never release it.  Only the
   thread that forked did, maybe from a task of its own advance(): that
   one goes on.  Returns 0, or -1 with an exception. */
static int manual_lock_after_fork(TimerObject *self)
{
    self->forks_seen = hwtimer_forks;
    if (self->advancing && self->advancing == hwtimer_forking_thread)
        return 0;
    self->advancing = 0;
    self->holder_waits_on = self->held_outer = NULL;
    int err = pthread_mutex_init(&self->advance_lock, NULL);
    return err ? hwtimer_core_error(self, err, "lock the timer after fork()") : 0;
}

/* What this thread waits for now, or NULL: a timer whose stop() waits
   for its dispatch thread, or a ManualTimer whose advance_lock it waits
   for; and the innermost ManualTimer whose advance_lock it holds (the
   others chained through held_outer).  A wait is noted (note_wait()) in
   its dispatcher, if it is a dispatch thread, and in each ManualTimer it
   holds, whose tasks run on it too: the other threads look there.  While
   it waits, thread_wait_holds is the innermost one it held as the wait
   began: one it takes later (in a signal handler that the wait ran) is
   let go of before the wait goes on, and is not held through it. */
static _Thread_local TimerObject *thread_waits_on;
static _Thread_local TimerObject *thread_holds;
static _Thread_local TimerObject *thread_wait_holds;

/* What wait_begin() keeps for wait_end(): the wait of this thread that
   the new one is within (a signal handler's), if any. */
typedef struct {
    TimerObject *waits_on; /* what it waited for, or NULL */
    TimerObject *holds;    /* its thread_wait_holds */
} outer_wait;

/* Whether `timer`'s advancing thread, if any, is one of this process
   (in a child of fork(), only the thread that forked came along). */
static bool holder_here(TimerObject *timer)
{
    return timer->forks_seen == hwtimer_forks ||
           (timer->advancing && timer->advancing == hwtimer_forking_thread);
}

bool hwtimer_manual_advancing(TimerObject *timer)
{
    return timer->advancing && holder_here(timer);
}

/* Whether `timer`'s tasks run on this thread now: it is its dispatch
   thread, or holds its advance_lock. */
static bool runs_here(TimerObject *timer)
{
    if (timer->manual)
        return timer->advancing == PyThread_get_thread_ident() && holder_here(timer);
    DispatchObject *d = (DispatchObject *)timer->dispatcher;
    return d && d == hwtimer_this_thread_dispatch && d->pid == getpid();
}

/* What the thread that runs `timer`'s tasks now waits for, or NULL. */
static TimerObject *runner_waits_on(TimerObject *timer)
{
    if (timer->manual)
        return hwtimer_manual_advancing(timer) ? timer->holder_waits_on : NULL;
    DispatchObject *d = (DispatchObject *)timer->dispatcher;
    return d && d->pid == getpid() ? d->waits_on : NULL;
}

/* Notes that this thread waits for `timer` (NULL: for nothing), with
   `held` the innermost ManualTimer it held as that wait began: those it
   took since hold nothing through the wait. */
static void note_wait(TimerObject *timer, TimerObject *held)
{
    thread_waits_on = timer;
    thread_wait_holds = timer ? held : NULL;
    DispatchObject *mine = hwtimer_this_thread_dispatch;
    if (mine && mine->pid == getpid())
        mine->waits_on = timer;
    TimerObject *waits = NULL;
    for (TimerObject *m = thread_holds; m; m = m->held_outer) {
        if (m == held)
            waits = timer;
        m->holder_waits_on = waits;
    }
}

/* Before this thread waits for the thread that runs `timer`'s tasks (in
   `what`: stop(), or for a ManualTimer's advance_lock): refuses the wait
   with RuntimeError if that thread waits, itself or through others that
   do, for this one, which would then wait for ever; else notes it, and
   keeps what this thread waited for in *outer, for wait_end().  Check
   and note hold the GIL throughout: of two waits that would close a
   cycle, the second sees the first.  Returns 0, or -1 with the error. */
static int wait_begin(TimerObject *timer, const char *what, outer_wait *outer)
{
    outer->waits_on = thread_waits_on;
    outer->holds = thread_wait_holds;
    if (runs_here(timer))
        return 0; /* no wait: a dealloc's stop() on its dispatch thread */
    TimerObject *w = runner_waits_on(timer);
    for (int hops = 0; w && hops < 1000; hops++, w = runner_waits_on(w)) {
        if (runs_here(w)) {
            PyErr_Format(PyExc_RuntimeError,
                         "%s would wait forever: the thread that runs that timer's tasks waits, "
                         "in a stop() or an advance, for this one",
                         what);
            return -1;
        }
    }
    note_wait(timer, thread_holds);
    return 0;
}

/* Notes again the wait this one was within, if any: a ManualTimer that
   this thread took since that one began (in a signal handler it ran) is
   held by a thread that runs its tasks, not one that waits. */
static void wait_end(const outer_wait *outer)
{
    note_wait(outer->waits_on, outer->holds);
}

int hwtimer_manual_lock(TimerObject *self, const char *what)
{
    if (self->forks_seen != hwtimer_forks && manual_lock_after_fork(self) < 0)
        return -1;
    unsigned long me = PyThread_get_thread_ident();
    if (self->advancing == me) {
        PyErr_Format(PyExc_RuntimeError,
                     "%s cannot be called from a task of the ManualTimer it would move", what);
        return -1;
    }
    if (pthread_mutex_trylock(&self->advance_lock) != 0) {
        /* another thread advances it: wait for it to finish, running
           signal handlers meanwhile (Ctrl-C raises out of the wait, which
           has changed nothing), as a real timer's stop() does */
        outer_wait outer;
        if (wait_begin(self, what, &outer) < 0)
            return -1;
        for (;;) {
            bool locked;
            Py_BEGIN_ALLOW_THREADS
            locked = hwt_mutex_lock_within(&self->advance_lock, HWTIMER_SIGNAL_POLL_NS);
            Py_END_ALLOW_THREADS
            if (locked)
                break;
            if (PyErr_CheckSignals() < 0) {
                wait_end(&outer);
                return -1;
            }
        }
        wait_end(&outer);
    }
    self->advancing = me;
    self->holder_waits_on = NULL;
    self->held_outer = thread_holds;
    thread_holds = self;
    return 0;
}

void hwtimer_manual_unlock(TimerObject *self)
{
    for (TimerObject **p = &thread_holds; *p; p = &(*p)->held_outer) {
        if (*p == self) {
            *p = self->held_outer;
            break;
        }
    }
    self->advancing = 0;
    self->holder_waits_on = self->held_outer = NULL;
    pthread_mutex_unlock(&self->advance_lock);
}

static int manual_start(TimerObject *self)
{
    int err = hwt_timer_start(self->core); /* only notes the clock */
    if (err)
        return hwtimer_core_error(self, err, "start the timer");
    if (running_add(self))
        warn_too_many(self->module_state);
    return 0;
}

/* Appends the chain `left` to `list` (NULL: only releases it), and
   releases the chain either way.  Returns `list`, or NULL if an append
   failed.  The deadlines of sleep() and of scopes in `left` are not
   listed: they go on on their loops' clocks. */
static PyObject *list_left(TimerObject *self, PyObject *list, hwt_timeout *left)
{
    PyTypeObject *loop_timeout_type = self->module_state->loop_timeout_type;
    while (left) {
        hwt_timeout *next = hwt_timeout_of(left->link.next);
        PyObject *to = hwtimer_timeout_from_node(left);
        if (Py_IS_TYPE(to, loop_timeout_type) && ((LoopTimeoutObject *)to)->grid.owned) {
            /* without on_stop, its owner has cancelled it meanwhile */
            if (((LoopTimeoutObject *)to)->on_stop)
                hwtimer_loop_timeout_stopped((LoopTimeoutObject *)to);
        } else if (list && PyList_Append(list, to) < 0) {
            Py_CLEAR(list); /* still release the rest */
        }
        hwtimer_timeout_track_if_held((TimeoutObject *)to); /* the list's now */
        Py_DECREF(to);
        left = next;
    }
    return list;
}

/* Returns what stop() returns (a new reference), or NULL: the periodic
   timeouts that were in their run (those on the executor or delivered to a
   loop too, whose runs may end later), and the chain `left`, which it
   releases either way (list_left). */
static PyObject *stop_list(TimerObject *self, hwt_timeout *left)
{
    /* A collection in PyList_New() can run a finalizer that releases the
       GIL, and an executor's run that ends meanwhile makes stopped_periodic
       (keep_for_stop): that list is the one returned. */
    PyObject *made = self->stopped_periodic ? NULL : PyList_New(0);
    PyObject *list = self->stopped_periodic ? self->stopped_periodic : made;
    if (list != made && made)
        Py_DECREF(made);
    else if (list != made)
        PyErr_Clear(); /* made failed: what was kept is listed still */
    self->stopped_periodic = NULL;
    self->stop_collected = true;
    hwtimer_stop_handed_out(self, list);
    hwtimer_loop_sinks_stop_periodic(self, list);
    return list_left(self, list, left);
}

/* After a stop() that a signal interrupted: what it would have returned
   waits for the next call in stopped_periodic, where the cyclic GC sees
   it, not in stop_left, which it does not: with no next call, it would
   keep its tasks and this timer (each holds it) alive for ever.  Out of
   memory, they are released unlisted, as stop_list() does. */
static void keep_left(TimerObject *self)
{
    hwt_timeout *left = self->stop_left;
    self->stop_left = NULL;
    if (!left)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *kept = PyList_New(0);
    PyErr_Clear();
    kept = list_left(self, kept, left);
    PyErr_Clear();
    if (kept && !self->stopped_periodic) {
        self->stopped_periodic = kept;
        kept = NULL;
    } else if (kept) {
        if (PyList_SetSlice(self->stopped_periodic, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, kept) < 0)
            PyErr_Clear(); /* cancelled, only unlisted */
    }
    Py_XDECREF(kept);
    PyErr_Restore(type, value, tb);
}

/* Runs on this thread what was delivered to the default sink and not
   taken, as a dispatch thread would have. */
static void run_expired_here(TimerObject *self)
{
    hwt_sink *default_sink = hwt_timer_default_sink(self->core);
    hwtimer_run_batch(default_sink, hwt_sink_take(default_sink), false, NULL);
}

/* stop() of a manual timer: waits for an advance() in another thread, then
   runs here what had expired and not run (an advance cut short), as a real
   timer's dispatch thread would before its stop() returns. */
static PyObject *manual_stop(TimerObject *self)
{
    if (hwtimer_manual_lock(self, "stop()") < 0)
        return NULL;
    running_remove(self);
    hwt_timeout *left = hwt_timer_stop(self->core);
    run_expired_here(self);
    hwtimer_release_handed_back(self->core);
    hwtimer_manual_unlock(self);
    return stop_list(self, left);
}

/* Whether start() has anything to do: 1 if so, 0 if the timer runs
   already (start() is a no-op), -1 with RuntimeError if it cannot start. */
static int start_needed(TimerObject *self)
{
    if (hwt_timer_started(self->core)) /* in a child of fork() too: it cannot run there */
        return hwt_timer_orphaned(self->core) ? hwtimer_core_error(self, HWT_ESTOPPED, "start")
                                              : 0;
    if (hwt_timer_stopped(self->core) || self->dispatcher) {
        /* a user's stop() of the shared timer is final for the process:
           say whose it is */
        PyErr_Format(PyExc_RuntimeError,
                     self->shared ? "cannot start a stopped timer (%R): the shared timer of "
                                    "hwtimer.default_timer() was stopped, and does not start "
                                    "again in this process"
                                  : "cannot start a stopped timer (%R): a timer does not start "
                                    "again; make a new one",
                     self->name);
        return -1;
    }
    if (self->module_state->exiting) {
        PyErr_SetString(PyExc_RuntimeError, "cannot start a timer: the interpreter is exiting");
        return -1;
    }
    return 1;
}

int hwtimer_timer_start(TimerObject *self)
{
    int needed = start_needed(self);
    if (needed <= 0)
        return needed;
    if (self->manual)
        return manual_start(self);
    if (self->executor)
        hwtimer_watch_thread_exit(self->module_state);
    DispatchObject *d = hwtimer_dispatch_new(self);
    if (!d)
        return -1;
    /* Both calls above may run Python code (threading's hook, a GC), and
       so let another thread start or stop this timer meanwhile: asked
       again here, with nothing from this check to running_add() that
       lets go of the GIL, a start happens exactly once, with one dispatch
       thread. */
    if ((needed = start_needed(self)) <= 0) {
        Py_DECREF(d);
        return needed;
    }
    int err = hwt_timer_start(self->core);
    if (err) {
        Py_DECREF(d);
        return hwtimer_core_error(self, err, "start the timer");
    }
    self->dispatcher = (PyObject *)d;
    /* Running from here: a stop() while Thread.start() lets go of the GIL
       stops the worker, and the dispatch thread exits as soon as it runs.
       One in this thread meanwhile (a signal handler, a finalizer, run as
       the Thread is made or started) does not wait for that thread, which
       may never start: it abandons it (never_runs(), with `starter`). */
    bool warn = running_add(self);
    d->starter = PyThread_get_thread_ident();
    PyObject *run = PyObject_GetAttrString((PyObject *)d, "run");
    PyObject *kwargs =
        run ? Py_BuildValue("{s:O,s:O,s:O}", "target", run, "name", d->name, "daemon", Py_True)
            : NULL;
    PyObject *args = PyTuple_New(0);
    PyObject *thread =
        kwargs && args ? PyObject_Call(self->module_state->thread_type, args, kwargs) : NULL;
    if (thread && !(d->thread_ref = PyWeakref_NewRef(thread, NULL)))
        PyErr_Clear(); /* only a thread that never runs run() is then waited for */
    PyObject *r = thread ? PyObject_CallMethod(thread, "start", NULL) : NULL;
    d->starter = 0;
    Py_XDECREF(run);
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
    Py_XDECREF(thread);
    if (!r) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (!self->running && !d->thread_id) {
            /* a stop() meanwhile, which waits for this dispatch thread:
               it runs what had expired in the thread's place (a thread
               that may yet exist returns at once); or, if a signal ended
               its wait, this call does, as the thread would have */
            d->abandoned = true;
            if (!self->stop_waiter)
                run_expired_here(self);
            hwtimer_dispatch_mark_done(d);
        } else if (self->running && !d->thread_id) {
            /* no dispatch thread (or one that has not run yet, if
               Thread.start() was interrupted as it waited: it will return
               at once): back to not started, so that start() can be called
               again, with what other threads scheduled meanwhile kept for
               it.  The GIL is held while the worker exits (it never takes
               the GIL): no start(), stop() or schedule sees the timer half
               way. */
            d->abandoned = true;
            running_remove(self);
            hwt_timer_unstart(self->core);
            Py_CLEAR(self->dispatcher);
        } /* else its thread runs (started, and interrupted only after): it
             runs what expired, and lets a stop() go */
        hwtimer_release_handed_back(self->core);
        if (warn && self->running)
            warn_too_many(self->module_state);
        else if (warn) /* not running after all: the next one past the limit warns */
            self->module_state->too_many_logged_by = 0;
        PyErr_Restore(type, value, tb);
        return -1;
    }
    Py_DECREF(r);
    if (warn)
        warn_too_many(self->module_state);
    return 0;
}

/* Stops the worker, if no other call has, and waits for the dispatch
   thread `d`.  Returns stop()'s list, or NULL. */
static PyObject *stop_and_wait(TimerObject *self, DispatchObject *d)
{
    bool first = hwt_timer_started(self->core) && self->running;
    if (first) {
        running_remove(self);
        stopping_add(self);
        /* Marked before the GIL is let go: another call whose wait ends
           before this one has its GIL back returns [], and leaves what
           was pending (the periodic runs handed out included) to this
           call, rather than take a part of it. */
        self->stop_waiter = getpid();
        /* stored by the core under its lock, not once this thread has the
           GIL back: a fork() by the thread that holds it meanwhile gives a
           child whose stop() finds them there.  No other call reads it
           here before this one has returned. */
        Py_BEGIN_ALLOW_THREADS
        hwt_timer_stop_to(self->core, &self->stop_left);
        Py_END_ALLOW_THREADS
    }
    /* else stopped, or being stopped by another call: wait as it does; or
       in a fork child, where the call that stopped it did not come along:
       this one returns its list, and claims it as that call did */
    bool claim = first || (d->pid != getpid() && self->stop_waiter != getpid());
    if (claim)
        self->stop_waiter = getpid();
    int r = hwtimer_dispatch_wait_done(d);
    if (r < 0) { /* interrupted: the next call returns them */
        if (claim) {
            self->stop_waiter = 0;
            keep_left(self);
            stopping_add(self);
        }
        return NULL;
    }
    hwtimer_timer_unlist_stopping(self);
    if (d->pid != getpid()) { /* a fork child: no dispatch thread came along to run these */
        /* a stop() that was waiting for the worker in the parent when it
           forked had not yet swept the core, and its thread stayed there:
           the core's stop() here returns what the timer held.  One that
           had swept it left its list in stop_left: the core stores it in
           the locked section that sweeps, which fork() cannot split, so
           never both. */
        if (!first && !self->stop_left)
            self->stop_left = hwt_timer_stop(self->core);
        /* the periodic ones still pending: what the parent's dispatch
           thread held, and what waited for it */
        hwtimer_stop_unrun(self, d->held[0], false);
        hwtimer_stop_unrun(self, d->held[1], true);
        d->held[0] = d->held[1] = NULL;
        hwt_timeout *waiting = hwt_sink_take(hwt_timer_default_sink(self->core));
        hwtimer_stop_unrun(self, waiting, true);
        hwtimer_release_chain(waiting);
    }
    else if (d->abandoned) /* its start() failed: they run here, as no dispatch thread will */
        run_expired_here(self);
    hwtimer_release_handed_back(self->core);
    /* Marked until here: what ran above (the tasks, and the finalizers of
       what they and the timeouts let go of) may call stop() too, which
       must leave what was pending to this call. */
    if (claim)
        self->stop_waiter = 0;
    else if (self->stop_waiter == getpid())
        return PyList_New(0); /* the call that stopped it returns them */
    hwt_timeout *left = self->stop_left;
    self->stop_left = NULL;
    return stop_list(self, left);
}

PyObject *hwtimer_timer_stop(TimerObject *self)
{
    if (self->manual)
        return manual_stop(self);
    if (!self->dispatcher) { /* never started, or its start() failed */
        hwt_timeout *left = hwt_timer_stop(self->core);
        /* expired before a start() that failed took the worker down: run
           here, as no dispatch thread will; a periodic one's re-arm finds
           the timer stopped and keeps it for stop_list(), or it is handed
           to the executor, where stop_list() finds it */
        run_expired_here(self);
        hwtimer_release_handed_back(self->core);
        return stop_list(self, left);
    }
    /* A thread that runs tasks (a dispatch thread, or one that advances a
       ManualTimer) and waits for another one must not be waited for by
       it, nor by any in between. */
    outer_wait outer;
    if (wait_begin(self, "stop()", &outer) < 0)
        return NULL;
    PyObject *r = stop_and_wait(self, (DispatchObject *)self->dispatcher);
    wait_end(&outer);
    return r;
}

/* ---- construction ---- */

/* Reads tick_duration (NULL: `default_tick`) into seconds, clamped as API.md says;
   *clamped says whether it was, for the caller to warn once every argument
   is accepted.  Returns 0 or -1. */
static int parse_tick(hwtimer_state *st, PyObject *tick_o, double default_tick, double *out,
                      bool *clamped)
{
    double tick = default_tick;
    /* a number too large for a double (an int, a Fraction): far too long
       (finite, so not refused here), or negative */
    bool huge = false;
    if (tick_o && hwtimer_parse_seconds(st, tick_o, "tick_duration", &tick) < 0) {
        if (hwtimer_huge_seconds(tick_o, &tick) < 0)
            return -1;
        huge = true;
    }
    if (!(tick > 0) || (isinf(tick) && !huge))
        return hwtimer_value_error("tick_duration must be > 0 and finite", tick_o);
    *clamped = tick < 0.001;
    if (*clamped)
        tick = 0.001;
    *out = tick;
    return 0;
}

/* Checks thread_name (None or a str without NUL) and executor (None or
   something with submit()).  Returns 0 or -1. */
static int check_name_and_executor(PyObject *name_o, PyObject *executor)
{
    if (name_o != Py_None) {
        if (!PyUnicode_Check(name_o)) {
            PyErr_Format(PyExc_TypeError, "thread_name must be a str or None, not %.200s",
                         hwtimer_type_name(Py_TYPE(name_o)));
            return -1;
        }
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(name_o, &len);
        if (!s && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            /* a lone surrogate: said of thread_name, not of the codec */
            PyErr_Clear();
            return hwtimer_value_error("thread_name must be text that UTF-8 can encode "
                                       "(no lone surrogates)",
                                       name_o);
        }
        if (!s)
            return -1;
        if ((size_t)len != strlen(s)) {
            PyErr_SetString(PyExc_ValueError, "thread_name must not contain NUL");
            return -1;
        }
        if (len == 0) { /* a thread with no name in ps -T: say None for the default */
            PyErr_SetString(PyExc_ValueError, "thread_name must not be empty (None: the default)");
            return -1;
        }
    }
    if (executor != Py_None) {
        int ok = hwtimer_has_method(executor, "submit");
        if (ok < 0)
            return -1;
        if (!ok) {
            PyErr_Format(PyExc_TypeError,
                         "executor must have a submit(fn, *args) method, like "
                         "concurrent.futures.Executor; %.200s has none",
                         hwtimer_type_name(Py_TYPE(executor)));
            return -1;
        }
        /* A class in place of an executor (executor=ThreadPoolExecutor):
           if its submit is an instance method, each task's submit(fn,
           timeout) would take fn for self and the Timeout for fn, and
           the task would never run.  A class whose submit needs no
           instance (a static or class method) is a namespace, and kept. */
        if (PyType_Check(executor)) {
            /* (a submit that only the metaclass's __getattr__ gives: None) */
            PyObject *getattr_static = hwtimer_import_attr("inspect", "getattr_static");
            PyObject *submit = getattr_static ? PyObject_CallFunction(getattr_static, "OsO",
                                                                      executor, "submit", Py_None)
                                              : NULL;
            PyObject *function = submit ? hwtimer_import_attr("types", "FunctionType") : NULL;
            int instance_method = function ? PyObject_IsInstance(submit, function) : -1;
            Py_XDECREF(function);
            Py_XDECREF(submit);
            Py_XDECREF(getattr_static);
            if (instance_method < 0)
                return -1;
            if (instance_method) {
                const char *name = hwtimer_type_name((PyTypeObject *)executor);
                PyErr_Format(PyExc_TypeError,
                             "executor must be an executor, not the class %.200s: "
                             "pass one, %.200s()",
                             name, name);
                return -1;
            }
        }
    }
    return 0;
}

/* The stack level of the first frame that does not run hwtimer.testing's
   code (ManualTimer.__init__ hands its arguments on to this __init__): the
   clamping warning names the line that made the timer, as it does for a
   HashedWheelTimer.  Returns it, or -1 with an error. */
static int caller_stacklevel(void)
{
    int level = 1;
    PyObject *frame = (PyObject *)PyEval_GetFrame();
    Py_XINCREF(frame); /* owned from here on */
    while (frame) {
        PyObject *globals = PyObject_GetAttrString(frame, "f_globals");
        if (!globals) {
            Py_DECREF(frame);
            return -1;
        }
        /* a frame's globals are a dict, which the frame holds: the name is
           borrowed from it and read before it is let go */
        PyObject *name = PyDict_Check(globals) ? PyDict_GetItemString(globals, "__name__") : NULL;
        bool ours = name && PyUnicode_Check(name) &&
                    PyUnicode_CompareWithASCIIString(name, "hwtimer.testing") == 0;
        Py_DECREF(globals);
        if (!ours)
            break;
        PyObject *back = PyObject_GetAttrString(frame, "f_back");
        Py_DECREF(frame);
        if (!back)
            return -1;
        if (back == Py_None) {
            Py_DECREF(back);
            back = NULL;
        }
        frame = back;
        level++;
    }
    Py_XDECREF(frame);
    return level;
}

/* Warns that tick_duration was clamped: only for a timer made (or
   re-made) with it, as a refused one has no tick.  Returns 0, or -1 with
   what a warning filter raised. */
static int warn_clamped(void)
{
    int level = caller_stacklevel();
    if (level < 0)
        return -1;
    return PyErr_WarnEx(PyExc_RuntimeWarning, "tick_duration below 0.001 s is clamped to 0.001 s",
                        level);
}

/* A manual timer's clock, read by its core: the TimerObject's own
   manual_now.  The core of a manual timer has no thread and reads its
   clock only when the binding calls it for that timer, which is alive. */
static int64_t manual_clock(void *ctx)
{
    return atomic_load_explicit((_Atomic int64_t *)ctx, memory_order_relaxed);
}

/* Checks the constructor's arguments and reads them into `cfg`: every
   setting but the thread's name and the clock, which belong to the
   timer being made.  *clamped says whether tick_duration was clamped, for
   the caller to warn once it makes a timer with it.  Returns 0, or -1
   with TypeError or ValueError. */
static int parse_config(hwtimer_state *st, const hwtimer_timer_args *a, hwt_config *cfg,
                        bool *clamped)
{
    double tick;
    if (parse_tick(st, a->tick_duration, a->default_tick, &tick, clamped) < 0)
        return -1;
    long long ticks = a->default_ticks, max_pending = 0;
    if (a->ticks_per_wheel && hwtimer_parse_int(a->ticks_per_wheel, "ticks_per_wheel", &ticks) < 0)
        return -1;
    uint32_t wheel = 0;
    if (ticks <= 0 || hwt_round_ticks((uint64_t)ticks, &wheel) != 0)
        return hwtimer_value_error("ticks_per_wheel must be in 1..2**30", a->ticks_per_wheel);
    if (tick * 1e9 >= 9.2e18 / wheel) {
        PyErr_SetString(PyExc_ValueError,
                        "tick_duration * ticks_per_wheel does not fit in 64-bit nanoseconds");
        return -1;
    }
    if (a->max_pending_timeouts &&
        hwtimer_parse_int(a->max_pending_timeouts, "max_pending_timeouts", &max_pending) < 0)
        return -1;
    if (check_name_and_executor(a->thread_name, a->executor) < 0)
        return -1;
    const char *wake_every = getenv("HWTIMER_WAKE_EVERY_TICK");
    *cfg = (hwt_config){
        .tick_ns = (int64_t)llround(tick * 1e9),
        .ticks_per_wheel = wheel,
        .max_pending = max_pending > 0 ? (int64_t)max_pending : 0,
        /* a worker's knob: a manual timer has none, and its advance()
           goes straight to the next tick with work */
        .wake_every_tick =
            !a->manual && wake_every && *wake_every && strcmp(wake_every, "0") != 0,
        .manual = a->manual,
    };
    return 0;
}

/* Makes the core of `self` from `cfg`, given the timer's own settings:
   its thread's name and, for a manual timer, its clock.  Returns 0 or
   -1. */
static int make_core(TimerObject *self, hwt_config cfg)
{
    cfg.thread_name = PyUnicode_AsUTF8AndSize(self->name, NULL);
    if (!cfg.thread_name)
        return -1;
    char native[16];
    hwtimer_native_name(cfg.thread_name, native);
    cfg.thread_name = native;
    cfg.clock = self->manual ? manual_clock : NULL;
    cfg.clock_ctx = self->manual ? (void *)&self->manual_now : NULL;
    self->core = hwt_timer_new(&cfg);
    if (!self->core)
        return hwtimer_core_error(self, errno, "create the timer");
    hwt_timer_default_sink(self->core)->owner = self;
    return 0;
}

PyObject *hwtimer_timer_build(PyTypeObject *tp, const hwtimer_timer_args *a)
{
    hwtimer_state *st = hwtimer_state_of_type(tp);
    hwt_config cfg;
    bool clamped;
    if (parse_config(st, a, &cfg, &clamped) < 0 || (clamped && warn_clamped() < 0))
        return NULL;
    TimerObject *self = (TimerObject *)HWT_TP_ALLOC(tp)(tp, 0);
    if (!self)
        return NULL;
    self->module_state = st;
    self->manual = a->manual;
    int err = hwtimer_note_forks();
    if (self->manual && !err) {
        self->forks_seen = hwtimer_forks;
        err = pthread_mutex_init(&self->advance_lock, NULL);
    }
    if (err) {
        self->manual = false;
        Py_DECREF(self);
        hwtimer_core_error(NULL, err, "create the timer");
        return NULL;
    }
    self->max_pending = cfg.max_pending;
    self->tick_duration = (double)cfg.tick_ns / 1e9;
    /* a str subclass's copy as a plain str: its own __repr__, __eq__ or
       __hash__ are not the name's, which repr() and the exporters use */
    self->name = a->thread_name != Py_None ? PyUnicode_FromObject(a->thread_name)
                                           : PyUnicode_FromFormat("hwtimer-%lu", ++st->next_id);
    self->loop_sinks = PyList_New(0);
    if (!self->name || !self->loop_sinks) {
        Py_DECREF(self);
        return NULL;
    }
    if (a->executor != Py_None) {
        Py_INCREF(a->executor);
        self->executor = a->executor;
    }
    if (make_core(self, cfg) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* The constructor's parameters, which __new__ and __init__ both take. */
static const char *const timer_names[] = {"tick_duration", "ticks_per_wheel",
                                          "max_pending_timeouts", "thread_name", "executor"};
static const hwtimer_signature timer_sig = {
    .fname = "HashedWheelTimer", .names = timer_names, .nparams = 5, .nkeyword_only = 3};

static int timer_init(PyObject *self_o, PyObject *args, PyObject *kwds);

/* Whether `tp` has a __new__ of its own: a subclass's, not the base's. */
static bool own_new(PyTypeObject *tp)
{
    hwtimer_state *st = hwtimer_state_of_type(tp);
    void *new_of = PyType_GetSlot(tp, Py_tp_new);
    return new_of != PyType_GetSlot(st->timer_type, Py_tp_new) &&
           new_of != PyType_GetSlot(st->manual_type, Py_tp_new);
}

static bool own_init(PyTypeObject *tp)
{
    return PyType_GetSlot(tp, Py_tp_init) != (void *)timer_init;
}

bool hwtimer_init_takes_arguments(PyTypeObject *tp)
{
    /* a __new__ of the subclass's own calls the base's with what it means
       the timer to have (super().__new__(cls, ...)), whatever __init__ */
    return own_init(tp) && !own_new(tp);
}

static PyObject *timer_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    PyObject *given[5] = {NULL};
    if (!hwtimer_init_takes_arguments(tp) && hwtimer_bind_tuple(&timer_sig, args, kwds, given) < 0)
        return NULL;
    hwtimer_timer_args a = {
        .tick_duration = given[0],
        .ticks_per_wheel = given[1],
        .max_pending_timeouts = given[2],
        .thread_name = given[3] ? given[3] : Py_None,
        .executor = given[4] ? given[4] : Py_None,
        .default_tick = 0.1,
        .default_ticks = 512,
    };
    return hwtimer_timer_build(tp, &a);
}

/* Whether the settings in `cfg`, `name` and `executor` (NULL: none) are
   those `self` has. */
static bool same_settings(TimerObject *self, const hwt_config *cfg, PyObject *name,
                          PyObject *executor)
{
    const hwt_config *now = hwt_timer_config(self->core);
    return cfg->tick_ns == now->tick_ns && cfg->ticks_per_wheel == now->ticks_per_wheel &&
           cfg->max_pending == self->max_pending && executor == self->executor &&
           PyUnicode_Compare(name, self->name) == 0;
}

/* Returns 0 if the settings of the timer `self` can still change, or -1
   with RuntimeError once it has been started.  One whose start() failed
   counts as started: what was scheduled meanwhile waits in its core for
   the next start(), and a new core would drop it. */
static int refuse_if_started(TimerObject *self)
{
    if (!hwt_timer_started(self->core) && !hwt_timer_stopped(self->core) &&
        !hwt_timer_unstarted(self->core) && !self->dispatcher)
        return 0;
    PyErr_SetString(PyExc_RuntimeError,
                    "cannot change the settings of a timer that has been started");
    return -1;
}

/* Gives the timer `self`, which has not started, the settings of `cfg`,
   the thread name `name` and `executor` (NULL: none): a core made anew,
   as __new__ would have made it.  Returns 0, or -1 with the timer as it
   was. */
static int apply_settings(TimerObject *self, hwt_config cfg, PyObject *name, PyObject *executor)
{
    hwt_timer *old_core = self->core;
    PyObject *old_name = self->name;
    self->name = PyUnicode_FromObject(name); /* a plain str, as __new__ keeps it */
    if (!self->name || make_core(self, cfg) < 0) {
        self->core = old_core;
        Py_XDECREF(self->name);
        self->name = old_name;
        return -1;
    }
    hwt_timer_decref(old_core);
    Py_DECREF(old_name);
    self->max_pending = cfg.max_pending;
    self->tick_duration = (double)cfg.tick_ns / 1e9;
    Py_XINCREF(executor);
    Py_XSETREF(self->executor, executor);
    return 0;
}

/* __init__: __new__ has read and applied the arguments.  It takes the same
   ones, and refuses what the constructor refuses, so that a subclass's
   __init__ can hand its arguments on with super().__init__(...), as
   object.__init__ would not let it.  Those it is given that differ from
   what __new__ applied (a subclass's __init__ that sets its own tick, its
   thread's name) are applied too, to a timer not yet started, as if given
   to the constructor; a thread_name of None keeps the name the timer has.
   A started or stopped timer keeps its settings: RuntimeError for others. */
static int timer_init(PyObject *self_o, PyObject *args, PyObject *kwds)
{
    TimerObject *self = (TimerObject *)self_o;
    /* As object.__init__: a subclass with a __new__ of its own and not an
       __init__ is called with that __new__'s arguments, which are not the
       constructor's.  One with an __init__ of its own too calls this one
       with what it hands on (super().__init__(...)). */
    hwtimer_state *st = self->module_state;
    if (own_new(Py_TYPE(self)) && !own_init(Py_TYPE(self)))
        return 0;
    /* a ManualTimer's takes what its __new__ takes: no thread, no executor */
    static const hwtimer_signature manual_sig = {
        .fname = "ManualTimer", .names = timer_names, .nparams = 3, .nkeyword_only = 1};
    PyObject *given[5] = {NULL};
    if (hwtimer_bind_tuple(self->manual ? &manual_sig : &timer_sig, args, kwds, given) < 0)
        return -1;
    if (!self->core)
        return 0;
    /* what is not given stays as __new__ applied it */
    uint32_t wheel = hwt_timer_config(self->core)->ticks_per_wheel;
    PyObject *tick = given[0] ? (Py_INCREF(given[0]), given[0])
                              : PyFloat_FromDouble(self->tick_duration);
    PyObject *ticks = given[1] ? (Py_INCREF(given[1]), given[1]) : PyLong_FromUnsignedLong(wheel);
    PyObject *max_pending = given[2] ? (Py_INCREF(given[2]), given[2])
                                     : PyLong_FromLongLong(self->max_pending);
    PyObject *name = given[3] && given[3] != Py_None ? given[3] : self->name;
    Py_INCREF(name);
    PyObject *executor = given[4] ? given[4] : self->executor ? self->executor : Py_None;
    Py_INCREF(executor);
    int r = -1;
    if (tick && ticks && max_pending) {
        hwtimer_timer_args a = {
            .tick_duration = tick,
            .ticks_per_wheel = ticks,
            .max_pending_timeouts = max_pending,
            .thread_name = name,
            .executor = executor,
            .manual = self->manual,
        };
        hwt_config cfg;
        bool clamped;
        PyObject *ex = executor == Py_None ? NULL : executor;
        /* parsing may run Python code (a __float__, another thread): the
           timer is looked at after it */
        if (parse_config(st, &a, &cfg, &clamped) < 0) {
            r = -1;
        } else if (same_settings(self, &cfg, name, ex)) {
            /* __new__ applied them, and warned of a clamped tick, unless
               it left the arguments to this __init__ */
            r = clamped && hwtimer_init_takes_arguments(Py_TYPE(self)) ? warn_clamped() : 0;
        } else if (refuse_if_started(self) == 0 && !(clamped && warn_clamped() < 0) &&
                   /* the warning ran Python code, which may have started it */
                   refuse_if_started(self) == 0) {
            r = apply_settings(self, cfg, name, ex);
        }
    }
    Py_XDECREF(tick);
    Py_XDECREF(ticks);
    Py_XDECREF(max_pending);
    Py_DECREF(name);
    Py_DECREF(executor);
    return r;
}

/* ---- methods ---- */

/* Returns 0 if `obj` is callable, or -1 with TypeError naming it `what`. */
static inline int require_callable(PyObject *obj, const char *what)
{
    if (HWT_CALLABLE(obj))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s must be callable, not %.200s", what,
                 hwtimer_type_name(Py_TYPE(obj)));
    return -1;
}

/* 1 if the type of `self` has a method `name` of its own (a subclass's
   override), 0 if it has the built-in one, -1 with an error. */
static int has_own_method(TimerObject *self, const char *name)
{
    hwtimer_state *st = self->module_state;
    PyTypeObject *tp = Py_TYPE(self);
    if (tp == st->timer_type || tp == st->manual_type)
        return 0;
    PyObject *own = PyObject_GetAttrString((PyObject *)tp, name);
    if (!own)
        return -1;
    PyObject *builtin = PyObject_GetAttrString((PyObject *)st->timer_type, name);
    int r = builtin ? own != builtin : -1;
    Py_DECREF(own);
    Py_XDECREF(builtin);
    return r;
}

/* The start() overrides this thread is in, innermost first: what one of
   them schedules on its own timer starts it with the built-in start.  Per
   thread: another thread's schedule meanwhile calls the override too, as
   its own start() would. */
struct own_start {
    TimerObject *timer;
    struct own_start *outer;
};
static _Thread_local struct own_start *own_starts;

/* The start() that scheduling calls for a timer not started: a subclass's
   override, if its type has one, as API.md says new_timeout() calls
   start().  Should the override return with the timer not started, the
   caller's built-in start follows; so does a schedule made by the override
   itself before it starts the timer.  Returns 0, or -1 with what it
   raised. */
static int call_own_start(TimerObject *self)
{
    if (hwt_timer_started(self->core))
        return 0;
    for (struct own_start *s = own_starts; s; s = s->outer)
        if (s->timer == self)
            return 0;
    int own = has_own_method(self, "start");
    if (own <= 0)
        return own;
    struct own_start in = {self, own_starts};
    own_starts = &in;
    PyObject *r = PyObject_CallMethod((PyObject *)self, "start", NULL);
    own_starts = in.outer;
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* start_if_new()'s first start, out of the scheduling's hot path. */
__attribute__((noinline)) static int start_first(TimerObject *self)
{
    if (call_own_start(self) < 0)
        return -1;
    return hwt_timer_started(self->core) ? 0 : hwtimer_timer_start(self);
}

/* The timer's start() for a timeout about to be scheduled, with its one
   check of a started timer: one started before fork() is refused by the
   schedule, in the same words (hwtimer_core_error()). */
static inline int start_if_new(TimerObject *self)
{
    return hwt_timer_started(self->core) ? 0 : start_first(self);
}

static PyObject *timer_start(TimerObject *self, PyObject *unused)
{
    (void)unused;
    if (hwtimer_timer_start(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *timer_stop(TimerObject *self, PyObject *unused)
{
    (void)unused;
    DispatchObject *d = (DispatchObject *)self->dispatcher;
    if (hwtimer_current_task_timer == self ||
        (d && hwtimer_this_thread_dispatch == d && d->pid == getpid())) {
        /* it would wait for itself: for the task, or the batch it is in */
        PyErr_SetString(PyExc_RuntimeError,
                        "stop() cannot be called from a task of the timer it would stop, nor "
                        "elsewhere on its dispatch thread");
        return NULL;
    }
    return hwtimer_timer_stop(self);
}

PyObject *hwtimer_timer_own_stop(TimerObject *self)
{
    int own = has_own_method(self, "stop");
    if (own < 0)
        return NULL;
    return own ? PyObject_CallMethod((PyObject *)self, "stop", NULL) : timer_stop(self, NULL);
}

static PyObject *timer_new_timeout(TimerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                   PyObject *kwnames)
{
    static const char *const names[] = {"task", "delay"};
    static const hwtimer_signature sig = {
        .fname = "new_timeout", .names = names, .nparams = 2, .nrequired = 2};
    PyObject *given[2];
    if (nargs == 2 && !kwnames) { /* the common call, bound without the parser */
        given[0] = args[0];
        given[1] = args[1];
    } else if (hwtimer_bind(&sig, args, nargs, kwnames, given) < 0) {
        return NULL;
    }
    PyObject *task = given[0], *delay_o = given[1];
    if (require_callable(task, "task") < 0)
        return NULL;
    int64_t delay;
    if (hwtimer_parse_delay(self->module_state, delay_o, "delay", &delay) < 0 ||
        start_if_new(self) < 0)
        return NULL;
    PyObject *to = hwtimer_timeout_new(self, self->module_state->timeout_type,
                                       hwt_timer_default_sink(self->core), task);
    if (!to)
        return NULL;
    if (hwtimer_timeout_submit(self, to, delay, NULL, HWT_MISSED_SKIP) < 0) {
        Py_DECREF(to);
        return NULL;
    }
    hwtimer_track_if_manual(self, to);
    return to;
}

/* How far (HWT_FRAC_ONE-ths of a ns, below HWT_FRAC_ONE) `ns`, which a
   float of seconds `obj` was read as (rounded up), lies after the exact ns
   it says; 0 for any other number, which is read exactly. */
static uint32_t ns_rounded_up_by(PyObject *obj, int64_t ns)
{
    if (!PyFloat_CheckExact(obj) || ns <= 0 || ns == HWT_NEVER)
        return 0;
    double exact = PyFloat_AS_DOUBLE(obj) * 1e9;
    if (!((double)ns > exact))
        return 0;
    double up = nearbyint(((double)ns - exact) * HWT_FRAC_ONE);
    return up >= HWT_FRAC_ONE ? HWT_FRAC_ONE - 1 : (uint32_t)up;
}

/* Reads new_periodic()'s and call_every()'s period, delay (NULL or None:
   the period) and missed (NULL: "skip").  Returns 0 or -1. */
static int parse_periodic(hwtimer_state *st, PyObject *period_o, PyObject *delay_o,
                          PyObject *missed_o, hwtimer_period *period, int64_t *delay, int *missed)
{
    static const char *const policies[] = {"skip", "delay", "burst"};
    int64_t ns;
    if (hwtimer_parse_delay(st, period_o, "period", &ns) < 0)
        return -1;
    if (ns <= 0)
        return hwtimer_value_error("period must be > 0", period_o);
    /* a period that is no whole ns (1 / 60 s) is kept to 2**-30 ns, so
       that its grid does not drift by what rounding it up would add */
    uint32_t up = ns > 1 ? ns_rounded_up_by(period_o, ns) : 0;
    *period = (hwtimer_period){.ns = up ? ns - 1 : ns,
                               .frac = up ? HWT_FRAC_ONE - up : 0,
                               .behind = up};
    *delay = ns;
    if (delay_o && delay_o != Py_None) {
        if (hwtimer_parse_delay(st, delay_o, "delay", delay) < 0)
            return -1;
        period->behind = ns_rounded_up_by(delay_o, *delay);
    }
    *missed = HWT_MISSED_SKIP;
    if (!missed_o)
        return 0;
    for (int i = 0; i < 3; i++) {
        if (PyUnicode_Check(missed_o) &&
            PyUnicode_CompareWithASCIIString(missed_o, policies[i]) == 0) {
            *missed = i; /* HWT_MISSED_SKIP, _DELAY, _BURST in this order */
            return 0;
        }
    }
    return hwtimer_value_error("missed must be 'skip', 'delay' or 'burst'", missed_o);
}

static PyObject *timer_new_periodic(TimerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    static const char *const names[] = {"task", "period", "delay", "missed"};
    static const hwtimer_signature sig = {
        .fname = "new_periodic", .names = names, .nparams = 4, .nkeyword_only = 2, .nrequired = 2};
    PyObject *given[4];
    if (hwtimer_bind(&sig, args, nargs, kwnames, given) < 0)
        return NULL;
    PyObject *task = given[0], *period_o = given[1], *delay_o = given[2], *missed_o = given[3];
    if (require_callable(task, "task") < 0)
        return NULL;
    hwtimer_period period;
    int64_t delay;
    int missed;
    if (parse_periodic(self->module_state, period_o, delay_o, missed_o, &period, &delay, &missed) <
            0 ||
        start_if_new(self) < 0)
        return NULL;
    PyObject *to = hwtimer_timeout_new(self, self->module_state->periodic_type,
                                       hwt_timer_default_sink(self->core), task);
    if (to && hwtimer_timeout_submit(self, to, delay, &period, missed) < 0)
        Py_CLEAR(to);
    if (to)
        hwtimer_track_if_manual(self, to);
    return to;
}

LoopSinkObject *hwtimer_loop_prepare(TimerObject *self, PyObject *loop)
{
    /* A timer not yet started has no sink: a loop it could not post to is
       refused before the start, as hwtimer_loop_sink_for() refuses it. */
    if ((!hwt_timer_started(self->core) && hwtimer_loop_check(loop) < 0) ||
        call_own_start(self) < 0 || hwtimer_timer_start(self) < 0)
        return NULL;
    return hwtimer_loop_sink_for(self, loop);
}

PyObject *hwtimer_call_later(TimerObject *self, int64_t delay, PyObject *callback, PyObject *args,
                             PyObject *loop, PyObject *context)
{
    return hwtimer_call_every(self, delay, NULL, HWT_MISSED_SKIP, callback, args, loop, context);
}

PyObject *hwtimer_call_every(TimerObject *self, int64_t delay, const hwtimer_period *period,
                             int missed, PyObject *callback, PyObject *args, PyObject *loop,
                             PyObject *context)
{
    LoopSinkObject *sink = hwtimer_loop_prepare(self, loop);
    if (!sink)
        return NULL;
    /* Making the timeout releases what the worker handed back, which runs
       Python: that can close the loop and its sink, hence our reference. */
    LoopTimeoutObject *to = (LoopTimeoutObject *)hwtimer_timeout_new(
        self, self->module_state->loop_timeout_type, &sink->sink, callback);
    if (to && sink->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Event loop is closed");
        Py_CLEAR(to);
    }
    if (!to) {
        Py_DECREF(sink);
        return NULL;
    }
    to->sink = sink; /* our reference moves there */
    Py_INCREF(args);
    to->args = args;
    to->context = context ? (Py_INCREF(context), context) : HWT_COPY_CONTEXT(self->module_state);
    /* tracked before it is scheduled: a failed submit's dealloc untracks it */
    hwtimer_loop_sink_track(to);
    if (!to->context ||
        hwtimer_timeout_submit(self, (PyObject *)to, delay, period, missed) < 0) {
        Py_DECREF(to);
        return NULL;
    }
    hwtimer_track_if_manual(self, (PyObject *)to);
    return (PyObject *)to;
}

/* Refuses a closed `loop` as asyncio does: the sink of a loop the timer
   has delivered to would take the callback and never run it.  Returns 0,
   or -1 with RuntimeError (TypeError for what is no loop). */
static int refuse_closed_loop(PyObject *loop)
{
    PyObject *method = PyObject_GetAttrString(loop, "is_closed");
    if (!method && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "loop must be an asyncio event loop or None, not %.200s",
                     hwtimer_type_name(Py_TYPE(loop)));
        return -1;
    }
    PyObject *closed = method ? PyObject_CallNoArgs(method) : NULL;
    Py_XDECREF(method);
    int is_closed = closed ? PyObject_IsTrue(closed) : -1;
    Py_XDECREF(closed);
    if (is_closed > 0)
        PyErr_SetString(PyExc_RuntimeError, "Event loop is closed");
    return is_closed ? -1 : 0;
}

/* call_later()'s and call_every()'s parameters: the delay or period and
   the callback only by position, *args, then keywords only. */
static const char *const later_names[] = {"delay", "callback", "loop", "context"};
static const char *const every_names[] = {"period",  "callback", "loop",
                                          "context", "delay",    "missed"};
static const hwtimer_signature call_later_sig = {.fname = "call_later",
                                                 .names = later_names,
                                                 .nparams = 4,
                                                 .npositional_only = 2,
                                                 .nkeyword_only = 2,
                                                 .nrequired = 2,
                                                 .varargs = true};
static const hwtimer_signature call_every_sig = {.fname = "call_every",
                                                 .names = every_names,
                                                 .nparams = 6,
                                                 .npositional_only = 2,
                                                 .nkeyword_only = 4,
                                                 .nrequired = 2,
                                                 .varargs = true};

/* call_later(delay, callback, *args, loop=, context=) and
   call_every(period, callback, *args, loop=, context=, delay=, missed=). */
static PyObject *loop_call(TimerObject *self, bool periodic, PyObject *const *args,
                           Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *given[6] = {NULL}; /* delay or period, callback, loop, context, delay, missed */
    if (hwtimer_bind(periodic ? &call_every_sig : &call_later_sig, args, nargs, kwnames, given) < 0)
        return NULL;
    PyObject *loop = given[2], *context = given[3];
    int64_t delay;
    hwtimer_period period = {0};
    int missed = HWT_MISSED_SKIP;
    if (periodic ? parse_periodic(self->module_state, given[0], given[4], given[5], &period, &delay,
                                  &missed)
                 : hwtimer_parse_delay(self->module_state, given[0], "delay", &delay))
        return NULL;
    PyObject *callback = given[1];
    if (require_callable(callback, "callback") < 0)
        return NULL;
    if (context && context != Py_None && !HWT_IS_CONTEXT(self->module_state, context)) {
        PyErr_Format(PyExc_TypeError, "context must be a contextvars.Context, not %.200s",
                     hwtimer_type_name(Py_TYPE(context)));
        return NULL;
    }
    PyObject *owned_loop = NULL;
    if (!loop || loop == Py_None) {
        loop = owned_loop =
            hwtimer_running_loop(self->module_state, "no running event loop: pass loop=");
        if (!loop)
            return NULL;
    } else if (refuse_closed_loop(loop) < 0) {
        return NULL;
    }
    PyObject *cb_args = PyTuple_New(nargs - 2);
    if (!cb_args) {
        Py_XDECREF(owned_loop);
        return NULL;
    }
    for (Py_ssize_t i = 2; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(cb_args, i - 2, args[i]);
    }
    PyObject *result = hwtimer_call_every(self, delay, periodic ? &period : NULL, missed, callback,
                                          cb_args, loop,
                                          context == Py_None ? NULL : context);
    Py_DECREF(cb_args);
    Py_XDECREF(owned_loop);
    return result;
}

static PyObject *timer_call_later(TimerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    return loop_call(self, false, args, nargs, kwnames);
}

static PyObject *timer_call_every(TimerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    return loop_call(self, true, args, nargs, kwnames);
}

/* _call_later_on_stop(on_stop, delay, callback, *args): call_later() on
   the running loop, for hwtimer.sleep(), whose deadline must outlive the
   timer's stop(): on_stop(remaining) is called in the loop's thread if
   stop() cancels the timeout before it is due (LoopTimeoutObject).  Set
   before anything else runs, so that no stop() can come in between. */
static PyObject *timer_call_later_on_stop(TimerObject *self, PyObject *const *args,
                                          Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1 || kwnames) {
        PyErr_SetString(PyExc_TypeError,
                        "_call_later_on_stop() takes on_stop, delay, callback, *args");
        return NULL;
    }
    PyObject *on_stop = args[0];
    if (require_callable(on_stop, "on_stop") < 0)
        return NULL;
    PyObject *to = loop_call(self, false, args + 1, nargs - 1, NULL);
    if (to) {
        Py_INCREF(on_stop);
        ((LoopTimeoutObject *)to)->on_stop = on_stop;
        ((LoopTimeoutObject *)to)->grid.owned = 1;
    }
    return to;
}

static PyObject *timer_pending_timeouts(TimerObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLongLong(hwt_timer_pending(self->core));
}

/* pending_snapshot(limit=100): the argument here, the walk in monitor.c. */
static PyObject *timer_pending_snapshot(TimerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                        PyObject *kwnames)
{
    static const char *const names[] = {"limit"};
    static const hwtimer_signature sig = {
        .fname = "pending_snapshot", .names = names, .nparams = 1};
    PyObject *limit_o;
    if (hwtimer_bind(&sig, args, nargs, kwnames, &limit_o) < 0)
        return NULL;
    long long limit = 100;
    if (limit_o && hwtimer_parse_int(limit_o, "limit", &limit) < 0)
        return NULL;
    if (limit < 0) {
        hwtimer_value_error("limit must be >= 0", limit_o);
        return NULL;
    }
    /* a limit past what memory can hold is no limit: the walk stops at the
       pending count */
    return hwtimer_pending_snapshot(self, (unsigned long long)limit > SIZE_MAX ? SIZE_MAX
                                                                               : (size_t)limit);
}

static PyObject *timer_enter(TimerObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *timer_exit(TimerObject *self, PyObject *args)
{
    /* called with anything but what the with statement gives, it is not
       the with statement calling: refused before the timer stops for good */
    PyObject *exc_type, *exc, *tb;
    if (!PyArg_UnpackTuple(args, "__exit__", 3, 3, &exc_type, &exc, &tb))
        return NULL;
    PyObject *r = hwtimer_timer_own_stop(self);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

/* __reduce__(): a timer is its process's threads and wheel, which no
   copy or pickle can carry: refused at every protocol with the words
   protocols 2 and up use.  Without it, protocols 0 and 1 (copyreg) call
   the nearest built-in base with the timer of a subclass (ManualTimer, a
   user's) for tick_duration, and say that that is not a number. */
static PyObject *timer_reduce(TimerObject *self, PyObject *unused)
{
    (void)unused;
    PyErr_Format(PyExc_TypeError, "cannot pickle '%.200s' object",
                 hwtimer_type_name(Py_TYPE(self)));
    return NULL;
}

static PyObject *timer_repr(TimerObject *self)
{
    /* a timer started before fork() has no worker in the child */
    const char *lifecycle = hwt_timer_stopped(self->core)    ? "stopped"
                            : hwt_timer_orphaned(self->core) ? "started before fork()"
                            : hwt_timer_started(self->core)  ? "started"
                                                             : "not started";
    char *tick = PyOS_double_to_string(self->tick_duration, 'r', 0, 0, NULL);
    if (!tick)
        return NULL;
    /* its class's name, as a Python object's repr() has it: a subclass's
       own (ManualTimer's too); a type of this module's tp_name begins with
       the module's */
    const char *cls = hwtimer_type_name(Py_TYPE(self));
    const char *dot = strrchr(cls, '.');
    PyObject *r = PyUnicode_FromFormat(
        "<%s %R %s, tick_duration=%s, ticks_per_wheel=%u, pending=%lld>",
        dot ? dot + 1 : cls, self->name, lifecycle, tick,
        hwt_timer_config(self->core)->ticks_per_wheel, (long long)hwt_timer_pending(self->core));
    PyMem_Free(tick);
    return r;
}

static PyObject *timer_get_tick_duration(TimerObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(self->tick_duration);
}

static PyObject *timer_get_ticks_per_wheel(TimerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLong(hwt_timer_config(self->core)->ticks_per_wheel);
}

static PyObject *timer_get_max_pending(TimerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLongLong(self->max_pending);
}

static PyObject *timer_get_thread_name(TimerObject *self, void *closure)
{
    (void)closure;
    Py_INCREF(self->name);
    return self->name;
}

/* ---- GC, finalisation, deallocation ---- */

typedef struct {
    visitproc visit;
    void *arg;
} held_visit;

static int visit_held(void *ctx, hwt_timeout *node)
{
    held_visit *v = ctx;
    return v->visit((PyObject *)TIMEOUT_OF(node), v->arg);
}

static int timer_traverse(TimerObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->executor);
    /* not loop_sinks: it holds weak references only, which a collection
       of the timer must find uncleared, to close the sinks they refer to */
    Py_VISIT(self->stopped_periodic);
    Py_VISIT(self->submitted);
    /* A manual timer's wheel holds its pending timeouts for good once
       nothing can advance it: with each of them holding the timer, the
       cycle is shown, and a timer dropped with timeouts pending is
       collected (its finalizer stops it).  A real timer's are not: its
       worker changes the wheel meanwhile, and runs them. */
    if (self->manual && self->core) {
        held_visit v = {visit, arg};
        int r = hwt_timer_visit_held(self->core, visit_held, &v);
        if (r)
            return r;
    }
    return hwtimer_handed_out_traverse(self, visit, arg);
}

/* Closes the loop sinks, which point back at this timer without a
   reference: before it goes, whether its last reference goes or the
   cyclic GC clears it.  Closing them asks their loops is_closed(), whose
   errors are written as unraisable: the exception being raised, if any,
   is kept.  A dealloc may run while one is: on 3.9 a coroutine's locals
   go after its return value was set as StopIteration. */
static void close_loop_sinks(TimerObject *self)
{
    if (!self->loop_sinks)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    hwtimer_loop_sinks_close(self->loop_sinks);
    PyErr_Restore(type, value, tb);
    Py_CLEAR(self->loop_sinks);
}

/* A running timer that is garbage: warns (from `source`, or none) and
   stops it.  Without a source (its dealloc, a collection's clear) the
   timer is being torn down: the warning shows the built-in repr(), as a
   subclass's own __repr__ would be handed it, and could keep it, to be
   freed or cleared under that reference. */
static void stop_unstopped(TimerObject *self, PyObject *source)
{
    if (!self->running)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int warned;
    if (source) {
        warned = PyErr_ResourceWarning(source, 1, "unstopped timer %R", self);
    } else {
        PyObject *shown = timer_repr(self);
        warned = shown ? PyErr_ResourceWarning(NULL, 1, "unstopped timer %U", shown) : -1;
        Py_XDECREF(shown);
    }
    if (warned < 0)
        PyErr_WriteUnraisable(source);
    PyObject *r = hwtimer_timer_stop(self);
    if (!r)
        PyErr_WriteUnraisable(source);
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

static int timer_clear(TimerObject *self)
{
    /* Still running: a subclass's __del__ that does not call the base's
       takes the place of timer_finalize(), so a collection clears the
       timer running.  It stops first, as its dealloc would: its stop()
       needs what goes below (the loop sinks, the executor).  The warning
       has no source, which would keep the cleared object alive. */
    stop_unstopped(self, NULL);
    Py_CLEAR(self->executor);
    close_loop_sinks(self);
    Py_CLEAR(self->stopped_periodic);
    Py_CLEAR(self->submitted);
    hwtimer_handed_out_clear(self);
    return 0;
}

static void timer_finalize(TimerObject *self)
{
    stop_unstopped(self, (PyObject *)self);
}

static void timer_dealloc(TimerObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
#ifndef Py_LIMITED_API
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0)
        return; /* resurrected */
#endif
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    /* Still running: the limited API has no
       PyObject_CallFinalizerFromDealloc(), and a subclass's __del__ takes
       the place of timer_finalize() (it need not call the base's).  It
       stops here, as the finalizer would have: nothing may reach the
       object now, so the warning has no source, and no weak reference
       gives it out while stop() waits with the GIL released.  Yet the
       atexit hook (stop_all()) finds it in running_timers until the stop
       takes it out, and the warning runs Python code before that: the
       object holds a reference of its own meanwhile, as a finalizer
       called from a dealloc does, so that the hook's reference, taken and
       dropped, does not deallocate it a second time. */
    Py_SET_REFCNT(self, 1);
    self->dying = true;
    stop_unstopped(self, NULL);
    Py_SET_REFCNT(self, 0);
    running_remove(self);
    hwtimer_timer_unlist_stopping(self);
    timer_clear(self);
    Py_CLEAR(self->dispatcher);
    Py_CLEAR(self->name);
    if (self->core)
        hwt_timer_decref(self->core);
    if (self->manual)
        pthread_mutex_destroy(&self->advance_lock);
    HWT_TP_FREE(tp)(self);
    Py_DECREF(tp);
}

static PyMethodDef timer_methods[] = {
    {"start", (PyCFunction)timer_start, METH_NOARGS,
     "start($self, /)\n--\n\nStarts the worker thread; a no-op once started.  new_timeout() calls "
     "it."},
    {"stop", (PyCFunction)timer_stop, METH_NOARGS,
     "stop($self, /)\n--\n\nStops the timer and returns the timeouts that had neither expired "
     "nor been cancelled, each now cancelled."},
    {"new_timeout", (PyCFunction)(void (*)(void))timer_new_timeout, METH_FASTCALL | METH_KEYWORDS,
     "new_timeout($self, /, task, delay)\n--\n\nCalls task(timeout) once, after delay seconds."},
    {"call_later", (PyCFunction)(void (*)(void))timer_call_later, METH_FASTCALL | METH_KEYWORDS,
     "call_later($self, delay, callback, /, *args, loop=None, context=None)\n--\n\nRuns "
     "callback(*args) in the thread of an asyncio event loop after delay seconds."},
    {"_call_later_on_stop", (PyCFunction)(void (*)(void))timer_call_later_on_stop,
     METH_FASTCALL | METH_KEYWORDS,
     "_call_later_on_stop($self, on_stop, delay, callback, /, *args)\n--\n\ncall_later() on the "
     "running loop; on_stop(remaining) runs there if stop() cancels it before it is due."},
    {"new_periodic", (PyCFunction)(void (*)(void))timer_new_periodic, METH_FASTCALL | METH_KEYWORDS,
     "new_periodic($self, /, task, period, *, delay=None, missed='skip')\n--\n\nCalls "
     "task(timeout) at start + delay + k * period, k = 0, 1, ..., until cancelled; missed runs "
     "are skipped, delayed or run in a burst."},
    {"call_every", (PyCFunction)(void (*)(void))timer_call_every, METH_FASTCALL | METH_KEYWORDS,
     "call_every($self, period, callback, /, *args, loop=None, context=None, delay=None, "
     "missed='skip')\n--\n\nRuns callback(*args) every period seconds in the thread of an "
     "asyncio event loop."},
    {"pending_timeouts", (PyCFunction)timer_pending_timeouts, METH_NOARGS,
     "pending_timeouts($self, /)\n--\n\nTimeouts neither expired nor cancelled."},
    {"stats", (PyCFunction)hwtimer_timer_stats, METH_NOARGS,
     "stats($self, /)\n--\n\nCounters, lateness, and how pending timeouts spread over the "
     "wheel."},
    {"pending_snapshot", (PyCFunction)(void (*)(void))timer_pending_snapshot,
     METH_FASTCALL | METH_KEYWORDS,
     "pending_snapshot($self, /, limit=100)\n--\n\nThe limit soonest pending timeouts, in "
     "deadline order."},
    {"__enter__", (PyCFunction)timer_enter, METH_NOARGS, "__enter__($self, /)\n--\n\n"},
    {"__reduce__", (PyCFunction)timer_reduce, METH_NOARGS,
     "__reduce__($self, /)\n--\n\nRefused: a timer cannot be pickled or copied."},
    {"__exit__", (PyCFunction)timer_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc, tb, /)\n--\n\nStops the timer."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef timer_getset[] = {
    {"tick_duration", (getter)timer_get_tick_duration, NULL, "Seconds per tick.", NULL},
    {"ticks_per_wheel", (getter)timer_get_ticks_per_wheel, NULL, "Buckets in the wheel.", NULL},
    {"max_pending_timeouts", (getter)timer_get_max_pending, NULL, "0: no limit.", NULL},
    {"thread_name", (getter)timer_get_thread_name, NULL, "The worker thread's name.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef timer_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(TimerObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot timer_slots[] = {
    {Py_tp_doc, "HashedWheelTimer(tick_duration=0.1, ticks_per_wheel=512, *, "
                "max_pending_timeouts=0, thread_name=None, executor=None)\n--\n\n"
                "Netty's hashed wheel timer: O(1) schedule and cancel from any thread."},
    {Py_tp_new, timer_new},
    {Py_tp_init, timer_init},
    {Py_tp_dealloc, timer_dealloc},
    {Py_tp_finalize, timer_finalize},
    {Py_tp_traverse, timer_traverse},
    {Py_tp_clear, timer_clear},
    {Py_tp_repr, timer_repr},
    {Py_tp_methods, timer_methods},
    {Py_tp_getset, timer_getset},
    {Py_tp_members, timer_members},
    {0, NULL},
};

PyType_Spec hwtimer_timer_spec = {
    .name = "hwtimer.HashedWheelTimer",
    .basicsize = sizeof(TimerObject),
    /* a base type for hwtimer.testing.ManualTimer */
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .slots = timer_slots,
};
