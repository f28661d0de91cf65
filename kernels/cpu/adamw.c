/* kernels/cpu/adamw.c: one AdamW step over the segments of a flat fp32 parameter shard
 * (ops.h adamw: a table of runs, each with its weight-decay flag).
 *
 * p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p) with bias-corrected moments
 * (Loshchilov & Hutter 2019, as torch.optim.AdamW: the decay uses the old p, and is
 * decoupled from the moments). The bias corrections 1 - b^t are computed once in fp64;
 * the element loop is a single memory-bound pass (7 floats moved per parameter), split
 * across threads in fixed blocks. GCC keeps sqrtf scalar under the default -fmath-errno
 * (the optimize attribute does not lift that), which made the pass compute-bound, so
 * where the CPU has AVX2 a block runs an intrinsics version of the same expression, 8
 * lanes at a time: vsqrtps and vdivps are correctly rounded like their scalar forms and
 * nothing is fused, so every element gets the same bits either way. */
#include <math.h>

#include "kernels/cpu/cpu_ops.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
#define MT_ADAMW_AVX2 1
#endif

#define MT_CPU_PAR_MIN ((int64_t)32768)
#define MT_ADAMW_BLOCK ((int64_t)8192) /* elements per work item */

typedef struct adamw_consts {
    float lr, b1, b2, c1, c2, eps, wd, grad_scale, inv_bc1, inv_bc2;
} adamw_consts;

/* Elements [i0, n) of the update. */
static void adamw_scalar(float *restrict p, const float *restrict g, float *restrict m,
                         float *restrict v, int64_t i0, int64_t n, const adamw_consts *k) {
    const float lr = k->lr, b1 = k->b1, b2 = k->b2, c1 = k->c1, c2 = k->c2, eps = k->eps;
    const float wd = k->wd, gs = k->grad_scale, inv_bc1 = k->inv_bc1, inv_bc2 = k->inv_bc2;
#pragma omp simd
    for (int64_t i = i0; i < n; i++) {
        float gi = gs * g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float pi = p[i];
        float upd = (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
        p[i] = pi - lr * (upd + wd * pi);
    }
}

#ifdef MT_ADAMW_AVX2
/* adamw_scalar's expression, operation for operation, 8 elements per step. */
__attribute__((target("avx2"))) static void adamw_avx2(float *restrict p, const float *restrict g,
                                                       float *restrict m, float *restrict v,
                                                       int64_t n, const adamw_consts *k) {
    const __m256 gs = _mm256_set1_ps(k->grad_scale), b1 = _mm256_set1_ps(k->b1);
    const __m256 b2 = _mm256_set1_ps(k->b2), c1 = _mm256_set1_ps(k->c1), c2 = _mm256_set1_ps(k->c2);
    const __m256 ib1 = _mm256_set1_ps(k->inv_bc1), ib2 = _mm256_set1_ps(k->inv_bc2);
    const __m256 eps = _mm256_set1_ps(k->eps), lr = _mm256_set1_ps(k->lr), wd = _mm256_set1_ps(k->wd);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_mul_ps(gs, _mm256_loadu_ps(g + i));
        const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(c1, gi));
        const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                        _mm256_mul_ps(c2, _mm256_mul_ps(gi, gi)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        const __m256 pi = _mm256_loadu_ps(p + i);
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, ib2)), eps);
        const __m256 upd = _mm256_div_ps(_mm256_mul_ps(mi, ib1), den);
        const __m256 step = _mm256_mul_ps(lr, _mm256_add_ps(upd, _mm256_mul_ps(wd, pi)));
        _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, step));
    }
    adamw_scalar(p, g, m, v, i, n, k);
}
#endif

/* One segment: elements [0, n) of p, g, m, v with constants k, split across threads in
 * fixed blocks of MT_ADAMW_BLOCK (the same elements get the same bits whatever the
 * split: the update is elementwise). */
static void adamw_range(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
                        int64_t n, const adamw_consts *k, int avx2) {
    const int64_t nblk = (n + MT_ADAMW_BLOCK - 1) / MT_ADAMW_BLOCK;
#pragma omp parallel for schedule(static) if (n >= MT_CPU_PAR_MIN)
    for (int64_t b = 0; b < nblk; b++) {
        const int64_t i0 = b * MT_ADAMW_BLOCK;
        const int64_t len = n - i0 < MT_ADAMW_BLOCK ? n - i0 : MT_ADAMW_BLOCK;
#ifdef MT_ADAMW_AVX2
        if (avx2) {
            adamw_avx2(p + i0, g + i0, m + i0, v + i0, len, k);
            continue;
        }
#endif
        (void)avx2;
        adamw_scalar(p + i0, g + i0, m + i0, v + i0, 0, len, k);
    }
}

mt_status mt_cpu_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                       int nsegs, float lr, float b1, float b2, float eps, float wd, float grad_scale, int64_t t) {
    (void)be;
    if (nsegs < 0 || (nsegs > 0 && !segs))
        return mt_set_error(MT_ERR_INVALID, "adamw: %d segments at %p", nsegs, (const void *)segs);
    for (int s = 0; s < nsegs; s++) /* sorted, disjoint, in range of int64 (ops.h) */
        if (segs[s].offset < 0 || segs[s].numel < 0 || segs[s].offset > INT64_MAX - segs[s].numel ||
            (s > 0 && segs[s].offset < segs[s - 1].offset + segs[s - 1].numel))
            return mt_set_error(MT_ERR_INVALID, "adamw: segment %d [%lld, +%lld) is negative, or starts before "
                                "the end of the segment before it", s, (long long)segs[s].offset,
                                (long long)segs[s].numel);
    const float inv_bc1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    const float inv_bc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
#ifdef MT_ADAMW_AVX2
    /* reads the CPU model that libgcc fills in at load time (no write, no race) */
    const int avx2 = __builtin_cpu_supports("avx2");
#else
    const int avx2 = 0;
#endif
    for (int s = 0; s < nsegs; s++) {
        const adamw_consts k = {lr, b1, b2, 1.0f - b1, 1.0f - b2, eps, segs[s].decay ? wd : 0.0f, grad_scale,
                                inv_bc1, inv_bc2};
        const int64_t o = segs[s].offset;
        adamw_range(p + o, g + o, m + o, v + o, segs[s].numel, &k, avx2);
    }
    return MT_OK;
}
