/* The sharded optimizer state (Megatron's DistributedOptimizer): which ZeRO level runs,
 * what of the weights, gradients and fp32 masters this rank keeps, and how the full
 * weights are brought back when something needs them.
 *
 * The level in effect is parallel.zero with more than one replica (the replica group:
 * dp * cp ranks holding the same weights), else 0. The pieces each rank owns are the
 * reducer's (data/reducer.h): one per bucket, 1/replicas of the floats.
 *  - ZeRO-1: the full weights and gradients stay; the optimizer keeps the AdamW moments
 *    of this rank's pieces and updates only them; ts_zero_gather_params all-gathers the
 *    updated pieces into every replica's weights after the step.
 *  - ZeRO-2: no full-size gradient buffer: each of the rank's pipeline chunks gets its
 *    own while the schedule needs it (pipeline/residency.h: from the chunk's first
 *    backward until its reduction is done), micro-batches accumulate into it, the
 *    reducer reduce-scatters its buckets (its segments are the chunks) and places this
 *    rank's piece of each in a compact shard (1/replicas of the floats), which the
 *    optimizer reads; weights are gathered after the step as with ZeRO-1.
 *  - ZeRO-3: the fp32 master weights are sharded the same way (`master`): a chunk's
 *    weights are all-gathered into a chunk buffer before its residency (its forwards,
 *    its backwards, or both) and freed after it, the next residency's gather issued while
 *    this one computes. Outside a step, ts_zero_materialize gathers every chunk (for
 *    model.init, evaluation and checkpoints); weight initialisation runs a chunk at a
 *    time, so the full weights never exist.
 * The model's layer views (model.h ts_layer_mem) point into the chunk buffers while they
 * exist. ts_zero_attach installs what this needs: the engine's before_action /
 * after_action around each action, the model's between_layers test of ZeRO-3's gathers,
 * and the reducer's on_drained, which frees a chunk's gradients once placed. */
#ifndef TS_DATA_ZERO_H
#define TS_DATA_ZERO_H

#include <stdbool.h>
#include <stdint.h>

#include "comm/comm.h"
#include "data/reducer.h"
#include "model/model.h"
#include "optim/optim.h"
#include "pipeline/engine.h"
#include "pipeline/residency.h"

/* What ZeRO-2/3 need of the pipeline: the rank's chunks and its actions. */
typedef struct {
    const ts_schedule *sched;
    int pp_rank;
    const int *first_layer, *n_chunk_layers; /* [n_chunks] (pipeline/partition.h) */
} ts_zero_layout;

/* ZeRO-2/3: one of the rank's pipeline chunks. Segment i of the reducer is zchunks[i];
 * its gradient buffer, while allocated, is the segment's grad. */
typedef struct {
    int chunk;          /* global chunk index */
    int l0, l1;         /* its layers */
    size_t begin, end;  /* its floats of the rank's layout */
    bool held;          /* holds a group-summed tensor: its gradients wait for the step's end */
    float *weights;     /* ZeRO-3: the gathered fp32 weights while resident */
    void *compute;      /* ZeRO-3: their compute copy (== weights for fp32) */
    bool gathering;     /* ZeRO-3: gathers issued, not yet waited for */
    bool exact;         /* ZeRO-3: gathered as the fp32 masters (not the compute dtype) */
} ts_zero_chunk;

typedef struct {
    ts_model *model;
    const ts_kernels *k;
    ts_reducer *reducer;      /* set by ts_zero_attach */
    int level;                /* the ZeRO level in effect: parallel.zero with replicas, else 0 */
    /* ZeRO-2/3 (level >= 2) */
    int n_zchunks;
    ts_zero_chunk *zchunks;   /* the rank's chunks, ascending */
    ts_grad_segment *segments; /* [n_zchunks] the chunks as the reducer's segments */
    int *zchunk_of;           /* [n_chunks] index into zchunks, or -1 */
    const ts_schedule *sched;
    int pp_rank;
    ts_residency res;         /* when buffers come and go (pipeline/residency.h) */
    size_t n_shard_floats;
    float *shard_grads;       /* [n_shard_floats] the reduced pieces, as the moments */
    float *master;            /* ZeRO-3: [n_shard_floats] the fp32 master weights */
    ts_request *greq;         /* [n_buckets] each bucket's weight gather (ZeRO-1..3) */
    bool materialized;        /* ZeRO-3: every chunk's weights resident outside a step */
    double zbuf_bytes, zbuf_peak; /* chunk buffers allocated now, and the most in a step */
    double gather_ms;         /* time gathering weights this step (ZeRO-1's after it) */
} ts_zero_state;

/* The level and, for ZeRO-2/3, the rank's chunks (zl; may be NULL below level 2), over
 * the replica group of m's parameters. Call before ts_reducer_init, and pass it
 * ts_zero_reducer_args's segments and sharding. */
void ts_zero_init(ts_zero_state *s, ts_model *m, const ts_comm *replica, int zero,
                   const ts_zero_layout *zl);
/* The reducer's arguments this state needs: sharded (level >= 1) and, ZeRO-2/3, the
 * chunks as segments. */
void ts_zero_reducer_args(const ts_zero_state *s, ts_reducer_args *a);
/* Once the reducer is made: the optimizer's state for this rank's pieces (AdamW moments
 * of the whole model, or of its pieces), and with ZeRO-2/3 the compact shard buffers,
 * the model's layer views on its chunks (a full-size gradient buffer the model holds is
 * freed, and with ZeRO-3 its full weights become this rank's master pieces), the engine's
 * and the reducer's hooks. */
void ts_zero_attach(ts_zero_state *s, ts_reducer *r, ts_engine *e, ts_adamw *o);
void ts_zero_free(ts_zero_state *s);
/* The schedule (zl->sched, held by pointer) was rebuilt in place between steps with
 * another number of micro-batches (train.batch_rampup): ZeRO-2/3's residency plan, when
 * each chunk's buffers come and go by action index, is made again for it; the chunks and
 * their placement on the ranks are the same. */
void ts_zero_reschedule(ts_zero_state *s);

/* Random initialisation (ts_model_init_random) of the weights this state holds: with
 * ZeRO-3 one chunk at a time into its buffer, keeping this rank's pieces, so the full
 * weights never exist; otherwise the model's own. */
void ts_zero_init_weights(ts_zero_state *s, uint64_t seed);
/* ZeRO-3 outside a step: every chunk's weights gathered into its buffer, in the compute
 * dtype as a step does (validation), as the exact fp32 masters (checkpoint saves), or
 * allocated only, for a load to fill; and back: with `keep` the buffers' fp32 contents
 * become this rank's master pieces (after a load). No-ops below level 3. Collective over
 * the replica group. */
typedef enum { TS_ZERO_GATHER_COMPUTE, TS_ZERO_GATHER_EXACT, TS_ZERO_ALLOCATE } ts_zero_gather;
void ts_zero_materialize(ts_zero_state *s, ts_zero_gather how);
void ts_zero_dematerialize(ts_zero_state *s, bool keep);

/* Start of a step: its gather time restarts. */
void ts_zero_begin(ts_zero_state *s);
/* ZeRO-1/2, after the optimizer updated this rank's pieces: every replica gets every
 * updated parameter; ZeRO-0 with parameters kept whole (the reducer's whole_cost: Muon's
 * matrices, each updated by its owner alone): every replica gets those. A no-op
 * otherwise (ZeRO-3 gathers each chunk when it is needed). */
void ts_zero_gather_params(ts_zero_state *s);
/* Bytes of the optimizer-side state this rank keeps through the run: the full-size
 * weights (and their compute copy) and gradients it holds, ZeRO-2/3's compact shard
 * gradients and ZeRO-3's master pieces (the moments are the optimizer's). */
double ts_zero_state_bytes(const ts_zero_state *s);

#endif
