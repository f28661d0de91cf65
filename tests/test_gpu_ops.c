/* tests/test_gpu_ops.c: the CUDA backend against the CPU backend, op by op (ggml's
 * test-backend-ops shape), then a whole tiny model's gradients on both backends and a
 * bitwise determinism check of two CUDA training steps.
 *
 * Exits 77 (ctest: skipped) when no CUDA backend can be created: a build without CUDA, or no
 * visible device. Every bound below compares two fp32 implementations of the same
 * math, so it is the sum of both sides' rounding: u = 2^-24 is fp32's unit roundoff,
 * and a sum of K products carries at most about K u sum|terms| (Higham, "Accuracy and
 * Stability of Numerical Algorithms", 3.1); where both sides use the same order and
 * no fused multiply-add, the bound is bitwise equality.
 * UNVERIFIED: written on a machine without a GPU; it has compiled but never run with a
 * device. bench/gpu_check.sh runs it on an H200. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "tests/test_ops_util.h"


static mt_backend *G; /* CUDA */
static mt_backend *C; /* CPU */

static void setup(void) {
    if (mt_backend_create(MT_BACKEND_CUDA, &G) != MT_OK) G = NULL;
    C = mt_cpu_backend();
    cr_assert(G != NULL);
}

/* Device copy of host data (n elements of `size` bytes). */
static void *up(const void *h, int64_t n, size_t size) {
    void *d = tu_balloc(G, (size_t)n * size);
    cr_assert(d != NULL, "cuda alloc: %s", mt_last_error());
    TU_OK(G->ops->copy_to_device(G, d, h, (size_t)n * size));
    return d;
}

static float *down(const void *d, int64_t n) {
    float *h = tu_falloc(n);
    TU_OK(G->ops->copy_to_host(G, h, d, (size_t)n * sizeof(float)));
    return h;
}

static float *randv(tu_rng *r, int64_t n, double std) {
    float *x = tu_falloc(n);
    tu_fill_normal(r, x, n, std);
    return x;
}

static float *dupf(const float *x, int64_t n) {
    float *y = tu_falloc(n);
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

/* |got - want| <= tol[i] for every i, reporting the worst element. */
static void expect_close(const char *what, const float *got, const float *want, const double *tol, int64_t n) {
    int64_t worst = -1;
    double wr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (got[i] == want[i]) continue; /* also equal infinities */
        const double e = fabs((double)got[i] - (double)want[i]);
        const double r = e / (tol[i] > 0 ? tol[i] : 1e-300);
        if (!(e <= tol[i]) && (worst < 0 || r > wr || isnan(e))) {
            worst = i;
            wr = r;
        }
    }
    cr_expect(worst < 0, "%s: element %lld cuda %.9g cpu %.9g (bound %.3g, %.3g x over)", what, (long long)worst,
              worst >= 0 ? got[worst] : 0.0, worst >= 0 ? want[worst] : 0.0, worst >= 0 ? tol[worst] : 0.0, wr);
}

static void expect_bitwise(const char *what, const float *got, const float *want, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            cr_expect(0, "%s: element %lld cuda %.9g cpu %.9g (bitwise expected)", what, (long long)i, got[i],
                      want[i]);
            return;
        }
}

static double *tolv(int64_t n) { return tu_dalloc(n); }

/* ---------------------------------------------------------------------------- */

Test(gpu_ops, gemm, .init = setup) {
    /* Bound: each side's sum of K products errs by at most (K + 2) u sum_k |a b| (plus
     * the alpha/beta roundings), so they differ by at most twice that. Padded strides
     * and all four transpose combinations exercise the row/column-major mapping; an odd
     * offset into A checks the alignment-aware algorithm choice. */
    tu_rng r = {1};
    const int64_t M = 67, N = 45, K = 129, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            const int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
            float *A = randv(&r, ar * lda + 1, 1.0), *B = randv(&r, br * ldb, 1.0), *C0 = randv(&r, M * ldc, 1.0);
            const float alpha = 0.7f, beta = ta ? 0.0f : 0.3f;
            float *Cc = dupf(C0, M * ldc);
            TU_OK(C->ops->gemm(C, ta, tb, M, N, K, alpha, A + 1, lda, B, ldb, beta, Cc, ldc));
            float *dA = up(A, ar * lda + 1, 4), *dB = up(B, br * ldb, 4), *dC = up(C0, M * ldc, 4);
            TU_OK(G->ops->gemm(G, ta, tb, M, N, K, alpha, dA + 1, lda, dB, ldb, beta, dC, ldc));
            float *Cg = down(dC, M * ldc);
            double *tol = tolv(M * ldc);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double s = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        const double a = (A + 1)[ta ? k * lda + i : i * lda + k];
                        const double b = B[tb ? j * ldb + k : k * ldb + j];
                        s += fabs(a * b);
                    }
                    tol[i * ldc + j] = 2.0 * (K + 2) * U32 * (fabs(alpha) * s + fabs(beta * C0[i * ldc + j]));
                }
            char what[64];
            snprintf(what, sizeof what, "gemm ta=%d tb=%d", ta, tb);
            expect_close(what, Cg, Cc, tol, M * ldc); /* padding columns: bound 0, untouched */
            G->ops->release(G, dA);
            G->ops->release(G, dB);
            G->ops->release(G, dC);
            free(A), free(B), free(C0), free(Cc), free(Cg), free(tol);
        }
}

Test(gpu_ops, embedding, .init = setup) {
    /* Bitwise: the forward is one multiply per element; the backward adds
     * scale * dout rows in increasing n with separate multiply and add roundings on both
     * sides (the CUDA kernel uses __fmul_rn/__fadd_rn, gcc -std=c11 does not contract). */
    tu_rng r = {2};
    const int64_t V = 50, D = 300, N = 97;
    int32_t tok[97];
    for (int64_t n = 0; n < N; n++) tok[n] = (int32_t)tu_below(&r, 12); /* many repeats */
    tok[5] = (int32_t)(V - 1);
    float *table = randv(&r, V * D, 1.0), *dout = randv(&r, N * D, 1.0), *dt0 = randv(&r, V * D, 1.0);
    const float scale = 3.7f;
    float *oc = tu_falloc(N * D), *dtc = dupf(dt0, V * D);
    TU_OK(C->ops->embedding_fwd(C, oc, table, tok, N, D, scale));
    TU_OK(C->ops->embedding_bwd(C, dtc, dout, tok, N, V, D, scale));
    float *dtab = up(table, V * D, 4), *ddout = up(dout, N * D, 4), *ddt = up(dt0, V * D, 4), *dout_g = tu_balloc(G, N * D * 4);
    int32_t *dtok = up(tok, N, 4);
    TU_OK(G->ops->embedding_fwd(G, dout_g, dtab, dtok, N, D, scale));
    TU_OK(G->ops->embedding_bwd(G, ddt, ddout, dtok, N, V, D, scale));
    float *og = down(dout_g, N * D), *dtg = down(ddt, V * D);
    expect_bitwise("embedding_fwd", og, oc, N * D);
    expect_bitwise("embedding_bwd", dtg, dtc, V * D);
    G->ops->release(G, dtab), G->ops->release(G, ddout), G->ops->release(G, ddt), G->ops->release(G, dout_g), G->ops->release(G, dtok);
    free(table), free(dout), free(dt0), free(oc), free(dtc), free(og), free(dtg);
}

Test(gpu_ops, rmsnorm, .init = setup) {
    tu_rng r = {3};
    const int64_t N = 300, D = 333; /* N > 256: two dw partial chunks on the GPU */
    for (int gem = 0; gem < 2; gem++) {
        const float off = gem ? 1.0f : 0.0f, eps = 1e-6f;
        float *x = randv(&r, N * D, 2.0), *w = randv(&r, D, 0.3), *dy = randv(&r, N * D, 1.0);
        float *dx0 = randv(&r, N * D, 1.0), *dw0 = randv(&r, D, 1.0);
        float *yc = tu_falloc(N * D), *rc = tu_falloc(N), *dxc = dupf(dx0, N * D), *dwc = dupf(dw0, D);
        TU_OK(C->ops->rmsnorm_fwd(C, yc, rc, x, w, N, D, eps, off));
        TU_OK(C->ops->rmsnorm_bwd(C, dxc, dwc, dy, x, w, rc, N, D, off));
        float *dxg_ = up(x, N * D, 4), *dw_ = up(w, D, 4), *ddy = up(dy, N * D, 4), *ddx = up(dx0, N * D, 4),
              *ddw = up(dw0, D, 4), *dyo = tu_balloc(G, N * D * 4), *dr = tu_balloc(G, N * 4);
        TU_OK(G->ops->rmsnorm_fwd(G, dyo, dr, dxg_, dw_, N, D, eps, off));
        /* the backward is fed the CPU's rstd so its bound does not carry the forward's */
        TU_OK(G->ops->copy_to_device(G, dr, rc, (size_t)N * 4));
        TU_OK(G->ops->rmsnorm_bwd(G, ddx, ddw, ddy, dxg_, dw_, dr, N, D, off));
        float *yg = down(dyo, N * D), *dxg = down(ddx, N * D), *dwg = down(ddw, D);
        TU_OK(G->ops->rmsnorm_fwd(G, dyo, dr, dxg_, dw_, N, D, eps, off));
        float *rg = down(dr, N);
        /* rstd: both round 1/sqrt of fp64 sums that differ only in order (relative
         * ~D 2^-53), so they differ by at most 1 ulp: bound 2u |r|. y = (x r) w': two
         * more roundings and r's ulp: bound 4u |y|. */
        double *tr = tolv(N), *ty = tolv(N * D), *tdx = tolv(N * D), *tdw = tolv(D);
        for (int64_t n = 0; n < N; n++) tr[n] = 2 * U32 * fabs(rc[n]);
        for (int64_t i = 0; i < N * D; i++) ty[i] = 4 * U32 * fabs(yc[i]);
        /* dx += r g - x k: k agrees to ~1 ulp (fp64 sums), the three terms may cancel and
         * the GPU may fuse: bound 4u (|dx0| + |r g| + |x k|) with k taken from the CPU
         * formula. dw: fp32 sums over groups of 32 rows on both sides: bound
         * 2 (32 + 2) u sum_n |dy x r| + 2u |dw|. */
        for (int64_t n = 0; n < N; n++) {
            double c = 0.0;
            for (int64_t d = 0; d < D; d++) c += (double)dy[n * D + d] * (off + w[d]) * x[n * D + d];
            const double k = (double)rc[n] * rc[n] * rc[n] * c / D;
            for (int64_t d = 0; d < D; d++) {
                const int64_t i = n * D + d;
                tdx[i] = 4 * U32 * (fabs(dx0[i]) + fabs(rc[n] * dy[i] * (off + w[d])) + fabs(x[i] * k));
            }
        }
        for (int64_t d = 0; d < D; d++) {
            double s = 0.0;
            for (int64_t n = 0; n < N; n++) s += fabs((double)dy[n * D + d] * x[n * D + d] * rc[n]);
            tdw[d] = 2 * 34 * U32 * s + 2 * U32 * fabs(dwc[d]);
        }
        expect_close("rmsnorm rstd", rg, rc, tr, N);
        expect_close("rmsnorm y", yg, yc, ty, N * D);
        expect_close("rmsnorm dx", dxg, dxc, tdx, N * D);
        expect_close("rmsnorm dw", dwg, dwc, tdw, D);
        G->ops->release(G, dxg_), G->ops->release(G, dw_), G->ops->release(G, ddy), G->ops->release(G, ddx), G->ops->release(G, ddw), G->ops->release(G, dyo),
            G->ops->release(G, dr);
        free(x), free(w), free(dy), free(dx0), free(dw0), free(yc), free(rc), free(dxc), free(dwc), free(yg),
            free(dxg), free(dwg), free(rg), free(tr), free(ty), free(tdx), free(tdw);
    }
}

Test(gpu_ops, rope, .init = setup) {
    /* CUDA's cosf/sinf err by at most 2 ulp (CUDA C Programming Guide, math functions),
     * glibc's by 1: the rotated pair a c - b s carries at most ~6u (|a| + |b|) after the
     * products and the (possibly fused) difference. The angle pos * inv_freq is one
     * fp32 multiply on both sides. Positions reach 8191 (large angles). */
    tu_rng r = {4};
    const int64_t N = 40, H = 3, Dh = 64;
    int32_t pos[40];
    for (int64_t n = 0; n < N; n++) pos[n] = (int32_t)tu_below(&r, 8192);
    float inv[32];
    for (int i = 0; i < 32; i++) inv[i] = (float)pow(500000.0, -2.0 * i / (double)Dh);
    float *x = randv(&r, N * H * Dh, 1.0);
    for (int bwd = 0; bwd < 2; bwd++) {
        float *xc = dupf(x, N * H * Dh);
        TU_OK((bwd ? C->ops->rope_bwd : C->ops->rope_fwd)(C, xc, pos, inv, N, H, Dh));
        float *dx = up(x, N * H * Dh, 4), *dinv = up(inv, 32, 4);
        int32_t *dpos = up(pos, N, 4);
        TU_OK((bwd ? G->ops->rope_bwd : G->ops->rope_fwd)(G, dx, dpos, dinv, N, H, Dh));
        float *xg = down(dx, N * H * Dh);
        double *t = tolv(N * H * Dh);
        for (int64_t row = 0; row < N * H; row++)
            for (int64_t i = 0; i < Dh / 2; i++) {
                const double s = fabs(x[row * Dh + i]) + fabs(x[row * Dh + i + Dh / 2]);
                t[row * Dh + i] = t[row * Dh + i + Dh / 2] = 6 * U32 * s;
            }
        expect_close(bwd ? "rope_bwd" : "rope_fwd", xg, xc, t, N * H * Dh);
        G->ops->release(G, dx), G->ops->release(G, dinv), G->ops->release(G, dpos);
        free(xc), free(xg), free(t);
    }
    free(x);
}

Test(gpu_ops, glu, .init = setup) {
    /* act(g) from expf/tanhf: CUDA's are within 2 ulp (tanhf 2), the CPU's vmath.h
     * polynomials within a few ulp; gelu's 1 + tanh cancels for g << 0, so the bound is
     * relative to the terms' size: 32u (|g| + 1) |up| for h and dup, and
     * 32u (|g| + 1)(1 + g^2) |dh up| for dgate (the derivative's terms). */
    tu_rng r = {5};
    const int64_t n = 5000;
    float *g = randv(&r, n, 3.0), *u = randv(&r, n, 1.0), *dh = randv(&r, n, 1.0);
    for (int act = 0; act < 2; act++) {
        float *hc = tu_falloc(n), *dgc = tu_falloc(n), *duc = tu_falloc(n);
        TU_OK(C->ops->glu_fwd(C, hc, g, u, n, (mt_activation)act));
        TU_OK(C->ops->glu_bwd(C, dgc, duc, dh, g, u, n, (mt_activation)act));
        float *dg_ = up(g, n, 4), *du_ = up(u, n, 4), *ddh = up(dh, n, 4), *dh_o = tu_balloc(G, n * 4),
              *ddg = tu_balloc(G, n * 4), *ddu = tu_balloc(G, n * 4);
        TU_OK(G->ops->glu_fwd(G, dh_o, dg_, du_, n, (mt_activation)act));
        TU_OK(G->ops->glu_bwd(G, ddg, ddu, ddh, dg_, du_, n, (mt_activation)act));
        float *hg = down(dh_o, n), *dgg = down(ddg, n), *dug = down(ddu, n);
        double *th = tolv(n), *tdg = tolv(n), *tdu = tolv(n);
        for (int64_t i = 0; i < n; i++) {
            const double a = fabs(g[i]) + 1.0;
            th[i] = 32 * U32 * a * fabs(u[i]);
            tdu[i] = 32 * U32 * a * fabs(dh[i]);
            tdg[i] = 32 * U32 * a * (1.0 + (double)g[i] * g[i]) * fabs(dh[i] * u[i]);
        }
        expect_close(act ? "geglu h" : "swiglu h", hg, hc, th, n);
        expect_close(act ? "geglu dgate" : "swiglu dgate", dgg, dgc, tdg, n);
        expect_close(act ? "geglu dup" : "swiglu dup", dug, duc, tdu, n);
        G->ops->release(G, dg_), G->ops->release(G, du_), G->ops->release(G, ddh), G->ops->release(G, dh_o), G->ops->release(G, ddg), G->ops->release(G, ddu);
        free(hc), free(dgc), free(duc), free(hg), free(dgg), free(dug), free(th), free(tdg), free(tdu);
    }
    free(g), free(u), free(dh);
}

Test(gpu_ops, xent_tile, .init = setup) {
    /* Per row the loss is mx + log(sum exp) - z_label with the sum in fp64 of fp32
     * exps (each within 2 ulp on both sides) and, with the soft-cap, z = cap tanh(x/cap)
     * within ~3 ulp of |z| <= cap: the loss differs by at most ~ (2 + 3 cap) 2u per row,
     * so the sum is held to R (4 + 6 cap) u + 1e-12 relative. Gradients dscale p dz:
     * p = exp(z - mx) / sum inherits z's error times 2 (z and mx) plus 4 ulp, the
     * label entry p - 1 an absolute 4u: bound |dscale| (8u (1 + 3 cap)(|p| + [label]))
     * with p from the CPU. V = 1000 exceeds the 512 threads of a row block. */
    tu_rng r = {6};
    const int64_t R = 23, V = 1000;
    int32_t lab[23];
    for (int64_t i = 0; i < R; i++) lab[i] = (int32_t)tu_below(&r, V);
    lab[3] = -1;
    lab[17] = -1;
    for (int capped = 0; capped < 2; capped++) {
        const float cap = capped ? 30.0f : 0.0f, dscale = 0.125f;
        float *x = randv(&r, R * V, 4.0);
        float *xc = dupf(x, R * V);
        double lc = 0.5, lg = 0.5;
        int64_t cc = 2, cg = 2;
        TU_OK(C->ops->xent_tile(C, xc, lab, R, V, cap, -1, dscale, &lc, &cc));
        float *dx = up(x, R * V, 4);
        int32_t *dl = up(lab, R, 4);
        TU_OK(G->ops->xent_tile(G, dx, dl, R, V, cap, -1, dscale, &lg, &cg));
        float *xg = down(dx, R * V);
        cr_expect_eq(cg, cc, "xent count %lld vs %lld", (long long)cg, (long long)cc);
        const double capf = capped ? 3.0 * cap : 0.0;
        cr_expect(fabs(lg - lc) <= R * (4 + 2 * capf) * U32 + 1e-12 * fabs(lc), "xent loss %.12g vs %.12g", lg, lc);
        double *t = tolv(R * V);
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < V; j++) {
                /* |g / dscale| + 1 bounds p at the label, where g / dscale = (p - 1) dz */
                const double p = fabs(xc[i * V + j] / dscale) + (j == lab[i] ? 1.0 : 0.0);
                t[i * V + j] = lab[i] == -1 ? 0.0 : fabs(dscale) * 8 * U32 * (1 + capf) * p;
            }
        expect_close(capped ? "xent dlogits (capped)" : "xent dlogits", xg, xc, t, R * V);
        G->ops->release(G, dx), G->ops->release(G, dl);
        free(x), free(xc), free(xg), free(t);
    }
}

Test(gpu_ops, elementwise, .init = setup) {
    tu_rng r = {7};
    const int64_t n = 100003;
    float *x = randv(&r, n, 1.0), *y = randv(&r, n, 1.0);
    float *yc = dupf(y, n), *xc = dupf(x, n);
    TU_OK(C->ops->axpy(C, yc, x, -0.37f, n));
    TU_OK(C->ops->scale(C, xc, 1.7f, n));
    const double sc = tu_sumsq(C, x, n);
    float *dx = up(x, n, 4), *dy = up(y, n, 4);
    TU_OK(G->ops->axpy(G, dy, dx, -0.37f, n));
    const double sg = tu_sumsq(G, dx, n);
    TU_OK(G->ops->scale(G, dx, 1.7f, n));
    float *yg = down(dy, n), *xg = down(dx, n);
    /* axpy: the GPU may fuse y + a x into one rounding, the CPU rounds twice: bound
     * u (|a x| + |y + a x|) + u |a x|. scale: one multiply on both sides, bitwise.
     * sumsq: two fp64 sums of the same n squares in different orders: bound
     * 2 n 2^-53 sum (relative), well under 1e-10 for n = 1e5. */
    double *t = tolv(n);
    for (int64_t i = 0; i < n; i++) t[i] = 2 * U32 * (fabs(0.37 * x[i]) + fabs(yc[i]));
    expect_close("axpy", yg, yc, t, n);
    expect_bitwise("scale", xg, xc, n);
    cr_expect(fabs(sg - sc) <= 2.0 * n * 0x1.0p-53 * sc, "sumsq %.17g vs %.17g", sg, sc);
    G->ops->release(G, dx), G->ops->release(G, dy);
    free(x), free(y), free(yc), free(xc), free(yg), free(xg), free(t);
}

/* attn_merge (the ring-attention merge that left models/model.c): CUDA's fp64 exp/log
 * may differ from glibc's in the last bit, which the fp32 weights round away except
 * near a tie: bound 5 u max(|o_a|, |o_b|) per element (the CPU test's analysis), and
 * rows with lse_b = -inf bitwise unchanged on both sides. */
Test(gpu_ops, attn_merge, .init = setup) {
    tu_rng r = {11};
    const int64_t B = 2, T = 33, H = 4, Dh = 64, rows = B * H * T, n = B * T * H * Dh;
    float *o = randv(&r, n, 1.0), *ob = randv(&r, n, 1.0), *l = randv(&r, rows, 4.0), *lb = randv(&r, rows, 4.0);
    lb[5] = -INFINITY;
    l[9] = -INFINITY;
    float *oc = dupf(o, n), *lc = dupf(l, rows);
    TU_OK(C->ops->attn_merge(C, oc, lc, ob, lb, B, T, H, Dh));
    float *dox = up(o, n, 4), *dob = up(ob, n, 4), *dl = up(l, rows, 4), *dlb = up(lb, rows, 4);
    TU_OK(G->ops->attn_merge(G, dox, dl, dob, dlb, B, T, H, Dh));
    float *og = down(dox, n), *lg = down(dl, rows);
    double *t = tolv(n), *tl = tolv(rows);
    for (int64_t i = 0; i < n; i++) t[i] = 5 * U32 * fmax(fabs(o[i]), fabs(ob[i]));
    for (int64_t i = 0; i < rows; i++) tl[i] = 2 * U32 * fabs(lc[i]);
    expect_close("attn_merge out", og, oc, t, n);
    expect_close("attn_merge lse", lg, lc, tl, rows);
    cr_expect(memcmp(&lg[5], &l[5], sizeof(float)) == 0, "row with lse_b = -inf changed");
    G->ops->release(G, dox), G->ops->release(G, dob), G->ops->release(G, dl), G->ops->release(G, dlb);
    free(o), free(ob), free(l), free(lb), free(oc), free(lc), free(og), free(lg), free(t), free(tl);
}

/* grad_accumulate / to_f32 (zero1.c's loops): one fp32 add (__fadd_rn, no contraction)
 * and the same round-to-nearest-even bit operation on both sides: bitwise. */
Test(gpu_ops, grad_accumulate_to_f32, .init = setup) {
    tu_rng r = {12};
    const int64_t n = 100003;
    float *x = randv(&r, n, 1.0), *y = randv(&r, n, 1e-3);
    for (int dt = 0; dt < 2; dt++) {
        const mt_dtype t = dt ? MT_BF16 : MT_F32;
        const size_t es = dt ? 2 : 4;
        void *hc = calloc((size_t)n, es);
        TU_OK(C->ops->grad_accumulate(C, hc, t, x, n, 1));
        TU_OK(C->ops->grad_accumulate(C, hc, t, y, n, 0));
        float *wc = tu_falloc(n);
        TU_OK(C->ops->to_f32(C, wc, hc, t, n));
        float *dx = up(x, n, 4), *dy = up(y, n, 4), *dw = up(wc, n, 4);
        void *da = tu_balloc(G, (size_t)n * es);
        TU_OK(G->ops->grad_accumulate(G, da, t, dx, n, 1));
        TU_OK(G->ops->grad_accumulate(G, da, t, dy, n, 0));
        TU_OK(G->ops->to_f32(G, dw, da, t, n));
        void *hg = malloc((size_t)n * es);
        TU_OK(G->ops->copy_to_host(G, hg, da, (size_t)n * es));
        float *wg = down(dw, n);
        cr_expect(memcmp(hg, hc, (size_t)n * es) == 0, "grad_accumulate %s not bitwise", mt_dtype_name(t));
        expect_bitwise(dt ? "to_f32 bf16" : "to_f32 f32", wg, wc, n);
        G->ops->release(G, dx), G->ops->release(G, dy), G->ops->release(G, dw), G->ops->release(G, da);
        free(hc), free(wc), free(hg), free(wg);
    }
    free(x), free(y);
}

/* A launch that CUDA refuses reaches the caller with the kernel's name (ops.h errors):
 * a grid-stride kernel with an absurd block size is not possible through the table, so
 * use a shape the attention kernels refuse (not sticky), then check the backend still
 * works, and that sync reports no error. */
Test(gpu_ops, errors_reach_the_caller, .init = setup) {
    mt_attn_args a = {1, 1, 1, 1, 1, 512, 1.0f, 0.0f, 0, NULL, NULL, NULL, NULL};
    float *d = tu_balloc(G, 4096);
    cr_expect_eq(G->ops->attention_fwd(G, &a, d, d, d, d, d), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "attention") != NULL, "%s", mt_last_error());
    TU_OK(G->ops->zero(G, d, 4096));
    TU_OK(G->ops->sync(G));
    G->ops->release(G, d);
}

Test(gpu_ops, adamw, .init = setup) {
    /* Same formula and operation order with IEEE division and sqrt on both sides (nvcc's
     * defaults -prec-div/-prec-sqrt); only fused multiply-adds differ, a few ulp per
     * step in m, v and p: after 3 steps bound 12u (|p| + lr (|upd| + wd |p|)) on p
     * with |upd| <= 1 / (1 - b1) bounding the Adam ratio, 12u |m| and 12u |v|. */
    tu_rng r = {8};
    const int64_t n = 4099;
    float *p = randv(&r, n, 1.0), *m = randv(&r, n, 0.01), *v = tu_falloc(n);
    for (int64_t i = 0; i < n; i++) v[i] = fabsf(m[i]) * 0.1f;
    float *pc = dupf(p, n), *mc = dupf(m, n), *vc = dupf(v, n);
    float *dp = up(p, n, 4), *dm = up(m, n, 4), *dv = up(v, n, 4);
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.8f;
    for (int64_t t = 1; t <= 3; t++) {
        float *g = randv(&r, n, 1.0);
        float *dg = up(g, n, 4);
        TU_OK(C->ops->adamw(C, pc, g, mc, vc, n, lr, b1, b2, eps, wd, gs, t));
        TU_OK(G->ops->adamw(G, dp, dg, dm, dv, n, lr, b1, b2, eps, wd, gs, t));
        G->ops->release(G, dg);
        free(g);
    }
    float *pg = down(dp, n), *mg = down(dm, n), *vg = down(dv, n);
    double *tp = tolv(n), *tm = tolv(n), *tv = tolv(n);
    for (int64_t i = 0; i < n; i++) {
        tp[i] = 12 * U32 * (fabs(pc[i]) + lr * (1.0 / (1 - b1) + wd * fabs(pc[i])));
        tm[i] = 12 * U32 * fabs(mc[i]);
        tv[i] = 12 * U32 * fabs(vc[i]);
    }
    expect_close("adamw p", pg, pc, tp, n);
    expect_close("adamw m", mg, mc, tm, n);
    expect_close("adamw v", vg, vc, tv, n);
    G->ops->release(G, dp), G->ops->release(G, dm), G->ops->release(G, dv);
    free(p), free(m), free(v), free(pc), free(mc), free(vc), free(pg), free(mg), free(vg), free(tp), free(tm), free(tv);
}

/* ---------------------------------------------------------------------------- */
/* attention: forward and backward on both backends, the same inputs */

typedef struct att_case {
    const char *name;
    int64_t B, Tq, Tk, H, Hkv, Dh;
    float softcap;
    int64_t window;
    int pos_mode; /* 0: NULL positions; 1: a context-parallel chunk pair; 2: some rows see no key */
    int seg_mode; /* 0: no segment ids; 1: packed documents (att_doc_id) */
} att_case;

/* Document id of position p in sequence b of the seg_mode = 1 cases: even rows have
 * documents of 11 tokens plus a one-token document at position 20 (boundaries inside
 * every tile); odd rows two documents split at 40, so whole (query tile, key tile)
 * pairs hold only different documents and the block vote must skip them. */
static int32_t att_doc_id(int64_t b, int64_t p) {
    if (b % 2) return p >= 40;
    return p == 20 ? 1000 : (int32_t)(p / 11);
}

static void run_attention(const att_case *c) {
    tu_rng r = {9};
    mt_attn_args a = {.B = c->B, .Tq = c->Tq, .Tk = c->Tk, .H = c->H, .Hkv = c->Hkv, .Dh = c->Dh,
                      .scale = (float)(1.0 / sqrt((double)c->Dh)), .softcap = c->softcap, .window = c->window};
    int32_t *qp = NULL, *kp = NULL;
    if (c->pos_mode) {
        qp = malloc((size_t)c->Tq * sizeof(int32_t));
        kp = malloc((size_t)c->Tk * sizeof(int32_t));
        for (int64_t j = 0; j < c->Tk; j++) kp[j] = (int32_t)(c->pos_mode == 2 ? j + 10 : j);
        for (int64_t i = 0; i < c->Tq; i++) /* two chunks: early rows, then late rows */
            qp[i] = (int32_t)(i < c->Tq / 2 ? i : c->Tk - c->Tq + i);
    }
    const int64_t nq = c->B * c->Tq * c->H * c->Dh, nk = c->B * c->Tk * c->Hkv * c->Dh, nl = c->B * c->H * c->Tq;
    float *q = randv(&r, nq, 1.0), *k = randv(&r, nk, 1.0), *v = randv(&r, nk, 1.0), *dout = randv(&r, nq, 1.0);
    float *oc = tu_falloc(nq), *lc = tu_falloc(nl), *dqc = tu_falloc(nq), *dkc = tu_falloc(nk), *dvc = tu_falloc(nk);
    a.q_pos = qp;
    a.k_pos = kp;
    int32_t *qs = NULL, *ks = NULL;
    if (c->seg_mode) { /* ids from each row's position, as the model derives them from the tokens */
        qs = malloc((size_t)(c->B * c->Tq) * sizeof(int32_t));
        ks = malloc((size_t)(c->B * c->Tk) * sizeof(int32_t));
        for (int64_t b = 0; b < c->B; b++) {
            for (int64_t i = 0; i < c->Tq; i++) qs[b * c->Tq + i] = att_doc_id(b, qp ? qp[i] : i);
            for (int64_t j = 0; j < c->Tk; j++) ks[b * c->Tk + j] = att_doc_id(b, kp ? kp[j] : j);
        }
        a.q_seg = qs;
        a.k_seg = ks;
    }
    TU_OK(C->ops->attention_fwd(C, &a, oc, lc, q, k, v));
    TU_OK(C->ops->attention_bwd(C, &a, dqc, dkc, dvc, dout, q, k, v, oc, lc));
    float *dq_ = up(q, nq, 4), *dk_ = up(k, nk, 4), *dv_ = up(v, nk, 4), *ddo = up(dout, nq, 4);
    float *go = tu_balloc(G, nq * 4), *gl = tu_balloc(G, nl * 4), *gdq = tu_balloc(G, nq * 4), *gdk = tu_balloc(G, nk * 4),
          *gdv = tu_balloc(G, nk * 4);
    mt_attn_args ga = a;
    ga.q_pos = qp ? up(qp, c->Tq, 4) : NULL;
    ga.k_pos = kp ? up(kp, c->Tk, 4) : NULL;
    ga.q_seg = qs ? up(qs, c->B * c->Tq, 4) : NULL;
    ga.k_seg = ks ? up(ks, c->B * c->Tk, 4) : NULL;
    TU_OK(G->ops->attention_fwd(G, &ga, go, gl, dq_, dk_, dv_));
    /* the backward gets the CPU's out and lse, so its bound does not carry the forward's */
    float *co = up(oc, nq, 4), *cl = up(lc, nl, 4);
    TU_OK(G->ops->attention_bwd(G, &ga, gdq, gdk, gdv, ddo, dq_, dk_, dv_, co, cl));
    float *og = down(go, nq), *lg = down(gl, nl), *dqg = down(gdq, nq), *dkg = down(gdk, nk), *dvg = down(gdv, nk);
    /* Bounds. A score is a Dh-term dot product of N(0,1) entries times 1/sqrt(Dh): each
     * side errs by at most Dh u sum|q k| scale <= Dh u |q| |k| scale, ~ Dh u for these
     * inputs (|q||k| ~ Dh); probabilities inherit that error relatively and out (a
     * convex combination of v rows) absolutely times max|v| ~ 4.5. lse is held to
     * 2 Dh u absolute. Gradients are sums over up to Tk (dq) or G Tq (dk, dv) such
     * terms of size ~|dout| |v|: bound 4 Dh u (1 + Tk) relative to the tensor's max.
     * Rows with no allowed key must be exactly out = 0, lse = -inf. */
    const double so = 2.0 * c->Dh * U32 * 6.0;
    double *t = tolv(nq > nk ? nq : nk);
    for (int64_t i = 0; i < nq; i++) t[i] = so;
    expect_close("attention out", og, oc, t, nq);
    for (int64_t i = 0; i < nl; i++) t[i] = isinf(lc[i]) ? 0.0 : 2.0 * c->Dh * U32 * (1.0 + fabs(lc[i]));
    expect_close("attention lse", lg, lc, t, nl); /* -inf rows: equal, bound 0 */
    const int64_t Tmax = c->Tk > c->Tq ? c->Tk : c->Tq;
    const double gb = 4.0 * c->Dh * U32 * (1.0 + (double)Tmax * (c->H / c->Hkv));
    float mx[3] = {0, 0, 0};
    for (int64_t i = 0; i < nq; i++) mx[0] = fmaxf(mx[0], fabsf(dqc[i]));
    for (int64_t i = 0; i < nk; i++) mx[1] = fmaxf(mx[1], fabsf(dkc[i])), mx[2] = fmaxf(mx[2], fabsf(dvc[i]));
    for (int64_t i = 0; i < nq; i++) t[i] = gb * mx[0];
    expect_close("attention dq", dqg, dqc, t, nq);
    for (int64_t i = 0; i < nk; i++) t[i] = gb * mx[1];
    expect_close("attention dk", dkg, dkc, t, nk);
    for (int64_t i = 0; i < nk; i++) t[i] = gb * mx[2];
    expect_close("attention dv", dvg, dvc, t, nk);
    G->ops->release(G, dq_), G->ops->release(G, dk_), G->ops->release(G, dv_), G->ops->release(G, ddo), G->ops->release(G, go), G->ops->release(G, gl),
        G->ops->release(G, gdq), G->ops->release(G, gdk), G->ops->release(G, gdv), G->ops->release(G, co), G->ops->release(G, cl);
    if (qp) G->ops->release(G, (void *)ga.q_pos), G->ops->release(G, (void *)ga.k_pos);
    if (qs) G->ops->release(G, (void *)ga.q_seg), G->ops->release(G, (void *)ga.k_seg);
    free(qs), free(ks), free(qp), free(kp), free(q), free(k), free(v), free(dout), free(oc), free(lc), free(dqc), free(dkc), free(dvc),
        free(og), free(lg), free(dqg), free(dkg), free(dvg), free(t);
}

Test(gpu_ops, attention_gqa_causal, .init = setup) {
    const att_case c = {"gqa", 2, 77, 77, 4, 2, 64, 0.0f, 0, 0, 0};
    run_attention(&c);
}

Test(gpu_ops, attention_hd256_window_softcap_mqa, .init = setup) {
    const att_case c = {"hd256", 1, 70, 70, 2, 1, 256, 20.0f, 16, 0, 0};
    run_attention(&c);
}

Test(gpu_ops, attention_positions_hd40, .init = setup) {
    const att_case c = {"cp", 2, 24, 50, 3, 3, 40, 0.0f, 0, 1, 0};
    run_attention(&c);
}

Test(gpu_ops, attention_empty_rows_hd128, .init = setup) {
    /* k positions start at 10: query rows at positions < 10 see no key (lse -inf, out 0) */
    const att_case c = {"empty", 1, 30, 33, 2, 1, 128, 0.0f, 5, 2, 0};
    run_attention(&c);
}

Test(gpu_ops, attention_documents_gqa, .init = setup) {
    /* packed documents (ops.h q_seg / k_seg): B = 2 covers both att_doc_id patterns */
    const att_case c = {"documents", 2, 77, 77, 4, 2, 64, 0.0f, 0, 0, 1};
    run_attention(&c);
}

Test(gpu_ops, attention_documents_cp_window_softcap, .init = setup) {
    /* documents on a context-parallel chunk pair (unsorted query positions), a window
     * and a soft-cap on top */
    const att_case c = {"documents cp", 2, 24, 50, 3, 3, 40, 20.0f, 30, 1, 1};
    run_attention(&c);
}

/* ---------------------------------------------------------------------------- */
/* whole model */

typedef struct gfix {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
} gfix;

static void gfix_init(gfix *f, const mt_model_config *c, mt_backend *be, int64_t B, int64_t T) {
    memset(f, 0, sizeof(*f));
    cr_assert_eq(mt_model_create(&f->m, c, be, B, T, 2), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_new(&f->plan), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(f->m, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_finalize(f->plan), MT_OK);
    cr_assert_eq(mt_backend_arena_create(be, &f->arena, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_bind(f->m, &f->arena, f->plan), MT_OK, "%s", mt_last_error());
}

static void gfix_free(gfix *f) {
    mt_arena_destroy(&f->arena);
    mt_plan_free(f->plan);
    mt_model_free(f->m);
}

/* Gemma 3 block with both soft-caps, sliding window and GQA: every optional path. */
static mt_model_config tiny_model(void) {
    mt_model_config c = tu_model_shape(MT_DECODER_GEMMA3, 61, 64, 4, 2, 32, 96, 2);
    c.sliding_window_size = 5;
    c.sliding_window_pattern = 2;
    c.attn_logits_soft_cap = 20.0f;
    c.final_logits_soft_cap = 30.0f;
    c.query_pre_attn_scalar = 32.0f;
    return c;
}

static void tiny_batch(int32_t *tok, int32_t *lab, int64_t n, int64_t V) {
    tu_rng r = {10};
    for (int64_t i = 0; i < n; i++) {
        tok[i] = (int32_t)tu_below(&r, V);
        lab[i] = i % 7 == 3 ? MT_IGNORE_LABEL : (int32_t)tu_below(&r, V);
    }
}

Test(gpu_model, gradients_match_cpu, .init = setup) {
    /* The same parameters (copied from the CPU model) and batch on both backends. The
     * loss is a sum of ~N fp64-accumulated row losses whose inputs passed through two
     * layers of fp32 ops each bounded above: relative 1e-5. Each parameter's gradient
     * is held to 1e-4 of its largest entry: the per-op bounds above are 1e-6 to 1e-5
     * relative, and two layers of backward chain about ten of them. */
    const mt_model_config c = tiny_model();
    const int64_t B = 2, T = 24;
    gfix fc, fg;
    gfix_init(&fc, &c, C, B, T);
    gfix_init(&fg, &c, G, B, T);
    cr_assert_eq(mt_model_init_params(fc.m, 11), MT_OK);
    const int64_t P = mt_model_numel(fc.m);
    TU_OK(G->ops->copy_to_device(G, mt_model_params(fg.m), mt_model_params(fc.m), (size_t)P * 4));
    TU_OK(C->ops->zero(C, mt_model_grads(fc.m), (size_t)P * 4));
    TU_OK(G->ops->zero(G, mt_model_grads(fg.m), (size_t)P * 4));
    int32_t tok[48], lab[48];
    tiny_batch(tok, lab, B * T, c.vocab_size);
    double lc = 0, lg = 0;
    int64_t cc = 0, cg = 0;
    cr_assert_eq(mt_model_forward_backward(fc.m, tok, lab, 1.0f / 40, &lc, &cc), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_forward_backward(fg.m, tok, lab, 1.0f / 40, &lg, &cg), MT_OK, "%s", mt_last_error());
    TU_OK(G->ops->sync(G));
    cr_expect_eq(cg, cc);
    cr_expect(fabs(lg - lc) <= 1e-5 * fabs(lc), "loss cuda %.12g cpu %.12g", lg, lc);
    float *gg = down(mt_model_grads(fg.m), P);
    const float *gc = mt_model_grads(fc.m);
    for (int i = 0; i < mt_model_param_count(fc.m); i++) {
        const mt_param_info *pi = mt_model_param(fc.m, i);
        double mx = 0.0, worst = 0.0;
        for (int64_t j = 0; j < pi->numel; j++) mx = fmax(mx, fabs(gc[pi->offset + j]));
        for (int64_t j = 0; j < pi->numel; j++) worst = fmax(worst, fabs((double)gg[pi->offset + j] - gc[pi->offset + j]));
        cr_expect(worst <= 1e-4 * mx + 1e-30, "grad %s: max diff %.3g, max |g| %.3g", pi->name, worst, mx);
    }
    free(gg);
    gfix_free(&fc);
    gfix_free(&fg);
}

/* Two training steps (forward/backward, global norm, AdamW) from the same start;
 * returns the parameters on the host. */
static float *two_steps(const mt_model_config *c, int64_t B, int64_t T) {
    gfix f;
    gfix_init(&f, c, G, B, T);
    cr_assert_eq(mt_model_init_params(f.m, 12), MT_OK);
    const int64_t P = mt_model_numel(f.m);
    float *mom = tu_balloc(G, (size_t)P * 4), *var = tu_balloc(G, (size_t)P * 4);
    TU_OK(G->ops->zero(G, mom, (size_t)P * 4));
    TU_OK(G->ops->zero(G, var, (size_t)P * 4));
    int32_t tok[48], lab[48];
    tiny_batch(tok, lab, B * T, c->vocab_size);
    for (int64_t step = 1; step <= 2; step++) {
        TU_OK(G->ops->zero(G, mt_model_grads(f.m), (size_t)P * 4));
        double l = 0;
        int64_t n = 0;
        cr_assert_eq(mt_model_forward_backward(f.m, tok, lab, 1.0f / 40, &l, &n), MT_OK, "%s", mt_last_error());
        const double norm = sqrt(tu_sumsq(G, mt_model_grads(f.m), P));
        const float gs = norm > 1.0 ? (float)(1.0 / norm) : 1.0f;
        TU_OK(G->ops->adamw(G, mt_model_params(f.m), mt_model_grads(f.m), mom, var, P, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, gs, step));
    }
    float *out = down(mt_model_params(f.m), P);
    G->ops->release(G, mom);
    G->ops->release(G, var);
    gfix_free(&f);
    return out;
}

Test(gpu_model, two_steps_bitwise_deterministic, .init = setup) {
    /* No atomics and fixed reduction orders (ops.h): two runs must agree bit for bit. */
    const mt_model_config c = tiny_model();
    float *a = two_steps(&c, 2, 24), *b = two_steps(&c, 2, 24);
    gfix f;
    gfix_init(&f, &c, G, 2, 24);
    const int64_t P = mt_model_numel(f.m);
    gfix_free(&f);
    expect_bitwise("params after two steps", a, b, P);
    free(a);
    free(b);
}

/* Skip (77) without a device, before Criterion starts its runners. */
int main(int argc, char *argv[]) {
    if (!mt_cuda_backend_available()) {
        fprintf(stderr, "test_gpu_ops: no CUDA device (or a build without CUDA): skipped\n");
        return 77;
    }
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}
