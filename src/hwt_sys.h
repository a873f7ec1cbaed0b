/*
 * hwt_sys.h: what the core and the loop sinks need from the operating
 * system, behind one small interface, so that no other file holds a
 * platform #if.
 *
 *   - park: the worker sleeps until woken or until a deadline;
 *   - wake fd: a file descriptor an event loop watches, which any thread
 *     (the worker included, holding a lock) makes readable;
 *   - naming the calling thread.
 *
 * Two backends, chosen by the platform.  Linux: a futex and an eventfd.
 * Elsewhere (macOS, the BSDs, any POSIX system) the portable one: a mutex
 * and condition variable (timed on CLOCK_MONOTONIC through
 * pthread_condattr_setclock; on macOS, which lacks it, by relative waits)
 * and a non-blocking pipe.  -DHWTIMER_PORTABLE=1 forces the portable
 * backend on Linux, where it is tested; -DHWTIMER_RELATIVE_WAIT=1 also
 * forces its relative waits, the macOS path.
 *
 * Like the rest of the core: a call that can fail returns 0 or an errno
 * value (hwt.h's rule), and no Python.
 */
#ifndef HWT_SYS_H
#define HWT_SYS_H

#if !defined(__unix__) && !defined(__APPLE__)
#error "hwtimer: unsupported platform: the C core needs POSIX threads (Linux, macOS, the BSDs)"
#endif

#if defined(__linux__) && !(defined(HWTIMER_PORTABLE) && HWTIMER_PORTABLE) && defined(__has_include)
#if !__has_include(<linux/futex.h>)
/* one line that says what to do, rather than the errors that would follow */
// clang-format off
#error "hwtimer: <linux/futex.h> not found: install the Linux kernel headers (Debian: linux-libc-dev, Alpine: linux-headers), or build with HWTIMER_PORTABLE=1"
// clang-format on
#define HWT_SYS_NO_FUTEX_H 1
#endif
#endif

#if defined(__linux__) && !(defined(HWTIMER_PORTABLE) && HWTIMER_PORTABLE) &&                      \
    !defined(HWT_SYS_NO_FUTEX_H)
#define HWT_SYS_FUTEX   1
#define HWT_SYS_BACKEND "futex" /* futex and eventfd */
#else
#define HWT_SYS_FUTEX   0
#define HWT_SYS_BACKEND "posix" /* condition variable and pipe */
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* A deadline for hwt_park_until that never comes. */
#define HWT_SYS_FOREVER INT64_MAX

/* One sleeping thread and whoever wakes it.  `state` is the handshake
   that keeps a wake-up from being lost (see hwt_park_prepare). */
typedef struct hwt_park {
    _Atomic uint32_t state;
#if !HWT_SYS_FUTEX
    pthread_mutex_t lock; /* guards the sleep on `cond` */
    pthread_cond_t cond;
#endif
} hwt_park;

/* Initialises `p`, awake.  Returns 0 or an errno value. */
int hwt_park_init(hwt_park *p);
void hwt_park_destroy(hwt_park *p);

/* Announces that the calling thread is about to park: a hwt_park_wake
   from here on makes hwt_park_until return at once.  The caller then
   checks for work a waker may have published before, and either parks or
   calls hwt_park_cancel. */
void hwt_park_prepare(hwt_park *p);
void hwt_park_cancel(hwt_park *p);
/* Parks until hwt_park_wake or until CLOCK_MONOTONIC reads `deadline_ns`
   (HWT_SYS_FOREVER: no deadline), after hwt_park_prepare.  Spurious
   returns are possible; the caller reads its clock again.  Leaves `p`
   awake. */
void hwt_park_until(hwt_park *p, int64_t deadline_ns);
/* Wakes the parked (or about to park) thread; cheap when there is none.
   Safe from any thread. */
void hwt_park_wake(hwt_park *p);

/* fork(): called around it with the embedder's own locks, so that the
   child finds `p` unlocked and usable.  The unlock returns 0, or in the
   child the errno value of making its condition variable again (then `p`
   must not be parked on). */
void hwt_park_lock_for_fork(hwt_park *p);
int hwt_park_unlock_after_fork(hwt_park *p, bool child);

/* Initialises a condition variable whose timed waits, if any, are on
   CLOCK_MONOTONIC where the platform allows.  Returns 0 or an errno value. */
int hwt_cond_init(pthread_cond_t *c);
/* Waits on `c` (from hwt_cond_init), `m` held, until signalled or until
   CLOCK_MONOTONIC reads `deadline_ns`.  Returns whether the deadline has
   passed; it may return early, so callers check their condition and loop. */
bool hwt_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ns);
/* Locks `m`, waiting for it about `timeout_ns` at most.  Returns whether
   it is now held, so that a caller can do something else between waits. */
bool hwt_mutex_lock_within(pthread_mutex_t *m, int64_t timeout_ns);

/* A descriptor an event loop watches: one eventfd, or a pipe's two ends.
   Both ends are non-blocking and close-on-exec; -1 once closed. */
typedef struct hwt_wakefd {
    int read_fd, write_fd;
} hwt_wakefd;

/* Opens `w`.  Returns 0 or an errno value (w is then closed). */
int hwt_wakefd_open(hwt_wakefd *w);
/* Makes the read end readable.  Never blocks, so it may be called with
   locks held; a full pipe or counter is readable already. */
void hwt_wakefd_signal(int write_fd);
/* Empties the read end.  Returns 0 (also when there was nothing to read)
   or an errno value. */
int hwt_wakefd_drain(int read_fd);
/* Blocks until the read end is readable, then empties it.  Returns 0 or
   an errno value. */
int hwt_wakefd_wait(int read_fd);
void hwt_wakefd_close(hwt_wakefd *w);

/* Names the calling thread, as ps -T and debuggers show it; `name` holds
   at most 15 bytes (what Linux keeps).  Best effort: a platform that
   cannot is left unnamed. */
void hwt_thread_set_name(const char *name);

/* Asks that the calling thread's timed waits end on time: Linux lets one
   end up to the thread's timer slack late (50 us by default), 5 % of a
   1 ms tick, to batch wake-ups.  Best effort: elsewhere a no-op. */
void hwt_thread_wake_on_time(void);

#endif /* HWT_SYS_H */
