#include "core/signals.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig) { stop_signal = sig; }

void ts_stop_signals_catch(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* blocking calls (MPI, I/O) carry on; the step ends normally */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

int ts_stop_signal(void) { return stop_signal; }

const char *ts_stop_signal_name(int sig)
{
    return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a stop signal";
}
