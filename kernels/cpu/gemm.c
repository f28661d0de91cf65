/* kernels/cpu/gemm.c: C = alpha op(A) op(B) + beta C through OpenBLAS's cblas_sgemm.
 *
 * A tuned BLAS is the one CPU routine we do not write ourselves (STYLE.md). The wrapper
 * only adds what ops.h promises beyond CBLAS: empty shapes are no-ops, K == 0 scales C,
 * and beta == 0 never reads C (NaN or garbage in C does not propagate). It must be
 * called outside OpenMP parallel regions: OpenBLAS runs its own thread pool.
 *
 * OpenBLAS picks its kernels by CPU model number, in its library constructor, and falls
 * back to SSE3 (Prescott) kernels on a model newer than the library (Debian 12's 0.3.21
 * on Emerald Rapids: 4x slower sgemm; docs/cpu_gemm.md). So it is not linked but
 * dlopen'ed on the first GEMM (as kernels/cuda/gemm.cu loads cuBLASLt), after setting
 * OPENBLAS_CORETYPE from the CPU's features: AVX512F+BW+VL+DQ -> SkylakeX, AVX2+FMA ->
 * Zen on AMD, Haswell otherwise. A user-set OPENBLAS_CORETYPE is kept as it is. The
 * variable is restored after loading, so child processes see the user's environment.
 * The choice and the core OpenBLAS reports are logged once (info). */
#include <assert.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <cblas.h>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/log.h"

#ifndef MT_OPENBLAS_PATH
#define MT_OPENBLAS_PATH "libopenblas.so.0"
#endif

static struct {
    pthread_once_t once;
    __typeof__(&cblas_sgemm) sgemm;
    char err[256];
    char core[64]; /* openblas_get_corename() and why it was chosen */
} g_blas = {PTHREAD_ONCE_INIT, NULL, "", ""};

/* The OpenBLAS core for this CPU's features, or NULL to leave OpenBLAS's own choice. */
static const char *blas_core_from_features(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
#endif
    return NULL;
}

static void blas_load(void) {
    const char *user = getenv("OPENBLAS_CORETYPE");
    const char *core = user && *user ? NULL : blas_core_from_features();
    if (core) setenv("OPENBLAS_CORETYPE", core, 1); /* read by OpenBLAS's constructor */
    void *h = dlopen(MT_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (core) unsetenv("OPENBLAS_CORETYPE");
    if (!h) {
        snprintf(g_blas.err, sizeof g_blas.err, "dlopen(%s): %s", MT_OPENBLAS_PATH, dlerror());
        return;
    }
    char *(*corename)(void) = (char *(*)(void))dlsym(h, "openblas_get_corename");
    *(void **)&g_blas.sgemm = dlsym(h, "cblas_sgemm");
    if (!g_blas.sgemm) {
        snprintf(g_blas.err, sizeof g_blas.err, "dlsym(cblas_sgemm) in %s: missing", MT_OPENBLAS_PATH);
        return;
    }
    snprintf(g_blas.core, sizeof g_blas.core, "%s (%s)", corename ? corename() : "?",
             user && *user ? "OPENBLAS_CORETYPE set by the user" : core ? "chosen from CPU features"
                                                                  : "OpenBLAS's own choice");
    mt_log(MT_LOG_INFO, "cpu gemm: OpenBLAS kernels %s", g_blas.core);
}

const char *mt_cpu_gemm_kernel(void) {
    pthread_once(&g_blas.once, blas_load);
    return g_blas.sgemm ? g_blas.core : g_blas.err;
}

mt_status mt_cpu_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc) {
    (void)be;
    if (M <= 0 || N <= 0) return MT_OK;
    /* CBLAS takes int dimensions; CPU-sized problems stay far below INT_MAX. */
    assert(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
           ldc <= INT_MAX);
    if (K <= 0 || alpha == 0.0f) {
        for (int64_t i = 0; i < M; i++) {
            float *restrict c = C + i * ldc;
            if (beta == 0.0f) {
                for (int64_t j = 0; j < N; j++) c[j] = 0.0f;
            } else {
                for (int64_t j = 0; j < N; j++) c[j] *= beta;
            }
        }
        return MT_OK;
    }
    /* OpenBLAS's beta pass stores zeros when beta == 0 (its gemm_beta kernels), so C is
     * overwritten, not scaled; tests/test_ops.c checks this with NaN in C. */
    pthread_once(&g_blas.once, blas_load);
    if (!g_blas.sgemm) return mt_set_error(MT_ERR_RUNTIME, "cpu gemm: %s", g_blas.err);
    g_blas.sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda,
                B, (int)ldb, beta, C, (int)ldc);
    return MT_OK;
}
