/* The CPU backend's kernel tables, fp32 and bf16, from one list of slots: a table is
 * its identity (precision, activation dtype, weight copies) and the kernels whose names
 * start with its prefix (ts_cpu_X for fp32, ts_cpu_bf16_X for bf16: each kernel's two
 * entry points over one body, storage.h). The dtype-free slots (memory, ordering,
 * reductions over fp32, the optimizer, the fp32 <-> bf16 conversion, the MoE router's
 * kernels) are shared. */
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

#define TS_CPU_TABLE(prefix)                                                                 \
    .device = "cpu", .attention = "gemm", .device_memory = false, .native_comm = NULL,       \
    .host_accessible = true, .dev_alloc = ts_cpu_dev_alloc, .dev_free = ts_cpu_dev_free,     \
    .memcpy_h2d = ts_cpu_memcpy, .memcpy_d2h = ts_cpu_memcpy, .memcpy_d2d = ts_cpu_memcpy,   \
    .memcpy_2d = ts_cpu_memcpy_2d, .memset_zero = ts_cpu_memset_zero,                        \
    .convert = ts_cpu_bf16_convert, /* the one fp32 <-> bf16 rounding (bf16.h) */            \
    .sum_into = ts_cpu_sum_into, .sum_squares_into = ts_cpu_sum_squares_into,                \
    .stream_create = ts_cpu_stream_create, .stream_destroy = ts_cpu_stream_destroy,          \
    .stream_sync = ts_cpu_stream_sync, .event_record = ts_cpu_event_record,                  \
    .event_wait = ts_cpu_event_wait, .adamw_update = ts_cpu_adamw_update,                    \
    .adamw_update_spans = ts_cpu_adamw_update_spans, .sum_squares = ts_cpu_sum_squares,      \
    .attention_saved_bytes = prefix##attention_saved_bytes,                                  \
    .attention_scratch_bytes = prefix##attention_scratch_bytes,                              \
    .attention_prefix_saved_bytes = prefix##attention_prefix_saved_bytes,                    \
    .attention_prefix_scratch_bytes = prefix##attention_prefix_scratch_bytes,                \
    .encoder_forward = prefix##encoder_forward, .encoder_backward = prefix##encoder_backward, \
    .layernorm_forward = prefix##layernorm_forward,                                          \
    .layernorm_backward = prefix##layernorm_backward,                                        \
    .matmul_forward = prefix##matmul_forward, .matmul_backward = prefix##matmul_backward,    \
    .grouped_matmul_forward = prefix##grouped_matmul_forward,                                \
    .grouped_matmul_backward = prefix##grouped_matmul_backward,                              \
    .attention_forward = prefix##attention_forward,                                          \
    .attention_backward = prefix##attention_backward,                                        \
    .attention_prefix_forward = prefix##attention_prefix_forward,                            \
    .attention_prefix_backward = prefix##attention_prefix_backward,                          \
    .gelu_forward = prefix##gelu_forward, .gelu_backward = prefix##gelu_backward,            \
    .residual_forward = prefix##residual_forward,                                            \
    .residual_layernorm_forward = prefix##residual_layernorm_forward,                        \
    .rmsnorm_forward = prefix##rmsnorm_forward, .rmsnorm_backward = prefix##rmsnorm_backward, \
    .residual_rmsnorm_forward = prefix##residual_rmsnorm_forward,                            \
    .rope_forward = prefix##rope_forward, .rope_backward = prefix##rope_backward,            \
    .swiglu_forward = prefix##swiglu_forward, .swiglu_backward = prefix##swiglu_backward,    \
    .crossentropy_forward_backward = prefix##crossentropy_forward_backward,                  \
    .vocab_embed_forward = prefix##vocab_embed_forward,                                      \
    .vocab_embed_backward = prefix##vocab_embed_backward,                                    \
    .xent_vp_stats = prefix##xent_vp_stats, .xent_vp_sumexp = prefix##xent_vp_sumexp,        \
    .xent_vp_finish = prefix##xent_vp_finish,                                                \
    /* the router's kernels are fp32/int32 whatever the table: one entry for both */         \
    .moe_route_forward = ts_cpu_moe_route_forward,                                           \
    .moe_route_backward = ts_cpu_moe_route_backward,                                         \
    .moe_aux_forward_backward = ts_cpu_moe_aux_forward_backward,                             \
    .moe_balance_forward_backward = ts_cpu_moe_balance_forward_backward,                     \
    .moe_count = ts_cpu_moe_count, .moe_permute = prefix##moe_permute,                       \
    .moe_combine = prefix##moe_combine, .moe_combine_backward = prefix##moe_combine_backward, \
    .moe_permute_backward = prefix##moe_permute_backward,                                    \
    .moe_capacity = ts_moe_capacity_keep, /* int32 and fp32: both tables' */              \
    /* Muon: its GEMM per table, the fp32 elementwise steps shared */                        \
    .gemm = prefix##gemm, .muon_momentum = ts_cpu_muon_momentum,                             \
    .muon_normalize = ts_cpu_muon_normalize, .muon_apply = ts_cpu_muon_apply,                \
    .adamw_delta_sq_spans = ts_cpu_adamw_delta_sq_spans

const ts_kernels ts_kernels_cpu = {
    .name = "cpu",
    .precision = "fp32",
    .act_dtype = TS_DTYPE_F32,
    .weight_copy_bytes = 0,
    TS_CPU_TABLE(ts_cpu_),
};

/* bf16 activations and compute weights (a 2-byte copy of each weight): oneDNN GEMMs,
 * the row kernels' bf16 path (kernels.h). */
const ts_kernels ts_kernels_cpu_bf16 = {
    .name = "cpu-bf16",
    .precision = "bf16",
    .act_dtype = TS_DTYPE_BF16,
    .weight_copy_bytes = 2,
    TS_CPU_TABLE(ts_cpu_bf16_),
};
