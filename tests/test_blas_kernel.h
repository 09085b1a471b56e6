/* The kernel-correctness tests run once with OpenBLAS's own choice and once per core
 * this CPU supports (tests/CMakeLists.txt sets OPENBLAS_CORETYPE and TS_TEST_BLAS_CORE),
 * so a BLAS kernel that computes wrong results on some CPU is caught, not trusted. */
#ifndef TS_TEST_BLAS_KERNEL_H
#define TS_TEST_BLAS_KERNEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/cpu/blas_core.h"

/* Exit 77 (skipped) when this CPU cannot run the requested core; exit 1 when OpenBLAS
 * does not run it (the variant would only repeat the default). Prints the core.
 * The default run (no TS_TEST_BLAS_CORE) is skipped too when the core OpenBLAS runs is
 * one that a per-core copy runs on this CPU (TS_TEST_BLAS_COPIES, comma-separated, from
 * tests/CMakeLists.txt): CI exports OPENBLAS_CORETYPE=Haswell, with which the default
 * run was test_X_Haswell again, the same binary, core and environment. */
static inline void ts_test_require_blas_core(void)
{
    const char *want = getenv("TS_TEST_BLAS_CORE");
    if (!want || !*want) {
        const char *core = ts_blas_core(), *copies = getenv("TS_TEST_BLAS_COPIES");
        ts_isa isa = ts_blas_core_isa(core);
        for (const char *c = copies; c && *c;) {
            size_t n = strcspn(c, ",");
            if (n == strlen(core) && strncasecmp(c, core, n) == 0 && isa != TS_ISA_UNKNOWN &&
                ts_cpu_isa() >= isa) {
                printf("skipped: OpenBLAS runs core %s here, which this test's %s copy runs "
                       "(tests/CMakeLists.txt)\n",
                       core, core);
                exit(77);
            }
            c += n;
            if (*c == ',') c++;
        }
        printf("OpenBLAS core: %s\n", core);
        return;
    }
    ts_isa need = ts_blas_core_isa(want);
    if (need == TS_ISA_UNKNOWN || ts_cpu_isa() < need) {
        printf("skipped: this CPU cannot run OpenBLAS's %s kernel\n", want);
        exit(77);
    }
    if (strcasecmp(ts_blas_core(), want) != 0) {
        fprintf(stderr, "FAIL: asked OpenBLAS for core %s, it runs %s\n", want, ts_blas_core());
        exit(1);
    }
    printf("OpenBLAS core: %s (requested)\n", ts_blas_core());
}

#endif
