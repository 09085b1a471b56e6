/* Config loading: values, defaults, --set overrides, and one clear error per mistake. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/batch_rampup.h"
#include "config/config.h"
#include "test_util.h"

static char g_dir[256];
static ts_config g_cfg; /* ~80 KB: keep it off the stack */

static const char *write_cfg(const char *name, const char *text)
{
    return ts_test_write_file(g_dir, name, text);
}

/* Load `text` (written to a file) with overrides; world size 0 skips the grid check. */
static ts_status load_ov(const char *text, const char *const *ov, int n, int world)
{
    const char *path = write_cfg("t.cfg", text);
    return ts_config_load(&g_cfg, path, ov, n, world);
}

static ts_status load(const char *text) { return load_ov(text, NULL, 0, 0); }

static bool msg_has(const char *needle) { return strstr(ts_error_message(), needle) != NULL; }

/* Expect `text` (+ one optional override) to fail with a message containing all of
 * the given fragments. */
#define EXPECT_ERR(text, ov, ...)                                                        \
    do {                                                                               \
        const char *ov_[1] = { ov };                                                   \
        ts_error_clear();                                                              \
        ts_status st_ = load_ov(text, ov_, ov_[0] ? 1 : 0, 0);                         \
        CHECKF(st_ == TS_ERR, "expected an error for %s", #text);                      \
        const char *frags_[] = { __VA_ARGS__ };                                        \
        for (size_t i_ = 0; i_ < sizeof frags_ / sizeof frags_[0]; i_++)               \
            CHECKF(msg_has(frags_[i_]), "message lacks '%s': %s", frags_[i_],          \
                   ts_error_message());                                                \
    } while (0)

static const char *FULL =
    "model = { arch = \"gpt2\"; n_layer = 6; n_head = 8; n_embd = 256;\n"
    "          vocab_size = 512; seq_len = 32; init = \"w.safetensors\"; };\n"
    "parallel = { pp = 2; dp = 2; tp = 2; virtual_stages = 2;\n"
    "             schedule = \"interleaved-1f1b\"; micro_batch = 2;\n"
    "             partition = [2, 2, 2, 2]; recompute = \"full\"; order = \"dp-tp-pp\";\n"
    "             overlap_grad_sync = false; zero = 0; bucket_mb = 8; };\n"
    "train = { global_batch = 32; steps = 50; seed = 7; lr = 1e-3; min_lr = 1e-4;\n"
    "          warmup = 5; weight_decay = 0.05; beta1 = 0.8; beta2 = 0.99; eps = 1e-6;\n"
    "          grad_clip = 0; threads = 3; attention = \"gemm\"; };\n"
    "data = { train = (\"a.bin\", \"b.bin\"); val = \"v.bin\"; eval_every = 10;\n"
    "         val_windows = 4; };\n"
    "checkpoint = { dir = \"\"; every = 0; keep = 2; load = \"\"; };\n"
    "log = { metrics = \"m.jsonl\"; trace = \"t.json\"; progress = false; };\n";

static void test_config_full(void)
{
    ts_status st = load_ov(FULL, NULL, 0, 8);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    const ts_config *c = &g_cfg;
    CHECK(strcmp(c->model.arch, "gpt2") == 0);
    CHECK(c->model.n_layer == 6 && c->model.n_head == 8 && c->model.n_embd == 256);
    CHECK(c->model.vocab_size == 512 && c->model.seq_len == 32);
    CHECK(strcmp(c->model.init, "w.safetensors") == 0);
    CHECK(c->parallel.pp == 2 && c->parallel.dp == 2 && c->parallel.tp == 2);
    CHECK(c->parallel.virtual_stages == 2);
    CHECK(strcmp(c->parallel.schedule, "interleaved-1f1b") == 0);
    CHECK(c->parallel.micro_batch == 2);
    CHECK(c->parallel.n_partition == 4 && c->parallel.partition[3] == 2);
    CHECK(strcmp(c->parallel.recompute, "full") == 0);
    CHECK(strcmp(c->parallel.order, "dp-tp-pp") == 0);
    CHECK(!c->parallel.overlap_grad_sync && c->parallel.zero == 0 && c->parallel.bucket_mb == 8);
    CHECK(c->train.global_batch == 32 && c->train.steps == 50 && c->train.seed == 7);
    CHECK(c->train.lr == 1e-3 && c->train.min_lr == 1e-4 && c->train.warmup == 5);
    CHECK(c->train.weight_decay == 0.05 && c->train.beta1 == 0.8 && c->train.beta2 == 0.99);
    CHECK(c->train.eps == 1e-6 && c->train.grad_clip == 0.0 && c->train.threads == 3);
    CHECK(strcmp(c->train.attention, "gemm") == 0);
    CHECK(c->data.n_train == 2 && strcmp(c->data.train[1], "b.bin") == 0);
    CHECK(c->data.n_val == 1 && strcmp(c->data.val[0], "v.bin") == 0 && c->data.eval_every == 10);
    CHECK(c->data.val_windows == 4);
    CHECK(c->checkpoint.dir[0] == '\0' && c->checkpoint.every == 0);
    CHECK(c->checkpoint.keep == 2 && c->checkpoint.load[0] == '\0');
    CHECK(strcmp(c->log.metrics, "m.jsonl") == 0 && strcmp(c->log.trace, "t.json") == 0);
    CHECK(!c->log.progress);
    CHECK(ts_config_num_microbatches(c) == 8);
}

static void test_config_defaults(void)
{
    ts_status st = load("model = { n_layer = 2; };\n");
    CHECKF(st == TS_OK, "%s", ts_error_message());
    const ts_config *c = &g_cfg;
    CHECK(c->model.n_layer == 2 && c->model.n_head == 4 && c->model.n_embd == 128);
    CHECK(c->model.vocab_size == 256 && c->model.seq_len == 64 && c->model.init[0] == '\0');
    CHECK(c->parallel.pp == 1 && c->parallel.dp == 1 && c->parallel.tp == 1);
    CHECK(c->parallel.virtual_stages == 1 && strcmp(c->parallel.schedule, "1f1b") == 0);
    CHECK(c->parallel.micro_batch == 2 && c->parallel.n_partition == 0);
    CHECK(strcmp(c->parallel.recompute, "none") == 0);
    CHECK(strcmp(c->parallel.order, "tp-dp-pp") == 0);
    CHECK(c->parallel.overlap_grad_sync && c->parallel.zero == 0 && c->parallel.bucket_mb == 4);
    CHECK(c->parallel.memory_budget_mb == 0); /* what the machine offers */
    CHECK(c->train.global_batch == 16 && c->train.steps == 100 && c->train.seed == 1234);
    CHECK(c->train.lr == 6e-4 && c->train.min_lr == 6e-5 && c->train.warmup == 10);
    CHECK(c->train.weight_decay == 0.1 && c->train.beta1 == 0.9 && c->train.beta2 == 0.95);
    CHECK(c->train.eps == 1e-8 && c->train.grad_clip == 1.0 && c->train.threads == 0);
    CHECK(c->data.n_train == 1 && strcmp(c->data.train[0], "data/train.bin") == 0);
    CHECK(c->data.n_val == 0 && c->data.eval_every == 0 && c->data.val_windows == 16);
    CHECK(c->data.shuffle && c->data.seed == c->train.seed && c->data.n_sets == 1);
    CHECK(c->checkpoint.dir[0] == '\0' && c->checkpoint.every == 0 && c->checkpoint.keep == 2);
    CHECK(c->checkpoint.load[0] == '\0');
    CHECK(strcmp(c->log.metrics, "metrics.jsonl") == 0 && c->log.trace[0] == '\0');
    CHECK(c->log.progress);
    CHECK(ts_config_num_microbatches(c) == 8);

    /* An empty file and the defaults struct both validate. */
    CHECK(load("") == TS_OK);
    ts_config_defaults(&g_cfg);
    CHECK(ts_config_validate(&g_cfg, 1) == TS_OK);
}

static void test_config_overrides(void)
{
    const char *ov[] = {
        "parallel.pp=4",                   /* int */
        "train.lr=1e-3",                   /* float */
        "train.min_lr=0",                  /* int into a float key */
        "parallel.schedule=gpipe",         /* bare word */
        "data.train=[\"a.bin\",\"b.bin\"]", /* array of strings */
        "parallel.partition=[1,2,2,1]",    /* array of ints */
        "parallel.overlap_grad_sync=false", /* bool */
        "log.trace=\"tr.json\"",           /* quoted string */
        "model.init=runs/x.safetensors",   /* bare path */
        "parallel.order = dp-tp-pp",       /* spaces around '=' */
        "train.seed=123456789012",         /* int64 */
        "log.metrics=",                    /* empty */
    };
    int n = (int)(sizeof ov / sizeof ov[0]);
    ts_status st = load_ov("parallel = { pp = 2; schedule = \"1f1b\"; };\n", ov, n, 4);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    const ts_config *c = &g_cfg;
    CHECK(c->parallel.pp == 4);
    CHECK(c->train.lr == 1e-3 && c->train.min_lr == 0.0);
    CHECK(strcmp(c->parallel.schedule, "gpipe") == 0);
    CHECK(c->data.n_train == 2 && strcmp(c->data.train[0], "a.bin") == 0);
    CHECK(c->parallel.n_partition == 4 && c->parallel.partition[1] == 2);
    CHECK(!c->parallel.overlap_grad_sync);
    CHECK(strcmp(c->log.trace, "tr.json") == 0);
    CHECK(strcmp(c->model.init, "runs/x.safetensors") == 0);
    CHECK(strcmp(c->parallel.order, "dp-tp-pp") == 0);
    CHECK(c->train.seed == 123456789012LL);
    CHECK(c->log.metrics[0] == '\0');

    /* Lists in parentheses, a later override wins, a new section group is created. */
    const char *ov2[] = { "data.train=(\"x.bin\")", "train.steps=5", "train.steps=7",
                          "log.trace=a", "newsec.key=1" };
    st = ts_config_load(&g_cfg, NULL, ov2, 4, 0);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    CHECK(g_cfg.data.n_train == 1 && strcmp(g_cfg.data.train[0], "x.bin") == 0);
    CHECK(g_cfg.train.steps == 7);
    CHECK(strcmp(g_cfg.log.trace, "a") == 0);
    /* An override that creates an unknown section is named as unknown. */
    CHECK(ts_config_load(&g_cfg, NULL, ov2, 5, 0) == TS_ERR && msg_has("newsec"));

    /* Replacing a setting of another type: partition string -> list -> string. */
    const char *ov3[] = { "parallel.partition=[3,3]", "parallel.partition=balanced" };
    st = load_ov("parallel = { pp = 2; partition = [2, 4]; };\n", ov3, 1, 0);
    CHECKF(st == TS_OK && g_cfg.parallel.partition[0] == 3, "%s", ts_error_message());
    st = load_ov("parallel = { pp = 2; partition = [2, 4]; };\n", ov3, 2, 0);
    CHECKF(st == TS_OK && g_cfg.parallel.n_partition == 0, "%s", ts_error_message());
}

static void test_config_key_errors(void)
{
    const char *ok = "train = { steps = 3; };\n";
    EXPECT_ERR("train = { lr_max = 1.0; };\n", NULL, "unknown config key 'train.lr_max'",
               "t.cfg:1", "known keys in 'train'", "min_lr");
    EXPECT_ERR("train = {\n  stpes = 3; };\n", NULL, "'train.stpes'", "t.cfg:2",
               "did you mean 'train.steps'");
    EXPECT_ERR("train = { micro_batch = 3; };\n", NULL, "'train.micro_batch'",
               "did you mean 'parallel.micro_batch'");
    EXPECT_ERR("modle = { n_layer = 2; };\n", NULL, "unknown config section 'modle'",
               "did you mean 'model'");
    EXPECT_ERR("model = 3;\n", NULL, "section 'model'", "group");
    EXPECT_ERR(ok, "train.lr_max=1", "unknown config key 'train.lr_max'", "--set");
    EXPECT_ERR(ok, "foo.bar=1", "unknown config section 'foo'");
    EXPECT_ERR(ok, "train.steps", "malformed override 'train.steps'");
    EXPECT_ERR(ok, "=3", "malformed override");
    EXPECT_ERR(ok, "train.steps.x=3", "train.steps.x=3", "not a group");
    EXPECT_ERR(ok, "train.st eps=3", "invalid config key");
    /* A planned key that nothing reads is refused, not accepted and ignored (CONTRACT.md
     * "Planned, not built yet"): the bf16 data-parallel reduction. */
    EXPECT_ERR("parallel = { grad_reduce_dtype = \"fp32\"; };\n", NULL,
               "unknown config key 'parallel.grad_reduce_dtype'", "t.cfg:1");
    EXPECT_ERR(ok, "parallel.grad_reduce_dtype=\"bf16\"",
               "unknown config key 'parallel.grad_reduce_dtype'", "--set");
}

static void test_config_type_errors(void)
{
    EXPECT_ERR("model = { n_layer = \"four\"; };\n", NULL, "'model.n_layer'", "an integer",
               "a string");
    EXPECT_ERR("train = { steps = 1.5; };\n", NULL, "'train.steps'", "an integer", "a float");
    EXPECT_ERR("train = { lr = \"fast\"; };\n", NULL, "'train.lr'", "a number");
    EXPECT_ERR("parallel = { overlap_grad_sync = 1; };\n", NULL,
               "'parallel.overlap_grad_sync'", "a boolean");
    EXPECT_ERR("log = { metrics = 3; };\n", NULL, "'log.metrics'", "a string");
    EXPECT_ERR("model = { n_layer = 4; }; parallel = { pp = 2; };\n", "parallel.pp=2.0",
               "'parallel.pp'", "a float", "--set");
    EXPECT_ERR("parallel = { partition = \"even\"; };\n", NULL, "'parallel.partition'",
               "balanced");
    EXPECT_ERR("parallel = { partition = [1.5, 2.5]; };\n", NULL, "'parallel.partition'");
    EXPECT_ERR("parallel = { partition = []; };\n", NULL, "'parallel.partition'", "empty");
    EXPECT_ERR("data = { train = [1, 2]; };\n", NULL, "'data.train'", "string");
    EXPECT_ERR("data = { train = 5; };\n", NULL, "'data.train'");
    EXPECT_ERR("train = { seed = 1.0; };\n", NULL, "'train.seed'");

    /* Too-long strings. */
    size_t n = TS_PATH_MAX + 64;
    char *text = malloc(n + 64);
    int k = snprintf(text, n + 64, "log = { trace = \"");
    memset(text + k, 'x', TS_PATH_MAX + 10);
    snprintf(text + k + TS_PATH_MAX + 10, 64, "\"; };\n");
    EXPECT_ERR(text, NULL, "'log.trace'", "too long");
    free(text);
    EXPECT_ERR("parallel = { recompute = \"everything_please\"; };\n", NULL,
               "'parallel.recompute'");
    /* "auto" and a budget are both read. */
    CHECKF(load("parallel = { recompute = \"auto\"; memory_budget_mb = 512; };\n") == TS_OK,
           "%s", ts_error_message());
    CHECK(strcmp(g_cfg.parallel.recompute, "auto") == 0 && g_cfg.parallel.memory_budget_mb == 512);
}

static void test_config_range_errors(void)
{
    struct { const char *text, *key; } cases[] = {
        { "model = { n_layer = 0; };", "'model.n_layer'" },
        { "model = { n_head = 0; };", "'model.n_head'" },
        { "model = { n_embd = -1; };", "'model.n_embd'" },
        { "model = { vocab_size = 1; };", "'model.vocab_size'" },
        { "model = { vocab_size = 100000000; };", "'model.vocab_size'" },
        { "model = { seq_len = 0; };", "'model.seq_len'" },
        { "parallel = { pp = 0; };", "'parallel.pp'" },
        { "parallel = { dp = -2; };", "'parallel.dp'" },
        { "parallel = { tp = 0; };", "'parallel.tp'" },
        { "parallel = { virtual_stages = 0; };", "'parallel.virtual_stages'" },
        { "parallel = { micro_batch = 0; };", "'parallel.micro_batch'" },
        { "parallel = { zero = 4; };", "'parallel.zero'" },
        { "parallel = { bucket_mb = 0; };", "'parallel.bucket_mb'" },
        { "parallel = { memory_budget_mb = -1; };", "'parallel.memory_budget_mb'" },
        { "train = { global_batch = 0; };", "'train.global_batch'" },
        { "train = { steps = -1; };", "'train.steps'" },
        { "train = { lr = 0; };", "'train.lr'" },
        { "train = { min_lr = -1e-5; };", "'train.min_lr'" },
        { "train = { warmup = -1; };", "'train.warmup'" },
        { "train = { weight_decay = -0.1; };", "'train.weight_decay'" },
        { "train = { beta1 = 1.0; };", "'train.beta1'" },
        { "train = { beta2 = -0.5; };", "'train.beta2'" },
        { "train = { eps = 0.0; };", "'train.eps'" },
        { "train = { grad_clip = -1.0; };", "'train.grad_clip'" },
        { "train = { threads = -1; };", "'train.threads'" },
        { "train = { steps = 5000000000L; };", "'train.steps'" },
        { "data = { eval_every = -1; };", "'data.eval_every'" },
        { "data = { val_windows = 0; };", "'data.val_windows'" },
        { "checkpoint = { every = -1; };", "'checkpoint.every'" },
        { "checkpoint = { keep = 0; };", "'checkpoint.keep'" },
        { "parallel = { pp = 2; partition = [4, -2]; };", "'parallel.partition'" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_error_clear();
        CHECKF(load(cases[i].text) == TS_ERR, "accepted %s", cases[i].text);
        CHECKF(msg_has(cases[i].key), "%s -> %s", cases[i].text, ts_error_message());
    }
    EXPECT_ERR("parallel = { zero = 4; };\n", NULL, "[0, 3]", "t.cfg:1");
    EXPECT_ERR("train = { beta1 = 1.0; };\n", NULL, "in [0, 1)");
}

static void test_config_enum_errors(void)
{
    EXPECT_ERR("model = { arch = \"mamba\"; };\n", NULL, "'model.arch'", "\"gpt2\" and \"llama\"");
    EXPECT_ERR("parallel = { schedule = \"zigzag\"; };\n", NULL, "'parallel.schedule'",
               "interleaved-1f1b", ".csv");
    EXPECT_ERR("parallel = { recompute = \"some\"; };\n", NULL, "'parallel.recompute'",
               "except_last");
    EXPECT_ERR("parallel = { order = \"tp-tp-pp\"; };\n", NULL, "'parallel.order'");
    EXPECT_ERR("parallel = { order = \"tp-dp\"; };\n", NULL, "'parallel.order'");
    CHECK(load("parallel = { order = \"pp-tp-dp\"; schedule = \"s/my.csv\"; "
               "virtual_stages = 2; };\n") == TS_OK);
    CHECK(load("parallel = { schedule = \"zb-h1\"; };\n") == TS_OK);
    CHECK(load("parallel = { schedule = \"interleaved-1f1b\"; };\n") == TS_OK);
}

/* model.arch = "llama" brings its defaults (untied head, rope_theta 500000) before the
 * file's keys; the resolved n_kv_head, ffn_hidden and tie_embeddings are in the JSON;
 * the keys of one architecture are refused on the other, and the tp rules for key/value
 * heads hold. */
static void test_config_llama(void)
{
    static ts_config c; /* ~80 KB: off the stack */
    CHECK(load("model = { arch = \"llama\"; n_embd = 96; n_head = 4; };\n") == TS_OK);
    c = g_cfg;
    CHECK(c.model.rope_theta == 500000.0 && c.model.norm_eps == 1e-5);
    CHECK(!ts_model_tied(&c.model) && c.model.tie_embeddings == -1);
    CHECK(c.model.n_kv_head == 4 && c.model.ffn_hidden == 256); /* 2/3 of 384 -> 256 */
    char *json = ts_config_to_json(&c);
    CHECKF(strstr(json, "\"tie_embeddings\":false") && strstr(json, "\"n_kv_head\":4") &&
               strstr(json, "\"ffn_hidden\":256"),
           "%s", json);
    free(json);
    CHECK(load("model = { arch = \"llama\"; rope_theta = 10000.0; tie_embeddings = true; };\n") == TS_OK);
    CHECK(g_cfg.model.rope_theta == 10000.0 && ts_model_tied(&g_cfg.model));
    CHECK(load("model = { n_embd = 96; n_head = 4; };\n") == TS_OK); /* gpt2's defaults */
    CHECK(ts_model_tied(&g_cfg.model) && g_cfg.model.ffn_hidden == 384 &&
          g_cfg.model.rope_theta == 0.0);
    EXPECT_ERR("model = { n_kv_head = 2; };\n", NULL, "grouped-query attention is a llama feature");
    EXPECT_ERR("model = { norm_eps = 1e-6; };\n", NULL, "gpt2's LayerNorm uses eps 1e-5");
    EXPECT_ERR("model = { rope_theta = 10000.0; };\n", NULL, "rope_theta", "learned position");
    EXPECT_ERR("model = { arch = \"llama\"; n_head = 4; n_kv_head = 3; };\n", NULL,
               "must divide by model.n_kv_head = 3");
    EXPECT_ERR("model = { arch = \"llama\"; n_embd = 72; n_head = 8; };\n", NULL,
               "head dimension must be even");
    EXPECT_ERR("model = { arch = \"llama\"; rope_scaling = 8.0; rope_high_freq_factor = 1.0; };\n",
               NULL, "high_freq_factor > low_freq_factor");
    EXPECT_ERR("model = { arch = \"llama\"; n_head = 4; n_kv_head = 4; ffn_hidden = 100; };\n"
               "parallel = { tp = 8; };\n",
               NULL, "n_head = 4 must divide by parallel.tp = 8");
    EXPECT_ERR("model = { arch = \"llama\"; n_head = 8; n_embd = 128; n_kv_head = 4; ffn_hidden = 100; };\n"
               "parallel = { tp = 8; };\n",
               NULL, "ffn_hidden = 100 must divide by parallel.tp = 8");
}

/* model.tokenizer: "" (the default), "gpt2" or "llama3", recorded in the config's JSON
 * with model.tokenizer_file; a byte-level model takes none, a file needs an encoding.
 * (The ranks file is opened by the trainer, not here: vocab_size against the
 * tokenizer's vocabulary is test_sample_text.sh's.) */
static void test_config_tokenizer(void)
{
    CHECK(load("model = { vocab_size = 512; };\n") == TS_OK && !g_cfg.model.tokenizer[0] &&
          !g_cfg.model.tokenizer_file[0] && !g_cfg.model.tokenizer_sha256[0]);
    CHECK(load("model = { vocab_size = 50304; tokenizer = \"gpt2\"; "
               "tokenizer_file = \"r/gpt2.tiktoken\"; };\n") == TS_OK);
    CHECK(!strcmp(g_cfg.model.tokenizer, "gpt2") &&
          !strcmp(g_cfg.model.tokenizer_file, "r/gpt2.tiktoken"));
    char *json = ts_config_to_json(&g_cfg);
    CHECKF(strstr(json, "\"tokenizer\":\"gpt2\"") &&
               strstr(json, "\"tokenizer_file\":\"r/gpt2.tiktoken\""),
           "%s", json);
    free(json);
    CHECK(load("model = { arch = \"llama\"; vocab_size = 128256; tokenizer = \"llama3\"; };\n") ==
          TS_OK);
    EXPECT_ERR("model = { vocab_size = 512; tokenizer = \"bytes\"; };\n", NULL,
               "'model.tokenizer' = \"bytes\"", "is not an encoding", "\"gpt2\"", "\"llama3\"");
    EXPECT_ERR("model = { vocab_size = 512; tokenizer = \"gpt-2\"; };\n", NULL, "is not an encoding");
    EXPECT_ERR("model = { tokenizer = \"gpt2\"; };\n", NULL,
               "model.tokenizer = \"gpt2\" with model.vocab_size = 256", "byte-level");
    EXPECT_ERR("model = { vocab_size = 50257; tokenizer_file = \"x.tiktoken\"; };\n", NULL,
               "model.tokenizer_file = \"x.tiktoken\" is set, but model.tokenizer is not");
    EXPECT_ERR("model = { vocab_size = 50257; tokenizer = 2; };\n", NULL, "model.tokenizer");
    EXPECT_ERR("model = { vocab_size = 50257; tokenizr = \"gpt2\"; };\n", NULL, "tokenizer");
    const char *ov = "model.tokenizer=gpt2";
    CHECK(load_ov("model = { vocab_size = 50257; };\n", &ov, 1, 0) == TS_OK &&
          !strcmp(g_cfg.model.tokenizer, "gpt2"));
}

static void test_config_syntax_error(void)
{
    EXPECT_ERR("model = {\n  n_layer = 4;\n  n_head = ;\n};\n", NULL, "t.cfg:3");
    EXPECT_ERR("model = { n_layer = 4; }\ntrain = { steps 3; };\n", NULL, "t.cfg:2");
    /* libconfig 1.5 would truncate 64-bit literals without an L suffix. */
    EXPECT_ERR("train = {\n steps = 5000000000; };\n", NULL, "t.cfg:2", "5000000000L");
    CHECK(load("train = { seed = 123456789012L; }; # 99999999999\n") == TS_OK &&
          g_cfg.train.seed == 123456789012LL);
    EXPECT_ERR(FULL, "data.train=[1, 99999999999]", "99999999999L");
    ts_error_clear();
    CHECK(ts_config_load(&g_cfg, "/nonexistent/x.cfg", NULL, 0, 0) == TS_ERR);
    CHECK(msg_has("/nonexistent/x.cfg"));
}

/* The file is read once: a pipe (`tessera train /dev/stdin`, `<(...)`) gives its keys,
 * not the defaults; a directory or a binary file is named as such. */
static void test_config_read_once(void)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    const char *text = "model = { n_layer = 2; };\ntrain = { steps = 3; };\n";
    CHECK(write(fds[1], text, strlen(text)) == (ssize_t)strlen(text));
    close(fds[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
    ts_status st = ts_config_load(&g_cfg, path, NULL, 0, 0);
    close(fds[0]);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    CHECK(g_cfg.model.n_layer == 2 && g_cfg.train.steps == 3);

    ts_error_clear();
    CHECK(ts_config_load(&g_cfg, g_dir, NULL, 0, 0) == TS_ERR && msg_has("is a directory"));
    const char *bin = write_cfg("bin.cfg", "model = { n_layer = 2; };\n");
    FILE *f = fopen(bin, "ab");
    CHECK(f && fwrite("\0train = { steps = 3; };", 1, 24, f) == 24 && fclose(f) == 0);
    ts_error_clear();
    CHECK(ts_config_load(&g_cfg, bin, NULL, 0, 0) == TS_ERR && msg_has("NUL byte"));
}

static void test_config_relations(void)
{
    const char *grid = "parallel = { pp = 2; dp = 2; tp = 2; };\n";
    CHECK(load_ov(grid, NULL, 0, 8) == TS_OK);
    ts_error_clear();
    CHECK(load_ov(grid, NULL, 0, 4) == TS_ERR);
    CHECKF(msg_has("pp*dp*cp*tp = 2*2*1*2 = 8") && msg_has("4 ranks") && msg_has("-np 8"), "%s",
           ts_error_message());

    EXPECT_ERR("parallel = { dp = 2; micro_batch = 4; }; train = { global_batch = 20; };\n",
               NULL, "train.global_batch = 20", "2 * 4", "16 or 24", "micro_batch");
    EXPECT_ERR("parallel = { dp = 4; micro_batch = 8; }; train = { global_batch = 16; };\n",
               NULL, "train.global_batch = 16", "32");
    EXPECT_ERR("parallel = { dp = 3; micro_batch = 1; }; train = { global_batch = 16; };\n",
               NULL, "train.global_batch", "15 or 18");
    EXPECT_ERR("model = { n_head = 6; n_embd = 96; }; parallel = { tp = 4; };\n", NULL,
               "model.n_head = 6", "parallel.tp = 4");
    /* Any vocabulary splits over tp (balanced rows), as long as each rank gets a row. */
    CHECK(load("model = { vocab_size = 257; }; parallel = { tp = 2; };\n") == TS_OK);
    CHECK(load("model = { n_head = 12; n_embd = 96; vocab_size = 50257; }; "
               "parallel = { tp = 3; };\n") == TS_OK);
    EXPECT_ERR("model = { vocab_size = 3; }; parallel = { tp = 4; };\n", NULL,
               "model.vocab_size = 3", "parallel.tp = 4");
    EXPECT_ERR("model = { n_head = 3; n_embd = 128; };\n", NULL, "model.n_embd = 128",
               "model.n_head = 3");
    EXPECT_ERR("model = { n_layer = 2; }; parallel = { pp = 3; virtual_stages = 2; "
               "schedule = \"interleaved-1f1b\"; };\n",
               NULL, "more pipeline chunks than layers", "6 chunks", "4 layers");
    EXPECT_ERR("parallel = { pp = 2; partition = [2, 2, 2]; };\n", NULL,
               "parallel.partition", "3 chunks", "= 2");
    EXPECT_ERR("parallel = { pp = 2; partition = [2, 2]; };\n", NULL, "parallel.partition",
               "sums to 4", "6");
    CHECK(load("parallel = { pp = 2; partition = [0, 6]; };\n") == TS_OK);
    EXPECT_ERR("parallel = { pp = 2; virtual_stages = 2; };\n", NULL,
               "parallel.virtual_stages = 2", "interleaved-1f1b");
    /* The generated schedules: their names load, with the chunks per rank they need. */
    CHECK(load("parallel = { pp = 2; virtual_stages = 2; schedule = \"zb-v\"; };\n") == TS_OK);
    CHECK(load("parallel = { pp = 2; virtual_stages = 2; schedule = \"dualpipe-v\"; };\n") ==
          TS_OK);
    CHECK(load("parallel = { pp = 2; virtual_stages = 3; schedule = \"looped-bfs\"; };\n") ==
          TS_OK);
    CHECK(load("parallel = { pp = 2; virtual_stages = 2; schedule = \"interleaved-zb\"; };\n") ==
          TS_OK);
    CHECK(load("parallel = { pp = 2; schedule = \"zb-h2\"; };\n") == TS_OK);
    EXPECT_ERR("parallel = { pp = 2; schedule = \"zb-v\"; };\n", NULL,
               "schedule \"zb-v\" needs parallel.virtual_stages = 2", "got 1");
    EXPECT_ERR("parallel = { pp = 2; virtual_stages = 2; schedule = \"zb-h2\"; };\n", NULL,
               "\"zb-h2\" runs one chunk per pipeline rank", "\"looped-bfs\"");
    EXPECT_ERR("parallel = { schedule = \"zb-h3\"; };\n", NULL, "\"dualpipe-v\"",
               "\"zb-h2\"");
    /* ZeRO-1, 2 and 3 are built: each loads, with any grid. */
    CHECK(load("parallel = { zero = 1; };\n") == TS_OK && g_cfg.parallel.zero == 1);
    CHECK(load("parallel = { zero = 1; dp = 2; };\n") == TS_OK);
    CHECK(load("parallel = { zero = 2; dp = 2; };\n") == TS_OK && g_cfg.parallel.zero == 2);
    CHECK(load("parallel = { zero = 3; dp = 2; pp = 2; };\n") == TS_OK && g_cfg.parallel.zero == 3);
    /* Checkpoint keys: every and load = "latest" need a directory; file_gb is positive. */
    CHECK(load("checkpoint = { load = \"some/dir\"; };\n") == TS_OK);
    CHECK(load("checkpoint = { dir = \"ck\"; every = 5; keep = 3; load = \"latest\"; "
               "file_gb = 0.5; async = true; };\n") == TS_OK && g_cfg.checkpoint.file_gb == 0.5 &&
          g_cfg.checkpoint.async);
    EXPECT_ERR("checkpoint = { every = 5; };\n", NULL, "checkpoint.every = 5",
               "needs checkpoint.dir");
    EXPECT_ERR("checkpoint = { load = \"latest\"; };\n", NULL, "checkpoint.load",
               "checkpoint.dir");
    EXPECT_ERR("checkpoint = { file_gb = 0; };\n", NULL, "checkpoint.file_gb");
    CHECK(load("checkpoint = { keep = 2; every = 0; dir = \"\"; load = \"\"; };\n") == TS_OK);
    /* train.device: the backends this build has; "cuda" says a CPU-only build lacks it,
     * and a CUDA build accepts it without a GPU (validation never looks for one). */
    CHECK(load("train = { device = \"cpu-strict\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.device, "cpu-strict"));
    CHECK(load("train = { threads = 1; };\n") == TS_OK && !strcmp(g_cfg.train.device, "cpu"));
#ifdef TS_HAVE_CUDA
    CHECK(load("train = { device = \"cuda\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.device, "cuda"));
#else
    EXPECT_ERR("train = { device = \"cuda\"; };\n", NULL, "train.device", "without the CUDA");
#endif
    /* A plan sizes a CUDA run in any build (ts_config_load_plan); the next load checks
     * again as a run does. */
    CHECK(ts_config_load_plan(&g_cfg, write_cfg("t.cfg", "train = { device = \"cuda\";\n"
                                                         "  attention = \"flash\"; };\n"),
                              NULL, 0) == TS_OK &&
          !strcmp(g_cfg.train.device, "cuda") && !strcmp(g_cfg.train.attention, "flash"));
    CHECK(ts_config_load_plan(&g_cfg, write_cfg("t.cfg", "train = { device = \"gpu\"; };\n"),
                              NULL, 0) == TS_ERR);
#ifndef TS_HAVE_CUDA
    EXPECT_ERR("train = { device = \"cuda\"; };\n", NULL, "train.device", "without the CUDA");
#endif
    EXPECT_ERR("train = { device = \"gpu\"; };\n", NULL, "train.device", "\"gpu\"",
               "not a device");
    /* A kernel table's name is not a device: precision and attention choose among them. */
    EXPECT_ERR("train = { device = \"cuda-bf16\"; };\n", NULL, "train.device", "\"cuda-bf16\"",
               "not a device");
    EXPECT_ERR("train = { device = \"cuda-flash\"; };\n", NULL, "train.device", "not a device");
    /* train.precision and parallel.comm: bf16 runs on every device (the run refuses a
     * CPU without BF16 instructions); NCCL needs the GPU backend. */
    CHECK(load("train = { threads = 1; };\n") == TS_OK && !strcmp(g_cfg.train.precision, "fp32") &&
          !strcmp(g_cfg.parallel.comm, "auto"));
    CHECK(load("parallel = { comm = \"mpi\"; };\ntrain = { precision = \"fp32\"; };\n") == TS_OK &&
          !strcmp(g_cfg.parallel.comm, "mpi"));
    EXPECT_ERR("train = { precision = \"fp16\"; };\n", NULL, "train.precision", "\"fp16\"",
               "not a precision");
    CHECK(load("train = { precision = \"bf16\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.precision, "bf16"));
    EXPECT_ERR("parallel = { comm = \"gloo\"; };\n", NULL, "parallel.comm", "\"gloo\"",
               "not a communication backend");
#ifdef TS_HAVE_NCCL
    EXPECT_ERR("parallel = { comm = \"nccl\"; };\n", NULL, "parallel.comm = \"nccl\"",
               "train.device = \"cpu\"");
    EXPECT_ERR("parallel = { grad_sync_progress = \"thread\"; };\ntrain = { device = \"cuda\"; };\n",
               NULL, "grad_sync_progress = \"thread\"", "NCCL");
    CHECK(load("parallel = { grad_sync_progress = \"thread\"; comm = \"mpi\"; };\n"
               "train = { device = \"cuda\"; };\n") == TS_OK);
#else
    EXPECT_ERR("parallel = { comm = \"nccl\"; };\n", NULL, "parallel.comm", "without NCCL");
#endif
#ifdef TS_HAVE_CUDA
    CHECK(load("train = { device = \"cuda\"; precision = \"bf16\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.precision, "bf16"));
#endif
    /* train.attention: "gemm" (default, every device) or "flash" (the CUDA kernel). */
    CHECK(load("train = { threads = 1; };\n") == TS_OK && !strcmp(g_cfg.train.attention, "gemm"));
    CHECK(load("train = { attention = \"gemm\"; device = \"cpu-strict\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.attention, "gemm"));
    EXPECT_ERR("train = { attention = \"sdpa\"; };\n", NULL, "train.attention", "\"sdpa\"",
               "not an attention kernel", "\"gemm\"", "\"flash\"", "t.cfg:1");
    EXPECT_ERR("", "train.attention=Flash", "train.attention", "\"Flash\"", "from --set");
    EXPECT_ERR("train = { attention = 1; };\n", NULL, "train.attention", "must be a string");
    EXPECT_ERR("train = { attention = \"flash\"; };\n", NULL, "train.attention = \"flash\"",
               "train.device = \"cpu\"", "train.device = \"cuda\"");
    EXPECT_ERR("", "train.attention=flash", "train.attention = \"flash\"",
               "train.device = \"cpu\"");
    EXPECT_ERR("train = { attention = \"flash\"; device = \"cpu-strict\"; };\n", NULL,
               "train.attention = \"flash\"", "train.device = \"cpu-strict\"");
    EXPECT_ERR("train = { attentoin = \"flash\"; };\n", NULL, "did you mean 'train.attention'");
#ifdef TS_HAVE_CUDA
    CHECK(load("train = { device = \"cuda\"; attention = \"flash\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.attention, "flash"));
    CHECK(load("train = { device = \"cuda\"; precision = \"bf16\";\n"
               "          attention = \"flash\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.attention, "flash"));
#endif
    /* A config built in code is checked too. */
    ts_config_defaults(&g_cfg);
    snprintf(g_cfg.train.attention, sizeof g_cfg.train.attention, "%s", "fast");
    ts_error_clear();
    CHECK(ts_config_validate(&g_cfg, 0) == TS_ERR && msg_has("train.attention") &&
          msg_has("\"fast\""));
    snprintf(g_cfg.train.attention, sizeof g_cfg.train.attention, "%s", "flash");
    ts_error_clear();
    CHECK(ts_config_validate(&g_cfg, 0) == TS_ERR && msg_has("train.attention = \"flash\""));
    /* dp's "auto" (0) is resolved by ts_config_load alone: a config built in code with
     * dp = 0 is refused, not divided by. */
    ts_config_defaults(&g_cfg);
    g_cfg.parallel.dp = 0;
    ts_error_clear();
    CHECK(ts_config_validate(&g_cfg, 0) == TS_ERR && msg_has("parallel.dp = 0"));
    /* Non-finite floats, 64-bit overflow, upper bounds that keep the arithmetic in range. */
    EXPECT_ERR("train = { lr = 1e309; };\n", NULL, "train.lr", "not a finite number");
    /* Past FLT_MAX a value becomes inf in the kernels' single precision (probe D1:
     * train.lr = 1e39 trained on non-finite weights). */
    EXPECT_ERR("train = { lr = 1e39; };\n", NULL, "train.lr", "1e+39", "overflows single precision",
               "t.cfg:1");
    EXPECT_ERR("", "train.eps=3.5e38", "train.eps", "overflows single precision", "from --set");
    EXPECT_ERR("", "train.weight_decay=1e300", "train.weight_decay", "overflows");
    CHECK(load("train = { lr = 3e38; };\n") == TS_OK && g_cfg.train.lr == 3e38);
    /* parallel.dp = "auto": what pp * tp leave of the ranks launched. */
    CHECK(load_ov("parallel = { dp = \"auto\"; };\ntrain = { global_batch = 16; };\n", NULL, 0,
                  4) == TS_OK &&
          g_cfg.parallel.dp == 4);
    CHECK(load_ov("parallel = { dp = \"auto\"; pp = 2; };\ntrain = { global_batch = 16; };\n",
                  NULL, 0, 8) == TS_OK &&
          g_cfg.parallel.dp == 4);
    CHECK(load_ov("parallel = { dp = \"auto\"; };\n", NULL, 0, 0) == TS_OK && g_cfg.parallel.dp == 1);
    {
        const char *ov[1] = {"parallel.dp=auto"};
        CHECK(load_ov("", ov, 1, 2) == TS_OK && g_cfg.parallel.dp == 2);
        ts_error_clear();
        CHECK(load_ov("parallel = { dp = \"auto\"; tp = 2; };\n", NULL, 0, 3) == TS_ERR &&
              msg_has("parallel.dp = \"auto\"") && msg_has("3 is not a multiple of 2"));
    }
    EXPECT_ERR("parallel = { dp = \"all\"; };\n", NULL, "parallel.dp", "a whole number or \"auto\"",
               "t.cfg:1");
    EXPECT_ERR("parallel = { dp = 0; };\n", NULL, "parallel.dp", "out of range");
    /* train.on_nonfinite: "stop" (default) or "skip". */
    CHECK(load("train = { threads = 1; };\n") == TS_OK &&
          !strcmp(g_cfg.train.on_nonfinite, "stop"));
    CHECK(load("train = { on_nonfinite = \"skip\"; };\n") == TS_OK &&
          !strcmp(g_cfg.train.on_nonfinite, "skip"));
    EXPECT_ERR("train = { on_nonfinite = \"ignore\"; };\n", NULL, "train.on_nonfinite",
               "\"ignore\"", "\"stop\"", "\"skip\"", "t.cfg:1");
    /* train.skip_spikes (0 = off) and its window (llm.c's 128): the window only with the
     * guard on, and a threshold no z-score can pass (>= sqrt(W - 1)) refused. */
    CHECK(load("train = { threads = 1; };\n") == TS_OK && g_cfg.train.skip_spikes == 0.0 &&
          g_cfg.train.spike_window == 128);
    CHECK(load("train = { skip_spikes = 5.0; };\n") == TS_OK && g_cfg.train.skip_spikes == 5.0);
    CHECK(load("train = { skip_spikes = 2.6; spike_window = 8; };\n") == TS_OK);
    EXPECT_ERR("train = { spike_window = 64; };\n", NULL, "train.spike_window",
               "train.skip_spikes > 0", "ignored");
    EXPECT_ERR("train = { skip_spikes = 2.7; spike_window = 8; };\n", NULL, "train.skip_spikes",
               "never skip", "sqrt(8 - 1) = 2.646");
    EXPECT_ERR("train = { skip_spikes = 12; };\n", NULL, "train.skip_spikes", "128");
    EXPECT_ERR("train = { skip_spikes = 3; spike_window = 1; };\n", NULL, "train.spike_window",
               "out of range");
    EXPECT_ERR("train = { skip_spikes = -1; };\n", NULL, "train.skip_spikes", "out of range");
    EXPECT_ERR("parallel = { grad_sync_progress = \"thread\"; overlap_grad_sync = false; };\n",
               NULL, "grad_sync_progress", "overlap_grad_sync = false");
    EXPECT_ERR("train = { seed = 99999999999999999999L; };\n", NULL, "t.cfg:1", "64 bits");
    EXPECT_ERR("train = { seed = 18446744073709551615; };\n", NULL, "64 bits");
    CHECK(load("train = { seed = 9223372036854775807L; };\n") == TS_OK &&
          g_cfg.train.seed == INT64_MAX);
    CHECK(load("train = { seed = -9223372036854775808L; };\n") == TS_OK &&
          g_cfg.train.seed == INT64_MIN);
    EXPECT_ERR("model = { n_layer = 100000; };\n", NULL, "model.n_layer", "65536");
    EXPECT_ERR("data = { val_windows = 2147483647; };\n", NULL, "data.val_windows");
    EXPECT_ERR("train = { threads = 5000; };\n", NULL, "train.threads");
    EXPECT_ERR("parallel = { micro_batch = 1048576; };\nmodel = { seq_len = 4096; };\n"
               "train = { global_batch = 1048576; };\n",
               NULL, "micro_batch * model.seq_len");
    EXPECT_ERR("train = { lr = 1e-4; min_lr = 1e-3; };\n", NULL, "train.min_lr");
    /* warmup past the end is fine. */
    CHECK(load("train = { steps = 5; warmup = 50; };\n") == TS_OK);

    /* validate on a config built in code checks ranges too. */
    ts_config_defaults(&g_cfg);
    g_cfg.train.beta2 = 1.5;
    ts_error_clear();
    CHECK(ts_config_validate(&g_cfg, 0) == TS_ERR && msg_has("train.beta2"));
}

/* data.train as a path, a list, or a blend of groups; data.val as a list; data.seed
 * following train.seed unless given; every malformed blend refused by name. */
static void test_config_data_blend(void)
{
    CHECK(load("data = { train = ( { path = \"web_*.bin\"; weight = 0.7; },\n"
               "  { path = [\"c1.bin\", \"c2.bin\"]; weight = 3; } );\n"
               "  val = [\"v1.bin\", \"v_*.bin\"]; shuffle = false; };\n"
               "train = { seed = 99; };\n") == TS_OK);
    const ts_data_config *d = &g_cfg.data;
    CHECK(d->blend && d->n_sets == 2 && d->n_train == 3);
    CHECK(d->train_set[0] == 0 && d->train_set[1] == 1 && d->train_set[2] == 1);
    CHECK(strcmp(d->train[2], "c2.bin") == 0 && d->weight[0] == 0.7 && d->weight[1] == 3.0);
    CHECK(d->n_val == 2 && strcmp(d->val[1], "v_*.bin") == 0);
    CHECK(!d->shuffle && d->seed == 99); /* data.seed defaults to train.seed */
    char *text = ts_config_to_json(&g_cfg);
    CHECKF(strstr(text, "\"train\":[{\"path\":[\"web_*.bin\"],\"weight\":0.7},") != NULL, "%s", text);
    CHECKF(strstr(text, "\"val\":[\"v1.bin\",\"v_*.bin\"]") != NULL, "%s", text);
    free(text);
    CHECK(load("data = { seed = 5; }; train = { seed = 99; };\n") == TS_OK && g_cfg.data.seed == 5);
    CHECK(load("data = { train = [\"a.bin\", \"b.bin\"]; };\n") == TS_OK && !g_cfg.data.blend &&
          g_cfg.data.n_sets == 1 && g_cfg.data.n_train == 2 && g_cfg.data.shuffle);
    CHECK(load("data = { val = \"\"; };\n") == TS_OK && g_cfg.data.n_val == 0);

    const struct { const char *text, *msg; } bad[] = {
        {"data = { train = ( { path = \"a.bin\"; } ); };", "blend entry 0 lacks 'weight'"},
        {"data = { train = ( { weight = 1; } ); };", "blend entry 0 lacks 'path'"},
        {"data = { train = ( { path = \"a\"; weight = 0; } ); };", "weight = 0 must be a positive"},
        {"data = { train = ( { path = \"a\"; weight = \"x\"; } ); };", "weight must be a number"},
        {"data = { train = ( { path = \"a\"; weight = 1; w = 2; } ); };", "unknown key 'w'"},
        {"data = { train = ( { path = \"a\"; weight = 1; }, \"b.bin\" ); };", "the other entries are blend groups"},
        {"data = { train = ( { path = 3; weight = 1; } ); };", "a string or a list of strings"},
        {"data = { train = []; };", "is an empty list"},
        {"data = { val = [1]; };", "entry 0 must be a string"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ts_status st = load(bad[k].text);
        CHECKF(st == TS_ERR && msg_has(bad[k].msg), "%s -> %s", bad[k].text, ts_error_message());
    }
}

static void test_config_json(void)
{
    CHECK(load_ov(FULL, NULL, 0, 8) == TS_OK);
    char *text = ts_config_to_json(&g_cfg);
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    CHECKF(j != NULL, "%s: %s", err.text, text);
    if (j) {
        json_t *model = json_object_get(j, "model"), *par = json_object_get(j, "parallel");
        json_t *train = json_object_get(j, "train"), *data = json_object_get(j, "data");
        CHECK(json_integer_value(json_object_get(model, "n_layer")) == 6);
        CHECK(strcmp(json_string_value(json_object_get(model, "arch")), "gpt2") == 0);
        CHECK(json_array_size(json_object_get(par, "partition")) == 4);
        CHECK(json_is_false(json_object_get(par, "overlap_grad_sync")));
        CHECK(json_real_value(json_object_get(train, "lr")) == 1e-3);
        CHECK(json_integer_value(json_object_get(train, "seed")) == 7);
        CHECK(strcmp(json_string_value(json_object_get(train, "attention")), "gemm") == 0);
        CHECK(json_array_size(json_object_get(data, "train")) == 2);
        CHECK(json_is_object(json_object_get(j, "checkpoint")));
        CHECK(json_is_false(json_object_get(json_object_get(j, "log"), "progress")));
        json_decref(j);
    }
    free(text);

    /* Floats read back exactly, printed short where that is exact. */
    ts_config_defaults(&g_cfg);
    text = ts_config_to_json(&g_cfg);
    CHECKF(strstr(text, "\"lr\":0.0006,") != NULL, "%s", text);
    free(text);
    g_cfg.train.beta1 = 0.1 + 0.2; /* needs 17 digits */
    text = ts_config_to_json(&g_cfg);
    j = json_loads(text, 0, &err);
    CHECK(j && json_real_value(json_object_get(json_object_get(j, "train"), "beta1")) ==
                   0.1 + 0.2);
    json_decref(j);
    free(text);

    ts_config_defaults(&g_cfg);
    text = ts_config_to_json(&g_cfg);
    j = json_loads(text, 0, &err);
    CHECK(j != NULL);
    if (j) {
        json_t *par = json_object_get(j, "parallel");
        CHECK(strcmp(json_string_value(json_object_get(par, "partition")), "balanced") == 0);
        CHECK(json_array_size(json_object_get(json_object_get(j, "data"), "train")) == 1);
        CHECK(json_integer_value(json_object_get(json_object_get(j, "parallel"), "bucket_mb")) == 4);
        json_decref(j);
    }
    free(text);
}

static void test_config_shipped_files(void)
{
    const char *src = getenv("TS_SOURCE_DIR");
    if (!src) src = ".";
    char path[1024];

    snprintf(path, sizeof path, "%s/configs/tiny.cfg", src);
    ts_status st = ts_config_load(&g_cfg, path, NULL, 0, 1);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    const ts_config *c = &g_cfg;
    CHECK(c->model.n_layer == 4 && c->model.n_head == 4 && c->model.n_embd == 128);
    CHECK(c->model.vocab_size == 256 && c->model.seq_len == 64);
    CHECK(c->parallel.micro_batch == 4 && c->train.global_batch == 16);
    CHECK(c->train.steps == 200 && c->train.lr == 1e-3 && c->train.min_lr == 1e-4);
    CHECK(c->train.warmup == 50 && c->train.seed == 1234 && c->data.eval_every == 50);
    CHECK(strcmp(c->data.train[0], "data/fortunes_train.bin") == 0);
    CHECK(c->data.n_val == 1 && strcmp(c->data.val[0], "data/fortunes_val.bin") == 0);
    CHECK(strcmp(c->log.metrics, "runs/tiny/metrics.jsonl") == 0);
    CHECK(ts_config_num_microbatches(c) == 4);

    /* The tiny model runs on the 8-rank grid of the contract's example. */
    const char *ov[] = { "parallel.pp=2", "parallel.dp=2", "parallel.tp=2" };
    st = ts_config_load(&g_cfg, path, ov, 3, 8);
    CHECKF(st == TS_OK && ts_config_num_microbatches(&g_cfg) == 2, "%s", ts_error_message());

    snprintf(path, sizeof path, "%s/configs/gpt2-124m.cfg", src);
    st = ts_config_load(&g_cfg, path, NULL, 0, 1);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    CHECK(c->model.n_layer == 12 && c->model.n_embd == 768 && c->model.vocab_size == 50257);
    CHECK(c->model.seq_len == 1024 && c->train.lr == 6e-4 && c->train.warmup == 700);

    snprintf(path, sizeof path, "%s/configs/gpt2-bpe-tiny.cfg", src);
    st = ts_config_load(&g_cfg, path, NULL, 0, 2);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    CHECK(!strcmp(c->model.tokenizer, "gpt2") && c->model.vocab_size == 50257 &&
          !c->model.tokenizer_file[0]);
}

/* Read the whole file `path` into a malloc'd string (NULL when it cannot be read). */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[4096];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = 2 * (len + n + 1);
            char *grown = realloc(buf, cap);
            if (!grown) { free(buf); fclose(f); return NULL; }
            buf = grown;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (!buf) buf = calloc(1, 1);
    else buf[len] = '\0';
    return buf;
}

/* The text of `section = { ... };` in a libconfig file (from its opening line to the
 * first "};" at the start of a line), or NULL. */
static const char *cfg_section(const char *text, const char *section, size_t *len)
{
    char head[64];
    snprintf(head, sizeof head, "\n%s = {", section);
    const char *start = strstr(text, head);
    if (!start) return NULL;
    const char *end = strstr(start, "\n};");
    if (!end) return NULL;
    *len = (size_t)(end - start);
    return start;
}

/* In a section's text, the line giving `key`: "  key = ...;" or, commented out,
 * "  # key = ...;". Returns the start of the value (after "= ") and sets *commented. */
static const char *cfg_key_line(const char *sec, size_t sec_len, const char *key,
                                bool *commented)
{
    size_t klen = strlen(key);
    for (const char *line = sec; line && line < sec + sec_len; line = strchr(line, '\n')) {
        line++; /* past the '\n' */
        const char *p = line;
        while (*p == ' ') p++;
        bool hash = *p == '#';
        if (hash) {
            p++;
            while (*p == ' ') p++;
        }
        if (strncmp(p, key, klen) != 0) continue;
        p += klen;
        while (*p == ' ') p++;
        if (*p != '=') continue;
        p++;
        while (*p == ' ') p++;
        *commented = hash;
        return p;
    }
    return NULL;
}

/* The overrides under which a key that matters only beside others' values (config_inert.c
 * refuses it given elsewhere) is read: tiny.cfg's commented value is checked there. */
#define LLAMA_OV "model.arch=\"llama\""
static const struct {
    const char *key;
    const char *ctx[5];
} INERT_CONTEXT[] = {
    {"model.rope_low_freq_factor", {LLAMA_OV, "model.rope_scaling=8"}},
    {"model.rope_high_freq_factor", {LLAMA_OV, "model.rope_scaling=8"}},
    {"model.rope_original_context", {LLAMA_OV, "model.rope_scaling=8"}},
    {"model.rope_type", {LLAMA_OV, "model.rope_scaling=8"}},
    {"model.rope_beta_fast", {LLAMA_OV, "model.rope_type=\"yarn\"", "model.rope_scaling=4"}},
    {"model.rope_beta_slow", {LLAMA_OV, "model.rope_type=\"yarn\"", "model.rope_scaling=4"}},
    {"model.rope_mscale_all_dim", {LLAMA_OV, "model.rope_type=\"yarn\"", "model.rope_scaling=4"}},
    {"model.rope_mscale",
     {LLAMA_OV, "model.rope_type=\"yarn\"", "model.rope_scaling=4", "model.rope_mscale_all_dim=1"}},
    {"train.mtp_loss", {LLAMA_OV, "model.mtp_layers=1"}},
    {"train.muon_momentum", {"train.optimizer=\"muon\""}},
    {"train.muon_nesterov", {"train.optimizer=\"muon\""}},
    {"train.muon_ns_steps", {"train.optimizer=\"muon\""}},
    {"train.muon_coefficients", {"train.optimizer=\"muon\""}},
    {"train.muon_scale", {"train.optimizer=\"muon\""}},
    {"train.spike_window", {"train.skip_spikes=2"}},
    {"log.straggler_threshold", {"log.straggler_every=10"}},
    /* -1 means the tokenizer's document token: bare ids have none. */
    {"data.document_token",
     {"data.document_mask=true", "model.tokenizer=\"gpt2\"", "model.vocab_size=50304"}},
    {"data.hellaswag_items",
     {"data.hellaswag=\"h.jsonl\"", "model.tokenizer=\"gpt2\"", "model.vocab_size=50304"}},
};
#undef LLAMA_OV

static bool has_context(const char *key)
{
    for (size_t i = 0; i < sizeof INERT_CONTEXT / sizeof INERT_CONTEXT[0]; i++)
        if (!strcmp(INERT_CONTEXT[i].key, key)) return true;
    return false;
}

/* The effective config's JSON of tiny.cfg under key's context (INERT_CONTEXT) and then
 * `ov` when given; NULL (and a failed check) when it does not load. */
static char *json_in_context(const char *path, const char *key, const char *ov)
{
    const char *ovs[8];
    int n = 0;
    for (size_t i = 0; i < sizeof INERT_CONTEXT / sizeof INERT_CONTEXT[0]; i++)
        if (!strcmp(INERT_CONTEXT[i].key, key))
            for (int c = 0; c < 5 && INERT_CONTEXT[i].ctx[c]; c++)
                ovs[n++] = INERT_CONTEXT[i].ctx[c];
    if (ov) ovs[n++] = ov;
    ts_status st = ts_config_load(&g_cfg, path, ovs, n, 1);
    CHECKF(st == TS_OK, "configs/tiny.cfg's commented %s (%d overrides): %s", key, n,
           ts_error_message());
    return st == TS_OK ? ts_config_to_json(&g_cfg) : NULL;
}

/* configs/tiny.cfg says it lists every key, the commented ones at their defaults, and
 * docs/CONTRACT.md's "Config" tables document every key: both checked against the key
 * table itself (every key the effective config's JSON holds). A commented key's value
 * is checked by setting it: the effective config must not change. */
static void test_config_every_key_listed(void)
{
    const char *src = getenv("TS_SOURCE_DIR");
    if (!src) src = ".";
    char path[1024], contract_path[1024];
    snprintf(path, sizeof path, "%s/configs/tiny.cfg", src);
    snprintf(contract_path, sizeof contract_path, "%s/docs/CONTRACT.md", src);
    char *tiny = read_text(path), *contract = read_text(contract_path);
    CHECKF(tiny != NULL, "cannot read %s", path);
    CHECKF(contract != NULL, "cannot read %s", contract_path);
    const char *config_doc = contract ? strstr(contract, "\n## Config\n") : NULL;
    CHECKF(config_doc != NULL, "docs/CONTRACT.md has no \"## Config\" section");

    ts_status st = ts_config_load(&g_cfg, path, NULL, 0, 1);
    CHECKF(st == TS_OK, "%s", ts_error_message());
    char *plain = ts_config_to_json(&g_cfg);
    json_error_t err;
    json_t *j = json_loads(plain, 0, &err);
    CHECKF(j != NULL, "%s", err.text);
    if (!tiny || !config_doc || !j) goto out;

    int n_keys = 0, n_commented = 0;
    const char *section;
    json_t *keys;
    json_object_foreach(j, section, keys) {
        size_t sec_len = 0, doc_len = 0;
        const char *sec = cfg_section(tiny, section, &sec_len);
        CHECKF(sec != NULL, "configs/tiny.cfg has no section '%s'", section);
        char head[64];
        snprintf(head, sizeof head, "\n### %s\n", section);
        const char *doc = strstr(config_doc, head);
        CHECKF(doc != NULL, "docs/CONTRACT.md's Config has no '### %s'", section);
        if (doc) {
            const char *next = strstr(doc + strlen(head), "\n### ");
            const char *next2 = strstr(doc + strlen(head), "\n## ");
            if (!next || (next2 && next2 < next)) next = next2;
            doc_len = next ? (size_t)(next - doc) : strlen(doc);
        }
        const char *key;
        json_t *value;
        json_object_foreach(keys, key, value) {
            (void)value;
            n_keys++;
            char quoted[96];
            snprintf(quoted, sizeof quoted, "`%s`", key);
            const char *hit = doc ? strstr(doc, quoted) : NULL;
            bool documented = hit && hit < doc + doc_len;
            CHECKF(documented, "docs/CONTRACT.md's \"### %s\" does not document %s.%s",
                   section, section, key);
            if (!sec) continue;
            bool commented = false;
            const char *v = cfg_key_line(sec, sec_len, key, &commented);
            CHECKF(v != NULL, "configs/tiny.cfg does not list %s.%s", section, key);
            if (!v || !commented) continue;
            /* "# key = VALUE;  # ...": VALUE set by --set must change nothing */
            const char *semi = strchr(v, ';'), *eol = strchr(v, '\n');
            CHECKF(semi && (!eol || semi < eol), "configs/tiny.cfg: %s.%s has no ';'",
                   section, key);
            if (!semi || (eol && eol < semi)) continue;
            char ov[512], full[128];
            snprintf(ov, sizeof ov, "%s.%s=%.*s", section, key, (int)(semi - v), v);
            snprintf(full, sizeof full, "%s.%s", section, key);
            /* Against tiny.cfg itself, or where the key is read (INERT_CONTEXT). */
            char *base = has_context(full) ? json_in_context(path, full, NULL) : strdup(plain);
            char *set = json_in_context(path, full, ov);
            if (base && set) {
                CHECKF(strcmp(set, base) == 0,
                       "configs/tiny.cfg's commented %s is not the key's default there", ov);
                n_commented++;
            }
            free(base);
            free(set);
        }
    }
    CHECKF(n_keys >= 60 && n_commented >= 30, "%d keys, %d commented", n_keys, n_commented);
out:
    json_decref(j);
    free(plain);
    free(tiny);
    free(contract);
}

/* A small llama for the DeepSeek-V3 keys' rules below. */
static const char *const SMALL_LLAMA =
    "model = { arch = \"llama\"; n_layer = 2; n_head = 4; n_embd = 32; vocab_size = 64;\n"
    "          seq_len = 16; };\n";

/* Multi-token prediction's rules (config_mtp.c): a llama's modules load, with their
 * weight; gpt2 and a depth past the window are errors naming the keys. */
static void test_config_mtp(void)
{
    const char *ok[] = {"model.mtp_layers=2", "train.mtp_loss=0.3"};
    ts_error_clear();
    CHECKF(load_ov(SMALL_LLAMA, ok, 2, 0) == TS_OK, "%s", ts_error_message());
    CHECK(g_cfg.model.mtp_layers == 2 && g_cfg.train.mtp_loss == 0.3);
    EXPECT_ERR(FULL, "model.mtp_layers=1", "'model.mtp_layers' = 1", "llama family", "gpt2");
    EXPECT_ERR(SMALL_LLAMA, "model.mtp_layers=16", "'model.mtp_layers' = 16",
               "model.seq_len = 16");
}

/* MLA and YaRN's rules (config_mla.c): model.rope_type = "yarn" needs its factor (else
 * the key would change nothing), an MLA key needs kv_lora_rank, the rope head is even. */
static void test_config_mla_rules(void)
{
    const char *yarn[] = {"model.rope_type=\"yarn\"", "model.rope_scaling=4.0"};
    ts_error_clear();
    CHECKF(load_ov(SMALL_LLAMA, yarn, 2, 0) == TS_OK, "%s", ts_error_message());
    EXPECT_ERR(SMALL_LLAMA, "model.rope_type=\"yarn\"", "'model.rope_type' = \"yarn\"",
               "model.rope_scaling");
    EXPECT_ERR(SMALL_LLAMA, "model.v_head_dim=8", "'model.v_head_dim' = 8",
               "model.kv_lora_rank > 0");
    const char *odd[] = {"model.kv_lora_rank=16", "model.qk_rope_head_dim=7",
                         "model.v_head_dim=8"};
    ts_error_clear();
    CHECK(load_ov(SMALL_LLAMA, odd, 3, 0) == TS_ERR && msg_has("'model.qk_rope_head_dim' = 7"));
}

/* Keys that matter only beside another key's value (config_inert.c): given while the rest
 * of the config leaves them inert, each is refused naming it and what it needs; the same
 * key where it matters loads. Their defaults are non-zero, so these load without the rule. */
static void test_config_inert_keys(void)
{
    const char *yarn_ok[] = {"model.rope_type=\"yarn\"", "model.rope_scaling=4.0",
                             "model.rope_beta_fast=16", "model.rope_beta_slow=2",
                             "model.rope_mscale=0.7", "model.rope_mscale_all_dim=1.0",
                             "model.rope_original_context=8"};
    ts_error_clear();
    CHECKF(load_ov(SMALL_LLAMA, yarn_ok, 7, 0) == TS_OK, "%s", ts_error_message());
    const char *llama3_ok[] = {"model.rope_scaling=8.0", "model.rope_type=\"llama3\"",
                               "model.rope_low_freq_factor=2", "model.rope_high_freq_factor=6",
                               "model.rope_original_context=8"};
    ts_error_clear();
    CHECKF(load_ov(SMALL_LLAMA, llama3_ok, 5, 0) == TS_OK, "%s", ts_error_message());
    const char *mtp_ok[] = {"model.mtp_layers=1", "train.mtp_loss=0.3"};
    ts_error_clear();
    CHECKF(load_ov(SMALL_LLAMA, mtp_ok, 2, 0) == TS_OK, "%s", ts_error_message());

    /* YaRN's keys without rope_type = "yarn" (none, or Llama 3.1's scaling). */
    EXPECT_ERR(SMALL_LLAMA, "model.rope_beta_fast=16", "'model.rope_beta_fast' = 16", "YaRN's",
               "model.rope_type = \"yarn\"", "rope_type = \"llama3\", model.rope_scaling = 0");
    EXPECT_ERR(SMALL_LLAMA, "model.rope_beta_slow=2", "'model.rope_beta_slow' = 2",
               "model.rope_type = \"yarn\"");
    EXPECT_ERR(SMALL_LLAMA, "model.rope_mscale=0.7", "'model.rope_mscale' = 0.7",
               "model.rope_type = \"yarn\"");
    const char *l3_yarn_key[] = {"model.rope_scaling=8.0", "model.rope_mscale_all_dim=1.0"};
    ts_error_clear();
    CHECK(load_ov(SMALL_LLAMA, l3_yarn_key, 2, 0) == TS_ERR &&
          msg_has("'model.rope_mscale_all_dim' = 1") && msg_has("model.rope_scaling = 8"));
    /* mscale without mscale_all_dim: YaRN reads it only beside that. */
    const char *lone_mscale[] = {"model.rope_type=\"yarn\"", "model.rope_scaling=4.0",
                                 "model.rope_mscale=0.7"};
    ts_error_clear();
    CHECK(load_ov(SMALL_LLAMA, lone_mscale, 3, 0) == TS_ERR &&
          msg_has("'model.rope_mscale' = 0.7") && msg_has("model.rope_mscale_all_dim > 0"));
    /* Llama 3.1's keys without its scaling, or under YaRN. */
    EXPECT_ERR(SMALL_LLAMA, "model.rope_low_freq_factor=2", "'model.rope_low_freq_factor' = 2",
               "model.rope_scaling > 0");
    EXPECT_ERR(SMALL_LLAMA, "model.rope_high_freq_factor=6", "'model.rope_high_freq_factor' = 6",
               "model.rope_scaling > 0");
    const char *yarn_l3_key[] = {"model.rope_type=\"yarn\"", "model.rope_scaling=4.0",
                                 "model.rope_high_freq_factor=6"};
    ts_error_clear();
    CHECK(load_ov(SMALL_LLAMA, yarn_l3_key, 3, 0) == TS_ERR &&
          msg_has("'model.rope_high_freq_factor' = 6") && msg_has("rope_type = \"llama3\""));
    EXPECT_ERR(SMALL_LLAMA, "model.rope_original_context=8", "'model.rope_original_context' = 8",
               "model.rope_scaling > 0");
    EXPECT_ERR(SMALL_LLAMA, "model.rope_type=\"llama3\"", "'model.rope_type' = \"llama3\"",
               "model.rope_scaling > 0");
    /* In the file as in --set. */
    EXPECT_ERR("model = { arch = \"llama\"; rope_low_freq_factor = 1.0; };\n", NULL,
               "'model.rope_low_freq_factor' = 1", "model.rope_scaling > 0");
    /* Multi-token prediction's weight without its modules. */
    EXPECT_ERR(SMALL_LLAMA, "train.mtp_loss=0.1", "'train.mtp_loss' = 0.1",
               "model.mtp_layers > 0", "model.mtp_layers = 0");
    /* The straggler report's threshold without the report. */
    EXPECT_ERR(SMALL_LLAMA, "log.straggler_threshold=0.5", "'log.straggler_threshold' = 0.5",
               "log.straggler_every > 0", "log.straggler_every = 0");
    const char *straggler_ok[] = {"log.straggler_every=10", "log.straggler_threshold=0.5"};
    ts_error_clear();
    CHECKF(load_ov(SMALL_LLAMA, straggler_ok, 2, 0) == TS_OK, "%s", ts_error_message());
}

/* train.batch_rampup: Megatron's step_batch_size_schedule strings (suffixes, tokens or
 * samples, sorting, commas), its errors, the config's rules naming the entry, and the
 * samples each step consumes. */
static void test_config_batch_rampup(void)
{
    ts_batch_rampup r;
    CHECK(ts_batch_rampup_parse("", 32, &r) == TS_OK && r.n == 0);
    CHECK(ts_batch_rampup_parse("  ", 32, &r) == TS_OK && r.n == 0);
    /* Tokens by default (Megatron's trainer passes seq_length): floor(tokens / seq_len). */
    CHECK(ts_batch_rampup_parse("0:768 250B:1536 500b:3072 750B:6144", 4096, &r) == TS_OK);
    CHECK(r.n == 4 && r.tokens && r.at[0] == 0 && r.at[1] == 61035156 && r.at[2] == 122070312 &&
          r.at[3] == 183105468 && r.batch[3] == 6144);
    /* Samples, commas, decimals with suffixes (int(float(v) * 1e3)), a K batch, and
     * entries out of order (sorted). */
    CHECK(ts_batch_rampup_parse("samples 1.5K:16,0:4  2k:1K", 32, &r) == TS_OK);
    CHECK(r.n == 3 && !r.tokens && r.at[0] == 0 && r.batch[0] == 4 && r.at[1] == 1500 &&
          r.batch[1] == 16 && r.at[2] == 2000 && r.batch[2] == 1000 && !strcmp(r.text[1], "1.5K:16"));
    CHECK(ts_batch_rampup_parse("tokens 0:4 100:8", 32, &r) == TS_OK && r.at[1] == 3);
    /* The batch in force and the samples consumed: 4,4 (0..8), 8,8 (8..24), 16... */
    CHECK(ts_batch_rampup_parse("samples 0:4 8:8 24:16", 32, &r) == TS_OK);
    const int64_t want[] = {0, 4, 8, 16, 24, 40, 56};
    for (int s = 0; s < 7; s++)
        CHECKF(ts_batch_rampup_consumed(&r, 16, 0, 0, s) == want[s], "step %d: %lld", s,
               (long long)ts_batch_rampup_consumed(&r, 16, 0, 0, s));
    CHECK(ts_batch_rampup_batch(&r, 7, 16) == 4 && ts_batch_rampup_batch(&r, 8, 16) == 8 &&
          ts_batch_rampup_batch(&r, 23, 16) == 8 && ts_batch_rampup_batch(&r, 1000, 16) == 16);
    /* A threshold crossed inside a step: the batch changes at the next step (Megatron). */
    CHECK(ts_batch_rampup_parse("samples 0:3 7:8", 32, &r) == TS_OK);
    CHECK(ts_batch_rampup_consumed(&r, 8, 0, 0, 3) == 9 && ts_batch_rampup_consumed(&r, 8, 0, 0, 4) == 17);
    /* From a resumed position (step 2 after 6 sequences). */
    CHECK(ts_batch_rampup_consumed(&r, 8, 2, 6, 4) == 17);
    ts_batch_rampup off;
    CHECK(ts_batch_rampup_parse("", 32, &off) == TS_OK);
    CHECK(ts_batch_rampup_consumed(&off, 16, 0, 0, 5) == 80 && ts_batch_rampup_batch(&off, 3, 16) == 16);

    /* Parse errors, each naming the entry. */
    const struct { const char *spec, *a, *b; } bad[] = {
        {"0:4 8", "invalid entry \"8\"", "THRESHOLD:BATCH"},
        {"0:4 x:8", "\"x:8\"", "not a number"},
        {"0:4 1Q:8", "\"1Q:8\"", "not a number"},
        {"0:4 K:8", "\"K:8\"", "not a number"},
        {"0:4 0x10:8", "\"0x10:8\"", "not a number"},
        {"0:4 inf:8", "\"inf:8\"", "not a number"},
        {"0:4 -5:8", "\"-5:8\"", "out of range"},
        {"0:4 64:0", "\"64:0\"", "positive"},
        {"0:4 64:", "\"64:\"", "no batch"},
        {"64:4 128:8", "\"64:4\"", "threshold 0"},
        {"samples 0:4 8:8 8:16", "\"8:8\" and \"8:16\"", "strictly increasing"},
        {"0:4 10:8 40:16", "\"0:4\" and \"10:8\"", "converted from tokens"},
        {"samples", "no \"THRESHOLD:BATCH\"", "samples"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ts_error_clear();
        CHECKF(ts_batch_rampup_parse(bad[i].spec, 32, &r) == TS_ERR, "accepted \"%s\"", bad[i].spec);
        CHECKF(msg_has("train.batch_rampup") && msg_has(bad[i].a) && msg_has(bad[i].b),
               "\"%s\": %s", bad[i].spec, ts_error_message());
    }

    /* The config's rules (dp 2 x micro_batch 2 = 4 sequences a micro-batch round). */
    const char *base = "model = { seq_len = 32; }; parallel = { dp = 2; micro_batch = 2; }; "
                       "train = { global_batch = 16; };\n";
    const char *ok[] = {"train.batch_rampup=\"samples 0:4 64:8 128:16\"",
                        "train.batch_rampup=\"0:8 1K:16\""};
    for (int i = 0; i < 2; i++)
        CHECKF(load_ov(base, &ok[i], 1, 0) == TS_OK, "%s: %s", ok[i], ts_error_message());
    CHECK(!strcmp(g_cfg.train.batch_rampup, "0:8 1K:16"));
    EXPECT_ERR(base, "train.batch_rampup=\"samples 0:4 64:8\"", "last entry \"64:8\"",
               "train.global_batch = 16");
    EXPECT_ERR(base, "train.batch_rampup=\"samples 0:4 64:6 128:16\"", "entry \"64:6\"",
               "2 * 2 = 4", "use 4 or 8");
    EXPECT_ERR(base, "train.batch_rampup=\"samples 0:4 64:32 128:16\"", "entry \"64:32\"",
               "above train.global_batch = 16");
    EXPECT_ERR(base, "train.batch_rampup=\"0:4,\"", "last entry \"0:4\"");
    EXPECT_ERR("parallel = { schedule = \"my.csv\"; micro_batch = 4; };\n",
               "train.batch_rampup=\"samples 0:4 64:16\"", "CSV schedule",
               "fixed number of micro-batches");
}

/* data.document_mask and data.document_token (packed documents). */
static void test_config_documents(void)
{
    /* Bare ids: the token must be given; in the vocabulary. */
    EXPECT_ERR(SMALL_LLAMA, "data.document_mask=true", "data.document_mask = true",
               "data.document_token");
    const char *ok[] = {"data.document_mask=true", "data.document_token=3"};
    ts_error_clear();
    CHECKF(load_ov(SMALL_LLAMA, ok, 2, 0) == TS_OK, "%s", ts_error_message());
    CHECK(g_cfg.data.document_mask && ts_config_document_token(&g_cfg) == 3);
    const char *big[] = {"data.document_mask=true", "data.document_token=100000"};
    ts_error_clear();
    CHECK(load_ov(SMALL_LLAMA, big, 2, 0) == TS_ERR && msg_has("data.document_token = 100000") &&
          msg_has("model.vocab_size"));
    /* Given without document_mask: it would be ignored. */
    EXPECT_ERR(SMALL_LLAMA, "data.document_token=3", "'data.document_token' = 3",
               "data.document_mask = true");
    /* -1: the tokenizer's document token, tokenizer/encoding.c's (what tessera data puts
     * before each document). */
    ts_config c;
    ts_config_defaults(&c);
    snprintf(c.model.tokenizer, sizeof c.model.tokenizer, "gpt2");
    CHECK(ts_config_document_token(&c) == 50256);
    snprintf(c.model.tokenizer, sizeof c.model.tokenizer, "llama3");
    CHECK(ts_config_document_token(&c) == 128000);
    c.model.tokenizer[0] = '\0';
    CHECK(ts_config_document_token(&c) == -1);
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_test_config");
    test_config_documents();
    test_config_full();
    test_config_defaults();
    test_config_overrides();
    test_config_key_errors();
    test_config_type_errors();
    test_config_range_errors();
    test_config_enum_errors();
    test_config_llama();
    test_config_tokenizer();
    test_config_syntax_error();
    test_config_read_once();
    test_config_relations();
    test_config_json();
    test_config_data_blend();
    test_config_shipped_files();
    test_config_every_key_listed();
    test_config_mtp();
    test_config_mla_rules();
    test_config_inert_keys();
    test_config_batch_rampup();

    ts_test_remove_dir(g_dir);
    return ts_test_report();
}
