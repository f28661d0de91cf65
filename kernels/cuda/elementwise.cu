/* kernels/cuda/elementwise.cu: axpy, scale and the fp64 sum of squares.
 *
 * axpy/scale are grid-stride loops (memory bound; one float per thread per step).
 * sumsq (global gradient norm) is two passes with a fixed partition: MT_SUMSQ_BLOCKS
 * blocks each own one contiguous slice [b n / G, (b+1) n / G), sum it per thread in
 * fp64 then in a fixed tree, and one block adds the G partials in a fixed tree. The
 * partition depends only on n, so the result is bitwise reproducible on any GPU
 * (not bitwise the CPU's, whose chunking differs; agreement is to fp64 rounding). */
#include "kernels/cuda/common.cuh"

#define MT_SUMSQ_BLOCKS 1024
#define MT_EW_THREADS 256

__global__ void axpy_kernel(float *y, const float *x, float alpha, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += alpha * x[i];
}

__global__ void scale_kernel(float *x, float alpha, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= alpha;
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

__global__ void sumsq_final_kernel(double *out, const double *part, int G) {
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < G; i += blockDim.x) s += part[i];
    s = mt_block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = s;
}

void mt_cuda_axpy(float *y, const float *x, float alpha, int64_t n) {
    if (n <= 0) return;
    axpy_kernel<<<mt_cuda_blocks(n, MT_EW_THREADS), MT_EW_THREADS>>>(y, x, alpha, n);
    MT_CUDA_LAUNCHED();
}

void mt_cuda_scale(float *x, float alpha, int64_t n) {
    if (n <= 0) return;
    scale_kernel<<<mt_cuda_blocks(n, MT_EW_THREADS), MT_EW_THREADS>>>(x, alpha, n);
    MT_CUDA_LAUNCHED();
}

double mt_cuda_sumsq(const float *x, int64_t n) {
    if (n <= 0) return 0.0;
    double *part = (double *)mt_cuda_scratch(MT_CUDA_SCRATCH_REDUCE, (MT_SUMSQ_BLOCKS + 1) * sizeof(double));
    if (!part) return NAN;
    sumsq_partial_kernel<<<MT_SUMSQ_BLOCKS, MT_EW_THREADS>>>(part, x, n);
    MT_CUDA_LAUNCHED();
    sumsq_final_kernel<<<1, 1024>>>(part + MT_SUMSQ_BLOCKS, part, MT_SUMSQ_BLOCKS);
    MT_CUDA_LAUNCHED();
    double r = NAN;
    MT_CUDA_CHECK(cudaMemcpy(&r, part + MT_SUMSQ_BLOCKS, sizeof(double), cudaMemcpyDeviceToHost));
    return r;
}
