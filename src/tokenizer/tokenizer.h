/* Byte-level BPE tokenizers exact to tiktoken: GPT-2's r50k_base and Llama 3's, read
 * from tiktoken's ranks format (one `base64(bytes) rank` line per token), plus the
 * byte-level "encoding" (vocab 256, token = byte) that tessera used before.
 *
 * Encoding text: the text is cut into maximal valid UTF-8 runs and invalid bytes; each
 * run is pre-tokenized by the encoding's pattern (PCRE2, UTF + UCP, JIT) and each piece
 * merged by rank, exactly as tiktoken's encode_ordinary does for that run as a string;
 * an invalid byte becomes its single-byte token. So every byte string encodes, and
 * decode(encode(x)) == x for every x. (Valid = strict UTF-8: no overlong forms, no
 * encoded surrogates, nothing above U+10FFFF, no truncated sequence; a byte that starts
 * no valid character is invalid on its own, so E2 82 41 is two invalid bytes and "A".)
 * Letters and digits are tiktoken 0.14's (Unicode 16): PCRE2's tables (Debian 12's
 * 10.42: Unicode 14) plus those assigned since, spelled in the patterns (encoding.c).
 *
 * A ts_tokenizer is immutable after loading and shared by threads; each thread encodes
 * with its own ts_tok_encoder (PCRE2 match data, merge scratch, piece cache). */
#ifndef TS_TOKENIZER_H
#define TS_TOKENIZER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

typedef enum { TS_ENC_BYTES, TS_ENC_GPT2, TS_ENC_LLAMA3 } ts_encoding_kind;

typedef struct ts_tokenizer ts_tokenizer;
typedef struct ts_tok_encoder ts_tok_encoder;

/* A growable id list the encoder appends to (the caller owns ids; free(ids)). */
typedef struct {
    uint32_t *ids;
    size_t n, cap;
} ts_tok_ids;

/* "bytes", "gpt2" or "llama3" -> kind; 0 if known, -1 otherwise. */
int ts_encoding_parse(const char *name, ts_encoding_kind *kind);
const char *ts_encoding_name(ts_encoding_kind kind);

/* Where an encoding's ranks file is looked for when no path is given:
 * $TS_TOKENIZER_DIR/NAME.tiktoken, else $HOME/.cache/tessera/tokenizers/NAME.tiktoken
 * (scripts/fetch_tokenizers.sh puts them there). Writes the path into buf. */
ts_status ts_tokenizer_default_path(const char *encoding, char *buf, size_t cap);

/* Load a tokenizer. encoding: "gpt2", "llama3", "bytes", or NULL / "auto" = chosen by
 * the ranks file's number of ranks (50256 -> gpt2, 128000 -> llama3; auto needs a
 * ranks_path). ranks_path: the ranks file, or NULL for the default path (unused for
 * "bytes"). Errors (file:line): bad base64 (strict: standard alphabet, padded,
 * canonical), a rank not a number, duplicate ranks or duplicate byte strings, a gap in
 * the ranks, a single byte without a rank, a rank count that is not the encoding's
 * ("the wrong size for --encoding").
 * Special tokens are numbered from the rank count: gpt2's <|endoftext|>; llama3's 256
 * from llama-models 0.3.0 (<|begin_of_text|>, <|end_of_text|>, <|reserved_special_token_0|>,
 * <|reserved_special_token_1|>, <|finetune_right_pad_id|>, <|step_id|>,
 * <|start_header_id|>, <|end_header_id|>, <|eom_id|>, <|eot_id|>, <|python_tag|>,
 * <|image|>, then <|reserved_special_token_2|> .. <|reserved_special_token_245|>).
 * Tests only: with TS_TEST_TOKENIZER_ANY_SIZE=1 in the environment a named encoding
 * accepts a ranks file of any size (a small fixture), its specials numbered from that
 * file's rank count. */
ts_status ts_tokenizer_open(ts_tokenizer **out, const char *encoding, const char *ranks_path);
void ts_tokenizer_free(ts_tokenizer *tok);

ts_encoding_kind ts_tokenizer_kind(const ts_tokenizer *tok);
/* Lowercase hex sha256 of the ranks file's bytes ("" for bytes). */
const char *ts_tokenizer_sha256(const ts_tokenizer *tok);
/* The ranks file's path ("" for bytes). */
const char *ts_tokenizer_path(const ts_tokenizer *tok);
/* Ids are 0 .. vocab_size-1: ranks then special tokens (50257 for gpt2, 128256 llama3). */
uint32_t ts_tokenizer_vocab_size(const ts_tokenizer *tok);
/* The token that starts each document in `tessera data` (llm.c's rule): 50256
 * <|endoftext|> for gpt2, 128000 <|begin_of_text|> for llama3; -1 for bytes. */
int64_t ts_tokenizer_doc_token(const ts_tokenizer *tok);
/* Id of a special token by its text ("<|endoftext|>"), or -1. */
int64_t ts_tokenizer_special_id(const ts_tokenizer *tok, const char *text);

/* Per-thread encoder. */
ts_status ts_tok_encoder_new(const ts_tokenizer *tok, ts_tok_encoder **out);
void ts_tok_encoder_free(ts_tok_encoder *enc);
/* A flag the encoder polls (NULL, the default: none), such as a signal handler's: once
 * *stop is non-zero, ts_tok_encode and ts_tok_encode_special stop before the next
 * pre-token piece (a long piece's merge polls too) and fail with "stopped at byte N of
 * M", so that one large document cannot hold a stop back for minutes.
 * ts_tok_encoder_stopped_at then says N, how far into the text the encoder had got. */
void ts_tok_encoder_set_stop(ts_tok_encoder *enc, const volatile sig_atomic_t *stop);
size_t ts_tok_encoder_stopped_at(const ts_tok_encoder *enc);

/* tiktoken's encode_ordinary: special tokens' texts are plain text. Appends to out.
 * *n_invalid (may be NULL) is set to the number of bytes of this text that were not
 * valid UTF-8 (for "bytes" too, whose ids are the bytes). Fails only when PCRE2 reports an
 * error (ts_error_message says which); out then holds the ids made so far. */
ts_status ts_tok_encode(ts_tok_encoder *enc, const char *text, size_t len, ts_tok_ids *out,
                        uint64_t *n_invalid);
/* tiktoken's encode(allowed_special="all"): a special token's text becomes its id, and
 * the text between specials is encoded as separate strings (as tiktoken does). */
ts_status ts_tok_encode_special(ts_tok_encoder *enc, const char *text, size_t len,
                                ts_tok_ids *out, uint64_t *n_invalid);

/* The bytes of token id (a special's text for specials); NULL if id >= vocab_size. */
const unsigned char *ts_tok_token_bytes(const ts_tokenizer *tok, uint32_t id, size_t *len);

#endif
