/* tests/test_ops_util.h: helpers shared by the op tests (test_ops*.c, test_tiled_loss.c).
 *
 * A private RNG (so the tests do not depend on runtime/rng.c, which they do not test),
 * conversions between the kernels' fp32 and the references' fp64, error measures, and
 * the central finite difference used to check every backward against an fp64 forward
 * reference written in the test itself. */
#ifndef MT_TESTS_TEST_OPS_UTIL_H
#define MT_TESTS_TEST_OPS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: tiny, good enough for test data, same stream on every platform. */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;

static inline uint64_t tu_next(tu_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double tu_u01(tu_rng *r) { return (double)(tu_next(r) >> 11) * 0x1.0p-53; }

/* Standard normal (Box-Muller). */
static inline double tu_normal(tu_rng *r) {
    double u = tu_u01(r), v = tu_u01(r);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* Integer in [0, n). */
static inline int64_t tu_below(tu_rng *r, int64_t n) { return (int64_t)(tu_next(r) % (uint64_t)n); }

static inline float *tu_falloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static inline double *tu_dalloc(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* Fill x[n] with std * N(0, 1), rounded to fp32. */
static inline void tu_fill_normal(tu_rng *r, float *x, int64_t n, double std) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(std * tu_normal(r));
}

/* fp64 copy of an fp32 array (the exact values the kernel sees). */
static inline double *tu_to_double(const float *x, int64_t n) {
    double *d = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) d[i] = (double)x[i];
    return d;
}

static inline double tu_max_abs(const double *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* max_i |got_i - want_i| / max_i |want_i|: the error relative to the tensor's scale,
 * which is what fp32 rounding of sums and products bounds. NaN if got has a NaN. */
static inline double tu_rel_err(const float *got, const double *want, int64_t n) {
    double e = 0.0, m = tu_max_abs(want, n);
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d != d) return NAN;
        e = d > e ? d : e;
    }
    return m > 0.0 ? e / m : e;
}

/* Bitwise equality of two fp32 arrays. */
static inline int tu_bitwise_equal(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* fp32 unit roundoff u = 2^-24 and gamma_n = n u / (1 - n u), the bound on the relative
 * error of a sum of n terms in any order, with or without FMA (Higham, "Accuracy and
 * Stability of Numerical Algorithms", 2nd ed., eq. 3.5). */
#define U32 0x1p-24
#define GAMMA(n) ((double)(n) * U32 / (1.0 - (double)(n) * U32))

/* max_i |got_i - want_i| / bnd_i: at most 1 when every entry is within its own derived
 * bound bnd_i (> 0); NaN if got has a NaN. */
static inline double tu_bound_ratio(const float *got, const double *want, const double *bnd, int64_t n) {
    double w = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - want[i]) / bnd[i];
        if (d != d) return NAN;
        w = d > w ? d : w;
    }
    return w;
}

/* Central difference of loss(ctx) with respect to x[i], where x is one of the fp64
 * inputs the loss reads through ctx. With fp64 references of O(1) curvature, h = 1e-5
 * leaves a truncation error ~h^2 = 1e-10 and a rounding error ~1e-16 |L| / h ~ 1e-10,
 * both far below the fp32 errors the tests measure. */
typedef double (*tu_loss_fn)(void *ctx);
#define TU_FD_H 1e-5

static inline double tu_fd(tu_loss_fn loss, void *ctx, double *x, int64_t i) {
    const double x0 = x[i];
    x[i] = x0 + TU_FD_H;
    const double lp = loss(ctx);
    x[i] = x0 - TU_FD_H;
    const double lm = loss(ctx);
    x[i] = x0;
    return (lp - lm) / (2.0 * TU_FD_H);
}

/* Finite-difference gradient of loss w.r.t. every x[i] (all n, or `samples` random
 * indices when 0 < samples < n; unsampled entries of `grad` are left NAN and `idx` lists
 * the sampled ones). Returns the number of entries computed. */
static inline int64_t tu_fd_grad(tu_loss_fn loss, void *ctx, double *x, int64_t n, double *grad,
                                 int64_t *idx, int64_t samples, tu_rng *r) {
    if (samples <= 0 || samples >= n) {
        for (int64_t i = 0; i < n; i++) {
            grad[i] = tu_fd(loss, ctx, x, i);
            idx[i] = i;
        }
        return n;
    }
    for (int64_t i = 0; i < n; i++) grad[i] = NAN;
    for (int64_t s = 0; s < samples; s++) {
        const int64_t i = tu_below(r, n);
        idx[s] = i;
        grad[i] = tu_fd(loss, ctx, x, i);
    }
    return samples;
}

/* Error of a kernel gradient at the indices the finite difference computed, relative to
 * the largest finite-difference entry. */
static inline double tu_grad_err(const float *got, const double *fd, const int64_t *idx,
                                 int64_t m) {
    double e = 0.0, s = 0.0;
    for (int64_t t = 0; t < m; t++) s = fabs(fd[idx[t]]) > s ? fabs(fd[idx[t]]) : s;
    for (int64_t t = 0; t < m; t++) {
        double d = fabs((double)got[idx[t]] - fd[idx[t]]);
        if (d != d) return NAN;
        e = d > e ? d : e;
    }
    return s > 0.0 ? e / s : e;
}

/* With MT_TEST_VERBOSE set, print each measured error next to its tolerance (used to
 * size the tolerances; silent otherwise). */
static inline void tu_report(const char *what, double err, double tol) {
    if (getenv("MT_TEST_VERBOSE")) fprintf(stderr, "  %-44s err %.3e  tol %.1e\n", what, err, tol);
}

#endif
