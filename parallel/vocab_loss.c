/* parallel/vocab_loss.c: vocab-parallel tiled cross-entropy (vocab_loss.h).
 *
 * Per row tile: the GEMM into the tile, then the three phases of ops.h (vocab_tile_max,
 * vocab_tile_sumexp, vocab_tile_grad) with the two all-reduces between them on the
 * scratch buffers mx and sz, then the two backward GEMMs; dh is all-reduced once at the
 * end. Backend memory only, so the CPU and CUDA backends share this file. */
#include "parallel/vocab_loss.h"

#include "kernels/tiled_loss.h"

size_t mt_vocab_loss_scratch_bytes(int64_t N, int64_t num_tiles) {
    return (size_t)mt_tiled_loss_tile_rows(N, num_tiles) * (2 * sizeof(double) + sizeof(float));
}

mt_status mt_vocab_parallel_loss(mt_backend *be, mt_comm *comm, const mt_vocab_loss_args *a, const void *h,
                                 const void *W_l, mt_dtype dt, const int32_t *labels, float *tile, void *dtile,
                                 void *scratch, void *dh, float *dW_l, double *stats) {
    const int64_t N = a->N, D = a->D, Vl = a->Vl, v0 = a->v0;
    if (N <= 0) return MT_OK;
    if (!scratch || !stats)
        return mt_set_error(MT_ERR_INVALID, "mt_vocab_parallel_loss: %s is NULL", scratch ? "stats" : "scratch");
    if (dt != MT_F32 && !dtile)
        return mt_set_error(MT_ERR_INVALID, "mt_vocab_parallel_loss: dtype %s needs a dlogits tile (dtile)",
                            mt_dtype_name(dt));
    const size_t es = mt_dtype_size(dt);
    void *dlog = dt == MT_F32 ? (void *)tile : dtile;
    /* Out-of-range tile counts are clamped, matching mt_tiled_loss_tile_rows. */
    const int64_t T = a->num_tiles < 1 ? 1 : a->num_tiles > N ? N : a->num_tiles;
    const int64_t Rmax = mt_tiled_loss_tile_rows(N, T);
    double *sz = scratch;                   /* [2 Rmax]: sum of exps, label logit */
    float *mx = (float *)(sz + 2 * Rmax);   /* [Rmax]: row max */
    for (int64_t t = 0; t < T; t++) {
        const int64_t r0 = t * N / T, r1 = (t + 1) * N / T, R = r1 - r0;
        if (R == 0) continue;
        const void *ht = (const char *)h + (size_t)(r0 * D) * es;
        const int32_t *lab = labels + r0;
        MT_TRY(be->ops->gemm(be, 0, 1, R, Vl, D, 1.0f, ht, D, W_l, D, dt, 0.0f, tile, Vl, MT_F32));
        MT_TRY(be->ops->vocab_tile_max(be, tile, R, Vl, a->softcap, mx));
        MT_TRY(mt_comm_all_reduce_max(comm, mx, R, MT_COMM_F32));
        MT_TRY(be->ops->vocab_tile_sumexp(be, tile, R, Vl, mx, lab, v0, a->ignore_index, sz));
        MT_TRY(mt_comm_all_reduce(comm, sz, 2 * R, MT_COMM_F64));
        MT_TRY(be->ops->vocab_tile_grad(be, tile, R, Vl, mx, sz, lab, v0, a->ignore_index, a->softcap, a->dscale,
                                        dh != NULL, stats));
        if (!dh) continue;
        if (dt != MT_F32) /* the bf16 GEMM operand, rounded to nearest even as xent_tile rounds its dlogits */
            MT_TRY(be->ops->from_f32(be, dtile, dt, tile, R * Vl, 0, 0, 0));
        MT_TRY(be->ops->gemm(be, 0, 0, R, D, Vl, 1.0f, dlog, Vl, W_l, D, dt, 0.0f, (char *)dh + (size_t)(r0 * D) * es,
                             D, dt));
        if (dW_l) MT_TRY(be->ops->gemm(be, 1, 0, Vl, D, R, 1.0f, dlog, Vl, ht, D, dt, 1.0f, dW_l, D, MT_F32));
    }
    if (dh) MT_TRY(mt_comm_all_reduce(comm, dh, N * D, dt == MT_F32 ? MT_COMM_F32 : MT_COMM_BF16));
    return MT_OK;
}
