/* Rotary position embeddings (RoPE, Su et al. 2021) in Hugging Face's "rotate half"
 * form: channel i < HS/2 of a head pairs with channel i + HS/2, and the pair at
 * position t is rotated by the angle whose cos and sin are the model's tables at
 * [t, i]. In place on the q and k heads of qkv; the v heads are not rotated. A
 * rotation's inverse is its transpose, so the backward is the same loop with the sign
 * of sin flipped. One body for both storage types (storage.h): an fp32 row is rotated
 * in place, a bf16 row's q and k heads are widened into a per-thread buffer and
 * rounded back once. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* The rows (b, t) are independent: one per OpenMP iteration, each rotating its NH + NKV
 * heads (contiguous at the start of the row) by its position's angles. sign: +1 rotates
 * (forward), -1 rotates back (backward). */
static void rope_rows(ts_dtype t, void *qkv, const float *cos, const float *sin, int B, int T,
                      int NH, int NKV, int HS, float sign)
{
    TS_ASSERT(HS % 2 == 0);
    const int half = HS / 2, heads = NH + NKV;
    const size_t row = (size_t)(NH + 2 * NKV) * HS, rotated = (size_t)heads * HS;
#pragma omp parallel
    {
        float *buf = ts_cpu_buffer(t, rotated);
#pragma omp for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            const float *c = cos + (size_t)(bt % T) * half;
            const float *s = sin + (size_t)(bt % T) * half;
            float *x = ts_cpu_load_out(t, buf, qkv, (size_t)bt * row, rotated);
            for (int h = 0; h < heads; h++) {
                float *x0 = x + (size_t)h * HS, *x1 = x0 + half;
#pragma omp simd
                for (int i = 0; i < half; i++) {
                    float a = x0[i], b = x1[i], si = sign * s[i];
                    x0[i] = a * c[i] - b * si;
                    x1[i] = b * c[i] + a * si;
                }
            }
            ts_cpu_store(t, qkv, (size_t)bt * row, x, rotated);
        }
        free(buf);
    }
}

/* x[i]' = x[i] c - x[i+HS/2] s,  x[i+HS/2]' = x[i+HS/2] c + x[i] s. */
void ts_cpu_rope_forward(void *qkv, const float *cos, const float *sin, int B, int T, int NH,
                         int NKV, int HS)
{
    rope_rows(TS_DTYPE_F32, qkv, cos, sin, B, T, NH, NKV, HS, 1.0f);
}

void ts_cpu_bf16_rope_forward(void *qkv, const float *cos, const float *sin, int B, int T, int NH,
                              int NKV, int HS)
{
    rope_rows(TS_DTYPE_BF16, qkv, cos, sin, B, T, NH, NKV, HS, 1.0f);
}

/* The transpose: dx[i] = d[i] c + d[i+HS/2] s,  dx[i+HS/2] = d[i+HS/2] c - d[i] s. */
void ts_cpu_rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T, int NH,
                          int NKV, int HS)
{
    rope_rows(TS_DTYPE_F32, dqkv, cos, sin, B, T, NH, NKV, HS, -1.0f);
}

void ts_cpu_bf16_rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T,
                               int NH, int NKV, int HS)
{
    rope_rows(TS_DTYPE_BF16, dqkv, cos, sin, B, T, NH, NKV, HS, -1.0f);
}
