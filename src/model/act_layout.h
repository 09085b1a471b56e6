/* The activation layout of one micro-batch, private to src/model: every buffer a layer
 * saves for its backward, its size and element type (the X-lists below, written once),
 * the backward's scratch regions and the zero-bubble stash. The public side is model.h's
 * ts_acts_*, ts_scratch_* and ts_layer_act_bytes, which the memory estimate
 * (pipeline/memory.c) and the planner (plan/) size from this same layout; the compute
 * (layers.c, block.c) reads and writes through the views declared here. */
#ifndef TS_MODEL_ACT_LAYOUT_H
#define TS_MODEL_ACT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "model/model.h"

/* Sizes of one micro-batch on one tensor-parallel rank: N = B*T rows, C channels, this
 * rank's H query heads and KV key/value heads of HS channels, Cl = H*HS attention
 * channels, QKV = (H + 2 KV) HS columns of the q|k|v projection, F MLP columns of the
 * activation (GELU's, SwiGLU's output) and FI of the projection before it (F for
 * gpt2's c_fc, 2F for llama's gate|up), Vl vocabulary rows; NM: rows of a norm's
 * mean (N for LayerNorm, 0 for RMSNorm, which keeps only rstd); att and att_scratch:
 * the bytes the backend's attention keeps for its backward and the workspace that
 * needs (kernels.h); ab: the bytes of one activation element (the table's act_dtype). */
typedef struct {
    size_t B, T, N, C, Cl, H, KV, HS, QKV, F, FI, NM, Vl, att, att_scratch, ab;
    size_t att_kept; /* att, or 0 when the layer recomputes selectively (the scratch
                        holds it then) */
    size_t NL;       /* rows of the norms and residuals: N, or N / tp under sequence
                        parallelism (tensor/tp.h) */
    size_t S;        /* tp_overlap's sub-batches (1: none) */
    size_t KVG;      /* context parallelism: the gathered K/V [B, cp.T, 2 KV HS] a block
                        keeps (0 without; tensor/cp.h) */
    size_t cpw;      /* context parallelism: the exchange's work bytes (the scratch's) */
    size_t QKN, QKR; /* model.qk_norm: the q|k columns (H + KV) HS a row normalises per
                        head, and its heads H + KV (each one rstd); 0 without */
    /* Multi-head latent attention (mla.c; all 0 without): HS is then nope + rope, KV = H,
     * HSV the value channels (Cl = H HSV, QKV = H (2 HS + HSV): the assembled q|k|v the
     * kernels read); RQ the q latent's rank (0: q_proj), RKV the k/v latent's, RR the
     * rope channels (the shared rope key's), QA the q columns of the input's
     * down-projection (RQ, or H HS for q_proj), LA = QA + RKV + RR its columns, KVB =
     * H (nope + HSV) kv_b_proj's, QK = H HS the q heads'. QKVK: the q|k|v columns a
     * block keeps (QKV; 0 for a selective MLA block, which keeps its q [N,QKQ] and
     * rebuilds k and v from the latent); QKQ: QK for a selective MLA block, else 0. */
    size_t HSV, RQ, RKV, RR, QA, LA, KVB, QK, QKVK, QKQ;
    bool mla;
    /* Mixture of Experts (moe.c): the experts E, top K, expert width MF and shared width
     * MS of an MoE block (0 for a dense block; for l < 0, the model's, which size the
     * scratch), and DN: 1 when the block has the dense MLP (its fch, fch_gelu), 0 for an
     * MoE block. MR: the rows this rank's experts process, at most: NL * MK on one ep
     * rank (the MoE routes NL rows: moe.c); under expert parallelism the worst case
     * ep * NL * min(K, E/ep) (every other ep rank sends all its tokens' assignments
     * here), so the buffers sized by it do not depend on the routing: simple, but ep
     * times the balanced size (a grow-only arena sized by the balanced count plus
     * measured headroom is the planned next step). Under expert tensor parallelism MF is this rank's F / etp and MR is etp
     * times the above (the etp group's rows, gathered: the h and a buffers stay the
     * size of the whole width's). With a capacity (model.moe_capacity > 0) MR is also at
     * most the capacity's rows: each sequence a rank's rows touch sends each expert at most
     * ts_moe_capacity_rows of them (the paper runs' factor 1: about K / min(K, E/ep) times
     * fewer rows than dropless's worst case under ep). MX: MR under expert (tensor)
     * parallelism, else 0 (the exchanges' buffers). */
    size_t ME, MK, MF, MS, DN, MR, MX;
    bool llama, sp, cp;
    bool selective;  /* this layer keeps no attention state (ts_layer.selective) */
    bool rebuild;    /* the scratch holds the rebuilt state: some layer of the model is
                        selective (ts_model.selective_recompute) */
} act_dims;

/* Layer l's dims for a micro-batch of B sequences of T positions (l < 0: no layer's,
 * one that keeps its attention state: the scratch's and the stash's, whose sizes depend
 * only on whether some layer is selective). */
act_dims ts_act_dims(const ts_model *m, int l, int B, int T);

/* The saved activations of each layer kind, in memory order: X(name, count, type) with
 * the count in terms of `d` (an act_dims) and the type A (activation elements, the
 * table's act_dtype), F (fp32: statistics and losses, whatever the precision) or BYTES
 * (a size the backend gives in bytes). One list serves both architectures (a count of
 * 0 is an empty buffer: RMSNorm has no mean). These lists are the only place the
 * layout is written: the views below, ts_acts_bytes, the memory estimate and the
 * partition's modelled activation bytes all expand them (llm.c's
 * fill_in_activation_sizes). */
#define EMBED_ACTS(X) X(out, d.NL * d.C, A) /* [NL,C] token (+ position) embedding */

/* [NL,C]: the norms' and residuals' rows (all N, or this rank's under sequence
 * parallelism); [N,...]: the tensor-parallel regions' (every row, this rank's columns).
 * qkv..att are the attention phase's, fch and fch_gelu the MLP phase's (block.h). */
#define BLOCK_ACTS(X)                                                                      \
    X(ln1, d.NL * d.C, A) X(ln1_mean, d.NM, F) X(ln1_rstd, d.NL, F) /* first norm, stats */\
    MLA_ACTS(X)                                                                             \
    X(qkv, d.N * d.QKVK, A)            /* [N,QKV] this rank's q, k, v heads (llama: after   \
                                          RoPE; MLA: assembled, none when selective) */     \
    X(qk_pre, d.N * d.QKN, A)          /* qk_norm: [N,(H+KV)HS] q|k before their norms */   \
    X(qk_rstd, d.N * d.QKR, F)         /* qk_norm: [N,H+KV] each head's rstd */             \
    X(kvg, d.KVG, A)                   /* context parallelism: [B,T,2KV HS] every position's \
                                          k, v, gathered (tensor/cp.h) */                   \
    X(atty, d.N * d.Cl, A)             /* [N,Cl] attention output before its projection */  \
    X(att, d.att_kept, BYTES)          /* attention's saved state (CPU: [B,H,T,T] softmax; \
                                          none under selective recompute) */                \
    X(res2, d.NL * d.C, A)             /* [NL,C] x + attn(...) */                           \
    X(ln2, d.NL * d.C, A) X(ln2_mean, d.NM, F) X(ln2_rstd, d.NL, F)                         \
    X(fch, d.DN * d.N * d.FI, A)       /* [N,FI] c_fc's / gate|up's output */               \
    X(fch_gelu, d.DN * d.N * d.F, A)   /* [N,F] after GELU / SwiGLU */                      \
    MOE_ACTS(X)                                                                             \
    X(out, d.NL * d.C, A)              /* [NL,C] block output x + attn + mlp */

/* An MLA block's attention phase (mla.c; empty otherwise), on every row N: the q
 * latent before and after its RMSNorm [N,RQ] and the norm's rstd, the same for the k/v
 * latent [N,RKV], the shared rope key before RoPE [N,RR] (the input's down-projections,
 * replicated over tp), and under selective recompute the q heads before RoPE [N,QK]
 * (q_b_proj's output; k and v are rebuilt from the latent). */
#define MLA_ACTS(X)                                                                        \
    X(mla_cq_pre, d.N * d.RQ, A) X(mla_cq, d.N * d.RQ, A)                                  \
    X(mla_cq_rstd, d.RQ ? d.N : 0, F)                                                      \
    X(mla_ckv_pre, d.N * d.RKV, A) X(mla_ckv, d.N * d.RKV, A)                              \
    X(mla_ckv_rstd, d.RKV ? d.N : 0, F)                                                    \
    X(mla_kpe, d.N * d.RR, A) X(mla_q, d.N * d.QKQ, A)

/* An MoE block's MLP phase (moe.c; empty in a dense block) on the NL rows it routes (N
 * below: the micro-batch's, or under sequence parallelism this tp rank's N/tp), NK = N*K
 * assignments in the experts' order: the router's logits and scores [N,E] and the routing [N,K] (fp32), the
 * routing's int buffers (as bytes), the permuted input [NK,C], each expert's gate|up
 * output [MR,2F] and SwiGLU output [MR,F], the experts' outputs [NK,C], the shared
 * experts' gate|up [N,2MS], SwiGLU [N,MS] and output [N,C], and in a bf16 run the
 * router's input widened to fp32 [N,C] (its GEMM's operand, kept for its backward, as
 * PyTorch keeps x.float() under Megatron's fp32 router). Under expert parallelism
 * (MX = MR) the rows the local experts process, received in expert order [MR,C], their
 * outputs before the combine's exchange [MR,C] and the exchange's work [MR,C]; the last
 * two are live only inside the forward, kept here for now (a shared arena is the next
 * step: see MR). */
#define MOE_ACTS(X)                                                                        \
    X(moe_logits, d.NL * d.ME, F) X(moe_scores, d.NL * d.ME, F)                            \
    X(moe_idx, d.NL * d.MK * sizeof(int), BYTES) X(moe_w, d.NL * d.MK, F)                  \
    X(moe_row, d.NL * d.MK * sizeof(int), BYTES) /* row_of: assignment n*K+k's row */      \
    X(moe_counts, d.ME * sizeof(int), BYTES)   /* this micro-batch's tokens per expert */  \
    X(moe_offsets, d.ME * sizeof(int), BYTES)  /* their exclusive prefix sum */            \
    X(moe_xp, d.NL * d.MK * d.C, A) X(moe_h, d.MR * 2 * d.MF, A)                           \
    X(moe_a, d.MR * d.MF, A) X(moe_yp, d.NL * d.MK * d.C, A)                               \
    X(moe_xr, d.MX * d.C, A) X(moe_yr, d.MX * d.C, A) X(moe_er, d.MX * d.C, A)             \
    X(moe_sh_h, d.NL * 2 * d.MS, A) X(moe_sh_a, d.NL * d.MS, A)                            \
    X(moe_sh_out, (d.MS ? d.NL * d.C : 0), A)                                              \
    X(moe_xf, (d.ME && d.ab != sizeof(float) ? d.NL * d.C : 0), F)

#define HEAD_ACTS(X)                                                                       \
    X(lnf, d.NL * d.C, A) X(lnf_mean, d.NM, F) X(lnf_rstd, d.NL, F)                         \
    X(losses, d.N, F)                  /* [N] per-token cross-entropy */                    \
    X(xent_stats, 3 * d.N, F)          /* vocab-parallel row statistics (tp.h) */           \
    X(logits, d.N * d.Vl, A)           /* [N,Vl]: logits, then dlogits in place */

/* A multi-token prediction module's buffers (model/mtp.c), after its block's
 * BLOCK_ACTS: the embedding of the shifted tokens (enorm's input) and the two norms'
 * rstd, [enorm(emb) | hnorm(h)] (eh_proj's input), eh_proj's output (the block's input),
 * the gradient of the module's output h^k (the next module's hnorm adds into it),
 * shared_head.norm's output and rstd, and the depth's loss as the head's. */
#define MTP_ACTS(X)                                                                        \
    X(mtp_emb, d.NL * d.C, A) X(mtp_e_rstd, d.NL, F) X(mtp_h_rstd, d.NL, F)                \
    X(mtp_cat, d.NL * 2 * d.C, A)      /* [NL,2C] */                                       \
    X(mtp_in, d.NL * d.C, A)           /* [NL,C] h' */                                     \
    X(mtp_dh, d.NL * d.C, A)           /* [NL,C] dL/dh^k from the module after */         \
    X(mtp_fn, d.NL * d.C, A) X(mtp_fn_rstd, d.NL, F)                                        \
    X(mtp_losses, d.N, F) X(mtp_xent_stats, 3 * d.N, F) X(mtp_logits, d.N * d.Vl, A)

#define ACT_CTYPE_A void
#define ACT_CTYPE_F float
#define ACT_CTYPE_BYTES void
#define ACT_FIELD(name, count, type) ACT_CTYPE_##type *name;

typedef struct { EMBED_ACTS(ACT_FIELD) } embed_acts;
typedef struct { BLOCK_ACTS(ACT_FIELD) } block_acts;
typedef struct { HEAD_ACTS(ACT_FIELD) } head_acts;
typedef struct { MTP_ACTS(ACT_FIELD) } mtp_acts;

/* Layer l's buffers in a's memory. */
embed_acts ts_embed_views(const ts_model *m, const ts_acts *a, int l);
block_acts ts_block_views(const ts_model *m, const ts_acts *a, int l);
head_acts ts_head_views(const ts_model *m, const ts_acts *a, int l);
/* MTP module l's (l >= m->n_layers; its block's views are ts_block_views'). */
mtp_acts ts_mtp_views(const ts_model *m, const ts_acts *a, int l);

/* Sub-batch i of d->S (tp_overlap, tensor/tp.h): rows [i N/S, (i+1) N/S) of a block's
 * [N,...] buffers, rows [i NL/S, ...) of its [NL,...] ones, attention's state at its
 * sequences' offset (every backend's is sequence-major). With S = 1, the block's views. */
block_acts ts_block_sub_views(const act_dims *d, const block_acts *s, int i);

/* Layer l's input: the range's input for its first layer, else the previous output. */
const void *ts_acts_layer_input(const ts_model *m, const ts_acts *a, int l);

/* `p` advanced by n activation elements. */
static inline void *act_at(const act_dims *d, const void *p, size_t n)
{
    return (unsigned char *)p + n * d->ab;
}

/* ---- the backward's scratch (ts_scratch), one layer at a time ----
 * In activation elements: a block's [N,max(FI,QKV)] (`wide`: the MLP projection's
 * output gradient, later the qkv gradient), then [N,max(C,Fa)] (`narrow`: the input
 * gradient of a matmul; with SwiGLU first its output gradient [N,F], as GELU's runs in
 * place), then the attention backward's workspace (bytes, 64-aligned), and when some
 * layer is selective the attention state and output its forward rebuilds (bytes, then
 * [N,Cl], 64-aligned); the head's [N,C] input gradient. Under sequence parallelism two
 * more come before attention's: the gathered rows [N,C] (a norm's output for a
 * column-parallel linear, a gradient for a row-parallel backward; the forwards use it
 * too, and for their row-parallel sums' partial products) and this rank's rows [NL,C] of
 * a column-parallel backward's input gradient. Context parallelism's exchange work comes
 * last. Each region's rows are per row, so a sub-batch's are its rows of each. */
size_t ts_scratch_wide_cols(act_dims d);   /* columns of `wide`: max(FI, QKV) */
/* One expert's capacity in a sequence of T positions (model.moe_capacity = factor > 0):
 * ceil(T * K / E * factor), Megatron's get_capacity over the sequence's tokens, computed in
 * double; at most T (a token holds an expert once). */
int ts_moe_capacity_rows(int T, int K, int E, double factor);
size_t ts_scratch_narrow_cols(act_dims d); /* columns of `narrow`: max(C, F (llama), Cl) */
void *ts_scratch_wide(const act_dims *d, const ts_scratch *sc);
void *ts_scratch_narrow(const act_dims *d, const ts_scratch *sc);
/* Sequence parallelism's gathered rows [N,C] and this rank's rows [NL,C] of an input
 * gradient (NULL without sequence parallelism). */
void *ts_scratch_gather(const act_dims *d, const ts_scratch *sc);
void *ts_scratch_local(const act_dims *d, const ts_scratch *sc);
/* MLA's work region (after context parallelism's; NULL without MLA), per row, in
 * activation elements, each part 64-aligned: the assembled q|k|v [N,QKV] when some
 * layer is selective (a selective block's forward assembles it here, its backward
 * rebuilds it here), the q heads [N,QK] (the forward's q_b_proj output; the backward's
 * q gradient), kv_b_proj's output [N,KVB] (then its gradient), the down-projection's
 * output [N,LA] (then its gradient), the k heads' rope parts [N,H RR], and the
 * backward's [N,RKV] twice, [N,RQ] twice and [N,RR]. The forwards use it through
 * ts_acts.mla_work (ts_scratch_mla_work). */
typedef struct {
    void *qkv, *q, *kvb, *lat, *pe, *dckv_n, *dckv, *dcq_n, *dcq, *dkpe;
} mla_work;
mla_work ts_mla_work_of(const act_dims *d, void *base);
void *ts_scratch_mla(const act_dims *d, const ts_scratch *sc);
/* The attention backward's workspace; selective recompute's rebuilt state and output. */
void *ts_scratch_attention(const act_dims *d, const ts_scratch *sc);
void *ts_scratch_rebuilt(const act_dims *d, const ts_scratch *sc);
void *ts_scratch_rebuilt_out(const act_dims *d, const ts_scratch *sc);
/* The MoE backward's region (last; sized by the model's MoE dims): the experts' output
 * gradient dyp [NK,C] (then, in place, their input's dxp), dact [NK,F], dh [NK,2F], the
 * routing weights' gradient [N,K] and the logits' [N,E] (fp32), an input gradient [N,C],
 * and the shared experts' dact [N,MS] and dh [N,2MS]; under expert parallelism the
 * received output gradients [MR,C] (then, in place, the input gradients going back) and
 * the exchange's work [MR,C] (da and dh then [MR,.]); in a bf16 run the router's input
 * gradient in fp32 [N,C] (dxf; NULL in fp32, where the router writes the input's
 * gradient itself); the micro-batch's sequences' expert counts [B,E] (int32: the balance
 * loss's, summed over the ranks that split a sequence). NULL without MoE. */
typedef struct {
    void *dyp, *da, *dh, *dx, *sh_da, *sh_dh, *dyr, *er;
    float *dw, *dlogits, *dxf;
    int *seq_counts;
} moe_scratch;
moe_scratch ts_scratch_moe(const ts_model *m, const ts_scratch *sc, int B, int T);

/* ---- the zero-bubble stash: a block's matmul output gradients, I pass to W pass ----
 * Per block, in activation elements: the MLP phase's part (its output's gradient [N,C],
 * then its input linear's output gradient [N,FI]), then the attention phase's (its
 * output's gradient [N,C], then the q|k|v gradient [N,QKV]); after the blocks, for the
 * first chunk, the embedding output's gradient [N,C]. Each phase's part starts with its
 * output's gradient [N,C] and then its input linear's [N, width]. An MLA block has no
 * attention part (mla.c makes those weight gradients in the input pass). */
void *ts_stash_mlp(const ts_model *m, void *block_stash, int N);
void *ts_stash_attention(const ts_model *m, void *block_stash, int N);
/* A block's stash (l a block) and the embedding's, within a->wstash. */
void *ts_stash_block(const ts_model *m, const ts_acts *a, int l);
void *ts_stash_embed(const ts_model *m, const ts_acts *a);

/* Packed documents' per-micro-batch buffers (model/documents.c; nothing when the
 * model has no document token): allocated by ts_acts_init, freed by ts_acts_free. */
void ts_acts_documents_init(const ts_model *m, ts_acts *a);
void ts_acts_documents_free(ts_acts *a);

#endif
