/* What the trainer's files share (src/train/): trainer.c (init, step, run, free)
 * calls these; each lives in the file named for its job. Not for use outside train/. */
#ifndef TS_TRAIN_INTERNAL_H
#define TS_TRAIN_INTERNAL_H

#include "train/trainer.h"

/* ---- setup.c: device, data, partition, memory check */
ts_status ts_trainer_select_device(ts_trainer *t);
ts_status ts_trainer_open_data(ts_trainer *t);
/* Every rank reads the same data under each path (token counts and crc32s). Collective;
 * call on every rank once ts_trainer_open_data succeeded everywhere. */
ts_status ts_trainer_agree_data(ts_trainer *t);
/* Rank 0's start-up lines on the data: the order, each dataset's files, tokens and
 * windows, and the epochs of each the run will take. */
void ts_trainer_log_data(const ts_trainer *t);
ts_status ts_trainer_build_partition(ts_trainer *t);
ts_status ts_trainer_check_memory(ts_trainer *t, bool log);

/* ---- rampup.c: train.batch_rampup (config/batch_rampup.h) in the trainer */
/* Parse the ramp-up and build the schedule of every batch it names, so a batch the
 * schedule cannot run (too few micro-batches for it) fails at start-up, naming the
 * entry. Agreed by the caller (every rank computes the same). */
ts_status ts_trainer_rampup_init(ts_trainer *t);
/* The samples consumed before step `step` (step x global_batch without a ramp-up). */
int64_t ts_trainer_rampup_consumed(const ts_trainer *t, int step);
/* Before step `step`: its batch and first sequence (t->step_batch, t->step_seq0), and
 * when its micro-batch count differs from the schedule's, the schedule, the engine and
 * ZeRO's residency rebuilt for it (between steps, identically on every rank). */
ts_status ts_trainer_rampup_step(ts_trainer *t, int step);
/* The learning rate of step `step` from `s` at the fractional step consumed(step) /
 * train.global_batch, Megatron's rule (its schedule counts samples, in units of the
 * final global batch); without a ramp-up that is the step itself, exactly. */
double ts_trainer_rampup_lr(const ts_trainer *t, const ts_lr_schedule *s, int step);
/* Resuming (checkpointing.c, with the checkpoint's state.json open): the ramp-up it
 * recorded and the sequences it consumed. A ramp-up that would give another batch on a
 * step this run takes is refused unless train.allow_schedule_change (then warned); the
 * data position continues from the recorded sequences either way. */
ts_status ts_trainer_rampup_resume(ts_trainer *t, const char *was_spec, int64_t was_consumed);
/* The first step in [from, to) whose learning rate differs between two schedules as
 * this run takes them (ts_trainer_rampup_lr), or -1. */
int ts_trainer_rampup_lr_diverges(const ts_trainer *t, const ts_lr_schedule *a,
                                  const ts_lr_schedule *b, int from, int to);

/* ---- report.c: the metrics file, start-up and end-of-run reports, progress, trace */
ts_status ts_trainer_open_outputs(ts_trainer *t);
ts_status ts_trainer_metrics_line(ts_trainer *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Whether rank 0 writes metrics lines anywhere (log.metrics or log.tensorboard). */
bool ts_trainer_reporting(const ts_trainer *t);
ts_status ts_trainer_report_blas(ts_trainer *t);
/* The step's metrics line and, with log.progress, its progress line (avg_ms: the mean
 * step time so far, for the ETA). */
ts_status ts_trainer_report_step(ts_trainer *t, int step, const ts_step_stats *s, double avg_ms);
ts_status ts_trainer_report_memory(ts_trainer *t);
/* Tracing (log.trace): the replica, tp and cp groups' span hooks (comm.h ts_comm_span_fn:
 * each collective a span on this rank's communication track, categories "dpreduce",
 * "tpcomm", "cpcomm"), one span of category `cat` on this rank's track, and the Chrome
 * trace written at the end. */
void ts_trainer_on_replica_span(void *ctx, const char *what, size_t bytes, double t0, double t1);
void ts_trainer_on_tp_span(void *ctx, const char *what, size_t bytes, double t0, double t1);
void ts_trainer_on_cp_span(void *ctx, const char *what, size_t bytes, double t0, double t1);
void ts_trainer_trace_span(ts_trainer *t, const char *cat, double t0, double t1);
/* An ep exchange's span (tensor/expert_dispatch.h's on_span): "a2a" on the communication
 * track, its blocked part "a2await" on the main track. */
void ts_trainer_on_a2a_span(void *ctx, const ts_expert_span *s);
ts_status ts_trainer_write_trace(ts_trainer *t);

/* ---- tensorboard.c: log.tensorboard's event file (rank 0), opened before the first
 * step (a directory that cannot be written fails the start-up), and one Event of every
 * number of a metrics line (called by ts_trainer_metrics_line with the line's text; its
 * step is the line's "step", else the last reported step). */
ts_status ts_trainer_open_tensorboard(ts_trainer *t);
ts_status ts_trainer_tensorboard_line(ts_trainer *t, const char *text);

/* ---- straggler.c: each rank's compute and wait time of the step in slots [2 * world]
 * of the step's max all-reduce (zeroed, then each rank puts its own); from the reduced
 * slots the step's straggler metrics (out) and, on rank 0, the window's sums; every
 * log.straggler_every steps (after step `step`) rank 0's one-line report. */
void ts_straggler_put(double *slots, int rank, double compute_ms, double wait_ms);
void ts_straggler_step(ts_trainer *t, const double *slots, ts_step_stats *out);
void ts_straggler_report(ts_trainer *t, int step);

/* ---- optimizer.c: the optimizer state beside the data-parallel one, and the step */
/* After the data-parallel set-up made AdamW's state: under train.optimizer = "muon",
 * Muon's state for the Muon matrices and AdamW's moments narrowed to the rest. */
void ts_trainer_optimizer_init(ts_trainer *t);
/* The step's update of this rank's parameters (AdamW, and Muon's matrices), lr the
 * schedule's, grad_scale the clipping coefficient, t the 1-based step; the update RMS of
 * each group into out under Muon (collective over the world then). */
void ts_trainer_optimizer_step(ts_trainer *t, double lr, float grad_scale, int step1,
                               ts_step_stats *out);

/* ---- checkpointing.c: checkpoint.dir's claim, checkpoint.load, saves and their commit */
ts_status ts_trainer_claim_checkpoint_dir(ts_trainer *t);
ts_status ts_trainer_load_checkpoint(ts_trainer *t);
ts_status ts_trainer_save_checkpoint(ts_trainer *t, int step, bool may_defer);
ts_status ts_trainer_finish_save(ts_trainer *t);

#endif
