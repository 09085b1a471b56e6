/* What the config files share, private to src/config: the table of known keys
 * (config_keys.c) and the per-key checks (config_validate.c), which reading a setting
 * (config_load.c) and ts_config_validate both run. Not for use outside config/. */
#ifndef TS_CONFIG_INTERNAL_H
#define TS_CONFIG_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include <libconfig.h>

#include "config/config.h"

/* K_SHARDS: data.train (paths, or a blend of groups); K_PATHS: data.val (a path or a
 * list of them).
 * K_TRIBOOL: a boolean key whose default depends on the architecture, stored as an int:
 * 1 true, -1 false, 0 not set (model.tie_embeddings; ts_model_tied resolves it). */
typedef enum { K_INT, K_INT64, K_FLOAT, K_BOOL, K_TRIBOOL, K_STR, K_PARTITION, K_SHARDS,
               K_PATHS } key_kind;

typedef struct key_spec key_spec;
/* Extra per-key check on the value already stored in cfg; `where` is "" or
 * " (file:line)". */
typedef ts_status (*key_check)(const key_spec *k, const ts_config *cfg, const char *where);

struct key_spec {
    const char *section, *name;
    key_kind kind;
    size_t offset;   /* of the field in ts_config */
    size_t size;     /* K_STR: capacity of the char array */
    double lo, hi;   /* numeric range */
    bool lo_open, hi_open;
    key_check check; /* enumerations and other per-key rules; NULL = none */
};

/* An integer key's upper bound meaning "any int" (not printed in range messages). */
#define BIG ((double)INT_MAX)

/* ---- config_keys.c: every known key (in the order of the JSON output and of the
 * "known keys" lists) and the sections, in order. */
extern const key_spec ts_config_keys[];
extern const int ts_config_n_keys;
extern const char *const ts_config_sections[];
extern const int ts_config_n_sections;

static inline void *field_ptr(ts_config *cfg, const key_spec *k)
{
    return (char *)cfg + k->offset;
}
static inline const void *cfield_ptr(const ts_config *cfg, const key_spec *k)
{
    return (const char *)cfg + k->offset;
}

/* ---- config_validate.c: the per-key checks of the table's enumerations and other
 * rules, and the range and contents checks every key gets. */
ts_status ts_config_check_arch(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_tokenizer(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_schedule(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_recompute(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_order(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_progress(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_device(const key_spec *k, const ts_config *cfg, const char *where);
/* Whether ts_config_load_plan is loading (config_load.c). */
bool ts_config_planning(void);
ts_status ts_config_check_precision(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_attention(const key_spec *k, const ts_config *cfg, const char *where);
/* The marker of an integer key that also takes "auto" (stored as 0 until ts_config_load
 * resolves it): parallel.dp. Always TS_OK. */
ts_status ts_config_allow_auto(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_lr_schedule(const key_spec *k, const ts_config *cfg,
                                       const char *where);
ts_status ts_config_check_on_nonfinite(const key_spec *k, const ts_config *cfg,
                                        const char *where);
ts_status ts_config_check_comm(const key_spec *k, const ts_config *cfg, const char *where);

/* ---- config_moe.c: model.moe_router's values, and the relations between the MoE keys
 * (model.moe_*, model.qk_norm, train.moe_*, parallel.ep/etp) and the rest, which
 * ts_config_validate runs after its own (each a ts_fail message naming the keys). */
ts_status ts_config_check_moe_router(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_validate_moe(const ts_config *cfg);
/* config_mla.c: MLA, YaRN and MTP's rules; model.rope_type's values. */
ts_status ts_config_validate_mla(const ts_config *cfg);
/* config_mtp.c: multi-token prediction's rules (model.mtp_layers, train.mtp_loss). */
ts_status ts_config_validate_mtp(const ts_config *cfg);
/* Muon's keys (config_muon.c): the optimizer and its choices, then their relations. */
ts_status ts_config_check_optimizer(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_check_muon_coefficients(const key_spec *k, const ts_config *cfg,
                                            const char *where);
ts_status ts_config_check_muon_scale(const key_spec *k, const ts_config *cfg, const char *where);
ts_status ts_config_validate_muon(const ts_config *cfg);
/* config_spike.c: the spike guard's threshold against its window. */
ts_status ts_config_validate_spikes(const ts_config *cfg);
ts_status ts_config_check_rope_type(const key_spec *k, const ts_config *cfg, const char *where);

/* ---- config_hf.c: model.init's Hugging Face config.json (beside the weights: in the
 * directory model.init names, or beside its file), when there is one and it is a Llama's
 * (model_type "llama"): each model key it gives (docs/CONTRACT.md, model.init) that the
 * config file and --set leave unset takes its value, and one they set must agree, or
 * the error names both keys and values. given(ctx, "model.n_head") says whether the file
 * or --set gave a key. No config.json: nothing changes. */
typedef bool (*ts_config_key_given_fn)(void *ctx, const char *key);
ts_status ts_config_from_hf(ts_config *cfg, ts_config_key_given_fn given, void *ctx);
/* config_inert.c: a key the file or --set gave (given(ctx, key)) that the rest of the
 * config leaves inert (YaRN's keys without rope_type "yarn", Llama 3.1's without its
 * scaling, train.mtp_loss without mtp_layers, ...) is a ts_fail message naming it and
 * the key that would make it matter. Run on the loaded, valid config. */
ts_status ts_config_check_inert(const ts_config *cfg, ts_config_key_given_fn given, void *ctx);

/* Is v inside k's numeric range? */
bool ts_config_in_range(const key_spec *k, double v);
/* "config key 's.k' = VALUE (where) is out of range: it must be RANGE". */
ts_status ts_config_range_error(const key_spec *k, const char *value, const char *where);
/* Check one key's stored value: range, allowed values, list contents. Used when a key
 * is read (where = its file:line) and by ts_config_validate for every key. */
ts_status ts_config_check_value(const key_spec *k, const ts_config *cfg, const char *where);

/* ---- config_spelling.c: an unknown key or section, as a ts_fail message naming it,
 * where it was written (`where`: " (file:line)" or " (from --set)"), a spelling hint
 * when one is close, and the known names. Returns TS_ERR. */
ts_status ts_config_unknown_key(const char *section, const char *name, const char *where);
ts_status ts_config_unknown_section(const char *name, const char *where);

/* ---- config_override.c: one `--set KEY=VALUE` override grafted into lc's tree, the
 * value parsed as libconfig parses one, else taken as a bare string (a malformed
 * override or an invalid key is a ts_fail message naming it). */
ts_status ts_config_apply_override(config_t *lc, const char *ov);
/* "a group", "an integer", ... for a libconfig setting type. */
const char *ts_config_type_name(int type);
/* libconfig 1.5 reads a decimal integer literal that does not fit in 32 bits and has
 * no `L` suffix as its low 32 bits, and one beyond 64 bits as INT64_MAX, both silently.
 * The first such literal in libconfig text, outside strings and comments: its line
 * (from 1), copied to tok, *beyond_64 set (else a 32-bit overflow without `L`); 0 when
 * there is none. */
int ts_config_find_wide_int(const char *text, char *tok, size_t cap, bool *beyond_64);
/* "WHERE: the integer TOK does not fit in 64 bits ...": the error for a beyond_64 one. */
ts_status ts_config_huge_int_error(const char *where, const char *tok);

/* data.document_mask's relations (config_documents.c): a document token the vocabulary
 * holds, given when model.tokenizer has none. */
ts_status ts_config_validate_documents(const ts_config *cfg);

#endif
