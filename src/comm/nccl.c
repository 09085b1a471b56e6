/* The NCCL backend (ts_comm_nccl, comm.h): the data plane for CUDA device buffers,
 * compiled only where CMake found NCCL (TS_HAVE_NCCL).
 *
 * Communicators. ts_comm_set_backend makes a group's NCCL communicator with
 * ncclCommInitRank: rank 0 of the group makes the unique id and the control plane
 * (MPI) broadcasts it over the group. A group split or duplicated from an NCCL group
 * takes ncclCommSplit of its parent's communicator when it has all of the parent's
 * ranks (a duplicate, a reordering); any other split initialises its own, by unique
 * id over its own members, because the control plane calls attach on members only
 * and ncclCommSplit needs every rank of the parent. Before any NCCL call the members
 * gather (host, GPU PCI bus id) over MPI: NCCL refuses one GPU twice in a communicator
 * (and may hang on it), so that is an error naming the ranks and the GPU, on every
 * rank, with no NCCL call made.
 *
 * Streams. Each group has its own comm stream (c->backend_comm holds it with the
 * communicator); the caller's stream is c->stream, NULL meaning the CUDA backend's
 * compute stream. Every operation first makes the comm stream wait for what the
 * caller's stream has queued (an event), so it reads finished data and overwrites
 * nothing still being read. A blocking operation then makes the caller's stream wait
 * for the comm stream: it returns at once, and later work on the caller's stream
 * (kernels, the copies that read results back) runs after it; no host wait. A
 * non-blocking one records an event on the comm stream, which test polls
 * (cudaEventQuery) and wait polls until done, checking NCCL's asynchronous error each
 * time (a peer that died surfaces as an error, not a hang); on completion the caller's
 * stream waits for it too. So a request's buffer may be reused once it completed.
 * The watchdog marks and busy_ms of comm.c therefore time enqueueing for blocking
 * operations, and the real transfer for waits.
 *
 * Point-to-point. NCCL matches sends and receives by order (tags are ignored) and a
 * send completes only when the peer receives, so transfers that must progress together
 * go in one ts_comm_group_begin/end (ncclGroupStart/End): inside it NCCL queues nothing
 * until the outermost end, so a request started there gets its completion event then.
 * Zero-length transfers make no NCCL call on either side (both know the count).
 *
 * Uneven pieces (ZeRO-1's buckets). NCCL's reduce-scatter and all-gather take equal
 * counts. Equal pieces at their natural offsets use them directly; otherwise the
 * reduce-scatter is one ncclReduce per piece (root: the piece's owner) and the
 * all-gather one ncclBroadcast per piece (root: its owner, in place), each set in one
 * NCCL group so they run together. That moves the same bytes as the padded equal-count
 * form without a padded copy of the input. A reduce-scatter result lands in a scratch
 * buffer of the group and is copied to the start of the caller's buffer on the comm
 * stream (unless this rank's piece already starts there, then it is reduced in place).
 *
 * Failures of NCCL or CUDA calls after setup end the process with the rank, the
 * group, the call and NCCL's own explanation (the launcher then ends the job): there
 * is no recovering from a broken collective mid-step, as on MPI. */
#define _GNU_SOURCE /* sched_yield */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm/comm.h"
#include "comm/internal.h"
#include "core/error.h"
#include "kernels/cuda/device.h"

/* A group's NCCL state: c->backend_comm. */
typedef struct {
    ncclComm_t comm;
    int device;          /* the CUDA device the communicator lives on */
    int world_rank;      /* this rank, for messages */
    const char *name;    /* the group's name, for messages */
    cudaStream_t stream; /* the comm stream: every NCCL call of the group */
    cudaEvent_t ready;   /* the caller's stream, before each operation */
    cudaEvent_t done;    /* the comm stream, after a blocking operation */
    void *scratch;       /* reduce-scatter results and the barrier's word (device) */
    size_t scratch_bytes;
    int depth;           /* ts_comm_group_begin nesting */
    ts_request **pending; /* requests started inside the open group: events at its end */
    size_t n_pending, cap_pending;
} nccl_group;

/* A non-blocking operation: r->handle.ptr from start to completion. */
typedef struct {
    nccl_group *g;
    cudaEvent_t done;    /* recorded on the comm stream after the operation */
    bool recorded;       /* false until the group it was started in has ended */
    cudaStream_t caller; /* waits for `done` on completion */
} nccl_req;

/* ----------------------------------------------------------- failures -- */

TS_NORETURN static void die(const nccl_group *g, const char *what, const char *why)
{
    fprintf(stderr, "tessera: rank %d: %s on the %s group (nccl backend) failed: %s\n",
            g ? g->world_rank : -1, what, g && g->name ? g->name : "?", why ? why : "?");
    fflush(stderr);
    abort();
}

static void check_nccl(const nccl_group *g, ncclResult_t r, const char *what)
{
    if (r == ncclSuccess) return;
    char why[512];
    const char *last = g && g->comm ? ncclGetLastError(g->comm) : NULL;
    snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "",
             last && *last ? last : "");
    die(g, what, why);
}

static void check_cuda(const nccl_group *g, cudaError_t e, const char *what)
{
    if (e != cudaSuccess) die(g, what, cudaGetErrorString(e));
}

/* An error NCCL found on its own (a peer gone, a network fault) while we wait. */
static void check_async(const nccl_group *g)
{
    ncclResult_t async = ncclSuccess;
    check_nccl(g, ncclCommGetAsyncError(g->comm, &async), "asynchronous error query");
    if (async != ncclSuccess && async != ncclInProgress)
        check_nccl(g, async, "a communication in flight");
}

/* ------------------------------------------------------------ helpers -- */

static nccl_group *group_of(const ts_comm *c)
{
    TS_ASSERT(c->backend_comm); /* attach made it */
    return c->backend_comm;
}

/* CUDA's current device is per thread: a communication thread (the data-parallel
 * reduction's) starts on device 0, so every entry point moves to the group's. */
static void on_device(const nccl_group *g)
{
    int d = -1;
    check_cuda(g, cudaGetDevice(&d), "cudaGetDevice");
    if (d != g->device) check_cuda(g, cudaSetDevice(g->device), "cudaSetDevice");
}

static cudaStream_t caller_stream(void *stream)
{
    return stream ? (cudaStream_t)stream : (cudaStream_t)ts_cuda_compute_stream();
}

static ncclDataType_t type_of(ts_comm_dtype t)
{
    switch (t) {
    case TS_COMM_F32: return ncclFloat32;
    case TS_COMM_F64: return ncclFloat64;
    case TS_COMM_I32: return ncclInt32;
    case TS_COMM_U64: return ncclUint64;
    case TS_COMM_BF16: return ncclBfloat16;
    }
    TS_ASSERT(!"a ts_comm_dtype");
    return ncclFloat32;
}

static ncclRedOp_t op_of(ts_comm_op op)
{
    switch (op) {
    case TS_COMM_SUM: return ncclSum;
    case TS_COMM_MIN: return ncclMin;
    case TS_COMM_MAX: return ncclMax;
    }
    TS_ASSERT(!"a ts_comm_op");
    return ncclSum;
}

/* The comm stream waits for everything queued so far on the caller's stream. */
static void after_caller(nccl_group *g, void *stream)
{
    on_device(g);
    check_cuda(g, cudaEventRecord(g->ready, caller_stream(stream)), "cudaEventRecord");
    check_cuda(g, cudaStreamWaitEvent(g->stream, g->ready, 0), "cudaStreamWaitEvent");
}

/* A blocking operation's end: the caller's stream waits for the comm stream. */
static void caller_after(nccl_group *g, void *stream)
{
    check_cuda(g, cudaEventRecord(g->done, g->stream), "cudaEventRecord");
    check_cuda(g, cudaStreamWaitEvent(caller_stream(stream), g->done, 0), "cudaStreamWaitEvent");
}

/* Poll `e` until it completes, with NCCL's asynchronous errors checked meanwhile. */
static void host_wait(const nccl_group *g, cudaEvent_t e)
{
    for (;;) {
        cudaError_t q = cudaEventQuery(e);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) check_cuda(g, q, "cudaEventQuery");
        check_async(g);
        sched_yield();
    }
}

/* A scratch buffer of at least `bytes` on the device. Growing it is ordered on the
 * comm stream (stream-ordered free and allocation), whose queued operations may still
 * use the old one: cudaFree would synchronise the whole device, and with another
 * group's NCCL kernel waiting for a peer that waits for this rank's host, that is a
 * deadlock. Collectives are never started inside a point-to-point group, so nothing
 * queued later uses the old buffer either. */
static void *scratch(nccl_group *g, size_t bytes)
{
    if (bytes <= g->scratch_bytes) return g->scratch;
    if (g->scratch) check_cuda(g, cudaFreeAsync(g->scratch, g->stream), "cudaFreeAsync");
    g->scratch = NULL;
    g->scratch_bytes = 0;
    check_cuda(g, cudaMallocAsync(&g->scratch, bytes, g->stream),
               "cudaMallocAsync (the group's scratch)");
    g->scratch_bytes = bytes;
    return g->scratch;
}

/* r's completion event, recorded now or (inside a group) when the group ends. */
static void start_request(nccl_group *g, void *stream, ts_request *r)
{
    nccl_req *q = ts_calloc(1, sizeof *q);
    q->g = g;
    q->caller = caller_stream(stream);
    check_cuda(g, cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming), "cudaEventCreate");
    memset(&r->handle, 0, sizeof r->handle);
    r->handle.ptr = q;
    if (g->depth > 0) {
        g->pending = ts_grow(g->pending, &g->cap_pending, g->n_pending, sizeof *g->pending);
        g->pending[g->n_pending++] = r;
        return;
    }
    check_cuda(g, cudaEventRecord(q->done, g->stream), "cudaEventRecord");
    q->recorded = true;
}

/* r completed: the caller's stream waits for it, its event is released. */
static void finish_request(ts_request *r)
{
    nccl_req *q = r->handle.ptr;
    check_cuda(q->g, cudaStreamWaitEvent(q->caller, q->done, 0), "cudaStreamWaitEvent");
    check_cuda(q->g, cudaEventDestroy(q->done), "cudaEventDestroy");
    free(q);
    r->handle.ptr = NULL;
}

/* ---------------------------------------------------- the communicator -- */

/* What each member tells the others before NCCL is called. */
typedef struct {
    int world_rank, device;
    char busid[TS_PCI_BUSID_MAX];
    char gpu[64];
    char host[256];
} member_gpu;

/* NCCL takes one GPU once per communicator: two members on the same GPU of the same
 * host are an error, found from the gathered records so every rank returns the same
 * one (and none calls NCCL). */
static ts_status check_distinct_gpus(const ts_comm *c, const nccl_group *g)
{
    member_gpu mine;
    memset(&mine, 0, sizeof mine);
    mine.world_rank = g->world_rank;
    mine.device = g->device;
    if (!ts_cuda_device_pci(g->device, mine.busid))
        snprintf(mine.busid, sizeof mine.busid, "device %d", g->device);
    ts_cuda_device_name(g->device, mine.gpu, sizeof mine.gpu);
    ts_comm_host_name(mine.host, sizeof mine.host);
    member_gpu *all = ts_malloc((size_t)c->size * sizeof *all);
    ts_allgather_bytes(c, &mine, sizeof mine, all);

    ts_status st = TS_OK;
    for (int i = 0; i < c->size && st == TS_OK; i++) {
        char ranks[256];
        int n = 0, len = snprintf(ranks, sizeof ranks, "%d", all[i].world_rank);
        for (int j = i + 1; j < c->size; j++) {
            if (strcmp(all[i].busid, all[j].busid) || strcmp(all[i].host, all[j].host)) continue;
            n++;
            if (len >= 0 && (size_t)len < sizeof ranks)
                len += snprintf(ranks + len, sizeof ranks - (size_t)len, ", %d",
                                all[j].world_rank);
        }
        if (n == 0) continue;
        st = ts_fail("the nccl comm backend needs one GPU per rank, but world ranks %s of the "
                     "%s group all run on GPU %d (PCI %s, %s) of host %s, and NCCL refuses a "
                     "GPU twice in one communicator; use parallel.comm = \"mpi\" (device "
                     "buffers through host-staged MPI), or give each rank its own GPU (at "
                     "most as many ranks per node as it has GPUs)",
                     ranks, c->name, all[i].device, all[i].busid, all[i].gpu, all[i].host);
    }
    free(all);
    return st;
}

/* ncclCommInitRank over c's members: rank 0's unique id through the control plane. */
static ts_status init_rank(const ts_comm *c, nccl_group *g)
{
    struct {
        int ok;
        ncclUniqueId id;
        char why[256];
    } msg;
    memset(&msg, 0, sizeof msg);
    if (c->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&msg.id);
        msg.ok = r == ncclSuccess;
        if (!msg.ok) snprintf(msg.why, sizeof msg.why, "%s", ncclGetErrorString(r));
    }
    ts_host_broadcast(c, &msg, sizeof msg, 0);
    if (!msg.ok)
        return ts_fail("the nccl comm backend: ncclGetUniqueId for the %s group failed on its "
                       "rank 0: %s",
                       c->name, msg.why);
    ncclResult_t r = ncclCommInitRank(&g->comm, c->size, msg.id, c->rank);
    if (r != ncclSuccess)
        return ts_fail("the nccl comm backend: ncclCommInitRank for the %s group (%d ranks) "
                       "failed on world rank %d (GPU %d): %s; NCCL_DEBUG=WARN says more",
                       c->name, c->size, g->world_rank, g->device, ncclGetErrorString(r));
    return TS_OK;
}

static void release(nccl_group *g)
{
    if (g->comm) check_nccl(g, ncclCommDestroy(g->comm), "ncclCommDestroy");
    if (g->scratch) check_cuda(g, cudaFreeAsync(g->scratch, g->stream), "cudaFreeAsync");
    if (g->ready) check_cuda(g, cudaEventDestroy(g->ready), "cudaEventDestroy");
    if (g->done) check_cuda(g, cudaEventDestroy(g->done), "cudaEventDestroy");
    if (g->stream) check_cuda(g, cudaStreamDestroy(g->stream), "cudaStreamDestroy");
    free(g->pending);
    free(g);
}

static ts_status nccl_attach(ts_comm *c, const ts_comm *parent)
{
    nccl_group *g = ts_calloc(1, sizeof *g);
    g->name = c->name;
    int *world = ts_malloc((size_t)c->size * sizeof(int));
    ts_comm_world_ranks(c, world);
    g->world_rank = world[c->rank];
    free(world);
    g->device = ts_cuda_current_device();
    ts_status st = g->device >= 0 ? TS_OK
                                  : ts_fail("the nccl comm backend: world rank %d has no CUDA "
                                            "device (select one before moving the %s group "
                                            "to nccl)",
                                            g->world_rank, c->name);
    /* Every rank's verdict before anything collective can hang on a missing one. */
    if (ts_comm_agree(c, st) != TS_OK) {
        free(g);
        return TS_ERR;
    }
    int lo = 0, hi = 0; /* communication first: the highest priority the device has */
    check_cuda(g, cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    check_cuda(g, cudaStreamCreateWithPriority(&g->stream, cudaStreamNonBlocking, hi),
               "cudaStreamCreateWithPriority");
    check_cuda(g, cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(g, cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming), "cudaEventCreate");
    scratch(g, 256);

    const nccl_group *pg = parent != c && parent->ops == &ts_comm_nccl ? parent->backend_comm : NULL;
    if (pg && c->size == parent->size) {
        /* Every rank of the parent is here (sizes agree on all of them), so all call it. */
        check_nccl(g, ncclCommSplit(pg->comm, 0, c->rank, &g->comm, NULL), "ncclCommSplit");
    } else {
        st = check_distinct_gpus(c, g);
        if (st == TS_OK) st = init_rank(c, g);
    }
    if (st != TS_OK) {
        release(g);
        return TS_ERR;
    }
    c->backend_comm = g;
    return TS_OK;
}

static void nccl_detach(ts_comm *c)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0 && g->n_pending == 0);
    on_device(g);
    check_cuda(g, cudaStreamSynchronize(g->stream), "cudaStreamSynchronize");
    release(g);
    c->backend_comm = NULL;
}

/* ------------------------------------------------------------ blocking -- */

static void nccl_allreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                           ts_comm_op op, void *stream)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    if (n == 0) return;
    after_caller(g, stream);
    check_nccl(g, ncclAllReduce(buf, buf, n, type_of(type), op_of(op), g->comm, g->stream),
               "all-reduce");
    caller_after(g, stream);
}

static void nccl_reduce_scatter(const ts_comm *c, const void *send, void *recv, size_t count,
                                ts_comm_dtype type, ts_comm_op op, void *stream)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    if (count == 0) return;
    after_caller(g, stream);
    check_nccl(g,
               ncclReduceScatter(send, recv, count, type_of(type), op_of(op), g->comm, g->stream),
               "reduce-scatter");
    caller_after(g, stream);
}

static void nccl_allgather(const ts_comm *c, const void *send, void *recv, size_t count,
                           ts_comm_dtype type, void *stream)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    if (count == 0) return;
    after_caller(g, stream);
    check_nccl(g, ncclAllGather(send, recv, count, type_of(type), g->comm, g->stream),
               "all-gather");
    caller_after(g, stream);
}

/* One NCCL group of a send and a receive per peer (NCCL has no all-to-all-v): the
 * pieces move together, so no order of peers can deadlock. */
static void nccl_alltoallv(const ts_comm *c, const void *send, const int *send_counts,
                           const int *send_displs, void *recv, const int *recv_counts,
                           const int *recv_displs, ts_comm_dtype type, void *stream)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    const size_t elem = ts_comm_dtype_size(type);
    after_caller(g, stream);
    check_nccl(g, ncclGroupStart(), "all-to-all (group start)");
    for (int j = 0; j < c->size; j++) {
        if (send_counts[j] > 0)
            check_nccl(g, ncclSend((const char *)send + (size_t)send_displs[j] * elem,
                                   (size_t)send_counts[j], type_of(type), j, g->comm, g->stream),
                       "all-to-all (send)");
        if (recv_counts[j] > 0)
            check_nccl(g, ncclRecv((char *)recv + (size_t)recv_displs[j] * elem,
                                   (size_t)recv_counts[j], type_of(type), j, g->comm, g->stream),
                       "all-to-all (receive)");
    }
    check_nccl(g, ncclGroupEnd(), "all-to-all (group end)");
    caller_after(g, stream);
}

static void nccl_broadcast(const ts_comm *c, void *buf, size_t bytes, int root, void *stream)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    if (bytes == 0) return;
    after_caller(g, stream);
    check_nccl(g, ncclBroadcast(buf, buf, bytes, ncclUint8, root, g->comm, g->stream),
               "broadcast");
    caller_after(g, stream);
}

/* A barrier the host feels: a one-word all-reduce after the caller's queued work, waited
 * for on the host, so every member has reached it (and finished its work) on return. */
static void nccl_barrier(const ts_comm *c, void *stream)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    after_caller(g, stream);
    void *word = scratch(g, sizeof(float));
    check_nccl(g, ncclAllReduce(word, word, 1, ncclFloat32, ncclSum, g->comm, g->stream),
               "barrier");
    check_cuda(g, cudaEventRecord(g->done, g->stream), "cudaEventRecord");
    host_wait(g, g->done);
}

/* -------------------------------------------------------- non-blocking -- */

static void nccl_iallreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                            ts_comm_op op, void *stream, ts_request *r)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    after_caller(g, stream);
    if (n > 0)
        check_nccl(g, ncclAllReduce(buf, buf, n, type_of(type), op_of(op), g->comm, g->stream),
                   "non-blocking all-reduce");
    start_request(g, stream, r);
}

/* In place, uneven: this rank's piece's sum at the start of buf (see the file comment). */
static void nccl_ireduce_scatter(const ts_comm *c, void *buf, const int *counts,
                                 ts_comm_dtype type, ts_comm_op op, void *stream, ts_request *r)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    after_caller(g, stream);
    const size_t elem = ts_comm_dtype_size(type), mine = (size_t)counts[c->rank];
    size_t my_displ = 0;
    bool equal = true;
    for (int k = 0; k < c->size; k++) {
        TS_ASSERT(counts[k] >= 0);
        if (k < c->rank) my_displ += (size_t)counts[k];
        equal = equal && counts[k] == counts[0];
    }
    if (ts_comm_counts_total(c, counts) > 0) {
        /* Reduced in place when this rank's piece starts at buf already. */
        void *dst = my_displ == 0 ? buf : scratch(g, mine * elem);
        if (equal) {
            check_nccl(g,
                       ncclReduceScatter(buf, dst, mine, type_of(type), op_of(op), g->comm,
                                         g->stream),
                       "non-blocking reduce-scatter");
        } else {
            check_nccl(g, ncclGroupStart(), "non-blocking reduce-scatter (group start)");
            size_t at = 0;
            for (int k = 0; k < c->size; at += (size_t)counts[k], k++) {
                if (counts[k] == 0) continue;
                char *piece = (char *)buf + at * elem;
                check_nccl(g,
                           ncclReduce(piece, k == c->rank ? dst : piece, (size_t)counts[k],
                                      type_of(type), op_of(op), k, g->comm, g->stream),
                           "non-blocking reduce-scatter (reduce of a piece)");
            }
            check_nccl(g, ncclGroupEnd(), "non-blocking reduce-scatter (group end)");
        }
        if (dst != buf && mine > 0)
            check_cuda(g,
                       cudaMemcpyAsync(buf, dst, mine * elem, cudaMemcpyDeviceToDevice,
                                       g->stream),
                       "cudaMemcpyAsync (the reduced piece to the buffer's start)");
    }
    start_request(g, stream, r);
}

/* In place, uneven: piece k = buf[displs[k] .. + counts[k]) from rank k to every rank. */
static void nccl_iallgather(const ts_comm *c, void *buf, const int *counts, const int *displs,
                            ts_comm_dtype type, void *stream, ts_request *r)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    after_caller(g, stream);
    const size_t elem = ts_comm_dtype_size(type);
    bool regular = true; /* equal pieces, each at rank * count */
    for (int k = 0; k < c->size; k++) {
        TS_ASSERT(counts[k] >= 0 && displs[k] >= 0);
        regular = regular && counts[k] == counts[0] && (size_t)displs[k] == (size_t)k * (size_t)counts[0];
    }
    if (ts_comm_counts_total(c, counts) > 0) {
        if (regular) {
            const size_t n = (size_t)counts[0];
            check_nccl(g,
                       ncclAllGather((char *)buf + (size_t)c->rank * n * elem, buf, n,
                                     type_of(type), g->comm, g->stream),
                       "non-blocking all-gather");
        } else {
            check_nccl(g, ncclGroupStart(), "non-blocking all-gather (group start)");
            for (int k = 0; k < c->size; k++) {
                if (counts[k] == 0) continue;
                char *piece = (char *)buf + (size_t)displs[k] * elem;
                check_nccl(g,
                           ncclBroadcast(piece, piece, (size_t)counts[k], type_of(type), k,
                                         g->comm, g->stream),
                           "non-blocking all-gather (broadcast of a piece)");
            }
            check_nccl(g, ncclGroupEnd(), "non-blocking all-gather (group end)");
        }
    }
    start_request(g, stream, r);
}

/* The blocking all-to-all's group of a send and a receive per peer, completed by an
 * event on the comm stream as the other non-blocking operations are. */
static void nccl_ialltoallv(const ts_comm *c, const void *send, const int *send_counts,
                            const int *send_displs, void *recv, const int *recv_counts,
                            const int *recv_displs, ts_comm_dtype type, void *stream,
                            ts_request *r)
{
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth == 0);
    const size_t elem = ts_comm_dtype_size(type);
    after_caller(g, stream);
    check_nccl(g, ncclGroupStart(), "non-blocking all-to-all (group start)");
    for (int j = 0; j < c->size; j++) {
        if (send_counts[j] > 0)
            check_nccl(g, ncclSend((const char *)send + (size_t)send_displs[j] * elem,
                                   (size_t)send_counts[j], type_of(type), j, g->comm, g->stream),
                       "non-blocking all-to-all (send)");
        if (recv_counts[j] > 0)
            check_nccl(g, ncclRecv((char *)recv + (size_t)recv_displs[j] * elem,
                                   (size_t)recv_counts[j], type_of(type), j, g->comm, g->stream),
                       "non-blocking all-to-all (receive)");
    }
    check_nccl(g, ncclGroupEnd(), "non-blocking all-to-all (group end)");
    start_request(g, stream, r);
}

static void nccl_isend(const ts_comm *c, const void *buf, size_t n, ts_comm_dtype type, int peer,
                       int tag, void *stream, ts_request *r)
{
    (void)tag; /* matched by order */
    nccl_group *g = group_of(c);
    after_caller(g, stream);
    if (n > 0) check_nccl(g, ncclSend(buf, n, type_of(type), peer, g->comm, g->stream), "send");
    start_request(g, stream, r);
}

static void nccl_irecv(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, int peer,
                       int tag, void *stream, ts_request *r)
{
    (void)tag;
    nccl_group *g = group_of(c);
    after_caller(g, stream); /* the caller may still be reading the old contents */
    if (n > 0) check_nccl(g, ncclRecv(buf, n, type_of(type), peer, g->comm, g->stream), "receive");
    start_request(g, stream, r);
}

static int nccl_test(ts_request *r)
{
    nccl_req *q = r->handle.ptr;
    TS_ASSERT(q && q->recorded); /* a request of an open group is tested after its end */
    on_device(q->g);
    cudaError_t e = cudaEventQuery(q->done);
    if (e == cudaErrorNotReady) {
        check_async(q->g);
        return 0;
    }
    check_cuda(q->g, e, "cudaEventQuery");
    finish_request(r);
    return 1;
}

static void nccl_wait(ts_request *r)
{
    nccl_req *q = r->handle.ptr;
    TS_ASSERT(q && q->recorded);
    on_device(q->g);
    host_wait(q->g, q->done);
    finish_request(r);
}

static void nccl_group_begin(const ts_comm *c, void *stream)
{
    (void)stream;
    nccl_group *g = group_of(c);
    on_device(g);
    check_nccl(g, ncclGroupStart(), "point-to-point group start");
    g->depth++;
}

/* The outermost end queues the group's transfers: their completion events follow. */
static void nccl_group_end(const ts_comm *c, void *stream)
{
    (void)stream;
    nccl_group *g = group_of(c);
    TS_ASSERT(g->depth > 0);
    on_device(g);
    check_nccl(g, ncclGroupEnd(), "point-to-point group end");
    if (--g->depth > 0) return;
    for (size_t i = 0; i < g->n_pending; i++) {
        nccl_req *q = g->pending[i]->handle.ptr;
        check_cuda(g, cudaEventRecord(q->done, g->stream), "cudaEventRecord");
        q->recorded = true;
    }
    g->n_pending = 0;
}

const ts_comm_backend ts_comm_nccl = {
    .name = "nccl",
    .attach = nccl_attach,
    .detach = nccl_detach,
    .allreduce = nccl_allreduce,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
    .alltoallv = nccl_alltoallv,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .ialltoallv = nccl_ialltoallv,
    .iallreduce = nccl_iallreduce,
    .ireduce_scatter = nccl_ireduce_scatter,
    .iallgather = nccl_iallgather,
    .isend = nccl_isend,
    .irecv = nccl_irecv,
    .test = nccl_test,
    .wait = nccl_wait,
    .group_begin = nccl_group_begin,
    .group_end = nccl_group_end,
};
