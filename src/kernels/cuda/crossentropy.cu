/* Fused softmax + cross-entropy, in place over the logits [N, V] (no second [N, V]
 * buffer: at GPT-2's vocabulary that buffer would be the largest activation).
 *
 * One block per row: (1) the row max; (2) exp(x - max) written over the row while
 * summing; (3) the row scaled to dlogits = (softmax - onehot) * dloss. Each thread keeps
 * its strided elements' partial sum in float and the block adds the partials in double
 * (the CPU adds float chunk sums in double), in a fixed order (butterfly shuffles
 * within a warp, then the warps' sums in warp order): no atomics, bitwise repeatable.
 * A thread rereads in (3) only the elements it wrote in (2), so the passes need no
 * barrier beyond those inside the reductions. */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_XENT_THREADS 512

static __global__ void crossentropy_kernel(float *losses, float *logits, const int *targets,
                                           int V, float dloss)
{
    int n = blockIdx.x;
    float *x = logits + (size_t)n * V;
    int target = targets[n];
    bool valid = target >= 0 && target < V;
    /* Read the target's logit before any thread overwrites the row (block_max syncs). */
    float xt = threadIdx.x == 0 && valid ? x[target] : 0.0f;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, x[i]);
    mx = block_max(mx);
    float part = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(x[i] - mx);
        x[i] = e;
        part += e;
    }
    double sum = block_sum((double)part); /* >= 1: the max contributes exp(0) */
    if (threadIdx.x == 0)
        /* An id outside [0, V) (the CPU asserts) shows as a NaN loss. */
        losses[n] = valid ? (float)(log(sum) + (double)mx - (double)xt) : NAN;
    float s = (float)(dloss / sum);
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float d = x[i] * s;
        x[i] = i == target ? d - dloss : d;
    }
}

extern "C" void ts_cuda_crossentropy_forward_backward(float *losses, float *logits,
                                                      const int *targets, int N, int V,
                                                      float dloss)
{
    if (N <= 0 || V <= 0) return;
    crossentropy_kernel<<<N, TS_XENT_THREADS, 0, ts_cuda_stream()>>>(losses, logits, targets, V,
                                                                     dloss);
    TS_CUDA_LAUNCHED();
}
