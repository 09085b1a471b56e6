/* What the CPU and oneDNN can do for the bf16 CPU backend (its table is table.c's,
 * beside the fp32 one). */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <oneapi/dnnl/dnnl.h>
#include <stdint.h>

#include "kernels/cpu/blas_core.h"
#include "kernels/kernels.h"

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
