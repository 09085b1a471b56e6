#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "core/log.h"
#include "core/signals.h"
#include "core/watchdog.h"
#include "kernels/kernels.h"
#include "plan/model_cost.h"
#include "topology/topology.h"
#include "train/trainer.h"

static const char *k_help =
    "usage: tessera train CONFIG [--set KEY=VALUE ...]\n"
    "\n"
    "Train the model described by the libconfig file CONFIG. Run it under mpirun or srun\n"
    "with parallel.pp * parallel.dp * parallel.cp * parallel.tp ranks (one rank: run it\n"
    "directly).\n"
    "\n"
    "  --set KEY=VALUE   override a config key, e.g. --set train.steps=20\n"
    "                    --set parallel.schedule=gpipe --set train.lr=1e-3\n"
    "                    (values are read as libconfig reads one; a bare word is a string)\n"
    "\n"
    "Per-step metrics go to log.metrics (JSON Lines); progress goes to stderr.\n";

static int run(int argc, char **argv, int rank, int world_size)
{
    /* Again after MPI_Init, in case the MPI library installed handlers of its own. */
    ts_stop_signals_catch();
    ts_config cfg;
    int code = ts_cli_load_config(argc, argv, world_size, NULL, 0, true, k_help, &cfg);
    if (code != 0) return code;
    ts_log_set_quiet(!cfg.log.progress);

    /* The watchdog ends the job when this rank makes no progress for train.timeout_s
     * (a stopped or hung peer); ts_cli_mpi_main stops it after ts_comm_finalize. */
    if (cfg.train.timeout_s > 0) {
        char host[TS_HOST_MAX];
        ts_comm_host_name(host, sizeof host);
        if (!ts_comm_threads_ok())
            ts_log_warn("this MPI library offers no thread support (thread level below "
                        "FUNNELED), so the watchdog (train.timeout_s) is off");
        else if (ts_watchdog_start(cfg.train.timeout_s, rank, host) != TS_OK)
            ts_log_any("tessera: warning: %s", ts_error_message());
    }
    ts_watchdog_context("setup: the grid's communicators and core binding", 0, 0, 0);

    /* The grid's communicators and this rank's cores (and thread count). */
    ts_topology topo;
    ts_comm world;
    ts_comm_world(&world);
    if (ts_topo_init(&topo, &cfg, &world) != TS_OK ||
        ts_topo_bind(&topo, &cfg) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        ts_topo_free(&topo);
        return 1;
    }
    ts_cpu_set_threads(topo.threads); /* the kernels' and OpenBLAS's one thread budget */

    size_t n_params = ts_model_logical_params(&cfg.model);
    /* Llama's shapes that n_embd and n_head do not imply: its key/value heads (GQA) and
     * SwiGLU's hidden width. */
    char kv[32] = "", ffn[32] = "";
    if (!strcmp(cfg.model.arch, "llama") && ts_model_is_mla(&cfg.model))
        /* MLA: the latent ranks instead of key/value heads. */
        snprintf(kv, sizeof kv, " (MLA q %d kv %d)", cfg.model.q_lora_rank,
                 cfg.model.kv_lora_rank);
    else if (!strcmp(cfg.model.arch, "llama"))
        snprintf(kv, sizeof kv, " (%d kv)", cfg.model.n_kv_head);
    if (!strcmp(cfg.model.arch, "llama")) {
        snprintf(ffn, sizeof ffn, ", ffn %d", cfg.model.ffn_hidden);
    }
    /* An MoE model: its experts, and the parameters one token uses (Megatron's "active"). */
    char moe[96] = "";
    if (cfg.model.moe_experts > 0)
        snprintf(moe, sizeof moe, ", %d experts top-%d of %d (%.2fM active)",
                 cfg.model.moe_experts, cfg.model.moe_top_k, cfg.model.moe_ffn_hidden,
                 (double)ts_model_active_params(&cfg.model) / 1e6);
    char mtp[32] = "";
    if (cfg.model.mtp_layers > 0)
        snprintf(mtp, sizeof mtp, ", %d MTP module%s", cfg.model.mtp_layers,
                 cfg.model.mtp_layers == 1 ? "" : "s");
    ts_log_info("tessera: %s %d layers, %d heads%s, %d embd%s, vocab %d, seq %d: %.2fM "
                "parameters%s%s",
                cfg.model.arch, cfg.model.n_layer, cfg.model.n_head, kv, cfg.model.n_embd, ffn,
                cfg.model.vocab_size, cfg.model.seq_len, (double)n_params / 1e6, moe, mtp);
    const int n_mb = ts_config_num_microbatches(&cfg);
    /* The rank order with all four axes (a three-name order places cp after tp). */
    char order[32] = "";
    for (int a = 0; a < TS_N_AXES; a++)
        snprintf(order + strlen(order), sizeof order - strlen(order), "%s%s", a ? "-" : "",
                 ts_axis_name(topo.grid.order[a]));
    /* ZeRO shards over the replica group (dp * cp ranks holding the same weights): with
     * one replica there is nothing to shard, and every level runs as 0. */
    const int replicas = cfg.parallel.dp * cfg.parallel.cp;
    const int zero = replicas > 1 ? cfg.parallel.zero : 0;
    ts_log_info("tessera: grid pp=%d dp=%d cp=%d tp=%d (%d rank%s, %s), ZeRO-%d, global batch "
                "%d x %d tokens, %d micro-batch%s of %d per replica, schedule %s, %d thread%s "
                "per rank (%s binding)",
                cfg.parallel.pp, cfg.parallel.dp, cfg.parallel.cp, cfg.parallel.tp, world_size,
                world_size == 1 ? "" : "s", order, zero, cfg.train.global_batch,
                cfg.model.seq_len, n_mb, n_mb == 1 ? "" : "es", cfg.parallel.micro_batch,
                cfg.parallel.schedule, topo.threads, topo.threads == 1 ? "" : "s", topo.binding);
    if (cfg.parallel.zero > 0 && replicas == 1)
        ts_log_warn("parallel.zero = %d runs as ZeRO-0: ZeRO shards over the dp*cp replica "
                    "group, and dp*cp = %d*%d = 1 (raise parallel.dp, or set parallel.zero = 0 "
                    "to silence this)",
                    cfg.parallel.zero, cfg.parallel.dp, cfg.parallel.cp);

    ts_trainer t;
    if (ts_trainer_init(&t, &cfg, &topo) != TS_OK) {
        ts_log_error("%s", ts_error_message());
        ts_topo_free(&topo);
        return 1;
    }
    /* MFU's numerator: the planner's model FLOPs per step (plan/model_cost.h), one
     * formula for plan and train; the trainer, a layer below the planner, is handed it. */
    t.model_flops = ts_plan_model_flops(&cfg.model, cfg.train.global_batch);
    /* Packed documents: attention counted by the pairs each step computes. */
    if (cfg.data.document_mask)
        t.attn_flops_per_pair = ts_plan_attention_flops_per_pair(&cfg.model);
    ts_status st = ts_trainer_run(&t);
    if (st != TS_OK) ts_log_error("%s", ts_error_message());
    const bool preempted = t.preempted;
    const int stop_signal = t.stop_signal;
    ts_trainer_free(&t);
    ts_topo_free(&topo);
    /* Stopped by SIGTERM/SIGUSR1 with the state in checkpoint.dir: a distinct code a job
     * script requeues on. Without checkpoint.dir nothing was saved: 128 + the signal, as
     * a shell reports a process the signal ended, so nothing requeues a lost run. */
    if (st != TS_OK) return 1;
    /* Under mpirun a rank's non-zero exit makes mpirun print that the job was aborted:
     * say first that the state is safe, and how to go on. */
    if (preempted)
        ts_log_info("stopped by a signal with the state saved in %s: exit %d; resume with "
                    "checkpoint.load = \"latest\" (an \"aborted\" banner from mpirun "
                    "after this line is mpirun reporting that exit code)",
                    cfg.checkpoint.dir, TS_EXIT_PREEMPTED);
    return preempted ? TS_EXIT_PREEMPTED : stop_signal ? 128 + stop_signal : 0;
}

int ts_cmd_train(int argc, char **argv)
{
    /* From the start, before MPI_Init (a tenth of a second or more under mpirun): a
     * preemption notice during set-up must not kill the rank (probe T19: SIGUSR1
     * forwarded by mpirun while the ranks were in MPI_Init killed them with 128 + 10). */
    ts_stop_signals_catch();
    return ts_cli_mpi_main(argc, argv, k_help, run);
}
