/* Fuzz the config loader: a libconfig file plus `--set` overrides, as `tessera plan`
 * and `tessera train` call it (world_size 0: no grid-size check).
 *
 * Input: byte 0 is a mode byte; the rest is text. (mode & 0x1f) % 17 = K: the last K
 * newline-separated lines of the text are the overrides "a.b=value" (in order), the
 * lines before them the config file. mode & 0x80: load without a file (path NULL),
 * only the overrides. Inputs whose file part holds "@include" are skipped: an include
 * names any file on this machine (/dev/zero, /dev/stdin), which is not the parser's
 * problem. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "fuzz_util.h"

#define MAX_OVERRIDES 16

static const char *cfg_path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir();
    cfg_path = fuzz_path("fuzz.cfg");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int n_over = (data[0] & 0x1f) % (MAX_OVERRIDES + 1);
    int no_file = (data[0] & 0x80) != 0;

    /* One NUL-terminated copy of the text; overrides are cut off its end in place. */
    size_t len = size - 1;
    char *text = malloc(len + 1);
    if (!text) abort();
    memcpy(text, data + 1, len);
    text[len] = '\0';

    const char *overrides[MAX_OVERRIDES];
    int k = n_over;
    size_t file_len = len;
    while (k > 0) {
        /* The last line of text[0, file_len) becomes overrides[k-1]. */
        size_t start = file_len;
        while (start > 0 && text[start - 1] != '\n') start--;
        overrides[--k] = text + start;
        if (start == 0) {
            file_len = 0;
            break;
        }
        text[start - 1] = '\0';
        file_len = start - 1;
    }
    /* Fewer lines than K: the overrides are the lines there are. */
    const char *const *ov = overrides + k;
    n_over -= k;

    int skip = !no_file && file_len >= 8 && memmem(text, file_len, "@include", 8) != NULL;
    if (!skip) {
        if (!no_file) fuzz_write(cfg_path, (const uint8_t *)text, file_len);
        ts_config cfg;
        if (ts_config_load(&cfg, no_file ? NULL : cfg_path, ov, n_over, 0) == TS_OK) {
            (void)ts_config_num_microbatches(&cfg);
            free(ts_config_to_json(&cfg));
        }
    }
    free(text);
    return 0;
}
