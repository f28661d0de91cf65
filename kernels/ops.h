/* kernels/ops.h: the op table every backend implements (DESIGN.md section 1).
 *
 * models/ and train/ call only these entries, never a backend directly. Pointers are
 * in the backend's memory (host memory for the CPU backend, device memory for CUDA).
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

#ifdef __cplusplus
extern "C" {
#endif

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
 * lse[b, h, i] = log sum_j exp(s_ij) over allowed j (natural log, after softcap);
 * a row with no allowed key gets lse = -INFINITY and out = 0. */
typedef struct mt_attn_args {
    int64_t B, Tq, Tk, H, Hkv, Dh;
    float scale;
    float softcap;
    int64_t window;
    const int32_t *q_pos;
    const int32_t *k_pos;
} mt_attn_args;

typedef struct mt_ops {
    const char *name; /* "cpu" or "cuda" */

    /* ---- memory ---- */
    /* Allocate `bytes` of backend memory (256-byte aligned), NULL on failure. */
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    /* Copies between host and backend memory; same-space copy with kind 0. */
    void (*copy_to_device)(void *dst, const void *src_host, size_t bytes);
    void (*copy_to_host)(void *dst_host, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);
    /* Wait for all queued work (no-op on the CPU). */
    void (*sync)(void);

    /* ---- GEMM ----
     * C[M, N] = alpha * op(A) @ op(B) + beta * C, row-major; op(X) = X or X^T when
     * trans is nonzero. A is [M, K] (or [K, M] when transposed), B is [K, N] (or
     * [N, K]); lda/ldb/ldc are row strides in elements. fp32 accumulation.
     * CPU: cblas_sgemm. With beta == 0, C is not read (NaN in C does not propagate). */
    void (*gemm)(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                 float *C, int64_t ldc);

    /* ---- embedding ----
     * out[N, D] = scale * table[tokens[n], :]. Gemma passes scale = sqrt(D) rounded
     * to the activation dtype (HF modeling_gemma.py); Llama passes 1.
     * Tokens must lie in [0, V); the caller validates them. */
    void (*embedding_fwd)(float *out, const float *table, const int32_t *tokens, int64_t N,
                          int64_t D, float scale);
    /* dtable[V, D] += scale * sum over n with tokens[n] == v of dout[n, :]; rows are
     * summed in increasing n (deterministic, no atomics). */
    void (*embedding_bwd)(float *dtable, const float *dout, const int32_t *tokens, int64_t N,
                          int64_t V, int64_t D, float scale);

    /* ---- RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm) ----
     * rstd[n] = 1 / sqrt(mean(x[n, :]^2) + eps); y[n, d] = x[n, d] * rstd[n] * (w_offset + w[d]).
     * w_offset is 0 for Llama and 1 for Gemma (scale 1 + w). Also used for Gemma 3's
     * QK-norm with N = tokens x heads rows and D = Dh. y may not alias x. */
    void (*rmsnorm_fwd)(float *y, float *rstd, const float *x, const float *w, int64_t N,
                        int64_t D, float eps, float w_offset);
    /* dx[N, D] += d/dx, dw[D] += sum_n dy * x * rstd (dw reduced in fixed order). */
    void (*rmsnorm_bwd)(float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, int64_t N, int64_t D, float w_offset);

    /* ---- RoPE (Su et al. 2021), Hugging Face rotate_half layout ----
     * x[N, H, Dh] rotated in place: for i < Dh/2, theta = pos[n] * inv_freq[i],
     * (x[i], x[i + Dh/2]) <- (x[i] cos - x[i + Dh/2] sin, x[i + Dh/2] cos + x[i] sin).
     * inv_freq[Dh/2] carries the base and any scaling (mt_rope_inv_freq, models/). */
    void (*rope_fwd)(float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                     int64_t Dh);
    /* The VJP: the inverse rotation applied to the gradient dx[N, H, Dh] in place. */
    void (*rope_bwd)(float *dx, const int32_t *pos, const float *inv_freq, int64_t N, int64_t H,
                     int64_t Dh);

    /* ---- attention (see mt_attn_args) ----
     * Block-wise with an online softmax (Dao et al., FlashAttention-2, 2023): no
     * [Tq, Tk] matrix is stored. out = softmax(s) @ v, lse saved for the backward. */
    void (*attention_fwd)(const mt_attn_args *a, float *out, float *lse, const float *q,
                          const float *k, const float *v);
    /* dq[B,Tq,H,Dh], dk[B,Tk,Hkv,Dh], dv[B,Tk,Hkv,Dh] = (overwritten). Recomputes the
     * probabilities from q, k and lse; D_i = <dout_i, out_i> (FlashAttention-2 Alg. 2). */
    void (*attention_bwd)(const mt_attn_args *a, float *dq, float *dk, float *dv,
                          const float *dout, const float *q, const float *k, const float *v,
                          const float *out, const float *lse);

    /* ---- gated MLP activation ----
     * h[n] = act(gate[n]) * up[n] for n < count; silu(x) = x sigmoid(x),
     * gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
    void (*glu_fwd)(float *h, const float *gate, const float *up, int64_t count, mt_activation act);
    /* dgate = dh * up * act'(gate), dup = dh * act(gate) (overwritten). */
    void (*glu_bwd)(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                    int64_t count, mt_activation act);

    /* ---- cross-entropy on one vocabulary tile of rows ----
     * In: logits[R, V] (raw h @ W^T). If softcap > 0, z = softcap * tanh(x / softcap)
     * (Gemma 2 final soft-cap), else z = x. For each row r with labels[r] != ignore_index:
     * loss_r = logsumexp(z_r) - z_r[labels[r]]; *loss_sum += loss_r (fp64); *count += 1.
     * Out (in place): logits[r, :] = dscale * d loss_r / d x_r (softmax minus one-hot,
     * times the soft-cap derivative), zero rows for ignored labels. dscale is the
     * incoming loss cotangent (1 / total tokens for a mean loss). Labels outside
     * [0, V) other than ignore_index are a caller error. */
    void (*xent_tile)(float *logits, const int32_t *labels, int64_t R, int64_t V, float softcap,
                      int32_t ignore_index, float dscale, double *loss_sum, int64_t *count);

    /* ---- elementwise and reductions ---- */
    /* y[i] += alpha * x[i] */
    void (*axpy)(float *y, const float *x, float alpha, int64_t n);
    /* x[i] *= alpha */
    void (*scale)(float *x, float alpha, int64_t n);
    /* sum_i x[i]^2 in fp64, fixed summation order (for the global gradient norm). */
    double (*sumsq)(const float *x, int64_t n);

    /* ---- optimizer ----
     * AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW / optax.adamw), fp32 state:
     * g' = grad_scale * g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
     * p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p ).
     * t is the 1-based step; grad_scale carries the clipping factor. */
    void (*adamw)(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                  float b2, float eps, float wd, float grad_scale, int64_t t);
} mt_ops;

/* The CPU backend: C11 + OpenMP + CBLAS. Never NULL. */
const mt_ops *mt_cpu_ops(void);

/* The CUDA backend, or NULL when this build has no CUDA or no device is visible. */
const mt_ops *mt_cuda_ops(void);

#ifdef __cplusplus
}
#endif
#endif
