/*
 * monitor.c: what an operator sees of a timer: HashedWheelTimer.stats(),
 * with how the pending timeouts spread over the wheel, and
 * pending_snapshot(), the soonest of them as Timeout objects.
 *
 * Both read the wheel under the core's wheel lock with the GIL held: the
 * worker waits that long (it never waits for the GIL, so nothing deadlocks),
 * producers on other threads wait for the GIL as they would for any call.
 */
#include "binding.h"

#include <errno.h>
#include <stdint.h>

/* What the visit collects: strong references, in the order given. */
typedef struct snapshot {
    PyObject **items; /* owned, each an owned reference */
    size_t n, cap;
    bool failed; /* out of memory: the walk takes nothing more */
} snapshot;

/* The core's visitor.  It runs with the wheel locked and the GIL held, and
   runs no Python code: an incref and a PyMem_Realloc. */
static void snapshot_visit(void *ctx, hwt_timeout *node)
{
    snapshot *s = ctx;
    if (s->failed)
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        PyObject **items = PyMem_Realloc(s->items, cap * sizeof(*items));
        if (!items) {
            s->failed = true;
            return;
        }
        s->items = items;
        s->cap = cap;
    }
    /* alive while the wheel is locked: the wheel holds its reference */
    PyObject *to = (PyObject *)TIMEOUT_OF(node);
    Py_INCREF(to);
    s->items[s->n++] = to;
}

/* Drops the references a snapshot took; the wheel is unlocked by now, so
   a last reference may run a task's __del__ here, which is safe. */
static void snapshot_clear(snapshot *s)
{
    for (size_t i = 0; i < s->n; i++)
        Py_DECREF(s->items[i]);
    PyMem_Free(s->items);
}

PyObject *hwtimer_pending_snapshot(TimerObject *timer, size_t limit)
{
    snapshot s = {NULL, 0, 0, false};
    size_t found = 0;
    int err = limit ? hwt_timer_soonest(timer->core, limit, snapshot_visit, &s, &found) : 0;
    if (err || s.failed) {
        snapshot_clear(&s);
        hwtimer_core_error(timer, err ? err : ENOMEM, "take a snapshot");
        return NULL;
    }
    PyObject *list = PyList_New((Py_ssize_t)s.n);
    if (!list) {
        snapshot_clear(&s);
        return NULL;
    }
    for (size_t i = 0; i < s.n; i++)
        PyList_SET_ITEM(list, (Py_ssize_t)i, s.items[i]); /* the list takes it */
    PyMem_Free(s.items);
    /* the cancelled timeouts that the walk unlinked go now, as a tick of
       the worker would let them go, so that nothing keeps their tasks (a
       last reference may run a __del__ here, which is safe) */
    hwtimer_release_handed_back(timer->core);
    return list;
}

/* Sets d[key] to `value` (a new reference, or NULL for a failure already
   set) and drops it.  Returns 0 or -1. */
static int put(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int r = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return r;
}

/* Whether a deadline can ever reach level k: its slots start at
   bucket_ticks, and no finite deadline lies beyond INT64_MAX ns. */
static bool level_reachable(const hwt_level_occupancy *lv, int64_t tick_ns)
{
    return lv->bucket_ticks <= INT64_MAX / tick_ns;
}

/* Returns a new dict of one level's figures, or NULL. */
static PyObject *level_dict(const hwt_level_occupancy *lv, double tick_duration)
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (put(d, "bucket_seconds", PyFloat_FromDouble((double)lv->bucket_ticks * tick_duration)) <
            0 ||
        put(d, "buckets", PyLong_FromUnsignedLongLong(lv->buckets)) < 0 ||
        put(d, "occupied", PyLong_FromUnsignedLongLong(lv->occupied)) < 0 ||
        put(d, "timeouts", PyLong_FromUnsignedLongLong(lv->timeouts)) < 0 ||
        put(d, "fullest", PyLong_FromUnsignedLongLong(lv->fullest)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

/* Adds the wheel's spread, `occ`, to `stats`.  Returns 0 or -1. */
static int put_spread(TimerObject *timer, const hwt_occupancy *occ, PyObject *stats)
{
    int64_t tick_ns = hwt_timer_config(timer->core)->tick_ns;
    PyObject *levels = PyList_New(0);
    if (!levels)
        return -1;
    /* levels no deadline can reach would only add rows of zeros */
    unsigned shown = 1;
    for (unsigned k = 1; k < occ->levels; k++)
        if (occ->level[k].timeouts || level_reachable(&occ->level[k], tick_ns))
            shown = k + 1;
    for (unsigned k = 0; k < shown; k++) {
        PyObject *d = level_dict(&occ->level[k], timer->tick_duration);
        if (!d || PyList_Append(levels, d) < 0) {
            Py_XDECREF(d);
            Py_DECREF(levels);
            return -1;
        }
        Py_DECREF(d);
    }
    if (put(stats, "levels", levels) < 0 ||
        put(stats, "fullest_bucket", PyLong_FromUnsignedLongLong(occ->level[0].fullest)) < 0 ||
        put(stats, "never_due", PyLong_FromUnsignedLongLong(occ->never)) < 0)
        return -1;
    return 0;
}

PyObject *hwtimer_timer_stats(TimerObject *self, PyObject *unused)
{
    (void)unused;
    hwt_stats s;
    hwt_latency lat;
    hwt_occupancy occ;
    int err = hwt_timer_latency(self->core, &lat);
    if (err) {
        hwtimer_core_error(self, err, "read the lateness");
        return NULL;
    }
    /* the counts and the spread at one moment: `pending` is what the
       levels hold */
    hwt_timer_stats_occupancy(self->core, &s, &occ);
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (put(d, "pending", PyLong_FromLongLong(s.pending)) < 0 ||
        put(d, "scheduled", PyLong_FromUnsignedLongLong(s.scheduled)) < 0 ||
        put(d, "expired", PyLong_FromUnsignedLongLong(s.expired)) < 0 ||
        put(d, "cancelled", PyLong_FromUnsignedLongLong(s.cancelled)) < 0 ||
        put(d, "taken_back", PyLong_FromUnsignedLongLong(s.revoked)) < 0 ||
        put(d, "rejected", PyLong_FromUnsignedLongLong(s.rejected)) < 0 ||
        put(d, "task_errors", PyLong_FromUnsignedLongLong(self->task_errors)) < 0 ||
        put(d, "ticks", PyLong_FromUnsignedLongLong(s.ticks)) < 0 ||
        put(d, "wakeups", PyLong_FromUnsignedLongLong(s.wakeups)) < 0 ||
        put(d, "max_expired_per_tick", PyLong_FromUnsignedLongLong(s.max_expired_per_tick)) < 0 ||
        put(d, "late_p50", PyFloat_FromDouble((double)lat.late_p50 / 1e9)) < 0 ||
        put(d, "late_p99", PyFloat_FromDouble((double)lat.late_p99 / 1e9)) < 0 ||
        put(d, "late_max", PyFloat_FromDouble((double)lat.late_max / 1e9)) < 0 ||
        put(d, "late_samples", PyLong_FromSize_t(lat.samples)) < 0 ||
        put(d, "untimed_tasks", PyLong_FromUnsignedLongLong(lat.untimed)) < 0 ||
        put(d, "task_time_max", PyFloat_FromDouble((double)lat.task_time_max / 1e9)) < 0 ||
        put_spread(self, &occ, d) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    hwtimer_release_handed_back(self->core); /* as in pending_snapshot() */
    return d;
}
