/* Elementwise kernels: residual add (both storage types), sum of squares (fp32). The
 * residual add fused with the next norm is in layernorm.c and rmsnorm.c. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* out = a + b for both storage types (storage.h), over chunks of TS_BF16_CHUNK
 * elements; out may alias a or b: a chunk is read whole before it is written. */
static void residual_forward(ts_dtype t, void *out, const void *a, const void *b, size_t n)
{
    size_t chunks = (n + TS_BF16_CHUNK - 1) / TS_BF16_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * TS_BF16_CHUNK, m = n - i0 < TS_BF16_CHUNK ? n - i0 : TS_BF16_CHUNK;
        float xb[TS_BF16_CHUNK], yb[TS_BF16_CHUNK];
        const float *x = ts_cpu_load(t, xb, a, i0, m), *y = ts_cpu_load(t, yb, b, i0, m);
        float *o = ts_cpu_out(t, xb, out, i0);
#pragma omp simd
        for (size_t i = 0; i < m; i++) o[i] = x[i] + y[i];
        ts_cpu_store(t, out, i0, o, m);
    }
}

void ts_cpu_residual_forward(void *out, const void *a, const void *b, size_t n)
{
    residual_forward(TS_DTYPE_F32, out, a, b, n);
}

void ts_cpu_bf16_residual_forward(void *out, const void *a, const void *b, size_t n)
{
    residual_forward(TS_DTYPE_BF16, out, a, b, n);
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
