/* The CUDA backend's kernel table (fp32; issue 13, part 1). Device pointers throughout:
 * host code reaches this memory only through the copies, so host_accessible is false
 * and the trainer takes the staging paths (kernels/kernels.h). */
#include "kernels/cuda/cuda_internal.h"

/* C++ has no designated initializers before C++20 (nvcc -std=c++17 accepts them as an
 * extension, in declaration order): the slots below follow ts_kernels' order. */
extern "C" const ts_kernels ts_kernels_cuda = {
    .name = "cuda",
    .host_accessible = false,
    .dev_alloc = ts_cuda_dev_alloc,
    .dev_free = ts_cuda_dev_free,
    .memcpy_h2d = ts_cuda_memcpy_h2d,
    .memcpy_d2h = ts_cuda_memcpy_d2h,
    .memcpy_d2d = ts_cuda_memcpy_d2d,
    .memset_zero = ts_cuda_memset_zero,
    .sum_into = ts_cuda_sum_into,
    .sum_squares_into = ts_cuda_sum_squares_into,
    .stream_create = ts_cuda_stream_create,
    .stream_destroy = ts_cuda_stream_destroy,
    .stream_sync = ts_cuda_stream_sync,
    .event_record = ts_cuda_event_record,
    .event_wait = ts_cuda_event_wait,
    .attention_saved_floats = ts_cuda_attention_saved_floats,
    .attention_scratch_floats = ts_cuda_attention_scratch_floats,
    .encoder_forward = ts_cuda_encoder_forward,
    .encoder_backward = ts_cuda_encoder_backward,
    .layernorm_forward = ts_cuda_layernorm_forward,
    .layernorm_backward = ts_cuda_layernorm_backward,
    .matmul_forward = ts_cuda_matmul_forward,
    .matmul_backward = ts_cuda_matmul_backward,
    .attention_forward = ts_cuda_attention_forward,
    .attention_backward = ts_cuda_attention_backward,
    .gelu_forward = ts_cuda_gelu_forward,
    .gelu_backward = ts_cuda_gelu_backward,
    .residual_forward = ts_cuda_residual_forward,
    .crossentropy_forward_backward = ts_cuda_crossentropy_forward_backward,
    .adamw_update = ts_cuda_adamw_update,
    .sum_squares = ts_cuda_sum_squares,
    .vocab_embed_forward = ts_cuda_vocab_embed_forward,
    .vocab_embed_backward = ts_cuda_vocab_embed_backward,
    .xent_vp_stats = ts_cuda_xent_vp_stats,
    .xent_vp_sumexp = ts_cuda_xent_vp_sumexp,
    .xent_vp_finish = ts_cuda_xent_vp_finish,
};
