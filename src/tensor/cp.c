/* Context parallelism: the chunk placement, the K/V all-gather and its reduce-scatter
 * around the prefix attention kernels (cp.h). */
#include "tensor/cp.h"

#include "core/error.h"

ts_cp ts_cp_make(int size, int rank, const struct ts_comm_s *comm, const ts_kernels *k, int T)
{
    TS_ASSERT(size >= 1 && rank >= 0 && rank < size);
    TS_ASSERT(size == 1 || T % (2 * size) == 0);
    return (ts_cp){.size = size, .rank = rank, .comm = comm, .k = k, .T = T};
}

void ts_cp_select(const ts_cp *cp, int *dst, const int *src, int B)
{
    const int T = cp->T, Tl = ts_cp_local_len(cp);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tl; t++) dst[(size_t)b * Tl + t] = src[(size_t)b * T + ts_cp_position(cp, t)];
}

/* Chunk half h's c queries see the keys up to the end of their chunk. */
static int chunk_len(const ts_cp *cp) { return cp->T / (2 * cp->size); }
static int prefix_len(const ts_cp *cp, int h) { return (ts_cp_chunk(cp, h) + 1) * chunk_len(cp); }

#define ALIGN64(x) (((x) + 63) / 64 * 64)

/* The heads of sequence b's half h: its c queries' document starts (packed documents:
 * hd.doc_start is [B, Tl], already in the gathered keys' coordinates). */
static ts_att_heads chunk_heads(ts_att_heads hd, int b, int Tl, int h, int c)
{
    if (hd.doc_start) hd.doc_start += (size_t)b * Tl + (size_t)h * c;
    return hd;
}

/* Bytes of one sequence's half h saved state (64-aligned, so each sequence's state
 * starts on a boundary: tp_overlap's sub-batches index it by sequence). */
static size_t half_saved(const ts_cp *cp, int half, ts_att_heads h) {
    return ALIGN64(cp->k->attention_prefix_saved_bytes(1, chunk_len(cp), prefix_len(cp, half), h));
}

size_t ts_cp_attention_saved_bytes(const ts_cp *cp, int B, ts_att_heads h) {
    const ts_kernels *k = cp->k;
    if (cp->size == 1) return k->attention_saved_bytes(B, cp->T, h);
    /* A layout for a backend without the prefix kernels (the planner sizing CUDA):
     * its own attention's state for the local rows. */
    if (!k->attention_prefix_saved_bytes)
        return k->attention_saved_bytes(B, ts_cp_local_len(cp), h);
    return (size_t)B * (half_saved(cp, 0, h) + half_saved(cp, 1, h));
}

size_t ts_cp_attention_scratch_bytes(const ts_cp *cp, int B, ts_att_heads h) {
    const ts_kernels *k = cp->k;
    if (cp->size == 1) return k->attention_scratch_bytes(B, cp->T, h);
    if (!k->attention_prefix_scratch_bytes)
        return k->attention_scratch_bytes(B, ts_cp_local_len(cp), h);
    /* One sequence's chunk at a time; the longer prefix bounds both. */
    const int c = chunk_len(cp), T0 = prefix_len(cp, 0), T1 = prefix_len(cp, 1);
    return k->attention_prefix_scratch_bytes(1, c, T0 > T1 ? T0 : T1, h);
}

size_t ts_cp_kv_elems(const ts_cp *cp, int B, ts_att_heads h) {
    return cp->size == 1 ? 0 : (size_t)B * cp->T * ts_att_kv_width(h);
}

/* The work buffer: the gathered K/V in rank order [size][B][Tl][W] (W =
 * ts_att_kv_width: KV k heads then KV v heads; a forward's; in a backward the dK/dV in
 * rank order), the packed local K/V [B][Tl][W], and in a backward the dK/dV in position
 * order [B][T][W]. The position table's rows [Tl, C] fp32 fit in it too (the
 * embedding's forward, which runs alone). */
size_t ts_cp_work_bytes(const ts_cp *cp, int B, ts_att_heads h, int C, size_t act_bytes) {
    if (cp->size == 1) return 0;
    const size_t kv = ts_cp_kv_elems(cp, B, h), local = kv / (size_t)cp->size;
    const size_t att = ALIGN64(kv * act_bytes) * 2 + ALIGN64(local * act_bytes);
    const size_t pos = (size_t)ts_cp_local_len(cp) * C * sizeof(float);
    return att > pos ? att : pos;
}

typedef struct {
    unsigned char *rank_major, *packed, *position_major;
} cp_work;

static cp_work work_views(const ts_cp *cp, void *work, int B, ts_att_heads h) {
    const size_t eb = ts_dtype_bytes(cp->k->act_dtype);
    const size_t kv = ts_cp_kv_elems(cp, B, h), local = kv / (size_t)cp->size;
    unsigned char *p = work;
    cp_work w = {.rank_major = p, .packed = p + ALIGN64(kv * eb)};
    w.position_major = w.packed + ALIGN64(local * eb);
    return w;
}

/* The rank-major gathered buffer [size][B][Tl][W] and the position-major [B][T][W] hold
 * the same rows; piece (r, b, h) is c rows. to_position: copy rank-major -> position. */
static void permute(const ts_cp *cp, unsigned char *position, unsigned char *rank_major, int B,
                    size_t row_bytes, bool to_position)
{
    const int P = cp->size, c = chunk_len(cp), T = cp->T, Tl = ts_cp_local_len(cp);
    const size_t piece = (size_t)c * row_bytes;
    for (int r = 0; r < P; r++)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < 2; h++) {
                const int chunk = h == 0 ? r : 2 * P - 1 - r;
                unsigned char *rm = rank_major + (((size_t)r * B + b) * Tl + (size_t)h * c) * row_bytes;
                unsigned char *pm = position + ((size_t)b * T + (size_t)chunk * c) * row_bytes;
                if (to_position)
                    cp->k->memcpy_d2d(pm, rm, piece);
                else
                    cp->k->memcpy_d2d(rm, pm, piece);
            }
}

/* The K/V columns of qkv rows [N, ts_att_qkv_width] <-> packed rows [N,
 * ts_att_kv_width]. */
static void kv_columns(const ts_cp *cp, unsigned char *qkv, unsigned char *packed, size_t N,
                       ts_att_heads h, bool to_packed) {
    const size_t eb = ts_dtype_bytes(cp->k->act_dtype);
    const size_t row = ts_att_qkv_width(h) * eb, q = (size_t)h.NH * h.HS * eb;
    const size_t w = ts_att_kv_width(h) * eb;
    if (to_packed)
        cp->k->memcpy_2d(packed, w, qkv + q, row, w, N);
    else
        cp->k->memcpy_2d(qkv + q, row, packed, w, w, N);
}

void ts_cp_attention_recompute(const ts_cp *cp, void *out, void *att, const void *kvg,
                               const void *qkv, int B, int Tl, ts_att_heads hd) {
    const ts_kernels *k = cp->k;
    if (cp->size == 1) {
        k->attention_forward(out, att, qkv, B, Tl, hd);
        return;
    }
    TS_ASSERT(Tl == ts_cp_local_len(cp));
    const size_t eb = ts_dtype_bytes(k->act_dtype);
    const int c = chunk_len(cp), T = cp->T;
    const size_t qrow = ts_att_qkv_width(hd) * eb, orow = ts_att_out_width(hd) * eb;
    const size_t kvrow = ts_att_kv_width(hd) * eb;
    unsigned char *a = att;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            const size_t row0 = (size_t)b * Tl + (size_t)h * c;
            k->attention_prefix_forward(
                (unsigned char *)out + row0 * orow, a, (const unsigned char *)qkv + row0 * qrow,
                (const unsigned char *)kvg + (size_t)b * T * kvrow, 1, c, prefix_len(cp, h),
                chunk_heads(hd, b, Tl, h, c));
            a += half_saved(cp, h, hd);
        }
}

void ts_cp_attention_forward(const ts_cp *cp, void *out, void *att, void *kvg, void *work,
                             const void *qkv, int B, int T, ts_att_heads hd) {
    if (cp->size > 1) {
        TS_ASSERT(cp->comm && work && kvg && cp->k->attention_prefix_forward);
        const ts_dtype dt = cp->k->act_dtype;
        const size_t Nl = (size_t)B * ts_cp_local_len(cp), W = ts_att_kv_width(hd);
        cp_work w = work_views(cp, work, B, hd);
        kv_columns(cp, (unsigned char *)qkv, w.packed, Nl, hd, true);
        ts_allgather_act(cp->comm, w.packed, w.rank_major, Nl * W, dt);
        permute(cp, kvg, w.rank_major, B, W * ts_dtype_bytes(dt), true);
    }
    ts_cp_attention_recompute(cp, out, att, kvg, qkv, B, T, hd);
}

void ts_cp_attention_backward_gathered(const ts_cp *cp, void *dqkv, void *dkvg, void *scratch,
                                       const void *dout, const void *qkv, const void *kvg,
                                       const void *att, int B, int Tl, ts_att_heads hd)
{
    const ts_kernels *k = cp->k;
    TS_ASSERT(cp->size > 1 && k->attention_prefix_backward && Tl == ts_cp_local_len(cp));
    const size_t eb = ts_dtype_bytes(k->act_dtype);
    const int c = chunk_len(cp), T = cp->T;
    const size_t qrow = ts_att_qkv_width(hd) * eb, orow = ts_att_out_width(hd) * eb;
    const size_t kvrow = ts_att_kv_width(hd) * eb;
    /* Both chunks' dK/dV add into the whole sequence's (most of it zeros: the keys
     * after the chunks attend nothing), which the caller sums over the ranks. */
    k->memset_zero(dkvg, (size_t)B * T * kvrow);
    const unsigned char *a = att;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            const size_t row0 = (size_t)b * Tl + (size_t)h * c;
            const size_t kv0 = (size_t)b * T * kvrow;
            k->attention_prefix_backward(
                (unsigned char *)dqkv + row0 * qrow, (unsigned char *)dkvg + kv0, scratch,
                (const unsigned char *)dout + row0 * orow, (const unsigned char *)qkv + row0 * qrow,
                (const unsigned char *)kvg + kv0, a, 1, c, prefix_len(cp, h),
                chunk_heads(hd, b, Tl, h, c));
            a += half_saved(cp, h, hd);
        }
}

void ts_cp_attention_backward(const ts_cp *cp, void *dqkv, void *scratch, void *work,
                              const void *dout, const void *qkv, const void *kvg, const void *att,
                              int B, int Tl, ts_att_heads hd) {
    const ts_kernels *k = cp->k;
    if (cp->size == 1) {
        k->attention_backward(dqkv, scratch, dout, qkv, att, B, Tl, hd);
        return;
    }
    TS_ASSERT(cp->comm && work && kvg);
    const ts_dtype dt = k->act_dtype;
    const size_t W = ts_att_kv_width(hd), kvrow = W * ts_dtype_bytes(dt), Nl = (size_t)B * Tl;
    cp_work w = work_views(cp, work, B, hd);
    ts_cp_attention_backward_gathered(cp, dqkv, w.position_major, scratch, dout, qkv, kvg, att,
                                      B, Tl, hd);
    permute(cp, w.position_major, w.rank_major, B, kvrow, false);
    ts_reduce_scatter_sum_act(cp->comm, w.rank_major, w.packed, Nl * W, dt);
    kv_columns(cp, dqkv, w.packed, Nl, hd, false);
}

const float *ts_cp_positions_table(const ts_cp *cp, float *rows, const float *tab, int C)
{
    if (cp->size == 1) return tab;
    const int c = chunk_len(cp);
    for (int h = 0; h < 2; h++)
        cp->k->memcpy_d2d(rows + (size_t)h * c * C, tab + (size_t)ts_cp_chunk(cp, h) * c * C,
                          (size_t)c * C * sizeof(float));
    return rows;
}

/* ---- a per-position buffer's exchange ---- */

size_t ts_cp_rows_elems(const ts_cp *cp, int B, size_t W)
{
    return cp->size == 1 ? 0 : (size_t)B * cp->T * W;
}

/* The rank-major gathered rows [size][B][Tl][W], then the packed local rows [B][Tl][W]. */
size_t ts_cp_rows_work_bytes(const ts_cp *cp, int B, size_t W, size_t act_bytes)
{
    if (cp->size == 1) return 0;
    const size_t all = ts_cp_rows_elems(cp, B, W);
    return ALIGN64(all * act_bytes) + ALIGN64(all / (size_t)cp->size * act_bytes);
}

void ts_cp_rows_gather(const ts_cp *cp, void *gathered, void *work, const void *local,
                       size_t ld, int B, size_t W)
{
    TS_ASSERT(cp->size > 1 && cp->comm && work && ld >= W);
    const ts_dtype dt = cp->k->act_dtype;
    const size_t eb = ts_dtype_bytes(dt), all = ts_cp_rows_elems(cp, B, W);
    const size_t Nl = (size_t)B * ts_cp_local_len(cp);
    unsigned char *rank_major = work, *packed = rank_major + ALIGN64(all * eb);
    const void *send = local;
    if (ld != W) { /* a column block: packed rows for the collective */
        cp->k->memcpy_2d(packed, W * eb, local, ld * eb, W * eb, Nl);
        send = packed;
    }
    ts_allgather_act(cp->comm, send, rank_major, Nl * W, dt);
    permute(cp, gathered, rank_major, B, W * eb, true);
}

void ts_cp_rows_reduce_scatter(const ts_cp *cp, void *dlocal, size_t ld, void *work,
                               const void *dgathered, int B, size_t W)
{
    TS_ASSERT(cp->size > 1 && cp->comm && work && ld >= W);
    const ts_dtype dt = cp->k->act_dtype;
    const size_t eb = ts_dtype_bytes(dt), all = ts_cp_rows_elems(cp, B, W);
    const size_t Nl = (size_t)B * ts_cp_local_len(cp);
    unsigned char *rank_major = work, *packed = rank_major + ALIGN64(all * eb);
    /* permute reads the position-major side only in this direction. */
    permute(cp, (unsigned char *)dgathered, rank_major, B, W * eb, false);
    if (ld == W) {
        ts_reduce_scatter_sum_act(cp->comm, rank_major, dlocal, Nl * W, dt);
        return;
    }
    ts_reduce_scatter_sum_act(cp->comm, rank_major, packed, Nl * W, dt);
    cp->k->memcpy_2d(dlocal, ld * eb, packed, W * eb, W * eb, Nl);
}
