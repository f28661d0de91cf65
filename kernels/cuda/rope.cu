/* kernels/cuda/rope.cu: rotary position embedding in the HF rotate_half layout.
 *
 * One thread per (row, head, frequency i < Dh/2) rotates the pair (x[i], x[i + Dh/2]);
 * the angle is float(pos) * inv_freq[i] in fp32 as HF and kernels/cpu/rope.c compute it,
 * and cosf/sinf are the accurate (non-intrinsic) versions. The backward is the rotation
 * by -theta (the transpose), the same kernel with sign -1. x is float or bfloat16
 * (common.cuh mt_ld / mt_st): the pair is widened, rotated in fp32 and rounded once. */
#include "kernels/cuda/common.cuh"

#define MT_ROPE_THREADS 256

template <typename T>
__global__ void rope_kernel(T *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                            int64_t Dh, float sign) {
    const int64_t half = Dh / 2, total = N * H * half;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t % half, nh = t / half, n = nh / H;
        const float theta = (float)pos[n] * inv_freq[i];
        const float c = cosf(theta), s = sign * sinf(theta);
        T *row = x + nh * Dh;
        const float a = mt_ld(row, i), b = mt_ld(row, i + half);
        mt_st(row, i, a * c - b * s);
        mt_st(row, i + half, b * c + a * s);
    }
}

/* x rotated by +theta (sign 1, the forward) or -theta (-1, the VJP). */
static mt_status rope_run(mt_backend *be, const char *op, void *x, const int32_t *pos, const float *inv_freq,
                          int64_t N, int64_t H, int64_t Dh, mt_dtype dt, float sign) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, op, dt));
    if (N <= 0 || H <= 0 || Dh < 2) return MT_OK;
    const int64_t total = N * H * (Dh / 2);
    MT_CUDA_DT_SWITCH(dt, T, rope_kernel<T><<<mt_cuda_blocks(total, MT_ROPE_THREADS), MT_ROPE_THREADS>>>(
                                 (T *)x, pos, inv_freq, N, H, Dh, sign));
    MT_CUDA_LAUNCHED(be, "rope_kernel");
    return MT_OK;
}

mt_status mt_cuda_rope_fwd(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                           int64_t Dh, mt_dtype dt) {
    return rope_run(be, "rope_fwd", x, pos, inv_freq, N, H, Dh, dt, 1.0f);
}

mt_status mt_cuda_rope_bwd(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq, int64_t N,
                           int64_t H, int64_t Dh, mt_dtype dt) {
    return rope_run(be, "rope_bwd", dx, pos, inv_freq, N, H, Dh, dt, -1.0f);
}
