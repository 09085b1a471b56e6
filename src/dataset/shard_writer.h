/* The shards of `tessera data`: a token stream cut into llm.c shards named
 * PREFIX_SPLIT_NNNNNN.bin (SPLIT "val" or "train", NNNNNN the shard's index in the
 * whole stream, validation first as llm.c's fineweb.py numbers them), each at most
 * shard_tokens tokens. Every shard is written to "NAME.tmp.PID" and fsynced when full;
 * only ts_shard_sink_commit renames them all to their final names, so a run that fails
 * anywhere, its commit included, leaves none of its shards under a final name
 * (ts_shard_sink_free removes the temporary files). */
#ifndef TS_SHARD_WRITER_H
#define TS_SHARD_WRITER_H

#include <stdint.h>
#include <stdio.h>

#include "core/error.h"

/* A run's claim on PREFIX, taken before anything is written and held until the run
 * ends: an exclusive flock on PREFIX.lock (released by the kernel when the process
 * dies, so a killed run leaves no lock that keeps others out), so that two runs on one
 * prefix never interleave their shards. */
typedef struct {
    int fd;            /* PREFIX.lock, open and locked; -1 when none */
    char *lock_path;   /* owned */
    char **existing;   /* PREFIX's shards found (owned, NULL-terminated, may be NULL) */
    int n_removed;     /* temporaries of earlier, killed runs removed */
} ts_shard_claim;

/* Claim PREFIX's outputs: PREFIX must not end in '/', its directory must exist; then
 * PREFIX.lock is taken (refused while another run holds it, naming its pid; refused when
 * it is not a regular file or holds something else than a pid). Under the lock, the
 * temporaries a killed run left (PREFIX_train_NNNNNN.bin.tmp.PID and .old.PID, also
 * _val_) are removed, since no other run can be writing them. Then shards named as this
 * run's (PREFIX_train_*.bin, PREFIX_val_*.bin, six digits) that exist already are refused
 * unless overwrite, and are refused anyway when one is not a regular file; c->existing
 * gets their paths, which ts_shard_sink_commit replaces or removes. */
ts_status ts_shard_outputs_claim(ts_shard_claim *c, const char *prefix, int overwrite);
/* Remove PREFIX.lock and drop the lock (safe on a failed or zeroed claim). */
void ts_shard_claim_release(ts_shard_claim *c);
/* Whether path names one of PREFIX's shards (same directory by device and inode, a
 * name PREFIX's base + _train_/_val_ + six digits + .bin). */
int ts_shard_is_output_name(const char *prefix, const char *path);
/* Whether path names PREFIX.lock (same directory by device and inode). */
int ts_shard_is_lock_name(const char *prefix, const char *path);
void ts_shard_paths_free(char **paths);

typedef struct {
    char *prefix;          /* owned */
    int width;             /* bytes per token: 2 (GPT-2's format) or 4 (Llama 3's) */
    uint64_t shard_tokens; /* at most this many tokens per shard */
    const char *split;     /* "val" or "train": the split new shards belong to */
    int next_index;        /* the next shard's NNNNNN */
    FILE *f;               /* the open shard, or NULL */
    uint64_t count;        /* tokens in the open shard */
    unsigned char *buf;    /* narrowing buffer for 16-bit shards */
    size_t buf_cap;
    char **tmp, **final;   /* shards closed so far (owned), n_shards of them */
    uint64_t *counts;
    int n_shards, cap, n_val, n_train;
} ts_shard_sink;

ts_status ts_shard_sink_init(ts_shard_sink *s, const char *prefix, int width,
                             uint64_t shard_tokens, const char *split);
/* From now on tokens go to shards of `split`: the open shard (if any) is closed first,
 * so no shard mixes the splits. */
ts_status ts_shard_sink_split(ts_shard_sink *s, const char *split);
/* Append n ids (each must fit the width: the caller checked the vocabulary). */
ts_status ts_shard_sink_write(ts_shard_sink *s, const uint32_t *ids, size_t n);
/* Close the open shard and rename every shard to its final name, all or nothing: the
 * `stale` paths (an earlier run's shards under --overwrite) are first renamed aside
 * (NAME.old.PID), then the shards renamed to their final names, never over an existing
 * file; when a rename fails, those done are undone (the new shards back to their
 * temporary names, the old ones back to theirs) and the error says so. After success
 * the old shards set aside are removed (one that cannot be is a warning: the next run
 * on PREFIX removes it). */
ts_status ts_shard_sink_commit(ts_shard_sink *s, char **stale);
/* Remove every temporary file and free (also after a commit, where it only frees). */
void ts_shard_sink_free(ts_shard_sink *s);

#endif
