/*
 * hwt_sys.c: the platform primitives of hwt_sys.h, a backend per
 * platform: Linux's futex and eventfd, or the portable POSIX one (a
 * condition variable and a pipe).  The park's handshake is the same in
 * both: the sleeper sets SLEEPING before its last look for work, a waker
 * swaps in WOKEN and only pays for a wake-up when it found SLEEPING.
 */
#define _GNU_SOURCE /* pthread_setname_np, pipe2 */
#include "hwt_sys.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#if HWT_SYS_FUTEX
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#endif
#if defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__DragonFly__)
#include <pthread_np.h>
#endif
#ifdef __linux__
#include <sys/prctl.h>
#endif

/* Without pthread_condattr_setclock (macOS), timed waits are relative. */
#if !HWT_SYS_FUTEX &&                                                                              \
    (defined(__APPLE__) || (defined(HWTIMER_RELATIVE_WAIT) && HWTIMER_RELATIVE_WAIT))
#define RELATIVE_WAIT 1
#else
#define RELATIVE_WAIT 0
#endif

/* park states */
enum { AWAKE = 0, SLEEPING = 1, WOKEN = 2 };

static struct timespec timespec_of(int64_t ns)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    return ts;
}

#if !defined(__APPLE__)
/* The CLOCK_REALTIME time `rel` from now: the deadline of the waits that
   take only that clock. */
static struct timespec realtime_after(struct timespec rel)
{
    struct timespec abs;
    clock_gettime(CLOCK_REALTIME, &abs);
    abs.tv_sec += rel.tv_sec;
    abs.tv_nsec += rel.tv_nsec;
    if (abs.tv_nsec >= 1000000000) {
        abs.tv_sec++;
        abs.tv_nsec -= 1000000000;
    }
    return abs;
}
#endif

int hwt_cond_init(pthread_cond_t *c)
{
#if RELATIVE_WAIT || defined(__APPLE__)
    return pthread_cond_init(c, NULL);
#else
    pthread_condattr_t attr;
    int err = pthread_condattr_init(&attr);
    if (err)
        return err;
    err = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (!err)
        err = pthread_cond_init(c, &attr);
    pthread_condattr_destroy(&attr);
    return err;
#endif
}

/* ---- park ---- */

int hwt_park_init(hwt_park *p)
{
    atomic_init(&p->state, AWAKE);
#if !HWT_SYS_FUTEX
    int err = pthread_mutex_init(&p->lock, NULL);
    if (err)
        return err;
    err = hwt_cond_init(&p->cond);
    if (err) {
        pthread_mutex_destroy(&p->lock);
        return err;
    }
#endif
    return 0;
}

void hwt_park_destroy(hwt_park *p)
{
#if HWT_SYS_FUTEX
    (void)p;
#else
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
#endif
}

void hwt_park_prepare(hwt_park *p)
{
    atomic_store(&p->state, SLEEPING);
}

void hwt_park_cancel(hwt_park *p)
{
    atomic_store(&p->state, AWAKE);
}

bool hwt_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ns)
{
#if RELATIVE_WAIT
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t left = deadline_ns - ((int64_t)now.tv_sec * 1000000000 + now.tv_nsec);
    if (left <= 0)
        return true;
    struct timespec rel = timespec_of(left);
#if defined(__APPLE__)
    pthread_cond_timedwait_relative_np(c, m, &rel);
#else
    /* Forced where absolute waits exist: a CLOCK_REALTIME deadline, taken
       afresh at each wait, stands in for the relative one. */
    struct timespec abs = realtime_after(rel);
    pthread_cond_timedwait(c, m, &abs);
#endif
    return false; /* the caller loops: the next call sees the time left */
#else
    struct timespec abs = timespec_of(deadline_ns);
    return pthread_cond_timedwait(c, m, &abs) == ETIMEDOUT;
#endif
}

bool hwt_mutex_lock_within(pthread_mutex_t *m, int64_t timeout_ns)
{
#if defined(__APPLE__)
    /* no pthread_mutex_timedlock: tries once a millisecond */
    struct timespec ms = timespec_of(1000000);
    for (int64_t waited = 0;; waited += 1000000) {
        if (pthread_mutex_trylock(m) == 0)
            return true;
        if (waited >= timeout_ns)
            return false;
        nanosleep(&ms, NULL);
    }
#else
    /* its deadline is on CLOCK_REALTIME, taken afresh at each call */
    struct timespec abs = realtime_after(timespec_of(timeout_ns));
    return pthread_mutex_timedlock(m, &abs) == 0;
#endif
}

void hwt_park_until(hwt_park *p, int64_t deadline_ns)
{
#if HWT_SYS_FUTEX
    struct timespec ts = timespec_of(deadline_ns), *tsp = NULL;
    if (deadline_ns != HWT_SYS_FOREVER)
        tsp = &ts; /* FUTEX_WAIT_BITSET: absolute, on CLOCK_MONOTONIC */
    while (atomic_load(&p->state) == SLEEPING) {
        long r = syscall(SYS_futex, (uint32_t *)&p->state, FUTEX_WAIT_BITSET_PRIVATE, SLEEPING, tsp,
                         NULL, FUTEX_BITSET_MATCH_ANY);
        if (r == -1 && errno == ETIMEDOUT)
            break;
    }
#else
    /* The state is read under the lock that the waker takes to signal, so
       a wake between this read and the wait is not lost. */
    pthread_mutex_lock(&p->lock);
    while (atomic_load(&p->state) == SLEEPING) {
        if (deadline_ns == HWT_SYS_FOREVER)
            pthread_cond_wait(&p->cond, &p->lock);
        else if (hwt_cond_wait_until(&p->cond, &p->lock, deadline_ns))
            break;
    }
    pthread_mutex_unlock(&p->lock);
#endif
    atomic_store(&p->state, AWAKE);
}

void hwt_park_wake(hwt_park *p)
{
    if (atomic_exchange(&p->state, WOKEN) != SLEEPING)
        return; /* awake: it looks for work before it sleeps */
#if HWT_SYS_FUTEX
    syscall(SYS_futex, (uint32_t *)&p->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
#else
    pthread_mutex_lock(&p->lock);
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
#endif
}

void hwt_park_lock_for_fork(hwt_park *p)
{
#if HWT_SYS_FUTEX
    (void)p;
#else
    pthread_mutex_lock(&p->lock);
#endif
}

int hwt_park_unlock_after_fork(hwt_park *p, bool child)
{
#if HWT_SYS_FUTEX
    (void)p;
    (void)child;
    return 0;
#else
    int err = child ? hwt_cond_init(&p->cond) : 0; /* the parent's sleeper did not come along */
    pthread_mutex_unlock(&p->lock);
    return err;
#endif
}

/* ---- wake fd ---- */

#if !HWT_SYS_FUTEX
/* Opens a non-blocking, close-on-exec pipe.  Returns 0 or an errno value. */
static int open_pipe(int fds[2])
{
#if defined(__linux__) || defined(__FreeBSD__) || defined(__NetBSD__) || defined(__OpenBSD__) ||   \
    defined(__DragonFly__)
    return pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0 ? 0 : errno;
#else
    if (pipe(fds) != 0)
        return errno;
    for (int i = 0; i < 2; i++) {
        int fl = fcntl(fds[i], F_GETFL);
        if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) < 0 ||
            fcntl(fds[i], F_SETFD, FD_CLOEXEC) < 0) {
            int err = errno;
            close(fds[0]);
            close(fds[1]);
            return err;
        }
    }
    return 0;
#endif
}
#endif

int hwt_wakefd_open(hwt_wakefd *w)
{
    w->read_fd = w->write_fd = -1;
#if HWT_SYS_FUTEX
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return errno;
    w->read_fd = w->write_fd = fd;
#else
    int fds[2];
    int err = open_pipe(fds);
    if (err)
        return err;
    w->read_fd = fds[0];
    w->write_fd = fds[1];
#endif
    return 0;
}

void hwt_wakefd_signal(int write_fd)
{
#if HWT_SYS_FUTEX
    uint64_t one = 1;
#else
    char one = 1;
#endif
    ssize_t r = write(write_fd, &one, sizeof(one));
    (void)r; /* EAGAIN only when the pipe or counter is full: readable then */
}

int hwt_wakefd_drain(int read_fd)
{
    char buf[128]; /* an eventfd reads as its 8-byte counter; a pipe may hold more */
    for (;;) {
        ssize_t n = read(read_fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
        if (HWT_SYS_FUTEX || (size_t)n < sizeof(buf))
            return 0; /* less than asked for: empty now */
    }
}

int hwt_wakefd_wait(int read_fd)
{
    struct pollfd pfd = {.fd = read_fd, .events = POLLIN};
    for (;;) {
        int r = poll(&pfd, 1, -1);
        if (r > 0)
            return hwt_wakefd_drain(read_fd);
        if (r < 0 && errno != EINTR)
            return errno;
    }
}

void hwt_wakefd_close(hwt_wakefd *w)
{
    if (w->read_fd >= 0)
        close(w->read_fd);
    if (w->write_fd >= 0 && w->write_fd != w->read_fd)
        close(w->write_fd);
    w->read_fd = w->write_fd = -1;
}

/* ---- the calling thread ---- */

void hwt_thread_set_name(const char *name)
{
#if defined(__APPLE__)
    pthread_setname_np(name); /* macOS names only the calling thread */
#elif defined(__NetBSD__)
    pthread_setname_np(pthread_self(), "%s", (void *)(uintptr_t)name);
#elif defined(__FreeBSD__) || defined(__OpenBSD__) || defined(__DragonFly__)
    pthread_set_name_np(pthread_self(), name);
#elif defined(__linux__) || defined(__sun) || defined(__CYGWIN__)
    pthread_setname_np(pthread_self(), name);
#else
    (void)name; /* no known call: the thread keeps its inherited name */
#endif
}

void hwt_thread_wake_on_time(void)
{
#ifdef PR_SET_TIMERSLACK
    /* 1 ns, the least: 0 would mean the process's default again */
    (void)prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
}
