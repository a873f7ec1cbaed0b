/*
 * close_race_test.c: the real worker thread in three races that
 * stress_core.c does not make, each checked for exactly-once handling and
 * counters that add up, under TSan and ASan+UBSan (scripts/check-core.sh).
 *
 *   close: one-shots delivered to an `ends_once` sink that its consumer
 *     closes mid-stream (the worker then ends what it would have delivered,
 *     hwt_timeout_finish from the worker) while other threads cancel,
 *     cancel_take and reset them, then stop(): each item runs at most
 *     once, never after a cancel won, and the counters add up.
 *   unstart: producers and cancellers run while the main thread takes the
 *     timer back (hwt_timer_unstart) and starts it again, several times,
 *     then stops it: each accepted item is delivered, released or
 *     returned exactly once, and the counters add up.
 *   periodic take: periodic timeouts re-armed by a consumer while others
 *     cancel them with hwt_timeout_cancel_take (a re-armed one on top of
 *     the queue is taken back): each ends exactly once.
 *
 * Usage: close_race_test [SEED [ROUNDS]]
 * Without SEED the seed comes from the time; it is printed first.  Exits 0
 * when every round passes, 1 after printing the first failures.
 */
#define _GNU_SOURCE
#include "hwt.h"
#include "test_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int failures;
#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (atomic_fetch_add(&failures, 1) < 20) {                                                 \
            fprintf(stderr, "close_race_test: FAIL: " __VA_ARGS__);                                \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static void *checked(void *p)
{
    if (!p) {
        fprintf(stderr, "close_race_test: out of memory\n");
        exit(1);
    }
    return p;
}

static void start(pthread_t *th, void *(*fn)(void *), void *arg)
{
    if (pthread_create(th, NULL, fn, arg) != 0) {
        fprintf(stderr, "close_race_test: pthread_create failed\n");
        exit(1);
    }
}

/* ---- close ---- */

#define C_ITEMS 2000

typedef struct c_item {
    hwt_timeout to;
    _Atomic int ran, cancel_wins, released, closed, returned;
} c_item;

typedef struct c_shared {
    hwt_timer *t;
    hwt_sink sink;
    c_item *items;
    _Atomic size_t scheduled;
    _Atomic bool done, closed;
    uint64_t seed;
    _Atomic uint64_t runs, wins;
} c_shared;

static void c_released(c_shared *sh)
{
    for (hwt_timeout *to = hwt_timer_take_released(sh->t), *n; to; to = n) {
        n = hwt_timeout_of(to->link.next);
        atomic_fetch_add(&((c_item *)(void *)to)->released, 1);
    }
}

static void *c_consumer(void *arg)
{
    c_shared *sh = arg;
    uint64_t rng = sh->seed ^ 0xc0;
    int64_t close_after = (int64_t)(t_splitmix(&rng) % (C_ITEMS / 2));
    int64_t taken = 0;
    bool finished = false;
    while (!finished) {
        hwt_timeout *list = hwt_sink_wait(&sh->sink, &finished, NULL);
        for (hwt_timeout *to = list, *n; to; to = n) {
            n = hwt_timeout_of(to->link.next);
            c_item *it = (c_item *)(void *)to;
            taken++;
            if (t_splitmix(&rng) % 4 == 0)
                t_sleep_ns(20000);
            uint32_t s = hwt_timeout_begin(to);
            if (s == HWT_EXPIRED) {
                if (atomic_fetch_add(&it->ran, 1))
                    FAIL("close: item ran twice");
                atomic_fetch_add(&sh->runs, 1);
            } else if (s == HWT_RUNNING_RESET) {
                int rc = hwt_timeout_requeue(to);
                if (rc == HWT_ESTOPPED)
                    atomic_fetch_add(&it->returned, 1); /* the caller's now */
                else if (rc != HWT_OK && rc != HWT_ECANCELLED)
                    FAIL("close: requeue returned %d", rc);
            } else if (s != HWT_CANCELLED) {
                FAIL("close: begin gave %u", s);
            }
        }
        c_released(sh);
        if (taken >= close_after && !atomic_load(&sh->closed)) {
            atomic_store(&sh->closed, true);
            for (hwt_timeout *to = hwt_sink_close(&sh->sink), *n; to; to = n) {
                n = hwt_timeout_of(to->link.next);
                atomic_fetch_add(&((c_item *)(void *)to)->closed, 1);
            }
            break;
        }
    }
    /* from here on, the released list */
    while (!atomic_load(&sh->done)) {
        c_released(sh);
        t_sleep_ns(50000);
    }
    return NULL;
}

static void *c_canceller(void *arg)
{
    c_shared *sh = arg;
    uint64_t rng = sh->seed ^ (uint64_t)(uintptr_t)&rng;
    while (!atomic_load(&sh->done)) {
        uint64_t r = t_splitmix(&rng);
        size_t n = atomic_load(&sh->scheduled);
        if (!n) {
            t_sleep_ns(10000);
            continue;
        }
        c_item *it = &sh->items[(r >> 16) % n];
        if (r % 8 < 2) {
            int rc = (r & 8) ? hwt_timeout_cancel_take(&it->to) : hwt_timeout_cancel(&it->to);
            if (rc == HWT_OK || rc == HWT_TAKEN) {
                if (atomic_fetch_add(&it->cancel_wins, 1))
                    FAIL("close: two cancels won");
                if (atomic_load(&it->ran))
                    FAIL("close: a cancel won after the run");
                atomic_fetch_add(&sh->wins, 1);
                if (rc == HWT_TAKEN)
                    atomic_fetch_add(&it->released, 1);
            }
        } else if (r % 8 < 5) {
            (void)hwt_timeout_reset(&it->to, (int64_t)(r >> 24) % 2000000);
        }
        t_sleep_ns((int64_t)(r >> 40) % 20000);
    }
    return NULL;
}

static void close_round(uint64_t seed)
{
    c_shared *sh = checked(calloc(1, sizeof(*sh)));
    hwt_config hc = {.tick_ns = 100000, .ticks_per_wheel = 64};
    sh->items = checked(calloc(C_ITEMS, sizeof(c_item)));
    sh->seed = seed;
    if (!(sh->t = hwt_timer_new(&hc)) || hwt_timer_start(sh->t) != 0 ||
        hwt_sink_init(&sh->sink, sh->t, NULL, -1, NULL) != 0) {
        FAIL("close: setup");
        exit(1);
    }
    sh->sink.ends_once = true;
    pthread_t cons, can[2];
    start(&cons, c_consumer, sh);
    for (int i = 0; i < 2; i++)
        start(&can[i], c_canceller, sh);
    uint64_t rng = seed;
    for (size_t i = 0; i < C_ITEMS; i++) {
        sh->items[i].to.sink = &sh->sink;
        int rc = hwt_timer_schedule(sh->t, &sh->items[i].to, (int64_t)(t_splitmix(&rng) % 3000000));
        if (rc != HWT_OK)
            FAIL("close: schedule %d", rc);
        atomic_store(&sh->scheduled, i + 1);
        if (i % 64 == 0)
            t_sleep_ns(100000);
    }
    t_sleep_ns((int64_t)(t_splitmix(&rng) % 5000000));
    hwt_timeout *ret = hwt_timer_stop(sh->t);
    for (hwt_timeout *to = ret, *n; to; to = n) {
        n = hwt_timeout_of(to->link.next);
        atomic_fetch_add(&((c_item *)(void *)to)->returned, 1);
    }
    t_sleep_ns(20000000);
    atomic_store(&sh->done, true);
    for (int i = 0; i < 2; i++)
        pthread_join(can[i], NULL);
    pthread_join(cons, NULL);
    c_released(sh);
    uint64_t ran = 0;
    for (size_t i = 0; i < C_ITEMS; i++) {
        c_item *it = &sh->items[i];
        int r = atomic_load(&it->ran), w = atomic_load(&it->cancel_wins);
        ran += (uint64_t)r;
        if (r && w)
            FAIL("close: item %zu ran and a cancel won", i);
        if (atomic_load(&it->returned) > 1 || atomic_load(&it->released) > 1 ||
            atomic_load(&it->closed) > 1)
            FAIL("close: item %zu handed back twice (ret %d rel %d closed %d)", i,
                 atomic_load(&it->returned), atomic_load(&it->released), atomic_load(&it->closed));
    }
    hwt_stats st;
    hwt_timer_stats(sh->t, &st);
    if (st.pending != 0 || st.expired + st.cancelled != st.scheduled || st.expired != ran ||
        st.scheduled != C_ITEMS)
        FAIL("close: stats scheduled %" PRIu64 " expired %" PRIu64 " cancelled %" PRIu64
             " pending %" PRId64 " revoked %" PRIu64 "; ran %" PRIu64,
             st.scheduled, st.expired, st.cancelled, st.pending, st.revoked, ran);
    hwt_sink_destroy(&sh->sink);
    hwt_timer_decref(sh->t);
    free(sh->items);
    free(sh);
}

/* ---- unstart ---- */

#define U_PRODUCERS 2
#define U_PER       3000
#define U_ITEMS     (U_PRODUCERS * U_PER)

typedef struct u_item {
    hwt_timeout to;
    _Atomic int accepted, got, wins;
} u_item;

typedef struct u_shared {
    hwt_timer *t;
    u_item *items;
    _Atomic bool done, stopped;
    uint64_t seed;
} u_shared;

typedef struct u_arg {
    u_shared *sh;
    int index;
} u_arg;

static void *u_producer(void *arg)
{
    u_arg *a = arg;
    u_shared *sh = a->sh;
    uint64_t rng = sh->seed * 7 + (uint64_t)a->index;
    for (int i = 0; i < U_PER; i++) {
        u_item *it = &sh->items[a->index * U_PER + i];
        it->to.sink = hwt_timer_default_sink(sh->t);
        uint64_t r = t_splitmix(&rng);
        int64_t delay = r % 5 == 0 ? INT64_C(3600000000000) : (int64_t)(r >> 8) % 3000000;
        int rc = hwt_timer_schedule(sh->t, &it->to, delay);
        if (rc == HWT_OK) {
            atomic_store(&it->accepted, 1);
            if ((r >> 32) % 4 == 0) {
                int c = (r >> 36) & 1 ? hwt_timeout_cancel_take(&it->to)
                                      : hwt_timeout_cancel(&it->to);
                if (c == HWT_OK || c == HWT_TAKEN)
                    atomic_fetch_add(&it->wins, 1);
                if (c == HWT_TAKEN)
                    atomic_fetch_add(&it->got, 1);
            }
        } else if (rc != HWT_ESTOPPED) {
            FAIL("unstart: schedule returned %d", rc);
        }
        if (i % 32 == 31)
            t_sleep_ns((int64_t)(t_splitmix(&rng) % 300000));
    }
    return NULL;
}

static void *u_canceller(void *arg)
{
    u_shared *sh = arg;
    uint64_t rng = sh->seed ^ 0xca;
    while (!atomic_load(&sh->done)) {
        u_item *it = &sh->items[t_splitmix(&rng) % U_ITEMS];
        if (atomic_load(&it->accepted)) {
            int c = hwt_timeout_cancel(&it->to);
            if (c == HWT_OK)
                atomic_fetch_add(&it->wins, 1);
            else if (c == HWT_EFINAL)
                ;
            else
                FAIL("unstart: cancel %d", c);
            if (t_splitmix(&rng) % 2)
                (void)hwt_timeout_reset(&it->to, (int64_t)(t_splitmix(&rng) % 2000000));
        }
        t_sleep_ns((int64_t)(t_splitmix(&rng) % 30000));
    }
    return NULL;
}

static void u_take(u_shared *sh, hwt_timeout *list)
{
    for (hwt_timeout *to = list, *n; to; to = n) {
        n = hwt_timeout_of(to->link.next);
        u_item *it = (u_item *)(void *)to;
        if (atomic_fetch_add(&it->got, 1))
            FAIL("unstart: item %td handed back twice", it - sh->items);
    }
}

static void *u_consumer(void *arg)
{
    u_shared *sh = arg;
    bool finished = false;
    while (!finished) {
        u_take(sh, hwt_sink_wait(hwt_timer_default_sink(sh->t), &finished, NULL));
        u_take(sh, hwt_timer_take_released(sh->t));
    }
    u_take(sh, hwt_timer_take_released(sh->t));
    return NULL;
}

static void unstart_round(uint64_t seed)
{
    u_shared *sh = checked(calloc(1, sizeof(*sh)));
    sh->items = checked(calloc(U_ITEMS, sizeof(u_item)));
    sh->seed = seed;
    hwt_config hc = {.tick_ns = 200000, .ticks_per_wheel = 16};
    if (!(sh->t = hwt_timer_new(&hc)) || hwt_timer_start(sh->t) != 0) {
        FAIL("unstart: setup");
        exit(1);
    }
    pthread_t prod[U_PRODUCERS], can, cons;
    u_arg args[U_PRODUCERS];
    start(&cons, u_consumer, sh);
    start(&can, u_canceller, sh);
    for (int i = 0; i < U_PRODUCERS; i++) {
        args[i] = (u_arg){sh, i};
        start(&prod[i], u_producer, &args[i]);
    }
    uint64_t rng = seed;
    for (int k = 0; k < 20; k++) {
        t_sleep_ns((int64_t)(t_splitmix(&rng) % 3000000));
        hwt_timer_unstart(sh->t);
        if (t_splitmix(&rng) % 2) { /* a look at the wheel while it is taken back */
            hwt_occupancy occ;
            hwt_timer_occupancy(sh->t, &occ);
        }
        t_sleep_ns((int64_t)(t_splitmix(&rng) % 1000000));
        int rc = hwt_timer_start(sh->t);
        if (rc != 0)
            FAIL("unstart: restart returned %d", rc);
    }
    for (int i = 0; i < U_PRODUCERS; i++)
        pthread_join(prod[i], NULL);
    atomic_store(&sh->done, true);
    pthread_join(can, NULL);
    u_take(sh, hwt_timer_stop(sh->t));
    pthread_join(cons, NULL);
    u_take(sh, hwt_timer_take_released(sh->t));
    uint64_t accepted = 0;
    for (size_t i = 0; i < U_ITEMS; i++) {
        u_item *it = &sh->items[i];
        if (!atomic_load(&it->accepted))
            continue;
        accepted++;
        if (atomic_load(&it->got) != 1)
            FAIL("unstart: item %zu handed back %d times (state %u, wins %d)", i,
                 atomic_load(&it->got), atomic_load(&it->to.state), atomic_load(&it->wins));
        if (atomic_load(&it->wins) > 1)
            FAIL("unstart: item %zu cancelled twice", i);
    }
    hwt_stats st;
    hwt_timer_stats(sh->t, &st);
    if (st.pending != 0 || st.expired + st.cancelled != st.scheduled || st.scheduled != accepted)
        FAIL("unstart: stats scheduled %" PRIu64 " (accepted %" PRIu64 ") expired %" PRIu64
             " cancelled %" PRIu64 " pending %" PRId64,
             st.scheduled, accepted, st.expired, st.cancelled, st.pending);
    hwt_timer_decref(sh->t);
    free(sh->items);
    free(sh);
}

/* ---- periodic take ---- */

#define P_ITEMS 64

typedef struct p_item {
    hwt_timeout to;
    int64_t period;
    _Atomic int ends, wins;
} p_item;

typedef struct p_shared {
    hwt_timer *t;
    p_item items[P_ITEMS];
    _Atomic bool done;
    uint64_t seed;
} p_shared;

static void *p_consumer(void *arg)
{
    p_shared *sh = arg;
    bool finished = false;
    while (!finished) {
        for (hwt_timeout *to = hwt_sink_wait(hwt_timer_default_sink(sh->t), &finished, NULL), *n;
             to; to = n) {
            n = hwt_timeout_of(to->link.next);
            p_item *it = (p_item *)(void *)to;
            if (atomic_load(&to->state) == HWT_CANCELLED) {
                hwt_timeout_finish(to, HWT_CANCELLED);
                atomic_fetch_add(&it->ends, 1);
                continue;
            }
            int64_t now = hwt_monotonic_ns(NULL);
            int rc = hwt_timeout_rearm(to, it->period, now, now, false);
            while (rc == HWT_EAGAIN)
                rc = hwt_timeout_rearm(to, it->period, now, now, true);
            if (rc != HWT_OK)
                atomic_fetch_add(&it->ends, 1);
        }
        for (hwt_timeout *to = hwt_timer_take_released(sh->t), *n; to; to = n) {
            n = hwt_timeout_of(to->link.next);
            atomic_fetch_add(&((p_item *)(void *)to)->ends, 1);
        }
    }
    return NULL;
}

static void *p_canceller(void *arg)
{
    p_shared *sh = arg;
    uint64_t rng = sh->seed ^ (uint64_t)(uintptr_t)&rng;
    while (!atomic_load(&sh->done)) {
        p_item *it = &sh->items[t_splitmix(&rng) % P_ITEMS];
        int rc = hwt_timeout_cancel_take(&it->to);
        if (rc == HWT_OK || rc == HWT_TAKEN)
            atomic_fetch_add(&it->wins, 1);
        if (rc == HWT_TAKEN)
            atomic_fetch_add(&it->ends, 1);
        t_sleep_ns((int64_t)(t_splitmix(&rng) % 200000));
    }
    return NULL;
}

static void periodic_round(uint64_t seed)
{
    p_shared *sh = checked(calloc(1, sizeof(*sh)));
    sh->seed = seed;
    hwt_config hc = {.tick_ns = 100000, .ticks_per_wheel = 64};
    if (!(sh->t = hwt_timer_new(&hc)) || hwt_timer_start(sh->t) != 0) {
        FAIL("periodic: setup");
        exit(1);
    }
    uint64_t rng = seed;
    for (int i = 0; i < P_ITEMS; i++) {
        sh->items[i].to.sink = hwt_timer_default_sink(sh->t);
        sh->items[i].period = 100000 + (int64_t)(t_splitmix(&rng) % 500000);
        int missed = (int)(t_splitmix(&rng) % 3);
        if (hwt_timer_schedule_periodic(sh->t, &sh->items[i].to, 100000, missed))
            FAIL("periodic: schedule");
    }
    pthread_t cons[2], can;
    for (int i = 0; i < 2; i++)
        start(&cons[i], p_consumer, sh);
    start(&can, p_canceller, sh);
    t_sleep_ns(50000000 + (int64_t)(t_splitmix(&rng) % 50000000));
    atomic_store(&sh->done, true);
    pthread_join(can, NULL);
    for (hwt_timeout *to = hwt_timer_stop(sh->t), *n; to; to = n) {
        n = hwt_timeout_of(to->link.next);
        atomic_fetch_add(&((p_item *)(void *)to)->ends, 1);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(cons[i], NULL);
    for (hwt_timeout *to = hwt_timer_take_released(sh->t), *n; to; to = n) {
        n = hwt_timeout_of(to->link.next);
        atomic_fetch_add(&((p_item *)(void *)to)->ends, 1);
    }
    for (int i = 0; i < P_ITEMS; i++)
        if (atomic_load(&sh->items[i].ends) != 1)
            FAIL("periodic: item %d ended %d times (state %u, wins %d)", i,
                 atomic_load(&sh->items[i].ends), atomic_load(&sh->items[i].to.state),
                 atomic_load(&sh->items[i].wins));
    hwt_stats st;
    hwt_timer_stats(sh->t, &st);
    if (st.pending != 0 || st.expired + st.cancelled != st.scheduled)
        FAIL("periodic: stats scheduled %" PRIu64 " expired %" PRIu64 " cancelled %" PRIu64
             " pending %" PRId64,
             st.scheduled, st.expired, st.cancelled, st.pending);
    hwt_timer_decref(sh->t);
    free(sh);
}

int main(int argc, char **argv)
{
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    printf("close_race_test: seed %" PRIu64 "\n", seed);
    for (int i = 0; i < rounds && !atomic_load(&failures); i++) {
        close_round(seed + (uint64_t)i);
        unstart_round(seed + (uint64_t)i);
        periodic_round(seed + (uint64_t)i);
    }
    if (atomic_load(&failures)) {
        fprintf(stderr, "close_race_test: %d failures\n", atomic_load(&failures));
        return 1;
    }
    printf("close_race_test: passed\n");
    return 0;
}
