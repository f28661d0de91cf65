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
 * (copy_to_host, sync), named by that call. Nothing exits or prints.
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

#include <cuda_bf16.h>
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
    void *ws;        /* the GEMM workspace (set_workspace; the plan's memory), or NULL */
    size_t ws_bytes;
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
/* *out = `bytes` of device scratch for the op being run: the bound workspace
 * (set_workspace; the plan's, shared with cuBLASLt: ops run one after another on the
 * compute stream) when one is bound, MT_ERR_INVALID naming both sizes when it is
 * smaller than `bytes` (ops.h scratch_bytes sized it for other shapes); without one,
 * the context's grow-only buffer of slot `slot` (freed by the backend's free; growing
 * calls cudaMalloc, which synchronises). Errors: MT_ERR_INVALID, MT_ERR_OOM (not
 * sticky), MT_ERR_RUNTIME. */
mt_status mt_cuda_scratch(mt_backend *be, int slot, size_t bytes, void **out);

/* The scratch bytes of each op that takes some, for the call's shapes (the same
 * functions size the op's request): rmsnorm_bwd's fp64 partials of N rows x D,
 * embedding_bwd's sort keys of N rows, attention_bwd's (either path), xent_tile's of R
 * rows; mt_cuda_scratch_bytes (ops.h scratch_bytes) takes their maximum. */
size_t mt_cuda_rmsnorm_bwd_scratch(int64_t N, int64_t D);
size_t mt_cuda_embedding_bwd_scratch(int64_t N);
size_t mt_cuda_attention_scratch(const mt_attn_args *a);
size_t mt_cuda_xent_tile_scratch(int64_t R);
size_t mt_cuda_sumsq_scratch(void);
size_t mt_cuda_scratch_bytes(mt_backend *be, const mt_scratch_query *q);

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

/* ---- dtypes (ops.h "Dtypes") ----
 * A `void *` tensor of an op holds MT_F32 (float) or MT_BF16 (__nv_bfloat16). Kernels
 * are templates on the storage type T and see fp32 only through mt_ld / mt_st: mt_ld
 * widens exactly, mt_st rounds once to nearest even with the bit operation of
 * runtime/dtype.h mt_f32_to_bf16 (a NaN keeps its sign and payload, made quiet), so the
 * bits equal the CPU backend's; cvt.rn.bf16.f32 would give the canonical NaN instead.
 * For T = float both are plain loads and stores: MT_F32 computes what it did before. */

/* runtime/dtype.h mt_f32_to_bf16: float32 -> bfloat16 bits, round to nearest even. */
__device__ __forceinline__ uint16_t mt_cuda_f32_to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* runtime/dtype.h mt_f32_to_bf16_sr: stochastic rounding, rand16 in [0, 65536). */
__device__ __forceinline__ uint16_t mt_cuda_f32_to_bf16_sr(float f, uint32_t rand16) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)((u >> 16) | ((u & 0x007fffffu) ? 0x0040u : 0u));
    u += (rand16 & 0xffffu);
    return (uint16_t)(u >> 16);
}

/* bfloat16 bits -> float32 (exact). */
__device__ __forceinline__ float mt_cuda_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ float mt_ld(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float mt_ld(const __nv_bfloat16 *p, int64_t i) {
    return mt_cuda_bf16_to_f32(__bfloat16_as_ushort(p[i]));
}
__device__ __forceinline__ void mt_st(float *p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void mt_st(__nv_bfloat16 *p, int64_t i, float v) {
    p[i] = __ushort_as_bfloat16(mt_cuda_f32_to_bf16(v));
}
/* v as the storage type would round it, back in fp32 (identity for float). */
__device__ __forceinline__ float mt_round_as(const float *, float v) { return v; }
__device__ __forceinline__ float mt_round_as(const __nv_bfloat16 *, float v) {
    return mt_cuda_bf16_to_f32(mt_cuda_f32_to_bf16(v));
}

/* MT_OK when `dt` is a compute dtype of this backend (MT_F32, or MT_BF16 when
 * caps.compute_dtypes has it); else MT_ERR_INVALID "cuda: <op>: dtype ..." (not sticky:
 * nothing ran). */
mt_status mt_cuda_check_dtype(const mt_backend *be, const char *op, mt_dtype dt);

/* Launch `kernel<T>` for T = float (MT_F32) or __nv_bfloat16 (MT_BF16): the dtype
 * switch of every op, in one place. Call only after mt_cuda_check_dtype. */
#define MT_CUDA_DT_SWITCH(dt, T, ...)                                                     \
    do {                                                                                  \
        if ((dt) == MT_BF16) {                                                            \
            typedef __nv_bfloat16 T;                                                      \
            __VA_ARGS__;                                                                  \
        } else {                                                                          \
            typedef float T;                                                              \
            __VA_ARGS__;                                                                  \
        }                                                                                 \
    } while (0)

/* ---- the op implementations (one file each), same contracts as kernels/ops.h ---- */
mt_status mt_cuda_gemm(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const void *A, int64_t lda, const void *B, int64_t ldb, mt_dtype ab_dt, float beta, void *C,
                       int64_t ldc, mt_dtype c_dt);
mt_status mt_cuda_embedding_fwd(mt_backend *be, void *out, const void *table, const int32_t *tokens, int64_t N,
                                int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt);
mt_status mt_cuda_embedding_bwd(mt_backend *be, float *dtable, const void *dout, const int32_t *tokens, int64_t N,
                                int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt);
mt_status mt_cuda_add_rmsnorm_fwd(mt_backend *be, void *h, void *y, float *rstd, const void *x, const void *r,
                                  const void *w, int64_t N, int64_t D, float eps, float w_offset, mt_dtype dt);
mt_status mt_cuda_rmsnorm_fwd(mt_backend *be, void *y, float *rstd, const void *x, const void *w, int64_t N,
                              int64_t D, float eps, float w_offset, mt_dtype dt);
mt_status mt_cuda_rmsnorm_bwd(mt_backend *be, void *dx, float *dw, const void *dy, const void *x, const void *w,
                              const float *rstd, int64_t N, int64_t D, float w_offset, mt_dtype dt);
mt_status mt_cuda_rope_fwd(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                           int64_t Dh, mt_dtype dt);
mt_status mt_cuda_rope_bwd(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq, int64_t N,
                           int64_t H, int64_t Dh, mt_dtype dt);
mt_status mt_cuda_attention_fwd(mt_backend *be, const mt_attn_args *a, void *out, float *lse, const void *q,
                                const void *k, const void *v);
mt_status mt_cuda_attention_bwd(mt_backend *be, const mt_attn_args *a, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v, const void *out,
                                const float *lse);
mt_status mt_cuda_glu_fwd(mt_backend *be, void *h, const void *gate, const void *up, int64_t count,
                          mt_activation act, mt_dtype dt);
mt_status mt_cuda_glu_bwd(mt_backend *be, void *dgate, void *dup, const void *dh, const void *gate, const void *up,
                          int64_t count, mt_activation act, mt_dtype dt);
mt_status mt_cuda_xent_tile(mt_backend *be, float *logits, void *dlogits, mt_dtype ddt, const int32_t *labels,
                            int64_t R, int64_t V, float softcap, int32_t ignore_index, float dscale,
                            double *stats);
mt_status mt_cuda_vocab_tile_max(mt_backend *be, float *z, int64_t R, int64_t Vl, float softcap, float *mx,
                                  int accumulate);
mt_status mt_cuda_vocab_tile_sumexp(mt_backend *be, const float *z, int64_t R, int64_t Vl, const float *mx,
                                    const int32_t *labels, int64_t v0, int32_t ignore_index, double *sz,
                                    int accumulate);
mt_status mt_cuda_vocab_tile_grad(mt_backend *be, float *z, int64_t R, int64_t Vl, const float *mx, const double *sz,
                                  const int32_t *labels, int64_t v0, int32_t ignore_index, float softcap,
                                  float dscale, int write_grad, double *stats);
mt_status mt_cuda_axpy(mt_backend *be, void *y, const void *x, float alpha, int64_t n, mt_dtype dt);
mt_status mt_cuda_scale(mt_backend *be, void *x, float alpha, int64_t n, mt_dtype dt);
mt_status mt_cuda_sumsq(mt_backend *be, const float *x, int64_t n, double *acc);
mt_status mt_cuda_attn_merge(mt_backend *be, void *out, float *lse, const void *out_b, const float *lse_b,
                             int64_t B, int64_t T, int64_t H, int64_t Dh, mt_dtype dt);
mt_status mt_cuda_grad_accumulate(mt_backend *be, void *acc, mt_dtype dtype, const float *x, int64_t n, int first);
mt_status mt_cuda_to_f32(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n);
mt_status mt_cuda_from_f32(mt_backend *be, void *dst, mt_dtype dtype, const float *src, int64_t n, int stochastic,
                           uint64_t seed, uint64_t offset);
mt_status mt_cuda_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                        int nsegs, float lr, float b1, float b2, float eps, float wd, float grad_scale, int64_t t);

#endif
