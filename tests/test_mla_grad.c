/* Multi-head latent attention (model/mla.c) on one rank: the parameter list (DeepSeek-V3's
 * Hugging Face names and shapes, the two down-projections packed, the count), YaRN's
 * inverse frequencies, attention factor and softmax scale against numbers transformers
 * printed (modeling_rope_utils' _compute_yarn_parameters and yarn_apply_mscale, 5.x), and
 * the backward is the forward's gradient: central differences (fp32) of the loss on every
 * MLA weight (the down-projection's latent and rope-key rows each), with a q latent and
 * without (q_proj), YaRN on. Also, bit for bit: selective recompute (k, v and the
 * probabilities rebuilt from the latent) gives the gradients of the kept activations, and
 * the zero-bubble split (input pass, then weight pass) those of one backward. The float64
 * check against transformers' DeepseekV3 is the fixture test's (the hf part). */
#include <math.h>

#include "fixture_check.h"
#include "grad_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

enum { B = 2, T = 8, VOCAB = 64 };

static int tokens[B * T], targets[B * T];

static void config(ts_config *cfg, int q_lora)
{
    ts_test_tiny_llama(cfg, VOCAB, T);
    cfg->model.n_kv_head = 0;
    cfg->model.n_embd = 32;
    cfg->model.q_lora_rank = q_lora;
    cfg->model.kv_lora_rank = 16;
    cfg->model.qk_nope_head_dim = 8;
    cfg->model.qk_rope_head_dim = 4;
    cfg->model.v_head_dim = 6; /* v narrower than q/k: the kernels' HSV != HS */
    snprintf(cfg->model.rope_type, sizeof cfg->model.rope_type, "yarn");
    cfg->model.rope_scaling = 4.0;
    cfg->model.rope_original_context = 4;
    cfg->model.rope_mscale = 1.0;
    cfg->model.rope_mscale_all_dim = 0.8;
    ts_config_resolve_model(&cfg->model);
    CHECKF(ts_config_validate(cfg, 0) == TS_OK, "%s", ts_error_message());
}

static void build(ts_model *m, const ts_config *cfg, bool selective)
{
    ts_model_build(m, &(ts_model_spec){.arch = &cfg->model, .k = &ts_kernels_cpu,
                                       .selective_all = selective});
    ts_model_init_random(m, 11);
    /* Larger weights than 0.02's, so that every path's gradient stands above fp32's noise
     * in the central differences. */
    for (int p = 0; p < m->n_params; p++)
        if (m->params[p].shard.ndim == 2) {
            float *w = ts_param_data(m, p);
            for (size_t i = 0; i < m->params[p].numel; i++) w[i] *= 10.0f;
        }
}

static void test_layout(void)
{
    ts_config cfg;
    ts_model m;
    config(&cfg, 12);
    build(&m, &cfg, false);
    const char *names[] = {"input_layernorm", "self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa",
                           "self_attn.q_a_layernorm", "self_attn.q_b_proj",
                           "self_attn.kv_a_layernorm", "self_attn.kv_b_proj", "self_attn.o_proj",
                           "post_attention_layernorm"};
    const int64_t shape[][2] = {{32, 0}, {12, 32}, {20, 32}, {12, 0}, {48, 12},
                                {16, 0}, {56, 16}, {32, 24}, {32, 0}};
    const int b = m.layers[2].first_param;
    CHECK(m.layers[2].n_params == 12);
    for (int i = 0; i < 9; i++) {
        char want[96];
        snprintf(want, sizeof want, "model.layers.1.%s.weight", names[i]);
        const ts_shard_spec *s = &m.params[b + i].shard;
        CHECKF(strcmp(s->name, want) == 0 && s->shape[0] == shape[i][0] &&
                   (s->ndim == 1 || s->shape[1] == shape[i][1]),
               "param %d: %s [%lld, %lld], want %s", i, s->name, (long long)s->shape[0],
               s->ndim > 1 ? (long long)s->shape[1] : 0LL, want);
    }
    /* q_a_proj|kv_a_proj_with_mqa: one weight. */
    CHECK(m.params[b + 1].offset + m.params[b + 1].numel == m.params[b + 2].offset);
    size_t total = 0;
    for (int p = 0; p < m.n_params; p++) total += m.params[p].numel;
    CHECK(total == ts_model_logical_params(&cfg.model));
    ts_model_free(&m);
    /* Context parallelism exchanges the latent (mla_cp.c; its grids: test_moe_grids). */
    cfg.parallel.cp = 2;
    CHECKF(ts_config_validate(&cfg, 0) == TS_OK, "MLA with cp 2: %s", ts_error_message());
    config(&cfg, 0);
    build(&m, &cfg, false);
    CHECK(fixture_param_index(&m, "model.layers.0.self_attn.q_proj.weight") ==
          m.layers[1].first_param + 1);
    CHECK(fixture_param_index(&m, "model.layers.0.self_attn.q_a_proj.weight") < 0);
    total = 0;
    for (int p = 0; p < m.n_params; p++) total += m.params[p].numel;
    CHECK(total == ts_model_logical_params(&cfg.model));
    ts_model_free(&m);
}

/* transformers 5.x, DeepseekV3Config(qk_rope_head_dim = 32, rope_theta 10000, yarn factor
 * 40, original_max_position_embeddings 4096, beta 32/1, mscale 1, mscale_all_dim 1):
 * _compute_yarn_parameters' inv_freq (fp32) and attention factor 1.0; with factor 4,
 * mscale_all_dim 0.8 the factor 1.0249579607969668 and yarn_apply_mscale(24^-0.5)
 * 0.25191097422871067. */
static void test_yarn(void)
{
    static const double want[16] = {
        1.0, 0.5623413324356079, 0.3162277638912201, 0.17782793939113617,
        0.10000000149011612, 0.05623412877321243, 0.027218176051974297, 0.012829016894102097,
        0.005821428261697292, 0.0024903686717152596, 0.0009599771583452821,
        0.00029214590904302895, 2.499999936844688e-05, 1.4058532542549074e-05,
        7.905694474175107e-06, 4.445698323252145e-06};
    ts_config cfg;
    config(&cfg, 12);
    ts_model_config mc = cfg.model;
    mc.rope_theta = 10000.0;
    mc.rope_scaling = 40.0;
    mc.rope_original_context = 4096;
    mc.rope_mscale_all_dim = 1.0;
    double inv[16];
    ts_rope_inv_freq(&mc, inv, 32);
    for (int i = 0; i < 16; i++)
        CHECKF(fabs(inv[i] - want[i]) <= 1e-6 * want[i], "yarn inv_freq[%d] %.9g, want %.9g", i,
               inv[i], want[i]);
    CHECK(ts_rope_attention_factor(&mc) == 1.0);
    CHECKF(fabs(ts_rope_attention_factor(&cfg.model) - 1.0249579607969668) < 1e-12, "%.17g",
           ts_rope_attention_factor(&cfg.model));
    /* The softmax scale: q/k heads of 8 + 4 channels here; 24 as transformers printed. */
    mc = cfg.model;
    mc.qk_nope_head_dim = 20;
    CHECKF(fabs(ts_model_att_scale(&mc) - 0.25191097422871067) < 1e-12, "%.17g",
           ts_model_att_scale(&mc));
    /* DeepSeek-V3's: 1.8738542 / sqrt(192) (MLA_NOTES). */
    mc.qk_nope_head_dim = 128;
    mc.qk_rope_head_dim = 64;
    mc.rope_scaling = 40.0;
    mc.rope_mscale_all_dim = 1.0;
    CHECKF(fabs(ts_model_att_scale(&mc) - 0.13523378) < 1e-7, "%.9g", ts_model_att_scale(&mc));
    /* A llama without MLA keeps 1/sqrt(head_dim), YaRN or not (LlamaAttention's). */
    ts_config plain;
    ts_test_tiny_llama(&plain, VOCAB, T);
    snprintf(plain.model.rope_type, sizeof plain.model.rope_type, "yarn");
    plain.model.rope_scaling = 4.0;
    plain.model.rope_mscale_all_dim = 1.0;
    CHECK(ts_model_att_scale(&plain.model) == 1.0 / sqrt(8.0));
}

static double loss(ts_model *m)
{
    return fixture_loss_and_grads(m, tokens, targets, B, T, B);
}

static void check_gradients(int q_lora)
{
    ts_config cfg;
    ts_model m;
    config(&cfg, q_lora);
    build(&m, &cfg, false);
    /* Each parameter's largest gradient, and for the packed down-projection also the
     * largest in its latent rows and in its rope-key rows. */
    struct {
        const char *name;
        size_t from, to; /* the rows (in elements) searched; to 0: all */
    } cases[] = {
        {"model.layers.1.self_attn.q_a_proj.weight", 0, 0},
        {"model.layers.1.self_attn.q_proj.weight", 0, 0},
        {"model.layers.1.self_attn.q_a_layernorm.weight", 0, 0},
        {"model.layers.1.self_attn.q_b_proj.weight", 0, 0},
        {"model.layers.1.self_attn.kv_a_proj_with_mqa.weight", 0, 16 * 32},
        {"model.layers.1.self_attn.kv_a_proj_with_mqa.weight", 16 * 32, 20 * 32},
        {"model.layers.1.self_attn.kv_a_layernorm.weight", 0, 0},
        {"model.layers.1.self_attn.kv_b_proj.weight", 0, 0},
        {"model.layers.0.self_attn.o_proj.weight", 0, 0},
        {"model.layers.0.input_layernorm.weight", 0, 0},
        {"model.embed_tokens.weight", 0, 0},
    };
    const grad_check c = {.objective = loss, .h = 1e-2f, .rel = 2e-2, .abs = 1e-5,
                          .min_grad = 1e-4};
    int checked = 0;
    loss(&m); /* the backward's gradients, once (the differences restore every weight) */
    float *grads = ts_alloc_floats(m.num_floats);
    memcpy(grads, m.grad_mem, m.num_floats * sizeof(float));
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int p = fixture_param_index(&m, cases[t].name);
        if (p < 0) continue; /* q_a_* without a q latent, q_proj with one */
        const float *g = grads + m.params[p].offset;
        const size_t to = cases[t].to ? cases[t].to : m.params[p].numel;
        const size_t best = grad_check_largest(g, cases[t].from, to, SIZE_MAX);
        char what[128];
        snprintf(what, sizeof what, "q_lora %d, %s", q_lora, cases[t].name);
        grad_check_element(&m, &c, p, best, g[best], what);
        checked++;
    }
    CHECK(checked == (q_lora ? 10 : 8));
    free(grads);
    ts_model_free(&m);
}

/* One forward and backward of the whole batch, the trainer's way (the scratch's regions
 * for the forwards too); with `split`, the zero-bubble input pass then weight pass. */
static void step(ts_model *m, bool split)
{
    ts_acts a;
    ts_scratch s;
    ts_acts_init(&a, m, 0, m->n_layers, B, T);
    ts_scratch_init(&s, m, B, T);
    a.att_work = ts_scratch_attention_work(&s, m, B, T);
    a.mla_work = ts_scratch_mla_work(&s, m, B, T);
    memcpy(a.tokens, tokens, sizeof tokens);
    memcpy(a.targets, targets, sizeof targets);
    memset(m->grad_mem, 0, m->num_floats * sizeof(float));
    float *dx = ts_alloc_floats((size_t)B * T * m->n_embd);
    ts_model_forward(m, &a, 1.0f / (float)(B * T), NULL);
    if (split) {
        ts_model_backward_input(m, &a, dx, &s);
        ts_model_backward_weight(m, &a, &s);
    } else {
        ts_model_backward(m, &a, dx, &s, NULL, NULL);
    }
    free(dx);
    ts_scratch_free(&s);
    ts_acts_free(&a);
}

static void test_same_bits(void)
{
    ts_config cfg;
    config(&cfg, 12);
    ts_model kept, sel;
    build(&kept, &cfg, false);
    build(&sel, &cfg, true);
    step(&kept, false);
    step(&sel, false);
    CHECK(kept.num_floats == sel.num_floats);
    CHECKF(memcmp(kept.grad_mem, sel.grad_mem, kept.num_floats * sizeof(float)) == 0,
           "selective recompute changed the gradients");
    /* Selective keeps q and the latents, not q|k|v. */
    CHECK(ts_acts_bytes(&sel, 1, 2, B, T) < ts_acts_bytes(&kept, 1, 2, B, T));
    float *one = ts_alloc_floats(kept.num_floats);
    memcpy(one, kept.grad_mem, kept.num_floats * sizeof(float));
    step(&kept, true);
    CHECKF(memcmp(one, kept.grad_mem, kept.num_floats * sizeof(float)) == 0,
           "the zero-bubble split changed the gradients");
    double norm = 0;
    for (size_t i = 0; i < kept.num_floats; i++) norm += (double)one[i] * one[i];
    CHECK(norm > 0);
    free(one);
    ts_model_free(&kept);
    ts_model_free(&sel);
}

int main(void)
{
    ts_test_require_blas_core();
    ts_cpu_set_threads(2);
    grad_check_tokens(tokens, targets, B * T, VOCAB);
    test_layout();
    test_yarn();
    check_gradients(12);
    check_gradients(0);
    test_same_bits();
    return ts_test_report();
}
