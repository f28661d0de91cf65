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
 * All tensors are row-major and contiguous; token ids and positions are int32. "+=" in
 * a comment means the op accumulates into its output, "=" that it overwrites it.
 *
 * Dtypes (mixed precision as in Micikevicius et al. 2018, "Mixed Precision Training",
 * with bf16 in place of fp16 as MaxText, Megatron-LM and torch.autocast use it): a
 * `float *` is float32 always (statistics such as rstd and lse, weight gradients,
 * optimizer state, the loss tile's logits); a `void *` tensor holds the op's `dt`
 * argument (or mt_attn_args.dtype): MT_F32 or MT_BF16 (any other value, or MT_BF16 on
 * a backend whose caps.compute_dtypes lacks it, is MT_ERR_INVALID). With MT_BF16 every
 * op widens its bf16 inputs exactly to fp32, computes in fp32 (reductions in fp32 or
 * fp64 as stated) and rounds each bf16 output once, round-to-nearest-even
 * (runtime/dtype.h mt_f32_to_bf16); "+=" into a bf16 output is round(float(old) + new),
 * one rounding. Both backends round at these same points, so they differ only by the
 * order of fp32 sums; the tests bound that difference from the term counts. With
 * MT_F32 every op but gemm computes exactly as it did before dtypes existed (bitwise; the
 * CPU gemm's library and tiling changed, docs/cpu_gemm.md).
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
    mt_dtype dtype; /* of q, k, v, out, dout, dq, dk, dv (lse is always fp32); 0 = MT_F32 */
    const int32_t *q_pos;
    const int32_t *k_pos;
    const int32_t *q_seg; /* [B, Tq] or NULL */
    const int32_t *k_seg; /* [B, Tk] or NULL */
} mt_attn_args;

/* What one model's op calls look like, for ops.h scratch_bytes: each field the largest
 * over the calls. rows: token rows of one op (this rank's B x T); width: the model width
 * (emb_dim); heads / kv_heads / head_dim: the per-head q/k norms run on rows x heads rows
 * of head_dim; attn: the largest attention call (B, H, Hkv, Dh, Tq, Tk, dtype; q_pos
 * non-NULL when positions are passed, q_seg when segment ids are); loss_rows: the rows of
 * one loss tile. */
typedef struct mt_scratch_query {
    int64_t rows, width, heads, kv_heads, head_dim;
    mt_attn_args attn;
    int64_t loss_rows;
} mt_scratch_query;

/* One run of elements of a multi-tensor AdamW update (ops.h adamw): elements
 * [offset, offset + numel) of the flat p, g, m and v buffers, updated with weight decay
 * wd when decay != 0 and 0 otherwise (Llama and Gemma decay matrices, not norm scales).
 * A table of these lives in backend memory (the caller builds it on the host and
 * uploads it with copy_to_device: train/optimizer.c mt_adamw_step), 24 bytes each;
 * reserved is 0. Offsets and counts in elements (int64: a 405B model's flat buffer). */
typedef struct mt_adamw_segment {
    int64_t offset, numel;
    int32_t decay;
    int32_t reserved;
} mt_adamw_segment;

/* The interface of a backend (ggml's ggml_backend_i): one function per op, each
 * taking the backend itself first. Every entry is required. */
typedef struct mt_ops {
    /* ---- lifetime ---- */
    /* Release the backend's context (scratch buffers, streams) and the object itself;
     * called by mt_backend_free. Not for use after every buffer it allocated was
     * released. */
    void (*free)(mt_backend *be);

    /* ---- memory ----
     * "Backend memory" below, and every op's buffer, is memory from alloc or the
     * backend's host memory (kernels/backend.h mt_backend_host_alloc: the host pool of
     * parameter and optimizer offload, page-locked on CUDA and reached there through
     * unified addressing). */
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
    /* The GEMM workspace: `bytes` of backend memory (256-byte aligned) that every later
     * gemm may use as scratch (cuBLASLt's workspace), normally the plan entry
     * "workspace" (models/model_plan.c binds it; also the ops' scratch: scratch_bytes); NULL and 0
     * take it away (gemm then picks algorithms that need none). Call it with no op in
     * flight (after sync); the memory must stay valid until the next set_workspace or
     * the backend's free. Errors: MT_ERR_INVALID (bytes > 0 with NULL). */
    mt_status (*set_workspace)(mt_backend *be, void *ws, size_t bytes) MT_MUST_CHECK;
    /* Bytes of device scratch the ops take at most for the calls q describes:
     * temporaries that live within one op (row-block partial sums of rmsnorm_bwd and
     * sumsq, embedding_bwd's sort keys, attention_bwd's D = rowsum(dO * O) and chunk
     * ranges, xent_tile's per-row losses); 0 when the backend needs none (the CPU). The
     * ops run one after another on the compute stream, so they share the workspace with
     * the GEMM: the model plans "workspace" as the larger of this and
     * caps.workspace_bytes and binds it with set_workspace, after which an op whose
     * scratch exceeds the bound workspace fails with MT_ERR_INVALID naming both sizes.
     * Without a bound workspace (tools and tests calling ops directly) an op allocates
     * its scratch itself, outside any plan. */
    size_t (*scratch_bytes)(mt_backend *be, const mt_scratch_query *q);

    /* ---- GEMM ----
     * C[M, N] = alpha * op(A) @ op(B) + beta * C, row-major; op(X) = X or X^T when
     * trans is nonzero. A is [M, K] (or [K, M] when transposed), B is [K, N] (or
     * [N, K]); lda/ldb/ldc are row strides in elements. A and B are of ab_dt, C of c_dt:
     * (MT_F32, MT_F32), (MT_BF16, MT_F32) or (MT_BF16, MT_BF16); others MT_ERR_INVALID.
     * Products and sums in fp32 (a bf16 x bf16 product is exact in fp32); alpha, beta
     * and the old C (widened) applied in fp32; a bf16 C rounded once at the end.
     * CPU: oneDNN matmul or OpenBLAS sgemm on tiles, picked by CPU features (bf16
     * operands widened exactly to fp32 unless the CPU has AMX; docs/cpu_gemm.md);
     * CUDA: cuBLASLt with CUBLAS_COMPUTE_32F (a failure names the cuBLASLt call and its
     * cublasLtGetStatusString). With beta == 0, C is not read (NaN in C does not
     * propagate). */
    mt_status (*gemm)(mt_backend *be, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const void *A, int64_t lda, const void *B, int64_t ldb, mt_dtype ab_dt, float beta, void *C,
                      int64_t ldc, mt_dtype c_dt) MT_MUST_CHECK;

    /* ---- embedding ----
     * table [V, D] holds the rows [v0, v0 + V) of the embedding (the whole table: v0 = 0,
     * V = vocab_size; a vocabulary chunk of it: models/model_loss.c under parameter
     * windows). out[n, :] = scale * table[tokens[n] - v0, :] (out and table of dt) for
     * each n with v0 <= tokens[n] < v0 + V; other rows of out are left untouched, so the
     * chunks of a table fill out one after another. Gemma passes scale = sqrt(D) rounded
     * to the activation dtype (HF modeling_gemma.py); Llama passes 1. Tokens must lie in
     * [0, vocab_size); the caller validates them. */
    mt_status (*embedding_fwd)(mt_backend *be, void *out, const void *table, const int32_t *tokens, int64_t N,
                               int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt) MT_MUST_CHECK;
    /* dtable [V, D] (fp32) holds the rows [v0, v0 + V): dtable[v - v0, :] += scale * sum
     * over n with tokens[n] == v of dout[n, :] (dout of dt) for v in [v0, v0 + V); tokens
     * outside are skipped. Rows are summed in fp32 in increasing n (deterministic, no
     * atomics), so a chunk's rows are bitwise those of the whole-table call. */
    mt_status (*embedding_bwd)(mt_backend *be, float *dtable, const void *dout, const int32_t *tokens, int64_t N,
                               int64_t v0, int64_t V, int64_t D, float scale, mt_dtype dt) MT_MUST_CHECK;

    /* ---- RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm) ----
     * rstd[n] = 1 / sqrt(mean(x[n, :]^2) + eps); y[n, d] = x[n, d] * rstd[n] * (w_offset + w[d]).
     * w_offset is 0 for Llama and 1 for Gemma (scale 1 + w). Also used for Gemma 3's
     * QK-norm with N = tokens x heads rows and D = Dh. y may not alias x. y, x and w
     * of dt; rstd [N] fp32; the squares summed in fp64 (fixed order). */
    mt_status (*rmsnorm_fwd)(mt_backend *be, void *y, float *rstd, const void *x, const void *w, int64_t N,
                             int64_t D, float eps, float w_offset, mt_dtype dt) MT_MUST_CHECK;
    /* The residual add fused into the norm that follows it (one pass over the rows
     * instead of an axpy and a norm, as Megatron-LM's and Apex's fused add + norm):
     * h[N, D] = x + r (one rounding to dt: round(float(x) + float(r))), then y and rstd
     * exactly as rmsnorm_fwd computes them from that rounded h, so the results are
     * bitwise those of axpy(h = x; h += r) followed by rmsnorm_fwd(h). h may be x itself
     * (in place); r, y and h are otherwise distinct; all of dt but rstd (fp32). */
    mt_status (*add_rmsnorm_fwd)(mt_backend *be, void *h, void *y, float *rstd, const void *x, const void *r,
                                 const void *w, int64_t N, int64_t D, float eps, float w_offset,
                                 mt_dtype dt) MT_MUST_CHECK;
    /* dx[N, D] += d/dx (dx, dy, x, w of dt), dw[D] (fp32) += sum_n dy * x * rstd
     * (dw reduced in fixed order). */
    mt_status (*rmsnorm_bwd)(mt_backend *be, void *dx, float *dw, const void *dy, const void *x, const void *w,
                             const float *rstd, int64_t N, int64_t D, float w_offset, mt_dtype dt) MT_MUST_CHECK;

    /* ---- RoPE (Su et al. 2021), Hugging Face rotate_half layout ----
     * x[N, H, Dh] rotated in place: for i < Dh/2, theta = pos[n] * inv_freq[i],
     * (x[i], x[i + Dh/2]) <- (x[i] cos - x[i + Dh/2] sin, x[i + Dh/2] cos + x[i] sin).
     * inv_freq[Dh/2] (fp32) carries the base and any scaling (mt_rope_inv_freq,
     * models/). x of dt. */
    mt_status (*rope_fwd)(mt_backend *be, void *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh, mt_dtype dt) MT_MUST_CHECK;
    /* The VJP: the inverse rotation applied to the gradient dx[N, H, Dh] (dt) in place. */
    mt_status (*rope_bwd)(mt_backend *be, void *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                          int64_t Dh, mt_dtype dt) MT_MUST_CHECK;

    /* ---- attention (see mt_attn_args) ----
     * Block-wise with an online softmax (Dao et al., FlashAttention-2, 2023): no
     * [Tq, Tk] matrix is stored. out = softmax(s) @ v, lse saved for the backward.
     * Tensors of a->dtype except lse (fp32). With MT_BF16 the probabilities are
     * rounded to bf16 before the P @ V product, as FlashAttention-2's bf16 kernels
     * feed P to the tensor cores; scores, max, the row sum (of the unrounded P) and the
     * output accumulator are fp32. */
    mt_status (*attention_fwd)(mt_backend *be, const mt_attn_args *a, void *out, float *lse, const void *q,
                               const void *k, const void *v) MT_MUST_CHECK;
    /* dq[B,Tq,H,Dh], dk[B,Tk,Hkv,Dh], dv[B,Tk,Hkv,Dh] = (overwritten, a->dtype).
     * Recomputes the probabilities from q, k and lse; D_i = <dout_i, out_i>
     * (FlashAttention-2 Alg. 2). With MT_BF16, as FlashAttention-2's bf16 backward
     * feeds its tensor cores: P_ij = exp(s_ij - lse_i) (fp32) is rounded to bf16 before
     * dv += P^T dout, and dS_ij = P_ij (dP_ij - D_i) (times the soft-cap derivative; dP
     * and D in fp32, from the fp32 P) is rounded to bf16 before dq += dS k and
     * dk += dS^T q (scale applied in fp32); dq, dk and dv are accumulated in fp32 and
     * rounded once. */
    mt_status (*attention_bwd)(mt_backend *be, const mt_attn_args *a, void *dq, void *dk, void *dv,
                               const void *dout, const void *q, const void *k, const void *v,
                               const void *out, const float *lse) MT_MUST_CHECK;
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
     * Deterministic: one independent computation per row. out and out_b of dt (a bf16
     * out is rounded once, after the sum); lse and lse_b fp32. */
    mt_status (*attn_merge)(mt_backend *be, void *out, float *lse, const void *out_b, const float *lse_b,
                            int64_t B, int64_t T, int64_t H, int64_t Dh, mt_dtype dt) MT_MUST_CHECK;

    /* ---- gated MLP activation ----
     * h[n] = act(gate[n]) * up[n] for n < count; silu(x) = x sigmoid(x),
     * gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). All of dt. */
    mt_status (*glu_fwd)(mt_backend *be, void *h, const void *gate, const void *up, int64_t count,
                         mt_activation act, mt_dtype dt) MT_MUST_CHECK;
    /* dgate = dh * up * act'(gate), dup = dh * act(gate) (overwritten). All of dt.
     * In place: dgate may be gate and dup may be up (elementwise: each element's inputs
     * are read before its outputs are written), giving bitwise the out-of-place results;
     * no other overlap is allowed (dh aliases nothing written, dgate and dup are apart). */
    mt_status (*glu_bwd)(mt_backend *be, void *dgate, void *dup, const void *dh, const void *gate,
                         const void *up, int64_t count, mt_activation act, mt_dtype dt) MT_MUST_CHECK;

    /* ---- cross-entropy on one vocabulary tile of rows ----
     * In: logits[R, V] fp32 (raw h @ W^T). If softcap > 0, z = softcap * tanh(x / softcap)
     * (Gemma 2 final soft-cap), else z = x. For each row r with labels[r] != ignore_index:
     * loss_r = logsumexp(z_r) - z_r[labels[r]] (the max and each exp in fp32, the sum
     * of the exps, the log and the difference in fp64).
     * stats (backend memory, 2 doubles, "+="): stats[0] += sum of loss_r over the
     * tile's labelled rows, summed in fp64 in an order fixed by R (the backends' orders
     * may differ); stats[1] += their count
     * (exact below 2^53). The op does not synchronise: the caller reads stats once
     * (copy_to_host) when it needs the loss.
     * Out: dlogits[r, :] = dscale * d loss_r / d x_r (softmax minus one-hot, times the
     * soft-cap derivative), zero rows for ignored labels, of ddt: with MT_F32 dlogits
     * may be logits itself (in place); with MT_BF16 it is a separate [R, V] buffer (a
     * bf16 operand for the dh and dW GEMMs) and logits is left as scratch. dscale is
     * the incoming loss cotangent (1 / total tokens for a mean loss). Labels outside
     * [0, V) other than ignore_index are a caller error. */
    mt_status (*xent_tile)(mt_backend *be, float *logits, void *dlogits, mt_dtype ddt, const int32_t *labels,
                           int64_t R, int64_t V, float softcap, int32_t ignore_index, float dscale,
                           double *stats) MT_MUST_CHECK;

    /* ---- vocab-parallel cross-entropy: xent_tile split around two all-reduces ----
     * The three local phases of Megatron-LM's vocab-parallel cross-entropy
     * (megatron/core/tensor_parallel/cross_entropy.py; Shoeybi et al. 2019; the math and
     * the schedule in parallel/vocab_loss.h) on this rank's vocabulary slice
     * [v0, v0 + Vl): z [R, Vl] fp32 is a tile of logits h W_l^T, labels [R] int32 are
     * global ids. The caller all-reduces mx (max, R floats) between phases 1 and 2 and
     * sz (sum, 2R doubles) between phases 2 and 3, so phase 3 sees the whole row. A row
     * whose label is ignore_index has no loss and a zero gradient; other labels outside
     * [0, V) are a caller error (the row's loss misses its label term). With a group of
     * one (v0 = 0, Vl = V, no all-reduce) the three phases compute, element by element,
     * the same fp32 and fp64 operations as xent_tile with in-place fp32 dlogits: the same
     * row losses and dlogits (the CPU backend: bitwise; the CUDA backend: up to the order
     * of its block reductions), the tile's loss sum possibly added in another order.
     * All three: errors MT_ERR_INVALID for R < 0 or Vl < 1 (nothing runs); R == 0 does
     * nothing. Deterministic (fixed reduction orders, no atomics); none synchronises. */
    /* Phase 1. If softcap > 0, z = softcap * tanh(z / softcap) in place (fp32, as
     * xent_tile); then mx[r] = max_j z[r, j] (mx [R] fp32, "="; exact in any order), or
     * with accumulate != 0 mx[r] = max(mx[r], max_j z[r, j]) (the vocabulary chunks of
     * one rank's slice, parallel/vocab_loss.h; a call with the final max only caps z). */
    mt_status (*vocab_tile_max)(mt_backend *be, float *z, int64_t R, int64_t Vl, float softcap, float *mx,
                                int accumulate) MT_MUST_CHECK;
    /* Phase 2, mx being the group's row max. sz [2R] fp64, "=" (with accumulate != 0
     * "+=": each of the two terms below added to sz in fp64, for the chunks of a slice):
     *   sz[2r]     = sum_j exp(z[r, j] - mx[r]): the difference and each exp in fp32, the
     *                sum in fp64 in an order fixed by Vl (and, on the CPU, by the vector
     *                width of the code picked for the CPU at load time; never by threads):
     *                each term errs by u |z - mx| + ~2.5 ulp of exp, the fp64 sum by
     *                Vl 2^-53 of itself, so sz[2r] is within max_j (u |z - mx| + 5u) +
     *                Vl 2^-53 of the exact sum, relative (u = 2^-24);
     *   sz[2r + 1] = z[r, labels[r] - v0] (exact) when v0 <= labels[r] < v0 + Vl, else 0;
     * both 0 on ignored rows. */
    mt_status (*vocab_tile_sumexp)(mt_backend *be, const float *z, int64_t R, int64_t Vl, const float *mx,
                                   const int32_t *labels, int64_t v0, int32_t ignore_index, double *sz,
                                   int accumulate) MT_MUST_CHECK;
    /* Phase 3, mx and sz being the group's (equal on every rank). For each labelled row
     * (labels[r] != ignore_index), s = sz[2r]:
     *   loss_r = mx[r] + log(s) - sz[2r + 1]  (fp64);
     *   stats (backend memory, 2 doubles, "+=", xent_tile's): stats[0] += the sum of
     *   loss_r over the tile's labelled rows in increasing r (fp64), stats[1] += their
     *   count; every rank adds the same values.
     * With write_grad != 0, z is overwritten by dlogits (fp32, "="):
     *   z[r, j] = dscale (p - [v0 + j == labels[r]]) dz, p = exp(z[r, j] - mx[r]) * (float)(1 / s)
     *   (the difference, exp and products in fp32), dz = 1 - (z[r, j] * (1 / softcap))^2
     *   when softcap > 0 (z being the capped logit) else 1, and zero rows for ignored
     *   labels. With write_grad == 0, z is not touched (loss only). */
    mt_status (*vocab_tile_grad)(mt_backend *be, float *z, int64_t R, int64_t Vl, const float *mx, const double *sz,
                                 const int32_t *labels, int64_t v0, int32_t ignore_index, float softcap, float dscale,
                                 int write_grad, double *stats) MT_MUST_CHECK;

    /* ---- elementwise and reductions ---- */
    /* y[i] += alpha * x[i] (y and x of dt; fp32 arithmetic, one rounding) */
    mt_status (*axpy)(mt_backend *be, void *y, const void *x, float alpha, int64_t n, mt_dtype dt) MT_MUST_CHECK;
    /* x[i] *= alpha (x of dt) */
    mt_status (*scale)(mt_backend *be, void *x, float alpha, int64_t n, mt_dtype dt) MT_MUST_CHECK;
    /* acc[0] (backend memory, one double) += sum_i x[i]^2, the sum in fp64 in an order
     * fixed by n alone, added to acc[0] last (for the global gradient norm: one acc
     * over all tensors, read once per step). Does not synchronise. */
    mt_status (*sumsq)(mt_backend *be, const float *x, int64_t n, double *acc) MT_MUST_CHECK;

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
    /* dst[n] of dtype = round(src[n]) (fp32 src): MT_F32 a copy (dst == src allowed);
     * MT_BF16 round-to-nearest-even when stochastic == 0, else stochastic rounding
     * (runtime/dtype.h mt_f32_to_bf16_sr) whose 16 random bits for element i are the
     * low bits of word g % 4 of mt_rng_u32x4(seed, MT_SR_STREAM, g / 4), g = offset + i
     * (Philox4x32-10, runtime/rng.h): bitwise mt_f32_to_bf16_sr_array, the same bits
     * on every backend and thread count. Used to refresh the bf16
     * compute weights from the fp32 master after each update. Other dtypes:
     * MT_ERR_INVALID. Otherwise dst and src must not overlap. */
    mt_status (*from_f32)(mt_backend *be, void *dst, mt_dtype dtype, const float *src, int64_t n, int stochastic,
                          uint64_t seed, uint64_t offset) MT_MUST_CHECK;

    /* ---- optimizer ----
     * AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW / optax.adamw), fp32 state:
     * g' = grad_scale * g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
     * p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p ).
     * t is the 1-based step; grad_scale carries the clipping factor.
     * Multi-tensor (one launch for a whole parameter table, as torch's fused/foreach
     * AdamW): p, g, m, v are flat fp32 buffers (backend memory) and segs[nsegs] (backend
     * memory, mt_adamw_segment: sorted by offset, disjoint, numel >= 0) names the runs
     * updated: element offset + i of segment s gets the formula above with weight decay
     * segs[s].decay ? wd : 0; elements outside every segment are not read or written.
     * Elementwise, each element's fp32 arithmetic independent of the segmentation: one
     * call over several segments is bitwise the calls over each segment alone. nsegs = 0
     * does nothing. A malformed table is a caller error (the CPU backend reports
     * MT_ERR_INVALID; a device backend cannot read it without a synchronisation). Does
     * not synchronise. */
    mt_status (*adamw)(mt_backend *be, float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                       int nsegs, float lr, float b1, float b2, float eps, float wd, float grad_scale,
                       int64_t t) MT_MUST_CHECK;
} mt_ops;

#ifdef __cplusplus
}
#endif
#endif
