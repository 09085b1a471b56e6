/* Tessera's llama against PyTorch (tests/make_llama_fixture.py, float64; its model,
 * tests/torch_llama.py, is Hugging Face's LlamaForCausalLM written out and checked against
 * transformers by tests/check_llama_hf.py): a grouped-query llama (4 query heads sharing 2
 * key/value heads, RoPE theta 10000, SwiGLU width 48, RMSNorm weights away from 1, lm_head
 * untied). The loss and every parameter gradient of one batch, then 5 AdamW steps with
 * clipping and the LR schedule. This is what proves the model is Hugging Face's llama. */
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
#include "test_blas_kernel.h"
#include "test_util.h"

static double *read_f64(ts_st_file *f, const char *name, size_t *n)
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

static void read_i32(ts_st_file *f, const char *name, int *dst, size_t n)
{
    const ts_st_tensor *t = ts_st_find(f, name);
    if (!t || t->dtype != TS_DT_I32 || t->end - t->begin != n * sizeof(int) ||
        ts_st_read(f, t, 0, dst, n * sizeof(int)) != TS_OK) {
        fprintf(stderr, "fixture tensor %s missing or malformed\n", name);
        exit(1);
    }
}

/* ||a - b|| / ||b|| over a whole tensor (float against double reference). */
static double rel_norm_err(const float *a, const double *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Forward + backward over the fixture's batch in micro-batches of `mb` rows; returns
 * the mean loss. Gradients accumulate into the (zeroed) gradient buffer. */
static double loss_and_grads(ts_model *m, const int *tokens, const int *targets, int B, int T,
                             int mb)
{
    ts_acts a;
    ts_scratch s;
    ts_acts_init(&a, m, 0, m->n_layers, mb, T);
    ts_scratch_init(&s, m, mb, T);
    float *dx = ts_alloc_floats((size_t)mb * T * m->n_embd);
    memset(m->grad_mem, 0, m->num_floats * sizeof(float));
    double total = 0.0;
    for (int b0 = 0; b0 < B; b0 += mb) {
        memcpy(a.tokens, tokens + (size_t)b0 * T, (size_t)mb * T * sizeof(int));
        memcpy(a.targets, targets + (size_t)b0 * T, (size_t)mb * T * sizeof(int));
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

int main(void)
{
    ts_test_require_blas_core();
    const char *root = getenv("TS_SOURCE_DIR");
    char wpath[4096], epath[4096];
    if (!root) root = ".";
    snprintf(wpath, sizeof wpath, "%s/tests/fixtures/llama_tiny_weights.safetensors", root);
    snprintf(epath, sizeof epath, "%s/tests/fixtures/llama_tiny_expect.safetensors", root);

    ts_config cfg;
    ts_config_defaults(&cfg);
    snprintf(cfg.model.arch, sizeof cfg.model.arch, "llama");
    ts_config_arch_defaults(&cfg.model, "llama");
    cfg.model.n_layer = 2;
    cfg.model.n_head = 4;
    cfg.model.n_kv_head = 2;
    cfg.model.n_embd = 32;
    cfg.model.ffn_hidden = 48;
    cfg.model.vocab_size = 96;
    cfg.model.seq_len = 16;
    cfg.model.rope_theta = 10000.0;
    cfg.model.norm_eps = 1e-5;
    cfg.model.tie_embeddings = false;
    ts_config_resolve_model(&cfg.model);
    cfg.train.lr = 1e-2;
    cfg.train.min_lr = 1e-3;
    cfg.train.warmup = 2;
    cfg.train.steps = 5;
    cfg.train.weight_decay = 0.1;
    cfg.train.beta1 = 0.9;
    cfg.train.beta2 = 0.95;
    cfg.train.eps = 1e-8;
    cfg.train.grad_clip = 1.0;
    const int B = 4, T = 16;

    ts_cpu_set_threads(2);
    ts_model m;
    ts_model_build(&m, &cfg.model, NULL, &ts_kernels_cpu);
    if (ts_ckpt_load_model_init(&m, wpath) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        return 1;
    }
    ts_st_file ef;
    if (ts_st_open(&ef, epath) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        return 1;
    }
    int tokens[4 * 16], targets[4 * 16];
    read_i32(&ef, "tokens", tokens, (size_t)B * T);
    read_i32(&ef, "targets", targets, (size_t)B * T);

    /* Loss and gradients, with the batch split into 2 micro-batches (accumulation). */
    double *ref_loss = read_f64(&ef, "loss", NULL);
    double loss = loss_and_grads(&m, tokens, targets, B, T, 2);
    CHECKF(ts_rel_err(loss, ref_loss[0], 1e-12) < 1e-5, "loss %.9f vs torch %.9f", loss,
           ref_loss[0]);
    printf("loss %.9f, torch %.9f\n", loss, ref_loss[0]);
    /* Every parameter of the fixture is one of the model's (and the other way round:
     * each of the model's is looked up below): embedding, 9 per block, final norm, head. */
    int n_grads = 0;
    for (int i = 0; i < ef.n_tensors; i++) n_grads += strncmp(ef.tensors[i].name, "grad.", 5) == 0;
    CHECKF(m.n_params == n_grads && n_grads == 2 + 9 * 2 + 1,
           "the model has %d parameters, the fixture %d gradients", m.n_params, n_grads);
    double worst = 0;
    for (int p = 0; p < m.n_params; p++) {
        char name[160];
        snprintf(name, sizeof name, "grad.%s", m.params[p].shard.name);
        size_t n;
        double *g = read_f64(&ef, name, &n);
        CHECK(n == m.params[p].numel);
        double e = rel_norm_err(ts_param_grad(&m, p), g, m.params[p].numel);
        if (e > worst) worst = e;
        CHECKF(e < 1e-4, "%s: relative gradient error %.3g", m.params[p].shard.name, e);
        free(g);
    }
    printf("worst relative gradient error %.3g\n", worst);

    /* The same micro-batch split must not matter: one micro-batch of 4. */
    double loss_b4 = loss_and_grads(&m, tokens, targets, B, T, 4);
    CHECKF(ts_rel_err(loss_b4, loss, 1e-12) < 1e-6, "micro-batch split changes the loss");

    /* Five AdamW steps on the same batch, as the fixture took them. */
    double *ref_losses = read_f64(&ef, "adamw_losses", NULL);
    double *ref_lrs = read_f64(&ef, "adamw_lrs", NULL);
    double *ref_norms = read_f64(&ef, "adamw_grad_norms", NULL);
    ts_adamw opt;
    ts_adamw_init(&opt, &m);
    for (int step = 0; step < 5; step++) {
        double l = loss_and_grads(&m, tokens, targets, B, T, 2);
        double norm = sqrt(ts_grad_sum_squares(&m));
        double lr = ts_lr_at(&cfg.train, step);
        CHECKF(ts_rel_err(l, ref_losses[step], 1e-12) < 1e-5, "step %d loss %.9f vs %.9f", step, l,
               ref_losses[step]);
        CHECKF(ts_rel_err(norm, ref_norms[step], 1e-12) < 1e-4, "step %d norm %.9f vs %.9f", step,
               norm, ref_norms[step]);
        CHECKF(ts_rel_err(lr, ref_lrs[step], 1e-12) < 1e-12, "step %d lr %.9g vs %.9g", step, lr,
               ref_lrs[step]);
        printf("step %d: loss %.9f (torch %.9f) norm %.6f lr %.5f\n", step, l, ref_losses[step],
               norm, lr);
        ts_adamw_step(&opt, &m, &cfg.train, lr, ts_clip_coef(norm, cfg.train.grad_clip), step + 1);
    }
    ts_adamw_free(&opt);
    worst = 0;
    for (int p = 0; p < m.n_params; p++) {
        char name[160];
        snprintf(name, sizeof name, "final.%s", m.params[p].shard.name);
        double *w = read_f64(&ef, name, NULL);
        double e = rel_norm_err(ts_param_data(&m, p), w, m.params[p].numel);
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
