/*
 * module.c: the extension module hwtimer._hwtimer: its state, multi-phase
 * initialisation, and the atexit hook that stops every running timer.
 */
#include "binding.h"

static struct PyModuleDef hwtimer_module;

static inline hwtimer_state *state_of_module(PyObject *module)
{
    return (hwtimer_state *)PyModule_GetState(module);
}

/* ---- module functions ---- */

/* _run_task(timeout): what a timer with an executor submits. */
static PyObject *run_task(PyObject *module, PyObject *arg)
{
    hwtimer_state *st = state_of_module(module);
    if (!PyObject_TypeCheck(arg, st->timeout_type)) {
        PyErr_SetString(PyExc_TypeError, "_run_task() takes a Timeout");
        return NULL;
    }
    TimeoutObject *to = (TimeoutObject *)arg;
    if (hwtimer_run_submitted(TIMER_OF(to), to) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Notes that threading's exit hooks are running. */
static PyObject *threads_exiting(PyObject *module, PyObject *unused)
{
    (void)unused;
    state_of_module(module)->threads_exiting = true;
    Py_RETURN_NONE;
}

/* _setup_scopes(default_timer, current_task, cancelling, cancel_task,
   exit_expired): what TimeoutScope takes from hwtimer._asyncio.  The two
   middle ones are None where Task.cancelling() exists (3.11+). */
static PyObject *setup_scopes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char *const names[] = {"default_timer", "current_task", "cancelling",
                                        "cancel_task", "exit_expired"};
    static const hwtimer_signature sig = {.fname = "_setup_scopes",
                                          .names = names,
                                          .nparams = 5,
                                          .npositional_only = 5,
                                          .nrequired = 5};
    hwtimer_state *st = state_of_module(module);
    PyObject *given[5];
    if (hwtimer_bind(&sig, args, nargs, NULL, given) < 0)
        return NULL;
    PyObject *default_timer = given[0], *current_task = given[1], *cancelling = given[2],
             *cancel_task = given[3], *exit_expired = given[4];
    Py_INCREF(default_timer);
    Py_XSETREF(st->default_timer, default_timer);
    Py_INCREF(current_task);
    Py_XSETREF(st->current_task, current_task);
    Py_XSETREF(st->cancelling_hook,
               cancelling == Py_None ? NULL : (Py_INCREF(cancelling), cancelling));
    Py_XSETREF(st->cancel_hook,
               cancel_task == Py_None ? NULL : (Py_INCREF(cancel_task), cancel_task));
    Py_INCREF(exit_expired);
    Py_XSETREF(st->exit_expired_hook, exit_expired);
    Py_RETURN_NONE;
}

/* _follow_loop_time(on): sets the switch behind
   hwtimer.testing.follow_loop_time(); returns the previous setting. */
static PyObject *follow_loop_time(PyObject *module, PyObject *on)
{
    hwtimer_state *st = state_of_module(module);
    bool was = st->follow_loop_time;
    if (on != Py_None) {
        int v = PyObject_IsTrue(on);
        if (v < 0)
            return NULL;
        st->follow_loop_time = v;
    }
    return PyBool_FromLong(was);
}

/* _mark_shared(timer): marks the timer that hwtimer.default_timer() made
   as the shared one, for the error of a start after its stop. */
static PyObject *mark_shared(PyObject *module, PyObject *timer)
{
    if (!PyObject_TypeCheck(timer, state_of_module(module)->timer_type))
        return PyErr_Format(PyExc_TypeError, "_mark_shared() takes a HashedWheelTimer, not %.100s",
                            hwtimer_type_name(Py_TYPE(timer)));
    ((TimerObject *)timer)->shared = true;
    Py_RETURN_NONE;
}

/* The first timer of `timer`'s list (running_timers or stopping_timers,
   linked through running_next) that a reference can be taken to.  One
   whose count is 0 is in its dealloc, whose weak references' callbacks
   run before it stops the timer itself (one that lets go of the GIL lets
   this hook run meanwhile): a reference taken and dropped here would
   deallocate it a second time.  That dealloc stops it. */
static TimerObject *first_alive(TimerObject *timer)
{
    while (timer && Py_REFCNT(timer) == 0)
        timer = timer->running_next;
    return timer;
}

/* Stops every running timer, and waits for those still stopping;
   registered with atexit.  A timer's own stop() (a subclass's override)
   is called, as at the end of a with block; if it raises, its error is
   reported, and if it raises or leaves the timer running, the built-in
   stop() stops it, so that no dispatch thread outlives the interpreter.
   A ManualTimer has no threads: one whose stop() raised while another
   thread of this process is in its advance() (a signal ended the wait
   for that thread) is left as it is, since waiting for that thread again
   would let no signal end the exit. */
static PyObject *stop_all(PyObject *module, PyObject *unused)
{
    (void)unused;
    hwtimer_state *st = state_of_module(module);
    st->exiting = true;
    TimerObject *timer;
    while ((timer = first_alive(st->running_timers))) {
        Py_INCREF(timer);
        PyObject *r = timer->dying ? hwtimer_timer_stop(timer) : hwtimer_timer_own_stop(timer);
        bool raised = !r;
        if (raised)
            PyErr_WriteUnraisable((PyObject *)timer);
        Py_XDECREF(r);
        if (timer->running && !(raised && timer->manual && hwtimer_manual_advancing(timer))) {
            r = hwtimer_timer_stop(timer);
            raised = !r;
            if (raised)
                PyErr_WriteUnraisable((PyObject *)timer);
            Py_XDECREF(r);
        }
        if (timer->running && raised && timer->manual)
            hwtimer_timer_unlist_running(timer); /* the hook goes on with the others */
        hwtimer_timer_unlist_stopping(timer); /* a signal here ends its wait */
        Py_DECREF(timer);
    }
    /* Those whose stop() a signal interrupted, or another thread's stop()
       waits for: the task their dispatch thread runs, and what had expired
       before the stop, finish before the interpreter goes, as for a timer
       stopped above.  Taken out first, so that another signal ends this
       wait too. */
    while ((timer = first_alive(st->stopping_timers))) {
        Py_INCREF(timer);
        hwtimer_timer_unlist_stopping(timer);
        PyObject *r = hwtimer_timer_stop(timer);
        if (!r)
            PyErr_WriteUnraisable((PyObject *)timer);
        Py_XDECREF(r);
        Py_DECREF(timer);
    }
    Py_RETURN_NONE;
}

/* gc.callbacks' hook: a Timeout that its cancel() left untracked joins
   the collection that starts (timeout.c says why it waits), and so do
   those delivered to a loop that has not run them (loopsink.c). */
static PyObject *gc_hook(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    hwtimer_track_taken_back(state_of_module(module));
    hwtimer_loop_sinks_track_delivered(state_of_module(module));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"_run_task", run_task, METH_O,
     "_run_task($module, timeout, /)\n--\n\nRuns a timeout's task on this thread (for executors)."},
    {"_threads_exiting", threads_exiting, METH_NOARGS,
     "_threads_exiting($module, /)\n--\n\nNotes that threading's exit hooks run."},
    {"_setup_scopes", (PyCFunction)(void (*)(void))setup_scopes, METH_FASTCALL,
     "_setup_scopes($module, default_timer, current_task, cancelling, cancel_task, "
     "exit_expired, /)\n--\n\nWhat TimeoutScope takes from hwtimer._asyncio."},
    {"_follow_loop_time", follow_loop_time, METH_O,
     "_follow_loop_time($module, on, /)\n--\n\nSets (None: only reads) whether the asyncio "
     "helpers put a real timer's deadlines on the loop's call_at(); returns the old value."},
    {"_mark_shared", mark_shared, METH_O,
     "_mark_shared($module, timer, /)\n--\n\nMarks hwtimer.default_timer()'s timer as the "
     "shared one."},
    {"_gc_hook", (PyCFunction)(void (*)(void))gc_hook, METH_FASTCALL,
     "_gc_hook($module, phase, info, /)\n--\n\nTracks the Timeout a cancel() left untracked "
     "(the gc.callbacks hook)."},
    {"_stop_all", stop_all, METH_NOARGS,
     "_stop_all($module, /)\n--\n\nStops every running timer (the atexit hook)."},
    {NULL, NULL, 0, NULL},
};

/* ---- initialisation ---- */

/* PyModule_AddObjectRef, which 3.9 lacks.  Returns 0 or -1. */
static int add_ref(PyObject *module, const char *name, PyObject *value)
{
    Py_INCREF(value);
    if (PyModule_AddObject(module, name, value) < 0) {
        Py_DECREF(value);
        return -1;
    }
    return 0;
}

static int add_type(PyObject *module, PyType_Spec *spec, PyObject *base, PyTypeObject **out)
{
    /* 3.9 takes the bases only as a tuple */
    PyObject *bases = base ? PyTuple_Pack(1, base) : NULL;
    if (base && !bases)
        return -1;
    *out = (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, bases);
    Py_XDECREF(bases);
    return *out ? 0 : -1;
}

static int module_exec(PyObject *module)
{
    hwtimer_state *st = state_of_module(module);
    if (add_type(module, &hwtimer_timer_spec, NULL, &st->timer_type) < 0 ||
        add_type(module, &hwtimer_timeout_spec, NULL, &st->timeout_type) < 0 ||
        add_type(module, &hwtimer_loop_timeout_spec, (PyObject *)st->timeout_type,
                 &st->loop_timeout_type) < 0 ||
        add_type(module, &hwtimer_periodic_spec, (PyObject *)st->timeout_type, &st->periodic_type) <
            0 ||
        add_type(module, &hwtimer_dispatch_spec, NULL, &st->dispatch_type) < 0 ||
        add_type(module, &hwtimer_loop_sink_spec, NULL, &st->loop_sink_type) < 0 ||
        add_type(module, &hwtimer_loop_delivery_spec, NULL, &st->loop_delivery_type) < 0 ||
        add_type(module, &hwtimer_done_spec, NULL, &st->done_type) < 0 ||
        add_type(module, &hwtimer_scope_spec, NULL, &st->scope_type) < 0 ||
        add_type(module, &hwtimer_manual_spec, (PyObject *)st->timer_type, &st->manual_type) < 0)
        return -1;
    if (add_ref(module, "HashedWheelTimer", (PyObject *)st->timer_type) < 0 ||
        add_ref(module, "Timeout", (PyObject *)st->timeout_type) < 0 ||
        add_ref(module, "TimeoutScope", (PyObject *)st->scope_type) < 0 ||
        add_ref(module, "_ManualTimer", (PyObject *)st->manual_type) < 0 ||
        PyModule_AddStringConstant(module, "_backend", HWT_SYS_BACKEND) < 0)
        return -1;
    st->empty_tuple = PyTuple_New(0);
    st->context_type = hwtimer_import_attr("contextvars", "Context");
    st->copy_context = hwtimer_import_attr("contextvars", "copy_context");
    st->empty_context = st->context_type ? PyObject_CallNoArgs(st->context_type) : NULL;
    st->context_run = st->context_type ? PyObject_GetAttrString(st->context_type, "run") : NULL;
    st->str_time = PyUnicode_InternFromString("time");
    st->str_get_loop = PyUnicode_InternFromString("get_loop");
    st->str_cancelling = PyUnicode_InternFromString("cancelling");
    st->str_cancel = PyUnicode_InternFromString("cancel");
    st->str_call_soon = PyUnicode_InternFromString("call_soon");
    if (!st->empty_tuple || !st->copy_context || !st->empty_context || !st->context_run ||
        !st->str_time || !st->str_get_loop || !st->str_cancelling || !st->str_cancel ||
        !st->str_call_soon)
        return -1;
    DoneObject *done = PyObject_New(DoneObject, st->done_type);
    if (!done)
        return -1;
    Py_INCREF(Py_None);
    done->value = Py_None;
    done->enter = false;
    done->spent = false;
    st->done_none = (PyObject *)done;
    st->rejected_error = PyErr_NewExceptionWithDoc(
        "hwtimer.RejectedExecutionError",
        "Raised by new_timeout() when the timer already holds max_pending_timeouts.",
        PyExc_RuntimeError, NULL);
    if (!st->rejected_error || add_ref(module, "RejectedExecutionError", st->rejected_error) < 0)
        return -1;
    PyObject *get_logger = hwtimer_import_attr("logging", "getLogger");
    st->logger = get_logger ? PyObject_CallFunction(get_logger, "s", "hwtimer") : NULL;
    Py_XDECREF(get_logger);
    st->thread_type = hwtimer_import_attr("threading", "Thread");
    st->timedelta_type = hwtimer_import_attr("datetime", "timedelta");
    st->run_task = PyObject_GetAttrString(module, "_run_task");
    st->threads_exiting_hook = PyObject_GetAttrString(module, "_threads_exiting");
    if (!st->logger || !st->thread_type || !st->timedelta_type || !st->run_task ||
        !st->threads_exiting_hook)
        return -1;
    PyObject *reg = hwtimer_import_attr("atexit", "register");
    if (!reg)
        return -1;
    PyObject *hook = PyObject_GetAttrString(module, "_stop_all");
    PyObject *r = hook ? PyObject_CallOneArg(reg, hook) : NULL;
    Py_XDECREF(hook);
    Py_DECREF(reg);
    if (!r)
        return -1;
    Py_DECREF(r);
    /* gc.callbacks keeps the hook, and through it the module, to the
       interpreter's end */
    PyObject *callbacks = hwtimer_import_attr("gc", "callbacks");
    hook = callbacks ? PyObject_GetAttrString(module, "_gc_hook") : NULL;
    int err = hook ? PyList_Append(callbacks, hook) : -1;
    Py_XDECREF(hook);
    Py_XDECREF(callbacks);
    return err;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    hwtimer_state *st = state_of_module(module);
#define VISIT_FIELD(type, name) Py_VISIT(st->name);
    HWTIMER_STATE_REFS(VISIT_FIELD)
#undef VISIT_FIELD
    return 0;
}

static int module_clear(PyObject *module)
{
    hwtimer_state *st = state_of_module(module);
    while (st->free_timeouts) {
        TimeoutObject *to = st->free_timeouts;
        st->free_timeouts = (TimeoutObject *)to->task;
        PyObject_GC_Del(to);
    }
    st->nfree = 0;
    st->untracked_held = NULL;
    st->all_loop_sinks = NULL;
#define CLEAR_FIELD(type, name) Py_CLEAR(st->name);
    HWTIMER_STATE_REFS(CLEAR_FIELD)
#undef CLEAR_FIELD
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef hwtimer_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hwtimer._hwtimer",
    .m_doc = "The C core of hwtimer: Netty's HashedWheelTimer.",
    .m_size = sizeof(hwtimer_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__hwtimer(void)
{
    return PyModuleDef_Init(&hwtimer_module);
}
