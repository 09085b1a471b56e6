/* Elementwise kernels: residual add, sum of squares. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

void ts_cpu_residual_forward(void *out_, const void *a_, const void *b_, size_t n)
{
    float *out = out_;
    const float *a = a_;
    const float *b = b_;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* Blocks of a fixed size, each summed in double, then the block sums added in order:
 * the result does not depend on the thread count. */
#define TS_SUMSQ_BLOCK ((size_t)1 << 15)

double ts_cpu_sum_squares(const float *x, size_t n)
{
    size_t nblocks = (n + TS_SUMSQ_BLOCK - 1) / TS_SUMSQ_BLOCK;
    if (nblocks == 0) return 0.0;
    double stack_parts[64];
    double *parts = nblocks <= 64 ? stack_parts : ts_malloc(nblocks * sizeof(double));
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nblocks; k++) {
        size_t i0 = k * TS_SUMSQ_BLOCK;
        size_t i1 = i0 + TS_SUMSQ_BLOCK < n ? i0 + TS_SUMSQ_BLOCK : n;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = i0; i < i1; i++) s += (double)x[i] * (double)x[i];
        parts[k] = s;
    }
    double total = 0.0;
    for (size_t k = 0; k < nblocks; k++) total += parts[k];
    if (parts != stack_parts) free(parts);
    return total;
}
