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
 * as the inputs did (the dispatch) and the input gradients come back as the outputs do
 * (the combine).
 *
 * Start and finish (parallel.ep_overlap). Each direction is split in two: a start that
 * sends (the dispatch's rows as they are; the combine's after the reorder) and a finish
 * that waits for what arrives (and reorders the dispatch's). With overlap on the start
 * is a non-blocking all-to-all and the caller computes what does not depend on it (the
 * shared experts, the partner action of an overlapped pair through core/yield.h) before
 * the finish; with it off the start is the blocking all-to-all and the finish only
 * reorders: the same bytes in the same places either way, so the numbers are
 * bit-identical. Everything one exchange holds between its start and finish (its plan,
 * its request, its buffers) is the caller's (ts_expert_plan, ts_expert_xfer): two
 * actions interleaved at yield points (an overlapped forward/backward pair) each have
 * their own exchange of the same layer in flight.
 *
 * Progress. MPI moves a non-blocking collective over shared memory only inside MPI
 * calls (Open MPI has no asynchronous progress thread): ts_expert_dispatch_progress
 * tests every exchange in flight, and the model calls it between layers (its
 * between_layers hook, the same poll the data-parallel reduction's poll mode uses) and
 * the MoE layer between its GEMMs (a partner action's exchange may be in flight during
 * the experts'). The finish's wait moves the rest.
 *
 * Every row buffer is the compute backend's memory (device memory on a GPU); the counts
 * are host values exchanged on the control plane. With ep == 1 nothing is communicated
 * and the exchange is a copy. */
#ifndef TS_TENSOR_EXPERT_DISPATCH_H
#define TS_TENSOR_EXPERT_DISPATCH_H

#include "comm/comm.h"
#include "kernels/kernels.h"

/* The most exchanges in flight at once: one per action between its start and finish,
 * two actions in an overlapped pair. */
#define TS_EXPERT_INFLIGHT_MAX 4

/* One exchange, start to completion, for the trace (times ts_now_ms()). */
typedef struct {
    const char *what; /* "dispatch" or "combine" */
    char pass;        /* 'F' (the forward's rows) or 'B' (the backward's gradients) */
    int block;        /* the MoE block (from 0, as the metrics' moe_layers count) */
    double start_ms;  /* started */
    double done_ms;   /* seen complete (by a progress test or the finish's wait) */
    double wait_ms;   /* the part of it the finish spent blocked: what was exposed */
} ts_expert_span;

/* A plan: what one micro-batch's exchange of one layer moves (host arrays, owned by
 * the caller's record, made by ts_expert_plan_make and freed by ts_expert_plan_free). */
typedef struct {
    int *recv_counts_e;       /* [ep * E_local]: rows from ep rank j for local expert l at
                                 [j * E_local + l] */
    int *expert_rows;         /* [E_local]: rows each local expert processes */
    int n_send, n_recv;       /* rows sent (= sum of counts), rows received */
    int *send_counts, *send_displs, *recv_counts, *recv_displs; /* [ep], in elements */
} ts_expert_plan;

/* One direction of an exchange between its start and its finish (the caller's). */
typedef struct {
    ts_request req;
    void *work;        /* the dispatch's rows in source order, reordered at the finish */
    ts_expert_span span;
    int started;       /* between start and finish */
} ts_expert_xfer;

typedef struct {
    const ts_comm *ep;        /* the ep group (not owned); rank in it = the ep coordinate */
    const ts_kernels *k;      /* the copies between received and expert order */
    int E, E_local, C;        /* experts, experts per ep rank, row width (elements) */
    ts_dtype type;            /* the rows' element type */
    bool overlap;             /* parallel.ep_overlap: non-blocking starts (else blocking) */
    /* The exchanges in flight, which ts_expert_dispatch_progress tests (the callers'
     * records; one thread at a time runs the model, so no lock). */
    ts_expert_xfer *inflight[TS_EXPERT_INFLIGHT_MAX];
    int n_inflight;
    /* This rank's exchanges since ts_expert_dispatch_take_times: their start-to-
     * completion time and the part of it the finishes spent blocked (the metrics'
     * a2a_ms and a2a_wait_ms). */
    double a2a_ms, wait_ms;
    /* Told each exchange's span at its finish, when set (the trainer's trace). */
    void (*on_span)(void *ctx, const ts_expert_span *s);
    void *on_span_ctx;
} ts_expert_dispatch;

/* Set up for an ep group, E experts (E % ep->size == 0), rows of C elements of `type`;
 * overlap off (the trainer sets it from parallel.ep_overlap). */
ts_status ts_expert_dispatch_init(ts_expert_dispatch *d, const ts_comm *ep,
                                  const ts_kernels *k, int E, int C, ts_dtype type);
void ts_expert_dispatch_free(ts_expert_dispatch *d);
/* Collective over ep: exchange this rank's counts[E] (rows per global expert, host) and
 * lay out both directions in *p (the caller frees it with ts_expert_plan_free).
 * Afterwards p->n_recv and p->expert_rows say what the local experts receive. */
void ts_expert_plan_make(const ts_expert_dispatch *d, ts_expert_plan *p, const int *counts);
void ts_expert_plan_free(ts_expert_plan *p);

/* Collective: start sending xp [n_send, C] (by global expert) to the experts' ranks;
 * work [n_recv, C] receives them in source order. xp, work, p and x stay the caller's,
 * untouched, until the finish. pass and block name the span. */
void ts_expert_dispatch_start(ts_expert_dispatch *d, const ts_expert_plan *p,
                              ts_expert_xfer *x, const void *xp, void *work, char pass,
                              int block);
/* Wait for x's rows and put them into out [n_recv, C] in expert order (out may not alias
 * the start's work). */
void ts_expert_dispatch_finish(ts_expert_dispatch *d, const ts_expert_plan *p,
                               ts_expert_xfer *x, void *out);
/* Collective, the reverse: y [n_recv, C] in expert order is reordered into work [n_recv,
 * C] (may not alias y; y may be reused once this returns) and sent back; yp [n_send, C]
 * receives each row at its place in xp. work, yp, p and x stay the caller's until the
 * finish. */
void ts_expert_combine_start(ts_expert_dispatch *d, const ts_expert_plan *p,
                             ts_expert_xfer *x, void *yp, const void *y, void *work, char pass,
                             int block);
/* Wait for the combine's rows in yp. */
void ts_expert_combine_finish(ts_expert_dispatch *d, ts_expert_xfer *x);

/* Test every exchange in flight (ctx: the ts_expert_dispatch), so MPI moves them while
 * the caller computes: a model's between_layers hook. Cheap when none is. */
void ts_expert_dispatch_progress(void *ctx);
/* This rank's exchange times since the last call (ms), then zeroed: start to
 * completion, and blocked in the finishes. */
void ts_expert_dispatch_take_times(ts_expert_dispatch *d, double *a2a_ms, double *wait_ms);

#endif
