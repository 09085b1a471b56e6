#include "pipeline/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/env.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"
#include "pipeline/memory.h"
#include "pipeline/pair.h"

/* One message tag for every pipeline transfer: messages are matched by their order
 * (exchange.h), which MPI keeps between two ranks, as NCCL does without tags. */
enum { PP_TAG = 0 };

static ts_status pairs_init(ts_engine *e);

static int chunk_first(const ts_engine *e, int c) { return e->part->first_layer[c]; }
static int chunk_end(const ts_engine *e, int c)
{
    return e->part->first_layer[c] + e->part->n_chunk_layers[c];
}
static bool is_local(const ts_engine *e, int c) { return ts_chunk_rank(e->sched, c) == e->pp_rank; }
static ts_mb_slot *slot(ts_engine *e, int c, int mb)
{
    return &e->slots[(size_t)e->local_of_chunk[c] * e->m + mb];
}

ts_status ts_engine_init(ts_engine *e, const ts_config *cfg, ts_model *model,
                         const ts_schedule *sched, const ts_partition *part,
                         ts_sampler *data, const ts_comm *pp, int dp_rank, const int *keep)
{
    memset(e, 0, sizeof *e);
    e->cfg = cfg;
    e->model = model;
    e->sched = sched;
    e->part = part;
    e->data = data;
    e->pp = pp;
    e->pp_rank = pp->rank;
    e->dp = cfg->parallel.dp;
    e->dp_rank = dp_rank;
    e->n_chunks = sched->n_chunks;
    e->m = sched->m;
    e->B = cfg->parallel.micro_batch;
    e->seq_len = cfg->model.seq_len;
    e->T = ts_cp_local_len(&model->cp); /* model->cp.T == seq_len */
    TS_ASSERT(model->cp.T == e->seq_len);
    e->N = e->B * e->T;
    e->C = cfg->model.n_embd;
    e->rows = ts_tp_rows(&model->tp, e->N); /* a chunk's boundary: this rank's rows */
    e->act = model->k->act_dtype;
    e->nc_bytes = (size_t)e->rows * e->C * ts_dtype_bytes(e->act);
    /* Which forwards keep only their input: decided once, by the rule the memory
     * estimate counted. */
    const int recompute = ts_recompute_from_name(cfg->parallel.recompute); /* validated */
    if (recompute == TS_RECOMPUTE_AUTO && !keep)
        return ts_fail("parallel.recompute = \"auto\" needs the caps the memory check chose");

    /* The order of the step's sends and receives, derived from the schedule. */
    if (ts_xchg_build(&e->xchg, sched) != TS_OK) return ts_error_prefix("pipeline exchange: ");
    const char *mode = ts_env(TS_ENV_PP_EXCHANGE); /* a test switch: core/env.h */
    /* NCCL point-to-point must be issued as groups (a send posted alone blocks until
     * its receive is posted), so its transfers always take the grouped path. */
    e->grouped = (mode && !strcmp(mode, "grouped")) || !strcmp(pp->ops->name, "nccl");
    if (pp->size > 1) {
        const int r = e->pp_rank, n_ops = e->xchg.n_ops[r];
        const ts_xchg_op *ops = e->xchg.ops[r];
        e->sends = ts_calloc((size_t)n_ops + 1, sizeof *e->sends);
        e->send_first = ts_calloc((size_t)pp->size + 1, sizeof(int));
        e->send_next = ts_calloc((size_t)pp->size, sizeof(int));
        for (int k = 0; k < n_ops; k++)
            if (ops[k].kind == TS_XCHG_SEND) e->send_first[ops[k].peer + 1]++;
        for (int p = 0; p < pp->size; p++) e->send_first[p + 1] += e->send_first[p];
        for (int p = 0; p < pp->size; p++) e->send_next[p] = e->send_first[p];
        for (int k = 0; k < n_ops; k++)
            if (ops[k].kind == TS_XCHG_SEND) e->sends[e->send_next[ops[k].peer]++] = &ops[k];
    }

    e->local_of_chunk = ts_malloc((size_t)e->n_chunks * sizeof(int));
    e->local_chunks = ts_malloc((size_t)e->n_chunks * sizeof(int));
    for (int c = 0; c < e->n_chunks; c++) {
        e->local_of_chunk[c] = -1;
        if (is_local(e, c)) {
            e->local_of_chunk[c] = e->n_local;
            e->local_chunks[e->n_local++] = c;
        }
    }
    e->recomputed = ts_calloc((size_t)e->n_chunks * e->m, sizeof(bool));
    ts_memory_peak_sets(sched, recompute, keep, e->pp_rank, NULL, NULL, NULL, e->recomputed);
    const ts_kernels *k = model->k;
    const size_t NCB = e->nc_bytes, NI = (size_t)e->N * sizeof(int);
    /* The step's sum, the evaluation's and its multi-token prediction depths'. */
    e->loss_acc = k->dev_alloc((2 + (size_t)model->mtp_layers) * sizeof(double));
    e->tokens_host = ts_calloc((size_t)e->B * e->seq_len, sizeof(int));
    e->targets_host = ts_calloc((size_t)e->B * e->seq_len, sizeof(int));
    e->local_host = ts_calloc((size_t)e->N, sizeof(int));
    e->slots = ts_calloc((size_t)e->n_local * e->m, sizeof *e->slots);
    for (int j = 0; j < e->n_local; j++) {
        int c = e->local_chunks[j];
        for (int mb = 0; mb < e->m; mb++) {
            ts_mb_slot *s = &e->slots[(size_t)j * e->m + mb];
            if (c > 0) s->in = k->dev_alloc(NCB);
            s->dx = k->dev_alloc(NCB);
            if (e->recomputed[(size_t)c * e->m + mb]) { /* its replay's buffers */
                s->tokens = k->dev_alloc(NI);
                s->targets = k->dev_alloc(NI);
                if (c < e->n_chunks - 1) s->out = k->dev_alloc(NCB);
            }
        }
    }
    e->free_acts = ts_calloc((size_t)e->n_local, sizeof *e->free_acts);
    e->n_free = ts_calloc((size_t)e->n_local, sizeof(int));
    e->cap_free = ts_calloc((size_t)e->n_local, sizeof(int));
    e->n_allocated = ts_calloc((size_t)e->n_local, sizeof(int));
    e->bwd_done = ts_calloc((size_t)e->n_local, sizeof(int));
    e->produced = ts_calloc((size_t)e->n_local * e->m * 2, sizeof(bool));
    ts_scratch_init(&e->scratch, model, e->B, e->T);

    if (pairs_init(e) != TS_OK) {
        ts_engine_free(e);
        return TS_ERR;
    }

    /* World ranks of the pipeline peers, so a watchdog message names the rank to look at. */
    e->pp_world = ts_calloc((size_t)(e->pp->size > 0 ? e->pp->size : 1), sizeof(int));
    ts_comm_world_ranks(e->pp, e->pp_world);
    return TS_OK;
}

void ts_engine_free(ts_engine *e)
{
    if (!e->slots) return;
    const ts_kernels *k = e->model->k;
    for (size_t i = 0; i < (size_t)e->n_local * e->m; i++) {
        ts_mb_slot *s = &e->slots[i];
        if (s->acts) {
            ts_acts_free(s->acts);
            free(s->acts);
        }
        k->dev_free(s->in);
        k->dev_free(s->dx);
        k->dev_free(s->out);
        k->dev_free(s->tokens);
        k->dev_free(s->targets);
    }
    k->dev_free(e->loss_acc);
    free(e->tokens_host);
    free(e->targets_host);
    free(e->local_host);
    for (int j = 0; j < e->n_local; j++) {
        for (int k = 0; k < e->n_free[j]; k++) {
            ts_acts_free(&e->free_acts[j][k]);
        }
        free(e->free_acts[j]);
    }
    free(e->free_acts);
    free(e->n_free);
    free(e->cap_free);
    free(e->n_allocated);
    free(e->bwd_done);
    free(e->slots);
    free(e->local_chunks);
    free(e->local_of_chunk);
    free(e->pp_world);
    free(e->sends);
    free(e->send_first);
    free(e->send_next);
    free(e->produced);
    free(e->recomputed);
    ts_xchg_free(&e->xchg);
    ts_scratch_free(&e->scratch);
    if (e->pair) ts_pair_free(e->pair);
    free(e->pair);
    free(e->paired);
    free(e->pair_runs);
    memset(e, 0, sizeof *e);
}

/* ---- activation sets: a free list per chunk, grown on demand to the schedule's peak */

static ts_acts *acquire_acts(ts_engine *e, int c)
{
    int j = e->local_of_chunk[c];
    ts_acts *a = ts_malloc(sizeof *a);
    if (e->n_free[j] > 0) {
        *a = e->free_acts[j][--e->n_free[j]];
    } else {
        ts_acts_init(a, e->model, chunk_first(e, c), chunk_end(e, c), e->B, e->T);
        a->att_work = ts_scratch_attention_work(&e->scratch, e->model, e->B, e->T);
        a->sp_work = ts_scratch_sequence_work(&e->scratch, e->model, e->B, e->T);
        a->cp_work = ts_scratch_context_work(&e->scratch, e->model, e->B, e->T);
        a->mla_work = ts_scratch_mla_work(&e->scratch, e->model, e->B, e->T);
        e->n_allocated[j]++;
    }
    return a;
}

static void release_acts(ts_engine *e, int c, ts_mb_slot *s)
{
    int j = e->local_of_chunk[c];
    /* The output may still be in flight from these activations. */
    if (!s->out) ts_request_wait(&s->send_out);
    if (e->n_free[j] == e->cap_free[j]) {
        e->cap_free[j] = e->cap_free[j] ? 2 * e->cap_free[j] : 4;
        ts_acts *grown = ts_malloc((size_t)e->cap_free[j] * sizeof *grown);
        if (e->n_free[j]) memcpy(grown, e->free_acts[j], (size_t)e->n_free[j] * sizeof *grown);
        free(e->free_acts[j]);
        e->free_acts[j] = grown;
    }
    e->free_acts[j][e->n_free[j]++] = *s->acts;
    free(s->acts);
    s->acts = NULL;
}

size_t ts_engine_activation_bytes(const ts_engine *e)
{
    /* Sized, not allocated: an allocated probe set (dev_alloc zeroes its pages) was once
     * the report's own extra activation set, the process's real peak. */
    size_t total = 0;
    for (int j = 0; j < e->n_local; j++) {
        int c = e->local_chunks[j];
        total += (size_t)e->n_allocated[j] *
                 ts_acts_bytes(e->model, chunk_first(e, c), chunk_end(e, c), e->B, e->T);
    }
    return total;
}

/* ---------------------------------------------------------------- tracing */

static void record(ts_engine *e, const char *cat, const char *name, int chunk, int mb, double t0,
                   double t1)
{
    if (!e->trace) return;
    ts_trace_event ev = ts_trace_event_make(cat, ts_log_rank(), chunk, mb,
                                            (t0 - e->trace_t0_ms) * 1e3, (t1 - t0) * 1e3);
    snprintf(ev.name, sizeof ev.name, "%s", name); /* the action's own name */
    ts_trace_add(e->trace, &ev);
}

/* What each action is, for the watchdog: running it, and waiting for its input. */
static const char *const k_running[] = {"running F(chunk %d, mb %d)", "running B(chunk %d, mb %d)",
                                        "running I(chunk %d, mb %d)", "running W(chunk %d, mb %d)"};
static const char *const k_recv_input =
    "pipeline receive of the input of F(chunk %d, mb %d) from world rank %d";
static const char *const k_recv_grad = "pipeline receive of the output gradient for the "
                                       "backward of chunk %d, mb %d, from world rank %d";

/* Wait for a receive (context: one of k_recv_*; peer: the sender's pipeline rank, named
 * by its world rank), accounting the time as idle (the bubble) and tracing it. */
static void wait_recv(ts_engine *e, ts_request *r, int chunk, int mb, const char *context, int peer)
{
    if (!r->active) return;
    ts_watchdog_context(context, chunk, mb, e->pp_world[peer]);
    double t0 = ts_now_ms();
    ts_request_wait(r);
    double t1 = ts_now_ms();
    if (t1 - t0 > 0.01) record(e, "wait", "wait", chunk, mb, t0, t1);
}

/* ---------------------------------------------------------------- actions */

static bool recomputes(const ts_engine *e, int c, int mb)
{
    return e->recomputed[(size_t)c * e->m + mb];
}

/* Host ids [B, seq_len] to the device's [B, T]: under context parallelism this rank's
 * positions of each sequence (tensor/cp.h), else all of them. */
static void ids_to_device(const ts_engine *e, int *dev, const int *host, int B)
{
    const int *src = host;
    if (e->model->cp.size > 1) {
        ts_cp_select(&e->model->cp, e->local_host, host, B);
        src = e->local_host;
    }
    e->model->k->memcpy_h2d(dev, src, (size_t)B * e->T * sizeof(int));
}

/* Fill the micro-batch's tokens (first chunk) and targets (last chunk): read on the
 * host, then one copy each to the device. Every context-parallel rank of a replica
 * reads the same sequences. */
static void load_batch(ts_engine *e, int step, int mb, ts_acts *a)
{
    (void)step; /* the data position is the step's first sequence, e->seq0 */
    ts_data_microbatch(e->data, e->seq0, e->batch, e->dp, e->dp_rank, e->B, mb,
                       e->seq_len, e->tokens_host, e->targets_host);
    ids_to_device(e, a->tokens, e->tokens_host, e->B);
    ids_to_device(e, a->targets, e->targets_host, e->B);
}

static void forward(ts_engine *e, int step, int c, int mb, ts_mb_slot *s, bool replay)
{
    ts_acts *a = s->acts;
    a->input = c > 0 ? s->in : NULL;
    if (replay) {
        e->model->k->memcpy_d2d(a->tokens, s->tokens, (size_t)e->N * sizeof(int));
        e->model->k->memcpy_d2d(a->targets, s->targets, (size_t)e->N * sizeof(int));
        /* the whole sequences again, for the shifted ids and the document starts */
        if (a->mtp_ids || a->doc_start)
            ts_data_microbatch(e->data, e->seq0, e->batch, e->dp, e->dp_rank,
                               e->B, mb, e->seq_len, e->tokens_host, e->targets_host);
    } else {
        load_batch(e, step, mb, a);
    }
    /* Multi-token prediction's shifted ids, from the whole sequences on the host. */
    ts_acts_set_mtp_ids(e->model, a, e->targets_host, e->seq_len);
    /* Packed documents' starts, from the whole windows (every stage reads them). */
    ts_acts_set_documents(e->model, a, e->tokens_host, e->seq_len);
    /* MFU's attention pairs: each sequence once, at the first chunk's first forward. */
    if (!replay && c == 0) e->doc_pairs += a->doc_pairs;
    /* The step's batch (train.batch_rampup's, or train.global_batch). */
    const float dloss = 1.0f / ((float)e->batch * (float)e->seq_len);
    /* The loss of a replayed forward was counted the first time. */
    ts_model_forward(e->model, a, dloss, replay || c != e->n_chunks - 1 ? NULL : e->loss_acc);
}

/* ---- an action in three parts: its pre-work (waiting for its input, taking its
 * activation set), its body (the compute: what an overlapped pair runs on two threads,
 * pair.h) and its post-work (releasing, accounting, tracing). A plain action runs the
 * three in a row; a pair runs both pre-works, then the bodies, then both post-works, all
 * but the bodies on the engine's thread. */
typedef struct {
    ts_engine *e;
    int step;
    ts_action a;
    bool replay;       /* B/I: the forward is recomputed first (only the input was kept) */
    bool last;         /* B: the chunk's last backward of the step (layer_done per layer) */
    double t0;         /* the body's start (paired: its first segment's) */
    double busy_ms;    /* the body's own compute (paired: its segments' sum) */
    int n_segments;    /* paired: segments so far */
} action_run;

static void forward_pre(ts_engine *e, action_run *r)
{
    const int c = r->a.chunk, mb = r->a.mb;
    ts_mb_slot *s = slot(e, c, mb);
    if (c > 0 && !is_local(e, c - 1))
        wait_recv(e, &s->recv_in, c, mb, k_recv_input, ts_chunk_rank(e->sched, c - 1));
    s->acts = acquire_acts(e, c);
}

static void forward_body(ts_engine *e, const action_run *r)
{
    const int c = r->a.chunk, mb = r->a.mb;
    ts_mb_slot *s = slot(e, c, mb);
    forward(e, r->step, c, mb, s, false);
    if (c < e->n_chunks - 1) {
        void *y = ts_acts_output(e->model, s->acts, chunk_end(e, c) - 1);
        if (is_local(e, c + 1))
            e->model->k->memcpy_d2d(slot(e, c + 1, mb)->in, y, e->nc_bytes);
        else if (s->out) /* the activations may go before the exchange sends them: a copy */
            e->model->k->memcpy_d2d(s->out, y, e->nc_bytes);
    }
    if (recomputes(e, c, mb)) {
        /* Keep only the chunk's input (s->in) and the tokens; recompute before the
         * backward (the post-work releases the rest). The last chunk's loss was counted
         * now, not at the replay. */
        e->model->k->memcpy_d2d(s->tokens, s->acts->tokens, (size_t)e->N * sizeof(int));
        e->model->k->memcpy_d2d(s->targets, s->acts->targets, (size_t)e->N * sizeof(int));
    }
}

static void forward_post(ts_engine *e, const action_run *r)
{
    const int c = r->a.chunk, mb = r->a.mb;
    if (recomputes(e, c, mb)) release_acts(e, c, slot(e, c, mb));
}

/* The step's last backward through `layer`: its gradients are final (sequence
 * parallelism's norm sums first). */
static void layer_done(void *ctx, int layer)
{
    ts_engine *e = ctx;
    ts_model_sum_sequence_grads(e->model, layer);
    if (e->chunk_done) e->chunk_done(e->chunk_done_ctx, layer, layer + 1);
}

/* `per_layer`: the last backward reported each layer already (a full backward's). */
static void chunk_backward_done(ts_engine *e, int c, bool per_layer)
{
    int j = e->local_of_chunk[c];
    if (++e->bwd_done[j] < e->m) return;
    if (!per_layer)
        for (int l = chunk_first(e, c); l < chunk_end(e, c); l++)
            ts_model_sum_sequence_grads(e->model, l);
    if (e->chunk_done) e->chunk_done(e->chunk_done_ctx, chunk_first(e, c), chunk_end(e, c));
}

static void backward_pre(ts_engine *e, action_run *r)
{
    const int c = r->a.chunk, mb = r->a.mb;
    const ts_action_kind kind = r->a.kind;
    ts_mb_slot *s = slot(e, c, mb);
    if (kind != TS_ACT_W && c < e->n_chunks - 1 && !is_local(e, c + 1))
        wait_recv(e, &s->recv_dy, c, mb, k_recv_grad, ts_chunk_rank(e->sched, c + 1));
    if (kind != TS_ACT_W && !s->acts) { /* recomputation: the body replays the forward */
        s->acts = acquire_acts(e, c);
        r->replay = true;
    }
    /* The chunk's last backward of the step: each layer's gradients are final as soon as
     * the backward leaves it, so report per layer (the dp all-reduce of the first
     * buckets starts while the rest of the backward runs). */
    r->last = kind == TS_ACT_B && e->bwd_done[e->local_of_chunk[c]] == e->m - 1;
}

static void backward_body(ts_engine *e, const action_run *r)
{
    const int c = r->a.chunk, mb = r->a.mb;
    const ts_action_kind kind = r->a.kind;
    ts_mb_slot *s = slot(e, c, mb);
    if (kind == TS_ACT_W) {
        ts_model_backward_weight(e->model, s->acts, &e->scratch);
        return;
    }
    if (r->replay) forward(e, r->step, c, mb, s, true);
    if (c < e->n_chunks - 1 && is_local(e, c + 1))
        e->model->k->memcpy_d2d(s->dx, slot(e, c + 1, mb)->dx, e->nc_bytes);
    if (kind == TS_ACT_B)
        ts_model_backward(e->model, s->acts, s->dx, &e->scratch, r->last ? layer_done : NULL, e);
    else
        ts_model_backward_input(e->model, s->acts, s->dx, &e->scratch);
}

static void backward_post(ts_engine *e, const action_run *r)
{
    const int c = r->a.chunk;
    if (r->a.kind != TS_ACT_I) {
        release_acts(e, c, slot(e, c, r->a.mb));
        chunk_backward_done(e, c, r->a.kind == TS_ACT_B);
    }
}

static void action_pre(ts_engine *e, action_run *r)
{
    if (r->a.kind == TS_ACT_F)
        forward_pre(e, r);
    else
        backward_pre(e, r);
}

/* The body (pair.h's ts_pair_body): what runs between the two. Marks the watchdog as
 * whichever thread runs it (pair.h: one at a time, the baton's holder). */
static ts_status action_body(void *ctx)
{
    const action_run *r = ctx;
    ts_watchdog_context(k_running[r->a.kind], r->a.chunk, r->a.mb, 0);
    /* This thread's action, for the spans recorded inside (an MoE's all-to-all). */
    ts_trace_set_action(r->a.chunk, r->a.mb);
    if (r->a.kind == TS_ACT_F)
        forward_body(r->e, r);
    else
        backward_body(r->e, r);
    ts_trace_set_action(-1, -1);
    return TS_OK;
}

/* Releases, then the accounting: the body's compute time and its span on the trace. */
static void action_post(ts_engine *e, const action_run *r)
{
    if (r->a.kind == TS_ACT_F)
        forward_post(e, r);
    else
        backward_post(e, r);
    e->compute_ms += r->busy_ms;
    char name[16];
    snprintf(name, sizeof name, "%c%d", "FBIW"[r->a.kind], r->a.mb);
    static const char *const cats[] = {"F", "B", "I", "W"};
    record(e, cats[r->a.kind], name, r->a.chunk, r->a.mb, r->t0, r->t0 + r->busy_ms);
}

/* One action, not paired: its three parts in a row. */
static void run_action(ts_engine *e, int step, ts_action a)
{
    action_run r = {.e = e, .step = step, .a = a};
    action_pre(e, &r);
    r.t0 = ts_now_ms();
    action_body(&r);
    r.busy_ms = ts_now_ms() - r.t0;
    action_post(e, &r);
}

/* One op of the exchange program (exchange.h): a receive into the slot of the consuming
 * chunk; a send of the producing chunk's output (or its copy) or its input gradient.
 * Receives are waited for by the action that needs them; sends before their buffer is
 * reused (release_acts) and at the end of the step. */
static void issue_op(ts_engine *e, const ts_xchg_op *op)
{
    const size_t NC = (size_t)e->rows * e->C;
    if (op->kind == TS_XCHG_RECV) {
        ts_mb_slot *s = slot(e, op->chunk, op->mb);
        if (op->dir == TS_XCHG_ACT)
            ts_irecv_act(e->pp, s->in, NC, e->act, op->peer, PP_TAG, &s->recv_in);
        else
            ts_irecv_act(e->pp, s->dx, NC, e->act, op->peer, PP_TAG, &s->recv_dy);
    } else if (op->dir == TS_XCHG_ACT) { /* F(chunk - 1)'s output */
        const int c = op->chunk - 1;
        ts_mb_slot *s = slot(e, c, op->mb);
        const void *y = s->out ? s->out : ts_acts_output(e->model, s->acts, chunk_end(e, c) - 1);
        ts_isend_act(e->pp, y, NC, e->act, op->peer, PP_TAG, &s->send_out);
    } else { /* B/I(chunk + 1)'s input gradient */
        ts_mb_slot *s = slot(e, op->chunk + 1, op->mb);
        ts_isend_act(e->pp, s->dx, NC, e->act, op->peer, PP_TAG, &s->send_dx);
    }
}

/* Has this rank produced what send `op` carries (F(chunk - 1) ran, or B/I(chunk + 1))? */
static bool send_ready(const ts_engine *e, const ts_xchg_op *op)
{
    const int c = op->dir == TS_XCHG_ACT ? op->chunk - 1 : op->chunk + 1;
    return e->produced[(size_t)(e->local_of_chunk[c] * e->m + op->mb) * 2 + op->dir];
}

/* Eager mode: issue each peer's sends in program order as far as their data exists.
 * Each pair's messages keep the program's order (exchange.h), so they still match with
 * no tags; they just leave as early as a non-blocking send allows. */
static void issue_ready_sends(ts_engine *e)
{
    for (int p = 0; p < e->pp->size; p++)
        while (e->send_next[p] < e->send_first[p + 1] && send_ready(e, e->sends[e->send_next[p]]))
            issue_op(e, e->sends[e->send_next[p]++]);
}

static void mark_produced(ts_engine *e, int c, int mb, ts_xchg_dir dir)
{
    e->produced[(size_t)(e->local_of_chunk[c] * e->m + mb) * 2 + dir] = true;
}

/* Grouped mode: the program's group before an action, issued as one group. */
static void issue_group(ts_engine *e, const ts_xchg_step *g)
{
    if (g->n_ops == 0) return;
    ts_comm_group_begin(e->pp);
    for (int k = 0; k < g->n_ops; k++) issue_op(e, &g->ops[k]);
    ts_comm_group_end(e->pp);
}

/* Eager mode, after action a: what it produced, and every send now ready. */
static void send_produced(ts_engine *e, const ts_action *a)
{
    if (a->kind == TS_ACT_F && a->chunk < e->n_chunks - 1)
        mark_produced(e, a->chunk, a->mb, TS_XCHG_ACT);
    if ((a->kind == TS_ACT_B || a->kind == TS_ACT_I) && a->chunk > 0)
        mark_produced(e, a->chunk, a->mb, TS_XCHG_GRAD);
    issue_ready_sends(e);
}

/* ---- overlapped pairs (pair.h) ------------------------------------------------- */

/* The pair runner's report of a segment one body computed between yields: the body's
 * compute time and first start (its F/B span), and the segment as a "pair" span named
 * after its action, so the trace shows the interleaving. Runs on the baton's holder. */
static void pair_segment(void *ctx, int side, double t0, double t1)
{
    ts_engine *e = ctx;
    action_run *r = &((action_run *)e->pair_runs)[side];
    if (r->n_segments++ == 0) r->t0 = t0;
    r->busy_ms += t1 - t0;
    char name[16];
    snprintf(name, sizeof name, "%c%d", "FBIW"[r->a.kind], r->a.mb);
    record(e, "pair", name, r->a.chunk, r->a.mb, t0, t1);
}

/* Actions i and i + 1 as an overlapped pair: both pre-works in the schedule's order
 * (ZeRO's hooks, waiting for the inputs, taking activation sets), the two bodies on the
 * pair's two threads, then both post-works in order, each followed by what the plain
 * loop does after an action (the grouped program's group between the two is issued
 * after the first's post-work: it may carry the first's output). */
static void run_pair(ts_engine *e, int step, int i, const ts_xchg_step *prog)
{
    const ts_action *acts = e->sched->actions[e->pp_rank];
    action_run *r = e->pair_runs;
    for (int k = 0; k < 2; k++) {
        r[k] = (action_run){.e = e, .step = step, .a = acts[i + k]};
        if (e->before_action) e->before_action(e->action_ctx, i + k);
        action_pre(e, &r[k]);
    }
    if (ts_pair_run(e->pair, action_body, &r[0], action_body, &r[1]) != TS_OK) {
        /* The bodies return TS_OK (a broken invariant aborts the process from either
         * thread, and mpirun ends the job): a failure here is a programming error. */
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        TS_ASSERT(!"an overlapped pair's body failed");
    }
    for (int k = 0; k < 2; k++) {
        if (k == 1 && prog && e->grouped) issue_group(e, &prog[i + 1]);
        action_post(e, &r[k]);
        if (e->after_action) e->after_action(e->action_ctx, i + k);
        if (prog && !e->grouped) send_produced(e, &acts[i + k]);
    }
}

/* ---- which overlapped pairs run as two threads (pair.h) ---------------------------- */

/* The program's step (gap) whose group posts the receive that feeds action j of this
 * rank, or -1 when its input is on this rank (or it has none). */
static int input_recv_gap(const ts_engine *e, int j)
{
    const ts_action *a = &e->sched->actions[e->pp_rank][j];
    const bool fwd = a->kind == TS_ACT_F;
    if (a->kind == TS_ACT_W) return -1;
    if (fwd ? a->chunk == 0 || is_local(e, a->chunk - 1)
            : a->chunk == e->n_chunks - 1 || is_local(e, a->chunk + 1))
        return -1;
    const ts_xchg_dir dir = fwd ? TS_XCHG_ACT : TS_XCHG_GRAD;
    const ts_xchg_step *prog = e->xchg.steps[e->pp_rank];
    for (int k = 0; k < e->xchg.n_steps[e->pp_rank]; k++)
        for (int o = 0; o < prog[k].n_ops; o++) {
            const ts_xchg_op *op = &prog[k].ops[o];
            if (op->kind == TS_XCHG_RECV && op->dir == dir && op->chunk == a->chunk &&
                op->mb == a->mb)
                return k;
        }
    TS_ASSERT(!"an action's remote input has no receive in the exchange program");
    return -1;
}

/* Whether overlapped pair (i, i + 1) can run its bodies at once: the second body's input
 * must be there before the first body starts. Its receive is then posted before action
 * i (exchange.c hoists it there when the rendezvous replay allows: a program that waits
 * for it before action i cannot deadlock) and it cannot depend on action i: two actions
 * of one micro-batch always depend on each other (a backward needs every forward of its
 * micro-batch), those of two never on this rank. */
static bool pair_runnable(const ts_engine *e, int i)
{
    const ts_action *a = e->sched->actions[e->pp_rank];
    if (a[i].mb == a[i + 1].mb) return false;
    return e->pp->size == 1 || input_recv_gap(e, i + 1) <= i;
}

/* The pair's worker thread as the engine's (pair.h thread_setup): OpenMP keeps its thread
 * count per thread and the CUDA runtime its device, so the worker takes the engine
 * thread's (captured at init), and the kernels run alike on both threads. */
static void pair_thread_setup(void *ctx)
{
    const ts_engine *e = ctx;
    ts_cpu_set_threads(e->pair_cpu_threads);
    if (e->model->k->select_device) e->model->k->select_device(e->pair_device);
}

/* Overlapped pairs (ts_action.overlap) run as two threads (pair.h) where there is an
 * all-to-all to hide: an MoE model whose rows travel over ep with parallel.ep_overlap
 * (the expert layers yield between starting an exchange and waiting for it). Everything else (dense models,
 * schedules without pairs, ep = 1) keeps e->paired NULL: the plain loop, unchanged. */
static ts_status pairs_init(ts_engine *e)
{
    const ts_action *a = e->sched->actions[e->pp_rank];
    const int n = e->sched->n_actions[e->pp_rank];
    bool any = false;
    for (int i = 0; i + 1 < n && !any; i++) any = a[i].overlap;
    /* parallel.ep_overlap = false: the exchanges block, nothing yields, nothing to pair. */
    if (!any || !e->model->moe_dispatch || !e->cfg->parallel.ep_overlap) return TS_OK;
    const char *mode = ts_env(TS_ENV_PP_PAIRS); /* a test switch: core/env.h */
    if (mode && !strcmp(mode, "sequential")) return TS_OK;
    if (!ts_comm_thread_multiple()) {
        ts_log_warn("overlapped pipeline pairs (schedule \"%s\") run one action after the other: "
                    "their two threads communicate, and this MPI library does not let several "
                    "threads communicate (thread level MULTIPLE)",
                    e->sched->name);
        return TS_OK;
    }
    e->paired = ts_calloc((size_t)n, sizeof(bool));
    int n_pairs = 0;
    for (int i = 0; i + 1 < n; i++)
        if (a[i].overlap && pair_runnable(e, i)) {
            e->paired[i] = true;
            n_pairs++;
            i++;
        }
    if (n_pairs == 0) {
        free(e->paired);
        e->paired = NULL;
        return TS_OK;
    }
    e->pair_cpu_threads = ts_cpu_get_threads();
    e->pair_device = e->model->k->current_device ? e->model->k->current_device() : 0;
    e->pair_runs = ts_calloc(2, sizeof(action_run));
    e->pair = ts_malloc(sizeof *e->pair);
    if (ts_pair_init(e->pair, pair_thread_setup, e) != TS_OK) {
        free(e->pair);
        e->pair = NULL;
        return ts_error_prefix("pipeline engine: ");
    }
    e->pair->segment = pair_segment;
    e->pair->segment_ctx = e;
    return TS_OK;
}

void ts_engine_run(ts_engine *e, int step, int64_t seq0, int batch)
{
    TS_ASSERT(batch == e->m * e->dp * e->B && seq0 >= 0); /* the schedule is the batch's */
    e->seq0 = seq0;
    e->batch = batch;
    double t0 = ts_now_ms();
    e->loss_sum = 0.0;
    e->doc_pairs = 0.0;
    e->model->k->memset_zero(e->loss_acc, sizeof(double));
    e->compute_ms = 0.0;
    for (int j = 0; j < e->n_local; j++) e->bwd_done[j] = 0;

    const ts_action *acts = e->sched->actions[e->pp_rank];
    const int n = e->sched->n_actions[e->pp_rank];
    const ts_xchg_step *prog = e->pp->size > 1 ? e->xchg.steps[e->pp_rank] : NULL;
    if (prog && !e->grouped) {
        /* Eager (MPI: non-blocking sends, posted receives): every receive of the step
         * posted now, in program order; sends as soon as their data exists. */
        for (int k = 0; k < e->xchg.n_ops[e->pp_rank]; k++)
            if (e->xchg.ops[e->pp_rank][k].kind == TS_XCHG_RECV) issue_op(e, &e->xchg.ops[e->pp_rank][k]);
        memset(e->produced, 0, (size_t)e->n_local * e->m * 2 * sizeof(bool));
        for (int p = 0; p < e->pp->size; p++) e->send_next[p] = e->send_first[p];
    }
    for (int i = 0; i <= n; i++) {
        /* Grouped (a backend that matches by order and completes a send only when the
         * peer receives: NCCL): the program's group before each action, as it is. */
        if (prog && e->grouped) issue_group(e, &prog[i]);
        if (i == n) break;
        if (e->paired && e->paired[i]) { /* actions i and i + 1 as a pair */
            run_pair(e, step, i, prog);
            i++;
            continue;
        }
        const ts_action *a = &acts[i];
        if (e->before_action) e->before_action(e->action_ctx, i);
        run_action(e, step, *a);
        if (e->after_action) e->after_action(e->action_ctx, i);
        if (prog && !e->grouped) send_produced(e, a);
    }
    for (int p = 0; prog && !e->grouped && p < e->pp->size; p++)
        TS_ASSERT(e->send_next[p] == e->send_first[p + 1]); /* every send issued */
    e->span_ms = ts_now_ms() - t0;
    e->model->k->memcpy_d2h(&e->loss_sum, e->loss_acc, sizeof(double)); /* once per step */
    /* Sends of gradients (and outputs of recomputed micro-batches) may still be in
     * flight: their buffers are reused next step. */
    ts_watchdog_context("pipeline: completing the step's sends", 0, 0, 0);
    for (size_t i = 0; i < (size_t)e->n_local * e->m; i++) {
        ts_request_wait(&e->slots[i].send_dx);
        ts_request_wait(&e->slots[i].send_out);
    }
}

/* A forward-only walk (validation, downstream evaluation): one micro-batch at a time
 * through the chunks in order (every rank walks the chunks in the same order, so each
 * send meets its receive; the ranks of one replica share its dp rank, so they walk the
 * same batches). This replica's batches start at lo, lo + B, ... below `end`; the rows
 * from `hi` on are padding (under expert parallelism an MoE block's forward is a
 * collective over an ep group that may span replicas, and under expert tensor
 * parallelism over etp, which may too: every replica then runs as many batches as the
 * largest share needs). `fill` writes the batch's B rows of tokens and targets into
 * tokens_host/targets_host (n real rows, then padding); `take` reads the last chunk's
 * losses of its n real rows. */
typedef struct {
    const char *const *where; /* the watchdog's four contexts (forward, receive, send) */
    void (*fill)(ts_engine *e, void *ctx, int first, int n);
    void (*take)(ts_engine *e, void *ctx, ts_acts *a, int first, int n);
    void *ctx;
} forward_walk;

static void walk_forward(ts_engine *e, const forward_walk *w, int lo, int hi, int end)
{
    const int T = e->seq_len, mbs = e->B;
    const size_t NC = (size_t)e->rows * e->C;
    const ts_kernels *kern = e->model->k;
    for (int r0 = lo; r0 < end; r0 += mbs) {
        const int n = hi - r0 < mbs ? (hi > r0 ? hi - r0 : 0) : mbs;
        const void *prev_out = NULL;
        for (int c = 0; c < e->n_chunks; c++) {
            if (!is_local(e, c)) continue;
            ts_mb_slot *s = slot(e, c, 0);
            ts_acts *a = acquire_acts(e, c);
            ts_watchdog_context(w->where[0], c, r0, 0);
            if (c > 0) {
                if (is_local(e, c - 1)) {
                    TS_ASSERT(prev_out == s->in); /* copied when chunk c-1 finished */
                } else {
                    ts_request r;
                    const int from = ts_chunk_rank(e->sched, c - 1);
                    /* One-call groups: NCCL point-to-point is posted inside a group
                     * (no-ops for MPI). */
                    ts_comm_group_begin(e->pp);
                    ts_irecv_act(e->pp, s->in, NC, e->act, from, PP_TAG, &r);
                    ts_comm_group_end(e->pp);
                    ts_watchdog_context(w->where[1], c, r0, e->pp_world[from]);
                    ts_request_wait(&r);
                    ts_watchdog_context(w->where[0], c, r0, 0);
                }
            }
            a->input = c > 0 ? s->in : NULL;
            w->fill(e, w->ctx, r0, n);
            ids_to_device(e, a->tokens, e->tokens_host, mbs);
            ids_to_device(e, a->targets, e->targets_host, mbs);
            ts_acts_set_mtp_ids(e->model, a, e->targets_host, T);
            /* Packed documents: each row's starts from its own tokens (else the attention
             * would read the last training micro-batch's). */
            ts_acts_set_documents(e->model, a, e->tokens_host, T);
            ts_model_forward(e->model, a, 0.0f, NULL);
            if (c == e->n_chunks - 1) {
                w->take(e, w->ctx, a, r0, n);
            } else {
                void *y = ts_acts_output(e->model, a, chunk_end(e, c) - 1);
                if (!is_local(e, c + 1)) {
                    ts_request r;
                    const int to = ts_chunk_rank(e->sched, c + 1);
                    ts_comm_group_begin(e->pp);
                    ts_isend_act(e->pp, y, NC, e->act, to, PP_TAG, &r);
                    ts_comm_group_end(e->pp);
                    ts_watchdog_context(w->where[2], c, r0, e->pp_world[to]);
                    ts_request_wait(&r);
                }
                prev_out = y; /* valid until released below: copied by the next local chunk */
            }
            ts_mb_slot tmp = {.acts = a};
            if (c < e->n_chunks - 1 && is_local(e, c + 1)) {
                /* The next chunk is ours: copy before releasing. */
                kern->memcpy_d2d(slot(e, c + 1, 0)->in, prev_out, e->nc_bytes);
                prev_out = slot(e, c + 1, 0)->in;
            }
            release_acts(e, c, &tmp);
        }
    }
}

/* Validation (ts_engine_eval): replica d takes windows [d*n/dp, (d+1)*n/dp) of the n
 * spread over the stream; padding rows repeat the batch's first window (or the share's
 * first, past its end) and count nothing. */
typedef struct {
    const ts_dataset *val;
    int n_windows, lo;
    uint64_t stream;
    double *acc;
} eval_walk;

static void eval_fill(ts_engine *e, void *ctx, int w0, int n)
{
    const eval_walk *v = ctx;
    const int T = e->seq_len;
    for (int r = 0; r < e->B; r++) {
        const int i = n > 0 ? w0 + (r < n ? r : 0) : v->lo; /* lo < n_windows */
        const uint64_t k = ts_data_val_window((uint64_t)i, (uint64_t)v->n_windows, v->stream);
        ts_data_window(v->val, k, T, e->tokens_host + (size_t)r * T,
                       e->targets_host + (size_t)r * T);
    }
}

static void eval_take(ts_engine *e, void *ctx, ts_acts *a, int w0, int n)
{
    (void)w0;
    const eval_walk *v = ctx;
    const ts_kernels *kern = e->model->k;
    if (n == 0) return;
    kern->sum_into(v->acc, ts_acts_losses(e->model, a), (size_t)n * e->T);
    for (int k = 1; k <= e->model->mtp_layers; k++)
        kern->sum_into(v->acc + k, ts_acts_mtp_losses(e->model, a, k), (size_t)n * e->T);
}

static const char *const k_eval_where[] = {
    "validation: forward of chunk %d, windows from %d",
    "validation: receiving the input of chunk %d, windows from %d, from world rank %d",
    "validation: sending the output of chunk %d, windows from %d, to world rank %d"};

double ts_engine_eval(ts_engine *e, const ts_dataset *val, int n_windows, double *mtp_sums)
{
    const int D = e->model->mtp_layers;
    const int lo = (int)((int64_t)e->dp_rank * n_windows / e->dp);
    const int hi = (int)(((int64_t)e->dp_rank + 1) * n_windows / e->dp);
    const bool collective = e->model->moe_dispatch || e->model->moe_expert_tp;
    const int end = collective ? lo + (n_windows + e->dp - 1) / e->dp : hi;
    const ts_kernels *kern = e->model->k;
    double *acc = e->loss_acc + 1; /* the evaluation's sum, then its depths', read at the end */
    kern->memset_zero(acc, (1 + (size_t)D) * sizeof(double));
    eval_walk v = {val, n_windows, lo, ts_data_num_windows(val, e->seq_len), acc};
    const forward_walk w = {k_eval_where, eval_fill, eval_take, &v};
    walk_forward(e, &w, lo, hi, end);
    double sums[1 + 64];
    TS_ASSERT(D <= 64);
    kern->memcpy_d2h(sums, acc, (1 + (size_t)D) * sizeof(double));
    for (int k = 0; mtp_sums && k < D; k++) mtp_sums[k] = sums[1 + k];
    return sums[0];
}

/* Scoring rows (ts_engine_score): replica d takes units [d*u/dp, (d+1)*u/dp) of the
 * u = n_rows / unit units (an item's completions stay on one replica, in one
 * micro-batch when micro_batch is a multiple of unit); padding rows repeat a real row
 * (a replica past the last item, under expert parallelism, repeats row 0) and count
 * nothing. */
typedef struct {
    const ts_engine_rows *rows;
    double *row_loss;
    int *lpos;       /* each of this rank's positions' global position (cp holds T / cp) */
    int *from, *to;  /* each batch row's scored range */
    float *loss;
} score_walk;

static void score_fill(ts_engine *e, void *ctx, int r0, int n)
{
    score_walk *v = ctx;
    const int T = e->seq_len;
    for (int r = 0; r < e->B; r++)
        v->rows->fill(v->rows->ctx, n > 0 ? r0 + (r < n ? r : 0) : 0,
                      e->tokens_host + (size_t)r * T, e->targets_host + (size_t)r * T,
                      &v->from[r], &v->to[r]);
}

static void score_take(ts_engine *e, void *ctx, ts_acts *a, int r0, int n)
{
    score_walk *v = ctx;
    const int Tl = e->T;
    if (n > 0)
        e->model->k->memcpy_d2h(v->loss, ts_acts_losses(e->model, a),
                                (size_t)n * Tl * sizeof *v->loss);
    /* Each row's scored positions, in this rank's position order. */
    for (int r = 0; r < n; r++) {
        double sum = 0.0;
        for (int t = 0; t < Tl; t++) {
            const int p = v->lpos[(size_t)r * Tl + t];
            if (p >= v->from[r] && p < v->to[r]) sum += v->loss[(size_t)r * Tl + t];
        }
        v->row_loss[r0 + r] += sum;
    }
}

static const char *const k_score_where[] = {
    "evaluation: forward of chunk %d, rows from %d",
    "evaluation: receiving the input of chunk %d, rows from %d, from world rank %d",
    "evaluation: sending the output of chunk %d, rows from %d, to world rank %d"};

void ts_engine_score(ts_engine *e, const ts_engine_rows *rows, double *row_loss)
{
    const int T = e->seq_len, mbs = e->B;
    const int units = rows->n_rows / rows->unit;
    const int lo = (int)((int64_t)e->dp_rank * units / e->dp) * rows->unit;
    const int hi = (int)(((int64_t)e->dp_rank + 1) * units / e->dp) * rows->unit;
    const bool collective = e->model->moe_dispatch || e->model->moe_expert_tp;
    const int end = collective ? lo + ((units + e->dp - 1) / e->dp) * rows->unit : hi;
    int *pos = ts_malloc((size_t)mbs * T * sizeof *pos);
    score_walk v = {rows, row_loss, ts_malloc((size_t)mbs * T * sizeof(int)),
                    ts_malloc((size_t)mbs * sizeof(int)), ts_malloc((size_t)mbs * sizeof(int)),
                    ts_malloc((size_t)mbs * e->T * sizeof(float))};
    for (int r = 0; r < mbs; r++)
        for (int t = 0; t < T; t++) pos[(size_t)r * T + t] = t;
    if (e->model->cp.size > 1)
        ts_cp_select(&e->model->cp, v.lpos, pos, mbs);
    else
        memcpy(v.lpos, pos, (size_t)mbs * T * sizeof *pos);
    free(pos);
    const forward_walk w = {k_score_where, score_fill, score_take, &v};
    walk_forward(e, &w, lo, hi, end);
    free(v.loss);
    free(v.lpos);
    free(v.from);
    free(v.to);
}
