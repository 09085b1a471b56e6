/* Causal multi-head attention: the batched-GEMM attention (cuBLAS strided-batched GEMMs
 * for the four products and two warp-per-row kernels for the causal softmax and its
 * backward), for fp32 and bf16 activations, and the choice between it and the
 * flash-style attention (attention_flash.cu) behind the tables' attention slots.
 *
 * No permuted copies. A head's q, k, v (and out, dout, dq, dk, dv) are [T, HS] matrices
 * read in place from the [B, T, (NH + 2 NKV) HS] and [B, T, NH HS] layouts with leading
 * dimension C3 = (NH + 2 NKV) HS (or C = NH HS), one head HS elements from the next and
 * one sequence T*C3 (T*C) elements from the next. Those two strides differ, so one
 * strided-batched call cannot cover all (b, head) pairs; instead the shorter of the two
 * axes is looped on the host and the other is the batch. The saved state is the CPU
 * backend's, the probabilities [B, NH, T, T] (zero above the diagonal) in the activation
 * type, with no [B, NH, T, HS] copies of q, k, v kept per layer; the forward needs no
 * workspace (it has no scratch argument).
 *
 * Grouped-query attention (NKV key/value heads, G = NH / NKV query heads each; G = 1 is
 * multi-head): query head h = j G + g reads kv head j. Each product runs in G rounds;
 * round g takes query head j G + g of every kv head j, which is a strided batch again
 * (query-side operands step G heads per j and start g heads in, kv-side ones step one),
 * batched over (b, j) as above: G min(B, NKV) calls per product. A kv head's gradients
 * sum over its G query heads: the rounds of dK and dV add to the previous ones (beta 1)
 * in g order, a fixed order, so reruns give the same bits (no atomics). With G = 1 every
 * call is the multi-head one.
 *
 * The GEMMs compute the full T x T products (the entries above the diagonal are
 * computed and then masked to exact zeros by the softmax kernels, so they drop out of
 * every later product): twice the causal work, simple, a first version. Packed documents
 * (ts_att_heads.doc_start, device int32 [B, Tq]) are masked the same way: the softmax
 * kernels keep each row's keys [doc_start, diagonal] and write exact zeros before its
 * document too, so P, dS and every product after them are the per-document ones. These
 * kernels do NOT skip the masked blocks (the products stay dense: a strided-batched GEMM
 * has one shape for every (b, head), and the documents differ between sequences; cutting
 * them per document would need doc_start on the host, a sync per call); the flash
 * kernels (attention_flash.cu) do skip them, their work falling to sum L_i^2.
 *
 * cuBLAS is column-major: a row-major [r, c] matrix with leading dimension ld is, to
 * cuBLAS, its transpose [c, r] with the same ld, so row-major X = A B is computed as
 * X^T = B^T A^T with the operands swapped. The handle keeps the default math mode (no
 * TF32), so the fp32 products are fp32 like the CPU's.
 *
 * fp32: SGEMMs; scratch holds dP, then dS in place (fp32 [B, NH, T, T], the CPU's).
 * bf16: the same calls through cublasGemmStridedBatchedEx on the bf16 activations as they
 * lie in memory, fp32 accumulation (CUBLAS_COMPUTE_32F). The scores S = scale Q K^T are
 * rounded to bf16 by their GEMM into `att` (the forward has no workspace for an fp32
 * copy; llm.c keeps its scores in bf16 too), the softmax reads them in fp32 and writes
 * the probabilities over them in bf16, and P V is rounded once into out. The backward
 * keeps dP = dO V^T in fp32 (scratch), forms dS = P (dP - rowsum(P dP)) in fp32 and
 * stores it bf16 (scratch, second piece) for the dQ and dK products; dQ, dK, dV are
 * rounded once into dqkv (with G > 1, dK and dV sum the rounds in an fp32 accumulator,
 * in the first piece of scratch once dP is dead, and are rounded once from it).
 *
 * Softmax rows: one warp per row, reductions by butterfly shuffles (a fixed order:
 * deterministic). */
#include <math.h>
#include <stdio.h>

#include "kernels/attention_sizes.h"
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/reduce.cuh"

#define TS_ATT_WARPS 8 /* rows (warps) per block */

/* The first live key of row r of [B, NH, Tq, Tk] (query i = r % Tq of sequence
 * b = r / (NH Tq)): doc_start[b Tq + i] with packed documents (kernels.h ts_att_heads:
 * device int32 [B, Tq], key coordinates), else 0 (causal). */
static __device__ __forceinline__ int row_first_key(const int *doc_start, size_t r, int NH,
                                                    int Tq)
{
    if (!doc_start) return 0;
    size_t b = r / ((size_t)NH * Tq);
    return doc_start[b * Tq + r % Tq];
}

/* Row r (query i = r % Tq, at key position i + Tk - Tq: the last Tq of Tk positions;
 * Tq = Tk = T for a whole sequence) of the scaled scores [.., Tq, Tk], in place:
 * s[lo..i + Tk - Tq] -> probabilities, the rest -> exact 0 (lo = the row's document
 * start, row_first_key; 0 without documents). exp(s - max) is computed again in the last
 * pass rather than stored in the second, so a bf16 probability is rounded once (and fp32
 * gets the same bits either way). Each lane reads and writes only its own j, so in place
 * is safe. */
template <typename A>
static __global__ void causal_softmax_kernel(A *att, size_t rows, int Tq, int Tk, int NH,
                                             const int *doc_start)
{
    size_t r = (size_t)blockIdx.x * TS_ATT_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return; /* whole warps leave together */
    const int T = Tk;
    A *s = att + r * T;
    int n = (int)(r % Tq) + (Tk - Tq) + 1; /* live entries end here */
    int lo = row_first_key(doc_start, r, NH, Tq); /* ... and start here */
    float mx = -INFINITY;
    for (int j = lo + lane; j < n; j += 32) mx = fmaxf(mx, ts_act_load(s, j));
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lo + lane; j < n; j += 32) sum += expf(ts_act_load(s, j) - mx);
    float inv = 1.0f / warp_sum(sum);
    for (int j = lo + lane; j < n; j += 32)
        ts_act_store(s, j, expf(ts_act_load(s, j) - mx) * inv);
    for (int j = lane; j < lo; j += 32) ts_act_store(s, j, 0.0f);
    for (int j = n + lane; j < T; j += 32) ts_act_store(s, j, 0.0f);
}

/* Row r of the softmax backward: dS[j] = p[j] (dP[j] - sum_j p[j] dP[j]) for lo <= j <=
 * i, 0 elsewhere (above the diagonal, before the row's document), from the fp32 dP into
 * ds (fp32: ds == dp, in place, each lane on its own j after the dot product; bf16: a
 * separate buffer). */
template <typename A>
static __global__ void causal_softmax_backward_kernel(A *ds, const float *dp, const A *att,
                                                      size_t rows, int Tq, int Tk, int NH,
                                                      const int *doc_start)
{
    size_t r = (size_t)blockIdx.x * TS_ATT_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const int T = Tk;
    const float *d = dp + r * T;
    const A *p = att + r * T;
    A *o = ds + r * T;
    int n = (int)(r % Tq) + (Tk - Tq) + 1;
    int lo = row_first_key(doc_start, r, NH, Tq);
    float dot = 0.0f;
    for (int j = lo + lane; j < n; j += 32) dot += ts_act_load(p, j) * d[j];
    dot = warp_sum(dot);
    for (int j = lo + lane; j < n; j += 32) ts_act_store(o, j, ts_act_load(p, j) * (d[j] - dot));
    for (int j = lane; j < lo; j += 32) ts_act_store(o, j, 0.0f);
    for (int j = n + lane; j < T; j += 32) ts_act_store(o, j, 0.0f);
}

/* An operand's place in its buffer: (b, h)'s matrix starts at b * per_b + h * per_h. */
struct operand {
    long long per_b, per_h;
};

/* The cuBLAS type of an element type. */
template <typename X> static constexpr cudaDataType_t cuda_type(void)
{
    return sizeof(X) == sizeof(float) ? CUDA_R_32F : CUDA_R_16BF;
}

/* For every (b, h): C_bh = alpha op(A_bh) op(B_bh) + beta C_bh (cuBLAS's column-major
 * view), as min(B, NH) strided-batched calls of max(B, NH) matrices each. In = Out =
 * float: SGEMM; In = bf16: bf16 operands, fp32 accumulation, C in Out (bf16 or fp32).
 * Offsets and strides count elements of the operand's own type. */
template <typename In, typename Out>
static void gemm_bh(cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                    float alpha, const In *A, int lda, operand oa, const In *Bm, int ldb,
                    operand ob, float beta, Out *C, int ldc, operand oc, int B, int NH)
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
            static_assert(sizeof(Out) == sizeof(float), "fp32 operands give fp32 results");
            TS_CUBLAS_CHECK(cublasSgemmStridedBatched(ts_cuda_cublas(), opa, opb, m, n, k, &alpha,
                                                      A + a0, lda, sa, Bm + b0, ldb, sb, &beta,
                                                      C + c0, ldc, sc, batch));
        } else {
            TS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
                ts_cuda_cublas(), opa, opb, m, n, k, &alpha, A + a0, CUDA_R_16BF, lda, sa, Bm + b0,
                CUDA_R_16BF, ldb, sb, &beta, C + c0, cuda_type<Out>(), ldc, sc, batch,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
}

/* One attention's shape and operand places. Query head h = j G + g reads kv head j
 * (G = NH / NKV query heads per kv head): every product runs as G rounds, round g
 * covering the query heads j G + g of every kv head j, batched over (b, j) by gemm_bh
 * (its "heads" are the NKV kv heads, a query-side operand stepping G heads per j and
 * starting g heads in). q and k heads are HS wide, v heads and out/dout heads HSV. */
struct att_shape {
    int B, Tq, Tk, NH, NKV, G, HS, HSV;
    int QW; /* the q columns of a qkv row, NH HS (k starts there) */
    int C;  /* an out/dout row, NH HSV */
    int C3; /* a qkv row, NH HS + NKV (HS + HSV) */
    int KVW; /* a k|v row, NKV (HS + HSV): the gathered kv's and the bf16 accumulator's */
    int ldkv; /* the k and v heads' row stride: C3 in qkv, KVW in a gathered kv */
    float scale;
    const int *doc_start; /* ts_att_heads's: device int32 [B, Tq], or NULL (causal) */
    /* per (b, j): a q head in qkv; a k head and a v head (in qkv, or the gathered kv); a
     * head in out/dout; a q head's [Tq, Tk]; a k and a v head in the bf16 backward's fp32
     * accumulator [B, Tk, KVW] */
    operand xq, xk, xv, x1, tt, acck, accv;
};

/* Tq queries (rows of qkv) against Tk keys and values whose rows are ldkv apart. */
static att_shape general_shape(int B, int Tq, int Tk, ts_att_heads h, int ldkv)
{
    att_shape s;
    s.B = B, s.Tq = Tq, s.Tk = Tk, s.NH = h.NH, s.NKV = h.NKV, s.G = h.NH / h.NKV;
    s.HS = h.HS, s.HSV = h.HSV;
    s.QW = h.NH * h.HS, s.C = (int)ts_att_out_width(h), s.C3 = (int)ts_att_qkv_width(h);
    s.KVW = (int)ts_att_kv_width(h), s.ldkv = ldkv;
    s.scale = h.scale;
    s.doc_start = h.doc_start;
    s.xq = {(long long)Tq * s.C3, (long long)s.G * s.HS};
    s.xk = {(long long)Tk * ldkv, s.HS};
    s.xv = {(long long)Tk * ldkv, s.HSV};
    s.x1 = {(long long)Tq * s.C, (long long)s.G * s.HSV};
    s.tt = {(long long)s.NH * Tq * Tk, (long long)s.G * Tq * Tk};
    s.acck = {(long long)Tk * s.KVW, s.HS};
    s.accv = {(long long)Tk * s.KVW, s.HSV};
    return s;
}

/* A whole sequence: q, k and v all in qkv's rows. */
static att_shape shape_of(int B, int T, ts_att_heads h)
{
    return general_shape(B, T, T, h, (int)ts_att_qkv_width(h));
}

/* Round g's query-side offsets: its first head in qkv (elements), in out/dout, in
 * [Tq, Tk]s. */
static long long q_off(const att_shape &s, int g) { return (long long)g * s.HS; }
static long long o_off(const att_shape &s, int g) { return (long long)g * s.HSV; }
static long long tt_off(const att_shape &s, int g) { return (long long)g * s.Tq * s.Tk; }

/* A shape the kernels do not take is a caller's bug: stop with what and why. */
static void check_heads(const char *fn, ts_att_heads h)
{
    char why[160];
    if (h.HS < 1 || h.HSV < 1) {
        snprintf(why, sizeof why, "head sizes q/k %d, v %d (both must be positive)", h.HS, h.HSV);
        ts_cuda_fail(__FILE__, __LINE__, fn, why);
    }
    if (h.NKV >= 1 && h.NKV <= h.NH && h.NH % h.NKV == 0) return;
    snprintf(why, sizeof why, "%d query heads cannot share %d key/value heads (NH %% NKV != 0)",
             h.NH, h.NKV);
    ts_cuda_fail(__FILE__, __LINE__, fn, why);
}

/* out = softmax(scale Q K^T, causal) V, the probabilities left in att; A the activation
 * type of every buffer. */
template <typename A>
static void forward_core(const att_shape &s, A *out, A *att, const A *q, const A *k, const A *v)
{
    /* S = scale Q K^T  (S^T = scale K Q^T) into att */
    for (int g = 0; g < s.G; g++)
        gemm_bh<A, A>(CUBLAS_OP_T, CUBLAS_OP_N, s.Tk, s.Tq, s.HS, s.scale, k, s.ldkv, s.xk,
                      q + q_off(s, g), s.C3, s.xq, 0.0f, att + tt_off(s, g), s.Tk, s.tt, s.B,
                      s.NKV);
    size_t rows = (size_t)s.B * s.NH * s.Tq;
    causal_softmax_kernel<A><<<ts_cuda_blocks(rows, TS_ATT_WARPS), TS_ATT_WARPS * 32, 0,
                               ts_cuda_stream()>>>(att, rows, s.Tq, s.Tk, s.NH,
                                                            s.doc_start);
    TS_CUDA_LAUNCHED();
    /* O = P V  (O^T = V^T P^T) */
    for (int g = 0; g < s.G; g++)
        gemm_bh<A, A>(CUBLAS_OP_N, CUBLAS_OP_N, s.HSV, s.Tq, s.Tk, 1.0f, v, s.ldkv, s.xv,
                      att + tt_off(s, g), s.Tk, s.tt, 0.0f, out + o_off(s, g), s.C, s.x1, s.B,
                      s.NKV);
}

/* A whole sequence's: q, k, v in qkv's rows. */
template <typename A> static void forward_square(const att_shape &s, A *out, A *att, const A *qkv)
{
    forward_core<A>(s, out, att, qkv, qkv + s.QW, qkv + s.QW + s.NKV * s.HS);
}

/* dqkv's k and v columns [B, T, NKV (HS + HSV)] (from column QW = NH HS of each row)
 * from the fp32 accumulator of the same shape, rounded once. */
template <typename A>
static __global__ void store_kv_kernel(A *dqkv, const float *acc, size_t n, int kvw, int C3,
                                       int QW)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / kvw, c = i % kvw;
        ts_act_store(dqkv, bt * C3 + QW + c, acc[i]);
    }
}

/* dV = P^T dO  (dV^T = dO^T P) and dK = scale dS^T Q  (dK^T = scale Q^T dS), each summed
 * over a kv head's G query heads in g order (beta 0, then 1), into Out (the activation
 * type, or fp32) at dk, dv with leading dimension ld and places ok, ov. */
template <typename A, typename Out>
static void kv_products(const att_shape &s, Out *dk, Out *dv, int ld, operand ok, operand ov,
                        const A *g_, const A *q, const A *p, const A *ds, float beta0)
{
    for (int g = 0; g < s.G; g++)
        gemm_bh<A, Out>(CUBLAS_OP_N, CUBLAS_OP_T, s.HSV, s.Tk, s.Tq, 1.0f, g_ + o_off(s, g), s.C,
                        s.x1, p + tt_off(s, g), s.Tk, s.tt, g ? 1.0f : beta0, dv, ld, ov, s.B,
                        s.NKV);
    for (int g = 0; g < s.G; g++)
        gemm_bh<A, Out>(CUBLAS_OP_N, CUBLAS_OP_T, s.HS, s.Tk, s.Tq, s.scale, q + q_off(s, g),
                        s.C3, s.xq, ds + tt_off(s, g), s.Tk, s.tt, g ? 1.0f : beta0, dk, ld, ok,
                        s.B, s.NKV);
}

/* dkv [n elements] += acc, summed in fp32 and rounded once (the prefix backward's bf16
 * dK, dV: each call's share onto what the buffer holds). */
template <typename A>
static __global__ void add_kv_kernel(A *dkv, const float *acc, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        ts_act_store(dkv, i, ts_act_load(dkv, i) + acc[i]);
}

/* With P the probabilities and dO the output gradient of query head h (kv head j):
 *   dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dV_j = sum_h P^T dO,
 *   dQ = scale dS K,  dK_j = sum_h scale dS^T Q.
 * dp (fp32) holds dP; ds (type A) receives dS (fp32: ds == dp). A kv head's sums over
 * its G query heads run round by round in g order, each GEMM after the first adding to
 * the last (beta = 1): deterministic. fp32 adds in dqkv itself; bf16 with G > 1 adds in
 * fp32 (`acc`, [B, T, NKV (HS + HSV)], the dead dP's memory once dS is formed) and rounds once
 * into dqkv (bf16 with G = 1 writes dqkv directly, as before). Every element of dqkv is
 * written (the first round has beta = 0): overwritten. */
/* dP, dS and dQ (dq's heads in rows C3 apart, overwritten) for q, k, v (k, v rows ldkv
 * apart); the dK, dV products are the caller's (they differ between a whole sequence and
 * a prefix). */
template <typename A>
static void backward_dq(const att_shape &s, A *dq, float *dp, A *ds, const A *g_, const A *k,
                        const A *v, const A *p)
{
    /* dP = dO V^T  (dP^T = V dO^T), fp32 */
    for (int g = 0; g < s.G; g++)
        gemm_bh<A, float>(CUBLAS_OP_T, CUBLAS_OP_N, s.Tk, s.Tq, s.HSV, 1.0f, v, s.ldkv, s.xv,
                          g_ + o_off(s, g), s.C, s.x1, 0.0f, dp + tt_off(s, g), s.Tk, s.tt, s.B,
                          s.NKV);
    size_t rows = (size_t)s.B * s.NH * s.Tq;
    causal_softmax_backward_kernel<A><<<ts_cuda_blocks(rows, TS_ATT_WARPS), TS_ATT_WARPS * 32, 0,
                                        ts_cuda_stream()>>>(ds, dp, p, rows, s.Tq, s.Tk,
                                                                     s.NH, s.doc_start);
    TS_CUDA_LAUNCHED();
    /* dQ = scale dS K  (dQ^T = scale K^T dS^T) */
    for (int g = 0; g < s.G; g++)
        gemm_bh<A, A>(CUBLAS_OP_N, CUBLAS_OP_N, s.HS, s.Tq, s.Tk, s.scale, k, s.ldkv, s.xk,
                      ds + tt_off(s, g), s.Tk, s.tt, 0.0f, dq + q_off(s, g), s.C3, s.xq, s.B,
                      s.NKV);
}

template <typename A>
static void backward_core(const att_shape &s, A *dqkv, float *dp, A *ds, const A *g_,
                          const A *qkv, const A *p)
{
    const int kv_off = s.NKV * s.HS; /* v after k */
    const A *q = qkv, *k = qkv + s.QW, *v = qkv + s.QW + kv_off;
    backward_dq<A>(s, dqkv, dp, ds, g_, k, v, p);
    if (sizeof(A) == sizeof(float) || s.G == 1) {
        kv_products<A, A>(s, dqkv + s.QW, dqkv + s.QW + kv_off, s.C3, s.xk, s.xv, g_, q, p, ds,
                          0.0f);
    } else {
        float *acc = dp; /* dP is dead: the softmax backward has read it */
        kv_products<A, float>(s, acc, acc + kv_off, s.KVW, s.acck, s.accv, g_, q, p, ds, 0.0f);
        size_t n = (size_t)s.B * s.Tk * s.KVW;
        store_kv_kernel<A><<<ts_cuda_blocks(n, 256), 256, 0, ts_cuda_stream()>>>(
            dqkv, acc, n, s.KVW, s.C3, s.QW);
        TS_CUDA_LAUNCHED();
    }
}

/* The prefix backward (kernels.h attention_prefix_backward): dQ into dqkv's q columns,
 * dK, dV ADDED to dkv [B, Tk, NKV (HS + HSV)]: fp32 straight onto it (every round beta 1, in
 * g order); bf16 summed in fp32 (acc) and added once, rounded once. */
template <typename A>
static void prefix_backward_core(const att_shape &s, A *dqkv, A *dkv, float *dp, A *ds,
                                 float *acc, const A *g_, const A *qkv, const A *kv,
                                 const A *p)
{
    const int kv_off = s.NKV * s.HS;
    const A *k = kv, *v = kv + kv_off;
    backward_dq<A>(s, dqkv, dp, ds, g_, k, v, p);
    if (sizeof(A) == sizeof(float)) {
        kv_products<A, A>(s, dkv, dkv + kv_off, s.ldkv, s.xk, s.xv, g_, qkv, p, ds, 1.0f);
    } else {
        kv_products<A, float>(s, acc, acc + kv_off, s.KVW, s.acck, s.accv, g_, qkv, p, ds, 0.0f);
        size_t n = (size_t)s.B * s.Tk * s.KVW;
        add_kv_kernel<A><<<ts_cuda_blocks(n, 256), 256, 0, ts_cuda_stream()>>>(dkv, acc, n);
        TS_CUDA_LAUNCHED();
    }
}

/* ---- the two variants' sizes and entry points */

/* The sizes are kernels/attention_sizes.h's (shared with the layout-only tables a
 * build without CUDA plans with): fp32 saved = the probabilities, scratch = dP then dS in
 * place; bf16 saved = the probabilities in bf16, scratch = [dP fp32 | dS bf16], the
 * second piece from a 64-byte boundary, the first also holding the fp32 dK, dV
 * accumulator [B, T, NKV (HS + HSV)] when NKV < NH. */
extern "C" size_t ts_cuda_gemm_attention_saved_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_gemm_saved_bytes(B, T, h);
}

extern "C" size_t ts_cuda_gemm_attention_scratch_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_gemm_scratch_bytes(B, T, h);
}

extern "C" void ts_cuda_gemm_attention_forward(void *out, void *att, const void *qkv, int B, int T,
                                               ts_att_heads h)
{
    if (B <= 0 || T <= 0 || h.NH <= 0) return;
    check_heads("ts_cuda_gemm_attention_forward", h);
    forward_square<float>(shape_of(B, T, h), (float *)out, (float *)att,
                          (const float *)qkv);
}

extern "C" void ts_cuda_gemm_attention_backward(void *dqkv, void *scratch, const void *dout,
                                                const void *qkv, const void *att, int B, int T,
                                                ts_att_heads h)
{
    if (B <= 0 || T <= 0 || h.NH <= 0) return;
    check_heads("ts_cuda_gemm_attention_backward", h);
    float *dp = (float *)scratch;
    backward_core<float>(shape_of(B, T, h), (float *)dqkv, dp, dp, (const float *)dout,
                         (const float *)qkv, (const float *)att);
}

extern "C" size_t ts_cuda_gemm_bf16_attention_saved_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_gemm_bf16_saved_bytes(B, T, h);
}

extern "C" size_t ts_cuda_gemm_bf16_attention_scratch_bytes(int B, int T, ts_att_heads h)
{
    return ts_cuda_gemm_bf16_scratch_bytes(B, T, h);
}

extern "C" void ts_cuda_gemm_bf16_attention_forward(void *out, void *att, const void *qkv, int B,
                                                    int T, ts_att_heads h)
{
    if (B <= 0 || T <= 0 || h.NH <= 0) return;
    check_heads("ts_cuda_gemm_bf16_attention_forward", h);
    forward_square<bf16>(shape_of(B, T, h), (bf16 *)out, (bf16 *)att,
                         (const bf16 *)qkv);
}

extern "C" void ts_cuda_gemm_bf16_attention_backward(void *dqkv, void *scratch, const void *dout,
                                                     const void *qkv, const void *att, int B,
                                                     int T, ts_att_heads h)
{
    if (B <= 0 || T <= 0 || h.NH <= 0) return;
    check_heads("ts_cuda_gemm_bf16_attention_backward", h);
    float *dp = (float *)scratch;
    bf16 *ds = (bf16 *)((char *)scratch + ts_cuda_attn_bf16_ds_offset(B, T, h));
    backward_core<bf16>(shape_of(B, T, h), (bf16 *)dqkv, dp, ds, (const bf16 *)dout,
                        (const bf16 *)qkv, (const bf16 *)att);
}

/* ---- context parallelism's prefix attention (kernels.h attention_prefix_*): the
 * batched-GEMM kernels on Tq query rows of qkv against Tk rows of a gathered kv [B, Tk, 2
 * NKV HS], the queries at the last Tq key positions; every CUDA table's (flash included:
 * its kernels take no prefix yet). Built and compiled; not yet run on a GPU. */
template <typename A>
static void prefix_forward(void *out, void *att, const void *qkv, const void *kv, int B, int Tq,
                           int Tk, ts_att_heads h)
{
    if (B <= 0 || Tq <= 0 || h.NH <= 0) return;
    check_heads("attention_prefix_forward", h);
    const att_shape s = general_shape(B, Tq, Tk, h, (int)ts_att_kv_width(h));
    const A *k = (const A *)kv, *v = (const A *)kv + (size_t)h.NKV * h.HS;
    forward_core<A>(s, (A *)out, (A *)att, (const A *)qkv, k, v);
}

template <typename A>
static void prefix_backward(void *dqkv, void *dkv, void *scratch, const void *dout,
                            const void *qkv, const void *kv, const void *att, int B, int Tq,
                            int Tk, ts_att_heads h)
{
    if (B <= 0 || Tq <= 0 || h.NH <= 0) return;
    check_heads("attention_prefix_backward", h);
    const att_shape s = general_shape(B, Tq, Tk, h, (int)ts_att_kv_width(h));
    float *dp = (float *)scratch;
    A *ds = sizeof(A) == sizeof(float)
                ? (A *)dp
                : (A *)((char *)scratch + ts_cuda_prefix_ds_offset(B, Tq, Tk, h.NH));
    float *acc = sizeof(A) == sizeof(float)
                     ? nullptr
                     : (float *)((char *)scratch + ts_cuda_prefix_acc_offset(B, Tq, Tk, h.NH));
    prefix_backward_core<A>(s, (A *)dqkv, (A *)dkv, dp, ds, acc, (const A *)dout,
                            (const A *)qkv, (const A *)kv, (const A *)att);
}

extern "C" size_t ts_cuda_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h)
{
    return ts_cuda_prefix_saved_bytes(B, Tq, Tk, h, (int)sizeof(float));
}
extern "C" size_t ts_cuda_attention_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h)
{
    return ts_cuda_prefix_scratch_bytes(B, Tq, Tk, h, (int)sizeof(float));
}
extern "C" size_t ts_cuda_bf16_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h)
{
    return ts_cuda_prefix_saved_bytes(B, Tq, Tk, h, 2);
}
extern "C" size_t ts_cuda_bf16_attention_prefix_scratch_bytes(int B, int Tq, int Tk,
                                                              ts_att_heads h)
{
    return ts_cuda_prefix_scratch_bytes(B, Tq, Tk, h, 2);
}
extern "C" void ts_cuda_attention_prefix_forward(void *out, void *att, const void *qkv,
                                                 const void *kv, int B, int Tq, int Tk,
                                                 ts_att_heads h)
{
    prefix_forward<float>(out, att, qkv, kv, B, Tq, Tk, h);
}
extern "C" void ts_cuda_bf16_attention_prefix_forward(void *out, void *att, const void *qkv,
                                                      const void *kv, int B, int Tq, int Tk,
                                                      ts_att_heads h)
{
    prefix_forward<bf16>(out, att, qkv, kv, B, Tq, Tk, h);
}
extern "C" void ts_cuda_attention_prefix_backward(void *dqkv, void *dkv, void *scratch,
                                                  const void *dout, const void *qkv,
                                                  const void *kv, const void *att, int B, int Tq,
                                                  int Tk, ts_att_heads h)
{
    prefix_backward<float>(dqkv, dkv, scratch, dout, qkv, kv, att, B, Tq, Tk, h);
}
extern "C" void ts_cuda_bf16_attention_prefix_backward(void *dqkv, void *dkv, void *scratch,
                                                       const void *dout, const void *qkv,
                                                       const void *kv, const void *att, int B,
                                                       int Tq, int Tk, ts_att_heads h)
{
    prefix_backward<bf16>(dqkv, dkv, scratch, dout, qkv, kv, att, B, Tq, Tk, h);
}

/* ---- the choice behind the tables' slots.
 *
 * train.attention = "gemm" (the default) or "flash" picks the table (table.cu): its
 * slots below run the batched-GEMM attention of their precision, or the flash kernels of
 * their precision. The default is the batched-GEMM attention until a GPU measurement says
 * otherwise: its products run on cuBLAS (tensor cores in bf16) where the flash kernels
 * are plain fp32 FMAs, so it should be faster at GPT-2's T = 1024, at the price of
 * B*NH*T*T probabilities kept per layer, which flash avoids. The GPU benchmark runs both.
 * Heads wider than the flash kernels take (TS_CUDA_FLASH_MAX_HS) use the batched-GEMM
 * attention either way; the saved/scratch sizes follow the same choice, as they must. */

/* One variant's four functions. */
struct attention_variant {
    size_t (*saved_bytes)(int B, int T, ts_att_heads h);
    size_t (*scratch_bytes)(int B, int T, ts_att_heads h);
    void (*forward)(void *out, void *att, const void *qkv, int B, int T, ts_att_heads h);
    void (*backward)(void *dqkv, void *scratch, const void *dout, const void *qkv,
                     const void *att, int B, int T, ts_att_heads h);
};

#define TS_VARIANT(p) {p##saved_bytes, p##scratch_bytes, p##forward, p##backward}
static const attention_variant gemm_fp32 = TS_VARIANT(ts_cuda_gemm_attention_);
static const attention_variant gemm_bf16 = TS_VARIANT(ts_cuda_gemm_bf16_attention_);
static const attention_variant flash_fp32 = TS_VARIANT(ts_cuda_flash_attention_);
static const attention_variant flash_bf16 = TS_VARIANT(ts_cuda_flash_bf16_attention_);
#undef TS_VARIANT

/* The variant a table runs for the heads h: flash f when chosen and it takes them, else
 * the batched-GEMM g of the same precision. */
static const attention_variant &chosen(const attention_variant &g, const attention_variant *f,
                                       ts_att_heads h)
{
    return f && ts_cuda_flash_takes(h) ? *f : g;
}

/* The four tables' attention slots (ts_kernels_cuda, _cuda_flash, _cuda_bf16,
 * _cuda_bf16_flash): one set of four per precision and choice (f NULL: no flash). */
#define TS_ATTENTION_SLOTS(suffix, g, f)                                                          \
    extern "C" size_t ts_cuda_attention_saved_bytes##suffix(int B, int T, ts_att_heads h)         \
    {                                                                                             \
        return chosen(g, f, h).saved_bytes(B, T, h);                                              \
    }                                                                                             \
    extern "C" size_t ts_cuda_attention_scratch_bytes##suffix(int B, int T, ts_att_heads h)       \
    {                                                                                             \
        return chosen(g, f, h).scratch_bytes(B, T, h);                                            \
    }                                                                                             \
    extern "C" void ts_cuda_attention_forward##suffix(void *out, void *att, const void *qkv,      \
                                                      int B, int T, ts_att_heads h)               \
    {                                                                                             \
        chosen(g, f, h).forward(out, att, qkv, B, T, h);                                          \
    }                                                                                             \
    extern "C" void ts_cuda_attention_backward##suffix(void *dqkv, void *scratch,                 \
                                                       const void *dout, const void *qkv,         \
                                                       const void *att, int B, int T,             \
                                                       ts_att_heads h)                            \
    {                                                                                             \
        chosen(g, f, h).backward(dqkv, scratch, dout, qkv, att, B, T, h);                         \
    }

TS_ATTENTION_SLOTS(, gemm_fp32, (const attention_variant *)NULL)
TS_ATTENTION_SLOTS(_flash, gemm_fp32, &flash_fp32)
TS_ATTENTION_SLOTS(_bf16, gemm_bf16, (const attention_variant *)NULL)
TS_ATTENTION_SLOTS(_bf16_flash, gemm_bf16, &flash_bf16)
#undef TS_ATTENTION_SLOTS
