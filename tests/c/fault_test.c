/*
 * fault_test.c: the core's error rule (hwt.h, "Errors") where the system
 * fails.  This program defines pthread_mutex_init, pthread_cond_init and
 * the condattr calls itself, so the core's calls reach these wrappers,
 * which pass to the C library's (dlsym RTLD_NEXT) and count what is alive;
 * one chosen call fails with EAGAIN instead.  Failing each call in turn
 * checks that hwt_timer_new and hwt_sink_init report that error (not
 * ENOMEM) and undo everything they had made, and that a child of fork()
 * that cannot make a timer's condition variables again says so at start.
 * A start that the embedder takes back (hwt_timer_unstart, when its own
 * part of a start fails) keeps every timeout for the next start or stop.
 * It defines pthread_atfork too: when the core's one call of it fails, in a
 * child process that has made no timer yet, every hwt_timer_new fails.
 *
 * Usage: fault_test.  Exits 0 when every check holds.
 */
#define _GNU_SOURCE
#include "hwt.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int calls;      /* counted init calls so far */
static int fail_at;    /* the one that fails (1-based), or 0 */
static int live_mutex; /* made and not yet destroyed */
static int live_cond;  /* the same, condition variables */
static int live_attr;  /* the same, condition variable attributes */
static int checks_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fault_test:%d: ", __LINE__);                                          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            checks_failed++;                                                                       \
        }                                                                                          \
    } while (0)

/* Whether this counted call is the one that fails. */
static int injected(void)
{
    return ++calls == fail_at;
}

static void *real(const char *name)
{
    void *fn = dlsym(RTLD_NEXT, name);
    if (!fn) {
        fprintf(stderr, "fault_test: no %s in the C library\n", name);
        abort();
    }
    return fn;
}

/* Defines the init call `name`: counted, failing when injected, and on
   success one more of `live`. */
#define WRAP_INIT(name, live, params, args)                                                        \
    int name params                                                                                \
    {                                                                                              \
        static int (*fn) params;                                                                   \
        if (!fn)                                                                                   \
            fn = (int (*) params)real(#name);                                                      \
        if (injected())                                                                            \
            return EAGAIN;                                                                         \
        int err = fn args;                                                                         \
        live += !err;                                                                              \
        return err;                                                                                \
    }

/* Defines the destroy call `name` of a `type`: one fewer of `live`. */
#define WRAP_DESTROY(name, live, type)                                                             \
    int name(type *p)                                                                              \
    {                                                                                              \
        static int (*fn)(type *);                                                                  \
        if (!fn)                                                                                   \
            fn = (int (*)(type *))real(#name);                                                     \
        live--;                                                                                    \
        return fn(p);                                                                              \
    }

static int live_clock; /* setclock makes nothing: counted here, never checked */

WRAP_INIT(pthread_mutex_init, live_mutex, (pthread_mutex_t *m, const pthread_mutexattr_t *a),
          (m, a))
WRAP_DESTROY(pthread_mutex_destroy, live_mutex, pthread_mutex_t)
WRAP_INIT(pthread_cond_init, live_cond, (pthread_cond_t *c, const pthread_condattr_t *a), (c, a))
WRAP_DESTROY(pthread_cond_destroy, live_cond, pthread_cond_t)
WRAP_INIT(pthread_condattr_init, live_attr, (pthread_condattr_t *a), (a))
WRAP_DESTROY(pthread_condattr_destroy, live_attr, pthread_condattr_t)
WRAP_INIT(pthread_condattr_setclock, live_clock, (pthread_condattr_t *a, clockid_t clock),
          (a, clock))

/* glibc's pthread_atfork is a static stub over this, linked into each
   program (and so replaceable by the program's own); other C libraries
   export pthread_atfork itself. */
#ifdef __GLIBC__
extern int __register_atfork(void (*)(void), void (*)(void), void (*)(void), void *);
extern void *__dso_handle;
#endif

static int fail_atfork; /* pthread_atfork fails with ENOMEM */
static int atfork_calls;

int pthread_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void))
{
    atfork_calls++;
    if (fail_atfork)
        return ENOMEM;
#ifdef __GLIBC__
    return __register_atfork(prepare, parent, child, __dso_handle);
#else
    static int (*fn)(void (*)(void), void (*)(void), void (*)(void));
    if (!fn)
        fn = (int (*)(void (*)(void), void (*)(void), void (*)(void)))real("pthread_atfork");
    return fn(prepare, parent, child);
#endif
}

static const hwt_config config = {.tick_ns = 1000000, .ticks_per_wheel = 64};

/* Fails each init call of hwt_timer_new in turn; returns how many it has. */
static int check_timer_new(void)
{
    for (int k = 1;; k++) {
        calls = 0;
        fail_at = k;
        errno = 0;
        hwt_timer *t = hwt_timer_new(&config);
        fail_at = 0;
        if (t) { /* k is past its last init: every failure point was seen */
            hwt_timer_decref(t);
            CHECK(!live_mutex && !live_cond && !live_attr, "timer freed, %d/%d/%d still alive",
                  live_mutex, live_cond, live_attr);
            return k - 1;
        }
        CHECK(errno == EAGAIN, "hwt_timer_new with init %d failing: errno %d, not EAGAIN", k,
              errno);
        CHECK(!live_mutex && !live_cond && !live_attr,
              "hwt_timer_new with init %d failing left %d mutexes, %d conds, %d attrs", k,
              live_mutex, live_cond, live_attr);
        if (k > 100) {
            CHECK(0, "hwt_timer_new never succeeds");
            return k;
        }
    }
}

/* Fails each init call of hwt_sink_init in turn. */
static void check_sink_init(void)
{
    hwt_timer *t = hwt_timer_new(&config);
    CHECK(t != NULL, "hwt_timer_new failed: errno %d", errno);
    if (!t)
        return;
    int mutexes = live_mutex, conds = live_cond;
    hwt_sink s;
    for (int k = 1; k <= 100; k++) {
        calls = 0;
        fail_at = k;
        int err = hwt_sink_init(&s, t, NULL, -1, NULL);
        fail_at = 0;
        if (!err) {
            CHECK(k > 2, "hwt_sink_init made its mutex and cond in %d calls", k - 1);
            hwt_sink_destroy(&s);
            break;
        }
        CHECK(err == EAGAIN, "hwt_sink_init with init %d failing returned %d, not EAGAIN", k, err);
        CHECK(live_mutex == mutexes && live_cond == conds && !live_attr,
              "hwt_sink_init with init %d failing left %d mutexes, %d conds, %d attrs", k,
              live_mutex - mutexes, live_cond - conds, live_attr);
    }
    hwt_timer_decref(t);
}

/* A child of fork() whose first init call fails: the timer cannot be
   used there, and start says why. */
static void check_fork(void)
{
    hwt_timer *t = hwt_timer_new(&config);
    CHECK(t != NULL, "hwt_timer_new failed: errno %d", errno);
    if (!t)
        return;
    calls = 0;
    fail_at = 1; /* only the child makes anything during fork() */
    fflush(NULL);
    pid_t pid = fork();
    fail_at = 0;
    if (pid == 0) {
        int bad = 0;
        bad |= !hwt_timer_orphaned(t);
        bad |= (hwt_timer_start(t) != EAGAIN) << 1;
        hwt_timeout to = {.sink = hwt_timer_default_sink(t)};
        bad |= (hwt_timer_schedule(t, &to, 1) != HWT_ESTOPPED) << 2;
        _exit(bad);
    }
    CHECK(pid > 0, "fork failed");
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "fork child: status %#x (1: not orphaned, 2: start did not return EAGAIN, "
          "4: schedule did not return HWT_ESTOPPED)",
          WIFEXITED(status) ? WEXITSTATUS(status) : status);
    /* the parent's timer is untouched: it starts and stops */
    CHECK(!hwt_timer_orphaned(t), "the parent's timer is orphaned");
    CHECK(hwt_timer_start(t) == 0, "the parent's timer does not start");
    CHECK(hwt_timer_stop(t) == NULL, "stop returned timeouts");
    hwt_timer_decref(t);
}

/* Waits for the worker to deliver something to `sink`; returns it. */
static hwt_timeout *wait_delivered(hwt_sink *sink)
{
    bool finished = false;
    hwt_timeout *got = NULL;
    while (!got && !finished)
        got = hwt_sink_wait(sink, &finished, NULL);
    return got;
}

/* A start taken back: the worker goes, what was scheduled stays (queued,
   on the wheel, delivered), on the first start's clock; the timer then
   starts again and runs it, or stops and returns it. */
static void check_unstart(void)
{
    hwt_timer *t = hwt_timer_new(&config);
    hwt_timer *t2 = hwt_timer_new(&config);
    CHECK(t && t2, "hwt_timer_new failed: errno %d", errno);
    if (!t || !t2)
        return;
    hwt_sink *sink = hwt_timer_default_sink(t);
    hwt_timeout fired = {.sink = sink}, due = {.sink = sink}, far = {.sink = sink};
    hwt_timeout refused = {.sink = sink};
    CHECK(hwt_timer_start(t) == 0, "start failed");
    int64_t start = hwt_timer_start_time(t);
    CHECK(hwt_timer_schedule(t, &fired, 0) == HWT_OK, "schedule failed");
    CHECK(hwt_timer_schedule(t, &far, INT64_C(3600000000000)) == HWT_OK, "schedule failed");
    CHECK(wait_delivered(sink) == &fired, "the worker did not deliver the first timeout");
    CHECK(hwt_timer_schedule(t, &due, 20000000) == HWT_OK, "schedule failed");
    usleep(5000); /* maybe on the wheel by now, maybe still queued */
    hwt_timer_unstart(t);
    CHECK(!hwt_timer_started(t) && !hwt_timer_stopped(t), "unstarted, it is not as new");
    CHECK(hwt_timer_schedule(t, &refused, 0) == HWT_ESTOPPED, "unstarted, it takes schedules");
    usleep(40000); /* `due` is due: nothing delivers it */
    CHECK(hwt_sink_take(sink) == NULL, "delivered with no worker");
    CHECK(hwt_timer_start(t) == 0, "no second start");
    CHECK(hwt_timer_start_time(t) == start, "the second start moved the clock");
    CHECK(wait_delivered(sink) == &due, "the second start did not deliver the due timeout");
    hwt_timeout *left = hwt_timer_stop(t);
    CHECK(left == &far && !far.link.next, "stop did not return the far timeout alone");
    CHECK(hwt_timer_take_released(t) == NULL, "something was released");
    hwt_timer_decref(t);

    /* taken back, then stopped: stop returns what it kept */
    hwt_timeout kept = {.sink = hwt_timer_default_sink(t2)};
    CHECK(hwt_timer_start(t2) == 0, "start failed");
    CHECK(hwt_timer_schedule(t2, &kept, INT64_C(3600000000000)) == HWT_OK, "schedule failed");
    hwt_timer_unstart(t2);
    left = hwt_timer_stop(t2);
    CHECK(left == &kept && !kept.link.next, "stop after unstart did not return the timeout");
    CHECK(hwt_timer_stopped(t2) && hwt_timer_start(t2) == EALREADY, "stopped, it starts again");
    CHECK(hwt_timer_stop(t2) == NULL, "a second stop returned timeouts");
    hwt_timer_decref(t2);
}

static void check_round_ticks(void)
{
    uint32_t n = 7;
    CHECK(hwt_round_ticks(0, &n) == EINVAL && n == 7, "hwt_round_ticks(0)");
    CHECK(hwt_round_ticks((uint64_t)HWT_MAX_TICKS_PER_WHEEL + 1, &n) == EINVAL && n == 7,
          "hwt_round_ticks(2**30 + 1)");
    CHECK(hwt_round_ticks(5, &n) == 0 && n == 8, "hwt_round_ticks(5): %u", n);
    CHECK(hwt_round_ticks(HWT_MAX_TICKS_PER_WHEEL, &n) == 0 && n == HWT_MAX_TICKS_PER_WHEEL,
          "hwt_round_ticks(2**30): %u", n);
    hwt_config bad = config;
    bad.ticks_per_wheel = 0;
    errno = 0;
    CHECK(hwt_timer_new(&bad) == NULL && errno == EINVAL, "hwt_timer_new, no wheel: errno %d",
          errno);
}

/* In a child that has made no timer: the core's pthread_atfork call fails,
   and so does every hwt_timer_new, without making anything. */
static void check_atfork_failure(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        fail_atfork = 1;
        atfork_calls = 0; /* the core's calls from here on */
        for (int i = 0; i < 2; i++) {
            errno = 0;
            hwt_timer *t = hwt_timer_new(&config);
            if (t || errno != ENOMEM || live_mutex || live_cond || live_attr) {
                fprintf(stderr,
                        "fault_test: hwt_timer_new %d after a failed pthread_atfork: %p, "
                        "errno %d\n",
                        i, (void *)t, errno);
                _exit(1);
            }
        }
        _exit(atfork_calls == 1 ? 0 : 2);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork failed");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a failed pthread_atfork: the child's check ended with status %d", status);
}

int main(void)
{
    /* first: the core calls pthread_atfork once in a process, at its first timer */
    check_atfork_failure();
    int points = check_timer_new();
    /* 3 mutexes, 2 sinks' mutex and condition variable: at least 7 */
    CHECK(points >= 7, "hwt_timer_new made %d objects, expected at least 7", points);
    check_sink_init();
    check_fork();
    check_unstart();
    check_round_ticks();
    if (checks_failed) {
        fprintf(stderr, "fault_test: %d checks failed\n", checks_failed);
        return 1;
    }
    printf("fault_test: %d failure points of hwt_timer_new, pthread_atfork, sink init, fork, "
           "unstart and rounding passed\n",
           points);
    return 0;
}
