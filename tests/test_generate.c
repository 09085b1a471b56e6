/* Generation: the logits-only forward agrees with the training forward's loss at every
 * last position, and the sampler draws what it says (greedy, top-k, temperature, the
 * same tokens for the same seed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "core/rng.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "model/sample.h"
#include "test_util.h"

static ts_model_config tiny(void)
{
    ts_config c;
    ts_config_defaults(&c);
    c.model.n_layer = 2;
    c.model.n_head = 2;
    c.model.n_embd = 16;
    c.model.vocab_size = 40;
    c.model.seq_len = 8;
    return c.model;
}

/* A model whose logits are far from uniform: the random init (std 0.02) makes every loss
 * about log V, which any near-zero logits would match; weights of std 0.5 do not. */
static void init_strong(ts_model *m, uint64_t seed)
{
    ts_model_init_random(m, seed);
    for (int p = 0; p < m->n_params; p++) {
        float *w = ts_param_data(m, p);
        for (size_t i = 0; i < m->params[p].numel; i++)
            w[i] += 0.5f * (float)ts_rng_normal(seed + 1, (uint64_t)p, i);
    }
}

/* -log softmax(logits)[target], in double. */
static double neg_log_softmax(const float *logits, int V, int target)
{
    double mx = logits[0];
    for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
    double sum = exp((double)logits[0] - mx); /* the maximum's term is 1: sum >= 1 */
    for (int v = 1; v < V; v++) sum += exp((double)logits[v] - mx);
    return log(sum) - ((double)logits[target] - mx);
}

/* B sequences of length T (random tokens when `same` is false, else one sequence
 * repeated); the last position's target of sequence b is b % V, so with B = V every
 * logit of the last position is checked against the training forward's loss. */
static void check_logits_against_loss(ts_model *m, int B, int T, bool same)
{
    const int V = m->vocab_size;
    ts_acts train, gen;
    ts_acts_init(&train, m, 0, m->n_layers, B, T);
    ts_acts_init(&gen, m, 0, m->n_layers, B, T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const uint64_t draw = ts_rng_mix64((uint64_t)(same ? 0 : b) * 1000 + (uint64_t)t);
            train.tokens[b * T + t] = gen.tokens[b * T + t] = (int)(draw % (uint64_t)V);
            train.targets[b * T + t] = t == T - 1 ? b % V : (int)((draw >> 20) % (uint64_t)V);
        }
    double sum = 0.0;
    ts_model_forward(m, &train, 1.0f, &sum);
    const float *losses = ts_acts_losses(m, &train);
    float *logits = ts_alloc_floats((size_t)B * V);
    ts_model_forward_logits(m, &gen, logits);
    double worst = 0.0, lo = INFINITY, hi = 0.0;
    for (int b = 0; b < B; b++) {
        const double want = losses[b * T + T - 1];
        const double got = neg_log_softmax(logits + (size_t)b * V, V, b % V);
        const double e = ts_rel_err(got, want, 1e-6);
        worst = e > worst ? e : worst;
        lo = want < lo ? want : lo;
        hi = want > hi ? want : hi;
    }
    CHECKF(worst < 1e-5, "B=%d T=%d: worst relative difference %g from the training loss", B, T,
           worst);
    /* The check means something only when the losses differ from log V and each other. */
    CHECKF(B == 1 || hi - lo > 0.5, "B=%d T=%d: losses %g..%g barely differ", B, T, lo, hi);
    free(logits);
    ts_acts_free(&gen);
    ts_acts_free(&train);
}

static void test_forward_logits_matches_training_loss(void)
{
    ts_model_config mc = tiny();
    ts_model m;
    ts_model_build(&m, &(ts_model_spec){.arch = &mc, .k = &ts_kernels_cpu});
    init_strong(&m, 42);
    check_logits_against_loss(&m, mc.vocab_size, mc.seq_len, true); /* every logit */
    check_logits_against_loss(&m, mc.vocab_size, 3, true);          /* a shorter context */
    check_logits_against_loss(&m, 5, mc.seq_len, false);            /* rows of a batch */
    check_logits_against_loss(&m, 1, 1, false);                     /* one token */
    ts_model_free(&m);
}

static void random_logits(float *l, int V, uint64_t seed)
{
    for (int v = 0; v < V; v++) l[v] = (float)(3.0 * ts_rng_normal(seed, 7, (uint64_t)v));
}

static int argmax(const float *l, int V)
{
    int best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

static void test_sampler_greedy(void)
{
    enum { V = 50 };
    float l[V];
    int ok_k1 = 1, ok_t0 = 1;
    for (uint64_t trial = 0; trial < 20; trial++) {
        random_logits(l, V, trial);
        ts_sampler k1, t0;
        ts_sampler_init(&k1, V, 1.0, 1, trial);
        ts_sampler_init(&t0, V, 0.0, 0, trial);
        for (int i = 0; i < 5; i++) {
            ok_k1 &= ts_sampler_next(&k1, l) == argmax(l, V);
            ok_t0 &= ts_sampler_next(&t0, l) == argmax(l, V);
        }
        ts_sampler_free(&k1);
        ts_sampler_free(&t0);
    }
    CHECKF(ok_k1, "top-k 1 did not pick the argmax");
    CHECKF(ok_t0, "temperature 0 did not pick the argmax");
    /* Ties: the first of the largest. */
    float tie[4] = {0.5f, 2.0f, 2.0f, -1.0f};
    ts_sampler s;
    ts_sampler_init(&s, 4, 1.0, 1, 1);
    CHECK(ts_sampler_next(&s, tie) == 1);
    /* A diverged model's logits: nothing is drawn. */
    tie[3] = NAN;
    CHECK(ts_sampler_next(&s, tie) == -1);
    tie[3] = INFINITY;
    CHECK(ts_sampler_next(&s, tie) == -1);
    ts_sampler_free(&s);
}

/* n draws from fresh samplers of the same logits into out[n]. */
static void draw_n(int *out, int n, const float *l, int V, double temp, int k, uint64_t seed)
{
    ts_sampler s;
    ts_sampler_init(&s, V, temp, k, seed);
    for (int i = 0; i < n; i++) out[i] = ts_sampler_next(&s, l);
    ts_sampler_free(&s);
}

static void test_sampler_seed(void)
{
    enum { V = 30, N = 200 };
    float l[V];
    random_logits(l, V, 3);
    int a[N], b[N], c[N];
    draw_n(a, N, l, V, 1.0, 0, 11);
    draw_n(b, N, l, V, 1.0, 0, 11);
    draw_n(c, N, l, V, 1.0, 0, 12);
    CHECKF(!memcmp(a, b, sizeof a), "the same seed drew different tokens");
    CHECKF(memcmp(a, c, sizeof a) != 0, "another seed drew the same %d tokens", N);
}

static void test_sampler_top_k(void)
{
    enum { V = 40, N = 3000, K = 3 };
    float l[V];
    random_logits(l, V, 5);
    /* The K largest, found by sorting a copy. */
    float sorted[V];
    memcpy(sorted, l, sizeof l);
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (sorted[j] > sorted[i]) {
                float t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    static int d[N];
    draw_n(d, N, l, V, 5.0, K, 9); /* a high temperature, so all K are drawn */
    int inside = 1, seen[V] = {0};
    for (int i = 0; i < N; i++) {
        inside &= d[i] >= 0 && l[d[i]] >= sorted[K - 1];
        if (d[i] >= 0) seen[d[i]] = 1;
    }
    int n_seen = 0;
    for (int v = 0; v < V; v++) n_seen += seen[v];
    CHECKF(inside, "top-k %d drew a token outside the %d largest logits", K, K);
    CHECKF(n_seen == K, "top-k %d drew %d distinct tokens", K, n_seen);
    /* k >= vocab keeps every token. */
    draw_n(d, N, l, V, 50.0, V + 10, 9);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < N; i++) seen[d[i]] = 1;
    n_seen = 0;
    for (int v = 0; v < V; v++) n_seen += seen[v];
    CHECKF(n_seen > K, "top-k > vocab drew only %d distinct tokens", n_seen);
}

/* Frequencies follow softmax(logits / temperature). */
static void test_sampler_distribution(void)
{
    enum { V = 3, N = 40000 };
    const double p[V] = {0.5, 0.3, 0.2};
    float l[V];
    for (int v = 0; v < V; v++) l[v] = (float)log(p[v]) + 1.5f; /* a shift changes nothing */
    static int d[N];
    for (int pass = 0; pass < 2; pass++) {
        const double temp = pass == 0 ? 1.0 : 2.0;
        draw_n(d, N, l, V, temp, 0, 2024);
        double want[V], z = 0.0;
        for (int v = 0; v < V; v++) z += want[v] = pow(p[v], 1.0 / temp);
        int count[V] = {0};
        for (int i = 0; i < N; i++) count[d[i]]++;
        double worst = 0.0;
        for (int v = 0; v < V; v++) {
            const double e = fabs((double)count[v] / N - want[v] / z);
            worst = e > worst ? e : worst;
        }
        CHECKF(worst < 0.01, "temperature %g: frequencies off by %g", temp, worst);
    }
    /* The uniforms are in [0, 1) and not constant. */
    double lo = 1.0, hi = 0.0;
    for (uint64_t i = 0; i < 1000; i++) {
        const double u = ts_sample_uniform(5, i);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    CHECK(lo >= 0.0 && lo < 0.01 && hi < 1.0 && hi > 0.99);
}

int main(void)
{
    test_forward_logits_matches_training_loss();
    test_sampler_greedy();
    test_sampler_seed();
    test_sampler_top_k();
    test_sampler_distribution();
    return ts_test_report();
}
