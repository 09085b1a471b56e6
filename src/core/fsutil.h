/* File-system helpers for outputs that must never be left half-written or written over
 * something that is not a file. */
#ifndef TS_FSUTIL_H
#define TS_FSUTIL_H

#include <stdio.h>

#include "core/error.h"

/* mkdir -p of the directory part of `path` (no-op for a bare file name). */
ts_status ts_mkdir_parent(const char *path);
/* mkdir -p of `dir`. */
ts_status ts_mkdir_p(const char *dir);

/* Refuse an output path that exists and is not a regular file (a directory, a device
 * such as /dev/full, a pipe or socket): writing there loses data or replaces a node.
 * `what` names the output in the message ("log.metrics", "svg"). */
ts_status ts_check_output_path(const char *path, const char *what);

/* An output written whole or not at all: the bytes go to "PATH.tmp.PID" in the same
 * directory; ts_atomic_commit checks every write, flushes, fsyncs, closes and renames
 * it over PATH; ts_atomic_abort (or a failed commit) removes the temporary file, so
 * PATH is either its old self or the complete new file. */
typedef struct {
    FILE *f;          /* write here */
    char *path, *tmp; /* owned */
    const char *what; /* for messages; not owned */
} ts_atomic_file;

ts_status ts_atomic_open(ts_atomic_file *af, const char *path, const char *what);
ts_status ts_atomic_commit(ts_atomic_file *af);
void ts_atomic_abort(ts_atomic_file *af);

/* Flush stdout and report a failed write to it ("writing standard output: No space
 * left on device"): a command whose output is its result must not exit 0 without it. */
ts_status ts_stdout_check(void);

#endif
