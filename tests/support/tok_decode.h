/* Token ids back to bytes in one buffer, for tests that round-trip text through a
 * tokenizer (`tessera sample` streams each token's bytes, tokenizer.h
 * ts_tok_token_bytes). */
#ifndef TS_TEST_SUPPORT_TOK_DECODE_H
#define TS_TEST_SUPPORT_TOK_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Decode ids to bytes (malloc'd, *out_len bytes, NUL-terminated for convenience);
 * error naming the position of an id >= vocab_size. */
ts_status ts_tok_decode(const ts_tokenizer *tok, const uint32_t *ids, size_t n,
                        unsigned char **out, size_t *out_len);

#endif
