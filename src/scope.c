/*
 * scope.c: hwtimer.TimeoutScope, the async context manager behind
 * hwtimer.timeout() and timeout_at(): asyncio.timeout() with its deadline
 * on a HashedWheelTimer.
 *
 * Entering and leaving a scope whose deadline does not pass is the hot
 * path of every request, so it is C: __aenter__ and __aexit__ return an
 * awaitable that is already done instead of starting a coroutine, and the
 * deadline goes straight onto the wheel.  What differs between Python
 * versions (Task.cancelling() and uncancel() arrived in 3.11) and the rare
 * exit of an expired scope are Python functions of hwtimer._asyncio, handed
 * over once by _setup_scopes().
 */
#include "binding.h"

#include <math.h>

enum { CREATED, ENTERED, EXPIRING, EXPIRED, EXITED };
static const char *const phase_names[] = {"created", "active", "expiring", "expired", "finished"};

/* ---- an awaitable that is done: `await` gives its value at once ---- */

static PyObject *done_await(DoneObject *self)
{
    Py_INCREF(self);
    return (PyObject *)self;
}

static int scope_bind(ScopeObject *self);

/* Marks an awaitable that was to enter its scope as done with, as a
   coroutine is once it has run, been closed or been thrown into. */
static void done_spend(DoneObject *self)
{
    if (self->enter) {
        self->enter = false;
        self->spent = true;
    }
}

static PyObject *done_next(DoneObject *self)
{
    if (self->spent) {
        /* awaiting it again must not hand back a scope it never entered */
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited coroutine");
        return NULL;
    }
    if (self->enter) {
        /* __aenter__()'s work is done when it is awaited, as a coroutine's
           would be: in the task (or not) that awaits it */
        done_spend(self);
        if (scope_bind((ScopeObject *)self->value) < 0)
            return NULL;
    }
    if (self->value != Py_None)
        PyErr_SetObject(PyExc_StopIteration, self->value);
    return NULL; /* with no exception set: StopIteration(None) */
}

/* send(), throw() and close(), for code that drives an awaitable as a
   coroutine.  Each behaves as on a coroutine that has not started. */
static PyObject *done_send(DoneObject *self, PyObject *value)
{
    if (value != Py_None && self->enter) {
        PyErr_SetString(PyExc_TypeError, "can't send non-None value to a just-started coroutine");
        return NULL;
    }
    PyObject *r = done_next(self);
    if (!r && !PyErr_Occurred())
        PyErr_SetNone(PyExc_StopIteration);
    return r;
}

static PyObject *done_throw(DoneObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "throw() takes an exception, and maybe a value and tb");
        return NULL;
    }
    PyObject *typ = args[0], *val = nargs > 1 ? args[1] : Py_None;
    PyObject *tb = nargs > 2 ? args[2] : Py_None;
    /* refused, as a coroutine refuses them: not thrown in, nothing spent */
    if (!PyExceptionInstance_Check(typ) && !PyExceptionClass_Check(typ)) {
        PyErr_SetString(PyExc_TypeError,
                        "exceptions must be classes or instances deriving from BaseException");
        return NULL;
    }
    if (PyExceptionInstance_Check(typ) && val != Py_None) {
        PyErr_SetString(PyExc_TypeError, "instance exception may not have a separate value");
        return NULL;
    }
    if (tb != Py_None && !PyTraceBack_Check(tb)) {
        PyErr_SetString(PyExc_TypeError, "throw() third argument must be a traceback object");
        return NULL;
    }
    done_spend(self);
    if (PyExceptionInstance_Check(typ))
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    else
        PyErr_SetObject(typ, val);
    return NULL;
}

static PyObject *done_close(DoneObject *self, PyObject *unused)
{
    (void)unused;
    done_spend(self);
    Py_RETURN_NONE;
}

static PyMethodDef done_methods[] = {
    {"send", (PyCFunction)done_send, METH_O, NULL},
    {"throw", (PyCFunction)(void (*)(void))done_throw, METH_FASTCALL, NULL},
    {"close", (PyCFunction)done_close, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

/* Not tracked by the cyclic GC: it holds a scope, which holds nothing of
   it, and lives for one `await`. */
static void done_dealloc(DoneObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    Py_CLEAR(self->value);
    HWT_TP_FREE(tp)(self);
    Py_DECREF(tp);
}

static PyType_Slot done_slots[] = {
    {Py_tp_new, hwtimer_new_refused},
    {Py_tp_dealloc, done_dealloc},
    {Py_tp_iter, PyObject_SelfIter},
    {Py_tp_iternext, done_next},
    {Py_am_await, done_await},
    {Py_tp_methods, done_methods},
    {0, NULL},
};

PyType_Spec hwtimer_done_spec = {
    .name = "hwtimer._Done",
    .basicsize = sizeof(DoneObject),
    .flags = HWTIMER_TPFLAGS,
    .slots = done_slots,
};

/* Returns a new awaitable done with `value`, or NULL. */
static PyObject *done_new(hwtimer_state *st, PyObject *value)
{
    DoneObject *d = PyObject_New(DoneObject, st->done_type);
    if (!d)
        return NULL;
    Py_INCREF(value);
    d->value = value;
    d->enter = false;
    d->spent = false;
    return (PyObject *)d;
}

/* ---- the scope ---- */

static hwtimer_state *scope_state(ScopeObject *self)
{
    return hwtimer_state_of_type(Py_TYPE(self));
}

/* obj.name(*args) for an interned name, without a bound method. */
static PyObject *call_method(PyObject *obj, PyObject *name, PyObject *arg)
{
#ifdef Py_LIMITED_API
    return PyObject_CallMethodObjArgs(obj, name, arg, NULL); /* a NULL `arg` ends the list */
#else
    PyObject *args[2] = {obj, arg};
    return PyObject_VectorcallMethod(name, args, (arg ? 2 : 1) | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     NULL);
#endif
}

/* loop.call_at(when, callback, context=context): where a deadline goes
   when the scopes follow the loop's own clock.  Returns the handle or NULL. */
static PyObject *call_at(PyObject *loop, double when, PyObject *callback, PyObject *context)
{
    PyObject *method = PyObject_GetAttrString(loop, "call_at");
    PyObject *args = method ? Py_BuildValue("(dO)", when, callback) : NULL;
    PyObject *kwargs = args ? Py_BuildValue("{s:O}", "context", context) : NULL;
    PyObject *handle = kwargs ? PyObject_Call(method, args, kwargs) : NULL;
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
    Py_XDECREF(method);
    return handle;
}

/* The clock the scope's deadline runs on, in ns: a ManualTimer's own
   clock, which only advance() moves, else CLOCK_MONOTONIC (loop.time()). */
static int64_t timer_clock_ns(TimerObject *timer)
{
    return timer->manual ? atomic_load(&timer->manual_now) : hwt_monotonic_ns(NULL);
}

static PyMethodDef timer_stopped_def, on_timeout_def;

/* The delay from now to `when` (loop.time()), in *delay; `now` is the
   loop's time at the scope's creation, or NaN.  Returns 0 or -1. */
static int scope_delay(ScopeObject *self, TimerObject *timer, bool on_loop, double now,
                       double when, double *delay_out)
{
    hwtimer_state *st = scope_state(self);
    double delay;
    if (!isnan(now) && !on_loop) {
        /* loop.time() now, from that at creation plus what the timer's
           clock has moved since: the scope may be entered long after it
           was made, and its deadline stays creation + delay on that clock.
           On a ManualTimer that is its own clock, which the loop's does not
           follow.  (Following the loop, its time() is read below: a
           fake-time loop's clock jumps, the monotonic one does not.) */
        double elapsed = (double)(timer_clock_ns(timer) - self->created_ns) / 1e9;
        /* The deadline _after() set is its delay on from creation, exactly:
           taken back out of loop.time() + delay, it can come out an ulp
           over, one ns late once rounded up, and a tick late on its end. */
        delay = when == now + self->created_delay ? self->created_delay - elapsed
                                                   : when - (now + elapsed);
    } else {
        PyObject *now_o = call_method(self->loop, st->str_time, NULL);
        if (!now_o)
            return -1;
        now = PyFloat_AsDouble(now_o);
        Py_DECREF(now_o);
        if (now == -1.0 && PyErr_Occurred())
            return -1;
        delay = when - now;
    }
    *delay_out = delay;
    return 0;
}

/* Puts the deadline `when` (loop.time()) on the wheel, or, if it has
   passed, on the loop for its next iteration, as asyncio does; following
   the loop's clock, or once its timer stopped under it, the deadline goes
   to the loop's call_at().  Returns 0 or -1. */
static int scope_schedule(ScopeObject *self, double when)
{
    hwtimer_state *st = scope_state(self);
    double now = self->created_at;
    self->created_at = Py_NAN; /* good for the first deadline only */
    if (!self->timer && !(self->timer = PyObject_CallNoArgs(st->default_timer)))
        return -1;
    TimerObject *timer = (TimerObject *)self->timer;
    bool on_loop = (st->follow_loop_time && !timer->manual) || self->on_loop;
    double delay;
    if (scope_delay(self, timer, on_loop, now, when, &delay) < 0)
        return -1;
    if (delay > 0 && !on_loop &&
        !(hwt_timer_started(timer->core) && hwtimer_loop_has_sink(timer, self->loop))) {
        /* The first deadline on this timer, or on this loop, starts the
           timer or makes the loop's sink: done before the delay is taken,
           not between that and the schedule, which reads the clock again,
           else the deadline lands that much later (a tick later than an
           equal one scheduled after it, in another scope) */
        LoopSinkObject *sink = hwtimer_loop_prepare(timer, self->loop);
        if (!sink)
            return -1;
        Py_DECREF(sink);
        if (scope_delay(self, timer, on_loop, now, when, &delay) < 0)
            return -1;
    }
    /* On the wheel the scope itself is the callback, run in an empty
       context: no bound method, no copy of the context.  On the loop it is
       _on_timeout(), so that scope_expire() knows where a call comes from. */
    PyObject *callback = (PyObject *)self;
    if (delay > 0 && !on_loop)
        Py_INCREF(callback);
    else if (!(callback = PyCFunction_New(&on_timeout_def, (PyObject *)self)))
        return -1;
    PyObject *handle = NULL;
    if (!(delay > 0)) {
        handle = call_method(self->loop, st->str_call_soon, callback);
    } else if (on_loop) {
        /* an empty context of its own, as on the wheel (hwtimer_loop_call):
           a context is entered by one thread at a time, and another loop's
           deadline may be running in a shared one */
        PyObject *context = HWT_NEW_CONTEXT(st);
        handle = context ? call_at(self->loop, when, callback, context) : NULL;
        Py_XDECREF(context);
    } else {
        /* made first: nothing that runs Python may come between the
           schedule and its on_stop, or a stop() could sweep it unseen */
        PyObject *on_stop = PyCFunction_New(&timer_stopped_def, (PyObject *)self);
        int64_t delay_ns;
        if (on_stop && hwtimer_delay_from_seconds(delay, "delay", &delay_ns) == 0)
            handle = hwtimer_call_later(timer, delay_ns, callback,
                                        st->empty_tuple, self->loop, st->empty_context);
        if (handle) {
            ((LoopTimeoutObject *)handle)->on_stop = on_stop; /* the reference moves */
            ((LoopTimeoutObject *)handle)->grid.owned = 1;
        } else {
            Py_XDECREF(on_stop);
        }
    }
    Py_DECREF(callback);
    if (!handle)
        return -1;
    Py_XSETREF(self->handle, handle);
    return 0;
}

/* scope_schedule() of the deadline the scope holds (self->when, a number):
   as it was read when given, not read again, which would run its
   __float__ again (that may raise, or say NaN, or another time). */
static int scope_schedule_when(ScopeObject *self)
{
    return scope_schedule(self, self->when_s);
}

/* Cancels the pending deadline, if any. */
static int scope_unschedule(ScopeObject *self)
{
    PyObject *handle = self->handle;
    if (!handle)
        return 0;
    self->handle = NULL;
    int r = 0;
    if (PyObject_TypeCheck(handle, scope_state(self)->timeout_type)) {
        TimeoutObject *to = (TimeoutObject *)handle;
        hwtimer_loop_timeout_drop_on_stop((LoopTimeoutObject *)to);
        int err = hwt_timeout_cancel(&to->node);
        if (err != HWT_OK && err != HWT_EFINAL)
            r = hwtimer_core_error(TIMER_OF(to), err, "cancel the scope's deadline");
    } else {
        PyObject *res = call_method(handle, scope_state(self)->str_cancel, NULL);
        r = res ? 0 : -1;
        Py_XDECREF(res);
    }
    Py_DECREF(handle);
    return r;
}

/* Reads a deadline or delay: a number, not a bool (which is refused as
   by new_timeout() and sleep()), not NaN; an int past any float is
   infinite, as for new_timeout().  Returns 0 or -1. */
static int check_deadline(PyObject *obj, const char *what, double *out)
{
    if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj) || PyIndex_Check(obj) ||
                               HWT_HAS_FLOAT(obj))) {
        PyErr_Format(PyExc_TypeError, "%s must be a number, not %.200s", what,
                     hwtimer_type_name(Py_TYPE(obj)));
        return -1;
    }
    double d = hwtimer_as_seconds(obj);
    if (d == -1.0 && PyErr_Occurred() && hwtimer_huge_seconds(obj, &d) < 0)
        return -1;
    if (isnan(d)) {
        PyErr_Format(PyExc_ValueError, "%s must not be NaN", what);
        return -1;
    }
    *out = d;
    return 0;
}

/* What a scope keeps as its deadline `when`, read as `w` by
   check_deadline(): `when` itself, or the infinity an int past any float
   reads as.  A new reference, or NULL. */
static PyObject *deadline_kept(PyObject *when, double w)
{
    if (when != Py_None && isinf(w) && !PyFloat_Check(when))
        return PyFloat_FromDouble(w);
    Py_INCREF(when);
    return when;
}

/* Returns 0 if `timer` is a timer or None, or -1 with TypeError. */
static int require_timer(hwtimer_state *st, PyObject *timer)
{
    if (timer == Py_None || PyObject_TypeCheck(timer, st->timer_type))
        return 0;
    PyErr_Format(PyExc_TypeError, "timer must be a HashedWheelTimer or None, not %.200s",
                 hwtimer_type_name(Py_TYPE(timer)));
    return -1;
}

static int scope_init(ScopeObject *self, PyObject *args, PyObject *kwds)
{
    static const char *const names[] = {"when", "timer"};
    static const hwtimer_signature sig = {
        .fname = "TimeoutScope", .names = names, .nparams = 2, .nkeyword_only = 1, .nrequired = 1};
    PyObject *given[2];
    if (hwtimer_bind_tuple(&sig, args, kwds, given) < 0)
        return -1;
    PyObject *when = given[0], *timer = given[1] ? given[1] : Py_None;
    hwtimer_state *st = scope_state(self);
    double w = 0;
    /* read as reschedule() reads it */
    if (when != Py_None && check_deadline(when, "when", &w) < 0)
        return -1;
    if (require_timer(st, timer) < 0)
        return -1;
    if (self->phase != CREATED || self->task) {
        PyErr_SetString(PyExc_RuntimeError, "TimeoutScope is already initialised");
        return -1;
    }
    PyObject *kept = deadline_kept(when, w);
    if (!kept)
        return -1;
    Py_XSETREF(self->when, kept);
    self->when_s = w;
    Py_XSETREF(self->timer, timer == Py_None ? NULL : (Py_INCREF(timer), timer));
    self->created_at = Py_NAN;
    return 0;
}

/* TimeoutScope._after(seconds, timer): a scope due `seconds` from now on
   the running loop, which it keeps; timeout()'s fast path.  The timer (None:
   default_timer()) is chosen now, and its clock read now, as the deadline
   is fixed now: a ManualTimer's clock may move before the scope is entered. */
static PyObject *scope_after(PyTypeObject *tp, PyObject *const *args, Py_ssize_t nargs)
{
    hwtimer_state *st = hwtimer_state_of_type(tp);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_after() takes seconds and timer");
        return NULL;
    }
    double seconds;
    if (check_deadline(args[0], "delay", &seconds) < 0)
        return NULL;
    PyObject *timer = args[1];
    if (require_timer(st, timer) < 0)
        return NULL;
    /* timeout() takes no loop=: asyncio.timeout()'s words */
    PyObject *loop = hwtimer_running_loop(st, "no running event loop");
    if (!loop)
        return NULL;
    if (timer == Py_None)
        timer = PyObject_CallNoArgs(st->default_timer);
    else
        Py_INCREF(timer);
    if (!timer) {
        Py_DECREF(loop);
        return NULL;
    }
    PyObject *now_o = call_method(loop, st->str_time, NULL);
    double now = now_o ? PyFloat_AsDouble(now_o) : -1.0;
    Py_XDECREF(now_o);
    ScopeObject *self = NULL;
    if (!(now == -1.0 && PyErr_Occurred()))
        self = (ScopeObject *)HWT_TP_ALLOC(tp)(tp, 0);
    if (self) {
        self->when = PyFloat_FromDouble(now + seconds);
        self->when_s = now + seconds;
        self->created_at = now;
        self->created_delay = seconds;
        self->created_ns = timer_clock_ns((TimerObject *)timer);
        self->loop = loop;
        loop = NULL;
        self->timer = timer;
        timer = NULL;
        if (!self->when)
            Py_CLEAR(self);
    }
    Py_XDECREF(timer);
    Py_XDECREF(loop);
    return (PyObject *)self;
}

static PyObject *scope_when(ScopeObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *when = self->when ? self->when : Py_None;
    Py_INCREF(when);
    return when;
}

static PyObject *scope_expired(ScopeObject *self, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(self->phase == EXPIRING || self->phase == EXPIRED);
}

/* Schedules the deadline the scope holds on the loop's clock, with the
   error set by a timer that refused it (another thread may take the place
   a reschedule's cancel freed, while loop.time() runs): the scope keeps
   the deadline that when() names.  Should the loop refuse it too, the
   scope has no deadline, and says so.  Clears the error either way. */
static void restore_on_loop(ScopeObject *self)
{
    PyErr_Clear();
    bool was_on_loop = self->on_loop;
    self->on_loop = true;
    if (scope_schedule_when(self) < 0) {
        PyErr_Clear();
        Py_INCREF(Py_None);
        Py_SETREF(self->when, Py_None);
    }
    self->on_loop = was_on_loop;
}

static PyObject *scope_reschedule(ScopeObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    /* `when` by position or by name, as asyncio's Timeout.reschedule() */
    static const char *const names[] = {"when"};
    static const hwtimer_signature sig = {
        .fname = "reschedule", .names = names, .nparams = 1, .nrequired = 1};
    PyObject *when;
    if (hwtimer_bind_one(&sig, args, nargs, kwnames, &when) < 0)
        return NULL;
    if (self->phase != ENTERED) {
        if (self->phase == CREATED)
            PyErr_SetString(PyExc_RuntimeError, "TimeoutScope has not been entered");
        else
            PyErr_Format(PyExc_RuntimeError, "Cannot change state of %s TimeoutScope",
                         phase_names[self->phase]);
        return NULL;
    }
    double w = 0;
    if (when != Py_None && check_deadline(when, "when", &w) < 0)
        return NULL;
    if (when != Py_None) {
        /* A deadline is set from the thread of the scope's running loop,
           as asyncio's reschedule() requires: one already due goes to the
           loop's call_soon() (or, on its clock, call_at()), which another
           thread's call would not wake. */
        PyObject *running = hwtimer_running_loop(scope_state(self), "no running event loop");
        if (!running)
            return NULL;
        Py_DECREF(running); /* only compared */
        if (running != self->loop) {
            PyErr_SetString(PyExc_RuntimeError,
                            "reschedule() must be called in the thread of the TimeoutScope's "
                            "running event loop");
            return NULL;
        }
    }
    PyObject *kept = deadline_kept(when, w);
    if (!kept)
        return NULL;
    PyObject *old_when = self->when; /* the reference moves here */
    double old_when_s = self->when_s;
    bool had_deadline = self->handle != NULL;
    self->when = kept;
    self->when_s = w;
    /* its timer stopped under it (maybe just now, its on_stop yet to
       come): the deadline goes on on the loop's clock */
    if (self->timer && hwt_timer_stopped(((TimerObject *)self->timer)->core))
        self->on_loop = true;
    if (scope_unschedule(self) < 0)
        goto refused;
    if (when == Py_None || scope_schedule(self, w) == 0)
        goto done;
    /* A stop() in another thread since the look above (it stops the core
       without the GIL) refuses the deadline on the wheel: it goes on on
       the loop's clock, as after any stop. */
    if (self->on_loop || !self->timer || !hwt_timer_stopped(((TimerObject *)self->timer)->core) ||
        !PyErr_ExceptionMatches(PyExc_RuntimeError))
        goto refused;
    PyErr_Clear();
    self->on_loop = true;
    if (scope_schedule(self, w) < 0)
        goto refused;
done:
    Py_XDECREF(old_when);
    Py_RETURN_NONE;
refused:
    /* The new deadline was refused (RejectedExecutionError from a full
       timer): the scope keeps the deadline it had, or none, rather than
       saying it has the new one or losing both.  The old one's place on
       the timer was freed by its cancel, so it is scheduled again there
       (or on the loop at once, if it has passed). */
    {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        Py_XSETREF(self->when, old_when);
        self->when_s = old_when_s;
        if (had_deadline && !self->handle && old_when && old_when != Py_None &&
            scope_schedule_when(self) < 0)
            restore_on_loop(self);
        PyErr_Restore(type, value, tb); /* the error to report is the refusal */
    }
    return NULL;
}

/* Returns the task's count of pending cancel requests, or -1. */
static Py_ssize_t task_cancelling(hwtimer_state *st, PyObject *task)
{
    PyObject *r = st->cancelling_hook ? PyObject_CallOneArg(st->cancelling_hook, task)
                                      : call_method(task, st->str_cancelling, NULL);
    if (!r)
        return -1;
    Py_ssize_t n = PyLong_AsSsize_t(r);
    Py_DECREF(r);
    return n;
}

/* Enters the scope in the current task: what awaiting __aenter__() does.
   Returns 0 or -1. */
static int scope_bind(ScopeObject *self)
{
    hwtimer_state *st = scope_state(self);
    if (self->phase != CREATED) {
        PyErr_SetString(PyExc_RuntimeError, "TimeoutScope has already been entered");
        return -1;
    }
    /* The task running on this thread's loop: not current_task() of the
       loop timeout() found, which may be another loop, not running or
       running another task in another thread. */
    PyObject *task = PyObject_CallNoArgs(st->current_task);
    if (!task)
        return -1;
    if (task == Py_None) {
        Py_DECREF(task);
        PyErr_SetString(PyExc_RuntimeError, "TimeoutScope should be used inside a task");
        return -1;
    }
    PyObject *loop = call_method(task, st->str_get_loop, NULL);
    Py_ssize_t cancelling = loop ? task_cancelling(st, task) : -1;
    if (cancelling < 0) {
        Py_DECREF(task);
        Py_XDECREF(loop);
        return -1;
    }
    /* what a refused deadline puts back: the scope stays one not entered */
    PyObject *made_on = self->loop; /* _after()'s loop, or NULL */
    bool had_timer = self->timer != NULL;
    double created_at = self->created_at;
    self->phase = ENTERED;
    self->loop = loop;
    Py_XSETREF(self->task, task);
    self->cancelling = cancelling;
    if (st->cancelling_hook) {
        /* no Task.uncancel(): a cancellation the task took before it
           entered, in its context chain, must not pass for a newer one */
        PyObject *type, *handled, *tb;
        PyErr_GetExcInfo(&type, &handled, &tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        Py_XSETREF(self->handled, handled);
    }
    if (self->when && self->when != Py_None) {
        if (scope_schedule_when(self) < 0) {
            /* The timer refused the deadline (stopped, or full): the
               block is not entered, __aexit__ will not be called, and the
               scope must not stay entered, holding the task, refusing a
               new entry for "already entered" and taking a reschedule()
               that would cancel a task no longer in it. */
            self->phase = CREATED;
            self->created_at = created_at;
            loop = self->loop;
            self->loop = made_on;
            Py_DECREF(loop);
            Py_CLEAR(self->task);
            Py_CLEAR(self->handled);
            if (!had_timer)
                Py_CLEAR(self->timer);
            return -1;
        }
    }
    Py_XDECREF(made_on);
    return 0;
}

static PyObject *scope_aenter(ScopeObject *self, PyObject *unused)
{
    (void)unused;
    if (self->phase != CREATED) {
        PyErr_SetString(PyExc_RuntimeError, "TimeoutScope has already been entered");
        return NULL;
    }
    DoneObject *d = (DoneObject *)done_new(scope_state(self), (PyObject *)self);
    if (d)
        d->enter = true;
    return (PyObject *)d;
}

static PyObject *scope_aexit(ScopeObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    hwtimer_state *st = scope_state(self);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "__aexit__ takes exc_type, exc and tb");
        return NULL;
    }
    int phase = self->phase;
    if (phase != ENTERED && phase != EXPIRING) {
        PyErr_Format(PyExc_RuntimeError, "Cannot exit %s TimeoutScope", phase_names[phase]);
        return NULL;
    }
    if (scope_unschedule(self) < 0)
        return NULL;
    PyObject *task = self->task, *handled = self->handled; /* the references move here */
    self->task = self->handled = NULL;
    if (phase == ENTERED) {
        self->phase = EXITED;
        Py_XDECREF(task);
        Py_XDECREF(handled);
        Py_INCREF(st->done_none);
        return st->done_none;
    }
    self->phase = EXPIRED;
    /* The deadline cancelled the task: turn that into TimeoutError, if the
       cancellation is this scope's alone. */
    PyObject *cancelling = PyLong_FromSsize_t(self->cancelling);
    PyObject *r = cancelling ? PyObject_CallFunctionObjArgs(st->exit_expired_hook, task, cancelling,
                                                            args[0], args[1],
                                                            handled ? handled : Py_None, NULL)
                             : NULL;
    Py_XDECREF(cancelling);
    Py_XDECREF(task);
    Py_XDECREF(handled);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_INCREF(st->done_none);
    return st->done_none;
}

/* Cancels the task: the deadline passed, on the wheel (`from_wheel`) or
   on the loop's clock.  A wheel timeout whose cancel() came too late (it
   had expired and was on its way to the loop) still calls back, also
   when the deadline has moved to the loop since: only the current
   deadline's call counts, on the wheel once it has expired.  (A handle
   of the loop that was cancelled never runs.) */
static PyObject *scope_expire(ScopeObject *self, bool from_wheel)
{
    hwtimer_state *st = scope_state(self);
    PyObject *handle = self->handle;
    if (!handle || self->phase != ENTERED)
        Py_RETURN_NONE; /* the block was left, or its deadline moved */
    bool on_wheel = PyObject_TypeCheck(handle, st->timeout_type);
    if (on_wheel != from_wheel ||
        (on_wheel && atomic_load(&((TimeoutObject *)handle)->node.state) != HWT_EXPIRED))
        Py_RETURN_NONE;
    self->handle = NULL;
    Py_DECREF(handle);
    PyObject *r = st->cancel_hook ? PyObject_CallOneArg(st->cancel_hook, self->task)
                                  : call_method(self->task, st->str_cancel, NULL);
    if (!r)
        return NULL;
    Py_DECREF(r);
    self->phase = EXPIRING;
    Py_RETURN_NONE;
}

static PyObject *scope_on_timeout(ScopeObject *self, PyObject *unused)
{
    (void)unused;
    return scope_expire(self, false);
}

static PyMethodDef on_timeout_def = {"_on_timeout", (PyCFunction)scope_on_timeout, METH_NOARGS,
                                     NULL};

/* The on_stop of the scope's deadline on the wheel: its timer stopped
   before it was due (called in the loop's thread, `remaining` seconds
   before it, on the timer's clock).  The deadline, and any later one,
   goes to the loop's call_at(): at `when` itself on the loop's clock,
   which a real timer's follows; a ManualTimer's clock is its own, so
   there the time left on it goes on on the loop's. */
static PyObject *scope_timer_stopped(ScopeObject *self, PyObject *remaining_o)
{
    hwtimer_state *st = scope_state(self);
    double remaining = PyFloat_AsDouble(remaining_o);
    if (remaining == -1.0 && PyErr_Occurred())
        return NULL;
    PyObject *handle = self->handle;
    /* the scope drops a deadline it cancels itself: one still held that
       is cancelled is the one stop() swept */
    if (self->phase != ENTERED || !handle || !PyObject_TypeCheck(handle, st->timeout_type) ||
        atomic_load(&((TimeoutObject *)handle)->node.state) != HWT_CANCELLED)
        Py_RETURN_NONE;
    self->on_loop = true;
    if (isinf(remaining))
        Py_RETURN_NONE; /* never due: the wheel's HWT_NEVER */
    double when;
    if (((TimerObject *)self->timer)->manual) {
        PyObject *now_o = call_method(self->loop, st->str_time, NULL);
        when = now_o ? PyFloat_AsDouble(now_o) : -1.0;
        Py_XDECREF(now_o);
        if (when == -1.0 && PyErr_Occurred())
            return NULL;
        when += remaining;
    } else {
        when = self->when_s;
    }
    if (scope_unschedule(self) < 0 || scope_schedule(self, when) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef timer_stopped_def = {"_timer_stopped", (PyCFunction)scope_timer_stopped,
                                        METH_O, NULL};

/* Calling a scope is the expiry of its deadline on the wheel: it is that
   deadline's callback. */
static PyObject *scope_call(ScopeObject *self, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) || (kwargs && PyDict_GET_SIZE(kwargs))) {
        PyErr_SetString(PyExc_TypeError, "a TimeoutScope is called without arguments");
        return NULL;
    }
    return scope_expire(self, true);
}

static PyObject *scope_repr(ScopeObject *self)
{
    const char *name = phase_names[self->phase];
    if (self->phase != ENTERED)
        return PyUnicode_FromFormat("<TimeoutScope [%s]>", name);
    if (!self->when || self->when == Py_None)
        return PyUnicode_FromFormat("<TimeoutScope [%s] when=None>", name);
    char *text = PyOS_double_to_string(self->when_s, 'f', 3, 0, NULL);
    if (!text)
        return NULL;
    PyObject *r = PyUnicode_FromFormat("<TimeoutScope [%s] when=%s>", name, text);
    PyMem_Free(text);
    return r;
}

static int scope_traverse(ScopeObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->when);
    Py_VISIT(self->timer);
    Py_VISIT(self->task);
    Py_VISIT(self->loop);
    Py_VISIT(self->handle);
    Py_VISIT(self->handled);
    return 0;
}

static int scope_clear(ScopeObject *self)
{
    Py_CLEAR(self->when);
    Py_CLEAR(self->timer);
    Py_CLEAR(self->task);
    Py_CLEAR(self->loop);
    Py_CLEAR(self->handle);
    Py_CLEAR(self->handled);
    return 0;
}

static void scope_dealloc(ScopeObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    scope_clear(self);
    HWT_TP_FREE(tp)(self);
    Py_DECREF(tp);
}

static PyMethodDef scope_methods[] = {
    {"_after", (PyCFunction)(void (*)(void))scope_after, METH_FASTCALL | METH_CLASS,
     "_after($type, seconds, timer, /)\n--\n\nA scope due `seconds` from now on the running "
     "loop."},
    {"when", (PyCFunction)scope_when, METH_NOARGS,
     "when($self, /)\n--\n\nThe current deadline on loop.time(), or None."},
    {"expired", (PyCFunction)scope_expired, METH_NOARGS,
     "expired($self, /)\n--\n\nWhether the deadline passed while the block ran."},
    {"reschedule", (PyCFunction)(void (*)(void))scope_reschedule, METH_FASTCALL | METH_KEYWORDS,
     "reschedule($self, /, when)\n--\n\nMoves the deadline to `when` (absolute, on loop.time()); "
     "None removes it."},
    {"__aenter__", (PyCFunction)scope_aenter, METH_NOARGS, "__aenter__($self, /)\n--\n\n"},
    {"__aexit__", (PyCFunction)(void (*)(void))scope_aexit, METH_FASTCALL,
     "__aexit__($self, exc_type, exc, tb, /)\n--\n\n"},
    {"_on_timeout", (PyCFunction)scope_on_timeout, METH_NOARGS,
     "_on_timeout($self, /)\n--\n\nCancels the task: the deadline has passed on the loop's clock."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot scope_slots[] = {
    {Py_tp_doc, "TimeoutScope(when, *, timer=None)\n--\n\n"
                "Async context manager that cancels the block it guards once its deadline "
                "(on loop.time()) has passed, and raises TimeoutError out of it: "
                "asyncio.timeout() with the deadline on a HashedWheelTimer.  Made by "
                "hwtimer.timeout() and hwtimer.timeout_at()."},
    {Py_tp_init, scope_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, scope_dealloc},
    {Py_tp_traverse, scope_traverse},
    {Py_tp_clear, scope_clear},
    {Py_tp_repr, scope_repr},
    {Py_tp_call, scope_call},
    {Py_tp_methods, scope_methods},
    {0, NULL},
};

PyType_Spec hwtimer_scope_spec = {
    .name = "hwtimer.TimeoutScope",
    .basicsize = sizeof(ScopeObject),
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = scope_slots,
};
