/*
 * loopsink.c: delivery of call_later() callbacks to an asyncio event loop.
 *
 * One sink per (timer, loop): the worker appends each tick's expired
 * callbacks for that loop to the sink and signals its wake fd (hwt_sys.h:
 * an eventfd or a pipe) once; the loop watches the fd with add_reader() and
 * runs the whole batch in its own thread.  A loop that cannot watch a file
 * descriptor (it has no add_reader, or add_reader raises
 * NotImplementedError, as Windows' Proactor loop and some custom loops do)
 * is served by a posting thread instead: it waits on the fd and hands
 * each batch over with one call_soon_threadsafe.  The thread holds the
 * sink (its delivery, below) only while the loop has no batch of it
 * posted: a loop left unclosed is collected with what was handed to it,
 * as one that watches the fd is.  When the
 * loop goes away (closed, which drops the wake fd's reader; collected; or
 * found closed) the sink is closed: what it held is released, the
 * timeouts it still has on the wheel are cancelled, and any that expire
 * meanwhile are released, not run.
 *
 * What the loop holds of the sink is its _LoopDelivery (the reader it
 * watches the fd with, or the batch posted to it, is a method of it),
 * which holds the sink and owns, for the cyclic GC, the callbacks handed
 * to the loop and not yet run: a loop's ready handles are the loop's.  The
 * sink itself is held by every timeout still on the wheel, which the GC
 * does not see: had the sink owned those handed over, one callback pending
 * for an hour would keep them, and the loop that they hold, for that hour
 * when the loop is left unclosed.
 */
#include "binding.h"

#include <errno.h>
#include <structmember.h>

/* The sink the weak reference `ref` refers to (a new reference), or NULL
   once it has gone. */
static LoopSinkObject *sink_of_ref(PyObject *ref)
{
#if defined(Py_LIMITED_API) || PY_VERSION_HEX >= 0x030D0000
    PyObject *s = NULL;
#ifdef Py_LIMITED_API
    s = PyObject_CallNoArgs(ref);
#else
    (void)PyWeakref_GetRef(ref, &s);
#endif
    if (!s) {
        PyErr_Clear(); /* calling a weak reference does not fail */
        return NULL;
    }
#else
    PyObject *s = PyWeakref_GetObject(ref);
    Py_INCREF(s);
#endif
    if (s == Py_None) {
        Py_DECREF(s);
        return NULL;
    }
    return (LoopSinkObject *)s;
}

/* The sink that entry `i` of a timer's list refers to (borrowed), or NULL
   once it has gone.  Used before anything that can run Python, or held. */
static LoopSinkObject *sink_at(PyObject *sinks, Py_ssize_t i)
{
    LoopSinkObject *s = sink_of_ref(PyList_GET_ITEM(sinks, i));
    /* an object that has other references: the weak reference gave it, so
       it is alive, and letting go of ours leaves it so */
    Py_XDECREF(s);
    return s;
}

/* What the posting thread runs on (its target is bound to its capsule),
   so that it never holds the delivery while the delivery holds what was
   delivered, which may hold the loop.  The sink holds it, to wake the thread.
   All of it is used with the GIL held. */
typedef struct LoopPoster {
    /* owned: the sink's, taken over when the thread was made; closed by
       the thread as it ends (or, if it never ran, when the sink lets go),
       so the thread never polls a closed (maybe reused) descriptor */
    hwt_wakefd wakefd;
    PyObject *sink_ref; /* owned weak reference to the sink */
    /* owned, or NULL: the sink's delivery, held for its loop (which holds
       the reader of a sink that watches the fd) while the loop has no
       _run() of it posted.  Let go of before each post, which the loop
       holds until it runs it; _run() gives it back once it returns, unless
       another is posted.  A loop left unclosed then holds the delivery
       only from within: it is collected with what was delivered to it. */
    PyObject *held;
    /* how many _run() calls posted to the loop it has yet to start: the
       loop holds the delivery through them, and the thread holds it
       whenever there is none, also while a batch waits for it to post */
    Py_ssize_t posted;
    /* hwtimer_forks when the thread was made: in a child of fork(), the
       thread is the parent's, and never lets go of `held` there */
    unsigned forks;
    bool done; /* the thread has ended (or never will start) */
    /* the thread's name as ps -T and /proc show it, set by the thread
       itself ("" if the name could not be encoded: it keeps its own) */
    char native_name[16];
} LoopPoster;

static const char poster_name[] = "hwtimer._loop_poster";

/* The sink's _run() has returned: the posting thread holds the delivery
   again, until it posts the next batch.  Not while the loop has another
   _run() posted, which holds the delivery till it runs.  A timeout
   delivered since the take does not count: the worker woke the thread for
   it, which has yet to post, and nothing else holds the delivery
   meanwhile. */
static void held_by_poster(LoopSinkObject *self)
{
    LoopPoster *p = self->post;
    if (!p || p->done || p->held || p->posted > 0 || self->closed || !self->delivery)
        return;
    Py_INCREF(self->delivery);
    p->held = self->delivery;
}

static int watch_post(LoopSinkObject *self, PyObject *run);
static PyObject *delivery_new(LoopSinkObject *sink);

/* The worker's wake-up for a loop: runs with the sink's lock held. */
static void loop_sink_wake(hwt_sink *s)
{
    hwt_wakefd_signal(s->wake_fd);
}

/* Returns whether the sink's loop is alive and not closed (as
   hwtimer_loop_closed() tells). */
static bool loop_is_open(LoopSinkObject *self)
{
    PyObject *loop = hwtimer_sink_loop(self);
    bool open = loop && !hwtimer_loop_closed(loop);
    Py_XDECREF(loop);
    return open;
}

/* Closes the wake fd; once a posting thread has it, wakes that thread
   instead, which ends once it sees the sink closed or gone, and closes
   the fd as it ends. */
static void close_fd(LoopSinkObject *self)
{
    LoopPoster *p = self->post;
    if (p && p->forks != hwtimer_forks) {
        /* a child of fork(): the thread is the parent's, which polls
           nothing here and never lets go of the poster (its stack, which
           holds it, is lost), so close the fd and let go of the delivery
           for it (every caller holds the sink, and has closed it) */
        p->done = true;
        hwt_wakefd_close(&p->wakefd);
        self->sink.wake_fd = -1;
        Py_CLEAR(p->held);
        return;
    }
    if (p) {
        /* the poster owns it: it outlives the sink or the thread, which
           closes it as it ends */
        if (p->wakefd.write_fd >= 0)
            hwt_wakefd_signal(p->wakefd.write_fd);
        return;
    }
    hwt_wakefd_close(&self->wakefd);
    self->sink.wake_fd = -1;
}

/* Stops deliveries to this sink and releases what it holds.  The wake fd
   stays open while a live loop may still watch it. */
static void sink_close(LoopSinkObject *self)
{
    if (self->closed)
        return;
    self->closed = true;
    hwtimer_release_chain(hwt_sink_close(&self->sink));
    /* Those still on the wheel will never run: cancel them, so that the
       worker lets go of them now rather than when they fall due. */
    for (LoopTimeoutObject *to = self->timeouts; to; to = to->sink_next) {
        /* ENOMEM leaves it pending: it is released when it falls due */
        (void)hwt_timeout_cancel(&to->base.node);
    }
}

/* Closes the sinks of a timer that is going away.  A loop still running
   is woken so that its _run() unregisters the wake fd in its own thread. */
void hwtimer_loop_sinks_close(PyObject *sinks)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sinks); i++) {
        LoopSinkObject *s = sink_at(sinks, i);
        if (!s || s->closed)
            continue;
        Py_INCREF(s); /* closing it and asking its loop run Python */
        sink_close(s);
        if (!s->posting && loop_is_open(s))
            loop_sink_wake(&s->sink);
        else
            close_fd(s);
        Py_DECREF(s);
    }
}

bool hwtimer_loop_sink_holds(TimerObject *timer, PyObject *loop)
{
    bool holds = false;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(timer->loop_sinks); i++) {
        LoopSinkObject *s = sink_at(timer->loop_sinks, i);
        if (!s || s->loop != loop || s->closed)
            continue;
        pthread_mutex_lock(&s->sink.lock);
        holds = s->sink.head != NULL;
        pthread_mutex_unlock(&s->sink.lock);
    }
    return holds;
}

Py_ssize_t hwtimer_loop_sinks_periodic(TimerObject *timer)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(timer->loop_sinks); i++) {
        LoopSinkObject *s = sink_at(timer->loop_sinks, i);
        if (!s || s->closed)
            continue;
        pthread_mutex_lock(&s->sink.lock);
        for (hwt_timeout *to = s->sink.head; to; to = hwt_timeout_of(to->link.next))
            n += hwt_timeout_periodic(to);
        pthread_mutex_unlock(&s->sink.lock);
    }
    return n;
}

void hwtimer_loop_sinks_stop_periodic(TimerObject *timer, PyObject *list)
{
    /* Each sink's list of live timeouts holds them all, wherever they
       are: held by the sink, taken by the loop's _run(), in their run.
       Delivered and not re-armed, a periodic one is RUNNING (or
       RUNNING_RESET), off the wheel, so stop()'s sweep missed it.  So is
       a call_later() one reset after it was handed over and before it
       ran: it is pending again.  One still RUNNING was handed over before
       the stop and runs.  Nothing in the walk runs Python, so the lists
       stay as they are meanwhile.  Handing an owned deadline to its loop
       does (is_closed(), call_soon_threadsafe()), and it may lose its last
       reference there: those are held in `moved`, and handed over after
       the walk.  `moved` is made first: a collection in PyList_New() runs
       finalizers. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *moved = PyList_New(0);
    PyErr_Clear(); /* out of memory: those deadlines are only cancelled */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(timer->loop_sinks); i++) {
        LoopSinkObject *s = sink_at(timer->loop_sinks, i);
        for (LoopTimeoutObject *to = s ? s->timeouts : NULL; to; to = to->sink_next) {
            uint32_t state = atomic_load(&to->base.node.state);
            if (to->grid.period == 0 && state == HWT_RUNNING_RESET && to->grid.owned) {
                /* the library's own deadline (a scope's, a sleep's): it
                   goes on on the loop, as one stop() swept does */
                if (hwt_timeout_cancel(&to->base.node) == HWT_OK && to->on_stop && moved &&
                    PyList_Append(moved, (PyObject *)to) < 0)
                    PyErr_Clear();
            } else if (state == HWT_RUNNING_RESET ||
                       (to->grid.period != 0 && state == HWT_RUNNING)) {
                hwtimer_stop_delivered(&to->base, list);
            }
        }
    }
    PyErr_Restore(type, value, tb);
    for (Py_ssize_t i = 0; moved && i < PyList_GET_SIZE(moved); i++) {
        LoopTimeoutObject *to = (LoopTimeoutObject *)PyList_GET_ITEM(moved, i);
        if (to->on_stop) /* else its owner has cancelled it meanwhile */
            hwtimer_loop_timeout_stopped(to);
    }
    Py_XDECREF(moved);
}

/* ---- running callbacks in the loop's thread ---- */

/* Has the loop run _run() again at its next turn, an exception set or
   not: through the wake fd it watches, or, when batches are posted, with
   call_soon (this is the loop's thread). */
static void run_again(LoopSinkObject *self)
{
    if (!self->posting) {
        loop_sink_wake(&self->sink);
        return;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *loop = hwtimer_sink_loop(self);
    /* the delivery is alive: this is its _run() */
    PyObject *run = loop && self->delivery ? PyObject_GetAttrString(self->delivery, "_run") : NULL;
    PyObject *r = run && watch_post(self, run) == 0
                      ? PyObject_CallMethod(loop, "call_soon", "O", run)
                      : NULL;
    if (r && self->post)
        self->post->posted++; /* runs after this one returns */
    if (loop && !r)
        PyErr_WriteUnraisable((PyObject *)self);
    Py_XDECREF(r);
    Py_XDECREF(run);
    Py_XDECREF(loop);
    PyErr_Restore(type, value, tb);
}

/* _run(): the loop's reader callback, or the callback posted to it. */
static PyObject *sink_run(LoopSinkObject *self)
{
    if (!self->posting && self->wakefd.read_fd >= 0) {
        int err = hwt_wakefd_drain(self->wakefd.read_fd);
        if (err) {
            hwtimer_core_error(NULL, err, "read the wake fd");
            return NULL;
        }
    }
    if (self->post && self->post->posted > 0)
        self->post->posted--; /* this is one that was posted */
    if (self->closed) {
        /* the timer is gone: unregister in this, the loop's, thread */
        PyObject *loop = hwtimer_sink_loop(self);
        if (loop && !self->posting && self->wakefd.read_fd >= 0) {
            PyObject *r = PyObject_CallMethod(loop, "remove_reader", "i", self->wakefd.read_fd);
            Py_XDECREF(r);
            PyErr_Clear();
        }
        Py_XDECREF(loop);
        close_fd(self);
        Py_RETURN_NONE;
    }
    hwt_timeout *node = hwt_sink_take(&self->sink);
    hwtimer_batch batch = HWTIMER_BATCH_INIT;
    while (node) {
        hwt_timeout *next = hwt_timeout_of(node->link.next);
        LoopTimeoutObject *to = (LoopTimeoutObject *)hwtimer_timeout_from_node(node);
        batch.last = !next;
        int r = hwtimer_run_timeout(TIMER_OF(&to->base), &to->base, &batch);
        hwtimer_timeout_track_if_held(&to->base);
        /* the last reference frees it and its callback, which may run
           Python code: the next callback begins after that */
        if (Py_REFCNT(to) == 1)
            batch.now = HWTIMER_UNREAD;
        Py_DECREF(to); /* the wheel's reference */
        if (r < 0) {
            /* the rest run at the loop's next turn, if it has one; a
               sink closed meanwhile (its posting thread ended, as a task
               ran) cancelled them, and nothing takes them from it */
            hwtimer_release_chain(hwt_sink_put_back(&self->sink, next));
            if (next && !self->closed)
                run_again(self);
            else
                held_by_poster(self);
            return NULL;
        }
        node = next;
    }
    held_by_poster(self);
    Py_RETURN_NONE;
}

/* _loop_gone(ref): the loop was collected. */
static PyObject *sink_loop_gone(LoopSinkObject *self, PyObject *ref)
{
    (void)ref;
    sink_close(self);
    close_fd(self);
    Py_RETURN_NONE;
}

static PyMethodDef loop_gone_def = {"_loop_gone", (PyCFunction)sink_loop_gone, METH_O, NULL};

/* _reader_gone(ref): the loop let go of the wake fd's reader, or of the
   _register() call it had yet to make.  A closed loop does (its selector
   goes, its ready calls with it), and it may never be collected: the
   callbacks pending for it can hold it.  Closing the sink cancels them,
   as closing a loop drops its own call_later() handles. */
static PyObject *sink_reader_gone(LoopSinkObject *self, PyObject *ref)
{
    (void)ref;
    if (!self->closed && !loop_is_open(self)) {
        sink_close(self);
        close_fd(self); /* a closed loop's selector is gone */
    }
    Py_RETURN_NONE;
}

static PyMethodDef reader_gone_def = {"_reader_gone", (PyCFunction)sink_reader_gone, METH_O,
                                      NULL};

/* _post_gone(ref): the loop let go of the latest _run() posted to it.
   One that ran counted itself out of `posted` first (those posted before
   it ran before it), and tells nothing: only one dropped unrun asks the
   loop whether it is closed. */
static PyObject *sink_post_gone(LoopSinkObject *self, PyObject *ref)
{
    if (self->post && self->post->posted > 0)
        return sink_reader_gone(self, ref);
    Py_RETURN_NONE;
}

static PyMethodDef post_gone_def = {"_post_gone", (PyCFunction)sink_post_gone, METH_O, NULL};

/* Watches `run`, the sink's _run() about to be posted to a loop that has
   no readers, as the reader of one that has is watched: a loop closed with
   it posted drops it unrun, and nothing else would tell.  Nothing takes
   the batch that it was to run, so the worker, which wakes the posting
   thread only for a batch that finds the sink empty, never wakes it for
   the next one.  The latest post is the one watched: the loop runs its
   posts in order, so one it dropped unrun is that one, or before it.
   Returns 0, or -1 with an exception. */
static int watch_post(LoopSinkObject *self, PyObject *run)
{
    PyObject *gone = PyCFunction_New(&post_gone_def, (PyObject *)self);
    PyObject *ref = gone ? PyWeakref_NewRef(run, gone) : NULL;
    Py_XDECREF(gone);
    if (!ref)
        return -1;
    Py_XSETREF(self->reader_ref, ref);
    return 0;
}

/* ---- finding or making the sink for a loop ---- */

/* Removes the closed and gone sinks from the list `sinks`, in place.
   Returns 0 or -1. */
static int drop_closed(PyObject *sinks)
{
    Py_ssize_t i = 0;
    while (i < PyList_GET_SIZE(sinks)) {
        LoopSinkObject *s = sink_at(sinks, i);
        if (s && !s->closed) {
            i++;
            continue;
        }
        /* what goes is a weak reference with no callback: this runs no
           Python */
        if (PyList_SetSlice(sinks, i, i + 1, NULL) < 0)
            return -1;
    }
    return 0;
}

/* Closes the sinks whose loop is gone or closed and drops them from the
   timer's list.  Asking a loop whether it is closed runs Python, and so
   does closing a sink (it releases what it held), so other threads add
   sinks meanwhile: the list is edited in place, never replaced, and the
   sinks looked at are held.  Returns 0 or -1. */
static int purge(TimerObject *timer)
{
    PyObject *sinks = timer->loop_sinks;
    Py_INCREF(sinks);
    PyObject *held = PyList_New(0);
    for (Py_ssize_t i = 0; held && i < PyList_GET_SIZE(sinks); i++) {
        LoopSinkObject *s = sink_at(sinks, i);
        if (s && PyList_Append(held, (PyObject *)s) < 0)
            Py_CLEAR(held);
    }
    if (!held) {
        Py_DECREF(sinks);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(held); i++) {
        LoopSinkObject *s = (LoopSinkObject *)PyList_GET_ITEM(held, i);
        if (!s->closed && !loop_is_open(s)) {
            sink_close(s);
            close_fd(s); /* a closed loop's selector is gone */
        }
    }
    Py_DECREF(held);
    int r = drop_closed(sinks);
    Py_DECREF(sinks);
    return r;
}

/* ---- the posting thread, for loops that cannot watch a descriptor ---- */

/* Whether the timer has stopped: nothing more will be delivered. */
static bool sink_finished(LoopSinkObject *self)
{
    pthread_mutex_lock(&self->sink.lock);
    bool finished = self->sink.finished;
    pthread_mutex_unlock(&self->sink.lock);
    return finished;
}

/* The posting thread's body, bound to the poster's capsule.  Waits on
   the wake fd with the GIL released and, for each wake-up (a batch that
   found the sink empty), posts the sink's _run() to the loop with one
   call_soon_threadsafe; until the sink is closed or gone, or the timer has
   stopped and its last batch is posted. */
static PyObject *sink_post(PyObject *capsule, PyObject *unused)
{
    (void)unused;
    LoopPoster *p = PyCapsule_GetPointer(capsule, poster_name);
    if (!p)
        return NULL;
    if (p->native_name[0])
        hwt_thread_set_name(p->native_name);
    int fd = p->wakefd.read_fd, err = 0;
    PyObject *type = NULL, *value = NULL, *tb = NULL; /* an error of its own */
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        err = hwt_wakefd_wait(fd);
        Py_END_ALLOW_THREADS
        if (err)
            break;
        LoopSinkObject *s = sink_of_ref(p->sink_ref);
        if (!s || s->closed) {
            Py_XDECREF(s);
            break;
        }
        bool finished = sink_finished(s);
        /* From here the loop holds the delivery, through the posted
           _run(), until it runs it.  Let go of before posting, which runs
           Python: the loop's thread may run _run() meanwhile, which holds
           the delivery for this thread again.  An open sink has one. */
        PyObject *delivery = s->delivery;
        Py_XINCREF(delivery);
        Py_CLEAR(p->held);
        PyObject *run = delivery ? PyObject_GetAttrString(delivery, "_run") : NULL;
        Py_XDECREF(delivery); /* `run` holds it */
        bool watched = run && watch_post(s, run) == 0;
        PyObject *loop = watched ? hwtimer_sink_loop(s) : NULL;
        /* counted before the loop can run it, which may be while posting */
        p->posted++;
        PyObject *r = loop ? PyObject_CallMethod(loop, "call_soon_threadsafe", "O", run) : NULL;
        if (!r)
            p->posted--;
        if (!watched)
            PyErr_Fetch(&type, &value, &tb);
        else if (!r)
            PyErr_Clear(); /* the loop is closed or gone: nobody will run them */
        Py_XDECREF(loop);
        Py_XDECREF(r);
        Py_XDECREF(run);
        Py_DECREF(s);
        if (!r || finished)
            break;
    }
    p->done = true;
    Py_CLEAR(p->held);
    LoopSinkObject *s = sink_of_ref(p->sink_ref);
    if (s && (err || type || !sink_finished(s)))
        sink_close(s); /* nothing watches it any more */
    /* The sink is closed, gone or finished: the worker signals the fd no
       more, and neither does the sink once it is closed here.  Closed now,
       not when the sink goes, which the handles of its timeouts delay. */
    hwt_wakefd_close(&p->wakefd);
    if (s)
        s->sink.wake_fd = -1;
    Py_XDECREF(s);
    if (err) {
        hwtimer_core_error(NULL, err, "wait on the wake fd");
        return NULL;
    }
    if (type) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef post_def = {"_post", (PyCFunction)sink_post, METH_NOARGS,
                               "Posts batches to a loop that has no readers."};

static void poster_free(PyObject *capsule)
{
    LoopPoster *p = PyCapsule_GetPointer(capsule, poster_name);
    if (!p)
        return;
    hwt_wakefd_close(&p->wakefd);
    Py_XDECREF(p->sink_ref);
    Py_XDECREF(p->held); /* NULL: a sink outlives its poster */
    PyMem_Free(p);
}

/* Returns a new poster's capsule for `self`, whose thread is to take the
   native name `native_name`, which does not own the wake fd yet, or NULL. */
static PyObject *poster_new(LoopSinkObject *self, const char native_name[16])
{
    LoopPoster *p = PyMem_Calloc(1, sizeof(LoopPoster));
    if (!p) {
        PyErr_NoMemory();
        return NULL;
    }
    p->wakefd.read_fd = p->wakefd.write_fd = -1;
    memcpy(p->native_name, native_name, sizeof p->native_name);
    p->done = true; /* until the thread is started */
    PyObject *capsule = PyCapsule_New(p, poster_name, poster_free);
    if (!capsule) {
        PyMem_Free(p);
        return NULL;
    }
    p->sink_ref = PyWeakref_NewRef((PyObject *)self, NULL);
    if (!p->sink_ref)
        Py_CLEAR(capsule);
    return capsule;
}

/* Starts the posting thread.  Returns 0, or -1 with an exception. */
static int start_poster(LoopSinkObject *self)
{
    hwtimer_state *st = hwtimer_state_of_type(Py_TYPE(self));
    /* The owner is borrowed, alive while the sink is open: its name is
       read before anything that can start a collection, which may free it
       (and close the sink; _post() then ends at once). */
    TimerObject *timer = self->sink.owner;
    PyObject *name = PyUnicode_FromFormat("%U-post", timer->name);
    /* best effort, as the dispatch thread's: a name that cannot be
       encoded leaves the thread with the name it has */
    char native_name[16] = "";
    if (name && hwtimer_native_helper_name(timer->name, "post", native_name) < 0)
        PyErr_Clear();
    PyObject *capsule = name ? poster_new(self, native_name) : NULL;
    PyObject *target = capsule ? PyCFunction_New(&post_def, capsule) : NULL;
    PyObject *kwargs =
        target ? Py_BuildValue("{s:O,s:O,s:O}", "target", target, "name", name, "daemon", Py_True)
               : NULL;
    PyObject *thread = kwargs ? PyObject_Call(st->thread_type, st->empty_tuple, kwargs) : NULL;
    /* Making the thread runs Python, and can collect the loop or the
       timer: a sink closed meanwhile has closed its wake fd, and has
       nothing to post.  The thread is not started: it would poll no
       descriptor for ever, holding the delivery. */
    bool closed = thread && self->closed;
    if (closed)
        Py_CLEAR(thread);
    if (thread) {
        /* the poster owns the wake fd from now on: the thread's, if it
           runs, else the sink's dealloc lets go of the last reference */
        LoopPoster *p = PyCapsule_GetPointer(capsule, poster_name);
        p->wakefd = self->wakefd;
        self->wakefd.read_fd = self->wakefd.write_fd = -1;
        self->poster = capsule;
        Py_INCREF(capsule);
        self->post = p;
        self->posting = true;
        p->done = false;
        p->forks = hwtimer_forks;
        Py_INCREF(self->delivery); /* its caller holds it */
        p->held = self->delivery;
    }
    /* start() can raise with the thread made (an exception while it waits
       for the thread to start): the thread, if it runs, ends at once, as
       the sink is closed, and lets go of the poster */
    PyObject *r = thread ? PyObject_CallMethod(thread, "start", NULL) : NULL;
    if (thread && !r) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        self->post->done = true;
        Py_CLEAR(self->post->held); /* the caller holds the delivery */
        PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(r);
    Py_XDECREF(thread);
    Py_XDECREF(kwargs);
    Py_XDECREF(target);
    Py_XDECREF(capsule);
    Py_XDECREF(name);
    return r || closed ? 0 : -1;
}

/* _register(): in the loop's thread, has the loop watch the wake fd, or,
   when it cannot (it has no add_reader, or add_reader raises
   NotImplementedError), starts the
   posting thread.  On failure the sink is closed: nothing would run its
   callbacks. */
static PyObject *sink_register(LoopSinkObject *self)
{
    if (self->posting)
        Py_RETURN_NONE; /* registered already */
    PyObject *loop = self->closed ? NULL : hwtimer_sink_loop(self);
    if (!loop) {
        /* closed, or the loop gone, before it got here: nothing watches it */
        sink_close(self);
        close_fd(self);
        Py_RETURN_NONE;
    }
    /* the reader is the loop's alone: watched, its loss tells of a close;
       its caller holds the delivery */
    PyObject *reader = PyObject_GetAttrString(self->delivery, "_run");
    PyObject *gone = reader ? PyCFunction_New(&reader_gone_def, (PyObject *)self) : NULL;
    PyObject *ref = gone ? PyWeakref_NewRef(reader, gone) : NULL;
    Py_XDECREF(gone);
    Py_XSETREF(self->reader_ref, ref);
    /* add_reader() keeps a copy of the current context for the reader,
       as long as the loop watches the fd: an empty one, not the first
       caller's, whose contextvars would live as long as the loop */
    hwtimer_state *st = hwtimer_state_of_type(Py_TYPE(self));
    PyObject *add = ref ? PyObject_GetAttrString(loop, "add_reader") : NULL;
    /* a loop with no add_reader() at all cannot watch the fd either */
    bool no_add = ref && !add && PyErr_ExceptionMatches(PyExc_AttributeError);
    PyObject *context = add ? HWT_NEW_CONTEXT(st) : NULL;
    PyObject *r = context ? PyObject_CallFunction(st->context_run, "OOiO", context, add,
                                                  self->wakefd.read_fd, reader)
                          : NULL;
    Py_XDECREF(context);
    Py_XDECREF(add);
    if (!r)
        Py_CLEAR(self->reader_ref); /* not the loop's: its end tells nothing */
    Py_XDECREF(reader);
    Py_DECREF(loop);
    if (!r && (no_add || PyErr_ExceptionMatches(PyExc_NotImplementedError))) {
        PyErr_Clear();
        if (self->closed) /* its timer went while add_reader ran */
            Py_RETURN_NONE;
        if (start_poster(self) == 0)
            Py_RETURN_NONE;
    }
    if (!r) {
        sink_close(self);
        close_fd(self);
    }
    return r;
}

/* Has `loop` start watching the sink: at once if it is the running loop,
   else from its own thread.  Returns 0 or -1. */
static int register_with_loop(hwtimer_state *st, LoopSinkObject *s, PyObject *loop)
{
    PyObject *running = st->get_running_loop ? PyObject_CallNoArgs(st->get_running_loop) : NULL;
    PyErr_Clear();
    PyObject *r;
    if (running == loop) {
        r = sink_register(s);
    } else {
        /* A loop closed before it calls _register() drops the call unmade:
           it never watches the fd, so no reader of its goes.  Watched as
           the reader is, the call's end tells of that close too (once
           made, _register() watches the reader instead). */
        PyObject *reg = PyObject_GetAttrString(s->delivery, "_register");
        PyObject *gone = reg ? PyCFunction_New(&reader_gone_def, (PyObject *)s) : NULL;
        PyObject *ref = gone ? PyWeakref_NewRef(reg, gone) : NULL;
        Py_XDECREF(gone);
        Py_XSETREF(s->reader_ref, ref);
        r = ref ? PyObject_CallMethod(loop, "call_soon_threadsafe", "O", reg) : NULL;
        if (!r)
            Py_CLEAR(s->reader_ref); /* not the loop's: its end tells nothing */
        Py_XDECREF(reg);
    }
    Py_XDECREF(running);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Returns the timer's open sink for `loop` (borrowed), or NULL. */
static LoopSinkObject *find_sink(TimerObject *timer, PyObject *loop)
{
    PyObject *sinks = timer->loop_sinks;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(sinks); i++) {
        LoopSinkObject *s = sink_at(sinks, i);
        /* a collected loop's sink was closed before its address was free */
        if (s && s->loop == loop && !s->closed)
            return s;
    }
    return NULL;
}

bool hwtimer_loop_has_sink(TimerObject *timer, PyObject *loop)
{
    return find_sink(timer, loop) != NULL;
}

int hwtimer_loop_check(PyObject *loop)
{
    int ok = hwtimer_has_method(loop, "call_soon_threadsafe");
    if (ok)
        return ok < 0 ? -1 : 0;
    PyErr_Format(PyExc_TypeError,
                 "loop must be an asyncio event loop or None, not %.200s"
                 " (no call_soon_threadsafe())",
                 hwtimer_type_name(Py_TYPE(loop)));
    return -1;
}

/* Returns a new open sink for `loop`, not yet registered anywhere, or
   NULL. */
static LoopSinkObject *sink_new(TimerObject *timer, PyObject *loop)
{
    LoopSinkObject *s = PyObject_GC_New(LoopSinkObject, timer->module_state->loop_sink_type);
    if (!s)
        return NULL;
    s->loop_ref = NULL;
    s->reader_ref = NULL;
    s->weakreflist = NULL;
    s->all_prev = s->all_next = NULL;
    s->loop = NULL;
    s->timeouts = NULL;
    s->delivery = NULL;
    s->owns_loop = false;
    s->closed = true; /* until it is set up */
    s->posting = false;
    s->poster = NULL;
    s->post = NULL;
    s->sink.timer = NULL;
    int err = hwt_wakefd_open(&s->wakefd);
    if (!err)
        err = hwt_sink_init(&s->sink, timer->core, loop_sink_wake, s->wakefd.write_fd, timer);
    /* a call_later() callback handed to the loop stays cancellable until
       it starts, as asyncio's handle is: delivered RUNNING, its run ends it */
    if (!err)
        s->sink.ends_once = true;
    if (err) {
        hwt_wakefd_close(&s->wakefd);
        s->sink.timer = NULL;
        Py_DECREF(s);
        hwtimer_core_error(timer, err, "deliver to the loop");
        return NULL;
    }
    hwt_timer_incref(timer->core); /* the sink lives on the core's list */
    hwtimer_state *st = timer->module_state;
    s->all_next = st->all_loop_sinks;
    if (st->all_loop_sinks)
        st->all_loop_sinks->all_prev = s;
    st->all_loop_sinks = s;
    s->closed = false;
    PyObject_GC_Track(s);
    PyObject *callback = PyCFunction_New(&loop_gone_def, (PyObject *)s);
    if (!callback)
        goto fail;
    s->loop_ref = PyWeakref_NewRef(loop, callback);
    Py_DECREF(callback);
    if (s->loop_ref) {
        s->loop = loop; /* borrowed: compared, never used once it is gone */
    } else if (PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear(); /* not weakly referenceable: keep it alive instead */
        Py_INCREF(loop);
        s->loop = loop;
        s->owns_loop = true;
    } else {
        goto fail;
    }
    return s;
fail:
    sink_close(s);
    close_fd(s);
    Py_DECREF(s);
    return NULL;
}

LoopSinkObject *hwtimer_loop_sink_for(TimerObject *timer, PyObject *loop)
{
    LoopSinkObject *s = find_sink(timer, loop);
    if (s) {
        Py_INCREF(s);
        return s;
    }
    /* Each step below may run Python, in which another thread can make the
       sink for this loop: look again after each, so a loop has one sink. */
    if (hwtimer_loop_check(loop) < 0 || purge(timer) < 0)
        return NULL;
    if ((s = find_sink(timer, loop)) != NULL) {
        Py_INCREF(s);
        return s;
    }
    LoopSinkObject *made = sink_new(timer, loop);
    if (!made)
        return NULL;
    /* held here until the loop holds it (or the posting thread does) */
    PyObject *delivery = delivery_new(made);
    if (!delivery) {
        sink_close(made);
        close_fd(made);
        Py_DECREF(made);
        return NULL;
    }
    if ((s = find_sink(timer, loop)) != NULL) {
        Py_DECREF(delivery); /* closes `made` */
        Py_DECREF(made);
        Py_INCREF(s);
        return s;
    }
    /* listed before registering, which runs Python */
    PyObject *listed = PyWeakref_NewRef((PyObject *)made, NULL);
    int appended = listed ? PyList_Append(timer->loop_sinks, listed) : -1;
    Py_XDECREF(listed);
    if (appended < 0 || register_with_loop(timer->module_state, made, loop) < 0) {
        sink_close(made);
        close_fd(made);
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        Py_DECREF(delivery);
        if (drop_closed(timer->loop_sinks) < 0)
            PyErr_Clear();
        PyErr_Restore(type, value, tb);
        Py_DECREF(made);
        return NULL;
    }
    /* a loop that let go of it already (closed meanwhile) closes the sink:
       the caller finds it closed */
    Py_DECREF(delivery);
    return made;
}

/* ---- GC and deallocation ---- */

void hwtimer_loop_sinks_track_delivered(hwtimer_state *st)
{
    /* Tracking runs no Python: the chain of sinks stays as it is. */
    for (LoopSinkObject *s = st->all_loop_sinks; s; s = s->all_next) {
        if (!s->sink.timer)
            continue;
        pthread_mutex_lock(&s->sink.lock);
        for (hwt_timeout *node = s->sink.head; node; node = hwt_timeout_of(node->link.next)) {
            PyObject *to = (PyObject *)TIMEOUT_OF(node);
            if (!PyObject_GC_IsTracked(to))
                PyObject_GC_Track(to);
        }
        pthread_mutex_unlock(&s->sink.lock);
    }
}

static int sink_traverse(LoopSinkObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->loop_ref);
    Py_VISIT(self->reader_ref);
    if (self->owns_loop)
        Py_VISIT(self->loop);
    /* not the timeouts delivered here: its delivery shows them */
    return 0;
}

static int sink_clear(LoopSinkObject *self)
{
    if (self->sink.timer)
        sink_close(self);
    Py_CLEAR(self->loop_ref);
    Py_CLEAR(self->reader_ref);
    if (self->owns_loop) {
        self->owns_loop = false;
        Py_CLEAR(self->loop);
    }
    self->loop = NULL; /* borrowed, and maybe freed in the same collection */
    return 0;
}

static void sink_dealloc(LoopSinkObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    hwtimer_state *st = hwtimer_state_of_type(tp);
    if (self->all_prev)
        self->all_prev->all_next = self->all_next;
    else if (st->all_loop_sinks == self)
        st->all_loop_sinks = self->all_next;
    if (self->all_next)
        self->all_next->all_prev = self->all_prev;
    sink_clear(self);
    if (self->sink.timer) {
        sink_close(self);
        close_fd(self); /* wakes the posting thread: the sink is gone */
        hwt_timer *core = self->sink.timer;
        hwt_sink_destroy(&self->sink);
        hwt_timer_decref(core);
    }
    /* after the core let go of the sink, which signalled its fd */
    self->post = NULL;
    Py_CLEAR(self->poster);
    HWT_TP_FREE(tp)(self);
    Py_DECREF(tp);
}

static PyMemberDef sink_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(LoopSinkObject, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot sink_slots[] = {
    {Py_tp_new, hwtimer_new_refused}, {Py_tp_dealloc, sink_dealloc},
    {Py_tp_traverse, sink_traverse},  {Py_tp_clear, sink_clear},
    {Py_tp_members, sink_members},    {0, NULL},
};

PyType_Spec hwtimer_loop_sink_spec = {
    .name = "hwtimer._LoopSink",
    .basicsize = sizeof(LoopSinkObject),
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = sink_slots,
};

/* ---- the delivery: what the loop holds of the sink ---- */

/* The loop's hold on a sink: the reader it watches the fd with, the
   _register() call it is to make, and the batches posted to it are
   methods of it.  It holds the sink, and owns, for the cyclic GC, the
   callbacks delivered to the loop that it has not run (the sink does not:
   the timeouts on the wheel hold the sink, unseen by the GC).  The sink
   is closed when it goes: nothing would run what is delivered there. */
typedef struct LoopDeliveryObject {
    PyObject_HEAD
    LoopSinkObject *sink; /* owned */
} LoopDeliveryObject;

/* Returns the delivery of `sink`, which has none yet (a new reference),
   or NULL. */
static PyObject *delivery_new(LoopSinkObject *sink)
{
    hwtimer_state *st = hwtimer_state_of_type(Py_TYPE(sink));
    LoopDeliveryObject *d = PyObject_GC_New(LoopDeliveryObject, st->loop_delivery_type);
    if (!d)
        return NULL;
    Py_INCREF(sink);
    d->sink = sink;
    sink->delivery = (PyObject *)d;
    PyObject_GC_Track(d);
    return (PyObject *)d;
}

static PyObject *delivery_run(LoopDeliveryObject *self, PyObject *unused)
{
    (void)unused;
    LoopSinkObject *sink = self->sink;
    if (!sink)
        Py_RETURN_NONE;
    Py_INCREF(sink); /* the loop may let go of this delivery meanwhile */
    PyObject *r = sink_run(sink);
    Py_DECREF(sink);
    return r;
}

static PyObject *delivery_register(LoopDeliveryObject *self, PyObject *unused)
{
    (void)unused;
    LoopSinkObject *sink = self->sink;
    if (!sink)
        Py_RETURN_NONE;
    Py_INCREF(sink);
    PyObject *r = sink_register(sink);
    Py_DECREF(sink);
    return r;
}

static int delivery_traverse(LoopDeliveryObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    LoopSinkObject *sink = self->sink;
    Py_VISIT((PyObject *)sink);
    /* The timeouts delivered to the sink and not yet taken by _run() are
       the loop's, as its ready handles are: they often hold the loop,
       which holds this.  The collection's start tracked them
       (hwtimer_loop_sinks_track_delivered); the worker only adds to the
       chain meanwhile, and what it adds, untracked, is seen as held from
       outside. */
    int r = 0;
    if (sink && sink->sink.timer) {
        pthread_mutex_lock(&sink->sink.lock);
        for (hwt_timeout *node = sink->sink.head; node && !r;
             node = hwt_timeout_of(node->link.next))
            r = visit((PyObject *)TIMEOUT_OF(node), arg);
        pthread_mutex_unlock(&sink->sink.lock);
    }
    return r;
}

/* Closes the sink: releases the delivered timeouts, which traverse
   showed, and cancels those still on the wheel.  The sink itself stays
   held: those hold it too. */
static int delivery_clear(LoopDeliveryObject *self)
{
    LoopSinkObject *sink = self->sink;
    if (sink && sink->sink.timer && !sink->closed) {
        Py_INCREF(sink);
        sink_close(sink);
        close_fd(sink);
        Py_DECREF(sink);
    }
    return 0;
}

static void delivery_dealloc(LoopDeliveryObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    delivery_clear(self);
    LoopSinkObject *sink = self->sink;
    self->sink = NULL;
    if (sink && sink->delivery == (PyObject *)self)
        sink->delivery = NULL;
    Py_XDECREF(sink);
    HWT_TP_FREE(tp)(self);
    Py_DECREF(tp);
}

static PyMethodDef delivery_methods[] = {
    {"_run", (PyCFunction)delivery_run, METH_NOARGS, "Runs the callbacks delivered to this loop."},
    {"_register", (PyCFunction)delivery_register, METH_NOARGS,
     "Starts the loop's watch on the sink."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot delivery_slots[] = {
    {Py_tp_new, hwtimer_new_refused},    {Py_tp_dealloc, delivery_dealloc},
    {Py_tp_traverse, delivery_traverse}, {Py_tp_clear, delivery_clear},
    {Py_tp_methods, delivery_methods},   {0, NULL},
};

PyType_Spec hwtimer_loop_delivery_spec = {
    .name = "hwtimer._LoopDelivery",
    .basicsize = sizeof(LoopDeliveryObject),
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_HAVE_GC,
    .slots = delivery_slots,
};
