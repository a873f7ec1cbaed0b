/* The floors that hwtimer's hot paths are measured against: only the work
 * that any timer must do in the same calls, and nothing else, so that a
 * figure of hwtimer's can be read as a ratio to what cannot be avoided.
 * benchmarks/floor.py builds it; nothing in the package uses it.
 *
 * new_timeout(task, delay) reads the float, reads CLOCK_MONOTONIC once,
 * keeps a reference to the task, adds one to an atomic pending count and
 * pushes a node onto a lock-free stack; it returns a handle whose cancel()
 * takes a mutex, flips the node's state by compare-and-swap, appends the
 * node to a vector and unlocks.  Handles come from a ring of RING made at
 * import; a worker would drain the stack and the vector, here the call that
 * wraps the ring does (a few ns a pair), so nothing grows.
 *
 * nothing(task, delay) returns a handle whose cancel() does nothing: two
 * C calls and no work, the interpreter's share of a pair.
 *
 * burst(fn, args[, touch]) calls fn(arg) for each item of the list args, in
 * C, and drops the last reference to each argument as it goes (freeing it),
 * as a dispatch thread runs a burst of expired timeouts.  With a true touch
 * it also reads and writes each argument's last bytes before the call, as a
 * dispatch reads and writes the whole of a Timeout (the loop alone touches
 * the first 16 bytes).  make_args(n) makes the list: n objects of a plain
 * type the size of a hwtimer Timeout, the only objects a touch may write
 * into (any other list is refused with a TypeError).  make_gc_args(n) makes
 * n objects of a type with the cyclic GC's header, 80 bytes with it as a
 * Timeout is, untracked as a Timeout that only the wheel holds is, and
 * freed as a GC object is (untracked, then PyObject_GC_Del).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#define RING 1024 /* a power of two */

typedef struct floor_node {
    struct floor_node *next;
    atomic_int state; /* 0 pending, 1 cancelled */
    int64_t deadline_ns;
} floor_node;

typedef struct {
    PyObject_HEAD
    floor_node node;
    PyObject *task; /* owned, or NULL */
} Handle;

typedef struct {
    PyObject_HEAD
    char payload[64]; /* a Timeout's 80 bytes in all */
} Arg;

typedef struct {
    PyObject_HEAD
    char payload[48]; /* with the GC header, a Timeout's 80 bytes */
} GcArg;

/* One floor per process: the benchmark needs no more. */
static _Atomic(floor_node *) stack;
static atomic_long pending;
static pthread_mutex_t cancel_lock = PTHREAD_MUTEX_INITIALIZER;
static floor_node *cancels[RING];
static size_t cancel_count;
static Handle *ring[RING];  /* owned */
static Handle *idle_handle; /* owned: what nothing() returns */
static size_t ring_next;
static PyTypeObject *handle_type, *idle_type, *arg_type, *gc_arg_type;

/* What a worker does off the producer's thread: takes the new timeouts and
 * the cancels, so that the ring's handles can be pushed again. */
static void drain(void)
{
    atomic_store_explicit(&stack, NULL, memory_order_relaxed);
    pthread_mutex_lock(&cancel_lock);
    cancel_count = 0;
    pthread_mutex_unlock(&cancel_lock);
    for (size_t i = 0; i < RING; i++)
        atomic_store_explicit(&ring[i]->node.state, 0, memory_order_relaxed);
    atomic_fetch_sub_explicit(&pending, RING, memory_order_relaxed);
}

static PyObject *new_timeout(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "new_timeout(task, delay)");
        return NULL;
    }
    double delay = PyFloat_AsDouble(args[1]);
    if (delay == -1.0 && PyErr_Occurred())
        return NULL;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((ring_next & (RING - 1)) == 0 && ring_next)
        drain();
    Handle *h = ring[ring_next++ & (RING - 1)];
    h->node.deadline_ns = now.tv_sec * 1000000000LL + now.tv_nsec + (int64_t)(delay * 1e9);
    Py_INCREF(args[0]);
    Py_XSETREF(h->task, args[0]);
    atomic_fetch_add_explicit(&pending, 1, memory_order_relaxed);
    floor_node *head = atomic_load_explicit(&stack, memory_order_relaxed);
    do
        h->node.next = head;
    while (!atomic_compare_exchange_weak_explicit(&stack, &head, &h->node, memory_order_release,
                                                  memory_order_relaxed));
    Py_INCREF(h);
    return (PyObject *)h;
}

static PyObject *handle_cancel(PyObject *self, PyObject *unused)
{
    (void)unused;
    Handle *h = (Handle *)self;
    int expected = 0;
    pthread_mutex_lock(&cancel_lock);
    int won = atomic_compare_exchange_strong(&h->node.state, &expected, 1);
    if (won && cancel_count < RING)
        cancels[cancel_count++] = &h->node;
    pthread_mutex_unlock(&cancel_lock);
    return PyBool_FromLong(won);
}

static PyObject *nothing(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module, (void)args, (void)nargs;
    Py_INCREF(idle_handle);
    return (PyObject *)idle_handle;
}

static PyObject *idle_cancel(PyObject *self, PyObject *unused)
{
    (void)self, (void)unused;
    Py_RETURN_TRUE;
}

static void handle_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    Py_CLEAR(((Handle *)self)->task);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Returns a new list of `arg` fresh objects, Arg or (gc) GcArg, or NULL
   with an exception. */
static PyObject *new_args(PyObject *arg, bool gc)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n < 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "n must be >= 0");
    PyObject *list = PyList_New(n);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = gc ? (PyObject *)PyObject_GC_New(GcArg, gc_arg_type)
                         : (PyObject *)PyObject_New(Arg, arg_type);
        if (a == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        /* the payload: all of either type after the object's head */
        memset((char *)a + sizeof(PyObject), 0,
               (size_t)Py_TYPE(a)->tp_basicsize - sizeof(PyObject));
        PyList_SET_ITEM(list, i, a);
    }
    return list;
}

static PyObject *make_args(PyObject *module, PyObject *arg)
{
    (void)module;
    return new_args(arg, false);
}

static PyObject *make_gc_args(PyObject *module, PyObject *arg)
{
    (void)module;
    return new_args(arg, true);
}

/* burst(fn, args[, touch]): empties the list args, calling fn(arg) for each
 * item and then freeing it; returns the ns the loop took.  An exception fn
 * raises is printed and the loop goes on, as a dispatch thread's would. */
static PyObject *burst(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 2 || nargs > 3 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "burst(fn, list[, touch])");
        return NULL;
    }
    int touch = nargs == 3 ? PyObject_IsTrue(args[2]) : 0;
    if (touch < 0)
        return NULL;
    PyObject *fn = args[0], *list = args[1];
    Py_ssize_t n = PyList_GET_SIZE(list);
    for (Py_ssize_t i = 0; touch && i < n; i++) /* it writes into each: make_args()'s only */
        if (!Py_IS_TYPE(PyList_GET_ITEM(list, i), arg_type)) {
            PyErr_SetString(PyExc_TypeError, "burst(): touch needs make_args()'s list");
            return NULL;
        }
    PyObject **items = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(PyObject *));
    if (items == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        items[i] = PyList_GET_ITEM(list, i);
        Py_INCREF(items[i]);
    }
    if (PyList_SetSlice(list, 0, n, NULL) < 0) { /* ours are now the last references */
        for (Py_ssize_t i = 0; i < n; i++)
            Py_DECREF(items[i]);
        PyMem_Free(items);
        return NULL;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (touch) {
            Arg *a = (Arg *)items[i];
            a->payload[47] = (char)(a->payload[63] + 1); /* bytes 63 and 79 */
        }
        PyObject *r = PyObject_CallOneArg(fn, items[i]);
        if (r == NULL)
            PyErr_Print();
        Py_XDECREF(r);
        Py_DECREF(items[i]);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    PyMem_Free(items);
    return PyLong_FromLongLong((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec));
}

static PyMethodDef handle_methods[] = {
    {"cancel", handle_cancel, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static PyMethodDef idle_methods[] = {
    {"cancel", idle_cancel, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static PyType_Slot handle_slots[] = {
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_methods, handle_methods},
    {0, NULL},
};
static PyType_Slot idle_slots[] = {
    {Py_tp_dealloc, handle_dealloc},
    {Py_tp_methods, idle_methods},
    {0, NULL},
};
static void arg_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot arg_slots[] = {{Py_tp_dealloc, arg_dealloc}, {0, NULL}};

static int gc_arg_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static void gc_arg_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyType_Slot gc_arg_slots[] = {
    {Py_tp_dealloc, gc_arg_dealloc},
    {Py_tp_traverse, gc_arg_traverse},
    {0, NULL},
};
static PyType_Spec handle_spec = {"_hwtfloor.Handle", sizeof(Handle), 0, Py_TPFLAGS_DEFAULT,
                                  handle_slots};
static PyType_Spec idle_spec = {"_hwtfloor.IdleHandle", sizeof(Handle), 0, Py_TPFLAGS_DEFAULT,
                                idle_slots};
static PyType_Spec arg_spec = {"_hwtfloor.Arg", sizeof(Arg), 0, Py_TPFLAGS_DEFAULT, arg_slots};
static PyType_Spec gc_arg_spec = {"_hwtfloor.GcArg", sizeof(GcArg), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, gc_arg_slots};

/* Returns a new Handle of type tp, or NULL with an exception. */
static Handle *new_handle(PyTypeObject *tp)
{
    Handle *h = PyObject_New(Handle, tp);
    if (h != NULL) {
        h->node.next = NULL;
        atomic_init(&h->node.state, 0);
        h->node.deadline_ns = 0;
        h->task = NULL;
    }
    return h;
}

static PyMethodDef module_methods[] = {
    {"new_timeout", (PyCFunction)(void (*)(void))new_timeout, METH_FASTCALL, NULL},
    {"nothing", (PyCFunction)(void (*)(void))nothing, METH_FASTCALL, NULL},
    {"burst", (PyCFunction)(void (*)(void))burst, METH_FASTCALL, NULL},
    {"make_args", make_args, METH_O, NULL},
    {"make_gc_args", make_gc_args, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef floor_module = {
    PyModuleDef_HEAD_INIT, "_hwtfloor", NULL, -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hwtfloor(void)
{
    handle_type = (PyTypeObject *)PyType_FromSpec(&handle_spec);
    idle_type = (PyTypeObject *)PyType_FromSpec(&idle_spec);
    arg_type = (PyTypeObject *)PyType_FromSpec(&arg_spec);
    gc_arg_type = (PyTypeObject *)PyType_FromSpec(&gc_arg_spec);
    if (handle_type == NULL || idle_type == NULL || arg_type == NULL || gc_arg_type == NULL)
        return NULL;
    for (size_t i = 0; i < RING; i++)
        if ((ring[i] = new_handle(handle_type)) == NULL)
            return NULL;
    if ((idle_handle = new_handle(idle_type)) == NULL)
        return NULL;
    return PyModule_Create(&floor_module);
}
