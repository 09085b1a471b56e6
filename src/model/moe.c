/* The Mixture-of-Experts phase of an MoE block (block.h; the routing's and the losses'
 * formulas: MOE_DESIGN / docs/CONTRACT.md "Model (llama)"), dropless, on one rank's rows
 * (under tensor parallelism without ep or sp every tp rank runs it whole, replicated: the same
 * output, input gradient and weight gradients on each, no collective):
 *   logits = in @ router^T (fp32, in a bf16 run too: router_input), scores and top-k
 *   selection (selection by score + the balancing bias), the N*K assignments permuted
 *   into expert order, the experts' SwiGLU over their rows (a grouped GEMM of every
 *   local expert's gate|up projection, on each expert's own rows, one SwiGLU over all the
 *   rows, a grouped GEMM of the down projections: kernels.h grouped_matmul_*), the
 *   outputs combined with the routing weights, plus the shared experts.
 * Under expert parallelism (ts_model.moe_ep > 1) the permuted rows go to the ep ranks
 * that own their experts and come back (tensor/expert_dispatch.h) around the experts'
 * matmuls; everything else (router, selection, combine, shared experts) stays on the
 * rank that owns the tokens. Under expert tensor parallelism (ts_model.moe_etp > 1)
 * each rank holds an F/etp slice of its local experts: the rows its experts would
 * process (after the ep exchange) are gathered from the whole etp group, each rank runs
 * its slice (its outputs partial sums over its F-slice) and the partials are summed
 * back onto the rows' ranks (tensor/expert_tp.h); the backward gathers the output
 * gradients and sums the input gradients' partials the same way.
 * Expert (tensor) parallelism with tensor parallelism (no sequence parallelism): the
 * rows are replicated over the tp group, so each tp rank routes all N rows (the counts,
 * the auxiliary losses and the router's gradient stay replicated, as without ep) but
 * sends to the experts (the ep exchange, the etp gather, or both) only its contiguous
 * share of them (moe_share: ts_shard_range's split, uneven allowed), combines that
 * share, and the tp group all-gathers the shares' rows (rank order) into the whole
 * output; the backward takes its share of dout the same way and all-gathers the input
 * gradient's rows and the routing weights' gradient (N x K) so the router's backward
 * runs on every row, replicated. Each expert (each etp slice) then sees every token
 * once over its ep and etp groups: its gradient is complete there and reduces over edp
 * as with ep or etp over dp. (Replicated rows would reach each expert tp times and
 * count each expert gradient tp times.) etp folds over the tp ranks first
 * (expert_grid.h), so with etp = tp the etp group is the tp group: each tp rank runs its
 * F/etp slice on the whole group's shares, that is on all N rows once.
 * Under sequence parallelism (tp > 1, Megatron's design) nothing is gathered: each tp
 * rank routes, dispatches (over ep, which may span the tp ranks, or to its own copy of
 * every expert with ep = 1), combines and adds the shared experts on its own N/tp rows,
 * and the output and input gradient stay its rows. Every token is then one rank's, so
 * the router's, the shared experts' and (ep = etp = 1) the experts' weight gradients
 * are each tp rank's rows' part, summed over tp once a step as sp's norms are
 * (ts_model_sum_sequence_grads); under ep or etp (the etp gather then brings each tp
 * rank's own rows) the experts' are whole over the edp group as without sp; and the
 * step's counts and loss sums are every tp rank's (trainer.c).
 * With a capacity (model.moe_capacity > 0; Megatron's moe_expert_capacity_factor with
 * the "probs" drop policy) each expert takes at most ceil(T * K / E * factor) of each
 * sequence's assignments, those of the largest routing weights (ties to the earlier
 * position), decided per whole sequence before anything leaves the token's rank, so the
 * dropped set is the same on every grid (capacity_keep: a sequence split over cp or sp
 * ranks is gathered first). A dropped assignment is not counted, permuted, sent or
 * combined: its token's routed output lacks that term (all K dropped: the block's
 * residual carries the token alone, plus the shared experts), and its weight's gradient
 * is 0. As in Megatron the balance loss counts the selections before dropping, and the
 * step's counts (the moving bias, moe_max_load, log.moe_every) the kept assignments.
 * The exchange buffers are sized by the capacity where it is the tighter bound
 * (act_layout.h MR): each sequence sends each expert at most its capacity of rows.
 * The ep exchange is started and finished (parallel.ep_overlap: non-blocking between the
 * two, blocking at the start otherwise, the same bits): between them the layer computes
 * what does not need it (forward: the shared experts; backward: the router's backward
 * and the shared experts') and calls ts_yield() (core/yield.h), where an overlapped
 * pair's partner action runs; what the exchange holds meanwhile is the call's own
 * (moe_trip), docs/ARCHITECTURE.md "Mixture of Experts" says what overlaps what.
 * Its saved activations are act_layout.h's MOE_ACTS; its backward's buffers the
 * scratch's MoE region. The per-step state (the bias, the step's counts and loss sums)
 * is the model's (model.h), read and updated between steps by ts_model_moe_*. */
#include <stdlib.h>
#include <string.h>

#include "core/yield.h"
#include "model/block.h"

/* The parameters of local expert e: its gate|up [2F, C] and its down [C, F]. */
static const void *expert_fc(const block_sub *b, int e)
{
    return ts_block_weight(b, b->r.moe_expert0 + 3 * e);
}
static const void *expert_proj(const block_sub *b, int e)
{
    return ts_block_weight(b, b->r.moe_expert0 + 3 * e + 2);
}

/* The L local experts' weights (and gradients) as the grouped GEMMs take them: host
 * arrays of their gate|up and down projections. */
typedef struct {
    const void **fc, **proj;
    float **dfc, **dproj; /* with grads */
} experts_w;

static experts_w experts_weights(const block_sub *b, int L, bool grads)
{
    experts_w w = {0};
    w.fc = ts_malloc(2 * (size_t)L * sizeof(void *));
    w.proj = w.fc + L;
    if (grads) {
        w.dfc = ts_malloc(2 * (size_t)L * sizeof(float *));
        w.dproj = w.dfc + L;
    }
    for (int e = 0; e < L; e++) {
        w.fc[e] = expert_fc(b, e);
        w.proj[e] = expert_proj(b, e);
        if (grads) {
            w.dfc[e] = ts_block_grad(b, b->r.moe_expert0 + 3 * e);
            w.dproj[e] = ts_block_grad(b, b->r.moe_expert0 + 3 * e + 2);
        }
    }
    return w;
}

static void experts_weights_free(const experts_w *w)
{
    free(w->fc);
    free(w->dfc);
}

static int rows_total(const int *rows, int L)
{
    int total = 0;
    for (int e = 0; e < L; e++) total += rows[e];
    return total;
}

static int block_of(const block_sub *b)
{
    return b->m->layers[b->l].block;
}

/* The rows the MoE runs on: the micro-batch's N, or under sequence parallelism this tp
 * rank's NL of them (the header's design: no gather). */
static int moe_rows(const block_sub *b)
{
    return b->d->sp ? b->NL : b->N;
}

/* The rows [lo, lo + n) of the micro-batch's N this rank sends to the experts: all of
 * them, or under ep or etp with tp (no sp) its tp rank's share (the header's design). */
typedef struct {
    int lo, n;
} moe_share;

/* Whether the tp ranks' copies of the rows would otherwise reach the experts more than
 * once: they leave the rank (ep's exchange, etp's gather) and are replicated over tp. */
static bool shares_rows(const ts_model *m)
{
    return (m->moe_dispatch || m->moe_expert_tp) && m->tp.size > 1 && !m->tp.sp;
}

static moe_share share_of(const ts_model *m, int N, int rank)
{
    if (!shares_rows(m)) return (moe_share){0, N};
    int64_t lo, n;
    ts_shard_range(N, m->tp.size, rank, &lo, &n);
    return (moe_share){(int)lo, (int)n};
}

/* Every tp rank's share of buf (N rows of `width` elements, in place) to every tp rank:
 * afterwards buf holds all N rows on each, in tp-rank order. */
static void gather_shares(const ts_model *m, void *buf, int N, int width, ts_dtype type)
{
    const int P = m->tp.size;
    int *counts = ts_malloc(2 * (size_t)P * sizeof(int)), *displs = counts + P;
    for (int r = 0; r < P; r++) {
        const moe_share s = share_of(m, N, r);
        counts[r] = s.n * width;
        displs[r] = s.lo * width;
    }
    ts_request req;
    ts_iallgather_act(m->tp.comm, buf, counts, displs, type, &req);
    ts_request_wait(&req);
    free(counts);
}

/* The router's input in fp32: the block's rows themselves in an fp32 run, else widened
 * into the saved moe_xf (bf16 -> fp32 is exact), which the backward reads again.
 * Megatron's moe_router_dtype = "fp32" and DeepSeek-V3's gate do the same; Hugging
 * Face's Mixtral runs the gate in bf16 and only its softmax in fp32, whose rounded logits
 * would flip near-tied selections between a bf16 and an fp32 run. */
static const float *router_input(const block_sub *b, const void *in)
{
    const ts_kernels *k = b->m->k;
    if (k->act_dtype == TS_DTYPE_F32) return in;
    k->convert(b->v.moe_xf, TS_DTYPE_F32, in, k->act_dtype, (size_t)moe_rows(b) * b->d->C);
    return b->v.moe_xf;
}

/* This micro-batch's tokens per expert on the host (the share's, which moe_counts holds),
 * and their exclusive prefix sum: the row slices the experts' matmuls run over. */
static void host_counts(const block_sub *b, int n_rows, int *counts, int *offsets)
{
    const int E = b->m->moe_experts;
    b->m->k->memcpy_d2h(counts, b->v.moe_counts, (size_t)E * sizeof(int));
    const int total = ts_moe_offsets(offsets, counts, E);
    /* dropless: every assignment has a row; with a capacity the kept ones */
    const int all = n_rows * b->m->moe_top_k;
    TS_ASSERT(b->m->moe_capacity > 0 ? total <= all : total == all);
}

/* ------------------------------------------------------------ the capacity */

/* The whole sequence's positions (cp.T under context parallelism, else the micro-batch's). */
static int sequence_len(const block_sub *b)
{
    return b->m->cp.size > 1 ? b->m->cp.T : b->T;
}

/* Each expert's capacity in a sequence of T positions (act_layout.h's
 * ts_moe_capacity_rows, which also bounds the exchange buffers). */
static int capacity_of(const ts_model *m, int T)
{
    return ts_moe_capacity_rows(T, m->moe_top_k, m->moe_experts, m->moe_capacity);
}

/* Local row r (of the micro-batch's B * Tl rows) as a row of the B whole sequences in
 * position order: its sequence's, at its global position (tensor/cp.h). */
static size_t whole_row(const ts_model *m, int r, int Tl, int T)
{
    const int q = r / Tl, t = r % Tl;
    return (size_t)q * T + (size_t)(m->cp.size > 1 ? ts_cp_position(&m->cp, t) : t);
}

/* The assignments this rank dispatches, keep [N*K] (device): moe_idx with those over
 * their expert's capacity TS_MOE_DROPPED. Rows that are whole sequences (no cp, no sp;
 * under tp without sp every tp rank decides all rows alike): the moe_capacity kernel on
 * them. A sequence split over ranks (cp: T/cp positions of each on each cp rank; sp: a
 * tp rank's contiguous rows of those, which may cut a sequence): each rank puts its rows'
 * (expert + 1, weight bits) at their rows of the whole sequences, the groups sum them
 * (integers, each slot one rank's, the others 0: an exact all-gather; 0 left is a row
 * nobody held), and every rank makes the same decision on the whole sequences with the
 * host's kernel and takes its own rows'. Collective over cp and (sp) tp, as
 * balance_split: every rank of those groups reaches it for the same layer and
 * micro-batch. */
static void capacity_keep(const block_sub *b, int N, int *keep)
{
    const ts_model *m = b->m;
    const ts_kernels *k = m->k;
    const int E = m->moe_experts, K = m->moe_top_k, T = sequence_len(b);
    const int capacity = capacity_of(m, T);
    if (!b->d->sp && m->cp.size <= 1) {
        k->moe_capacity(keep, b->v.moe_idx, b->v.moe_w, N, K, E, T, capacity);
        return;
    }
    const int B = b->B, Tl = b->T, row0 = b->d->sp ? m->tp.rank * N : 0;
    TS_ASSERT(row0 + N <= B * Tl);
    const size_t NK = (size_t)N * K, GK = (size_t)B * T * K;
    int *own = ts_malloc(2 * NK * sizeof(int)); /* this rank's idx, then its weights' bits */
    int *whole = ts_calloc(2 * GK, sizeof(int)); /* the same for the whole sequences */
    int *whole_keep = ts_malloc(GK * sizeof(int));
    float *whole_w = ts_malloc(GK * sizeof(float));
    k->memcpy_d2h(own, b->v.moe_idx, NK * sizeof(int));
    k->memcpy_d2h(own + NK, b->v.moe_w, NK * sizeof(float));
    for (int j = 0; j < N; j++) {
        const size_t g = whole_row(m, row0 + j, Tl, T) * K;
        for (int i = 0; i < K; i++) {
            whole[g + i] = own[(size_t)j * K + i] + 1;
            whole[GK + g + i] = own[NK + (size_t)j * K + i];
        }
    }
    if (m->cp.size > 1) ts_host_allreduce_sum_i32(m->cp.comm, whole, 2 * GK);
    if (b->d->sp) ts_host_allreduce_sum_i32(m->tp.comm, whole, 2 * GK);
    for (size_t a = 0; a < GK; a++) {
        TS_ASSERT(whole[a] >= 1 && whole[a] <= E); /* every row one rank's */
        whole[a]--;
    }
    memcpy(whole_w, whole + GK, GK * sizeof(float));
    ts_moe_capacity_keep(whole_keep, whole, whole_w, B * T, K, E, T, capacity);
    for (int j = 0; j < N; j++)
        memcpy(own + (size_t)j * K, whole_keep + whole_row(m, row0 + j, Tl, T) * K,
               (size_t)K * sizeof(int));
    k->memcpy_h2d(keep, own, NK * sizeof(int));
    free(whole_w);
    free(whole_keep);
    free(whole);
    free(own);
}

/* The step's counts of the kept assignments (model.moe_capacity > 0), from this rank's
 * share's, `share` (host, per expert): all N rows' on every rank that routes them, as
 * moe_count on moe_idx gives the dropless counts (trainer.c counts tp rank 0's once unless
 * under sp). Under shares_rows the tp ranks' shares are summed over tp first: a
 * collective over tp, reached by every tp rank in the same backward. */
static void count_kept(const block_sub *b, const int *share)
{
    const ts_model *m = b->m;
    const int E = m->moe_experts;
    int *sum = ts_malloc(2 * (size_t)E * sizeof(int)), *step = sum + E;
    memcpy(sum, share, (size_t)E * sizeof(int));
    if (shares_rows(m)) ts_host_allreduce_sum_i32(m->tp.comm, sum, (size_t)E);
    int *dev = m->moe_counts + (size_t)block_of(b) * E;
    m->k->memcpy_d2h(step, dev, (size_t)E * sizeof(int));
    for (int e = 0; e < E; e++) step[e] += sum[e];
    m->k->memcpy_h2d(dev, step, (size_t)E * sizeof(int));
    free(sum);
}

/* Whether the permuted rows leave this rank for the experts: over ep, or gathered over
 * etp (then they are read from, and written to, the exchange buffers). */
static bool rows_travel(const ts_model *m)
{
    return m->moe_dispatch || m->moe_expert_tp;
}

/* One micro-batch's trip of its permuted rows to the experts and back, in four calls
 * (experts_send, experts_arrive, experts_return, experts_returned): the ep exchange's
 * plan and its transfer in flight are the caller's (its stack), never the model's, since
 * another action may run at the ts_yield() between a start and its finish (core/yield.h)
 * and run this layer for its own micro-batch. (The etp plan is the model's: it is made,
 * used and done with between two yields.) */
typedef struct {
    ts_expert_plan plan; /* ep's, when m->moe_dispatch */
    ts_expert_xfer xfer; /* the direction in flight */
} moe_trip;

/* Whether a non-blocking exchange travels between a start and its finish, so the layer
 * computes what does not need it, polls it, and yields to a partner action. */
static bool travels(const ts_model *m)
{
    return m->moe_dispatch && m->moe_dispatch->overlap;
}

/* Let MPI move the exchange in flight (between the GEMMs that hide it). */
static void poll(const ts_model *m)
{
    if (travels(m)) ts_expert_dispatch_progress(m->moe_dispatch);
}

/* Start sending this rank's permuted rows `src` (counts[E] per expert) to the experts'
 * ep ranks (`work` receives them); nothing without ep. Collective over ep: every rank of
 * the group reaches it for the same layer and micro-batch, in the forward, the backward
 * (the plan made again from the saved counts) and a recompute. */
static void experts_send(const ts_model *m, const act_dims *d, moe_trip *t, const int *counts,
                         const void *src, void *work, char pass, int block)
{
    if (!m->moe_dispatch) return;
    ts_expert_plan_make(m->moe_dispatch, &t->plan, counts);
    TS_ASSERT((size_t)t->plan.n_recv <= d->MR);
    ts_expert_dispatch_start(m->moe_dispatch, &t->plan, &t->xfer, src, work, pass, block);
}

/* The rows this rank's experts process, in expert order: `src` itself on one rank; else
 * what experts_send's exchange brought, and gathered over etp, each expert's together,
 * into `buf` (`work`: the staging). Returns the rows per local expert. Collective over
 * etp (blocking: its gather is not overlapped). */
static const int *experts_arrive(const ts_model *m, const act_dims *d, moe_trip *t,
                                 const int *counts, void *buf, const void *src, void *work)
{
    const int *rows = counts;
    if (m->moe_dispatch) {
        ts_expert_dispatch_finish(m->moe_dispatch, &t->plan, &t->xfer, buf);
        rows = t->plan.expert_rows;
        src = buf;
    }
    ts_expert_tp *e = m->moe_expert_tp;
    if (e) {
        ts_expert_tp_plan(e, rows);
        TS_ASSERT((size_t)e->n_buf <= d->MR); /* etp * (the rows before the gather) */
        ts_expert_tp_gather(e, buf, src, work);
        rows = e->expert_rows;
    }
    return rows;
}

/* The reverse: the experts' results in `buf` (etp partials) summed over etp onto their
 * rows' ranks (blocking) and started back over ep into `dst`, this rank's permuted
 * order: into dst directly on one ep rank, else into `work`, the ep combine's input
 * (whose staging is then buf, read by now). Nothing to do when the rows stayed. */
static void experts_return(const ts_model *m, moe_trip *t, void *dst, void *buf, void *work,
                           char pass, int block)
{
    ts_expert_tp *e = m->moe_expert_tp;
    void *summed = buf;
    if (e) {
        summed = m->moe_dispatch ? work : dst;
        ts_expert_tp_reduce(e, summed, buf, work);
    }
    if (m->moe_dispatch)
        ts_expert_combine_start(m->moe_dispatch, &t->plan, &t->xfer, dst, summed, e ? buf : work,
                                pass, block);
}

/* The combine's rows are in dst; the trip's plan is done with. */
static void experts_returned(const ts_model *m, moe_trip *t)
{
    if (!m->moe_dispatch) return;
    ts_expert_combine_finish(m->moe_dispatch, &t->xfer);
    ts_expert_plan_free(&t->plan);
}

void ts_moe_forward(const block_sub *b, const void *in, void *out)
{
    const ts_model *m = b->m;
    const ts_kernels *k = m->k;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    const int N = moe_rows(b), C = (int)d->C, E = m->moe_experts, K = m->moe_top_k;
    const int F = m->moe_local_ffn; /* this rank's slice of each expert's width */
    const int SF = m->moe_shared_ffn;
    TS_ASSERT(d->S == 1 && m->moe_router_k);

    /* The router in fp32: its logits from the fp32 master weight and the rows, widened
     * (exactly) in a bf16 run, on the backend's fp32 table. */
    const float *xf = router_input(b, in);
    m->moe_router_k->matmul_forward(v->moe_logits, xf, ts_block_param(b, b->r.moe_router_w),
                                    NULL, N, C, E);
    k->moe_route_forward(&m->moe_routing, v->moe_scores, v->moe_idx, v->moe_w, v->moe_logits,
                         m->moe_bias + (size_t)block_of(b) * E, N);

    /* Dispatch: counts, offsets, the permuted rows of this rank's share. (The step's
     * counts, for the bias and the load metrics, are the backward's: a recomputed
     * forward, or an evaluation's, must not count twice.) With a capacity, the kept
     * assignments (capacity_keep), decided in moe_yp: free until the experts' outputs. */
    const moe_share sh = share_of(m, N, m->tp.rank);
    const int *dispatched = v->moe_idx;
    if (m->moe_capacity > 0) {
        TS_ASSERT((size_t)C * ts_dtype_bytes(k->act_dtype) >= sizeof(int));
        capacity_keep(b, N, (int *)v->moe_yp);
        dispatched = v->moe_yp;
    }
    const int *idx = dispatched + (size_t)sh.lo * K; /* a byte view */
    k->memset_zero(v->moe_counts, (size_t)E * sizeof(int));
    k->moe_count(v->moe_counts, idx, sh.n, K, E);
    int *counts = ts_malloc(2 * (size_t)E * sizeof(int)), *offsets = counts + E;
    host_counts(b, sh.n, counts, offsets);
    k->memcpy_h2d(v->moe_offsets, offsets, (size_t)E * sizeof(int));
    k->moe_permute(v->moe_xp, v->moe_row, act_at(d, in, (size_t)sh.lo * C), idx,
                   v->moe_offsets, sh.n, K, C, E);

    /* The rows go to the experts (kept in moe_xr for the backward's weight gradients when
     * they travel); meanwhile the shared experts' first GEMM and SwiGLU, which need only
     * the input (their own buffers: the same bits wherever they run), and a partner
     * action's turn (core/yield.h). */
    moe_trip trip = {0};
    experts_send(m, d, &trip, counts, v->moe_xp, v->moe_er, 'F', block_of(b));
    if (SF > 0) {
        k->matmul_forward(v->moe_sh_h, in, ts_block_weight(b, b->r.moe_shared_fc_w), NULL, N, C,
                          2 * SF);
        poll(m);
        k->swiglu_forward(v->moe_sh_a, v->moe_sh_h, N, SF);
    }
    if (travels(m)) ts_yield();

    /* Each expert's SwiGLU over its own rows. */
    const int L = m->moe_local_experts;
    const int *rows = experts_arrive(m, d, &trip, counts, v->moe_xr, v->moe_xp, v->moe_er);
    const void *xr = rows_travel(m) ? v->moe_xr : v->moe_xp;
    void *yr = rows_travel(m) ? v->moe_yr : v->moe_yp;
    const experts_w w = experts_weights(b, L, false);
    const int total = rows_total(rows, L);
    k->grouped_matmul_forward(v->moe_h, xr, w.fc, rows, L, C, 2 * F);
    poll(m); /* a partner action's exchange may be in flight */
    if (total > 0) k->swiglu_forward(v->moe_a, v->moe_h, total, F);
    k->grouped_matmul_forward(yr, v->moe_a, w.proj, rows, L, F, C);
    experts_weights_free(&w);
    /* Back to the tokens' rank; meanwhile the shared experts' second GEMM. */
    experts_return(m, &trip, v->moe_yp, v->moe_yr, v->moe_er, 'F', block_of(b));
    if (SF > 0)
        k->matmul_forward(v->moe_sh_out, v->moe_sh_a, ts_block_weight(b, b->r.moe_shared_proj_w),
                          NULL, N, SF, C);
    if (travels(m)) ts_yield();
    experts_returned(m, &trip);
    free(counts);
    k->moe_combine(act_at(d, out, (size_t)sh.lo * C), v->moe_yp, v->moe_w + (size_t)sh.lo * K,
                   v->moe_row, sh.n, K, C);
    if (shares_rows(m)) gather_shares(m, out, N, C, k->act_dtype);
    if (SF > 0) k->residual_forward(out, out, v->moe_sh_out, (size_t)N * C);
}

/* The sequence-wise balance loss when a sequence's rows are split over ranks: under
 * context parallelism each cp rank holds T/cp positions of each of the micro-batch's B
 * sequences (local rows [q*Tl, (q+1)*Tl) are sequence q's, whichever chunks they are:
 * the loss sums over a sequence's positions, in no order), and under sequence
 * parallelism each tp rank holds the contiguous rows [tp.rank*NL, +NL) of those B*Tl,
 * which may cut sequences. f needs each whole sequence's counts: each rank counts its
 * rows per sequence into seq_counts [B,E], the counts are summed over the cp group and
 * (under sp) the tp group, integers, so every rank holds the same exact counts, and the
 * kernel adds the rows' share of the loss and its gradient (P is a sum over rows: the
 * shares add up over the ranks, as trainer.c's metrics sum every cp rank's and, under
 * sp, every tp rank's losses). The sums are collective: every rank of those groups
 * reaches this point for the same layer and micro-batch, as for cp's attention. */
static void balance_split(const block_sub *b, const moe_scratch *s, int N)
{
    const ts_model *m = b->m;
    const ts_kernels *k = m->k;
    const int E = m->moe_experts, K = m->moe_top_k, B = b->B, Tl = b->T;
    const int row0 = b->d->sp ? m->tp.rank * N : 0;
    const int *idx = b->v.moe_idx;
    TS_ASSERT(row0 + N <= B * Tl);
    k->memset_zero(s->seq_counts, (size_t)B * E * sizeof(int));
    for (int q = row0 / Tl; q < B && q * Tl < row0 + N; q++) {
        const int lo = q * Tl > row0 ? q * Tl : row0;
        const int hi = (q + 1) * Tl < row0 + N ? (q + 1) * Tl : row0 + N;
        k->moe_count(s->seq_counts + (size_t)q * E, idx + (size_t)(lo - row0) * K, hi - lo, K,
                     E);
    }
    int *host = ts_malloc((size_t)B * E * sizeof(int));
    k->memcpy_d2h(host, s->seq_counts, (size_t)B * E * sizeof(int));
    if (m->cp.size > 1) ts_host_allreduce_sum_i32(m->cp.comm, host, (size_t)B * E);
    if (b->d->sp) ts_host_allreduce_sum_i32(m->tp.comm, host, (size_t)B * E);
    k->memcpy_h2d(s->seq_counts, host, (size_t)B * E * sizeof(int));
    free(host);
    /* aux_scale = 1/B_glob = dloss * (the whole sequence's T) */
    const int T = m->cp.T;
    k->moe_balance_forward_backward(&m->moe_routing, m->moe_losses + 1, s->dlogits,
                                    b->v.moe_scores, s->seq_counts, N, row0, Tl, T,
                                    m->moe_aux_coef, b->dloss * (float)T);
}

/* The router's backward: the weights' gradient through the renormalisation and the
 * scores, the auxiliary losses' added (their values summed for the metrics), then its
 * matmul, into din (overwritten: the first of din's three terms). The losses are per
 * sequence of T rows over the global batch: dloss = 1/(B_glob T). Needs s->dw on every
 * row (gathered over tp when shared). */
static void router_backward(const block_sub *b, const moe_scratch *s, void *din, const void *in,
                            int N)
{
    const ts_model *m = b->m;
    const ts_kernels *k = m->k;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    const int C = (int)d->C, E = m->moe_experts;
    k->moe_route_backward(&m->moe_routing, s->dlogits, s->dw, v->moe_scores, v->moe_idx, N);
    /* Under sequence parallelism a rank's rows need not be whole sequences (the z-loss is
     * per row: T = 1), and under context parallelism they are T/cp positions of each:
     * the balance loss then takes its counts from every rank holding part of a sequence
     * (balance_split). */
    const bool split = d->sp || m->cp.size > 1;
    if (m->moe_z_coef > 0.0f || (m->moe_aux_coef > 0.0f && !split))
        k->moe_aux_forward_backward(&m->moe_routing, m->moe_losses, m->moe_losses + 1,
                                    s->dlogits, v->moe_logits, v->moe_scores, v->moe_idx, N,
                                    d->sp ? 1 : b->T, m->moe_z_coef,
                                    split ? 0.0f : m->moe_aux_coef, b->dloss,
                                    b->dloss * (float)b->T);
    if (m->moe_aux_coef > 0.0f && split) balance_split(b, s, N);
    /* Its fp32 GEMMs, as the forward's: the weight's gradient from the saved fp32 rows,
     * the input's in fp32, rounded once to the activation dtype (dxf) before the sum with
     * the experts' path, as PyTorch's autograd rounds x.float()'s gradient. */
    const bool f32 = k->act_dtype == TS_DTYPE_F32;
    const float *xf = f32 ? (const float *)in : v->moe_xf;
    const int rw = b->r.moe_router_w;
    m->moe_router_k->matmul_backward(f32 ? din : s->dxf, ts_block_grad(b, rw), NULL, s->dlogits,
                                     xf, ts_block_param(b, rw), N, C, E);
    if (!f32) k->convert(din, k->act_dtype, s->dxf, TS_DTYPE_F32, (size_t)N * C);
}

void ts_moe_backward(const block_sub *b, void *din, const void *dout, const void *in)
{
    const ts_model *m = b->m;
    const ts_kernels *k = m->k;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    const int N = moe_rows(b), C = (int)d->C, E = m->moe_experts, K = m->moe_top_k;
    const int F = m->moe_local_ffn; /* this rank's slice of each expert's width */
    const int SF = m->moe_shared_ffn;
    /* Under the zero-bubble split (b->stash) the MoE's weight gradients are made here, in
     * the input pass, not deferred: correct, the W pass has less to do. */
    TS_ASSERT(d->S == 1 && b->sc);
    const moe_scratch s = ts_scratch_moe(m, b->sc, b->B, b->T);
    /* This micro-batch's selections into the step's counts: once per micro-batch (with
     * a capacity, the kept ones: count_kept below). */
    if (m->moe_capacity <= 0)
        k->moe_count(m->moe_counts + (size_t)block_of(b) * E, v->moe_idx, N, K, E);

    /* The combine's: each assignment's output gradient, and the routing weights', for
     * this rank's share of the rows. */
    const moe_share sh = share_of(m, N, m->tp.rank);
    k->moe_combine_backward(s.dyp, s.dw + (size_t)sh.lo * K, act_at(d, dout, (size_t)sh.lo * C),
                            v->moe_yp, v->moe_w + (size_t)sh.lo * K, v->moe_row, sh.n, K, C);

    /* Under expert parallelism the output gradients travel to the experts' ranks as the
     * inputs did (the plan made again from the saved counts: the same collective order
     * as the forward's). Meanwhile what needs only dout and dw: the router's backward
     * (din's first term; under shared rows every row's dw gathered over tp first), the
     * shared experts' down projection and SwiGLU backward (their own buffers), and a
     * partner action's turn. din's terms are still summed in the order router, experts,
     * shared experts: the same bits as one after the other. */
    int *counts = ts_malloc(2 * (size_t)E * sizeof(int)), *offsets = counts + E;
    host_counts(b, sh.n, counts, offsets);
    if (m->moe_capacity > 0) count_kept(b, counts);
    moe_trip trip = {0};
    experts_send(m, d, &trip, counts, s.dyp, s.er, 'B', block_of(b));
    if (shares_rows(m)) gather_shares(m, s.dw, N, K, TS_DTYPE_F32);
    router_backward(b, &s, din, in, N);
    poll(m);
    if (SF > 0) {
        k->matmul_backward(s.sh_da, ts_block_grad(b, b->r.moe_shared_proj_w), NULL, dout,
                           v->moe_sh_a, ts_block_weight(b, b->r.moe_shared_proj_w), N, SF, C);
        poll(m);
        k->swiglu_backward(s.sh_dh, v->moe_sh_h, s.sh_da, N, SF);
    }
    if (travels(m)) ts_yield();

    /* The experts back to their input rows: dxp overwrites dyp's rows, which the down
     * projections' grouped backward has read by then. */
    const int L = m->moe_local_experts;
    const int *rows = experts_arrive(m, d, &trip, counts, s.dyr, s.dyp, s.er);
    const void *xr = rows_travel(m) ? v->moe_xr : v->moe_xp;
    void *dyr = rows_travel(m) ? s.dyr : s.dyp;
    const experts_w w = experts_weights(b, L, true);
    const int total = rows_total(rows, L);
    k->grouped_matmul_backward(s.da, w.dproj, dyr, v->moe_a, w.proj, rows, L, F, C);
    poll(m);
    if (total > 0) k->swiglu_backward(s.dh, v->moe_h, s.da, total, F);
    k->grouped_matmul_backward(dyr, w.dfc, s.dh, xr, w.fc, rows, L, C, 2 * F);
    experts_weights_free(&w);
    /* The input gradients come back as the outputs did; meanwhile, under ep, the shared
     * experts' first GEMM's weight gradient (its input gradient needs s.dx, which the
     * experts' term occupies until it is added). */
    experts_return(m, &trip, s.dyp, s.dyr, s.er, 'B', block_of(b));
    const int sfc = b->r.moe_shared_fc_w;
    const bool fc_split = SF > 0 && m->moe_dispatch;
    if (fc_split)
        k->matmul_backward(NULL, ts_block_grad(b, sfc), NULL, s.sh_dh, in,
                           ts_block_weight(b, sfc), N, C, 2 * SF);
    if (travels(m)) ts_yield();
    experts_returned(m, &trip);
    free(counts);
    k->moe_permute_backward(act_at(d, s.dx, (size_t)sh.lo * C), s.dyp, v->moe_row, sh.n, K, C);
    if (shares_rows(m)) gather_shares(m, s.dx, N, C, k->act_dtype); /* every row's */
    k->residual_forward(din, din, s.dx, (size_t)N * C);

    if (SF > 0) {
        k->matmul_backward(s.dx, fc_split ? NULL : ts_block_grad(b, sfc), NULL, s.sh_dh, in,
                           ts_block_weight(b, sfc), N, C, 2 * SF);
        k->residual_forward(din, din, s.dx, (size_t)N * C);
    }
}

/* ------------------------------------------------------- the step's state */

void ts_model_moe_begin(const ts_model *m)
{
    if (m->moe_experts == 0) return;
    m->k->memset_zero(m->moe_counts, (size_t)ts_model_blocks(m) * m->moe_experts * sizeof(int));
    m->k->memset_zero(m->moe_losses, 2 * sizeof(float));
}

void ts_model_moe_read(const ts_model *m, int *counts, float *losses)
{
    if (m->moe_experts == 0) return;
    m->k->memcpy_d2h(counts, m->moe_counts, (size_t)ts_model_blocks(m) * m->moe_experts * sizeof(int));
    m->k->memcpy_d2h(losses, m->moe_losses, 2 * sizeof(float));
}

void ts_model_moe_update_bias(ts_model *m, const int *counts, long long tokens, float rate)
{
    const int E = m->moe_experts;
    if (E == 0 || rate <= 0.0f) return;
    const size_t n = (size_t)ts_model_blocks(m) * E;
    float *bias = ts_malloc(n * sizeof(float));
    m->k->memcpy_d2h(bias, m->moe_bias, n * sizeof(float));
    /* mean and count compared exactly (in double: N*K/E need not be whole). The mean is
     * the counts' own, as Megatron's (tokens_per_expert.mean()): tokens * K / E dropless,
     * the kept assignments' mean under a capacity. */
    for (int l = 0; l < ts_model_blocks(m); l++) {
        if (!m->layers[ts_model_block_layer(m, l)].moe) continue;
        long long sum = 0;
        for (int e = 0; e < E; e++) sum += counts[(size_t)l * E + e];
        const long long all = tokens * m->moe_top_k; /* every selection */
        TS_ASSERT(m->moe_capacity > 0 ? sum <= all : sum == all);
        const double mean = (double)sum / E;
        for (int e = 0; e < E; e++) {
            const double c = counts[(size_t)l * E + e];
            const float sign = c < mean ? 1.0f : c > mean ? -1.0f : 0.0f;
            bias[(size_t)l * E + e] += rate * sign;
        }
    }
    m->k->memcpy_h2d(m->moe_bias, bias, n * sizeof(float));
    free(bias);
}

double ts_moe_dropped_share(const ts_model *m, const int *counts, long long tokens)
{
    const int E = m->moe_experts;
    long long kept = 0, all = 0;
    for (int l = 0; l < ts_model_blocks(m) && E > 0; l++) {
        if (!m->layers[ts_model_block_layer(m, l)].moe) continue;
        for (int e = 0; e < E; e++) kept += counts[(size_t)l * E + e];
        all += tokens * m->moe_top_k;
    }
    TS_ASSERT(kept <= all);
    return all > 0 ? (double)(all - kept) / (double)all : 0.0;
}

double ts_moe_worst_load(const ts_model *m, const int *counts)
{
    const int E = m->moe_experts;
    double worst = 0.0;
    for (int l = 0; l < ts_model_blocks(m) && E > 0; l++) {
        long long sum = 0, most = 0;
        for (int e = 0; e < E; e++) {
            const long long c = counts[(size_t)l * E + e];
            sum += c;
            most = c > most ? c : most;
        }
        const double load = sum > 0 ? (double)most * E / (double)sum : 0.0;
        worst = load > worst ? load : worst;
    }
    return worst;
}
