/* Token + position embedding into bf16 activations, and its backward from bf16
 * gradients into the fp32 tables (encoder.c's semantics and order of sums; wpe and
 * dwpe NULL: no position embedding). */
#include <omp.h>

#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

void ts_cpu_bf16_encoder_forward(void *out, const int *tokens, const float *wte, const float *wpe,
                                 int B, int T, int C)
{
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        ts_bf16 *o = (ts_bf16 *)out + (size_t)bt * C;
        const float *e = wte + (size_t)tokens[bt] * C;
        if (!wpe) { /* the token embedding alone, rounded straight from the table */
            ts_f32_to_bf16_array(o, e, (size_t)C);
            continue;
        }
        const float *p = wpe + (size_t)(bt % T) * C;
        float sum[TS_BF16_CHUNK];
        for (int c0 = 0; c0 < C; c0 += TS_BF16_CHUNK) {
            int n = C - c0 < TS_BF16_CHUNK ? C - c0 : TS_BF16_CHUNK;
#pragma omp simd
            for (int c = 0; c < n; c++) sum[c] = e[c0 + c] + p[c0 + c];
            ts_f32_to_bf16_array(o + c0, sum, (size_t)n);
        }
    }
}

/* As encoder.c: each thread owns a range of channels (whole cache lines of the fp32
 * gradients) and walks every row in order, so repeated tokens never race and the sums
 * do not depend on the thread count. */
void ts_cpu_bf16_encoder_backward(float *dwte, float *dwpe, const void *dout, const int *tokens,
                                  int B, int T, int C)
{
#pragma omp parallel
    {
        size_t lines = ((size_t)C + 15) / 16, l0, l1;
        ts_cpu_split(lines, omp_get_num_threads(), omp_get_thread_num(), &l0, &l1);
        size_t c0 = l0 * 16, c1 = l1 * 16 < (size_t)C ? l1 * 16 : (size_t)C;
        float d[TS_BF16_CHUNK];
        for (int bt = 0; bt < B * T; bt++) {
            const ts_bf16 *drow = (const ts_bf16 *)dout + (size_t)bt * C;
            float *we = dwte + (size_t)tokens[bt] * C;
            float *pe = dwpe ? dwpe + (size_t)(bt % T) * C : NULL;
            for (size_t k0 = c0; k0 < c1; k0 += TS_BF16_CHUNK) {
                size_t n = c1 - k0 < TS_BF16_CHUNK ? c1 - k0 : TS_BF16_CHUNK;
                ts_bf16_to_f32_array(d, drow + k0, n);
#pragma omp simd
                for (size_t c = 0; c < n; c++) we[k0 + c] += d[c];
                if (!pe) continue;
#pragma omp simd
                for (size_t c = 0; c < n; c++) pe[k0 + c] += d[c];
            }
        }
    }
}
