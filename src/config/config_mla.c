/* The DeepSeek-V3 keys' rules (docs/CONTRACT.md "Model"): multi-head latent attention
 * (model.q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim),
 * and rope_scaling's kind (model.rope_type and YaRN's fields), checked against each
 * other and the rest of the config after ts_config_validate's own checks (multi-token
 * prediction's are config_mtp.c's). Nothing here prints. */
#include "config/config_internal.h"

#include <stdio.h>
#include <string.h>

static const char *const ROPE_TYPES[] = { "llama3", "yarn" };

ts_status ts_config_check_rope_type(const key_spec *k, const ts_config *cfg, const char *where)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    for (int i = 0; i < 2; i++)
        if (strcmp(v, ROPE_TYPES[i]) == 0) return TS_OK;
    return ts_fail("config key 'model.rope_type' = \"%s\"%s is not a rope scaling; choose "
                   "\"llama3\" (Llama 3.1's frequency bands) or \"yarn\" (DeepSeek-V3's YaRN)",
                   v, where);
}

ts_status ts_config_validate_mla(const ts_config *cfg)
{
    const ts_model_config *m = &cfg->model;
    const bool yarn = strcmp(m->rope_type, "yarn") == 0;
    if (m->kv_lora_rank > 0) {
        if (ts_model_arch(m) != TS_ARCH_LLAMA)
            return ts_fail("config key 'model.kv_lora_rank' = %d: multi-head latent attention "
                           "is the llama family's (model.arch = \"llama\"), not %s",
                           m->kv_lora_rank, m->arch);
        if (m->qk_rope_head_dim <= 0 || m->qk_rope_head_dim % 2 != 0)
            return ts_fail("config key 'model.qk_rope_head_dim' = %d: MLA needs a positive, even "
                           "rope head dim (DeepSeek-V3: 64)",
                           m->qk_rope_head_dim);
        if (m->v_head_dim <= 0)
            return ts_fail("config key 'model.v_head_dim' = %d: MLA needs the value head dim "
                           "(DeepSeek-V3: 128)",
                           m->v_head_dim);
        if (m->head_dim != 0)
            return ts_fail("config key 'model.head_dim' = %d: under MLA (model.kv_lora_rank > 0) "
                           "the head dims are qk_nope_head_dim + qk_rope_head_dim and v_head_dim; "
                           "leave head_dim unset",
                           m->head_dim);
        if (m->n_kv_head != 0 && m->n_kv_head != m->n_head)
            return ts_fail("config key 'model.n_kv_head' = %d: MLA has one key and value head per "
                           "query head (n_head = %d); leave n_kv_head unset",
                           m->n_kv_head, m->n_head);
        if (m->qk_norm)
            return ts_fail("config key 'model.qk_norm' = true: MLA normalises its latents, not "
                           "its heads; qk_norm is Qwen3's");
    } else {
        const struct { const char *key; int v; } mla[] = {
            {"model.q_lora_rank", m->q_lora_rank},
            {"model.qk_nope_head_dim", m->qk_nope_head_dim},
            {"model.qk_rope_head_dim", m->qk_rope_head_dim},
            {"model.v_head_dim", m->v_head_dim}};
        for (size_t i = 0; i < sizeof mla / sizeof mla[0]; i++)
            if (mla[i].v != 0)
                return ts_fail("config key '%s' = %d is multi-head latent attention's; it needs "
                               "model.kv_lora_rank > 0",
                               mla[i].key, mla[i].v);
    }
    /* YaRN is a kind of rope_scaling: without its factor the key would change nothing. */
    if (yarn && m->rope_scaling == 0.0)
        return ts_fail("config key 'model.rope_type' = \"yarn\" needs model.rope_scaling (YaRN's "
                       "factor, >= 1; DeepSeek-V3: 40); without it RoPE is unscaled");
    if (yarn && m->rope_scaling > 0.0 && m->rope_scaling < 1.0)
        return ts_fail("config key 'model.rope_scaling' = %g: YaRN's factor is >= 1",
                       m->rope_scaling);
    return TS_OK;
}
