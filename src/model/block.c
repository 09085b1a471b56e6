/* The transformer block (block.h): the norms and the residual stream around the two
 * phases, in steps over one sub-batch that tensor/phase_runner.h interleaves under
 * tp_overlap; the architectures' differences in norms and parameter roles. */
#include "model/block.h"

#include "tensor/cp.h"
#include "tensor/phase_runner.h"

/* ------------------------------------------- what differs between the architectures */

/* A block's MLP roles after its post-attention norm at norm2 (model.c's
 * add_llama_mlp_params). */
static void mlp_roles(const ts_model *m, int l, int norm2, block_roles *r)
{
    r->norm2_w = norm2;
    r->fc_w = norm2 + 1; /* gate, up packed after it, then down */
    r->fcproj_w = norm2 + 3;
    r->moe_router_w = r->moe_expert0 = r->moe_shared_fc_w = r->moe_shared_proj_w = -1;
    if (l >= 0 && m->layers[l].moe) {
        /* The MoE's parameters in place of gate, up and down (model.h). */
        r->fc_w = r->fcproj_w = -1;
        r->moe_router_w = norm2 + 1;
        r->moe_expert0 = norm2 + 2;
        if (m->moe_shared_ffn > 0) {
            r->moe_shared_fc_w = r->moe_expert0 + 3 * m->moe_local_experts;
            r->moe_shared_proj_w = r->moe_shared_fc_w + 2;
        }
    }
}

/* An MLA block (model.c's add_mla_params): input_layernorm, q_a_proj (or q_proj),
 * kv_a_proj_with_mqa, [q_a_layernorm, q_b_proj], kv_a_layernorm, kv_b_proj, o_proj, then
 * the MLP's. */
static block_roles mla_roles(const ts_model *m, int l)
{
    block_roles r = {.norm1_w = TS_L_ATTN_NORM_W, .norm1_b = -1, .qkv_w = -1, .qkv_b = -1,
                     .proj_b = -1, .norm2_b = -1, .fc_b = -1, .fcproj_b = -1, .q_norm_w = -1,
                     .k_norm_w = -1, .mla_qa_w = 1, .mla_kva_w = 2, .mla_q_norm_w = -1,
                     .mla_qb_w = -1};
    int i = 3;
    if (m->mla_q_rank > 0) {
        r.mla_q_norm_w = i++;
        r.mla_qb_w = i++;
    }
    r.mla_kv_norm_w = i++;
    r.mla_kvb_w = i++;
    r.proj_w = i++;
    mlp_roles(m, l, i, &r);
    return r;
}

block_roles ts_block_roles(const ts_model *m, int l)
{
    if (m->arch != TS_ARCH_LLAMA)
        return (block_roles){TS_B_LN1_W, TS_B_LN1_B, TS_B_QKV_W, TS_B_QKV_B, TS_B_ATTPROJ_W,
                             TS_B_ATTPROJ_B, TS_B_LN2_W, TS_B_LN2_B, TS_B_FC_W, TS_B_FC_B,
                             TS_B_FCPROJ_W, TS_B_FCPROJ_B, -1, -1, -1, -1, -1, -1,
                             -1, -1, -1, -1, -1, -1};
    if (m->mla_kv_rank > 0) return mla_roles(m, l);
    /* q_norm and k_norm, when there, come right after o_proj (model.h). */
    const int qk = m->qk_norm ? 2 : 0;
    block_roles r = {TS_L_ATTN_NORM_W, -1, TS_L_Q_W, -1, TS_L_O_W, -1,
                     TS_L_MLP_NORM_W + qk, -1, TS_L_GATE_W + qk, -1,
                     TS_L_DOWN_W + qk, -1, m->qk_norm ? TS_L_O_W + 1 : -1,
                     m->qk_norm ? TS_L_O_W + 2 : -1, -1, -1, -1, -1,
                     -1, -1, -1, -1, -1, -1};
    if (l >= 0 && m->layers[l].moe) {
        /* The MoE's parameters in place of gate, up and down (model.h). */
        r.fc_w = r.fcproj_w = -1;
        r.moe_router_w = r.norm2_w + 1;
        r.moe_expert0 = r.norm2_w + 2;
        if (m->moe_shared_ffn > 0) {
            r.moe_shared_fc_w = r.moe_expert0 + 3 * m->moe_local_experts;
            r.moe_shared_proj_w = r.moe_shared_fc_w + 2;
        }
    }
    return r;
}

void ts_norm_forward(const ts_model *m, void *out, float *mean, float *rstd, const void *inp,
                     const float *w, const float *b, int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->rmsnorm_forward(out, rstd, inp, w, N, m->n_embd, m->norm_eps);
    else
        m->k->layernorm_forward(out, mean, rstd, inp, w, b, N, m->n_embd);
}

void ts_residual_norm_forward(const ts_model *m, void *res, void *out, float *mean, float *rstd,
                              const void *a, const void *b, const float *w, const float *bias,
                              int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->residual_rmsnorm_forward(res, out, rstd, a, b, w, N, m->n_embd, m->norm_eps);
    else
        m->k->residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, m->n_embd);
}

void ts_norm_backward(const ts_model *m, void *dinp, float *dw, float *db, const void *dout,
                      const void *inp, const float *w, const float *mean, const float *rstd,
                      int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, m->n_embd);
    else
        m->k->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, m->n_embd);
}

/* ------------------------------------------------ what a phase sees */

const float *ts_block_param(const block_sub *b, int i)
{
    return i < 0 ? NULL : ts_param_data(b->m, b->p0 + i);
}
const void *ts_block_weight(const block_sub *b, int i)
{
    return ts_param_compute(b->m, b->p0 + i);
}
float *ts_block_grad(const block_sub *b, int i)
{
    return i < 0 ? NULL : ts_param_grad(b->m, b->p0 + i);
}
float *ts_block_weight_grad(const block_sub *b, int i)
{
    return b->stash ? NULL : ts_block_grad(b, i);
}

void *ts_block_keep(const block_sub *b, void *phase_stash, int part, size_t width)
{
    const act_dims *d = b->d;
    void *base = part == 0 ? phase_stash : act_at(d, phase_stash, d->N * d->C);
    return act_at(d, base, (size_t)b->sub * (size_t)b->N * width);
}

void ts_block_output_grad(const block_sub *b, void *keep, const void *dout, ts_tp_pending *p)
{
    const act_dims *d = b->d;
    if (d->sp)
        ts_tp_seq_gather(&b->m->tp, keep ? keep : b->gath, dout, b->N, (int)d->C, p);
    else if (keep)
        b->m->k->memcpy_d2d(keep, dout, (size_t)b->N * d->C * d->ab);
}
const void *ts_block_output_grad_at(const block_sub *b, void *keep, const void *dout)
{
    return keep ? keep : b->d->sp ? b->gath : dout;
}

void ts_block_gather_input(const block_sub *b, const void *in_local, ts_tp_pending *p)
{
    ts_tp_seq_gather(&b->m->tp, b->gath, in_local, b->N, (int)b->d->C, p);
}
const void *ts_block_input_at(const block_sub *b, const void *in_local)
{
    return b->d->sp ? b->gath : in_local;
}

/* ------------------------------------------------ the block's steps */

/* A block's run over its sub-batches: what every step needs to find sub-batch i. */
typedef struct {
    const ts_model *m;
    const ts_acts *a;
    act_dims d;
    int l, p0;
    block_acts s;            /* the whole micro-batch's views */
    const void *x;           /* [NL,C] the block's input */
    void *dx;                /* [NL,C] the residual stream's gradient (backward) */
    void *gath, *cp_work;    /* sequence and context parallelism's work (or NULL) */
    void *mla_work;          /* MLA's work region (or NULL) */
    /* the backward's */
    const ts_scratch *sc;
    void *stash;
    void *dnorm;             /* sequence parallelism: [NL,C] a norm's output gradient */
} block_run;

static block_run block_run_of(const ts_model *m, const ts_acts *a, int l, const void *x)
{
    block_run r = {.m = m, .a = a, .d = ts_act_dims(m, l, a->B, a->T), .l = l,
                   .p0 = m->layers[l].first_param, .s = ts_block_views(m, a, l), .x = x};
    return r;
}

void ts_block_rope(const block_sub *b, void *buf, ts_att_heads h, int RD, bool interleaved,
                   bool backward)
{
    const ts_model *m = b->m;
    const float *cos = m->rope_cos, *sin = m->rope_sin;
    int B = b->B, T = b->T;
    if (b->doc_cos) {
        cos = b->doc_cos;
        sin = b->doc_sin;
        T = B * T;
        B = 1;
    }
    if (backward)
        m->k->rope_backward(buf, cos, sin, B, T, h, RD, interleaved);
    else
        m->k->rope_forward(buf, cos, sin, B, T, h, RD, interleaved);
}

/* Sub-batch i of run r. */
static block_sub sub_of(const block_run *r, int i)
{
    const act_dims *d = &r->d;
    const int S = (int)d->S, N = (int)(d->N / d->S);
    block_sub b = {.m = r->m, .d = d, .p0 = r->p0, .l = r->l, .dloss = r->a->dloss,
                   .r = ts_block_roles(r->m, r->l), .sub = i,
                   .B = r->a->B / S, .T = r->a->T, .N = N, .NL = (int)(d->NL / d->S),
                   .v = ts_block_sub_views(d, &r->s, i), .att_work = r->a->att_work,
                   .cp_work = r->cp_work, .mla_work = r->mla_work, .sc = r->sc,
                   .stash = r->stash};
    b.gath = r->gath ? act_at(d, r->gath, (size_t)i * N * d->C) : NULL;
    if (r->a->doc_start) {
        const size_t half = (size_t)r->m->rope_dim / 2;
        b.doc_start = r->a->doc_start + (size_t)i * N;
        b.doc_cos = r->a->doc_cos ? r->a->doc_cos + (size_t)i * N * half : NULL;
        b.doc_sin = r->a->doc_sin ? r->a->doc_sin + (size_t)i * N * half : NULL;
    }
    if (r->sc) {
        b.wide = act_at(d, ts_scratch_wide(d, r->sc), (size_t)i * N * ts_scratch_wide_cols(*d));
        b.narrow =
            act_at(d, ts_scratch_narrow(d, r->sc), (size_t)i * N * ts_scratch_narrow_cols(*d));
    }
    return b;
}

/* Sub-batch rows of the residual stream [NL,C]: the block's input x, its gradient dx. */
static const void *x_rows(const block_run *r, const block_sub *b)
{
    return act_at(&r->d, r->x, (size_t)b->sub * b->NL * r->d.C);
}
static void *dx_rows(const block_run *r, const block_sub *b)
{
    return act_at(&r->d, r->dx, (size_t)b->sub * b->NL * r->d.C);
}
/* A norm's output gradient [NL,C] as a phase's input linear leaves it: this rank's rows
 * of the sum (sequence parallelism), else the all-reduced [N,C] in `narrow`. */
static void *dnorm_rows(const block_run *r, const block_sub *b)
{
    if (!r->d.sp) return b->narrow;
    return act_at(&r->d, r->dnorm, (size_t)b->sub * b->NL * r->d.C);
}

/* ---- forward: ln1 = norm_1(x); res2 = x + attn(ln1); ln2 = norm_2(res2);
 *      out = res2 + mlp(ln2) ---- */

static void fwd_norm_1(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    ts_norm_forward(r->m, b.v.ln1, b.v.ln1_mean, b.v.ln1_rstd, x_rows(r, &b),
                    ts_block_param(&b, b.r.norm1_w), ts_block_param(&b, b.r.norm1_b), b.NL);
    ts_block_gather_input(&b, b.v.ln1, p);
}

static void fwd_attn(void *ctx, int i, ts_tp_pending *p)
{
    const block_sub b = sub_of(ctx, i);
    if (b.m->mla_kv_rank > 0)
        ts_mla_forward(&b, ts_block_input_at(&b, b.v.ln1), b.v.res2, p);
    else
        ts_attn_forward(&b, ts_block_input_at(&b, b.v.ln1), b.v.res2, p);
}

static void fwd_residual_norm_2(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    ts_residual_norm_forward(r->m, b.v.res2, b.v.ln2, b.v.ln2_mean, b.v.ln2_rstd, b.v.res2,
                             x_rows(r, &b), ts_block_param(&b, b.r.norm2_w),
                             ts_block_param(&b, b.r.norm2_b), b.NL);
    /* An MoE block under sequence parallelism routes this rank's rows: nothing to
     * gather (moe.c). */
    if (!b.m->layers[b.l].moe) ts_block_gather_input(&b, b.v.ln2, p);
}

static void fwd_mlp(void *ctx, int i, ts_tp_pending *p)
{
    const block_sub b = sub_of(ctx, i);
    if (b.m->layers[b.l].moe)
        ts_moe_forward(&b, b.v.ln2, b.v.out);
    else
        ts_mlp_forward(&b, ts_block_input_at(&b, b.v.ln2), b.v.out, p);
}

static void fwd_residual(void *ctx, int i, ts_tp_pending *p)
{
    (void)p;
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    r->m->k->residual_forward(b.v.out, b.v.out, b.v.res2, (size_t)b.NL * r->d.C);
}

void ts_block_forward(const ts_model *m, const ts_acts *a, int l, const void *x)
{
    static const ts_phase_step steps[] = {fwd_norm_1, fwd_attn, fwd_residual_norm_2, fwd_mlp,
                                          fwd_residual};
    block_run r = block_run_of(m, a, l, x);
    /* Sequence parallelism: each norm's output is gathered for its phase into the
     * scratch's gather rows (a forward leaves nothing there). Selective recompute keeps
     * no attention state: the forward writes it to the work area. */
    r.gath = a->sp_work;
    r.cp_work = a->cp_work;
    r.mla_work = a->mla_work;
    TS_ASSERT(!r.d.mla || r.mla_work);
    TS_ASSERT(!r.d.sp || r.gath);
    TS_ASSERT(!r.d.selective || a->att_work);
    ts_phase_run(&m->tp, (int)r.d.S, steps, (int)(sizeof steps / sizeof *steps), &r);
}

/* ---- backward, the same steps reversed: each phase's backward starts reading its
 *      output's gradient (dx), runs back to its input linear's, then through it to
 *      the norm's output gradient; the norm's backward adds into dx ---- */

/* An MoE block runs its whole MLP backward in the last of the three steps (one rank:
 * no collective to overlap). */
static void bwd_mlp_output(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    if (!b.m->layers[b.l].moe) ts_mlp_backward_output(&b, dx_rows(r, &b), p);
}

static void bwd_mlp_core(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    if (!b.m->layers[b.l].moe) ts_mlp_backward_core(&b, dx_rows(r, &b), b.v.ln2, p);
}

static void bwd_mlp_input(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    if (b.m->layers[b.l].moe)
        ts_moe_backward(&b, dnorm_rows(r, &b), dx_rows(r, &b), b.v.ln2);
    else
        ts_mlp_backward_input(&b, dnorm_rows(r, &b), b.v.ln2, p);
}

/* The second norm's backward (dx becomes res2's gradient), and attention's output
 * gradient: the residual's identity path makes them the same. */
static void bwd_norm_2_attn_output(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    ts_norm_backward(r->m, dx_rows(r, &b), ts_block_grad(&b, b.r.norm2_w),
                     ts_block_grad(&b, b.r.norm2_b), dnorm_rows(r, &b), b.v.res2,
                     ts_block_param(&b, b.r.norm2_w), b.v.ln2_mean, b.v.ln2_rstd, b.NL);
    if (b.m->mla_kv_rank > 0)
        ts_mla_backward_output(&b, dx_rows(r, &b), p);
    else
        ts_attn_backward_output(&b, dx_rows(r, &b), p);
}

static void bwd_attn_core(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    if (b.m->mla_kv_rank > 0)
        ts_mla_backward_core(&b, dx_rows(r, &b), b.v.ln1, p);
    else
        ts_attn_backward_core(&b, dx_rows(r, &b), b.v.ln1, p);
}

static void bwd_attn_input(void *ctx, int i, ts_tp_pending *p)
{
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    if (b.m->mla_kv_rank > 0)
        ts_mla_backward_input(&b, dnorm_rows(r, &b), b.v.ln1, p);
    else
        ts_attn_backward_input(&b, dnorm_rows(r, &b), b.v.ln1, p);
}

static void bwd_norm_1(void *ctx, int i, ts_tp_pending *p)
{
    (void)p;
    const block_run *r = ctx;
    const block_sub b = sub_of(r, i);
    ts_norm_backward(r->m, dx_rows(r, &b), ts_block_grad(&b, b.r.norm1_w),
                     ts_block_grad(&b, b.r.norm1_b), dnorm_rows(r, &b), x_rows(r, &b),
                     ts_block_param(&b, b.r.norm1_w), b.v.ln1_mean, b.v.ln1_rstd, b.NL);
}

void ts_block_backward(const ts_model *m, const ts_acts *a, int l, const void *x, void *dx,
                       const ts_scratch *sc, void *stash)
{
    static const ts_phase_step steps[] = {bwd_mlp_output, bwd_mlp_core, bwd_mlp_input,
                                          bwd_norm_2_attn_output, bwd_attn_core,
                                          bwd_attn_input, bwd_norm_1};
    block_run r = block_run_of(m, a, l, x);
    r.dx = dx;
    r.sc = sc;
    r.stash = stash;
    /* Sequence parallelism: the gathered rows (a gradient, then a norm's output again)
     * and the norms' output gradients in this rank's rows, both the scratch's. */
    r.gath = ts_scratch_gather(&r.d, sc);
    r.dnorm = ts_scratch_local(&r.d, sc);
    r.cp_work = ts_scratch_context_work(sc, m, a->B, a->T);
    r.mla_work = ts_scratch_mla_work(sc, m, a->B, a->T);
    ts_phase_run(&m->tp, (int)r.d.S, steps, (int)(sizeof steps / sizeof *steps), &r);
}

/* The zero-bubble weight pass: each phase's matmul weight gradients from the stash, its
 * input gathered once more (into the scratch) under sequence parallelism. */
void ts_block_backward_weight(const ts_model *m, const ts_acts *a, int l, void *stash,
                              const ts_scratch *sc)
{
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    block_sub b = {.m = m, .d = &d, .p0 = m->layers[l].first_param, .l = l,
                   .r = ts_block_roles(m, l),
                   .B = a->B, .T = a->T, .N = (int)d.N, .NL = (int)d.NL,
                   .v = ts_block_views(m, a, l), .gath = ts_scratch_gather(&d, sc), .sc = sc,
                   .stash = stash};
    /* An MoE block made its MLP's weight gradients in the input pass (moe.c). */
    if (!m->layers[l].moe) ts_mlp_backward_weight(&b, ts_gather_rows(m, &d, b.gath, b.v.ln2));
    /* An MLA block made its attention's in the input pass (mla.c). */
    if (m->mla_kv_rank == 0) ts_attn_backward_weight(&b, ts_gather_rows(m, &d, b.gath, b.v.ln1));
}

const void *ts_gather_rows(const ts_model *m, const act_dims *d, void *full, const void *local)
{
    if (!d->sp) return local;
    const size_t Ns = d->N / d->S, NLs = d->NL / d->S;
    for (size_t i = 0; i < d->S; i++)
        ts_tp_seq_gather(&m->tp, act_at(d, full, i * Ns * d->C), act_at(d, local, i * NLs * d->C),
                         (int)Ns, (int)d->C, NULL);
    return full;
}
