/* kernels/cpu/gemm.c: C = alpha op(A) op(B) + beta C through OpenBLAS's cblas_sgemm.
 *
 * A tuned BLAS is the one CPU routine we do not write ourselves (STYLE.md). The wrapper
 * only adds what ops.h promises beyond CBLAS: empty shapes are no-ops, K == 0 scales C,
 * and beta == 0 never reads C (NaN or garbage in C does not propagate). It must be
 * called outside OpenMP parallel regions: OpenBLAS runs its own thread pool. */
#include <assert.h>
#include <limits.h>
#include <cblas.h>

#include "kernels/cpu/cpu_ops.h"

void mt_cpu_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                 int64_t ldc) {
    if (M <= 0 || N <= 0) return;
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
        return;
    }
    /* OpenBLAS's beta pass stores zeros when beta == 0 (its gemm_beta kernels), so C is
     * overwritten, not scaled; tests/test_ops.c checks this with NaN in C. */
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, A, (int)lda,
                B, (int)ldb, beta, C, (int)ldc);
}
