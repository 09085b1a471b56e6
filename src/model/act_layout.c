/* The activation layout (act_layout.h): sizes from the model's shape, the views of each
 * layer's saved buffers, the backward scratch's regions and the zero-bubble stash. */
#include "model/act_layout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/block.h"
#include "model/mla_cp.h"
#include "tensor/cp.h"
#include "tensor/tp.h"

/* The shape a model (or a config, for estimates) gives the layout. */
typedef struct {
    bool llama, selective, rebuild, sp, qk_norm;
    int mla_q, mla_kv, mla_nope, mla_rope, mla_v; /* MLA's (mla_kv 0: none) */
    int n_embd, n_head, n_kv_head, ffn, vocab;
    int head_dim; /* channels per head */
    int moe_experts, moe_top_k, moe_ffn, moe_shared; /* an MoE block's (0: dense) */
    int moe_ep, moe_etp; /* expert (tensor) parallelism (1: none); moe_ffn is F / moe_etp */
    double moe_capacity; /* model.moe_capacity (0: dropless) */
    int sub; /* tp_overlap's sub-batches (0 or 1: none) */
    ts_cp cp; /* context parallelism (size 1: none; T is then the sequence) */
} act_shape;

/* The rows one rank sends to the experts of one ep rank holding `local` of them, at most
 * (act_dims MR): each of its NL tokens at most min(K, local) of its K assignments; under a
 * capacity (moe.c: each sequence's at most `cap` per expert, decided on whole sequences
 * before the exchange) also at most cap per expert and sequence its rows touch: its B
 * sequences, or under sequence parallelism the fewer a contiguous NL of the B*T rows cut. */
static size_t expert_rows_from_rank(act_shape sh, size_t NL, int B, int T, size_t local)
{
    const size_t K = (size_t)sh.moe_top_k;
    size_t rows = NL * (K < local ? K : local);
    if (sh.moe_capacity > 0) {
        const int T_seq = sh.cp.size > 1 ? sh.cp.T : T; /* the whole sequence's */
        size_t seqs = (size_t)B;
        if (sh.sp) {
            const size_t cut = (NL + (size_t)T - 1) / (size_t)T + 1;
            if (cut < seqs) seqs = cut;
        }
        const size_t capped = seqs * local *
                              (size_t)ts_moe_capacity_rows(T_seq, sh.moe_top_k, sh.moe_experts,
                                                           sh.moe_capacity);
        if (capped < rows) rows = capped;
    }
    return rows;
}

int ts_moe_capacity_rows(int T, int K, int E, double factor)
{
    const double c = ceil((double)T * K / E * factor);
    return c > (double)T ? T : (int)c;
}

static act_dims dims_of(const ts_kernels *k, act_shape sh, int tp, int tp_rank, int B, int T)
{
    int64_t v0, nv;
    ts_shard_range(sh.vocab, tp, tp_rank, &v0, &nv);
    const int H = sh.n_head / tp, HS = sh.head_dim;
    const int KV = tp > sh.n_kv_head ? 1 : sh.n_kv_head / tp;
    const size_t F = (size_t)sh.ffn / tp;
    const size_t NL = sh.sp ? (size_t)B * T / (size_t)tp : (size_t)B * T;
    act_dims d = {.B = (size_t)B, .T = (size_t)T, .N = (size_t)B * T, .C = (size_t)sh.n_embd,
                  .Cl = (size_t)H * HS, .H = (size_t)H, .KV = (size_t)KV, .HS = (size_t)HS,
                  .QKV = (size_t)(H + 2 * KV) * HS, .F = F, .FI = sh.llama ? 2 * F : F,
                  .NM = sh.llama ? 0 : NL, .Vl = (size_t)nv, .NL = NL,
                  .att = k->attention_saved_bytes(B, T, ts_att_heads_gqa(H, KV, HS)),
                  .att_scratch = k->attention_scratch_bytes(B, T, ts_att_heads_gqa(H, KV, HS)),
                  .ab = ts_dtype_bytes(k->act_dtype), .llama = sh.llama,
                  .selective = sh.selective, .rebuild = sh.rebuild, .sp = sh.sp,
                  .S = sh.sub > 1 ? (size_t)sh.sub : 1};
    d.DN = sh.moe_experts > 0 ? 0 : 1;
    d.ME = (size_t)sh.moe_experts;
    d.MK = sh.moe_experts > 0 ? (size_t)sh.moe_top_k : 0;
    d.MF = sh.moe_experts > 0 ? (size_t)sh.moe_ffn : 0;
    d.MS = sh.moe_experts > 0 ? (size_t)sh.moe_shared : 0;
    if (sh.moe_experts > 0) { /* the worst case: act_dims MR */
        const size_t local = (size_t)(sh.moe_experts / sh.moe_ep);
        d.MR = (size_t)sh.moe_ep * expert_rows_from_rank(sh, d.NL, B, T, local);
        if (sh.moe_ep > 1) d.MX = d.MR;
    }
    if (sh.moe_experts > 0 && sh.moe_etp > 1) /* the rows of the whole etp group */
        d.MR = d.MX = (size_t)sh.moe_etp * d.MR;
    if (sh.qk_norm) {
        d.QKR = (size_t)(H + KV);
        d.QKN = d.QKR * (size_t)HS;
    }
    d.QKVK = d.QKV;
    if (sh.mla_kv > 0) {
        const size_t h = (size_t)H, hs = (size_t)(sh.mla_nope + sh.mla_rope);
        d.mla = true;
        d.HS = hs;
        d.KV = h;
        d.HSV = (size_t)sh.mla_v;
        d.Cl = h * d.HSV;
        d.QK = h * hs;
        d.QKV = h * (2 * hs + d.HSV);
        d.RQ = (size_t)sh.mla_q;
        d.RKV = (size_t)sh.mla_kv;
        d.RR = (size_t)sh.mla_rope;
        d.QA = d.RQ > 0 ? d.RQ : d.QK;
        d.LA = d.QA + d.RKV + d.RR;
        d.KVB = h * (size_t)(sh.mla_nope + sh.mla_v);
        d.QKVK = sh.selective ? 0 : d.QKV;
        d.QKQ = sh.selective ? d.QK : 0;
        ts_att_heads hd = ts_att_heads_gqa(H, H, (int)hs);
        hd.HSV = sh.mla_v;
        d.att = k->attention_saved_bytes(B, T, hd);
        d.att_scratch = k->attention_scratch_bytes(B, T, hd);
    }
    if (sh.cp.size > 1 && T > 1) {
        /* T is this rank's positions of each sequence (tensor/cp.h); its attention saves
         * the two chunks' prefix state and keeps the gathered K/V. (T = 1: a count of
         * rows only, the zero-bubble stash's.) */
        ts_cp cp = sh.cp;
        cp.k = k;
        TS_ASSERT(T == ts_cp_local_len(&cp));
        ts_att_heads hd = ts_att_heads_gqa(H, KV, HS);
        if (d.mla) hd = ts_att_heads_gqa(H, H, (int)d.HS), hd.HSV = (int)d.HSV;
        d.att = ts_cp_attention_saved_bytes(&cp, B, hd);
        d.att_scratch = ts_cp_attention_scratch_bytes(&cp, B, hd);
        d.KVG = ts_cp_kv_elems(&cp, B, hd);
        d.cpw = ts_cp_work_bytes(&cp, B, hd, sh.n_embd, d.ab);
        if (d.mla) { /* MLA keeps the gathered latent instead, and expands it in the
                        work (mla_cp.h); the position table's rows fit there too */
            d.KVG = ts_mla_cp_latent_elems(&cp, &d, B);
            const size_t pos = (size_t)T * (size_t)sh.n_embd * sizeof(float);
            d.cpw = ts_mla_cp_work_bytes(&cp, &d, B);
            if (pos > d.cpw) d.cpw = pos;
        }
        d.cp = true;
    }
    d.att_kept = sh.selective ? 0 : d.att;
    return d;
}

act_dims ts_act_dims(const ts_model *m, int l, int B, int T)
{
    const bool selective = l >= 0 && m->layers[l].selective;
    /* A dense block has no MoE buffers; l < 0 (the scratch's) has the model's. */
    const bool moe = m->moe_experts > 0 && (l < 0 || m->layers[l].moe);
    const act_shape sh = {m->arch == TS_ARCH_LLAMA, selective, m->selective_recompute, m->tp.sp,
                          m->qk_norm, m->mla_q_rank, m->mla_kv_rank, m->mla_nope,
                          m->mla_kv_rank ? m->rope_dim : 0, m->mla_v_dim, m->n_embd, m->n_head, m->n_kv_head, m->ffn_hidden,
                          m->vocab_size, m->head_dim, moe ? m->moe_experts : 0, m->moe_top_k,
                          m->moe_local_ffn, m->moe_shared_ffn, m->moe_ep > 1 ? m->moe_ep : 1,
                          m->moe_etp > 1 ? m->moe_etp : 1, m->moe_capacity, m->tp.sub, m->cp};
    act_dims d = dims_of(m->k, sh, m->tp.size, m->tp.rank, B, T);
    if (l < 0) d.DN = 1; /* the scratch and stash keep the dense MLP's sizes */
    return d;
}

/* Each buffer starts on a 64-byte boundary (a bf16 buffer may hold an odd count). */
#define ACT_ALIGN(bytes) (((bytes) + 63) / 64 * 64)
#define ACT_ELEM_A (d.ab)
#define ACT_ELEM_F sizeof(float)
#define ACT_ELEM_BYTES ((size_t)1)
#define ACT_BYTES(name, count, type) +ACT_ALIGN((count) * ACT_ELEM_##type)
#define ACT_VIEW(name, count, type) v.name = (ACT_CTYPE_##type *)p, p += ACT_ALIGN((count) * ACT_ELEM_##type);

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
    /* A dense block's (the partition's cost model sizes an MoE block so: MoE refuses pp). */
    const act_shape sh = {ts_model_arch(cfg) == TS_ARCH_LLAMA, false, false, false, cfg->qk_norm,
                          cfg->q_lora_rank, cfg->kv_lora_rank, cfg->qk_nope_head_dim,
                          cfg->qk_rope_head_dim, cfg->v_head_dim, cfg->n_embd, cfg->n_head, ts_model_kv_heads(cfg), ts_model_ffn(cfg),
                          cfg->vocab_size, ts_model_head_dim(cfg), 0, 0, 0, 0, 1, 1, 0.0, 1, {.size = 1}};
    return kind_bytes(kind, dims_of(k, sh, tp, tp_rank, B, T));
}

/* An MTP module's entry l >= n_layers follows the head's in layer_off (ts_acts_init). */
static unsigned char *layer_mem(const ts_acts *a, int l)
{
    return a->mem + a->layer_off[l - a->l0];
}

mtp_acts ts_mtp_views(const ts_model *m, const ts_acts *a, int l)
{
    TS_ASSERT(l >= m->n_layers && a->l1 == m->n_layers);
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    unsigned char *p = layer_mem(a, l) + kind_bytes(TS_LAYER_BLOCK, d);
    mtp_acts v;
    MTP_ACTS(ACT_VIEW)
    (void)p;
    return v;
}

block_acts ts_block_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    block_acts v;
    BLOCK_ACTS(ACT_VIEW)
    return v;
}

head_acts ts_head_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    head_acts v;
    HEAD_ACTS(ACT_VIEW)
    return v;
}

embed_acts ts_embed_views(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = ts_act_dims(m, l, a->B, a->T);
    unsigned char *p = layer_mem(a, l);
    embed_acts v;
    EMBED_ACTS(ACT_VIEW)
    (void)p;
    return v;
}

block_acts ts_block_sub_views(const act_dims *d, const block_acts *s, int i)
{
    const size_t n = d->N / d->S * (size_t)i, nl = d->NL / d->S * (size_t)i;
    block_acts v = *s;
    v.ln1 = act_at(d, s->ln1, nl * d->C);
    v.ln1_mean = d->NM ? s->ln1_mean + nl : s->ln1_mean;
    v.ln1_rstd = s->ln1_rstd + nl;
    v.mla_cq_pre = act_at(d, s->mla_cq_pre, n * d->RQ);
    v.mla_cq = act_at(d, s->mla_cq, n * d->RQ);
    v.mla_cq_rstd = d->RQ ? s->mla_cq_rstd + n : s->mla_cq_rstd;
    v.mla_ckv_pre = act_at(d, s->mla_ckv_pre, n * d->RKV);
    v.mla_ckv = act_at(d, s->mla_ckv, n * d->RKV);
    v.mla_ckv_rstd = d->RKV ? s->mla_ckv_rstd + n : s->mla_ckv_rstd;
    v.mla_kpe = act_at(d, s->mla_kpe, n * d->RR);
    v.mla_q = act_at(d, s->mla_q, n * d->QKQ);
    v.qkv = act_at(d, s->qkv, n * d->QKVK);
    v.qk_pre = act_at(d, s->qk_pre, n * d->QKN);
    v.qk_rstd = s->qk_rstd + n * d->QKR;
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

static size_t layer_bytes(const ts_model *m, int l, int B, int T)
{
    const act_dims d = ts_act_dims(m, l, B, T);
    if (l >= m->n_layers) return kind_bytes(TS_LAYER_BLOCK, d) + (0 MTP_ACTS(ACT_BYTES));
    return kind_bytes(m->layers[l].kind, d);
}

/* The entries a's range holds: [l0, l1), and the MTP modules' after the head. */
static int range_end(const ts_model *m, int l1)
{
    return l1 == m->n_layers ? l1 + m->mtp_layers : l1;
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
    const int end = range_end(m, l1);
    if (end > l1) /* multi-token prediction's ids (ts_acts_set_mtp_ids) */
    {
        const size_t bytes = (size_t)2 * m->mtp_layers * B * T * sizeof(int);
        a->mtp_ids = m->k->dev_alloc(bytes);
        m->k->memset_zero(a->mtp_ids, bytes); /* valid ids until a batch sets them */
        ts_mtp_acts_init(m, a);
    }
    a->layer_off = ts_calloc((size_t)(end - l0), sizeof(size_t));
    size_t total = 0;
    for (int l = l0; l < end; l++) {
        a->layer_off[l - l0] = total;
        total += layer_bytes(m, l, B, T);
    }
    a->bytes = total;
    a->mem = m->k->dev_alloc(total);
    ts_acts_documents_init(m, a);
}

size_t ts_acts_bytes(const ts_model *m, int l0, int l1, int B, int T)
{
    size_t total = 0;
    for (int l = l0; l < range_end(m, l1); l++) total += layer_bytes(m, l, B, T);
    /* Packed documents' per-micro-batch state (model/documents.c). */
    return total + ts_acts_documents_bytes(m, l0, l1, B, T);
}

void ts_acts_free(ts_acts *a)
{
    if (a->k) {
        a->k->dev_free(a->wstash);
        a->k->dev_free(a->tokens);
        a->k->dev_free(a->targets);
        a->k->dev_free(a->mtp_ids);
        a->k->dev_free(a->mem);
    }
    ts_acts_documents_free(a);
    free(a->layer_off);
    free(a->mtp_host);
    free(a->mtp_runs);
    memset(a, 0, sizeof *a);
}

void *ts_acts_output(const ts_model *m, const ts_acts *a, int l)
{
    switch (m->layers[l].kind) {
    case TS_LAYER_EMBED: return ts_embed_views(m, a, l).out;
    case TS_LAYER_BLOCK: return ts_block_views(m, a, l).out;
    case TS_LAYER_HEAD: break;
    }
    TS_ASSERT(!"the head has no activation output");
    return NULL;
}

const float *ts_acts_losses(const ts_model *m, const ts_acts *a)
{
    TS_ASSERT(a->l1 == m->n_layers);
    return ts_head_views(m, a, m->n_layers - 1).losses;
}

const float *ts_acts_mtp_losses(const ts_model *m, const ts_acts *a, int k)
{
    TS_ASSERT(a->l1 == m->n_layers && k >= 1 && k <= m->mtp_layers);
    return ts_mtp_views(m, a, m->n_layers + k - 1).mtp_losses;
}

const void *ts_acts_layer_input(const ts_model *m, const ts_acts *a, int l)
{
    return l == a->l0 ? a->input : ts_acts_output(m, a, l - 1);
}

/* ------------------------------------------------------------ the scratch */

size_t ts_scratch_wide_cols(act_dims d) { return d.FI > d.QKV ? d.FI : d.QKV; }
size_t ts_scratch_narrow_cols(act_dims d)
{
    /* C, or llama's MLP columns F, or the attention's Cl (H * head_dim, wider than C
     * where model.head_dim makes it so: Qwen3-MoE) when wider. */
    size_t cols = d.llama && d.F > d.C ? d.F : d.C;
    return d.Cl > cols ? d.Cl : cols;
}
static size_t scratch_gather_offset(act_dims d)
{
    return ACT_ALIGN(d.N * (ts_scratch_wide_cols(d) + ts_scratch_narrow_cols(d)) * d.ab);
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

static void *scratch_at(const ts_scratch *sc, size_t offset)
{
    return (unsigned char *)sc->mem + offset;
}

void *ts_scratch_wide(const act_dims *d, const ts_scratch *sc)
{
    (void)d;
    return sc->mem;
}
void *ts_scratch_narrow(const act_dims *d, const ts_scratch *sc)
{
    return act_at(d, sc->mem, d->N * ts_scratch_wide_cols(*d));
}
void *ts_scratch_gather(const act_dims *d, const ts_scratch *sc)
{
    return d->sp ? scratch_at(sc, scratch_gather_offset(*d)) : NULL;
}
void *ts_scratch_local(const act_dims *d, const ts_scratch *sc)
{
    return d->sp ? scratch_at(sc, scratch_local_offset(*d)) : NULL;
}
void *ts_scratch_attention(const act_dims *d, const ts_scratch *sc)
{
    return scratch_at(sc, scratch_att_offset(*d));
}
void *ts_scratch_rebuilt(const act_dims *d, const ts_scratch *sc)
{
    return scratch_at(sc, scratch_rebuilt_offset(*d));
}
void *ts_scratch_rebuilt_out(const act_dims *d, const ts_scratch *sc)
{
    return scratch_at(sc, scratch_rebuilt_out_offset(*d));
}

static size_t scratch_before_mla(act_dims d)
{
    return d.cp ? scratch_cp_offset(d) + d.cpw : scratch_without_cp(d);
}

/* MLA's work parts in activation elements per row (act_layout.h mla_work's order). */
#define MLA_WORK_PARTS 10
static void mla_work_cols(act_dims d, size_t cols[MLA_WORK_PARTS])
{
    const size_t c[MLA_WORK_PARTS] = {d.rebuild ? d.QKV : 0, d.QK, d.KVB, d.LA, d.H * d.RR,
                                      d.RKV, d.RKV, d.RQ, d.RQ, d.RR};
    memcpy(cols, c, sizeof c);
}

static size_t mla_work_bytes(act_dims d)
{
    if (!d.mla) return 0;
    size_t cols[MLA_WORK_PARTS], total = 0;
    mla_work_cols(d, cols);
    for (int i = 0; i < MLA_WORK_PARTS; i++) total += ACT_ALIGN(d.N * cols[i] * d.ab);
    return total;
}

mla_work ts_mla_work_of(const act_dims *d, void *base)
{
    size_t cols[MLA_WORK_PARTS];
    mla_work_cols(*d, cols);
    void *p[MLA_WORK_PARTS];
    unsigned char *at = base;
    for (int i = 0; i < MLA_WORK_PARTS; i++) {
        p[i] = at;
        at += ACT_ALIGN(d->N * cols[i] * d->ab);
    }
    return (mla_work){p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]};
}

static size_t scratch_mla_offset(act_dims d) { return ACT_ALIGN(scratch_before_mla(d)); }

void *ts_scratch_mla(const act_dims *d, const ts_scratch *sc)
{
    return d->mla ? scratch_at(sc, scratch_mla_offset(*d)) : NULL;
}

void *ts_scratch_mla_work(const ts_scratch *s, const ts_model *m, int B, int T)
{
    const act_dims d = ts_act_dims(m, -1, B, T);
    return ts_scratch_mla(&d, s);
}

static size_t scratch_before_moe(act_dims d)
{
    return d.mla ? scratch_mla_offset(d) + mla_work_bytes(d) : scratch_before_mla(d);
}

#define MOE_SCRATCH_PARTS 12

/* The MoE region's parts in bytes, in order (act_layout.h moe_scratch). */
static void moe_scratch_parts(act_dims d, size_t part[MOE_SCRATCH_PARTS])
{
    const size_t NK = d.NL * d.MK;
    part[0] = ACT_ALIGN(NK * d.C * d.ab);            /* dyp, then dxp */
    part[1] = ACT_ALIGN(d.MR * d.MF * d.ab);         /* da */
    part[2] = ACT_ALIGN(d.MR * 2 * d.MF * d.ab);     /* dh */
    part[3] = ACT_ALIGN(NK * sizeof(float));         /* dw */
    part[4] = ACT_ALIGN(d.NL * d.ME * sizeof(float)); /* dlogits */
    part[5] = ACT_ALIGN(d.NL * d.C * d.ab);          /* dx */
    part[6] = ACT_ALIGN(d.NL * d.MS * d.ab);         /* shared da */
    part[7] = ACT_ALIGN(d.NL * 2 * d.MS * d.ab);     /* shared dh */
    part[8] = ACT_ALIGN(d.MX * d.C * d.ab);          /* expert parallelism: dyr, then dxr */
    part[9] = ACT_ALIGN(d.MX * d.C * d.ab);          /* expert parallelism: the work */
    part[10] = d.ab == sizeof(float) ? 0 : ACT_ALIGN(d.NL * d.C * sizeof(float)); /* dxf */
    part[11] = ACT_ALIGN(d.B * d.ME * sizeof(int)); /* the sequences' counts (seq_counts) */
}

size_t ts_scratch_bytes(const ts_model *m, int B, int T)
{
    const act_dims d = ts_act_dims(m, -1, B, T);
    if (!d.ME) return scratch_before_moe(d);
    size_t part[MOE_SCRATCH_PARTS], total = ACT_ALIGN(scratch_before_moe(d));
    moe_scratch_parts(d, part);
    for (int i = 0; i < MOE_SCRATCH_PARTS; i++) total += part[i];
    return total;
}

moe_scratch ts_scratch_moe(const ts_model *m, const ts_scratch *sc, int B, int T)
{
    const act_dims d = ts_act_dims(m, -1, B, T);
    moe_scratch s = {0};
    if (!d.ME) return s;
    size_t part[MOE_SCRATCH_PARTS], at = ACT_ALIGN(scratch_before_moe(d));
    moe_scratch_parts(d, part);
    void *p[MOE_SCRATCH_PARTS];
    for (int i = 0; i < MOE_SCRATCH_PARTS; i++) {
        p[i] = scratch_at(sc, at);
        at += part[i];
    }
    TS_ASSERT(at <= sc->bytes);
    s = (moe_scratch){.dyp = p[0], .da = p[1], .dh = p[2], .dx = p[5], .sh_da = p[6],
                      .sh_dh = p[7], .dw = p[3], .dlogits = p[4], .dyr = p[8], .er = p[9],
                      .dxf = d.ab == sizeof(float) ? NULL : p[10], .seq_counts = p[11]};
    return s;
}

void *ts_scratch_context_work(const ts_scratch *s, const ts_model *m, int B, int T)
{
    const act_dims d = ts_act_dims(m, -1, B, T);
    return d.cp ? scratch_at(s, scratch_cp_offset(d)) : NULL;
}

void *ts_scratch_attention_work(const ts_scratch *s, const ts_model *m, int B, int T)
{
    const act_dims d = ts_act_dims(m, -1, B, T);
    return d.rebuild ? scratch_at(s, scratch_rebuilt_offset(d)) : NULL;
}

void *ts_scratch_sequence_work(const ts_scratch *s, const ts_model *m, int B, int T)
{
    const act_dims d = ts_act_dims(m, -1, B, T);
    return d.sp ? scratch_at(s, scratch_gather_offset(d)) : NULL;
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

/* ------------------------------------------------------------ the stash */

/* A block's stash in elements: each phase's output gradient [N,C] and its input
 * linear's output gradient (the MLP's [N,FI], attention's [N,QKV]). */
static size_t stash_block_elems(const ts_model *m, int N)
{
    const act_dims d = ts_act_dims(m, -1, N, 1); /* only the N rows matter here */
    /* An MLA block makes its attention's weight gradients in the input pass (mla.c): no
     * attention part. */
    return d.N * (d.C + d.FI + (d.mla ? 0 : d.C + d.QKV));
}

void *ts_stash_mlp(const ts_model *m, void *block_stash, int N)
{
    (void)m;
    (void)N;
    return block_stash;
}

void *ts_stash_attention(const ts_model *m, void *block_stash, int N)
{
    const act_dims d = ts_act_dims(m, -1, N, 1);
    return act_at(&d, block_stash, d.N * (d.C + d.FI));
}

static size_t stash_offset(const ts_model *m, const ts_acts *a, int l)
{
    int blocks_before = 0;
    for (int j = a->l0; j < l; j++) blocks_before += m->layers[j].kind == TS_LAYER_BLOCK;
    return (size_t)blocks_before * stash_block_elems(m, a->B * a->T);
}

static size_t stash_total_elems(const ts_model *m, int l0, int l1, int B, int T)
{
    int blocks = 0;
    for (int l = l0; l < l1; l++) blocks += m->layers[l].kind == TS_LAYER_BLOCK;
    return (size_t)blocks * stash_block_elems(m, B * T) +
           (l0 == 0 ? (size_t)B * T * m->n_embd : 0);
}

size_t ts_acts_stash_bytes(const ts_model *m, int l0, int l1, int B, int T)
{
    return stash_total_elems(m, l0, l1, B, T) * ts_dtype_bytes(m->k->act_dtype);
}

void *ts_stash_block(const ts_model *m, const ts_acts *a, int l)
{
    const act_dims d = ts_act_dims(m, -1, a->B, a->T);
    return act_at(&d, a->wstash, stash_offset(m, a, l));
}

void *ts_stash_embed(const ts_model *m, const ts_acts *a)
{
    const act_dims d = ts_act_dims(m, -1, a->B, a->T);
    const size_t at = stash_offset(m, a, a->l1);
    TS_ASSERT(at + (a->l0 == 0 ? d.N * d.C : 0) ==
              stash_total_elems(m, a->l0, a->l1, a->B, a->T));
    return act_at(&d, a->wstash, at);
}
