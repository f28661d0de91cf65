/* tests/test_ops_attention.c: the CPU backend's block-wise attention.
 *
 * The reference is textbook attention in fp64: for every query row it materialises the
 * whole row of scores over all keys, applies the soft-cap and the position mask, and
 * takes an exact softmax. The forward (out and lse) is compared with it; the backward
 * (dq, dk, dv) with the exact gradient of L = sum(dout * out_ref) through it, written
 * out in fp64 (att_ref_bwd: the softmax backward of FlashAttention-2), so the check does
 * not go through the kernel's forward or its recomputation from lse. Each comparison
 * allows the kernel's derived error plus the reference's own fp64 rounding error, the
 * same analysis at u = 2^-53 (att_bounds).
 * Shapes are chosen to cross the kernel's block sizes (64 keys; 64 query rows, 32 at
 * head_dim 256) with ragged last blocks. Document masking (q_seg / k_seg) is checked
 * the same way: the reference masks pairs of different segment ids on top of the
 * position rule. MT_TEST_VERBOSE=1 prints the errors.
 * The same cases run with bf16 tensors (mt_attn_args.dtype = MT_BF16; the attention
 * cases of tests/test_ops_bf16.c live here, beside the reference and the bounds they
 * share): the inputs are bf16 values, the reference is the same fp64 attention of those
 * values, and the bounds add the bf16 roundings ops.h names (the forward's P before
 * P @ V, the backward's P before P^T dout and dS before dS k and dS^T q, and each output
 * once), derived in att_bounds. Since rounding only loosens those bounds, where the
 * backward rounds is pinned separately: by tu_att_rcase (tests/test_ops_util.h), a
 * constructed case that a backward keeping P or dS in fp32 fails, and by the comparison
 * with the fp32 kernel in bf16_rounding_points. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include <omp.h>

#include "kernels/backend.h"
#include "tests/test_ops_util.h"

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

/* The exact gradient of L = sum(dout * out) through att_ref, in fp64: the softmax
 * backward of FlashAttention-2 (Dao, "FlashAttention-2: Faster Attention with Better
 * Parallelism and Work Partitioning", 2023, Algorithm 2; the derivation is FlashAttention,
 * Dao et al. 2022, Appendix B.2), with the exact softmax in place of the tiled one. Per
 * query row i of head h with lse L_i (lref, att_ref's) and each allowed key j (masked
 * pairs and rows with no allowed key contribute nothing):
 *   P_ij = exp(z_ij - L_i),  dP_ij = dout_i . v_j,  D_i = rowsum(dout_i * out_i),
 *   dS_ij = P_ij (dP_ij - D_i) dz_ij,
 * dz_ij = d z / d a = 1 - (z_ij / cap)^2 for the soft-cap z = cap tanh(a / cap) of the
 * raw score a = scale q_i . k_j (1 without it); then
 *   dv_j += P_ij dout_i,  dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i,
 * where dv_j and dk_j gather the G = H / Hkv query heads that share kv head h / G (GQA).
 * out (att_ref's) and lref give D_i and P as the kernel's backward forms them (from
 * out and lse), so att_bounds at u = 2^-53 bounds this function's own rounding. When it
 * replaced the central differences of sum(dout * att_ref) (h = 1e-5) that the test used
 * before, the two agreed on 200 sampled entries of each of dq, dk, dv in every case here
 * to 5e-11..3e-9 of the largest entry, 8.6e-9 at Dh = 256: the differences' own
 * truncation and rounding, which is why they are no longer the reference. */
static void att_ref_bwd(const att_ctx *c, const double *out, const double *lref, double *dq, double *dk,
                        double *dv) {
    const mt_attn_args *a = &c->a;
    const int64_t G = a->H / a->Hkv, Dh = a->Dh;
    const double cap = a->softcap;
    memset(dq, 0, (size_t)(a->B * a->Tq * a->H * Dh) * sizeof(double));
    memset(dk, 0, (size_t)(a->B * a->Tk * a->Hkv * Dh) * sizeof(double));
    memset(dv, 0, (size_t)(a->B * a->Tk * a->Hkv * Dh) * sizeof(double));
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t i = 0; i < a->Tq; i++) {
                const int64_t row = (b * a->Tq + i) * a->H + h;
                const double L = lref[(b * a->H + h) * a->Tq + i];
                if (L == -INFINITY) continue; /* no allowed key: out = 0, no gradient */
                const double *qi = c->q + row * Dh, *di = c->dout + row * Dh, *oi = out + row * Dh;
                double Di = 0.0;
                for (int64_t e = 0; e < Dh; e++) Di += di[e] * oi[e];
                for (int64_t j = 0; j < a->Tk; j++) {
                    const int64_t d = qpos(a, i) - kpos(a, j);
                    const int other_doc = a->q_seg && a->q_seg[b * a->Tq + i] != a->k_seg[b * a->Tk + j];
                    if (d < 0 || (a->window > 0 && d >= a->window) || other_doc) continue;
                    const int64_t kr = ((b * a->Tk + j) * a->Hkv + h / G) * Dh;
                    double dot = 0.0, dP = 0.0;
                    for (int64_t e = 0; e < Dh; e++) dot += qi[e] * c->k[kr + e], dP += di[e] * c->v[kr + e];
                    double z = (double)a->scale * dot, dz = 1.0;
                    if (cap > 0) {
                        z = cap * tanh(z / cap);
                        dz = 1.0 - (z / cap) * (z / cap);
                    }
                    const double P = exp(z - L), dS = P * (dP - Di) * dz;
                    for (int64_t e = 0; e < Dh; e++) {
                        dv[kr + e] += P * di[e];
                        dq[row * Dh + e] += (double)a->scale * dS * c->k[kr + e];
                        dk[kr + e] += (double)a->scale * dS * qi[e];
                    }
                }
            }
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
 * The reference's own error: att_ref and att_ref_bwd run the operations counted here in
 * fp64 (the scores' Dh + 1 terms, the soft-cap's division, tanh and product, one exp per
 * probability over an fp64 difference, the exact softmax's Tk-term sum and one division,
 * log and one addition for lse, Tk-term P V sums, Dh-term dP and D_i (from the fp64 out,
 * whose bound eD then carries), dS's difference and products, dz's three roundings, and
 * the dv, dq, dk sums over G Tq, Tk and G Tq terms with one or two products each), with
 * no more terms and no larger error per operation in units of fp64's u = 2^-53: +, -, *
 * and / are correctly rounded, and glibc's exp, log and tanh are within 1, 1 and 2 ulp on
 * x86-64 (glibc manual, "Known Maximum Errors in Math Functions"), i.e. 2u, 2u and 4u
 * relative (ulp(x) <= 2u |x|), inside the 5u (rho) or 6u (ew), 2u and 8u counted here
 * for vmath.h's exp, logf and tanh. So att_bounds
 * with u = 2^-53 and ub = 0 bounds the reference's distance from the exact values, and
 * each comparison allows the kernel's bound plus the reference's.
 * The factor 1.01: along a chain, relative errors d_k compound to at most
 * prod(1 + |d_k|) - 1 <= eps / (1 - eps), eps = sum |d_k|, which is within 1.01 eps while
 * eps <= 0.0099. att_bounds returns the largest such eps of the case (P's rho plus the
 * output's, plus gamma of every term count on the chain), which run_case holds to that.
 * bf16 (ub = UBF16 = 2^-8, the relative bound of one round-to-nearest-even to bf16; 0
 * for fp32): the forward rounds each probability exp(s - m) <= 1 (0 or above 2^-126, so
 * never subnormal) to bf16 before P @ V while l sums the unrounded values, which moves
 * out by at most ub sum_j P_j |v_j| (the same weights as eo's); out is then rounded once:
 * ub (|out| + its bound). The backward's D_i reads that bf16 out, so eD takes the bf16
 * bound. The backward rounds its fp32 P (within rho P of the exact P) to bf16 before
 * dv += P^T dout: |rn(P^) - P^| <= ub P^ <= ub (1 + rho) P, so each dv term gains
 * ub P |dout| (first order); it rounds dS^ (within edS of the exact dS, formed from the
 * fp32 P) before dq and dk: ub (|dS| + edS) more per term, times scale |k| or scale |q|.
 * The rounding of dq, dk, dv is added by the caller (att_grad_ratio). The products of
 * these ub terms with the fp32 ones (u ub, ub rho) and ub^2 are within the 1.01 that
 * covers higher orders. */
static double att_bounds(const att_ctx *c, const double *lref, double u, double ub, double *bo, double *bl,
                         double *bq, double *bk, double *bv) {
    const mt_attn_args *a = &c->a;
    const int64_t G = a->H / a->Hkv, Dh = a->Dh, Tk = a->Tk, nb = (a->Tk + 63) / 64;
    const double sc = a->scale, cap = a->softcap;
#define ATT_G(n) ((double)(n) * u / (1.0 - (double)(n) * u))
    double *s = tu_dalloc(Tk), *es = tu_dalloc(Tk), *P = tu_dalloc(Tk), eps = 0.0;
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
                if (ub > 0.0) /* bf16: P rounded before P @ V, then out rounded once */
                    for (int64_t e = 0; e < Dh; e++) {
                        double pv = 0.0, oe = 0.0;
                        for (int64_t j = 0; j < Tk; j++) {
                            const double vje = c->v[((b * Tk + j) * a->Hkv + h / G) * Dh + e];
                            pv += P[j] * fabs(vje);
                            oe += P[j] * vje;
                        }
                        boi[e] += ub * pv;
                        boi[e] += ub * (fabs(oe) + boi[e]);
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
                    const double eSr = edS + ub * (fabs(dS) + edS); /* bf16: dS^ rounded */
                    eps = fmax(eps, rho + eo + 2 * ub + ATT_G(Dh + Tk + G * a->Tq + 4));
                    for (int64_t e = 0; e < Dh; e++) {
                        bv[kr + e] += (ATT_G(G * a->Tq) + rho + ub) * P[j] * fabs(di[e]);
                        bq[row * Dh + e] += sc * (ATT_G(Tk + 2) * fabs(dS) + eSr) * fabs(c->k[kr + e]);
                        bk[kr + e] += sc * (ATT_G(G * a->Tq + 2) * fabs(dS) + eSr) * fabs(qi[e]);
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
    return eps;
}

/* max_i |got_i - want_i| / (bnd_i + bref_i): the kernel's gradient against the fp64
 * reference's, bnd the kernel's bound and bref the reference's (both att_bounds), where
 * a gradient stored in bf16 (ub = UBF16, else 0) adds its rounding ub |fp32 value| <=
 * ub (|want| + bref + bnd). */
static double att_grad_ratio(const float *got, const double *want, const double *bnd, const double *bref, int64_t n,
                             double ub) {
    double w = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double b = bnd[i] + bref[i], br = b + ub * (fabs(want[i]) + b);
        const double d = fabs((double)got[i] - want[i]) / (br + 1e-300);
        if (d != d) return NAN;
        w = d > w ? d : w;
    }
    return w;
}

typedef struct att_case {
    const char *name;
    mt_attn_args a;
    double std; /* std of q and k (larger -> sharper softmax, soft-cap active) */
} att_case;

/* Forward and backward with bf16 tensors: q, k, v, dout (holding bf16 values) rounded
 * to bf16 copies, out, dq, dk, dv widened back into the fp32 arrays. */
static void att_run_bf16(const mt_attn_args *a, float *out, float *lse, float *dq, float *dk, float *dv,
                         const float *dout, const float *q, const float *k, const float *v) {
    const int64_t nq = a->B * a->Tq * a->H * a->Dh, nk = a->B * a->Tk * a->Hkv * a->Dh;
    mt_bf16 *qh = tu_bf16_copy(q, nq), *kh = tu_bf16_copy(k, nk), *vh = tu_bf16_copy(v, nk);
    mt_bf16 *dh = tu_bf16_copy(dout, nq), *oh = tu_bf16_copy(out, nq);
    mt_bf16 *dqh = tu_bf16_copy(dq, nq), *dkh = tu_bf16_copy(dk, nk), *dvh = tu_bf16_copy(dv, nk);
    mt_backend *o = mt_cpu_backend();
    TU_OK(o->ops->attention_fwd(o, a, oh, lse, qh, kh, vh));
    TU_OK(o->ops->attention_bwd(o, a, dqh, dkh, dvh, dh, qh, kh, vh, oh, lse));
    tu_widen(out, oh, nq);
    tu_widen(dq, dqh, nq);
    tu_widen(dk, dkh, nk);
    tu_widen(dv, dvh, nk);
    free(qh), free(kh), free(vh), free(dh), free(oh), free(dqh), free(dkh), free(dvh);
}

static void run_case(const att_case *tc) {
    const mt_attn_args *a = &tc->a;
    const int bf16 = a->dtype == MT_BF16;
    const double ub = bf16 ? UBF16 : 0.0; /* att_bounds */
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
    if (bf16) {
        tu_round_bf16(q, nq); /* the reference sees the values the kernel sees */
        tu_round_bf16(k, nk);
        tu_round_bf16(v, nk);
        tu_round_bf16(dout, nq);
        att_run_bf16(a, out, lse, dq, dk, dv, dout, q, k, v);
    } else {
        TU_OK(o->ops->attention_fwd(o, a, out, lse, q, k, v));
        TU_OK(o->ops->attention_bwd(o, a, dq, dk, dv, dout, q, k, v, out, lse));
    }

    att_ctx c = {*a, tu_to_double(q, nq), tu_to_double(k, nk), tu_to_double(v, nk),
                 tu_to_double(dout, nq)};
    double *oref = tu_dalloc(nq), *lref = tu_dalloc(nl);
    att_ref(&c, oref, lref);
    /* the kernel's bounds (fp32 u, ub) and the fp64 reference's (u = 2^-53, no bf16) */
    double *bo = tu_dalloc(nq), *bl = tu_dalloc(nl), *bq = tu_dalloc(nq), *bk = tu_dalloc(nk), *bv = tu_dalloc(nk);
    double *ro = tu_dalloc(nq), *rl = tu_dalloc(nl), *rq = tu_dalloc(nq), *rk = tu_dalloc(nk), *rv = tu_dalloc(nk);
    const double eps = att_bounds(&c, lref, U32, ub, bo, bl, bq, bk, bv);
    const double eps64 = att_bounds(&c, lref, 0x1p-53, 0.0, ro, rl, rq, rk, rv);
    char what[96];
    snprintf(what, sizeof what, "%s: first-order eps (<= 0.0099)", tc->name);
    EXPECT_ERR(what, fmax(eps, eps64), 0.0099);
    snprintf(what, sizeof what, "%s: out / bound", tc->name);
    double oerr = 0.0;
    for (int64_t i = 0; i < nq; i++) oerr = fmax(oerr, fabs((double)out[i] - oref[i]) / (bo[i] + ro[i] + 1e-300));
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
        lerr = fmax(lerr, fabs((double)lse[i] - lref[i]) / (bl[i] + rl[i]));
    }
    snprintf(what, sizeof what, "%s: lse / bound", tc->name);
    if (nfin) EXPECT_ERR(what, lerr, 1.0);

    double *gq = tu_dalloc(nq), *gk = tu_dalloc(nk), *gv = tu_dalloc(nk);
    att_ref_bwd(&c, oref, lref, gq, gk, gv);
    snprintf(what, sizeof what, "%s: dq / bound", tc->name);
    EXPECT_ERR(what, att_grad_ratio(dq, gq, bq, rq, nq, ub), 1.0);
    snprintf(what, sizeof what, "%s: dk / bound", tc->name);
    EXPECT_ERR(what, att_grad_ratio(dk, gk, bk, rk, nk, ub), 1.0);
    snprintf(what, sizeof what, "%s: dv / bound", tc->name);
    EXPECT_ERR(what, att_grad_ratio(dv, gv, bv, rv, nk, ub), 1.0);
    free(ro), free(rl), free(rq), free(rk), free(rv), free(gq), free(gk), free(gv);
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
}

/* mt_attn_args fields: B, Tq, Tk, H, Hkv, Dh, scale, softcap, window, dtype, q_pos, k_pos, q_seg, k_seg */

Test(attention, causal) {
    att_case tc = {"causal B=2 T=37", {2, 37, 37, 2, 2, 8, 0.35355339f, 0, 0, MT_F32, NULL, NULL, NULL, NULL}, 1.0};
    run_case(&tc);
}

Test(attention, gqa_two_key_blocks) {
    /* H = 4 query heads on Hkv = 2; T = 70 is one full block of 64 plus 6 rows */
    att_case tc = {"GQA H=4 Hkv=2 T=70", {1, 70, 70, 4, 2, 8, 0.35355339f, 0, 0, MT_F32, NULL, NULL, NULL, NULL},
                   1.0};
    run_case(&tc);
}

Test(attention, mqa) {
    att_case tc = {"MQA H=4 Hkv=1", {2, 20, 20, 4, 1, 8, 0.35355339f, 0, 0, MT_F32, NULL, NULL, NULL, NULL}, 1.0};
    run_case(&tc);
}

Test(attention, head_dim_256) {
    att_case tc = {"Dh=256 T=5", {1, 5, 5, 2, 1, 256, 0.0625f, 0, 0, MT_F32, NULL, NULL, NULL, NULL}, 1.0};
    run_case(&tc);
    /* two query blocks of 32 at this head_dim */
    att_case tc2 = {"Dh=256 T=36", {1, 36, 36, 2, 1, 256, 0.0625f, 0, 0, MT_F32, NULL, NULL, NULL, NULL}, 1.0};
    run_case(&tc2);
}

Test(attention, sliding_window) {
    /* window 40 < T = 150 (key blocks 64 + 64 + 22): blocks wholly outside the window are
     * skipped, blocks straddling its edge are masked element by element */
    att_case tc = {"window=40 T=150", {1, 150, 150, 2, 1, 8, 0.35355339f, 0, 40, MT_F32, NULL, NULL, NULL, NULL},
                   1.0};
    run_case(&tc);
}

Test(attention, softcap) {
    /* Gemma 2 style cap, made active: scores have std ~ 4 against a cap of 2 */
    att_case tc = {"softcap=2", {1, 30, 30, 2, 2, 16, 0.25f, 2.0f, 0, MT_F32, NULL, NULL, NULL, NULL}, 2.0};
    run_case(&tc);
    att_case tc2 = {"softcap=2 window=9 GQA",
                    {2, 25, 25, 4, 2, 8, 0.35355339f, 2.0f, 9, MT_F32, NULL, NULL, NULL, NULL}, 2.0};
    run_case(&tc2);
}

Test(attention, query_chunk_against_longer_keys) {
    /* a context-parallel chunk: 20 queries at positions 50..69 against keys 0..69 */
    int32_t qp[20], kp[70];
    for (int i = 0; i < 20; i++) qp[i] = 50 + i;
    for (int j = 0; j < 70; j++) kp[j] = j;
    att_case tc = {"q_pos 50..69, Tk=70", {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 0, MT_F32, qp, kp, NULL, NULL}, 1.0};
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
                   {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 30, MT_F32, qp, kp, NULL, NULL}, 1.0};
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
    determinism_case((mt_attn_args){1, 150, 150, 4, 1, 16, 0.25f, 0, 0, MT_F32, NULL, NULL, NULL, NULL});
    /* B * Hkv = 4: both thread counts run the per-kv-head schedule */
    determinism_case((mt_attn_args){2, 100, 100, 4, 2, 8, 0.35355339f, 3.0f, 50, MT_F32, NULL, NULL, NULL, NULL});
    /* packed documents: segment ids change mid-block, so pairs are skipped, full or mixed */
    int32_t seg[2 * 150];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 150; t++) seg[b * 150 + t] = b == 0 ? (t >= 40) + (t >= 41) + (t >= 120) : t / 70;
    determinism_case((mt_attn_args){1, 150, 150, 4, 1, 16, 0.25f, 0, 0, MT_F32, NULL, NULL, seg, seg});
    determinism_case((mt_attn_args){2, 150, 150, 4, 2, 8, 0.35355339f, 3.0f, 50, MT_F32, NULL, NULL, seg, seg});
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
                   {2, 150, 150, 4, 2, 8, 0.35355339f, 0, 0, MT_F32, NULL, NULL, seg, seg}, 1.0};
    run_case(&tc);
    /* with a sliding window and a soft-cap on top */
    att_case tc2 = {"documents window=20 softcap=2",
                    {2, 150, 150, 2, 1, 8, 0.35355339f, 2.0f, 20, MT_F32, NULL, NULL, seg, seg}, 2.0};
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
                   {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 0, MT_F32, qp, kp, qs, ks}, 1.0};
    run_case(&tc);
}

/* ---- bf16 tensors (mt_attn_args.dtype = MT_BF16): bounds from att_bounds with ub ---- */

Test(attention_bf16, gqa_two_key_blocks) {
    att_case tc = {"bf16 GQA H=4 Hkv=2 T=70",
                   {1, 70, 70, 4, 2, 8, 0.35355339f, 0, 0, MT_BF16, NULL, NULL, NULL, NULL}, 1.0};
    run_case(&tc);
    att_case tc2 = {"bf16 Dh=256 T=36", {1, 36, 36, 2, 1, 256, 0.0625f, 0, 0, MT_BF16, NULL, NULL, NULL, NULL},
                    1.0};
    run_case(&tc2);
}

Test(attention_bf16, window_and_softcap) {
    att_case tc = {"bf16 window=40 T=150",
                   {1, 150, 150, 2, 1, 8, 0.35355339f, 0, 40, MT_BF16, NULL, NULL, NULL, NULL}, 1.0};
    run_case(&tc);
    att_case tc2 = {"bf16 softcap=2 window=9 GQA",
                    {2, 25, 25, 4, 2, 8, 0.35355339f, 2.0f, 9, MT_BF16, NULL, NULL, NULL, NULL}, 2.0};
    run_case(&tc2);
}

Test(attention_bf16, documents_and_chunks) {
    int32_t seg[2 * 150];
    const int s0[] = {0, 5, 6, 64, 100}, s1[] = {30};
    seg_from_starts(seg, 150, s0, 5);
    seg_from_starts(seg + 150, 150, s1, 1);
    att_case tc = {"bf16 documents window=20 softcap=2 GQA",
                   {2, 150, 150, 4, 2, 8, 0.35355339f, 2.0f, 20, MT_BF16, NULL, NULL, seg, seg}, 2.0};
    run_case(&tc);
    /* two query chunks against unsorted keys, with empty rows (positions 1, 2) */
    int32_t qp[20], kp[70];
    qp[0] = 1;
    qp[1] = 2;
    for (int i = 0; i < 8; i++) qp[2 + i] = 5 + i;
    for (int i = 0; i < 10; i++) qp[10 + i] = 60 + i;
    for (int j = 0; j < 70; j++) kp[j] = j < 35 ? 38 + j : 3 + j - 35;
    att_case tc2 = {"bf16 two chunks, unsorted keys, empty rows",
                    {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 30, MT_BF16, qp, kp, NULL, NULL}, 1.0};
    run_case(&tc2);
}

/* Where the bf16 path rounds (ops.h; kernels/cpu/attention.c), checked against the fp32
 * kernel on the same (bf16-valued) inputs. The bf16 code runs the fp32 code's loops in
 * the same order on widened values, so where it does not round inside, it is bitwise
 * the fp32 result rounded once:
 * - lse is bitwise the fp32 one: max and l = sum of the unrounded P stay fp32;
 * - out differs from the fp32 out rounded to bf16 in some element: P is rounded before
 *   P @ V (without that rounding the two would agree everywhere);
 * - given the bf16 out (widened) and the same lse, dv differs from the fp32 backward's
 *   dv rounded once in some element (P rounded before P^T dout), and so do dq and dk (dS
 *   rounded before dS k and dS^T q); without those roundings each would agree everywhere.
 *   (That the roundings are the contract's, and nothing else, is tu_att_rcase's check.)
 * - 1 and 2 threads give the same bits. */
static void bf16_rounding_points(mt_attn_args a) {
    tu_rng r = {77};
    const int64_t nq = a.B * a.Tq * a.H * a.Dh, nk = a.B * a.Tk * a.Hkv * a.Dh, nl = a.B * a.H * a.Tq;
    float *q = tu_falloc(nq), *k = tu_falloc(nk), *v = tu_falloc(nk), *dout = tu_falloc(nq);
    tu_fill_normal(&r, q, nq, 1.0);
    tu_fill_normal(&r, k, nk, 1.0);
    tu_fill_normal(&r, v, nk, 1.0);
    tu_fill_normal(&r, dout, nq, 1.0);
    tu_round_bf16(q, nq);
    tu_round_bf16(k, nk);
    tu_round_bf16(v, nk);
    tu_round_bf16(dout, nq);
    mt_backend *o = mt_cpu_backend();
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        out[t] = tu_falloc(nq), lse[t] = tu_falloc(nl), dq[t] = tu_falloc(nq), dk[t] = tu_falloc(nk);
        dv[t] = tu_falloc(nk);
        att_run_bf16(&a, out[t], lse[t], dq[t], dk[t], dv[t], dout, q, k, v);
    }
    cr_expect(tu_bitwise_equal(out[0], out[1], nq), "bf16 out: 1 vs 2 threads");
    cr_expect(tu_bitwise_equal(lse[0], lse[1], nl), "bf16 lse: 1 vs 2 threads");
    cr_expect(tu_bitwise_equal(dq[0], dq[1], nq), "bf16 dq: 1 vs 2 threads");
    cr_expect(tu_bitwise_equal(dk[0], dk[1], nk), "bf16 dk: 1 vs 2 threads");
    cr_expect(tu_bitwise_equal(dv[0], dv[1], nk), "bf16 dv: 1 vs 2 threads");

    mt_attn_args a32 = a;
    a32.dtype = MT_F32;
    float *o32 = tu_falloc(nq), *l32 = tu_falloc(nl), *dq32 = tu_falloc(nq), *dk32 = tu_falloc(nk);
    float *dv32 = tu_falloc(nk);
    TU_OK(o->ops->attention_fwd(o, &a32, o32, l32, q, k, v));
    cr_expect(tu_bitwise_equal(l32, lse[1], nl), "bf16 lse is the fp32 lse (l sums unrounded P)");
    int64_t differ = 0;
    for (int64_t i = 0; i < nq; i++) differ += mt_bf16_to_f32(mt_f32_to_bf16(o32[i])) != out[1][i];
    cr_expect(differ > 0, "bf16 out equals the rounded fp32 out everywhere: P was not rounded before P @ V");
    TU_OK(o->ops->attention_bwd(o, &a32, dq32, dk32, dv32, dout, q, k, v, out[1], lse[1]));
    tu_round_bf16(dq32, nq);
    tu_round_bf16(dk32, nk);
    tu_round_bf16(dv32, nk);
    int64_t dq_differ = 0, dk_differ = 0, dv_differ = 0;
    for (int64_t i = 0; i < nq; i++) dq_differ += dq32[i] != dq[1][i];
    for (int64_t i = 0; i < nk; i++) dk_differ += dk32[i] != dk[1][i], dv_differ += dv32[i] != dv[1][i];
    cr_expect(dv_differ > 0, "bf16 dv equals the rounded fp32 dv everywhere: P was not rounded before P^T dout");
    cr_expect(dq_differ > 0, "bf16 dq equals the rounded fp32 dq everywhere: dS was not rounded before dS k");
    cr_expect(dk_differ > 0, "bf16 dk equals the rounded fp32 dk everywhere: dS was not rounded before dS^T q");
    cr_log_info("bf16 backward vs fp32 rounded once: %lld of %lld dq, %lld / %lld dk, %lld / %lld dv differ",
                (long long)dq_differ, (long long)nq, (long long)dk_differ, (long long)nk, (long long)dv_differ,
                (long long)nk);
    for (int t = 0; t < 2; t++) free(out[t]), free(lse[t]), free(dq[t]), free(dk[t]), free(dv[t]);
    free(q), free(k), free(v), free(dout), free(o32), free(l32), free(dq32), free(dk32), free(dv32);
}

Test(attention_bf16, rounding_points_and_threads) {
    /* MQA B = 1: the fp32 backward runs by_kv on one thread and split on two, bf16 always
     * split; soft-cap, window and packed documents on the second */
    bf16_rounding_points((mt_attn_args){1, 150, 150, 4, 1, 16, 0.25f, 0, 0, MT_BF16, NULL, NULL, NULL, NULL});
    int32_t seg[2 * 150];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 150; t++) seg[b * 150 + t] = b == 0 ? (t >= 40) + (t >= 41) + (t >= 120) : t / 70;
    bf16_rounding_points((mt_attn_args){2, 150, 150, 4, 2, 8, 0.35355339f, 3.0f, 50, MT_BF16, NULL, NULL, seg, seg});
}

/* The constructed case of tests/test_ops_util.h (tu_att_rcase): dq, dk and dv within
 * their derived tolerances of the contract's values (P and dS rounded to bf16, dS from
 * the fp32 P), which a backward that kept P or dS in fp32, or formed dS from the rounded
 * P, misses by more than 16 tolerances in the cancelling entries. */
static void rcase_check(int64_t Dh) {
    tu_att_rcase c;
    cr_assert_eq(tu_att_rcase_make(&c, Dh), 0, "no qualifying draw for the constructed case");
    const mt_attn_args a = {1, 2, 2, 1, 1, Dh, c.scale, 0, 0, MT_BF16, c.q_pos, c.k_pos, NULL, NULL};
    const int64_t n = 2 * Dh;
    mt_bf16 *q = tu_bf16_copy(c.q, n), *k = tu_bf16_copy(c.k, n), *v = tu_bf16_copy(c.v, n);
    mt_bf16 *d = tu_bf16_copy(c.dout, n), *o = tu_bf16_copy(c.out, n);
    mt_bf16 *gq = calloc((size_t)n, 2), *gk = calloc((size_t)n, 2), *gv = calloc((size_t)n, 2);
    mt_backend *be = mt_cpu_backend();
    TU_OK(be->ops->attention_bwd(be, &a, gq, gk, gv, d, q, k, v, o, c.lse));
    float *fq = tu_falloc(n), *fk = tu_falloc(n), *fv = tu_falloc(n);
    tu_widen(fq, gq, n), tu_widen(fk, gk, n), tu_widen(fv, gv, n);
    const double wq = tu_bound_ratio(fq, c.dq, c.tq, n), wk = tu_bound_ratio(fk, c.dk, c.tk, n),
                 wv = tu_bound_ratio(fv, c.dv, c.tv, n);
    cr_expect(wq <= 1.0, "Dh %lld: dq %.3g x its tolerance from the contract (dq_0[2] %.9g, contract %.9g, dS "
              "unrounded %.9g, dS from rounded P %.9g)", (long long)Dh, wq, fq[c.cq], c.dq[c.cq], c.uq[c.cq],
              c.pq[c.cq]);
    cr_expect(wk <= 1.0, "Dh %lld: dk %.3g x its tolerance (dk_1[1] %.9g, contract %.9g, unrounded %.9g, from "
              "rounded P %.9g)", (long long)Dh, wk, fk[c.ck], c.dk[c.ck], c.uk[c.ck], c.pk[c.ck]);
    cr_expect(wv <= 1.0, "Dh %lld: dv %.3g x its tolerance (dv_1[3] %.9g, contract %.9g, P unrounded %.9g)",
              (long long)Dh, wv, fv[c.cv], c.dv[c.cv], c.uv[c.cv]);
    cr_log_info("Dh %lld: worst / tolerance dq %.3g dk %.3g dv %.3g; P unrounded would be %.3g (dv), dS unrounded "
                "%.3g (dq) %.3g (dk) tolerances off", (long long)Dh, wq, wk, wv,
                fabs(c.uv[c.cv] - c.dv[c.cv]) / c.tv[c.cv], fabs(c.uq[c.cq] - c.dq[c.cq]) / c.tq[c.cq],
                fabs(c.uk[c.ck] - c.dk[c.ck]) / c.tk[c.ck]);
    free(q), free(k), free(v), free(d), free(o), free(gq), free(gk), free(gv), free(fq), free(fk), free(fv);
    tu_att_rcase_free(&c);
}

Test(attention_bf16, backward_rounds_p_and_ds) {
    rcase_check(8);
    rcase_check(64);
}

Test(attention_bf16, bad_dtype) {
    mt_attn_args a = {1, 4, 4, 1, 1, 8, 0.35f, 0, 0, MT_F16, NULL, NULL, NULL, NULL};
    float x[32] = {0}, l[4];
    mt_backend *o = mt_cpu_backend();
    cr_expect_eq(o->ops->attention_fwd(o, &a, x, l, x, x, x), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "attention_fwd") && strstr(mt_last_error(), "dtype float16"), "%s",
              mt_last_error());
    cr_expect_eq(o->ops->attention_bwd(o, &a, x, x, x, x, x, x, x, x, l), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "attention_bwd") && strstr(mt_last_error(), "dtype float16"), "%s",
              mt_last_error());
}
