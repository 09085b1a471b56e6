/* The planner's price of one Mixture-of-Experts block's expert phase (model/moe.c) for
 * one micro-batch on one rank: what model_cost.c puts in an MoE block's place of the
 * dense MLP. Everything follows from the config's shapes, the grid and the cluster file;
 * docs/ARCHITECTURE.md's planner section has the same model in prose.
 *
 * Rows. N = micro_batch * seq_len / cp rows per rank. The router and the shared experts
 * run on the MoE's rows, N / tp under sequence parallelism, else all N (replicated over
 * tp: model/moe.c runs the MoE whole on every tp rank). The rows a rank sends to the
 * experts, R: its N / tp share under ep or etp with tp and no sp (moe.c's shares), else
 * the MoE's rows.
 *
 * Compute (GEMMs by the cluster's curve, as the dense blocks'):
 *   router  (Nr, E, C) forward; its input and weight gradients backward;
 *   experts the rank's E/ep local experts, each its F/etp slice, over rows_per_expert =
 *           R * k * etp * ep / E rows when the routing is balanced: per expert gate|up
 *           (rows, 2F/etp, C) and down (rows, C, F/etp), each priced at its own shape
 *           on the curve, times grouped_gemm_efficiency (cluster.h); backward twice;
 *           the whole times `imbalance` (the slowest ep rank's share of the routed rows
 *           over the balanced one; 1 = balanced; with ep = 1 it has no effect: one rank
 *           holds every expert and does all the rows however they are routed);
 *   shared  the shared experts' SwiGLU of width S*F over Nr rows (gate|up, down);
 *   elementwise (memory passes at the cluster's bandwidth, or its elementwise_ns):
 *           the experts' SwiGLU (3 R*k*F, x imbalance) and the shared one (3 Nr*S*F),
 *           the permutation into expert order and back with the weighted combine
 *           (4 R*k*C + R*C), the router's softmax (3 Nr*E fp32); backward twice.
 * The MoE's weight gradients are made in its input-gradient pass (moe.c: a zero-bubble
 * W carries none of them), so all of its backward is I.
 *
 * Communication:
 *   a2a     dispatch and combine each send R*k*C activation-dtype values per rank,
 *           (ep-1)/ep of them leaving it: forward 2 exchanges, backward 2 (the
 *           gradients retrace them). An exchange takes latency + the larger of its
 *           intra-node bytes / (intra bandwidth * a2a_efficiency) and its inter-node
 *           bytes / (inter bandwidth * a2a_efficiency): of the ep - 1 peers, those on the
 *           rank's node (ep_in_node - 1) are reached over NVLink, the rest over the
 *           network (the latency is the inter-node one when any peer is off the node);
 *   hidden  with hide_shared, the shared experts' compute hides the exchanges up to its
 *           own time, forward and backward (Megatron's shared-expert overlap; the trainer
 *           runs them while the exchange travels); an overlapped F/B pair of the schedule
 *           (dualpipe-v) hides more in the simulator (sim.h f_comm);
 *   etp     the etp group gathers its rows (an all-gather of etp * R*k*C values) and
 *           reduce-scatters the partial outputs, forward; the same two backward;
 *           blocking;
 *   tp      with ep or etp, tp > 1 and no sp, the tp group all-gathers the combined
 *           shares ([N, C]) forward and the input gradient's rows ([N, C]) and the
 *           routing weights' gradient ([N, k] fp32) backward: tp communication.
 * One ep group spans etp * ep consecutive ranks at stride etp (expert_grid.c's fold in the
 * tp-cp-dp-pp order); ts_plan_ep_in_node counts its members on one node. */
#ifndef TS_PLAN_MOE_COST_H
#define TS_PLAN_MOE_COST_H

#include <stdbool.h>

#include "config/config.h"
#include "plan/cluster.h"

/* The expert grid and the MoE's options for a layer table (model_cost.h). */
typedef struct {
    int ep, etp;         /* parallel.ep, parallel.etp (1: none) */
    int ep_in_node;      /* the ep group's members on one node, 1..ep (ts_plan_ep_in_node) */
    ts_link etp_link;    /* the etp group's link */
    double imbalance;    /* >= 1: the slowest ep rank's routed rows over the balanced share */
    bool hide_shared;    /* the shared experts' compute hides the exchanges */
} ts_plan_moe;

/* One MoE block's expert phase (seconds; f forward, i input-gradient pass, which holds
 * all of the MoE's backward). */
typedef struct {
    double router_f, router_b;   /* the router's GEMM */
    double experts_f, experts_b; /* the routed experts' GEMMs (x imbalance) */
    double shared_f, shared_b;   /* the shared experts' GEMMs */
    double elem_f, elem_b;       /* elementwise passes */
    double a2a_f, a2a_b;         /* all the ep exchanges */
    double hidden_f, hidden_b;   /* the part of them the shared experts hide */
    double etp_f, etp_b;         /* the etp gathers and reduce-scatters */
    double tp_f, tp_b;           /* the tp group's share gathers */
    double rows_per_expert;      /* balanced */
    double a2a_bytes;            /* one exchange's bytes leaving the rank */
} ts_plan_moe_block;

/* Members of the ep group on one node: the group's ranks are etp * ep consecutive ranks
 * at stride etp, devices_per_node per node. */
int ts_plan_ep_in_node(int ep, int etp, int devices_per_node);

/* One exchange (dispatch or combine) of `bytes` per rank over ep ranks, ep_in_node of
 * them on the rank's node (seconds; 0 for ep = 1). */
double ts_plan_a2a_time(const ts_cluster *cl, double bytes, int ep, int ep_in_node);

/* Price an MoE block of model mc on a rank of N rows (B * T / cp), tp ranks (sp:
 * sequence parallel) on link tp_link, activations of `ab` bytes. */
void ts_plan_moe_block_cost(const ts_model_config *mc, const ts_cluster *cl,
                            const ts_plan_moe *moe, double N, int tp, bool sp, ts_link tp_link,
                            double ab, ts_plan_moe_block *out);

#endif
