/* What one rank of a run will allocate, estimated from the config, the partition and
 * the schedule before anything is allocated, and the check against what the machine
 * offers (physical memory shared by the node's ranks, and this process's RLIMIT_AS).
 * `tessera train` refuses a run that cannot fit with the numbers; `tessera plan`
 * prints the same estimate per pipeline rank. */
#ifndef TS_PIPELINE_MEMORY_H
#define TS_PIPELINE_MEMORY_H

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
} ts_rank_memory;

/* The estimate for pipeline rank `pp_rank` (every tensor-parallel and data-parallel
 * rank of it holds the same), running `threads` BLAS threads. */
void ts_memory_estimate(const ts_config *cfg, const ts_partition *part,
                        const ts_schedule *sched, int pp_rank, int threads,
                        ts_rank_memory *est);

/* Most activation sets (and zero-bubble stashes) of each chunk of pipeline rank pp_rank
 * alive at once when the rank runs its actions in order, as the engine holds them, with
 * recompute mode `recompute` (ts_recompute): F takes a set (and gives it back at once
 * when the micro-batch is recomputed), B or I of a recomputed micro-batch takes one
 * again, B or W gives it back; I takes a stash, W frees it. Writes peak_acts[c] and
 * peak_stash[c] (arrays of s->n_chunks) for the rank's own chunks c = pp_rank,
 * pp_rank + pp, ... only, so one pair of arrays can gather every rank's. The planner
 * (plan/model_cost.c) uses the same rule. */
void ts_memory_peak_sets(const ts_schedule *s, int recompute, int pp_rank, int *peak_acts,
                         int *peak_stash);

/* "34.2 GiB (parameters 8.6 GiB, gradients 8.6 GiB, ...)" into buf. */
const char *ts_memory_describe(const ts_rank_memory *e, char *buf, size_t size);

/* The gradient bytes of chunk `chunk` alone (its layers' parameters on tensor-parallel
 * rank 0): what its data-parallel reduction moves (plan's dp cost). */
double ts_memory_chunk_grad_bytes(const ts_config *cfg, const ts_partition *part, int chunk);

#endif
