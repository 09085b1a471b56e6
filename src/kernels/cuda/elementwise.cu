/* Elementwise kernels: GELU (forward and backward) and the residual add. One thread per
 * element (grid-stride, so any n fits the grid), with the CPU backend's formulas:
 *   gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3),
 * the sigmoid form having no cancellation for negative x. Templates on the activation
 * type (act.cuh): inputs widened to fp32, the formula in fp32, one rounding on the store.
 * Every element depends only on its own inputs, so aliasing (dinp == dout, out == a or
 * b) is safe: each thread reads its element before writing it. */
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"

#define TS_EW_THREADS 256
#define TS_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define TS_GELU_A 0.044715f

template <typename A>
static __global__ void gelu_forward_kernel(A *out, const A *inp, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = ts_act_load(inp, i);
        float u = TS_GELU_K * (x + TS_GELU_A * x * x * x);
        ts_act_store(out, i, x / (1.0f + expf(-2.0f * u)));
    }
}

/* gelu'(x) = s + 2 x s (1 - s) u'(x),  s = sigmoid(2u),  u' = sqrt(2/pi) (1 + 3a x^2). */
template <typename A>
static __global__ void gelu_backward_kernel(A *dinp, const A *inp, const A *dout, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = ts_act_load(inp, i);
        float u = TS_GELU_K * (x + TS_GELU_A * x * x * x);
        float s = 1.0f / (1.0f + expf(-2.0f * u));
        float du = TS_GELU_K * (1.0f + 3.0f * TS_GELU_A * x * x);
        ts_act_store(dinp, i, (s + 2.0f * x * s * (1.0f - s) * du) * ts_act_load(dout, i));
    }
}

template <typename A>
static __global__ void residual_forward_kernel(A *out, const A *a, const A *b, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        ts_act_store(out, i, ts_act_load(a, i) + ts_act_load(b, i));
}

template <typename A> static void gelu_forward(void *out, const void *inp, size_t n)
{
    if (n == 0) return;
    gelu_forward_kernel<A><<<ts_cuda_blocks(n, TS_EW_THREADS), TS_EW_THREADS, 0,
                             ts_cuda_stream()>>>((A *)out, (const A *)inp, n);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)
{
    if (n == 0) return;
    gelu_backward_kernel<A><<<ts_cuda_blocks(n, TS_EW_THREADS), TS_EW_THREADS, 0,
                              ts_cuda_stream()>>>((A *)dinp, (const A *)inp, (const A *)dout, n);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void residual_forward(void *out, const void *a, const void *b, size_t n)
{
    if (n == 0) return;
    residual_forward_kernel<A><<<ts_cuda_blocks(n, TS_EW_THREADS), TS_EW_THREADS, 0,
                                 ts_cuda_stream()>>>((A *)out, (const A *)a, (const A *)b, n);
    TS_CUDA_LAUNCHED();
}

#define TS_ELEMENTWISE_SLOTS(p, A)                                                              \
    extern "C" void p##gelu_forward(void *out, const void *inp, size_t n)                      \
    {                                                                                           \
        gelu_forward<A>(out, inp, n);                                                           \
    }                                                                                           \
    extern "C" void p##gelu_backward(void *dinp, const void *inp, const void *dout, size_t n)  \
    {                                                                                           \
        gelu_backward<A>(dinp, inp, dout, n);                                                   \
    }                                                                                           \
    extern "C" void p##residual_forward(void *out, const void *a, const void *b, size_t n)     \
    {                                                                                           \
        residual_forward<A>(out, a, b, n);                                                      \
    }

TS_ELEMENTWISE_SLOTS(ts_cuda_, float)
TS_ELEMENTWISE_SLOTS(ts_cuda_bf16_, bf16)
#undef TS_ELEMENTWISE_SLOTS
