/* Token + position embedding on the device, for the whole vocabulary (encoder_*) and
 * for one tensor-parallel rank's rows [v0, v0 + nv) (vocab_embed_*): one set of kernels,
 * templates on the activation type (act.cuh). The tables (wte, wpe) and their gradients
 * are fp32 in every precision; `out` and `dout` are activations.
 *
 * Forward: one thread per output element (a plain gather), wte + wpe added in fp32 and
 * rounded once to the activation type (wpe NULL: wte alone; the backward's dwpe NULL: no
 * position gradient).
 *
 * Backward: dwte[tokens[bt], :] += dout[bt, :] is a scatter-add in which a token can
 * repeat, so a thread per position would race; atomicAdd would not race but adds in
 * an order that changes from run to run (float addition is not associative), and the
 * trainer promises bitwise-repeatable steps. Instead every element of dwte is owned by
 * exactly one thread, which walks the positions in order (the CPU backend's order, so
 * each element is the same sequence of float additions as on the CPU):
 * thread (c, slice) owns channel c of the vocabulary rows r with r % TS_ENC_SLICES ==
 * slice. All threads read every token id (cheap: warp-uniform, cached) but each reads
 * dout and updates dwte only for its own rows, so the slices multiply the parallelism
 * of a thread-per-channel loop by TS_ENC_SLICES without changing any sum's order.
 * dwpe[t, c] += sum_b dout[b, t, c] has no collisions: one thread per (t, c) loops over
 * b in order. A bf16 dout is widened exactly, so the sums are fp32 sums of its values. */
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/cuda_internal.h"

#define TS_ENC_THREADS 256
/* Vocabulary slices: more threads for the scatter (each thread still reads all B*T
 * token ids, so more slices stop paying off once the ids dominate). */
#define TS_ENC_SLICES 32
/* nv for "every id": rows are tokens[bt] - 0, all in range for valid ids. */
#define TS_ENC_ALL_ROWS 0x7fffffff

template <typename A>
static __global__ void embed_forward_kernel(A *out, const int *tokens, const float *wte,
                                            const float *wpe, int v0, int nv, int BT, int T,
                                            int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)BT * C) return;
    int bt = (int)(i / C), c = (int)(i % C);
    int row = tokens[bt] - v0;
    float w = row >= 0 && row < nv ? wte[(size_t)row * C + c] : 0.0f;
    /* wpe NULL: no position embedding (llama), w itself (not w + 0, which turns -0 to +0) */
    ts_act_store(out, i, wpe ? w + wpe[(size_t)(bt % T) * C + c] : w);
}

template <typename A>
static __global__ void wte_backward_kernel(float *dwte, const A *dout, const int *tokens, int v0,
                                           int nv, int BT, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int slice = blockIdx.y;
    if (c >= C) return;
    for (int bt = 0; bt < BT; bt++) {
        int row = tokens[bt] - v0;
        if (row < 0 || row >= nv || row % TS_ENC_SLICES != slice) continue;
        dwte[(size_t)row * C + c] += ts_act_load(dout, (size_t)bt * C + c);
    }
}

template <typename A>
static __global__ void wpe_backward_kernel(float *dwpe, const A *dout, int B, int T, int C)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float s = dwpe[i];
    for (int b = 0; b < B; b++) s += ts_act_load(dout, (size_t)b * T * C + i);
    dwpe[i] = s;
}

template <typename A>
static void embed_forward(void *out, const int *tokens, const float *wte, const float *wpe, int v0,
                          int nv, int B, int T, int C)
{
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    embed_forward_kernel<A><<<ts_cuda_blocks(n, TS_ENC_THREADS), TS_ENC_THREADS, 0,
                              ts_cuda_stream()>>>((A *)out, tokens, wte, wpe, v0, nv, B * T, T, C);
    TS_CUDA_LAUNCHED();
}

template <typename A>
static void embed_backward(float *dwte, float *dwpe, const void *dout_, const int *tokens, int v0,
                           int nv, int B, int T, int C)
{
    if ((size_t)B * T * C == 0) return;
    const A *dout = (const A *)dout_;
    if (dwte && nv > 0) {
        dim3 grid(ts_cuda_blocks((size_t)C, TS_ENC_THREADS), TS_ENC_SLICES);
        wte_backward_kernel<A><<<grid, TS_ENC_THREADS, 0, ts_cuda_stream()>>>(dwte, dout, tokens,
                                                                              v0, nv, B * T, C);
        TS_CUDA_LAUNCHED();
    }
    if (dwpe) {
        wpe_backward_kernel<A><<<ts_cuda_blocks((size_t)T * C, TS_ENC_THREADS), TS_ENC_THREADS, 0,
                                 ts_cuda_stream()>>>(dwpe, dout, B, T, C);
        TS_CUDA_LAUNCHED();
    }
}

/* The slots of one precision (p: the name prefix, A: the activation type):
 * encoder_* over every row (v0 = 0), vocab_embed_* over this rank's rows. */
#define TS_EMBED_SLOTS(p, A)                                                                    \
    extern "C" void p##encoder_forward(void *out, const int *tokens, const float *wte,          \
                                       const float *wpe, int B, int T, int C)                   \
    {                                                                                           \
        embed_forward<A>(out, tokens, wte, wpe, 0, TS_ENC_ALL_ROWS, B, T, C);                   \
    }                                                                                           \
    extern "C" void p##encoder_backward(float *dwte, float *dwpe, const void *dout,             \
                                        const int *tokens, int B, int T, int C)                 \
    {                                                                                           \
        embed_backward<A>(dwte, dwpe, dout, tokens, 0, TS_ENC_ALL_ROWS, B, T, C);               \
    }                                                                                           \
    extern "C" void p##vocab_embed_forward(void *out, const int *tokens, const float *wte,      \
                                           const float *wpe, int v0, int nv, int B, int T,      \
                                           int C)                                               \
    {                                                                                           \
        embed_forward<A>(out, tokens, wte, wpe, v0, nv, B, T, C);                               \
    }                                                                                           \
    extern "C" void p##vocab_embed_backward(float *dwte, float *dwpe, const void *dout,         \
                                            const int *tokens, int v0, int nv, int B, int T,    \
                                            int C)                                              \
    {                                                                                           \
        embed_backward<A>(dwte, dwpe, dout, tokens, v0, nv, B, T, C);                           \
    }

TS_EMBED_SLOTS(ts_cuda_, float)
TS_EMBED_SLOTS(ts_cuda_bf16_, bf16)
#undef TS_EMBED_SLOTS
