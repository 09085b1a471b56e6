/* ts_tok_decode (tok_decode.h). */
#include "support/tok_decode.h"

#include <string.h>

ts_status ts_tok_decode(const ts_tokenizer *t, const uint32_t *ids, size_t n, unsigned char **out,
                        size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    size_t total = 0, len;
    for (size_t i = 0; i < n; i++) {
        if (!ts_tok_token_bytes(t, ids[i], &len))
            return ts_fail("token %zu is id %u, outside the %s vocabulary of %u ids", i,
                           ids[i], ts_encoding_name(ts_tokenizer_kind(t)),
                           ts_tokenizer_vocab_size(t));
        total += len;
    }
    unsigned char *buf = ts_malloc(total + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *b = ts_tok_token_bytes(t, ids[i], &len);
        memcpy(buf + o, b, len);
        o += len;
    }
    buf[o] = 0;
    *out = buf;
    *out_len = o;
    return TS_OK;
}
