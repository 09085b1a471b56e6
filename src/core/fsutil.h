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

/* Directories whose entries must survive a crash. The error policy: these report every
 * failure (naming the path), and the caller decides what it means: a checkpoint's
 * commit fails, an atomic file already renamed into place only warns. */
/* fsync `dir`, so the files created, renamed or removed in it are on disk. A file system
 * that cannot sync a directory (EINVAL) has nothing more to do: TS_OK. */
ts_status ts_fsync_dir(const char *dir);
/* ts_fsync_dir of the directory holding `path` ("." for a bare file name). */
ts_status ts_fsync_parent_dir(const char *path);
/* Remove `dir` and the entries in it, which must be plain files (a checkpoint's step
 * directory; not recursive); a missing `dir` is TS_OK. Every file is tried; the first
 * failure is reported and `dir` itself is then kept. */
ts_status ts_remove_dir(const char *dir);

/* Who holds a lock file (checkpoint.dir's .lock, `tessera data`'s PREFIX.lock): its
 * first line as its holder wrote it ("host pid", "pid"), read from fd into buf, or
 * "unknown" when it holds none yet. */
void ts_lock_file_holder(int fd, char *buf, size_t cap);

/* Refuse an output path that exists and is not a regular file (a directory, a device
 * such as /dev/full, a pipe or socket): writing there loses data or replaces a node.
 * `what` names the output in the message ("log.metrics", "svg"). */
ts_status ts_check_output_path(const char *path, const char *what);

/* ---- inputs. Every input is opened so that the open cannot block (O_NONBLOCK, cleared
 * again at once, so reads are unchanged): a FIFO with no writer, or a device that waits,
 * would otherwise hang the set-up where no signal ends it. Then it must be a regular
 * file of at most `max_bytes` (0: any size), or the caller's own rule for what else it
 * accepts. -1 / NULL with errno set when the open fails. */
int ts_open_input(const char *path);
FILE *ts_fopen_input(const char *path);
/* "WHAT PATH is not a regular file (it is a directory | a named pipe (FIFO) | a
 * character device | ...); give ..." for an fd that is not one, or a file above
 * max_bytes; TS_OK for a regular file within the bound. `give` ends the message ("the
 * CSV file"). */
ts_status ts_check_input(int fd, const char *path, const char *what, const char *give,
                         unsigned long long max_bytes);
/* Whether fd is an anonymous pipe (a shell's `|` or `<(...)`, /dev/stdin): it has a
 * writer already, unlike a named FIFO, so reading it cannot wait for one forever. */
int ts_is_anonymous_pipe(int fd);
/* What a mode that is not a regular file is, for messages: "a directory", "a named pipe
 * (FIFO)", "a character device", "a block device", "a socket", "a symbolic link" (an
 * lstat's), else "not a file". */
const char *ts_file_kind(unsigned int mode);

/* An output written whole or not at all: the bytes go to "PATH.tmp.PID" in the same
 * directory; ts_atomic_commit checks every write, flushes, fsyncs, closes and renames
 * it over PATH, then syncs the directory (a failure there is a warning: PATH is complete,
 * only its rename may not survive a crash); ts_atomic_abort (or a failed commit) removes
 * the temporary file, so PATH is either its old self or the complete new file. */
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
