/* SwiGLU on bf16 activations: swiglu.c's formulas in fp32, each row's columns in
 * chunks widened onto the stack and rounded back. */
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

void ts_cpu_bf16_swiglu_forward(void *out, const void *inp, int N, int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const ts_bf16 *gate = (const ts_bf16 *)inp + (size_t)n * 2 * F, *up = gate + F;
        ts_bf16 *o = (ts_bf16 *)out + (size_t)n * F;
        float g[TS_BF16_CHUNK], u[TS_BF16_CHUNK];
        for (int f0 = 0; f0 < F; f0 += TS_BF16_CHUNK) {
            int m = F - f0 < TS_BF16_CHUNK ? F - f0 : TS_BF16_CHUNK;
            ts_bf16_to_f32_array(g, gate + f0, (size_t)m);
            ts_bf16_to_f32_array(u, up + f0, (size_t)m);
#pragma omp simd
            for (int f = 0; f < m; f++) g[f] = g[f] / (1.0f + ts_cpu_expf(-g[f])) * u[f];
            ts_f32_to_bf16_array(o + f0, g, (size_t)m);
        }
    }
}

/* dgate = dout * up * s (1 + g (1 - s)),  dup = dout * g s,  s = sigmoid(g). */
void ts_cpu_bf16_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const ts_bf16 *gate = (const ts_bf16 *)inp + (size_t)n * 2 * F, *up = gate + F;
        const ts_bf16 *drow = (const ts_bf16 *)dout + (size_t)n * F;
        ts_bf16 *dgate = (ts_bf16 *)dinp + (size_t)n * 2 * F, *dup = dgate + F;
        float g[TS_BF16_CHUNK], u[TS_BF16_CHUNK], d[TS_BF16_CHUNK];
        for (int f0 = 0; f0 < F; f0 += TS_BF16_CHUNK) {
            int m = F - f0 < TS_BF16_CHUNK ? F - f0 : TS_BF16_CHUNK;
            ts_bf16_to_f32_array(g, gate + f0, (size_t)m);
            ts_bf16_to_f32_array(u, up + f0, (size_t)m);
            ts_bf16_to_f32_array(d, drow + f0, (size_t)m);
#pragma omp simd
            for (int f = 0; f < m; f++) {
                float s = 1.0f / (1.0f + ts_cpu_expf(-g[f]));
                float dg = d[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
                u[f] = d[f] * g[f] * s; /* dup, in the up buffer (read above) */
                g[f] = dg;
            }
            ts_f32_to_bf16_array(dgate + f0, g, (size_t)m);
            ts_f32_to_bf16_array(dup + f0, u, (size_t)m);
        }
    }
}
