/* The strict test backend (kernels/strict, train.device = "cpu-strict"): its device
 * memory is zeroed, reusable and reachable through its copies and kernels, which give
 * the CPU backend's results; and a host access to a device buffer, the mistake the
 * mode exists to catch, kills the process at that access with a message naming the
 * buffer. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "kernels/kernels.h"
#include "kernels/strict/arena.h"
#include "test_util.h"

static const ts_kernels *S = &ts_kernels_cpu_strict;

static void test_table(void)
{
    CHECKF(!ts_kernels_missing(S), "missing %s", ts_kernels_missing(S));
    CHECK(!S->host_accessible);
    CHECK(ts_kernels_find("cpu-strict") == S);
    CHECK(ts_kernels_find("cpu") == &ts_kernels_cpu);
    CHECK(ts_kernels_find("cuda-nope") == NULL);
}

static void test_memory(void)
{
    enum { N = 3000 };
    float host[N], back[N];
    float *d = S->dev_alloc(N * sizeof(float));
    CHECK(d != NULL && ts_strict_owns(d) && (size_t)d % 64 == 0);
    S->memcpy_d2h(back, d, sizeof back);
    int zero = 1;
    for (int i = 0; i < N; i++) zero &= back[i] == 0.0f;
    CHECK(zero);
    for (int i = 0; i < N; i++) host[i] = (float)i * 0.5f;
    S->memcpy_h2d(d, host, sizeof host);
    float *e = S->dev_alloc(N * sizeof(float));
    S->memcpy_d2d(e, d, sizeof host);
    S->memcpy_d2h(back, e, sizeof back);
    CHECK(!memcmp(back, host, sizeof host));
    double acc[2] = { 0, 0 }, *dacc = S->dev_alloc(sizeof acc);
    S->sum_into(dacc, e, N);
    S->sum_squares_into(dacc + 1, e, N);
    S->memcpy_d2h(acc, dacc, sizeof acc);
    double want = 0, want2 = 0;
    for (int i = 0; i < N; i++) want += host[i], want2 += (double)host[i] * host[i];
    CHECK(acc[0] == want && acc[1] == want2 && S->sum_squares(e, N) == want2);
    S->memset_zero(e, sizeof host);
    S->memcpy_d2h(back, e, sizeof back);
    CHECK(back[0] == 0.0f && back[N - 1] == 0.0f);

    /* Freed blocks are reused, and come back zeroed; neighbours merge. */
    S->dev_free(d);
    S->dev_free(e);
    float *f = S->dev_alloc(2 * N * sizeof(float));
    CHECK(f == d); /* the two freed neighbours, merged */
    S->memcpy_d2h(back, f, sizeof back);
    zero = 1;
    for (int i = 0; i < N; i++) zero &= back[i] == 0.0f;
    CHECK(zero);
    S->dev_free(f);
    S->dev_free(dacc);
    CHECK(S->dev_alloc(0) == NULL);
}

/* A kernel on strict memory gives the CPU backend's result on host memory. */
static void test_kernel_matches_cpu(void)
{
    enum { Nr = 5, C = 7, OC = 3 };
    float inp[Nr * C], w[OC * C], b[OC], want[Nr * OC], got[Nr * OC];
    for (int i = 0; i < Nr * C; i++) inp[i] = (float)((i * 7) % 11) - 5.0f;
    for (int i = 0; i < OC * C; i++) w[i] = (float)((i * 3) % 5) * 0.25f;
    for (int i = 0; i < OC; i++) b[i] = (float)i;
    ts_kernels_cpu.matmul_forward(want, inp, w, b, Nr, C, OC);
    float *dinp = S->dev_alloc(sizeof inp), *dw = S->dev_alloc(sizeof w);
    float *db = S->dev_alloc(sizeof b), *dout = S->dev_alloc(sizeof got);
    S->memcpy_h2d(dinp, inp, sizeof inp);
    S->memcpy_h2d(dw, w, sizeof w);
    S->memcpy_h2d(db, b, sizeof b);
    S->matmul_forward(dout, dinp, dw, db, Nr, C, OC);
    S->memcpy_d2h(got, dout, sizeof got);
    CHECK(!memcmp(got, want, sizeof got));
    S->dev_free(dinp);
    S->dev_free(dw);
    S->dev_free(db);
    S->dev_free(dout);
}

/* Calls from two threads at once (the async checkpoint saver copies while the main
 * thread computes): the arena stays open until the last one leaves. */
static void *copy_loop(void *arg)
{
    float *d = arg, host[256];
    for (int i = 0; i < 2000; i++) S->memcpy_d2h(host, d, sizeof host);
    return NULL;
}

static void test_threads(void)
{
    float *a = S->dev_alloc(256 * sizeof(float)), *b = S->dev_alloc(256 * sizeof(float));
    pthread_t th;
    CHECK(pthread_create(&th, NULL, copy_loop, a) == 0);
    for (int i = 0; i < 2000; i++) S->residual_forward(b, b, b, 256);
    pthread_join(th, NULL);
    S->dev_free(a);
    S->dev_free(b);
    CHECK(1); /* reaching here without a fault is the check */
}

/* The deliberate mistake, in a child process: host code reads a device buffer
 * directly. The child must die at that read, and say which buffer. */
static void test_host_access_caught(int write_it)
{
    int fds[2];
    if (pipe(fds) != 0) {
        perror("pipe");
        exit(2);
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        float *d = S->dev_alloc(100 * sizeof(float));
        S->memset_zero(d, 100 * sizeof(float)); /* through the backend: fine */
        volatile float *v = d;
        if (write_it)
            v[42] = 1.0f; /* the mistake */
        else
            (void)v[42];
        _exit(0); /* not caught: the test fails */
    }
    close(fds[1]);
    char buf[4096];
    ts_test_read_all(fds[0], buf, sizeof buf);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "a host %s went unnoticed",
           write_it ? "write" : "read");
    CHECKF(strstr(buf, "host code touched device memory") && strstr(buf, "byte 168 of a"),
           "the message names the buffer: %s", buf);
}

int main(void)
{
    test_table();
    test_memory();
    test_kernel_matches_cpu();
    test_threads();
    test_host_access_caught(0);
    test_host_access_caught(1);
    return ts_test_report();
}
