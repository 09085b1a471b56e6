#include "data/grad_sync.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/timer.h"
#include "core/watchdog.h"
#include "data/grad_sync_internal.h"

/* ZeRO-1: cut bucket b into dp pieces on TS_ZERO_ALIGN boundaries, as evenly as they
 * allow (the last piece takes any ragged end). */
static void split_bucket(ts_bucket *b, int dp)
{
    const size_t len = b->end - b->begin, units = len / TS_ZERO_ALIGN;
    TS_ASSERT(len <= INT_MAX);
    b->counts = ts_calloc((size_t)dp, sizeof(int));
    b->displs = ts_calloc((size_t)dp, sizeof(int));
    for (int r = 0; r < dp; r++) {
        size_t lo = units * (size_t)r / (size_t)dp * TS_ZERO_ALIGN;
        size_t hi = r == dp - 1 ? len : units * (size_t)(r + 1) / (size_t)dp * TS_ZERO_ALIGN;
        b->displs[r] = (int)lo;
        b->counts[r] = (int)(hi - lo);
    }
}

static void add_bucket(ts_grad_sync *g, size_t begin, size_t end, int min_layer, int max_layer,
                       bool tied, int zchunk)
{
    ts_bucket *b = &g->buckets[g->n_buckets++];
    b->zchunk = zchunk;
    b->begin = begin;
    b->end = end;
    b->min_layer = min_layer;
    b->max_layer = max_layer;
    b->tied = tied;
    if (g->sharded) split_bucket(b, g->replica->size);
}

static bool is_group_summed(const ts_grad_sync *g, int p)
{
    for (int i = 0; i < g->n_sums; i++)
        if (g->sums[i].param == p) return true;
    return false;
}

/* Walk the parameters from the last (final first) to the first, closing a bucket once
 * it holds `target` floats. Boundaries fall between parameters, so a bucket's
 * readiness is a range of layers. With ZeRO-1 the tied embedding is a bucket alone. */
/* ZeRO-2/3: the rank's chunk holding layer l (0 below level 2: one "chunk"). */
static int zchunk_of_layer(const ts_grad_sync *g, int l)
{
    for (int z = 0; z < g->n_zchunks; z++)
        if (l >= g->zchunks[z].l0 && l < g->zchunks[z].l1) return z;
    return 0;
}

/* Walk the parameters from the last (final first) to the first, closing a bucket once
 * it holds `target` floats. Boundaries fall between parameters, so a bucket's
 * readiness is a range of layers. With ZeRO-1..3 the tied embedding is a bucket alone;
 * with ZeRO-2/3 no bucket crosses a chunk boundary (each lives in its chunk's buffer). */
static void build_buckets(ts_grad_sync *g, const ts_model *m, size_t target)
{
    g->buckets = ts_calloc((size_t)m->n_params, sizeof *g->buckets); /* >= 1 param each */
    size_t end = m->num_floats;
    int min_layer = INT_MAX, max_layer = -1; /* the open bucket's layers; empty: max < 0 */
    int open_z = g->n_zchunks > 0 ? g->n_zchunks - 1 : 0;
    for (int p = m->n_params - 1; p >= 0; p--) {
        const ts_param *P = &m->params[p];
        const size_t begin = p == 0 ? 0 : P->offset;
        const int z = zchunk_of_layer(g, P->layer);
        if (z != open_z) { /* into the chunk below: close the open bucket at its start */
            const size_t start = g->zchunks[open_z].begin;
            if (max_layer >= 0) add_bucket(g, start, end, min_layer, max_layer, false, open_z);
            end = start;
            min_layer = INT_MAX;
            max_layer = -1;
            open_z = z;
        }
        if (g->sharded && is_group_summed(g, p)) {
            if (max_layer >= 0) { /* close the open bucket above the tied tensor */
                const size_t next = m->params[p + 1].offset;
                add_bucket(g, next, end, min_layer, max_layer, false, z);
                end = next;
            }
            add_bucket(g, begin, end, P->layer, P->layer, true, z);
            end = begin;
            min_layer = INT_MAX;
            max_layer = -1;
            continue;
        }
        if (P->layer < min_layer) min_layer = P->layer;
        if (P->layer > max_layer) max_layer = P->layer;
        if (end - P->offset >= target || p == 0) {
            add_bucket(g, begin, end, min_layer, max_layer, false, z);
            end = begin;
            min_layer = INT_MAX;
            max_layer = -1;
        }
    }
}

/* The ranges this rank's optimizer updates: its piece of every bucket (ascending: the
 * buckets run from the end of the buffer), or everything. */
static void build_shard(ts_grad_sync *g)
{
    g->shard = ts_calloc((size_t)g->n_buckets + 1, sizeof *g->shard);
    if (!g->sharded) {
        g->shard[g->n_shard++] = (ts_flat_range){0, g->n_floats};
        return;
    }
    const int r = g->replica->rank;
    size_t base = 0;
    for (int i = g->n_buckets - 1; i >= 0; i--) {
        ts_bucket *b = &g->buckets[i];
        b->shard_off = base;
        if (b->counts[r] == 0) continue;
        size_t lo = b->begin + (size_t)b->displs[r];
        g->shard[g->n_shard++] = (ts_flat_range){lo, lo + (size_t)b->counts[r]};
        base += (size_t)b->counts[r];
    }
    g->n_shard_floats = base;
}

static void add_group_sum(ts_grad_sync *g, const ts_model *m, int p, const ts_comm *group)
{
    g->sums[g->n_sums++] = (struct ts_group_sum){p, m->params[p].offset, m->params[p].numel, group};
}

void ts_grad_sync_init(ts_grad_sync *g, ts_model *m, const ts_comm *replica, const ts_comm *embed,
                       const ts_comm *kv, size_t bucket_bytes, bool overlap, int zero,
                       const ts_zero_layout *zl)
{
    memset(g, 0, sizeof *g);
    g->model = m;
    g->replica = replica;
    g->embed = embed;
    g->kv = kv;
    g->grads = m->grad_mem;
    g->params = m->param_mem;
    g->k = m->k;
    g->overlap = overlap;
    g->n_layers = m->n_layers;
    g->n_floats = m->num_floats;
    g->layer_final = ts_calloc((size_t)m->n_layers, sizeof(bool));
    /* pp > 1: this stage holds wte without the head, or the head's copy of wte; the
     * two are summed over the embedding group. */
    g->sums = ts_calloc((size_t)m->n_params + 1, sizeof *g->sums);
    const int tied = m->wte_param >= 0 ? m->wte_param : m->head_wte_param;
    const bool split_tie = m->tied && tied >= 0 &&
                           (m->head_wte_param < 0 || m->params[tied].tied_copy);
    if (split_tie && ts_comm_member(embed) && embed->size >= 2) add_group_sum(g, m, tied, g->embed);
    /* Replicated key/value heads: k_proj and v_proj of every block this rank holds. */
    if (m->kv_replicas > 1 && kv->size > 1)
        for (int l = 0; l < m->n_layers; l++) {
            const ts_layer *L = &m->layers[l];
            if (!L->owned || L->kind != TS_LAYER_BLOCK) continue;
            add_group_sum(g, m, L->first_param + TS_L_K_W, g->kv);
            add_group_sum(g, m, L->first_param + TS_L_V_W, g->kv);
        }
    const bool dp_sync = replica->size > 1 && m->n_params > 0;
    g->sharded = zero >= 1 && dp_sync;
    g->level = dp_sync ? zero : 0;
    if (g->level >= 2) {
        TS_ASSERT(zl);
        ts_zero_init_chunks(g, zl);
    }
    if (dp_sync) {
        size_t target = bucket_bytes / sizeof(float);
        build_buckets(g, m, target > 0 ? target : 1);
    }
    build_shard(g);
    if (g->level >= 2) ts_zero_init_buckets(g, zl);
}

/* ------------------------------------------------------ communication thread -- */

float *ts_bucket_grads(const ts_grad_sync *g, const ts_bucket *b)
{
    if (g->level < 2) return g->grads + b->begin;
    const ts_zero_chunk *z = &g->zchunks[b->zchunk];
    TS_ASSERT(z->grad);
    return z->grad + (b->begin - z->begin);
}

static void thread_start_op(ts_grad_sync *g, ts_bucket *b)
{
    float *buf = ts_bucket_grads(g, b);
    b->start_ms = ts_now_ms();
    if (g->sharded)
        ts_ireduce_scatter_sum_f32(&g->replica_thread, buf, b->counts, &b->req);
    else
        ts_iallreduce_sum_f32(&g->replica_thread, buf, b->end - b->begin, &b->req);
}

/* Start what is queued, in queue order (the same on every dp rank, so the collectives
 * match), and test what runs; sleep between rounds (20 us) rather than spin in
 * MPI_Wait, which would take a core from the compute threads. */
static void *thread_main(void *arg)
{
    ts_grad_sync *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->stop && g->n_started == g->n_queued && g->n_done == g->n_started)
            pthread_cond_wait(&g->cv, &g->mu);
        if (g->stop && g->n_done == g->n_started) break;
        /* Work on a snapshot; the main thread only appends to the queue meanwhile (and
         * resets it in ts_grad_sync_begin only once everything is done). */
        const int from = g->n_started, queued = g->n_queued;
        g->n_started = queued;
        pthread_mutex_unlock(&g->mu);
        for (int i = from; i < queued; i++) thread_start_op(g, &g->buckets[g->queue[i]]);
        int finished = 0;
        for (int i = 0; i < queued; i++) {
            ts_bucket *b = &g->buckets[g->queue[i]];
            if (!b->done && ts_request_test(&b->req)) {
                b->end_ms = ts_now_ms();
                b->done = true; /* published by the mutex below */
                finished++;
            }
        }
        pthread_mutex_lock(&g->mu);
        g->n_done += finished;
        if (finished) pthread_cond_broadcast(&g->cv);
        if (g->n_done < g->n_started) {
            pthread_mutex_unlock(&g->mu);
            nanosleep(&(struct timespec){0, 20000}, NULL);
            pthread_mutex_lock(&g->mu);
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

ts_status ts_grad_sync_use_thread(ts_grad_sync *g)
{
    if (g->n_buckets == 0 || !g->overlap) return TS_OK;
    if (!ts_comm_thread_multiple())
        return ts_fail("parallel.grad_sync_progress = \"thread\" needs an MPI library that "
                       "lets several threads communicate at once (thread level MULTIPLE), and "
                       "this one does not; use \"poll\"");
    ts_comm_dup(g->replica, "dp (communication thread)", &g->replica_thread);
    g->queue = ts_calloc((size_t)g->n_buckets, sizeof(int));
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, thread_main, g) != 0) {
        free(g->queue);
        g->queue = NULL;
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        ts_comm_free(&g->replica_thread);
        return ts_fail("cannot start the data-parallel communication thread");
    }
    g->threaded = true;
    return TS_OK;
}

static void stop_thread(ts_grad_sync *g)
{
    if (!g->threaded) return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    ts_comm_free(&g->replica_thread);
    free(g->queue);
    g->threaded = false;
}

/* Thread mode: wait until the thread completed every queued bucket, then report their
 * spans to the trace (the thread's group has no span hook: it must not touch the
 * trace). */
void ts_grad_sync_wait_thread(ts_grad_sync *g)
{
    pthread_mutex_lock(&g->mu);
    if (g->n_done < g->n_queued) {
        ts_watchdog_wait_begin("data-parallel reduction (communication thread)", g->replica->name,
                               -1);
        while (g->n_done < g->n_queued) pthread_cond_wait(&g->cv, &g->mu);
        ts_watchdog_wait_end();
    }
    pthread_mutex_unlock(&g->mu);
    if (!g->replica->on_span) return;
    for (int i = 0; i < g->n_queued; i++) {
        const ts_bucket *b = &g->buckets[g->queue[i]];
        g->replica->on_span(g->replica->on_span_ctx, g->sharded ? "reduce-scatter" : "all-reduce",
                      (b->end - b->begin) * sizeof(float), b->start_ms, b->end_ms);
    }
}

/* Thread mode: wait until the thread completed bucket b. */
void ts_grad_sync_wait_bucket(ts_grad_sync *g, ts_bucket *b)
{
    if (!g->threaded) {
        ts_request_wait(&b->req);
        return;
    }
    pthread_mutex_lock(&g->mu);
    if (!b->done) {
        ts_watchdog_wait_begin("data-parallel reduction (communication thread)", g->replica->name,
                               -1);
        while (!b->done) pthread_cond_wait(&g->cv, &g->mu);
        ts_watchdog_wait_end();
    }
    pthread_mutex_unlock(&g->mu);
}

void ts_grad_sync_free(ts_grad_sync *g)
{
    stop_thread(g);
    ts_zero_free(g);
    for (int i = 0; i < g->n_buckets; i++) {
        free(g->buckets[i].counts);
        free(g->buckets[i].displs);
    }
    free(g->buckets);
    free(g->layer_final);
    free(g->shard);
    free(g->sums);
    memset(g, 0, sizeof *g);
}

void ts_grad_sync_begin(ts_grad_sync *g)
{
    for (int i = 0; i < g->n_buckets; i++)
        g->buckets[i].launched = g->buckets[i].done = g->buckets[i].placed = false;
    if (g->threaded) { /* the thread is idle: the last step waited for all it started */
        pthread_mutex_lock(&g->mu);
        g->n_queued = g->n_started = g->n_done = 0;
        pthread_mutex_unlock(&g->mu);
    }
    for (int l = 0; l < g->n_layers; l++) g->layer_final[l] = false;
    g->wait_ms = 0.0;
    g->gather_ms = 0.0;
}

void ts_grad_sync_launch(ts_grad_sync *g, ts_bucket *b)
{
    if (g->threaded) {
        pthread_mutex_lock(&g->mu);
        g->queue[g->n_queued++] = (int)(b - g->buckets);
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        b->launched = true;
        return;
    }
    float *buf = ts_bucket_grads(g, b);
    if (g->sharded)
        ts_ireduce_scatter_sum_f32(g->replica, buf, b->counts, &b->req);
    else
        ts_iallreduce_sum_f32(g->replica, buf, b->end - b->begin, &b->req);
    b->launched = true;
}

static void progress(ts_grad_sync *g)
{
    ts_zero_progress(g); /* ZeRO-3's weight gathers, issued by this thread */
    if (g->threaded) return; /* the thread tests the reductions */
    for (int i = 0; i < g->n_buckets; i++)
        if (g->buckets[i].launched) ts_request_test(&g->buckets[i].req);
}

void ts_grad_sync_poll(void *ctx) { progress((ts_grad_sync *)ctx); }

static bool bucket_ready(const ts_grad_sync *g, const ts_bucket *b)
{
    if (b->tied) return false; /* launched by ts_grad_sync_finish, after the tied sum */
    for (int l = b->min_layer; l <= b->max_layer; l++)
        if (!g->layer_final[l]) return false;
    return true;
}

void ts_grad_sync_layers_done(ts_grad_sync *g, int first, int end)
{
    for (int l = first; l < end; l++) g->layer_final[l] = true;
    /* The first steps run without overlap: the wait of the second (the first pays for
     * page faults) is the reference reduction time the hidden fraction is measured
     * against. */
    if (!g->overlap || g->n_buckets == 0 || g->steps < TS_GRAD_SYNC_REFERENCE_STEPS) return;
    /* Every dp replica runs the same schedule, so buckets become ready, and their
     * non-blocking reductions start, in the same order on every rank. */
    for (int i = 0; i < g->n_buckets; i++) {
        ts_bucket *b = &g->buckets[i];
        if (!b->launched && bucket_ready(g, b)) ts_grad_sync_launch(g, b);
    }
    /* No test here: right after this the model's between-layers hook tests them (poll
     * mode), or the communication thread does. */
}

/* The group sums (the tied embedding over the embedding group, replicated key/value
 * weights over the kv group), blocking; running non-blocking reductions make progress
 * meanwhile. Returns the time they took. */
double ts_grad_sync_sum_groups(ts_grad_sync *g)
{
    if (g->n_sums == 0) return 0.0;
    double t0 = ts_now_ms();
    for (int i = 0; i < g->n_sums; i++) {
        const struct ts_group_sum *s = &g->sums[i];
        ts_allreduce_sum_f32(s->group, ts_param_grad(g->model, s->param), s->numel);
    }
    return ts_now_ms() - t0;
}

/* ZeRO-1: MPI_IN_PLACE leaves this rank's reduced piece at the bucket's start; move it
 * to its own place (what was there is other ranks' pieces, no longer needed). The
 * gradients are device memory: the backend's copy, not the host's memmove. The two
 * ranges overlap when the piece is longer than its offset; the CPU backends' copies
 * are memmove, a GPU's d2d copy must allow that too. */
static void place_piece(ts_grad_sync *g, const ts_bucket *b)
{
    const int r = g->replica->rank;
    TS_ASSERT(g->level < 2);
    if (b->displs[r] == 0 || b->counts[r] == 0) return;
    g->k->memcpy_d2d(g->grads + b->begin + b->displs[r], g->grads + b->begin,
                     (size_t)b->counts[r] * sizeof(float));
}

void ts_grad_sync_finish(ts_grad_sync *g)
{
    double t0 = ts_now_ms(), tied_ms = 0.0;
    if (g->level >= 2) {
        tied_ms = ts_zero_finish(g);
    } else if (!g->sharded) {
        if (g->n_buckets > 0 && !g->overlap) {
            /* Nothing to hide behind: one blocking all-reduce of the whole buffer, which
             * MPI runs about twice as fast as the same bytes in non-blocking buckets. */
            ts_allreduce_sum_f32(g->replica, g->grads, g->n_floats);
        } else {
            for (int i = 0; i < g->n_buckets; i++)
                if (!g->buckets[i].launched) ts_grad_sync_launch(g, &g->buckets[i]);
            if (g->threaded)
                ts_grad_sync_wait_thread(g);
            else
                for (int i = 0; i < g->n_buckets; i++) ts_request_wait(&g->buckets[i].req);
        }
        tied_ms = ts_grad_sync_sum_groups(g); /* after the dp sum: the two sums commute */
    } else {
        /* The same calls whether overlapping or not (so both give the same bits), issued
         * in bucket order on every dp rank; the tied embedding's bucket last, once its
         * gradient holds both stages' sum. */
        for (int i = 0; i < g->n_buckets; i++)
            if (!g->buckets[i].launched && !g->buckets[i].tied) ts_grad_sync_launch(g, &g->buckets[i]);
        tied_ms = ts_grad_sync_sum_groups(g);
        for (int i = 0; i < g->n_buckets; i++)
            if (!g->buckets[i].launched) ts_grad_sync_launch(g, &g->buckets[i]);
        if (g->threaded) ts_grad_sync_wait_thread(g);
        for (int i = 0; i < g->n_buckets; i++) {
            if (!g->threaded) ts_request_wait(&g->buckets[i].req);
            place_piece(g, &g->buckets[i]);
        }
    }
    if (g->n_buckets == 0) return;
    /* The tied sum waits for the other end of the pipeline, not for the dp reduction. */
    g->wait_ms += ts_now_ms() - t0 - tied_ms; /* ZeRO-2/3 waited during the step too */
    if (++g->steps == TS_GRAD_SYNC_REFERENCE_STEPS)
        g->reference_ms = g->wait_ms > 1e-6 ? g->wait_ms : 1e-6;
}

void ts_grad_sync_init_optimizer(const ts_grad_sync *g, const ts_model *m, ts_adamw *o)
{
    ts_adamw_init_ranges(o, m, g->shard, g->n_shard, g->sharded);
}

bool ts_grad_sync_counts_norm(const ts_grad_sync *g) { return g->sharded || g->replica->rank == 0; }

void ts_grad_sync_gather_params(ts_grad_sync *g)
{
    /* ZeRO-3 gathers each chunk when the next step needs it (before_action). */
    if (!g->sharded || g->level == 3) return;
    double t0 = ts_now_ms();
    for (int i = 0; i < g->n_buckets; i++) {
        ts_bucket *b = &g->buckets[i];
        ts_iallgather_f32(g->replica, g->params + b->begin, b->counts, b->displs, &b->req);
    }
    for (int i = 0; i < g->n_buckets; i++) ts_request_wait(&g->buckets[i].req);
    g->gather_ms += ts_now_ms() - t0;
}

double ts_grad_sync_overlap(const ts_grad_sync *g)
{
    if (g->n_buckets == 0 || !g->overlap || g->steps <= TS_GRAD_SYNC_REFERENCE_STEPS) return 0.0;
    double hidden = 1.0 - g->wait_ms / g->reference_ms;
    return hidden < 0.0 ? 0.0 : hidden > 1.0 ? 1.0 : hidden;
}
