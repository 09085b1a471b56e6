/* MPI: the control plane (the process, the groups, agreement, gathers, reductions and
 * broadcasts of host values) and the data-plane backend for buffers MPI may touch
 * (ts_comm_mpi, called through comm.c; comm/staged.c wraps it for those it may not).
 * Counts are size_t; MPI takes int, so large buffers go in slices of at most 1 GiB
 * elements (a blocking collective per slice; the non-blocking ones must fit one call,
 * which the bucketed callers guarantee). This is the only file that calls MPI
 * (tests/test_boundaries.sh checks it). */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm/comm.h"
#include "comm/internal.h"
#include "core/error.h"
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

/* Fill *c for the communicator m (MPI_COMM_NULL: not a member), on the MPI backend. */
static void wrap(ts_comm *c, MPI_Comm m, const char *name, bool owned)
{
    memset(c, 0, sizeof *c);
    memcpy(&c->handle, &m, sizeof m);
    c->name = name;
    c->ops = &ts_comm_mpi;
    if (m == MPI_COMM_NULL) return;
    c->owned = owned;
    check(MPI_Comm_rank(m, &c->rank), c, "rank query");
    check(MPI_Comm_size(m, &c->size), c, "size query");
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
static void allreduce_sliced(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                             ts_comm_op op)
{
    const size_t elem = ts_comm_dtype_size(type);
    for (size_t off = 0; off < n; off += SLICE) {
        size_t cnt = n - off < SLICE ? n - off : SLICE;
        check(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, (int)cnt, type_of(type),
                            op_of(op, type), comm_of(c)),
              c, "all-reduce");
    }
}

static void broadcast_sliced(const ts_comm *c, void *buf, size_t bytes, int root)
{
    for (size_t off = 0; off < bytes; off += SLICE)
        check(MPI_Bcast((char *)buf + off, (int)(bytes - off < SLICE ? bytes - off : SLICE),
                        MPI_BYTE, root, comm_of(c)),
              c, "broadcast");
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
    ts_comm_inherit(out, parent);
}

void ts_comm_dup(const ts_comm *c, const char *name, ts_comm *out)
{
    TS_ASSERT(ts_comm_member(c));
    MPI_Comm m = MPI_COMM_NULL;
    ts_watchdog_wait_begin("communicator duplicate", c->name, -1);
    check(MPI_Comm_dup(comm_of(c), &m), c, "communicator duplicate");
    ts_watchdog_wait_end();
    wrap(out, m, name, true);
    ts_comm_inherit(out, c);
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
    ts_comm_inherit(out, parent);
}

void ts_comm_free(ts_comm *c)
{
    ts_comm_detach(c);
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

/* ------------------------------- host records and values (control plane) -- */

void ts_allgather_bytes(const ts_comm *c, const void *send, size_t bytes, void *recv)
{
    TS_ASSERT(bytes <= INT_MAX);
    if (c->size <= 1) {
        if (bytes > 0 && send != recv) memmove(recv, send, bytes);
        return;
    }
    double t0 = ts_comm_begin(c, "all-gather");
    check(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, comm_of(c)), c,
          "all-gather");
    ts_comm_end(c, "all-gather", bytes * (size_t)c->size, t0);
}

void ts_gather_bytes(const ts_comm *c, const void *send, size_t bytes, void *recv, int root)
{
    TS_ASSERT(bytes <= INT_MAX);
    if (c->size <= 1) {
        if (bytes > 0 && send != recv) memmove(recv, send, bytes);
        return;
    }
    double t0 = ts_comm_begin(c, "gather");
    check(MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root, comm_of(c)), c,
          "gather");
    ts_comm_end(c, "gather", bytes, t0);
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
    double t0 = ts_comm_begin(c, "gather");
    check(MPI_Gatherv(send, n, type, recv, counts, displs, type, root, comm_of(c)), c, "gather");
    ts_comm_end(c, "gather", (size_t)n * elem_bytes, t0);
    check(MPI_Type_free(&type), c, "gather (type)");
    free(displs);
}

/* Host values: the data plane's front end's marks and timing (comm.c), but always MPI,
 * whatever backend the group's data plane has. */
static void host_allreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                           ts_comm_op op)
{
    if (c->size <= 1) return;
    double t0 = ts_comm_begin(c, "all-reduce");
    allreduce_sliced(c, buf, n, type, op);
    ts_comm_end(c, "all-reduce", n * ts_comm_dtype_size(type), t0);
}

void ts_host_allreduce_sum_f64(const ts_comm *c, double *buf, size_t n)
{
    host_allreduce(c, buf, n, TS_COMM_F64, TS_COMM_SUM);
}
void ts_host_allreduce_max_f64(const ts_comm *c, double *buf, size_t n)
{
    host_allreduce(c, buf, n, TS_COMM_F64, TS_COMM_MAX);
}
void ts_host_allreduce_sum_i32(const ts_comm *c, int *buf, size_t n)
{
    host_allreduce(c, buf, n, TS_COMM_I32, TS_COMM_SUM);
}
void ts_host_allreduce_min_i32(const ts_comm *c, int *buf, size_t n)
{
    host_allreduce(c, buf, n, TS_COMM_I32, TS_COMM_MIN);
}
void ts_host_allreduce_max_i32(const ts_comm *c, int *buf, size_t n)
{
    host_allreduce(c, buf, n, TS_COMM_I32, TS_COMM_MAX);
}
void ts_host_allreduce_min_u64(const ts_comm *c, uint64_t *buf, size_t n)
{
    host_allreduce(c, buf, n, TS_COMM_U64, TS_COMM_MIN);
}
void ts_host_allreduce_max_u64(const ts_comm *c, uint64_t *buf, size_t n)
{
    host_allreduce(c, buf, n, TS_COMM_U64, TS_COMM_MAX);
}

void ts_host_broadcast(const ts_comm *c, void *buf, size_t bytes, int root)
{
    if (c->size <= 1) return;
    double t0 = ts_comm_begin(c, "broadcast");
    broadcast_sliced(c, buf, bytes, root);
    ts_comm_end(c, "broadcast", bytes, t0);
}

ts_status ts_comm_agree(const ts_comm *c, ts_status local)
{
    if (c->size <= 1) return local;
    int fail_rank = local == TS_OK ? INT_MAX : c->rank, first = INT_MAX;
    ts_watchdog_wait_begin("all-reduce (agreeing on success)", c->name, -1);
    check(MPI_Allreduce(&fail_rank, &first, 1, MPI_INT, MPI_MIN, comm_of(c)), c, "agreement");
    ts_watchdog_wait_end();
    if (first == INT_MAX) return TS_OK;
    char msg[TS_ERROR_MAX] = {0};
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

/* --------------------------- the data plane (buffers MPI may touch) -- */

/* comm.c calls these on groups of two or more ranks (reduce_scatter and allgather also
 * on one rank, for a copy); it marks the watchdog and reports the time. */

static void mpi_allreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                          ts_comm_op op, void *stream)
{
    (void)stream;
    allreduce_sliced(c, buf, n, type, op);
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
    check(MPI_Reduce_scatter_block(send, recv, (int)count, type_of(type), op_of(op, type),
                                   comm_of(c)),
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
    check(MPI_Allgather(send, (int)count, type_of(type), recv, (int)count, type_of(type),
                        comm_of(c)),
          c, "all-gather");
}

static void mpi_broadcast(const ts_comm *c, void *buf, size_t bytes, int root, void *stream)
{
    (void)stream;
    broadcast_sliced(c, buf, bytes, root);
}

static void mpi_barrier(const ts_comm *c, void *stream)
{
    (void)stream;
    check(MPI_Barrier(comm_of(c)), c, "barrier");
}

static void mpi_iallreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                           ts_comm_op op, void *stream, ts_request *r)
{
    (void)stream;
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, type_of(type), op_of(op, type), comm_of(c), &q),
          c, "non-blocking all-reduce");
    set_request(r, q);
}

static void mpi_ireduce_scatter(const ts_comm *c, void *buf, const int *counts,
                                ts_comm_dtype type, ts_comm_op op, void *stream, ts_request *r)
{
    (void)stream;
    MPI_Request q;
    check(MPI_Ireduce_scatter(MPI_IN_PLACE, buf, counts, type_of(type), op_of(op, type), comm_of(c),
                              &q),
          c, "non-blocking reduce-scatter");
    set_request(r, q);
}

static void mpi_iallgather(const ts_comm *c, void *buf, const int *counts, const int *displs,
                           ts_comm_dtype type, void *stream, ts_request *r)
{
    (void)stream;
    MPI_Request q;
    check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs,
                          type_of(type), comm_of(c), &q),
          c, "non-blocking all-gather");
    set_request(r, q);
}

static void mpi_isend(const ts_comm *c, const void *buf, size_t n, ts_comm_dtype type, int peer,
                      int tag, void *stream, ts_request *r)
{
    (void)stream;
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    check(MPI_Isend(buf, (int)n, type_of(type), peer, tag, comm_of(c), &q), c, "send");
    set_request(r, q);
}

static void mpi_irecv(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type, int peer,
                      int tag, void *stream, ts_request *r)
{
    (void)stream;
    TS_ASSERT(n <= INT_MAX);
    MPI_Request q;
    check(MPI_Irecv(buf, (int)n, type_of(type), peer, tag, comm_of(c), &q), c, "receive");
    set_request(r, q);
}

static int mpi_test(ts_request *r)
{
    int done = 0;
    MPI_Request q = request_of(r);
    check(MPI_Test(&q, &done, MPI_STATUS_IGNORE), NULL, "progress");
    set_request(r, q);
    return done;
}

static void mpi_wait(ts_request *r)
{
    MPI_Request q = request_of(r);
    check(MPI_Wait(&q, MPI_STATUS_IGNORE), NULL, "wait");
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
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
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
