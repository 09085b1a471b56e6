#include "core/signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal, interrupted;

static void on_stop_signal(int sig) { stop_signal = sig; }

/* SIGINT (Ctrl-C): recorded like SIGTERM, and said at once, since a step may take
 * minutes and the user must know the press was heard. SA_RESETHAND has already
 * restored the default action, so a second Ctrl-C ends the process at once. write(2) is
 * async-signal-safe; its result is ignored (a closed stderr must not matter). */
static void on_interrupt(int sig)
{
    static const char msg[] = "\ntessera: SIGINT: stopping after this step, saved if "
                              "checkpoint.dir is set (Ctrl-C again stops at once, without "
                              "saving)\n";
    stop_signal = sig;
    interrupted = 1;
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
}

void ts_stop_signals_catch(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* blocking calls (MPI, I/O) carry on; the step ends normally */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    /* Called again after MPI_Init: once a SIGINT has been received its default action
     * stays, so the second Ctrl-C still kills. */
    if (interrupted) return;
    sa.sa_handler = on_interrupt;
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    sigaction(SIGINT, &sa, NULL);
}

int ts_stop_signal(void) { return stop_signal; }

const char *ts_stop_signal_name(int sig)
{
    return sig == SIGTERM   ? "SIGTERM"
           : sig == SIGUSR1 ? "SIGUSR1"
           : sig == SIGINT  ? "SIGINT"
                            : "a stop signal";
}
