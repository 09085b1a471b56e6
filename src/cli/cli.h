/* Subcommands of the `tessera` program. Each returns the process exit code. */
#ifndef TS_CLI_H
#define TS_CLI_H

#include <stdbool.h>

#include "config/config.h"

int ts_cmd_train(int argc, char **argv);
int ts_cmd_data(int argc, char **argv);
int ts_cmd_topo(int argc, char **argv);
int ts_cmd_plan(int argc, char **argv);
int ts_cmd_ckpt(int argc, char **argv);   /* one process, no MPI */
int ts_cmd_sample(int argc, char **argv); /* one process, no MPI */
int ts_cmd_eval(int argc, char **argv);

/* The shape every MPI subcommand shares: `--help` without MPI, else ts_comm_init, set
 * the log rank, run(argc, argv, rank, world_size), ts_comm_finalize; returns run's code. */
/* "--name VALUE" or "--name=VALUE" at argv[*i]: the value, advancing *i past it; NULL
 * when argv[*i] is not --name. *missing is set when --name is the last argument. */
const char *ts_cli_opt_value(int argc, char **argv, int *i, const char *name, int *missing);

typedef int (*ts_cli_mpi_run_fn)(int argc, char **argv, int rank, int world_size);
int ts_cli_mpi_main(int argc, char **argv, const char *help, ts_cli_mpi_run_fn run);

/* Collect `--set KEY=VALUE` / `--set=KEY=VALUE` options from argv[first..argc) into
 * `sets` (pointers into argv) and the one positional argument into *positional.
 * Returns 0, or prints a usage error (when print_errors) and returns -1. */
int ts_cli_parse_config_args(int argc, char **argv, int first, const char **positional,
                             const char **sets, int max_sets, int *n_sets, int print_errors);

/* Parse argv[2..] (CONFIG and --set options) and load the config on every rank of
 * the world group, then agree: any rank's usage or config error fails every rank (the
 * lowest failing rank's message, naming it, printed once by rank 0, with `help` after
 * a usage error), and ranks whose resolved configs differ fail naming the first
 * differing key. Without CONFIG, `defaults` (n_defaults overrides) come before the
 * user's --set options, or it is a usage error when need_config. Collective. Returns 0,
 * or the exit code every rank returns (2 usage, 1 config). */
int ts_cli_load_config(int argc, char **argv, int world_size, const char *const *defaults,
                       int n_defaults, bool need_config, const char *help, ts_config *cfg);

#endif
