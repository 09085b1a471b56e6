/* Fuzz the BPE tokenizer: the ranks-file parser and the encoder's round trip.
 *
 * Input: byte 0 picks the mode, the rest is the payload.
 *   b % 4 == 0  the payload is a ranks file: it opens (as gpt2, the size check lifted as
 *               in the tests) or is refused with a message; when it opens, its own first
 *               lines' text must encode and decode back exactly
 *   b % 4 == 1  the payload is text for the fixture ranks under gpt2's pattern
 *   b % 4 == 2  the same under llama3's pattern
 *   b % 4 == 3  the same with special tokens allowed (tiktoken's allowed_special="all")
 * For text: every id is < vocab_size, decode(encode(x)) == x byte for byte (invalid
 * UTF-8 included), and the invalid-byte count is at most the text's length. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "support/tok_decode.h"
#include "tokenizer/tokenizer.h"

/* scripts/fuzz.sh runs the harnesses from the repository's root. */
#define FIXTURE "tests/fixtures/bpe/small.tiktoken"

static const char *ranks_path;
static ts_tokenizer *tok[2];
static ts_tok_encoder *enc[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_init_dir();
    ranks_path = fuzz_path("ranks.tiktoken");
    setenv("TS_TEST_TOKENIZER_ANY_SIZE", "1", 1);
    const char *names[2] = {"gpt2", "llama3"};
    for (int i = 0; i < 2; i++)
        if (ts_tokenizer_open(&tok[i], names[i], FIXTURE) != TS_OK ||
            ts_tok_encoder_new(tok[i], &enc[i]) != TS_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s (run from the repository root)\n",
                    ts_error_message());
            abort();
        }
    return 0;
}

/* Encode text with e, check the ids and the round trip. */
static void round_trip(const ts_tokenizer *t, ts_tok_encoder *e, const uint8_t *text,
                       size_t len, int special)
{
    ts_tok_ids ids = {0};
    uint64_t invalid = 0;
    ts_status st = special ? ts_tok_encode_special(e, (const char *)text, len, &ids, &invalid)
                           : ts_tok_encode(e, (const char *)text, len, &ids, &invalid);
    if (st != TS_OK) abort(); /* every byte string encodes */
    if (invalid > len) abort();
    uint32_t vocab = ts_tokenizer_vocab_size(t);
    for (size_t i = 0; i < ids.n; i++)
        if (ids.ids[i] >= vocab) abort();
    unsigned char *back = NULL;
    size_t back_len = 0;
    if (ts_tok_decode(t, ids.ids, ids.n, &back, &back_len) != TS_OK) abort();
    if (back_len != len || (len && memcmp(back, text, len) != 0)) abort();
    free(back);
    free(ids.ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    int mode = data[0] % 4;
    if (mode == 0) {
        fuzz_write(ranks_path, p, n);
        ts_tokenizer *t = NULL;
        if (ts_tokenizer_open(&t, "gpt2", ranks_path) != TS_OK) return 0;
        ts_tok_encoder *e = NULL;
        if (ts_tok_encoder_new(t, &e) != TS_OK) abort();
        round_trip(t, e, p, n < 256 ? n : 256, 0);
        ts_tok_encoder_free(e);
        ts_tokenizer_free(t);
        return 0;
    }
    int which = mode == 2;
    round_trip(tok[which], enc[which], p, n, mode == 3);
    return 0;
}
