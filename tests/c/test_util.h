/*
 * test_util.h: what the core's C tests share: a seeded generator, a sleep
 * and the wait for a child.  Header-only; every function is static inline.
 */
#ifndef HWT_TEST_UTIL_H
#define HWT_TEST_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

/* splitmix64: the next number of the sequence that *x seeds. */
static inline uint64_t t_splitmix(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Sleeps `ns` nanoseconds, the whole of them through signals. */
static inline void t_sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* Waits for the child `pid`, through signals; returns whether it exited
   with status 0. */
static inline bool t_child_passed(pid_t pid)
{
    int status;
    pid_t r;
    while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
        ;
    return r == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#endif /* HWT_TEST_UTIL_H */
