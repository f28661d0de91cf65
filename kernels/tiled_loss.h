/* kernels/tiled_loss.h: vocab-tiled cross-entropy with its VJP, backend-independent.
 *
 * The rows (batch x sequence) are cut into num_tiles tiles; tile t covers rows
 * [t*N/T, (t+1)*N/T) (integer division), so exactly T tiles whose sizes differ by at
 * most one row when T does not divide N (MaxText instead requires T | N). The tile
 * buffer holds ceil(N/T) x V floats and is the only vocabulary-sized memory:
 * for each tile
 *   logits = h_t @ W^T           (be->ops->gemm)
 *   loss, dlogits in place       (be->ops->xent_tile, with the final soft-cap)
 *   dh_t   = dlogits @ W         (be->ops->gemm, overwrite)
 *   dW    += dlogits^T @ h_t     (be->ops->gemm, accumulate)
 * so the full [N, V] logits never exist (MaxText vocab tiling; Wijmans et al., "Cut
 * Your Losses in Large-Vocabulary Language Models", 2024). */
#ifndef MT_KERNELS_TILED_LOSS_H
#define MT_KERNELS_TILED_LOSS_H

#include <stdint.h>
#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_tiled_loss_args {
    int64_t N;            /* rows */
    int64_t D;            /* hidden size */
    int64_t V;            /* vocabulary */
    int64_t num_tiles;    /* 1 <= num_tiles <= N */
    float softcap;        /* final logit soft-cap, 0 = off */
    int32_t ignore_index; /* label of padding rows */
    float dscale;         /* loss cotangent multiplying every gradient */
} mt_tiled_loss_args;

/* Rows in the largest tile: ceil(N / num_tiles). The tile buffer is that times V. */
int64_t mt_tiled_loss_tile_rows(int64_t N, int64_t num_tiles);

/* h[N, D], W[V, D], labels[N] -> *loss_sum (sum over labelled rows, fp64), *count.
 * If dh is non-NULL: dh[N, D] = dscale * dloss/dh (overwritten) and, if dW is
 * non-NULL, dW[V, D] += dscale * dloss/dW. tile is scratch of
 * mt_tiled_loss_tile_rows(N, T) * V floats. All pointers in backend memory except
 * loss_sum and count (host). Errors: the first failing op's status (a backend
 * failure, MT_ERR_RUNTIME on CUDA), with its message. */
MT_MUST_CHECK mt_status mt_tiled_loss(mt_backend *be, const mt_tiled_loss_args *a, const float *h,
                   const float *W, const int32_t *labels, float *tile, float *dh, float *dW,
                   double *loss_sum, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
