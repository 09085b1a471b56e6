/* Tensor parallelism (Megatron-LM) as layers over a small context: the model calls
 * these where it would call a matmul, an embedding or a cross-entropy, and the
 * collectives stay in here. A block then reads like the unsharded one.
 *
 *   column-parallel linear  weight [OC/tp, C]: this rank's output rows (q, k, v heads,
 *                           MLP columns). Forward: the plain matmul on the whole input.
 *                           Backward: each rank saw part of the outputs, so the input
 *                           gradient is summed over the tp ranks (Megatron's f).
 *   row-parallel linear     weight [OC, C/tp]: this rank's input columns. Forward: the
 *                           partial products are summed over the tp ranks (g) and the
 *                           replicated bias is added by rank 0 only, so the sum counts
 *                           it once. Backward: the plain one (the output gradient is the
 *                           same on every rank).
 *   vocab-parallel          wte [V/tp, C]: this rank's vocabulary rows [v0, v0 + nv)
 *   embedding / LM head     (uneven: ts_shard_range). The embedding looks up its own
 *   and cross-entropy       tokens and sums; the LM head is a column-parallel linear over
 *                           the vocabulary; the cross-entropy reduces the row max, the
 *                           target logit and the sum of exponentials, never the logits.
 *
 * With size == 1 every call is the plain kernel and nothing is communicated: the
 * model has no tp == 1 branches of its own.
 *
 * Sequence parallelism (Korthikanti et al. 2022, Megatron's --sequence-parallel; `sp`):
 * outside the column/row pairs (norms, residual adds) each rank holds only its rows of
 * the N = B*T tokens, the contiguous part ts_tp_rows gives (rank r: rows [r*N/tp,
 * (r+1)*N/tp); parallel.sequence_parallel needs T, hence N, to divide by tp). The input
 * of a column-parallel linear is then all-gathered first (ts_tp_seq_gather, by the
 * caller, who keeps only its rows and gathers again for the weight gradient); the sum
 * after a row-parallel linear, the embedding's and a column-parallel backward's become
 * reduce-scatters into this rank's rows (the same bytes as the all-reduce: half in each
 * of the pair). The norms' weight gradients then hold this rank's rows' part: summed over
 * the group once a step (ts_tp_seq_sum_grad).
 *
 * Sub-pipelined tensor parallelism (Merak; parallel.tp_overlap = S, `sub`): the model
 * runs each block on S sub-batches of B/S whole sequences, starting a sub-batch's
 * collective (the calls below given a `pending`) and finishing it (ts_tp_finish) only
 * after the next sub-batch's GEMMs, so each all-reduce, or reduce-scatter and all-gather,
 * runs behind computation (polled: ts_tp_poll). Under sequence parallelism a rank's rows
 * are then its part of each sub-batch in turn: sub-batch i's [N/S] rows are split over
 * the ranks, and every gather and scatter goes sub-batch by sub-batch (ts_tp_rows counts
 * the same rows). */
#ifndef TS_TP_H
#define TS_TP_H

#include <stdbool.h>
#include <stddef.h>

#include "comm/comm.h"
#include "kernels/kernels.h"
#include "tensor/shard.h"

typedef struct {
    int size, rank;
    const struct ts_comm_s *comm; /* the tp group; NULL when size == 1 (or a layout only) */
    const ts_kernels *k;
    bool sp;                      /* sequence parallelism (size > 1 only) */
    int sub;                      /* tp_overlap's sub-batches per micro-batch (1: none) */
} ts_tp;

/* A collective in flight: started by a call below given it, completed by ts_tp_finish
 * (a NULL pending: the call blocks, as without tp_overlap). */
typedef struct {
    ts_request req;
    int *counts, *displs;   /* per-rank pieces (owned while in flight) */
    void *dst;              /* a reduce-scatter's piece, moved here from src on finish */
    const void *src;
    size_t bytes;
    bool active;
} ts_tp_pending;

/* Rank `rank` of a tensor-parallel group of `size`. comm may be NULL only when size == 1
 * or when the context only lays out a model that never runs (the memory estimate);
 * otherwise its size and rank must be these. */
ts_tp ts_tp_make(int size, int rank, const struct ts_comm_s *comm, const ts_kernels *k);

/* The same context with sequence parallelism on or off (on needs size > 1). */
ts_tp ts_tp_sequence_parallel(ts_tp tp, bool on);
/* The same context with `sub` sub-batches per micro-batch (tp_overlap; 1: none). */
ts_tp ts_tp_overlap(ts_tp tp, int sub);

/* Completes p (the time waited counts as the group's busy time: tp_comm_ms is what the
 * overlap left exposed); nothing when p is NULL or idle. ts_tp_poll advances it. */
void ts_tp_finish(const ts_tp *tp, ts_tp_pending *p);
void ts_tp_poll(ts_tp_pending *p);

/* Rows of N a rank holds outside the column/row pairs: N / size under sequence
 * parallelism, else N. */
static inline int ts_tp_rows(const ts_tp *tp, int N) { return tp->sp ? N / tp->size : N; }

/* Activations (`void *`) and weights `w` are in tp->k's act_dtype; biases and weight
 * gradients are fp32 (kernels/kernels.h). `work` ([N, C] or [N, OC] activation
 * elements, not overlapping the other buffers) is used under sequence parallelism only
 * (NULL is fine otherwise), and its contents are left undefined. */

/* Under sequence parallelism, full[N, C] = every rank's rows local[ts_tp_rows(N), C] in
 * rank order, and full is returned; otherwise local itself (nothing is copied). */
const void *ts_tp_seq_gather(const ts_tp *tp, void *full, const void *local, int N, int C,
                             ts_tp_pending *pending);

/* Under sequence parallelism, the sum over the group of a replicated parameter's
 * gradient g[n] fp32 (a norm's, which each rank computed from its rows only); nothing
 * otherwise. */
void ts_tp_seq_sum_grad(const ts_tp *tp, float *g, size_t n);
/* The sum over the group of a replicated parameter's gradient g[n] fp32 that each rank
 * computed from its own heads (model.qk_norm's q_norm and k_norm), with or without
 * sequence parallelism; nothing on one rank. */
void ts_tp_sum_grad(const ts_tp *tp, float *g, size_t n);

/* out[N, OCl] = inp[N, C] @ w[OCl, C]^T + b[OCl]: this rank's output columns. */
void ts_tp_col_forward(const ts_tp *tp, void *out, const void *inp, const void *w,
                       const float *b, int N, int C, int OCl);
/* matmul_backward, then dinp (when given) summed over the tp ranks. dw or db may be NULL
 * (the zero-bubble split computes them in another pass, with dinp NULL). Under sequence
 * parallelism inp is the gathered [N, C], and dinp this rank's rows of the sum
 * [ts_tp_rows(N), C] (the partial products go through work [N, C]). */
void ts_tp_col_backward(const ts_tp *tp, void *dinp, float *dw, float *db, const void *dout,
                        const void *inp, const void *w, int N, int C, int OCl, void *work,
                        ts_tp_pending *pending);

/* out[N, OC] = sum over ranks of inp[N, Cl] @ w[OC, Cl]^T, plus b[OC] (replicated) once.
 * Under sequence parallelism out is this rank's rows [ts_tp_rows(N), OC] of the sum
 * (the partial products go through work [N, OC]). */
void ts_tp_row_forward(const ts_tp *tp, void *out, const void *inp, const void *w,
                       const float *b, int N, int Cl, int OC, void *work,
                       ts_tp_pending *pending);
/* The plain matmul_backward: dout is replicated (under sequence parallelism gathered
 * by the caller), so the replicated bias' gradient is the same on every rank. */
void ts_tp_row_backward(const ts_tp *tp, void *dinp, float *dw, float *db, const void *dout,
                        const void *inp, const void *w, int N, int Cl, int OC);

/* out[B*T, C] = wte[tokens] + wpe[t], wte holding vocabulary rows [v0, v0 + nv); under
 * sequence parallelism this rank's rows of it (through work [B*T, C]). */
void ts_tp_embed_forward(const ts_tp *tp, void *out, const int *tokens, const float *wte,
                         int v0, int nv, const float *wpe, int B, int T, int C, void *work);
/* dwte (this rank's rows) and dwpe (replicated: dout [B*T, C] is the same on every rank,
 * gathered by the caller under sequence parallelism) += . */
void ts_tp_embed_backward(const ts_tp *tp, float *dwte, float *dwpe, const void *dout,
                          const int *tokens, int v0, int nv, int B, int T, int C);

/* Cross-entropy of logits [N, nv] (this rank's vocabulary columns [v0, v0 + nv)) against
 * targets: losses[N] (the same on every rank) and, in place of the logits,
 * dlogits = (softmax - onehot) * dloss. stats: 3*N floats of workspace. */
void ts_tp_cross_entropy(const ts_tp *tp, float *losses, void *logits, float *stats,
                         const int *targets, int v0, int nv, int N, float dloss);

/* ---- count once: what every rank of the group holds alike enters a sum once ---- */

/* Whether a parameter's gradient counts in the global norm (and is the one written to
 * a checkpoint): not on tp ranks 1.. of a replicated tensor, nor the tied copy. */
static inline bool ts_tp_param_counts(const ts_shard_spec *s) { return s->replica == 0; }

/* A value every tp rank holds alike (the losses), to be summed over the grid: v on tp
 * rank 0, 0 elsewhere. */
static inline double ts_tp_once(const ts_tp *tp, double v) { return tp->rank == 0 ? v : 0.0; }

#endif
