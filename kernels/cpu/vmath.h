/* kernels/cpu/vmath.h: exp and tanh that GCC can vectorise inside `omp simd` loops.
 *
 * glibc's expf/tanhf are opaque scalar calls, so a loop calling them runs one element at
 * a time; in attention and the loss the exponentials would then cost more than the
 * matrix products around them. These follow the Cephes single-precision algorithms
 * (S. L. Moshier, expf.c and tanhf.c): Cody-Waite range reduction plus a degree-6
 * polynomial for exp (about 2 ulp), and tanh's odd polynomial below 0.625 with
 * 1 - 2 / (exp(2|x|) + 1) above it (a few ulp).
 *
 * Written for the vectoriser: no float-to-int conversion (the "magic number" 1.5 * 2^23
 * rounds instead, which is defined for every input), and out-of-range lanes are fixed
 * with integer bit masks rather than ?: on floats. Under GCC's default -ftrapping-math a
 * float ?: lets the compiler move the arithmetic into a branch, which then cannot be
 * vectorised. */
#ifndef MT_KERNELS_CPU_VMATH_H
#define MT_KERNELS_CPU_VMATH_H

#include <stdint.h>
#include <string.h>

static inline uint32_t mt_vbits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float mt_vfloat(uint32_t b) {
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* All ones when c is nonzero, else zero. */
static inline uint32_t mt_vmask(int c) { return 0u - (uint32_t)(c != 0); }

/* e^x for float x. Inputs below -87 (including -INFINITY) give exactly 0, so masked
 * scores drop out of a softmax; inputs above 88 give 2^127 (1.7e38); NaN gives NaN. */
static inline float mt_vexpf(float x) {
    /* n = round(x / ln 2) via the magic number; r = x - n ln 2 with ln 2 in two parts */
    const float t = x * 1.44269504088896341f + 12582912.0f;
    const int32_t n = (int32_t)(mt_vbits(t) - 0x4B400000u);
    const float fn = t - 12582912.0f;
    float r = x - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = (p * (r * r) + r + 1.0f) * mt_vfloat(((uint32_t)n + 127u) << 23);
    const uint32_t keep = ~mt_vmask(x < -87.0f); /* NaN compares false: kept */
    const uint32_t big = mt_vmask(x > 88.0f);
    return mt_vfloat((mt_vbits(y) & keep & ~big) | (0x7F000000u & big));
}

/* mt_vexpf with its range reduction and polynomial steps fused (one rounding each):
 * the same algorithm and edge cases, results within about 1 ulp of mt_vexpf, in about
 * half the vector instructions. Call it only from functions compiled for a target
 * with FMA (e.g. __attribute__((target("avx2,fma"))), chosen at run time from the CPU):
 * elsewhere fmaf is a library call per element and nothing vectorises. */
static inline float mt_vexpf_fma(float x) {
    const float t = __builtin_fmaf(x, 1.44269504088896341f, 12582912.0f);
    const int32_t n = (int32_t)(mt_vbits(t) - 0x4B400000u);
    const float fn = t - 12582912.0f;
    float r = __builtin_fmaf(fn, -0.693359375f, x);
    r = __builtin_fmaf(fn, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = __builtin_fmaf(p, r, 1.3981999507e-3f);
    p = __builtin_fmaf(p, r, 8.3334519073e-3f);
    p = __builtin_fmaf(p, r, 4.1665795894e-2f);
    p = __builtin_fmaf(p, r, 1.6666665459e-1f);
    p = __builtin_fmaf(p, r, 5.0000001201e-1f);
    const float y = (__builtin_fmaf(p, r * r, r) + 1.0f) * mt_vfloat(((uint32_t)n + 127u) << 23);
    const uint32_t keep = ~mt_vmask(x < -87.0f); /* NaN compares false: kept */
    const uint32_t big = mt_vmask(x > 88.0f);
    return mt_vfloat((mt_vbits(y) & keep & ~big) | (0x7F000000u & big));
}

/* tanh(x) for float x; odd, saturates to +-1, NaN gives NaN. */
static inline float mt_vtanhf(float x) {
    const uint32_t sign = mt_vbits(x) & 0x80000000u;
    const float ax = mt_vfloat(mt_vbits(x) & 0x7FFFFFFFu);
    const float big = 1.0f - 2.0f / (mt_vexpf(2.0f * ax) + 1.0f);
    const float z = ax * ax;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    const float small = p * z * ax + ax;
    const uint32_t use_small = mt_vmask(ax < 0.625f);
    const uint32_t t = (mt_vbits(small) & use_small) | (mt_vbits(big) & ~use_small);
    return mt_vfloat(t | sign);
}

#endif
