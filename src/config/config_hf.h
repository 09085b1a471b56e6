/* model.init's Hugging Face config.json, inside the config module: the reader that
 * config_hf.c (the Llama family: Llama, Qwen3, Mixtral, Qwen3-MoE) and
 * config_hf_deepseek.c (DeepSeek-V3 and Kimi K2) share. Each fill_ function takes
 * config.json's value into the model key when the config file and --set leave that key
 * unset, and compares it with the key's value otherwise (a disagreement is an error
 * naming both keys and both values). Nothing here prints. */
#ifndef TS_CONFIG_HF_H
#define TS_CONFIG_HF_H

#include <jansson.h>

#include "config/config_internal.h"

typedef struct {
    ts_config *cfg;
    const char *path; /* the config.json */
    ts_config_key_given_fn given;
    void *ctx;
} ts_hf_reader;

/* Whether the config file or --set gave `key` ("model.n_head"). */
bool ts_hf_given(const ts_hf_reader *h, const char *key);
/* "model.init: PATH gives HF_KEY = HF_VAL, but the config sets KEY = VAL; ..." */
ts_status ts_hf_disagree(const ts_hf_reader *h, const char *hf_key, const char *hf_val,
                         const char *key, const char *val);
/* A positive integer of config.json (a real with an integral value too, as Python may
 * write one); 0 when absent or null; -1 (an error set) when it is something else. */
long long ts_hf_int(const ts_hf_reader *h, json_t *root, const char *hf_key);
/* A finite real of config.json: 1 found (in *out), 0 absent or null, -1 an error set. */
int ts_hf_real(const ts_hf_reader *h, json_t *root, const char *hf_key, double *out);
/* An int key: `want` (<= 0: nothing to do) into *field, or compared with `have` (the
 * key's resolved value). */
ts_status ts_hf_fill_int(const ts_hf_reader *h, const char *hf_key, long long want,
                         const char *key, int *field, int have);
/* A real key, compared to 1e-6 relative (a value written from float32 is the same). */
ts_status ts_hf_fill_real(const ts_hf_reader *h, const char *hf_key, double want,
                          const char *key, double *field);
ts_status ts_hf_fill_bool(const ts_hf_reader *h, const char *hf_key, bool want,
                          const char *key, bool *field);

/* config_hf_deepseek.c: a DeepseekV3ForCausalLM's keys over the Llama ones (model_type
 * "deepseek_v3" or Kimi K2's "kimi_k2"): multi-head latent attention, DeepSeekMoE's
 * routing, dense first blocks, multi-token prediction; absent keys take transformers'
 * DeepseekV3Config defaults (DeepSeek-V3 671B's values), as from_pretrained would. */
ts_status ts_hf_apply_deepseek(const ts_hf_reader *h, json_t *root);
/* YaRN's rope_scaling / rope_parameters object `sc` (named `sc_key` in messages) into
 * model.rope_type "yarn", rope_scaling (factor), rope_original_context, rope_beta_fast,
 * rope_beta_slow, rope_mscale, rope_mscale_all_dim; `root` for max_position_embeddings
 * (transformers' factor when the object has none). */
ts_status ts_hf_read_yarn(const ts_hf_reader *h, json_t *root, json_t *sc, const char *sc_key);

#endif
