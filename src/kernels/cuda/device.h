/* The CUDA devices as the rest of the program sees them, for code that is not CUDA C
 * (the topology, the NCCL comm backend): device queries by ordinal, and the compute
 * stream as an opaque pointer. C-callable; the definitions are in device.cu. Include
 * only where TS_HAVE_CUDA is defined. The count and the choice of device are in
 * kernels/kernels.h (ts_cuda_device_count, ts_cuda_select_device). */
#ifndef TS_KERNELS_CUDA_DEVICE_H
#define TS_KERNELS_CUDA_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Length of a PCI bus id "dddd:bb:dd.f" with its terminator (CUDA's form has 8 domain
 * digits at most: 13 + 4). */
#define TS_PCI_BUSID_MAX 20

/* Device `ordinal`'s PCI bus id in sysfs's form ("0000:3b:00.0": lower case, 4-digit
 * domain), into busid[TS_PCI_BUSID_MAX]. False (busid "") when CUDA cannot say. Needs
 * no context on the device. */
bool ts_cuda_device_pci(int ordinal, char *busid);
/* Device `ordinal`'s name ("NVIDIA H200"), "?" when CUDA cannot say. */
void ts_cuda_device_name(int ordinal, char *name, size_t cap);
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
