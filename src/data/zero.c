/* The sharded optimizer state (data/zero.h): the ZeRO level, ZeRO-2/3's per-chunk
 * buffers that come and go as pipeline/residency.h says, the compact shard the reducer
 * places reduced pieces in, and with ZeRO-3 the compact master weights and the per-chunk
 * gathers of them. It builds on the reducer (data/reducer.h), never the reverse. */
#include "data/zero.h"

#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

/* ---------------------------------------------------------------- the layout -- */

/* The index into zchunks of the rank's chunk holding layer l. */
static int zchunk_of_layer(const ts_zero_state *s, int l)
{
    for (int z = 0; z < s->n_zchunks; z++)
        if (l >= s->zchunks[z].l0 && l < s->zchunks[z].l1) return z;
    TS_ASSERT(!"layer outside the rank's chunks");
    return -1;
}

static void init_chunks(ts_zero_state *s, const ts_zero_layout *zl)
{
    const ts_model *m = s->model;
    const ts_schedule *sc = zl->sched;
    s->sched = sc;
    s->pp_rank = zl->pp_rank;
    s->zchunks = ts_calloc((size_t)sc->n_chunks, sizeof *s->zchunks);
    s->zchunk_of = ts_malloc((size_t)sc->n_chunks * sizeof(int));
    for (int c = 0; c < sc->n_chunks; c++) {
        s->zchunk_of[c] = -1;
        if (ts_chunk_rank(sc, c) != zl->pp_rank) continue;
        ts_zero_chunk *z = &s->zchunks[s->n_zchunks];
        z->chunk = c;
        z->l0 = zl->first_layer[c];
        z->l1 = z->l0 + zl->n_chunk_layers[c];
        s->zchunk_of[c] = s->n_zchunks++;
    }
    /* The chunks tile the rank's layout in layer order: each from its first parameter
     * (the rank's first from 0) to the next one's start (the last to the end). */
    for (int i = 0; i < s->n_zchunks; i++) {
        ts_zero_chunk *z = &s->zchunks[i];
        TS_ASSERT(i == 0 || z->l0 >= s->zchunks[i - 1].l1);
        const ts_layer *L = &m->layers[z->l0];
        z->begin = i == 0 ? 0 : m->params[L->first_param].offset;
        if (i > 0) s->zchunks[i - 1].end = z->begin;
    }
    if (s->n_zchunks > 0) s->zchunks[s->n_zchunks - 1].end = m->num_floats;
    s->segments = ts_calloc((size_t)s->n_zchunks + 1, sizeof *s->segments);
    for (int i = 0; i < s->n_zchunks; i++) {
        const ts_zero_chunk *z = &s->zchunks[i];
        s->segments[i] = (ts_grad_segment){z->l0, z->l1, z->begin, z->end, NULL, 0, 0};
    }
}

void ts_zero_init(ts_zero_state *s, ts_model *m, const ts_comm *replica, int zero,
                   const ts_zero_layout *zl)
{
    memset(s, 0, sizeof *s);
    s->model = m;
    s->k = m->k;
    const bool replicas = replica->size > 1 && m->n_params > 0;
    s->level = replicas ? zero : 0;
    if (s->level >= 2) {
        TS_ASSERT(zl);
        init_chunks(s, zl);
    }
}

void ts_zero_reducer_args(const ts_zero_state *s, ts_reducer_args *a)
{
    a->sharded = s->level >= 1;
    a->n_segments = s->level >= 2 ? s->n_zchunks : 0;
    a->segments = s->level >= 2 ? s->segments : NULL;
}

void ts_zero_free(ts_zero_state *s)
{
    const ts_kernels *k = s->k;
    for (int i = 0; i < s->n_zchunks; i++) {
        ts_zero_chunk *z = &s->zchunks[i];
        if (z->compute != (void *)z->weights) k->dev_free(z->compute);
        k->dev_free(z->weights);
        if (s->reducer) k->dev_free(s->reducer->segments[i].grad);
    }
    if (k) {
        k->dev_free(s->shard_grads);
        k->dev_free(s->master);
    }
    free(s->zchunks);
    free(s->segments);
    free(s->zchunk_of);
    free(s->greq);
    ts_residency_free(&s->res);
    memset(s, 0, sizeof *s);
}

/* The chunk buffers' bytes now and at their peak (outside a step too). */
static void count(ts_zero_state *s, double bytes)
{
    s->zbuf_bytes += bytes;
    if (s->zbuf_bytes > s->zbuf_peak) s->zbuf_peak = s->zbuf_bytes;
}

static double weight_bytes(const ts_zero_state *s, const ts_zero_chunk *z)
{
    const size_t wb = s->k->act_dtype == TS_DTYPE_F32 ? 0 : ts_dtype_bytes(s->k->act_dtype);
    return (double)(z->end - z->begin) * (double)(sizeof(float) + wb);
}

static float *chunk_grads(const ts_zero_state *s, const ts_zero_chunk *z)
{
    return s->reducer->segments[z - s->zchunks].grad;
}

/* ------------------------------------------------------------ the model's views -- */

static void set_views(ts_zero_state *s, const ts_zero_chunk *z)
{
    ts_model *m = s->model;
    if (s->level == 3) {
        ts_model_set_layer_mem(m, z->l0, z->l1, z->weights, chunk_grads(s, z), z->compute,
                               z->begin);
    } else { /* ZeRO-2: the full weights, viewed from the chunk's first float */
        const size_t wb = ts_dtype_bytes(m->k->act_dtype);
        ts_model_set_layer_mem(m, z->l0, z->l1, m->param_mem + z->begin, chunk_grads(s, z),
                               (unsigned char *)m->compute_mem + z->begin * wb, z->begin);
    }
}

/* This rank's pieces of the weights, as the moments are laid out (ZeRO-3's masters). */
static void take_master_pieces(ts_zero_state *s, const ts_model *m)
{
    const ts_reducer *r = s->reducer;
    for (int i = 0; m->param_mem && i < r->n_buckets; i++) {
        const ts_bucket *b = &r->buckets[i];
        const int me = b->group->rank;
        if (b->counts[me] > 0)
            s->k->memcpy_d2d(s->master + b->piece_off, m->param_mem + b->begin + b->displs[me],
                             (size_t)b->counts[me] * sizeof(float));
    }
}

/* ZeRO-2/3, once the optimizer is made: the compact shard buffers, and the model's layer
 * views on its chunks; the model's full-size gradient buffer is freed, and with ZeRO-3
 * its full weights become this rank's pieces (then freed). */
static void shard_model(ts_zero_state *s, ts_adamw *o)
{
    ts_model *m = s->model;
    const ts_kernels *k = s->k;
    const size_t n = s->n_shard_floats ? s->n_shard_floats : 1;
    s->shard_grads = k->dev_alloc(n * sizeof(float));
    k->memset_zero(s->shard_grads, n * sizeof(float));
    if (s->level == 3) {
        s->master = k->dev_alloc(n * sizeof(float));
        take_master_pieces(s, m);
        if (m->compute_mem != (void *)m->param_mem) k->dev_free(m->compute_mem);
        k->dev_free(m->param_mem);
        m->param_mem = NULL;
        m->compute_mem = NULL;
    }
    k->dev_free(m->grad_mem);
    m->grad_mem = NULL;
    for (int i = 0; i < s->n_zchunks; i++) set_views(s, &s->zchunks[i]);
    ts_adamw_set_compact(o, m, s->shard_grads, s->master);
    ts_reducer_place_into(s->reducer, s->shard_grads);
}

/* ------------------------------------------------------------------- gradients -- */

static void alloc_grads(ts_zero_state *s, ts_zero_chunk *z)
{
    const size_t bytes = (z->end - z->begin) * sizeof(float);
    float *grad = s->k->dev_alloc(bytes ? bytes : sizeof(float));
    s->k->memset_zero(grad, bytes);
    ts_reducer_set_segment_grads(s->reducer, (int)(z - s->zchunks), grad);
    count(s, (double)bytes);
    ts_model_set_layer_grads(s->model, z->l0, z->l1, grad, z->begin);
}

/* Chunk z's reduced pieces are placed: its gradient buffer goes. */
static void free_grads(ts_zero_state *s, ts_zero_chunk *z)
{
    const int i = (int)(z - s->zchunks);
    s->k->dev_free(s->reducer->segments[i].grad);
    ts_reducer_set_segment_grads(s->reducer, i, NULL);
    count(s, -(double)(z->end - z->begin) * sizeof(float));
    ts_model_set_layer_grads(s->model, z->l0, z->l1, NULL, z->begin);
}

/* The reducer's on_drained at the end of the step. */
static void on_drained(void *ctx, int segment)
{
    ts_zero_state *s = ctx;
    free_grads(s, &s->zchunks[segment]);
}

/* --------------------------------------------------------------------- weights -- */

static void alloc_weights(ts_zero_state *s, ts_zero_chunk *z)
{
    const ts_kernels *k = s->k;
    const size_t n = z->end - z->begin ? z->end - z->begin : 1;
    z->weights = k->dev_alloc(n * sizeof(float));
    z->compute = k->act_dtype == TS_DTYPE_F32 ? (void *)z->weights
                                              : k->dev_alloc(n * ts_dtype_bytes(k->act_dtype));
    count(s, weight_bytes(s, z));
}

/* Issue chunk z's gathers in the compute dtype: this rank's master pieces into place
 * (rounded to bf16 in a bf16 run, as the compute copy always is), then every bucket's
 * in-place all-gather, in bucket order on every replica. A bf16 run moves half the
 * bytes of its fp32 masters. */
static void issue_gather(ts_zero_state *s, ts_zero_chunk *z, bool exact)
{
    if (z->weights) return; /* resident already (outside a step: materialized) */
    alloc_weights(s, z);
    const ts_kernels *k = s->k;
    const ts_dtype dt = exact ? TS_DTYPE_F32 : k->act_dtype;
    const size_t eb = ts_dtype_bytes(dt);
    const ts_grad_segment *g = &s->reducer->segments[z - s->zchunks];
    z->exact = exact;
    void *into = exact ? (void *)z->weights : z->compute;
    for (int i = g->b0; i < g->b1; i++) {
        const ts_bucket *b = &s->reducer->buckets[i];
        const int me = b->group->rank;
        unsigned char *w = (unsigned char *)into + (b->begin - z->begin) * eb;
        if (b->counts[me] > 0)
            k->convert(w + (size_t)b->displs[me] * eb, dt, s->master + b->piece_off,
                       TS_DTYPE_F32, (size_t)b->counts[me]);
        ts_iallgather_act(b->group, w, b->counts, b->displs, dt, &s->greq[i]);
    }
    z->gathering = true;
}

/* Wait for chunk z's gathers; in a bf16 run the fp32 views the norms, biases and the
 * embedding read are the gathered bf16 values widened (exactly): Megatron's bf16 model
 * holds those parameters in bf16 too. */
static void wait_gather(ts_zero_state *s, ts_zero_chunk *z)
{
    if (!z->gathering) return;
    double t0 = ts_now_ms();
    const ts_grad_segment *g = &s->reducer->segments[z - s->zchunks];
    for (int i = g->b0; i < g->b1; i++) ts_request_wait(&s->greq[i]);
    z->gathering = false;
    const size_t n = z->end - z->begin;
    if (z->compute != (void *)z->weights && z->exact) /* the fp32 masters: round the copy */
        s->k->convert(z->compute, s->k->act_dtype, z->weights, TS_DTYPE_F32, n);
    else if (z->compute != (void *)z->weights)
        s->k->convert(z->weights, TS_DTYPE_F32, z->compute, s->k->act_dtype, n);
    set_views(s, z);
    s->gather_ms += ts_now_ms() - t0;
}

static void release_weights(ts_zero_state *s, ts_zero_chunk *z)
{
    TS_ASSERT(!z->gathering);
    if (z->compute != (void *)z->weights) s->k->dev_free(z->compute);
    s->k->dev_free(z->weights);
    z->weights = NULL;
    z->compute = NULL;
    count(s, -weight_bytes(s, z));
    set_views(s, z);
}

/* ZeRO-3, between layers: test the gathers in flight (issued by this thread). */
static void poll_gathers(void *ctx)
{
    ts_zero_state *s = ctx;
    for (int j = 0; j < s->n_zchunks; j++) {
        const ts_zero_chunk *z = &s->zchunks[j];
        if (!z->gathering) continue;
        const ts_grad_segment *g = &s->reducer->segments[j];
        for (int i = g->b0; i < g->b1; i++) ts_request_test(&s->greq[i]);
    }
}

/* ------------------------------------------------------------- around actions -- */

/* The engine's hook before action a of the rank's list. */
static void before_action(void *ctx, int a)
{
    ts_zero_state *s = ctx;
    const ts_residency *res = &s->res;
    double t0 = ts_now_ms();
    /* Gradient buffers whose reduction had a chunk's backward to hide behind. */
    for (int i = 0; i < s->n_zchunks; i++) {
        ts_zero_chunk *z = &s->zchunks[i];
        if (chunk_grads(s, z) && res->grad_free[z->chunk] == a) {
            ts_reducer_drain(s->reducer, i);
            free_grads(s, z);
        }
    }
    s->reducer->wait_ms += ts_now_ms() - t0;
    for (int i = 0; i < s->n_zchunks; i++) {
        ts_zero_chunk *z = &s->zchunks[i];
        if (res->grad_alloc[z->chunk] == a) alloc_grads(s, z);
    }
    if (s->level < 3) return;
    for (int k = 0; k < res->n_spans; k++)
        if (res->spans[k].issue == a)
            issue_gather(s, &s->zchunks[s->zchunk_of[res->spans[k].chunk]], false);
    for (int k = 0; k < res->n_spans; k++)
        if (res->spans[k].first == a)
            wait_gather(s, &s->zchunks[s->zchunk_of[res->spans[k].chunk]]);
}

/* The engine's hook after action a. */
static void after_action(void *ctx, int a)
{
    ts_zero_state *s = ctx;
    if (s->level < 3) return;
    const ts_residency *res = &s->res;
    for (int k = 0; k < res->n_spans; k++)
        if (res->spans[k].last == a)
            release_weights(s, &s->zchunks[s->zchunk_of[res->spans[k].chunk]]);
}

/* ------------------------------------------------------------------ attaching -- */

/* ZeRO-2/3: which chunks hold a group-summed tensor (their gradients wait for the step's
 * end), then when each chunk's buffers come and go. */
static void build_residency(ts_zero_state *s)
{
    const ts_group_sums *sums = s->reducer->sums;
    bool *held = ts_calloc((size_t)s->sched->n_chunks, sizeof(bool));
    for (int i = 0; sums && i < sums->n; i++) {
        const int layer = s->model->params[sums->sums[i].param].layer;
        ts_zero_chunk *z = &s->zchunks[zchunk_of_layer(s, layer)];
        z->held = true;
        held[z->chunk] = true;
    }
    const int tied = ts_residency_tied_chunk(s->sched, s->model->tied || s->model->mtp_layers > 0);
    ts_residency_build(s->sched, s->pp_rank, tied, held, &s->res);
    free(held);
}

void ts_zero_attach(ts_zero_state *s, ts_reducer *r, ts_engine *e, ts_adamw *o)
{
    s->reducer = r;
    s->n_shard_floats = r->n_piece_floats;
    ts_adamw_init_ranges(o, s->model, r->pieces, r->n_pieces, r->sharded);
    /* Each bucket's weight gather: ZeRO-1/2's after the step, ZeRO-3's per chunk, ZeRO-0's
     * of the parameters kept whole (Muon's matrices) after the step. */
    s->greq = ts_calloc((size_t)r->n_buckets + 1, sizeof *s->greq);
    if (s->level < 2) return;
    TS_ASSERT(r->n_segments == s->n_zchunks);
    build_residency(s);
    shard_model(s, o);
    r->on_drained = on_drained;
    r->on_drained_ctx = s;
    e->before_action = before_action;
    e->after_action = after_action;
    e->action_ctx = s;
    if (s->level == 3) ts_model_add_between_layers(s->model, poll_gathers, s);
}

void ts_zero_reschedule(ts_zero_state *s)
{
    if (s->level < 2 || !s->reducer) return;
    ts_residency_free(&s->res);
    build_residency(s);
}

/* ------------------------------------------------------------ outside a step -- */

void ts_zero_materialize(ts_zero_state *s, ts_zero_gather how)
{
    if (s->level < 3) return;
    for (int i = 0; i < s->n_zchunks; i++) {
        ts_zero_chunk *z = &s->zchunks[i];
        if (how != TS_ZERO_ALLOCATE) {
            issue_gather(s, z, how == TS_ZERO_GATHER_EXACT);
        } else {
            alloc_weights(s, z);
            set_views(s, z);
        }
    }
    for (int i = 0; i < s->n_zchunks; i++) wait_gather(s, &s->zchunks[i]);
    s->materialized = true;
}

/* Copy this rank's pieces of chunk z's buffer into the master. */
static void keep_pieces(ts_zero_state *s, const ts_zero_chunk *z)
{
    const ts_reducer *r = s->reducer;
    const ts_grad_segment *g = &r->segments[z - s->zchunks];
    for (int j = g->b0; j < g->b1; j++) {
        const ts_bucket *b = &r->buckets[j];
        const int me = b->group->rank;
        if (b->counts[me] > 0)
            s->k->memcpy_d2d(s->master + b->piece_off,
                             z->weights + (b->begin - z->begin) + b->displs[me],
                             (size_t)b->counts[me] * sizeof(float));
    }
}

void ts_zero_dematerialize(ts_zero_state *s, bool keep)
{
    if (s->level < 3) return;
    for (int i = 0; i < s->n_zchunks; i++) {
        ts_zero_chunk *z = &s->zchunks[i];
        if (keep) keep_pieces(s, z);
        release_weights(s, z);
    }
    s->materialized = false;
}

void ts_zero_init_weights(ts_zero_state *s, uint64_t seed)
{
    if (s->level < 3) {
        ts_model_init_random(s->model, seed);
        return;
    }
    /* Each parameter's values depend on (seed, name, index) only: a chunk at a time
     * gives what the whole model at once would. */
    for (int i = 0; i < s->n_zchunks; i++) {
        ts_zero_chunk *z = &s->zchunks[i];
        alloc_weights(s, z);
        set_views(s, z);
        ts_model_init_random(s->model, seed);
        keep_pieces(s, z);
        release_weights(s, z);
    }
}

/* -------------------------------------------------------------------- the step -- */

void ts_zero_begin(ts_zero_state *s) { s->gather_ms = 0.0; }

/* ZeRO-0 with parameters kept whole (Muon's matrices): every replica updated the others
 * alike, each whole one only its owner: each member's extent of them (gcounts: from its
 * first to the end of its last, the floats between them its own alike) reaches every
 * replica; the floats between members' extents stay as each replica computed them. */
static void gather_whole(ts_zero_state *s)
{
    const ts_reducer *r = s->reducer;
    int n = 0;
    for (int i = 0; i < r->n_buckets; i++) {
        const ts_bucket *b = &r->buckets[i];
        if (!b->whole) continue;
        ts_iallgather_f32(b->group, s->model->param_mem + b->begin, b->gcounts, b->gdispls,
                          &s->greq[n++]);
    }
    for (int i = 0; i < n; i++) ts_request_wait(&s->greq[i]);
}

void ts_zero_gather_params(ts_zero_state *s)
{
    /* ZeRO-3 gathers each chunk when the next step needs it (before_action). */
    if (s->level == 3 || !s->reducer) return;
    const ts_reducer *r = s->reducer;
    double t0 = ts_now_ms();
    if (!r->sharded) {
        if (r->whole_owner) gather_whole(s);
        s->gather_ms += ts_now_ms() - t0;
        return;
    }
    for (int i = 0; i < r->n_buckets; i++) {
        const ts_bucket *b = &r->buckets[i];
        ts_iallgather_f32(b->group, s->model->param_mem + b->begin, b->counts, b->displs,
                          &s->greq[i]);
    }
    for (int i = 0; i < r->n_buckets; i++) ts_request_wait(&s->greq[i]);
    s->gather_ms += ts_now_ms() - t0;
}

double ts_zero_state_bytes(const ts_zero_state *s)
{
    const ts_model *m = s->model;
    const double n = (double)m->num_floats;
    double bytes = 0.0;
    if (m->param_mem) bytes += n * sizeof(float);
    if (m->compute_mem && m->compute_mem != (void *)m->param_mem)
        bytes += n * (double)ts_dtype_bytes(m->k->act_dtype);
    if (m->grad_mem) bytes += n * sizeof(float);
    if (s->shard_grads) bytes += (double)s->n_shard_floats * sizeof(float);
    if (s->master) bytes += (double)s->n_shard_floats * sizeof(float);
    return bytes;
}
