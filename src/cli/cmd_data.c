#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "core/fsutil.h"
#include "dataset/loader.h"

static const char *k_help =
    "usage: tessera data TEXT_FILE OUT.bin\n"
    "\n"
    "Write the bytes of TEXT_FILE as tokens (vocab 256) into an llm.c token shard:\n"
    "a 256 x int32 header [20240520, 1, count] followed by count uint16 tokens.\n"
    "The shard is written to a temporary name and renamed when complete.\n"
    "Refused before anything is written: an OUT.bin that exists and is not a regular\n"
    "file, or is TEXT_FILE itself; a TEXT_FILE that already is a token shard.\n";

int ts_cmd_data(int argc, char **argv)
{
    if (argc == 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        fputs(k_help, stdout);
        return 0;
    }
    if (argc != 4) {
        fprintf(stderr, "tessera: error: data needs TEXT_FILE and OUT.bin\n\n%s", k_help);
        return 2;
    }
    if (ts_data_write_text_shard(argv[2], argv[3]) != 0) {
        fprintf(stderr, "tessera: error: %s\n", ts_error_message());
        return 1;
    }
    ts_dataset ds;
    const char *out = argv[3];
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
