/* The gradient reducer (data/reducer.h): buckets, their overlapped reduction, the
 * communication thread. It knows nothing of ZeRO-2/3's chunk buffers beyond the
 * segments it is given; the shard owner (data/zero.c) builds on it. */
#include "data/reducer.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/timer.h"
#include "core/watchdog.h"
#include "data/owner_cut.h"

/* ------------------------------------------------------------------ layout -- */

/* Cut bucket b into one piece per member of its group: sharded, or holding parameters
 * kept whole (whose owners the cut names, sharded or not). Without whole parameters the
 * even cut on TS_ZERO_ALIGN boundaries (the last piece takes any ragged end); with them
 * the owner-aligned one (data/owner_cut.h), balancing the group's cumulative costs. */
static void split_bucket(ts_reducer *r, const ts_model *m, const ts_reducer_args *a, ts_bucket *b)
{
    const int n = b->group->size;
    const size_t len = b->end - b->begin;
    TS_ASSERT(len <= INT_MAX);
    int k = 0, p0 = -1; /* the bucket's whole parameters: k of them from p0 on */
    for (int p = 0; a->whole_cost && p < m->n_params; p++) {
        const size_t at = p == 0 ? 0 : m->params[p].offset;
        if (at < b->begin || at >= b->end || a->whole_cost[p] <= 0.0) continue;
        if (p0 < 0) p0 = p;
        k++;
    }
    b->whole = k > 0;
    if (!r->sharded && !b->whole) return;
    b->counts = ts_calloc((size_t)n, sizeof(int));
    b->displs = ts_calloc((size_t)n, sizeof(int));
    if (!b->whole) {
        ts_even_cut(n, len, TS_ZERO_ALIGN, b->counts, b->displs);
        return;
    }
    ts_whole_item *items = ts_calloc((size_t)k, sizeof *items);
    int *owner = ts_calloc((size_t)k, sizeof(int)), *param = ts_calloc((size_t)k, sizeof(int));
    for (int p = p0, i = 0; i < k; p++) {
        if (m->params[p].offset >= b->end || a->whole_cost[p] <= 0.0) continue;
        items[i] = (ts_whole_item){m->params[p].offset - b->begin,
                                   m->params[p].offset - b->begin + m->params[p].numel,
                                   a->whole_cost[p]};
        param[i++] = p;
    }
    ts_owner_cut(n, len, TS_ZERO_ALIGN, items, k, r->whole_load[b->group_index], b->counts,
                 b->displs, owner);
    /* Each member's extent of whole parameters (ZeRO-0 gathers only these). */
    b->gcounts = ts_calloc((size_t)n, sizeof(int));
    b->gdispls = ts_calloc((size_t)n, sizeof(int));
    for (int i = 0; i < k; i++) {
        const int o = owner[i];
        if (b->gcounts[o] == 0) b->gdispls[o] = (int)items[i].begin;
        b->gcounts[o] = (int)items[i].end - b->gdispls[o];
        r->whole_owner[param[i]] = o;
        r->whole_mine[param[i]] = o == b->group->rank;
    }
    free(items);
    free(owner);
    free(param);
}

static int group_index(ts_reducer *r, const ts_comm *group)
{
    for (int i = 0; i < r->n_groups; i++)
        if (r->groups[i] == group) return i;
    r->groups[r->n_groups] = group;
    r->whole_load[r->n_groups] = ts_calloc((size_t)group->size, sizeof(double));
    return r->n_groups++;
}

static void add_bucket(ts_reducer *r, const ts_model *m, const ts_reducer_args *a, size_t begin,
                       size_t end, int min_layer, int max_layer, bool tied, int segment,
                       const ts_comm *group)
{
    ts_bucket *b = &r->buckets[r->n_buckets++];
    b->segment = segment;
    b->begin = begin;
    b->end = end;
    b->min_layer = min_layer;
    b->max_layer = max_layer;
    b->tied = tied;
    b->group = group;
    b->group_index = group_index(r, group);
    split_bucket(r, m, a, b);
}

/* The segment holding layer l. */
static int segment_of_layer(const ts_reducer *r, int l)
{
    for (int s = 0; s < r->n_segments; s++)
        if (l >= r->segments[s].l0 && l < r->segments[s].l1) return s;
    TS_ASSERT(!"layer outside the reducer's segments");
    return -1;
}

static const ts_comm *param_group(const ts_reducer_args *a, int p)
{
    return a->param_group && a->param_group[p] ? a->param_group[p] : a->group;
}

/* Parameter p's floats as tensor-parallel part 0 holds them (with the same alignment as
 * the layout's), which every tp rank counts alike; a split with uneven parts (the
 * vocabulary's) gives the ranks different local counts. */
static size_t part0_floats(const ts_param *P)
{
    const ts_shard_spec *s = &P->shard;
    if (s->split_axis < 0 || s->parts <= 1) return (P->numel + 15) / 16 * 16;
    ts_shard_spec z;
    ts_shard_init(&z, s->name, s->ndim, s->shape, s->split_axis, s->groups, s->parts, 0);
    return (ts_shard_numel(&z) + 15) / 16 * 16;
}

/* Walk the parameters from the last (final first) to the first, closing a bucket once
 * it holds `target` floats. Boundaries fall between parameters, so a bucket's readiness
 * is a range of layers. A bucket holds one group's parameters and lies in one segment;
 * sharded, a group-summed tensor is a bucket alone. `at[p]` is where parameter p starts
 * for the size rule: its offset, or (whole parameters: tp-invariant) the part 0 floats
 * of the parameters before it. */
static void build_buckets(ts_reducer *r, const ts_model *m, const ts_reducer_args *a,
                          size_t target)
{
    r->buckets = ts_calloc((size_t)m->n_params, sizeof *r->buckets); /* >= 1 param each */
    r->groups = ts_calloc((size_t)m->n_params, sizeof *r->groups);
    r->whole_load = ts_calloc((size_t)m->n_params, sizeof *r->whole_load);
    bool invariant = false;
    for (int p = 0; a->whole_cost && p < m->n_params; p++) invariant |= a->whole_cost[p] > 0.0;
    size_t *at = ts_malloc(((size_t)m->n_params + 1) * sizeof *at);
    for (int p = 0; p < m->n_params; p++)
        at[p] = !invariant ? m->params[p].offset : p == 0 ? 0 : at[p - 1] + part0_floats(&m->params[p - 1]);
    at[m->n_params] = invariant ? at[m->n_params - 1] + part0_floats(&m->params[m->n_params - 1])
                                : m->num_floats;
    size_t end = m->num_floats, size_end = at[m->n_params];
    int min_layer = INT_MAX, max_layer = -1; /* the open bucket's layers; empty: max < 0 */
    int open_s = r->n_segments - 1;
    const ts_comm *open_g = NULL; /* the open bucket's group */
#define CLOSE(from, size_from, seg)                                                       \
    do {                                                                                  \
        add_bucket(r, m, a, (from), end, min_layer, max_layer, false, (seg), open_g);     \
        end = (from);                                                                     \
        size_end = (size_from);                                                           \
        min_layer = INT_MAX;                                                              \
        max_layer = -1;                                                                   \
    } while (0)
    for (int p = m->n_params - 1; p >= 0; p--) {
        const ts_param *P = &m->params[p];
        const size_t begin = p == 0 ? 0 : P->offset;
        const int s = segment_of_layer(r, P->layer);
        const ts_comm *g = param_group(a, p);
        if (s != open_s) { /* into the segment below: close the open bucket at its start */
            const size_t start = r->segments[open_s].begin;
            if (max_layer >= 0) CLOSE(start, at[p + 1], open_s);
            end = start;
            size_end = at[p + 1];
            open_s = s;
        }
        if (max_layer >= 0 && g != open_g) CLOSE(m->params[p + 1].offset, at[p + 1], s);
        open_g = g;
        if (r->sharded && ts_group_sums_has(a->sums, p)) {
            if (max_layer >= 0) CLOSE(m->params[p + 1].offset, at[p + 1], s); /* the bucket above it */
            add_bucket(r, m, a, begin, end, P->layer, P->layer, true, s, g);
            end = begin;
            size_end = at[p];
            continue;
        }
        if (P->layer < min_layer) min_layer = P->layer;
        if (P->layer > max_layer) max_layer = P->layer;
        if (size_end - at[p] >= target || p == 0) CLOSE(begin, at[p], s);
    }
#undef CLOSE
    free(at);
}

/* The ranges this rank holds reduced: its piece of every bucket (ascending: the buckets
 * run from the end of the buffer), or everything. */
static void build_pieces(ts_reducer *r)
{
    r->pieces = ts_calloc((size_t)r->n_buckets + 1, sizeof *r->pieces);
    if (!r->sharded) {
        r->pieces[r->n_pieces++] = (ts_flat_range){0, r->n_floats};
        return;
    }
    size_t base = 0;
    for (int i = r->n_buckets - 1; i >= 0; i--) {
        ts_bucket *b = &r->buckets[i];
        const int me = b->group->rank;
        b->piece_off = base;
        if (b->counts[me] == 0) continue;
        size_t lo = b->begin + (size_t)b->displs[me];
        r->pieces[r->n_pieces++] = (ts_flat_range){lo, lo + (size_t)b->counts[me]};
        base += (size_t)b->counts[me];
    }
    r->n_piece_floats = base;
}

void ts_reducer_init(ts_reducer *r, ts_model *m, const ts_reducer_args *a)
{
    memset(r, 0, sizeof *r);
    r->model = m;
    r->k = m->k;
    r->sums = a->sums;
    r->group = a->group;
    r->overlap = a->overlap;
    r->n_layers = m->n_layers;
    r->n_floats = m->num_floats;
    r->layer_final = ts_calloc((size_t)m->n_layers, sizeof(bool));
    if (a->segments) {
        r->n_segments = a->n_segments;
        r->segments = ts_calloc((size_t)a->n_segments, sizeof *r->segments);
        for (int s = 0; s < a->n_segments; s++) {
            r->segments[s] = a->segments[s];
            r->segments[s].grad = NULL;
        }
    } else {
        r->n_segments = 1;
        r->segments = ts_calloc(1, sizeof *r->segments);
        r->segments[0] = (ts_grad_segment){0, m->n_layers, 0, m->num_floats, m->grad_mem, 0, 0};
    }
    bool reduce = false; /* some parameter's group has another member */
    for (int p = 0; p < m->n_params && !reduce; p++) reduce = param_group(a, p)->size > 1;
    r->sharded = a->sharded && reduce;
    if (a->whole_cost) {
        r->whole_owner = ts_malloc((size_t)m->n_params * sizeof(int) + 1);
        r->whole_mine = ts_calloc((size_t)m->n_params + 1, sizeof(bool));
        for (int p = 0; p < m->n_params; p++) {
            /* Without a reduction every whole parameter is this rank's (replaced below). */
            r->whole_owner[p] = a->whole_cost[p] > 0.0 ? 0 : -1;
            r->whole_mine[p] = a->whole_cost[p] > 0.0;
            if (reduce && a->whole_cost[p] > 0.0) r->whole_mine[p] = false;
        }
    }
    if (reduce) {
        size_t target = a->bucket_bytes / sizeof(float);
        build_buckets(r, m, a, target > 0 ? target : 1);
    }
    build_pieces(r);
    for (int s = 0; s < r->n_segments; s++) {
        r->segments[s].b0 = r->n_buckets;
        r->segments[s].b1 = 0;
    }
    for (int i = 0; i < r->n_buckets; i++) {
        ts_grad_segment *s = &r->segments[r->buckets[i].segment];
        if (i < s->b0) s->b0 = i;
        if (i + 1 > s->b1) s->b1 = i + 1;
    }
}

float *ts_reducer_bucket_grads(const ts_reducer *r, const ts_bucket *b)
{
    const ts_grad_segment *s = &r->segments[b->segment];
    TS_ASSERT(s->grad);
    return s->grad + (b->begin - s->begin);
}

void ts_reducer_set_segment_grads(ts_reducer *r, int s, float *grad) { r->segments[s].grad = grad; }

void ts_reducer_place_into(ts_reducer *r, float *compact) { r->compact = compact; }

/* ------------------------------------------------------ communication thread -- */

static void start_op(ts_reducer *r, ts_bucket *b, const ts_comm *c)
{
    float *buf = ts_reducer_bucket_grads(r, b);
    if (r->sharded)
        ts_ireduce_scatter_sum_f32(c, buf, b->counts, &b->req);
    else
        ts_iallreduce_sum_f32(c, buf, b->end - b->begin, &b->req);
}

/* Start what is queued, in queue order (the same on every member, so the collectives
 * match), and test what runs; sleep between rounds (20 us) rather than spin in
 * MPI_Wait, which would take a core from the compute threads. */
static void *thread_main(void *arg)
{
    ts_reducer *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->n_started == r->n_queued && r->n_done == r->n_started)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop && r->n_done == r->n_started) break;
        /* Work on a snapshot; the main thread only appends to the queue meanwhile (and
         * resets it in ts_reducer_begin only once everything is done). */
        const int from = r->n_started, queued = r->n_queued;
        r->n_started = queued;
        pthread_mutex_unlock(&r->mu);
        for (int i = from; i < queued; i++) {
            ts_bucket *b = &r->buckets[r->queue[i]];
            b->start_ms = ts_now_ms();
            start_op(r, b, &r->thread_groups[b->group_index]);
        }
        int finished = 0;
        for (int i = 0; i < queued; i++) {
            ts_bucket *b = &r->buckets[r->queue[i]];
            if (!b->done && ts_request_test(&b->req)) {
                b->end_ms = ts_now_ms();
                b->done = true; /* published by the mutex below */
                finished++;
            }
        }
        pthread_mutex_lock(&r->mu);
        r->n_done += finished;
        if (finished) pthread_cond_broadcast(&r->cv);
        if (r->n_done < r->n_started) {
            pthread_mutex_unlock(&r->mu);
            nanosleep(&(struct timespec){0, 20000}, NULL);
            pthread_mutex_lock(&r->mu);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void free_thread_groups(ts_reducer *r)
{
    for (int i = 0; r->thread_groups && i < r->n_groups; i++) ts_comm_free(&r->thread_groups[i]);
    free(r->thread_groups);
    r->thread_groups = NULL;
}

static ts_status use_thread(ts_reducer *r)
{
    if (r->n_buckets == 0 || !r->overlap) return TS_OK;
    if (!ts_comm_thread_multiple())
        return ts_fail("parallel.grad_sync_progress = \"thread\" needs an MPI library that "
                       "lets several threads communicate at once (thread level MULTIPLE), and "
                       "this one does not; use \"poll\"");
    r->thread_groups = ts_calloc((size_t)r->n_groups, sizeof *r->thread_groups);
    for (int i = 0; i < r->n_groups; i++)
        ts_comm_dup(r->groups[i], "dp (communication thread)", &r->thread_groups[i]);
    r->queue = ts_calloc((size_t)r->n_buckets, sizeof(int));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, thread_main, r) != 0) {
        free(r->queue);
        r->queue = NULL;
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        free_thread_groups(r);
        return ts_fail("cannot start the data-parallel communication thread");
    }
    r->threaded = true;
    return TS_OK;
}

static void stop_thread(ts_reducer *r)
{
    if (!r->threaded) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free_thread_groups(r);
    free(r->queue);
    r->threaded = false;
}

/* Thread mode: wait until the thread completed every queued bucket, then report their
 * spans to the groups' trace hooks (the thread's duplicates have none: the thread must
 * not touch the trace). */
static void wait_thread(ts_reducer *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->n_done < r->n_queued) {
        ts_watchdog_wait_begin("data-parallel reduction (communication thread)",
                               r->groups[0]->name, -1);
        while (r->n_done < r->n_queued) pthread_cond_wait(&r->cv, &r->mu);
        ts_watchdog_wait_end();
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n_queued; i++) {
        const ts_bucket *b = &r->buckets[r->queue[i]];
        if (!b->group->on_span) continue;
        b->group->on_span(b->group->on_span_ctx, r->sharded ? "reduce-scatter" : "all-reduce",
                          (b->end - b->begin) * sizeof(float), b->start_ms, b->end_ms);
    }
}

/* Wait until bucket b's reduction completed. */
static void wait_bucket(ts_reducer *r, ts_bucket *b)
{
    if (!r->threaded) {
        ts_request_wait(&b->req);
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (!b->done) {
        ts_watchdog_wait_begin("data-parallel reduction (communication thread)", b->group->name,
                               -1);
        while (!b->done) pthread_cond_wait(&r->cv, &r->mu);
        ts_watchdog_wait_end();
    }
    pthread_mutex_unlock(&r->mu);
}

void ts_reducer_free(ts_reducer *r)
{
    stop_thread(r);
    for (int i = 0; i < r->n_buckets; i++) {
        free(r->buckets[i].counts);
        free(r->buckets[i].displs);
        free(r->buckets[i].gcounts);
        free(r->buckets[i].gdispls);
    }
    for (int g = 0; r->whole_load && g < r->n_groups; g++) free(r->whole_load[g]);
    free(r->whole_load);
    free(r->whole_owner);
    free(r->whole_mine);
    free(r->buckets);
    free(r->groups);
    free(r->segments);
    free(r->layer_final);
    free(r->pieces);
    memset(r, 0, sizeof *r);
}

/* ----------------------------------------------------------------- the step -- */

void ts_reducer_begin(ts_reducer *r)
{
    for (int i = 0; i < r->n_buckets; i++)
        r->buckets[i].launched = r->buckets[i].done = r->buckets[i].placed = false;
    if (r->threaded) { /* the thread is idle: the last step waited for all it started */
        pthread_mutex_lock(&r->mu);
        r->n_queued = r->n_started = r->n_done = 0;
        pthread_mutex_unlock(&r->mu);
    }
    for (int l = 0; l < r->n_layers; l++) r->layer_final[l] = false;
    r->wait_ms = 0.0;
}

/* Start bucket b's reduction (directly, or queued for the communication thread). */
static void launch(ts_reducer *r, ts_bucket *b)
{
    if (r->threaded) {
        pthread_mutex_lock(&r->mu);
        r->queue[r->n_queued++] = (int)(b - r->buckets);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        b->launched = true;
        return;
    }
    start_op(r, b, b->group);
    b->launched = true;
}

/* Poll mode, between layers: test the running reductions. */
static void poll_reductions(void *ctx)
{
    ts_reducer *r = ctx;
    for (int i = 0; i < r->n_buckets; i++)
        if (r->buckets[i].launched) ts_request_test(&r->buckets[i].req);
}

static bool bucket_ready(const ts_reducer *r, const ts_bucket *b)
{
    if (b->tied) return false; /* launched by ts_reducer_finish, after its group sum */
    for (int l = b->min_layer; l <= b->max_layer; l++)
        if (!r->layer_final[l]) return false;
    return true;
}

/* The engine's chunk_done: the gradients of layers [first, end) are final for this
 * step; launch the buckets that are now complete (when overlapping). */
static void layers_done(void *ctx, int first, int end)
{
    ts_reducer *r = ctx;
    for (int l = first; l < end; l++) r->layer_final[l] = true;
    /* The first steps run without overlap: the wait of the second (the first pays for
     * page faults) is the reference reduction time the hidden fraction is measured
     * against. */
    if (!r->overlap || r->n_buckets == 0 || r->steps < TS_GRAD_SYNC_REFERENCE_STEPS) return;
    /* Every replica runs the same schedule, so buckets become ready, and their
     * non-blocking reductions start, in the same order on every rank. */
    for (int i = 0; i < r->n_buckets; i++) {
        ts_bucket *b = &r->buckets[i];
        if (!b->launched && bucket_ready(r, b)) launch(r, b);
    }
    /* No test here: right after this the model's between-layers hook tests them (poll
     * mode), or the communication thread does. */
}

ts_status ts_reducer_attach(ts_reducer *r, ts_engine *e, ts_model *m, bool thread)
{
    e->chunk_done = layers_done;
    e->chunk_done_ctx = r;
    if (thread && use_thread(r) != TS_OK) return TS_ERR;
    if (!r->threaded && r->n_buckets > 0 && r->overlap)
        ts_model_add_between_layers(m, poll_reductions, r);
    return TS_OK;
}

/* Sharded: wait for bucket b's reduction and move this rank's reduced piece from the
 * bucket's start (where the in-place reduce-scatter leaves it) to its place: the
 * compact buffer, or its own offset in the segment's buffer (what was there is other
 * members' pieces, no longer needed). Gradients are device memory: the backend's copy,
 * which allows the overlap of an in-place move (memmove on the CPU backends; a GPU's
 * d2d copy must allow it too). */
static void place(ts_reducer *r, ts_bucket *b)
{
    if (b->placed) return;
    wait_bucket(r, b);
    const int me = b->group->rank;
    float *src = ts_reducer_bucket_grads(r, b);
    float *dst = r->compact ? r->compact + b->piece_off : src + b->displs[me];
    if (b->counts[me] > 0 && dst != src)
        r->k->memcpy_d2d(dst, src, (size_t)b->counts[me] * sizeof(float));
    b->placed = true;
}

void ts_reducer_drain(ts_reducer *r, int s)
{
    const ts_grad_segment *g = &r->segments[s];
    for (int i = g->b0; i < g->b1; i++)
        if (!r->buckets[i].launched) launch(r, &r->buckets[i]);
    for (int i = g->b0; i < g->b1; i++) place(r, &r->buckets[i]);
}

/* Unsharded: every bucket all-reduced, then the group sums (the two sums commute). */
static double finish_unsharded(ts_reducer *r)
{
    if (r->n_buckets > 0 && !r->overlap && r->n_groups == 1) {
        /* Nothing to hide behind: one blocking all-reduce of the whole buffer, which MPI
         * runs about twice as fast as the same bytes in non-blocking buckets. */
        ts_allreduce_sum_f32(r->groups[0], r->segments[0].grad, r->n_floats);
    } else {
        for (int i = 0; i < r->n_buckets; i++)
            if (!r->buckets[i].launched) launch(r, &r->buckets[i]);
        if (r->threaded)
            wait_thread(r);
        else
            for (int i = 0; i < r->n_buckets; i++) ts_request_wait(&r->buckets[i].req);
    }
    return ts_group_sums_run(r->sums);
}

/* Sharded: the same calls whether overlapping or not (so both give the same bits),
 * issued in bucket order on every member; each group-summed tensor's bucket once its
 * gradient holds the group's sum. Segments without a buffer were drained during the
 * step. */
static double finish_sharded(ts_reducer *r)
{
    for (int i = 0; i < r->n_buckets; i++) {
        ts_bucket *b = &r->buckets[i];
        if (!b->launched && !b->tied && r->segments[b->segment].grad) launch(r, b);
    }
    const double sums_ms = ts_group_sums_run(r->sums);
    for (int s = 0; s < r->n_segments; s++) {
        if (!r->segments[s].grad) continue;
        ts_reducer_drain(r, s);
        if (r->on_drained) r->on_drained(r->on_drained_ctx, s);
    }
    if (r->threaded) wait_thread(r); /* all done: their spans to the trace */
    return sums_ms;
}

void ts_reducer_finish(ts_reducer *r)
{
    double t0 = ts_now_ms();
    const double sums_ms = r->sharded ? finish_sharded(r) : finish_unsharded(r);
    if (r->n_buckets == 0) return;
    /* The group sums wait for other ranks' compute, not for the reduction. */
    r->wait_ms += ts_now_ms() - t0 - sums_ms; /* ZeRO-2/3 drained during the step too */
    if (++r->steps == TS_GRAD_SYNC_REFERENCE_STEPS)
        r->reference_ms = r->wait_ms > 1e-6 ? r->wait_ms : 1e-6;
}

bool ts_reducer_owns_whole(const ts_reducer *r, int p) { return r->whole_mine && r->whole_mine[p]; }

bool ts_reducer_counts_norm(const ts_reducer *r) { return r->sharded || r->group->rank == 0; }

double ts_reducer_overlap(const ts_reducer *r)
{
    if (r->n_buckets == 0 || !r->overlap || r->steps <= TS_GRAD_SYNC_REFERENCE_STEPS) return 0.0;
    double hidden = 1.0 - r->wait_ms / r->reference_ms;
    return hidden < 0.0 ? 0.0 : hidden > 1.0 ? 1.0 : hidden;
}
