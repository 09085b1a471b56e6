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
 * groups, into `parts` parts (the tp size, or fewer: each part then shared by tp/parts
 * ranks, tensor/shard.h). */
static int add_param_parts(builder *b, int layer, const char *name, int64_t d0, int64_t d1,
                           ts_init_kind init, float std, int split_axis, int groups, int parts)
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
    if (split_axis >= 0 && parts < m->tp.size)
        ts_shard_init_shared(&p->shard, name, d1 > 0 ? 2 : 1, shape, split_axis, groups, parts,
                             m->tp.size, m->tp.rank);
    else
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

static int add_param(builder *b, int layer, const char *name, int64_t d0, int64_t d1,
                     ts_init_kind init, float std, int split_axis, int groups)
{
    return add_param_parts(b, layer, name, d0, d1, init, std, split_axis, groups, b->m->tp.size);
}

/* The next parameter starts right after parameter p, without the alignment gap, so
 * that the two are one contiguous weight (llama's q|k|v and gate|up). */
static void pack_after(builder *b, int p)
{
    b->offset = b->m->params[p].offset + b->m->params[p].numel;
}

static void add_block_params(builder *b, int layer, int i, int C, int F, int n_layer)
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
    P("mlp.c_fc.weight", F, C, TS_INIT_NORMAL, std, 0, 1);
    P("mlp.c_fc.bias", F, 0, TS_INIT_ZEROS, 0, 0, 1);
    P("mlp.c_proj.weight", C, F, TS_INIT_NORMAL, proj_std, 1, 1);
    P("mlp.c_proj.bias", C, 0, TS_INIT_ZEROS, 0, -1, 1);
#undef P
}

/* A routed expert's matrix [d0, d1], normal(0, 0.02): whole (replicated over tp), or
 * under expert tensor parallelism split over the etp group along `split_axis` by F
 * (gate and up by rows, down by columns), so that the gate|up pair packed together is
 * this rank's [2F/etp, C] as llama's column-parallel gate|up is under tp. */
static int add_expert_param(builder *b, int layer, const char *name, int64_t d0, int64_t d1,
                            int split_axis)
{
    const ts_model *m = b->m;
    const int p = add_param(b, layer, name, d0, d1, TS_INIT_NORMAL, 0.02f, -1, 1);
    ts_param *P = &b->m->params[p];
    P->expert = true;
    if (m->moe_etp > 1) {
        const int64_t shape[2] = {d0, d1};
        ts_shard_init(&P->shard, name, 2, shape, split_axis, 1, m->moe_etp, m->moe_etp_rank);
        P->numel = ts_shard_numel(&P->shard);
        b->offset = P->offset + (P->numel + 15) / 16 * 16;
    }
    /* A whole tensor (or etp slice) on this rank, not a tp replica: under ep or etp its
     * copies are the edp group's (the reducer's and the norm's rule), and with ep or etp
     * over tp ranks the tp ranks hold different experts or slices, each counted and
     * written (tensor/tp.h ts_tp_param_counts; an etp slice's spec above has replica 0
     * already). */
    if (m->moe_ep > 1) P->shard.replica = 0;
    return p;
}

/* An MoE block's MLP (model.h's order and names): the router, each expert's gate|up
 * (one [2F, C] weight, as the dense MLP's) and down, the shared experts' the same at
 * width S*F; Mixtral's names for a Mixtral-shaped model (ts_model_moe_mixtral), else
 * Qwen3-MoE's and DeepSeek's. Every matrix normal(0, 0.02) as the dense ones (HF's
 * initializer_range); replicated over tp. Under expert parallelism only this rank's
 * experts, under their GLOBAL ids (so the Hugging Face names and the checkpoints say
 * which expert a tensor is, whatever the ep). */
static void add_moe_params(builder *b, int layer, int i, const ts_model_config *cfg)
{
    char name[128], pre[64];
    const float std = 0.02f;
    const int64_t C = cfg->n_embd, E = cfg->moe_experts, F = cfg->moe_ffn_hidden,
                  SF = (int64_t)cfg->moe_shared_experts * F;
    const bool mixtral = ts_model_moe_mixtral(cfg);
    const char *gate = mixtral ? "w1" : "gate_proj", *up = mixtral ? "w3" : "up_proj",
               *down = mixtral ? "w2" : "down_proj";
    snprintf(pre, sizeof pre, "model.layers.%d.%s", i, mixtral ? "block_sparse_moe" : "mlp");
#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
    add_param(b, layer, NAME("%s.gate.weight", pre), E, C, TS_INIT_NORMAL, std, -1, 1);
    const long long j0 = (long long)b->m->moe_ep_rank * b->m->moe_local_experts;
    for (long long j = j0; j < j0 + b->m->moe_local_experts; j++) {
        const int g = add_expert_param(b, layer, NAME("%s.experts.%lld.%s.weight", pre, j, gate),
                                       F, C, 0);
        pack_after(b, g);
        add_expert_param(b, layer, NAME("%s.experts.%lld.%s.weight", pre, j, up), F, C, 0);
        add_expert_param(b, layer, NAME("%s.experts.%lld.%s.weight", pre, j, down), C, F, 1);
    }
    if (SF > 0) {
        const int g = add_param(b, layer, NAME("%s.shared_experts.gate_proj.weight", pre), SF, C,
                                TS_INIT_NORMAL, std, -1, 1);
        pack_after(b, g);
        add_param(b, layer, NAME("%s.shared_experts.up_proj.weight", pre), SF, C, TS_INIT_NORMAL,
                  std, -1, 1);
        add_param(b, layer, NAME("%s.shared_experts.down_proj.weight", pre), C, SF,
                  TS_INIT_NORMAL, std, -1, 1);
    }
#undef NAME
}

/* A llama block's second half: its post-attention norm and its MLP (dense SwiGLU, or
 * the MoE's), Hugging Face's names. */
static void add_llama_mlp_params(builder *b, int layer, int i, const ts_model_config *cfg)
{
    char name[96];
    const float std = 0.02f;
    const int64_t C = cfg->n_embd, F = ts_model_ffn(cfg);
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix), name)
    add_param(b, layer, NAME("post_attention_layernorm.weight"), C, 0, TS_INIT_ONES, 0, -1, 1);
    if (ts_model_block_is_moe(cfg, i)) {
        add_moe_params(b, layer, i, cfg);
        return;
    }
    const int g = add_param(b, layer, NAME("mlp.gate_proj.weight"), F, C, TS_INIT_NORMAL, std, 0, 1);
    pack_after(b, g);
    add_param(b, layer, NAME("mlp.up_proj.weight"), F, C, TS_INIT_NORMAL, std, 0, 1);
    add_param(b, layer, NAME("mlp.down_proj.weight"), C, F, TS_INIT_NORMAL, std, 1, 1);
#undef NAME
}

/* Multi-head latent attention's parameters (DeepSeek-V3; model/mla.c), Hugging Face's
 * DeepseekV3Attention names and shapes ([out, in]), in its order except that
 * kv_a_proj_with_mqa follows q_a_proj (or q_proj) directly: the two down-projections of
 * the block's input are one packed weight [QA + kv_lora + rope, C], one GEMM (as llama's
 * q|k|v). Under tensor parallelism the latent trunk (q_a_proj, kv_a_proj_with_mqa and
 * their RMSNorms) is replicated, the per-head up-projections (q_b_proj, or q_proj
 * without a q latent, and kv_b_proj) column-parallel by heads (their rows are
 * head-major), o_proj row-parallel: every checkpoint reshards between grids. Matrices
 * normal(0, 0.02), the norms ones. */
static void add_mla_params(builder *b, int layer, int i, const ts_model_config *cfg)
{
    char name[96];
    const float std = 0.02f;
    const int64_t C = cfg->n_embd, H = cfg->n_head, RQ = cfg->q_lora_rank,
                  RKV = cfg->kv_lora_rank, R = cfg->qk_rope_head_dim,
                  HS = cfg->qk_nope_head_dim + R, KVB = cfg->qk_nope_head_dim + cfg->v_head_dim;
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.self_attn.%s", i, suffix), name)
    const int qa = RQ > 0 ? add_param(b, layer, NAME("q_a_proj.weight"), RQ, C, TS_INIT_NORMAL,
                                      std, -1, 1)
                          : add_param(b, layer, NAME("q_proj.weight"), H * HS, C,
                                      TS_INIT_NORMAL, std, 0, 1);
    pack_after(b, qa);
    add_param(b, layer, NAME("kv_a_proj_with_mqa.weight"), RKV + R, C, TS_INIT_NORMAL, std, -1, 1);
    if (RQ > 0) {
        add_param(b, layer, NAME("q_a_layernorm.weight"), RQ, 0, TS_INIT_ONES, 0, -1, 1);
        add_param(b, layer, NAME("q_b_proj.weight"), H * HS, RQ, TS_INIT_NORMAL, std, 0, 1);
    }
    add_param(b, layer, NAME("kv_a_layernorm.weight"), RKV, 0, TS_INIT_ONES, 0, -1, 1);
    add_param(b, layer, NAME("kv_b_proj.weight"), H * KVB, RKV, TS_INIT_NORMAL, std, 0, 1);
    add_param(b, layer, NAME("o_proj.weight"), C, H * cfg->v_head_dim, TS_INIT_NORMAL, std, 1, 1);
#undef NAME
}

/* Hugging Face's LlamaDecoderLayer, Megatron's split: q, k, v and gate, up
 * column-parallel (by heads; a key/value head on kv_replicas ranks when tp >
 * n_kv_head), o_proj and down_proj row-parallel, the RMSNorm weights replicated. Every
 * matrix is normal(0, 0.02) (HF's initializer_range), the norms ones. */
static void add_llama_block_params(builder *b, int layer, int i, const ts_model_config *cfg)
{
    const ts_model *m = b->m;
    char name[96];
    const float std = 0.02f;
    const int64_t C = cfg->n_embd, HS = ts_model_head_dim(cfg);
    const int64_t Q = cfg->n_head * HS, KV = (int64_t)ts_model_kv_heads(cfg) * HS;
    const int kv_parts = m->tp.size / m->kv_replicas;
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix), name)
    add_param(b, layer, NAME("input_layernorm.weight"), C, 0, TS_INIT_ONES, 0, -1, 1);
    if (ts_model_is_mla(cfg)) {
        add_mla_params(b, layer, i, cfg);
        add_llama_mlp_params(b, layer, i, cfg);
        return;
    }
    const int q = add_param(b, layer, NAME("self_attn.q_proj.weight"), Q, C, TS_INIT_NORMAL, std, 0, 1);
    pack_after(b, q);
    const int k = add_param_parts(b, layer, NAME("self_attn.k_proj.weight"), KV, C, TS_INIT_NORMAL,
                                  std, 0, 1, kv_parts);
    pack_after(b, k);
    add_param_parts(b, layer, NAME("self_attn.v_proj.weight"), KV, C, TS_INIT_NORMAL, std, 0, 1,
                    kv_parts);
    add_param(b, layer, NAME("self_attn.o_proj.weight"), C, Q, TS_INIT_NORMAL, std, 1, 1);
    if (cfg->qk_norm) { /* Qwen3: replicated, as every norm */
        add_param(b, layer, NAME("self_attn.q_norm.weight"), HS, 0, TS_INIT_ONES, 0, -1, 1);
        add_param(b, layer, NAME("self_attn.k_norm.weight"), HS, 0, TS_INIT_ONES, 0, -1, 1);
    }
    add_llama_mlp_params(b, layer, i, cfg);
#undef NAME
}

/* Multi-token prediction's modules (model.h), added to the head's layer `layer` after
 * the head's own tensors, in DeepSeek-V3's checkpoint names (model.layers.{n_layer + k -
 * 1}.*): the block's tensors first (so its roles are block.h's from the module's
 * first_param), then enorm, hnorm, eh_proj [C, 2C] and shared_head.norm (mtp.c's
 * TS_MTP_* order). The norms are ones and eh_proj normal(0, 0.02) as every matrix;
 * all four replicated over tp (eh_proj runs on each rank's rows: mtp.c). The modules
 * read the token embedding: the embedding layer's on one stage, else a copy here, as
 * the tied head's (summed over the embedding group, counted and saved once). */
static void add_mtp_params(builder *b, int layer, const ts_model_config *cfg)
{
    ts_model *m = b->m;
    const int64_t C = cfg->n_embd;
    TS_ASSERT(m->arch == TS_ARCH_LLAMA);
    if (m->wte_param >= 0) {
        m->mtp_wte_param = m->wte_param;
    } else if (m->tied) {
        m->mtp_wte_param = m->head_wte_param;
    } else {
        m->mtp_wte_param = add_param(b, layer, "model.embed_tokens.weight", cfg->vocab_size, C,
                                     TS_INIT_NORMAL, 0.02f, 0, 1);
        m->params[m->mtp_wte_param].tied_copy = true;
        m->params[m->mtp_wte_param].shard.replica = 1; /* counted and saved once */
    }
    for (int k = 1; k <= m->mtp_layers; k++) {
        ts_layer *L = &m->layers[m->n_layers + k - 1];
        const int blk = cfg->n_layer + k - 1;
        L->first_param = m->n_params;
        add_llama_block_params(b, layer, blk, cfg);
        L->n_params = m->n_params - L->first_param;
        char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", blk, suffix), name)
        add_param(b, layer, NAME("enorm.weight"), C, 0, TS_INIT_ONES, 0, -1, 1);
        add_param(b, layer, NAME("hnorm.weight"), C, 0, TS_INIT_ONES, 0, -1, 1);
        add_param(b, layer, NAME("eh_proj.weight"), C, 2 * C, TS_INIT_NORMAL, 0.02f, -1, 1);
        add_param(b, layer, NAME("shared_head.norm.weight"), C, 0, TS_INIT_ONES, 0, -1, 1);
#undef NAME
    }
}

/* The tensor-parallel context the spec describes: its group (one rank by default) with
 * sequence parallelism and tp_overlap's sub-batches. */
static ts_tp spec_tp(const ts_model_spec *spec)
{
    const ts_tp group = spec->tp.size ? spec->tp : ts_tp_make(1, 0, NULL, spec->k);
    TS_ASSERT(group.k == spec->k);
    return ts_tp_overlap(ts_tp_sequence_parallel(group, spec->sequence_parallel),
                         spec->tp_overlap > 1 ? spec->tp_overlap : 1);
}

void ts_model_layout(ts_model *m, const ts_model_spec *spec)
{
    const ts_model_config *cfg = spec->arch;
    const ts_tp tps = spec_tp(spec), *tp = &tps;
    const bool *owned = spec->owned;
    memset(m, 0, sizeof *m);
    /* Whole heads per rank and at least one vocabulary row (ts_config_validate says so
     * to the user first). */
    const int kv = ts_model_kv_heads(cfg), F = ts_model_ffn(cfg);
    TS_ASSERT(tp->size >= 1 && cfg->n_head % tp->size == 0 && cfg->vocab_size >= tp->size);
    TS_ASSERT(cfg->n_head % kv == 0 && (kv % tp->size == 0 || tp->size % kv == 0));
    TS_ASSERT(F % tp->size == 0);
    /* A backend with an empty slot would crash mid-run: refuse it here. */
    TS_ASSERT(tp->k && ts_kernels_missing(tp->k) == NULL);
    m->tp = *tp;
    m->arch = ts_model_arch(cfg);
    TS_ASSERT(!spec->document_mask || spec->document_token >= 0);
    m->doc_token = spec->document_mask ? spec->document_token : -1;
    m->n_kv_head = kv;
    m->head_dim = ts_model_head_dim(cfg);
    m->rope_dim = m->head_dim;
    if (ts_model_is_mla(cfg)) {
        /* One key and value head per query head, of nope + rope channels, values of
         * v_head_dim; RoPE on the last qk_rope_head_dim, in DeepSeek's adjacent pairs. */
        m->mla_q_rank = cfg->q_lora_rank;
        m->mla_kv_rank = cfg->kv_lora_rank;
        m->mla_nope = cfg->qk_nope_head_dim;
        m->mla_v_dim = cfg->v_head_dim;
        m->head_dim = cfg->qk_nope_head_dim + cfg->qk_rope_head_dim;
        m->rope_dim = cfg->qk_rope_head_dim;
        m->rope_interleaved = true;
        TS_ASSERT(kv == cfg->n_head && !cfg->qk_norm && m->rope_dim % 2 == 0);
    }
    m->att_scale = (float)ts_model_att_scale(cfg);
    m->ffn_hidden = F;
    m->norm_eps = (float)cfg->norm_eps;
    /* qk_norm's weight gradients are each tp rank's heads' part, summed over tp once a
     * step (ts_model_sum_sequence_grads). */
    m->qk_norm = cfg->qk_norm;
    TS_ASSERT(!m->qk_norm || m->arch == TS_ARCH_LLAMA);
    if (cfg->moe_experts > 0) {
        /* Under tensor parallelism (without sub-batches) every tp rank routes the whole
         * rows, replicated, and runs the whole MoE without ep and etp, or sends its
         * share of the rows with them; under sequence parallelism its own rows (moe.c;
         * ts_config_validate refuses the rest). */
        TS_ASSERT(m->arch == TS_ARCH_LLAMA && tp->sub <= 1);
        m->moe_experts = cfg->moe_experts;
        m->moe_top_k = cfg->moe_top_k;
        m->moe_ffn = cfg->moe_ffn_hidden;
        m->moe_shared_ffn = cfg->moe_shared_experts * cfg->moe_ffn_hidden;
        m->moe_routing = (ts_moe_routing){
            .E = cfg->moe_experts, .K = cfg->moe_top_k, .groups = cfg->moe_groups,
            .topk_groups = cfg->moe_topk_groups, .sigmoid = !strcmp(cfg->moe_router, "sigmoid"),
            .norm_topk = cfg->moe_norm_topk, .route_scale = (float)cfg->moe_route_scale};
        /* The router's GEMMs run in fp32 whatever the activations (moe.c): on the fp32
         * table of the same backend (the table itself in fp32; NULL for a layout-only
         * table, which never runs). */
        m->moe_router_k = tp->k->act_dtype == TS_DTYPE_F32
                              ? tp->k
                              : ts_kernels_for(tp->k->device, "fp32", tp->k->attention);
        m->moe_z_coef = spec->moe_z_loss;
        m->moe_aux_coef = spec->moe_aux_loss;
        m->moe_capacity = cfg->moe_capacity;
        /* Expert parallelism: whole experts per ep rank (ts_config_validate says so to
         * the user first). */
        m->moe_ep = spec->ep && spec->ep->size > 1 ? spec->ep->size
                    : spec->ep_size > 1             ? spec->ep_size
                                                    : 1;
        m->moe_ep_rank = spec->ep && spec->ep->size > 1 ? spec->ep->rank
                         : m->moe_ep > 1                 ? spec->ep_rank
                                                         : 0;
        TS_ASSERT(cfg->moe_experts % m->moe_ep == 0 && m->moe_ep_rank < m->moe_ep);
        m->moe_local_experts = cfg->moe_experts / m->moe_ep;
        /* Expert tensor parallelism: whole F-slices per etp rank (the config says so). */
        m->moe_etp = spec->etp && spec->etp->size > 1 ? spec->etp->size
                     : spec->etp_size > 1               ? spec->etp_size
                                                        : 1;
        m->moe_etp_rank = spec->etp && spec->etp->size > 1 ? spec->etp->rank : 0;
        TS_ASSERT(cfg->moe_ffn_hidden % m->moe_etp == 0);
        m->moe_local_ffn = cfg->moe_ffn_hidden / m->moe_etp;
    }
    m->tied = ts_model_tied(cfg);
    m->local_heads = cfg->n_head / tp->size;
    m->kv_replicas = tp->size > kv ? tp->size / kv : 1;
    m->local_kv_heads = tp->size > kv ? 1 : kv / tp->size;
    m->local_ffn = F / tp->size;
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
    m->cp = spec->cp.size ? spec->cp : ts_cp_make(1, 0, NULL, tp->k, cfg->seq_len);
    TS_ASSERT(m->cp.k == m->k && m->cp.T <= m->max_seq_len);
    m->n_layers = cfg->n_layer + 2;
    m->mtp_layers = cfg->mtp_layers;
    m->mtp_coef = m->mtp_layers > 0 ? (float)(spec->mtp_loss / m->mtp_layers) : 0.0f;
    /* The modules' entries follow the pipeline's layers (model.h). */
    m->layers = ts_calloc((size_t)m->n_layers + (size_t)m->mtp_layers, sizeof *m->layers);
    m->layer_mem = ts_calloc((size_t)m->n_layers, sizeof *m->layer_mem);
    m->wte_param = m->head_wte_param = m->mtp_wte_param = -1;

    const int C = cfg->n_embd, V = cfg->vocab_size, T = cfg->seq_len;
    const bool llama = m->arch == TS_ARCH_LLAMA;
    const char *wte_name = llama ? "model.embed_tokens.weight" : "transformer.wte.weight";
    builder b = {.m = m};
    const int head = m->n_layers - 1;
    for (int k = 1; k <= m->mtp_layers; k++) { /* the modules' blocks (model.h) */
        const int blk = cfg->n_layer + k - 1;
        m->layers[head + k] = (ts_layer){
            .kind = TS_LAYER_BLOCK, .block = blk, .owned = owned ? owned[head] : true,
            .moe = ts_model_block_is_moe(cfg, blk),
            .selective = spec->selective_all || (spec->selective && spec->selective[head])};
        m->selective_recompute |= m->layers[head + k].selective;
    }
    for (int l = 0; l < m->n_layers; l++) {
        ts_layer *L = &m->layers[l];
        L->owned = owned ? owned[l] : true;
        L->kind = l == 0 ? TS_LAYER_EMBED : l == m->n_layers - 1 ? TS_LAYER_HEAD : TS_LAYER_BLOCK;
        L->block = L->kind == TS_LAYER_BLOCK ? l - 1 : -1;
        L->moe = L->kind == TS_LAYER_BLOCK && ts_model_block_is_moe(cfg, L->block);
        L->first_param = m->n_params;
        /* Selective recompute: the layer keeps no attention state (act_layout.h). */
        L->selective = spec->selective_all || (spec->selective && spec->selective[l]);
        m->selective_recompute |= L->selective;
        if (!L->owned) continue;
        switch (L->kind) {
        case TS_LAYER_EMBED:
            /* Vocab-parallel: each tp rank holds a slice of the vocabulary rows. */
            m->wte_param = add_param(&b, l, wte_name, V, C, TS_INIT_NORMAL, 0.02f, 0, 1);
            if (llama) break; /* rotary embeddings instead of learned positions */
            add_param(&b, l, "transformer.wpe.weight", T, C, TS_INIT_NORMAL, 0.02f, -1, 1);
            break;
        case TS_LAYER_BLOCK:
            if (llama)
                add_llama_block_params(&b, l, L->block, cfg);
            else
                add_block_params(&b, l, L->block, C, F, cfg->n_layer);
            break;
        case TS_LAYER_HEAD:
            if (llama) {
                add_param(&b, l, "model.norm.weight", C, 0, TS_INIT_ONES, 0, -1, 1);
            } else {
                add_param(&b, l, "transformer.ln_f.weight", C, 0, TS_INIT_ONES, 0, -1, 1);
                add_param(&b, l, "transformer.ln_f.bias", C, 0, TS_INIT_ZEROS, 0, -1, 1);
            }
            if (!m->tied) {
                /* Its own vocab-parallel matrix (Llama's default). */
                m->head_wte_param = add_param(&b, l, "lm_head.weight", V, C, TS_INIT_NORMAL,
                                              0.02f, 0, 1);
            } else if (m->wte_param >= 0) {
                m->head_wte_param = m->wte_param; /* tied: one tensor */
            } else {
                /* The last pipeline stage keeps its own copy of the tied embedding,
                 * initialised identically; gradients are summed over the embedding
                 * group so both copies stay equal (docs/ARCHITECTURE.md). */
                m->head_wte_param = add_param(&b, l, wte_name, V, C, TS_INIT_NORMAL, 0.02f, 0, 1);
                m->params[m->head_wte_param].tied_copy = true;
                m->params[m->head_wte_param].shard.replica = 1; /* counted and saved once */
            }
            if (m->mtp_layers > 0) add_mtp_params(&b, l, cfg);
            break;
        }
        L->n_params = m->n_params - L->first_param;
    }
    m->num_floats = b.offset;
}

/* YaRN's magnitude correction mscale(f, m) (transformers' yarn_get_mscale). */
static double yarn_mscale(double factor, double m)
{
    return factor <= 1.0 ? 1.0 : 0.1 * m * log(factor) + 1.0;
}

static bool rope_is_yarn(const ts_model_config *cfg)
{
    return cfg->rope_scaling > 0 && strcmp(cfg->rope_type, "yarn") == 0;
}

/* YaRN (transformers' _compute_yarn_parameters, the version that takes the original
 * context from original_max_position_embeddings = model.rope_original_context): the
 * dimensions whose wavelength fits fewer than beta_slow times into the original context
 * are interpolated (divided by the factor), those fitting more than beta_fast times kept,
 * a linear ramp between (the correction range floored and ceiled, "truncate"). */
static void yarn_inv_freq(const ts_model_config *cfg, double *inv, int dim)
{
    const double pi = 3.14159265358979323846, base = cfg->rope_theta,
                 factor = cfg->rope_scaling, ctx = cfg->rope_original_context;
    /* The dimension at which a frequency makes `rot` turns over the original context. */
#define CORRECTION_DIM(rot) (dim * log(ctx / ((rot) * 2.0 * pi)) / (2.0 * log(base)))
    double low = floor(CORRECTION_DIM(cfg->rope_beta_fast));
    double high = ceil(CORRECTION_DIM(cfg->rope_beta_slow));
#undef CORRECTION_DIM
    if (low < 0) low = 0;
    if (high > dim - 1) high = dim - 1;
    if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
    for (int i = 0; i < dim / 2; i++) {
        const double extrap = pow(base, -2.0 * i / dim), interp = extrap / factor;
        double ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const double keep = 1.0 - ramp; /* the extrapolation factor */
        inv[i] = interp * (1.0 - keep) + extrap * keep;
    }
}

double ts_rope_attention_factor(const ts_model_config *cfg)
{
    if (!rope_is_yarn(cfg)) return 1.0;
    const double f = cfg->rope_scaling;
    if (cfg->rope_mscale != 0 && cfg->rope_mscale_all_dim != 0)
        return yarn_mscale(f, cfg->rope_mscale) / yarn_mscale(f, cfg->rope_mscale_all_dim);
    return yarn_mscale(f, 1.0);
}

double ts_model_att_scale(const ts_model_config *cfg)
{
    const int hs = ts_model_is_mla(cfg) ? cfg->qk_nope_head_dim + cfg->qk_rope_head_dim
                                        : ts_model_head_dim(cfg);
    double scale = 1.0 / sqrt((double)hs);
    if (ts_model_is_mla(cfg) && rope_is_yarn(cfg) && cfg->rope_mscale_all_dim > 0) {
        const double ms = yarn_mscale(cfg->rope_scaling, cfg->rope_mscale_all_dim);
        scale *= ms * ms;
    }
    return scale;
}

void ts_rope_inv_freq(const ts_model_config *cfg, double *inv, int head_dim)
{
    const double pi = 3.14159265358979323846;
    if (rope_is_yarn(cfg)) {
        yarn_inv_freq(cfg, inv, head_dim);
        return;
    }
    for (int i = 0; i < head_dim / 2; i++) {
        double f = pow(cfg->rope_theta, -2.0 * i / head_dim);
        if (cfg->rope_scaling > 0) {
            /* Llama 3.1 (HF's _compute_llama3_parameters): wavelengths longer than the
             * original context / low_freq_factor are slowed by `factor`, shorter than
             * original / high_freq_factor kept, and the band between interpolated. */
            const double ctx = cfg->rope_original_context, lo = cfg->rope_low_freq_factor,
                         hi = cfg->rope_high_freq_factor, factor = cfg->rope_scaling;
            const double wavelen = 2.0 * pi / f;
            if (wavelen > ctx / lo) {
                f /= factor;
            } else if (wavelen >= ctx / hi) {
                const double smooth = (ctx / wavelen - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv[i] = f;
    }
}

/* cos and sin of t * inv[i] for every position the model may see, computed in double
 * and rounded once (Hugging Face computes them in fp32; the two agree to an ulp). */
static void build_rope_tables(ts_model *m, const ts_model_config *cfg)
{
    const int RD = m->rope_dim, half = RD / 2;
    const size_t n = (size_t)m->max_seq_len * half;
    double *inv = ts_malloc((size_t)half * sizeof *inv);
    float *c = ts_alloc_floats(n), *s = ts_alloc_floats(n);
    ts_rope_inv_freq(cfg, inv, RD);
    /* YaRN's attention factor scales both tables (1 otherwise: the same bits as before). */
    const double af = ts_rope_attention_factor(cfg);
    for (int t = 0; t < m->max_seq_len; t++)
        for (int i = 0; i < half; i++) {
            const double a = (double)t * inv[i];
            c[(size_t)t * half + i] = (float)(cos(a) * af);
            s[(size_t)t * half + i] = (float)(sin(a) * af);
        }
    m->rope_cos = m->k->dev_alloc(n * sizeof(float));
    m->rope_sin = m->k->dev_alloc(n * sizeof(float));
    m->k->memcpy_h2d(m->rope_cos, c, n * sizeof(float));
    m->k->memcpy_h2d(m->rope_sin, s, n * sizeof(float));
    free(inv);
    free(c);
    free(s);
}

/* Context parallelism: RoPE rotates local row t by its global position's angle, so the
 * tables become their rows at this rank's positions and the kernels index them by local
 * row. */
static void rope_tables_at_positions(ts_model *m)
{
    const ts_cp cp = m->cp;
    if (cp.size == 1 || !m->rope_cos) return;
    const int half = m->rope_dim / 2, Tl = ts_cp_local_len(&cp);
    float *tabs[2] = {m->rope_cos, m->rope_sin};
    for (int i = 0; i < 2; i++) {
        float *rows = m->k->dev_alloc((size_t)Tl * half * sizeof(float));
        ts_cp_positions_table(&cp, rows, tabs[i], half);
        /* Packed documents index the whole tables by restarted positions: kept. */
        if (m->doc_token < 0) m->k->dev_free(tabs[i]);
        tabs[i] = rows;
    }
    m->rope_cos = tabs[0];
    m->rope_sin = tabs[1];
}

/* MLA's [R, H*R] 0/1 matrix: row j has ones at columns h*R + j, so that
 * matmul_forward of the k heads' rope-part gradients [N, H*R] by it is their sum over
 * the heads [N, R] (the shared rope key's gradient), accumulated in fp32 and rounded once
 * whatever the activation type. */
static void build_mla_pe_sum(ts_model *m)
{
    const size_t R = (size_t)m->rope_dim, HR = (size_t)m->local_heads * R;
    float *w = ts_alloc_floats(R * HR);
    memset(w, 0, R * HR * sizeof *w);
    for (size_t j = 0; j < R; j++)
        for (size_t h = 0; h < (size_t)m->local_heads; h++) w[j * HR + h * R + j] = 1.0f;
    float *dev = m->k->dev_alloc(R * HR * sizeof(float));
    m->k->memcpy_h2d(dev, w, R * HR * sizeof(float));
    if (m->k->act_dtype == TS_DTYPE_F32) {
        m->mla_pe_sum = dev;
    } else {
        m->mla_pe_sum = m->k->dev_alloc(R * HR * ts_dtype_bytes(m->k->act_dtype));
        m->k->convert(m->mla_pe_sum, m->k->act_dtype, dev, TS_DTYPE_F32, R * HR);
        m->k->dev_free(dev);
    }
    free(w);
}

void ts_model_build(ts_model *m, const ts_model_spec *spec)
{
    ts_model_layout(m, spec);
    if (!spec->without_weights) {
        m->param_mem = m->k->dev_alloc(m->num_floats * sizeof(float));
        /* fp32 computes on the master weights; a narrower act_dtype gets its own copy. */
        m->compute_mem = m->k->act_dtype == TS_DTYPE_F32
                             ? (void *)m->param_mem
                             : m->k->dev_alloc(m->num_floats * ts_dtype_bytes(m->k->act_dtype));
    }
    if (!spec->without_grads) m->grad_mem = m->k->dev_alloc(m->num_floats * sizeof(float));
    ts_model_set_layer_mem(m, 0, m->n_layers, m->param_mem, m->grad_mem, m->compute_mem, 0);
    if (m->arch == TS_ARCH_LLAMA) {
        build_rope_tables(m, spec->arch);
        m->rope_cos_all = m->rope_cos;
        m->rope_sin_all = m->rope_sin;
        rope_tables_at_positions(m);
        if (m->doc_token < 0 || m->cp.size == 1) m->rope_cos_all = m->rope_sin_all = NULL;
    }
    if (m->mla_kv_rank > 0) build_mla_pe_sum(m);
    if (m->mtp_layers > 0) {
        m->mtp_sums = m->k->dev_alloc((size_t)m->mtp_layers * sizeof(double));
        m->k->memset_zero(m->mtp_sums, (size_t)m->mtp_layers * sizeof(double));
    }
    if (m->moe_experts > 0) { /* zeroed: no bias, no counts yet */
        const size_t n = (size_t)ts_model_blocks(m) * m->moe_experts;
        m->moe_bias = m->k->dev_alloc(n * sizeof(float));
        m->moe_counts = m->k->dev_alloc(n * sizeof(int));
        m->moe_losses = m->k->dev_alloc(2 * sizeof(float));
        if (m->moe_ep > 1) {
            TS_ASSERT(spec->ep && spec->ep->size == m->moe_ep);
            m->moe_dispatch = ts_calloc(1, sizeof *m->moe_dispatch);
            /* E % ep was checked by the layout (and the config, for the user). */
            const ts_status st = ts_expert_dispatch_init(m->moe_dispatch, spec->ep, m->k,
                                                         m->moe_experts, m->n_embd,
                                                         m->k->act_dtype);
            TS_ASSERT(st == TS_OK);
            /* Overlapped: MPI moves the exchanges in flight when tested, so every layer
             * boundary tests them (a partner action's layers too). */
            m->moe_dispatch->overlap = spec->ep_overlap;
            if (spec->ep_overlap)
                ts_model_add_between_layers(m, ts_expert_dispatch_progress, m->moe_dispatch);
        }
        if (m->moe_etp > 1) {
            TS_ASSERT(spec->etp && spec->etp->size == m->moe_etp);
            m->moe_expert_tp = ts_calloc(1, sizeof *m->moe_expert_tp);
            ts_expert_tp_init(m->moe_expert_tp, spec->etp, m->k, m->moe_local_experts,
                              m->n_embd, m->k->act_dtype);
        }
    }
}

void ts_model_set_layer_mem(ts_model *m, int l0, int l1, float *param, float *grad,
                            void *compute, size_t origin)
{
    for (int l = l0; l < l1; l++)
        m->layer_mem[l] = (ts_layer_mem){param, grad, compute, origin};
}

void ts_model_set_layer_grads(ts_model *m, int l0, int l1, float *grad, size_t origin)
{
    /* One origin per layer: the layer's views were set on its chunk's first float
     * (ts_model_set_layer_mem) before its gradient buffer comes and goes. */
    for (int l = l0; l < l1; l++) {
        TS_ASSERT(m->layer_mem[l].origin == origin);
        m->layer_mem[l].grad = grad;
    }
}

void ts_model_refresh_compute(const ts_model *m)
{
    if (m->param_mem && m->compute_mem != (void *)m->param_mem)
        m->k->convert(m->compute_mem, m->k->act_dtype, m->param_mem, TS_DTYPE_F32, m->num_floats);
}

void ts_model_free(ts_model *m)
{
    free(m->layers);
    free(m->layer_mem);
    free(m->params);
    if (m->k) {
        m->k->dev_free(m->moe_bias);
        m->k->dev_free(m->moe_counts);
        m->k->dev_free(m->moe_losses);
        m->k->dev_free(m->mtp_sums);
        if (m->moe_dispatch) {
            ts_expert_dispatch_free(m->moe_dispatch);
            free(m->moe_dispatch);
        }
        if (m->moe_expert_tp) {
            ts_expert_tp_free(m->moe_expert_tp);
            free(m->moe_expert_tp);
        }
        if (m->compute_mem != (void *)m->param_mem) m->k->dev_free(m->compute_mem);
        m->k->dev_free(m->param_mem);
        m->k->dev_free(m->grad_mem);
        m->k->dev_free(m->rope_cos);
        m->k->dev_free(m->rope_sin);
        m->k->dev_free(m->rope_cos_all);
        m->k->dev_free(m->rope_sin_all);
        m->k->dev_free(m->mla_pe_sum);
    }
    memset(m, 0, sizeof *m);
}

/* Block l's MLP parameters: the dense SwiGLU's, or the MoE's (all experts, or those a
 * token uses: `active`). */
static size_t mlp_params(const ts_model_config *c, int l, bool active)
{
    const size_t C = (size_t)c->n_embd;
    if (!ts_model_block_is_moe(c, l)) return 3 * (size_t)ts_model_ffn(c) * C;
    const size_t E = (size_t)c->moe_experts, F = (size_t)c->moe_ffn_hidden;
    const size_t used = active ? (size_t)c->moe_top_k : E;
    return E * C + used * 3 * F * C + 3 * (size_t)c->moe_shared_experts * F * C;
}

size_t ts_model_active_params(const ts_model_config *c)
{
    size_t total = ts_model_logical_params(c);
    for (int l = 0; l < c->n_layer + c->mtp_layers; l++)
        total -= mlp_params(c, l, false) - mlp_params(c, l, true);
    return total;
}

size_t ts_model_mla_attention_params(const ts_model_config *c)
{
    const size_t C = (size_t)c->n_embd, H = (size_t)c->n_head, RQ = (size_t)c->q_lora_rank,
                 RKV = (size_t)c->kv_lora_rank, R = (size_t)c->qk_rope_head_dim,
                 NOPE = (size_t)c->qk_nope_head_dim, VD = (size_t)c->v_head_dim;
    const size_t q = RQ > 0 ? RQ * C + RQ + H * (NOPE + R) * RQ : H * (NOPE + R) * C;
    return q + (RKV + R) * C + RKV + H * (NOPE + VD) * RKV + C * H * VD;
}

size_t ts_model_logical_params(const ts_model_config *c)
{
    const size_t C = (size_t)c->n_embd, F = (size_t)ts_model_ffn(c), V = (size_t)c->vocab_size;
    const size_t head = ts_model_tied(c) ? 0 : V * C;
    if (ts_model_arch(c) == TS_ARCH_LLAMA) {
        /* Two norms and the attention: multi-head latent attention's projections, or
         * grouped-query attention's (with Qwen3's q_norm and k_norm). */
        size_t attn = 2 * C;
        if (ts_model_is_mla(c)) {
            attn += ts_model_mla_attention_params(c);
        } else {
            const size_t HS = (size_t)ts_model_head_dim(c), Q = (size_t)c->n_head * HS,
                         KV = (size_t)ts_model_kv_heads(c) * HS;
            attn += Q * C + 2 * KV * C + C * Q + (c->qk_norm ? 2 * HS : 0);
        }
        size_t blocks = 0;
        for (int l = 0; l < c->n_layer; l++) blocks += attn + mlp_params(c, l, false);
        /* Multi-token prediction's modules: a block each, enorm, hnorm, shared_head.norm
         * and eh_proj [C, 2C] (the embedding and head they share counted once). */
        for (int l = c->n_layer; l < c->n_layer + c->mtp_layers; l++)
            blocks += attn + mlp_params(c, l, false) + 3 * C + 2 * C * C;
        return V * C + blocks + C + head;
    }
    size_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) +
                       (F * C + C);
    return V * C + (size_t)c->seq_len * C + (size_t)c->n_layer * per_block + 2 * C + head;
}

/* Parameter p into the host staging buffer w (its numel floats), then to the device. */
static void init_param(ts_model *m, int p, uint64_t seed, float *w)
{
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

void ts_model_init_random(ts_model *m, uint64_t seed)
{
    /* Drawn on the host into a staging buffer, then one copy per parameter to the
     * device (parameters are device memory: kernels.h). */
    size_t most = 0;
    for (int p = 0; p < m->n_params; p++) most = m->params[p].numel > most ? m->params[p].numel : most;
    float *w = ts_alloc_floats(most ? most : 1);
    for (int p = 0; p < m->n_params; p++)
        if (m->layer_mem[m->params[p].layer].param) /* ZeRO-3: else another chunk's turn */
            init_param(m, p, seed, w);
    free(w);
    ts_model_refresh_compute(m);
}

void ts_model_init_param_random(ts_model *m, int p, uint64_t seed)
{
    TS_ASSERT(m->layer_mem[m->params[p].layer].param);
    float *w = ts_alloc_floats(m->params[p].numel ? m->params[p].numel : 1);
    init_param(m, p, seed, w);
    free(w);
}
