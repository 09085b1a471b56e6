/* Partition: which contiguous layers every pipeline chunk holds.
 *
 * Layers are indexed 0 = embedding, 1..n_layer = blocks, n_layer+1 = head. They are cut
 * into n_chunks = pp * virtual_stages contiguous chunks of at least one layer each;
 * the schedule places each chunk on a pipeline rank (schedule.h). The cut is either the config's
 * explicit parallel.partition list or "balanced": the one that minimises the slowest
 * chunk's forward+backward time, from per-layer costs that are measured (the real model
 * code timed once on one embedding, one block and the head) or modelled (FLOPs and
 * bytes). Ties between equally slow cuts are broken by the most even one (least sum of
 * squared chunk costs), then by the earliest split points, so every process that sees
 * the same costs gets the same cut.
 *
 * All times are milliseconds for one micro-batch (parallel.micro_batch sequences of
 * model.seq_len tokens) on one process, tensor parallelism ignored. */
#ifndef TS_PARTITION_H
#define TS_PARTITION_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "core/error.h"
#include "kernels/kernels.h"

typedef enum {
    TS_COST_MODELLED, /* FLOP/byte model (deterministic) */
    TS_COST_MEASURED, /* timed with the real kernels at start-up */
} ts_cost_source;

/* Per-layer costs of one micro-batch. Plain arrays of doubles, so a multi-rank job
 * can measure on one rank and broadcast them (as bytes) before partitioning. */
typedef struct {
    int n_layers;       /* n_layer + 2 */
    double *fwd_ms;     /* [n_layers] forward */
    double *bwd_ms;     /* [n_layers] full backward (input + weight gradient) */
    double *act_bytes;  /* [n_layers] activation bytes a micro-batch keeps from its forward
                           until its backward (the layer's saved tensors, as act_layout.h
                           allocates them) */
    ts_cost_source source;
} ts_layer_costs;

/* The FLOP/byte model (never fails). Assumed machine: TS_MODEL_GFLOPS dense GFLOP/s
 * and TS_MODEL_GBS GB/s of memory bandwidth. A block costs its GEMM and attention
 * FLOPs (forward 24*N*C^2 + 4*N*T*C, backward twice that) plus its activation and
 * parameter traffic; the embedding is memory-bound (gathered wte rows, wpe, the scatter
 * of its backward); the head is LayerNorm + the LM-head GEMM 2*N*C*V (x3 with backward)
 * + softmax/cross-entropy over N*V. N = micro_batch * seq_len tokens. */
#define TS_MODEL_GFLOPS 100.0
#define TS_MODEL_GBS 10.0
void ts_layer_costs_model(ts_layer_costs *c, const ts_model_config *mc, int micro_batch);

/* Measure: build the model for {embedding, block 0, head} only, run forward and backward
 * of each on random tokens / inputs of the micro-batch shape with kernels `k` (NULL = the
 * CPU backend) a few times, and keep the fastest; every block gets block 0's time.
 * Takes about 3-5 forward+backward passes of three layers. Results differ a little from
 * run to run and process to process: see ts_layer_costs above for multi-rank use. */
ts_status ts_layer_costs_measure(ts_layer_costs *c, const ts_model_config *mc, int micro_batch,
                                 const ts_kernels *k);

/* Deep copy / free. */
void ts_layer_costs_copy(ts_layer_costs *dst, const ts_layer_costs *src);
void ts_layer_costs_free(ts_layer_costs *c);

typedef struct {
    int pp, v, n_chunks;      /* placed on ranks by the schedule (schedule.h) */
    int n_layers;             /* model layers (n_layer + 2) */
    int n_layer;              /* transformer blocks (for layer names) */
    int *first_layer;         /* [n_chunks] */
    int *n_chunk_layers;      /* [n_chunks] */
    bool balanced;            /* false: the config's explicit list */
    ts_layer_costs costs;     /* the per-layer costs used (owned copy) */
    double *chunk_fwd_ms;     /* [n_chunks] sums of the layer costs */
    double *chunk_bwd_ms;     /* [n_chunks] */
    double *chunk_act_bytes;  /* [n_chunks] layers' activations + the chunk's received input
                                 (B*T*C floats, for every chunk but the first) */
} ts_partition;

/* Build the config's partition. Explicit list: checked (length pp*v, every entry >= 1,
 * sum n_layer+2). Balanced: costs measured when `measure`, else modelled. The costs are
 * kept either way (the simulator and the trainer's start-up line use them). */
ts_status ts_partition_build(const ts_config *cfg, bool measure, ts_partition *p);

/* The same from given per-layer costs (copied): the deterministic part, for ranks that
 * received the costs from another rank, and for tests. */
ts_status ts_partition_from_costs(const ts_config *cfg, const ts_layer_costs *costs,
                                  ts_partition *p);

void ts_partition_free(ts_partition *p);

/* Balanced cut of n_layers weighted layers into n_chunks contiguous non-empty chunks
 * minimising the largest chunk sum (exact, O(n_chunks * n_layers^2)); ties as above.
 * Fills sizes[n_chunks]. Errors when n_chunks > n_layers or n_chunks < 1. */
ts_status ts_partition_balance(const double *cost, int n_layers, int n_chunks, int *sizes);

/* Chunk holding `layer`, and the layers pipeline rank pp_rank holds (owned[n_layers], the
 * mask for ts_model_build) when chunk c lives on rank chunk_rank[c] (the schedule's
 * placement, schedule.h). */
int ts_partition_chunk_of(const ts_partition *p, int layer);
void ts_partition_owned(const ts_partition *p, const int *chunk_rank, int pp_rank, bool *owned);

/* Name of a layer range, "embed+h.0-h.2", "h.3", "h.10-h.11+head" (buf of >= 48 bytes). */
const char *ts_partition_range_name(int first, int count, int n_layer, char *buf, size_t size);

/* One line per chunk, e.g.
 *   "partition: balanced (measured costs), 2 chunks on pp=2 ranks\n"
 *   "  chunk 0  rank 0  layers 0-2  embed+h.0-h.1   fwd 0.21 ms  bwd 0.43 ms  52.1%\n"
 * Returns a malloc'd string; the caller frees it. */
char *ts_partition_describe(const ts_partition *p, const int *chunk_rank);

#endif
