/* Expert parallelism's token exchange for one MoE layer (Megatron's all-to-all token
 * dispatcher): rows already permuted by global expert on each rank go to the ep ranks
 * that own those experts, arrive grouped by local expert, and come back the same way.
 *
 * Experts are split over the ep group in contiguous blocks: ep rank r owns global
 * experts [r * E_local, (r + 1) * E_local), E_local = E / ep. A rank's send rows xp
 * [n_send, C] hold, in order, the rows for expert 0, then expert 1, ... (counts[E] of
 * them: a moe_permute's output), so the rows for ep rank r are one contiguous block.
 * After the exchange the rows a rank's experts must process are, in `expert order`:
 * local expert 0's rows from ep rank 0, then from ep rank 1, ..., then local expert 1's
 * from rank 0, ...; each source's rows in their send order. That order is a function of
 * the routing alone (never of timing), so reruns are bit-identical.
 *
 * The same plan serves the backward: the output gradients of the expert outputs travel
 * as the inputs did (ts_expert_dispatch_forward) and the input gradients come back as
 * the outputs do (ts_expert_dispatch_combine).
 *
 * Every row buffer is the compute backend's memory (device memory on a GPU); the counts
 * are host values exchanged on the control plane. With ep == 1 nothing is communicated
 * and the exchange is a copy. */
#ifndef TS_TENSOR_EXPERT_DISPATCH_H
#define TS_TENSOR_EXPERT_DISPATCH_H

#include "comm/comm.h"
#include "kernels/kernels.h"

typedef struct {
    const ts_comm *ep;        /* the ep group (not owned); rank in it = the ep coordinate */
    const ts_kernels *k;      /* the copies between received and expert order */
    int E, E_local, C;        /* experts, experts per ep rank, row width (elements) */
    ts_dtype type;            /* the rows' element type */
    /* The plan of the last ts_expert_dispatch_plan (host arrays, owned): */
    int *recv_counts_e;       /* [ep * E_local]: rows from ep rank j for local expert l at
                                 [j * E_local + l] */
    int *expert_rows;         /* [E_local]: rows each local expert processes */
    int n_send, n_recv;       /* rows sent (= sum of counts), rows received */
    int *send_counts, *send_displs, *recv_counts, *recv_displs; /* [ep], in elements */
} ts_expert_dispatch;

/* Set up for an ep group, E experts (E % ep->size == 0), rows of C elements of `type`. */
ts_status ts_expert_dispatch_init(ts_expert_dispatch *d, const ts_comm *ep,
                                  const ts_kernels *k, int E, int C, ts_dtype type);
void ts_expert_dispatch_free(ts_expert_dispatch *d);
/* Collective over ep: exchange this rank's counts[E] (rows per global expert, host) and
 * lay out both directions. Afterwards n_recv and expert_rows say what the local experts
 * receive. */
void ts_expert_dispatch_plan(ts_expert_dispatch *d, const int *counts);
/* Collective: xp [n_send, C] (by global expert) -> out [n_recv, C] in expert order.
 * work [n_recv, C] receives the rows in source order first (may not alias out). */
void ts_expert_dispatch_forward(const ts_expert_dispatch *d, void *out, const void *xp,
                                void *work);
/* Collective, the reverse: y [n_recv, C] in expert order -> yp [n_send, C], each row back
 * at its place in xp. work [n_recv, C] (may not alias y). */
void ts_expert_dispatch_combine(const ts_expert_dispatch *d, void *yp, const void *y,
                                void *work);

#endif
