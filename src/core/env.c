#include "core/env.h"

#include <stdlib.h>

#include "core/error.h"

static const char *const NAMES[TS_ENV_COUNT] = {
    [TS_ENV_NO_BIND] = "TS_NO_BIND",
    [TS_ENV_FAKE_NODES] = "TS_FAKE_NODES",
    [TS_ENV_FAKE_BLAS_CORE] = "TS_FAKE_BLAS_CORE",
    [TS_ENV_PP_EXCHANGE] = "TS_PP_EXCHANGE",
    [TS_ENV_TEST_SAVE_STALL_S] = "TS_TEST_SAVE_STALL_S",
    [TS_ENV_TEST_INIT_STALL_S] = "TS_TEST_INIT_STALL_S",
    [TS_ENV_TEST_TOKENIZER_ANY_SIZE] = "TS_TEST_TOKENIZER_ANY_SIZE",
    [TS_ENV_PP_PAIRS] = "TS_PP_PAIRS",
};

const char *ts_env_name(ts_env_switch s)
{
    TS_ASSERT(s >= 0 && s < TS_ENV_COUNT);
    return NAMES[s];
}

const char *ts_env(ts_env_switch s)
{
    const char *v = getenv(ts_env_name(s));
    return v && *v ? v : NULL;
}
