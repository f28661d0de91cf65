/* kernels/cuda/rope.cu: rotary position embedding in the HF rotate_half layout.
 *
 * One thread per (row, head, frequency i < Dh/2) rotates the pair (x[i], x[i + Dh/2]);
 * the angle is float(pos) * inv_freq[i] in fp32 as HF and kernels/cpu/rope.c compute it,
 * and cosf/sinf are the accurate (non-intrinsic) versions. The backward is the rotation
 * by -theta (the transpose), the same kernel with sign -1. */
#include "kernels/cuda/common.cuh"

#define MT_ROPE_THREADS 256

__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                            int64_t Dh, float sign) {
    const int64_t half = Dh / 2, total = N * H * half;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = t % half, nh = t / half, n = nh / H;
        const float theta = (float)pos[n] * inv_freq[i];
        const float c = cosf(theta), s = sign * sinf(theta);
        float *row = x + nh * Dh;
        const float a = row[i], b = row[i + half];
        row[i] = a * c - b * s;
        row[i + half] = b * c + a * s;
    }
}

mt_status mt_cuda_rope_fwd(mt_backend *be, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H, int64_t Dh) {
    MT_CUDA_ENTER(be);
    if (N <= 0 || H <= 0 || Dh < 2) return MT_OK;
    rope_kernel<<<mt_cuda_blocks(N * H * (Dh / 2), MT_ROPE_THREADS), MT_ROPE_THREADS>>>(x, pos, inv_freq, N, H, Dh,
                                                                                        1.0f);
    MT_CUDA_LAUNCHED(be, "rope_kernel");
    return MT_OK;
}

mt_status mt_cuda_rope_bwd(mt_backend *be, float *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H, int64_t Dh) {
    MT_CUDA_ENTER(be);
    if (N <= 0 || H <= 0 || Dh < 2) return MT_OK;
    rope_kernel<<<mt_cuda_blocks(N * H * (Dh / 2), MT_ROPE_THREADS), MT_ROPE_THREADS>>>(dx, pos, inv_freq, N, H, Dh,
                                                                                        -1.0f);
    MT_CUDA_LAUNCHED(be, "rope_kernel");
    return MT_OK;
}
