/* kernels/cuda/attn_merge.cu: merge two partial attention outputs of the same queries
 * by their log-sum-exp (ops.h attn_merge; Liu et al. 2023 ring attention, with
 * FlashAttention's rescaling, Dao et al. 2022 section 3.1). One grid-stride thread
 * per (b, h, t) row: the same fp64 logaddexp, fp32 weights and unfused fp32 products
 * and sum as the CPU reference (kernels/cpu/attn_merge.c; __fmul_rn / __fadd_rn keep
 * nvcc from contracting them into FMAs). No reduction across threads: deterministic.
 * out and out_b are float or bfloat16 (common.cuh mt_ld / mt_st): widened, the same fp32
 * sum, rounded once. */
#include "kernels/cuda/common.cuh"

#define MT_MERGE_THREADS 128

template <typename S>
__global__ void attn_merge_kernel(S *out, float *lse, const S *out_b, const float *lse_b, int64_t T,
                                  int64_t H, int64_t Dh, int64_t rows) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows; r += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = r / (H * T), h = (r / T) % H, i = r % T; /* lse layout [B, H, T] */
        const float lbv = lse_b[r];
        if (lbv == -INFINITY) continue;
        const float lav = lse[r], mx = lav > lbv ? lav : lbv;
        const double ln = (double)mx + log(exp((double)lav - (double)mx) + exp((double)lbv - (double)mx));
        const float wa = lav == -INFINITY ? 0.0f : (float)exp((double)lav - ln);
        const float wb = (float)exp((double)lbv - ln);
        S *o = out + ((b * T + i) * H + h) * Dh; /* out layout [B, T, H, Dh] */
        const S *ob = out_b + ((b * T + i) * H + h) * Dh;
        for (int64_t d = 0; d < Dh; d++)
            mt_st(o, d, __fadd_rn(__fmul_rn(wa, mt_ld(o, d)), __fmul_rn(wb, mt_ld(ob, d))));
        lse[r] = (float)ln;
    }
}

mt_status mt_cuda_attn_merge(mt_backend *be, void *out, float *lse, const void *out_b, const float *lse_b,
                             int64_t B, int64_t T, int64_t H, int64_t Dh, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "attn_merge", dt));
    const int64_t rows = B * H * T;
    if (rows <= 0 || Dh <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, S, attn_merge_kernel<S><<<mt_cuda_blocks(rows, MT_MERGE_THREADS), MT_MERGE_THREADS>>>(
                                 (S *)out, lse, (const S *)out_b, lse_b, T, H, Dh, rows));
    MT_CUDA_LAUNCHED(be, "attn_merge_kernel");
    return MT_OK;
}
