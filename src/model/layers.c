/* Forward and backward of the three layer kinds, one micro-batch at a time.
 * A block reads like nanoGPT's:  x = x + attn(ln_1(x));  x = x + mlp(ln_2(x)).
 * The backward runs the residual stream's gradient `dx` through in place: each
 * LayerNorm backward adds its input gradient to it (the residual branch's identity
 * path is the "+ dx" for free).
 *
 * Tensor parallelism (Megatron) is in the calls, not here: c_attn, c_fc and the LM head
 * are column-parallel linears, the two c_proj row-parallel, the embedding and the
 * cross-entropy vocab-parallel (tensor/tp.h holds their collectives). The same code
 * runs the unsharded model when tp.size == 1. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tensor/tp.h"

/* ---------------------------------------------------- the activation layout */

/* Sizes of one micro-batch on one tensor-parallel rank: N = B*T rows, C channels, and
 * this rank's Cl = C/tp attention channels (H = n_head/tp heads), F = 4C/tp MLP
 * columns and Vl vocabulary rows; att and att_scratch: the bytes the backend's
 * attention keeps for its backward and the workspace that needs (kernels.h); ab: the
 * bytes of one activation element (the table's act_dtype). */
typedef struct {
    size_t B, T, N, C, Cl, F, H, Vl, att, att_scratch, ab;
} act_dims;

static act_dims dims_of(const ts_kernels *k, int n_embd, int n_head, int vocab, int tp,
                        int tp_rank, int B, int T)
{
    int64_t v0, nv;
    ts_shard_range(vocab, tp, tp_rank, &v0, &nv);
    const int H = n_head / tp, HS = n_embd / n_head;
    act_dims d = {.B = (size_t)B, .T = (size_t)T, .N = (size_t)B * T, .C = (size_t)n_embd,
                  .Cl = (size_t)n_embd / tp, .F = 4 * (size_t)n_embd / tp,
                  .H = (size_t)H, .Vl = (size_t)nv,
                  .att = k->attention_saved_bytes(B, T, H, HS),
                  .att_scratch = k->attention_scratch_bytes(B, T, H, HS),
                  .ab = ts_dtype_bytes(k->act_dtype)};
    return d;
}

static act_dims model_dims(const ts_model *m, int B, int T)
{
    return dims_of(m->k, m->n_embd, m->n_head, m->vocab_size, m->tp.size, m->tp.rank, B, T);
}

/* The saved activations of each layer kind, in memory order: X(name, count, type) with
 * the count in terms of `d` (an act_dims) and the type A (activation elements, the
 * table's act_dtype), F (fp32: statistics and losses, whatever the precision) or BYTES
 * (a size the backend gives in bytes). These lists are the only place the layout is
 * written: the views below, ts_acts_bytes, the memory estimate and the partition's
 * modelled activation bytes all expand them (llm.c's fill_in_activation_sizes). */
#define EMBED_ACTS(X) X(out, d.N * d.C, A) /* [N,C] token + position embedding */

#define BLOCK_ACTS(X)                                                                      \
    X(ln1, d.N * d.C, A) X(ln1_mean, d.N, F) X(ln1_rstd, d.N, F) /* ln_1 output, stats */  \
    X(qkv, d.N * 3 * d.Cl, A)          /* [N,3Cl] this rank's heads of q, k and v */        \
    X(atty, d.N * d.Cl, A)             /* [N,Cl] attention output before c_proj */          \
    X(att, d.att, BYTES)               /* attention's saved state (CPU: [B,H,T,T] softmax) */ \
    X(res2, d.N * d.C, A)              /* [N,C] x + attn(...) */                            \
    X(ln2, d.N * d.C, A) X(ln2_mean, d.N, F) X(ln2_rstd, d.N, F)                            \
    X(fch, d.N * d.F, A) X(fch_gelu, d.N * d.F, A) /* [N,F] MLP hidden, before/after GELU */ \
    X(out, d.N * d.C, A)               /* [N,C] block output x + attn + mlp */

#define HEAD_ACTS(X)                                                                       \
    X(lnf, d.N * d.C, A) X(lnf_mean, d.N, F) X(lnf_rstd, d.N, F)                            \
    X(losses, d.N, F)                  /* [N] per-token cross-entropy */                    \
    X(xent_stats, 3 * d.N, F)          /* vocab-parallel row statistics (tp.h) */           \
    X(logits, d.N * d.Vl, A)           /* [N,Vl]: logits, then dlogits in place */

/* Each buffer starts on a 64-byte boundary (a bf16 buffer may hold an odd count). */
#define ACT_ALIGN(bytes) (((bytes) + 63) / 64 * 64)
#define ACT_CTYPE_A void
#define ACT_CTYPE_F float
#define ACT_CTYPE_BYTES void
#define ACT_ELEM_A (d.ab)
#define ACT_ELEM_F sizeof(float)
#define ACT_ELEM_BYTES ((size_t)1)
#define ACT_FIELD(name, count, type) ACT_CTYPE_##type *name;
#define ACT_BYTES(name, count, type) +ACT_ALIGN((count) * ACT_ELEM_##type)
#define ACT_VIEW(name, count, type) v.name = (ACT_CTYPE_##type *)p, p += ACT_ALIGN((count) * ACT_ELEM_##type);

typedef struct { EMBED_ACTS(ACT_FIELD) } embed_acts;
typedef struct { BLOCK_ACTS(ACT_FIELD) } block_acts;
typedef struct { HEAD_ACTS(ACT_FIELD) } head_acts;

static size_t kind_bytes(ts_layer_kind kind, act_dims d)
{
    switch (kind) {
    case TS_LAYER_EMBED: return 0 EMBED_ACTS(ACT_BYTES);
    case TS_LAYER_BLOCK: return 0 BLOCK_ACTS(ACT_BYTES);
    case TS_LAYER_HEAD: return 0 HEAD_ACTS(ACT_BYTES);
    }
    return 0;
}

size_t ts_layer_act_bytes(const ts_model_config *cfg, ts_layer_kind kind, int B, int T, int tp,
                          int tp_rank, const ts_kernels *k)
{
    return kind_bytes(kind, dims_of(k, cfg->n_embd, cfg->n_head, cfg->vocab_size, tp, tp_rank,
                                    B, T));
}

static unsigned char *layer_mem(const ts_acts *a, int l)
{
    return a->mem + a->layer_off[l - a->l0];
}

static block_acts block_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = model_dims(m, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    block_acts v;
    BLOCK_ACTS(ACT_VIEW)
    return v;
}

static head_acts head_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = model_dims(m, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    head_acts v;
    HEAD_ACTS(ACT_VIEW)
    return v;
}

static embed_acts embed_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = model_dims(m, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    embed_acts v;
    EMBED_ACTS(ACT_VIEW)
    (void)p;
    return v;
}

static size_t layer_bytes(const ts_model *m, int l, int B, int T)
{
    return kind_bytes(m->layers[l].kind, model_dims(m, B, T));
}

void ts_acts_init(ts_acts *a, const ts_model *m, int l0, int l1, int B, int T)
{
    TS_ASSERT(0 <= l0 && l0 < l1 && l1 <= m->n_layers && T <= m->max_seq_len);
    memset(a, 0, sizeof *a);
    a->l0 = l0;
    a->l1 = l1;
    a->B = B;
    a->T = T;
    a->k = m->k;
    a->tokens = m->k->dev_alloc((size_t)B * T * sizeof(int));
    a->targets = m->k->dev_alloc((size_t)B * T * sizeof(int));
    a->layer_off = ts_calloc((size_t)(l1 - l0), sizeof(size_t));
    size_t total = 0;
    for (int l = l0; l < l1; l++) {
        a->layer_off[l - l0] = total;
        total += layer_bytes(m, l, B, T);
    }
    a->bytes = total;
    a->mem = m->k->dev_alloc(total);
}

size_t ts_acts_bytes(const ts_model *m, int l0, int l1, int B, int T)
{
    size_t total = 0;
    for (int l = l0; l < l1; l++) total += layer_bytes(m, l, B, T);
    return total;
}

void ts_acts_free(ts_acts *a)
{
    if (a->k) {
        a->k->dev_free(a->wstash);
        a->k->dev_free(a->tokens);
        a->k->dev_free(a->targets);
        a->k->dev_free(a->mem);
    }
    free(a->layer_off);
    memset(a, 0, sizeof *a);
}

void *ts_acts_output(const ts_model *m, const ts_acts *a, int l)
{
    switch (m->layers[l].kind) {
    case TS_LAYER_EMBED: return embed_views(m, a, l).out;
    case TS_LAYER_BLOCK: return block_views(m, a, l).out;
    case TS_LAYER_HEAD: break;
    }
    TS_ASSERT(!"the head has no activation output");
    return NULL;
}

const float *ts_acts_losses(const ts_model *m, const ts_acts *a)
{
    TS_ASSERT(a->l1 == m->n_layers);
    return head_views(m, a, m->n_layers - 1).losses;
}

static const void *layer_input(const ts_model *m, const ts_acts *a, int l)
{
    return l == a->l0 ? a->input : ts_acts_output(m, a, l - 1);
}

/* The backward's scratch, in activation elements: a block's [N,F] hidden gradient
 * (later its [N,3Cl] qkv gradient, 3Cl < F), an [N,C] input gradient, then the attention
 * backward's workspace (bytes, 64-aligned); the head's [N,C] input gradient. */
static size_t scratch_att_offset(act_dims d) { return ACT_ALIGN((d.N * d.F + d.N * d.C) * d.ab); }

size_t ts_scratch_bytes(const ts_model *m, int B, int T)
{
    const act_dims d = model_dims(m, B, T);
    return scratch_att_offset(d) + d.att_scratch;
}

void ts_scratch_init(ts_scratch *s, const ts_model *m, int B, int T)
{
    s->bytes = ts_scratch_bytes(m, B, T);
    s->k = m->k;
    s->mem = m->k->dev_alloc(s->bytes);
}

void ts_scratch_free(ts_scratch *s)
{
    if (s->k) s->k->dev_free(s->mem);
    s->mem = NULL;
}

/* `p` advanced by n activation elements. */
static void *act_at(const act_dims *d, const void *p, size_t n)
{
    return (unsigned char *)p + n * d->ab;
}

/* ---------------------------------------------------------------- forward */

static void embed_forward(const ts_model *m, const ts_acts *a, int l)
{
    const int p0 = m->layers[l].first_param;
    ts_tp_embed_forward(&m->tp, embed_views(m, a, l).out, a->tokens, ts_param_data(m, p0),
                        m->vocab_start, m->local_vocab, ts_param_data(m, p0 + 1), a->B, a->T,
                        m->n_embd);
}

static void block_forward(const ts_model *m, const ts_acts *a, int l, const void *x)
{
    const ts_kernels *k = m->k;
    const ts_tp *tp = &m->tp;
    const act_dims d = model_dims(m, a->B, a->T);
    const int B = a->B, T = a->T, C = m->n_embd, N = B * T, Cl = (int)d.Cl, F = (int)d.F;
    const int p0 = m->layers[l].first_param;
#define P(i) ts_param_data(m, p0 + (i))    /* fp32 master: LayerNorm weights, biases */
#define W(i) ts_param_compute(m, p0 + (i)) /* the matmuls' compute copy */
    block_acts s = block_views(m, a, l);

    k->layernorm_forward(s.ln1, s.ln1_mean, s.ln1_rstd, x, P(TS_B_LN1_W), P(TS_B_LN1_B), N, C);
    ts_tp_col_forward(tp, s.qkv, s.ln1, W(TS_B_QKV_W), P(TS_B_QKV_B), N, C, 3 * Cl);
    k->attention_forward(s.atty, s.att, s.qkv, B, T, m->local_heads, m->local_heads,
                         m->n_embd / m->n_head);
    ts_tp_row_forward(tp, s.res2, s.atty, W(TS_B_ATTPROJ_W), P(TS_B_ATTPROJ_B), N, Cl, C);
    /* res2 = x + attn(...) and ln_2 of it in one pass over the rows. */
    k->residual_layernorm_forward(s.res2, s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, x,
                                  P(TS_B_LN2_W), P(TS_B_LN2_B), N, C);

    ts_tp_col_forward(tp, s.fch, s.ln2, W(TS_B_FC_W), P(TS_B_FC_B), N, C, F);
    k->gelu_forward(s.fch_gelu, s.fch, (size_t)N * F);
    ts_tp_row_forward(tp, s.out, s.fch_gelu, W(TS_B_FCPROJ_W), P(TS_B_FCPROJ_B), N, F, C);
    k->residual_forward(s.out, s.out, s.res2, (size_t)N * C);
#undef P
#undef W
}

static void head_forward(const ts_model *m, const ts_acts *a, int l, const void *x, float dloss,
                         double *loss_acc)
{
    const int N = a->B * a->T, C = m->n_embd;
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);

    m->k->layernorm_forward(h.lnf, h.lnf_mean, h.lnf_rstd, x, ts_param_data(m, p0),
                            ts_param_data(m, p0 + 1), N, C);
    /* LM head tied to the token embedding: logits = lnf @ wte^T, this rank's vocabulary
     * columns; then the loss, leaving the softmax's gradient in place of the logits. */
    ts_tp_col_forward(&m->tp, h.logits, h.lnf, ts_param_compute(m, m->head_wte_param), NULL, N,
                      C, m->local_vocab);
    ts_tp_cross_entropy(&m->tp, h.losses, h.logits, h.xent_stats, a->targets, m->vocab_start,
                        m->local_vocab, N, dloss);
    if (loss_acc) m->k->sum_into(loss_acc, h.losses, (size_t)N);
}

static void between_layers(const ts_model *m)
{
    if (m->between_layers) m->between_layers(m->between_layers_ctx);
}

void ts_model_forward(const ts_model *m, ts_acts *a, float dloss, double *loss_acc)
{
    for (int l = a->l0; l < a->l1; l++) {
        const ts_layer *L = &m->layers[l];
        TS_ASSERT(L->owned);
        switch (L->kind) {
        case TS_LAYER_EMBED:
            embed_forward(m, a, l);
            break;
        case TS_LAYER_BLOCK:
            block_forward(m, a, l, layer_input(m, a, l));
            break;
        case TS_LAYER_HEAD:
            head_forward(m, a, l, layer_input(m, a, l), dloss, loss_acc);
            break;
        }
        between_layers(m);
    }
}

/* ------------------------------------------------ forward for generation */

/* The head without the loss: ln_f and the tied LM head on each sequence's last position
 * only (a LayerNorm row needs no other row), logits [B, V] in activation elements. The
 * rest of the head's buffers (losses, the other positions) are left untouched. */
static void head_forward_logits(const ts_model *m, const ts_acts *a, int l, const void *x,
                                void *logits)
{
    const act_dims d = model_dims(m, a->B, a->T);
    const int C = m->n_embd, V = m->local_vocab;
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);
    for (int b = 0; b < a->B; b++) {
        const size_t row = (size_t)b * a->T + (size_t)(a->T - 1);
        m->k->layernorm_forward(act_at(&d, h.lnf, row * C), h.lnf_mean + row, h.lnf_rstd + row,
                                act_at(&d, x, row * C), ts_param_data(m, p0),
                                ts_param_data(m, p0 + 1), 1, C);
        ts_tp_col_forward(&m->tp, act_at(&d, logits, (size_t)b * V), act_at(&d, h.lnf, row * C),
                          ts_param_compute(m, m->head_wte_param), NULL, 1, C, V);
    }
}

void ts_model_forward_logits(const ts_model *m, ts_acts *a, void *logits)
{
    const int head = m->n_layers - 1;
    TS_ASSERT(a->l0 == 0 && a->l1 == m->n_layers && m->tp.size == 1);
    for (int l = 0; l < m->n_layers; l++) TS_ASSERT(m->layers[l].owned);
    embed_forward(m, a, 0);
    for (int l = 1; l < head; l++) block_forward(m, a, l, ts_acts_output(m, a, l - 1));
    head_forward_logits(m, a, head, ts_acts_output(m, a, head - 1), logits);
}

/* ---------------------------------------------------------------- backward */

static void embed_backward(const ts_model *m, const ts_acts *a, int l, const void *dout)
{
    const int p0 = m->layers[l].first_param;
    ts_tp_embed_backward(&m->tp, ts_param_grad(m, p0), ts_param_grad(m, p0 + 1), dout, a->tokens,
                         m->vocab_start, m->local_vocab, a->B, a->T, m->n_embd);
}

/* The backward of a block. With `stash` (the zero-bubble input-gradient pass) the four
 * matmul weight gradients are not computed: their output gradients are kept in the
 * stash for block_backward_weight. The stash and the scratch hold activation
 * elements. */
enum { STASH_D_OUT, STASH_D_FCH, STASH_D_RES2, STASH_D_QKV };
static size_t stash_elems(const ts_model *m, int N)
{
    const act_dims d = model_dims(m, N, 1); /* only the N rows matter here */
    return d.N * (2 * d.C + d.F + 3 * d.Cl);
}
static void *stash_part(const ts_model *m, void *st, int N, int part)
{
    const act_dims d = model_dims(m, N, 1); /* only the N rows matter here */
    const size_t NC = d.N * d.C, NF = d.N * d.F;
    switch (part) {
    case STASH_D_OUT: return st;
    case STASH_D_FCH: return act_at(&d, st, NC);
    case STASH_D_RES2: return act_at(&d, st, NC + NF);
    default: return act_at(&d, st, 2 * NC + NF);
    }
}

static void block_backward(const ts_model *m, const ts_acts *a, int l, const void *x, void *dx,
                           ts_scratch *sc, void *stash)
{
    const ts_kernels *k = m->k;
    const ts_tp *tp = &m->tp;
    const act_dims d = model_dims(m, a->B, a->T);
    const int B = a->B, T = a->T, C = m->n_embd, N = B * T, Cl = (int)d.Cl, F = (int)d.F;
    const size_t NC = (size_t)N * C;
    const int p0 = m->layers[l].first_param;
#define P(i) ts_param_data(m, p0 + (i))
#define W(i) ts_param_compute(m, p0 + (i))
#define G(i) ts_param_grad(m, p0 + (i))
#define GW(i) (stash ? NULL : G(i)) /* matmul weight gradients: deferred with a stash */
    block_acts s = block_views(m, a, l);
    void *dfch = stash ? stash_part(m, stash, N, STASH_D_FCH) : sc->mem;       /* [N,F] */
    void *dqkv = stash ? stash_part(m, stash, N, STASH_D_QKV) : sc->mem;       /* [N,3Cl] */
    void *bufc = act_at(&d, sc->mem, (size_t)N * F);                           /* [N,C] */
    void *att_scratch = (unsigned char *)sc->mem + scratch_att_offset(d);

    /* MLP: dx is the gradient of the block output (the same on every tp rank). */
    const void *d_out = dx;
    if (stash) {
        m->k->memcpy_d2d(stash_part(m, stash, N, STASH_D_OUT), dx, NC * d.ab);
        d_out = stash_part(m, stash, N, STASH_D_OUT);
    }
    ts_tp_row_backward(tp, dfch, GW(TS_B_FCPROJ_W), G(TS_B_FCPROJ_B), d_out, s.fch_gelu,
                       W(TS_B_FCPROJ_W), N, F, C);
    k->gelu_backward(dfch, s.fch, dfch, (size_t)N * F);
    ts_tp_col_backward(tp, bufc, GW(TS_B_FC_W), G(TS_B_FC_B), dfch, s.ln2, W(TS_B_FC_W), N, C, F);
    k->layernorm_backward(dx, G(TS_B_LN2_W), G(TS_B_LN2_B), bufc, s.res2, P(TS_B_LN2_W),
                          s.ln2_mean, s.ln2_rstd, N, C);

    /* Attention: dx is now the gradient of res2. */
    const void *d_res2 = dx;
    if (stash) {
        m->k->memcpy_d2d(stash_part(m, stash, N, STASH_D_RES2), dx, NC * d.ab);
        d_res2 = stash_part(m, stash, N, STASH_D_RES2);
    }
    void *datty = bufc; /* [N,Cl] */
    ts_tp_row_backward(tp, datty, GW(TS_B_ATTPROJ_W), G(TS_B_ATTPROJ_B), d_res2, s.atty,
                       W(TS_B_ATTPROJ_W), N, Cl, C);
    k->attention_backward(dqkv, att_scratch, datty, s.qkv, s.att, B, T, m->local_heads,
                          m->local_heads, m->n_embd / m->n_head);
    ts_tp_col_backward(tp, bufc, GW(TS_B_QKV_W), G(TS_B_QKV_B), dqkv, s.ln1, W(TS_B_QKV_W), N, C,
                       3 * Cl);
    k->layernorm_backward(dx, G(TS_B_LN1_W), G(TS_B_LN1_B), bufc, x, P(TS_B_LN1_W), s.ln1_mean,
                          s.ln1_rstd, N, C);
#undef P
#undef W
#undef G
#undef GW
}

static void block_backward_weight(const ts_model *m, const ts_acts *a, int l, void *stash)
{
    const ts_tp *tp = &m->tp;
    const act_dims d = model_dims(m, a->B, a->T);
    const int C = m->n_embd, N = a->B * a->T, Cl = (int)d.Cl, F = (int)d.F;
    const int p0 = m->layers[l].first_param;
#define G(i) ts_param_grad(m, p0 + (i))
    block_acts s = block_views(m, a, l);
    ts_tp_row_backward(tp, NULL, G(TS_B_FCPROJ_W), NULL, stash_part(m, stash, N, STASH_D_OUT),
                       s.fch_gelu, NULL, N, F, C);
    ts_tp_col_backward(tp, NULL, G(TS_B_FC_W), NULL, stash_part(m, stash, N, STASH_D_FCH), s.ln2,
                       NULL, N, C, F);
    ts_tp_row_backward(tp, NULL, G(TS_B_ATTPROJ_W), NULL, stash_part(m, stash, N, STASH_D_RES2),
                       s.atty, NULL, N, Cl, C);
    ts_tp_col_backward(tp, NULL, G(TS_B_QKV_W), NULL, stash_part(m, stash, N, STASH_D_QKV), s.ln1,
                       NULL, N, C, 3 * Cl);
#undef G
}

/* The head's backward: the forward left dlogits in place of the logits. With
 * `defer_weight`, the LM head's (tied embedding's) weight gradient waits for the W pass. */
static void head_backward(const ts_model *m, const ts_acts *a, int l, const void *x, void *dx,
                          ts_scratch *sc, bool defer_weight)
{
    const act_dims d = model_dims(m, a->B, a->T);
    const int N = a->B * a->T, C = m->n_embd;
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);
    void *dlnf = sc->mem;

    ts_tp_col_backward(&m->tp, dlnf, defer_weight ? NULL : ts_param_grad(m, m->head_wte_param),
                       NULL, h.logits, h.lnf, ts_param_compute(m, m->head_wte_param), N, C,
                       m->local_vocab);
    m->k->memset_zero(dx, (size_t)N * C * d.ab);
    m->k->layernorm_backward(dx, ts_param_grad(m, p0), ts_param_grad(m, p0 + 1), dlnf, x,
                             ts_param_data(m, p0), h.lnf_mean, h.lnf_rstd, N, C);
}

void ts_model_backward(const ts_model *m, ts_acts *a, void *dx, ts_scratch *s,
                       ts_layer_done_fn layer_done, void *ctx)
{
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED:
            embed_backward(m, a, l, dx);
            break;
        case TS_LAYER_BLOCK:
            block_backward(m, a, l, layer_input(m, a, l), dx, s, NULL);
            break;
        case TS_LAYER_HEAD:
            head_backward(m, a, l, layer_input(m, a, l), dx, s, false);
            break;
        }
        if (layer_done) layer_done(ctx, l);
        between_layers(m);
    }
}

/* ------------------------------------------- zero-bubble split: I then W */

/* The stash holds, per block, the output gradients of its four matmuls, then (for the
 * first chunk) the embedding output's gradient; offsets in activation elements. */
static size_t stash_offset(const ts_model *m, const ts_acts *a, int l)
{
    int blocks_before = 0;
    for (int j = a->l0; j < l; j++) blocks_before += m->layers[j].kind == TS_LAYER_BLOCK;
    return (size_t)blocks_before * stash_elems(m, a->B * a->T);
}

static size_t stash_total_elems(const ts_model *m, int l0, int l1, int B, int T)
{
    int blocks = 0;
    for (int l = l0; l < l1; l++) blocks += m->layers[l].kind == TS_LAYER_BLOCK;
    return (size_t)blocks * stash_elems(m, B * T) + (l0 == 0 ? (size_t)B * T * m->n_embd : 0);
}

size_t ts_acts_stash_bytes(const ts_model *m, int l0, int l1, int B, int T)
{
    return stash_total_elems(m, l0, l1, B, T) * ts_dtype_bytes(m->k->act_dtype);
}

void ts_model_backward_input(const ts_model *m, ts_acts *a, void *dx, ts_scratch *s)
{
    const act_dims d = model_dims(m, a->B, a->T);
    const size_t NC = (size_t)a->B * a->T * m->n_embd;
    TS_ASSERT(a->wstash == NULL);
    size_t embed_at = stash_offset(m, a, a->l1);
    a->wstash = m->k->dev_alloc(ts_acts_stash_bytes(m, a->l0, a->l1, a->B, a->T));
    TS_ASSERT(embed_at + (a->l0 == 0 ? NC : 0) == stash_total_elems(m, a->l0, a->l1, a->B, a->T));
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED: /* no input gradient: keep its output gradient for W */
            m->k->memcpy_d2d(act_at(&d, a->wstash, embed_at), dx, NC * d.ab);
            break;
        case TS_LAYER_BLOCK:
            block_backward(m, a, l, layer_input(m, a, l), dx, s,
                           act_at(&d, a->wstash, stash_offset(m, a, l)));
            break;
        case TS_LAYER_HEAD:
            head_backward(m, a, l, layer_input(m, a, l), dx, s, true);
            break;
        }
        between_layers(m);
    }
}

void ts_model_backward_weight(const ts_model *m, ts_acts *a)
{
    const act_dims d = model_dims(m, a->B, a->T);
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED:
            embed_backward(m, a, l, act_at(&d, a->wstash, stash_offset(m, a, a->l1)));
            break;
        case TS_LAYER_BLOCK:
            block_backward_weight(m, a, l, act_at(&d, a->wstash, stash_offset(m, a, l)));
            break;
        case TS_LAYER_HEAD: {
            head_acts h = head_views(m, a, l);
            ts_tp_col_backward(&m->tp, NULL, ts_param_grad(m, m->head_wte_param), NULL, h.logits,
                               h.lnf, NULL, a->B * a->T, m->n_embd, m->local_vocab);
            break;
        }
        }
        between_layers(m);
    }
    m->k->dev_free(a->wstash);
    a->wstash = NULL;
}
