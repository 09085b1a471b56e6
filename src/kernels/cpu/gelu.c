/* GELU, tanh approximation (GPT-2's "gelu_new"):
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
 * Using 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)) gives a form with no
 * cancellation for negative x and one exp, which ts_cpu_expf lets gcc vectorise.
 * One body per direction for both storage types (storage.h), over chunks of
 * TS_BF16_CHUNK elements; the output may alias an input: a chunk is read whole before
 * it is written. */
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define TS_GELU_A 0.044715f

static void gelu_forward(ts_dtype t, void *out, const void *inp, size_t n)
{
    size_t chunks = (n + TS_BF16_CHUNK - 1) / TS_BF16_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * TS_BF16_CHUNK, m = n - i0 < TS_BF16_CHUNK ? n - i0 : TS_BF16_CHUNK;
        float xb[TS_BF16_CHUNK];
        const float *x = ts_cpu_load(t, xb, inp, i0, m);
        float *y = ts_cpu_out(t, xb, out, i0);
#pragma omp simd
        for (size_t i = 0; i < m; i++) {
            float u = TS_GELU_K * (x[i] + TS_GELU_A * x[i] * x[i] * x[i]);
            y[i] = x[i] / (1.0f + ts_cpu_expf(-2.0f * u));
        }
        ts_cpu_store(t, out, i0, y, m);
    }
}

/* gelu'(x) = s + 2 x s (1 - s) u'(x),  s = sigmoid(2u),  u' = sqrt(2/pi) (1 + 3a x^2)
 * (since sech^2(u) = 4 s (1 - s)). */
static void gelu_backward(ts_dtype t, void *dinp, const void *inp, const void *dout, size_t n)
{
    size_t chunks = (n + TS_BF16_CHUNK - 1) / TS_BF16_CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t i0 = k * TS_BF16_CHUNK, m = n - i0 < TS_BF16_CHUNK ? n - i0 : TS_BF16_CHUNK;
        float xb[TS_BF16_CHUNK], db[TS_BF16_CHUNK];
        const float *x = ts_cpu_load(t, xb, inp, i0, m);
        const float *d = ts_cpu_load(t, db, dout, i0, m);
        float *y = ts_cpu_out(t, db, dinp, i0);
#pragma omp simd
        for (size_t i = 0; i < m; i++) {
            float u = TS_GELU_K * (x[i] + TS_GELU_A * x[i] * x[i] * x[i]);
            float s = 1.0f / (1.0f + ts_cpu_expf(-2.0f * u));
            float du = TS_GELU_K * (1.0f + 3.0f * TS_GELU_A * x[i] * x[i]);
            y[i] = (s + 2.0f * x[i] * s * (1.0f - s) * du) * d[i];
        }
        ts_cpu_store(t, dinp, i0, y, m);
    }
}

void ts_cpu_gelu_forward(void *out, const void *inp, size_t n)
{
    gelu_forward(TS_DTYPE_F32, out, inp, n);
}

void ts_cpu_bf16_gelu_forward(void *out, const void *inp, size_t n)
{
    gelu_forward(TS_DTYPE_BF16, out, inp, n);
}

void ts_cpu_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
    gelu_backward(TS_DTYPE_F32, dinp, inp, dout, n);
}

void ts_cpu_bf16_gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
    gelu_backward(TS_DTYPE_BF16, dinp, inp, dout, n);
}
