/* kernels/cuda/convert.cu: gradient accumulation into a float32 or bfloat16 buffer and
 * the widening back to float32 (ops.h grad_accumulate, to_f32). Grid-stride loops, one
 * element per thread per step; bf16 rounding is the bit operation of runtime/dtype.h
 * (round to nearest even, NaN kept quiet), so results are bitwise the CPU backend's
 * (kernels/cpu/convert.c). The fp32 add is __fadd_rn (no contraction). */
#include "kernels/cuda/common.cuh"

#define MT_CVT_THREADS 256

__device__ __forceinline__ float mt_dev_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* runtime/dtype.h mt_f32_to_bf16 */
__device__ __forceinline__ uint16_t mt_dev_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__global__ void acc_f32_kernel(float *a, const float *x, int64_t n, int first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a[i] = first ? x[i] : __fadd_rn(a[i], x[i]);
}

__global__ void acc_bf16_kernel(uint16_t *a, const float *x, int64_t n, int first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a[i] = mt_dev_f32_to_bf16(first ? x[i] : __fadd_rn(mt_dev_bf16_to_f32(a[i]), x[i]));
}

__global__ void bf16_to_f32_kernel(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = mt_dev_bf16_to_f32(src[i]);
}

mt_status mt_cuda_grad_accumulate(mt_backend *be, void *acc, mt_dtype dtype, const float *x, int64_t n, int first) {
    MT_CUDA_ENTER(be);
    if (n < 0) return mt_set_error(MT_ERR_INVALID, "grad_accumulate: n = %lld", (long long)n);
    if (dtype != MT_F32 && dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "grad_accumulate: dtype %s (float32 or bfloat16 only)",
                            mt_dtype_name(dtype));
    if (n == 0) return MT_OK;
    if (dtype == MT_F32) {
        acc_f32_kernel<<<mt_cuda_blocks(n, MT_CVT_THREADS), MT_CVT_THREADS>>>((float *)acc, x, n, first);
        MT_CUDA_LAUNCHED(be, "acc_f32_kernel");
    } else {
        acc_bf16_kernel<<<mt_cuda_blocks(n, MT_CVT_THREADS), MT_CVT_THREADS>>>((uint16_t *)acc, x, n, first);
        MT_CUDA_LAUNCHED(be, "acc_bf16_kernel");
    }
    return MT_OK;
}

mt_status mt_cuda_to_f32(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n) {
    MT_CUDA_ENTER(be);
    if (n < 0) return mt_set_error(MT_ERR_INVALID, "to_f32: n = %lld", (long long)n);
    if (dtype != MT_F32 && dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "to_f32: dtype %s (float32 or bfloat16 only)", mt_dtype_name(dtype));
    if (n == 0) return MT_OK;
    if (dtype == MT_F32) {
        if ((const void *)dst != src)
            MT_CUDA_TRY(be, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        return MT_OK;
    }
    bf16_to_f32_kernel<<<mt_cuda_blocks(n, MT_CVT_THREADS), MT_CVT_THREADS>>>(dst, (const uint16_t *)src, n);
    MT_CUDA_LAUNCHED(be, "bf16_to_f32_kernel");
    return MT_OK;
}
