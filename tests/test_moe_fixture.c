/* Tessera's Mixture of Experts against PyTorch (tests/make_moe_fixture.py, float64; its
 * model, tests/torch_moe.py, is Hugging Face's MixtralForCausalLM and Qwen3MoeForCausalLM
 * and DeepSeek-V3's routing written out), on tests/test_llama_fixture.c's tiny llama:
 *   mixtral_tiny   both blocks MoE, 4 experts top-2 of 24, softmax, norm_topk (Mixtral's
 *                  names);
 *   qwen3moe_tiny  block 1 MoE (moe_every 2), softmax without norm_topk, qk_norm, heads
 *                  of 16 (model.head_dim; n_embd / n_head is 8);
 *   dsmoe_tiny     3 blocks, the first dense, 16 experts top-4 in 4 groups (2 kept),
 *                  sigmoid, norm_topk, route scale 2.5, a shared expert, z-loss,
 *                  sequence-wise balance loss and the aux-loss-free bias (moved after
 *                  every step, loaded from the weights' e_score_correction_bias).
 * Each: the loss and every gradient of one batch (the auxiliary losses' included), the
 * routing's counts and losses, then 5 AdamW steps with the bias updates
 * (tests/fixture_check.h), the bias after them too. All within the llama fixture's
 * tolerances (worst relative gradient error 5e-7, parameters after 5 steps 2e-5). */
#include <unistd.h>

#include "fixture_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

static const ts_config *g_cfg;

static void tiny_moe(ts_config *cfg, int n_layer)
{
    ts_test_tiny_llama(cfg, 96, 16);
    cfg->model.n_layer = n_layer;
    cfg->model.rope_theta = 10000.0;
    cfg->model.norm_eps = 1e-5;
    cfg->model.tie_embeddings = false;
    cfg->model.moe_experts = 4;
    cfg->model.moe_top_k = 2;
    cfg->model.moe_ffn_hidden = 24;
    fixture_train_config(&cfg->train);
}

/* This batch's counts and losses ([n_layer*E] and [2]) against the expect file's: the
 * records of the first forward, or row `step` of the steps' (step >= 0). */
static void check_routing(ts_model *m, ts_st_file *ef, int step)
{
    const int E = m->moe_experts;
    int *counts = ts_malloc((size_t)m->n_layer * E * sizeof(int));
    float losses[2];
    ts_model_moe_read(m, counts, losses);
    const char *pre = step < 0 ? "" : "adamw_";
    char name[96];
    const char *loss_names[2] = {"moe_z_loss", "moe_aux_loss"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s%s", pre, loss_names[i]);
        double *want = fixture_read_f64(ef, name, NULL);
        const double w = want[step < 0 ? 0 : step];
        CHECKF(fabs(losses[i] - w) <= 1e-5 * fabs(w) + 1e-9, "%s step %d: %.9g, torch %.9g",
               loss_names[i], step, losses[i], w);
        free(want);
    }
    for (int l = 0; l < m->n_layer; l++) {
        if (!m->layers[l + 1].moe) continue;
        snprintf(name, sizeof name, "%smoe_counts.%d", pre, l);
        const int rows = step < 0 ? 1 : 5;
        int *want = ts_malloc((size_t)rows * E * sizeof(int));
        fixture_read_i32(ef, name, want, (size_t)rows * E);
        const int *w = want + (size_t)(step < 0 ? 0 : step) * E;
        for (int e = 0; e < E; e++)
            CHECKF(counts[(size_t)l * E + e] == w[e], "block %d expert %d step %d: %d tokens, "
                   "torch %d", l, e, step, counts[(size_t)l * E + e], w[e]);
        free(want);
    }
    /* The step's bias update, as the trainer makes it (B*T tokens); after the last, the
     * bias against the fixture's final one. */
    if (step >= 0)
        ts_model_moe_update_bias(m, counts, (long long)FIXTURE_B * FIXTURE_T,
                                 (float)g_cfg->train.moe_bias_rate);
    if (step == 4 && g_cfg->train.moe_bias_rate > 0.0) {
        float *bias = ts_malloc((size_t)m->n_layer * E * sizeof(float));
        m->k->memcpy_d2h(bias, m->moe_bias, (size_t)m->n_layer * E * sizeof(float));
        for (int l = 0; l < m->n_layer; l++) {
            if (!m->layers[l + 1].moe) continue;
            snprintf(name, sizeof name, "final.model.layers.%d.mlp.gate.e_score_correction_bias",
                     l);
            double *want = fixture_read_f64(ef, name, NULL);
            double err = 0.0, size = 0.0;
            for (int e = 0; e < E; e++) {
                err = fmax(err, fabs(bias[(size_t)l * E + e] - want[e]));
                size = fmax(size, fabs(want[e]));
            }
            CHECKF(err < 1e-6 && size > 0.0, "block %d's bias after 5 steps: off by %g", l, err);
            free(want);
        }
        free(bias);
    }
    free(counts);
}

static void after_grads(ts_model *m, ts_st_file *ef) { check_routing(m, ef, -1); }
static void after_step(ts_model *m, ts_st_file *ef, int step) { check_routing(m, ef, step); }

/* A fixture's test; 77 (skipped) when make_moe_fixture.py has not written it. */
static int run(const ts_config *cfg, const char *stem, int n_params)
{
    char path[4096];
    const char *root = getenv("TS_SOURCE_DIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/%s_expect.safetensors", root ? root : ".",
             stem);
    if (access(path, R_OK) != 0) {
        printf("%s: no fixture yet (tests/make_moe_fixture.py): skipped\n", stem);
        return 77;
    }
    printf("== %s\n", stem);
    CHECKF(ts_config_validate(cfg, 0) == TS_OK, "%s: %s", stem, ts_error_message());
    g_cfg = cfg;
    const fixture_hooks hooks = {.after_grads = after_grads, .after_step = after_step};
    return fixture_check_ex(cfg, stem, n_params, NULL, &hooks);
}

int main(void)
{
    ts_test_require_blas_core();
    static ts_config mixtral, qwen, ds;
    tiny_moe(&mixtral, 2);
    ts_config_resolve_model(&mixtral.model);

    tiny_moe(&qwen, 2);
    qwen.model.moe_norm_topk = false;
    qwen.model.moe_every = 2;
    qwen.model.qk_norm = true;
    qwen.model.head_dim = 16; /* not n_embd / n_head = 8: Qwen3-MoE's wider heads */
    ts_config_resolve_model(&qwen.model);

    tiny_moe(&ds, 3);
    ds.model.moe_experts = 16;
    ds.model.moe_top_k = 4;
    ds.model.moe_shared_experts = 1;
    snprintf(ds.model.moe_router, sizeof ds.model.moe_router, "sigmoid");
    ds.model.moe_route_scale = 2.5;
    ds.model.moe_groups = 4;
    ds.model.moe_topk_groups = 2;
    ds.model.moe_first_dense = 1;
    ds.train.moe_z_loss = 1e-3;
    ds.train.moe_aux_loss = 1e-2;
    ds.train.moe_bias_rate = 1e-2;
    ts_config_resolve_model(&ds.model);

    /* Parameters: the embedding, the final norm and lm_head; a dense block's 9 (+2 with
     * qk_norm), an MoE block's 6 + router + 3 per expert (+2 with qk_norm, +3 shared). */
    int rc = 0, ran = 0;
    const struct {
        const ts_config *cfg;
        const char *stem;
        int n_params;
    } fx[] = {{&mixtral, "mixtral_tiny", 3 + 2 * (7 + 12)},
              {&qwen, "qwen3moe_tiny", 3 + 11 + (9 + 12)},
              {&ds, "dsmoe_tiny", 3 + 9 + 2 * (7 + 48 + 3)}};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        const int r = run(fx[i].cfg, fx[i].stem, fx[i].n_params);
        if (r == 77) continue;
        ran++;
        rc |= r;
    }
    return ran ? rc : 77;
}
