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
#include "pipeline/residency.h"
#include "pipeline/schedule.h"
#include "core/sysmem.h"

typedef struct {
    double params, grads, optimizer; /* bytes: weights, gradients, the two AdamW moments,
                                        as they persist through the step (ZeRO-2/3: the
                                        rank's 1/dp shards of what is sharded) */
    double chunk_buffers; /* ZeRO-2/3: the per-chunk buffers at their peak (residency.h):
                             full-size gradient buffers, with ZeRO-3 also the gathered
                             weights (fp32 and the compute copy), or ZeRO-3's gather of all
                             the rank's weights for validation and checkpoints when that is
                             larger; 0 with ZeRO-0/1 */
    double activations;  /* saved activations at the schedule's peak, zero-bubble stashes */
    double buffers;      /* pipeline transfer buffers, backward scratch, token ids */
    double reduce_copies; /* MPI's temporaries of the replica group's gradient reductions
                             on host memory (ts_memory_shape.host_reductions; 0 on NCCL) */
    double blas;         /* OpenBLAS's per-thread GEMM buffers (address space) */
    double total;
    double act_sets;     /* of `activations`, the saved tensors alone (no token ids, no
                            stashes): what the trainer's activation_mb reports */
} ts_rank_memory;

/* The estimate for pipeline rank `pp_rank` (every tensor-parallel and data-parallel
 * rank of it holds the same), running `threads` BLAS threads: the model's own layout of
 * the rank's layers (nothing allocated) into ts_memory_rank. With parallel.recompute =
 * "auto", keep [n_chunks] holds the caps the run uses (ts_memory_estimate_auto_selective
 * chose them), every chunk laid out without selective recompute; NULL otherwise. */
void ts_memory_estimate(const ts_config *cfg, const ts_partition *part,
                        const ts_schedule *sched, int pp_rank, int threads, const int *keep,
                        ts_rank_memory *est);

/* parallel.recompute = "auto" on pipeline rank pp_rank: ts_memory_auto_keep_selective on
 * the rank's layout, the caps into keep[c] and whether the chunk is selective into
 * selective[c] for the rank's chunks, the estimate under them into *est. `room`: the
 * bytes the estimate less its BLAS buffers (est->total - est->blas) may reach. False
 * when even recomputing every micro-batch exceeds it (*est is then that estimate: caps
 * 0, the chunks selective as the choice left them). The trainer lays its chunks out
 * (ts_model_spec.selective) and runs its engine by exactly these. */
bool ts_memory_estimate_auto_selective(const ts_config *cfg, const ts_partition *part,
                                       const ts_schedule *sched, int pp_rank, int threads,
                                       double room, int *keep, bool *selective,
                                       ts_rank_memory *est);

/* What a rank's memory follows from beyond its layers: the run's shape. The trainer
 * takes it from its config and schedule; the planner from each grid it predicts. */
typedef struct {
    int micro_batch, seq_len, n_embd; /* B, T, C */
    int pp, n_chunks;         /* pipeline ranks; chunks, pp * virtual_stages */
    const int *chunk_rank;    /* [n_chunks]: the schedule's placement (schedule.h) */
    int m;                    /* micro-batches per step */
    int dp, zero;             /* dp: the ranks holding the same weights (dp * cp) */
    bool async_checkpoint;    /* checkpoint.async with a checkpoint dir */
    int weight_copy_bytes;    /* per parameter, a compute copy beside the fp32 weights
                                 (kernels.h's weight_copy_bytes; the planner's bf16
                                 clusters: 2) */
    int act_bytes;            /* bytes of one activation element (4 fp32, 2 bf16) */
    int threads;              /* BLAS threads */
    bool host_reductions;     /* the gradient reductions run through MPI on host memory
                                 (the CPU backends): Open MPI's non-blocking collectives
                                 keep a temporary copy of each message in flight */
    bool overlap_grad_sync;   /* parallel.overlap_grad_sync (ZeRO-0's reduction) */
    bool selective;           /* recompute = "selective" (the planner's per-layer tables
                                 subtract attention's state from it; the trainer's layout
                                 already has) */
    int seq_split;            /* a chunk boundary's rows are B*T / seq_split: tp under
                                 sequence parallelism, else 1 (0 reads as 1) */
    int edp;                  /* expert parallelism: the ranks holding the same experts
                                 (topology/expert_grid.h's edp), over which the routed
                                 experts' gradients reduce and ZeRO shards them (0 reads
                                 as dp: every replica holds every expert) */
} ts_memory_shape;

/* Bytes one chunk holds, from its layers' bytes of one micro-batch: the rule the
 * engine allocates by (engine.c), kept here once for the trainer and the planner. */
typedef struct {
    double set;      /* one live activation set: the saved tensors, tokens and targets */
    double tensors;  /* the saved tensors alone (of set) */
    double stash;    /* one zero-bubble stash (from I to W) */
    double slot;     /* per micro-batch of the step: the received input (not chunk 0) and
                        the gradient buffer */
    double replay;   /* per recomputed micro-batch: the kept output copy (not the last
                        chunk), tokens and targets again */
} ts_chunk_memory;

void ts_memory_chunk(const ts_memory_shape *sh, int chunk, double act_bytes,
                     double stash_bytes, ts_chunk_memory *out);

/* recompute = "auto"'s peaks (ts_memory_peak_sets) under one cap k on every chunk, per
 * pipeline rank and cap, memoised for one schedule: a chunk's peaks depend on its own cap
 * alone (every count there is the chunk's), so a fit's caps read each chunk's from the
 * row of its cap. The planner keeps one per schedule (its grids share schedules) and
 * passes it with that schedule alone. */
typedef struct {
    int n_chunks, m, pp; /* the schedule's (whose actions the rows count) */
    int **rows; /* [pp * (m + 1)]: NULL until used, else peak_acts, peak_stash and
                   n_recomputed of each of the rank's chunks in chunk order (3 ints each) */
} ts_peak_memo;

void ts_peak_memo_init(ts_peak_memo *pm, const ts_schedule *s);
void ts_peak_memo_free(ts_peak_memo *pm);

/* What a rank holds, counted where it is known: the trainer from the model's layout of
 * its layers, the planner from per-layer tables. Arrays are [n_chunks]; only the
 * rank's own chunks (sh->chunk_rank[c] == pp_rank) are read. */
typedef struct {
    double param_floats;       /* the rank's parameters as laid out (padded; the head's
                                  copy of the tied embedding included) */
    double expert_floats;      /* of param_floats, the routed experts' (ts_param.expert:
                                  under expert parallelism the rank's E/ep of them),
                                  sharded and reduced over sh->edp; 0 for a dense model */
    double scratch_bytes;      /* the backward scratch, allocated once */
    double group_sum_copy;     /* host reductions: the temporary of the tied embedding's
                                  blocking sum over the pipeline's two ends (half its
                                  gradient), where the rank holds one end */
    const double *act_bytes;   /* one micro-batch's saved activations, per chunk */
    const double *stash_bytes; /* one micro-batch's zero-bubble stash, per chunk */
    const int *peak_acts, *peak_stash, *n_recomputed; /* ts_memory_peak_sets */
    /* recompute = "auto" choosing selective per chunk (ts_memory_auto_keep_selective;
     * the trainer from the model's selective layout, the planner from its tables'
     * att_bytes); NULL / 0 where nothing chooses (another recompute mode): */
    const double *sel_act_bytes; /* one micro-batch's saved activations per chunk, the
                                    chunk laid out selective (no attention state) */
    double sel_scratch_bytes;    /* the scratch when some chunk is selective (with the
                                    rebuilt attention state and output) */
    /* train.optimizer = "muon" (optim/muon.h; all 0 under AdamW): of param_floats, the
     * Muon matrices' floats as laid out, of those the routed experts' (counted as
     * expert_floats is: 0 without an expert grid), and the largest matrix's. */
    double muon_floats, muon_expert_floats, muon_max_floats;
    /* Muon's device buffers, sized by the rank's largest matrices (optim/muon.h,
     * data/muon_dist.h): the update of the largest logical matrix, the iteration's
     * scratch (ts_muon_scratch_bytes), and with tp-split matrices the gathered logical
     * matrix and one shard, fp32 (ts_memory_muon_buffer_bytes). */
    double muon_buffer_bytes;
    /* ZeRO-2/3 (zero >= 2 with dp > 1) only; NULL otherwise: */
    const double *chunk_floats; /* floats of each of the rank's chunks in its layout (they
                                   tile the rank's flat buffer: sum = param_floats) */
    const ts_residency *res;    /* the rank's residency (ts_memory_residency) */
    /* ZeRO-2/3's chunk buffers when already counted for these chunk floats and residency
     * (they depend on nothing else): ts_memory_auto_keep_selective's later estimates of
     * the same rank reuse its first's; false: counted afresh. */
    bool chunk_buffers_known;
    double chunk_buffer_bytes;
    /* recompute = "auto": its schedule's memo of the peaks (NULL: counted afresh) */
    ts_peak_memo *peak_memo;
} ts_memory_holdings;

/* The memory of pipeline rank pp_rank: parameters and gradients (fp32, plus the weight
 * copy), the AdamW moments (1/dp with ZeRO-1), per ZeRO level with dp > 1 (N =
 * param_floats, S = its shard: (N - X) / dp + X / edp with X = expert_floats, the
 * experts sharded over their own group; wcb = weight_copy_bytes, F_c = chunk_floats[c];
 * zero >= 1 with dp = 1 is zero 0):
 *   zero 0: params 4N + wcb N, grads 4N, optimizer 8N;
 *   zero 1: optimizer 8S;
 *   zero 2: params 4N + wcb N, grads 4S (the persistent shard), optimizer 8S, and
 *           chunk_buffers = ts_residency_peak_bytes(res, NULL, 4 F_c);
 *   zero 3: params 4S, grads 4S, optimizer 8S, chunk_buffers = max(the step's peak of
 *           (4 + wcb) F_c weight and 4 F_c gradient buffers, (4 + wcb) N: validation and
 *           checkpoint saves gather every chunk at once, outside the step);
 * under Muon (muon_floats M > 0, MX of them experts, Mmax the largest) the optimizer is
 * AdamW's 8 bytes on the rest, N - M, sharded as above by level (its expert part over
 * edp), plus Muon's one fp32 momentum, 4 bytes on the matrices the rank owns: with dp > 1
 * at every level (each matrix has one owner in its reduction group, MUON_DESIGN) the
 * busiest owner's max((M - MX) / dp + MX / edp, Mmax), with dp = 1 all of M; and
 * buffers hold muon_buffer_bytes;
 * each chunk's peak activation sets and
 * stashes, its m pipeline slots and the replay buffers of its recomputed micro-batches
 * (ts_memory_chunk), the scratch, checkpoint.async's
 * copy of the rank's 1/dp share of weights and moments (Muon: and momentum), and the
 * BLAS threads' buffers.
 * The one rule both the trainer (ts_memory_estimate) and the planner
 * (plan/model_cost.c) call. */
void ts_memory_rank(const ts_memory_shape *sh, const ts_memory_holdings *h, int pp_rank,
                    ts_rank_memory *est);

/* Which micro-batches recompute, and the most activation sets (and zero-bubble stashes)
 * of each chunk of pipeline rank pp_rank alive at once when the rank runs its actions in
 * order, as the engine holds them: the one rule the engine (which forwards keep only
 * their input), the memory estimate and the planner share. Recompute mode `recompute`
 * (ts_recompute) decides each forward F(c, mb): none keeps its activations, full
 * recomputes, except_last recomputes all but micro-batch m-1, and auto recomputes when
 * chunk c already holds keep[c] sets (keep: [n_chunks], auto only; keep[c] >= the peak
 * without recompute is "none", 0 is "full"). Counting: F takes a set (and gives it back
 * at once when the micro-batch is recomputed), B or I of a recomputed micro-batch takes
 * one again, B or W gives it back; I takes a stash, W frees it. Outputs, each may be
 * NULL, written for the rank's own chunks (placed on pp_rank) only, so one set of
 * arrays can gather every rank's: peak_acts[c], peak_stash[c], n_recomputed[c] (arrays
 * of s->n_chunks) and recomputed[c * m + mb] (s->n_chunks * m). */
void ts_memory_peak_sets(const ts_schedule *s, int recompute, const int *keep, int pp_rank,
                         int *peak_acts, int *peak_stash, int *n_recomputed, bool *recomputed);

/* parallel.recompute = "auto"'s choice on pipeline rank pp_rank: which chunks are
 * selective (selective[c]) and the largest caps keep[c] (ts_memory_peak_sets) for which
 * ts_memory_rank's estimate less its BLAS buffers fits `room` bytes. From no recompute
 * (every cap at the chunk's peak, no chunk selective):
 *   1. while it does not fit, the chunk whose selective layout saves the most bytes at
 *      its peak (peak sets x the attention state of its blocks; the lowest chunk on a
 *      tie; none that saves nothing, as a chunk without blocks, nor one whose attention state
 *      is a smaller share of its set than attention's core is of a block's forward FLOPs,
 *      T / (6C + T): a flash kernel's one value per row) goes selective. The
 *      first one also grows the scratch by one layer's rebuilt state and output: if
 *      every saving chunk selective still does not fit and holds more than none of
 *      them, none is (the rebuilt area outweighed what they dropped);
 *   2. while it does not fit, the cap of the chunk whose held activation sets take the
 *      most bytes (in its layout; the lowest chunk on a tie) comes down by one.
 * Selective first because it is the cheaper trade: it costs a chunk one more run of
 * attention's core per micro-batch (a few % of its compute) and drops attention's state
 * from every set it holds, where one step of a cap drops at most one set and costs a
 * whole forward of the chunk per micro-batch it recomputes. A micro-batch recomputed
 * fully replays into a set of its chunk's one layout: a selective chunk's replay too
 * keeps no attention state, which its backward rebuilds (the sets are one size per
 * chunk, the estimate counts them so, and the replay's is the set held when memory is
 * tightest). With selective NULL, or h->sel_act_bytes NULL, step 1 is skipped (caps
 * alone). Takes h's sizes (its peak arrays are ignored); writes, for the
 * rank's chunks, keep, selective, peak_acts, peak_stash and n_recomputed ([n_chunks])
 * and the estimate under the choice into *est. False when even caps of 0 (full
 * recompute) exceed room: the outputs then describe those. Deterministic: every tensor-
 * and data-parallel rank of a pipeline rank, given one room, chooses the same. */
bool ts_memory_auto_keep_selective(const ts_schedule *s, const ts_memory_shape *sh,
                                   const ts_memory_holdings *h, int pp_rank, double room,
                                   int *keep, bool *selective, int *peak_acts,
                                   int *peak_stash, int *n_recomputed, ts_rank_memory *est);

/* The choice per chunk of pipeline rank pp_rank under caps keep and selective chunks
 * (auto; selective NULL: none), as the trainer logs it: "chunk 0 keeps 2 of 4 in flight,
 * selective (recomputes 6 of 8 micro-batches); chunk 5 keeps ..." into buf; returns
 * buf. */
const char *ts_memory_describe_keep_selective(const ts_schedule *s, int pp_rank,
                                              const int *keep, const bool *selective,
                                              char *buf, size_t size);
/* ZeRO-2/3's residency of pipeline rank pp_rank (ts_residency_build), with the chunks
 * holding a group-summed tensor held to the step's end (data/reducer.c runs the sums there):
 * the tied embedding's two ends (chunk 0 and the head's chunk) when model_tied and they
 * sit on different pipeline ranks, and with kv_replicated (llama, tp > n_kv_head:
 * replicated key/value weights) every chunk holding a block (first_layer,
 * n_chunk_layers: the partition's; n_layers = n_layer + 2). Free with
 * ts_residency_free. */
void ts_memory_residency(const ts_schedule *s, int pp_rank, bool model_tied, bool kv_replicated,
                         const int *first_layer, const int *n_chunk_layers, int n_layers,
                         ts_residency *r);

/* The same for a run's config: tied and kv_replicated from cfg's model and parallel.tp. */
void ts_memory_residency_of_config(const ts_config *cfg, const ts_partition *part,
                                   const ts_schedule *s, int pp_rank, ts_residency *r);

/* Floats of each chunk of pipeline rank pp_rank in the rank's own layout (tp rank 0;
 * memory.h's F_c, what the memory estimate counts) into out[c] for the rank's chunks
 * ([n_chunks]; others untouched). */
void ts_memory_chunk_floats(const ts_config *cfg, const ts_partition *part,
                            const ts_schedule *s, int pp_rank, double *out);

/* Muon's buffers (ts_memory_holdings.muon_buffer_bytes) from the largest logical matrix
 * (elements), the largest scratch (bytes) and, of the tp-split ones, the largest logical
 * matrix and the largest shard (elements; 0 without). */
double ts_memory_muon_buffer_bytes(double logical, double scratch, double split_logical,
                                   double split_local);

/* The same for the Muon matrices alone (optim/muon.h ts_param_is_muon; whatever
 * train.optimizer says): what ZeRO-0 under Muon all-gathers after the update. */
void ts_memory_chunk_muon_floats(const ts_config *cfg, const ts_partition *part,
                                 const ts_schedule *s, int pp_rank, double *out);

/* "34.2 GiB (parameters 8.6 GiB, gradients 8.6 GiB, ...)" into buf. */
const char *ts_memory_describe(const ts_rank_memory *e, char *buf, size_t size);
/* The same as the process will hold it, for the trainer's pre-flight line: resident bytes
 * = process_bytes (what the process holds before its model: code, libraries, MPI, the
 * data's index) + total - blas; the BLAS buffers are address space, named apart. */
const char *ts_memory_describe_resident(const ts_rank_memory *e, double process_bytes,
                                        char *buf, size_t size);

/* The gradient bytes of chunk `chunk` alone (its layers' parameters on tensor-parallel
 * rank 0): what its data-parallel reduction moves (plan's dp cost). */
double ts_memory_chunk_grad_bytes(const ts_config *cfg, const ts_partition *part, int chunk);

#endif
