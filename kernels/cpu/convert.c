/* kernels/cpu/convert.c: gradient accumulation into a float32 or bfloat16 buffer, the
 * widening back to float32 and the rounding of float32 into a compute dtype (ops.h
 * grad_accumulate, to_f32, from_f32). Rounding is runtime/dtype.h's round-to-nearest-
 * even, or its stochastic rounding with Philox bits (mt_f32_to_bf16_sr_array, which
 * from_f32 calls), the same bit operations the CUDA kernels (kernels/cuda/convert.cu)
 * use; every element is independent (its random bits a function of seed and offset + i),
 * so the result does not depend on the thread count. */
#include <string.h>

#include "kernels/cpu/cpu_ops.h"
#include "runtime/dtype.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)

mt_status mt_cpu_grad_accumulate(mt_backend *be, void *acc, mt_dtype dtype, const float *restrict x, int64_t n,
                                 int first) {
    (void)be;
    if (n < 0) return mt_set_error(MT_ERR_INVALID, "grad_accumulate: n = %lld", (long long)n);
    if (dtype == MT_F32) {
        float *restrict a = acc;
        if (first) {
            if (n) memcpy(a, x, (size_t)n * sizeof(float));
        } else {
#pragma omp parallel for simd schedule(static) if (n >= MT_CPU_PAR_MIN)
            for (int64_t i = 0; i < n; i++) a[i] += x[i];
        }
        return MT_OK;
    }
    if (dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "grad_accumulate: dtype %s (float32 or bfloat16 only)",
                            mt_dtype_name(dtype));
    mt_bf16 *restrict a = acc;
    if (first) {
#pragma omp parallel for schedule(static) if (n >= MT_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) a[i] = mt_f32_to_bf16(x[i]);
    } else {
#pragma omp parallel for schedule(static) if (n >= MT_CPU_PAR_MIN)
        for (int64_t i = 0; i < n; i++) a[i] = mt_f32_to_bf16(mt_bf16_to_f32(a[i]) + x[i]);
    }
    return MT_OK;
}

mt_status mt_cpu_to_f32(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n) {
    (void)be;
    if (n < 0) return mt_set_error(MT_ERR_INVALID, "to_f32: n = %lld", (long long)n);
    if (dtype == MT_F32) {
        if (n && (const void *)dst != src) memmove(dst, src, (size_t)n * sizeof(float));
        return MT_OK;
    }
    if (dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "to_f32: dtype %s (float32 or bfloat16 only)", mt_dtype_name(dtype));
    mt_bf16_to_f32_array(dst, src, (size_t)n);
    return MT_OK;
}

mt_status mt_cpu_from_f32(mt_backend *be, void *dst, mt_dtype dtype, const float *src, int64_t n, int stochastic,
                          uint64_t seed, uint64_t offset) {
    (void)be;
    if (n < 0) return mt_set_error(MT_ERR_INVALID, "from_f32: n = %lld", (long long)n);
    if (dtype == MT_F32) {
        if (n && dst != (const void *)src) memmove(dst, src, (size_t)n * sizeof(float));
        return MT_OK;
    }
    if (dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "from_f32: dtype %s (float32 or bfloat16 only)", mt_dtype_name(dtype));
    if (stochastic)
        mt_f32_to_bf16_sr_array(dst, src, (size_t)n, seed, offset);
    else
        mt_f32_to_bf16_array(dst, src, (size_t)n);
    return MT_OK;
}
