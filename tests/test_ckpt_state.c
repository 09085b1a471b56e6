/* A checkpoint's state.json as the reader takes it (checkpoint/reader.c): its model keys
 * are held to a config's ranges and relations even when its own checksum is right
 * (probe D10 and Q7: n_layer = 2^30 made ckpt info and verify allocate without end,
 * n_embd = vocab = 2^30 overflowed the shard arithmetic, and n_head 3 with n_embd 128
 * verified OK), and a recorded learning-rate schedule must be whole. Each state is written with a correct
 * state_crc32 (ts_ckpt_state_crc), so only the check under test can refuse it. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint/reader.h"
#include "test_util.h"

static char g_dir[200];

/* A step directory step_00000000 holding `state` (with its crc) and no files. */
static const char *write_state(json_t *state)
{
    static char step[256];
    snprintf(step, sizeof step, "%s/step_00000000", g_dir);
    ts_test_remove_dir(step);
    CHECK(mkdir(step, 0777) == 0);
    json_object_set_new(state, "state_crc32", json_integer((json_int_t)ts_ckpt_state_crc(state)));
    char *text = json_dumps(state, JSON_INDENT(1));
    ts_test_write_file(step, "state.json", text);
    free(text);
    json_decref(state);
    return step;
}

static json_t *state_with(int n_layer, int n_head, int n_embd, int vocab, int seq)
{
    return json_pack("{s:s, s:i, s:i, s:{s:I, s:I, s:i, s:[]}, s:i, s:{}, s:{}, "
                     "s:{s:{s:s, s:i, s:i, s:i, s:i, s:i}, s:{s:f, s:f, s:i, s:i}}}",
                     "format", "tessera-checkpoint", "version", 1, "step", 0, "data",
                     "sequences_consumed", (json_int_t)0, "global_batch", (json_int_t)8,
                     "seq_len", seq, "train", "chunk_bytes", 1 << 26, "files", "checksums",
                     "config", "model", "arch", "gpt2", "n_layer", n_layer, "n_head", n_head,
                     "n_embd", n_embd, "vocab_size", vocab, "seq_len", seq, "train", "lr",
                     1e-3, "min_lr", 1e-4, "warmup", 2, "steps", 10);
}

static void expect_model_refused(json_t *state, const char *want)
{
    const char *step = write_state(state);
    ts_ckpt_reader r;
    ts_error_clear();
    ts_status st = ts_ckpt_reader_open(&r, step);
    CHECKF(st == TS_ERR && strstr(ts_error_message(), "its model") &&
               strstr(ts_error_message(), want) && r.verdict == TS_CKPT_BAD_STATE,
           "%s: %s (verdict %d)", want, ts_error_message(), (int)r.verdict);
    if (st == TS_OK) ts_ckpt_reader_close(&r);
}

static void test_model_keys(void)
{
    expect_model_refused(state_with(1 << 30, 4, 128, 256, 64), "model.n_layer");
    expect_model_refused(state_with(2, 4, 1 << 30, 1 << 30, 64), "model.n_embd");
    expect_model_refused(state_with(2, 3, 128, 256, 64), "n_head");
    /* A valid model passes the model check: what fails next is the (empty) file list. */
    const char *step = write_state(state_with(2, 4, 128, 256, 64));
    ts_ckpt_reader r;
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR && strstr(ts_error_message(), "\"files\""),
           "%s", ts_error_message());
}

/* A recorded schedule must be whole (the reader gets past it to the file list); the
 * values it holds are checked where a resume compares them (test_run_guards.sh). */
static void test_lr_schedule(void)
{
    json_t *s = state_with(2, 4, 128, 256, 64);
    json_object_set_new(s, "lr_schedule",
                        json_pack("{s:s, s:f, s:f, s:i, s:i, s:i}", "name", "wsd", "lr", 2e-3,
                                  "min_lr", 2e-4, "warmup", 5, "length", 100, "decay", 20));
    const char *step = write_state(s);
    ts_ckpt_reader r;
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR && strstr(ts_error_message(), "\"files\""),
           "%s", ts_error_message());
    s = state_with(2, 4, 128, 256, 64);
    json_object_set_new(s, "lr_schedule", json_pack("{s:s}", "name", "wsd"));
    step = write_state(s);
    ts_error_clear();
    CHECKF(ts_ckpt_reader_open(&r, step) == TS_ERR &&
               strstr(ts_error_message(), "lr_schedule is malformed"),
           "%s", ts_error_message());
}

int main(void)
{
    ts_test_make_dir(g_dir, sizeof g_dir, "ts_ckpt_state");
    test_model_keys();
    test_lr_schedule();
    char step[256];
    snprintf(step, sizeof step, "%s/step_00000000", g_dir);
    ts_test_remove_dir(step);
    rmdir(g_dir);
    return ts_test_report();
}
