/* kernels/cpu/elementwise.c: axpy, scale and the fp64 sum of squares.
 *
 * axpy and scale are one vectorised pass each, split across threads when large enough to
 * pay for the fork; with bf16 each element is widened, computed in fp32 as the fp32 loop
 * does and rounded once (cpu_dtype.h). sumsq feeds the global gradient norm, which must
 * not change with the thread count: the vector is cut into a fixed number of chunks
 * whatever the threads (MT_SUMSQ_CHUNKS), each summed in fp64 by one thread, and the
 * chunk sums are added in chunk order, then to the caller's accumulator. */
#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"

/* Below this many elements a loop runs on the calling thread only. */
#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_SUMSQ_CHUNKS 64

mt_status mt_cpu_axpy(mt_backend *be, void *y, const void *x, float alpha, int64_t n, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("axpy", dt));
    if (dt == MT_BF16) {
        mt_bf16 *restrict yb = y;
        const mt_bf16 *restrict xb = x;
#pragma omp parallel for schedule(static) if (n >= MT_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) yb[i] = mt_f32_to_bf16(mt_bf16_to_f32(yb[i]) + alpha * mt_bf16_to_f32(xb[i]));
        return MT_OK;
    }
    float *restrict yf = y;
    const float *restrict xf = x;
#pragma omp parallel for simd schedule(static) if (n >= MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) yf[i] += alpha * xf[i];
    return MT_OK;
}

mt_status mt_cpu_scale(mt_backend *be, void *x, float alpha, int64_t n, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("scale", dt));
    if (dt == MT_BF16) {
        mt_bf16 *restrict xb = x;
#pragma omp parallel for schedule(static) if (n >= MT_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) xb[i] = mt_f32_to_bf16(mt_bf16_to_f32(xb[i]) * alpha);
        return MT_OK;
    }
    float *restrict xf = x;
#pragma omp parallel for simd schedule(static) if (n >= MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) xf[i] *= alpha;
    return MT_OK;
}

mt_status mt_cpu_sumsq(mt_backend *be, const float *restrict x, int64_t n, double *acc) {
    (void)be;
    double part[MT_SUMSQ_CHUNKS];
#pragma omp parallel for schedule(static) if (n >= MT_CPU_PAR_MIN)
    for (int c = 0; c < MT_SUMSQ_CHUNKS; c++) {
        int64_t i0 = n * c / MT_SUMSQ_CHUNKS, i1 = n * (c + 1) / MT_SUMSQ_CHUNKS;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (int64_t i = i0; i < i1; i++) {
            double xi = (double)x[i];
            s += xi * xi;
        }
        part[c] = s;
    }
    double total = 0.0;
    for (int c = 0; c < MT_SUMSQ_CHUNKS; c++) total += part[c];
    acc[0] += total;
    return MT_OK;
}
