/* Token data: llm.c shards, GPT-2's (256 x int32 header [20240520, 1, count], then
 * count uint16 tokens, file size exactly 1024 + 2*count) or Llama 3's ([20240801, 7,
 * count], uint32 tokens, 1024 + 4*count bytes), or plain text files read as bytes
 * (vocab 256). Several files are read in order as one token stream (a dataset) cut into
 * windows; dataset/sampler.h maps (step, dp rank, micro-batch) to datasets and windows
 * (the batch rule, docs/CONTRACT.md), so the data a step sees does not depend on the
 * grid. */
#ifndef TS_LOADER_H
#define TS_LOADER_H

#include <stdint.h>

#include "core/error.h"

#define TS_SHARD_MAGIC 20240520   /* GPT-2: uint16 tokens */
#define TS_SHARD_VERSION 1
#define TS_SHARD32_MAGIC 20240801 /* Llama 3: uint32 tokens */
#define TS_SHARD32_VERSION 7

/* The token format of a shard to write: GPT-2's uint16 or Llama 3's uint32; AUTO picks
 * uint32 when the vocabulary does not fit in 16 bits (vocab_size > 65536). */
typedef enum { TS_SHARD_AUTO, TS_SHARD_GPT2, TS_SHARD_LLAMA3 } ts_shard_format;

typedef struct {
    char *path;
    int is_text;
    int token_bytes;           /* 1 (text), 2 (GPT-2 shard) or 4 (Llama 3 shard) */
    const unsigned char *map;  /* mmap of the whole file */
    uint64_t map_bytes;
    uint64_t first_token;      /* position of this file's first token in the stream */
    uint64_t count;            /* tokens in this file */
} ts_shard;

typedef struct {
    int n_shards;
    ts_shard *shards;
    uint64_t n_tokens;         /* N: the stream's length */
    int vocab_size;
} ts_dataset;

/* Open and validate every file: present, readable, magic/version, size, and every token
 * id < vocab_size (the message gives file, position and id). A file that does not start
 * with the shard magic is read as text (bytes) only if it looks like text: no NUL byte
 * in its first 4 KiB (when it is at least a header long) and a name not ending in .bin;
 * otherwise it is an error that shows what its header holds. */
ts_status ts_data_open(ts_dataset *ds, const char *const *paths, int n_paths, int vocab_size);
/* The same for paths from config key `key` ("data.val"), which the hint for a missing
 * file names (ts_data_open says "data.train"). */
ts_status ts_data_open_key(ts_dataset *ds, const char *key, const char *const *paths,
                           int n_paths, int vocab_size);
void ts_data_close(ts_dataset *ds);

/* Shard i's identity: its token count and the zlib crc32 of its bytes, for ranks to
 * agree that one path holds the same data everywhere (a node-local copy can differ). */
void ts_data_shard_identity(const ts_dataset *ds, int i, uint64_t *count, uint32_t *crc);

/* S = (N - 1) / T windows of T+1 tokens; error if the stream is too short for one. */
uint64_t ts_data_num_windows(const ts_dataset *ds, int T);

/* Window k: inputs = tokens[k*T .. k*T+T), targets = tokens[k*T+1 .. k*T+T+1). */
void ts_data_window(const ts_dataset *ds, uint64_t k, int T, int *inputs, int *targets);

/* The batch rule over datasets, blends and epochs: dataset/sampler.h. */

/* `tessera data`: a text file's bytes as tokens (vocab 256) into an llm.c shard of
 * format `fmt` (AUTO: GPT-2's) (atomic: temp file, fsync, rename). Refused before
 * anything is written: an output that exists and is not a regular file, whose directory
 * is missing or not a directory, or that is the input file itself (same device and
 * inode); an input that is already a token shard. */
ts_status ts_data_write_text_shard(const char *text_path, const char *out_path,
                                   ts_shard_format fmt);

/* Write token ids of a vocabulary of vocab_size as an llm.c shard of format `fmt` (AUTO:
 * Llama 3's uint32 when vocab_size > 65536, else GPT-2's uint16), atomic (via
 * ts_atomic_file; the output path is checked as for ts_data_write_text_shard). Every id must be < vocab_size, and < 65536 for GPT-2's format;
 * the message names the first that is not and its position. */
ts_status ts_data_write_tokens(const char *out_path, const uint32_t *tokens, uint64_t count,
                               int vocab_size, ts_shard_format fmt);
/* The format of a name, "gpt2" or "llama3" (0: not one). */
int ts_shard_format_parse(const char *name, ts_shard_format *fmt);

#endif
