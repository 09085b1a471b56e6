/* The simulator's cost table (pipeline/sim.h) and the arrays it points to, as both
 * planners assemble it: `tessera plan` from a config's partition, a measured trace or
 * uniform costs, with links from its options (ts_plan_sim_costs_of_config), and the
 * cluster planner from the cluster's cost model (plan/predict.c). Both give the
 * data-parallel reduction the trainer's buckets through one rule (ts_plan_dp_buckets). */
#ifndef TS_PLAN_SIM_COSTS_H
#define TS_PLAN_SIM_COSTS_H

#include <stdbool.h>

#include "config/config.h"
#include "pipeline/partition.h"
#include "pipeline/sim.h"
#include "plan/trace_costs.h"

typedef struct {
    ts_sim_costs costs;   /* what ts_sim_run takes; its arrays are the ones below */
    double *f, *i, *w;    /* [n_chunks] per micro-batch */
    double *optim;        /* [pp], or NULL: no optimizer step */
    double *dp_bytes;     /* [n_chunks], or NULL: no data-parallel reduction */
    int *dp_pieces;       /* [n_chunks] the reductions each chunk's bytes are cut into */
} ts_plan_sim_costs;

/* n_chunks chunks of zero cost (f, i, w zeroed, for the caller to fill), messages of
 * msg_bytes, free links (the caller sets costs.latency and costs.bandwidth), no
 * optimizer step and no dp reduction. */
void ts_plan_sim_costs_init(ts_plan_sim_costs *s, int n_chunks, double msg_bytes);

/* An optimizer step on every rank: the [pp] array (zeroed) that costs.optim points to,
 * for the caller to fill. */
double *ts_plan_sim_costs_optim(ts_plan_sim_costs *s, int pp);

/* The dp reduction of every chunk c: its gradients, grad_bytes[c] (copied) of layers[c]
 * layers, on a lane of `latency` per reduction and `bandwidth` bytes per time unit.
 * With overlap (parallel.overlap_grad_sync) in the trainer's buckets of bucket_mb MiB
 * (ts_plan_dp_buckets), each ready as the chunk's last backward finishes its layers;
 * without, one reduction per chunk once its last backward ends. */
void ts_plan_sim_costs_dp(ts_plan_sim_costs *s, const double *grad_bytes, const int *layers,
                          int bucket_mb, bool overlap, double latency, double bandwidth);

void ts_plan_sim_costs_free(ts_plan_sim_costs *s);

/* The buckets a chunk's gradient reduction takes: ceil(bytes / bucket_mb MiB), at
 * least one, and at most one per layer (a bucket starts once the layers it covers are
 * final, so finer pieces start no earlier). */
int ts_plan_dp_buckets(double bytes, int layers, int bucket_mb);

/* `tessera plan`'s costs (ms, bytes per ms) for cfg cut as part. */
typedef struct {
    bool uniform;                   /* F = I = W = 1 ms, free links, no dp reduction */
    const ts_trace_costs *traced;   /* chunk costs from a trace; NULL: the partition's
                                       layer costs / (tp * cp), the backward halved into
                                       I, W */
    double latency_us, bandwidth_gbs;       /* P2P (not with uniform) */
    double optim_ms;                        /* > 0: every rank's optimizer step */
    double dp_latency_us, dp_bandwidth_gbs; /* the dp lane (dp > 1, not with uniform) */
} ts_plan_cost_opts;

/* Chunk costs as o says, the message one micro-batch's fp32 activations
 * (micro_batch * seq_len * n_embd * 4 bytes, / cp under context parallelism, / tp under
 * sequence parallelism), the partition's activation bytes, and with dp * cp > 1 each
 * chunk's gradients (ts_memory_chunk_grad_bytes) in cfg's buckets. */
void ts_plan_sim_costs_of_config(ts_plan_sim_costs *s, const ts_config *cfg,
                                 const ts_partition *part, const ts_plan_cost_opts *o);

#endif
