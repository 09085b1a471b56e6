#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static int g_rank = 0;
static int g_quiet = 0;

void ts_log_set_rank(int rank) { g_rank = rank; }
int ts_log_rank(void) { return g_rank; }
void ts_log_set_quiet(int quiet) { g_quiet = quiet; }

static void emit(const char *prefix, const char *fmt, va_list ap)
{
    fputs(prefix, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
}

void ts_log_info(const char *fmt, ...)
{
    if (g_rank != 0 || g_quiet) return;
    va_list ap;
    va_start(ap, fmt);
    emit("", fmt, ap);
    va_end(ap);
}

void ts_log_warn(const char *fmt, ...)
{
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    emit("tessera: warning: ", fmt, ap);
    va_end(ap);
}

void ts_log_error(const char *fmt, ...)
{
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    emit("tessera: error: ", fmt, ap);
    va_end(ap);
}

void ts_log_any(const char *fmt, ...)
{
    char prefix[32];
    snprintf(prefix, sizeof prefix, "[rank %d] ", g_rank);
    va_list ap;
    va_start(ap, fmt);
    emit(prefix, fmt, ap);
    va_end(ap);
}
