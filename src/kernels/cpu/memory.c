/* The CPU backend's memory, ordering and size queries: device memory is host memory,
 * copies are memcpy, streams and events are no-ops (every call completes before it
 * returns). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/cpu/cpu_internal.h"

void *ts_cpu_dev_alloc(size_t bytes)
{
    if (bytes == 0) return NULL;
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = NULL;
    /* Every caller is a void path of the model, engine or optimizer, so the exit names
     * what a device buffer is and where the run's estimate of them is shown. */
    if (posix_memalign(&p, 64, rounded) != 0 || !p)
        ts_out_of_memory(rounded, "a device buffer (parameters, gradients, optimizer moments "
                                  "or activations) beyond what the memory check estimated "
                                  "(the \"memory:\" line at start-up, or tessera plan): set "
                                  "parallel.memory_budget_mb to the memory this rank may use");
    memset(p, 0, rounded);
    return p;
}

void ts_cpu_dev_free(void *p) { free(p); }

void ts_cpu_memcpy(void *dst, const void *src, size_t bytes)
{
    if (bytes) memmove(dst, src, bytes);
}

void ts_cpu_memcpy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t rows)
{
    for (size_t i = 0; i < rows; i++)
        memcpy((unsigned char *)dst + i * dpitch, (const unsigned char *)src + i * spitch, width);
}

void ts_cpu_memset_zero(void *dst, size_t bytes)
{
    if (bytes) memset(dst, 0, bytes);
}

void ts_cpu_sum_into(double *acc, const float *x, size_t n)
{
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) s += x[i];
    *acc += s;
}

void ts_cpu_sum_squares_into(double *acc, const float *x, size_t n)
{
    *acc += ts_cpu_sum_squares(x, n);
}

ts_stream ts_cpu_stream_create(void) { return NULL; }
void ts_cpu_stream_destroy(ts_stream s) { (void)s; }
void ts_cpu_stream_sync(ts_stream s) { (void)s; }
ts_event ts_cpu_event_record(ts_stream s)
{
    (void)s;
    return NULL;
}
void ts_cpu_event_wait(ts_event e) { (void)e; }

/* attention_forward keeps the softmax probabilities; its backward needs as much again
 * (fp32: this table's act_dtype). */
size_t ts_cpu_attention_saved_bytes(int B, int T, ts_att_heads h)
{
    return (size_t)B * h.NH * T * T * sizeof(float);
}

size_t ts_cpu_attention_scratch_bytes(int B, int T, ts_att_heads h)
{
    return (size_t)B * h.NH * T * T * sizeof(float);
}

/* attention_prefix_forward keeps the probabilities [B,NH,Tq,Tk]; its backward's dS is
 * as large (fp32). */
size_t ts_cpu_attention_prefix_saved_bytes(int B, int Tq, int Tk, ts_att_heads h)
{
    return (size_t)B * h.NH * Tq * Tk * sizeof(float);
}

size_t ts_cpu_attention_prefix_scratch_bytes(int B, int Tq, int Tk, ts_att_heads h)
{
    return (size_t)B * h.NH * Tq * Tk * sizeof(float);
}
