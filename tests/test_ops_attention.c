/* tests/test_ops_attention.c: the CPU backend's block-wise attention.
 *
 * The reference is textbook attention in fp64: for every query row it materialises the
 * whole row of scores over all keys, applies the soft-cap and the position mask, and
 * takes an exact softmax. The forward (out and lse) is compared with it; the backward
 * (dq, dk, dv) with central finite differences of L = sum(dout * out_ref) in fp64, so
 * the check does not go through the kernel's forward or its recomputation from lse.
 * Shapes are chosen to cross the kernel's block sizes (64 keys; 64 query rows, 32 at
 * head_dim 256) with ragged last blocks. MT_TEST_VERBOSE=1 prints the errors. */
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
                    if (d < 0 || (a->window > 0 && d >= a->window)) {
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

/* Tolerances, from the fp32 arithmetic of the kernel against exact fp64:
 * - out: a convex combination of v rows with probabilities from scores carrying a few u
 *   of relative rounding, then an fp32 weighted sum: ~u sqrt(Tk) of max|out|; measured
 *   <= 2.7e-7 for every case here;
 * - lse and the gradients inherit the absolute rounding of the scores: a Dh-term fp32
 *   dot product is off by ~sqrt(Dh) u |partial sums|, so their tolerances scale with
 *   sqrt(Dh / 16). lse: max + log(sum) on top, measured <= 9e-8 of max|lse| at Dh <= 16
 *   and 5.6e-7 at Dh = 256 (a single-key row, where lse is one raw score);
 * - gradients: P recomputed as exp(s - lse), dS = P (dP - D_i) where dP and D_i are two
 *   Dh-term dot products that cancel (exactly, for a row with one key), then
 *   dq = scale dS K and dk = dS^T q: measured <= 4.6e-7 of the largest entry at Dh <= 16
 *   and 3.4e-6 at Dh = 256. */
#define TOL_OUT 1e-6
#define TOL_LSE 3e-7
#define TOL_GRAD 1.5e-6

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
    const double dh_factor = a->Dh > 16 ? sqrt((double)a->Dh / 16.0) : 1.0;
    char what[96];
    snprintf(what, sizeof what, "%s: out", tc->name);
    EXPECT_ERR(what, tu_rel_err(out, oref, nq), TOL_OUT);
    /* lse: rows without an allowed key must be -inf in both; compare the rest. */
    int64_t nfin = 0;
    double lerr = 0.0, lmax = 0.0;
    for (int64_t i = 0; i < nl; i++) {
        if (lref[i] == -INFINITY) {
            cr_expect(lse[i] == -INFINITY, "%s: lse[%ld] should be -inf", tc->name, (long)i);
            continue;
        }
        nfin++;
        lerr = fmax(lerr, fabs((double)lse[i] - lref[i]));
        lmax = fmax(lmax, fabs(lref[i]));
    }
    snprintf(what, sizeof what, "%s: lse", tc->name);
    if (nfin) EXPECT_ERR(what, lmax > 0 ? lerr / lmax : lerr, TOL_LSE * dh_factor);

    const int64_t nmax = nq > nk ? nq : nk;
    double *fd = tu_dalloc(nmax);
    int64_t *idx = calloc((size_t)nmax, sizeof(int64_t));
    int64_t m = tu_fd_grad(att_loss, &c, c.q, nq, fd, idx, tc->fd_samples, &r);
    snprintf(what, sizeof what, "%s: dq vs fd", tc->name);
    EXPECT_ERR(what, tu_grad_err(dq, fd, idx, m), TOL_GRAD * dh_factor);
    m = tu_fd_grad(att_loss, &c, c.k, nk, fd, idx, tc->fd_samples, &r);
    snprintf(what, sizeof what, "%s: dk vs fd", tc->name);
    EXPECT_ERR(what, tu_grad_err(dk, fd, idx, m), TOL_GRAD * dh_factor);
    m = tu_fd_grad(att_loss, &c, c.v, nk, fd, idx, tc->fd_samples, &r);
    snprintf(what, sizeof what, "%s: dv vs fd", tc->name);
    EXPECT_ERR(what, tu_grad_err(dv, fd, idx, m), TOL_GRAD * dh_factor);

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

/* mt_attn_args fields: B, Tq, Tk, H, Hkv, Dh, scale, softcap, window, q_pos, k_pos */

Test(attention, causal) {
    att_case tc = {"causal B=2 T=37", {2, 37, 37, 2, 2, 8, 0.35355339f, 0, 0, NULL, NULL}, 1.0, 0};
    run_case(&tc);
}

Test(attention, gqa_two_key_blocks) {
    /* H = 4 query heads on Hkv = 2; T = 70 is one full block of 64 plus 6 rows */
    att_case tc = {"GQA H=4 Hkv=2 T=70", {1, 70, 70, 4, 2, 8, 0.35355339f, 0, 0, NULL, NULL},
                   1.0, 150};
    run_case(&tc);
}

Test(attention, mqa) {
    att_case tc = {"MQA H=4 Hkv=1", {2, 20, 20, 4, 1, 8, 0.35355339f, 0, 0, NULL, NULL}, 1.0, 0};
    run_case(&tc);
}

Test(attention, head_dim_256) {
    att_case tc = {"Dh=256 T=5", {1, 5, 5, 2, 1, 256, 0.0625f, 0, 0, NULL, NULL}, 1.0, 0};
    run_case(&tc);
    /* two query blocks of 32 at this head_dim */
    att_case tc2 = {"Dh=256 T=36", {1, 36, 36, 2, 1, 256, 0.0625f, 0, 0, NULL, NULL}, 1.0, 40};
    run_case(&tc2);
}

Test(attention, sliding_window) {
    /* window 40 < T = 150 (key blocks 64 + 64 + 22): blocks wholly outside the window are
     * skipped, blocks straddling its edge are masked element by element */
    att_case tc = {"window=40 T=150", {1, 150, 150, 2, 1, 8, 0.35355339f, 0, 40, NULL, NULL},
                   1.0, 120};
    run_case(&tc);
}

Test(attention, softcap) {
    /* Gemma 2 style cap, made active: scores have std ~ 4 against a cap of 2 */
    att_case tc = {"softcap=2", {1, 30, 30, 2, 2, 16, 0.25f, 2.0f, 0, NULL, NULL}, 2.0, 0};
    run_case(&tc);
    att_case tc2 = {"softcap=2 window=9 GQA",
                    {2, 25, 25, 4, 2, 8, 0.35355339f, 2.0f, 9, NULL, NULL}, 2.0, 0};
    run_case(&tc2);
}

Test(attention, query_chunk_against_longer_keys) {
    /* a context-parallel chunk: 20 queries at positions 50..69 against keys 0..69 */
    int32_t qp[20], kp[70];
    for (int i = 0; i < 20; i++) qp[i] = 50 + i;
    for (int j = 0; j < 70; j++) kp[j] = j;
    att_case tc = {"q_pos 50..69, Tk=70", {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 0, qp, kp}, 1.0,
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
                   {1, 20, 70, 2, 1, 8, 0.35355339f, 0, 30, qp, kp}, 1.0, 0};
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
    determinism_case((mt_attn_args){1, 150, 150, 4, 1, 16, 0.25f, 0, 0, NULL, NULL});
    /* B * Hkv = 4: both thread counts run the per-kv-head schedule */
    determinism_case((mt_attn_args){2, 100, 100, 4, 2, 8, 0.35355339f, 3.0f, 50, NULL, NULL});
}
