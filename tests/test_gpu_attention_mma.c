/* tests/test_gpu_attention_mma.c: the tensor-core bf16 FlashAttention-2 kernels
 * (kernels/cuda/attention_mma.cu) against an fp64 reference computed here from the same
 * bf16 inputs: forward out and lse, backward dq, dk and dv, each element within a bound
 * derived from the kernel's rounding points (below), then tests that those bounds are
 * tight enough to catch planted bugs, that P really is rounded to bf16 in the forward
 * and P and dS in the backward (constructed cases), determinism and argument errors.
 *
 * Built twice: as test_gpu_attention_mma (label gpu, the real device; exits 77 without
 * one) and as test_gpu_attention_mma_emu on the CPU emulator of tests/cudaemu (label emu,
 * run under three thread orders by cmake/cudaemu_backend.cmake, so a missing barrier or a
 * cp.async read before its wait shows).
 *
 * Error model (u = 2^-24 fp32 unit roundoff, gamma_n = 2n u / (1 - 2n u) for a sum of n
 * terms in any order (Higham 3.5, with 2u per add for the tensor cores' truncating
 * accumulation), UBF16 = 2^-8 bf16 unit roundoff: 8 significant bits,
 * round to nearest |round(x) - x| <= 2^-8 |x|; the 2^-9 sometimes quoted is half of that
 * and too small). Inputs are bf16, so every product q k, dout v, P dout, dS q, dS k of two
 * bf16 numbers is exact in fp32 and only sums and the listed roundings err:
 *  - score s_ij: gamma_Dh scale sum_d |q k| (fp32 sum, times the soft-cap's slope c'),
 *    plus 4 u c'|x| (x = scale <q,k>: the scale and 1/softcap roundings) and
 *    8 u (|s| + M + 1) (log2(e) folding, the subtraction of the running max or lse of
 *    size <= M, tanhf's few ulp): e_ij in absolute terms, a relative error exp(e) - 1 of
 *    the probability, plus 4 u for exp2f and 4 u per online-softmax rescale (<= one per
 *    16-key tile).
 *  - forward: out = sum_j bf16(p_j) v_j / sum_j p_j. With relative errors a_j (numerator
 *    weights: delta + UBF16 (1 + delta), the bf16 rounding of P) and b_j (denominator:
 *    delta) the ratio errs by (max|a| sum_j P_j |v_j| + max|b| |O|) / (1 - max|b|); fp32
 *    accumulation adds gamma_{Tk + tiles} to both; 1/l and the product 4 u |O|; the bf16
 *    output rounding UBF16 (|O| + bound).
 *  - lse: max_j e_ij + delta's tail + gamma (the sum) + 8 u (|L| + 1) (log2f, the
 *    conversions back to natural log).
 *  - backward from the given out (bf16) and lse (fp32), as the op contract says: P_ij =
 *    exp(s - lse) relative error rel = exp(e_ij + 4u) - 1; dP and D = <dout, out> fp32 sums
 *    of Dh exact products: gamma_Dh sum |dout v|, gamma_Dh sum |dout out|; dS = P (dP - D)
 *    c' errs by rel |dS| + P (ddP + dD + u |dP - D|) (c' + dc') + P |dP - D| dc' + 3 u |dS|
 *    (dc' = 2 |tanh| (c' darg + 2u) + 2u the soft-cap slope's error), then dS rounded
 *    to bf16 as the mma's A operand (ops.h): + UBF16 (|dS| + that), the rounding of a
 *    value within that bound of dS. dv = sum_i bf16(P) dout with P rounded too:
 *    (rel + UBF16 (1 + rel)) P |dout| per term; dk, dq = scale sum bf16(dS) q (or k): the
 *    rounded dS's error times |q| (|k|); gamma_(n + 2) (n = G Tq for dk, dv; Tk for dq:
 *    one mma accumulation per term, 2 to spare) times the sum of |terms| (each bf16
 *    product exact); u for the scale; UBF16 (|value| + bound) for the output rounding.
 *    These bounds also hold for a kernel that does not round P or dS (it errs less);
 *    backward_rounds_p_and_ds pins the rounding points.
 * Rows with no allowed key have bound 0: out, dq exactly 0 and lse exactly -inf. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "runtime/dtype.h"
#include "tests/test_backend_util.h"
#include "tests/test_ops_util.h"

#ifdef MT_HAVE_CUDA
#include "kernels/cuda/attention_mma.cuh"

#ifndef UBF16
#define UBF16 0x1p-8
#endif
/* gamma_n with 2u per addition: the tensor cores' fp32 accumulation truncates instead of
 * rounding to nearest (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of NVIDIA
 * tensor cores", PeerJ Computer Science 7:e330, 2021), so each add may err by 2u. */
#define GAMMA_TC(n) ((double)(n) * 2.0 * U32 / (1.0 - (double)(n) * 2.0 * U32))

static mt_backend *G;

static void setup(void) { TU_OK(mt_backend_create(MT_BACKEND_CUDA, &G)); }
static void teardown(void) { mt_backend_free(G); }

/* ---------------------------------------------------------------- data */

typedef struct mcase {
    int64_t B, Tq, Tk, H, Hkv, Dh;
    float softcap;
    int64_t window;
    int pos_mode; /* 0: NULL positions; 1: a context-parallel chunk pair (Tk >= Tq); 2: keys start at 10 */
    int seg_mode; /* 0: none; 1: packed documents; 2: documents and a query whose id no key has */
} mcase;

/* Host inputs: bf16 values held in float, positions and segment ids (NULL when unused). */
typedef struct mdata {
    mcase c;
    float scale;
    int64_t nq, nk, nl, G;
    float *q, *k, *v, *dout;
    int32_t *qp, *kp, *qs, *ks;
} mdata;

/* Document id of position p in sequence b: even rows 11-token documents and a one-token
 * document at 20, odd rows two documents split at 40 (whole tiles of one document). */
static int32_t doc_id(int64_t b, int64_t p) {
    if (b % 2) return p >= 40;
    return p == 20 ? 1000 : (int32_t)(p / 11);
}

static float *bf16_normal(tu_rng *r, int64_t n) {
    float *x = tu_falloc(n);
    for (int64_t i = 0; i < n; i++) x[i] = mt_bf16_to_f32(mt_f32_to_bf16((float)tu_normal(r)));
    return x;
}

static void data_make(mdata *d, const mcase *c, uint64_t seed) {
    memset(d, 0, sizeof *d);
    d->c = *c;
    d->scale = (float)(1.0 / sqrt((double)c->Dh));
    d->G = c->H / c->Hkv;
    d->nq = c->B * c->Tq * c->H * c->Dh;
    d->nk = c->B * c->Tk * c->Hkv * c->Dh;
    d->nl = c->B * c->H * c->Tq;
    tu_rng r = {seed};
    d->q = bf16_normal(&r, d->nq);
    d->k = bf16_normal(&r, d->nk);
    d->v = bf16_normal(&r, d->nk);
    d->dout = bf16_normal(&r, d->nq);
    if (c->pos_mode) {
        d->qp = malloc((size_t)c->Tq * sizeof(int32_t));
        d->kp = malloc((size_t)c->Tk * sizeof(int32_t));
        for (int64_t j = 0; j < c->Tk; j++) d->kp[j] = (int32_t)(c->pos_mode == 2 ? j + 10 : j);
        for (int64_t i = 0; i < c->Tq; i++) /* mode 1: early rows, then the last rows of the sequence */
            d->qp[i] = (int32_t)(c->pos_mode == 1 && i >= c->Tq / 2 ? c->Tk - c->Tq + i : i);
    }
    if (c->seg_mode) {
        d->qs = malloc((size_t)(c->B * c->Tq) * sizeof(int32_t));
        d->ks = malloc((size_t)(c->B * c->Tk) * sizeof(int32_t));
        for (int64_t b = 0; b < c->B; b++) {
            for (int64_t i = 0; i < c->Tq; i++) d->qs[b * c->Tq + i] = doc_id(b, d->qp ? d->qp[i] : i);
            for (int64_t j = 0; j < c->Tk; j++) d->ks[b * c->Tk + j] = doc_id(b, d->kp ? d->kp[j] : j);
            if (c->seg_mode == 2 && c->Tq > 3) d->qs[b * c->Tq + 3] = 777; /* a row no key matches */
        }
    }
}

static void data_free(mdata *d) {
    free(d->q), free(d->k), free(d->v), free(d->dout), free(d->qp), free(d->kp), free(d->qs), free(d->ks);
}

static mt_attn_args data_args(const mdata *d) {
    const mcase *c = &d->c;
    mt_attn_args a = {.B = c->B, .Tq = c->Tq, .Tk = c->Tk, .H = c->H, .Hkv = c->Hkv, .Dh = c->Dh,
                      .scale = d->scale, .softcap = c->softcap, .window = c->window, .dtype = MT_BF16};
    return a;
}

static int allowed(const mdata *d, int64_t b, int64_t i, int64_t j) {
    const int64_t qp = d->qp ? d->qp[i] : i, kp = d->kp ? d->kp[j] : j, diff = qp - kp;
    if (diff < 0 || (d->c.window > 0 && diff >= d->c.window)) return 0;
    return !d->qs || d->qs[b * d->c.Tq + i] == d->ks[b * d->c.Tk + j];
}

/* Score of (b, h, i, j) in fp64 and what its error bound needs. */
typedef struct score {
    double s, x, th, cp; /* score, scale <q,k>, tanh (soft-cap) and the slope c' = ds/dx */
    double dx;           /* bound on the fp32 error of x: scale gamma_Dh sum |q k| + 4 u |x| */
} score;

static score score_of(const mdata *d, int64_t b, int64_t h, int64_t i, int64_t j) {
    const mcase *c = &d->c;
    const float *qr = d->q + ((b * c->Tq + i) * c->H + h) * c->Dh;
    const float *kr = d->k + ((b * c->Tk + j) * c->Hkv + h / d->G) * c->Dh;
    double dot = 0.0, ab = 0.0;
    for (int64_t e = 0; e < c->Dh; e++) {
        dot += (double)qr[e] * kr[e];
        ab += fabs((double)qr[e] * kr[e]);
    }
    score r;
    r.x = (double)d->scale * dot;
    r.dx = (double)d->scale * GAMMA_TC(c->Dh) * ab + 4.0 * U32 * fabs(r.x);
    if (c->softcap > 0.0f) {
        r.th = tanh(r.x / c->softcap);
        r.s = c->softcap * r.th;
        r.cp = 1.0 - r.th * r.th;
    } else {
        r.th = 0.0;
        r.s = r.x;
        r.cp = 1.0;
    }
    return r;
}

/* Absolute error bound of the kernel's score (log-domain), M bounding the subtracted max/lse. */
static double score_err(const score *s, double M) { return s->cp * s->dx + 8.0 * U32 * (fabs(s->s) + M + 1.0); }

/* A planted bug for the reference: keys [k0, k1) left out of every row (forward, dq) and
 * queries [q0, q1) left out of dk/dv. Empty ranges for the true reference. */
typedef struct mdrop {
    int64_t k0, k1, q0, q1;
} mdrop;
static const mdrop NODROP = {0, 0, 0, 0};

/* ---------------------------------------------------------------- fp64 reference */

/* out [nq], lse [nl] and their bounds. */
static void ref_forward(const mdata *d, mdrop drop, double *out, double *lse, double *bout, double *blse) {
    const mcase *c = &d->c;
    const int64_t tiles = (c->Tk + 15) / 16;
    double *s = tu_dalloc(c->Tk), *e = tu_dalloc(c->Tk);
    char *ok = calloc((size_t)c->Tk, 1);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                double m = -INFINITY, M = 0.0;
                for (int64_t j = 0; j < c->Tk; j++) {
                    ok[j] = allowed(d, b, i, j) && !(j >= drop.k0 && j < drop.k1);
                    if (!ok[j]) continue;
                    const score sc = score_of(d, b, h, i, j);
                    s[j] = sc.s;
                    e[j] = sc.cp * sc.dx;
                    m = fmax(m, s[j]);
                    M = fmax(M, fabs(s[j]));
                }
                const int64_t row = (b * c->Tq + i) * c->H + h, li = (b * c->H + h) * c->Tq + i;
                double *o = out + row * c->Dh, *bo = bout + row * c->Dh;
                if (m == -INFINITY) { /* no allowed key: exactly 0 and -inf */
                    for (int64_t x = 0; x < c->Dh; x++) o[x] = bo[x] = 0.0;
                    lse[li] = -INFINITY;
                    blse[li] = 0.0;
                    continue;
                }
                double l = 0.0, emax = 0.0;
                for (int64_t j = 0; j < c->Tk; j++)
                    if (ok[j]) {
                        l += exp(s[j] - m);
                        emax = fmax(emax, e[j] + 8.0 * U32 * (fabs(s[j]) + M + 1.0));
                    }
                const double L = m + log(l);
                const double delta = expm1(emax + (double)(tiles + 3) * 4.0 * U32);
                const double gam = GAMMA_TC(c->Tk + tiles + 4);
                for (int64_t x = 0; x < c->Dh; x++) {
                    double acc = 0.0, wsum = 0.0;
                    for (int64_t j = 0; j < c->Tk; j++)
                        if (ok[j]) {
                            const double p = exp(s[j] - L), vv = d->v[((b * c->Tk + j) * c->Hkv + h / d->G) * c->Dh + x];
                            acc += p * vv;
                            wsum += p * fabs(vv);
                        }
                    o[x] = acc;
                    double bb = ((delta + UBF16 * (1.0 + delta) + gam) * wsum + (delta + gam) * fabs(acc)) /
                                    (1.0 - delta - gam) +
                                4.0 * U32 * fabs(acc);
                    bo[x] = bb + UBF16 * (fabs(acc) + bb);
                }
                lse[li] = L;
                blse[li] = delta + gam + 8.0 * U32 * (fabs(L) + 1.0);
            }
    free(s), free(e), free(ok);
}

/* dq [nq], dk and dv [nk] and their bounds, from the given out (bf16 values) and lse. */
static void ref_backward(const mdata *d, mdrop drop, const float *out, const float *lse, double *dq, double *dk,
                         double *dv, double *bdq, double *bdk, double *bdv) {
    const mcase *c = &d->c;
    const int64_t Dh = c->Dh;
    /* one mma accumulation per term (bf16 P or dS times bf16 dout, k or q: exact products):
     * n additions (n = Tk for dq, G Tq for dk and dv), 2 to spare */
    const double gq = GAMMA_TC(c->Tk + 2), gk = GAMMA_TC(d->G * c->Tq + 2), gd = GAMMA_TC(Dh);
    memset(dq, 0, (size_t)d->nq * sizeof(double));
    memset(bdq, 0, (size_t)d->nq * sizeof(double));
    memset(dk, 0, (size_t)d->nk * sizeof(double));
    memset(dv, 0, (size_t)d->nk * sizeof(double));
    memset(bdk, 0, (size_t)d->nk * sizeof(double));
    memset(bdv, 0, (size_t)d->nk * sizeof(double));
    /* sums of |terms| for the gamma_n part, separately */
    double *aq = tu_dalloc(d->nq), *ak = tu_dalloc(d->nk), *av = tu_dalloc(d->nk);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < c->Tq; i++) {
                const int64_t row = (b * c->Tq + i) * c->H + h, hk = h / d->G;
                const float *go = d->dout + row * Dh, *oo = out + row * Dh, *qr = d->q + row * Dh;
                const double L = lse[(b * c->H + h) * c->Tq + i];
                double D = 0.0, aD = 0.0;
                for (int64_t x = 0; x < Dh; x++) {
                    D += (double)go[x] * oo[x];
                    aD += fabs((double)go[x] * oo[x]);
                }
                const double eD = gd * aD;
                for (int64_t j = 0; j < c->Tk; j++) {
                    if (!allowed(d, b, i, j)) continue;
                    const int skip_k = j >= drop.k0 && j < drop.k1, skip_q = i >= drop.q0 && i < drop.q1;
                    const score sc = score_of(d, b, h, i, j);
                    const int64_t kro = ((b * c->Tk + j) * c->Hkv + hk) * Dh;
                    const float *kr = d->k + kro, *vr = d->v + kro;
                    double dP = 0.0, adP = 0.0;
                    for (int64_t x = 0; x < Dh; x++) {
                        dP += (double)go[x] * vr[x];
                        adP += fabs((double)go[x] * vr[x]);
                    }
                    const double P = exp(sc.s - L), g = dP - D, dS = P * g * sc.cp;
                    const double rel = expm1(score_err(&sc, fabs(L)) + 4.0 * U32);
                    const double dcp = c->softcap > 0.0f
                                           ? 2.0 * fabs(sc.th) * (sc.cp * sc.dx / c->softcap + 2.0 * U32) + 2.0 * U32
                                           : 0.0;
                    double edS = rel * fabs(dS) + P * (1.0 + rel) * (gd * adP + eD + U32 * fabs(g)) * (sc.cp + dcp) +
                                 P * fabs(g) * dcp + 3.0 * U32 * fabs(dS);
                    edS += UBF16 * (fabs(dS) + edS); /* dS rounded to bf16: <= 2^-8 of |dS^| */
                    const double eP = (rel + UBF16 * (1.0 + rel)) * P; /* P^ within rel P, then rounded */
                    for (int64_t x = 0; x < Dh; x++) {
                        if (!skip_k) {
                            dq[row * Dh + x] += dS * kr[x];
                            bdq[row * Dh + x] += edS * fabs(kr[x]);
                            aq[row * Dh + x] += (fabs(dS) + edS) * fabs(kr[x]);
                        }
                        if (!skip_q) {
                            dk[kro + x] += dS * qr[x];
                            bdk[kro + x] += edS * fabs(qr[x]);
                            ak[kro + x] += (fabs(dS) + edS) * fabs(qr[x]);
                            dv[kro + x] += P * go[x];
                            bdv[kro + x] += eP * fabs(go[x]);
                            av[kro + x] += (P + eP) * fabs(go[x]);
                        }
                    }
                }
            }
    const double sc = d->scale;
    for (int64_t n = 0; n < d->nq; n++) {
        dq[n] *= sc;
        const double bb = sc * (bdq[n] + gq * aq[n]) + U32 * fabs(dq[n]);
        bdq[n] = bb + UBF16 * (fabs(dq[n]) + bb);
    }
    for (int64_t n = 0; n < d->nk; n++) {
        dk[n] *= sc;
        const double bk = sc * (bdk[n] + gk * ak[n]) + U32 * fabs(dk[n]);
        bdk[n] = bk + UBF16 * (fabs(dk[n]) + bk);
        const double bv = bdv[n] + gk * av[n];
        bdv[n] = bv + UBF16 * (fabs(dv[n]) + bv);
    }
    free(aq), free(ak), free(av);
}

/* ---------------------------------------------------------------- device side */

static void *up(const void *h, size_t bytes) {
    void *p = tu_balloc(G, bytes > 0 ? bytes : 1);
    if (bytes) TU_OK(G->ops->copy_to_device(G, p, h, bytes));
    return p;
}

static void *up_bf16(const float *x, int64_t n) {
    mt_bf16 *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(mt_bf16));
    for (int64_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(x[i]);
    void *p = up(h, (size_t)n * sizeof(mt_bf16));
    free(h);
    return p;
}

static double *down_bf16(const void *p, int64_t n) {
    mt_bf16 *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(mt_bf16));
    TU_OK(G->ops->copy_to_host(G, h, p, (size_t)n * sizeof(mt_bf16)));
    double *x = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) x[i] = mt_bf16_to_f32(h[i]);
    free(h);
    return x;
}

static double *down_f32(const void *p, int64_t n) {
    float *h = tu_falloc(n);
    TU_OK(G->ops->copy_to_host(G, h, p, (size_t)n * sizeof(float)));
    double *x = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) x[i] = h[i];
    free(h);
    return x;
}

/* Device copies of a case's inputs; the kernels' outputs. */
typedef struct mdev {
    mt_attn_args a;
    void *q, *k, *v, *dout, *out, *lse, *out_in, *lse_in, *dq, *dk, *dv;
} mdev;

static void dev_make(mdev *g, const mdata *d) {
    g->a = data_args(d);
    g->a.q_pos = d->qp ? up(d->qp, (size_t)d->c.Tq * 4) : NULL;
    g->a.k_pos = d->kp ? up(d->kp, (size_t)d->c.Tk * 4) : NULL;
    g->a.q_seg = d->qs ? up(d->qs, (size_t)(d->c.B * d->c.Tq) * 4) : NULL;
    g->a.k_seg = d->ks ? up(d->ks, (size_t)(d->c.B * d->c.Tk) * 4) : NULL;
    g->q = up_bf16(d->q, d->nq);
    g->k = up_bf16(d->k, d->nk);
    g->v = up_bf16(d->v, d->nk);
    g->dout = up_bf16(d->dout, d->nq);
    g->out = tu_balloc(G, (size_t)d->nq * 2);
    g->lse = tu_balloc(G, (size_t)d->nl * 4);
    g->out_in = tu_balloc(G, (size_t)d->nq * 2);
    g->lse_in = tu_balloc(G, (size_t)d->nl * 4);
    g->dq = tu_balloc(G, (size_t)d->nq * 2);
    g->dk = tu_balloc(G, (size_t)d->nk * 2);
    g->dv = tu_balloc(G, (size_t)d->nk * 2);
}

static void dev_free(mdev *g) {
    void *ps[] = {(void *)g->a.q_pos, (void *)g->a.k_pos, (void *)g->a.q_seg, (void *)g->a.k_seg, g->q, g->k, g->v,
                  g->dout, g->out, g->lse, g->out_in, g->lse_in, g->dq, g->dk, g->dv};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) G->ops->release(G, ps[i]);
}

/* max_i |got - want| / bound (0 where equal, infinite inequalities included; a nonzero
 * error against bound 0, or a NaN, gives +inf); *at = the worst index. */
static double worst(const double *got, const double *want, const double *bnd, int64_t n, int64_t *at) {
    double w = 0.0;
    *at = -1;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == want[i]) continue;
        double r = bnd[i] > 0.0 ? fabs(got[i] - want[i]) / bnd[i] : INFINITY;
        if (r != r) r = INFINITY; /* NaN */
        if (r > w) {
            w = r;
            *at = i;
        }
    }
    return w;
}

static double expect_within(const char *what, const char *name, const double *got, const double *want,
                            const double *bnd, int64_t n) {
    int64_t at;
    const double w = worst(got, want, bnd, n, &at);
    cr_expect(w <= 1.0, "%s %s: element %lld kernel %.9g reference %.9g bound %.3g (%.3g x the bound)", name, what,
              (long long)at, at >= 0 ? got[at] : 0.0, at >= 0 ? want[at] : 0.0, at >= 0 ? bnd[at] : 0.0, w);
    cr_log_info("%s %s: worst error / bound = %.3g", name, what, w);
    return w;
}

/* Forward on the device, compared with the reference; then the backward from the
 * reference's out (rounded to bf16) and lse (rounded to fp32), so its bound does not
 * carry the forward's error. */
static void run_case(const char *name, const mcase *c, uint64_t seed) {
    mdata d;
    data_make(&d, c, seed);
    mdev g;
    dev_make(&g, &d);
    cr_assert(mt_cuda_attention_mma_supported(&g.a));

    TU_OK(mt_cuda_attention_mma_fwd(G, &g.a, g.out, (float *)g.lse, g.q, g.k, g.v));
    double *out = down_bf16(g.out, d.nq), *lse = down_f32(g.lse, d.nl);
    double *ro = tu_dalloc(d.nq), *rl = tu_dalloc(d.nl), *bo = tu_dalloc(d.nq), *bl = tu_dalloc(d.nl);
    ref_forward(&d, NODROP, ro, rl, bo, bl);
    expect_within("out", name, out, ro, bo, d.nq);
    expect_within("lse", name, lse, rl, bl, d.nl);

    float *oin = tu_falloc(d.nq), *lin = tu_falloc(d.nl);
    for (int64_t i = 0; i < d.nq; i++) oin[i] = mt_bf16_to_f32(mt_f32_to_bf16((float)ro[i]));
    for (int64_t i = 0; i < d.nl; i++) lin[i] = (float)rl[i];
    mt_bf16 *oh = malloc((size_t)d.nq * sizeof(mt_bf16));
    for (int64_t i = 0; i < d.nq; i++) oh[i] = mt_f32_to_bf16(oin[i]);
    TU_OK(G->ops->copy_to_device(G, g.out_in, oh, (size_t)d.nq * 2));
    TU_OK(G->ops->copy_to_device(G, g.lse_in, lin, (size_t)d.nl * 4));
    TU_OK(mt_cuda_attention_mma_bwd(G, &g.a, g.dq, g.dk, g.dv, g.dout, g.q, g.k, g.v, g.out_in, (float *)g.lse_in));
    double *dq = down_bf16(g.dq, d.nq), *dk = down_bf16(g.dk, d.nk), *dv = down_bf16(g.dv, d.nk);
    double *rq = tu_dalloc(d.nq), *rk = tu_dalloc(d.nk), *rv = tu_dalloc(d.nk);
    double *bq = tu_dalloc(d.nq), *bk = tu_dalloc(d.nk), *bv = tu_dalloc(d.nk);
    ref_backward(&d, NODROP, oin, lin, rq, rk, rv, bq, bk, bv);
    expect_within("dq", name, dq, rq, bq, d.nq);
    expect_within("dk", name, dk, rk, bk, d.nk);
    expect_within("dv", name, dv, rv, bv, d.nk);

    dev_free(&g);
    data_free(&d);
    free(out), free(lse), free(ro), free(rl), free(bo), free(bl), free(oin), free(lin), free(oh);
    free(dq), free(dk), free(dv), free(rq), free(rk), free(rv), free(bq), free(bk), free(bv);
}

/* ---------------------------------------------------------------- cases */

Test(attention_mma, causal_gqa_hd64, .init = setup, .fini = teardown) {
    /* T = 100: a partial second tile of 64 queries and keys; causal skips tile (0, 1) */
    const mcase c = {.B = 2, .Tq = 100, .Tk = 100, .H = 4, .Hkv = 2, .Dh = 64};
    run_case("causal gqa hd64", &c, 1);
}

Test(attention_mma, window_softcap_mqa_hd128, .init = setup, .fini = teardown) {
    const mcase c = {.B = 1, .Tq = 96, .Tk = 96, .H = 4, .Hkv = 1, .Dh = 128, .softcap = 30.0f, .window = 40};
    run_case("window softcap mqa hd128", &c, 2);
}

Test(attention_mma, window_gqa_hd256, .init = setup, .fini = teardown) {
    /* dk/dv in two column slices of 128; the window skips key tiles far behind */
    const mcase c = {.B = 1, .Tq = 70, .Tk = 70, .H = 4, .Hkv = 2, .Dh = 256, .window = 20};
    run_case("window gqa hd256", &c, 3);
}

Test(attention_mma, window_edge_hd256, .init = setup, .fini = teardown) {
    /* window 63 = the span of some (query tile, key tile) pairs minus one (tiles of 64 and
     * 32 rows): the "every entry allowed" shortcut must not take the pair whose corner
     * entry is exactly `window` apart */
    const mcase c = {.B = 1, .Tq = 128, .Tk = 128, .H = 2, .Hkv = 1, .Dh = 256, .window = 63};
    run_case("window edge hd256", &c, 12);
}

Test(attention_mma, window_edge_softcap_hd72, .init = setup, .fini = teardown) {
    /* the same edge for the generic path's tiles of 32 and 16 rows */
    const mcase c = {.B = 1, .Tq = 96, .Tk = 96, .H = 2, .Hkv = 2, .Dh = 72, .softcap = 25.0f, .window = 63};
    run_case("window edge softcap hd72", &c, 13);
}

Test(attention_mma, cp_positions_hd72, .init = setup, .fini = teardown) {
    /* generic path (72 padded to 80), Tq != Tk, a context-parallel chunk pair: query tile
     * 1 (rows 32..39) sits at positions 82..89, so index-based skipping would drop keys */
    const mcase c = {.B = 2, .Tq = 40, .Tk = 90, .H = 3, .Hkv = 3, .Dh = 72, .pos_mode = 1};
    run_case("cp positions hd72", &c, 4);
}

Test(attention_mma, documents_mqa_hd512, .init = setup, .fini = teardown) {
    /* generic path at its maximum head dim: 4 column slices; packed documents */
    const mcase c = {.B = 2, .Tq = 48, .Tk = 48, .H = 2, .Hkv = 1, .Dh = 512, .seg_mode = 1};
    run_case("documents mqa hd512", &c, 5);
}

Test(attention_mma, empty_rows_hd200, .init = setup, .fini = teardown) {
    /* keys start at position 10 (queries 0..9 see none), query 3 has a segment id no key
     * has: rows with lse = -inf and out = 0; head dim 200: two slices, the second partial */
    const mcase c = {.B = 1, .Tq = 30, .Tk = 33, .H = 2, .Hkv = 1, .Dh = 200, .softcap = 20.0f, .window = 6,
                     .pos_mode = 2, .seg_mode = 2};
    run_case("empty rows hd200", &c, 6);
}

Test(attention_mma, cp_documents_window_softcap_hd128, .init = setup, .fini = teardown) {
    const mcase c = {.B = 2, .Tq = 64, .Tk = 128, .H = 2, .Hkv = 2, .Dh = 128, .softcap = 20.0f, .window = 50,
                     .pos_mode = 1, .seg_mode = 1};
    run_case("cp documents window softcap hd128", &c, 7);
}

Test(attention_mma, more_queries_than_keys_hd64, .init = setup, .fini = teardown) {
    /* NULL positions with Tq > Tk: query i sees keys 0..min(i, 19) */
    const mcase c = {.B = 1, .Tq = 80, .Tk = 20, .H = 2, .Hkv = 1, .Dh = 64};
    run_case("more queries than keys hd64", &c, 8);
}

/* ---------------------------------------------------------------- the bounds can fail */

/* A kernel that dropped key tile [64, 128) (forward) or query tile [64, 128) (dk, dv)
 * would be caught: the kernel's results, measured against a reference with that bug
 * planted, exceed the bounds by a wide margin. */
Test(attention_mma, bounds_catch_a_dropped_tile, .init = setup, .fini = teardown) {
    const mcase c = {.B = 1, .Tq = 128, .Tk = 128, .H = 2, .Hkv = 1, .Dh = 64};
    mdata d;
    data_make(&d, &c, 9);
    mdev g;
    dev_make(&g, &d);
    TU_OK(mt_cuda_attention_mma_fwd(G, &g.a, g.out, (float *)g.lse, g.q, g.k, g.v));
    double *out = down_bf16(g.out, d.nq), *lse = down_f32(g.lse, d.nl);
    double *ro = tu_dalloc(d.nq), *rl = tu_dalloc(d.nl), *bo = tu_dalloc(d.nq), *bl = tu_dalloc(d.nl);
    int64_t at;
    const mdrop dk = {64, 128, 0, 0};
    ref_forward(&d, dk, ro, rl, bo, bl);
    const double wo = worst(out, ro, bo, d.nq, &at), wl = worst(lse, rl, bl, d.nl, &at);
    cr_expect(wo > 10.0 && wl > 10.0, "a dropped key tile is only %.3g (out), %.3g (lse) x the bounds", wo, wl);
    cr_log_info("dropped key tile: out %.3g, lse %.3g x the bounds", wo, wl);
    ref_forward(&d, NODROP, ro, rl, bo, bl); /* the true reference passes (checked in the cases above too) */
    cr_expect(worst(out, ro, bo, d.nq, &at) <= 1.0 && worst(lse, rl, bl, d.nl, &at) <= 1.0);

    float *oin = tu_falloc(d.nq), *lin = tu_falloc(d.nl);
    mt_bf16 *oh = malloc((size_t)d.nq * sizeof(mt_bf16));
    for (int64_t i = 0; i < d.nq; i++) oh[i] = mt_f32_to_bf16((float)ro[i]), oin[i] = mt_bf16_to_f32(oh[i]);
    for (int64_t i = 0; i < d.nl; i++) lin[i] = (float)rl[i];
    TU_OK(G->ops->copy_to_device(G, g.out_in, oh, (size_t)d.nq * 2));
    TU_OK(G->ops->copy_to_device(G, g.lse_in, lin, (size_t)d.nl * 4));
    TU_OK(mt_cuda_attention_mma_bwd(G, &g.a, g.dq, g.dk, g.dv, g.dout, g.q, g.k, g.v, g.out_in, (float *)g.lse_in));
    double *gk = down_bf16(g.dk, d.nk), *gv = down_bf16(g.dv, d.nk), *gq = down_bf16(g.dq, d.nq);
    double *rq = tu_dalloc(d.nq), *rk = tu_dalloc(d.nk), *rv = tu_dalloc(d.nk);
    double *bq = tu_dalloc(d.nq), *bk = tu_dalloc(d.nk), *bv = tu_dalloc(d.nk);
    const mdrop dq = {0, 0, 64, 128};
    ref_backward(&d, dq, oin, lin, rq, rk, rv, bq, bk, bv);
    const double wk = worst(gk, rk, bk, d.nk, &at), wv = worst(gv, rv, bv, d.nk, &at);
    cr_expect(wk > 10.0 && wv > 10.0, "a dropped query tile is only %.3g (dk), %.3g (dv) x the bounds", wk, wv);
    ref_backward(&d, dk, oin, lin, rq, rk, rv, bq, bk, bv);
    const double wq = worst(gq, rq, bq, d.nq, &at);
    cr_expect(wq > 10.0, "a dropped key tile is only %.3g x the dq bound", wq);
    cr_log_info("dropped tile: dq %.3g, dk %.3g, dv %.3g x the bounds", wq, wk, wv);

    dev_free(&g);
    data_free(&d);
    free(out), free(lse), free(ro), free(rl), free(bo), free(bl), free(oin), free(lin), free(oh);
    free(gq), free(gk), free(gv), free(rq), free(rk), free(rv), free(bq), free(bk), free(bv);
}

/* P is rounded to bf16 before P V (ops.h): one query, two keys with scores 0 and s1 < 0,
 * so p = (1, exp(s1)) exactly up to fp32 (no rescale). With v0 = 1 and v1 = -c, c a bf16
 * close to 1 / bf16(p1), out[0] = (1 - c bf16(p1)) / (1 + p1) nearly cancels, so the
 * rounding of p1 (chosen 0.2..0.4 of a bf16 spacing away from p1, far from a tie and from
 * fp32's 1e-7) moves out[0] by much more than its own bf16 rounding: the kernel must
 * match this model to 2^-8 relative plus fp32 noise, and a kernel that skipped the
 * rounding (the model with p1 unrounded) would be many times that away. */
Test(attention_mma, p_is_rounded_to_bf16, .init = setup, .fini = teardown) {
    const mcase c = {.B = 1, .Tq = 1, .Tk = 2, .H = 1, .Hkv = 1, .Dh = 64, .window = 0};
    mdata d;
    data_make(&d, &c, 10);
    cr_assert_eq(d.scale, 0.125f);
    d.qp = malloc(sizeof(int32_t)); /* the query at position 1 sees both keys */
    d.kp = malloc(2 * sizeof(int32_t));
    d.qp[0] = 1, d.kp[0] = 0, d.kp[1] = 1;
    /* k1[0] = kappa = -(1 + n/128) (exact in bf16), s1 = kappa / 8 */
    double best = -1.0, kappa = 0.0;
    for (int n = 0; n < 128; n++) {
        const double kp = -(1.0 + n / 128.0), p1 = exp(kp / 8.0);
        const double r = fabs(mt_bf16_to_f32(mt_f32_to_bf16((float)p1)) - p1) / 0x1p-8; /* p1 in [0.5, 1) */
        if (r > 0.2 && r < 0.4 && fabs(r - 0.3) < fabs(best - 0.3)) best = r, kappa = kp;
    }
    cr_assert(best > 0.0);
    const double p1 = exp(kappa / 8.0), pr = mt_bf16_to_f32(mt_f32_to_bf16((float)p1));
    const float cc = mt_bf16_to_f32(mt_f32_to_bf16((float)(1.0 / pr)));
    for (int64_t x = 0; x < 64; x++) d.q[x] = x == 0 ? 1.0f : 0.0f, d.k[x] = 0.0f, d.k[64 + x] = x == 0 ? (float)kappa : 0.0f;
    for (int64_t x = 0; x < 64; x++) d.v[x] = x == 0 ? 1.0f : 0.5f, d.v[64 + x] = x == 0 ? -cc : 0.25f;
    mdev g;
    dev_make(&g, &d);
    TU_OK(mt_cuda_attention_mma_fwd(G, &g.a, g.out, (float *)g.lse, g.q, g.k, g.v));
    double *out = down_bf16(g.out, d.nq);
    const double model = (1.0 - cc * pr) / (1.0 + p1), unrounded = (1.0 - cc * p1) / (1.0 + p1);
    /* fp32: p1 to a few u, l = 1 + p1 and 1 / l and the product each u; the numerator
     * 1 - c bf16(p1) is exact in fp32 (16 significant bits, no cancellation error) */
    const double tol = UBF16 * fabs(model) + 16.0 * U32 * (1.0 + cc * pr);
    cr_expect(fabs(out[0] - model) <= tol, "out[0] %.9g, with P rounded %.9g (bound %.3g), unrounded %.9g", out[0],
              model, tol, unrounded);
    cr_expect(fabs(unrounded - model) > 8.0 * tol, "the construction is too weak: %.3g vs %.3g",
              fabs(unrounded - model), tol);
    cr_log_info("P rounding: kernel - model %.3g, unrounded - model %.3g, bound %.3g", fabs(out[0] - model),
                fabs(unrounded - model), tol);
    dev_free(&g);
    data_free(&d);
    free(out);
}

/* The backward's rounding points (ops.h attention_bwd): the constructed case of
 * tests/test_ops_util.h (tu_att_rcase, derivation there), in which dq, dk and dv are
 * fixed by the contract to within fp32 noise and the output rounding, while a kernel that
 * fed P or dS to the mma's unrounded (the former hi + lo split), or formed dS from the
 * rounded P, misses the cancelling entries by more than 16 tolerances. Head dims 64,
 * 128 and 256 (their tiles) and 72 (the generic path). */
Test(attention_mma, backward_rounds_p_and_ds, .init = setup, .fini = teardown) {
    const int64_t dhs[] = {64, 128, 256, 72};
    for (size_t t = 0; t < sizeof dhs / sizeof dhs[0]; t++) {
        const int64_t Dh = dhs[t], n = 2 * Dh;
        tu_att_rcase c;
        cr_assert_eq(tu_att_rcase_make(&c, Dh), 0, "no qualifying draw for the constructed case");
        mt_attn_args a = {.B = 1, .Tq = 2, .Tk = 2, .H = 1, .Hkv = 1, .Dh = Dh, .scale = c.scale, .dtype = MT_BF16};
        a.q_pos = up(c.q_pos, sizeof c.q_pos);
        a.k_pos = up(c.k_pos, sizeof c.k_pos);
        void *q = up_bf16(c.q, n), *k = up_bf16(c.k, n), *v = up_bf16(c.v, n), *dout = up_bf16(c.dout, n);
        void *out = up_bf16(c.out, n), *lse = up(c.lse, sizeof c.lse);
        void *dq = tu_balloc(G, (size_t)n * 2), *dk = tu_balloc(G, (size_t)n * 2), *dv = tu_balloc(G, (size_t)n * 2);
        TU_OK(mt_cuda_attention_mma_bwd(G, &a, dq, dk, dv, dout, q, k, v, out, (const float *)lse));
        double *gq = down_bf16(dq, n), *gk = down_bf16(dk, n), *gv = down_bf16(dv, n);
        int64_t at;
        const double wq = worst(gq, c.dq, c.tq, n, &at), wk = worst(gk, c.dk, c.tk, n, &at),
                     wv = worst(gv, c.dv, c.tv, n, &at);
        cr_expect(wq <= 1.0, "hd %lld: dq %.3g x its tolerance (dq_0[2] %.9g, contract %.9g, dS unrounded %.9g, "
                  "dS from rounded P %.9g)", (long long)Dh, wq, gq[c.cq], c.dq[c.cq], c.uq[c.cq], c.pq[c.cq]);
        cr_expect(wk <= 1.0, "hd %lld: dk %.3g x its tolerance (dk_1[1] %.9g, contract %.9g, unrounded %.9g, "
                  "from rounded P %.9g)", (long long)Dh, wk, gk[c.ck], c.dk[c.ck], c.uk[c.ck], c.pk[c.ck]);
        cr_expect(wv <= 1.0, "hd %lld: dv %.3g x its tolerance (dv_1[3] %.9g, contract %.9g, P unrounded %.9g)",
                  (long long)Dh, wv, gv[c.cv], c.dv[c.cv], c.uv[c.cv]);
        cr_log_info("backward rounding, hd %lld: worst / tolerance dq %.3g dk %.3g dv %.3g", (long long)Dh, wq, wk,
                    wv);
        void *ps[] = {(void *)a.q_pos, (void *)a.k_pos, q, k, v, dout, out, lse, dq, dk, dv};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) G->ops->release(G, ps[i]);
        free(gq), free(gk), free(gv);
        tu_att_rcase_free(&c);
    }
}

/* ---------------------------------------------------------------- determinism, errors */

Test(attention_mma, bitwise_deterministic, .init = setup, .fini = teardown) {
    const mcase c = {.B = 1, .Tq = 70, .Tk = 70, .H = 2, .Hkv = 1, .Dh = 128, .softcap = 20.0f};
    mdata d;
    data_make(&d, &c, 11);
    mdev g;
    dev_make(&g, &d);
    double *r[2][5];
    for (int t = 0; t < 2; t++) {
        TU_OK(mt_cuda_attention_mma_fwd(G, &g.a, g.out, (float *)g.lse, g.q, g.k, g.v));
        TU_OK(mt_cuda_attention_mma_bwd(G, &g.a, g.dq, g.dk, g.dv, g.dout, g.q, g.k, g.v, g.out, (float *)g.lse));
        r[t][0] = down_bf16(g.out, d.nq);
        r[t][1] = down_f32(g.lse, d.nl);
        r[t][2] = down_bf16(g.dq, d.nq);
        r[t][3] = down_bf16(g.dk, d.nk);
        r[t][4] = down_bf16(g.dv, d.nk);
    }
    const int64_t n[5] = {d.nq, d.nl, d.nq, d.nk, d.nk};
    for (int i = 0; i < 5; i++) {
        cr_expect(memcmp(r[0][i], r[1][i], (size_t)n[i] * sizeof(double)) == 0, "output %d differs between runs", i);
        free(r[0][i]), free(r[1][i]);
    }
    dev_free(&g);
    data_free(&d);
}

Test(attention_mma, refuses_what_it_does_not_handle, .init = setup, .fini = teardown) {
    mt_attn_args a = {.B = 1, .Tq = 4, .Tk = 4, .H = 2, .Hkv = 1, .Dh = 64, .scale = 0.125f, .dtype = MT_BF16};
    cr_expect(mt_cuda_attention_mma_supported(&a));
    a.Dh = 520;
    cr_expect(!mt_cuda_attention_mma_supported(&a));
    a.Dh = 36;
    cr_expect(!mt_cuda_attention_mma_supported(&a));
    a.Dh = 64;
    a.dtype = MT_F32;
    cr_expect(!mt_cuda_attention_mma_supported(&a));
    a.dtype = MT_BF16;
    a.Hkv = 3;
    cr_expect(!mt_cuda_attention_mma_supported(&a));
    a.Hkv = 1;
    /* a misaligned tensor: MT_ERR_INVALID, not sticky */
    unsigned char *buf = tu_balloc(G, 4096);
    float *l = tu_balloc(G, 64);
    cr_expect_eq(mt_cuda_attention_mma_fwd(G, &a, buf, l, buf + 2, buf, buf), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "aligned") != NULL, "%s", mt_last_error());
    a.Dh = 36;
    cr_expect_eq(mt_cuda_attention_mma_fwd(G, &a, buf, l, buf, buf, buf), MT_ERR_INVALID);
    TU_OK(G->ops->sync(G));
    G->ops->release(G, buf);
    G->ops->release(G, l);
}

#endif /* MT_HAVE_CUDA */

/* Skip (77) without a device or without CUDA in the build, before Criterion starts. */
int main(int argc, char *argv[]) {
#ifdef MT_HAVE_CUDA
    if (mt_cuda_backend_available()) {
        struct criterion_test_set *tests = criterion_initialize();
        int result = 0;
        if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
        criterion_finalize(tests);
        return result;
    }
#endif
    (void)argc, (void)argv;
    fprintf(stderr, "test_gpu_attention_mma: no CUDA device (or a build without CUDA): skipped\n");
    return 77;
}
