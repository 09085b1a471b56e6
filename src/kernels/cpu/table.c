/* The CPU backend's kernel table. */
#include "kernels/cpu/cpu_internal.h"

const ts_kernels ts_kernels_cpu = {
    .name = "cpu",
    .encoder_forward = ts_cpu_encoder_forward,
    .encoder_backward = ts_cpu_encoder_backward,
    .layernorm_forward = ts_cpu_layernorm_forward,
    .layernorm_backward = ts_cpu_layernorm_backward,
    .matmul_forward = ts_cpu_matmul_forward,
    .matmul_backward = ts_cpu_matmul_backward,
    .attention_forward = ts_cpu_attention_forward,
    .attention_backward = ts_cpu_attention_backward,
    .gelu_forward = ts_cpu_gelu_forward,
    .gelu_backward = ts_cpu_gelu_backward,
    .residual_forward = ts_cpu_residual_forward,
    .crossentropy_forward_backward = ts_cpu_crossentropy_forward_backward,
    .adamw_update = ts_cpu_adamw_update,
    .sum_squares = ts_cpu_sum_squares,
    .vocab_embed_forward = ts_cpu_vocab_embed_forward,
    .vocab_embed_backward = ts_cpu_vocab_embed_backward,
    .xent_vp_stats = ts_cpu_xent_vp_stats,
    .xent_vp_sumexp = ts_cpu_xent_vp_sumexp,
    .xent_vp_finish = ts_cpu_xent_vp_finish,
};
