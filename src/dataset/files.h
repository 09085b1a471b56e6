/* The files a data key names: each entry of data.train or data.val is a path or a
 * glob(3) pattern ("data/fw_train_*.bin"), so a run reads a whole directory of shards. */
#ifndef TS_DATA_FILES_H
#define TS_DATA_FILES_H

#include "core/error.h"
#include "dataset/loader.h"

/* More files than any corpus here needs (a directory of 1000 shards is normal); the
 * bound keeps the ranks' identity exchange and state.json of a sane size. */
#define TS_MAX_DATA_FILES 4096

/* Whether s has a glob character (*, ? or [). */
int ts_data_is_pattern(const char *s);

/* Expand n patterns of config key `key` in order: a pattern's matches sorted by byte
 * value (strcmp: the same order under every locale, so on every rank); a literal path
 * is kept as it is (ts_data_open reports it missing). No match is an error naming the
 * pattern. *paths (n_paths entries) is the caller's, freed by ts_data_free_paths. */
ts_status ts_data_expand(const char *key, const char *const *patterns, int n, char ***paths,
                         int *n_paths);
void ts_data_free_paths(char **paths, int n);

/* ts_data_expand, then ts_data_open_key on the files. */
ts_status ts_data_open_patterns(ts_dataset *ds, const char *key, const char *const *patterns,
                                int n, int vocab_size);

/* A dataset opened for a model whose model.tokenizer is `tokenizer` ("" or NULL: none):
 * a text file among its files is refused, naming `key` and the file, since the loader
 * reads text as byte ids (0-255), which are not that encoding's ids; the message points
 * to `tessera data --encoding`. (A byte-encoded shard cannot be told from a BPE one.) */
ts_status ts_data_check_encoded(const ts_dataset *ds, const char *key, const char *tokenizer);

#endif
