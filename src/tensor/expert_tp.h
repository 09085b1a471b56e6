/* Expert tensor parallelism's row exchange for one MoE layer (Megatron's etp with the
 * all-to-all dispatcher): each rank of an etp group holds a 1/etp slice of every one of
 * its local experts' hidden width F (its gate rows and up rows of that F-slice, its down
 * columns of it), so each expert needs every row of the group's ranks, and each rank's
 * outputs are partial sums over its F-slice.
 *
 *   gather   each rank's rows for its L local experts (in expert order: expert 0's rows,
 *            then expert 1's, ...; after the ep dispatch when ep > 1) go to every etp
 *            peer; the result is in `gathered order`: local expert 0's rows from etp
 *            rank 0, then from rank 1, ..., then expert 1's from rank 0, ... (each
 *            expert's rows contiguous, so its GEMMs run over one slice);
 *   reduce   the partial outputs in gathered order go back to the ranks that own their
 *            rows, and each rank sums the etp partials of its rows in etp rank order
 *            (0, 1, ...): the same order on every run, so reruns are bit-identical.
 *
 * The backward is the same pair: the output gradients are gathered as the inputs were,
 * the input gradients' partials reduced as the outputs were. One all-gather of the host
 * counts (the plan), then one variable all-to-all of the rows each way (the gather sends
 * one block to every peer; the reduce is a reduce-scatter done as an all-to-all and a
 * fixed-order sum, the same bytes). Row buffers are the compute backend's memory. */
#ifndef TS_TENSOR_EXPERT_TP_H
#define TS_TENSOR_EXPERT_TP_H

#include "comm/comm.h"
#include "kernels/kernels.h"

typedef struct {
    const ts_comm *etp;   /* the etp group (not owned, size > 1); rank = etp coordinate */
    const ts_kernels *k;  /* the reorder's copies and the sum's adds */
    int L, C;             /* local experts, row width (elements) */
    ts_dtype type;        /* the rows' element type */
    /* The plan of the last ts_expert_tp_plan (host arrays, owned): */
    int *rows_e;          /* [etp * L]: etp rank j's rows for local expert l at [j * L + l] */
    int *expert_rows;     /* [L]: gathered rows of each local expert (over the group) */
    int n_mine, n_all;    /* this rank's rows, the group's */
    int n_buf;            /* rows the reduce's `partial` must hold: max(n_all, etp * n_mine) */
    int *mine_counts, *zero_displs, *mine_displs; /* [etp], elements: my block to/from each */
    int *peer_counts, *peer_displs;               /* [etp], elements: each peer's block */
} ts_expert_tp;

/* Set up for an etp group of size > 1, L local experts, rows of C elements of `type`. */
void ts_expert_tp_init(ts_expert_tp *t, const ts_comm *etp, const ts_kernels *k, int L, int C,
                       ts_dtype type);
void ts_expert_tp_free(ts_expert_tp *t);
/* Collective over etp: all-gather this rank's rows[L] (host) and lay out both
 * directions. Afterwards n_all and expert_rows say what each rank's F-slices process. */
void ts_expert_tp_plan(ts_expert_tp *t, const int *rows);
/* Collective: in [n_mine, C] (expert order) -> out [n_all, C] (gathered order). work
 * [n_all, C] receives the blocks in etp rank order first; out may alias in, not work. */
void ts_expert_tp_gather(const ts_expert_tp *t, void *out, const void *in, void *work);
/* Collective, the reverse with the sum: partial [n_all, C] (gathered order) -> out
 * [n_mine, C] = the sum over etp ranks 0, 1, ... of their partials. partial is
 * overwritten: it receives the etp peers' partials of this rank's rows, so it must hold
 * n_buf rows (more than n_all where this rank has more rows than the group's mean).
 * work [n_all, C]; out may alias work, not partial. */
void ts_expert_tp_reduce(const ts_expert_tp *t, void *out, void *partial, void *work);

#endif
