/* The CUDA device and stream as the NCCL comm backend sees them, for code that is not
 * CUDA C: the current device, its memory, and the compute stream as an opaque pointer.
 * C-callable; the definitions are in device.cu. Include only where
 * TS_HAVE_CUDA is defined. What the rest of the program asks of the devices (count,
 * choice, names, PCI bus ids) is in kernels/kernels.h. */
#ifndef TS_KERNELS_CUDA_DEVICE_H
#define TS_KERNELS_CUDA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The device this thread works on (cudaGetDevice), -1 on failure. */
int ts_cuda_current_device(void);
/* The compute backend's stream (a cudaStream_t), made on first use on the current
 * device: what other streams order themselves after and before. */
void *ts_cuda_compute_stream(void);
/* The current device's free and total memory (cudaMemGetInfo); false (both 0) when
 * CUDA cannot say. */
bool ts_cuda_memory_info(size_t *free_bytes, size_t *total_bytes);

#ifdef __cplusplus
}
#endif

#endif
