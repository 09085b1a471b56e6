/* Data-parallel gradient synchronisation. The gradient buffer is cut into buckets:
 * contiguous slices of about parallel.bucket_mb MiB, built from the end of the buffer
 * (the last layers' gradients are final first). As soon as every layer a bucket covers
 * has its final gradients (its chunk's last backward of the step), its non-blocking
 * reduction starts; later compute makes progress on it; the optimizer waits for all.
 * Every rank's micro-batches weigh 1/(global batch tokens), so the sum over the dp group
 * is the gradient of the global mean loss: the reduction sums, nothing divides.
 *
 * Without ZeRO each bucket is all-reduced, and every dp replica updates every parameter.
 * With ZeRO-1 (parallel.zero = 1, Megatron's distributed optimizer) each bucket is cut
 * into dp pieces, as evenly as 16-float boundaries allow; dp rank r owns piece r of
 * every bucket (`shard`): the bucket is reduce-scattered, so rank r gets the summed
 * gradient of its pieces only, its optimizer keeps the AdamW moments of those pieces and
 * updates only them, and ts_grad_sync_gather_params all-gathers the updated pieces into
 * every replica's parameters. Each element is reduced and counted in the norm once.
 *
 * The tied embedding (pp > 1: wte on the first stage, its copy on the last) has its
 * gradient summed over the embedding group here too. Without ZeRO that sum follows the
 * dp all-reduce (the sums commute). With ZeRO-1 it must come first, because the two
 * stages' buffers are laid out differently and their pieces of wte would not line up:
 * wte gets a bucket of its own, reduce-scattered at the end of the step after the
 * embedding-group sum; the other buckets overlap as usual. Identical tied gradients in
 * identically cut buckets make the two stages' pieces, moments and updates identical.
 *
 * Llama's key/value projections replicated on kv_replicas tensor-parallel ranks (tp >
 * n_kv_head) are summed the same way over the `kv` group (the tp ranks holding the same
 * key/value head): each replica computed its query heads' part of the gradient. Every
 * such sum (the tied embedding's, the key/value weights') is a `group sum`.
 *
 * ZeRO-2 (parallel.zero = 2) keeps no full-size gradient buffer: each of the rank's
 * pipeline chunks gets its own while the schedule needs it (pipeline/residency.h: from
 * the chunk's first backward until its reduction is done), micro-batches accumulate into
 * it, its buckets (cut at chunk boundaries) are reduce-scattered as they become final,
 * and the rank's piece of each goes to a compact shard (`shard_grads`, 1/dp of the
 * floats), which the optimizer reads; parameters are all-gathered after the step as with
 * ZeRO-1. ZeRO-3 (parallel.zero = 3) shards the fp32 master weights the same way
 * (`master`): a chunk's weights are all-gathered into a chunk buffer before its
 * residency (its forwards, its backwards, or both) and freed after it, the next
 * residency's gather issued while this one computes. The engine calls
 * ts_grad_sync_before_action / _after_action around each action; the model's layer views
 * (model.h ts_layer_mem) point into the chunk buffers while they exist. */
#ifndef TS_GRAD_SYNC_H
#define TS_GRAD_SYNC_H

#include <pthread.h>
#include <stdbool.h>

#include "comm/comm.h"
#include "model/model.h"
#include "optim/optim.h"
#include "pipeline/residency.h"

/* Steps synchronised without overlap first; the last of them times the reference. */
#define TS_GRAD_SYNC_REFERENCE_STEPS 2
/* ZeRO-1 pieces start on multiples of this many floats (64 bytes, as parameters do). */
#define TS_ZERO_ALIGN 16

typedef struct {
    size_t begin, end;  /* float offsets into the gradient buffer */
    int min_layer, max_layer; /* final once every layer in [min, max] is final */
    bool tied;          /* ZeRO-1: a group-summed tensor alone, reduced after its group sum */
    int *counts, *displs; /* ZeRO-1: [dp] each dp rank's piece, floats from begin */
    bool launched;
    ts_request req;
    bool done;          /* thread mode: the communication thread completed it */
    double start_ms, end_ms; /* thread mode: its span, for the trace */
    /* ZeRO-2/3 */
    int zchunk;         /* index into zchunks */
    size_t shard_off;   /* this rank's piece in shard_grads (and master) */
    bool placed;        /* the reduced piece was copied there this step */
    ts_request greq;    /* ZeRO-3: the gather of its weights */
} ts_bucket;

/* ZeRO-2/3: one of the rank's pipeline chunks. */
typedef struct {
    int chunk;          /* global chunk index */
    int l0, l1;         /* its layers */
    size_t begin, end;  /* its floats of the rank's layout */
    int b0, b1;         /* its buckets [b0, b1) */
    bool held;          /* holds a group-summed tensor: its gradients wait for the step's end */
    float *grad;        /* its gradient buffer while allocated */
    float *weights;     /* ZeRO-3: the gathered fp32 weights while resident */
    void *compute;      /* ZeRO-3: their compute copy (== weights for fp32) */
    bool gathering;     /* ZeRO-3: gathers issued, not yet waited for */
    bool exact;         /* ZeRO-3: gathered as the fp32 masters (not the compute dtype) */
} ts_zero_chunk;

/* What ZeRO-2/3 need of the pipeline: the rank's chunks and its actions. */
typedef struct {
    const ts_schedule *sched;
    int pp_rank;
    const int *first_layer, *n_chunk_layers; /* [n_chunks] (pipeline/partition.h) */
} ts_zero_layout;

typedef struct {
    /* The topology's groups (topology/topology.h ts_groups), held by pointer: replica
     * (the dp * cp ranks holding the same weights) reduces and shards the gradients;
     * embed and kv carry the group sums below. */
    const ts_comm *replica, *embed, *kv;
    ts_model *model;
    float *grads, *params; /* device memory of k (full-size; NULL where ZeRO-2/3 drop them) */
    const ts_kernels *k;
    size_t n_floats;      /* the whole gradient buffer */
    bool sharded;         /* ZeRO-1..3 with dp > 1: reduce-scatter, update a shard */
    int level;            /* the ZeRO level in effect: parallel.zero with dp > 1, else 0 */
    /* ZeRO-2/3 (level >= 2) */
    int n_zchunks;
    ts_zero_chunk *zchunks;   /* the rank's chunks, ascending */
    int *zchunk_of;           /* [n_chunks] index into zchunks, or -1 */
    ts_residency res;         /* when buffers come and go (pipeline/residency.h) */
    size_t n_shard_floats;
    float *shard_grads;       /* [n_shard_floats] the reduced pieces, as the moments */
    float *master;            /* ZeRO-3: [n_shard_floats] the fp32 master weights */
    bool materialized;        /* ZeRO-3: every chunk's weights resident outside a step */
    double zbuf_bytes, zbuf_peak; /* chunk buffers allocated now, and the most in a step */
    /* The gradients summed over a group before the optimizer: the tied embedding (or its
     * copy) over `embed`, replicated key/value weights over `kv`. */
    int n_sums;
    struct ts_group_sum {
        int param;
        size_t offset, numel;  /* its floats in the gradient buffer */
        const ts_comm *group;  /* g->embed or g->kv */
    } *sums;
    int n_buckets;
    ts_bucket *buckets;
    bool *layer_final;    /* [n_layers]: the layer's gradients are final this step */
    int n_layers;
    bool overlap;
    /* The ranges of the flat buffers this rank's optimizer updates, ascending: all of
     * [0, n_floats), or with ZeRO-1 its piece of every bucket. */
    int n_shard;
    ts_flat_range *shard;
    /* parallel.grad_sync_progress = "thread": a communication thread starts the
     * queued buckets' reductions on its own duplicate of the replica group and tests them
     * every few tens of microseconds, so they advance while this thread computes (Open
     * MPI has no asynchronous progress). "poll": the main thread tests them between
     * layers (ts_grad_sync_poll) and inside its pipeline waits. */
    bool threaded;
    ts_comm replica_thread; /* owned: ts_comm_dup of *replica */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int *queue;           /* bucket indices in launch order */
    int n_queued, n_started, n_done; /* guarded by mu */
    bool stop;
    /* timing for the dp_overlap and dp_wait_ms metrics */
    double wait_ms;       /* time blocked in ts_grad_sync_finish this step (not the tied sum) */
    double gather_ms;     /* time in ts_grad_sync_gather_params this step (ZeRO-1) */
    double reference_ms;  /* a step's reduction time with nothing to hide behind */
    int steps;            /* steps finished */
} ts_grad_sync;

/* replica: the ranks holding the same weights (the topology's replica group: dp * cp of
 * them); embed: the embedding group (a non-member or a group of one when pp == 1); kv:
 * the tp ranks holding the same key/value heads. The three are held by pointer and must
 * outlive the state. zero: parallel.zero (0..3); zl: the pipeline's chunks and actions
 * (needed for zero >= 2, else may be NULL). The model stays the caller's; with zero >= 2
 * the state takes over its layer views (ts_grad_sync_shard_model). */
void ts_grad_sync_init(ts_grad_sync *g, ts_model *m, const ts_comm *replica, const ts_comm *embed,
                       const ts_comm *kv, size_t bucket_bytes, bool overlap, int zero,
                       const ts_zero_layout *zl);
/* ZeRO-2/3, once the optimizer is made: the compact shard buffers, and the model's layer
 * views on its chunks; a full-size gradient buffer the model holds is freed, and with
 * ZeRO-3 full weights it holds become this rank's pieces (then freed). The optimizer
 * steps the compact shard from then on. A no-op below level 2. */
void ts_grad_sync_shard_model(ts_grad_sync *g, ts_adamw *o);
/* Random initialisation (ts_model_init_random) of the weights this state holds: with
 * ZeRO-3 one chunk at a time into its buffer, keeping this rank's pieces, so the full
 * weights never exist; otherwise the model's own. */
void ts_grad_sync_init_weights(ts_grad_sync *g, uint64_t seed);
/* The engine's hooks around action i of the rank's list (ZeRO-2/3: free and allocate
 * gradient buffers, issue, wait for and free weight gathers; no-ops below level 2). */
void ts_grad_sync_before_action(void *g, int i);
void ts_grad_sync_after_action(void *g, int i);
/* ZeRO-3 outside a step: every chunk's weights gathered into its buffer, in the compute
 * dtype as a step does (validation), as the exact fp32 masters (checkpoint saves), or
 * allocated only, for a load to fill; and back: with `keep` the buffers' fp32 contents
 * become this rank's master pieces (after a load). No-ops below level 3. Collective over
 * the dp group. */
typedef enum { TS_ZERO_GATHER_COMPUTE, TS_ZERO_GATHER_EXACT, TS_ZERO_ALLOCATE } ts_zero_gather;
void ts_grad_sync_materialize(ts_grad_sync *g, ts_zero_gather how);
void ts_grad_sync_dematerialize(ts_grad_sync *g, bool keep);
void ts_grad_sync_free(ts_grad_sync *g);
/* Drive the overlapped reductions from a communication thread (needs MPI's
 * THREAD_MULTIPLE; collective over the dp group). A no-op when nothing overlaps. */
ts_status ts_grad_sync_use_thread(ts_grad_sync *g);
/* Poll mode: test the running reductions (the model calls this between layers). */
void ts_grad_sync_poll(void *g);

/* Start of a step: no bucket launched. */
void ts_grad_sync_begin(ts_grad_sync *g);
/* The gradients of layers [first, end) are final for this step: launch the buckets that
 * are now complete (when overlapping) and make progress on the running ones. */
void ts_grad_sync_layers_done(ts_grad_sync *g, int first, int end);
/* Launch what is left, sum the tied embedding over the embedding group, and wait for
 * everything: then the gradients of `shard` are final (with ZeRO-1 only those). */
void ts_grad_sync_finish(ts_grad_sync *g);
/* The optimizer state for what this rank updates: AdamW moments for the whole model, or
 * with ZeRO-1 for its `shard` only (the optimizer is told it is sharded). */
void ts_grad_sync_init_optimizer(const ts_grad_sync *g, const ts_model *m, ts_adamw *o);
/* Whether this rank's gradient sum of squares counts in the global norm: with ZeRO-1
 * every dp rank counts its own shard; otherwise the dp replicas hold identical
 * gradients and dp rank 0 alone counts them. */
bool ts_grad_sync_counts_norm(const ts_grad_sync *g);
/* ZeRO-1, after the optimizer updated `shard`: every replica gets every updated
 * parameter. A no-op without ZeRO-1. */
void ts_grad_sync_gather_params(ts_grad_sync *g);
/* Bytes of the optimizer-side state this rank keeps through the run: the full-size
 * weights (and their compute copy) and gradients it holds, ZeRO-2/3's compact shard
 * gradients and ZeRO-3's master pieces (the moments are the optimizer's). */
double ts_grad_sync_state_bytes(const ts_grad_sync *g);
/* Fraction of this step's reduction time hidden behind compute (0 when dp == 1). */
double ts_grad_sync_overlap(const ts_grad_sync *g);

#endif
