/* Muon over the data-parallel group (Megatron's layer-wise distributed optimizer,
 * torchtitan's Muon ownership): each Muon matrix (optim/muon.h) is owned by one member of
 * its reduction group (the replica group; an expert's: edp), the same member on every tp
 * (etp) rank, as the reducer's owner-aligned cuts say (data/reducer.h whole_cost: each
 * matrix weighs ts_muon_ns_cost of its logical shape, and the cuts balance the members'
 * summed costs). The owner's piece holds the matrix's reduced gradient whole (ZeRO-1's
 * full buffer, ZeRO-2/3's compact shard; ZeRO-0: every replica's full buffer) and its
 * fp32 weights (ZeRO-3: the compact masters); the owner runs the momentum, the
 * Newton-Schulz iteration and the update there, and the gathers bring the weights to the
 * other replicas (data/zero.h: ZeRO-1/2 every piece, ZeRO-3 each chunk when needed, ZeRO-0
 * the members' extents of whole matrices).
 *
 * Under tensor parallelism a matrix split over tp (an expert's over etp) is Megatron's
 * "duplicated" mode: the owner's tp ranks each update their shard's momentum, all-gather
 * the Nesterov updates into the logical matrix (tensor/logical_gather.h), each runs the
 * iteration on the whole and keeps its own slice. Not the "distributed" mode (each rank
 * multiplies its shard and the [s, s] Gram matrices X X^T are all-reduced every step):
 * that is 2 * ns_steps all-reduces of latency per matrix against one gather, and the
 * owner-aligned cuts already spread the iterations over the replicas. Matrices replicated
 * over tp (the router, MLA's trunk) need no gather: each tp rank runs the iteration on
 * its copy (the same bits). */
#ifndef TS_DATA_MUON_DIST_H
#define TS_DATA_MUON_DIST_H

#include "comm/comm.h"
#include "data/reducer.h"
#include "data/zero.h"
#include "model/model.h"
#include "optim/muon.h"

/* [m->n_params]: ts_muon_ns_cost of each Muon matrix's logical shape, 0 for the other
 * parameters (ts_reducer_args.whole_cost; the caller frees). */
double *ts_muon_whole_costs(const ts_model *m);

typedef struct {
    ts_muon *muon;          /* the owned matrices' state (not owned) */
    float **grads, **params; /* [muon->n] each one's reduced gradient and fp32 weights */
    const ts_comm **split;  /* [muon->n] the group it is split over, NULL: whole here */
    float *stage, *local;   /* device: the split matrices' shards, gathered; one shard */
} ts_muon_dist;

/* The matrices this rank owns by r's cuts (every one without a reduction), their state
 * in *o (ts_muon_init) and where z keeps their gradients and weights; tp and etp the
 * groups dense and expert matrices are split over. After ts_zero_attach. */
void ts_muon_dist_init(ts_muon_dist *d, ts_muon *o, const ts_model *m, const ts_train_config *tc,
                       const ts_reducer *r, const ts_zero_state *z, const ts_comm *tp,
                       const ts_comm *etp);
void ts_muon_dist_free(ts_muon_dist *d);
/* One Muon step on the owned matrices (collective over the tp / etp groups of split
 * ones, in parameter order on every member); returns the sum of the squared changes of
 * the counted floats (ts_muon_step's). */
double ts_muon_dist_step(ts_muon_dist *d, const ts_model *m, const ts_train_config *tc, double lr,
                         float grad_scale);

#endif
