/* What memory this process may use and already uses (Linux /proc, cgroups, rlimits). */
#ifndef TS_SYSMEM_H
#define TS_SYSMEM_H

#include <stdbool.h>
#include <stddef.h>

/* Address space each BLAS thread adds: OpenBLAS 0.3 maps a 128 MiB GEMM buffer per
 * thread (BUFFER_SIZE on x86-64) and the thread has a stack; measured 136 MiB per thread
 * (VmSize with 8 and 32 threads, bench/RESULTS.md "Memory estimate"). Mostly untouched,
 * so it counts against RLIMIT_AS, not physical memory. */
#define TS_BLAS_THREAD_BYTES (136.0 * 1024 * 1024)

/* What this process may use: physical memory (MemTotal, or the cgroup's memory.max
 * when lower) and the address-space limit (RLIMIT_AS; +inf when unlimited), in bytes,
 * plus what the process already uses (resident and virtual), so the check compares
 * new allocations with what is left. */
typedef struct {
    double physical, address_space;
    double rss_now, vm_now;
} ts_sysmem;
void ts_sysmem_read(ts_sysmem *lim);

/* The peak resident memory from now on: reset_peak starts it again at the current
 * resident size (Linux's clear_refs "5"; false where the kernel offers none), peak_rss
 * reads it (VmHWM, bytes; 0 when unknown). The trainer reports the steps' own peak
 * this way, without the set-up's transients (ZeRO-3 builds the full weights once). */
bool ts_sysmem_reset_peak(void);
double ts_sysmem_peak_rss(void);

/* "1.50 GiB", "272.00 MiB" or "12.5 KiB" into buf; returns buf. */
const char *ts_format_bytes(double bytes, char *buf, size_t size);

#endif
