/* tests/cudaemu/include/cuda_bf16.h: bfloat16 for the CPU emulator, without a toolkit.
 *
 * bfloat16 is the top half of an IEEE binary32: 1 sign, 8 exponent, 7 fraction bits.
 * Conversions from float round to nearest, ties to even (_rn, the default) or toward
 * zero (_rz); a NaN becomes the canonical quiet NaN 0x7FFF as the toolkit's host path
 * gives (cuda_bf16.hpp); a finite value at or above 0x1.FFp127 + half an ulp rounds to
 * infinity under _rn. Arithmetic (__hadd, __hsub, __hmul, __hdiv, __hfma, operators) is
 * done in fp32 and rounded once to bf16 (RNE). For add, sub and mul this equals the
 * correctly rounded bf16 result (fp32's 24 bits >= 2 * 8 + 2: double rounding is
 * innocuous, Figueroa 1995); __hfma can differ from the device's single-rounding
 * fma.rn.bf16 in the last bit in rare double-rounding cases.
 * Usable from C (the functions) and C++ (also constructors and operators). */
#ifndef CUDAEMU_CUDA_BF16_H
#define CUDAEMU_CUDA_BF16_H

#include <string.h>

#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif

#define CUDAEMU_BF16_FN static inline __host__ __device__

/* The raw 16 bits. */
typedef struct __nv_bfloat16_raw {
    unsigned short x;
} __nv_bfloat16_raw;

struct __nv_bfloat16;
CUDAEMU_BF16_FN float cudaemu_bits2float(unsigned int u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
CUDAEMU_BF16_FN unsigned int cudaemu_float2bits(float f) {
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}
/* float -> bf16 bits, round to nearest even; NaN -> 0x7FFF. */
CUDAEMU_BF16_FN unsigned short cudaemu_f2bf_rn(float f) {
    unsigned int u = cudaemu_float2bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
    u += 0x7FFFu + ((u >> 16) & 1u); /* carries into the exponent (and to inf) as RNE wants */
    return (unsigned short)(u >> 16);
}
/* float -> bf16 bits, truncation; NaN -> 0x7FFF. */
CUDAEMU_BF16_FN unsigned short cudaemu_f2bf_rz(float f) {
    unsigned int u = cudaemu_float2bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
    return (unsigned short)(u >> 16);
}

/* A bfloat16 value. */
typedef struct __nv_bfloat16 {
    unsigned short __x;
#ifdef __cplusplus
    __nv_bfloat16() = default;
    __host__ __device__ __nv_bfloat16(const __nv_bfloat16_raw &r) : __x(r.x) {}
    __host__ __device__ __nv_bfloat16(float f) : __x(cudaemu_f2bf_rn(f)) {} /* RNE */
    __host__ __device__ __nv_bfloat16(double f) : __x(cudaemu_f2bf_rn((float)f)) {} /* via float */
    __host__ __device__ operator float() const { return cudaemu_bits2float((unsigned int)__x << 16); }
    __host__ __device__ operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
#endif
} __nv_bfloat16;

/* Two bfloat16 values (x low, y high: the layout of a 32-bit load). */
typedef struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
} __nv_bfloat162;

typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

CUDAEMU_BF16_FN __nv_bfloat16 cudaemu_bf16_bits(unsigned short b) {
    __nv_bfloat16 r;
    r.__x = b;
    return r;
}
/* The bits of h / a bfloat16 with bits b. */
CUDAEMU_BF16_FN unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
CUDAEMU_BF16_FN __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return cudaemu_bf16_bits(b); }
/* float -> bf16, round to nearest even (NaN -> 0x7FFF). */
CUDAEMU_BF16_FN __nv_bfloat16 __float2bfloat16(float f) { return cudaemu_bf16_bits(cudaemu_f2bf_rn(f)); }
CUDAEMU_BF16_FN __nv_bfloat16 __float2bfloat16_rn(float f) { return cudaemu_bf16_bits(cudaemu_f2bf_rn(f)); }
/* float -> bf16, round toward zero (NaN -> 0x7FFF). */
CUDAEMU_BF16_FN __nv_bfloat16 __float2bfloat16_rz(float f) { return cudaemu_bf16_bits(cudaemu_f2bf_rz(f)); }
/* bf16 -> float, exact. */
CUDAEMU_BF16_FN float __bfloat162float(__nv_bfloat16 h) { return cudaemu_bits2float((unsigned int)h.__x << 16); }
/* (RNE(a), RNE(b)) in (.x, .y). */
CUDAEMU_BF16_FN __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    __nv_bfloat162 r;
    r.x = __float2bfloat16_rn(a);
    r.y = __float2bfloat16_rn(b);
    return r;
}
CUDAEMU_BF16_FN __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) {
    __nv_bfloat162 r;
    r.x = a;
    r.y = b;
    return r;
}
CUDAEMU_BF16_FN __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 a) { return __halves2bfloat162(a, a); }
/* .x / .y of a pair, as float or bf16. */
CUDAEMU_BF16_FN float __low2float(__nv_bfloat162 v) { return __bfloat162float(v.x); }
CUDAEMU_BF16_FN float __high2float(__nv_bfloat162 v) { return __bfloat162float(v.y); }
CUDAEMU_BF16_FN __nv_bfloat16 __low2bfloat16(__nv_bfloat162 v) { return v.x; }
CUDAEMU_BF16_FN __nv_bfloat16 __high2bfloat16(__nv_bfloat162 v) { return v.y; }

/* Arithmetic in fp32, rounded once to bf16 (RNE). */
CUDAEMU_BF16_FN __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
}
CUDAEMU_BF16_FN __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __float2bfloat16_rn(__bfloat162float(a) - __bfloat162float(b));
}
CUDAEMU_BF16_FN __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __float2bfloat16_rn(__bfloat162float(a) * __bfloat162float(b));
}
CUDAEMU_BF16_FN __nv_bfloat16 __hdiv(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __float2bfloat16_rn(__bfloat162float(a) / __bfloat162float(b));
}
/* a * b + c: the product is exact in fp32, the sum rounds to fp32, then to bf16. */
CUDAEMU_BF16_FN __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return __float2bfloat16_rn(__bfloat162float(a) * __bfloat162float(b) + __bfloat162float(c));
}
CUDAEMU_BF16_FN __nv_bfloat16 __hneg(__nv_bfloat16 a) { return cudaemu_bf16_bits((unsigned short)(a.__x ^ 0x8000u)); }
/* Lane-wise versions on pairs. */
CUDAEMU_BF16_FN __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __halves2bfloat162(__hadd(a.x, b.x), __hadd(a.y, b.y));
}
CUDAEMU_BF16_FN __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
    return __halves2bfloat162(__hmul(a.x, b.x), __hmul(a.y, b.y));
}
CUDAEMU_BF16_FN __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
    return __halves2bfloat162(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}

#ifdef __cplusplus
/* Operators: the same fp32-then-round arithmetic; comparisons in fp32 (NaN unordered). */
#define CUDAEMU_BF16_BINOP(op, fn)                                                         \
    static inline __host__ __device__ __nv_bfloat16 operator op(__nv_bfloat16 a, __nv_bfloat16 b) { return fn(a, b); } \
    static inline __host__ __device__ __nv_bfloat16 &operator op##=(__nv_bfloat16 &a, __nv_bfloat16 b) { return a = fn(a, b); }
CUDAEMU_BF16_BINOP(+, __hadd)
CUDAEMU_BF16_BINOP(-, __hsub)
CUDAEMU_BF16_BINOP(*, __hmul)
CUDAEMU_BF16_BINOP(/, __hdiv)
#undef CUDAEMU_BF16_BINOP
static inline __host__ __device__ __nv_bfloat16 operator-(__nv_bfloat16 a) { return __hneg(a); }
#define CUDAEMU_BF16_CMP(op)                                                               \
    static inline __host__ __device__ bool operator op(__nv_bfloat16 a, __nv_bfloat16 b) { \
        return __bfloat162float(a) op __bfloat162float(b);                                 \
    }
CUDAEMU_BF16_CMP(==)
CUDAEMU_BF16_CMP(!=)
CUDAEMU_BF16_CMP(<)
CUDAEMU_BF16_CMP(<=)
CUDAEMU_BF16_CMP(>)
CUDAEMU_BF16_CMP(>=)
#undef CUDAEMU_BF16_CMP
static inline __host__ __device__ __nv_bfloat162 operator+(__nv_bfloat162 a, __nv_bfloat162 b) { return __hadd2(a, b); }
static inline __host__ __device__ __nv_bfloat162 operator*(__nv_bfloat162 a, __nv_bfloat162 b) { return __hmul2(a, b); }
#endif

#endif
