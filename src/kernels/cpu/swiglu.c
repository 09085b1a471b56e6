/* SwiGLU (Shazeer 2020; llama's MLP): out = silu(gate) * up, with each input row
 * holding its F gate columns then its F up columns (the fused gate/up projection's
 * output). silu(x) = x sigmoid(x) = x / (1 + exp(-x)); ts_cpu_expf lets gcc vectorise
 * it, and saturates rather than overflowing for very negative x (silu -> -0). */
#include "kernels/cpu/cpu_internal.h"

void ts_cpu_swiglu_forward(void *out_, const void *inp_, int N, int F)
{
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F;
        float *o = out + (size_t)n * F;
#pragma omp simd
        for (int f = 0; f < F; f++) o[f] = g[f] / (1.0f + ts_cpu_expf(-g[f])) * u[f];
    }
}

/* With s = sigmoid(g): silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)), so
 *   dgate = dout * up * s (1 + g (1 - s)),  dup = dout * g s. */
void ts_cpu_swiglu_backward(void *dinp_, const void *inp_, const void *dout_, int N, int F)
{
    float *dinp = dinp_;
    const float *inp = inp_;
    const float *dout = dout_;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = inp + (size_t)n * 2 * F, *u = g + F;
        const float *d = dout + (size_t)n * F;
        float *dg = dinp + (size_t)n * 2 * F, *du = dg + F;
#pragma omp simd
        for (int f = 0; f < F; f++) {
            float s = 1.0f / (1.0f + ts_cpu_expf(-g[f]));
            dg[f] = d[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
            du[f] = d[f] * g[f] * s;
        }
    }
}
