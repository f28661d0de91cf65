/* kernels/tiled_loss.c: vocab-tiled cross-entropy and its VJP on any backend.
 *
 * Rows are cut into num_tiles balanced tiles (tile t = rows [t*N/T, (t+1)*N/T)); per
 * tile the logits live only in the caller's tile buffer: logits = h_t W^T, then
 * xent_tile turns them into dscale * dloss/dlogits in place, then dh_t = dlogits W
 * (overwrite) and dW += dlogits^T h_t. Everything goes through the op table, so the CPU
 * and CUDA backends share this file (MaxText vocab tiling; Wijmans et al. 2024). */
#include "kernels/tiled_loss.h"

int64_t mt_tiled_loss_tile_rows(int64_t N, int64_t num_tiles) {
    if (N <= 0) return 0;
    if (num_tiles < 1) num_tiles = 1;
    if (num_tiles > N) num_tiles = N;
    return (N + num_tiles - 1) / num_tiles;
}

mt_status mt_tiled_loss(mt_backend *be, const mt_tiled_loss_args *a, const float *h,
                   const float *W, const int32_t *labels, float *tile, float *dh, float *dW,
                   double *loss_sum, int64_t *count) {
    const int64_t N = a->N, D = a->D, V = a->V;
    int64_t T = a->num_tiles;
    if (N <= 0) return MT_OK;
    /* Out-of-range tile counts are clamped, matching mt_tiled_loss_tile_rows. */
    if (T < 1) T = 1;
    if (T > N) T = N;
    for (int64_t t = 0; t < T; t++) {
        const int64_t r0 = t * N / T, r1 = (t + 1) * N / T, R = r1 - r0;
        if (R == 0) continue;
        const float *ht = h + r0 * D;
        MT_TRY(be->ops->gemm(be, 0, 1, R, V, D, 1.0f, ht, D, W, D, 0.0f, tile, V));
        MT_TRY(be->ops->xent_tile(be, tile, labels + r0, R, V, a->softcap, a->ignore_index, a->dscale, loss_sum,
                                  count));
        if (!dh) continue;
        MT_TRY(be->ops->gemm(be, 0, 0, R, D, V, 1.0f, tile, V, W, D, 0.0f, dh + r0 * D, D));
        if (dW) MT_TRY(be->ops->gemm(be, 1, 0, V, D, R, 1.0f, tile, V, ht, D, 1.0f, dW, D));
    }
    return MT_OK;
}
