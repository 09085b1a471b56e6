/* `tessera plan CONFIG` without --cluster: one grid planned on this machine's costs
 * (measured, modelled, uniform, or taken from a training run's trace). Cut the layers
 * into chunks, build the schedule, price it and replay it (ts_local_plan_run); then,
 * per pipeline rank, the memory estimate `tessera train` checks, what recompute = "auto"
 * would choose, the recompute per chunk and ZeRO's data-parallel traffic. The command
 * (cli/cmd_plan.c) only parses, prints and writes what this computes. */
#ifndef TS_PLAN_LOCAL_PLAN_H
#define TS_PLAN_LOCAL_PLAN_H

#include <stdbool.h>

#include "config/config.h"
#include "pipeline/memory.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "pipeline/sim.h"
#include "plan/sim_costs.h"
#include "plan/trace_costs.h"
#include "plan/zero.h"

/* How to price the plan. cost.traced is ignored: the plan loads costs_trace itself. */
typedef struct {
    bool measure;            /* time the layers with the CPU kernels (else modelled) */
    const char *costs_trace; /* a Chrome trace of a run of this config, or NULL */
    int trace_skip;          /* its warm-up steps to drop */
    bool trace_median;       /* the median of the steady steps' durations, else the mean */
    ts_plan_cost_opts cost;  /* uniform costs, links, optimizer step */
} ts_local_plan_opts;

/* What one plan built; zero it before ts_local_plan_run (ts_local_plan_free frees
 * whatever a failed run left). */
typedef struct {
    ts_partition part;
    ts_schedule schedule;
    ts_trace_costs trace_store;
    const ts_trace_costs *traced; /* &trace_store with costs_trace, else NULL */
    ts_plan_sim_costs costs;
    ts_sim_result sim;
} ts_local_plan;

/* Plan cfg as o says. Refuses recompute = "auto" without parallel.memory_budget_mb on
 * a device whose memory this machine cannot see; sets the BLAS threads to
 * train.threads when given (the measured costs then use them). */
ts_status ts_local_plan_run(ts_local_plan *lp, const ts_config *cfg,
                            const ts_local_plan_opts *o);
void ts_local_plan_free(ts_local_plan *lp);

/* The longest dp lane over the pipeline ranks (ms). */
double ts_local_plan_dp_reduction_max(const ts_sim_result *r);

/* What each rank may allocate (the estimate less its BLAS buffers), or 0 when nothing
 * bounds it here: parallel.memory_budget_mb; else, for recompute = "auto" (which needs
 * a bound), what `tessera train` would offer each rank with the grid's ranks all on this
 * machine: the smaller of RLIMIT_AS and an even share of physical memory. */
double ts_local_plan_room(const ts_config *cfg);

/* The same per-rank memory estimate `tessera train` checks before it allocates, with
 * train.threads BLAS threads (1 when it is 0: the plan cannot know the cores); with
 * recompute = "auto" under the caps and selective chunks it would choose to fit `room`,
 * into keep and selective ([n_chunks], the rank's chunks written). Whether it fits
 * room (true when room is 0: no bound). */
bool ts_local_plan_rank_memory(const ts_config *cfg, const ts_partition *part,
                               const ts_schedule *s, int pp_rank, double room, int *keep,
                               bool *selective, ts_rank_memory *est);

/* Rank q's recompute per chunk ([n_chunks] each, zeroed here, q's chunks written): the
 * activation sets it would hold without recompute (in_flight), those it holds under
 * cfg's recompute with auto's caps `keep` (or NULL; peak) and the micro-batches it
 * recomputes (recomputed). */
void ts_local_plan_recompute(const ts_config *cfg, const ts_schedule *s, int q,
                             const int *keep, int *in_flight, int *peak, int *recomputed);

/* ZeRO's dp traffic of pipeline rank q per step under cfg (plan/zero.h; ZeRO shards
 * over the dp * cp ranks that hold the same weights, and ZeRO-3 gathers in the compute
 * dtype of the run's kernels): the totals into *t, and per chunk ([n_chunks], q's
 * written) its weight gathers and the bytes it sends. dp * cp = 1: none. */
void ts_local_plan_zero_traffic(const ts_config *cfg, const ts_partition *part,
                                const ts_schedule *s, int q, ts_zero_traffic *t, int *gathers,
                                double *bytes);

#endif
