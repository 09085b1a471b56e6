/* Muon against torch.optim.Muon (tests/make_muon_fixture.py, float64 with the Newton-Schulz
 * iteration in float64 too): the llama fixture's model and batch, 5 steps of Muon on the
 * blocks' matrices and AdamW on the rest, clipping and the learning-rate schedule, in two
 * configurations (a: torch's defaults, Nesterov, match_rms_adamw; b: momentum 0.9 without
 * Nesterov, the quintic coefficients over 6 steps, the "original" scale). Each step's
 * loss and norm, and every parameter after the 5 steps, within relative 1e-5 of torch's
 * (measured: 8.2e-7 at worst, in fp32 against float64). */
#include "fixture_check.h"
#include "optim/muon.h"
#include "test_util.h"

static void run(const ts_config *base, ts_st_file *ef, const char *prefix, const char *wpath,
                const int *tokens, const int *targets, double *worst)
{
    ts_config cfg = *base;
    ts_train_config *tc = &cfg.train;
    snprintf(tc->optimizer, sizeof tc->optimizer, "muon");
    if (strcmp(prefix, "b") == 0) {
        tc->muon_momentum = 0.9;
        tc->muon_nesterov = false;
        tc->muon_ns_steps = 6;
        snprintf(tc->muon_coefficients, sizeof tc->muon_coefficients, "quintic");
        snprintf(tc->muon_scale, sizeof tc->muon_scale, "original");
    }
    CHECK(ts_config_validate(&cfg, 1) == TS_OK);
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &cfg.model, .k = &ts_kernels_cpu});
    if (ts_ckpt_load_model_init(&m, wpath) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        exit(1);
    }
    ts_adamw adamw;
    ts_adamw_init(&adamw, &m);
    bool *mask = ts_muon_mask(&m);
    int n_muon = 0;
    for (int p = 0; p < m.n_params; p++) n_muon += mask[p];
    CHECKF(n_muon == 7 * 2, "%d Muon matrices, want q, k, v, o, gate, up, down of 2 blocks",
           n_muon);
    ts_adamw_exclude(&adamw, &m, mask);
    free(mask);
    ts_muon muon;
    ts_muon_init_all(&muon, &m, tc);
    /* AdamW's moments cover the rest only; Muon's momentum the matrices. */
    size_t numel = 0;
    for (int p = 0; p < m.n_params; p++) numel += m.params[p].numel;
    CHECKF(adamw.n_floats + muon.n_floats == numel, "moments %zu + momentum %zu floats, want %zu",
           adamw.n_floats, muon.n_floats, numel);

    char name[200];
    snprintf(name, sizeof name, "%s.muon_losses", prefix);
    double *ref_losses = fixture_read_f64(ef, name, NULL);
    snprintf(name, sizeof name, "%s.muon_grad_norms", prefix);
    double *ref_norms = fixture_read_f64(ef, name, NULL);
    for (int step = 0; step < 5; step++) {
        double l = fixture_loss_and_grads(&m, tokens, targets, FIXTURE_B, FIXTURE_T, 2);
        double norm = sqrt(ts_grad_sum_squares(&m));
        double lr = ts_lr_at(tc, step);
        CHECKF(ts_rel_err(l, ref_losses[step], 1e-12) < 1e-5, "%s step %d loss %.9f vs %.9f",
               prefix, step, l, ref_losses[step]);
        CHECKF(ts_rel_err(norm, ref_norms[step], 1e-12) < 1e-5, "%s step %d norm %.9f vs %.9f",
               prefix, step, norm, ref_norms[step]);
        printf("%s step %d: loss %.9f (torch %.9f) norm %.6f\n", prefix, step, l,
               ref_losses[step], norm);
        const float coef = ts_clip_coef(norm, tc->grad_clip);
        ts_adamw_step(&adamw, &m, tc, lr, coef, step + 1);
        ts_muon_step(&muon, &m, tc, lr, coef);
    }
    for (int p = 0; p < m.n_params; p++) {
        snprintf(name, sizeof name, "%s.final.%s", prefix, m.params[p].shard.name);
        double *w = fixture_read_f64(ef, name, NULL);
        double e = fixture_rel_norm_err(ts_param_data(&m, p), w, m.params[p].numel);
        *worst = e > *worst ? e : *worst;
        CHECKF(e < 1e-5, "%s %s: relative error after 5 steps %.3g", prefix,
               m.params[p].shard.name, e);
        free(w);
    }
    free(ref_losses);
    free(ref_norms);
    ts_muon_free(&muon);
    ts_adamw_free(&adamw);
    ts_model_free(&m);
}

int main(void)
{
    ts_config cfg;
    fixture_llama_config(&cfg);
    ts_config_resolve_model(&cfg.model);
    fixture_train_config(&cfg.train);
    cfg.train.global_batch = FIXTURE_B;
    cfg.parallel.micro_batch = 2;

    const char *root = getenv("TS_SOURCE_DIR");
    char wpath[4096], epath[4096];
    snprintf(wpath, sizeof wpath, "%s/tests/fixtures/llama_tiny_weights.safetensors",
             root ? root : ".");
    snprintf(epath, sizeof epath, "%s/tests/fixtures/muon_tiny_expect.safetensors",
             root ? root : ".");
    ts_cpu_set_threads(2);
    ts_st_file ef;
    if (ts_st_open(&ef, epath) != TS_OK) {
        fprintf(stderr, "%s\n", ts_error_message());
        return 1;
    }
    int tokens[FIXTURE_B * FIXTURE_T], targets[FIXTURE_B * FIXTURE_T];
    fixture_read_i32(&ef, "tokens", tokens, (size_t)FIXTURE_B * FIXTURE_T);
    fixture_read_i32(&ef, "targets", targets, (size_t)FIXTURE_B * FIXTURE_T);
    double worst = 0.0;
    run(&cfg, &ef, "a", wpath, tokens, targets, &worst);
    run(&cfg, &ef, "b", wpath, tokens, targets, &worst);
    printf("worst relative parameter error after 5 steps %.3g\n", worst);
    ts_st_close(&ef);
    return ts_test_report();
}
