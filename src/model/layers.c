/* Forward and backward of the three layer kinds, one micro-batch at a time, for both
 * architectures. A block reads like nanoGPT's:
 *     x = x + attn(norm_1(x));  x = x + mlp(norm_2(x))
 * where gpt2 has LayerNorms, biases and GELU, and llama RMSNorms, rotary embeddings on
 * q and k, grouped-query attention, no biases and SwiGLU (the few calls that differ are
 * the helpers under "what differs"). The backward runs the residual stream's gradient
 * `dx` through in place: each norm's backward adds its input gradient to it (the
 * residual branch's identity path is the "+ dx" for free).
 *
 * Tensor parallelism (Megatron) is in the calls, not here: the q|k|v and MLP input
 * projections and the LM head are column-parallel linears, the attention and MLP output
 * projections row-parallel, the embedding and the cross-entropy vocab-parallel
 * (tensor/tp.h holds their collectives). The same code runs the unsharded model when
 * tp.size == 1. */
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "tensor/tp.h"

/* ---------------------------------------------------- the activation layout */

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
    bool llama, sp, cp;
    bool selective;  /* this layer keeps no attention state (ts_layer.selective) */
    bool rebuild;    /* the scratch holds the rebuilt state: some layer of the model is
                        selective (ts_model.selective_recompute) */
} act_dims;

/* The shape a model (or a config, for estimates) gives the layout. */
typedef struct {
    bool llama, selective, rebuild, sp;
    int n_embd, n_head, n_kv_head, ffn, vocab;
    int sub; /* tp_overlap's sub-batches (0 or 1: none) */
    ts_cp cp; /* context parallelism (size 1: none; T is then the sequence) */
} act_shape;

static act_dims dims_of(const ts_kernels *k, act_shape sh, int tp, int tp_rank, int B, int T)
{
    int64_t v0, nv;
    ts_shard_range(sh.vocab, tp, tp_rank, &v0, &nv);
    const int H = sh.n_head / tp, HS = sh.n_embd / sh.n_head;
    const int KV = tp > sh.n_kv_head ? 1 : sh.n_kv_head / tp;
    const size_t F = (size_t)sh.ffn / tp;
    const size_t NL = sh.sp ? (size_t)B * T / (size_t)tp : (size_t)B * T;
    act_dims d = {.B = (size_t)B, .T = (size_t)T, .N = (size_t)B * T, .C = (size_t)sh.n_embd,
                  .Cl = (size_t)H * HS, .H = (size_t)H, .KV = (size_t)KV, .HS = (size_t)HS,
                  .QKV = (size_t)(H + 2 * KV) * HS, .F = F, .FI = sh.llama ? 2 * F : F,
                  .NM = sh.llama ? 0 : NL, .Vl = (size_t)nv, .NL = NL,
                  .att = k->attention_saved_bytes(B, T, H, HS),
                  .att_scratch = k->attention_scratch_bytes(B, T, H, HS),
                  .ab = ts_dtype_bytes(k->act_dtype), .llama = sh.llama,
                  .selective = sh.selective, .rebuild = sh.rebuild, .sp = sh.sp,
                  .S = sh.sub > 1 ? (size_t)sh.sub : 1};
    if (sh.cp.size > 1 && T > 1) {
        /* T is this rank's positions of each sequence (tensor/cp.h); its attention saves
         * the two chunks' prefix state and keeps the gathered K/V. (T = 1: a count of
         * rows only, the zero-bubble stash's.) */
        ts_cp cp = sh.cp;
        cp.k = k;
        TS_ASSERT(T == ts_cp_local_len(&cp));
        d.att = ts_cp_attention_saved_bytes(&cp, B, H, HS);
        d.att_scratch = ts_cp_attention_scratch_bytes(&cp, B, H, HS);
        d.KVG = ts_cp_kv_elems(&cp, B, KV, HS);
        d.cpw = ts_cp_work_bytes(&cp, B, KV, HS, sh.n_embd, d.ab);
        d.cp = true;
    }
    d.att_kept = sh.selective ? 0 : d.att;
    return d;
}

/* Layer l's dims (l < 0: no layer's, which keeps its attention state: the scratch's and
 * the stash's, whose sizes depend only on whether some layer is selective). */
static act_dims model_dims(const ts_model *m, int l, int B, int T)
{
    const bool selective = l >= 0 && m->layers[l].selective;
    const act_shape sh = {m->arch == TS_ARCH_LLAMA, selective, m->selective_recompute, m->tp.sp,
                          m->n_embd, m->n_head, m->n_kv_head, m->ffn_hidden, m->vocab_size,
                          m->tp.sub, m->cp};
    return dims_of(m->k, sh, m->tp.size, m->tp.rank, B, T);
}

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
 * parallelism); [N,...]: the tensor-parallel regions' (every row, this rank's columns). */
#define BLOCK_ACTS(X)                                                                      \
    X(ln1, d.NL * d.C, A) X(ln1_mean, d.NM, F) X(ln1_rstd, d.NL, F) /* first norm, stats */\
    X(qkv, d.N * d.QKV, A)             /* [N,QKV] this rank's q, k, v heads (llama: after   \
                                          RoPE) */                                          \
    X(kvg, d.KVG, A)                   /* context parallelism: [B,T,2KV HS] every position's \
                                          k, v, gathered (tensor/cp.h) */                   \
    X(atty, d.N * d.Cl, A)             /* [N,Cl] attention output before its projection */  \
    X(att, d.att_kept, BYTES)          /* attention's saved state (CPU: [B,H,T,T] softmax; \
                                          none under selective recompute) */                \
    X(res2, d.NL * d.C, A)             /* [NL,C] x + attn(...) */                           \
    X(ln2, d.NL * d.C, A) X(ln2_mean, d.NM, F) X(ln2_rstd, d.NL, F)                         \
    X(fch, d.N * d.FI, A)              /* [N,FI] c_fc's / gate|up's output */               \
    X(fch_gelu, d.N * d.F, A)          /* [N,F] after GELU / SwiGLU */                      \
    X(out, d.NL * d.C, A)              /* [NL,C] block output x + attn + mlp */

#define HEAD_ACTS(X)                                                                       \
    X(lnf, d.NL * d.C, A) X(lnf_mean, d.NM, F) X(lnf_rstd, d.NL, F)                         \
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
    const act_shape sh = {ts_model_arch(cfg) == TS_ARCH_LLAMA, false, false, false, cfg->n_embd,
                          cfg->n_head, ts_model_kv_heads(cfg), ts_model_ffn(cfg),
                          cfg->vocab_size, 1, {.size = 1}};
    return kind_bytes(kind, dims_of(k, sh, tp, tp_rank, B, T));
}

static unsigned char *layer_mem(const ts_acts *a, int l)
{
    return a->mem + a->layer_off[l - a->l0];
}

static block_acts block_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = model_dims(m, l, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    block_acts v;
    BLOCK_ACTS(ACT_VIEW)
    return v;
}

static head_acts head_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = model_dims(m, l, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    head_acts v;
    HEAD_ACTS(ACT_VIEW)
    return v;
}

static embed_acts embed_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = model_dims(m, l, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    embed_acts v;
    EMBED_ACTS(ACT_VIEW)
    (void)p;
    return v;
}

static size_t layer_bytes(const ts_model *m, int l, int B, int T)
{
    return kind_bytes(m->layers[l].kind, model_dims(m, l, B, T));
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

/* The backward's scratch, in activation elements: a block's [N,max(FI,QKV)] (the MLP
 * projection's output gradient, later the qkv gradient), then [N,max(C,Fa)] (the
 * input gradient of a matmul; with SwiGLU first its output gradient [N,F], as GELU's
 * runs in place), then the attention backward's workspace (bytes, 64-aligned), and
 * when some layer is selective the attention state and output its forward rebuilds
 * (bytes, then [N,Cl], 64-aligned); the head's [N,C] input gradient. Under sequence parallelism
 * two more come before attention's: the gathered rows [N,C] (a norm's output for a
 * column-parallel linear, a gradient for a row-parallel backward; the forwards use it
 * too, and for their row-parallel sums' partial products) and this rank's rows [NL,C] of
 * a column-parallel backward's input gradient. */
static size_t scratch_wide(act_dims d) { return d.FI > d.QKV ? d.FI : d.QKV; }
static size_t scratch_narrow(act_dims d) { return d.llama && d.F > d.C ? d.F : d.C; }
static size_t scratch_gather_offset(act_dims d)
{
    return ACT_ALIGN(d.N * (scratch_wide(d) + scratch_narrow(d)) * d.ab);
}
static size_t scratch_local_offset(act_dims d)
{
    return scratch_gather_offset(d) + ACT_ALIGN(d.N * d.C * d.ab);
}
static size_t scratch_att_offset(act_dims d)
{
    if (!d.sp) return scratch_gather_offset(d);
    return scratch_local_offset(d) + ACT_ALIGN(d.NL * d.C * d.ab);
}

/* Where selective recompute's rebuilt attention state starts, and its output (the
 * scratch has them when d.rebuild: some layer of the model is selective). */
static size_t scratch_rebuilt_offset(act_dims d)
{
    return ACT_ALIGN(scratch_att_offset(d) + d.att_scratch);
}
static size_t scratch_rebuilt_out_offset(act_dims d)
{
    return scratch_rebuilt_offset(d) + ACT_ALIGN(d.att);
}

/* Context parallelism's exchange work (tensor/cp.h) comes last: the forwards use it as
 * well (a->cp_work), beside the regions above that they use. */
static size_t scratch_without_cp(act_dims d)
{
    if (!d.rebuild) return scratch_att_offset(d) + d.att_scratch;
    return scratch_rebuilt_out_offset(d) + d.N * d.Cl * d.ab;
}
static size_t scratch_cp_offset(act_dims d) { return ACT_ALIGN(scratch_without_cp(d)); }

size_t ts_scratch_bytes(const ts_model *m, int B, int T)
{
    const act_dims d = model_dims(m, -1, B, T);
    return d.cp ? scratch_cp_offset(d) + d.cpw : scratch_without_cp(d);
}

void *ts_scratch_context_work(const ts_scratch *s, const ts_model *m, int B, int T)
{
    const act_dims d = model_dims(m, -1, B, T);
    return d.cp ? (unsigned char *)s->mem + scratch_cp_offset(d) : NULL;
}

void *ts_scratch_attention_work(const ts_scratch *s, const ts_model *m, int B, int T)
{
    const act_dims d = model_dims(m, -1, B, T);
    return d.rebuild ? (unsigned char *)s->mem + scratch_rebuilt_offset(d) : NULL;
}

void *ts_scratch_sequence_work(const ts_scratch *s, const ts_model *m, int B, int T)
{
    const act_dims d = model_dims(m, -1, B, T);
    return d.sp ? (unsigned char *)s->mem + scratch_gather_offset(d) : NULL;
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

/* ------------------------------------------- what differs between the architectures */

/* A block's parameters by role, as indices relative to its first_param (-1: the
 * architecture has none, e.g. llama's biases): one block code for both. */
typedef struct {
    int norm1_w, norm1_b, qkv_w, qkv_b, proj_w, proj_b, norm2_w, norm2_b, fc_w, fc_b,
        fcproj_w, fcproj_b;
} block_roles;

static block_roles roles_of(const ts_model *m)
{
    if (m->arch == TS_ARCH_LLAMA)
        return (block_roles){TS_L_ATTN_NORM_W, -1, TS_L_Q_W, -1, TS_L_O_W, -1,
                             TS_L_MLP_NORM_W, -1, TS_L_GATE_W, -1, TS_L_DOWN_W, -1};
    return (block_roles){TS_B_LN1_W, TS_B_LN1_B, TS_B_QKV_W, TS_B_QKV_B, TS_B_ATTPROJ_W,
                         TS_B_ATTPROJ_B, TS_B_LN2_W, TS_B_LN2_B, TS_B_FC_W, TS_B_FC_B,
                         TS_B_FCPROJ_W, TS_B_FCPROJ_B};
}

/* LayerNorm (gpt2) or RMSNorm (llama; no mean, no bias). */
static void norm_forward(const ts_model *m, void *out, float *mean, float *rstd, const void *inp,
                         const float *w, const float *b, int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->rmsnorm_forward(out, rstd, inp, w, N, m->n_embd, m->norm_eps);
    else
        m->k->layernorm_forward(out, mean, rstd, inp, w, b, N, m->n_embd);
}

static void residual_norm_forward(const ts_model *m, void *res, void *out, float *mean,
                                  float *rstd, const void *a, const void *b, const float *w,
                                  const float *bias, int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->residual_rmsnorm_forward(res, out, rstd, a, b, w, N, m->n_embd, m->norm_eps);
    else
        m->k->residual_layernorm_forward(res, out, mean, rstd, a, b, w, bias, N, m->n_embd);
}

/* dinp += (the residual stream's gradient). */
static void norm_backward(const ts_model *m, void *dinp, float *dw, float *db, const void *dout,
                          const void *inp, const float *w, const float *mean, const float *rstd,
                          int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, m->n_embd);
    else
        m->k->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, m->n_embd);
}

/* The MLP's activation: GELU over [N,F], or SwiGLU from [N,2F] (gate|up) to [N,F]. */
static void mlp_act_forward(const ts_model *m, void *out, const void *inp, int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->swiglu_forward(out, inp, N, m->local_ffn);
    else
        m->k->gelu_forward(out, inp, (size_t)N * m->local_ffn);
}

static void mlp_act_backward(const ts_model *m, void *dinp, const void *inp, const void *dout,
                             int N)
{
    if (m->arch == TS_ARCH_LLAMA)
        m->k->swiglu_backward(dinp, inp, dout, N, m->local_ffn);
    else
        m->k->gelu_backward(dinp, inp, dout, (size_t)N * m->local_ffn);
}

/* ---------------------------------------------------------------- forward */

static void embed_forward(const ts_model *m, const ts_acts *a, int l)
{
    const int p0 = m->layers[l].first_param;
    const float *wpe = m->arch == TS_ARCH_LLAMA ? NULL : ts_param_data(m, p0 + 1);
    TS_ASSERT(!m->tp.sp || a->sp_work);
    TS_ASSERT(m->cp.size == 1 || a->cp_work);
    /* Context parallelism: the position embedding's rows at this rank's positions. */
    if (wpe) wpe = ts_cp_positions_table(&m->cp, a->cp_work, wpe, m->n_embd);
    ts_tp_embed_forward(&m->tp, embed_views(m, a, l).out, a->tokens, ts_param_data(m, p0),
                        m->vocab_start, m->local_vocab, wpe, a->B, a->T, m->n_embd, a->sp_work);
}

/* ------------------------------------------------ sub-batches (tp_overlap) */

/* The most sub-batches parallel.tp_overlap takes (config_keys.c). */
#define TS_TP_OVERLAP_MAX 8

/* Sub-batch i of d.S (tensor/tp.h): rows [i N/S, (i+1) N/S) of a block's [N,...]
 * buffers, rows [i NL/S, ...) of its [NL,...] ones, attention's state at its sequences'
 * offset (every backend's is sequence-major). With S = 1, the block's views. */
static block_acts block_sub(const act_dims *d, const block_acts *s, int i)
{
    const size_t n = d->N / d->S * (size_t)i, nl = d->NL / d->S * (size_t)i;
    block_acts v = *s;
    v.ln1 = act_at(d, s->ln1, nl * d->C);
    v.ln1_mean = d->NM ? s->ln1_mean + nl : s->ln1_mean;
    v.ln1_rstd = s->ln1_rstd + nl;
    v.qkv = act_at(d, s->qkv, n * d->QKV);
    v.kvg = d->KVG ? act_at(d, s->kvg, d->KVG / d->S * (size_t)i) : s->kvg;
    v.atty = act_at(d, s->atty, n * d->Cl);
    v.att = (unsigned char *)s->att + d->att_kept / d->S * (size_t)i;
    v.res2 = act_at(d, s->res2, nl * d->C);
    v.ln2 = act_at(d, s->ln2, nl * d->C);
    v.ln2_mean = d->NM ? s->ln2_mean + nl : s->ln2_mean;
    v.ln2_rstd = s->ln2_rstd + nl;
    v.fch = act_at(d, s->fch, n * d->FI);
    v.fch_gelu = act_at(d, s->fch_gelu, n * d->F);
    v.out = act_at(d, s->out, nl * d->C);
    return v;
}

/* Every collective of a sub-batch still in flight makes progress (polled between the
 * sub-batches' kernels: MPI advances non-blocking collectives only inside its calls). */
static void poll_pending(ts_tp_pending *p, int S)
{
    for (int i = 0; i < S; i++) ts_tp_poll(&p[i]);
}

/* Under sequence parallelism, full[N,C] = every rank's rows local[NL,C], sub-batch by
 * sub-batch (tensor/tp.h), blocking; returns full, or local without it. */
static const void *gather_rows(const ts_model *m, const act_dims *d, void *full,
                               const void *local)
{
    if (!d->sp) return local;
    const size_t Ns = d->N / d->S, NLs = d->NL / d->S;
    for (size_t i = 0; i < d->S; i++)
        ts_tp_seq_gather(&m->tp, act_at(d, full, i * Ns * d->C), act_at(d, local, i * NLs * d->C),
                         (int)Ns, (int)d->C, NULL);
    return full;
}

static void block_forward(const ts_model *m, const ts_acts *a, int l, const void *x)
{
    const ts_kernels *k = m->k;
    const ts_tp *tp = &m->tp;
    const act_dims d = model_dims(m, l, a->B, a->T);
    const int T = a->T, C = m->n_embd, Cl = (int)d.Cl, F = (int)d.F;
    const int H = (int)d.H, KV = (int)d.KV, HS = (int)d.HS;
    const int S = (int)d.S, Bs = a->B / S, Ns = Bs * T, NLs = (int)d.NL / S;
    const int p0 = m->layers[l].first_param;
    const block_roles r = roles_of(m);
#define P(i) ((i) < 0 ? NULL : ts_param_data(m, p0 + (i))) /* fp32 master: norms, biases */
#define W(i) ts_param_compute(m, p0 + (i))                  /* the matmuls' compute copy */
    const block_acts s = block_views(m, a, l);
    /* Sequence parallelism: x and the norms hold this rank's NL rows; each norm's output
     * is gathered for its column-parallel linear (gath, the scratch's: a forward leaves
     * nothing there), and each row-parallel sum scatters back into NL rows. */
    void *gath = a->sp_work;
    TS_ASSERT(!d.sp || gath);
    /* tp_overlap: each phase runs on every sub-batch in turn, a sub-batch's collective
     * in flight until the next phase of it (S = 1: every call blocks, as always). */
    ts_tp_pending pend[TS_TP_OVERLAP_MAX] = {0};
    TS_ASSERT(S <= TS_TP_OVERLAP_MAX);
#define PD(i) (S > 1 ? &pend[i] : NULL)
#define XI(i) act_at(&d, x, (size_t)(i) * NLs * C)
#define GI(i) (gath ? act_at(&d, gath, (size_t)(i) * Ns * C) : NULL)

    /* The first norm; under sequence parallelism its rows gathered. */
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        norm_forward(m, v.ln1, v.ln1_mean, v.ln1_rstd, XI(i), P(r.norm1_w), P(r.norm1_b), NLs);
        ts_tp_seq_gather(tp, GI(i), v.ln1, Ns, C, PD(i));
    }
    /* Attention, its output projection's sum in flight while the next sub-batch runs.
     * Selective recompute keeps no attention state: the forward writes it to the work
     * area and the backward rebuilds it. */
    TS_ASSERT(!d.selective || a->att_work);
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        const void *ln1 = d.sp ? GI(i) : v.ln1;
        ts_tp_col_forward(tp, v.qkv, ln1, W(r.qkv_w), P(r.qkv_b), Ns, C, (int)d.QKV);
        if (m->rope_cos) k->rope_forward(v.qkv, m->rope_cos, m->rope_sin, Bs, T, H, KV, HS);
        ts_cp_attention_forward(&m->cp, v.atty, d.selective ? a->att_work : v.att, v.kvg,
                                a->cp_work, v.qkv, Bs, T, H, KV, HS);
        ts_tp_row_forward(tp, v.res2, v.atty, W(r.proj_w), P(r.proj_b), Ns, Cl, C, GI(i), PD(i));
        poll_pending(pend, S);
    }
    /* res2 = x + attn(...) and the second norm of it in one pass over the rows. */
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        residual_norm_forward(m, v.res2, v.ln2, v.ln2_mean, v.ln2_rstd, v.res2, XI(i),
                              P(r.norm2_w), P(r.norm2_b), NLs);
        ts_tp_seq_gather(tp, GI(i), v.ln2, Ns, C, PD(i));
    }
    /* The MLP, its output projection's sum in flight. */
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        const void *ln2 = d.sp ? GI(i) : v.ln2;
        ts_tp_col_forward(tp, v.fch, ln2, W(r.fc_w), P(r.fc_b), Ns, C, (int)d.FI);
        mlp_act_forward(m, v.fch_gelu, v.fch, Ns);
        ts_tp_row_forward(tp, v.out, v.fch_gelu, W(r.fcproj_w), P(r.fcproj_b), Ns, F, C, GI(i),
                          PD(i));
        poll_pending(pend, S);
    }
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        k->residual_forward(v.out, v.out, v.res2, (size_t)NLs * C);
    }
#undef P
#undef W
#undef PD
#undef XI
#undef GI
}

/* The head's norm parameters (weight; bias for gpt2's LayerNorm, NULL for llama). */
static const float *head_norm_w(const ts_model *m, int l)
{
    return ts_param_data(m, m->layers[l].first_param);
}
static const float *head_norm_b(const ts_model *m, int l)
{
    return m->arch == TS_ARCH_LLAMA ? NULL : ts_param_data(m, m->layers[l].first_param + 1);
}

static void head_forward(const ts_model *m, const ts_acts *a, int l, const void *x, float dloss,
                         double *loss_acc)
{
    const int N = a->B * a->T, C = m->n_embd, NL = ts_tp_rows(&m->tp, N);
    head_acts h = head_views(m, a, l);

    norm_forward(m, h.lnf, h.lnf_mean, h.lnf_rstd, x, head_norm_w(m, l), head_norm_b(m, l), NL);
    /* The LM head (the tied token embedding, or lm_head): logits = lnf @ W^T, this
     * rank's vocabulary columns, on every row (gathered under sequence parallelism);
     * then the loss, leaving the softmax's gradient in place of the logits. */
    TS_ASSERT(!m->tp.sp || a->sp_work);
    const act_dims d = model_dims(m, l, a->B, a->T);
    const void *lnf = gather_rows(m, &d, a->sp_work, h.lnf);
    ts_tp_col_forward(&m->tp, h.logits, lnf, ts_param_compute(m, m->head_wte_param), NULL, N, C,
                      m->local_vocab);
    ts_tp_cross_entropy(&m->tp, h.losses, h.logits, h.xent_stats, a->targets, m->vocab_start,
                        m->local_vocab, N, dloss);
    if (loss_acc) m->k->sum_into(loss_acc, h.losses, (size_t)N);
}

static void between_layers(const ts_model *m)
{
    for (int i = 0; i < TS_MODEL_BETWEEN_LAYERS_MAX && m->between_layers[i].fn; i++)
        m->between_layers[i].fn(m->between_layers[i].ctx);
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

/* The head without the loss: the final norm and the LM head on each sequence's last
 * position only (a norm's row needs no other row), logits [B, V] in activation
 * elements. The rest of the head's buffers (losses, the other positions) are left
 * untouched. */
static void head_forward_logits(const ts_model *m, const ts_acts *a, int l, const void *x,
                                void *logits)
{
    const act_dims d = model_dims(m, l, a->B, a->T);
    const int C = m->n_embd, V = m->local_vocab;
    head_acts h = head_views(m, a, l);
    for (int b = 0; b < a->B; b++) {
        const size_t row = (size_t)b * a->T + (size_t)(a->T - 1);
        norm_forward(m, act_at(&d, h.lnf, row * C), h.lnf_mean ? h.lnf_mean + row : NULL,
                     h.lnf_rstd + row, act_at(&d, x, row * C), head_norm_w(m, l),
                     head_norm_b(m, l), 1);
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
    float *dwpe = m->arch == TS_ARCH_LLAMA ? NULL : ts_param_grad(m, p0 + 1);
    if (m->cp.size == 1 || !dwpe) {
        ts_tp_embed_backward(&m->tp, ts_param_grad(m, p0), dwpe, dout, a->tokens,
                             m->vocab_start, m->local_vocab, a->B, a->T, m->n_embd);
        return;
    }
    /* Context parallelism: each chunk of each sequence adds into the position
     * embedding's rows at its global positions (tensor/cp.h). */
    const int c = a->T / 2, C = m->n_embd;
    const size_t eb = ts_dtype_bytes(m->k->act_dtype);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < 2; h++) {
            const size_t row0 = (size_t)b * a->T + (size_t)h * c;
            ts_tp_embed_backward(&m->tp, ts_param_grad(m, p0),
                                 dwpe + (size_t)ts_cp_chunk(&m->cp, h) * c * C,
                                 (const unsigned char *)dout + row0 * C * eb, a->tokens + row0,
                                 m->vocab_start, m->local_vocab, 1, c, C);
        }
}

/* The backward of a block. With `stash` (the zero-bubble input-gradient pass) the four
 * matmul weight gradients are not computed: their output gradients are kept in the
 * stash for block_backward_weight. The stash and the scratch hold activation
 * elements. */
enum { STASH_D_OUT, STASH_D_FCH, STASH_D_RES2, STASH_D_QKV };
static size_t stash_elems(const ts_model *m, int N)
{
    const act_dims d = model_dims(m, -1, N, 1); /* only the N rows matter here */
    return d.N * (2 * d.C + d.FI + d.QKV);
}
static void *stash_part(const ts_model *m, void *st, int N, int part)
{
    const act_dims d = model_dims(m, -1, N, 1); /* only the N rows matter here */
    const size_t NC = d.N * d.C, NF = d.N * d.FI;
    switch (part) {
    case STASH_D_OUT: return st;
    case STASH_D_FCH: return act_at(&d, st, NC);
    case STASH_D_RES2: return act_at(&d, st, NC + NF);
    default: return act_at(&d, st, 2 * NC + NF);
    }
}

/* The scratch's sequence-parallel buffers: the gathered rows [N,C] and this rank's rows
 * [NL,C] of an input gradient (NULL without sequence parallelism). */
static void *scratch_gather(const act_dims *d, const ts_scratch *sc)
{
    return d->sp ? (unsigned char *)sc->mem + scratch_gather_offset(*d) : NULL;
}
static void *scratch_local(const act_dims *d, const ts_scratch *sc)
{
    return d->sp ? (unsigned char *)sc->mem + scratch_local_offset(*d) : NULL;
}

/* The gradient dx of a row-parallel linear's output as the [N,C] its backward reads, for
 * N rows (a sub-batch's, or all): under sequence parallelism every rank's rows gathered
 * (into `keep` when given, else gath; in flight with a pending); otherwise dx itself,
 * copied into `keep` when given (the zero-bubble stash, which the weight pass reads after
 * dx has moved on). */
static const void *linear_output_grad(const ts_model *m, const act_dims *d, void *keep,
                                      void *gath, const void *dx, int N, ts_tp_pending *p)
{
    const int C = (int)d->C;
    if (d->sp) return ts_tp_seq_gather(&m->tp, keep ? keep : gath, dx, N, C, p);
    if (!keep) return dx;
    m->k->memcpy_d2d(keep, dx, (size_t)N * d->C * d->ab);
    return keep;
}

/* Rows [i Ns, ...) of a stash part of `width` columns (sub-batch i's). */
static void *stash_rows(const ts_model *m, const act_dims *d, void *stash, int part, int i,
                        size_t width)
{
    return act_at(d, stash_part(m, stash, (int)d->N, part), (size_t)i * (d->N / d->S) * width);
}

/* A block's backward, as its forward, in phases over the sub-batches (one under
 * tp_overlap = 1), each sub-batch's collective in flight until its next phase. */
static void block_backward(const ts_model *m, const ts_acts *a, int l, const void *x, void *dx,
                           ts_scratch *sc, void *stash)
{
    const ts_kernels *k = m->k;
    const ts_tp *tp = &m->tp;
    const act_dims d = model_dims(m, l, a->B, a->T);
    const int T = a->T, C = m->n_embd, Cl = (int)d.Cl, F = (int)d.F;
    const int H = (int)d.H, KV = (int)d.KV, HS = (int)d.HS;
    const int S = (int)d.S, Bs = a->B / S, Ns = Bs * T, NLs = (int)d.NL / S;
    const int p0 = m->layers[l].first_param;
    const block_roles r = roles_of(m);
#define P(i) ((i) < 0 ? NULL : ts_param_data(m, p0 + (i)))
#define W(i) ts_param_compute(m, p0 + (i))
#define G(i) ((i) < 0 ? NULL : ts_param_grad(m, p0 + (i)))
#define GW(i) (stash ? NULL : G(i)) /* matmul weight gradients: deferred with a stash */
#define KEEP(part, i, width) (stash ? stash_rows(m, &d, stash, part, i, width) : NULL)
    const block_acts s = block_views(m, a, l);
    void *wide = sc->mem;                                  /* [N,max(FI,QKV)] */
    void *narrow = act_at(&d, sc->mem, d.N * scratch_wide(d)); /* [N,max(C,F)] */
    void *att_scratch = (unsigned char *)sc->mem + scratch_att_offset(d);
    /* Sequence parallelism: the gathered rows (a gradient, then a norm's output again)
     * and the norms' input gradient in this rank's rows; without it the norms read the
     * column-parallel backward's all-reduced bufc. */
    void *gath = scratch_gather(&d, sc), *loc = scratch_local(&d, sc);
    void *cp_work = ts_scratch_context_work(sc, m, a->B, a->T); /* NULL without cp */
    ts_tp_pending pend[TS_TP_OVERLAP_MAX] = {0};
    const void *rows_in[TS_TP_OVERLAP_MAX]; /* each sub-batch's gathered (or own) input */
    TS_ASSERT(S <= TS_TP_OVERLAP_MAX);
#define PD(i) (S > 1 ? &pend[i] : NULL)
#define XI(i) act_at(&d, x, (size_t)(i) * NLs * C)
#define DXI(i) act_at(&d, dx, (size_t)(i) * NLs * C)
#define GI(i) (gath ? act_at(&d, gath, (size_t)(i) * Ns * C) : NULL)
#define BUFC(i) act_at(&d, narrow, (size_t)(i) * Ns * scratch_narrow(d)) /* [Ns,C] */
#define DNORM(i) (d.sp ? act_at(&d, loc, (size_t)(i) * NLs * C) : BUFC(i)) /* [NLs,C] */
    /* The MLP projection's output gradient [Ns,FI], later the qkv gradient [Ns,QKV]; the
     * activation's output gradient [Ns,F]: GELU's backward runs in place in dfch,
     * SwiGLU's reads it from bufc while writing dfch. */
#define WIDE(i) act_at(&d, wide, (size_t)(i) * Ns * scratch_wide(d))
#define DFCH(i) (stash ? KEEP(STASH_D_FCH, i, d.FI) : WIDE(i))
#define DQKV(i) (stash ? KEEP(STASH_D_QKV, i, d.QKV) : WIDE(i))
#define DACT(i) (m->arch == TS_ARCH_LLAMA ? BUFC(i) : DFCH(i))

    /* MLP: dx is the gradient of the block output (the same on every tp rank, or this
     * rank's rows of it). */
    for (int i = 0; i < S; i++)
        rows_in[i] =
            linear_output_grad(m, &d, KEEP(STASH_D_OUT, i, d.C), GI(i), DXI(i), Ns, PD(i));
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        ts_tp_row_backward(tp, DACT(i), GW(r.fcproj_w), G(r.fcproj_b), rows_in[i], v.fch_gelu,
                           W(r.fcproj_w), Ns, F, C);
        mlp_act_backward(m, DFCH(i), v.fch, DACT(i), Ns);
        rows_in[i] = ts_tp_seq_gather(tp, GI(i), v.ln2, Ns, C, PD(i)); /* again: NL rows kept */
        poll_pending(pend, S);
    }
    for (int i = 0; i < S; i++) {
        ts_tp_finish(tp, PD(i));
        ts_tp_col_backward(tp, DNORM(i), GW(r.fc_w), G(r.fc_b), DFCH(i), rows_in[i], W(r.fc_w), Ns,
                           C, (int)d.FI, BUFC(i), PD(i));
        poll_pending(pend, S);
    }
    /* The second norm; then dx is the gradient of res2. */
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        norm_backward(m, DXI(i), G(r.norm2_w), G(r.norm2_b), DNORM(i), v.res2, P(r.norm2_w),
                      v.ln2_mean, v.ln2_rstd, NLs);
        rows_in[i] =
            linear_output_grad(m, &d, KEEP(STASH_D_RES2, i, d.C), GI(i), DXI(i), Ns, PD(i));
    }
    /* Attention. */
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        void *datty = BUFC(i); /* [Ns,Cl] */
        ts_tp_row_backward(tp, datty, GW(r.proj_w), G(r.proj_b), rows_in[i], v.atty, W(r.proj_w),
                           Ns, Cl, C);
        const void *att = v.att;
        if (d.selective) {
            TS_ASSERT(d.rebuild);
            /* Selective recompute: the probabilities again, from the q, k, v the block
             * kept (the same kernel on the same input: the values the forward had). The
             * output goes to scratch too; atty, the projection's input, was kept. */
            void *rebuilt = (unsigned char *)sc->mem + scratch_rebuilt_offset(d);
            void *out = (unsigned char *)sc->mem + scratch_rebuilt_out_offset(d);
            ts_cp_attention_recompute(&m->cp, out, rebuilt, v.kvg, v.qkv, Bs, T, H, KV, HS);
            att = rebuilt;
        }
        ts_cp_attention_backward(&m->cp, DQKV(i), att_scratch, cp_work, datty, v.qkv, v.kvg, att,
                                 Bs, T, H, KV, HS);
        /* The gradient of q and k before their rotation (RoPE is linear). */
        if (m->rope_cos) k->rope_backward(DQKV(i), m->rope_cos, m->rope_sin, Bs, T, H, KV, HS);
        rows_in[i] = ts_tp_seq_gather(tp, GI(i), v.ln1, Ns, C, PD(i));
        poll_pending(pend, S);
    }
    for (int i = 0; i < S; i++) {
        ts_tp_finish(tp, PD(i));
        ts_tp_col_backward(tp, DNORM(i), GW(r.qkv_w), G(r.qkv_b), DQKV(i), rows_in[i],
                           W(r.qkv_w), Ns, C, (int)d.QKV, BUFC(i), PD(i));
        poll_pending(pend, S);
    }
    for (int i = 0; i < S; i++) {
        const block_acts v = block_sub(&d, &s, i);
        ts_tp_finish(tp, PD(i));
        norm_backward(m, DXI(i), G(r.norm1_w), G(r.norm1_b), DNORM(i), XI(i), P(r.norm1_w),
                      v.ln1_mean, v.ln1_rstd, NLs);
    }
#undef P
#undef W
#undef G
#undef GW
#undef KEEP
#undef PD
#undef XI
#undef DXI
#undef GI
#undef BUFC
#undef DNORM
#undef WIDE
#undef DFCH
#undef DQKV
#undef DACT
}

/* The four matmul weight gradients from the stash; under sequence parallelism the norms'
 * outputs are gathered once more (into the scratch). */
static void block_backward_weight(const ts_model *m, const ts_acts *a, int l, void *stash,
                                  ts_scratch *sc)
{
    const ts_tp *tp = &m->tp;
    const act_dims d = model_dims(m, l, a->B, a->T);
    const int C = m->n_embd, N = a->B * a->T, Cl = (int)d.Cl, F = (int)d.F;
    const int p0 = m->layers[l].first_param;
    const block_roles r = roles_of(m);
#define G(i) ts_param_grad(m, p0 + (i))
    block_acts s = block_views(m, a, l);
    void *gath = scratch_gather(&d, sc);
    ts_tp_row_backward(tp, NULL, G(r.fcproj_w), NULL, stash_part(m, stash, N, STASH_D_OUT),
                       s.fch_gelu, NULL, N, F, C);
    ts_tp_col_backward(tp, NULL, G(r.fc_w), NULL, stash_part(m, stash, N, STASH_D_FCH),
                       gather_rows(m, &d, gath, s.ln2), NULL, N, C, (int)d.FI, NULL, NULL);
    ts_tp_row_backward(tp, NULL, G(r.proj_w), NULL, stash_part(m, stash, N, STASH_D_RES2),
                       s.atty, NULL, N, Cl, C);
    ts_tp_col_backward(tp, NULL, G(r.qkv_w), NULL, stash_part(m, stash, N, STASH_D_QKV),
                       gather_rows(m, &d, gath, s.ln1), NULL, N, C, (int)d.QKV, NULL, NULL);
#undef G
}

/* The head's backward: the forward left dlogits in place of the logits. With
 * `defer_weight`, the LM head's weight gradient waits for the W pass. */
static void head_backward(const ts_model *m, const ts_acts *a, int l, const void *x, void *dx,
                          ts_scratch *sc, bool defer_weight)
{
    const act_dims d = model_dims(m, l, a->B, a->T);
    const int C = m->n_embd, S = (int)d.S, Ns = (int)(d.N / d.S), NLs = (int)(d.NL / d.S);
    const int p0 = m->layers[l].first_param;
    head_acts h = head_views(m, a, l);
    /* Under sequence parallelism: lnf gathered again, the partial input gradients [N,C]
     * in the scratch's second buffer, this rank's rows of their sum in its own, sub-batch
     * by sub-batch (this rank's rows are its part of each: tensor/tp.h). */
    void *dlnf = d.sp ? scratch_local(&d, sc) : sc->mem;
    void *work = act_at(&d, sc->mem, d.N * scratch_wide(d));
    const void *lnf = gather_rows(m, &d, scratch_gather(&d, sc), h.lnf);
    const int parts = d.sp ? S : 1, rows = d.sp ? Ns : (int)d.N;
    for (int i = 0; i < parts; i++)
        ts_tp_col_backward(&m->tp, act_at(&d, dlnf, (size_t)i * NLs * C),
                           defer_weight ? NULL : ts_param_grad(m, m->head_wte_param), NULL,
                           act_at(&d, h.logits, (size_t)i * rows * d.Vl),
                           act_at(&d, lnf, (size_t)i * rows * C),
                           ts_param_compute(m, m->head_wte_param), rows, C, m->local_vocab,
                           act_at(&d, work, (size_t)i * rows * C), NULL);
    m->k->memset_zero(dx, d.NL * d.C * d.ab);
    norm_backward(m, dx, ts_param_grad(m, p0),
                  m->arch == TS_ARCH_LLAMA ? NULL : ts_param_grad(m, p0 + 1), dlnf, x,
                  head_norm_w(m, l), h.lnf_mean, h.lnf_rstd, (int)d.NL);
}

void ts_model_backward(const ts_model *m, ts_acts *a, void *dx, ts_scratch *s,
                       ts_layer_done_fn layer_done, void *ctx)
{
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED: {
            const act_dims d = model_dims(m, l, a->B, a->T);
            embed_backward(m, a, l, gather_rows(m, &d, scratch_gather(&d, s), dx));
            break;
        }
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

/* Sequence parallelism: each rank's norm weight gradients hold its rows' part; once the
 * step's last backward has left layer l they are summed over the tp group (Megatron's
 * finalize-time all-reduce of the norms, here per layer so the data-parallel buckets
 * that follow see final values). The other replicated gradients (row-parallel biases,
 * wpe) came from gathered full gradients: already the same on every rank. */
void ts_model_sum_sequence_grads(const ts_model *m, int l)
{
    if (!m->tp.sp) return;
    const ts_layer *L = &m->layers[l];
    const size_t C = (size_t)m->n_embd;
    const int p0 = L->first_param;
    if (L->kind == TS_LAYER_HEAD) {
        ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p0), C);
        if (m->arch != TS_ARCH_LLAMA) ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p0 + 1), C);
    } else if (L->kind == TS_LAYER_BLOCK) {
        const block_roles r = roles_of(m);
        const int norms[4] = {r.norm1_w, r.norm1_b, r.norm2_w, r.norm2_b};
        for (int i = 0; i < 4; i++)
            if (norms[i] >= 0) ts_tp_seq_sum_grad(&m->tp, ts_param_grad(m, p0 + norms[i]), C);
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
    const act_dims d = model_dims(m, -1, a->B, a->T);
    const size_t NC = (size_t)a->B * a->T * m->n_embd;
    TS_ASSERT(a->wstash == NULL);
    size_t embed_at = stash_offset(m, a, a->l1);
    a->wstash = m->k->dev_alloc(ts_acts_stash_bytes(m, a->l0, a->l1, a->B, a->T));
    TS_ASSERT(embed_at + (a->l0 == 0 ? NC : 0) == stash_total_elems(m, a->l0, a->l1, a->B, a->T));
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED: /* no input gradient: keep its output gradient for W */
            if (d.sp)
                gather_rows(m, &d, act_at(&d, a->wstash, embed_at), dx);
            else
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

void ts_model_backward_weight(const ts_model *m, ts_acts *a, ts_scratch *s)
{
    const act_dims d = model_dims(m, -1, a->B, a->T);
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        switch (m->layers[l].kind) {
        case TS_LAYER_EMBED:
            embed_backward(m, a, l, act_at(&d, a->wstash, stash_offset(m, a, a->l1)));
            break;
        case TS_LAYER_BLOCK:
            block_backward_weight(m, a, l, act_at(&d, a->wstash, stash_offset(m, a, l)), s);
            break;
        case TS_LAYER_HEAD: {
            head_acts h = head_views(m, a, l);
            const int N = a->B * a->T;
            const void *lnf = gather_rows(m, &d, scratch_gather(&d, s), h.lnf);
            ts_tp_col_backward(&m->tp, NULL, ts_param_grad(m, m->head_wte_param), NULL, h.logits,
                               lnf, NULL, N, m->n_embd, m->local_vocab, NULL, NULL);
            break;
        }
        }
        between_layers(m);
    }
    m->k->dev_free(a->wstash);
    a->wstash = NULL;
}
