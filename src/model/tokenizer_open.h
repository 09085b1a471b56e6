/* The tokenizer a model config names (model.tokenizer, model.tokenizer_file), opened
 * and checked against the model: the trainer at start and `tessera sample` both use it,
 * so both find the same ranks file by the same rule and refuse the same mismatches. */
#ifndef TS_MODEL_TOKENIZER_OPEN_H
#define TS_MODEL_TOKENIZER_OPEN_H

#include "config/config.h"
#include "tokenizer/tokenizer.h"

/* *out = NULL when m names no tokenizer. Else the ranks file is `path` when given (a
 * command-line override), else m->tokenizer_file, else the encoding's default path
 * (ts_tokenizer_default_path); a missing file is an error saying to run
 * scripts/fetch_tokenizers.sh or set model.tokenizer_file; the tokenizer's vocabulary
 * must fit in m->vocab_size. The caller frees *out (ts_tokenizer_free). */
ts_status ts_model_tokenizer_open(const ts_model_config *m, const char *path, ts_tokenizer **out);

#endif
