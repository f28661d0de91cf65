/* tests/test_ops_attention.c: the CPU backend's block-wise attention.
 *
 * The reference is textbook attention in fp64: for every query row it materialises the
 * whole row of scores over all keys, applies the soft-cap and the position mask, and
 * takes an exact softmax. The forward (out and lse) is compared with it; the backward
 * (dq, dk, dv) with central finite differences of L = sum(dout * out_ref) in fp64, so
 * the check does not go through the kernel's forward or its recomputation from lse.
 * Shapes are chosen to cross the kernel's block sizes (64 keys; 64 query rows, 32 at
 * head_dim 256) with ragged last blocks. Document masking (q_seg / k_seg) is checked
 * the same way: the reference masks pairs of different segment ids on top of the
 * position rule. MT_TEST_VERBOSE=1 prints the errors. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include <omp.h>

#include "kernels/backend.h"
#include "tests/test_ops_util.h"

#define EXPECT_ERR(what, err, tol)                                                      \
    do {                                                                                \
        double e_ = (err);                                                              \
        tu_report(what, e_, tol);                                                       \
        cr_expect(e_ <= (tol), "%s: error %.3e exceeds %.1e", what, e_, (double)(tol)); \
    } while (0)

typedef struct att_ctx {
    mt_attn_args a;
    double *q, *k, *v;
    const double *dout;
} att_ctx;

static int64_t qpos(const mt_attn_args *a, int64_t i) { return a->q_pos ? a->q_pos[i] : i; }
static int64_t kpos(const mt_attn_args *a, int64_t j) { return a->k_pos ? a->k_pos[j] : j; }

static void att_ref(const att_ctx *c, double *out, double *lse) {
    const mt_attn_args *a = &c->a;
    const int64_t G = a->H / a->Hkv, Dh = a->Dh;
    double *s = tu_dalloc(a->Tk);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t i = 0; i < a->Tq; i++) {
                const double *qi = c->q + ((b * a->Tq + i) * a->H + h) * Dh;
                double *oi = out + ((b * a->Tq + i) * a->H + h) * Dh;
                double mx = -INFINITY;
                for (int64_t j = 0; j < a->Tk; j++) {
                    const int64_t d = qpos(a, i) - kpos(a, j);
                    const int other_doc = a->q_seg && a->q_seg[b * a->Tq + i] != a->k_seg[b * a->Tk + j];
                    if (d < 0 || (a->window > 0 && d >= a->window) || other_doc) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    const double *kj = c->k + ((b * a->Tk + j) * a->Hkv + h / G) * Dh;
                    double dot = 0.0;
                    for (int64_t e = 0; e < Dh; e++) dot += qi[e] * kj[e];
                    double sc = (double)a->scale * dot;
                    if (a->softcap > 0) sc = a->softcap * tanh(sc / a->softcap);
                    s[j] = sc;
                    mx = sc > mx ? sc : mx;
                }
                for (int64_t e = 0; e < Dh; e++) oi[e] = 0.0;
                if (mx == -INFINITY) {
                    if (lse) lse[(b * a->H + h) * a->Tq + i] = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < a->Tk; j++) sum += exp(s[j] - mx);
                for (int64_t j = 0; j < a->Tk; j++) {
                    if (s[j] == -INFINITY) continue;
                    const double p = exp(s[j] - mx) / sum;
                    const double *vj = c->v + ((b * a->Tk + j) * a->Hkv + h / G) * Dh;
                    for (int64_t e = 0; e < Dh; e++) oi[e] += p * vj[e];
                }
                if (lse) lse[(b * a->H + h) * a->Tq + i] = mx + log(sum);
            }
    free(s);
}

static double att_loss(void *p) {
    att_ctx *c = p;
    const int64_t n = c->a.B * c->a.Tq * c->a.H * c->a.Dh;
    double *out = tu_dalloc(n), L = 0.0;
    att_ref(c, out, NULL);
    for (int64_t i = 0; i < n; i++) L += c->dout[i] * out[i];
    free(out);
    return L;
}

/* Tolerances: per-element bounds derived from the kernel's fp32 arithmetic (u = 2^-24,
 * gamma_n = n u / (1 - n u), Higham Eq. 3.5: an fp32 sum of n terms, in any order, fused
 * or not, is within gamma_n of the sum of |terms|), evaluated on the exact values, to
 * first order in u (x 1.01 for the rest). Per query row i (allowed keys j):
 * - score s = (scale q) . k: gamma_(Dh+1) scale sum_e |q k|; with the soft-cap also
 *   11u |z| (xent_bounds in tests/test_ops.c; the cap contracts the rest): es_j, E = max.
 * - the online softmax: every weight exp(s_j - m) is a product of at most nb + 1 exps
 *   (nb key blocks of 64, the rescalings), each 5u (vmath.h's exp: 2 ulp of the rounded
 *   value, Test vmath in test_ops.c) plus its fp32 argument's rounding (u |arg| <= u W,
 *   W the row's score range), and O and l are rescaled by rounded products:
 *   ew = (nb + 1)(6u + u W). Score errors move p_j by
 *   p_j (es_j + sum p es) <= 2 E p_j. O and l are fp32 sums over Tk keys (gamma_Tk), the
 *   division by l 2u: out within (2E + 2ew + 2 gamma_Tk + 2u) sum_j p_j |v_j|.
 * - lse = m + logf(l): E, ew, gamma_Tk, logf's 1 ulp (2u |log l|), the add (u |lse|).
 * - backward: P = exp(s - lse) with the fp32 lse: rho = es + e_lse + u |s - lse| + 5u
 *   relative; dP = dout . v (gamma_Dh sum |dout v|), D_i = dout . out with the kernel's
 *   out (gamma_Dh sum |dout out| + sum |dout| e_out); dS = P (dP - D_i) (2u), times the
 *   soft-cap's dz = 1 - (z / cap)^2 (which moves by 2 |z/cap| es / cap + 6u); then
 *   dv = sum_i P dout (gamma_(G Tq) + rho), dq = scale sum_j dS k and
 *   dk = sum_i dS (scale q) (gamma_(n + 2) of the |terms| plus the dS errors carried).
 * Finite differences add ~1e-10 of the gradient's scale (tests/test_ops_util.h); 1e-8 of
 * the largest entry is allowed for them (scores of std 4 raise their third derivative). */
static void att_bounds(const att_ctx *c, const double *lref, double *bo, double *bl, double *bq, double *bk,
                       double *bv) {
    const mt_attn_args *a = &c->a;
    const int64_t G = a->H / a->Hkv, Dh = a->Dh, Tk = a->Tk, nb = (a->Tk + 63) / 64;
    const double u = 0x1p-24, sc = a->scale, cap = a->softcap;
#define ATT_G(n) ((double)(n) * u / (1.0 - (double)(n) * u))
    double *s = tu_dalloc(Tk), *es = tu_dalloc(Tk), *P = tu_dalloc(Tk);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t i = 0; i < a->Tq; i++) {
                const int64_t row = (b * a->Tq + i) * a->H + h, lrow = (b * a->H + h) * a->Tq + i;
                const double *qi = c->q + row * Dh, *di = c->dout + row * Dh, L = lref[lrow];
                double *boi = bo + row * Dh;
                if (L == -INFINITY) {
                    for (int64_t e = 0; e < Dh; e++) boi[e] = 1e-30;
                    bl[lrow] = 1e-30;
                    continue;
                }
                double E = 0.0, m = -INFINITY, W = 0.0;
                for (int64_t j = 0; j < Tk; j++) {
                    const int64_t d = qpos(a, i) - kpos(a, j);
                    const int other_doc = a->q_seg && a->q_seg[b * a->Tq + i] != a->k_seg[b * a->Tk + j];
                    s[j] = -INFINITY;
                    if (d < 0 || (a->window > 0 && d >= a->window) || other_doc) continue;
                    const double *kj = c->k + ((b * Tk + j) * a->Hkv + h / G) * Dh;
                    double dot = 0.0, ab = 0.0;
                    for (int64_t e = 0; e < Dh; e++) dot += qi[e] * kj[e], ab += fabs(qi[e] * kj[e]);
                    s[j] = cap > 0 ? cap * tanh(sc * dot / cap) : sc * dot;
                    es[j] = ATT_G(Dh + 1) * sc * ab + (cap > 0 ? 11 * u * fabs(s[j]) : 0.0);
                    E = fmax(E, es[j]);
                    m = fmax(m, s[j]);
                }
                for (int64_t j = 0; j < Tk; j++)
                    if (s[j] > -INFINITY) W = fmax(W, m - s[j]);
                const double ew = (double)(nb + 1) * (6 * u + u * W);
                const double eo = 2 * E + 2 * ew + 2 * ATT_G(Tk) + 2 * u;
                for (int64_t e = 0; e < Dh; e++) boi[e] = 0.0;
                for (int64_t j = 0; j < Tk; j++) {
                    P[j] = s[j] > -INFINITY ? exp(s[j] - L) : 0.0;
                    const double *vj = c->v + ((b * Tk + j) * a->Hkv + h / G) * Dh;
                    for (int64_t e = 0; e < Dh; e++) boi[e] += eo * P[j] * fabs(vj[e]);
                }
                bl[lrow] = E + ew + ATT_G(Tk) + 2 * u * fabs(L - m) + u * fabs(L);
                double Di = 0.0, eD = 0.0;
                for (int64_t e = 0; e < Dh; e++) {
                    double oe = 0.0; /* out_i from P (the reference's value) */
                    for (int64_t j = 0; j < Tk; j++)
                        oe += P[j] * c->v[((b * Tk + j) * a->Hkv + h / G) * Dh + e];
                    Di += di[e] * oe;
                    eD += ATT_G(Dh) * fabs(di[e] * oe) + fabs(di[e]) * boi[e];
                }
                for (int64_t j = 0; j < Tk; j++) {
                    if (s[j] == -INFINITY) continue;
                    const int64_t kr = ((b * Tk + j) * a->Hkv + h / G) * Dh;
                    double dP = 0.0, aP = 0.0;
                    for (int64_t e = 0; e < Dh; e++) dP += di[e] * c->v[kr + e], aP += fabs(di[e] * c->v[kr + e]);
                    const double rho = es[j] + bl[lrow] + u * fabs(s[j] - L) + 5 * u;
                    const double th = cap > 0 ? s[j] / cap : 0.0, dz = 1.0 - th * th;
                    const double edz = cap > 0 ? 2 * fabs(th) * es[j] / cap + 6 * u : 0.0;
                    const double dSr = P[j] * (dP - Di), dS = dSr * dz;
                    const double edS = (P[j] * rho * fabs(dP - Di) + P[j] * (ATT_G(Dh) * aP + eD) + 2 * u * fabs(dSr)) *
                                           fabs(dz) + fabs(dSr) * edz + u * fabs(dS);
                    for (int64_t e = 0; e < Dh; e++) {
                        bv[kr + e] += (ATT_G(G * a->Tq) + rho) * P[j] * fabs(di[e]);
                        bq[row * Dh + e] += sc * (ATT_G(Tk + 2) * fabs(dS) + edS) * fabs(c->k[kr + e]);
                        bk[kr + e] += sc * (ATT_G(G * a->Tq + 2) * fabs(dS) + edS) * fabs(qi[e]);
                    }
                }
            }
#undef ATT_G
    const int64_t nq = a->B * a->Tq * a->H * Dh, nk = a->B * Tk * a->Hkv * Dh, nl = a->B * a->H * a->Tq;
    for (int64_t i = 0; i < nq; i++) bo[i] *= 1.01, bq[i] *= 1.01;
    for (int64_t i = 0; i < nk; i++) bk[i] *= 1.01, bv[i] *= 1.01;
    for (int64_t i = 0; i < nl; i++) bl[i] *= 1.01;
    free(s);
    free(es);
    free(P);
}

/* max over the m sampled entries idx of |got - fd| / (bnd + 1e-8 max |fd|). */
static double att_grad_ratio(const float *got, const double *fd, const double *bnd, const int64_t *idx, int64_t m) {
    double mx = 0.0, w = 0.0;
    for (int64_t t = 0; t < m; t++) mx = fmax(mx, fabs(fd[idx[t]]));
    for (int64_t t = 0; t < m; t++) {
        const double d = fabs((double)got[idx[t]] - fd[idx[t]]) / (bnd[idx[t]] + 1e-8 * mx + 1e-300);
        if (d != d) return NAN;
        w = d > w ? d : w;
    }
    return w;
}

typedef struct att_case {
    const char *name;
    mt_attn_args a;
    double std;          /* std of q and k (larger -> sharper softmax, soft-cap active) */
    int64_t fd_samples;  /* 0: every element */
} att_case;

static void run_case(const att_case *tc) {
    const mt_attn_args *a = &tc->a;
    tu_rng r = {(uint64_t)(a->Tq * 131 + a->Tk * 7 + a->H * 3 + a->Dh + a->Hkv)};
    const int64_t nq = a->B * a->Tq * a->H * a->Dh, nk = a->B * a->Tk * a->Hkv * a->Dh;
    const int64_t nl = a->B * a->H * a->Tq;
    float *q = tu_falloc(nq), *k = tu_falloc(nk), *v = tu_falloc(nk), *dout = tu_falloc(nq);
    float *out = tu_falloc(nq), *lse = tu_falloc(nl);
    float *dq = tu_falloc(nq), *dk = tu_falloc(nk), *dv = tu_falloc(nk);
    tu_fill_normal(&r, q, nq, tc->std);
    tu_fill_normal(&r, k, nk, tc->std);
    tu_fill_normal(&r, v, nk, 1.0);
    tu_fill_normal(&r, dout, nq, 1.0);
    mt_backend *o = mt_cpu_backend();
    TU_OK(o->ops->attention_fwd(o, a, out, lse, q, k, v));
    TU_OK(o->ops->attention_bwd(o, a, dq, dk, dv, dout, q, k, v, out, lse));

    att_ctx c = {*a, tu_to_double(q, nq), tu_to_double(k, nk), tu_to_double(v, nk),
                 tu_to_double(dout, nq)};
    double *oref = tu_dalloc(nq), *lref = tu_dalloc(nl);
    att_ref(&c, oref, lref);
    double *bo = tu_dalloc(nq), *bl = tu_dalloc(nl), *bq = tu_dalloc(nq), *bk = tu_dalloc(nk), *bv = tu_dalloc(nk);
    att_bounds(&c, lref, bo, bl, bq, bk, bv);
    char what[96];
    snprintf(what, sizeof what, "%s: out / bound", tc->name);
    double oerr = 0.0;
    for (int64_t i = 0; i < nq; i++) oerr = fmax(oerr, fabs((double)out[i] - oref[i]) / (bo[i] + 1e-300));
    EXPECT_ERR(what, oerr, 1.0);
    /* lse: rows without an allowed key must be -inf in both; compare the rest. */
    int64_t nfin = 0;
    double lerr = 0.0;
    for (int64_t i = 0; i < nl; i++) {
        if (lref[i] == -INFINITY) {
            cr_expect(lse[i] == -INFINITY, "%s: lse[%ld] should be -inf", tc->name, (long)i);
            continue;
        }
        nfin++;
        lerr = fmax(lerr, fabs((double)lse[i] - lref[i]) / bl[i]);
    }
    snprintf(what, sizeof what, "%s: lse / bound", tc->name);
    if (nfin) EXPECT_ERR(what, lerr, 1.0);

    const int64_t nmax = nq > nk ? nq : nk;
    double *fd = tu_dalloc(nmax);
    int64_t *idx = calloc((size_t)nmax, sizeof(int64_t));
    int64_t m = tu_fd_grad(att_loss, &c, c.q, nq, fd, idx, tc->fd_samples, &r);
    snprintf(what, sizeof what, "%s: dq vs fd / bound", tc->name);
    EXPECT_ERR(what, att_grad_ratio(dq, fd, bq, idx, m), 1.0);
    m = tu_fd_grad(att_loss, &c, c.k, nk, fd, idx, tc->fd_samples, &r);
    snprintf(what, sizeof what, "%s: dk vs fd / bound", tc->name);
    EXPECT_ERR(what, att_grad_ratio(dk, fd, bk, idx, m), 1.0);
    m = tu_fd_grad(att_loss, &c, c.v, nk, fd, idx, tc->fd_samples, &r);
    snprintf(what, sizeof what, "%s: dv vs fd / bound", tc->name);
    EXPECT_ERR(what, att_grad_ratio(dv, fd, bv, idx, m), 1.0);
    free(bo);
    free(bl);
    free(bq);
    free(bk);
    free(bv);

    free(q);
    free(k);
    free(v);
    free(dout);
    free(out);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    free(c.q);
    free(c.k);
    free(c.v);
    free((void *)c.dout);
    free(oref);
    free(lref);
    free(fd);
    free(idx);
}

/* mt_attn_args fields: B, Tq, Tk, H, Hkv, Dh, scale, softcap, window, q_pos, k_pos, q_seg, k_seg */

Test(attention, causal) {
    att_case tc = {"causal B=2 T=37", {2, 37, 37, 2, 2, 8, 0.35355339f, 0, 0, NULL, NULL, NULL, NULL}, 1.0, 0};
    run_case(&tc);
}

Test(attention, gqa_two_key_blocks) {
    /* H = 4 query heads on Hkv = 2; T = 70 is one full block of 64 plus 6 rows */
    att_case tc = {"GQA H=4 Hkv=2 T=70", {1, 70, 70, 4, 2, 8, 0.35355339f, 0, 0, NULL, NULL, NULL, NULL},
                   1.0, 150};
    run_case(&tc);
}

Test(attention, mqa) {
    att_case tc = {"MQA H=4 Hkv=1", {2, 20, 20, 4, 1, 8, 0.35355339f, 0, 0, NULL, NULL, NULL, NULL}, 1.0, 0};
    run_case(&tc);
}

Test(attention, head_dim_256) {
    att_case tc = {"Dh=256 T=5", {1, 5, 5, 2, 1, 256, 0.0625f, 0, 0, NULL, NULL, NULL, NULL}, 1.0, 0};
    run_case(&tc);
    /* two query blocks of 32 at this head_dim */
    att_case tc2 = {"Dh=256 T=36", {1, 36, 36, 2, 1, 256, 0.0625f, 0, 0, NULL, NULL, NULL, NULL}, 1.0, 40};
    run_case(&tc2);
}

Test(attention, sliding_window) {
    /* window 40 < T = 150 (key blocks 64 + 64 + 22): blocks wholly outside the window are
     * skipped, blocks straddling its edge are masked element by element */
    att_case tc = {"window=40 T=150", {1, 150, 150, 2, 1, 8, 0.35355339f, 0, 40, NULL, NULL, NULL, NULL},
                   1.0, 120};
    run_case(&tc);
}

Test(attention, softcap) {
    /* Gemma 2 style cap, made active: scores have std ~ 4 against a cap of 2 */
    att_case tc = {"softcap=2", {1, 30, 30, 2, 2, 16, 0.25f, 2.0f, 0, NULL, NULL, NULL, NULL}, 2.0, 0};
    run_case(&tc);
    att_case tc2 = {"softcap=2 window=9 GQA",
                    {2, 25, 25, 4, 2, 8, 0.35355339f, 2.0f, 9, NULL, NULL, NULL, NULL}, 2.0, 0};
    run_case(&tc2);
}

Test(attention, query_chunk_against_longer_keys) {
    /* a context-parallel chunk: 20 queries at positions 50..69 against keys 0..69 */
    int32_t qp[20], kp[70];
    for (int i = 0; i < 20; i++) qp[i] = 50 + i;
    for (int j = 0; j < 70; j++) kp[j] = j;
    att_case tc = {"q_pos 50..69, Tk=70", {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 0, qp, kp, NULL, NULL}, 1.0,
                   0};
    run_case(&tc);
}

Test(attention, two_chunk_positions_and_empty_rows) {
    /* The load-balanced context-parallel layout holds two chunks per rank; keys start at
     * position 3, so the queries at positions 1 and 2 see no key (lse = -inf, out = 0,
     * zero gradient); window 30 on top. */
    int32_t qp[20], kp[70];
    qp[0] = 1;
    qp[1] = 2;
    for (int i = 0; i < 8; i++) qp[2 + i] = 5 + i;
    for (int i = 0; i < 10; i++) qp[10 + i] = 60 + i;
    for (int j = 0; j < 70; j++) kp[j] = 3 + j;
    att_case tc = {"two chunks, empty rows, window=30",
                   {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 30, qp, kp, NULL, NULL}, 1.0, 0};
    run_case(&tc);
}

/* The backward has two schedules (per kv head when B * Hkv covers the threads, else
 * split into a dk/dv pass and a dq pass); with one thread MQA at B = 1 takes the first,
 * with two threads the second. Both, and the forward, must give the same bits. */
static void determinism_case(mt_attn_args a) {
    tu_rng r = {2024};
    const int64_t nq = a.B * a.Tq * a.H * a.Dh, nk = a.B * a.Tk * a.Hkv * a.Dh;
    const int64_t nl = a.B * a.H * a.Tq;
    float *q = tu_falloc(nq), *k = tu_falloc(nk), *v = tu_falloc(nk), *dout = tu_falloc(nq);
    tu_fill_normal(&r, q, nq, 1.0);
    tu_fill_normal(&r, k, nk, 1.0);
    tu_fill_normal(&r, v, nk, 1.0);
    tu_fill_normal(&r, dout, nq, 1.0);
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        out[t] = tu_falloc(nq);
        lse[t] = tu_falloc(nl);
        dq[t] = tu_falloc(nq);
        dk[t] = tu_falloc(nk);
        dv[t] = tu_falloc(nk);
        TU_OK(mt_cpu_backend()->ops->attention_fwd(mt_cpu_backend(), &a, out[t], lse[t], q, k, v));
        TU_OK(mt_cpu_backend()->ops->attention_bwd(mt_cpu_backend(), &a, dq[t], dk[t], dv[t], dout, q, k, v, out[t], lse[t]));
    }
    cr_expect(tu_bitwise_equal(out[0], out[1], nq), "out");
    cr_expect(tu_bitwise_equal(lse[0], lse[1], nl), "lse");
    cr_expect(tu_bitwise_equal(dq[0], dq[1], nq), "dq");
    cr_expect(tu_bitwise_equal(dk[0], dk[1], nk), "dk");
    cr_expect(tu_bitwise_equal(dv[0], dv[1], nk), "dv");
    for (int t = 0; t < 2; t++) {
        free(out[t]);
        free(lse[t]);
        free(dq[t]);
        free(dk[t]);
        free(dv[t]);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
}

Test(attention_determinism, schedules_and_thread_counts) {
    /* MQA, B = 1: one thread runs the per-kv-head schedule, two threads the split one */
    determinism_case((mt_attn_args){1, 150, 150, 4, 1, 16, 0.25f, 0, 0, NULL, NULL, NULL, NULL});
    /* B * Hkv = 4: both thread counts run the per-kv-head schedule */
    determinism_case((mt_attn_args){2, 100, 100, 4, 2, 8, 0.35355339f, 3.0f, 50, NULL, NULL, NULL, NULL});
    /* packed documents: segment ids change mid-block, so pairs are skipped, full or mixed */
    int32_t seg[2 * 150];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 150; t++) seg[b * 150 + t] = b == 0 ? (t >= 40) + (t >= 41) + (t >= 120) : t / 70;
    determinism_case((mt_attn_args){1, 150, 150, 4, 1, 16, 0.25f, 0, 0, NULL, NULL, seg, seg});
    determinism_case((mt_attn_args){2, 150, 150, 4, 2, 8, 0.35355339f, 3.0f, 50, NULL, NULL, seg, seg});
}

/* ---- document masking (packed sequences) ---- */

/* Segment ids of a packed row: a document starts at each listed offset (the first one
 * at 0 or later: rows before it continue a document from an earlier window, id 0). */
static void seg_from_starts(int32_t *seg, int64_t T, const int *starts, int n) {
    int32_t id = 0;
    for (int64_t t = 0, s = 0; t < T; t++) {
        while (s < n && starts[s] == t) {
            id++;
            s++;
        }
        seg[t] = id;
    }
}

Test(attention_documents, packed_rows) {
    /* B = 2 rows of 150 (key blocks 64 + 64 + 22, query blocks 64 + 64 + 22): row 0 has
     * documents starting at 0, 5, 6 (a one-token document), 64 (on a block edge) and 100;
     * row 1 continues a document for 30 tokens, then one document to the end, so whole
     * block pairs are one segment in one row and mixed in the other; GQA. */
    int32_t seg[2 * 150];
    const int s0[] = {0, 5, 6, 64, 100}, s1[] = {30};
    seg_from_starts(seg, 150, s0, 5);
    seg_from_starts(seg + 150, 150, s1, 1);
    att_case tc = {"documents B=2 T=150 GQA",
                   {2, 150, 150, 4, 2, 8, 0.35355339f, 0, 0, NULL, NULL, seg, seg}, 1.0, 150};
    run_case(&tc);
    /* with a sliding window and a soft-cap on top */
    att_case tc2 = {"documents window=20 softcap=2",
                    {2, 150, 150, 2, 1, 8, 0.35355339f, 2.0f, 20, NULL, NULL, seg, seg}, 2.0, 150};
    run_case(&tc2);
}

Test(attention_documents, context_parallel_chunks) {
    /* a context-parallel rank's view: queries are two chunks (positions 10..19 and
     * 60..69) of a 70-token row, keys the whole row in a gathered order that is not
     * sorted (positions 35..69, then 0..34), so neither positions nor ids are sorted;
     * documents start at 12, 40 and 65 */
    int32_t qp[20], kp[70], qs[20], ks[70], full[70];
    const int st[] = {12, 40, 65};
    seg_from_starts(full, 70, st, 3);
    for (int i = 0; i < 10; i++) qp[i] = 10 + i, qp[10 + i] = 60 + i;
    for (int j = 0; j < 70; j++) kp[j] = j < 35 ? 35 + j : j - 35;
    for (int i = 0; i < 20; i++) qs[i] = full[qp[i]];
    for (int j = 0; j < 70; j++) ks[j] = full[kp[j]];
    att_case tc = {"documents, two query chunks, unsorted keys",
                   {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 0, qp, kp, qs, ks}, 1.0, 0};
    run_case(&tc);
}
