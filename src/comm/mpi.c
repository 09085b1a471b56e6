/* The MPI backend of the comm interface. Counts are size_t; MPI takes int, so large
 * buffers go in slices of at most 1 GiB elements (a blocking collective per slice; the
 * non-blocking ones must fit one call, which the bucketed callers guarantee). This is
 * the only file that calls MPI (tests/test_boundaries.sh checks it). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm/comm.h"
#include "core/error.h"
#include "core/timer.h"
#include "core/watchdog.h"

#define SLICE ((size_t)1 << 30)

_Static_assert(sizeof(MPI_Comm) <= sizeof(ts_comm_handle), "an MPI_Comm fits a ts_comm_handle");
_Static_assert(sizeof(MPI_Request) <= sizeof(ts_comm_handle),
               "an MPI_Request fits a ts_comm_handle");

static void check(int rc, const ts_comm *c, const char *what)
{
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "tessera: rank %d: %s on the %s group failed: %s\n", rank, what,
            c ? c->name : "?", msg);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

/* ------------------------------------------------------------- handles -- */

static MPI_Comm comm_of(const ts_comm *c)
{
    MPI_Comm m;
    memcpy(&m, &c->handle, sizeof m);
    return m;
}

static MPI_Request request_of(const ts_request *r)
{
    MPI_Request q;
    memcpy(&q, &r->handle, sizeof q);
    return q;
}

static void set_request(ts_request *r, MPI_Request q)
{
    memset(&r->handle, 0, sizeof r->handle);
    memcpy(&r->handle, &q, sizeof q);
}

/* Fill *c for the communicator m (MPI_COMM_NULL: not a member). */
static void wrap(ts_comm *c, MPI_Comm m, const char *name, bool owned)
{
    memset(c, 0, sizeof *c);
    memcpy(&c->handle, &m, sizeof m);
    c->name = name;
    if (m == MPI_COMM_NULL) return;
    c->owned = owned;
    check(MPI_Comm_rank(m, &c->rank), c, "rank query");
    check(MPI_Comm_size(m, &c->size), c, "size query");
}

/* ----------------------------------------------------------- the process -- */

bool ts_comm_init(int *argc, char ***argv)
{
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) { /* nothing else may be called: say so and leave */
        char msg[MPI_MAX_ERROR_STRING] = "?";
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        fprintf(stderr, "tessera: error: MPI failed to start: %s\n", msg);
        exit(3);
    }
    return provided >= MPI_THREAD_FUNNELED;
}

bool ts_comm_thread_multiple(void)
{
    int level = MPI_THREAD_SINGLE;
    check(MPI_Query_thread(&level), NULL, "thread level query");
    return level >= MPI_THREAD_MULTIPLE;
}

bool ts_comm_threads_ok(void)
{
    int level = MPI_THREAD_SINGLE;
    check(MPI_Query_thread(&level), NULL, "thread level query");
    return level >= MPI_THREAD_FUNNELED;
}

void ts_comm_finalize(void)
{
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    ts_watchdog_wait_begin("MPI_Finalize", "world", -1);
    int rc = MPI_Finalize();
    ts_watchdog_wait_end();
    /* MPI may no longer be called: report it, nothing more can be done. */
    if (rc != MPI_SUCCESS) fprintf(stderr, "tessera: rank %d: MPI_Finalize failed\n", rank);
}

void ts_comm_host_name(char *buf, size_t cap)
{
    char name[MPI_MAX_PROCESSOR_NAME] = "?";
    int len = 0;
    check(MPI_Get_processor_name(name, &len), NULL, "host name query");
    name[len >= 0 && len < MPI_MAX_PROCESSOR_NAME ? len : MPI_MAX_PROCESSOR_NAME - 1] = '\0';
    snprintf(buf, cap, "%s", name);
}

/* ------------------------------------------------------------ the groups -- */

void ts_comm_world(ts_comm *c) { wrap(c, MPI_COMM_WORLD, "world", false); }

void ts_comm_split(const ts_comm *parent, int color, int key, const char *name, ts_comm *out)
{
    TS_ASSERT(ts_comm_member(parent));
    MPI_Comm m = MPI_COMM_NULL;
    ts_watchdog_wait_begin("communicator split", parent->name, -1);
    check(MPI_Comm_split(comm_of(parent), color < 0 ? MPI_UNDEFINED : color, key, &m), parent,
          "communicator split");
    ts_watchdog_wait_end();
    wrap(out, m, name, true);
}

void ts_comm_dup(const ts_comm *c, const char *name, ts_comm *out)
{
    TS_ASSERT(ts_comm_member(c));
    MPI_Comm m = MPI_COMM_NULL;
    ts_watchdog_wait_begin("communicator duplicate", c->name, -1);
    check(MPI_Comm_dup(comm_of(c), &m), c, "communicator duplicate");
    ts_watchdog_wait_end();
    wrap(out, m, name, true);
}

void ts_comm_split_node(const ts_comm *parent, int key, const char *name, ts_comm *out)
{
    TS_ASSERT(ts_comm_member(parent));
    MPI_Comm m = MPI_COMM_NULL;
    ts_watchdog_wait_begin("communicator split (shared memory)", parent->name, -1);
    check(MPI_Comm_split_type(comm_of(parent), MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &m),
          parent, "communicator split (shared memory)");
    ts_watchdog_wait_end();
    wrap(out, m, name, true);
}

void ts_comm_free(ts_comm *c)
{
    if (c->owned && c->size > 0) {
        MPI_Comm m = comm_of(c);
        check(MPI_Comm_free(&m), c, "communicator free");
    }
    c->owned = false;
    c->size = 0;
}

int ts_comm_tag_max(const ts_comm *c)
{
    /* MPI_TAG_UB is cached on MPI_COMM_WORLD and holds for every communicator. */
    int flag = 0, *ub = NULL;
    check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag), c, "tag limit query");
    return flag && ub ? *ub : INT_MAX;
}

void ts_comm_world_ranks(const ts_comm *c, int *world_ranks)
{
    if (c->size <= 0) return;
    MPI_Group group, world;
    check(MPI_Comm_group(comm_of(c), &group), c, "group query");
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), c, "group query");
    int *ranks = ts_malloc((size_t)c->size * sizeof(int));
    for (int r = 0; r < c->size; r++) ranks[r] = r;
    check(MPI_Group_translate_ranks(group, c->size, ranks, world, world_ranks), c,
          "rank translation");
    free(ranks);
    MPI_Group_free(&group);
    MPI_Group_free(&world);
}

/* ------------------------------------------------------- the collectives -- */

/* Around every blocking collective: the watchdog mark, and the time for busy_ms and
 * on_span when the group has them. */
static double begin(const ts_comm *c, const char *what)
{
    ts_watchdog_wait_begin(what, c->name, -1);
    return c->busy_ms || c->on_span ? ts_now_ms() : 0.0;
}

static void end(const ts_comm *c, const char *what, size_t bytes, double t0)
{
    ts_watchdog_wait_end();
    if (!c->busy_ms && !c->on_span) return;
    double t1 = ts_now_ms();
    if (c->busy_ms) *c->busy_ms += t1 - t0;
    if (c->on_span) c->on_span(c->on_span_ctx, what, bytes, t0, t1);
}

static void allreduce(const ts_comm *c, void *buf, size_t n, MPI_Datatype type, size_t elem,
                      MPI_Op op)
{
    if (c->size <= 1) return;
    double t0 = begin(c, "all-reduce");
    for (size_t off = 0; off < n; off += SLICE) {
        size_t cnt = n - off < SLICE ? n - off : SLICE;
        check(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)cnt, type, op,
                            comm_of(c)),
              c, "all-reduce");
    }
    end(c, "all-reduce", n * elem, t0);
}

void ts_allreduce_sum_f32(const ts_comm *c, float *buf, size_t n)
{
    allreduce(c, buf, n, MPI_FLOAT, sizeof(float), MPI_SUM);
}
void ts_allreduce_max_f32(const ts_comm *c, float *buf, size_t n)
{
    allreduce(c, buf, n, MPI_FLOAT, sizeof(float), MPI_MAX);
}
void ts_allreduce_sum_f64(const ts_comm *c, double *buf, size_t n)
{
    allreduce(c, buf, n, MPI_DOUBLE, sizeof(double), MPI_SUM);
}
void ts_allreduce_max_f64(const ts_comm *c, double *buf, size_t n)
{
    allreduce(c, buf, n, MPI_DOUBLE, sizeof(double), MPI_MAX);
}
void ts_allreduce_sum_i32(const ts_comm *c, int *buf, size_t n)
{
    allreduce(c, buf, n, MPI_INT, sizeof(int), MPI_SUM);
}
void ts_allreduce_min_i32(const ts_comm *c, int *buf, size_t n)
{
    allreduce(c, buf, n, MPI_INT, sizeof(int), MPI_MIN);
}
void ts_allreduce_max_i32(const ts_comm *c, int *buf, size_t n)
{
    allreduce(c, buf, n, MPI_INT, sizeof(int), MPI_MAX);
}
void ts_allreduce_min_u64(const ts_comm *c, uint64_t *buf, size_t n)
{
    allreduce(c, buf, n, MPI_UINT64_T, sizeof(uint64_t), MPI_MIN);
}
void ts_allreduce_max_u64(const ts_comm *c, uint64_t *buf, size_t n)
{
    allreduce(c, buf, n, MPI_UINT64_T, sizeof(uint64_t), MPI_MAX);
}

void ts_reduce_scatter_sum_f32(const ts_comm *c, const float *send, float *recv, size_t count)
{
    TS_ASSERT(count <= INT_MAX);
    if (c->size <= 1) {
        if (send != recv)
            for (size_t i = 0; i < count; i++) recv[i] = send[i];
        return;
    }
    double t0 = begin(c, "reduce-scatter");
    check(MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, comm_of(c)), c,
          "reduce-scatter");
    end(c, "reduce-scatter", count * (size_t)c->size * sizeof(float), t0);
}

void ts_allgather_f32(const ts_comm *c, const float *send, float *recv, size_t count)
{
    TS_ASSERT(count <= INT_MAX);
    if (c->size <= 1) {
        if (send != recv)
            for (size_t i = 0; i < count; i++) recv[i] = send[i];
        return;
    }
    double t0 = begin(c, "all-gather");
    check(MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, comm_of(c)), c,
          "all-gather");
    end(c, "all-gather", count * (size_t)c->size * sizeof(float), t0);
}

void ts_allgather_bytes(const ts_comm *c, const void *send, size_t bytes, void *recv)
{
    TS_ASSERT(bytes <= INT_MAX);
    if (c->size <= 1) {
        if (bytes > 0 && send != recv) memmove(recv, send, bytes);
        return;
    }
    double t0 = begin(c, "all-gather");
    check(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm_of(c)), c,
          "all-gather");
    end(c, "all-gather", bytes * (size_t)c->size, t0);
}

void ts_gather_bytes(const ts_comm *c, const void *send, size_t bytes, void *recv, int root)
{
    TS_ASSERT(bytes <= INT_MAX);
    if (c->size <= 1) {
        if (bytes > 0 && send != recv) memmove(recv, send, bytes);
        return;
    }
    double t0 = begin(c, "gather");
    check(MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, comm_of(c)), c,
          "gather");
    end(c, "gather", bytes, t0);
}

void ts_gatherv(const ts_comm *c, const void *send, int n, size_t elem_bytes, void *recv,
                const int *counts, int root)
{
    TS_ASSERT(n >= 0 && elem_bytes > 0 && elem_bytes <= INT_MAX);
    if (c->size <= 1) {
        if (n > 0 && send != recv) memmove(recv, send, (size_t)n * elem_bytes);
        return;
    }
    int *displs = NULL;
    if (c->rank == root) {
        displs = ts_malloc((size_t)c->size * sizeof(int));
        long long total = 0;
        for (int r = 0; r < c->size; r++) {
            TS_ASSERT(counts[r] >= 0);
            displs[r] = (int)total;
            total += counts[r];
            TS_ASSERT(total <= INT_MAX);
        }
    }
    MPI_Datatype type;
    check(MPI_Type_contiguous((int)elem_bytes, MPI_BYTE, &type), c, "gather (type)");
    check(MPI_Type_commit(&type), c, "gather (type)");
    double t0 = begin(c, "gather");
    check(MPI_Gatherv(send, n, type, recv, counts, displs, type, root, comm_of(c)), c, "gather");
    end(c, "gather", (size_t)n * elem_bytes, t0);
    check(MPI_Type_free(&type), c, "gather (type)");
    free(displs);
}

void ts_broadcast(const ts_comm *c, void *buf, size_t bytes, int root)
{
    if (c->size <= 1) return;
    double t0 = begin(c, "broadcast");
    for (size_t off = 0; off < bytes; off += SLICE)
        check(MPI_Bcast((char *)buf + off, (int)(bytes - off < SLICE ? bytes - off : SLICE),
                        MPI_BYTE, root, comm_of(c)),
              c, "broadcast");
    end(c, "broadcast", bytes, t0);
}

void ts_barrier(const ts_comm *c)
{
    if (c->size <= 1) return;
    double t0 = begin(c, "barrier");
    check(MPI_Barrier(comm_of(c)), c, "barrier");
    end(c, "barrier", 0, t0);
}

ts_status ts_comm_agree(const ts_comm *c, ts_status local)
{
    if (c->size <= 1) return local;
    int fail_rank = local == TS_OK ? INT_MAX : c->rank, first = INT_MAX;
    ts_watchdog_wait_begin("all-reduce (agreeing on success)", c->name, -1);
    check(MPI_Allreduce(&fail_rank, &first, 1, MPI_INT, MPI_MIN, comm_of(c)), c, "agreement");
    ts_watchdog_wait_end();
    if (first == INT_MAX) return TS_OK;
    char msg[2048] = {0};
    if (c->rank == first) {
        char host[MPI_MAX_PROCESSOR_NAME];
        ts_comm_host_name(host, sizeof host);
        if (first != 0)
            snprintf(msg, sizeof msg, "on rank %d (host %s): %s", first, host,
                     ts_error_message());
        else
            snprintf(msg, sizeof msg, "%s", ts_error_message());
    }
    ts_watchdog_wait_begin("broadcast (an error message)", c->name, -1);
    check(MPI_Bcast(msg, sizeof msg, MPI_CHAR, first, comm_of(c)), c, "agreement");
    ts_watchdog_wait_end();
    return ts_fail("%s", msg);
}

/* ------------------------------------------------------ non-blocking -- */

/* A request that is not a collective reports no span. */
static void no_span(ts_request *r)
{
    r->on_span = NULL;
    r->on_span_ctx = NULL;
    r->op = NULL;
    r->bytes = 0;
    r->start_ms = 0.0;
}

/* A collective's request reports its span to the group's on_span when complete. */
static void start_span(const ts_comm *c, ts_request *r, const char *op, size_t bytes)
{
    r->on_span = c->on_span;
    r->on_span_ctx = c->on_span_ctx;
    r->op = op;
    r->bytes = bytes;
    r->start_ms = c->on_span ? ts_now_ms() : 0.0;
}

static void completed(ts_request *r)
{
    r->active = 0;
    if (!r->on_span) return;
    ts_comm_span_fn fn = r->on_span;
    r->on_span = NULL;
    fn(r->on_span_ctx, r->op, r->bytes, r->start_ms, ts_now_ms());
}

void ts_iallreduce_sum_f32(const ts_comm *c, float *buf, size_t n, ts_request *r)
{
    TS_ASSERT(n <= INT_MAX);
    r->active = 0;
    r->what = "non-blocking all-reduce";
    r->comm = c->name;
    r->peer = -1;
    no_span(r);
    if (c->size <= 1) return;
    start_span(c, r, "all-reduce", n * sizeof(float));
    MPI_Request q;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, comm_of(c), &q), c,
          "non-blocking all-reduce");
    set_request(r, q);
    r->active = 1;
}

void ts_ireduce_scatter_sum_f32(const ts_comm *c, float *buf, const int *counts, ts_request *r)
{
    r->active = 0;
    r->what = "non-blocking reduce-scatter";
    r->comm = c->name;
    r->peer = -1;
    no_span(r);
    if (c->size <= 1) return; /* piece 0 is the whole input, already in place */
    size_t total = 0;
    for (int k = 0; k < c->size; k++) total += (size_t)counts[k];
    start_span(c, r, "reduce-scatter", total * sizeof(float));
    MPI_Request q;
    check(MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, MPI_FLOAT, MPI_SUM, comm_of(c), &q), c,
          "non-blocking reduce-scatter");
    set_request(r, q);
    r->active = 1;
}

void ts_iallgather_f32(const ts_comm *c, float *buf, const int *counts, const int *displs,
                       ts_request *r)
{
    r->active = 0;
    r->what = "non-blocking all-gather";
    r->comm = c->name;
    r->peer = -1;
    no_span(r);
    if (c->size <= 1) return;
    size_t total = 0;
    for (int k = 0; k < c->size; k++) total += (size_t)counts[k];
    start_span(c, r, "all-gather", total * sizeof(float));
    MPI_Request q;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, MPI_FLOAT,
                          comm_of(c), &q),
          c, "non-blocking all-gather");
    set_request(r, q);
    r->active = 1;
}

void ts_isend_f32(const ts_comm *c, const float *buf, size_t n, int peer, int tag, ts_request *r)
{
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    check(MPI_Isend(buf, (int)n, MPI_FLOAT, peer, tag, comm_of(c), &q), c, "send");
    set_request(r, q);
    no_span(r);
    r->active = 1;
    r->what = "send";
    r->comm = c->name;
    r->peer = peer;
}

void ts_irecv_f32(const ts_comm *c, float *buf, size_t n, int peer, int tag, ts_request *r)
{
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    check(MPI_Irecv(buf, (int)n, MPI_FLOAT, peer, tag, comm_of(c), &q), c, "receive");
    set_request(r, q);
    no_span(r);
    r->active = 1;
    r->what = "receive";
    r->comm = c->name;
    r->peer = peer;
}

int ts_request_test(ts_request *r)
{
    if (!r->active) return 1;
    int done = 0;
    MPI_Request q = request_of(r);
    check(MPI_Test(&q, &done, MPI_STATUS_IGNORE), NULL, "progress");
    set_request(r, q);
    if (done) {
        completed(r);
        ts_watchdog_progress();
    }
    return done;
}

void ts_request_wait(ts_request *r)
{
    if (!r->active) return;
    MPI_Request q = request_of(r);
    ts_watchdog_wait_begin(r->what, r->comm, r->peer);
    check(MPI_Wait(&q, MPI_STATUS_IGNORE), NULL, "wait");
    ts_watchdog_wait_end();
    set_request(r, q);
    completed(r);
}
