/* model.init_upcycle's names: which dense tensor each parameter of an MoE model starts
 * from (upcycle.h). Only names: load.c reads and checks the values. */
#include "checkpoint/upcycle.h"

#include <stdio.h>
#include <string.h>

/* The dense MLP's three tensors and the experts' names for each: Qwen3-MoE's and
 * DeepSeek's (the dense names), Mixtral's w1, w3, w2. */
static const struct {
    const char *dense, *mixtral;
} MLP[] = {{"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};

/* Block b's MoE prefix, "model.layers.{b}.mlp." or Mixtral's
 * "model.layers.{b}.block_sparse_moe.", where `name` has one: its length, else 0. */
static size_t moe_prefix(const char *name, int *block)
{
    int b = -1, used = 0;
    if (sscanf(name, "model.layers.%d.%n", &b, &used) != 1 || used == 0 || b < 0) return 0;
    const char *rest = name + used;
    *block = b;
    if (!strncmp(rest, "mlp.", 4)) return (size_t)used + 4;
    if (!strncmp(rest, "block_sparse_moe.", 17)) return (size_t)used + 17;
    return 0;
}

/* Whether block b (from 0) is an MoE block of m (its layer is b + 1). */
static bool is_moe_block(const ts_model *m, int b)
{
    return b >= 0 && b < m->n_layer && m->layers[b + 1].moe;
}

ts_upcycle_source ts_upcycle_source_of(const ts_model *m, int p, char *dense, size_t cap)
{
    const char *name = ts_param_name(m, p);
    int b = -1;
    const size_t at = moe_prefix(name, &b);
    if (!at || !is_moe_block(m, b)) return TS_UPCYCLE_BY_NAME;
    const char *rest = name + at;
    if (!strcmp(rest, "gate.weight")) return TS_UPCYCLE_FRESH;
    if (!m->params[p].expert) return TS_UPCYCLE_REFUSED; /* the shared experts */
    /* "experts.{j}.{role}.weight" (model.c add_moe_params) */
    int used = 0;
    long j = -1;
    if (sscanf(rest, "experts.%ld.%n", &j, &used) != 1 || used == 0) return TS_UPCYCLE_REFUSED;
    const char *role = rest + used;
    for (size_t i = 0; i < sizeof MLP / sizeof MLP[0]; i++) {
        const size_t d = strlen(MLP[i].dense), x = strlen(MLP[i].mixtral);
        const bool named = (!strncmp(role, MLP[i].dense, d) && !strcmp(role + d, ".weight")) ||
                           (!strncmp(role, MLP[i].mixtral, x) && !strcmp(role + x, ".weight"));
        if (named) {
            snprintf(dense, cap, "model.layers.%d.mlp.%s.weight", b, MLP[i].dense);
            return TS_UPCYCLE_FROM_MLP;
        }
    }
    return TS_UPCYCLE_REFUSED;
}

bool ts_upcycle_is_dense_mlp(const ts_model *m, const char *name)
{
    int b = -1;
    const size_t at = moe_prefix(name, &b);
    if (!at || strncmp(name + at - 4, "mlp.", 4) != 0 || !is_moe_block(m, b)) return false;
    for (size_t i = 0; i < sizeof MLP / sizeof MLP[0]; i++) {
        const size_t d = strlen(MLP[i].dense);
        if (!strncmp(name + at, MLP[i].dense, d) && !strcmp(name + at + d, ".weight")) return true;
    }
    return false;
}
