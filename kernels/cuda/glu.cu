/* kernels/cuda/glu.cu: gated MLP activation h = act(gate) * up and its VJP.
 *
 * Elementwise and memory bound: a grid-stride loop, one element per thread per step.
 * silu and gelu_tanh use expf/tanhf (IEEE-accurate to a few ulp; no fast-math), so the
 * results agree with the CPU's vmath.h to a few ulp, not bitwise. */
#include "kernels/cuda/common.cuh"

#define MT_GLU_THREADS 256

__device__ __forceinline__ void glu_act(float x, int act, float *a, float *da) {
    if (act == MT_ACT_SILU) {
        const float s = 1.0f / (1.0f + expf(-x));
        *a = x * s;
        *da = s * (1.0f + x * (1.0f - s));
    } else {
        const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
        const float u = c * (x + 0.044715f * x * x * x);
        const float t = tanhf(u);
        *a = 0.5f * x * (1.0f + t);
        *da = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * 0.044715f * x * x);
    }
}

__global__ void glu_fwd_kernel(float *h, const float *gate, const float *up, int64_t n, int act) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a, da;
        glu_act(gate[i], act, &a, &da);
        h[i] = a * up[i];
    }
}

__global__ void glu_bwd_kernel(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                               int64_t n, int act) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a, da;
        glu_act(gate[i], act, &a, &da);
        const float g = dh[i], u = up[i];
        dgate[i] = g * u * da;
        dup[i] = g * a;
    }
}

mt_status mt_cuda_glu_fwd(mt_backend *be, float *h, const float *gate, const float *up, int64_t count, mt_activation act) {
    MT_CUDA_ENTER(be);
    if (count <= 0) return MT_OK;
    glu_fwd_kernel<<<mt_cuda_blocks(count, MT_GLU_THREADS), MT_GLU_THREADS>>>(h, gate, up, count, (int)act);
    MT_CUDA_LAUNCHED(be, "glu_fwd_kernel");
    return MT_OK;
}

mt_status mt_cuda_glu_bwd(mt_backend *be, float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                     int64_t count, mt_activation act) {
    MT_CUDA_ENTER(be);
    if (count <= 0) return MT_OK;
    glu_bwd_kernel<<<mt_cuda_blocks(count, MT_GLU_THREADS), MT_GLU_THREADS>>>(dgate, dup, dh, gate, up, count,
                                                                              (int)act);
    MT_CUDA_LAUNCHED(be, "glu_bwd_kernel");
    return MT_OK;
}
