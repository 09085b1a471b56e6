#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/fsutil.h"
#include "dataset/loader.h"

static const char *k_help =
    "usage: tessera data TEXT_FILE OUT.bin [--format gpt2|llama3]\n"
    "\n"
    "Write the bytes of TEXT_FILE as tokens (vocab 256) into an llm.c token shard:\n"
    "a 256 x int32 header [magic, version, count] followed by count tokens.\n"
    "\n"
    "  --format gpt2     GPT-2's shard, magic 20240520, version 1, uint16 tokens (default)\n"
    "  --format llama3   Llama 3's shard, magic 20240801, version 7, uint32 tokens\n"
    "\n"
    "The shard is written to a temporary name and renamed when complete.\n"
    "Refused before anything is written: an OUT.bin that exists and is not a regular\n"
    "file, or is TEXT_FILE itself; a TEXT_FILE that already is a token shard.\n";

static int usage(const char *what, const char *arg)
{
    fprintf(stderr, "tessera: error: data: %s%s%s%s\n\n%s", what, arg ? " '" : "",
            arg ? arg : "", arg ? "'" : "", k_help);
    return 2;
}

int ts_cmd_data(int argc, char **argv)
{
    if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        fputs(k_help, stdout);
        return 0;
    }
    const char *pos[2] = {NULL, NULL};
    int n_pos = 0;
    ts_shard_format fmt = TS_SHARD_AUTO;
    bool have_fmt = false;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *value = NULL;
        if (!strcmp(a, "--format")) {
            if (i + 1 >= argc) return usage("--format needs a value (gpt2 or llama3)", NULL);
            value = argv[++i];
        } else if (!strncmp(a, "--format=", 9)) {
            value = a + 9;
        } else if (a[0] == '-' && a[1] != '\0') {
            return usage("unknown option", a);
        } else {
            if (n_pos == 2) return usage("unexpected argument", a);
            pos[n_pos++] = a;
            continue;
        }
        if (have_fmt) return usage("--format given twice", NULL);
        if (!ts_shard_format_parse(value, &fmt))
            return usage("--format must be gpt2 or llama3, not", value);
        have_fmt = true;
    }
    if (n_pos != 2) return usage("data needs TEXT_FILE and OUT.bin", NULL);
    if (ts_data_write_text_shard(pos[0], pos[1], fmt) != 0) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    ts_dataset ds;
    const char *out = pos[1];
    if (ts_data_open(&ds, &out, 1, 256) != 0) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    printf("wrote %s: %llu tokens\n", out, (unsigned long long)ds.n_tokens);
    ts_data_close(&ds);
    if (ts_stdout_check() != TS_OK) { /* the report is part of the result */
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    return 0;
}
