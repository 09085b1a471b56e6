/* Shared by the libFuzzer harnesses. The readers under test take paths, so every input
 * is written to a file in a private directory ($TMPDIR or /tmp, fuzz_XXXXXX) made once
 * per process in LLVMFuzzerInitialize and removed at exit. Harness problems (cannot
 * write the temp file) abort: they are not findings, but they must not pass silently. */
#ifndef TS_FUZZ_UTIL_H
#define TS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FUZZ_MAX_FILES 8

static char fuzz_dir[512];
static char fuzz_files[FUZZ_MAX_FILES][600];
static int fuzz_n_files;

static void fuzz_cleanup(void)
{
    for (int i = 0; i < fuzz_n_files; i++) unlink(fuzz_files[i]);
    if (fuzz_dir[0]) rmdir(fuzz_dir);
}

static void fuzz_init_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/fuzz_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(fuzz_dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_cleanup);
}

/* The path of temp file `name` (registered for removal at exit; at most
 * FUZZ_MAX_FILES names, asked for once each in LLVMFuzzerInitialize). */
static const char *fuzz_path(const char *name)
{
    if (fuzz_n_files == FUZZ_MAX_FILES) abort();
    char *p = fuzz_files[fuzz_n_files++];
    snprintf(p, sizeof fuzz_files[0], "%s/%s", fuzz_dir, name);
    return p;
}

/* Replace the file at `path` with exactly `size` bytes of `data`. */
static void fuzz_write(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

#endif
