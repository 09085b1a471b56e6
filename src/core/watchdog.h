/* The watchdog: a background thread that ends the job when this rank makes no progress
 * for train.timeout_s seconds (a collective or pipeline transfer that never completes
 * because a peer stopped, hung or crashed, or the network is stuck), like PyTorch's
 * NCCL watchdog. It prints where this rank is waiting (step, action, communicator,
 * peer) to stderr and exits the process with TS_EXIT_WATCHDOG; mpirun/srun then take
 * the other ranks down.
 *
 * The main thread marks its way through the step: the comm layer marks every blocking
 * call and wait (ts_watchdog_wait_begin/_end) and every completed test; the pipeline
 * engine and the trainer name what they are doing (ts_watchdog_context, _step). A mark
 * is a few plain stores into a seqlock-protected record: no system call, no clock read,
 * no allocation, so marking every collective costs nothing measurable. Any mark counts
 * as progress; the thread notices when the marks stop.
 *
 * The thread never calls MPI (the main thread is blocked inside it): it only reads the
 * record, writes to stderr and calls _exit. Marks are harmless when it is not running
 * (train.timeout_s = 0, or tools and tests that never start it). */
#ifndef TS_WATCHDOG_H
#define TS_WATCHDOG_H

#include "core/error.h"

/* The exit status of a rank ended by the watchdog (documented in README.md). */
#define TS_EXIT_WATCHDOG 14

/* Start the thread: abort after timeout_s seconds without a mark (0 = do not start).
 * rank and host name this process in the message. Main thread, once. */
ts_status ts_watchdog_start(int timeout_s, int rank, const char *host);
/* Stop and join the thread (no-op when not running). */
void ts_watchdog_stop(void);

/* Marks: one thread at a time. The main thread's, and while an overlapped pipeline pair
 * runs (pipeline/pair.h) the pair's worker's as it holds the baton: the baton passes
 * with a mutex's unlock and lock, so the two threads' marks never overlap and each sees
 * the other's last one (the seqlock keeps a single writer at any moment); the thread
 * that waits for the baton makes none. String arguments must outlive the run (literals,
 * or the communicator names of the topology). */

/* The optimizer step under way (-1 = setup, before the first step). Clears the context. */
void ts_watchdog_step(int step);
/* What the caller is doing, for the message: a printf format taking up to three ints,
 * e.g. ("pipeline: receiving the input of F(chunk %d, mb %d) from world rank %d", c, mb,
 * r), or NULL for nothing in particular. */
void ts_watchdog_context(const char *fmt, int a, int b, int c);
/* Entering a blocking communication call: action ("all-reduce", "receive", ...), the
 * communicator's name ("dp", "pp", "tp", "embed", "world") and the peer's rank in it
 * (-1 for a collective). */
void ts_watchdog_wait_begin(const char *action, const char *comm, int peer);
/* The call returned. */
void ts_watchdog_wait_end(void);
/* Something completed (a non-blocking test that finished). */
void ts_watchdog_progress(void);

#endif
