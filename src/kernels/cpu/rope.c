/* Rotary position embeddings (RoPE, Su et al. 2021) on the last RD channels of each q
 * and k head (kernels.h rope_forward): in Hugging Face's "rotate half" form channel i <
 * RD/2 of that part pairs with channel i + RD/2; interleaved (DeepSeek's checkpoints),
 * channel 2i pairs with 2i + 1. Pair i at position t is rotated by the angle whose cos
 * and sin are the model's tables at [t, i]. In place on the q and k heads of qkv; the v
 * heads and the first HS - RD channels of each head are not rotated. A rotation's
 * inverse is its transpose, so the backward is the same loop with the sign of sin
 * flipped. One body for both storage types (storage.h): an fp32 row is rotated in
 * place, a bf16 row's q and k heads are widened into a per-thread buffer and rounded
 * back once (the channels not rotated go back unchanged: a bf16 value widens and
 * rounds to itself). */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* The rows (b, t) are independent: one per OpenMP iteration, each rotating its NH + NKV
 * heads (contiguous at the start of the row) by its position's angles. sign: +1 rotates
 * (forward), -1 rotates back (backward). */
static void rope_rows(ts_dtype t, void *qkv, const float *cos, const float *sin, int B, int T,
                      ts_att_heads h, int RD, bool interleaved, float sign)
{
    const int HS = h.HS;
    TS_ASSERT(RD > 0 && RD % 2 == 0 && RD <= HS && h.NH > 0 && h.NKV >= 0);
    const int half = RD / 2, heads = h.NH + h.NKV, nope = HS - RD;
    const size_t row = ts_att_qkv_width(h), rotated = (size_t)heads * HS;
#pragma omp parallel
    {
        float *buf = ts_cpu_buffer(t, rotated);
#pragma omp for schedule(static)
        for (int bt = 0; bt < B * T; bt++) {
            const float *c = cos + (size_t)(bt % T) * half;
            const float *s = sin + (size_t)(bt % T) * half;
            float *x = ts_cpu_load_out(t, buf, qkv, (size_t)bt * row, rotated);
            for (int hd = 0; hd < heads; hd++) {
                float *xr = x + (size_t)hd * HS + nope; /* the rotated part */
                if (interleaved) {
#pragma omp simd
                    for (int i = 0; i < half; i++) {
                        float a = xr[2 * i], b = xr[2 * i + 1], si = sign * s[i];
                        xr[2 * i] = a * c[i] - b * si;
                        xr[2 * i + 1] = b * c[i] + a * si;
                    }
                } else {
                    float *x0 = xr, *x1 = xr + half;
#pragma omp simd
                    for (int i = 0; i < half; i++) {
                        float a = x0[i], b = x1[i], si = sign * s[i];
                        x0[i] = a * c[i] - b * si;
                        x1[i] = b * c[i] + a * si;
                    }
                }
            }
            ts_cpu_store(t, qkv, (size_t)bt * row, x, rotated);
        }
        free(buf);
    }
}

/* x[a]' = x[a] c - x[b] s,  x[b]' = x[b] c + x[a] s. */
void ts_cpu_rope_forward(void *qkv, const float *cos, const float *sin, int B, int T,
                         ts_att_heads h, int RD, bool interleaved)
{
    rope_rows(TS_DTYPE_F32, qkv, cos, sin, B, T, h, RD, interleaved, 1.0f);
}

void ts_cpu_bf16_rope_forward(void *qkv, const float *cos, const float *sin, int B, int T,
                              ts_att_heads h, int RD, bool interleaved)
{
    rope_rows(TS_DTYPE_BF16, qkv, cos, sin, B, T, h, RD, interleaved, 1.0f);
}

/* The transpose: dx[a] = d[a] c + d[b] s,  dx[b] = d[b] c - d[a] s. */
void ts_cpu_rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T,
                          ts_att_heads h, int RD, bool interleaved)
{
    rope_rows(TS_DTYPE_F32, dqkv, cos, sin, B, T, h, RD, interleaved, -1.0f);
}

void ts_cpu_bf16_rope_backward(void *dqkv, const float *cos, const float *sin, int B, int T,
                               ts_att_heads h, int RD, bool interleaved)
{
    rope_rows(TS_DTYPE_BF16, dqkv, cos, sin, B, T, h, RD, interleaved, -1.0f);
}
