/* RMSNorm over the last axis (llama; Hugging Face's LlamaRMSNorm):
 *   out = x * rstd * weight,  rstd = 1 / sqrt(mean(x^2) + eps),
 * for both storage types (storage.h) as layernorm.c, whose structure this follows (a
 * shared row function for the fused residual form, fixed row blocks for the weight
 * gradient): fp32 arithmetic on rows, bf16 ones widened into per-thread buffers and
 * rounded back once; rstd fp32. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* One row: out[r..r+C) = RMSNorm(x) in storage type t, its rstd returned. Not inlined:
 * the fused residual_rmsnorm_forward runs this same machine code, so the two paths
 * vectorise the sum of squares alike and give the same bits. The sum is in float, as
 * layernorm.c's (a row of C ~ 4096 values of similar size loses nothing that matters
 * next to eps). */
static __attribute__((noinline)) void rmsnorm_row(ts_dtype t, void *out, size_t r, float *rstd,
                                                  const float *x, const float *weight, int C,
                                                  float eps)
{
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float rs = 1.0f / sqrtf(ss / C + eps);
    float yb[TS_BF16_CHUNK];
    for (int c0 = 0, n; c0 < C; c0 += n) {
        n = (int)ts_cpu_chunk(t, (size_t)(C - c0));
        float *y = ts_cpu_out(t, yb, out, r + c0);
        /* (x * rstd) * weight: Hugging Face's order (normalise, then scale). */
#pragma omp simd
        for (int c = 0; c < n; c++) y[c] = x[c0 + c] * rs * weight[c0 + c];
        ts_cpu_store(t, out, r + c0, y, (size_t)n);
    }
    *rstd = rs;
}

static void rmsnorm_forward(ts_dtype t, void *out, float *rstd, const void *inp,
                            const float *weight, int N, int C, float eps)
{
#pragma omp parallel
    {
        float *xb = ts_cpu_buffer(t, (size_t)C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t r = (size_t)n * C;
            const float *x = ts_cpu_load(t, xb, inp, r, (size_t)C);
            rmsnorm_row(t, out, r, rstd + n, x, weight, C, eps);
        }
        free(xb);
    }
}

/* res_out = a + b, then norm_out = RMSNorm(res_out): the sum rounded once to the
 * storage type and stored, the RMSNorm reading the STORED sum (bf16: widened back,
 * exactly), as residual_forward followed by rmsnorm_forward would, through the same
 * row function: the same bits as the two calls. */
static void residual_rmsnorm_forward(ts_dtype t, void *res_out, void *norm_out, float *rstd,
                                     const void *a, const void *b, const float *weight, int N,
                                     int C, float eps)
{
#pragma omp parallel
    {
        float *xb = ts_cpu_buffer(t, 2 * (size_t)C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t r = (size_t)n * C;
            const float *xs = ts_cpu_residual_row(t, xb, res_out, a, b, r, C);
            rmsnorm_row(t, norm_out, r, rstd + n, xs, weight, C, eps);
        }
        free(xb);
    }
}

/* One row's backward in fp32: dx += the input gradient, pw += the row's share of the
 * weight gradient. */
static inline void rmsnorm_row_backward(float *dx, float *pw, const float *x, const float *d,
                                        const float *weight, float rs, int C)
{
    float sgx = 0.0f;
#pragma omp simd reduction(+ : sgx)
    for (int c = 0; c < C; c++) {
        float xhat = x[c] * rs;
        sgx += weight[c] * d[c] * xhat;
        pw[c] += d[c] * xhat;
    }
    float mgx = sgx / C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
        float xhat = x[c] * rs;
        dx[c] += (weight[c] * d[c] - xhat * mgx) * rs;
    }
}

/* Rows per block for the dweight partial sums. Fixed (not per thread), so the
 * reduction order, hence the result, is the same for any thread count. */
#define TS_RMS_BLOCK 32

/* With xhat = x * rstd and g = weight * dout (rstd depends on every x of the row:
 * d rstd / d x_c = -rstd^3 x_c / C):
 *   dinp += rstd * (g - xhat * mean(g * xhat)),
 *   dweight += sum over rows of dout * xhat.
 * dinp ACCUMULATES (the residual stream's gradient): for bf16 its value is widened, the
 * fp32 term added, and the sum rounded once. */
static void rmsnorm_backward(ts_dtype t, void *dinp, float *dweight, const void *dout,
                             const void *inp, const float *weight, const float *rstd, int N,
                             int C)
{
    int nblocks = (N + TS_RMS_BLOCK - 1) / TS_RMS_BLOCK;
    float *part = ts_alloc_floats((size_t)nblocks * C); /* per block: C partial dweight */
#pragma omp parallel
    {
        float *xb = ts_cpu_buffer(t, 3 * (size_t)C), *db = xb ? xb + C : NULL;
        float *dxb = xb ? db + C : NULL;
#pragma omp for schedule(static)
        for (int k = 0; k < nblocks; k++) {
            float *pw = part + (size_t)k * C;
            int n1 = (k + 1) * TS_RMS_BLOCK < N ? (k + 1) * TS_RMS_BLOCK : N;
            for (int n = k * TS_RMS_BLOCK; n < n1; n++) {
                const size_t r = (size_t)n * C;
                const float *x = ts_cpu_load(t, xb, inp, r, (size_t)C);
                const float *d = ts_cpu_load(t, db, dout, r, (size_t)C);
                float *dx = ts_cpu_load_out(t, dxb, dinp, r, (size_t)C);
                rmsnorm_row_backward(dx, pw, x, d, weight, rstd[n], C);
                ts_cpu_store(t, dinp, r, dx, (size_t)C);
            }
        }
        free(xb);
        ts_cpu_reduce_norm_blocks(part, nblocks, C, 1, dweight, NULL, omp_get_thread_num(),
                                  omp_get_num_threads());
    }
    free(part);
}

void ts_cpu_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N,
                            int C, float eps)
{
    rmsnorm_forward(TS_DTYPE_F32, out, rstd, inp, weight, N, C, eps);
}

void ts_cpu_bf16_rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight,
                                 int N, int C, float eps)
{
    rmsnorm_forward(TS_DTYPE_BF16, out, rstd, inp, weight, N, C, eps);
}

void ts_cpu_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd, const void *a,
                                     const void *b, const float *weight, int N, int C, float eps)
{
    residual_rmsnorm_forward(TS_DTYPE_F32, res_out, norm_out, rstd, a, b, weight, N, C, eps);
}

void ts_cpu_bf16_residual_rmsnorm_forward(void *res_out, void *norm_out, float *rstd,
                                          const void *a, const void *b, const float *weight,
                                          int N, int C, float eps)
{
    residual_rmsnorm_forward(TS_DTYPE_BF16, res_out, norm_out, rstd, a, b, weight, N, C, eps);
}

void ts_cpu_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                             const float *weight, const float *rstd, int N, int C)
{
    rmsnorm_backward(TS_DTYPE_F32, dinp, dweight, dout, inp, weight, rstd, N, C);
}

void ts_cpu_bf16_rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                                  const float *weight, const float *rstd, int N, int C)
{
    rmsnorm_backward(TS_DTYPE_BF16, dinp, dweight, dout, inp, weight, rstd, N, C);
}
