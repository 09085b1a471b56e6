/* Saving a checkpoint from every rank in parallel (checkpoint.h): rank 0 creates the
 * files at their final size with their headers in a temporary directory; every rank
 * pwrites the logical slices it owns and checksums them piece by piece; rank 0 combines
 * the pieces into per-chunk checksums (checking that they tile every tensor exactly
 * once), writes state.json, and renames the directory into place before moving
 * `latest`. */
#define _GNU_SOURCE /* sync_file_range */
#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h> /* fallocate */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h> /* renameat2 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint/layout.h"
#include "checkpoint/reader.h"
#include "core/env.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/timer.h"
#include "core/watchdog.h"

/* Bytes [off, off + len) of entry `entry`'s data (off from the tensor's first byte),
 * written by one rank, with their crc32. A piece never crosses a checksum chunk. */
typedef struct {
    uint32_t entry, crc;
    uint64_t off, len;
} piece;

typedef struct {
    piece *v;
    size_t n, cap;
} piece_list;

static void piece_add(piece_list *l, piece p)
{
    l->v = ts_grow(l->v, &l->cap, l->n, sizeof *l->v);
    l->v[l->n++] = p;
}

static ts_status pwrite_all(int fd, const void *buf, size_t len, uint64_t off, const char *path)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return ts_fail("writing %s failed: %s", path, n < 0 ? strerror(errno) : "no progress");
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return TS_OK;
}

/* ------------------------------------------------------------ directories -- */

static void join(char *out, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(out, cap, "%s/%s", dir, name);
    TS_ASSERT(n > 0 && (size_t)n < cap);
}

/* Rank 0, before writing: the root exists and leftovers of interrupted saves are
 * cleared: .tmp-step_* (never committed) are removed; an .old-step_N (a checkpoint being
 * replaced when the save stopped) goes back to step_N if that is missing, else away. */
static ts_status prepare_root(const char *root)
{
    if (ts_mkdir_p(root) != TS_OK) return ts_error_prefix("checkpoint.dir: ");
    DIR *d = opendir(root);
    if (!d) return ts_fail("checkpoint.dir: cannot open %s: %s", root, strerror(errno));
    struct dirent *e;
    char path[TS_PATH_MAX + 300], orig[TS_PATH_MAX + 300];
    struct stat sb;
    ts_status st = TS_OK;
    while (st == TS_OK && (e = readdir(d)) != NULL) {
        /* .del-: a prune interrupted after moving a step out of the step names. */
        const bool tmp = !strncmp(e->d_name, ".tmp-step_", 10),
                   old = !strncmp(e->d_name, ".old-step_", 10),
                   del = !strncmp(e->d_name, ".del-step_", 10);
        if (!tmp && !old && !del) continue;
        join(path, sizeof path, root, e->d_name);
        join(orig, sizeof orig, root, e->d_name + 5);
        if (old && stat(orig, &sb) != 0) {
            /* Never delete what may be the only complete copy of that step. */
            if (errno != ENOENT || rename(path, orig) != 0)
                st = ts_fail("checkpoint.dir: cannot restore %s to %s: %s; move it back by hand",
                             path, orig, strerror(errno));
            continue;
        }
        st = ts_remove_dir(path);
    }
    closedir(d);
    return st;
}

/* Text into tmp/name, whole or not at all (fsynced; the directory is at the commit). */
static ts_status write_text(const char *tmp, const char *name, const char *text, const char *what)
{
    char path[TS_PATH_MAX + 300];
    join(path, sizeof path, tmp, name);
    ts_atomic_file af;
    ts_status st = ts_atomic_open(&af, path, what);
    if (st == TS_OK) {
        fputs(text, af.f);
        fputc('\n', af.f);
        st = ts_atomic_commit(&af);
    }
    return st;
}

/* Rank 0: create every file of the layout at its full size with its header, the index
 * of split weights, and a llama's config.json (Hugging Face's). */
static ts_status create_files(const ts_ckpt_layout *L, const ts_model_config *mc, const char *tmp)
{
    if (mkdir(tmp, 0777) != 0) return ts_fail("cannot create %s: %s", tmp, strerror(errno));
    char path[TS_PATH_MAX + 300];
    for (int f = 0; f < L->n_files; f++) {
        const ts_ckpt_fileinfo *F = &L->files[f];
        join(path, sizeof path, tmp, F->name);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        if (fd < 0) return ts_fail("cannot create %s: %s", path, strerror(errno));
        ts_status st = pwrite_all(fd, F->header, F->header_bytes, 0, path);
        if (st == TS_OK && ftruncate(fd, (off_t)F->size) != 0)
            st = ts_fail("cannot size %s to %llu bytes: %s", path, (unsigned long long)F->size,
                         strerror(errno));
        /* Reserve the blocks now where the file system can, so a full disk shows here
         * and not as a hole that cannot be filled later (fallocate(2) itself: glibc's
         * posix_fallocate emulation writes every block where it is not supported). */
        if (st == TS_OK && fallocate(fd, 0, 0, (off_t)F->size) != 0 && errno != EOPNOTSUPP &&
            errno != ENOSYS && errno != EINVAL)
            st = ts_fail("cannot reserve %llu bytes for %s: %s", (unsigned long long)F->size, path,
                         strerror(errno));
        /* The header is durable from its writer, whichever ranks write the data (on a
         * multi-node file system another node's fsync does not cover it). */
        if (st == TS_OK && fsync(fd) != 0)
            st = ts_fail("fsync of %s failed: %s", path, strerror(errno));
        ts_watchdog_progress();
        close(fd);
        if (st != TS_OK) return st;
    }
    if (L->n_model_files > 1) {
        char *index = ts_ckpt_index_json(L);
        ts_status st = write_text(tmp, "model.safetensors.index.json", index, "checkpoint index");
        free(index);
        if (st != TS_OK) return st;
    }
    char *hf = ts_ckpt_hf_config_json(mc);
    if (hf) {
        ts_status st = write_text(tmp, "config.json", hf, "checkpoint config.json");
        free(hf);
        if (st != TS_OK) return st;
    }
    return TS_OK;
}

/* ------------------------------------------------------ this rank's slices -- */

typedef struct {
    const ts_ckpt_layout *L;
    const char *tmp;
    int *fds;                 /* [n_files], -1 until opened */
    piece_list pieces;
} writer;

static ts_status writer_fd(writer *w, int file, int *fd)
{
    if (w->fds[file] < 0) {
        char path[TS_PATH_MAX + 300];
        join(path, sizeof path, w->tmp, w->L->files[file].name);
        w->fds[file] = open(path, O_WRONLY);
        if (w->fds[file] < 0) return ts_fail("cannot open %s: %s", path, strerror(errno));
    }
    *fd = w->fds[file];
    return TS_OK;
}

/* Write `len` floats at logical element `logical` of entry E, checksummed per chunk. */
static ts_status write_run(writer *w, const ts_ckpt_entry *E, uint32_t entry, size_t logical,
                           const float *src, size_t len)
{
    int fd = -1;
    if (writer_fd(w, E->file, &fd) != TS_OK) return TS_ERR;
    const uint64_t off = (uint64_t)logical * sizeof(float), bytes = (uint64_t)len * sizeof(float);
    if (pwrite_all(fd, src, bytes, E->offset + off, w->L->files[E->file].name) != TS_OK)
        return TS_ERR;
    /* Start the disk on a large run now (without waiting), so writeback overlaps the
     * checksums and the next writes instead of all waiting for the final fsync. */
    if (bytes >= ((uint64_t)4 << 20))
        (void)sync_file_range(fd, (off64_t)(E->offset + off), (off64_t)bytes, SYNC_FILE_RANGE_WRITE);
    const unsigned char *p = (const unsigned char *)src;
    for (uint64_t at = off, end = off + bytes; at < end;) {
        uint64_t chunk_end = (at / TS_CKPT_CHUNK_BYTES + 1) * TS_CKPT_CHUNK_BYTES;
        uint64_t n = (chunk_end < end ? chunk_end : end) - at;
        piece_add(&w->pieces, (piece){entry, (uint32_t)crc32(0L, p + (at - off), (uInt)n), at, n});
        at += n;
    }
    return TS_OK;
}

/* A run to write: `len` floats from `src` at logical element `logical` of an entry. */
typedef struct {
    uint32_t entry;
    size_t logical, len;
    const float *src;
} item;

typedef struct {
    item *v;
    size_t n, cap;
    size_t floats;            /* sum of len */
} item_list;

static void item_add(item_list *l, item it)
{
    l->v = ts_grow(l->v, &l->cap, l->n, sizeof *l->v);
    l->v[l->n++] = it;
    l->floats += it.len;
}

/* This rank's share of parameter p's local elements [lo, hi): its weights and, from
 * the optimizer's range that holds them, their moments (exp_avg/exp_avg_sq point at the
 * moments of local element lo; both NULL for a Muon matrix, whose momentum its owner
 * writes: collect_momentum), run by run. */
static void collect_slice(item_list *l, const ts_ckpt_layout *L, const ts_model *m, int p,
                          int logical, size_t lo, size_t hi, const float *exp_avg,
                          const float *exp_avg_sq)
{
    const ts_param *P = &m->params[p];
    const float *src[TS_CK_KINDS] = {ts_param_data(m, p), exp_avg, exp_avg_sq};
    const int kinds = exp_avg ? TS_CK_KINDS : TS_CK_WEIGHT + 1;
    ts_shard_run r;
    for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, lo, hi); ts_shard_next(&it, &r);)
        for (int k = 0; k < kinds; k++) {
            const size_t at = k == TS_CK_WEIGHT ? r.local : r.local - lo;
            item_add(l, (item){(uint32_t)(k * L->n_logical + logical), r.logical, r.len, src[k] + at});
        }
}

/* Every slice this rank owns: of the parameters it holds as replica 0 (not a tied copy
 * or a tp-replicated copy), the elements of its optimizer ranges (a Muon matrix's weights
 * alone there; its momentum from its owner, whole); without ZeRO-1 every
 * replica (dp * cp ranks) holds all of them, so replica d writes its d-th of each
 * parameter. Under expert parallelism an expert tensor's replicas are its edp group
 * (the ranks of the replica group in other ep ranks hold other experts, and write
 * those; in other etp ranks other slices of it, which their shard spec tiles), so edp
 * rank d writes its d-th of this rank's slice; with ZeRO the ranges are already each
 * edp rank's share (the reducer shards an expert's bucket over edp). */
static ts_status collect_own(item_list *l, const ts_ckpt_layout *L, const ts_ckpt_save_args *a)
{
    const ts_model *m = a->model;
    const ts_adamw *o = a->optim;
    size_t base = 0;
    /* With parameters left to Muon (ts_adamw_exclude) the moments are compact: each
     * remaining part's follow the previous one's (optim.h), counted in `packed`. */
    size_t packed = 0;
    for (int r = 0; r < o->n_ranges; r++) {
        const ts_flat_range R = o->ranges[r];
        for (int p = 0; p < m->n_params; p++) {
            const ts_param *P = &m->params[p];
            if (R.end <= P->offset || R.begin >= P->offset + P->numel) continue;
            size_t lo = R.begin > P->offset ? R.begin - P->offset : 0;
            size_t hi = R.end < P->offset + P->numel ? R.end - P->offset : P->numel;
            const bool excluded = o->excluded && o->excluded[p];
            const size_t part_at = packed, part_lo = lo; /* this part's compact moments */
            if (o->excluded && !excluded) packed += hi - lo;
            if (P->shard.replica != 0 || P->tied_copy) continue;
            const bool by_edp = (m->moe_ep > 1 || m->moe_etp > 1) && P->expert;
            const int replicas = by_edp ? a->expert_replicas : a->replicas;
            const int replica = by_edp ? a->expert_replica : a->replica;
            if (replicas < 1 || replica < 0 || replica >= replicas)
                return ts_fail("internal: checkpoint writer %d of %d for '%s'", replica, replicas,
                               P->shard.name);
            if (!o->sharded && replicas > 1) {
                int64_t s, n;
                ts_shard_range((int64_t)P->numel, replicas, replica, &s, &n);
                lo = lo > (size_t)s ? lo : (size_t)s;
                hi = hi < (size_t)(s + n) ? hi : (size_t)(s + n);
                if (lo >= hi) continue;
            }
            const int logical = ts_ckpt_layout_find(L, P->shard.name);
            if (logical < 0)
                return ts_fail("internal: parameter '%s' is not in the checkpoint layout",
                               P->shard.name);
            if (excluded != L->muon[logical])
                return ts_fail("internal: '%s' is %s Muon matrix to the optimizer but %s to the "
                               "checkpoint layout",
                               P->shard.name, excluded ? "a" : "not a", excluded ? "not" : "one");
            if (excluded) {
                collect_slice(l, L, m, p, logical, lo, hi, NULL, NULL);
                continue;
            }
            const size_t mom = o->excluded ? part_at + (lo - part_lo)
                                           : base + (P->offset + lo - R.begin);
            collect_slice(l, L, m, p, logical, lo, hi, o->m + mom, o->v + mom);
        }
        base += R.end - R.begin;
    }
    /* Muon's momentum: each matrix's by its owner (one rank of its reduction group;
     * under tp each tp rank its own part, a tp-replicated one tp rank 0), whole. */
    const ts_muon *mu = a->muon;
    for (int i = 0; mu && i < mu->n; i++) {
        const int p = mu->param[i];
        const ts_param *P = &m->params[p];
        if (P->shard.replica != 0) continue;
        const int logical = ts_ckpt_layout_find(L, P->shard.name);
        if (logical < 0 || !L->muon[logical])
            return ts_fail("internal: Muon's matrix '%s' has no momentum in the checkpoint "
                           "layout",
                           P->shard.name);
        const float *buf = mu->momentum + mu->offset[i];
        ts_shard_run r;
        for (ts_shard_iter it = ts_shard_iter_begin(&P->shard, 0, P->numel); ts_shard_next(&it, &r);)
            item_add(l, (item){(uint32_t)(TS_CK_EXP_AVG * L->n_logical + logical), r.logical,
                               r.len, buf + r.local});
    }
    /* The state tensors (the MoE biases, the same on every rank): world rank 0's. */
    for (int i = 0; i < L->n_state && a->world->rank == 0; i++) {
        const int E = m->moe_experts;
        item_add(l, (item){(uint32_t)(TS_CK_KINDS * L->n_logical + i), 0, (size_t)E,
                           m->moe_bias + (size_t)L->state_block[i] * (size_t)E});
    }
    return TS_OK;
}

static ts_status close_files(writer *w)
{
    ts_status st = TS_OK;
    for (int f = 0; f < w->L->n_files; f++) {
        if (w->fds[f] < 0) continue;
        if (fsync(w->fds[f]) != 0 && st == TS_OK)
            st = ts_fail("fsync of %s/%s failed: %s", w->tmp, w->L->files[f].name, strerror(errno));
        if (close(w->fds[f]) != 0 && st == TS_OK)
            st = ts_fail("closing %s/%s failed: %s", w->tmp, w->L->files[f].name, strerror(errno));
        w->fds[f] = -1;
    }
    return st;
}

/* --------------------------------------------------------- rank 0: state -- */

static int piece_cmp(const void *x, const void *y)
{
    const piece *a = x, *b = y;
    if (a->entry != b->entry) return a->entry < b->entry ? -1 : 1;
    return a->off < b->off ? -1 : a->off > b->off;
}

/* Per-chunk checksums of every entry from all ranks' pieces, which must tile each
 * tensor exactly once (the owner rule: one replica per byte). */
static ts_status combine_checksums(const ts_ckpt_layout *L, piece *all, size_t n, json_t *sums)
{
    qsort(all, n, sizeof *all, piece_cmp);
    size_t i = 0;
    for (int e = 0; e < L->n_entries; e++) {
        const ts_ckpt_entry *E = &L->entries[e];
        if (!ts_ckpt_entry_stored(E)) continue; /* a Muon matrix's exp_avg_sq: none */
        json_t *list = json_array();
        uint64_t next = 0;
        uLong crc = 0;
        for (; i < n && all[i].entry == (uint32_t)e; i++) {
            if (all[i].off != next) {
                json_decref(list);
                return ts_fail("internal: the ranks' writes of '%s' %s at byte %llu (expected "
                               "%llu): the shard owners do not tile the tensor",
                               E->name, all[i].off < next ? "overlap" : "leave a gap",
                               (unsigned long long)all[i].off, (unsigned long long)next);
            }
            crc = crc32_combine(crc, all[i].crc, (z_off_t)all[i].len);
            next += all[i].len;
            if (next % TS_CKPT_CHUNK_BYTES == 0 || next == E->bytes) {
                json_array_append_new(list, json_integer((json_int_t)crc));
                crc = 0;
            }
        }
        if (next != E->bytes) {
            json_decref(list);
            return ts_fail("internal: the ranks wrote %llu of the %llu bytes of '%s'",
                           (unsigned long long)next, (unsigned long long)E->bytes, E->name);
        }
        json_object_set_new(sums, E->name, list);
    }
    return TS_OK;
}

static json_t *state_json(const ts_ckpt_save_args *a, const ts_ckpt_layout *L, json_t *sums)
{
    const ts_config *c = a->cfg;
    char *cfg_text = ts_config_to_json(c);
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    free(cfg_text);
    TS_ASSERT(cfg != NULL);
    json_t *files = json_object();
    for (int f = 0; f < L->n_files; f++) {
        const ts_ckpt_fileinfo *F = &L->files[f];
        json_object_set_new(files, F->name,
                            json_pack("{s:I, s:I, s:I}", "bytes", (json_int_t)F->size,
                                      "header_bytes", (json_int_t)F->header_bytes, "header_crc32",
                                      (json_int_t)crc32(0L, (const Bytef *)F->header,
                                                        (uInt)F->header_bytes)));
    }
    json_t *train = json_array();
    for (int i = 0; i < c->data.n_train; i++) json_array_append_new(train, json_string(c->data.train[i]));
    const long long B = c->train.global_batch;
    /* The data position: step x B, or with train.batch_rampup the steps' batches summed;
     * state.json records the ramp-up with it, so a resume continues both. */
    const long long consumed = (long long)a->sequences_consumed;
    ts_lr_schedule lrs; /* the schedule a resumed run is held to (checkpointing.c) */
    ts_lr_schedule_of(&c->train, &lrs);
    json_t *identity = json_array();
    for (int i = 0; i < a->n_data; i++)
        json_array_append_new(identity, json_pack("{s:I, s:I}", "tokens",
                                                  (json_int_t)a->data_tokens[i], "crc32",
                                                  (json_int_t)a->data_crc[i]));
    json_t *root = json_pack(
        "{s:s, s:i, s:i, s:{s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i}, s:{s:I, s:I, s:i, s:o, s:o}, "
        "s:{s:I, s:s}, s:{s:s, s:f, s:f, s:i, s:i, s:i}, s:I, s:o, s:o, s:o}",
        "format", "tessera-checkpoint", "version", TS_CKPT_FORMAT_VERSION, "step", a->step,
        "grid", "pp", c->parallel.pp, "dp", c->parallel.dp, "tp", c->parallel.tp, "virtual_stages",
        c->parallel.virtual_stages, "zero", c->parallel.zero, "ep", c->parallel.ep, "etp",
        c->parallel.etp, "world", a->world->size,
        "data", "sequences_consumed", (json_int_t)consumed, "global_batch", (json_int_t)B,
        "seq_len", c->model.seq_len, "train", train, "identity", identity,
        "rng", "seed", (json_int_t)c->train.seed, "note",
        "initialisation draws element i of tensor t from (seed, t, i); training draws no "
        "random numbers, so the step is the whole random state",
        "lr_schedule", "name", lrs.name, "lr", lrs.lr, "min_lr", lrs.min_lr, "warmup", lrs.warmup,
        "length", lrs.length, "decay", lrs.decay,
        "chunk_bytes", (json_int_t)TS_CKPT_CHUNK_BYTES, "files", files, "checksums", sums,
        "config", cfg);
    TS_ASSERT(root != NULL);
    if (c->train.batch_rampup[0]) /* the ramp-up that counted sequences_consumed */
        json_object_set_new(json_object_get(root, "data"), "batch_rampup",
                            json_string(c->train.batch_rampup));
    /* The optimizer, whose state the files hold (layout.h) and which a resume keeps
     * unless train.allow_optimizer_change (restore.c): its name, and Muon's keys. */
    const ts_train_config *tc = &c->train;
    json_t *optim = json_pack("{s:s}", "name", ts_config_muon(tc) ? "muon" : "adamw");
    if (ts_config_muon(tc)) {
        json_object_set_new(optim, "momentum", json_real(tc->muon_momentum));
        json_object_set_new(optim, "nesterov", json_boolean(tc->muon_nesterov));
        json_object_set_new(optim, "ns_steps", json_integer(ts_config_muon_ns_steps(tc)));
        json_object_set_new(optim, "coefficients", json_string(tc->muon_coefficients));
        json_object_set_new(optim, "scale", json_string(tc->muon_scale));
    }
    json_object_set_new(root, "optimizer", optim);
    /* The data order (the batch rule), which a resume must continue: the shuffle, its
     * seed, and the blend (normalised weights, shards per dataset). */
    const ts_data_config *d = &c->data;
    json_t *data = json_object_get(root, "data");
    json_object_set_new(data, "shuffle", json_boolean(d->shuffle));
    json_object_set_new(data, "seed", json_integer((json_int_t)d->seed));
    /* The weights the sampler blends by, as it normalised them (a sum past DBL_MAX
     * divided here would record zeros: probe D10); without them, the config's. */
    double sum = 0.0;
    for (int s = 0; s < d->n_sets; s++) sum += d->weight[s];
    json_t *weights = json_array(), *set_files = json_array(), *counts = json_array();
    for (int s = 0; s < d->n_sets; s++) {
        json_array_append_new(weights, json_real(a->set_weights ? a->set_weights[s]
                                                                : d->weight[s] / sum));
        json_array_append_new(set_files,
                              json_integer(a->n_sets ? a->set_files[s] : a->n_data));
        if (a->set_counts)
            json_array_append_new(counts, json_integer((json_int_t)a->set_counts[s]));
    }
    json_object_set_new(data, "weights", weights);
    json_object_set_new(data, "dataset_files", set_files);
    if (a->set_counts)
        json_object_set_new(data, "blend_counts", counts);
    else
        json_decref(counts);
    /* The ranks file the ids mean text by (its path, in config.model, may differ on
     * another machine; its sha256 must not): what a resume and `tessera sample` check. */
    if (c->model.tokenizer[0])
        json_object_set_new(root, "tokenizer",
                            json_pack("{s:s, s:s}", "encoding", c->model.tokenizer, "sha256",
                                      c->model.tokenizer_sha256));
    /* The MoE balancing bias (not a parameter: no tensor of the files), each float's bits
     * as an integer, so a resume selects exactly as the run would have. */
    if (a->moe_bias) {
        json_t *bits = json_array();
        for (size_t i = 0; i < a->moe_bias_n; i++) {
            uint32_t u;
            memcpy(&u, &a->moe_bias[i], sizeof u);
            json_array_append_new(bits, json_integer((json_int_t)u));
        }
        json_object_set_new(root, "moe_bias",
                            json_pack("{s:i, s:o, s:s}", "experts", c->model.moe_experts,
                                      "bits", bits, "layout",
                                      "[n_layer * moe_experts] fp32 bit patterns, block-major; "
                                      "dense blocks 0"));
    }
    /* The trainer's own records (the spike guard's window), after the keys above
     * (jansson's update takes no const object; it only adds references to its members). */
    const int merged = a->extra ? json_object_update(root, (json_t *)a->extra) : 0;
    TS_ASSERT(merged == 0);
    return root;
}

/* Rank 0 after every rank's data is on disk: checksums, state.json, the rename, `latest`
 * and pruning. */
static ts_status commit(const ts_ckpt_save_args *a, const ts_ckpt_layout *L, piece *all, size_t n,
                        const char *root, const char *tmp, const char *name)
{
    json_t *sums = json_object();
    if (combine_checksums(L, all, n, sums) != TS_OK) {
        json_decref(sums);
        return TS_ERR;
    }
    json_t *state = state_json(a, L, sums);
    TS_ASSERT(state != NULL);
    /* state.json's own checksum, over its canonical form without this key (reader.c). */
    json_object_set_new(state, "state_crc32", json_integer((json_int_t)ts_ckpt_state_crc(state)));
    char path[TS_PATH_MAX + 300], final[TS_PATH_MAX + 300], old[TS_PATH_MAX + 300];
    join(path, sizeof path, tmp, "state.json");
    ts_atomic_file af;
    ts_status st = ts_atomic_open(&af, path, "checkpoint state");
    if (st == TS_OK) {
        /* Flushed here, so a full disk is reported as such (the stream's own error
         * would leave only EIO for the commit to report). */
        errno = 0;
        if (json_dumpf(state, af.f, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0 ||
            fputc('\n', af.f) == EOF || fflush(af.f) != 0) {
            const int err = errno ? errno : EIO;
            ts_atomic_abort(&af);
            st = ts_fail("writing %s failed: %s (the checkpoint was not committed)", path,
                         strerror(err));
        } else {
            st = ts_atomic_commit(&af);
        }
    }
    json_decref(state);
    if (st == TS_OK) st = ts_fsync_dir(tmp);
    if (st != TS_OK) return st;

    /* Into place. A checkpoint of the same step already there (a rerun) is replaced. */
    join(final, sizeof final, root, name);
    snprintf(old, sizeof old, "%s/.old-%s", root, name);
    struct stat sb;
    if (stat(final, &sb) == 0) {
        /* Swap the two directories in one step where the file system can, so the step
         * name never points at nothing; else move the old one aside first (prepare_root
         * puts it back if the save stops in between). */
        const char *leftover = tmp;
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
            if (rename(final, old) != 0)
                return ts_fail("cannot move the old %s aside: %s", final, strerror(errno));
            if (rename(tmp, final) != 0)
                return ts_fail("cannot rename %s to %s: %s", tmp, final, strerror(errno));
            leftover = old;
        }
        if (ts_fsync_dir(root) != TS_OK) return TS_ERR;
        /* The new checkpoint is in place: failing to remove the old one is not fatal. */
        if (ts_remove_dir(leftover) != TS_OK) ts_log_warn("checkpoint: %s", ts_error_message());
    } else {
        if (rename(tmp, final) != 0)
            return ts_fail("cannot rename %s to %s: %s", tmp, final, strerror(errno));
        if (ts_fsync_dir(root) != TS_OK) return TS_ERR;
    }

    /* The checkpoint is committed and complete from here: a failure now must not read
     * as a failed save (probe Q2: a full disk at `latest` said "nothing was written"). */
    join(path, sizeof path, root, "latest");
    if ((st = ts_atomic_open(&af, path, "checkpoint latest")) == TS_OK) {
        fprintf(af.f, "%s\n", name);
        st = ts_atomic_commit(&af);
    }
    if (st != TS_OK) {
        char why[512]; /* ts_fail writes where ts_error_message reads */
        snprintf(why, sizeof why, "%s", ts_error_message());
        return ts_fail("%s is committed and complete, but `latest` could not be updated (%s): "
                       "it still names the checkpoint before; load %s by its directory",
                       final, why, final);
    }
    return ts_fsync_dir(root);
}

/* Keep the one just written and the keep - 1 newest before it. */
static ts_status prune(const char *root, int keep, long just_written, bool replace_later)
{
    long *steps;
    const long n = ts_ckpt_list_steps(root, false, &steps);
    if (n < 0) return ts_fail("cannot open %s: %s", root, strerror(errno));
    /* Newest first. Checkpoints after the one just written belong to a run this one
     * rolled back from (it loaded an earlier step): they are left for the user to judge,
     * unless this run started over there (checkpoint.overwrite without checkpoint.load:
     * `replace_later`), whose first save thus replaces the old run's later ones (a rerun
     * of a 200-step demo with 20 steps left step_200 beside step_20). Of the older
     * ones, keep - 1 stay beside the new one. */
    ts_status st = TS_OK;
    long kept = 1;
    char path[TS_PATH_MAX + 300], doomed[TS_PATH_MAX + 300];
    for (long i = 0; i < n && st == TS_OK; i++) {
        if (steps[i] == just_written || (steps[i] > just_written && !replace_later) ||
            (steps[i] < just_written && kept++ < keep))
            continue;
        /* Renamed out of the step names first (probe Q1): a kill while its files are
         * removed leaves a .del- directory that nothing mistakes for a checkpoint, and
         * that the next save's prepare_root finishes. */
        snprintf(path, sizeof path, "%s/step_%08ld", root, steps[i]);
        snprintf(doomed, sizeof doomed, "%s/.del-step_%08ld", root, steps[i]);
        if (rename(path, doomed) != 0) {
            st = ts_fail("cannot move %s aside to delete it: %s", path, strerror(errno));
            break;
        }
        st = ts_remove_dir(doomed);
    }
    free(steps);
    return st;
}

/* Test hook: TS_TEST_SAVE_STALL_S=seconds makes every rank wait that long after writing
 * its slices, before the commit, so a test can kill a job in the middle of a save. */
static void stall_for_test(int rank)
{
    const char *env = ts_env(TS_ENV_TEST_SAVE_STALL_S);
    if (!env) return;
    if (rank == 0) ts_log_info("checkpoint: TS_TEST_SAVE_STALL_S=%s: stalling mid-save", env);
    struct timespec ts = {.tv_sec = atoi(env)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A save in flight (checkpoint.h): the layout, the open files, this rank's runs (in
 * the model's buffers, or copied to `staging` for an asynchronous save) and the pieces
 * written so far. */
struct ts_ckpt_saver {
    ts_ckpt_save_args a;
    ts_ckpt_layout L;
    writer w;
    item_list items;
    ts_ckpt_staging own;       /* the staging buffer when the caller keeps none */
    float *staging;            /* asynchronous: this rank's runs, copied (not owned) */
    char tmp[TS_PATH_MAX + 64], name[32];
    bool threaded;
    pthread_t thread;
    atomic_int written;        /* this rank's writes are done (or failed) */
    ts_status write_status;
    char write_error[1024];    /* the writer thread's message (error messages are per thread) */
    /* The args' per-dataset arrays, copied: the caller's live on its stack, and an
     * asynchronous save commits (state.json) steps later. a's pointers point here. */
    int *set_files;
    double *set_weights;
    uint64_t *set_counts;
    float *moe_bias;
    json_t *extra;
};

/* This rank's runs into the files, checksummed; then fsync and close. */
static void write_items(ts_ckpt_saver *s)
{
    ts_status st = TS_OK;
    for (size_t i = 0; i < s->items.n && st == TS_OK; i++) {
        const item *it = &s->items.v[i];
        st = write_run(&s->w, &s->L.entries[it->entry], it->entry, it->logical, it->src, it->len);
        ts_watchdog_progress(); /* a long save is progress, not a hang */
    }
    ts_status cst = close_files(&s->w);
    if (st == TS_OK) st = cst;
    stall_for_test(s->a.world->rank);
    s->write_status = st;
    if (st != TS_OK) snprintf(s->write_error, sizeof s->write_error, "%s", ts_error_message());
    atomic_store(&s->written, 1);
}

static void *writer_thread(void *arg)
{
    write_items(arg);
    return NULL;
}

static void saver_free(ts_ckpt_saver *s)
{
    close_files(&s->w);
    free(s->w.fds);
    free(s->w.pieces.v);
    free(s->items.v);
    free(s->own.mem);
    free(s->set_files);
    free(s->set_weights);
    free(s->set_counts);
    free(s->moe_bias);
    json_decref(s->extra);
    ts_ckpt_layout_free(&s->L);
    free(s);
}

/* Copy n elements of `from` (NULL stays NULL) into an allocation *to owns. */
static const void *own_copy(void **to, const void *from, size_t n, size_t elem)
{
    if (!from) return NULL;
    *to = ts_malloc(n * elem);
    memcpy(*to, from, n * elem);
    return *to;
}

ts_status ts_ckpt_save_start(const ts_ckpt_save_args *a, bool async, ts_ckpt_saver **out,
                             double *blocked_ms)
{
    const double t0 = ts_now_ms();
    ts_ckpt_saver *s = ts_calloc(1, sizeof *s);
    s->a = *a;
    /* state_json reads the weights and counts for each of the config's datasets, the
     * files for each of the args': as many as the larger says. */
    const int most = a->n_sets > a->cfg->data.n_sets ? a->n_sets : a->cfg->data.n_sets;
    const size_t sets = most > 0 ? (size_t)most : 1;
    s->a.set_files = own_copy((void **)&s->set_files, a->set_files, sets, sizeof(int));
    s->a.set_weights = own_copy((void **)&s->set_weights, a->set_weights, sets, sizeof(double));
    s->a.set_counts = own_copy((void **)&s->set_counts, a->set_counts, sets, sizeof(uint64_t));
    s->a.moe_bias = own_copy((void **)&s->moe_bias, a->moe_bias, a->moe_bias_n, sizeof(float));
    s->extra = a->extra ? json_deep_copy(a->extra) : NULL;
    s->a.extra = s->extra;
    const ts_comm *world = a->world;
    const char *root = a->cfg->checkpoint.dir;
    snprintf(s->name, sizeof s->name, "step_%08d", a->step);
    snprintf(s->tmp, sizeof s->tmp, "%s/.tmp-%s", root, s->name);
    ts_ckpt_layout_build(&s->L, &a->cfg->model, a->cfg->checkpoint.file_gb,
                         ts_config_muon(&a->cfg->train));
    s->w = (writer){.L = &s->L, .tmp = s->tmp, .fds = ts_malloc((size_t)s->L.n_files * sizeof(int))};
    for (int f = 0; f < s->L.n_files; f++) s->w.fds[f] = -1;
    atomic_init(&s->written, 0);
    *out = NULL;

    ts_watchdog_context("checkpoint: creating the files of step %d", a->step, 0, 0);
    ts_status st = TS_OK;
    int lost = 0; /* the claim on root is gone: nothing there is ours to remove */
    if (world->rank == 0 && a->claim && (st = ts_ckpt_claim_check(a->claim, root)) != TS_OK)
        lost = 1;
    if (world->rank == 0 && st == TS_OK) {
        st = prepare_root(root);
        if (st == TS_OK) st = create_files(&s->L, &a->cfg->model, s->tmp);
    }
    if (st == TS_OK) st = collect_own(&s->items, &s->L, a);
    if (ts_comm_agree(world, st) != TS_OK) {
        if (world->rank == 0 && !lost) (void)ts_remove_dir(s->tmp);
        ts_error_prefix("saving checkpoint %s/%s: ", root, s->name);
        saver_free(s);
        *blocked_ms = ts_now_ms() - t0;
        return TS_ERR;
    }
    if (async || !a->model->k->host_accessible) {
        /* Copy this rank's runs to the host now (training may change the buffers next
         * step; device memory cannot be written to a file directly); with `async` a
         * thread writes them while training goes on. */
        ts_ckpt_staging *buf = a->staging ? a->staging : &s->own;
        if (buf->floats < s->items.floats || !buf->mem) {
            free(buf->mem);
            buf->floats = s->items.floats ? s->items.floats : 1;
            buf->mem = ts_alloc_floats(buf->floats);
        }
        s->staging = buf->mem;
        size_t at = 0;
        for (size_t i = 0; i < s->items.n; i++) {
            item *it = &s->items.v[i];
            a->model->k->memcpy_d2h(s->staging + at, it->src, it->len * sizeof(float));
            it->src = s->staging + at;
            at += it->len;
        }
        s->threaded = async && pthread_create(&s->thread, NULL, writer_thread, s) == 0;
        if (!s->threaded) write_items(s); /* synchronous, or no thread to be had */
    } else {
        ts_watchdog_context("checkpoint: writing this rank's slices of step %d", a->step, 0, 0);
        write_items(s);
    }
    *out = s;
    *blocked_ms = ts_now_ms() - t0;
    return TS_OK;
}

bool ts_ckpt_save_written(const ts_ckpt_saver *s)
{
    return atomic_load(&((ts_ckpt_saver *)s)->written) != 0;
}

ts_status ts_ckpt_save_finish(ts_ckpt_saver *s, double *blocked_ms)
{
    const double t0 = ts_now_ms();
    const ts_ckpt_save_args *a = &s->a;
    const ts_comm *world = a->world;
    const char *root = a->cfg->checkpoint.dir;
    ts_watchdog_context("checkpoint: waiting for this rank's writes of step %d", a->step, 0, 0);
    if (s->threaded) pthread_join(s->thread, NULL);
    ts_status st = s->write_status;
    if (st != TS_OK) ts_fail("%s", s->write_error);
    int *counts = NULL, lost = 0;
    piece *all = NULL;
    if (ts_comm_agree(world, st) != TS_OK) goto fail;

    /* The checksums of every piece, to rank 0. */
    ts_watchdog_context("checkpoint: gathering the checksums of step %d", a->step, 0, 0);
    const int n = s->w.pieces.n < (size_t)1 << 30 ? (int)s->w.pieces.n : -1;
    size_t total = 0;
    if (world->rank == 0) counts = ts_calloc((size_t)world->size, sizeof(int));
    ts_gather_bytes(world, &n, sizeof n, counts, 0);
    if (world->rank == 0) {
        for (int r = 0; r < world->size && st == TS_OK; r++) {
            total += counts[r] < 0 ? ((size_t)1 << 31) : (size_t)counts[r];
            if (total >= (size_t)1 << 31)
                st = ts_fail("more than 2^31 written pieces to checksum: the shards' runs are "
                             "too fine for one gather (use fewer tensor-parallel ranks per "
                             "row-parallel weight, or report this)");
        }
        if (st == TS_OK) all = ts_malloc((total + 1) * sizeof *all);
    }
    if (ts_comm_agree(world, st) != TS_OK) goto fail;
    ts_gatherv(world, s->w.pieces.v, n, sizeof(piece), all, counts, 0);

    ts_watchdog_context("checkpoint: committing step %d", a->step, 0, 0);
    if (world->rank == 0) {
        /* Again before the commit: an asynchronous save spans steps, and a run that got
         * the directory meanwhile may be saving the same step. */
        if (a->claim && (st = ts_ckpt_claim_check(a->claim, root)) != TS_OK) lost = 1;
        if (st == TS_OK) st = commit(a, &s->L, all, total, root, s->tmp, s->name);
        /* Committed: a checkpoint that cannot be pruned is a warning, not a failed save. */
        const ts_checkpoint_config *k = &a->cfg->checkpoint;
        if (st == TS_OK && prune(root, k->keep, a->step, k->overwrite && !k->load[0]) != TS_OK)
            ts_log_warn("checkpoint: keeping old checkpoints: %s", ts_error_message());
    }
    if (ts_comm_agree(world, st) != TS_OK) goto fail;
    st = TS_OK;
    goto done;

fail:
    /* A failed save leaves nothing behind (but what may be another run's, once the
     * claim is lost). */
    if (world->rank == 0 && !lost) (void)ts_remove_dir(s->tmp);
    st = ts_error_prefix("saving checkpoint %s/%s: ", root, s->name);
done:
    free(counts);
    free(all);
    saver_free(s);
    *blocked_ms = ts_now_ms() - t0;
    return st;
}

void ts_ckpt_save_abandon(ts_ckpt_saver *s)
{
    if (s->threaded) pthread_join(s->thread, NULL);
    saver_free(s);
}
