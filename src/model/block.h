/* A transformer block, private to src/model: the block (block.c) and its two phases, the
 * units an architecture swaps: attention (attention.c; MLA would replace it) and the MLP
 * (mlp.c; experts would). In one sub-batch the block reads like nanoGPT's
 *     x = x + attn(norm_1(x));  x = x + mlp(norm_2(x))
 * The block owns the norms and the residual stream; a phase reads the normalized input
 * (every row, gathered under sequence parallelism) and writes its branch's output (this
 * rank's rows of a row-parallel sum, in flight), and its backward runs the other way.
 * A phase touches only its own parameters (by role), its own saved activations (the
 * attention's qkv, kvg, atty, att; the MLP's fch, fch_gelu: act_layout.h) and its part of
 * the zero-bubble stash. */
#ifndef TS_MODEL_BLOCK_H
#define TS_MODEL_BLOCK_H

#include "model/act_layout.h"
#include "model/model.h"
#include "tensor/tp.h"

/* ---- what differs between the architectures ---- */

/* A block's parameters by role, as indices relative to its first_param (-1: the
 * architecture has none, e.g. llama's biases): one block code for both. */
typedef struct {
    int norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b, norm2_w, norm2_b, fc_w, fc_b,
        fcproj_w, fcproj_b;
    int q_norm_w, k_norm_w; /* model.qk_norm's per-head RMSNorm weights (Qwen3) */
    /* An MoE block's (model.h's order; fc_w and fcproj_w are then -1): the router, expert
     * e's gate|up at moe_expert0 + 3e and its down right after the up (+ 2), e this
     * rank's LOCAL expert under expert parallelism, the shared experts' gate|up and down
     * (-1 without). */
    int moe_router_w, moe_expert0, moe_shared_fc_w, moe_shared_proj_w;
    /* An MLA block's attention (model.h's order; qkv_w is then -1, proj_w o_proj): the
     * input's packed down-projection q_a_proj|kv_a_proj_with_mqa (q_proj|kv_a_... without
     * a q latent) at mla_qa_w, its kv part at mla_kva_w, the latents' RMSNorms and
     * up-projections (mla_q_norm_w, mla_qb_w -1 without a q latent). Meaningless
     * otherwise. */
    int mla_qa_w, mla_kva_w, mla_q_norm_w, mla_qb_w, mla_kv_norm_w, mla_kvb_w;
} block_roles;
block_roles ts_block_roles(const ts_model *m, int l);

/* LayerNorm (gpt2) or RMSNorm (llama; no mean, no bias) over N rows. */
void ts_norm_forward(const ts_model *m, void *out, float *mean, float *rstd, const void *inp,
                     const float *w, const float *b, int N);
/* res = a + b, then out = norm(res), in one pass over the rows. */
void ts_residual_norm_forward(const ts_model *m, void *res, void *out, float *mean, float *rstd,
                              const void *a, const void *b, const float *w, const float *bias,
                              int N);
/* dinp += the norm's input gradient (the residual stream's). */
void ts_norm_backward(const ts_model *m, void *dinp, float *dw, float *db, const void *dout,
                      const void *inp, const float *w, const float *mean, const float *rstd,
                      int N);

/* ---- one sub-batch of one block, as its phases see it ---- */
typedef struct {
    const ts_model *m;
    const act_dims *d;
    int p0;                 /* the block's first parameter */
    int l;                  /* its layer */
    float dloss;            /* the forward's weight per target (ts_acts.dloss) */
    block_roles r;
    int sub;                /* which of d->S sub-batches */
    int B, T, N, NL;        /* its B sequences of T positions: N rows, NL of them this
                               rank's (N / tp under sequence parallelism) */
    block_acts v;           /* its rows of the saved activations */
    void *gath;             /* sequence parallelism: [N,C] where its rows are gathered and
                               a row-parallel sum's partial products go (NULL without) */
    void *att_work;         /* selective recompute: where attention's state goes */
    void *cp_work;          /* context parallelism's exchange work (NULL without) */
    void *mla_work;         /* MLA's work region, the micro-batch's (act_layout.h) */
    /* the backward's: the scratch (act_layout.h), and this sub-batch's rows of it */
    const ts_scratch *sc;
    void *wide;             /* [N,max(FI,QKV)]: an input linear's output gradient */
    void *narrow;           /* [N,max(C,F)]: a matmul's input gradient, and the work of a
                               column-parallel backward's sum */
    void *stash;            /* the zero-bubble input pass: the block's stash, where the
                               matmul output gradients wait for the weight pass (whose
                               gradients are then not computed); NULL otherwise */
    /* Packed documents (ts_acts' doc_start, doc_cos, doc_sin at this sub-batch's rows;
     * NULL without): attention's first visible keys and RoPE's restarted rows. */
    const int *doc_start;
    const float *doc_cos, *doc_sin;
} block_sub;

/* The heads h with this sub-batch's document starts (NULL: causal). */
static inline ts_att_heads ts_block_heads(const block_sub *b, ts_att_heads h)
{
    h.doc_start = b->doc_start;
    return h;
}
/* RoPE (forward, or its backward) on the sub-batch's rows of buf (heads h: kernels.h
 * rope_forward): at positions 0..T-1 of each sequence, or with packed documents at each
 * row's restarted position (one table row per row: B = 1, T = N). */
void ts_block_rope(const block_sub *b, void *buf, ts_att_heads h, int RD, bool interleaved,
                   bool backward);

/* Parameter views of the block (i a role, -1: none): fp32 masters (norms, biases), the
 * matmuls' compute copy, gradients, and matmul weight gradients (NULL under a stash). */
const float *ts_block_param(const block_sub *b, int i);
const void *ts_block_weight(const block_sub *b, int i);
float *ts_block_grad(const block_sub *b, int i);
float *ts_block_weight_grad(const block_sub *b, int i);

/* Sub-batch rows of a phase's stash part (phase_stash: ts_stash_mlp or
 * ts_stash_attention of b->stash): part 0 its output's gradient [N,C], part 1 its input
 * linear's output gradient [N,width]. */
void *ts_block_keep(const block_sub *b, void *phase_stash, int part, size_t width);

/* A phase's backward reads its output's gradient as [N,C]: dout [NL,C] gathered under
 * sequence parallelism (into keep when given, else b->gath; in flight on p), copied into
 * keep when given (the stash: the weight pass reads it after dout moved on), else dout
 * itself. ts_block_output_grad starts that; ts_block_output_grad_at says where it is. */
void ts_block_output_grad(const block_sub *b, void *keep, const void *dout, ts_tp_pending *p);
const void *ts_block_output_grad_at(const block_sub *b, void *keep, const void *dout);
/* A phase's input [N,C] from this rank's rows in_local [NL,C]: gathered into b->gath
 * (in flight on p) under sequence parallelism; ts_block_input_at says where it is. */
void ts_block_gather_input(const block_sub *b, const void *in_local, ts_tp_pending *p);
const void *ts_block_input_at(const block_sub *b, const void *in_local);

/* ---- the attention phase (attention.c) ----
 * forward:   out[NL,C] (sum in flight) = o_proj(attention(rope(qkv_proj(in[N,C]))))
 * backward:  _output starts reading dout[NL,C]; _core runs back through the output
 *            projection and attention to the q|k|v gradient (the stash's, or `wide`) and
 *            gathers in_local again; _input is q|k|v's backward: din[NL,C] (this rank's
 *            rows of the sum, in flight) += nothing: it is written, the norm adds. */
void ts_attn_forward(const block_sub *b, const void *in, void *out, ts_tp_pending *p);
void ts_attn_backward_output(const block_sub *b, const void *dout, ts_tp_pending *p);
void ts_attn_backward_core(const block_sub *b, const void *dout, const void *in_local,
                           ts_tp_pending *p);
void ts_attn_backward_input(const block_sub *b, void *din, const void *in_local,
                            ts_tp_pending *p);
/* The zero-bubble weight pass over the whole micro-batch (b->sub 0 of one: S ignored):
 * the two matmul weight gradients from the stash, in [N,C] its input gathered. */
void ts_attn_backward_weight(const block_sub *b, const void *in);

/* ---- the multi-head latent attention phase (mla.c), an MLA block's attention ----
 * forward:   out[NL,C] (sum in flight) = o_proj(attention(rope(assembled q|k|v))), q and
 *            k|v from the replicated latents of in[N,C] through this rank's heads'
 *            up-projections;
 * backward:  as attention's, every weight gradient made in the input pass (also under
 *            the zero-bubble stash: its weight pass has nothing left to do). */
void ts_mla_forward(const block_sub *b, const void *in, void *out, ts_tp_pending *p);
void ts_mla_backward_output(const block_sub *b, const void *dout, ts_tp_pending *p);
void ts_mla_backward_core(const block_sub *b, const void *dout, const void *in_local,
                          ts_tp_pending *p);
void ts_mla_backward_input(const block_sub *b, void *din, const void *in_local,
                           ts_tp_pending *p);

/* ---- the MLP phase (mlp.c) ----
 * forward:   out[NL,C] (sum in flight) = c_proj(act(c_fc(in[N,C])))  (GELU or SwiGLU)
 * backward:  as attention's, with c_fc's output gradient in place of q|k|v's. */
void ts_mlp_forward(const block_sub *b, const void *in, void *out, ts_tp_pending *p);
void ts_mlp_backward_output(const block_sub *b, const void *dout, ts_tp_pending *p);
void ts_mlp_backward_core(const block_sub *b, const void *dout, const void *in_local,
                          ts_tp_pending *p);
void ts_mlp_backward_input(const block_sub *b, void *din, const void *in_local,
                           ts_tp_pending *p);
void ts_mlp_backward_weight(const block_sub *b, const void *in);

/* ---- the Mixture-of-Experts phase (moe.c), an MoE block's MLP, on one rank ----
 * forward:   out[N,C] = sum_k w_k expert_k(in) (+ shared(in)), routed by the router;
 * backward:  din[N,C] (written) from dout, with every expert's, the router's and the
 *            shared experts' weight gradients and the auxiliary losses' gradients. */
void ts_moe_forward(const block_sub *b, const void *in, void *out);
void ts_moe_backward(const block_sub *b, void *din, const void *dout, const void *in);

/* ---- the block (block.c) ---- */
/* Forward of block l on input x [NL,C] into its saved activations. */
void ts_block_forward(const ts_model *m, const ts_acts *a, int l, const void *x);
/* Backward: dx [NL,C] the gradient of the block's output on entry, of its input on exit.
 * With `stash` (the zero-bubble input pass, this block's) the matmul weight gradients
 * wait there for ts_block_backward_weight. */
void ts_block_backward(const ts_model *m, const ts_acts *a, int l, const void *x, void *dx,
                       const ts_scratch *sc, void *stash);
void ts_block_backward_weight(const ts_model *m, const ts_acts *a, int l, void *stash,
                              const ts_scratch *sc);

/* ---- multi-token prediction's modules (mtp.c), inside the head's layer ----
 * forward: after the head's loss, each module's loss with weight dloss * mtp_coef per
 * target, summed into m->mtp_sums when `count`; backward: after the head's (dx [NL,C]
 * holds its input gradient), every module's, adding dL/dh^0 into dx. */
void ts_mtp_forward(const ts_model *m, const ts_acts *a, float dloss, bool count);
void ts_mtp_backward(const ts_model *m, const ts_acts *a, void *dx, const ts_scratch *sc);
/* The modules' part of ts_model_sum_sequence_grads: each module's block through
 * sum_block, and under sequence parallelism its own replicated tensors. */
void ts_mtp_sum_sequence_grads(const ts_model *m, void (*sum_block)(const ts_model *, int));
/* ts_acts_init's part for the modules (a->mtp_ids set): the host scratch of
 * ts_acts_set_mtp_ids and the rows past the window of each depth (a->mtp_host, mtp_runs),
 * freed by ts_acts_free. */
void ts_mtp_acts_init(const ts_model *m, ts_acts *a);

/* Under sequence parallelism full[N,C] = every rank's rows local[NL,C], sub-batch by
 * sub-batch (tensor/tp.h), blocking; returns full, or local without it. */
const void *ts_gather_rows(const ts_model *m, const act_dims *d, void *full, const void *local);

#endif
