/* The CUDA backend's kernel tables: "cuda" and "cuda-flash" (fp32 activations),
 * "cuda-bf16" and "cuda-bf16-flash" (bf16 activations: every activation slot's
 * ts_cuda_bf16_* twin, cuda_internal.h). Device pointers throughout: host code reaches
 * this memory only through the copies, so host_accessible is false and the trainer takes
 * the staging paths (kernels/kernels.h). */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/attention_flash.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fused.h"

/* C++ has no designated initializers before C++20 (nvcc -std=c++17 accepts them as an
 * extension, in declaration order): the slots below follow ts_kernels' order. constexpr,
 * so every table is constant-initialized (no static-initialization order to mind) and
 * the others can be built from it below. */
static constexpr ts_kernels fp32_table = {
    .name = "cuda",
    .device = "cuda",
    .precision = "fp32",
    .act_dtype = TS_DTYPE_F32,
    .attention = "gemm",
    .device_memory = true,
    .weight_copy_bytes = 0,
    .native_comm = "nccl",
    .device_count = ts_cuda_device_count,
    .select_device = ts_cuda_select_device,
    .current_device = ts_cuda_current_device,
    .memory_info = ts_cuda_memory_info,
    .host_accessible = false,
    .dev_alloc = ts_cuda_dev_alloc,
    .dev_free = ts_cuda_dev_free,
    .memcpy_h2d = ts_cuda_memcpy_h2d,
    .memcpy_d2h = ts_cuda_memcpy_d2h,
    .memcpy_d2d = ts_cuda_memcpy_d2d,
    .memcpy_2d = ts_cuda_memcpy_2d,
    .memset_zero = ts_cuda_memset_zero,
    .convert = ts_cuda_convert,
    .sum_into = ts_cuda_sum_into,
    .sum_squares_into = ts_cuda_sum_squares_into,
    .stream_create = ts_cuda_stream_create,
    .stream_destroy = ts_cuda_stream_destroy,
    .stream_sync = ts_cuda_stream_sync,
    .event_record = ts_cuda_event_record,
    .event_wait = ts_cuda_event_wait,
    .attention_saved_bytes = ts_cuda_attention_saved_bytes,
    .attention_scratch_bytes = ts_cuda_attention_scratch_bytes,
    /* Context parallelism's prefix attention: the batched-GEMM kernels in every CUDA
     * table (attention.cu; built and compiled, not yet run on a GPU). */
    .attention_prefix_saved_bytes = ts_cuda_attention_prefix_saved_bytes,
    .attention_prefix_scratch_bytes = ts_cuda_attention_prefix_scratch_bytes,
    .encoder_forward = ts_cuda_encoder_forward,
    .encoder_backward = ts_cuda_encoder_backward,
    .layernorm_forward = ts_cuda_layernorm_forward,
    .layernorm_backward = ts_cuda_layernorm_backward,
    .rmsnorm_forward = ts_cuda_rmsnorm_forward,
    .rmsnorm_backward = ts_cuda_rmsnorm_backward,
    .residual_rmsnorm_forward = ts_cuda_residual_rmsnorm_forward,
    .rope_forward = ts_cuda_rope_forward,
    .rope_backward = ts_cuda_rope_backward,
    .swiglu_forward = ts_cuda_swiglu_forward,
    .swiglu_backward = ts_cuda_swiglu_backward,
    /* The mixture-of-experts kernels (moe.cu; built and compiled, not yet run on a GPU). */
    .moe_route_forward = ts_cuda_moe_route_forward,
    .moe_route_backward = ts_cuda_moe_route_backward,
    .moe_aux_forward_backward = ts_cuda_moe_aux_forward_backward,
    .moe_balance_forward_backward = ts_cuda_moe_balance_forward_backward,
    .moe_count = ts_cuda_moe_count,
    .moe_permute = ts_cuda_moe_permute,
    .moe_combine = ts_cuda_moe_combine,
    .moe_combine_backward = ts_cuda_moe_combine_backward,
    .moe_permute_backward = ts_cuda_moe_permute_backward,
    .moe_capacity = ts_cuda_moe_capacity,
    .matmul_forward = ts_cuda_matmul_forward,
    .matmul_backward = ts_cuda_matmul_backward,
    .grouped_matmul_forward = ts_cuda_grouped_matmul_forward,
    .grouped_matmul_backward = ts_cuda_grouped_matmul_backward,
    .attention_forward = ts_cuda_attention_forward,
    .attention_backward = ts_cuda_attention_backward,
    .attention_prefix_forward = ts_cuda_attention_prefix_forward,
    .attention_prefix_backward = ts_cuda_attention_prefix_backward,
    .gelu_forward = ts_cuda_gelu_forward,
    .gelu_backward = ts_cuda_gelu_backward,
    .residual_forward = ts_cuda_residual_forward,
    .residual_layernorm_forward = ts_cuda_residual_layernorm_forward,
    .crossentropy_forward_backward = ts_cuda_crossentropy_forward_backward,
    .adamw_update = ts_cuda_adamw_update,
    .adamw_update_spans = ts_cuda_adamw_update_spans,
    .sum_squares = ts_cuda_sum_squares,
    .vocab_embed_forward = ts_cuda_vocab_embed_forward,
    .vocab_embed_backward = ts_cuda_vocab_embed_backward,
    .xent_vp_stats = ts_cuda_xent_vp_stats,
    .xent_vp_sumexp = ts_cuda_xent_vp_sumexp,
    .xent_vp_finish = ts_cuda_xent_vp_finish,
    .gemm = ts_cuda_gemm_f32,
    .muon_momentum = ts_cuda_muon_momentum,
    .muon_apply = ts_cuda_muon_apply,
    .adamw_delta_sq_spans = ts_cuda_adamw_delta_sq_spans,
};

/* The fp32 table with bf16 activations: every slot that takes an activation is its
 * bf16 twin. The slots on fp32 memory alone (copies, convert, sums, AdamW, streams) are
 * the fp32 table's: the model's bf16 compute weights are its own buffer, refreshed
 * through convert, so no slot here needs to know when a weight changes. */
static constexpr ts_kernels with_bf16_slots(ts_kernels k)
{
    k.name = "cuda-bf16";
    k.precision = "bf16";
    k.act_dtype = TS_DTYPE_BF16;
    k.weight_copy_bytes = 2; /* the model's bf16 compute copy of every weight */
    k.attention_saved_bytes = ts_cuda_attention_saved_bytes_bf16;
    k.attention_scratch_bytes = ts_cuda_attention_scratch_bytes_bf16;
    k.encoder_forward = ts_cuda_bf16_encoder_forward;
    k.encoder_backward = ts_cuda_bf16_encoder_backward;
    k.layernorm_forward = ts_cuda_bf16_layernorm_forward;
    k.layernorm_backward = ts_cuda_bf16_layernorm_backward;
    k.rmsnorm_forward = ts_cuda_bf16_rmsnorm_forward;
    k.rmsnorm_backward = ts_cuda_bf16_rmsnorm_backward;
    k.residual_rmsnorm_forward = ts_cuda_bf16_residual_rmsnorm_forward;
    k.rope_forward = ts_cuda_bf16_rope_forward;
    k.rope_backward = ts_cuda_bf16_rope_backward;
    k.swiglu_forward = ts_cuda_bf16_swiglu_forward;
    k.swiglu_backward = ts_cuda_bf16_swiglu_backward;
    k.moe_permute = ts_cuda_bf16_moe_permute;
    k.moe_combine = ts_cuda_bf16_moe_combine;
    k.moe_combine_backward = ts_cuda_bf16_moe_combine_backward;
    k.moe_permute_backward = ts_cuda_bf16_moe_permute_backward;
    k.matmul_forward = ts_cuda_bf16_matmul_forward;
    k.matmul_backward = ts_cuda_bf16_matmul_backward;
    k.grouped_matmul_forward = ts_cuda_bf16_grouped_matmul_forward;
    k.grouped_matmul_backward = ts_cuda_bf16_grouped_matmul_backward;
    k.attention_forward = ts_cuda_attention_forward_bf16;
    k.attention_backward = ts_cuda_attention_backward_bf16;
    k.attention_prefix_saved_bytes = ts_cuda_bf16_attention_prefix_saved_bytes;
    k.attention_prefix_scratch_bytes = ts_cuda_bf16_attention_prefix_scratch_bytes;
    k.attention_prefix_forward = ts_cuda_bf16_attention_prefix_forward;
    k.attention_prefix_backward = ts_cuda_bf16_attention_prefix_backward;
    k.gelu_forward = ts_cuda_bf16_gelu_forward;
    k.gelu_backward = ts_cuda_bf16_gelu_backward;
    k.residual_forward = ts_cuda_bf16_residual_forward;
    k.residual_layernorm_forward = ts_cuda_bf16_residual_layernorm_forward;
    k.crossentropy_forward_backward = ts_cuda_bf16_crossentropy_forward_backward;
    k.vocab_embed_forward = ts_cuda_bf16_vocab_embed_forward;
    k.vocab_embed_backward = ts_cuda_bf16_vocab_embed_backward;
    k.xent_vp_stats = ts_cuda_bf16_xent_vp_stats;
    k.xent_vp_sumexp = ts_cuda_bf16_xent_vp_sumexp;
    k.xent_vp_finish = ts_cuda_bf16_xent_vp_finish;
    k.gemm = ts_cuda_bf16_gemm;
    return k;
}

/* A table with the flash-style attention (train.attention = "flash"), of the table's
 * precision; heads wider than it takes fall back to the table's batched-GEMM attention
 * (attention.cu). */
static constexpr ts_kernels with_flash_slots(ts_kernels k, const char *name, bool bf16)
{
    k.name = name;
    k.attention = "flash";
    k.attention_saved_bytes =
        bf16 ? ts_cuda_attention_saved_bytes_bf16_flash : ts_cuda_attention_saved_bytes_flash;
    k.attention_scratch_bytes = bf16 ? ts_cuda_attention_scratch_bytes_bf16_flash
                                     : ts_cuda_attention_scratch_bytes_flash;
    k.attention_forward =
        bf16 ? ts_cuda_attention_forward_bf16_flash : ts_cuda_attention_forward_flash;
    k.attention_backward =
        bf16 ? ts_cuda_attention_backward_bf16_flash : ts_cuda_attention_backward_flash;
    return k;
}

extern "C" const ts_kernels ts_kernels_cuda = fp32_table;
extern "C" const ts_kernels ts_kernels_cuda_flash = with_flash_slots(fp32_table, "cuda-flash", false);
extern "C" const ts_kernels ts_kernels_cuda_bf16 = with_bf16_slots(fp32_table);
extern "C" const ts_kernels ts_kernels_cuda_bf16_flash =
    with_flash_slots(with_bf16_slots(fp32_table), "cuda-bf16-flash", true);
