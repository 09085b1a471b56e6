/* GELU, tanh approximation (GPT-2's "gelu_new"):
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
 * Using 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)) gives a form with no
 * cancellation for negative x and one exp, which ts_cpu_expf lets gcc vectorise. */
#include "kernels/cpu/cpu_internal.h"

#define TS_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define TS_GELU_A 0.044715f

void ts_cpu_gelu_forward(void *out_, const void *inp_, size_t n)
{
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = TS_GELU_K * (x + TS_GELU_A * x * x * x);
        out[i] = x / (1.0f + ts_cpu_expf(-2.0f * u));
    }
}

/* gelu'(x) = s + 2 x s (1 - s) u'(x),  s = sigmoid(2u),  u' = sqrt(2/pi) (1 + 3a x^2)
 * (since sech^2(u) = 4 s (1 - s)). */
void ts_cpu_gelu_backward(void *dinp_, const void *inp_, const void *dout_, size_t n)
{
    float *dinp = dinp_;
    const float *inp = inp_;
    const float *dout = dout_;
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = TS_GELU_K * (x + TS_GELU_A * x * x * x);
        float s = 1.0f / (1.0f + ts_cpu_expf(-2.0f * u));
        float du = TS_GELU_K * (1.0f + 3.0f * TS_GELU_A * x * x);
        dinp[i] = (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
}
