/* Causal multi-head attention: the batched-GEMM attention (cuBLAS strided-batched GEMMs
 * for the four products and two warp-per-row kernels for the causal softmax and its
 * backward), in fp32 and with bf16 products, and the choice between it and the
 * flash-style attention (attention_flash.cu) behind the table's attention slots.
 *
 * No permuted copies. A head's q, k, v (and out, dout, dq, dk, dv) are [T, HS] matrices
 * read in place from the [B, T, 3*NH*HS] and [B, T, NH*HS] layouts with leading
 * dimension 3C (or C), one head HS floats from the next and one sequence T*3C (T*C)
 * floats from the next. Those two strides differ, so one strided-batched call cannot
 * cover all B*NH pairs; instead the shorter of the two axes is looped on the host and
 * the other is the batch (B or NH calls per product, each batched over NH or B). So the
 * fp32 saved state is exactly the CPU backend's, the probabilities [B, NH, T, T] (zero
 * above the diagonal), with no [B, NH, T, HS] copies of q, k, v kept per layer, and the
 * backward's workspace is the CPU's too: dS [B, NH, T, T]. The forward needs no
 * workspace (it has no scratch argument).
 *
 * The GEMMs compute the full T x T products (the entries above the diagonal are
 * computed and then masked to exact zeros by the softmax kernels, so they drop out of
 * every later product): twice the causal work, simple, a first version.
 *
 * cuBLAS is column-major: a row-major [r, c] matrix with leading dimension ld is, to
 * cuBLAS, its transpose [c, r] with the same ld, so row-major X = A B is computed as
 * X^T = B^T A^T with the operands swapped. The handle keeps the default math mode (no
 * TF32), so the fp32 products are fp32 like the CPU's.
 *
 * bf16 products: the same calls through cublasGemmStridedBatchedEx with bf16 operands
 * (cast from fp32 by a kernel), fp32 accumulation (CUBLAS_COMPUTE_32F) and fp32 results
 * written in place as above; the softmax, its backward and the probabilities kept for
 * the backward stay fp32. The forward has no workspace, so its bf16 operands (qkv and
 * the probabilities) live in `att` after the fp32 probabilities; the backward reuses
 * them (qkv is unchanged between the two: the slot's contract for `att`).
 *
 * Softmax rows: one warp per row, reductions by butterfly shuffles (a fixed order:
 * deterministic). */
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/gemm_lt.h"
#include "kernels/cuda/reduce.cuh"

#define TS_ATT_WARPS 8 /* rows (warps) per block */

typedef __nv_bfloat16 bf16;

/* Row r (query i = r % T) of the scaled scores, in place: s[0..i] -> probabilities,
 * s[i+1..T) -> 0. With pb, the same row rounded to bf16 there too. */
static __global__ void causal_softmax_kernel(float *att, bf16 *pb, size_t rows, int T)
{
    size_t r = (size_t)blockIdx.x * TS_ATT_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return; /* whole warps leave together */
    float *s = att + r * T;
    int n = (int)(r % T) + 1; /* live entries */
    float mx = -INFINITY;
    for (int j = lane; j < n; j += 32) mx = fmaxf(mx, s[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < n; j += 32) {
        float e = expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < n; j += 32) s[j] *= inv;
    for (int j = n + lane; j < T; j += 32) s[j] = 0.0f;
    if (pb) {
        bf16 *b = pb + r * T;
        /* s[j < n] was written by this lane (same j stride); the zeros are not read back,
         * as another lane wrote them */
        for (int j = lane; j < T; j += 32) b[j] = __float2bfloat16(j < n ? s[j] : 0.0f);
    }
}

/* Row r of the softmax backward, in place over dP: dS[j] = p[j] (dP[j] - sum_j p[j] dP[j])
 * for j <= i, 0 above the diagonal. With dsb, dS rounded to bf16 there too. */
static __global__ void causal_softmax_backward_kernel(float *dp, bf16 *dsb, const float *att,
                                                      size_t rows, int T)
{
    size_t r = (size_t)blockIdx.x * TS_ATT_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    float *d = dp + r * T;
    const float *p = att + r * T;
    int n = (int)(r % T) + 1;
    float dot = 0.0f;
    for (int j = lane; j < n; j += 32) dot += p[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < n; j += 32) d[j] = p[j] * (d[j] - dot);
    for (int j = n + lane; j < T; j += 32) d[j] = 0.0f;
    if (dsb) {
        bf16 *b = dsb + r * T;
        for (int j = lane; j < T; j += 32) b[j] = __float2bfloat16(j < n ? d[j] : 0.0f);
    }
}

/* An operand's place in its buffer: (b, h)'s matrix starts at b * per_b + h * per_h. */
struct operand {
    long long per_b, per_h;
};

/* For every (b, h): C_bh = alpha op(A_bh) op(B_bh) + beta C_bh (cuBLAS's column-major
 * view), as min(B, NH) strided-batched calls of max(B, NH) matrices each. In = float:
 * SGEMM; In = bf16: bf16 operands, fp32 accumulation and fp32 C. Offsets and strides
 * count elements of the operand's own type. */
template <typename In>
static void gemm_bh(cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                    float alpha, const In *A, int lda, operand oa, const In *Bm, int ldb,
                    operand ob, float beta, float *C, int ldc, operand oc, int B, int NH)
{
    bool loop_b = B <= NH;
    int loops = loop_b ? B : NH, batch = loop_b ? NH : B;
    long long sa = loop_b ? oa.per_h : oa.per_b, sb = loop_b ? ob.per_h : ob.per_b,
              sc = loop_b ? oc.per_h : oc.per_b;
    for (int l = 0; l < loops; l++) {
        long long a0 = loop_b ? l * oa.per_b : l * oa.per_h;
        long long b0 = loop_b ? l * ob.per_b : l * ob.per_h;
        long long c0 = loop_b ? l * oc.per_b : l * oc.per_h;
        if constexpr (sizeof(In) == sizeof(float)) {
            TS_CUBLAS_CHECK(cublasSgemmStridedBatched(ts_cuda_cublas(), opa, opb, m, n, k, &alpha,
                                                      A + a0, lda, sa, Bm + b0, ldb, sb, &beta,
                                                      C + c0, ldc, sc, batch));
        } else {
            TS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
                ts_cuda_cublas(), opa, opb, m, n, k, &alpha, A + a0, CUDA_R_16BF, lda, sa, Bm + b0,
                CUDA_R_16BF, ldb, sb, &beta, C + c0, CUDA_R_32F, ldc, sc, batch,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
}

/* The four products and two softmax passes of one attention, in fp32 (In = float) or
 * with bf16 operands. The callers place the operands (attention_{forward,backward}
 * below, per precision). */
struct att_shape {
    int B, T, NH, HS, C, C3;
    float scale;
    operand x3, x1, tt; /* q, k or v in qkv; a head in out/dout; a head's [T, T] */
};

static att_shape shape_of(int B, int T, int NH, int HS)
{
    att_shape s;
    s.B = B, s.T = T, s.NH = NH, s.HS = HS, s.C = NH * HS, s.C3 = 3 * NH * HS;
    s.scale = 1.0f / sqrtf((float)HS);
    s.x3 = {(long long)T * s.C3, HS};
    s.x1 = {(long long)T * s.C, HS};
    s.tt = {(long long)NH * T * T, (long long)T * T};
    return s;
}

/* out = softmax(scale Q K^T, causal) V; att (fp32) gets the probabilities, pb (bf16,
 * NULL for fp32) their rounded copy, which the P V product reads. q, k, v point into
 * qkv (or its bf16 copy) at the first head's columns. */
template <typename In>
static void forward_core(const att_shape &s, float *out, float *att, bf16 *pb, const In *q,
                         const In *k, const In *v, const In *p_for_pv)
{
    /* S = scale Q K^T  (S^T = scale K Q^T) into att */
    gemm_bh<In>(CUBLAS_OP_T, CUBLAS_OP_N, s.T, s.T, s.HS, s.scale, k, s.C3, s.x3, q, s.C3, s.x3,
                0.0f, att, s.T, s.tt, s.B, s.NH);
    size_t rows = (size_t)s.B * s.NH * s.T;
    causal_softmax_kernel<<<ts_cuda_blocks(rows, TS_ATT_WARPS), TS_ATT_WARPS * 32, 0,
                            ts_cuda_stream()>>>(att, pb, rows, s.T);
    TS_CUDA_LAUNCHED();
    /* O = P V  (O^T = V^T P^T) */
    gemm_bh<In>(CUBLAS_OP_N, CUBLAS_OP_N, s.HS, s.T, s.T, 1.0f, v, s.C3, s.x3, p_for_pv, s.T, s.tt,
                0.0f, out, s.C, s.x1, s.B, s.NH);
}

/* With P the probabilities and dO the output gradient of one head:
 *   dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dV = P^T dO,
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * ds (fp32) holds dP, then dS; dsb (bf16, NULL for fp32) dS rounded, which the dQ and dK
 * products read (ds_in). Every element of dqkv is written (beta = 0): overwritten. */
template <typename In>
static void backward_core(const att_shape &s, float *dqkv, float *ds, bf16 *dsb, const In *ds_in,
                          const In *g, const In *q, const In *k, const In *v, const float *p,
                          const In *p_in)
{
    float *dq = dqkv, *dk = dqkv + s.C, *dv = dqkv + 2 * s.C;
    /* dP = dO V^T  (dP^T = V dO^T) */
    gemm_bh<In>(CUBLAS_OP_T, CUBLAS_OP_N, s.T, s.T, s.HS, 1.0f, v, s.C3, s.x3, g, s.C, s.x1, 0.0f,
                ds, s.T, s.tt, s.B, s.NH);
    size_t rows = (size_t)s.B * s.NH * s.T;
    causal_softmax_backward_kernel<<<ts_cuda_blocks(rows, TS_ATT_WARPS), TS_ATT_WARPS * 32, 0,
                                     ts_cuda_stream()>>>(ds, dsb, p, rows, s.T);
    TS_CUDA_LAUNCHED();
    /* dV = P^T dO  (dV^T = dO^T P) */
    gemm_bh<In>(CUBLAS_OP_N, CUBLAS_OP_T, s.HS, s.T, s.T, 1.0f, g, s.C, s.x1, p_in, s.T, s.tt, 0.0f,
                dv, s.C3, s.x3, s.B, s.NH);
    /* dQ = scale dS K  (dQ^T = scale K^T dS^T) */
    gemm_bh<In>(CUBLAS_OP_N, CUBLAS_OP_N, s.HS, s.T, s.T, s.scale, k, s.C3, s.x3, ds_in, s.T, s.tt,
                0.0f, dq, s.C3, s.x3, s.B, s.NH);
    /* dK = scale dS^T Q  (dK^T = scale Q^T dS) */
    gemm_bh<In>(CUBLAS_OP_N, CUBLAS_OP_T, s.HS, s.T, s.T, s.scale, q, s.C3, s.x3, ds_in, s.T, s.tt,
                0.0f, dk, s.C3, s.x3, s.B, s.NH);
}

/* ---- batched-GEMM attention, fp32 */

extern "C" size_t ts_cuda_gemm_attention_saved_floats(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * T; /* the probabilities, as the CPU */
}

extern "C" size_t ts_cuda_gemm_attention_scratch_floats(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * T; /* dP, then dS in place */
}

extern "C" void ts_cuda_gemm_attention_forward(float *out, float *att, const float *qkv, int B,
                                               int T, int NH, int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    const att_shape s = shape_of(B, T, NH, HS);
    forward_core<float>(s, out, att, NULL, qkv, qkv + s.C, qkv + 2 * s.C, att);
}

extern "C" void ts_cuda_gemm_attention_backward(float *dqkv, float *scratch, const float *dout,
                                                const float *qkv, const float *att, int B, int T,
                                                int NH, int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    const att_shape s = shape_of(B, T, NH, HS);
    backward_core<float>(s, dqkv, scratch, NULL, scratch, dout, qkv, qkv + s.C, qkv + 2 * s.C,
                         att, att);
}

/* ---- batched-GEMM attention, bf16 products. Buffers are cut into pieces of whole
 * 64-byte lines (16 floats), so every bf16 piece starts aligned. */

static size_t lines(size_t floats) { return (floats + 15) / 16 * 16; }
static size_t bf16_floats(size_t n) { return lines((n + 1) / 2); } /* n bf16 values */

/* att: [P fp32 | P bf16 | qkv bf16]; scratch: [dP/dS fp32 | dS bf16 | dout bf16]. */
struct bf16_layout {
    size_t tt, p16, x16; /* offsets in floats of the second and third pieces */
    size_t total;
};

/* ntt fp32 values, their bf16 copy, then nx bf16 values. */
static bf16_layout layout_of(size_t ntt, size_t nx)
{
    bf16_layout l;
    l.tt = lines(ntt);
    l.p16 = l.tt;
    l.x16 = l.p16 + bf16_floats(ntt);
    l.total = l.x16 + bf16_floats(nx);
    return l;
}

static bf16_layout saved_layout(int B, int T, int NH, int HS)
{
    return layout_of((size_t)B * NH * T * T, (size_t)B * T * 3 * NH * HS); /* P; qkv */
}

static bf16_layout scratch_layout(int B, int T, int NH, int HS)
{
    return layout_of((size_t)B * NH * T * T, (size_t)B * T * NH * HS); /* dP/dS; dout */
}

extern "C" size_t ts_cuda_gemm_bf16_attention_saved_floats(int B, int T, int NH, int HS)
{
    return saved_layout(B, T, NH, HS).total;
}

extern "C" size_t ts_cuda_gemm_bf16_attention_scratch_floats(int B, int T, int NH, int HS)
{
    return scratch_layout(B, T, NH, HS).total;
}

extern "C" void ts_cuda_gemm_bf16_attention_forward(float *out, float *att, const float *qkv,
                                                    int B, int T, int NH, int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    const att_shape s = shape_of(B, T, NH, HS);
    const bf16_layout l = saved_layout(B, T, NH, HS);
    bf16 *pb = (bf16 *)(att + l.p16), *xb = (bf16 *)(att + l.x16);
    ts_cuda_cast_bf16(xb, qkv, (size_t)B * T * s.C3);
    forward_core<bf16>(s, out, att, pb, xb, xb + s.C, xb + 2 * s.C, pb);
}

extern "C" void ts_cuda_gemm_bf16_attention_backward(float *dqkv, float *scratch,
                                                     const float *dout, const float *qkv,
                                                     const float *att, int B, int T, int NH,
                                                     int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    (void)qkv; /* its bf16 copy, made by the forward, is in att */
    const att_shape s = shape_of(B, T, NH, HS);
    const bf16_layout la = saved_layout(B, T, NH, HS), ls = scratch_layout(B, T, NH, HS);
    const bf16 *pb = (const bf16 *)(att + la.p16), *xb = (const bf16 *)(att + la.x16);
    bf16 *dsb = (bf16 *)(scratch + ls.p16), *gb = (bf16 *)(scratch + ls.x16);
    ts_cuda_cast_bf16(gb, dout, (size_t)B * T * s.C);
    backward_core<bf16>(s, dqkv, scratch, dsb, dsb, gb, xb, xb + s.C, xb + 2 * s.C, att, pb);
}

/* ---- the choice behind the tables' slots.
 *
 * train.attention = "gemm" (the default) or "flash" picks the table (table.cu): its
 * slots below run the batched-GEMM attention of their precision, or the flash kernels.
 * The default is the batched-GEMM attention until a GPU measurement says otherwise: its
 * products run on cuBLAS (tensor cores in bf16) where the flash kernels are plain fp32
 * FMAs, so it should be faster at GPT-2's T = 1024, at the price of B*NH*T*T floats of
 * probabilities kept per layer, which flash avoids. The GPU benchmark runs both.
 * Heads wider than the flash kernels take (TS_CUDA_FLASH_MAX_HS) use the batched-GEMM
 * attention either way; the saved/scratch sizes follow the same choice, as they must. */

static bool use_flash(bool flash, int HS) { return flash && HS <= TS_CUDA_FLASH_MAX_HS; }

/* The batched-GEMM attention of one precision: what the slots below run when flash is
 * not chosen (or cannot take the head). */
struct gemm_attention {
    size_t (*saved_floats)(int B, int T, int NH, int HS);
    size_t (*scratch_floats)(int B, int T, int NH, int HS);
    void (*forward)(float *out, float *att, const float *qkv, int B, int T, int NH, int HS);
    void (*backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                     const float *att, int B, int T, int NH, int HS);
};

static const gemm_attention gemm_fp32 = {
    ts_cuda_gemm_attention_saved_floats, ts_cuda_gemm_attention_scratch_floats,
    ts_cuda_gemm_attention_forward, ts_cuda_gemm_attention_backward};
static const gemm_attention gemm_bf16 = {
    ts_cuda_gemm_bf16_attention_saved_floats, ts_cuda_gemm_bf16_attention_scratch_floats,
    ts_cuda_gemm_bf16_attention_forward, ts_cuda_gemm_bf16_attention_backward};

/* The chosen attention: flash (one fp32 kernel for both precisions) or g. */
static size_t chosen_saved_floats(const gemm_attention &g, bool flash, int B, int T, int NH, int HS)
{
    return use_flash(flash, HS) ? ts_cuda_flash_attention_saved_floats(B, T, NH, HS)
                                : g.saved_floats(B, T, NH, HS);
}

static size_t chosen_scratch_floats(const gemm_attention &g, bool flash, int B, int T, int NH,
                                    int HS)
{
    return use_flash(flash, HS) ? ts_cuda_flash_attention_scratch_floats(B, T, NH, HS)
                                : g.scratch_floats(B, T, NH, HS);
}

static void chosen_forward(const gemm_attention &g, bool flash, float *out, float *att,
                           const float *qkv, int B, int T, int NH, int HS)
{
    if (use_flash(flash, HS))
        ts_cuda_flash_attention_forward(out, att, qkv, B, T, NH, HS);
    else
        g.forward(out, att, qkv, B, T, NH, HS);
}

static void chosen_backward(const gemm_attention &g, bool flash, float *dqkv, float *scratch,
                            const float *dout, const float *qkv, const float *att, int B, int T,
                            int NH, int HS)
{
    if (use_flash(flash, HS))
        ts_cuda_flash_attention_backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS);
    else
        g.backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS);
}

/* The four tables' attention slots (ts_kernels_cuda, _cuda_flash, _cuda_bf16,
 * _cuda_bf16_flash): one set of four per precision and choice. */
#define TS_ATTENTION_SLOTS(suffix, g, flash)                                                      \
    extern "C" size_t ts_cuda_attention_saved_floats##suffix(int B, int T, int NH, int HS)       \
    {                                                                                            \
        return chosen_saved_floats(g, flash, B, T, NH, HS);                                      \
    }                                                                                            \
    extern "C" size_t ts_cuda_attention_scratch_floats##suffix(int B, int T, int NH, int HS)     \
    {                                                                                            \
        return chosen_scratch_floats(g, flash, B, T, NH, HS);                                    \
    }                                                                                            \
    extern "C" void ts_cuda_attention_forward##suffix(float *out, float *att, const float *qkv,  \
                                                      int B, int T, int NH, int HS)              \
    {                                                                                            \
        chosen_forward(g, flash, out, att, qkv, B, T, NH, HS);                                   \
    }                                                                                            \
    extern "C" void ts_cuda_attention_backward##suffix(float *dqkv, float *scratch,              \
                                                       const float *dout, const float *qkv,      \
                                                       const float *att, int B, int T, int NH,   \
                                                       int HS)                                   \
    {                                                                                            \
        chosen_backward(g, flash, dqkv, scratch, dout, qkv, att, B, T, NH, HS);                  \
    }

TS_ATTENTION_SLOTS(, gemm_fp32, false)
TS_ATTENTION_SLOTS(_flash, gemm_fp32, true)
TS_ATTENTION_SLOTS(_bf16, gemm_bf16, false)
TS_ATTENTION_SLOTS(_bf16_flash, gemm_bf16, true)
#undef TS_ATTENTION_SLOTS
