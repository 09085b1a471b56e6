/* Fused softmax + cross-entropy on bf16 logits, in place: each row is widened into a
 * per-thread fp32 buffer, crossentropy.c's arithmetic runs on it (fp32 exponentials,
 * chunk sums added in double), the loss is stored in fp32 and dlogits rounded once back
 * into the row. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_XENT_CHUNK 512

void ts_cpu_bf16_crossentropy_forward_backward(float *losses, void *logits, const int *targets,
                                               int N, int V, float dloss)
{
#pragma omp parallel
    {
        float *x = ts_alloc_floats((size_t)V);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            ts_bf16 *row = (ts_bf16 *)logits + (size_t)n * V;
            int target = targets[n];
            TS_ASSERT(target >= 0 && target < V);
            ts_bf16_to_f32_array(x, row, (size_t)V);
            float mx = ts_cpu_max(x, V);
            float xt = x[target];
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
            /* dlogits = (softmax - onehot) * dloss, in fp32 before the rounding. */
            float s = (float)(dloss / sum);
#pragma omp simd
            for (int i = 0; i < V; i++) x[i] *= s;
            x[target] -= dloss;
            ts_f32_to_bf16_array(row, x, (size_t)V);
        }
        free(x);
    }
}
