/*
 * model_test.c: drives the hwtimer C core (src/hwt.c and src/wheel.c, manual mode, fake
 * clock) with seeded random sequences of schedules (one-shot and periodic,
 * all three missed-run policies), cancels, resets and clock advances, and checks it step by step
 * against the model in model.h.
 *
 * Usage: model_test [SEED [ITERATIONS [OPS]]]
 * Iteration i runs with seed SEED + i, so `model_test S 1` reproduces the
 * iteration whose seed S a mismatch reports.  Without SEED the seed comes
 * from the time and is printed first.  Exits 0 when every run agrees, 1 on
 * the first mismatch (after printing it and the operations before it).
 */
#include "model.h"

#include <time.h>

#define DEFAULT_ITERATIONS 2000
#define DEFAULT_OPS        400
#define MAX_ITEMS          128

/* Returns 0 and sets *out, or -1 if `s` is not a whole unsigned number. */
static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s)
        return -1;
    *out = strtoull(s, &end, 0);
    return *end ? -1 : 0;
}

int main(int argc, char **argv)
{
    uint64_t seed, iterations = DEFAULT_ITERATIONS, ops = DEFAULT_OPS;
    if (argc > 4 || (argc > 1 && parse_u64(argv[1], &seed)) ||
        (argc > 2 && parse_u64(argv[2], &iterations)) || (argc > 3 && parse_u64(argv[3], &ops))) {
        fprintf(stderr, "usage: %s [SEED [ITERATIONS [OPS]]]\n", argv[0]);
        return 2;
    }
    if (argc < 2) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
    }
    printf("model_test: seed %" PRIu64 ", %" PRIu64 " iterations of up to %" PRIu64 " operations\n",
           seed, iterations, ops);
    fflush(stdout);
    m_totals totals = {0};
    for (uint64_t i = 0; i < iterations; i++) {
        char what[96];
        snprintf(what, sizeof(what), "reproduce with: model_test %" PRIu64 " 1 %" PRIu64, seed + i,
                 ops);
        m_source src;
        m_source_seed(&src, seed + i);
        m_run_sequence(&src, what, MAX_ITEMS, (size_t)ops, &totals);
    }
    printf("model_test: %" PRIu64 " runs agree with the model: %" PRIu64 " steps, %" PRIu64
           " advances, %" PRIu64 " scheduled, %" PRIu64 " expired, %" PRIu64 " cancelled, %" PRIu64
           " rejected, %" PRIu64 " returned or released by stop, %" PRIu64 " resets, %" PRIu64
           " periodic runs re-armed\n",
           totals.runs, totals.steps, totals.advances, totals.scheduled, totals.expired,
           totals.cancelled, totals.rejected, totals.returned, totals.resets, totals.reruns);
    return 0;
}
