/*
 * manual.c: hwtimer._hwtimer._ManualTimer, the base of
 * hwtimer.testing.ManualTimer: a HashedWheelTimer whose core runs in manual
 * mode (no worker, no dispatch thread) on a clock that only advance()
 * moves.  It is the real wheel: advance() hands the core one tick end at a
 * time, runs that tick's tasks in the calling thread while time() reads the
 * tick's end, and lets the core take what those tasks scheduled before the
 * next tick, so that a test sees what a perfectly punctual timer would do.
 */
#include "binding.h"

#include <math.h>

/* advance_to_next() goes on through at most this many ticks with work
   that run nothing.  A far timeout takes one such tick for each level it
   moves down, so the bound is only a guard; an infinite delay is never
   due, and is no tick's work. */
#define MAX_IDLE_STEPS 1000000

/* The one-shot timeouts expired so far: a periodic one that ended
   expired (its task raised) has had its runs counted already.  One handed
   to a loop counts, also if a cancel or reset took it back before it ran
   (each time it was handed over). */
static uint64_t expired_count(TimerObject *self)
{
    hwt_stats s;
    hwt_timer_stats(self->core, &s);
    return s.expired + s.revoked - s.expired_periodic;
}

/* What advance() returns: how many tasks ran or were handed over.  The
   core counts one-shot expiries; runs of periodic timeouts the steps count
   as they begin them here (each catch-up run of "burst" or "delay" is one
   more; one cancelled or reset before its run is none) or hand them to a
   loop (once each). */
typedef struct {
    uint64_t expired_before;
    uint64_t periodic;
} ran_count;

static void count_start(TimerObject *self, ran_count *c)
{
    c->expired_before = expired_count(self);
    c->periodic = 0;
}

static uint64_t count_end(TimerObject *self, const ran_count *c)
{
    return expired_count(self) - c->expired_before + c->periodic;
}

/* Moves the clock to `now` (>= the clock) and lets the wheel process every
   tick that has ended by then, running their tasks here; then lets it take
   the timeouts that those tasks scheduled.  Returns the clock time at which
   the next tick with work ends, or HWT_NEVER.  Called with advance_lock. */
static int64_t step(TimerObject *self, int64_t now, ran_count *ran)
{
    hwt_sink *default_sink = hwt_timer_default_sink(self->core);
    atomic_store_explicit(&self->manual_now, now, memory_order_relaxed);
    Py_ssize_t held = hwtimer_loop_sinks_periodic(self);
    int64_t next = hwt_timer_advance(self->core, now);
    Py_ssize_t handed = hwtimer_loop_sinks_periodic(self) - held;
    ran->periodic += handed > 0 ? (uint64_t)handed : 0;
    hwt_timeout *batch = hwt_sink_take(default_sink);
    if (batch) {
        ran->periodic += hwtimer_run_batch(default_sink, batch, false, NULL);
        next = hwt_timer_advance(self->core, now); /* nothing is due: it transfers */
    }
    hwtimer_release_handed_back(self->core);
    return next;
}

/* Processes, tick by tick, every tick with work that ends by `target`,
   then leaves the clock at `target`, `carry` short of where the advance
   meant it to be; or, given a `loop`, stops after the first tick that
   handed callbacks to it, so that they run at that tick's time; or, once a
   task raised KeyboardInterrupt, stops after that tick, which is where the
   clock then is.  Returns whether it reached `target`.  A NaN `carry`
   leaves the carry as it is (advance_async() set it already).  Called
   with advance_lock. */
static bool advance_to(TimerObject *self, int64_t target, double carry, PyObject *loop,
                       ran_count *ran)
{
    bool keep_carry = isnan(carry);
    int64_t next = step(self, atomic_load(&self->manual_now), ran);
    if (!keep_carry)
        self->manual_carry = 0;
    while (next <= target && !self->interrupted) {
        next = step(self, next, ran);
        if (loop && hwtimer_loop_sink_holds(self, loop))
            return false;
    }
    if (self->interrupted) {
        self->manual_carry = 0;
        return false;
    }
    step(self, target, ran);
    if (!keep_carry)
        self->manual_carry = carry;
    return true;
}

/* Turns `seconds` into whole ns from the clock as it is now, and in
   *carry what is left of them and of the advances before (below a ns),
   for the next advance to go on from: three advance(1 / 3) reach 1.0, as
   the seconds add up.  Runs no Python code and sets no exception, so that
   a caller holding advance_lock checks against the clock it will move.
   Returns false for a negative, NaN or infinite one, or one past 64-bit
   ns (refuse_advance() says so). */
static bool advance_ns(TimerObject *self, double seconds, int64_t *ns, double *carry)
{
    int64_t now = atomic_load(&self->manual_now);
    double exact = seconds * 1e9 + self->manual_carry;
    double x = nearbyint(exact);
    if (x < 0) /* a carry of -0.5 and an advance of less than half a ns */
        x = 0;
    int64_t target;
    /* the clock stays below HWT_NEVER, the core's "never": exactly, so
       that a deadline it can reach is one advance() reaches too */
    if (!(seconds >= 0) || !(x < 0x1p63) ||
        __builtin_add_overflow(now, (int64_t)x, &target) || target == HWT_NEVER)
        return false;
    *ns = (int64_t)x;
    *carry = exact - x;
    return true;
}

/* Sets the ValueError for an advance of `obj` that advance_ns() refused.
   Returns -1. */
static int refuse_advance(PyObject *obj)
{
    return hwtimer_value_error("seconds must be >= 0 and finite (and keep the clock within "
                               "64-bit nanoseconds)",
                               obj);
}

/* Reads advance()'s argument into *seconds (which may run Python code: a
   __float__), and into *ns and *carry as advance_ns() does.  Returns 0 or
   -1 with TypeError or ValueError. */
static int parse_advance(TimerObject *self, PyObject *obj, double *seconds, int64_t *ns,
                         double *carry)
{
    /* an int too large for a double is out of range, as 1e300 is */
    if (hwtimer_parse_seconds(self->module_state, obj, "seconds", seconds) < 0 &&
        hwtimer_huge_seconds(obj, seconds) < 0)
        return -1;
    return advance_ns(self, *seconds, ns, carry) ? 0 : refuse_advance(obj);
}

/* Takes advance_lock for `what`, with no Ctrl-C noted yet.  Returns 0, or
   -1 with an exception. */
static int advance_lock(TimerObject *self, const char *what)
{
    if (hwtimer_manual_lock(self, what) < 0)
        return -1;
    self->in_advance = true;
    self->interrupted = false;
    return 0;
}

/* Releases advance_lock.  Returns 0, or -1 with KeyboardInterrupt if a
   task raised it meanwhile: Ctrl-C stops the advance after that tick and
   comes out of it, as out of any call in the thread it interrupted. */
static int advance_unlock(TimerObject *self)
{
    bool interrupted = self->interrupted;
    self->in_advance = self->interrupted = false;
    hwtimer_manual_unlock(self);
    if (!interrupted)
        return 0;
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    return -1;
}

static PyObject *manual_time(TimerObject *self, PyObject *unused)
{
    (void)unused;
    return PyFloat_FromDouble(hwtimer_seconds(atomic_load(&self->manual_now)));
}

static PyObject *manual_advance(TimerObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const names[] = {"seconds"};
    static const hwtimer_signature sig = {
        .fname = "advance", .names = names, .nparams = 1, .nrequired = 1};
    PyObject *arg;
    if (hwtimer_bind_one(&sig, args, nargs, kwnames, &arg) < 0)
        return NULL;
    if (hwtimer_current_task_timer == self) {
        PyErr_SetString(PyExc_RuntimeError,
                        "advance() cannot be called from a task of the timer it would move");
        return NULL;
    }
    int64_t delta;
    double seconds, carry;
    if (parse_advance(self, arg, &seconds, &delta, &carry) < 0 ||
        advance_lock(self, "advance()") < 0)
        return NULL;
    /* Refused above before any wait; read again now that the lock is held,
       from the clock and carry that another thread's advance() may have
       moved meanwhile. */
    if (!advance_ns(self, seconds, &delta, &carry)) {
        advance_unlock(self); /* no task ran: it raises nothing */
        refuse_advance(arg);
        return NULL;
    }
    ran_count ran;
    count_start(self, &ran);
    advance_to(self, atomic_load(&self->manual_now) + delta, carry, NULL, &ran);
    uint64_t n = count_end(self, &ran);
    if (advance_unlock(self) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong(n);
}

/* _target(seconds): (the clock time in ns that advance(seconds) would
   reach, the carry it would leave, and the seconds as read, a float that
   reads the same again without running the argument's __float__ again);
   TypeError or ValueError as advance() raises them. */
static PyObject *manual_target(TimerObject *self, PyObject *arg)
{
    int64_t delta;
    double seconds, carry;
    if (parse_advance(self, arg, &seconds, &delta, &carry) < 0)
        return NULL;
    return Py_BuildValue("(Ldd)", (long long)(atomic_load(&self->manual_now) + delta), carry,
                         seconds);
}

/* _now_ns(): the clock in ns. */
static PyObject *manual_now_ns(TimerObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLongLong((long long)atomic_load(&self->manual_now));
}

/* _advance_until(target_ns, carry, loop): advance_async()'s step, with
   what _target() returned: advances towards `target_ns`, stopping after a
   tick that handed callbacks to `loop`.  The carry is the clock's from
   the first step (NaN on the later ones: left as it is), so that an
   advance() made while advance_async() waits goes on from it and the
   seconds of both add up.  Returns (tasks run or handed over, whether it
   got there). */
static PyObject *manual_advance_until(TimerObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "_advance_until() takes target_ns, carry and loop");
        return NULL;
    }
    long long target = PyLong_AsLongLong(args[0]);
    if (target == -1 && PyErr_Occurred())
        return NULL;
    double carry = PyFloat_AsDouble(args[1]);
    if (carry == -1.0 && PyErr_Occurred())
        return NULL;
    if (hwtimer_current_task_timer == self) {
        PyErr_SetString(PyExc_RuntimeError,
                        "advance_async() cannot be called from a task of the timer it would move");
        return NULL;
    }
    if (advance_lock(self, "advance_async()") < 0)
        return NULL;
    ran_count ran;
    count_start(self, &ran);
    int64_t now = atomic_load(&self->manual_now);
    if (!isnan(carry))
        self->manual_carry = carry;
    bool reached = target <= now || advance_to(self, target, NAN, args[2], &ran);
    uint64_t n = count_end(self, &ran);
    if (advance_unlock(self) < 0)
        return NULL;
    return Py_BuildValue("(KO)", (unsigned long long)n, reached ? Py_True : Py_False);
}

static PyObject *manual_advance_to_next(TimerObject *self, PyObject *unused)
{
    (void)unused;
    if (hwtimer_current_task_timer == self) {
        PyErr_SetString(PyExc_RuntimeError, "advance_to_next() cannot be called from a task of "
                                            "the timer it would move");
        return NULL;
    }
    if (advance_lock(self, "advance_to_next()") < 0)
        return NULL;
    ran_count ran;
    count_start(self, &ran);
    int64_t next = step(self, atomic_load(&self->manual_now), &ran);
    bool moved = false;
    /* A tick with work may only hold a timeout due on a later turn of the
       wheel: go on to the first tick where something falls due. */
    for (int i = 0; next != HWT_NEVER && i < MAX_IDLE_STEPS && !self->interrupted; i++) {
        moved = true;
        next = step(self, next, &ran);
        if (count_end(self, &ran) != 0 || hwt_timer_pending(self->core) == 0)
            break;
    }
    if (moved)
        self->manual_carry = 0; /* at a tick's end */
    if (advance_unlock(self) < 0)
        return NULL;
    if (!moved)
        Py_RETURN_NONE;
    return manual_time(self, NULL);
}

/* _holds(loop): whether callbacks that advance() handed to `loop` are
   still waiting to run there; advance_async() yields until they have. */
static PyObject *manual_holds(TimerObject *self, PyObject *loop)
{
    return PyBool_FromLong(hwtimer_loop_sink_holds(self, loop));
}

static PyObject *manual_new(PyTypeObject *tp, PyObject *args, PyObject *kwds)
{
    static const char *const names[] = {"tick_duration", "ticks_per_wheel", "max_pending_timeouts"};
    static const hwtimer_signature sig = {
        .fname = "ManualTimer", .names = names, .nparams = 3, .nkeyword_only = 1};
    PyObject *given[3] = {NULL};
    if (!hwtimer_init_takes_arguments(tp) && hwtimer_bind_tuple(&sig, args, kwds, given) < 0)
        return NULL;
    hwtimer_timer_args a = {.tick_duration = given[0],
                            .ticks_per_wheel = given[1],
                            .max_pending_timeouts = given[2],
                            .thread_name = Py_None,
                            .executor = Py_None,
                            .default_tick = 0.001,
                            .default_ticks = 4096,
                            .manual = true};
    return hwtimer_timer_build(tp, &a);
}

static PyMethodDef manual_methods[] = {
    {"time", (PyCFunction)manual_time, METH_NOARGS,
     "time($self, /)\n--\n\nThe timer's clock, in seconds; 0.0 when it is made."},
    {"advance", (PyCFunction)(void (*)(void))manual_advance, METH_FASTCALL | METH_KEYWORDS,
     "advance($self, /, seconds)\n--\n\nMoves the clock forward tick by tick, running each "
     "due task in this thread; returns how many tasks ran or were handed to their loop."},
    {"advance_to_next", (PyCFunction)manual_advance_to_next, METH_NOARGS,
     "advance_to_next($self, /)\n--\n\nMoves the clock to the end of the next tick where a "
     "timeout falls due and runs what is due there; returns the new time, or None when "
     "nothing on the wheel will ever fall due."},
    {"_target", (PyCFunction)manual_target, METH_O,
     "_target($self, seconds, /)\n--\n\nThe clock in ns that advance(seconds) would reach, "
     "the carry below a ns it would leave, and the seconds as a float."},
    {"_advance_until", (PyCFunction)(void (*)(void))manual_advance_until, METH_FASTCALL,
     "_advance_until($self, target_ns, carry, loop, /)\n--\n\nadvance_async()'s step."},
    {"_now_ns", (PyCFunction)manual_now_ns, METH_NOARGS,
     "_now_ns($self, /)\n--\n\nThe clock in ns."},
    {"_holds", (PyCFunction)manual_holds, METH_O,
     "_holds($self, loop, /)\n--\n\nWhether callbacks handed to loop wait to run."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot manual_slots[] = {
    {Py_tp_doc, "_ManualTimer(tick_duration=0.001, ticks_per_wheel=4096, *, "
                "max_pending_timeouts=0)\n--\n\n"
                "A HashedWheelTimer with no threads, on a clock the test moves."},
    {Py_tp_new, manual_new},
    {Py_tp_methods, manual_methods},
    {0, NULL},
};

PyType_Spec hwtimer_manual_spec = {
    .name = "hwtimer._hwtimer._ManualTimer",
    .basicsize = sizeof(TimerObject),
    /* GC support, traverse and clear are inherited from HashedWheelTimer */
    .flags = HWTIMER_TPFLAGS | Py_TPFLAGS_BASETYPE,
    .slots = manual_slots,
};
