/* Keys that matter only beside another key's value (docs/CONTRACT.md "Model" and
 * "Training": no key is accepted and ignored): a config file or --set that gives one
 * where the rest of the config leaves it inert is refused, naming it and the key that
 * would make it matter. Their defaults are ordinary values (model.rope_beta_fast 32,
 * train.mtp_loss 0.1), so whether a key was given cannot be read from the value: the
 * loader asks its parsed file and overrides (ts_config_load's `given`). A value a Hugging
 * Face config.json filled was not given (DeepSeek-V3's config.json always carries YaRN's
 * fields): an import never makes a config fail here. Nothing here prints. */
#include "config/config_internal.h"

#include <stdio.h>
#include <string.h>

static bool scaled(const ts_config *c) { return c->model.rope_scaling > 0.0; }
static bool yarn(const ts_config *c)
{
    return scaled(c) && strcmp(c->model.rope_type, "yarn") == 0;
}
static bool llama3(const ts_config *c) { return scaled(c) && !yarn(c); }
/* transformers (and model/model.c) read mscale only when mscale_all_dim is non-zero too. */
static bool yarn_mscale(const ts_config *c)
{
    return yarn(c) && c->model.rope_mscale_all_dim != 0.0;
}
static bool mtp(const ts_config *c) { return c->model.mtp_layers > 0; }
static bool muon(const ts_config *c) { return ts_config_muon(&c->train); }
static bool documents(const ts_config *c) { return c->data.document_mask; }

static bool hellaswag(const ts_config *c) { return c->data.hellaswag[0] != '\0'; }
static void here_hellaswag(const ts_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "data.hellaswag = \"%s\"", c->data.hellaswag);
}

static void here_rope(const ts_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "model.rope_type = \"%s\", model.rope_scaling = %g", c->model.rope_type,
             c->model.rope_scaling);
}
static void here_mscale(const ts_config *c, char *buf, size_t cap)
{
    here_rope(c, buf, cap);
    const size_t n = strlen(buf);
    snprintf(buf + n, cap - n, ", model.rope_mscale_all_dim = %g", c->model.rope_mscale_all_dim);
}
static bool spikes(const ts_config *c) { return c->train.skip_spikes > 0.0; }
static void here_spikes(const ts_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "train.skip_spikes = %g", c->train.skip_spikes);
}
static void here_mtp(const ts_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "model.mtp_layers = %d", c->model.mtp_layers);
}
static bool stragglers(const ts_config *c) { return c->log.straggler_every > 0; }
static void here_stragglers(const ts_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "log.straggler_every = %d", c->log.straggler_every);
}
static void here_documents(const ts_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "data.document_mask = %s", c->data.document_mask ? "true" : "false");
}
static void here_optimizer(const ts_config *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "train.optimizer = \"%s\"", c->train.optimizer);
}

typedef struct {
    const char *key;                      /* "model.rope_beta_fast" */
    const char *whose;                    /* "YaRN's" */
    bool (*matters)(const ts_config *c);  /* whether the rest of the config reads it */
    const char *needs;                    /* what makes it matter */
    void (*here)(const ts_config *c, char *buf, size_t cap);
} inert_rule;

#define YARN_NEEDS "model.rope_type = \"yarn\" and model.rope_scaling > 0"
static const inert_rule RULES[] = {
    {"model.rope_beta_fast", "YaRN's", yarn, YARN_NEEDS, here_rope},
    {"model.rope_beta_slow", "YaRN's", yarn, YARN_NEEDS, here_rope},
    {"model.rope_mscale", "YaRN's", yarn_mscale, YARN_NEEDS " and model.rope_mscale_all_dim > 0 "
     "(YaRN reads mscale only beside mscale_all_dim, as transformers does)", here_mscale},
    {"model.rope_mscale_all_dim", "YaRN's", yarn, YARN_NEEDS, here_rope},
    {"model.rope_low_freq_factor", "Llama 3.1's rope scaling's", llama3,
     "model.rope_scaling > 0 and model.rope_type = \"llama3\"", here_rope},
    {"model.rope_high_freq_factor", "Llama 3.1's rope scaling's", llama3,
     "model.rope_scaling > 0 and model.rope_type = \"llama3\"", here_rope},
    {"model.rope_original_context", "rope scaling's (Llama 3.1's or YaRN's original context)",
     scaled, "model.rope_scaling > 0", here_rope},
    /* rope_type = "yarn" without a factor: ts_config_validate_mla refuses it first. */
    {"model.rope_type", "the kind of rope scaling", scaled, "model.rope_scaling > 0", here_rope},
    {"train.mtp_loss", "multi-token prediction's weight", mtp, "model.mtp_layers > 0",
     here_mtp},
    {"train.muon_momentum", "Muon's", muon, "train.optimizer = \"muon\"", here_optimizer},
    {"train.muon_nesterov", "Muon's", muon, "train.optimizer = \"muon\"", here_optimizer},
    {"train.muon_ns_steps", "Muon's", muon, "train.optimizer = \"muon\"", here_optimizer},
    {"train.muon_coefficients", "Muon's", muon, "train.optimizer = \"muon\"", here_optimizer},
    {"train.muon_scale", "Muon's", muon, "train.optimizer = \"muon\"", here_optimizer},
    {"train.spike_window", "the spike guard's window", spikes, "train.skip_spikes > 0",
     here_spikes},
    {"log.straggler_threshold", "the straggler report's", stragglers,
     "log.straggler_every > 0", here_stragglers},
    {"data.document_token", "the packed documents' start token", documents,
     "data.document_mask = true", here_documents},
    {"data.hellaswag_items", "HellaSwag's item count", hellaswag, "data.hellaswag set",
     here_hellaswag},
};
#undef YARN_NEEDS

/* The key's value as the config holds it, for the message. */
static void value_of(const ts_config *cfg, const char *key, char *buf, size_t cap)
{
    for (int i = 0; i < ts_config_n_keys; i++) {
        const key_spec *k = &ts_config_keys[i];
        const size_t sl = strlen(k->section);
        if (strncmp(key, k->section, sl) != 0 || key[sl] != '.' || strcmp(key + sl + 1, k->name))
            continue;
        const void *p = cfield_ptr(cfg, k);
        switch (k->kind) {
        case K_INT: snprintf(buf, cap, "%d", *(const int *)p); return;
        case K_FLOAT: snprintf(buf, cap, "%g", *(const double *)p); return;
        case K_STR: snprintf(buf, cap, "\"%s\"", (const char *)p); return;
        case K_BOOL: snprintf(buf, cap, "%s", *(const bool *)p ? "true" : "false"); return;
        default: break;
        }
    }
    TS_ASSERT(!"an inert rule names a key of another kind");
}

ts_status ts_config_check_inert(const ts_config *cfg, ts_config_key_given_fn given, void *ctx)
{
    for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++) {
        const inert_rule *r = &RULES[i];
        if (!given(ctx, r->key) || r->matters(cfg)) continue;
        char value[64], here[192];
        value_of(cfg, r->key, value, sizeof value);
        r->here(cfg, here, sizeof here);
        return ts_fail("config key '%s' = %s is %s; it matters only with %s (here %s), so it "
                       "would be ignored; remove it or change that",
                       r->key, value, r->whose, r->needs, here);
    }
    return TS_OK;
}
