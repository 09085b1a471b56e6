/* The spike guard (train.skip_spikes = Z, train.spike_window = W; docs/CONTRACT.md
 * "Training", docs/ARCHITECTURE.md "The spike guard"): llm.c's OutlierDetector
 * (llmc/outlier_detector.h, used by train_gpt2.cu's -sl/-sg) over the step's global loss
 * and gradient norm, and the decision to leave a step's update out.
 *
 * llm.c's rule, followed: each step's value is pushed into a window of the last W values
 * (the oldest dropped once W are held) and its z-score is (x - mean) / std over the
 * window AFTER the push (the value itself included; population std, divided by W); no
 * z-score (NaN) until W values were held before the push (the first W steps); a std of 0
 * gives z = 0; a step is skipped when a z-score is > Z (spikes upward only). A skipped
 * step's values stay in the window, as in llm.c. Where Tessera differs, and why:
 *   - one Z for both the loss and the norm (llm.c: -sl and -sg);
 *   - the mean and variance are computed afresh from the window, oldest value first, in
 *     two passes (llm.c keeps running sums, += and -= each step): the result is then a
 *     function of the W values alone, not of the run's whole history of roundings, so a
 *     resumed run, which restores just the values, decides bit for bit as the
 *     uninterrupted run would; and the two-pass variance is never negative;
 *   - a step with a non-finite loss or norm (train.on_nonfinite) enters nothing (llm.c
 *     pushes the NaN, which then poisons its sums for good);
 *   - the window is kept in checkpoints (state.json's "spike_guard").
 * Since the new value is in the window, its z-score is at most sqrt(W - 1) (all the others
 * equal); a Z at or above that could never skip, and the config refuses it. */
#ifndef TS_SPIKE_GUARD_H
#define TS_SPIKE_GUARD_H

#include <jansson.h>
#include <stdbool.h>

#include "comm/comm.h"
#include "core/error.h"

typedef struct {
    double z;          /* train.skip_spikes: the threshold; 0 = off (nothing below runs) */
    int window;        /* train.spike_window: W */
    int count;         /* values held, <= window */
    double *loss;      /* [window]: the last `count` losses, oldest first */
    double *norm;      /* [window]: the gradient norms of the same steps */
    long long skipped; /* steps skipped as spikes since step 0 (kept across resumes) */
} ts_spike_guard;

/* One step's verdict, for the metrics and the step. */
typedef struct {
    bool on;           /* the guard runs (train.skip_spikes > 0) */
    bool skip;         /* the step's update is not applied */
    double loss_z;     /* NaN while the window fills, and for a non-finite step */
    double norm_z;
    long long skipped; /* the guard's count after this step */
} ts_spike_verdict;

/* z: train.skip_spikes (0: off), window: train.spike_window (>= 2). */
void ts_spike_guard_init(ts_spike_guard *g, double z, int window);
void ts_spike_guard_free(ts_spike_guard *g);

/* One value pushed into a window `w` of `*count` of `cap` values (oldest first, the
 * oldest dropped when full), and its z-score as llm.c's update_detector returns it: NaN
 * when the window was not full before the push. Exposed for the unit test. */
double ts_spike_push(double *w, int *count, int cap, double x);

/* The step's verdict from its global loss and gradient norm (the same bits on every
 * rank: both are sums over the whole grid, which the clipping and the non-finite check
 * read too). `finite`: both are finite (else nothing enters the window and the step is
 * not a spike: train.on_nonfinite handles it). A skipped step is said on stderr (rank 0) with its z-scores, naming `step`. */
ts_spike_verdict ts_spike_guard_step(ts_spike_guard *g, int step,
                                     bool finite, double loss, double norm);

/* The verdict's metrics keys, ",\"spike_skipped\":0,\"spikes_skipped\":N,\"loss_z\":x,
 * \"grad_norm_z\":y" (null while the window fills), or "" when the guard is off. */
void ts_spike_verdict_json(const ts_spike_verdict *v, char *buf, size_t cap);

/* state.json's "spike_guard": {"window", "loss": [...], "grad_norm": [...], "skipped"},
 * oldest first; NULL when the guard is off. A new reference. */
json_t *ts_spike_guard_state(const ts_spike_guard *g);
/* Restore from state.json's "spike_guard" (`state`: NULL when the checkpoint has none,
 * saved without the guard: the window starts empty). Another window size keeps the
 * newest values that fit. A record that is no window (lengths, non-finite values) is
 * refused as damaged, naming `dir`. Nothing happens when the guard is off. */
ts_status ts_spike_guard_restore(ts_spike_guard *g, const json_t *state, const char *dir);

#endif
