/* kernels/cuda/rmsnorm.cu: RMSNorm forward and backward (ops.h; kernels/cpu/rmsnorm.c).
 *
 * Forward: one block per row; the mean square is summed in fp64 (as on the CPU) with a
 * fixed-order block reduction, then y = (x * rstd) * (w_offset + w).
 * Backward dx: one block per row, c = sum_d (dy w') x in fp64, then
 * dx += r dy w' - x r^3 c / D. Backward dw = sum_n dy x r without atomics: pass 1 gives
 * each chunk of MT_RMS_CHUNK rows one fp64 partial per column (a thread per column,
 * rows in order, fp32 over groups of 32 rows then fp64, like the CPU), pass 2 adds the
 * chunks' partials per column in chunk order. The partition depends on N only. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define MT_RMS_THREADS 256
#define MT_RMS_CHUNK 256 /* rows per dw partial (a multiple of 32) */
#define MT_RMS_GROUP 32

__global__ void rmsnorm_fwd_kernel(float *y, float *rstd, const float *x, const float *w, int64_t D, float eps,
                                   float w_offset) {
    __shared__ double sh[32];
    const int64_t n = blockIdx.x;
    const float *xr = x + n * D;
    double ss = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ss += (double)xr[d] * (double)xr[d];
    ss = mt_block_sum(ss, sh);
    const float r = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    if (threadIdx.x == 0) rstd[n] = r;
    float *yr = y + n * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) yr[d] = (xr[d] * r) * (w_offset + w[d]);
}

__global__ void rmsnorm_bwd_dx_kernel(float *dx, const float *dy, const float *x, const float *w,
                                      const float *rstd, int64_t D, float w_offset) {
    __shared__ double sh[32];
    const int64_t n = blockIdx.x;
    const float *xr = x + n * D, *dyr = dy + n * D;
    float *dxr = dx + n * D;
    const float r = rstd[n];
    double c = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) c += (double)(dyr[d] * (w_offset + w[d])) * (double)xr[d];
    c = mt_block_sum(c, sh);
    const float k = (float)((double)r * (double)r * (double)r * c / (double)D);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dxr[d] += r * (dyr[d] * (w_offset + w[d])) - xr[d] * k;
}

__global__ void rmsnorm_bwd_dw_partial_kernel(double *part, const float *dy, const float *x, const float *rstd,
                                              int64_t N, int64_t D) {
    const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t p = blockIdx.y;
    if (d >= D) return;
    const int64_t n_end = (p + 1) * MT_RMS_CHUNK < N ? (p + 1) * MT_RMS_CHUNK : N;
    double acc = 0.0;
    for (int64_t n0 = p * MT_RMS_CHUNK; n0 < n_end; n0 += MT_RMS_GROUP) {
        const int64_t n1 = n0 + MT_RMS_GROUP < n_end ? n0 + MT_RMS_GROUP : n_end;
        float g = 0.0f;
        for (int64_t n = n0; n < n1; n++) g += dy[n * D + d] * x[n * D + d] * rstd[n];
        acc += (double)g;
    }
    part[p * D + d] = acc;
}

__global__ void rmsnorm_bwd_dw_final_kernel(float *dw, const double *part, int64_t P, int64_t D) {
    const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= D) return;
    double acc = 0.0;
    for (int64_t p = 0; p < P; p++) acc += part[p * D + d];
    dw[d] += (float)acc;
}

mt_status mt_cuda_rmsnorm_fwd(mt_backend *be, float *y, float *rstd, const float *x, const float *w, int64_t N, int64_t D, float eps,
                         float w_offset) {
    MT_CUDA_ENTER(be);
    if (N <= 0 || D <= 0) return MT_OK;
    rmsnorm_fwd_kernel<<<(unsigned)N, MT_RMS_THREADS>>>(y, rstd, x, w, D, eps, w_offset);
    MT_CUDA_LAUNCHED(be, "rmsnorm_fwd_kernel");
    return MT_OK;
}

mt_status mt_cuda_rmsnorm_bwd(mt_backend *be, float *dx, float *dw, const float *dy, const float *x, const float *w, const float *rstd,
                         int64_t N, int64_t D, float w_offset) {
    MT_CUDA_ENTER(be);
    if (N <= 0 || D <= 0) return MT_OK;
    rmsnorm_bwd_dx_kernel<<<(unsigned)N, MT_RMS_THREADS>>>(dx, dy, x, w, rstd, D, w_offset);
    MT_CUDA_LAUNCHED(be, "rmsnorm_bwd_dx_kernel");
    const int64_t P = (N + MT_RMS_CHUNK - 1) / MT_RMS_CHUNK;
    double *part = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_REDUCE, (size_t)(P * D) * sizeof(double), (void **)&part));
    const unsigned cols = (unsigned)((D + MT_RMS_THREADS - 1) / MT_RMS_THREADS);
    rmsnorm_bwd_dw_partial_kernel<<<dim3(cols, (unsigned)P), MT_RMS_THREADS>>>(part, dy, x, rstd, N, D);
    MT_CUDA_LAUNCHED(be, "rmsnorm_bwd_dw_partial_kernel");
    rmsnorm_bwd_dw_final_kernel<<<cols, MT_RMS_THREADS>>>(dw, part, P, D);
    MT_CUDA_LAUNCHED(be, "rmsnorm_bwd_dw_final_kernel");
    return MT_OK;
}
