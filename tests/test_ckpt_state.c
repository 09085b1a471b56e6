/* A checkpoint's state.json as the reader takes it (checkpoint/reader.c): its model keys
 * are held to a config's ranges and relations even when its own checksum is right
 * (probe D10 and Q7: n_layer = 2^30 made ckpt info and verify allocate without end,
 * n_embd = vocab = 2^30 overflowed the shard arithmetic, and n_head 3 with n_embd 128
 * verified OK), and a recorded learning-rate schedule must be whole. Each state is written with a correct
 * state_crc32 (ts_ckpt_state_crc), so only the check under test can refuse it. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "test_util.h"

static char g_dir[200];

/* A step directory step_00000000 holding `state` (with its crc) and no files. */
static const char *write_state(json_t *state)
{
    static char step[256];
    snprintf(step, sizeof step, "%s/step_00000000", g_dir);
    ts_test_remove_dir(step);
    CHECK(mkdir(step, 0777) == 0);
    json_object_set_new(state, "state_crc32", json_integer((json_int_t)ts_ckpt_state_crc(state)));
    char *text = json_dumps(state, JSON_INDENT(1));
    ts_test_write_file(step, "state.json", text);
    free(text);
    json_decref(state);
    return step;
}

static json_t *state_with(int n_layer, int n_head, int n_embd, int vocab, int seq)
{
    return json_pack("{s:s, s:i, s:i, s:{s:I, s:I, s:i, s:[]}, s:i, s:{}, s:{}, "
                     "s:{s:{s:s, s:i, s:i, s:i, s:i, s:i}, s:{s:f, s:f, s:i, s:i}}}",
                     "format", "tessera-checkpoint", "version", 1, "step", 0, "data",
                     "sequences_consumed", (json_int_t)0, "global_batch", (json_int_t)8,
                     "seq_len", seq, "train", "chunk_bytes", 1 << 26, "files", "checksums",
                     "config", "model", "arch", "gpt2", "n_layer", n_layer, "n_head", n_head,
                     "n_embd", n_embd, "vocab_size", vocab, "seq_len", seq, "train", "lr",
                     1e-3, "min_lr", 1e-4, "warmup", 2, "steps", 10);
}

static void expect_model_refused(json_t *state, const char *want)
{
    const char *step = write_state(state);
    ts_ckpt_reader r;
    ts_error_clear();
    ts_status st = ts_ckpt_reader_open(&r, step);
    CHECKF(st == TS_ERR && strstr(ts_error_message(), "its model") &&
               strstr(ts_error_message(), want) && r.verdict == TS_CKPT_BAD_STATE,
           "%s: %s (verdict %d)", want, ts_error_message(), (int)r.verdict);
    if (st == TS_OK) ts_ckpt_reader_close(&r);
}

static void test_model_keys(void)
{
    expect_model_refused(state_with(1 << 30, 4, 128, 256, 64), "model.n_layer");
    expect_model_refused(state_with(2, 4, 1 << 30, 1 << 30, 64), "model.n_embd");
    expect_model_refused(state_with(2, 3, 128, 256, 64), "n_head");
    /* A valid model passes the model check: what fails next is the (empty) file list. */
    const char *step = write_state(state_with(2, 4, 128, 256, 64));
    ts_ckpt_reader r;
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR && strstr(ts_error_message(), "\"files\""),
           "%s", ts_error_message());
}

/* A llama state's own keys: read with their types and held to llama's relations; a
 * gpt2 state without them (every checkpoint older than llama) takes gpt2's defaults. */
static json_t *llama_state(void)
{
    json_t *s = state_with(2, 4, 128, 256, 64);
    json_t *m = json_object_get(json_object_get(s, "config"), "model");
    json_object_set_new(m, "arch", json_string("llama"));
    json_object_set_new(m, "n_kv_head", json_integer(2));
    json_object_set_new(m, "ffn_hidden", json_integer(320));
    json_object_set_new(m, "norm_eps", json_real(1e-6));
    json_object_set_new(m, "tie_embeddings", json_true());
    json_object_set_new(m, "rope_theta", json_real(500000.0));
    json_object_set_new(m, "rope_scaling", json_real(8.0));
    return s;
}

static void set_model_key(json_t *s, const char *key, json_t *v)
{
    json_object_set_new(json_object_get(json_object_get(s, "config"), "model"), key, v);
}

static void test_llama_model_keys(void)
{
    ts_ckpt_reader r;
    const char *step = write_state(llama_state());
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR && strstr(ts_error_message(), "\"files\""),
           "%s", ts_error_message());
    json_t *s = llama_state();
    set_model_key(s, "n_kv_head", json_integer(3));
    expect_model_refused(s, "n_kv_head");
    s = llama_state();
    set_model_key(s, "rope_theta", json_real(0.0));
    expect_model_refused(s, "rope_theta");
    s = llama_state();
    set_model_key(s, "tie_embeddings", json_string("yes"));
    step = write_state(s);
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR &&
               strstr(ts_error_message(), "config.model.tie_embeddings is not true or false") &&
               r.verdict == TS_CKPT_BAD_STATE,
           "%s", ts_error_message());
    s = llama_state();
    set_model_key(s, "arch", json_string("bert"));
    step = write_state(s);
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR &&
               strstr(ts_error_message(), "config.model.arch is not"),
           "%s", ts_error_message());
    /* gpt2 refuses llama's keys as a config file does. */
    s = state_with(2, 4, 128, 256, 64);
    set_model_key(s, "rope_theta", json_real(10000.0));
    expect_model_refused(s, "rope_theta");
}

/* A llama model as a config file would give it. */
static ts_model_config llama_config(void)
{
    ts_config c;
    ts_test_llama_config(&c);
    c.model.n_layer = 3;
    c.model.n_head = 8;
    c.model.n_kv_head = 2;
    c.model.n_embd = 256;
    c.model.vocab_size = 128256;
    c.model.seq_len = 512;
    c.model.norm_eps = 1e-5;
    ts_config_resolve_model(&c.model);
    return c.model;
}

static void expect_int(json_t *o, const char *key, long long want)
{
    json_t *v = json_object_get(o, key);
    CHECKF(json_is_integer(v) && json_integer_value(v) == want, "%s: want %lld", key, want);
}

static void expect_real(json_t *o, const char *key, double want)
{
    json_t *v = json_object_get(o, key);
    CHECKF(json_is_real(v) && json_real_value(v) == want, "%s: want %.17g", key, want);
}

static void expect_str(json_t *o, const char *key, const char *want)
{
    const char *v = json_string_value(json_object_get(o, key));
    CHECKF(v && !strcmp(v, want), "%s: want \"%s\", got %s", key, want, v ? v : "(none)");
}

/* config.json: what transformers.LlamaConfig.from_pretrained reads, parsed back. */
static void test_hf_config_json(void)
{
    ts_model_config mc = llama_config();
    char *text = ts_ckpt_hf_config_json(&mc);
    CHECK(text != NULL);
    json_error_t err;
    json_t *o = text ? json_loads(text, 0, &err) : NULL;
    CHECKF(json_is_object(o), "%s", text ? text : "(null)");
    json_t *archs = json_object_get(o, "architectures");
    CHECK(json_is_array(archs) && json_array_size(archs) == 1 &&
          !strcmp(json_string_value(json_array_get(archs, 0)), "LlamaForCausalLM"));
    expect_str(o, "model_type", "llama");
    expect_int(o, "hidden_size", 256);
    expect_int(o, "intermediate_size", 768); /* 2/3 of 4C, rounded up to 256 */
    expect_int(o, "num_hidden_layers", 3);
    expect_int(o, "num_attention_heads", 8);
    expect_int(o, "num_key_value_heads", 2);
    expect_int(o, "head_dim", 32);
    expect_int(o, "vocab_size", 128256);
    expect_int(o, "max_position_embeddings", 512);
    expect_real(o, "rms_norm_eps", 1e-5);
    expect_real(o, "rope_theta", 500000.0);
    CHECK(json_is_null(json_object_get(o, "rope_scaling")));
    CHECK(json_is_false(json_object_get(o, "tie_word_embeddings")));
    expect_str(o, "hidden_act", "silu");
    CHECK(json_is_false(json_object_get(o, "attention_bias")));
    CHECK(json_is_false(json_object_get(o, "mlp_bias")));
    expect_str(o, "torch_dtype", "float32");
    /* Written as people write them, and exact. */
    CHECKF(text && strstr(text, "\"rms_norm_eps\": 1e-5,") &&
               strstr(text, "\"rope_theta\": 500000.0"),
           "%s", text ? text : "");
    json_decref(o);
    free(text);

    /* Llama 3.1's scaling, a tied head and explicit sizes. */
    mc.rope_scaling = 8.0;
    mc.rope_low_freq_factor = 1.0;
    mc.rope_high_freq_factor = 4.0;
    mc.rope_original_context = 8192;
    mc.tie_embeddings = 1;
    mc.ffn_hidden = 1000;
    mc.norm_eps = 1e-6;
    text = ts_ckpt_hf_config_json(&mc);
    o = json_loads(text, 0, &err);
    json_t *rs = json_object_get(o, "rope_scaling");
    CHECK(json_is_object(rs));
    expect_str(rs, "rope_type", "llama3");
    expect_real(rs, "factor", 8.0);
    expect_real(rs, "low_freq_factor", 1.0);
    expect_real(rs, "high_freq_factor", 4.0);
    expect_int(rs, "original_max_position_embeddings", 8192);
    CHECK(json_is_true(json_object_get(o, "tie_word_embeddings")));
    expect_int(o, "intermediate_size", 1000);
    expect_real(o, "rms_norm_eps", 1e-6);
    json_decref(o);
    free(text);

    /* YaRN on a llama without MLA (model.rope_type): no config.json, rather than Llama
     * 3.1's rope_scaling for a model that trained with another. */
    snprintf(mc.rope_type, sizeof mc.rope_type, "yarn");
    CHECK(ts_ckpt_hf_config_json(&mc) == NULL);

    /* gpt2 has none: its tensors are nanoGPT's, not transformers' GPT-2 layout. */
    ts_config c;
    ts_config_defaults(&c);
    CHECK(ts_ckpt_hf_config_json(&c.model) == NULL);
}

/* A recorded schedule must be whole (the reader gets past it to the file list); the
 * values it holds are checked where a resume compares them (test_run_guards.sh). */
static void test_lr_schedule(void)
{
    json_t *s = state_with(2, 4, 128, 256, 64);
    json_object_set_new(s, "lr_schedule",
                        json_pack("{s:s, s:f, s:f, s:i, s:i, s:i}", "name", "wsd", "lr", 2e-3,
                                  "min_lr", 2e-4, "warmup", 5, "length", 100, "decay", 20));
    const char *step = write_state(s);
    ts_ckpt_reader r;
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR && strstr(ts_error_message(), "\"files\""),
           "%s", ts_error_message());
    s = state_with(2, 4, 128, 256, 64);
    json_object_set_new(s, "lr_schedule", json_pack("{s:s}", "name", "wsd"));
    step = write_state(s);
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR &&
               strstr(ts_error_message(), "lr_schedule is malformed"),
           "%s", ts_error_message());
}

/* Whether file F's header (not NUL-terminated) names `s`. */
static bool header_has(const ts_ckpt_fileinfo *F, const char *s)
{
    const size_t n = strlen(s);
    for (size_t i = 8; i + n <= F->header_bytes; i++)
        if (memcmp(F->header + i, s, n) == 0) return true;
    return false;
}

/* The optimizer a checkpoint records ("optimizer": {"name"}; older ones: "adamw") must be
 * one this tessera runs; and a Muon checkpoint's layout keeps one momentum_buffer for
 * each Muon matrix in its exp_avg's place and no exp_avg_sq, AdamW's two moments for the
 * rest, the model files as AdamW's. */
static void test_optimizer(void)
{
    json_t *s = state_with(2, 4, 128, 256, 64);
    json_object_set_new(s, "optimizer", json_pack("{s:s}", "name", "sgd"));
    const char *step = write_state(s);
    ts_ckpt_reader r;
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR &&
               strstr(ts_error_message(), "is not \"adamw\" or \"muon\""),
           "%s", ts_error_message());
    s = state_with(2, 4, 128, 256, 64);
    json_object_set_new(s, "optimizer", json_pack("{s:s}", "name", "muon"));
    step = write_state(s);
    ts_error_clear(); /* past the optimizer to the file list */
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR && strstr(ts_error_message(), "\"files\""),
           "%s", ts_error_message());

    ts_config c;
    ts_config_defaults(&c);
    c.model.n_layer = 2;
    c.model.n_embd = 64;
    c.model.n_head = 4;
    ts_ckpt_layout a, m;
    ts_ckpt_layout_build(&a, &c.model, 1e6, false);
    ts_ckpt_layout_build(&m, &c.model, 1e6, true);
    CHECK(a.n_entries == m.n_entries && a.n_model_files == 1 && m.n_model_files == 1);
    int muon = 0;
    uint64_t muon_bytes = 0;
    for (int p = 0; p < m.n_logical; p++) {
        const ts_ckpt_entry *e1 = ts_ckpt_entry_of(&m, TS_CK_EXP_AVG, p);
        const ts_ckpt_entry *e2 = ts_ckpt_entry_of(&m, TS_CK_EXP_AVG_SQ, p);
        CHECK(!a.muon[p] && ts_ckpt_entry_stored(ts_ckpt_entry_of(&a, TS_CK_EXP_AVG_SQ, p)));
        /* gpt2's blocks' 2-D weights: c_attn, attn.c_proj, c_fc, mlp.c_proj */
        const bool want = strstr(m.logical[p].name, "transformer.h.") &&
                          m.logical[p].ndim == 2;
        CHECKF(m.muon[p] == want, "%s", m.logical[p].name);
        if (!m.muon[p]) {
            CHECK(strcmp(e1->name, ts_ckpt_entry_of(&a, TS_CK_EXP_AVG, p)->name) == 0);
            CHECK(ts_ckpt_entry_stored(e2));
            continue;
        }
        muon++;
        muon_bytes += e1->bytes;
        char want_name[TS_CKPT_NAME_MAX];
        snprintf(want_name, sizeof want_name, "momentum_buffer.%s", m.logical[p].name);
        CHECK(strcmp(e1->name, want_name) == 0 && ts_ckpt_entry_stored(e1));
        CHECK(!ts_ckpt_entry_stored(e2) && e2->bytes == 0);
    }
    CHECK(muon == 4 * 2);
    /* the model files alike; the optimizer file smaller by the momentum-less moment and
     * its header's entries */
    CHECK(a.files[0].size == m.files[0].size);
    CHECK(header_has(&m.files[1], "momentum_buffer.transformer.h.1.mlp.c_fc.weight") &&
          !header_has(&m.files[1], "exp_avg_sq.transformer.h.1.mlp.c_fc.weight") &&
          header_has(&m.files[1], "exp_avg_sq.transformer.h.1.mlp.c_fc.bias"));
    const uint64_t da = a.files[1].size - a.files[1].header_bytes;
    const uint64_t dm = m.files[1].size - m.files[1].header_bytes;
    CHECK(da - dm == muon_bytes);
    ts_ckpt_layout_free(&a);
    ts_ckpt_layout_free(&m);
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_ckpt_state");
    test_model_keys();
    test_lr_schedule();
    test_optimizer();
    test_llama_model_keys();
    test_hf_config_json();
    char step[256];
    snprintf(step, sizeof step, "%s/step_00000000", g_dir);
    ts_test_remove_dir(step);
    rmdir(g_dir);
    return ts_test_report();
}
