/* The harness of the PyTorch fixture tests (tests/test_gpt2_fixture.c,
 * tests/test_llama_fixture.c): a model of the test's config loads
 * tests/fixtures/STEM_weights.safetensors and is checked against
 * tests/fixtures/STEM_expect.safetensors, which PyTorch wrote in float64
 * (tests/make_fixture.py, tests/make_llama_fixture.py; their recipe is
 * tests/torch_common.py's): the loss and every parameter gradient of one batch, the same
 * with another micro-batch split, then 5 AdamW steps with clipping and the LR schedule.
 * Defines fixture_train_config, fixture_final_hook and fixture_check. */
#ifndef TS_FIXTURE_CHECK_H
#define TS_FIXTURE_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/load.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/optim.h"
#include "test_util.h"
#include "support/optim_oneshot.h"

/* The fixtures' batch: B rows of T tokens. */
enum { FIXTURE_B = 4, FIXTURE_T = 16 };

/* The tiny llama every llama-family fixture is made on (tests/torch_llama.py's defaults:
 * vocabulary 96, 16 positions, RoPE theta 10000, RMSNorm eps 1e-5, lm_head untied); the
 * caller adds its own keys, then ts_config_resolve_model. */
static inline void fixture_llama_config(ts_config *cfg)
{
    ts_test_tiny_llama(cfg, 96, 16);
    cfg->model.rope_theta = 10000.0;
    cfg->model.norm_eps = 1e-5;
    cfg->model.tie_embeddings = false;
}

/* The optimizer and schedule the fixtures trained with (torch_common.py's FIXTURE). */
static inline void fixture_train_config(ts_train_config *t)
{
    t->lr = 1e-2;
    t->min_lr = 1e-3;
    t->warmup = 2;
    t->steps = 5;
    t->weight_decay = 0.1;
    t->beta1 = 0.9;
    t->beta2 = 0.95;
    t->eps = 1e-8;
    t->grad_clip = 1.0;
}

static double *fixture_read_f64(ts_st_file *f, const char *name, size_t *n)
{
    const ts_st_tensor *t = ts_st_find(f, name);
    if (!t || t->dtype != TS_DT_F64) {
        fprintf(stderr, "fixture lacks F64 tensor %s\n", name);
        exit(1);
    }
    size_t bytes = t->end - t->begin;
    double *d = malloc(bytes);
    if (ts_st_read(f, t, 0, d, bytes) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        exit(1);
    }
    if (n) *n = bytes / sizeof(double);
    return d;
}

static void fixture_read_i32(ts_st_file *f, const char *name, int *dst, size_t n)
{
    const ts_st_tensor *t = ts_st_find(f, name);
    if (!t || t->dtype != TS_DT_I32 || t->end - t->begin != n * sizeof(int) ||
        ts_st_read(f, t, 0, dst, n * sizeof(int)) != TS_OK) {
        fprintf(stderr, "fixture tensor %s missing or malformed\n", name);
        exit(1);
    }
}

/* ||a - b|| / ||b|| over a whole tensor (float against double reference). */
static double fixture_rel_norm_err(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The index of the parameter named `name` (its Hugging Face name), -1 if none. */
static inline int fixture_param_index(const ts_model *m, const char *name)
{
    for (int p = 0; p < m->n_params; p++)
        if (strcmp(m->params[p].shard.name, name) == 0) return p;
    return -1;
}

/* Forward + backward over the fixture's batch in micro-batches of `mb` rows; returns
 * the mean loss. Gradients accumulate into the (zeroed) gradient buffer. */
static double fixture_loss_and_grads(ts_model *m, const int *tokens, const int *targets, int B,
                                     int T, int mb)
{
    ts_acts a;
    ts_scratch s;
    ts_acts_init(&a, m, 0, m->n_layers, mb, T);
    ts_scratch_init(&s, m, mb, T);
    a.mla_work = ts_scratch_mla_work(&s, m, mb, T); /* MLA assembles q|k|v there */
    a.att_work = ts_scratch_attention_work(&s, m, mb, T); /* selective recompute's */
    float *dx = ts_alloc_floats((size_t)mb * T * m->n_embd);
    memset(m->grad_mem, 0, m->num_floats * sizeof(float));
    ts_model_moe_begin(m); /* an MoE model's counts and loss sums are this batch's */
    ts_model_mtp_begin(m); /* and multi-token prediction's depth sums */
    double total = 0.0;
    for (int b0 = 0; b0 < B; b0 += mb) {
        memcpy(a.tokens, tokens + (size_t)b0 * T, (size_t)mb * T * sizeof(int));
        memcpy(a.targets, targets + (size_t)b0 * T, (size_t)mb * T * sizeof(int));
        ts_acts_set_mtp_ids(m, &a, targets + (size_t)b0 * T, T);
        ts_acts_set_documents(m, &a, tokens + (size_t)b0 * T, T); /* data.document_mask */
        double sum = 0.0;
        ts_model_forward(m, &a, 1.0f / (float)(B * T), &sum);
        ts_model_backward(m, &a, dx, &s, NULL, NULL);
        total += sum;
    }
    free(dx);
    ts_scratch_free(&s);
    ts_acts_free(&a);
    return total / (double)(B * T);
}

/* A model's own check of parameter p after the 5 steps: given the reference `want` and
 * the whole tensor's relative error `err`, returns the error to hold to 1e-4 (and may
 * CHECK parts of the tensor by other measures). */
typedef double (*fixture_final_hook)(const ts_model *m, int p, const double *want, double err);

/* A model's own checks around fixture_check's (each may be NULL): after the first
 * batch's loss and gradients, and after each AdamW step's forward and backward (before
 * the update), given the expect file; the weights' file, when the model holds more of it
 * than its parameters (the MoE balancing bias). */
typedef struct {
    void (*after_grads)(ts_model *m, ts_st_file *ef);
    void (*after_step)(ts_model *m, ts_st_file *ef, int step);
    ts_status (*load_more)(ts_model *m, const char *weights_path);
    /* The weights model.init loads, under tests/fixtures/ (NULL: STEM_weights.safetensors;
     * a Hugging Face save_pretrained directory too). */
    const char *weights;
} fixture_hooks;

static inline int fixture_check_ex(const ts_config *cfg, const char *stem, int n_params,
                            fixture_final_hook final, const fixture_hooks *hooks);

/* The loss and every gradient of the fixture's batch (in 2 micro-batches, then 1), then 5
 * AdamW steps on it, against tests/fixtures/STEM_expect.safetensors; `n_params` is how
 * many parameters the model and the fixture both have; `final` may be NULL. Returns
 * ts_test_report(). */
static inline int fixture_check(const ts_config *cfg, const char *stem, int n_params,
                         fixture_final_hook final)
{
    return fixture_check_ex(cfg, stem, n_params, final, NULL);
}

static inline int fixture_check_ex(const ts_config *cfg, const char *stem, int n_params,
                            fixture_final_hook final, const fixture_hooks *hooks)
{
    const fixture_hooks none = {0};
    if (!hooks) hooks = &none;
    const int B = FIXTURE_B, T = FIXTURE_T;
    const char *root = getenv("TS_SOURCE_DIR");
    char wpath[4096], epath[4096];
    if (!root) root = ".";
    if (hooks->weights)
        snprintf(wpath, sizeof wpath, "%s/tests/fixtures/%s", root, hooks->weights);
    else
        snprintf(wpath, sizeof wpath, "%s/tests/fixtures/%s_weights.safetensors", root, stem);
    snprintf(epath, sizeof epath, "%s/tests/fixtures/%s_expect.safetensors", root, stem);

    ts_cpu_set_threads(2);
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &cfg->model, .k = &ts_kernels_cpu,
                                        .moe_z_loss = (float)cfg->train.moe_z_loss,
                                        .moe_aux_loss = (float)cfg->train.moe_aux_loss,
                                        .mtp_loss = cfg->train.mtp_loss});
    if (ts_ckpt_load_model_init(&m, wpath) != TS_OK ||
        (hooks->load_more && hooks->load_more(&m, wpath) != TS_OK)) {
        fprintf(stderr, "%s\n", ts_error_message());
        return 1;
    }
    ts_st_file ef;
    if (ts_st_open(&ef, epath) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        return 1;
    }
    int tokens[FIXTURE_B * FIXTURE_T], targets[FIXTURE_B * FIXTURE_T];
    fixture_read_i32(&ef, "tokens", tokens, (size_t)B * T);
    fixture_read_i32(&ef, "targets", targets, (size_t)B * T);

    /* Loss and gradients, with the batch split into 2 micro-batches (accumulation). */
    double *ref_loss = fixture_read_f64(&ef, "loss", NULL);
    double loss = fixture_loss_and_grads(&m, tokens, targets, B, T, 2);
    CHECKF(ts_rel_err(loss, ref_loss[0], 1e-12) < 1e-5, "loss %.9f vs torch %.9f", loss,
           ref_loss[0]);
    printf("loss %.9f, torch %.9f\n", loss, ref_loss[0]);
    if (hooks->after_grads) hooks->after_grads(&m, &ef);
    /* Every parameter of the fixture is one of the model's (and the other way round:
     * each of the model's is looked up below). */
    int n_grads = 0;
    for (int i = 0; i < ef.n_tensors; i++) n_grads += strncmp(ef.tensors[i].name, "grad.", 5) == 0;
    CHECKF(m.n_params == n_grads && n_grads == n_params,
           "the model has %d parameters, the fixture %d gradients, want %d", m.n_params, n_grads,
           n_params);
    double worst = 0;
    for (int p = 0; p < m.n_params; p++) {
        char name[160];
        snprintf(name, sizeof name, "grad.%s", m.params[p].shard.name);
        size_t n;
        double *g = fixture_read_f64(&ef, name, &n);
        CHECK(n == m.params[p].numel);
        double e = fixture_rel_norm_err(ts_param_grad(&m, p), g, m.params[p].numel);
        if (e > worst) worst = e;
        CHECKF(e < 1e-4, "%s: relative gradient error %.3g", m.params[p].shard.name, e);
        free(g);
    }
    printf("worst relative gradient error %.3g\n", worst);

    /* The same micro-batch split must not matter: one micro-batch of 4. */
    double loss_b4 = fixture_loss_and_grads(&m, tokens, targets, B, T, 4);
    CHECKF(ts_rel_err(loss_b4, loss, 1e-12) < 1e-6, "micro-batch split changes the loss");

    /* Five AdamW steps on the same batch, as the fixture took them. */
    double *ref_losses = fixture_read_f64(&ef, "adamw_losses", NULL);
    double *ref_lrs = fixture_read_f64(&ef, "adamw_lrs", NULL);
    double *ref_norms = fixture_read_f64(&ef, "adamw_grad_norms", NULL);
    ts_adamw opt;
    ts_adamw_init(&opt, &m);
    for (int step = 0; step < 5; step++) {
        double l = fixture_loss_and_grads(&m, tokens, targets, B, T, 2);
        if (hooks->after_step) hooks->after_step(&m, &ef, step);
        double norm = sqrt(ts_grad_sum_squares(&m));
        double lr = ts_lr_at(&cfg->train, step);
        CHECKF(ts_rel_err(l, ref_losses[step], 1e-12) < 1e-5, "step %d loss %.9f vs %.9f", step, l,
               ref_losses[step]);
        CHECKF(ts_rel_err(norm, ref_norms[step], 1e-12) < 1e-4, "step %d norm %.9f vs %.9f", step,
               norm, ref_norms[step]);
        CHECKF(ts_rel_err(lr, ref_lrs[step], 1e-12) < 1e-12, "step %d lr %.9g vs %.9g", step, lr,
               ref_lrs[step]);
        printf("step %d: loss %.9f (torch %.9f) norm %.6f lr %.5f\n", step, l, ref_losses[step],
               norm, lr);
        ts_adamw_step(&opt, &m, &cfg->train, lr, ts_clip_coef(norm, cfg->train.grad_clip),
                      step + 1);
    }
    ts_adamw_free(&opt);
    worst = 0;
    for (int p = 0; p < m.n_params; p++) {
        char name[160];
        snprintf(name, sizeof name, "final.%s", m.params[p].shard.name);
        double *w = fixture_read_f64(&ef, name, NULL);
        double e = fixture_rel_norm_err(ts_param_data(&m, p), w, m.params[p].numel);
        if (final) e = final(&m, p, w, e);
        if (e > worst) worst = e;
        CHECKF(e < 1e-4, "%s: relative error after 5 steps %.3g", m.params[p].shard.name, e);
        free(w);
    }
    printf("worst relative parameter error after 5 steps %.3g\n", worst);

    free(ref_loss);
    free(ref_losses);
    free(ref_lrs);
    free(ref_norms);
    ts_st_close(&ef);
    ts_model_free(&m);
    return ts_test_report();
}

#endif
