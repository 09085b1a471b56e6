/* The trainer's optimizer (train/internal.h): AdamW on every parameter, or under
 * train.optimizer = "muon" Muon on the Muon matrices (optim/muon.h) and AdamW on the
 * rest, AdamW's moments covering the rest only. Each Muon matrix is owned by one member
 * of its reduction group (data/muon_dist.h). */
#include <math.h>
#include <stdlib.h>

#include "core/log.h"
#include "core/timer.h"
#include "train/internal.h"

/* Rank 0's start-up line: the Newton-Schulz balance the owner-aligned cuts reached over
 * its replica group (the most loaded member's summed cost over the mean). */
static void log_owners(const ts_trainer *t)
{
    const ts_reducer *r = &t->reducer;
    if (t->groups->world.rank != 0 || !r->whole_load) return;
    for (int g = 0; g < r->n_groups; g++) {
        const ts_comm *c = r->groups[g];
        double most = 0.0, sum = 0.0;
        for (int q = 0; q < c->size; q++) {
            sum += r->whole_load[g][q];
            most = r->whole_load[g][q] > most ? r->whole_load[g][q] : most;
        }
        if (c->size > 1 && sum > 0.0)
            ts_log_info("muon owners over %s (%d members): the most loaded member's "
                        "Newton-Schulz cost %.4f x the mean", c->name, c->size,
                        most / (sum / c->size));
    }
}

void ts_trainer_optimizer_init(ts_trainer *t)
{
    t->use_muon = ts_config_muon(&t->cfg.train);
    if (!t->use_muon) return;
    bool *mask = ts_muon_mask(&t->model);
    ts_adamw_exclude(&t->optim, &t->model, mask);
    free(mask);
    /* The matrices this rank owns (every one without replicas), by the reducer's
     * owner-aligned cuts (data/muon_dist.h); split ones gathered over tp or etp. */
    ts_muon_dist_init(&t->muon_dist, &t->muon, &t->model, &t->cfg.train, &t->reducer, &t->zero,
                      t->model.tp.size > 1 ? &t->groups->tp : NULL,
                      t->model.moe_etp > 1 ? &t->groups->etp : NULL);
    if (t->groups->world.rank != 0) return;
    const ts_muon_config *c = &t->muon.cfg;
    const bool mine = t->part.n_chunks > 1 || t->groups->world.size > 1;
    ts_log_info("optimizer muon: %d matrices (%.3gM floats%s) on Muon (momentum %g%s, %d "
                "Newton-Schulz steps of the %s set, scale %s), AdamW on the other %.3gM",
                t->muon.n, (double)t->muon.n_floats / 1e6, mine ? " owned by this rank" : "",
                c->momentum, c->nesterov ? ", Nesterov" : "", c->ns_steps,
                t->cfg.train.muon_coefficients, t->cfg.train.muon_scale,
                (double)t->optim.n_floats / 1e6);
    log_owners(t);
}

void ts_trainer_optimizer_step(ts_trainer *t, double lr, float grad_scale, int step1,
                               ts_step_stats *out)
{
    const ts_train_config *tc = &t->cfg.train;
    ts_adamw_step(&t->optim, &t->model, tc, lr, grad_scale, step1);
    if (!t->use_muon) return;
    double sums[4] = {0.0, 0.0, 0.0, 0.0}; /* Muon's squares and floats, AdamW's */
    const double t0 = ts_now_ms();
    sums[0] = ts_muon_dist_step(&t->muon_dist, &t->model, tc, lr, grad_scale);
    out->muon_ms = ts_now_ms() - t0; /* the sum's read-back waited for the device */
    sums[1] = (double)t->muon.count_floats;
    /* AdamW's group once over the grid, as the norm counts it: every rank its own ZeRO
     * pieces, or replica rank 0 the replicated state. No edp rule: every expert tensor is
     * a Muon matrix, summed by its owner alone (data/muon_dist.h). */
    if (ts_reducer_counts_norm(&t->reducer)) {
        size_t adamw_floats = 0;
        sums[2] = ts_adamw_update_sum_squares(&t->optim, &t->model, tc, lr, step1,
                                              &adamw_floats);
        sums[3] = (double)adamw_floats;
    }
    /* Each pipeline stage holds its own parameters: the grid's sums. */
    ts_host_allreduce_sum_f64(&t->groups->world, sums, 4);
    out->update_rms_muon = sums[1] > 0 ? sqrt(sums[0] / sums[1]) : 0.0;
    out->update_rms_adamw = sums[3] > 0 ? sqrt(sums[2] / sums[3]) : 0.0;
}
