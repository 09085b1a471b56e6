/* One LayerNorm row on one warp, the arithmetic of layernorm.cu's forward and of
 * fused.cu's residual + LayerNorm: one function, so the fused kernel gives exactly the
 * unfused kernels' bits (the CPU backend's fused slot promises the same). A template on
 * the activation type (act.cuh): x is read and o written in it, the statistics and the
 * arithmetic are fp32. */
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

#endif
