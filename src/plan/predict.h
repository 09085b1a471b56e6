/* Predicting one grid on a cluster: partition, schedule, memory per device, and the step
 * through the pipeline simulator (pipeline/sim.h) with the cluster's costs.
 *
 * Links (rank order tp-cp-dp-pp, tp fastest, devices_per_node consecutive ranks per
 * node): the tp group uses the intra-node link when it lies inside a node (tp divides
 * devices_per_node), else the inter-node one; likewise the cp group (tp*cp divides
 * devices_per_node), the dp group (tp*cp*dp) and the pipeline neighbours (the whole
 * grid inside one node). Each device has its own inter-node link (the cluster files'
 * bandwidth is per GPU), so a group crossing nodes is priced at it whatever else
 * crosses.
 *
 * Context parallelism (grid cp; model_cost.h): the layer tables at seq_len / cp rows
 * with each block's blocking K/V all-gather forward and dK/dV reduce-scatter backward on
 * the cp link (the cp_comm term; a fully recomputed forward gathers again), messages of
 * B*T/cp rows; the context-parallel ranks of a replica hold the same weights, so the
 * gradient reduction, ZeRO's shards and its gathers run over dp*cp ranks (Megatron's
 * distributed optimizer), on the link of the dp*cp group (that of the dp group, which
 * spans it in this order). The batch is unchanged: m = global_batch / (dp *
 * micro_batch) micro-batches of micro_batch whole sequences, each split over the cp
 * ranks; MFU counts the model FLOPs once over pp*dp*cp*tp devices.
 *
 * Sequence parallelism (grid sp): the layer tables of that layout and its collectives
 * (model_cost.h), a split schedule's W with the gathers it repeats, messages of B*T/tp
 * rows and the memory rule's boundary buffers likewise (ts_memory_shape.seq_split).
 *
 * Step: each chunk's F, I, W costs are its layers' (model_cost.h), I plus the chunk's
 * forward again for the share of its micro-batches it recomputes (all with recompute =
 * full, (m-1)/m with except_last; with auto what the caps that fit the device's memory
 * recompute: ts_memory_auto_keep_selective, the room being the cluster's memory less the
 * workspace, or parallel.memory_budget_mb when smaller), and the attention core's forward
 * (f_att) once more per micro-batch for each chunk laid out selective (every chunk with
 * recompute = selective; the chunks auto chose selective). Pipeline
 * messages: one micro-batch's activations (bf16 on a bf16 cluster), link latency + bytes
 * / bandwidth. The
 * dp reduction runs on the simulator's dp lane in parallel.bucket_mb buckets: a ring
 * all-reduce of the chunk's fp32 gradients over dp ranks (ZeRO-1: the reduce-scatter
 * half), the ring's 2(dp-1)/dp (ZeRO-1: (dp-1)/dp) byte factor and 2(dp-1) (dp-1)
 * latencies folded into the lane's bandwidth and latency. The optimizer (AdamW over the
 * rank's parameters, 1/dp of them with ZeRO-1) reads and writes 36 bytes per parameter
 * (38 with the bf16 copy) at memory bandwidth; ZeRO-1's parameter all-gather follows
 * it.
 *
 * Mixture of Experts (grid ep, etp; moe_cost.h): each MoE block priced with the expert
 * grid folded over the stage's tp * cp * dp ranks (the ep group etp * ep consecutive ranks
 * at stride etp: its members on a node exchange over the intra-node link, the rest over
 * the inter-node one; the etp group etp consecutive ranks), memory from the trainer's
 * layout of the rank's E/ep experts (each an F/etp slice), the routed experts' floats
 * sharded over edp (ts_memory_shape.edp) and their reduction on the dp lane scaled to a
 * ring over edp, their optimizer shard and ZeRO-1/2 gather over edp. The exchanges' exposed
 * part goes to the simulator as communication an overlapped pair hides (sim.h f_comm),
 * and the bounds (lower_ms, the work floor) leave it out. Terms: router, experts, shared,
 * a2a (hidden, exposed), etp_comm.
 *
 * A cluster with overlap_comm = false (communication progresses on the compute cores:
 * MPI on a CPU) overlaps nothing: each rank's dp reductions (the same buckets and ring
 * costs) run back to back after its last backward, before its optimizer, all of it
 * exposed; a pipeline message is charged to the sending chunk's F (activations on) or I
 * (gradient back) and arrives when that ends. No simulator change: the reduction goes
 * into the rank's optimizer time, the message into the chunk costs. */
#ifndef TS_PLAN_PREDICT_H
#define TS_PLAN_PREDICT_H

#include <stdbool.h>

#include "config/config.h"
#include "pipeline/sim.h"
#include "plan/cluster.h"
#include "plan/model_cost.h"
#include "plan/zero.h"

typedef struct {
    int pp, dp, tp, v, micro_batch, m;
    int schedule;   /* ts_schedule_kind, or -1: the config's CSV schedule */
    int recompute;  /* ts_recompute */
    int zero;
    int sp;         /* 1: parallel.sequence_parallel (tp > 1, seq_len % tp == 0); an int,
                       not a bool, as grids are compared with memcmp (no padding) */
    int sub;        /* parallel.tp_overlap's sub-batches (0 or 1: none); the config's: the
                       search does not vary it */
    int cp;         /* parallel.cp: context-parallel ranks per sequence (0 reads as 1; the
                       search and ts_plan_grid_of write 1) */
    int ep, etp;    /* parallel.ep, parallel.etp: the expert grid folded over a stage's
                       tp * cp * dp ranks (0 reads as 1; an MoE model only) */
} ts_plan_grid;

/* A grid's context parallelism (1 for 0), and the ranks its gradients are reduced and
 * ZeRO-sharded over: dp * cp. */
static inline int ts_plan_grid_cp(const ts_plan_grid *g) { return g->cp > 1 ? g->cp : 1; }
static inline int ts_plan_grad_ranks(const ts_plan_grid *g) { return g->dp * ts_plan_grid_cp(g); }
/* A grid's ep and etp (1 for 0), and edp, the ranks an expert's gradient reduces and its
 * ZeRO state shards over: tp * cp * dp / (ep * etp) (topology/expert_grid.h). */
static inline int ts_plan_grid_ep(const ts_plan_grid *g) { return g->ep > 1 ? g->ep : 1; }
static inline int ts_plan_grid_etp(const ts_plan_grid *g) { return g->etp > 1 ? g->etp : 1; }
static inline int ts_plan_grid_edp(const ts_plan_grid *g)
{
    return g->tp * ts_plan_grad_ranks(g) / (ts_plan_grid_ep(g) * ts_plan_grid_etp(g));
}

/* Where the time of the busiest pipeline rank goes (ms per step). */
typedef struct {
    double compute;     /* GEMMs and elementwise work, forward and backward */
    double recompute;   /* the forwards rerun by activation recompute */
    double tp_comm;     /* tensor-parallel all-reduces (sequence parallelism: all-gathers
                           and reduce-scatters) */
    double cp_comm;     /* context parallelism's K/V all-gathers and dK/dV reduce-scatters
                           (blocking), recomputed forwards' gathers in recompute */
    double optimizer;   /* AdamW (and ZeRO-1's parameter all-gather); under Muon also
                           its momentum, Newton-Schulz and gathers (muon_cost.h) */
    double muon_ns;     /* of optimizer, Muon's Newton-Schulz GEMMs on the busiest owner */
    double muon_gather; /* of optimizer, its tp (etp) gathers of split matrices */
    double muon_ns_flops; /* (not ms) the busiest owner's Newton-Schulz FLOPs per step */
    double bubble;      /* idle: step less the busiest rank's work */
    double dp_exposed;  /* the dp reduction the step waits for */
    double dp_reduction;/* the dp lane's busy time (mostly hidden) */
    double pp_comm;     /* one pipeline message's transfer time */
    double dp_gather;   /* ZeRO-3: the weight gathers' time on the busiest link */
    double gather_exposed; /* ZeRO-3: what the gathers lengthen the step by */
    /* Mixture of Experts (model_cost.h, moe_cost.h), the busiest rank's, part of the
     * terms above (compute holds the GEMMs, tp_comm the share gathers): */
    double router, experts, shared; /* GEMMs of the router, routed (x imbalance), shared experts */
    double a2a;         /* every ep exchange, forward and backward (recomputed forwards'
                           not counted) */
    double a2a_hidden;  /* of it, hidden: under the shared experts' compute and, in the
                           simulator, under an overlapped pair's partner */
    double a2a_exposed; /* a2a - a2a_hidden: in the step's busy time, not in compute */
    double etp_comm;    /* the etp gathers and reduce-scatters (blocking; not in compute) */
    double rows_per_expert; /* (not ms) an MoE block's rows per local expert, balanced */
    double a2a_bytes;       /* (not ms) one exchange's bytes leaving a rank, per block and
                               micro-batch */
} ts_plan_terms;

typedef struct {
    ts_plan_grid g;
    ts_rank_memory mem;      /* the fullest pipeline rank */
    int mem_rank;
    bool fits;
    bool simulated;          /* step from the simulator (else only the bound below) */
    double lower_ms;         /* a lower bound of the step: max over ranks of (the first
                                micro-batch's arrival + the rank's work + optimizer) */
    double step_ms, bubble, tokens_per_s, mfu;
    ts_plan_terms terms;
} ts_plan_result;

/* A planning context: model and run config, cluster, and caches of layer costs,
 * partitions and schedules shared by the grids one search predicts. */
typedef struct ts_plan_ctx ts_plan_ctx;

/* cfg: the model, train.global_batch, parallel.bucket_mb / overlap_grad_sync /
 * partition (an explicit list applies to its own pp * v), train.threads (0 = 1),
 * checkpoint.async. The cluster is copied. */
ts_plan_ctx *ts_plan_ctx_new(const ts_config *cfg, const ts_cluster *cl);
/* An MoE model's options (moe_cost.h; before the first prediction): the load imbalance
 * (>= 1; default 1, balanced) and whether the shared experts' compute hides the
 * exchanges (default true). */
void ts_plan_ctx_set_moe(ts_plan_ctx *x, double imbalance, bool hide_shared);
/* Packed documents (data.document_mask; before the first prediction): documents of
 * doc_len tokens fill every window from its start, so attention's time is the table's
 * kernels' over the documents (model_cost.h) and MFU counts the pairs they attend
 * (ts_plan_model_flops_docs); 0 (the default): no documents. */
void ts_plan_ctx_set_documents(ts_plan_ctx *x, int doc_len);
void ts_plan_ctx_free(ts_plan_ctx *x);
const ts_cluster *ts_plan_ctx_cluster(const ts_plan_ctx *x);
const ts_config *ts_plan_ctx_config(const ts_plan_ctx *x);

/* Memory and the step's lower bound; fails (with a message) when the schedule cannot
 * run this shape. */
ts_status ts_plan_estimate(ts_plan_ctx *x, const ts_plan_grid *g, ts_plan_result *r);

/* A lower bound of the fullest pipeline rank's memory (bytes) without cutting the
 * model: 1/pp of all parameter, gradient and optimizer bytes and of one micro-batch's
 * activation sets of the whole model, plus the workspace. The search skips grids whose
 * bound does not fit before it partitions them. */
double ts_plan_memory_floor(ts_plan_ctx *x, const ts_plan_grid *g);

/* A lower bound of the memory (bytes, the fullest rank's mem.total) of every candidate
 * of grid g's shape (pp, dp, cp, tp, sp, micro_batch, m, ep, etp), whatever its schedule,
 * v, cut, recompute and ZeRO level (predict.c proves it). The search counts a shape's
 * candidates out of memory without estimating them when it exceeds the device. */
double ts_plan_shape_memory_floor(ts_plan_ctx *x, const ts_plan_grid *g);

/* Whether ts_plan_estimate accepts g (the model can be cut so, the schedule runs it). */
bool ts_plan_grid_runs(ts_plan_ctx *x, const ts_plan_grid *g);

/* A lower bound of any step of grid g's shape (pp, dp, cp, tp, sp, micro_batch, m),
 * whatever its schedule, v, recompute and ZeRO (ms): the layers' forward, input- and
 * weight-gradient time of m micro-batches spread evenly over the pp ranks (the busiest
 * rank does at least that, recompute and the bubble only add). Cut-free and cheap: the
 * search skips a context-parallel shape whose floor exceeds the K-th best step. */
double ts_plan_work_floor(ts_plan_ctx *x, const ts_plan_grid *g);

/* ts_plan_estimate, then the simulated step. With `keep` the simulator's result is
 * returned too (caller frees with ts_sim_result_free). */
ts_status ts_plan_predict(ts_plan_ctx *x, const ts_plan_grid *g, ts_plan_result *r,
                          ts_sim_result *keep);

/* The simulated step of r->g, into r, a result ts_plan_estimate filled (and returned
 * TS_OK for) with this context; keep as for ts_plan_predict. The search estimates every
 * grid and simulates only the promising ones, without estimating them again. */
ts_status ts_plan_simulate(ts_plan_ctx *x, ts_plan_result *r, ts_sim_result *keep);

/* The memory of pipeline rank q (0 <= q < pp) of a grid ts_plan_estimate accepted. */
void ts_plan_rank_memory_of(ts_plan_ctx *x, const ts_plan_grid *g, int q, ts_rank_memory *m);

/* The placement of a grid ts_plan_estimate accepted: the pipeline rank of each chunk
 * [pp*v] (valid until ctx is freed). */
const int *ts_plan_chunk_rank(ts_plan_ctx *x, const ts_plan_grid *g);

/* ZeRO's dp traffic per step of pipeline rank q of a grid ts_plan_estimate accepted
 * (plan/zero.h), and per chunk ([pp*v], q's written; each may be NULL) its weight
 * gathers and the bytes its gathers and reduction send. */
void ts_plan_zero_of(ts_plan_ctx *x, const ts_plan_grid *g, int q, ts_zero_traffic *t,
                     int *gathers, double *chunk_bytes);

/* What a grid ts_plan_estimate accepted recomputes, per chunk [pp*v]: recompute =
 * "auto"'s caps into keep (untouched for another mode; may be NULL), the chunks auto made
 * selective into selective (false for every chunk under another mode; may be NULL) and
 * the recomputed micro-batches into n_recomputed (may be NULL). */
void ts_plan_recompute_of(ts_plan_ctx *x, const ts_plan_grid *g, int *keep, bool *selective,
                          int *n_recomputed);

/* The cut the prediction uses: layers per chunk [pp*v] (valid until ctx is freed). */
const int *ts_plan_partition(ts_plan_ctx *x, const ts_plan_grid *g);

/* The grid of a config (its own schedule may be a CSV: schedule = -1). */
void ts_plan_grid_of(const ts_config *cfg, ts_plan_grid *g);
const char *ts_plan_schedule_name(const ts_plan_ctx *x, int schedule);

/* The links of a grid. */
ts_link ts_plan_tp_link(const ts_cluster *cl, const ts_plan_grid *g);
ts_link ts_plan_cp_link(const ts_cluster *cl, const ts_plan_grid *g);
ts_link ts_plan_dp_link(const ts_cluster *cl, const ts_plan_grid *g);
ts_link ts_plan_pp_link(const ts_cluster *cl, const ts_plan_grid *g);
/* The etp group's (etp consecutive ranks), and the ep group's members on one node. */
ts_link ts_plan_etp_link(const ts_cluster *cl, const ts_plan_grid *g);
int ts_plan_ep_node_members(const ts_cluster *cl, const ts_plan_grid *g);

#endif
