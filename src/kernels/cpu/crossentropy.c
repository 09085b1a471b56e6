/* Fused softmax + cross-entropy, in place over the logits, for both storage types
 * (storage.h): an fp32 row is worked on in place; a bf16 row is widened into a
 * per-thread fp32 buffer, the same arithmetic runs on it (fp32 exponentials, chunk sums
 * added in double), and dlogits are rounded once back into the row. Losses are fp32. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_XENT_CHUNK 512

static void crossentropy_forward_backward(ts_dtype t, float *losses, void *logits,
                                          const int *targets, int N, int V, float dloss)
{
#pragma omp parallel
    {
        float *buf = ts_cpu_buffer(t, (size_t)V);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++) {
            const size_t r = (size_t)n * V;
            int target = targets[n];
            TS_ASSERT(target >= 0 && target < V);
            float *x = ts_cpu_load_out(t, buf, logits, r, (size_t)V);
            float mx = ts_cpu_max(x, V);
            float xt = x[target];
            /* Overwrite the row with exp(x - max) while summing: float partial sums over
             * chunks (gcc vectorises a float reduction, not a mixed float/double one),
             * each chunk's sum added in double. */
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
            /* dlogits = (softmax - onehot) * dloss, in fp32 before any rounding. */
            float s = (float)(dloss / sum);
#pragma omp simd
            for (int i = 0; i < V; i++) x[i] *= s;
            x[target] -= dloss;
            ts_cpu_store(t, logits, r, x, (size_t)V);
        }
        free(buf);
    }
}

void ts_cpu_crossentropy_forward_backward(float *losses, void *logits, const int *targets,
                                          int N, int V, float dloss)
{
    crossentropy_forward_backward(TS_DTYPE_F32, losses, logits, targets, N, V, dloss);
}

void ts_cpu_bf16_crossentropy_forward_backward(float *losses, void *logits, const int *targets,
                                               int N, int V, float dloss)
{
    crossentropy_forward_backward(TS_DTYPE_BF16, losses, logits, targets, N, V, dloss);
}
