/* The CUDA attention variants (kernels/cuda/attention.cu, attention_flash.cu) against the
 * CPU backend's attention, each called directly: the batched-GEMM attention in fp32 and
 * with bf16 products, the flash-style attention, and the table's slots (which follow
 * TS_CUDA_ATTENTION), on random inputs with every device output, saved state and
 * workspace first poisoned with NaN (a value a kernel fails to write, or reads before
 * writing, shows). fp32 variants within a relative 1e-5 of the CPU, bf16 products
 * within 1e-2; as in test_cuda_kernels, the floor of the relative error is a tenth of
 * the largest |value| of that output. The flash backward must repeat bit for bit.
 *
 * Without a GPU (exit 77, skipped) it still checks what needs none: the sizes each
 * variant asks for, and that TS_CUDA_ATTENTION picks the variant behind the table (and
 * an unknown value stops the process with a message naming the variable and the
 * choices), each in a child process since the variable is read once per process. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "kernels/cuda/attention_flash.h"
#include "kernels/kernels.h"
#include "test_device_util.h"

static const ts_kernels *G = &ts_kernels_cuda; /* device memory and the table's slots */
static const ts_kernels *H = &ts_kernels_cpu;  /* the reference, on host memory */

typedef size_t (*size_fn)(int B, int T, int NH, int HS);
typedef void (*fwd_fn)(float *out, float *att, const float *qkv, int B, int T, int NH, int HS);
typedef void (*bwd_fn)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                       const float *att, int B, int T, int NH, int HS);

typedef struct {
    const char *name;
    size_fn saved, scratch;
    fwd_fn forward;
    bwd_fn backward;
    double tol;
    int max_hs; /* the largest head the variant takes */
} variant;

/* The device result `d` against the CPU's `want`. */
static void expect_close(const char *who, const char *what, const float *d, const float *want,
                         size_t n, double tol)
{
    ts_test_expect_close_dev(G, who, what, d, want, n, tol, 0.1);
}

/* ---- one shape, every variant ------------------------------------------------------ */

static void test_shape(const variant *vs, int nv, int B, int T, int NH, int HS)
{
    const int C = NH * HS;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = ts_alloc_floats(nqkv), *dout = ts_alloc_floats(nout);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = ts_test_frand();
    for (size_t i = 0; i < nout; i++) dout[i] = ts_test_frand();

    /* The CPU reference. */
    float *out = ts_alloc_floats(nout), *dqkv = ts_alloc_floats(nqkv);
    size_t hs = H->attention_saved_floats(B, T, NH, HS);
    size_t hsc = H->attention_scratch_floats(B, T, NH, HS);
    float *att = ts_alloc_floats(hs ? hs : 1), *scr = ts_alloc_floats(hsc ? hsc : 1);
    H->attention_forward(out, att, qkv, B, T, NH, HS);
    H->attention_backward(dqkv, scr, dout, qkv, att, B, T, NH, HS);
    free(att), free(scr);

    float *d_qkv = ts_test_to_dev(G, qkv, nqkv), *d_dout = ts_test_to_dev(G, dout, nout);
    for (int v = 0; v < nv; v++) {
        if (HS > vs[v].max_hs) continue;
        char who[120];
        snprintf(who, sizeof who, "%s B%d T%d NH%d HS%d", vs[v].name, B, T, NH, HS);
        size_t ns = vs[v].saved(B, T, NH, HS), nsc = vs[v].scratch(B, T, NH, HS);
        float *d_out = ts_test_dev_nan(G, nout), *d_att = ts_test_dev_nan(G, ns);
        float *d_scr = ts_test_dev_nan(G, nsc), *d_dqkv = ts_test_dev_nan(G, nqkv);
        vs[v].forward(d_out, d_att, d_qkv, B, T, NH, HS);
        expect_close(who, "out", d_out, out, nout, vs[v].tol);
        vs[v].backward(d_dqkv, d_scr, d_dout, d_qkv, d_att, B, T, NH, HS);
        expect_close(who, "dqkv", d_dqkv, dqkv, nqkv, vs[v].tol);

        /* The same again on fresh NaN buffers must give the same bits (no atomics, no
         * reads of what was not written). */
        float *d_dqkv2 = ts_test_dev_nan(G, nqkv), *d_scr2 = ts_test_dev_nan(G, nsc);
        vs[v].backward(d_dqkv2, d_scr2, d_dout, d_qkv, d_att, B, T, NH, HS);
        float *a = ts_test_from_dev(G, d_dqkv, nqkv), *b = ts_test_from_dev(G, d_dqkv2, nqkv);
        CHECKF(!memcmp(a, b, nqkv * sizeof(float)), "%s: a second backward differs in its bits",
               who);
        free(a), free(b);
        G->dev_free(d_out), G->dev_free(d_att), G->dev_free(d_scr), G->dev_free(d_dqkv);
        G->dev_free(d_dqkv2), G->dev_free(d_scr2);
    }
    G->dev_free(d_qkv), G->dev_free(d_dout);
    free(qkv), free(dout), free(out), free(dqkv);
}

/* ---- what needs no GPU ------------------------------------------------------------- */

static void test_sizes(void)
{
    const int B = 2, T = 129, NH = 3, HS = 100;
    const size_t rows = (size_t)B * NH * T, tt = rows * T;
    CHECK(ts_cuda_flash_attention_saved_floats(B, T, NH, HS) == rows);
    CHECK(ts_cuda_flash_attention_scratch_floats(B, T, NH, HS) == rows);
    CHECK(ts_cuda_gemm_attention_saved_floats(B, T, NH, HS) == tt);
    CHECK(ts_cuda_gemm_attention_scratch_floats(B, T, NH, HS) == tt);
    /* bf16: fp32 probabilities, their bf16 copy and a bf16 qkv (64-byte pieces);
     * scratch: dS fp32, dS bf16 and a bf16 dout */
    size_t nqkv = (size_t)B * T * 3 * NH * HS, nout = (size_t)B * T * NH * HS;
    size_t s16 = ts_cuda_gemm_bf16_attention_saved_floats(B, T, NH, HS);
    size_t c16 = ts_cuda_gemm_bf16_attention_scratch_floats(B, T, NH, HS);
    CHECKF(s16 >= tt + tt / 2 + nqkv / 2 && s16 <= tt + tt / 2 + nqkv / 2 + 48,
           "bf16 saved floats %zu", s16);
    CHECKF(c16 >= tt + tt / 2 + nout / 2 && c16 <= tt + tt / 2 + nout / 2 + 48,
           "bf16 scratch floats %zu", c16);
}

/* In a child with TS_CUDA_ATTENTION = value (NULL: unset): the table's saved size for
 * (B, T, NH, HS), and the bf16 entry's, as exit codes 10 (flash's), 11 (gemm's), 12
 * (neither); or the child's own failure. Returns the wait status. */
static int child_choice(const char *value, int HS, int bf16)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (value)
            setenv("TS_CUDA_ATTENTION", value, 1);
        else
            unsetenv("TS_CUDA_ATTENTION");
        if (!freopen("/dev/null", "w", stderr)) _exit(13); /* the expected failure's message */
        const int B = 1, T = 9, NH = 2;
        size_t got = bf16 ? ts_cuda_attention_saved_floats_bf16(B, T, NH, HS)
                          : G->attention_saved_floats(B, T, NH, HS);
        size_t gemm = bf16 ? ts_cuda_gemm_bf16_attention_saved_floats(B, T, NH, HS)
                           : ts_cuda_gemm_attention_saved_floats(B, T, NH, HS);
        _exit(got == ts_cuda_flash_attention_saved_floats(B, T, NH, HS) ? 10
              : got == gemm                                              ? 11
                                                                         : 12);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    return status;
}

static int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

static void test_choice(void)
{
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        CHECKF(exit_code(child_choice(NULL, 64, bf16)) == 11, "unset: gemm (bf16 %d)", bf16);
        CHECKF(exit_code(child_choice("gemm", 64, bf16)) == 11, "gemm (bf16 %d)", bf16);
        CHECKF(exit_code(child_choice("flash", 64, bf16)) == 10, "flash (bf16 %d)", bf16);
        /* heads wider than the flash kernels take stay on the GEMMs */
        CHECKF(exit_code(child_choice("flash", TS_CUDA_FLASH_MAX_HS + 1, bf16)) == 11,
               "flash, HS %d (bf16 %d)", TS_CUDA_FLASH_MAX_HS + 1, bf16);
        CHECKF(exit_code(child_choice("Flash", 64, bf16)) == EXIT_FAILURE,
               "an unknown value stops the process (bf16 %d)", bf16);
    }
    /* The message names the variable and the choices. */
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        setenv("TS_CUDA_ATTENTION", "fast", 1);
        (void)G->attention_saved_floats(1, 1, 1, 1);
        _exit(0);
    }
    close(fds[1]);
    char msg[512] = {0};
    size_t len = 0;
    ssize_t r;
    while (len + 1 < sizeof msg && (r = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0)
        len += (size_t)r;
    close(fds[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECKF(exit_code(status) == EXIT_FAILURE && strstr(msg, "TS_CUDA_ATTENTION") &&
               strstr(msg, "\"fast\"") && strstr(msg, "\"gemm\"") && strstr(msg, "\"flash\""),
           "unknown value: exit %d, message: %s", exit_code(status), msg);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_sizes();
    test_choice();
    int devices = ts_cuda_device_count();
    if (devices == 0) {
        printf("test_cuda_attention: no CUDA device here (ts_cuda_device_count() == 0): "
               "skipped; sizes and the TS_CUDA_ATTENTION choice checked\n");
        return ts_test_failed ? ts_test_report() : 77;
    }
    const char *env = getenv("TS_CUDA_ATTENTION");
    printf("test_cuda_attention: %d CUDA device(s); TS_CUDA_ATTENTION=%s\n", devices,
           env ? env : "(unset)");
    const variant vs[] = {
        {"gemm fp32", ts_cuda_gemm_attention_saved_floats, ts_cuda_gemm_attention_scratch_floats,
         ts_cuda_gemm_attention_forward, ts_cuda_gemm_attention_backward, 1e-5, 1 << 20},
        {"flash fp32", ts_cuda_flash_attention_saved_floats,
         ts_cuda_flash_attention_scratch_floats, ts_cuda_flash_attention_forward,
         ts_cuda_flash_attention_backward, 1e-5, TS_CUDA_FLASH_MAX_HS},
        {"gemm bf16", ts_cuda_gemm_bf16_attention_saved_floats,
         ts_cuda_gemm_bf16_attention_scratch_floats, ts_cuda_gemm_bf16_attention_forward,
         ts_cuda_gemm_bf16_attention_backward, 1e-2, 1 << 20},
        {"table (fp32)", G->attention_saved_floats, G->attention_scratch_floats,
         G->attention_forward, G->attention_backward, 1e-5, 1 << 20},
        {"bf16 entries", ts_cuda_attention_saved_floats_bf16,
         ts_cuda_attention_scratch_floats_bf16, ts_cuda_attention_forward_bf16,
         ts_cuda_attention_backward_bf16, 1e-2, 1 << 20},
    };
    const int nv = (int)(sizeof vs / sizeof vs[0]);
    /* Every T with every HS; B and NH cycle through 1..4 and {1, 3, 12}, so both GEMM
     * batching branches (B <= NH and B > NH) and ragged last tiles are covered. */
    static const int Ts[] = {1, 7, 64, 129, 256}, HSs[] = {8, 64, 100}, NHs[] = {1, 3, 12};
    int k = 0;
    for (int t = 0; t < 5; t++)
        for (int h = 0; h < 3; h++, k++) test_shape(vs, nv, 1 + k % 4, Ts[t], NHs[k % 3], HSs[h]);
    /* Odd heads (no multiple of 4 or 8), the 16-wide tiles above HS 128, the widest
     * flash head, and one past it (GEMMs only). */
    test_shape(vs, nv, 2, 33, 2, 1);
    test_shape(vs, nv, 3, 50, 1, 3);
    test_shape(vs, nv, 1, 97, 2, 129);
    test_shape(vs, nv, 2, 70, 1, TS_CUDA_FLASH_MAX_HS);
    test_shape(vs, nv, 1, 40, 1, TS_CUDA_FLASH_MAX_HS + 1);
    return ts_test_report();
}
