/* The mixture-of-experts dispatch (kernels.h, "mixture of experts"): token rows copied
 * into expert order (moe_permute) and summed back with the routing weights
 * (moe_combine), and their backwards. One body per kernel for both storage types
 * (storage.h): rows are copied as stored (no rounding), and every sum over a token's K
 * rows runs in fp32 in k order with one rounding on store, in chunks of TS_BF16_CHUNK
 * for bf16 and whole rows for fp32. Rows are independent (row_of is a permutation), so
 * any thread count gives the same bits. */
#include <stdlib.h>

#include "core/error.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* The stable counting sort: row_of[n*K+k] = offsets[e] + the number of earlier
 * assignments (in n, then k order) to the same expert e, or TS_MOE_DROPPED for a dropped
 * one (no row). One pass in assignment order (N*K steps); the rows' copies then run in
 * parallel. */
static void moe_permute(ts_dtype t, void *xp, int *row_of, const void *x, const int *topk_idx,
                        const int *offsets, int N, int K, int C, int E)
{
    const size_t NK = (size_t)N * K, bytes = (size_t)C * ts_dtype_bytes(t);
    int *next = ts_malloc((size_t)E * sizeof *next);
    for (int e = 0; e < E; e++) next[e] = offsets[e];
    for (size_t a = 0; a < NK; a++) {
        const int e = topk_idx[a];
        if (e == TS_MOE_DROPPED) {
            row_of[a] = TS_MOE_DROPPED;
            continue;
        }
        TS_ASSERT(e >= 0 && e < E);
        /* offsets from this topk_idx's counts keep every expert inside its own range */
        TS_ASSERT(next[e] >= 0 && (size_t)next[e] < NK && (e + 1 == E || next[e] < offsets[e + 1]));
        row_of[a] = next[e]++;
    }
    free(next);
#pragma omp parallel for schedule(static)
    for (long long a = 0; a < (long long)NK; a++)
        if (row_of[a] != TS_MOE_DROPPED)
            memcpy((char *)xp + (size_t)row_of[a] * bytes,
                   (const char *)x + (size_t)(a / K) * bytes, bytes);
}

/* out[n] = sum_k w[n,k] src[row_of[n*K+k]] (w NULL: weights 1, moe_permute_backward's
 * plain sum) over the kept k (row_of not TS_MOE_DROPPED). The first kept term is stored,
 * not added to a zero, so a single k gives the product itself (and a row with none kept
 * is 0). */
static void weighted_row_sum(ts_dtype t, void *out, const void *src, const float *w,
                             const int *row_of, int N, int K, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float ob[TS_BF16_CHUNK], yb[TS_BF16_CHUNK];
        const size_t orow = (size_t)n * C;
        for (int c0 = 0, m; c0 < C; c0 += m) {
            m = (int)ts_cpu_chunk(t, (size_t)(C - c0));
            float *o = ts_cpu_out(t, ob, out, orow + c0);
            bool first = true;
            for (int k = 0; k < K; k++) {
                const size_t a = (size_t)n * K + k;
                if (row_of[a] == TS_MOE_DROPPED) continue;
                const float *y = ts_cpu_load(t, yb, src, (size_t)row_of[a] * C + c0, (size_t)m);
                const float wk = w ? w[a] : 1.0f;
                if (first) {
#pragma omp simd
                    for (int c = 0; c < m; c++) o[c] = wk * y[c];
                } else {
#pragma omp simd
                    for (int c = 0; c < m; c++) o[c] += wk * y[c];
                }
                first = false;
            }
            if (first) memset(o, 0, (size_t)m * sizeof *o); /* every k dropped */
            ts_cpu_store(t, out, orow + c0, o, (size_t)m);
        }
    }
}

/* dyp[row] = w dout[n]; dtopk_w[n,k] = <dout[n], yp[row]>: fp32 partial sums over
 * TS_BF16_CHUNK-wide pieces of the row (vectorised), added in double, the same pieces in
 * both storage types. */
static void moe_combine_backward(ts_dtype t, void *dyp, float *dtopk_w, const void *dout,
                                 const void *yp, const float *topk_w, const int *row_of, int N,
                                 int K, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float db[TS_BF16_CHUNK], yb[TS_BF16_CHUNK], gb[TS_BF16_CHUNK];
        for (int k = 0; k < K; k++) {
            const size_t a = (size_t)n * K + k;
            if (row_of[a] == TS_MOE_DROPPED) { /* no row, no contribution: no gradient */
                dtopk_w[a] = 0.0f;
                continue;
            }
            const size_t row = (size_t)row_of[a] * C;
            const float wk = topk_w[a];
            double dot = 0.0;
            for (int c0 = 0; c0 < C; c0 += TS_BF16_CHUNK) {
                const int m = C - c0 < TS_BF16_CHUNK ? C - c0 : TS_BF16_CHUNK;
                const float *d = ts_cpu_load(t, db, dout, (size_t)n * C + c0, (size_t)m);
                const float *y = ts_cpu_load(t, yb, yp, row + c0, (size_t)m);
                float part = 0.0f;
#pragma omp simd reduction(+ : part)
                for (int c = 0; c < m; c++) part += d[c] * y[c];
                dot += part;
                float *g = ts_cpu_out(t, gb, dyp, row + c0);
#pragma omp simd
                for (int c = 0; c < m; c++) g[c] = wk * d[c];
                ts_cpu_store(t, dyp, row + c0, g, (size_t)m);
            }
            dtopk_w[a] = (float)dot;
        }
    }
}

void ts_cpu_moe_permute(void *xp, int *row_of, const void *x, const int *topk_idx,
                        const int *offsets, int N, int K, int C, int E)
{
    moe_permute(TS_DTYPE_F32, xp, row_of, x, topk_idx, offsets, N, K, C, E);
}

void ts_cpu_bf16_moe_permute(void *xp, int *row_of, const void *x, const int *topk_idx,
                             const int *offsets, int N, int K, int C, int E)
{
    moe_permute(TS_DTYPE_BF16, xp, row_of, x, topk_idx, offsets, N, K, C, E);
}

void ts_cpu_moe_combine(void *out, const void *yp, const float *topk_w, const int *row_of, int N,
                        int K, int C)
{
    TS_ASSERT(topk_w != NULL);
    weighted_row_sum(TS_DTYPE_F32, out, yp, topk_w, row_of, N, K, C);
}

void ts_cpu_bf16_moe_combine(void *out, const void *yp, const float *topk_w, const int *row_of,
                             int N, int K, int C)
{
    TS_ASSERT(topk_w != NULL);
    weighted_row_sum(TS_DTYPE_BF16, out, yp, topk_w, row_of, N, K, C);
}

void ts_cpu_moe_combine_backward(void *dyp, float *dtopk_w, const void *dout, const void *yp,
                                 const float *topk_w, const int *row_of, int N, int K, int C)
{
    moe_combine_backward(TS_DTYPE_F32, dyp, dtopk_w, dout, yp, topk_w, row_of, N, K, C);
}

void ts_cpu_bf16_moe_combine_backward(void *dyp, float *dtopk_w, const void *dout, const void *yp,
                                      const float *topk_w, const int *row_of, int N, int K, int C)
{
    moe_combine_backward(TS_DTYPE_BF16, dyp, dtopk_w, dout, yp, topk_w, row_of, N, K, C);
}

void ts_cpu_moe_permute_backward(void *dx, const void *dxp, const int *row_of, int N, int K, int C)
{
    weighted_row_sum(TS_DTYPE_F32, dx, dxp, NULL, row_of, N, K, C);
}

void ts_cpu_bf16_moe_permute_backward(void *dx, const void *dxp, const int *row_of, int N, int K,
                                      int C)
{
    weighted_row_sum(TS_DTYPE_BF16, dx, dxp, NULL, row_of, N, K, C);
}
