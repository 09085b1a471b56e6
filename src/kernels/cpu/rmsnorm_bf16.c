/* RMSNorm over the last axis on bf16 activations: rmsnorm.c's arithmetic in fp32 on
 * rows widened into per-thread buffers; rstd fp32. The residual form is here too, so
 * its row function can stay private to this file. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* One row of RMSNorm from fp32 x[C] into bf16 o[C], rstd returned. Not inlined:
 * residual_rmsnorm_forward runs this same machine code, so both paths vectorise the
 * sum of squares alike and give the same bits. */
static __attribute__((noinline)) void rmsnorm_row(ts_bf16 *o, float *rstd, const float *x,
                                                  const float *weight, int C, float eps)
{
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float rs = 1.0f / sqrtf(ss / C + eps);
    float y[TS_BF16_CHUNK];
    for (int c0 = 0; c0 < C; c0 += TS_BF16_CHUNK) {
        int n = C - c0 < TS_BF16_CHUNK ? C - c0 : TS_BF16_CHUNK;
#pragma omp simd
        for (int c = 0; c < n; c++) y[c] = x[c0 + c] * rs * weight[c0 + c];
        ts_f32_to_bf16_array(o + c0, y, (size_t)n);
    }
    *rstd = rs;
}

void ts_cpu_bf16_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight,
                                 int N, int C, float eps)
{
#pragma omp parallel
    {
        float *x = ts_alloc_floats((size_t)C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            ts_bf16_to_f32_array(x, (const ts_bf16 *)inp + (size_t)n * C, (size_t)C);
            rmsnorm_row((ts_bf16 *)out + (size_t)n * C, rstd + n, x, weight, C, eps);
        }
        free(x);
    }
}

/* The sum is rounded to bf16 once and stored; the RMSNorm then reads the ROUNDED sum
 * (widened back, exactly), as residual_forward followed by rmsnorm_forward would,
 * through the same row function: the same bits as the two calls. */
void ts_cpu_bf16_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd,
                                          const void *a, const void *b, const float *weight,
                                          int N, int C, float eps)
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
            rmsnorm_row((ts_bf16 *)norm_out + r, rstd + n, x, weight, C, eps);
        }
        free(x);
    }
}

/* Rows per block for the dweight partial sums, fixed (not per thread) so the reduction
 * order, hence the result, is the same for any thread count (rmsnorm.c). */
#define TS_RMS_BLOCK 32

/* With xhat = x * rstd and g = weight * dout:
 *   dinp += rstd * (g - xhat * mean(g * xhat)),  dweight += sum over rows of dout * xhat.
 * dinp ACCUMULATES (the residual stream's gradient): its bf16 value is widened, the
 * fp32 term added, and the sum rounded once. */
void ts_cpu_bf16_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                                  const float *weight, const float *rstd, int N, int C)
{
    int nblocks = (N + TS_RMS_BLOCK - 1) / TS_RMS_BLOCK;
    float *part = ts_alloc_floats((size_t)nblocks * C); /* per block: C partial dweight */
#pragma omp parallel
    {
        float *x = ts_alloc_floats(3 * (size_t)C), *d = x + C, *dx = d + C;
#pragma omp for schedule(static)
        for (int k = 0; k < nblocks; k++) {
            float *pw = part + (size_t)k * C;
            int n1 = (k + 1) * TS_RMS_BLOCK < N ? (k + 1) * TS_RMS_BLOCK : N;
            for (int n = k * TS_RMS_BLOCK; n < n1; n++) {
                const size_t r = (size_t)n * C;
                ts_bf16_to_f32_array(x, (const ts_bf16 *)inp + r, (size_t)C);
                ts_bf16_to_f32_array(d, (const ts_bf16 *)dout + r, (size_t)C);
                ts_bf16_to_f32_array(dx, (const ts_bf16 *)dinp + r, (size_t)C);
                ts_cpu_rmsnorm_row_backward(dx, pw, x, d, weight, rstd[n], C);
                ts_f32_to_bf16_array((ts_bf16 *)dinp + r, dx, (size_t)C);
            }
        }
        free(x);
        ts_cpu_reduce_norm_blocks(part, nblocks, C, 1, dweight, NULL, omp_get_thread_num(),
                                  omp_get_num_threads());
    }
    free(part);
}
