#include "kernels/cpu/blas_core.h"

#include <cblas.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/env.h"
#include "core/error.h"
#include "core/timer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

uint64_t ts_cpu_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

ts_isa ts_cpu_isa(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return TS_ISA_SSE;
    bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12);
    if (!osxsave || !avx) return TS_ISA_SSE;
    /* The OS must save the YMM (bits 1-2) and, for AVX-512, opmask/ZMM (5-7) state. */
    uint64_t xcr0 = ts_cpu_xcr0();
    if ((xcr0 & 0x6) != 0x6) return TS_ISA_SSE;
    unsigned b7 = 0, c7 = 0, d7 = 0, a7 = 0;
    if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return TS_ISA_AVX;
    bool avx2 = b7 & (1u << 5);
    if (!avx2 || !fma) return TS_ISA_AVX;
    bool f = b7 & (1u << 16), dq = b7 & (1u << 17), bw = b7 & (1u << 30), vl = b7 & (1u << 31);
    if (f && dq && bw && vl && (xcr0 & 0xe0) == 0xe0) return TS_ISA_AVX512;
    return TS_ISA_AVX2;
}
#else
ts_isa ts_cpu_isa(void) { return TS_ISA_UNKNOWN; }
#endif

/* OpenBLAS 0.3.21's x86-64 core names (driver/others/dynamic.c) by the vector ISA of
 * their sgemm kernels. */
static const struct {
    const char *name;
    ts_isa isa;
} k_cores[] = {
    {"Prescott", TS_ISA_SSE},       {"Core2", TS_ISA_SSE},        {"Penryn", TS_ISA_SSE},
    {"Dunnington", TS_ISA_SSE},     {"Nehalem", TS_ISA_SSE},      {"Atom", TS_ISA_SSE},
    {"Katmai", TS_ISA_SSE},         {"Coppermine", TS_ISA_SSE},   {"Northwood", TS_ISA_SSE},
    {"Banias", TS_ISA_SSE},         {"Athlon", TS_ISA_SSE},       {"Opteron", TS_ISA_SSE},
    {"Opteron_SSE3", TS_ISA_SSE},   {"Barcelona", TS_ISA_SSE},    {"Nano", TS_ISA_SSE},
    {"Bobcat", TS_ISA_SSE},         {"Sandybridge", TS_ISA_AVX},  {"Bulldozer", TS_ISA_AVX},
    {"Piledriver", TS_ISA_AVX},     {"Steamroller", TS_ISA_AVX},  {"Excavator", TS_ISA_AVX2},
    {"Haswell", TS_ISA_AVX2},       {"Zen", TS_ISA_AVX2},         {"SkylakeX", TS_ISA_AVX512},
    {"Cooperlake", TS_ISA_AVX512},  {"SapphireRapids", TS_ISA_AVX512},
};

ts_isa ts_blas_core_isa(const char *core)
{
    for (size_t i = 0; i < sizeof k_cores / sizeof k_cores[0]; i++)
        if (core && strcasecmp(core, k_cores[i].name) == 0) return k_cores[i].isa;
    return TS_ISA_UNKNOWN;
}

static const char *best_core(ts_isa cpu)
{
    return cpu >= TS_ISA_AVX512 ? "SkylakeX" : cpu >= TS_ISA_AVX2 ? "Haswell" : NULL;
}

const char *ts_blas_pick_core(ts_isa cpu, const char *chosen, bool user_set, bool *warn)
{
    *warn = false;
    ts_isa have = ts_blas_core_isa(chosen);
    /* A fallback: a known pre-AVX2 core on a CPU that runs AVX2 or AVX-512 kernels. */
    bool fallback = have != TS_ISA_UNKNOWN && have < TS_ISA_AVX2 && cpu >= TS_ISA_AVX2;
    if (!fallback) return NULL;
    if (user_set) {
        *warn = true;
        return NULL;
    }
    return best_core(cpu);
}

/* Set by the re-executed process's parent: what OpenBLAS picked on its own. */
#define ENV_ORIGINAL "TS_BLAS_CORE_ORIGINAL"

static char g_note[256];

void ts_blas_select_core(int argc, char **argv)
{
    (void)argc;
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *original = getenv(ENV_ORIGINAL);
    /* TS_FAKE_BLAS_CORE pretends OpenBLAS chose that core (as TS_FAKE_NODES pretends a
     * node layout): it lets the tests drive the re-execution on a CPU OpenBLAS knows. */
    const char *fake = ts_env(TS_ENV_FAKE_BLAS_CORE);
    const char *chosen = fake && !original ? fake : openblas_get_corename();
    ts_isa cpu = ts_cpu_isa();
    if (original) { /* we are the re-executed process */
        snprintf(g_note, sizeof g_note, "chosen by Tessera: OpenBLAS picked %s on an %s CPU",
                 original, cpu >= TS_ISA_AVX512 ? "AVX-512" : "AVX2");
        if (ts_blas_core_isa(chosen) < TS_ISA_AVX2)
            fprintf(stderr,
                    "tessera: warning: OPENBLAS_CORETYPE=%s did not take (OpenBLAS runs %s): "
                    "this OpenBLAS build may lack that kernel; GEMMs will be slow\n",
                    user ? user : "?", chosen);
        unsetenv(ENV_ORIGINAL); /* children (mpirun's ranks) decide for themselves */
        unsetenv("TS_FAKE_BLAS_CORE");
        return;
    }
    bool warn = false;
    const char *pick = ts_blas_pick_core(cpu, chosen, user != NULL, &warn);
    if (warn) {
        fprintf(stderr,
                "tessera: warning: OPENBLAS_CORETYPE=%s runs OpenBLAS's %s kernel, but this CPU "
                "runs %s kernels (%s); unset OPENBLAS_CORETYPE to let Tessera choose\n",
                user ? user : "?", chosen, cpu >= TS_ISA_AVX512 ? "AVX-512" : "AVX2",
                best_core(cpu) ? best_core(cpu) : "?");
    }
    if (!pick) {
        snprintf(g_note, sizeof g_note, "%s", user ? "set by OPENBLAS_CORETYPE" : "OpenBLAS's choice");
        return;
    }
    /* OpenBLAS has chosen at load time: only a new process image can change it. */
    setenv("OPENBLAS_CORETYPE", pick, 1);
    setenv(ENV_ORIGINAL, chosen, 1);
    execv("/proc/self/exe", argv);
    fprintf(stderr,
            "tessera: warning: OpenBLAS runs its generic %s kernel on a CPU with %s; "
            "re-executing with OPENBLAS_CORETYPE=%s failed (%s): set it yourself\n",
            chosen, cpu >= TS_ISA_AVX512 ? "AVX-512" : "AVX2", pick, strerror(errno));
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(ENV_ORIGINAL);
    snprintf(g_note, sizeof g_note, "OpenBLAS's choice (a generic fallback)");
}

const char *ts_blas_core(void) { return openblas_get_corename(); }

const char *ts_blas_core_note(char *buf, size_t size)
{
    snprintf(buf, size, "%s (%s)", openblas_get_corename(),
             g_note[0] ? g_note : "OpenBLAS's choice");
    return buf;
}

double ts_blas_measure_gflops(void)
{
    /* A GPT-2-like shape, large enough to reach the kernel's rate on a few threads: best
     * of the runs after a warm-up, at least two, until 20 ms are spent (7 ms a run on
     * one Zen 3 core). Every rank of every launch pays it, so it stays short: at 100 ms
     * it was about 8% of the CPU time of test_plan_memory's 2-step runs, and six runs on
     * one core read 88.8-93.7 GFLOP/s with 100 ms, 89.0-93.7 with 20 ms. */
    const int m = 512, n = 768, k = 768;
    float *a = ts_alloc_floats((size_t)m * k), *b = ts_alloc_floats((size_t)k * n),
          *c = ts_alloc_floats((size_t)m * n);
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)k * n; i++) b[i] = (float)((i * 5) % 11) * 0.01f;
    double best = 1e30, spent = 0.0;
    for (int rep = 0; rep < 20 && (rep < 3 || spent < 20.0); rep++) {
        double t0 = ts_now_ms();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        double dt = ts_now_ms() - t0;
        spent += dt;
        if (rep > 0 && dt < best) best = dt;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * m * n * k / (best * 1e-3) / 1e9;
}

const char *ts_cpu_model(char *buf, size_t size)
{
    snprintf(buf, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return buf;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *colon = strchr(line, ':');
        if (!colon) break;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(buf, size, "%s", colon);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
    return buf;
}
