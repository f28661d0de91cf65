/* kernels/cpu/rmsnorm.c: RMSNorm forward and backward (Zhang & Sennrich 2019; HF
 * LlamaRMSNorm and GemmaRMSNorm, the latter scaling by 1 + w via w_offset = 1).
 *
 * Forward: one thread per row, the mean square summed in fp64, y = (x * rstd) * w'.
 * Backward (w' = w_offset + w, g = dy * w', r = rstd):
 *   dx = r g - x r^3 / D * sum_d(g x)     (rows split across threads)
 *   dw = sum_n dy x r                     (a reduction over rows)
 * dw must not depend on the thread count, so it is a second pass over column blocks:
 * each thread owns some columns and sums all rows in row order (fp32 over groups of 32
 * rows, the group sums in fp64). */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_RMS_COLS 256 /* dw columns per work item: 2 KiB of fp64 accumulators, 1 KiB row reads */
#define MT_RMS_ROWS 32  /* rows summed in fp32 before each fp64 add */

void mt_cpu_rmsnorm_fwd(float *restrict y, float *restrict rstd, const float *restrict x,
                        const float *restrict w, int64_t N, int64_t D, float eps,
                        float w_offset) {
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *restrict xr = x + n * D;
        float *restrict yr = y + n * D;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int64_t d = 0; d < D; d++) ss += (double)xr[d] * (double)xr[d];
        const float r = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
        rstd[n] = r;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) yr[d] = (xr[d] * r) * (w_offset + w[d]);
    }
}

void mt_cpu_rmsnorm_bwd(float *restrict dx, float *restrict dw, const float *restrict dy,
                        const float *restrict x, const float *restrict w,
                        const float *restrict rstd, int64_t N, int64_t D, float w_offset) {
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        const float *restrict xr = x + n * D;
        const float *restrict dyr = dy + n * D;
        float *restrict dxr = dx + n * D;
        const float r = rstd[n];
        double c = 0.0;
#pragma omp simd reduction(+ : c)
        for (int64_t d = 0; d < D; d++) c += (double)(dyr[d] * (w_offset + w[d])) * (double)xr[d];
        const float k = (float)((double)r * (double)r * (double)r * c / (double)D);
#pragma omp simd
        for (int64_t d = 0; d < D; d++) dxr[d] += r * (dyr[d] * (w_offset + w[d])) - xr[d] * k;
    }
    const int64_t nblk = (D + MT_RMS_COLS - 1) / MT_RMS_COLS;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t d0 = blk * MT_RMS_COLS;
        const int64_t nd = D - d0 < MT_RMS_COLS ? D - d0 : MT_RMS_COLS;
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
}
