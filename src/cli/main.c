/* tessera: a 4D-parallel (pipeline x data x context x tensor) trainer of GPT-2- and
 * Llama-style models, and its planner, checkpoint, sampling and data tools. */
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "kernels/cpu/blas_core.h"

static const char *k_usage =
    "usage: tessera <command> [options]\n"
    "\n"
    "commands:\n"
    "  train CONFIG [--set KEY=VALUE ...]  train a model (run under mpirun/srun;\n"
    "                                      world size = parallel.pp * dp * cp * tp)\n"
    "  plan CONFIG [--set KEY=VALUE ...]   partition, schedule and simulate a step (one process;\n"
    "                                      --json, --cost uniform, --trace F, --svg F)\n"
    "  ckpt info|verify DIR                inspect a checkpoint, or check every byte of it\n"
    "                                      (one process; DIR: a step dir or a checkpoint.dir)\n"
    "  sample DIR --prompt TEXT [--ids --tokens N --temperature X --top-k K --seed S]\n"
    "                                      generate text from a checkpoint (one process)\n"
    "  eval DIR --hellaswag FILE [--json]  score a checkpoint on HellaSwag (any grid, under\n"
    "                                      mpirun; acc, acc_norm, acc_norm_tokens)\n"
    "  data INPUT... --out PREFIX          tokenize text/JSONL files and directories into llm.c\n"
    "                                      shards (--encoding bytes|gpt2|llama3; one process)\n"
    "  topo [CONFIG] [--set KEY=VALUE ...] print the rank -> (pp,dp[,cp],tp) map, hosts, binding\n"
    "\n"
    "`tessera COMMAND --help` describes each command's options.\n"
    "Configs are libconfig files; see configs/tiny.cfg for every key with its default.\n";

int main(int argc, char **argv)
{
    /* Buffers of 1 MiB and more get mappings of their own, returned to the system when
     * freed: ZeRO-2/3's chunk buffers come and go every step, and glibc's adaptive
     * threshold would otherwise rise past them after the first large free and keep them
     * resident in the heap (the memory check and the peak would disagree). */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    /* A closed pipe (tessera sample | head) makes a write fail with EPIPE, which each
     * command checks and reports ("writing standard output failed", exit 1), instead of
     * killing the process by SIGPIPE with no word. Set before MPI starts; ignored
     * signals stay ignored across the BLAS re-execution below. */
    signal(SIGPIPE, SIG_IGN);
    /* Before anything uses BLAS or MPI: may re-execute with a better OpenBLAS kernel. */
    ts_blas_select_core(argc, argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        fputs(k_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "train")) return ts_cmd_train(argc, argv);
    if (!strcmp(argv[1], "data")) return ts_cmd_data(argc, argv);
    if (!strcmp(argv[1], "topo")) return ts_cmd_topo(argc, argv);
    if (!strcmp(argv[1], "plan")) return ts_cmd_plan(argc, argv);
    if (!strcmp(argv[1], "ckpt")) return ts_cmd_ckpt(argc, argv);
    if (!strcmp(argv[1], "sample")) return ts_cmd_sample(argc, argv);
    if (!strcmp(argv[1], "eval")) return ts_cmd_eval(argc, argv);
    fprintf(stderr, "tessera: error: unknown command '%s'\n\n%s", argv[1], k_usage);
    return 2;
}
