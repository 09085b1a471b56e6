/* model.qk_norm (Qwen3's per-head RMSNorm of q and k before RoPE): the parameters it adds
 * (HF names, shapes, order), that it normalises each head on its own (scaling one head's
 * q_proj or k_proj rows leaves the loss unchanged, which no other normalisation does),
 * and that its backward is its forward's gradient (central differences on q_norm, k_norm
 * and the projections, in fp32). The float64 check against Hugging Face is the Qwen3-MoE
 * fixture's (tests/test_moe_fixture.c). */
#include <math.h>

#include "fixture_check.h"
#include "grad_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

enum { B = 2, T = 8, VOCAB = 64 };

static int tokens[B * T], targets[B * T];

static double loss_of(ts_model *m)
{
    return fixture_loss_and_grads(m, tokens, targets, B, T, B);
}

static void build(ts_model *m, ts_config *cfg, bool qk_norm)
{
    ts_test_tiny_llama(cfg, VOCAB, T);
    cfg->model.qk_norm = qk_norm;
    cfg->model.norm_eps = 1e-9; /* the scale invariance exact up to rounding */
    ts_config_resolve_model(&cfg->model);
    CHECKF(ts_config_validate(cfg, 0) == TS_OK, "%s", ts_error_message());
    ts_model_build(m, &(ts_model_spec){.arch = &cfg->model, .k = &ts_kernels_cpu});
    ts_model_init_random(m, 7);
    /* Norm weights away from 1, so that a mix-up of q's and k's would show. */
    for (int l = 0; l < cfg->model.n_layer && qk_norm; l++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_norm.weight", l);
        float *q = ts_param_data(m, fixture_param_index(m, name));
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_norm.weight", l);
        float *k = ts_param_data(m, fixture_param_index(m, name));
        for (int c = 0; c < 8; c++) {
            q[c] = 0.6f + 0.1f * (float)c;
            k[c] = 1.4f - 0.07f * (float)c;
        }
    }
}

static void test_parameters(void)
{
    ts_config cfg;
    ts_model m;
    build(&m, &cfg, true);
    /* o_proj, then q_norm and k_norm [head_dim 8], then the MLP's norm. */
    const int b = m.layers[1].first_param;
    CHECK(m.layers[1].n_params == TS_L_NPARAMS + 2);
    CHECK(strcmp(m.params[b + TS_L_O_W + 1].shard.name,
                 "model.layers.0.self_attn.q_norm.weight") == 0);
    CHECK(strcmp(m.params[b + TS_L_O_W + 2].shard.name,
                 "model.layers.0.self_attn.k_norm.weight") == 0);
    const ts_param *qn = &m.params[b + TS_L_O_W + 1];
    CHECK(qn->shard.ndim == 1 && qn->shard.shape[0] == 8 && !qn->decay);
    CHECK(strcmp(m.params[b + TS_L_MLP_NORM_W + 2].shard.name,
                 "model.layers.0.post_attention_layernorm.weight") == 0);
    /* The saved q|k before the norms and their rstd: (4 + 2) heads of 8 per row. */
    ts_config plain;
    ts_test_tiny_llama(&plain, VOCAB, T);
    ts_config_resolve_model(&plain.model);
    const ts_kernels *k = &ts_kernels_cpu;
    const size_t extra = ts_layer_act_bytes(&cfg.model, TS_LAYER_BLOCK, B, T, 1, 0, k) -
                         ts_layer_act_bytes(&plain.model, TS_LAYER_BLOCK, B, T, 1, 0, k);
    CHECKF(extra >= (size_t)B * T * 6 * (8 + 1) * sizeof(float) &&
               extra < (size_t)B * T * 6 * (8 + 1) * sizeof(float) + 128,
           "qk_norm adds %zu activation bytes", extra);
    ts_model_free(&m);
}

/* Scaling head h's rows of a projection by s leaves a per-head-normalised model's loss
 * unchanged (up to eps); the plain model's changes. */
static double loss_after_scaling(bool qk_norm, const char *proj, int head, float s)
{
    ts_config cfg;
    ts_model m;
    build(&m, &cfg, qk_norm);
    const int p = fixture_param_index(&m, proj);
    float *w = ts_param_data(&m, p);
    const int HS = 8, C = 32;
    for (size_t i = (size_t)head * HS * C; i < (size_t)(head + 1) * HS * C; i++) w[i] *= s;
    const double l = loss_of(&m);
    ts_model_free(&m);
    return l;
}

static void test_per_head_invariance(void)
{
    const char *q = "model.layers.1.self_attn.q_proj.weight";
    const char *k = "model.layers.0.self_attn.k_proj.weight";
    const double base = loss_after_scaling(true, q, 0, 1.0f);
    const double lq = loss_after_scaling(true, q, 2, 10.0f);
    const double lk = loss_after_scaling(true, k, 1, 0.25f);
    CHECKF(fabs(lq - base) < 1e-6 && fabs(lk - base) < 1e-6,
           "qk_norm: loss %.9f, with one q head x10 %.9f, one k head x0.25 %.9f", base, lq, lk);
    const double plain = loss_after_scaling(false, q, 0, 1.0f);
    /* (At init the attention logits are small: the scaling moves the loss by ~1e-4, a
     * thousand times the rounding.) */
    const double plain_q = loss_after_scaling(false, q, 2, 10.0f);
    CHECKF(fabs(plain_q - plain) > 1e-5, "without qk_norm the scaling must matter: %.9f %.9f",
           plain, plain_q);
    CHECKF(fabs(plain - base) > 1e-4, "qk_norm changes nothing: %.9f %.9f", plain, base);
}

static void test_gradients(void)
{
    ts_config cfg;
    ts_model m;
    build(&m, &cfg, true);
    loss_of(&m);
    const grad_check c = {.objective = loss_of, .h = 1e-2f, .rel = 3e-2, .abs = 2e-5,
                          .min_grad = 0.0};
    const char *names[] = {"model.layers.0.self_attn.q_norm.weight",
                           "model.layers.1.self_attn.k_norm.weight",
                           "model.layers.1.self_attn.q_proj.weight",
                           "model.layers.0.self_attn.k_proj.weight",
                           "model.layers.0.input_layernorm.weight"};
    for (size_t t = 0; t < sizeof names / sizeof names[0]; t++) {
        const int p = fixture_param_index(&m, names[t]);
        CHECKF(p >= 0, "no %s", names[t]);
        if (p < 0) continue;
        /* The two elements of largest analytic gradient. */
        loss_of(&m);
        const float *g = ts_param_grad(&m, p);
        const size_t n = m.params[p].numel, first = grad_check_largest(g, 0, n, SIZE_MAX);
        const size_t best[2] = {first, grad_check_largest(g, 0, n, first)};
        const double want[2] = {g[best[0]], g[best[1]]};
        for (int j = 0; j < 2; j++) grad_check_element(&m, &c, p, best[j], want[j], names[t]);
    }
    ts_model_free(&m);
}

int main(void)
{
    ts_test_require_blas_core();
    ts_cpu_set_threads(2);
    grad_check_tokens(tokens, targets, B * T, VOCAB);
    test_parameters();
    test_per_head_invariance();
    test_gradients();
    return ts_test_report();
}
