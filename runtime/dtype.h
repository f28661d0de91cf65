/* runtime/dtype.h: element types and bfloat16 conversion.
 *
 * bfloat16 is the upper 16 bits of an IEEE-754 binary32. Conversion from float32 is
 * round-to-nearest-even (as torch.Tensor.to(torch.bfloat16) and JAX do), or
 * stochastic rounding (add a uniform 16-bit random value below the cut, then
 * truncate; Gupta et al. 2015, "Deep Learning with Limited Numerical Precision").
 * NaN stays NaN (quiet) under both. */
#ifndef MT_RUNTIME_DTYPE_H
#define MT_RUNTIME_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_dtype {
    MT_F32 = 0,
    MT_BF16 = 1,
    MT_F16 = 2,
    MT_I32 = 3,
    MT_U16 = 4,
    MT_U32 = 5,
    MT_F64 = 6,
    MT_DTYPE_COUNT
} mt_dtype;

/* Size of one element in bytes. */
size_t mt_dtype_size(mt_dtype t);

/* Config spelling ("float32", "bfloat16", "float16", "int32", ...). */
const char *mt_dtype_name(mt_dtype t);

/* Parse a config spelling ("float32"|"fp32", "bfloat16"|"bf16", "float16"|"fp16").
 * Returns MT_ERR_INVALID with a message listing the allowed names. */
mt_status mt_dtype_parse(const char *s, mt_dtype *out);

typedef uint16_t mt_bf16;

static inline float mt_bf16_to_f32(mt_bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 -> bfloat16, round to nearest, ties to even. */
static inline mt_bf16 mt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (mt_bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mt_bf16)(u >> 16);
}

/* float32 -> bfloat16 with stochastic rounding; `rand16` is a uniform value in
 * [0, 65536) (use the low 16 bits of a Philox output). E[result] == f for finite f. */
static inline mt_bf16 mt_f32_to_bf16_sr(float f, uint32_t rand16) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return (mt_bf16)((u >> 16) | ((u & 0x007fffffu) ? 0x0040u : 0u));
    u += (rand16 & 0xffffu);
    return (mt_bf16)(u >> 16);
}

/* The Philox stream of stochastic rounding (mt_rng_u32x4's `stream`, runtime/rng.h):
 * every backend draws its bits from (seed, MT_SR_STREAM, (offset + i) / 4). */
#define MT_SR_STREAM 0x5352u

/* Array conversions, n elements. The _sr variant draws its random bits from
 * Philox(seed, offset + i), so the result is independent of thread count. */
void mt_f32_to_bf16_array(mt_bf16 *dst, const float *src, size_t n);
void mt_f32_to_bf16_sr_array(mt_bf16 *dst, const float *src, size_t n, uint64_t seed, uint64_t offset);
void mt_bf16_to_f32_array(float *dst, const mt_bf16 *src, size_t n);

/* IEEE half <-> float32 (for float16 Hugging Face checkpoints). */
float mt_f16_to_f32(uint16_t h);
uint16_t mt_f32_to_f16(float f);

#ifdef __cplusplus
}
#endif
#endif
