/* One interface for the collectives and point-to-point transfers the framework needs.
 * Model, tensor-parallel, pipeline and optimizer code call only this; the MPI backend
 * is comm/mpi.c, and an NCCL backend can fill the same calls for device buffers.
 * Every call is checked: a failing transfer aborts the job with the rank and cause
 * (there is no recovering from a broken collective mid-step). Every blocking call and
 * wait is marked for the watchdog (core/watchdog.h), so one that never returns ends
 * the job after train.timeout_s with a message naming it. */
#ifndef TS_COMM_H
#define TS_COMM_H

#include <stddef.h>

#include <mpi.h>

#include "core/error.h"

typedef struct ts_comm_s {
    MPI_Comm mpi;   /* MPI_COMM_NULL: this rank is not in the group */
    int rank, size;
    const char *name; /* "tp", "dp", "pp", "embed", "world": for error messages */
    double *busy_ms;  /* when set, blocking collectives add their time here */
} ts_comm;

/* A pending non-blocking operation (what, comm and peer name it in watchdog messages). */
typedef struct {
    MPI_Request req;
    int active;
    int peer;                 /* rank in the group, -1 for a collective */
    const char *what, *comm;  /* "receive", "send", "non-blocking all-reduce"; group name */
} ts_request;

/* Wrap an existing communicator (not owned: the topology frees it). */
void ts_comm_wrap(ts_comm *c, MPI_Comm mpi, const char *name);
static inline int ts_comm_member(const ts_comm *c) { return c->mpi != MPI_COMM_NULL; }

/* In-place collectives over the group. */
void ts_allreduce_sum_f32(const ts_comm *c, float *buf, size_t n);
void ts_allreduce_max_f32(const ts_comm *c, float *buf, size_t n);
void ts_allreduce_sum_f64(const ts_comm *c, double *buf, size_t n);
void ts_allreduce_max_i32(const ts_comm *c, int *buf, size_t n);
/* recv[count] = the sum over ranks of send[rank*count .. rank*count + count). */
void ts_reduce_scatter_sum_f32(const ts_comm *c, const float *send, float *recv, size_t count);
/* recv[size*count] = every rank's send[count], in rank order. */
void ts_allgather_f32(const ts_comm *c, const float *send, float *recv, size_t count);
void ts_broadcast(const ts_comm *c, void *buf, size_t bytes, int root);
void ts_barrier(const ts_comm *c);

/* Agree on an outcome across the group before anything can hang: every rank passes its
 * own status; a failure on any rank fails on every rank, and the message recorded on
 * each is the lowest failing rank's, prefixed "on rank R (host H): " when R is not
 * rank 0 (so rank 0, which prints, names where it happened). Collective. */
ts_status ts_comm_agree(const ts_comm *c, ts_status local);

/* Non-blocking: start, make progress (returns 1 when complete), wait. */
void ts_iallreduce_sum_f32(const ts_comm *c, float *buf, size_t n, ts_request *r);
void ts_isend_f32(const ts_comm *c, const float *buf, size_t n, int peer, int tag, ts_request *r);
void ts_irecv_f32(const ts_comm *c, float *buf, size_t n, int peer, int tag, ts_request *r);
int ts_request_test(ts_request *r);
void ts_request_wait(ts_request *r);

#endif
