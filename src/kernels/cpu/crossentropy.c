/* Fused softmax + cross-entropy, in place over the logits. */
#include <math.h>

#include "kernels/cpu/cpu_internal.h"

void ts_cpu_crossentropy_forward_backward(float *losses, float *logits, const int *targets,
                                          int N, int V, float dloss)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        int target = targets[n];
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        float xt = x[target];
        /* Overwrite the row with exp(x - max) while summing (in double). */
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int i = 0; i < V; i++) {
            float e = ts_cpu_expf(x[i] - mx);
            x[i] = e;
            sum += e;
        }
        losses[n] = (float)(log(sum) + (double)mx - (double)xt);
        /* dlogits = (softmax - onehot) * dloss. */
        float s = (float)(dloss / sum);
#pragma omp simd
        for (int i = 0; i < V; i++) x[i] *= s;
        x[target] -= dloss;
    }
}
