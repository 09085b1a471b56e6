/* Distributed checkpoints (docs/CONTRACT.md "Checkpoints"): DIR/step_NNNNNNNN/ holds
 *   model.safetensors (or model-0000k-of-0000n.safetensors + model.safetensors.index.json)
 *   optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name> in each parameter's shape
 *                          (train.optimizer = "muon": momentum_buffer.<name> alone for a
 *                          Muon matrix, layout.h)
 *   state.json             step, config, data position, grid, checksums
 *   config.json            (llama) Hugging Face's config: LlamaForCausalLM loads the directory
 * and DIR/latest names the newest complete one.
 *
 * Every tensor is stored LOGICAL (unsharded, under the model's names: nanoGPT's for gpt2,
 * Hugging Face's for llama), so a checkpoint does not depend on the grid that wrote it.
 * The file layout (which tensor lies at which offset of which file) is a function of the
 * model config and checkpoint.file_gb alone: every rank computes it, rank 0 creates the
 * files at their full size with their headers, and each rank writes, with positioned
 * writes, the bytes of the logical slices it owns (one replica per byte: the shard
 * specs' replica 0, split over the data-parallel ranks; an expert tensor under expert
 * parallelism over the ranks holding that expert, its edp group, so each expert is
 * written once, by its own ep rank's ranks; under expert tensor parallelism each etp
 * rank's slice of it by that slice's edp group, the slices tiled by their shard specs).
 * Nothing is gathered but checksums. Loading walks the same shard runs the other way, for
 * whatever grid, partition and ZeRO split the loading job has.
 *
 * Crash safety: a save goes to DIR/.tmp-step_NNNNNNNN, every file and the directory are
 * fsynced, the directory is renamed into place, and only then is DIR/latest replaced
 * (written to a temporary name, fsynced, renamed). A crash at any moment leaves the
 * previous checkpoint and `latest` as they were.
 *
 * Integrity: each tensor's bytes are checksummed (zlib's crc32) in chunks of
 * TS_CKPT_CHUNK_BYTES, combined from the pieces every rank wrote (crc32_combine), and
 * each file's header too; state.json holds them all, so any flipped byte is found. */
#ifndef TS_CHECKPOINT_H
#define TS_CHECKPOINT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/claim.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/error.h"
#include "model/model.h"
#include "optim/muon.h"
#include "optim/optim.h"

#define TS_CKPT_FORMAT_VERSION 1
#define TS_CKPT_CHUNK_BYTES ((uint64_t)64 << 20)
/* The exit code of a run stopped by SIGTERM or SIGUSR1 after saving a checkpoint: a
 * job script requeues on it (EX_TEMPFAIL: try again). */
#define TS_EXIT_PREEMPTED 75

/* A host buffer an asynchronous save copies into, kept by the caller between saves so
 * that only the first save pays for touching its pages. Free mem with free(). */
typedef struct {
    float *mem;
    size_t floats;
} ts_ckpt_staging;

/* What a save needs from the training run. */
typedef struct {
    const ts_config *cfg;     /* the run's resolved config (state.json keeps it) */
    const ts_model *model;    /* this rank's parameters and their shard specs */
    const ts_adamw *optim;    /* this rank's AdamW moments (all, or its ZeRO-1 ranges) */
    const ts_muon *muon;      /* train.optimizer = "muon": the momentum of the Muon
                               * matrices this rank owns; NULL under AdamW */
    const ts_comm *world;     /* every rank takes part */
    int replica, replicas;    /* without ZeRO-1 the ranks holding the same weights (dp *
                               * cp of them: the trainer's replica group) split the
                               * writing; this rank's index among them (the grid itself
                               * is cfg->parallel's, recorded in state.json without cp:
                               * context parallelism changes no tensor) */
    /* Expert parallelism (the model's moe_ep > 1 or moe_etp > 1): an expert tensor
     * (ts_param.expert), or under etp this rank's slice of it (its shard spec), is held
     * only by the ranks of its edp group (the replica group's other ranks hold other
     * experts or other slices), so without ZeRO those split its writing, as the
     * replicas split a dense tensor's; with ZeRO its optimizer ranges are already this
     * rank's share of the edp group. This rank's index in edp and its size (unused when
     * moe_ep == moe_etp == 1: an expert is then one more replicated tensor). */
    int expert_replica, expert_replicas;
    int step;                 /* completed optimizer steps: the next step to run */
    /* The sequences the steps before `step` consumed (the data position): 0 = step x
     * train.global_batch (the same at step 0); train.batch_rampup's sum otherwise. */
    int64_t sequences_consumed;
    ts_ckpt_staging *staging; /* asynchronous saves: reused (grown when needed); NULL: own */
    /* The identity of each data.train shard (token count, crc32), recorded in state.json
     * so a resume can tell when it reads other data; n_data 0: none recorded. */
    int n_data;
    const uint64_t *data_tokens;
    const uint32_t *data_crc;
    /* The blend's datasets: how many of those shards each holds, in order (n_sets 0:
     * one dataset of all n_data). */
    int n_sets;
    const int *set_files;
    /* The blend as the sampler keeps it (n_sets of each; NULL: not recorded): its
     * normalised weights, and its cursor at this step (the sequences of each dataset
     * among the sequences consumed before it), which a resume restores instead of
     * replaying the blend from sequence 0. */
    const double *set_weights;
    const uint64_t *set_counts;
    /* Rank 0: the run's claim on checkpoint.dir (claim.h), checked before the save
     * touches the directory and again before its commit; NULL: none. */
    ts_ckpt_claim *claim;
    /* The MoE blocks' balancing bias at this step, on the host ([moe_bias_n] = n_layer *
     * moe_experts, model.h; the same on every rank), which state.json keeps bit for bit
     * ("moe_bias") and ts_ckpt_load restores; NULL: none (a dense model). */
    const float *moe_bias;
    size_t moe_bias_n;
    /* More of the run's state for state.json (which rank 0 writes): an object whose
     * members join its top level (the trainer's "spike_guard", train/spike_guard.h),
     * copied when the save starts; NULL: none. Their owner reads them back. */
    const json_t *extra;
} ts_ckpt_save_args;

/* Save into cfg->checkpoint.dir/step_NNNNNNNN, move `latest` and keep the newest
 * checkpoint.keep checkpoints, in two halves, so the writing can overlap training
 * (checkpoint.async): ts_ckpt_save_start creates the files and, with `async`, copies
 * this rank's slices to a host buffer and returns while a thread writes them (without,
 * it writes them before returning); ts_ckpt_save_written says whether this rank's writes are done; and
 * ts_ckpt_save_finish waits for them, then gathers the checksums and commits (state.json,
 * rename, latest, pruning) and frees the saver. Both are collective and agreed; the
 * model and optimizer may change between them only with `async`. *blocked_ms: each
 * call's time on this rank. */
typedef struct ts_ckpt_saver ts_ckpt_saver;
ts_status ts_ckpt_save_start(const ts_ckpt_save_args *a, bool async, ts_ckpt_saver **saver,
                             double *blocked_ms);
bool ts_ckpt_save_written(const ts_ckpt_saver *saver);
ts_status ts_ckpt_save_finish(ts_ckpt_saver *saver, double *blocked_ms);
/* A failing run's save in flight: wait for this rank's writes and free it, committing
 * nothing (not collective; the next save removes the temporary directory). */
void ts_ckpt_save_abandon(ts_ckpt_saver *saver);

/* A checkpoint to load: a step directory, or a root directory holding `latest` (or,
 * without `latest`, its newest complete step directory), into step_dir. */
ts_status ts_ckpt_resolve(const char *path, char *step_dir, size_t cap);
/* The newest complete (state.json) step_NNNNNNNN directory under root, or -1. */
long ts_ckpt_newest_step(const char *root);

/* The model config and step a checkpoint was saved with (from its state.json). */
ts_status ts_ckpt_read_model_config(const char *step_dir, ts_model_config *mc, int *step);

/* Weights only, on one process (tessera sample): every parameter m holds, read from the
 * checkpoint's model files, with the checksums of every chunk read checked. */
ts_status ts_ckpt_load_weights(ts_model *m, const char *step_dir);

/* Load into a training run of any grid: checks the checkpoint against the config (the
 * model's keys and the global batch must match: they define the tensors and the data
 * position; train.optimizer too, unless train.allow_optimizer_change, when the state the
 * checkpoint lacks starts at zero), verifies every checksum (the chunks are spread over
 * the ranks), then each rank reads its own parameters, the moments of its optimizer
 * ranges and the momentum of the Muon matrices it owns. *step: the step to run next.
 * Collective over world; agreed. */
typedef struct {
    const ts_config *cfg;
    ts_model *model;
    ts_adamw *optim;
    ts_muon *muon;            /* train.optimizer = "muon": the owned matrices' momentum
                               * (read whole); NULL under AdamW */
    const ts_comm *world;
} ts_ckpt_load_args;
ts_status ts_ckpt_load(const ts_ckpt_load_args *a, const char *step_dir, int *step);

/* tessera ckpt verify: every header and chunk checksum, the tensor list against the
 * checkpoint's own config, file sizes. */
typedef enum {
    TS_CKPT_OK = 0,
    TS_CKPT_ERROR = 1,         /* the check itself failed (a system error: too many open
                                * files, EIO): no verdict on the data */
    TS_CKPT_BAD_STATE = 3,     /* state.json missing, unreadable or malformed */
    TS_CKPT_INCOMPLETE = 4,    /* a file or tensor missing, a file truncated or resized */
    TS_CKPT_CORRUPT = 5,       /* a checksum does not match */
} ts_ckpt_verdict;
ts_ckpt_verdict ts_ckpt_verify(const char *step_dir, bool verbose);

/* tessera ckpt info: a summary on stdout. */
ts_status ts_ckpt_print_info(const char *step_dir);

#endif
