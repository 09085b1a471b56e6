/* LayerNorm over the last axis, eps 1e-5 (as nn.LayerNorm), for both storage types
 * (storage.h): the arithmetic in fp32 on rows, fp32 ones used in place, bf16 ones
 * widened into per-thread buffers and rounded back once; mean and rstd fp32. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* One row: out[r..r+C) = LayerNorm(x) in storage type t, its mean and rstd returned.
 * Not inlined: the fused residual_layernorm_forward runs this same machine code, so the
 * two paths vectorise the row sums alike and give the same bits. */
static __attribute__((noinline)) void layernorm_row(ts_dtype t, void *out, size_t r, float *mean,
                                                    float *rstd, const float *x,
                                                    const float *weight, const float *bias,
                                                    int C)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    float m = s / C;
    /* Two passes: the variance of (x - m) does not cancel like E[x^2] - m^2. */
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) {
        float d = x[c] - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(v / C + 1e-5f);
    float yb[TS_BF16_CHUNK];
    for (int c0 = 0, n; c0 < C; c0 += n) {
        n = (int)ts_cpu_chunk(t, (size_t)(C - c0));
        float *y = ts_cpu_out(t, yb, out, r + c0);
#pragma omp simd
        for (int c = 0; c < n; c++) y[c] = (x[c0 + c] - m) * rs * weight[c0 + c] + bias[c0 + c];
        ts_cpu_store(t, out, r + c0, y, (size_t)n);
    }
    *mean = m;
    *rstd = rs;
}

static void layernorm_forward(ts_dtype t, void *out, float *mean, float *rstd, const void *inp,
                              const float *weight, const float *bias, int N, int C)
{
#pragma omp parallel
    {
        float *xb = ts_cpu_buffer(t, (size_t)C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t r = (size_t)n * C;
            const float *x = ts_cpu_load(t, xb, inp, r, (size_t)C);
            layernorm_row(t, out, r, mean + n, rstd + n, x, weight, bias, C);
        }
        free(xb);
    }
}

/* res_out = a + b, then ln_out = LayerNorm(res_out). The sum is rounded once to the
 * storage type and stored, and the LayerNorm reads the STORED sum (for bf16 widened
 * back, exactly), as residual_forward followed by layernorm_forward would, through the
 * same row function: the same bits as the two calls. For fp32 the row is still in
 * cache when its LayerNorm reads it back. */
static void residual_layernorm_forward(ts_dtype t, void *res_out, void *ln_out, float *mean,
                                       float *rstd, const void *a, const void *b,
                                       const float *weight, const float *bias, int N, int C)
{
#pragma omp parallel
    {
        float *xb = ts_cpu_buffer(t, 2 * (size_t)C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t r = (size_t)n * C;
            const float *xs = ts_cpu_residual_row(t, xb, res_out, a, b, r, C);
            layernorm_row(t, ln_out, r, mean + n, rstd + n, xs, weight, bias, C);
        }
        free(xb);
    }
}

/* Rows per block for the dweight/dbias partial sums. Fixed (not per thread), so the
 * reduction order, hence the result, is the same for any thread count. */
#define TS_LN_BLOCK 32

/* With xhat = (x - mean) * rstd and g = weight * dout:
 *   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout.
 * dinp ACCUMULATES (the residual stream's gradient): for bf16 its value is widened, the
 * fp32 term added, and the sum rounded once. */
static void layernorm_backward(ts_dtype t, void *dinp, float *dweight, float *dbias,
                               const void *dout, const void *inp, const float *weight,
                               const float *mean, const float *rstd, int N, int C)
{
    int nblocks = (N + TS_LN_BLOCK - 1) / TS_LN_BLOCK;
    /* Per block: C partial dweight, then C partial dbias. */
    float *part = ts_alloc_floats((size_t)nblocks * 2 * C);
#pragma omp parallel
    {
        float *xb = ts_cpu_buffer(t, 3 * (size_t)C), *db = xb ? xb + C : NULL;
        float *dxb = xb ? db + C : NULL;
#pragma omp for schedule(static)
        for (int k = 0; k < nblocks; k++) {
            float *pw = part + (size_t)k * 2 * C;
            float *pb = pw + C;
            int n1 = (k + 1) * TS_LN_BLOCK < N ? (k + 1) * TS_LN_BLOCK : N;
            for (int n = k * TS_LN_BLOCK; n < n1; n++) {
                const size_t r = (size_t)n * C;
                const float *x = ts_cpu_load(t, xb, inp, r, (size_t)C);
                const float *d = ts_cpu_load(t, db, dout, r, (size_t)C);
                float *dx = ts_cpu_load_out(t, dxb, dinp, r, (size_t)C);
                float m = mean[n], rs = rstd[n];
                float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
                for (int c = 0; c < C; c++) {
                    float xhat = (x[c] - m) * rs;
                    float g = weight[c] * d[c];
                    sg += g;
                    sgx += g * xhat;
                    pw[c] += d[c] * xhat;
                    pb[c] += d[c];
                }
                float mg = sg / C, mgx = sgx / C;
#pragma omp simd
                for (int c = 0; c < C; c++) {
                    float xhat = (x[c] - m) * rs;
                    dx[c] += (weight[c] * d[c] - mg - xhat * mgx) * rs;
                }
                ts_cpu_store(t, dinp, r, dx, (size_t)C);
            }
        }
        free(xb);
        ts_cpu_reduce_norm_blocks(part, nblocks, C, 2, dweight, dbias, omp_get_thread_num(),
                                  omp_get_num_threads());
    }
    free(part);
}

void ts_cpu_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                              const float *weight, const float *bias, int N, int C)
{
    layernorm_forward(TS_DTYPE_F32, out, mean, rstd, inp, weight, bias, N, C);
}

void ts_cpu_bf16_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                   const float *weight, const float *bias, int N, int C)
{
    layernorm_forward(TS_DTYPE_BF16, out, mean, rstd, inp, weight, bias, N, C);
}

void ts_cpu_residual_layernorm_forward(void *res_out, void *ln_out, float *mean, float *rstd,
                                       const void *a, const void *b, const float *weight,
                                       const float *bias, int N, int C)
{
    residual_layernorm_forward(TS_DTYPE_F32, res_out, ln_out, mean, rstd, a, b, weight, bias, N,
                               C);
}

void ts_cpu_bf16_residual_layernorm_forward(void *res_out, void *ln_out, float *mean, float *rstd,
                                            const void *a, const void *b, const float *weight,
                                            const float *bias, int N, int C)
{
    residual_layernorm_forward(TS_DTYPE_BF16, res_out, ln_out, mean, rstd, a, b, weight, bias, N,
                               C);
}

void ts_cpu_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C)
{
    layernorm_backward(TS_DTYPE_F32, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void ts_cpu_bf16_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                                    const void *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C)
{
    layernorm_backward(TS_DTYPE_BF16, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}
