/* The right OpenBLAS kernel on every x86-64 CPU. Debian's OpenBLAS 0.3.21 picks its
 * kernel ("core") from cpuid when the library loads; on CPUs newer than it knows (e.g.
 * Sapphire/Emerald Rapids, family 6 model 207) it falls back to a generic SSE3 core
 * ("Prescott") that runs sgemm at a fifth of the speed. OpenBLAS reads
 * OPENBLAS_CORETYPE only at load time, so the fix must happen before: at start-up
 * Tessera compares what the CPU supports with the core OpenBLAS chose and, when it is a
 * generic fallback on a CPU that runs a better one, re-executes itself with
 * OPENBLAS_CORETYPE set. A user's own OPENBLAS_CORETYPE is respected (only warned about
 * when it wastes the CPU). */
#ifndef TS_BLAS_CORE_H
#define TS_BLAS_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* Vector level of a CPU or of an OpenBLAS core: what its sgemm kernel uses. */
typedef enum {
    TS_ISA_UNKNOWN = -1,
    TS_ISA_SSE = 0,    /* Prescott, Core2, Nehalem, ...: the generic fallbacks */
    TS_ISA_AVX = 1,    /* Sandybridge, Bulldozer: AVX without FMA */
    TS_ISA_AVX2 = 2,   /* Haswell, Zen, Excavator: AVX2 + FMA */
    TS_ISA_AVX512 = 3, /* SkylakeX, Cooperlake, SapphireRapids: AVX-512 F/BW/VL/DQ */
} ts_isa;

/* What this CPU runs: cpuid features and the OS's saved register state (XGETBV). */
ts_isa ts_cpu_isa(void);
#if defined(__x86_64__) || defined(__i386__)
/* XCR0 through XGETBV: the register state the OS saves; callers check OSXSAVE first
 * (ts_cpu_isa, ts_cpu_bf16_supported). */
uint64_t ts_cpu_xcr0(void);
#endif
/* The level of an OpenBLAS core name (case-insensitive); TS_ISA_UNKNOWN if unknown. */
ts_isa ts_blas_core_isa(const char *core);

/* The decision, as a pure function (tested without the CPU it describes): the core to
 * set in OPENBLAS_CORETYPE, or NULL to keep OpenBLAS's choice. Only a generic fallback
 * (a core below AVX2) on a CPU with AVX2 or better is replaced; a real detection
 * (Zen on an AVX-512 Zen 4, say) is kept. With user_set, never replaces; *warn is set
 * when the user's core wastes the CPU the same way. */
const char *ts_blas_pick_core(ts_isa cpu, const char *chosen, bool user_set, bool *warn);

/* Call first in main(), before anything uses BLAS or MPI: may re-execute the program
 * (execv of /proc/self/exe with the same argv) with OPENBLAS_CORETYPE set. Returns
 * only when no re-execution is needed (or it failed: then a warning is printed). */
void ts_blas_select_core(int argc, char **argv);

/* What the start-up report shows of the host's BLAS (ts_blas_core, ts_blas_core_note,
 * ts_blas_measure_gflops, ts_cpu_model) is declared in kernels/kernels.h: callers
 * outside the backend need no private header. */

#endif
