/* The compute kernels behind one small interface, so the model code never names a
 * backend. The CPU backend is OpenBLAS + OpenMP (src/kernels/cpu); the CUDA backend
 * fills the same table with device pointers (src/kernels/cuda). A table also says what
 * it is and what it needs (its device and precision, where its memory lives, the extra
 * weight copies it keeps, the device it binds to), so callers choose and size a backend
 * by asking the table (ts_kernels_for), never by naming one.
 *
 * Conventions (llm.c style: every buffer passed, shapes in the signature):
 * - Activations are row-major [N, C] with N = B*T rows, in the table's act_dtype: the
 *   `void *` arguments below (layer inputs and outputs, attention's saved state, the
 *   logits, activation gradients). A bf16 table loads them as bf16, computes in fp32
 *   (GEMMs accumulate in fp32; norms, softmax and cross-entropy run in fp32) and
 *   stores bf16. `float *` arguments are fp32 whatever the table: parameters' master
 *   copies (LayerNorm weights, biases, the embedding tables), parameter gradients,
 *   LayerNorm statistics, losses and the optimizer's buffers.
 * - A matmul's `weight` is the model's compute copy of that weight, in act_dtype (the
 *   master weights themselves for fp32; a bf16 copy cast once per optimizer step for
 *   bf16, model/model.h ts_model_refresh_compute).
 * - Parameter gradients ACCUMULATE (+=): micro-batches add into one gradient buffer.
 * - Input gradients are OVERWRITTEN (=) unless the comment says "+=".
 * - Weights follow nanoGPT/PyTorch nn.Linear: weight[OC, C], out = inp @ weight^T + bias.
 */
#ifndef TS_KERNELS_H
#define TS_KERNELS_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus /* the CUDA backend's files are C++ (nvcc) */
extern "C" {
#endif

/* A backend's stream (an ordered queue of kernels and copies; a CUDA stream) and event
 * (a point in a stream that can be waited for). Opaque; the CPU backend runs everything
 * in order on the calling thread, so its streams and events are NULL and its calls
 * no-ops. */
typedef struct ts_stream_s *ts_stream;
typedef struct ts_event_s *ts_event;

/* The element type of activation memory. bf16: the upper half of an IEEE fp32 (8
 * exponent bits, 7 mantissa bits), rounded to nearest even from fp32. */
typedef enum { TS_DTYPE_F32, TS_DTYPE_BF16 } ts_dtype;

static inline size_t ts_dtype_bytes(ts_dtype t) { return t == TS_DTYPE_BF16 ? 2 : 4; }
static inline const char *ts_dtype_name(ts_dtype t) { return t == TS_DTYPE_BF16 ? "bf16" : "fp32"; }

/* One piece of the flat buffers for adamw_update_spans: `count` floats of param from
 * `offset` and of grad from `grad_offset` (the same place in a full-size gradient
 * buffer; a compact shard's own place with ZeRO-2/3), whose moments are m and v from
 * `moment_offset`; weight decay
 * applies when `decay` is 1 (matrices), not when 0 (biases, LayerNorm). The optimizer
 * makes one per parameter inside each of its ranges (ZeRO-1 shard pieces included).
 * Plain fields: the same layout in C and in CUDA C++ (nvcc keeps the host's sizes). */
typedef struct {
    size_t offset;
    size_t grad_offset;
    size_t moment_offset;
    size_t count;
    int decay;
} ts_adamw_span;

/* How a mixture-of-experts layer routes its tokens (the model's moe_* keys): E experts,
 * each token to K of them; with groups > 1 (E % groups == 0) only the experts of the
 * topk_groups best groups compete (DeepSeek-V3's group-limited routing; each kept group
 * scored by the sum of its top K / topk_groups selection values, so topk_groups divides
 * K and K / topk_groups <= E / groups); sigmoid scores instead of softmax; norm_topk
 * renormalises the K weights to sum 1 before route_scale multiplies them. The kernels
 * take E up to 1024 on the CPU and 256 on CUDA (K <= 64, groups <= 64 there), and abort
 * on a routing outside these rules (the config is to refuse such a model before a run
 * starts). Plain fields: the same layout in C and in CUDA C++. */
typedef struct {
    int E, K, groups, topk_groups;
    bool sigmoid, norm_topk;
    float route_scale;
} ts_moe_routing;

/* The heads of one attention call (the attention and RoPE slots below): NH query heads
 * sharing NKV key/value heads (NH % NKV == 0: query head h reads key/value head
 * h / (NH/NKV); NKV == NH is multi-head, 1 multi-query); each q and k head HS channels,
 * each v head, and so each output head, HSV channels; softmax(scale q.k). Grouped-query
 * attention has HSV == HS and scale 1/sqrt(HS) (ts_att_heads_gqa); multi-head latent
 * attention (DeepSeek-V3) has HS = qk_nope + qk_rope > HSV = v_head_dim and, with YaRN,
 * scale = mscale^2 / sqrt(HS). Plain fields: the same layout in C and in CUDA C++. */
typedef struct {
    int NH, NKV; /* query heads, key/value heads (NH % NKV == 0) */
    int HS;      /* channels of each q and each k head */
    int HSV;     /* channels of each v head, and of each output head */
    float scale; /* the softmax scale: 1/sqrt(HS) unless the model says (MLA's YaRN mscale^2) */
    const int *doc_start; /* NULL: causal; else [B,Tq] int32 in the backend's memory: query
                           * t's first visible key (docs/ARCHITECTURE.md "Packed documents") */
} ts_att_heads;

/* Grouped-query (and multi-head) attention's heads: HSV = HS, scale = 1/sqrt(HS) (the
 * bits the kernels computed before they took a scale). */
static inline ts_att_heads ts_att_heads_gqa(int NH, int NKV, int HS)
{
    ts_att_heads h;
    h.NH = NH;
    h.NKV = NKV;
    h.HS = HS;
    h.HSV = HS;
    h.scale = 1.0f / sqrtf((float)HS);
    h.doc_start = NULL;
    return h;
}

/* Row widths in elements: a qkv row [NH*HS q | NKV*HS k | NKV*HSV v], a prefix kv row
 * [NKV*HS k | NKV*HSV v], an output row [NH*HSV]. */
static inline size_t ts_att_qkv_width(ts_att_heads h)
{
    return (size_t)h.NH * h.HS + (size_t)h.NKV * (h.HS + h.HSV);
}
static inline size_t ts_att_kv_width(ts_att_heads h) { return (size_t)h.NKV * (h.HS + h.HSV); }
static inline size_t ts_att_out_width(ts_att_heads h) { return (size_t)h.NH * h.HSV; }

/* offsets[e] = counts[0] + ... + counts[e-1] (the exclusive prefix sum moe_permute takes,
 * on the host: counts come back from moe_count); returns the total, N*K for one layer's
 * routing. */
int ts_moe_offsets(int *offsets, const int *counts, int E);

/* A dropped assignment (model.moe_capacity > 0): the expert index moe_capacity writes
 * for it, and the row moe_permute gives it. The dispatch kernels skip it: it is not
 * counted, not permuted, contributes nothing to the combine, and its weight's gradient
 * is 0 (docs/ARCHITECTURE.md "Mixture of Experts": capacity). */
#define TS_MOE_DROPPED (-1)

/* The capacity decision on host memory (kernels.h's moe_capacity slot, which the CPU
 * tables run through it): the caller's when the assignments were gathered on the host
 * (model/moe.c, a sequence split over context- or sequence-parallel ranks). */
void ts_moe_capacity_keep(int *keep, const int *topk_idx, const float *topk_w, int N, int K,
                          int E, int T, int capacity);

typedef struct ts_kernels {
    const char *name;

    /* ---- what the table is and needs. train.device, train.precision and
     * train.attention select it (ts_kernels_for). */
    const char *device;    /* "cpu", "cpu-strict", "cuda" (each with an fp32 and a bf16
                              table: "cpu-bf16" is device "cpu", precision "bf16") */
    const char *precision; /* "fp32", or "bf16": bf16 activations and compute weights */
    ts_dtype act_dtype;    /* the element type of every `void *` argument below */
    const char *attention; /* "gemm" (the backend's default attention) or "flash" */
    /* The run's buffers live in an accelerator's memory (checked against its free
     * memory), not in the host's (checked against the node's RAM and ulimit -v). */
    bool device_memory;
    /* Bytes per parameter of the compute weights kept beside the fp32 master weights
     * (the model's bf16 copy: 2; fp32 computes on the master weights: 0). */
    int weight_copy_bytes;
    /* The comm backend that moves this memory on the device where it is built ("nccl"
     * for CUDA, comm/comm.h), or NULL: MPI, in place or through host bounce copies. */
    const char *native_comm;
    /* The devices this process sees (0: no driver or no device; never aborts), binding
     * this process to device `ordinal` (before any other slot: streams and handles are
     * made on the current device), the bound device, and its free and total memory
     * (false when the backend cannot say). All NULL on host backends. */
    int (*device_count)(void);
    int (*select_device)(int ordinal);
    int (*current_device)(void);
    bool (*memory_info)(size_t *free_bytes, size_t *total_bytes);

    /* ---- memory and ordering. Device buffers (parameters, gradients, moments,
     * activations, scratch, pipeline buffers) come from dev_alloc and are read or written
     * by host code only through these copies; every kernel below takes device pointers.
     * host_accessible: device pointers are ordinary host memory (the CPU backend), so a
     * caller may skip a staging copy as an optimisation, never for correctness. */
    bool host_accessible;
    /* `bytes` of zeroed device memory, 64-byte aligned; aborts when out of memory (a run
     * cannot continue without it). NULL for 0 bytes. */
    void *(*dev_alloc)(size_t bytes);
    void (*dev_free)(void *p);
    void (*memcpy_h2d)(void *dst, const void *src, size_t bytes);
    void (*memcpy_d2h)(void *dst, const void *src, size_t bytes);
    /* dst and src may overlap (memmove's rule): ZeRO-1 moves a rank's reduced piece
     * within the gradient buffer. */
    void (*memcpy_d2d)(void *dst, const void *src, size_t bytes);
    /* `rows` rows of `width` bytes, row i from src + i*spitch to dst + i*dpitch (device
     * memory both; not overlapping): a column block of a row-major buffer, such as the
     * K and V columns of qkv that context parallelism exchanges (tensor/cp.c). CUDA:
     * cudaMemcpy2DAsync on the compute stream. */
    void (*memcpy_2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t rows);
    void (*memset_zero)(void *dst, size_t bytes);
    /* dst[i] = src[i] converted, i < n (fp32 -> bf16 rounds to nearest even, NaN stays
     * NaN, fp32 subnormals become signed zero as AVX512_BF16's VCVTNEPS2BF16 makes them;
     * bf16 -> fp32 is exact; equal types copy). dst and src do not overlap unless the
     * types are equal. Queued like a kernel (CUDA: on the compute stream). The compute
     * weights' refresh and staging between fp32 and activation buffers. */
    void (*convert)(void *dst, ts_dtype dst_type, const void *src, ts_dtype src_type, size_t n);
    /* acc[0] += sum of x[0..n), and of its squares, in double; acc is device memory, so a
     * step's loss and norm partial sums stay on the device until one copy reads them. */
    void (*sum_into)(double *acc, const float *x, size_t n);
    void (*sum_squares_into)(double *acc, const float *x, size_t n);
    ts_stream (*stream_create)(void);
    void (*stream_destroy)(ts_stream s);
    void (*stream_sync)(ts_stream s);  /* wait until everything queued on s is done */
    ts_event (*event_record)(ts_stream s);
    void (*event_wait)(ts_event e);    /* the host waits for it, then it is released */

    /* ---- what the kernels keep: the saved state attention_forward leaves for its
     * backward (`att`) and attention_backward's workspace, in bytes. The backend
     * chooses (the CPU and CUDA's batched-GEMM attention keep the probabilities
     * [B,NH,T,T] in act_dtype; CUDA's flash-style kernel keeps one fp32 log-sum-exp per
     * row [B,NH,T]); the model sizes its buffers from these and starts both on a
     * 64-byte boundary (a bf16 table may keep fp32 pieces in them). */
    size_t (*attention_saved_bytes)(int B, int T, ts_att_heads h);
    size_t (*attention_scratch_bytes)(int B, int T, ts_att_heads h);
    /* The same for attention_prefix_forward's Tq queries against Tk keys (the CPU
     * tables: the probabilities [B,NH,Tq,Tk] in act_dtype; scratch dS as large). NULL
     * with the prefix kernels (see attention_prefix_forward). */
    size_t (*attention_prefix_saved_bytes)(int B, int Tq, int Tk, ts_att_heads h);
    size_t (*attention_prefix_scratch_bytes)(int B, int Tq, int Tk, ts_att_heads h);

    /* out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :].  tokens [B,T], wte [V,C], wpe [>=T,C];
     * wpe NULL: no position embedding (llama: rotary embeddings instead). */
    void (*encoder_forward)(void *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
    /* dwte[tokens[b,t], :] += dout[b,t,:];  dwpe[t,:] += sum_b dout[b,t,:] (dwpe NULL:
     * none). */
    void (*encoder_backward)(float *dwte, float *dwpe, const void *dout, const int *tokens,
                             int B, int T, int C);

    /* LayerNorm over the last axis (eps 1e-5). mean, rstd [N] are saved for backward. */
    void (*layernorm_forward)(void *out, float *mean, float *rstd, const void *inp,
                              const float *weight, const float *bias, int N, int C);
    /* dinp += ..., dweight += ..., dbias += ...  (dinp ACCUMULATES: it is the residual
     * stream's gradient). */
    void (*layernorm_backward)(void *dinp, float *dweight, float *dbias, const void *dout,
                               const void *inp, const float *weight, const float *mean,
                               const float *rstd, int N, int C);

    /* RMSNorm over the last axis (llama; Zhang & Sennrich 2019, Hugging Face's
     * LlamaRMSNorm): out = inp * rstd * weight with rstd[n] = 1/sqrt(mean_c(inp[n,c]^2) +
     * eps), in fp32; rstd [N] is saved for backward. No bias, no mean. */
    void (*rmsnorm_forward)(void *out, float *rstd, const void *inp, const float *weight, int N,
                            int C, float eps);
    /* dinp += ..., dweight += ... (dinp ACCUMULATES, as layernorm_backward's). */
    void (*rmsnorm_backward)(void *dinp, float *dweight, const void *dout, const void *inp,
                             const float *weight, const float *rstd, int N, int C);
    /* residual_forward then rmsnorm_forward in one pass over the rows (res_out may alias
     * a or b); the same bits as the two calls. */
    void (*residual_rmsnorm_forward)(void *res_out, void *norm_out, float *rstd, const void *a,
                                     const void *b, const float *weight, int N, int C,
                                     float eps);

    /* Rotary position embeddings (RoPE), in place on the NH query and NKV key heads of
     * qkv [B,T,NH*HS + NKV*HS + NKV*HSV] (ts_att_qkv_width; the value heads are
     * untouched): the LAST RD channels of each q and k head are rotated (RD even,
     * 0 < RD <= HS; RD == HS: the whole head, llama's; RD < HS: DeepSeek-V3's decoupled
     * rope part after its no-rope part), the first HS - RD are not. With x the head's
     * rotated part (x[0..RD)), at position t, c_i = cos[t*RD/2 + i] and s_i = sin[t*RD/2 +
     * i] (tables [T, RD/2] in fp32, the model's), i < RD/2, pair (a, b) is rotated as
     *   x[a]' = x[a] c_i - x[b] s_i,   x[b]' = x[b] c_i + x[a] s_i
     * with (a, b) = (i, i + RD/2) when !interleaved (Hugging Face's x*cos +
     * rotate_half(x)*sin, rotate_half(x) = cat(-x[RD/2:], x[:RD/2])), and (2i, 2i + 1)
     * when interleaved (DeepSeek's checkpoints: adjacent pairs, the complex form; it gives
     * the q.k of HF's apply_rotary_pos_emb_interleave, which de-interleaves q and k alike
     * before rotating halves, so no weight permutation is needed). h.NKV may be 0: rows
     * of NH heads of HS alone (a buffer of q heads; or NH = 1, HS = the row's width: the
     * last RD channels of each row, such as MLA's shared k_pe after its latent). */
    void (*rope_forward)(void *qkv, const float *cos, const float *sin, int B, int T,
                         ts_att_heads h, int RD, bool interleaved);
    /* The backward, in place on the q and k heads of dqkv: the inverse rotation
     * (dx[a] = d[a] c + d[b] s, dx[b] = d[b] c - d[a] s). */
    void (*rope_backward)(void *dqkv, const float *cos, const float *sin, int B, int T,
                          ts_att_heads h, int RD, bool interleaved);

    /* SwiGLU (llama's MLP between its gate/up and down projections): inp [N, 2F] holds
     * each row's gate columns then its up columns; out[N,F] = silu(gate) * up with
     * silu(x) = x * sigmoid(x), in fp32. */
    void (*swiglu_forward)(void *out, const void *inp, int N, int F);
    /* dinp [N, 2F] = the gradients of gate and up (overwritten; dinp does not alias
     * inp or dout). */
    void (*swiglu_backward)(void *dinp, const void *inp, const void *dout, int N, int F);

    /* ---- mixture of experts (docs/ARCHITECTURE.md): a router, then each token's rows
     * sorted by expert (all, or those a capacity keeps), the experts' own matmul/swiglu
     * calls on their row ranges, and a weighted sum back. logits, scores, weights and their
     * gradients are fp32 [N,E] / [N,K] whatever the table; topk_idx [N,K], counts [E],
     * offsets [E] and row_of [N*K] are int32; only the token rows (x, xp, yp, out and
     * their gradients) are act_dtype. r is host memory (device backends take it by
     * value); every other pointer is device memory. Every result is the same bits at any
     * thread count.
     * A table without these slots (NULL) cannot run an MoE model; the model refuses it.
     *
     * Routing, per row n in fp32: scores = softmax(logits) (or sigmoid with r->sigmoid);
     * the selection ranks sel = scores + bias (bias[E] may be NULL: 0; it changes the
     * choice only, never a weight), group-limited when r->groups > 1; topk_idx[n, 0..K)
     * in descending order of sel, ties to the lower expert (and group) index; topk_w =
     * the chosen scores, divided by (their sum + 1e-20) with r->norm_topk, times
     * r->route_scale. */
    void (*moe_route_forward)(const ts_moe_routing *r, float *scores, int *topk_idx,
                              float *topk_w, const float *logits, const float *bias, int N);
    /* dlogits[N,E] (overwritten) from dtopk_w[N,K] through the renormalisation and the
     * scores' Jacobian (the whole row's softmax, or the sigmoid); the selection has no
     * gradient. */
    void (*moe_route_backward)(const ts_moe_routing *r, float *dlogits, const float *dtopk_w,
                               const float *scores, const int *topk_idx, int N);
    /* The auxiliary losses of N rows (whole sequences of T rows each, N % T == 0), with
     * their gradients ADDED into dlogits[N,E]:
     *   z-loss: *z_loss += cz * z_scale * sum_n logsumexp(logits_n)^2;
     *   sequence-wise balance loss (DeepSeek-V3), per sequence s: with p_n = scores_n /
     *   sum_j scores_nj, f_i = E / (K T) * (tokens of s whose top-K holds i) and
     *   P_i = (1/T) sum_{n in s} p_ni: *aux_loss += ca * aux_scale * sum_s sum_i f_i P_i
     *   (f is a count: no gradient through it).
     * The caller's scales make any split of the global batch give the same sums:
     * z_scale = 1/(sequences in the global batch * T), aux_scale = 1/(sequences). A term
     * whose coefficient (cz, ca) is 0 is skipped: no loss, no gradient. z_loss and
     * aux_loss are one fp32 each in device memory. */
    void (*moe_aux_forward_backward)(const ts_moe_routing *r, float *z_loss, float *aux_loss,
                                     float *dlogits, const float *logits, const float *scores,
                                     const int *topk_idx, int N, int T, float cz, float ca,
                                     float z_scale, float aux_scale);
    /* The balance loss above on N rows that may be parts of sequences (context or
     * sequence parallelism split a sequence over ranks): row n belongs to sequence
     * q = (row0 + n) / rows_per_seq of the micro-batch, whose WHOLE counts are given,
     * seq_counts[q*E + e] (device memory: every rank's tokens of sequence q whose top-K
     * holds e, the caller's sum), and T is the whole sequence's length. Adds these rows'
     * share of the loss, ca * aux_scale * sum_n (1/T) sum_i f_i p_ni, into *aux_loss and
     * its gradient into dlogits: the shares of every rank holding a sequence sum to
     * moe_aux_forward_backward's loss, and each row's gradient is the one it gives there
     * (bit for bit, from the same counts). ca == 0: nothing. */
    void (*moe_balance_forward_backward)(const ts_moe_routing *r, float *aux_loss,
                                         float *dlogits, const float *scores,
                                         const int *seq_counts, int N, int row0,
                                         int rows_per_seq, int T, float ca, float aux_scale);
    /* counts[e] += how many of topk_idx[N*K] are e (the host then takes ts_moe_offsets);
     * TS_MOE_DROPPED entries count nowhere. */
    void (*moe_count)(int *counts, const int *topk_idx, int N, int K, int E);
    /* The dispatch: assignment a = n*K + k (token n's k-th expert e = topk_idx[a]) goes to
     * row row_of[a] of xp[N*K, C], its expert's rows starting at offsets[e] (the
     * exclusive prefix sum of this topk_idx's counts), in order of n then k within an
     * expert (a stable sort); xp's row is x[n]'s, copied. A dropped assignment
     * (topk_idx[a] == TS_MOE_DROPPED) gets row_of[a] = TS_MOE_DROPPED and no row: xp's
     * rows past the kept count are untouched. */
    void (*moe_permute)(void *xp, int *row_of, const void *x, const int *topk_idx,
                        const int *offsets, int N, int K, int C, int E);
    /* out[n] = sum over k = 0..K-1 in order of topk_w[n,k] * yp[row_of[n*K+k]]: fp32
     * products and sum, one rounding to act_dtype. out[N,C] is overwritten. Dropped
     * assignments (row_of TS_MOE_DROPPED) are left out of the sum (all K dropped: 0). */
    void (*moe_combine)(void *out, const void *yp, const float *topk_w, const int *row_of,
                        int N, int K, int C);
    /* Its backward: dyp[row_of[n*K+k]] = topk_w[n,k] * dout[n] (every kept row of
     * dyp[N*K,C] overwritten) and dtopk_w[n,k] = <dout[n], yp[row_of[n*K+k]]> (fp32,
     * overwritten; 0 for a dropped assignment, which writes no row). */
    void (*moe_combine_backward)(void *dyp, float *dtopk_w, const void *dout, const void *yp,
                                 const float *topk_w, const int *row_of, int N, int K, int C);
    /* moe_permute's backward: dx[n] = sum over the kept k = 0..K-1 in order of
     * dxp[row_of[n*K+k]] (fp32 sum, one rounding; 0 when all are dropped; dx[N,C]
     * overwritten). */
    void (*moe_permute_backward)(void *dx, const void *dxp, const int *row_of, int N, int K,
                                 int C);
    /* The capacity (model.moe_capacity > 0, Megatron's drop policy "probs"): the N rows
     * are N / T whole sequences of T rows in position order (N % T == 0); within each
     * sequence each expert keeps the `capacity` assignments (0 <= capacity) of the
     * largest weight topk_w and drops the rest, ties to the earlier position (a token
     * holds an expert once, so the order is total; weights compare as their fp32 bit
     * patterns ordered as numbers: -0 below +0, the same on every backend). keep[a] =
     * topk_idx[a] when kept, TS_MOE_DROPPED when dropped (keep[N*K] int32 does not alias
     * its inputs), ready for moe_count and moe_permute. */
    void (*moe_capacity)(int *keep, const int *topk_idx, const float *topk_w, int N, int K,
                         int E, int T, int capacity);

    /* out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC] (bias may be NULL; fp32, added
     * before the one rounding to act_dtype). */
    void (*matmul_forward)(void *out, const void *inp, const void *weight, const float *bias,
                           int N, int C, int OC);
    /* dinp[N,C] = dout @ weight (skipped when dinp is NULL);
     * dweight[OC,C] += dout^T @ inp (skipped when dweight is NULL);
     * dbias[OC] += sum over rows of dout (if dbias). */
    void (*matmul_backward)(void *dinp, float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *weight, int N, int C, int OC);

    /* Grouped GEMMs: one nn.Linear product per expert for the L local experts of a
     * mixture-of-experts layer, each on its own rows with its own weight, in one call
     * (the experts' gate/up and down projections around one SwiGLU over all rows).
     * rows[L] is HOST memory (the counts the MoE layer already holds on the host): expert
     * e's rows are [o_e, o_e + rows[e]) of every row buffer, o_e = rows[0] + ... +
     * rows[e-1] (the permuted, expert-major order); an expert may have none (skipped: its
     * dweight untouched). weights[L] and dweights[L] are host arrays of device pointers:
     * expert e's weight [OC,C] in act_dtype and its fp32 gradient. No bias.
     * out[sum rows, OC] = per expert inp_e @ weight_e^T. Each expert's rows get the
     * products matmul_forward / matmul_backward give them alone (the CPU fp32 table: the
     * same bits, whichever thread computes which expert; a row's result never depends on
     * the other experts' rows). */
    void (*grouped_matmul_forward)(void *out, const void *inp, const void *const *weights,
                                   const int *rows, int L, int C, int OC);
    /* dinp[sum rows, C] = per expert dout_e @ weight_e (skipped when dinp is NULL);
     * dweights[e][OC,C] += dout_e^T @ inp_e (skipped when dweights is NULL). */
    void (*grouped_matmul_backward)(void *dinp, float *const *dweights, const void *dout,
                                    const void *inp, const void *const *weights,
                                    const int *rows, int L, int C, int OC);

    /* Causal attention with the heads h (ts_att_heads: NH query heads on NKV key/value
     * heads, grouped-query when NKV < NH; q and k heads of HS channels, v heads of HSV).
     * qkv [B,T,NH*HS + NKV*HS + NKV*HSV] (ts_att_qkv_width): each row holds the NH q heads
     * (head i at columns i*HS..i*HS+HS), then the NKV k heads (head j at NH*HS + j*HS),
     * then the NKV v heads (head j at NH*HS + NKV*HS + j*HSV): nanoGPT's order when NKV ==
     * NH and HSV == HS. out [B,T,NH*HSV] (heads concatenated, head i at i*HSV). Scores
     * scale * q.k (h.scale), softmax in fp32. att receives the backend's saved state
     * (attention_saved_bytes: the softmax probabilities [B,NH,T,T], zero above the
     * diagonal, or a flash kernel's log-sum-exp), kept for backward.
     * Per-call fp32 workspace (a few rows of scores per thread) is the backend's own. */
    void (*attention_forward)(void *out, void *att, const void *qkv, int B, int T,
                              ts_att_heads h);
    /* dqkv [B,T,NH*HS + NKV*HS + NKV*HSV] = gradient of the above (a key/value head's
     * gradient sums over its query heads); scratch: attention_scratch_bytes. */
    void (*attention_backward)(void *dqkv, void *scratch, const void *dout, const void *qkv,
                               const void *att, int B, int T, ts_att_heads h);

    /* Context parallelism's attention (Megatron/Llama 3 style: a cp rank's chunk of
     * queries against the key/value prefix gathered from its group). Causal attention
     * of Tq queries that are the LAST Tq positions of Tk >= Tq keys (the bottom-right
     * aligned mask of inference with a KV cache): query t, 0 <= t < Tq, sits at key
     * position t + (Tk - Tq) and attends keys 0..t + (Tk - Tq). Tq == Tk is
     * attention_forward. q is read from qkv [B,Tq,NH*HS + NKV*HS + NKV*HSV] (the NH q
     * heads, columns 0..NH*HS of each row, as attention_forward reads them; its k and v
     * columns are not read); keys and values from kv [B,Tk,NKV*HS + NKV*HSV]
     * (ts_att_kv_width; each row: the NKV k heads of HS, then the NKV v heads of HSV).
     * Heads and scale as attention_forward. out [B,Tq,NH*HSV]. att receives the saved state
     * (attention_prefix_saved_bytes; the CPU tables: the probabilities [B,NH,Tq,Tk],
     * exactly 0 where masked; CUDA's batched-GEMM kernels keep the same). Every runnable
     * table fills these four slots (the layout-only CUDA tables size them only). Every
     * buffer is dense over its batch (a
     * batch's rows follow the previous batch's): with B > 1, a chunk of the rows of a
     * [B,T,...] buffer is no [B,Tq,...] buffer, so a caller packs it or calls once per
     * batch (B = 1, pointers advanced by a batch's rows). */
    void (*attention_prefix_forward)(void *out, void *att, const void *qkv, const void *kv,
                                     int B, int Tq, int Tk, ts_att_heads h);
    /* Its backward: dqkv's q columns (0..NH*HS of each row) = dQ, overwritten; dqkv's k
     * and v columns are untouched. dkv [B,Tk,NKV*HS + NKV*HSV] += dK, dV (ACCUMULATES: the
     * backwards of a rank's two chunks add into one gathered buffer, which the caller
     * then reduce-scatters; a bf16 table sums each call's share in fp32 onto the
     * buffer's values and rounds once per call). scratch:
     * attention_prefix_scratch_bytes. */
    void (*attention_prefix_backward)(void *dqkv, void *dkv, void *scratch, const void *dout,
                                      const void *qkv, const void *kv, const void *att, int B,
                                      int Tq, int Tk, ts_att_heads h);

    /* GELU, tanh approximation. */
    void (*gelu_forward)(void *out, const void *inp, size_t n);
    /* dinp = gelu'(inp) * dout; dinp may alias dout. */
    void (*gelu_backward)(void *dinp, const void *inp, const void *dout, size_t n);

    /* out = a + b (out may alias a or b). */
    void (*residual_forward)(void *out, const void *a, const void *b, size_t n);
    /* residual_forward then layernorm_forward, one pass over the rows:
     * res_out[N,C] = a + b (res_out may alias a or b), ln_out = LayerNorm(res_out) with
     * mean, rstd [N] saved. The same bits as the two calls (a block's x + attn(...) and
     * its ln_2, without reading the sum back from memory; in bf16 the LayerNorm reads
     * the rounded sum, as the two calls would). */
    void (*residual_layernorm_forward)(void *res_out, void *ln_out, float *mean, float *rstd,
                                       const void *a, const void *b, const float *weight,
                                       const float *bias, int N, int C);

    /* Fused softmax + cross-entropy, in place, no second [N,V] buffer:
     * on entry logits[N,V]; on exit the same memory holds
     * dlogits = (softmax(logits) - onehot(target)) * dloss, and losses[n] =
     * -log softmax(logits[n])[targets[n]]. dloss is the loss's weight per row
     * (1 / (rows in the global batch) for a mean). */
    void (*crossentropy_forward_backward)(float *losses, void *logits, const int *targets,
                                          int N, int V, float dloss);

    /* Reference slot (tests and benchmarks compare adamw_update_spans and the device
     * backends against it; the optimizer calls adamw_update_spans).
     * torch.optim.AdamW on n elements, step t >= 1 (bias correction), on the gradient
     * g = grad_scale * grad (the clipping coefficient, applied here rather than in a
     * separate pass over the whole gradient buffer; grad itself is left unchanged):
     * p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
     * p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps). */
    void (*adamw_update)(float *param, const float *grad, float grad_scale, float *m, float *v,
                         size_t n, float lr, float beta1, float beta2, float eps,
                         float weight_decay, int t);
    /* adamw_update on every span of `spans` in one call (an optimizer step launches
     * one kernel, not one per parameter): span s updates param[offset + i] from
     * grad[offset + i] and m, v[moment_offset + i], i < count, with weight_decay when
     * its decay flag is set and 0 otherwise. `spans` [n_spans] is DEVICE memory (built
     * once and copied with memcpy_h2d), so the host never reads it at step time; spans
     * are disjoint. The same bits as one adamw_update per span. */
    void (*adamw_update_spans)(float *param, const float *grad, float grad_scale, float *m,
                               float *v, const ts_adamw_span *spans, int n_spans, float lr,
                               float beta1, float beta2, float eps, float weight_decay, int t);

    /* Reference slot (tests and benchmarks; the optimizer's norm uses sum_squares_into).
     * Sum of squares in double. */
    double (*sum_squares)(const float *x, size_t n);

    /* ---- vocab-parallel (tensor parallelism): this rank holds vocabulary rows
     * [v0, v0 + nv) of wte (any nv: the split may be uneven); tokens outside contribute
     * zeros, and the partial results are all-reduced by the caller (tensor/tp.c). */
    /* out[b,t,:] = (tokens[b,t] in range ? wte[tokens[b,t] - v0, :] : 0) + wpe[t, :]
     * (wpe may be NULL: added on one rank only, so the all-reduce counts it once). */
    void (*vocab_embed_forward)(void *out, const int *tokens, const float *wte,
                                const float *wpe, int v0, int nv, int B, int T, int C);
    /* dwte[tok - v0, :] += dout for tokens in range; dwpe[t, :] += sum_b dout (if dwpe). */
    void (*vocab_embed_backward)(float *dwte, float *dwpe, const void *dout, const int *tokens,
                                 int v0, int nv, int B, int T, int C);
    /* Cross-entropy over logits [N, nv] (this rank's vocabulary columns), in three passes
     * around the caller's all-reduces: (1) row max and the target's logit (0 when the
     * target is not in range), to be max- and sum-reduced; (2) sum of exp(x - max), to
     * be sum-reduced; (3) losses and, in place, dlogits = (softmax - onehot) * dloss. */
    void (*xent_vp_stats)(float *rowmax, float *target_logit, const void *logits,
                          const int *targets, int v0, int nv, int N);
    void (*xent_vp_sumexp)(float *sumexp, const void *logits, const float *rowmax, int N, int nv);
    void (*xent_vp_finish)(float *losses, void *logits, const int *targets, int v0, int nv,
                           const float *rowmax, const float *sumexp, const float *target_logit,
                           int N, float dloss);

    /* ---- Muon (optim/muon.h): Newton-Schulz's GEMMs, the momentum, the update, and the
     * update RMS the metrics report.
     * c[M,N] = alpha * op(a) @ op(b) + beta * c, row-major: op(a) [M,K] (a given as [K,M]
     * when ta), op(b) [K,N] (b given as [N,K] when tb); a and b in act_dtype, c fp32, the
     * products accumulated in fp32 (bf16 tables: bf16 operands, fp32 accumulation, no
     * TF32 on CUDA); beta 0 overwrites c without reading it. c aliases neither input. */
    void (*gemm)(float *c, const void *a, const void *b, int M, int N, int K, bool ta, bool tb,
                 float alpha, float beta);
    /* Muon's momentum on n floats (torch.optim.Muon's lerps): g = grad_scale * grad;
     * buf += (1 - mu) * (g - buf); u = nesterov ? g + mu * (buf - g) : buf. u aliases
     * neither buf nor grad. */
    void (*muon_momentum)(float *u, float *buf, const float *grad, float grad_scale, size_t n,
                          float mu, int nesterov);
    /* x[0..n) *= 1 / max(sqrt(sumsq[0]), eps): the iteration's normalisation by the
     * Frobenius norm whose square sum_squares_into left in sumsq (device memory), without
     * a round trip to the host. */
    void (*muon_normalize)(float *x, size_t n, const double *sumsq, float eps);
    /* Muon's update on n floats: param = param * decay - lr_scaled * o (decay = 1 - lr*wd,
     * the unscaled lr's, or 1), then, when acc is not NULL, acc[0] += the sum of the
     * squared changes (new - old) in double (acc device memory). */
    void (*muon_apply)(float *param, const float *o, size_t n, float decay, float lr_scaled,
                       double *acc);
    /* After adamw_update_spans ran with these arguments (param, m and v its results):
     * acc[0] += the sum over the spans of the squared change of each parameter, rebuilt in
     * double from the new moments (the update RMS of the AdamW group, for the metrics; the
     * parameters are only read). */
    void (*adamw_delta_sq_spans)(double *acc, const float *param, const float *m, const float *v,
                                 const ts_adamw_span *spans, int n_spans, float lr, float beta1,
                                 float beta2, float eps, float weight_decay, int t);
} ts_kernels;

/* The CPU backend. */
extern const ts_kernels ts_kernels_cpu;
/* The CPU kernels on device memory the host cannot touch (kernels/strict): its pages
 * are PROT_NONE except inside this table's calls, so a host access to a device buffer
 * faults at once with a message naming the buffer. For tests (train.device =
 * "cpu-strict"): it proves the core does on the CPU what a GPU will require. */
extern const ts_kernels ts_kernels_cpu_strict;
/* The CPU backend in bf16 (kernels/cpu's ts_cpu_bf16_ entry points): bf16 activations,
 * GEMMs through oneDNN (AVX-512 BF16 / AMX where the CPU has them, fp32 accumulation), the
 * elementwise kernels loading and storing bf16 around fp32 arithmetic. Its strict
 * twin for tests. ts_cpu_bf16_supported says whether this CPU runs it natively. */
extern const ts_kernels ts_kernels_cpu_bf16;
extern const ts_kernels ts_kernels_cpu_strict_bf16;
/* Whether the CPU has the BF16 instructions (AVX512_BF16 or AMX-BF16) oneDNN's bf16
 * kernels need (without them oneDNN emulates bf16 many times slower or refuses). */
bool ts_cpu_bf16_supported(void);
/* The ISA oneDNN dispatches to ("avx512_core_bf16", "avx512_core_amx", ...), for the
 * start-up log and the metrics' first line of a bf16 CPU run. */
const char *ts_dnnl_isa(void);

#ifdef TS_HAVE_CUDA
/* The CUDA backend (kernels/cuda; built when CMake finds the CUDA toolkit, TS_CUDA):
 * device memory from cudaMalloc, kernels queued on one compute stream, fp32 GEMMs
 * (no TF32) and the batched-GEMM attention. "cuda-flash": the same with the flash-style
 * attention (train.attention = "flash"). */
extern const ts_kernels ts_kernels_cuda;
extern const ts_kernels ts_kernels_cuda_flash;
/* "cuda-bf16": the CUDA backend with bf16 activations in device memory, the model's
 * bf16 compute weights, cuBLASLt GEMMs with bf16 A/B/D and fp32 compute; fp32 master
 * weights, gradients and moments. */
extern const ts_kernels ts_kernels_cuda_bf16;
extern const ts_kernels ts_kernels_cuda_bf16_flash; /* "cuda-bf16-flash" */
/* The CUDA devices this process can use: 0 when there is no driver or no device (never
 * aborts), so a caller can refuse "cuda" with a clear message before training. */
int ts_cuda_device_count(void);
/* Bind this process to device local_rank % ts_cuda_device_count(), before any other
 * call of the table (the stream and handle are made on the current device): the ranks
 * of a node spread over its GPUs in local-rank order, several ranks sharing one when
 * there are more ranks than GPUs (tests; NCCL will refuse that). Returns the device. */
int ts_cuda_select_device(int local_rank);
/* What a device is, for the topology's choice of GPU per rank (topology/binding.c)
 * and for messages; neither needs a context on the device nor aborts. The length of a
 * PCI bus id "dddd:bb:dd.f" with its terminator (CUDA's form has 8 domain digits at
 * most: 13 + 4). */
#define TS_PCI_BUSID_MAX 20
/* Device `ordinal`'s PCI bus id in sysfs's form ("0000:3b:00.0": lower case, 4-digit
 * domain), into busid[TS_PCI_BUSID_MAX]: how the topology finds the CPUs near it. False
 * (busid "") when CUDA cannot say. */
bool ts_cuda_device_pci(int ordinal, char *busid);
/* Device `ordinal`'s name ("NVIDIA H200"), "?" when CUDA cannot say. */
void ts_cuda_device_name(int ordinal, char *name, size_t cap);
#endif

/* The backend named `name` ("cpu", "cpu-strict"; "cuda", "cuda-flash", "cuda-bf16",
 * "cuda-bf16-flash" where built), or NULL. */
const ts_kernels *ts_kernels_find(const char *name);

/* The table a run uses: the one whose device, precision and attention are these
 * (train.device, train.precision, train.attention), or NULL when this build has none. */
const ts_kernels *ts_kernels_for(const char *device, const char *precision,
                                 const char *attention);

/* The table whose sizes (activation dtype, what attention keeps, weight copies, whether
 * its memory is a device's) an estimate uses for such a run: ts_kernels_for's, or where
 * this build lacks it (a CUDA config planned on a CPU-only build) its layout-only twin
 * below, so a plan gives the same memory in every build; for any other device, the CPU
 * table of the same precision. Never NULL. Size a layout with it, never run one. */
const ts_kernels *ts_kernels_layout_for(const char *device, const char *precision,
                                        const char *attention);

/* The layout-only twin of the CUDA table of this precision and attention, in every
 * build (NULL for another device or an unknown name): the CUDA table's identity (device
 * "cuda", device memory, its weight copies and comm backend) and its attention sizes
 * (kernels/attention_sizes.h, the formulas the CUDA tables return), over the CPU
 * table's slots. Its dev_alloc aborts: it sizes a run and never runs one. Tests compare
 * it with the real tables in a CUDA build. */
const ts_kernels *ts_kernels_layout_only(const char *device, const char *precision,
                                         const char *attention);

/* Every slot of a table is filled (a backend that leaves one NULL would crash mid-run):
 * the first missing slot's name, or NULL when complete. */
const char *ts_kernels_missing(const ts_kernels *k);

/* One thread budget for OpenMP kernels and OpenBLAS (the same libgomp pool in
 * Debian's openblas-openmp build): sets both, never more than asked. */
void ts_cpu_set_threads(int n);
int ts_cpu_get_threads(void);

/* The host's BLAS, as a run reports it at start-up (kernels/cpu/blas_core.c: Tessera
 * makes OpenBLAS run the right core for the CPU). The core OpenBLAS runs and how it
 * came to: "Haswell (chosen by Tessera: OpenBLAS picked Prescott on an AVX2 CPU)". */
const char *ts_blas_core(void);
const char *ts_blas_core_note(char *buf, size_t size);
/* A quick sgemm rate in GFLOP/s with the current thread count (about 0.1 s). */
double ts_blas_measure_gflops(void);
/* The CPU's model name ("AMD EPYC 9454 48-Core Processor"), or "unknown". */
const char *ts_cpu_model(char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
