/* The strict test backend ("cpu-strict"): the CPU kernels on device memory that host
 * code cannot touch (kernels/strict/arena.h). Every call that reads or writes device
 * memory opens the arena around the CPU kernel; the size queries and the stream and
 * event no-ops touch none and are the CPU's own. host_accessible is false, so callers
 * take the staging paths a GPU needs. One strict table per CPU table (fp32, bf16): the
 * wrappers below are written once and instantiated for each. */
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/strict/arena.h"

/* PFX##NAME(PARAMS) runs INNER.NAME(ARGS) with the arena open. */
#define STRICT(pfx, inner, name, params, args)                                            \
    static void pfx##name params                                                           \
    {                                                                                      \
        ts_strict_enter();                                                                 \
        (inner).name args;                                                                 \
        ts_strict_leave();                                                                 \
    }

#define STRICT_WRAPPERS(P, K)                                                              \
    STRICT(P, K, memcpy_d2d, (void *dst, const void *src, size_t bytes), (dst, src, bytes)) \
    STRICT(P, K, memcpy_2d,                                                                \
           (void *dst, size_t dp, const void *src, size_t sp, size_t width, size_t rows),    \
           (dst, dp, src, sp, width, rows))                                                \
    STRICT(P, K, memset_zero, (void *dst, size_t bytes), (dst, bytes))                     \
    STRICT(P, K, convert, (void *dst, ts_dtype dt, const void *src, ts_dtype st, size_t n), \
           (dst, dt, src, st, n))                                                          \
    STRICT(P, K, sum_into, (double *acc, const float *x, size_t n), (acc, x, n))           \
    STRICT(P, K, sum_squares_into, (double *acc, const float *x, size_t n), (acc, x, n))   \
    STRICT(P, K, encoder_forward,                                                          \
           (void *out, const int *tokens, const float *wte, const float *wpe, int B, int T,  \
            int C),                                                                        \
           (out, tokens, wte, wpe, B, T, C))                                               \
    STRICT(P, K, encoder_backward,                                                         \
           (float *dwte, float *dwpe, const void *dout, const int *tokens, int B, int T,     \
            int C),                                                                        \
           (dwte, dwpe, dout, tokens, B, T, C))                                            \
    STRICT(P, K, layernorm_forward,                                                        \
           (void *out, float *mean, float *rstd, const void *inp, const float *weight,      \
            const float *bias, int N, int C),                                              \
           (out, mean, rstd, inp, weight, bias, N, C))                                     \
    STRICT(P, K, layernorm_backward,                                                       \
           (void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,    \
            const float *weight, const float *mean, const float *rstd, int N, int C),       \
           (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))                    \
    STRICT(P, K, matmul_forward,                                                           \
           (void *out, const void *inp, const void *weight, const float *bias, int N, int C, \
            int OC),                                                                       \
           (out, inp, weight, bias, N, C, OC))                                             \
    STRICT(P, K, matmul_backward,                                                          \
           (void *dinp, float *dweight, float *dbias, const void *dout, const void *inp,    \
            const void *weight, int N, int C, int OC),                                     \
           (dinp, dweight, dbias, dout, inp, weight, N, C, OC))                            \
    STRICT(P, K, grouped_matmul_forward,                                                   \
           (void *out, const void *inp, const void *const *weights, const int *rows, int L,  \
            int C, int OC),                                                                \
           (out, inp, weights, rows, L, C, OC))                                            \
    STRICT(P, K, grouped_matmul_backward,                                                  \
           (void *dinp, float *const *dweights, const void *dout, const void *inp,          \
            const void *const *weights, const int *rows, int L, int C, int OC),             \
           (dinp, dweights, dout, inp, weights, rows, L, C, OC))                           \
    STRICT(P, K, attention_forward,                                                        \
           (void *out, void *att, const void *qkv, int B, int T, ts_att_heads h),          \
           (out, att, qkv, B, T, h))                                                       \
    STRICT(P, K, attention_backward,                                                       \
           (void *dqkv, void *scratch, const void *dout, const void *qkv, const void *att,   \
            int B, int T, ts_att_heads h),                                                 \
           (dqkv, scratch, dout, qkv, att, B, T, h))                                       \
    STRICT(P, K, attention_prefix_forward,                                                 \
           (void *out, void *att, const void *qkv, const void *kv, int B, int Tq, int Tk,     \
            ts_att_heads h),                                                               \
           (out, att, qkv, kv, B, Tq, Tk, h))                                              \
    STRICT(P, K, attention_prefix_backward,                                                \
           (void *dqkv, void *dkv, void *scratch, const void *dout, const void *qkv,         \
            const void *kv, const void *att, int B, int Tq, int Tk, ts_att_heads h),       \
           (dqkv, dkv, scratch, dout, qkv, kv, att, B, Tq, Tk, h))                         \
    STRICT(P, K, rmsnorm_forward,                                                          \
           (void *out, float *rstd, const void *inp, const float *weight, int N, int C,     \
            float eps),                                                                    \
           (out, rstd, inp, weight, N, C, eps))                                            \
    STRICT(P, K, rmsnorm_backward,                                                         \
           (void *dinp, float *dweight, const void *dout, const void *inp,                  \
            const float *weight, const float *rstd, int N, int C),                         \
           (dinp, dweight, dout, inp, weight, rstd, N, C))                                 \
    STRICT(P, K, residual_rmsnorm_forward,                                                 \
           (void *res_out, void *norm_out, float *rstd, const void *a, const void *b,       \
            const float *weight, int N, int C, float eps),                                 \
           (res_out, norm_out, rstd, a, b, weight, N, C, eps))                             \
    STRICT(P, K, rope_forward,                                                             \
           (void *qkv, const float *cos, const float *sin, int B, int T, ts_att_heads h,   \
            int RD, bool interleaved),                                                     \
           (qkv, cos, sin, B, T, h, RD, interleaved))                                      \
    STRICT(P, K, rope_backward,                                                            \
           (void *dqkv, const float *cos, const float *sin, int B, int T, ts_att_heads h,  \
            int RD, bool interleaved),                                                     \
           (dqkv, cos, sin, B, T, h, RD, interleaved))                                     \
    STRICT(P, K, swiglu_forward, (void *out, const void *inp, int N, int F),               \
           (out, inp, N, F))                                                               \
    STRICT(P, K, swiglu_backward,                                                          \
           (void *dinp, const void *inp, const void *dout, int N, int F),                  \
           (dinp, inp, dout, N, F))                                                        \
    STRICT(P, K, gelu_forward, (void *out, const void *inp, size_t n), (out, inp, n))      \
    STRICT(P, K, gelu_backward, (void *dinp, const void *inp, const void *dout, size_t n), \
           (dinp, inp, dout, n))                                                           \
    STRICT(P, K, residual_forward, (void *out, const void *a, const void *b, size_t n),    \
           (out, a, b, n))                                                                 \
    STRICT(P, K, residual_layernorm_forward,                                               \
           (void *res_out, void *ln_out, float *mean, float *rstd, const void *a,            \
            const void *b, const float *weight, const float *bias, int N, int C),           \
           (res_out, ln_out, mean, rstd, a, b, weight, bias, N, C))                        \
    STRICT(P, K, crossentropy_forward_backward,                                            \
           (float *losses, void *logits, const int *targets, int N, int V, float dloss),    \
           (losses, logits, targets, N, V, dloss))                                         \
    STRICT(P, K, adamw_update,                                                             \
           (float *param, const float *grad, float grad_scale, float *m, float *v, size_t n, \
            float lr, float beta1, float beta2, float eps, float weight_decay, int t),      \
           (param, grad, grad_scale, m, v, n, lr, beta1, beta2, eps, weight_decay, t))     \
    /* The spans are device memory too: the CPU kernel reads them inside the window. */   \
    STRICT(P, K, adamw_update_spans,                                                       \
           (float *param, const float *grad, float grad_scale, float *m, float *v,          \
            const ts_adamw_span *spans, int n_spans, float lr, float beta1, float beta2,    \
            float eps, float weight_decay, int t),                                         \
           (param, grad, grad_scale, m, v, spans, n_spans, lr, beta1, beta2, eps,          \
            weight_decay, t))                                                              \
    STRICT(P, K, gemm,                                                                     \
           (float *c, const void *a, const void *b, int M, int N, int K_, bool ta, bool tb,   \
            float alpha, float beta),                                                      \
           (c, a, b, M, N, K_, ta, tb, alpha, beta))                                       \
    STRICT(P, K, muon_momentum,                                                            \
           (float *u, float *buf, const float *grad, float grad_scale, size_t n, float mu,   \
            int nesterov),                                                                 \
           (u, buf, grad, grad_scale, n, mu, nesterov))                                    \
    STRICT(P, K, muon_normalize, (float *x, size_t n, const double *sumsq, float eps),       \
           (x, n, sumsq, eps))                                                             \
    STRICT(P, K, muon_apply,                                                               \
           (float *param, const float *o, size_t n, float decay, float lr_scaled,           \
            double *acc),                                                                  \
           (param, o, n, decay, lr_scaled, acc))                                           \
    STRICT(P, K, adamw_delta_sq_spans,                                                     \
           (double *acc, const float *param, const float *m, const float *v,                \
            const ts_adamw_span *spans, int n_spans, float lr, float beta1, float beta2,    \
            float eps, float weight_decay, int t),                                         \
           (acc, param, m, v, spans, n_spans, lr, beta1, beta2, eps, weight_decay, t))     \
    STRICT(P, K, vocab_embed_forward,                                                      \
           (void *out, const int *tokens, const float *wte, const float *wpe, int v0, int nv, \
            int B, int T, int C),                                                          \
           (out, tokens, wte, wpe, v0, nv, B, T, C))                                       \
    STRICT(P, K, vocab_embed_backward,                                                     \
           (float *dwte, float *dwpe, const void *dout, const int *tokens, int v0, int nv,   \
            int B, int T, int C),                                                          \
           (dwte, dwpe, dout, tokens, v0, nv, B, T, C))                                    \
    STRICT(P, K, xent_vp_stats,                                                            \
           (float *rowmax, float *target_logit, const void *logits, const int *targets,     \
            int v0, int nv, int N),                                                        \
           (rowmax, target_logit, logits, targets, v0, nv, N))                             \
    STRICT(P, K, xent_vp_sumexp,                                                           \
           (float *sumexp, const void *logits, const float *rowmax, int N, int nv),         \
           (sumexp, logits, rowmax, N, nv))                                                \
    STRICT(P, K, xent_vp_finish,                                                           \
           (float *losses, void *logits, const int *targets, int v0, int nv,                \
            const float *rowmax, const float *sumexp, const float *target_logit, int N,     \
            float dloss),                                                                  \
           (losses, logits, targets, v0, nv, rowmax, sumexp, target_logit, N, dloss))      \
    STRICT(P, K, moe_route_forward,                                                        \
           (const ts_moe_routing *r, float *scores, int *topk_idx, float *topk_w,           \
            const float *logits, const float *bias, int N),                                \
           (r, scores, topk_idx, topk_w, logits, bias, N))                                 \
    STRICT(P, K, moe_route_backward,                                                       \
           (const ts_moe_routing *r, float *dlogits, const float *dtopk_w,                  \
            const float *scores, const int *topk_idx, int N),                              \
           (r, dlogits, dtopk_w, scores, topk_idx, N))                                     \
    /* r is host memory (a struct argument); the losses are device memory */             \
    STRICT(P, K, moe_aux_forward_backward,                                                 \
           (const ts_moe_routing *r, float *z_loss, float *aux_loss, float *dlogits,        \
            const float *logits, const float *scores, const int *topk_idx, int N, int T,    \
            float cz, float ca, float z_scale, float aux_scale),                           \
           (r, z_loss, aux_loss, dlogits, logits, scores, topk_idx, N, T, cz, ca, z_scale,  \
            aux_scale))                                                                    \
    STRICT(P, K, moe_balance_forward_backward,                                             \
           (const ts_moe_routing *r, float *aux_loss, float *dlogits, const float *scores,  \
            const int *seq_counts, int N, int row0, int rows_per_seq, int T, float ca,      \
            float aux_scale),                                                              \
           (r, aux_loss, dlogits, scores, seq_counts, N, row0, rows_per_seq, T, ca,         \
            aux_scale))                                                                    \
    STRICT(P, K, moe_count, (int *counts, const int *topk_idx, int N, int K_, int E),      \
           (counts, topk_idx, N, K_, E))                                                   \
    STRICT(P, K, moe_permute,                                                              \
           (void *xp, int *row_of, const void *x, const int *topk_idx, const int *offsets,  \
            int N, int K_, int C, int E),                                                  \
           (xp, row_of, x, topk_idx, offsets, N, K_, C, E))                                \
    STRICT(P, K, moe_combine,                                                              \
           (void *out, const void *yp, const float *topk_w, const int *row_of, int N, int K_, \
            int C),                                                                        \
           (out, yp, topk_w, row_of, N, K_, C))                                            \
    STRICT(P, K, moe_combine_backward,                                                     \
           (void *dyp, float *dtopk_w, const void *dout, const void *yp,                    \
            const float *topk_w, const int *row_of, int N, int K_, int C),                 \
           (dyp, dtopk_w, dout, yp, topk_w, row_of, N, K_, C))                             \
    STRICT(P, K, moe_permute_backward,                                                     \
           (void *dx, const void *dxp, const int *row_of, int N, int K_, int C),            \
           (dx, dxp, row_of, N, K_, C))                                                    \
    STRICT(P, K, moe_capacity,                                                             \
           (int *keep, const int *topk_idx, const float *topk_w, int N, int K_, int E, int T, \
            int capacity),                                                                 \
           (keep, topk_idx, topk_w, N, K_, E, T, capacity))                                \
    static double P##sum_squares(const float *x, size_t n)                                 \
    {                                                                                      \
        ts_strict_enter();                                                                 \
        double s = (K).sum_squares(x, n);                                                  \
        ts_strict_leave();                                                                 \
        return s;                                                                          \
    }

/* The table of strict wrappers P##* around a CPU table of this precision, dtype,
 * weight copies and attention sizes, the prefix form's included (static initialisers
 * cannot read K's fields). */
#define STRICT_TABLE(P, table_name, prec, dtype, copy_bytes, saved_bytes, scratch_bytes,  \
                     prefix_saved, prefix_scratch)                                         \
    {                                                                                      \
        .name = table_name,                                                                \
        /* Host memory under the hood: checked against the host's limits like "cpu". */   \
        .device = "cpu-strict", .precision = prec, .act_dtype = dtype,                    \
        .attention = "gemm", .device_memory = false,                                       \
        .weight_copy_bytes = copy_bytes, .native_comm = NULL,                              \
        .host_accessible = false, .dev_alloc = ts_strict_alloc, .dev_free = ts_strict_free, \
        .memcpy_h2d = P##memcpy_d2d, .memcpy_d2h = P##memcpy_d2d,                          \
        .memcpy_d2d = P##memcpy_d2d, .memcpy_2d = P##memcpy_2d,                            \
        .memset_zero = P##memset_zero, .convert = P##convert,                              \
        .sum_into = P##sum_into, .sum_squares_into = P##sum_squares_into,                  \
        .stream_create = ts_cpu_stream_create, .stream_destroy = ts_cpu_stream_destroy,    \
        .stream_sync = ts_cpu_stream_sync, .event_record = ts_cpu_event_record,            \
        .event_wait = ts_cpu_event_wait, .attention_saved_bytes = saved_bytes,            \
        .attention_scratch_bytes = scratch_bytes,                                          \
        .attention_prefix_saved_bytes = prefix_saved,                                      \
        .attention_prefix_scratch_bytes = prefix_scratch,                                  \
        .encoder_forward = P##encoder_forward, .encoder_backward = P##encoder_backward,    \
        .layernorm_forward = P##layernorm_forward,                                         \
        .layernorm_backward = P##layernorm_backward, .matmul_forward = P##matmul_forward,  \
        .matmul_backward = P##matmul_backward, .attention_forward = P##attention_forward,  \
        .grouped_matmul_forward = P##grouped_matmul_forward,                               \
        .grouped_matmul_backward = P##grouped_matmul_backward,                             \
        .attention_backward = P##attention_backward,                                       \
        .attention_prefix_forward = P##attention_prefix_forward,                           \
        .attention_prefix_backward = P##attention_prefix_backward,                         \
        .gelu_forward = P##gelu_forward,                                                   \
        .gelu_backward = P##gelu_backward, .residual_forward = P##residual_forward,        \
        .residual_layernorm_forward = P##residual_layernorm_forward,                       \
        .crossentropy_forward_backward = P##crossentropy_forward_backward,                 \
        .adamw_update = P##adamw_update, .adamw_update_spans = P##adamw_update_spans,      \
        .sum_squares = P##sum_squares, .vocab_embed_forward = P##vocab_embed_forward,      \
        .vocab_embed_backward = P##vocab_embed_backward, .xent_vp_stats = P##xent_vp_stats, \
        .xent_vp_sumexp = P##xent_vp_sumexp, .xent_vp_finish = P##xent_vp_finish,          \
        .rmsnorm_forward = P##rmsnorm_forward, .rmsnorm_backward = P##rmsnorm_backward,    \
        .residual_rmsnorm_forward = P##residual_rmsnorm_forward,                           \
        .rope_forward = P##rope_forward, .rope_backward = P##rope_backward,                \
        .swiglu_forward = P##swiglu_forward, .swiglu_backward = P##swiglu_backward,        \
        .moe_route_forward = P##moe_route_forward, .moe_route_backward = P##moe_route_backward, \
        .moe_aux_forward_backward = P##moe_aux_forward_backward,                           \
        .moe_balance_forward_backward = P##moe_balance_forward_backward,                   \
        .moe_count = P##moe_count,                                                         \
        .moe_permute = P##moe_permute, .moe_combine = P##moe_combine,                      \
        .moe_combine_backward = P##moe_combine_backward,                                   \
        .moe_permute_backward = P##moe_permute_backward,                                   \
        .moe_capacity = P##moe_capacity,                                                   \
        .gemm = P##gemm, .muon_momentum = P##muon_momentum,                                \
        .muon_normalize = P##muon_normalize, .muon_apply = P##muon_apply,                  \
        .adamw_delta_sq_spans = P##adamw_delta_sq_spans,                                   \
    }

STRICT_WRAPPERS(strict_f32_, ts_kernels_cpu)
const ts_kernels ts_kernels_cpu_strict =
    STRICT_TABLE(strict_f32_, "cpu-strict", "fp32", TS_DTYPE_F32, 0, ts_cpu_attention_saved_bytes,
                 ts_cpu_attention_scratch_bytes, ts_cpu_attention_prefix_saved_bytes,
                 ts_cpu_attention_prefix_scratch_bytes);

STRICT_WRAPPERS(strict_bf16_, ts_kernels_cpu_bf16)
const ts_kernels ts_kernels_cpu_strict_bf16 =
    STRICT_TABLE(strict_bf16_, "cpu-strict-bf16", "bf16", TS_DTYPE_BF16, 2,
                 ts_cpu_bf16_attention_saved_bytes, ts_cpu_bf16_attention_scratch_bytes,
                 ts_cpu_bf16_attention_prefix_saved_bytes,
                 ts_cpu_bf16_attention_prefix_scratch_bytes);
