/* parallel/vocab_loss.h: the vocab-tiled cross-entropy with the vocabulary split over
 * the tensor axis (Megatron-LM vocab-parallel cross entropy, Shoeybi et al. 2019,
 * megatron/core/tensor_parallel/cross_entropy.py), tiled over rows like
 * kernels/tiled_loss.h so the [N, V] logits never exist.
 *
 * Rank t of T holds the unembedding rows [v0, v0 + Vl) (Vl = V / T). For each row tile
 * (rows [k*N/K, (k+1)*N/K), the split of kernels/tiled_loss.h):
 *   z = h_t W_l^T  (soft-capped: z = cap tanh(z / cap))          [R, Vl], local
 *   m_r = max over the group of max_j z_rj                          (all-reduce max, R floats)
 *   s_r = sum over the group of sum_j exp(z_rj - m_r), and z_r[label] from the owner
 *                                                                   (all-reduce sum, 2R doubles)
 *   loss_r = m_r + log s_r - z_r[label]
 *   dlogits_rj = dscale (exp(z_rj - m_r) / s_r - [j == label]) (1 - (z_rj / cap)^2 if capped)
 *   dh_t = dlogits W_l (a partial sum over vocabulary slices), dW_l += dlogits^T h_t
 * and after the last tile dh is all-reduced over the group (N x D elements of the
 * activation dtype), so the gradient flows only into the rank's slice of W and every
 * rank gets the full dh. Per call the rank sends (T > 1) 2 (T-1)/T x (4 N + 16 N +
 * es N D [backward]) bytes, es = 4 (float32) or 2 (bfloat16).
 * A row whose label is ignore_index has no loss and a zero gradient.
 * Everything runs through the backend's ops (gemm and kernels/ops.h vocab_tile_max,
 * vocab_tile_sumexp, vocab_tile_grad, which state the fp32 / fp64 split and the error of
 * each phase) on backend memory, and the all-reduces take those buffers as they are
 * (parallel/comm.h: device buffers go to NCCL, or are staged through the host): no host
 * loop touches the tile, and nothing synchronises the device but the collectives'
 * own staging. */
#ifndef MT_PARALLEL_VOCAB_LOSS_H
#define MT_PARALLEL_VOCAB_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "parallel/comm.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_vocab_loss_args {
    int64_t N, D;         /* rows, hidden size */
    int64_t v0, Vl;       /* this rank's vocabulary slice [v0, v0 + Vl) */
    int64_t num_tiles;    /* row tiles (clamped to [1, N]) */
    float softcap;        /* final logit soft-cap, 0 = off */
    int32_t ignore_index;
    float dscale;         /* loss cotangent */
} mt_vocab_loss_args;

/* Bytes of the scratch that mt_vocab_parallel_loss needs: the per-row all-reduce
 * payloads of the largest tile, Rmax = mt_tiled_loss_tile_rows(N, num_tiles) rows:
 * sz [2 Rmax] fp64 (sum of exps, label logit) followed by mx [Rmax] fp32 (row max),
 * 20 Rmax bytes (the plan entry "loss_tile.vocab_stats" of models/model_plan.c). 0 for N <= 0. */
size_t mt_vocab_loss_scratch_bytes(int64_t N, int64_t num_tiles);

/* h[N, D], W_l[Vl, D] (this rank's rows) of dt, labels[N] global ids -> stats[0] += the
 * loss summed over the labelled rows (fp64), stats[1] += their count (stats: 2 doubles,
 * the model's step statistics, "+=" as ops.h xent_tile; identical on every rank of the
 * group; no host synchronisation: the caller reads stats once). dh (may be NULL: loss
 * only) of dt gets dscale dloss/dh (overwritten, full after the all-reduce); dW_l (may
 * be NULL, fp32) += dscale dloss/dW_l. tile: mt_tiled_loss_tile_rows(N, num_tiles) x Vl
 * floats (the fp32 logits, then dlogits); dtile: as many elements of dt, the dlogits
 * rounded to nearest even for the two backward GEMMs (NULL with MT_F32), as
 * kernels/tiled_loss.h; scratch: mt_vocab_loss_scratch_bytes(N, num_tiles) bytes,
 * 8-byte aligned. dt is MT_F32 or MT_BF16 (the activation dtype and compute weights:
 * logits and dlogits in fp32 either way, dh rounded once per rank and then summed over
 * the group as bf16, parallel/comm.h MT_COMM_BF16). Every pointer is backend memory.
 * comm: the tensor group (NULL = one rank). Errors: MT_ERR_INVALID (scratch or stats
 * NULL, or a bf16 call without dtile), those of the ops (MT_ERR_RUNTIME on CUDA) and of
 * the collectives. */
MT_MUST_CHECK mt_status mt_vocab_parallel_loss(mt_backend *be, mt_comm *comm, const mt_vocab_loss_args *a,
                                               const void *h, const void *W_l, mt_dtype dt, const int32_t *labels,
                                               float *tile, void *dtile, void *scratch, void *dh, float *dW_l,
                                               double *stats);

/* ---- the vocabulary in chunks ----
 * The same loss with the slice's unembedding W_l taken C row chunks at a time (chunk c
 * = rows [c Vl / C, (c + 1) Vl / C) of the slice), so that only one chunk of W (and of
 * its gradient) need exist at a time: the model gathers each chunk from the fsdp shards
 * or copies it from the host pool, and hands each chunk's gradient to the gradient sink
 * (models/model_loss.c). Three passes over the chunks, each recomputing the chunk's
 * logits z = h_t W_c^T tile by tile:
 *   1. m_r = max over the chunks (and the group) of max_j z_rj    (vocab_tile_max, accumulate)
 *   2. s_r = sum over the chunks (and the group) of sum_j exp(z_rj - m_r), z_r[label]
 *                                                                  (vocab_tile_sumexp, accumulate)
 *   3. dlogits as above per chunk; dh (fp32) += dlogits W_c, dW_c += dlogits^T h_t
 * The loss per row is the unchunked one's function of (m_r, s_r, z_r[label]): m_r is
 * exact, s_r is summed in fp64 in another grouping (a relative difference of order
 * Vl 2^-53), and dh is the sum over C chunks of fp32 GEMM partial sums (the same
 * products as one GEMM over Vl, regrouped: within gamma_Vl |dlogits| |W| of it, Higham
 * eq. 3.5), rounded once to the activation dtype at the end. Cost: the chunk logits
 * three times (two more GEMMs of h W^T than the unchunked loss), each chunk fetched
 * three times. Rows are tiled as kernels/tiled_loss.h, inside each chunk. */
typedef struct mt_vocab_chunk_source {
    int64_t num_chunks; /* C, 1 <= C <= Vl */
    void *ctx;
    /* Rows [a, b) of the slice's unembedding as [b - a, D] of the loss's dt, valid until
     * the next call (a window the source fills, or a pointer into the whole matrix). */
    mt_status (*rows)(void *ctx, int64_t a, int64_t b, const void **W);
    /* Before chunk [a, b)'s backward: where its gradient adds up ([b - a, D] fp32, "+="
     * from here on: a zeroed window or the rows of the whole gradient); *dW = NULL: no
     * weight gradient. */
    mt_status (*grad_begin)(void *ctx, int64_t a, int64_t b, float **dW);
    /* After chunk [a, b)'s backward: its gradient dW (from grad_begin) is complete. */
    mt_status (*grad_end)(void *ctx, int64_t a, int64_t b, float *dW);
} mt_vocab_chunk_source;

/* Rows [*ca, *cb) of chunk c of C of a slice of Vl rows: [c Vl / C, (c + 1) Vl / C) (the
 * row split of kernels/tiled_loss.h); the one split of the loss's and the embedding's
 * chunks (models/model_internal.h mtm_vocab_chunk). */
void mt_vocab_chunk_rows(int64_t Vl, int64_t C, int64_t c, int64_t *ca, int64_t *cb);

/* Bytes of the chunked loss's scratch for N rows: sz [2N] fp64, a 2-double stats sink,
 * mx [N] fp32 (8-byte aligned as given). 0 for N <= 0. */
size_t mt_vocab_chunked_scratch_bytes(int64_t N);

/* The loss of mt_vocab_parallel_loss (a group of one with comm NULL, v0 = 0, Vl = V)
 * with the unembedding from src in chunks. tile: mt_tiled_loss_tile_rows(N, num_tiles)
 * x ceil(Vl / C) floats; dtile (dt != MT_F32, backward): as many elements of dt;
 * scratch: mt_vocab_chunked_scratch_bytes(N); dh_acc: [N, D] fp32 when dt != MT_F32 and
 * dh is given (the chunks' sum before its one rounding to dt; with MT_F32 dh itself
 * accumulates), else unused. dh (NULL: loss only, no chunk is fetched after pass 2)
 * gets dscale dloss/dh (overwritten); each chunk's gradient goes where src->grad_begin
 * says. stats as mt_vocab_parallel_loss. Errors: MT_ERR_INVALID (NULL scratch / stats /
 * src, C outside [1, Vl], a bf16 backward without dtile or dh_acc), those of src's
 * callbacks, the ops and the collectives. */
MT_MUST_CHECK mt_status mt_vocab_chunked_loss(mt_backend *be, mt_comm *comm, const mt_vocab_loss_args *a,
                                              const mt_vocab_chunk_source *src, const void *h, mt_dtype dt,
                                              const int32_t *labels, float *tile, void *dtile, void *scratch,
                                              float *dh_acc, void *dh, double *stats);

#ifdef __cplusplus
}
#endif
#endif
