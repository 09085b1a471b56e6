/* The planner's price of Muon (train.optimizer = "muon"; optim/muon.h): what its
 * matrices add to the optimizer step and what they hold instead of AdamW's moments.
 *
 * Newton-Schulz. A Muon matrix of logical shape [rows, cols] (the Hugging Face tensor,
 * never a tp shard) is orthogonalised as X [s, l], s = min(rows, cols), l = max (torch
 * transposes when rows > cols). Each of ns_steps iterations is three GEMMs:
 *   A = X X^T     (m, n, k) = (s, s, l): 2 s^2 l FLOPs
 *   A A           (s, s, s):             2 s^3
 *   (b A + c A A) X  (s, l, s):          2 s^2 l
 * so ns_steps * (4 s^2 l + 2 s^3) = 2 ns_steps s^2 (2l + s) FLOPs a matrix (twice
 * ts_muon_ns_cost's weight per iteration), each GEMM priced as the layers' are (the
 * cluster's GEMM peak at the efficiency its size reaches: under bf16 the NS GEMMs run in
 * bf16 as the trainer runs them). The elementwise combinations (s^2 and s l values per
 * iteration, under 1/s of the GEMM work) and the Frobenius normalisation are not priced.
 *
 * Ownership (MUON_DESIGN, Megatron's layer-wise optimizer): every Muon matrix is
 * orthogonalised by one member of its reduction group: the dp * cp ranks holding the
 * same weights, the routed experts' edp under an expert grid. The busiest member does
 * dense / R + experts / edp of the work, never less than the largest matrix's (a matrix
 * is not split): ts_plan_muon_owner_share. The same share of the matrices' floats is the
 * momentum it holds and the momentum/update passes it makes.
 *
 * Tensor parallelism (Megatron's "duplicated" mode): a matrix split over tp (experts:
 * etp) is all-gathered over the group before the iteration, each of the owner's tp ranks
 * then orthogonalises the whole matrix (the FLOPs are not divided by tp) and keeps its
 * slice. A tp rank receives the logical matrix less its own part, fp32: (tp-1)/tp of it
 * for an even split, ts_plan_allgather_time on the group's link. A tp-replicated matrix
 * (MLA's trunk, the router) is not gathered.
 *
 * ZeRO-0 (gradients all-reduced, every rank holds every parameter): after the owners'
 * update an all-gather of the Muon matrices over the reduction group brings them back,
 * (R-1)/R of their fp32 floats (zero.h); ZeRO-1/2's existing parameter all-gather already
 * moves them, ZeRO-3 gathers at the next step as for every parameter. */
#ifndef TS_PLAN_MUON_COST_H
#define TS_PLAN_MUON_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "plan/cluster.h"

/* A sum over Muon matrices (a layer's, a chunk's, a rank's). "x" fields are the routed
 * experts' part (owned over edp; 0 without an expert grid, where experts count as dense). */
typedef struct {
    double floats, xfloats;     /* the matrices' floats as this rank lays them out (its tp
                                   shards, padded as the layout pads) */
    double flops, xflops;       /* Newton-Schulz FLOPs of one step, whole logical matrices */
    double time, xtime;         /* the same priced as GEMMs (seconds) */
    double gather, xgather;     /* the tp (etp) all-gathers of the split ones (seconds) */
    double gather_bytes, xgather_bytes; /* what this tp rank receives in them (fp32) */
    double max_floats, max_flops, max_time; /* the largest matrix's (ownership's floor) */
    /* Muon's buffers (pipeline/memory.h muon_buffer_bytes): the largest logical matrix
     * (elements), the largest iteration scratch (bytes), of the split ones the largest
     * logical matrix and the largest shard (elements) */
    double max_logical, max_scratch, max_split_logical, max_split_local;
    int matrices;
} ts_plan_muon;

/* One matrix's Newton-Schulz FLOPs and GEMM time per step (0 steps: 0). */
double ts_plan_muon_ns_flops(double rows, double cols, int ns_steps);
double ts_plan_muon_ns_time(const ts_cluster *cl, double rows, double cols, int ns_steps);

/* Add one Muon matrix of logical [rows, cols] of which this rank holds local_numel
 * elements, local_floats as laid out (padded); group: the ranks it is split over (its tp
 * or etp group; 1 for a whole or replicated matrix: no gather), their link; expert: a
 * routed expert's under an expert grid. */
void ts_plan_muon_add(ts_plan_muon *acc, const ts_cluster *cl, int ns_steps, double rows,
                      double cols, double local_numel, double local_floats, int group,
                      ts_link link, bool expert);
/* acc += b (sums; the largest-matrix fields take the larger). */
void ts_plan_muon_sum(ts_plan_muon *acc, const ts_plan_muon *b);

/* The busiest owner's share of a sum split dense / experts: dense / ranks + experts /
 * edp, no less than `largest` (one matrix is never split); ranks, edp >= 1. */
double ts_plan_muon_owner_share(double dense, double experts, double largest, int ranks,
                                int edp);

/* Every layer's Muon matrices ([mc->n_layer + 2], calloc'ed; free()) as the model lays
 * them out on tp rank 0 of tp (ep rank 0 of an expert grid ep x etp: its E/ep experts, each
 * an F/etp slice), ts_param_is_muon's choice, ns_steps iterations each; the tp group on
 * tp_link, the etp group on etp_link. Sequence and context parallelism change no
 * parameter. */
ts_plan_muon *ts_plan_muon_layers(const ts_model_config *mc, const ts_cluster *cl,
                                  const ts_kernels *k, int tp, int ep, int etp, int ns_steps,
                                  ts_link tp_link, ts_link etp_link);

#endif
