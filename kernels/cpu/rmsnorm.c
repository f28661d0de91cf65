/* kernels/cpu/rmsnorm.c: RMSNorm forward and backward (Zhang & Sennrich 2019; HF
 * LlamaRMSNorm and GemmaRMSNorm, the latter scaling by 1 + w via w_offset = 1).
 *
 * Forward: one thread per row, the mean square summed in fp64, y = (x * rstd) * w'.
 * add_rmsnorm_fwd first forms the row h = x + r (rounded to the dtype), then the same.
 * Backward (w' = w_offset + w, g = dy * w', r = rstd):
 *   dx = r g - x r^3 / D * sum_d(g x)     (rows split across threads)
 *   dw = sum_n dy x r                     (a reduction over rows)
 * dw must not depend on the thread count, so it is a second pass over column blocks:
 * each thread owns some columns and sums all rows in row order (fp32 over groups of 32
 * rows, the group sums in fp64). The row and column-block functions have AVX2 clones
 * (MT_CPU_SIMD_CLONES).
 * bf16 (cpu_dtype.h): each thread widens w once and every row of x (dy, dx) into fp32
 * scratch of D floats per tensor, runs the same row functions, and rounds y (dx after its
 * fp32 +=) once; the dw pass widens each row segment it reads. The scratch is allocated
 * per call and thread (MT_ERR_OOM if that fails). */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_dtype.h"
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

/* One row of the fused residual add: hr = xr + rr (fp32; hr may be xr). */
MT_CPU_SIMD_CLONES
static void add_row(float *hr, const float *xr, const float *restrict rr, int64_t D) {
#pragma omp simd
    for (int64_t d = 0; d < D; d++) hr[d] = xr[d] + rr[d];
}

/* rmsnorm_fwd (r == NULL) and add_rmsnorm_fwd (h = x + r first, rounded to dt, then the
 * norm of the rounded h): one row loop for both ops and both dtypes. */
static mt_status fwd_rows(const char *op, void *h, void *y, float *restrict rstd, const void *x, const void *r,
                          const void *w, int64_t N, int64_t D, float eps, float w_offset, mt_dtype dt) {
    MT_TRY(mt_cpu_check_dtype(op, dt));
    if (dt == MT_F32) {
        float *hf = h, *restrict yf = y;
        const float *xf = x, *rf = r, *restrict wf = w;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
        for (int64_t n = 0; n < N; n++) {
            const float *in = xf + n * D;
            if (rf) {
                add_row(hf + n * D, in, rf + n * D, D);
                in = hf + n * D;
            }
            rms_fwd_row(yf + n * D, rstd + n, in, wf, D, eps, w_offset);
        }
        return MT_OK;
    }
    int failed = 0;
#pragma omp parallel if (N * D >= MT_CPU_PAR_MIN)
    {
        float *buf = malloc((size_t)(4 * D) * sizeof(float)); /* w, x (then h) row, r row, y row */
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        } else {
            mt_cpu_load(buf, w, 0, D, dt);
        }
#pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            if (!buf) continue;
            float *xr = buf + D, *rr = buf + 2 * D, *yr = buf + 3 * D;
            mt_cpu_load(xr, x, n * D, D, dt);
            if (r) {
                mt_cpu_load(rr, r, n * D, D, dt);
                add_row(xr, xr, rr, D);
                mt_cpu_store(h, n * D, xr, D, dt); /* h rounded once ... */
                mt_cpu_load(xr, h, n * D, D, dt);  /* ... and normalised as rounded */
            }
            rms_fwd_row(yr, rstd + n, xr, buf, D, eps, w_offset);
            mt_cpu_store(y, n * D, yr, D, dt);
        }
        free(buf);
    }
    if (failed) return mt_set_error(MT_ERR_OOM, "cpu %s: no scratch for bf16 rows of D = %lld", op, (long long)D);
    return MT_OK;
}

mt_status mt_cpu_rmsnorm_fwd(mt_backend *be, void *y, float *restrict rstd, const void *x, const void *w,
                             int64_t N, int64_t D, float eps, float w_offset, mt_dtype dt) {
    (void)be;
    return fwd_rows("rmsnorm_fwd", NULL, y, rstd, x, NULL, w, N, D, eps, w_offset, dt);
}

mt_status mt_cpu_add_rmsnorm_fwd(mt_backend *be, void *h, void *y, float *restrict rstd, const void *x, const void *r,
                                 const void *w, int64_t N, int64_t D, float eps, float w_offset, mt_dtype dt) {
    (void)be;
    if (!r) return mt_set_error(MT_ERR_INVALID, "cpu add_rmsnorm_fwd: r is NULL");
    return fwd_rows("add_rmsnorm_fwd", h, y, rstd, x, r, w, N, D, eps, w_offset, dt);
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

/* dw[d0, d0 + nd) += sum over all N rows of dy x r, in the fixed order described above
 * (dy and x of dt: a bf16 row segment is widened before the same fp32 loop). */
MT_CPU_SIMD_CLONES
static void rms_dw_cols(float *restrict dw, const void *dy, const void *x, const float *restrict rstd, int64_t N,
                        int64_t D, int64_t d0, int64_t nd, mt_dtype dt) {
    double acc[MT_RMS_COLS] = {0};
    float xw[MT_RMS_COLS], dyw[MT_RMS_COLS]; /* widened bf16 segments */
    /* fp32 sums over fixed groups of MT_RMS_ROWS rows, added into fp64: nearly fp64
     * accuracy at fp32 speed, in an order fixed by N alone */
    for (int64_t n0 = 0; n0 < N; n0 += MT_RMS_ROWS) {
        const int64_t n1 = N - n0 < MT_RMS_ROWS ? N : n0 + MT_RMS_ROWS;
        float part[MT_RMS_COLS] = {0};
        for (int64_t n = n0; n < n1; n++) {
            const float *restrict xr = xw, *restrict dyr = dyw;
            if (dt == MT_F32) {
                xr = (const float *)x + n * D + d0;
                dyr = (const float *)dy + n * D + d0;
            } else {
                mt_cpu_load(xw, x, n * D + d0, nd, dt);
                mt_cpu_load(dyw, dy, n * D + d0, nd, dt);
            }
            const float r = rstd[n];
#pragma omp simd
            for (int64_t d = 0; d < nd; d++) part[d] += dyr[d] * xr[d] * r;
        }
#pragma omp simd
        for (int64_t d = 0; d < nd; d++) acc[d] += (double)part[d];
    }
    for (int64_t d = 0; d < nd; d++) dw[d0 + d] += (float)acc[d];
}

mt_status mt_cpu_rmsnorm_bwd(mt_backend *be, void *dx, float *restrict dw, const void *dy, const void *x,
                             const void *w, const float *restrict rstd, int64_t N, int64_t D, float w_offset,
                             mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("rmsnorm_bwd", dt));
    if (dt == MT_F32) {
        float *restrict dxf = dx;
        const float *restrict dyf = dy, *restrict xf = x, *restrict wf = w;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
        for (int64_t n = 0; n < N; n++) rms_bwd_row(dxf + n * D, dyf + n * D, xf + n * D, wf, rstd[n], D, w_offset);
    } else {
        int failed = 0;
#pragma omp parallel if (N * D >= MT_CPU_PAR_MIN)
        {
            float *buf = malloc((size_t)(4 * D) * sizeof(float)); /* w, dx row, dy row, x row */
            if (!buf) {
#pragma omp atomic write
                failed = 1;
            } else {
                mt_cpu_load(buf, w, 0, D, dt);
            }
#pragma omp for schedule(static)
            for (int64_t n = 0; n < N; n++) {
                if (!buf) continue;
                float *dxr = buf + D, *dyr = buf + 2 * D, *xr = buf + 3 * D;
                mt_cpu_load(dxr, dx, n * D, D, dt);
                mt_cpu_load(dyr, dy, n * D, D, dt);
                mt_cpu_load(xr, x, n * D, D, dt);
                rms_bwd_row(dxr, dyr, xr, buf, rstd[n], D, w_offset);
                mt_cpu_store(dx, n * D, dxr, D, dt);
            }
            free(buf);
        }
        if (failed)
            return mt_set_error(MT_ERR_OOM, "cpu rmsnorm_bwd: no scratch for bf16 rows of D = %lld", (long long)D);
    }
    const int64_t nblk = (D + MT_RMS_COLS - 1) / MT_RMS_COLS;
#pragma omp parallel for schedule(static) if (N * D >= MT_CPU_PAR_MIN)
    for (int64_t blk = 0; blk < nblk; blk++) {
        const int64_t d0 = blk * MT_RMS_COLS;
        rms_dw_cols(dw, dy, x, rstd, N, D, d0, D - d0 < MT_RMS_COLS ? D - d0 : MT_RMS_COLS, dt);
    }
    return MT_OK;
}
