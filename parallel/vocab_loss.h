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
 * and after the last tile dh is all-reduced over the group (N x D floats), so the
 * gradient flows only into the rank's slice of W and every rank gets the full dh.
 * Per call the rank sends (T > 1) 2 (T-1)/T x (4 N + 16 N + 4 N D [backward]) bytes.
 * Buffers are host memory (MPI backend); a row whose label is ignore_index has no
 * loss and a zero gradient. */
#ifndef MT_PARALLEL_VOCAB_LOSS_H
#define MT_PARALLEL_VOCAB_LOSS_H

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

/* h[N, D], W_l[Vl, D] (this rank's rows), labels[N] global ids -> *loss_sum, *count
 * (identical on every rank of the group). dh (may be NULL: loss only) gets
 * dscale dloss/dh (overwritten, full after the all-reduce); dW_l (may be NULL)
 * += dscale dloss/dW_l. tile: mt_tiled_loss_tile_rows(N, num_tiles) x Vl floats.
 * comm: the tensor group (NULL = one rank). Errors: those of the collectives, MT_ERR_OOM. */
mt_status mt_vocab_parallel_loss(mt_backend *be, mt_comm *comm, const mt_vocab_loss_args *a, const float *h,
                                 const float *W_l, const int32_t *labels, float *tile, float *dh, float *dW_l,
                                 double *loss_sum, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
