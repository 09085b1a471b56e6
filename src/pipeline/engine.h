/* The pipeline engine: runs one rank's action list (schedule.h) for one training step.
 * The point-to-point transfers (the input of F(c, i) from chunk c-1's rank, the output
 * gradient of B(c, i) from chunk c+1's rank) follow the exchange program derived from
 * the schedule (exchange.h): before each action its group of sends and receives is
 * issued, matched by order with no message tags, so the same engine runs on a backend
 * without tags (NCCL). It frees a micro-batch's activations as soon as its backward has
 * run, and for the micro-batches it recomputes (parallel.recompute) keeps only chunk
 * inputs.
 *
 * Overlapped pairs. Under expert parallelism (the model's rows travel over ep) a
 * schedule's overlapped F/B pairs (ts_action.overlap: dualpipe-v's) run as two threads
 * holding one baton (pair.h): both actions' pre-work (ZeRO's before_action, waiting for
 * the input, taking an activation set) in schedule order on the engine's thread, then
 * the first body there and the second on the pair's worker, the baton passing at the
 * expert layers' ts_yield() (core/yield.h), then both post-works in order (releases,
 * after_action, the eager sends; the grouped program's group between the two actions is
 * issued after the first's post-work). A pair runs so only where its second action's
 * input is received before its first action (the exchange program hoisted it) and the
 * micro-batches differ (then neither body needs the other's result); otherwise, on dense
 * models, and without MPI_THREAD_MULTIPLE, the actions run one after the other as ever
 * (TS_PP_PAIRS=sequential forces that: the bit-for-bit reference). What the interleaved
 * bodies share, and why the result is the sequential run's bits:
 *   - the backward scratch (e->scratch): only the backward body writes its per-layer
 *     regions; the forward uses the parts an activation set points into (att_work,
 *     sp_work, cp_work) only inside one attention or norm phase, and the backward holds
 *     none of them across an MoE layer (its attention state is rebuilt after the MoE
 *     part; under sequence parallelism the MoE gathers nothing). Held across a yield:
 *     the backward's MoE region (moe_scratch), which a forward never touches.
 *   - activation sets, slots, the free lists, the data reader's host buffers: each body
 *     its own micro-batch's; lists and buffers touched only in pre/post-work or (the
 *     forward's batch read) before its first yield.
 *   - the model's accumulators: parameter gradients, the MoE step counts and loss sums
 *     are the backward's, the step's loss the forward's, and a pair has one of each, so
 *     every sum is made in the sequential order; layer_done (the dp reduction's bucket
 *     starts, sp's norm sums) runs on whichever thread runs the backward, serialized by
 *     the baton, its MPI calls in program order.
 *   - the model's expert exchange plan (ts_expert_dispatch, expert_tp): made and used
 *     between two yields of one body; a yield inside a plan's use must keep its plan
 *     per call (the a2a side's contract).
 *   - threads' own state: the worker takes the engine thread's OpenMP thread count (a
 *     per-thread setting a new thread does not inherit; OpenBLAS's OpenMP build follows
 *     its caller's) and CUDA device (the stream and cuBLAS handle are the process's);
 *     oneDNN's per-thread stream and scratchpad are the worker's own (freed when it
 *     ends; one more scratchpad, and one more thread's OpenBLAS buffers, than the
 *     memory estimate counts); core/error.c's message is per thread (the
 *     runner carries the worker's to this thread); the watchdog takes marks from the
 *     baton's holder (watchdog.h); the trace and comm spans are added by the holder.
 *   - MPI: both threads call it, never at once (the baton), in an order the program
 *     fixes: MPI_THREAD_MULTIPLE is asked for at start-up (comm/control.c). */
#ifndef TS_ENGINE_H
#define TS_ENGINE_H

#include <stdbool.h>

#include "comm/comm.h"
#include "config/config.h"
#include "core/trace.h"
#include "dataset/loader.h"
#include "dataset/sampler.h"
#include "model/model.h"
#include "pipeline/exchange.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"

/* Called when the parameter gradients of layers [first_layer, end_layer) are final for
 * the step (per layer during a chunk's last full backward, per chunk otherwise; a
 * layer may be reported more than once). */
typedef void (*ts_chunk_done_fn)(void *ctx, int first_layer, int end_layer);

/* State of one (local chunk, micro-batch) during a step. */
typedef struct {
    ts_acts *acts;          /* live activations (NULL when released or not yet run) */
    void *in;               /* [N*C] received input activation (chunks > 0), act_dtype */
    void *dx;               /* [N*C] the output gradient, then (in place) the input's */
    void *out;              /* [N*C] a copy of the output to send when recomputing */
    int *tokens, *targets;  /* [N] kept for recomputation */
    ts_request recv_in, recv_dy, send_out, send_dx;
} ts_mb_slot;

typedef struct {
    const ts_config *cfg;
    ts_model *model;
    const ts_schedule *sched;
    const ts_partition *part;
    ts_sampler *data;       /* the training data (its step cache changes as it reads) */
    const ts_comm *pp;      /* the topology's pipeline group; rank in it = pipeline rank */
    int *pp_world;          /* [pp.size] world rank of each pipeline rank (watchdog messages) */
    int pp_rank;
    int dp, dp_rank;        /* parallel.dp and this rank's coordinate on it (the data) */
    int n_chunks, m, B, T, N, C;
    int seq_len;            /* positions of a sequence; T: this rank's (seq_len / cp) */
    ts_dtype act;           /* the activations' element type (the model's kernels) */
    int rows;               /* rows of a chunk's input and output on this rank: N, or
                             * N / tp under sequence parallelism */
    size_t nc_bytes;        /* bytes of one [N, C] message: a chunk's input or its gradient */
    bool *recomputed;       /* [n_chunks * m]: F(c, mb) keeps only its input and is
                               recomputed before its backward (ts_memory_peak_sets: the
                               rule the memory estimate counts by) */

    ts_xchg xchg;           /* the step's transfers, in order (exchange.h) */
    /* How the program runs: grouped = each group before its action, as a backend that
     * matches by order and completes a send only when the peer receives needs (NCCL);
     * eager (MPI, default) = every receive posted at the start of the step and each
     * send issued as soon as its data exists, in the program's order per peer (fewer
     * waits; the same message order, still no tags). TS_PP_EXCHANGE=grouped selects
     * the grouped run on MPI, so tests cover it before a backend needs it. */
    bool grouped;
    /* Eager: this rank's sends grouped by peer, each peer's in program order (the order
     * its receives expect): peer p's are sends[send_first[p] .. send_first[p + 1]), the
     * next to issue sends[send_next[p]]. */
    const ts_xchg_op **sends;
    int *send_first, *send_next; /* [pp + 1], [pp] */
    bool *produced;           /* [n_local * m * 2]: output (0) / input gradient (1) made */
    int n_local;            /* chunks on this rank */
    int *local_chunks;      /* [n_local] global chunk index */
    int *local_of_chunk;    /* [n_chunks] local index or -1 */
    ts_mb_slot *slots;      /* [n_local * m] */
    ts_acts **free_acts;    /* per local chunk: a free list of activation sets */
    int *n_free, *cap_free;
    int *n_allocated;       /* activation sets allocated per local chunk (the peak) */
    int *bwd_done;          /* per local chunk: micro-batches whose weight grads are in */
    ts_scratch scratch;

    ts_chunk_done_fn chunk_done;
    void *chunk_done_ctx;
    /* Called before and after action i of the rank's list (NULL: none): ZeRO-2/3 bring
     * a chunk's gradient buffer and gathered weights in and out (data/zero.h). */
    void (*before_action)(void *ctx, int i);
    void (*after_action)(void *ctx, int i);
    void *action_ctx;

    /* Overlapped pairs (ts_action.overlap) run as two threads, one baton (pair.h), under
     * expert parallelism: paired[i] = actions i and i + 1 run so (NULL: every action
     * alone, the plain loop); the pair's runner and worker (created once, here), the
     * two actions under way (engine.c's action_run[2]), and what the worker sets up as
     * the engine's thread has it (OpenMP's thread count, the CUDA device). */
    bool *paired;
    struct ts_pair *pair;
    void *pair_runs;
    int pair_cpu_threads, pair_device;

    ts_trace *trace;        /* NULL = no tracing */
    double trace_t0_ms;

    /* Per step. */
    int64_t seq0;           /* the step's first global sequence (the data position) */
    int batch;              /* the step's global batch: m * dp * B (train.batch_rampup) */
    double doc_pairs;       /* packed documents: the step's attention query-key pairs of
                             * the sequences whose first chunk this rank ran (ts_acts
                             * doc_pairs; 0 without document masks) */
    double loss_sum;        /* sum of per-token losses (last chunk's rank), read back from
                             * loss_acc once at the end of the step */
    double *loss_acc;       /* device: the step's losses accumulate here */
    int *tokens_host, *targets_host; /* [B*seq_len] host staging of a micro-batch's ids */
    int *local_host;        /* [N]: this rank's positions of them (context parallelism) */
    double compute_ms;      /* time in F/B/I/W */
    double span_ms;         /* from the step's start to its last action */
} ts_engine;

/* keep: with parallel.recompute = "auto", the caps of the rank's chunks ([n_chunks],
 * ts_memory_auto_keep_selective chose them); NULL for the other modes. The chunks it made
 * selective are the model's layout (ts_model_spec.selective, when it was built):
 * every activation set of such a chunk, kept or a recomputed micro-batch's replay, is
 * allocated without attention's state, and the scratch holds the rebuilt one. pp: the
 * pipeline group, held by pointer (the topology's: it outlives the engine); dp_rank: this
 * rank's coordinate on parallel.dp's axis (which part of the data it reads). */
ts_status ts_engine_init(ts_engine *e, const ts_config *cfg, ts_model *model,
                         const ts_schedule *sched, const ts_partition *part,
                         ts_sampler *data, const ts_comm *pp, int dp_rank, const int *keep);
void ts_engine_free(ts_engine *e);

/* Run this rank's actions for optimizer step `step`, whose `batch` sequences (the
 * schedule's m micro-batches on each replica) start at global sequence seq0 (the
 * sequences consumed before it). Parameter gradients accumulate into the model's
 * gradient buffer (zero it before); each target weighs 1 / (batch * seq_len); chunk_done
 * is called as chunks' gradients become final. */
void ts_engine_run(ts_engine *e, int step, int64_t seq0, int batch);

/* Validation: the sum of per-token losses over this replica's part of the n_windows
 * windows spread over the whole validation stream (window i is ts_data_val_window(i,
 * n_windows, S)); data-parallel replica d takes the contiguous part [d*n/dp,
 * (d+1)*n/dp), micro_batch windows per forward. Non-zero only on the last chunk's rank;
 * the caller sums over the grid and divides by n_windows * T. With multi-token
 * prediction each depth's sum the same way into mtp_sums [mtp_layers] (when given). */
double ts_engine_eval(ts_engine *e, const ts_dataset *val, int n_windows, double *mtp_sums);

/* Rows to score (ts_engine_score): fill(ctx, row, tokens, targets, from, to) writes
 * row's seq_len input tokens and targets (host memory) and the positions [from, to)
 * whose losses count; n_rows is a multiple of unit, and a unit's rows (an evaluation
 * item's completions) go to one replica. */
typedef struct {
    int n_rows, unit;
    void (*fill)(void *ctx, int row, int *tokens, int *targets, int *from, int *to);
    void *ctx;
} ts_engine_rows;

/* Downstream evaluation: forward only, as ts_engine_eval, over this replica's share of
 * the rows (micro_batch rows per forward); row_loss[row] += the sum of the row's
 * per-token losses at its scored positions, on the last chunk's ranks (every tp rank
 * alike; each cp rank its own positions' part); the caller sums over the grid (tp rank
 * 0's) and zeroes row_loss [n_rows] before. */
void ts_engine_score(ts_engine *e, const ts_engine_rows *rows, double *row_loss);

/* Bytes of activation memory allocated (the peak over the run so far). */
size_t ts_engine_activation_bytes(const ts_engine *e);

#endif
