/* Device queries for code outside the CUDA backend (kernels.h, device.h). None aborts:
 * a device CUDA cannot describe is reported as unknown and the caller decides. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/device.h"
#include "kernels/kernels.h"

bool ts_cuda_device_pci(int ordinal, char *busid)
{
    busid[0] = '\0';
    char raw[64] = { 0 };
    if (cudaDeviceGetPCIBusId(raw, (int)sizeof raw, ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    /* CUDA writes "0000:3B:00.0" (or an 8-digit domain); sysfs and hwloc use lower
     * case and a 4-digit domain. */
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    if (sscanf(raw, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) != 4) return false;
    snprintf(busid, TS_PCI_BUSID_MAX, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
    return true;
}

void ts_cuda_device_name(int ordinal, char *name, size_t cap)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(name, cap, "?");
        return;
    }
    snprintf(name, cap, "%s", prop.name);
}

int ts_cuda_current_device(void)
{
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return d;
}

void *ts_cuda_compute_stream(void) { return (void *)ts_cuda_stream(); }

bool ts_cuda_memory_info(size_t *free_bytes, size_t *total_bytes)
{
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        *free_bytes = *total_bytes = 0;
        return false;
    }
    return true;
}
