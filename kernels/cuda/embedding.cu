/* kernels/cuda/embedding.cu: the token embedding lookup (ops.h embedding_fwd).
 *
 * Forward: out[n, :] = scale * table[tokens[n] - v0, :], one block per row (out and
 * table float or bfloat16: one fp32 multiply of the widened entry, one rounding); the
 * table holds rows [v0, v0 + V) and a row whose token lies outside is left untouched.
 * The backward (embedding_bwd: a device sort of the tokens, then one owner per table
 * row) is in kernels/cuda/embedding_bwd.cu. */
#include "kernels/cuda/common.cuh"

#define MT_EMB_THREADS 256

template <typename T>
__global__ void embedding_fwd_kernel(T *out, const T *table, const int32_t *tokens, int64_t v0, int64_t V, int64_t D,
                                     float scale) {
    const int64_t n = blockIdx.x, v = (int64_t)tokens[n] - v0;
    if (v < 0 || v >= V) return; /* the whole block: another chunk's row */
    const T *src = table + v * D;
    T *dst = out + n * D;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) mt_st(dst, d, scale * mt_ld(src, d));
}

mt_status mt_cuda_embedding_fwd(mt_backend *be, void *out, const void *table, const int32_t *tokens, int64_t N,
                                int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "embedding_fwd", dt));
    if (N <= 0 || D <= 0 || V <= 0) return MT_OK;
    MT_CUDA_DT_SWITCH(dt, T, embedding_fwd_kernel<T><<<(unsigned)N, MT_EMB_THREADS>>>((T *)out, (const T *)table,
                                                                                       tokens, v0, V, D, scale));
    MT_CUDA_LAUNCHED(be, "embedding_fwd_kernel");
    return MT_OK;
}
