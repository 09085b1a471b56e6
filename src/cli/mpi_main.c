/* The MPI driver every rank-parallel subcommand (train, topo, ckpt, sample) runs under:
 * --help without MPI, then MPI up, the world group, the command, and MPI down. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "core/env.h"
#include "core/log.h"
#include "core/watchdog.h"

/* Test hook: TS_TEST_INIT_STALL_S=seconds makes every rank wait that long before
 * the communication layer starts, so a test can signal a rank still starting. */
static void init_stall_for_test(void)
{
    const char *env = ts_env(TS_ENV_TEST_INIT_STALL_S);
    if (!env) return;
    fprintf(stderr, "tessera: TS_TEST_INIT_STALL_S=%s: stalling before the communication "
                    "layer starts\n",
            env);
    struct timespec ts = {.tv_sec = atoi(env)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int ts_cli_mpi_main(int argc, char **argv, const char *help, ts_cli_mpi_run_fn run)
{
    if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        fputs(help, stdout);
        return 0;
    }
    /* Only this thread communicates, but `train` runs a watchdog thread beside it
     * (core/watchdog.h); cmd_train checks the thread level (ts_comm_threads_ok) before
     * starting it. */
    init_stall_for_test();
    ts_comm_init(&argc, &argv);
    ts_comm world;
    ts_comm_world(&world);
    ts_log_set_rank(world.rank);
    int code = run(argc, argv, world.rank, world.size);
    /* Finalizing synchronises with the other ranks, so a stopped one can hang it too:
     * the watchdog (when run started one) keeps watching until it returns. */
    ts_comm_finalize();
    ts_watchdog_stop();
    return code;
}

/* Record a usage error (ts_error_message) and print it when asked; returns -1. */
static int usage_error(int print, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int usage_error(int print, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ts_fail("%s", msg);
    if (print) fprintf(stderr, "tessera: error: %s\n", msg);
    return -1;
}

int ts_cli_parse_config_args(int argc, char **argv, int first, const char **positional,
                             const char **sets, int max_sets, int *n_sets, int print_errors)
{
    *positional = NULL;
    *n_sets = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *set = NULL;
        if (!strcmp(a, "--set")) {
            if (i + 1 >= argc) return usage_error(print_errors, "--set needs KEY=VALUE");
            set = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            set = a + 6;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            /* Help is printed only when asked for alone (before MPI starts). */
            return usage_error(print_errors,
                               "%s takes no other arguments: run 'tessera %s %s' alone", a,
                               first >= 2 ? argv[1] : "COMMAND", a);
        } else if (a[0] == '-' && a[1] == '-') {
            return usage_error(print_errors, "unknown option '%s' (see --help)", a);
        } else if (!*positional) {
            *positional = a;
            continue;
        } else {
            return usage_error(print_errors, "unexpected argument '%s' (one CONFIG only)", a);
        }
        if (*n_sets == max_sets) return usage_error(print_errors, "too many --set options");
        sets[(*n_sets)++] = set;
    }
    return 0;
}

const char *ts_cli_opt_value(int argc, char **argv, int *i, const char *name, int *missing)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}
