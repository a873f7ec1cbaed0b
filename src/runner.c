/*
 * runner.c: the one task runner: how every consumer (the dispatch
 * thread, an executor, a loop) runs an expired timeout, records its
 * lateness and run time, reports its failure, and re-arms a periodic one.
 */
#include "binding.h"

/* Calls a new_timeout() or new_periodic() task, with `current` (this
   thread's hwtimer_current_task_timer) naming its timer meanwhile.
   Returns 0, or -1 with the exception it raised. */
static inline int call_task(TimerObject *timer, TimeoutObject *to, TimerObject **current)
{
    TimerObject *outer = *current;
    *current = timer;
    PyObject *r = PyObject_CallOneArg(to->task, (PyObject *)to);
    *current = outer;
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* Calls the task once: task(timeout), or a call_later callback in its
   context.  Returns 0, or -1 with the exception it raised. */
static int call_once(TimerObject *timer, TimeoutObject *to)
{
    if (Py_TYPE(to) == timer->module_state->loop_timeout_type)
        return hwtimer_loop_call((LoopTimeoutObject *)to);
    return call_task(timer, to, &hwtimer_current_task_timer);
}

/* `to` as a new_periodic() Timeout, or NULL for any other kind. */
static PeriodicTimeoutObject *as_periodic(TimerObject *timer, TimeoutObject *to)
{
    return Py_TYPE(to) == timer->module_state->periodic_type ? (PeriodicTimeoutObject *)to : NULL;
}

/* Puts a periodic timeout about to be handed to the executor in its
   timer's handed_out list, with a reference of the list's: stop() finds
   it there, since it does not wait for the executor. */
static void hand_out(TimerObject *timer, PeriodicTimeoutObject *periodic)
{
    if (periodic->grid.handed)
        return;
    Py_INCREF(periodic);
    periodic->grid.handed = 1;
    periodic->handed_prev = NULL;
    periodic->handed_next = timer->handed_out;
    if (timer->handed_out)
        timer->handed_out->handed_prev = periodic;
    timer->handed_out = periodic;
}

/* Takes a periodic timeout out of the handed_out list, if there: its run
   on the executor is over, or will not come.  Drops the list's reference,
   never the last one (the caller holds one). */
static void hand_back(TimerObject *timer, TimeoutObject *to)
{
    PeriodicTimeoutObject *periodic = as_periodic(timer, to);
    if (!periodic || !periodic->grid.handed)
        return;
    periodic->grid.handed = 0;
    if (periodic->handed_prev)
        periodic->handed_prev->handed_next = periodic->handed_next;
    else
        timer->handed_out = periodic->handed_next;
    if (periodic->handed_next)
        periodic->handed_next->handed_prev = periodic->handed_prev;
    periodic->handed_prev = periodic->handed_next = NULL;
    Py_DECREF(periodic);
}

/* Marks a timeout about to be submitted to the executor: its run not yet
   begun, which one caller takes (take_submitted).  A periodic one has its
   `submitted` mark, and is handed out until its run ends; a one-shot,
   whose 80 bytes have no room for a mark, joins its timer's `submitted`
   set, which holds a reference to it.  Returns 0, or -1 with an
   exception set (the one-shot is not marked). */
static int mark_submitted(TimerObject *timer, TimeoutObject *to)
{
    PeriodicTimeoutObject *periodic = as_periodic(timer, to);
    if (periodic) {
        periodic->grid.submitted = 1;
        hand_out(timer, periodic);
        return 0;
    }
    if (!timer->submitted && !(timer->submitted = PySet_New(NULL)))
        return -1;
    return PySet_Add(timer->submitted, (PyObject *)to);
}

/* Takes the run of a timeout that mark_submitted() marked: 1 for the
   first caller, which runs it (or, the done-callback, ends it unrun), 0
   for any other (nobody marked it, or someone took it: the executor ran
   it, or runs it), -1 with an exception set.  A periodic one stays handed
   out: its caller hands it back. */
static int take_submitted(TimerObject *timer, TimeoutObject *to)
{
    PeriodicTimeoutObject *periodic = as_periodic(timer, to);
    if (periodic) {
        bool marked = periodic->grid.submitted;
        periodic->grid.submitted = 0;
        return marked;
    }
    if (!timer->submitted || Py_TYPE(to) != timer->module_state->timeout_type)
        return 0;
    /* drops the set's reference, not the last */
    return PySet_Discard(timer->submitted, (PyObject *)to);
}

int hwtimer_run_submitted(TimerObject *timer, TimeoutObject *to)
{
    hwtimer_batch batch = HWTIMER_BATCH_INIT;
    /* Only what the dispatch thread submitted, once: a periodic timeout
       run twice, or one still on the wheel, would be pushed onto the
       wheel again while it is there. */
    int took = take_submitted(timer, to);
    if (took <= 0) {
        if (took == 0)
            PyErr_SetString(PyExc_RuntimeError,
                            "_run_task() runs a timeout that its timer submitted to its executor, "
                            "once");
        return -1;
    }
    /* a periodic one is handed out still, until its run ends */
    hwtimer_run_timeout(timer, to, &batch);
    hand_back(timer, to);
    return 0;
}

/* _submitted(timeout, future): the done-callback of a submitted task's
   future.  _run_task reports the task's own errors, so an exception here
   means the task never ran (a process pool that cannot pickle it, a
   future cancelled at shutdown): it is counted and logged like one, and a
   periodic timeout, left running by its expiry, ends as if its task had
   raised. */
static PyObject *submitted_done(PyObject *timeout, PyObject *future)
{
    PyObject *exc = PyObject_CallMethod(future, "exception", NULL);
    if (exc == Py_None) {
        Py_DECREF(exc);
        Py_RETURN_NONE;
    }
    if (exc) { /* else exception() raised, e.g. CancelledError: log that */
        if (PyExceptionInstance_Check(exc))
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        else /* a future-like object's: PyErr_SetObject() takes exceptions only */
            PyErr_Format(PyExc_TypeError,
                         "an executor's future returned %.200s from exception(), not an "
                         "exception or None",
                         hwtimer_type_name(Py_TYPE(exc)));
        Py_DECREF(exc);
    }
    TimeoutObject *to = (TimeoutObject *)timeout;
    TimerObject *timer = TIMER_OF(to);
    hwtimer_log_task_error(timer->module_state, timeout);
    /* its run, not taken, will not come: a one-shot leaves the set */
    int took = take_submitted(timer, to);
    if (took < 0)
        return NULL;
    if (took && as_periodic(timer, to)) {
        hand_back(timer, to);
        hwt_timeout_finish(&to->node, HWT_EXPIRED); /* or cancelled meanwhile */
    }
    Py_RETURN_NONE;
}

static PyMethodDef submitted_def = {"_submitted", submitted_done, METH_O, NULL};

/* Watches the future `fut` that the executor returned for `to`, so that a
   task that fails to run there does not vanish.  An executor whose
   submit() returns no future cannot be watched. */
static void watch_future(TimeoutObject *to, PyObject *fut)
{
    PyObject *add = PyObject_GetAttrString(fut, "add_done_callback");
    PyObject *callback = add ? PyCFunction_New(&submitted_def, (PyObject *)to) : NULL;
    PyObject *r = callback ? PyObject_CallOneArg(add, callback) : NULL;
    if (!r) {
        if (add && callback)
            hwtimer_log_error(TIMER_OF(to)->module_state, "cannot watch an executor's future");
        PyErr_Clear();
    }
    Py_XDECREF(r);
    Py_XDECREF(callback);
    Py_XDECREF(add);
}

/* Reports the exception a task raised: logged, or handed to a loop's
   exception handler.  Returns -1, leaving it set, for a KeyboardInterrupt
   or SystemExit out of a call_later callback (they stop the loop, as in
   asyncio); else 0. */
static int report_failure(TimerObject *timer, TimeoutObject *to)
{
    if (Py_TYPE(to) == timer->module_state->loop_timeout_type)
        return hwtimer_loop_report((LoopTimeoutObject *)to);
    hwtimer_log_task_error(timer->module_state, (PyObject *)to);
    return 0;
}

/* A periodic timeout that stop() did not see (it was in its run): now
   cancelled, it joins the list stop() returns, if stop() has not returned
   yet (it waits for the dispatch thread; an executor's runs may end
   later). */
static void keep_for_stop(TimerObject *timer, TimeoutObject *to)
{
    if (timer->stop_collected)
        return;
    if (!timer->stopped_periodic) {
        /* A collection in PyList_New() can run a finalizer that releases
           the GIL: a run that ends meanwhile makes the list (kept, not
           replaced), or stop() returns it. */
        PyObject *made = PyList_New(0);
        if (!made)
            PyErr_Clear(); /* it stays cancelled, only unlisted */
        if (timer->stopped_periodic || timer->stop_collected)
            Py_XDECREF(made);
        else
            timer->stopped_periodic = made;
        if (!timer->stopped_periodic || timer->stop_collected)
            return;
    }
    if (PyList_Append(timer->stopped_periodic, (PyObject *)to) < 0)
        PyErr_Clear();
}

/* Puts a delivered periodic timeout back on the wheel at the deadline it
   has (see hwt_timeout_requeue), without a run. */
static void requeue(TimerObject *timer, TimeoutObject *to)
{
    Py_INCREF(to); /* the wheel's reference */
    int r = hwt_timeout_requeue(&to->node);
    if (r == HWT_OK)
        return;
    Py_DECREF(to); /* not the last: the caller holds one */
    if (r == HWT_ESTOPPED)
        keep_for_stop(timer, to);
}

/* Whether a periodic timeout whose next run fell due during its run must
   let other due work run first: the rest of its batch, what its sink has
   been handed since, or, for a call_every() callback, the loop's own work,
   which this cannot see.  Back to back, a task slower than its period
   would keep the thread for good. */
static bool others_wait(TimerObject *timer, TimeoutObject *to, const hwtimer_batch *batch)
{
    hwt_sink *sink = to->node.sink;
    return !batch->last || sink != hwt_timer_default_sink(timer->core) || hwt_sink_has_work(sink);
}

void hwtimer_stop_delivered(TimeoutObject *to, PyObject *list)
{
    /* cancelled here, it does not run again: a run not yet begun is
       skipped, and the re-arm after one in progress ends it */
    if (hwt_timeout_cancel(&to->node) != HWT_OK)
        return; /* ended already, and listed by keep_for_stop() if by stop() */
    if (list && PyList_Append(list, (PyObject *)to) < 0)
        PyErr_Clear(); /* it stays cancelled, only unlisted */
}

void hwtimer_stop_handed_out(TimerObject *timer, PyObject *list)
{
    for (PeriodicTimeoutObject *p = timer->handed_out; p; p = p->handed_next)
        hwtimer_stop_delivered(&p->base, list);
}

int hwtimer_handed_out_traverse(TimerObject *timer, visitproc visit, void *arg)
{
    for (PeriodicTimeoutObject *p = timer->handed_out; p; p = p->handed_next)
        Py_VISIT(p);
    return 0;
}

void hwtimer_stop_unrun(TimerObject *timer, hwt_timeout *node, bool chain)
{
    hwt_sink *default_sink = hwt_timer_default_sink(timer->core);
    for (; node; node = chain ? hwt_timeout_of(node->link.next) : NULL) {
        /* a cancel that fails: ended, or re-armed and returned by stop() */
        if (node->sink == default_sink && hwt_timeout_periodic(node) &&
            hwt_timeout_cancel(node) == HWT_OK)
            keep_for_stop(timer, TIMEOUT_OF(node));
    }
}

void hwtimer_handed_out_clear(TimerObject *timer)
{
    while (timer->handed_out) {
        PeriodicTimeoutObject *p = timer->handed_out;
        Py_INCREF(p); /* hand_back() never drops the last reference */
        hand_back(timer, &p->base);
        Py_DECREF(p);
    }
}

/* Puts a periodic timeout back after a run from `start` to `end`.
   Returns true when its next run is due now and may start. */
static bool rearm(TimerObject *timer, TimeoutObject *to, int64_t start, int64_t end)
{
    for (;;) {
        Py_INCREF(to); /* the wheel's reference, if it goes back */
        hwtimer_grid *grid = hwtimer_timeout_grid(to);
        uint32_t behind = grid->behind;
        int r = hwt_timeout_rearm_exact(&to->node, grid->period, grid->frac, &behind, start, end,
                                        grid->catch_up);
        /* written with the GIL still held: no other re-arm of it is under
           way, nor begins before these are */
        grid->behind = behind;
        grid->catch_up = r == HWT_EAGAIN; /* its next run is that one, wherever it runs */
        if (r == HWT_OK)
            return false;
        Py_DECREF(to); /* not the last: the caller holds one */
        if (r == HWT_ESTOPPED)
            keep_for_stop(timer, to);
        if (r != HWT_EAGAIN)
            return false;
        uint32_t s = atomic_load(&to->node.state);
        bool stopped = hwt_timer_stopped(timer->core);
        if (s == HWT_RUNNING && !stopped)
            return true;
        if (s == HWT_RUNNING_RESET && !stopped)
            continue; /* a reset since: onto the wheel at its deadline */
        hwt_timeout_finish(&to->node, HWT_CANCELLED);
        if (s != HWT_CANCELLED)
            keep_for_stop(timer, to); /* stop() began */
        return false;
    }
}

/* Expired timeouts run one after another on one thread: each task begins
   when the one before it ends, so the clock read at one's end is the next
   one's start.  A batch reads it around each of its first TIMED_FIRST
   tasks, then around one in TIMED_EVERY, its last, and every periodic one
   (whose re-arm needs both ends); the others run untimed, counted by
   stats()'s untimed_tasks, so that a burst of short tasks does not pay a
   clock read each. */
#define TIMED_FIRST 64
#define TIMED_EVERY 64

/* Whether `batch` reads the clock around its next task, `node`'s. */
static bool times_next(const hwtimer_batch *batch, hwt_timeout *node)
{
    return batch->ran < TIMED_FIRST || batch->ran % TIMED_EVERY == 0 ||
           batch->last || hwt_timeout_periodic(node);
}

/* Runs an untimed task: its end is not read, so neither is the next one's
   start.  `current` is this thread's task slot, from a caller that looked
   it up once for a whole batch of new_timeout() and new_periodic() tasks;
   NULL for any other caller, and any kind of task. */
static inline int run_untimed(TimerObject *timer, TimeoutObject *to, hwtimer_batch *batch,
                              TimerObject **current)
{
    batch->now = HWTIMER_UNREAD;
    hwt_timer_record_untimed(timer->core);
    int failed = current ? call_task(timer, to, current) : call_once(timer, to);
    return failed < 0 ? report_failure(timer, to) : 0;
}

int hwtimer_run_timeout(TimerObject *timer, TimeoutObject *to, hwtimer_batch *batch)
{
    hwt_timeout *node = &to->node;
    if (hwt_timeout_periodic(node)) {
        uint32_t state = atomic_load(&node->state);
        if (state == HWT_CANCELLED) {
            hwt_timeout_finish(node, HWT_CANCELLED); /* cancelled since it was delivered */
            return 0;
        }
        if (state == HWT_RUNNING_RESET) {
            requeue(timer, to); /* reset since: this run moves to the new deadline */
            return 0;
        }
    } else if (node->sink->ends_once) {
        /* a call_later() callback: from here on, cancel() finds it expired */
        uint32_t state = hwt_timeout_begin(node);
        if (state == HWT_CANCELLED)
            return 0; /* cancelled since it was handed over: counted, not run */
        if (state == HWT_RUNNING_RESET) {
            requeue(timer, to); /* reset since: it waits for its new deadline */
            return 0;
        }
    }
    bool timed = times_next(batch, node);
    batch->ran++;
    if (!timed)
        return run_untimed(timer, to, batch, NULL);
    int64_t origin = hwt_timer_start_time(timer->core);
    if (batch->now == HWTIMER_UNREAD)
        batch->now = hwtimer_clock_ns(timer);
    const int64_t began = batch->now; /* catch-up runs due by then run here */
    for (;;) {
        /* With the GIL held from the state's check above (or in rearm())
           to the call, no cancel() can return True in between: no run
           starts after it. */
        int64_t start = batch->now, deadline = origin + hwt_timeout_deadline(node);
        int failed = call_once(timer, to);
        int64_t end = batch->now = hwtimer_clock_ns(timer);
        batch->periodic_ran += hwt_timeout_periodic(node);
        hwt_timer_record_task(timer->core, start - deadline, end - start);
        int r = 0;
        if (failed) {
            r = report_failure(timer, to);
            /* the report ran Python code (logging handlers, a loop's
               exception handler): the next task begins after it */
            batch->now = HWTIMER_UNREAD;
        }
        if (!hwt_timeout_periodic(node))
            return r;
        if (failed) {
            /* an exception ends it, as expired; but a run that stop()
               began during ends as stop() ends one that returns (rearm()
               finds the timer stopped): cancelled, and in stop()'s list */
            if (hwt_timer_stopped(timer->core) &&
                atomic_load(&node->state) != HWT_CANCELLED) {
                hwt_timeout_finish(node, HWT_CANCELLED);
                keep_for_stop(timer, to);
            } else {
                hwt_timeout_finish(node, HWT_EXPIRED);
            }
            return r;
        }
        if (!rearm(timer, to, start, end))
            return 0;
        /* The next run is due already: it begins here if it was due when
           the first of these runs began, or if no other work waits. */
        if (origin + hwt_timeout_deadline(node) > began && others_wait(timer, to, batch)) {
            requeue(timer, to);
            return 0;
        }
    }
}

void hwtimer_dispatch_timeout(TimerObject *timer, TimeoutObject *to, hwtimer_batch *batch)
{
    if (!timer->executor) {
        hwtimer_run_timeout(timer, to, batch);
        return;
    }
    /* it runs elsewhere: the next task here starts at a time not read */
    batch->now = HWTIMER_UNREAD;
    bool marked = mark_submitted(timer, to) == 0;
    PyObject *r = marked ? PyObject_CallMethod(timer->executor, "submit", "OO",
                                               timer->module_state->run_task, (PyObject *)to)
                         : NULL;
    if (r) {
        watch_future(to, r);
        Py_DECREF(r);
        return;
    }
    /* A refused task still runs exactly once: here.  Executors refuse all
       work once threading's exit hooks shut them down; other refusals are
       errors worth a log line. */
    if (hwtimer_threads_exiting(timer->module_state)) {
        PyErr_Clear();
    } else {
        hwtimer_log_task_error(timer->module_state, (PyObject *)to);
    }
    /* One that _run_task() took (the executor ran it, or runs it, before
       it raised) is not run again: a periodic one's run re-arms it, and it
       may be on the wheel already. */
    if (marked) {
        int took = take_submitted(timer, to);
        if (took <= 0) {
            if (took < 0)
                PyErr_WriteUnraisable((PyObject *)to);
            return;
        }
        hand_back(timer, to); /* it runs here, which stop() waits for */
    }
    hwtimer_run_timeout(timer, to, batch);
}

/* CPython's GC header before each object: two pointers.  Only a prefetch
   hint depends on it. */
#define GC_HEADER (2 * sizeof(void *))

/* Starts loading the Timeout two places after the one about to run, which
   the loop reaches through the links in one: a burst's Timeouts are cold,
   and a task is long enough to hide the wait for one. */
static inline void prefetch_after(hwt_timeout *next)
{
    if (next && next->link.next) {
        char *p = (char *)TIMEOUT_OF(hwt_timeout_of(next->link.next));
        /* the 80 bytes from its GC header: two lines at most */
        __builtin_prefetch(p - GC_HEADER, 1);
        __builtin_prefetch(p - GC_HEADER + 64, 1);
    }
}

uint64_t hwtimer_run_batch(hwt_sink *default_sink, hwt_timeout *node, bool parents_only,
                           hwt_timeout **held)
{
    const unsigned forks = hwtimer_forks;
    hwtimer_batch batch = HWTIMER_BATCH_INIT;
    TimerObject **current = hwtimer_current_task_slot();
    while (node) {
        hwt_timeout *next = hwt_timeout_of(node->link.next);
        prefetch_after(next);
        TimeoutObject *to = TIMEOUT_OF(node);
        if (held) {
            held[0] = node;
            held[1] = next;
        }
        /* only delivered new_timeout() and new_periodic() timeouts come
           here: cancelled ones and call_later() ones are released elsewhere */
        if (node->sink == default_sink &&
            (atomic_load(&node->state) == HWT_EXPIRED || hwt_timeout_periodic(node))) {
            TimerObject *timer = TIMER_OF(to);
            batch.last = !next;
            if (!timer->executor && !times_next(&batch, node)) {
                /* a burst's common case: hwtimer_run_timeout()'s untimed
                   run, without its calls and checks */
                batch.ran++;
                run_untimed(timer, to, &batch, current);
            } else {
                hwtimer_dispatch_timeout(timer, to, &batch);
            }
        }
        hwtimer_timeout_track_if_held(to);
        if (held)
            held[0] = NULL; /* the reference it stood for goes */
        /* the last reference frees it, and with it its task or its timer
           if it holds their last reference: those may run Python code (a
           __del__, a weakref callback), and the next task begins after.
           Freed alone, it runs none, and the read that ended this task
           still starts the next one (after an untimed task, none does). */
        if (batch.now != HWTIMER_UNREAD && Py_REFCNT(to) == 1 &&
            ((to->task && Py_REFCNT(to->task) == 1) || Py_REFCNT((PyObject *)TIMER_OF(to)) == 1))
            batch.now = HWTIMER_UNREAD;
        Py_DECREF(to); /* the wheel's reference: may free the timer too */
        node = next;
        if (parents_only && hwtimer_forks != forks) {
            /* the child of a task's fork(): the rest is the parent's to
               run.  It waits, unrun, with what waited for the dispatch
               thread, where the child's stop() finds the periodic ones
               among it, pending there too; unless a stop() in the child
               (on another thread, as the task ran) swept it already from
               held[1], which it emptied: then nothing will take it from
               the sink, and it is let go of here. */
            if (held && !held[1]) {
                hwtimer_release_chain(node);
                break;
            }
            if (held)
                held[1] = NULL;
            hwtimer_release_chain(hwt_sink_put_back(default_sink, node));
            break;
        }
    }
    return batch.periodic_ran;
}
