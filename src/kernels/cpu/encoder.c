/* Token + position embedding (wpe NULL: token embedding only, llama's rotary
 * positions are applied to q and k instead). V is not passed, so token ids cannot be
 * range-checked here: callers must pass ids in [0, V). */
#include <omp.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

void ts_cpu_encoder_forward(void *out_, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C)
{
    float *out = out_;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        float *o = out + (size_t)bt * C;
        const float *e = wte + (size_t)tokens[bt] * C;
        if (!wpe) {
            memcpy(o, e, (size_t)C * sizeof(float));
            continue;
        }
        const float *p = wpe + (size_t)(bt % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

/* A token can repeat within the batch, so rows of dwte cannot be split among threads.
 * Each thread owns a range of channels instead and walks all rows in order: no races,
 * and every element is summed in the same order whatever the thread count. */
void ts_cpu_encoder_backward(float *dwte, float *dwpe, const void *dout_, const int *tokens,
                             int B, int T, int C)
{
    const float *dout = dout_;
#pragma omp parallel
    {
        /* Channel ranges rounded to 16 floats (one cache line) to avoid false sharing. */
        size_t lines = ((size_t)C + 15) / 16, l0, l1;
        ts_cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &l0, &l1);
        size_t c0 = l0 * 16, c1 = l1 * 16 < (size_t)C ? l1 * 16 : (size_t)C;
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *we = dwte + (size_t)tokens[b * T + t] * C;
#pragma omp simd
                for (size_t c = c0; c < c1; c++) we[c] += d[c];
                if (!dwpe) continue;
                float *pe = dwpe + (size_t)t * C;
#pragma omp simd
                for (size_t c = c0; c < c1; c++) pe[c] += d[c];
            }
        }
    }
}
