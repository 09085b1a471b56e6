/* The device side of the flash-style attention (attention_flash.cu launches it): causal
 * attention over tiles of TILE queries x TILE keys in shared memory, fp32 tiles and
 * math, never a [T, T] matrix in global memory. Templates on the activation type A of
 * q, k, v, out, dout and dqkv in global memory (act.cuh): a tile load widens to fp32
 * (exact), every sum runs in fp32, and each output element is rounded once when it is
 * stored; the log-sum-exp and D rows are fp32 for either type.
 *
 * One block of TS_FLASH_THREADS threads per (tile, sequence b, query head h) in the
 * forward and the dQ pass, per (key tile, sequence b, kv head j) in the dK, dV pass.
 * Grouped-query attention: NKV key/value heads, query head h reading kv head
 * h / (NH / NKV) (NKV = NH: multi-head). q and k heads have HS channels, v heads (and so
 * out, dout) HSV (kernels.h ts_att_heads; MLA's q/k heads are wider than its v heads).
 * A head's q, k, v, out, dout, dq, dk, dv rows are read and written in place in the
 * [B, T, C3] and [B, T, C] layouts (C = NH * HSV, C3 = NH * HS + NKV * (HS + HSV): each
 * qkv row holds the NH q heads, the NKV k heads, the NKV v heads). Every tile load
 * checks the row against T and zero fills the rest, so T need not be a multiple of
 * TILE; HS and HSV are runtime values (any 1..TS_FLASH_MAX_HS: loops over d < HS or
 * HSV, no vector loads, so no alignment assumption).
 *
 * Packed documents (kernels.h ts_att_heads.doc_start: device int32 [B, T], query t's first
 * visible key, non-decreasing along t): query t attends keys [doc_start[t], t]. A query
 * tile [q0, q0 + TILE) needs keys from doc_start[q0] on only, so the forward and the dQ
 * pass start their key loop at the tile holding it, and the dK, dV pass stops its query
 * loop at the first query tile whose first row starts after the key tile: the masked
 * tiles are never loaded nor multiplied (the work is ~ sum L_i^2 over the documents, not
 * T^2). Inside the tiles that straddle a document start, the scores of keys before a
 * row's start are masked like those above the diagonal (the rows' starts sit in shared
 * memory beside the row statistics). doc_start NULL: plain causal, the same bits as
 * before documents existed (every start 0).
 *
 * Deterministic: every output element is written by exactly one thread of one block,
 * each sum runs in a fixed order (no atomics), so repeated runs give the same bits. A kv
 * head's dK and dV sum over its query heads inside its one block, head after head.
 *
 * Kept apart from the launches so the same source can be checked off the GPU. */
#ifndef TS_KERNELS_CUDA_ATTENTION_FLASH_KERNELS_CUH
#define TS_KERNELS_CUDA_ATTENTION_FLASH_KERNELS_CUH

#include <math.h>
#include <stddef.h>

#include "kernels/cuda/act.cuh"
#include "kernels/cuda/reduce.cuh"

#define TS_FLASH_THREADS 128 /* 4 warps per block */
#define TS_FLASH_MAX_HS 256  /* larger heads: the batched-GEMM attention */

/* Row stride of a [TILE, HS] tile in shared memory: odd, so the 32 lanes of a warp
 * reading one column of 32 different rows hit 32 different banks. */
static __host__ __device__ __forceinline__ int flash_ld(int HS) { return HS % 2 ? HS : HS + 1; }

/* Shared memory of each kernel, in floats (the launches and the kernels' carving below
 * must agree: both use these). Q and K tiles are HS wide, V and dO tiles HSV. */
static __host__ __device__ __forceinline__ size_t flash_fwd_smem_floats(int tile, int HS,
                                                                        int HSV)
{
    /* Q, K, V tiles; scores [tile, tile+1]; O accumulator [tile, HSV]; m, l, alpha; the
     * rows' document starts (int32, one float slot each) */
    return (size_t)2 * tile * flash_ld(HS) + (size_t)tile * flash_ld(HSV) +
           (size_t)tile * (tile + 1) + (size_t)tile * HSV + 4 * (size_t)tile;
}
static __host__ __device__ __forceinline__ size_t flash_dkv_smem_floats(int tile, int HS,
                                                                        int HSV)
{
    /* K, V, Q, dO tiles; dK, dV accumulators; P and dS [tile, tile+1]; lse, D, the query
     * rows' document starts */
    return (size_t)2 * tile * flash_ld(HS) + (size_t)2 * tile * flash_ld(HSV) +
           (size_t)tile * (HS + HSV) + (size_t)2 * tile * (tile + 1) + 3 * (size_t)tile;
}
static __host__ __device__ __forceinline__ size_t flash_dq_smem_floats(int tile, int HS, int HSV)
{
    /* Q, dO, K, V tiles; dQ accumulator; dS [tile, tile+1]; lse, D, the rows' document
     * starts */
    return (size_t)2 * tile * flash_ld(HS) + (size_t)2 * tile * flash_ld(HSV) +
           (size_t)tile * HS + (size_t)tile * (tile + 1) + 3 * (size_t)tile;
}

/* Where block `blk` works: its (b, head) pair and tile index, over BH pairs. The tiles of
 * the most work (the last query tiles, which see the most keys; the first key tiles,
 * which see the most queries) go first, so the short ones fill in at the end.
 * `heavy_last`: tile index n-1 is the heaviest (query tiles), else tile 0 is. */
struct flash_where {
    int bh, tile;
};
static __device__ __forceinline__ flash_where flash_block(unsigned blk, int BH, int ntiles,
                                                          bool heavy_last)
{
    flash_where w;
    int rank = (int)(blk / (unsigned)BH); /* 0 = heaviest */
    w.bh = (int)(blk % (unsigned)BH);
    w.tile = heavy_last ? ntiles - 1 - rank : rank;
    return w;
}

/* Query head h of sequence b, with its kv head j = h / (NH / NKV), and where they start
 * in each layout: the q rows (row t at q + t * C3; dq at offq in dqkv), the kv head's k
 * and v rows (dk, dv at offk, offv), the dout rows (g + t * C; out at off1), the head's
 * lse and delta values at offr. r0: the first row of the block's tile; b its sequence. */
template <typename A> struct flash_head {
    int r0, b;
    int C, LD, LDV; /* NH * HSV; flash_ld(HS); flash_ld(HSV) */
    size_t C3, offq, offk, offv, off1, offr;
    const A *q, *k, *v, *g; /* g: NULL without dout */
};
template <typename A>
static __device__ __forceinline__ flash_head<A> flash_head_at(const A *qkv, const A *dout, int b,
                                                              int h, int r0, int T, int NH,
                                                              int NKV, int HS, int HSV)
{
    const int j = h / (NH / NKV);
    flash_head<A> f;
    f.r0 = r0;
    f.b = b;
    f.C = NH * HSV;
    f.LD = flash_ld(HS);
    f.LDV = flash_ld(HSV);
    f.C3 = (size_t)NH * HS + (size_t)NKV * (HS + HSV);
    const size_t seq = (size_t)b * T * f.C3;
    f.offq = seq + (size_t)h * HS;
    f.offk = seq + (size_t)(NH + j) * HS;
    f.offv = seq + (size_t)(NH + NKV) * HS + (size_t)j * HSV;
    f.off1 = (size_t)b * T * f.C + (size_t)h * HSV;
    f.offr = ((size_t)b * NH + h) * T;
    f.q = qkv + f.offq, f.k = qkv + f.offk, f.v = qkv + f.offv;
    f.g = dout ? dout + f.off1 : NULL;
    return f;
}

/* The query head and tile of a block of the forward or the dQ pass (B * NH pairs, the
 * last query tiles first). */
template <int TILE, typename A>
static __device__ __forceinline__ flash_head<A> flash_head_of(const A *qkv, const A *dout, int B,
                                                              int T, int NH, int NKV, int HS,
                                                              int HSV)
{
    const flash_where w = flash_block(blockIdx.x, B * NH, (T + TILE - 1) / TILE, true);
    return flash_head_at(qkv, dout, w.bh / NH, w.bh % NH, w.tile * TILE, T, NH, NKV, HS, HSV);
}

/* Rows [r0, r0 + TILE) of one head's [T, HS] matrix (row t at base + t * ld; HS the
 * head's width, HS or HSV) into a shared tile with row stride LD; rows at or past T read
 * as zeros. */
template <int TILE, typename A>
static __device__ __forceinline__ void flash_load(float *tile, int LD, const A *base, size_t ld,
                                                  int r0, int T, int HS)
{
    for (int idx = threadIdx.x; idx < TILE * HS; idx += TS_FLASH_THREADS) {
        int i = idx / HS, d = idx % HS, t = r0 + i;
        tile[i * LD + d] = t < T ? ts_act_load(base, (size_t)t * ld + d) : 0.0f;
    }
}

/* The first visible key of query rows [q0, q0 + TILE) of sequence b (ts_att_heads's
 * doc_start, device int32 [B, T]; NULL: 0, causal) into sDs; rows at or past T get 0
 * (they are never stored). */
template <int TILE>
static __device__ __forceinline__ void flash_load_doc_starts(int *sDs, const int *doc_start,
                                                             int b, int q0, int T)
{
    for (int i = threadIdx.x; i < TILE; i += TS_FLASH_THREADS)
        sDs[i] = doc_start && q0 + i < T ? doc_start[(size_t)b * T + q0 + i] : 0;
}

/* The first key tile a query tile starting at q0 (< T) needs: the tile holding its first
 * row's document start (the starts do not decrease along t), 0 without documents. */
template <int TILE>
static __device__ __forceinline__ int flash_first_key_tile(const int *doc_start, int b, int q0,
                                                           int T)
{
    return doc_start ? doc_start[(size_t)b * T + q0] / TILE * TILE : 0;
}

/* Whether any query of the tile starting at q0 (< T) sees a key at or before kmax: its
 * first row's document start is the tile's smallest (non-decreasing along t), and a
 * later tile's first start is no smaller, so the first tile that fails ends the loop. */
static __device__ __forceinline__ bool flash_tile_sees(const int *doc_start, int b, int q0,
                                                       int T, int kmax)
{
    return !doc_start || doc_start[(size_t)b * T + q0] <= kmax;
}

/* The lse and D values of query rows [q0, q0 + TILE) (rl, rd: the head's rows of lse
 * and delta) and the rows' document starts (flash_load_doc_starts) into shared memory;
 * rows at or past T read as zeros. */
template <int TILE>
static __device__ __forceinline__ void flash_load_row_stats(float *sLse, float *sD, int *sDs,
                                                            const float *rl, const float *rd,
                                                            const int *doc_start, int b,
                                                            int q0, int T)
{
    for (int i = threadIdx.x; i < TILE; i += TS_FLASH_THREADS) {
        sLse[i] = q0 + i < T ? rl[q0 + i] : 0.0f;
        sD[i] = q0 + i < T ? rd[q0 + i] : 0.0f;
    }
    flash_load_doc_starts<TILE>(sDs, doc_start, b, q0, T);
}

/* Rows [r0, r0 + TILE) of one head's [T, HS] matrix (row t at base + t * ld) from a
 * [TILE, HS] accumulator times `scale`; rows at or past T are not written. */
template <int TILE, typename A>
static __device__ __forceinline__ void flash_store(A *base, size_t ld, const float *acc,
                                                   float scale, int r0, int T, int HS)
{
    for (int idx = threadIdx.x; idx < TILE * HS; idx += TS_FLASH_THREADS) {
        int i = idx / HS, d = idx % HS, t = r0 + i;
        if (t < T) ts_act_store(base, (size_t)t * ld + d, acc[idx] * scale);
    }
}

/* sum over r < n of a[r * sa] * b[r * sb], in r order: every product of two shared
 * tiles here, one element at a time. A score q.k: two rows (strides 1, n = HS; dO.v:
 * n = HSV); an element (i, d) of S X (S a [TILE, TILE] score tile, row stride TILE + 1;
 * X a [TILE, HS or HSV] tile, row stride LD or LDV): row i of S down column d of X
 * (n = TILE); of S^T X: column j of S (stride TILE + 1) down column d of X. */
static __device__ __forceinline__ float flash_dot(const float *a, int sa, const float *b, int sb,
                                                  int n)
{
    float s = 0.0f;
    for (int r = 0; r < n; r++) s += a[r * sa] * b[r * sb];
    return s;
}

/* Forward for one query tile: O = softmax(scale Q K^T + causal mask) V, online over the
 * key tiles from the one holding the tile's first document start (0 without documents)
 * to the diagonal, keeping each row's running max m and sum l (the rescaling by
 * alpha = exp(m_old - m_new) of FlashAttention). Writes out and lse = m + log l, or,
 * with DELTA, only delta[t] = dout[t] . out[t] (the backward's D, recomputed from
 * q, k, v since the backward is not given `out`). */
template <int TILE, bool DELTA, typename A>
static __global__ void __launch_bounds__(TS_FLASH_THREADS)
    flash_forward_kernel(A *out, float *lse, const A *dout, float *delta, const A *qkv, int B,
                         int T, int NH, int NKV, int HS, int HSV, float scale,
                         const int *doc_start)
{
    static_assert(TILE <= 32 && TILE % 8 == 0, "a score row is one warp's lanes");
    const flash_head<A> f = flash_head_of<TILE>(qkv, dout, B, T, NH, NKV, HS, HSV);
    const int q0 = f.r0, C = f.C, LD = f.LD, LDV = f.LDV, LS = TILE + 1;
    const size_t C3 = f.C3;
    const A *q = f.q, *k = f.k, *v = f.v;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    extern __shared__ float ts_flash_smem[];
    float *sQ = ts_flash_smem, *sK = sQ + TILE * LD, *sV = sK + TILE * LD;
    float *sS = sV + TILE * LDV, *sO = sS + TILE * LS, *sM = sO + TILE * HSV;
    float *sL = sM + TILE, *sA = sL + TILE;
    int *sDs = (int *)(sA + TILE); /* the rows' document starts */

    flash_load<TILE>(sQ, LD, q, C3, q0, T, HS);
    flash_load_doc_starts<TILE>(sDs, doc_start, f.b, q0, T);
    for (int idx = tid; idx < TILE * HSV; idx += TS_FLASH_THREADS) sO[idx] = 0.0f;
    for (int i = tid; i < TILE; i += TS_FLASH_THREADS) {
        sM[i] = -INFINITY;
        sL[i] = 0.0f;
    }
    /* Query rows q0..q0+TILE-1 see keys doc_start[q0]..q0+TILE-1 (and < T); the key tiles
     * before the one holding doc_start[q0] are all masked for every row: skipped. */
    const int kend = min(T, q0 + TILE);
    for (int k0 = flash_first_key_tile<TILE>(doc_start, f.b, q0, T); k0 < kend; k0 += TILE) {
        __syncthreads(); /* the last tile's readers of sK, sV, sS are done (and sDs written) */
        flash_load<TILE>(sK, LD, k, C3, k0, T, HS);
        flash_load<TILE>(sV, LDV, v, C3, k0, T, HSV);
        __syncthreads();
        /* Scaled scores; -inf where masked (key after the query, before its document, or
         * past T). */
        for (int idx = tid; idx < TILE * TILE; idx += TS_FLASH_THREADS) {
            int i = idx / TILE, j = idx % TILE, tq = q0 + i, tk = k0 + j;
            float s = -INFINITY;
            if (tk <= tq && tk < T && tk >= sDs[i])
                s = flash_dot(sQ + i * LD, 1, sK + j * LD, 1, HS) * scale;
            sS[i * LS + j] = s;
        }
        __syncthreads();
        /* One warp per row: the tile's max, the new running max, p = exp(s - m_new). */
        for (int i = warp; i < TILE; i += TS_FLASH_THREADS / 32) {
            float s = lane < TILE ? sS[i * LS + lane] : -INFINITY;
            float m_old = sM[i], l_old = sL[i];
            float m_new = fmaxf(m_old, warp_max(s));
            /* m_new is finite once a row has seen its first key (key 0, or its document
             * start: a row whose document starts in a later tile than its tile's first
             * row's has only masked scores until then); the guard keeps such a row at
             * p = 0, alpha = 1. */
            bool none = m_new == -INFINITY;
            float p = none ? 0.0f : expf(s - m_new);
            float alpha = none ? 1.0f : expf(m_old - m_new);
            float psum = warp_sum(p);
            if (lane < TILE) sS[i * LS + lane] = p;
            if (lane == 0) {
                sM[i] = m_new;
                sL[i] = l_old * alpha + psum;
                sA[i] = alpha;
            }
        }
        __syncthreads();
        /* O = alpha O + P V (masked keys have p = 0 and zero-filled v rows). */
        for (int idx = tid; idx < TILE * HSV; idx += TS_FLASH_THREADS) {
            int i = idx / HSV, d = idx % HSV;
            sO[idx] = sO[idx] * sA[i] + flash_dot(sS + i * LS, 1, sV + d, LDV, TILE);
        }
    }
    __syncthreads();
    if (!DELTA) {
        A *o = out + f.off1;
        for (int idx = tid; idx < TILE * HSV; idx += TS_FLASH_THREADS) {
            int i = idx / HSV, d = idx % HSV, t = q0 + i;
            if (t < T) ts_act_store(o, (size_t)t * C + d, sO[idx] / sL[i]);
        }
        for (int i = tid; i < TILE; i += TS_FLASH_THREADS)
            if (q0 + i < T) lse[f.offr + q0 + i] = sM[i] + logf(sL[i]);
    } else {
        const A *g = f.g; /* D from the fp32 O recomputed here, not a rounded out */
        for (int i = warp; i < TILE; i += TS_FLASH_THREADS / 32) {
            int t = q0 + i;
            if (t >= T) continue; /* the whole warp skips the row together */
            float inv = 1.0f / sL[i], acc = 0.0f;
            for (int d = lane; d < HSV; d += 32)
                acc += ts_act_load(g, (size_t)t * C + d) * (sO[i * HSV + d] * inv);
            acc = warp_sum(acc);
            if (lane == 0) delta[f.offr + t] = acc;
        }
    }
}

/* The probabilities and dS of one (query tile, key tile) pair into sP / sdS (sP may be
 * NULL when not wanted): p = exp(scale q.k - lse) on and below the diagonal and from
 * the row's document start (sDs) on, dS = p (dO.v - D); zero where masked or past T.
 * sQ, sK rows are HS wide at stride LD; sdO, sV rows HSV wide at stride LDV. */
template <int TILE>
static __device__ __forceinline__ void flash_p_ds(float *sP, float *sdS, const float *sQ,
                                                  const float *sdO, const float *sK,
                                                  const float *sV, const float *sLse,
                                                  const float *sD, const int *sDs, int q0,
                                                  int k0, int T, int HS, int LD, int HSV,
                                                  int LDV, float scale)
{
    const int LS = TILE + 1;
    for (int idx = threadIdx.x; idx < TILE * TILE; idx += TS_FLASH_THREADS) {
        int i = idx / TILE, j = idx % TILE, tq = q0 + i, tk = k0 + j;
        float p = 0.0f, ds = 0.0f;
        if (tq < T && tk <= tq && tk >= sDs[i]) {
            float s = flash_dot(sQ + i * LD, 1, sK + j * LD, 1, HS);
            float dp = flash_dot(sdO + i * LDV, 1, sV + j * LDV, 1, HSV);
            p = expf(s * scale - sLse[i]);
            ds = p * (dp - sD[i]);
        }
        if (sP) sP[i * LS + j] = p;
        sdS[i * LS + j] = ds;
    }
}

/* dK and dV of one key tile of kv head j, over its G = NH / NKV query heads j G + g in
 * g order and, for each, the query tiles from the diagonal to the end (with documents, to
 * the last tile whose first row's document starts at or before the key tile's end):
 * dV = sum P^T dO, dK = scale sum dS^T Q. One block per (key tile, b, j), the tiles of
 * most work (the first) first. */
template <int TILE, typename A>
static __global__ void __launch_bounds__(TS_FLASH_THREADS)
    flash_backward_dkv_kernel(A *dqkv, const A *dout, const A *qkv, const float *lse,
                              const float *delta, int B, int T, int NH, int NKV, int HS,
                              int HSV, float scale, const int *doc_start)
{
    static_assert(TILE <= 32 && TILE % 8 == 0, "tiles of at most a warp's width");
    const int G = NH / NKV;
    const flash_where w = flash_block(blockIdx.x, B * NKV, (T + TILE - 1) / TILE, false);
    const int b = w.bh / NKV, j = w.bh % NKV, k0 = w.tile * TILE;
    /* the group's first query head: its kv head's k, v (the same for all of the group) */
    const flash_head<A> f0 = flash_head_at(qkv, dout, b, j * G, k0, T, NH, NKV, HS, HSV);
    const int C = f0.C, LD = f0.LD, LDV = f0.LDV, LS = TILE + 1, tid = threadIdx.x;

    extern __shared__ float ts_flash_smem[];
    float *sK = ts_flash_smem, *sV = sK + TILE * LD, *sQ = sV + TILE * LDV;
    float *sdO = sQ + TILE * LD, *sdK = sdO + TILE * LDV, *sdV = sdK + TILE * HS;
    float *sP = sdV + TILE * HSV, *sdS = sP + TILE * LS, *sLse = sdS + TILE * LS;
    float *sD = sLse + TILE;
    int *sDs = (int *)(sD + TILE); /* the query tile's rows' document starts */
    const int kmax = min(k0 + TILE, T) - 1; /* the key tile's last key */

    flash_load<TILE>(sK, LD, f0.k, f0.C3, k0, T, HS);
    flash_load<TILE>(sV, LDV, f0.v, f0.C3, k0, T, HSV);
    for (int idx = tid; idx < TILE * HS; idx += TS_FLASH_THREADS) sdK[idx] = 0.0f;
    for (int idx = tid; idx < TILE * HSV; idx += TS_FLASH_THREADS) sdV[idx] = 0.0f;
    for (int g = 0; g < G; g++) {
        const flash_head<A> f = flash_head_at(qkv, dout, b, j * G + g, k0, T, NH, NKV, HS, HSV);
        /* Key rows k0.. receive from query rows >= k0 only: query tiles from this one on,
         * up to the last one with a row whose document starts at or before kmax (every
         * thread reads the same start: the loop ends for the whole block at once). */
        for (int q0 = k0; q0 < T && flash_tile_sees(doc_start, b, q0, T, kmax); q0 += TILE) {
            __syncthreads(); /* the last tile's readers of sQ, sdO, sP, sdS are done */
            flash_load<TILE>(sQ, LD, f.q, f.C3, q0, T, HS);
            flash_load<TILE>(sdO, LDV, f.g, (size_t)C, q0, T, HSV);
            flash_load_row_stats<TILE>(sLse, sD, sDs, lse + f.offr, delta + f.offr, doc_start, b,
                                       q0, T);
            __syncthreads();
            flash_p_ds<TILE>(sP, sdS, sQ, sdO, sK, sV, sLse, sD, sDs, q0, k0, T, HS, LD, HSV, LDV,
                             scale);
            __syncthreads();
            for (int idx = tid; idx < TILE * HSV; idx += TS_FLASH_THREADS) {
                int jj = idx / HSV, d = idx % HSV;
                sdV[idx] += flash_dot(sP + jj, LS, sdO + d, LDV, TILE);
            }
            for (int idx = tid; idx < TILE * HS; idx += TS_FLASH_THREADS) {
                int jj = idx / HS, d = idx % HS;
                sdK[idx] += flash_dot(sdS + jj, LS, sQ + d, LD, TILE);
            }
        }
    }
    __syncthreads();
    flash_store<TILE>(dqkv + f0.offk, f0.C3, sdK, scale, k0, T, HS);
    flash_store<TILE>(dqkv + f0.offv, f0.C3, sdV, 1.0f, k0, T, HSV); /* x 1: exact */
}

/* dQ of one query tile, over the key tiles from the one holding its first row's document
 * start (0 without documents) to the diagonal: dQ = scale dS K. */
template <int TILE, typename A>
static __global__ void __launch_bounds__(TS_FLASH_THREADS)
    flash_backward_dq_kernel(A *dqkv, const A *dout, const A *qkv, const float *lse,
                             const float *delta, int B, int T, int NH, int NKV, int HS, int HSV,
                             float scale, const int *doc_start)
{
    static_assert(TILE <= 32 && TILE % 8 == 0, "tiles of at most a warp's width");
    const flash_head<A> f = flash_head_of<TILE>(qkv, dout, B, T, NH, NKV, HS, HSV);
    const int q0 = f.r0, C = f.C, LD = f.LD, LDV = f.LDV, LS = TILE + 1, tid = threadIdx.x;

    extern __shared__ float ts_flash_smem[];
    float *sQ = ts_flash_smem, *sdO = sQ + TILE * LD, *sK = sdO + TILE * LDV;
    float *sV = sK + TILE * LD, *sdQ = sV + TILE * LDV, *sdS = sdQ + TILE * HS;
    float *sLse = sdS + TILE * LS, *sD = sLse + TILE;
    int *sDs = (int *)(sD + TILE);

    flash_load<TILE>(sQ, LD, f.q, f.C3, q0, T, HS);
    flash_load<TILE>(sdO, LDV, f.g, (size_t)C, q0, T, HSV);
    flash_load_row_stats<TILE>(sLse, sD, sDs, lse + f.offr, delta + f.offr, doc_start, f.b, q0,
                               T);
    for (int idx = tid; idx < TILE * HS; idx += TS_FLASH_THREADS) sdQ[idx] = 0.0f;
    const int kend = min(T, q0 + TILE);
    for (int k0 = flash_first_key_tile<TILE>(doc_start, f.b, q0, T); k0 < kend; k0 += TILE) {
        __syncthreads(); /* the last tile's readers of sK, sdS are done */
        flash_load<TILE>(sK, LD, f.k, f.C3, k0, T, HS);
        flash_load<TILE>(sV, LDV, f.v, f.C3, k0, T, HSV);
        __syncthreads();
        flash_p_ds<TILE>(NULL, sdS, sQ, sdO, sK, sV, sLse, sD, sDs, q0, k0, T, HS, LD, HSV, LDV,
                         scale);
        __syncthreads();
        for (int idx = tid; idx < TILE * HS; idx += TS_FLASH_THREADS) {
            int i = idx / HS, d = idx % HS;
            sdQ[idx] += flash_dot(sdS + i * LS, 1, sK + d, LD, TILE);
        }
    }
    __syncthreads();
    flash_store<TILE>(dqkv + f.offq, f.C3, sdQ, scale, q0, T, HS);
}

#endif
