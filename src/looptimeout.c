/*
 * looptimeout.c: hwtimer._LoopTimeout, the Timeout that call_later() and
 * call_every() return: a callback, its arguments and context, and the sink
 * of the loop it runs on; its place in that sink's list of live timeouts;
 * calling it in its context, and reporting its failure to its loop as
 * asyncio reports a failed handle.
 */
#include "binding.h"

static int loop_timeout_traverse(LoopTimeoutObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->args);
    Py_VISIT(self->context);
    Py_VISIT((PyObject *)self->sink);
    return hwtimer_timeout_traverse(&self->base, visit, arg);
}

static int loop_timeout_clear(LoopTimeoutObject *self)
{
    Py_CLEAR(self->args);
    Py_CLEAR(self->context);
    return hwtimer_timeout_clear(&self->base);
}

static void loop_timeout_dealloc(LoopTimeoutObject *self)
{
    PyObject_GC_UnTrack(self);
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

static PyType_Slot loop_timeout_slots[] = {
    {Py_tp_doc, "A callback scheduled by HashedWheelTimer.call_later()."},
    {Py_tp_new, hwtimer_new_refused},
    {Py_tp_dealloc, loop_timeout_dealloc},
    {Py_tp_traverse, loop_timeout_traverse},
    {Py_tp_clear, loop_timeout_clear},
    {0, NULL},
};

PyType_Spec hwtimer_loop_timeout_spec = {
    .name = "hwtimer._LoopTimeout",
    .basicsize = sizeof(LoopTimeoutObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = loop_timeout_slots,
};
