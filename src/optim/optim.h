/* AdamW over a model's flat buffers and global-norm clipping (docs/CONTRACT.md
 * "Optimizer"; the learning rate each step follows: config.h ts_lr_schedule). The optimizer owns the AdamW moments of the ranges of the
 * flat buffers this rank updates: all of them, or with ZeRO-1 its piece of every
 * data-parallel bucket (data/reducer.h). The norm is a sum of squares that callers
 * reduce across ranks before taking the root, so clipping is grid-wide. */
#ifndef TS_OPTIM_H
#define TS_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "model/model.h"

/* Sum of squares of this rank's gradients over unique parameters (tied copies are
 * skipped: the tensor they copy is counted where it lives; tp-replicated parameters
 * count on tp rank 0 only), over the floats [begin, end) of the gradient buffer only:
 * the parts of the parameters that fall inside (a ZeRO-1 shard; [0, num_floats) for
 * the whole buffer). */
double ts_grad_sum_squares_range(const ts_model *m, size_t begin, size_t end);

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (norm + 1e-6));
 * 1 when max_norm <= 0 (clipping off). */
float ts_clip_coef(double norm, double max_norm);

/* [begin, end): floats of the flat parameter/gradient buffers. */
typedef struct {
    size_t begin, end;
} ts_flat_range;

/* AdamW's state: the ranges this rank updates, in ascending order, and their first and
 * second moments, range after range (moment k of range r at m[base_r + k]). */
typedef struct {
    int n_ranges;
    ts_flat_range *ranges;
    size_t n_floats;      /* the floats of every range: the size of m and of v */
    float *m, *v;         /* zero at the start; device memory of k */
    double *norm_acc;     /* device: the step's sum of squares, read back once */
    /* One span per parameter part inside each range (kernels.h), for one
     * adamw_update_spans call per step: built once from the model's layout. */
    ts_adamw_span *spans;      /* device memory of k, n_spans of them */
    int n_spans;
    const ts_kernels *k;
    bool sharded;         /* ZeRO-1: the ranges are this rank's 1/dp of the data-parallel
                           * replica, so every dp rank counts its own in the norm */
    /* ZeRO-2/3: the gradients (and with ZeRO-3 the master weights) of the ranges are
     * compact, range after range as the moments are (ts_adamw_set_compact); NULL: the
     * model's full-size buffers at the ranges' own offsets. */
    float *grads, *params;
    /* Parameters left to another optimizer (ts_adamw_exclude: Muon's matrices), or NULL:
     * [n_params] of the model; their floats get no moments and no update. Owned. */
    bool *excluded;
    /* The spans of the counted parameters (ts_tp_param_counts) for the update's sum of
     * squares (ts_adamw_update_sum_squares), device memory; built with `spans`. */
    ts_adamw_span *count_spans;
    int n_count_spans;
    size_t count_floats;  /* the floats of count_spans */
} ts_adamw;

/* Moments for the whole model (every float of the flat buffers). */
void ts_adamw_init(ts_adamw *o, const ts_model *m);
/* Moments for the given ranges of model m only (copied; ascending and disjoint);
 * `sharded` as above; the moments are device memory of m's backend. The state steps m
 * (or a model of the same layout) from then on. */
void ts_adamw_init_ranges(ts_adamw *o, const ts_model *m, const ts_flat_range *ranges,
                          int n_ranges, bool sharded);
/* ZeRO-2/3: the ranges' gradients live compact in `grads` (device memory of n_floats,
 * laid out as the moments), and with `params` non-NULL their master weights too; the
 * step and the norm read them there. Not owned. */
void ts_adamw_set_compact(ts_adamw *o, const ts_model *m, float *grads, float *params);
/* Leave the parameters marked in excluded[n_params] (copied) to another optimizer: their
 * floats lose their moments (the moments are reallocated, zero, for the other floats of
 * the ranges, range after range, parameter after parameter, without the gaps between
 * parameters) and the step leaves them alone. The ranges, and so the norm and the
 * compact ZeRO-2/3 layout, are unchanged. Call before the first step. */
void ts_adamw_exclude(ts_adamw *o, const ts_model *m, const bool *excluded);
/* Where the moments of parameter p's part inside range r start in m and v, or SIZE_MAX
 * when p has no part in r or is excluded (what a checkpoint reads and writes). O(ranges
 * x parameters) a call: a loop over every part keeps its own count instead (the parts'
 * moments follow each other in range, then parameter order, when some are excluded). */
size_t ts_adamw_moment_offset(const ts_adamw *o, const ts_model *m, int r, int p);
void ts_adamw_free(ts_adamw *o);
/* Bytes of the two moment buffers (the optimizer state this rank holds). */
size_t ts_adamw_state_bytes(const ts_adamw *o);

/* Sum of squares of the gradients in the optimizer's ranges (ts_grad_sum_squares_range's
 * count-once rules). With a replicated state (not sharded) only one dp rank should count. */
double ts_adamw_grad_sum_squares(const ts_adamw *o, const ts_model *m);
/* The same over the expert tensors only (`experts`) or the others only (ts_param.expert):
 * under expert parallelism the two are counted once by different ranks (an expert's
 * gradient is the same on its edp group, a dense one on the replica group). */
double ts_adamw_grad_sum_squares_of(const ts_adamw *o, const ts_model *m, bool experts);

/* One AdamW step (t = 1-based step count) on the parameters inside the optimizer's
 * ranges: gradients are first multiplied by grad_scale; weight decay only on tensors
 * marked `decay`. Parameters outside the ranges are left alone (ZeRO-1 all-gathers them).
 * One adamw_update_spans call for all of it. */
void ts_adamw_step(ts_adamw *o, ts_model *m, const ts_train_config *tc, double lr,
                   float grad_scale, int t);

/* After ts_adamw_step(.., lr, .., t): the sum of the squared changes of the counted
 * parameters' floats in the ranges (every float once per replica: the tied copy and tp
 * ranks 1.. of a replicated tensor are skipped), rebuilt from the new moments; with
 * *n_floats their count. For the metrics' update RMS. */
double ts_adamw_update_sum_squares(const ts_adamw *o, const ts_model *m,
                                   const ts_train_config *tc, double lr, int t, size_t *n_floats);

#endif
