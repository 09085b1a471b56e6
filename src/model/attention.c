/* The attention phase of a block (block.h): q|k|v projection (column-parallel, by heads),
 * Qwen3's per-head RMSNorm of q and k (model.qk_norm), rotary embeddings (llama), causal
 * attention over this rank's heads (across the context-parallel group: tensor/cp.h), output projection (row-parallel: its sum is the one
 * collective of the forward). Its saved activations are qkv, kvg, atty and att; under
 * selective recompute att lives in the work area and the backward rebuilds it. */
#include "model/block.h"
#include "tensor/cp.h"

/* This phase's rows of the zero-bubble stash (NULL without one). */
static void *keep(const block_sub *b, int part, size_t width)
{
    if (!b->stash) return NULL;
    return ts_block_keep(b, ts_stash_attention(b->m, b->stash, (int)b->d->N), part, width);
}

/* The q|k|v gradient [N,QKV]: kept in the stash for the weight pass, else `wide`. */
static void *dqkv(const block_sub *b)
{
    return b->stash ? keep(b, 1, b->d->QKV) : b->wide;
}

/* model.qk_norm (Qwen3's q_norm, k_norm; HF: RMSNorm over each head's head_dim channels
 * with eps norm_eps, before RoPE): each row's q heads then k heads, which lie back to
 * back at the start of its q|k|v columns, are H and KV rows of HS for the RMSNorm
 * kernel. Their input is kept in qk_pre for the backward (one strided copy). The norms
 * take one kernel call per row and part: the heads of a row are contiguous, but the rows
 * are QKV apart (a strided-rows RMSNorm kernel would make it one call). */
static void qk_norm_forward(const block_sub *b)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    const int H = (int)d->H, KV = (int)d->KV, HS = (int)d->HS;
    const float *qw = ts_block_param(b, b->r.q_norm_w), *kw = ts_block_param(b, b->r.k_norm_w);
    m->k->memcpy_2d(v->qk_pre, d->QKN * d->ab, v->qkv, d->QKV * d->ab, d->QKN * d->ab,
                    (size_t)b->N);
    for (int n = 0; n < b->N; n++) {
        void *row = act_at(d, v->qkv, (size_t)n * d->QKV);
        const void *pre = act_at(d, v->qk_pre, (size_t)n * d->QKN);
        float *rstd = v->qk_rstd + (size_t)n * d->QKR;
        m->k->rmsnorm_forward(row, rstd, pre, qw, H, HS, m->norm_eps);
        m->k->rmsnorm_forward(act_at(d, row, (size_t)H * HS), rstd + H,
                              act_at(d, pre, (size_t)H * HS), kw, KV, HS, m->norm_eps);
    }
}

/* Its backward, in place on the q and k columns of dqkv (the gradient after the norms
 * on entry, before them on exit), the weights' gradients added; `work` holds one row's
 * q|k gradient while the kernel, which adds into its input gradient, rewrites it. */
static void qk_norm_backward(const block_sub *b, void *dqkv, void *work)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const block_acts *v = &b->v;
    const int H = (int)d->H, KV = (int)d->KV, HS = (int)d->HS;
    const float *qw = ts_block_param(b, b->r.q_norm_w), *kw = ts_block_param(b, b->r.k_norm_w);
    float *dqw = ts_block_grad(b, b->r.q_norm_w), *dkw = ts_block_grad(b, b->r.k_norm_w);
    const size_t qoff = (size_t)H * HS;
    for (int n = 0; n < b->N; n++) {
        void *row = act_at(d, dqkv, (size_t)n * d->QKV);
        const void *pre = act_at(d, v->qk_pre, (size_t)n * d->QKN);
        const float *rstd = v->qk_rstd + (size_t)n * d->QKR;
        m->k->memcpy_d2d(work, row, d->QKN * d->ab);
        m->k->memset_zero(row, d->QKN * d->ab);
        m->k->rmsnorm_backward(row, dqw, work, pre, qw, rstd, H, HS);
        m->k->rmsnorm_backward(act_at(d, row, qoff), dkw, act_at(d, work, qoff),
                               act_at(d, pre, qoff), kw, rstd + H, KV, HS);
    }
}

void ts_attn_forward(const block_sub *b, const void *in, void *out, ts_tp_pending *p)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const int C = (int)d->C, H = (int)d->H, KV = (int)d->KV, HS = (int)d->HS;
    const block_acts *v = &b->v;
    ts_tp_col_forward(&m->tp, v->qkv, in, ts_block_weight(b, b->r.qkv_w),
                      ts_block_param(b, b->r.qkv_b), b->N, C, (int)d->QKV);
    if (m->qk_norm) qk_norm_forward(b);
    const ts_att_heads hd = ts_block_heads(b, ts_att_heads_gqa(H, KV, HS));
    if (m->rope_cos) ts_block_rope(b, v->qkv, hd, HS, false, false);
    ts_cp_attention_forward(&m->cp, v->atty, d->selective ? b->att_work : v->att, v->kvg,
                            b->cp_work, v->qkv, b->B, b->T, hd);
    ts_tp_row_forward(&m->tp, out, v->atty, ts_block_weight(b, b->r.proj_w),
                      ts_block_param(b, b->r.proj_b), b->N, (int)d->Cl, C, b->gath, p);
}

void ts_attn_backward_output(const block_sub *b, const void *dout, ts_tp_pending *p)
{
    ts_block_output_grad(b, keep(b, 0, b->d->C), dout, p);
}

void ts_attn_backward_core(const block_sub *b, const void *dout, const void *in_local,
                           ts_tp_pending *p)
{
    const ts_model *m = b->m;
    const act_dims *d = b->d;
    const int C = (int)d->C, H = (int)d->H, KV = (int)d->KV, HS = (int)d->HS;
    const block_acts *v = &b->v;
    void *datty = b->narrow; /* [N,Cl] */
    ts_tp_row_backward(&m->tp, datty, ts_block_weight_grad(b, b->r.proj_w),
                       ts_block_grad(b, b->r.proj_b),
                       ts_block_output_grad_at(b, keep(b, 0, d->C), dout), v->atty,
                       ts_block_weight(b, b->r.proj_w), b->N, (int)d->Cl, C);
    const ts_att_heads hd = ts_block_heads(b, ts_att_heads_gqa(H, KV, HS));
    const void *att = v->att;
    if (d->selective) {
        TS_ASSERT(d->rebuild);
        /* Selective recompute: the probabilities again, from the q, k, v the block kept
         * (the same kernel on the same input: the values the forward had). The output
         * goes to scratch too; atty, the projection's input, was kept. */
        void *rebuilt = ts_scratch_rebuilt(d, b->sc);
        ts_cp_attention_recompute(&m->cp, ts_scratch_rebuilt_out(d, b->sc), rebuilt, v->kvg,
                                  v->qkv, b->B, b->T, hd);
        att = rebuilt;
    }
    ts_cp_attention_backward(&m->cp, dqkv(b), ts_scratch_attention(d, b->sc), b->cp_work, datty,
                             v->qkv, v->kvg, att, b->B, b->T, hd);
    /* The gradient of q and k before their rotation (RoPE is linear). */
    if (m->rope_cos) ts_block_rope(b, dqkv(b), hd, HS, false, true);
    /* datty, in `narrow`, is spent: it holds a row of the norms' backward. */
    TS_ASSERT(!m->qk_norm || (size_t)b->N * ts_scratch_narrow_cols(*d) >= d->QKN);
    if (m->qk_norm) qk_norm_backward(b, dqkv(b), b->narrow);
    ts_block_gather_input(b, in_local, p); /* again: only this rank's rows were kept */
}

void ts_attn_backward_input(const block_sub *b, void *din, const void *in_local,
                            ts_tp_pending *p)
{
    const act_dims *d = b->d;
    ts_tp_col_backward(&b->m->tp, din, ts_block_weight_grad(b, b->r.qkv_w),
                       ts_block_grad(b, b->r.qkv_b), dqkv(b), ts_block_input_at(b, in_local),
                       ts_block_weight(b, b->r.qkv_w), b->N, (int)d->C, (int)d->QKV, b->narrow,
                       p);
}

void ts_attn_backward_weight(const block_sub *b, const void *in)
{
    const act_dims *d = b->d;
    ts_tp_row_backward(&b->m->tp, NULL, ts_block_grad(b, b->r.proj_w), NULL, keep(b, 0, d->C),
                       b->v.atty, NULL, b->N, (int)d->Cl, (int)d->C);
    ts_tp_col_backward(&b->m->tp, NULL, ts_block_grad(b, b->r.qkv_w), NULL, keep(b, 1, d->QKV),
                       in, NULL, b->N, (int)d->C, (int)d->QKV, NULL, NULL);
}
