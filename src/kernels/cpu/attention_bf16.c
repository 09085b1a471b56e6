/* Causal attention with NKV key/value heads on oneDNN bf16 GEMMs, as attention.c (its
 * semantics and structure: the reference): the forward one (batch, query head) pair
 * per OpenMP iteration, the backward one (batch, key/value head) pair walking its
 * group's query heads in order. Inside the parallel region oneDNN runs single-threaded
 * on the calling thread, so each pair is one thread's sequence of small GEMMs, and
 * results do not depend on the thread count.
 *
 * Precision: the scores S = scale Q K^T come out of the GEMM in fp32 into a per-thread
 * block of rows, the softmax runs in fp32 on them, and the probabilities are rounded
 * once to bf16 into `att` (the saved state, [B,NH,T,T]); O = P V reads those rounded
 * probabilities, so the backward sees exactly what the forward used. In the backward
 * dP = dO V^T is fp32 too; dS = P (dP - rowsum(dP P)) is computed in fp32 and rounded
 * to bf16 into the scratch (the GEMMs that read it take bf16 operands). A key/value
 * head's dK and dV sum over its query heads in fp32 (per-thread [T, HS] buffers the
 * GEMMs accumulate into) and are rounded to bf16 once, after the group's last head.
 *
 * Causality as attention.c: query rows in blocks of TS_ATT_BLOCK; block [i0, i1)
 * attends to keys [0, i1) only. 64 rows (not attention.c's 32) because a oneDNN call
 * costs more than an sgemm call: half the calls for the same work. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/dnnl_matmul.h"

#define TS_ATT_BLOCK 64
#define TS_SM_LANES 16
_Static_assert(TS_ATT_BLOCK % TS_SM_LANES == 0, "a padded row must stay inside its block");

/* att: the probabilities in bf16. */
size_t ts_cpu_bf16_attention_saved_bytes(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * T * sizeof(ts_bf16);
}

/* The backward's dS in bf16, [B,NH,T,T]; its fp32 rows are per-thread blocks. */
size_t ts_cpu_bf16_attention_scratch_bytes(int B, int T, int NH, int HS)
{
    (void)HS;
    return (size_t)B * NH * T * T * sizeof(ts_bf16);
}

/* Row i of the causal softmax in fp32, in place: s[0..i] -> probabilities, s[i+1..T)
 * -> 0. attention.c's function: rows padded to 16 lanes with -inf (no ragged tails). */
static void causal_softmax_row(float *s, int i, int T)
{
    int n = i + 1, padded = (n + TS_SM_LANES - 1) / TS_SM_LANES * TS_SM_LANES;
    if (padded > T) padded = n;
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

/* Row i of the softmax backward in fp32, in place: dr[j] = p[j] (dr[j] - sum p dr) for
 * j <= i, 0 for i < j < end (attention.c's function). */
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

void ts_cpu_bf16_attention_forward(void *out, void *att, const void *qkv, int B, int T, int NH,
                                   int NKV, int HS)
{
    TS_ASSERT(NKV > 0 && NH % NKV == 0);
    /* C3: a row of qkv, [NH q heads | NKV k heads | NKV v heads] */
    const int C = NH * HS, CKV = NKV * HS, C3 = C + 2 * CKV, group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel
    {
        float *s = ts_alloc_floats((size_t)TS_ATT_BLOCK * T); /* this thread's score rows */
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const ts_bf16 *row = (const ts_bf16 *)qkv + (size_t)b * T * C3;
            const ts_bf16 *q = row + (size_t)h * HS;
            const ts_bf16 *k = row + C + (size_t)(h / group) * HS, *v = k + CKV;
            ts_bf16 *a = (ts_bf16 *)att + (size_t)bh * T * T;
            ts_bf16 *o = (ts_bf16 *)out + (size_t)b * T * C + (size_t)h * HS;
            for (int i0 = 0; i0 < T; i0 += TS_ATT_BLOCK) {
                int i1 = i0 + TS_ATT_BLOCK < T ? i0 + TS_ATT_BLOCK : T, m = i1 - i0;
                /* S[0:m, 0:i1] (fp32) = scale Q[i0:i1] K[0:i1]^T */
                ts_dnnl_gemm gs = gemm(m, i1, HS, C3, 1, 1, C3, T, TS_DTYPE_F32, scale);
                ts_dnnl_matmul(&gs, s, q + (size_t)i0 * C3, k, NULL);
                for (int i = i0; i < i1; i++) {
                    float *row = s + (size_t)(i - i0) * T;
                    causal_softmax_row(row, i, T);
                    ts_f32_to_bf16_array(a + (size_t)i * T, row, (size_t)T);
                }
                /* O[i0:i1] = P[i0:i1, 0:i1] V[0:i1] */
                ts_dnnl_gemm go = gemm(m, HS, i1, T, 1, C3, 1, C, TS_DTYPE_BF16, 1.0f);
                ts_dnnl_matmul(&go, o + (size_t)i0 * C, a + (size_t)i0 * T, v, NULL);
            }
        }
        free(s);
    }
}

/* With P the probabilities, dO the output gradient of one query head:
 *   dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),  dV = P^T dO,
 *   dQ = scale dS K,  dK = scale dS^T Q,
 * dK and dV summed over the key/value head's query heads (the first overwrites the fp32
 * sums, the others accumulate, in head order), then rounded once into dqkv.
 * dS (bf16) lives in the query head's T*T slice of the scratch; row i holds [0, i1) of
 * its block, which is all the dK GEMMs read (rows below a key block reach its columns). */
void ts_cpu_bf16_attention_backward(void *dqkv, void *scratch, const void *dout, const void *qkv,
                                    const void *att, int B, int T, int NH, int NKV, int HS)
{
    TS_ASSERT(NKV > 0 && NH % NKV == 0);
    const int C = NH * HS, CKV = NKV * HS, C3 = C + 2 * CKV, group = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel
    {
        /* this thread's fp32 dP rows, one widened row of P, and the fp32 dK, dV sums */
        float *dp = ts_alloc_floats((size_t)(TS_ATT_BLOCK + 1) * T + 2 * (size_t)T * HS);
        float *prow = dp + (size_t)TS_ATT_BLOCK * T, *dk32 = prow + T;
        float *dv32 = dk32 + (size_t)T * HS;
#pragma omp for schedule(static)
        for (int bg = 0; bg < B * NKV; bg++) {
            int b = bg / NKV, g = bg % NKV;
            size_t row = (size_t)b * T * C3, kvoff = row + C + (size_t)g * HS;
            const ts_bf16 *k = (const ts_bf16 *)qkv + kvoff, *v = k + CKV;
            ts_bf16 *dk = (ts_bf16 *)dqkv + kvoff, *dv = dk + CKV;
            for (int h = g * group; h < (g + 1) * group; h++) {
                const int bh = b * NH + h;
                const bool acc = h != g * group; /* the group's first overwrites */
                const ts_bf16 *q = (const ts_bf16 *)qkv + row + (size_t)h * HS;
                ts_bf16 *dq = (ts_bf16 *)dqkv + row + (size_t)h * HS;
                const ts_bf16 *p = (const ts_bf16 *)att + (size_t)bh * T * T;
                const ts_bf16 *dO = (const ts_bf16 *)dout + (size_t)b * T * C + (size_t)h * HS;
                ts_bf16 *ds = (ts_bf16 *)scratch + (size_t)bh * T * T;
                for (int i0 = 0; i0 < T; i0 += TS_ATT_BLOCK) {
                    int i1 = i0 + TS_ATT_BLOCK < T ? i0 + TS_ATT_BLOCK : T, m = i1 - i0;
                    /* dP[0:m, 0:i1] (fp32) = dO[i0:i1] V[0:i1]^T */
                    ts_dnnl_gemm gp = gemm(m, i1, HS, C, 1, 1, C3, T, TS_DTYPE_F32, 1.0f);
                    ts_dnnl_matmul(&gp, dp, dO + (size_t)i0 * C, v, NULL);
                    for (int i = i0; i < i1; i++) {
                        float *dr = dp + (size_t)(i - i0) * T;
                        ts_bf16_to_f32_array(prow, p + (size_t)i * T, (size_t)i1);
                        causal_softmax_backward_row(dr, prow, i, i1);
                        ts_f32_to_bf16_array(ds + (size_t)i * T, dr, (size_t)i1);
                    }
                    /* dQ[i0:i1] = scale dS[i0:i1, 0:i1] K[0:i1] */
                    ts_dnnl_gemm gq = gemm(m, HS, i1, T, 1, C3, 1, C3, TS_DTYPE_BF16, scale);
                    ts_dnnl_matmul(&gq, dq + (size_t)i0 * C3, ds + (size_t)i0 * T, k, NULL);
                }
                /* Key/value rows [j0, j1) receive from query rows i >= j0 only. */
                for (int j0 = 0; j0 < T; j0 += TS_ATT_BLOCK) {
                    int j1 = j0 + TS_ATT_BLOCK < T ? j0 + TS_ATT_BLOCK : T, m = j1 - j0;
                    size_t corner = (size_t)j0 * T + j0;
                    /* dK[j0:j1] (+)= scale dS[j0:T, j0:j1]^T Q[j0:T] (A transposed in place) */
                    ts_dnnl_gemm gk = gemm(m, HS, T - j0, 1, T, C3, 1, HS, TS_DTYPE_F32, scale);
                    gk.accumulate = acc;
                    ts_dnnl_matmul(&gk, dk32 + (size_t)j0 * HS, ds + corner, q + (size_t)j0 * C3,
                                   NULL);
                    /* dV[j0:j1] (+)= P[j0:T, j0:j1]^T dO[j0:T] */
                    ts_dnnl_gemm gv = gemm(m, HS, T - j0, 1, T, C, 1, HS, TS_DTYPE_F32, 1.0f);
                    gv.accumulate = acc;
                    ts_dnnl_matmul(&gv, dv32 + (size_t)j0 * HS, p + corner, dO + (size_t)j0 * C,
                                   NULL);
                }
            }
            for (int t = 0; t < T; t++) { /* one rounding of each sum */
                ts_f32_to_bf16_array(dk + (size_t)t * C3, dk32 + (size_t)t * HS, (size_t)HS);
                ts_f32_to_bf16_array(dv + (size_t)t * C3, dv32 + (size_t)t * HS, (size_t)HS);
            }
        }
        free(dp);
    }
}
