/*
 * common.c: the helpers the files of the binding share, at the bottom of
 * their dependencies: a type's module state, argument parsing, the clock,
 * logging, and the hooks every timer registers once.  It calls nothing
 * of the other binding files.
 */
#include "binding.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

_Thread_local TimerObject *hwtimer_current_task_timer;

/* never inlined, even by link-time optimisation: binding.h says why */
__attribute__((noinline)) TimerObject **hwtimer_current_task_slot(void)
{
    return &hwtimer_current_task_timer;
}

hwtimer_state *hwtimer_state_of_type(PyTypeObject *tp)
{
    /* A Python subclass (hwtimer.testing.ManualTimer) has no module of its
       own: its C base has. */
#ifdef Py_LIMITED_API
    /* ht_module and tp_base are out of the limited API's sight */
    for (;;) {
        PyObject *module = PyType_GetModule(tp);
        if (module)
            return (hwtimer_state *)PyModule_GetState(module);
        PyTypeObject *base = (PyTypeObject *)PyType_GetSlot(tp, Py_tp_base);
        if (!base || !PyType_HasFeature(base, Py_TPFLAGS_HEAPTYPE))
            return NULL; /* with PyType_GetModule()'s TypeError */
        PyErr_Clear();
        tp = base;
    }
#else
    while (!((PyHeapTypeObject *)tp)->ht_module && tp->tp_base &&
           PyType_HasFeature(tp->tp_base, Py_TPFLAGS_HEAPTYPE))
        tp = tp->tp_base;
    return (hwtimer_state *)PyType_GetModuleState(tp);
#endif
}

/* ---- argument parsing ---- */

static int type_error(const char *what, PyObject *obj)
{
    PyErr_Format(PyExc_TypeError, "%s must be a number of seconds or a timedelta, not %.200s", what,
                 hwtimer_type_name(Py_TYPE(obj)));
    return -1;
}

/* Reads a timedelta as whole microseconds, saturating: those it holds,
   which a subclass's own days, seconds or microseconds do not change (as
   in timedelta's arithmetic), read by timedelta's descriptors.  Returns 0
   or -1. */
static int timedelta_us(PyObject *timedelta_type, PyObject *obj, long double *us)
{
    static const char *const names[3] = {"days", "seconds", "microseconds"};
    static const long double scale[3] = {86400e6L, 1e6L, 1.0L};
    long double total = 0;
    for (int i = 0; i < 3; i++) {
        PyObject *v;
        if (Py_TYPE(obj) == (PyTypeObject *)timedelta_type) {
            v = PyObject_GetAttrString(obj, names[i]);
        } else {
            PyObject *descr = PyObject_GetAttrString(timedelta_type, names[i]);
            v = descr ? PyObject_CallMethod(descr, "__get__", "O", obj) : NULL;
            Py_XDECREF(descr);
        }
        if (!v)
            return -1;
        long long x = PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (x == -1 && PyErr_Occurred())
            return -1;
        total += (long double)x * scale[i];
    }
    *us = total;
    return 0;
}

double hwtimer_as_seconds(PyObject *obj)
{
    /* an int, subclasses too, is its value: not what a subclass's
       __float__ says */
    return PyLong_Check(obj) ? PyLong_AsDouble(obj) : PyFloat_AsDouble(obj);
}

int hwtimer_parse_seconds(hwtimer_state *st, PyObject *obj, const char *what, double *out)
{
    if (PyBool_Check(obj))
        return type_error(what, obj);
    if (PyObject_TypeCheck(obj, (PyTypeObject *)st->timedelta_type)) {
        long double us;
        if (timedelta_us(st->timedelta_type, obj, &us) < 0)
            return -1;
        *out = (double)(us / 1e6L);
        return 0;
    }
    if (!PyFloat_Check(obj) && !PyLong_Check(obj) && !PyIndex_Check(obj) && !HWT_HAS_FLOAT(obj))
        return type_error(what, obj);
    double d = hwtimer_as_seconds(obj);
    if (d == -1.0 && PyErr_Occurred())
        return -1; /* e.g. OverflowError, or what a __float__ raised */
    if (d == 0 && !PyFloat_Check(obj) && !PyLong_Check(obj)) {
        /* a number above 0 too small for a double (a Fraction, a Decimal)
           reads as 0.0: it is the least double above 0 instead, a tick
           that is clamped and a period that is one, not a 0 refused.
           What does not compare with 0 is the 0.0 it says it is. */
        int positive = PyObject_RichCompareBool(obj, Py_False, Py_GT);
        if (positive < 0 && !PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
        if (positive > 0)
            d = 0x1p-1074;
    }
    *out = d;
    return 0;
}

int hwtimer_huge_seconds(PyObject *obj, double *out)
{
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
        return -1;
    if (PyIndex_Check(obj)) {
        PyErr_Clear();
        PyObject *index = PyNumber_Index(obj);
        int positive = index ? PyObject_RichCompareBool(index, Py_False, Py_GT) : -1;
        Py_XDECREF(index);
        if (positive < 0)
            return -1;
        *out = positive ? Py_HUGE_VAL : -Py_HUGE_VAL;
        return 0;
    }
    /* a number past any double that is no int (a Fraction): its sign, by
       comparing it with 0; what cannot say it keeps the OverflowError,
       unless the comparison raised a BaseException (Ctrl-C), which stands */
    if (PyFloat_Check(obj) || PyLong_Check(obj) || !HWT_HAS_FLOAT(obj))
        return -1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int positive = PyObject_RichCompareBool(obj, Py_False, Py_GT);
    int negative = positive == 0 ? PyObject_RichCompareBool(obj, Py_False, Py_LT) : positive;
    if (positive < 0 || negative <= 0) {
        /* an error, or neither above nor below 0: no huge number */
        if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
            return -1;
        }
        PyErr_Clear();
        PyErr_Restore(type, value, tb);
        return -1;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    *out = positive ? Py_HUGE_VAL : -Py_HUGE_VAL;
    return 0;
}

/* Whole seconds, exactly, into saturated ns: those past int64 (from
   9223372037 s) are HWT_NEVER, as a float's are.  Returns 0 or -1. */
static int int_delay(PyObject *integer, int64_t *ns)
{
    int overflow;
    long long s = PyLong_AsLongLongAndOverflow(integer, &overflow);
    if (s == -1 && PyErr_Occurred())
        return -1;
    if (overflow > 0 || s > HWT_NEVER / 1000000000)
        *ns = HWT_NEVER;
    else if (overflow < 0 || s < 0)
        *ns = -1;
    else
        *ns = (int64_t)s * 1000000000;
    return 0;
}

int hwtimer_delay_from_seconds(double d, const char *what, int64_t *ns)
{
    if (isnan(d)) {
        PyErr_Format(PyExc_ValueError, "%s must not be NaN", what);
        return -1;
    }
    double x = d * 1e9;
    if (x >= HWTIMER_NEVER_NS_DOUBLE)
        *ns = HWT_NEVER;
    else if (x <= 0)
        *ns = x <= -1 ? -1 : 0; /* what ceil(x) < 0 means */
    else
        *ns = hwtimer_ceil_ns(x);
    return 0;
}

int hwtimer_parse_any_delay(hwtimer_state *st, PyObject *obj, const char *what, int64_t *ns)
{
    if (PyFloat_CheckExact(obj))
        return hwtimer_delay_from_seconds(PyFloat_AS_DOUBLE(obj), what, ns);
    if (PyLong_CheckExact(obj))
        return int_delay(obj, ns);
    if (PyBool_Check(obj))
        return type_error(what, obj);
    if (PyLong_Check(obj) || (!PyFloat_Check(obj) && PyIndex_Check(obj) && !HWT_HAS_FLOAT(obj))) {
        /* an int, or what stands for one: exact, however large */
        PyObject *integer = PyNumber_Index(obj);
        if (!integer)
            return -1;
        int r = int_delay(integer, ns);
        Py_DECREF(integer);
        return r;
    }
    double d;
    if (hwtimer_parse_seconds(st, obj, what, &d) < 0 && hwtimer_huge_seconds(obj, &d) < 0)
        return -1;
    return hwtimer_delay_from_seconds(d, what, ns);
}

double hwtimer_seconds(int64_t ns)
{
    if (ns % 1000000000 == 0)
        return (double)(ns / 1000000000);
    return (double)ns / 1e9;
}

/* ---- core errors ---- */

int hwtimer_core_error(TimerObject *timer, int err, const char *what)
{
    if (err == ENOMEM) {
        PyErr_NoMemory();
    } else if (err > 0) {
        errno = err; /* OSError, or its subclass for err (BlockingIOError ...) */
        PyErr_SetFromErrno(PyExc_OSError);
    } else if (err == HWT_EREJECTED && timer) {
        PyErr_Format(timer->module_state->rejected_error,
                     "cannot %s: the timer holds max_pending_timeouts (%lld) pending timeouts",
                     what, (long long)timer->max_pending);
    } else if (err == HWT_ESTOPPED && timer && hwt_timer_orphaned(timer->core)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "this timer was started before fork(): create a new timer in the child");
    } else if (err == HWT_ESTOPPED) {
        PyErr_Format(PyExc_RuntimeError, "cannot %s: the timer is stopped", what);
    } else {
        PyErr_Format(PyExc_SystemError, "cannot %s: the timer's core returned %d", what, err);
    }
    return -1;
}

int hwtimer_has_method(PyObject *obj, const char *name)
{
    PyObject *method = PyObject_GetAttrString(obj, name);
    if (!method) {
        /* only an AttributeError says it has none */
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    int callable = HWT_CALLABLE(method);
    Py_DECREF(method);
    return callable;
}

#ifdef Py_LIMITED_API
const char *hwtimer_type_name(PyTypeObject *tp)
{
    static _Thread_local char buf[201];
    Py_ssize_t n = 0;
    PyObject *name = PyObject_GetAttrString((PyObject *)tp, "__name__");
    const char *s = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, &n) : NULL;
    if (!s) {
        PyErr_Clear();
        s = "?";
        n = 1;
    }
    if (n > 200) { /* cut, as %.200s does, never inside a UTF-8 sequence */
        n = 200;
        while (n && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    }
    memcpy(buf, s, (size_t)n);
    buf[n] = '\0';
    Py_XDECREF(name);
    return buf;
}
#endif

/* ---- logging ---- */

void hwtimer_keep_manual_error(TimerObject *timer, PyObject *exc)
{
    PyObject *keep = PyObject_GetAttrString((PyObject *)timer, "_task_failed");
    PyObject *r = keep ? PyObject_CallOneArg(keep, exc) : NULL;
    if (!keep && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear(); /* not a hwtimer.testing.ManualTimer */
    else if (!r)
        PyErr_WriteUnraisable((PyObject *)timer);
    Py_XDECREF(r);
    Py_XDECREF(keep);
}

PyObject *hwtimer_take_exception(void)
{
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb && exc)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return exc;
}

/* Calls the "hwtimer" logger's `method` with `args` (taken; NULL, with the
   error set, if building them failed) and exc_info=exc (or None), and
   writes any failure as unraisable. */
static void log_with(hwtimer_state *st, const char *method, PyObject *args, PyObject *exc)
{
    PyObject *kwargs = args ? Py_BuildValue("{s:O}", "exc_info", exc ? exc : Py_None) : NULL;
    PyObject *log = kwargs ? PyObject_GetAttrString(st->logger, method) : NULL;
    PyObject *r = log ? PyObject_Call(log, args, kwargs) : NULL;
    if (!r)
        PyErr_WriteUnraisable(st->logger);
    Py_XDECREF(r);
    Py_XDECREF(log);
    Py_XDECREF(kwargs);
    Py_XDECREF(args);
}

PyObject *hwtimer_repr_for_log(PyObject *obj)
{
    PyObject *r = PyObject_Repr(obj);
    if (r)
        return r;
    PyObject *exc = hwtimer_take_exception();
    char raised[101] = "an error"; /* hwtimer_type_name() may share one buffer */
    if (exc)
        snprintf(raised, sizeof raised, "%s", hwtimer_type_name(Py_TYPE(exc)));
    Py_XDECREF(exc);
    /* named as object.__repr__ names it (module and qualified name), its
       closing '>' after what the repr raised */
#ifdef Py_LIMITED_API
    reprfunc object_repr = (reprfunc)PyType_GetSlot(&PyBaseObject_Type, Py_tp_repr);
#else
    reprfunc object_repr = PyBaseObject_Type.tp_repr;
#endif
    PyObject *plain = object_repr ? object_repr(obj) : NULL;
    Py_ssize_t len = plain ? PyUnicode_GetLength(plain) : -1;
    PyObject *head = len > 0 ? PyUnicode_Substring(plain, 0, len - 1) : NULL;
    Py_XDECREF(plain);
    if (head) {
        r = PyUnicode_FromFormat("%U (repr() raised %s)>", head, raised);
        Py_DECREF(head);
        return r;
    }
    PyErr_Clear();
    return PyUnicode_FromFormat("<%.100s object at %p (repr() raised %s)>",
                                hwtimer_type_name(Py_TYPE(obj)), (void *)obj, raised);
}

void hwtimer_log_task_error(hwtimer_state *st, PyObject *timeout)
{
    PyObject *exc = hwtimer_take_exception();
    TimerObject *timer = TIMER_OF((TimeoutObject *)timeout);
    if (timer->manual && timer->in_advance && exc &&
        PyErr_GivenExceptionMatches(exc, PyExc_KeyboardInterrupt)) {
        /* advance() raises it: not the task's error, so neither counted
           nor logged as one */
        timer->interrupted = true;
        Py_DECREF(exc);
        return;
    }
    timer->task_errors++;
    if (timer->manual && exc)
        hwtimer_keep_manual_error(timer, exc);
    /* shown here, not by logging's %r: a repr that raises there would
       lose the task's error and traceback to logging's own */
    PyObject *task = hwtimer_repr_for_log(((TimeoutObject *)timeout)->task);
    PyObject *shown = task ? hwtimer_repr_for_log(timeout) : NULL;
    PyObject *args = shown ? Py_BuildValue("(sOO)", "task %s of %s raised", task, shown) : NULL;
    log_with(st, "warning", args, exc);
    Py_XDECREF(shown);
    Py_XDECREF(task);
    Py_XDECREF(exc);
}

void hwtimer_log_error(hwtimer_state *st, const char *msg)
{
    /* The exception set, if any, says why: logged with the message. */
    PyObject *exc = hwtimer_take_exception();
    log_with(st, "error", Py_BuildValue("(s)", msg), exc);
    Py_XDECREF(exc);
}

PyObject *hwtimer_import_attr(const char *module, const char *name)
{
    PyObject *m = PyImport_ImportModule(module);
    if (!m)
        return NULL;
    PyObject *attr = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return attr;
}

void hwtimer_watch_thread_exit(hwtimer_state *st)
{
    if (st->threads_hook)
        return;
    st->threads_hook = true;
    PyObject *reg = hwtimer_import_attr("threading", "_register_atexit");
    PyObject *r = reg ? PyObject_CallOneArg(reg, st->threads_exiting_hook) : NULL;
    Py_XDECREF(r);
    Py_XDECREF(reg);
    PyErr_Clear(); /* an older threading, or one already exiting */
}

bool hwtimer_threads_exiting(hwtimer_state *st)
{
    if (st->threads_exiting)
        return true;
    /* threading calls its exit hooks last registered first: a module
       imported after the hook was registered (concurrent.futures imports
       ThreadPoolExecutor lazily) shuts its executors down before the hook
       runs.  threading sets _SHUTTING_DOWN before it calls any of them.
       The exception set (the refusal) is kept. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *flag = hwtimer_import_attr("threading", "_SHUTTING_DOWN");
    int on = flag ? PyObject_IsTrue(flag) : 0;
    Py_XDECREF(flag);
    PyErr_Clear(); /* an older threading: the hook alone says so */
    PyErr_Restore(type, value, tb);
    if (on > 0)
        st->threads_exiting = true;
    return on > 0;
}

/* The length of `name` cut to at most `max` bytes, at a character's start. */
static size_t cut_utf8(const char *name, size_t max)
{
    size_t n = strlen(name);
    if (n > max) {
        n = max;
        while (n && ((unsigned char)name[n] & 0xC0) == 0x80)
            n--;
    }
    return n;
}

void hwtimer_native_name(const char *name, char out[16])
{
    size_t n = cut_utf8(name, 15);
    memcpy(out, name, n);
    out[n] = '\0';
}

int hwtimer_native_helper_name(PyObject *timer_name, const char *role, char out[16])
{
    const char *name = PyUnicode_AsUTF8AndSize(timer_name, NULL);
    if (!name)
        return -1;
    if (strlen(name) < 15) {
        /* whole characters, then ASCII: the cut at 15 bytes splits none */
        snprintf(out, 16, "%s-%s", name, role);
        return 0;
    }
    size_t n = cut_utf8(name, 13);
    memcpy(out, name, n);
    out[n] = '-';
    out[n + 1] = role[0];
    out[n + 2] = '\0';
    return 0;
}

/* Reads a non-bool int argument into *out, saturated to LLONG_MIN or
   LLONG_MAX when it does not fit, so that the caller's range check refuses
   it with the value the user gave.  Returns 0 or -1. */
int hwtimer_parse_int(PyObject *obj, const char *what, long long *out)
{
    if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.200s", what,
                     hwtimer_type_name(Py_TYPE(obj)));
        return -1;
    }
    PyObject *v = PyNumber_Index(obj);
    if (!v)
        return -1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = overflow > 0 ? LLONG_MAX : overflow < 0 ? LLONG_MIN : x;
    return 0;
}

int hwtimer_value_error(const char *rule, PyObject *obj)
{
    PyObject *r = PyObject_Repr(obj);
    if (!r) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s, not <%.200s object>", rule,
                     hwtimer_type_name(Py_TYPE(obj)));
        return -1;
    }
    PyErr_Format(PyExc_ValueError, "%s, not %U", rule, r);
    Py_DECREF(r);
    return -1;
}

/* ---- binding arguments to parameters ---- */

/* The parameters that may be given by position. */
static Py_ssize_t positional_params(const hwtimer_signature *sig)
{
    return sig->nparams - sig->nkeyword_only;
}

/* Refuses more positional arguments than `sig` takes.  Returns 0 or -1. */
static int check_positional(const hwtimer_signature *sig, Py_ssize_t nargs)
{
    Py_ssize_t max = positional_params(sig);
    if (nargs <= max || sig->varargs)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %s%zd positional argument%s (%zd given)", sig->fname,
                 max == sig->nrequired ? "" : "at most ", max, max == 1 ? "" : "s", nargs);
    return -1;
}

/* Binds the keyword argument `key` (a str) to the parameter of that name,
   which must not be positional-only nor bound already.  Returns 0 or -1.
   The messages show the name by %U, not by its repr() or str(): those of
   a str subclass may raise, and the TypeError must still be the error. */
static int bind_keyword(const hwtimer_signature *sig, PyObject *key, PyObject *value,
                        PyObject **out)
{
    for (Py_ssize_t i = sig->npositional_only; i < sig->nparams; i++) {
        bool same_name = PyUnicode_CompareWithASCIIString(key, sig->names[i]) == 0;
        if (!same_name)
            continue;
        if (out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", sig->fname,
                         key);
            return -1;
        }
        out[i] = value;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", sig->fname, key);
    return -1;
}

/* Refuses a call that left a required parameter unbound.  Returns 0 or
   -1. */
static int check_required(const hwtimer_signature *sig, PyObject *const *out)
{
    for (Py_ssize_t i = 0; i < sig->nrequired; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", sig->fname,
                         sig->names[i]);
            return -1;
        }
    }
    return 0;
}

int hwtimer_bind(const hwtimer_signature *sig, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames, PyObject **out)
{
    if (check_positional(sig, nargs) < 0)
        return -1;
    Py_ssize_t npositional = nargs < positional_params(sig) ? nargs : positional_params(sig);
    for (Py_ssize_t i = 0; i < sig->nparams; i++)
        out[i] = i < npositional ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        if (bind_keyword(sig, PyTuple_GET_ITEM(kwnames, k), args[nargs + k], out) < 0)
            return -1;
    }
    return check_required(sig, out);
}

int hwtimer_bind_tuple(const hwtimer_signature *sig, PyObject *args, PyObject *kwds, PyObject **out)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (check_positional(sig, nargs) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < sig->nparams; i++)
        out[i] = i < nargs && i < positional_params(sig) ? PyTuple_GET_ITEM(args, i) : NULL;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (kwds && PyDict_Next(kwds, &pos, &key, &value)) {
        if (bind_keyword(sig, key, value, out) < 0)
            return -1;
    }
    return check_required(sig, out);
}

PyObject *hwtimer_running_loop(hwtimer_state *st, const char *none)
{
    if (!st->get_running_loop) {
        PyObject *m = PyImport_ImportModule("asyncio.events");
        if (!m)
            return NULL;
        st->get_running_loop = PyObject_GetAttrString(m, "_get_running_loop");
        Py_DECREF(m);
        if (!st->get_running_loop)
            return NULL;
    }
    PyObject *loop = PyObject_CallNoArgs(st->get_running_loop);
    if (loop == Py_None) {
        Py_DECREF(loop);
        PyErr_SetString(PyExc_RuntimeError, none);
        return NULL;
    }
    return loop;
}

int64_t hwtimer_clock_ns(TimerObject *timer)
{
    return hwt_timer_now(timer->core);
}

PyObject *hwtimer_new_refused(PyTypeObject *tp, PyObject *args, PyObject *kwargs)
{
    (void)args;
    (void)kwargs;
    PyErr_Format(PyExc_TypeError, "cannot create '%.100s' instances", hwtimer_type_name(tp));
    return NULL;
}

/* ---- fork()s ---- */

unsigned hwtimer_forks;
unsigned long hwtimer_forking_thread;
static pthread_once_t fork_note_once = PTHREAD_ONCE_INIT;
static int fork_note_err;

static void note_fork(void)
{
    hwtimer_forks++;
    hwtimer_forking_thread = PyThread_get_thread_ident();
}

static void install_fork_note(void)
{
    fork_note_err = pthread_atfork(NULL, NULL, note_fork);
}

int hwtimer_note_forks(void)
{
    pthread_once(&fork_note_once, install_fork_note);
    return fork_note_err;
}
