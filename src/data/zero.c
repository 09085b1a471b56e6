/* ZeRO-2/3's chunk buffers (data/grad_sync.h): per-chunk gradient buffers that come and go
 * as pipeline/residency.h says, the compact shard they are reduced into, and with ZeRO-3
 * the compact master weights and the per-chunk gathers of them. */
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "core/watchdog.h"
#include "data/grad_sync_internal.h"

/* The index into zchunks of the rank's chunk holding layer l. */
static int zchunk_of_layer(const ts_grad_sync *g, int l)
{
    for (int z = 0; z < g->n_zchunks; z++)
        if (l >= g->zchunks[z].l0 && l < g->zchunks[z].l1) return z;
    TS_ASSERT(!"layer outside the rank's chunks");
    return -1;
}

void ts_zero_init_chunks(ts_grad_sync *g, const ts_zero_layout *zl)
{
    const ts_model *m = g->model;
    const ts_schedule *s = zl->sched;
    g->zchunks = ts_calloc((size_t)s->n_chunks, sizeof *g->zchunks);
    g->zchunk_of = ts_malloc((size_t)s->n_chunks * sizeof(int));
    for (int c = 0; c < s->n_chunks; c++) {
        g->zchunk_of[c] = -1;
        if (ts_chunk_rank(s, c) != zl->pp_rank) continue;
        ts_zero_chunk *z = &g->zchunks[g->n_zchunks];
        z->chunk = c;
        z->l0 = zl->first_layer[c];
        z->l1 = z->l0 + zl->n_chunk_layers[c];
        g->zchunk_of[c] = g->n_zchunks++;
    }
    /* The chunks tile the rank's layout in layer order: each from its first parameter
     * (the rank's first from 0) to the next one's start (the last to the end). */
    for (int i = 0; i < g->n_zchunks; i++) {
        ts_zero_chunk *z = &g->zchunks[i];
        TS_ASSERT(i == 0 || z->l0 >= g->zchunks[i - 1].l1);
        const ts_layer *L = &m->layers[z->l0];
        z->begin = i == 0 ? 0 : m->params[L->first_param].offset;
        if (i > 0) g->zchunks[i - 1].end = z->begin;
    }
    if (g->n_zchunks > 0) g->zchunks[g->n_zchunks - 1].end = m->num_floats;
}

void ts_zero_init_buckets(ts_grad_sync *g, const ts_zero_layout *zl)
{
    const ts_schedule *s = zl->sched;
    for (int i = 0; i < g->n_zchunks; i++) {
        g->zchunks[i].b0 = g->n_buckets;
        g->zchunks[i].b1 = 0;
    }
    for (int i = 0; i < g->n_buckets; i++) {
        ts_zero_chunk *z = &g->zchunks[g->buckets[i].zchunk];
        if (i < z->b0) z->b0 = i;
        if (i + 1 > z->b1) z->b1 = i + 1;
    }
    /* Group-summed tensors are summed at the step's end: their chunks' gradients wait. */
    bool *held = ts_calloc((size_t)s->n_chunks, sizeof(bool));
    for (int i = 0; i < g->n_sums; i++) {
        ts_zero_chunk *z = &g->zchunks[zchunk_of_layer(g, g->model->params[g->sums[i].param].layer)];
        z->held = true;
        held[z->chunk] = true;
    }
    const int tied = ts_residency_tied_chunk(s, g->model->tied);
    ts_residency_build(s, zl->pp_rank, tied, held, &g->res);
    free(held);
}

void ts_zero_free(ts_grad_sync *g)
{
    const ts_kernels *k = g->k;
    for (int i = 0; i < g->n_zchunks; i++) {
        ts_zero_chunk *z = &g->zchunks[i];
        if (z->compute != (void *)z->weights) k->dev_free(z->compute);
        k->dev_free(z->weights);
        k->dev_free(z->grad);
    }
    if (k) {
        k->dev_free(g->shard_grads);
        k->dev_free(g->master);
    }
    free(g->zchunks);
    free(g->zchunk_of);
    ts_residency_free(&g->res);
}

/* The chunk buffers' bytes now and at their peak (outside a step too). */
static void count(ts_grad_sync *g, double bytes)
{
    g->zbuf_bytes += bytes;
    if (g->zbuf_bytes > g->zbuf_peak) g->zbuf_peak = g->zbuf_bytes;
}

static double weight_bytes(const ts_grad_sync *g, const ts_zero_chunk *z)
{
    const size_t wb = g->k->act_dtype == TS_DTYPE_F32 ? 0 : ts_dtype_bytes(g->k->act_dtype);
    return (double)(z->end - z->begin) * (double)(sizeof(float) + wb);
}

/* ------------------------------------------------------------ the model's views -- */

static void set_views(ts_grad_sync *g, const ts_zero_chunk *z)
{
    ts_model *m = g->model;
    if (g->level == 3) {
        ts_model_set_layer_mem(m, z->l0, z->l1, z->weights, z->grad, z->compute, z->begin);
    } else { /* ZeRO-2: the full weights, viewed from the chunk's first float */
        const size_t wb = ts_dtype_bytes(m->k->act_dtype);
        ts_model_set_layer_mem(m, z->l0, z->l1, m->param_mem + z->begin, z->grad,
                               (unsigned char *)m->compute_mem + z->begin * wb, z->begin);
    }
}

void ts_grad_sync_shard_model(ts_grad_sync *g, ts_adamw *o)
{
    if (g->level < 2) return;
    ts_model *m = g->model;
    const ts_kernels *k = g->k;
    const int r = g->replica->rank;
    const size_t n = g->n_shard_floats ? g->n_shard_floats : 1;
    g->shard_grads = k->dev_alloc(n * sizeof(float));
    k->memset_zero(g->shard_grads, n * sizeof(float));
    if (g->level == 3) {
        /* This rank's pieces of the weights, as the moments are laid out. */
        g->master = k->dev_alloc(n * sizeof(float));
        for (int i = 0; m->param_mem && i < g->n_buckets; i++) {
            const ts_bucket *b = &g->buckets[i];
            if (b->counts[r] > 0)
                k->memcpy_d2d(g->master + b->shard_off, m->param_mem + b->begin + b->displs[r],
                              (size_t)b->counts[r] * sizeof(float));
        }
        if (m->compute_mem != (void *)m->param_mem) k->dev_free(m->compute_mem);
        k->dev_free(m->param_mem);
        m->param_mem = NULL;
        m->compute_mem = NULL;
        g->params = NULL;
    }
    k->dev_free(m->grad_mem);
    m->grad_mem = NULL;
    g->grads = NULL;
    for (int i = 0; i < g->n_zchunks; i++) set_views(g, &g->zchunks[i]);
    ts_adamw_set_compact(o, m, g->shard_grads, g->master);
}

/* ------------------------------------------------------------------- gradients -- */

static void alloc_grads(ts_grad_sync *g, ts_zero_chunk *z)
{
    const size_t bytes = (z->end - z->begin) * sizeof(float);
    z->grad = g->k->dev_alloc(bytes ? bytes : sizeof(float));
    g->k->memset_zero(z->grad, bytes);
    count(g, (double)bytes);
    ts_model_set_layer_grads(g->model, z->l0, z->l1, z->grad, z->begin);
}

/* Wait for bucket b's reduction and copy this rank's reduced piece (left at the
 * bucket's start by the in-place reduce-scatter) into the shard. */
static void place(ts_grad_sync *g, ts_bucket *b)
{
    if (b->placed) return;
    ts_grad_sync_wait_bucket(g, b);
    const int r = g->replica->rank;
    if (b->counts[r] > 0)
        g->k->memcpy_d2d(g->shard_grads + b->shard_off, ts_bucket_grads(g, b),
                         (size_t)b->counts[r] * sizeof(float));
    b->placed = true;
}

/* Reduce what is left of chunk z (its buckets in order, as every dp rank does), place
 * the pieces and free the buffer. */
static void release_grads(ts_grad_sync *g, ts_zero_chunk *z)
{
    for (int i = z->b0; i < z->b1; i++)
        if (!g->buckets[i].launched) ts_grad_sync_launch(g, &g->buckets[i]);
    for (int i = z->b0; i < z->b1; i++) place(g, &g->buckets[i]);
    g->k->dev_free(z->grad);
    z->grad = NULL;
    count(g, -(double)(z->end - z->begin) * sizeof(float));
    ts_model_set_layer_grads(g->model, z->l0, z->l1, NULL, z->begin);
}

double ts_zero_finish(ts_grad_sync *g)
{
    /* As ZeRO-1: every bucket not yet reduced, in bucket order on every dp rank, the
     * group-summed ones last, after their group sums. */
    for (int i = 0; i < g->n_buckets; i++) {
        ts_bucket *b = &g->buckets[i];
        if (!b->launched && !b->tied && g->zchunks[b->zchunk].grad) ts_grad_sync_launch(g, b);
    }
    double tied_ms = ts_grad_sync_sum_groups(g);
    for (int i = 0; i < g->n_zchunks; i++)
        if (g->zchunks[i].grad) release_grads(g, &g->zchunks[i]);
    if (g->threaded) ts_grad_sync_wait_thread(g); /* all done: their spans to the trace */
    return tied_ms;
}

/* --------------------------------------------------------------------- weights -- */

static void alloc_weights(ts_grad_sync *g, ts_zero_chunk *z)
{
    const ts_kernels *k = g->k;
    const size_t n = z->end - z->begin ? z->end - z->begin : 1;
    z->weights = k->dev_alloc(n * sizeof(float));
    z->compute = k->act_dtype == TS_DTYPE_F32 ? (void *)z->weights
                                              : k->dev_alloc(n * ts_dtype_bytes(k->act_dtype));
    count(g, weight_bytes(g, z));
}

/* Issue chunk z's gathers in the compute dtype: this rank's master pieces into place
 * (rounded to bf16 in a bf16 run, as the compute copy always is), then every bucket's
 * in-place all-gather, in bucket order on every dp rank. A bf16 run moves half the
 * bytes of its fp32 masters. */
static void issue_gather(ts_grad_sync *g, ts_zero_chunk *z, bool exact)
{
    if (z->weights) return; /* resident already (outside a step: materialized) */
    alloc_weights(g, z);
    const ts_kernels *k = g->k;
    const ts_dtype dt = exact ? TS_DTYPE_F32 : k->act_dtype;
    const size_t eb = ts_dtype_bytes(dt);
    const int r = g->replica->rank;
    z->exact = exact;
    void *into = exact ? (void *)z->weights : z->compute;
    for (int i = z->b0; i < z->b1; i++) {
        ts_bucket *b = &g->buckets[i];
        unsigned char *w = (unsigned char *)into + (b->begin - z->begin) * eb;
        if (b->counts[r] > 0)
            k->convert(w + (size_t)b->displs[r] * eb, dt, g->master + b->shard_off, TS_DTYPE_F32,
                       (size_t)b->counts[r]);
        ts_iallgather_act(g->replica, w, b->counts, b->displs, dt, &b->greq);
    }
    z->gathering = true;
}

/* Wait for chunk z's gathers; in a bf16 run the fp32 views the norms, biases and the
 * embedding read are the gathered bf16 values widened (exactly): Megatron's bf16 model
 * holds those parameters in bf16 too. */
static void wait_gather(ts_grad_sync *g, ts_zero_chunk *z)
{
    if (!z->gathering) return;
    double t0 = ts_now_ms();
    for (int i = z->b0; i < z->b1; i++) ts_request_wait(&g->buckets[i].greq);
    z->gathering = false;
    const size_t n = z->end - z->begin;
    if (z->compute != (void *)z->weights && z->exact) /* the fp32 masters: round the copy */
        g->k->convert(z->compute, g->k->act_dtype, z->weights, TS_DTYPE_F32, n);
    else if (z->compute != (void *)z->weights)
        g->k->convert(z->weights, TS_DTYPE_F32, z->compute, g->k->act_dtype, n);
    set_views(g, z);
    g->gather_ms += ts_now_ms() - t0;
}

static void release_weights(ts_grad_sync *g, ts_zero_chunk *z)
{
    TS_ASSERT(!z->gathering);
    if (z->compute != (void *)z->weights) g->k->dev_free(z->compute);
    g->k->dev_free(z->weights);
    z->weights = NULL;
    z->compute = NULL;
    count(g, -weight_bytes(g, z));
    set_views(g, z);
}

void ts_zero_progress(ts_grad_sync *g)
{
    if (g->level != 3) return;
    for (int j = 0; j < g->n_zchunks; j++) {
        const ts_zero_chunk *z = &g->zchunks[j];
        if (!z->gathering) continue;
        for (int i = z->b0; i < z->b1; i++) ts_request_test(&g->buckets[i].greq);
    }
}

/* ------------------------------------------------------------- around actions -- */

void ts_grad_sync_before_action(void *ctx, int a)
{
    ts_grad_sync *g = ctx;
    if (g->level < 2) return;
    const ts_residency *res = &g->res;
    double t0 = ts_now_ms();
    /* Gradient buffers whose reduction had a chunk's backward to hide behind. */
    for (int i = 0; i < g->n_zchunks; i++) {
        ts_zero_chunk *z = &g->zchunks[i];
        if (z->grad && res->grad_free[z->chunk] == a) release_grads(g, z);
    }
    g->wait_ms += ts_now_ms() - t0;
    for (int i = 0; i < g->n_zchunks; i++) {
        ts_zero_chunk *z = &g->zchunks[i];
        if (res->grad_alloc[z->chunk] == a) alloc_grads(g, z);
    }
    if (g->level < 3) return;
    for (int k = 0; k < res->n_spans; k++)
        if (res->spans[k].issue == a)
            issue_gather(g, &g->zchunks[g->zchunk_of[res->spans[k].chunk]], false);
    for (int k = 0; k < res->n_spans; k++)
        if (res->spans[k].first == a) wait_gather(g, &g->zchunks[g->zchunk_of[res->spans[k].chunk]]);
}

void ts_grad_sync_after_action(void *ctx, int a)
{
    ts_grad_sync *g = ctx;
    if (g->level < 3) return;
    const ts_residency *res = &g->res;
    for (int k = 0; k < res->n_spans; k++)
        if (res->spans[k].last == a) release_weights(g, &g->zchunks[g->zchunk_of[res->spans[k].chunk]]);
}

/* ------------------------------------------------------------ outside a step -- */

void ts_grad_sync_materialize(ts_grad_sync *g, ts_zero_gather how)
{
    if (g->level < 3) return;
    for (int i = 0; i < g->n_zchunks; i++) {
        ts_zero_chunk *z = &g->zchunks[i];
        if (how != TS_ZERO_ALLOCATE) {
            issue_gather(g, z, how == TS_ZERO_GATHER_EXACT);
        } else {
            alloc_weights(g, z);
            set_views(g, z);
        }
    }
    for (int i = 0; i < g->n_zchunks; i++) wait_gather(g, &g->zchunks[i]);
    g->materialized = true;
}

static void keep_pieces(ts_grad_sync *g, const ts_zero_chunk *z);

void ts_grad_sync_dematerialize(ts_grad_sync *g, bool keep)
{
    if (g->level < 3) return;
    for (int i = 0; i < g->n_zchunks; i++) {
        ts_zero_chunk *z = &g->zchunks[i];
        if (keep) keep_pieces(g, z);
        release_weights(g, z);
    }
    g->materialized = false;
}

double ts_grad_sync_state_bytes(const ts_grad_sync *g)
{
    const ts_model *m = g->model;
    const double n = (double)m->num_floats;
    double bytes = 0.0;
    if (m->param_mem) bytes += n * sizeof(float);
    if (m->compute_mem && m->compute_mem != (void *)m->param_mem)
        bytes += n * (double)ts_dtype_bytes(m->k->act_dtype);
    if (m->grad_mem) bytes += n * sizeof(float);
    if (g->shard_grads) bytes += (double)g->n_shard_floats * sizeof(float);
    if (g->master) bytes += (double)g->n_shard_floats * sizeof(float);
    return bytes;
}

/* Copy this rank's pieces of chunk z's buffer into the master. */
static void keep_pieces(ts_grad_sync *g, const ts_zero_chunk *z)
{
    const int r = g->replica->rank;
    for (int j = z->b0; j < z->b1; j++) {
        const ts_bucket *b = &g->buckets[j];
        if (b->counts[r] > 0)
            g->k->memcpy_d2d(g->master + b->shard_off,
                             z->weights + (b->begin - z->begin) + b->displs[r],
                             (size_t)b->counts[r] * sizeof(float));
    }
}

void ts_grad_sync_init_weights(ts_grad_sync *g, uint64_t seed)
{
    if (g->level < 3) {
        ts_model_init_random(g->model, seed);
        return;
    }
    /* Each parameter's values depend on (seed, name, index) only: a chunk at a time
     * gives what the whole model at once would. */
    for (int i = 0; i < g->n_zchunks; i++) {
        ts_zero_chunk *z = &g->zchunks[i];
        alloc_weights(g, z);
        set_views(g, z);
        ts_model_init_random(g->model, seed);
        keep_pieces(g, z);
        release_weights(g, z);
    }
}
