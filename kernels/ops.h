/* kernels/ops.h: the op table every backend implements (the only code that reads
 * or writes backend memory).
 *
 * models/ and train/ call only these entries, never a backend directly: a backend is
 * an object (mt_backend, kernels/backend.h: this table as its interface, a context
 * holding streams, scratch buffers and a sticky error, and its capabilities) and
 * every op is called as `be->ops->gemm(be, ...)`. Pointers are in the backend's
 * memory (host memory for the CPU backend, device memory for CUDA: caps.device_memory).
 *
 * Errors: every op returns mt_status (MT_OK == 0) and records its message with
 * mt_set_error (runtime/status.h); callers check it (MT_TRY), GCC warns when one does
 * not (MT_MUST_CHECK). An asynchronous backend (CUDA) reports a failed launch from the
 * op that launched it (MT_ERR_RUNTIME, the message names the kernel), and a fault that
 * happens later on the device from the next synchronising op (copy_to_host, sync),
 * naming that call. After a failure of the device itself (not a bad argument) the
 * backend's error is sticky: every later op returns it without running (the state of
 * backend memory is unknown). Ops validate only what would otherwise crash the host;
 * shape contracts below are the caller's to keep.
 * All tensors are row-major and contiguous; float tensors are float32 unless a name
 * says otherwise; token ids and positions are int32. "+=" in a comment means the op
 * accumulates into its output, "=" that it overwrites it.
 *
 * Shape letters: N token rows (batch x sequence, B*T), D d_model, V vocabulary,
 * H query heads, Hkv key/value heads, Dh head_dim, F mlp_dim, R rows of a loss tile.
 *
 * The CPU backend (kernels/cpu/) is the reference the CUDA backend is tested against,
 * op by op. Every op is deterministic: the same inputs give bitwise the same outputs
 * whatever the thread count (no atomics, fixed reduction order). */
#ifndef MT_KERNELS_OPS_H
#define MT_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/dtype.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* On a function-pointer member: GCC and Clang warn when a caller drops the status. */
#if defined(__GNUC__)
#define MT_MUST_CHECK __attribute__((warn_unused_result))
#else
#define MT_MUST_CHECK
#endif

typedef struct mt_backend mt_backend; /* kernels/backend.h */

typedef enum mt_activation {
    MT_ACT_SILU = 0,       /* SwiGLU: silu(gate) * up (Llama) */
    MT_ACT_GELU_TANH = 1   /* GeGLU: gelu_tanh(gate) * up (Gemma; HF "gelu_pytorch_tanh") */
} mt_activation;

/* Arguments of causal self-attention.
 * q [B, Tq, H, Dh], k and v [B, Tk, Hkv, Dh], out [B, Tq, H, Dh], lse [B, H, Tq].
 * Query head h reads kv head h / (H / Hkv) (GQA; MQA when Hkv == 1; H % Hkv == 0).
 * Score s = scale * <q, k>; if softcap > 0, s = softcap * tanh(s / softcap)
 * (Gemma 2, HF modeling_gemma2.py). Query i may attend key j iff
 * 0 <= q_pos[i] - k_pos[j] and (window <= 0 or q_pos[i] - k_pos[j] < window)
 * (HF sliding-window semantics). q_pos / k_pos are [Tq] / [Tk] original positions
 * (context parallelism passes its chunks' positions); NULL means 0, 1, 2, ...
 * Document masking (packed sequences): q_seg [B, Tq] and k_seg [B, Tk] are int32
 * segment ids per row, in backend memory; when both are set, query i of sequence b
 * may attend key j only if in addition q_seg[b, i] == k_seg[b, j] (MaxText's
 * AttentionOp.generate_attention_mask in MaxText/layers/attentions.py: the mask
 * decoder_segment_ids[:, :, None] == decoder_segment_ids[:, None, :], and'ed with the
 * causal mask). Ids are compared for equality only (any int32 values, any order).
 * NULL (both) = no segment masking; setting only one of them is a caller error.
 * lse[b, h, i] = log sum_j exp(s_ij) over allowed j (natural log, after softcap);
 * a row with no allowed key gets lse = -INFINITY and out = 0. */
typedef struct mt_attn_args {
    int64_t B, Tq, Tk, H, Hkv, Dh;
    float scale;
    float softcap;
    int64_t window;
    const int32_t *q_pos;
    const int32_t *k_pos;
    const int32_t *q_seg; /* [B, Tq] or NULL */
    const int32_t *k_seg; /* [B, Tk] or NULL */
} mt_attn_args;

/* The interface of a backend (ggml's ggml_backend_i): one function per op, each
 * taking the backend itself first. Every entry is required. */
typedef struct mt_ops {
    /* ---- lifetime ---- */
    /* Release the backend's context (scratch buffers, streams) and the object itself;
     * called by mt_backend_free. Not for use after every buffer it allocated was
     * released. */
    void (*free)(mt_backend *be);

    /* ---- memory ---- */
    /* *out = `bytes` of backend memory (256-byte aligned; 0 bytes gives a unique
     * pointer that release accepts). Errors: MT_ERR_OOM (*out = NULL). */
    mt_status (*alloc)(mt_backend *be, size_t bytes, void **out) MT_MUST_CHECK;
    /* Free memory from alloc (NULL is a no-op). Cleanup paths may ignore the status. */
    mt_status (*release)(mt_backend *be, void *p);
    /* Host -> backend copy of `bytes`; the host buffer may be reused on return. */
    mt_status (*copy_to_device)(mt_backend *be, void *dst, const void *src_host, size_t bytes) MT_MUST_CHECK;
    /* Backend -> host copy; synchronising: waits for all queued work, so it reports a
     * device fault of earlier ops (MT_ERR_RUNTIME naming copy_to_host). */
    mt_status (*copy_to_host)(mt_backend *be, void *dst_host, const void *src, size_t bytes) MT_MUST_CHECK;
    /* Backend -> backend copy (memmove semantics on the CPU; on CUDA the ranges must not
     * overlap unless dst == src). */
    mt_status (*copy)(mt_backend *be, void *dst, const void *src, size_t bytes) MT_MUST_CHECK;
    /* p[0, bytes) = 0. */
    mt_status (*zero)(mt_backend *be, void *p, size_t bytes) MT_MUST_CHECK;
    /* Wait for all queued work (no-op on the CPU). Reports a device fault of any earlier
     * op (MT_ERR_RUNTIME naming sync and CUDA's text). */
    mt_status (*sync)(mt_backend *be) MT_MUST_CHECK;

    /* ---- GEMM ----
     * C[M, N] = alpha * op(A) @ op(B) + beta * C, row-major; op(X) = X or X^T when
     * trans is nonzero. A is [M, K] (or [K, M] when transposed), B is [K, N] (or
     * [N, K]); lda/ldb/ldc are row strides in elements. fp32 accumulation.
     * CPU: cblas_sgemm; CUDA: cuBLASLt (a failure names the cuBLASLt call and its
     * cublasLtGetStatusString). With beta == 0, C is not read (NaN in C does not
     * propagate). */
    mt_status (*gemm)(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                      int64_t ldc) MT_MUST_CHECK;

    /* ---- embedding ----
     * out[N, D] = scale * table[tokens[n], :]. Gemma passes scale = sqrt(D) rounded
     * to the activation dtype (HF modeling_gemma.py); Llama passes 1.
     * Tokens must lie in [0, V); the caller validates them. */
    mt_status (*embedding_fwd)(mt_backend *be, float *out, const float *table, const int32_t *tokens, int64_t N,
                               int64_t D, float scale) MT_MUST_CHECK;
    /* dtable[V, D] += scale * sum over n with tokens[n] == v of dout[n, :]; rows are
     * summed in increasing n (deterministic, no atomics). */
    mt_status (*embedding_bwd)(mt_backend *be, float *dtable, const float *dout, const int32_t *tokens, int64_t N,
                               int64_t V, int64_t D, float scale) MT_MUST_CHECK;

    /* ---- RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm) ----
     * rstd[n] = 1 / sqrt(mean(x[n, :]^2) + eps); y[n, d] = x[n, d] * rstd[n] * (w_offset + w[d]).
     * w_offset is 0 for Llama and 1 for Gemma (scale 1 + w). Also used for Gemma 3's
     * QK-norm with N = tokens x heads rows and D = Dh. y may not alias x. */
    mt_status (*rmsnorm_fwd)(mt_backend *be, float *y, float *rstd, const float *x, const float *w, int64_t N,
                             int64_t D, float eps, float w_offset) MT_MUST_CHECK;
    /* dx[N, D] += d/dx, dw[D] += sum_n dy * x * rstd (dw reduced in fixed order). */
    mt_status (*rmsnorm_bwd)(mt_backend *be, float *dx, float *dw, const float *dy, const float *x, const float *w,
                             const float *rstd, int64_t N, int64_t D, float w_offset) MT_MUST_CHECK;

    /* ---- RoPE (Su et al. 2021), Hugging Face rotate_half layout ----
     * x[N, H, Dh] rotated in place: for i < Dh/2, theta = pos[n] * inv_freq[i],
     * (x[i], x[i + Dh/2]) <- (x[i] cos - x[i + Dh/2] sin, x[i + Dh/2] cos + x[i] sin).
     * inv_freq[Dh/2] carries the base and any scaling (mt_rope_inv_freq, models/). */
    mt_status (*rope_fwd)(mt_backend *be, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh) MT_MUST_CHECK;
    /* The VJP: the inverse rotation applied to the gradient dx[N, H, Dh] in place. */
    mt_status (*rope_bwd)(mt_backend *be, float *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh) MT_MUST_CHECK;

    /* ---- attention (see mt_attn_args) ----
     * Block-wise with an online softmax (Dao et al., FlashAttention-2, 2023): no
     * [Tq, Tk] matrix is stored. out = softmax(s) @ v, lse saved for the backward. */
    mt_status (*attention_fwd)(mt_backend *be, const mt_attn_args *a, float *out, float *lse, const float *q,
                               const float *k, const float *v) MT_MUST_CHECK;
    /* dq[B,Tq,H,Dh], dk[B,Tk,Hkv,Dh], dv[B,Tk,Hkv,Dh] = (overwritten). Recomputes the
     * probabilities from q, k and lse; D_i = <dout_i, out_i> (FlashAttention-2 Alg. 2). */
    mt_status (*attention_bwd)(mt_backend *be, const mt_attn_args *a, float *dq, float *dk, float *dv,
                               const float *dout, const float *q, const float *k, const float *v,
                               const float *out, const float *lse) MT_MUST_CHECK;
    /* Merge two partial attentions of the same queries over disjoint key sets (the
     * ring-attention / context-parallel combination: Liu et al. 2023, "Ring Attention
     * with Blockwise Transformers", and the log-sum-exp rescaling of FlashAttention,
     * Dao et al. 2022, section 3.1). out, out_b [B, T, H, Dh]; lse, lse_b [B, H, T]
     * (natural log, as attention_fwd writes them). For each row (b, h, t):
     *   ln = logaddexp(lse, lse_b) = max + log(exp(lse - max) + exp(lse_b - max)) (fp64),
     *   out = exp(lse - ln) * out + exp(lse_b - ln) * out_b (weights rounded to fp32,
     *   products and sum in fp32, unfused), lse = (float)ln  (in place, "=").
     * A row with lse_b == -inf is left unchanged (bitwise); a row with lse == -inf
     * takes weight 0 for out (so out = 1 * out_b up to the weight's rounding).
     * Deterministic: one independent computation per row. */
    mt_status (*attn_merge)(mt_backend *be, float *out, float *lse, const float *out_b, const float *lse_b,
                            int64_t B, int64_t T, int64_t H, int64_t Dh) MT_MUST_CHECK;

    /* ---- gated MLP activation ----
     * h[n] = act(gate[n]) * up[n] for n < count; silu(x) = x sigmoid(x),
     * gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
    mt_status (*glu_fwd)(mt_backend *be, float *h, const float *gate, const float *up, int64_t count,
                         mt_activation act) MT_MUST_CHECK;
    /* dgate = dh * up * act'(gate), dup = dh * act(gate) (overwritten). */
    mt_status (*glu_bwd)(mt_backend *be, float *dgate, float *dup, const float *dh, const float *gate,
                         const float *up, int64_t count, mt_activation act) MT_MUST_CHECK;

    /* ---- cross-entropy on one vocabulary tile of rows ----
     * In: logits[R, V] (raw h @ W^T). If softcap > 0, z = softcap * tanh(x / softcap)
     * (Gemma 2 final soft-cap), else z = x. For each row r with labels[r] != ignore_index:
     * loss_r = logsumexp(z_r) - z_r[labels[r]]; *loss_sum += loss_r (fp64); *count += 1.
     * Out (in place): logits[r, :] = dscale * d loss_r / d x_r (softmax minus one-hot,
     * times the soft-cap derivative), zero rows for ignored labels. dscale is the
     * incoming loss cotangent (1 / total tokens for a mean loss). Labels outside
     * [0, V) other than ignore_index are a caller error. loss_sum and count are host
     * pointers (the op synchronises to fill them). */
    mt_status (*xent_tile)(mt_backend *be, float *logits, const int32_t *labels, int64_t R, int64_t V,
                           float softcap, int32_t ignore_index, float dscale, double *loss_sum,
                           int64_t *count) MT_MUST_CHECK;

    /* ---- elementwise and reductions ---- */
    /* y[i] += alpha * x[i] */
    mt_status (*axpy)(mt_backend *be, float *y, const float *x, float alpha, int64_t n) MT_MUST_CHECK;
    /* x[i] *= alpha */
    mt_status (*scale)(mt_backend *be, float *x, float alpha, int64_t n) MT_MUST_CHECK;
    /* *out (host) = sum_i x[i]^2 in fp64, fixed summation order (for the global
     * gradient norm). Synchronising on CUDA. */
    mt_status (*sumsq)(mt_backend *be, const float *x, int64_t n, double *out) MT_MUST_CHECK;

    /* ---- gradient accumulation and dtype conversion (parallel/zero1.c) ----
     * acc[n] of dtype (MT_F32 or MT_BF16, else MT_ERR_INVALID) gets x[n] (fp32):
     *   first != 0:  acc[i] = round(x[i])
     *   first == 0:  acc[i] = round(float(acc[i]) + x[i])   (the add in fp32, "+=")
     * round() is the identity for MT_F32 and round-to-nearest-even for MT_BF16
     * (runtime/dtype.h mt_f32_to_bf16: NaN stays a quiet NaN), so a bf16 accumulator
     * adds in fp32 and rounds once per add, never bf16 + bf16 (which would lose the
     * addend's low bits once the sum grows).
     * Elementwise, hence deterministic. acc and x must not overlap. */
    mt_status (*grad_accumulate)(mt_backend *be, void *acc, mt_dtype dtype, const float *x, int64_t n,
                                 int first) MT_MUST_CHECK;
    /* dst[n] (fp32) = src[n] of dtype (MT_F32: a copy, dst == src allowed; MT_BF16: exact
     * widening, the bf16 bits in the upper half of the fp32). Other dtypes: MT_ERR_INVALID.
     * Otherwise dst and src must not overlap. */
    mt_status (*to_f32)(mt_backend *be, float *dst, const void *src, mt_dtype dtype, int64_t n) MT_MUST_CHECK;

    /* ---- optimizer ----
     * AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW / optax.adamw), fp32 state:
     * g' = grad_scale * g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
     * p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p ).
     * t is the 1-based step; grad_scale carries the clipping factor. */
    mt_status (*adamw)(mt_backend *be, float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                       float b2, float eps, float wd, float grad_scale, int64_t t) MT_MUST_CHECK;
} mt_ops;

#ifdef __cplusplus
}
#endif
#endif
