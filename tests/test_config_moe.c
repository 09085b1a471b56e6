/* The Mixture-of-Experts config keys (docs/CONTRACT.md "Config"): read, defaulted, and each
 * rule between them a clear error naming the keys (issue 39's "Hostile" list among them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/layout.h"
#include "config/config.h"
#include "test_util.h"

static char g_dir[256];
static ts_config g_cfg;

static ts_status load_ov(const char *text, const char *const *ov, int n)
{
    const char *path = ts_test_write_file(g_dir, "moe.cfg", text);
    return ts_config_load(&g_cfg, path, ov, n, 0);
}

static bool msg_has(const char *needle) { return strstr(ts_error_message(), needle) != NULL; }

/* A llama MoE model: 4 blocks, 8 experts top-2 of width 32. */
static const char *MOE =
    "model = { arch = \"llama\"; n_layer = 4; n_head = 4; n_embd = 64; vocab_size = 256;\n"
    "          seq_len = 16; moe_experts = 8; moe_top_k = 2; moe_ffn_hidden = 32; };\n";

/* `text` with the overrides `ov` (NULL-terminated) fails with every fragment. */
#define EXPECT_ERR(text, ovs, ...)                                                        \
    do {                                                                                \
        const char *const *ov_ = ovs;                                                   \
        int n_ = 0;                                                                     \
        while (ov_ && ov_[n_]) n_++;                                                    \
        ts_error_clear();                                                               \
        ts_status st_ = load_ov(text, ov_, n_);                                         \
        CHECKF(st_ == TS_ERR, "expected an error for %s", ov_ ? ov_[0] : #text);        \
        const char *frags_[] = { __VA_ARGS__ };                                         \
        for (size_t i_ = 0; i_ < sizeof frags_ / sizeof frags_[0]; i_++)                \
            CHECKF(msg_has(frags_[i_]), "message lacks '%s': %s", frags_[i_],           \
                   ts_error_message());                                                 \
    } while (0)
#define OV(...) ((const char *const[]){ __VA_ARGS__, NULL })

static void test_moe_defaults(void)
{
    ts_config_defaults(&g_cfg);
    const ts_model_config *m = &g_cfg.model;
    CHECK(m->moe_experts == 0 && m->moe_top_k == 2 && m->moe_ffn_hidden == 0);
    CHECK(m->moe_shared_experts == 0 && strcmp(m->moe_router, "softmax") == 0);
    CHECK(m->moe_norm_topk && m->moe_route_scale == 1.0 && m->moe_groups == 1);
    CHECK(m->moe_topk_groups == 1 && m->moe_first_dense == 0 && m->moe_every == 1);
    CHECK(!m->qk_norm && g_cfg.parallel.ep == 1 && g_cfg.parallel.etp == 1);
    CHECK(g_cfg.parallel.ep_overlap); /* it changes no bits */
    CHECK(g_cfg.train.moe_aux_loss == 0 && g_cfg.train.moe_z_loss == 0);
    CHECK(g_cfg.train.moe_bias_rate == 0);
    CHECK(g_cfg.log.moe_every == 0); /* the tokens per expert after the last step only */
}

static void test_moe_block_rule(void)
{
    ts_model_config m;
    memset(&m, 0, sizeof m);
    CHECK(!ts_model_block_is_moe(&m, 0)); /* dense */
    m.moe_experts = 4;
    m.moe_every = 1;
    CHECK(ts_model_block_is_moe(&m, 0) && ts_model_block_is_moe(&m, 3));
    m.moe_every = 2; /* Qwen's decoder_sparse_step 2: blocks 1, 3, ... */
    CHECK(!ts_model_block_is_moe(&m, 0) && ts_model_block_is_moe(&m, 1));
    CHECK(!ts_model_block_is_moe(&m, 2) && ts_model_block_is_moe(&m, 3));
    m.moe_every = 1;
    m.moe_first_dense = 2; /* DeepSeek's first_k_dense_replace 2 */
    CHECK(!ts_model_block_is_moe(&m, 1) && ts_model_block_is_moe(&m, 2));
}

static void test_moe_dense_refuses_keys(void)
{
    const char *dense = "model = { arch = \"llama\"; };\n";
    EXPECT_ERR(dense, OV("model.moe_top_k=4"), "model.moe_top_k is set",
               "model.moe_experts = 0");
    EXPECT_ERR(dense, OV("model.moe_router=sigmoid"), "model.moe_router is set");
    EXPECT_ERR(dense, OV("model.moe_every=2"), "model.moe_every is set");
    EXPECT_ERR(dense, OV("train.moe_aux_loss=0.001"), "train.moe_aux_loss is set");
    EXPECT_ERR(dense, OV("train.moe_bias_rate=0.001"), "train.moe_bias_rate is set");
    EXPECT_ERR(dense, OV("log.moe_every=10"), "log.moe_every is set");
    EXPECT_ERR(dense, OV("parallel.ep=2"), "parallel.ep is set");
    EXPECT_ERR(dense, OV("parallel.ep_overlap=false"), "parallel.ep_overlap is set");
    /* On an MoE either value, with or without ep (nothing to overlap on one ep rank). */
    for (int i = 0; i < 2; i++) {
        ts_error_clear();
        CHECKF(load_ov(MOE, i ? OV("parallel.ep_overlap=false")
                              : OV("parallel.ep_overlap=false", "parallel.dp=2", "parallel.ep=2"),
                       i ? 1 : 3) == TS_OK && !g_cfg.parallel.ep_overlap,
               "%s", ts_error_message());
    }
    /* The keys at their defaults are no setting. */
    ts_error_clear();
    CHECKF(load_ov(dense, OV("model.moe_top_k=2", "model.moe_router=softmax"), 2) == TS_OK,
           "%s", ts_error_message());
}

static void test_moe_routing_errors(void)
{
    EXPECT_ERR(MOE, OV("model.arch=gpt2", "model.n_kv_head=0", "model.rope_theta=0"),
               "model.moe_experts = 8", "\"gpt2\"", "llama");
    EXPECT_ERR(MOE, OV("model.moe_top_k=9"), "model.moe_top_k = 9", "model.moe_experts = 8");
    EXPECT_ERR(MOE, OV("model.moe_top_k=0"), "model.moe_top_k");
    EXPECT_ERR(MOE, OV("model.moe_experts=2048"), "model.moe_experts = 2048", "1024");
    EXPECT_ERR(MOE, OV("model.moe_ffn_hidden=0"), "model.moe_ffn_hidden >= 1");
    EXPECT_ERR(MOE, OV("model.moe_groups=3"), "model.moe_experts = 8",
               "model.moe_groups = 3");
    EXPECT_ERR(MOE, OV("model.moe_groups=2", "model.moe_topk_groups=4"),
               "model.moe_topk_groups = 4", "model.moe_groups = 2");
    EXPECT_ERR(MOE, OV("model.moe_top_k=3", "model.moe_groups=4", "model.moe_topk_groups=2"),
               "model.moe_top_k = 3", "model.moe_topk_groups = 2");
    /* 8 experts in 4 groups of 2; top-6 from 2 groups would need 3 of each. */
    EXPECT_ERR(MOE, OV("model.moe_top_k=6", "model.moe_groups=4", "model.moe_topk_groups=2"),
               "3 experts per group", "= 2 experts a group has");
    EXPECT_ERR(MOE, OV("model.moe_router=tanh"), "model.moe_router", "\"sigmoid\"");
    EXPECT_ERR(MOE, OV("model.moe_route_scale=0"), "model.moe_route_scale");
    EXPECT_ERR(MOE, OV("model.moe_first_dense=4"), "no block is an MoE block",
               "model.moe_first_dense = 4");
    EXPECT_ERR(MOE, OV("model.moe_every=5"), "no block is an MoE block",
               "model.moe_every = 5");
    EXPECT_ERR(MOE, OV("train.moe_z_loss=-1"), "train.moe_z_loss");
}

static void test_moe_expert_parallel_errors(void)
{
    EXPECT_ERR(MOE, OV("parallel.ep=3"), "model.moe_experts = 8", "parallel.ep = 3");
    EXPECT_ERR(MOE, OV("parallel.ep=2"), "parallel.ep * parallel.etp = 2 * 1",
               "tp * parallel.cp * parallel.dp");
    /* Built: ep and etp over any of a stage's tp, cp and dp ranks, any pp and ZeRO
     * level, checkpoints and model.init; the rest refused with the keys named. */
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("parallel.ep=2", "parallel.dp=2", "parallel.micro_batch=1",
                           "train.global_batch=2", "parallel.zero=3"), 5) == TS_OK,
           "%s", ts_error_message());
    CHECKF(load_ov(MOE,
                   OV("parallel.ep=2", "parallel.dp=2", "parallel.pp=2", "parallel.micro_batch=1",
                      "train.global_batch=2", "parallel.schedule=dualpipe-v",
                      "parallel.virtual_stages=2"),
                   7) == TS_OK,
           "%s", ts_error_message());
    CHECKF(load_ov(MOE, OV("parallel.ep=4", "parallel.tp=2", "parallel.cp=2"), 3) == TS_OK,
           "%s", ts_error_message());
    /* The balance loss under cp and sp: each sequence's counts summed over its ranks. */
    CHECKF(load_ov(MOE, OV("parallel.ep=4", "parallel.tp=2", "parallel.cp=2",
                           "train.moe_aux_loss=0.01"), 4) == TS_OK,
           "%s", ts_error_message());
    CHECKF(load_ov(MOE, OV("parallel.ep=2", "parallel.tp=2", "parallel.sequence_parallel=true"),
                   3) == TS_OK,
           "%s", ts_error_message());
    CHECKF(load_ov(MOE, OV("parallel.ep=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                           "train.moe_aux_loss=0.01"), 4) == TS_OK,
           "%s", ts_error_message());
    /* etp over the tp ranks (each brings its share of the replicated rows, or under sp
     * its own), with ep over dp too; F must still split evenly. */
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("parallel.etp=2", "parallel.tp=2"), 2) == TS_OK, "%s",
           ts_error_message());
    CHECKF(load_ov(MOE, OV("parallel.etp=2", "parallel.tp=2", "parallel.sequence_parallel=true"),
                   3) == TS_OK,
           "%s", ts_error_message());
    CHECKF(load_ov(MOE, OV("parallel.etp=2", "parallel.ep=2", "parallel.tp=2", "parallel.dp=2",
                           "parallel.micro_batch=1", "train.global_batch=2"), 6) == TS_OK,
           "%s", ts_error_message());
    EXPECT_ERR(MOE, OV("parallel.etp=3", "parallel.tp=2", "parallel.dp=3",
                       "parallel.micro_batch=1", "train.global_batch=3"),
               "model.moe_ffn_hidden", "parallel.etp = 3");
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("parallel.ep=2", "parallel.dp=2", "parallel.micro_batch=1",
                           "train.global_batch=2", "checkpoint.dir=\"ck\""), 5) == TS_OK,
           "%s", ts_error_message());
    /* Expert tensor parallelism over cp and dp, with and without ep, any pp; F must split
     * evenly. */
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("parallel.etp=2", "parallel.ep=2", "parallel.dp=4",
                           "parallel.micro_batch=1", "train.global_batch=4"), 5) == TS_OK,
           "%s", ts_error_message());
    CHECKF(load_ov(MOE, OV("parallel.etp=2", "parallel.pp=2", "parallel.cp=2",
                           "parallel.schedule=zb-v", "parallel.virtual_stages=2",
                           "train.moe_aux_loss=0"), 6) == TS_OK,
           "%s", ts_error_message());
    EXPECT_ERR(MOE, OV("parallel.etp=3", "parallel.dp=3", "parallel.micro_batch=1",
                       "train.global_batch=3"),
               "model.moe_ffn_hidden", "parallel.etp = 3");
    /* ...with checkpoints and model.init (each etp slice written by its edp group). */
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("parallel.etp=2", "parallel.dp=2", "parallel.micro_batch=1",
                           "train.global_batch=2", "model.init=\"hf\"",
                           "checkpoint.dir=\"ck\""), 6) == TS_OK,
           "%s", ts_error_message());
}

/* One tensor- and context-parallel rank, fp32, no recompute, no zero-bubble split. */
static void test_moe_unbuilt(void)
{
    /* Sequence parallelism: each tp rank routes its rows, the balance loss's counts summed
     * over tp; tp_overlap's sub-batches are not built with it. */
    CHECKF(load_ov(MOE, OV("parallel.tp=2", "parallel.sequence_parallel=true",
                           "train.moe_z_loss=0.001", "train.moe_bias_rate=0.001",
                           "train.moe_aux_loss=0.01"),
                   5) == TS_OK,
           "%s", ts_error_message());
    EXPECT_ERR(MOE, OV("parallel.tp=2", "parallel.sequence_parallel=true",
                       "parallel.tp_overlap=2"),
               "parallel.tp_overlap > 1", "not built yet");
    EXPECT_ERR(MOE, OV("parallel.tp=2", "parallel.tp_overlap=2"), "parallel.tp_overlap > 1",
               "not built yet");
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("parallel.cp=2", "train.moe_aux_loss=0.01"), 2) == TS_OK, "%s",
           ts_error_message());
    /* Built: data and pipeline parallelism, any schedule and recompute, bf16. */
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("train.precision=bf16", "parallel.dp=2", "parallel.ep=2"), 3) ==
               TS_OK,
           "%s", ts_error_message());
    ts_error_clear();
    CHECKF(load_ov(MOE, OV("parallel.dp=2", "parallel.pp=2", "parallel.schedule=zb-h1",
                           "parallel.recompute=full", "parallel.tp=2"), 5) == TS_OK,
           "%s", ts_error_message());
}

static void test_moe_qk_norm(void)
{
    EXPECT_ERR("model = { qk_norm = true; };\n", NULL, "model.qk_norm", "llama");
    ts_error_clear();
    CHECKF(load_ov("model = { arch = \"llama\"; qk_norm = true; };\n", OV("parallel.tp=2"),
                   1) == TS_OK,
           "%s", ts_error_message());
    CHECK(g_cfg.model.qk_norm);
}

/* model.init's config.json of the MoE families fills the MoE keys, and refuses a config
 * that disagrees, naming both keys (issue 39's "Hostile": an expert count). */
static void test_moe_hf_config(void)
{
    char dir[300], text[1024];
    snprintf(dir, sizeof dir, "%s", g_dir);
    ts_test_write_file(dir, "config.json",
                       "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, "
                       "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"intermediate_size\": 96, "
                       "\"vocab_size\": 256, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, "
                       "\"num_experts\": 8, \"num_experts_per_tok\": 2, "
                       "\"moe_intermediate_size\": 32, \"norm_topk_prob\": true, "
                       "\"decoder_sparse_step\": 2, \"mlp_only_layers\": [0]}");
    snprintf(text, sizeof text, "model = { seq_len = 16; init = \"%s\"; };\n", dir);
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    const ts_model_config *m = &g_cfg.model;
    CHECK(strcmp(m->arch, "llama") == 0 && m->qk_norm && m->moe_experts == 8);
    CHECK(m->moe_top_k == 2 && m->moe_ffn_hidden == 32 && m->ffn_hidden == 96);
    CHECK(m->moe_norm_topk && m->moe_every == 2 && m->moe_first_dense == 1);
    CHECK(!ts_model_block_is_moe(m, 0) && ts_model_block_is_moe(m, 1));
    EXPECT_ERR(text, OV("model.moe_experts=4"), "num_experts = 8", "model.moe_experts = 4");
    EXPECT_ERR(text, OV("model.qk_norm=false"), "model.qk_norm = false");

    ts_test_write_file(dir, "config.json",
                       "{\"model_type\": \"mixtral\", \"hidden_size\": 64, "
                       "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"intermediate_size\": 48, "
                       "\"vocab_size\": 256, \"num_local_experts\": 4, "
                       "\"num_experts_per_tok\": 2, \"sliding_window\": null}");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(!m->qk_norm && m->moe_experts == 4 && m->moe_ffn_hidden == 48 && m->moe_norm_topk);
    CHECK(ts_model_moe_mixtral(m));
    EXPECT_ERR(text, OV("model.moe_top_k=3"), "num_experts_per_tok = 2", "model.moe_top_k = 3");
    EXPECT_ERR(text, OV("model.moe_norm_topk=false"), "mixtral", "model.moe_norm_topk");
}

/* model.init_upcycle: an MoE config started from a dense Llama's weights (a config.json
 * of model_type "llama" beside them fills ffn_hidden, the dense MLP's width). Refused,
 * naming the keys: without model.init or an MoE config, experts of another width than
 * the dense MLP, a shared expert, and routing weights that do not sum to one (a route
 * scale, unnormalised top-k): the first loss would not be the dense model's. */
static void test_moe_upcycle(void)
{
    char dir[300], text[1024];
    snprintf(dir, sizeof dir, "%s", g_dir);
    ts_test_write_file(dir, "config.json",
                       "{\"model_type\": \"llama\", \"hidden_size\": 64, "
                       "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"intermediate_size\": 32, "
                       "\"vocab_size\": 256}");
    snprintf(text, sizeof text,
             "model = { seq_len = 16; init = \"%s\"; init_upcycle = true; moe_experts = 8;\n"
             "          moe_top_k = 2; moe_ffn_hidden = 32; };\n",
             dir);
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(g_cfg.model.init_upcycle && g_cfg.model.ffn_hidden == 32);
    /* Softmax over all the experts sums to one unnormalised; sigmoid renormalised too. */
    CHECKF(load_ov(text, OV("model.moe_norm_topk=false", "model.moe_top_k=8"), 2) == TS_OK,
           "%s", ts_error_message());
    CHECKF(load_ov(text, OV("model.moe_router=\"sigmoid\""), 1) == TS_OK, "%s",
           ts_error_message());
    ts_config_defaults(&g_cfg);
    CHECK(!g_cfg.model.init_upcycle);

    EXPECT_ERR(text, OV("model.moe_experts=0", "model.moe_top_k=2", "model.moe_ffn_hidden=0"),
               "model.init_upcycle is set, but model.moe_experts = 0");
    EXPECT_ERR(MOE, OV("model.init_upcycle=true"), "model.init_upcycle = true needs model.init");
    EXPECT_ERR(text, OV("model.moe_ffn_hidden=16"), "model.moe_ffn_hidden = 16",
               "model.ffn_hidden = 32", "granular upcycling");
    EXPECT_ERR(text, OV("model.moe_shared_experts=1"), "model.moe_shared_experts = 1");
    EXPECT_ERR(text, OV("model.moe_route_scale=2.5"), "model.moe_route_scale = 2.5");
    EXPECT_ERR(text, OV("model.moe_norm_topk=false"), "model.moe_norm_topk = false",
               "softmax scores of the top 2 of 8");
    EXPECT_ERR(text, OV("model.moe_norm_topk=false", "model.moe_top_k=8",
                        "model.moe_router=\"sigmoid\""),
               "model.moe_norm_topk = false", "sigmoid");
}

/* model.moe_capacity: 0 (dropless) by default, a factor >= 0 read as given; a negative
 * or non-finite factor, and one on a dense model, are errors naming the key. */
static void test_moe_capacity(void)
{
    ts_config_defaults(&g_cfg);
    CHECK(g_cfg.model.moe_capacity == 0.0);
    CHECK(load_ov(MOE, OV("model.moe_capacity=1.25"), 1) == TS_OK);
    CHECK(g_cfg.model.moe_capacity == 1.25);
    CHECK(load_ov(MOE, OV("model.moe_capacity=0"), 1) == TS_OK);
    CHECK(g_cfg.model.moe_capacity == 0.0);
    EXPECT_ERR(MOE, OV("model.moe_capacity=-0.5"), "'model.moe_capacity' = -0.5",
               "out of range", "in [0, 1e+06]");
    EXPECT_ERR(MOE, OV("model.moe_capacity=1e400"), "'model.moe_capacity'", "finite");
    EXPECT_ERR("model = { arch = \"llama\"; };\n", OV("model.moe_capacity=1.5"),
               "model.moe_capacity is set", "model.moe_experts = 0");
}

/* model.init's config.json of a DeepseekV3ForCausalLM (DeepSeek-V3's "deepseek_v3", Kimi
 * K2's "kimi_k2"; config_hf_deepseek.c): MLA, DeepSeekMoE and YaRN keys filled, each
 * disagreement and each model transformers would compute otherwise refused by name. */
#define DS_BASE                                                                          \
    "\"architectures\": [\"DeepseekV3ForCausalLM\"], \"hidden_size\": 64, "             \
    "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"vocab_size\": 96, "        \
    "\"intermediate_size\": 96, \"moe_intermediate_size\": 32, \"kv_lora_rank\": 16, "  \
    "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, "          \
    "\"n_routed_experts\": 8, \"num_experts_per_tok\": 2, \"topk_group\": 1, "         \
    "\"first_k_dense_replace\": 1, \"rms_norm_eps\": 1e-6, "                          \
    "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, "          \
    "\"factor\": 4.0, \"original_max_position_embeddings\": 8, \"mscale\": 1.0, "       \
    "\"mscale_all_dim\": 1.0}"

static const char *ds_write(const char *extra)
{
    static char json[4096];
    snprintf(json, sizeof json, "{%s%s%s}", DS_BASE, extra[0] ? ", " : "", extra);
    return ts_test_write_file(g_dir, "config.json", json);
}

static void test_deepseek_hf_config(void)
{
    char text[1024];
    const ts_model_config *m = &g_cfg.model;
    /* The fixture's own save_pretrained directory (transformers 5.25's config.json). */
    const char *root = getenv("TS_SOURCE_DIR");
    snprintf(text, sizeof text, "model = { seq_len = 16; init = \"%s/tests/fixtures/deepseek_tiny\"; };\n",
             root ? root : ".");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(strcmp(m->arch, "llama") == 0 && m->n_layer == 3 && m->n_embd == 64 && m->n_head == 4);
    CHECK(m->n_kv_head == 4 && m->head_dim == 0 && m->vocab_size == 96 && m->ffn_hidden == 96);
    CHECK(m->q_lora_rank == 32 && m->kv_lora_rank == 16 && m->qk_nope_head_dim == 16);
    CHECK(m->qk_rope_head_dim == 8 && m->v_head_dim == 16 && ts_model_is_mla(m));
    CHECK(m->moe_experts == 8 && m->moe_top_k == 2 && m->moe_ffn_hidden == 32);
    CHECK(m->moe_shared_experts == 1 && m->moe_groups == 2 && m->moe_topk_groups == 1);
    CHECK(m->moe_first_dense == 1 && m->moe_every == 1 && !strcmp(m->moe_router, "sigmoid"));
    CHECK(m->moe_norm_topk && m->moe_route_scale == 2.5 && m->mtp_layers == 0 && !m->qk_norm);
    CHECK(fabs(m->norm_eps - 1e-5) < 1e-12 && ts_model_tied(m) == false);
    CHECK(m->rope_theta == 10000.0 && !strcmp(m->rope_type, "yarn") && m->rope_scaling == 4.0);
    CHECK(m->rope_original_context == 8 && m->rope_beta_fast == 32.0);
    CHECK(m->rope_beta_slow == 0.01 && m->rope_mscale == 1.0 && m->rope_mscale_all_dim == 0.5);
    CHECK(!ts_model_block_is_moe(m, 0) && ts_model_block_is_moe(m, 1) && ts_model_block_is_moe(m, 2));
    /* What a checkpoint of this model writes (checkpoint/hf_deepseek.c) reads back the
     * same, key for key; a model transformers' DeepseekV3 would compute otherwise gets no
     * config.json. */
    const ts_model_config saved = *m;
    char *json = ts_ckpt_hf_config_json(&saved);
    CHECK(json && strstr(json, "\"model_type\": \"deepseek_v3\"") &&
          strstr(json, "\"e_score\"") == NULL);
    if (json) ts_test_write_file(g_dir, "config.json", json);
    free(json);
    snprintf(text, sizeof text, "model = { seq_len = 16; init = \"%s\"; };\n", g_dir);
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->q_lora_rank == saved.q_lora_rank && m->kv_lora_rank == saved.kv_lora_rank);
    CHECK(m->qk_nope_head_dim == saved.qk_nope_head_dim && m->v_head_dim == saved.v_head_dim);
    CHECK(m->qk_rope_head_dim == saved.qk_rope_head_dim && m->n_kv_head == saved.n_kv_head);
    CHECK(m->moe_experts == saved.moe_experts && m->moe_top_k == saved.moe_top_k);
    CHECK(m->moe_groups == saved.moe_groups && m->moe_topk_groups == saved.moe_topk_groups);
    CHECK(m->moe_first_dense == saved.moe_first_dense && m->moe_route_scale == saved.moe_route_scale);
    CHECK(m->moe_shared_experts == saved.moe_shared_experts && m->ffn_hidden == saved.ffn_hidden);
    CHECK(!strcmp(m->rope_type, "yarn") && m->rope_scaling == saved.rope_scaling);
    CHECK(m->rope_beta_slow == saved.rope_beta_slow && m->rope_mscale_all_dim == saved.rope_mscale_all_dim);
    CHECK(m->rope_original_context == saved.rope_original_context && m->norm_eps == saved.norm_eps);
    CHECK(m->n_layer == saved.n_layer && m->vocab_size == saved.vocab_size && m->mtp_layers == 0);
    ts_model_config other = saved;
    snprintf(other.moe_router, sizeof other.moe_router, "softmax");
    CHECK(ts_ckpt_hf_config_json(&other) == NULL);
    other = saved;
    other.moe_top_k = 4; /* groups ranked by their top 4: transformers ranks by the top 2 */
    CHECK(ts_ckpt_hf_config_json(&other) == NULL);
    other = saved;
    other.moe_shared_experts = 0;
    CHECK(ts_ckpt_hf_config_json(&other) == NULL);
    other = saved;
    other.moe_experts = 0; /* dense: every block before first_k_dense_replace */
    json = ts_ckpt_hf_config_json(&other);
    CHECK(json && strstr(json, "\"first_k_dense_replace\": 3"));
    free(json);

    /* DeepSeek-V3's hub config.json (its keys and values; transformers 4's rope_scaling
     * with "type", q_lora_rank, groups, routing and MTP by DeepseekV3Config's defaults
     * where absent; num_nextn_predict_layers left out: MTP is another part's). */
    const char *dir = g_dir;
    ts_test_write_file(dir, "config.json",
                       "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": "
                       "\"deepseek_v3\", \"vocab_size\": 129280, \"hidden_size\": 7168, "
                       "\"intermediate_size\": 18432, \"moe_intermediate_size\": 2048, "
                       "\"num_hidden_layers\": 61, \"num_attention_heads\": 128, "
                       "\"num_key_value_heads\": 128, \"n_shared_experts\": 1, "
                       "\"n_routed_experts\": 256, \"ep_size\": 1, \"routed_scaling_factor\": 2.5, "
                       "\"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, "
                       "\"v_head_dim\": 128, \"qk_nope_head_dim\": 128, \"topk_method\": "
                       "\"noaux_tc\", \"n_group\": 8, \"topk_group\": 4, \"num_experts_per_tok\": 8, "
                       "\"moe_layer_freq\": 1, \"first_k_dense_replace\": 3, \"norm_topk_prob\": true, "
                       "\"scoring_func\": \"sigmoid\", \"aux_loss_alpha\": 0.001, \"seq_aux\": true, "
                       "\"hidden_act\": \"silu\", \"max_position_embeddings\": 163840, "
                       "\"rms_norm_eps\": 1e-06, \"tie_word_embeddings\": false, \"rope_theta\": 10000, "
                       "\"rope_scaling\": {\"beta_fast\": 32, \"beta_slow\": 1, \"factor\": 40, "
                       "\"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": "
                       "4096, \"type\": \"yarn\"}, \"attention_bias\": false, \"attention_dropout\": 0.0}");
    snprintf(text, sizeof text, "model = { seq_len = 4096; init = \"%s\"; };\n", dir);
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->n_layer == 61 && m->n_embd == 7168 && m->n_head == 128 && m->vocab_size == 129280);
    CHECK(m->q_lora_rank == 1536 && m->kv_lora_rank == 512 && m->qk_nope_head_dim == 128);
    CHECK(m->qk_rope_head_dim == 64 && m->v_head_dim == 128 && m->ffn_hidden == 18432);
    CHECK(m->moe_experts == 256 && m->moe_top_k == 8 && m->moe_groups == 8 && m->moe_topk_groups == 4);
    CHECK(m->moe_first_dense == 3 && m->moe_shared_experts == 1 && m->moe_ffn_hidden == 2048);
    CHECK(m->rope_scaling == 40.0 && m->rope_original_context == 4096 && m->rope_mscale_all_dim == 1.0);
    CHECK(!strcmp(m->rope_type, "yarn") && m->rope_beta_slow == 1.0 && m->mtp_layers == 0);

    /* Kimi K2's (model_type kimi_k2; no groups, 384 experts, one dense block, beta 1/1). */
    ts_test_write_file(dir, "config.json",
                       "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"kimi_k2\", "
                       "\"vocab_size\": 163840, \"hidden_size\": 7168, \"intermediate_size\": 18432, "
                       "\"moe_intermediate_size\": 2048, \"num_hidden_layers\": 61, "
                       "\"num_attention_heads\": 64, \"num_key_value_heads\": 64, "
                       "\"n_shared_experts\": 1, \"n_routed_experts\": 384, \"routed_scaling_factor\": "
                       "2.827, \"kv_lora_rank\": 512, \"q_lora_rank\": 1536, \"qk_rope_head_dim\": 64, "
                       "\"v_head_dim\": 128, \"qk_nope_head_dim\": 128, \"topk_method\": \"noaux_tc\", "
                       "\"n_group\": 1, \"topk_group\": 1, \"num_experts_per_tok\": 8, "
                       "\"first_k_dense_replace\": 1, \"norm_topk_prob\": true, \"scoring_func\": "
                       "\"sigmoid\", \"num_nextn_predict_layers\": 0, \"rms_norm_eps\": 1e-06, "
                       "\"rope_theta\": 50000.0, \"max_position_embeddings\": 131072, "
                       "\"rope_scaling\": {\"beta_fast\": 1.0, \"beta_slow\": 1.0, \"factor\": 32.0, "
                       "\"mscale\": 1.0, \"mscale_all_dim\": 1.0, "
                       "\"original_max_position_embeddings\": 4096, \"type\": \"yarn\"}}");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->n_head == 64 && m->moe_experts == 384 && m->moe_groups == 1 && m->moe_first_dense == 1);
    CHECK(fabs(m->moe_route_scale - 2.827) < 1e-12 && m->rope_theta == 50000.0);
    CHECK(m->rope_beta_fast == 1.0 && m->rope_scaling == 32.0 && m->vocab_size == 163840);

    /* The tiny base: absent keys (q_lora_rank, n_group, n_shared_experts, the router)
     * take DeepseekV3Config's defaults; null q_lora_rank is a plain q projection; a
     * first_k_dense_replace past the last block is a dense model; YaRN's factor from
     * max_position_embeddings when absent. */
    snprintf(text, sizeof text, "model = { seq_len = 16; init = \"%s\"; };\n", dir);
    ds_write("\"n_group\": 2");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->q_lora_rank == 1536 && m->moe_shared_experts == 1 && !strcmp(m->moe_router, "sigmoid"));
    CHECK(m->moe_route_scale == 2.5 && m->moe_norm_topk && m->rope_beta_fast == 32.0);
    ds_write("\"n_group\": 2, \"q_lora_rank\": null, \"n_shared_experts\": null, "
             "\"scoring_func\": \"softmax\", \"norm_topk_prob\": false");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->q_lora_rank == 0 && m->moe_shared_experts == 0 && !strcmp(m->moe_router, "softmax"));
    CHECK(!m->moe_norm_topk);
    ds_write("\"first_k_dense_replace\": 3");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->moe_experts == 0 && ts_model_is_mla(m));
    ts_test_write_file(dir, "config.json",
                       "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 4, \"vocab_size\": 96, \"kv_lora_rank\": 16, "
                       "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, "
                       "\"first_k_dense_replace\": 2, \"max_position_embeddings\": 64, "
                       "\"rope_scaling\": {\"type\": \"yarn\", \"original_max_position_embeddings\": 16}}");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->rope_scaling == 4.0 && m->rope_mscale == 0.0 && m->rope_mscale_all_dim == 0.0);

    /* Disagreements name both keys and values. */
    ds_write("\"n_group\": 2");
    EXPECT_ERR(text, OV("model.kv_lora_rank=32"), "gives kv_lora_rank = 16",
               "model.kv_lora_rank = 32");
    EXPECT_ERR(text, OV("model.moe_groups=4"), "gives n_group = 2", "model.moe_groups = 4");
    EXPECT_ERR(text, OV("model.moe_router=\"softmax\""), "scoring_func = \"sigmoid\"",
               "model.moe_router = softmax");
    EXPECT_ERR(text, OV("model.rope_type=\"llama3\""), "rope_parameters = YaRN",
               "model.rope_type = llama3");
    EXPECT_ERR(text, OV("model.rope_mscale_all_dim=0.5"), "rope_parameters.mscale_all_dim = 1",
               "model.rope_mscale_all_dim = 0.5");
    EXPECT_ERR(text, OV("model.mtp_layers=1"), "gives num_mtp_layers = 0", "model.mtp_layers = 1");
    EXPECT_ERR(text, OV("model.moe_every=2"), "gives moe_layer_freq = 1", "model.moe_every = 2");
    /* What transformers' DeepseekV3 would compute otherwise, refused by name. */
    ds_write("\"n_group\": 2, \"rope_interleave\": false");
    EXPECT_ERR(text, NULL, "rope_interleave = false", "adjacent pairs");
    ds_write("\"n_group\": 2, \"topk_method\": \"group_limited_greedy\"");
    EXPECT_ERR(text, NULL, "topk_method = \"group_limited_greedy\"", "n_group = 2",
               "topk_group = 1");
    ds_write("\"n_group\": 1, \"topk_method\": \"greedy\"");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    ds_write("\"n_group\": 2, \"scoring_func\": \"sqrtsoftplus\"");
    EXPECT_ERR(text, NULL, "scoring_func = \"sqrtsoftplus\"");
    ds_write("\"n_group\": 2, \"moe_layer_freq\": 2");
    EXPECT_ERR(text, NULL, "moe_layer_freq = 2", "first_k_dense_replace");
    ds_write("\"n_group\": 2, \"num_key_value_heads\": 1");
    EXPECT_ERR(text, NULL, "num_key_value_heads = 1", "num_attention_heads = 4");
    ds_write("\"n_group\": 2, \"attention_bias\": true");
    EXPECT_ERR(text, NULL, "attention_bias = true");
    ds_write("\"n_group\": 2, \"quantization_config\": {\"quant_method\": \"fp8\"}");
    EXPECT_ERR(text, NULL, "quantization_config (\"fp8\")", "dequantize");
    ds_write("\"n_group\": 2, \"q_lora_rank\": \"big\"");
    EXPECT_ERR(text, NULL, "\"q_lora_rank\" is not a non-negative integer");
    ts_test_write_file(dir, "config.json",
                       "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 4, \"vocab_size\": 96, \"kv_lora_rank\": 16, "
                       "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, "
                       "\"first_k_dense_replace\": 2, \"rope_scaling\": {\"type\": \"yarn\", "
                       "\"factor\": 4, \"original_max_position_embeddings\": 16, "
                       "\"mscale_all_dim\": 1.0}}");
    ts_error_clear(); /* mscale_all_dim alone: absent mscale is 0, transformers' None */
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->rope_mscale == 0.0 && m->rope_mscale_all_dim == 1.0);
    /* mscale without mscale_all_dim, from config.json: inert (YaRN reads it only beside
     * mscale_all_dim) but not given, so the import loads; given by --set it is refused. */
    ts_test_write_file(dir, "config.json",
                       "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 4, \"vocab_size\": 96, \"kv_lora_rank\": 16, "
                       "\"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16, "
                       "\"first_k_dense_replace\": 2, \"rope_scaling\": {\"type\": \"yarn\", "
                       "\"factor\": 4, \"original_max_position_embeddings\": 16, "
                       "\"mscale\": 0.5}}");
    ts_error_clear();
    CHECKF(load_ov(text, NULL, 0) == TS_OK, "%s", ts_error_message());
    CHECK(m->rope_mscale == 0.5 && m->rope_mscale_all_dim == 0.0);
    EXPECT_ERR(text, OV("model.rope_mscale=0.5"), "'model.rope_mscale' = 0.5",
               "model.rope_mscale_all_dim > 0");
    ts_test_write_file(dir, "config.json",
                       "{\"model_type\": \"kimi_k2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 4, \"vocab_size\": 96, \"kv_lora_rank\": 0}");
    EXPECT_ERR(text, NULL, "kv_lora_rank = 0", "multi-head latent attention");
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_test_config_moe");
    test_moe_defaults();
    test_moe_block_rule();
    test_moe_dense_refuses_keys();
    test_moe_routing_errors();
    test_moe_expert_parallel_errors();
    test_moe_unbuilt();
    test_moe_hf_config();
    test_deepseek_hf_config();
    test_moe_qk_norm();
    test_moe_upcycle();
    test_moe_capacity();
    ts_test_remove_dir(g_dir);
    return ts_test_report();
}
