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
 * the range's start. Returns how many. */
static int build_spans(const ts_adamw *o, const ts_model *m, ts_adamw_span *out)
{
    int n = 0;
    size_t base = 0; /* the moments of range r start at base */
    for (int r = 0; r < o->n_ranges; r++) {
        const size_t begin = o->ranges[r].begin, end = o->ranges[r].end;
        for (int p = 0; p < m->n_params; p++) {
            const ts_param *P = &m->params[p];
            size_t lo = P->offset > begin ? P->offset : begin;
            size_t hi = P->offset + P->numel < end ? P->offset + P->numel : end;
            if (lo >= hi) continue;
            if (out) {
                const size_t moff = base + (lo - begin);
                out[n] = (ts_adamw_span){.offset = o->params ? moff : lo,
                                         .grad_offset = o->grads ? moff : lo,
                                         .moment_offset = moff, .count = hi - lo,
                                         .decay = P->decay ? 1 : 0};
            }
            n++;
        }
        base += end - begin;
    }
    return n;
}

/* The spans of the current layout, built on the host and copied to the device. */
static void upload_spans(ts_adamw *o, const ts_model *m)
{
    const ts_kernels *k = o->k;
    o->n_spans = build_spans(o, m, NULL);
    const size_t bytes = (size_t)o->n_spans * sizeof(ts_adamw_span);
    ts_adamw_span *host = ts_calloc(o->n_spans > 0 ? (size_t)o->n_spans : 1, sizeof *host);
    build_spans(o, m, host);
    o->spans = k->dev_alloc(bytes);
    if (bytes) k->memcpy_h2d(o->spans, host, bytes);
    free(host);
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
    o->k->dev_free(o->spans);
    upload_spans(o, m);
}

void ts_adamw_init(ts_adamw *o, const ts_model *m)
{
    ts_flat_range all = {0, m->num_floats};
    ts_adamw_init_ranges(o, m, &all, 1, false);
}

void ts_adamw_free(ts_adamw *o)
{
    free(o->ranges);
    if (o->k) {
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
