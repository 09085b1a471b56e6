/* The DeepSeek-V3 keys' rules (docs/CONTRACT.md "Model"): multi-head latent attention
 * (model.q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim),
 * rope_scaling's kind (model.rope_type and YaRN's fields) and multi-token prediction
 * (model.mtp_layers, train.mtp_loss), checked against each other and the rest of the
 * config after ts_config_validate's own checks. Nothing here prints. */
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
    /* Being built (issue 41): refused by key until the model runs them. */
    if (m->kv_lora_rank > 0)
        return ts_fail("config key 'model.kv_lora_rank' = %d: multi-head latent attention is "
                       "not built yet",
                       m->kv_lora_rank);
    if (m->mtp_layers > 0)
        return ts_fail("config key 'model.mtp_layers' = %d: multi-token prediction is not "
                       "built yet",
                       m->mtp_layers);
    if (strcmp(m->rope_type, "yarn") == 0)
        return ts_fail("config key 'model.rope_type' = \"yarn\": YaRN is not built yet");
    return TS_OK;
}
