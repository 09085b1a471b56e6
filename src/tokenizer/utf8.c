/* Strict UTF-8 (RFC 3629): what counts as text for the pre-tokenizer. Anything else is
 * an invalid byte and becomes its single-byte token (tokenizer.h). */
#include "tokenizer/tok_internal.h"

size_t ts_tok_utf8_len(const unsigned char *p, size_t avail)
{
    unsigned c = p[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0; /* a continuation byte, or an overlong 2-byte lead */
    if (c < 0xE0) return avail >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (avail < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0;  /* overlong */
        if (c == 0xED && p[1] >= 0xA0) return 0; /* a UTF-16 surrogate */
        return 3;
    }
    if (c < 0xF5) {
        if (avail < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 ||
            (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0;  /* overlong */
        if (c == 0xF4 && p[1] >= 0x90) return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}
