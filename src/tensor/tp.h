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
 * model has no tp == 1 branches of its own. */
#ifndef TS_TP_H
#define TS_TP_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/kernels.h"
#include "tensor/shard.h"

struct ts_comm_s; /* comm/comm.h: only tp.c communicates */

typedef struct {
    int size, rank;
    const struct ts_comm_s *comm; /* the tp group; NULL when size == 1 (or a layout only) */
    const ts_kernels *k;
} ts_tp;

/* Rank `rank` of a tensor-parallel group of `size`. comm may be NULL only when size == 1
 * or when the context only lays out a model that never runs (the memory estimate);
 * otherwise its size and rank must be these. */
ts_tp ts_tp_make(int size, int rank, const struct ts_comm_s *comm, const ts_kernels *k);

/* Activations (`void *`) and weights `w` are in tp->k's act_dtype; biases and weight
 * gradients are fp32 (kernels/kernels.h). */

/* out[N, OCl] = inp[N, C] @ w[OCl, C]^T + b[OCl]: this rank's output columns. */
void ts_tp_col_forward(const ts_tp *tp, void *out, const void *inp, const void *w,
                       const float *b, int N, int C, int OCl);
/* matmul_backward, then dinp (when given) summed over the tp ranks. dw or db may be NULL
 * (the zero-bubble split computes them in another pass, with dinp NULL). */
void ts_tp_col_backward(const ts_tp *tp, void *dinp, float *dw, float *db, const void *dout,
                        const void *inp, const void *w, int N, int C, int OCl);

/* out[N, OC] = sum over ranks of inp[N, Cl] @ w[OC, Cl]^T, plus b[OC] (replicated) once. */
void ts_tp_row_forward(const ts_tp *tp, void *out, const void *inp, const void *w,
                       const float *b, int N, int Cl, int OC);
/* The plain matmul_backward: dout is replicated, so the replicated bias' gradient is the
 * same on every rank. */
void ts_tp_row_backward(const ts_tp *tp, void *dinp, float *dw, float *db, const void *dout,
                        const void *inp, const void *w, int N, int Cl, int OC);

/* out[B*T, C] = wte[tokens] + wpe[t], wte holding vocabulary rows [v0, v0 + nv). */
void ts_tp_embed_forward(const ts_tp *tp, void *out, const int *tokens, const float *wte,
                         int v0, int nv, const float *wpe, int B, int T, int C);
/* dwte (this rank's rows) and dwpe (replicated: dout is the same on every rank) += . */
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
