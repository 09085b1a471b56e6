/* libts_yield_sleep.so: preloaded into the shell tests' processes (tests/lib.sh), it
 * makes sched_yield() a short sleep.
 *
 * Why: Open MPI's ranks wait for a message by polling (opal_progress), never by blocking.
 * The suite runs 2 tests at once on CI's 2 cores, each with 2 to 8 ranks: a rank that
 * waits for a peer keeps its core busy, and the peer it waits for is often the process
 * it keeps off that core. With mpi_yield_when_idle (lib.sh) an idle poll calls
 * sched_yield(), which hands the core only to a task the scheduler already prefers; this
 * sleep (1 us asked, the kernel's timer slack, about 50 us, given) takes the rank off
 * the run queue, so the ranks with work run. What the ranks compute, and the order of
 * every reduction (Open MPI's coll/tuned), is unchanged: the numbers are the same bits;
 * only the waiting is cheaper (docs/CI.md). Test infrastructure only: tessera itself
 * never preloads it. */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <time.h>

int sched_yield(void)
{
    struct timespec ts = { 0, 1000 };
    nanosleep(&ts, NULL); /* interrupted early by a signal: the caller polls again */
    return 0;
}
