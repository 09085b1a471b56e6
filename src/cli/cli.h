/* Subcommands of the `tessera` program. Each returns the process exit code. */
#ifndef TS_CLI_H
#define TS_CLI_H

int ts_cmd_train(int argc, char **argv);
int ts_cmd_data(int argc, char **argv);
int ts_cmd_topo(int argc, char **argv);
int ts_cmd_plan(int argc, char **argv);

/* The shape every MPI subcommand shares: `--help` without MPI, else MPI_Init, set the
 * log rank, run(argc, argv, rank, world_size), MPI_Finalize; returns run's code. */
typedef int (*ts_cli_mpi_run_fn)(int argc, char **argv, int rank, int world_size);
int ts_cli_mpi_main(int argc, char **argv, const char *help, ts_cli_mpi_run_fn run);

/* Collect `--set KEY=VALUE` / `--set=KEY=VALUE` options from argv[first..argc) into
 * `sets` (pointers into argv) and the one positional argument into *positional.
 * Returns 0, or prints a usage error (when print_errors) and returns -1. */
int ts_cli_parse_config_args(int argc, char **argv, int first, const char **positional,
                             const char **sets, int max_sets, int *n_sets, int print_errors);

#endif
