#include "model/tokenizer_open.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

ts_status ts_model_tokenizer_open(const ts_model_config *m, const char *path, ts_tokenizer **out)
{
    *out = NULL;
    if (!m->tokenizer[0]) return TS_OK;
    char def[TS_PATH_MAX];
    const char *from = path ? "the command line" : "model.tokenizer_file";
    if (!path && m->tokenizer_file[0]) path = m->tokenizer_file;
    if (!path) {
        if (ts_tokenizer_default_path(m->tokenizer, def, sizeof def) != TS_OK) return TS_ERR;
        path = def;
        from = "the default path";
    }
    /* Said before the tokenizer's own error for an absent file: the usual cause is a
     * machine where the ranks were never fetched, and the fix is one command. */
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT)
        return ts_fail("model.tokenizer = \"%s\": its ranks file %s (%s) does not exist; run "
                       "scripts/fetch_tokenizers.sh (it puts %s.tiktoken under "
                       "$TS_TOKENIZER_DIR, default ~/.cache/tessera/tokenizers) or set "
                       "model.tokenizer_file to the file",
                       m->tokenizer, path, from, m->tokenizer);
    ts_tokenizer *tok;
    if (ts_tokenizer_open(&tok, m->tokenizer, path) != TS_OK)
        return ts_error_prefix("model.tokenizer = \"%s\" (%s): ", m->tokenizer, path);
    const uint32_t V = ts_tokenizer_vocab_size(tok);
    if ((uint64_t)m->vocab_size < V) {
        ts_tokenizer_free(tok);
        return ts_fail("model.vocab_size = %d is smaller than model.tokenizer = \"%s\"'s %u ids "
                       "(%s): the model could not read or predict the ids above %d; set "
                       "vocab_size >= %u (llm.c pads gpt2's 50257 to 50304)",
                       m->vocab_size, m->tokenizer, V, path, m->vocab_size - 1, V);
    }
    *out = tok;
    return TS_OK;
}
