/* tessera ckpt: inspect (info) or check (verify) a checkpoint, in one process (no MPI):
 * the reader opens the files itself, so no grid, config or mpirun is needed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/reader.h"
#include "cli/cli.h"
#include "core/fsutil.h"

static const char *k_help =
    "usage: tessera ckpt info DIR\n"
    "       tessera ckpt verify DIR\n"
    "\n"
    "Inspect or check a checkpoint, in one process (no mpirun). DIR is a step directory\n"
    "(CKPT_DIR/step_NNNNNNNN, holding state.json) or a checkpoint.dir whose `latest` file\n"
    "names the newest complete step directory.\n"
    "\n"
    "  info DIR      print a summary on stdout: the step (the next one to run), the model,\n"
    "                the grid it was saved from, the data position, every file with its\n"
    "                size, and every tensor with its dtype, shape and size. It reads\n"
    "                state.json and the files' headers only: it checks their structure but\n"
    "                not the tensors' bytes (that is what verify does).\n"
    "  verify DIR    read the whole checkpoint and check it: state.json, every tensor the\n"
    "                checkpoint's model defines present with its shape (weights, exp_avg,\n"
    "                exp_avg_sq) and no other, each file's size and header checksum, the\n"
    "                checksum of every chunk of every tensor, and a llama checkpoint's\n"
    "                config.json (Hugging Face's: present, with the model's values). Prints\n"
    "                \"DIR: OK: ...\" on stdout, or one message on stderr naming the file\n"
    "                (and tensor) at fault.\n"
    "\n"
    "Exit codes of verify (the same for info where it applies):\n"
    "  0  the checkpoint is complete and every checksum matches\n"
    "  1  any other error (stdout cannot be written)\n"
    "  2  usage error (a missing or unknown argument)\n"
    "  3  not a usable checkpoint state: DIR does not exist or holds neither state.json\n"
    "     nor `latest`, `latest` is unreadable or names a missing directory, state.json is\n"
    "     missing, not JSON, or lacks what a checkpoint records\n"
    "  4  incomplete: a file or tensor is missing, a file is truncated, a tensor has the\n"
    "     wrong dtype or shape\n"
    "  5  corrupt: a checksum does not match (a damaged byte, an edited header), a file\n"
    "     grew, or a file holds a tensor the model does not define\n"
    "\n"
    "A checkpoint that verifies loads into `tessera train` with checkpoint.load = DIR on any\n"
    "grid, given the same model keys and train.global_batch.\n";

static int usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "tessera: error: ckpt: %s%s%s%s\n\n%s", what, arg ? " '" : "", arg ? arg : "",
            arg ? "'" : "", k_help);
    return 2;
}

/* DIR or DIR/latest -> the step directory. A `latest` naming a directory that is gone is
 * said as such (the reader would only see a missing directory). Returns 0 or the exit
 * code, after printing the message. */
static int resolve(const char *dir, char *step_dir, size_t cap)
{
    /* A step directory that lost its state.json (a save that never finished, a deleted
     * file) still holds its tensor files: let the reader say what is missing, rather
     * than take it for a checkpoint.dir without `latest`. */
    static const char *const k_files[] = {"model.safetensors", "optimizer.safetensors",
                                          "model.safetensors.index.json", "latest"};
    char path[TS_PATH_MAX + 64];
    struct stat sb;
    bool step_files = false;
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, k_files[i]);
        if (stat(path, &sb) == 0) {
            step_files = i < 3;
            break;
        }
    }
    if (step_files && strlen(dir) < cap) {
        snprintf(step_dir, cap, "%s", dir);
        return 0;
    }
    if (ts_ckpt_resolve(dir, step_dir, cap) != TS_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return TS_CKPT_BAD_STATE;
    }
    if (strcmp(step_dir, dir) != 0 && stat(step_dir, &sb) != 0) {
        fprintf(stderr,
                "tessera: error: %s/latest names %s, which %s (%s): the checkpoint it named "
                "was deleted or moved; point `latest` at an existing step directory or give "
                "one directly\n",
                dir, step_dir, errno == ENOENT ? "does not exist" : "cannot be read",
                strerror(errno));
        return TS_CKPT_BAD_STATE;
    }
    return 0;
}

static int cmd_verify(const char *dir)
{
    char step_dir[TS_PATH_MAX];
    int rc = resolve(dir, step_dir, sizeof step_dir);
    if (rc != 0) return rc;
    ts_error_clear();
    ts_ckpt_verdict v = ts_ckpt_verify(step_dir, true);
    if (v != TS_CKPT_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return (int)v;
    }
    if (ts_stdout_check() != TS_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    return 0;
}

static int cmd_info(const char *dir)
{
    char step_dir[TS_PATH_MAX];
    int rc = resolve(dir, step_dir, sizeof step_dir);
    if (rc != 0) return rc;
    /* Open it once first for the verdict: print_info only says that it failed. */
    ts_ckpt_reader r;
    if (ts_ckpt_reader_open(&r, step_dir) != TS_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return r.verdict != TS_CKPT_OK ? (int)r.verdict : 1;
    }
    ts_ckpt_reader_close(&r);
    if (ts_ckpt_print_info(step_dir) != TS_OK || ts_stdout_check() != TS_OK) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    return 0;
}

static bool is_help(const char *a)
{
    return !strcmp(a, "--help") || !strcmp(a, "-h");
}

int ts_cmd_ckpt(int argc, char **argv)
{
    /* argv: tessera ckpt [info|verify] [DIR]; --help anywhere after ckpt asks for help. */
    for (int i = 2; i < argc; i++)
        if (is_help(argv[i])) {
            fputs(k_help, stdout);
            return 0;
        }
    if (argc < 3) return usage_error("needs a command: info DIR or verify DIR", NULL);
    const char *cmd = argv[2];
    if (strcmp(cmd, "info") != 0 && strcmp(cmd, "verify") != 0)
        return usage_error(cmd[0] == '-' ? "unknown option" : "unknown command (info or verify)",
                           cmd);
    if (argc < 4) return usage_error(!strcmp(cmd, "info") ? "info needs DIR" : "verify needs DIR",
                                     NULL);
    if (argv[3][0] == '-') return usage_error("unknown option", argv[3]);
    if (argc > 4) return usage_error("unexpected argument", argv[4]);
    if (argv[3][0] == '\0') return usage_error("DIR is empty", NULL);
    return !strcmp(cmd, "info") ? cmd_info(argv[3]) : cmd_verify(argv[3]);
}
