#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char g_message[2048];

ts_status ts_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_message, sizeof g_message, fmt, ap);
    va_end(ap);
    return TS_ERR;
}

ts_status ts_error_prefix(const char *fmt, ...)
{
    char prefix[512];
    char old[sizeof g_message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_message, sizeof old);
    char joined[sizeof prefix + sizeof old];
    snprintf(joined, sizeof joined, "%s%s", prefix, old);
    memcpy(g_message, joined, sizeof g_message - 1);
    g_message[sizeof g_message - 1] = '\0';
    return TS_ERR;
}

const char *ts_error_message(void) { return g_message; }

void ts_error_clear(void) { g_message[0] = '\0'; }

void ts_panic(const char *file, int line, const char *what)
{
    fprintf(stderr, "tessera: internal error at %s:%d: %s\n", file, line, what);
    fflush(stderr);
    abort();
}

void *ts_malloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "tessera: out of memory allocating %zu bytes\n", bytes);
        abort();
    }
    return p;
}

void *ts_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "tessera: out of memory allocating %zu x %zu bytes\n", count, size);
        abort();
    }
    return p;
}

void *ts_grow(void *v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return v;
    size_t want = *cap ? 2 * *cap : 16;
    while (want <= n) want *= 2;
    void *grown = realloc(v, want * elem);
    if (!grown) {
        fprintf(stderr, "tessera: out of memory growing an array to %zu elements\n", want);
        abort();
    }
    *cap = want;
    return grown;
}

float *ts_alloc_floats(size_t count)
{
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) {
        fprintf(stderr, "tessera: out of memory allocating %zu floats\n", count);
        abort();
    }
    memset(p, 0, bytes);
    return p;
}
