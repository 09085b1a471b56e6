/* Building the layer list, the parameter views and initialisation. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/safetensors.h"
#include "core/rng.h"

typedef struct {
    ts_model *m;
    int cap;
    size_t offset;
} builder;

/* Add a parameter with logical shape [d0] or [d0, d1] (d1 = 0 for 1-D), split over
 * tensor-parallel ranks along `split_axis` (-1 = replicated) viewed as `groups`
 * leading groups. */
static int add_param(builder *b, int layer, const char *name, int64_t d0, int64_t d1,
                     ts_init_kind init, float std, int split_axis, int groups)
{
    ts_model *m = b->m;
    if (m->n_params == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        ts_param *grown = ts_malloc((size_t)b->cap * sizeof *grown);
        if (m->n_params) memcpy(grown, m->params, (size_t)m->n_params * sizeof *grown);
        free(m->params);
        m->params = grown;
    }
    ts_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = p->local[0] = d0;
    p->shape[1] = p->local[1] = d1 > 0 ? d1 : 0;
    p->split_axis = m->tp > 1 ? split_axis : -1;
    p->groups = groups;
    p->parts = p->split_axis >= 0 ? m->tp : 1;
    p->part = p->split_axis >= 0 ? m->tp_rank : 0;
    if (p->split_axis >= 0) {
        TS_ASSERT(p->shape[p->split_axis] % ((int64_t)groups * m->tp) == 0);
        p->local[p->split_axis] = p->shape[p->split_axis] / m->tp;
    }
    p->numel = (size_t)p->local[0] * (size_t)(p->ndim > 1 ? p->local[1] : 1);
    /* 16-float alignment keeps every tensor on its own cache lines for the kernels. */
    p->offset = b->offset;
    b->offset += (p->numel + 15) / 16 * 16;
    p->layer = layer;
    p->decay = p->ndim >= 2;
    p->init = init;
    p->init_std = std;
    return m->n_params++;
}

size_t ts_param_logical_index(const ts_param *p, size_t i)
{
    if (p->split_axis < 0) return i;
    const int64_t cols_local = p->ndim > 1 ? p->local[1] : 1;
    const int64_t cols = p->ndim > 1 ? p->shape[1] : 1;
    int64_t r = (int64_t)i / cols_local, c = (int64_t)i % cols_local;
    if (p->split_axis == 0) {
        /* rows: group g's rows are [g*R, (g+1)*R); this part holds R/parts of each */
        int64_t R = p->shape[0] / p->groups, r_local = R / p->parts;
        int64_t g = r / r_local, j = r % r_local;
        r = g * R + (int64_t)p->part * r_local + j;
    } else {
        c += (int64_t)p->part * cols_local;
    }
    return (size_t)(r * cols + c);
}

static void add_block_params(builder *b, int layer, int i, int C, int n_layer)
{
    char name[96];
    const float std = 0.02f;
    const float proj_std = 0.02f / sqrtf(2.0f * (float)n_layer);
#define P(suffix, d0, d1, init, s, axis, groups)                                        \
    (snprintf(name, sizeof name, "transformer.h.%d.%s", i, suffix),                    \
     add_param(b, layer, name, d0, d1, init, s, axis, groups))
    /* Megatron's split: c_attn and c_fc are column-parallel (output rows split, q/k/v
     * each by heads), the two c_proj row-parallel (input columns split); LayerNorms
     * and the row-parallel biases are replicated. */
    P("ln_1.weight", C, 0, TS_INIT_ONES, 0, -1, 1);
    P("ln_1.bias", C, 0, TS_INIT_ZEROS, 0, -1, 1);
    P("attn.c_attn.weight", 3 * C, C, TS_INIT_NORMAL, std, 0, 3);
    P("attn.c_attn.bias", 3 * C, 0, TS_INIT_ZEROS, 0, 0, 3);
    P("attn.c_proj.weight", C, C, TS_INIT_NORMAL, proj_std, 1, 1);
    P("attn.c_proj.bias", C, 0, TS_INIT_ZEROS, 0, -1, 1);
    P("ln_2.weight", C, 0, TS_INIT_ONES, 0, -1, 1);
    P("ln_2.bias", C, 0, TS_INIT_ZEROS, 0, -1, 1);
    P("mlp.c_fc.weight", 4 * C, C, TS_INIT_NORMAL, std, 0, 1);
    P("mlp.c_fc.bias", 4 * C, 0, TS_INIT_ZEROS, 0, 0, 1);
    P("mlp.c_proj.weight", C, 4 * C, TS_INIT_NORMAL, proj_std, 1, 1);
    P("mlp.c_proj.bias", C, 0, TS_INIT_ZEROS, 0, -1, 1);
#undef P
}

void ts_model_build(ts_model *m, const ts_model_config *cfg, const bool *owned,
                    const ts_kernels *k)
{
    ts_model_build_tp(m, cfg, owned, k, 1, 0, NULL);
}

void ts_model_layout_tp(ts_model *m, const ts_model_config *cfg, const bool *owned,
                        const ts_kernels *k, int tp, int tp_rank, const struct ts_comm_s *tp_comm)
{
    memset(m, 0, sizeof *m);
    TS_ASSERT(tp >= 1 && cfg->n_head % tp == 0 && cfg->vocab_size % tp == 0);
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->tp_comm = tp > 1 ? tp_comm : NULL;
    m->local_heads = cfg->n_head / tp;
    m->local_vocab = cfg->vocab_size / tp;
    m->vocab_start = tp_rank * m->local_vocab;
    m->n_layer = cfg->n_layer;
    m->n_head = cfg->n_head;
    m->n_embd = cfg->n_embd;
    m->vocab_size = cfg->vocab_size;
    m->max_seq_len = cfg->seq_len;
    m->k = k;
    m->n_layers = cfg->n_layer + 2;
    m->layers = ts_calloc((size_t)m->n_layers, sizeof *m->layers);
    m->wte_param = m->head_wte_param = -1;

    const int C = cfg->n_embd, V = cfg->vocab_size, T = cfg->seq_len;
    builder b = {.m = m};
    for (int l = 0; l < m->n_layers; l++) {
        ts_layer *L = &m->layers[l];
        L->owned = owned ? owned[l] : true;
        L->kind = l == 0 ? TS_LAYER_EMBED : l == m->n_layers - 1 ? TS_LAYER_HEAD : TS_LAYER_BLOCK;
        L->block = L->kind == TS_LAYER_BLOCK ? l - 1 : -1;
        L->first_param = m->n_params;
        if (!L->owned) continue;
        switch (L->kind) {
        case TS_LAYER_EMBED:
            /* Vocab-parallel: each tp rank holds a slice of the vocabulary rows. */
            m->wte_param = add_param(&b, l, "transformer.wte.weight", V, C, TS_INIT_NORMAL, 0.02f,
                                     0, 1);
            add_param(&b, l, "transformer.wpe.weight", T, C, TS_INIT_NORMAL, 0.02f, -1, 1);
            break;
        case TS_LAYER_BLOCK:
            add_block_params(&b, l, L->block, C, cfg->n_layer);
            break;
        case TS_LAYER_HEAD:
            add_param(&b, l, "transformer.ln_f.weight", C, 0, TS_INIT_ONES, 0, -1, 1);
            add_param(&b, l, "transformer.ln_f.bias", C, 0, TS_INIT_ZEROS, 0, -1, 1);
            if (m->wte_param >= 0) {
                m->head_wte_param = m->wte_param; /* tied: one tensor */
            } else {
                /* The last pipeline stage keeps its own copy of the tied embedding,
                 * initialised identically; gradients are summed over the embedding
                 * group so both copies stay equal (ARCHITECTURE.md). */
                m->head_wte_param = add_param(&b, l, "transformer.wte.weight", V, C,
                                              TS_INIT_NORMAL, 0.02f, 0, 1);
                m->params[m->head_wte_param].tied_copy = true;
            }
            break;
        }
        L->n_params = m->n_params - L->first_param;
    }
    m->num_floats = b.offset;
}

void ts_model_build_tp(ts_model *m, const ts_model_config *cfg, const bool *owned,
                       const ts_kernels *k, int tp, int tp_rank, const struct ts_comm_s *tp_comm)
{
    ts_model_layout_tp(m, cfg, owned, k, tp, tp_rank, tp_comm);
    m->param_mem = ts_alloc_floats(m->num_floats);
    m->grad_mem = ts_alloc_floats(m->num_floats);
    m->m_mem = ts_alloc_floats(m->num_floats);
    m->v_mem = ts_alloc_floats(m->num_floats);
}

void ts_model_free(ts_model *m)
{
    free(m->layers);
    free(m->params);
    free(m->param_mem);
    free(m->grad_mem);
    free(m->m_mem);
    free(m->v_mem);
    memset(m, 0, sizeof *m);
}

size_t ts_model_logical_params(const ts_model_config *c)
{
    size_t C = (size_t)c->n_embd;
    size_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                       (4 * C * C + C);
    return (size_t)c->vocab_size * C + (size_t)c->seq_len * C + (size_t)c->n_layer * per_block +
           2 * C;
}

void ts_model_init_random(ts_model *m, uint64_t seed)
{
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        float *w = ts_param_data(m, p);
        if (P->init == TS_INIT_ZEROS || P->init == TS_INIT_ONES) {
            float v = P->init == TS_INIT_ONES ? 1.0f : 0.0f;
            for (size_t i = 0; i < P->numel; i++) w[i] = v;
            continue;
        }
        /* Element i of the logical tensor depends only on (seed, name, i). */
        uint64_t key = ts_rng_name_key(P->name);
        double std = P->init_std;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < P->numel; i++)
            w[i] = (float)(std * ts_rng_normal(seed, key, ts_param_logical_index(P, i)));
    }
}

/* Read this rank's slice of parameter P from the logical tensor t (shard spec). */
static ts_status read_param_slice(const ts_st_file *f, const ts_st_tensor *t, const ts_param *P,
                                  float *dst)
{
    const size_t F = sizeof(float);
    if (P->split_axis < 0) return ts_st_read(f, t, 0, dst, P->numel * F);
    const uint64_t cols = P->ndim > 1 ? (uint64_t)P->shape[1] : 1;
    if (P->split_axis == 0) { /* each group's rows of this part are contiguous */
        const uint64_t R = (uint64_t)P->shape[0] / P->groups, r_local = R / P->parts;
        for (int g = 0; g < P->groups; g++) {
            uint64_t row0 = g * R + (uint64_t)P->part * r_local;
            if (ts_st_read(f, t, row0 * cols * F, dst + g * r_local * cols, r_local * cols * F) != TS_OK)
                return TS_ERR;
        }
        return TS_OK;
    }
    const uint64_t c_local = (uint64_t)P->local[1];
    for (int64_t r = 0; r < P->shape[0]; r++)
        if (ts_st_read(f, t, ((uint64_t)r * cols + (uint64_t)P->part * c_local) * F,
                       dst + (uint64_t)r * c_local, c_local * F) != TS_OK)
            return TS_ERR;
    return TS_OK;
}

/* Non-finite weights would only show as a NaN loss at step 0, blamed on the learning
 * rate: name the tensor and the first bad element (its index in the logical tensor). */
static ts_status check_finite(const ts_param *P, const char *name, const float *w)
{
    for (size_t i = 0; i < P->numel; i++) {
        if (isfinite(w[i])) continue;
        size_t at = ts_param_logical_index(P, i);
        char where[96] = "", shape[64];
        if (P->ndim > 1)
            snprintf(where, sizeof where, " (row %zu, column %zu)", at / (size_t)P->shape[1],
                     at % (size_t)P->shape[1]);
        return ts_fail("tensor '%s' %s holds %s at element %zu%s; the file is damaged or was "
                       "saved from a run that diverged",
                       name, ts_st_shape_str(shape, sizeof shape, P->ndim, P->shape),
                       isnan(w[i]) ? "NaN" : w[i] > 0 ? "+Inf" : "-Inf", at, where);
    }
    return TS_OK;
}

/* Parameter P from tensor t: dtype and shape, this rank's slice into dst, finite values.
 * The message names the file. */
static ts_status load_param(const ts_st_file *f, const ts_st_tensor *t, const ts_param *P,
                            float *dst)
{
    if (ts_st_expect_f32(t, P->ndim, P->shape) != TS_OK)
        return ts_error_prefix("%s: ", f->path);
    if (read_param_slice(f, t, P, dst) != TS_OK) return TS_ERR; /* names the file */
    if (check_finite(P, t->name, dst) != TS_OK) return ts_error_prefix("%s: ", f->path);
    return TS_OK;
}

ts_status ts_model_init_from_file(ts_model *m, const char *path)
{
    ts_st_file f;
    if (ts_st_open(&f, path) != TS_OK) return ts_error_prefix("model.init: ");

    /* Every tensor in the file must be one the model knows: a misspelt or foreign
     * name means the file is not a checkpoint of this architecture. */
    for (int t = 0; t < f.n_tensors; t++) {
        const char *name = f.tensors[t].name;
        if (strcmp(name, "lm_head.weight") == 0) continue; /* tied to wte; checked below */
        bool known = false;
        for (int p = 0; p < m->n_params && !known; p++) known = !strcmp(m->params[p].name, name);
        if (!known) {
            /* Names of layers this rank does not own are fine (pipeline stages). */
            int blk = -1;
            if (sscanf(name, "transformer.h.%d.", &blk) == 1 && blk >= 0 && blk < m->n_layer &&
                !m->layers[blk + 1].owned)
                continue;
            if (!strcmp(name, "transformer.wpe.weight") || !strncmp(name, "transformer.ln_f.", 17) ||
                !strcmp(name, "transformer.wte.weight"))
                continue;
            ts_fail("model.init: %s holds tensor '%s', which is not a parameter of this gpt2 "
                    "config (n_layer=%d); is the file for another model?",
                    path, name, m->n_layer);
            ts_st_close(&f);
            return TS_ERR;
        }
    }
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        const ts_st_tensor *t = ts_st_find(&f, P->name);
        if (!t) {
            char shape[64];
            ts_st_close(&f);
            return ts_fail("model.init: %s has no tensor '%s' (expected shape %s F32 for this "
                           "config)",
                           path, P->name, ts_st_shape_str(shape, sizeof shape, P->ndim, P->shape));
        }
        if (load_param(&f, t, P, ts_param_data(m, p)) != TS_OK) {
            ts_st_close(&f);
            return ts_error_prefix("model.init: ");
        }
    }
    const ts_st_tensor *head = ts_st_find(&f, "lm_head.weight");
    if (head && m->head_wte_param >= 0) {
        /* nanoGPT's state_dict carries the tied head too: accept it only if it is the
         * same tensor, since our head is tied by construction. */
        const ts_param *P = &m->params[m->head_wte_param];
        float *tmp = ts_alloc_floats(P->numel);
        ts_status st = load_param(&f, head, P, tmp);
        if (st == TS_OK && memcmp(tmp, ts_param_data(m, m->head_wte_param),
                                  P->numel * sizeof(float)) != 0)
            st = ts_fail("%s: lm_head.weight differs from transformer.wte.weight; Tessera's "
                         "GPT-2 ties them (nanoGPT semantics)", path);
        free(tmp);
        if (st != TS_OK) {
            ts_st_close(&f);
            return ts_error_prefix("model.init: ");
        }
    }
    ts_st_close(&f);
    return TS_OK;
}
