/*
 * timeout.c: hwtimer.Timeout, the handle new_timeout() returns, and its
 * subtype for new_periodic(), which carries the period (call_later()'s is
 * in looptimeout.c).  Also the one task runner: how every consumer (the
 * dispatch thread, an executor, a loop) runs an expired timeout and
 * re-arms a periodic one.
 */
#include "binding.h"

#include <math.h>
#include <string.h>

#define FIELDS_OFFSET offsetof(TimeoutObject, node)

/* Released Timeouts kept for reuse: a schedule+cancel pattern then
   allocates nothing, and never counts towards a young GC collection. */
#define MAX_FREE_TIMEOUTS 4096

PyObject *hwtimer_timeout_new(TimerObject *timer, PyTypeObject *tp, hwt_sink *sink, PyObject *task)
{
    /* Release, in passing, what the worker handed back: here, with the GIL
       held already, rather than on the dispatch thread, which would have to
       win the GIL from this producer. */
    hwtimer_release_chain(hwt_timer_take_released(timer->core));
    hwtimer_state *st = timer->state;
    TimeoutObject *to;
    if (tp == st->timeout_type && st->free_timeouts) {
        /* a released Timeout, untracked and still warm in the cache */
        to = st->free_timeouts;
        st->free_timeouts = (TimeoutObject *)to->task;
        st->nfree--;
        PyObject_Init((PyObject *)to, tp);
        memset((char *)to + FIELDS_OFFSET, 0, sizeof(TimeoutObject) - FIELDS_OFFSET);
    } else {
#ifdef Py_LIMITED_API
        /* tp_basicsize is out of the limited API's sight: tp_alloc zeroes
           the whole object, and tracks it, which a pending one is not */
        to = (TimeoutObject *)HWT_TP_ALLOC(tp)(tp, 0);
        if (!to)
            return NULL;
        PyObject_GC_UnTrack(to);
#else
        to = PyObject_GC_New(TimeoutObject, tp);
        if (!to)
            return NULL;
        memset((char *)to + FIELDS_OFFSET, 0, (size_t)tp->tp_basicsize - FIELDS_OFFSET);
#endif
    }
    to->node.sink = sink;
    Py_INCREF(task);
    to->task = task;
    Py_INCREF(timer); /* dropped in dealloc, through node.sink->owner */
    return (PyObject *)to;
}

int hwtimer_timeout_submit(TimerObject *timer, PyObject *obj, int64_t delay_ns, int64_t period_ns,
                           int missed)
{
    TimeoutObject *to = (TimeoutObject *)obj;
    assert(period_ns <= 0 || Py_TYPE(obj) == timer->state->periodic_type ||
           Py_TYPE(obj) == timer->state->loop_timeout_type);
    Py_INCREF(to); /* the wheel's reference */
    int r;
    if (period_ns > 0) {
        /* set before it is scheduled: its first run may begin at once */
        ((PeriodicTimeoutObject *)to)->period = period_ns;
        r = hwt_timer_schedule_periodic(timer->core, &to->node, delay_ns, missed);
    } else {
        r = hwt_timer_schedule(timer->core, &to->node, delay_ns);
    }
    if (r == HWT_OK)
        return 0;
    Py_DECREF(to);
    return hwtimer_core_error(timer, r, "schedule a timeout");
}

PyObject *hwtimer_timeout_from_node(hwt_timeout *node)
{
    TimeoutObject *to = TIMEOUT_OF(node);
    if (!PyObject_GC_IsTracked((PyObject *)to))
        PyObject_GC_Track((PyObject *)to);
    return (PyObject *)to;
}

void hwtimer_release_chain(hwt_timeout *node)
{
    while (node) {
        hwt_timeout *next = hwt_timeout_of(node->link.next);
        Py_DECREF(hwtimer_timeout_from_node(node));
        node = next;
    }
}

double hwtimer_deadline_seconds(TimeoutObject *to)
{
    int64_t deadline = hwt_timeout_deadline(&to->node);
    int64_t start = hwt_timer_start_time(to->node.sink->timer);
    /* a deadline within `start` of saturation is as far: never */
    if (deadline == HWT_NEVER || deadline > HWT_NEVER - start)
        return Py_HUGE_VAL;
    return hwtimer_seconds(start + deadline);
}

/* ---- running a task ---- */

/* Calls the task once: task(timeout), or a call_later callback in its
   context.  Returns 0, or -1 with the exception it raised. */
static int call_once(TimerObject *timer, TimeoutObject *to)
{
    if (Py_TYPE(to) == timer->state->loop_timeout_type)
        return hwtimer_loop_call((LoopTimeoutObject *)to);
    TimerObject *outer = hwtimer_current_task_timer;
    hwtimer_current_task_timer = timer;
    PyObject *r = PyObject_CallOneArg(to->task, (PyObject *)to);
    hwtimer_current_task_timer = outer;
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* _submitted(timeout, future): the done-callback of a submitted task's
   future.  _run_task reports the task's own errors, so an exception here
   means the task never ran (a process pool that cannot pickle it, a
   future cancelled at shutdown): it is counted and logged like one. */
static PyObject *submitted_done(PyObject *timeout, PyObject *future)
{
    PyObject *exc = PyObject_CallMethod(future, "exception", NULL);
    if (exc == Py_None) {
        Py_DECREF(exc);
        Py_RETURN_NONE;
    }
    if (exc) { /* else exception() raised, e.g. CancelledError: log that */
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    TimerObject *timer = TIMER_OF((TimeoutObject *)timeout);
    timer->task_errors++;
    hwtimer_log_task_error(timer->state, timeout);
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
            hwtimer_log_error(TIMER_OF(to)->state, "cannot watch an executor's future");
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
    timer->task_errors++;
    if (Py_TYPE(to) == timer->state->loop_timeout_type)
        return hwtimer_loop_report((LoopTimeoutObject *)to);
    hwtimer_log_task_error(timer->state, (PyObject *)to);
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
    if (!timer->stopped_periodic && !(timer->stopped_periodic = PyList_New(0))) {
        PyErr_Clear(); /* it stays cancelled, only unlisted */
        return;
    }
    if (PyList_Append(timer->stopped_periodic, (PyObject *)to) < 0)
        PyErr_Clear();
}

/* Puts a periodic timeout back after a run from `start` to `end`.
   Returns true when its next run is due now and may start. */
static bool rearm(TimerObject *timer, TimeoutObject *to, int64_t start, int64_t end)
{
    for (;;) {
        Py_INCREF(to); /* the wheel's reference, if it goes back */
        int r = hwt_timeout_rearm(&to->node, hwtimer_timeout_period(to), start, end);
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

int hwtimer_run_timeout(TimerObject *timer, TimeoutObject *to, int64_t *now)
{
    hwt_timeout *node = &to->node;
    if (hwt_timeout_periodic(node) && atomic_load(&node->state) == HWT_CANCELLED) {
        hwt_timeout_finish(node, HWT_CANCELLED); /* cancelled since it was delivered */
        return 0;
    }
    int64_t origin = hwt_timer_start_time(timer->core);
    for (;;) {
        /* With the GIL held from the state's check above (or in rearm())
           to the call, no cancel() can return True in between: no run
           starts after it. */
        int64_t start = *now, deadline = origin + hwt_timeout_deadline(node);
        int failed = call_once(timer, to);
        int64_t end = *now = hwtimer_clock_ns(timer);
        hwt_timer_record_task(timer->core, start - deadline, end - start);
        int r = failed ? report_failure(timer, to) : 0;
        if (!hwt_timeout_periodic(node))
            return r;
        if (failed) {
            hwt_timeout_finish(node, HWT_EXPIRED); /* an exception ends it */
            return r;
        }
        if (!rearm(timer, to, start, end))
            return 0;
    }
}

int64_t hwtimer_dispatch_timeout(TimerObject *timer, TimeoutObject *to, int64_t now)
{
    if (!timer->executor) {
        hwtimer_run_timeout(timer, to, &now);
        return now;
    }
    PyObject *r = PyObject_CallMethod(timer->executor, "submit", "OO", timer->state->run_task,
                                      (PyObject *)to);
    if (r) {
        watch_future(to, r);
        Py_DECREF(r);
        return hwtimer_clock_ns(timer);
    }
    /* A refused task still runs exactly once: here.  Executors refuse all
       work once threading's exit hooks shut them down; other refusals are
       errors worth a log line. */
    if (timer->state->threads_exiting) {
        PyErr_Clear();
    } else {
        timer->task_errors++;
        hwtimer_log_task_error(timer->state, (PyObject *)to);
    }
    now = hwtimer_clock_ns(timer);
    hwtimer_run_timeout(timer, to, &now);
    return now;
}

/* ---- methods ---- */

static PyObject *timeout_cancel(TimeoutObject *self, PyObject *unused)
{
    (void)unused;
    int r = hwt_timeout_cancel(&self->node);
    if (r != HWT_OK && r != HWT_EFINAL) {
        hwtimer_core_error(TIMER_OF(self), r, "cancel a timeout");
        return NULL;
    }
    return PyBool_FromLong(r == HWT_OK);
}

static PyObject *timeout_reset(TimeoutObject *self, PyObject *delay)
{
    int64_t ns;
    if (hwtimer_parse_delay(TIMER_OF(self)->state, delay, "delay", &ns) < 0)
        return NULL;
    int r = hwt_timeout_reset(&self->node, ns);
    if (r != HWT_OK && r != HWT_EFINAL) {
        hwtimer_core_error(TIMER_OF(self), r, "reset a timeout");
        return NULL;
    }
    return PyBool_FromLong(r == HWT_OK);
}

static PyObject *timeout_is_cancelled(TimeoutObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(atomic_load(&self->node.state) == HWT_CANCELLED);
}

static PyObject *timeout_is_expired(TimeoutObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(atomic_load(&self->node.state) == HWT_EXPIRED);
}

static PyObject *timeout_get_timer(TimeoutObject *self, void *closure)
{
    (void)closure;
    PyObject *timer = (PyObject *)TIMER_OF(self);
    Py_INCREF(timer);
    return timer;
}

static PyObject *timeout_get_task(TimeoutObject *self, void *closure)
{
    (void)closure;
    PyObject *task = self->task ? self->task : Py_None;
    Py_INCREF(task);
    return task;
}

static PyObject *timeout_get_deadline(TimeoutObject *self, void *closure)
{
    (void)closure;
    return PyFloat_FromDouble(hwtimer_deadline_seconds(self));
}

static PyObject *timeout_repr(TimeoutObject *self)
{
    double left = hwtimer_deadline_seconds(self) - (double)hwtimer_clock_ns(TIMER_OF(self)) / 1e9;
    char *num = NULL;
    const char *when;
    if (isinf(left)) {
        when = "never";
    } else {
        num = PyOS_double_to_string(fabs(left), 'f', 3, 0, NULL);
        if (!num)
            return NULL;
        when = left >= 0 ? "later" : "ago";
    }
    uint32_t state = atomic_load(&self->node.state);
    const char *st = state == HWT_CANCELLED ? ", cancelled"
                     : state == HWT_EXPIRED ? ", expired"
                                            : "";
    PyObject *r = num ? PyUnicode_FromFormat("Timeout(deadline: %s s %s%s, task: %R)", num, when,
                                             st, self->task ? self->task : Py_None)
                      : PyUnicode_FromFormat("Timeout(deadline: never%s, task: %R)", st,
                                             self->task ? self->task : Py_None);
    PyMem_Free(num);
    return r;
}

/* ---- GC and deallocation ---- */

int hwtimer_timeout_traverse(TimeoutObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->task);
    Py_VISIT((PyObject *)TIMER_OF(self));
    return 0;
}

int hwtimer_timeout_clear(TimeoutObject *self)
{
    Py_CLEAR(self->task);
    return 0;
}

void hwtimer_timeout_dealloc(TimeoutObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    TimerObject *timer = TIMER_OF(self);
    hwtimer_state *st = timer->state;
    Py_CLEAR(self->task);
    if (tp == st->timeout_type && st->nfree < MAX_FREE_TIMEOUTS) {
        /* kept for the next new_timeout(), chained through `task` */
        self->task = (PyObject *)st->free_timeouts;
        st->free_timeouts = self;
        st->nfree++;
    } else {
        HWT_TP_FREE(tp)(self);
    }
    Py_DECREF(timer);
    Py_DECREF(tp);
}

static PyMethodDef timeout_methods[] = {
    {"cancel", (PyCFunction)timeout_cancel, METH_NOARGS,
     "cancel($self, /)\n--\n\nCancels the timeout.  True if this call cancelled it, False if it "
     "had "
     "already expired or been cancelled."},
    {"reset", (PyCFunction)timeout_reset, METH_O,
     "reset($self, delay, /)\n--\n\nMoves a pending timeout's deadline to delay seconds from "
     "now.  True if it was pending and is re-armed (its task runs at most once, never at the old "
     "deadline); False if it had expired or been cancelled."},
    {"is_cancelled", (PyCFunction)timeout_is_cancelled, METH_NOARGS,
     "is_cancelled($self, /)\n--\n\nTrue once the timeout has been cancelled."},
    {"is_expired", (PyCFunction)timeout_is_expired, METH_NOARGS,
     "is_expired($self, /)\n--\n\nTrue once the timeout has expired (its task runs or has run)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef timeout_getset[] = {
    {"timer", (getter)timeout_get_timer, NULL, "The HashedWheelTimer that made this timeout.",
     NULL},
    {"task", (getter)timeout_get_task, NULL, "The task (or call_later callback).", NULL},
    {"deadline", (getter)timeout_get_deadline, NULL,
     "When the timeout is due, on the time.monotonic() clock (inf: never).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot timeout_slots[] = {
    {Py_tp_doc, "A scheduled task: returned by HashedWheelTimer.new_timeout()."},
    {Py_tp_new, hwtimer_new_refused},
    {Py_tp_dealloc, hwtimer_timeout_dealloc},
    {Py_tp_traverse, hwtimer_timeout_traverse},
    {Py_tp_clear, hwtimer_timeout_clear},
    {Py_tp_repr, timeout_repr},
    {Py_tp_methods, timeout_methods},
    {Py_tp_getset, timeout_getset},
    {0, NULL},
};

PyType_Spec hwtimer_timeout_spec = {
    .name = "hwtimer.Timeout",
    .basicsize = sizeof(TimeoutObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .slots = timeout_slots,
};

/* ---- the new_periodic subtype: the Timeout's behaviour, and a period ---- */

static PyType_Slot periodic_slots[] = {
    {Py_tp_doc, "A periodic task: returned by HashedWheelTimer.new_periodic()."},
    {Py_tp_new, hwtimer_new_refused},
    {Py_tp_dealloc, hwtimer_timeout_dealloc},
    {Py_tp_traverse, hwtimer_timeout_traverse},
    {Py_tp_clear, hwtimer_timeout_clear},
    {0, NULL},
};

PyType_Spec hwtimer_periodic_spec = {
    .name = "hwtimer._PeriodicTimeout",
    .basicsize = sizeof(PeriodicTimeoutObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = periodic_slots,
};
