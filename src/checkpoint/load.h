/* Loading weights into a built model from logical (unsharded) tensors: each rank reads
 * only the runs of its own parts, as the parameters' shard specs say (tensor/shard.h),
 * so any grid loads the same file. */
#ifndef TS_CKPT_LOAD_H
#define TS_CKPT_LOAD_H

#include "core/error.h"
#include "model/model.h"

/* model.init: initialise every parameter of m from logical weights under the model's
 * names (gpt2: nanoGPT's; llama: Hugging Face's): `path` is a safetensors file, a
 * directory holding model.safetensors or Hugging Face's sharded
 * model.safetensors.index.json (what save_pretrained writes; a Tessera step directory
 * too), or such an index. Every name, shape and dtype is checked against the model: a
 * missing tensor, one the model does not define and a wrong shape are refused; F32 is
 * loaded as it is, BF16 and F16 are widened to fp32 (exactly). A tied head accepts an
 * lm_head.weight only equal to the embedding. Every value loaded must be finite. Errors
 * are prefixed "model.init: " and name the file (and, for a bad value, the tensor and
 * the element's logical index). */
ts_status ts_ckpt_load_model_init(ts_model *m, const char *path);

/* model.init_upcycle: initialise MoE model m from a dense Llama's weights at `path` (as
 * above; checkpoint/upcycle.h): each routed expert from its block's dense MLP, each
 * router by index from `seed` (train.seed), the rest under its own name. Weights holding
 * routed experts are refused, as is a dense MLP of another width than the experts'. */
ts_status ts_ckpt_load_model_upcycle(ts_model *m, const char *path, uint64_t seed);

#endif
