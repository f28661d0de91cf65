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
