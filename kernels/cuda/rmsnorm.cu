/* kernels/cuda/rmsnorm.cu: RMSNorm forward and backward (ops.h; kernels/cpu/rmsnorm.c).
 *
 * Forward: one block per row; the mean square is summed in fp64 (as on the CPU) with a
 * fixed-order block reduction, then y = (x * rstd) * (w_offset + w). add_rmsnorm_fwd
 * first forms h = x + r (rounded to the dtype) in the same block.
 * Backward dx: one block per row, c = sum_d (dy w') x in fp64, then
 * dx += r dy w' - x r^3 c / D. Backward dw = sum_n dy x r without atomics: pass 1 gives
 * each chunk of MT_RMS_CHUNK rows one fp64 partial per column (a thread per column,
 * rows in order, fp32 over groups of 32 rows then fp64, like the CPU), pass 2 adds the
 * chunks' partials per column in chunk order. The partition depends on N only.
 * y, x, w, dy and dx are float or bfloat16 (common.cuh mt_ld / mt_st): widened, the
 * same fp32/fp64 arithmetic, y and the updated dx rounded once; rstd and dw are fp32. */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define MT_RMS_THREADS 256
#define MT_RMS_CHUNK 256 /* rows per dw partial (a multiple of 32) */
#define MT_RMS_GROUP 32

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *y, float *rstd, const T *x, const T *w, int64_t D, float eps, float w_offset) {
    __shared__ double sh[32];
    const int64_t n = blockIdx.x;
    const T *xr = x + n * D;
    double ss = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        const double xd = (double)mt_ld(xr, d);
        ss += xd * xd;
    }
    ss = mt_block_sum(ss, sh);
    const float r = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    if (threadIdx.x == 0) rstd[n] = r;
    T *yr = y + n * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) mt_st(yr, d, (mt_ld(xr, d) * r) * (w_offset + mt_ld(w, d)));
}

/* The fused residual add (ops.h add_rmsnorm_fwd): h = x + r rounded to T, then the
 * forward above on the rounded h. Each thread reads back only the h elements it wrote
 * itself, so no barrier is needed between the two passes. h may be x. */
template <typename T>
__global__ void add_rmsnorm_fwd_kernel(T *h, T *y, float *rstd, const T *x, const T *r, const T *w, int64_t D,
                                       float eps, float w_offset) {
    __shared__ double sh[32];
    const int64_t n = blockIdx.x;
    const T *xr = x + n * D, *rr = r + n * D;
    T *hr = h + n * D;
    double ss = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
        mt_st(hr, d, __fadd_rn(mt_ld(xr, d), mt_ld(rr, d)));
        const double hd = (double)mt_ld(hr, d);
        ss += hd * hd;
    }
    ss = mt_block_sum(ss, sh);
    const float rs = (float)(1.0 / sqrt(ss / (double)D + (double)eps));
    if (threadIdx.x == 0) rstd[n] = rs;
    T *yr = y + n * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) mt_st(yr, d, (mt_ld(hr, d) * rs) * (w_offset + mt_ld(w, d)));
}

template <typename T>
__global__ void rmsnorm_bwd_dx_kernel(T *dx, const T *dy, const T *x, const T *w, const float *rstd, int64_t D,
                                      float w_offset) {
    __shared__ double sh[32];
    const int64_t n = blockIdx.x;
    const T *xr = x + n * D, *dyr = dy + n * D;
    T *dxr = dx + n * D;
    const float r = rstd[n];
    double c = 0.0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        c += (double)(mt_ld(dyr, d) * (w_offset + mt_ld(w, d))) * (double)mt_ld(xr, d);
    c = mt_block_sum(c, sh);
    const float k = (float)((double)r * (double)r * (double)r * c / (double)D);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        mt_st(dxr, d, mt_ld(dxr, d) + (r * (mt_ld(dyr, d) * (w_offset + mt_ld(w, d))) - mt_ld(xr, d) * k));
}

template <typename T>
__global__ void rmsnorm_bwd_dw_partial_kernel(double *part, const T *dy, const T *x, const float *rstd, int64_t N,
                                              int64_t D) {
    const int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t p = blockIdx.y;
    if (d >= D) return;
    const int64_t n_end = (p + 1) * MT_RMS_CHUNK < N ? (p + 1) * MT_RMS_CHUNK : N;
    double acc = 0.0;
    for (int64_t n0 = p * MT_RMS_CHUNK; n0 < n_end; n0 += MT_RMS_GROUP) {
        const int64_t n1 = n0 + MT_RMS_GROUP < n_end ? n0 + MT_RMS_GROUP : n_end;
        float g = 0.0f;
        for (int64_t n = n0; n < n1; n++) g += mt_ld(dy, n * D + d) * mt_ld(x, n * D + d) * rstd[n];
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

mt_status mt_cuda_rmsnorm_fwd(mt_backend *be, void *y, float *rstd, const void *x, const void *w, int64_t N,
                              int64_t D, float eps, float w_offset, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "rmsnorm_fwd", dt));
    if (N <= 0 || D <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, rmsnorm_fwd_kernel<T><<<(unsigned)N, MT_RMS_THREADS>>>((T *)y, rstd, (const T *)x,
                                                                                     (const T *)w, D, eps, w_offset));
    MT_CUDA_LAUNCHED(be, "rmsnorm_fwd_kernel");
    return MT_OK;
}

mt_status mt_cuda_add_rmsnorm_fwd(mt_backend *be, void *h, void *y, float *rstd, const void *x, const void *r,
                                  const void *w, int64_t N, int64_t D, float eps, float w_offset, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "add_rmsnorm_fwd", dt));
    if (N <= 0 || D <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, add_rmsnorm_fwd_kernel<T><<<(unsigned)N, MT_RMS_THREADS>>>(
                                 (T *)h, (T *)y, rstd, (const T *)x, (const T *)r, (const T *)w, D, eps, w_offset));
    MT_CUDA_LAUNCHED(be, "add_rmsnorm_fwd_kernel");
    return MT_OK;
}

size_t mt_cuda_rmsnorm_bwd_scratch(int64_t N, int64_t D) {
    return N > 0 && D > 0 ? (size_t)((N + MT_RMS_CHUNK - 1) / MT_RMS_CHUNK * D) * sizeof(double) : 0;
}

mt_status mt_cuda_rmsnorm_bwd(mt_backend *be, void *dx, float *dw, const void *dy, const void *x, const void *w,
                              const float *rstd, int64_t N, int64_t D, float w_offset, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "rmsnorm_bwd", dt));
    if (N <= 0 || D <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, rmsnorm_bwd_dx_kernel<T><<<(unsigned)N, MT_RMS_THREADS>>>(
                                 (T *)dx, (const T *)dy, (const T *)x, (const T *)w, rstd, D, w_offset));
    MT_CUDA_LAUNCHED(be, "rmsnorm_bwd_dx_kernel");
    const int64_t P = (N + MT_RMS_CHUNK - 1) / MT_RMS_CHUNK;
    double *part = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_REDUCE, mt_cuda_rmsnorm_bwd_scratch(N, D), (void **)&part));
    const unsigned cols = (unsigned)((D + MT_RMS_THREADS - 1) / MT_RMS_THREADS);
    MT_CUDA_DT_SWITCH(dt, T, rmsnorm_bwd_dw_partial_kernel<T><<<dim3(cols, (unsigned)P), MT_RMS_THREADS>>>(
                                 part, (const T *)dy, (const T *)x, rstd, N, D));
    MT_CUDA_LAUNCHED(be, "rmsnorm_bwd_dw_partial_kernel");
    rmsnorm_bwd_dw_final_kernel<<<cols, MT_RMS_THREADS>>>(dw, part, P, D);
    MT_CUDA_LAUNCHED(be, "rmsnorm_bwd_dw_final_kernel");
    return MT_OK;
}
