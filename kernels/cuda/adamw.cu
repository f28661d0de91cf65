/* kernels/cuda/adamw.cu: AdamW on fp32 parameters and state (ops.h formula).
 *
 * Elementwise: one grid-stride loop reading p, g, m, v once and writing p, m, v once
 * (memory bound, 28 bytes per parameter). The bias corrections are computed on the host
 * in fp64 exactly as kernels/cpu/adamw.c does, and the per-element arithmetic follows
 * the CPU's order, so results match it to the ulp of sqrtf and fused multiply-adds
 * (nvcc contracts a*b+c into FMA; the CPU build may not). Stochastic rounding into bf16
 * compute weights belongs to the bf16 step (issue 4). */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define MT_ADAM_THREADS 256

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                             float b2, float eps, float wd, float grad_scale, float inv_bc1, float inv_bc2) {
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float gi = grad_scale * g[i];
        const float mi = b1 * m[i] + c1 * gi;
        const float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        const float pi = p[i];
        const float upd = (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
        p[i] = pi - lr * (upd + wd * pi);
    }
}

mt_status mt_cuda_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                   float eps, float wd, float grad_scale, int64_t t) {
    MT_CUDA_ENTER(be);
    if (n <= 0) return MT_OK;
    const float inv_bc1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    const float inv_bc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    adamw_kernel<<<mt_cuda_blocks(n, MT_ADAM_THREADS), MT_ADAM_THREADS>>>(p, g, m, v, n, lr, b1, b2, eps, wd,
                                                                          grad_scale, inv_bc1, inv_bc2);
    MT_CUDA_LAUNCHED(be, "adamw_kernel");
    return MT_OK;
}
