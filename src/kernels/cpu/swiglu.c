/* SwiGLU (Shazeer 2020; llama's MLP): out = silu(gate) * up, with each input row
 * holding its F gate columns then its F up columns (the fused gate/up projection's
 * output). silu(x) = x sigmoid(x) = x / (1 + exp(-x)); ts_cpu_expf lets gcc vectorise
 * it, and saturates rather than overflowing for very negative x (silu -> -0). One body
 * per direction for both storage types (storage.h): fp32 rows in place, bf16 ones in
 * chunks widened onto the stack and rounded back. */
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

static void swiglu_forward(ts_dtype t, void *out, const void *inp, int N, int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t gr = (size_t)n * 2 * F, ur = gr + F, orow = (size_t)n * F;
        float gb[TS_BF16_CHUNK], ub[TS_BF16_CHUNK];
        for (int f0 = 0, m; f0 < F; f0 += m) {
            m = (int)ts_cpu_chunk(t, (size_t)(F - f0));
            const float *g = ts_cpu_load(t, gb, inp, gr + f0, (size_t)m);
            const float *u = ts_cpu_load(t, ub, inp, ur + f0, (size_t)m);
            float *o = ts_cpu_out(t, gb, out, orow + f0);
#pragma omp simd
            for (int f = 0; f < m; f++) o[f] = g[f] / (1.0f + ts_cpu_expf(-g[f])) * u[f];
            ts_cpu_store(t, out, orow + f0, o, (size_t)m);
        }
    }
}

/* With s = sigmoid(g): silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)), so
 *   dgate = dout * up * s (1 + g (1 - s)),  dup = dout * g s. */
static void swiglu_backward(ts_dtype t, void *dinp, const void *inp, const void *dout, int N,
                            int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const size_t gr = (size_t)n * 2 * F, ur = gr + F, drow = (size_t)n * F;
        float gb[TS_BF16_CHUNK], ub[TS_BF16_CHUNK], db[TS_BF16_CHUNK];
        for (int f0 = 0, m; f0 < F; f0 += m) {
            m = (int)ts_cpu_chunk(t, (size_t)(F - f0));
            const float *g = ts_cpu_load(t, gb, inp, gr + f0, (size_t)m);
            const float *u = ts_cpu_load(t, ub, inp, ur + f0, (size_t)m);
            const float *d = ts_cpu_load(t, db, dout, drow + f0, (size_t)m);
            /* bf16: dgate and dup in the gate and up buffers, each element read above */
            float *dg = ts_cpu_out(t, gb, dinp, gr + f0), *du = ts_cpu_out(t, ub, dinp, ur + f0);
#pragma omp simd
            for (int f = 0; f < m; f++) {
                float s = 1.0f / (1.0f + ts_cpu_expf(-g[f]));
                float dgf = d[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
                du[f] = d[f] * g[f] * s;
                dg[f] = dgf;
            }
            ts_cpu_store(t, dinp, gr + f0, dg, (size_t)m);
            ts_cpu_store(t, dinp, ur + f0, du, (size_t)m);
        }
    }
}

void ts_cpu_swiglu_forward(void *out, const void *inp, int N, int F)
{
    swiglu_forward(TS_DTYPE_F32, out, inp, N, F);
}

void ts_cpu_bf16_swiglu_forward(void *out, const void *inp, int N, int F)
{
    swiglu_forward(TS_DTYPE_BF16, out, inp, N, F);
}

void ts_cpu_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F)
{
    swiglu_backward(TS_DTYPE_F32, dinp, inp, dout, N, F);
}

void ts_cpu_bf16_swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F)
{
    swiglu_backward(TS_DTYPE_BF16, dinp, inp, dout, N, F);
}
