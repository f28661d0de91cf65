/* kernels/tiled_loss.h: vocab-tiled cross-entropy with its VJP, backend-independent.
 *
 * The rows (batch x sequence) are cut into num_tiles tiles; tile t covers rows
 * [t*N/T, (t+1)*N/T) (integer division), so exactly T tiles whose sizes differ by at
 * most one row when T does not divide N (MaxText instead requires T | N). The tile
 * buffer holds ceil(N/T) x V floats and is the only vocabulary-sized memory:
 * for each tile
 *   logits = h_t @ W^T           (be->ops->gemm, fp32 logits)
 *   loss, dlogits                (be->ops->xent_tile, with the final soft-cap; in
 *                                 place in fp32, into a bf16 tile with dtype bf16)
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

/* h[N, D] and W[V, D] of dt (MT_F32 or MT_BF16: the activation dtype and the compute
 * weights), labels[N] -> stats[0] += the loss summed over labelled rows (fp64),
 * stats[1] += their count (stats: 2 doubles of backend memory, xent_tile's "+="; no
 * host synchronisation: the caller reads them once with copy_to_host).
 * If dh is non-NULL: dh[N, D] (dt) = dscale * dloss/dh (overwritten) and, if dW is
 * non-NULL, dW[V, D] (fp32) += dscale * dloss/dW. tile is scratch of
 * mt_tiled_loss_tile_rows(N, T) * V floats for the fp32 logits (the GEMM h W^T with
 * fp32 output); dtile is the dlogits operand of the two backward GEMMs: NULL with
 * MT_F32 (dlogits overwrite the logits in tile), else the same number of bf16
 * elements. All pointers in backend memory. Errors: the first failing op's status (a
 * backend failure, MT_ERR_RUNTIME on CUDA), with its message; MT_ERR_INVALID for a bf16
 * call without dtile. */
MT_MUST_CHECK mt_status mt_tiled_loss(mt_backend *be, const mt_tiled_loss_args *a, const void *h, const void *W,
                                      mt_dtype dt, const int32_t *labels, float *tile, void *dtile, void *dh,
                                      float *dW, double *stats);

#ifdef __cplusplus
}
#endif
#endif
