/* The central-difference gradient check of the one-rank model tests (tests/test_mla_grad.c,
 * tests/test_moe_grad.c, tests/test_qk_norm.c): the backward's gradient of one weight
 * element against (f(w + h) - f(w - h)) / 2h of the test's objective, in fp32, within a
 * tolerance the test sets. Header-only, as test_util.h: its CHECKs count in the including
 * test's tally. Defines grad_check_tokens, grad_check_largest, grad_check_difference and
 * grad_check_element. */
#ifndef TS_GRAD_CHECK_H
#define TS_GRAD_CHECK_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "test_util.h"

/* The objective at the model's current weights; it also leaves its gradients in the
 * model's gradient memory (fixture_loss_and_grads and what the test adds to it). */
typedef double (*grad_check_objective)(ts_model *m);

typedef struct {
    grad_check_objective objective;
    float h;         /* the step either side of the weight */
    double rel, abs; /* passes when |difference - backward| <= rel |backward| + abs */
    double min_grad; /* and |backward| > min_grad: a zero gradient against a difference of
                        zero would pass having checked nothing */
} grad_check;

/* The tests' batch: n tokens and targets over a vocabulary, the same every run. */
static inline void grad_check_tokens(int *tokens, int *targets, int n, int vocab)
{
    for (int i = 0; i < n; i++) {
        tokens[i] = (i * 37 + 11) % vocab;
        targets[i] = (i * 53 + 5) % vocab;
    }
}

/* The index of the largest |g[i]| over i in [from, to) other than `skip` (SIZE_MAX: none),
 * the first of equals: the element whose gradient stands furthest above fp32's noise. */
static inline size_t grad_check_largest(const float *g, size_t from, size_t to, size_t skip)
{
    size_t best = SIZE_MAX;
    for (size_t i = from; i < to; i++)
        if (i != skip && (best == SIZE_MAX || fabsf(g[i]) > fabsf(g[best]))) best = i;
    return best;
}

/* The objective's derivative in element i of parameter p by central differences. The
 * weight is restored; the model's gradients are overwritten (read the backward's first). */
static inline double grad_check_difference(ts_model *m, const grad_check *c, int p, size_t i)
{
    float *w = ts_param_data(m, p);
    const float w0 = w[i];
    w[i] = w0 + c->h;
    const double up = c->objective(m);
    w[i] = w0 - c->h;
    const double down = c->objective(m);
    w[i] = w0;
    return (up - down) / (2.0 * (double)c->h);
}

/* One CHECK: the backward's gradient `want` of element i of parameter p against the
 * central difference; `what` names the case in the failure message. */
static inline bool grad_check_element(ts_model *m, const grad_check *c, int p, size_t i,
                                      double want, const char *what)
{
    const double fd = grad_check_difference(m, c, p, i);
    const bool matches =
        fabs(fd - want) <= c->rel * fabs(want) + c->abs && fabs(want) > c->min_grad;
    CHECKF(matches, "%s[%zu]: backward %.6g, central difference %.6g", what, i, want, fd);
    return matches;
}

#endif
