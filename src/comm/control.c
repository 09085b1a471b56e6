/* The control plane (comm.h): always MPI, on host memory. Starting and stopping the
 * process, making and freeing groups (and attaching each group's data-plane backend),
 * rank bookkeeping, agreement, and the gathers, reductions and broadcasts of host
 * values. It calls the data plane's front end (comm.c) only to check a backend's table
 * and the MPI backend (comm/mpi.c, through comm/mpi_internal.h) for its checks and
 * sliced collectives; neither calls back here, so the data plane reads without it.
 * With mpi.c, the only file that calls MPI (tests/test_boundaries.sh checks it). */
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

/* ------------------------------------------------- the groups' backends -- */

/* A backend that cannot attach to a group split or duplicated from one it already
 * serves has broken mid-run (its parent attached on the same ranks and devices): the
 * caller has no status to return, so the process ends saying why. */
static void inherit(ts_comm *out, const ts_comm *parent)
{
    if (parent->ops) out->ops = parent->ops;
    out->stream = parent->stream;
    out->backend_comm = NULL;
    if (out->size > 0 && out->ops && out->ops->attach && out->ops->attach(out, parent) != TS_OK)
        ts_panic(__FILE__, __LINE__, ts_error_message());
}

static void detach(ts_comm *c)
{
    if (c->size > 0 && c->ops && c->ops->detach && c->backend_comm) c->ops->detach(c);
    c->backend_comm = NULL;
}

ts_status ts_comm_set_backend(ts_comm *c, const ts_comm_backend *ops)
{
    TS_ASSERT(ops && !ts_comm_backend_missing(ops));
    detach(c);
    c->ops = ops;
    if (c->size == 0 || !ops->attach) return TS_OK;
    /* attach returns one verdict on every member; agreeing again covers a backend whose
     * last step can fail on one member alone. */
    ts_status st = ts_comm_agree(c, ops->attach(c, c));
    if (st != TS_OK) {
        detach(c);
        c->ops = &ts_comm_mpi;
    }
    return st;
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
    ts_mpi_check(MPI_Comm_rank(m, &c->rank), c, "rank query");
    ts_mpi_check(MPI_Comm_size(m, &c->size), c, "size query");
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
    ts_mpi_check(MPI_Query_thread(&level), NULL, "thread level query");
    return level >= MPI_THREAD_MULTIPLE;
}

bool ts_comm_threads_ok(void)
{
    int level = MPI_THREAD_SINGLE;
    ts_mpi_check(MPI_Query_thread(&level), NULL, "thread level query");
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
    ts_mpi_check(MPI_Get_processor_name(name, &len), NULL, "host name query");
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
    ts_mpi_check(MPI_Comm_split(ts_mpi_comm_of(parent), color < 0 ? MPI_UNDEFINED : color, key,
                                &m),
                 parent, "communicator split");
    ts_watchdog_wait_end();
    wrap(out, m, name, true);
    inherit(out, parent);
}

void ts_comm_dup(const ts_comm *c, const char *name, ts_comm *out)
{
    TS_ASSERT(ts_comm_member(c));
    MPI_Comm m = MPI_COMM_NULL;
    ts_watchdog_wait_begin("communicator duplicate", c->name, -1);
    ts_mpi_check(MPI_Comm_dup(ts_mpi_comm_of(c), &m), c, "communicator duplicate");
    ts_watchdog_wait_end();
    wrap(out, m, name, true);
    inherit(out, c);
}

void ts_comm_split_node(const ts_comm *parent, int key, const char *name, ts_comm *out)
{
    TS_ASSERT(ts_comm_member(parent));
    MPI_Comm m = MPI_COMM_NULL;
    ts_watchdog_wait_begin("communicator split (shared memory)", parent->name, -1);
    ts_mpi_check(MPI_Comm_split_type(ts_mpi_comm_of(parent), MPI_COMM_TYPE_SHARED, key,
                                     MPI_INFO_NULL, &m),
                 parent, "communicator split (shared memory)");
    ts_watchdog_wait_end();
    wrap(out, m, name, true);
    inherit(out, parent);
}

void ts_comm_free(ts_comm *c)
{
    detach(c);
    if (c->owned && c->size > 0) {
        MPI_Comm m = ts_mpi_comm_of(c);
        ts_mpi_check(MPI_Comm_free(&m), c, "communicator free");
    }
    c->owned = false;
    c->size = 0;
}

int ts_comm_tag_max(const ts_comm *c)
{
    /* MPI_TAG_UB is cached on MPI_COMM_WORLD and holds for every communicator. */
    int flag = 0, *ub = NULL;
    ts_mpi_check(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag), c, "tag limit query");
    return flag && ub ? *ub : INT_MAX;
}

void ts_comm_world_ranks(const ts_comm *c, int *world_ranks)
{
    if (c->size <= 0) return;
    MPI_Group group, world;
    ts_mpi_check(MPI_Comm_group(ts_mpi_comm_of(c), &group), c, "group query");
    ts_mpi_check(MPI_Comm_group(MPI_COMM_WORLD, &world), c, "group query");
    int *ranks = ts_malloc((size_t)c->size * sizeof(int));
    for (int r = 0; r < c->size; r++) ranks[r] = r;
    ts_mpi_check(MPI_Group_translate_ranks(group, c->size, ranks, world, world_ranks), c,
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
    ts_mpi_check(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                               ts_mpi_comm_of(c)),
                 c, "all-gather");
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
    ts_mpi_check(MPI_Gather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, root,
                            ts_mpi_comm_of(c)),
                 c, "gather");
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
    ts_mpi_check(MPI_Type_contiguous((int)elem_bytes, MPI_BYTE, &type), c, "gather (type)");
    ts_mpi_check(MPI_Type_commit(&type), c, "gather (type)");
    double t0 = ts_comm_begin(c, "gather");
    ts_mpi_check(MPI_Gatherv(send, n, type, recv, counts, displs, type, root, ts_mpi_comm_of(c)),
                 c, "gather");
    ts_comm_end(c, "gather", (size_t)n * elem_bytes, t0);
    ts_mpi_check(MPI_Type_free(&type), c, "gather (type)");
    free(displs);
}

/* Host values: the data plane's front end's marks and timing (comm.c), but always MPI,
 * whatever backend the group's data plane has. */
static void host_allreduce(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                           ts_comm_op op)
{
    if (c->size <= 1) return;
    double t0 = ts_comm_begin(c, "all-reduce");
    ts_mpi_allreduce_sliced(c, buf, n, type, op);
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
    ts_mpi_broadcast_sliced(c, buf, bytes, root);
    ts_comm_end(c, "broadcast", bytes, t0);
}

void ts_host_alltoall_i32(const ts_comm *c, const int *send, int *recv, size_t count)
{
    TS_ASSERT(count <= INT_MAX);
    if (c->size <= 1) {
        memmove(recv, send, count * sizeof(int));
        return;
    }
    double t0 = ts_comm_begin(c, "all-to-all");
    ts_mpi_check(MPI_Alltoall(send, (int)count, MPI_INT, recv, (int)count, MPI_INT,
                              ts_mpi_comm_of(c)),
                 c, "all-to-all of counts");
    ts_comm_end(c, "all-to-all", 2 * count * (size_t)c->size * sizeof(int), t0);
}

ts_status ts_comm_agree(const ts_comm *c, ts_status local)
{
    if (c->size <= 1) return local;
    int fail_rank = local == TS_OK ? INT_MAX : c->rank, first = INT_MAX;
    ts_watchdog_wait_begin("all-reduce (agreeing on success)", c->name, -1);
    ts_mpi_check(MPI_Allreduce(&fail_rank, &first, 1, MPI_INT, MPI_MIN, ts_mpi_comm_of(c)), c,
                 "agreement");
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
    ts_mpi_check(MPI_Bcast(msg, sizeof msg, MPI_CHAR, first, ts_mpi_comm_of(c)), c, "agreement");
    ts_watchdog_wait_end();
    return ts_fail("%s", msg);
}
