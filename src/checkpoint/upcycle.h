/* Upcycling (model.init_upcycle): an MoE model's parameters from a dense Llama's tensors,
 * as Megatron-core's moe-use-upcycling builds them (megatron/core/transformer/moe/
 * upcycling_utils.py; Komatsuzaki et al., "Sparse Upcycling", and He et al., arXiv
 * 2410.07524, "Upcycling Large Language Models into Mixture of Experts"):
 *   - every routed expert j of an MoE block is a copy of that block's dense MLP: its
 *     gate, up and down (Mixtral's w1, w3, w2; Qwen3-MoE's and DeepSeek's
 *     experts.{j}.gate_proj, up_proj, down_proj) read from the dense
 *     model.layers.{L}.mlp.gate_proj, up_proj, down_proj. Megatron at granularity 1 (the
 *     experts as wide as the dense MLP) copies them unscaled when its router normalises
 *     after the top-k (moe_router_pre_softmax off: weights summing to one), and scales
 *     them by (E/k)^(1/3) otherwise, an approximation; Tessera builds the exact case only
 *     (config_moe.c refuses the others, and granularity > 1: each expert a slice);
 *   - the router is not in the dense model: Megatron keeps the MoE model's own freshly
 *     initialised router (at granularity 1 its rows unchanged), so here it is the
 *     router a random init from train.seed draws, by logical index (the same on every
 *     grid);
 *   - every other tensor (embedding, attention, norms, head, the dense blocks' MLPs of a
 *     config with moe_first_dense) is read under its own name, as model.init does.
 * The aux-loss-free bias is not in a dense model and starts at zero; the optimizer starts
 * fresh (an init, not a resume). Each rank reads only its own part (load.c): its ep
 * experts, their etp slices, its layers. */
#ifndef TS_CKPT_UPCYCLE_H
#define TS_CKPT_UPCYCLE_H

#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"

typedef enum {
    TS_UPCYCLE_BY_NAME,  /* read under its own name */
    TS_UPCYCLE_FROM_MLP, /* a routed expert's tensor: read from the dense MLP's */
    TS_UPCYCLE_FRESH,    /* an MoE block's router: initialised by index */
    TS_UPCYCLE_REFUSED,  /* a shared expert's tensor (config_moe.c refuses them first) */
} ts_upcycle_source;

/* Where parameter p of an upcycled model starts: for TS_UPCYCLE_FROM_MLP the dense
 * tensor's name in `dense` (cap bytes). */
ts_upcycle_source ts_upcycle_source_of(const ts_model *m, int p, char *dense, size_t cap);

/* Whether `name` is the dense MLP (model.layers.{L}.mlp.gate_proj/up_proj/down_proj.weight)
 * of a block that is an MoE block here: what the experts are copied from, not a
 * parameter of the MoE model. */
bool ts_upcycle_is_dense_mlp(const ts_model *m, const char *name);

#endif
