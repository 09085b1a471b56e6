/* RMSNorm over the last axis (llama; Hugging Face's LlamaRMSNorm):
 *   out = x * rstd * weight,  rstd = 1 / sqrt(mean(x^2) + eps),
 * in fp32 as layernorm.c, whose structure this follows (a shared row function for the
 * fused residual form, fixed row blocks for the weight gradient). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

/* One row: o = RMSNorm(x), its rstd returned. Not inlined: the fused
 * residual_rmsnorm_forward runs this same machine code, so the two paths vectorise the
 * sum of squares alike and give the same bits. The sum is in float, as layernorm.c's
 * (a row of C ~ 4096 values of similar size loses nothing that matters next to eps). */
static __attribute__((noinline)) void rmsnorm_row(float *o, float *rstd, const float *x,
                                                  const float *weight, int C, float eps)
{
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float rs = 1.0f / sqrtf(ss / C + eps);
    /* (x * rstd) * weight: Hugging Face's order (normalise, then scale). */
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * rs * weight[c];
    *rstd = rs;
}

void ts_cpu_rmsnorm_forward(void *out_, float *rstd, const void *inp_, const float *weight, int N,
                            int C, float eps)
{
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        rmsnorm_row(out + (size_t)n * C, rstd + n, inp + (size_t)n * C, weight, C, eps);
}

/* The sum is one rounding per element, as residual_forward's; the row is still in cache
 * when its RMSNorm reads it back. */
void ts_cpu_residual_rmsnorm_forward(void *res_out_, void *norm_out_, float *rstd, const void *a_,
                                     const void *b_, const float *weight, int N, int C, float eps)
{
    float *res_out = res_out_;
    float *norm_out = norm_out_;
    const float *a = a_;
    const float *b = b_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t r = (size_t)n * C;
        float *x = res_out + r;
#pragma omp simd
        for (int c = 0; c < C; c++) x[c] = a[r + c] + b[r + c];
        rmsnorm_row(norm_out + r, rstd + n, x, weight, C, eps);
    }
}

/* Rows per block for the dweight partial sums. Fixed (not per thread), so the
 * reduction order, hence the result, is the same for any thread count. */
#define TS_RMS_BLOCK 32

/* With xhat = x * rstd and g = weight * dout (rstd depends on every x of the row:
 * d rstd / d x_c = -rstd^3 x_c / C):
 *   dinp += rstd * (g - xhat * mean(g * xhat)),
 *   dweight += sum over rows of dout * xhat. */
void ts_cpu_rmsnorm_backward(void *dinp_, float *dweight, const void *dout_, const void *inp_,
                             const float *weight, const float *rstd, int N, int C)
{
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
    int nblocks = (N + TS_RMS_BLOCK - 1) / TS_RMS_BLOCK;
    float *part = ts_alloc_floats((size_t)nblocks * C); /* per block: C partial dweight */
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int k = 0; k < nblocks; k++) {
            float *pw = part + (size_t)k * C;
            int n1 = (k + 1) * TS_RMS_BLOCK < N ? (k + 1) * TS_RMS_BLOCK : N;
            for (int n = k * TS_RMS_BLOCK; n < n1; n++) {
                const float *x = inp + (size_t)n * C;
                const float *d = dout + (size_t)n * C;
                float *dx = dinp + (size_t)n * C;
                ts_cpu_rmsnorm_row_backward(dx, pw, x, d, weight, rstd[n], C);
            }
        }
        ts_cpu_reduce_norm_blocks(part, nblocks, C, 1, dweight, NULL, omp_get_thread_num(),
                                  omp_get_num_threads());
    }
    free(part);
}
