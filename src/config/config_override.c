/* The `--set KEY=VALUE` overrides (config_internal.h): each value parsed as libconfig
 * parses one (falling back to a bare string) and grafted into the libconfig tree at its
 * dotted key, before the tree is read against the key table (config_load.c). With the
 * libconfig helpers the file reader shares: the names of setting types, and the scan
 * for integer literals libconfig would silently truncate or clamp. */
#include "config/config_internal.h"

#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ libconfig -- */

const char *ts_config_type_name(int type)
{
    switch (type) {
    case CONFIG_TYPE_GROUP: return "a group";
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: return "an integer";
    case CONFIG_TYPE_FLOAT: return "a float";
    case CONFIG_TYPE_STRING: return "a string";
    case CONFIG_TYPE_BOOL: return "a boolean";
    case CONFIG_TYPE_ARRAY: return "an array";
    case CONFIG_TYPE_LIST: return "a list";
    default: return "nothing";
    }
}

/* libconfig 1.5 reads a decimal integer literal that does not fit in 32 bits and has
 * no `L` suffix as its low 32 bits (5000000000 becomes 705032704), and one beyond 64
 * bits (with or without `L`) as INT64_MAX, both silently. Find the first such literal
 * in libconfig text, outside strings and comments: returns its line (from 1), copies
 * it to `tok` and sets *beyond_64 (else it is a 32-bit overflow without `L`), or
 * returns 0 when there is none. */
int ts_config_find_wide_int(const char *text, char *tok, size_t cap, bool *beyond_64)
{
    int line = 1;
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            line++;
            p++;
        } else if (*p == '"') { /* a string: skip to the closing quote */
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1]) p++;
                if (*p == '\n') line++;
            }
            if (*p) p++;
        } else if (*p == '#' || (p[0] == '/' && p[1] == '/')) {
            while (*p && *p != '\n') p++;
        } else if (p[0] == '/' && p[1] == '*') {
            for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++)
                if (*p == '\n') line++;
            if (*p) p += 2;
        } else if (isdigit((unsigned char)*p) &&
                   (p == text || !(isalnum((unsigned char)p[-1]) || p[-1] == '_' || p[-1] == '.'))) {
            const char *start = p;
            while (isalnum((unsigned char)*p) || *p == '_' || *p == '.' ||
                   ((*p == '+' || *p == '-') && (p[-1] == 'e' || p[-1] == 'E')))
                p++;
            /* Decimal digits, optionally with libconfig's 64-bit suffix L or LL. */
            size_t n = (size_t)(p - start), digits = strspn(start, "0123456789");
            size_t suffix = n - digits;
            if (digits == 0 || suffix > 2 || strspn(start + digits, "L") != suffix) continue;
            bool neg = start > text && start[-1] == '-';
            errno = 0;
            unsigned long long v = strtoull(start, NULL, 10);
            bool over64 = errno == ERANGE || v > (neg ? 9223372036854775808ULL
                                                      : 9223372036854775807ULL);
            bool over32 = v > (neg ? 2147483648ULL : 2147483647ULL);
            if (over64 || (suffix == 0 && over32)) {
                snprintf(tok, cap, "%.*s", (int)n, start);
                *beyond_64 = over64;
                return line;
            }
        } else {
            p++;
        }
    }
    return 0;
}

ts_status ts_config_huge_int_error(const char *where, const char *tok)
{
    return ts_fail("%s: the integer %s does not fit in 64 bits (-2^63 .. 2^63-1) and "
                   "libconfig would silently clamp it; use a smaller number",
                   where, tok);
}

/* -------------------------------------------------------------- overrides -- */

/* Deep-copy `src` into `parent` under `name` (NULL inside arrays and lists). */
static config_setting_t *copy_setting(config_setting_t *parent, const char *name,
                                      const config_setting_t *src)
{
    int type = config_setting_type(src);
    config_setting_t *dst = config_setting_add(parent, name, type);
    if (!dst) return NULL;
    int ok = CONFIG_TRUE;
    switch (type) {
    case CONFIG_TYPE_INT: ok = config_setting_set_int(dst, config_setting_get_int(src)); break;
    case CONFIG_TYPE_INT64:
        ok = config_setting_set_int64(dst, config_setting_get_int64(src));
        break;
    case CONFIG_TYPE_FLOAT:
        ok = config_setting_set_float(dst, config_setting_get_float(src));
        break;
    case CONFIG_TYPE_STRING:
        ok = config_setting_set_string(dst, config_setting_get_string(src));
        break;
    case CONFIG_TYPE_BOOL: ok = config_setting_set_bool(dst, config_setting_get_bool(src)); break;
    case CONFIG_TYPE_GROUP:
    case CONFIG_TYPE_ARRAY:
    case CONFIG_TYPE_LIST: {
        int n = config_setting_length(src);
        for (int i = 0; i < n; i++) {
            const config_setting_t *e = config_setting_get_elem(src, (unsigned)i);
            const char *ename = type == CONFIG_TYPE_GROUP ? config_setting_name(e) : NULL;
            if (!copy_setting(dst, ename, e)) return NULL;
        }
        break;
    }
    default: break;
    }
    return ok == CONFIG_TRUE ? dst : NULL;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
    size_t i = 0;
    while (s[i] == ' ' || s[i] == '\t') i++;
    if (i) memmove(s, s + i, n - i + 1);
}

/* Graft the override's value, parsed as a libconfig value or else taken as a bare
 * string, at the dotted path `key` of `lc`, replacing whatever was there. `key` is
 * modified (split in place). */
static ts_status set_path(config_t *lc, char *key, const char *value, const char *ov)
{
    /* Parse the value as libconfig parses one: "v = VALUE;". */
    const config_setting_t *parsed = NULL;
    /* A lone integer beyond 32 bits gets libconfig's 64-bit suffix; anywhere else
     * (in a list) it would be truncated, so it is an error. */
    char tok[64];
    bool beyond_64 = false;
    bool wide = ts_config_find_wide_int(value, tok, sizeof tok, &beyond_64) != 0;
    if (wide && beyond_64) {
        char where[600];
        snprintf(where, sizeof where, "override '%.500s'", ov);
        return ts_config_huge_int_error(where, tok);
    }
    config_t scratch;
    config_init(&scratch);
    size_t len = strlen(value) + 8;
    char *text = ts_malloc(len);
    bool lone = value[0] != '\0' && strspn(value + (value[0] == '-' || value[0] == '+'),
                                            "0123456789") ==
                                         strlen(value) - (value[0] == '-' || value[0] == '+');
    snprintf(text, len, wide && lone ? "v = %sL;" : "v = %s;", value);
    if (config_read_string(&scratch, text) == CONFIG_TRUE) {
        const config_setting_t *root = config_root_setting(&scratch);
        if (config_setting_length(root) == 1) parsed = config_setting_get_member(root, "v");
    }
    free(text);
    if (parsed && wide && !lone) {
        config_destroy(&scratch);
        return ts_fail("override '%s': the integer %s does not fit in 32 bits; write %sL",
                       ov, tok, tok);
    }

    ts_status st = TS_OK;
    config_setting_t *parent = config_root_setting(lc);
    char *save = NULL;
    char *part = strtok_r(key, ".", &save);
    while (part && st == TS_OK) {
        char *next = strtok_r(NULL, ".", &save);
        config_setting_t *cur = config_setting_get_member(parent, part);
        if (next) { /* an intermediate group */
            if (!cur) cur = config_setting_add(parent, part, CONFIG_TYPE_GROUP);
            if (!cur)
                st = ts_fail("invalid config key in override '%s': '%s' is not a valid "
                             "name (letters, digits, '_' and '-', starting with a letter)",
                             ov, part);
            else if (config_setting_type(cur) != CONFIG_TYPE_GROUP)
                st = ts_fail("cannot apply override '%s': '%s' is %s, not a group of keys",
                             ov, part, ts_config_type_name(config_setting_type(cur)));
            parent = cur;
        } else { /* the leaf: replace */
            if (cur) config_setting_remove(parent, part);
            config_setting_t *leaf;
            if (parsed) {
                leaf = copy_setting(parent, part, parsed);
            } else {
                leaf = config_setting_add(parent, part, CONFIG_TYPE_STRING);
                if (leaf && config_setting_set_string(leaf, value) != CONFIG_TRUE) leaf = NULL;
            }
            if (!leaf)
                st = ts_fail("invalid config key in override '%s': '%s' is not a valid "
                             "name (letters, digits, '_' and '-', starting with a letter)",
                             ov, part);
        }
        part = next;
    }
    config_destroy(&scratch);
    return st;
}

ts_status ts_config_apply_override(config_t *lc, const char *ov)
{
    const char *eq = strchr(ov, '=');
    if (!eq)
        return ts_fail("malformed override '%s': expected KEY=VALUE with a dotted key, "
                       "e.g. --set parallel.pp=4",
                       ov);
    size_t klen = (size_t)(eq - ov);
    char *key = ts_malloc(klen + 1);
    memcpy(key, ov, klen);
    key[klen] = '\0';
    trim(key);
    char *value = ts_malloc(strlen(eq + 1) + 1);
    strcpy(value, eq + 1);
    trim(value);

    ts_status st = TS_OK;
    if (key[0] == '\0' || key[0] == '.' || key[strlen(key) - 1] == '.' || strstr(key, ".."))
        st = ts_fail("malformed override '%s': the key must be a dotted config key such "
                     "as train.steps",
                     ov);
    else
        st = set_path(lc, key, value, ov);
    free(key);
    free(value);
    return st;
}
