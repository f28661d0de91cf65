/* kernels/cpu/cpu_dtype.h: the CPU ops' tensors of either compute dtype (kernels/ops.h
 * "Dtypes"), loaded as fp32 and stored back with one rounding.
 *
 * Every CPU op keeps its fp32 loops as they were (so MT_F32 computes bitwise what it did
 * before dtypes existed) and runs them on fp32 copies of bf16 data: a chunk, row or block
 * of each bf16 input is widened exactly into fp32 scratch (mt_cpu_load), the unchanged
 * fp32 code computes on it, and each bf16 output is rounded once, to nearest even
 * (mt_cpu_store; runtime/dtype.h mt_f32_to_bf16, NaN stays a quiet NaN). A bf16 result
 * is therefore the fp32 path's result on the widened inputs, rounded once, except where
 * an op states otherwise (attention rounds P before P @ V; gemm cuts K into blocks).
 * "+=" into a bf16 output widens the old value, adds in fp32 and rounds once. */
#ifndef MT_KERNELS_CPU_CPU_DTYPE_H
#define MT_KERNELS_CPU_CPU_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "runtime/dtype.h"
#include "runtime/status.h"

/* MT_OK for the compute dtypes (MT_F32, MT_BF16); otherwise MT_ERR_INVALID with a
 * message naming the op ("cpu rmsnorm_fwd") and the dtype. */
static inline mt_status mt_cpu_check_dtype(const char *op, mt_dtype dt) {
    if (dt == MT_F32 || dt == MT_BF16) return MT_OK;
    return mt_set_error(MT_ERR_INVALID, "cpu %s: dtype %s (float32 or bfloat16 only)", op, mt_dtype_name(dt));
}

/* Element i of a tensor of dt, widened to fp32 (exact). */
static inline float mt_cpu_ld(const void *p, int64_t i, mt_dtype dt) {
    return dt == MT_BF16 ? mt_bf16_to_f32(((const mt_bf16 *)p)[i]) : ((const float *)p)[i];
}

/* Element i of a tensor of dt = v, rounded once (to nearest even) for bf16. */
static inline void mt_cpu_st(void *p, int64_t i, float v, mt_dtype dt) {
    if (dt == MT_BF16)
        ((mt_bf16 *)p)[i] = mt_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* dst[0, n) = src[off, off + n) of dt, widened to fp32. */
static inline void mt_cpu_load(float *restrict dst, const void *src, int64_t off, int64_t n, mt_dtype dt) {
    if (dt == MT_BF16) {
        const mt_bf16 *restrict s = (const mt_bf16 *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(s[i]);
    } else if (n > 0) {
        memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
    }
}

/* dst[off, off + n) of dt = src[0, n), each element rounded once for bf16. */
static inline void mt_cpu_store(void *dst, int64_t off, const float *restrict src, int64_t n, mt_dtype dt) {
    if (dt == MT_BF16) {
        mt_bf16 *restrict d = (mt_bf16 *)dst + off;
        for (int64_t i = 0; i < n; i++) d[i] = mt_f32_to_bf16(src[i]);
    } else if (n > 0) {
        memcpy((float *)dst + off, src, (size_t)n * sizeof(float));
    }
}

/* dst[off, off + n) of dt = v (e.g. zeros, or the NaN of a failed op). */
static inline void mt_cpu_fill(void *dst, int64_t off, float v, int64_t n, mt_dtype dt) {
    for (int64_t i = 0; i < n; i++) mt_cpu_st(dst, off + i, v, dt);
}

#endif
