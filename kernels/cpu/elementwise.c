/* kernels/cpu/elementwise.c: axpy, scale and the fp64 sum of squares.
 *
 * axpy and scale are one vectorised pass each, split across threads when large enough to
 * pay for the fork. sumsq feeds the global gradient norm, which must not change with the
 * thread count: the vector is cut into a fixed number of chunks whatever the threads
 * (MT_SUMSQ_CHUNKS), each summed in fp64 by one thread, and the chunk sums are added in
 * chunk order. */
#include "kernels/cpu/cpu_ops.h"

/* Below this many elements a loop runs on the calling thread only. */
#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_SUMSQ_CHUNKS 64

mt_status mt_cpu_axpy(mt_backend *be, float *restrict y, const float *restrict x, float alpha, int64_t n) {
    (void)be;
#pragma omp parallel for simd schedule(static) if (n >= MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) y[i] += alpha * x[i];
    return MT_OK;
}

mt_status mt_cpu_scale(mt_backend *be, float *restrict x, float alpha, int64_t n) {
    (void)be;
#pragma omp parallel for simd schedule(static) if (n >= MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) x[i] *= alpha;
    return MT_OK;
}

mt_status mt_cpu_sumsq(mt_backend *be, const float *restrict x, int64_t n, double *out) {
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
    *out = total;
    return MT_OK;
}
