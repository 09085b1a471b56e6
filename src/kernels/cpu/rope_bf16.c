/* Rotary position embeddings on bf16 activations: rope.c's rotation in fp32 on the q
 * and k heads of a row (contiguous at its start), widened into a per-thread buffer and
 * rounded back once. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* sign: +1 rotates (forward), -1 rotates back (backward: the transpose). */
static void rope_rows_bf16(void *qkv, const float *cos, const float *sin, int B, int T, int NH,
                           int NKV, int HS, float sign)
{
    TS_ASSERT(HS % 2 == 0);
    const int half = HS / 2, heads = NH + NKV;
    const size_t row = (size_t)(NH + 2 * NKV) * HS, rotated = (size_t)heads * HS;
#pragma omp parallel
    {
        float *x = ts_alloc_floats(rotated);
#pragma omp for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            ts_bf16 *r = (ts_bf16 *)qkv + (size_t)bt * row;
            const float *c = cos + (size_t)(bt % T) * half;
            const float *s = sin + (size_t)(bt % T) * half;
            ts_bf16_to_f32_array(x, r, rotated);
            for (int h = 0; h < heads; h++) {
                float *x0 = x + (size_t)h * HS, *x1 = x0 + half;
#pragma omp simd
                for (int i = 0; i < half; i++) {
                    float a = x0[i], b = x1[i], si = sign * s[i];
                    x0[i] = a * c[i] - b * si;
                    x1[i] = b * c[i] + a * si;
                }
            }
            ts_f32_to_bf16_array(r, x, rotated);
        }
        free(x);
    }
}

void ts_cpu_bf16_rope_forward(void *qkv, const float *cos, const float *sin, int B, int T, int NH,
                              int NKV, int HS)
{
    rope_rows_bf16(qkv, cos, sin, B, T, NH, NKV, HS, 1.0f);
}

void ts_cpu_bf16_rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T,
                               int NH, int NKV, int HS)
{
    rope_rows_bf16(dqkv, cos, sin, B, T, NH, NKV, HS, -1.0f);
}
