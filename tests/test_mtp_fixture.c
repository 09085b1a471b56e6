/* Multi-token prediction against PyTorch (tests/make_mtp_fixture.py, float64): DeepSeek-V3's
 * MTP written out in torch on the tiny llama of test_llama_fixture, D = 2 modules named
 * model.layers.{2,3}.* (enorm, hnorm, eh_proj over [enorm(emb); hnorm(h)], the block,
 * shared_head.norm), sharing the embedding and lm_head, lambda = 0.3. The main loss and
 * every parameter gradient of the whole objective (main + lambda/D sum_k loss_k), each
 * depth's loss, then 5 AdamW steps (tests/fixture_check.h). The fixture's loss is the
 * main one (the MTP term adds gradients only); each depth's is checked here. */
#include "fixture_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

enum { DEPTHS = 2 };

/* This batch's depth losses (sums over B*T) against the fixture's row `want`. */
static void check_depths(ts_model *m, const double *want, const char *when)
{
    double sums[DEPTHS];
    ts_model_mtp_read(m, sums);
    for (int k = 0; k < DEPTHS; k++) {
        const double got = sums[k] / (FIXTURE_B * FIXTURE_T);
        CHECKF(ts_rel_err(got, want[k], 1e-12) < 1e-5, "%s: depth %d loss %.9f vs torch %.9f",
               when, k + 1, got, want[k]);
        printf("%s: depth %d loss %.9f, torch %.9f\n", when, k + 1, got, want[k]);
    }
}

static void after_grads(ts_model *m, ts_st_file *ef)
{
    size_t n;
    double *want = fixture_read_f64(ef, "mtp_losses", &n);
    CHECK(n == DEPTHS);
    check_depths(m, want, "batch");
    free(want);
}

static void after_step(ts_model *m, ts_st_file *ef, int step)
{
    size_t n;
    double *want = fixture_read_f64(ef, "adamw_mtp_losses", &n);
    CHECK(n == 5 * DEPTHS);
    char when[32];
    snprintf(when, sizeof when, "step %d", step);
    check_depths(m, want + (size_t)step * DEPTHS, when);
    free(want);
}

int main(void)
{
    ts_test_require_blas_core();
    ts_config cfg;
    fixture_llama_config(&cfg);
    cfg.model.mtp_layers = DEPTHS;
    cfg.train.mtp_loss = 0.3;
    ts_config_resolve_model(&cfg.model);
    fixture_train_config(&cfg.train);
    const fixture_hooks hooks = {.after_grads = after_grads, .after_step = after_step};
    /* The embedding, 9 per block, the final norm and the head; each module's block and
     * its 4 (enorm, hnorm, eh_proj, shared_head.norm). */
    return fixture_check_ex(&cfg, "mtp_tiny", 2 + 9 * 2 + 1 + DEPTHS * (9 + 4), NULL, &hooks);
}
