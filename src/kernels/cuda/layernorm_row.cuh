/* One LayerNorm or RMSNorm row on one warp, the arithmetic of layernorm.cu's forwards and
 * of fused.cu's residual + norm: one function per norm, so a fused kernel gives exactly
 * the unfused kernels' bits (the CPU backend's fused slots promise the same). Templates
 * on the activation type (act.cuh): x is read and o written in it, the statistics and
 * the arithmetic are fp32. */
#ifndef TS_KERNELS_CUDA_LAYERNORM_ROW_CUH
#define TS_KERNELS_CUDA_LAYERNORM_ROW_CUH

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/reduce.cuh"

/* o[0..C) = LayerNorm of row x[0..C) (eps 1e-5, as nn.LayerNorm and the CPU backend),
 * on the warp's 32 lanes; lane 0 stores the row's mean and rstd at *mean, *rstd.
 * `lane_sum` is this lane's sum of x[lane], x[lane + 32], ... (as floats) in that order:
 * the caller forms it, so the fused kernel can sum while it writes x (only the lane's own
 * stores are read back here: lane reads x[c] for c = lane, lane + 32, ...). Two passes,
 * the mean and then the variance of x - mean, which does not cancel like
 * E[x^2] - mean^2. */
template <typename A>
static __device__ __forceinline__ void layernorm_row(A *o, float *mean, float *rstd, const A *x,
                                                     float lane_sum, const float *weight,
                                                     const float *bias, int C, int lane)
{
    float m = warp_sum(lane_sum) / C;
    float v = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = ts_act_load(x, c) - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(warp_sum(v) / C + 1e-5f);
    for (int c = lane; c < C; c += 32)
        ts_act_store(o, c, (ts_act_load(x, c) - m) * rs * weight[c] + bias[c]);
    if (lane == 0) {
        *mean = m;
        *rstd = rs;
    }
}

/* A lane's running sum of squares for rmsnorm_row: s + v*v as one explicit fma, so the
 * unfused and the fused RMSNorm form the same sum whatever the compiler contracts. */
static __device__ __forceinline__ float rms_lane_add(float s, float v)
{
    return __fmaf_rn(v, v, s);
}

/* o[0..C) = RMSNorm of row x[0..C): x * rstd * weight, rstd = 1/sqrt(mean(x^2) + eps), on
 * the warp's 32 lanes; lane 0 stores rstd at *rstd. `lane_sq` is this lane's
 * rms_lane_add sum over x[lane], x[lane + 32], ... (as floats) in that order, formed by
 * the caller as layernorm_row's lane_sum is. */
template <typename A>
static __device__ __forceinline__ void rmsnorm_row(A *o, float *rstd, const A *x, float lane_sq,
                                                   const float *weight, int C, float eps,
                                                   int lane)
{
    float rs = 1.0f / sqrtf(warp_sum(lane_sq) / C + eps);
    for (int c = lane; c < C; c += 32) ts_act_store(o, c, ts_act_load(x, c) * rs * weight[c]);
    if (lane == 0) *rstd = rs;
}

#endif
