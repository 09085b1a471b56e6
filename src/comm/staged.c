/* The staged MPI backend (ts_comm_mpi_staged, comm.h): the data plane for device memory
 * MPI may not touch, through host bounce buffers around the MPI backend's operations.
 *
 * MPI never sees a device buffer, not even between the start and the completion of a
 * non-blocking operation: Open MPI's shared-memory transport may read a peer's user
 * buffer directly (CMA) at any moment of that window, and the strict test backend keeps
 * device memory inaccessible outside its own calls. So every copy runs on the calling
 * thread at a moment this file chooses: a blocking operation copies in, runs and copies
 * out before it returns; a non-blocking one copies in when it starts and copies out when
 * a test first sees it complete or a wait returns (comm.c calls neither again for a
 * completed request). The copies are the compute backend's, registered once per process
 * (ts_comm_staged_set_copies); this file names no compute backend. */
#include <stdlib.h>

#include "comm/comm.h"
#include "comm/internal.h"
#include "core/error.h"

typedef void (*copy_fn)(void *dst, const void *src, size_t bytes);

/* Set once before any group uses the backend, then only read (by every thread that
 * communicates, the grad-sync thread too). */
static copy_fn g_d2h, g_h2d;

void ts_comm_staged_set_copies(copy_fn d2h, copy_fn h2d)
{
    TS_ASSERT(d2h && h2d);
    g_d2h = d2h;
    g_h2d = h2d;
}

/* Without the copies there is no way to reach the device buffers: a programming error
 * (the caller forgot ts_comm_staged_set_copies), named as such. */
static void need_copies(void)
{
    if (!g_d2h || !g_h2d)
        ts_panic(__FILE__, __LINE__,
                 "the mpi-staged comm backend was used before ts_comm_staged_set_copies "
                 "registered the compute backend's copies");
}

/* A host bounce buffer of `bytes`, holding a copy of dev's first `in` bytes (in <= bytes;
 * 0: nothing to read, MPI only writes it). Empty buffers may be NULL on the device, so
 * nothing is copied for them. */
static void *bounce(const void *dev, size_t in, size_t bytes)
{
    need_copies();
    void *host = ts_malloc(bytes);
    if (in) g_d2h(host, dev, in);
    return host;
}

static void copy_back(void *dev, const void *host, size_t bytes)
{
    if (bytes) g_h2d(dev, host, bytes);
}

/* ------------------------------------------------------------ blocking -- */

static void staged_allreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                             ts_comm_op op, void *stream)
{
    const size_t bytes = n * ts_comm_dtype_size(type);
    void *host = bounce(buf, bytes, bytes);
    ts_comm_mpi.allreduce(c, host, n, type, op, stream);
    copy_back(buf, host, bytes);
    free(host);
}

/* On one rank (comm.c calls it for send != recv) the MPI backend's copy runs between the
 * bounce buffers, so the device buffers are still reached only by the copies. */
static void staged_reduce_scatter(const ts_comm *c, const void *send, void *recv, size_t count,
                                  ts_comm_dtype type, ts_comm_op op, void *stream)
{
    const size_t piece = count * ts_comm_dtype_size(type), ranks = c->size > 1 ? (size_t)c->size : 1;
    void *hsend = bounce(send, piece * ranks, piece * ranks), *hrecv = ts_malloc(piece);
    ts_comm_mpi.reduce_scatter(c, hsend, hrecv, count, type, op, stream);
    copy_back(recv, hrecv, piece);
    free(hsend);
    free(hrecv);
}

static void staged_allgather(const ts_comm *c, const void *send, void *recv, size_t count,
                             ts_comm_dtype type, void *stream)
{
    const size_t piece = count * ts_comm_dtype_size(type), ranks = c->size > 1 ? (size_t)c->size : 1;
    void *hsend = bounce(send, piece, piece), *hrecv = ts_malloc(piece * ranks);
    ts_comm_mpi.allgather(c, hsend, hrecv, count, type, stream);
    copy_back(recv, hrecv, piece * ranks);
    free(hsend);
    free(hrecv);
}

/* One past the last element the counts and displacements reach (elements). */
static size_t extent(const ts_comm *c, const int *counts, const int *displs)
{
    size_t end = 0;
    for (int j = 0; j < (c->size > 1 ? c->size : 1); j++)
        if (counts[j] > 0 && (size_t)displs[j] + (size_t)counts[j] > end)
            end = (size_t)displs[j] + (size_t)counts[j];
    return end;
}

/* recv's whole extent is bounced in and back, so the elements between its pieces keep
 * what they held. */
static void staged_alltoallv(const ts_comm *c, const void *send, const int *send_counts,
                             const int *send_displs, void *recv, const int *recv_counts,
                             const int *recv_displs, ts_comm_dtype type, void *stream)
{
    const size_t elem = ts_comm_dtype_size(type);
    const size_t sbytes = extent(c, send_counts, send_displs) * elem;
    const size_t rbytes = extent(c, recv_counts, recv_displs) * elem;
    void *hsend = bounce(send, sbytes, sbytes), *hrecv = bounce(recv, rbytes, rbytes);
    ts_comm_mpi.alltoallv(c, hsend, send_counts, send_displs, hrecv, recv_counts, recv_displs,
                          type, stream);
    copy_back(recv, hrecv, rbytes);
    free(hsend);
    free(hrecv);
}

/* Only the root's buffer is read, and the root's is left as it was. */
static void staged_broadcast(const ts_comm *c, void *buf, size_t bytes, int root, void *stream)
{
    const bool is_root = c->rank == root;
    void *host = bounce(buf, is_root ? bytes : 0, bytes);
    ts_comm_mpi.broadcast(c, host, bytes, root, stream);
    if (!is_root) copy_back(buf, host, bytes);
    free(host);
}

static void staged_barrier(const ts_comm *c, void *stream) { ts_comm_mpi.barrier(c, stream); }

/* -------------------------------------------------------- non-blocking -- */

/* A non-blocking operation's bounce buffer and what goes back where when it completes
 * (r->stage from start to completion). */
typedef struct {
    void *host; /* what MPI works on */
    void *dev;  /* the caller's buffer */
    size_t back; /* bytes copied from the start of host to dev on completion (0: none) */
    void *send;  /* a second bounce buffer MPI reads (the all-to-all's send), or NULL */
} stage;

/* The bounce buffer for r, of `bytes` holding dev's first `in`, recorded in r->stage. */
static void *stage_start(ts_request *r, void *dev, size_t in, size_t bytes, size_t back)
{
    TS_ASSERT(back <= bytes);
    stage *s = ts_malloc(sizeof *s);
    s->host = bounce(dev, in, bytes);
    s->dev = dev;
    s->back = back;
    s->send = NULL;
    r->stage = s;
    return s->host;
}

/* r completed: its result to the device, its bounce buffer released. */
static void stage_finish(ts_request *r)
{
    stage *s = r->stage;
    if (!s) return;
    copy_back(s->dev, s->host, s->back);
    free(s->host);
    free(s->send);
    free(s);
    r->stage = NULL;
}

/* Both extents bounced at the start (recv's too, so the elements between its pieces
 * come back unchanged); recv's copied back on completion, send's bounce freed then. */
static void staged_ialltoallv(const ts_comm *c, const void *send, const int *send_counts,
                              const int *send_displs, void *recv, const int *recv_counts,
                              const int *recv_displs, ts_comm_dtype type, void *stream,
                              ts_request *r)
{
    const size_t elem = ts_comm_dtype_size(type);
    const size_t sbytes = extent(c, send_counts, send_displs) * elem;
    const size_t rbytes = extent(c, recv_counts, recv_displs) * elem;
    void *hrecv = stage_start(r, recv, rbytes, rbytes, rbytes);
    stage *s = r->stage;
    s->send = bounce(send, sbytes, sbytes);
    ts_comm_mpi.ialltoallv(c, s->send, send_counts, send_displs, hrecv, recv_counts,
                           recv_displs, type, stream, r);
}

static void staged_iallreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                              ts_comm_op op, void *stream, ts_request *r)
{
    const size_t bytes = n * ts_comm_dtype_size(type);
    void *host = stage_start(r, buf, bytes, bytes, bytes);
    ts_comm_mpi.iallreduce(c, host, n, type, op, stream, r);
}

/* In place: all of buf is read; on completion this rank's piece is at the start. */
static void staged_ireduce_scatter(const ts_comm *c, void *buf, const int *counts,
                                   ts_comm_dtype type, ts_comm_op op, void *stream,
                                   ts_request *r)
{
    const size_t total = ts_comm_counts_total(c, counts);
    const size_t elem = ts_comm_dtype_size(type), bytes = total * elem;
    void *host = stage_start(r, buf, bytes, bytes, (size_t)counts[c->rank] * elem);
    ts_comm_mpi.ireduce_scatter(c, host, counts, type, op, stream, r);
}

/* In place: the whole extent the pieces cover goes in and comes back (MPI reads only
 * this rank's piece, but what lies between pieces must come back unchanged). */
static void staged_iallgather(const ts_comm *c, void *buf, const int *counts, const int *displs,
                              ts_comm_dtype type, void *stream, ts_request *r)
{
    size_t extent = 0;
    for (int k = 0; k < c->size; k++) {
        size_t end = (size_t)displs[k] + (size_t)counts[k];
        if (counts[k] > 0 && end > extent) extent = end;
    }
    const size_t bytes = extent * ts_comm_dtype_size(type);
    void *host = stage_start(r, buf, bytes, bytes, bytes);
    ts_comm_mpi.iallgather(c, host, counts, displs, type, stream, r);
}

static void staged_isend(const ts_comm *c, const void *buf, size_t n, ts_comm_dtype type,
                         int peer, int tag, void *stream, ts_request *r)
{
    const size_t bytes = n * ts_comm_dtype_size(type);
    /* Nothing comes back to a send's buffer, so dev is never written through. */
    void *host = stage_start(r, (void *)buf, bytes, bytes, 0);
    ts_comm_mpi.isend(c, host, n, type, peer, tag, stream, r);
}

static void staged_irecv(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, int peer,
                         int tag, void *stream, ts_request *r)
{
    const size_t bytes = n * ts_comm_dtype_size(type);
    void *host = stage_start(r, buf, 0, bytes, bytes);
    ts_comm_mpi.irecv(c, host, n, type, peer, tag, stream, r);
}

static int staged_test(ts_request *r)
{
    if (!ts_comm_mpi.test(r)) return 0;
    stage_finish(r);
    return 1;
}

static void staged_wait(ts_request *r)
{
    ts_comm_mpi.wait(r);
    stage_finish(r);
}

static void staged_group_begin(const ts_comm *c, void *stream)
{
    ts_comm_mpi.group_begin(c, stream);
}

static void staged_group_end(const ts_comm *c, void *stream) { ts_comm_mpi.group_end(c, stream); }

const ts_comm_backend ts_comm_mpi_staged = {
    .name = "mpi-staged",
    .allreduce = staged_allreduce,
    .reduce_scatter = staged_reduce_scatter,
    .allgather = staged_allgather,
    .alltoallv = staged_alltoallv,
    .broadcast = staged_broadcast,
    .barrier = staged_barrier,
    .ialltoallv = staged_ialltoallv,
    .iallreduce = staged_iallreduce,
    .ireduce_scatter = staged_ireduce_scatter,
    .iallgather = staged_iallgather,
    .isend = staged_isend,
    .irecv = staged_irecv,
    .test = staged_test,
    .wait = staged_wait,
    .group_begin = staged_group_begin,
    .group_end = staged_group_end,
};
