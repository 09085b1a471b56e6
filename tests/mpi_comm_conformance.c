/* Conformance of a comm backend (comm/comm.h), run under mpirun on 2, 3 and 4 ranks by
 * test_comm_conformance.sh: every data-plane call the framework makes, on the world, on
 * split and duplicated sub-groups (the tp and dp groups of a 2 x (size/2) grid, a
 * reversed order, a group leaving a rank out, one rank alone) with counts of zero, odd
 * and large (> 2^20 floats); the non-blocking collectives completed by test loops and
 * by waits; the point-to-point patterns of the pipeline engine; the group hooks
 * (busy_ms, on_span); the control plane's reductions and broadcast of host values in
 * every type and reduction the framework uses, its gathers and ts_comm_agree. Every
 * expected value is computed on each rank from the same formula, exactly (integers and
 * binary fractions, so sums are exact in any order).
 *
 * Usage: mpi_comm_conformance [BACKEND]   (default "mpi"; ts_comm_backend_find's names)
 *        mpi_comm_conformance --no-copies (mpi-staged without its copies: must abort)
 * "nccl" runs on the CUDA backend's device memory, each rank on GPU (node-local rank mod
 * GPUs); it exits 77 on every rank where the build has no NCCL or no GPU is visible,
 * and 1 with the backend's message (rank 0 prints it) when moving the world to NCCL
 * fails, as it must when ranks share a GPU (test_nccl.sh).
 * The data plane's buffers are the backend's memory (device memory for NCCL and
 * mpi-staged): the tests touch them only through dbuf_* below, the one place a device
 * backend's run points at its compute backend's allocation and copies. Host values go
 * to the control plane only. Every rank checks; a rank that finds a failure prints it
 * and exits non-zero, so mpirun fails. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/error.h"
#include "kernels/kernels.h"

#define LARGE (((size_t)1 << 20) + 5) /* floats: > 2^20, odd */

static int n_checks, n_failed;
static int world_rank;
static const char *group = "", *context = ""; /* under way, for failure messages */

#define EXPECT(cond, ...)                                                                  \
    do {                                                                                   \
        n_checks++;                                                                        \
        if (!(cond)) failed(__LINE__, __VA_ARGS__);                                        \
    } while (0)

__attribute__((format(printf, 2, 3))) static void failed(int line, const char *fmt, ...)
{
    if (++n_failed > 40) return; /* enough to go on */
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAIL rank %d, line %d, group %s, %s: %s\n", world_rank, line, group, context,
            msg);
}

/* ------------------------------------------------- the backend's memory -- */

/* The compute backend whose device memory the data plane's buffers are, NULL for host
 * memory (the mpi backend). mpi-staged runs on the strict CPU backend's, which faults
 * on any access outside its own calls: so a transfer that let MPI (or comm.c) touch a
 * device buffer, instead of the staged copies, fails here at that instruction. */
static const ts_kernels *dev_k;

static void *dbuf_alloc(size_t bytes)
{
    void *fill = malloc(bytes > 0 ? bytes : 1);
    TS_ASSERT(fill);
    memset(fill, 0xA5, bytes); /* not zero: a transfer that writes nothing shows */
    if (!dev_k) return fill;
    void *p = dev_k->dev_alloc(bytes); /* NULL for 0 bytes */
    if (bytes) dev_k->memcpy_h2d(p, fill, bytes);
    free(fill);
    return p;
}

static void dbuf_free(void *p)
{
    if (!dev_k)
        free(p);
    else if (p)
        dev_k->dev_free(p);
}

static void dbuf_put(const ts_comm *c, void *dev, const void *host, size_t bytes)
{
    (void)c;
    if (!bytes) return;
    if (dev_k)
        dev_k->memcpy_h2d(dev, host, bytes);
    else
        memcpy(dev, host, bytes);
}

/* After everything queued on c's stream. */
static void dbuf_get(const ts_comm *c, void *host, const void *dev, size_t bytes)
{
    (void)c;
    if (!bytes) return;
    if (dev_k)
        dev_k->memcpy_d2h(host, dev, bytes);
    else
        memcpy(host, dev, bytes);
}

/* --------------------------------------------------------------- values -- */

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t key(int rank, size_t i, int salt)
{
    return mix(mix((uint64_t)rank * 1000003u + (uint64_t)salt) ^ (uint64_t)i);
}

/* Integers in [-1000, 1000]: any sum of a few is exact in float. */
static float vf(int rank, size_t i, int salt)
{
    return (float)((int)(key(rank, i, salt) % 2001) - 1000);
}
/* Quarters in [-2^20, 2^20]: exact in double. */
static double vd(int rank, size_t i, int salt)
{
    return (double)((int64_t)(key(rank, i, salt) % (1u << 23)) - (1 << 22)) * 0.25;
}
static int vi(int rank, size_t i, int salt)
{
    return (int)(key(rank, i, salt) % 2000001) - 1000000;
}
/* Full range: half of them above INT64_MAX, where a signed comparison goes wrong. */
static uint64_t vu(int rank, size_t i, int salt) { return key(rank, i, salt); }

static unsigned char vb(int rank, size_t i, int salt)
{
    return (unsigned char)(key(rank, i, salt) >> 17);
}

/* The index of the first difference of two arrays, or -1. */
static long first_diff(const void *a, const void *b, size_t n, size_t elem)
{
    if (n == 0 || !memcmp(a, b, n * elem)) return -1;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem))
            return (long)i;
    return -1;
}

#define EXPECT_SAME(got, want, n, what)                                                    \
    do {                                                                                   \
        long d_ = first_diff(got, want, n, sizeof *(want));                                \
        EXPECT(d_ < 0, "%s: %zu elements differ first at %ld", what, (size_t)(n), d_);    \
    } while (0)

/* ------------------------------------------------------------- the hooks -- */

typedef struct {
    int n;
    const char *what;
    size_t bytes;
    double start, end;
} span_log;

static void record_span(void *ctx, const char *what, size_t bytes, double start_ms,
                        double end_ms)
{
    span_log *s = ctx;
    s->n++;
    s->what = what;
    s->bytes = bytes;
    s->start = start_ms;
    s->end = end_ms;
}

/* ------------------------------------------------- blocking collectives -- */

typedef enum { SUM, MIN, MAX } red;

static void allreduce_f32(ts_comm *c, size_t n, red op, int salt)
{
    float *host = malloc((n + 1) * sizeof(float)), *want = malloc((n + 1) * sizeof(float));
    float *dev = dbuf_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        host[i] = vf(c->rank, i, salt);
        want[i] = vf(0, i, salt);
        for (int r = 1; r < c->size; r++) {
            float v = vf(r, i, salt);
            want[i] = op == SUM ? want[i] + v : v > want[i] ? v : want[i];
        }
    }
    dbuf_put(c, dev, host, n * sizeof(float));
    if (op == SUM)
        ts_allreduce_sum_f32(c, dev, n);
    else
        ts_allreduce_max_f32(c, dev, n);
    dbuf_get(c, host, dev, n * sizeof(float));
    EXPECT_SAME(host, want, n, op == SUM ? "all-reduce sum f32" : "all-reduce max f32");
    dbuf_free(dev);
    free(host);
    free(want);
}

/* The control plane's reductions: host values, whatever the group's backend. */
static void allreduce_f64(ts_comm *c, size_t n, red op, int salt)
{
    double *host = malloc((n + 1) * sizeof(double)), *want = malloc((n + 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        host[i] = vd(c->rank, i, salt);
        want[i] = vd(0, i, salt);
        for (int r = 1; r < c->size; r++) {
            double v = vd(r, i, salt);
            want[i] = op == SUM ? want[i] + v : v > want[i] ? v : want[i];
        }
    }
    if (op == SUM)
        ts_host_allreduce_sum_f64(c, host, n);
    else
        ts_host_allreduce_max_f64(c, host, n);
    EXPECT_SAME(host, want, n, op == SUM ? "all-reduce sum f64" : "all-reduce max f64");
    free(host);
    free(want);
}

static void allreduce_i32(ts_comm *c, size_t n, red op, int salt)
{
    int *host = malloc((n + 1) * sizeof(int)), *want = malloc((n + 1) * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        host[i] = vi(c->rank, i, salt);
        want[i] = vi(0, i, salt);
        for (int r = 1; r < c->size; r++) {
            int v = vi(r, i, salt);
            want[i] = op == SUM   ? want[i] + v
                      : op == MIN ? (v < want[i] ? v : want[i])
                                  : (v > want[i] ? v : want[i]);
        }
    }
    const char *what = op == SUM ? "all-reduce sum i32" : op == MIN ? "all-reduce min i32"
                                                                    : "all-reduce max i32";
    if (op == SUM)
        ts_host_allreduce_sum_i32(c, host, n);
    else if (op == MIN)
        ts_host_allreduce_min_i32(c, host, n);
    else
        ts_host_allreduce_max_i32(c, host, n);
    EXPECT_SAME(host, want, n, what);
    free(host);
    free(want);
}

static void allreduce_u64(ts_comm *c, size_t n, red op, int salt)
{
    uint64_t *host = malloc((n + 1) * sizeof(uint64_t));
    uint64_t *want = malloc((n + 1) * sizeof(uint64_t));
    for (size_t i = 0; i < n; i++) {
        host[i] = vu(c->rank, i, salt);
        want[i] = vu(0, i, salt);
        for (int r = 1; r < c->size; r++) {
            uint64_t v = vu(r, i, salt);
            want[i] = op == MIN ? (v < want[i] ? v : want[i]) : (v > want[i] ? v : want[i]);
        }
    }
    if (op == MIN)
        ts_host_allreduce_min_u64(c, host, n);
    else
        ts_host_allreduce_max_u64(c, host, n);
    EXPECT_SAME(host, want, n, op == MIN ? "all-reduce min u64" : "all-reduce max u64");
    free(host);
    free(want);
}

static void test_allreduce(ts_comm *c, bool large)
{
    context = "all-reduce";
    static const size_t ns[] = { 0, 1, 7, 1000 };
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int salt = (int)k;
        allreduce_f32(c, ns[k], SUM, salt);
        allreduce_f32(c, ns[k], MAX, salt);
        allreduce_f64(c, ns[k], SUM, salt);
        allreduce_f64(c, ns[k], MAX, salt);
        allreduce_i32(c, ns[k], SUM, salt);
        allreduce_i32(c, ns[k], MIN, salt);
        allreduce_i32(c, ns[k], MAX, salt);
        allreduce_u64(c, ns[k], MIN, salt);
        allreduce_u64(c, ns[k], MAX, salt);
    }
    if (large) {
        allreduce_f32(c, LARGE, SUM, 11);
        allreduce_u64(c, LARGE / 2, MAX, 12);
    }
}

/* recv[count] = the sum over ranks of piece `rank` of send[size * count]. */
static void test_reduce_scatter(ts_comm *c, size_t count, int salt)
{
    context = "reduce-scatter";
    const size_t total = count * (size_t)c->size;
    float *host = malloc((total + 1) * sizeof(float)), *want = malloc((count + 1) * sizeof(float));
    float *send = dbuf_alloc(total * sizeof(float)), *recv = dbuf_alloc(count * sizeof(float));
    for (size_t i = 0; i < total; i++) host[i] = vf(c->rank, i, salt);
    for (size_t j = 0; j < count; j++) {
        want[j] = 0.0f;
        for (int r = 0; r < c->size; r++) want[j] += vf(r, (size_t)c->rank * count + j, salt);
    }
    dbuf_put(c, send, host, total * sizeof(float));
    ts_reduce_scatter_sum_f32(c, send, recv, count);
    dbuf_get(c, host, recv, count * sizeof(float));
    EXPECT_SAME(host, want, count, "reduce-scatter sum f32");
    dbuf_free(send);
    dbuf_free(recv);
    free(host);
    free(want);
}

/* recv[size * count] = every rank's send[count] in rank order. */
static void test_allgather(ts_comm *c, size_t count, int salt)
{
    context = "all-gather";
    const size_t total = count * (size_t)c->size;
    float *host = malloc((total + 1) * sizeof(float)), *want = malloc((total + 1) * sizeof(float));
    float *send = dbuf_alloc(count * sizeof(float)), *recv = dbuf_alloc(total * sizeof(float));
    for (size_t j = 0; j < count; j++) host[j] = vf(c->rank, j, salt);
    for (int r = 0; r < c->size; r++)
        for (size_t j = 0; j < count; j++) want[(size_t)r * count + j] = vf(r, j, salt);
    dbuf_put(c, send, host, count * sizeof(float));
    ts_allgather_f32(c, send, recv, count);
    dbuf_get(c, host, recv, total * sizeof(float));
    EXPECT_SAME(host, want, total, "all-gather f32");
    dbuf_free(send);
    dbuf_free(recv);
    free(host);
    free(want);
}

/* From every root (a large one from the first and last); others start from other
 * bytes. The data plane's (a device buffer) or the control plane's (host memory). */
static void test_broadcast(ts_comm *c, size_t bytes, int salt, bool on_host)
{
    context = on_host ? "broadcast (host)" : "broadcast (device)";
    unsigned char *host = malloc(bytes + 1), *want = malloc(bytes + 1);
    unsigned char *dev = on_host ? NULL : dbuf_alloc(bytes);
    const int step = bytes > 100000 && c->size > 2 ? c->size - 1 : 1;
    for (int root = 0; root < c->size; root += step) {
        for (size_t i = 0; i < bytes; i++) {
            want[i] = vb(root, i, salt);
            host[i] = vb(c->rank, i, salt + 1);
        }
        if (c->rank == root) memcpy(host, want, bytes);
        if (on_host) {
            ts_host_broadcast(c, host, bytes, root);
        } else {
            dbuf_put(c, dev, host, bytes);
            ts_broadcast_dev(c, dev, bytes, root);
            dbuf_get(c, host, dev, bytes);
        }
        EXPECT(first_diff(host, want, bytes, 1) < 0, "broadcast of %zu bytes from root %d", bytes,
               root);
    }
    if (!on_host) dbuf_free(dev);
    free(host);
    free(want);
}

/* The variable all-to-all: rank i sends cnt(i, j) elements to rank j (some zero, some
 * to itself), its pieces packed with a one-element gap, received into pieces with a
 * two-element gap whose elements must keep their sentinel. The counts themselves go
 * through ts_host_alltoall_i32 first, as an expert layer's do. f32 and bf16 elements
 * (bf16 moved as bits: any pattern arrives unchanged). */
static int a2a_count(int i, int j, int variant) { return (i * 7 + j * 3 + variant) % 5 * variant; }

static void complete(ts_request *r, bool by_test);

/* nb: 0 the blocking ts_alltoallv_act; 1 ts_ialltoallv_act completed by tests, 2 by a
 * wait (the buffers and arrays kept until then, as its contract says). */
static void test_alltoallv(ts_comm *c, int variant, ts_dtype type, int salt, int nb)
{
    context = nb ? (type == TS_DTYPE_BF16 ? "non-blocking all-to-all bf16"
                                          : "non-blocking all-to-all f32")
                 : (type == TS_DTYPE_BF16 ? "all-to-all bf16" : "all-to-all f32");
    const int S = c->size, me = c->rank;
    const size_t elem = type == TS_DTYPE_BF16 ? 2 : 4;
    int *sc = calloc((size_t)S, sizeof(int)), *sd = calloc((size_t)S, sizeof(int));
    int *rc = calloc((size_t)S, sizeof(int)), *rd = calloc((size_t)S, sizeof(int));
    int *want_rc = calloc((size_t)S, sizeof(int));
    size_t stotal = 0, rtotal = 0;
    for (int j = 0; j < S; j++) {
        sc[j] = a2a_count(me, j, variant);
        sd[j] = (int)stotal;
        stotal += (size_t)sc[j] + 1;
        want_rc[j] = a2a_count(j, me, variant);
    }
    ts_host_alltoall_i32(c, sc, rc, 1);
    bool counts_ok = true;
    for (int j = 0; j < S; j++) counts_ok = counts_ok && rc[j] == want_rc[j];
    EXPECT(counts_ok, "ts_host_alltoall_i32 of the counts (variant %d)", variant);
    for (int j = 0; j < S; j++) {
        rd[j] = (int)rtotal;
        rtotal += (size_t)want_rc[j] + 2;
    }
    unsigned char *hs = calloc(stotal + 1, elem), *hr = calloc(rtotal + 1, elem),
                  *want = calloc(rtotal + 1, elem);
    /* element k of the piece i -> j: bytes of vf(i, j * 100000 + k) (f32), or its upper
     * half (bf16) */
    for (int j = 0; j < S; j++)
        for (int k = 0; k < sc[j]; k++) {
            const float v = vf(me, (size_t)j * 100000 + (size_t)k, salt);
            memcpy(hs + ((size_t)sd[j] + (size_t)k) * elem, (const char *)&v + (4 - elem), elem);
        }
    for (size_t x = 0; x < rtotal * elem; x++) want[x] = hr[x] = 0xA5; /* the sentinel */
    for (int j = 0; j < S; j++)
        for (int k = 0; k < want_rc[j]; k++) {
            const float v = vf(j, (size_t)me * 100000 + (size_t)k, salt);
            memcpy(want + ((size_t)rd[j] + (size_t)k) * elem, (const char *)&v + (4 - elem), elem);
        }
    void *send = dbuf_alloc(stotal * elem + 1), *recv = dbuf_alloc(rtotal * elem + 1);
    dbuf_put(c, send, hs, stotal * elem);
    dbuf_put(c, recv, hr, rtotal * elem);
    if (nb) {
        ts_request r;
        ts_ialltoallv_act(c, send, sc, sd, recv, want_rc, rd, type, &r);
        complete(&r, nb == 1);
    } else {
        ts_alltoallv_act(c, send, sc, sd, recv, want_rc, rd, type);
    }
    dbuf_get(c, hr, recv, rtotal * elem);
    const long d = first_diff(hr, want, rtotal * elem, 1);
    EXPECT(d < 0, "variant %d: byte %ld of %zu differs", variant, d, rtotal * elem);
    dbuf_free(send);
    dbuf_free(recv);
    free(hs);
    free(hr);
    free(want);
    free(sc);
    free(sd);
    free(rc);
    free(rd);
    free(want_rc);
}

static void test_collectives(ts_comm *c, bool large)
{
    test_allreduce(c, large);
    static const size_t counts[] = { 0, 1, 5, 333 };
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        test_reduce_scatter(c, counts[k], 20 + (int)k);
        test_allgather(c, counts[k], 30 + (int)k);
        test_broadcast(c, counts[k] * 3, 40 + (int)k, false);
        test_broadcast(c, counts[k] * 3, 40 + (int)k, true);
    }
    if (large) {
        test_reduce_scatter(c, LARGE / (size_t)c->size + 1, 25);
        test_allgather(c, LARGE / (size_t)c->size + 1, 35);
        test_broadcast(c, LARGE * sizeof(float), 45, false);
        test_broadcast(c, LARGE * sizeof(float), 46, true);
    }
    for (int variant = 0; variant <= 3; variant++) {
        test_alltoallv(c, variant, TS_DTYPE_F32, 50 + variant, 0);
        test_alltoallv(c, variant, TS_DTYPE_BF16, 60 + variant, 0);
    }
    if (large) test_alltoallv(c, 4000, TS_DTYPE_F32, 55, 0); /* up to 16,000 a piece: past eager sizes */
    context = "barrier";
    for (int i = 0; i < 3; i++) ts_barrier(c);
}

/* --------------------------------------------- non-blocking collectives -- */

/* Complete r by testing until done, or by waiting; afterwards both say done. */
static void complete(ts_request *r, bool by_test)
{
    if (by_test) {
        long spins = 0;
        while (!ts_request_test(r)) spins++;
        (void)spins;
    } else {
        ts_request_wait(r);
    }
    EXPECT(!r->active, "a completed request is inactive");
    EXPECT(ts_request_test(r) == 1, "a completed request tests done");
    ts_request_wait(r); /* a no-op now */
}

static void test_iallreduce(ts_comm *c, bool large)
{
    context = "non-blocking all-reduce";
    enum { NB = 4 };
    size_t ns[NB] = { 0, 1, 1000, large ? LARGE : 4099 };
    float *host[NB], *want[NB], *dev[NB];
    ts_request req[NB];
    for (int pass = 0; pass < 3; pass++) { /* by test, by wait, all outstanding at once */
        for (int b = 0; b < NB; b++) {
            size_t n = ns[b];
            host[b] = malloc((n + 1) * sizeof(float));
            want[b] = malloc((n + 1) * sizeof(float));
            dev[b] = dbuf_alloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) {
                host[b][i] = vf(c->rank, i, 50 + b);
                want[b][i] = 0.0f;
                for (int r = 0; r < c->size; r++) want[b][i] += vf(r, i, 50 + b);
            }
            dbuf_put(c, dev[b], host[b], n * sizeof(float));
        }
        for (int b = 0; b < NB; b++) {
            ts_iallreduce_sum_f32(c, dev[b], ns[b], &req[b]);
            EXPECT(req[b].active == (c->size > 1), "a started reduction is active on >1 ranks");
            if (pass < 2) complete(&req[b], pass == 0);
        }
        if (pass == 2) /* buckets: all started, then completed last first, by both means */
            for (int b = NB - 1; b >= 0; b--) complete(&req[b], b % 2 == 0);
        for (int b = 0; b < NB; b++) {
            dbuf_get(c, host[b], dev[b], ns[b] * sizeof(float));
            EXPECT_SAME(host[b], want[b], ns[b], "non-blocking all-reduce sum f32");
            dbuf_free(dev[b]);
            free(host[b]);
            free(want[b]);
        }
    }
}

/* Uneven pieces: variant 0 even, 1 with an empty piece on rank 1 and odd sizes, 2 large. */
static void pieces(const ts_comm *c, int variant, int *counts, int *displs)
{
    int at = 0;
    for (int k = 0; k < c->size; k++) {
        counts[k] = variant == 0   ? 64
                    : variant == 1 ? (k == 1 ? 0 : 3 + 5 * k)
                                   : (int)(LARGE / (size_t)c->size) + 7 * k;
        displs[k] = at;
        at += counts[k];
    }
}

static void test_ireduce_scatter(ts_comm *c, int variant, bool by_test)
{
    context = "non-blocking reduce-scatter (in place, uneven)";
    int counts[8], displs[8];
    TS_ASSERT(c->size <= 8);
    pieces(c, variant, counts, displs);
    const size_t total = (size_t)displs[c->size - 1] + (size_t)counts[c->size - 1];
    const size_t mine = (size_t)counts[c->rank], at = (size_t)displs[c->rank];
    float *host = malloc((total + 1) * sizeof(float)), *want = malloc((mine + 1) * sizeof(float));
    float *dev = dbuf_alloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) host[i] = vf(c->rank, i, 60 + variant);
    for (size_t j = 0; j < mine; j++) {
        want[j] = 0.0f;
        for (int r = 0; r < c->size; r++) want[j] += vf(r, at + j, 60 + variant);
    }
    dbuf_put(c, dev, host, total * sizeof(float));
    ts_request req;
    ts_ireduce_scatter_sum_f32(c, dev, counts, &req);
    complete(&req, by_test);
    dbuf_get(c, host, dev, mine * sizeof(float)); /* this rank's piece, at the start */
    EXPECT_SAME(host, want, mine, "reduce-scatter piece");
    dbuf_free(dev);
    free(host);
    free(want);
}

static void test_iallgather(ts_comm *c, int variant, bool by_test)
{
    context = "non-blocking all-gather (in place, uneven)";
    int counts[8], displs[8];
    pieces(c, variant, counts, displs);
    const size_t total = (size_t)displs[c->size - 1] + (size_t)counts[c->size - 1];
    float *host = malloc((total + 1) * sizeof(float)), *want = malloc((total + 1) * sizeof(float));
    float *dev = dbuf_alloc(total * sizeof(float));
    for (int k = 0; k < c->size; k++)
        for (int j = 0; j < counts[k]; j++) {
            size_t i = (size_t)displs[k] + (size_t)j;
            want[i] = vf(k, (size_t)j, 70 + variant);
            host[i] = k == c->rank ? want[i] : -7777.0f; /* others' pieces: stale */
        }
    dbuf_put(c, dev, host, total * sizeof(float));
    ts_request req;
    ts_iallgather_f32(c, dev, counts, displs, &req);
    complete(&req, by_test);
    dbuf_get(c, host, dev, total * sizeof(float));
    EXPECT_SAME(host, want, total, "all-gathered buffer");
    dbuf_free(dev);
    free(host);
    free(want);
}

static void test_nonblocking(ts_comm *c, bool large)
{
    test_iallreduce(c, large);
    for (int variant = 0; variant < (large ? 3 : 2); variant++)
        for (int by_test = 0; by_test < 2; by_test++) {
            test_ireduce_scatter(c, variant, by_test);
            test_iallgather(c, variant, by_test);
        }
    /* The expert layer's non-blocking exchange: uneven pieces with gaps, some empty. */
    test_alltoallv(c, 3, TS_DTYPE_F32, 70, 1);
    test_alltoallv(c, 2, TS_DTYPE_BF16, 71, 2);
    if (large) test_alltoallv(c, 4000, TS_DTYPE_F32, 72, 1);
}

/* ------------------------------------------------------ point-to-point -- */

/* Ring shifts both ways at once, in a point-to-point group: each rank sends to both
 * neighbours and receives from both (on two ranks both are the same peer; on one rank,
 * itself). */
static void test_ring(ts_comm *c, size_t n, int salt)
{
    context = "ring shifts";
    const int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    float *host = calloc(n + 1, sizeof(float)), *want = calloc(n + 1, sizeof(float));
    float *to_right = dbuf_alloc(n * sizeof(float)), *to_left = dbuf_alloc(n * sizeof(float));
    float *from_left = dbuf_alloc(n * sizeof(float)), *from_right = dbuf_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = vf(c->rank, i, salt);
    dbuf_put(c, to_right, host, n * sizeof(float));
    for (size_t i = 0; i < n; i++) host[i] = vf(c->rank, i, salt + 1);
    dbuf_put(c, to_left, host, n * sizeof(float));
    ts_request r[4];
    /* Between two ranks the transfers match in the order started: every rank starts
     * the rightward pair, then the leftward one. */
    ts_comm_group_begin(c);
    ts_isend_f32(c, to_right, n, right, 1, &r[0]);
    ts_irecv_f32(c, from_left, n, left, 1, &r[1]);
    ts_isend_f32(c, to_left, n, left, 2, &r[2]);
    ts_irecv_f32(c, from_right, n, right, 2, &r[3]);
    ts_comm_group_end(c);
    for (int k = 3; k >= 0; k--) complete(&r[k], k % 2 == 1);
    for (size_t i = 0; i < n; i++) want[i] = vf(left, i, salt);
    dbuf_get(c, host, from_left, n * sizeof(float));
    EXPECT_SAME(host, want, n, "shifted right: the left neighbour's");
    for (size_t i = 0; i < n; i++) want[i] = vf(right, i, salt + 1);
    dbuf_get(c, host, from_right, n * sizeof(float));
    EXPECT_SAME(host, want, n, "shifted left: the right neighbour's");
    dbuf_free(to_right);
    dbuf_free(to_left);
    dbuf_free(from_left);
    dbuf_free(from_right);
    free(host);
    free(want);
}

/* The pipeline: K messages of varying size (the first empty) flow from rank 0 to the
 * last rank, each rank adding its rank + 1 before passing it on; receives are posted
 * early, sends are non-blocking and waited at the end (the engine's way). Then the
 * same backwards ("gradients"). */
static void test_pipeline(ts_comm *c, int dir)
{
    context = dir > 0 ? "pipeline forward" : "pipeline backward";
    enum { K = 8 };
    const int me = dir > 0 ? c->rank : c->size - 1 - c->rank; /* position in the flow */
    const int prev = c->rank - dir, next = c->rank + dir;
    const bool first = me == 0, last = me == c->size - 1;
    size_t n[K];
    float *buf[K], *host[K];
    ts_request recv[K], send[K];
    for (int k = 0; k < K; k++) {
        n[k] = (size_t)k * 37 % 100 + (k == 3 ? 70000 : 0);
        buf[k] = dbuf_alloc(n[k] * sizeof(float));
        host[k] = malloc((n[k] + 1) * sizeof(float));
        if (!first) ts_irecv_f32(c, buf[k], n[k], prev, 100 + k, &recv[k]);
    }
    /* Position p receives vf(0, i, k) plus 1 + 2 + ... + p (the adds before it). */
    for (int k = 0; k < K; k++) {
        if (first) {
            for (size_t i = 0; i < n[k]; i++) host[k][i] = vf(0, i, 80 + k);
        } else {
            ts_request_wait(&recv[k]);
            dbuf_get(c, host[k], buf[k], n[k] * sizeof(float));
            long long add = (long long)me * (me + 1) / 2;
            long bad = -1;
            for (size_t i = 0; i < n[k] && bad < 0; i++)
                if (host[k][i] != vf(0, i, 80 + k) + (float)add) bad = (long)i;
            EXPECT(bad < 0, "message %d (%zu floats) from rank %d differs at %ld", k, n[k], prev,
                   bad);
        }
        if (!last) {
            for (size_t i = 0; i < n[k]; i++) host[k][i] += (float)(me + 1);
            dbuf_put(c, buf[k], host[k], n[k] * sizeof(float));
            ts_isend_f32(c, buf[k], n[k], next, 100 + k, &send[k]);
        }
    }
    for (int k = 0; k < K; k++) {
        if (!last) ts_request_wait(&send[k]);
        dbuf_free(buf[k]);
        free(host[k]);
    }
}

static int gcd(int a, int b) { return b ? gcd(b, a % b) : a; }

/* Many outstanding receives, completed in any order: every rank sends M messages to
 * every rank (itself too) and posts M receives from each, all in one point-to-point
 * group, started in the same order on both sides of every pair; the receives are then
 * completed in a scrambled order, half by tests and half by waits. */
static void test_many(ts_comm *c)
{
    context = "many outstanding receives";
    enum { M = 5 };
    const int P = c->size, total = M * P;
    float **in = malloc((size_t)total * sizeof(float *));
    float **out = malloc((size_t)total * sizeof(float *));
    size_t *n = malloc((size_t)total * sizeof(size_t));
    ts_request *rr = malloc((size_t)total * sizeof(ts_request));
    ts_request *sr = malloc((size_t)total * sizeof(ts_request));
    ts_comm_group_begin(c);
    for (int m = 0; m < M; m++)
        for (int p = 0; p < P; p++) {
            const int x = m * P + p;
            n[x] = (size_t)(m * 211 + 13 * p) % 500; /* what p sends me; I send p the same size */
            size_t ns = (size_t)(m * 211 + 13 * c->rank) % 500;
            in[x] = dbuf_alloc(n[x] * sizeof(float));
            out[x] = dbuf_alloc(ns * sizeof(float));
            float *h = malloc((ns + 1) * sizeof(float));
            for (size_t i = 0; i < ns; i++) h[i] = vf(c->rank, i, 1000 * m + p);
            dbuf_put(c, out[x], h, ns * sizeof(float));
            free(h);
            ts_irecv_f32(c, in[x], n[x], p, 200 + m, &rr[x]);
            ts_isend_f32(c, out[x], ns, p, 200 + m, &sr[x]);
        }
    ts_comm_group_end(c);
    int stride = 7;
    while (gcd(total, stride) != 1) stride += 2; /* coprime with total: a permutation */
    for (int j = 0; j < total; j++) {
        const int x = (j * stride + c->rank) % total, m = x / P, p = x % P;
        complete(&rr[x], j % 2 == 0);
        float *h = malloc((n[x] + 1) * sizeof(float)), *w = malloc((n[x] + 1) * sizeof(float));
        dbuf_get(c, h, in[x], n[x] * sizeof(float));
        for (size_t i = 0; i < n[x]; i++) w[i] = vf(p, i, 1000 * m + c->rank);
        EXPECT(first_diff(h, w, n[x], sizeof *w) < 0, "message %d from rank %d", m, p);
        free(h);
        free(w);
    }
    for (int x = total - 1; x >= 0; x--) {
        ts_request_wait(&sr[x]);
        dbuf_free(in[x]);
        dbuf_free(out[x]);
    }
    free(in);
    free(out);
    free(n);
    free(rr);
    free(sr);
}

static void test_p2p(ts_comm *c, bool large)
{
    static const size_t ns[] = { 0, 1, 1000 };
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) test_ring(c, ns[k], 90 + 2 * (int)k);
    if (large) test_ring(c, LARGE, 99);
    if (c->size > 1) {
        test_pipeline(c, +1);
        test_pipeline(c, -1);
    }
    test_many(c);
}

/* ---------------------------------------------------------- the hooks -- */

/* busy_ms and on_span: each blocking collective on two or more ranks reports one span
 * (its name and this rank's bytes) and adds exactly its length to busy_ms; the control
 * plane's gathers too; a non-blocking one reports its span once, when completed, and
 * adds nothing to busy_ms; a one-rank group reports nothing. */
static void test_hooks(ts_comm *c)
{
    context = "busy_ms and on_span";
    span_log log = { 0 };
    double busy = 0.0;
    c->busy_ms = &busy;
    c->on_span = record_span;
    c->on_span_ctx = &log;
    const size_t n = 96, S = (size_t)c->size; /* n divisible by 1..4 */
    const bool spans = c->size > 1;
    float *dev = dbuf_alloc(n * S * sizeof(float)), *dev2 = dbuf_alloc(n * S * sizeof(float));
    char host[64 * 8] = { 0 };
    double hd[96] = { 0 }; /* host values for the control plane's reductions */
    uint64_t hu[3] = { 0 };

#define EXPECT_SPAN(name, nbytes)                                                          \
    do {                                                                                   \
        EXPECT(log.n == (spans ? 1 : 0), "%s: %d spans", name, log.n);                     \
        if (spans && log.n == 1) {                                                         \
            EXPECT(!strcmp(log.what, name), "span named %s, not %s", log.what, name);      \
            EXPECT(log.bytes == (nbytes), "%s: span of %zu bytes, not %zu", name, log.bytes, \
                   (size_t)(nbytes));                                                      \
            EXPECT(log.end >= log.start && busy == log.end - log.start,                     \
                   "%s: busy_ms %g for a span of %g", name, busy, log.end - log.start);    \
        }                                                                                  \
        if (!spans) EXPECT(busy == 0.0, "%s: busy_ms %g on one rank", name, busy);         \
        log.n = 0;                                                                         \
        busy = 0.0;                                                                        \
    } while (0)

    ts_allreduce_sum_f32(c, dev, n);
    EXPECT_SPAN("all-reduce", n * sizeof(float));
    ts_host_allreduce_max_f64(c, hd, n / 2);
    EXPECT_SPAN("all-reduce", n / 2 * sizeof(double));
    ts_host_allreduce_min_u64(c, hu, 3);
    EXPECT_SPAN("all-reduce", 3 * sizeof(uint64_t));
    ts_reduce_scatter_sum_f32(c, dev, dev2, n);
    EXPECT_SPAN("reduce-scatter", n * S * sizeof(float));
    ts_allgather_f32(c, dev, dev2, n);
    EXPECT_SPAN("all-gather", n * S * sizeof(float));
    ts_broadcast_dev(c, dev, 100, 0);
    EXPECT_SPAN("broadcast", 100);
    ts_host_broadcast(c, host, 100, 0);
    EXPECT_SPAN("broadcast", 100);
    ts_barrier(c);
    EXPECT_SPAN("barrier", 0);
    ts_allgather_bytes(c, host, 8, host + 64);
    EXPECT_SPAN("all-gather", 8 * S);
    ts_gather_bytes(c, host, 8, host + 64, 0);
    EXPECT_SPAN("gather", 8);
    int counts[8];
    for (int k = 0; k < c->size; k++) counts[k] = 2;
    ts_gatherv(c, host, 2, 4, host + 64, counts, 0);
    EXPECT_SPAN("gather", 8);

    ts_request r;
    ts_iallreduce_sum_f32(c, dev, n, &r);
    EXPECT(log.n == 0, "a non-blocking all-reduce reports when complete, not when started");
    while (!ts_request_test(&r)) {}
    EXPECT(log.n == (spans ? 1 : 0), "the test that sees it complete reports its span");
    ts_request_test(&r);
    ts_request_wait(&r); /* and nothing reports it again */
    /* Non-blocking: nothing added to busy_ms (then set to pass EXPECT_SPAN's check). */
    EXPECT(busy == 0.0, "a non-blocking all-reduce added %g to busy_ms", busy);
    busy = spans ? log.end - log.start : 0.0;
    EXPECT_SPAN("all-reduce", n * sizeof(float));
    for (int k = 0; k < c->size; k++) counts[k] = (int)n / 2 + k;
    ts_ireduce_scatter_sum_f32(c, dev, counts, &r);
    ts_request_wait(&r);
    EXPECT(busy == 0.0, "a non-blocking reduce-scatter added %g to busy_ms", busy);
    busy = spans ? log.end - log.start : 0.0;
    EXPECT_SPAN("reduce-scatter", (n / 2 * S + S * (S - 1) / 2) * sizeof(float));
    int displs[8];
    for (int k = 0, at = 0; k < c->size; at += counts[k], k++) displs[k] = at;
    ts_iallgather_f32(c, dev, counts, displs, &r);
    ts_request_wait(&r);
    EXPECT(busy == 0.0, "a non-blocking all-gather added %g to busy_ms", busy);
    busy = spans ? log.end - log.start : 0.0;
    EXPECT_SPAN("all-gather", (n / 2 * S + S * (S - 1) / 2) * sizeof(float));
#undef EXPECT_SPAN

    /* Point-to-point transfers are no collectives: no span, no busy time. */
    ts_request s;
    ts_comm_group_begin(c);
    ts_isend_f32(c, dev, n, (c->rank + 1) % c->size, 7, &s);
    ts_irecv_f32(c, dev2, n, (c->rank + c->size - 1) % c->size, 7, &r);
    ts_comm_group_end(c);
    ts_request_wait(&r);
    ts_request_wait(&s);
    EXPECT(log.n == 0 && busy == 0.0, "a transfer reported a span or busy time");

    c->busy_ms = NULL;
    c->on_span = NULL;
    c->on_span_ctx = NULL;
    dbuf_free(dev);
    dbuf_free(dev2);
}

/* ------------------------------------------------------- control plane -- */

static void test_gathers(ts_comm *c)
{
    context = "gathers (control plane)";
    const int S = c->size;
    typedef struct {
        int rank, k;
        double x;
    } rec; /* a record of 16 bytes, like the trainer's */
    for (int root = 0; root < S; root++) {
        unsigned char mine[13], *all = malloc(13 * (size_t)S);
        for (int i = 0; i < 13; i++) mine[i] = vb(c->rank, (size_t)i, root);
        memset(all, 0, 13 * (size_t)S);
        ts_gather_bytes(c, mine, sizeof mine, c->rank == root ? all : NULL, root);
        if (c->rank == root)
            for (int r = 0; r < S; r++)
                for (int i = 0; i < 13; i++)
                    EXPECT(all[r * 13 + i] == vb(r, (size_t)i, root),
                           "gather to %d: byte %d of rank %d", root, i, r);
        memset(all, 0, 13 * (size_t)S);
        ts_allgather_bytes(c, mine, sizeof mine, all);
        for (int r = 0; r < S; r++)
            for (int i = 0; i < 13; i++)
                EXPECT(all[r * 13 + i] == vb(r, (size_t)i, root), "all-gather: byte %d of rank %d",
                       i, r);
        free(all);

        /* gatherv: rank r sends (r * 3 + root) % 4 records (some none). */
        int *counts = malloc((size_t)S * sizeof(int)), total = 0;
        for (int r = 0; r < S; r++) total += counts[r] = (r * 3 + root) % 4;
        const int n = counts[c->rank];
        rec send[4], *got = calloc((size_t)total + 1, sizeof(rec));
        for (int k = 0; k < n; k++) send[k] = (rec){ c->rank, k, vd(c->rank, (size_t)k, root) };
        ts_gatherv(c, send, n, sizeof(rec), c->rank == root ? got : NULL,
                   c->rank == root ? counts : NULL, root);
        if (c->rank == root)
            for (int r = 0, at = 0; r < S; r++)
                for (int k = 0; k < counts[r]; k++, at++)
                    EXPECT(got[at].rank == r && got[at].k == k &&
                               got[at].x == vd(r, (size_t)k, root),
                           "gatherv to %d: record %d of rank %d", root, k, r);
        free(counts);
        free(got);
    }
}

/* The lowest failing rank's message everywhere, named by rank and host unless rank 0. */
static void test_agree(ts_comm *c)
{
    context = "ts_comm_agree";
    const int S = c->size;
    char host[256], *hosts = calloc((size_t)S, sizeof host);
    ts_comm_host_name(host, sizeof host);
    ts_allgather_bytes(c, host, sizeof host, hosts);

    ts_fail("a stale message");
    EXPECT(ts_comm_agree(c, TS_OK) == TS_OK, "every rank ok: ok");
    for (int lo = 0; lo < S; lo++)
        for (int hi = lo; hi < S; hi++) { /* ranks lo and hi fail */
            const bool me = c->rank == lo || c->rank == hi;
            ts_status local = me ? ts_fail("boom on %d", c->rank) : ts_fail("a stale message");
            if (!me) local = TS_OK;
            ts_status st = ts_comm_agree(c, local);
            char want[600];
            if (lo == 0 || S == 1)
                snprintf(want, sizeof want, "boom on %d", lo);
            else
                snprintf(want, sizeof want, "on rank %d (host %s): boom on %d", lo,
                         hosts + (size_t)lo * sizeof host, lo);
            EXPECT(st == TS_ERR, "ranks %d and %d failed: not an error", lo, hi);
            EXPECT(!strcmp(ts_error_message(), want),
                   "ranks %d and %d failed: message \"%s\", not \"%s\"", lo, hi,
                   ts_error_message(), want);
        }
    ts_error_clear();
    free(hosts);
}

/* ------------------------------------------------------------ the groups -- */

/* A group made by a split or dup: its members, order, name, backend and stream. */
static void check_group(const ts_comm *g, const ts_comm *parent, const char *name, int size,
                        int rank, const int *world_ranks)
{
    context = name;
    EXPECT(g->size == size && g->rank == rank, "size %d rank %d, not %d and %d", g->size, g->rank,
           size, rank);
    EXPECT(!strcmp(g->name, name), "named %s", g->name);
    if (size == 0) {
        EXPECT(!ts_comm_member(g), "a non-member is no member");
        return;
    }
    EXPECT(g->owned, "a split or dup is owned");
    EXPECT(g->ops == parent->ops && g->stream == parent->stream,
           "the parent's backend and stream");
    int got[8] = { 0 };
    ts_comm_world_ranks(g, got);
    for (int r = 0; r < size; r++)
        EXPECT(got[r] == world_ranks[r], "member %d is world rank %d, not %d", r, got[r],
               world_ranks[r]);
    EXPECT(ts_comm_tag_max(g) >= 32767, "tag limit %d", ts_comm_tag_max(g));
}

/* The control plane's reductions and broadcast never go through the group's backend:
 * on a copy of c whose table is empty (a call through it would crash), they still
 * work. */
static void test_host_plane(const ts_comm *c)
{
    context = "host values beside an empty backend table";
    static const ts_comm_backend none = { .name = "none" };
    ts_comm h = *c;
    h.ops = &none;
    double d[2] = { 0.5, (double)c->rank };
    int i[3] = { 1, c->rank, -c->rank };
    uint64_t u[2] = { (uint64_t)c->rank + 1, UINT64_MAX - (uint64_t)c->rank };
    char path[32] = { 0 };
    if (c->rank == 0) snprintf(path, sizeof path, "from rank 0 of %d", c->size);
    ts_host_allreduce_sum_f64(&h, d, 1);
    ts_host_allreduce_max_f64(&h, d + 1, 1);
    ts_host_allreduce_sum_i32(&h, i, 1);
    ts_host_allreduce_min_i32(&h, i + 2, 1);
    ts_host_allreduce_max_i32(&h, i + 1, 1);
    ts_host_allreduce_min_u64(&h, u, 1);
    ts_host_allreduce_max_u64(&h, u + 1, 1);
    ts_host_broadcast(&h, path, sizeof path, 0);
    const int S = c->size;
    EXPECT(d[0] == 0.5 * S && d[1] == S - 1, "f64 sum %g, max %g", d[0], d[1]);
    EXPECT(i[0] == S && i[1] == S - 1 && i[2] == 1 - S, "i32 sum %d, max %d, min %d", i[0], i[1],
           i[2]);
    EXPECT(u[0] == 1 && u[1] == UINT64_MAX, "u64 min %llu, max %llu", (unsigned long long)u[0],
           (unsigned long long)u[1]);
    char want[32];
    snprintf(want, sizeof want, "from rank 0 of %d", S);
    EXPECT(!strcmp(path, want), "broadcast \"%s\"", path);
}

/* Everything on one group; the large counts on the world and the tp and dp groups. */
static void test_all(ts_comm *c, bool large)
{
    group = c->name;
    test_host_plane(c);
    test_collectives(c, large);
    test_nonblocking(c, large);
    test_p2p(c, large);
    test_hooks(c);
    test_gathers(c);
    test_agree(c);
}

int main(int argc, char **argv)
{
    ts_comm_init(&argc, &argv);
    ts_comm world;
    ts_comm_world(&world);
    world_rank = world.rank;
    const int W = world.size;
    TS_ASSERT(W >= 1 && W <= 8);

    /* mpi-staged before its copies are registered: a programming error, which must
     * abort with a message saying so (test_comm_conformance.sh checks both), not run. */
    if (argc > 1 && !strcmp(argv[1], "--no-copies")) {
        ts_comm_set_backend(&world, &ts_comm_mpi_staged);
        float a[4] = { 0 }, b[4 * 8];
        ts_allgather_f32(&world, a, b, 4); /* reaches the backend on one rank too */
        fprintf(stderr, "rank %d: mpi-staged ran without its copies\n", world.rank);
        ts_comm_finalize();
        return 1;
    }

    const char *name = argc > 1 ? argv[1] : "mpi";
    const ts_comm_backend *ops = ts_comm_backend_find(name);
    const bool nccl = !strcmp(name, "nccl");
#ifdef TS_HAVE_NCCL
    if (nccl && ts_cuda_device_count() == 0) {
        if (world.rank == 0) printf("nccl: no CUDA device visible here: skipped\n");
        ts_comm_finalize();
        return 77;
    }
#else
    if (nccl) {
        if (world.rank == 0) printf("nccl: this build has no NCCL backend: skipped\n");
        ts_comm_finalize();
        return 77;
    }
#endif
    if (!ops) {
        if (world.rank == 0) fprintf(stderr, "no comm backend named %s\n", name);
        ts_comm_finalize();
        return 2;
    }
    context = "the backend table";
    EXPECT(ts_comm_backend_find("mpi") == &ts_comm_mpi, "mpi is ts_comm_mpi");
    EXPECT(ts_comm_backend_find("no such backend") == NULL, "an unknown name");
    EXPECT(!ts_comm_backend_missing(&ts_comm_mpi), "mpi lacks %s",
           ts_comm_backend_missing(&ts_comm_mpi));
    EXPECT(ts_comm_backend_find("mpi-staged") == &ts_comm_mpi_staged,
           "mpi-staged is ts_comm_mpi_staged");
    EXPECT(!ts_comm_backend_missing(&ts_comm_mpi_staged), "mpi-staged lacks %s",
           ts_comm_backend_missing(&ts_comm_mpi_staged));
    EXPECT(!strcmp(ts_comm_mpi_staged.name, "mpi-staged"), "named %s", ts_comm_mpi_staged.name);
    EXPECT(!ts_comm_backend_missing(ops), "%s lacks %s", name, ts_comm_backend_missing(ops));
    EXPECT(world.ops == &ts_comm_mpi && !strcmp(world.name, "world") && !world.owned,
           "the world starts on MPI, not owned");
    if (ops == &ts_comm_mpi_staged) { /* device memory MPI may not touch: see dev_k */
        dev_k = &ts_kernels_cpu_strict;
        EXPECT(!ts_kernels_missing(dev_k), "%s lacks %s", dev_k->name,
               ts_kernels_missing(dev_k));
        ts_comm_staged_set_copies(dev_k->memcpy_d2h, dev_k->memcpy_h2d);
    }
#ifdef TS_HAVE_NCCL
    if (ops == &ts_comm_nccl) { /* the CUDA backend's memory, a GPU per node-local rank */
        dev_k = &ts_kernels_cuda;
        ts_comm node;
        ts_comm_split_node(&world, world.rank, "node", &node);
        ts_cuda_select_device(node.rank);
        ts_comm_free(&node);
    }
#endif
    if (ops != world.ops && ts_comm_set_backend(&world, ops) != TS_OK) {
        if (world.rank == 0) fprintf(stderr, "error: %s\n", ts_error_message());
        EXPECT(world.ops == &ts_comm_mpi, "a failed move leaves the world on MPI");
        ts_comm_finalize();
        return 1;
    }
    EXPECT(world.ops == ops, "the world is on %s", name);

    /* The groups: tp and dp of a 2 x ceil(W/2) grid (tp fastest: consecutive pairs;
     * on 3 ranks, tp {0,1} {2} and dp {0,2} {1}), the world reversed, the world
     * without its last rank, each rank alone, and duplicates of the world and dp. */
    int wr[8];
    ts_comm tp, dp, rev, most, alone, dup, dpdup;
    ts_comm_split(&world, world.rank / 2, world.rank, "tp", &tp);
    const int tp_size = world.rank / 2 * 2 + 2 <= W ? 2 : 1;
    for (int r = 0; r < tp_size; r++) wr[r] = world.rank / 2 * 2 + r;
    check_group(&tp, &world, "tp", tp_size, world.rank % 2, wr);

    ts_comm_split(&world, world.rank % 2, world.rank, "dp", &dp);
    int dp_size = 0;
    for (int r = world.rank % 2; r < W; r += 2) wr[dp_size++] = r;
    check_group(&dp, &world, "dp", dp_size, world.rank / 2, wr);

    ts_comm_split(&world, 0, -world.rank, "reversed", &rev);
    for (int r = 0; r < W; r++) wr[r] = W - 1 - r;
    check_group(&rev, &world, "reversed", W, W - 1 - world.rank, wr);

    const bool out = W > 1 && world.rank == W - 1;
    ts_comm_split(&world, out ? -1 : 7, 0, "most", &most);
    for (int r = 0; r < W - 1; r++) wr[r] = r;
    check_group(&most, &world, "most", out ? 0 : W > 1 ? W - 1 : 1, out ? 0 : world.rank, wr);

    ts_comm_split(&world, world.rank, 0, "alone", &alone);
    wr[0] = world.rank;
    check_group(&alone, &world, "alone", 1, 0, wr);

    ts_comm_dup(&world, "dup", &dup);
    for (int r = 0; r < W; r++) wr[r] = r;
    check_group(&dup, &world, "dup", W, world.rank, wr);
    ts_comm_dup(&dp, "dp dup", &dpdup);
    for (int r = world.rank % 2, k = 0; r < W; r += 2) wr[k++] = r;
    check_group(&dpdup, &dp, "dp dup", dp.size, dp.rank, wr);

    test_all(&world, true);
    test_all(&tp, true);
    test_all(&dp, true);
    test_all(&rev, false);
    if (ts_comm_member(&most)) test_all(&most, false);
    test_all(&alone, false);
    test_all(&dpdup, false);

    /* A duplicate's message space is its own: a reduction outstanding on it while the
     * world runs its own collectives and transfers, in the other order on odd ranks. */
    group = "dup";
    context = "a duplicate beside its parent";
    {
        const size_t n = 5000;
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        float *want = malloc(n * sizeof(float));
        float *da = dbuf_alloc(n * sizeof(float)), *db = dbuf_alloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            a[i] = vf(dup.rank, i, 300);
            b[i] = vf(world.rank, i, 301);
        }
        dbuf_put(&dup, da, a, n * sizeof(float));
        dbuf_put(&world, db, b, n * sizeof(float));
        ts_request r;
        ts_iallreduce_sum_f32(&dup, da, n, &r);
        ts_allreduce_sum_f32(&world, db, n);
        test_ring(&world, 100, 302);
        if (world.rank % 2) ts_request_test(&r);
        ts_request_wait(&r);
        dbuf_get(&dup, a, da, n * sizeof(float));
        dbuf_get(&world, b, db, n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            want[i] = 0.0f;
            for (int q = 0; q < W; q++) want[i] += vf(q, i, 300);
        }
        EXPECT_SAME(a, want, n, "the duplicate's sum");
        for (size_t i = 0; i < n; i++) {
            want[i] = 0.0f;
            for (int q = 0; q < W; q++) want[i] += vf(q, i, 301);
        }
        EXPECT_SAME(b, want, n, "the world's sum");
        dbuf_free(da);
        dbuf_free(db);
        free(a);
        free(b);
        free(want);
    }

    ts_comm *groups[] = { &tp, &dp, &rev, &most, &alone, &dup, &dpdup };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++) {
        ts_comm_free(groups[i]);
        EXPECT(!ts_comm_member(groups[i]) && !groups[i]->owned, "freed");
    }
    ts_barrier(&world);
    /* Back to MPI: releases the world's backend communicator before MPI stops. */
    EXPECT(ts_comm_set_backend(&world, &ts_comm_mpi) == TS_OK && world.backend_comm == NULL,
           "the world back on mpi");

    printf("rank %d: %d checks, %d failed (%s backend, %d ranks)\n", world.rank, n_checks,
           n_failed, name, W);
    ts_comm_finalize();
    if (n_checks == 0) {
        fprintf(stderr, "rank %d: FAIL: no checks ran\n", world.rank);
        return 1;
    }
    return n_failed ? 1 : 0;
}
