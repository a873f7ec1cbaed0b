/*
 * looptimeout.c: hwtimer._LoopTimeout, the Timeout that call_later() and
 * call_every() return: a callback, its arguments and context, and the sink
 * of the loop it runs on; its place in that sink's list of live timeouts;
 * calling it in its context, and reporting its failure to its loop as
 * asyncio reports a failed handle.
 */
#include "binding.h"

/* Returns the loop (a new reference), or NULL, with no exception, once it
   has been collected. */
PyObject *hwtimer_sink_loop(LoopSinkObject *self)
{
    PyObject *loop = self->owns_loop ? self->loop : NULL;
    if (self->loop_ref && !self->owns_loop) {
#ifdef Py_LIMITED_API
        /* calling a weak reference gives a strong one, or None */
        loop = PyObject_CallNoArgs(self->loop_ref);
        if (!loop)
            PyErr_Clear();
        else if (loop == Py_None)
            Py_CLEAR(loop);
        return loop;
#elif PY_VERSION_HEX >= 0x030D0000
        if (PyWeakref_GetRef(self->loop_ref, &loop) < 0)
            PyErr_Clear();
        return loop;
#else
        loop = PyWeakref_GetObject(self->loop_ref);
        loop = loop == Py_None ? NULL : loop;
#endif
    }
    Py_XINCREF(loop);
    return loop;
}

bool hwtimer_loop_closed(PyObject *loop)
{
    PyObject *method = PyObject_GetAttrString(loop, "is_closed");
    PyObject *answer = method ? PyObject_CallNoArgs(method) : NULL;
    int closed = answer ? PyObject_IsTrue(answer) : -1;
    if (closed < 0)
        PyErr_WriteUnraisable(method ? method : loop);
    Py_XDECREF(answer);
    Py_XDECREF(method);
    return closed > 0;
}

void hwtimer_loop_sink_track(LoopTimeoutObject *to)
{
    LoopSinkObject *s = to->sink;
    to->sink_prev = NULL;
    to->sink_next = s->timeouts;
    if (s->timeouts)
        s->timeouts->sink_prev = to;
    s->timeouts = to;
}

void hwtimer_loop_sink_untrack(LoopTimeoutObject *to)
{
    LoopSinkObject *s = to->sink;
    if (to->sink_prev)
        to->sink_prev->sink_next = to->sink_next;
    else if (s->timeouts == to)
        s->timeouts = to->sink_next;
    if (to->sink_next)
        to->sink_next->sink_prev = to->sink_prev;
    to->sink_prev = to->sink_next = NULL;
}

/* Reports a failed callback as asyncio reports a failed handle.  Returns
   0, or -1 with the KeyboardInterrupt or SystemExit that the loop's
   exception handler raised: asyncio lets those out of
   call_exception_handler(), and so out of the loop. */
static int report_error(LoopSinkObject *self, PyObject *timeout)
{
    PyObject *exc = hwtimer_take_exception();
    TimerObject *timer = TIMER_OF((TimeoutObject *)timeout);
    if (timer->manual && exc)
        hwtimer_keep_manual_error(timer, exc);
    PyObject *loop = hwtimer_sink_loop(self);
    PyObject *task = hwtimer_repr_for_log(((TimeoutObject *)timeout)->task);
    PyObject *msg = task ? PyUnicode_FromFormat("Exception in callback %U", task) : NULL;
    Py_XDECREF(task);
    PyObject *ctx = msg ? Py_BuildValue("{s:O,s:O,s:O}", "message", msg, "exception",
                                        exc ? exc : Py_None, "handle", timeout)
                        : NULL;
    /* called with the callback's exception as the one being handled, as
       asyncio's handle calls it from its except clause: what the handler
       raises has it for __context__ */
    PyObject *saved_type, *saved, *saved_tb;
    PyErr_GetExcInfo(&saved_type, &saved, &saved_tb);
    if (exc) {
        Py_INCREF(Py_TYPE(exc));
        Py_INCREF(exc);
        PyErr_SetExcInfo((PyObject *)Py_TYPE(exc), exc, PyException_GetTraceback(exc));
    } else {
        PyErr_SetExcInfo(NULL, NULL, NULL);
    }
    PyObject *r =
        ctx && loop ? PyObject_CallMethod(loop, "call_exception_handler", "O", ctx) : NULL;
    PyErr_SetExcInfo(saved_type, saved, saved_tb);
    bool let_out = !r && (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) ||
                          PyErr_ExceptionMatches(PyExc_SystemExit));
    if (!r && !let_out)
        PyErr_WriteUnraisable(timeout);
    Py_XDECREF(r);
    Py_XDECREF(loop);
    Py_XDECREF(ctx);
    Py_XDECREF(msg);
    Py_XDECREF(exc);
    return let_out ? -1 : 0;
}

#ifdef Py_LIMITED_API
/* Returns Context.run(context, callback, *args): the limited API cannot
   enter a context itself.  An entered context fails as PyContext_Enter()
   does. */
static PyObject *call_in_context(hwtimer_state *st, PyObject *context, LoopTimeoutObject *to)
{
    Py_ssize_t n = PyTuple_Size(to->args);
    PyObject *args = n >= 0 ? PyTuple_New(n + 2) : NULL;
    if (!args)
        return NULL;
    Py_INCREF(context);
    PyTuple_SET_ITEM(args, 0, context);
    Py_INCREF(to->base.task);
    PyTuple_SET_ITEM(args, 1, to->base.task);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *arg = PyTuple_GET_ITEM(to->args, i);
        Py_INCREF(arg);
        PyTuple_SET_ITEM(args, i + 2, arg);
    }
    PyObject *r = PyObject_Call(st->context_run, args, NULL);
    Py_DECREF(args);
    return r;
}
#endif

int hwtimer_loop_call(LoopTimeoutObject *to)
{
    /* Scope deadlines all carry the module's empty context, and a context
       can be entered by one thread at a time: while one loop's expiry is
       inside task.cancel() with the GIL released, another loop's would be
       refused.  Each of them runs in an empty context of its own. */
    hwtimer_state *st = TIMER_OF(&to->base)->module_state;
    PyObject *context = to->context == st->empty_context ? HWT_NEW_CONTEXT(st)
                                                         : (Py_INCREF(to->context), to->context);
    if (!context)
        return -1;
#ifdef Py_LIMITED_API
    PyObject *r = call_in_context(st, context, to);
#else
    if (PyContext_Enter(context) < 0) {
        Py_DECREF(context);
        return -1;
    }
    PyObject *r = PyObject_Call(to->base.task, to->args, NULL);
    if (PyContext_Exit(context) < 0)
        Py_CLEAR(r);
#endif
    Py_DECREF(context);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

int hwtimer_loop_report(LoopTimeoutObject *to)
{
    /* out of the loop, as in asyncio: not the callback's error */
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) || PyErr_ExceptionMatches(PyExc_SystemExit))
        return -1;
    TIMER_OF(&to->base)->task_errors++;
    return report_error(to->sink, (PyObject *)to);
}

void hwtimer_loop_timeout_stopped(LoopTimeoutObject *to)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *loop = hwtimer_sink_loop(to->sink);
    /* asked first, so that a closed loop is not touched; one that closes
       meanwhile refuses the call with RuntimeError */
    bool open = loop && !hwtimer_loop_closed(loop);
    PyObject *moved = open ? PyObject_GetAttrString((PyObject *)to, "_stopped") : NULL;
    PyObject *r = moved ? PyObject_CallMethod(loop, "call_soon_threadsafe", "O", moved) : NULL;
    if (!r && open && !PyErr_ExceptionMatches(PyExc_RuntimeError))
        PyErr_WriteUnraisable((PyObject *)to);
    PyErr_Clear(); /* else the loop is gone or closed: nothing waits there */
    Py_XDECREF(r);
    Py_XDECREF(moved);
    Py_XDECREF(loop);
    PyErr_Restore(type, value, tb);
}

void hwtimer_loop_timeout_drop_on_stop(LoopTimeoutObject *to)
{
    Py_CLEAR(to->on_stop);
}

/* _stopped(): in the loop's thread, after stop() swept the timeout before
   it was due: calls on_stop(remaining), once. */
static PyObject *loop_timeout_stopped(LoopTimeoutObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *on_stop = self->on_stop;
    if (!on_stop)
        Py_RETURN_NONE; /* cancelled since: nothing waits for the deadline */
    self->on_stop = NULL;
    TimerObject *timer = TIMER_OF(&self->base);
    int64_t deadline = hwt_timeout_deadline(&self->base.node);
    int64_t now = hwtimer_clock_ns(timer) - hwt_timer_start_time(timer->core);
    double remaining = deadline == HWT_NEVER ? Py_HUGE_VAL
                       : deadline > now      ? (double)(deadline - now) / 1e9
                                             : 0.0;
    PyObject *r = PyObject_CallFunction(on_stop, "d", remaining);
    Py_DECREF(on_stop);
    return r;
}

static int loop_timeout_traverse(LoopTimeoutObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->on_stop);
    Py_VISIT(self->args);
    Py_VISIT(self->context);
    Py_VISIT((PyObject *)self->sink);
    return hwtimer_timeout_traverse(&self->base, visit, arg);
}

static int loop_timeout_clear(LoopTimeoutObject *self)
{
    Py_CLEAR(self->on_stop);
    Py_CLEAR(self->args);
    Py_CLEAR(self->context);
    return hwtimer_timeout_clear(&self->base);
}

static void loop_timeout_dealloc(LoopTimeoutObject *self)
{
    PyObject_GC_UnTrack(self);
    Py_CLEAR(self->on_stop);
    Py_CLEAR(self->args);
    Py_CLEAR(self->context);
    /* the sink outlives the node that points into it */
    LoopSinkObject *sink = self->sink;
    if (sink)
        hwtimer_loop_sink_untrack(self);
    self->sink = NULL;
    hwtimer_timeout_dealloc(&self->base);
    Py_XDECREF(sink);
}

/* cancel(): Timeout's.  A call_later() callback that it cancelled will
   never run: its arguments go at once, as asyncio's handles let go of
   theirs, not when the caller drops the handle.  A call_every() callback
   keeps them: it may be in its run, which uses them.  Its owner no longer
   waits for the deadline: on_stop goes too. */
static PyObject *loop_timeout_cancel(LoopTimeoutObject *self, PyObject *unused)
{
    Py_CLEAR(self->on_stop);
    PyObject *r = hwtimer_timeout_cancel(&self->base, unused);
    if (r == Py_True && self->grid.period == 0) {
        PyObject *args = self->args; /* its release may run Python */
        self->args = TIMER_OF(&self->base)->module_state->empty_tuple;
        Py_INCREF(self->args);
        Py_XDECREF(args);
    }
    return r;
}

static PyMethodDef loop_timeout_methods[] = {
    {"cancel", (PyCFunction)loop_timeout_cancel, METH_NOARGS, HWTIMER_CANCEL_DOC},
    {"_stopped", (PyCFunction)loop_timeout_stopped, METH_NOARGS,
     "_stopped($self, /)\n--\n\nCalls on_stop: stop() swept the timeout before it was due."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot loop_timeout_slots[] = {
    {Py_tp_doc, "A callback scheduled by HashedWheelTimer.call_later()."},
    {Py_tp_methods, loop_timeout_methods},
    {Py_tp_new, hwtimer_new_refused},
    {Py_tp_dealloc, loop_timeout_dealloc},
    {Py_tp_traverse, loop_timeout_traverse},
    {Py_tp_clear, loop_timeout_clear},
    {0, NULL},
};

PyType_Spec hwtimer_loop_timeout_spec = {
    .name = "hwtimer._LoopTimeout",
    .basicsize = sizeof(LoopTimeoutObject),
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = loop_timeout_slots,
};
