/* kernels/cpu/convert.c: gradient accumulation into a float32 or bfloat16 buffer and
 * the widening back to float32 (ops.h grad_accumulate, to_f32). Rounding is
 * runtime/dtype.h's round-to-nearest-even, the same bit operation the CUDA kernels
 * (kernels/cuda/convert.cu) use; every element is independent, so the result does not
 * depend on the thread count. */
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
