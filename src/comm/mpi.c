/* The MPI data-plane backend (ts_comm_mpi, comm.h): buffers MPI may touch (host memory,
 * or device memory under a CUDA-aware MPI), called through comm.c; comm/staged.c wraps
 * it for the memory MPI may not touch, as nccl.c is the backend for CUDA buffers. The
 * control plane (the process, the groups, agreement, host values) is comm/control.c,
 * which shares this file's checks and sliced collectives (comm/mpi_internal.h) and is
 * the only other file that calls MPI (tests/test_boundaries.sh checks it).
 * Counts are size_t; MPI takes int, so large buffers go in slices of at most 1 GiB
 * elements (a blocking collective per slice; the non-blocking ones must fit one call,
 * which the bucketed callers guarantee). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/internal.h"
#include "comm/mpi_internal.h"
#include "core/error.h"
#include "core/watchdog.h"

#define SLICE ((size_t)1 << 30)

_Static_assert(sizeof(MPI_Request) <= sizeof(ts_comm_handle),
               "an MPI_Request fits a ts_comm_handle");

void ts_mpi_check(int rc, const ts_comm *c, const char *what)
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

/* The data plane's types and reductions. MPI has no bf16: its elements travel as
 * 16-bit integers and sum through a user operation (fp32 adds, one rounding each). */
static MPI_Datatype type_of(ts_comm_dtype t)
{
    switch (t) {
    case TS_COMM_F32: return MPI_FLOAT;
    case TS_COMM_F64: return MPI_DOUBLE;
    case TS_COMM_I32: return MPI_INT;
    case TS_COMM_U64: return MPI_UINT64_T;
    case TS_COMM_BF16: return MPI_UINT16_T;
    }
    TS_ASSERT(!"a ts_comm_dtype");
    return MPI_DATATYPE_NULL;
}

static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = bf16_round(bf16_value(a[i]) + bf16_value(b[i]));
}

static MPI_Op op_of(ts_comm_op op, ts_comm_dtype t)
{
    if (t == TS_COMM_BF16) {
        /* Made once, on first use, by whichever thread runs the data plane first; MPI
         * frees it at MPI_Finalize. Only the sum is needed (tensor parallelism). */
        static MPI_Op sum = MPI_OP_NULL;
        TS_ASSERT(op == TS_COMM_SUM);
        if (sum == MPI_OP_NULL) TS_ASSERT(MPI_Op_create(bf16_sum, 1, &sum) == MPI_SUCCESS);
        return sum;
    }
    switch (op) {
    case TS_COMM_SUM: return MPI_SUM;
    case TS_COMM_MIN: return MPI_MIN;
    case TS_COMM_MAX: return MPI_MAX;
    }
    TS_ASSERT(!"a ts_comm_op");
    return MPI_OP_NULL;
}

/* The in-place all-reduce and the broadcast both planes run (the data plane's on the
 * backend's buffers, the control plane's on host values), in slices of at most SLICE
 * elements or bytes, since MPI counts are int. */
void ts_mpi_allreduce_sliced(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                             ts_comm_op op)
{
    const size_t elem = ts_comm_dtype_size(type);
    for (size_t off = 0; off < n; off += SLICE) {
        size_t cnt = n - off < SLICE ? n - off : SLICE;
        ts_mpi_check(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)cnt, type_of(type),
                                   op_of(op, type), ts_mpi_comm_of(c)),
                     c, "all-reduce");
    }
}

void ts_mpi_broadcast_sliced(const ts_comm *c, void *buf, size_t bytes, int root)
{
    for (size_t off = 0; off < bytes; off += SLICE)
        ts_mpi_check(MPI_Bcast((char *)buf + off, (int)(bytes - off < SLICE ? bytes - off : SLICE),
                               MPI_BYTE, root, ts_mpi_comm_of(c)),
                     c, "broadcast");
}

/* --------------------------- the data plane (buffers MPI may touch) -- */

/* comm.c calls these on groups of two or more ranks (reduce_scatter and allgather also
 * on one rank, for a copy); it marks the watchdog and reports the time. */

static void mpi_allreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                          ts_comm_op op, void *stream)
{
    (void)stream;
    ts_mpi_allreduce_sliced(c, buf, n, type, op);
}

static void mpi_reduce_scatter(const ts_comm *c, const void *send, void *recv, size_t count,
                               ts_comm_dtype type, ts_comm_op op, void *stream)
{
    (void)stream;
    TS_ASSERT(count <= INT_MAX);
    if (c->size <= 1) {
        memmove(recv, send, count * ts_comm_dtype_size(type));
        return;
    }
    ts_mpi_check(MPI_Reduce_scatter_block(send, recv, (int)count, type_of(type), op_of(op, type),
                                          ts_mpi_comm_of(c)),
                 c, "reduce-scatter");
}

static void mpi_allgather(const ts_comm *c, const void *send, void *recv, size_t count,
                          ts_comm_dtype type, void *stream)
{
    (void)stream;
    TS_ASSERT(count <= INT_MAX);
    if (c->size <= 1) {
        memmove(recv, send, count * ts_comm_dtype_size(type));
        return;
    }
    ts_mpi_check(MPI_Allgather(send, (int)count, type_of(type), recv, (int)count, type_of(type),
                               ts_mpi_comm_of(c)),
                 c, "all-gather");
}

static void mpi_broadcast(const ts_comm *c, void *buf, size_t bytes, int root, void *stream)
{
    (void)stream;
    ts_mpi_broadcast_sliced(c, buf, bytes, root);
}

static void mpi_barrier(const ts_comm *c, void *stream)
{
    (void)stream;
    ts_mpi_check(MPI_Barrier(ts_mpi_comm_of(c)), c, "barrier");
}

static void mpi_alltoallv(const ts_comm *c, const void *send, const int *send_counts,
                          const int *send_displs, void *recv, const int *recv_counts,
                          const int *recv_displs, ts_comm_dtype type, void *stream)
{
    (void)stream;
    ts_mpi_check(MPI_Alltoallv(send, send_counts, send_displs, type_of(type), recv, recv_counts,
                               recv_displs, type_of(type), ts_mpi_comm_of(c)),
                 c, "all-to-all");
}

static void mpi_ialltoallv(const ts_comm *c, const void *send, const int *send_counts,
                           const int *send_displs, void *recv, const int *recv_counts,
                           const int *recv_displs, ts_comm_dtype type, void *stream,
                           ts_request *r)
{
    (void)stream;
    MPI_Request q;
    ts_mpi_check(MPI_Ialltoallv(send, send_counts, send_displs, type_of(type), recv, recv_counts,
                                recv_displs, type_of(type), ts_mpi_comm_of(c), &q),
                 c, "non-blocking all-to-all");
    set_request(r, q);
}

static void mpi_iallreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                           ts_comm_op op, void *stream, ts_request *r)
{
    (void)stream;
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    ts_mpi_check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, type_of(type), op_of(op, type),
                                ts_mpi_comm_of(c), &q),
                 c, "non-blocking all-reduce");
    set_request(r, q);
}

static void mpi_ireduce_scatter(const ts_comm *c, void *buf, const int *counts,
                                ts_comm_dtype type, ts_comm_op op, void *stream, ts_request *r)
{
    (void)stream;
    MPI_Request q;
    ts_mpi_check(MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, type_of(type), op_of(op, type),
                                     ts_mpi_comm_of(c), &q),
                 c, "non-blocking reduce-scatter");
    set_request(r, q);
}

static void mpi_iallgather(const ts_comm *c, void *buf, const int *counts, const int *displs,
                           ts_comm_dtype type, void *stream, ts_request *r)
{
    (void)stream;
    MPI_Request q;
    ts_mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs,
                                 type_of(type), ts_mpi_comm_of(c), &q),
                 c, "non-blocking all-gather");
    set_request(r, q);
}

static void mpi_isend(const ts_comm *c, const void *buf, size_t n, ts_comm_dtype type, int peer,
                      int tag, void *stream, ts_request *r)
{
    (void)stream;
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    ts_mpi_check(MPI_Isend(buf, (int)n, type_of(type), peer, tag, ts_mpi_comm_of(c), &q), c,
                 "send");
    set_request(r, q);
}

static void mpi_irecv(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, int peer,
                      int tag, void *stream, ts_request *r)
{
    (void)stream;
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    ts_mpi_check(MPI_Irecv(buf, (int)n, type_of(type), peer, tag, ts_mpi_comm_of(c), &q), c,
                 "receive");
    set_request(r, q);
}

static int mpi_test(ts_request *r)
{
    int done = 0;
    MPI_Request q = request_of(r);
    ts_mpi_check(MPI_Test(&q, &done, MPI_STATUS_IGNORE), NULL, "progress");
    set_request(r, q);
    return done;
}

static void mpi_wait(ts_request *r)
{
    MPI_Request q = request_of(r);
    ts_mpi_check(MPI_Wait(&q, MPI_STATUS_IGNORE), NULL, "wait");
    set_request(r, q);
}

/* isend and irecv never block, so matched pairs need no grouping. */
static void mpi_group(const ts_comm *c, void *stream)
{
    (void)c;
    (void)stream;
}

const ts_comm_backend ts_comm_mpi = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .alltoallv = mpi_alltoallv,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .ialltoallv = mpi_ialltoallv,
    .iallreduce = mpi_iallreduce,
    .ireduce_scatter = mpi_ireduce_scatter,
    .iallgather = mpi_iallgather,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .wait = mpi_wait,
    .group_begin = mpi_group,
    .group_end = mpi_group,
};
