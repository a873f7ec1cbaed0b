/*
 * fuzz_core.c: a libFuzzer target for the hwtimer C core.  The input's
 * bytes choose a configuration and a sequence of schedules (one-shot and
 * periodic), cancels, resets, periodic runs and clock advances (model.h decodes them), checked step
 * by step against the reference model; any mismatch aborts with the mismatch and the operations
 * before it printed.
 *
 * Build (see scripts/check-core.sh):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Isrc \
 *       tests/c/fuzz_core.c src/hwt.c src/wheel.c src/hwt_sys.c -o fuzz_core
 */
#define MODEL_ON_FAILURE() abort()
#include "model.h"

#define MAX_ITEMS 64
#define MAX_OPS   4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    m_source src;
    m_source_bytes(&src, data, size);
    m_run_sequence(&src, "the fuzzer's input", MAX_ITEMS, MAX_OPS, false, NULL);
    return 0;
}
