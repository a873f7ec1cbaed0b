/*
 * binding.h: the Python side of hwtimer, shared by the files of the
 * extension module hwtimer._hwtimer.  Every pointer says who owns it.
 *
 * One file per type, and files that depend one way: each file below uses
 * only the files listed under it (tests/test_layout.py checks the
 * hwtimer_* names each one defines and uses against this list), and the
 * sections of this header follow the same order, bottom first.
 *
 * layers (top first):
 *   module.c       the module: its state, init, the atexit hook
 *   scope.c        hwtimer.TimeoutScope, and _Done, the awaitable its
 *                  __aenter__ and __aexit__ return (one file: _Done's
 *                  first step binds the scope it enters)
 *   manual.c       _ManualTimer, the base of hwtimer.testing.ManualTimer
 *   timer.c        hwtimer.HashedWheelTimer
 *   monitor.c      stats() and pending_snapshot()
 *   dispatch.c     _Dispatch, whose run() is a dispatch thread's body
 *   loopsink.c     _LoopSink and _LoopDelivery: call_later() to an event loop
 *   runner.c       the task runner every consumer runs timeouts with
 *   looptimeout.c  _LoopTimeout, call_later()'s and call_every()'s Timeout
 *   timeout.c      hwtimer.Timeout, and _PeriodicTimeout (one file: it is
 *                  a Timeout with a period, sharing every slot)
 *   common.c       helpers: argument parsing, the clock, logging
 * end of layers
 */
#ifndef HWTIMER_BINDING_H
#define HWTIMER_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <sys/types.h>

#include "hwt.h"
#include "hwt_sys.h"

/* ---- the limited API ----
 * HWTIMER_LIMITED_API=1 builds with Py_LIMITED_API=0x030A0000: one abi3
 * extension for CPython 3.10 and every later version.  3.10 is the oldest
 * base: PyType_FromModuleAndSpec() and PyType_GetModuleState(), without
 * which a type cannot reach its module's state, joined the stable ABI in
 * 3.10 (3.9's headers declare them, its stable ABI does not hold them),
 * and so did METH_FASTCALL.  What the limited API lacks is defined here
 * from what it has, so that the files read the same in both builds; where
 * the full API is faster the default build keeps it. */
#ifdef Py_LIMITED_API
/* borrowed references and no-fail sizes, as the macros give them */
#define PyTuple_GET_SIZE(t)       PyTuple_Size(t)
#define PyTuple_GET_ITEM(t, i)    PyTuple_GetItem(t, i)
#define PyTuple_SET_ITEM(t, i, v) ((void)PyTuple_SetItem(t, i, v))
#define PyList_GET_SIZE(l)        PyList_Size(l)
#define PyList_GET_ITEM(l, i)     PyList_GetItem(l, i)
#define PyList_SET_ITEM(l, i, v)  ((void)PyList_SetItem(l, i, v))
#define PyDict_GET_SIZE(d)        PyDict_Size(d)
#define PyFloat_AS_DOUBLE(f)      PyFloat_AsDouble(f)
/* Py_SETREF and Py_XSETREF: `dst` takes `src`, then its old value is
   dropped with `decref` */
#define HWT_SETREF(dst, src, decref)                                                               \
    do {                                                                                           \
        PyObject *_hwt_old = (PyObject *)(dst);                                                    \
        (dst) = (src);                                                                             \
        decref(_hwt_old);                                                                          \
    } while (0)
#define Py_SETREF(dst, src)  HWT_SETREF(dst, src, Py_DECREF)
#define Py_XSETREF(dst, src) HWT_SETREF(dst, src, Py_XDECREF)

/* None, True and False returned with a reference: the headers of CPython
   3.12.0 to 3.13.0 return them without one whatever limited API is asked
   for, as they are immortal there, but not on 3.10 and 3.11, which the
   abi3 extension serves too (there each call would take one of theirs). */
#undef Py_RETURN_NONE
#undef Py_RETURN_TRUE
#undef Py_RETURN_FALSE
#define Py_RETURN_NONE  return Py_NewRef(Py_None)
#define Py_RETURN_TRUE  return Py_NewRef(Py_True)
#define Py_RETURN_FALSE return Py_NewRef(Py_False)

/* No vectorcall before 3.12's limited API: a call through a tuple. */
static inline PyObject *PyObject_CallOneArg(PyObject *callable, PyObject *arg)
{
    return PyObject_CallFunctionObjArgs(callable, arg, NULL);
}

/* The type's slots, read through PyType_GetSlot(): the limited API does
   not show PyTypeObject's fields (and reads static types' from 3.10). */
#define HWT_TP_ALLOC(tp) ((allocfunc)PyType_GetSlot((tp), Py_tp_alloc))
#define HWT_TP_FREE(tp)  ((freefunc)PyType_GetSlot((tp), Py_tp_free))
#define HWT_HAS_FLOAT(o) (PyType_GetSlot(Py_TYPE(o), Py_nb_float) != NULL)
#define HWT_CALLABLE(o)  PyCallable_Check(o)
/* The type's __name__, for error messages: valid until this thread's next
   call (or "?" if the name cannot be read). */
const char *hwtimer_type_name(PyTypeObject *tp);
/* contextvars through Python: the limited API has no PyContext_* */
#define HWT_COPY_CONTEXT(st)  PyObject_CallNoArgs((st)->copy_context)
#define HWT_IS_CONTEXT(st, o) Py_IS_TYPE((o), (PyTypeObject *)(st)->context_type)
#define HWT_NEW_CONTEXT(st)   PyObject_CallNoArgs((st)->context_type)
#else
#define HWT_COPY_CONTEXT(st)  PyContext_CopyCurrent()
#define HWT_IS_CONTEXT(st, o) PyContext_CheckExact(o)
#define HWT_NEW_CONTEXT(st)   PyContext_New()
#define HWT_TP_ALLOC(tp)      ((tp)->tp_alloc)
#define HWT_TP_FREE(tp)       ((tp)->tp_free)
#define HWT_HAS_FLOAT(o)      (Py_TYPE(o)->tp_as_number && Py_TYPE(o)->tp_as_number->nb_float)
#define HWT_CALLABLE(o)       (Py_TYPE(o)->tp_call != NULL) /* PyCallable_Check(), inline */
#define hwtimer_type_name(tp) ((tp)->tp_name)
#endif

/* The flags of every type: immutable where the version has the flag
   (3.10+), as CPython's own heap types are, so that no one can patch a
   method of a type that every interpreter thread shares. */
#ifdef Py_TPFLAGS_IMMUTABLETYPE
#define HWTIMER_TPFLAGS (Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE)
#else
#define HWTIMER_TPFLAGS Py_TPFLAGS_DEFAULT
#endif

typedef struct TimerObject TimerObject;
typedef struct TimeoutObject TimeoutObject;

/* The module state's references, each owned, declared once: the struct,
   module_traverse() and module_clear() expand this list, so that none of
   them can miss a field.  X(type, name) for each. */
#define HWTIMER_STATE_REFS(X)                                                                      \
    /* its types */                                                                                \
    X(PyTypeObject, timer_type)                                                                    \
    X(PyTypeObject, timeout_type)                                                                  \
    X(PyTypeObject, loop_timeout_type)                                                             \
    X(PyTypeObject, periodic_type) /* new_periodic()'s Timeout */                                  \
    X(PyTypeObject, dispatch_type)                                                                 \
    X(PyTypeObject, loop_sink_type)                                                                \
    X(PyTypeObject, loop_delivery_type)                                                            \
    X(PyTypeObject, done_type)                                                                     \
    X(PyTypeObject, scope_type)                                                                    \
    X(PyTypeObject, manual_type) /* hwtimer._hwtimer._ManualTimer */                               \
    X(PyObject, rejected_error)  /* RejectedExecutionError */                                      \
    /* what it takes from other modules */                                                         \
    X(PyObject, logger)               /* logging.getLogger("hwtimer") */                           \
    X(PyObject, thread_type)          /* threading.Thread */                                       \
    X(PyObject, timedelta_type)       /* datetime.timedelta */                                     \
    X(PyObject, get_running_loop)     /* imported on first call_later */                           \
    X(PyObject, run_task)             /* _run_task, submitted to executors */                      \
    X(PyObject, threads_exiting_hook) /* _threads_exiting */                                       \
    /* shared constants */                                                                         \
    X(PyObject, done_none) /* a _Done of None */                                                   \
    X(PyObject, empty_tuple)                                                                       \
    X(PyObject, empty_context) /* where scope deadlines run */                                     \
    X(PyObject, context_type)  /* contextvars.Context */                                           \
    X(PyObject, copy_context)  /* contextvars.copy_context */                                      \
    X(PyObject, context_run)   /* contextvars.Context.run */                                       \
    /* from _setup_scopes(); NULL until hwtimer._asyncio is imported, the                          \
       hooks also NULL where tasks have cancelling() (3.11+) */                                    \
    X(PyObject, default_timer)                                                                     \
    X(PyObject, current_task)                                                                      \
    X(PyObject, cancelling_hook)                                                                   \
    X(PyObject, cancel_hook)                                                                       \
    X(PyObject, exit_expired_hook)                                                                 \
    /* interned method names */                                                                    \
    X(PyObject, str_time)                                                                          \
    X(PyObject, str_get_loop)                                                                      \
    X(PyObject, str_cancelling)                                                                    \
    X(PyObject, str_cancel)                                                                        \
    X(PyObject, str_call_soon)

typedef struct {
#define HWTIMER_STATE_FIELD(type, name) type *name;
    HWTIMER_STATE_REFS(HWTIMER_STATE_FIELD)
#undef HWTIMER_STATE_FIELD
    TimerObject *running_timers; /* borrowed: started, not stopped */
    Py_ssize_t nrunning; /* of running_timers, those not manual */
    /* borrowed: stopped by a stop() that a signal interrupted, whose
       dispatch thread no stop() has seen finish yet */
    TimerObject *stopping_timers;
    pid_t too_many_logged_by; /* the process that logged the ERROR for them, or 0 */
    TimeoutObject *free_timeouts; /* owned, unlinked memory of released
                                     Timeouts, chained through `task` */
    Py_ssize_t nfree;
    /* borrowed: the Timeout last taken back by its cancel() while its
       caller held it, not yet GC-tracked (its dealloc clears this);
       hwtimer_track_taken_back() tracks it */
    TimeoutObject *untracked_held;
    /* borrowed: every loop sink not yet deallocated, chained through
       all_next, for the gc.callbacks hook */
    struct LoopSinkObject *all_loop_sinks;
    bool exiting;         /* the atexit hook ran: no new workers */
    bool threads_exiting; /* threading's exit hooks run: executors refuse work */
    bool threads_hook;    /* _threads_exiting is registered with threading */
    /* scopes and sleep() on a real timer use the loop's own call_at(), so
       that they follow a fake-time loop (hwtimer.testing.follow_loop_time) */
    bool follow_loop_time;
    unsigned long next_id;
} hwtimer_state;

struct TimerObject {
    PyObject_HEAD
    hwt_timer *core;      /* owned reference */
    PyObject *executor;   /* owned, or NULL */
    PyObject *dispatcher; /* owned DispatchObject, NULL until started */
    /* owned list of weak references to LoopSinkObject: the loop keeps its
       sink alive (its reader, or the call that registers it, or the
       posting thread while the loop has no batch of it posted), as do
       the sink's timeouts, never the timer, so that a loop left unclosed
       is collected with what was delivered to it */
    PyObject *loop_sinks;
    PyObject *name;       /* owned str: the worker thread's name */
    PyObject *weakreflist;
    hwtimer_state *module_state; /* borrowed: the module's, outlives every timer */
    double tick_duration;
    int64_t max_pending;
    uint64_t task_errors;
    /* in module_state->running_timers, or in its stopping_timers */
    TimerObject *running_next, *running_prev;
    bool running;  /* started, not stopped */
    bool stopping; /* in stopping_timers */
    /* owned list, or NULL: periodic timeouts whose run ended after stop()
       swept the wheel, and what a stop() that a signal interrupted would
       have returned, for stop() to return */
    PyObject *stopped_periodic;
    /* owned set, or NULL: new_timeout() Timeouts submitted to the executor
       whose run nobody has taken yet (runner.c); the timer's, so that the
       cyclic GC frees what an executor dropped with the timer */
    PyObject *submitted;
    /* owned, chained through handed_next: new_periodic() timeouts handed
       to the executor, from their submit() to the end of their run, which
       stop() cannot wait for */
    struct PeriodicTimeoutObject *handed_out;
    bool stop_collected; /* stop() has returned its list */
    /* owned chain (link.next): what stop() returns, kept here while it
       waits, so that a fork child whose stopping thread did not come
       along can still return them (a call interrupted by a signal moves
       them to stopped_periodic, where the cyclic GC sees them) */
    hwt_timeout *stop_left;
    pid_t stop_waiter; /* the process whose stop() call waits to return them, or 0 */
    /* in its dealloc, which lets the atexit hook find it running while a
       warning runs Python code: no Python code may be handed it then */
    bool dying;
    /* hwtimer.default_timer()'s, marked by hwtimer/_default.py as it makes
       it: a user's stop() of it is final for the process */
    bool shared;
    /* A ManualTimer (hwtimer.testing): no threads; its core reads the
       clock below, which only advance() moves, under advance_lock. */
    bool manual;
    _Atomic int64_t manual_now;   /* ns; starts at 0 */
    /* what advance() was given below the clock's ns and has not moved it
       by, in [-0.5, 0.5] ns: advances add up as their seconds do */
    double manual_carry;
    pthread_mutex_t advance_lock; /* held through advance() and stop() */
    unsigned long advancing;      /* the thread holding it, or 0 (GIL) */
    /* borrowed, under the GIL: what the thread holding it waits for, as a
       dispatch thread's waits_on (its tasks run on that thread); and the
       ManualTimer whose advance_lock that thread took before this one's */
    TimerObject *holder_waits_on, *held_outer;
    unsigned forks_seen;          /* the process's fork count it was made in */
    /* advance() runs (not stop()); and one of the tasks it ran raised
       KeyboardInterrupt (Ctrl-C lands in the thread that advances): it
       stops after that tick and raises it.  Both under advance_lock. */
    bool in_advance, interrupted;
};

/* A Timeout: 80 bytes with CPython's GC header, the C node included (a
   pymalloc size class: one more byte would cost 16).  It holds one
   reference to its timer, reached as node.sink->owner.  While
   pending on a real timer it is not tracked by the cyclic GC: the wheel
   owns a reference to it, so it cannot be garbage while the worker runs,
   and a million of them cost a collection nothing.  It is tracked once the
   wheel gives it back to anyone else (hwtimer_timeout_track_if_held).  A
   manual timer's are tracked from their schedule: its traverse shows them
   (timer_traverse), since nothing runs them once the timer is dropped. */
struct TimeoutObject {
    PyObject_HEAD
    hwt_timeout node;
    PyObject *task; /* owned */
};

/* What a periodic timeout keeps beside its node, at one offset in both of
   its types (hwtimer_timeout_grid): the period, and where its grid stands.
   A one-shot call_later() handle has it too, for `owned` alone.  Packed
   into 16 bytes, as the period and two flags took before the period kept
   its fraction, so that neither type leaves its pymalloc size class.  Read
   and written with the GIL held, the core's re-arm working on copies. */
typedef struct hwtimer_grid {
    int64_t period; /* ns between runs, > 0; 0 for call_later() */
    /* and frac / 2**30 ns more: a period is seldom a whole ns (1 / 60 s) */
    uint32_t frac : 30;
    /* its next run is the one its last re-arm asked for at once
       (HWT_EAGAIN), not reset since: hwt_timeout_rearm()'s catch_up */
    uint32_t catch_up : 1;
    /* PeriodicTimeoutObject: handed to the timer's executor, its run not
       yet begun (runner.c) */
    uint32_t submitted : 1;
    /* how far (2**-30 ns) its exact grid point lies before its deadline,
       which is a whole ns: hwt_timeout_rearm_exact()'s */
    uint32_t behind : 30;
    /* PeriodicTimeoutObject: in its timer's handed_out list */
    uint32_t handed : 1;
    /* LoopTimeoutObject: set with on_stop and never cleared: stop() never
       lists the deadline of a sleep() or a scope, also when its owner
       dropped on_stop (it cancelled the deadline) while that stop() ran */
    uint32_t owned : 1;
} hwtimer_grid;

/* A periodic Timeout from new_periodic(): the period lives here, not in
   the node, which it would push past 80 bytes for every one-shot. */
typedef struct PeriodicTimeoutObject {
    TimeoutObject base;
    hwtimer_grid grid;
    /* in its timer's handed_out list (grid.handed): its links, borrowed */
    struct PeriodicTimeoutObject *handed_prev, *handed_next;
} PeriodicTimeoutObject;

typedef struct LoopSinkObject LoopSinkObject;

/* A Timeout from call_later: callback(*args) runs in `context` on the loop
   of `sink`. */
typedef struct LoopTimeoutObject LoopTimeoutObject;
struct LoopTimeoutObject {
    TimeoutObject base; /* base.task is the callback */
    /* call_every()'s period and grid, right after `base` as in
       PeriodicTimeoutObject; grid.period is 0 for call_later() */
    hwtimer_grid grid;
    PyObject *args;       /* owned tuple */
    PyObject *context;    /* owned contextvars.Context */
    LoopSinkObject *sink; /* owned */
    /* borrowed: the sink's other live timeouts, so that closing the sink
       can cancel them */
    LoopTimeoutObject *sink_prev, *sink_next;
    /* owned, or NULL: set on the deadline of a hwtimer.sleep() or a
       TimeoutScope.  If stop() cancels the timeout before it is due, it
       is not in stop()'s list: on_stop(remaining) is called instead, in
       the loop's thread, with the seconds left to the deadline on the
       timer's clock (>= 0, inf for one never due), so that the deadline
       goes on on the loop's own clock.  Cleared by cancel(). */
    PyObject *on_stop;
};

/* Delivery to one event loop: a wake fd the loop watches, drained in C;
   or, for a loop that cannot watch one, a thread that waits on it and
   posts each batch with call_soon_threadsafe. */
struct LoopSinkObject {
    PyObject_HEAD
    hwt_sink sink;      /* sink.owner: the TimerObject, borrowed;
                           sink.wake_fd: the wake fd's write end */
    hwt_wakefd wakefd;  /* owned, until a posting thread takes it */
    bool posting;       /* add_reader is not implemented: batches are posted */
    /* owned capsule of `post`, or NULL: what the posting thread runs on,
       which owns the wake fd from then on (loopsink.c) */
    PyObject *poster;
    struct LoopPoster *post; /* borrowed from `poster` */
    PyObject *loop_ref; /* owned weakref to the loop, or NULL */
    /* owned weakref to the reader the loop watches the wake fd with, or
       NULL: a loop lets go of it when it is closed */
    PyObject *reader_ref;
    PyObject *loop;     /* owned if owns_loop (a loop that cannot be weakly
                           referenced), else borrowed: compared only */
    bool owns_loop;
    bool closed;                 /* delivers nothing more */
    LoopTimeoutObject *timeouts; /* borrowed: its timeouts not yet deallocated */
    /* borrowed, or NULL once it has gone: the sink's LoopDeliveryObject,
       which holds the sink; the sink is closed when it goes */
    PyObject *delivery;
    PyObject *weakreflist;       /* the timer's list refers to it weakly */
    LoopSinkObject *all_next, *all_prev; /* in module_state->all_loop_sinks */
};

/* The object whose run() is the body of a timer's dispatch thread.  It
   shares the core with the timer, so it can outlive the TimerObject. */
typedef struct DispatchObject {
    PyObject_HEAD
    hwt_timer *core; /* owned reference */
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    bool synced;             /* lock and done_cond were made: dealloc destroys them */
    bool done;               /* run() has finished its last batch */
    unsigned long thread_id; /* the dispatch thread, once running */
    /* its start() failed before it ran: run() returns at once, should its
       thread exist after all (Thread.start() interrupted in its wait) */
    bool abandoned;
    PyObject *name;          /* owned str */
    char native_name[16];    /* the thread's, as ps -T shows it ("": its own) */
    /* owned weak reference to its threading.Thread, or NULL: a thread
       that ends before it runs run() (a profile or trace hook that
       raised) or that calls stop() before it (from such a hook) must not
       be waited for */
    PyObject *thread_ref;
    /* the thread in the start() that makes and starts its threading.Thread,
       until Thread.start() returns, or 0: a stop() there (from a signal
       handler, a profile hook, a finalizer) must not wait for a thread
       that this one may not have started yet */
    unsigned long starter;
    pid_t pid;               /* the process its thread runs in */
    /* borrowed: while this dispatch thread waits in a stop() (for that
       timer's dispatch thread) or for a ManualTimer's advance lock, that
       timer, to find waits that form a cycle (timer.c) */
    TimerObject *waits_on;
    /* What its thread was handed and has yet to finish, read only in a
       child of fork(), where that thread did not come along: held[0] the
       timeout whose run is going on (its reference not yet dropped),
       held[1] the rest of the batch, chained by link.next. */
    hwt_timeout *held[2];
} DispatchObject;

#define TIMEOUT_OF(n) ((TimeoutObject *)((char *)(n)-offsetof(TimeoutObject, node)))
#define TIMER_OF(to)  ((TimerObject *)(to)->node.sink->owner)

_Static_assert(offsetof(LoopTimeoutObject, grid) == offsetof(PeriodicTimeoutObject, grid),
               "a periodic timeout's grid is at one offset in both of its types");
_Static_assert(sizeof(hwtimer_grid) == 16, "a grid takes what a period and its flags took");

/* The period and grid of a timeout its core node says is periodic
   (hwt_timeout_periodic): a new_periodic() or call_every() one. */
static inline hwtimer_grid *hwtimer_timeout_grid(TimeoutObject *to)
{
    return &((PeriodicTimeoutObject *)to)->grid;
}

/* common.c */
/* The timer whose task runs on this thread now, for stop()'s check. */
extern _Thread_local TimerObject *hwtimer_current_task_timer;
/* Its address on this thread.  A function apart, never inlined, so that a
   loop which takes it once keeps it: the compiler would redo the
   thread-local lookup (a call, in a shared object) at every use, as it did
   at every task of a burst once link-time optimisation inlined this. */
TimerObject **hwtimer_current_task_slot(void);
hwtimer_state *hwtimer_state_of_type(PyTypeObject *tp);
/* hwtimer_parse_delay() for every kind of delay. */
int hwtimer_parse_any_delay(hwtimer_state *st, PyObject *obj, const char *what, int64_t *ns);
/* ceil(x) for 0 < x < 2**63, without libm's call; x is seconds * 1e9,
   whose rounding (and the seconds' own, as 8.3 is stored) can put it a
   few units of its last place above a whole ns: that ns is the deadline
   meant (8.3 s is 8300000000 ns, not one more), no earlier than the
   delay by anything a double can tell. */
static inline int64_t hwtimer_ceil_ns(double x)
{
    int64_t n = (int64_t)x;
    return x - (double)n > x * 0x1p-52 ? n + 1 : n;
}
/* The ns at or above which a delay saturates to HWT_NEVER: 2**63, past
   int64, as for an int delay; any double below it is at most 2**63 - 1024,
   and its ceil fits. */
#define HWTIMER_NEVER_NS_DOUBLE 0x1p63
/* Parses seconds (int, float, timedelta, or anything with __float__) into
   ns, saturating at HWT_NEVER.  Returns 0, or -1 with TypeError/ValueError.
   A positive float, new_timeout()'s usual delay, is read here, inline. */
static inline int hwtimer_parse_delay(hwtimer_state *st, PyObject *obj, const char *what,
                                      int64_t *ns)
{
#ifndef Py_LIMITED_API
    if (PyFloat_CheckExact(obj)) {
        double x = PyFloat_AS_DOUBLE(obj) * 1e9;
        if (x > 0 && x < HWTIMER_NEVER_NS_DOUBLE) { /* NaN is neither */
            *ns = hwtimer_ceil_ns(x);
            return 0;
        }
    }
#endif
    return hwtimer_parse_any_delay(st, obj, what, ns);
}
/* Seconds into ns, rounded up (never early) and saturated; NaN is
   ValueError.  Returns 0 or -1. */
int hwtimer_delay_from_seconds(double seconds, const char *what, int64_t *ns);
/* The seconds a number read by the calls above stands for: an int's value,
   a subclass's too whatever its __float__ says, else its float.  -1.0 with
   an exception set when that fails (OverflowError for an int past any
   float, what a __float__ raised). */
double hwtimer_as_seconds(PyObject *obj);
/* Same, as seconds: returns 0 or -1; NaN is left to the caller. */
int hwtimer_parse_seconds(hwtimer_state *st, PyObject *obj, const char *what, double *out);
/* After hwtimer_parse_seconds() failed for `obj`: if it was a number too
   large for a double (an int, or what has __index__, read exactly; or a
   number such as a Fraction, whose __float__ overflowed, by comparing it
   with 0), clears the OverflowError and sets *out to inf of its sign.
   Returns 0, or -1 with the error as it was (or the one reading the int
   again raised). */
int hwtimer_huge_seconds(PyObject *obj, double *out);
/* Takes the pending exception, if any, out of the thread state, with its
   traceback attached: no Python code may be called with one pending. */
PyObject *hwtimer_take_exception(void);
/* repr(obj) for a log line or a loop's exception handler, which must not
   lose the error they report to one of repr(): where repr() raises, obj is
   shown as object.__repr__ would, with that error's type (cleared).  NULL
   only if that fails too, with the error set. */
PyObject *hwtimer_repr_for_log(PyObject *obj);
/* Counts the current exception as a task's failure and logs it on the
   "hwtimer" logger, and clears it; a KeyboardInterrupt in a manual
   timer's advance() is only noted, for advance() to raise. */
void hwtimer_log_task_error(hwtimer_state *st, PyObject *timeout);
/* How many fork()s led to this process, and which thread called the last
   one (written in the child by that thread, before any other exists),
   counted once hwtimer_note_forks() has returned 0 (else an errno value):
   a change while a task runs means it forked. */
extern unsigned hwtimer_forks;
extern unsigned long hwtimer_forking_thread;
int hwtimer_note_forks(void);
/* Hands the exception `exc` that a task of the manual timer `timer` raised
   to its _task_failed(exc), which keeps it for the test (hwtimer.testing),
   whatever the logger or a loop's exception handler lets through. */
void hwtimer_keep_manual_error(TimerObject *timer, PyObject *exc);
/* Registers, once, the hook that tells when threading's exit hooks shut
   executors down, so that their refusals then are not logged as errors.
   Registered when the first timer with an executor starts, so that it runs
   before the hooks of executors made earlier (they run last first). */
void hwtimer_watch_thread_exit(hwtimer_state *st);
/* Whether threading's exit hooks run (its executors refuse work). */
bool hwtimer_threads_exiting(hwtimer_state *st);
/* Logs `msg` at ERROR on the "hwtimer" logger, with the exception set,
   if any, as its exc_info (cleared); clears any failure. */
void hwtimer_log_error(hwtimer_state *st, const char *msg);
/* ns on a clock into seconds, exact for whole seconds, as time.monotonic()
   converts, so that the two compare. */
double hwtimer_seconds(int64_t ns);
/* Raises the exception for `err`, what a core call (or a pthread call of
   the binding's) returned when it failed to `what` (a verb phrase):
   ENOMEM is MemoryError, another errno value OSError with that errno,
   HWT_EREJECTED the module's RejectedExecutionError, HWT_ESTOPPED
   RuntimeError.  `timer` (for those two) may be NULL where only an errno
   value can come.  Returns -1. */
int hwtimer_core_error(TimerObject *timer, int err, const char *what);
/* Whether `obj` has a callable attribute `name`: 1, or 0 (no error set) if
   it has none (reading it raised AttributeError) or it is not callable;
   -1 with whatever else reading it raised. */
int hwtimer_has_method(PyObject *obj, const char *name);
/* Returns a new reference to module.name, or NULL. */
PyObject *hwtimer_import_attr(const char *module, const char *name);
/* Copies `name` cut to the 15 bytes Linux keeps of a thread's name, never
   in the middle of a UTF-8 sequence. */
void hwtimer_native_name(const char *name, char out[16]);
/* The native name of a timer's helper thread, "<timer>-<role>" cut as
   hwtimer_native_name() cuts it; unless the timer's name leaves no room
   for the role (15 bytes or more, as "hwtimer-default"), where the thread
   would show as the worker does: then the timer's first 13 bytes, '-'
   and the role's initial ("hwtimer-defau-d").  Returns -1 with the error
   of reading `timer_name` (a str), else 0. */
int hwtimer_native_helper_name(PyObject *timer_name, const char *role, char out[16]);
/* Reads a non-bool int argument into *out, saturated to LLONG_MIN or
   LLONG_MAX.  Returns 0 or -1 with TypeError. */
int hwtimer_parse_int(PyObject *obj, const char *what, long long *out);
/* Sets ValueError "<rule>, not <repr(obj)>".  An object whose repr()
   fails with an Exception (an int too long for repr(), a __repr__ that
   raises) is shown by its type instead, so that the ValueError stands; a
   BaseException raised by repr() (KeyboardInterrupt) is left set instead.
   Returns -1. */
int hwtimer_value_error(const char *rule, PyObject *obj);
/* A function's parameters: `names` in order, the first npositional_only
   of them only by position, the last nkeyword_only only by keyword, the
   first nrequired required.  With `varargs`, more positional arguments
   than the positional parameters are left to the caller, as *args. */
typedef struct {
    const char *fname; /* for messages: "new_timeout" */
    const char *const *names;
    Py_ssize_t nparams, npositional_only, nkeyword_only, nrequired;
    bool varargs;
} hwtimer_signature;
/* The binding's one argument parser: binds a fastcall's arguments to the
   parameters of `sig`, out[i] (borrowed) for names[i], NULL where not
   given.  Returns 0, or -1 with a TypeError naming sig->fname. */
int hwtimer_bind(const hwtimer_signature *sig, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames, PyObject **out);
/* hwtimer_bind() for a method of one required parameter, which the
   common call gives by position: that call is bound without the parser. */
static inline int hwtimer_bind_one(const hwtimer_signature *sig, PyObject *const *args,
                                   Py_ssize_t nargs, PyObject *kwnames, PyObject **out)
{
    if (nargs == 1 && !kwnames) {
        *out = args[0];
        return 0;
    }
    return hwtimer_bind(sig, args, nargs, kwnames, out);
}
/* The same for a call through a tuple and a dict (tp_new, tp_init). */
int hwtimer_bind_tuple(const hwtimer_signature *sig, PyObject *args, PyObject *kwds,
                       PyObject **out);
/* Returns the running event loop (new reference), or NULL with
   RuntimeError `none` when there is none. */
PyObject *hwtimer_running_loop(hwtimer_state *st, const char *none);
/* tp_new of the types users do not create. */
PyObject *hwtimer_new_refused(PyTypeObject *tp, PyObject *args, PyObject *kwargs);
/* The timer's clock in ns: the one reading every consumer takes.  A real
   timer's core reads CLOCK_MONOTONIC, a ManualTimer's the clock its test
   moves; that choice (hwt_config.clock) is the only place where they
   differ. */
int64_t hwtimer_clock_ns(TimerObject *timer);

/* timeout.c */
extern PyType_Spec hwtimer_timeout_spec;
extern PyType_Spec hwtimer_periodic_spec;
/* Returns a new, unscheduled timeout of type `tp` delivered to `sink`,
   holding `task` and a reference to `timer`; a subtype's own fields are
   zeroed for the caller to fill before it schedules.  NULL on failure. */
PyObject *hwtimer_timeout_new(TimerObject *timer, PyTypeObject *tp, hwt_sink *sink, PyObject *task);
/* Schedules `obj` from hwtimer_timeout_new, giving the wheel a reference;
   periodic when period_ns > 0 (missed: HWT_MISSED_*), which `obj` (of the
   periodic type, or a loop timeout) then keeps.  Returns 0, or -1
   with RejectedExecutionError or RuntimeError; the caller keeps its own
   reference either way. */
/* A periodic timeout's period as new_periodic() and call_every() read it:
   ns, and frac / 2**30 ns more; with how far its first deadline (a whole
   ns) lies after the exact time its delay said, in 2**-30 ns. */
typedef struct hwtimer_period {
    int64_t ns;
    uint32_t frac;
    uint32_t behind;
} hwtimer_period;
int hwtimer_timeout_submit(TimerObject *timer, PyObject *obj, int64_t delay_ns,
                           const hwtimer_period *period, int missed);
/* GC-tracks `obj`, if it is not yet. */
void hwtimer_timeout_track_pending(PyObject *obj);
/* Called once `obj` is submitted: a manual timer's pending timeouts are
   tracked, for its traverse to show the collector what its wheel holds
   (timer_traverse); a real timer's are not.  Apart from the submit, which
   the pair's path inlines. */
static inline void hwtimer_track_if_manual(TimerObject *timer, PyObject *obj)
{
    if (__builtin_expect(timer->manual, 0))
        hwtimer_timeout_track_pending(obj);
}
/* Tracks `to` for the cyclic GC if anything besides the wheel holds it:
   only then can it be part of a cycle.  One that only the wheel holds, as
   a fire-and-forget timeout is when its task runs, is freed untracked when
   that reference goes, so a burst costs the collector nothing.  Called
   when the wheel gives a timeout back, and again after its task ran, which
   may have kept it. */
static inline void hwtimer_timeout_track_if_held(TimeoutObject *to)
{
    if (Py_REFCNT(to) > 1 && !PyObject_GC_IsTracked((PyObject *)to))
        PyObject_GC_Track((PyObject *)to);
}
/* Hands back the wheel's reference to a timeout the core returned, tracked
   if something else holds it (above), and returns it (a new reference, the
   wheel's). */
PyObject *hwtimer_timeout_from_node(hwt_timeout *node);
/* GC-tracks the Timeout that its cancel() took back and left untracked
   (st->untracked_held), if there is one: module.c's hook runs it as every
   collection starts. */
void hwtimer_track_taken_back(hwtimer_state *st);
/* Drops the wheel's references to a chain of nodes (link.next). */
void hwtimer_release_chain(hwt_timeout *node);
/* Releases the timeouts that the core handed back (released while the GIL
   was not held, or unlinked by a walk of the wheel). */
void hwtimer_release_handed_back(hwt_timer *core);
double hwtimer_deadline_seconds(TimeoutObject *to);
/* Timeout.cancel(), which call_later()'s Timeout extends. */
PyObject *hwtimer_timeout_cancel(TimeoutObject *self, PyObject *unused);
#define HWTIMER_CANCEL_DOC                                                                         \
    "cancel($self, /)\n--\n\nCancels the timeout.  True if this call cancelled it, "               \
    "False if it had already expired or been cancelled."
/* The Timeout's GC slots and dealloc, shared by its subtypes. */
int hwtimer_timeout_traverse(TimeoutObject *self, visitproc visit, void *arg);
int hwtimer_timeout_clear(TimeoutObject *self);
void hwtimer_timeout_dealloc(TimeoutObject *self);

/* looptimeout.c */
extern PyType_Spec hwtimer_loop_timeout_spec;
/* Returns the sink's loop (a new reference), or NULL, with no exception,
   once it has been collected. */
PyObject *hwtimer_sink_loop(LoopSinkObject *self);
/* Whether `loop` is closed: whether its is_closed() is true, as asyncio
   asks (0, None or any other false value means open).  An is_closed()
   that raises counts as open, its error written as unraisable: what waits
   on the loop stays with it, never dropped unseen (a loop closed indeed
   refuses what is handed to it).  Call it with no exception set. */
bool hwtimer_loop_closed(PyObject *loop);
/* Links a scheduled call_later() timeout into its sink's list. */
void hwtimer_loop_sink_track(LoopTimeoutObject *to);
/* Unlinks it (from its dealloc). */
void hwtimer_loop_sink_untrack(LoopTimeoutObject *to);
/* Calls a call_later callback once in its context.  Returns 0, or -1 with
   the exception it raised. */
int hwtimer_loop_call(LoopTimeoutObject *to);
/* Reports the exception set as asyncio reports a failed handle, and counts
   it in task_errors.  Returns -1, leaving it set and uncounted, for
   KeyboardInterrupt and SystemExit, and with the one the loop's exception
   handler raised, if it raised either; else 0. */
int hwtimer_loop_report(LoopTimeoutObject *to);
/* For the stop() that swept `to`, which has an on_stop: hands it to its
   loop (from any thread), whose thread then calls on_stop; a loop gone or
   closed gets nothing, as nothing waits there.  Keeps any exception set. */
void hwtimer_loop_timeout_stopped(LoopTimeoutObject *to);
/* Lets go of `to`'s on_stop: its owner cancelled the deadline. */
void hwtimer_loop_timeout_drop_on_stop(LoopTimeoutObject *to);

/* runner.c */
/* Expired timeouts run one after another on one thread, as a batch: the
   clock read at one task's end is the next one's start, and the runner
   times only some of them (runner.c says which). */
#define HWTIMER_UNREAD INT64_MIN
typedef struct {
    int64_t now;        /* when the task before ended, or HWTIMER_UNREAD */
    uint64_t ran;          /* tasks begun */
    uint64_t periodic_ran; /* of which runs of periodic timeouts */
    bool last;             /* the next task is the batch's last */
} hwtimer_batch;
#define HWTIMER_BATCH_INIT {.now = HWTIMER_UNREAD, .ran = 0, .periodic_ran = 0, .last = false}
/* The task runner: runs the task of a delivered timeout on this thread as
   the next of `batch`, records its lateness and run time (if the batch
   times it), reports a failure and re-arms a periodic timeout (running its
   missed runs back to back when its policy says so and no other task
   waits; else they wait their turn on the wheel).  A periodic timeout
   reset since its delivery does not run: it goes back on the wheel at its
   new deadline.  Returns 0, or -1 with KeyboardInterrupt or SystemExit set
   from a call_later callback; other errors are reported. */
int hwtimer_run_timeout(TimerObject *timer, TimeoutObject *to, hwtimer_batch *batch);
/* The dispatch thread's: runs a new_timeout task as the next of `batch`
   with the runner, or submits it to the executor.  Never fails. */
void hwtimer_dispatch_timeout(TimerObject *timer, TimeoutObject *to, hwtimer_batch *batch);
/* _run_task(): runs, on an executor's thread, a timeout that
   hwtimer_dispatch_timeout() submitted.
   Returns 0, or -1 with RuntimeError for any other timeout. */
int hwtimer_run_submitted(TimerObject *timer, TimeoutObject *to);
/* Runs a batch taken from the default sink: each expired new_timeout()
   task in turn, on this thread (or its executor); releases the rest.
   With `parents_only`, a task that forks ends the batch in the child,
   whose tasks stay the parent's to run: the rest goes back to the default
   sink, unrun, for the child's stop().  `held` (the dispatch thread's,
   else NULL) is kept pointing at what it has yet to finish.  Returns how
   many runs of periodic timeouts it began here. */
uint64_t hwtimer_run_batch(hwt_sink *default_sink, hwt_timeout *node, bool parents_only,
                           hwt_timeout **held);
/* For the stop() that returns its list: cancels a delivered periodic
   timeout whose run has not ended (it will not run again) and appends it
   to `list` (NULL: only cancels); one that ended already is left alone. */
void hwtimer_stop_delivered(TimeoutObject *to, PyObject *list);
/* hwtimer_stop_delivered() of each periodic timeout handed to the
   executor. */
void hwtimer_stop_handed_out(TimerObject *timer, PyObject *list);
/* In a child of fork(), for stop(): cancels each periodic timeout of
   `node` (with `chain`, of the chain it starts), of `timer`'s default
   sink, whose run had not ended in the parent, and adds it to the list
   stop() returns; the child never runs nor re-arms it.  Takes no
   reference. */
void hwtimer_stop_unrun(TimerObject *timer, hwt_timeout *node, bool chain);
/* The GC's view of a timer's handed_out list, and its release. */
int hwtimer_handed_out_traverse(TimerObject *timer, visitproc visit, void *arg);
void hwtimer_handed_out_clear(TimerObject *timer);

/* loopsink.c */
extern PyType_Spec hwtimer_loop_sink_spec;
extern PyType_Spec hwtimer_loop_delivery_spec;
/* Returns the LoopSinkObject delivering to `loop` (a new reference),
   created and registered with the loop on first use; NULL with an
   exception. */
LoopSinkObject *hwtimer_loop_sink_for(TimerObject *timer, PyObject *loop);
/* Whether `timer` has an open sink for `loop` already.  Runs no Python. */
bool hwtimer_loop_has_sink(TimerObject *timer, PyObject *loop);
/* Refuses a `loop` no sink could post to: one without a callable
   call_soon_threadsafe().  Returns 0, or -1 with TypeError (or what
   reading the attribute raised, if not an AttributeError). */
int hwtimer_loop_check(PyObject *loop);
/* Closes every sink in the list (of a timer going away). */
void hwtimer_loop_sinks_close(PyObject *sinks);
/* GC-tracks the timeouts delivered to the loop sinks and not yet taken by
   their loops: the gc.callbacks hook runs it as every collection starts. */
void hwtimer_loop_sinks_track_delivered(hwtimer_state *st);
/* Whether `timer` has callbacks handed to `loop` that it has not run. */
bool hwtimer_loop_sink_holds(TimerObject *timer, PyObject *loop);
/* How many runs of periodic timeouts (call_every) `timer`'s loop sinks
   hold, not yet taken by their loops. */
Py_ssize_t hwtimer_loop_sinks_periodic(TimerObject *timer);
/* For the stop() that returns its list: cancels each call_every() timeout
   of `timer` that is delivered to its loop and not re-armed (its run not
   yet begun, or going in the loop's thread), so that it does not run
   again, and appends it to `list` (NULL: only cancels). */
void hwtimer_loop_sinks_stop_periodic(TimerObject *timer, PyObject *list);

/* dispatch.c */
extern PyType_Spec hwtimer_dispatch_spec;
/* The dispatcher whose thread this is, if it is a dispatch thread. */
extern _Thread_local DispatchObject *hwtimer_this_thread_dispatch;
/* Returns a new dispatch object sharing `timer`'s core, or NULL. */
DispatchObject *hwtimer_dispatch_new(TimerObject *timer);
/* How often a wait with the GIL released (for the dispatch thread in
   stop(), for another thread's advance() of a ManualTimer) stops to run
   signal handlers. */
#define HWTIMER_SIGNAL_POLL_NS INT64_C(50000000)
/* Lets whoever waits in hwtimer_dispatch_wait_done() go. */
void hwtimer_dispatch_mark_done(DispatchObject *self);
/* Waits, with the GIL released, until the dispatch thread has run its
   last batch.  Returns 0, or -1 with what a signal handler raised. */
int hwtimer_dispatch_wait_done(DispatchObject *self);

/* monitor.c */
/* stats(): returns a new dict of counts, lateness and the wheel's spread. */
PyObject *hwtimer_timer_stats(TimerObject *self, PyObject *unused);
/* Returns a new list of the `limit` soonest pending timeouts, in deadline
   order, or NULL with MemoryError. */
PyObject *hwtimer_pending_snapshot(TimerObject *timer, size_t limit);

/* timer.c */
extern PyType_Spec hwtimer_timer_spec;
/* The constructor's arguments, each borrowed, NULL where not given. */
typedef struct {
    PyObject *tick_duration, *ticks_per_wheel, *max_pending_timeouts;
    PyObject *thread_name, *executor; /* Py_None where not given */
    double default_tick;
    long long default_ticks;
    bool manual;
} hwtimer_timer_args;
/* Returns a new timer of type `tp` (HashedWheelTimer or a subtype), or
   NULL with TypeError/ValueError for a bad argument. */
PyObject *hwtimer_timer_build(PyTypeObject *tp, const hwtimer_timer_args *args);
/* Whether __new__ leaves the arguments to the __init__ of `tp` (a subclass
   whose __init__ is its own, and not its __new__), as object.__new__ does:
   they are that __init__'s, which need not be the constructor's, and it
   gives the timer its settings with super().__init__(...).  The timer is
   made with the defaults meanwhile.  A subclass's own __new__ hands the
   base's what it means the timer to have. */
bool hwtimer_init_takes_arguments(PyTypeObject *tp);
/* Takes `timer`'s advance_lock for this thread, waiting with the GIL
   released; RuntimeError (-1) if this thread holds it already. */
int hwtimer_manual_lock(TimerObject *timer, const char *what);
void hwtimer_manual_unlock(TimerObject *timer);
/* Whether a thread of this process is in an advance() of the manual
   `timer` (in a child of fork(), one of the parent's never is). */
bool hwtimer_manual_advancing(TimerObject *timer);
/* Stops `timer` and returns the list stop() returns (new reference), or
   NULL with an exception. */
PyObject *hwtimer_timer_stop(TimerObject *timer);
/* Stops `timer` with the stop() its type has: a subclass's override,
   called as a method, or the built-in one (with its checks).  Returns what
   it returns, or NULL with an exception. */
PyObject *hwtimer_timer_own_stop(TimerObject *timer);
/* Takes `timer` out of stopping_timers, if there. */
void hwtimer_timer_unlist_stopping(TimerObject *timer);
/* Takes `timer` out of running_timers, if there, without stopping it. */
void hwtimer_timer_unlist_running(TimerObject *timer);
/* Schedules callback(*args) (args a tuple) on `loop` in `context` (NULL: a
   copy of the current one).  Returns a new LoopTimeout or NULL. */
PyObject *hwtimer_call_later(TimerObject *self, int64_t delay, PyObject *callback, PyObject *args,
                             PyObject *loop, PyObject *context);
/* The same, then every period_ns (> 0) with policy `missed`. */
PyObject *hwtimer_call_every(TimerObject *self, int64_t delay, const hwtimer_period *period,
                             int missed, PyObject *callback, PyObject *args, PyObject *loop,
                             PyObject *context);
/* Starts the worker and dispatch thread if needed.  Returns 0 or -1. */
int hwtimer_timer_start(TimerObject *timer);
/* Starts `timer` if needed and returns its sink for `loop` (a new
   reference, made if need be), as call_later() on that loop needs them;
   NULL with an exception. */
LoopSinkObject *hwtimer_loop_prepare(TimerObject *timer, PyObject *loop);

/* manual.c */
extern PyType_Spec hwtimer_manual_spec;

/* scope.c */
/* An awaitable already done with `value`. */
typedef struct {
    PyObject_HEAD
    PyObject *value; /* owned */
    bool enter;      /* value is a scope to enter when this is awaited */
    bool spent;      /* was to enter, and has been awaited, closed or thrown
                        into: as a finished coroutine, it runs no more */
} DoneObject;

/* hwtimer.TimeoutScope: asyncio.timeout() on the wheel. */
typedef struct {
    PyObject_HEAD
    int phase;             /* CREATED ... EXITED (scope.c) */
    PyObject *when;        /* owned: the deadline as given (loop.time()), or None */
    double when_s;         /* that deadline as read once when given: what is scheduled */
    PyObject *timer;       /* owned TimerObject, or NULL: default_timer() */
    PyObject *task;        /* owned while entered */
    PyObject *loop;        /* owned once entered */
    PyObject *handle;      /* owned: the deadline's Timeout or loop Handle */
    Py_ssize_t cancelling; /* the task's cancel requests on entering */
    /* owned while entered, before 3.11 only: the exception the task was
       handling when it entered, or NULL (hwtimer._asyncio's exit hook) */
    PyObject *handled;
    double created_at;     /* loop.time() when made by _after(), else NaN */
    double created_delay;  /* _after()'s seconds (its when is created_at + this) */
    int64_t created_ns;    /* and the timer's clock then (scope.c) */
    /* its timer stopped while it was entered: its deadline went to the
       loop's clock, and so does any reschedule() */
    bool on_loop;
} ScopeObject;

extern PyType_Spec hwtimer_done_spec;
extern PyType_Spec hwtimer_scope_spec;

#endif /* HWTIMER_BINDING_H */
