#include "checkpoint/claim.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "core/fsutil.h"
#include "core/log.h"

/* The refusal of a second run: its holder from the lock file, when one is there. */
static ts_status busy(const char *dir, const char *lock)
{
    char holder[128] = "unknown: its .lock file was removed";
    int fd = ts_open_input(lock);
    if (fd >= 0) {
        ts_lock_file_holder(fd, holder, sizeof holder);
        close(fd);
    }
    return ts_fail("checkpoint.dir %s is in use by another run (host and pid: %s): two "
                   "runs saving into one directory lose checkpoints; wait for it to "
                   "end, stop it, or choose another checkpoint.dir",
                   dir, holder);
}

/* The holder's line ("host pid") into the lock file fd, on disk; -1 with errno. */
static int write_token(int fd, const char *token)
{
    char line[160];
    const int n = snprintf(line, sizeof line, "%s\n", token);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n || fsync(fd) != 0)
        return -1;
    return 0;
}

ts_status ts_ckpt_claim_dir(ts_ckpt_claim *c, const char *dir, const char *host, bool fresh,
                            bool overwrite)
{
    c->fd = -1;
    c->dir_fd = -1;
    struct stat sb;
    if (ts_mkdir_p(dir) != TS_OK) return ts_error_prefix("checkpoint.dir: ");
    if (stat(dir, &sb) != 0)
        return ts_fail("checkpoint.dir %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return ts_fail("checkpoint.dir %s is not a directory; choose a directory to save into",
                       dir);
    if (access(dir, W_OK | X_OK) != 0)
        return ts_fail("checkpoint.dir %s is not writable (%s): checkpoints could not be "
                       "saved there; choose a writable directory",
                       dir, strerror(errno));
    char path[TS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.lock", dir);
    /* The directory itself is locked first: `rm DIR/.lock` (a cleanup of dotfiles)
     * cannot undo that lock, so a second run is still kept out (probe D4: it got in and
     * the two runs' saves collided). A file system without flock on directories (NFS
     * opens them read-only, which its lock emulation refuses) leaves the file's lock
     * alone, and each save's check (ts_ckpt_claim_check) stands guard instead. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return ts_fail("checkpoint.dir %s: cannot open it: %s", dir, strerror(errno));
    if (flock(dfd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        close(dfd);
        dfd = -1;
        if (err == EWOULDBLOCK) return busy(dir, path);
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        const int err = errno;
        if (dfd >= 0) close(dfd);
        return ts_fail("checkpoint.dir: cannot open its lock file %s: %s", path, strerror(err));
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        if (dfd >= 0) close(dfd);
        return ts_fail("checkpoint.dir: its lock file %s is not a regular file; remove it", path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        close(fd);
        if (dfd >= 0) close(dfd);
        if (err == EWOULDBLOCK) return busy(dir, path);
        return ts_fail("checkpoint.dir: cannot lock %s: %s", path, strerror(err));
    }
    c->dir_fd = dfd;
    snprintf(c->token, sizeof c->token, "%s %ld", host, (long)getpid());
    if (write_token(fd, c->token) != 0) {
        const int err = errno; /* before close may change it */
        close(fd);
        ts_ckpt_claim_release(c);
        return ts_fail("checkpoint.dir: cannot write its lock file %s: %s", path, strerror(err));
    }
    c->fd = fd;
    /* `latest` is ours to replace at every save: a directory, link or device there would
     * fail only after training (probe Q3: a symlink loop failed the end-of-run save). */
    snprintf(path, sizeof path, "%s/latest", dir);
    if (lstat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        ts_ckpt_claim_release(c);
        return ts_fail("checkpoint.dir: %s is not a regular file (it is %s); remove it (a "
                       "run that loads \"latest\" then takes the newest complete step)",
                       path, ts_file_kind(sb.st_mode));
    }
    if (fresh && !overwrite) {
        const long newest = ts_ckpt_newest_step(dir);
        if (newest >= 0) {
            ts_ckpt_claim_release(c);
            return ts_fail("checkpoint.dir %s already holds checkpoints (the newest is "
                           "step_%08ld), and this run loads none: its saves would prune them; "
                           "continue that run with checkpoint.load = \"latest\", start over "
                           "there with checkpoint.overwrite = true, or choose another "
                           "checkpoint.dir",
                           dir, newest);
        }
    }
    return TS_OK;
}

ts_status ts_ckpt_claim_check_shared(const char *dir, const char *token, int rank)
{
    char path[TS_PATH_MAX + 16], seen[160] = "";
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = ts_open_input(path);
    if (fd >= 0) {
        ts_lock_file_holder(fd, seen, sizeof seen);
        close(fd);
    }
    if (fd >= 0 && !strcmp(seen, token)) return TS_OK;
    return ts_fail("checkpoint.dir %s is not the same directory on every rank: rank %d %s "
                   "rank 0's lock file (%s); every rank writes its part of each checkpoint "
                   "there, so it must be on a file system all nodes share",
                   dir, rank, fd < 0 ? "cannot open" : "sees another lock file than", path);
}

void ts_ckpt_claim_release(ts_ckpt_claim *c)
{
    if (c->fd > 0) close(c->fd); /* closing drops the flock */
    if (c->dir_fd > 0) close(c->dir_fd);
    c->fd = -1;
    c->dir_fd = -1;
}

ts_status ts_ckpt_claim_check(ts_ckpt_claim *c, const char *dir)
{
    if (c->fd <= 0) return TS_OK; /* no claim (not rank 0) */
    char path[TS_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/.lock", dir);
    struct stat ours, now;
    if (fstat(c->fd, &ours) != 0)
        return ts_fail("checkpoint.dir: cannot stat its lock file %s: %s", path, strerror(errno));
    const bool there = lstat(path, &now) == 0;
    if (there && now.st_dev == ours.st_dev && now.st_ino == ours.st_ino) return TS_OK;
    if (!there && errno == ENOENT && c->dir_fd > 0) {
        /* Removed, but the directory's own lock kept every other run out: the file (the
         * holder's name, and the lock older versions take) is written again. */
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0 && write_token(fd, c->token) == 0) {
            close(c->fd);
            c->fd = fd;
            ts_log_warn("checkpoint: %s was removed while this run held %s; it is written "
                        "again (the directory's own lock kept other runs out)",
                        path, dir);
            return TS_OK;
        }
        const int err = errno;
        if (fd >= 0) close(fd);
        return ts_fail("checkpoint.dir: %s was removed while this run held %s, and cannot be "
                       "written again: %s",
                       path, dir, strerror(err));
    }
    return ts_fail("checkpoint.dir %s: its lock file %s was %s while this run held it, so "
                   "another run may be saving there now: this save stops rather than mix "
                   "the two runs' checkpoints (the checkpoints saved before stay); never "
                   "remove .lock while a run uses the directory",
                   dir, path, there ? "replaced" : "removed");
}

/* `path` made absolute and canonical as it will be once written: realpath of its
 * nearest existing ancestor, joined with the components below it that do not exist yet
 * (each "." dropped and ".." taking one back, as mkdir -p and open will walk them). So
 * an output in a directory the run creates later (ts_mkdir_parent) still resolves:
 * probe D3's log.metrics in a step directory not yet saved was accepted, and the save
 * then replaced that directory and its metrics. False only when no ancestor resolves
 * (a permission problem, which the writer reports when it opens the file). */
static bool resolve_output(const char *path, char *out, size_t cap)
{
    char head[TS_PATH_MAX], real[PATH_MAX];
    if (snprintf(head, sizeof head, "%s", path) >= (int)sizeof head) return false;
    /* Strip components from the end until the rest resolves; `tail` is what was cut. */
    size_t cut = strlen(head);
    for (;;) {
        while (cut > 0 && head[cut - 1] == '/' && cut > 1) cut--; /* "a//b", "a/" */
        char *slash = NULL;
        for (size_t i = cut; i > 0; i--)
            if (head[i - 1] == '/') {
                slash = head + i - 1;
                break;
            }
        char dir[TS_PATH_MAX];
        if (!slash)
            snprintf(dir, sizeof dir, ".");
        else if (slash == head)
            snprintf(dir, sizeof dir, "/");
        else
            snprintf(dir, sizeof dir, "%.*s", (int)(slash - head), head);
        if (realpath(dir, real)) {
            cut = slash ? (size_t)(slash - head) + 1 : 0;
            break;
        }
        if (errno != ENOENT && errno != ENOTDIR) return false;
        if (!slash) return false;
        cut = (size_t)(slash - head);
        if (cut == 0) return false; /* "/" itself did not resolve */
    }
    /* real is canonical: append the rest component by component. */
    size_t len = strlen(real);
    if (len == 1) len = 0; /* "/" */
    const char *p = path + cut;
    while (*p) {
        const size_t n = strcspn(p, "/");
        if (n == 0 || (n == 1 && p[0] == '.')) {
            /* an empty or "." component names the same directory */
        } else if (n == 2 && p[0] == '.' && p[1] == '.') {
            while (len > 0 && real[len - 1] != '/') len--;
            if (len > 0) len--; /* the slash: the parent of a canonical path */
        } else {
            if (len + 1 + n + 1 > sizeof real) return false;
            real[len++] = '/';
            memcpy(real + len, p, n);
            len += n;
        }
        p += n;
        while (*p == '/') p++;
    }
    real[len] = '\0';
    snprintf(out, cap, "%s", len ? real : "/");
    return true;
}

/* Is `p` the directory `dir` or inside it? */
static bool within(const char *p, const char *dir)
{
    const size_t n = strlen(dir);
    return strncmp(p, dir, n) == 0 && (p[n] == '/' || p[n] == '\0');
}

ts_status ts_ckpt_check_output(const char *path, const char *what, const char *ckpt_dir,
                               const char *loaded)
{
    char out[TS_PATH_MAX + PATH_MAX], real[PATH_MAX];
    if (!path[0] || !resolve_output(path, out, sizeof out)) return TS_OK;
    if (loaded[0] && realpath(loaded, real) && within(out, real))
        return ts_fail("%s = %s is inside the checkpoint being loaded (%s): writing there would "
                       "damage it; write %s elsewhere",
                       what, path, loaded, what);
    /* checkpoint.dir need not exist yet either (the claim makes it). */
    if (!ckpt_dir[0] || (!realpath(ckpt_dir, real) && !resolve_output(ckpt_dir, real, sizeof real)))
        return TS_OK;
    if (!within(out, real) || !strcmp(out, real)) return TS_OK;
    /* The first component below checkpoint.dir. */
    const char *rest = out + strlen(real) + 1;
    const size_t len = strcspn(rest, "/");
    const bool inside = rest[len] == '/';
    /* A save writes .tmp-step_N, swaps through .old-step_N and prunes through
     * .del-step_N: anything inside those goes with them. */
    const bool step = !strncmp(rest, "step_", 5) || !strncmp(rest, ".tmp-step_", 10) ||
                      !strncmp(rest, ".old-step_", 10) || !strncmp(rest, ".del-step_", 10);
    const bool reserved = !inside && ((len == 6 && !strncmp(rest, "latest", 6)) ||
                                      (len == 5 && !strncmp(rest, ".lock", 5)));
    if ((inside && step) || reserved)
        return ts_fail("%s = %s is inside checkpoint.dir's checkpoints (%.*s): writing there "
                       "would damage them; write %s beside them or elsewhere",
                       what, path, (int)len, rest, what);
    return TS_OK;
}
