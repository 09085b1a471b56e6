/* The strict test backend ("cpu-strict"): the CPU kernels on device memory that host
 * code cannot touch (kernels/strict/arena.h). Every call that reads or writes device
 * memory opens the arena around the CPU kernel; the size queries and the stream and
 * event no-ops touch none and are the CPU's own. host_accessible is false, so callers
 * take the staging paths a GPU needs. */
#include "kernels/cpu/cpu_internal.h"
#include "kernels/strict/arena.h"

/* strict_NAME(PARAMS) runs ts_cpu_NAME(ARGS) with the arena open. */
#define STRICT(name, params, args)                                                         \
    static void strict_##name params                                                       \
    {                                                                                      \
        ts_strict_enter();                                                                 \
        ts_cpu_##name args;                                                                \
        ts_strict_leave();                                                                 \
    }

STRICT(memcpy, (void *dst, const void *src, size_t bytes), (dst, src, bytes))
STRICT(memset_zero, (void *dst, size_t bytes), (dst, bytes))
STRICT(sum_into, (double *acc, const float *x, size_t n), (acc, x, n))
STRICT(sum_squares_into, (double *acc, const float *x, size_t n), (acc, x, n))
STRICT(encoder_forward,
       (float *out, const int *tokens, const float *wte, const float *wpe, int B, int T, int C),
       (out, tokens, wte, wpe, B, T, C))
STRICT(encoder_backward,
       (float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T, int C),
       (dwte, dwpe, dout, tokens, B, T, C))
STRICT(layernorm_forward,
       (float *out, float *mean, float *rstd, const float *inp, const float *weight,
        const float *bias, int N, int C),
       (out, mean, rstd, inp, weight, bias, N, C))
STRICT(layernorm_backward,
       (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
        const float *weight, const float *mean, const float *rstd, int N, int C),
       (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))
STRICT(matmul_forward,
       (float *out, const float *inp, const float *weight, const float *bias, int N, int C,
        int OC),
       (out, inp, weight, bias, N, C, OC))
STRICT(matmul_backward,
       (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
        const float *weight, int N, int C, int OC),
       (dinp, dweight, dbias, dout, inp, weight, N, C, OC))
STRICT(attention_forward,
       (float *out, float *att, const float *qkv, int B, int T, int NH, int HS),
       (out, att, qkv, B, T, NH, HS))
STRICT(attention_backward,
       (float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B,
        int T, int NH, int HS),
       (dqkv, scratch, dout, qkv, att, B, T, NH, HS))
STRICT(gelu_forward, (float *out, const float *inp, size_t n), (out, inp, n))
STRICT(gelu_backward, (float *dinp, const float *inp, const float *dout, size_t n),
       (dinp, inp, dout, n))
STRICT(residual_forward, (float *out, const float *a, const float *b, size_t n), (out, a, b, n))
STRICT(residual_layernorm_forward,
       (float *res_out, float *ln_out, float *mean, float *rstd, const float *a, const float *b,
        const float *weight, const float *bias, int N, int C),
       (res_out, ln_out, mean, rstd, a, b, weight, bias, N, C))
STRICT(crossentropy_forward_backward,
       (float *losses, float *logits, const int *targets, int N, int V, float dloss),
       (losses, logits, targets, N, V, dloss))
STRICT(adamw_update,
       (float *param, const float *grad, float grad_scale, float *m, float *v, size_t n, float lr,
        float beta1, float beta2, float eps, float weight_decay, int t),
       (param, grad, grad_scale, m, v, n, lr, beta1, beta2, eps, weight_decay, t))
/* The spans are device memory too: the CPU kernel reads them inside the open window. */
STRICT(adamw_update_spans,
       (float *param, const float *grad, float grad_scale, float *m, float *v,
        const ts_adamw_span *spans, int n_spans, float lr, float beta1, float beta2, float eps,
        float weight_decay, int t),
       (param, grad, grad_scale, m, v, spans, n_spans, lr, beta1, beta2, eps, weight_decay, t))
STRICT(vocab_embed_forward,
       (float *out, const int *tokens, const float *wte, const float *wpe, int v0, int nv, int B,
        int T, int C),
       (out, tokens, wte, wpe, v0, nv, B, T, C))
STRICT(vocab_embed_backward,
       (float *dwte, float *dwpe, const float *dout, const int *tokens, int v0, int nv, int B,
        int T, int C),
       (dwte, dwpe, dout, tokens, v0, nv, B, T, C))
STRICT(xent_vp_stats,
       (float *rowmax, float *target_logit, const float *logits, const int *targets, int v0,
        int nv, int N),
       (rowmax, target_logit, logits, targets, v0, nv, N))
STRICT(xent_vp_sumexp, (float *sumexp, const float *logits, const float *rowmax, int N, int nv),
       (sumexp, logits, rowmax, N, nv))
STRICT(xent_vp_finish,
       (float *losses, float *logits, const int *targets, int v0, int nv, const float *rowmax,
        const float *sumexp, const float *target_logit, int N, float dloss),
       (losses, logits, targets, v0, nv, rowmax, sumexp, target_logit, N, dloss))
#undef STRICT

static double strict_sum_squares(const float *x, size_t n)
{
    ts_strict_enter();
    double s = ts_cpu_sum_squares(x, n);
    ts_strict_leave();
    return s;
}

const ts_kernels ts_kernels_cpu_strict = {
    .name = "cpu-strict",
    /* Host memory under the hood: checked against the host's limits like "cpu". */
    .device = "cpu-strict",
    .precision = "fp32",
    .attention = "gemm",
    .device_memory = false,
    .weight_copy_bytes = 0,
    .native_comm = NULL,
    .host_accessible = false,
    .dev_alloc = ts_strict_alloc,
    .dev_free = ts_strict_free,
    .memcpy_h2d = strict_memcpy,
    .memcpy_d2h = strict_memcpy,
    .memcpy_d2d = strict_memcpy,
    .memset_zero = strict_memset_zero,
    .sum_into = strict_sum_into,
    .sum_squares_into = strict_sum_squares_into,
    .stream_create = ts_cpu_stream_create,
    .stream_destroy = ts_cpu_stream_destroy,
    .stream_sync = ts_cpu_stream_sync,
    .event_record = ts_cpu_event_record,
    .event_wait = ts_cpu_event_wait,
    .attention_saved_floats = ts_cpu_attention_saved_floats,
    .attention_scratch_floats = ts_cpu_attention_scratch_floats,
    .encoder_forward = strict_encoder_forward,
    .encoder_backward = strict_encoder_backward,
    .layernorm_forward = strict_layernorm_forward,
    .layernorm_backward = strict_layernorm_backward,
    .matmul_forward = strict_matmul_forward,
    .matmul_backward = strict_matmul_backward,
    .attention_forward = strict_attention_forward,
    .attention_backward = strict_attention_backward,
    .gelu_forward = strict_gelu_forward,
    .gelu_backward = strict_gelu_backward,
    .residual_forward = strict_residual_forward,
    .residual_layernorm_forward = strict_residual_layernorm_forward,
    .crossentropy_forward_backward = strict_crossentropy_forward_backward,
    .adamw_update = strict_adamw_update,
    .adamw_update_spans = strict_adamw_update_spans,
    .sum_squares = strict_sum_squares,
    .vocab_embed_forward = strict_vocab_embed_forward,
    .vocab_embed_backward = strict_vocab_embed_backward,
    .xent_vp_stats = strict_xent_vp_stats,
    .xent_vp_sumexp = strict_xent_vp_sumexp,
    .xent_vp_finish = strict_xent_vp_finish,
};
