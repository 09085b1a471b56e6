/* Muon's keys (train.optimizer and train.muon_*; docs/CONTRACT.md "### train" and
 * "Optimizer"): the enumerations, the number of Newton-Schulz steps each coefficient set
 * runs, and the relations to the rest of the config, checked after ts_config_validate's
 * own checks. The coefficients themselves live with the iteration (optim/muon.c).
 * Nothing here prints. */
#include "config/config_internal.h"

#include <string.h>

static ts_status check_one_of(const key_spec *k, const ts_config *cfg, const char *where,
                              const char *const *values, int n, const char *choices)
{
    const char *v = (const char *)cfield_ptr(cfg, k);
    for (int i = 0; i < n; i++)
        if (strcmp(v, values[i]) == 0) return TS_OK;
    return ts_fail("config key '%s.%s' = \"%s\"%s is not a choice; %s", k->section, k->name, v,
                   where, choices);
}

static const char *const OPTIMIZERS[] = { "adamw", "muon" };

ts_status ts_config_check_optimizer(const key_spec *k, const ts_config *cfg, const char *where)
{
    return check_one_of(k, cfg, where, OPTIMIZERS, 2,
                        "choose \"adamw\" (every parameter, the default) or \"muon\" (Muon on "
                        "the blocks' matrices, AdamW on the embedding, head, norms and biases)");
}

static const char *const COEFFICIENT_SETS[] = { "torch", "quintic", "deepseek_v4" };

ts_status ts_config_check_muon_coefficients(const key_spec *k, const ts_config *cfg,
                                            const char *where)
{
    return check_one_of(k, cfg, where, COEFFICIENT_SETS, 3,
                        "choose \"torch\" ((3.4445, -4.7750, 2.0315) every step, the "
                        "default), \"quintic\" (a tuple per step, the last reused) or "
                        "\"deepseek_v4\" (8 torch steps, then 2 of (2, -1.5, 0.5))");
}

static const char *const SCALES[] = { "match_rms_adamw", "original" };

ts_status ts_config_check_muon_scale(const key_spec *k, const ts_config *cfg, const char *where)
{
    return check_one_of(k, cfg, where, SCALES, 2,
                        "choose \"match_rms_adamw\" (0.2 * sqrt(max(rows, cols)), Moonlight's, "
                        "the default) or \"original\" (sqrt(max(1, rows / cols)))");
}

bool ts_config_muon(const ts_train_config *t)
{
    return strcmp(t->optimizer, "muon") == 0;
}

int ts_config_muon_ns_steps(const ts_train_config *t)
{
    if (t->muon_ns_steps > 0) return t->muon_ns_steps;
    return strcmp(t->muon_coefficients, "deepseek_v4") == 0 ? 10 : 5;
}

/* DeepSeek-V4's hybrid is its fixed 8 + 2 steps. Every grid runs Muon (data/muon_dist.h);
 * train.allow_optimizer_change is the checkpoint load's (checkpoint/restore.c). */
ts_status ts_config_validate_muon(const ts_config *cfg)
{
    const ts_train_config *t = &cfg->train;
    /* Under AdamW a given muon_* key is refused by config_inert.c's rules. */
    if (!ts_config_muon(t)) return TS_OK;
    if (strcmp(t->muon_coefficients, "deepseek_v4") == 0 && t->muon_ns_steps != 0 &&
        t->muon_ns_steps != 10)
        return ts_fail("config key 'train.muon_ns_steps' = %d: train.muon_coefficients = "
                       "\"deepseek_v4\" is DeepSeek-V4's hybrid of 8 steps with (3.4445, "
                       "-4.7750, 2.0315) then 2 with (2, -1.5, 0.5), 10 in all; remove "
                       "muon_ns_steps (or set it to 10), or choose \"torch\" or \"quintic\"",
                       t->muon_ns_steps);
    return TS_OK;
}
