/* A transformer language model as an ordered list of layers, in two architectures that
 * share the list, the kernels, the parallelism and the files (model.arch):
 *   gpt2 (nanoGPT semantics)                  llama (Hugging Face's LlamaForCausalLM)
 *   layer 0            embedding   transformer.wte, .wpe      model.embed_tokens
 *   layers 1..n_layer  blocks      transformer.h.{i}.*        model.layers.{i}.*
 *   layer n_layer+1    head        transformer.ln_f, LM head  model.norm, lm_head, loss
 *                                  tied to wte by default     (untied by default)
 * A gpt2 block is LayerNorm, attention with biases, GELU MLP; a llama block is RMSNorm,
 * grouped-query attention with rotary embeddings and no biases, SwiGLU MLP. Each
 * parameter carries its logical (checkpoint) name.
 * A rank builds the model for the layers it owns (all of them on one rank; its pipeline
 * chunks' ranges otherwise: pipeline/partition.h). Parameters and gradients live in two flat buffers laid out
 * layer by layer (the AdamW moments belong to the optimizer, optim/optim.h); a ts_param
 * is a view with its logical name and shape, which is all that initialisation,
 * clipping and checkpoints need. */
#ifndef TS_MODEL_H
#define TS_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "core/error.h"
#include "kernels/kernels.h"
#include "tensor/cp.h"
#include "tensor/expert_dispatch.h"
#include "tensor/expert_tp.h"
#include "tensor/shard.h"
#include "tensor/tp.h"

typedef enum { TS_LAYER_EMBED, TS_LAYER_BLOCK, TS_LAYER_HEAD } ts_layer_kind;

typedef enum {
    TS_INIT_NORMAL, /* normal(0, init_std) */
    TS_INIT_ZEROS,
    TS_INIT_ONES,
} ts_init_kind;

/* A parameter is a view into the flat buffers plus its shard spec (tensor/shard.h):
 * which part of which logical (unsharded, nanoGPT-named) tensor this rank holds. */
typedef struct {
    ts_shard_spec shard;    /* logical name and shape, split, this rank's part, replica */
    size_t offset, numel;   /* view into the flat buffers; numel is the local count */
    int layer;              /* owning layer index */
    bool decay;             /* weight decay applies (2-D tensors) */
    bool tied_copy;         /* the last stage's copy of the tied embedding (replica 1) */
    bool expert;            /* a routed expert's tensor: under expert parallelism this
                               rank's alone among its ep group, reduced over edp */
    ts_init_kind init;
    float init_std;
} ts_param;

typedef struct {
    ts_layer_kind kind;
    int block;              /* block index for TS_LAYER_BLOCK, else -1 */
    bool owned;             /* this rank holds the layer */
    int first_param, n_params;
    /* Selective recompute (a block; ts_model_spec.selective):
     * the layer keeps no attention state for its backward (its activation layout drops
     * `att`), and its backward runs attention_forward again into the scratch first. */
    bool selective;
    bool moe;               /* a block whose MLP is the Mixture of Experts (model/moe.c;
                               config.h ts_model_block_is_moe) */
} ts_layer;

/* Indices of a gpt2 block's parameters relative to its first_param, in nanoGPT order. */
enum {
    TS_B_LN1_W, TS_B_LN1_B, TS_B_QKV_W, TS_B_QKV_B, TS_B_ATTPROJ_W, TS_B_ATTPROJ_B,
    TS_B_LN2_W, TS_B_LN2_B, TS_B_FC_W, TS_B_FC_B, TS_B_FCPROJ_W, TS_B_FCPROJ_B,
    TS_B_NPARAMS
};
/* A llama block's, in Hugging Face's order. q, k and v lie back to back in the flat
 * buffers (no padding between them), and so do gate and up: each group is one
 * [rows, C] weight for one GEMM, whose output row is [q | k | v] (the attention's
 * layout) or [gate | up] (SwiGLU's). */
enum {
    TS_L_ATTN_NORM_W, TS_L_Q_W, TS_L_K_W, TS_L_V_W, TS_L_O_W, TS_L_MLP_NORM_W, TS_L_GATE_W,
    TS_L_UP_W, TS_L_DOWN_W, TS_L_NPARAMS
};
/* With model.qk_norm (Qwen3) two more follow o_proj, in Hugging Face's order (q_norm,
 * k_norm [head_dim] each), and the indices from TS_L_MLP_NORM_W on move up by two:
 * model/block.h's ts_block_roles says where each one is. */

typedef struct {
    float *param, *grad;    /* fp32 master weights and gradients of the layer's floats */
    void *compute;          /* its compute copy (act_dtype), == param for fp32 */
    size_t origin;          /* the float of the layout that param[0] (grad[0], ...) is */
} ts_layer_mem;

/* The most between-layers hooks a model calls (the reducer's, the shard owner's and the
 * expert exchange's progress). */
#define TS_MODEL_BETWEEN_LAYERS_MAX 3

typedef struct {
    ts_arch arch;
    int n_layer, n_head, n_embd, vocab_size, max_seq_len;
    int n_kv_head;          /* key/value heads (n_head for gpt2) */
    int head_dim;           /* channels per head (model.head_dim; n_embd / n_head unless set) */
    int ffn_hidden;         /* MLP hidden width F */
    float norm_eps;         /* RMSNorm's (llama); gpt2's LayerNorm kernels use 1e-5 */
    bool qk_norm;           /* Qwen3: each q and k head RMSNorm'd (weights q_norm, k_norm
                               [head_dim]) before RoPE (model.qk_norm; attention.c) */
    bool tied;              /* the LM head is the token embedding */
    /* Some layer is selective (ts_layer.selective): the backward
     * scratch then holds one layer's rebuilt attention state and output
     * (ts_scratch_bytes, ts_scratch_attention_work). */
    bool selective_recompute;

    /* Tensor parallelism (tensor/tp.h): this rank holds n_head/tp query heads,
     * local_kv_heads key/value heads (n_kv_head/tp, or 1 replicated on kv_replicas =
     * tp/n_kv_head ranks when tp > n_kv_head), F/tp MLP columns and the vocabulary rows
     * [vocab_start, vocab_start + local_vocab) (a balanced split: vocab_size need not
     * divide by tp). tp.size == 1: the whole model. */
    ts_tp tp;
    /* Context parallelism (tensor/cp.h; ts_model_spec.cp): this rank's
     * micro-batches hold cp.T / cp.size positions of each sequence, a->T of its
     * activations. size 1 (the default): whole sequences. */
    ts_cp cp;
    int local_heads, local_kv_heads, kv_replicas, local_ffn, local_vocab, vocab_start;

    /* Rotary embeddings (llama; NULL for gpt2): cos and sin of position t times inverse
     * frequency i, [max_seq_len, rope_dim/2] fp32 in device memory, computed once (times
     * YaRN's attention factor under model.rope_type = "yarn"). RoPE rotates the last
     * rope_dim channels of each q and k head (head_dim, or MLA's qk_rope_head_dim), in
     * adjacent pairs when rope_interleaved (DeepSeek's checkpoints), else in halves. */
    float *rope_cos, *rope_sin;
    /* Packed documents (data.document_mask; docs/ARCHITECTURE.md "Packed documents"):
     * doc_token, the id that starts a document (-1: off); RoPE's whole tables [max_seq_len,
     * rope_dim/2] at global positions, which the restarted positions index (rope_cos
     * itself without context parallelism; under it a copy kept beside the local rows,
     * owned). */
    int doc_token;
    float *rope_cos_all, *rope_sin_all;
    int rope_dim;
    bool rope_interleaved;
    float att_scale;        /* attention's softmax scale: 1/sqrt(head_dim), times YaRN's
                               mscale^2 under MLA (ts_model_att_scale) */

    /* Multi-head latent attention (model/mla.c; mla_kv_rank 0: none): the q latent's rank
     * (0: a plain q_proj), the k/v latent's, each head's no-RoPE q/k channels and its
     * value channels (head_dim is then qk_nope + qk_rope, n_kv_head n_head); mla_pe_sum
     * [rope_dim, local_heads * rope_dim] in act_dtype, the 0/1 matrix whose product sums
     * the k heads' rope-part gradients into the shared rope key's (one fp32-accumulated
     * GEMM), owned. */
    int mla_q_rank, mla_kv_rank, mla_nope, mla_v_dim;
    void *mla_pe_sum;

    /* Mixture of Experts (model/moe.c; moe_experts 0: none): the routing, the experts'
     * width F and the shared experts' S*F, the auxiliary losses' coefficients, and the
     * per-step state in device memory, indexed by block: the balancing bias
     * [blocks * E] fp32 (zero unless train.moe_bias_rate moves it; selection only), the
     * step's routed-token counts [blocks * E] int (each forward adds its own) and the
     * step's loss sums [2] fp32 (z, aux: each backward adds its micro-batch's). */
    int moe_experts, moe_top_k, moe_ffn, moe_shared_ffn;
    /* Expert parallelism (ts_model_spec.ep): this rank holds the moe_local_experts =
     * E / moe_ep global experts [moe_ep_rank * moe_local_experts, ...) of every MoE block
     * (moe_ep 1: all of them) and exchanges rows with the others through moe_dispatch
     * (tensor/expert_dispatch.h; owned, NULL for one rank or a layout only; the plans
     * are the calls' own, the exchanges in flight and their times written through the
     * pointer by a const model's forward and backward). */
    int moe_ep, moe_ep_rank, moe_local_experts;
    ts_expert_dispatch *moe_dispatch;
    /* Expert tensor parallelism (ts_model_spec.etp): each local expert's hidden width is
     * split over the moe_etp ranks of the etp group, this rank holding the moe_local_ffn
     * = F / moe_etp columns [moe_etp_rank * moe_local_ffn, ...) (its gate and up rows,
     * its down columns); the rows of the group are gathered and the partial outputs
     * summed through moe_expert_tp (tensor/expert_tp.h; owned, NULL when moe_etp is 1). */
    int moe_etp, moe_etp_rank, moe_local_ffn;
    ts_expert_tp *moe_expert_tp;
    ts_moe_routing moe_routing;
    /* The backend's fp32 table (k itself in an fp32 run), which the router's GEMMs run
     * on: its logits are fp32 from the fp32 master weight and the widened rows
     * (Megatron's moe_router_dtype = "fp32", DeepSeek-V3's gate). */
    const ts_kernels *moe_router_k;
    float moe_z_coef, moe_aux_coef;
    float *moe_bias, *moe_losses;
    int *moe_counts;
    /* model.moe_capacity: 0 dropless, else the capacity factor (moe.c: per sequence;
     * the step's counts above are then the kept assignments). */
    double moe_capacity;

    int n_layers;           /* n_layer + 2 */
    /* Multi-token prediction (model/mtp.c; mtp_layers 0: none): D = mtp_layers modules
     * after the last block, all in the head's layer (its parameters and activations, so
     * a pipeline's last stage holds them with the head). Module k (1..D) runs a block of
     * the model's kind, described by layers[n_layers + k - 1] (kind TS_LAYER_BLOCK,
     * block n_layer + k - 1, owned with the head; its parameters' `layer` is the
     * head's): `layers` has n_layers + D entries, of which the pipeline, the memory
     * views and every loop over n_layers see the first n_layers. mtp_coef = lambda / D
     * (train.mtp_loss / D) weighs each depth's loss; mtp_wte_param: the token embedding
     * the modules read (wte_param on one stage, else the head's copy, as the tied one);
     * mtp_sums [D] doubles in device memory: each depth's summed per-token losses since
     * ts_model_mtp_begin. */
    int mtp_layers;
    float mtp_coef;
    int mtp_wte_param;
    double *mtp_sums;
    ts_layer *layers;
    int n_params;
    ts_param *params;
    int wte_param;          /* index of the embedding layer's token embedding, or -1 */
    int head_wte_param;     /* index of the LM head's weight: the token embedding (== wte_param
                             * when tied on one stage, its copy on the last stage) or, untied,
                             * lm_head.weight; -1 without the head */

    size_t num_floats;      /* floats in each flat buffer */
    float *param_mem, *grad_mem;
    /* Where each layer's parameters, gradients and compute weights are ([n_layers]):
     * views of param_mem, grad_mem and compute_mem (origin 0) by default. ZeRO-2 and 3
     * (data/zero.h) hold no full-size gradient buffer (and ZeRO-3 no full weights):
     * a chunk's layers then point into the chunk's own buffers while they exist (origin:
     * the chunk's first float in this layout) and are NULL otherwise. */
    ts_layer_mem *layer_mem;
    /* The weights the matmuls read, in k->act_dtype, laid out as param_mem: param_mem
     * itself for fp32; a bf16 copy, owned, made from it by ts_model_refresh_compute once
     * per optimizer step (llm.c's and Megatron's bf16 weights beside fp32 masters). */
    void *compute_mem;

    const ts_kernels *k;
    /* Called after every layer of every forward and backward pass, in the order added
     * (ts_model_add_between_layers; unused slots NULL): the data-parallel reduction
     * (data/reducer.h) polls its requests here and ZeRO-3 (data/zero.h) its weight
     * gathers, so they advance during compute (MPI without asynchronous progress moves
     * only inside MPI calls). */
    struct ts_between_layers {
        void (*fn)(void *ctx);
        void *ctx;
    } between_layers[TS_MODEL_BETWEEN_LAYERS_MAX];
} ts_model;

/* What to build: the architecture and everything parallelism changes in the layout, one
 * rank's view, in one value (Megatron's ModuleSpec, torchtitan's parallel dims): nothing
 * is set on the model after it is built, so every layout (parameters, activations,
 * scratch) is sized once from all of it. A zero field is the default: every layer, one
 * tensor-parallel rank without sequence parallelism or sub-batches, no context
 * parallelism, no selective recompute, full-size weights and gradients. */
typedef struct {
    const ts_model_config *arch; /* the architecture and its sizes (required) */
    const ts_kernels *k;         /* the backend (required) */
    const bool *owned;           /* [n_layer + 2] the layers this rank holds (its pipeline
                                    chunks': pipeline/partition.h); NULL: all */
    /* Tensor parallelism (tensor/tp.h): this rank's group (size 0: one rank; comm NULL
     * for a layout only), on which the layers run their collectives. Its sp and sub come
     * from the two fields after it. */
    ts_tp tp;
    bool sequence_parallel;      /* parallel.sequence_parallel (needs tp.size > 1) */
    int tp_overlap;              /* parallel.tp_overlap: sub-batches a block runs in
                                    (0 or 1: none; tensor/phase_runner.h) */
    /* Context parallelism (tensor/cp.h): this rank's group (size 0: none; comm NULL for
     * a layout only): the layouts gain the gathered keys and values, and RoPE's tables
     * (llama) hold this rank's positions' rows. */
    ts_cp cp;
    /* Selective recompute (ts_layer.selective): every layer (parallel.recompute =
     * "selective"), or the layers marked in `selective` ([n_layer + 2]; "auto" marks the
     * chunks its memory check chose: pipeline/memory.h). Only blocks keep attention
     * state; the flag of an embedding or head changes nothing but the scratch. */
    bool selective_all;
    const bool *selective;
    /* The full-size flat buffers the caller does not keep (the layer views of what is
     * not allocated are NULL): ZeRO-2 keeps no full gradients, ZeRO-3 no full weights
     * (nor their compute copy) either (data/zero.h). */
    bool without_weights, without_grads;
    /* The MoE auxiliary losses' coefficients (train.moe_z_loss, train.moe_aux_loss). */
    float moe_z_loss, moe_aux_loss;
    /* train.mtp_loss: lambda, multi-token prediction's weight (model.mtp_layers > 0). */
    double mtp_loss;
    /* Expert parallelism: the ep group (topology's groups->ep; NULL or size 1: every rank
     * holds every expert) and this rank's place in it (ep_size, ep_rank for a layout
     * without a group: ep_size 0 means the group's size). */
    const ts_comm *ep;
    int ep_size, ep_rank;
    /* parallel.ep_overlap: the ep exchange non-blocking, overlapped with the layer's
     * independent compute and a partner action (tensor/expert_dispatch.h), polled
     * between layers; false: blocking. */
    bool ep_overlap;
    /* Expert tensor parallelism: the etp group (groups->etp; NULL or size 1: whole
     * experts) and, for a layout without a group, its size (etp_size; this rank's slice
     * is as large as any other's). */
    const ts_comm *etp;
    int etp_size;
    /* data.document_mask: the document token (ts_config_document_token); -1 (or 0 in a
     * spec that does not set it together with document_mask false): plain causal. */
    bool document_mask;
    int document_token;
} ts_model_spec;

/* Blocks of the model, the multi-token prediction modules' included (n_layer + D): the
 * rows of the MoE state arrays (moe_bias, moe_counts: "blocks * E" below). */
static inline int ts_model_blocks(const ts_model *m) { return m->n_layer + m->mtp_layers; }
/* The layer of block b (b < ts_model_blocks): 1 + b, or an MTP module's entry (model.h). */
static inline int ts_model_block_layer(const ts_model *m, int b)
{
    return b < m->n_layer ? b + 1 : m->n_layers + (b - m->n_layer);
}

/* Add a between-layers hook (each owner adds its own, once). */
static inline void ts_model_add_between_layers(ts_model *m, void (*fn)(void *ctx), void *ctx)
{
    int i = 0;
    while (i < TS_MODEL_BETWEEN_LAYERS_MAX && m->between_layers[i].fn) i++;
    TS_ASSERT(i < TS_MODEL_BETWEEN_LAYERS_MAX);
    m->between_layers[i] = (struct ts_between_layers){fn, ctx};
}


/* Build the layer and parameter lists for the spec's owned layers and allocate the flat
 * buffers it keeps (zeroed) and RoPE's tables. */
void ts_model_build(ts_model *m, const ts_model_spec *spec);

/* The same layout (layers, parameters, shard specs, num_floats, every act_layout size)
 * without allocating or initialising anything: what a rank would hold, for the memory
 * estimate and the planner (tp and cp may be layout-only contexts, without comm). */
void ts_model_layout(ts_model *m, const ts_model_spec *spec);
void ts_model_free(ts_model *m);

static inline float *ts_param_data(const ts_model *m, int p)
{
    const ts_layer_mem *L = &m->layer_mem[m->params[p].layer];
    return L->param + (m->params[p].offset - L->origin);
}
static inline float *ts_param_grad(const ts_model *m, int p)
{
    const ts_layer_mem *L = &m->layer_mem[m->params[p].layer];
    return L->grad + (m->params[p].offset - L->origin);
}
/* Parameter p's compute copy (act_dtype elements; the matmuls' `weight`). */
static inline const void *ts_param_compute(const ts_model *m, int p)
{
    const ts_layer_mem *L = &m->layer_mem[m->params[p].layer];
    return (const unsigned char *)L->compute +
           (m->params[p].offset - L->origin) * ts_dtype_bytes(m->k->act_dtype);
}
/* Point layers [l0, l1) at buffers whose element 0 is float `origin` of the layout
 * (NULL buffers: the layers' memory is not there now). */
void ts_model_set_layer_mem(ts_model *m, int l0, int l1, float *param, float *grad,
                            void *compute, size_t origin);
/* Only the gradients of layers [l0, l1), whose views already start at `origin`. */
void ts_model_set_layer_grads(ts_model *m, int l0, int l1, float *grad, size_t origin);
/* Make the compute copy equal the master weights (rounded): after every change of
 * param_mem (initialisation, load, the optimizer step) and before the next forward.
 * Nothing to do for fp32, nor without full-size weights (ZeRO-3 converts each chunk's
 * gathered weights). */
void ts_model_refresh_compute(const ts_model *m);
static inline const char *ts_param_name(const ts_model *m, int p)
{
    return m->params[p].shard.name;
}

/* Initialise every owned parameter by index from `seed` (docs/CONTRACT.md "Model"): element
 * i of logical tensor t is drawn from (seed, t, i), so any grid matches one rank. Loading
 * model.init from a file is checkpoint code (checkpoint/load.h). */
void ts_model_init_random(ts_model *m, uint64_t seed);
/* Parameter p alone, as ts_model_init_random draws it (its memory must be there):
 * model.init_upcycle's routers, which a dense model has none of. */
void ts_model_init_param_random(ts_model *m, int p, uint64_t seed);

/* Rotary embeddings' inverse frequencies inv[i], i < head_dim/2 (head_dim: the rotated
 * channels), as Hugging Face computes them: rope_theta^(-2i/head_dim), with Llama 3.1's
 * scaling or YaRN's (model.rope_type) when cfg->rope_scaling > 0 (in double). */
void ts_rope_inv_freq(const ts_model_config *cfg, double *inv, int head_dim);
/* The factor RoPE's cos and sin tables are multiplied by: YaRN's attention factor
 * (transformers' _compute_yarn_parameters: mscale(f, mscale) / mscale(f, mscale_all_dim)
 * when both are set, else mscale(f, 1), mscale(f, m) = 0.1 m ln f + 1 for f > 1), 1
 * otherwise. */
double ts_rope_attention_factor(const ts_model_config *cfg);
/* Attention's softmax scale: 1/sqrt(q/k head channels), under MLA with YaRN times
 * mscale(factor, mscale_all_dim)^2 when mscale_all_dim > 0 (transformers'
 * yarn_apply_mscale, DeepSeek's softmax_scale; a llama without MLA keeps 1/sqrt). */
double ts_model_att_scale(const ts_model_config *cfg);

/* ---- multi-token prediction, per optimizer step (model/mtp.c) ---- */
/* Zero the depths' loss sums: before the step's first forward (nothing without MTP). */
void ts_model_mtp_begin(const ts_model *m);
/* The depths' summed per-token losses [mtp_layers] on this rank since the begin (0
 * where this rank holds no head); the caller sums them over the grid. */
void ts_model_mtp_read(const ts_model *m, double *sums);

/* Total logical parameters of the model (tied wte counted once; multi-token prediction's
 * modules included, the embedding and head they share counted once). */
size_t ts_model_logical_params(const ts_model_config *cfg);
/* One block's multi-head latent attention parameters (model.kv_lora_rank > 0), its
 * input norm aside: q_a_proj [q_lora_rank, C] + q_a_layernorm + q_b_proj [H (nope +
 * rope), q_lora_rank] (or q_proj [H (nope + rope), C] without a q latent),
 * kv_a_proj_with_mqa [kv_lora_rank + rope, C] + kv_a_layernorm, kv_b_proj [H (nope +
 * v), kv_lora_rank], o_proj [C, H v] (DeepSeek-V3: 187,107,328 of 7168 + this per
 * block). */
size_t ts_model_mla_attention_params(const ts_model_config *cfg);
/* Those one token uses: an MoE block's router, its top_k experts and its shared ones,
 * not all its experts (equal to the total for a dense model). */
size_t ts_model_active_params(const ts_model_config *cfg);

/* ---- Mixture of Experts, per optimizer step (model/moe.c) ---- */
/* Zero the step's counts and loss sums: before the step's first forward. */
void ts_model_moe_begin(const ts_model *m);
/* After the step's last backward: the step's counts and loss sums of this rank's blocks,
 * on the host: counts [blocks * E] (blocks this rank does not hold, and dense ones, 0)
 * and losses [2] (z, aux). The caller sums them over the ranks that saw other tokens. */
void ts_model_moe_read(const ts_model *m, int *counts, float *losses);
/* The aux-loss-free bias update from the whole global batch's counts [blocks * E]:
 * bias_i += rate * sign(mean - count_i) per MoE block, mean = the block's counts' mean
 * (tokens * top_k / E dropless; the kept assignments' under a capacity). */
void ts_model_moe_update_bias(ts_model *m, const int *counts, long long tokens, float rate);
/* The worst MoE block's max/mean expert load of counts [blocks * E] (1 = balanced). */
double ts_moe_worst_load(const ts_model *m, const int *counts);
/* The share of the step's assignments dropped by the capacity (model.moe_capacity): 1 -
 * the kept counts [blocks * E] of the MoE blocks over their tokens * top_k selections
 * each (the global batch's tokens; 0 dropless). */
double ts_moe_dropped_share(const ts_model *m, const int *counts, long long tokens);

/* ---- activations of one micro-batch through a contiguous range of layers ----
 * Their layout (every saved buffer of a layer, its size and element type) is written
 * once, in act_layout.h; ts_layer_act_bytes gives it without a model, for estimates, for
 * the activation dtype and attention of table k. Activation buffers (`void *`) hold
 * k->act_dtype elements (kernels/kernels.h). */
size_t ts_layer_act_bytes(const ts_model_config *cfg, ts_layer_kind kind, int B, int T, int tp,
                          int tp_rank, const ts_kernels *k);

typedef struct {
    int l0, l1;             /* layers [l0, l1) */
    int B, T;               /* T: the positions of each sequence this rank holds (under
                             * context parallelism cp.T / cp.size) */
    int *tokens, *targets;  /* [B*T], owned */
    int *mtp_ids;           /* multi-token prediction, when the range ends with the head:
                             * [2 D][B*T], depth k's (1..D) input ids t_{i+k} at
                             * 2(k-1) and its targets t_{i+k+1} at 2(k-1)+1, owned
                             * (ts_acts_set_mtp_ids); NULL otherwise */
    int *mtp_host;          /* with mtp_ids: host scratch of ts_acts_set_mtp_ids, [B *
                             * T * cp + B * T] (the whole sequences, then this rank's
                             * rows), owned; mtp_whole_cap the first part's ints */
    size_t mtp_whole_cap;
    int *mtp_runs;          /* with mtp_ids: each depth's rows past the window (zeroed
                             * after its loss), found once: [D + 1] offsets into the
                             * (first row, rows) pairs after them, owned */
    const void *input;      /* [B*T, C] chunk input when l0 > 0 (not owned) */
    float dloss;            /* the last forward's weight per target (1 / targets in the
                             * global batch): the MoE auxiliary losses' scale */
    unsigned char *mem;     /* all layers' saved activations, owned */
    size_t *layer_off;      /* per layer in [l0,l1): byte offset into mem */
    size_t bytes;
    void *wstash;           /* matmul output gradients between the I and W passes */
    void *att_work;         /* selective recompute: where the forwards write attention's
                             * state, used and dropped within the block (not owned; the
                             * backward scratch's, idle during a forward:
                             * ts_scratch_attention_work) */
    void *sp_work;          /* sequence parallelism: [N, C] where the forwards gather a
                             * norm's rows and sum a row-parallel linear's (not owned; the
                             * scratch's: ts_scratch_sequence_work) */
    void *cp_work;          /* context parallelism: where the forwards gather keys and
                             * values and lay out position rows (not owned; the
                             * scratch's: ts_scratch_context_work) */
    void *mla_work;         /* multi-head latent attention: where the forwards assemble
                             * q|k|v (not owned; the scratch's: ts_scratch_mla_work) */
    const ts_kernels *k;    /* the backend whose device memory tokens, targets, mem and
                             * wstash are */
    /* Packed documents (m->doc_token >= 0; model/documents.c, set per micro-batch by
     * ts_acts_set_documents; NULL otherwise): doc_start [B*T] int32, each local query's
     * first visible key in the attention's key coordinates (kernels.h ts_att_heads; under
     * context parallelism the gathered sequence's positions); doc_cos, doc_sin [B*T,
     * rope_dim/2] RoPE's rows at each local row's restarted position (llama); doc_wpe
     * [B*T, C] fp32 where the embedding's forward gathers gpt2's position rows (a range
     * with the embedding). Device memory, owned. On the host: doc_seg, n_doc_seg runs
     * (local row, rows, restarted position of the first) of consecutive local rows at
     * consecutive positions of one document (the embedding's gathers and backward), and
     * doc_pairs, the query-key pairs attention computes over the micro-batch's whole
     * sequences (MFU's count). */
    int *doc_start;
    float *doc_cos, *doc_sin, *doc_wpe;
    int *doc_seg, n_doc_seg;
    int *doc_host;
    double doc_pairs;
} ts_acts;

void ts_acts_init(ts_acts *a, const ts_model *m, int l0, int l1, int B, int T);
/* Bytes ts_acts_init allocates for layers [l0, l1), and the zero-bubble stash that
 * lives from a chunk's input-gradient pass to its weight-gradient pass. */
size_t ts_acts_bytes(const ts_model *m, int l0, int l1, int B, int T);
size_t ts_acts_stash_bytes(const ts_model *m, int l0, int l1, int B, int T);
void ts_acts_free(ts_acts *a);

/* Multi-token prediction (nothing without it, or when a's range lacks the head): depth
 * k's ids from the micro-batch's whole sequences, targets_host [B, seq_len] on the host
 * (t_{i+1} at position i): the input t_{i+k} (0 past the window's end) and the target
 * t_{i+k+1} (0 where it lies past the window: the loss skips those positions), shifted
 * on whole sequences before context parallelism picks this rank's positions. */
void ts_acts_set_mtp_ids(const ts_model *m, ts_acts *a, const int *targets_host, int seq_len);

/* Packed documents (m->doc_token >= 0; nothing otherwise): from the micro-batch's whole
 * input windows tokens_host [B, seq_len] on the host, a document starts at each
 * m->doc_token and at position 0; this rank's doc_start, doc_cos/doc_sin and segments
 * (ts_acts), uploaded once per micro-batch. Every rank of a pipeline, tensor- or
 * context-parallel group calls it with the same windows. */
void ts_acts_set_documents(const ts_model *m, ts_acts *a, const int *tokens_host, int seq_len);
/* The device bytes ts_acts_init allocates for packed documents (0 without). */
size_t ts_acts_documents_bytes(const ts_model *m, int l0, int l1, int B, int T);

/* Output [B*T, C] of layer l (valid after forward; not for the head); under sequence
 * parallelism this rank's rows [B*T / tp, C] (tensor/tp.h), as for a->input and dx. */
void *ts_acts_output(const ts_model *m, const ts_acts *a, int l);

/* Per-token losses [B*T] of the last forward (the range must end with the head). */
const float *ts_acts_losses(const ts_model *m, const ts_acts *a);
/* Multi-token prediction depth k's (1..mtp_layers) per-token losses [B*T] of the last
 * forward (0 where the target lies past the window); the range must end with the head. */
const float *ts_acts_mtp_losses(const ts_model *m, const ts_acts *a, int k);

/* Scratch for the backward of one layer at a time (shared by all micro-batches). */
typedef struct {
    void *mem;              /* device memory of k */
    size_t bytes;
    const ts_kernels *k;
} ts_scratch;
void ts_scratch_init(ts_scratch *s, const ts_model *m, int B, int T);
size_t ts_scratch_bytes(const ts_model *m, int B, int T);
/* Under selective recompute, the part of s that holds attention's state while a block
 * runs (a forward's, then the backward's rebuilt copy): what ts_acts.att_work points
 * at; NULL otherwise. */
void *ts_scratch_attention_work(const ts_scratch *s, const ts_model *m, int B, int T);
/* Under sequence parallelism, the part of s the forwards gather into (ts_acts.sp_work);
 * NULL otherwise. */
void *ts_scratch_sequence_work(const ts_scratch *s, const ts_model *m, int B, int T);
/* Under context parallelism, the part of s the K/V exchange and the position table use
 * (ts_acts.cp_work; tensor/cp.h); NULL otherwise. */
void *ts_scratch_context_work(const ts_scratch *s, const ts_model *m, int B, int T);
/* With multi-head latent attention, the part of s its forwards assemble q|k|v in
 * (ts_acts.mla_work; model/mla.c); NULL otherwise. */
void *ts_scratch_mla_work(const ts_scratch *s, const ts_model *m, int B, int T);
void ts_scratch_free(ts_scratch *s);

/* Forward through layers [a->l0, a->l1). When the range contains the head, the loss
 * is computed with weight `dloss` per target (1 / targets in the global batch), the
 * head's input gradient is prepared, and the sum of per-token losses is ADDED to
 * *loss_acc (a double in device memory, so a step's losses are read back once; NULL:
 * not wanted). With multi-token prediction the modules run after the head (their
 * losses into m->mtp_sums when loss_acc is given; a->mtp_ids set first). */
void ts_model_forward(const ts_model *m, ts_acts *a, float dloss, double *loss_acc);

/* Forward for generation, without a loss: every layer of the whole model on one rank
 * (tp = 1, a->l0 = 0, a->l1 = n_layers) over a->tokens, then the tied LM head on each
 * sequence's last position only: logits [B, vocab_size] (row b = position T-1 of
 * sequence b), device memory like every kernel output. a->targets is not read; the
 * head's losses are not computed. */
void ts_model_forward_logits(const ts_model *m, ts_acts *a, void *logits);

/* Backward through layers [a->l1 - 1 .. a->l0]. `dx` [B*T, C]: on entry the gradient of
 * the range's output (ignored when the range ends with the head), on exit the
 * gradient of its input (unused when the range starts with the embedding).
 * Parameter gradients accumulate into m->grad_mem. After each layer, layer_done(ctx,
 * layer) is called when given (the data-parallel sync starts buckets from it). */
/* Zero-bubble split of the backward (same contract for dx as ts_model_backward):
 * the input-gradient pass computes dx and the cheap parameter gradients (biases,
 * LayerNorm) and keeps the output gradients of the large matmuls in a stash owned by
 * `a`; the weight-gradient pass then adds the matmul weight gradients (and the
 * embedding's) and frees the stash. Together they equal ts_model_backward. */
void ts_model_backward_input(const ts_model *m, ts_acts *a, void *dx, ts_scratch *s);
void ts_model_backward_weight(const ts_model *m, ts_acts *a, ts_scratch *s);

/* After the step's last backward through layer l: under sequence parallelism its norm
 * weight gradients, and with qk_norm on tp > 1 its q_norm and k_norm gradients, summed
 * over the tp group (tensor/tp.h). Nothing otherwise. */
void ts_model_sum_sequence_grads(const ts_model *m, int l);

typedef void (*ts_layer_done_fn)(void *ctx, int layer);
void ts_model_backward(const ts_model *m, ts_acts *a, void *dx, ts_scratch *s,
                       ts_layer_done_fn layer_done, void *ctx);

#endif
