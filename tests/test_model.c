/* The model's layer list and initialisation: init by index is the same on any subset
 * of layers (what pipeline stages rely on), the statistics follow docs/CONTRACT.md, and
 * model.init rejects files that do not fit the config with a clear message. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/load.h"
#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "model/model.h"
#include "support/st_write.h"
#include "test_util.h"

static ts_model_config tiny(void)
{
    ts_config c;
    ts_config_defaults(&c);
    c.model.n_layer = 3;
    c.model.n_head = 2;
    c.model.n_embd = 16;
    c.model.vocab_size = 40;
    c.model.seq_len = 8;
    return c.model;
}

static int find(const ts_model *m, const char *name)
{
    for (int p = 0; p < m->n_params; p++)
        if (!strcmp(m->params[p].shard.name, name)) return p;
    return -1;
}

static void test_layer_list(void)
{
    ts_model_config mc = tiny();
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    CHECK(m.n_layers == mc.n_layer + 2);
    CHECK(m.layers[0].kind == TS_LAYER_EMBED && m.layers[m.n_layers - 1].kind == TS_LAYER_HEAD);
    CHECK(m.n_params == 2 + 12 * mc.n_layer + 2);
    CHECK(m.head_wte_param == m.wte_param); /* tied on one rank */
    size_t total = 0;
    for (int p = 0; p < m.n_params; p++) total += m.params[p].numel;
    CHECK(total == ts_model_logical_params(&mc));
    CHECK(m.params[find(&m, "transformer.h.0.attn.c_attn.weight")].decay);
    CHECK(!m.params[find(&m, "transformer.h.0.attn.c_attn.bias")].decay);
    CHECK(!m.params[find(&m, "transformer.ln_f.weight")].decay);
    ts_model_free(&m);
}

static void test_init_by_index(void)
{
    ts_model_config mc = tiny();
    ts_model full, part;
    ts_model_build(&full, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_model_init_random(&full, 1234);
    /* A last pipeline stage: block 2 and the head, no embedding (a tied wte copy). */
    bool owned[5] = {false, false, false, true, true};
    ts_model_build(&part, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu, .owned = owned});
    ts_model_init_random(&part, 1234);
    CHECK(part.wte_param == -1 && part.head_wte_param >= 0 && part.params[part.head_wte_param].tied_copy);
    int same = 1;
    for (int p = 0; p < part.n_params; p++) {
        int q = find(&full, part.params[p].shard.name);
        CHECKF(q >= 0, "%s missing from full model", part.params[p].shard.name);
        if (q < 0) continue;
        same &= !memcmp(ts_param_data(&part, p), ts_param_data(&full, q),
                        part.params[p].numel * sizeof(float));
    }
    CHECKF(same, "a stage's initial weights differ from the full model's");

    /* Statistics: std 0.02, residual projections 0.02/sqrt(2L), LN ones, biases zero. */
    int p = find(&full, "transformer.wte.weight");
    double s = 0, s2 = 0;
    size_t n = full.params[p].numel;
    for (size_t i = 0; i < n; i++) s += ts_param_data(&full, p)[i], s2 += ts_param_data(&full, p)[i] * ts_param_data(&full, p)[i];
    double sd = sqrt(s2 / n - (s / n) * (s / n));
    CHECKF(fabs(sd - 0.02) < 0.002, "wte std %g", sd);
    p = find(&full, "transformer.h.1.mlp.c_proj.weight");
    s = s2 = 0;
    n = full.params[p].numel;
    for (size_t i = 0; i < n; i++) s2 += ts_param_data(&full, p)[i] * ts_param_data(&full, p)[i];
    sd = sqrt(s2 / n);
    CHECKF(fabs(sd - 0.02 / sqrt(6.0)) < 0.001, "c_proj std %g", sd);
    CHECK(ts_param_data(&full, find(&full, "transformer.h.0.ln_1.weight"))[3] == 1.0f);
    CHECK(ts_param_data(&full, find(&full, "transformer.h.0.attn.c_attn.bias"))[3] == 0.0f);
    /* Another seed gives other values. */
    ts_model other;
    ts_model_build(&other, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_model_init_random(&other, 1235);
    p = find(&full, "transformer.wte.weight");
    CHECK(memcmp(ts_param_data(&full, p), ts_param_data(&other, p), 64) != 0);
    ts_model_free(&other);
    ts_model_free(&part);
    ts_model_free(&full);
}

/* Write the model's parameters to a safetensors file, optionally corrupting one entry. */
static void write_weights(const ts_model *m, const char *path, const char *drop, const char *reshape,
                          const char *extra)
{
    ts_st_entry e[64];
    int n = 0;
    for (int p = 0; p < m->n_params; p++) {
        if (drop && !strcmp(m->params[p].shard.name, drop)) continue;
        e[n].name = m->params[p].shard.name;
        e[n].dtype = TS_DT_F32;
        e[n].ndim = m->params[p].shard.ndim;
        e[n].shape[0] = m->params[p].shard.shape[0];
        e[n].shape[1] = m->params[p].shard.shape[1];
        if (reshape && !strcmp(m->params[p].shard.name, reshape)) { /* same bytes, other shape */
            e[n].shape[0] = m->params[p].shard.shape[1];
            e[n].shape[1] = m->params[p].shard.shape[0];
        }
        e[n].data = ts_param_data(m, p);
        n++;
    }
    if (extra) {
        e[n] = e[0];
        e[n].name = extra;
        n++;
    }
    CHECK(ts_st_write(path, e, n, NULL, NULL, 0) == TS_OK);
}

/* A randomly initialised source model, an empty destination of the same config, and a
 * scratch directory (dir: a mkdtemp template) with path = dir/w.safetensors. */
static void init_pair(const ts_model_config *mc, ts_model *src, ts_model *dst, char *dir,
                      char *path, size_t path_size)
{
    ts_model_build(src, &(ts_model_spec){.arch = mc, .k = &ts_kernels_cpu});
    ts_model_init_random(src, 7);
    ts_model_build(dst, &(ts_model_spec){.arch = mc, .k = &ts_kernels_cpu});
    CHECK(mkdtemp(dir) != NULL);
    snprintf(path, path_size, "%s/w.safetensors", dir);
}

static void test_init_from_file(void)
{
    ts_model_config mc = tiny();
    ts_model src, dst;
    char dir[] = "/tmp/ts_model_XXXXXX", path[256];
    init_pair(&mc, &src, &dst, dir, path, sizeof path);

    write_weights(&src, path, NULL, NULL, NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_OK);
    CHECK(!memcmp(src.param_mem, dst.param_mem, src.num_floats * sizeof(float)));

    write_weights(&src, path, "transformer.h.1.mlp.c_fc.bias", NULL, NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "transformer.h.1.mlp.c_fc.bias") != NULL, "%s", ts_error_message());

    write_weights(&src, path, NULL, "transformer.h.0.attn.c_attn.weight", NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "shape") && strstr(ts_error_message(), "c_attn.weight"), "%s",
           ts_error_message());

    write_weights(&src, path, NULL, NULL, "transformer.h.7.attn.c_attn.weight");
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "transformer.h.7") != NULL, "%s", ts_error_message());

    CHECK(ts_ckpt_load_model_init(&dst, "/nonexistent/w.safetensors") == TS_ERR);
    CHECKF(strstr(ts_error_message(), "model.init") != NULL, "%s", ts_error_message());

    unlink(path);
    rmdir(dir);
    ts_model_free(&src);
    ts_model_free(&dst);
}

/* model.init's messages: the expected shape of a missing 1-D tensor, one "model.init:"
 * prefix, and non-finite weights caught at load with the tensor and element named
 * (the review's ST_missing, ST_lmhead_diff and ST_nan). */
static void test_init_from_file_messages(void)
{
    ts_model_config mc = tiny(); /* C = 16 */
    ts_model src, dst;
    char dir[] = "/tmp/ts_model_XXXXXX", path[256];
    init_pair(&mc, &src, &dst, dir, path, sizeof path);
    const char *msg = ts_error_message();

    write_weights(&src, path, "transformer.h.2.mlp.c_proj.bias", NULL, NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(msg, "'transformer.h.2.mlp.c_proj.bias' (expected shape [16] F32"), "%s", msg);
    write_weights(&src, path, "transformer.h.0.mlp.c_fc.bias", NULL, NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(msg, "(expected shape [64] F32"), "%s", msg);
    write_weights(&src, path, "transformer.wpe.weight", NULL, NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(msg, "(expected shape [8,16] F32"), "%s", msg);

    /* lm_head.weight: the same as wte is accepted; another tensor is refused once. */
    int wte = find(&src, "transformer.wte.weight");
    write_weights(&src, path, NULL, NULL, "lm_head.weight"); /* a copy of entry 0, wte */
    CHECKF(ts_ckpt_load_model_init(&dst, path) == TS_OK, "%s", msg);
    ts_param_data(&src, wte)[5] += 1.0f;
    {
        ts_st_entry e[64];
        int n = 0;
        for (int p = 0; p < src.n_params; p++, n++)
            e[n] = (ts_st_entry){src.params[p].shard.name, TS_DT_F32, src.params[p].shard.ndim,
                                 {src.params[p].shard.shape[0], src.params[p].shard.shape[1]},
                                 ts_param_data(&src, p)};
        float *head = malloc(src.params[wte].numel * sizeof(float));
        memcpy(head, ts_param_data(&src, wte), src.params[wte].numel * sizeof(float));
        head[5] -= 1.0f;
        e[n] = e[wte];
        e[n].name = "lm_head.weight";
        e[n++].data = head;
        CHECK(ts_st_write(path, e, n, NULL, NULL, 0) == TS_OK);
        free(head);
    }
    ts_param_data(&src, wte)[5] -= 1.0f;
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(msg, "lm_head.weight differs") && strncmp(msg, "model.init: ", 12) == 0 &&
               !strstr(msg + 1, "model.init:"),
           "%s", msg);

    /* NaN and Inf: named at load, with the element's logical index. */
    int attn = find(&src, "transformer.h.0.attn.c_attn.weight"); /* [48,16] */
    ts_param_data(&src, attn)[100] = NAN;
    write_weights(&src, path, NULL, NULL, NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(msg, "tensor 'transformer.h.0.attn.c_attn.weight' [48,16] holds NaN at "
                       "element 100 (row 6, column 4)") &&
               strstr(msg, path) && strncmp(msg, "model.init: ", 12) == 0,
           "%s", msg);
    ts_param_data(&src, attn)[100] = 0.0f;
    int bias = find(&src, "transformer.h.1.ln_2.bias");
    ts_param_data(&src, bias)[3] = -INFINITY;
    write_weights(&src, path, NULL, NULL, NULL);
    CHECK(ts_ckpt_load_model_init(&dst, path) == TS_ERR);
    CHECKF(strstr(msg, "tensor 'transformer.h.1.ln_2.bias' [16] holds -Inf at element 3;"), "%s",
           msg);
    ts_param_data(&src, bias)[3] = 0.0f;

    /* Tensor parallel: each rank checks the slice it loads, and names the element by its
     * logical index. c_proj.weight [16,16] is split by columns: rank 1 holds 8..15. */
    int proj = find(&src, "transformer.h.2.attn.c_proj.weight");
    ts_param_data(&src, proj)[2 * 16 + 12] = INFINITY;
    write_weights(&src, path, NULL, NULL, NULL);
    ts_model tp0, tp1;
    const ts_tp ctx0 = ts_tp_make(2, 0, NULL, &ts_kernels_cpu);
    const ts_tp ctx1 = ts_tp_make(2, 1, NULL, &ts_kernels_cpu);
    ts_model_build(&tp0, &(ts_model_spec){.arch = &mc, .k = ctx0.k, .tp = ctx0});
    ts_model_build(&tp1, &(ts_model_spec){.arch = &mc, .k = ctx1.k, .tp = ctx1});
    CHECKF(ts_ckpt_load_model_init(&tp0, path) == TS_OK, "%s", msg);
    CHECK(ts_ckpt_load_model_init(&tp1, path) == TS_ERR);
    CHECKF(strstr(msg, "c_proj.weight' [16,16] holds +Inf at element 44 (row 2, column 12)"), "%s",
           msg);
    ts_model_free(&tp0);
    ts_model_free(&tp1);

    unlink(path);
    rmdir(dir);
    ts_model_free(&src);
    ts_model_free(&dst);
}

/* Forward/backward of the whole layer list equals running it as two chunks (the
 * second fed the first's output) and equals the split I + W backward, bit for bit. */
static void test_chunks_and_split_backward(void)
{
    ts_model_config mc = tiny();
    const int B = 2, T = 8, N = B * T, C = mc.n_embd;
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    ts_model_init_random(&m, 99);
    ts_scratch sc;
    ts_scratch_init(&sc, &m, B, T);
    float *dx = ts_alloc_floats((size_t)N * C);
    float *ref = ts_alloc_floats(m.num_floats);
    const float dloss = 1.0f / N;

    ts_acts whole;
    ts_acts_init(&whole, &m, 0, m.n_layers, B, T);
    for (int i = 0; i < N; i++) whole.tokens[i] = (i * 7) % mc.vocab_size, whole.targets[i] = (i * 5 + 1) % mc.vocab_size;
    double loss_whole = 0;
    memset(m.grad_mem, 0, m.num_floats * sizeof(float));
    ts_model_forward(&m, &whole, dloss, &loss_whole);
    ts_model_backward(&m, &whole, dx, &sc, NULL, NULL);
    memcpy(ref, m.grad_mem, m.num_floats * sizeof(float));

    /* Two chunks: layers [0,2) and [2, L+2). */
    ts_acts c0, c1;
    ts_acts_init(&c0, &m, 0, 2, B, T);
    ts_acts_init(&c1, &m, 2, m.n_layers, B, T);
    memcpy(c0.tokens, whole.tokens, N * sizeof(int));
    memcpy(c1.targets, whole.targets, N * sizeof(int));
    double loss_chunks = 0;
    memset(m.grad_mem, 0, m.num_floats * sizeof(float));
    ts_model_forward(&m, &c0, dloss, NULL);
    c1.input = ts_acts_output(&m, &c0, 1);
    ts_model_forward(&m, &c1, dloss, &loss_chunks);
    ts_model_backward(&m, &c1, dx, &sc, NULL, NULL);
    ts_model_backward(&m, &c0, dx, &sc, NULL, NULL);
    CHECK(loss_chunks == loss_whole);
    CHECKF(!memcmp(ref, m.grad_mem, m.num_floats * sizeof(float)), "chunked gradients differ");

    /* Split backward per chunk: I of both chunks, then W of both. */
    memset(m.grad_mem, 0, m.num_floats * sizeof(float));
    ts_model_forward(&m, &c0, dloss, NULL);
    ts_model_forward(&m, &c1, dloss, NULL);
    ts_model_backward_input(&m, &c1, dx, &sc);
    ts_model_backward_input(&m, &c0, dx, &sc);
    ts_model_backward_weight(&m, &c0, &sc);
    ts_model_backward_weight(&m, &c1, &sc);
    CHECKF(!memcmp(ref, m.grad_mem, m.num_floats * sizeof(float)), "I + W differs from B");
    CHECK(c0.wstash == NULL && c1.wstash == NULL);

    ts_acts_free(&c0);
    ts_acts_free(&c1);
    ts_acts_free(&whole);
    ts_scratch_free(&sc);
    free(dx);
    free(ref);
    ts_model_free(&m);
}

/* A model whose vocabulary (37, prime) splits unevenly over tp = 2, 3 and 4. */
static ts_model_config prime_vocab(void)
{
    ts_model_config mc = tiny();
    mc.n_head = 12;
    mc.n_embd = 48;
    mc.vocab_size = 37;
    return mc;
}

/* Every tensor-parallel part, uneven vocabulary included, initialises (by index) and
 * loads (model.init, run by run) to exactly the full model's slice, read back through
 * the same shard runs; the owned parts add up to the logical parameters. */
static void test_tp_parts_uneven_vocab(void)
{
    ts_model_config mc = prime_vocab();
    ts_model full, src;
    char dir[] = "/tmp/ts_model_XXXXXX", path[256];
    init_pair(&mc, &src, &full, dir, path, sizeof path);
    ts_model_init_random(&full, 1234);
    write_weights(&src, path, NULL, NULL, NULL);
    for (int tp = 2; tp <= 4; tp++) {
        size_t owned = 0;
        int vocab_next = 0;
        for (int r = 0; r < tp; r++) {
            const ts_tp ctx = ts_tp_make(tp, r, NULL, &ts_kernels_cpu);
            ts_model part, loaded;
            ts_model_build(&part, &(ts_model_spec){.arch = &mc, .k = ctx.k, .tp = ctx});
            ts_model_build(&loaded, &(ts_model_spec){.arch = &mc, .k = ctx.k, .tp = ctx});
            ts_model_init_random(&part, 1234);
            CHECKF(ts_ckpt_load_model_init(&loaded, path) == TS_OK, "%s", ts_error_message());
            CHECKF(part.vocab_start == vocab_next && part.local_vocab == 37 / tp + (r < 37 % tp),
                   "tp=%d rank %d: vocabulary rows [%d, +%d)", tp, r, part.vocab_start,
                   part.local_vocab);
            vocab_next = part.vocab_start + part.local_vocab;
            int same_init = 1, same_load = 1;
            for (int p = 0; p < part.n_params; p++) {
                const ts_param *P = &part.params[p];
                int q = find(&full, P->shard.name);
                if (ts_tp_param_counts(&P->shard)) owned += P->numel;
                ts_shard_run run;
                for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, 0, P->numel);
                     ts_shard_next(&it, &run);) {
                    size_t bytes = run.len * sizeof(float);
                    same_init &= !memcmp(ts_param_data(&part, p) + run.local,
                                         ts_param_data(&full, q) + run.logical, bytes);
                    same_load &= !memcmp(ts_param_data(&loaded, p) + run.local,
                                         ts_param_data(&src, q) + run.logical, bytes);
                }
            }
            CHECKF(same_init, "tp=%d rank %d: initial weights are not the full model's slices", tp,
                   r);
            CHECKF(same_load, "tp=%d rank %d: model.init did not load the file's slices", tp, r);
            ts_model_free(&part);
            ts_model_free(&loaded);
        }
        CHECKF(vocab_next == 37, "tp=%d: the parts cover %d of 37 vocabulary rows", tp, vocab_next);
        CHECKF(owned == ts_model_logical_params(&mc), "tp=%d: owned %zu of %zu parameters", tp,
               owned, ts_model_logical_params(&mc));
    }
    unlink(path);
    rmdir(dir);
    ts_model_free(&src);
    ts_model_free(&full);
}

/* The activation layout is written once: each layer's allocation is the layout's size
 * (ts_layer_act_bytes, used by estimates without a model), and a block holds exactly
 * its 16 [N,C]-sized buffers, 4 [N] statistics and the [B,H,T,T] probabilities, each
 * buffer on a 64-byte boundary. */
static size_t al64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static void test_activation_layout(void)
{
    ts_model_config mc = prime_vocab();
    const int B = 2, T = 8;
    const size_t N = (size_t)B * T, C = (size_t)mc.n_embd, f = sizeof(float);
    const ts_kernels *k = &ts_kernels_cpu;
    for (int tp = 1; tp <= 4; tp++) {
        for (int r = 0; r < tp; r++) {
            const ts_tp ctx = ts_tp_make(tp, r, NULL, k);
            ts_model m;
            ts_model_layout(&m, &(ts_model_spec){.arch = &mc, .k = ctx.k, .tp = ctx});
            for (int l = 0; l < m.n_layers; l++) {
                size_t want = ts_layer_act_bytes(&mc, m.layers[l].kind, B, T, tp, r, k);
                CHECKF(ts_acts_bytes(&m, l, l + 1, B, T) == want,
                       "tp=%d rank %d layer %d: %zu bytes vs the layout's %zu", tp, r, l,
                       ts_acts_bytes(&m, l, l + 1, B, T), want);
            }
            ts_model_free(&m);
        }
    }
    const size_t NC = al64(N * C * f), stat = al64(N * f);
    size_t block = ts_layer_act_bytes(&mc, TS_LAYER_BLOCK, B, T, 1, 0, k);
    size_t want_block = NC /* ln1 */ + al64(3 * N * C * f) /* qkv */ + NC /* atty */ +
                        al64((size_t)B * mc.n_head * T * T * f) /* att */ + NC /* res2 */ +
                        NC /* ln2 */ + 2 * al64(4 * N * C * f) /* fch, fch_gelu */ + NC /* out */ +
                        4 * stat;
    CHECKF(block == want_block, "block %zu, want %zu", block, want_block);
    size_t head = ts_layer_act_bytes(&mc, TS_LAYER_HEAD, B, T, 1, 0, k);
    const size_t head_fixed = NC + 3 * stat + al64(3 * N * f);
    CHECKF(head == head_fixed + al64(N * (size_t)mc.vocab_size * f), "head %zu", head);
    CHECK(ts_layer_act_bytes(&mc, TS_LAYER_HEAD, B, T, 4, 0, k) == head_fixed + al64(N * 10 * f));
    CHECK(ts_layer_act_bytes(&mc, TS_LAYER_HEAD, B, T, 4, 3, k) == head_fixed + al64(N * 9 * f));
}

static ts_model_config tiny_llama(void)
{
    ts_config c;
    ts_test_tiny_llama(&c, 40, 8);
    return c.model;
}

/* The llama layer list: Hugging Face's names and shapes, q|k|v and gate|up packed into
 * one weight each, an untied head, the key/value heads split over tp = 2 and shared by
 * two ranks each at tp = 4, and the activation layout's sizes. */
static void test_llama_layout(void)
{
    ts_model_config mc = tiny_llama();
    const int C = 32, HS = 8, F = 48, V = 40, L = 2;
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    CHECK(m.arch == TS_ARCH_LLAMA && !m.tied && m.rope_cos && m.rope_sin);
    CHECK(m.n_params == 1 + 9 * L + 2);
    CHECK(m.head_wte_param != m.wte_param && !strcmp(ts_param_name(&m, m.head_wte_param), "lm_head.weight"));
    CHECK(!strcmp(ts_param_name(&m, m.wte_param), "model.embed_tokens.weight"));
    size_t total = 0;
    for (int p = 0; p < m.n_params; p++) total += m.params[p].numel;
    CHECK(total == ts_model_logical_params(&mc));
    CHECK(total == (size_t)(2 * V * C + C + L * (2 * C + C * 4 * HS * 2 + 2 * C * 2 * HS + 3 * C * F)));
    const int b = m.layers[1].first_param;
    static const char *const names[TS_L_NPARAMS] = {
        "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight"};
    for (int i = 0; i < TS_L_NPARAMS; i++)
        CHECKF(!strcmp(ts_param_name(&m, b + i), names[i]), "param %d is %s", i, ts_param_name(&m, b + i));
    const ts_param *P = &m.params[b];
    CHECK(P[TS_L_Q_W].shard.shape[0] == 4 * HS && P[TS_L_K_W].shard.shape[0] == 2 * HS &&
          P[TS_L_O_W].shard.shape[1] == 4 * HS && P[TS_L_DOWN_W].shard.shape[1] == F);
    CHECK(P[TS_L_Q_W].offset + P[TS_L_Q_W].numel == P[TS_L_K_W].offset);
    CHECK(P[TS_L_K_W].offset + P[TS_L_K_W].numel == P[TS_L_V_W].offset);
    CHECK(P[TS_L_GATE_W].offset + P[TS_L_GATE_W].numel == P[TS_L_UP_W].offset);
    CHECK(P[TS_L_Q_W].decay && !P[TS_L_ATTN_NORM_W].decay && m.params[m.wte_param].decay);
    CHECK(!m.params[find(&m, "model.norm.weight")].decay);
    CHECK(ts_param_data(&m, b + TS_L_MLP_NORM_W)[0] == 0.0f); /* zeroed until init */
    ts_model_init_random(&m, 7);
    CHECK(ts_param_data(&m, b + TS_L_MLP_NORM_W)[5] == 1.0f);
    /* RoPE at position 0 is the identity; at t = 1, channel 0 turns by 1 radian. */
    CHECK(m.rope_cos[0] == 1.0f && m.rope_sin[0] == 0.0f);
    CHECK(fabsf(m.rope_cos[HS / 2] - cosf(1.0f)) < 1e-7f);
    ts_model_free(&m);

    for (int tp = 2; tp <= 4; tp += 2)
        for (int r = 0; r < tp; r++) {
            const ts_tp ctx = ts_tp_make(tp, r, NULL, &ts_kernels_cpu);
            ts_model_layout(&m, &(ts_model_spec){.arch = &mc, .k = ctx.k, .tp = ctx});
            const ts_param *Q = &m.params[m.layers[1].first_param];
            CHECK(m.local_heads == 4 / tp && m.local_kv_heads == 1 && m.kv_replicas == tp / 2);
            CHECK(Q[TS_L_K_W].numel == (size_t)HS * C && Q[TS_L_V_W].numel == (size_t)HS * C);
            /* tp = 4: ranks 0,1 hold key/value head 0 (replicas 0, 1), ranks 2,3 head 1. */
            CHECKF(Q[TS_L_K_W].shard.part == r / (tp / 2) && Q[TS_L_K_W].shard.parts == 2 &&
                       Q[TS_L_K_W].shard.replica == r % (tp / 2),
                   "tp %d rank %d: k_proj part %d/%d replica %d", tp, r, Q[TS_L_K_W].shard.part,
                   Q[TS_L_K_W].shard.parts, Q[TS_L_K_W].shard.replica);
            CHECK(Q[TS_L_Q_W].shard.part == r && Q[TS_L_Q_W].shard.replica == 0);
            CHECK(Q[TS_L_GATE_W].numel == (size_t)(F / tp) * C);
            ts_model_free(&m);
        }

    /* The activation layout of a block: no norm means, the q|k|v of 4 + 2*2 heads, the
     * gate|up output [N,2F] and SwiGLU's [N,F]. */
    const ts_kernels *k = &ts_kernels_cpu;
    const int B = 2, T = 8;
    const size_t N = (size_t)B * T, f = sizeof(float);
#define AL(x) (((x) + 63) / 64 * 64)
    const size_t NC = AL(N * C * f), stat = AL(N * f);
    const size_t want = NC + stat + AL(N * 8 * HS * f) + AL(N * 4 * HS * f) +
                        k->attention_saved_bytes(B, T, ts_att_heads_gqa(4, 2, HS)) + NC + NC +
                        stat + AL(N * 2 * F * f) + AL(N * F * f) + NC;
    CHECKF(ts_layer_act_bytes(&mc, TS_LAYER_BLOCK, B, T, 1, 0, k) == want, "llama block %zu, want %zu",
           ts_layer_act_bytes(&mc, TS_LAYER_BLOCK, B, T, 1, 0, k), want);
    CHECK(ts_layer_act_bytes(&mc, TS_LAYER_EMBED, B, T, 1, 0, k) == NC);
#undef AL

    /* A pipeline stage of a tied llama holds the head's copy of model.embed_tokens.weight. */
    mc.tie_embeddings = 1;
    bool owned[4] = {false, false, true, true};
    ts_model_build(&m, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu, .owned = owned});
    CHECK(m.tied && m.wte_param < 0 && m.params[m.head_wte_param].tied_copy &&
          !strcmp(ts_param_name(&m, m.head_wte_param), "model.embed_tokens.weight"));
    ts_model_free(&m);
}

/* Hugging Face's inverse frequencies, with Llama 3.1's scaling (factor 8, low 1, high 4,
 * original context 8192; head dim 128): low frequencies divided by 8, high ones kept. */
static void test_rope_frequencies(void)
{
    ts_model_config mc = tiny_llama();
    double inv[64];
    mc.rope_theta = 500000.0;
    ts_rope_inv_freq(&mc, inv, 128);
    CHECK(inv[0] == 1.0 && fabs(inv[1] - pow(500000.0, -2.0 / 128)) < 1e-18);
    mc.rope_scaling = 8.0;
    mc.rope_low_freq_factor = 1.0;
    mc.rope_high_freq_factor = 4.0;
    mc.rope_original_context = 8192;
    double scaled[64];
    ts_rope_inv_freq(&mc, scaled, 128);
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < 64; i++) {
        const double wavelen = 2 * pi / inv[i];
        double want = inv[i];
        if (wavelen > 8192.0) want = inv[i] / 8.0;
        else if (wavelen >= 2048.0) {
            const double s = (8192.0 / wavelen - 1.0) / 3.0;
            want = (1 - s) * inv[i] / 8.0 + s * inv[i];
        }
        CHECKF(fabs(scaled[i] - want) <= 1e-15 * want, "inv_freq[%d] %g, want %g", i, scaled[i], want);
    }
    CHECK(scaled[0] == inv[0] && fabs(scaled[63] - inv[63] / 8.0) < 1e-20);
}

int main(void)
{
    test_llama_layout();
    test_rope_frequencies();
    test_chunks_and_split_backward();
    test_layer_list();
    test_init_by_index();
    test_init_from_file();
    test_init_from_file_messages();
    test_tp_parts_uneven_vocab();
    test_activation_layout();
    return ts_test_report();
}
