/*
 * fork_take_test.c: a fork() never finds a delivered timeout in neither
 * place its consumer keeps it.  A consumer that waits on a sink
 * (hwt_sink_wait) keeps what it takes in a slot of its own, for a child
 * of fork() to find: the dispatch thread's batch, which the child's
 * stop() returns (a periodic timeout would otherwise stay pending there
 * for good).  hwt_sink_wait stores into that slot before it lets go of
 * the sink's lock, which the core's fork handlers take, so that the
 * child sees the timeout still in the sink or in the slot, never between.
 *
 * A consumer thread takes one timeout, puts it back (before emptying its
 * slot) and takes it again, without pause, while the main thread forks.
 * Each child looks for it.
 *
 * Usage: fork_take_test [FORKS].  Exits 0 when every child found it.
 */
#define _GNU_SOURCE
#include "hwt.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static hwt_sink *sink;
static hwt_timeout token;
static hwt_timeout *slot; /* the consumer's: what it took, until put back */
static _Atomic bool stopping;
static _Atomic long takes;

static void *consume(void *arg)
{
    (void)arg;
    while (!atomic_load(&stopping)) {
        bool finished;
        hwt_timeout *got = hwt_sink_wait(sink, &finished, &slot);
        if (got != &token) {
            fprintf(stderr, "fork_take_test: took %p, not the token\n", (void *)got);
            abort();
        }
        atomic_fetch_add_explicit(&takes, 1, memory_order_relaxed);
        hwt_sink_put_back(sink, got); /* then, only then, out of the slot */
        slot = NULL;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int forks = argc > 1 ? atoi(argv[1]) : 2000;
    hwt_config config = {.tick_ns = 1000000, .ticks_per_wheel = 64};
    hwt_timer *t = hwt_timer_new(&config);
    if (!t) {
        fprintf(stderr, "fork_take_test: hwt_timer_new: errno %d\n", errno);
        return 1;
    }
    sink = hwt_timer_default_sink(t);
    token.sink = sink;
    hwt_sink_put_back(sink, &token);
    pthread_t consumer;
    if (pthread_create(&consumer, NULL, consume, NULL) != 0) {
        fprintf(stderr, "fork_take_test: pthread_create failed\n");
        return 1;
    }
    while (atomic_load(&takes) == 0)
        sched_yield();
    int lost = 0, in_slot = 0;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            /* the consumer did not come along: its slot and the sink
               are as the fork found them */
            if (slot == &token)
                _exit(2);
            _exit(hwt_sink_take(sink) == &token ? 0 : 1);
        }
        if (pid < 0) {
            fprintf(stderr, "fork_take_test: fork: errno %d\n", errno);
            return 1;
        }
        int status;
        if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) > 2) {
            fprintf(stderr, "fork_take_test: child %d: status %#x\n", i, status);
            return 1;
        }
        lost += WEXITSTATUS(status) == 1;
        in_slot += WEXITSTATUS(status) == 2;
    }
    atomic_store(&stopping, true);
    pthread_join(consumer, NULL);
    hwt_timer_decref(t);
    printf("%d forks: the token was in the slot %d times, in the sink %d times, lost %d times\n",
           forks, in_slot, forks - in_slot - lost, lost);
    if (lost) {
        printf("FAILED: a child of fork() found the taken timeout nowhere\n");
        return 1;
    }
    printf("every child found the token\n");
    return 0;
}
