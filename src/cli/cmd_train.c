#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "cli/cli.h"
#include "config/config.h"
#include "core/log.h"
#include "kernels/kernels.h"
#include "topology/topology.h"
#include "train/trainer.h"

static const char *k_help =
    "usage: tessera train CONFIG [--set KEY=VALUE ...]\n"
    "\n"
    "Train the model described by the libconfig file CONFIG. Run it under mpirun or srun\n"
    "with parallel.pp * parallel.dp * parallel.tp ranks (one rank: run it directly).\n"
    "\n"
    "  --set KEY=VALUE   override a config key, e.g. --set train.steps=20\n"
    "                    --set parallel.schedule=gpipe --set train.lr=1e-3\n"
    "                    (values are read as libconfig reads one; a bare word is a string)\n"
    "\n"
    "Per-step metrics go to log.metrics (JSON Lines); progress goes to stderr.\n";

static int run(int argc, char **argv, int rank, int world_size)
{
    const char *path = NULL, *sets[256];
    int n_sets = 0;
    if (ts_cli_parse_config_args(argc, argv, 2, &path, sets, 256, &n_sets, rank == 0) != 0)
        return 2;
    if (!path) {
        if (rank == 0) fprintf(stderr, "tessera: error: train needs a CONFIG file\n\n%s", k_help);
        return 2;
    }

    /* Every rank reads and validates the same config, so every rank reaches the same
     * verdict without a collective; rank 0 alone prints it. */
    ts_config cfg;
    if (ts_config_load(&cfg, path, sets, n_sets, world_size) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        return 1;
    }
    ts_log_set_quiet(!cfg.log.progress);

    /* The grid's communicators and this rank's cores (and thread count). */
    ts_topology topo;
    if (ts_topo_init(&topo, &cfg, MPI_COMM_WORLD) != TS_OK ||
        ts_topo_bind(&topo, &cfg) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        ts_topo_free(&topo);
        return 1;
    }

    size_t n_params = ts_model_logical_params(&cfg.model);
    ts_log_info("tessera: gpt2 %d layers, %d heads, %d embd, vocab %d, seq %d: %.2fM parameters",
                cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.model.vocab_size,
                cfg.model.seq_len, (double)n_params / 1e6);
    ts_log_info("tessera: grid pp=%d dp=%d tp=%d (%d ranks, %s), global batch %d x %d tokens, "
                "%d micro-batches of %d per replica, schedule %s, %d threads per rank (%s binding)",
                cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.tp, world_size, cfg.parallel.order,
                cfg.train.global_batch, cfg.model.seq_len, ts_config_num_microbatches(&cfg),
                cfg.parallel.micro_batch, cfg.parallel.schedule, topo.threads, topo.binding);

    ts_trainer t;
    if (ts_trainer_init(&t, &cfg, &topo) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        ts_topo_free(&topo);
        return 1;
    }
    ts_status st = ts_trainer_run(&t);
    if (st != TS_OK) ts_log_error("%s", ts_error_message());
    ts_trainer_free(&t);
    ts_topo_free(&topo);
    return st == TS_OK ? 0 : 1;
}

int ts_cmd_train(int argc, char **argv)
{
    return ts_cli_mpi_main(argc, argv, k_help, run);
}
