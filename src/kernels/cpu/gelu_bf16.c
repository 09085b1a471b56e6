/* GELU (tanh approximation) on bf16 activations: gelu.c's formulas in fp32, over
 * chunks widened onto the stack and rounded back. */
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define TS_GELU_A 0.044715f

void ts_cpu_bf16_gelu_forward(void *out, const void *inp, size_t n)
{
    size_t chunks = (n + TS_BF16_CHUNK - 1) / TS_BF16_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * TS_BF16_CHUNK, m = n - i0 < TS_BF16_CHUNK ? n - i0 : TS_BF16_CHUNK;
        float x[TS_BF16_CHUNK];
        ts_bf16_to_f32_array(x, (const ts_bf16 *)inp + i0, m);
#pragma omp simd
        for (size_t i = 0; i < m; i++) {
            float u = TS_GELU_K * (x[i] + TS_GELU_A * x[i] * x[i] * x[i]);
            x[i] = x[i] / (1.0f + ts_cpu_expf(-2.0f * u));
        }
        ts_f32_to_bf16_array((ts_bf16 *)out + i0, x, m);
    }
}

/* dinp may alias dout: a chunk is read whole before it is written. */
void ts_cpu_bf16_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
    size_t chunks = (n + TS_BF16_CHUNK - 1) / TS_BF16_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * TS_BF16_CHUNK, m = n - i0 < TS_BF16_CHUNK ? n - i0 : TS_BF16_CHUNK;
        float x[TS_BF16_CHUNK], d[TS_BF16_CHUNK];
        ts_bf16_to_f32_array(x, (const ts_bf16 *)inp + i0, m);
        ts_bf16_to_f32_array(d, (const ts_bf16 *)dout + i0, m);
#pragma omp simd
        for (size_t i = 0; i < m; i++) {
            float u = TS_GELU_K * (x[i] + TS_GELU_A * x[i] * x[i] * x[i]);
            float s = 1.0f / (1.0f + ts_cpu_expf(-2.0f * u));
            float du = TS_GELU_K * (1.0f + 3.0f * TS_GELU_A * x[i] * x[i]);
            d[i] = (s + 2.0f * x[i] * s * (1.0f - s) * du) * d[i];
        }
        ts_f32_to_bf16_array((ts_bf16 *)dinp + i0, d, m);
    }
}
