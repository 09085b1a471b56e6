/* train.batch_rampup: the global batch ramped up by samples consumed, Megatron-LM's
 * step_batch_size_schedule (megatron/core/num_microbatches_calculator.py,
 * StepBatchsizeNumMicroBatchesCalculator; docs/CONTRACT.md "Training"). "THRESHOLD:BATCH
 * ..." entries, separated by spaces or commas, each value an integer or decimal with an
 * optional K/M/B/T suffix (1e3 .. 1e12, either case), truncated to an integer as Megatron's
 * int(float(v) * multiplier). Thresholds are tokens, converted to samples (windows of
 * model.seq_len tokens) by floor division, as Megatron's trainer does (it always passes
 * seq_length); a first word "samples" gives them in samples instead ("tokens" says the
 * default). Sorted by threshold, the first must be 0 and each strictly above the one
 * before (after the conversion). A step's batch is that of the last entry whose
 * threshold is at most the samples consumed before the step. Nothing here prints. */
#ifndef TS_BATCH_RAMPUP_H
#define TS_BATCH_RAMPUP_H

#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "core/error.h"

#define TS_RAMPUP_MAX 64

typedef struct {
    int n;                        /* entries; 0 = off (the batch is train.global_batch) */
    bool tokens;                  /* the thresholds were written in tokens */
    int64_t at[TS_RAMPUP_MAX];    /* threshold in samples, ascending, at[0] = 0 */
    int batch[TS_RAMPUP_MAX];     /* the global batch from at[i] samples on */
    char text[TS_RAMPUP_MAX][40]; /* entry i as written, for messages */
} ts_batch_rampup;

/* Parse `spec` ("" = off) with thresholds in tokens converted at seq_len. */
ts_status ts_batch_rampup_parse(const char *spec, int seq_len, ts_batch_rampup *r);

/* Whether two parsed ramp-ups are the same schedule in samples. */
bool ts_batch_rampup_same(const ts_batch_rampup *a, const ts_batch_rampup *b);

/* Index of the entry in force after `consumed` samples (-1 when off). */
int ts_batch_rampup_entry(const ts_batch_rampup *r, int64_t consumed);

/* The global batch of a step that starts after `consumed` samples: the entry's, or
 * `global_batch` when off. */
int ts_batch_rampup_batch(const ts_batch_rampup *r, int64_t consumed, int global_batch);

/* Samples consumed before step `step`, counting from `consumed0` before step `step0`
 * (step >= step0): each step takes the batch in force at its start. O(entries). */
int64_t ts_batch_rampup_consumed(const ts_batch_rampup *r, int global_batch, int step0,
                                 int64_t consumed0, int step);

/* The config's rules for train.batch_rampup (ts_config_validate): it parses; its last
 * entry's batch is train.global_batch (the batch the run settles at, which the memory
 * check, the planner, MFU's reference and the LR schedule's unit are counted for) and
 * none is larger; every entry's batch keeps the batch rule (a whole number >= 1 of
 * dp * micro_batch); and parallel.schedule is a built-in schedule (a CSV lists a fixed
 * number of micro-batches). Each message names the entry. */
ts_status ts_config_check_batch_rampup(const ts_config *cfg);

/* "0:8 (0 samples) -> 8, 4096:16 (256 samples) -> 16" style description into buf. */
const char *ts_batch_rampup_describe(const ts_batch_rampup *r, char *buf, size_t size);

#endif
