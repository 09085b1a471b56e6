/* Partition: the exact balancer, explicit lists and their errors, the cost model's
 * proportions, the measured profile, names and ownership masks. */
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/partition.h"
#include "test_util.h"

static const char *src_dir(void)
{
    const char *s = getenv("TS_SOURCE_DIR");
    return s ? s : ".";
}

static ts_status load_tiny(ts_config *cfg, const char *const *sets, int n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/configs/tiny.cfg", src_dir());
    return ts_config_load(cfg, path, sets, n, 0);
}

static double max_chunk(const double *cost, const int *sizes, int k)
{
    double worst = 0;
    for (int c = 0, l = 0; c < k; c++) {
        double s = 0;
        for (int i = 0; i < sizes[c]; i++) s += cost[l++];
        if (s > worst) worst = s;
    }
    return worst;
}

/* The best bottleneck over every composition of L layers into K non-empty chunks. */
static double brute_force(const double *cost, int L, int K, int *sizes, int c, int used)
{
    if (c == K - 1) {
        sizes[c] = L - used;
        return sizes[c] >= 1 ? max_chunk(cost, sizes, K) : 1e300;
    }
    double best = 1e300;
    for (int n = 1; used + n <= L - (K - 1 - c); n++) {
        sizes[c] = n;
        double v = brute_force(cost, L, K, sizes, c + 1, used + n);
        if (v < best) best = v;
    }
    return best;
}

static void test_balance_exact(void)
{
    unsigned seed = 7;
    for (int trial = 0; trial < 300; trial++) {
        int L = 2 + trial % 9, K = 1 + (trial / 9) % L;
        double cost[16];
        for (int l = 0; l < L; l++) {
            seed = seed * 1103515245u + 12345u;
            cost[l] = (double)((seed >> 8) % 1000) / 100.0 + (trial % 3 == 0 ? 1.0 : 0.0);
        }
        int sizes[16], tmp[16];
        CHECK(ts_partition_balance(cost, L, K, sizes) == TS_OK);
        int sum = 0, nonempty = 1;
        for (int c = 0; c < K; c++) sum += sizes[c], nonempty &= sizes[c] >= 1;
        CHECK(sum == L && nonempty);
        double best = brute_force(cost, L, K, tmp, 0, 0);
        CHECKF(max_chunk(cost, sizes, K) <= best * (1 + 1e-12), "L=%d K=%d got %g best %g", L, K,
               max_chunk(cost, sizes, K), best);
    }
}

static void test_balance_ties_even(void)
{
    /* Uniform costs: the even cut, not a greedy front-loaded one. */
    double u[6] = {1, 1, 1, 1, 1, 1};
    int s[4];
    CHECK(ts_partition_balance(u, 6, 2, s) == TS_OK);
    CHECK(s[0] == 3 && s[1] == 3);
    CHECK(ts_partition_balance(u, 6, 4, s) == TS_OK);
    CHECKF(s[0] + s[1] + s[2] + s[3] == 6 && s[0] <= 2 && s[1] <= 2 && s[2] <= 2 && s[3] <= 2,
           "%d %d %d %d", s[0], s[1], s[2], s[3]);
    /* A heavy last layer gets a chunk of its own; the rest are spread evenly. */
    double h[7] = {1, 1, 1, 1, 1, 1, 10};
    CHECK(ts_partition_balance(h, 7, 3, s) == TS_OK);
    CHECKF(s[0] == 3 && s[1] == 3 && s[2] == 1, "%d %d %d", s[0], s[1], s[2]);
    /* Deterministic. */
    int again[3];
    CHECK(ts_partition_balance(h, 7, 3, again) == TS_OK);
    CHECK(!memcmp(s, again, sizeof again));
}

static void test_balance_errors(void)
{
    double u[3] = {1, 1, 1};
    int s[4];
    CHECK(ts_partition_balance(u, 3, 4, s) == TS_ERR);
    CHECK(strstr(ts_error_message(), "more pipeline chunks than layers") != NULL);
    CHECK(ts_partition_balance(u, 3, 0, s) == TS_ERR);
}

static void test_explicit(void)
{
    const char *sets[] = {"parallel.pp=4", "parallel.partition=[2,2,1,1]"};
    ts_config cfg;
    CHECKF(load_tiny(&cfg, sets, 2) == TS_OK, "%s", ts_error_message());
    ts_partition p;
    CHECKF(ts_partition_build(&cfg, false, &p) == TS_OK, "%s", ts_error_message());
    CHECK(p.n_chunks == 4 && !p.balanced);
    CHECK(p.first_layer[0] == 0 && p.first_layer[1] == 2 && p.first_layer[2] == 4 &&
          p.first_layer[3] == 5);
    CHECK(ts_partition_chunk_of(&p, 3) == 1 && ts_partition_chunk_of(&p, 5) == 3);
    bool owned[6];
    const int loop4[] = {0, 1, 2, 3}; /* the loop placement of 4 chunks on pp = 4 */
    ts_partition_owned(&p, loop4, 1, owned);
    CHECK(!owned[0] && !owned[1] && owned[2] && owned[3] && !owned[4] && !owned[5]);
    char *d = ts_partition_describe(&p, (const int[]){0, 1, 2, 3});
    CHECK(strstr(d, "explicit") && strstr(d, "embed+h.0") && strstr(d, "h.1-h.2") &&
          strstr(d, "head"));
    free(d);
    ts_partition_free(&p);

    /* A zero entry passes the config's own checks (the sum is right) but not ours. */
    cfg.parallel.partition[0] = 3;
    cfg.parallel.partition[3] = 0;
    CHECK(ts_partition_build(&cfg, false, &p) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "chunk 3 has 0 layers") != NULL, "%s", ts_error_message());
    cfg.parallel.partition[3] = 2;
    CHECK(ts_partition_build(&cfg, false, &p) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "sums to 8 layers") != NULL, "%s", ts_error_message());
    cfg.parallel.n_partition = 3;
    CHECK(ts_partition_build(&cfg, false, &p) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "lists 3 chunks") != NULL, "%s", ts_error_message());

    /* More chunks than layers (a config built in code skips ts_config_load's check). */
    cfg.parallel.n_partition = 0;
    cfg.parallel.pp = 7;
    CHECK(ts_partition_build(&cfg, false, &p) == TS_ERR);
    CHECKF(strstr(ts_error_message(), "more pipeline chunks than layers") != NULL, "%s",
           ts_error_message());
}

static void test_names(void)
{
    char b[64];
    CHECK(!strcmp(ts_partition_range_name(0, 3, 12, b, sizeof b), "embed+h.0-h.1"));
    CHECK(!strcmp(ts_partition_range_name(4, 1, 12, b, sizeof b), "h.3"));
    CHECK(!strcmp(ts_partition_range_name(11, 3, 12, b, sizeof b), "h.10-h.11+head"));
    CHECK(!strcmp(ts_partition_range_name(13, 1, 12, b, sizeof b), "head"));
    CHECK(!strcmp(ts_partition_range_name(0, 1, 12, b, sizeof b), "embed"));
    CHECK(!strcmp(ts_partition_range_name(0, 3, 1, b, sizeof b), "embed+h.0+head"));
}

/* GPT-2 124M: the modelled head is worth several blocks, the embedding a fraction of one,
 * so a balanced pp=4 cut does not give the first and last ranks 3 blocks plus an extra
 * layer each. */
static void test_model_gpt2(void)
{
    ts_model_config mc = {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257,
                          .seq_len = 1024};
    ts_layer_costs c;
    ts_layer_costs_model(&c, &mc, 4);
    CHECK(c.n_layers == 14 && c.source == TS_COST_MODELLED);
    double blk = c.fwd_ms[1] + c.bwd_ms[1], head = c.fwd_ms[13] + c.bwd_ms[13];
    double emb = c.fwd_ms[0] + c.bwd_ms[0];
    printf("gpt2-124m modelled per micro-batch of 4: embed %.1f ms, block %.1f ms, head %.1f ms "
           "(head = %.2f blocks)\n",
           emb, blk, head, head / blk);
    CHECK(head > 2.0 * blk && head < 6.0 * blk);
    CHECK(emb > 0 && emb < 0.5 * blk);
    CHECK(c.bwd_ms[1] > 1.9 * c.fwd_ms[1]);
    CHECK(c.act_bytes[13] > c.act_bytes[1]); /* the [N,V] logits */
    int s[4];
    double w[14];
    for (int l = 0; l < 14; l++) w[l] = c.fwd_ms[l] + c.bwd_ms[l];
    CHECK(ts_partition_balance(w, 14, 4, s) == TS_OK);
    CHECKF(s[3] < s[1] && s[3] < s[2], "%d %d %d %d", s[0], s[1], s[2], s[3]);
    ts_layer_costs_free(&c);
}

static void test_measured_tiny(void)
{
    const char *sets[] = {"parallel.pp=2"};
    ts_config cfg;
    CHECKF(load_tiny(&cfg, sets, 1) == TS_OK, "%s", ts_error_message());
    ts_partition p;
    CHECKF(ts_partition_build(&cfg, true, &p) == TS_OK, "%s", ts_error_message());
    CHECK(p.costs.source == TS_COST_MEASURED && p.balanced && p.n_chunks == 2);
    for (int l = 0; l < p.n_layers; l++) CHECK(p.costs.fwd_ms[l] > 0 && p.costs.bwd_ms[l] > 0);
    CHECK(p.costs.fwd_ms[1] == p.costs.fwd_ms[4]); /* every block gets block 0's time */
    CHECK(p.n_chunk_layers[0] + p.n_chunk_layers[1] == 6);
    CHECK(p.chunk_act_bytes[1] > 0);
    char *d = ts_partition_describe(&p, (const int[]){0, 1, 2, 3});
    printf("%s", d);
    CHECK(strstr(d, "measured") && strstr(d, "chunk 1"));
    free(d);

    /* From the same costs every process gets the same cut. */
    ts_partition q;
    CHECK(ts_partition_from_costs(&cfg, &p.costs, &q) == TS_OK);
    CHECK(!memcmp(p.n_chunk_layers, q.n_chunk_layers, sizeof(int) * 2));
    ts_partition_free(&q);
    ts_partition_free(&p);
}

/* Costs the arithmetic cannot balance still give a cut (probe D5: a cluster file with
 * a bandwidth of 1e-300 GB/s made every cost infinite, and the partitioner aborted). */
static void test_balance_total(void)
{
    int s[4];
    const double inf[6] = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
    CHECK(ts_partition_balance(inf, 6, 3, s) == TS_OK && s[0] == 2 && s[1] == 2 && s[2] == 2);
    const double nan_mixed[5] = {1, NAN, 1, INFINITY, 1};
    CHECK(ts_partition_balance(nan_mixed, 5, 2, s) == TS_OK && s[0] + s[1] == 5 && s[0] >= 1 &&
          s[1] >= 1);
    /* Finite costs whose squares overflow: balanced as their relative sizes say. */
    const double huge[4] = {1e300, 1e300, 3e300, 1e300};
    CHECK(ts_partition_balance(huge, 4, 2, s) == TS_OK && s[0] == 2 && s[1] == 2);
    const double big[4] = {3e200, 1e200, 1e200, 1e200}; /* sum 6e200: rescaled */
    CHECK(ts_partition_balance(big, 4, 2, s) == TS_OK && s[0] == 1 && s[1] == 3);
}

int main(void)
{
    test_balance_total();
    test_balance_exact();
    test_balance_ties_even();
    test_balance_errors();
    test_explicit();
    test_names();
    test_model_gpt2();
    test_measured_tiny();
    return ts_test_report();
}
