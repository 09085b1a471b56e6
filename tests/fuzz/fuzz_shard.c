/* Fuzz the token data reader: llm.c shards and text files, one or several read as one
 * stream, then windows and a micro-batch drawn from it as the trainer does.
 *
 * Input: 4 header bytes, then the files' bytes separated by SEP ("--shard--"):
 *   byte 0   number of files = 1 + (b & 0x7f) % 3 (fewer if the input has fewer parts);
 *            b & 0x80: the files are named *.bin (never read as text)
 *   byte 1-2 vocab_size = 1 + little-endian uint16 (1..65536)
 *   byte 3   T = 1 + b % 32
 * When the files open, the loader's promises are checked: every token is < vocab_size
 * and each target is the next input; then the same files go through the sampler (the
 * batch rule) as one dataset or, with two or more files, a blend of two, shuffled when
 * byte 3's top bit is set, and a micro-batch drawn from it must keep the promises too. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dataset/loader.h"
#include "dataset/sampler.h"
#include "fuzz_util.h"

#define MAX_FILES 3
#define SEP "--shard--"

static const char *paths[2][MAX_FILES]; /* [0] plain names, [1] *.bin */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir();
    const char *names[2][MAX_FILES] = {{"a", "b", "c"}, {"a.bin", "b.bin", "c.bin"}};
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < MAX_FILES; i++) paths[e][i] = fuzz_path(names[e][i]);
    return 0;
}

/* The loader's contract for one window of T inputs and targets. */
static void check_window(const int *in, const int *tg, int T, int vocab)
{
    for (int j = 0; j < T; j++) {
        if (in[j] < 0 || in[j] >= vocab || tg[j] < 0 || tg[j] >= vocab) abort();
        if (j + 1 < T && tg[j] != in[j + 1]) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4) return 0;
    int want = 1 + (data[0] & 0x7f) % MAX_FILES;
    const char *const *files = paths[data[0] >> 7];
    int vocab = 1 + (data[1] | data[2] << 8);
    int T = 1 + data[3] % 32;
    const uint8_t *p = data + 4, *end = data + size;

    int n = 0;
    while (n < want) {
        const uint8_t *sep = n + 1 < want ? memmem(p, (size_t)(end - p), SEP, strlen(SEP)) : NULL;
        const uint8_t *stop = sep ? sep : end;
        fuzz_write(files[n++], p, (size_t)(stop - p));
        if (!sep) break;
        p = sep + strlen(SEP);
    }

    ts_dataset ds;
    if (ts_data_open(&ds, files, n, vocab) != TS_OK) return 0;
    uint64_t S = ts_data_num_windows(&ds, T);
    if (S >= 1) {
        int *in = malloc(2 * (size_t)T * sizeof *in), *tg = malloc(2 * (size_t)T * sizeof *tg);
        if (!in || !tg) abort();
        ts_data_window(&ds, 0, T, in, tg);
        check_window(in, tg, T, vocab);
        ts_data_window(&ds, S - 1, T, in, tg);
        check_window(in, tg, T, vocab);
        free(in);
        free(tg);
    }
    ts_data_close(&ds);

    /* The batch rule over the same files: two datasets (weights 0.7 / 0.3) when there
     * are two or more files, the first file alone being the first dataset. */
    int set_of[MAX_FILES] = {0, 1, 1};
    double weights[2] = {0.7, 0.3};
    ts_sampler_spec spec = {.key = "data.train", .patterns = files, .n_patterns = n,
                            .set_of = n > 1 ? set_of : NULL, .n_sets = n > 1 ? 2 : 1,
                            .weights = n > 1 ? weights : NULL, .shuffle = data[3] >> 7,
                            .seed = data[0], .vocab_size = vocab, .seq_len = T};
    ts_sampler sm;
    if (ts_sampler_open(&sm, &spec) != TS_OK) return 0;
    int *in = malloc(4 * (size_t)T * sizeof *in), *tg = malloc(4 * (size_t)T * sizeof *tg);
    if (!in || !tg) abort();
    /* Two micro-batches of two sequences on two replicas, at a step picked by the input. */
    for (int dp_rank = 0; dp_rank < 2; dp_rank++)
        for (int mb = 0; mb < 2; mb++) {
            ts_data_microbatch(&sm, (int64_t)data[1] * 8, 8, 2, dp_rank, 2, mb, T, in, tg);
            check_window(in, tg, T, vocab);
            check_window(in + T, tg + T, T, vocab);
        }
    free(in);
    free(tg);
    ts_sampler_close(&sm);
    return 0;
}
