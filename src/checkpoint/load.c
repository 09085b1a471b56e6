/* model.init: a rank's parameters from a safetensors file of logical tensors, read run
 * by run through the parameters' shard specs (load.h). */
#include "checkpoint/load.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/safetensors.h"
#include "tensor/shard.h"

/* Read this rank's part of parameter P from the logical tensor t: one read per run. */
static ts_status read_param_part(const ts_st_file *f, const ts_st_tensor *t, const ts_param *P,
                                 float *dst)
{
    const uint64_t F = sizeof(float);
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, 0, P->numel); ts_shard_next(&it, &r);)
        if (ts_st_read(f, t, r.logical * F, dst + r.local, r.len * F) != TS_OK) return TS_ERR;
    return TS_OK;
}

/* Non-finite weights would only show as a NaN loss at step 0, blamed on the learning
 * rate: name the tensor and the first bad element (its index in the logical tensor). */
static ts_status check_finite(const ts_param *P, const char *name, const float *w)
{
    const ts_shard_spec *s = &P->shard;
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(s, 0, P->numel); ts_shard_next(&it, &r);) {
        for (size_t j = 0; j < r.len; j++) {
            const float v = w[r.local + j];
            if (isfinite(v)) continue;
            const size_t at = r.logical + j;
            char where[96] = "", shape[64];
            if (s->ndim > 1)
                snprintf(where, sizeof where, " (row %zu, column %zu)", at / (size_t)s->shape[1],
                         at % (size_t)s->shape[1]);
            return ts_fail("tensor '%s' %s holds %s at element %zu%s; the file is damaged or "
                           "was saved from a run that diverged",
                           name, ts_st_shape_str(shape, sizeof shape, s->ndim, s->shape),
                           isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", at, where);
        }
    }
    return TS_OK;
}

/* Parameter P from tensor t: dtype and shape, this rank's part into host memory
 * `host`, finite values. The message names the file. */
static ts_status load_param(const ts_st_file *f, const ts_st_tensor *t, const ts_param *P,
                            float *host)
{
    if (ts_st_expect_f32(t, P->shard.ndim, P->shard.shape) != TS_OK)
        return ts_error_prefix("%s: ", f->path);
    if (read_param_part(f, t, P, host) != TS_OK) return TS_ERR; /* names the file */
    if (check_finite(P, t->name, host) != TS_OK) return ts_error_prefix("%s: ", f->path);
    return TS_OK;
}

/* A name of the model's architecture for a layer this rank does not own (pipeline
 * stages): a block's, or the embedding's and the final norm's (the tied or untied head's
 * lm_head.weight is handled by the caller). */
static bool other_stage_name(const ts_model *m, const char *name)
{
    const bool llama = m->arch == TS_ARCH_LLAMA;
    int blk = -1;
    if (sscanf(name, llama ? "model.layers.%d." : "transformer.h.%d.", &blk) == 1 && blk >= 0 &&
        blk < m->n_layer && !m->layers[blk + 1].owned)
        return true;
    if (llama)
        return !strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "model.norm.weight");
    return !strcmp(name, "transformer.wpe.weight") || !strncmp(name, "transformer.ln_f.", 17) ||
           !strcmp(name, "transformer.wte.weight");
}

ts_status ts_ckpt_load_model_init(ts_model *m, const char *path)
{
    ts_st_file f;
    if (ts_st_open(&f, path) != TS_OK) return ts_error_prefix("model.init: ");

    /* Every tensor in the file must be one the model knows: a misspelt or foreign
     * name means the file is not a checkpoint of this architecture. */
    for (int t = 0; t < f.n_tensors; t++) {
        const char *name = f.tensors[t].name;
        if (strcmp(name, "lm_head.weight") == 0) continue; /* tied to wte; checked below */
        bool known = false;
        for (int p = 0; p < m->n_params && !known; p++) known = !strcmp(ts_param_name(m, p), name);
        if (!known && !other_stage_name(m, name)) {
            ts_fail("model.init: %s holds tensor '%s', which is not a parameter of this %s "
                    "config (n_layer=%d); is the file for another model?",
                    path, name, m->arch == TS_ARCH_LLAMA ? "llama" : "gpt2", m->n_layer);
            ts_st_close(&f);
            return TS_ERR;
        }
    }
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        const ts_st_tensor *t = ts_st_find(&f, P->shard.name);
        if (!t) {
            char shape[64];
            ts_st_close(&f);
            return ts_fail("model.init: %s has no tensor '%s' (expected shape %s F32 for this "
                           "config)",
                           path, P->shard.name,
                           ts_st_shape_str(shape, sizeof shape, P->shard.ndim, P->shard.shape));
        }
        /* Read and checked on the host, then one copy to the device. */
        float *host = ts_alloc_floats(P->numel);
        ts_status st = load_param(&f, t, P, host);
        if (st == TS_OK) m->k->memcpy_h2d(ts_param_data(m, p), host, P->numel * sizeof(float));
        free(host);
        if (st != TS_OK) {
            ts_st_close(&f);
            return ts_error_prefix("model.init: ");
        }
    }
    const ts_st_tensor *head = ts_st_find(&f, "lm_head.weight");
    if (head && m->head_wte_param >= 0 && m->tied) {
        /* nanoGPT's state_dict carries the tied head too: accept it only if it is the
         * same tensor, since our head is tied by construction. */
        const ts_param *P = &m->params[m->head_wte_param];
        float *tmp = ts_alloc_floats(P->numel), *have = ts_alloc_floats(P->numel);
        ts_status st = load_param(&f, head, P, tmp);
        if (st == TS_OK)
            m->k->memcpy_d2h(have, ts_param_data(m, m->head_wte_param), P->numel * sizeof(float));
        if (st == TS_OK && memcmp(tmp, have, P->numel * sizeof(float)) != 0)
            st = ts_fail("%s: lm_head.weight differs from %s; the model ties them (gpt2, or "
                         "tie_embeddings)",
                         path, P->shard.name);
        free(tmp);
        free(have);
        if (st != TS_OK) {
            ts_st_close(&f);
            return ts_error_prefix("model.init: ");
        }
    }
    ts_st_close(&f);
    return TS_OK;
}
