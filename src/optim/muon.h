/* Muon (train.optimizer = "muon"; docs/ARCHITECTURE.md "Optimizer: Muon"): momentum
 * orthogonalised by a Newton-Schulz iteration for every 2-D matrix inside the blocks (and
 * the MTP modules), AdamW (optim/optim.h) for the rest. torch.optim.Muon's semantics, per
 * logical matrix W [rows, cols] with its reduced, clipped gradient G:
 *   buf = mu*buf + (1-mu)*G;  U = nesterov ? G + mu*(buf - G) : buf
 *   X = U (transposed when rows > cols), X /= max(||X||_F, 1e-7);
 *   ns_steps times: A = X X^T; B = b*A + c*A A; X = a*X + B X   ((a, b, c) per step)
 *   W *= 1 - lr*wd (when the parameter decays);  W -= lr * scale(rows, cols) * X.
 * rows and cols are always the LOGICAL (Hugging Face) shape, never a tp shard's.
 *
 * This header is the numerical core (the iteration, the scale, which parameters) and the
 * state of one rank: the momentum of the Muon matrices it owns (their local floats, in
 * its own compact fp32 buffer; AdamW keeps no moments for them). One rank owns every
 * matrix; the distributed Muon chooses owners and calls the same pieces. */
#ifndef TS_OPTIM_MUON_H
#define TS_OPTIM_MUON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "model/model.h" /* with kernels/kernels.h: the backend table */

/* torch.optim.Muon's limit on the iteration's steps (train.muon_ns_steps <= 99). */
#define TS_MUON_MAX_NS_STEPS 99

typedef enum { TS_MUON_MATCH_RMS_ADAMW, TS_MUON_ORIGINAL } ts_muon_scale_kind;

/* The train keys resolved: the coefficients of every step (train.muon_coefficients:
 * "torch" (3.4445, -4.7750, 2.0315) each step; "quintic" its five tuples, steps past the
 * fifth reusing the last; "deepseek_v4" 8 torch steps then 2 of (2, -1.5, 0.5)). */
typedef struct {
    float momentum;
    bool nesterov;
    int ns_steps;
    float coef[TS_MUON_MAX_NS_STEPS][3]; /* (a, b, c) of step i */
    ts_muon_scale_kind scale;
    double eps; /* the normalisation's floor, torch's 1e-7 */
} ts_muon_config;

void ts_muon_config_of(const ts_train_config *tc, ts_muon_config *c);

/* Newton-Schulz's cost of one iteration of a [rows, cols] matrix, s^2 * (2l + s) with
 * s = min(rows, cols), l = max (Megatron's layer-wise bin-packing weight): the relative
 * FLOPs an owner spends on it (times 2 * ns_steps for FLOPs). */
double ts_muon_ns_cost(int64_t rows, int64_t cols);

/* Whether parameter p of m is one of Muon's: a 2-D tensor of a block (q, k, v, o; gate,
 * up, down; the router, every expert's and shared expert's matrices; every MLA
 * projection), or of an MTP module (its block's and eh_proj) — not the embedding (nor
 * the MTP's copy of it), the head, norms or biases. Decided from the layer kind, the
 * tensor's dimensions and its logical name, so every rank agrees. */
bool ts_param_is_muon(const ts_model *m, int p);

/* The update's scale for a logical [rows, cols] matrix: "match_rms_adamw"
 * 0.2 * sqrt(max(rows, cols)) (Moonlight's), "original" sqrt(max(1, rows / cols)). */
double ts_muon_scale(const ts_muon_config *c, int64_t rows, int64_t cols);

/* Bytes of device scratch ts_muon_orthogonalize needs for a [rows, cols] matrix (any
 * backend). */
size_t ts_muon_scratch_bytes(int64_t rows, int64_t cols);

/* X = NS(X) in place: x is device memory of k, fp32 [rows * cols], the logical matrix
 * row-major; its orthogonalised form comes back. The GEMMs run on k->gemm in the table's
 * act_dtype (bf16 operands with fp32 accumulation under bf16, fp32 otherwise); the
 * iterate itself stays fp32 between steps. Reads the norm back to the host once. */
void ts_muon_orthogonalize(const ts_muon_config *c, const ts_kernels *k, float *x, int64_t rows,
                           int64_t cols, void *scratch);

/* One rank's Muon state: the matrices it owns and their momentum. */
typedef struct {
    ts_muon_config cfg;
    const ts_kernels *k;
    int n;               /* the Muon matrices this rank owns */
    int *param;          /* [n] their parameter indices in the model, ascending */
    size_t *offset;      /* [n] where each one's momentum starts in `momentum` */
    size_t n_floats;     /* momentum floats: the owned matrices' local floats */
    float *momentum;     /* device, zero at the start */
    float *work;         /* device: the update of the largest owned (logical) matrix */
    void *scratch;       /* device: ts_muon_scratch_bytes of the largest */
    double *acc;         /* device: the step's sum of squared changes */
    size_t count_floats; /* the owned matrices' counted floats (ts_tp_param_counts) */
} ts_muon;

/* Muon for the n parameters params[] of m (Muon matrices, ascending, held whole by this
 * rank), momentum zero; ts_muon_init_all: every Muon matrix of m (one rank). */
void ts_muon_init(ts_muon *o, const ts_model *m, const ts_train_config *tc, const int *params,
                  int n);
void ts_muon_init_all(ts_muon *o, const ts_model *m, const ts_train_config *tc);
void ts_muon_free(ts_muon *o);
/* Bytes of the momentum (the optimizer state Muon holds). */
size_t ts_muon_state_bytes(const ts_muon *o);
/* The flags ts_adamw_exclude takes: excluded[p] for every Muon matrix of m ([n_params],
 * caller frees). */
bool *ts_muon_mask(const ts_model *m);

/* One Muon step on matrix i of the state: its momentum from grad (its local floats,
 * times grad_scale), the iteration, the update of param (its floats) with the schedule's
 * lr and train.weight_decay (when the parameter decays). With acc (device) non-NULL the
 * squared changes are added to acc[0]. The matrix must be whole on this rank. */
void ts_muon_matrix_step(ts_muon *o, const ts_model *m, int i, float *param, const float *grad,
                         float grad_scale, double lr, double weight_decay, double *acc);
/* Every owned matrix, its parameters and gradients in m's full-size buffers. Returns the
 * sum of the squared changes of the counted floats (the metrics' update RMS: divide by
 * count_floats). */
double ts_muon_step(ts_muon *o, ts_model *m, const ts_train_config *tc, double lr,
                    float grad_scale);

#endif
