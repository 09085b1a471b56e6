/* Causal multi-head attention: cuBLAS strided-batched SGEMMs for the four products and
 * two warp-per-row kernels for the causal softmax and its backward.
 *
 * No permuted copies. A head's q, k, v (and out, dout, dq, dk, dv) are [T, HS] matrices
 * read in place from the [B, T, 3*NH*HS] and [B, T, NH*HS] layouts with leading
 * dimension 3C (or C), one head HS floats from the next and one sequence T*3C (T*C)
 * floats from the next. Those two strides differ, so one strided-batched call cannot
 * cover all B*NH pairs; instead the shorter of the two axes is looped on the host and
 * the other is the batch (B or NH calls per product, each batched over NH or B). So the
 * saved state is exactly the CPU backend's, the probabilities [B, NH, T, T] (zero above
 * the diagonal), with no [B, NH, T, HS] copies of q, k, v kept per layer, and the
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
 * TF32), so the products are fp32 like the CPU's.
 *
 * Softmax rows: one warp per row, reductions by butterfly shuffles (a fixed order:
 * deterministic). */
#include <math.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_ATT_WARPS 8 /* rows (warps) per block */

/* Row r (query i = r % T) of the scaled scores, in place: s[0..i] -> probabilities,
 * s[i+1..T) -> 0. */
static __global__ void causal_softmax_kernel(float *att, size_t rows, int T)
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
}

/* Row r of the softmax backward, in place over dP: dS[j] = p[j] (dP[j] - sum_j p[j] dP[j])
 * for j <= i, 0 above the diagonal. */
static __global__ void causal_softmax_backward_kernel(float *dp, const float *att, size_t rows,
                                                      int T)
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
}

/* An operand's place in its buffer: (b, h)'s matrix starts at b * per_b + h * per_h. */
struct operand {
    long long per_b, per_h;
};

/* For every (b, h): C_bh = alpha op(A_bh) op(B_bh) + beta C_bh (cuBLAS's column-major
 * view), as min(B, NH) strided-batched calls of max(B, NH) matrices each. */
static void gemm_bh(cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                    float alpha, const float *A, int lda, operand oa, const float *Bm, int ldb,
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
        TS_CUBLAS_CHECK(cublasSgemmStridedBatched(ts_cuda_cublas(), opa, opb, m, n, k, &alpha,
                                                  A + a0, lda, sa, Bm + b0, ldb, sb, &beta,
                                                  C + c0, ldc, sc, batch));
    }
}

extern "C" size_t ts_cuda_attention_saved_floats(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * T; /* the probabilities, as the CPU */
}

extern "C" size_t ts_cuda_attention_scratch_floats(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * T; /* dP, then dS in place */
}

extern "C" void ts_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T,
                                          int NH, int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    const int C = NH * HS, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    const operand x3 = {(long long)T * C3, HS}; /* q, k or v in qkv */
    const operand x1 = {(long long)T * C, HS};  /* a head in out */
    const operand tt = {(long long)NH * T * T, (long long)T * T}; /* a head's [T, T] */
    const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
    /* S = scale Q K^T  (S^T = scale K Q^T) into att */
    gemm_bh(CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, scale, k, C3, x3, q, C3, x3, 0.0f, att, T, tt, B,
            NH);
    size_t rows = (size_t)B * NH * T;
    causal_softmax_kernel<<<ts_cuda_blocks(rows, TS_ATT_WARPS), TS_ATT_WARPS * 32, 0,
                            ts_cuda_stream()>>>(att, rows, T);
    TS_CUDA_LAUNCHED();
    /* O = P V  (O^T = V^T P^T) */
    gemm_bh(CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, 1.0f, v, C3, x3, att, T, tt, 0.0f, out, C, x1, B,
            NH);
}

/* With P the probabilities and dO the output gradient of one head:
 *   dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dV = P^T dO,
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * Every element of dqkv is written (beta = 0): overwritten, as kernels.h asks. */
extern "C" void ts_cuda_attention_backward(float *dqkv, float *scratch, const float *dout,
                                           const float *qkv, const float *att, int B, int T,
                                           int NH, int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
    const int C = NH * HS, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
    const operand x3 = {(long long)T * C3, HS};
    const operand x1 = {(long long)T * C, HS};
    const operand tt = {(long long)NH * T * T, (long long)T * T};
    const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
    float *dq = dqkv, *dk = dqkv + C, *dv = dqkv + 2 * C;
    float *ds = scratch;
    /* dP = dO V^T  (dP^T = V dO^T) */
    gemm_bh(CUBLAS_OP_T, CUBLAS_OP_N, T, T, HS, 1.0f, v, C3, x3, dout, C, x1, 0.0f, ds, T, tt, B,
            NH);
    size_t rows = (size_t)B * NH * T;
    causal_softmax_backward_kernel<<<ts_cuda_blocks(rows, TS_ATT_WARPS), TS_ATT_WARPS * 32, 0,
                                     ts_cuda_stream()>>>(ds, att, rows, T);
    TS_CUDA_LAUNCHED();
    /* dV = P^T dO  (dV^T = dO^T P) */
    gemm_bh(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, 1.0f, dout, C, x1, att, T, tt, 0.0f, dv, C3, x3,
            B, NH);
    /* dQ = scale dS K  (dQ^T = scale K^T dS^T) */
    gemm_bh(CUBLAS_OP_N, CUBLAS_OP_N, HS, T, T, scale, k, C3, x3, ds, T, tt, 0.0f, dq, C3, x3, B,
            NH);
    /* dK = scale dS^T Q  (dK^T = scale Q^T dS) */
    gemm_bh(CUBLAS_OP_N, CUBLAS_OP_T, HS, T, T, scale, q, C3, x3, ds, T, tt, 0.0f, dk, C3, x3, B,
            NH);
}
