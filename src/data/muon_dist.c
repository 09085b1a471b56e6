/* Muon over the data-parallel group (data/muon_dist.h). */
#include "data/muon_dist.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tensor/logical_gather.h"
#include "tensor/tp.h"

double *ts_muon_whole_costs(const ts_model *m)
{
    double *cost = ts_calloc((size_t)m->n_params + 1, sizeof(double));
    for (int p = 0; p < m->n_params; p++)
        if (ts_param_is_muon(m, p))
            cost[p] = ts_muon_ns_cost(m->params[p].shard.shape[0], m->params[p].shard.shape[1]);
    return cost;
}

/* Where the reduced gradient and the fp32 weights of owned parameter p live: the model's
 * full buffers, or (ZeRO-2/3) at its place in the compact shard of the pieces. */
static void locate(const ts_model *m, const ts_reducer *r, const ts_zero_state *z, int p,
                   float **grad, float **param)
{
    const ts_param *P = &m->params[p];
    *grad = m->grad_mem ? m->grad_mem + P->offset : NULL;
    *param = m->param_mem ? m->param_mem + P->offset : NULL;
    if (z->level < 2) return;
    for (int i = 0; i < r->n_buckets; i++) {
        const ts_bucket *b = &r->buckets[i];
        const int me = b->group->rank;
        const size_t lo = b->begin + (size_t)b->displs[me], hi = lo + (size_t)b->counts[me];
        if (P->offset < lo || P->offset + P->numel > hi) continue;
        const size_t at = b->piece_off + (P->offset - lo);
        *grad = z->shard_grads + at;
        if (z->level == 3) *param = z->master + at;
        return;
    }
    TS_ASSERT(!"an owned Muon matrix outside this rank's pieces");
}

void ts_muon_dist_init(ts_muon_dist *d, ts_muon *o, const ts_model *m, const ts_train_config *tc,
                       const ts_reducer *r, const ts_zero_state *z, const ts_comm *tp,
                       const ts_comm *etp)
{
    memset(d, 0, sizeof *d);
    int *owned = ts_calloc((size_t)m->n_params + 1, sizeof(int)), n = 0;
    for (int p = 0; p < m->n_params; p++)
        if (ts_param_is_muon(m, p) && (!r->whole_owner || ts_reducer_owns_whole(r, p)))
            owned[n++] = p;
    ts_muon_init(o, m, tc, owned, n);
    free(owned);
    d->muon = o;
    d->grads = ts_calloc((size_t)n + 1, sizeof *d->grads);
    d->params = ts_calloc((size_t)n + 1, sizeof *d->params);
    d->split = ts_calloc((size_t)n + 1, sizeof *d->split);
    size_t stage = 0, local = 0;
    for (int i = 0; i < n; i++) {
        const int p = o->param[i];
        const ts_param *P = &m->params[p];
        locate(m, r, z, p, &d->grads[i], &d->params[i]);
        if (!ts_logical_is_split(&P->shard)) continue;
        const ts_comm *g = P->expert ? etp : tp;
        TS_ASSERT(g && g->size % P->shard.parts == 0);
        d->split[i] = g;
        const size_t s = ts_logical_stage_floats(&P->shard, g->size);
        stage = s > stage ? s : stage;
        local = P->numel > local ? P->numel : local;
    }
    if (stage > 0) {
        d->stage = m->k->dev_alloc(stage * sizeof(float));
        d->local = m->k->dev_alloc(local * sizeof(float));
    }
}

void ts_muon_dist_free(ts_muon_dist *d)
{
    if (d->muon && d->muon->k) {
        d->muon->k->dev_free(d->stage);
        d->muon->k->dev_free(d->local);
    }
    free(d->grads);
    free(d->params);
    free(d->split);
    memset(d, 0, sizeof *d);
}

/* Matrix i split over group g: the momentum on this rank's shard, the Nesterov updates
 * gathered into the logical matrix, the iteration on the whole (every member alike), this
 * rank's slice of the result applied to its shard. */
static void split_step(ts_muon_dist *d, const ts_model *m, int i, const ts_comm *g,
                       float grad_scale, double lr, double weight_decay, double *acc)
{
    ts_muon *o = d->muon;
    const ts_kernels *k = o->k;
    const ts_param *P = &m->params[o->param[i]];
    const int64_t rows = P->shard.shape[0], cols = P->shard.shape[1];
    k->muon_momentum(d->local, o->momentum + o->offset[i], d->grads[i], grad_scale, P->numel,
                     o->cfg.momentum, o->cfg.nesterov ? 1 : 0);
    ts_logical_gather(g, k, &P->shard, d->local, d->stage, o->work);
    ts_muon_orthogonalize(&o->cfg, k, o->work, rows, cols, o->scratch);
    ts_logical_take(k, &P->shard, o->work, d->local);
    float decay, lr_scaled; /* as ts_muon_matrix_step's for a whole matrix */
    ts_muon_update_factors(&o->cfg, P, lr, weight_decay, &decay, &lr_scaled);
    k->muon_apply(d->params[i], d->local, P->numel, decay, lr_scaled, acc);
}

double ts_muon_dist_step(ts_muon_dist *d, const ts_model *m, const ts_train_config *tc, double lr,
                         float grad_scale)
{
    ts_muon *o = d->muon;
    o->k->memset_zero(o->acc, sizeof(double));
    for (int i = 0; i < o->n; i++) {
        const ts_param *P = &m->params[o->param[i]];
        double *acc = ts_tp_param_counts(&P->shard) ? o->acc : NULL;
        if (d->split[i])
            split_step(d, m, i, d->split[i], grad_scale, lr, tc->weight_decay, acc);
        else
            ts_muon_matrix_step(o, m, i, d->params[i], d->grads[i], grad_scale, lr,
                                tc->weight_decay, acc);
    }
    double sum = 0.0;
    o->k->memcpy_d2h(&sum, o->acc, sizeof sum);
    return sum;
}
