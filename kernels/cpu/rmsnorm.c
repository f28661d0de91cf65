/* kernels/cpu/rmsnorm.c: RMSNorm forward and backward (Zhang & Sennrich 2019; HF
 * LlamaRMSNorm and GemmaRMSNorm, the latter scaling by 1 + w via w_offset = 1).
 *
 * Forward: one thread per row, the mean square summed in fp64, y = (x * rstd) * w'.
 * Backward (w' = w_offset + w, g = dy * w', r = rstd):
 *   dx = r g - x r^3 / D * sum_d(g x)     (rows split across threads)
 *   dw = sum_n dy x r                     (a reduction over rows)
 * dw must not depend on the thread count, so it is a second pass over column blocks:
 * each thread owns some columns and sums all rows in row order (fp32 over groups of 32
 * rows, the group sums in fp64). The row and column-block functions have AVX2 clones
 * (MT_CPU_SIMD_CLONES). */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_RMS_COLS 256 /* dw columns per work item: 2 KiB of fp64 accumulators, 1 KiB row reads */
#define MT_RMS_ROWS 32  /* rows summed in fp32 before each fp64 add */

/* One row of the forward (MT_CPU_SIMD_CLONES: 8-wide where the CPU has AVX2). */
MT_CPU_SIMD_CLONES
static void rms_fwd_row(float *restrict yr, float *restrict rstd, const float *restrict xr,
                        const float *restrict w, int64_t D, float eps, float w_offset) {
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t d = 0; d < D; d++) ss += (double)xr[d] * (double)xr[d];
    const float r = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    *rstd = r;
#pragma omp simd
    for (int64_t d = 0; d < D; d++) yr[d] = (xr[d] * r) * (w_offset + w[d]);
}

mt_status mt_cpu_rmsnorm_fwd(mt_backend *be, float *restrict y, float *restrict rstd, const float *restrict x,
                        const float *restrict w, int64_t N, int64_t D, float eps,
                        float w_offset) {
    (void)be;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) rms_fwd_row(y + n * D, rstd + n, x + n * D, w, D, eps, w_offset);
    return MT_OK;
}

/* One row of dx (added to dxr). */
MT_CPU_SIMD_CLONES
static void rms_bwd_row(float *restrict dxr, const float *restrict dyr, const float *restrict xr,
                        const float *restrict w, float r, int64_t D, float w_offset) {
    double c = 0.0;
#pragma omp simd reduction(+ : c)
    for (int64_t d = 0; d < D; d++) c += (double)(dyr[d] * (w_offset + w[d])) * (double)xr[d];
    const float k = (float)((double)r * (double)r * (double)r * c / (double)D);
#pragma omp simd
    for (int64_t d = 0; d < D; d++) dxr[d] += r * (dyr[d] * (w_offset + w[d])) - xr[d] * k;
}

/* dw[d0, d0 + nd) += sum over all N rows of dy x r, in the fixed order described above. */
MT_CPU_SIMD_CLONES
static void rms_dw_cols(float *restrict dw, const float *restrict dy, const float *restrict x,
                        const float *restrict rstd, int64_t N, int64_t D, int64_t d0, int64_t nd) {
    double acc[MT_RMS_COLS] = {0};
    /* fp32 sums over fixed groups of MT_RMS_ROWS rows, added into fp64: nearly fp64
     * accuracy at fp32 speed, in an order fixed by N alone */
    for (int64_t n0 = 0; n0 < N; n0 += MT_RMS_ROWS) {
        const int64_t n1 = N - n0 < MT_RMS_ROWS ? N : n0 + MT_RMS_ROWS;
        float part[MT_RMS_COLS] = {0};
        for (int64_t n = n0; n < n1; n++) {
            const float *restrict xr = x + n * D + d0;
            const float *restrict dyr = dy + n * D + d0;
            const float r = rstd[n];
#pragma omp simd
            for (int64_t d = 0; d < nd; d++) part[d] += dyr[d] * xr[d] * r;
        }
#pragma omp simd
        for (int64_t d = 0; d < nd; d++) acc[d] += (double)part[d];
    }
    for (int64_t d = 0; d < nd; d++) dw[d0 + d] += (float)acc[d];
}

mt_status mt_cpu_rmsnorm_bwd(mt_backend *be, float *restrict dx, float *restrict dw, const float *restrict dy,
                        const float *restrict x, const float *restrict w,
                        const float *restrict rstd, int64_t N, int64_t D, float w_offset) {
    (void)be;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) rms_bwd_row(dx + n * D, dy + n * D, x + n * D, w, rstd[n], D, w_offset);
    const int64_t nblk = (D + MT_RMS_COLS - 1) / MT_RMS_COLS;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t d0 = blk * MT_RMS_COLS;
        rms_dw_cols(dw, dy, x, rstd, N, D, d0, D - d0 < MT_RMS_COLS ? D - d0 : MT_RMS_COLS);
    }
    return MT_OK;
}
