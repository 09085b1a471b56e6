/* `tessera data`'s corpus pipeline: documents (text files, JSONL lines) read in order,
 * tokenized by worker threads in bounded batches, and written in input order as llm.c
 * shards (shard_writer.h), so the shards are the same for any thread count and memory
 * does not grow with the corpus (a bounded queue of batches, plus the largest
 * document). */
#ifndef TS_CORPUS_H
#define TS_CORPUS_H

#include <stdint.h>

#include "core/error.h"
#include "dataset/loader.h"

typedef struct {
    const char *const *inputs; /* files and directories, in order */
    int n_inputs;
    const char *out_prefix;    /* shards PREFIX_val_NNNNNN.bin, PREFIX_train_NNNNNN.bin */
    const char *encoding;      /* "bytes", "gpt2" or "llama3" */
    const char *ranks;         /* ranks file, or NULL: the encoding's default path */
    int force_jsonl;           /* every input is JSONL */
    const char *text_field;    /* a JSONL line's document: this string field */
    int skip_bad_lines;        /* a JSONL line without it: counted, not an error */
    uint64_t shard_tokens;     /* 1 .. INT32_MAX tokens per shard */
    uint64_t val_tokens;       /* the stream's first val_tokens tokens are validation */
    double val_fraction;       /* or: documents starting in the first fraction of the
                                  input bytes (0: neither; not both) */
    ts_shard_format format;    /* AUTO: uint32 above a 65536-id vocabulary */
    int threads;               /* encoding threads, >= 1 */
    int overwrite;             /* replace PREFIX's existing shards */
    int progress;              /* 1: a progress line on stderr every second (a terminal),
                                  0: one every 30 s */
} ts_corpus_options;

typedef struct {
    uint64_t documents, bytes, tokens, val_tokens, train_tokens;
    uint64_t invalid_utf8_bytes, bad_lines;
    int val_shards, train_shards;
    double seconds;
    uint32_t vocab_size;
    int width;                 /* bytes per token in the shards */
    char **shards;             /* final paths, n_shards of them (owned) */
    uint64_t *shard_counts;
    int n_shards;
} ts_corpus_summary;

/* Check everything that can be checked first (inputs, outputs, tokenizer, format), then
 * run the pipeline; on any error no shard is left under a final name. */
ts_status ts_corpus_build(const ts_corpus_options *o, ts_corpus_summary *sum);
void ts_corpus_summary_free(ts_corpus_summary *sum);

#endif
