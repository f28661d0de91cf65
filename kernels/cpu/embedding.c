/* kernels/cpu/embedding.c: token embedding lookup and its scatter-add backward.
 *
 * The forward is a scaled row copy per token. The backward adds rows of dout into the
 * rows of dtable named by the tokens; tokens repeat, so splitting the token loop across
 * threads would race or need atomics. Instead threads split the D columns: each thread
 * owns a block of columns of every table row and walks the tokens in increasing n, so
 * every element is summed by one thread in token order, whatever the thread count.
 * bf16 (cpu_dtype.h): the forward rounds each scaled element once; the backward widens
 * each row segment of dout into MT_EMB_COLS floats and adds it as the fp32 path does
 * (dtable is always fp32). */
#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_EMB_COLS 64 /* columns per backward work item: 4 cache lines of a row */

mt_status mt_cpu_embedding_fwd(mt_backend *be, void *out, const void *table, const int32_t *restrict tokens,
                               int64_t N, int64_t D, float scale, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("embedding_fwd", dt));
    if (dt == MT_BF16) {
        const mt_bf16 *restrict tb = table;
        mt_bf16 *restrict ob = out;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const mt_bf16 *restrict src = tb + (int64_t)tokens[n] * D;
            mt_bf16 *restrict dst = ob + n * D;
            for (int64_t d = 0; d < D; d++) dst[d] = mt_f32_to_bf16(scale * mt_bf16_to_f32(src[d]));
        }
        return MT_OK;
    }
    const float *restrict tf = table;
    float *restrict of = out;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *restrict src = tf + (int64_t)tokens[n] * D;
        float *restrict dst = of + n * D;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) dst[d] = scale * src[d];
    }
    return MT_OK;
}

mt_status mt_cpu_embedding_bwd(mt_backend *be, float *restrict dtable, const void *dout,
                               const int32_t *restrict tokens, int64_t N, int64_t V, int64_t D, float scale,
                               mt_dtype dt) {
    (void)be;
    (void)V; /* tokens lie in [0, V) (caller's contract) */
    MT_TRY(mt_cpu_check_dtype("embedding_bwd", dt));
    const int64_t nblk = (D + MT_EMB_COLS - 1) / MT_EMB_COLS;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t d0 = blk * MT_EMB_COLS;
        const int64_t nd = D - d0 < MT_EMB_COLS ? D - d0 : MT_EMB_COLS;
        float wide[MT_EMB_COLS]; /* a bf16 row segment of dout, widened */
        for (int64_t n = 0; n < N; n++) {
            float *restrict dst = dtable + (int64_t)tokens[n] * D + d0;
            const float *restrict src = wide;
            if (dt == MT_F32)
                src = (const float *)dout + n * D + d0;
            else
                mt_cpu_load(wide, dout, n * D + d0, nd, dt);
#pragma omp simd
            for (int64_t d = 0; d < nd; d++) dst[d] += scale * src[d];
        }
    }
    return MT_OK;
}
