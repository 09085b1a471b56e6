/* Packed documents (data.document_mask) on one rank: a window of several documents with
 * the masks gives the loss and gradients of running each document alone.
 *   - against PyTorch (tests/make_docmask_fixture.py: the tiny llama and gpt2 of the
 *     other fixtures, every document run as its own sequence in float64): the loss to
 *     1e-5 and every parameter gradient to 1e-4 (relative norm), in 2 micro-batches and
 *     in 1 under selective recompute; in bf16 (where the CPU runs it) within bf16's
 *     tolerance;
 *   - against Tessera itself, for what PyTorch has no fixture of here: multi-head
 *     latent attention (YaRN-scaled RoPE on its rope part) and a DeepSeek-style MoE,
 *     the packed windows against one call per document (sequences of the document's
 *     length);
 *   - MFU's count of the pairs computed (ts_acts.doc_pairs, ts_attention_pairs). */
#include <math.h>
#include <string.h>

#include "fixture_check.h"
#include "kernels/attention_sizes.h"
#include "test_blas_kernel.h"
#include "test_util.h"

enum { B = FIXTURE_B, T = FIXTURE_T, DOC = 95 };

static int tokens[B * T], targets[B * T];

/* A tensor of the expect file as doubles (the gradients are stored in F32). */
static double *read_f32(ts_st_file *f, const char *name, size_t n)
{
    const ts_st_tensor *t = ts_st_find(f, name);
    CHECKF(t && t->dtype == TS_DT_F32 && t->end - t->begin == n * sizeof(float),
           "fixture tensor %s missing or malformed", name);
    float *v = malloc(n * sizeof(float));
    double *d = malloc(n * sizeof(double));
    CHECK(ts_st_read(f, t, 0, v, n * sizeof(float)) == TS_OK);
    for (size_t i = 0; i < n; i++) d[i] = v[i];
    free(v);
    return d;
}

static void build(ts_model *m, const ts_config *cfg, const ts_kernels *k, bool selective)
{
    ts_model_build(m, &(ts_model_spec){.arch = &cfg->model, .k = k, .selective_all = selective,
                                       .moe_z_loss = (float)cfg->train.moe_z_loss,
                                       .document_mask = true, .document_token = DOC});
}

/* The model of cfg, loaded from tests/fixtures/WEIGHTS, against STEM_expect: the loss and
 * every gradient within (loss_tol, grad_tol). */
static void against_torch(const ts_config *cfg, const char *weights, const char *stem,
                          const ts_kernels *k, bool selective, int mb, double loss_tol,
                          double grad_tol)
{
    const char *root = getenv("TS_SOURCE_DIR");
    char wpath[4096], epath[4096];
    snprintf(wpath, sizeof wpath, "%s/tests/fixtures/%s", root ? root : ".", weights);
    snprintf(epath, sizeof epath, "%s/tests/fixtures/%s_expect.safetensors", root ? root : ".",
             stem);
    ts_model m;
    build(&m, cfg, k, selective);
    ts_st_file ef;
    if (ts_ckpt_load_model_init(&m, wpath) != TS_OK || ts_st_open(&ef, epath) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        exit(1);
    }
    ts_model_refresh_compute(&m);
    int doc[1];
    fixture_read_i32(&ef, "tokens", tokens, (size_t)B * T);
    fixture_read_i32(&ef, "targets", targets, (size_t)B * T);
    fixture_read_i32(&ef, "doc_token", doc, 1);
    CHECK(doc[0] == DOC);
    double *ref = fixture_read_f64(&ef, "loss", NULL);
    const double loss = fixture_loss_and_grads(&m, tokens, targets, B, T, mb);
    CHECKF(ts_rel_err(loss, ref[0], 1e-12) < loss_tol, "%s %s: loss %.9f vs torch %.9f", stem,
           k->name, loss, ref[0]);
    double worst = 0;
    for (int p = 0; p < m.n_params; p++) {
        char name[160];
        snprintf(name, sizeof name, "grad.%s", m.params[p].shard.name);
        double *g = read_f32(&ef, name, m.params[p].numel);
        const double e = fixture_rel_norm_err(ts_param_grad(&m, p), g, m.params[p].numel);
        worst = fmax(worst, e);
        CHECKF(e < grad_tol, "%s %s: %s relative gradient error %.3g", stem, k->name,
               m.params[p].shard.name, e);
        free(g);
    }
    printf("%s (%s%s, micro-batch %d): loss %.9f, torch %.9f; worst gradient error %.3g\n",
           stem, k->name, selective ? ", selective recompute" : "", mb, loss, ref[0], worst);
    free(ref);
    ts_st_close(&ef);
    ts_model_free(&m);
}

/* The documents of window b: [starts[i], starts[i+1]) (starts ends with T). */
static int documents(int b, int *starts)
{
    int n = 0;
    for (int p = 0; p < T; p++)
        if (p == 0 || tokens[b * T + p] == DOC) starts[n++] = p;
    starts[n] = T;
    return n;
}

/* One forward and backward of `rows` sequences of `len` positions (their gradients added
 * to the model's), documents set from their tokens; returns the summed token losses. */
static double run(ts_model *m, const int *tok, const int *tgt, int rows, int len)
{
    ts_acts a;
    ts_scratch s;
    ts_acts_init(&a, m, 0, m->n_layers, rows, len);
    ts_scratch_init(&s, m, rows, len);
    a.att_work = ts_scratch_attention_work(&s, m, rows, len);
    a.mla_work = ts_scratch_mla_work(&s, m, rows, len);
    memcpy(a.tokens, tok, (size_t)rows * len * sizeof(int));
    memcpy(a.targets, tgt, (size_t)rows * len * sizeof(int));
    ts_acts_set_documents(m, &a, tok, len);
    float *dx = ts_alloc_floats((size_t)rows * len * m->n_embd);
    double *sum = calloc(1, sizeof(double));
    ts_model_forward(m, &a, 1.0f / (float)(B * T), sum);
    ts_model_backward(m, &a, dx, &s, NULL, NULL);
    const double out = *sum;
    free(sum);
    free(dx);
    ts_scratch_free(&s);
    ts_acts_free(&a);
    return out;
}

/* MFU's count: the pairs of a micro-batch's windows are each document's L (L + 1) / 2,
 * and a window of one document the causal T (T + 1) / 2 (kernels/attention_sizes.h). */
static void test_pairs(const ts_config *cfg)
{
    ts_model m;
    build(&m, cfg, &ts_kernels_cpu, false);
    ts_acts a;
    ts_acts_init(&a, &m, 0, m.n_layers, B, T);
    ts_acts_set_documents(&m, &a, tokens, T);
    double want = 0;
    for (int b = 0; b < B; b++) {
        int starts[T + 1];
        const int n = documents(b, starts);
        for (int i = 0; i < n; i++) {
            const double L = starts[i + 1] - starts[i];
            want += L * (L + 1) / 2;
        }
    }
    CHECKF(a.doc_pairs == want, "the micro-batch's pairs %.0f, its documents' %.0f", a.doc_pairs,
           want);
    int zeros[T] = {0};
    CHECK(ts_attention_pairs(zeros, T) == T * (T + 1) / 2.0 &&
          ts_attention_pairs(NULL, T) == T * (T + 1) / 2.0);
    printf("pairs of the fixture's 4 windows: %.0f (causal: %d)\n", a.doc_pairs,
           B * T * (T + 1) / 2);
    ts_acts_free(&a);
    ts_model_free(&m);
}

/* Packed windows with masks against each document alone, on Tessera's own model. */
static void against_alone(const ts_config *cfg, const char *what, bool selective)
{
    ts_model m;
    build(&m, cfg, &ts_kernels_cpu, selective);
    ts_model_init_random(&m, 7);
    for (int p = 0; p < m.n_params; p++) /* peaked attention and routing: masks matter */
        if (m.params[p].shard.ndim == 2) {
            float *w = ts_param_data(&m, p);
            for (size_t i = 0; i < m.params[p].numel; i++) w[i] *= 8.0f;
        }
    memset(m.grad_mem, 0, m.num_floats * sizeof(float));
    ts_model_moe_begin(&m);
    const double packed = run(&m, tokens, targets, B, T) / (B * T);
    float *want = malloc(m.num_floats * sizeof(float));
    memcpy(want, m.grad_mem, m.num_floats * sizeof(float));
    memset(m.grad_mem, 0, m.num_floats * sizeof(float));
    double alone = 0.0;
    int n_docs = 0;
    for (int b = 0; b < B; b++) {
        int starts[T + 1];
        const int n = documents(b, starts);
        for (int i = 0; i < n; i++, n_docs++) {
            const int s = starts[i], len = starts[i + 1] - s;
            alone += run(&m, tokens + b * T + s, targets + b * T + s, 1, len);
        }
    }
    alone /= B * T;
    CHECKF(ts_rel_err(packed, alone, 1e-12) < 1e-5, "%s: packed loss %.9f, documents alone %.9f",
           what, packed, alone);
    double worst = 0;
    for (int p = 0; p < m.n_params; p++) {
        const float *g = ts_param_grad(&m, p);
        const float *w = want + (ts_param_grad(&m, p) - m.grad_mem);
        double *ref = malloc(m.params[p].numel * sizeof(double));
        for (size_t i = 0; i < m.params[p].numel; i++) ref[i] = g[i];
        const double e = fixture_rel_norm_err(w, ref, m.params[p].numel);
        worst = fmax(worst, e);
        CHECKF(e < 1e-4, "%s: %s relative gradient error %.3g", what, m.params[p].shard.name, e);
        free(ref);
    }
    printf("%s%s: packed %.9f, %d documents alone %.9f; worst gradient error %.3g\n", what,
           selective ? " (selective recompute)" : "", packed, n_docs, alone, worst);
    free(want);
    ts_model_free(&m);
}

int main(void)
{
    ts_test_require_blas_core();
    ts_cpu_set_threads(2);
    ts_config llama, gpt2;
    fixture_llama_config(&llama);
    ts_config_resolve_model(&llama.model);
    ts_config_defaults(&gpt2);
    gpt2.model.n_layer = 2;
    gpt2.model.n_head = 2;
    gpt2.model.n_embd = 32;
    gpt2.model.vocab_size = 96;
    gpt2.model.seq_len = 16;
    const ts_kernels *f32 = &ts_kernels_cpu;
    against_torch(&llama, "llama_tiny_weights.safetensors", "docmask_llama", f32, false, 2, 1e-5,
                  1e-4);
    against_torch(&llama, "llama_tiny_weights.safetensors", "docmask_llama", f32, true, 4, 1e-5,
                  1e-4);
    against_torch(&gpt2, "gpt2_tiny_weights.safetensors", "docmask_gpt2", f32, false, 2, 1e-5,
                  1e-4);
    against_torch(&gpt2, "gpt2_tiny_weights.safetensors", "docmask_gpt2", f32, true, 4, 1e-5,
                  1e-4);
    if (ts_cpu_bf16_supported()) { /* bf16 activations: bf16's tolerance */
        against_torch(&llama, "llama_tiny_weights.safetensors", "docmask_llama",
                      &ts_kernels_cpu_bf16, false, 2, 2e-3, 5e-2);
        against_torch(&gpt2, "gpt2_tiny_weights.safetensors", "docmask_gpt2",
                      &ts_kernels_cpu_bf16, true, 4, 2e-3, 5e-2);
    } else {
        printf("bf16: this CPU lacks AVX512_BF16/AMX: not run\n");
    }

    test_pairs(&llama);

    /* Multi-head latent attention with YaRN (tests/test_mla_grad.c's shape). */
    ts_config mla;
    ts_test_tiny_llama(&mla, 96, T);
    mla.model.n_kv_head = 0;
    mla.model.q_lora_rank = 12;
    mla.model.kv_lora_rank = 16;
    mla.model.qk_nope_head_dim = 8;
    mla.model.qk_rope_head_dim = 4;
    mla.model.v_head_dim = 6;
    snprintf(mla.model.rope_type, sizeof mla.model.rope_type, "yarn");
    mla.model.rope_scaling = 4.0;
    mla.model.rope_original_context = 4;
    mla.model.rope_mscale = 1.0;
    mla.model.rope_mscale_all_dim = 0.8;
    ts_config_resolve_model(&mla.model);
    against_alone(&mla, "MLA (YaRN)", false);
    against_alone(&mla, "MLA (YaRN)", true);

    /* DeepSeek-style MoE (tests/test_moe_grad.c's), its z-loss per token; the
     * sequence-wise balance loss is a window's, not a document's: left at 0. */
    ts_config moe;
    ts_test_tiny_llama(&moe, 96, T);
    moe.model.moe_experts = 8;
    moe.model.moe_top_k = 2;
    moe.model.moe_ffn_hidden = 16;
    snprintf(moe.model.moe_router, sizeof moe.model.moe_router, "sigmoid");
    moe.model.moe_norm_topk = true;
    moe.model.moe_route_scale = 2.5;
    moe.model.moe_groups = 4;
    moe.model.moe_topk_groups = 2;
    moe.model.moe_shared_experts = 1;
    moe.model.moe_first_dense = 1;
    moe.train.moe_z_loss = 1e-1;
    moe.train.moe_aux_loss = 0.0;
    ts_config_resolve_model(&moe.model);
    against_alone(&moe, "MoE", false);
    return ts_test_report();
}
