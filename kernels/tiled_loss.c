/* kernels/tiled_loss.c: vocab-tiled cross-entropy and its VJP on any backend.
 *
 * Rows are cut into num_tiles balanced tiles (tile t = rows [t*N/T, (t+1)*N/T)); per
 * tile the logits live only in the caller's tile buffer: logits = h_t W^T, then
 * xent_tile turns them into dscale * dloss/dlogits (in place, or into the bf16 dlogits
 * tile), then dh_t = dlogits W
 * (overwrite) and dW += dlogits^T h_t. Everything goes through the op table, so the CPU
 * and CUDA backends share this file (MaxText vocab tiling; Wijmans et al. 2024). */
#include "kernels/tiled_loss.h"

int64_t mt_tiled_loss_tile_rows(int64_t N, int64_t num_tiles) {
    if (N <= 0) return 0;
    if (num_tiles < 1) num_tiles = 1;
    if (num_tiles > N) num_tiles = N;
    return (N + num_tiles - 1) / num_tiles;
}

mt_status mt_tiled_loss(mt_backend *be, const mt_tiled_loss_args *a, const void *h, const void *W, mt_dtype dt,
                        const int32_t *labels, float *tile, void *dtile, void *dh, float *dW, double *stats) {
    const int64_t N = a->N, D = a->D, V = a->V;
    int64_t T = a->num_tiles;
    if (N <= 0) return MT_OK;
    if (dt != MT_F32 && !dtile)
        return mt_set_error(MT_ERR_INVALID, "mt_tiled_loss: dtype %s needs a dlogits tile (dtile)", mt_dtype_name(dt));
    void *dlog = dt == MT_F32 ? (void *)tile : dtile;
    const size_t es = mt_dtype_size(dt);
    /* Out-of-range tile counts are clamped, matching mt_tiled_loss_tile_rows. */
    if (T < 1) T = 1;
    if (T > N) T = N;
    for (int64_t t = 0; t < T; t++) {
        const int64_t r0 = t * N / T, r1 = (t + 1) * N / T, R = r1 - r0;
        if (R == 0) continue;
        const void *ht = (const char *)h + (size_t)(r0 * D) * es;
        MT_TRY(be->ops->gemm(be, 0, 1, R, V, D, 1.0f, ht, D, W, D, dt, 0.0f, tile, V, MT_F32));
        MT_TRY(be->ops->xent_tile(be, tile, dlog, dt, labels + r0, R, V, a->softcap, a->ignore_index, a->dscale,
                                  stats));
        if (!dh) continue;
        MT_TRY(be->ops->gemm(be, 0, 0, R, D, V, 1.0f, dlog, V, W, D, dt, 0.0f, (char *)dh + (size_t)(r0 * D) * es, D,
                             dt));
        if (dW) MT_TRY(be->ops->gemm(be, 1, 0, V, D, R, 1.0f, dlog, V, ht, D, dt, 1.0f, dW, D, MT_F32));
    }
    return MT_OK;
}
