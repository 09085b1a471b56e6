#include <stdio.h>
#include <string.h>

#include <mpi.h>

#include "cli/cli.h"
#include "core/log.h"

int ts_cli_mpi_main(int argc, char **argv, const char *help, ts_cli_mpi_run_fn run)
{
    if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        fputs(help, stdout);
        return 0;
    }
    MPI_Init(&argc, &argv);
    int rank, world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    ts_log_set_rank(rank);
    int code = run(argc, argv, rank, world_size);
    MPI_Finalize();
    return code;
}

int ts_cli_parse_config_args(int argc, char **argv, int first, const char **positional,
                             const char **sets, int max_sets, int *n_sets, int print_errors)
{
    *positional = NULL;
    *n_sets = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *set = NULL;
        if (!strcmp(a, "--set")) {
            if (i + 1 >= argc) {
                if (print_errors) fprintf(stderr, "tessera: error: --set needs KEY=VALUE\n");
                return -1;
            }
            set = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            set = a + 6;
        } else if (a[0] == '-' && a[1] == '-') {
            if (print_errors)
                fprintf(stderr, "tessera: error: unknown option '%s' (see --help)\n", a);
            return -1;
        } else if (!*positional) {
            *positional = a;
            continue;
        } else {
            if (print_errors)
                fprintf(stderr, "tessera: error: unexpected argument '%s' (one CONFIG only)\n", a);
            return -1;
        }
        if (*n_sets == max_sets) {
            if (print_errors) fprintf(stderr, "tessera: error: too many --set options\n");
            return -1;
        }
        sets[(*n_sets)++] = set;
    }
    return 0;
}
