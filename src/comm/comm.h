/* One interface for the collectives and point-to-point transfers the framework needs.
 * Model, tensor-parallel, pipeline and optimizer code call only this; nothing outside
 * src/comm names a backend.
 *
 * Two planes, told apart by whose memory they move:
 * - The CONTROL PLANE is always MPI, on host memory: starting and stopping the process
 *   (ts_comm_init ...), making and freeing groups (ts_comm_split/dup/split_node/free),
 *   rank bookkeeping (ts_comm_world_ranks, ts_comm_tag_max), agreement
 *   (ts_comm_agree), the gathers of host records (ts_allgather_bytes,
 *   ts_gather_bytes, ts_gatherv), the all-to-all of host counts (ts_host_alltoall_i32)
 *   and the reductions and broadcast of host scalars and
 *   records (ts_host_allreduce_*, ts_host_broadcast: metrics, codes, hashes, flags,
 *   paths). comm/control.c implements it directly, and also attaches each group's
 *   data-plane backend (ts_comm_set_backend).
 * - The DATA PLANE goes through the group's backend table (ts_comm_backend, c->ops) and
 *   carries only the backend's memory, which is device memory on a GPU (dev_alloc of
 *   the compute backend, kernels/kernels.h): the f32 all-reduces, reduce-scatter,
 *   all-gather, the variable all-to-all, ts_broadcast_dev and barrier, their
 *   non-blocking forms, point-to-point sends and receives, request test and wait, and
 *   point-to-point groups
 *   (ts_comm_group_begin/end). comm/comm.c holds what every backend shares (the
 *   watchdog marks, busy_ms and on_span, the one-rank shortcuts) and makes one
 *   indirect call per operation; comm/mpi.c fills the table for memory MPI may touch
 *   (ts_comm_mpi: host memory, or device memory under a CUDA-aware MPI), comm/staged.c
 *   for device memory it may not (ts_comm_mpi_staged: host bounce buffers), an NCCL
 *   backend for device buffers ordered on the group's stream.
 *   Never pass a host variable to the data plane (on NCCL it would be a bad device
 *   pointer), nor a device buffer to the control plane (MPI would read it as host
 *   memory).
 *
 * Every call is checked: a failing transfer aborts the job with the rank and cause
 * (there is no recovering from a broken collective mid-step). Every blocking call and
 * wait is marked for the watchdog (core/watchdog.h), so one that never returns ends
 * the job after train.timeout_s with a message naming it. */
#ifndef TS_COMM_H
#define TS_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "kernels/kernels.h" /* ts_dtype: activations move in their element type */

/* A backend's handle held by value without the backend's types: the MPI backend keeps
 * an MPI_Comm or an MPI_Request here (comm/mpi_internal.h and comm/mpi.c check at
 * compile time that they fit), so this header, and everything that includes it, needs
 * no <mpi.h>. */
typedef union {
    void *ptr;
    int64_t i64;
} ts_comm_handle;

/* Told, when set on a group, the span of each of its collectives: a blocking one when
 * it returns, a non-blocking one when a test or wait first sees it complete. `what` is
 * short ("all-reduce", "reduce-scatter", ...), bytes is this rank's buffer, times are
 * ts_now_ms() (core/timer.h). The trainer draws the dp group's on the trace. */
typedef void (*ts_comm_span_fn)(void *ctx, const char *what, size_t bytes, double start_ms,
                                double end_ms);

typedef struct ts_comm_s ts_comm;
typedef struct ts_comm_backend ts_comm_backend;

typedef struct ts_comm_s {
    ts_comm_handle handle; /* the control plane's (MPI) communicator; unused when size == 0 */
    int rank, size;        /* size 0: this rank is not in the group */
    const char *name;      /* "tp", "dp", "pp", "embed", "node", "world": for messages */
    bool owned;            /* made by ts_comm_split*: ts_comm_free releases it */
    double *busy_ms;       /* when set, blocking collectives add their time here */
    ts_comm_span_fn on_span; /* when set, see ts_comm_span_fn */
    void *on_span_ctx;
    /* The data plane: the backend's table (ts_comm_mpi unless ts_comm_set_backend
     * changed it; groups split or duplicated from this one get the same), the
     * backend's own state when it needs one (NCCL: the communicator and the group's
     * comm stream; NULL for MPI, which uses `handle`), and the stream every data-plane
     * call on this group is ordered with: the caller's stream, whose queued work a
     * transfer waits for and which waits for the transfer (a CUDA stream for NCCL, NULL
     * meaning the CUDA backend's compute stream; NULL on the CPU, where MPI ignores it).
     * Set the stream directly; split and dup copy it. */
    const ts_comm_backend *ops;
    void *backend_comm;
    void *stream;
} ts_comm;

/* A pending non-blocking operation (what, comm and peer name it in watchdog messages). */
typedef struct {
    ts_comm_handle handle;    /* the backend's request (MPI_Request; an event for NCCL) */
    const ts_comm_backend *ops; /* the backend that started it: tests and waits it */
    int active;
    int peer;                 /* rank in the group, -1 for a collective */
    const char *what, *comm;  /* "receive", "send", "non-blocking all-reduce"; group name */
    /* A collective's span, for the group's on_span when it completes. */
    ts_comm_span_fn on_span;
    void *on_span_ctx;
    const char *op;
    size_t bytes;
    double start_ms;
    void *stage; /* the staged backend's bounce buffer and copy-back record, NULL otherwise */
} ts_request;

/* ------------------------------------------------------- the data plane -- */

/* Element types and reductions of a backend's table. The public data plane moves f32
 * (gradients, parameters) and activations in their dtype (fp32 or bf16: a bf16 sum adds
 * pairs in fp32 and rounds, as NCCL's does). f64, i32 and u64 host values go through
 * the control plane (ts_host_allreduce_*), not through here. */
typedef enum { TS_COMM_F32, TS_COMM_F64, TS_COMM_I32, TS_COMM_U64, TS_COMM_BF16 } ts_comm_dtype;
typedef enum { TS_COMM_SUM, TS_COMM_MIN, TS_COMM_MAX } ts_comm_op;

/* A data-plane backend. comm.c calls the collectives only on groups of two or more
 * ranks (on one rank they return at once), except reduce_scatter and allgather, which
 * it also calls on one rank when send and recv differ (a copy, for the backend since
 * the buffers are its memory). comm.c marks the watchdog, times busy_ms and on_span and
 * fills every field of a ts_request but its handle (and stage, which it starts NULL for
 * a backend that stages to set); the backend only transfers and checks (aborting with
 * the rank and cause on failure). `stream` is c->stream. Counts are elements;
 * buffers are the backend's memory (what MPI may touch for ts_comm_mpi, device memory
 * for the staged backend and NCCL). */
struct ts_comm_backend {
    const char *name; /* "mpi", "mpi-staged", "nccl" */
    /* Optional (NULL: nothing to do). attach runs after the control plane made `c`
     * (split, dup, or ts_comm_set_backend, where parent == c; c->ops is this table),
     * collectively over c's members, and may make the backend's own communicator in
     * c->backend_comm. It returns the same status on every member (a failure recorded
     * with ts_fail, nothing left to detach), never hanging one member on another's
     * failure. detach releases c->backend_comm (called when it is set) before
     * ts_comm_free releases the group or ts_comm_set_backend moves it. */
    ts_status (*attach)(ts_comm *c, const ts_comm *parent);
    void (*detach)(ts_comm *c);

    /* In place, over the group. */
    void (*allreduce)(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, ts_comm_op op,
                      void *stream);
    /* recv[count] = op over ranks of send[rank*count ..][count]; with size <= 1: a copy. */
    void (*reduce_scatter)(const ts_comm *c, const void *send, void *recv, size_t count,
                           ts_comm_dtype type, ts_comm_op op, void *stream);
    /* recv[size*count] = every rank's send[count] in rank order; size <= 1: a copy. */
    void (*allgather)(const ts_comm *c, const void *send, void *recv, size_t count,
                      ts_comm_dtype type, void *stream);
    void (*broadcast)(const ts_comm *c, void *buf, size_t bytes, int root, void *stream);
    void (*barrier)(const ts_comm *c, void *stream);
    /* The variable all-to-all (an expert layer's dispatch and combine): to each member j
     * send_counts[j] elements from send + send_displs[j]; from each member j
     * recv_counts[j] elements into recv + recv_displs[j] (counts and displacements in
     * elements, host arrays of c->size; a member's counts to j equal j's counts from
     * it). send and recv do not overlap. */
    void (*alltoallv)(const ts_comm *c, const void *send, const int *send_counts,
                      const int *send_displs, void *recv, const int *recv_counts,
                      const int *recv_displs, ts_comm_dtype type, void *stream);

    /* Non-blocking, with the semantics of the public calls below. */
    void (*ialltoallv)(const ts_comm *c, const void *send, const int *send_counts,
                       const int *send_displs, void *recv, const int *recv_counts,
                       const int *recv_displs, ts_comm_dtype type, void *stream,
                       ts_request *r);
    void (*iallreduce)(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, ts_comm_op op,
                       void *stream, ts_request *r);
    void (*ireduce_scatter)(const ts_comm *c, void *buf, const int *counts, ts_comm_dtype type,
                            ts_comm_op op, void *stream, ts_request *r);
    void (*iallgather)(const ts_comm *c, void *buf, const int *counts, const int *displs,
                       ts_comm_dtype type, void *stream, ts_request *r);
    void (*isend)(const ts_comm *c, const void *buf, size_t n, ts_comm_dtype type, int peer,
                  int tag, void *stream, ts_request *r);
    void (*irecv)(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, int peer, int tag,
                  void *stream, ts_request *r);
    /* 1 when r (active) completed; wait until it has. comm.c does the rest. */
    int (*test)(ts_request *r);
    void (*wait)(ts_request *r);

    /* Point-to-point groups (ts_comm_group_begin/end): no-ops for MPI. */
    void (*group_begin)(const ts_comm *c, void *stream);
    void (*group_end)(const ts_comm *c, void *stream);
};

/* The MPI backend (comm/mpi.c): buffers MPI may touch directly (host memory, the CPU
 * compute backend's device memory); ignores streams. */
extern const ts_comm_backend ts_comm_mpi;
/* The staged MPI backend (comm/staged.c): device buffers MPI may not touch (a GPU's
 * memory under an MPI that is not CUDA-aware; the strict test backend's, which is
 * inaccessible outside its own calls). Each operation copies what it reads into a host
 * bounce buffer, runs ts_comm_mpi's operation there and copies what it wrote back, all
 * on the calling thread: a blocking one before it returns, a non-blocking one when it
 * starts and when a test first sees it complete or a wait returns. MPI never sees the
 * device buffer. The copies are the compute backend's, registered once per process
 * with ts_comm_staged_set_copies before any group uses this backend (it aborts
 * otherwise). */
extern const ts_comm_backend ts_comm_mpi_staged;
/* The copies ts_comm_mpi_staged uses (device to host, host to device), e.g. a
 * ts_kernels table's memcpy_d2h and memcpy_h2d. Set before any group uses the staged
 * backend and not changed while a staged operation is in flight (they are read on
 * every thread that communicates). */
void ts_comm_staged_set_copies(void (*d2h)(void *dst, const void *src, size_t bytes),
                               void (*h2d)(void *dst, const void *src, size_t bytes));
#ifdef TS_HAVE_NCCL
/* The NCCL backend (comm/nccl.c; built where CMake finds NCCL beside CUDA): buffers of
 * the CUDA compute backend, on the CUDA device current when the group moves to it
 * (ts_cuda_select_device first). Each group gets its own NCCL communicator and comm
 * stream; every operation waits for the work queued on c->stream (NULL: the compute
 * stream), and c->stream waits for a blocking one at once (no host wait) and for a
 * non-blocking one when a test or wait sees it complete. Ranks sharing a GPU cannot
 * use it: ts_comm_set_backend fails on every member, naming them and the GPU.
 * Point-to-point transfers that must progress together go in one
 * ts_comm_group_begin/end (a send completes only when the peer receives); a request
 * started inside one stays at its address until the outermost end (its completion
 * event is recorded then). */
extern const ts_comm_backend ts_comm_nccl;
#endif

/* The backend named `name` ("mpi", "mpi-staged"; "nccl" where built), or NULL. */
const ts_comm_backend *ts_comm_backend_find(const char *name);
/* The first required slot of a table left NULL (a backend missing one would crash
 * mid-run), or NULL when complete. attach and detach are optional. */
const char *ts_comm_backend_missing(const ts_comm_backend *b);
/* Move the group `c` (and the groups later split or duplicated from it) to the
 * backend `ops`: collective over c's members (a non-member's just records ops);
 * detaches the old backend, attaches the new. The status is agreed over c: a failure
 * (ts_fail's message, the lowest failing rank's) leaves c on ts_comm_mpi on every
 * member. ts_comm_set_backend(c, &ts_comm_mpi) releases a backend's communicator, e.g.
 * on a copy of a topology group before the topology frees the original. */
ts_status ts_comm_set_backend(ts_comm *c, const ts_comm_backend *ops);

/* ------------------------------------------------------------ the process -- */

/* Start the backend, once per process before any other call: MPI asked for thread
 * level MULTIPLE (the data-parallel reduction may run on a communication thread,
 * parallel.grad_sync_progress = "thread"); FUNNELED is enough for everything else (the
 * watchdog thread never communicates). Returns whether FUNNELED was granted. */
bool ts_comm_init(int *argc, char ***argv);
/* Whether ts_comm_init got the thread level the watchdog needs (FUNNELED). */
bool ts_comm_threads_ok(void);
/* Whether several threads may communicate at once (MPI_THREAD_MULTIPLE granted). */
bool ts_comm_thread_multiple(void);
/* Shut the backend down. It synchronises with the other ranks, so it is marked for the
 * watchdog like any collective. */
void ts_comm_finalize(void);
/* This process's host name as the backend knows it, into buf (always terminated). */
void ts_comm_host_name(char *buf, size_t cap);

/* ---------------------------------------------- the groups (control plane) -- */

/* Every process of the job, named "world" (not owned), on the MPI backend. */
void ts_comm_world(ts_comm *c);
/* Split `parent` (collective over it): the ranks passing the same color >= 0 form one
 * group, ranked by key (ties by their rank in parent); color < 0 joins none (out->size
 * is 0). The caller owns *out (ts_comm_free). Only the topology makes groups. The new
 * group has the parent's backend and stream. */
void ts_comm_split(const ts_comm *parent, int color, int key, const char *name, ts_comm *out);
/* A duplicate of `c` (collective over it): the same ranks, its own message space, so a
 * communication thread's collectives never interleave with the main thread's. Owned;
 * the parent's backend and stream. */
void ts_comm_dup(const ts_comm *c, const char *name, ts_comm *out);
/* The ranks of `parent` that share this node's memory, ranked by key; owned as above. */
void ts_comm_split_node(const ts_comm *parent, int key, const char *name, ts_comm *out);
/* Release a group made by a split (and a backend communicator attached to any group);
 * a no-op for others (world, a non-member, a zeroed struct). Call it on the owner's
 * copy only. */
void ts_comm_free(ts_comm *c);
static inline int ts_comm_member(const ts_comm *c) { return c->size > 0; }
/* The largest message tag the backend accepts. */
int ts_comm_tag_max(const ts_comm *c);
/* world_ranks[i] = the world rank of member i, for i < c->size (messages name ranks). */
void ts_comm_world_ranks(const ts_comm *c, int *world_ranks);

/* ------------------------- host records and values (control plane, MPI) -- */

/* recv[size*bytes] = every rank's send[bytes], in rank order (bytes <= INT_MAX). */
void ts_allgather_bytes(const ts_comm *c, const void *send, size_t bytes, void *recv);
/* The same on `root` only (recv is ignored elsewhere and may be NULL there). */
void ts_gather_bytes(const ts_comm *c, const void *send, size_t bytes, void *recv, int root);
/* Gather n elements of elem_bytes each from every rank to `root`, packed in rank order
 * into recv; counts[size] (root only) says how many each rank sends. The total must
 * fit an int (elements). */
void ts_gatherv(const ts_comm *c, const void *send, int n, size_t elem_bytes, void *recv,
                const int *counts, int root);

/* In-place reductions of host values over the group (metrics, codes and counts,
 * hashes, flags): always MPI, whatever the group's data-plane backend. */
void ts_host_allreduce_sum_f64(const ts_comm *c, double *buf, size_t n);
void ts_host_allreduce_max_f64(const ts_comm *c, double *buf, size_t n);
void ts_host_allreduce_sum_i32(const ts_comm *c, int *buf, size_t n);
void ts_host_allreduce_min_i32(const ts_comm *c, int *buf, size_t n);
void ts_host_allreduce_max_i32(const ts_comm *c, int *buf, size_t n);
void ts_host_allreduce_min_u64(const ts_comm *c, uint64_t *buf, size_t n);
void ts_host_allreduce_max_u64(const ts_comm *c, uint64_t *buf, size_t n);
/* `root`'s buf[bytes] (host memory) to every rank of the group. */
void ts_host_broadcast(const ts_comm *c, void *buf, size_t bytes, int root);
/* recv[j*count .. +count) = member j's send[rank*count .. +count), host values: the
 * all-to-all of an expert layer's token counts before its dispatch. */
void ts_host_alltoall_i32(const ts_comm *c, const int *send, int *recv, size_t count);

/* Agree on an outcome across the group before anything can hang: every rank passes its
 * own status; a failure on any rank fails on every rank, and the message recorded on
 * each is the lowest failing rank's, prefixed "on rank R (host H): " when R is not
 * rank 0 (so rank 0, which prints, names where it happened). Collective. */
ts_status ts_comm_agree(const ts_comm *c, ts_status local);

/* ------------------------------------ the collectives (data plane, c->ops) -- */

/* Every buffer here is the backend's (device) memory: host values take the control
 * plane above. */

/* In-place reductions over the group (gradients, tensor-parallel activations). */
void ts_allreduce_sum_f32(const ts_comm *c, float *buf, size_t n);
void ts_allreduce_max_f32(const ts_comm *c, float *buf, size_t n);
/* recv[count] = the sum over ranks of send[rank*count .. rank*count + count). send and
 * recv do not overlap. */
void ts_reduce_scatter_sum_f32(const ts_comm *c, const float *send, float *recv, size_t count);
/* recv[size*count] = every rank's send[count], in rank order (no overlap). */
void ts_allgather_f32(const ts_comm *c, const float *send, float *recv, size_t count);
/* `root`'s buf[bytes] (device memory) to every rank of the group. */
void ts_broadcast_dev(const ts_comm *c, void *buf, size_t bytes, int root);
void ts_barrier(const ts_comm *c);

/* Non-blocking: start, make progress (returns 1 when complete), wait. */
void ts_iallreduce_sum_f32(const ts_comm *c, float *buf, size_t n, ts_request *r);
void ts_isend_f32(const ts_comm *c, const float *buf, size_t n, int peer, int tag, ts_request *r);
void ts_irecv_f32(const ts_comm *c, float *buf, size_t n, int peer, int tag, ts_request *r);
/* The same on activations of the kernels' dtype (kernels/kernels.h ts_dtype): the
 * pipeline's messages and tensor parallelism's sums move bf16 in a bf16 run. */
void ts_allreduce_sum_act(const ts_comm *c, void *buf, size_t n, ts_dtype type);
/* ts_reduce_scatter_sum_f32 and ts_allgather_f32 on activations (sequence parallelism's
 * pair in place of tensor parallelism's all-reduce). */
void ts_reduce_scatter_sum_act(const ts_comm *c, const void *send, void *recv, size_t count,
                               ts_dtype type);
void ts_allgather_act(const ts_comm *c, const void *send, void *recv, size_t count, ts_dtype type);
/* The variable all-to-all (an expert layer's dispatch and combine): to member j
 * send_counts[j] elements from send + send_displs[j]; from member j recv_counts[j]
 * elements into recv + recv_displs[j] (elements of `type`; host arrays of c->size,
 * agreed beforehand, e.g. by ts_host_alltoall_i32 of the counts). send and recv do not
 * overlap; the send pieces may (they are only read: expert_tp.c's gather sends one block
 * to every member); recv's elements outside the pieces keep their values. */
void ts_alltoallv_act(const ts_comm *c, const void *send, const int *send_counts,
                      const int *send_displs, void *recv, const int *recv_counts,
                      const int *recv_displs, ts_dtype type);
/* ts_alltoallv_act started non-blocking (an expert layer's dispatch and combine, which
 * compute runs beside): the buffers and the four host arrays must stay valid, send
 * unwritten and recv unread, until the request completes. On one rank the copy is made
 * at once and the request is complete. MPI_Ialltoallv on the MPI backend (it moves only
 * inside MPI calls: test it now and then, expert_dispatch.h); copies at start and at
 * completion on the staged one; one NCCL group of a send and a receive per peer on the
 * group's comm stream, completed by its event, on NCCL. */
void ts_ialltoallv_act(const ts_comm *c, const void *send, const int *send_counts,
                       const int *send_displs, void *recv, const int *recv_counts,
                       const int *recv_displs, ts_dtype type, ts_request *r);
void ts_isend_act(const ts_comm *c, const void *buf, size_t n, ts_dtype type, int peer, int tag,
                  ts_request *r);
void ts_irecv_act(const ts_comm *c, void *buf, size_t n, ts_dtype type, int peer, int tag,
                  ts_request *r);
/* Non-blocking reduce-scatter in place, in uneven pieces (ZeRO-1's buckets): on entry
 * buf[0 .. sum(counts)) is this rank's input; on completion buf[0 .. counts[rank]) holds
 * the sum over ranks of piece `rank` (MPI_IN_PLACE puts the result at the start; the
 * rest of buf is undefined). counts[size] must stay valid until the request completes. */
void ts_ireduce_scatter_sum_f32(const ts_comm *c, float *buf, const int *counts, ts_request *r);
/* Non-blocking all-gather in place: rank k's piece buf[displs[k] .. displs[k] + counts[k])
 * reaches every rank. counts and displs must stay valid until the request completes. */
void ts_iallgather_f32(const ts_comm *c, float *buf, const int *counts, const int *displs,
                       ts_request *r);
/* The same on elements of the kernels' dtype (ZeRO-3 gathers bf16 weights in a bf16 run;
 * parallel.tp_overlap's sums and gathers of activations). */
void ts_iallgather_act(const ts_comm *c, void *buf, const int *counts, const int *displs,
                       ts_dtype type, ts_request *r);
void ts_iallreduce_sum_act(const ts_comm *c, void *buf, size_t n, ts_dtype type, ts_request *r);
void ts_ireduce_scatter_sum_act(const ts_comm *c, void *buf, const int *counts, ts_dtype type,
                                ts_request *r);
int ts_request_test(ts_request *r);
void ts_request_wait(ts_request *r);

/* Point-to-point groups: the sends and receives started between begin and end on one
 * group are issued together, so matched pairs in any order cannot deadlock (NCCL's
 * ncclGroupStart/End; MPI's isend/irecv already never block, so no-ops there). Groups
 * may nest; a request started inside one may be tested or waited only after the
 * outermost end. Transfers between two ranks match in the order they are started
 * (tags are not enough: NCCL has none), so both sides start them in the same order. */
void ts_comm_group_begin(const ts_comm *c);
void ts_comm_group_end(const ts_comm *c);

#endif
