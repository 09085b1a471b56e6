/* Fuzz the safetensors reader: the input is the whole file. When it opens, every
 * tensor is found by name and its first and last bytes are read (at most 4 KiB each,
 * as resharding reads ranges), a read past its end must fail, and the metadata is
 * looked up. */
#include <stdint.h>
#include <stdlib.h>

#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

#define READ_MAX 4096

static const char *st_path;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir();
    st_path = fuzz_path("fuzz.safetensors");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write(st_path, data, size);
    ts_st_file f;
    if (ts_st_open(&f, st_path) != TS_OK) return 0;
    static unsigned char buf[READ_MAX];
    for (int i = 0; i < f.n_tensors; i++) {
        const ts_st_tensor *t = &f.tensors[i];
        if (ts_st_find(&f, t->name) == NULL) abort(); /* every name is findable */
        uint64_t bytes = t->end - t->begin, n = bytes < READ_MAX ? bytes : READ_MAX;
        if (ts_st_read(&f, t, 0, buf, n) != TS_OK) abort(); /* validated at open */
        if (ts_st_read(&f, t, bytes - n, buf, n) != TS_OK) abort();
        if (ts_st_read(&f, t, bytes, buf, 1) == TS_OK) abort(); /* past the end */
        int64_t shape[TS_ST_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
        if (ts_st_expect_f32(t, t->ndim, shape) != TS_OK && t->dtype == TS_DT_F32) abort();
    }
    (void)ts_st_meta(&f, "format");
    (void)ts_st_find(&f, "wte");
    ts_st_close(&f);
    return 0;
}
