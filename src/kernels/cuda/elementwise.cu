/* Elementwise kernels: GELU (forward and backward), the residual add, and llama's RoPE
 * and SwiGLU. One thread per element (grid-stride, so any n fits the grid), with the CPU
 * backend's formulas:
 *   gelu(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3),
 * the sigmoid form having no cancellation for negative x;
 *   swiglu(g, u) = silu(g) u,  silu(g) = g sigmoid(g);
 * RoPE: one thread per rotated pair (channels i and i + HS/2 of one q or k head at one
 * position), reading both before writing either, so in place is safe.
 * Templates on the activation type (act.cuh): inputs widened to fp32, the formula in
 * fp32, one rounding on the store. Every element depends only on its own inputs, so
 * aliasing (dinp == dout, out == a or b) is safe: each thread reads its element before
 * writing it. */
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

/* The pairs RoPE rotates: (position bt of B*T, head of the NH q and NKV k heads, pair
 * i < RD/2 of the head's last RD channels, which start at channel nope = HS - RD); the q
 * and k heads are the first NH + NKV heads of each qkv row (stride row), so one index
 * covers both. Pair i is channels (nope + i, nope + i + RD/2), or (nope + 2i, nope + 2i +
 * 1) when interleaved. BACKWARD: the inverse rotation (the transpose: sin negated). */
template <typename A, bool BACKWARD>
static __global__ void rope_kernel(A *x, const float *cosb, const float *sinb, size_t n, int T,
                                   int heads, int HS, int half, int nope, bool interleaved,
                                   size_t row)
{
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        size_t rest = idx / half;
        int head = (int)(rest % heads);
        size_t bt = rest / heads;
        int t = (int)(bt % T);
        size_t at = bt * row + (size_t)head * HS + nope + (interleaved ? 2 * i : i);
        size_t at2 = at + (interleaved ? 1 : half);
        float c = cosb[(size_t)t * half + i], s = sinb[(size_t)t * half + i];
        float x1 = ts_act_load(x, at), x2 = ts_act_load(x, at2);
        if (!BACKWARD) {
            ts_act_store(x, at, x1 * c - x2 * s);
            ts_act_store(x, at2, x2 * c + x1 * s);
        } else {
            ts_act_store(x, at, x1 * c + x2 * s);
            ts_act_store(x, at2, x2 * c - x1 * s);
        }
    }
}

/* sigmoid(g), the one formula both SwiGLU kernels use. */
static __device__ __forceinline__ float ts_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

/* out[r, f] = silu(inp[r, f]) * inp[r, F + f], element idx = r F + f. */
template <typename A>
static __global__ void swiglu_forward_kernel(A *out, const A *inp, size_t n, int F)
{
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t r = idx / F, at = idx + r * F; /* r * 2F + f */
        float g = ts_act_load(inp, at), u = ts_act_load(inp, at + F);
        ts_act_store(out, idx, g * ts_sigmoid(g) * u);
    }
}

/* d gate = dout u silu'(g), silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g);
 * d up = dout silu(g). */
template <typename A>
static __global__ void swiglu_backward_kernel(A *dinp, const A *inp, const A *dout, size_t n,
                                              int F)
{
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t r = idx / F, at = idx + r * F;
        float g = ts_act_load(inp, at), u = ts_act_load(inp, at + F), d = ts_act_load(dout, idx);
        float s = ts_sigmoid(g);
        ts_act_store(dinp, at, d * u * (s * (1.0f + g * (1.0f - s))));
        ts_act_store(dinp, at + F, d * (g * s));
    }
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

template <typename A, bool BACKWARD>
static void rope(void *qkv, const float *cosb, const float *sinb, int B, int T, ts_att_heads h,
                 int RD, bool interleaved)
{
    if (RD < 2 || RD % 2 != 0 || RD > h.HS)
        ts_cuda_fail(__FILE__, __LINE__, "rope",
                     "the rotated channels RD must be even and within the q/k head size");
    if (B <= 0 || T <= 0 || h.NH + h.NKV <= 0) return;
    const int half = RD / 2, heads = h.NH + h.NKV;
    size_t n = (size_t)B * T * heads * half;
    rope_kernel<A, BACKWARD><<<ts_cuda_blocks(n, TS_EW_THREADS), TS_EW_THREADS, 0,
                               ts_cuda_stream()>>>((A *)qkv, cosb, sinb, n, T, heads, h.HS, half,
                                                   h.HS - RD, interleaved, ts_att_qkv_width(h));
    TS_CUDA_LAUNCHED();
}

template <typename A> static void swiglu_forward(void *out, const void *inp, int N, int F)
{
    if (N <= 0 || F <= 0) return;
    size_t n = (size_t)N * F;
    swiglu_forward_kernel<A><<<ts_cuda_blocks(n, TS_EW_THREADS), TS_EW_THREADS, 0,
                               ts_cuda_stream()>>>((A *)out, (const A *)inp, n, F);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void swiglu_backward(void *dinp, const void *inp, const void *dout, int N, int F)
{
    if (N <= 0 || F <= 0) return;
    size_t n = (size_t)N * F;
    swiglu_backward_kernel<A><<<ts_cuda_blocks(n, TS_EW_THREADS), TS_EW_THREADS, 0,
                                ts_cuda_stream()>>>((A *)dinp, (const A *)inp, (const A *)dout,
                                                    n, F);
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
    }                                                                                           \
    extern "C" void p##rope_forward(void *qkv, const float *cosb, const float *sinb, int B,      \
                                    int T, ts_att_heads h, int RD, bool interleaved)            \
    {                                                                                           \
        rope<A, false>(qkv, cosb, sinb, B, T, h, RD, interleaved);                              \
    }                                                                                           \
    extern "C" void p##rope_backward(void *dqkv, const float *cosb, const float *sinb, int B,   \
                                     int T, ts_att_heads h, int RD, bool interleaved)           \
    {                                                                                           \
        rope<A, true>(dqkv, cosb, sinb, B, T, h, RD, interleaved);                              \
    }                                                                                           \
    extern "C" void p##swiglu_forward(void *out, const void *inp, int N, int F)                \
    {                                                                                           \
        swiglu_forward<A>(out, inp, N, F);                                                      \
    }                                                                                           \
    extern "C" void p##swiglu_backward(void *dinp, const void *inp, const void *dout, int N,   \
                                       int F)                                                   \
    {                                                                                           \
        swiglu_backward<A>(dinp, inp, dout, N, F);                                              \
    }

TS_ELEMENTWISE_SLOTS(ts_cuda_, float)
TS_ELEMENTWISE_SLOTS(ts_cuda_bf16_, bf16)
#undef TS_ELEMENTWISE_SLOTS
