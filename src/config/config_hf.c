/* model.init's Hugging Face config.json (config_internal.h ts_config_from_hf): a Llama's
 * shapes and hyperparameters, filled into the model keys the config leaves unset and
 * compared with those it sets. The tensors alone cannot tell 8 heads of 16 from 4 of 32,
 * nor rope_theta or rms_norm_eps; a model run with other values is silently another
 * model. */
#include "config/config_hf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"
#include "core/log.h"

bool ts_hf_given(const ts_hf_reader *h, const char *key) { return h->given(h->ctx, key); }

ts_status ts_hf_disagree(const ts_hf_reader *h, const char *hf_key, const char *hf_val,
                          const char *key, const char *val)
{
    return ts_fail("model.init: %s gives %s = %s, but the config sets %s = %s; the weights "
                   "are of that model: leave %s out of the config (and --set) to take "
                   "config.json's value, or set it to %s",
                   h->path, hf_key, hf_val, key, val, key, hf_val);
}

/* A positive integer of config.json (a real with an integral value too, as Python may
 * write one); 0 when absent or null; -1 (an error set) when it is something else. */
long long ts_hf_int(const ts_hf_reader *h, json_t *root, const char *hf_key)
{
    json_t *v = json_object_get(root, hf_key);
    if (!v || json_is_null(v)) return 0;
    double d = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v)
                                  : -1.0;
    if (!(d >= 1.0 && d <= 2147483647.0 && d == floor(d))) {
        ts_fail("model.init: %s: \"%s\" is not a positive integer", h->path, hf_key);
        return -1;
    }
    return (long long)d;
}

/* A finite real of config.json: 1 found (in *out), 0 absent or null, -1 an error set. */
int ts_hf_real(const ts_hf_reader *h, json_t *root, const char *hf_key, double *out)
{
    json_t *v = json_object_get(root, hf_key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v) || !isfinite(json_number_value(v))) {
        ts_fail("model.init: %s: \"%s\" is not a number", h->path, hf_key);
        return -1;
    }
    *out = json_number_value(v);
    return 1;
}

/* An int key: config.json's value `want` (0: absent, nothing to do) into *field when the
 * config leaves `key` unset, else compared with `have` (the key's resolved value). */
ts_status ts_hf_fill_int(const ts_hf_reader *h, const char *hf_key, long long want,
                          const char *key, int *field, int have)
{
    if (want <= 0) return TS_OK;
    if (!ts_hf_given(h, key)) {
        *field = (int)want;
        return TS_OK;
    }
    if (have == want) return TS_OK;
    char a[32], b[32];
    snprintf(a, sizeof a, "%lld", want);
    snprintf(b, sizeof b, "%d", have);
    return ts_hf_disagree(h, hf_key, a, key, b);
}

/* A real key, compared to 1e-6 relative (a value written from float32, 9.99999975e-06
 * for 1e-05, is the same setting). */
ts_status ts_hf_fill_real(const ts_hf_reader *h, const char *hf_key, double want,
                           const char *key, double *field)
{
    if (!ts_hf_given(h, key)) {
        *field = want;
        return TS_OK;
    }
    if (fabs(*field - want) <= 1e-6 * fabs(want)) return TS_OK;
    char a[32], b[32];
    snprintf(a, sizeof a, "%.9g", want);
    snprintf(b, sizeof b, "%.9g", *field);
    return ts_hf_disagree(h, hf_key, a, key, b);
}

/* Llama 3.1's frequency scaling, or YaRN where the family has it (yarn_ok: DeepSeek-V3's):
 * rope_scaling (transformers 4) or rope_parameters (transformers 5, which also holds
 * rope_theta there). */
static ts_status read_rope(const ts_hf_reader *h, json_t *root, bool yarn_ok)
{
    ts_model_config *m = &h->cfg->model;
    json_t *params = json_object_get(root, "rope_parameters");
    if (!json_is_object(params)) params = NULL;
    double theta = 10000.0; /* transformers' LlamaConfig default */
    int got = ts_hf_real(h, root, "rope_theta", &theta);
    const char *theta_key = "rope_theta";
    if (got == 0 && params) {
        got = ts_hf_real(h, params, "rope_theta", &theta);
        theta_key = "rope_parameters.rope_theta";
    }
    if (got < 0) return TS_ERR;
    if (ts_hf_fill_real(h, theta_key, theta, "model.rope_theta", &m->rope_theta) != TS_OK)
        return TS_ERR;

    json_t *sc = json_object_get(root, "rope_scaling");
    const char *sc_key = "rope_scaling";
    if ((!sc || json_is_null(sc)) && params) {
        sc = params;
        sc_key = "rope_parameters";
    }
    const char *type = NULL;
    if (sc && !json_is_null(sc)) {
        if (!json_is_object(sc))
            return ts_fail("model.init: %s: \"%s\" is not an object or null", h->path, sc_key);
        type = json_string_value(json_object_get(sc, "rope_type"));
        if (!type) type = json_string_value(json_object_get(sc, "type"));
        if (!type) type = "default";
    }
    if (!type || !strcmp(type, "default")) { /* no scaling */
        if (ts_hf_given(h, "model.rope_scaling") && m->rope_scaling != 0.0)
            return ts_hf_disagree(h, sc_key, "no scaling", "model.rope_scaling", "a factor");
        m->rope_scaling = 0.0;
        return TS_OK;
    }
    if (yarn_ok && !strcmp(type, "yarn")) return ts_hf_read_yarn(h, root, sc, sc_key);
    if (strcmp(type, "llama3") != 0)
        return ts_fail("model.init: %s: %s type \"%s\" is not one Tessera implements for this "
                       "model_type (Llama 3.1's \"llama3\" scaling, or none; \"yarn\" for "
                       "DeepSeek-V3's)",
                       h->path, sc_key, type);
    if (ts_hf_given(h, "model.rope_type") && strcmp(h->cfg->model.rope_type, "llama3") != 0)
        return ts_hf_disagree(h, sc_key, "Llama 3.1's (\"llama3\")", "model.rope_type",
                              h->cfg->model.rope_type);
    snprintf(h->cfg->model.rope_type, sizeof h->cfg->model.rope_type, "llama3");
    struct {
        const char *hf, *key;
        double *field;
    } reals[] = {{"factor", "model.rope_scaling", &m->rope_scaling},
                 {"low_freq_factor", "model.rope_low_freq_factor", &m->rope_low_freq_factor},
                 {"high_freq_factor", "model.rope_high_freq_factor", &m->rope_high_freq_factor}};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        double v = 0.0;
        char name[64];
        snprintf(name, sizeof name, "%s.%s", sc_key, reals[i].hf);
        const int r = ts_hf_real(h, sc, reals[i].hf, &v);
        if (r < 0) return TS_ERR;
        if (r == 0) return ts_fail("model.init: %s: \"%s\" is missing", h->path, name);
        if (ts_hf_fill_real(h, name, v, reals[i].key, reals[i].field) != TS_OK) return TS_ERR;
    }
    const long long ctx = ts_hf_int(h, sc, "original_max_position_embeddings");
    if (ctx < 0) return TS_ERR;
    char name[64];
    snprintf(name, sizeof name, "%s.original_max_position_embeddings", sc_key);
    return ts_hf_fill_int(h, name, ctx, "model.rope_original_context", &m->rope_original_context,
                    m->rope_original_context);
}

/* What Tessera's llama does not have: a config.json asking for it is another model. */
static ts_status check_unsupported(const ts_hf_reader *h, json_t *root)
{
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu") != 0)
        return ts_fail("model.init: %s: hidden_act = \"%s\", but Tessera's llama computes "
                       "SwiGLU with silu",
                       h->path, act);
    /* DeepSeek-V3's and Kimi K2's released weights are block-quantized FP8 (each matrix
     * with a weight_scale_inv), which no loader here reads. */
    json_t *quant = json_object_get(root, "quantization_config");
    if (quant && !json_is_null(quant)) {
        const char *how = json_string_value(json_object_get(quant, "quant_method"));
        return ts_fail("model.init: %s: quantization_config (\"%s\"): the weights are "
                       "quantized, but Tessera loads F32, BF16 or F16 tensors; dequantize them "
                       "first (DeepSeek-V3's: its inference/fp8_cast_bf16.py)",
                       h->path, how ? how : "?");
    }
    const char *bias[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++)
        if (json_is_true(json_object_get(root, bias[i])))
            return ts_fail("model.init: %s: %s = true, but Tessera's llama has no biases",
                           h->path, bias[i]);
    return TS_OK;
}

/* The Llama family's configs Tessera reads: Llama, and the ones that add to it qk_norm
 * (Qwen3), experts (Mixtral) or both (Qwen3-MoE), or latent attention and DeepSeekMoE
 * (DeepSeek-V3, Kimi K2: config_hf_deepseek.c). */
typedef enum { HF_NONE, HF_LLAMA, HF_QWEN3, HF_MIXTRAL, HF_QWEN3_MOE, HF_DEEPSEEK_V3 } hf_family;

static hf_family family_of(json_t *root)
{
    static const struct {
        const char *type, *arch;
        hf_family f;
    } known[] = {{"llama", "LlamaForCausalLM", HF_LLAMA},
                 {"qwen3", "Qwen3ForCausalLM", HF_QWEN3},
                 {"mixtral", "MixtralForCausalLM", HF_MIXTRAL},
                 {"qwen3_moe", "Qwen3MoeForCausalLM", HF_QWEN3_MOE},
                 {"deepseek_v3", "DeepseekV3ForCausalLM", HF_DEEPSEEK_V3},
                 /* Kimi K2: DeepSeek-V3's architecture under its own model_type */
                 {"kimi_k2", "DeepseekV3ForCausalLM", HF_DEEPSEEK_V3}};
    const int n = (int)(sizeof known / sizeof known[0]);
    const char *type = json_string_value(json_object_get(root, "model_type"));
    for (int k = 0; k < n; k++) {
        if (type && !strcmp(type, known[k].type)) return known[k].f;
        json_t *archs = json_object_get(root, "architectures");
        size_t i;
        json_t *a;
        json_array_foreach(archs, i, a) {
            if (!type && json_is_string(a) && !strcmp(json_string_value(a), known[k].arch))
                return known[k].f;
        }
    }
    return HF_NONE;
}

/* A bool key: config.json's value into *field when the config leaves `key` unset, else
 * compared. */
ts_status ts_hf_fill_bool(const ts_hf_reader *h, const char *hf_key, bool want, const char *key,
                           bool *field)
{
    if (!ts_hf_given(h, key)) {
        *field = want;
        return TS_OK;
    }
    if (*field == want) return TS_OK;
    return ts_hf_disagree(h, hf_key, want ? "true" : "false", key, *field ? "true" : "false");
}

/* The experts of a Mixtral or Qwen3-MoE config (MixtralConfig's and Qwen3MoeConfig's
 * defaults where a key is absent), and the q/k norms of the Qwen3 family. */
static ts_status apply_family(const ts_hf_reader *h, json_t *root, hf_family f)
{
    ts_model_config *m = &h->cfg->model;
    if (ts_hf_fill_bool(h, "q/k norms (its model_type)", f == HF_QWEN3 || f == HF_QWEN3_MOE,
                  "model.qk_norm", &m->qk_norm) != TS_OK)
        return TS_ERR;
    json_t *sw = json_object_get(root, "sliding_window");
    if (json_is_true(json_object_get(root, "use_sliding_window")) ||
        (f == HF_MIXTRAL && sw && !json_is_null(sw)))
        return ts_fail("model.init: %s: sliding-window attention, which Tessera's attention "
                       "does not have (every position attends to all before it)",
                       h->path);
    if (f == HF_DEEPSEEK_V3) return ts_hf_apply_deepseek(h, root);
    if (f != HF_MIXTRAL && f != HF_QWEN3_MOE) return TS_OK;
    const bool mixtral = f == HF_MIXTRAL;
    const struct {
        const char *hf, *key;
        int *field;
    } ints[] = {{mixtral ? "num_local_experts" : "num_experts", "model.moe_experts",
                 &m->moe_experts},
                {"num_experts_per_tok", "model.moe_top_k", &m->moe_top_k},
                {mixtral ? "intermediate_size" : "moe_intermediate_size", "model.moe_ffn_hidden",
                 &m->moe_ffn_hidden},
                {mixtral ? "" : "decoder_sparse_step", "model.moe_every", &m->moe_every}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (!ints[i].hf[0]) continue;
        const long long v = ts_hf_int(h, root, ints[i].hf);
        if (v < 0 || ts_hf_fill_int(h, ints[i].hf, v, ints[i].key, ints[i].field, *ints[i].field) !=
                         TS_OK)
            return TS_ERR;
    }
    /* Mixtral renormalises its top-k always; Qwen3-MoE when norm_topk_prob (default
     * false). Both route with a softmax. */
    json_t *norm = json_object_get(root, "norm_topk_prob");
    if (ts_hf_fill_bool(h, mixtral ? "a renormalised top-k (model_type \"mixtral\")" : "norm_topk_prob",
                  mixtral || json_is_true(norm),
                  "model.moe_norm_topk", &m->moe_norm_topk) != TS_OK)
        return TS_ERR;
    if (ts_hf_given(h, "model.moe_router") && strcmp(m->moe_router, "softmax") != 0)
        return ts_hf_disagree(h, "its router (model_type)", "\"softmax\"", "model.moe_router",
                        m->moe_router);
    /* Qwen3-MoE's dense blocks: mlp_only_layers, which Tessera has as the first k. */
    json_t *dense = json_object_get(root, "mlp_only_layers");
    size_t n = json_is_array(dense) ? json_array_size(dense) : 0;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(dense, i)) != (json_int_t)i)
            return ts_fail("model.init: %s: mlp_only_layers must be the first blocks [0, 1, "
                           "...] (model.moe_first_dense); other dense blocks are not built",
                           h->path);
    return ts_hf_fill_int(h, "mlp_only_layers", (long long)n, "model.moe_first_dense",
                    &m->moe_first_dense, m->moe_first_dense);
}

static ts_status apply(const ts_hf_reader *h, json_t *root, hf_family f)
{
    ts_model_config *m = &h->cfg->model;
    if (ts_hf_given(h, "model.arch") && ts_model_arch(m) != TS_ARCH_LLAMA)
        return ts_hf_disagree(h, "model_type", "\"llama\"", "model.arch", "\"gpt2\"");
    if (!ts_hf_given(h, "model.arch")) snprintf(m->arch, sizeof m->arch, "llama");
    if (check_unsupported(h, root) != TS_OK) return TS_ERR;
    /* The shapes: the ones others are derived from first. */
    const struct {
        const char *hf, *key;
        int *field;
    } ints[] = {{"num_hidden_layers", "model.n_layer", &m->n_layer},
                {"hidden_size", "model.n_embd", &m->n_embd},
                {"num_attention_heads", "model.n_head", &m->n_head},
                {"vocab_size", "model.vocab_size", &m->vocab_size}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const long long v = ts_hf_int(h, root, ints[i].hf);
        if (v < 0 || ts_hf_fill_int(h, ints[i].hf, v, ints[i].key, ints[i].field, *ints[i].field) !=
                         TS_OK)
            return TS_ERR;
    }
    long long kv = ts_hf_int(h, root, "num_key_value_heads");
    if (kv < 0) return TS_ERR;
    if (kv == 0) kv = ts_hf_int(h, root, "num_attention_heads"); /* transformers' default */
    if (kv < 0 || ts_hf_fill_int(h, "num_key_value_heads", kv, "model.n_kv_head", &m->n_kv_head,
                           ts_model_kv_heads(m)) != TS_OK)
        return TS_ERR;
    /* Mixtral's intermediate_size is its experts' width (apply_family). */
    const long long ffn = f == HF_MIXTRAL ? 0 : ts_hf_int(h, root, "intermediate_size");
    if (ffn < 0 || ts_hf_fill_int(h, "intermediate_size", ffn, "model.ffn_hidden", &m->ffn_hidden,
                            ts_model_ffn(m)) != TS_OK)
        return TS_ERR;
    /* head_dim: absent (0) is transformers' hidden_size / num_attention_heads, what
     * model.head_dim 0 means too; Qwen3's models give 128 whatever the width. */
    /* (DeepseekV3Config writes head_dim = qk_rope_head_dim, derived: config_hf_deepseek.c
     * reads MLA's head dims instead.) */
    const long long hd = f == HF_DEEPSEEK_V3 ? 0 : ts_hf_int(h, root, "head_dim");
    if (hd < 0) return TS_ERR;
    if (ts_hf_fill_int(h, "head_dim", hd, "model.head_dim", &m->head_dim, ts_model_head_dim(m)) != TS_OK)
        return TS_ERR;
    double eps = 1e-6; /* transformers' LlamaConfig default */
    if (ts_hf_real(h, root, "rms_norm_eps", &eps) < 0 ||
        ts_hf_fill_real(h, "rms_norm_eps", eps, "model.norm_eps", &m->norm_eps) != TS_OK)
        return TS_ERR;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (tie && !json_is_null(tie) && !json_is_boolean(tie))
        return ts_fail("model.init: %s: \"tie_word_embeddings\" is not true or false", h->path);
    const bool tied = json_is_true(tie); /* absent: LlamaConfig's false */
    if (!ts_hf_given(h, "model.tie_embeddings"))
        m->tie_embeddings = tied ? 1 : -1;
    else if (ts_model_tied(m) != tied)
        return ts_hf_disagree(h, "tie_word_embeddings", tied ? "true" : "false",
                        "model.tie_embeddings", tied ? "false" : "true");
    if (apply_family(h, root, f) != TS_OK) return TS_ERR;
    return read_rope(h, root, f == HF_DEEPSEEK_V3);
}

ts_status ts_config_from_hf(ts_config *cfg, ts_config_key_given_fn given_fn, void *ctx)
{
    const char *init = cfg->model.init;
    if (!init[0]) return TS_OK;
    /* Beside the weights: in the directory model.init names, or beside the file. */
    struct stat st;
    if (stat(init, &st) != 0) return TS_OK; /* the loader names a missing model.init */
    char path[TS_PATH_MAX + 16];
    if (S_ISDIR(st.st_mode)) {
        snprintf(path, sizeof path, "%s/config.json", init);
    } else {
        const char *slash = strrchr(init, '/');
        const int dir = slash ? (int)(slash - init) + 1 : 0;
        snprintf(path, sizeof path, "%.*sconfig.json", dir, init);
    }
    FILE *f = ts_fopen_input(path);
    if (!f) {
        if (errno == ENOENT) return TS_OK;
        return ts_fail("model.init: cannot open %s: %s", path, strerror(errno));
    }
    if (ts_check_input(fileno(f), path, "model.init's config.json",
                       "a Hugging Face config.json", 1u << 24) != TS_OK) {
        fclose(f);
        return ts_error_prefix("model.init: ");
    }
    json_error_t jerr;
    json_t *root = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!json_is_object(root)) {
        json_decref(root);
        return ts_fail("model.init: %s is not a JSON object (%s, line %d)", path,
                       root ? "another JSON value" : jerr.text, root ? 0 : jerr.line);
    }
    ts_hf_reader h = {cfg, path, given_fn, ctx};
    ts_status rc = TS_OK;
    const hf_family fam = family_of(root);
    if (fam != HF_NONE)
        rc = apply(&h, root, fam);
    else if (ts_model_arch(&cfg->model) == TS_ARCH_LLAMA)
        rc = ts_fail("model.init: %s is not a Llama's config (model_type \"llama\", "
                     "LlamaForCausalLM; or \"qwen3\", \"mixtral\", \"qwen3_moe\", "
                     "\"deepseek_v3\", \"kimi_k2\"), but "
                     "model.arch = \"llama\"; are the weights of another model?",
                     path);
    else /* GPT-2's weights are nanoGPT's: a config.json beside them is not read */
        ts_log_warn("model.init: %s is not a Llama's config.json: not read (the weights are "
                    "checked against the config's shapes)",
                    path);
    json_decref(root);
    return rc;
}
