/* LayerNorm over the last axis (eps 1e-5, as nn.LayerNorm and the CPU backend).
 *
 * Forward: one warp per row; two passes over the row (mean, then the variance of
 * x - mean, which does not cancel like E[x^2] - mean^2), as the CPU. mean and rstd are
 * saved for backward.
 *
 * Backward, with xhat = (x - mean) * rstd and g = weight * dout:
 *   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat))   (one warp per row),
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout.
 * The parameter sums run over all N rows, and there is no workspace argument for
 * partial sums across blocks, nor atomics (their order of addition varies from run to
 * run). So one block owns 32 channels: its 32 x TS_LN_GROUPS threads each sum every
 * TS_LN_GROUPS-th row of one channel in order, then the groups' partial sums are added
 * in a fixed order. Every sum's order depends only on N and C: bitwise repeatable.
 * Warp reductions use butterfly shuffles, also a fixed order. */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/layernorm_row.cuh"
#include "kernels/cuda/reduce.cuh"

#define TS_LN_WARPS 8  /* rows (warps) per block in the row kernels */
#define TS_LN_GROUPS 16 /* row groups per block in the parameter-gradient kernel */

static __global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd,
                                                const float *inp, const float *weight,
                                                const float *bias, int N, int C)
{
    int n = blockIdx.x * TS_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return; /* whole warps leave together */
    const float *x = inp + (size_t)n * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    layernorm_row(out + (size_t)n * C, &mean[n], &rstd[n], x, s, weight, bias, C, lane);
}

static __global__ void layernorm_backward_dinp_kernel(float *dinp, const float *dout,
                                                      const float *inp, const float *weight,
                                                      const float *mean, const float *rstd,
                                                      int N, int C)
{
    int n = blockIdx.x * TS_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const float *x = inp + (size_t)n * C;
    const float *d = dout + (size_t)n * C;
    float *dx = dinp + (size_t)n * C;
    float m = mean[n], rs = rstd[n];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xhat = (x[c] - m) * rs;
        float g = weight[c] * d[c];
        sg += g;
        sgx += g * xhat;
    }
    float mg = warp_sum(sg) / C, mgx = warp_sum(sgx) / C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (x[c] - m) * rs;
        dx[c] += (weight[c] * d[c] - mg - xhat * mgx) * rs;
    }
}

/* Block (32, TS_LN_GROUPS) owns channels [32 * blockIdx.x, +32). */
static __global__ void layernorm_backward_params_kernel(float *dweight, float *dbias,
                                                        const float *dout, const float *inp,
                                                        const float *mean, const float *rstd,
                                                        int N, int C)
{
    __shared__ float pw[TS_LN_GROUPS][32], pb[TS_LN_GROUPS][32];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (int n = ty; n < N; n += TS_LN_GROUPS) {
            float d = dout[(size_t)n * C + c];
            float xhat = (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            sw += d * xhat;
            sb += d;
        }
    }
    pw[ty][tx] = sw;
    pb[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && c < C) {
        float w = pw[0][tx], b = pb[0][tx];
        for (int k = 1; k < TS_LN_GROUPS; k++) {
            w += pw[k][tx];
            b += pb[k][tx];
        }
        dweight[c] += w;
        dbias[c] += b;
    }
}

extern "C" void ts_cuda_layernorm_forward(float *out, float *mean, float *rstd,
                                          const float *inp, const float *weight,
                                          const float *bias, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<<<ts_cuda_blocks((size_t)N, TS_LN_WARPS), TS_LN_WARPS * 32, 0,
                               ts_cuda_stream()>>>(out, mean, rstd, inp, weight, bias, N, C);
    TS_CUDA_LAUNCHED();
}

extern "C" void ts_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias,
                                           const float *dout, const float *inp,
                                           const float *weight, const float *mean,
                                           const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    layernorm_backward_dinp_kernel<<<ts_cuda_blocks((size_t)N, TS_LN_WARPS), TS_LN_WARPS * 32,
                                     0, ts_cuda_stream()>>>(dinp, dout, inp, weight, mean, rstd,
                                                            N, C);
    TS_CUDA_LAUNCHED();
    dim3 block(32, TS_LN_GROUPS);
    layernorm_backward_params_kernel<<<ts_cuda_blocks((size_t)C, 32), block, 0,
                                       ts_cuda_stream()>>>(dweight, dbias, dout, inp, mean, rstd,
                                                           N, C);
    TS_CUDA_LAUNCHED();
}
