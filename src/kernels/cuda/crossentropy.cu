/* Fused softmax + cross-entropy, in place over the logits [N, V] (no second [N, V]
 * buffer: at GPT-2's vocabulary that buffer would be the largest activation).
 *
 * One block per row: (1) the row max; (2) the sum of exp(x - max); (3) the row
 * overwritten with dlogits = (softmax - onehot) * dloss, exp(x - max) computed again
 * from the logit (not stored in pass 2, so in bf16 the only rounding of a dlogit is its
 * store). Each thread keeps its strided elements' partial sum in float and the block
 * adds the partials in double (the CPU adds float chunk sums in double), in a fixed
 * order (butterfly shuffles within a warp, then the warps' sums in warp order): no
 * atomics, bitwise repeatable. A thread writes in (3) only elements it alone reads, and
 * the target's logit is read before the reductions' barriers, so the passes need no
 * barrier of their own. A template on the activation type (act.cuh); losses are fp32. */
#include <math.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_XENT_THREADS 512

template <typename A>
static __global__ void crossentropy_kernel(float *losses, A *logits, const int *targets, int V,
                                           float dloss)
{
    int n = blockIdx.x;
    A *x = logits + (size_t)n * V;
    int target = targets[n];
    bool valid = target >= 0 && target < V;
    /* Read the target's logit before any thread overwrites the row (block_max syncs). */
    float xt = threadIdx.x == 0 && valid ? ts_act_load(x, target) : 0.0f;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, ts_act_load(x, i));
    mx = block_max(mx);
    float part = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) part += expf(ts_act_load(x, i) - mx);
    double sum = block_sum((double)part); /* >= 1: the max contributes exp(0) */
    if (threadIdx.x == 0)
        /* An id outside [0, V) (the CPU asserts) shows as a NaN loss. */
        losses[n] = valid ? (float)(log(sum) + (double)mx - (double)xt) : NAN;
    float s = (float)(dloss / sum);
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float d = expf(ts_act_load(x, i) - mx) * s;
        ts_act_store(x, i, i == target ? d - dloss : d);
    }
}

template <typename A>
static void crossentropy_forward_backward(float *losses, void *logits, const int *targets, int N,
                                          int V, float dloss)
{
    if (N <= 0 || V <= 0) return;
    crossentropy_kernel<A><<<N, TS_XENT_THREADS, 0, ts_cuda_stream()>>>(losses, (A *)logits,
                                                                        targets, V, dloss);
    TS_CUDA_LAUNCHED();
}

extern "C" void ts_cuda_crossentropy_forward_backward(float *losses, void *logits,
                                                      const int *targets, int N, int V,
                                                      float dloss)
{
    crossentropy_forward_backward<float>(losses, logits, targets, N, V, dloss);
}

extern "C" void ts_cuda_bf16_crossentropy_forward_backward(float *losses, void *logits,
                                                           const int *targets, int N, int V,
                                                           float dloss)
{
    crossentropy_forward_backward<bf16>(losses, logits, targets, N, V, dloss);
}
