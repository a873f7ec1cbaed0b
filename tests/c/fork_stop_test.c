/*
 * fork_stop_test.c: a fork() made while another thread's hwt_timer_stop()
 * waits for the worker.  That stop() has marked the timer stopped but not
 * yet swept what it holds, and its thread stays in the parent; the child's
 * own stop() must return what it holds (else the child's pending count
 * keeps them for good, and nothing ever gives them back).
 *
 * This program defines clock_gettime and pthread_join itself: the
 * worker's clock read at the start of a tick, made with the timer's lock
 * held, waits until the stop() has begun, and that stop()'s join of the
 * worker, once the worker has exited, waits until the fork is made; so
 * the fork lands where it may by chance, between the stop()'s marking the
 * timer stopped and its sweep.
 *
 * Usage: fork_stop_test.  Exits 0 when the child's stop() returns what the
 * timer held, as the parent's does.
 */
#define _GNU_SOURCE
#include "hwt.h"
#include "test_util.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FAR 100

static __thread bool not_worker; /* the test's own threads */
static __thread bool in_stopper;
/* 0 off, 1 armed, 2 the worker holds its lock in a clock read, 3 let go */
static _Atomic int stage;
/* the stopper's join of the worker has returned; the fork is made */
static _Atomic bool joined, forked;
static hwt_timer *timer;
static _Atomic int parent_returned = -1;

static int real_clock_gettime(clockid_t id, struct timespec *ts)
{
    static int (*fn)(clockid_t, struct timespec *);
    if (!fn)
        fn = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (!fn) {
        fprintf(stderr, "fork_stop_test: no clock_gettime in the C library\n");
        abort();
    }
    return fn(id, ts);
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    int armed = 1;
    if (!not_worker && atomic_compare_exchange_strong(&stage, &armed, 2)) {
        while (atomic_load(&stage) != 3)
            usleep(100);
    }
    return real_clock_gettime(id, ts);
}

int pthread_join(pthread_t thread, void **ret)
{
    static int (*fn)(pthread_t, void **);
    if (!fn)
        fn = (int (*)(pthread_t, void **))dlsym(RTLD_NEXT, "pthread_join");
    if (!fn) {
        fprintf(stderr, "fork_stop_test: no pthread_join in the C library\n");
        abort();
    }
    int r = fn(thread, ret);
    if (in_stopper) {
        atomic_store(&joined, true);
        while (!atomic_load(&forked))
            usleep(100);
    }
    return r;
}

static int count(hwt_timeout *list)
{
    int n = 0;
    for (; list; list = hwt_timeout_of(list->link.next))
        n++;
    return n;
}

static void *stopper(void *arg)
{
    (void)arg;
    not_worker = in_stopper = true;
    atomic_store(&parent_returned, count(hwt_timer_stop(timer)));
    return NULL;
}

static void wait_for(bool (*done)(void))
{
    for (int i = 0; !done(); i++) {
        if (i == 100000) {
            fprintf(stderr, "fork_stop_test: the worker or the stop() never got there\n");
            exit(1);
        }
        usleep(100);
    }
}

static bool worker_held(void)
{
    return atomic_load(&stage) == 2;
}

static bool stop_begun(void)
{
    return hwt_timer_stopped(timer);
}

static bool stop_joined(void)
{
    return atomic_load(&joined);
}

int main(void)
{
    not_worker = true;
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = 64};
    timer = hwt_timer_new(&cfg);
    if (!timer || hwt_timer_start(timer) != 0) {
        fprintf(stderr, "fork_stop_test: cannot start a timer\n");
        return 1;
    }
    static hwt_timeout far[FAR], kick;
    for (int i = 0; i < FAR; i++) {
        far[i].sink = hwt_timer_default_sink(timer);
        hwt_timer_schedule(timer, &far[i], INT64_C(1000000000000));
    }
    t_sleep_ns(50000000); /* the worker takes them and sleeps */
    atomic_store(&stage, 1);
    kick.sink = hwt_timer_default_sink(timer);
    hwt_timer_schedule(timer, &kick, 0); /* wakes it: its next tick's clock read waits */
    wait_for(worker_held);
    pthread_t stop_thread;
    if (pthread_create(&stop_thread, NULL, stopper, NULL) != 0) {
        fprintf(stderr, "fork_stop_test: pthread_create failed\n");
        return 1;
    }
    wait_for(stop_begun);
    atomic_store(&stage, 3); /* the worker ends its tick and exits */
    wait_for(stop_joined);
    fflush(stdout);
    pid_t pid = fork();
    atomic_store(&forked, true);
    if (pid < 0) {
        fprintf(stderr, "fork_stop_test: fork failed\n");
        return 1;
    }
    if (pid == 0) {
        int64_t pending = hwt_timer_pending(timer);
        int returned = count(hwt_timer_stop(timer));
        int64_t after = hwt_timer_pending(timer);
        int again = count(hwt_timer_stop(timer));
        if (pending < FAR || returned != pending || after != 0 || again != 0) {
            fprintf(stderr,
                    "fork_stop_test: child: stop() returned %d of %lld pending; %lld pending "
                    "after it, and a second stop() returned %d\n",
                    returned, (long long)pending, (long long)after, again);
            _exit(1);
        }
        printf("fork_stop_test: child: stop() returned the %d timeouts that the parent's "
               "stop() had yet to sweep\n",
               returned);
        fflush(stdout);
        _exit(0);
    }
    int failed = !t_child_passed(pid);
    pthread_join(stop_thread, NULL);
    /* the kick too, unless its tick had ended by the worker's clock read */
    int fired = hwt_sink_take(hwt_timer_default_sink(timer)) == &kick;
    if (atomic_load(&parent_returned) + fired != FAR + 1) {
        fprintf(stderr, "fork_stop_test: parent: stop() returned %d, and %d fired, of %d\n",
                atomic_load(&parent_returned), fired, FAR + 1);
        failed = 1;
    }
    hwt_timer_take_released(timer);
    hwt_timer_decref(timer);
    if (!failed)
        printf("fork_stop_test: passed\n");
    return failed;
}
