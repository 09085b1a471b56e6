/* Multi-head latent attention (DeepSeek-V2/V3 sec. 2.1.1; Hugging Face's
 * DeepseekV3Attention), an MLA block's attention phase (block.h). Per row of the block's
 * input x [N,C]:
 *   [c_q | c_kv | k_pe] = x @ [q_a_proj | kv_a_proj_with_mqa]^T   (one packed GEMM)
 *   q       = q_b_proj(RMSNorm(c_q))         (q_proj(x) without a q latent)
 *   [k_nope | v] per head = kv_b_proj(RMSNorm(c_kv))
 *   k       = [k_nope | k_pe] per head       (the one rope key shared by every head)
 *   out     = o_proj(attention(rope(q), rope(k), v))
 * RoPE rotates the last qk_rope_head_dim channels of each q and k head in adjacent pairs
 * (DeepSeek's checkpoint order); the softmax scale is the model's (YaRN's mscale^2).
 *
 * The kernels see ordinary multi-head attention: the q|k|v rows they read are assembled
 * here ([q heads | k heads (k_nope, k_pe copied into each) | v heads], memcpy_2d's
 * strided copies) with q/k heads of nope + rope channels and v heads of v_head_dim.
 * Backward: the k heads' rope-part gradients sum into k_pe's (after RoPE's backward), the
 * rest runs the same way back to the latents and through the packed down-projection.
 *
 * Tensor parallelism: the latent trunk (the down-projection and the two latent norms) is
 * replicated: every tp rank computes the small latents whole and runs its own heads'
 * up-projections (column-parallel) and o_proj's part (row-parallel; its sum is the
 * forward's one collective). A rank's latent gradients are its heads' part; everything
 * back from them is linear in them, so the input gradient's part is summed by the one
 * all-reduce (or reduce-scatter) a column-parallel input gradient always has, and the
 * replicated weights' gradients are summed over tp once a step
 * (ts_model_sum_sequence_grads). Sequence parallelism gathers the input as for any
 * attention.
 *
 * Saved: the latents before and after their norms, k_pe before RoPE, the assembled q|k|v,
 * att and atty (act_layout.h). Under selective recompute q|k|v and att are not kept: the
 * block keeps q (before RoPE) and the backward rebuilds k and v from the latent (kv_b_proj
 * again, the copies, RoPE) and then the probabilities. All of this phase's weight
 * gradients are made in the input pass, also under the zero-bubble split (its weight pass
 * has nothing left: as the MoE's experts). */
#include "model/block.h"
#include "model/mla_cp.h"

/* RMSNorm eps of the two latent norms: DeepseekV3RMSNorm's default (transformers builds
 * q_a_layernorm and kv_a_layernorm without passing rms_norm_eps). */
#define MLA_LATENT_EPS 1e-6f

/* This sub-batch's rows of every part of the work region. */
static mla_work work_rows(const block_sub *b, void *base)
{
    const act_dims *d = b->d;
    mla_work w = ts_mla_work_of(d, base);
    const size_t n = (size_t)b->sub * (size_t)b->N;
    w.qkv = act_at(d, w.qkv, n * (d->rebuild ? d->QKV : 0));
    w.q = act_at(d, w.q, n * d->QK);
    w.kvb = act_at(d, w.kvb, n * d->KVB);
    w.lat = act_at(d, w.lat, n * d->LA);
    w.pe = act_at(d, w.pe, n * d->H * d->RR);
    w.dckv_n = act_at(d, w.dckv_n, n * d->RKV);
    w.dckv = act_at(d, w.dckv, n * d->RKV);
    w.dcq_n = act_at(d, w.dcq_n, n * d->RQ);
    w.dcq = act_at(d, w.dcq, n * d->RQ);
    w.dkpe = act_at(d, w.dkpe, n * d->RR);
    return w;
}

/* Columns [soff, soff + width) of src's rows (scols wide) to columns [doff, ...) of dst's
 * (dcols wide), for N rows: one strided copy. */
static void copy_cols(const block_sub *b, void *dst, size_t dcols, size_t doff, const void *src,
                      size_t scols, size_t soff, size_t width)
{
    const size_t ab = b->d->ab;
    b->m->k->memcpy_2d(act_at(b->d, dst, doff), dcols * ab, act_at(b->d, src, soff), scols * ab,
                       width * ab, (size_t)b->N);
}

static ts_att_heads heads(const block_sub *b)
{
    const act_dims *d = b->d;
    return (ts_att_heads){.NH = (int)d->H, .NKV = (int)d->H, .HS = (int)d->HS,
                          .HSV = (int)d->HSV, .scale = b->m->att_scale,
                          .doc_start = b->doc_start};
}

/* q|k|v [N,QKV] from q [N,QK] (before RoPE), kv_b_proj's output [N,KVB] (per head k_nope
 * then v) and the rope key [N,RR]; then RoPE on the q and k heads' rope channels. */
static void assemble(const block_sub *b, void *qkv, const void *q, const void *kvb,
                     const void *kpe)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const size_t H = d->H, HS = d->HS, HSV = d->HSV, nope = HS - d->RR, kb = nope + HSV;
    copy_cols(b, qkv, d->QKV, 0, q, d->QK, 0, d->QK);
    for (size_t h = 0; h < H; h++) {
        copy_cols(b, qkv, d->QKV, d->QK + h * HS, kvb, d->KVB, h * kb, nope);
        copy_cols(b, qkv, d->QKV, d->QK + h * HS + nope, kpe, d->RR, 0, d->RR);
        copy_cols(b, qkv, d->QKV, 2 * d->QK + h * HSV, kvb, d->KVB, h * kb + nope, HSV);
    }
    ts_block_rope(b, qkv, heads(b), m->rope_dim, m->rope_interleaved, false);
}

/* kv_b_proj(c_kv) [N,KVB]: this rank's heads' k_nope|v. */
static void kv_up(const block_sub *b, void *kvb)
{
    const act_dims *d = b->d;
    ts_tp_col_forward(&b->m->tp, kvb, b->v.mla_ckv, ts_block_weight(b, b->r.mla_kvb_w), NULL,
                      b->N, (int)d->RKV, (int)d->KVB);
}

void ts_mla_forward(const block_sub *b, const void *in, void *out, ts_tp_pending *p)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    const mla_work w = work_rows(b, b->mla_work);
    const int N = b->N;
    /* The latents, replicated: every rank the whole down-projection. */
    ts_tp_col_forward(&m->tp, w.lat, in, ts_block_weight(b, b->r.mla_qa_w), NULL, N,
                      (int)d->C, (int)d->LA);
    copy_cols(b, v->mla_ckv_pre, d->RKV, 0, w.lat, d->LA, d->QA, d->RKV);
    copy_cols(b, v->mla_kpe, d->RR, 0, w.lat, d->LA, d->QA + d->RKV, d->RR);
    m->k->rmsnorm_forward(v->mla_ckv, v->mla_ckv_rstd, v->mla_ckv_pre,
                          ts_block_param(b, b->r.mla_kv_norm_w), N, (int)d->RKV, MLA_LATENT_EPS);
    /* q before RoPE: kept under selective recompute (the rebuild's start), else work. */
    void *q = d->selective ? v->mla_q : w.q;
    if (d->RQ > 0) {
        copy_cols(b, v->mla_cq_pre, d->RQ, 0, w.lat, d->LA, 0, d->RQ);
        m->k->rmsnorm_forward(v->mla_cq, v->mla_cq_rstd, v->mla_cq_pre,
                              ts_block_param(b, b->r.mla_q_norm_w), N, (int)d->RQ,
                              MLA_LATENT_EPS);
        ts_tp_col_forward(&m->tp, q, v->mla_cq, ts_block_weight(b, b->r.mla_qb_w), NULL, N,
                          (int)d->RQ, (int)d->QK);
    } else {
        copy_cols(b, q, d->QK, 0, w.lat, d->LA, 0, d->QK); /* q_proj's part of the GEMM */
    }
    void *qkv = d->selective ? w.qkv : v->qkv;
    if (m->cp.size > 1) { /* the latent exchanged, k and v expanded from it: mla_cp.h */
        ts_mla_cp_forward(b, qkv, q, d->selective ? b->att_work : v->att);
    } else {
        kv_up(b, w.kvb);
        assemble(b, qkv, q, w.kvb, v->mla_kpe);
        m->k->attention_forward(v->atty, d->selective ? b->att_work : v->att, qkv, b->B, b->T,
                                heads(b));
    }
    ts_tp_row_forward(&m->tp, out, v->atty, ts_block_weight(b, b->r.proj_w), NULL, N, (int)d->Cl,
                      (int)d->C, b->gath, p);
}

void ts_mla_backward_output(const block_sub *b, const void *dout, ts_tp_pending *p)
{
    ts_block_output_grad(b, NULL, dout, p);
}

/* The k heads' gradients [N,QKV] back to their parts: dq [N,QK], k_nope|v's [N,KVB], and
 * the rope key's [N,RR] (the sum over the heads of their rope channels' gradients: one
 * GEMM with the model's 0/1 matrix, accumulated in fp32). */
static void split_grads(const block_sub *b, const mla_work *w, const void *dqkv)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const size_t H = d->H, HS = d->HS, HSV = d->HSV, R = d->RR, nope = HS - R, kb = nope + HSV;
    copy_cols(b, w->q, d->QK, 0, dqkv, d->QKV, 0, d->QK);
    for (size_t h = 0; h < H; h++) {
        copy_cols(b, w->kvb, d->KVB, h * kb, dqkv, d->QKV, d->QK + h * HS, nope);
        copy_cols(b, w->pe, H * R, h * R, dqkv, d->QKV, d->QK + h * HS + nope, R);
        copy_cols(b, w->kvb, d->KVB, h * kb + nope, dqkv, d->QKV, 2 * d->QK + h * HSV, HSV);
    }
    m->k->matmul_forward(w->dkpe, w->pe, m->mla_pe_sum, NULL, b->N, (int)(H * R), (int)R);
}

void ts_mla_backward_core(const block_sub *b, const void *dout, const void *in_local,
                          ts_tp_pending *p)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    const mla_work w = work_rows(b, b->mla_work);
    const int N = b->N;
    void *datty = b->narrow; /* [N,Cl] */
    ts_tp_row_backward(&m->tp, datty, ts_block_grad(b, b->r.proj_w), NULL,
                       ts_block_output_grad_at(b, NULL, dout), v->atty,
                       ts_block_weight(b, b->r.proj_w), N, (int)d->Cl, (int)d->C);
    const void *qkv = v->qkv, *att = v->att;
    const bool cp = m->cp.size > 1; /* the latent exchanged: mla_cp.h */
    if (d->selective && cp) { /* q and k_pe here; k, v and att in ts_mla_cp_backward */
        ts_mla_cp_assemble(b, w.qkv, v->mla_q);
        qkv = w.qkv;
        att = NULL;
    } else if (d->selective) {
        /* Rebuilding from the latent: k and v (kv_b_proj again, the copies, RoPE) beside
         * the kept q, then the probabilities (the same kernels on the same inputs: the
         * forward's values). */
        TS_ASSERT(d->rebuild);
        kv_up(b, w.kvb);
        assemble(b, w.qkv, v->mla_q, w.kvb, v->mla_kpe);
        void *rebuilt = ts_scratch_rebuilt(d, b->sc);
        m->k->attention_forward(ts_scratch_rebuilt_out(d, b->sc), rebuilt, w.qkv, b->B, b->T,
                                heads(b));
        qkv = w.qkv;
        att = rebuilt;
    }
    void *dqkv = b->wide;
    if (cp) /* also kv_b_proj's backward: w.dckv_n, its weight gradient */
        ts_mla_cp_backward(b, dqkv, w.dckv_n, datty, qkv, att);
    else
        m->k->attention_backward(dqkv, ts_scratch_attention(d, b->sc), datty, qkv, att, b->B,
                                 b->T, heads(b));
    ts_block_rope(b, dqkv, heads(b), m->rope_dim, m->rope_interleaved, true);
    split_grads(b, &w, dqkv);
    /* kv_b_proj and the k/v latent's norm: the latent's gradient before its norm. */
    if (!cp)
        m->k->matmul_backward(w.dckv_n, ts_block_grad(b, b->r.mla_kvb_w), NULL, w.kvb,
                              v->mla_ckv, ts_block_weight(b, b->r.mla_kvb_w), N, (int)d->RKV,
                              (int)d->KVB);
    m->k->memset_zero(w.dckv, (size_t)N * d->RKV * d->ab);
    m->k->rmsnorm_backward(w.dckv, ts_block_grad(b, b->r.mla_kv_norm_w), w.dckv_n,
                           v->mla_ckv_pre, ts_block_param(b, b->r.mla_kv_norm_w),
                           v->mla_ckv_rstd, N, (int)d->RKV);
    /* The down-projection's output gradient [N,LA]: q's part, the latent's, k_pe's. */
    if (d->RQ > 0) {
        m->k->matmul_backward(w.dcq_n, ts_block_grad(b, b->r.mla_qb_w), NULL, w.q, v->mla_cq,
                              ts_block_weight(b, b->r.mla_qb_w), N, (int)d->RQ, (int)d->QK);
        m->k->memset_zero(w.dcq, (size_t)N * d->RQ * d->ab);
        m->k->rmsnorm_backward(w.dcq, ts_block_grad(b, b->r.mla_q_norm_w), w.dcq_n,
                               v->mla_cq_pre, ts_block_param(b, b->r.mla_q_norm_w),
                               v->mla_cq_rstd, N, (int)d->RQ);
        copy_cols(b, w.lat, d->LA, 0, w.dcq, d->RQ, 0, d->RQ);
    } else {
        copy_cols(b, w.lat, d->LA, 0, w.q, d->QK, 0, d->QK);
    }
    copy_cols(b, w.lat, d->LA, d->QA, w.dckv, d->RKV, 0, d->RKV);
    copy_cols(b, w.lat, d->LA, d->QA + d->RKV, w.dkpe, d->RR, 0, d->RR);
    ts_block_gather_input(b, in_local, p); /* again: only this rank's rows were kept */
}

void ts_mla_backward_input(const block_sub *b, void *din, const void *in_local,
                           ts_tp_pending *p)
{
    const act_dims *d = b->d;
    const mla_work w = work_rows(b, b->mla_work);
    /* This rank's heads' part of the input gradient, summed over tp by the column-parallel
     * backward's collective; the packed down-projection's gradient is this rank's part
     * (summed once a step). */
    ts_tp_col_backward(&b->m->tp, din, ts_block_grad(b, b->r.mla_qa_w), NULL, w.lat,
                       ts_block_input_at(b, in_local), ts_block_weight(b, b->r.mla_qa_w), b->N,
                       (int)d->C, (int)d->LA, b->narrow, p);
}
