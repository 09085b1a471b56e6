/* LayerNorm over the last axis (eps 1e-5, as nn.LayerNorm and the CPU backend), and
 * RMSNorm (llama's: no mean, no bias, the caller's eps).
 *
 * Forward: one warp per row; two passes over the row (mean, then the variance of
 * x - mean, which does not cancel like E[x^2] - mean^2), as the CPU. mean and rstd are
 * saved for backward. RMSNorm: one pass for the mean square, one for the output; rstd
 * saved.
 *
 * Backward, with xhat = (x - mean) * rstd and g = weight * dout:
 *   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat))   (one warp per row),
 *   dweight += sum over rows of dout * xhat,  dbias += sum over rows of dout.
 * RMSNorm (xhat = x * rstd, y = xhat * weight; d rstd / dx_k = -rstd^3 x_k / C):
 *   dinp += rstd * (g - xhat * mean(g * xhat)),  dweight += sum over rows of dout * xhat.
 * The parameter sums run over all N rows, and there is no workspace argument for
 * partial sums across blocks, nor atomics (their order of addition varies from run to
 * run). So one block owns 32 channels: its 32 x TS_LN_GROUPS threads each sum every
 * TS_LN_GROUPS-th row of one channel in order, then the groups' partial sums are added
 * in a fixed order (one kernel for both norms). Every sum's order depends only on N and
 * C: bitwise repeatable. Warp reductions use butterfly shuffles, also a fixed order.
 *
 * Templates on the activation type (act.cuh): inp, out, dout and dinp are activations,
 * the weights, statistics and parameter gradients fp32. In bf16 every value is widened
 * on load, the arithmetic is the fp32 one, and dinp's accumulation reads the bf16 dinp,
 * adds in fp32 and rounds once. */
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/layernorm_row.cuh"
#include "kernels/cuda/reduce.cuh"

#define TS_LN_WARPS 8  /* rows (warps) per block in the row kernels */
#define TS_LN_GROUPS 16 /* row groups per block in the parameter-gradient kernel */

template <typename A>
static __global__ void layernorm_forward_kernel(A *out, float *mean, float *rstd, const A *inp,
                                                const float *weight,
                                                const float *bias, int N, int C)
{
    int n = blockIdx.x * TS_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return; /* whole warps leave together */
    const A *x = inp + (size_t)n * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += ts_act_load(x, c);
    layernorm_row(out + (size_t)n * C, &mean[n], &rstd[n], x, s, weight, bias, C, lane);
}

template <typename A>
static __global__ void layernorm_backward_dinp_kernel(A *dinp, const A *dout, const A *inp,
                                                      const float *weight,
                                                      const float *mean, const float *rstd,
                                                      int N, int C)
{
    int n = blockIdx.x * TS_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const A *x = inp + (size_t)n * C;
    const A *d = dout + (size_t)n * C;
    A *dx = dinp + (size_t)n * C;
    float m = mean[n], rs = rstd[n];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xhat = (ts_act_load(x, c) - m) * rs;
        float g = weight[c] * ts_act_load(d, c);
        sg += g;
        sgx += g * xhat;
    }
    float mg = warp_sum(sg) / C, mgx = warp_sum(sgx) / C;
    for (int c = lane; c < C; c += 32) {
        float xhat = (ts_act_load(x, c) - m) * rs;
        float g = weight[c] * ts_act_load(d, c);
        ts_act_store(dx, c, ts_act_load(dx, c) + (g - mg - xhat * mgx) * rs);
    }
}

template <typename A>
static __global__ void rmsnorm_forward_kernel(A *out, float *rstd, const A *inp,
                                              const float *weight, int N, int C, float eps)
{
    int n = blockIdx.x * TS_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return; /* whole warps leave together */
    const A *x = inp + (size_t)n * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s = rms_lane_add(s, ts_act_load(x, c));
    rmsnorm_row(out + (size_t)n * C, &rstd[n], x, s, weight, C, eps, lane);
}

template <typename A>
static __global__ void rmsnorm_backward_dinp_kernel(A *dinp, const A *dout, const A *inp,
                                                    const float *weight, const float *rstd,
                                                    int N, int C)
{
    int n = blockIdx.x * TS_LN_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (n >= N) return;
    const A *x = inp + (size_t)n * C;
    const A *d = dout + (size_t)n * C;
    A *dx = dinp + (size_t)n * C;
    float rs = rstd[n];
    float sgx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xhat = ts_act_load(x, c) * rs;
        float g = weight[c] * ts_act_load(d, c);
        sgx += g * xhat;
    }
    float mgx = warp_sum(sgx) / C;
    for (int c = lane; c < C; c += 32) {
        float xhat = ts_act_load(x, c) * rs;
        float g = weight[c] * ts_act_load(d, c);
        ts_act_store(dx, c, ts_act_load(dx, c) + (g - xhat * mgx) * rs);
    }
}

/* Block (32, TS_LN_GROUPS) owns channels [32 * blockIdx.x, +32). mean NULL: RMSNorm's
 * xhat = x * rstd, and no dbias (NULL). */
template <typename A>
static __global__ void layernorm_backward_params_kernel(float *dweight, float *dbias,
                                                        const A *dout, const A *inp,
                                                        const float *mean, const float *rstd,
                                                        int N, int C)
{
    __shared__ float pw[TS_LN_GROUPS][32], pb[TS_LN_GROUPS][32];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    float sw = 0.0f, sb = 0.0f;
    if (c < C) {
        for (int n = ty; n < N; n += TS_LN_GROUPS) {
            float d = ts_act_load(dout, (size_t)n * C + c);
            float x = ts_act_load(inp, (size_t)n * C + c);
            float xhat = (mean ? x - mean[n] : x) * rstd[n];
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
        if (dbias) dbias[c] += b;
    }
}

template <typename A>
static void layernorm_forward(void *out, float *mean, float *rstd, const void *inp,
                              const float *weight, const float *bias, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    layernorm_forward_kernel<A><<<ts_cuda_blocks((size_t)N, TS_LN_WARPS), TS_LN_WARPS * 32, 0,
                                  ts_cuda_stream()>>>((A *)out, mean, rstd, (const A *)inp, weight,
                                                      bias, N, C);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void layernorm_backward(void *dinp, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    layernorm_backward_dinp_kernel<A><<<ts_cuda_blocks((size_t)N, TS_LN_WARPS), TS_LN_WARPS * 32,
                                        0, ts_cuda_stream()>>>(
        (A *)dinp, (const A *)dout, (const A *)inp, weight, mean, rstd, N, C);
    TS_CUDA_LAUNCHED();
    dim3 block(32, TS_LN_GROUPS);
    layernorm_backward_params_kernel<A><<<ts_cuda_blocks((size_t)C, 32), block, 0,
                                          ts_cuda_stream()>>>(dweight, dbias, (const A *)dout,
                                                              (const A *)inp, mean, rstd, N, C);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void rmsnorm_forward(void *out, float *rstd, const void *inp, const float *weight, int N,
                            int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    rmsnorm_forward_kernel<A><<<ts_cuda_blocks((size_t)N, TS_LN_WARPS), TS_LN_WARPS * 32, 0,
                                ts_cuda_stream()>>>((A *)out, rstd, (const A *)inp, weight, N, C,
                                                    eps);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void rmsnorm_backward(void *dinp, float *dweight, const void *dout, const void *inp,
                             const float *weight, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0) return;
    rmsnorm_backward_dinp_kernel<A><<<ts_cuda_blocks((size_t)N, TS_LN_WARPS), TS_LN_WARPS * 32, 0,
                                      ts_cuda_stream()>>>((A *)dinp, (const A *)dout,
                                                          (const A *)inp, weight, rstd, N, C);
    TS_CUDA_LAUNCHED();
    dim3 block(32, TS_LN_GROUPS);
    layernorm_backward_params_kernel<A><<<ts_cuda_blocks((size_t)C, 32), block, 0,
                                          ts_cuda_stream()>>>(dweight, (float *)NULL,
                                                              (const A *)dout, (const A *)inp,
                                                              (const float *)NULL, rstd, N, C);
    TS_CUDA_LAUNCHED();
}

#define TS_LAYERNORM_SLOTS(p, A)                                                                \
    extern "C" void p##layernorm_forward(void *out, float *mean, float *rstd, const void *inp,  \
                                         const float *weight, const float *bias, int N, int C)  \
    {                                                                                           \
        layernorm_forward<A>(out, mean, rstd, inp, weight, bias, N, C);                         \
    }                                                                                           \
    extern "C" void p##layernorm_backward(void *dinp, float *dweight, float *dbias,             \
                                          const void *dout, const void *inp,                    \
                                          const float *weight, const float *mean,               \
                                          const float *rstd, int N, int C)                      \
    {                                                                                           \
        layernorm_backward<A>(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);       \
    }                                                                                           \
    extern "C" void p##rmsnorm_forward(void *out, float *rstd, const void *inp,                 \
                                       const float *weight, int N, int C, float eps)            \
    {                                                                                           \
        rmsnorm_forward<A>(out, rstd, inp, weight, N, C, eps);                                  \
    }                                                                                           \
    extern "C" void p##rmsnorm_backward(void *dinp, float *dweight, const void *dout,           \
                                        const void *inp, const float *weight,                   \
                                        const float *rstd, int N, int C)                        \
    {                                                                                           \
        rmsnorm_backward<A>(dinp, dweight, dout, inp, weight, rstd, N, C);                      \
    }

TS_LAYERNORM_SLOTS(ts_cuda_, float)
TS_LAYERNORM_SLOTS(ts_cuda_bf16_, bf16)
#undef TS_LAYERNORM_SLOTS
