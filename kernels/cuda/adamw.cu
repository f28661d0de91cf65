/* kernels/cuda/adamw.cu: AdamW on fp32 parameters and state (ops.h formula), every
 * segment of a parameter table in one launch (ops.h mt_adamw_segment).
 *
 * Elementwise and memory bound (28 bytes per parameter): each element is read and
 * written once by one thread, so no atomics and no order to fix. The launch cannot
 * size itself from the segments (they are in device memory: reading them would make
 * the host wait), so the grid is one full wave, 2048 resident threads per
 * multiprocessor, and the threads stride over the segments laid end to end: thread j
 * of S = gridDim.x * blockDim.x takes positions j, j + S, j + 2S, ... of the
 * concatenation, as a grid-stride loop over one flat buffer would. Every thread walks
 * the table (a few hundred 24-byte entries, the same for all threads: cached) keeping
 * the running start `base` of each segment, and finds its first element of segment s
 * as (j - base) mod S; no prefix table or search. Small segments (norm scales) then
 * take consecutive threads instead of all starting at thread 0.
 *
 * The bias corrections are computed on the host in fp64 exactly as kernels/cpu/adamw.c
 * does, and the per-element arithmetic follows the CPU's order, so results match it to
 * the ulp of sqrtf and fused multiply-adds (nvcc contracts a*b+c into FMA; the CPU build
 * does not, and neither does the emulator's host build, where the two are bitwise
 * equal). Stochastic rounding into bf16 compute weights belongs to the bf16 step
 * (issue 4). */
#include <math.h>

#include "kernels/cuda/common.cuh"

#define MT_ADAM_THREADS 256
#define MT_ADAM_THREADS_PER_SM 2048 /* resident threads per multiprocessor, sm_80 and sm_90 */

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                             int nsegs, float lr, float b1, float b2, float eps, float wd, float grad_scale,
                             float inv_bc1, float inv_bc2) {
    const float c1 = 1.0f - b1, c2 = 1.0f - b2;
    const int64_t S = (int64_t)gridDim.x * blockDim.x, j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int64_t base = 0; /* position of segment s's first element in the concatenation, mod S */
    for (int s = 0; s < nsegs; s++) {
        const int64_t off = segs[s].offset, n = segs[s].numel;
        const float wds = segs[s].decay ? wd : 0.0f;
        for (int64_t i = (j - base + S) % S; i < n; i += S) {
            const int64_t e = off + i;
            const float gi = grad_scale * g[e];
            const float mi = b1 * m[e] + c1 * gi;
            const float vi = b2 * v[e] + c2 * (gi * gi);
            m[e] = mi;
            v[e] = vi;
            const float pi = p[e];
            const float upd = (mi * inv_bc1) / (sqrtf(vi * inv_bc2) + eps);
            p[e] = pi - lr * (upd + wds * pi);
        }
        base = (base + n % S) % S;
    }
}

mt_status mt_cuda_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                        int nsegs, float lr, float b1, float b2, float eps, float wd, float grad_scale, int64_t t) {
    MT_CUDA_ENTER(be);
    if (nsegs < 0 || (nsegs > 0 && !segs))
        return mt_set_error(MT_ERR_INVALID, "adamw: %d segments at %p", nsegs, (const void *)segs);
    if (nsegs == 0) return MT_OK;
    int dev = 0, sms = 0;
    MT_CUDA_TRY(be, cudaGetDevice(&dev));
    MT_CUDA_TRY(be, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    const unsigned blocks = (unsigned)(sms > 0 ? sms : 1) * (MT_ADAM_THREADS_PER_SM / MT_ADAM_THREADS);
    const float inv_bc1 = (float)(1.0 / (1.0 - pow((double)b1, (double)t)));
    const float inv_bc2 = (float)(1.0 / (1.0 - pow((double)b2, (double)t)));
    adamw_kernel<<<blocks, MT_ADAM_THREADS>>>(p, g, m, v, segs, nsegs, lr, b1, b2, eps, wd, grad_scale, inv_bc1,
                                              inv_bc2);
    MT_CUDA_LAUNCHED(be, "adamw_kernel");
    return MT_OK;
}
