/* Choosing the OpenBLAS kernel: the decision as a pure function of what the CPU runs,
 * what OpenBLAS picked and whether the user set OPENBLAS_CORETYPE. */
#include <string.h>

#include "kernels/cpu/blas_core.h"
#include "test_util.h"

static const char *pick(ts_isa cpu, const char *chosen, bool user, bool *warn)
{
    return ts_blas_pick_core(cpu, chosen, user, warn);
}

static void test_blas_core_names(void)
{
    CHECK(ts_blas_core_isa("Prescott") == TS_ISA_SSE);
    CHECK(ts_blas_core_isa("NEHALEM") == TS_ISA_SSE); /* case-insensitive */
    CHECK(ts_blas_core_isa("Sandybridge") == TS_ISA_AVX);
    CHECK(ts_blas_core_isa("Haswell") == TS_ISA_AVX2 && ts_blas_core_isa("Zen") == TS_ISA_AVX2);
    CHECK(ts_blas_core_isa("SkylakeX") == TS_ISA_AVX512);
    CHECK(ts_blas_core_isa("Cooperlake") == TS_ISA_AVX512);
    CHECK(ts_blas_core_isa("NoSuchCore") == TS_ISA_UNKNOWN && ts_blas_core_isa(NULL) == TS_ISA_UNKNOWN);
}

static void test_blas_pick_fallbacks(void)
{
    bool warn = true;
    /* Sapphire Rapids misdetected by OpenBLAS 0.3.21: Prescott -> SkylakeX. */
    const char *p = pick(TS_ISA_AVX512, "Prescott", false, &warn);
    CHECK(p && strcmp(p, "SkylakeX") == 0 && !warn);
    p = pick(TS_ISA_AVX2, "Prescott", false, &warn);
    CHECK(p && strcmp(p, "Haswell") == 0);
    p = pick(TS_ISA_AVX2, "Sandybridge", false, &warn); /* AVX without FMA */
    CHECK(p && strcmp(p, "Haswell") == 0);
    /* Real detections stay: Zen on an AVX-512 Zen 4, Haswell on Haswell, SkylakeX. */
    CHECK(pick(TS_ISA_AVX512, "Zen", false, &warn) == NULL && !warn);
    CHECK(pick(TS_ISA_AVX2, "Haswell", false, &warn) == NULL && !warn);
    CHECK(pick(TS_ISA_AVX512, "SkylakeX", false, &warn) == NULL && !warn);
    /* A CPU without AVX2 keeps what OpenBLAS chose; unknown names are left alone. */
    CHECK(pick(TS_ISA_AVX, "Sandybridge", false, &warn) == NULL);
    CHECK(pick(TS_ISA_SSE, "Prescott", false, &warn) == NULL);
    CHECK(pick(TS_ISA_AVX512, "Armv8", false, &warn) == NULL && !warn);
    CHECK(pick(TS_ISA_UNKNOWN, "Prescott", false, &warn) == NULL);
}

static void test_blas_pick_respects_user(void)
{
    bool warn = false;
    CHECK(pick(TS_ISA_AVX512, "Prescott", true, &warn) == NULL && warn);
    CHECK(pick(TS_ISA_AVX512, "Haswell", true, &warn) == NULL && !warn);
}

static void test_blas_this_machine(void)
{
#if defined(__x86_64__)
    CHECK(ts_cpu_isa() >= TS_ISA_SSE); /* x86-64 has SSE2 at least */
#endif
    CHECK(ts_blas_core() && ts_blas_core()[0] != '\0');
    double g = ts_blas_measure_gflops();
    CHECKF(g > 0.1 && g < 1e5, "sgemm rate %g GFLOP/s", g);
    char model[128];
    CHECK(ts_cpu_model(model, sizeof model)[0] != '\0');
}

int main(void)
{
    test_blas_core_names();
    test_blas_pick_fallbacks();
    test_blas_pick_respects_user();
    test_blas_this_machine();
    return ts_test_report();
}
