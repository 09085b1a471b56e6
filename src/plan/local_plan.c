/* `tessera plan CONFIG` on this machine's costs (local_plan.h). */
#include "plan/local_plan.h"

#include <stdlib.h>

#include "core/error.h"
#include "core/sysmem.h"
#include "kernels/kernels.h"
#include "pipeline/residency.h"

ts_status ts_local_plan_run(ts_local_plan *lp, const ts_config *cfg,
                            const ts_local_plan_opts *o)
{
    const ts_parallel_config *p = &cfg->parallel;
    if (ts_recompute_from_name(p->recompute) == TS_RECOMPUTE_AUTO && p->memory_budget_mb == 0 &&
        ts_kernels_layout_for(cfg->train.device, cfg->train.precision, cfg->train.attention)
            ->device_memory)
        return ts_fail("parallel.recompute = \"auto\" fits each rank into its device's free "
                       "memory, which tessera plan cannot see for train.device = \"%s\": give "
                       "the budget with --set parallel.memory_budget_mb=MiB (or plan with "
                       "--cluster FILE)",
                       cfg->train.device);
    if (cfg->train.threads > 0) ts_cpu_set_threads(cfg->train.threads);
    if (ts_partition_build(cfg, o->measure && !o->costs_trace, &lp->part) != TS_OK)
        return TS_ERR;
    if (ts_schedule_build(&lp->schedule, p->schedule, p->pp, p->virtual_stages,
                          ts_config_num_microbatches(cfg)) != TS_OK)
        return TS_ERR;
    if (o->costs_trace) {
        if (ts_trace_costs_load(o->costs_trace, &lp->schedule, o->trace_skip, o->trace_median,
                                &lp->trace_store) != TS_OK)
            return TS_ERR;
        lp->traced = &lp->trace_store;
    }
    ts_plan_cost_opts co = o->cost;
    co.traced = lp->traced;
    ts_plan_sim_costs_of_config(&lp->costs, cfg, &lp->part, &co);
    return ts_sim_run(&lp->schedule, &lp->costs.costs, &lp->sim);
}

void ts_local_plan_free(ts_local_plan *lp)
{
    ts_sim_result_free(&lp->sim);
    ts_plan_sim_costs_free(&lp->costs);
    ts_trace_costs_free(&lp->trace_store);
    ts_schedule_free(&lp->schedule);
    ts_partition_free(&lp->part);
    lp->traced = NULL;
}

double ts_local_plan_dp_reduction_max(const ts_sim_result *r)
{
    double most = 0.0;
    for (int q = 0; q < r->pp; q++) most = r->dp_busy[q] > most ? r->dp_busy[q] : most;
    return most;
}

double ts_local_plan_room(const ts_config *cfg)
{
    const ts_parallel_config *p = &cfg->parallel;
    if (p->memory_budget_mb > 0) return (double)p->memory_budget_mb * 1048576.0;
    if (ts_recompute_from_name(p->recompute) != TS_RECOMPUTE_AUTO) return 0.0;
    ts_sysmem lim;
    ts_sysmem_read(&lim);
    const double share = lim.physical / ((double)p->pp * p->dp * p->cp * p->tp);
    return share < lim.address_space ? share : lim.address_space;
}

bool ts_local_plan_rank_memory(const ts_config *cfg, const ts_partition *part,
                               const ts_schedule *s, int pp_rank, double room, int *keep,
                               bool *selective, ts_rank_memory *est)
{
    int threads = cfg->train.threads > 0 ? cfg->train.threads : 1;
    if (ts_recompute_from_name(cfg->parallel.recompute) == TS_RECOMPUTE_AUTO)
        return ts_memory_estimate_auto_selective(cfg, part, s, pp_rank, threads, room, keep,
                                                 selective, est);
    ts_memory_estimate(cfg, part, s, pp_rank, threads, NULL, est);
    return room <= 0 || est->total - est->blas <= room;
}

void ts_local_plan_recompute(const ts_config *cfg, const ts_schedule *s, int q,
                             const int *keep, int *in_flight, int *peak, int *recomputed)
{
    const int mode = ts_recompute_from_name(cfg->parallel.recompute);
    for (int c = 0; c < s->n_chunks; c++) in_flight[c] = peak[c] = recomputed[c] = 0;
    ts_memory_peak_sets(s, TS_RECOMPUTE_NONE, NULL, q, in_flight, NULL, NULL, NULL);
    ts_memory_peak_sets(s, mode, keep, q, peak, NULL, recomputed, NULL);
}

void ts_local_plan_zero_traffic(const ts_config *cfg, const ts_partition *part,
                                const ts_schedule *s, int q, ts_zero_traffic *t, int *gathers,
                                double *bytes)
{
    const int zero = cfg->parallel.zero, dp = cfg->parallel.dp * cfg->parallel.cp;
    double *floats = ts_calloc((size_t)s->n_chunks, sizeof(double));
    ts_memory_chunk_floats(cfg, part, s, q, floats);
    ts_residency r = {0};
    if (zero == 3 && dp > 1) ts_memory_residency_of_config(cfg, part, s, q, &r);
    const ts_kernels *k =
        ts_kernels_layout_for(cfg->train.device, cfg->train.precision, cfg->train.attention);
    const int eb = (int)ts_dtype_bytes(k->act_dtype);
    ts_zero_traffic_of(zero, dp, s, q, zero == 3 ? &r : NULL, floats, eb, t);
    /* Muon under ZeRO-0: the all-gather of its updated matrices (zero.h) */
    double *muon = ts_calloc((size_t)s->n_chunks, sizeof(double));
    if (ts_config_muon(&cfg->train) && zero == 0 && dp > 1)
        ts_memory_chunk_muon_floats(cfg, part, s, q, muon);
    for (int c = 0; c < s->n_chunks; c++) {
        if (ts_chunk_rank(s, c) != q) continue;
        gathers[c] = zero == 3 && dp > 1 ? r.gathers[c] : 0;
        ts_zero_add_muon(t, zero, dp, muon[c]);
        bytes[c] = ts_zero_chunk_bytes(zero, dp, zero == 3 ? &r : NULL, c, floats[c], eb) +
                   ts_zero_muon_bytes(zero, dp, muon[c]);
    }
    ts_residency_free(&r);
    free(muon);
    free(floats);
}
