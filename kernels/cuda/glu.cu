/* kernels/cuda/glu.cu: gated MLP activation h = act(gate) * up and its VJP.
 *
 * Elementwise and memory bound: a grid-stride loop, one element per thread per step.
 * silu and gelu_tanh use expf/tanhf (IEEE-accurate to a few ulp; no fast-math), so the
 * results agree with the CPU's vmath.h to a few ulp, not bitwise. Tensors are float or
 * bfloat16 (common.cuh mt_ld / mt_st): widened, fp32 arithmetic, each output rounded
 * once. */
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

template <typename T>
__global__ void glu_fwd_kernel(T *h, const T *gate, const T *up, int64_t n, int act) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a, da;
        glu_act(mt_ld(gate, i), act, &a, &da);
        mt_st(h, i, a * mt_ld(up, i));
    }
}

/* In place allowed (ops.h glu_bwd): dgate may be gate and dup may be up. Each element
 * belongs to one thread, which loads gate, dh and up before it stores either output. */
template <typename T>
__global__ void glu_bwd_kernel(T *dgate, T *dup, const T *dh, const T *gate, const T *up, int64_t n, int act) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float a, da;
        glu_act(mt_ld(gate, i), act, &a, &da);
        const float g = mt_ld(dh, i), u = mt_ld(up, i);
        mt_st(dgate, i, g * u * da);
        mt_st(dup, i, g * a);
    }
}

mt_status mt_cuda_glu_fwd(mt_backend *be, void *h, const void *gate, const void *up, int64_t count,
                          mt_activation act, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "glu_fwd", dt));
    if (count <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, glu_fwd_kernel<T><<<mt_cuda_blocks(count, MT_GLU_THREADS), MT_GLU_THREADS>>>(
                                 (T *)h, (const T *)gate, (const T *)up, count, (int)act));
    MT_CUDA_LAUNCHED(be, "glu_fwd_kernel");
    return MT_OK;
}

mt_status mt_cuda_glu_bwd(mt_backend *be, void *dgate, void *dup, const void *dh, const void *gate, const void *up,
                          int64_t count, mt_activation act, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "glu_bwd", dt));
    if (count <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, glu_bwd_kernel<T><<<mt_cuda_blocks(count, MT_GLU_THREADS), MT_GLU_THREADS>>>(
                                 (T *)dgate, (T *)dup, (const T *)dh, (const T *)gate, (const T *)up, count,
                                 (int)act));
    MT_CUDA_LAUNCHED(be, "glu_bwd_kernel");
    return MT_OK;
}
