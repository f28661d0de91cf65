/* runtime/rng.c: Philox4x32-10 and the samplers built on it (see rng.h).
 *
 * The round function, multipliers and Weyl key increments are those of Random123's
 * philox.h (Salmon et al., SC'11), written once as inline host/device functions in
 * rng.h (the CUDA backend's stochastic rounding uses the same code): checked against
 * Random123's kat_vectors in tests/test_runtime.c. Samplers map element i to block
 * i / 4, word i % 4, so each element is a pure function of (seed, stream, i) and the
 * loops can be split over threads freely. */
#include "runtime/rng.h"

#include <math.h>

/* Parallelise only when there is enough work to pay for the thread start-up. */
#define MT_RNG_PAR_MIN 65536

void mt_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
    mt_philox4x32_10_inline(counter, key, out);
}

void mt_rng_u32x4(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]) {
    mt_rng_u32x4_inline(seed, stream, index, out);
}

float mt_rng_u01(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

/* Box-Muller on one pair of words (w0, w1) -> (z0, z1), both N(0, 1).
 * u1 = (w0>>8 + 1) / 2^24 lies in (0, 1], so log(u1) is finite (|z| <= 5.8). */
static void mt_box_muller(uint32_t w0, uint32_t w1, double *z0, double *z1) {
    const double two_pi = 6.283185307179586476925286766559;
    double u1 = ((double)(w0 >> 8) + 1.0) * (1.0 / 16777216.0);
    double u2 = (double)(w1 >> 8) * (1.0 / 16777216.0);
    double r = sqrt(-2.0 * log(u1));
    *z0 = r * cos(two_pi * u2);
    *z1 = r * sin(two_pi * u2);
}

/* Block b covers elements 4b .. 4b+3: words (0,1) give elements 4b, 4b+1 and words
 * (2,3) give 4b+2, 4b+3. */
void mt_rng_fill_normal(float *x, size_t n, float std, uint64_t seed, uint64_t stream) {
    if (!x || n == 0) return;
    const int64_t nblocks = (int64_t)((n + 3) / 4);
#pragma omp parallel for schedule(static) if (n >= MT_RNG_PAR_MIN)
    for (int64_t b = 0; b < nblocks; b++) {
        uint32_t w[4];
        mt_rng_u32x4(seed, stream, (uint64_t)b, w);
        double z[4];
        mt_box_muller(w[0], w[1], &z[0], &z[1]);
        mt_box_muller(w[2], w[3], &z[2], &z[3]);
        size_t i0 = (size_t)b * 4;
        for (size_t k = 0; k < 4 && i0 + k < n; k++) x[i0 + k] = (float)(z[k] * (double)std);
    }
}

void mt_rng_fill_uniform(float *x, size_t n, float lo, float hi, uint64_t seed, uint64_t stream) {
    if (!x || n == 0) return;
    const int64_t nblocks = (int64_t)((n + 3) / 4);
    const float span = hi - lo;
#pragma omp parallel for schedule(static) if (n >= MT_RNG_PAR_MIN)
    for (int64_t b = 0; b < nblocks; b++) {
        uint32_t w[4];
        mt_rng_u32x4(seed, stream, (uint64_t)b, w);
        size_t i0 = (size_t)b * 4;
        for (size_t k = 0; k < 4 && i0 + k < n; k++) {
            float v = lo + span * mt_rng_u01(w[k]);
            /* lo + span*u can round up to hi when u is just below 1; keep [lo, hi). */
            x[i0 + k] = (v < hi || !(hi > lo)) ? v : nextafterf(hi, lo);
        }
    }
}
