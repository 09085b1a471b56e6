/* The watchdog thread and the main thread's marks (watchdog.h).
 *
 * The record is a seqlock with one writer at a time (the main thread, or the pipeline
 * pair's worker while it holds the baton: watchdog.h): a mark makes the sequence
 * odd, stores the fields, and makes it even again, all plain (relaxed or release)
 * stores that compile to ordinary moves on x86 and ARM. Every mark moves the sequence,
 * so the sequence is also the progress counter: the thread remembers when it last saw
 * it change, and fires once it has stood still for the timeout. Time is read by the
 * thread only, once per tick (a tenth of the timeout, at most a second), so a hang is
 * reported between timeout and timeout + one tick after the last mark.
 *
 * Only time this process was running counts: a tick that comes late by more than a
 * tick (the process was SIGSTOPped, suspended by the scheduler, or starved) adds two
 * ticks at most. Otherwise a rank continued after a stop, or a whole job resumed after
 * `scontrol suspend`, would fire at once on time it never had to make progress. */
#include "core/watchdog.h"

#include "core/timer.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    atomic_uint seq; /* odd while a mark is being written; moves on every mark */
    atomic_int step;
    _Atomic(const char *) action, comm, ctx_fmt;
    atomic_int waiting, peer, ctx_a, ctx_b, ctx_c;
} rec = {.step = -1, .peer = -1};

/* A consistent copy of the record. */
typedef struct {
    int step, waiting, peer, ctx_a, ctx_b, ctx_c;
    const char *action, *comm, *ctx_fmt;
} where;

#define RLX memory_order_relaxed

static inline unsigned write_open(void)
{
    unsigned s = atomic_load_explicit(&rec.seq, RLX);
    atomic_store_explicit(&rec.seq, s + 1, RLX);
    atomic_thread_fence(memory_order_release); /* the odd sequence before the fields */
    return s;
}

static inline void write_close(unsigned s)
{
    atomic_store_explicit(&rec.seq, s + 2, memory_order_release);
}

void ts_watchdog_step(int step)
{
    unsigned s = write_open();
    atomic_store_explicit(&rec.step, step, RLX);
    atomic_store_explicit(&rec.ctx_fmt, NULL, RLX);
    write_close(s);
}

void ts_watchdog_context(const char *fmt, int a, int b, int c)
{
    unsigned s = write_open();
    atomic_store_explicit(&rec.ctx_fmt, fmt, RLX);
    atomic_store_explicit(&rec.ctx_a, a, RLX);
    atomic_store_explicit(&rec.ctx_b, b, RLX);
    atomic_store_explicit(&rec.ctx_c, c, RLX);
    write_close(s);
}

void ts_watchdog_wait_begin(const char *action, const char *comm, int peer)
{
    unsigned s = write_open();
    atomic_store_explicit(&rec.action, action, RLX);
    atomic_store_explicit(&rec.comm, comm, RLX);
    atomic_store_explicit(&rec.peer, peer, RLX);
    atomic_store_explicit(&rec.waiting, 1, RLX);
    write_close(s);
}

void ts_watchdog_wait_end(void)
{
    unsigned s = write_open();
    atomic_store_explicit(&rec.waiting, 0, RLX);
    write_close(s);
}

void ts_watchdog_progress(void)
{
    /* One atomic add: the data-parallel communication thread marks progress too, and a
     * load-then-store racing a main-thread mark could leave the sequence odd. */
    atomic_fetch_add_explicit(&rec.seq, 2, memory_order_release);
}

/* Read the record; the writer is blocked (or gone) when this matters, so a few
 * retries always suffice; after them, take what is there. */
static unsigned read_where(where *w)
{
    unsigned s0 = 0;
    for (int attempt = 0; attempt < 1000; attempt++) {
        s0 = atomic_load_explicit(&rec.seq, memory_order_acquire);
        w->step = atomic_load_explicit(&rec.step, RLX);
        w->waiting = atomic_load_explicit(&rec.waiting, RLX);
        w->peer = atomic_load_explicit(&rec.peer, RLX);
        w->action = atomic_load_explicit(&rec.action, RLX);
        w->comm = atomic_load_explicit(&rec.comm, RLX);
        w->ctx_fmt = atomic_load_explicit(&rec.ctx_fmt, RLX);
        w->ctx_a = atomic_load_explicit(&rec.ctx_a, RLX);
        w->ctx_b = atomic_load_explicit(&rec.ctx_b, RLX);
        w->ctx_c = atomic_load_explicit(&rec.ctx_c, RLX);
        atomic_thread_fence(memory_order_acquire);
        if (!(s0 & 1u) && atomic_load_explicit(&rec.seq, RLX) == s0) break;
    }
    return s0;
}

/* ------------------------------------------------------------------ the thread */

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int running, stop;
    double timeout_ms, tick_ms;
    int timeout_s, rank;
    char host[256];
} wd = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t append(char *buf, size_t at, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static size_t append(char *buf, size_t at, size_t cap, const char *fmt, ...)
{
    if (at >= cap) return at;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + at, cap - at, fmt, ap);
    va_end(ap);
    return n < 0 ? at : at + (size_t)n;
}

/* The one message, then the end of this process. write(2) rather than stdio: the main
 * thread may hold stderr's lock. */
static _Noreturn void fire(const where *w, double stalled_ms)
{
    char buf[2048], ctx[320] = "";
    size_t at = 0, cap = sizeof buf;
    if (w->ctx_fmt) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(ctx, sizeof ctx, w->ctx_fmt, w->ctx_a, w->ctx_b, w->ctx_c);
#pragma GCC diagnostic pop
    }
    at = append(buf, at, cap,
                "tessera: watchdog: rank %d (host %s, pid %ld) made no progress for %.1f s ",
                wd.rank, wd.host, (long)getpid(), stalled_ms * 1e-3);
    if (w->step >= 0)
        at = append(buf, at, cap, "at step %d", w->step);
    else
        at = append(buf, at, cap, "during setup (before step 0)");
    if (w->waiting) {
        at = append(buf, at, cap, ": waiting in %s on communicator \"%s\"",
                    w->action ? w->action : "?", w->comm ? w->comm : "?");
        if (w->peer >= 0) at = append(buf, at, cap, " with peer %d", w->peer);
        if (ctx[0]) at = append(buf, at, cap, " (%s)", ctx);
        at = append(buf, at, cap,
                    ".\ntessera: watchdog: another rank probably stopped, hung or crashed, or the "
                    "network is stuck: find the rank that is not waiting (the one with no such "
                    "message, or whose message names no wait) and check its process and host.");
    } else {
        at = append(buf, at, cap, ": busy outside communication%s%s%s", ctx[0] ? " (" : "", ctx,
                    ctx[0] ? ")" : "");
        at = append(buf, at, cap,
                    ".\ntessera: watchdog: this rank itself is stuck in computation or I/O (a hung "
                    "kernel, device or file system), or it is just slower than the timeout.");
    }
    at = append(buf, at, cap,
                " If a step (or the setup) legitimately takes longer than %d s, raise "
                "train.timeout_s (0 turns the watchdog off). Aborting the job with exit code %d.\n",
                wd.timeout_s, TS_EXIT_WATCHDOG);
    size_t len = at < cap ? at : cap - 1;
    for (size_t off = 0; off < len;) {
        ssize_t n = write(STDERR_FILENO, buf + off, len - off);
        if (n <= 0) break;
        off += (size_t)n;
    }
    _exit(TS_EXIT_WATCHDOG);
}

static void *watch(void *arg)
{
    (void)arg;
    where w;
    unsigned seen = atomic_load_explicit(&rec.seq, memory_order_acquire);
    double last = ts_now_ms(), stalled = 0.0; /* running time without a mark */
    pthread_mutex_lock(&wd.mu);
    while (!wd.stop) {
        struct timespec dl;
        clock_gettime(CLOCK_MONOTONIC, &dl);
        long long ns = (long long)dl.tv_nsec + (long long)(wd.tick_ms * 1e6);
        dl.tv_sec += (time_t)(ns / 1000000000LL);
        dl.tv_nsec = (long)(ns % 1000000000LL);
        pthread_cond_timedwait(&wd.cv, &wd.mu, &dl);
        if (wd.stop) break;
        unsigned s = atomic_load_explicit(&rec.seq, memory_order_acquire);
        double t = ts_now_ms(), dt = t - last;
        last = t;
        if (s != seen) {
            seen = s;
            stalled = 0.0;
            continue;
        }
        stalled += dt < 2.0 * wd.tick_ms ? dt : 2.0 * wd.tick_ms;
        if (stalled >= wd.timeout_ms) {
            /* Still no mark after reading the record: the main thread is stuck. */
            if (read_where(&w) == seen) fire(&w, stalled);
            seen = atomic_load_explicit(&rec.seq, RLX);
            stalled = 0.0;
        }
    }
    pthread_mutex_unlock(&wd.mu);
    return NULL;
}

ts_status ts_watchdog_start(int timeout_s, int rank, const char *host)
{
    if (timeout_s <= 0 || wd.running) return TS_OK;
    wd.timeout_s = timeout_s;
    wd.timeout_ms = timeout_s * 1e3;
    wd.tick_ms = wd.timeout_ms / 10.0 < 1000.0 ? wd.timeout_ms / 10.0 : 1000.0;
    wd.rank = rank;
    snprintf(wd.host, sizeof wd.host, "%s", host && host[0] ? host : "?");
    wd.stop = 0;

    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&wd.cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) return ts_fail("watchdog: cannot create its condition variable: %s", strerror(rc));
    rc = pthread_create(&wd.thread, NULL, watch, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&wd.cv);
        return ts_fail("watchdog: cannot start its thread: %s; set train.timeout_s = 0 to run "
                       "without it",
                       strerror(rc));
    }
    wd.running = 1;
    return TS_OK;
}

void ts_watchdog_stop(void)
{
    if (!wd.running) return;
    pthread_mutex_lock(&wd.mu);
    wd.stop = 1;
    pthread_cond_signal(&wd.cv);
    pthread_mutex_unlock(&wd.mu);
    pthread_join(wd.thread, NULL);
    pthread_cond_destroy(&wd.cv);
    wd.running = 0;
}
