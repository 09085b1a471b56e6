/* The training run: build this rank's part of the model from the partition, run the
 * pipeline schedule for each step, synchronise gradients across the grid, take AdamW
 * steps, evaluate, and report metrics. One training step reads top to bottom in
 * ts_trainer_step(). */
#ifndef TS_TRAINER_H
#define TS_TRAINER_H

#include <stdio.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/claim.h"
#include "comm/comm.h"
#include "config/batch_rampup.h"
#include "config/config.h"
#include "core/trace.h"
#include "core/tfevents.h"
#include "data/zero.h"
#include "dataset/loader.h"
#include "dataset/sampler.h"
#include "dataset/hellaswag.h"
#include "model/model.h"
#include "optim/muon.h"
#include "data/muon_dist.h"
#include "optim/optim.h"
#include "pipeline/engine.h"
#include "pipeline/partition.h"
#include "pipeline/schedule.h"
#include "topology/topology.h"
#include "train/spike_guard.h"

typedef struct {
    double loss;        /* mean cross-entropy over the global batch */
    double grad_norm;   /* before clipping */
    double lr;
    double step_ms;
    double tokens_per_s;
    long long tokens;   /* tokens in the step (global) */
    double bubble;      /* idle fraction of the pipeline ranks, averaged */
    double model_flops; /* data.document_mask: this step's model FLOPs, attention counted
                           by the pairs computed (0: the trainer's model_flops) */
    double dp_overlap;  /* fraction of the dp all-reduce hidden behind compute */
    double dp_wait_ms;  /* time blocked finishing the dp all-reduce (max over ranks) */
    double dp_bytes;    /* gradient bytes each replica all-reduces per step */
    double tp_comm_ms;  /* time in tensor-parallel all-reduces (max over ranks) */
    double cp_comm_ms;  /* time in context parallelism's K/V exchange (max over ranks) */
    bool skipped;       /* the loss or gradient norm was not finite: no update applied */
    ts_spike_verdict spike; /* train.skip_spikes: the z-scores and whether the step was a
                               spike, not applied either (spike_guard.h) */
    /* Mixture of Experts (model.moe_experts > 0): the step's auxiliary losses summed over
     * the MoE blocks (the balance loss's and the z-loss's values, coefficients included;
     * `loss` stays the cross-entropy), and the worst block's max/mean expert load. */
    bool moe;
    double moe_aux_loss, moe_z_loss, moe_max_load;
    double moe_dropped; /* model.moe_capacity > 0: the step's dropped share (else 0) */
    /* Expert parallelism (ep > 1: a2a): the step's ep exchanges, start to completion, and
     * the part blocked in their finishes (the longest rank's), and the share hidden,
     * 1 - blocked / total over every rank. */
    bool a2a;
    double a2a_ms, a2a_wait_ms, a2a_hidden;
    /* Multi-token prediction (model.mtp_layers = D > 0): each depth's loss as it enters
     * the objective, sum of its per-token cross-entropies over (global batch * seq_len)
     * (positions past the window count 0); the objective is loss + train.mtp_loss / D *
     * the sum of these. */
    int mtp_depths;
    double mtp_loss[64];
    /* train.optimizer = "muon": the RMS of the step's change (W_new - W_old) over the
     * Muon matrices' floats and over the AdamW group's, each logical float once over the
     * grid (0 for a skipped step). */
    bool muon;
    double update_rms_muon, update_rms_adamw;
    /* The optimizer's time (the longest rank's): from the end of the gradient reduction to
     * the updated weights (the trace's "optim" span: the norm, AdamW, Muon, the gathers
     * after the update), of it the parameter gathers after the update, and Muon's
     * momentum, Newton-Schulz and update of the matrices a rank owns (tp gathers of split
     * matrices included; 0 without Muon). */
    double optim_ms, optim_gather_ms, muon_ms;
    /* Stragglers (straggler.c): the rank with the most and the least compute time this
     * step, and the extremes over ranks of compute time (the step's time on the rank less
     * its waits) and wait time (pipeline idle, tp/cp collectives, ep waits, the dp
     * reduction's and ZeRO's gathers). */
    int rank_slowest, rank_fastest;
    double compute_ms_max, compute_ms_min, wait_ms_max, wait_ms_min;
    const int *moe_counts; /* [blocks * E]: the step's tokens routed to each expert of
                              each block over the global batch (the trainer's buffer, until
                              the next step; dense blocks' 0) */
} ts_step_stats;

typedef struct {
    ts_config cfg;
    const ts_topology *topo;
    /* The topology's groups (topology.h ts_groups), held by pointer: gradients are
     * reduced and ZeRO shards over groups->replica (dp * cp ranks holding the same
     * weights), the pipeline runs over groups->pp, tensor and context parallelism over
     * groups->tp and groups->cp. The trainer moves the groups that carry device memory
     * to the compute backend's data plane (setup.c) and observes tp, cp and replica
     * (busy_ms, on_span) until ts_trainer_free; the topology frees them. */
    ts_groups *groups;
    /* The compute backend (train.device); the groups carry its memory on the comm
     * backend that can (MPI for the CPU; staged through host buffers for memory the host
     * may not touch). */
    const ts_kernels *k;
    double tp_busy_ms;  /* this step's time in tp collectives (groups->tp.busy_ms) */
    double cp_busy_ms;  /* the same for the cp group's */

    ts_partition part;
    ts_schedule sched;
    int *recompute_keep;   /* [n_chunks]: parallel.recompute = "auto"'s caps for this rank's
                              chunks (the memory check chose them); NULL otherwise */
    bool *recompute_selective; /* [n_chunks]: auto's chunks laid out selective (the same
                                  choice); NULL otherwise */
    ts_model model;
    ts_engine engine;
    /* Data parallelism (src/data): the gradients summed over the embedding and kv
     * groups, the reducer of the gradients over the replicas, and the sharded (ZeRO)
     * optimizer state; each installs its own hooks in the engine and the model. */
    ts_group_sums sums;
    ts_reducer reducer;
    ts_zero_state zero;
    ts_adamw optim;     /* AdamW moments: the whole model, or this rank's ZeRO-1 shard
                           (under Muon: its non-Muon floats only) */
    bool use_muon;      /* train.optimizer = "muon" */
    ts_muon muon;       /* Muon's momentum of the matrices this rank owns (optimizer.c) */
    ts_muon_dist muon_dist; /* which those are, where their gradients and weights live */
    ts_lr_schedule lr_schedule; /* train's keys resolved once (config.h) */
    ts_spike_guard spike;   /* train.skip_spikes' window (spike_guard.h), kept in checkpoints */
    /* train.batch_rampup (train/rampup.c): the parsed ramp-up (n = 0: off), the data
     * position it counts from (the loaded checkpoint's step and sequences consumed, or 0
     * and 0), and the step under way's global batch and first sequence. */
    ts_batch_rampup rampup;
    int rampup_step0;
    int64_t rampup_seq0;
    int step_batch;
    int64_t step_seq0;
    ts_sampler train_data;  /* data.train: its datasets, blend and epoch order */
    ts_dataset val_data;
    /* data.train's shards, dataset after dataset, as every rank agreed on them (token
     * count, crc32), for the checkpoints to record; n_data of them (owned). */
    int n_data;
    uint64_t *data_tokens;
    uint32_t *data_crc;
    bool has_train, has_val;
    /* data.hellaswag (or `tessera eval --hellaswag`): the items, encoded at start-up on
     * every rank (src/dataset/hellaswag.h), scored by ts_trainer_hellaswag. */
    bool has_hellaswag;
    ts_hellaswag hellaswag;
    /* `tessera eval`: the model and the grid only (no data.train, no optimizer steps);
     * the weights come from model.init. */
    bool eval_only;

    ts_trace trace;     /* this rank's events when log.trace is set */
    bool tracing;
    double t0_ms;       /* run start, the trace's time origin */

    /* Checkpoints (checkpoint/checkpoint.h): the first step to run (the loaded
     * checkpoint's step, or 0), the step directory it came from, and whether the run
     * stopped early on SIGTERM/SIGUSR1 after saving (exit TS_EXIT_PREEMPTED). */
    int start_step;
    char loaded_from[TS_PATH_MAX + 64];
    bool preempted;     /* stopped by a signal with the state saved in checkpoint.dir */
    bool peak_reset;    /* the peak resident size restarted at the first step */
    double setup_peak_rss; /* the set-up's peak resident bytes, read before that restart */
    double estimate_bytes; /* the pre-flight estimate of this rank's peak (setup.c) */
    int stop_signal;    /* the signal that stopped the run early, or 0 */
    struct ts_ckpt_saver *saving;  /* checkpoint.async: a save still being written */
    int saving_step;
    bool saving_async;
    double saving_blocked_ms, saving_t0_ms;
    ts_ckpt_staging staging;   /* checkpoint.async's host copy, kept between saves */
    ts_ckpt_claim claim;       /* rank 0: the lock on checkpoint.dir, held for the run */

    /* MFU (docs/CONTRACT.md "Metrics"): the model FLOPs of one step, set by the caller
     * after ts_trainer_init (the planner's formula, plan/model_cost.h, a layer above;
     * 0: no MFU is reported), and the peak it is measured against, the GEMM rates the
     * ranks measured at start-up summed over the world (rank 0 only). */
    double model_flops;
    double mfu_peak_flops;
    /* data.document_mask: attention's FLOPs per query-key pair (model_flops counts the
     * whole T x T square of every sequence; a step's count replaces it by the pairs
     * the document masks leave: ts_step_stats.model_flops), set by the caller beside
     * model_flops; 0 otherwise. */
    double attn_flops_per_pair;

    int *moe_counts;    /* MoE: the last step's global counts [blocks * E] (moe_counts
                           of its ts_step_stats) */

    FILE *metrics;      /* rank 0 only; NULL when off */
    long metrics_end;   /* bytes of complete lines written */
    ts_tfevents tboard; /* log.tensorboard's event file: rank 0 only (ts_tfevents_is_open) */
    int report_step;    /* the last step reported: the TensorBoard step of a line without one */
    double *step_max;   /* [8 + 2 * world]: the step's max all-reduce of timings (trainer.c) */
    double *straggler_sum; /* rank 0, log.straggler_every > 0: each rank's compute ms summed
                              over the steps since the last report */
    int straggler_steps;   /* those steps */
} ts_trainer;

/* Everything that can fail for a user reason (schedule, partition, data files,
 * model.init, metrics file) fails here, agreed across ranks: either every rank returns
 * TS_OK or every rank TS_ERR, with the message of the lowest failing rank. The trainer
 * uses topo's groups in place (backend, observers) until ts_trainer_free; free the
 * topology after it. */
ts_status ts_trainer_init(ts_trainer *t, const ts_config *cfg, ts_topology *topo);
void ts_trainer_free(ts_trainer *t);
/* The same for `tessera eval`: no training data is opened (data.train is not read), the
 * data's checks are skipped; data.hellaswag (the file to score) is loaded. */
ts_status ts_trainer_init_eval(ts_trainer *t, const ts_config *cfg, ts_topology *topo);

/* HellaSwag (data.hellaswag) scored on the whole grid (collective): the items split over
 * the dp replicas, each micro-batch of their completions through the pipeline as
 * validation runs; the same scores on every rank. row_loss (NULL, or [n_rows]) receives
 * each completion's summed loss (-log-likelihood). */
void ts_trainer_hellaswag(ts_trainer *t, ts_hellaswag_score *out, double *row_loss);

/* One optimizer step (0-based `step`). */
void ts_trainer_step(ts_trainer *t, int step, ts_step_stats *out);

/* Mean validation loss over data.val_windows windows of the validation data; with
 * multi-token prediction each depth's into mtp_loss [mtp_layers] (when given), as the
 * metrics' mtp_loss. */
double ts_trainer_eval(ts_trainer *t, double *mtp_loss);

/* Run steps start_step .. train.steps - 1 with metrics, progress, validation, the
 * trace and checkpoints (every checkpoint.every steps, at the end, and on SIGTERM or
 * SIGUSR1, after which t->stop_signal is set (and t->preempted when it saved) and the
 * run returns TS_OK early). */
ts_status ts_trainer_run(ts_trainer *t);

#endif
