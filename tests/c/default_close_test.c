/*
 * default_close_test.c: hwt_sink_close() sends later expiries for the
 * closed sink to the released list, for the timer's default sink as for
 * any other: a one-shot comes back EXPIRED, a periodic one CANCELLED (it
 * will not run again), each once, and neither is delivered to the sink,
 * returned by stop() or lost.  And what a consumer took from a sink and
 * puts back after the sink closed is handed back to it, ended as the
 * close ends what the sink held, rather than left where nothing takes it.
 *
 * Usage: default_close_test.  Exits 0 when each comes back as it should.
 */
#include "hwt.h"

#include <stdio.h>

static int64_t fake_now;

static int64_t fake_clock(void *ctx)
{
    (void)ctx;
    return fake_now;
}

static int check(int ok, const char *what)
{
    if (!ok)
        fprintf(stderr, "default_close_test: %s\n", what);
    return !ok;
}

int main(void)
{
    hwt_config cfg = {.tick_ns = 1000, .ticks_per_wheel = 8, .manual = true};
    cfg.clock = fake_clock;
    hwt_timer *t = hwt_timer_new(&cfg);
    if (!t || hwt_timer_start(t) != 0)
        return check(0, "no timer");
    hwt_sink *sink = hwt_timer_default_sink(t);
    int failed = check(hwt_sink_close(sink) == NULL, "the open sink held timeouts");
    hwt_timeout once = {.sink = sink}, every = {.sink = sink};
    failed |= check(hwt_timer_schedule(t, &once, 500) == HWT_OK, "schedule refused");
    failed |= check(hwt_timer_schedule_periodic(t, &every, 500, HWT_MISSED_SKIP) == HWT_OK,
                    "periodic schedule refused");
    fake_now = 5000;
    hwt_timer_advance(t, fake_now);
    hwt_timeout *got = hwt_timer_take_released(t);
    failed |= check(got == &once && hwt_timeout_of(once.link.next) == &every && !every.link.next,
                    "the two expiries are not released, in order");
    failed |= check(atomic_load(&once.state) == HWT_EXPIRED, "the one-shot is not EXPIRED");
    failed |= check(atomic_load(&every.state) == HWT_CANCELLED, "the periodic one is not ended");
    failed |= check(hwt_sink_take(sink) == NULL, "delivered to the closed sink");

    hwt_sink other;
    if (hwt_sink_init(&other, t, NULL, -1, NULL) != 0)
        return check(0, "no sink");
    hwt_timeout once2 = {.sink = &other}, every2 = {.sink = &other};
    failed |= check(hwt_timer_schedule(t, &once2, 500) == HWT_OK, "schedule refused");
    failed |= check(hwt_timer_schedule_periodic(t, &every2, 500, HWT_MISSED_SKIP) == HWT_OK,
                    "periodic schedule refused");
    fake_now = 10000;
    hwt_timer_advance(t, fake_now);
    hwt_timeout *taken = hwt_sink_take(&other);
    failed |= check(taken == &once2 && hwt_timeout_of(once2.link.next) == &every2,
                    "the two expiries are not delivered, in order");
    failed |= check(hwt_sink_close(&other) == NULL, "the sink held what was taken");
    failed |= check(hwt_sink_put_back(&other, taken) == taken,
                    "put back into the closed sink, where nothing takes it");
    failed |= check(atomic_load(&once2.state) == HWT_EXPIRED, "the one-shot is not EXPIRED");
    failed |= check(atomic_load(&every2.state) == HWT_CANCELLED,
                    "the periodic one put back is not ended");
    failed |= check(hwt_sink_take(&other) == NULL, "the closed sink holds what was put back");
    hwt_sink_destroy(&other);
    failed |= check(hwt_timer_stop(t) == NULL, "stop() returned an expired timeout");
    failed |= check(hwt_timer_take_released(t) == NULL, "released twice");
    hwt_timer_decref(t);
    if (!failed)
        printf("default_close_test: expiries for the closed default sink are released, and what\n"
               "a closed sink gets put back is handed back\n");
    return failed;
}
