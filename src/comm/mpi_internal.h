/* What the MPI control plane (comm/control.c) and the MPI data-plane backend (comm/mpi.c)
 * share, private to those two files, the only ones that include <mpi.h>
 * (tests/test_boundaries.sh). mpi.c defines these; control.c calls them, and mpi.c calls
 * nothing of control.c's. */
#ifndef TS_COMM_MPI_INTERNAL_H
#define TS_COMM_MPI_INTERNAL_H

#include <stddef.h>
#include <string.h>

#include <mpi.h>

#include "comm/comm.h"

_Static_assert(sizeof(MPI_Comm) <= sizeof(ts_comm_handle), "an MPI_Comm fits a ts_comm_handle");

/* The communicator a group holds in its handle (MPI_COMM_NULL when not a member). */
static inline MPI_Comm ts_mpi_comm_of(const ts_comm *c)
{
    MPI_Comm m;
    memcpy(&m, &c->handle, sizeof m);
    return m;
}

/* rc is MPI_SUCCESS, or the job ends with the rank, `what`, the group's name (c may be
 * NULL) and MPI's message (MPI_Abort, exit code 3). */
void ts_mpi_check(int rc, const ts_comm *c, const char *what);

/* In-place all-reduce and broadcast in slices of at most 1 GiB elements or bytes (MPI
 * counts are int): both planes run them, the data plane on buffers MPI may touch, the
 * control plane on host values. No watchdog marks or timing: the callers add those. */
void ts_mpi_allreduce_sliced(const ts_comm *c, void *buf, size_t n, ts_comm_dtype type,
                             ts_comm_op op);
void ts_mpi_broadcast_sliced(const ts_comm *c, void *buf, size_t bytes, int root);

#endif
