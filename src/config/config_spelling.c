/* The errors for an unknown config key or section (config_internal.h), with a spelling
 * hint: the same key in another section, a known key written outside its section, or
 * the closest known name within a few edits. */
#include "config/config_internal.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

/* Edit distance counting an adjacent transposition as one edit ("stpes" -> "steps"). */
static int edit_distance(const char *a, const char *b)
{
    enum { MAXL = 64 };
    size_t n = strlen(a), m = strlen(b);
    if (n >= MAXL || m >= MAXL) return INT_MAX;
    int d[MAXL + 1][MAXL + 1];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

/* A close spelling is within a third of the name's length (at least 1, at most 3). */
static bool close_spelling(const char *typed, const char *known)
{
    int limit = (int)strlen(known) / 3;
    if (limit < 1) limit = 1;
    if (limit > 3) limit = 3;
    return edit_distance(typed, known) <= limit;
}

ts_status ts_config_unknown_key(const char *section, const char *name, const char *where)
{
    /* Suggest: the same name in another section, else a close spelling here. */
    char suggest[128] = "";
    for (int i = 0; i < ts_config_n_keys && !suggest[0]; i++)
        if (strcmp(ts_config_keys[i].name, name) == 0)
            snprintf(suggest, sizeof suggest, "; did you mean '%s.%s'?",
                     ts_config_keys[i].section, name);
    int best = INT_MAX;
    bool elsewhere = suggest[0] != '\0';
    for (int i = 0; i < ts_config_n_keys && !elsewhere; i++) {
        if (strcmp(ts_config_keys[i].section, section) != 0) continue;
        int d = edit_distance(name, ts_config_keys[i].name);
        if (close_spelling(name, ts_config_keys[i].name) && d < best) {
            best = d;
            snprintf(suggest, sizeof suggest, "; did you mean '%s.%s'?", section,
                     ts_config_keys[i].name);
        }
    }

    char known[1024];
    size_t len = 0;
    known[0] = '\0';
    for (int i = 0; i < ts_config_n_keys && len < sizeof known; i++)
        if (strcmp(ts_config_keys[i].section, section) == 0)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "",
                                    ts_config_keys[i].name);
    return ts_fail("unknown config key '%s.%s'%s%s; known keys in '%s' are: %s", section,
                   name, where, suggest, section, known);
}

ts_status ts_config_unknown_section(const char *name, const char *where)
{
    char suggest[96] = "";
    for (int i = 0; i < ts_config_n_sections; i++)
        if (close_spelling(name, ts_config_sections[i])) {
            snprintf(suggest, sizeof suggest, "; did you mean '%s'?", ts_config_sections[i]);
            break;
        }
    /* A known key written at the top level ("steps = 10;" outside train = {...}). */
    for (int i = 0; i < ts_config_n_keys && !suggest[0]; i++)
        if (strcmp(ts_config_keys[i].name, name) == 0)
            snprintf(suggest, sizeof suggest, "; did you mean '%s.%s'?",
                     ts_config_keys[i].section, name);
    return ts_fail("unknown config section '%s'%s%s; known sections are: model, parallel, "
                   "train, data, checkpoint, log",
                   name, where, suggest);
}
