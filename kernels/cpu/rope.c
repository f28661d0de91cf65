/* kernels/cpu/rope.c: rotary position embedding (Su et al. 2021) in the Hugging Face
 * rotate_half layout: dimension i pairs with i + Dh/2, not with its neighbour.
 *
 * The angle is computed as HF does, theta = float(pos) * inv_freq in fp32, and each
 * token's cos/sin are computed once and applied to all H heads. The backward is the
 * transpose of a rotation, i.e. the rotation by -theta, so both share one routine.
 * bf16 (cpu_dtype.h): each chunk of a head's two halves is widened into fp32, rotated by
 * the same loop and rounded back once. */
#include <math.h>

#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_ROPE_CHUNK 128 /* frequencies whose cos/sin are held at once (on the stack) */

/* (a[i], b[i]) <- (a[i] c[i] - b[i] s[i], b[i] c[i] + a[i] s[i]) for i < ni. */
static inline void rope_pairs(float *restrict a, float *restrict b, const float *restrict c,
                              const float *restrict s, int64_t ni) {
#pragma omp simd
    for (int64_t i = 0; i < ni; i++) {
        const float x1 = a[i], x2 = b[i];
        a[i] = x1 * c[i] - x2 * s[i];
        b[i] = x2 * c[i] + x1 * s[i];
    }
}

/* Rotate every head of every row of x (of dt) by +theta (sign = 1) or -theta (sign = -1). */
static void rope_rotate(void *x, const int32_t *restrict pos, const float *restrict inv_freq, int64_t N,
                        int64_t H, int64_t Dh, float sign, mt_dtype dt) {
    const int64_t half = Dh / 2;
#pragma omp parallel for schedule(static) if (N * H * Dh >= MT_CPU_PAR_MIN)
    for (int64_t n = 0; n < N; n++) {
        float c[MT_ROPE_CHUNK], s[MT_ROPE_CHUNK];
        float aw[MT_ROPE_CHUNK], bw[MT_ROPE_CHUNK]; /* a bf16 chunk, widened */
        const float p = (float)pos[n];
        for (int64_t i0 = 0; i0 < half; i0 += MT_ROPE_CHUNK) {
            const int64_t ni = half - i0 < MT_ROPE_CHUNK ? half - i0 : MT_ROPE_CHUNK;
            for (int64_t i = 0; i < ni; i++) {
                const float theta = p * inv_freq[i0 + i];
                c[i] = cosf(theta);
                s[i] = sign * sinf(theta);
            }
            for (int64_t h = 0; h < H; h++) {
                const int64_t a0 = (n * H + h) * Dh + i0, b0 = a0 + half;
                if (dt == MT_F32) {
                    rope_pairs((float *)x + a0, (float *)x + b0, c, s, ni);
                } else {
                    mt_cpu_load(aw, x, a0, ni, dt);
                    mt_cpu_load(bw, x, b0, ni, dt);
                    rope_pairs(aw, bw, c, s, ni);
                    mt_cpu_store(x, a0, aw, ni, dt);
                    mt_cpu_store(x, b0, bw, ni, dt);
                }
            }
        }
    }
}

mt_status mt_cpu_rope_fwd(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("rope_fwd", dt));
    rope_rotate(x, pos, inv_freq, N, H, Dh, 1.0f, dt);
    return MT_OK;
}

mt_status mt_cpu_rope_bwd(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("rope_bwd", dt));
    rope_rotate(dx, pos, inv_freq, N, H, Dh, -1.0f, dt);
    return MT_OK;
}
