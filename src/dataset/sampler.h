/* The training data's order (docs/CONTRACT.md "The batch rule"): global sequence g of
 * the run goes to a dataset of the blend by Megatron's rule (blend.h) as that dataset's
 * sample j; sample j is epoch e = j / S_d of the dataset, window perm_{d,e}(j mod S_d)
 * of its S_d windows with data.shuffle (permutation.h, keyed by (data.seed, d, e)), or
 * window j mod S_d without. Every rank computes the same from the step alone, so the
 * data a step sees depends on neither the grid nor the micro-batch split, and a resumed
 * run continues exactly (the position is the sequences consumed before the step: step x
 * global batch, or under train.batch_rampup the sum of the steps' batches). */
#ifndef TS_SAMPLER_H
#define TS_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "dataset/blend.h"
#include "dataset/loader.h"
#include "dataset/permutation.h"

/* What a sampler reads: n_patterns paths or glob patterns, pattern i of dataset
 * set_of[i] (NULL: all of dataset 0), n_sets datasets with weights (NULL: equal). */
typedef struct {
    const char *key;                  /* "data.train", for messages */
    const char *const *patterns;
    int n_patterns;
    const int *set_of;
    int n_sets;
    const double *weights;
    bool shuffle;
    uint64_t seed;
    int vocab_size, seq_len;
} ts_sampler_spec;

typedef struct {
    int n_sets;
    ts_dataset sets[TS_MAX_DATASETS];
    uint64_t windows[TS_MAX_DATASETS];  /* S_d, each >= 1 */
    bool shuffle;
    uint64_t seed;
    int T;
    ts_blend blend;                     /* the cursor, at the end of the cached step */
    /* The samples of one step, computed once for all its micro-batches (a pipeline
     * schedule loads them out of order). */
    int64_t seq0;                       /* its first global sequence; -1: none cached */
    int global_batch;                   /* its batch */
    int *set_of_seq;                    /* [global_batch] */
    uint64_t *window_of_seq;            /* [global_batch] */
    /* The last permutation built for each dataset (its epoch), reused while the epoch
     * lasts. */
    ts_perm perm[TS_MAX_DATASETS];
    int64_t perm_epoch[TS_MAX_DATASETS];
} ts_sampler;

/* Open every dataset (globs expanded, files checked) and check each holds at least one
 * window of seq_len + 1 tokens. */
ts_status ts_sampler_open(ts_sampler *s, const ts_sampler_spec *spec);
void ts_sampler_close(ts_sampler *s);

/* Window of dataset d for its sample j (the epoch permutation applied). */
uint64_t ts_sampler_window(ts_sampler *s, int d, uint64_t j);

/* Compute (and cache) the step's global sequences seq0 .. seq0 + global_batch - 1 (seq0:
 * the sequences consumed before it, step x global_batch without a ramp-up). */
void ts_sampler_prepare(ts_sampler *s, int64_t seq0, int global_batch);

/* The batch rule: fill inputs/targets [micro_batch, T] for micro-batch `mb` of
 * data-parallel rank `dp_rank` of the step whose B = global_batch sequences start at
 * global sequence seq0: sequence i in [dp_rank*B/dp + mb*micro_batch, ... + micro_batch)
 * is global sequence g = seq0 + i, read from the dataset and window the blend and the
 * permutation give it. */
void ts_data_microbatch(ts_sampler *s, int64_t seq0, int global_batch, int dp, int dp_rank,
                        int micro_batch, int mb, int T, int *inputs, int *targets);

/* After ts_sampler_prepare(seq0, B): how many sequences of each dataset the run's first
 * seq0 + B took (counts[n_sets]). */
void ts_sampler_counts(const ts_sampler *s, uint64_t *counts);

/* Validation's window i of n over a stream of S windows: floor(i * S / n), spread over
 * the whole stream (every shard), not its first n. */
uint64_t ts_data_val_window(uint64_t i, uint64_t n, uint64_t S);

#endif
