/* What one rank of a run will allocate, estimated from the config, the partition and
 * the schedule before anything is allocated, and the check against what the machine
 * offers (physical memory shared by the node's ranks, and this process's RLIMIT_AS).
 * `tessera train` refuses a run that cannot fit with the numbers; `tessera plan`
 * prints the same estimate per pipeline rank. */
#ifndef TS_PIPELINE_MEMORY_H
#define TS_PIPELINE_MEMORY_H

#include <stdbool.h>

#include "config/config.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "core/sysmem.h"

typedef struct {
    double params, grads, optimizer; /* bytes: weights, gradients, the two AdamW moments */
    double activations;  /* saved activations at the schedule's peak, zero-bubble stashes */
    double buffers;      /* pipeline transfer buffers, backward scratch, token ids */
    double blas;         /* OpenBLAS's per-thread GEMM buffers (address space) */
    double total;
    double act_sets;     /* of `activations`, the saved tensors alone (no token ids, no
                            stashes): what the trainer's activation_mb reports */
} ts_rank_memory;

/* The estimate for pipeline rank `pp_rank` (every tensor-parallel and data-parallel
 * rank of it holds the same), running `threads` BLAS threads: the model's own layout of
 * the rank's layers (nothing allocated) into ts_memory_rank. */
void ts_memory_estimate(const ts_config *cfg, const ts_partition *part,
                        const ts_schedule *sched, int pp_rank, int threads,
                        ts_rank_memory *est);

/* What a rank's memory follows from beyond its layers: the run's shape. The trainer
 * takes it from its config and schedule; the planner from each grid it predicts. */
typedef struct {
    int micro_batch, seq_len, n_embd; /* B, T, C */
    int pp, n_chunks;         /* pipeline ranks; chunks, pp * virtual_stages */
    const int *chunk_rank;    /* [n_chunks]: the schedule's placement (schedule.h) */
    int m;                    /* micro-batches per step */
    int recompute;            /* ts_recompute */
    int dp, zero;
    bool async_checkpoint;    /* checkpoint.async with a checkpoint dir */
    int weight_copy_bytes;    /* per parameter, a compute copy beside the fp32 weights
                                 (kernels.h's weight_copy_bytes; the planner's bf16
                                 clusters: 2) */
    int act_bytes;            /* bytes of one activation element (4 fp32, 2 bf16) */
    int threads;              /* BLAS threads */
} ts_memory_shape;

/* Bytes one chunk holds, from its layers' bytes of one micro-batch: the rule the
 * engine allocates by (engine.c), kept here once for the trainer and the planner. */
typedef struct {
    double set;      /* one live activation set: the saved tensors, tokens and targets */
    double tensors;  /* the saved tensors alone (of set) */
    double stash;    /* one zero-bubble stash (from I to W) */
    double slot;     /* per micro-batch of the step: the received input (not chunk 0) and
                        the gradient buffer; with recompute the kept output copy (not the
                        last chunk) and tokens and targets again */
} ts_chunk_memory;

void ts_memory_chunk(const ts_memory_shape *sh, int chunk, double act_bytes,
                     double stash_bytes, ts_chunk_memory *out);

/* What a rank holds, counted where it is known: the trainer from the model's layout of
 * its layers, the planner from per-layer tables. Arrays are [n_chunks]; only the
 * rank's own chunks (sh->chunk_rank[c] == pp_rank) are read. */
typedef struct {
    double param_floats;       /* the rank's parameters as laid out (padded; the head's
                                  copy of the tied embedding included) */
    double scratch_bytes;      /* the backward scratch, allocated once */
    const double *act_bytes;   /* one micro-batch's saved activations, per chunk */
    const double *stash_bytes; /* one micro-batch's zero-bubble stash, per chunk */
    const int *peak_acts, *peak_stash; /* ts_memory_peak_sets */
} ts_memory_holdings;

/* The memory of pipeline rank pp_rank: parameters and gradients (fp32, plus the weight
 * copy), the AdamW moments (1/dp with ZeRO-1), each chunk's peak activation sets and
 * stashes and its m pipeline slots (ts_memory_chunk), the scratch, checkpoint.async's
 * copy of the rank's 1/dp share of weights and moments, and the BLAS threads' buffers.
 * The one rule both the trainer (ts_memory_estimate) and the planner
 * (plan/model_cost.c) call. */
void ts_memory_rank(const ts_memory_shape *sh, const ts_memory_holdings *h, int pp_rank,
                    ts_rank_memory *est);

/* Most activation sets (and zero-bubble stashes) of each chunk of pipeline rank pp_rank
 * alive at once when the rank runs its actions in order, as the engine holds them, with
 * recompute mode `recompute` (ts_recompute): F takes a set (and gives it back at once
 * when the micro-batch is recomputed), B or I of a recomputed micro-batch takes one
 * again, B or W gives it back; I takes a stash, W frees it. Writes peak_acts[c] and
 * peak_stash[c] (arrays of s->n_chunks) for the rank's own chunks (placed on pp_rank)
 * only, so one pair of arrays can gather every rank's. The planner
 * (plan/predict.c) uses the same rule. */
void ts_memory_peak_sets(const ts_schedule *s, int recompute, int pp_rank, int *peak_acts,
                         int *peak_stash);

/* "34.2 GiB (parameters 8.6 GiB, gradients 8.6 GiB, ...)" into buf. */
const char *ts_memory_describe(const ts_rank_memory *e, char *buf, size_t size);

/* The gradient bytes of chunk `chunk` alone (its layers' parameters on tensor-parallel
 * rank 0): what its data-parallel reduction moves (plan's dp cost). */
double ts_memory_chunk_grad_bytes(const ts_config *cfg, const ts_partition *part, int chunk);

#endif
