/* LayerNorm over the last axis (eps 1e-5) on bf16 activations: layernorm.c's
 * arithmetic in fp32 on rows widened into per-thread buffers; mean and rstd fp32. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* Not inlined: residual_layernorm_forward runs this same machine code, so both paths
 * vectorise the row sums alike and give the same bits. */
__attribute__((noinline)) void ts_cpu_bf16_layernorm_row(ts_bf16 *o, float *mean, float *rstd,
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
    float y[TS_BF16_CHUNK];
    for (int c0 = 0; c0 < C; c0 += TS_BF16_CHUNK) {
        int n = C - c0 < TS_BF16_CHUNK ? C - c0 : TS_BF16_CHUNK;
#pragma omp simd
        for (int c = 0; c < n; c++) y[c] = (x[c0 + c] - m) * rs * weight[c0 + c] + bias[c0 + c];
        ts_f32_to_bf16_array(o + c0, y, (size_t)n);
    }
    *mean = m;
    *rstd = rs;
}

void ts_cpu_bf16_layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                                   const float *weight, const float *bias, int N, int C)
{
#pragma omp parallel
    {
        float *x = ts_alloc_floats((size_t)C);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            ts_bf16_to_f32_array(x, (const ts_bf16 *)inp + (size_t)n * C, (size_t)C);
            ts_cpu_bf16_layernorm_row((ts_bf16 *)out + (size_t)n * C, mean + n, rstd + n, x,
                                      weight, bias, C);
        }
        free(x);
    }
}

/* Rows per block for the dweight/dbias partial sums, fixed (not per thread) so the
 * reduction order, hence the result, is the same for any thread count (layernorm.c). */
#define TS_LN_BLOCK 32

/* With xhat = (x - mean) * rstd and g = weight * dout:
 *   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)),
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout.
 * dinp ACCUMULATES (the residual stream's gradient): its bf16 value is widened, the
 * fp32 term added, and the sum rounded once. */
void ts_cpu_bf16_layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                                    const void *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C)
{
    int nblocks = (N + TS_LN_BLOCK - 1) / TS_LN_BLOCK;
    float *part = ts_alloc_floats((size_t)nblocks * 2 * C); /* per block: dweight, dbias */
#pragma omp parallel
    {
        float *x = ts_alloc_floats(3 * (size_t)C), *d = x + C, *dx = d + C;
#pragma omp for schedule(static)
        for (int k = 0; k < nblocks; k++) {
            float *pw = part + (size_t)k * 2 * C;
            float *pb = pw + C;
            int n1 = (k + 1) * TS_LN_BLOCK < N ? (k + 1) * TS_LN_BLOCK : N;
            for (int n = k * TS_LN_BLOCK; n < n1; n++) {
                const size_t r = (size_t)n * C;
                ts_bf16_to_f32_array(x, (const ts_bf16 *)inp + r, (size_t)C);
                ts_bf16_to_f32_array(d, (const ts_bf16 *)dout + r, (size_t)C);
                ts_bf16_to_f32_array(dx, (const ts_bf16 *)dinp + r, (size_t)C);
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
                ts_f32_to_bf16_array((ts_bf16 *)dinp + r, dx, (size_t)C);
            }
        }
        free(x);
        ts_cpu_reduce_norm_blocks(part, nblocks, C, 2, dweight, dbias, omp_get_thread_num(),
                                  omp_get_num_threads());
    }
    free(part);
}
