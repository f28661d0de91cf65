/* kernels/cpu/embedding.c: token embedding lookup and its scatter-add backward.
 *
 * The forward is a scaled row copy per token. The backward adds rows of dout into the
 * rows of dtable named by the tokens; tokens repeat, so splitting the token loop across
 * threads would race or need atomics. Instead threads split the D columns: each thread
 * owns a block of columns of every table row and walks the tokens in increasing n, so
 * every element is summed by one thread in token order, whatever the thread count.
 * Both take a table of the rows [v0, v0 + V) (a vocabulary chunk, or the whole table
 * with v0 = 0): rows of other tokens are skipped, so a chunk's rows are bitwise those
 * of the whole-table call.
 * bf16 (cpu_dtype.h): the forward rounds each scaled element once; the backward widens
 * each row segment of dout into MT_EMB_COLS floats and adds it as the fp32 path does
 * (dtable is always fp32). */
#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_EMB_COLS 64 /* columns per backward work item: 4 cache lines of a row */

/* The row of token t in a table of rows [v0, v0 + V), or -1 when t lies outside. */
static inline int64_t emb_row(int32_t t, int64_t v0, int64_t V) { return t >= v0 && t < v0 + V ? t - v0 : -1; }

mt_status mt_cpu_embedding_fwd(mt_backend *be, void *out, const void *table, const int32_t *restrict tokens,
                               int64_t N, int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("embedding_fwd", dt));
    if (dt == MT_BF16) {
        const mt_bf16 *restrict tb = table;
        mt_bf16 *restrict ob = out;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const int64_t v = emb_row(tokens[n], v0, V);
            if (v < 0) continue;
            const mt_bf16 *restrict src = tb + v * D;
            mt_bf16 *restrict dst = ob + n * D;
            for (int64_t d = 0; d < D; d++) dst[d] = mt_f32_to_bf16(scale * mt_bf16_to_f32(src[d]));
        }
        return MT_OK;
    }
    const float *restrict tf = table;
    float *restrict of = out;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const int64_t v = emb_row(tokens[n], v0, V);
        if (v < 0) continue;
        const float *restrict src = tf + v * D;
        float *restrict dst = of + n * D;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) dst[d] = scale * src[d];
    }
    return MT_OK;
}

mt_status mt_cpu_embedding_bwd(mt_backend *be, float *restrict dtable, const void *dout,
                               const int32_t *restrict tokens, int64_t N, int64_t v0, int64_t V, int64_t D,
                               float scale, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("embedding_bwd", dt));
    const int64_t nblk = (D + MT_EMB_COLS - 1) / MT_EMB_COLS;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t d0 = blk * MT_EMB_COLS;
        const int64_t nd = D - d0 < MT_EMB_COLS ? D - d0 : MT_EMB_COLS;
        float wide[MT_EMB_COLS]; /* a bf16 row segment of dout, widened */
        for (int64_t n = 0; n < N; n++) {
            const int64_t v = emb_row(tokens[n], v0, V);
            if (v < 0) continue;
            float *restrict dst = dtable + v * D + d0;
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
