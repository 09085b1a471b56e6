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

/* What the lock file says about its holder ("host pid"), or "unknown". */
static void read_holder(int fd, char *buf, size_t cap)
{
    ssize_t n = pread(fd, buf, cap - 1, 0);
    if (n <= 0) {
        snprintf(buf, cap, "unknown");
        return;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    if (!buf[0]) snprintf(buf, cap, "unknown");
}

ts_status ts_ckpt_claim_dir(ts_ckpt_claim *c, const char *dir, const char *host, bool fresh,
                            bool overwrite)
{
    c->fd = -1;
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
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return ts_fail("checkpoint.dir: cannot open its lock file %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ts_fail("checkpoint.dir: its lock file %s is not a regular file; remove it", path);
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        char holder[128];
        read_holder(fd, holder, sizeof holder);
        close(fd);
        if (err == EWOULDBLOCK)
            return ts_fail("checkpoint.dir %s is in use by another run (host and pid: %s): two "
                           "runs saving into one directory lose checkpoints; wait for it to "
                           "end, stop it, or choose another checkpoint.dir",
                           dir, holder);
        return ts_fail("checkpoint.dir: cannot lock %s: %s", path, strerror(err));
    }
    snprintf(c->token, sizeof c->token, "%s %ld", host, (long)getpid());
    char line[160];
    const int n = snprintf(line, sizeof line, "%s\n", c->token);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n || fsync(fd) != 0) {
        const int err = errno; /* before close may change it */
        close(fd);
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
        read_holder(fd, seen, sizeof seen);
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
    c->fd = -1;
}

/* realpath of the directory part of `path` joined with its last component, so an output
 * that does not exist yet still resolves; false when its directory does not exist. */
static bool resolve_output(const char *path, char *out, size_t cap)
{
    char dir[TS_PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path) > 0 ? (int)(slash - path) : 1,
                 path);
    else
        snprintf(dir, sizeof dir, ".");
    if (!realpath(dir, real)) return false;
    snprintf(out, cap, "%s/%s", strcmp(real, "/") ? real : "", base);
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
    if (!ckpt_dir[0] || !realpath(ckpt_dir, real)) return TS_OK;
    if (!within(out, real) || !strcmp(out, real)) return TS_OK;
    /* The first component below checkpoint.dir. */
    const char *rest = out + strlen(real) + 1;
    const size_t len = strcspn(rest, "/");
    const bool inside = rest[len] == '/';
    const bool step = !strncmp(rest, "step_", 5) || !strncmp(rest, ".tmp-step_", 10);
    const bool reserved = !inside && ((len == 6 && !strncmp(rest, "latest", 6)) ||
                                      (len == 5 && !strncmp(rest, ".lock", 5)));
    if ((inside && step) || reserved)
        return ts_fail("%s = %s is inside checkpoint.dir's checkpoints (%.*s): writing there "
                       "would damage them; write %s beside them or elsewhere",
                       what, path, (int)len, rest, what);
    return TS_OK;
}
