/* The input files of `tessera data`: the command line's files and directories made
 * into one ordered list of documents' files, checked before anything is written. */
#ifndef TS_CORPUS_INPUTS_H
#define TS_CORPUS_INPUTS_H

#include <stdint.h>

#include "core/error.h"

typedef struct {
    char *path;      /* owned */
    uint64_t size;   /* bytes, at the check */
    int jsonl;       /* one document per line (JSON object) instead of one per file */
} ts_corpus_file;

typedef struct {
    ts_corpus_file *files;
    int n;
    uint64_t total_bytes;
} ts_corpus_files;

/* Expand paths in order: a file is itself, a directory every file under it (recursed,
 * not following links to directories; names starting with '.' skipped) in strcmp order
 * of their paths. A file is JSONL when force_jsonl or its name ends in .jsonl or
 * .json-lines. Every file must be a readable regular file, not an llm.c token shard
 * (its magic), and not one of out_prefix's shards (ts_shard_is_output_name). A
 * directory holding no file is an error. */
ts_status ts_corpus_files_collect(ts_corpus_files *out, const char *const *paths, int n_paths,
                                  int force_jsonl, const char *out_prefix);
void ts_corpus_files_free(ts_corpus_files *f);

#endif
