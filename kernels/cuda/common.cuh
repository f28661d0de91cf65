/* kernels/cuda/common.cuh: what every CUDA op file shares: error checks, launch
 * helpers, block reductions in a fixed order, and the backend's internal entry points.
 *
 * Errors: every op returns mt_status (kernels/ops.h). Each op starts with
 * MT_CUDA_ENTER (a sticky error of the backend's context is returned at once), checks
 * every launch with MT_CUDA_LAUNCHED (cudaGetLastError: MT_ERR_RUNTIME "cuda:
 * <kernel> launch: <CUDA's text>") and every runtime call with MT_CUDA_TRY ("cuda:
 * <call>: <text>"); cuBLASLt failures name the call and cublasLtGetStatusString
 * (gemm.cu). A failure of the device (anything but a bad argument or an allocation
 * that did not fit) is sticky: it is kept in the context (mt_cuda_ctx) and every later
 * op returns it. Asynchronous faults surface at the next synchronising call
 * (copy_to_host, sync, sumsq, xent_tile), named by that call. Nothing exits or prints.
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

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "runtime/status.h"

/* Scratch slots of the context (grow-only device buffers for ops' internal use). */
enum { MT_CUDA_SCRATCH_REDUCE = 0, MT_CUDA_SCRATCH_EMBED, MT_CUDA_SCRATCH_ATTN, MT_CUDA_SCRATCH_XENT,
       MT_CUDA_SCRATCH_COUNT };

/* The CUDA backend's context (mt_backend.ctx). The gemm plan cache, cuBLASLt handle
 * and workspace stay per process (gemm.cu): one device per process. */
typedef struct mt_cuda_ctx {
    mt_status sticky;                            /* MT_OK, or the first device failure */
    char msg[512];                               /* its message */
    void *scratch[MT_CUDA_SCRATCH_COUNT];
    size_t scratch_bytes[MT_CUDA_SCRATCH_COUNT];
} mt_cuda_ctx;

/* Record a failure of `what` (CUDA's text in msg) in the calling thread's error as
 * "cuda: <what>: <msg>" and, with sticky != 0, in the context; returns MT_ERR_RUNTIME. */
mt_status mt_cuda_fail(mt_backend *be, const char *what, const char *msg, int sticky);

/* At the start of every op: return the context's sticky error, if any. */
#define MT_CUDA_ENTER(be)                                                                 \
    do {                                                                                  \
        const mt_cuda_ctx *mt_c_ = (const mt_cuda_ctx *)(be)->ctx;                        \
        if (mt_c_->sticky != MT_OK) return mt_set_error(mt_c_->sticky, "%s", mt_c_->msg); \
    } while (0)

/* A CUDA runtime call: on failure return MT_ERR_RUNTIME naming the call (sticky). */
#define MT_CUDA_TRY(be, call)                                                             \
    do {                                                                                  \
        cudaError_t mt_e_ = (call);                                                       \
        if (mt_e_ != cudaSuccess) return mt_cuda_fail((be), #call, cudaGetErrorString(mt_e_), 1); \
    } while (0)

/* After a kernel launch: catches bad launch configurations and earlier sticky faults
 * (not asynchronous faults of this kernel, which surface at the next synchronising
 * call); the message names the kernel: "cuda: <name> launch: <text>". */
#define MT_CUDA_LAUNCHED(be, name)                                                        \
    do {                                                                                  \
        cudaError_t mt_e_ = cudaGetLastError();                                           \
        if (mt_e_ != cudaSuccess) return mt_cuda_fail((be), name " launch", cudaGetErrorString(mt_e_), 1); \
    } while (0)

/* Blocks of `threads` covering n items, capped for grid-stride loops. */
static inline unsigned mt_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return (unsigned)b;
}

/* *out = the context's device scratch buffer of slot `slot`, at least `bytes` (grow-only,
 * freed by the backend's free). Growing calls cudaMalloc, which synchronises; sizes
 * settle after the first step. Errors: MT_ERR_OOM (not sticky), MT_ERR_RUNTIME. */
mt_status mt_cuda_scratch(mt_backend *be, int slot, size_t bytes, void **out);

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
mt_status mt_cuda_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                  int64_t ldc);
mt_status mt_cuda_embedding_fwd(mt_backend *be, float *out, const float *table, const int32_t *tokens, int64_t N,
                           int64_t D, float scale);
mt_status mt_cuda_embedding_bwd(mt_backend *be, float *dtable, const float *dout, const int32_t *tokens, int64_t N,
                           int64_t V, int64_t D, float scale);
mt_status mt_cuda_rmsnorm_fwd(mt_backend *be, float *y, float *rstd, const float *x, const float *w, int64_t N,
                         int64_t D, float eps, float w_offset);
mt_status mt_cuda_rmsnorm_bwd(mt_backend *be, float *dx, float *dw, const float *dy, const float *x, const float *w,
                         const float *rstd, int64_t N, int64_t D, float w_offset);
mt_status mt_cuda_rope_fwd(mt_backend *be, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                      int64_t Dh);
mt_status mt_cuda_rope_bwd(mt_backend *be, float *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                      int64_t Dh);
mt_status mt_cuda_attention_fwd(mt_backend *be, const mt_attn_args *a, float *out, float *lse, const float *q,
                           const float *k, const float *v);
mt_status mt_cuda_attention_bwd(mt_backend *be, const mt_attn_args *a, float *dq, float *dk, float *dv,
                           const float *dout, const float *q, const float *k, const float *v,
                           const float *out, const float *lse);
mt_status mt_cuda_glu_fwd(mt_backend *be, float *h, const float *gate, const float *up, int64_t count, mt_activation act);
mt_status mt_cuda_glu_bwd(mt_backend *be, float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                     int64_t count, mt_activation act);
mt_status mt_cuda_xent_tile(mt_backend *be, float *logits, const int32_t *labels, int64_t R, int64_t V, float softcap,
                       int32_t ignore_index, float dscale, double *loss_sum, int64_t *count);
mt_status mt_cuda_axpy(mt_backend *be, float *y, const float *x, float alpha, int64_t n);
mt_status mt_cuda_scale(mt_backend *be, float *x, float alpha, int64_t n);
mt_status mt_cuda_sumsq(mt_backend *be, const float *x, int64_t n, double *out);
mt_status mt_cuda_attn_merge(mt_backend *be, float *out, float *lse, const float *out_b, const float *lse_b,
                             int64_t B, int64_t T, int64_t H, int64_t Dh);
mt_status mt_cuda_grad_accumulate(mt_backend *be, void *acc, mt_dtype dtype, const float *x, int64_t n, int first);
mt_status mt_cuda_to_f32(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n);
mt_status mt_cuda_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                   float b2, float eps, float wd, float grad_scale, int64_t t);

#endif
