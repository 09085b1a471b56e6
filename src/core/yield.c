#include "core/yield.h"

#include <stddef.h>

static _Thread_local ts_yield_fn tl_fn;
static _Thread_local void *tl_ctx;

void ts_yield_set_hook(ts_yield_fn fn, void *ctx)
{
    tl_fn = fn;
    tl_ctx = fn ? ctx : NULL;
}

void ts_yield(void)
{
    if (tl_fn) tl_fn(tl_ctx);
}

int ts_yield_active(void)
{
    return tl_fn != NULL;
}
