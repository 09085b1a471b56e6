/* The planner's per-layer cost and memory model (model_cost.h). */
#include "plan/model_cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/sysmem.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "tensor/cp.h"
#include "tensor/tp.h"
#include "pipeline/memory.h"

double ts_plan_allreduce_time(double bytes, int ranks, ts_link link)
{
    if (ranks <= 1) return 0.0;
    const double k = (double)(ranks - 1);
    return 2.0 * k / ranks * bytes / link.bandwidth + 2.0 * k * link.latency;
}

double ts_plan_allgather_time(double bytes, int ranks, ts_link link)
{
    if (ranks <= 1) return 0.0;
    const double k = (double)(ranks - 1);
    return k / ranks * bytes / link.bandwidth + k * link.latency;
}

/* One (m, n, k) GEMM at the efficiency its size reaches. */
static double gemm(const ts_cluster *cl, double m, double n, double k)
{
    const double work = m * n * k;
    return 2.0 * work / (ts_cluster_peak(cl) * ts_cluster_efficiency(cl, cbrt(work)));
}

static double mem_time(const ts_cluster *cl, double bytes) { return bytes / cl->memory_bandwidth; }

/* Elementwise kernels. Without a time per element in the cluster file a kernel is a
 * memory pass and its bytes join the layer's one sum of them (so a file without
 * device.elementwise_ns predicts to the bit what it did before the key existed: the
 * balanced cut compares layer costs, and a rounding difference could move it); with one,
 * its bytes leave that sum and it costs the larger of its memory time and elements x the
 * measured time per element (memory traffic included in the measurement). The parser
 * sets a kernel's forward and backward together. */
static double shared_bytes(const ts_cluster *cl, int kernel, double bytes)
{
    return cl->elem_time[kernel][0] > 0 ? 0.0 : bytes;
}

static double own_time(const ts_cluster *cl, int kernel, int dir, double bytes, double elements)
{
    const double per = cl->elem_time[kernel][dir];
    if (per <= 0) return 0.0;
    const double t = mem_time(cl, bytes);
    return elements * per > t ? elements * per : t;
}

const ts_kernels *ts_plan_kernels(const ts_config *cfg, const ts_cluster *cl)
{
    return ts_kernels_layout_for(cfg->train.device, cl->bf16 ? "bf16" : "fp32",
                                 cfg->train.attention);
}

/* tp_overlap's exposed part of collectives c behind compute g over S sub-batches
 * (model_cost.h). */
static double overlap_exposed(const ts_cluster *cl, double c, double g, int S)
{
    if (S <= 1 || cl->comm_on_compute) return c;
    const double rest = c - g > 0.0 ? c - g : 0.0;
    return c / S + rest * (S - 1) / S;
}

/* This tp rank's key/value heads (gpt2: its query heads; llama: its share of n_kv_head,
 * or one replicated head when tp > n_kv_head). */
static double local_kv_heads(const ts_model_config *mc, int tp)
{
    const int nkv = ts_model_kv_heads(mc);
    if (ts_model_arch(mc) != TS_ARCH_LLAMA) return (double)(mc->n_head / tp);
    return nkv % tp == 0 ? (double)(nkv / tp) : 1.0;
}

double ts_plan_cp_exchange_time(const ts_model_config *mc, int tp, int cp, int micro_batch,
                                double act_bytes, ts_link l)
{
    if (cp <= 1) return 0.0;
    /* MLA exchanges its compressed latent and the shared rope key, the same on every tp
     * rank (the trunk is replicated), and each rank up-projects the gathered rows. */
    if (ts_model_is_mla(mc))
        return ts_plan_allgather_time((double)micro_batch * mc->seq_len *
                                          (mc->kv_lora_rank + mc->qk_rope_head_dim) * act_bytes,
                                      cp, l);
    const double hs = (double)ts_model_head_dim(mc);
    const double kv = (double)micro_batch * mc->seq_len * 2.0 * local_kv_heads(mc, tp) * hs;
    return ts_plan_allgather_time(kv * act_bytes, cp, l);
}

/* The causal block of a table's attention kernels (model_cost.h): the CPU kernels run
 * query rows in blocks of this many key positions and skip the key blocks above the
 * diagonal (src/kernels/cpu/attention.c's TS_ATT_BLOCK, 32; attention_bf16.c's, 64);
 * 0 for the CUDA tables, whose batched GEMMs compute every rectangle whole. */
static int attention_block(const ts_kernels *k)
{
    if (strncmp(k->device, "cpu", 3) != 0) return 0;
    return k->act_dtype == TS_DTYPE_BF16 ? 64 : 32;
}

/* One head's forward products over Tq queries (the last Tq positions) against Tk keys,
 * q.k over hs channels and the weighted sum of hv value channels (MLA: nope + rope and
 * v_head_dim; else both head_dim), as a kernel with causal block `block` runs them (0:
 * the whole rectangle, the GEMMs Tq x Tk x hs and Tq x hv x Tk; else per block of query
 * rows the GEMMs over the keys up to the block's end, ts_att_block_end's rule, and with
 * packed documents of doc_len tokens (> 0) from the key block holding the document start
 * of the block's first query, as the CPU kernels skip the earlier documents' blocks); the
 * score entries computed into *area. The CUDA tables' batched GEMMs compute the whole
 * rectangle with documents too (attention.cu masks in the softmax). */
static double rect_gemms(const ts_cluster *cl, double hs, double hv, int Tq, int Tk, int block,
                         int doc_len, double *area)
{
    if (block <= 0) {
        *area = (double)Tq * Tk;
        return gemm(cl, Tq, Tk, hs) + gemm(cl, Tq, hv, Tk);
    }
    const int off = Tk - Tq;
    double t = 0.0;
    *area = 0.0;
    for (int i0 = 0, i1; i0 < Tq; i0 = i1) {
        i1 = ((i0 + off) / block + 1) * block - off;
        if (i1 > Tq) i1 = Tq;
        const int p0 = i0 + off; /* the block's first query's key position */
        const int s0 = doc_len > 0 ? (p0 - p0 % doc_len) / block * block : 0;
        const double m = i1 - i0, e = i1 + off - s0;
        t += gemm(cl, m, e, hs) + gemm(cl, m, hv, e);
        *area += m * e;
    }
    return t;
}

/* Attention's two batched GEMMs per query head of one micro-batch (B sequences, hl
 * heads) on a cp rank by the kernel's causal block (rect_gemms), and the score elements
 * its softmax passes move, forward (*scores_f) and backward (*scores_b): three passes
 * over the computed scores forward (read, write, scale) and, where the kernel skips the
 * masked blocks, one write of the zeros the rest of each row's saved probabilities get;
 * six over the computed ones backward. One rule for every cp: without context
 * parallelism the one T x T rectangle; with it each local chunk's c queries against its
 * prefix of (j+1)c keys, the slowest rank's pair of chunks. */
/* The per-head part of attention_gemms for one (cluster GEMM curve, hs, hv, T, cp,
 * block): the search prices it for every shape it floors, and with a causal block it is
 * T / block GEMM pairs per chunk (DeepSeek-V3 at 2048 devices: half the search's time
 * went to these). Memoised in a small table, keyed by every input (the curve's peak and
 * points included); the planner runs on one thread. */
typedef struct {
    double peak, hs, hv;
    int T, cp, block, doc_len, n_eff;
    double eff_n[TS_CLUSTER_MAX_EFF], eff[TS_CLUSTER_MAX_EFF];
    double most, area, full;
} att_memo;

#define TS_ATT_MEMO 64
static att_memo att_memos[TS_ATT_MEMO];
static int n_att_memos, next_att_memo;

static void att_memo_key(att_memo *k, const ts_cluster *cl, double hs, double hv, int T, int cp,
                         int block, int doc_len)
{
    memset(k, 0, sizeof *k);
    k->peak = ts_cluster_peak(cl);
    k->hs = hs;
    k->hv = hv;
    k->T = T;
    k->cp = cp <= 1 ? 1 : cp;
    k->block = block;
    k->doc_len = doc_len;
    k->n_eff = cl->n_eff;
    memcpy(k->eff_n, cl->eff_n, sizeof(double) * (size_t)cl->n_eff);
    memcpy(k->eff, cl->eff, sizeof(double) * (size_t)cl->n_eff);
}

static bool att_memo_same(const att_memo *a, const att_memo *b)
{
    /* (memset keys: the unused points are zero in both) */
    return a->peak == b->peak && a->hs == b->hs && a->hv == b->hv && a->T == b->T &&
           a->cp == b->cp && a->block == b->block && a->doc_len == b->doc_len &&
           a->n_eff == b->n_eff &&
           !memcmp(a->eff_n, b->eff_n, sizeof a->eff_n) && !memcmp(a->eff, b->eff, sizeof a->eff);
}

static double attention_gemms(const ts_cluster *cl, double B, double hl, double hs, double hv,
                              int T, int cp, int block, int doc_len, double *scores_f,
                              double *scores_b)
{
    att_memo key;
    att_memo_key(&key, cl, hs, hv, T, cp, block, doc_len);
    for (int j = 0; j < n_att_memos; j++)
        if (att_memo_same(&att_memos[j], &key)) {
            const att_memo *e = &att_memos[j];
            *scores_f = B * hl * (3.0 * e->area + (e->full - e->area));
            *scores_b = B * hl * 6.0 * e->area;
            return B * hl * e->most;
        }
    double most = -1.0, area = 0.0, full = 0.0;
    if (cp <= 1) {
        most = rect_gemms(cl, hs, hv, T, T, block, doc_len, &area);
        full = (double)T * T;
    } else {
        const int c = T / (2 * cp);
        for (int i = 0; i < cp; i++) {
            double a0, a1;
            const double t = rect_gemms(cl, hs, hv, c, (i + 1) * c, block, doc_len, &a0) +
                             rect_gemms(cl, hs, hv, c, (2 * cp - i) * c, block, doc_len, &a1);
            if (t > most) {
                most = t;
                area = a0 + a1;
            }
        }
        full = (double)c * c * (2.0 * cp + 1.0); /* every rank's two prefixes alike */
    }
    key.most = most;
    key.area = area;
    key.full = full;
    att_memos[next_att_memo] = key;
    next_att_memo = (next_att_memo + 1) % TS_ATT_MEMO;
    if (n_att_memos < TS_ATT_MEMO) n_att_memos++;
    *scores_f = B * hl * (3.0 * area + (full - area));
    *scores_b = B * hl * 6.0 * area;
    return B * hl * most;
}

/* One block's costs (a ts_plan_layers row; model_cost.h): the dense kind's or the MoE
 * kind's, priced once and written to every block of the kind and to each multi-token
 * prediction module's block. */
typedef struct {
    double f, i, w, f_tp, i_tp, w_split_tp, f_gemm, b_gemm, f_cp, i_cp, f_a2a, i_a2a, f_att;
    ts_plan_moe_block moe;
} block_cost;

static void block_into(ts_plan_layers *L, int l, const block_cost *b)
{
    L->f[l] = b->f;
    L->i[l] = b->i;
    L->w[l] = b->w;
    L->f_tp[l] = b->f_tp;
    L->i_tp[l] = b->i_tp;
    L->w_split_tp[l] = b->w_split_tp;
    L->f_gemm[l] = b->f_gemm;
    L->b_gemm[l] = b->b_gemm;
    L->f_cp[l] = b->f_cp;
    L->i_cp[l] = b->i_cp;
    L->f_a2a[l] = b->f_a2a;
    L->i_a2a[l] = b->i_a2a;
    L->f_att[l] = b->f_att;
    L->moe[l] = b->moe;
}

/* The head's layer holds the MTP modules' MoE blocks too: their expert phases' terms
 * summed (rows_per_expert and a2a_bytes are per block, the same for every one). */
static void moe_add(ts_plan_moe_block *to, const ts_plan_moe_block *b)
{
    to->router_f += b->router_f;
    to->router_b += b->router_b;
    to->experts_f += b->experts_f;
    to->experts_b += b->experts_b;
    to->shared_f += b->shared_f;
    to->shared_b += b->shared_b;
    to->elem_f += b->elem_f;
    to->elem_b += b->elem_b;
    to->a2a_f += b->a2a_f;
    to->a2a_b += b->a2a_b;
    to->hidden_f += b->hidden_f;
    to->hidden_b += b->hidden_b;
    to->etp_f += b->etp_f;
    to->etp_b += b->etp_b;
    to->tp_f += b->tp_f;
    to->tp_b += b->tp_b;
    if (b->rows_per_expert > 0) {
        to->rows_per_expert = b->rows_per_expert;
        to->a2a_bytes = b->a2a_bytes;
    }
}

void ts_plan_layers_build(ts_plan_layers *L, const ts_model_config *mc, const ts_cluster *cl,
                          const ts_kernels *k, int tp, bool sp, int sub, int micro_batch,
                          ts_link tp_link, int cp, ts_link cp_link)
{
    ts_plan_layers_build_moe(L, mc, cl, k, tp, sp, sub, micro_batch, tp_link, cp, cp_link, NULL);
}

void ts_plan_param_floats_build(ts_plan_param_floats *pf, const ts_model_config *mc,
                                const ts_kernels *k, int tp, int ep, int etp)
{
    const int n = mc->n_layer + 2;
    pf->n_layers = n;
    pf->param_floats = ts_calloc((size_t)n, sizeof(double));
    pf->expert_floats = ts_calloc((size_t)n, sizeof(double));
    ts_model_spec spec = {.arch = mc, .k = k, .tp = ts_tp_make(tp, 0, NULL, k),
                          .ep_size = ep, .etp_size = etp};
    ts_model m;
    ts_model_layout(&m, &spec);
    for (int l = 0; l < n; l++) {
        const ts_layer *ly = &m.layers[l];
        for (int p = ly->first_param; p < ly->first_param + ly->n_params; p++) {
            const double fl = (double)((m.params[p].numel + 15) / 16 * 16);
            pf->param_floats[l] += fl;
            if (m.params[p].expert) pf->expert_floats[l] += fl;
        }
    }
    ts_model_free(&m);
}

void ts_plan_param_floats_free(ts_plan_param_floats *pf)
{
    free(pf->param_floats);
    free(pf->expert_floats);
    memset(pf, 0, sizeof *pf);
}

void ts_plan_layers_build_moe(ts_plan_layers *L, const ts_model_config *mc, const ts_cluster *cl,
                              const ts_kernels *k, int tp, bool sp, int sub, int micro_batch,
                              ts_link tp_link, int cp, ts_link cp_link, const ts_plan_moe *moe)
{
    ts_plan_layers_build_sized(L, mc, cl, k, tp, sp, sub, micro_batch, tp_link, cp, cp_link, moe,
                               NULL, 0);
}

static void build_layers(ts_plan_layers *L, const ts_model_config *mc, const ts_cluster *cl,
                         const ts_kernels *k, int tp, bool sp, int sub, int micro_batch,
                         ts_link tp_link, int cp, ts_link cp_link, const ts_plan_moe *moe,
                         const ts_plan_param_floats *sizes, bool with_sizes, int doc_len);

void ts_plan_layers_build_sized(ts_plan_layers *L, const ts_model_config *mc,
                                const ts_cluster *cl, const ts_kernels *k, int tp, bool sp,
                                int sub, int micro_batch, ts_link tp_link, int cp,
                                ts_link cp_link, const ts_plan_moe *moe,
                                const ts_plan_param_floats *sizes, int doc_len)
{
    build_layers(L, mc, cl, k, tp, sp, sub, micro_batch, tp_link, cp, cp_link, moe, sizes, true,
                 doc_len);
}

void ts_plan_layers_build_times(ts_plan_layers *L, const ts_model_config *mc,
                                const ts_cluster *cl, const ts_kernels *k, int tp, bool sp,
                                int sub, int micro_batch, ts_link tp_link, int cp,
                                ts_link cp_link, const ts_plan_moe *moe, int doc_len)
{
    build_layers(L, mc, cl, k, tp, sp, sub, micro_batch, tp_link, cp, cp_link, moe, NULL, false,
                 doc_len);
}

/* The sizes of L (parameters, activations, scratch: the layout's) and the rank's
 * vocabulary rows, which the head's time needs (model.c's split: ts_shard_range on tp
 * rank 0). */
static double layout_sizes(ts_plan_layers *L, const ts_model_config *mc, const ts_kernels *k,
                           int tp, bool sp, int cp, const ts_plan_moe *xg, int micro_batch,
                           const ts_plan_param_floats *sizes);

static double layout_sizes(ts_plan_layers *L, const ts_model_config *mc, const ts_kernels *k,
                           int tp, bool sp, int cp, const ts_plan_moe *xg, int micro_batch,
                           const ts_plan_param_floats *sizes)
{
    const int n = mc->n_layer + 2, Tl = mc->seq_len / cp;
    /* Sizes: the model's own layout (tp rank 0) by the run's table, nothing allocated;
     * under sequence parallelism the norms', residuals' and boundaries' rows / tp; under
     * context parallelism (cp rank 0; every rank holds as much) T / cp rows with the
     * gathered K/V and the two chunks' attention state. */
    ts_plan_param_floats own = {0};
    if (!sizes) {
        ts_plan_param_floats_build(&own, mc, k, tp, xg->ep, xg->etp);
        sizes = &own;
    }
    TS_ASSERT(sizes->n_layers == n);
    memcpy(L->param_floats, sizes->param_floats, sizeof(double) * (size_t)n);
    memcpy(L->expert_floats, sizes->expert_floats, sizeof(double) * (size_t)n);
    ts_plan_param_floats_free(&own);
    /* The activations' layout holds no parameter (act_layout.h reads none): laid out
     * with no layer owned it skips naming every expert's tensors, the costly part. */
    bool *none = ts_calloc((size_t)n, sizeof(bool));
    ts_model_spec spec = {.arch = mc, .k = k, .tp = ts_tp_make(tp, 0, NULL, k),
                          .sequence_parallel = sp, .ep_size = xg->ep, .etp_size = xg->etp,
                          .owned = none};
    if (cp > 1) spec.cp = ts_cp_make(cp, 0, NULL, k, mc->seq_len);
    ts_model m;
    ts_model_layout(&m, &spec);
    for (int l = 0; l < n; l++) {
        L->act_bytes[l] = (double)ts_acts_bytes(&m, l, l + 1, micro_batch, Tl);
        L->stash_bytes[l] = (double)ts_acts_stash_bytes(&m, l, l + 1, micro_batch, Tl);
    }
    /* The head's copy of a tied embedding when it sits on another stage (an untied head
     * has its own lm_head among its parameters), or the MTP modules' copy of the
     * embedding they read (model.h mtp_wte_param: one copy when both). */
    const size_t wte = (size_t)m.local_vocab * (size_t)mc->n_embd;
    L->wte_floats =
        ts_model_tied(mc) || mc->mtp_layers > 0 ? (double)((wte + 15) / 16 * 16) : 0.0;
    L->scratch_bytes = (double)ts_scratch_bytes(&m, micro_batch, Tl);
    /* The same layout under selective recompute: what it drops and adds. */
    ts_model sel;
    spec.selective_all = true;
    ts_model_layout(&sel, &spec);
    for (int l = 0; l < n; l++)
        L->att_bytes[l] =
            L->act_bytes[l] - (double)ts_acts_bytes(&sel, l, l + 1, micro_batch, Tl);
    L->rebuild_bytes = (double)ts_scratch_bytes(&sel, micro_batch, Tl) - L->scratch_bytes;
    const double Vl = (double)m.local_vocab;
    ts_model_free(&sel);
    ts_model_free(&m);
    free(none);
    return Vl;
}

static void build_layers(ts_plan_layers *L, const ts_model_config *mc, const ts_cluster *cl,
                         const ts_kernels *k, int tp, bool sp, int sub, int micro_batch,
                         ts_link tp_link, int cp, ts_link cp_link, const ts_plan_moe *moe,
                         const ts_plan_param_floats *sizes, bool with_sizes, int doc_len)
{
    memset(L, 0, sizeof *L);
    /* The expert grid: none for a dense model (its layout and costs as they were). */
    ts_plan_moe xg = {.ep = 1, .etp = 1, .ep_in_node = 1, .imbalance = 1.0,
                      .hide_shared = true, .etp_link = tp_link};
    if (moe && mc->moe_experts > 0) xg = *moe;
    if (xg.ep < 1) xg.ep = 1;
    if (xg.etp < 1) xg.etp = 1;
    L->ep = xg.ep;
    L->etp = xg.etp;
    const int n = mc->n_layer + 2;
    TS_ASSERT(cp >= 1 && (cp == 1 || mc->seq_len % (2 * cp) == 0));
    /* The positions of each sequence a cp rank holds: every layout and time below. */
    const int Tl = mc->seq_len / cp;
    L->n_layers = n;
    L->tp = tp;
    L->cp = cp;
    L->sp = sp;
    L->B = micro_batch;
    L->T = mc->seq_len;
    L->C = mc->n_embd;
    double **arrays[] = {&L->f, &L->i, &L->w, &L->f_tp, &L->i_tp, &L->w_split_tp, &L->f_gemm,
                         &L->b_gemm, &L->param_floats, &L->act_bytes, &L->stash_bytes,
                         &L->att_bytes, &L->f_att, &L->f_cp, &L->i_cp, &L->f_a2a, &L->i_a2a,
                         &L->expert_floats};
    for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++)
        *arrays[a] = ts_calloc((size_t)n, sizeof(double));
    L->moe = ts_calloc((size_t)n, sizeof *L->moe);

    double Vl;
    if (with_sizes) {
        Vl = layout_sizes(L, mc, k, tp, sp, cp, &xg, micro_batch, sizes);
    } else {
        int64_t v0, nv;
        ts_shard_range(mc->vocab_size, tp, 0, &v0, &nv);
        Vl = (double)nv;
    }

    /* N: this cp rank's rows of the micro-batch (B * T without context parallelism). */
    const double B = micro_batch, C = mc->n_embd, N = B * Tl, tpd = tp;
    /* The rows the norms and residual adds run on, and the boundaries hold. */
    const double NL = sp ? N / tpd : N;
    const bool llama = ts_model_arch(mc) == TS_ARCH_LLAMA;
    /* This rank's heads: hl query heads; kvl key/value heads (gpt2: hl; llama: its
     * share of n_kv_head, or one replicated head when tp > n_kv_head); F MLP columns.
     * hs: a q/k head's channels, hv a value head's (MLA: nope + rope and v_head_dim;
     * model.head_dim or n_embd / n_head otherwise, both). */
    const bool mla = ts_model_is_mla(mc);
    const double hl = (double)(mc->n_head / tp);
    const double hs = mla ? (double)(mc->qk_nope_head_dim + mc->qk_rope_head_dim)
                          : (double)ts_model_head_dim(mc);
    const double hv = mla ? (double)mc->v_head_dim : hs;
    const double kvl = local_kv_heads(mc, tp);
    const double F = (double)ts_model_ffn(mc) / tpd;
    /* Bytes of one activation element (bf16 on a bf16 cluster: the pipeline, the tp sums
     * and the elementwise kernels move act_dtype), and of an fp32 statistic. */
    const double ab = (double)ts_dtype_bytes(k->act_dtype), f32 = 4.0;
    L->msg_bytes = NL * C * ab;
    const double ar_act = ts_plan_allreduce_time(N * C * ab, tp, tp_link);
    /* Sequence parallelism's halves of it: one all-gather or reduce-scatter of [N, C]. */
    const double ag_act = sp ? ts_plan_allgather_time(N * C * ab, tp, tp_link) : 0.0;

    /* Block: q, k, v (column-parallel by heads; one GEMM of the rank's (hl + 2 kvl) heads),
     * attention over the local query heads, its output projection (row-parallel); the
     * MLP's column-parallel input (gpt2: c_fc [4C, C]; llama: gate and up [2F, C] as one
     * GEMM) and row-parallel output (c_proj / down [C, F]). */
    const double mlp_in = llama ? 2.0 * F : F;
    /* tp_overlap: S sub-batches of N/S rows each. */
    const int S = sub > 1 ? sub : 1;
    const double Ns = N / S;
    /* Multi-head latent attention (model/mla.c): the latent trunk, replicated over tp, is
     * one GEMM of the block's input into [q latent | kv latent | rope key] (q_a_proj and
     * kv_a_proj_with_mqa packed; without a q latent q_proj's local heads join it); the
     * column-parallel up-projections q_b_proj [hl hs, q_lora] and kv_b_proj [hl (nope +
     * v), kv_lora], the latter over the rows whose keys the rank needs (under context
     * parallelism the gathered latents of the whole sequence, B T rows); o_proj
     * row-parallel [C, hl hv]. */
    const double RQ = mc->q_lora_rank, RKV = mc->kv_lora_rank, RD = mc->qk_rope_head_dim;
    const double Nkv = cp > 1 ? B * mc->seq_len : N;
    const double att_lin =
        mla ? (RQ > 0 ? gemm(cl, Ns, RQ + RKV + RD, C) + gemm(cl, Ns, hl * hs, RQ)
                      : gemm(cl, Ns, hl * hs + RKV + RD, C)) +
                  gemm(cl, Nkv / S, hl * (mc->qk_nope_head_dim + hv), RKV) +
                  gemm(cl, Ns, C, hl * hv)
            : gemm(cl, Ns, (hl + 2.0 * kvl) * hs, C) + gemm(cl, Ns, C, hl * hs);
    const double lin = S * (att_lin + gemm(cl, Ns, mlp_in, C) + gemm(cl, Ns, C, F));
    /* MLA under context parallelism (model/mla_cp.h): the backward expands the kept
     * latent through kv_b_proj again (a forward GEMM more in I). */
    const double kvb_cp =
        mla && cp > 1 ? S * gemm(cl, Nkv / S, hl * (mc->qk_nope_head_dim + hv), RKV) : 0.0;
    double scores_f, scores_b;
    const double att = attention_gemms(cl, B, hl, hs, hv, mc->seq_len, cp, attention_block(k),
                                       doc_len, &scores_f, &scores_b);
    /* Context parallelism's blocking K/V all-gather (forward) and dK/dV reduce-scatter
     * (MLA: the latent and rope key's, ts_plan_cp_exchange_time). */
    const double cp_x = ts_plan_cp_exchange_time(mc, tp, cp, micro_batch, ab, cp_link);
    /* Elementwise passes, forward: the two norms (LayerNorm, or llama's RMSNorm: read +
     * write), residual adds x2 (2 reads + 1 write), the MLP activation (GELU: read and
     * write the local columns; SwiGLU: read gate and up, write their product), llama's
     * RoPE (in place on the local q and k heads; MLA: on each q head's rope channels and
     * the one shared rope key), softmax (read scores, write probabilities, the
     * scale/mask pass) over the local heads' computed scores (and the zeros of the
     * skipped blocks: attention_gemms); MLA's latent RMSNorms (q and kv latents, read +
     * write, priced as the norms) and the assembly of its key and value heads from
     * kv_b_proj's output and the shared rope key (read nope + v and the key, write hs +
     * hv per head and key row); the backward moves twice the bytes but the softmax's,
     * which are its own. The activation and the norm may have their own time (above:
     * gelu's for SwiGLU, layernorm's for RMSNorm). */
    const double act_rw = llama ? 3.0 * N * F : 2.0 * N * F;
    const double rope = mla ? 2.0 * N * (hl + 1.0) * RD : llama ? 2.0 * N * (hl + kvl) * hs : 0.0;
    const double lat = mla ? N * (RQ + RKV) : 0.0;
    const double mla_rw =
        mla ? Nkv * (hl * (mc->qk_nope_head_dim + hv) + RD + hl * (hs + hv)) : 0.0;
    const double elem_mla = ab * (shared_bytes(cl, TS_ELEM_LAYERNORM, 2.0 * lat) + mla_rw);
    const double own_mla_f = own_time(cl, TS_ELEM_LAYERNORM, 0, ab * 2.0 * lat, lat);
    const double own_mla_b = own_time(cl, TS_ELEM_LAYERNORM, 1, ab * 4.0 * lat, lat);
    /* What an MLA block's selective recompute reruns besides the attention core
     * (act_layout.h: it keeps the latents and q before RoPE, not the assembled q|k|v):
     * kv_b_proj from the kept latent (under context parallelism the exchange's expansion,
     * kvb_cp, already does), RoPE and the assembly. */
    const double mla_rebuild =
        mla ? (cp > 1 ? 0.0 : S * gemm(cl, Ns, hl * (mc->qk_nope_head_dim + hv), RKV)) +
                  mem_time(cl, ab * (mla_rw + rope))
            : 0.0;
    const double elem = ab * (shared_bytes(cl, TS_ELEM_LAYERNORM, 4.0 * NL * C) + 6.0 * NL * C +
                              shared_bytes(cl, TS_ELEM_GELU, act_rw) + rope) + elem_mla;
    const double own_f = own_time(cl, TS_ELEM_LAYERNORM, 0, ab * 4.0 * NL * C, 2.0 * NL * C) +
                         own_time(cl, TS_ELEM_GELU, 0, ab * act_rw, N * F) + own_mla_f;
    const double own_b = own_time(cl, TS_ELEM_LAYERNORM, 1, ab * 8.0 * NL * C, 2.0 * NL * C) +
                         own_time(cl, TS_ELEM_GELU, 1, ab * 2.0 * act_rw, N * F) + own_mla_b;
    /* An MoE block (moe_cost.h): the attention's part of the above, then the expert
     * phase in the MLP's place. The MoE is not tensor parallel: one tp all-reduce each
     * way (o_proj's and its input gradient's), under sequence parallelism o_proj's
     * reduce-scatter and qkv's gather forward, the output gradient's gather, the input
     * gradient's reduce-scatter and ln1's gather again backward (once more in a split W). */
    const double lin_att = S * att_lin;
    /* model/mla.c makes all of its phase's weight gradients in the input pass (a split
     * backward's W has none of them, as the MoE's): they move from W to I. */
    const double mla_dw = mla ? lin_att : 0.0;
    const double elem_att =
        ab * (shared_bytes(cl, TS_ELEM_LAYERNORM, 4.0 * NL * C) + 6.0 * NL * C + rope) + elem_mla;
    const double own_att_f =
        own_time(cl, TS_ELEM_LAYERNORM, 0, ab * 4.0 * NL * C, 2.0 * NL * C) + own_mla_f;
    const double own_att_b =
        own_time(cl, TS_ELEM_LAYERNORM, 1, ab * 8.0 * NL * C, 2.0 * NL * C) + own_mla_b;
    ts_plan_moe_block mb;
    memset(&mb, 0, sizeof mb);
    if (mc->moe_experts > 0)
        ts_plan_moe_block_cost(mc, cl, &xg, N, tp, sp, tp_link, ab, &mb);
    /* The two kinds of block, each priced once: [0] dense, [1] MoE. */
    block_cost bk[2];
    memset(bk, 0, sizeof bk);
    {
        block_cost *d = &bk[0];
        d->f_gemm = lin + att;
        d->b_gemm = 2.0 * lin + 2.0 * att + kvb_cp;
        /* Sequence parallelism: forward 2 (reduce-scatter + all-gather), backward 2
         * output-gradient gathers, 2 input-gradient reduce-scatters, 2 norm re-gathers. */
        d->f_tp = overlap_exposed(cl, sp ? 4.0 * ag_act : 2.0 * ar_act, lin + att, S);
        d->i_tp = overlap_exposed(cl, sp ? 6.0 * ag_act : 2.0 * ar_act, 2.0 * (lin + att), S);
        d->w_split_tp = (mla ? 1.0 : 2.0) * ag_act; /* MLA: ln1's is in I */
        d->f_cp = d->i_cp = cp_x;
        d->f = lin + att + mem_time(cl, elem + ab * scores_f) + own_f + d->f_tp + d->f_cp;
        d->i = lin + 2.0 * att + mem_time(cl, 2.0 * elem + ab * scores_b) + own_b + d->i_tp +
               d->i_cp + mla_dw + kvb_cp;
        d->w = lin - mla_dw;
        d->f_att = att + mem_time(cl, ab * scores_f) + mla_rebuild;
    }
    if (mc->moe_experts > 0) {
        block_cost *e = &bk[1];
        e->moe = mb;
        const double g_f = mb.router_f + mb.experts_f + mb.shared_f;
        const double g_b = mb.router_b + mb.experts_b + mb.shared_b;
        e->f_gemm = lin_att + att + g_f;
        e->b_gemm = 2.0 * lin_att + 2.0 * att + g_b + kvb_cp;
        e->f_tp = overlap_exposed(cl, sp ? 2.0 * ag_act : ar_act, lin_att + att, S) + mb.tp_f;
        e->i_tp = overlap_exposed(cl, sp ? 3.0 * ag_act : ar_act, 2.0 * (lin_att + att), S) +
                  mb.tp_b;
        e->w_split_tp = mla ? 0.0 : ag_act;
        e->f_cp = e->i_cp = cp_x;
        e->f_a2a = mb.a2a_f - mb.hidden_f;
        e->i_a2a = mb.a2a_b - mb.hidden_b;
        e->f = lin_att + att + mem_time(cl, elem_att + ab * scores_f) + own_att_f + e->f_tp +
               e->f_cp + g_f + mb.elem_f + e->f_a2a + mb.etp_f;
        e->i = lin_att + 2.0 * att + mem_time(cl, 2.0 * elem_att + ab * scores_b) + own_att_b +
               e->i_tp + e->i_cp + g_b + mb.elem_b + e->i_a2a + mb.etp_b + mla_dw + kvb_cp;
        e->w = lin_att - mla_dw;
        e->f_att = att + mem_time(cl, ab * scores_f) + mla_rebuild;
    }
    for (int l = 1; l <= mc->n_layer; l++)
        block_into(L, l, &bk[mc->moe_experts > 0 && ts_model_block_is_moe(mc, l - 1)]);
    /* Embedding: a gather of the local vocabulary rows (+ wpe for gpt2; llama has none),
     * written [N, C], the tp sum; backward: the scatter-add into wte (and wpe): a weight
     * gradient, no input. */
    const double wpe = llama ? 0.0 : 1.0;
    /* Sequence parallelism: the sum is a reduce-scatter, and the backward first gathers
     * the output gradient (in the input-gradient pass: a split one stashes it gathered). */
    L->f_tp[0] = sp ? ag_act : ar_act;
    L->i_tp[0] = ag_act;
    L->f[0] = mem_time(cl, ab * (2.0 + wpe) * N * C) + L->f_tp[0];
    L->i[0] = L->i_tp[0];
    L->w[0] = mem_time(cl, ab * (3.0 + wpe) * N * C);
    /* Head: the final norm, the LM-head GEMM over the local vocabulary (gpt2: wte; llama:
     * its own lm_head, the same shape), vocab-parallel cross-entropy (3 passes over the
     * logits; 3 all-reduces of N fp32 row statistics); backward: the logits' gradient
     * (write + read), dX (summed over tp) and dW of the GEMM, the norm's backward. */
    const int h = n - 1;
    const double head_gemm = gemm(cl, N, Vl, C);
    L->f_gemm[h] = head_gemm;
    L->b_gemm[h] = 2.0 * head_gemm;
    /* Sequence parallelism: lnf gathered forward; backward, the input gradient
     * reduce-scattered and lnf gathered again (once more in a split W). */
    L->f_tp[h] = 3.0 * ts_plan_allreduce_time(N * f32, tp, tp_link) + ag_act;
    L->i_tp[h] = sp ? 2.0 * ag_act : ar_act;
    L->w_split_tp[h] = ag_act;
    L->f[h] = head_gemm +
              mem_time(cl, ab * (shared_bytes(cl, TS_ELEM_LAYERNORM, 2.0 * NL * C) + 3.0 * N * Vl)) +
              own_time(cl, TS_ELEM_LAYERNORM, 0, ab * 2.0 * NL * C, NL * C) + L->f_tp[h];
    L->i[h] = head_gemm +
              mem_time(cl, ab * (2.0 * N * Vl + shared_bytes(cl, TS_ELEM_LAYERNORM, 3.0 * NL * C))) +
              own_time(cl, TS_ELEM_LAYERNORM, 1, ab * 3.0 * NL * C, NL * C) + L->i_tp[h];
    L->w[h] = head_gemm;
    /* Multi-token prediction (model/mtp.c; all in the head's layer, so on the last
     * stage): each of the D modules looks the shifted tokens up in the shared embedding
     * (the embedding's gather and tp sum; its scatter-add in W), RMSNorms them and the
     * previous depth's hidden state (enorm, hnorm: read + write each, the concatenation
     * written), projects [2C] -> [C] (eh_proj, replicated over tp: NL rows), runs one
     * block of its index's kind (block n_layer + k - 1: dense or MoE, priced as the
     * model's), then the head again (shared_head.norm, the shared LM head, its
     * cross-entropy); backward, the same passes' gradients and the depth's hidden
     * gradient added into the one before (3 NL C). */
    const block_cost head = {.f = L->f[h], .i = L->i[h], .w = L->w[h], .f_gemm = L->f_gemm[h],
                             .b_gemm = L->b_gemm[h], .f_tp = L->f_tp[h], .i_tp = L->i_tp[h],
                             .w_split_tp = L->w_split_tp[h]};
    const double eh = gemm(cl, NL, C, 2.0 * C);
    for (int d = 1; d <= mc->mtp_layers; d++) {
        const block_cost *b =
            &bk[mc->moe_experts > 0 && ts_model_block_is_moe(mc, mc->n_layer + d - 1)];
        const double f_tp = (sp ? ag_act : ar_act) + b->f_tp + head.f_tp;
        const double i_tp = ag_act + b->i_tp + head.i_tp;
        L->f[h] += mem_time(cl, ab * (2.0 * N * C +
                                      shared_bytes(cl, TS_ELEM_LAYERNORM, 4.0 * NL * C) +
                                      2.0 * NL * C)) +
                   own_time(cl, TS_ELEM_LAYERNORM, 0, ab * 4.0 * NL * C, 2.0 * NL * C) + eh +
                   (sp ? ag_act : ar_act) + b->f + head.f;
        L->i[h] += mem_time(cl, ab * (shared_bytes(cl, TS_ELEM_LAYERNORM, 8.0 * NL * C) +
                                      4.0 * NL * C + 3.0 * NL * C)) +
                   own_time(cl, TS_ELEM_LAYERNORM, 1, ab * 8.0 * NL * C, 2.0 * NL * C) + eh +
                   ag_act + b->i + head.i;
        L->w[h] += mem_time(cl, ab * 3.0 * N * C) + eh + b->w + head.w;
        L->f_gemm[h] += eh + b->f_gemm + head.f_gemm;
        L->b_gemm[h] += 2.0 * eh + b->b_gemm + head.b_gemm;
        L->f_tp[h] += f_tp;
        L->i_tp[h] += i_tp;
        L->w_split_tp[h] += b->w_split_tp + head.w_split_tp;
        L->f_cp[h] += b->f_cp;
        L->i_cp[h] += b->i_cp;
        L->f_a2a[h] += b->f_a2a;
        L->i_a2a[h] += b->i_a2a;
        L->f_att[h] += b->f_att;
        moe_add(&L->moe[h], &b->moe);
    }
}

void ts_plan_layers_free(ts_plan_layers *L)
{
    double *arrays[] = {L->f, L->i, L->w, L->f_tp, L->i_tp, L->w_split_tp, L->f_gemm,
                        L->b_gemm, L->param_floats, L->act_bytes, L->stash_bytes, L->att_bytes,
                        L->f_att, L->f_cp, L->i_cp, L->f_a2a, L->i_a2a, L->expert_floats};
    for (size_t a = 0; a < sizeof arrays / sizeof *arrays; a++) free(arrays[a]);
    free(L->moe);
    free(L->muon);
    memset(L, 0, sizeof *L);
}

double ts_plan_chunk_param_floats(const ts_plan_layers *L, int l0, int l1)
{
    double p = 0.0;
    for (int l = l0; l < l1; l++) p += L->param_floats[l];
    if (l1 == L->n_layers && l0 > 0) p += L->wte_floats; /* the head's tied copy */
    return p;
}

/* Rank q's holdings from the per-layer tables: its parameters, each of its chunks'
 * activation and stash bytes into acts and stash, and its floats into floats_c
 * ([n_chunks]): the layers' own, and the head's chunk the tied copy when the rank lacks
 * the embedding (the layout keeps the copy among the head's parameters). sel_acts (NULL
 * where not wanted; [n_chunks]): each chunk's bytes laid out selective (its layers' less
 * their attention state, att_bytes, the model's own selective layout) for recompute =
 * "auto"'s choice, with the scratch then growing by the rebuilt area (rebuild_bytes).
 * res: ZeRO-2/3's residency of q, or NULL. */
static ts_memory_holdings rank_holdings(const ts_plan_layers *L, const ts_memory_shape *sh,
                                        const int *first_layer, const int *n_chunk_layers, int q,
                                        const ts_residency *res, double *acts, double *stash,
                                        double *sel_acts, double *floats_c)
{
    bool *owned = ts_calloc((size_t)L->n_layers, sizeof(bool));
    double floats = 0.0, xfloats = 0.0;
    ts_plan_muon mu = {0}; /* Muon's matrices (none under AdamW) */
    int head_chunk = -1;
    for (int c = 0; c < sh->n_chunks; c++) {
        if (sh->chunk_rank[c] != q) continue;
        const int l0 = first_layer[c], l1 = l0 + n_chunk_layers[c];
        if (l1 == L->n_layers) head_chunk = c;
        for (int l = l0; l < l1; l++) {
            owned[l] = true;
            floats_c[c] += L->param_floats[l];
            xfloats += L->expert_floats[l];
            if (L->muon) ts_plan_muon_sum(&mu, &L->muon[l]);
            acts[c] += L->act_bytes[l] - (sh->selective ? L->att_bytes[l] : 0.0);
            if (sel_acts) sel_acts[c] += L->act_bytes[l] - L->att_bytes[l];
            stash[c] += L->stash_bytes[l];
        }
        floats += floats_c[c];
    }
    if (head_chunk >= 0 && !owned[0]) {
        floats += L->wte_floats;
        floats_c[head_chunk] += L->wte_floats;
    }
    /* One end of a tied embedding split over the pipeline: its gradient's blocking sum
     * over the two ends (memory.h group_sum_copy). */
    const bool one_end = (head_chunk >= 0) != owned[0];
    const double group_sum_copy = one_end ? 4.0 * L->wte_floats / 2.0 : 0.0;
    free(owned);
    /* The routed experts shard over edp under an expert grid (memory.c's rule). */
    const bool split = L->ep > 1 || L->etp > 1;
    return (ts_memory_holdings){.param_floats = floats,
                                .expert_floats = split ? xfloats : 0.0,
                                .muon_floats = mu.floats, .muon_expert_floats = mu.xfloats,
                                .muon_max_floats = mu.max_floats,
                                .muon_buffer_bytes =
                                    L->muon ? ts_memory_muon_buffer_bytes(
                                                  mu.max_logical, mu.max_scratch,
                                                  mu.max_split_logical, mu.max_split_local)
                                            : 0.0,
                                .group_sum_copy = group_sum_copy,
                                .scratch_bytes = L->scratch_bytes +
                                                 (sh->selective ? L->rebuild_bytes : 0.0),
                                .act_bytes = acts, .stash_bytes = stash,
                                .sel_act_bytes = sel_acts,
                                .sel_scratch_bytes =
                                    sel_acts ? L->scratch_bytes + L->rebuild_bytes : 0.0,
                                .chunk_floats = res ? floats_c : NULL, .res = res};
}

void ts_plan_chunk_floats(const ts_plan_layers *L, const int *chunk_rank, int n_chunks,
                          const int *first_layer, const int *n_chunk_layers, int q,
                          double *floats_c)
{
    const ts_memory_shape sh = {.n_chunks = n_chunks, .chunk_rank = chunk_rank};
    double *acts = ts_calloc((size_t)n_chunks, sizeof(double));
    double *stash = ts_calloc((size_t)n_chunks, sizeof(double));
    for (int c = 0; c < n_chunks; c++)
        if (chunk_rank[c] == q) floats_c[c] = 0.0;
    rank_holdings(L, &sh, first_layer, n_chunk_layers, q, NULL, acts, stash, NULL, floats_c);
    free(acts);
    free(stash);
}

void ts_plan_rank_memory(const ts_plan_layers *L, const ts_memory_shape *sh,
                         const int *first_layer, const int *n_chunk_layers, const int *peak_acts,
                         const int *peak_stash, const int *n_recomputed, const bool *selective,
                         const ts_residency *res, int q, ts_rank_memory *out)
{
    const size_t n = (size_t)sh->n_chunks;
    double *acts = ts_calloc(n, sizeof(double)), *stash = ts_calloc(n, sizeof(double));
    double *sel = selective ? ts_calloc(n, sizeof(double)) : NULL;
    double *floats_c = ts_calloc(n, sizeof(double));
    ts_memory_holdings h =
        rank_holdings(L, sh, first_layer, n_chunk_layers, q, res, acts, stash, sel, floats_c);
    /* recompute = "auto"'s selective chunks: their sets laid out so, and the scratch with
     * the rebuilt area while any is (ts_memory_auto_keep_selective's rule). */
    bool any = false;
    for (size_t c = 0; selective && c < n; c++)
        if (sh->chunk_rank[c] == q && selective[c]) {
            acts[c] = sel[c];
            any = true;
        }
    if (any) h.scratch_bytes = h.sel_scratch_bytes;
    h.peak_acts = peak_acts;
    h.peak_stash = peak_stash;
    h.n_recomputed = n_recomputed;
    ts_memory_rank(sh, &h, q, out);
    free(acts);
    free(stash);
    free(sel);
    free(floats_c);
}

bool ts_plan_rank_auto(const ts_plan_layers *L, const ts_memory_shape *sh,
                       const int *first_layer, const int *n_chunk_layers, const ts_schedule *s,
                       const ts_residency *res, int q, double room, int *keep, bool *selective,
                       int *peak_acts, int *peak_stash, int *n_recomputed, ts_peak_memo *memo,
                       ts_rank_memory *out)
{
    const size_t n = (size_t)sh->n_chunks;
    double *acts = ts_calloc(n, sizeof(double)), *stash = ts_calloc(n, sizeof(double));
    double *sel = ts_calloc(n, sizeof(double)), *floats_c = ts_calloc(n, sizeof(double));
    ts_memory_holdings h =
        rank_holdings(L, sh, first_layer, n_chunk_layers, q, res, acts, stash, sel, floats_c);
    h.peak_memo = memo;
    const bool fits = ts_memory_auto_keep_selective(s, sh, &h, q, room, keep, selective,
                                                    peak_acts, peak_stash, n_recomputed, out);
    free(acts);
    free(stash);
    free(sel);
    free(floats_c);
    return fits;
}

double ts_plan_flops_params(const ts_model_config *mc)
{
    /* A lookup multiplies nothing: an untied input embedding leaves the count (the
     * head's own lm_head stays: the logits' GEMM), and so does gpt2's position table
     * (nanoGPT's and llm.c's counts leave it out too); a tied embedding stays once, as
     * the head's matrix. */
    const double C = mc->n_embd;
    const double lookups = (ts_model_tied(mc) ? 0.0 : (double)mc->vocab_size * C) +
                           (ts_model_arch(mc) == TS_ARCH_LLAMA ? 0.0 : (double)mc->seq_len * C);
    /* The main model's: ts_model_active_params counts the MTP modules too, which
     * ts_plan_mtp_flops_params prices (with the head they multiply once more). */
    ts_model_config main = *mc;
    main.mtp_layers = 0;
    return (double)ts_model_active_params(&main) - lookups;
}

double ts_plan_model_flops(const ts_model_config *mc, int global_batch)
{
    /* Attention per query head: QK^T and AV, 2 * 2 * T * head_dim per token forward,
     * tripled for forward + backward: 12 * T * n_head * head_dim per layer and token
     * (n_head * head_dim = n_embd unless model.head_dim says otherwise; grouped-query
     * attention shares k and v between query heads but computes as many scores; MLA:
     * 6 T n_head (nope + rope + v)). An MoE model counts the parameters a token uses
     * (ts_model_active_params: Megatron's MFU counts active FLOPs only), and no model its
     * embeddings' lookups (ts_plan_flops_params: Megatron counts the logit layer alone).
     * Multi-token prediction's modules count as Megatron counts them
     * (ts_plan_mtp_flops_params and their blocks' attention). */
    const double tokens = (double)global_batch * mc->seq_len;
    /* the square: global_batch * T^2 pairs (ts_plan_model_flops_pairs's sum, as it was) */
    return 6.0 * (ts_plan_flops_params(mc) + ts_plan_mtp_flops_params(mc)) * tokens +
           ts_plan_attention_flops_per_token(mc) * tokens;
}

double ts_plan_model_flops_pairs(const ts_model_config *mc, double tokens, double pairs)
{
    return 6.0 * (ts_plan_flops_params(mc) + ts_plan_mtp_flops_params(mc)) * tokens +
           ts_plan_attention_flops_per_pair(mc) * pairs;
}

double ts_plan_doc_pairs(int T, int doc_len)
{
    /* documents of doc_len tokens from the window's start, the last one cut by its end */
    const double L = doc_len > 0 && doc_len < T ? doc_len : T;
    const double n = floor(T / L), r = T - n * L;
    return n * L * (L + 1.0) / 2.0 + r * (r + 1.0) / 2.0;
}

double ts_plan_model_flops_docs(const ts_model_config *mc, int global_batch, int doc_len)
{
    if (doc_len <= 0) return ts_plan_model_flops(mc, global_batch);
    const double tokens = (double)global_batch * mc->seq_len;
    const double pairs = (double)global_batch * ts_plan_doc_pairs(mc->seq_len, doc_len);
    return ts_plan_model_flops_pairs(mc, tokens, pairs);
}

double ts_plan_mtp_flops_params(const ts_model_config *mc)
{
    if (mc->mtp_layers <= 0) return 0.0;
    /* The D modules' blocks are blocks n_layer .. n_layer + D - 1 of the same model (the
     * MoE rule by index): what D more blocks add to the active count, without touching
     * its formula. */
    ts_model_config base = *mc;
    base.mtp_layers = 0;
    ts_model_config more = base;
    more.n_layer += mc->mtp_layers;
    const double C = mc->n_embd;
    const double blocks =
        (double)ts_model_active_params(&more) - (double)ts_model_active_params(&base);
    /* Per depth: enorm, hnorm, shared_head.norm, eh_proj [C, 2C] and the shared LM
     * head's logits (the head counted again: it multiplies once more per depth). */
    return blocks + mc->mtp_layers * (3.0 * C + 2.0 * C * C + (double)mc->vocab_size * C);
}

double ts_plan_attention_flops_per_pair(const ts_model_config *mc)
{
    /* Per query head and (query, key) pair: q.k over hs channels (2 hs) and the weighted
     * value (2 hv) forward, tripled with the backward. */
    const double blocks = (double)mc->n_layer + (mc->mtp_layers > 0 ? mc->mtp_layers : 0);
    if (ts_model_is_mla(mc))
        return 6.0 * blocks * mc->n_head *
               (double)(mc->qk_nope_head_dim + mc->qk_rope_head_dim + mc->v_head_dim);
    return 12.0 * blocks * mc->n_head * (double)ts_model_head_dim(mc);
}

double ts_plan_attention_flops_per_token(const ts_model_config *mc)
{
    /* the full T x T square: T pairs per query */
    return ts_plan_attention_flops_per_pair(mc) * (double)mc->seq_len;
}

double ts_plan_flops_per_token(const ts_model_config *mc)
{
    return ts_plan_model_flops(mc, 1) / mc->seq_len;
}
