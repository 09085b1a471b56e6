/* Is there a CUDA device this process can use? The GPU command-line tests
 * (tests/test_gpu_*.sh) run it first and pass its answer on as CTest's skip code:
 * exit 0 when ts_cuda_device_count() > 0, 77 (skipped) when it is 0 (no driver, no
 * device, CUDA_VISIBLE_DEVICES empty) and always in a build without the CUDA backend.
 * Prints one line saying which, so a skipped test's log says why. */
#include <stdio.h>

#include "kernels/kernels.h"

int main(void)
{
#ifdef TS_HAVE_CUDA
    int n = ts_cuda_device_count();
    if (n > 0) {
        printf("gpu_present: %d CUDA device%s\n", n, n == 1 ? "" : "s");
        return 0;
    }
    printf("gpu_present: no CUDA device (driver, CUDA_VISIBLE_DEVICES or the machine)\n");
    return 77;
#else
    printf("gpu_present: this tessera was built without the CUDA backend (TS_CUDA=OFF or no "
           "toolkit)\n");
    return 77;
#endif
}
