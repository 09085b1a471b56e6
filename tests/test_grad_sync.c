/* The gradient reducer's buckets and the ZeRO-1 piece layout, without MPI
 * (ts_reducer_init only reads the groups' sizes and ranks): buckets tile the gradient
 * buffer on parameter boundaries; with ZeRO-1 every bucket is cut into dp pieces on
 * 16-float boundaries, the dp ranks' pieces cover each float exactly once and hold 1/dp
 * of it each; a pipeline stage's tied embedding is a bucket alone; a parameter reduced
 * over a group of its own shares no bucket with the others and is cut by that group.
 * AdamW on the dp pieces, rank by rank, gives the whole-model step bit for bit, and the
 * pieces' sums of squares add up to the whole model's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "core/rng.h"
#include "data/group_sum.h"
#include "data/reducer.h"
#include "model/model.h"
#include "optim/optim.h"
#include "test_util.h"

static ts_config g_cfg;

/* n_embd = 24: 16-float units that 3 does not divide, so pieces come out uneven. */
static ts_model_config small_model(void)
{
    ts_config_defaults(&g_cfg);
    g_cfg.model.n_layer = 3;
    g_cfg.model.n_head = 2;
    g_cfg.model.n_embd = 24;
    g_cfg.model.vocab_size = 40;
    g_cfg.model.seq_len = 8;
    return g_cfg.model;
}

static ts_comm fake_comm(int size, int rank, const char *name)
{
    ts_comm c;
    memset(&c, 0, sizeof c);
    c.size = size;
    c.rank = rank;
    c.name = name;
    return c;
}

/* Build the model for layers [l0, l1) (the whole model when l0 = 0, l1 = n_layers). */
static void build_range(ts_model *m, const ts_model_config *mc, int l0, int l1)
{
    bool owned[16] = {false};
    for (int l = l0; l < l1; l++) owned[l] = true;
    ts_model_build(m, &(ts_model_spec){.arch = mc, .k = &ts_kernels_cpu, .owned = owned});
}

static bool is_param_boundary(const ts_model *m, size_t x)
{
    if (x == 0 || x == m->num_floats) return true;
    for (int p = 0; p < m->n_params; p++)
        if (m->params[p].offset == x) return true;
    return false;
}

/* One layout (a model, dp, ZeRO on or off, bucket size, embedding group size): every
 * rank's buckets and shard. */
static void check_layout(const ts_model *m, int dp, bool zero, size_t bucket_bytes, int embed)
{
    int *covered = calloc(m->num_floats + 1, sizeof(int));
    const bool tied_here = embed >= 2 && (m->head_wte_param < 0 ||
                                          m->params[m->head_wte_param].tied_copy);
    for (int r = 0; r < dp; r++) {
        ts_comm dpc = fake_comm(dp, r, "dp"), emb = fake_comm(embed, 0, "embed"),
                kv = fake_comm(1, 0, "kv");
        ts_group_sums sums;
        ts_group_sums_init(&sums, m, &emb, &kv);
        ts_reducer g;
        const ts_reducer_args a = {.group = &dpc, .sums = &sums, .bucket_bytes = bucket_bytes,
                                   .overlap = true, .sharded = zero};
        ts_reducer_init(&g, (ts_model *)m, &a);
        CHECK(g.sharded == (zero && dp > 1));
        CHECK((sums.n == 1) == tied_here && sums.n <= 1);
        const int tied_param = sums.n ? sums.sums[0].param : -1;
        /* Buckets tile [0, n) from the end, on parameter boundaries. */
        size_t end = m->num_floats;
        int n_tied = 0;
        for (int i = 0; i < g.n_buckets; i++) {
            const ts_bucket *b = &g.buckets[i];
            CHECKF(b->end == end && b->begin < b->end, "dp %d bucket %d [%zu, %zu)", dp, i,
                   b->begin, b->end);
            CHECK(is_param_boundary(m, b->begin));
            end = b->begin;
            n_tied += b->tied;
            if (b->tied) { /* the tied tensor alone */
                const ts_param *P = &m->params[tied_param];
                CHECK(b->begin == P->offset);
                for (int p = 0; p < m->n_params; p++)
                    if (p != tied_param)
                        CHECK(m->params[p].offset < b->begin || m->params[p].offset >= b->end);
            }
            if (!g.sharded) continue;
            /* Pieces: contiguous, aligned, as even as the alignment allows. */
            int lo = b->counts[0], hi = b->counts[0];
            size_t at = 0;
            for (int k = 0; k < dp; k++) {
                CHECK((size_t)b->displs[k] == at && b->displs[k] % TS_ZERO_ALIGN == 0);
                at += (size_t)b->counts[k];
                lo = b->counts[k] < lo ? b->counts[k] : lo;
                hi = b->counts[k] > hi ? b->counts[k] : hi;
            }
            CHECK(at == b->end - b->begin);
            CHECKF(hi - lo <= TS_ZERO_ALIGN, "dp %d bucket %d pieces %d..%d", dp, i, lo, hi);
        }
        CHECK(g.n_buckets == 0 ? dp == 1 : end == 0);
        CHECK(n_tied == (g.sharded && tied_here ? 1 : 0));
        /* The pieces: ascending, disjoint, about 1/dp of the buffer. */
        size_t mine = 0;
        for (int s = 0; s < g.n_pieces; s++) {
            const ts_flat_range *x = &g.pieces[s];
            CHECK(x->begin < x->end && (s == 0 || g.pieces[s - 1].end <= x->begin));
            for (size_t i = x->begin; i < x->end; i++) covered[i]++;
            mine += x->end - x->begin;
        }
        if (g.sharded) {
            double ideal = (double)m->num_floats / dp, slack = TS_ZERO_ALIGN * g.n_buckets;
            CHECKF(fabs((double)mine - ideal) <= slack, "dp %d rank %d holds %zu of %zu", dp, r,
                   mine, m->num_floats);
        } else {
            CHECK(g.n_pieces == 1 && mine == m->num_floats);
        }
        CHECK(!g.sharded || g.n_piece_floats == mine);
        ts_reducer_free(&g);
        ts_group_sums_free(&sums);
    }
    /* With ZeRO-1 the ranks' shards cover every float once; without, each rank all. */
    int want = zero && dp > 1 ? 1 : dp, bad = 0;
    for (size_t i = 0; i < m->num_floats; i++) bad += covered[i] != want;
    CHECKF(bad == 0, "dp %d zero %d: %d floats not covered %d times", dp, zero, bad, want);
    free(covered);
}

static void test_layouts(void)
{
    ts_model_config mc = small_model();
    const int n_layers = mc.n_layer + 2;
    ts_model whole, first, last;
    build_range(&whole, &mc, 0, n_layers);
    build_range(&first, &mc, 0, 2);        /* embed + block 0: wte without the head */
    build_range(&last, &mc, 2, n_layers);  /* blocks 1.. + head: the tied copy */
    const size_t buckets[] = {256, 4096, (size_t)4 << 20};
    for (int dp = 1; dp <= 5; dp++)
        for (int z = 0; z <= 1; z++)
            for (size_t b = 0; b < sizeof buckets / sizeof buckets[0]; b++) {
                check_layout(&whole, dp, z, buckets[b], 1);
                check_layout(&first, dp, z, buckets[b], 2);
                check_layout(&last, dp, z, buckets[b], 2);
            }
    ts_model_free(&whole);
    ts_model_free(&first);
    ts_model_free(&last);
}

static void fill(float *x, size_t n, uint64_t key, float scale)
{
    for (size_t i = 0; i < n; i++) x[i] = scale * (float)ts_rng_normal(7, key, i);
}

/* AdamW on each dp rank's shard (its own moments) gives the whole-model step exactly,
 * and the shards' sums of squares add up to the whole model's. */
static void test_sharded_adamw(void)
{
    ts_model_config mc = small_model();
    ts_train_config tc = g_cfg.train;
    for (int dp = 2; dp <= 4; dp++) {
        ts_model full, shard;
        ts_model_build(&full, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
        ts_model_build(&shard, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
        fill(full.param_mem, full.num_floats, 1, 0.02f);
        memcpy(shard.param_mem, full.param_mem, full.num_floats * sizeof(float));
        ts_adamw whole;
        ts_adamw_init(&whole, &full);
        CHECK(ts_adamw_state_bytes(&whole) == 2 * full.num_floats * sizeof(float));
        ts_reducer g[4];
        ts_adamw opt[4];
        ts_comm dpc[4];
        size_t bytes = 0;
        for (int r = 0; r < dp; r++) {
            dpc[r] = fake_comm(dp, r, "dp");
            const ts_reducer_args a = {.group = &dpc[r], .bucket_bytes = 1024, .overlap = true,
                                       .sharded = true};
            ts_reducer_init(&g[r], &shard, &a);
            ts_adamw_init_ranges(&opt[r], &shard, g[r].pieces, g[r].n_pieces, g[r].sharded);
            CHECK(opt[r].sharded);
            bytes += ts_adamw_state_bytes(&opt[r]);
        }
        CHECK(bytes == ts_adamw_state_bytes(&whole)); /* together: the whole state once */
        for (int t = 1; t <= 3; t++) {
            fill(full.grad_mem, full.num_floats, 100 + (uint64_t)t, 1e-2f);
            memcpy(shard.grad_mem, full.grad_mem, full.num_floats * sizeof(float));
            double ss = ts_adamw_grad_sum_squares(&whole, &full), parts = 0.0;
            for (int r = 0; r < dp; r++) parts += ts_adamw_grad_sum_squares(&opt[r], &shard);
            CHECKF(fabs(parts - ss) <= 1e-12 * ss, "dp %d: shard sums %.17g vs %.17g", dp, parts,
                   ss);
            ts_adamw_step(&whole, &full, &tc, 1e-3, 0.5f, t);
            for (int r = 0; r < dp; r++) ts_adamw_step(&opt[r], &shard, &tc, 1e-3, 0.5f, t);
        }
        CHECKF(!memcmp(full.param_mem, shard.param_mem, full.num_floats * sizeof(float)),
               "dp %d: the sharded AdamW steps differ from the whole-model step", dp);
        for (int r = 0; r < dp; r++) {
            ts_adamw_free(&opt[r]);
            ts_reducer_free(&g[r]);
        }
        ts_adamw_free(&whole);
        ts_model_free(&full);
        ts_model_free(&shard);
    }
}

/* Each parameter names the group reducing it: block 1's parameters over a group of 2
 * (say, experts'), the rest over dp = 3. No bucket mixes the two; each is cut into its
 * own group's pieces; every float is in one bucket. */
static void test_param_groups(void)
{
    ts_model_config mc = small_model();
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    const ts_comm **pg = calloc((size_t)m.n_params, sizeof *pg);
    ts_comm dpc = fake_comm(3, 1, "dp"), other = fake_comm(2, 1, "ep");
    for (int p = 0; p < m.n_params; p++)
        if (m.params[p].layer == 2) pg[p] = &other; /* block 1 (layer 0 is the embedding) */
    for (int zero = 0; zero <= 1; zero++)
        for (size_t bytes = 256; bytes <= ((size_t)4 << 20); bytes *= 64) {
            const ts_reducer_args a = {.group = &dpc, .param_group = pg, .bucket_bytes = bytes,
                                       .overlap = true, .sharded = zero};
            ts_reducer g;
            ts_reducer_init(&g, &m, &a);
            CHECK(g.n_groups == 2);
            size_t end = m.num_floats;
            for (int i = 0; i < g.n_buckets; i++) {
                const ts_bucket *b = &g.buckets[i];
                CHECK(b->end == end);
                end = b->begin;
                for (int p = 0; p < m.n_params; p++) {
                    const size_t off = m.params[p].offset;
                    if (off < b->begin || off >= b->end) continue;
                    CHECKF(b->group == (pg[p] ? pg[p] : &dpc), "bucket %d mixes groups", i);
                }
                if (!zero) continue;
                size_t len = 0;
                for (int k = 0; k < b->group->size; k++) len += (size_t)b->counts[k];
                CHECK(len == b->end - b->begin);
            }
            CHECK(end == 0);
            ts_reducer_free(&g);
        }
    free(pg);
    ts_model_free(&m);
}

int main(void)
{
    test_layouts();
    test_param_groups();
    test_sharded_adamw();
    return ts_test_report();
}
