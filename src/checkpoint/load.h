/* Loading weights into a built model from logical (unsharded) tensors: each rank reads
 * only the runs of its own parts, as the parameters' shard specs say (tensor/shard.h),
 * so any grid loads the same file. */
#ifndef TS_CKPT_LOAD_H
#define TS_CKPT_LOAD_H

#include "core/error.h"
#include "model/model.h"

/* model.init: initialise every parameter of m from a safetensors file of nanoGPT-named
 * F32 weights. Every name, shape and dtype is checked against the model and every value
 * loaded must be finite, with a clear error prefixed "model.init: " that names the file
 * (and, for a bad value, the tensor and the element's logical index). */
ts_status ts_ckpt_load_model_init(ts_model *m, const char *path);

#endif
