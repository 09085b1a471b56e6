/* Causal attention on GEMMs with NKV key/value heads (grouped-query attention: query
 * head h reads key/value head h / (NH/NKV); NKV == NH is multi-head). The forward runs
 * one (batch, query head) pair per OpenMP iteration, the backward one (batch, key/value
 * head) pair, whose query heads it walks in order so their dK and dV sums have one
 * owner (no races, a fixed order). OpenBLAS (OpenMP build) runs single-threaded inside
 * a parallel region, so each pair is one thread's sequence of small sgemms; pairs are
 * independent, so results do not depend on the thread count.
 *
 * Causality: query rows are processed in blocks of TS_ATT_BLOCK; block [i0, i1) only
 * attends to keys [0, i1), so the GEMMs skip the blocks above the diagonal (at T = 256
 * they do 9/16 of the full work; 32 measured faster than 64 or 128 there). Inside a
 * diagonal block the entries above the diagonal are set to exactly 0, so they drop out
 * of every product that reads them. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_ATT_BLOCK 32

/* The softmax rows work in blocks of 16 lanes with no ragged tail: a row of i + 1 live
 * entries is padded to a multiple of 16 (with -inf going in, exp(-inf) = 0 coming out),
 * which fits inside the row's block of columns (blocks are multiples of 16 wide, or end
 * at T). Per-row loop tails otherwise cost about as much as the arithmetic at T = 256. */
#define TS_SM_LANES 16
_Static_assert(TS_ATT_BLOCK % TS_SM_LANES == 0, "a padded row must stay inside its block");

/* Row i of the causal softmax, in place: s[0..i] -> probabilities, s[i+1..T) -> 0. */
static void causal_softmax_row(float *s, int i, int T)
{
    int n = i + 1, padded = (n + TS_SM_LANES - 1) / TS_SM_LANES * TS_SM_LANES;
    if (padded > T) padded = n; /* the last rows of a T that is not a multiple of 16 */
    for (int j = n; j < padded; j++) s[j] = -INFINITY;
    int blocked = padded / TS_SM_LANES * TS_SM_LANES;
    float mx = ts_cpu_max(s, padded), lane[TS_SM_LANES] = {0};
    for (int j = 0; j < blocked; j += TS_SM_LANES)
        for (int l = 0; l < TS_SM_LANES; l++) {
            float e = ts_cpu_expf(s[j + l] - mx);
            s[j + l] = e;
            lane[l] += e;
        }
    float sum = 0.0f;
    for (int l = 0; l < TS_SM_LANES; l++) sum += lane[l];
    for (int j = blocked; j < padded; j++) {
        float e = ts_cpu_expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < padded; j++) s[j] *= inv;
    memset(s + padded, 0, (size_t)(T - padded) * sizeof(float));
}

/* Row i of the softmax backward, in place: dr[j] = p[j] (dr[j] - sum_j p[j] dr[j]) for
 * j <= i, 0 for i < j < end (the end of the row's block of columns). p is 0 above the
 * diagonal and dr holds finite products up to end, so the padded lanes add exact zeros. */
static void causal_softmax_backward_row(float *dr, const float *p, int i, int end)
{
    int n = i + 1, padded = (n + TS_SM_LANES - 1) / TS_SM_LANES * TS_SM_LANES;
    if (padded > end) padded = n;
    int blocked = padded / TS_SM_LANES * TS_SM_LANES;
    float lane[TS_SM_LANES] = {0};
    for (int j = 0; j < blocked; j += TS_SM_LANES)
        for (int l = 0; l < TS_SM_LANES; l++) lane[l] += p[j + l] * dr[j + l];
    float dot = 0.0f;
    for (int l = 0; l < TS_SM_LANES; l++) dot += lane[l];
    for (int j = blocked; j < padded; j++) dot += p[j] * dr[j];
    for (int j = 0; j < padded; j++) dr[j] = p[j] * (dr[j] - dot);
    memset(dr + padded, 0, (size_t)(end - padded) * sizeof(float));
}

void ts_cpu_attention_forward(void *out_, void *att_, const void *qkv_, int B, int T, int NH,
                              int NKV, int HS)
{
    TS_ASSERT(NKV > 0 && NH % NKV == 0);
    float *out = out_;
    float *att = att_;
    const float *qkv = qkv_;
    /* C3: a row of qkv, [NH q heads | NKV k heads | NKV v heads] */
    const int C = NH * HS, CKV = NKV * HS, C3 = C + 2 * CKV, group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *row = qkv + (size_t)b * T * C3;
        const float *q = row + (size_t)h * HS;
        const float *k = row + C + (size_t)(h / group) * HS, *v = k + CKV;
        float *a = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * C + (size_t)h * HS;
        for (int i0 = 0; i0 < T; i0 += TS_ATT_BLOCK) {
            int i1 = i0 + TS_ATT_BLOCK < T ? i0 + TS_ATT_BLOCK : T, m = i1 - i0;
            /* S[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, HS, scale,
                        q + (size_t)i0 * C3, C3, k, C3, 0.0f, a + (size_t)i0 * T, T);
            for (int i = i0; i < i1; i++) causal_softmax_row(a + (size_t)i * T, i, T);
            /* O[i0:i1] = P[i0:i1, 0:i1] V[0:i1] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, i1, 1.0f,
                        a + (size_t)i0 * T, T, v, C3, 0.0f, o + (size_t)i0 * C, C);
        }
    }
}

/* With P the probabilities, dO the output gradient of one query head:
 *   dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dV = P^T dO,
 *   dQ = scale dS K,  dK = scale dS^T Q,
 * and a key/value head's dK, dV the sums over its group's query heads: the first
 * query head's GEMMs overwrite them (beta 0), the others add (beta 1), in head order.
 * dS lives in the query head's T*T slice of the scratch. */
void ts_cpu_attention_backward(void *dqkv_, void *scratch_, const void *dout_, const void *qkv_,
                               const void *att_, int B, int T, int NH, int NKV, int HS)
{
    TS_ASSERT(NKV > 0 && NH % NKV == 0);
    float *dqkv = dqkv_;
    float *scratch = scratch_;
    const float *dout = dout_;
    const float *qkv = qkv_;
    const float *att = att_;
    const int C = NH * HS, CKV = NKV * HS, C3 = C + 2 * CKV, group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for schedule(static)
    for (int bg = 0; bg < B * NKV; bg++) {
        int b = bg / NKV, g = bg % NKV;
        size_t row = (size_t)b * T * C3, kvoff = row + C + (size_t)g * HS;
        const float *k = qkv + kvoff, *v = k + CKV;
        float *dk = dqkv + kvoff, *dv = dk + CKV;
        for (int h = g * group; h < (g + 1) * group; h++) {
            const int bh = b * NH + h;
            const float beta = h == g * group ? 0.0f : 1.0f; /* the group's first overwrites */
            const float *q = qkv + row + (size_t)h * HS;
            float *dq = dqkv + row + (size_t)h * HS;
            const float *p = att + (size_t)bh * T * T;
            const float *dO = dout + (size_t)b * T * C + (size_t)h * HS;
            float *ds = scratch + (size_t)bh * T * T;
            for (int i0 = 0; i0 < T; i0 += TS_ATT_BLOCK) {
                int i1 = i0 + TS_ATT_BLOCK < T ? i0 + TS_ATT_BLOCK : T, m = i1 - i0;
                /* dP[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, i1, HS, 1.0f,
                            dO + (size_t)i0 * C, C, v, C3, 0.0f, ds + (size_t)i0 * T, T);
                /* Softmax backward, row by row; zero the rest of the block's columns. */
                for (int i = i0; i < i1; i++)
                    causal_softmax_backward_row(ds + (size_t)i * T, p + (size_t)i * T, i, i1);
                /* dQ[i0:i1] = scale dS[i0:i1, 0:i1] K[0:i1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, i1, scale,
                            ds + (size_t)i0 * T, T, k, C3, 0.0f, dq + (size_t)i0 * C3, C3);
            }
            /* Key/value rows [j0, j1) receive from query rows i >= j0 only. */
            for (int j0 = 0; j0 < T; j0 += TS_ATT_BLOCK) {
                int j1 = j0 + TS_ATT_BLOCK < T ? j0 + TS_ATT_BLOCK : T, m = j1 - j0;
                size_t corner = (size_t)j0 * T + j0;
                /* dK[j0:j1] (+)= scale dS[j0:T, j0:j1]^T Q[j0:T] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, HS, T - j0, scale,
                            ds + corner, T, q + (size_t)j0 * C3, C3, beta, dk + (size_t)j0 * C3,
                            C3);
                /* dV[j0:j1] (+)= P[j0:T, j0:j1]^T dO[j0:T] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, HS, T - j0, 1.0f,
                            p + corner, T, dO + (size_t)j0 * C, C, beta, dv + (size_t)j0 * C3,
                            C3);
            }
        }
    }
}
