/* Causal attention on GEMMs with NKV key/value heads (grouped-query attention: query
 * head h reads key/value head h / (NH/NKV); NKV == NH is multi-head), q and k heads of HS
 * channels, v and output heads of HSV (MLA's differ), scores scaled by the heads' scale
 * (kernels.h ts_att_heads), in two forms over
 * one implementation: attention_forward's Tq = Tk = T on one qkv buffer, and
 * attention_prefix_forward's Tq queries (from qkv) against Tk >= Tq keys and values
 * (from a separate kv buffer, context parallelism's gathered sequence), the queries the
 * LAST Tq positions (bottom-right aligned mask, attention_rows.h). The forward runs one
 * (batch, query head) pair per OpenMP iteration, the backward one (batch, key/value
 * head) pair, whose query heads it walks in order so their dK and dV sums have one
 * owner (no races, a fixed order). OpenBLAS (OpenMP build) runs single-threaded inside
 * a parallel region, so each pair is one thread's sequence of small sgemms; pairs are
 * independent, so results do not depend on the thread count.
 *
 * Causality: query rows are processed in blocks of TS_ATT_BLOCK key positions
 * (ts_att_block_end); a block attends to keys [0, i1 + off) only, so the GEMMs skip the
 * blocks above the diagonal (at T = 256 they do 9/16 of the full work; 32 measured
 * faster than 64 or 128 there). Inside a diagonal block the masked entries are set to
 * exactly 0, so they drop out of every product that reads them.
 *
 * Document masks (ts_att_heads.doc_start; docs/ARCHITECTURE.md "Packed documents"): a
 * block of query rows also starts its GEMMs at the key block holding its first row's
 * document start (ts_att_doc_cols), and a key block's dK, dV GEMMs stop at the first
 * query row whose document starts after it (ts_att_doc_rows_end), so the skipped blocks
 * cost nothing but the saved probabilities' zeros; the entries before a row's start are
 * exactly 0 like those after its position. */
#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_ATT_BLOCK 32
_Static_assert(TS_ATT_BLOCK % TS_ATT_SM_LANES == 0, "a padded row must stay inside its block");

/* Where the operands live: per batch Tq rows of q (and dq) and of dout and out, Tk rows
 * of k and v (and dk, dv); q head h at column h*HS of a q row (stride ldq), k head g at
 * column g*HS of a k row (stride ldkv) and v head g at column NKV*HS + g*HSV of it; out
 * and dout head h at column h*HSV of a row NH*HSV wide. */
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

static void forward(float *out, float *att, const float *q0, const float *k0, att_dims d)
{
    const int C = d.NH * d.HSV, CKV = d.NKV * d.HS, group = d.NH / d.NKV, HS = d.HS;
    const int HSV = d.HSV, Tq = d.Tq, Tk = d.Tk, off = Tk - Tq, ldq = d.ldq, ldkv = d.ldkv;
    const float scale = d.scale;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < d.B * d.NH; bh++) {
        int b = bh / d.NH, h = bh % d.NH;
        const float *q = q0 + (size_t)b * Tq * ldq + (size_t)h * HS;
        const float *kb = k0 + (size_t)b * Tk * ldkv, *k = kb + (size_t)(h / group) * HS;
        const float *v = kb + CKV + (size_t)(h / group) * HSV;
        float *a = att + (size_t)bh * Tq * Tk;
        float *o = out + (size_t)b * Tq * C + (size_t)h * HSV;
        const int *ds = d.ds ? d.ds + (size_t)b * Tq : NULL;
        for (int i0 = 0, i1; i0 < Tq; i0 = i1) {
            i1 = ts_att_block_end(i0, off, Tq, TS_ATT_BLOCK);
            /* the block's keys: [s0, e) (s0 = 0 without document masks) */
            const int m = i1 - i0, e = i1 + off, s0 = ts_att_doc_cols(ds, i0, TS_ATT_BLOCK);
            /* S[i0:i1, s0:e] = scale * Q[i0:i1] K[s0:e]^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, e - s0, HS, scale,
                        q + (size_t)i0 * ldq, ldq, k + (size_t)s0 * ldkv, ldkv, 0.0f,
                        a + (size_t)i0 * Tk + s0, Tk);
            for (int i = i0; i < i1; i++) {
                float *row = a + (size_t)i * Tk;
                const int lo = ts_att_doc_lo(ds, i);
                memset(row, 0, (size_t)lo * sizeof(float)); /* the earlier documents' keys */
                ts_att_softmax_span(row, lo, i + off + 1, Tk);
            }
            /* O[i0:i1] = P[i0:i1, s0:e] V[s0:e] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HSV, e - s0, 1.0f,
                        a + (size_t)i0 * Tk + s0, Tk, v + (size_t)s0 * ldkv, ldkv, 0.0f,
                        o + (size_t)i0 * C, C);
        }
    }
}

/* With P the probabilities, dO the output gradient of one query head:
 *   dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dV = P^T dO,
 *   dQ = scale dS K,  dK = scale dS^T Q,
 * and a key/value head's dK, dV the sums over its group's query heads, in head order:
 * the first query head's GEMMs overwrite them (beta 0) unless `accumulate` (then every
 * head adds into what the buffer holds), the others add (beta 1). dS lives in the query
 * head's Tq*Tk slice of the scratch. */
static void backward(float *dq0, float *dk0, bool accumulate, float *scratch,
                     const float *dout, const float *q0, const float *k0, const float *att,
                     att_dims d)
{
    const int C = d.NH * d.HSV, CKV = d.NKV * d.HS, group = d.NH / d.NKV, HS = d.HS;
    const int HSV = d.HSV, Tq = d.Tq, Tk = d.Tk, off = Tk - Tq, ldq = d.ldq, ldkv = d.ldkv;
    const float scale = d.scale;
#pragma omp parallel for schedule(static)
    for (int bg = 0; bg < d.B * d.NKV; bg++) {
        int b = bg / d.NKV, g = bg % d.NKV;
        size_t qrow = (size_t)b * Tq * ldq, kvrow = (size_t)b * Tk * ldkv;
        size_t koff = kvrow + (size_t)g * HS, voff = kvrow + CKV + (size_t)g * HSV;
        const float *k = k0 + koff, *v = k0 + voff;
        float *dk = dk0 + koff, *dv = dk0 + voff;
        const int *ds = d.ds ? d.ds + (size_t)b * Tq : NULL;
        for (int h = g * group; h < (g + 1) * group; h++) {
            const int bh = b * d.NH + h;
            const float beta = accumulate || h != g * group ? 1.0f : 0.0f;
            const float *q = q0 + qrow + (size_t)h * HS;
            float *dq = dq0 + qrow + (size_t)h * HS;
            const float *p = att + (size_t)bh * Tq * Tk;
            const float *dO = dout + (size_t)b * Tq * C + (size_t)h * HSV;
            float *dsc = scratch + (size_t)bh * Tq * Tk;
            for (int i0 = 0, i1; i0 < Tq; i0 = i1) {
                i1 = ts_att_block_end(i0, off, Tq, TS_ATT_BLOCK);
                const int m = i1 - i0, e = i1 + off, s0 = ts_att_doc_cols(ds, i0, TS_ATT_BLOCK);
                /* dP[i0:i1, s0:e] = dO[i0:i1] V[s0:e]^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, e - s0, HSV, 1.0f,
                            dO + (size_t)i0 * C, C, v + (size_t)s0 * ldkv, ldkv, 0.0f,
                            dsc + (size_t)i0 * Tk + s0, Tk);
                /* Softmax backward, row by row; zero the rest of the block's columns. */
                for (int i = i0; i < i1; i++) {
                    float *dr = dsc + (size_t)i * Tk;
                    const int lo = ts_att_doc_lo(ds, i);
                    memset(dr + s0, 0, (size_t)(lo - s0) * sizeof(float));
                    ts_att_softmax_backward_span(dr, p + (size_t)i * Tk, lo, i + off + 1, e);
                }
                /* dQ[i0:i1] = scale dS[i0:i1, s0:e] K[s0:e] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, e - s0, scale,
                            dsc + (size_t)i0 * Tk + s0, Tk, k + (size_t)s0 * ldkv, ldkv, 0.0f,
                            dq + (size_t)i0 * ldq, ldq);
            }
            /* Key/value rows [j0, j1) receive from query rows i >= r0 = j0 - off only
             * (positions i + off >= j0), whose dS rows are written over [j0, j1), and
             * before r1, where the documents that start at or after j1 begin. */
            for (int j0 = 0; j0 < Tk; j0 += TS_ATT_BLOCK) {
                int j1 = j0 + TS_ATT_BLOCK < Tk ? j0 + TS_ATT_BLOCK : Tk, m = j1 - j0;
                int r0 = j0 > off ? j0 - off : 0, r1 = ts_att_doc_rows_end(ds, Tq, j1);
                if (r1 <= r0) { /* no query sees these keys */
                    if (beta == 0.0f)
                        for (int j = j0; j < j1; j++) {
                            memset(dk + (size_t)j * ldkv, 0, (size_t)HS * sizeof(float));
                            memset(dv + (size_t)j * ldkv, 0, (size_t)HSV * sizeof(float));
                        }
                    continue;
                }
                size_t corner = (size_t)r0 * Tk + j0;
                /* dK[j0:j1] (+)= scale dS[r0:r1, j0:j1]^T Q[r0:r1] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, HS, r1 - r0, scale,
                            dsc + corner, Tk, q + (size_t)r0 * ldq, ldq, beta,
                            dk + (size_t)j0 * ldkv, ldkv);
                /* dV[j0:j1] (+)= P[r0:r1, j0:j1]^T dO[r0:r1] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, HSV, r1 - r0, 1.0f,
                            p + corner, Tk, dO + (size_t)r0 * C, C, beta, dv + (size_t)j0 * ldkv,
                            ldkv);
            }
        }
    }
}

/* qkv [B,T,NH*HS + NKV*HS + NKV*HSV]: q, k and v all in one row (C3 wide). */
void ts_cpu_attention_forward(void *out, void *att, const void *qkv, int B, int T, ts_att_heads h)
{
    const int C3 = (int)ts_att_qkv_width(h);
    forward(out, att, qkv, (const float *)qkv + (size_t)h.NH * h.HS, dims_of(B, T, T, h, C3, C3));
}

void ts_cpu_attention_backward(void *dqkv, void *scratch, const void *dout, const void *qkv,
                               const void *att, int B, int T, ts_att_heads h)
{
    const int C3 = (int)ts_att_qkv_width(h);
    const size_t q = (size_t)h.NH * h.HS;
    backward(dqkv, (float *)dqkv + q, false, scratch, dout, qkv, (const float *)qkv + q, att,
             dims_of(B, T, T, h, C3, C3));
}

/* q from qkv's rows (C3 wide; its k, v columns unread), k and v from kv
 * [B,Tk,NKV*HS + NKV*HSV]. */
void ts_cpu_attention_prefix_forward(void *out, void *att, const void *qkv, const void *kv,
                                     int B, int Tq, int Tk, ts_att_heads h)
{
    forward(out, att, qkv, kv,
            dims_of(B, Tq, Tk, h, (int)ts_att_qkv_width(h), (int)ts_att_kv_width(h)));
}

void ts_cpu_attention_prefix_backward(void *dqkv, void *dkv, void *scratch, const void *dout,
                                      const void *qkv, const void *kv, const void *att, int B,
                                      int Tq, int Tk, ts_att_heads h)
{
    backward(dqkv, dkv, true, scratch, dout, qkv, kv, att,
             dims_of(B, Tq, Tk, h, (int)ts_att_qkv_width(h), (int)ts_att_kv_width(h)));
}
