#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* acc[0] += the squares of the counted gradients in floats [begin, end), on the device,
 * read from grad[0 ..] = float `begin` (the full buffer's or a compact range's). */
/* `which`: every parameter (-1), the non-expert ones (0), the experts' (1). */
static void sum_squares_into(const ts_model *m, size_t begin, size_t end, const float *grad,
                             double *acc, int which)
{
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        if (which >= 0 && P->expert != (which == 1)) continue;
        size_t lo = P->offset > begin ? P->offset : begin;
        size_t hi = P->offset + P->numel < end ? P->offset + P->numel : end;
        if (lo >= hi) continue;
        /* Count once (tensor/tp.h): not the tied copy, nor tp ranks 1.. of a replicated
         * tensor. */
        if (!ts_tp_param_counts(&P->shard)) continue;
        m->k->sum_squares_into(acc, grad + (lo - begin), hi - lo);
    }
}

/* A device double for the partial sums, zeroed, and reading it back (one copy). */
static double *device_acc(const ts_kernels *k)
{
    double *acc = k->dev_alloc(sizeof(double));
    k->memset_zero(acc, sizeof(double));
    return acc;
}

static double read_acc(const ts_kernels *k, double *acc)
{
    double v = 0.0;
    k->memcpy_d2h(&v, acc, sizeof v);
    k->dev_free(acc);
    return v;
}

double ts_grad_sum_squares_range(const ts_model *m, size_t begin, size_t end)
{
    double *acc = device_acc(m->k);
    sum_squares_into(m, begin, end, m->grad_mem + begin, acc, -1);
    return read_acc(m->k, acc);
}

float ts_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0.0) return 1.0f;
    double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? (float)coef : 1.0f;
}

/* The spans of model m in the optimizer's ranges into `out` (NULL: count only): each
 * parameter's part inside each range (the alignment gaps between parameters are left
 * alone), range after range, its moments at the range's base plus its distance from
 * the range's start, or with excluded parameters (ts_adamw_exclude) right after the
 * previous included part's. `counted`: only the parts ts_tp_param_counts counts (the
 * update's sum of squares). Returns how many. */
static int build_spans(const ts_adamw *o, const ts_model *m, ts_adamw_span *out, bool counted)
{
    int n = 0;
    size_t base = 0; /* the range's floats start at base in a compact buffer */
    size_t mom = 0;  /* with exclusions: the next part's moments */
    for (int r = 0; r < o->n_ranges; r++) {
        const size_t begin = o->ranges[r].begin, end = o->ranges[r].end;
        for (int p = 0; p < m->n_params; p++) {
            const ts_param *P = &m->params[p];
            size_t lo = P->offset > begin ? P->offset : begin;
            size_t hi = P->offset + P->numel < end ? P->offset + P->numel : end;
            if (lo >= hi || (o->excluded && o->excluded[p])) continue;
            const size_t coff = base + (lo - begin);
            const size_t moff = o->excluded ? mom : coff;
            mom += hi - lo;
            if (counted && !ts_tp_param_counts(&P->shard)) continue;
            if (out)
                out[n] = (ts_adamw_span){.offset = o->params ? coff : lo,
                                         .grad_offset = o->grads ? coff : lo,
                                         .moment_offset = moff, .count = hi - lo,
                                         .decay = P->decay ? 1 : 0};
            n++;
        }
        base += end - begin;
    }
    return n;
}

/* The spans of the current layout (all of them, or the counted ones), built on the host
 * and copied to the device; *n gets their count. */
static ts_adamw_span *upload(const ts_adamw *o, const ts_model *m, bool counted, int *n)
{
    const ts_kernels *k = o->k;
    *n = build_spans(o, m, NULL, counted);
    const size_t bytes = (size_t)*n * sizeof(ts_adamw_span);
    ts_adamw_span *host = ts_calloc(*n > 0 ? (size_t)*n : 1, sizeof *host);
    build_spans(o, m, host, counted);
    ts_adamw_span *dev = k->dev_alloc(bytes);
    if (bytes) k->memcpy_h2d(dev, host, bytes);
    free(host);
    return dev;
}

static void upload_spans(ts_adamw *o, const ts_model *m)
{
    o->spans = upload(o, m, false, &o->n_spans);
    o->count_spans = upload(o, m, true, &o->n_count_spans);
    /* The counted floats, from the host's copy of the same spans. */
    ts_adamw_span *host = ts_calloc(o->n_count_spans > 0 ? (size_t)o->n_count_spans : 1,
                                    sizeof *host);
    build_spans(o, m, host, true);
    o->count_floats = 0;
    for (int i = 0; i < o->n_count_spans; i++) o->count_floats += host[i].count;
    free(host);
}

static void free_spans(ts_adamw *o)
{
    o->k->dev_free(o->spans);
    o->k->dev_free(o->count_spans);
    o->spans = o->count_spans = NULL;
}

void ts_adamw_init_ranges(ts_adamw *o, const ts_model *m, const ts_flat_range *ranges,
                          int n_ranges, bool sharded)
{
    const ts_kernels *k = m->k;
    memset(o, 0, sizeof *o);
    o->k = k;
    o->n_ranges = n_ranges;
    o->sharded = sharded;
    o->ranges = ts_calloc((size_t)n_ranges, sizeof *o->ranges);
    for (int r = 0; r < n_ranges; r++) {
        TS_ASSERT(ranges[r].begin <= ranges[r].end);
        TS_ASSERT(r == 0 || ranges[r - 1].end <= ranges[r].begin);
        o->ranges[r] = ranges[r];
        o->n_floats += ranges[r].end - ranges[r].begin;
    }
    o->m = k->dev_alloc(o->n_floats * sizeof(float));
    o->v = k->dev_alloc(o->n_floats * sizeof(float));
    o->norm_acc = k->dev_alloc(sizeof(double));
    upload_spans(o, m);
}

void ts_adamw_set_compact(ts_adamw *o, const ts_model *m, float *grads, float *params)
{
    o->grads = grads;
    o->params = params;
    free_spans(o);
    upload_spans(o, m);
}

void ts_adamw_init(ts_adamw *o, const ts_model *m)
{
    ts_flat_range all = {0, m->num_floats};
    ts_adamw_init_ranges(o, m, &all, 1, false);
}

void ts_adamw_exclude(ts_adamw *o, const ts_model *m, const bool *excluded)
{
    const ts_kernels *k = o->k;
    free(o->excluded);
    o->excluded = ts_calloc((size_t)m->n_params, sizeof(bool));
    memcpy(o->excluded, excluded, (size_t)m->n_params * sizeof(bool));
    free_spans(o);
    upload_spans(o, m);
    /* The moments of the included parts only, back to back. */
    size_t n = 0;
    for (int r = 0; r < o->n_ranges; r++)
        for (int p = 0; p < m->n_params; p++) {
            const ts_param *P = &m->params[p];
            const size_t lo = P->offset > o->ranges[r].begin ? P->offset : o->ranges[r].begin;
            const size_t hi = P->offset + P->numel < o->ranges[r].end ? P->offset + P->numel
                                                                      : o->ranges[r].end;
            if (lo < hi && !excluded[p]) n += hi - lo;
        }
    k->dev_free(o->m);
    k->dev_free(o->v);
    o->n_floats = n;
    o->m = k->dev_alloc(n * sizeof(float));
    o->v = k->dev_alloc(n * sizeof(float));
}

size_t ts_adamw_moment_offset(const ts_adamw *o, const ts_model *m, int r, int p)
{
    size_t base = 0, mom = 0;
    for (int q = 0; q < o->n_ranges; q++) {
        const size_t begin = o->ranges[q].begin, end = o->ranges[q].end;
        for (int i = 0; i < m->n_params; i++) {
            const ts_param *P = &m->params[i];
            const size_t lo = P->offset > begin ? P->offset : begin;
            const size_t hi = P->offset + P->numel < end ? P->offset + P->numel : end;
            if (lo >= hi || (o->excluded && o->excluded[i])) continue;
            if (q == r && i == p) return o->excluded ? mom : base + (lo - begin);
            mom += hi - lo;
        }
        base += end - begin;
    }
    return SIZE_MAX;
}

void ts_adamw_free(ts_adamw *o)
{
    free(o->ranges);
    free(o->excluded);
    if (o->k) {
        o->k->dev_free(o->count_spans);
        o->k->dev_free(o->spans);
        o->k->dev_free(o->m);
        o->k->dev_free(o->v);
        o->k->dev_free(o->norm_acc);
    }
    memset(o, 0, sizeof *o);
}

size_t ts_adamw_state_bytes(const ts_adamw *o)
{
    return 2 * o->n_floats * sizeof(float);
}

static double adamw_sum_squares(const ts_adamw *o, const ts_model *m, int which)
{
    /* Every part's squares accumulate on the device; one copy reads the total. */
    m->k->memset_zero(o->norm_acc, sizeof(double));
    size_t base = 0;
    for (int r = 0; r < o->n_ranges; r++) {
        const size_t begin = o->ranges[r].begin, end = o->ranges[r].end;
        sum_squares_into(m, begin, end, o->grads ? o->grads + base : m->grad_mem + begin,
                         o->norm_acc, which);
        base += end - begin;
    }
    double sum = 0.0;
    m->k->memcpy_d2h(&sum, o->norm_acc, sizeof sum);
    return sum;
}

double ts_adamw_grad_sum_squares(const ts_adamw *o, const ts_model *m)
{
    return adamw_sum_squares(o, m, -1);
}

double ts_adamw_grad_sum_squares_of(const ts_adamw *o, const ts_model *m, bool experts)
{
    return adamw_sum_squares(o, m, experts ? 1 : 0);
}

void ts_adamw_step(ts_adamw *o, ts_model *m, const ts_train_config *tc, double lr,
                   float grad_scale, int t)
{
    /* Called even with no spans (a ZeRO-1 shard holding none of this model's
     * parameters): the call is also the backend's word that the parameters change now
     * (the bf16 table drops its cached weight copies, which the all-gather after the
     * step overwrites behind its back). */
    m->k->adamw_update_spans(o->params ? o->params : m->param_mem,
                             o->grads ? o->grads : m->grad_mem, grad_scale, o->m, o->v, o->spans,
                             o->n_spans, (float)lr, (float)tc->beta1, (float)tc->beta2,
                             (float)tc->eps, (float)tc->weight_decay, t);
}

double ts_adamw_update_sum_squares(const ts_adamw *o, const ts_model *m,
                                   const ts_train_config *tc, double lr, int t, size_t *n_floats)
{
    m->k->memset_zero(o->norm_acc, sizeof(double));
    m->k->adamw_delta_sq_spans(o->norm_acc, o->params ? o->params : m->param_mem, o->m, o->v,
                               o->count_spans, o->n_count_spans, (float)lr, (float)tc->beta1,
                               (float)tc->beta2, (float)tc->eps, (float)tc->weight_decay, t);
    double sum = 0.0;
    m->k->memcpy_d2h(&sum, o->norm_acc, sizeof sum);
    if (n_floats) *n_floats = o->count_floats;
    return sum;
}
