/* Context parallelism (parallel.cp): each sequence is split over the cp ranks of a
 * group, and attention exchanges keys and values across it (Llama 3's scheme; Megatron's
 * chunk placement).
 *
 * A sequence of T positions is cut into 2*cp chunks of c = T/(2 cp); rank i of the group
 * holds chunks i and 2cp-1-i, in that order, as its Tl = T/cp local rows (a causal chunk
 * late in the sequence costs more than an early one: every rank gets one of each, so
 * the attention work is the same on every rank). Everything but attention is per
 * position and runs on the local rows as it would on a shorter sequence; positions (the
 * GPT-2 position embedding, RoPE) are the global ones, ts_cp_position.
 *
 * Attention: each block all-gathers this rank's keys and values over the group (K/V of
 * the local rows, this tp rank's kv heads) and puts them in position order, kvg [B, T,
 * 2*KV*HS], which the block keeps for its backward; each local chunk's queries then
 * attend their causal prefix of it (kernels' attention_prefix_*: chunk j's c queries
 * against keys 0 .. (j+1)c). The backward sums each chunk's dK/dV into a gathered
 * buffer and reduce-scatters it back to the ranks that own the rows. Why an all-gather
 * and not Megatron's ring of K/V passes with the online softmax: the gathered K/V are
 * small (grouped-query attention: 2*KV/H of the queries' bytes), one collective per
 * block instead of cp-1 point-to-point steps, and the prefix kernel is exact with no
 * partial-softmax merging; the ring's advantage, hiding each pass behind a block of
 * compute, matters when the exchange is comparable to attention's compute, which at the
 * sequences it is used for (cp >= 2 means T in the tens of thousands) it is not
 * (bench/RESULTS.md 2.9 measures the share).
 *
 * With size == 1 every call is the plain kernel and nothing is communicated. */
#ifndef TS_CP_H
#define TS_CP_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/comm.h"
#include "kernels/kernels.h"

typedef struct {
    int size, rank;
    const struct ts_comm_s *comm; /* the cp group; NULL when size == 1 (or a layout only) */
    const ts_kernels *k;
    int T;                        /* the whole sequence's positions (2*size divides it) */
} ts_cp;

/* Rank `rank` of a group of `size` over sequences of T positions. comm may be NULL only
 * when size == 1 or for a layout that never runs (the memory estimate). */
ts_cp ts_cp_make(int size, int rank, const struct ts_comm_s *comm, const ts_kernels *k, int T);

/* The positions a rank holds of each sequence: T / size. */
static inline int ts_cp_local_len(const ts_cp *cp) { return cp->T / cp->size; }
/* The chunk a rank's half h (0: its first c local rows, 1: the next c) is. */
static inline int ts_cp_chunk(const ts_cp *cp, int h)
{
    return h == 0 ? cp->rank : 2 * cp->size - 1 - cp->rank;
}
/* The global position of local row t (0 <= t < T/size) of a sequence. */
static inline int ts_cp_position(const ts_cp *cp, int t)
{
    const int c = cp->T / (2 * cp->size);
    return ts_cp_chunk(cp, t / c) * c + t % c;
}

/* dst[B, T/size] = this rank's positions of src[B, T] (token ids, host memory). */
void ts_cp_select(const ts_cp *cp, int *dst, const int *src, int B);

/* The attention of B sequences' local rows qkv [B*Tl, ts_att_qkv_width(h)] (after RoPE;
 * h this rank's heads, kernels.h ts_att_heads) with its saved state, as
 * attention_forward's: the context's bytes for them (the two chunks' prefix
 * probabilities), and its backward's scratch. */
size_t ts_cp_attention_saved_bytes(const ts_cp *cp, int B, ts_att_heads h);
size_t ts_cp_attention_scratch_bytes(const ts_cp *cp, int B, ts_att_heads h);
/* Activation elements of the gathered K/V a block keeps, kvg [B, T, ts_att_kv_width(h)]
 * (each row the KV k heads, then the KV v heads; 0 when size == 1), and of the work
 * buffer the exchange needs (not kept: the backward scratch's; also holds the position
 * embedding's rows, ts_cp_positions_table). */
size_t ts_cp_kv_elems(const ts_cp *cp, int B, ts_att_heads h);
size_t ts_cp_work_bytes(const ts_cp *cp, int B, ts_att_heads h, int C, size_t act_bytes);

/* The attention of B sequences of T rows each (this rank's: T = ts_cp_local_len under
 * context parallelism; any T with size 1, where every call is the plain kernel and kvg
 * and work are not used), as tp.h's layers stand in for their kernels: the model has no
 * cp == 1 branches of its own. */

/* out [B*T, H*HSV] and att (the saved state) from qkv; under context parallelism kvg
 * receives the gathered K/V (through work). */
void ts_cp_attention_forward(const ts_cp *cp, void *out, void *att, void *kvg, void *work,
                             const void *qkv, int B, int T, ts_att_heads h);
/* The same without the exchange, from a kvg already gathered (selective recompute
 * rebuilding the state a forward dropped). */
void ts_cp_attention_recompute(const ts_cp *cp, void *out, void *att, const void *kvg,
                               const void *qkv, int B, int T, ts_att_heads h);
/* dqkv [B*T, ts_att_qkv_width(h)] (overwritten) from dout [B*T, H*HSV]: the local
 * queries' gradient and, reduce-scattered over the group, the local keys' and values'. */
void ts_cp_attention_backward(const ts_cp *cp, void *dqkv, void *scratch, void *work,
                              const void *dout, const void *qkv, const void *kvg,
                              const void *att, int B, int T, ts_att_heads h);

/* fp32 rows [Tl, C] of a position table tab [>= T, C] at this rank's positions, written
 * to `rows` (device memory: the GPT-2 position embedding each step, RoPE's cos and sin
 * once); returns tab itself when size == 1. (The position embedding's gradient needs no
 * such table: the embedding backward runs per chunk, at the chunk's rows of dwpe.) */
const float *ts_cp_positions_table(const ts_cp *cp, float *rows, const float *tab, int C);

#endif
