/* core/error.c: messages as long as a PATH_MAX path and its cause are kept whole; a
 * longer one keeps its beginning and its end (the cause) with the middle elided, also
 * through ts_error_prefix; and an allocation that cannot be satisfied ends the process
 * with exit status 1 and one "tessera: error: out of memory" line, not SIGABRT. */
#include <stdint.h>
#include <sys/wait.h>

#include "test_util.h"

static int ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

static void test_error_long_path_keeps_cause(void)
{
    static char path[5002];
    memset(path, 'x', sizeof path - 1);
    path[0] = '/';
    path[sizeof path - 1] = '\0';
    ts_fail("cannot open the ranks file %s: %s", path, "File name too long");
    const char *m = ts_error_message();
    CHECKF(ends_with(m, ": File name too long"), "the cause is lost (%zu bytes kept)", strlen(m));
    CHECK(strstr(m, path) != NULL); /* a PATH_MAX-size path is kept whole */
    ts_error_prefix("data.train: ");
    m = ts_error_message();
    CHECK(strncmp(m, "data.train: cannot open", 23) == 0);
    CHECK(ends_with(m, ": File name too long"));
    /* A message may quote the one before it (the argument points into the buffer). */
    ts_fail("again: %s", ts_error_message());
    CHECK(strncmp(ts_error_message(), "again: data.train: cannot open", 30) == 0);
}

static void test_error_too_long_elides_middle(void)
{
    static char huge[3 * TS_ERROR_MAX];
    memset(huge, 'y', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    ts_fail("start %s: the cause", huge);
    const char *m = ts_error_message();
    CHECK(strlen(m) < TS_ERROR_MAX);
    CHECK(strncmp(m, "start yyy", 9) == 0);
    CHECK(strstr(m, " [...] ") != NULL);
    CHECK(ends_with(m, "yyy: the cause"));
    /* The prefix of a message already at the limit: both ends still there. */
    ts_error_prefix("context: ");
    m = ts_error_message();
    CHECK(strlen(m) < TS_ERROR_MAX);
    CHECK(strncmp(m, "context: start", 14) == 0);
    CHECK(ends_with(m, ": the cause"));
    /* A multi-byte character is never cut in two by the elision. */
    static char wide[2 * TS_ERROR_MAX];
    for (size_t i = 0; i + 2 < sizeof wide; i += 2) memcpy(wide + i, "\xc3\xa9", 2);
    wide[sizeof wide - 2] = '\0';
    ts_fail("%s", wide);
    m = ts_error_message();
    const char *mark = strstr(m, " [...] ");
    CHECK(mark != NULL && (mark - m) % 2 == 0 && strlen(mark + 7) % 2 == 0);
}

/* ts_malloc of more than any machine has, in a child: exit 1 with the message. */
static void test_error_out_of_memory_exits_1(void)
{
#if defined(__SANITIZE_ADDRESS__)
    printf("skipped the out-of-memory exit: AddressSanitizer's allocator reports a huge "
           "allocation itself\n");
    return;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    printf("skipped the out-of-memory exit under AddressSanitizer\n");
    return;
#endif
#endif
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        void *volatile p = ts_malloc(SIZE_MAX / 2);
        (void)p;
        _exit(0); /* not reached when ts_malloc behaves */
    }
    close(fds[1]);
    char err[1024];
    ts_test_read_all(fds[0], err, sizeof err);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x, stderr: %s", status, err);
    CHECKF(strncmp(err, "tessera: error: out of memory allocating ", 41) == 0, "stderr: %s", err);
    CHECK(strchr(err, '\n') == err + strlen(err) - 1); /* one line */
}

int main(void)
{
    test_error_long_path_keeps_cause();
    test_error_too_long_elides_middle();
    test_error_out_of_memory_exits_1();
    return ts_test_report();
}
