/* kernels/cuda/elementwise.cu: axpy, scale and the fp64 sum of squares.
 *
 * axpy/scale are grid-stride loops (memory bound; one element per thread per step) on
 * float or bfloat16 (common.cuh mt_ld / mt_st: widened, fp32 arithmetic, one rounding).
 * sumsq (global gradient norm) is two passes with a fixed partition: G blocks, G =
 * ceil(n / MT_SUMSQ_PER_BLOCK) capped at MT_SUMSQ_BLOCKS (enough blocks to fill an H200's
 * 132 SMs several times over, and no more blocks than there is work: most gradient
 * tensors are small), each own one contiguous slice [b n / G, (b+1) n / G), sum it per
 * thread in fp64 then in a fixed tree, and one block adds the G partials in a fixed tree
 * and adds the total to acc[0] on the device (ops.h: "+=", no synchronisation; the
 * caller reads acc once per step). The partition depends only on n, so the result is
 * bitwise reproducible on any GPU (not bitwise the CPU's, whose chunking differs;
 * agreement is to fp64 rounding). */
#include "kernels/cuda/common.cuh"

#define MT_SUMSQ_BLOCKS 1024
#define MT_SUMSQ_PER_BLOCK 8192 /* elements per block before the cap: 32 per thread */
#define MT_EW_THREADS 256

template <typename T>
__global__ void axpy_kernel(T *y, const T *x, float alpha, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        mt_st(y, i, mt_ld(y, i) + alpha * mt_ld(x, i));
}

template <typename T>
__global__ void scale_kernel(T *x, float alpha, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        mt_st(x, i, mt_ld(x, i) * alpha);
}

__global__ void sumsq_partial_kernel(double *part, const float *x, int64_t n) {
    __shared__ double sh[32];
    const int64_t b = blockIdx.x, G = gridDim.x;
    const int64_t lo = b * n / G, hi = (b + 1) * n / G;
    double s = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const double v = (double)x[i];
        s += v * v;
    }
    s = mt_block_sum(s, sh);
    if (threadIdx.x == 0) part[b] = s;
}

__global__ void sumsq_final_kernel(double *acc, const double *part, int G) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < G; i += blockDim.x) s += part[i];
    s = mt_block_sum(s, sh);
    if (threadIdx.x == 0) acc[0] += s;
}

mt_status mt_cuda_axpy(mt_backend *be, void *y, const void *x, float alpha, int64_t n, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "axpy", dt));
    if (n <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, axpy_kernel<T><<<mt_cuda_blocks(n, MT_EW_THREADS), MT_EW_THREADS>>>(
                                 (T *)y, (const T *)x, alpha, n));
    MT_CUDA_LAUNCHED(be, "axpy_kernel");
    return MT_OK;
}

mt_status mt_cuda_scale(mt_backend *be, void *x, float alpha, int64_t n, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "scale", dt));
    if (n <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, scale_kernel<T><<<mt_cuda_blocks(n, MT_EW_THREADS), MT_EW_THREADS>>>((T *)x, alpha, n));
    MT_CUDA_LAUNCHED(be, "scale_kernel");
    return MT_OK;
}

size_t mt_cuda_sumsq_scratch(void) { return MT_SUMSQ_BLOCKS * sizeof(double); /* one partial per block */ }

mt_status mt_cuda_sumsq(mt_backend *be, const float *x, int64_t n, double *acc) {
    MT_CUDA_ENTER(be);
    if (n <= 0) return MT_OK; /* acc[0] += 0 */
    double *part = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_REDUCE, mt_cuda_sumsq_scratch(), (void **)&part));
    const int64_t want = (n + MT_SUMSQ_PER_BLOCK - 1) / MT_SUMSQ_PER_BLOCK;
    const int G = want < MT_SUMSQ_BLOCKS ? (int)want : MT_SUMSQ_BLOCKS;
    sumsq_partial_kernel<<<G, MT_EW_THREADS>>>(part, x, n);
    MT_CUDA_LAUNCHED(be, "sumsq_partial_kernel");
    sumsq_final_kernel<<<1, 1024>>>(acc, part, G);
    MT_CUDA_LAUNCHED(be, "sumsq_final_kernel");
    return MT_OK;
}
