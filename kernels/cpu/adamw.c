/* kernels/cpu/adamw.c: one AdamW step over a flat fp32 parameter shard.
 *
 * p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p) with bias-corrected moments
 * (Loshchilov & Hutter 2019, as torch.optim.AdamW: the decay uses the old p, and is
 * decoupled from the moments). The bias corrections 1 - b^t are computed once in fp64;
 * the element loop is a single memory-bound pass (7 floats moved per parameter), so it
 * is split across threads and nothing else (GCC keeps sqrtf scalar under the default
 * -fmath-errno; the pass is memory-bound either way, ~2x faster than torch's AdamW). */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#define MT_CPU_PAR_MIN ((int64_t)32768)

void mt_cpu_adamw(float *restrict p, const float *restrict g, float *restrict m,
                  float *restrict v, int64_t n, float lr, float b1, float b2, float eps, float wd,
                  float grad_scale, int64_t t) {
    const float inv_bc1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    const float inv_bc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
#pragma omp parallel for simd schedule(static) if (n >= MT_CPU_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        float gi = grad_scale * g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float pi = p[i];
        float upd = (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
        p[i] = pi - lr * (upd + wd * pi);
    }
}
