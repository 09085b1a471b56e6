#include "core/sysmem.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* A "Key:   123 kB" line of a /proc file, in bytes; 0 when absent. */
static double proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0.0;
    char line[256];
    double v = 0.0;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, n) == 0 && line[n] == ':') {
            v = atof(line + n + 1) * 1024.0;
            break;
        }
    fclose(f);
    return v;
}

/* The cgroup v2 (or v1) memory limit of this process, or +inf. */
static double cgroup_limit(void)
{
    const char *files[] = { "/sys/fs/cgroup/memory.max",
                            "/sys/fs/cgroup/memory/memory.limit_in_bytes" };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        FILE *f = fopen(files[i], "r");
        if (!f) continue;
        char text[64] = "";
        bool got = fgets(text, sizeof text, f) != NULL;
        fclose(f);
        if (!got || strncmp(text, "max", 3) == 0) continue;
        double v = atof(text);
        if (v > 0 && v < 1e18) return v;
    }
    return INFINITY;
}

void ts_sysmem_read(ts_sysmem *lim)
{
    double total = proc_kb("/proc/meminfo", "MemTotal");
    if (total <= 0) total = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double cg = cgroup_limit();
    lim->physical = cg < total ? cg : total;
    struct rlimit rl;
    lim->address_space = INFINITY;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        lim->address_space = (double)rl.rlim_cur;
    lim->rss_now = proc_kb("/proc/self/status", "VmRSS");
    lim->vm_now = proc_kb("/proc/self/status", "VmSize");
}

const char *ts_format_bytes(double bytes, char *buf, size_t size)
{
    if (bytes >= 1024.0 * 1024 * 1024)
        snprintf(buf, size, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else if (bytes >= 1024.0 * 1024)
        snprintf(buf, size, "%.2f MiB", bytes / (1024.0 * 1024));
    else
        snprintf(buf, size, "%.1f KiB", bytes / 1024.0);
    return buf;
}

bool ts_sysmem_reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    bool ok = fputs("5", f) >= 0;
    ok = fclose(f) == 0 && ok;
    return ok;
}

double ts_sysmem_peak_rss(void)
{
    return proc_kb("/proc/self/status", "VmHWM");
}
