/* Causal attention with NKV key/value heads on oneDNN bf16 GEMMs, as attention.c (its
 * semantics and structure: the reference), in the same two forms over one
 * implementation: attention_forward (Tq = Tk = T on one qkv buffer) and
 * attention_prefix_forward (Tq queries from qkv, the last Tq positions of Tk keys and
 * values from a separate kv buffer; bottom-right aligned mask, attention_rows.h). The
 * forward runs one (batch, query head) pair per OpenMP iteration, the backward one
 * (batch, key/value head) pair walking its group's query heads in order. Inside the
 * parallel region oneDNN runs single-threaded on the calling thread, so each pair is one
 * thread's sequence of small GEMMs, and results do not depend on the thread count.
 *
 * Precision: the scores S = scale Q K^T come out of the GEMM in fp32 into a per-thread
 * block of rows, the softmax runs in fp32 on them, and the probabilities are rounded
 * once to bf16 into `att` (the saved state, [B,NH,Tq,Tk]); O = P V reads those rounded
 * probabilities, so the backward sees exactly what the forward used. In the backward
 * dP = dO V^T is fp32 too; dS = P (dP - rowsum(dP P)) is computed in fp32 and rounded
 * to bf16 into the scratch (the GEMMs that read it take bf16 operands). A key/value
 * head's dK and dV sum over its query heads in fp32 (per-thread [Tk, HS], [Tk, HSV] buffers the
 * GEMMs accumulate into; for the prefix backward's +=, starting from the buffer's
 * values widened) and are rounded to bf16 once per call, after the group's last head.
 *
 * Causality and document masks as attention.c: query rows in blocks of TS_ATT_BLOCK key
 * positions; a block attends to keys [s0, i1 + off) only (s0 = 0 without masks). 64 rows (not attention.c's 32) because a oneDNN
 * call costs more than an sgemm call: half the calls for the same work. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/dnnl_matmul.h"

#define TS_ATT_BLOCK 64
_Static_assert(TS_ATT_BLOCK % TS_ATT_SM_LANES == 0, "a padded row must stay inside its block");

/* att: the probabilities in bf16. */
size_t ts_cpu_bf16_attention_saved_bytes(int B, int T, ts_att_heads h)
{
    return (size_t)B * h.NH * T * T * sizeof(ts_bf16);
}

/* The backward's dS in bf16, [B,NH,T,T]; its fp32 rows are per-thread blocks. */
size_t ts_cpu_bf16_attention_scratch_bytes(int B, int T, ts_att_heads h)
{
    return (size_t)B * h.NH * T * T * sizeof(ts_bf16);
}

/* The prefix form's, likewise: [B,NH,Tq,Tk] bf16 each. */
size_t ts_cpu_bf16_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h)
{
    return (size_t)B * h.NH * Tq * Tk * sizeof(ts_bf16);
}

size_t ts_cpu_bf16_attention_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h)
{
    return (size_t)B * h.NH * Tq * Tk * sizeof(ts_bf16);
}

/* Where the operands live, as attention.c's att_dims: per batch Tq rows of q (stride
 * ldq, heads HS apart) and of out, dout (NH*HSV wide, heads HSV apart), Tk rows of k and
 * v (stride ldkv; k head g at g*HS, v head g at NKV*HS + g*HSV). */
typedef struct {
    int B, Tq, Tk, NH, NKV, HS, HSV;
    int ldq, ldkv;
    float scale;
    const int *ds; /* the document starts [B,Tq] (kernels.h ts_att_heads), or NULL */
} att_dims;

static att_dims dims_of(int B, int Tq, int Tk, ts_att_heads h, int ldq, int ldkv)
{
    TS_ASSERT(h.NKV > 0 && h.NH % h.NKV == 0 && h.HS > 0 && h.HSV > 0);
    TS_ASSERT(Tq > 0 && Tq <= Tk);
    return (att_dims){B, Tq, Tk, h.NH, h.NKV, h.HS, h.HSV, ldq, ldkv, h.scale, h.doc_start};
}

/* C[m, n] = alpha A B with A [m,k] rows at lda and B [k,n] given by its strides. */
static ts_dnnl_gemm gemm(int m, int n, int k, int64_t a_m, int64_t a_k, int64_t b_k,
                         int64_t b_n, int64_t c_m, ts_dtype c_type, float alpha)
{
    ts_dnnl_gemm g = ts_dnnl_gemm_2d(m, n, k, a_m, 0, false, c_m);
    g.a_k = a_k;
    g.b_k = b_k;
    g.b_n = b_n;
    g.c_type = c_type;
    g.alpha = alpha;
    return g;
}

static void forward(ts_bf16 *out, ts_bf16 *att, const ts_bf16 *q0, const ts_bf16 *k0,
                    att_dims d)
{
    const int C = d.NH * d.HSV, CKV = d.NKV * d.HS, group = d.NH / d.NKV, HS = d.HS;
    const int HSV = d.HSV, Tq = d.Tq, Tk = d.Tk, off = Tk - Tq, ldq = d.ldq, ldkv = d.ldkv;
    const float scale = d.scale;
#pragma omp parallel
    {
        float *s = ts_alloc_floats((size_t)TS_ATT_BLOCK * Tk); /* this thread's score rows */
#pragma omp for schedule(static)
        for (int bh = 0; bh < d.B * d.NH; bh++) {
            int b = bh / d.NH, h = bh % d.NH;
            const ts_bf16 *q = q0 + (size_t)b * Tq * ldq + (size_t)h * HS;
            const ts_bf16 *kb = k0 + (size_t)b * Tk * ldkv;
            const ts_bf16 *k = kb + (size_t)(h / group) * HS;
            const ts_bf16 *v = kb + CKV + (size_t)(h / group) * HSV;
            ts_bf16 *a = att + (size_t)bh * Tq * Tk;
            ts_bf16 *o = out + (size_t)b * Tq * C + (size_t)h * HSV;
            const int *ds = d.ds ? d.ds + (size_t)b * Tq : NULL;
            for (int i0 = 0, i1; i0 < Tq; i0 = i1) {
                i1 = ts_att_block_end(i0, off, Tq, TS_ATT_BLOCK);
                /* the block's keys: [s0, e) (s0 = 0 without document masks) */
                const int m = i1 - i0, e = i1 + off, s0 = ts_att_doc_cols(ds, i0, TS_ATT_BLOCK);
                /* S[0:m, s0:e] (fp32) = scale Q[i0:i1] K[s0:e]^T */
                ts_dnnl_gemm gs = gemm(m, e - s0, HS, ldq, 1, 1, ldkv, Tk, TS_DTYPE_F32, scale);
                ts_dnnl_matmul(&gs, s + s0, q + (size_t)i0 * ldq, k + (size_t)s0 * ldkv, NULL);
                for (int i = i0; i < i1; i++) {
                    float *row = s + (size_t)(i - i0) * Tk;
                    ts_bf16 *arow = a + (size_t)i * Tk;
                    const int lo = ts_att_doc_lo(ds, i);
                    /* fp32 work on the block's columns [s0, e) only; the rest of the saved
                     * row is bf16 zeros (all-zero bits), written without a conversion */
                    memset(row + s0, 0, (size_t)(lo - s0) * sizeof(float));
                    ts_att_softmax_span(row, lo, i + off + 1, e);
                    memset(arow, 0, (size_t)s0 * sizeof(ts_bf16));
                    ts_f32_to_bf16_array(arow + s0, row + s0, (size_t)(e - s0));
                    memset(arow + e, 0, (size_t)(Tk - e) * sizeof(ts_bf16));
                }
                /* O[i0:i1] = P[i0:i1, s0:e] V[s0:e] */
                ts_dnnl_gemm go = gemm(m, HSV, e - s0, Tk, 1, ldkv, 1, C, TS_DTYPE_BF16, 1.0f);
                ts_dnnl_matmul(&go, o + (size_t)i0 * C, a + (size_t)i0 * Tk + s0,
                               v + (size_t)s0 * ldkv, NULL);
            }
        }
        free(s);
    }
}

/* With P the probabilities, dO the output gradient of one query head:
 *   dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dV = P^T dO,
 *   dQ = scale dS K,  dK = scale dS^T Q,
 * dK and dV summed over the key/value head's query heads in fp32 (the first overwrites
 * the sums, the others accumulate, in head order; with `accumulate` the sums start from
 * dk, dv's values instead), then rounded once into dk, dv. dS (bf16) lives in the query
 * head's Tq*Tk slice of the scratch; row i holds [0, i1 + off) of its block, which is
 * all the dK GEMMs read (ts_att_block_end: rows below a key block reach its columns). */
static void backward(ts_bf16 *dq0, ts_bf16 *dk0, bool accumulate, ts_bf16 *scratch,
                     const ts_bf16 *dout, const ts_bf16 *q0, const ts_bf16 *k0,
                     const ts_bf16 *att, att_dims d)
{
    const int C = d.NH * d.HSV, CKV = d.NKV * d.HS, group = d.NH / d.NKV, HS = d.HS;
    const int HSV = d.HSV, Tq = d.Tq, Tk = d.Tk, off = Tk - Tq, ldq = d.ldq, ldkv = d.ldkv;
    const float scale = d.scale;
#pragma omp parallel
    {
        /* this thread's fp32 dP rows, one widened row of P, and the fp32 dK, dV sums */
        float *dp = ts_alloc_floats((size_t)(TS_ATT_BLOCK + 1) * Tk + (size_t)Tk * (HS + HSV));
        float *prow = dp + (size_t)TS_ATT_BLOCK * Tk, *dk32 = prow + Tk;
        float *dv32 = dk32 + (size_t)Tk * HS;
#pragma omp for schedule(static)
        for (int bg = 0; bg < d.B * d.NKV; bg++) {
            int b = bg / d.NKV, g = bg % d.NKV;
            size_t qrow = (size_t)b * Tq * ldq, kvrow = (size_t)b * Tk * ldkv;
            size_t koff = kvrow + (size_t)g * HS, voff = kvrow + CKV + (size_t)g * HSV;
            const ts_bf16 *k = k0 + koff, *v = k0 + voff;
            ts_bf16 *dk = dk0 + koff, *dv = dk0 + voff;
            const int *ds = d.ds ? d.ds + (size_t)b * Tq : NULL;
            if (accumulate) /* the sums start from what dk, dv hold */
                for (int t = 0; t < Tk; t++) {
                    ts_bf16_to_f32_array(dk32 + (size_t)t * HS, dk + (size_t)t * ldkv,
                                         (size_t)HS);
                    ts_bf16_to_f32_array(dv32 + (size_t)t * HSV, dv + (size_t)t * ldkv,
                                         (size_t)HSV);
                }
            for (int h = g * group; h < (g + 1) * group; h++) {
                const int bh = b * d.NH + h;
                const bool acc = accumulate || h != g * group; /* else the first overwrites */
                const ts_bf16 *q = q0 + qrow + (size_t)h * HS;
                ts_bf16 *dq = dq0 + qrow + (size_t)h * HS;
                const ts_bf16 *p = att + (size_t)bh * Tq * Tk;
                const ts_bf16 *dO = dout + (size_t)b * Tq * C + (size_t)h * HSV;
                ts_bf16 *dsc = scratch + (size_t)bh * Tq * Tk;
                for (int i0 = 0, i1; i0 < Tq; i0 = i1) {
                    i1 = ts_att_block_end(i0, off, Tq, TS_ATT_BLOCK);
                    const int m = i1 - i0, e = i1 + off;
                    const int s0 = ts_att_doc_cols(ds, i0, TS_ATT_BLOCK);
                    /* dP[0:m, s0:e] (fp32) = dO[i0:i1] V[s0:e]^T */
                    ts_dnnl_gemm gp = gemm(m, e - s0, HSV, C, 1, 1, ldkv, Tk, TS_DTYPE_F32, 1.0f);
                    ts_dnnl_matmul(&gp, dp + s0, dO + (size_t)i0 * C, v + (size_t)s0 * ldkv,
                                   NULL);
                    for (int i = i0; i < i1; i++) {
                        float *dr = dp + (size_t)(i - i0) * Tk;
                        const int lo = ts_att_doc_lo(ds, i);
                        ts_bf16_to_f32_array(prow + s0, p + (size_t)i * Tk + s0, (size_t)(e - s0));
                        memset(dr + s0, 0, (size_t)(lo - s0) * sizeof(float));
                        ts_att_softmax_backward_span(dr, prow, lo, i + off + 1, e);
                        ts_f32_to_bf16_array(dsc + (size_t)i * Tk + s0, dr + s0, (size_t)(e - s0));
                    }
                    /* dQ[i0:i1] = scale dS[i0:i1, s0:e] K[s0:e] */
                    ts_dnnl_gemm gq = gemm(m, HS, e - s0, Tk, 1, ldkv, 1, ldq, TS_DTYPE_BF16, scale);
                    ts_dnnl_matmul(&gq, dq + (size_t)i0 * ldq, dsc + (size_t)i0 * Tk + s0,
                                   k + (size_t)s0 * ldkv, NULL);
                }
                /* Key/value rows [j0, j1) receive from query rows r0 <= i < r1 only
                 * (positions i + off >= j0; documents that start before j1). */
                for (int j0 = 0; j0 < Tk; j0 += TS_ATT_BLOCK) {
                    int j1 = j0 + TS_ATT_BLOCK < Tk ? j0 + TS_ATT_BLOCK : Tk, m = j1 - j0;
                    int r0 = j0 > off ? j0 - off : 0, r1 = ts_att_doc_rows_end(ds, Tq, j1);
                    if (r1 <= r0) { /* no query sees these keys: the sums stay (or are) 0 */
                        if (!acc) {
                            memset(dk32 + (size_t)j0 * HS, 0, (size_t)m * HS * sizeof(float));
                            memset(dv32 + (size_t)j0 * HSV, 0, (size_t)m * HSV * sizeof(float));
                        }
                        continue;
                    }
                    const int rows = r1 - r0;
                    size_t corner = (size_t)r0 * Tk + j0;
                    /* dK[j0:j1] (+)= scale dS[r0:r1, j0:j1]^T Q[r0:r1] (A transposed in place) */
                    ts_dnnl_gemm gk = gemm(m, HS, rows, 1, Tk, ldq, 1, HS, TS_DTYPE_F32, scale);
                    gk.accumulate = acc;
                    ts_dnnl_matmul(&gk, dk32 + (size_t)j0 * HS, dsc + corner, q + (size_t)r0 * ldq,
                                   NULL);
                    /* dV[j0:j1] (+)= P[r0:r1, j0:j1]^T dO[r0:r1] */
                    ts_dnnl_gemm gv = gemm(m, HSV, rows, 1, Tk, C, 1, HSV, TS_DTYPE_F32, 1.0f);
                    gv.accumulate = acc;
                    ts_dnnl_matmul(&gv, dv32 + (size_t)j0 * HSV, p + corner, dO + (size_t)r0 * C,
                                   NULL);
                }
            }
            for (int t = 0; t < Tk; t++) { /* one rounding of each sum */
                ts_f32_to_bf16_array(dk + (size_t)t * ldkv, dk32 + (size_t)t * HS, (size_t)HS);
                ts_f32_to_bf16_array(dv + (size_t)t * ldkv, dv32 + (size_t)t * HSV, (size_t)HSV);
            }
        }
        free(dp);
    }
}

/* qkv [B,T,NH*HS + NKV*HS + NKV*HSV]: q, k and v all in one row (C3 wide). */
void ts_cpu_bf16_attention_forward(void *out, void *att, const void *qkv, int B, int T,
                                   ts_att_heads h)
{
    const int C3 = (int)ts_att_qkv_width(h);
    forward(out, att, qkv, (const ts_bf16 *)qkv + (size_t)h.NH * h.HS,
            dims_of(B, T, T, h, C3, C3));
}

void ts_cpu_bf16_attention_backward(void *dqkv, void *scratch, const void *dout, const void *qkv,
                                    const void *att, int B, int T, ts_att_heads h)
{
    const int C3 = (int)ts_att_qkv_width(h);
    const size_t q = (size_t)h.NH * h.HS;
    backward(dqkv, (ts_bf16 *)dqkv + q, false, scratch, dout, qkv, (const ts_bf16 *)qkv + q, att,
             dims_of(B, T, T, h, C3, C3));
}

/* q from qkv's rows (C3 wide; its k, v columns unread), k and v from kv
 * [B,Tk,NKV*HS + NKV*HSV]. */
void ts_cpu_bf16_attention_prefix_forward(void *out, void *att, const void *qkv, const void *kv,
                                          int B, int Tq, int Tk, ts_att_heads h)
{
    forward(out, att, qkv, kv,
            dims_of(B, Tq, Tk, h, (int)ts_att_qkv_width(h), (int)ts_att_kv_width(h)));
}

void ts_cpu_bf16_attention_prefix_backward(void *dqkv, void *dkv, void *scratch,
                                           const void *dout, const void *qkv, const void *kv,
                                           const void *att, int B, int Tq, int Tk,
                                           ts_att_heads h)
{
    backward(dqkv, dkv, true, scratch, dout, qkv, kv, att,
             dims_of(B, Tq, Tk, h, (int)ts_att_qkv_width(h), (int)ts_att_kv_width(h)));
}
