/* Error reporting: recoverable errors return TS_ERR and leave a message that says
 * what was wrong and how to fix it; the caller decides who prints it (rank 0). */
#ifndef TS_ERROR_H
#define TS_ERROR_H

#include <stdarg.h>
#include <stddef.h>

/* C11's _Noreturn, spelled so the CUDA backend's C++ (nvcc) can include this header. */
#ifdef __cplusplus
#define TS_NORETURN [[noreturn]]
extern "C" {
#else
#define TS_NORETURN _Noreturn
#endif

typedef int ts_status; /* TS_OK or TS_ERR */
#define TS_OK 0
#define TS_ERR (-1)

/* The longest message kept, in bytes: room for PATH_MAX (4096) paths with their context
 * and cause. A longer one keeps its beginning and its end (where the cause is) and
 * elides the middle, marked " [...] ". */
#define TS_ERROR_MAX 8192

/* Record an error message (printf-style) and return TS_ERR. A second call
 * replaces the message; use ts_error_prefix() to add context while unwinding. */
ts_status ts_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prepend context ("loading model.init: ") to the current message; returns TS_ERR. */
ts_status ts_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The last recorded message ("" if none). */
const char *ts_error_message(void);
void ts_error_clear(void);

/* Programming errors (broken invariants) abort with file:line. Not for user input. */
#define TS_ASSERT(cond)                                                                \
    do {                                                                               \
        if (!(cond)) ts_panic(__FILE__, __LINE__, #cond);                              \
    } while (0)
TS_NORETURN void ts_panic(const char *file, int line, const char *what);

/* Allocation a run cannot continue without: when the memory is not there, they print
 * "tessera: error: out of memory allocating N bytes" and exit 1 at once (no abort, no
 * core dump; under mpirun the launcher then ends the other ranks). Where the caller can
 * recover, or can say better what it was allocating, use the ts_try_ forms and return a
 * ts_status that names the buffer. */
void *ts_malloc(size_t bytes);
void *ts_calloc(size_t count, size_t size);
/* 64-byte aligned, zeroed; free with free(). */
float *ts_alloc_floats(size_t count);
/* Room for element n of a growing array v of *cap elements of elem bytes: v itself, or
 * v reallocated to twice the capacity (at least 16), *cap updated. Exits when out of
 * memory, as ts_malloc does. */
void *ts_grow(void *v, size_t *cap, size_t n, size_t elem);

/* The fallible forms: NULL when out of memory (ts_try_grow then leaves v and *cap as they
 * were, v still the caller's). */
void *ts_try_malloc(size_t bytes);
void *ts_try_grow(void *v, size_t *cap, size_t n, size_t elem);

/* The out-of-memory exit of the allocators above, for an allocation made elsewhere (a
 * backend's device buffer): prints "tessera: error: out of memory allocating N bytes"
 * and `what` (", for ..."; NULL: nothing), then _exit(1). Safe in any thread. */
TS_NORETURN void ts_out_of_memory(size_t bytes, const char *what);

#ifdef __cplusplus
}
#endif

#endif
