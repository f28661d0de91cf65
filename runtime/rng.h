/* runtime/rng.h: counter-based deterministic random numbers (Philox4x32-10).
 *
 * Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3" (SC'11); constants
 * and round function as in Random123's philox.h. Every draw is a pure function of
 * (key, counter), so initialisation and sampling give the same numbers whatever the
 * thread count, rank count or order of calls. */
#ifndef MT_RUNTIME_RNG_H
#define MT_RUNTIME_RNG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Host and device: nvcc compiles the inline functions below for both sides, so the CUDA
 * kernels (kernels/cuda/convert.cu, stochastic rounding) and rng.c share one
 * implementation. Empty for C and for the CPU emulator of the CUDA kernels. */
#if defined(__CUDACC__)
#define MT_RNG_HOST_DEVICE __host__ __device__
#else
#define MT_RNG_HOST_DEVICE
#endif

#define MT_PHILOX_M0 0xD2511F53u /* round multipliers */
#define MT_PHILOX_M1 0xCD9E8D57u
#define MT_PHILOX_W0 0x9E3779B9u /* Weyl key increments */
#define MT_PHILOX_W1 0xBB67AE85u

/* One Philox4x32-10 block, inline (what mt_philox4x32_10 calls): the round function,
 * multipliers and key schedule of Random123's philox.h. */
static inline MT_RNG_HOST_DEVICE void mt_philox4x32_10_inline(const uint32_t counter[4], const uint32_t key[2],
                                                              uint32_t out[4]) {
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) { /* key bump before rounds 2..10 (philox4x32bumpkey) */
            k0 += MT_PHILOX_W0;
            k1 += MT_PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)MT_PHILOX_M0 * c0;
        const uint64_t p1 = (uint64_t)MT_PHILOX_M1 * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* mt_rng_u32x4, inline (host and device). */
static inline MT_RNG_HOST_DEVICE void mt_rng_u32x4_inline(uint64_t seed, uint64_t stream, uint64_t index,
                                                          uint32_t out[4]) {
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    mt_philox4x32_10_inline(ctr, key, out);
}

/* One Philox4x32-10 block: out[4] = philox(counter[4], key[2]). */
void mt_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Four uniform 32-bit words for (seed, stream, index): counter = {index lo, index hi,
 * stream lo, stream hi}, key = {seed lo, seed hi}. */
void mt_rng_u32x4(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);

/* Uniform float in [0, 1) from a 32-bit word (24 significant bits). */
float mt_rng_u01(uint32_t w);

/* Fill x[0..n) with N(0, std^2) samples (Box-Muller on Philox words); element i
 * depends only on (seed, stream, i). */
void mt_rng_fill_normal(float *x, size_t n, float std, uint64_t seed, uint64_t stream);

/* Fill x[0..n) with U[lo, hi) samples; element i depends only on (seed, stream, i). */
void mt_rng_fill_uniform(float *x, size_t n, float lo, float hi, uint64_t seed, uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif
