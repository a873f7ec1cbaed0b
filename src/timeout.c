/*
 * timeout.c: hwtimer.Timeout, the handle new_timeout() returns, and its
 * subtype for new_periodic(), which carries the period (call_later()'s is
 * in looptimeout.c).  The task runner is in runner.c.
 */
#include "binding.h"

#include <math.h>
#include <string.h>

#define FIELDS_OFFSET offsetof(TimeoutObject, node)

/* Released Timeouts kept for reuse: a schedule+cancel pattern then
   allocates nothing, and never counts towards a young GC collection.  The
   worker hands cancelled ones back once a tick, about 10,000 in a 1 ms
   tick at the fastest rate: fewer places than that sent the rest to
   pymalloc and had the next tick's schedules allocate again. */
#define MAX_FREE_TIMEOUTS 16384

/* Out of line: most schedules find nothing, and need none of the
   registers this takes. */
__attribute__((noinline)) void hwtimer_release_handed_back(hwt_timer *core)
{
    hwtimer_release_chain(hwt_timer_take_released(core));
}

PyObject *hwtimer_timeout_new(TimerObject *timer, PyTypeObject *tp, hwt_sink *sink, PyObject *task)
{
    /* Release, in passing, what the worker handed back: here, with the GIL
       held already, rather than on the dispatch thread, which would have to
       win the GIL from this producer. */
    if (hwt_timer_has_released(timer->core))
        hwtimer_release_handed_back(timer->core);
    hwtimer_state *st = timer->module_state;
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

void hwtimer_timeout_track_pending(PyObject *obj)
{
    if (!PyObject_GC_IsTracked(obj))
        PyObject_GC_Track(obj);
}

int hwtimer_timeout_submit(TimerObject *timer, PyObject *obj, int64_t delay_ns,
                           const hwtimer_period *period, int missed)
{
    TimeoutObject *to = (TimeoutObject *)obj;
    assert(!period || Py_TYPE(obj) == timer->module_state->periodic_type ||
           Py_TYPE(obj) == timer->module_state->loop_timeout_type);
    Py_INCREF(to); /* the wheel's reference */
    int r;
    if (period) {
        /* set before it is scheduled: its first run may begin at once */
        hwtimer_grid *grid = hwtimer_timeout_grid(to);
        grid->period = period->ns;
        grid->frac = period->frac;
        grid->behind = period->behind;
        grid->catch_up = 0;
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
    hwtimer_timeout_track_if_held(to);
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

/* ---- methods ---- */

void hwtimer_track_taken_back(hwtimer_state *st)
{
    TimeoutObject *to = st->untracked_held;
    if (to) {
        st->untracked_held = NULL;
        if (!PyObject_GC_IsTracked((PyObject *)to))
            PyObject_GC_Track(to);
    }
}

/* Releases the wheel's reference to `to`, which its cancel() took back
   before the worker saw it; the caller's reference keeps it alive.  Held by
   the caller, it must be tracked (a cycle through its task may come to
   hold it), but the schedule + cancel pattern mostly drops it at once: so
   a plain Timeout waits, untracked, until the next take-back or the next
   collection tracks it, and one dropped before that is never tracked nor
   untracked.  Any other kind, and any of a manual timer (tracked while
   pending), is tracked at once, as hwtimer_release_chain() tracks those
   the worker hands back. */
static void release_taken_back(TimeoutObject *to)
{
    TimerObject *timer = TIMER_OF(to);
    hwtimer_state *st = timer->module_state;
    if (Py_TYPE(to) != st->timeout_type || timer->manual) {
        Py_DECREF(hwtimer_timeout_from_node(&to->node));
        return;
    }
    /* a one-shot is never tracked while a real timer's wheel holds it */
    assert(!PyObject_GC_IsTracked((PyObject *)to));
    hwtimer_track_taken_back(st);
    st->untracked_held = to;
    Py_DECREF(to);
}

PyObject *hwtimer_timeout_cancel(TimeoutObject *self, PyObject *unused)
{
    (void)unused;
    int r = hwt_timeout_cancel_take(&self->node);
    if (r == HWT_TAKEN) {
        release_taken_back(self);
        Py_RETURN_TRUE;
    }
    if (r != HWT_OK && r != HWT_EFINAL) {
        hwtimer_core_error(TIMER_OF(self), r, "cancel a timeout");
        return NULL;
    }
    return PyBool_FromLong(r == HWT_OK);
}

/* Whether `to` is a new_periodic() or call_every() timeout, by its type:
   its node's flag may be the worker's to read while it is on the wheel. */
static bool is_periodic(TimeoutObject *to)
{
    hwtimer_state *st = TIMER_OF(to)->module_state;
    return Py_TYPE(to) == st->periodic_type ||
           (Py_TYPE(to) == st->loop_timeout_type && ((LoopTimeoutObject *)to)->grid.period != 0);
}

static PyObject *timeout_reset(TimeoutObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    static const char *const names[] = {"delay"};
    static const hwtimer_signature sig = {
        .fname = "reset", .names = names, .nparams = 1, .nrequired = 1};
    PyObject *delay;
    int64_t ns;
    if (hwtimer_bind_one(&sig, args, nargs, kwnames, &delay) < 0 ||
        hwtimer_parse_delay(TIMER_OF(self)->module_state, delay, "delay", &ns) < 0)
        return NULL;
    /* a timer started before fork() has no worker in this child: nothing
       of it runs here, so nothing is re-armed (and new_timeout() there,
       which False calls for, says why) */
    if (hwt_timer_orphaned(self->node.sink->timer))
        Py_RETURN_FALSE;
    int r = hwt_timeout_reset(&self->node, ns);
    if (r != HWT_OK && r != HWT_EFINAL) {
        hwtimer_core_error(TIMER_OF(self), r, "reset a timeout");
        return NULL;
    }
    /* a periodic one's next run is at the new deadline, on its grid */
    if (r == HWT_OK && is_periodic(self)) {
        hwtimer_grid *grid = hwtimer_timeout_grid(self);
        grid->catch_up = 0;
        grid->behind = 0; /* the grid goes on from a whole ns */
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

static PyObject *timeout_repr_of(TimeoutObject *self)
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
        when = left > 0 ? "later" : "ago"; /* at its deadline: due, no longer to come */
    }
    uint32_t state = atomic_load(&self->node.state);
    const char *state_note = state == HWT_CANCELLED ? ", cancelled"
                             : state == HWT_EXPIRED ? ", expired"
                                                    : "";
    PyObject *r = num ? PyUnicode_FromFormat("Timeout(deadline: %s s %s%s, task: %R)", num, when,
                                             state_note, self->task ? self->task : Py_None)
                      : PyUnicode_FromFormat("Timeout(deadline: never%s, task: %R)", state_note,
                                             self->task ? self->task : Py_None);
    PyMem_Free(num);
    return r;
}

static PyObject *timeout_repr(TimeoutObject *self)
{
    /* the task's repr may show this timeout again (an object that keeps
       its timeout and is its task): elided there, as a list in itself */
    int busy = Py_ReprEnter((PyObject *)self);
    if (busy != 0)
        return busy > 0 ? PyUnicode_FromString("Timeout(...)") : NULL;
    PyObject *r = timeout_repr_of(self);
    Py_ReprLeave((PyObject *)self);
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
    TimerObject *timer = TIMER_OF(self);
    hwtimer_state *st = timer->module_state;
    if (st->untracked_held == self)
        st->untracked_held = NULL;
    else
        PyObject_GC_UnTrack(self);
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
    {"cancel", (PyCFunction)hwtimer_timeout_cancel, METH_NOARGS, HWTIMER_CANCEL_DOC},
    {"reset", (PyCFunction)(void (*)(void))timeout_reset, METH_FASTCALL | METH_KEYWORDS,
     "reset($self, /, delay)\n--\n\nMoves a pending timeout's deadline to delay seconds from "
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
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
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
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = periodic_slots,
};
