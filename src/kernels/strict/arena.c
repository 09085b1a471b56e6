/* The strict backend's device memory (see arena.h): a PROT_NONE reservation carved by a
 * first-fit allocator whose bookkeeping lives outside it (on host memory, so the
 * allocator never needs the range open). Freed blocks are given back with
 * MADV_DONTNEED, which also makes them read as zeros when reused. */
#define _GNU_SOURCE
#include "kernels/strict/arena.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"

/* Address space only (MAP_NORESERVE, PROT_NONE): pages cost memory once written. Large
 * enough for any model the strict mode tests; the tests use a few MiB. */
#define TS_STRICT_RESERVE ((size_t)64 << 30)

typedef struct {
    size_t off, len; /* bytes from the base; len is a multiple of the page size */
} extent;

typedef struct {
    extent *items;
    size_t n, cap;
} extent_list;

static struct {
    pthread_mutex_t mu;
    unsigned char *base; /* NULL until the first allocation */
    size_t page, top;    /* top: the end of the highest block ever handed out */
    extent_list free_blocks; /* sorted by offset, coalesced */
    extent_list live;        /* unsorted */
    int depth;               /* backend calls under way (all threads) */
    struct sigaction previous_segv;
} arena = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void protect(int prot)
{
    if (mprotect(arena.base, TS_STRICT_RESERVE, prot) != 0)
        ts_panic(__FILE__, __LINE__, "mprotect of the strict device arena failed");
}

/* ------------------------------------------------ the fault report -- */

static void write_str(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_segv(int sig, siginfo_t *info, void *uctx)
{
    (void)uctx;
    const unsigned char *addr = info->si_addr;
    if (arena.base && addr >= arena.base && addr < arena.base + TS_STRICT_RESERVE) {
        /* Dying anyway: read the block list without the lock (the faulting thread may
         * hold it) and format with snprintf, which glibc does not allocate for here. */
        size_t off = (size_t)(addr - arena.base);
        char msg[400];
        const extent *hit = NULL;
        for (size_t i = 0; i < arena.live.n; i++)
            if (off >= arena.live.items[i].off &&
                off < arena.live.items[i].off + arena.live.items[i].len)
                hit = &arena.live.items[i];
        if (hit)
            snprintf(msg, sizeof msg,
                     "error: host code touched device memory at %p, byte %zu of a %zu-byte "
                     "device buffer (train.device = \"cpu-strict\"): read and write device "
                     "buffers only through the backend (ts_kernels memcpy_h2d/d2h and "
                     "kernels)\n",
                     (const void *)addr, off - hit->off, hit->len);
        else
            snprintf(msg, sizeof msg,
                     "error: host code touched device memory at %p, outside every live "
                     "device buffer (freed, or never allocated) (train.device = "
                     "\"cpu-strict\")\n",
                     (const void *)addr);
        write_str(msg);
    }
    /* Not ours, or reported: the previous handler (the default one, or a sanitizer's)
     * takes the fault when the instruction runs again. */
    sigaction(sig, &arena.previous_segv, NULL);
}

static void reserve(void)
{
    arena.page = (size_t)sysconf(_SC_PAGESIZE);
    /* 2 MiB-aligned and backed by transparent huge pages where the kernel allows: each
     * open and close rewrites one page-table entry per 2 MiB instead of one per 4 KiB,
     * which is most of the cost of a backend call in this mode. */
    const size_t huge = (size_t)2 << 20;
    void *p = mmap(NULL, TS_STRICT_RESERVE + huge, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        ts_panic(__FILE__, __LINE__, "cannot reserve address space for the strict device arena");
    arena.base = (unsigned char *)(((uintptr_t)p + huge - 1) / huge * huge);
    (void)madvise(arena.base, TS_STRICT_RESERVE, MADV_HUGEPAGE); /* a hint: may be refused */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &arena.previous_segv) != 0)
        ts_panic(__FILE__, __LINE__, "cannot install the strict arena's SIGSEGV handler");
    /* A call may already be under way (an allocation made inside one). */
    if (arena.depth > 0) protect(PROT_READ | PROT_WRITE);
}

/* ------------------------------------------------------ the blocks -- */

static void push(extent_list *l, size_t at, extent e)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        extent *items = realloc(l->items, cap * sizeof *items);
        if (!items) ts_panic(__FILE__, __LINE__, "out of host memory for the strict arena");
        l->items = items;
        l->cap = cap;
    }
    memmove(&l->items[at + 1], &l->items[at], (l->n - at) * sizeof *l->items);
    l->items[at] = e;
    l->n++;
}

static void remove_at(extent_list *l, size_t at)
{
    memmove(&l->items[at], &l->items[at + 1], (l->n - at - 1) * sizeof *l->items);
    l->n--;
}

void *ts_strict_alloc(size_t bytes)
{
    if (bytes == 0) return NULL;
    pthread_mutex_lock(&arena.mu);
    if (!arena.base) reserve();
    size_t len = (bytes + arena.page - 1) / arena.page * arena.page;
    size_t off = SIZE_MAX;
    for (size_t i = 0; i < arena.free_blocks.n; i++) {
        extent *f = &arena.free_blocks.items[i];
        if (f->len < len) continue;
        off = f->off;
        f->off += len;
        f->len -= len;
        if (f->len == 0) remove_at(&arena.free_blocks, i);
        break;
    }
    if (off == SIZE_MAX) {
        if (len > TS_STRICT_RESERVE - arena.top) {
            pthread_mutex_unlock(&arena.mu);
            ts_panic(__FILE__, __LINE__,
                     "the strict device arena (64 GiB of address space) is exhausted: "
                     "train.device = \"cpu-strict\" is for tests of small models");
        }
        off = arena.top;
        arena.top += len;
    }
    push(&arena.live, arena.live.n, (extent){ off, len });
    pthread_mutex_unlock(&arena.mu);
    return arena.base + off; /* zero: never written, or given back with MADV_DONTNEED */
}

void ts_strict_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&arena.mu);
    TS_ASSERT(ts_strict_owns(p));
    size_t off = (size_t)((unsigned char *)p - arena.base), i = 0;
    while (i < arena.live.n && arena.live.items[i].off != off) i++;
    if (i == arena.live.n) {
        pthread_mutex_unlock(&arena.mu);
        ts_panic(__FILE__, __LINE__, "ts_strict_free of a pointer that is not a live block");
    }
    extent e = arena.live.items[i];
    arena.live.items[i] = arena.live.items[--arena.live.n];
    if (madvise(arena.base + e.off, e.len, MADV_DONTNEED) != 0)
        ts_panic(__FILE__, __LINE__, "madvise of a freed strict device block failed");
    /* Insert sorted, then merge with the neighbours it touches. */
    extent_list *fl = &arena.free_blocks;
    size_t at = 0;
    while (at < fl->n && fl->items[at].off < e.off) at++;
    push(fl, at, e);
    if (at + 1 < fl->n && fl->items[at].off + fl->items[at].len == fl->items[at + 1].off) {
        fl->items[at].len += fl->items[at + 1].len;
        remove_at(fl, at + 1);
    }
    if (at > 0 && fl->items[at - 1].off + fl->items[at - 1].len == fl->items[at].off) {
        fl->items[at - 1].len += fl->items[at].len;
        remove_at(fl, at);
    }
    pthread_mutex_unlock(&arena.mu);
}

/* --------------------------------------------------- open and close -- */

void ts_strict_enter(void)
{
    pthread_mutex_lock(&arena.mu);
    if (arena.depth++ == 0 && arena.base) protect(PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&arena.mu);
}

void ts_strict_leave(void)
{
    pthread_mutex_lock(&arena.mu);
    TS_ASSERT(arena.depth > 0);
    if (--arena.depth == 0 && arena.base) protect(PROT_NONE);
    pthread_mutex_unlock(&arena.mu);
}

bool ts_strict_owns(const void *p)
{
    const unsigned char *c = p;
    return arena.base && c >= arena.base && c < arena.base + TS_STRICT_RESERVE;
}
