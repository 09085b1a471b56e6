/* Tessera's DeepSeek-V3 against Hugging Face transformers' own DeepseekV3ForCausalLM
 * (tests/make_deepseek_fixture.py, float64): multi-head latent attention (q and kv
 * latents with their RMSNorms, the shared rope key, interleaved rope pairs, YaRN past the
 * original context with both mscales), the first block dense, then DeepSeekMoE (8
 * experts top-2 in 2 groups keeping 1, sigmoid scores plus a non-zero
 * e_score_correction_bias, norm_topk, scale 2.5, a shared expert). The model is what
 * model.init makes of the fixture's save_pretrained directory: its config.json through
 * the config loader (every shape, routing and rope key from it: config_hf_deepseek.c),
 * its model.safetensors (HF's checkpoint names, the biases into the model's state).
 * Checked (tests/fixture_check.h): the loss and every gradient of one batch, the same
 * with one micro-batch, 5 AdamW steps (losses, grad norms, final parameters), and each
 * forward's tokens per expert of both MoE blocks; the biases as loaded. */
#include <unistd.h>

#include "config/config.h"
#include "fixture_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

enum { DS_BLOCKS = 3, DS_EXPERTS = 8 };

/* Each MoE block's tokens per expert against the expect file's: the first forward's
 * (step < 0) or step `step`'s. */
static void check_counts(ts_model *m, ts_st_file *ef, int step)
{
    const int E = m->moe_experts;
    CHECK(E == DS_EXPERTS && m->n_layer == DS_BLOCKS);
    int counts[DS_BLOCKS * DS_EXPERTS];
    float losses[2];
    ts_model_moe_read(m, counts, losses);
    for (int l = 0; l < m->n_layer; l++) {
        if (!m->layers[l + 1].moe) continue;
        char name[64];
        int want[5 * DS_EXPERTS];
        const int rows = step < 0 ? 1 : 5;
        snprintf(name, sizeof name, "%smoe_counts.%d", step < 0 ? "" : "adamw_", l);
        fixture_read_i32(ef, name, want, (size_t)rows * E);
        const int *w = want + (step < 0 ? 0 : step) * E;
        for (int e = 0; e < E; e++)
            CHECKF(counts[l * E + e] == w[e], "block %d expert %d step %d: %d tokens, HF %d", l,
                   e, step, counts[l * E + e], w[e]);
    }
}

/* The biases model.init read from mlp.gate.e_score_correction_bias: the fixture's
 * (stored as final.NAME: they do not move), exactly; dense block 0's zero. */
static void check_bias(ts_model *m, ts_st_file *ef)
{
    const int E = m->moe_experts;
    float bias[DS_BLOCKS * DS_EXPERTS];
    m->k->memcpy_d2h(bias, m->moe_bias, sizeof bias);
    for (int l = 0; l < m->n_layer; l++) {
        char name[96];
        snprintf(name, sizeof name, "final.model.layers.%d.mlp.gate.e_score_correction_bias", l);
        if (!m->layers[l + 1].moe) {
            for (int e = 0; e < E; e++) CHECK(bias[l * E + e] == 0.0f);
            continue;
        }
        double *want = fixture_read_f64(ef, name, NULL);
        double size = 0.0;
        for (int e = 0; e < E; e++) {
            CHECKF(bias[l * E + e] == (float)want[e], "block %d bias %d: %g, HF %g", l, e,
                   bias[l * E + e], want[e]);
            size = fmax(size, fabs(want[e]));
        }
        CHECKF(size > 0.0, "block %d's bias is zero: the fixture checks nothing of it", l);
        free(want);
    }
}

static void after_grads(ts_model *m, ts_st_file *ef)
{
    check_bias(m, ef);
    check_counts(m, ef, -1);
}
static void after_step(ts_model *m, ts_st_file *ef, int step) { check_counts(m, ef, step); }

int main(void)
{
    ts_test_require_blas_core();
    const char *root = getenv("TS_SOURCE_DIR");
    char dir[4096], init[4200];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/deepseek_tiny", root ? root : ".");
    if (access(dir, R_OK) != 0) {
        printf("deepseek_tiny: no fixture (tests/make_deepseek_fixture.py): skipped\n");
        return 77;
    }
    /* The config from the fixture's config.json alone, as `model = { init = DIR; }`. */
    static ts_config cfg;
    snprintf(init, sizeof init, "model.init=\"%s\"", dir);
    const char *ov[] = {init, "model.seq_len=16"};
    CHECKF(ts_config_load(&cfg, NULL, ov, 2, 0) == TS_OK, "%s", ts_error_message());
    const ts_model_config *mc = &cfg.model;
    CHECK(ts_model_is_mla(mc) && mc->moe_experts == DS_EXPERTS && mc->n_layer == DS_BLOCKS);
    CHECK(!strcmp(mc->rope_type, "yarn") && mc->rope_original_context < mc->seq_len);
    fixture_train_config(&cfg.train);
    CHECK(ts_config_validate(&cfg, 0) == TS_OK);
    /* Parameters: the embedding, the final norm and lm_head; each block's 9 of MLA and
     * its norms, the dense block's 3, an MoE block's router, 3 per expert and 3 shared. */
    const fixture_hooks hooks = {.after_grads = after_grads, .after_step = after_step,
                                 .weights = "deepseek_tiny"};
    printf("== deepseek_tiny\n");
    return fixture_check_ex(&cfg, "deepseek_tiny", 3 + (9 + 3) + 2 * (9 + 1 + 3 * DS_EXPERTS + 3),
                            NULL, &hooks);
}
