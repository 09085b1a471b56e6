/* model.init's config.json of a DeepseekV3ForCausalLM (config_hf.h ts_hf_apply_deepseek):
 * DeepSeek-V3's (model_type "deepseek_v3") and Kimi K2's ("kimi_k2", the same
 * architecture). Multi-head latent attention, DeepSeekMoE's routing (sigmoid scores plus
 * the e_score_correction_bias, groups, a route scale, shared experts, dense first blocks)
 * and multi-token prediction into Tessera's model keys; YaRN (ts_hf_read_yarn). A key
 * config.json leaves out takes transformers' DeepseekV3Config default, which is what
 * from_pretrained would build: DeepSeek-V3 671B's value. What transformers' class would
 * compute otherwise than Tessera (a plain top-k asked of a grouped router, halves rotated
 * instead of pairs, a cos/sin factor the keys cannot say) is refused by name. */
#include "config/config_hf.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* A count (an integer >= 0) of config.json into *out: `dflt` when absent, `if_null`
 * when null (-1: null is an error). */
static ts_status count_of(const ts_hf_reader *h, json_t *root, const char *key, long long dflt,
                          long long if_null, long long *out)
{
    json_t *v = json_object_get(root, key);
    if (!v) {
        *out = dflt;
        return TS_OK;
    }
    if (json_is_null(v)) {
        if (if_null < 0)
            return ts_fail("model.init: %s: \"%s\" is null; DeepseekV3ForCausalLM needs a "
                           "number there",
                           h->path, key);
        *out = if_null;
        return TS_OK;
    }
    const double d = json_is_integer(v) ? (double)json_integer_value(v)
                     : json_is_real(v)  ? json_real_value(v)
                                        : -1.0;
    if (!(d >= 0.0 && d <= 2147483647.0 && d == floor(d)))
        return ts_fail("model.init: %s: \"%s\" is not a non-negative integer", h->path, key);
    *out = (long long)d;
    return TS_OK;
}

/* ts_hf_fill_int for a value that may be 0 (no shared experts, no dense block, no MTP). */
static ts_status fill_count(const ts_hf_reader *h, const char *hf_key, long long want,
                            const char *key, int *field)
{
    if (!ts_hf_given(h, key)) {
        *field = (int)want;
        return TS_OK;
    }
    if (*field == want) return TS_OK;
    char a[32], b[32];
    snprintf(a, sizeof a, "%lld", want);
    snprintf(b, sizeof b, "%d", *field);
    return ts_hf_disagree(h, hf_key, a, key, b);
}

/* A boolean of config.json: `dflt` when absent, false when null (transformers reads None
 * as false), an error when something else. */
static ts_status bool_of(const ts_hf_reader *h, json_t *root, const char *key, bool dflt, bool *out)
{
    json_t *v = json_object_get(root, key);
    if (!v) {
        *out = dflt;
        return TS_OK;
    }
    if (!json_is_null(v) && !json_is_boolean(v))
        return ts_fail("model.init: %s: \"%s\" is not true or false", h->path, key);
    *out = json_is_true(v);
    return TS_OK;
}

/* A string of config.json: `dflt` when absent or null, an error when not a string. */
static ts_status string_of(const ts_hf_reader *h, json_t *root, const char *key, const char *dflt,
                           const char **out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return TS_OK;
    }
    if (!json_is_string(v)) return ts_fail("model.init: %s: \"%s\" is not a string", h->path, key);
    *out = json_string_value(v);
    return TS_OK;
}

/* MLA's shapes. transformers' head_dim (= qk_rope_head_dim, which DeepseekV3Config sets
 * itself) and qk_head_dim (nope + rope) are derived there and not read here: MLA leaves
 * model.head_dim unset. */
static ts_status read_mla(const ts_hf_reader *h, json_t *root)
{
    ts_model_config *m = &h->cfg->model;
    const struct {
        const char *hf;
        long long dflt, if_null;
        const char *key;
        int *field;
    } ints[] = {{"kv_lora_rank", 512, -1, "model.kv_lora_rank", &m->kv_lora_rank},
                {"q_lora_rank", 1536, 0, "model.q_lora_rank", &m->q_lora_rank},
                {"qk_nope_head_dim", 128, -1, "model.qk_nope_head_dim", &m->qk_nope_head_dim},
                {"qk_rope_head_dim", 64, -1, "model.qk_rope_head_dim", &m->qk_rope_head_dim},
                {"v_head_dim", 128, -1, "model.v_head_dim", &m->v_head_dim}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        long long v = 0;
        if (count_of(h, root, ints[i].hf, ints[i].dflt, ints[i].if_null, &v) != TS_OK ||
            fill_count(h, ints[i].hf, v, ints[i].key, ints[i].field) != TS_OK)
            return TS_ERR;
    }
    if (m->kv_lora_rank <= 0)
        return ts_fail("model.init: %s: kv_lora_rank = %d, but DeepseekV3ForCausalLM's attention "
                       "is multi-head latent attention (kv_lora_rank > 0)",
                       h->path, m->kv_lora_rank);
    /* MLA's keys and values come from kv_b_proj with one head per query head: a
     * num_key_value_heads other than num_attention_heads is no model transformers runs. */
    long long heads = ts_hf_int(h, root, "num_attention_heads"), kv = 0;
    if (heads < 0 || count_of(h, root, "num_key_value_heads", heads, heads, &kv) != TS_OK)
        return TS_ERR;
    if (heads > 0 && kv != heads)
        return ts_fail("model.init: %s: num_key_value_heads = %lld, but num_attention_heads = %lld: "
                       "multi-head latent attention has one key and value head per query head",
                       h->path, kv, heads);
    /* Tessera's MLA rotates adjacent pairs of the rope channels, as DeepSeek's checkpoints
     * are laid out (transformers' rope_interleave, default true). */
    bool interleave = true;
    if (bool_of(h, root, "rope_interleave", true, &interleave) != TS_OK) return TS_ERR;
    if (!interleave)
        return ts_fail("model.init: %s: rope_interleave = false (rotate the halves of each rope "
                       "head), but Tessera's multi-head latent attention rotates adjacent pairs, "
                       "as DeepSeek's checkpoints are laid out (rope_interleave = true)",
                       h->path);
    return TS_OK;
}

/* The router: scoring_func, topk_method, norm_topk_prob, routed_scaling_factor. */
static ts_status read_router(const ts_hf_reader *h, json_t *root)
{
    ts_model_config *m = &h->cfg->model;
    const char *score = "sigmoid";
    if (string_of(h, root, "scoring_func", "sigmoid", &score) != TS_OK) return TS_ERR;
    if (strcmp(score, "sigmoid") != 0 && strcmp(score, "softmax") != 0)
        return ts_fail("model.init: %s: scoring_func = \"%s\" is not a router Tessera has "
                       "(\"sigmoid\", DeepSeek-V3's; \"softmax\")",
                       h->path, score);
    if (!ts_hf_given(h, "model.moe_router"))
        snprintf(m->moe_router, sizeof m->moe_router, "%s", score);
    else if (strcmp(m->moe_router, score) != 0) {
        char a[40];
        snprintf(a, sizeof a, "\"%s\"", score);
        return ts_hf_disagree(h, "scoring_func", a, "model.moe_router", m->moe_router);
    }
    /* noaux_tc: the group-limited top-k over score + e_score_correction_bias, which is
     * what transformers' DeepseekV3 computes whatever topk_method says (the bias, absent
     * from the weights, is zero). DeepSeek-V2's greedy methods rank groups otherwise
     * (group_limited_greedy: a group by its best score) or not at all (greedy); either
     * is the same selection only when every group is kept. */
    const char *method = "noaux_tc";
    if (string_of(h, root, "topk_method", "noaux_tc", &method) != TS_OK) return TS_ERR;
    const bool greedy = !strcmp(method, "greedy") || !strcmp(method, "group_limited_greedy");
    if (strcmp(method, "noaux_tc") != 0 && !greedy)
        return ts_fail("model.init: %s: topk_method = \"%s\" is not one Tessera has "
                       "(\"noaux_tc\", DeepSeek-V3's group-limited top-k with the "
                       "e_score_correction_bias)",
                       h->path, method);
    if (greedy && m->moe_topk_groups != m->moe_groups)
        return ts_fail("model.init: %s: topk_method = \"%s\" (DeepSeek-V2's) with n_group = %d "
                       "and topk_group = %d: Tessera's group-limited routing ranks a group by "
                       "the sum of its top num_experts_per_tok / topk_group scores "
                       "(\"noaux_tc\", DeepSeek-V3's); set topk_method to \"noaux_tc\", or "
                       "topk_group = n_group to keep every group",
                       h->path, method, m->moe_groups, m->moe_topk_groups);
    bool norm = true;
    if (bool_of(h, root, "norm_topk_prob", true, &norm) != TS_OK ||
        ts_hf_fill_bool(h, "norm_topk_prob", norm, "model.moe_norm_topk", &m->moe_norm_topk) !=
            TS_OK)
        return TS_ERR;
    double scale = 2.5;
    return ts_hf_real(h, root, "routed_scaling_factor", &scale) < 0 ||
                   ts_hf_fill_real(h, "routed_scaling_factor", scale, "model.moe_route_scale",
                                   &m->moe_route_scale) != TS_OK
               ? TS_ERR
               : TS_OK;
}

/* DeepSeekMoE: the experts' counts and widths, the groups, the dense first blocks. Every
 * block from first_k_dense_replace on is MoE in transformers' DeepseekV3 (it does not
 * read moe_layer_freq); first_k_dense_replace >= num_hidden_layers is a dense model. */
static ts_status read_moe(const ts_hf_reader *h, json_t *root)
{
    ts_model_config *m = &h->cfg->model;
    long long first = 0, freq = 1;
    if (count_of(h, root, "first_k_dense_replace", 3, -1, &first) != TS_OK ||
        count_of(h, root, "moe_layer_freq", 1, 1, &freq) != TS_OK)
        return TS_ERR;
    if (freq != 1)
        return ts_fail("model.init: %s: moe_layer_freq = %lld: transformers' DeepseekV3 makes "
                       "every block from first_k_dense_replace on an MoE block (it does not "
                       "read moe_layer_freq; DeepSeek's own code would skip blocks); only 1 "
                       "says the same model to both",
                       h->path, freq);
    if (first >= m->n_layer) /* every block dense: no experts */
        return fill_count(h, "first_k_dense_replace (every block dense)", 0, "model.moe_experts",
                          &m->moe_experts);
    const struct {
        const char *hf;
        long long dflt, if_null;
        const char *key;
        int *field;
    } ints[] = {{"n_routed_experts", 256, -1, "model.moe_experts", &m->moe_experts},
                {"num_experts_per_tok", 8, -1, "model.moe_top_k", &m->moe_top_k},
                {"moe_intermediate_size", 2048, -1, "model.moe_ffn_hidden", &m->moe_ffn_hidden},
                {"n_shared_experts", 1, 0, "model.moe_shared_experts", &m->moe_shared_experts},
                {"n_group", 8, -1, "model.moe_groups", &m->moe_groups},
                {"topk_group", 4, -1, "model.moe_topk_groups", &m->moe_topk_groups},
                {"first_k_dense_replace", 3, -1, "model.moe_first_dense", &m->moe_first_dense}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        long long v = 0;
        if (count_of(h, root, ints[i].hf, ints[i].dflt, ints[i].if_null, &v) != TS_OK ||
            fill_count(h, ints[i].hf, v, ints[i].key, ints[i].field) != TS_OK)
            return TS_ERR;
    }
    if (fill_count(h, "moe_layer_freq", 1, "model.moe_every", &m->moe_every) != TS_OK)
        return TS_ERR;
    return read_router(h, root);
}

ts_status ts_hf_apply_deepseek(const ts_hf_reader *h, json_t *root)
{
    ts_model_config *m = &h->cfg->model;
    if (read_mla(h, root) != TS_OK || read_moe(h, root) != TS_OK) return TS_ERR;
    /* Multi-token prediction: DeepSeek's checkpoints store the modules as layers
     * num_hidden_layers + k; transformers 5 names the key num_mtp_layers in memory and
     * writes num_nextn_predict_layers. Absent (an older file): none. */
    const char *mtp_key = json_object_get(root, "num_nextn_predict_layers")
                              ? "num_nextn_predict_layers"
                              : "num_mtp_layers";
    long long mtp = 0;
    if (count_of(h, root, mtp_key, 0, 0, &mtp) != TS_OK) return TS_ERR;
    return fill_count(h, mtp_key, mtp, "model.mtp_layers", &m->mtp_layers);
}

/* HF's mscale rule (modeling_rope_utils): cos/sin times get_mscale(factor, mscale) /
 * get_mscale(factor, mscale_all_dim) when both are non-zero, else get_mscale(factor)
 * (mscale 1); the softmax times get_mscale(factor, mscale_all_dim)^2 when non-zero.
 * model.rope_mscale and rope_mscale_all_dim are read by the same rule (model/model.c), so
 * each is taken as given, absent or null being 0 (transformers' None: "not given"). */
static ts_status read_mscales(const ts_hf_reader *h, json_t *sc, const char *sc_key)
{
    ts_model_config *m = &h->cfg->model;
    double ms = 0.0, all = 0.0;
    char name[96];
    if (ts_hf_real(h, sc, "mscale", &ms) < 0 || ts_hf_real(h, sc, "mscale_all_dim", &all) < 0)
        return TS_ERR;
    snprintf(name, sizeof name, "%s.mscale", sc_key);
    if (ts_hf_fill_real(h, name, ms, "model.rope_mscale", &m->rope_mscale) != TS_OK)
        return TS_ERR;
    snprintf(name, sizeof name, "%s.mscale_all_dim", sc_key);
    return ts_hf_fill_real(h, name, all, "model.rope_mscale_all_dim", &m->rope_mscale_all_dim);
}

ts_status ts_hf_read_yarn(const ts_hf_reader *h, json_t *root, json_t *sc, const char *sc_key)
{
    ts_model_config *m = &h->cfg->model;
    char name[96];
    if (!ts_hf_given(h, "model.rope_type"))
        snprintf(m->rope_type, sizeof m->rope_type, "yarn");
    else if (strcmp(m->rope_type, "yarn") != 0)
        return ts_hf_disagree(h, sc_key, "YaRN (\"yarn\")", "model.rope_type", m->rope_type);
    if (json_object_get(sc, "attention_factor"))
        return ts_fail("model.init: %s: %s.attention_factor: an explicit cos/sin factor, which "
                       "Tessera derives from mscale and mscale_all_dim (model.rope_mscale, "
                       "rope_mscale_all_dim); remove it and give those",
                       h->path, sc_key);
    json_t *tr = json_object_get(sc, "truncate");
    if (tr && !json_is_true(tr))
        return ts_fail("model.init: %s: %s.truncate = false: Tessera's YaRN rounds the ramp's "
                       "ends to whole dimensions (transformers' default, DeepSeek-V3's)",
                       h->path, sc_key);
    const long long orig = ts_hf_int(h, sc, "original_max_position_embeddings");
    snprintf(name, sizeof name, "%s.original_max_position_embeddings", sc_key);
    if (orig < 0) return TS_ERR;
    if (orig == 0) return ts_fail("model.init: %s: \"%s\" is missing", h->path, name);
    if (ts_hf_fill_int(h, name, orig, "model.rope_original_context", &m->rope_original_context,
                       m->rope_original_context) != TS_OK)
        return TS_ERR;
    /* No factor: transformers takes max_position_embeddings / the original context. */
    double factor = 0.0;
    snprintf(name, sizeof name, "%s.factor", sc_key);
    const int got = ts_hf_real(h, sc, "factor", &factor);
    if (got < 0) return TS_ERR;
    if (got == 0) {
        const long long maxpos = ts_hf_int(h, root, "max_position_embeddings");
        if (maxpos <= 0)
            return maxpos < 0 ? TS_ERR
                              : ts_fail("model.init: %s: \"%s\" is missing (and no "
                                        "max_position_embeddings to derive it from)",
                                        h->path, name);
        factor = (double)maxpos / (double)orig;
        snprintf(name, sizeof name, "max_position_embeddings / %s.original_max_position_embeddings",
                 sc_key);
    }
    if (ts_hf_fill_real(h, name, factor, "model.rope_scaling", &m->rope_scaling) != TS_OK)
        return TS_ERR;
    /* beta_fast, beta_slow: transformers' `or` defaults (absent, null or 0: 32 and 1). */
    const struct {
        const char *hf, *key;
        double dflt, *field;
    } betas[] = {{"beta_fast", "model.rope_beta_fast", 32.0, &m->rope_beta_fast},
                 {"beta_slow", "model.rope_beta_slow", 1.0, &m->rope_beta_slow}};
    for (size_t i = 0; i < 2; i++) {
        double v = 0.0;
        if (ts_hf_real(h, sc, betas[i].hf, &v) < 0) return TS_ERR;
        if (v == 0.0) v = betas[i].dflt;
        snprintf(name, sizeof name, "%s.%s", sc_key, betas[i].hf);
        if (ts_hf_fill_real(h, name, v, betas[i].key, betas[i].field) != TS_OK) return TS_ERR;
    }
    return read_mscales(h, sc, sc_key);
}
