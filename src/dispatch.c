/*
 * dispatch.c: hwtimer._Dispatch, the object whose run() is the body of a
 * timer's dispatch thread: a Python thread that waits for batches of
 * expired timeouts with the GIL released and runs each batch under one
 * acquisition of the GIL.  It shares the core with its timer, so it can
 * outlive the HashedWheelTimer.
 */
#include "binding.h"

#include <errno.h>
#include <unistd.h>

/* The dispatcher whose thread this is, if it is a dispatch thread. */
_Thread_local DispatchObject *hwtimer_this_thread_dispatch;

/* Lets whoever waits in hwtimer_dispatch_wait_done() go.  In a child of
   fork() (a task forked, and the child goes on as this thread's copy)
   nobody waits there, and the lock may have been held by a thread of the
   parent at the fork: it is not taken. */
void hwtimer_dispatch_mark_done(DispatchObject *self)
{
    if (self->pid != getpid()) {
        self->done = true;
        return;
    }
    pthread_mutex_lock(&self->lock);
    self->done = true;
    pthread_cond_broadcast(&self->done_cond);
    pthread_mutex_unlock(&self->lock);
}

static PyObject *dispatch_run(DispatchObject *self, PyObject *unused)
{
    (void)unused;
    if (self->abandoned) /* the timer is not started, or has another one */
        Py_RETURN_NONE;
    self->thread_id = PyThread_get_thread_ident();
    hwtimer_this_thread_dispatch = self;
    if (self->native_name[0])
        hwt_thread_set_name(self->native_name);
    hwt_sink *default_sink = hwt_timer_default_sink(self->core);
    for (;;) {
        bool finished;
        hwt_timeout *batch;
        /* Woken for released timeouts that a producer took meanwhile, it
           waits again without touching the GIL. */
        Py_BEGIN_ALLOW_THREADS
        do /* held[1]: for a fork() from here until the batch has run */
            batch = hwt_sink_wait(default_sink, &finished, &self->held[1]);
        while (!batch && !finished && !hwt_timer_has_released(self->core));
        Py_END_ALLOW_THREADS
        /* what producers did not take in passing */
        hwtimer_release_handed_back(self->core);
        if (finished)
            break;
        hwtimer_run_batch(default_sink, batch, true, self->held);
        self->held[0] = self->held[1] = NULL;
        if (self->pid != getpid())
            break; /* a task forked: the timer's worker is the parent's */
    }
    /* Python code may still run on this thread (a finalizer, a profile
       hook) once this returns and the dispatcher is gone: no stop()
       there must take it for the dispatch thread it was. */
    hwtimer_this_thread_dispatch = NULL;
    hwtimer_dispatch_mark_done(self);
    Py_RETURN_NONE;
}

/* Whether `thread`, the dispatch thread's Thread (None once collected),
   will never run run(): it has ended, or it is this thread.  Not started
   yet (no ident), it may still.  Returns 1, 0, or -1 with an exception:
   its checks run Python code (Thread.ident, is_alive()), and with it the
   signal handlers, whose KeyboardInterrupt must reach stop()'s caller. */
static int thread_never_runs(PyObject *thread)
{
    if (thread == Py_None)
        return 1; /* collected: it ended */
    PyObject *ident = PyObject_GetAttrString(thread, "ident");
    if (!ident)
        return -1;
    int never = 0;
    if (ident != Py_None) {
        unsigned long id = PyLong_AsUnsignedLong(ident);
        if (id == (unsigned long)-1 && PyErr_Occurred()) {
            never = -1;
        } else if (id == PyThread_get_thread_ident()) {
            never = 1;
        } else {
            PyObject *alive = PyObject_CallMethod(thread, "is_alive", NULL);
            int is_alive = alive ? PyObject_IsTrue(alive) : -1;
            Py_XDECREF(alive);
            never = is_alive < 0 ? -1 : !is_alive;
        }
    }
    Py_DECREF(ident);
    return never;
}

/* Whether the dispatch thread will never run run(): it has not entered it
   and either it has ended (a profile or trace hook of threading's raised
   before the call, and the thread died), or this is that thread (such a
   hook calls stop()), or this thread is the one starting it (a signal
   handler, hook or finalizer that runs as start() makes the Thread calls
   stop(): the thread may not exist yet, and waiting for it here would
   keep it from ever starting).  If so it is marked abandoned and done:
   run() returns at once if it is ever called, and stop() runs what
   expired here.  Called with the GIL.  Returns 1, 0, or -1 with an
   exception (thread_never_runs()); with one set already, it asks
   nothing. */
static int never_runs(DispatchObject *self)
{
    if (self->thread_id || self->done || PyErr_Occurred())
        return 0;
    if (self->starter != PyThread_get_thread_ident()) {
        if (!self->thread_ref)
            return 0;
        PyObject *thread = PyObject_CallNoArgs(self->thread_ref);
        int never = thread ? thread_never_runs(thread) : -1;
        Py_XDECREF(thread);
        if (never <= 0 || self->thread_id) /* the checks ran Python code */
            return never < 0 ? -1 : 0;
    }
    self->abandoned = true;
    pthread_mutex_lock(&self->lock);
    self->done = true;
    pthread_mutex_unlock(&self->lock);
    return 1;
}

/* Waits, with the GIL released, until the dispatch thread has run its
   last batch, running signal handlers meanwhile.  Returns 0, or -1 with
   what a handler raised (KeyboardInterrupt).  Returns 0 at once on the
   dispatch thread itself, and in a child of fork(), where that thread
   does not exist (nor, maybe, whoever held the lock at the fork). */
int hwtimer_dispatch_wait_done(DispatchObject *self)
{
    if (self->thread_id == PyThread_get_thread_ident())
        return 0;
    if (self->pid != getpid()) {
        self->done = true;
        return 0;
    }
    for (;;) {
        int never = never_runs(self);
        if (never)
            return never < 0 ? -1 : 0;
        bool done;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->lock);
        if (!self->done)
            hwt_cond_wait_until(&self->done_cond, &self->lock,
                                hwt_monotonic_ns(NULL) + HWTIMER_SIGNAL_POLL_NS);
        done = self->done;
        pthread_mutex_unlock(&self->lock);
        Py_END_ALLOW_THREADS
        if (done)
            return 0;
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

static void dispatch_dealloc(DispatchObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->synced) {
        pthread_cond_destroy(&self->done_cond);
        pthread_mutex_destroy(&self->lock);
    }
    Py_XDECREF(self->name);
    Py_XDECREF(self->thread_ref);
    hwt_timer_decref(self->core);
    HWT_TP_FREE(tp)(self);
    Py_DECREF(tp);
}

static PyMethodDef dispatch_methods[] = {
    {"run", (PyCFunction)dispatch_run, METH_NOARGS, "Runs expired tasks until the timer stops."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot dispatch_slots[] = {
    {Py_tp_new, hwtimer_new_refused},
    {Py_tp_dealloc, dispatch_dealloc},
    {Py_tp_methods, dispatch_methods},
    {0, NULL},
};

PyType_Spec hwtimer_dispatch_spec = {
    .name = "hwtimer._Dispatch",
    .basicsize = sizeof(DispatchObject),
    .flags = HWTIMER_TPFLAGS,
    .slots = dispatch_slots,
};

/* Returns a new dispatch object sharing `timer`'s core, or NULL. */
DispatchObject *hwtimer_dispatch_new(TimerObject *timer)
{
    PyTypeObject *tp = timer->module_state->dispatch_type;
    DispatchObject *d = PyObject_New(DispatchObject, tp);
    if (!d)
        return NULL;
    d->core = timer->core;
    hwt_timer_incref(d->core);
    d->done = false;
    d->thread_id = 0;
    d->abandoned = false;
    d->pid = getpid();
    d->waits_on = NULL;
    d->held[0] = d->held[1] = NULL;
    d->thread_ref = NULL;
    d->starter = 0;
    d->name = PyUnicode_FromFormat("%U-dispatch", timer->name);
    /* Best effort: a name that cannot be encoded leaves the thread as it
       is, since ps and gdb showing a default name is no reason to fail a
       start. */
    d->native_name[0] = '\0';
    if (d->name && hwtimer_native_helper_name(timer->name, "dispatch", d->native_name) < 0)
        PyErr_Clear();
    int err = pthread_mutex_init(&d->lock, NULL);
    /* on the monotonic clock: stop() waits in slices to handle signals */
    if (!err && (err = hwt_cond_init(&d->done_cond)) != 0)
        pthread_mutex_destroy(&d->lock);
    d->synced = !err;
    if (err) {
        Py_DECREF(d);
        hwtimer_core_error(timer, err, "start the dispatch thread");
        return NULL;
    }
    if (!d->name) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}
