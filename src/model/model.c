/* Building the layer list, the parameter views with their shard specs, and
 * initialisation by index. */
#include "model/model.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

typedef struct {
    ts_model *m;
    int cap;
    size_t offset;
} builder;

/* Add a parameter with logical shape [d0] or [d0, d1] (d1 = 0 for 1-D), split over the
 * tensor-parallel ranks along `split_axis` (-1 = replicated) viewed as `groups` leading
 * groups. */
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
    const int64_t shape[2] = {d0, d1};
    ts_shard_init(&p->shard, name, d1 > 0 ? 2 : 1, shape, split_axis, groups, m->tp.size,
                  m->tp.rank);
    p->numel = ts_shard_numel(&p->shard);
    /* 16-float alignment keeps every tensor on its own cache lines for the kernels. */
    p->offset = b->offset;
    b->offset += (p->numel + 15) / 16 * 16;
    p->layer = layer;
    p->decay = p->shard.ndim >= 2;
    p->init = init;
    p->init_std = std;
    return m->n_params++;
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
    ts_tp one = ts_tp_make(1, 0, NULL, k);
    ts_model_build_tp(m, cfg, owned, &one);
}

void ts_model_layout_tp(ts_model *m, const ts_model_config *cfg, const bool *owned,
                        const ts_tp *tp)
{
    memset(m, 0, sizeof *m);
    /* Whole heads per rank and at least one vocabulary row (ts_config_validate says so
     * to the user first). */
    TS_ASSERT(tp->size >= 1 && cfg->n_head % tp->size == 0 && cfg->vocab_size >= tp->size);
    /* A backend with an empty slot would crash mid-run: refuse it here. */
    TS_ASSERT(tp->k && ts_kernels_missing(tp->k) == NULL);
    m->tp = *tp;
    m->local_heads = cfg->n_head / tp->size;
    int64_t v0, nv;
    ts_shard_range(cfg->vocab_size, tp->size, tp->rank, &v0, &nv);
    m->vocab_start = (int)v0;
    m->local_vocab = (int)nv;
    m->n_layer = cfg->n_layer;
    m->n_head = cfg->n_head;
    m->n_embd = cfg->n_embd;
    m->vocab_size = cfg->vocab_size;
    m->max_seq_len = cfg->seq_len;
    m->k = tp->k;
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
                 * group so both copies stay equal (docs/ARCHITECTURE.md). */
                m->head_wte_param = add_param(&b, l, "transformer.wte.weight", V, C,
                                              TS_INIT_NORMAL, 0.02f, 0, 1);
                m->params[m->head_wte_param].tied_copy = true;
                m->params[m->head_wte_param].shard.replica = 1; /* counted and saved once */
            }
            break;
        }
        L->n_params = m->n_params - L->first_param;
    }
    m->num_floats = b.offset;
}

void ts_model_build_tp(ts_model *m, const ts_model_config *cfg, const bool *owned,
                       const ts_tp *tp)
{
    ts_model_layout_tp(m, cfg, owned, tp);
    m->param_mem = m->k->dev_alloc(m->num_floats * sizeof(float));
    m->grad_mem = m->k->dev_alloc(m->num_floats * sizeof(float));
    /* fp32 computes on the master weights; a narrower act_dtype gets its own copy. */
    m->compute_mem = m->k->act_dtype == TS_DTYPE_F32
                         ? (void *)m->param_mem
                         : m->k->dev_alloc(m->num_floats * ts_dtype_bytes(m->k->act_dtype));
}

void ts_model_refresh_compute(const ts_model *m)
{
    if (m->compute_mem != (void *)m->param_mem)
        m->k->convert(m->compute_mem, m->k->act_dtype, m->param_mem, TS_DTYPE_F32, m->num_floats);
}

void ts_model_free(ts_model *m)
{
    free(m->layers);
    free(m->params);
    if (m->k) {
        if (m->compute_mem != (void *)m->param_mem) m->k->dev_free(m->compute_mem);
        m->k->dev_free(m->param_mem);
        m->k->dev_free(m->grad_mem);
    }
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
    /* Drawn on the host into a staging buffer, then one copy per parameter to the
     * device (parameters are device memory: kernels.h). */
    size_t most = 0;
    for (int p = 0; p < m->n_params; p++) most = m->params[p].numel > most ? m->params[p].numel : most;
    float *w = ts_alloc_floats(most ? most : 1);
    for (int p = 0; p < m->n_params; p++) {
        const ts_param *P = &m->params[p];
        if (P->init == TS_INIT_ZEROS || P->init == TS_INIT_ONES) {
            float v = P->init == TS_INIT_ONES ? 1.0f : 0.0f;
            for (size_t i = 0; i < P->numel; i++) w[i] = v;
        } else {
            /* Element i of the logical tensor depends only on (seed, name, i); each
             * thread walks the runs of its own range of local elements. */
            const uint64_t key = ts_rng_name_key(P->shard.name);
            const double std = P->init_std;
#pragma omp parallel
            {
                const size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
                ts_shard_run r;
                for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, P->numel * t / nt,
                                                            P->numel * (t + 1) / nt);
                     ts_shard_next(&it, &r);)
                    for (size_t j = 0; j < r.len; j++)
                        w[r.local + j] = (float)(std * ts_rng_normal(seed, key, r.logical + j));
            }
        }
        m->k->memcpy_h2d(ts_param_data(m, p), w, P->numel * sizeof(float));
    }
    free(w);
    ts_model_refresh_compute(m);
}
