/* The row-level pieces of the CPU attention kernels (attention.c, attention_bf16.c), in
 * fp32, shared so the fp32 and bf16 kernels mask, pad and block alike. Header-only
 * (static inline); it defines:
 *
 *   TS_ATT_SM_LANES          the softmax rows' lane count (rows padded to a multiple)
 *   ts_att_block_end(...)    where a block of query rows ends, aligned to key blocks
 *   ts_att_softmax_row(...)  one row of the causal softmax, in place
 *   ts_att_softmax_backward_row(...)   one row of its backward, in place
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

/* Query row i of the causal softmax in place, with the mask offset off: s[0..i+off] ->
 * probabilities, s[i+off+1..Tk) -> exactly 0. */
static inline void ts_att_softmax_row(float *s, int i, int off, int Tk)
{
    int n = i + off + 1, padded = (n + TS_ATT_SM_LANES - 1) / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    if (padded > Tk) padded = n; /* the last rows of a Tk that is not a multiple of 16 */
    for (int j = n; j < padded; j++) s[j] = -INFINITY;
    int blocked = padded / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    float mx = ts_cpu_max(s, padded), lane[TS_ATT_SM_LANES] = {0};
    for (int j = 0; j < blocked; j += TS_ATT_SM_LANES)
        for (int l = 0; l < TS_ATT_SM_LANES; l++) {
            float e = ts_cpu_expf(s[j + l] - mx);
            s[j + l] = e;
            lane[l] += e;
        }
    float sum = 0.0f;
    for (int l = 0; l < TS_ATT_SM_LANES; l++) sum += lane[l];
    for (int j = blocked; j < padded; j++) {
        float e = ts_cpu_expf(s[j] - mx);
        s[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < padded; j++) s[j] *= inv;
    memset(s + padded, 0, (size_t)(Tk - padded) * sizeof(float));
}

/* Query row i of the softmax backward in place, mask offset off: dr[j] = p[j] (dr[j] -
 * sum_j p[j] dr[j]) for j <= i + off, 0 for i + off < j < end (the end of the row's
 * block of columns). p is 0 where masked and dr holds finite products up to end, so the
 * padded lanes add exact zeros. */
static inline void ts_att_softmax_backward_row(float *dr, const float *p, int i, int off,
                                               int end)
{
    int n = i + off + 1, padded = (n + TS_ATT_SM_LANES - 1) / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    if (padded > end) padded = n;
    int blocked = padded / TS_ATT_SM_LANES * TS_ATT_SM_LANES;
    float lane[TS_ATT_SM_LANES] = {0};
    for (int j = 0; j < blocked; j += TS_ATT_SM_LANES)
        for (int l = 0; l < TS_ATT_SM_LANES; l++) lane[l] += p[j + l] * dr[j + l];
    float dot = 0.0f;
    for (int l = 0; l < TS_ATT_SM_LANES; l++) dot += lane[l];
    for (int j = blocked; j < padded; j++) dot += p[j] * dr[j];
    for (int j = 0; j < padded; j++) dr[j] = p[j] * (dr[j] - dot);
    memset(dr + padded, 0, (size_t)(end - padded) * sizeof(float));
}

#endif
