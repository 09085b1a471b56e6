/* Reading a checkpoint directory (checkpoint.h): state.json, every file it lists opened
 * and validated (safetensors structure, size, header checksum), tensors found by name,
 * and the per-chunk checksums of any subset of tensors verified. Shared by loading into
 * a run, tessera sample and tessera ckpt. Every message names the file (and tensor). */
#ifndef TS_CKPT_READER_H
#define TS_CKPT_READER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"

typedef struct {
    char name[64];
    uint64_t bytes, header_bytes;
    uint32_t header_crc;
    ts_st_file st;          /* open when `open` */
    bool open;
} ts_ckpt_rfile;

typedef struct {
    char dir[TS_PATH_MAX];
    json_t *state;          /* state.json, owned */
    int step, version;
    ts_model_config model;  /* the config's model keys */
    long long global_batch; /* data.global_batch (the data position's unit) */
    long long sequences_consumed; /* data.sequences_consumed: the data position */
    char batch_rampup[512]; /* data.batch_rampup, the run's train.batch_rampup ("": none,
                             * sequences_consumed = step x global_batch) */
    int grid[3];            /* pp, dp, tp it was written from */
    ts_lr_schedule lr_schedule; /* the run's learning-rate schedule (older checkpoints:
                                 * derived from their config's train keys) */
    char optimizer[8];      /* train.optimizer it ran, "adamw" or "muon" (state.json's
                             * "optimizer"; a checkpoint older than Muon: "adamw") */
    uint64_t chunk_bytes;
    int n_files;
    ts_ckpt_rfile *files;
    json_t *checksums;      /* borrowed from state: name -> [crc per chunk] */
    ts_ckpt_verdict verdict; /* what kind of failure the last error was */
} ts_ckpt_reader;

/* crc32 of a state object's canonical JSON (sorted keys, compact, reals that read back
 * exactly) without its "state_crc32" key: state.json carries it, so an edited step or
 * checksum list is caught like a flipped tensor byte. */
uint32_t ts_ckpt_state_crc(const json_t *state);

/* Read state.json and open every file it lists (each file's safetensors structure is
 * checked; a truncated file is found here). On failure r->verdict says which kind and r
 * is freed. */
ts_status ts_ckpt_reader_open(ts_ckpt_reader *r, const char *step_dir);
void ts_ckpt_reader_close(ts_ckpt_reader *r);

/* A tensor by name in any of the files (NULL if none); *file its file's index. */
const ts_st_tensor *ts_ckpt_reader_find(const ts_ckpt_reader *r, const char *name, int *file);

/* The tensor `name`, which must exist as F32 of the given logical shape: a clear error
 * naming the file and tensor otherwise (verdict INCOMPLETE). */
ts_status ts_ckpt_reader_expect(ts_ckpt_reader *r, const char *name, int ndim,
                                const int64_t *shape, const ts_st_tensor **t, int *file);

/* Verify the chunk checksums of tensor `name`'s chunks [c0, c1) (all: 0, SIZE_MAX),
 * reading them through `buf` (chunk_bytes). Verdict CORRUPT on a mismatch. */
ts_status ts_ckpt_reader_verify(ts_ckpt_reader *r, const char *name, size_t c0, size_t c1,
                                void *buf);

/* Each file's size and header checksum against state.json (after the tensor checks, so
 * a missing tensor is named as such). */
ts_status ts_ckpt_reader_check_files(ts_ckpt_reader *r);

/* A llama checkpoint's config.json (Hugging Face's, layout.h): present (verdict
 * INCOMPLETE otherwise), JSON, and holding every key Tessera writes with the value its
 * model gives (CORRUPT otherwise); other keys a user added are left alone. Nothing to
 * check for gpt2. */
ts_status ts_ckpt_reader_check_hf_config(ts_ckpt_reader *r);

/* Every tensor the checkpoint's own model config defines, in every kind, present with
 * its shape: the completeness check. */
ts_status ts_ckpt_reader_check_complete(ts_ckpt_reader *r);

#endif
