/* tests/test_ops_bf16.c: the CPU backend's ops with bf16 tensors (kernels/ops.h "Dtypes").
 *
 * Every case draws its inputs, rounds them to bf16 (so the kernel and the reference see
 * the same values), runs the op with MT_BF16 and compares the widened result with an fp64
 * reference computed here from those values. Each bound is derived, never measured:
 * the op computes in fp32 exactly as the fp32 path does, so its fp32 result lies within
 * e32 of the reference, e32 being the fp32 analysis of tests/test_ops.c (restated at each
 * case; u = 2^-24, gamma_n = n u / (1 - n u), Higham Eq. 3.5); rounding that result once
 * to nearest even moves it by at most UBF16 = 2^-8 of its magnitude (tests/test_ops_util.h:
 * half an ulp, ulp(x) <= 2^-7 |x|), and that magnitude is at most |want| + e32. So
 *     |got - want| <= e32 + UBF16 (|want| + e32)            (check_bf16 below).
 * The bounds can fail: check_bf16 also requires that values truncated instead of rounded
 * (an error of up to one ulp) break the bound somewhere, and some cases check that an
 * extra rounding of an intermediate (rounding twice) breaks it too.
 * On top, each op is checked against the CPU backend's own definition of bf16
 * (kernels/cpu/cpu_ops.h): bitwise the fp32 op on the widened inputs, rounded once.
 * Attention's bf16 cases are in tests/test_ops_attention.c, beside the reference and the
 * bounds they share. MT_TEST_VERBOSE=1 prints every error next to its bound. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"

#include "kernels/backend.h"
#include "runtime/rng.h"
#include "tests/test_ops_util.h"

static mt_backend *be(void) { return mt_cpu_backend(); }

/* max_i |vals_i - want_i| / (e32_i + UBF16 (|want_i| + e32_i) + 1e-30): at most 1 when
 * every value is an fp32 result within e32_i of want_i, rounded once to bf16. */
static double bf16_ratio(const float *vals, const double *want, const double *e32, int64_t n) {
    double w = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double b = e32[i] + UBF16 * (fabs(want[i]) + e32[i]) + 1e-30;
        const double d = fabs((double)vals[i] - want[i]) / b;
        if (d != d) return NAN;
        w = d > w ? d : w;
    }
    return w;
}

/* The bf16 result got[n] against want within the bound above; and the bound is tight
 * enough to fail: want's fp32 values truncated to bf16 (round toward zero, up to one ulp
 * off, as a store that forgot to round would leave them) must break it somewhere. */
static void check_bf16(const char *what, const mt_bf16 *got, const double *want, const double *e32, int64_t n) {
    float *g = tu_falloc(n), *t = tu_falloc(n);
    tu_widen(g, got, n);
    for (int64_t i = 0; i < n; i++) {
        const float f = (float)want[i];
        uint32_t b;
        memcpy(&b, &f, 4);
        b &= 0xffff0000u;
        memcpy(&t[i], &b, 4);
    }
    char w[128];
    snprintf(w, sizeof w, "%s / bf16 bound", what);
    EXPECT_ERR(w, bf16_ratio(g, want, e32, n), 1.0);
    const double tr = bf16_ratio(t, want, e32, n);
    cr_expect(tr > 1.0, "%s: truncated values pass the bound (ratio %.3f): it could not fail", what, tr);
    free(g);
    free(t);
}

/* Bitwise equality of a bf16 result and fp32 values rounded once to nearest even. */
static int bf16_is_rounded(const mt_bf16 *got, const float *f32, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (got[i] != mt_f32_to_bf16(f32[i])) return 0;
    return 1;
}

/* An fp32 array of n bf16 values: std * N(0, 1), rounded to bf16. */
static float *bf16_normal(tu_rng *r, int64_t n, double std) {
    float *x = tu_falloc(n);
    tu_fill_normal(r, x, n, std);
    tu_round_bf16(x, n);
    return x;
}

/* ------------------------------------------------------------------ gemm */

/* C = alpha op(A) op(B) + beta C with A, B bf16 and C of c_dt (row strides padded, so
 * that lda, ldb, ldc differ from the widths). Each entry's fp32 value: K exact products
 * (bf16 x bf16 fits fp32), the sums, alpha and beta in any order and K slicing:
 * e32 = gamma_(K+2) (|alpha| sum_k |a b| + |beta c|) (test_ops.c gemm_case); a bf16 C
 * is that value rounded once. With beta == 0, C holds NaN and must not be read. */
/* dense: leading dimensions equal to the rows (the model's operands; oneDNN takes those
 * on AMX CPUs), else padded strides (OpenBLAS on widened operands). */
static void gemm_case(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta, mt_dtype c_dt,
                      int dense) {
    tu_rng r = {1000 + (uint64_t)(ta * 2 + tb) + (uint64_t)(c_dt * 4) + (uint64_t)(beta != 0.0f) * 8};
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    const int64_t lda = ac + (dense ? 0 : 3), ldb = bc + (dense ? 0 : 2), ldc = N + (dense ? 0 : 5);
    float *A = bf16_normal(&r, ar * lda, 1.0), *B = bf16_normal(&r, br * ldb, 1.0);
    float *C = bf16_normal(&r, M * ldc, 1.0);
    if (beta == 0.0f)
        for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN;
    mt_bf16 *Ah = tu_bf16_copy(A, ar * lda), *Bh = tu_bf16_copy(B, br * ldb), *Ch = tu_bf16_copy(C, M * ldc);
    float *Cf = tu_falloc(M * ldc);
    memcpy(Cf, C, (size_t)(M * ldc) * sizeof(float));
    double *want = tu_dalloc(M * N), *e32 = tu_dalloc(M * N);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0.0, sa = 0.0;
            for (int64_t k = 0; k < K; k++) {
                const double a = ta ? A[k * lda + i] : A[i * lda + k];
                const double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
                sa += fabs(a * b);
            }
            const double c = beta != 0.0f ? (double)beta * C[i * ldc + j] : 0.0;
            want[i * N + j] = alpha * s + c;
            e32[i * N + j] = GAMMA(K + 2) * (fabs(alpha) * sa + fabs(c));
        }
    void *Cp = c_dt == MT_BF16 ? (void *)Ch : (void *)Cf;
    TU_OK(be()->ops->gemm(be(), ta, tb, M, N, K, alpha, Ah, lda, Bh, ldb, MT_BF16, beta, Cp, ldc, c_dt));
    char what[96];
    snprintf(what, sizeof what, "gemm bf16 -> %s ta=%d tb=%d M=%ld K=%ld beta=%g%s", mt_dtype_name(c_dt), ta, tb,
             (long)M, (long)K, beta, dense ? " dense" : "");
    int pad_kept = 1;
    if (c_dt == MT_BF16) {
        mt_bf16 *got = calloc((size_t)(M * N), sizeof(mt_bf16));
        for (int64_t i = 0; i < M; i++) {
            memcpy(got + i * N, Ch + i * ldc, (size_t)N * sizeof(mt_bf16));
            for (int64_t j = N; j < ldc; j++) pad_kept &= Ch[i * ldc + j] == mt_f32_to_bf16(C[i * ldc + j]);
        }
        check_bf16(what, got, want, e32, M * N);
        free(got);
    } else {
        float *got = tu_falloc(M * N);
        for (int64_t i = 0; i < M; i++) {
            memcpy(got + i * N, Cf + i * ldc, (size_t)N * sizeof(float));
            for (int64_t j = N; j < ldc; j++) pad_kept &= memcmp(&Cf[i * ldc + j], &C[i * ldc + j], 4) == 0;
        }
        EXPECT_ERR(what, tu_bound_ratio(got, want, e32, M * N), 1.0);
        free(got);
    }
    cr_expect(pad_kept, "%s: C's padding columns changed", what);
    free(A), free(B), free(C), free(Ah), free(Bh), free(Ch), free(Cf), free(want), free(e32);
}

Test(ops_bf16_gemm, dtype_combinations_and_transposes) {
    /* M = 300 > 256 rows and K = 530 > 512 cross the CPU's bf16 tiles and K slices */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int dense = 0; dense < 2; dense++) {
                gemm_case(ta, tb, 300, 17, 530, 0.7f, -1.3f, MT_F32, dense);
                gemm_case(ta, tb, 300, 17, 530, 0.7f, 0.6f, MT_BF16, dense); /* round(alpha AB + beta float(C)) */
                gemm_case(ta, tb, 13, 11, 37, 1.0f, 0.0f, MT_BF16, dense);   /* beta = 0: NaN C not read */
                gemm_case(ta, tb, 13, 11, 37, 1.0f, 0.0f, MT_F32, dense);
            }
    gemm_case(0, 1, 5, 300, 9, -0.5f, 2.0f, MT_BF16, 0); /* N = 300 > 256 columns */
    gemm_case(0, 1, 5, 300, 9, -0.5f, 2.0f, MT_BF16, 1);
}

Test(ops_bf16_gemm, empty_k_and_bad_dtypes) {
    /* K = 0: C = round(beta float(C)); beta = 0 writes zeros without reading C */
    float c[6] = {1, 2, 3, 4, 5, 6};
    mt_bf16 C[6], D[6], A[1] = {0}, B[1] = {0};
    for (int i = 0; i < 6; i++) C[i] = mt_f32_to_bf16(c[i]), D[i] = 0x7fc0; /* NaN */
    TU_OK(be()->ops->gemm(be(), 0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, MT_BF16, 0.3f, C, 3, MT_BF16));
    for (int i = 0; i < 6; i++) cr_expect_eq(C[i], mt_f32_to_bf16(0.3f * c[i]));
    TU_OK(be()->ops->gemm(be(), 0, 0, 2, 3, 0, 1.0f, A, 1, B, 3, MT_BF16, 0.0f, D, 3, MT_BF16));
    for (int i = 0; i < 6; i++) cr_expect_eq(D[i], 0);
    /* only (f32, f32), (bf16, f32) and (bf16, bf16) */
    const mt_dtype bad[3][2] = {{MT_F32, MT_BF16}, {MT_BF16, MT_F16}, {MT_F16, MT_F32}};
    float F[16] = {0};
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(be()->ops->gemm(be(), 0, 0, 2, 2, 2, 1.0f, F, 2, F, 2, bad[i][0], 0.0f, F, 2, bad[i][1]),
                     MT_ERR_INVALID);
        char a[32], c[32]; /* "of float16" is no part of "of bfloat16" */
        snprintf(a, sizeof a, "of %s", mt_dtype_name(bad[i][0]));
        snprintf(c, sizeof c, "of %s", mt_dtype_name(bad[i][1]));
        cr_expect(strstr(mt_last_error(), "gemm") && strstr(mt_last_error(), a) && strstr(mt_last_error(), c), "%s",
                  mt_last_error());
    }
}

/* ------------------------------------------------------------------ embedding */

Test(ops_bf16_embedding, forward_and_backward) {
    tu_rng r = {21};
    const int64_t V = 50, D = 300, N = 120; /* N D >= 32768: threads; D spans 5 column blocks */
    const float scale = mt_bf16_to_f32(mt_f32_to_bf16(sqrtf((float)D))); /* Gemma: sqrt(D) in bf16 */
    int32_t tok[120];
    for (int64_t n = 0; n < N; n++) tok[n] = (int32_t)tu_below(&r, 12); /* many repeats */
    float *table = bf16_normal(&r, V * D, 1.0), *dout = bf16_normal(&r, N * D, 1.0);
    float *dt0 = tu_falloc(V * D), *dt = tu_falloc(V * D), *dt32 = tu_falloc(V * D), *out32 = tu_falloc(N * D);
    tu_fill_normal(&r, dt0, V * D, 1.0);
    memcpy(dt, dt0, (size_t)(V * D) * sizeof(float));
    memcpy(dt32, dt0, (size_t)(V * D) * sizeof(float));
    mt_bf16 *th = tu_bf16_copy(table, V * D), *dh = tu_bf16_copy(dout, N * D);
    mt_bf16 *out = calloc((size_t)(N * D), sizeof(mt_bf16));

    TU_OK(be()->ops->embedding_fwd(be(), out, th, tok, N, 0, V, D, scale, MT_BF16));
    /* one fp32 product: e32 = u |scale t| */
    double *want = tu_dalloc(N * D), *e32 = tu_dalloc(N * D);
    for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++) {
            want[n * D + d] = (double)scale * table[tok[n] * D + d];
            e32[n * D + d] = U32 * fabs(want[n * D + d]);
        }
    check_bf16("embedding_fwd", out, want, e32, N * D);
    TU_OK(be()->ops->embedding_fwd(be(), out32, table, tok, N, 0, V, D, scale, MT_F32));
    cr_expect(bf16_is_rounded(out, out32, N * D), "embedding_fwd: the fp32 product rounded once");

    /* dtable (fp32) += scale sum_n dout[n]: c_v products and adds onto dtable0:
     * gamma_(c_v + 1) (|dtable0| + sum_n |scale dout|) (test_ops.c) */
    TU_OK(be()->ops->embedding_bwd(be(), dt, dh, tok, N, 0, V, D, scale, MT_BF16));
    double *wb = tu_dalloc(V * D), *bb = tu_dalloc(V * D);
    int64_t cnt[50] = {0};
    for (int64_t n = 0; n < N; n++) cnt[tok[n]]++;
    for (int64_t i = 0; i < V * D; i++) wb[i] = dt0[i], bb[i] = fabs((double)dt0[i]);
    for (int64_t n = 0; n < N; n++)
        for (int64_t d = 0; d < D; d++) {
            wb[tok[n] * D + d] += (double)scale * dout[n * D + d];
            bb[tok[n] * D + d] += fabs((double)scale * dout[n * D + d]);
        }
    for (int64_t i = 0; i < V * D; i++) bb[i] = GAMMA(cnt[i / D] + 1) * bb[i] + 1e-30;
    EXPECT_ERR("embedding_bwd bf16 dout (+=) / bound", tu_bound_ratio(dt, wb, bb, V * D), 1.0);
    TU_OK(be()->ops->embedding_bwd(be(), dt32, dout, tok, N, 0, V, D, scale, MT_F32));
    cr_expect(tu_bitwise_equal(dt, dt32, V * D), "embedding_bwd: the fp32 path on the widened dout");
    free(table), free(dout), free(dt0), free(dt), free(dt32), free(out32), free(th), free(dh), free(out);
    free(want), free(e32), free(wb), free(bb);
}

/* ------------------------------------------------------------------ rmsnorm */

static void rmsnorm_case(int64_t N, int64_t D, float eps, float w_off) {
    tu_rng r = {(uint64_t)(N * 1000 + D) + 5};
    float *x = bf16_normal(&r, N * D, 2.0), *w = bf16_normal(&r, D, 0.5), *dy = bf16_normal(&r, N * D, 1.0);
    float *dx0 = bf16_normal(&r, N * D, 0.1), *dw0 = tu_falloc(D), *dw = tu_falloc(D), *dw32 = tu_falloc(D);
    tu_fill_normal(&r, dw0, D, 0.1);
    memcpy(dw, dw0, (size_t)D * sizeof(float));
    memcpy(dw32, dw0, (size_t)D * sizeof(float));
    mt_bf16 *xh = tu_bf16_copy(x, N * D), *wh = tu_bf16_copy(w, D), *dyh = tu_bf16_copy(dy, N * D);
    mt_bf16 *dxh = tu_bf16_copy(dx0, N * D), *y = calloc((size_t)(N * D), sizeof(mt_bf16));
    float *rstd = tu_falloc(N), *y32 = tu_falloc(N * D), *rstd32 = tu_falloc(N), *dx32 = tu_falloc(N * D);
    memcpy(dx32, dx0, (size_t)(N * D) * sizeof(float));
    char what[96];

    TU_OK(be()->ops->rmsnorm_fwd(be(), y, rstd, xh, wh, N, D, eps, w_off, MT_BF16));
    /* rstd: fp64 mean square and 1/sqrt, one rounding to fp32: gamma_2 |rstd|. y =
     * (x r)(w_off + w): r's gamma_2 and three fp32 roundings: e32 = gamma_5 |y|. */
    double *rr = tu_dalloc(N), *want = tu_dalloc(N * D), *e32 = tu_dalloc(N * D), *rb = tu_dalloc(N);
    for (int64_t n = 0; n < N; n++) {
        double ss = 0.0;
        for (int64_t d = 0; d < D; d++) ss += (double)x[n * D + d] * x[n * D + d];
        rr[n] = 1.0 / sqrt(ss / (double)D + (double)eps);
        rb[n] = GAMMA(2) * rr[n];
        for (int64_t d = 0; d < D; d++) {
            want[n * D + d] = x[n * D + d] * rr[n] * ((double)w_off + w[d]);
            e32[n * D + d] = GAMMA(5) * fabs(want[n * D + d]);
        }
    }
    snprintf(what, sizeof what, "rmsnorm_fwd y N=%ld D=%ld w_offset=%g", (long)N, (long)D, w_off);
    check_bf16(what, y, want, e32, N * D);
    snprintf(what, sizeof what, "rmsnorm_fwd rstd (fp32) N=%ld D=%ld / bound", (long)N, (long)D);
    EXPECT_ERR(what, tu_bound_ratio(rstd, rr, rb, N), 1.0);
    TU_OK(be()->ops->rmsnorm_fwd(be(), y32, rstd32, x, w, N, D, eps, w_off, MT_F32));
    cr_expect(bf16_is_rounded(y, y32, N * D), "rmsnorm_fwd: the fp32 y rounded once");
    cr_expect(tu_bitwise_equal(rstd, rstd32, N), "rmsnorm_fwd: rstd as the fp32 path");

    TU_OK(be()->ops->rmsnorm_bwd(be(), dxh, dw, dyh, xh, wh, rstd, N, D, w_off, MT_BF16));
    /* dx = round(float(dx0) + r g - x k), g = dy w', k = r^3 sum_d(g x) / D, with the
     * forward's fp32 r: e32 = gamma_11 (|dx0| + r |g| + |x| r^3 sum_d |g x| / D)
     * (test_ops.c rmsnorm_case); the reference is the analytic gradient in fp64. */
    for (int64_t n = 0; n < N; n++) {
        double c = 0.0, ca = 0.0;
        for (int64_t d = 0; d < D; d++) {
            const double g = dy[n * D + d] * ((double)w_off + w[d]);
            c += g * x[n * D + d];
            ca += fabs(g * x[n * D + d]);
        }
        const double r3 = rr[n] * rr[n] * rr[n] / (double)D;
        for (int64_t d = 0; d < D; d++) {
            const int64_t i = n * D + d;
            const double g = dy[i] * ((double)w_off + w[d]);
            want[i] = dx0[i] + rr[n] * g - x[i] * r3 * c;
            e32[i] = GAMMA(11) * (fabs((double)dx0[i]) + rr[n] * fabs(g) + fabs((double)x[i]) * r3 * ca);
        }
    }
    snprintf(what, sizeof what, "rmsnorm_bwd dx (+=) N=%ld D=%ld w_offset=%g", (long)N, (long)D, w_off);
    check_bf16(what, dxh, want, e32, N * D);
    /* dw (fp32) += sum_n dy x r: gamma_37 (|dw0| + sum_n |dy x r|) (test_ops.c) */
    double *wd = tu_dalloc(D), *bd = tu_dalloc(D);
    for (int64_t d = 0; d < D; d++) {
        double s = dw0[d], sa = fabs((double)dw0[d]);
        for (int64_t n = 0; n < N; n++) {
            s += (double)dy[n * D + d] * x[n * D + d] * rr[n];
            sa += fabs((double)dy[n * D + d] * x[n * D + d] * rr[n]);
        }
        wd[d] = s;
        bd[d] = GAMMA(37) * sa;
    }
    snprintf(what, sizeof what, "rmsnorm_bwd dw (fp32, +=) N=%ld D=%ld / bound", (long)N, (long)D);
    EXPECT_ERR(what, tu_bound_ratio(dw, wd, bd, D), 1.0);
    TU_OK(be()->ops->rmsnorm_bwd(be(), dx32, dw32, dy, x, w, rstd, N, D, w_off, MT_F32));
    cr_expect(bf16_is_rounded(dxh, dx32, N * D), "rmsnorm_bwd: the fp32 dx (+= in fp32) rounded once");
    cr_expect(tu_bitwise_equal(dw, dw32, D), "rmsnorm_bwd: dw as the fp32 path");
    free(x), free(w), free(dy), free(dx0), free(dw0), free(dw), free(dw32), free(xh), free(wh), free(dyh);
    free(dxh), free(y), free(rstd), free(y32), free(rstd32), free(dx32), free(rr), free(want), free(e32), free(rb);
    free(wd), free(bd);
}

Test(ops_bf16_rmsnorm, llama_and_gemma_forms) {
    rmsnorm_case(7, 33, 1e-5f, 0.0f);   /* D not a multiple of the vector width */
    rmsnorm_case(50, 700, 1e-6f, 1.0f); /* Gemma (1 + w); threads; three dw column blocks */
}

/* ------------------------------------------------------------------ rope */

Test(ops_bf16_rope, forward_and_vjp) {
    tu_rng r = {31};
    const int64_t N = 5, H = 3, Dh = 288, half = Dh / 2, n = N * H * Dh; /* Dh/2 > one 128 chunk */
    float *x = bf16_normal(&r, n, 1.0), *dy = bf16_normal(&r, n, 1.0), *inv = tu_falloc(half);
    int32_t pos[5];
    for (int64_t i = 0; i < N; i++) pos[i] = (int32_t)tu_below(&r, 8192);
    for (int64_t i = 0; i < half; i++) inv[i] = (float)pow(10000.0, -2.0 * (double)i / (double)Dh);
    mt_bf16 *xh = tu_bf16_copy(x, n), *dyh = tu_bf16_copy(dy, n);
    float *x32 = tu_falloc(n), *dy32 = tu_falloc(n);
    memcpy(x32, x, (size_t)n * sizeof(float));
    memcpy(dy32, dy, (size_t)n * sizeof(float));
    TU_OK(be()->ops->rope_fwd(be(), xh, pos, inv, N, H, Dh, MT_BF16));
    TU_OK(be()->ops->rope_bwd(be(), dyh, pos, inv, N, H, Dh, MT_BF16));
    /* theta = float(pos) inv_freq in fp32 (as HF, the kernel and here), cos and sin in
     * fp64; the backward rotates by -theta. Each output a c -+ b s: cosf/sinf (2 ulp), two
     * products and the sum: e32 = gamma_6 (|a| + |b|) over the pair (test_ops.c). */
    double *wf = tu_dalloc(n), *ef = tu_dalloc(n), *wb = tu_dalloc(n), *eb = tu_dalloc(n);
    for (int64_t t = 0; t < N; t++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < half; i++) {
                const int64_t a = (t * H + h) * Dh + i, b = a + half;
                const double th = (double)((float)pos[t] * inv[i]), c = cos(th), s = sin(th);
                wf[a] = x[a] * c - x[b] * s;
                wf[b] = x[b] * c + x[a] * s;
                wb[a] = dy[a] * c + dy[b] * s;
                wb[b] = dy[b] * c - dy[a] * s;
                ef[a] = ef[b] = GAMMA(6) * (fabs((double)x[a]) + fabs((double)x[b]));
                eb[a] = eb[b] = GAMMA(6) * (fabs((double)dy[a]) + fabs((double)dy[b]));
            }
    check_bf16("rope_fwd", xh, wf, ef, n);
    check_bf16("rope_bwd", dyh, wb, eb, n);
    TU_OK(be()->ops->rope_fwd(be(), x32, pos, inv, N, H, Dh, MT_F32));
    TU_OK(be()->ops->rope_bwd(be(), dy32, pos, inv, N, H, Dh, MT_F32));
    cr_expect(bf16_is_rounded(xh, x32, n), "rope_fwd: the fp32 rotation rounded once");
    cr_expect(bf16_is_rounded(dyh, dy32, n), "rope_bwd: the fp32 rotation rounded once");
    free(x), free(dy), free(inv), free(xh), free(dyh), free(x32), free(dy32), free(wf), free(ef), free(wb);
    free(eb);
}

/* ------------------------------------------------------------------ glu */

static void glu_case(mt_activation act) {
    tu_rng r = {200 + (uint64_t)act};
    const int64_t n = 20000; /* threads; several 4096 blocks and 512-element widenings */
    float *g = bf16_normal(&r, n, 3.0), *u = bf16_normal(&r, n, 1.0), *dh = bf16_normal(&r, n, 1.0);
    g[0] = -100.0f, g[1] = -30.0f, g[2] = 30.0f, g[3] = 100.0f, g[4] = 0.0f; /* saturated tails */
    mt_bf16 *gh = tu_bf16_copy(g, n), *uh = tu_bf16_copy(u, n), *dhh = tu_bf16_copy(dh, n);
    mt_bf16 *h = calloc((size_t)n, 2), *dg = calloc((size_t)n, 2), *du = calloc((size_t)n, 2);
    float *h32 = tu_falloc(n), *dg32 = tu_falloc(n), *du32 = tu_falloc(n);
    TU_OK(be()->ops->glu_fwd(be(), h, gh, uh, n, act, MT_BF16));
    TU_OK(be()->ops->glu_bwd(be(), dg, du, dhh, gh, uh, n, act, MT_BF16));
    /* fp32 analysis of test_ops.c glu_case (vmath.h's exp 2 ulp, tanh 8u absolute):
     * h within gamma_9 (1 + |g|) |up|, dup within gamma_9 (1 + |g|) |dh|, dgate within
     * gamma_20 (1 + |g|)(1 + g^2) |dh up|; references: act and act' in fp64. */
    double *wh = tu_dalloc(n), *eh = tu_dalloc(n), *wg = tu_dalloc(n), *eg = tu_dalloc(n);
    double *wu = tu_dalloc(n), *eu = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) {
        const double a = 1.0 + fabs((double)g[i]);
        wh[i] = tu_act_ref(g[i], act) * u[i];
        eh[i] = GAMMA(9) * a * fabs((double)u[i]);
        wg[i] = (double)dh[i] * u[i] * tu_act_grad_ref(g[i], act);
        eg[i] = GAMMA(20) * a * (1.0 + (double)g[i] * g[i]) * fabs((double)dh[i] * u[i]);
        wu[i] = (double)dh[i] * tu_act_ref(g[i], act);
        eu[i] = GAMMA(9) * a * fabs((double)dh[i]);
    }
    const char *name = act == MT_ACT_SILU ? "silu" : "gelu_tanh";
    char what[64];
    snprintf(what, sizeof what, "glu_fwd %s", name);
    check_bf16(what, h, wh, eh, n);
    snprintf(what, sizeof what, "glu_bwd %s dgate", name);
    check_bf16(what, dg, wg, eg, n);
    snprintf(what, sizeof what, "glu_bwd %s dup", name);
    check_bf16(what, du, wu, eu, n);
    /* rounding twice, act(g) to bf16 and then the product, must break the bound */
    float *h2 = tu_falloc(n);
    for (int64_t i = 0; i < n; i++)
        h2[i] = mt_bf16_to_f32(mt_f32_to_bf16(mt_bf16_to_f32(mt_f32_to_bf16((float)tu_act_ref(g[i], act))) * u[i]));
    const double r2 = bf16_ratio(h2, wh, eh, n);
    cr_expect(r2 > 1.0, "glu_fwd %s: an extra rounding of act(g) passes the bound (%.3f)", name, r2);
    TU_OK(be()->ops->glu_fwd(be(), h32, g, u, n, act, MT_F32));
    TU_OK(be()->ops->glu_bwd(be(), dg32, du32, dh, g, u, n, act, MT_F32));
    cr_expect(bf16_is_rounded(h, h32, n), "glu_fwd %s: the fp32 h rounded once", name);
    cr_expect(bf16_is_rounded(dg, dg32, n), "glu_bwd %s: the fp32 dgate rounded once", name);
    cr_expect(bf16_is_rounded(du, du32, n), "glu_bwd %s: the fp32 dup rounded once", name);
    free(g), free(u), free(dh), free(gh), free(uh), free(dhh), free(h), free(dg), free(du), free(h32), free(dg32);
    free(du32), free(wh), free(eh), free(wg), free(eg), free(wu), free(eu), free(h2);
}

Test(ops_bf16_glu, swiglu) { glu_case(MT_ACT_SILU); }
Test(ops_bf16_glu, geglu) { glu_case(MT_ACT_GELU_TANH); }

/* glu_bwd in place (dgate into gate, dup into up) is bitwise the out-of-place call, over
 * several blocks, threads and 512-element widenings. */
static void glu_in_place_case(mt_activation act) {
    tu_rng r = {210 + (uint64_t)act};
    const int64_t n = 20000;
    float *g = bf16_normal(&r, n, 3.0), *u = bf16_normal(&r, n, 1.0), *dh = bf16_normal(&r, n, 1.0);
    mt_bf16 *gh = tu_bf16_copy(g, n), *uh = tu_bf16_copy(u, n), *dhh = tu_bf16_copy(dh, n);
    mt_bf16 *dg = calloc((size_t)n, 2), *du = calloc((size_t)n, 2);
    TU_OK(be()->ops->glu_bwd(be(), dg, du, dhh, gh, uh, n, act, MT_BF16));
    TU_OK(be()->ops->glu_bwd(be(), gh, uh, dhh, gh, uh, n, act, MT_BF16)); /* gh <- dgate, uh <- dup */
    const char *name = act == MT_ACT_SILU ? "silu" : "gelu_tanh";
    cr_expect(memcmp(gh, dg, (size_t)n * 2) == 0, "glu_bwd %s: in-place dgate bitwise", name);
    cr_expect(memcmp(uh, du, (size_t)n * 2) == 0, "glu_bwd %s: in-place dup bitwise", name);
    free(g), free(u), free(dh), free(gh), free(uh), free(dhh), free(dg), free(du);
}

Test(ops_bf16_glu, swiglu_in_place) { glu_in_place_case(MT_ACT_SILU); }
Test(ops_bf16_glu, geglu_in_place) { glu_in_place_case(MT_ACT_GELU_TANH); }

/* ------------------------------------------------------------------ xent_tile */

/* fp32 logits, dlogits of ddt. The fp32 gradient is the fp32 path's (within
 * tu_xent_bounds' eg of the analytic one), so the bf16 dlogits are within
 * eg + UBF16 (|want| + eg); the loss stats do not depend on ddt. */
static void xent_case(float cap, double std) {
    tu_rng r = {300 + (uint64_t)cap};
    const int64_t R = 9, V = 301;
    const int32_t ignore = -100;
    const float dscale = 0.25f;
    int32_t labels[9];
    for (int64_t i = 0; i < R; i++) labels[i] = (int32_t)tu_below(&r, V);
    labels[2] = ignore;
    labels[6] = ignore;
    float *x = tu_falloc(R * V), *l1 = tu_falloc(R * V), *l2 = tu_falloc(R * V), *l3 = tu_falloc(R * V);
    float *d2 = tu_falloc(R * V);
    tu_fill_normal(&r, x, R * V, std);
    memcpy(l1, x, (size_t)(R * V) * sizeof(float));
    memcpy(l2, x, (size_t)(R * V) * sizeof(float));
    memcpy(l3, x, (size_t)(R * V) * sizeof(float));
    mt_bf16 *dh = calloc((size_t)(R * V), sizeof(mt_bf16));
    for (int64_t i = 0; i < R * V; i++) dh[i] = 0x1234, d2[i] = 7.0f; /* ignored rows must be zeroed */
    double s1[2] = {1.5, 3.0}, s2[2] = {1.5, 3.0}, s3[2] = {1.5, 3.0};
    TU_OK(be()->ops->xent_tile(be(), l1, l1, MT_F32, labels, R, V, cap, ignore, dscale, s1)); /* in place */
    TU_OK(be()->ops->xent_tile(be(), l2, d2, MT_F32, labels, R, V, cap, ignore, dscale, s2));
    TU_OK(be()->ops->xent_tile(be(), l3, dh, MT_BF16, labels, R, V, cap, ignore, dscale, s3));
    cr_expect(tu_bitwise_equal(d2, l1, R * V), "xent_tile: fp32 dlogits apart from logits = in place");
    cr_expect(memcmp(s1, s2, sizeof s1) == 0 && memcmp(s1, s3, sizeof s1) == 0, "xent_tile: stats by ddt");
    cr_expect(s3[1] == 3.0 + 7.0, "xent_tile: count += the labelled rows");
    cr_expect(bf16_is_rounded(dh, l1, R * V), "xent_tile: bf16 dlogits = the fp32 gradient rounded once");
    double *xd = tu_to_double(x, R * V), *eg = tu_dalloc(R * V), *want = tu_dalloc(R * V), loss = 0.0;
    const double lb = tu_xent_bounds(xd, labels, ignore, R, V, cap, dscale, 1.5, eg);
    for (int64_t row = 0; row < R; row++) {
        if (labels[row] == ignore) continue;
        const double *xr = xd + row * V;
        double mx = -INFINITY, s = 0.0;
        for (int64_t j = 0; j < V; j++) mx = fmax(mx, cap > 0 ? cap * tanh(xr[j] / cap) : xr[j]);
        for (int64_t j = 0; j < V; j++) s += exp((cap > 0 ? cap * tanh(xr[j] / cap) : xr[j]) - mx);
        for (int64_t j = 0; j < V; j++) {
            const double z = cap > 0 ? cap * tanh(xr[j] / cap) : xr[j];
            const double dz = cap > 0 ? 1.0 - (z / cap) * (z / cap) : 1.0;
            want[row * V + j] = dscale * (exp(z - mx) / s - (j == labels[row])) * dz;
        }
        const double zl = cap > 0 ? cap * tanh(xr[labels[row]] / cap) : xr[labels[row]];
        loss += mx + log(s) - zl;
    }
    char what[64];
    snprintf(what, sizeof what, "xent_tile bf16 dlogits cap=%g", cap);
    check_bf16(what, dh, want, eg, R * V);
    snprintf(what, sizeof what, "xent_tile loss cap=%g", cap);
    EXPECT_ERR(what, fabs((s3[0] - 1.5) - loss) / lb, 1.0);
    int zero = 1;
    for (int64_t j = 0; j < V; j++) zero &= dh[2 * V + j] == 0 && dh[6 * V + j] == 0 && d2[2 * V + j] == 0.0f;
    cr_expect(zero, "xent_tile: ignored rows of dlogits are zero");
    free(x), free(l1), free(l2), free(l3), free(d2), free(dh), free(xd), free(eg), free(want);
}

Test(ops_bf16_xent, plain_and_softcap) {
    xent_case(0.0f, 2.0);
    xent_case(5.0f, 4.0);
}

Test(ops_bf16_xent, bad_arguments) {
    float lg[4] = {0};
    int32_t lab[1] = {0};
    double st[2] = {0, 0};
    cr_expect_eq(be()->ops->xent_tile(be(), lg, lg, MT_BF16, lab, 1, 4, 0.0f, -1, 1.0f, st), MT_ERR_INVALID,
                 "bf16 dlogits cannot be the logits buffer");
    cr_expect(strstr(mt_last_error(), "xent_tile") != NULL, "%s", mt_last_error());
    mt_bf16 d[4];
    cr_expect_eq(be()->ops->xent_tile(be(), lg, d, MT_F16, lab, 1, 4, 0.0f, -1, 1.0f, st), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "xent_tile") && strstr(mt_last_error(), "dtype float16"), "%s", mt_last_error());
}

/* ------------------------------------------------------------------ axpy, scale */

Test(ops_bf16_elementwise, axpy_and_scale) {
    tu_rng r = {41};
    const int64_t n = 100003; /* threads */
    const float alpha = 0.3f, beta = -1.7f;
    float *x = bf16_normal(&r, n, 1.0), *y = bf16_normal(&r, n, 1.0);
    mt_bf16 *xh = tu_bf16_copy(x, n), *yh = tu_bf16_copy(y, n);
    TU_OK(be()->ops->axpy(be(), yh, xh, alpha, n, MT_BF16));
    /* round(y + alpha x) with alpha the same fp32 value here: the product and the sum,
     * e32 = gamma_2 (|y| + |alpha x|) */
    double *want = tu_dalloc(n), *e32 = tu_dalloc(n);
    for (int64_t i = 0; i < n; i++) {
        want[i] = (double)y[i] + (double)alpha * x[i];
        e32[i] = GAMMA(2) * (fabs((double)y[i]) + fabs((double)alpha * x[i]));
    }
    check_bf16("axpy", yh, want, e32, n);
    /* "+=" rounds once: round(y + round(alpha x)) (bf16 + bf16) must break the bound */
    float *twice = tu_falloc(n), *once = tu_falloc(n);
    for (int64_t i = 0; i < n; i++) {
        twice[i] = mt_bf16_to_f32(mt_f32_to_bf16(y[i] + mt_bf16_to_f32(mt_f32_to_bf16(alpha * x[i]))));
        once[i] = y[i] + alpha * x[i]; /* the fp32 expression (ISO C: unfused) */
    }
    const double r2 = bf16_ratio(twice, want, e32, n);
    cr_expect(r2 > 1.0, "axpy: a bf16 + bf16 add passes the bound (%.3f)", r2);
    cr_expect(bf16_is_rounded(yh, once, n), "axpy: round(float(y) + alpha float(x)), one rounding");

    float *y2 = tu_falloc(n);
    tu_widen(y2, yh, n);
    TU_OK(be()->ops->scale(be(), yh, beta, n, MT_BF16));
    /* one fp32 product: e32 = u |beta y| */
    for (int64_t i = 0; i < n; i++) {
        want[i] = (double)beta * y2[i];
        e32[i] = U32 * fabs(want[i]);
        once[i] = y2[i] * beta;
    }
    check_bf16("scale", yh, want, e32, n);
    cr_expect(bf16_is_rounded(yh, once, n), "scale: the fp32 product rounded once");
    free(x), free(y), free(xh), free(yh), free(want), free(e32), free(twice), free(once), free(y2);
}

/* ------------------------------------------------------------------ attn_merge */

Test(ops_bf16_attn_merge, against_fp64_and_edge_rows) {
    const int64_t B = 2, T = 50, H = 3, Dh = 128, rows = B * H * T, n = B * T * H * Dh; /* threads */
    tu_rng r = {51};
    float *oa = bf16_normal(&r, n, 1.0), *ob = bf16_normal(&r, n, 1.0);
    float *lse = tu_falloc(rows), *lseb = tu_falloc(rows), *lse0 = tu_falloc(rows), *lse32 = tu_falloc(rows);
    for (int64_t i = 0; i < rows; i++) {
        lse[i] = (float)(4.0 * tu_normal(&r));
        lseb[i] = (float)(4.0 * tu_normal(&r));
    }
    lseb[3] = -INFINITY;                /* b saw no key: row unchanged (bitwise) */
    lse[7] = -INFINITY;                 /* a saw no key: out = out_b */
    lse[13] = 80.0f, lseb[13] = -80.0f; /* one side negligible */
    memcpy(lse0, lse, (size_t)rows * sizeof(float));
    memcpy(lse32, lse, (size_t)rows * sizeof(float));
    mt_bf16 *out = tu_bf16_copy(oa, n), *outb = tu_bf16_copy(ob, n);
    float *o32 = tu_falloc(n);
    memcpy(o32, oa, (size_t)n * sizeof(float));
    TU_OK(be()->ops->attn_merge(be(), out, lse, outb, lseb, B, T, H, Dh, MT_BF16));
    TU_OK(be()->ops->attn_merge(be(), o32, lse32, ob, lseb, B, T, H, Dh, MT_F32));
    /* fp64 weights from the fp32 lse; e32 = 5u max(|oa|, |ob|) (test_ops_backend.c: two
     * weights rounded to fp32, two products and the sum, wa + wb = 1) */
    double *want = tu_dalloc(n), *e32 = tu_dalloc(n);
    int unchanged = 1;
    for (int64_t row = 0; row < rows; row++) {
        const int64_t b = row / (H * T), h = (row / T) % H, i = row % T, off = ((b * T + i) * H + h) * Dh;
        const double la = lse0[row], lb = lseb[row];
        if (lb == -INFINITY) {
            for (int64_t d = 0; d < Dh; d++) {
                unchanged &= out[off + d] == mt_f32_to_bf16(oa[off + d]);
                want[off + d] = oa[off + d], e32[off + d] = 0.0;
            }
            unchanged &= lse[row] == lse0[row];
            continue;
        }
        const double mx = la > lb ? la : lb, ln = mx + log(exp(la - mx) + exp(lb - mx));
        const double wa = la == -INFINITY ? 0.0 : exp(la - ln), wb = exp(lb - ln);
        for (int64_t d = 0; d < Dh; d++) {
            want[off + d] = wa * oa[off + d] + wb * ob[off + d];
            e32[off + d] = 5.0 * U32 * fmax(fabs((double)oa[off + d]), fabs((double)ob[off + d]));
        }
    }
    cr_expect(unchanged, "attn_merge: rows with lse_b = -inf unchanged");
    check_bf16("attn_merge out", out, want, e32, n);
    cr_expect(bf16_is_rounded(out, o32, n), "attn_merge: the fp32 merge rounded once");
    cr_expect(tu_bitwise_equal(lse, lse32, rows), "attn_merge: lse as the fp32 path");
    free(oa), free(ob), free(lse), free(lseb), free(lse0), free(lse32), free(out), free(outb), free(o32);
    free(want), free(e32);
}

/* ------------------------------------------------------------------ from_f32 */

Test(ops_bf16_from_f32, nearest_even) {
    const int64_t n = 100003; /* runtime/dtype.c's threads start at 65536 */
    tu_rng r = {61};
    float *x = tu_falloc(n), *y = tu_falloc(n);
    tu_fill_normal(&r, x, n, 10.0);
    /* ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (even: 1); 1 + 3 2^-8 between
     * 1 + 2^-7 and 1 + 2^-6 (even: 1 + 2^-6); just above a tie rounds up */
    x[0] = 1.0f + 0x1p-8f, x[1] = 1.0f + 3 * 0x1p-8f, x[2] = -(1.0f + 0x1p-8f + 0x1p-20f), x[3] = NAN;
    x[4] = INFINITY, x[5] = 0x1p127f * 1.999f; /* rounds up to inf */
    mt_bf16 *h = calloc((size_t)n, sizeof(mt_bf16));
    TU_OK(be()->ops->from_f32(be(), h, MT_BF16, x, n, 0, 0, 0));
    cr_expect_eq(mt_bf16_to_f32(h[0]), 1.0f);
    cr_expect_eq(mt_bf16_to_f32(h[1]), 1.0f + 0x1p-6f);
    cr_expect_eq(mt_bf16_to_f32(h[2]), -(1.0f + 0x1p-7f));
    cr_expect(isnan(mt_bf16_to_f32(h[3])));
    cr_expect_eq(mt_bf16_to_f32(h[4]), INFINITY);
    cr_expect_eq(mt_bf16_to_f32(h[5]), INFINITY);
    /* every finite element: the nearest bf16 (within UBF16 |x|), ties to even: the
     * neighbour on the other side is at least as far */
    int ok = 1;
    for (int64_t i = 6; i < n; i++) {
        const double g = mt_bf16_to_f32(h[i]), d = fabs(g - x[i]);
        uint16_t other = (uint16_t)(h[i] + ((double)x[i] > g ? 1 : -1) * (g < 0 ? -1 : 1));
        const double od = fabs((double)mt_bf16_to_f32(other) - x[i]);
        ok &= d <= UBF16 * fabs((double)x[i]) && (d < od || (d == od && (h[i] & 1) == 0));
    }
    cr_expect(ok, "from_f32: nearest bf16, ties to even");
    /* MT_F32: a copy, in place allowed */
    TU_OK(be()->ops->from_f32(be(), y, MT_F32, x, n, 0, 0, 0));
    cr_expect(memcmp(x + 6, y + 6, (size_t)(n - 6) * sizeof(float)) == 0);
    TU_OK(be()->ops->from_f32(be(), y, MT_F32, y, n, 1, 5, 0));
    cr_expect_eq(be()->ops->from_f32(be(), y, MT_F16, x, n, 0, 0, 0), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "from_f32") && strstr(mt_last_error(), "dtype float16"), "%s", mt_last_error());
    free(x), free(y), free(h);
}

Test(ops_bf16_from_f32, stochastic_bits_and_unbiased) {
    const int64_t n = 100003;
    const uint64_t seed = 0x5eedull, offset = 12345;
    tu_rng r = {62};
    float *x = tu_falloc(n);
    tu_fill_normal(&r, x, n, 3.0);
    mt_bf16 *h = calloc((size_t)n, sizeof(mt_bf16)), *want = calloc((size_t)n, sizeof(mt_bf16));
    mt_bf16 *parts = calloc((size_t)n, sizeof(mt_bf16));
    TU_OK(be()->ops->from_f32(be(), h, MT_BF16, x, n, 1, seed, offset));
    mt_f32_to_bf16_sr_array(want, x, (size_t)n, seed, offset);
    cr_expect(memcmp(h, want, (size_t)n * sizeof(mt_bf16)) == 0, "from_f32 SR = mt_f32_to_bf16_sr_array");
    /* element i's bits depend on offset + i only: two calls over the halves agree */
    const int64_t n1 = 40001;
    TU_OK(be()->ops->from_f32(be(), parts, MT_BF16, x, n1, 1, seed, offset));
    TU_OK(be()->ops->from_f32(be(), parts + n1, MT_BF16, x + n1, n - n1, 1, seed, offset + (uint64_t)n1));
    cr_expect(memcmp(h, parts, (size_t)n * sizeof(mt_bf16)) == 0, "from_f32 SR: split at any offset");
    /* Element i of the word stream: mt_rng_u32x4(seed, MT_SR_STREAM, g / 4)[g % 4] & 0xffff,
     * g = offset + i, added below the cut (runtime/dtype.h) */
    int bits_ok = 1;
    for (int64_t i = 0; i < 1000; i++) {
        uint32_t w[4];
        const uint64_t g = offset + (uint64_t)i;
        mt_rng_u32x4(seed, MT_SR_STREAM, g / 4, w);
        bits_ok &= h[i] == mt_f32_to_bf16_sr(x[i], w[g % 4] & 0xffffu);
    }
    cr_expect(bits_ok, "from_f32 SR: bits of Philox(seed, MT_SR_STREAM, (offset + i) / 4)");
    /* Unbiased: m = 4096 copies of one value x between bf16 neighbours lo < hi (ulp
     * apart) each round to hi with probability (x - lo) / ulp, so E[result] = x. The
     * results lie in [lo, hi]; Hoeffding: P(|mean - x| >= t) <= 2 exp(-2 m t^2 / ulp^2),
     * which is below 1e-9 for t = ulp sqrt(ln(2e9) / (2 m)) = 0.051 ulp. Nearest rounding
     * would be off by f ulp or 1 - f for the fractions f tried here (>= 0.1 ulp), and
     * truncation by f: both exceed t. */
    const int64_t m = 4096;
    const double fr[5] = {0.1, 0.25, 0.5, 0.7, 0.9};
    float *c = tu_falloc(m);
    mt_bf16 *hc = calloc((size_t)m, sizeof(mt_bf16));
    for (int k = 0; k < 5; k++) {
        const float lo = 1.5f, ulp = 0x1p-7f; /* bf16 spacing in [1, 2) */
        const float v = lo + (float)fr[k] * ulp;
        for (int64_t i = 0; i < m; i++) c[i] = v;
        TU_OK(be()->ops->from_f32(be(), hc, MT_BF16, c, m, 1, seed + (uint64_t)k, 7));
        double mean = 0.0;
        for (int64_t i = 0; i < m; i++) mean += mt_bf16_to_f32(hc[i]);
        mean /= (double)m;
        const double t = ulp * sqrt(log(2e9) / (2.0 * (double)m));
        char what[64];
        snprintf(what, sizeof what, "from_f32 SR mean, x = lo + %.2f ulp", fr[k]);
        EXPECT_ERR(what, fabs(mean - v), t);
    }
    free(x), free(h), free(want), free(parts), free(c), free(hc);
}

/* ------------------------------------------------------------------ dtype checks */

/* Every op with a dtype rejects one that is neither fp32 nor bf16, naming itself and
 * the dtype. */
Test(ops_bf16, bad_dtype_named) {
    float f[64] = {0};
    int32_t tok[2] = {0, 0}, pos[2] = {0, 1};
    mt_backend *o = be();
#define BAD(call, name)                                                                           \
    do {                                                                                          \
        cr_expect_eq((call), MT_ERR_INVALID, "%s", name);                                         \
        cr_expect(strstr(mt_last_error(), name) && strstr(mt_last_error(), "dtype float16"), "%s: %s", \
                  name, mt_last_error());                                                         \
    } while (0)
    BAD(o->ops->embedding_fwd(o, f, f, tok, 2, 0, 2, 4, 1.0f, MT_F16), "embedding_fwd");
    BAD(o->ops->embedding_bwd(o, f, f, tok, 2, 0, 2, 4, 1.0f, MT_F16), "embedding_bwd");
    BAD(o->ops->rmsnorm_fwd(o, f, f, f, f, 2, 4, 1e-6f, 0.0f, MT_F16), "rmsnorm_fwd");
    BAD(o->ops->rmsnorm_bwd(o, f, f, f, f, f, f, 2, 4, 0.0f, MT_F16), "rmsnorm_bwd");
    BAD(o->ops->rope_fwd(o, f, pos, f, 2, 1, 4, MT_F16), "rope_fwd");
    BAD(o->ops->rope_bwd(o, f, pos, f, 2, 1, 4, MT_F16), "rope_bwd");
    BAD(o->ops->attn_merge(o, f, f, f, f, 1, 2, 1, 4, MT_F16), "attn_merge");
    BAD(o->ops->glu_fwd(o, f, f, f, 8, MT_ACT_SILU, MT_F16), "glu_fwd");
    BAD(o->ops->glu_bwd(o, f, f, f, f, f, 8, MT_ACT_SILU, MT_F16), "glu_bwd");
    BAD(o->ops->axpy(o, f, f, 1.0f, 8, MT_F16), "axpy");
    BAD(o->ops->scale(o, f, 1.0f, 8, MT_F16), "scale");
#undef BAD
}
