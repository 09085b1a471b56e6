/* Muon's numerical core and one rank's state (optim/muon.h). */
#include "optim/muon.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Keller Jordan's (torch.optim.Muon's defaults), the per-step quintic set and
 * DeepSeek-V4's closing pair (docs/REFERENCES "Muon"). */
static const float TORCH_COEF[3] = {3.4445f, -4.7750f, 2.0315f};
static const float QUINTIC_COEF[5][3] = {
    {4.0848f, -6.8946f, 2.9270f}, {3.9505f, -6.3029f, 2.6377f}, {3.7418f, -5.5913f, 2.3037f},
    {2.8769f, -3.1427f, 1.2046f}, {2.8366f, -3.0525f, 1.2012f}};
static const float DSV4_TAIL_COEF[3] = {2.0f, -1.5f, 0.5f};

void ts_muon_config_of(const ts_train_config *tc, ts_muon_config *c)
{
    memset(c, 0, sizeof *c);
    c->momentum = (float)tc->muon_momentum;
    c->nesterov = tc->muon_nesterov;
    c->ns_steps = ts_config_muon_ns_steps(tc);
    TS_ASSERT(c->ns_steps >= 1 && c->ns_steps <= TS_MUON_MAX_NS_STEPS);
    c->scale = strcmp(tc->muon_scale, "original") == 0 ? TS_MUON_ORIGINAL
                                                         : TS_MUON_MATCH_RMS_ADAMW;
    c->eps = 1e-7;
    const bool quintic = strcmp(tc->muon_coefficients, "quintic") == 0;
    const bool dsv4 = strcmp(tc->muon_coefficients, "deepseek_v4") == 0;
    for (int i = 0; i < c->ns_steps; i++) {
        const float *abc = TORCH_COEF;
        if (quintic) abc = QUINTIC_COEF[i < 5 ? i : 4];
        if (dsv4 && i >= c->ns_steps - 2) abc = DSV4_TAIL_COEF;
        memcpy(c->coef[i], abc, sizeof c->coef[i]);
    }
}

double ts_muon_ns_cost(int64_t rows, int64_t cols)
{
    const double s = (double)(rows < cols ? rows : cols), l = (double)(rows < cols ? cols : rows);
    return s * s * (2.0 * l + s);
}

bool ts_param_is_muon(const ts_model *m, int p)
{
    const ts_param *P = &m->params[p];
    if (P->shard.ndim != 2) return false;
    const ts_layer *L = &m->layers[P->layer];
    if (L->kind == TS_LAYER_BLOCK) return true;
    /* The MTP modules' tensors live in the head's layer, under DeepSeek-V3's names
     * model.layers.{n_layer + k - 1}.*: their block's matrices and eh_proj are Muon's,
     * the module's embedding copy and shared head are not. */
    if (L->kind != TS_LAYER_HEAD || m->mtp_layers == 0) return false;
    int block = -1, used = 0;
    if (sscanf(P->shard.name, "model.layers.%d.%n", &block, &used) != 1 || used == 0) return false;
    const char *rest = P->shard.name + used;
    return block >= m->n_layer && strncmp(rest, "embed_tokens", 12) != 0 &&
           strncmp(rest, "shared_head.head", 16) != 0;
}

double ts_muon_scale(const ts_muon_config *c, int64_t rows, int64_t cols)
{
    if (c->scale == TS_MUON_ORIGINAL) {
        const double ratio = (double)rows / (double)cols;
        return sqrt(ratio > 1.0 ? ratio : 1.0);
    }
    return 0.2 * sqrt((double)(rows > cols ? rows : cols));
}

static size_t align64(size_t b) { return (b + 63) / 64 * 64; }

size_t ts_muon_scratch_bytes(int64_t rows, int64_t cols)
{
    const size_t s = (size_t)(rows < cols ? rows : cols), n = (size_t)rows * (size_t)cols;
    /* the norm's accumulator; X in the GEMMs' dtype; A and B in fp32; A or B in the
     * GEMMs' dtype (4 bytes covers fp32 and bf16) */
    return 64 + align64(n * 4) + 2 * align64(s * s * 4) + align64(s * s * 4);
}

/* The iteration on the wide form (rows <= cols: X [s, l], A = X X^T, X = a X + B X) or,
 * without transposing anything, on the tall one (X [l, s], A = X^T X, X = a X + X B):
 * the transpose of the wide form's steps (B is symmetric). The first step folds the
 * normalisation into its GEMMs' scalars (X/n: A's alpha 1/n^2, the last GEMM's 1/n),
 * so no pass scales X. */
void ts_muon_orthogonalize(const ts_muon_config *c, const ts_kernels *k, float *x, int64_t rows,
                           int64_t cols, void *scratch)
{
    const bool tall = rows > cols;
    const int s = (int)(tall ? cols : rows), l = (int)(tall ? rows : cols);
    const size_t n = (size_t)rows * (size_t)cols, ss = (size_t)s * (size_t)s;
    const bool f32 = k->act_dtype == TS_DTYPE_F32;
    char *p = scratch;
    double *acc = (double *)p;
    void *xa = p + 64;
    float *A = (float *)(p + 64 + align64(n * 4));
    float *B = (float *)((char *)A + align64(ss * 4));
    void *op = (char *)B + align64(ss * 4); /* A, then B, in the GEMMs' dtype (bf16) */

    k->memset_zero(acc, sizeof(double));
    k->sum_squares_into(acc, x, n);
    double sumsq = 0.0;
    k->memcpy_d2h(&sumsq, acc, sizeof sumsq);
    const double norm = sqrt(sumsq);
    float scale = (float)(1.0 / (norm > c->eps ? norm : c->eps));

    for (int i = 0; i < c->ns_steps; i++) {
        const float a = c->coef[i][0], b = c->coef[i][1], cc = c->coef[i][2];
        k->convert(xa, k->act_dtype, x, TS_DTYPE_F32, n); /* the GEMMs' copy of X */
        /* A = X X^T (wide) or X^T X (tall), [s, s] */
        k->gemm(A, xa, xa, s, s, l, tall, !tall, scale * scale, 0.0f);
        const void *Aop = A;
        if (!f32) {
            k->convert(op, k->act_dtype, A, TS_DTYPE_F32, ss);
            Aop = op;
        }
        /* B = b A + c A A */
        k->memcpy_d2d(B, A, ss * sizeof(float));
        k->gemm(B, Aop, Aop, s, s, s, false, false, cc, b);
        const void *Bop = B;
        if (!f32) {
            k->convert(op, k->act_dtype, B, TS_DTYPE_F32, ss);
            Bop = op;
        }
        /* X = a X + B X (wide) or a X + X B (tall) */
        if (tall)
            k->gemm(x, xa, Bop, l, s, s, false, false, scale, a * scale);
        else
            k->gemm(x, Bop, xa, s, l, s, false, false, scale, a * scale);
        scale = 1.0f;
    }
}

/* ---- one rank's state */

bool *ts_muon_mask(const ts_model *m)
{
    bool *mask = ts_calloc((size_t)m->n_params > 0 ? (size_t)m->n_params : 1, sizeof(bool));
    for (int p = 0; p < m->n_params; p++) mask[p] = ts_param_is_muon(m, p);
    return mask;
}

void ts_muon_init(ts_muon *o, const ts_model *m, const ts_train_config *tc, const int *params,
                  int n)
{
    const ts_kernels *k = m->k;
    memset(o, 0, sizeof *o);
    ts_muon_config_of(tc, &o->cfg);
    o->k = k;
    o->n = n;
    o->param = ts_calloc(n > 0 ? (size_t)n : 1, sizeof *o->param);
    o->offset = ts_calloc(n > 0 ? (size_t)n : 1, sizeof *o->offset);
    size_t largest = 0, scratch = 0;
    for (int i = 0; i < n; i++) {
        const ts_param *P = &m->params[params[i]];
        TS_ASSERT(ts_param_is_muon(m, params[i]) && (i == 0 || params[i] > params[i - 1]));
        o->param[i] = params[i];
        o->offset[i] = o->n_floats;
        o->n_floats += P->numel;
        if (ts_tp_param_counts(&P->shard)) o->count_floats += P->numel;
        const int64_t r = P->shard.shape[0], c = P->shard.shape[1];
        const size_t logical = (size_t)r * (size_t)c, sb = ts_muon_scratch_bytes(r, c);
        largest = logical > largest ? logical : largest;
        scratch = sb > scratch ? sb : scratch;
    }
    o->momentum = k->dev_alloc(o->n_floats * sizeof(float));
    o->work = k->dev_alloc(largest * sizeof(float));
    o->scratch = k->dev_alloc(scratch);
    o->acc = k->dev_alloc(sizeof(double));
}

void ts_muon_init_all(ts_muon *o, const ts_model *m, const ts_train_config *tc)
{
    int *params = ts_calloc(m->n_params > 0 ? (size_t)m->n_params : 1, sizeof(int)), n = 0;
    for (int p = 0; p < m->n_params; p++)
        if (ts_param_is_muon(m, p)) params[n++] = p;
    ts_muon_init(o, m, tc, params, n);
    free(params);
}

void ts_muon_free(ts_muon *o)
{
    free(o->param);
    free(o->offset);
    if (o->k) {
        o->k->dev_free(o->momentum);
        o->k->dev_free(o->work);
        o->k->dev_free(o->scratch);
        o->k->dev_free(o->acc);
    }
    memset(o, 0, sizeof *o);
}

size_t ts_muon_state_bytes(const ts_muon *o) { return o->n_floats * sizeof(float); }

void ts_muon_matrix_step(ts_muon *o, const ts_model *m, int i, float *param, const float *grad,
                         float grad_scale, double lr, double weight_decay, double *acc)
{
    const ts_kernels *k = o->k;
    const ts_param *P = &m->params[o->param[i]];
    const int64_t rows = P->shard.shape[0], cols = P->shard.shape[1];
    TS_ASSERT((size_t)(rows * cols) == P->numel); /* whole on this rank */
    k->muon_momentum(o->work, o->momentum + o->offset[i], grad, grad_scale, P->numel,
                     o->cfg.momentum, o->cfg.nesterov ? 1 : 0);
    ts_muon_orthogonalize(&o->cfg, k, o->work, rows, cols, o->scratch);
    /* torch: param.mul_(1 - lr * wd) with the unscaled lr, then add_(O, -lr * scale). */
    const float decay = P->decay ? (float)(1.0 - lr * weight_decay) : 1.0f;
    const float lr_scaled = (float)(lr * ts_muon_scale(&o->cfg, rows, cols));
    k->muon_apply(param, o->work, P->numel, decay, lr_scaled, acc);
}

double ts_muon_step(ts_muon *o, ts_model *m, const ts_train_config *tc, double lr,
                    float grad_scale)
{
    o->k->memset_zero(o->acc, sizeof(double));
    for (int i = 0; i < o->n; i++) {
        const ts_param *P = &m->params[o->param[i]];
        ts_muon_matrix_step(o, m, i, m->param_mem + P->offset, m->grad_mem + P->offset,
                            grad_scale, lr, tc->weight_decay,
                            ts_tp_param_counts(&P->shard) ? o->acc : NULL);
    }
    double sum = 0.0;
    o->k->memcpy_d2h(&sum, o->acc, sizeof sum);
    return sum;
}
