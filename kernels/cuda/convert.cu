/* kernels/cuda/convert.cu: gradient accumulation into a float32 or bfloat16 buffer, the
 * widening back to float32 and the rounding of fp32 master weights to the compute
 * dtype (ops.h grad_accumulate, to_f32, from_f32). Grid-stride loops, one element (one
 * Philox block of four for stochastic rounding) per thread per step; bf16 rounding is
 * the bit operation of runtime/dtype.h (common.cuh mt_cuda_f32_to_bf16, NaN kept
 * quiet), so results are bitwise the CPU backend's (kernels/cpu/convert.c). The fp32 add
 * is __fadd_rn (no contraction).
 * Stochastic rounding draws its bits from the same inline Philox4x32-10 as the host
 * (runtime/rng.h mt_rng_u32x4_inline): element i of a call takes word g % 4 of block
 * g / 4 on stream MT_SR_STREAM, g = offset + i, exactly as mt_f32_to_bf16_sr_array, so
 * the bits are the CPU's whatever the grid. */
#include "kernels/cuda/common.cuh"
#include "runtime/rng.h"

#define MT_CVT_THREADS 256

__global__ void acc_f32_kernel(float *a, const float *x, int64_t n, int first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a[i] = first ? x[i] : __fadd_rn(a[i], x[i]);
}

__global__ void acc_bf16_kernel(__nv_bfloat16 *a, const float *x, int64_t n, int first) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        mt_st(a, i, first ? x[i] : __fadd_rn(mt_ld(a, i), x[i]));
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = mt_ld(src, i);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        mt_st(dst, i, src[i]);
}

/* One thread per Philox block b in [offset / 4, (offset + n - 1) / 4]: nblocks blocks. */
__global__ void f32_to_bf16_sr_kernel(__nv_bfloat16 *dst, const float *src, int64_t n, uint64_t seed,
                                      uint64_t offset, int64_t nblocks) {
    const uint64_t first_block = offset / 4;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblocks;
         b += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t blk = first_block + (uint64_t)b;
        uint32_t w[4];
        mt_rng_u32x4_inline(seed, MT_SR_STREAM, blk, w);
        for (int k = 0; k < 4; k++) {
            const uint64_t g = blk * 4 + (uint64_t)k; /* global element index */
            if (g < offset || g >= offset + (uint64_t)n) continue;
            const int64_t i = (int64_t)(g - offset);
            dst[i] = __ushort_as_bfloat16(mt_cuda_f32_to_bf16_sr(src[i], w[k] & 0xffffu));
        }
    }
}

/* MT_ERR_INVALID for a negative n or a dtype other than float32 / bfloat16. */
static mt_status cvt_check(const char *op, mt_dtype dtype, int64_t n) {
    if (n < 0) return mt_set_error(MT_ERR_INVALID, "cuda: %s: n = %lld", op, (long long)n);
    if (dtype != MT_F32 && dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "cuda: %s: dtype %s (float32 or bfloat16 only)", op,
                            mt_dtype_name(dtype));
    return MT_OK;
}

mt_status mt_cuda_grad_accumulate(mt_backend *be, void *acc, mt_dtype dtype, const float *x, int64_t n, int first) {
    MT_CUDA_ENTER(be);
    MT_TRY(cvt_check("grad_accumulate", dtype, n));
    if (n == 0) return MT_OK;
    if (dtype == MT_F32) {
        acc_f32_kernel<<<mt_cuda_blocks(n, MT_CVT_THREADS), MT_CVT_THREADS>>>((float *)acc, x, n, first);
        MT_CUDA_LAUNCHED(be, "acc_f32_kernel");
    } else {
        acc_bf16_kernel<<<mt_cuda_blocks(n, MT_CVT_THREADS), MT_CVT_THREADS>>>((__nv_bfloat16 *)acc, x, n, first);
        MT_CUDA_LAUNCHED(be, "acc_bf16_kernel");
    }
    return MT_OK;
}

mt_status mt_cuda_to_f32(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n) {
    MT_CUDA_ENTER(be);
    MT_TRY(cvt_check("to_f32", dtype, n));
    if (n == 0) return MT_OK;
    if (dtype == MT_F32) {
        if ((const void *)dst != src)
            MT_CUDA_TRY(be, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        return MT_OK;
    }
    bf16_to_f32_kernel<<<mt_cuda_blocks(n, MT_CVT_THREADS), MT_CVT_THREADS>>>(dst, (const __nv_bfloat16 *)src, n);
    MT_CUDA_LAUNCHED(be, "bf16_to_f32_kernel");
    return MT_OK;
}

mt_status mt_cuda_from_f32(mt_backend *be, void *dst, mt_dtype dtype, const float *src, int64_t n, int stochastic,
                           uint64_t seed, uint64_t offset) {
    MT_CUDA_ENTER(be);
    MT_TRY(cvt_check("from_f32", dtype, n));
    if (n == 0) return MT_OK;
    if (dtype == MT_F32) {
        if (dst != (const void *)src)
            MT_CUDA_TRY(be, cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, 0));
        return MT_OK;
    }
    if (!stochastic) {
        f32_to_bf16_kernel<<<mt_cuda_blocks(n, MT_CVT_THREADS), MT_CVT_THREADS>>>((__nv_bfloat16 *)dst, src, n);
        MT_CUDA_LAUNCHED(be, "f32_to_bf16_kernel");
        return MT_OK;
    }
    const int64_t nblocks = (int64_t)((offset + (uint64_t)n - 1) / 4 - offset / 4 + 1);
    f32_to_bf16_sr_kernel<<<mt_cuda_blocks(nblocks, MT_CVT_THREADS), MT_CVT_THREADS>>>(
        (__nv_bfloat16 *)dst, src, n, seed, offset, nblocks);
    MT_CUDA_LAUNCHED(be, "f32_to_bf16_sr_kernel");
    return MT_OK;
}
