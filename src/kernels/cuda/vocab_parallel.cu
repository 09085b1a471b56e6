/* Vocab-parallel embedding and cross-entropy: this tensor-parallel rank holds vocabulary
 * rows [v0, v0 + nv). The embedding is encoder.cu's (tokens outside the range give
 * zeros; deterministic scatter for the backward). The cross-entropy is three passes
 * around the caller's all-reduces (row max and target logit; sum of exp; losses and
 * dlogits in place), each one block per row with the reductions in a fixed order
 * (butterfly shuffles within a warp, then the warps in order; float partial sums per
 * thread added in double, as the CPU adds float chunk sums in double): no atomics,
 * bitwise repeatable. */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_VP_THREADS 512

static __global__ void xent_vp_stats_kernel(float *rowmax, float *target_logit,
                                            const float *logits, const int *targets, int v0,
                                            int nv)
{
    int n = blockIdx.x;
    const float *x = logits + (size_t)n * nv;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_max(mx);
    if (threadIdx.x == 0) {
        int t = targets[n] - v0;
        rowmax[n] = mx;
        target_logit[n] = t >= 0 && t < nv ? x[t] : 0.0f;
    }
}

static __global__ void xent_vp_sumexp_kernel(float *sumexp, const float *logits,
                                             const float *rowmax, int nv)
{
    int n = blockIdx.x;
    const float *x = logits + (size_t)n * nv;
    const float mx = rowmax[n];
    float part = 0.0f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) part += expf(x[i] - mx);
    double sum = block_sum((double)part);
    if (threadIdx.x == 0) sumexp[n] = (float)sum;
}

static __global__ void xent_vp_finish_kernel(float *losses, float *logits, const int *targets,
                                             int v0, int nv, const float *rowmax,
                                             const float *sumexp, const float *target_logit,
                                             float dloss)
{
    int n = blockIdx.x;
    float *x = logits + (size_t)n * nv;
    const float mx = rowmax[n];
    if (threadIdx.x == 0)
        losses[n] = (float)(log((double)sumexp[n]) + (double)mx - (double)target_logit[n]);
    const float s = dloss / sumexp[n];
    int t = targets[n] - v0; /* in range or not, i == t only for this rank's column */
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        float d = expf(x[i] - mx) * s;
        x[i] = i == t ? d - dloss : d;
    }
}

extern "C" void ts_cuda_vocab_embed_forward(float *out, const int *tokens, const float *wte,
                                            const float *wpe, int v0, int nv, int B, int T,
                                            int C)
{
    ts_cuda_embed_forward(out, tokens, wte, wpe, v0, nv, B, T, C);
}

extern "C" void ts_cuda_vocab_embed_backward(float *dwte, float *dwpe, const float *dout,
                                             const int *tokens, int v0, int nv, int B, int T,
                                             int C)
{
    ts_cuda_embed_backward(dwte, dwpe, dout, tokens, v0, nv, B, T, C);
}

extern "C" void ts_cuda_xent_vp_stats(float *rowmax, float *target_logit, const float *logits,
                                      const int *targets, int v0, int nv, int N)
{
    if (N <= 0) return; /* nv = 0 (an empty share) still writes the neutral stats */
    xent_vp_stats_kernel<<<N, TS_VP_THREADS, 0, ts_cuda_stream()>>>(rowmax, target_logit, logits,
                                                                    targets, v0, nv);
    TS_CUDA_LAUNCHED();
}

extern "C" void ts_cuda_xent_vp_sumexp(float *sumexp, const float *logits, const float *rowmax,
                                       int N, int nv)
{
    if (N <= 0) return;
    xent_vp_sumexp_kernel<<<N, TS_VP_THREADS, 0, ts_cuda_stream()>>>(sumexp, logits, rowmax, nv);
    TS_CUDA_LAUNCHED();
}

extern "C" void ts_cuda_xent_vp_finish(float *losses, float *logits, const int *targets, int v0,
                                       int nv, const float *rowmax, const float *sumexp,
                                       const float *target_logit, int N, float dloss)
{
    if (N <= 0) return;
    xent_vp_finish_kernel<<<N, TS_VP_THREADS, 0, ts_cuda_stream()>>>(
        losses, logits, targets, v0, nv, rowmax, sumexp, target_logit, dloss);
    TS_CUDA_LAUNCHED();
}
