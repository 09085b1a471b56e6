/* The planner's cost model of one layer (embedding, block, head) for one micro-batch on
 * one tensor-parallel rank of a described cluster, and the memory one pipeline rank
 * holds. No process runs the model: everything follows from the config's shapes.
 *
 * Time. A GEMM of shape (m, n, k) takes 2mnk / (peak * efficiency(cbrt(mnk))), peak of
 * the cluster's GEMM dtype (cl->bf16); elementwise work (the norms, residual adds, the MLP's
 * activation, RoPE, softmax, embedding gather/scatter, cross-entropy) takes its bytes /
 * memory bandwidth, in the activation dtype (bf16 on a bf16 cluster, as the trainer
 * holds activations there; fp32 otherwise), or for a kernel the cluster's
 * device.elementwise_ns lists, the larger of that and its elements x the measured time
 * per element (compute-bound exp/tanh on CPUs; llama's RMSNorm and SwiGLU take
 * layernorm's and gelu's). A block's backward is its GEMMs twice (input gradient I: dX
 * of the linears and attention's backward; weight gradient W: dW of the linears) plus
 * twice the forward's elementwise bytes in I.
 *
 * The block's GEMMs by architecture: gpt2: c_attn [3C, C], attn.c_proj [C, C], c_fc
 * [4C, C], mlp.c_proj [C, 4C]; llama: q [NH*HS, C] with k and v [NKV*HS, C] (one GEMM
 * of the rank's heads), o_proj [C, NH*HS], gate and up [F, C] (one GEMM of 2F/tp
 * columns), down [C, F]; attention's two batched GEMMs per query head. The embedding
 * has no position table for llama; the head's GEMM is the same shape tied or not.
 * Multi-head latent attention (model.kv_lora_rank > 0; model/mla.c) in q, k, v's place:
 * the latent trunk [q_lora + kv_lora + rope, C] (one GEMM, replicated over tp; without a
 * q latent q_proj's local heads join it), q_b_proj [hl (nope + rope), q_lora] and
 * kv_b_proj [hl (nope + v), kv_lora] column-parallel, o_proj [C, hl v] row-parallel;
 * attention's q.k over nope + rope channels, its weighted sum over v; under context
 * parallelism the latent and rope key exchanged instead of K/V and kv_b_proj run over
 * the gathered sequence (model/mla_cp.h). Multi-token prediction (model.mtp_layers):
 * each module's lookup, norms, eh_proj [C, 2C], block and second head pass are the head
 * layer's (docs/ARCHITECTURE.md "The planner with MLA and MTP").
 *
 * Attention's products follow the kernel table, one rule for a rectangle of Tq queries
 * (the last Tq of Tk positions; without cp the T x T square, with it each prefix): the
 * CPU tables (src/kernels/cpu/attention*.c) run query rows in blocks of 32 key positions
 * (64 in bf16) and skip the key blocks above the diagonal, each block's two GEMMs priced
 * at their own shape (block x keys to its end x head_dim), about half the square; their
 * softmax makes 3 passes over the computed scores and writes the rest of each saved row
 * as zeros forward, 6 passes over the computed ones backward. The CUDA tables' batched
 * GEMMs compute every rectangle whole (attention.cu; the flash kernel, which skips
 * tiles, is priced as they are: model_cost.c's attention_block), their softmax 3 and 6
 * passes over all of it. MFU's FLOPs (ts_plan_model_flops) count the whole square.
 *
 * Packed documents (data.document_mask; `tessera plan --cluster --doc-len N`: documents
 * of N tokens fill each window from its start): the CPU tables' query blocks start their
 * keys at the key block holding their first query's document start (the earlier
 * documents' blocks skipped, as src/kernels/cpu/attention*.c skip them); the CUDA
 * tables' batched GEMMs still compute each rectangle whole (attention.cu masks in its
 * softmax), and the flash kernel, which skips the masked tiles, is priced as they are,
 * as without documents. MFU's FLOPs count the pairs the documents attend
 * (ts_plan_model_flops_docs: sum over documents of L(L+1)/2, not the square).
 *
 * Tensor parallelism (Megatron): each rank does 1/tp of the GEMMs (llama's key/value
 * heads split over tp when n_kv_head % tp == 0, else each rank computes its one
 * replicated head); a block does 2 all-reduces of micro_batch*seq_len*n_embd
 * activation-dtype values forward and 2 backward, the embedding 1 forward, the head 3
 * small ones (N fp32 row statistics: vocab-parallel max, sum, target logit) forward and
 * 1 backward; a ring all-reduce of S bytes over t ranks costs 2(t-1)/t * S / bandwidth +
 * 2(t-1) * latency on the link the tp group uses, and it is not overlapped with
 * compute. A pipeline message is one micro-batch's [B*T, C] activations in their dtype.
 *
 * Sequence parallelism (tensor/tp.h; Korthikanti et al. 2022): the norms and residual
 * adds run on B*T/tp rows (their elementwise bytes / tp) and a pipeline message is
 * [B*T/tp, C]. A ring reduce-scatter or all-gather costs half the all-reduce above, so
 * a block's forward (reduce-scatter after each row-parallel linear, all-gather before
 * each column-parallel one) moves what its 2 all-reduces did; its backward gathers the
 * 2 row-parallel output gradients, reduce-scatters the 2 column-parallel input
 * gradients and gathers ln1 and ln2 again for their weight gradients: 3 all-reduces'
 * worth, and a split (zero-bubble) weight-gradient pass gathers ln1 and ln2 once more
 * (w_split_tp). The head gathers lnf forward, and in its backward reduce-scatters the
 * input gradient and gathers lnf again (once more in a split W); the embedding's sum
 * becomes a reduce-scatter and its backward gathers its output gradient (in I). The
 * norms' weight-gradient sums (a few floats per layer) are not priced.
 *
 * Context parallelism (tensor/cp.h; Llama 3's all-gather, Megatron's chunk placement):
 * each sequence of T positions is cut into 2cp chunks of c = T/(2cp), cp rank i holding
 * chunks i and 2cp-1-i, so every layer runs on N = B*T/cp rows (GEMMs, elementwise
 * passes, tp collectives, the head's logits; a pipeline message is [B*T/cp, C], / tp
 * again under sequence parallelism). Attention: local chunk j's c queries against its
 * causal prefix of (j+1)c keys, by the rule below; the rank's time is the slowest cp
 * rank's (the work is balanced, the shapes not). Before its attention each block all-gathers this tp rank's keys and
 * values over the cp group, [B, T, 2 kvl HS] activation-dtype values (kvl the rank's
 * key/value heads), and its backward reduce-scatters their gradients, the same bytes:
 * ring all-gathers (ts_plan_allgather_time) on the link the cp group uses, blocking
 * (not overlapped with compute: f_cp, i_cp are in f and i), a full recompute's
 * forward gathering again (selective recompute rebuilds from the kept gathered K/V).
 * Memory: the model's own layout under context parallelism (ts_model_spec.cp) at T/cp
 * rows (the gathered K/V kept per block, the two chunks' prefix state). cp = 1 is the model
 * above, to the bit.
 *
 * Memory, per pipeline rank: the trainer's own rule (ts_memory_rank, pipeline/memory.h)
 * on sizes from the layer tables here, which the tests hold to the trainer's layout:
 * parameters and gradients as the model lays them out (tp rank 0, which holds the most
 * vocabulary rows; the head's rank keeps a copy of a tied embedding when the embedding
 * is elsewhere; an untied head holds its own lm_head), fp32; with bf16 GEMMs (cl->bf16) the
 * parameters add the table's bf16 copy (2 bytes each: fp32 master weights, fp32 gradients
 * and fp32 AdamW moments stay); the two AdamW moments, fp32, 1/dp of them with ZeRO-1
 * (under Muon AdamW's on the other floats and one momentum on the owned matrices:
 * memory.h);
 * activations = for every chunk, the schedule's peak live micro-batch sets
 * (recompute-aware, as the engine holds them) times the chunk's saved tensors in the
 * table's layout (attention's saved state: the probabilities [B, NH, T, T], or with
 * train.attention = "flash" on "cuda" one fp32 log-sum-exp per row) (+ token ids), plus
 * zero-bubble
 * stashes; buffers = per micro-batch pipeline slots, the backward scratch,
 * checkpoint.async copies; blas = the BLAS threads' buffers (the workspace). */
#ifndef TS_PLAN_MODEL_COST_H
#define TS_PLAN_MODEL_COST_H

#include <stdbool.h>

#include "config/config.h"
#include "kernels/kernels.h"
#include "pipeline/memory.h"
#include "pipeline/schedule.h"
#include "plan/cluster.h"
#include "plan/moe_cost.h"
#include "plan/muon_cost.h"

/* Per-layer costs and sizes for one (tp, micro_batch). Times in seconds. */
typedef struct {
    int n_layers;             /* n_layer + 2 */
    int tp, B, T, C;          /* T: the whole sequence (a cp rank holds T / cp of it) */
    int cp;                   /* context parallelism (tensor/cp.h); 1: none */
    bool sp;                  /* sequence parallelism (tensor/tp.h) */
    double *f, *i, *w;        /* [n_layers] forward, input-gradient, weight-gradient time,
                                 tp collectives included */
    double *f_tp, *i_tp;      /* [n_layers] the tp collective part of f and i */
    double *f_cp, *i_cp;      /* [n_layers] context parallelism's K/V all-gather (forward)
                                 and dK/dV reduce-scatter (input gradient), part of f and
                                 i; 0 with cp = 1 and outside the blocks */
    double *w_split_tp;       /* [n_layers] sequence parallelism: the gathers a split
                                 backward's W pass repeats (not in w: a full B does not
                                 repeat them); 0 without it */
    double *f_gemm, *b_gemm;  /* [n_layers] GEMM part of forward, backward (I + W) */
    double *param_floats;     /* [n_layers] floats of the layer's parameters (as laid out) */
    double *act_bytes;        /* [n_layers] saved activation bytes of one micro-batch */
    double *att_bytes;        /* [n_layers] the part of act_bytes that is attention's
                                 saved state (selective recompute keeps none of it) */
    double *f_att;            /* [n_layers] the attention core's forward (scores, softmax,
                                 weighted sum): what selective recompute reruns per backward
                                 (MLA: with kv_b_proj from the kept latent, RoPE and the
                                 q|k|v assembly) */
    double *stash_bytes;      /* [n_layers] zero-bubble stash bytes (I to W) */
    double wte_floats;        /* the copy of the embedding the head keeps without it: a
                                 tied head's, or the MTP modules' (model.h mtp_wte_param) */
    double scratch_bytes;     /* the backward scratch a rank allocates once */
    double rebuild_bytes;     /* what selective recompute adds to it (the rebuilt state) */
    double msg_bytes;         /* one micro-batch's activations between pipeline stages
                                 (its rows / cp, and / tp under sequence parallelism) */
    /* Mixture of Experts (moe_cost.h; all zero for a dense block, the embedding, the
     * head and a dense model): */
    int ep, etp;              /* the expert grid the layout and the costs are for */
    ts_plan_moe_block *moe;   /* [n_layers] an MoE block's expert phase (part of f, i) */
    double *f_a2a, *i_a2a;    /* [n_layers] its exchanges' exposed part of f and i (after
                                 the shared experts hid theirs): what an overlapped pair's
                                 partner may hide too (sim.h f_comm, i_comm) */
    double *expert_floats;    /* [n_layers] floats of the routed experts' tensors (part of
                                 param_floats), which reduce and shard over edp */
    /* train.optimizer = "muon" (muon_cost.h; NULL under AdamW): [n_layers] each layer's
     * Muon matrices, set by the planner after the build (ts_plan_muon_layers) and freed
     * with the rest */
    ts_plan_muon *muon;
} ts_plan_layers;

/* Ring all-reduce of `bytes` over `ranks` ranks on `link` (0 for one rank). */
double ts_plan_allreduce_time(double bytes, int ranks, ts_link link);
/* Ring all-gather, or reduce-scatter, of a `bytes` buffer (every rank's part together)
 * over `ranks` ranks: half the all-reduce, (t-1)/t * bytes / bandwidth + (t-1) latencies. */
double ts_plan_allgather_time(double bytes, int ranks, ts_link link);

/* The kernel table whose sizes the planner lays a run out with (kernels.h
 * ts_kernels_layout_for): the config's train.device and train.attention, in the
 * cluster's GEMM dtype (cl->bf16: its compute_dtype, or bf16 for train.precision =
 * "bf16", cluster.h ts_cluster_use_precision) as the precision, because its peak is that
 * dtype's and the time model moves activations in it: memory in another dtype would
 * describe a different run from the one timed. A CUDA config gets the CUDA table's sizes in every build (the
 * layout-only tables of a CPU-only build); the default device "cpu" the CPU's, whose
 * attention keeps the [B, NH, T, T] probabilities. */
const ts_kernels *ts_plan_kernels(const ts_config *cfg, const ts_cluster *cl);

/* Fill L for model `mc` laid out by kernel table k (ts_plan_kernels), tensor-parallel
 * size tp (its group on link tp_link), sequence parallelism sp (needs tp > 1 and
 * seq_len % tp == 0: the layout is the trainer's under parallel.sequence_parallel),
 * tp_overlap's `sub` sub-batches (1: none; dividing micro_batch) and micro_batch
 * sequences.
 *
 * tp_overlap: a block's GEMMs run on micro_batch/sub sequences at a time (priced at that
 * size), and of its tp collectives c against its compute g (forward; the backward's
 * likewise) the part exposed is c/sub (each phase's last sub-batch has no next one to
 * hide behind) plus what does not fit behind the others, max(0, c - g)(sub - 1)/sub; on
 * a cluster whose communication runs on the compute cores (overlap_comm = false) all
 * of c. The embedding and head run whole.
 *
 * Under context parallelism of cp ranks (cp >= 1, seq_len % 2cp == 0 when cp > 1; with
 * sp also (seq_len / cp) % tp == 0) its group is on link cp_link; cp = 1 is a grid
 * without it (cp_link unused). */
void ts_plan_layers_build(ts_plan_layers *L, const ts_model_config *mc, const ts_cluster *cl,
                          const ts_kernels *k, int tp, bool sp, int sub, int micro_batch,
                          ts_link tp_link, int cp, ts_link cp_link);
/* The same with an expert grid (moe NULL: ep = etp = 1, balanced, the shared experts
 * hiding the exchanges): the rank's E/ep experts, each an F/etp slice, laid out as the
 * trainer lays them (ts_model_spec.ep_size, etp_size), and each MoE block priced by
 * ts_plan_moe_block_cost in the dense MLP's place: the attention's GEMMs, elementwise
 * passes and tp collectives (one all-reduce forward and one backward; under sequence
 * parallelism a gather and a reduce-scatter forward, three backward, one more in a
 * split W: the MoE itself is not tensor parallel), then the expert phase's GEMMs,
 * passes and exposed exchanges in f and i (all of its backward in i), the etp
 * collectives in f and i, the tp share gathers in f_tp and i_tp. A dense block is
 * priced as above, to the bit. */
void ts_plan_layers_build_moe(ts_plan_layers *L, const ts_model_config *mc, const ts_cluster *cl,
                              const ts_kernels *k, int tp, bool sp, int sub, int micro_batch,
                              ts_link tp_link, int cp, ts_link cp_link, const ts_plan_moe *moe);
/* The parameter floats of each layer [n_layer + 2] of the layout on tp rank 0 under
 * expert grid (ep, etp) (the whole model's, owned: every tensor rounded up to 16 floats
 * as the flat buffers lay them out), and of them the routed experts'. They depend on
 * tp, ep and etp alone, and the layout names every expert's tensors (tens of thousands
 * for DeepSeek-V3): the search builds them once per triple (predict.c) and passes them
 * to ts_plan_layers_build_sized. */
typedef struct {
    int n_layers;
    double *param_floats, *expert_floats;
} ts_plan_param_floats;
void ts_plan_param_floats_build(ts_plan_param_floats *pf, const ts_model_config *mc,
                                const ts_kernels *k, int tp, int ep, int etp);
void ts_plan_param_floats_free(ts_plan_param_floats *pf);
/* ts_plan_layers_build_moe with the parameter floats of (tp, moe's ep and etp) built
 * already (NULL: built here). */
void ts_plan_layers_build_sized(ts_plan_layers *L, const ts_model_config *mc,
                                const ts_cluster *cl, const ts_kernels *k, int tp, bool sp,
                                int sub, int micro_batch, ts_link tp_link, int cp,
                                ts_link cp_link, const ts_plan_moe *moe,
                                const ts_plan_param_floats *sizes, int doc_len);
/* Its times alone (f, i, w and their parts; the sizes zero, no layout built): what a
 * floor of the work (predict.h ts_plan_work_floor) reads, the same to the bit. doc_len
 * (both): packed documents of doc_len tokens filling each window (attention's time as
 * the table's kernels skip the masked blocks, above); 0: none (ts_plan_layers_build and
 * _moe pass 0). */
void ts_plan_layers_build_times(ts_plan_layers *L, const ts_model_config *mc,
                                const ts_cluster *cl, const ts_kernels *k, int tp, bool sp,
                                int sub, int micro_batch, ts_link tp_link, int cp,
                                ts_link cp_link, const ts_plan_moe *moe, int doc_len);
/* Context parallelism's collective per block and micro-batch (seconds, one direction):
 * a ring all-gather (forward) or reduce-scatter (backward) of the gathered keys and
 * values, micro_batch * seq_len * 2 * kv_local * head_dim values of act_bytes each,
 * over cp ranks on link l; 0 for cp = 1. */
double ts_plan_cp_exchange_time(const ts_model_config *mc, int tp, int cp, int micro_batch,
                                double act_bytes, ts_link l);
void ts_plan_layers_free(ts_plan_layers *L);

/* Memory of pipeline rank q (res: its ZeRO-2/3 residency, NULL for zero 0/1 or dp 1),
 * chunks cut as first_layer/n_chunk_layers[sh->n_chunks], the
 * peaks and recomputed micro-batches from ts_memory_peak_sets, selective[c] (NULL: none)
 * the chunks recompute = "auto" made selective (ts_plan_rank_auto): the layers' sizes
 * summed per chunk and rank into ts_memory_rank (pipeline/memory.h), the rule the
 * trainer's own estimate calls. */
void ts_plan_rank_memory(const ts_plan_layers *L, const ts_memory_shape *sh,
                         const int *first_layer, const int *n_chunk_layers, const int *peak_acts,
                         const int *peak_stash, const int *n_recomputed, const bool *selective,
                         const ts_residency *res, int q, ts_rank_memory *out);

/* recompute = "auto" on pipeline rank q of schedule s: ts_memory_auto_keep_selective on
 * the same sizes (each chunk's also laid out selective: its layers' bytes less their
 * attention state, att_bytes; the scratch plus rebuild_bytes while a chunk is), into
 * keep, selective, peak_acts, peak_stash, n_recomputed ([n_chunks], q's chunks) and
 * *out; false when even full recompute exceeds room (bytes less the workspace). memo:
 * s's memo of the peaks (memory.h), or NULL. */
bool ts_plan_rank_auto(const ts_plan_layers *L, const ts_memory_shape *sh,
                       const int *first_layer, const int *n_chunk_layers, const ts_schedule *s,
                       const ts_residency *res, int q, double room, int *keep, bool *selective,
                       int *peak_acts, int *peak_stash, int *n_recomputed, ts_peak_memo *memo,
                       ts_rank_memory *out);

/* Floats of each chunk of pipeline rank q ([n_chunks], q's chunks written) as the rank
 * lays them out: its layers' parameters, the head's chunk with the tied copy when q
 * lacks the embedding (memory.h's F_c). */
void ts_plan_chunk_floats(const ts_plan_layers *L, const int *chunk_rank, int n_chunks,
                          const int *first_layer, const int *n_chunk_layers, int q,
                          double *floats_c);

/* Parameter floats of a chunk [l0, l1) (with the tied copy when it holds the head but
 * not the embedding): its gradient floats, what its dp reduction moves. */
double ts_plan_chunk_param_floats(const ts_plan_layers *L, int l0, int l1);

/* The parameters MFU's 6 * parameters counts (Megatron's formula): those a token uses,
 * ts_model_active_params (an MoE block's router, top_k routed and the shared experts),
 * less the embeddings that are only looked up: an untied input embedding (llama's
 * embed_tokens; its lm_head, the logits' GEMM, counts) and gpt2's position table. A
 * tied embedding counts once, as the logits' matrix. */
double ts_plan_flops_params(const ts_model_config *mc);

/* Multi-token prediction's parameters MFU counts (model.mtp_layers = D; 0 without):
 * the D modules' blocks as the model counts blocks n_layer .. n_layer + D - 1 (an MoE
 * block's active ones), and per depth eh_proj [C, 2C], its three norms and the shared
 * LM head, which multiplies again (Megatron's count; DeepSeek-V3: 0.688B + 0.927B). */
double ts_plan_mtp_flops_params(const ts_model_config *mc);

/* Attention's FLOPs per token, forward and backward, over the full T x T square (a
 * causal kernel does about half): 12 * seq_len * n_head * head_dim per block, MLA's
 * 6 * seq_len * n_head * (qk_nope + qk_rope + v_head_dim), the MTP modules' blocks
 * included. */
double ts_plan_attention_flops_per_token(const ts_model_config *mc);

/* Model FLOPs of one step (no recompute): 6 * (ts_plan_flops_params +
 * ts_plan_mtp_flops_params) * tokens + ts_plan_attention_flops_per_token * tokens
 * (without MLA or MTP: 12 * n_layer * seq_len * n_head * head_dim * tokens, per query
 * head the full T x T square; n_head * head_dim = n_embd), tokens = global_batch *
 * seq_len. */
double ts_plan_model_flops(const ts_model_config *mc, int global_batch);
/* Attention's FLOPs per (query, key) pair, forward and backward, over every block (the
 * MTP modules' included): 12 * n_head * head_dim per block, MLA's 6 * n_head *
 * (qk_nope + qk_rope + v_head_dim); ts_plan_attention_flops_per_token is it x seq_len. */
double ts_plan_attention_flops_per_pair(const ts_model_config *mc);
/* Model FLOPs of `tokens` tokens whose attention computes `pairs` (query, key) pairs:
 * 6 * (ts_plan_flops_params + ts_plan_mtp_flops_params) * tokens +
 * ts_plan_attention_flops_per_pair * pairs. ts_plan_model_flops is it with the square
 * (global_batch * seq_len^2 pairs); with packed documents the trainer's MFU passes the
 * pairs its windows' documents attend (docs/CONTRACT.md "MFU"). */
double ts_plan_model_flops_pairs(const ts_model_config *mc, double tokens, double pairs);
/* The (query, key) pairs of one window of T positions cut into documents of doc_len
 * tokens from its start, the last one cut short by the window's end: sum over the
 * documents of L(L+1)/2 (each document's causal triangle); doc_len <= 0 or >= T: one
 * document, T(T+1)/2. */
double ts_plan_doc_pairs(int T, int doc_len);
/* MFU's FLOPs of one step with packed documents of doc_len tokens filling every window
 * (`tessera plan --doc-len`): ts_plan_model_flops_pairs with global_batch *
 * ts_plan_doc_pairs(seq_len, doc_len) pairs, the attention FLOPs the documents do;
 * doc_len 0: ts_plan_model_flops (no documents: the square). */
double ts_plan_model_flops_docs(const ts_model_config *mc, int global_batch, int doc_len);
/* The same per token (ts_plan_model_flops of one sequence / seq_len). */
double ts_plan_flops_per_token(const ts_model_config *mc);

#endif
