/* The training run: build the model, feed it the batch rule's micro-batches, take
 * AdamW steps, evaluate, and report metrics. One training step reads top to bottom in
 * ts_trainer_step(). */
#ifndef TS_TRAINER_H
#define TS_TRAINER_H

#include <stdio.h>

#include <mpi.h>

#include "comm/comm.h"
#include "config/config.h"
#include "data/grad_sync.h"
#include "data/loader.h"
#include "model/model.h"

typedef struct {
    double loss;        /* mean cross-entropy over the global batch */
    double grad_norm;   /* before clipping */
    double lr;
    double step_ms;
    double tokens_per_s;
    long long tokens;   /* tokens in the step (global) */
    double dp_overlap;  /* fraction of the dp all-reduce hidden behind compute */
} ts_step_stats;

typedef struct {
    ts_config cfg;
    MPI_Comm world;
    int rank, world_size;
    ts_comm world_comm, dp_comm;
    int dp_rank;
    ts_grad_sync grad_sync;

    ts_model model;
    ts_dataset train_data, val_data;
    int has_val;

    int num_microbatches;
    ts_acts acts;       /* one micro-batch through every layer */
    ts_scratch scratch;
    float *dx;          /* [micro_batch * T, C] residual-stream gradient */

    FILE *metrics;      /* rank 0 only; NULL when off */
} ts_trainer;

/* Everything that can fail for a user reason (data files, model.init) fails here,
 * agreed across ranks: either every rank returns TS_OK or every rank TS_ERR. */
ts_status ts_trainer_init(ts_trainer *t, const ts_config *cfg, MPI_Comm world);
void ts_trainer_free(ts_trainer *t);

/* One optimizer step (0-based `step`). */
void ts_trainer_step(ts_trainer *t, int step, ts_step_stats *out);

/* Mean validation loss over data.val_windows windows of the validation data. */
double ts_trainer_eval(ts_trainer *t);

/* Run train.steps steps with metrics, progress and periodic validation. */
ts_status ts_trainer_run(ts_trainer *t);

#endif
