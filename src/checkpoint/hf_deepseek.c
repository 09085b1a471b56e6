/* config.json of a multi-head latent attention model (layout.h ts_ckpt_hf_config):
 * transformers' DeepseekV3ForCausalLM's, so from_pretrained reads a Tessera checkpoint of
 * DeepSeek-V3's shape (its tensors already carry DeepSeek's names: MLA's self_attn.*, the
 * MoE's mlp.gate / mlp.experts.j / mlp.shared_experts, each MoE block's
 * mlp.gate.e_score_correction_bias, MTP's layers num_hidden_layers + k, which transformers
 * ignores). config_hf_deepseek.c reads the same keys back. */
#include <string.h>

#include "checkpoint/layout.h"
#include "core/error.h"

/* Does DeepseekV3ForCausalLM compute this model? Its router scores by sigmoid and ranks a
 * group by the sum of its top 2 scores, every block from first_k_dense_replace on is MoE
 * with no capacity and a shared expert (with n_shared_experts 0 it builds zero-width ones,
 * which from_pretrained reports missing). (YaRN's mscales follow transformers' rule in
 * Tessera too: model/model.c.) */
static bool deepseek_expresses(const ts_model_config *mc)
{
    if (mc->qk_norm) return false;
    if (mc->moe_experts == 0 || mc->moe_first_dense >= mc->n_layer) return true;
    const int per_group = mc->moe_groups > 0 ? mc->moe_experts / mc->moe_groups : 0;
    return !strcmp(mc->moe_router, "sigmoid") && mc->moe_every == 1 &&
           mc->moe_capacity == 0.0 && per_group >= 2 && mc->moe_shared_experts > 0 &&
           (mc->moe_topk_groups >= mc->moe_groups || mc->moe_top_k == 2 * mc->moe_topk_groups);
}

static json_t *rope_scaling(const ts_model_config *mc)
{
    if (mc->rope_scaling == 0.0) return json_null();
    if (!strcmp(mc->rope_type, "yarn"))
        return json_pack("{s:s, s:f, s:i, s:f, s:f, s:f, s:f}", "rope_type", "yarn", "factor",
                         mc->rope_scaling, "original_max_position_embeddings",
                         mc->rope_original_context, "beta_fast", mc->rope_beta_fast, "beta_slow",
                         mc->rope_beta_slow, "mscale", mc->rope_mscale, "mscale_all_dim",
                         mc->rope_mscale_all_dim);
    return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                     mc->rope_scaling, "low_freq_factor", mc->rope_low_freq_factor,
                     "high_freq_factor", mc->rope_high_freq_factor,
                     "original_max_position_embeddings", mc->rope_original_context);
}

json_t *ts_ckpt_hf_config_deepseek(const ts_model_config *mc)
{
    if (!deepseek_expresses(mc)) return NULL;
    /* A dense model: every block before first_k_dense_replace (the MoE keys then name
     * nothing transformers builds). */
    const bool moe = mc->moe_experts > 0 && mc->moe_first_dense < mc->n_layer;
    json_t *root = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:i, s:i, s:i, s:i}",
        "architectures", "DeepseekV3ForCausalLM", "model_type", "deepseek_v3", "vocab_size",
        mc->vocab_size, "hidden_size", mc->n_embd, "intermediate_size", ts_model_ffn(mc),
        "num_hidden_layers", mc->n_layer, "num_attention_heads", mc->n_head,
        "num_key_value_heads", mc->n_head, "q_lora_rank",
        mc->q_lora_rank > 0 ? json_integer(mc->q_lora_rank) : json_null(), "kv_lora_rank",
        mc->kv_lora_rank, "qk_nope_head_dim", mc->qk_nope_head_dim, "qk_rope_head_dim",
        mc->qk_rope_head_dim, "v_head_dim", mc->v_head_dim);
    TS_ASSERT(root != NULL);
    json_t *more = json_pack(
        "{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f, s:s, s:s, s:i, s:i, s:f, s:f, "
        "s:o, s:b, s:b, s:s, s:b, s:f, s:s}",
        "n_routed_experts", moe ? mc->moe_experts : 1, "num_experts_per_tok",
        moe ? mc->moe_top_k : 1, "moe_intermediate_size", moe ? mc->moe_ffn_hidden : ts_model_ffn(mc),
        "n_shared_experts", moe ? mc->moe_shared_experts : 0, "n_group", moe ? mc->moe_groups : 1,
        "topk_group", moe ? mc->moe_topk_groups : 1, "first_k_dense_replace",
        moe ? mc->moe_first_dense : mc->n_layer, "moe_layer_freq", 1, "norm_topk_prob",
        (int)mc->moe_norm_topk, "routed_scaling_factor", mc->moe_route_scale, "scoring_func",
        "sigmoid", "topk_method", "noaux_tc", "num_nextn_predict_layers", mc->mtp_layers,
        "max_position_embeddings", mc->seq_len, "rms_norm_eps", mc->norm_eps, "rope_theta",
        mc->rope_theta, "rope_scaling", rope_scaling(mc), "rope_interleave", 1,
        "tie_word_embeddings", (int)ts_model_tied(mc), "hidden_act", "silu", "attention_bias", 0,
        "attention_dropout", 0.0, "torch_dtype", "float32");
    TS_ASSERT(more != NULL);
    json_object_update(root, more);
    json_decref(more);
    return root;
}
