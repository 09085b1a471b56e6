/* LayerNorm over the last axis, eps 1e-5 (as nn.LayerNorm). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

/* One row: o = LayerNorm(x), its mean and rstd returned. Not inlined: the fused
 * residual_layernorm_forward runs this same machine code, so the two paths vectorise
 * the row sums alike and give the same bits. */
static __attribute__((noinline)) void layernorm_row(float *o, float *mean, float *rstd,
                                                    const float *x, const float *weight,
                                                    const float *bias, int C)
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
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
    *mean = m;
    *rstd = rs;
}

void ts_cpu_layernorm_forward(void *out_, float *mean, float *rstd, const void *inp_,
                              const float *weight, const float *bias, int N, int C)
{
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, weight, bias,
                      C);
}

/* The sum is one rounding per element, as residual_forward's; the row is still in cache
 * when its LayerNorm reads it back. */
void ts_cpu_residual_layernorm_forward(void *res_out_, void *ln_out_, float *mean, float *rstd,
                                       const void *a_, const void *b_, const float *weight,
                                       const float *bias, int N, int C)
{
    float *res_out = res_out_;
    float *ln_out = ln_out_;
    const float *a = a_;
    const float *b = b_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t r = (size_t)n * C;
        float *x = res_out + r;
#pragma omp simd
        for (int c = 0; c < C; c++) x[c] = a[r + c] + b[r + c];
        layernorm_row(ln_out + r, mean + n, rstd + n, x, weight, bias, C);
    }
}

/* Rows per block for the dweight/dbias partial sums. Fixed (not per thread), so the
 * reduction order, hence the result, is the same for any thread count. */
#define TS_LN_BLOCK 32

/* With xhat = (x - mean) * rstd and g = weight * dout:
 *   dinp = rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout. */
void ts_cpu_layernorm_backward(void *dinp_, float *dweight, float *dbias, const void *dout_,
                               const void *inp_, const float *weight, const float *mean,
                               const float *rstd, int N, int C)
{
    float *dinp = dinp_;
    const float *dout = dout_;
    const float *inp = inp_;
    int nblocks = (N + TS_LN_BLOCK - 1) / TS_LN_BLOCK;
    /* Per block: C partial dweight, then C partial dbias. */
    float *part = ts_alloc_floats((size_t)nblocks * 2 * C);
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int k = 0; k < nblocks; k++) {
            float *pw = part + (size_t)k * 2 * C;
            float *pb = pw + C;
            int n1 = (k + 1) * TS_LN_BLOCK < N ? (k + 1) * TS_LN_BLOCK : N;
            for (int n = k * TS_LN_BLOCK; n < n1; n++) {
                const float *x = inp + (size_t)n * C;
                const float *d = dout + (size_t)n * C;
                float *dx = dinp + (size_t)n * C;
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
            }
        }
        ts_cpu_reduce_norm_blocks(part, nblocks, C, 2, dweight, dbias, omp_get_thread_num(),
                                  omp_get_num_threads());
    }
    free(part);
}
