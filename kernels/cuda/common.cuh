/* kernels/cuda/common.cuh: what every CUDA op file shares: error checks, launch
 * helpers, block reductions in a fixed order, and the backend's internal entry points.
 *
 * Errors: the op table's functions return void, so a failed CUDA or cuBLASLt call is
 * recorded with mt_set_error(MT_ERR_RUNTIME, ...) on the calling thread and in a sticky
 * flag (mt_cuda_failed) and the op returns; nothing exits or prints (STYLE.md).
 *
 * Determinism: every reduction here has one owner per output and a fixed order that
 * depends only on the shapes (never on the device's SM count or on timing), and no
 * kernel uses atomics, so two runs give bitwise the same results (ops.h).
 *
 * All work is queued on the legacy default stream (0), the compute stream that
 * mt_cuda_compute_stream() returns; copies are synchronous. Collectives run on their
 * own stream (parallel/comm_nccl.c), ordered against this one with events.
 * UNVERIFIED: this backend was written on a machine without a GPU; it compiles and
 * links, but no kernel here has run yet (tests/test_gpu_ops.c, bench/gpu_check.sh). */
#ifndef MT_KERNELS_CUDA_COMMON_CUH
#define MT_KERNELS_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "runtime/status.h"

/* Record a failed call (first failure wins the sticky flag; every one sets the error). */
void mt_cuda_fail(const char *file, int line, const char *what, const char *msg);
/* 1 after any CUDA failure in this process. */
int mt_cuda_failed(void);

#define MT_CUDA_CHECK(call)                                                               \
    do {                                                                                  \
        cudaError_t mt_e_ = (call);                                                       \
        if (mt_e_ != cudaSuccess) mt_cuda_fail(__FILE__, __LINE__, #call, cudaGetErrorString(mt_e_)); \
    } while (0)

/* After a kernel launch: catches bad launch configurations (not asynchronous faults,
 * which surface at the next synchronising call). */
#define MT_CUDA_LAUNCHED() MT_CUDA_CHECK(cudaGetLastError())

/* Blocks of `threads` covering n items, capped for grid-stride loops. */
static inline unsigned mt_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return (unsigned)b;
}

/* A device scratch buffer of at least `bytes` for internal slot `slot` (grow-only,
 * freed at exit by the driver). Growing calls cudaMalloc, which synchronises; sizes
 * settle after the first step. NULL on failure (error recorded). */
enum { MT_CUDA_SCRATCH_REDUCE = 0, MT_CUDA_SCRATCH_EMBED, MT_CUDA_SCRATCH_ATTN, MT_CUDA_SCRATCH_XENT,
       MT_CUDA_SCRATCH_COUNT };
void *mt_cuda_scratch(int slot, size_t bytes);

/* Sum of a block's per-thread values in a fixed tree order (warp shuffles, then warp
 * 0 over the per-warp sums); every thread gets the result. blockDim.x must be a
 * multiple of 32 and at most 1024. `sh` holds 32 values of T. */
template <typename T>
__device__ __forceinline__ T mt_block_sum(T v, T *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : (T)0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* Maximum of a block's values, same shape as mt_block_sum. */
__device__ __forceinline__ float mt_block_max(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : -INFINITY;
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

/* ---- the op implementations (one file each), same contracts as kernels/ops.h ---- */
void mt_cuda_gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc);
void mt_cuda_embedding_fwd(float *out, const float *table, const int32_t *tokens, int64_t N,
                           int64_t D, float scale);
void mt_cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int64_t N,
                           int64_t V, int64_t D, float scale);
void mt_cuda_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t N,
                         int64_t D, float eps, float w_offset);
void mt_cuda_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                         const float *rstd, int64_t N, int64_t D, float w_offset);
void mt_cuda_rope_fwd(float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                      int64_t Dh);
void mt_cuda_rope_bwd(float *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                      int64_t Dh);
void mt_cuda_attention_fwd(const mt_attn_args *a, float *out, float *lse, const float *q,
                           const float *k, const float *v);
void mt_cuda_attention_bwd(const mt_attn_args *a, float *dq, float *dk, float *dv,
                           const float *dout, const float *q, const float *k, const float *v,
                           const float *out, const float *lse);
void mt_cuda_glu_fwd(float *h, const float *gate, const float *up, int64_t count, mt_activation act);
void mt_cuda_glu_bwd(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                     int64_t count, mt_activation act);
void mt_cuda_xent_tile(float *logits, const int32_t *labels, int64_t R, int64_t V, float softcap,
                       int32_t ignore_index, float dscale, double *loss_sum, int64_t *count);
void mt_cuda_axpy(float *y, const float *x, float alpha, int64_t n);
void mt_cuda_scale(float *x, float alpha, int64_t n);
double mt_cuda_sumsq(const float *x, int64_t n);
void mt_cuda_adamw(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                   float b2, float eps, float wd, float grad_scale, int64_t t);

#endif
