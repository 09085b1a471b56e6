/* Stop signals: SIGTERM and SIGUSR1, what Slurm sends before it preempts or times out a
 * job, and the first SIGINT (Ctrl-C) ask a run to save and stop at its next step
 * boundary instead of dying. The handler only records the signal; the trainer reads it
 * (ts_stop_signal) where the ranks agree on it, once per step. */
#ifndef TS_CORE_SIGNALS_H
#define TS_CORE_SIGNALS_H

/* Catch SIGTERM, SIGUSR1 and SIGINT from now on (call it first thing). Blocking calls
 * (MPI, I/O) carry on (SA_RESTART). A second SIGTERM or SIGUSR1 changes nothing: Slurm
 * may follow its USR1 with a TERM while the save is running, and that save must finish.
 * The first SIGINT says on stderr that the run will stop after its step and restores
 * SIGINT's default action, so a second Ctrl-C ends the process at once, unsaved (as
 * SIGKILL always does). Calling this again leaves that default in place. */
void ts_stop_signals_catch(void);

/* The stop signal received so far, or 0. */
int ts_stop_signal(void);

/* "SIGTERM", "SIGUSR1", "SIGINT", or "a stop signal". */
const char *ts_stop_signal_name(int sig);

#endif
