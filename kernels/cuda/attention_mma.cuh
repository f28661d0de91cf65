/* kernels/cuda/attention_mma.cuh: the tensor-core (mma.sync bf16) FlashAttention-2 path of
 * the CUDA backend's attention op; private to kernels/cuda and its tests.
 *
 * Same contracts as kernels/ops.h attention_fwd / attention_bwd (mt_attn_args: shapes,
 * masking by positions, window and segment ids, soft-cap, GQA/MQA, lse in natural log,
 * -inf and zero output for rows with no allowed key) for a->dtype == MT_BF16 only. The
 * math and the tiling are Dao, "FlashAttention-2" (2023), Algorithms 1 and 2; the
 * kernels and their rounding points are described in attention_mma.cu.
 * Declared with C linkage so that C tests can call them directly. */
#ifndef MT_KERNELS_CUDA_ATTENTION_MMA_CUH
#define MT_KERNELS_CUDA_ATTENTION_MMA_CUH

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if the mma kernels handle `a`: dtype MT_BF16, 8 <= Dh <= 512 with Dh % 8 == 0,
 * Hkv >= 1 and H % Hkv == 0. Shape only: pointers are checked by the entries below. */
int mt_cuda_attention_mma_supported(const mt_attn_args *a);

/* Device scratch bytes of the mma path for `a` (the backward's, which holds the
 * forward's): D = rowsum(dO * O) and, with positions or segment ids, the 16-row chunk
 * ranges (ops.h scratch_bytes). */
size_t mt_cuda_attention_mma_scratch(const mt_attn_args *a);

/* attention_fwd (ops.h) for bf16: out [B, Tq, H, Dh] bf16 (=), lse [B, H, Tq] fp32 (=);
 * q [B, Tq, H, Dh], k and v [B, Tk, Hkv, Dh] bf16. q, k, v and out must be 16-byte
 * aligned (cp.async sources). Errors: MT_ERR_INVALID (unsupported shape, misaligned
 * pointer; not sticky), MT_ERR_UNSUPPORTED (the device's opt-in shared memory is below
 * what the kernel needs), MT_ERR_RUNTIME (launch failure, sticky). Deterministic. */
mt_status mt_cuda_attention_mma_fwd(mt_backend *be, const mt_attn_args *a, void *out, float *lse, const void *q,
                                    const void *k, const void *v);

/* attention_bwd (ops.h) for bf16: dq [B, Tq, H, Dh], dk and dv [B, Tk, Hkv, Dh] bf16 (=)
 * from dout, q, k, v, out (bf16) and lse (fp32, as the forward wrote it). dq, dk, dv are
 * accumulated in fp32 registers by one owner each (no atomics: bitwise deterministic)
 * and rounded once. Uses the backend's attention scratch slot. Errors as the forward. */
mt_status mt_cuda_attention_mma_bwd(mt_backend *be, const mt_attn_args *a, void *dq, void *dk, void *dv,
                                    const void *dout, const void *q, const void *k, const void *v, const void *out,
                                    const float *lse);

#ifdef __cplusplus
}
#endif
#endif
