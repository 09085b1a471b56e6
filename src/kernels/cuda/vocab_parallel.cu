/* Vocab-parallel cross-entropy: this tensor-parallel rank holds vocabulary columns
 * [v0, v0 + nv) of the logits (the embedding's vocab_embed_* are encoder.cu's). Three
 * passes around the caller's all-reduces (row max and target logit; sum of exp; losses
 * and dlogits in place), each one block per row with the reductions in a fixed order
 * (butterfly shuffles within a warp, then the warps in order; float partial sums per
 * thread added in double, as the CPU adds float chunk sums in double): no atomics,
 * bitwise repeatable. Templates on the activation type (act.cuh): the logits are
 * activations (widened on load, dlogits rounded once on the store), the row statistics
 * and losses fp32. */
#include <math.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_VP_THREADS 512

template <typename A>
static __global__ void xent_vp_stats_kernel(float *rowmax, float *target_logit, const A *logits,
                                            const int *targets, int v0, int nv)
{
    int n = blockIdx.x;
    const A *x = logits + (size_t)n * nv;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) mx = fmaxf(mx, ts_act_load(x, i));
    mx = block_max(mx);
    if (threadIdx.x == 0) {
        int t = targets[n] - v0;
        rowmax[n] = mx;
        target_logit[n] = t >= 0 && t < nv ? ts_act_load(x, t) : 0.0f;
    }
}

template <typename A>
static __global__ void xent_vp_sumexp_kernel(float *sumexp, const A *logits, const float *rowmax,
                                             int nv)
{
    int n = blockIdx.x;
    const A *x = logits + (size_t)n * nv;
    const float mx = rowmax[n];
    float part = 0.0f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) part += expf(ts_act_load(x, i) - mx);
    double sum = block_sum((double)part);
    if (threadIdx.x == 0) sumexp[n] = (float)sum;
}

template <typename A>
static __global__ void xent_vp_finish_kernel(float *losses, A *logits, const int *targets, int v0,
                                             int nv, const float *rowmax, const float *sumexp,
                                             const float *target_logit, float dloss)
{
    int n = blockIdx.x;
    A *x = logits + (size_t)n * nv;
    const float mx = rowmax[n];
    if (threadIdx.x == 0)
        losses[n] = (float)(log((double)sumexp[n]) + (double)mx - (double)target_logit[n]);
    const float s = dloss / sumexp[n];
    int t = targets[n] - v0; /* in range or not, i == t only for this rank's column */
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        float d = expf(ts_act_load(x, i) - mx) * s;
        ts_act_store(x, i, i == t ? d - dloss : d);
    }
}

template <typename A>
static void xent_vp_stats(float *rowmax, float *target_logit, const void *logits,
                          const int *targets, int v0, int nv, int N)
{
    if (N <= 0) return; /* nv = 0 (an empty share) still writes the neutral stats */
    xent_vp_stats_kernel<A><<<N, TS_VP_THREADS, 0, ts_cuda_stream()>>>(
        rowmax, target_logit, (const A *)logits, targets, v0, nv);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax, int N, int nv)
{
    if (N <= 0) return;
    xent_vp_sumexp_kernel<A><<<N, TS_VP_THREADS, 0, ts_cuda_stream()>>>(sumexp, (const A *)logits,
                                                                        rowmax, nv);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void xent_vp_finish(float *losses, void *logits, const int *targets, int v0, int nv,
                           const float *rowmax, const float *sumexp, const float *target_logit,
                           int N, float dloss)
{
    if (N <= 0) return;
    xent_vp_finish_kernel<A><<<N, TS_VP_THREADS, 0, ts_cuda_stream()>>>(
        losses, (A *)logits, targets, v0, nv, rowmax, sumexp, target_logit, dloss);
    TS_CUDA_LAUNCHED();
}

#define TS_XENT_VP_SLOTS(p, A)                                                                  \
    extern "C" void p##xent_vp_stats(float *rowmax, float *target_logit, const void *logits,    \
                                     const int *targets, int v0, int nv, int N)                 \
    {                                                                                           \
        xent_vp_stats<A>(rowmax, target_logit, logits, targets, v0, nv, N);                     \
    }                                                                                           \
    extern "C" void p##xent_vp_sumexp(float *sumexp, const void *logits, const float *rowmax,   \
                                      int N, int nv)                                            \
    {                                                                                           \
        xent_vp_sumexp<A>(sumexp, logits, rowmax, N, nv);                                       \
    }                                                                                           \
    extern "C" void p##xent_vp_finish(float *losses, void *logits, const int *targets, int v0,  \
                                      int nv, const float *rowmax, const float *sumexp,         \
                                      const float *target_logit, int N, float dloss)            \
    {                                                                                           \
        xent_vp_finish<A>(losses, logits, targets, v0, nv, rowmax, sumexp, target_logit, N,     \
                          dloss);                                                               \
    }

TS_XENT_VP_SLOTS(ts_cuda_, float)
TS_XENT_VP_SLOTS(ts_cuda_bf16_, bf16)
#undef TS_XENT_VP_SLOTS
