/*
 * fork_swept_test.c: a fork() made just after another thread's
 * hwt_timer_stop_to() has swept the timer, before that thread has done
 * anything with the list.  The thread stays in the parent, so the child
 * has only the place the list was stored in: it must be there (the store
 * is made before the timer's lock, which fork() takes, is let go), and the
 * child's own stop() must return nothing more, the timer holding nothing.
 *
 * The stop()'s wake-up of a sink of the test's own, made with the timer's
 * lock held after the sweep, tells the main thread to fork; fork() then
 * waits for that lock.  This program defines pthread_mutex_unlock itself:
 * in the stopping thread, from that wake-up on, each unlock is followed by
 * a pause, so that the fork is made during the pause after the timer's
 * lock is let go, before anything stop_to() might still do.
 *
 * Usage: fork_swept_test.  Exits 0 when the child finds the whole list.
 */
#define _GNU_SOURCE
#include "hwt.h"
#include "test_util.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAR 100

static int (*real_unlock)(pthread_mutex_t *);
static __thread bool in_stopper;
static _Atomic bool swept; /* the stop()'s sink wake-up has been made */
static hwt_timer *timer;
static hwt_timeout *stop_list; /* where the stopping thread's stop_to() stores */

int pthread_mutex_unlock(pthread_mutex_t *m)
{
    int r = real_unlock(m);
    if (in_stopper && atomic_load(&swept))
        t_sleep_ns(50000000);
    return r;
}

static void sink_wake(hwt_sink *s)
{
    (void)s;
    if (in_stopper)
        atomic_store(&swept, true);
}

static void *stopper(void *arg)
{
    (void)arg;
    in_stopper = true;
    hwt_timer_stop_to(timer, &stop_list);
    return NULL;
}

/* Whether `list` holds each of far[0..FAR) once and nothing else. */
static bool holds_all(hwt_timeout *list, hwt_timeout *far)
{
    int seen[FAR] = {0}, n = 0;
    for (; list; list = hwt_timeout_of(list->link.next), n++) {
        ptrdiff_t i = list - far;
        if (i < 0 || i >= FAR || seen[i]++)
            return false;
    }
    return n == FAR;
}

int main(void)
{
    real_unlock = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_unlock");
    if (!real_unlock) {
        fprintf(stderr, "fork_swept_test: no pthread_mutex_unlock in the C library\n");
        return 1;
    }
    hwt_config cfg = {.tick_ns = 1000000, .ticks_per_wheel = 64};
    timer = hwt_timer_new(&cfg);
    static hwt_sink sink;
    if (!timer || hwt_sink_init(&sink, timer, sink_wake, -1, NULL) != 0 ||
        hwt_timer_start(timer) != 0) {
        fprintf(stderr, "fork_swept_test: cannot start a timer\n");
        return 1;
    }
    static hwt_timeout far[FAR];
    for (int i = 0; i < FAR; i++) {
        far[i].sink = hwt_timer_default_sink(timer);
        hwt_timer_schedule(timer, &far[i], INT64_C(1000000000000));
    }
    pthread_t stop_thread;
    if (pthread_create(&stop_thread, NULL, stopper, NULL) != 0) {
        fprintf(stderr, "fork_swept_test: pthread_create failed\n");
        return 1;
    }
    for (int i = 0; !atomic_load(&swept); i++) {
        if (i == 100000) {
            fprintf(stderr, "fork_swept_test: the stop() never woke the sink\n");
            return 1;
        }
        usleep(100);
    }
    fflush(stdout);
    pid_t pid = fork(); /* waits for the timer's lock, held by the stop() */
    if (pid < 0) {
        fprintf(stderr, "fork_swept_test: fork failed\n");
        return 1;
    }
    if (pid == 0) {
        bool found = holds_all(stop_list, far);
        hwt_timeout *again = hwt_timer_stop(timer);
        int64_t pending = hwt_timer_pending(timer);
        if (!found || again || pending != 0) {
            fprintf(stderr,
                    "fork_swept_test: child: the parent's list %s; its own stop() returned "
                    "%s, and %lld remain pending\n",
                    found ? "was there" : "was not there whole", again ? "some" : "none",
                    (long long)pending);
            _exit(1);
        }
        printf("fork_swept_test: child: found the %d timeouts the parent's stop() swept\n",
               FAR);
        fflush(stdout);
        _exit(0);
    }
    int failed = !t_child_passed(pid);
    pthread_join(stop_thread, NULL);
    if (!holds_all(stop_list, far)) {
        fprintf(stderr, "fork_swept_test: parent: stop() did not return the %d timeouts\n", FAR);
        failed = 1;
    }
    hwt_sink_destroy(&sink);
    hwt_timer_take_released(timer);
    hwt_timer_decref(timer);
    if (!failed)
        printf("fork_swept_test: passed\n");
    return failed;
}
