/* The trainer's optimizer (train/internal.h): AdamW on every parameter, or under
 * train.optimizer = "muon" Muon on the Muon matrices (optim/muon.h) and AdamW on the
 * rest, AdamW's moments covering the rest only. One rank owns every Muon matrix. */
#include <math.h>
#include <stdlib.h>

#include "core/log.h"
#include "train/internal.h"

void ts_trainer_optimizer_init(ts_trainer *t)
{
    t->use_muon = ts_config_muon(&t->cfg.train);
    if (!t->use_muon) return;
    /* Config validation keeps Muon to one rank per stage: no replicas, no tp or ep
     * shards, so this rank owns every Muon matrix it holds, whole. */
    TS_ASSERT(t->groups->replica.size == 1 && t->model.tp.size == 1);
    bool *mask = ts_muon_mask(&t->model);
    ts_adamw_exclude(&t->optim, &t->model, mask);
    free(mask);
    ts_muon_init_all(&t->muon, &t->model, &t->cfg.train);
    if (t->groups->world.rank != 0) return;
    const ts_muon_config *c = &t->muon.cfg;
    ts_log_info("optimizer muon: %d matrices (%.3gM floats%s) on Muon (momentum %g%s, %d "
                "Newton-Schulz steps of the %s set, scale %s), AdamW on the other %.3gM",
                t->muon.n, (double)t->muon.n_floats / 1e6,
                t->part.n_chunks > 1 ? " on this rank" : "", c->momentum,
                c->nesterov ? ", Nesterov" : "", c->ns_steps, t->cfg.train.muon_coefficients,
                t->cfg.train.muon_scale, (double)t->optim.n_floats / 1e6);
}

void ts_trainer_optimizer_step(ts_trainer *t, double lr, float grad_scale, int step1,
                               ts_step_stats *out)
{
    const ts_train_config *tc = &t->cfg.train;
    ts_adamw_step(&t->optim, &t->model, tc, lr, grad_scale, step1);
    if (!t->use_muon) return;
    double sums[4] = {0.0, 0.0, 0.0, 0.0}; /* Muon's squares and floats, AdamW's */
    sums[0] = ts_muon_step(&t->muon, &t->model, tc, lr, grad_scale);
    sums[1] = (double)t->muon.count_floats;
    size_t adamw_floats = 0;
    sums[2] = ts_adamw_update_sum_squares(&t->optim, &t->model, tc, lr, step1, &adamw_floats);
    sums[3] = (double)adamw_floats;
    /* Each pipeline stage holds its own parameters: the grid's sums (one rank per stage
     * under one-rank Muon; every rank's share once the state is distributed). */
    ts_host_allreduce_sum_f64(&t->groups->world, sums, 4);
    out->update_rms_muon = sums[1] > 0 ? sqrt(sums[0] / sums[1]) : 0.0;
    out->update_rms_adamw = sums[3] > 0 ? sqrt(sums[2] / sums[3]) : 0.0;
}
