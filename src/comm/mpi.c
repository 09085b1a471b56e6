/* The MPI backend of the comm interface. Counts are size_t; MPI takes int, so large
 * buffers go in slices of at most 1 GiB elements (a blocking collective per slice; the
 * non-blocking ones must fit one call, which the bucketed callers guarantee). */
#include <limits.h>
#include <stdio.h>

#include "comm/comm.h"
#include "core/error.h"
#include "core/timer.h"
#include "core/watchdog.h"

#define SLICE ((size_t)1 << 30)

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

void ts_comm_wrap(ts_comm *c, MPI_Comm mpi, const char *name)
{
    c->mpi = mpi;
    c->name = name;
    c->rank = 0;
    c->size = 0;
    c->busy_ms = NULL;
    if (mpi == MPI_COMM_NULL) return;
    MPI_Comm_rank(mpi, &c->rank);
    MPI_Comm_size(mpi, &c->size);
}

static void allreduce(const ts_comm *c, void *buf, size_t n, MPI_Datatype type, size_t elem,
                      MPI_Op op)
{
    if (c->size <= 1) return;
    double t0 = c->busy_ms ? ts_now_ms() : 0.0;
    ts_watchdog_wait_begin("all-reduce", c->name, -1);
    for (size_t off = 0; off < n; off += SLICE) {
        size_t cnt = n - off < SLICE ? n - off : SLICE;
        check(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)cnt, type, op, c->mpi), c,
              "all-reduce");
    }
    ts_watchdog_wait_end();
    if (c->busy_ms) *c->busy_ms += ts_now_ms() - t0;
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
void ts_allreduce_max_i32(const ts_comm *c, int *buf, size_t n)
{
    allreduce(c, buf, n, MPI_INT, sizeof(int), MPI_MAX);
}

void ts_reduce_scatter_sum_f32(const ts_comm *c, const float *send, float *recv, size_t count)
{
    TS_ASSERT(count <= INT_MAX);
    if (c->size <= 1) {
        if (send != recv)
            for (size_t i = 0; i < count; i++) recv[i] = send[i];
        return;
    }
    ts_watchdog_wait_begin("reduce-scatter", c->name, -1);
    check(MPI_Reduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM, c->mpi), c,
          "reduce-scatter");
    ts_watchdog_wait_end();
}

void ts_allgather_f32(const ts_comm *c, const float *send, float *recv, size_t count)
{
    TS_ASSERT(count <= INT_MAX);
    if (c->size <= 1) {
        if (send != recv)
            for (size_t i = 0; i < count; i++) recv[i] = send[i];
        return;
    }
    ts_watchdog_wait_begin("all-gather", c->name, -1);
    check(MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, c->mpi), c,
          "all-gather");
    ts_watchdog_wait_end();
}

void ts_broadcast(const ts_comm *c, void *buf, size_t bytes, int root)
{
    if (c->size <= 1) return;
    ts_watchdog_wait_begin("broadcast", c->name, -1);
    for (size_t off = 0; off < bytes; off += SLICE)
        check(MPI_Bcast((char *)buf + off, (int)(bytes - off < SLICE ? bytes - off : SLICE), MPI_BYTE,
                        root, c->mpi),
              c, "broadcast");
    ts_watchdog_wait_end();
}

void ts_barrier(const ts_comm *c)
{
    if (c->size <= 1) return;
    ts_watchdog_wait_begin("barrier", c->name, -1);
    check(MPI_Barrier(c->mpi), c, "barrier");
    ts_watchdog_wait_end();
}

ts_status ts_comm_agree(const ts_comm *c, ts_status local)
{
    if (c->size <= 1) return local;
    int fail_rank = local == TS_OK ? INT_MAX : c->rank, first = INT_MAX;
    ts_watchdog_wait_begin("all-reduce (agreeing on success)", c->name, -1);
    check(MPI_Allreduce(&fail_rank, &first, 1, MPI_INT, MPI_MIN, c->mpi), c, "agreement");
    ts_watchdog_wait_end();
    if (first == INT_MAX) return TS_OK;
    char msg[2048] = {0};
    if (c->rank == first) {
        char host[MPI_MAX_PROCESSOR_NAME] = "?";
        int len = 0;
        MPI_Get_processor_name(host, &len);
        if (first != 0)
            snprintf(msg, sizeof msg, "on rank %d (host %s): %s", first, host,
                     ts_error_message());
        else
            snprintf(msg, sizeof msg, "%s", ts_error_message());
    }
    ts_watchdog_wait_begin("broadcast (an error message)", c->name, -1);
    check(MPI_Bcast(msg, sizeof msg, MPI_CHAR, first, c->mpi), c, "agreement");
    ts_watchdog_wait_end();
    return ts_fail("%s", msg);
}

void ts_iallreduce_sum_f32(const ts_comm *c, float *buf, size_t n, ts_request *r)
{
    TS_ASSERT(n <= INT_MAX);
    r->active = 0;
    r->what = "non-blocking all-reduce";
    r->comm = c->name;
    r->peer = -1;
    if (c->size <= 1) return;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->mpi, &r->req), c,
          "non-blocking all-reduce");
    r->active = 1;
}

void ts_isend_f32(const ts_comm *c, const float *buf, size_t n, int peer, int tag, ts_request *r)
{
    TS_ASSERT(n <= INT_MAX);
    check(MPI_Isend(buf, (int)n, MPI_FLOAT, peer, tag, c->mpi, &r->req), c, "send");
    r->active = 1;
    r->what = "send";
    r->comm = c->name;
    r->peer = peer;
}

void ts_irecv_f32(const ts_comm *c, float *buf, size_t n, int peer, int tag, ts_request *r)
{
    TS_ASSERT(n <= INT_MAX);
    check(MPI_Irecv(buf, (int)n, MPI_FLOAT, peer, tag, c->mpi, &r->req), c, "receive");
    r->active = 1;
    r->what = "receive";
    r->comm = c->name;
    r->peer = peer;
}

int ts_request_test(ts_request *r)
{
    if (!r->active) return 1;
    int done = 0;
    check(MPI_Test(&r->req, &done, MPI_STATUS_IGNORE), NULL, "progress");
    if (done) {
        r->active = 0;
        ts_watchdog_progress();
    }
    return done;
}

void ts_request_wait(ts_request *r)
{
    if (!r->active) return;
    ts_watchdog_wait_begin(r->what, r->comm, r->peer);
    check(MPI_Wait(&r->req, MPI_STATUS_IGNORE), NULL, "wait");
    ts_watchdog_wait_end();
    r->active = 0;
}
