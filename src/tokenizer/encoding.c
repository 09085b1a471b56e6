/* The encodings' fixed facts: names, rank counts, pre-tokenizer patterns and special
 * tokens, and where their ranks files live by default. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* tiktoken's patterns are fancy-regex (Rust); PCRE2 reads the same text differently in
 * three places, so the patterns below are spelled out instead of copied:
 * - \s is Rust's Unicode White_Space; PCRE2's \s (even with UCP) lacks U+0085 (NEL).
 *   WS below is the White_Space list, so \s -> [WS], \S -> [^WS].
 * - `$` in PCRE2 also matches before a final newline; Rust's is the end of the text: \z.
 * - Llama 3's (?i:'s|...) folds by Unicode simple case folding, where s also matches
 *   U+017F (long s); written as explicit classes so no PCRE2 caseless rule can differ.
 * \p{L} and \p{N} come from PCRE2's Unicode tables (10.42: Unicode 14), tiktoken's from
 * Rust's regex-syntax (a newer Unicode): letters and digits assigned after Unicode 14
 * are the one known difference (they split differently; ids stay valid and decode). */
#define WS "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* tiktoken's r50k_base pattern (its current, possessive form):
 * '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s */
static const char k_gpt2_pattern[] =
    "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^" WS "\\p{L}\\p{N}]++|[" WS "]++\\z|[" WS
    "]+(?![^" WS "])|[" WS "]";

/* llama_models/llama3/tokenizer.py's pat_str:
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 * \s*[\r\n]+|\s+(?!\S)|\s+ */
static const char k_llama3_pattern[] =
    "'(?:[sS\\x{17F}]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS
    "]+";

static const char *const k_gpt2_specials[] = {"<|endoftext|>"};

/* llama-models 0.3.0's list (llama_models/llama3/tokenizer.py, the file
 * scripts/fetch_tokenizers.sh takes the ranks from): 12 named, then
 * <|reserved_special_token_2|> .. <|reserved_special_token_245|>, 256 in all. */
#define TS_LLAMA3_SPECIALS 256
static const char *k_llama3_specials[TS_LLAMA3_SPECIALS];
static char k_llama3_reserved[TS_LLAMA3_SPECIALS][40];
static const char *const k_llama3_named[] = {
    "<|begin_of_text|>",  "<|end_of_text|>",      "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
    "<|eot_id|>",         "<|python_tag|>",       "<|image|>",
};

static ts_tok_encoding k_encodings[] = {
    {TS_ENC_BYTES, "bytes", 256, NULL, NULL, 0, 0},
    {TS_ENC_GPT2, "gpt2", 50256, k_gpt2_pattern, k_gpt2_specials, 1, 0},
    {TS_ENC_LLAMA3, "llama3", 128000, k_llama3_pattern, k_llama3_specials, TS_LLAMA3_SPECIALS, 0},
};

static void llama3_specials_init(void)
{
    size_t named = sizeof k_llama3_named / sizeof k_llama3_named[0];
    for (size_t i = 0; i < TS_LLAMA3_SPECIALS; i++) {
        if (i < named) {
            k_llama3_specials[i] = k_llama3_named[i];
        } else {
            snprintf(k_llama3_reserved[i], sizeof k_llama3_reserved[i],
                     "<|reserved_special_token_%zu|>", 2 + i - named);
            k_llama3_specials[i] = k_llama3_reserved[i];
        }
    }
}

const ts_tok_encoding *ts_tok_encoding_get(ts_encoding_kind kind)
{
    /* The reserved names are built once; pthread_once makes that safe from any thread. */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, llama3_specials_init);
    for (size_t i = 0; i < sizeof k_encodings / sizeof k_encodings[0]; i++)
        if (k_encodings[i].kind == kind) return &k_encodings[i];
    return NULL;
}

int ts_encoding_parse(const char *name, ts_encoding_kind *kind)
{
    for (size_t i = 0; i < sizeof k_encodings / sizeof k_encodings[0]; i++) {
        if (name && strcmp(name, k_encodings[i].name) == 0) {
            *kind = k_encodings[i].kind;
            return 0;
        }
    }
    return -1;
}

const char *ts_encoding_name(ts_encoding_kind kind)
{
    for (size_t i = 0; i < sizeof k_encodings / sizeof k_encodings[0]; i++)
        if (k_encodings[i].kind == kind) return k_encodings[i].name;
    return "unknown";
}

ts_status ts_tokenizer_default_path(const char *encoding, char *buf, size_t cap)
{
    const char *dir = getenv("TS_TOKENIZER_DIR");
    int n;
    if (dir && dir[0]) {
        n = snprintf(buf, cap, "%s/%s.tiktoken", dir, encoding);
    } else {
        const char *home = getenv("HOME");
        if (!home || !home[0])
            return ts_fail("no ranks file for encoding %s: neither TS_TOKENIZER_DIR nor HOME "
                           "is set; set TS_TOKENIZER_DIR to the folder "
                           "scripts/fetch_tokenizers.sh filled",
                           encoding);
        n = snprintf(buf, cap, "%s/.cache/tessera/tokenizers/%s.tiktoken", home, encoding);
    }
    if (n < 0 || (size_t)n >= cap)
        return ts_fail("the default ranks path for encoding %s is longer than %zu bytes; "
                       "use a shorter TS_TOKENIZER_DIR",
                       encoding, cap);
    return TS_OK;
}
