/* The data plane's front end: every backend's collectives and transfers behind the
 * same checks, watchdog marks and busy_ms / on_span reports, with one indirect call
 * into the group's table (c->ops) per operation. No backend types here. */
#include <string.h>

#include "comm/comm.h"
#include "comm/internal.h"
#include "core/error.h"
#include "core/timer.h"
#include "core/watchdog.h"

/* ------------------------------------------------------------ backends -- */

const ts_comm_backend *ts_comm_backend_find(const char *name)
{
    static const ts_comm_backend *const all[] = {
        &ts_comm_mpi, &ts_comm_mpi_staged,
#ifdef TS_HAVE_NCCL
        &ts_comm_nccl,
#endif
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    return NULL;
}

const char *ts_comm_backend_missing(const ts_comm_backend *b)
{
#define REQUIRE(slot)                                                                      \
    if (!b->slot) return #slot
    if (!b->name) return "name";
    REQUIRE(allreduce);
    REQUIRE(reduce_scatter);
    REQUIRE(allgather);
    REQUIRE(broadcast);
    REQUIRE(barrier);
    REQUIRE(alltoallv);
    REQUIRE(ialltoallv);
    REQUIRE(iallreduce);
    REQUIRE(ireduce_scatter);
    REQUIRE(iallgather);
    REQUIRE(isend);
    REQUIRE(irecv);
    REQUIRE(test);
    REQUIRE(wait);
    REQUIRE(group_begin);
    REQUIRE(group_end);
#undef REQUIRE
    return NULL;
}

/* ------------------------------------------------------- the collectives -- */

static void allreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, size_t elem,
                      ts_comm_op op)
{
    if (c->size <= 1) return;
    double t0 = ts_comm_begin(c, "all-reduce");
    c->ops->allreduce(c, buf, n, type, op, c->stream);
    ts_comm_end(c, "all-reduce", n * elem, t0);
}

void ts_allreduce_sum_f32(const ts_comm *c, float *buf, size_t n)
{
    allreduce(c, buf, n, TS_COMM_F32, sizeof(float), TS_COMM_SUM);
}
void ts_allreduce_max_f32(const ts_comm *c, float *buf, size_t n)
{
    allreduce(c, buf, n, TS_COMM_F32, sizeof(float), TS_COMM_MAX);
}

static void reduce_scatter(const ts_comm *c, const void *send, void *recv, size_t count,
                           ts_comm_dtype type, size_t elem)
{
    if (c->size <= 1) { /* a copy at most: nothing to mark or time */
        if (send != recv && count > 0)
            c->ops->reduce_scatter(c, send, recv, count, type, TS_COMM_SUM, c->stream);
        return;
    }
    double t0 = ts_comm_begin(c, "reduce-scatter");
    c->ops->reduce_scatter(c, send, recv, count, type, TS_COMM_SUM, c->stream);
    ts_comm_end(c, "reduce-scatter", count * (size_t)c->size * elem, t0);
}

static void allgather(const ts_comm *c, const void *send, void *recv, size_t count,
                      ts_comm_dtype type, size_t elem)
{
    if (c->size <= 1) {
        if (send != recv && count > 0) c->ops->allgather(c, send, recv, count, type, c->stream);
        return;
    }
    double t0 = ts_comm_begin(c, "all-gather");
    c->ops->allgather(c, send, recv, count, type, c->stream);
    ts_comm_end(c, "all-gather", count * (size_t)c->size * elem, t0);
}

void ts_reduce_scatter_sum_f32(const ts_comm *c, const float *send, float *recv, size_t count)
{
    reduce_scatter(c, send, recv, count, TS_COMM_F32, sizeof(float));
}

void ts_allgather_f32(const ts_comm *c, const float *send, float *recv, size_t count)
{
    allgather(c, send, recv, count, TS_COMM_F32, sizeof(float));
}

void ts_broadcast_dev(const ts_comm *c, void *buf, size_t bytes, int root)
{
    if (c->size <= 1) return;
    double t0 = ts_comm_begin(c, "broadcast");
    c->ops->broadcast(c, buf, bytes, root, c->stream);
    ts_comm_end(c, "broadcast", bytes, t0);
}

void ts_barrier(const ts_comm *c)
{
    if (c->size <= 1) return;
    double t0 = ts_comm_begin(c, "barrier");
    c->ops->barrier(c, c->stream);
    ts_comm_end(c, "barrier", 0, t0);
}

/* ------------------------------------------------------ non-blocking -- */

/* A request as started on c: what, comm and peer for the watchdog, no span yet. */
static void request_start(const ts_comm *c, ts_request *r, const char *what, int peer)
{
    r->ops = c->ops;
    r->active = 0;
    r->what = what;
    r->comm = c->name;
    r->peer = peer;
    r->on_span = NULL;
    r->on_span_ctx = NULL;
    r->op = NULL;
    r->bytes = 0;
    r->start_ms = 0.0;
    r->stage = NULL;
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
    request_start(c, r, "non-blocking all-reduce", -1);
    if (c->size <= 1) return;
    start_span(c, r, "all-reduce", n * sizeof(float));
    c->ops->iallreduce(c, buf, n, TS_COMM_F32, TS_COMM_SUM, c->stream, r);
    r->active = 1;
}

void ts_ireduce_scatter_sum_f32(const ts_comm *c, float *buf, const int *counts, ts_request *r)
{
    request_start(c, r, "non-blocking reduce-scatter", -1);
    if (c->size <= 1) return; /* piece 0 is the whole input, already in place */
    start_span(c, r, "reduce-scatter", ts_comm_counts_total(c, counts) * sizeof(float));
    c->ops->ireduce_scatter(c, buf, counts, TS_COMM_F32, TS_COMM_SUM, c->stream, r);
    r->active = 1;
}

void ts_iallgather_f32(const ts_comm *c, float *buf, const int *counts, const int *displs,
                       ts_request *r)
{
    request_start(c, r, "non-blocking all-gather", -1);
    if (c->size <= 1) return;
    start_span(c, r, "all-gather", ts_comm_counts_total(c, counts) * sizeof(float));
    c->ops->iallgather(c, buf, counts, displs, TS_COMM_F32, c->stream, r);
    r->active = 1;
}

void ts_isend_f32(const ts_comm *c, const float *buf, size_t n, int peer, int tag, ts_request *r)
{
    request_start(c, r, "send", peer);
    c->ops->isend(c, buf, n, TS_COMM_F32, peer, tag, c->stream, r);
    r->active = 1;
}

void ts_irecv_f32(const ts_comm *c, float *buf, size_t n, int peer, int tag, ts_request *r)
{
    request_start(c, r, "receive", peer);
    c->ops->irecv(c, buf, n, TS_COMM_F32, peer, tag, c->stream, r);
    r->active = 1;
}

static ts_comm_dtype comm_type(ts_dtype t) { return t == TS_DTYPE_BF16 ? TS_COMM_BF16 : TS_COMM_F32; }

void ts_allreduce_sum_act(const ts_comm *c, void *buf, size_t n, ts_dtype type)
{
    allreduce(c, buf, n, comm_type(type), ts_dtype_bytes(type), TS_COMM_SUM);
}

void ts_reduce_scatter_sum_act(const ts_comm *c, const void *send, void *recv, size_t count,
                               ts_dtype type)
{
    reduce_scatter(c, send, recv, count, comm_type(type), ts_dtype_bytes(type));
}

void ts_allgather_act(const ts_comm *c, const void *send, void *recv, size_t count, ts_dtype type)
{
    allgather(c, send, recv, count, comm_type(type), ts_dtype_bytes(type));
}

void ts_alltoallv_act(const ts_comm *c, const void *send, const int *send_counts,
                      const int *send_displs, void *recv, const int *recv_counts,
                      const int *recv_displs, ts_dtype type)
{
    if (c->size <= 1) { /* a copy at most, by the backend (its memory): nothing to time */
        if (send_counts[0] > 0)
            c->ops->alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                              comm_type(type), c->stream);
        return;
    }
    double t0 = ts_comm_begin(c, "all-to-all");
    c->ops->alltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                      comm_type(type), c->stream);
    size_t elems = 0;
    for (int j = 0; j < c->size; j++) elems += (size_t)send_counts[j] + (size_t)recv_counts[j];
    ts_comm_end(c, "all-to-all", elems * ts_dtype_bytes(type), t0);
}

void ts_ialltoallv_act(const ts_comm *c, const void *send, const int *send_counts,
                       const int *send_displs, void *recv, const int *recv_counts,
                       const int *recv_displs, ts_dtype type, ts_request *r)
{
    request_start(c, r, "non-blocking all-to-all", -1);
    if (c->size <= 1) { /* the blocking form's copy: complete at once */
        ts_alltoallv_act(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                         type);
        return;
    }
    size_t elems = 0;
    for (int j = 0; j < c->size; j++) elems += (size_t)send_counts[j] + (size_t)recv_counts[j];
    start_span(c, r, "all-to-all", elems * ts_dtype_bytes(type));
    c->ops->ialltoallv(c, send, send_counts, send_displs, recv, recv_counts, recv_displs,
                       comm_type(type), c->stream, r);
    r->active = 1;
}

void ts_iallreduce_sum_act(const ts_comm *c, void *buf, size_t n, ts_dtype type, ts_request *r)
{
    request_start(c, r, "non-blocking all-reduce", -1);
    if (c->size <= 1) return;
    start_span(c, r, "all-reduce", n * ts_dtype_bytes(type));
    c->ops->iallreduce(c, buf, n, comm_type(type), TS_COMM_SUM, c->stream, r);
    r->active = 1;
}

void ts_ireduce_scatter_sum_act(const ts_comm *c, void *buf, const int *counts, ts_dtype type,
                                ts_request *r)
{
    request_start(c, r, "non-blocking reduce-scatter", -1);
    if (c->size <= 1) return;
    start_span(c, r, "reduce-scatter", ts_comm_counts_total(c, counts) * ts_dtype_bytes(type));
    c->ops->ireduce_scatter(c, buf, counts, comm_type(type), TS_COMM_SUM, c->stream, r);
    r->active = 1;
}

void ts_iallgather_act(const ts_comm *c, void *buf, const int *counts, const int *displs,
                       ts_dtype type, ts_request *r)
{
    request_start(c, r, "non-blocking all-gather", -1);
    if (c->size <= 1) return;
    start_span(c, r, "all-gather", ts_comm_counts_total(c, counts) * ts_dtype_bytes(type));
    c->ops->iallgather(c, buf, counts, displs, comm_type(type), c->stream, r);
    r->active = 1;
}

void ts_isend_act(const ts_comm *c, const void *buf, size_t n, ts_dtype type, int peer, int tag,
                  ts_request *r)
{
    request_start(c, r, "send", peer);
    c->ops->isend(c, buf, n, comm_type(type), peer, tag, c->stream, r);
    r->active = 1;
}

void ts_irecv_act(const ts_comm *c, void *buf, size_t n, ts_dtype type, int peer, int tag,
                  ts_request *r)
{
    request_start(c, r, "receive", peer);
    c->ops->irecv(c, buf, n, comm_type(type), peer, tag, c->stream, r);
    r->active = 1;
}

int ts_request_test(ts_request *r)
{
    if (!r->active) return 1;
    if (!r->ops->test(r)) return 0;
    completed(r);
    ts_watchdog_progress();
    return 1;
}

void ts_request_wait(ts_request *r)
{
    if (!r->active) return;
    ts_watchdog_wait_begin(r->what, r->comm, r->peer);
    r->ops->wait(r);
    ts_watchdog_wait_end();
    completed(r);
}

void ts_comm_group_begin(const ts_comm *c) { c->ops->group_begin(c, c->stream); }

void ts_comm_group_end(const ts_comm *c) { c->ops->group_end(c, c->stream); }
