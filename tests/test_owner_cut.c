/* Owner-aligned bucket cuts (data/owner_cut.h), no MPI:
 *   test_even: without whole items the cuts are ZeRO's even ones and the loads stay;
 *   test_small: four equal items over two members go two and two, the floats between
 *     them (a norm) split where the even cut falls, and a lone item per bucket goes to
 *     the member with the smaller load (ties: the later member), so two buckets balance;
 *   test_big_item: an item larger than an even piece stays whole, the pieces still tile
 *     the bucket and the cuts between items fall on the alignment;
 *   test_llama_124m: a GPT-2-124M-shaped Llama (12 layers, 768 wide, 12 heads, SwiGLU
 *     2048) in 4 MiB buckets cut as the reducer walks them (from the end): every matrix
 *     in one member's piece, and at dp 2, 4 and 8 the most loaded member's Newton-Schulz
 *     cost within one largest matrix of the mean (printed: the balance the report
 *     quotes). */
#include <stdio.h>
#include <string.h>

#include "data/owner_cut.h"
#include "test_util.h"

/* Newton-Schulz's cost of a [rows, cols] matrix as ts_muon_ns_cost counts it. */
static double ns_cost(double rows, double cols)
{
    const double s = rows < cols ? rows : cols, l = rows < cols ? cols : rows;
    return s * s * (2.0 * l + s);
}

/* The pieces tile [0, len) in member order and each item lies in its owner's piece. */
static int tiles(int n, size_t len, const int *counts, const int *displs,
                 const ts_whole_item *items, int k, const int *owner)
{
    size_t at = 0;
    for (int r = 0; r < n; r++) {
        if ((size_t)displs[r] != at || counts[r] < 0) return 0;
        at += (size_t)counts[r];
    }
    if (at != len) return 0;
    for (int i = 0; i < k; i++) {
        const int o = owner[i];
        if (o < 0 || o >= n || (i > 0 && owner[i - 1] > o)) return 0;
        if (items[i].begin < (size_t)displs[o] || items[i].end > (size_t)(displs[o] + counts[o]))
            return 0;
    }
    return 1;
}

static void test_even(void)
{
    int counts[3], displs[3], owner[1];
    double load[3] = {5, 0, 1};
    ts_owner_cut(3, 1000, 16, NULL, 0, load, counts, displs, owner);
    /* 62 units of 16: 20, 21, 21 units, the last piece up to 1000. */
    CHECK(displs[0] == 0 && counts[0] == 320 && displs[1] == 320 && counts[1] == 336);
    CHECK(displs[2] == 656 && counts[2] == 344);
    CHECK(load[0] == 5 && load[1] == 0 && load[2] == 1);
}

static void test_small(void)
{
    /* [norm 32][a 64][b 64][norm 32][c 64][d 64]: a b c d of cost 1 each. */
    const ts_whole_item items[4] = {{32, 96, 1}, {96, 160, 1}, {192, 256, 1}, {256, 320, 1}};
    int counts[2], displs[2], owner[4];
    double load[2] = {0, 0};
    ts_owner_cut(2, 320, 16, items, 4, load, counts, displs, owner);
    CHECK(tiles(2, 320, counts, displs, items, 4, owner));
    CHECK(owner[0] == 0 && owner[1] == 0 && owner[2] == 1 && owner[3] == 1);
    CHECK(load[0] == 2 && load[1] == 2);
    CHECKF(counts[0] == 160 || counts[0] == 192, "%d", counts[0]); /* even cut 160, between b and c */
    /* One item a bucket: the tie goes to member 1, then member 0 is the lighter. */
    const ts_whole_item one = {16, 48, 3};
    double l2[2] = {0, 0};
    int o1 = -1, o2 = -1;
    ts_owner_cut(2, 64, 16, &one, 1, l2, counts, displs, &o1);
    CHECK(tiles(2, 64, counts, displs, &one, 1, &o1));
    ts_owner_cut(2, 64, 16, &one, 1, l2, counts, displs, &o2);
    CHECK(tiles(2, 64, counts, displs, &one, 1, &o2));
    CHECKF(o1 == 1 && o2 == 0 && l2[0] == 3 && l2[1] == 3, "%d %d", o1, o2);
}

static void test_big_item(void)
{
    /* An item of 900 floats in a bucket of 1000 over 4 members. */
    const ts_whole_item items[2] = {{40, 940, 10}, {940, 1000, 1}};
    int counts[4], displs[4], owner[2];
    double load[4] = {0, 0, 0, 0};
    ts_owner_cut(4, 1000, 16, items, 2, load, counts, displs, owner);
    CHECK(tiles(4, 1000, counts, displs, items, 2, owner));
    CHECK(owner[0] != owner[1] && load[owner[0]] == 10 && load[owner[1]] == 1);
    for (int r = 1; r < 4; r++) /* on the alignment, or at an item's edge */
        CHECKF(displs[r] % 16 == 0 || displs[r] == 40 || displs[r] == 940 || displs[r] == 1000,
               "%d", displs[r]);
}

/* A Llama block's tensors as the model lays them out (each on 16 floats): its two
 * norms and seven matrices, in the model's order. */
enum { MAX_P = 256 };
typedef struct {
    size_t off[MAX_P], numel[MAX_P];
    double cost[MAX_P];
    int n;
} layout;

static void add(layout *L, size_t numel, double cost)
{
    const size_t at = L->n ? L->off[L->n - 1] + (L->numel[L->n - 1] + 15) / 16 * 16 : 0;
    L->off[L->n] = at;
    L->numel[L->n] = numel;
    L->cost[L->n++] = cost;
}

static double balance(int n, const layout *L, size_t target, double *max_item)
{
    double load[16] = {0};
    int counts[16], displs[16], owner[MAX_P];
    ts_whole_item items[MAX_P];
    size_t end = L->off[L->n - 1] + L->numel[L->n - 1];
    int hi = L->n - 1; /* the open bucket's last parameter */
    *max_item = 0;
    for (int p = L->n - 1; p >= 0; p--) {
        if (end - L->off[p] < target && p > 0) continue;
        int k = 0;
        for (int q = p; q <= hi; q++) {
            if (L->cost[q] <= 0) continue;
            items[k++] = (ts_whole_item){L->off[q] - L->off[p], L->off[q] - L->off[p] + L->numel[q],
                                         L->cost[q]};
            if (L->cost[q] > *max_item) *max_item = L->cost[q];
        }
        ts_owner_cut(n, end - L->off[p], 16, items, k, load, counts, displs, owner);
        CHECK(tiles(n, end - L->off[p], counts, displs, items, k, owner));
        end = L->off[p];
        hi = p - 1;
    }
    double most = 0, sum = 0;
    for (int r = 0; r < n; r++) {
        sum += load[r];
        most = load[r] > most ? load[r] : most;
    }
    return most / (sum / n);
}

static void test_llama_124m(void)
{
    const size_t C = 768, F = 2048, V = 50304;
    layout L = {.n = 0};
    add(&L, V * C, 0); /* the embedding */
    for (int l = 0; l < 12; l++) {
        add(&L, C, 0);
        for (int i = 0; i < 4; i++) add(&L, C * C, ns_cost((double)C, (double)C)); /* q k v o */
        add(&L, C, 0);
        for (int i = 0; i < 3; i++) add(&L, C * F, ns_cost((double)F, (double)C)); /* gate up down */
    }
    add(&L, C, 0);
    add(&L, V * C, 0); /* the head */
    for (int n = 2; n <= 8; n *= 2) {
        double big;
        const double b = balance(n, &L, (size_t)4 << 18, &big);
        double total = 0;
        for (int p = 0; p < L.n; p++) total += L.cost[p];
        printf("GPT-2-124M-shaped Llama, 4 MiB buckets, dp %d: most loaded member %.4f x the mean "
               "Newton-Schulz cost (bound %.4f)\n", n, b, 1.0 + big / (total / n));
        CHECKF(b <= 1.0 + big / (total / n), "dp %d: %.4f", n, b);
    }
}

int main(void)
{
    test_even();
    test_small();
    test_big_item();
    test_llama_124m();
    return ts_test_report();
}
