/* Stop signals: SIGTERM and SIGUSR1, what Slurm sends before it preempts or times out a
 * job, ask a run to save and stop at its next step boundary instead of dying. The
 * handler only records the signal; the trainer reads it (ts_stop_signal) where the
 * ranks agree on it, once per step. */
#ifndef TS_CORE_SIGNALS_H
#define TS_CORE_SIGNALS_H

/* Catch SIGTERM and SIGUSR1 from now on (call it first thing). Blocking calls (MPI,
 * I/O) carry on (SA_RESTART). A second notice changes nothing: Slurm may follow its USR1
 * with a TERM while the save is running, and that save must finish. (SIGINT and SIGKILL
 * still end a run at once.) */
void ts_stop_signals_catch(void);

/* The stop signal received so far, or 0. */
int ts_stop_signal(void);

/* "SIGTERM", "SIGUSR1", or "a stop signal". */
const char *ts_stop_signal_name(int sig);

#endif
