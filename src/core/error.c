#include "core/error.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static _Thread_local char g_message[TS_ERROR_MAX];

/* A UTF-8 continuation byte: an elision must not cut a character in two. */
static int continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

/* The message text[0..len) into g_message. One too long keeps its head and its tail:
 * the cause ("File name too long") comes last, after the paths that make a message long,
 * and a plain cut would lose exactly it. */
static void store(const char *text, size_t len)
{
    if (len < sizeof g_message) {
        memmove(g_message, text, len);
        g_message[len] = '\0';
        return;
    }
    static const char mark[] = " [...] ";
    const size_t room = sizeof g_message - 1 - (sizeof mark - 1);
    size_t head = room / 2, tail = room - head;
    while (head > 0 && continuation((unsigned char)text[head])) head--;
    while (tail > 0 && continuation((unsigned char)text[len - tail])) tail--;
    memcpy(g_message, text, head);
    memcpy(g_message + head, mark, sizeof mark - 1);
    memcpy(g_message + head + sizeof mark - 1, text + len - tail, tail);
    g_message[head + sizeof mark - 1 + tail] = '\0';
}

/* fmt with ap, malloc'ed (its length in *len), or NULL when even that small allocation
 * fails; the arguments may point into g_message (ts_fail("%s", ts_error_message())). */
static char *format(size_t *len, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) {
        vsnprintf(s, (size_t)n + 1, fmt, again);
        *len = (size_t)n;
    }
    va_end(again);
    return s;
}

ts_status ts_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t len = 0;
    char *s = format(&len, fmt, ap);
    va_end(ap);
    if (s) {
        store(s, len);
        free(s);
    } else { /* out of memory: the message cut at the buffer's size rather than none */
        char cut[TS_ERROR_MAX];
        va_start(ap, fmt);
        vsnprintf(cut, sizeof cut, fmt, ap);
        va_end(ap);
        store(cut, strlen(cut));
    }
    return TS_ERR;
}

ts_status ts_error_prefix(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t plen = 0;
    char *prefix = format(&plen, fmt, ap);
    va_end(ap);
    const size_t olen = strlen(g_message);
    char *joined = prefix ? malloc(plen + olen + 1) : NULL;
    if (joined) {
        memcpy(joined, prefix, plen);
        memcpy(joined + plen, g_message, olen + 1);
        store(joined, plen + olen);
    } /* else out of memory: the message without its context rather than none */
    free(joined);
    free(prefix);
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

void ts_out_of_memory(size_t bytes, const char *what)
{
    /* No allocation and no stdio lock here: the heap is exhausted, and another thread
     * may hold stderr's lock. _exit, not exit: the other threads are still running, and
     * atexit handlers (OpenBLAS's, the CUDA runtime's) would free what they use. */
    char msg[1024];
    int n = snprintf(msg, sizeof msg,
                     "tessera: error: out of memory allocating %zu bytes (%.1f MiB)%s%s: the "
                     "machine's memory or this process's address-space limit (ulimit -v) is "
                     "exhausted\n",
                     bytes, (double)bytes / 1048576.0, what ? ", for " : "", what ? what : "");
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    if (len && msg[len - 1] != '\n') msg[len - 1] = '\n';
    for (size_t off = 0; off < len;) {
        ssize_t w = write(STDERR_FILENO, msg + off, len - off);
        if (w <= 0) break;
        off += (size_t)w;
    }
    _exit(1);
}

void *ts_try_malloc(size_t bytes) { return malloc(bytes ? bytes : 1); }

void *ts_malloc(size_t bytes)
{
    void *p = ts_try_malloc(bytes);
    if (!p) ts_out_of_memory(bytes, NULL);
    return p;
}

void *ts_calloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        /* count * size as the bytes asked for; SIZE_MAX when the product itself overflows */
        const size_t bytes = size && count > SIZE_MAX / size ? SIZE_MAX : count * size;
        ts_out_of_memory(bytes, NULL);
    }
    return p;
}

void *ts_try_grow(void *v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return v;
    size_t want = *cap ? *cap : 16;
    while (want <= n) {
        if (want > SIZE_MAX / 2) return NULL;
        want *= 2;
    }
    if (elem && want > SIZE_MAX / elem) return NULL;
    void *grown = realloc(v, want * elem);
    if (!grown) return NULL;
    *cap = want;
    return grown;
}

void *ts_grow(void *v, size_t *cap, size_t n, size_t elem)
{
    void *grown = ts_try_grow(v, cap, n, elem);
    if (!grown) {
        /* what the doubling asked for (as ts_try_grow computes it, saturated) */
        size_t want = *cap ? *cap : 16;
        while (want <= n && want <= SIZE_MAX / 2) want *= 2;
        ts_out_of_memory(elem && want > SIZE_MAX / elem ? SIZE_MAX : want * elem,
                         "a growing array");
    }
    return grown;
}

float *ts_alloc_floats(size_t count)
{
    if (count > (SIZE_MAX - 63) / sizeof(float)) ts_out_of_memory(SIZE_MAX, NULL);
    size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) ts_out_of_memory(bytes, NULL);
    memset(p, 0, bytes);
    return p;
}
