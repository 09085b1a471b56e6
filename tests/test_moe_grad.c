/* The MoE block's backward is its forward's gradient: central differences (fp32) of the
 * objective the trainer descends, cross-entropy + z-loss + sequence-wise balance loss, on
 * the router, the experts' gate|up and down, the shared expert and the attention around
 * them, for a softmax router (Qwen3-MoE's, without renormalisation) and a sigmoid one
 * with groups, renormalisation, a route scale and a shared expert (DeepSeek-V3's). The
 * routers are scaled up so that no selection is within a step of a tie. Also: the
 * parameter list and counts, the auxiliary losses' values on a uniform router, and that
 * the bias changes the selection but not the weights' gradient path. With a capacity
 * (model.moe_capacity 1: 2 of each sequence's 16 assignments per expert) the same on the
 * DeepSeek router, some assignments dropped: the router's gradient through the kept
 * weights only, a dropped one's term absent from the output. The float64 check
 * against Hugging Face is tests/test_moe_fixture.c's. */
#include <math.h>

#include "fixture_check.h"
#include "grad_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

enum { B = 2, T = 8, VOCAB = 64 };

static int tokens[B * T], targets[B * T];

/* Cross-entropy + the auxiliary losses (their sums, as the backward adds them). */
static double objective(ts_model *m)
{
    const double ce = fixture_loss_and_grads(m, tokens, targets, B, T, 1);
    int counts[2 * 8];
    float aux[2];
    ts_model_moe_read(m, counts, aux);
    return ce + aux[0] + aux[1];
}

static void config(ts_config *cfg, bool deepseek)
{
    ts_test_tiny_llama(cfg, VOCAB, T);
    cfg->model.moe_experts = 8;
    cfg->model.moe_top_k = 2;
    cfg->model.moe_ffn_hidden = 16;
    cfg->model.moe_norm_topk = false;
    /* Large enough that their gradients weigh in the router's beside the cross-entropy's. */
    cfg->train.moe_z_loss = 1e-1;
    cfg->train.moe_aux_loss = 1.0;
    if (deepseek) {
        snprintf(cfg->model.moe_router, sizeof cfg->model.moe_router, "sigmoid");
        cfg->model.moe_norm_topk = true;
        cfg->model.moe_route_scale = 2.5;
        cfg->model.moe_groups = 4;
        cfg->model.moe_topk_groups = 2;
        cfg->model.moe_shared_experts = 1;
        cfg->model.moe_first_dense = 1;
    }
    ts_config_resolve_model(&cfg->model);
    CHECKF(ts_config_validate(cfg, 0) == TS_OK, "%s", ts_error_message());
}

static void build(ts_model *m, const ts_config *cfg)
{
    ts_model_build(m, &(ts_model_spec){.arch = &cfg->model, .k = &ts_kernels_cpu,
                                       .moe_z_loss = (float)cfg->train.moe_z_loss,
                                       .moe_aux_loss = (float)cfg->train.moe_aux_loss});
    ts_model_init_random(m, 11);
    for (int p = 0; p < m->n_params; p++) /* distinct router logits: no near-ties */
        if (strstr(m->params[p].shard.name, "mlp.gate.weight")) {
            float *w = ts_param_data(m, p);
            for (size_t i = 0; i < m->params[p].numel; i++) w[i] *= 40.0f;
        }
}

static void test_layout(void)
{
    ts_config cfg;
    ts_model m;
    config(&cfg, true);
    build(&m, &cfg);
    /* Block 0 dense (9), block 1 MoE: 6 + router + 8 * 3 + shared 3. */
    CHECK(!m.layers[1].moe && m.layers[2].moe);
    CHECK(m.layers[1].n_params == 9 && m.layers[2].n_params == 6 + 1 + 24 + 3);
    const int b = m.layers[2].first_param;
    CHECK(strcmp(m.params[b + 6].shard.name, "model.layers.1.mlp.gate.weight") == 0);
    CHECK(strcmp(m.params[b + 7].shard.name, "model.layers.1.mlp.experts.0.gate_proj.weight") == 0);
    CHECK(m.params[b + 7].offset + m.params[b + 7].numel == m.params[b + 8].offset); /* gate|up */
    CHECK(strcmp(m.params[b + 31].shard.name,
                 "model.layers.1.mlp.shared_experts.gate_proj.weight") == 0);
    CHECK(m.params[b + 33].shard.shape[0] == 32 && m.params[b + 33].shard.shape[1] == 16);
    size_t total = 0, active;
    for (int p = 0; p < m.n_params; p++) total += m.params[p].numel;
    CHECK(total == ts_model_logical_params(&cfg.model));
    active = ts_model_active_params(&cfg.model);
    CHECK(total - active == (size_t)(8 - 2) * 3 * 16 * 32); /* 6 unused experts */
    ts_model_free(&m);

    /* Mixtral's shape takes Mixtral's names. */
    config(&cfg, false);
    cfg.model.moe_norm_topk = true;
    CHECK(ts_model_moe_mixtral(&cfg.model));
    build(&m, &cfg);
    CHECK(fixture_param_index(&m, "model.layers.0.block_sparse_moe.gate.weight") >= 0);
    CHECK(fixture_param_index(&m, "model.layers.1.block_sparse_moe.experts.7.w2.weight") >= 0);
    ts_model_free(&m);
}

static void check_gradients(bool deepseek, double capacity)
{
    ts_config cfg;
    ts_model m;
    config(&cfg, deepseek);
    cfg.model.moe_capacity = capacity;
    build(&m, &cfg);
    if (capacity > 0) { /* some assignments dropped, not all */
        objective(&m);
        int counts[2 * 8], kept = 0;
        float aux[2];
        ts_model_moe_read(&m, counts, aux);
        for (int i = 0; i < 2 * 8; i++) kept += counts[i];
        CHECKF(kept > 0 && kept < B * T * 2, "capacity %g kept %d of %d", capacity, kept,
               B * T * 2);
    }
    const grad_check c = {.objective = objective, .h = 2e-3f, .rel = 3e-2, .abs = 2e-5,
                          .min_grad = 0.0};
    const char *names[] = {"model.layers.1.mlp.gate.weight",
                           "model.layers.1.mlp.experts.3.gate_proj.weight",
                           "model.layers.1.mlp.experts.5.up_proj.weight",
                           "model.layers.1.mlp.experts.0.down_proj.weight",
                           "model.layers.1.mlp.shared_experts.up_proj.weight",
                           "model.layers.1.post_attention_layernorm.weight",
                           "model.layers.0.self_attn.q_proj.weight"};
    for (size_t t = 0; t < sizeof names / sizeof names[0]; t++) {
        const int p = fixture_param_index(&m, names[t]);
        if (p < 0) {
            CHECKF(!deepseek ? strstr(names[t], "shared") != NULL : false, "no %s", names[t]);
            continue;
        }
        objective(&m);
        const float *g = ts_param_grad(&m, p);
        const size_t best = grad_check_largest(g, 0, m.params[p].numel, SIZE_MAX);
        char what[160];
        snprintf(what, sizeof what, "%s%s %s", deepseek ? "deepseek" : "softmax",
                 capacity > 0 ? " (capacity)" : "", names[t]);
        grad_check_element(&m, &c, p, best, g[best], what);
    }
    ts_model_free(&m);
}

/* A router of zeros: every score 1/E (softmax), so the z-loss is cz * log(E)^2 per token
 * and block, over B*T tokens, and the balance loss a * sum_i f_i / E = a per sequence and
 * block whatever the selection. */
static void test_aux_values(void)
{
    ts_config cfg;
    ts_model m;
    config(&cfg, false);
    build(&m, &cfg);
    for (int p = 0; p < m.n_params; p++)
        if (strstr(m.params[p].shard.name, "mlp.gate.weight"))
            memset(ts_param_data(&m, p), 0, m.params[p].numel * sizeof(float));
    fixture_loss_and_grads(&m, tokens, targets, B, T, 1);
    int counts[2 * 8];
    float aux[2];
    ts_model_moe_read(&m, counts, aux);
    const double z = 2 * 1e-1 * log(8.0) * log(8.0), a = 2 * 1.0;
    CHECKF(fabs(aux[0] - z) < 1e-5 && fabs(aux[1] - a) < 1e-5, "z %.9g (want %.9g), aux %.9g "
           "(want %.9g)", aux[0], z, aux[1], a);
    /* Ties go to the lower index: experts 0 and 1 get every token. */
    CHECKF(counts[0] == B * T && counts[1] == B * T && counts[2] == 0, "counts %d %d %d",
           counts[0], counts[1], counts[2]);
    /* The bias moves the starved experts up, the busy ones down, and the selection with. */
    ts_model_moe_update_bias(&m, counts, B * T, 0.5f);
    fixture_loss_and_grads(&m, tokens, targets, B, T, 1);
    ts_model_moe_read(&m, counts, aux);
    CHECKF(counts[0] == 0 && counts[1] == 0 && counts[2] == B * T && counts[3] == B * T,
           "after the bias: counts %d %d %d %d", counts[0], counts[1], counts[2], counts[3]);
    CHECKF(fabs(aux[1] - a) < 1e-5, "the balance loss with a uniform router: %.9g", aux[1]);
    ts_model_free(&m);
}

int main(void)
{
    ts_test_require_blas_core();
    ts_cpu_set_threads(2);
    grad_check_tokens(tokens, targets, B * T, VOCAB);
    test_layout();
    check_gradients(false, 0.0);
    check_gradients(true, 0.0);
    check_gradients(true, 1.0);
    test_aux_values();
    return ts_test_report();
}
