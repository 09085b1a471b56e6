#include "data/grad_sync.h"

#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

void ts_grad_sync_init(ts_grad_sync *g, const ts_model *m, const ts_comm *dp, size_t bucket_bytes,
                       bool overlap)
{
    memset(g, 0, sizeof *g);
    g->dp = *dp;
    g->grads = m->grad_mem;
    g->overlap = overlap;
    g->n_layers = m->n_layers;
    g->n_floats = m->num_floats;
    g->layer_final = ts_calloc((size_t)m->n_layers, sizeof(bool));
    if (dp->size <= 1 || m->n_params == 0) return;

    /* Walk the parameters from the last (final first) to the first, closing a bucket
     * once it holds bucket_bytes. Boundaries fall between parameters, so a bucket's
     * readiness is a single layer index. */
    const size_t target = bucket_bytes / sizeof(float) > 0 ? bucket_bytes / sizeof(float) : 1;
    g->buckets = ts_calloc((size_t)m->n_params, sizeof *g->buckets);
    size_t end = m->num_floats;
    int min_layer = m->params[m->n_params - 1].layer, max_layer = min_layer;
    for (int p = m->n_params - 1; p >= 0; p--) {
        const ts_param *P = &m->params[p];
        if (P->layer < min_layer) min_layer = P->layer;
        if (P->layer > max_layer) max_layer = P->layer;
        if (end - P->offset >= target || p == 0) {
            ts_bucket *b = &g->buckets[g->n_buckets++];
            b->begin = p == 0 ? 0 : P->offset;
            b->end = end;
            b->min_layer = min_layer;
            b->max_layer = max_layer;
            end = b->begin;
            if (p > 0) min_layer = max_layer = m->params[p - 1].layer;
        }
    }
}

void ts_grad_sync_free(ts_grad_sync *g)
{
    free(g->buckets);
    free(g->layer_final);
    g->layer_final = NULL;
    g->buckets = NULL;
    g->n_buckets = 0;
}

void ts_grad_sync_begin(ts_grad_sync *g)
{
    for (int i = 0; i < g->n_buckets; i++) g->buckets[i].launched = false;
    for (int l = 0; l < g->n_layers; l++) g->layer_final[l] = false;
    g->wait_ms = 0.0;
}

static void launch(ts_grad_sync *g, ts_bucket *b)
{
    ts_iallreduce_sum_f32(&g->dp, g->grads + b->begin, b->end - b->begin, &b->req);
    b->launched = true;
}

static void progress(ts_grad_sync *g)
{
    for (int i = 0; i < g->n_buckets; i++)
        if (g->buckets[i].launched) ts_request_test(&g->buckets[i].req);
}

static bool bucket_ready(const ts_grad_sync *g, const ts_bucket *b)
{
    for (int l = b->min_layer; l <= b->max_layer; l++)
        if (!g->layer_final[l]) return false;
    return true;
}

void ts_grad_sync_layers_done(ts_grad_sync *g, int first, int end)
{
    for (int l = first; l < end; l++) g->layer_final[l] = true;
    /* The first steps run without overlap: the wait of the second (the first pays for
     * page faults) is the reference all-reduce time the hidden fraction is measured
     * against. */
    if (!g->overlap || g->n_buckets == 0 || g->steps < TS_GRAD_SYNC_REFERENCE_STEPS) return;
    /* Every dp replica runs the same schedule, so buckets become ready, and their
     * non-blocking all-reduces start, in the same order on every rank. */
    for (int i = 0; i < g->n_buckets; i++) {
        ts_bucket *b = &g->buckets[i];
        if (!b->launched && bucket_ready(g, b)) launch(g, b);
    }
    progress(g);
}

void ts_grad_sync_finish(ts_grad_sync *g)
{
    if (g->n_buckets == 0) return;
    double t0 = ts_now_ms();
    if (!g->overlap) {
        /* Nothing to hide behind: one blocking all-reduce of the whole buffer, which
         * MPI runs about twice as fast as the same bytes in non-blocking buckets. */
        ts_allreduce_sum_f32(&g->dp, g->grads, g->n_floats);
    } else {
        for (int i = 0; i < g->n_buckets; i++)
            if (!g->buckets[i].launched) launch(g, &g->buckets[i]);
        for (int i = 0; i < g->n_buckets; i++) ts_request_wait(&g->buckets[i].req);
    }
    g->wait_ms = ts_now_ms() - t0;
    if (++g->steps == TS_GRAD_SYNC_REFERENCE_STEPS)
        g->reference_ms = g->wait_ms > 1e-6 ? g->wait_ms : 1e-6;
}

double ts_grad_sync_overlap(const ts_grad_sync *g)
{
    if (g->n_buckets == 0 || !g->overlap || g->steps <= TS_GRAD_SYNC_REFERENCE_STEPS) return 0.0;
    double hidden = 1.0 - g->wait_ms / g->reference_ms;
    return hidden < 0.0 ? 0.0 : hidden > 1.0 ? 1.0 : hidden;
}
