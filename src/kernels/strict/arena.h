/* The strict test backend's device memory: one reserved address range whose pages are
 * PROT_NONE except while a backend call runs, so host code that reads or writes a
 * device buffer directly faults at that instruction instead of passing unnoticed on
 * the CPU (where device memory is host memory) and failing later on a GPU.
 *
 * Calls nest and may come from several threads (the async checkpoint saver copies
 * while the main thread computes): the range is opened on the first enter and closed
 * on the last leave. A fault inside the range is reported, with the buffer it hit,
 * before the process dies of the SIGSEGV. */
#ifndef TS_STRICT_ARENA_H
#define TS_STRICT_ARENA_H

#include <stdbool.h>
#include <stddef.h>

/* `bytes` of zeroed device memory, page-aligned (so also 64-byte aligned); aborts
 * when the reserve is exhausted. NULL for 0 bytes. */
void *ts_strict_alloc(size_t bytes);
void ts_strict_free(void *p);

/* Open the device memory to the calling backend call / close it again. */
void ts_strict_enter(void);
void ts_strict_leave(void);

/* Whether p points into the reserved range (allocated or not). */
bool ts_strict_owns(const void *p);

#endif
