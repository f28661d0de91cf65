/* tests/test_backend_util.h: helpers for tests that call a backend's ops directly
 * (kernels/backend.h): every op returns mt_status, which a test asserts. */
#ifndef MT_TESTS_TEST_BACKEND_UTIL_H
#define MT_TESTS_TEST_BACKEND_UTIL_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdint.h>

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

/* be->ops->sumsq's result (asserts success). */
static inline double tu_sumsq(mt_backend *be, const float *x, int64_t n) {
    double s = 0.0;
    TU_OK(be->ops->sumsq(be, x, n, &s));
    return s;
}

#endif
