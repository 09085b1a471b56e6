/* The bf16 CPU backend's kernel table, and what the CPU and oneDNN can do for it. The
 * dtype-free slots (memory, ordering, reductions over fp32, the optimizer) are the fp32
 * CPU backend's functions. */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>

#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/cpu_bf16_internal.h"
#include "kernels/cpu/cpu_internal.h"

/* AVX512_BF16 (CPUID.(7,1):EAX[5], with AVX512F: Zen 4, Cooper Lake, Sapphire Rapids)
 * or AMX-BF16 (CPUID.(7,0):EDX[22]: Sapphire Rapids and later), and the OS saving the
 * state they need: the ZMM and opmask registers (XCR0 bits 1, 2, 5-7), and for AMX the
 * tile registers (bits 17, 18; Linux then grants them per process on request, which
 * oneDNN makes). */
#if defined(__x86_64__) || defined(__i386__)
bool ts_cpu_bf16_supported(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false; /* OSXSAVE */
    uint64_t x = ts_cpu_xcr0();
    bool zmm_saved = (x & 0xe6) == 0xe6;
    bool tiles_saved = (x & (3u << 17)) == (3u << 17);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    bool avx512f = b & (1u << 16), amx_bf16 = d & (1u << 22);
    unsigned a1, b1, c1, d1;
    bool avx512_bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) && (a1 & (1u << 5));
    return (avx512f && avx512_bf16 && zmm_saved) || (amx_bf16 && tiles_saved && zmm_saved);
}
#else
bool ts_cpu_bf16_supported(void) { return false; }
#endif

/* What oneDNN dispatches to (DNNL_MAX_CPU_ISA may lower it). */
const char *ts_dnnl_isa(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

const ts_kernels ts_kernels_cpu_bf16 = {
    .name = "cpu-bf16",
    .device = "cpu",
    .precision = "bf16",
    .act_dtype = TS_DTYPE_BF16,
    .attention = "gemm",
    .device_memory = false,
    .weight_copy_bytes = 2,
    .native_comm = NULL,
    .host_accessible = true,
    .dev_alloc = ts_cpu_dev_alloc,
    .dev_free = ts_cpu_dev_free,
    .memcpy_h2d = ts_cpu_memcpy,
    .memcpy_d2h = ts_cpu_memcpy,
    .memcpy_d2d = ts_cpu_memcpy,
    .memcpy_2d = ts_cpu_memcpy_2d,
    .memset_zero = ts_cpu_memset_zero,
    .convert = ts_cpu_bf16_convert,
    .sum_into = ts_cpu_sum_into,
    .sum_squares_into = ts_cpu_sum_squares_into,
    .stream_create = ts_cpu_stream_create,
    .stream_destroy = ts_cpu_stream_destroy,
    .stream_sync = ts_cpu_stream_sync,
    .event_record = ts_cpu_event_record,
    .event_wait = ts_cpu_event_wait,
    .attention_saved_bytes = ts_cpu_bf16_attention_saved_bytes,
    .attention_scratch_bytes = ts_cpu_bf16_attention_scratch_bytes,
    .attention_prefix_saved_bytes = ts_cpu_bf16_attention_prefix_saved_bytes,
    .attention_prefix_scratch_bytes = ts_cpu_bf16_attention_prefix_scratch_bytes,
    .encoder_forward = ts_cpu_bf16_encoder_forward,
    .encoder_backward = ts_cpu_bf16_encoder_backward,
    .layernorm_forward = ts_cpu_bf16_layernorm_forward,
    .layernorm_backward = ts_cpu_bf16_layernorm_backward,
    .matmul_forward = ts_cpu_bf16_matmul_forward,
    .matmul_backward = ts_cpu_bf16_matmul_backward,
    .attention_forward = ts_cpu_bf16_attention_forward,
    .attention_backward = ts_cpu_bf16_attention_backward,
    .attention_prefix_forward = ts_cpu_bf16_attention_prefix_forward,
    .attention_prefix_backward = ts_cpu_bf16_attention_prefix_backward,
    .gelu_forward = ts_cpu_bf16_gelu_forward,
    .gelu_backward = ts_cpu_bf16_gelu_backward,
    .residual_forward = ts_cpu_bf16_residual_forward,
    .residual_layernorm_forward = ts_cpu_bf16_residual_layernorm_forward,
    .rmsnorm_forward = ts_cpu_bf16_rmsnorm_forward,
    .rmsnorm_backward = ts_cpu_bf16_rmsnorm_backward,
    .residual_rmsnorm_forward = ts_cpu_bf16_residual_rmsnorm_forward,
    .rope_forward = ts_cpu_bf16_rope_forward,
    .rope_backward = ts_cpu_bf16_rope_backward,
    .swiglu_forward = ts_cpu_bf16_swiglu_forward,
    .swiglu_backward = ts_cpu_bf16_swiglu_backward,
    .crossentropy_forward_backward = ts_cpu_bf16_crossentropy_forward_backward,
    .adamw_update = ts_cpu_adamw_update,
    .adamw_update_spans = ts_cpu_adamw_update_spans,
    .sum_squares = ts_cpu_sum_squares,
    .vocab_embed_forward = ts_cpu_bf16_vocab_embed_forward,
    .vocab_embed_backward = ts_cpu_bf16_vocab_embed_backward,
    .xent_vp_stats = ts_cpu_bf16_xent_vp_stats,
    .xent_vp_sumexp = ts_cpu_bf16_xent_vp_sumexp,
    .xent_vp_finish = ts_cpu_bf16_xent_vp_finish,
};
