/* The row-level pieces of the CPU attention kernels (attention.c, attention_bf16.c), in
 * fp32, shared so the fp32 and bf16 kernels mask, pad and block alike. Header-only
 * (static inline); it defines:
 *
 *   TS_ATT_SM_LANES          the softmax rows' lane count (rows padded to a multiple)
 *   ts_att_block_end(...)    where a block of query rows ends, aligned to key blocks
 *   ts_att_softmax_span(...)  one row's softmax over its visible keys, in place
 *   ts_att_softmax_backward_span(...)   one row of its backward, in place
 *
 * The causal mask is bottom-right aligned: with Tq queries the last Tq positions of Tk
 * keys, query row i sits at key position i + off, off = Tk - Tq, and attends keys
 * [0, i + off] (off = 0: the square causal mask of attention_forward; off > 0: a chunk
 * of queries against the key/value prefix that ends with it, context parallelism's
 * attention_prefix_forward). */
#ifndef TS_KERNELS_CPU_ATTENTION_ROWS_H
#define TS_KERNELS_CPU_ATTENTION_ROWS_H

#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* The softmax rows work in blocks of 16 lanes with no ragged tail: a row of n live
 * entries is padded to a multiple of 16 (with -inf going in, exp(-inf) = 0 coming out),
 * which fits inside the row's block of columns (blocks end at multiples of the block
 * size, a multiple of 16, or at Tk). Per-row loop tails otherwise cost about as much as
 * the arithmetic at T = 256. */
#define TS_ATT_SM_LANES 16

/* The end of the block of query rows that starts at row i0: query rows are blocked by
 * their KEY positions, [p0, p0 + block) with p0 a multiple of `block`, so the block
 * attends keys [0, i1 + off) whose end is a multiple of `block` (or Tk). Key blocks on
 * the same grid then only meet query blocks whose columns they lie inside: a key block
 * [j0, j1) is read by query rows i >= j0 - off, whose blocks' columns reach j1 (the
 * backward's dK, dV GEMMs read no unwritten dS). off = 0: blocks [i0, i0 + block). */
static inline int ts_att_block_end(int i0, int off, int Tq, int block)
{
    int i1 = ((i0 + off) / block + 1) * block - off;
    return i1 < Tq ? i1 : Tq;
}

/* One softmax row in place over its live keys s[lo..n) (lo: the row's document start,
 * 0 without document masks; n: one past its last visible key): s[lo..n) ->
 * probabilities, s[n..end) -> exactly 0; s[0..lo) is not touched (the caller's). The
 * lanes are padded from lo inside [lo, end). */
static inline void ts_att_softmax_span(float *s, int lo, int n, int end)
{
    int padded = lo + (n - lo + TS_ATT_SM_LANES - 1) / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    if (padded > end) padded = n; /* the last rows of an end that is not a multiple of 16 */
    for (int j = n; j < padded; j++) s[j] = -INFINITY;
    float *r = s + lo;
    const int live = padded - lo, blocked = live / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    float mx = ts_cpu_max(r, live), lane[TS_ATT_SM_LANES] = {0};
    for (int j = 0; j < blocked; j += TS_ATT_SM_LANES)
        for (int l = 0; l < TS_ATT_SM_LANES; l++) {
            float e = ts_cpu_expf(r[j + l] - mx);
            r[j + l] = e;
            lane[l] += e;
        }
    float sum = 0.0f;
    for (int l = 0; l < TS_ATT_SM_LANES; l++) sum += lane[l];
    for (int j = blocked; j < live; j++) {
        float e = ts_cpu_expf(r[j] - mx);
        r[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < live; j++) r[j] *= inv;
    memset(s + padded, 0, (size_t)(end - padded) * sizeof(float));
}

/* The backward of ts_att_softmax_span's row in place: dr[j] = p[j] (dr[j] - sum_j p[j]
 * dr[j]) for lo <= j < n, 0 for n <= j < end (the end of the row's block of columns);
 * dr[0..lo) is not touched. p is 0 where masked and dr holds finite products over
 * [lo, end), so the padded lanes add exact zeros. */
static inline void ts_att_softmax_backward_span(float *dr, const float *p, int lo, int n,
                                                int end)
{
    int padded = lo + (n - lo + TS_ATT_SM_LANES - 1) / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    if (padded > end) padded = n;
    const int live = padded - lo, blocked = live / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    float *r = dr + lo;
    const float *q = p + lo;
    float lane[TS_ATT_SM_LANES] = {0};
    for (int j = 0; j < blocked; j += TS_ATT_SM_LANES)
        for (int l = 0; l < TS_ATT_SM_LANES; l++) lane[l] += q[j + l] * r[j + l];
    float dot = 0.0f;
    for (int l = 0; l < TS_ATT_SM_LANES; l++) dot += lane[l];
    for (int j = blocked; j < live; j++) dot += q[j] * r[j];
    for (int j = 0; j < live; j++) r[j] = q[j] * (r[j] - dot);
    memset(dr + padded, 0, (size_t)(end - padded) * sizeof(float));
}

/* ---- document masks (kernels.h ts_att_heads.doc_start) ----
 * Row i (of one batch's Tq queries) attends keys [ds[i], i + off]; ds NULL: from 0. ds
 * is non-decreasing, so a block of rows [i0, i1) needs keys from ds[i0] on: its scores
 * are computed from the key-block boundary at or below it (ts_att_doc_cols), so that a
 * key block [j0, j0 + block) read by the backward lies inside the columns of every row
 * block that attends it. */
static inline int ts_att_doc_lo(const int *ds, int i) { return ds ? ds[i] : 0; }
static inline int ts_att_doc_cols(const int *ds, int i0, int block)
{
    return ds ? ds[i0] / block * block : 0;
}
/* One past the last query row that attends a key in [.., j1): the rows from there on
 * start their documents at or after j1 (Tq without masks). */
static inline int ts_att_doc_rows_end(const int *ds, int Tq, int j1)
{
    if (!ds) return Tq;
    int lo = 0, hi = Tq; /* the first i with ds[i] >= j1 */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (ds[mid] >= j1)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

#endif
