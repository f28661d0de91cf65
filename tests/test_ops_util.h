/* tests/test_ops_util.h: helpers shared by the op tests (test_ops*.c, test_tiled_loss.c).
 *
 * A private RNG (so the tests do not depend on runtime/rng.c, which they do not test),
 * conversions between the kernels' fp32 and the references' fp64, error measures, the
 * fp32 and fp64 unit roundoffs and gamma_n, the bf16 unit roundoff and conversions, the
 * derived error bounds of the loss tile shared by test_ops.c and test_ops_bf16.c, and
 * the constructed case that pins where bf16 attention's backward rounds (tu_att_rcase,
 * shared by test_ops_attention.c, test_gpu_ops.c and test_gpu_attention_mma.c). */
#ifndef MT_TESTS_TEST_OPS_UTIL_H
#define MT_TESTS_TEST_OPS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dtype.h"
#include "kernels/ops.h"

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

/* fp64 references of the GLU activations (kernels/ops.h glu_fwd / glu_bwd): silu(g) =
 * g / (1 + exp(-g)); gelu_tanh(g) = g (1 + tanh(k (g + c g^3))) / 2, k = sqrt(2 / pi),
 * c = 0.044715 (Hendrycks & Gimpel 2016, the tanh approximation). */
static inline double tu_act_ref(double g, mt_activation act) {
    if (act == MT_ACT_SILU) return g / (1.0 + exp(-g));
    return 0.5 * g * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (g + 0.044715 * g * g * g)));
}
/* d act / d g in fp64: silu' = s (1 + g (1 - s)), s = 1 / (1 + exp(-g)); gelu_tanh' =
 * (1 + t) / 2 + g / 2 (1 - t^2) k (1 + 3 c g^2), t = tanh(k (g + c g^3)) (the
 * derivatives of tu_act_ref, kernels/cpu/glu.c's formulas). */
static inline double tu_act_grad_ref(double g, mt_activation act) {
    if (act == MT_ACT_SILU) {
        const double s = 1.0 / (1.0 + exp(-g));
        return s * (1.0 + g * (1.0 - s));
    }
    const double k = sqrt(2.0 / 3.14159265358979323846), t = tanh(k * (g + 0.044715 * g * g * g));
    return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * g * g);
}

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
/* The same for fp64 (u = 2^-53): the kernels' fp64 sums and the tests' fp64 references. */
#ifndef U64
#define U64 0x1p-53
#define GAMMA64(n) ((double)(n) * U64 / (1.0 - (double)(n) * U64))
#endif

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

/* With MT_TEST_VERBOSE set, print each measured error next to its tolerance (used to
 * size the tolerances; silent otherwise). */
static inline void tu_report(const char *what, double err, double tol) {
    if (getenv("MT_TEST_VERBOSE")) fprintf(stderr, "  %-44s err %.3e  tol %.1e\n", what, err, tol);
}

/* Expect err <= tol (Criterion's cr_expect, at the caller), reporting both with
 * tu_report. */
#define EXPECT_ERR(what, err, tol)                                                      \
    do {                                                                                \
        double e_ = (err);                                                              \
        tu_report(what, e_, tol);                                                       \
        cr_expect(e_ <= (tol), "%s: error %.3e exceeds %.1e", what, e_, (double)(tol)); \
    } while (0)

/* ---- bfloat16 (kernels/ops.h "Dtypes") ----
 * bf16 keeps p = 8 significant bits and fp32's exponent range. Round-to-nearest-even
 * moves a value by at most half an ulp, and ulp(x) <= 2^-7 |x|, so
 * |round(x) - x| <= 2^-8 |x| for every x above the subnormal range (2^-126): the bf16
 * unit roundoff UBF16, a bound relative to the value (not to its binade). */
#define UBF16 0x1p-8

/* x[i] = the bf16 value nearest x[i] (ties to even): test inputs a bf16 op sees exactly. */
static inline void tu_round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = mt_bf16_to_f32(mt_f32_to_bf16(x[i]));
}

/* bf16 copy of x (each element rounded to nearest even; exact when x holds bf16 values). */
static inline mt_bf16 *tu_bf16_copy(const float *x, int64_t n) {
    mt_bf16 *h = calloc((size_t)(n > 0 ? n : 1), sizeof(mt_bf16));
    for (int64_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(x[i]);
    return h;
}

/* dst[i] = src[i] widened to fp32 (exact). */
static inline void tu_widen(float *dst, const mt_bf16 *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(src[i]);
}

/* x rounded to the nearest bf16 value, ties to even, in fp64 (one rounding: going
 * through float first could round twice). |x| = m 2^e with m in [0.5, 1) has bf16
 * spacing 2^(e - 8) (8 significant bits), 2^-133 below 2^-126 (subnormals). */
static inline double tu_bf16_rn(double x) {
    if (x == 0.0 || !isfinite(x)) return x;
    int e;
    (void)frexp(x, &e);
    const double h = ldexp(1.0, (e < -125 ? -125 : e) - 8);
    return rint(x / h) * h; /* x / h and the product are exact; rint rounds ties to even */
}

/* ---- where bf16 attention's backward rounds P and dS (ops.h attention_bwd) ----
 * A constructed case in which the contract fixes dq, dk and dv to within fp32 noise,
 * and in which a backward that kept P or dS in fp32, or formed dS from the rounded P,
 * lands far outside that (the backward analogue of test_gpu_attention_mma.c's forward
 * p_is_rounded_to_bf16). B = H = Hkv = 1, Tq = Tk = 2, both queries at position 1
 * (both keys, at 0 and 1, allowed), no soft-cap, scale 1/8 (a power of two: exact),
 * bf16 inputs on four coordinates, the rest zero:
 *   q_i = a_i e0 + cq_i e1,  k_j = b_j e0 + ck_j e2,  v_j = n_j e0,
 *   dout_i = g_i e0 + co_i e3,  out_i = w_i e0 (out and lse are the backward's inputs:
 *   any values), lse_i = log(sum_j exp(s_ij)) rounded to fp32.
 * So s_ij = a_i b_j / 8, dP_ij = g_i n_j and D_i = g_i w_i are exact in fp32 (one
 * nonzero product of two bf16 numbers each), and the fp32 P_ij = exp(s_ij - lse_i) and
 * dS_ij = P_ij (dP_ij - D_i) are within 1e-5 relative of their exact values on every
 * implementation (the subtraction, the exp or exp2 with its log2(e) folding: a few
 * ulp each at |s|, |lse| < 8, which the draw requires). The values are drawn (fixed seed) until each exact P_ij
 * and dS_ij lies more than 2^-12 relative away from a bf16 rounding boundary: every
 * implementation then rounds it to tu_bf16_rn of the exact value. dq, dk, dv are then
 * sums of two exact products (8-bit times 8-bit) of those rounded values, one fp32
 * addition (2u relative to the sum of |terms| even with truncating tensor-core adds;
 * 4u allowed), times 1/8: e = 4u sum |terms|, and the bf16 output within
 * tol = e + 2^-8 (|M| + e) of the model M (+ 2^-140 so that tol > 0).
 * Three entries cancel: dv_1[3] = rn(P_01) - c rn(P_11) with co = (1, -c), c the bf16
 * nearest rn(P_01) / rn(P_11), and likewise dq_0[2] (ck) and dk_1[1] (cq) for dS: M is
 * then about 2^-8 of the terms, tol far below that, and the same sums of the unrounded
 * values (or, for dq and dk, of dS formed from the rounded P) differ from M by the
 * roundings themselves; the draw also requires those differences to exceed 16 tol. */
typedef struct tu_att_rcase {
    int64_t Dh;                  /* >= 4 */
    float scale;                 /* 1/8 */
    float *q, *k, *v, *dout, *out; /* [2][Dh] each, bf16 values */
    float lse[2];
    int32_t q_pos[2], k_pos[2];
    double *dq, *dk, *dv;        /* [2][Dh]: the contract's value M before the output rounding */
    double *tq, *tk, *tv;        /* the tolerance of each bf16 output element */
    double *uq, *uk, *uv;        /* the same sums with P and dS unrounded */
    double *pq, *pk;             /* dq, dk with dS formed from the rounded P */
    int64_t cq, ck, cv;          /* the cancelling elements: dq_0[2], dk_1[1], dv_1[3] */
} tu_att_rcase;

static inline void tu_att_rcase_free(tu_att_rcase *c) {
    double **d[] = {&c->dq, &c->dk, &c->dv, &c->tq, &c->tk, &c->tv, &c->uq, &c->uk, &c->uv, &c->pq, &c->pk};
    float **f[] = {&c->q, &c->k, &c->v, &c->dout, &c->out};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) free(*d[i]), *d[i] = NULL;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(*f[i]), *f[i] = NULL;
}

/* x lies more than 2^-12 |x| away from every bf16 rounding boundary, and is not tiny. */
static inline int tu_bf16_clear(double x) {
    return fabs(x) > 1e-3 && tu_bf16_rn(x * (1.0 - 0x1p-12)) == tu_bf16_rn(x * (1.0 + 0x1p-12));
}

/* Build the case for head dim Dh (>= 4). Returns 0, or -1 if no draw qualified. */
static inline int tu_att_rcase_make(tu_att_rcase *c, int64_t Dh) {
    memset(c, 0, sizeof *c);
    if (Dh < 4) return -1;
    const int64_t n = 2 * Dh;
    c->Dh = Dh;
    c->scale = 0.125f;
    c->q_pos[0] = c->q_pos[1] = 1;
    c->k_pos[0] = 0, c->k_pos[1] = 1;
    float **f[] = {&c->q, &c->k, &c->v, &c->dout, &c->out};
    double **d[] = {&c->dq, &c->dk, &c->dv, &c->tq, &c->tk, &c->tv, &c->uq, &c->uk, &c->uv, &c->pq, &c->pk};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] = calloc((size_t)n, sizeof(float));
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) *d[i] = calloc((size_t)n, sizeof(double));
    c->cq = 2, c->ck = Dh + 1, c->cv = Dh + 3;
    tu_rng r = {20240611};
#define TU_BF(std) ((double)mt_bf16_to_f32(mt_f32_to_bf16((float)((std) * tu_normal(&r)))))
    for (int trial = 0; trial < 100000; trial++) {
        double a[2], b[2], nv[2], g[2], w[2], P[2][2], S[2][2], Pr[2][2], Sr[2][2], Sp[2][2];
        int ok = 1;
        for (int t = 0; t < 2; t++) a[t] = TU_BF(2.0), b[t] = TU_BF(2.0), nv[t] = TU_BF(1.0), g[t] = TU_BF(1.0),
                                    w[t] = TU_BF(1.0);
        for (int i = 0; i < 2; i++) {
            const double s0 = c->scale * a[i] * b[0], s1 = c->scale * a[i] * b[1];
            const double m = s0 > s1 ? s0 : s1;
            c->lse[i] = (float)(m + log(exp(s0 - m) + exp(s1 - m)));
            ok = ok && fabs(s0) < 8.0 && fabs(s1) < 8.0 && fabs(c->lse[i]) < 8.0;
            for (int j = 0; j < 2; j++) {
                P[i][j] = exp(c->scale * a[i] * b[j] - (double)c->lse[i]);
                S[i][j] = P[i][j] * (g[i] * nv[j] - g[i] * w[i]);
                ok = ok && tu_bf16_clear(P[i][j]) && tu_bf16_clear(S[i][j]);
                Pr[i][j] = tu_bf16_rn(P[i][j]);
                Sr[i][j] = tu_bf16_rn(S[i][j]);
                Sp[i][j] = tu_bf16_rn(Pr[i][j] * (g[i] * nv[j] - g[i] * w[i]));
            }
        }
        if (!ok) continue;
        const double co = tu_bf16_rn(Pr[0][1] / Pr[1][1]), ck = tu_bf16_rn(Sr[0][0] / Sr[0][1]),
                     cq = tu_bf16_rn(Sr[0][1] / Sr[1][1]);
        for (int i = 0; i < 2; i++) {
            float *qi = c->q + i * Dh, *ki = c->k + i * Dh, *vi = c->v + i * Dh, *di = c->dout + i * Dh;
            qi[0] = (float)a[i], qi[1] = (float)(i ? -cq : 1.0);
            ki[0] = (float)b[i], ki[2] = (float)(i ? -ck : 1.0);
            vi[0] = (float)nv[i];
            di[0] = (float)g[i], di[3] = (float)(i ? -co : 1.0);
            c->out[i * Dh] = (float)w[i];
        }
        /* M, unrounded, dS from rounded P; e from the rounded terms */
        for (int64_t x = 0; x < n; x++) c->dq[x] = c->dk[x] = c->dv[x] = c->uq[x] = c->uk[x] = c->uv[x] = 0.0;
        for (int64_t x = 0; x < n; x++) c->pq[x] = c->pk[x] = c->tq[x] = c->tk[x] = c->tv[x] = 0.0;
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                for (int64_t x = 0; x < Dh; x++) {
                    const double kx = c->k[j * Dh + x], qx = c->q[i * Dh + x], ox = c->dout[i * Dh + x];
                    const int64_t iq = i * Dh + x, jk = j * Dh + x;
                    c->dq[iq] += c->scale * Sr[i][j] * kx, c->tq[iq] += c->scale * fabs(Sr[i][j] * kx);
                    c->uq[iq] += c->scale * S[i][j] * kx, c->pq[iq] += c->scale * Sp[i][j] * kx;
                    c->dk[jk] += c->scale * Sr[i][j] * qx, c->tk[jk] += c->scale * fabs(Sr[i][j] * qx);
                    c->uk[jk] += c->scale * S[i][j] * qx, c->pk[jk] += c->scale * Sp[i][j] * qx;
                    c->dv[jk] += Pr[i][j] * ox, c->tv[jk] += fabs(Pr[i][j] * ox);
                    c->uv[jk] += P[i][j] * ox;
                }
        double *M[3] = {c->dq, c->dk, c->dv}, *T[3] = {c->tq, c->tk, c->tv};
        for (int o = 0; o < 3; o++)
            for (int64_t x = 0; x < n; x++) {
                const double e = 4.0 * 0x1p-24 * T[o][x];
                T[o][x] = e + 0x1p-8 * (fabs(M[o][x]) + e) + 0x1p-140;
            }
        if (fabs(c->uv[c->cv] - c->dv[c->cv]) > 16.0 * c->tv[c->cv] &&
            fabs(c->uq[c->cq] - c->dq[c->cq]) > 16.0 * c->tq[c->cq] &&
            fabs(c->uk[c->ck] - c->dk[c->ck]) > 16.0 * c->tk[c->ck] &&
            fabs(c->pq[c->cq] - c->dq[c->cq]) > 16.0 * c->tq[c->cq] &&
            fabs(c->pk[c->ck] - c->dk[c->ck]) > 16.0 * c->tk[c->ck])
            return 0;
    }
#undef TU_BF
    return -1;
}

/* Derived bounds for one xent_tile call (the analysis of tests/test_tiled_loss.c, with
 * the logits exact here; test_ops.c, and test_ops_bf16.c before the bf16 rounding of
 * dlogits) against an fp64 reference of the same math (logsumexp(z) - z_label and
 * dscale (softmax(z) - onehot) dz): per labelled row of fp64 logits x (the kernel's fp32
 * values), z = cap tanh(x / cap) or x, p = softmax(z), dz = dz/dx:
 *  - z: x inv_cap (inv_cap = fl(1/cap) and the product: 2u relative, which tanh does not
 *    amplify since a sech^2 a <= tanh a), tanh (8u), the product by cap (u): ez = 11u |z|.
 *  - log-sum-exp: the logit errors weighted by p (dlse = sum p ez), each term's fp32
 *    z - max (u |z - max|) and exp (2 ulp of the rounded value, 2.5 of the exact: 5u;
 *    Test vmath): es = sum p (u |z - max| + 5u). Then fp64 (u64 = 2^-53): the sum S of
 *    V positive terms, in any order, within gamma64_V S (Higham eq. 3.5), which moves
 *    log S by at most gamma64_V / (1 - gamma64_V); log within 1 ulp (glibc manual, "Known
 *    Maximum Errors in Math Functions"; ulp(y) <= 2 u64 |y|); the additions max + log S
 *    and - z_label: e64 = gamma64_V + 2 u64 |log S| + u64 (|max + log S| + l), l the row
 *    loss. Row loss within dlse + es + ez_label + e64.
 *  - the reference's own error: the same operations in fp64, each within the error
 *    counted above in units of u64 (glibc's exp, log, tanh: 1, 1, 2 ulp), so within
 *    2^-29 (dlse + es + ez_label) + e64 per row: the fp64 terms count twice, the fp32
 *    ones' 2^-29 share is inside the factor 1.01 below.
 *  - the loss sums: the kernel adds the R row losses to stats[0] = st0 in some grouping
 *    and the caller subtracts st0 again, R + 1 fp64 additions of terms of one sign (the
 *    row losses are >= 0) plus one: gamma64_(R+2) (|st0| + sum l); the reference's sum
 *    of the rows gamma64_R sum l.
 *  - gradient dscale (p - onehot) dz: p carries ez + dlse (the shift), es, the sum's
 *    gamma64_V through 1/S (twice: the reference's own sum), its own u |z - max| + 5u,
 *    1/sum and the product (2u): rp; dz = 1 - th^2, th = z inv_cap, moves by
 *    2 |th| ez / cap + 6u absolute (edz); the label's p - 1, the products by dz and
 *    dscale: 3u. eg = |dscale| (p rp |dz| + |p - onehot| (edz + 3u |dz|)).
 *  - higher orders: along each chain the relative errors d_k compound to at most
 *    eps / (1 - eps), eps = sum |d_k| <= max rp + 3u; while eps <= 0.0099 that and the
 *    reference's 2^-29 share are within 1.01 of the first-order bound, which is
 *    returned times 1.01. This function requires eps <= 0.009 (else NAN, failing every
 *    comparison), leaving 0.0009 to a caller whose logits carry errors of their own
 *    (each moves a chain's eps by at most twice its largest absolute logit error).
 * Writes eg[R * V] (0 on ignored rows) and returns the bound on |(stats[0] after the
 * call - st0) - the reference's summed loss|. */
static inline double tu_xent_bounds(const double *x, const int32_t *labels, int32_t ignore, int64_t R,
                                    int64_t V, double cap, double dscale, double st0, double *eg) {
    const double u = U32;
    double lb = 0.0, lsum = 0.0, eps = 0.0;
    double *z = tu_dalloc(V), *p = tu_dalloc(V);
    for (int64_t r = 0; r < R; r++) {
        if (labels[r] == ignore) {
            for (int64_t j = 0; j < V; j++) eg[r * V + j] = 0.0;
            continue;
        }
        double mx = -INFINITY, s = 0.0, dlse = 0.0, es = 0.0;
        for (int64_t j = 0; j < V; j++) {
            z[j] = cap > 0 ? cap * tanh(x[r * V + j] / cap) : x[r * V + j];
            mx = z[j] > mx ? z[j] : mx;
        }
        for (int64_t j = 0; j < V; j++) s += exp(z[j] - mx);
        for (int64_t j = 0; j < V; j++) {
            p[j] = exp(z[j] - mx) / s;
            dlse += p[j] * (cap > 0 ? 11 * u * fabs(z[j]) : 0.0);
            es += p[j] * (u * fabs(z[j] - mx) + 5 * u);
        }
        const int32_t l = labels[r];
        const double g64 = GAMMA64(V) / (1.0 - GAMMA64(V)), lse = mx + log(s), loss = lse - z[l];
        const double e64 = g64 + 2 * U64 * fabs(log(s)) + U64 * (fabs(lse) + fabs(loss));
        lb += dlse + es + (cap > 0 ? 11 * u * fabs(z[l]) : 0.0) + 2 * e64;
        lsum += fabs(loss);
        for (int64_t j = 0; j < V; j++) {
            const double ez = cap > 0 ? 11 * u * fabs(z[j]) : 0.0, th = cap > 0 ? z[j] / cap : 0.0;
            const double dz = 1.0 - th * th, edz = cap > 0 ? 2 * fabs(th) * ez / cap + 6 * u : 0.0;
            const double rp = ez + dlse + es + 2 * g64 + u * fabs(z[j] - mx) + 7 * u;
            eg[r * V + j] = 1.01 * fabs(dscale) *
                            (p[j] * rp * fabs(dz) + fabs(p[j] - (j == l)) * (edz + 3 * u * fabs(dz)));
            eps = rp + 3 * u > eps ? rp + 3 * u : eps;
        }
    }
    lb += GAMMA64(R + 2) * (fabs(st0) + lsum) + GAMMA64(R) * lsum;
    free(z);
    free(p);
    if (!(eps <= 0.009)) {
        fprintf(stderr, "tu_xent_bounds: first-order eps %.3g > 0.009: the bound does not hold\n", eps);
        for (int64_t i = 0; i < R * V; i++) eg[i] = NAN;
        return NAN;
    }
    return 1.01 * lb;
}

#endif
