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

#ifdef __cplusplus
}
#endif
#endif
