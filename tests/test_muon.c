/* Muon's numerical core (optim/muon.h) against a double-precision reference:
 * ts_muon_orthogonalize for each coefficient set (torch's, quintic over 5 and 7 steps,
 * DeepSeek-V4's 8 + 2), on a wide, a tall (rows > cols: the transposed form) and a
 * square matrix, on the CPU fp32 table and its strict twin (device memory the host
 * cannot touch), and under bf16 (the CPU's oneDNN table, where this CPU runs it: skipped
 * otherwise) within bf16's tolerance; the scales, the cost, the coefficient sets'
 * configs; which parameters are Muon's in a DeepSeek-shaped model with MLA, MoE and MTP
 * and in GPT-2; and the elementwise kernels against their formulas. The error is
 * ||X - ref||_F / ||ref||_F: measured 8.3e-7 in fp32 (tolerance 1e-5); bf16 operands
 * (the iterate fp32) give up to 2.4e-2 in a float emulation of the same rounding
 * (torch, 36 matrices), tolerance 8e-2: a wrong stride or transpose gives O(1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "optim/muon.h"
#include "test_util.h"

/* The iteration in double, as torch.optim.Muon's (transposing the tall case). */
static void ns_reference(const ts_muon_config *c, const double *g, double *out, int rows,
                         int cols)
{
    const bool tall = rows > cols;
    const int s = tall ? cols : rows, l = tall ? rows : cols;
    double *x = malloc(sizeof(double) * (size_t)s * l), *xn = malloc(sizeof(double) * (size_t)s * l);
    double *A = malloc(sizeof(double) * (size_t)s * s), *B = malloc(sizeof(double) * (size_t)s * s);
    double norm = 0.0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) {
            const double v = g[(size_t)i * cols + j];
            x[tall ? (size_t)j * l + i : (size_t)i * l + j] = v;
            norm += v * v;
        }
    norm = sqrt(norm);
    for (size_t i = 0; i < (size_t)s * l; i++) x[i] /= norm > 1e-7 ? norm : 1e-7;
    for (int st = 0; st < c->ns_steps; st++) {
        const double a = c->coef[st][0], b = c->coef[st][1], cc = c->coef[st][2];
        for (int i = 0; i < s; i++)
            for (int j = 0; j < s; j++) {
                double acc = 0;
                for (int k = 0; k < l; k++) acc += x[(size_t)i * l + k] * x[(size_t)j * l + k];
                A[(size_t)i * s + j] = acc;
            }
        for (int i = 0; i < s; i++)
            for (int j = 0; j < s; j++) {
                double acc = 0;
                for (int k = 0; k < s; k++) acc += A[(size_t)i * s + k] * A[(size_t)k * s + j];
                B[(size_t)i * s + j] = b * A[(size_t)i * s + j] + cc * acc;
            }
        for (int i = 0; i < s; i++)
            for (int j = 0; j < l; j++) {
                double acc = 0;
                for (int k = 0; k < s; k++) acc += B[(size_t)i * s + k] * x[(size_t)k * l + j];
                xn[(size_t)i * l + j] = a * x[(size_t)i * l + j] + acc;
            }
        memcpy(x, xn, sizeof(double) * (size_t)s * l);
    }
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            out[(size_t)i * cols + j] = x[tall ? (size_t)j * l + i : (size_t)i * l + j];
    free(x), free(xn), free(A), free(B);
}

static ts_muon_config config_of(const char *set, int steps)
{
    ts_train_config t;
    memset(&t, 0, sizeof t);
    t.muon_momentum = 0.95;
    t.muon_nesterov = true;
    t.muon_ns_steps = steps;
    snprintf(t.muon_coefficients, sizeof t.muon_coefficients, "%s", set);
    snprintf(t.muon_scale, sizeof t.muon_scale, "match_rms_adamw");
    ts_muon_config c;
    ts_muon_config_of(&t, &c);
    return c;
}

/* ||x - ref||_F / ||ref||_F of ts_muon_orthogonalize on k for one matrix. */
static double orthogonalize_error(const ts_kernels *k, const ts_muon_config *c, int rows, int cols,
                                  unsigned seed)
{
    const size_t n = (size_t)rows * cols;
    float *h = malloc(n * sizeof(float));
    double *g = malloc(n * sizeof(double)), *ref = malloc(n * sizeof(double));
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        h[i] = (float)(rand() / (double)RAND_MAX - 0.5) * 0.01f;
        g[i] = h[i];
    }
    ns_reference(c, g, ref, rows, cols);
    float *x = k->dev_alloc(n * sizeof(float));
    void *scratch = k->dev_alloc(ts_muon_scratch_bytes(rows, cols));
    k->memcpy_h2d(x, h, n * sizeof(float));
    ts_muon_orthogonalize(c, k, x, rows, cols, scratch);
    k->memcpy_d2h(h, x, n * sizeof(float));
    double err = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        err += (h[i] - ref[i]) * (h[i] - ref[i]);
        mx += ref[i] * ref[i];
    }
    k->dev_free(scratch);
    k->dev_free(x);
    free(h), free(g), free(ref);
    return sqrt(err / mx);
}

static void test_orthogonalize(const ts_kernels *k, double tol)
{
    static const struct {
        const char *set;
        int steps;
    } sets[] = {{"torch", 0}, {"quintic", 0}, {"quintic", 7}, {"deepseek_v4", 0}};
    static const int shapes[][2] = {{12, 40}, {40, 12}, {24, 24}};
    double worst = 0;
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            const ts_muon_config c = config_of(sets[s].set, sets[s].steps);
            const double e = orthogonalize_error(k, &c, shapes[i][0], shapes[i][1],
                                                 (unsigned)(7 + s * 3 + i));
            worst = fmax(worst, e);
            CHECKF(e < tol, "%s: %s x%d on [%d, %d]: relative error %.3g", k->name, sets[s].set,
                   c.ns_steps, shapes[i][0], shapes[i][1], e);
        }
    printf("%s: orthogonalize worst relative error %.3g (tolerance %g)\n", k->name, worst, tol);
}

/* The coefficient sets as the contract lists them, the scales and the cost. */
static void test_config_and_scales(void)
{
    ts_muon_config c = config_of("torch", 0);
    CHECK(c.ns_steps == 5 && c.coef[4][0] == 3.4445f && c.coef[4][1] == -4.7750f &&
          c.coef[4][2] == 2.0315f);
    c = config_of("quintic", 7);
    CHECK(c.ns_steps == 7 && c.coef[0][0] == 4.0848f && c.coef[3][2] == 1.2046f &&
          c.coef[4][0] == 2.8366f && c.coef[6][0] == 2.8366f && c.coef[6][1] == -3.0525f);
    c = config_of("quintic", 2);
    CHECK(c.ns_steps == 2 && c.coef[1][0] == 3.9505f);
    c = config_of("deepseek_v4", 0);
    CHECK(c.ns_steps == 10 && c.coef[7][0] == 3.4445f && c.coef[8][0] == 2.0f &&
          c.coef[9][1] == -1.5f && c.coef[9][2] == 0.5f);
    CHECK(c.momentum == 0.95f && c.nesterov && c.eps == 1e-7);
    CHECK(fabs(ts_muon_scale(&c, 128, 512) - 0.2 * sqrt(512.0)) < 1e-12);
    CHECK(fabs(ts_muon_scale(&c, 512, 128) - 0.2 * sqrt(512.0)) < 1e-12);
    c.scale = TS_MUON_ORIGINAL;
    CHECK(fabs(ts_muon_scale(&c, 512, 128) - 2.0) < 1e-12);
    CHECK(ts_muon_scale(&c, 128, 512) == 1.0);
    CHECK(ts_muon_ns_cost(128, 512) == 128.0 * 128.0 * (2.0 * 512 + 128));
    CHECK(ts_muon_ns_cost(512, 128) == ts_muon_ns_cost(128, 512));
}

/* Which parameters are Muon's: every block matrix and MTP's, nothing else, in a model
 * with every kind (MLA, the router, routed and shared experts, an MTP module). */
static void test_param_rule(void)
{
    ts_config cfg;
    const char *root = getenv("TS_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/deepseek-4l.cfg", root ? root : ".");
    const char *ov[] = {"model.mtp_layers=1", "model.vocab_size=256", "model.n_layer=2"};
    if (ts_config_load_plan(&cfg, path, ov, 3) != TS_OK) {
        CHECKF(false, "%s", ts_error_message());
        return;
    }
    ts_model m;
    ts_model_layout(&m, &(ts_model_spec){.arch = &cfg.model, .k = &ts_kernels_cpu});
    int n_muon = 0;
    bool router = false, expert = false, shared = false, mla = false, mtp = false;
    for (int p = 0; p < m.n_params; p++) {
        const char *n = m.params[p].shard.name;
        const bool want = m.params[p].shard.ndim == 2 && strstr(n, "embed_tokens") == NULL &&
                          strcmp(n, "lm_head.weight") != 0;
        CHECKF(ts_param_is_muon(&m, p) == want, "%s: Muon %d, want %d", n,
               ts_param_is_muon(&m, p), want);
        n_muon += want;
        router |= want && strstr(n, "mlp.gate.weight") != NULL;
        expert |= want && strstr(n, "experts.7.down_proj") != NULL;
        shared |= want && strstr(n, "shared_experts.up_proj") != NULL;
        mla |= want && strstr(n, "kv_b_proj") != NULL;
        mtp |= want && strstr(n, "layers.2.eh_proj") != NULL;
    }
    CHECK(router && expert && shared && mla && mtp);
    printf("deepseek-4l (2 blocks + 1 MTP module): %d of %d parameters are Muon's\n", n_muon,
           m.n_params);
    ts_model_free(&m);

    ts_config_defaults(&cfg); /* gpt2: c_attn, c_proj, c_fc of each block */
    ts_model_layout(&m, &(ts_model_spec){.arch = &cfg.model, .k = &ts_kernels_cpu});
    n_muon = 0;
    for (int p = 0; p < m.n_params; p++) n_muon += ts_param_is_muon(&m, p);
    CHECKF(n_muon == 4 * cfg.model.n_layer, "gpt2: %d Muon matrices, want 4 per block", n_muon);
    ts_model_free(&m);
}

/* The elementwise kernels against their formulas (torch's lerps, mul_ then add_). */
static void test_elementwise(const ts_kernels *k)
{
    enum { N = 1000 };
    float u[N], buf[N], g[N], p[N], o[N], buf0[N], p0[N];
    for (int i = 0; i < N; i++) {
        buf[i] = buf0[i] = sinf((float)i);
        g[i] = cosf((float)i * 0.3f);
        p[i] = p0[i] = 0.1f * sinf((float)i * 0.7f);
        o[i] = cosf((float)i * 1.1f);
    }
    float *du = k->dev_alloc(sizeof u), *db = k->dev_alloc(sizeof buf), *dg = k->dev_alloc(sizeof g);
    float *dp = k->dev_alloc(sizeof p), *dout = k->dev_alloc(sizeof o);
    double *acc = k->dev_alloc(sizeof(double));
    k->memcpy_h2d(db, buf, sizeof buf);
    k->memcpy_h2d(dg, g, sizeof g);
    k->memcpy_h2d(dp, p, sizeof p);
    k->memcpy_h2d(dout, o, sizeof o);
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        k->memcpy_h2d(db, buf0, sizeof buf);
        k->muon_momentum(du, db, dg, 0.5f, N, 0.9f, nesterov);
        k->memcpy_d2h(u, du, sizeof u);
        k->memcpy_d2h(buf, db, sizeof buf);
        double err = 0;
        for (int i = 0; i < N; i++) {
            const double gi = 0.5 * g[i], bi = 0.9 * buf0[i] + 0.1 * gi;
            const double ui = nesterov ? gi + 0.9 * (bi - gi) : bi;
            err = fmax(err, fabs(buf[i] - bi) + fabs(u[i] - ui));
        }
        CHECKF(err < 1e-6, "%s: muon_momentum (nesterov %d) error %.3g", k->name, nesterov, err);
    }
    k->memset_zero(acc, sizeof(double));
    k->muon_apply(dp, dout, N, 0.99f, 0.01f, acc);
    k->memcpy_d2h(p, dp, sizeof p);
    double sq = 0, want_sq = 0, err = 0;
    k->memcpy_d2h(&sq, acc, sizeof sq);
    for (int i = 0; i < N; i++) {
        const double want = (double)(p0[i] * 0.99f) - 0.01 * o[i];
        err = fmax(err, fabs(p[i] - want));
        want_sq += ((double)p[i] - p0[i]) * ((double)p[i] - p0[i]);
    }
    CHECKF(err < 1e-7, "%s: muon_apply error %.3g", k->name, err);
    CHECKF(fabs(sq - want_sq) <= 1e-12 * want_sq, "%s: muon_apply's squares %.9g, want %.9g",
           k->name, sq, want_sq);
    k->dev_free(du), k->dev_free(db), k->dev_free(dg), k->dev_free(dp), k->dev_free(dout);
    k->dev_free(acc);
}

/* adamw_delta_sq_spans rebuilds the change adamw_update_spans made. */
static void test_adamw_delta(const ts_kernels *k)
{
    enum { N = 700 };
    float p[N], g[N], p0[N];
    for (int i = 0; i < N; i++) {
        p[i] = p0[i] = 0.05f * sinf((float)i);
        g[i] = cosf((float)i * 0.37f);
    }
    const ts_adamw_span host[2] = {{.offset = 0, .grad_offset = 0, .moment_offset = 0,
                                    .count = 300, .decay = 1},
                                   {.offset = 400, .grad_offset = 400, .moment_offset = 300,
                                    .count = 300, .decay = 0}};
    float *dp = k->dev_alloc(sizeof p), *dg = k->dev_alloc(sizeof g);
    float *m = k->dev_alloc(600 * sizeof(float)), *v = k->dev_alloc(600 * sizeof(float));
    ts_adamw_span *spans = k->dev_alloc(sizeof host);
    double *acc = k->dev_alloc(sizeof(double));
    k->memcpy_h2d(dp, p, sizeof p);
    k->memcpy_h2d(dg, g, sizeof g);
    k->memcpy_h2d(spans, host, sizeof host);
    for (int t = 1; t <= 3; t++) {
        k->memcpy_d2h(p0, dp, sizeof p0);
        k->adamw_update_spans(dp, dg, 0.7f, m, v, spans, 2, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        k->memset_zero(acc, sizeof(double));
        k->adamw_delta_sq_spans(acc, dp, m, v, spans, 2, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        k->memcpy_d2h(p, dp, sizeof p);
        double sq = 0, want = 0;
        k->memcpy_d2h(&sq, acc, sizeof sq);
        for (int i = 0; i < N; i++)
            if (i < 300 || i >= 400) want += ((double)p[i] - p0[i]) * ((double)p[i] - p0[i]);
        CHECKF(fabs(sq - want) < 1e-4 * want, "%s step %d: AdamW's squared change %.9g, want %.9g",
               k->name, t, sq, want);
    }
    k->dev_free(dp), k->dev_free(dg), k->dev_free(m), k->dev_free(v), k->dev_free(spans);
    k->dev_free(acc);
}

/* `test_muon cuda` (CUDA builds, label "gpu"): the same checks on the CUDA tables, fp32
 * and bf16; skipped (77) without a device. */
static int run_cuda(void)
{
#ifdef TS_HAVE_CUDA
    if (ts_cuda_device_count() == 0) {
        printf("test_muon cuda: no CUDA device here: skipped\n");
        return 77;
    }
    ts_cuda_select_device(0);
    test_orthogonalize(&ts_kernels_cuda, 1e-5);
    test_elementwise(&ts_kernels_cuda);
    test_adamw_delta(&ts_kernels_cuda);
    test_orthogonalize(&ts_kernels_cuda_bf16, 8e-2);
    return ts_test_report();
#else
    printf("test_muon cuda: a build without CUDA: skipped\n");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    ts_cpu_set_threads(2);
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) return run_cuda();
    test_config_and_scales();
    test_param_rule();
    test_orthogonalize(&ts_kernels_cpu, 1e-5);
    test_orthogonalize(&ts_kernels_cpu_strict, 1e-5);
    test_elementwise(&ts_kernels_cpu_strict);
    test_adamw_delta(&ts_kernels_cpu_strict);
    if (ts_cpu_bf16_supported())
        test_orthogonalize(&ts_kernels_cpu_bf16, 8e-2);
    else
        printf("cpu-bf16: skipped (this CPU lacks AVX512_BF16 and AMX-BF16)\n");
    return ts_test_report();
}
