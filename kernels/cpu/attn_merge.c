/* kernels/cpu/attn_merge.c: merge two partial attention outputs of the same queries by
 * their log-sum-exp (ops.h attn_merge: the ring-attention combination, Liu et al. 2023,
 * with FlashAttention's rescaling, Dao et al. 2022 section 3.1). The reference the CUDA
 * kernel (kernels/cuda/attn_merge.cu) is held to: the same fp64 logaddexp, fp32
 * weights, and the unfused fp32 products and sum (ISO C mode keeps them unfused). With
 * bf16 out and out_b are widened and the fp32 sum rounded once (cpu_dtype.h). */
#include <math.h>

#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"

mt_status mt_cpu_attn_merge(mt_backend *be, void *out, float *lse, const void *out_b, const float *lse_b,
                            int64_t B, int64_t T, int64_t H, int64_t Dh, mt_dtype dt) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("attn_merge", dt));
    const int64_t rows = B * H * T;
#pragma omp parallel for schedule(static) if (rows * Dh >= 32768)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t b = r / (H * T), h = (r / T) % H, i = r % T; /* lse layout [B, H, T] */
        const float lbv = lse_b[r];
        if (lbv == -INFINITY) continue;
        const float lav = lse[r], mx = lav > lbv ? lav : lbv;
        const double ln = mx + log(exp((double)lav - mx) + exp((double)lbv - mx));
        const float wa = lav == -INFINITY ? 0.0f : (float)exp((double)lav - ln);
        const float wb = (float)exp((double)lbv - ln);
        const int64_t off = ((b * T + i) * H + h) * Dh; /* out layout [B, T, H, Dh] */
        if (dt == MT_F32) {
            float *o = (float *)out + off;
            const float *ob = (const float *)out_b + off;
            for (int64_t d = 0; d < Dh; d++) o[d] = wa * o[d] + wb * ob[d];
        } else {
            for (int64_t d = 0; d < Dh; d++)
                mt_cpu_st(out, off + d, wa * mt_cpu_ld(out, off + d, dt) + wb * mt_cpu_ld(out_b, off + d, dt), dt);
        }
        lse[r] = (float)ln;
    }
    return MT_OK;
}
