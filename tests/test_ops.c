/* tests/test_ops.c: the CPU backend's ops other than attention (test_ops_attention.c).
 *
 * Each forward is compared with a textbook fp64 reference written here; each backward
 * with the exact gradient of that reference, written out in fp64 (so a backward is never
 * checked against the kernel's own forward; when these replaced central differences of
 * the forward references, h = 1e-5, the two agreed to 4e-11..9e-10 of the largest entry,
 * the differences' own truncation and rounding, which no bound covered). Errors are
 * max |kernel - reference| over the tensor divided by max |reference| unless stated; run
 * with MT_TEST_VERBOSE=1 to print them. Tolerances are derived from the fp32 rounding
 * each op does (u = 2^-24 = 6e-8 per operation; an fp32 sum of n terms, in any order,
 * with or without FMA, is within gamma_n = n u / (1 - n u) of sum |terms|: Higham,
 * Accuracy and Stability of Numerical Algorithms, 2nd ed., Eq. 3.5), not from what one
 * machine measured, so they hold for every summation order a CPU's vector width or BLAS
 * kernel picks. The fp64 references round too: where a reference runs the operations
 * the kernel's bound counts, each within the same error in units of its own u = 2^-53
 * (glibc's exp, log, tanh, sin, cos: 1, 1, 2, 1, 1 ulp: glibc's
 * sysdeps/x86_64/fpu/libm-test-ulps, tabulated in its manual's "Known Maximum Errors in
 * Math Functions"), its error is the same bound with gamma64 (GAMMA64) in place of
 * gamma, and the comparison allows both; each bound below says what it adds. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include <omp.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/test_ops_util.h"

static mt_backend *be(void) { return mt_cpu_backend(); }

/* ------------------------------------------------------------------ memory */

Test(ops_memory, alloc_copy_zero) {
    mt_backend *o = be();
    cr_assert_str_eq(o->name, "cpu");
    float *a = tu_balloc(o, 1000 * sizeof(float));
    float *b = tu_balloc(o, 1000 * sizeof(float));
    cr_assert(a && b);
    cr_expect(((uintptr_t)a % 256) == 0 && ((uintptr_t)b % 256) == 0, "256-byte alignment");
    float host[1000], back[1000];
    for (int i = 0; i < 1000; i++) host[i] = (float)i * 0.5f;
    TU_OK(o->ops->copy_to_device(o, a, host, sizeof host));
    TU_OK(o->ops->copy(o, b, a, sizeof host));
    TU_OK(o->ops->copy_to_host(o, back, b, sizeof host));
    cr_expect(memcmp(host, back, sizeof host) == 0);
    TU_OK(o->ops->zero(o, b, sizeof host));
    TU_OK(o->ops->sync(o));
    for (int i = 0; i < 1000; i++) cr_expect(b[i] == 0.0f);
    void *z = tu_balloc(o, 0);
    cr_expect(z != NULL, "alloc(0) gives a pointer release() accepts");
    o->ops->release(o, z);
    o->ops->release(o, a);
    o->ops->release(o, b);
}

/* ------------------------------------------------------------------ gemm */

/* dense: leading dimensions equal to the rows (lda = ac, ...), the operands the model
 * passes and the only ones oneDNN's brgemm matmul takes (kernels/cpu/gemm.c); else
 * padded strides, which go to OpenBLAS. */
static void gemm_case(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                      int nan_c, int dense) {
    tu_rng r = {42 + (uint64_t)(ta * 2 + tb)};
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int64_t lda = ac + (dense ? 0 : 3), ldb = bc + (dense ? 0 : 2), ldc = N + (dense ? 0 : 5);
    float *A = tu_falloc(ar * lda), *B = tu_falloc(br * ldb), *C = tu_falloc(M * ldc);
    tu_fill_normal(&r, A, ar * lda, 1.0);
    tu_fill_normal(&r, B, br * ldb, 1.0);
    tu_fill_normal(&r, C, M * ldc, 1.0);
    if (nan_c)
        for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN;
    double *want = tu_dalloc(M * N), absmax = 0.0;
    float *got = tu_falloc(M * N);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0, sa = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k];
                double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
                sa += fabs(a * b);
            }
            want[i * N + j] = alpha * s + (beta != 0.0f ? beta * (double)C[i * ldc + j] : 0.0);
            sa = fabs(alpha) * sa + (beta != 0.0f ? fabs(beta * (double)C[i * ldc + j]) : 0.0);
            absmax = sa > absmax ? sa : absmax;
        }
    TU_OK(be()->ops->gemm(be(), ta, tb, M, N, K, alpha, A, lda, B, ldb, MT_F32, beta, C, ldc, MT_F32));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) got[i * N + j] = C[i * ldc + j];
    /* Each entry is alpha (K-term fp32 dot product) + beta c: K products and sums, the
     * alpha and beta products and the final add, in whatever order the BLAS kernel picks:
     * |error| <= gamma_(K+2) (|alpha| sum_k |a b| + |beta c|) (Higham Eq. 3.5). Relative
     * to the largest entry that is gamma_(K+2) absmax / max|C| (absmax computed above). */
    char what[64];
    snprintf(what, sizeof what, "gemm ta=%d tb=%d %ldx%ldx%ld beta=%g%s%s", ta, tb, (long)M, (long)N, (long)K, beta,
             nan_c ? " NaN C" : "", dense ? " dense" : "");
    const double u = 0x1p-24, g = (double)(K + 2) * u / (1.0 - (double)(K + 2) * u);
    EXPECT_ERR(what, tu_rel_err(got, want, M * N), g * absmax / tu_max_abs(want, M * N));
    /* padding columns of C beyond N are untouched */
    free(A);
    free(B);
    free(C);
    free(want);
    free(got);
}

Test(ops_gemm, all_transposes_against_fp64) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            for (int dense = 0; dense < 2; dense++) {
                gemm_case(ta, tb, 13, 11, 37, 0.7f, -1.3f, 0, dense);
                gemm_case(ta, tb, 13, 11, 37, 1.0f, 0.0f, 1, dense); /* beta = 0 must not read C */
            }
            /* a shape of the model's size class, dense (oneDNN on AVX-512, OpenBLAS tiles elsewhere) */
            gemm_case(ta, tb, 96, 80, 200, 1.0f, 1.0f, 0, 1);
        }
}

/* The bits of C do not depend on the thread count (ops.h determinism; kernels/cpu/gemm.c:
 * OpenBLAS single-threaded on tiles, oneDNN's matmul splitting only M and N), for dense
 * operands (oneDNN where the CPU has AVX-512 fp32 or AMX bf16) and strided ones
 * (OpenBLAS), fp32 and bf16 operands, shapes large enough to be split across threads. */
Test(ops_determinism, gemm_thread_count_does_not_change_bits) {
    const int64_t M = 320, N = 192, K = 288;
    const int keep = omp_get_max_threads();
    tu_rng r = {7};
    for (int dt = 0; dt < 2; dt++)
        for (int dense = 0; dense < 2; dense++) {
            const mt_dtype ab = dt ? MT_BF16 : MT_F32;
            const int64_t pad = dense ? 0 : 4, lda = K + pad, ldb = K + pad, ldc = N + pad;
            float *A = tu_falloc(M * lda), *B = tu_falloc(N * ldb);
            tu_fill_normal(&r, A, M * lda, 1.0);
            tu_fill_normal(&r, B, N * ldb, 1.0);
            void *Ap = A, *Bp = B;
            mt_bf16 *Ah = NULL, *Bh = NULL;
            if (dt) {
                Ap = Ah = tu_bf16_copy(A, M * lda);
                Bp = Bh = tu_bf16_copy(B, N * ldb);
            }
            float *C[2];
            for (int t = 0; t < 2; t++) {
                omp_set_num_threads(t + 1);
                C[t] = tu_falloc(M * ldc);
                TU_OK(be()->ops->gemm(be(), 0, 1, M, N, K, 1.0f, Ap, lda, Bp, ldb, ab, 0.0f, C[t], ldc, MT_F32));
            }
            omp_set_num_threads(keep);
            int same = 1;
            for (int64_t i = 0; i < M; i++) same &= tu_bitwise_equal(C[0] + i * ldc, C[1] + i * ldc, N);
            cr_expect(same, "gemm %s %s: 1 and 2 threads differ (%s)", mt_dtype_name(ab), dense ? "dense" : "strided",
                      mt_cpu_gemm_kernel());
            free(A), free(B), free(Ah), free(Bh), free(C[0]), free(C[1]);
        }
}

Test(ops_gemm, empty_k_scales_c) {
    float C[6] = {1, 2, 3, 4, 5, 6}, A[1] = {0}, B[1] = {0};
    TU_OK(be()->ops->gemm(be(), 0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, MT_F32, 0.5f, C, 3, MT_F32));
    for (int i = 0; i < 6; i++) cr_expect(C[i] == 0.5f * (float)(i + 1));
    float D[6] = {NAN, NAN, NAN, NAN, NAN, NAN};
    TU_OK(be()->ops->gemm(be(), 0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, MT_F32, 0.0f, D, 3, MT_F32));
    for (int i = 0; i < 6; i++) cr_expect(D[i] == 0.0f);
}

/* ------------------------------------------------------------------ embedding */

Test(ops_embedding, forward_exact_and_backward) {
    tu_rng r = {7};
    const int64_t V = 50, D = 24, N = 40;
    const float scale = (float)sqrt((double)D); /* Gemma's factor, rounded to fp32 */
    float *table = tu_falloc(V * D), *out = tu_falloc(N * D), *dout = tu_falloc(N * D);
    float *dtable = tu_falloc(V * D), *dtable0 = tu_falloc(V * D);
    int32_t tok[40];
    for (int64_t n = 0; n < N; n++) tok[n] = (int32_t)tu_below(&r, 12); /* many repeats */
    tu_fill_normal(&r, table, V * D, 1.0);
    tu_fill_normal(&r, dout, N * D, 1.0);
    tu_fill_normal(&r, dtable0, V * D, 1.0);
    memcpy(dtable, dtable0, (size_t)(V * D) * sizeof(float));

    TU_OK(be()->ops->embedding_fwd(be(), out, table, tok, N, 0, V, D, scale, MT_F32));
    /* One fp32 multiply per element: the result must be the correctly rounded product. */
    int exact = 1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++)
            exact &= out[n * D + d] == (float)((double)scale * (double)table[tok[n] * D + d]);
    cr_expect(exact, "embedding_fwd is the rounded product scale * row");

    TU_OK(be()->ops->embedding_bwd(be(), dtable, dout, tok, N, 0, V, D, scale, MT_F32));
    /* The gradient of sum(dout * out) w.r.t. row v of the table (out[n] = scale table[tok[n]]):
     * dtable0[v] + sum over the rows n with tok[n] = v of scale dout[n], in fp64. */
    double *want = tu_dalloc(V * D);
    for (int64_t i = 0; i < V * D; i++) want[i] = dtable0[i];
    for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++) want[tok[n] * D + d] += (double)scale * dout[n * D + d];
    /* dtable[v] += sum over the c_v rows n with tok[n] = v of scale * dout[n]: c_v fp32
     * products (the reference uses the same fp32 scale) and c_v adds onto dtable0, fused
     * or not, in any order: gamma_(c_v + 1) (|dtable0| + sum_n |scale dout|) (Eq. 3.5);
     * the reference the same in fp64: gamma64_(c_v + 1) of the same. */
    double *bnd = tu_dalloc(V * D);
    int64_t cnt[50] = {0};
    for (int64_t n = 0; n < N; n++) cnt[tok[n]]++;
    for (int64_t i = 0; i < V * D; i++) bnd[i] = fabs((double)dtable0[i]);
    for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++) bnd[tok[n] * D + d] += fabs((double)scale * dout[n * D + d]);
    for (int64_t i = 0; i < V * D; i++) bnd[i] *= GAMMA(cnt[i / D] + 1) + GAMMA64(cnt[i / D] + 1);
    EXPECT_ERR("embedding_bwd (+=) / bound", tu_bound_ratio(dtable, want, bnd, V * D), 1.0);
    free(bnd);
    free(table);
    free(out);
    free(dout);
    free(dtable);
    free(dtable0);
    free(want);
}

/* A table in vocabulary chunks (ops.h embedding_fwd / embedding_bwd with v0, V): the
 * chunks' lookups fill every row once and their backwards add each row's terms in the
 * same order, so both are bitwise the whole-table calls; rows of tokens outside a
 * chunk are left alone (the output starts as NaN, the gradient rows as dtable0). Both
 * dtypes; chunk edges cut the repeated tokens. */
Test(ops_embedding, vocabulary_chunks_bitwise) {
    tu_rng r = {11};
    const int64_t V = 37, D = 20, N = 64, bounds[] = {0, 5, 6, 19, 37};
    const float scale = 2.5f;
    int32_t tok[64];
    for (int64_t n = 0; n < N; n++) tok[n] = (int32_t)tu_below(&r, V);
    float *table = tu_falloc(V * D), *dout = tu_falloc(N * D), *dt0 = tu_falloc(V * D);
    tu_fill_normal(&r, table, V * D, 1.0);
    tu_fill_normal(&r, dout, N * D, 1.0);
    tu_fill_normal(&r, dt0, V * D, 1.0);
    for (int di = 0; di < 2; di++) {
        const mt_dtype dt = di ? MT_BF16 : MT_F32;
        const size_t es = mt_dtype_size(dt);
        void *tab = malloc((size_t)(V * D) * es), *dy = malloc((size_t)(N * D) * es);
        void *whole = malloc((size_t)(N * D) * es), *chunked = malloc((size_t)(N * D) * es);
        if (dt == MT_BF16) {
            mt_f32_to_bf16_array(tab, table, (size_t)(V * D));
            mt_f32_to_bf16_array(dy, dout, (size_t)(N * D));
        } else {
            memcpy(tab, table, (size_t)(V * D) * es);
            memcpy(dy, dout, (size_t)(N * D) * es);
        }
        memset(chunked, 0xff, (size_t)(N * D) * es); /* NaN in either dtype: a row no chunk wrote shows */
        float *gw = tu_falloc(V * D), *gc = tu_falloc(V * D);
        memcpy(gw, dt0, (size_t)(V * D) * sizeof(float));
        memcpy(gc, dt0, (size_t)(V * D) * sizeof(float));
        TU_OK(be()->ops->embedding_fwd(be(), whole, tab, tok, N, 0, V, D, scale, dt));
        TU_OK(be()->ops->embedding_bwd(be(), gw, dy, tok, N, 0, V, D, scale, dt));
        for (int c = 0; c < 4; c++) {
            const int64_t a = bounds[c], b = bounds[c + 1];
            TU_OK(be()->ops->embedding_fwd(be(), chunked, (char *)tab + (size_t)(a * D) * es, tok, N, a, b - a, D,
                                           scale, dt));
            TU_OK(be()->ops->embedding_bwd(be(), gc + a * D, dy, tok, N, a, b - a, D, scale, dt));
        }
        cr_expect(memcmp(whole, chunked, (size_t)(N * D) * es) == 0, "%s: chunked lookup differs",
                  mt_dtype_name(dt));
        cr_expect(tu_bitwise_equal(gw, gc, V * D), "%s: chunked backward differs", mt_dtype_name(dt));
        free(tab), free(dy), free(whole), free(chunked), free(gw), free(gc);
    }
    free(table), free(dout), free(dt0);
}

/* ------------------------------------------------------------------ rmsnorm */

typedef struct rms_ctx {
    int64_t N, D;
    double eps, w_off;
    double *x, *w;
    const double *dy;
} rms_ctx;

static void rms_ref(const rms_ctx *c, double *y, double *rstd) {
    for (int64_t n = 0; n < c->N; n++) {
        double ss = 0.0;
        for (int64_t d = 0; d < c->D; d++) ss += c->x[n * c->D + d] * c->x[n * c->D + d];
        double rs = 1.0 / sqrt(ss / (double)c->D + c->eps);
        if (rstd) rstd[n] = rs;
        for (int64_t d = 0; d < c->D; d++)
            y[n * c->D + d] = c->x[n * c->D + d] * rs * (c->w_off + c->w[d]);
    }
}

/* The gradient of sum(dy * y) through rms_ref, in fp64: with r = rstd, w' = w_off + w and
 * g = dy w', dx = dx0 + r g - x k, k = r^3 (sum_d g x) / D (d r / d x_e = -r^3 x_e / D),
 * and dw = dw0 + sum_n dy x r; r from rms_ref. */
static void rms_ref_bwd(const rms_ctx *c, const double *rstd, const float *dx0, const float *dw0, double *dx,
                        double *dw) {
    for (int64_t d = 0; d < c->D; d++) dw[d] = dw0[d];
    for (int64_t n = 0; n < c->N; n++) {
        const double *x = c->x + n * c->D, *dy = c->dy + n * c->D, r = rstd[n];
        double cs = 0.0;
        for (int64_t d = 0; d < c->D; d++) cs += dy[d] * (c->w_off + c->w[d]) * x[d];
        const double k = r * r * r * cs / (double)c->D;
        for (int64_t d = 0; d < c->D; d++) {
            dx[n * c->D + d] = (double)dx0[n * c->D + d] + r * (dy[d] * (c->w_off + c->w[d])) - x[d] * k;
            dw[d] += dy[d] * x[d] * r;
        }
    }
}

static void rmsnorm_case(int64_t N, int64_t D, float eps, float w_off) {
    tu_rng r = {(uint64_t)(N * 1000 + D)};
    float *x = tu_falloc(N * D), *w = tu_falloc(D), *y = tu_falloc(N * D), *rstd = tu_falloc(N);
    float *dy = tu_falloc(N * D), *dx = tu_falloc(N * D), *dw = tu_falloc(D);
    float *dx0 = tu_falloc(N * D), *dw0 = tu_falloc(D);
    tu_fill_normal(&r, x, N * D, 2.0);
    tu_fill_normal(&r, w, D, 0.5);
    tu_fill_normal(&r, dy, N * D, 1.0);
    tu_fill_normal(&r, dx0, N * D, 0.1);
    tu_fill_normal(&r, dw0, D, 0.1);
    memcpy(dx, dx0, (size_t)(N * D) * sizeof(float));
    memcpy(dw, dw0, (size_t)D * sizeof(float));

    TU_OK(be()->ops->rmsnorm_fwd(be(), y, rstd, x, w, N, D, eps, w_off, MT_F32));
    rms_ctx c = {N, D, eps, w_off, tu_to_double(x, N * D), tu_to_double(w, D),
                 tu_to_double(dy, N * D)};
    double *yr = tu_dalloc(N * D), *rr = tu_dalloc(N);
    rms_ref(&c, yr, rr);
    char what[80];
    /* rstd: the mean square and 1/sqrt in fp64 (the D-term sum of exact squares, / D,
     * + eps, sqrt halving the relative error, 1 /: within gamma64_(D+3)), one rounding to
     * fp32: within u + gamma64_(D+3) <= gamma_2 of |rstd| (D < 2^28). y = (x r)(w_off + w):
     * r's u plus three fp32 roundings: each entry within gamma_4 |y|, so within
     * gamma_4 max|y|. The reference rms_ref: its r within gamma64_(D+3), y two products
     * and a sum more: rstd within gamma64_(D+3), y within gamma64_(D+6). */
    snprintf(what, sizeof what, "rmsnorm_fwd y N=%ld D=%ld", (long)N, (long)D);
    EXPECT_ERR(what, tu_rel_err(y, yr, N * D), GAMMA(4) + GAMMA64(D + 6));
    snprintf(what, sizeof what, "rmsnorm_fwd rstd N=%ld D=%ld", (long)N, (long)D);
    EXPECT_ERR(what, tu_rel_err(rstd, rr, N), GAMMA(2) + GAMMA64(D + 3));

    TU_OK(be()->ops->rmsnorm_bwd(be(), dx, dw, dy, x, w, rstd, N, D, w_off, MT_F32));
    double *want = tu_dalloc(N * D), *wantw = tu_dalloc(D);
    rms_ref_bwd(&c, rr, dx0, dw0, want, wantw);
    /* dx += r g - x k, g = dy w', k = r^3 c / D with c = sum_d g x in fp64. The kernel's
     * r is the forward's fp32 rstd, within gamma_2 of the exact one (above). Term r g:
     * w' = w_off + w (u), g (u), r (gamma_2), the product (u): gamma_5 |r g|. Term x k:
     * r^3 (3 gamma_2), c's fp32 products g (u), k's rounding (u), the product (u):
     * gamma_9 |x| r^3 sum_d |g x| / D, and in fp64 c's D-term sum, r^3 and / D:
     * gamma64_(D+3) of it. Then the difference and the += (2u, fused or not): per entry
     * gamma_11 (|dx0| + |r g| + |x| r^3 sum_d |g x| / D). The fp64 reference: its r
     * (rms_ref: D-term sum of exact squares, / D, + eps, sqrt, 1 /) within
     * gamma64_(D+3), three times in r^3, and the same operations otherwise, each term
     * within gamma64_(4D + 20) of its value. */
    double *bnd = tu_dalloc(N * D);
    for (int64_t n = 0; n < N; n++) {
        double ca = 0.0;
        for (int64_t d = 0; d < D; d++) ca += fabs(c.dy[n * D + d] * (w_off + c.w[d]) * c.x[n * D + d]);
        const double rr3 = rr[n] * rr[n] * rr[n] * ca / (double)D;
        for (int64_t d = 0; d < D; d++) {
            const int64_t i = n * D + d;
            bnd[i] = (GAMMA(11) + GAMMA64(4 * D + 20)) *
                         (fabs((double)dx0[i]) + rr[n] * fabs(c.dy[i] * (w_off + c.w[d])) + fabs(c.x[i]) * rr3) +
                     GAMMA64(D + 3) * fabs(c.x[i]) * rr3;
        }
    }
    snprintf(what, sizeof what, "rmsnorm_bwd dx (+=) / bound N=%ld D=%ld", (long)N, (long)D);
    EXPECT_ERR(what, tu_bound_ratio(dx, want, bnd, N * D), 1.0);
    /* dw[d] += sum_n dy x r: each product two fp32 roundings plus r's gamma_2 (4u), fp32
     * sums over groups of MT_RMS_ROWS = 32 rows (31 adds), the group sums in fp64
     * (gamma64_N at most), one rounding to fp32 and the += (2u): gamma_(4 + 31 + 2)
     * (|dw0| + sum_n |dy x r|); the reference: r's gamma64_(D+3), two products, the sum
     * of N terms and dw0: gamma64_(N + D + 6). */
    for (int64_t d = 0; d < D; d++) {
        double s = fabs((double)dw0[d]);
        for (int64_t n = 0; n < N; n++) s += fabs(c.dy[n * D + d] * c.x[n * D + d] * rr[n]);
        bnd[d] = (GAMMA(37) + GAMMA64(N) + GAMMA64(N + D + 6)) * s;
    }
    snprintf(what, sizeof what, "rmsnorm_bwd dw (+=) / bound N=%ld D=%ld", (long)N, (long)D);
    EXPECT_ERR(what, tu_bound_ratio(dw, wantw, bnd, D), 1.0);
    free(bnd);
    free(x);
    free(w);
    free(y);
    free(rstd);
    free(dy);
    free(dx);
    free(dw);
    free(dx0);
    free(dw0);
    free(c.x);
    free(c.w);
    free((void *)c.dy);
    free(yr);
    free(rr);
    free(want);
    free(wantw);
}

Test(ops_rmsnorm, llama_and_gemma_forms) {
    rmsnorm_case(7, 33, 1e-5f, 0.0f);  /* D not a multiple of the vector or column block */
    rmsnorm_case(50, 100, 1e-6f, 1.0f); /* Gemma scale (1 + w), several column blocks */
}

/* The residual add fused into the norm (ops.h add_rmsnorm_fwd) is bitwise the unfused
 * ops, which rmsnorm_case and the axpy test hold to the fp64 references. */
Test(ops_rmsnorm, fused_residual_add) {
    tu_check_add_rmsnorm(be(), MT_F32);
    tu_check_add_rmsnorm(be(), MT_BF16);
}

/* ------------------------------------------------------------------ rope */

typedef struct rope_ctx {
    int64_t N, H, Dh;
    const int32_t *pos;
    const float *inv_freq;
    double *x;
    const double *dy;
} rope_ctx;

/* The rotation of src by sign x theta, in fp64: o_i = s_i cos - s_(i+half) sin(sign th),
 * o_(i+half) = s_(i+half) cos + s_i sin(sign th). sign 1 is the forward (y of x); -1, the
 * transposed rotation, is the gradient of sum(dy * y) (dx of dy). HF computes the angle
 * in fp32 (inv_freq @ position_ids); the reference does the same rounding and everything
 * after it in fp64. */
static void rope_ref(const rope_ctx *c, const double *src, double sign, double *out) {
    const int64_t half = c->Dh / 2;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t i = 0; i < half; i++) {
                const double th = (double)((float)c->pos[n] * c->inv_freq[i]), s = sign * sin(th);
                const double *x = src + (n * c->H + h) * c->Dh;
                double *o = out + (n * c->H + h) * c->Dh;
                o[i] = x[i] * cos(th) - x[i + half] * s;
                o[i + half] = x[i + half] * cos(th) + x[i] * s;
            }
}

static void rope_case(int64_t N, int64_t H, int64_t Dh) {
    tu_rng r = {(uint64_t)Dh};
    const int64_t n = N * H * Dh;
    float *x = tu_falloc(n), *dy = tu_falloc(n), *inv = tu_falloc(Dh / 2);
    int32_t *pos = calloc((size_t)N, sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) pos[i] = (int32_t)tu_below(&r, 8192); /* large angles too */
    for (int64_t i = 0; i < Dh / 2; i++) inv[i] = (float)pow(10000.0, -2.0 * (double)i / (double)Dh);
    tu_fill_normal(&r, x, n, 1.0);
    tu_fill_normal(&r, dy, n, 1.0);
    rope_ctx c = {N, H, Dh, pos, inv, tu_to_double(x, n), tu_to_double(dy, n)};
    double *want = tu_dalloc(n), *wantb = tu_dalloc(n);
    rope_ref(&c, c.x, 1.0, want);
    rope_ref(&c, c.dy, -1.0, wantb);
    TU_OK(be()->ops->rope_fwd(be(), x, pos, inv, N, H, Dh, MT_F32));
    char what[64];
    /* The angle theta = float(pos) * inv_freq is one fp32 product, in the kernel and in
     * the reference alike (as HF), so it carries no difference; computed in fp64 instead
     * it would move by up to pos |inv_freq| u (absolute), which this bound would catch.
     * cosf/sinf: glibc documents < 1 ulp on x86-64; allowing 2 ulp (other libms) is 4u
     * relative. Each output a c - b s: 4u on c and s, two products, the difference
     * (fused or not): gamma_6 (|a| + |b|) per entry of the pair. rope_bwd (rotation by
     * -theta) likewise against the exact VJP (rope_ref with sign -1). The fp64 references: glibc's
     * cos and sin within 1 ulp (2u), two products and the sum: gamma64_4 (|a| + |b|). */
    double *bnd = tu_dalloc(n), *bndb = tu_dalloc(n);
    for (int64_t row = 0; row < N * H; row++)
        for (int64_t i = 0; i < Dh / 2; i++) {
            const int64_t a = row * Dh + i, b = a + Dh / 2;
            bnd[a] = bnd[b] = (GAMMA(6) + GAMMA64(4)) * (fabs(c.x[a]) + fabs(c.x[b]));
            bndb[a] = bndb[b] = (GAMMA(6) + GAMMA64(4)) * (fabs(c.dy[a]) + fabs(c.dy[b]));
        }
    snprintf(what, sizeof what, "rope_fwd Dh=%ld / bound", (long)Dh);
    EXPECT_ERR(what, tu_bound_ratio(x, want, bnd, n), 1.0);
    TU_OK(be()->ops->rope_bwd(be(), dy, pos, inv, N, H, Dh, MT_F32));
    snprintf(what, sizeof what, "rope_bwd Dh=%ld / bound", (long)Dh);
    EXPECT_ERR(what, tu_bound_ratio(dy, wantb, bndb, n), 1.0);
    free(bnd);
    free(bndb);
    free(x);
    free(dy);
    free(inv);
    free(pos);
    free(c.x);
    free((void *)c.dy);
    free(want);
    free(wantb);
}

Test(ops_rope, rotate_half_forward_and_vjp) {
    rope_case(5, 3, 4);
    rope_case(5, 3, 16);
    rope_case(3, 2, 288); /* Dh/2 = 144 > the 128-frequency chunk */
}

/* ------------------------------------------------------------------ glu */

typedef struct glu_ctx {
    int64_t n;
    mt_activation act;
    double *g, *u;
    const double *dh;
} glu_ctx;

static void glu_case(mt_activation act) {
    tu_rng r = {100 + (uint64_t)act};
    const int64_t n = 3000;
    float *g = tu_falloc(n), *u = tu_falloc(n), *h = tu_falloc(n), *dh = tu_falloc(n);
    float *dg = tu_falloc(n), *du = tu_falloc(n);
    tu_fill_normal(&r, g, n, 3.0);
    g[0] = -100.0f; /* saturated tails */
    g[1] = -30.0f;
    g[2] = 30.0f;
    g[3] = 100.0f;
    g[4] = 0.0f;
    tu_fill_normal(&r, u, n, 1.0);
    tu_fill_normal(&r, dh, n, 1.0);
    glu_ctx c = {n, act, tu_to_double(g, n), tu_to_double(u, n), tu_to_double(dh, n)};
    double *want = tu_dalloc(n), *wg = tu_dalloc(n), *wu = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) {
        want[i] = tu_act_ref(c.g[i], act) * c.u[i];
        wg[i] = c.dh[i] * c.u[i] * tu_act_grad_ref(c.g[i], act); /* d (dh . h) / d gate */
        wu[i] = c.dh[i] * tu_act_ref(c.g[i], act);               /* d (dh . h) / d up */
    }
    TU_OK(be()->ops->glu_fwd(be(), h, g, u, n, act, MT_F32));
    const char *name = act == MT_ACT_SILU ? "silu" : "gelu_tanh";
    char what[64];
    /* vmath.h's exp is within 2 ulp of the rounded value (Test vmath: 2.5 ulp of the
     * exact one, 5u relative), its tanh within 8u absolute (Test vmath, tanh_abs_error).
     * silu: 1 + e (6u), the division and the product by up: h within 8u |h| <= 8u |g up|.
     * gelu: the argument k (g + c g^3) has no cancellation (5 roundings, and tanh' <= 1
     * with |a| sech^2 a < 0.45: 3u), so t within 11u absolute, 1 + t 13u absolute (it
     * cancels for g << 0, hence absolute), times 0.5 g and up (2u): h within
     * 0.5 |g up| 13u + 2u |h| <= 9u |g up|. Both within gamma_9 (1 + |g|) |up|; dup = dh a
     * likewise within gamma_9 (1 + |g|) |dh|. dgate = dh up a': silu's
     * a' = s (1 + g (1 - s)) from s = 1 / (1 + e) (7u) carries <= 18u s (1 + |g|)
     * absolute; gelu's 0.5 (1 + t) + 0.5 g (1 - t^2) k (1 + 3 c g^2) carries 12u from the
     * first term and 29u 0.5 k |g| (1 + 3 c g^2) from the second, <= 14u (1 + |g|)(1 + g^2);
     * two more products: gamma_20 (1 + |g|)(1 + g^2) |dh up| for both. The fp64
     * references (tu_act_ref, tu_act_grad_ref: the same formulas, glibc's exp within 1 ulp and
     * tanh within 2 ulp, inside the 5u and 8u counted) within the same with gamma64:
     * gamma64_9 and gamma64_20 of the same. */
    double *bh = tu_dalloc(n), *bg = tu_dalloc(n), *bu = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) {
        const double a = 1.0 + fabs(c.g[i]);
        bh[i] = (GAMMA(9) + GAMMA64(9)) * a * fabs(c.u[i]) + 1e-30;
        bu[i] = (GAMMA(9) + GAMMA64(9)) * a * fabs(c.dh[i]);
        bg[i] = (GAMMA(20) + GAMMA64(20)) * a * (1.0 + c.g[i] * c.g[i]) * fabs(c.dh[i] * c.u[i]);
    }
    snprintf(what, sizeof what, "glu_fwd %s / bound", name);
    EXPECT_ERR(what, tu_bound_ratio(h, want, bh, n), 1.0);
    TU_OK(be()->ops->glu_bwd(be(), dg, du, dh, g, u, n, act, MT_F32));
    snprintf(what, sizeof what, "glu_bwd %s dgate / bound", name);
    EXPECT_ERR(what, tu_bound_ratio(dg, wg, bg, n), 1.0);
    snprintf(what, sizeof what, "glu_bwd %s dup / bound", name);
    EXPECT_ERR(what, tu_bound_ratio(du, wu, bu, n), 1.0);
    free(bh);
    free(bg);
    free(bu);
    free(g);
    free(u);
    free(h);
    free(dh);
    free(dg);
    free(du);
    free(c.g);
    free(c.u);
    free((void *)c.dh);
    free(want);
    free(wg);
    free(wu);
}

Test(ops_glu, swiglu) { glu_case(MT_ACT_SILU); }
Test(ops_glu, geglu) { glu_case(MT_ACT_GELU_TANH); }

/* glu_bwd in place (ops.h: dgate may be gate and dup may be up, as the layers' backward
 * calls it) gives bitwise the out-of-place results; n spans several blocks and threads.
 * A kernel that read gate or up after writing an output would differ here. */
static void glu_in_place_case(mt_activation act) {
    tu_rng r = {110 + (uint64_t)act};
    const int64_t n = 20000;
    float *g = tu_falloc(n), *u = tu_falloc(n), *dh = tu_falloc(n), *dg = tu_falloc(n), *du = tu_falloc(n);
    tu_fill_normal(&r, g, n, 3.0);
    tu_fill_normal(&r, u, n, 1.0);
    tu_fill_normal(&r, dh, n, 1.0);
    TU_OK(be()->ops->glu_bwd(be(), dg, du, dh, g, u, n, act, MT_F32));
    TU_OK(be()->ops->glu_bwd(be(), g, u, dh, g, u, n, act, MT_F32)); /* g <- dgate, u <- dup */
    const char *name = act == MT_ACT_SILU ? "silu" : "gelu_tanh";
    cr_expect(memcmp(g, dg, (size_t)n * sizeof(float)) == 0, "glu_bwd %s: in-place dgate bitwise", name);
    cr_expect(memcmp(u, du, (size_t)n * sizeof(float)) == 0, "glu_bwd %s: in-place dup bitwise", name);
    free(g), free(u), free(dh), free(dg), free(du);
}

Test(ops_glu, swiglu_in_place) { glu_in_place_case(MT_ACT_SILU); }
Test(ops_glu, geglu_in_place) { glu_in_place_case(MT_ACT_GELU_TANH); }

/* ------------------------------------------------------------------ xent_tile */

typedef struct xent_ctx {
    int64_t R, V;
    double cap, dscale;
    const int32_t *labels;
    int32_t ignore;
    double *x;
} xent_ctx;

/* dscale * sum over labelled rows of logsumexp(z) - z[label], z = cap tanh(x / cap). */
static double xent_loss(const xent_ctx *c) {
    double L = 0.0;
    for (int64_t r = 0; r < c->R; r++) {
        if (c->labels[r] == c->ignore) continue;
        const double *x = c->x + r * c->V;
        double mx = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < c->V; j++) {
            double z = c->cap > 0 ? c->cap * tanh(x[j] / c->cap) : x[j];
            mx = z > mx ? z : mx;
        }
        for (int64_t j = 0; j < c->V; j++) {
            double z = c->cap > 0 ? c->cap * tanh(x[j] / c->cap) : x[j];
            s += exp(z - mx);
        }
        double zl = x[c->labels[r]];
        if (c->cap > 0) zl = c->cap * tanh(zl / c->cap);
        L += mx + log(s) - zl;
    }
    return c->dscale * L;
}

/* Its gradient, in fp64: dscale (softmax(z) - onehot(label)) dz/dx per labelled row,
 * dz/dx = 1 - (z / cap)^2 with the soft-cap (1 without), 0 on ignored rows. */
static void xent_grad_ref(const xent_ctx *c, double *g) {
    for (int64_t r = 0; r < c->R; r++) {
        double *gr = g + r * c->V;
        for (int64_t j = 0; j < c->V; j++) gr[j] = 0.0;
        if (c->labels[r] == c->ignore) continue;
        const double *x = c->x + r * c->V;
        double mx = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < c->V; j++) {
            gr[j] = c->cap > 0 ? c->cap * tanh(x[j] / c->cap) : x[j]; /* z, for now */
            mx = gr[j] > mx ? gr[j] : mx;
        }
        for (int64_t j = 0; j < c->V; j++) s += exp(gr[j] - mx);
        for (int64_t j = 0; j < c->V; j++) {
            const double z = gr[j], dz = c->cap > 0 ? 1.0 - (z / c->cap) * (z / c->cap) : 1.0;
            gr[j] = c->dscale * (exp(z - mx) / s - (j == c->labels[r])) * dz;
        }
    }
}

static void xent_case(float cap, double std) {
    tu_rng r = {(uint64_t)(cap * 10) + 5};
    const int64_t R = 7, V = 37;
    const int32_t ignore = -100;
    int32_t labels[7];
    for (int64_t i = 0; i < R; i++) labels[i] = (int32_t)tu_below(&r, V);
    labels[2] = ignore;
    labels[5] = ignore;
    float *x = tu_falloc(R * V);
    tu_fill_normal(&r, x, R * V, std);
    const float dscale = 0.25f;
    xent_ctx c = {R, V, cap, dscale, labels, ignore, tu_to_double(x, R * V)};
    double stats[2] = {1.5, 3.0}; /* += into existing totals (loss sum, count) */
    TU_OK(be()->ops->xent_tile(be(), x, x, MT_F32, labels, R, V, cap, ignore, dscale, stats));
    const double loss = stats[0];
    cr_expect(stats[1] == 3 + 5, "count adds the labelled rows");
    const double want = xent_loss(&c) / dscale;
    /* Bounds derived in tu_xent_bounds (tests/test_ops_util.h), which include the fp64
     * reference's own rounding: the loss relative to |want|, each dlogit entry against its
     * own bound (ignored rows: exact zeros, allowed 1e-30). */
    double *eg = tu_dalloc(R * V), *g = tu_dalloc(R * V);
    const double lb = tu_xent_bounds(c.x, labels, ignore, R, V, cap, dscale, 1.5, eg);
    char what[64];
    snprintf(what, sizeof what, "xent_tile loss cap=%g", cap);
    EXPECT_ERR(what, fabs((loss - 1.5) - want) / fabs(want), lb / fabs(want));
    xent_grad_ref(&c, g);
    for (int64_t i = 0; i < R * V; i++) eg[i] += 1e-30;
    snprintf(what, sizeof what, "xent_tile dlogits cap=%g / bound", cap);
    EXPECT_ERR(what, tu_bound_ratio(x, g, eg, R * V), 1.0);
    free(eg);
    for (int64_t j = 0; j < V; j++) cr_expect(x[2 * V + j] == 0.0f && x[5 * V + j] == 0.0f);
    free(x);
    free(c.x);
    free(g);
}

Test(ops_xent, plain_and_ignored_rows) { xent_case(0.0f, 2.0); }
Test(ops_xent, final_softcap) { xent_case(5.0f, 4.0); }

/* A realistic vocabulary: the fp64 sum over 50k exponentials, against the analytic
 * softmax - onehot (finite differences over 150k logits would be slow). */
Test(ops_xent, large_vocab) {
    tu_rng r = {77};
    const int64_t R = 3, V = 50000;
    int32_t labels[3] = {0, 12345, 49999};
    float *x = tu_falloc(R * V);
    tu_fill_normal(&r, x, R * V, 3.0);
    double *want = tu_dalloc(R * V), Lw = 0.0;
    for (int64_t i = 0; i < R; i++) {
        const float *xr = x + i * V;
        double mx = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < V; j++) mx = xr[j] > mx ? xr[j] : mx;
        for (int64_t j = 0; j < V; j++) s += exp(xr[j] - mx);
        for (int64_t j = 0; j < V; j++) want[i * V + j] = exp(xr[j] - mx) / s - (j == labels[i]);
        Lw += mx + log(s) - xr[labels[i]];
    }
    double stats[2] = {0.0, 0.0};
    /* tu_xent_bounds' analysis (no cap, dscale 1); exact zeros allowed 1e-30. */
    double *eg = tu_dalloc(R * V), *xd = tu_to_double(x, R * V);
    const double lb = tu_xent_bounds(xd, labels, -1, R, V, 0.0, 1.0, 0.0, eg);
    TU_OK(be()->ops->xent_tile(be(), x, x, MT_F32, labels, R, V, 0.0f, -1, 1.0f, stats));
    const double loss = stats[0];
    cr_expect(stats[1] == 3);
    for (int64_t i = 0; i < R * V; i++) eg[i] += 1e-30;
    EXPECT_ERR("xent_tile loss V=50000", fabs(loss - Lw) / Lw, lb / Lw);
    EXPECT_ERR("xent_tile dlogits V=50000 / bound", tu_bound_ratio(x, want, eg, R * V), 1.0);
    free(eg);
    free(xd);
    free(x);
    free(want);
}

/* ------------------------------------------------------------------ vocab_tile_* */

/* The vocab-parallel phases (ops.h vocab_tile_max, vocab_tile_sumexp, vocab_tile_grad) on
 * a simulated tensor group of G ranks: rank g holds columns [g Vl, (g + 1) Vl) of the
 * logits, the test plays the two all-reduces (max of mx, then the sum of sz in rank
 * order, fp64). R = 11 rows and slices of Vl = 13 divide nothing; labels sit on slice
 * edges, inside other ranks' slices and on ignored rows. Phases 1 and 2 are checked
 * on their own, phase 3 through the assembled loss and gradient against the fp64
 * reference of xent_tile's test (xent_loss and xent_grad_ref). */
typedef struct vocab_group {
    int64_t R, G, Vl;
    float *z[4], *mx[4];
    double *sz[4];
    float mxall[16];
    double szall[32];
} vocab_group;

/* Phase 1 on every rank, then the all-reduce max; checks each rank's outputs:
 * z against the fp64 soft-cap cap tanh(x / cap) within 11u |z| (x inv_cap 2u, tanh 8u,
 * the product by cap u: tu_xent_bounds' ez; without a cap z is untouched, bitwise), and
 * mx[r] == max_j z[r, j] of the op's own z, bitwise (a max is exact). */
static void vocab_phase1(vocab_group *g, const float *x, int64_t V, float cap) {
    const int64_t R = g->R, Vl = g->Vl;
    double worst = 0.0;
    for (int64_t k = 0; k < g->G; k++) {
        for (int64_t r = 0; r < R; r++)
            memcpy(g->z[k] + r * Vl, x + r * V + k * Vl, (size_t)Vl * sizeof(float));
        TU_OK(be()->ops->vocab_tile_max(be(), g->z[k], R, Vl, cap, g->mx[k], 0));
        for (int64_t r = 0; r < R; r++) {
            float m = -INFINITY;
            for (int64_t j = 0; j < Vl; j++) {
                const double xv = x[r * V + k * Vl + j], zv = g->z[k][r * Vl + j];
                const double want = cap > 0 ? cap * tanh(xv / cap) : xv;
                const double e = fabs(zv - want) / (cap > 0 ? 11 * U32 * fabs(want) + 0x1p-149 : 0x1p-149);
                worst = e > worst ? e : worst;
                m = g->z[k][r * Vl + j] > m ? g->z[k][r * Vl + j] : m;
            }
            cr_expect(memcmp(&m, &g->mx[k][r], sizeof m) == 0, "rank %lld row %lld: mx %.9g, max of z %.9g",
                      (long long)k, (long long)r, g->mx[k][r], m);
        }
    }
    EXPECT_ERR(cap > 0 ? "vocab_tile_max capped z / bound" : "vocab_tile_max z / bound", worst, 1.0);
    for (int64_t r = 0; r < R; r++) {
        g->mxall[r] = -INFINITY;
        for (int64_t k = 0; k < g->G; k++) g->mxall[r] = g->mx[k][r] > g->mxall[r] ? g->mx[k][r] : g->mxall[r];
    }
}

/* Phase 2 on every rank, then the all-reduce sum (rank order); checks each rank's sz:
 * sz[2r] against S = sum_j exp(z - mx) in fp64 from the op's own fp32 inputs: each term
 * errs by u |z - mx| (the fp32 difference, moving exp by that much relative) + 5u (the
 * fp32 exp: 2 ulp of the rounded value, 2.5 of the exact, tu_xent_bounds), the fp64 sums
 * of Vl positive terms, the op's and the reference's, by gamma64_Vl S each (Higham eq.
 * 3.5). The factor 1.01 covers the higher orders (eps / (1 - eps), eps = max_j (u |z - mx|
 * + 5u) < 1e-4 here: |z - mx| < 100) and the reference's own exps (glibc, 1 ulp: 2^-29 of
 * the 5u counted). sz[2r + 1] is the label's logit on its owner and 0 elsewhere,
 * bitwise; ignored rows are (0, 0). */
static void vocab_phase2(vocab_group *g, const int32_t *labels, int32_t ignore) {
    const int64_t R = g->R, Vl = g->Vl;
    double worst = 0.0;
    for (int64_t k = 0; k < g->G; k++) {
        const int64_t v0 = k * Vl;
        TU_OK(be()->ops->vocab_tile_sumexp(be(), g->z[k], R, Vl, g->mxall, labels, v0, ignore, g->sz[k], 0));
        for (int64_t r = 0; r < R; r++) {
            const double *sz = g->sz[k] + 2 * r;
            if (labels[r] == ignore) {
                cr_expect(sz[0] == 0.0 && sz[1] == 0.0, "ignored row %lld: sz (%g, %g)", (long long)r, sz[0], sz[1]);
                continue;
            }
            const float *z = g->z[k] + r * Vl;
            const double m = g->mxall[r];
            double S = 0.0, b = 0.0;
            for (int64_t j = 0; j < Vl; j++) {
                const double e = exp((double)z[j] - m);
                S += e;
                b += e * (U32 * fabs((double)z[j] - m) + 5 * U32);
            }
            b = 1.01 * (b + 2 * GAMMA64(Vl) * S);
            const double e = fabs(sz[0] - S) / b;
            worst = e > worst ? e : worst;
            const int own = labels[r] >= v0 && labels[r] < v0 + Vl;
            const double zl = own ? (double)z[labels[r] - v0] : 0.0;
            cr_expect(memcmp(&sz[1], &zl, sizeof zl) == 0, "rank %lld row %lld label %d: sz[2r+1] %.17g, want %.17g",
                      (long long)k, (long long)r, labels[r], sz[1], zl);
        }
    }
    EXPECT_ERR("vocab_tile_sumexp sum / bound", worst, 1.0);
    for (int64_t i = 0; i < 2 * R; i++) {
        g->szall[i] = 0.0;
        for (int64_t k = 0; k < g->G; k++) g->szall[i] += g->sz[k][i];
    }
}

/* The same G slices as the vocabulary chunks of one rank (parallel/vocab_loss.h
 * mt_vocab_chunked_loss): vocab_tile_max with accumulate folds each chunk's row max into
 * mx, vocab_tile_sumexp with accumulate adds each chunk's two terms to sz in chunk
 * order. A max is exact and the fp64 adds are the test's all-reduce sum in rank order
 * (0 + s_0 + s_1 + ...), so both equal the group's mxall / szall bitwise; a second max
 * call with the final mx (the chunked loss's later passes) leaves mx alone and only
 * caps z. */
static void vocab_chunks_accumulate(const vocab_group *g, const float *x, int64_t V, float cap,
                                    const int32_t *labels, int32_t ignore) {
    const int64_t R = g->R, Vl = g->Vl;
    float *z = tu_falloc(R * Vl), *mx = tu_falloc(R);
    double *sz = tu_dalloc(2 * R);
    for (int pass = 1; pass <= 2; pass++)
        for (int64_t k = 0; k < g->G; k++) {
            for (int64_t r = 0; r < R; r++) memcpy(z + r * Vl, x + r * V + k * Vl, (size_t)Vl * sizeof(float));
            TU_OK(be()->ops->vocab_tile_max(be(), z, R, Vl, cap, mx, pass == 2 || k > 0));
            if (pass == 2) {
                cr_expect(tu_bitwise_equal(z, g->z[k], R * Vl), "chunk %lld: the capped z differ", (long long)k);
                TU_OK(be()->ops->vocab_tile_sumexp(be(), z, R, Vl, mx, labels, k * Vl, ignore, sz, k > 0));
            }
        }
    cr_expect(memcmp(mx, g->mxall, (size_t)R * sizeof(float)) == 0, "accumulated mx is not the group's max");
    cr_expect(memcmp(sz, g->szall, (size_t)(2 * R) * sizeof(double)) == 0, "accumulated sz is not the group's sum");
    free(z), free(mx), free(sz);
}

static void vocab_case(float cap, double std) {
    tu_rng rng = {(uint64_t)(cap * 10) + 41};
    vocab_group g = {.R = 11, .G = 3, .Vl = 13};
    const int64_t R = g.R, Vl = g.Vl, V = g.G * Vl;
    const int32_t ignore = -100;
    int32_t labels[11];
    for (int64_t i = 0; i < R; i++) labels[i] = (int32_t)tu_below(&rng, V);
    labels[0] = 0;                    /* first column of rank 0 */
    labels[1] = (int32_t)Vl;          /* first of rank 1 */
    labels[4] = (int32_t)(2 * Vl - 1); /* last of rank 1 */
    labels[6] = (int32_t)(V - 1);      /* last of rank 2 */
    labels[3] = ignore;
    labels[8] = ignore;
    float *x = tu_falloc(R * V);
    tu_fill_normal(&rng, x, R * V, std);
    for (int64_t k = 0; k < g.G; k++) {
        g.z[k] = tu_falloc(R * Vl);
        g.mx[k] = tu_falloc(R);
        g.sz[k] = tu_dalloc(2 * R);
    }
    vocab_phase1(&g, x, V, cap);
    vocab_phase2(&g, labels, ignore);
    vocab_chunks_accumulate(&g, x, V, cap, labels, ignore);

    /* phase 3: loss only first (z untouched, bitwise), then with the gradient */
    const float dscale = 0.25f;
    double st[4][2], st0[2] = {1.5, 3.0};
    float *keep = tu_falloc(R * Vl);
    memcpy(keep, g.z[1], (size_t)(R * Vl) * sizeof(float));
    memcpy(st[3], st0, sizeof st0);
    TU_OK(be()->ops->vocab_tile_grad(be(), g.z[1], R, Vl, g.mxall, g.szall, labels, Vl, ignore, cap, dscale, 0,
                                     st[3]));
    cr_expect(tu_bitwise_equal(keep, g.z[1], R * Vl), "write_grad = 0 left the tile alone");
    float *dl = tu_falloc(R * V);
    for (int64_t k = 0; k < g.G; k++) {
        memcpy(st[k], st0, sizeof st0);
        TU_OK(be()->ops->vocab_tile_grad(be(), g.z[k], R, Vl, g.mxall, g.szall, labels, k * Vl, ignore, cap, dscale,
                                         1, st[k]));
        cr_expect(memcmp(st[k], st[3], sizeof st0) == 0, "rank %lld adds other stats than the loss-only call",
                  (long long)k);
        for (int64_t r = 0; r < R; r++)
            memcpy(dl + r * V + k * Vl, g.z[k] + r * Vl, (size_t)Vl * sizeof(float));
    }
    cr_expect(st[0][1] == 3 + 9, "count adds the labelled rows: %g", st[0][1]);

    /* Against the fp64 reference with tu_xent_bounds (tests/test_ops_util.h): per element
     * the phases compute xent_tile's fp32 operations (ops.h); the split only regroups the
     * fp64 sum of the V exps (G partial sums of Vl terms, then G - 1 additions: V - 1
     * additions in all), which gamma64_V bounds in any grouping, and vocab_tile_grad adds
     * the R row losses to stats[0] in increasing r, as the analysis counts. */
    xent_ctx c = {R, V, cap, dscale, labels, ignore, tu_to_double(x, R * V)};
    const double want = xent_loss(&c) / dscale;
    double *eg = tu_dalloc(R * V), *gref = tu_dalloc(R * V);
    const double lb = tu_xent_bounds(c.x, labels, ignore, R, V, cap, dscale, 1.5, eg);
    char what[64];
    snprintf(what, sizeof what, "vocab_tile_* loss G=3 cap=%g", cap);
    EXPECT_ERR(what, fabs((st[0][0] - 1.5) - want) / fabs(want), lb / fabs(want));
    xent_grad_ref(&c, gref);
    for (int64_t i = 0; i < R * V; i++) eg[i] += 1e-30; /* ignored rows: exact zeros */
    snprintf(what, sizeof what, "vocab_tile_* dlogits G=3 cap=%g / bound", cap);
    EXPECT_ERR(what, tu_bound_ratio(dl, gref, eg, R * V), 1.0);
    for (int64_t j = 0; j < V; j++) cr_expect(dl[3 * V + j] == 0.0f && dl[8 * V + j] == 0.0f);

    /* A group of one (v0 = 0, Vl = V): xent_tile's bits (ops.h). R = 11 is below
     * xent_tile's 64 row chunks, so its loss sum has the same order too. */
    vocab_group one = {.R = R, .G = 1, .Vl = V};
    one.z[0] = tu_falloc(R * V);
    one.mx[0] = tu_falloc(R);
    one.sz[0] = tu_dalloc(2 * R);
    vocab_phase1(&one, x, V, cap);
    vocab_phase2(&one, labels, ignore);
    double s1[2] = {1.5, 3.0}, sx[2] = {1.5, 3.0};
    TU_OK(be()->ops->vocab_tile_grad(be(), one.z[0], R, V, one.mxall, one.szall, labels, 0, ignore, cap, dscale, 1,
                                     s1));
    float *xt = tu_falloc(R * V);
    memcpy(xt, x, (size_t)(R * V) * sizeof(float));
    TU_OK(be()->ops->xent_tile(be(), xt, xt, MT_F32, labels, R, V, cap, ignore, dscale, sx));
    cr_expect(tu_bitwise_equal(one.z[0], xt, R * V), "group of one: dlogits are not xent_tile's bits");
    cr_expect(memcmp(s1, sx, sizeof s1) == 0, "group of one: stats (%.17g, %g) vs xent_tile (%.17g, %g)", s1[0],
              s1[1], sx[0], sx[1]);
    free(one.z[0]), free(one.mx[0]), free(one.sz[0]), free(xt);

    for (int64_t k = 0; k < g.G; k++) free(g.z[k]), free(g.mx[k]), free(g.sz[k]);
    free(x), free(keep), free(dl), free(eg), free(c.x), free(gref);
}

Test(ops_vocab, three_ranks_plain) { vocab_case(0.0f, 2.0); }
Test(ops_vocab, three_ranks_softcap) { vocab_case(5.0f, 4.0); }

Test(ops_vocab, refusals_and_empty_tiles) {
    float z[4] = {1, 2, 3, 4}, mx[2] = {7, 7};
    double sz[4] = {9, 9, 9, 9}, st[2] = {1.0, 2.0};
    int32_t lab[2] = {0, 1};
    cr_expect_eq(be()->ops->vocab_tile_max(be(), z, -1, 2, 0.0f, mx, 0), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "vocab_tile_max") != NULL, "message: %s", mt_last_error());
    cr_expect_eq(be()->ops->vocab_tile_max(be(), z, 2, 0, 0.0f, mx, 0), MT_ERR_INVALID);
    cr_expect_eq(be()->ops->vocab_tile_sumexp(be(), z, -1, 2, mx, lab, 0, -1, sz, 0), MT_ERR_INVALID);
    cr_expect_eq(be()->ops->vocab_tile_grad(be(), z, 2, 0, mx, sz, lab, 0, -1, 0.0f, 1.0f, 1, st), MT_ERR_INVALID);
    TU_OK(be()->ops->vocab_tile_max(be(), z, 0, 2, 0.0f, mx, 0));
    TU_OK(be()->ops->vocab_tile_sumexp(be(), z, 0, 2, mx, lab, 0, -1, sz, 0));
    TU_OK(be()->ops->vocab_tile_grad(be(), z, 0, 2, mx, sz, lab, 0, -1, 0.0f, 1.0f, 1, st));
    cr_expect(mx[0] == 7 && sz[0] == 9 && st[0] == 1.0 && st[1] == 2.0 && z[0] == 1,
              "a refused or empty call wrote its outputs");
}

/* ------------------------------------------------------------------ elementwise */

Test(ops_elementwise, axpy_scale_sumsq) {
    tu_rng r = {3};
    const int64_t n = 100003;
    float *x = tu_falloc(n), *y = tu_falloc(n), *y0 = tu_falloc(n);
    tu_fill_normal(&r, x, n, 1.0);
    tu_fill_normal(&r, y0, n, 1.0);
    memcpy(y, y0, (size_t)n * sizeof(float));
    double *want = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) want[i] = (double)y0[i] + 0.3 * (double)x[i];
    TU_OK(be()->ops->axpy(be(), y, x, 0.3f, n, MT_F32));
    /* y + a x, one product and one sum in fp32 (or one FMA), with a = 0.3f within u of 0.3:
     * |error| <= gamma_3 (|y| + |0.3 x|), i.e. gamma_3 max(|y| + 0.3 |x|) / max|want| of
     * the max (that ratio, a property of the data, computed here). */
    double ab = 0.0;
    for (int64_t i = 0; i < n; i++) ab = fmax(ab, fabs((double)y0[i]) + 0.3 * fabs((double)x[i]));
    EXPECT_ERR("axpy", tu_rel_err(y, want, n), GAMMA(3) * ab / tu_max_abs(want, n));
    for (int64_t i = 0; i < n; i++) want[i] = (double)y[i] * -1.7;
    TU_OK(be()->ops->scale(be(), y, -1.7f, n, MT_F32));
    /* one fp32 product, with -1.7f within u of -1.7: gamma_2 of each entry. */
    EXPECT_ERR("scale", tu_rel_err(y, want, n), GAMMA(2));
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    /* Squares of fp32 values are exact in fp64; the kernel's and this sum of n positive
     * terms are each within gamma_(n-1) (u_64 = 2^-53) of the exact sum, in any order, so
     * within 2 n 2^-53 = 2.2e-11 of each other. */
    EXPECT_ERR("sumsq", fabs(tu_sumsq(be(), x, n) - s) / s, 2.0 * (double)n * 0x1p-53);
    cr_expect(tu_sumsq(be(), x, 0) == 0.0);
    /* "+=": the tensor's fp64 sum is added to the accumulator last (one fp64 add; the
     * CPU backend's memory is host memory) */
    double acc = 2.5;
    TU_OK(be()->ops->sumsq(be(), x, n, &acc));
    cr_expect(acc == 2.5 + tu_sumsq(be(), x, n), "sumsq adds its sum to acc[0]");
    free(x);
    free(y);
    free(y0);
    free(want);
}

/* ------------------------------------------------------------------ adamw */

Test(ops_adamw, five_steps_against_fp64_formula) {
    tu_rng r = {11};
    const int64_t n = 5000;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *p = tu_falloc(n), *g = tu_falloc(n), *m = tu_falloc(n), *v = tu_falloc(n);
    double *pd = tu_dalloc(n), *md = tu_dalloc(n), *vd = tu_dalloc(n);
    double *ep = tu_dalloc(n), *em = tu_dalloc(n), *ev = tu_dalloc(n); /* error bounds */
    const mt_adamw_segment all = {0, n, 1, 0}; /* one segment, weight decay on */
    tu_fill_normal(&r, p, n, 1.0);
    for (int64_t i = 0; i < n; i++) pd[i] = p[i];
    for (int64_t t = 1; t <= 5; t++) {
        tu_fill_normal(&r, g, n, 1.0);
        TU_OK(be()->ops->adamw(be(), p, g, m, v, &all, 1, lr, b1, b2, eps, wd, gs, t));
        /* the formula of ops.h, in fp64 with the same fp32 hyperparameter values */
        const double B1 = b1, B2 = b2, u = U32;
        for (int64_t i = 0; i < n; i++) {
            const double gi = (double)gs * g[i], m0 = md[i], v0 = vd[i];
            md[i] = B1 * md[i] + (1 - B1) * gi;
            vd[i] = B2 * vd[i] + (1 - B2) * gi * gi;
            const double mh = md[i] / (1 - pow(B1, (double)t)), vh = vd[i] / (1 - pow(B2, (double)t));
            const double den = sqrt(vh) + (double)eps, upd = mh / den, s1 = upd + (double)wd * pd[i];
            /* First-order error recurrences of the kernel's fp32 expression (adamw.c; the
             * reference uses the same fp32 hyperparameters and 1 - b1 is exact):
             * m = b1 m + c1 (gs g): gs g (u), two products (u each), the sum (u);
             * v = b2 v + c2 (gs g)^2: the square of gs g (3u), c2's product, b2 v, the sum;
             * the bias corrections rounded to fp32 (u each) and the product by them (u);
             * den = sqrt(v ib2) + eps: half v's relative error plus 3u; the division (u);
             * p - lr (upd + wd p): wd p, the sum, lr's product, the difference (u each). */
            em[i] = B1 * em[i] + u * (B1 * fabs(m0) + 2 * (1 - B1) * fabs(gi) + fabs(md[i]));
            ev[i] = B2 * ev[i] + u * (B2 * fabs(v0) + 4 * (1 - B2) * gi * gi + fabs(vd[i]));
            const double eu = (em[i] / (1 - pow(B1, (double)t)) + 2 * u * fabs(mh)) / den +
                              fabs(upd) * (ev[i] / (2 * vd[i]) + 4 * u);
            const double pold = pd[i];
            pd[i] -= (double)lr * s1;
            ep[i] += (double)lr * (eu + (double)wd * ep[i] + u * (double)wd * fabs(pold) + 2 * u * fabs(s1)) +
                     u * fabs(pd[i]);
        }
    }
    /* Each element within its first-order bound (accumulated above, fused or not, in
     * any lane order: the loop is elementwise); 1.01 covers the O(t^2 u^2) terms. */
    for (int64_t i = 0; i < n; i++) {
        ep[i] *= 1.01;
        em[i] *= 1.01;
        ev[i] *= 1.01;
    }
    EXPECT_ERR("adamw p after 5 steps / bound", tu_bound_ratio(p, pd, ep, n), 1.0);
    EXPECT_ERR("adamw m after 5 steps / bound", tu_bound_ratio(m, md, em, n), 1.0);
    EXPECT_ERR("adamw v after 5 steps / bound", tu_bound_ratio(v, vd, ev, n), 1.0);
    free(ep);
    free(em);
    free(ev);
    free(p);
    free(g);
    free(m);
    free(v);
    free(pd);
    free(md);
    free(vd);
}

/* A table of runs with mixed decay flags, gaps between them (never touched), adjacent
 * runs, an empty run, and runs longer than the op's parallel threshold and its blocks
 * of 8192 (kernels/cpu/adamw.c: AVX2 body and scalar tail in several threads). */
static const mt_adamw_segment ADAM_SEGS[] = {
    {0, 37, 1, 0},      {37, 1000, 0, 0},    {1100, 40001, 1, 0}, {41101, 8, 0, 0},
    {41200, 13, 1, 0},  {41213, 0, 1, 0},    {41213, 3, 0, 0},    {41300, 20483, 0, 0},
};
#define ADAM_NSEGS ((int)(sizeof ADAM_SEGS / sizeof ADAM_SEGS[0]))
#define ADAM_N ((int64_t)62000) /* past the last segment's end 61783: a tail gap */

/* ops.h's formula as the kernel evaluates it, element by element in fp32 (this file is
 * ISO C: no contraction into fused multiply-adds), in the kernel's operation order. */
static void adamw_expr(float *p, const float *g, float *m, float *v, int64_t i, float lr, float b1, float b2,
                       float eps, float wd, float gs, int64_t t) {
    const float inv_bc1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    const float inv_bc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    const float gi = gs * g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float pi = p[i];
    const float upd = (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
    p[i] = pi - lr * (upd + wd * pi);
}

/* One call over the table == one call per segment, bitwise, over 3 steps; elements in
 * no segment keep their bits; each element is the fp32 expression above with the decay
 * of its segment (the arithmetic is the per-tensor op's: segmentation changes nothing). */
Test(ops_adamw, segments_are_bitwise_separate_calls) {
    tu_rng r = {12};
    const int64_t n = ADAM_N;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    float *p[3], *m[3], *v[3], *g = tu_falloc(n); /* [0]: one call, [1]: per segment, [2]: the expression */
    float *p0 = tu_falloc(n), *m0 = tu_falloc(n), *v0 = tu_falloc(n);
    tu_fill_normal(&r, p0, n, 1.0);
    tu_fill_normal(&r, m0, n, 0.01);
    for (int64_t i = 0; i < n; i++) v0[i] = fabsf(m0[i]) * 0.1f;
    for (int k = 0; k < 3; k++) {
        p[k] = tu_falloc(n), m[k] = tu_falloc(n), v[k] = tu_falloc(n);
        memcpy(p[k], p0, (size_t)n * 4), memcpy(m[k], m0, (size_t)n * 4), memcpy(v[k], v0, (size_t)n * 4);
    }
    for (int64_t t = 1; t <= 3; t++) {
        tu_fill_normal(&r, g, n, 1.0);
        TU_OK(be()->ops->adamw(be(), p[0], g, m[0], v[0], ADAM_SEGS, ADAM_NSEGS, lr, b1, b2, eps, wd, gs, t));
        for (int s = 0; s < ADAM_NSEGS; s++) {
            TU_OK(be()->ops->adamw(be(), p[1], g, m[1], v[1], &ADAM_SEGS[s], 1, lr, b1, b2, eps, wd, gs, t));
            for (int64_t i = ADAM_SEGS[s].offset; i < ADAM_SEGS[s].offset + ADAM_SEGS[s].numel; i++)
                adamw_expr(p[2], g, m[2], v[2], i, lr, b1, b2, eps, ADAM_SEGS[s].decay ? wd : 0.0f, gs, t);
        }
    }
    int64_t covered = 0;
    for (int s = 0; s < ADAM_NSEGS; s++) covered += ADAM_SEGS[s].numel;
    int64_t moved = 0;
    for (int64_t i = 0; i < n; i++) moved += memcmp(&p[0][i], &p0[i], 4) != 0;
    cr_expect_eq(moved, covered, "%lld parameters changed, the segments hold %lld", (long long)moved,
                 (long long)covered);
    const char *what[3] = {"p", "m", "v"};
    for (int k = 1; k < 3; k++)
        for (int a = 0; a < 3; a++) {
            const float *x = a == 0 ? p[0] : a == 1 ? m[0] : v[0], *y = a == 0 ? p[k] : a == 1 ? m[k] : v[k];
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < n; i++)
                if (memcmp(&x[i], &y[i], 4) != 0 && bad++ == 0) first = i;
            cr_expect_eq(bad, 0, "adamw %s: %lld elements differ from %s, first %lld: %a vs %a", what[a],
                         (long long)bad, k == 1 ? "the per-segment calls" : "the fp32 expression", (long long)first,
                         first >= 0 ? x[first] : 0.0f, first >= 0 ? y[first] : 0.0f);
        }
    for (int k = 0; k < 3; k++) free(p[k]), free(m[k]), free(v[k]);
    free(g), free(p0), free(m0), free(v0);
}

/* A table the op cannot run (ops.h: sorted, disjoint, numel >= 0) is refused before any
 * element moves; an empty table does nothing. */
Test(ops_adamw, malformed_tables_are_refused) {
    float p[16] = {1.0f}, g[16] = {1.0f}, m[16] = {0}, v[16] = {0};
    const mt_adamw_segment overlap[2] = {{0, 8, 1, 0}, {7, 4, 1, 0}};
    const mt_adamw_segment unsorted[2] = {{8, 4, 1, 0}, {0, 4, 1, 0}};
    const mt_adamw_segment negative[1] = {{0, -1, 1, 0}};
    cr_expect_eq(be()->ops->adamw(be(), p, g, m, v, overlap, 2, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1),
                 MT_ERR_INVALID);
    cr_expect_eq(be()->ops->adamw(be(), p, g, m, v, unsorted, 2, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1),
                 MT_ERR_INVALID);
    cr_expect_eq(be()->ops->adamw(be(), p, g, m, v, negative, 1, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1),
                 MT_ERR_INVALID);
    cr_expect_eq(be()->ops->adamw(be(), p, g, m, v, NULL, 2, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1),
                 MT_ERR_INVALID);
    TU_OK(be()->ops->adamw(be(), p, g, m, v, NULL, 0, 0.1f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1));
    cr_expect(p[0] == 1.0f && m[0] == 0.0f && v[0] == 0.0f, "a refused or empty call changed p[0], m[0] or v[0]");
}

/* ------------------------------------------------------------------ determinism */

/* Sizes above the ops' parallel thresholds, run with 1 and with 2 OpenMP threads: the
 * reductions (rmsnorm dw, embedding scatter-add, sumsq, the loss sum) must not move. */
Test(ops_determinism, thread_count_does_not_change_bits) {
    tu_rng r = {99};
    const int64_t N = 300, D = 200, V = 50;
    float *x = tu_falloc(N * D), *w = tu_falloc(D), *dy = tu_falloc(N * D), *rs = tu_falloc(N);
    float *y = tu_falloc(N * D);
    tu_fill_normal(&r, x, N * D, 1.0);
    tu_fill_normal(&r, w, D, 1.0);
    tu_fill_normal(&r, dy, N * D, 1.0);
    int32_t *tok = calloc((size_t)N, sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) tok[i] = (int32_t)tu_below(&r, V);
    int32_t *lab = calloc((size_t)N, sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) lab[i] = (int32_t)tu_below(&r, D);
    float *dx[2], *dw[2], *dt[2], *lg[2];
    double ss[2], loss[2], *vs[2];
    float *vz[2], *vm = tu_falloc(N);
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        dx[t] = tu_falloc(N * D);
        dw[t] = tu_falloc(D);
        dt[t] = tu_falloc(V * D);
        lg[t] = tu_falloc(N * D);
        TU_OK(be()->ops->rmsnorm_fwd(be(), y, rs, x, w, N, D, 1e-6f, 1.0f, MT_F32));
        TU_OK(be()->ops->rmsnorm_bwd(be(), dx[t], dw[t], dy, x, w, rs, N, D, 1.0f, MT_F32));
        TU_OK(be()->ops->embedding_bwd(be(), dt[t], dy, tok, N, 0, V, D, 3.0f, MT_F32));
        ss[t] = tu_sumsq(be(), x, N * D);
        memcpy(lg[t], x, (size_t)(N * D) * sizeof(float));
        double stats[2] = {0.0, 0.0};
        TU_OK(be()->ops->xent_tile(be(), lg[t], lg[t], MT_F32, lab, N, D, 0.0f, -1, 0.1f, stats));
        loss[t] = stats[0];
        /* the vocab-parallel phases on the same tile as the slice [D / 2, D / 2 + D) of a
         * group's vocabulary (labels in and out of it), soft-capped */
        vz[t] = tu_falloc(N * D);
        vs[t] = tu_dalloc(2 * N + 2);
        memcpy(vz[t], x, (size_t)(N * D) * sizeof(float));
        TU_OK(be()->ops->vocab_tile_max(be(), vz[t], N, D, 3.0f, vm, 0));
        TU_OK(be()->ops->vocab_tile_sumexp(be(), vz[t], N, D, vm, lab, D / 2, -1, vs[t], 0));
        TU_OK(be()->ops->vocab_tile_grad(be(), vz[t], N, D, vm, vs[t], lab, D / 2, -1, 3.0f, 0.1f, 1, vs[t] + 2 * N));
    }
    cr_expect(tu_bitwise_equal(dx[0], dx[1], N * D), "rmsnorm_bwd dx");
    cr_expect(tu_bitwise_equal(dw[0], dw[1], D), "rmsnorm_bwd dw");
    cr_expect(tu_bitwise_equal(dt[0], dt[1], V * D), "embedding_bwd");
    cr_expect(memcmp(&ss[0], &ss[1], sizeof(double)) == 0, "sumsq");
    cr_expect(memcmp(&loss[0], &loss[1], sizeof(double)) == 0, "xent_tile loss");
    cr_expect(tu_bitwise_equal(lg[0], lg[1], N * D), "xent_tile dlogits");
    cr_expect(memcmp(vs[0], vs[1], (size_t)(2 * N + 2) * sizeof(double)) == 0, "vocab_tile_sumexp sz, grad stats");
    cr_expect(tu_bitwise_equal(vz[0], vz[1], N * D), "vocab_tile_grad dlogits");
    free(vm);
    for (int t = 0; t < 2; t++) {
        free(vz[t]);
        free(vs[t]);
        free(dx[t]);
        free(dw[t]);
        free(dt[t]);
        free(lg[t]);
    }
    free(x);
    free(w);
    free(dy);
    free(rs);
    free(y);
    free(tok);
    free(lab);
}

/* ------------------------------------------------------------------ vmath.h exp */

#include <math.h>
#include <string.h>

#include "kernels/cpu/vmath.h"

/* Distance in units in the last place between two finite positive floats. */
static int64_t test_ulps(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return ia > ib ? (int64_t)ia - ib : (int64_t)ib - ia;
}

/* The largest ulp error of exp over [-87, 88] (2^20 evenly spaced points plus every
 * float in [-1, 1] at stride 97), against libm's exp in double, for the plain and, where
 * the CPU has FMA, the fused variant (evaluated in a function compiled for FMA). */
#define TEST_EXP_SCAN(EXP, worst)                                                      \
    do {                                                                               \
        for (int64_t i = 0; i <= (1 << 20); i++) {                                     \
            const float x = -87.0f + 175.0f * (float)i / (float)(1 << 20);             \
            const int64_t u = test_ulps(EXP(x), (float)exp((double)x));                \
            if (u > *(worst)) *(worst) = u;                                            \
        }                                                                              \
        for (float x = -1.0f; x <= 1.0f; x = nextafterf(x, 2.0f)) {                    \
            const int64_t u = test_ulps(EXP(x), (float)exp((double)x));                \
            if (u > *(worst)) *(worst) = u;                                            \
            for (int s = 0; s < 96 && x <= 1.0f; s++) x = nextafterf(x, 2.0f);         \
        }                                                                              \
    } while (0)

static void test_exp_scan_plain(int64_t *worst) { TEST_EXP_SCAN(mt_vexpf, worst); }
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void test_exp_scan_fma(int64_t *worst) {
    TEST_EXP_SCAN(mt_vexpf_fma, worst);
}
__attribute__((target("avx2,fma"))) static float test_expf_fma(float x) { return mt_vexpf_fma(x); }
#endif

/* The bound the glu, loss and attention tolerances assume for vmath.h's tanh: within 8u
 * absolute of the exact value (|tanh| < 1), over [-12, 12] (2^20 evenly spaced points plus
 * every float in [-1, 1] at stride 97; beyond, both are +-1). The plain variant is the one
 * every caller's clone inlines; FMA contraction changes its last bit at most. */
Test(vmath, tanh_abs_error) {
    double worst = 0.0;
    for (int64_t i = 0; i <= (1 << 20); i++) {
        const float x = -12.0f + 24.0f * (float)i / (float)(1 << 20);
        worst = fmax(worst, fabs((double)mt_vtanhf(x) - tanh((double)x)));
    }
    for (float x = -1.0f; x <= 1.0f; x = nextafterf(x, 2.0f)) {
        worst = fmax(worst, fabs((double)mt_vtanhf(x) - tanh((double)x)));
        for (int s = 0; s < 96 && x <= 1.0f; s++) x = nextafterf(x, 2.0f);
    }
    if (getenv("MT_TEST_VERBOSE")) fprintf(stderr, "  mt_vtanhf     max abs error %.2f u\n", worst / 0x1p-24);
    cr_assert_leq(worst, 8 * 0x1p-24, "mt_vtanhf: %.3g u", worst / 0x1p-24);
}

Test(vmath, exp_ulp_error_and_edges) {
    /* Cephes expf is documented at about 2 ulp; measured here 1 ulp for both variants
     * (fused steps change single results by at most 1 ulp). Bound: 2 ulp. */
    int64_t worst = 0;
    test_exp_scan_plain(&worst);
    if (getenv("MT_TEST_VERBOSE")) fprintf(stderr, "  mt_vexpf      max %lld ulp\n", (long long)worst);
    cr_assert_leq(worst, 2, "mt_vexpf: %lld ulp", (long long)worst);
    cr_assert_eq(mt_vexpf(-INFINITY), 0.0f);
    cr_assert_eq(mt_vexpf(-100.0f), 0.0f);
    cr_assert_eq(mt_vexpf(0.0f), 1.0f);
    cr_assert(isnan(mt_vexpf(NAN)));
    cr_assert_eq(mt_vexpf(100.0f), 0x1p127f);
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        worst = 0;
        test_exp_scan_fma(&worst);
        if (getenv("MT_TEST_VERBOSE")) fprintf(stderr, "  mt_vexpf_fma  max %lld ulp\n", (long long)worst);
        cr_assert_leq(worst, 2, "mt_vexpf_fma: %lld ulp", (long long)worst);
        cr_assert_eq(test_expf_fma(-INFINITY), 0.0f);
        cr_assert_eq(test_expf_fma(-100.0f), 0.0f);
        cr_assert_eq(test_expf_fma(0.0f), 1.0f);
        cr_assert(isnan(test_expf_fma(NAN)));
        cr_assert_eq(test_expf_fma(100.0f), 0x1p127f);
    }
#endif
}
