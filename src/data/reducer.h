/* The gradient reducer (Megatron's DistributedDataParallel and its _ParamAndGradBuffer):
 * the gradient buffer cut into buckets, their overlapped reduction, and the
 * communication thread that can drive it.
 *
 * Buckets are contiguous slices of about parallel.bucket_mb MiB, built from the end of
 * the gradient layout (the last layers' gradients are final first), on parameter
 * boundaries, so a bucket's readiness is a range of layers. Each parameter names the
 * group that reduces it (ts_reducer_args.param_group; today every parameter reduces over
 * the replica group, the dp * cp ranks holding the same weights) and a bucket holds
 * parameters of one group only. As soon as every layer a bucket covers has its final
 * gradients (the engine's chunk_done: its chunk's last backward of the step), its
 * non-blocking reduction starts; later compute makes progress on it; ts_reducer_finish
 * waits for all. Every rank's micro-batches weigh 1/(global batch tokens), so the sum is
 * the gradient of the global mean loss: the reduction sums, nothing divides.
 *
 * Unsharded (ZeRO-0) each bucket is all-reduced and every replica updates every
 * parameter. Sharded (ZeRO-1..3, data/zero.h) each bucket is cut into one piece per
 * member of its group, as evenly as TS_ZERO_ALIGN-float boundaries allow; member r owns
 * piece r of every bucket: the bucket is reduce-scattered, and the reduced piece is
 * placed (moved from the bucket's start, where the in-place reduce-scatter leaves it) in
 * the full buffer or, with ZeRO-2/3, in the compact shard buffer. Each element is
 * reduced and counted in the norm once.
 *
 * The gradients live in segments: one segment over the model's full gradient buffer, or
 * (ZeRO-2/3) one per pipeline chunk of the rank, whose buffer the shard owner brings in
 * and out (no bucket crosses a segment). The group sums (data/group_sum.h) run at the
 * end: after the reduction unsharded (the sums commute), before the group-summed
 * tensors' own buckets sharded. */
#ifndef TS_REDUCER_H
#define TS_REDUCER_H

#include <pthread.h>
#include <stdbool.h>

#include "comm/comm.h"
#include "data/group_sum.h"
#include "model/model.h"
#include "optim/optim.h"
#include "pipeline/engine.h"

/* Steps reduced without overlap first; the last of them times the reference. */
#define TS_GRAD_SYNC_REFERENCE_STEPS 2
/* Sharded pieces start on multiples of this many floats (64 bytes, as parameters do). */
#define TS_ZERO_ALIGN 16

typedef struct {
    size_t begin, end;  /* float offsets into the gradient layout */
    int min_layer, max_layer; /* final once every layer in [min, max] is final */
    bool tied;          /* sharded: a group-summed tensor alone, reduced after its sum */
    const ts_comm *group; /* the group reducing it (the parameters' group) */
    int group_index;    /* into the reducer's groups */
    int segment;        /* the segment holding its gradients */
    int *counts, *displs; /* sharded: [group->size] each member's piece, floats from begin;
                           * unsharded, a bucket holding parameters kept whole: their
                           * owners' pieces (who updates what) */
    bool whole;         /* holds parameters kept whole (ts_reducer_args.whole_cost) */
    int *gcounts, *gdispls; /* whole: [group->size] the floats from each member's first
                             * whole parameter to the end of its last (ZeRO-0's gather) */
    size_t piece_off;   /* sharded: this rank's piece in the compact order of its pieces */
    bool launched;
    ts_request req;
    bool done;          /* thread mode: the communication thread completed it */
    bool placed;        /* sharded: this step's reduced piece is in its place */
    double start_ms, end_ms; /* thread mode: its span, for the trace */
} ts_bucket;

/* Where gradients of layers [l0, l1), floats [begin, end) of the layout, live: `grad`
 * (the model's full buffer, or a chunk buffer while it exists; NULL otherwise), which
 * buckets [b0, b1) tile. */
typedef struct {
    int l0, l1;
    size_t begin, end;
    float *grad;
    int b0, b1;
} ts_grad_segment;

typedef struct {
    /* The group reducing every parameter whose param_group entry is NULL (or all of them
     * when param_group is NULL), and a per-parameter choice ([n_params]). */
    const ts_comm *group;
    const ts_comm *const *param_group;
    const ts_group_sums *sums;   /* held by pointer; NULL: none */
    size_t bucket_bytes;
    bool overlap;                /* parallel.overlap_grad_sync */
    bool sharded;                /* reduce-scatter into pieces (ZeRO-1..3) */
    /* The segments (their l0, l1, begin, end; ascending, tiling the layout); NULL: one
     * over the model's full gradient buffer. */
    int n_segments;
    const ts_grad_segment *segments;
    /* [n_params] or NULL: > 0 keeps the parameter whole in one member's piece, weighing
     * that much (Muon's matrices: ts_muon_ns_cost of the logical shape). With any set,
     * buckets close on tp-invariant sizes (each parameter counted as tensor-parallel part
     * 0's, the same on every tp rank), so every tp (and etp) rank cuts the same buckets
     * and gives each whole parameter the same owner; buckets holding whole parameters are
     * cut owner-aligned (data/owner_cut.h), balancing each group member's cumulative cost
     * in bucket order, sharded or not; the others as without (even cuts). */
    const double *whole_cost;
} ts_reducer_args;

typedef struct {
    ts_model *model;
    const ts_kernels *k;
    const ts_group_sums *sums;
    size_t n_floats;      /* the whole gradient layout */
    bool sharded, overlap;
    int n_segments;
    ts_grad_segment *segments;
    int n_buckets;
    ts_bucket *buckets;
    int n_groups;         /* the distinct groups of the buckets, in bucket order */
    const ts_comm **groups;
    const ts_comm *group; /* args.group: whose rank 0 counts an unsharded norm */
    bool *layer_final;    /* [n_layers]: the layer's gradients are final this step */
    int n_layers;
    /* The ranges of the layout whose reduced gradients this rank holds after finish,
     * ascending: all of [0, n_floats), or sharded its piece of every bucket
     * (n_piece_floats of them). The optimizer updates these. */
    int n_pieces;
    ts_flat_range *pieces;
    size_t n_piece_floats;
    /* With ts_reducer_args.whole_cost: [n_params] the member of the parameter's group
     * whose piece holds it whole, -1 for the others; NULL without. whole_load[g] is
     * group g's members' summed costs ([groups[g]->size] each), the balance the cuts
     * reached. */
    int *whole_owner;
    bool *whole_mine;     /* [n_params] whole_owner is this rank's member of the group */
    double **whole_load;
    /* Sharded: where reduced pieces go. NULL: their place in the segment's buffer; set
     * (ts_reducer_place_into): a compact buffer in piece order (ZeRO-2/3's). */
    float *compact;
    /* Told when finish has placed a segment's pieces (its buffer may go): ZeRO-2/3's. */
    void (*on_drained)(void *ctx, int segment);
    void *on_drained_ctx;
    /* parallel.grad_sync_progress = "thread": a communication thread starts the queued
     * buckets' reductions on its own duplicates of the groups and tests them every few
     * tens of microseconds, so they advance while this thread computes (Open MPI has no
     * asynchronous progress). "poll": the main thread tests them between layers (the
     * model's between_layers) and inside its pipeline waits. */
    bool threaded;
    ts_comm *thread_groups; /* [n_groups] owned duplicates */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *queue;           /* bucket indices in launch order */
    int n_queued, n_started, n_done; /* guarded by mu */
    bool stop;
    /* timing for the dp_overlap and dp_wait_ms metrics */
    double wait_ms;       /* time blocked finishing the reduction this step (not the sums) */
    double reference_ms;  /* a step's reduction time with nothing to hide behind */
    int steps;            /* steps finished */
} ts_reducer;

/* The buckets over model m's gradient layout (the model stays the caller's; groups and
 * sums are held by pointer). With one segment its buffer is m->grad_mem. */
void ts_reducer_init(ts_reducer *r, ts_model *m, const ts_reducer_args *a);
/* Install the reducer in the step: the engine's chunk_done launches buckets as their
 * layers become final; `thread` (parallel.grad_sync_progress = "thread") starts the
 * communication thread (needs MPI's THREAD_MULTIPLE; collective over the groups; a no-op
 * when nothing overlaps), otherwise the model's between_layers tests the running
 * reductions when they overlap. */
ts_status ts_reducer_attach(ts_reducer *r, ts_engine *e, ts_model *m, bool thread);
void ts_reducer_free(ts_reducer *r);

/* Start of a step: no bucket launched, no layer final. */
void ts_reducer_begin(ts_reducer *r);
/* Launch what is left, run the group sums, and wait for everything: then the gradients
 * of `pieces` are final (sharded: placed; segments told on_drained). */
void ts_reducer_finish(ts_reducer *r);
/* Sharded, during the step: reduce what is left of segment s (its buckets in order, as
 * every member does) and place the pieces; its buffer may go afterwards. */
void ts_reducer_drain(ts_reducer *r, int s);
/* Sharded: reduced pieces go to compact (in piece order) instead of the full buffer. */
void ts_reducer_place_into(ts_reducer *r, float *compact);
/* Segment s's gradient buffer from now on (NULL: none; its buckets must be placed). */
void ts_reducer_set_segment_grads(ts_reducer *r, int s, float *grad);
/* Bucket b's gradients (its segment's buffer must exist). */
float *ts_reducer_bucket_grads(const ts_reducer *r, const ts_bucket *b);

/* Whether this rank's gradient sum of squares counts in the global norm: sharded every
 * rank counts its own pieces; otherwise the replicas hold identical gradients and rank 0
 * of the group alone counts them. */
bool ts_reducer_counts_norm(const ts_reducer *r);
/* Whether this rank's piece holds parameter p whole (its group member is p's owner). */
bool ts_reducer_owns_whole(const ts_reducer *r, int p);

/* Fraction of this step's reduction time hidden behind compute (0 without buckets). */
double ts_reducer_overlap(const ts_reducer *r);

#endif
