/* Tessera's GPT-2 against PyTorch (tests/make_fixture.py, float64): the loss and every
 * parameter gradient of one batch, then 5 AdamW steps with clipping and the LR
 * schedule (tests/fixture_check.h). This is what proves the model is nanoGPT's and the
 * optimizer torch's. */
#include <math.h>
#include <string.h>

#include "fixture_check.h"
#include "test_blas_kernel.h"
#include "test_util.h"

/* The key bias has an exactly zero gradient (softmax ignores a shift shared by a row);
 * Adam divides the float rounding noise by its own root-mean-square and moves it by ~lr
 * in a random direction. Check the query and value biases to 1e-4 and the key bias only
 * to the size of its updates. */
static double key_bias_err(const ts_model *m, int p, const double *w, double err)
{
    if (!strstr(m->params[p].shard.name, "attn.c_attn.bias")) return err;
    const int C = m->n_embd;
    const float *b = ts_param_data(m, p);
    for (int i = C; i < 2 * C; i++)
        CHECKF(fabs(b[i] - w[i]) < 5 * 1e-2, "key bias %d moved %g", i, fabs(b[i] - w[i]));
    return fmax(fixture_rel_norm_err(b, w, (size_t)C),
                fixture_rel_norm_err(b + 2 * C, w + 2 * C, (size_t)C));
}

int main(void)
{
    ts_test_require_blas_core();
    ts_config cfg;
    ts_config_defaults(&cfg);
    cfg.model.n_layer = 2;
    cfg.model.n_head = 2;
    cfg.model.n_embd = 32;
    cfg.model.vocab_size = 96;
    cfg.model.seq_len = 16;
    fixture_train_config(&cfg.train);
    /* wte, wpe, 12 per block, ln_f's weight and bias (the head is tied to wte). */
    return fixture_check(&cfg, "gpt2_tiny", 2 + 12 * 2 + 2, key_bias_err);
}
