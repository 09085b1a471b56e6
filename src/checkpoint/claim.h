/* A run's claim on its checkpoint.dir, taken at start-up (before the first step, not at
 * the first save): the directory is made and must be a writable directory; an exclusive
 * lock (flock on the directory itself and on DIR/.lock, released by the kernel when the
 * process dies, so a killed run never leaves a stale lock; the directory's survives an
 * `rm DIR/.lock`) keeps a second run out for this run's lifetime; and a
 * fresh run (no checkpoint.load) is refused where another run's checkpoints already
 * are, unless checkpoint.overwrite says to start over there (its saves would prune
 * them). Rank 0 claims; the caller agrees the result across ranks. */
#ifndef TS_CHECKPOINT_CLAIM_H
#define TS_CHECKPOINT_CLAIM_H

#include <stdbool.h>

#include "core/error.h"

typedef struct {
    int fd;          /* the lock file, held open; -1 when none */
    int dir_fd;      /* the directory, flocked too (-1: its file system cannot) */
    char token[128]; /* what this claim wrote into it: "host pid" */
} ts_ckpt_claim;

/* Claim `dir` for this process (host `host`, for the holder's line in the lock file).
 * `fresh`: the run loads no checkpoint; `overwrite`: checkpoint.overwrite. */
ts_status ts_ckpt_claim_dir(ts_ckpt_claim *c, const char *dir, const char *host, bool fresh,
                            bool overwrite);
/* Whether `dir` is the directory the claim with `token` locked: its lock file holds the
 * token (a rank on another node checks that it sees the same checkpoint.dir as the rank
 * that claimed it, not a node-local directory of the same name). */
ts_status ts_ckpt_claim_check_shared(const char *dir, const char *token, int rank);
/* Release the lock (safe on a zeroed or failed claim: fd 0 is never a lock here). */
void ts_ckpt_claim_release(ts_ckpt_claim *c);
/* Before a save touches `dir` (rank 0; TS_OK without a claim): DIR/.lock must still be
 * the file this claim locked. Removed while the directory's own lock is held (no other
 * run can be in): written again, with a warning. Replaced, or removed where the file
 * system has no directory locks: another run may hold the directory now, and the save
 * is refused rather than collide with its saves. */
ts_status ts_ckpt_claim_check(ts_ckpt_claim *c, const char *dir);

/* Refuse an output `path` (named `what`, e.g. "log.metrics") that would land inside a
 * checkpoint: inside a step directory (committed or in progress) of `ckpt_dir`, on its
 * `latest` or `.lock`, or inside the checkpoint directory `loaded` ("" for none). */
ts_status ts_ckpt_check_output(const char *path, const char *what, const char *ckpt_dir,
                               const char *loaded);

#endif
