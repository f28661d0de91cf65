/* kernels/cpu/embedding.c: token embedding lookup and its scatter-add backward.
 *
 * The forward is a scaled row copy per token. The backward adds rows of dout into the
 * rows of dtable named by the tokens; tokens repeat, so splitting the token loop across
 * threads would race or need atomics. Instead threads split the D columns: each thread
 * owns a block of columns of every table row and walks the tokens in increasing n, so
 * every element is summed by one thread in token order, whatever the thread count. */
#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_EMB_COLS 64 /* columns per backward work item: 4 cache lines of a row */

mt_status mt_cpu_embedding_fwd(mt_backend *be, float *restrict out, const float *restrict table,
                          const int32_t *restrict tokens, int64_t N, int64_t D, float scale) {
    (void)be;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *restrict src = table + (int64_t)tokens[n] * D;
        float *restrict dst = out + n * D;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) dst[d] = scale * src[d];
    }
    return MT_OK;
}

mt_status mt_cpu_embedding_bwd(mt_backend *be, float *restrict dtable, const float *restrict dout,
                          const int32_t *restrict tokens, int64_t N, int64_t V, int64_t D,
                          float scale) {
    (void)be;
    (void)V; /* tokens lie in [0, V) (caller's contract) */
    const int64_t nblk = (D + MT_EMB_COLS - 1) / MT_EMB_COLS;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t d0 = blk * MT_EMB_COLS;
        const int64_t nd = D - d0 < MT_EMB_COLS ? D - d0 : MT_EMB_COLS;
        for (int64_t n = 0; n < N; n++) {
            float *restrict dst = dtable + (int64_t)tokens[n] * D + d0;
            const float *restrict src = dout + n * D + d0;
#pragma omp simd
            for (int64_t d = 0; d < nd; d++) dst[d] += scale * src[d];
        }
    }
    return MT_OK;
}
