/* tests/test_backend_util.h: helpers for tests that call a backend's ops directly
 * (kernels/backend.h): every op returns mt_status, which a test asserts. */
#ifndef MT_TESTS_TEST_BACKEND_UTIL_H
#define MT_TESTS_TEST_BACKEND_UTIL_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "runtime/status.h"

/* Assert that a backend call (or any mt_status expression) succeeded, printing its message. */
#define TU_OK(expr) cr_assert_eq((expr), MT_OK, "%s: %s", #expr, mt_last_error())

/* `bytes` of be's memory (asserts success). */
static inline void *tu_balloc(mt_backend *be, size_t bytes) {
    void *p = NULL;
    TU_OK(be->ops->alloc(be, bytes, &p));
    return p;
}

/* be->ops->sumsq's result (asserts success): accumulated into a zeroed double of be's
 * memory and read back (the op adds to backend memory without synchronising). */
static inline double tu_sumsq(mt_backend *be, const float *x, int64_t n) {
    void *acc = NULL;
    double s = 0.0;
    TU_OK(be->ops->alloc(be, sizeof s, &acc));
    TU_OK(be->ops->zero(be, acc, sizeof s));
    TU_OK(be->ops->sumsq(be, x, n, acc));
    TU_OK(be->ops->copy_to_host(be, &s, acc, sizeof s));
    be->ops->release(be, acc);
    return s;
}

/* add_rmsnorm_fwd on backend be is bitwise copy + axpy + rmsnorm_fwd on be (ops.h: the
 * same one rounding of h = x + r, then the norm of the rounded h), for dtype dt, both
 * norm forms (w_offset 0 and 1) and in place (h = x) or not. Inputs: deterministic
 * values of order one (rounded to dt), N x D with D not a multiple of any vector width.
 * A fused kernel that normalised the unrounded sum, or rounded twice, fails it in bf16. */
static inline void tu_check_add_rmsnorm(mt_backend *be, mt_dtype dt) {
    const int64_t N = 13, D = 70, n = N * D;
    const size_t es = mt_dtype_size(dt), bytes = (size_t)n * es;
    unsigned char *hx = malloc(bytes), *hr = malloc(bytes), *hw = malloc((size_t)D * es);
    for (int64_t i = 0; i < n; i++) {
        const float xv = (float)sin(0.37 * (double)i + 0.1) * 1.7f, rv = (float)cos(0.91 * (double)i) * 0.9f;
        if (dt == MT_BF16) {
            ((mt_bf16 *)hx)[i] = mt_f32_to_bf16(xv);
            ((mt_bf16 *)hr)[i] = mt_f32_to_bf16(rv);
        } else {
            ((float *)hx)[i] = xv;
            ((float *)hr)[i] = rv;
        }
    }
    for (int64_t d = 0; d < D; d++) {
        const float wv = 0.5f + 0.01f * (float)d;
        if (dt == MT_BF16) ((mt_bf16 *)hw)[d] = mt_f32_to_bf16(wv); else ((float *)hw)[d] = wv;
    }
    void *x = tu_balloc(be, bytes), *r = tu_balloc(be, bytes), *w = tu_balloc(be, (size_t)D * es);
    void *h1 = tu_balloc(be, bytes), *y1 = tu_balloc(be, bytes), *h2 = tu_balloc(be, bytes), *y2 = tu_balloc(be, bytes);
    float *s1 = tu_balloc(be, (size_t)N * 4), *s2 = tu_balloc(be, (size_t)N * 4);
    TU_OK(be->ops->copy_to_device(be, x, hx, bytes));
    TU_OK(be->ops->copy_to_device(be, r, hr, bytes));
    TU_OK(be->ops->copy_to_device(be, w, hw, (size_t)D * es));
    unsigned char *a = malloc(bytes), *b = malloc(bytes);
    float sa[13], sb[13];
    for (int off = 0; off <= 1; off++)
        for (int in_place = 0; in_place <= 1; in_place++) {
            TU_OK(be->ops->copy(be, h1, x, bytes));
            TU_OK(be->ops->axpy(be, h1, r, 1.0f, n, dt));
            TU_OK(be->ops->rmsnorm_fwd(be, y1, s1, h1, w, N, D, 1e-5f, (float)off, dt));
            const void *src = x;
            if (in_place) {
                TU_OK(be->ops->copy(be, h2, x, bytes));
                src = h2;
            }
            TU_OK(be->ops->add_rmsnorm_fwd(be, h2, y2, s2, src, r, w, N, D, 1e-5f, (float)off, dt));
            TU_OK(be->ops->copy_to_host(be, a, h1, bytes));
            TU_OK(be->ops->copy_to_host(be, b, h2, bytes));
            cr_expect(memcmp(a, b, bytes) == 0, "%s add_rmsnorm h (w_offset %d, in place %d)", mt_dtype_name(dt), off,
                      in_place);
            TU_OK(be->ops->copy_to_host(be, a, y1, bytes));
            TU_OK(be->ops->copy_to_host(be, b, y2, bytes));
            cr_expect(memcmp(a, b, bytes) == 0, "%s add_rmsnorm y (w_offset %d, in place %d)", mt_dtype_name(dt), off,
                      in_place);
            TU_OK(be->ops->copy_to_host(be, sa, s1, sizeof sa));
            TU_OK(be->ops->copy_to_host(be, sb, s2, sizeof sb));
            cr_expect(memcmp(sa, sb, sizeof sa) == 0, "%s add_rmsnorm rstd", mt_dtype_name(dt));
        }
    free(a);
    free(b);
    free(hx);
    free(hr);
    free(hw);
    void *bufs[] = {x, r, w, h1, y1, h2, y2, s1, s2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->release(be, bufs[i]);
}

#endif
