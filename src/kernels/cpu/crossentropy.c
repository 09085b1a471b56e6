/* Fused softmax + cross-entropy, in place over the logits. */
#include <math.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_XENT_CHUNK 512

void ts_cpu_crossentropy_forward_backward(float *losses, void *logits_, const int *targets,
                                          int N, int V, float dloss)
{
    float *logits = logits_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        int target = targets[n];
        TS_ASSERT(target >= 0 && target < V);
        float mx = ts_cpu_max(x, V);
        float xt = x[target];
        /* Overwrite the row with exp(x - max) while summing: float partial sums over
         * chunks (gcc vectorises a float reduction, not a mixed float/double one), each
         * chunk's sum added in double. */
        double sum = 0.0;
        for (int i0 = 0; i0 < V; i0 += TS_XENT_CHUNK) {
            int i1 = i0 + TS_XENT_CHUNK < V ? i0 + TS_XENT_CHUNK : V;
            float part = 0.0f;
#pragma omp simd reduction(+ : part)
            for (int i = i0; i < i1; i++) {
                float e = ts_cpu_expf(x[i] - mx);
                x[i] = e;
                part += e;
            }
            sum += part;
        }
        /* sum >= 1: the max logit contributes exp(0). */
        // cppcheck-suppress invalidFunctionArg
        losses[n] = (float)(log(sum) + (double)mx - (double)xt);
        /* dlogits = (softmax - onehot) * dloss. */
        float s = (float)(dloss / sum);
#pragma omp simd
        for (int i = 0; i < V; i++) x[i] *= s;
        x[target] -= dloss;
    }
}
