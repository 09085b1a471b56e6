/* Residual add on bf16 activations, and the add fused with the next LayerNorm. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* out may alias a or b: a chunk is read whole before it is written. */
void ts_cpu_bf16_residual_forward(void *out, const void *a, const void *b, size_t n)
{
    size_t chunks = (n + TS_BF16_CHUNK - 1) / TS_BF16_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * TS_BF16_CHUNK, m = n - i0 < TS_BF16_CHUNK ? n - i0 : TS_BF16_CHUNK;
        float x[TS_BF16_CHUNK], y[TS_BF16_CHUNK];
        ts_bf16_to_f32_array(x, (const ts_bf16 *)a + i0, m);
        ts_bf16_to_f32_array(y, (const ts_bf16 *)b + i0, m);
#pragma omp simd
        for (size_t i = 0; i < m; i++) x[i] += y[i];
        ts_f32_to_bf16_array((ts_bf16 *)out + i0, x, m);
    }
}

/* The sum is rounded to bf16 once and stored; the LayerNorm then reads the ROUNDED
 * sum (widened back, exactly), as residual_forward followed by layernorm_forward
 * would, through the same row function: the same bits as the two calls. */
void ts_cpu_bf16_residual_layernorm_forward(void *res_out, void *ln_out, float *mean, float *rstd,
                                            const void *a, const void *b, const float *weight,
                                            const float *bias, int N, int C)
{
#pragma omp parallel
    {
        float *x = ts_alloc_floats(2 * (size_t)C), *y = x + C;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t r = (size_t)n * C;
            ts_bf16 *res = (ts_bf16 *)res_out + r;
            ts_bf16_to_f32_array(x, (const ts_bf16 *)a + r, (size_t)C);
            ts_bf16_to_f32_array(y, (const ts_bf16 *)b + r, (size_t)C);
#pragma omp simd
            for (int c = 0; c < C; c++) x[c] += y[c];
            ts_f32_to_bf16_array(res, x, (size_t)C);
            ts_bf16_to_f32_array(x, res, (size_t)C);
            ts_cpu_bf16_layernorm_row((ts_bf16 *)ln_out + r, mean + n, rstd + n, x, weight, bias,
                                      C);
        }
        free(x);
    }
}
