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
        MT_TRY(be->ops->vocab_tile_max(be, tile, R, Vl, a->softcap, mx, 0));
        MT_TRY(mt_comm_all_reduce_max(comm, mx, R, MT_COMM_F32));
        MT_TRY(be->ops->vocab_tile_sumexp(be, tile, R, Vl, mx, lab, v0, a->ignore_index, sz, 0));
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

size_t mt_vocab_chunked_scratch_bytes(int64_t N) {
    return N > 0 ? (size_t)N * (2 * sizeof(double) + sizeof(float)) + 2 * sizeof(double) : 0;
}

void mt_vocab_chunk_rows(int64_t Vl, int64_t C, int64_t c, int64_t *ca, int64_t *cb) {
    *ca = c * Vl / C;
    *cb = (c + 1) * Vl / C;
}

mt_status mt_vocab_chunked_loss(mt_backend *be, mt_comm *comm, const mt_vocab_loss_args *a,
                                const mt_vocab_chunk_source *src, const void *h, mt_dtype dt, const int32_t *labels,
                                float *tile, void *dtile, void *scratch, float *dh_acc, void *dh, double *stats) {
    const int64_t N = a->N, D = a->D, Vl = a->Vl, v0 = a->v0;
    if (N <= 0) return MT_OK;
    if (!scratch || !stats || !src)
        return mt_set_error(MT_ERR_INVALID, "mt_vocab_chunked_loss: %s is NULL",
                            !scratch ? "scratch" : !stats ? "stats" : "src");
    const int64_t C = src->num_chunks;
    if (C < 1 || C > Vl)
        return mt_set_error(MT_ERR_INVALID, "mt_vocab_chunked_loss: %lld chunks of a %lld-row vocabulary slice",
                            (long long)C, (long long)Vl);
    if (dh && dt != MT_F32 && (!dtile || !dh_acc))
        return mt_set_error(MT_ERR_INVALID, "mt_vocab_chunked_loss: dtype %s needs %s", mt_dtype_name(dt),
                            !dtile ? "a dlogits tile (dtile)" : "an fp32 dh accumulator (dh_acc)");
    const size_t es = mt_dtype_size(dt);
    const int64_t T = a->num_tiles < 1 ? 1 : a->num_tiles > N ? N : a->num_tiles;
    double *sz = scratch;          /* [2N]: sum of exps, label logit */
    double *discard = sz + 2 * N;  /* [2]: the stats of chunks after the first (the loss is counted once) */
    float *mx = (float *)(discard + 2); /* [N]: row max */
    /* Passes 1 and 2: the row max, then the sums, over every chunk (and the group) */
    for (int pass = 1; pass <= 2; pass++) {
        for (int64_t c = 0; c < C; c++) {
            int64_t ca, cb;
            mt_vocab_chunk_rows(Vl, C, c, &ca, &cb);
            const int64_t Vc = cb - ca;
            const void *W = NULL;
            MT_TRY(src->rows(src->ctx, ca, cb, &W));
            for (int64_t t = 0; t < T; t++) {
                const int64_t r0 = t * N / T, R = (t + 1) * N / T - r0;
                if (R == 0) continue;
                MT_TRY(be->ops->gemm(be, 0, 1, R, Vc, D, 1.0f, (const char *)h + (size_t)(r0 * D) * es, D, W, D, dt,
                                     0.0f, tile, Vc, MT_F32));
                /* pass 1: the max over the chunks; pass 2: with the final max only the cap */
                MT_TRY(be->ops->vocab_tile_max(be, tile, R, Vc, a->softcap, mx + r0, pass == 2 || c > 0));
                if (pass == 2)
                    MT_TRY(be->ops->vocab_tile_sumexp(be, tile, R, Vc, mx + r0, labels + r0, v0 + ca, a->ignore_index,
                                                      sz + 2 * r0, c > 0));
            }
        }
        if (pass == 1) MT_TRY(mt_comm_all_reduce_max(comm, mx, N, MT_COMM_F32));
        else MT_TRY(mt_comm_all_reduce(comm, sz, 2 * N, MT_COMM_F64));
    }
    if (!dh) { /* loss only: the row losses need (m_r, s_r, z_r[label]) alone */
        for (int64_t t = 0; t < T; t++) {
            const int64_t r0 = t * N / T, R = (t + 1) * N / T - r0;
            if (R > 0)
                MT_TRY(be->ops->vocab_tile_grad(be, tile, R, 1, mx + r0, sz + 2 * r0, labels + r0, v0,
                                                a->ignore_index, a->softcap, a->dscale, 0, stats));
        }
        return MT_OK;
    }
    /* Pass 3: dlogits per chunk, dh summed over the chunks in fp32, each chunk's dW */
    float *dh32 = dt == MT_F32 ? (float *)dh : dh_acc;
    void *dlog = dt == MT_F32 ? (void *)tile : dtile;
    for (int64_t c = 0; c < C; c++) {
        int64_t ca, cb;
        mt_vocab_chunk_rows(Vl, C, c, &ca, &cb);
        const int64_t Vc = cb - ca;
        const void *W = NULL;
        float *dW = NULL;
        MT_TRY(src->rows(src->ctx, ca, cb, &W));
        MT_TRY(src->grad_begin(src->ctx, ca, cb, &dW));
        for (int64_t t = 0; t < T; t++) {
            const int64_t r0 = t * N / T, R = (t + 1) * N / T - r0;
            if (R == 0) continue;
            const void *ht = (const char *)h + (size_t)(r0 * D) * es;
            MT_TRY(be->ops->gemm(be, 0, 1, R, Vc, D, 1.0f, ht, D, W, D, dt, 0.0f, tile, Vc, MT_F32));
            MT_TRY(be->ops->vocab_tile_max(be, tile, R, Vc, a->softcap, mx + r0, 1)); /* the cap */
            MT_TRY(be->ops->vocab_tile_grad(be, tile, R, Vc, mx + r0, sz + 2 * r0, labels + r0, v0 + ca,
                                            a->ignore_index, a->softcap, a->dscale, 1, c == 0 ? stats : discard));
            if (dt != MT_F32) /* the bf16 GEMM operand, rounded to nearest even as xent_tile rounds its dlogits */
                MT_TRY(be->ops->from_f32(be, dtile, dt, tile, R * Vc, 0, 0, 0));
            MT_TRY(be->ops->gemm(be, 0, 0, R, D, Vc, 1.0f, dlog, Vc, W, D, dt, c > 0 ? 1.0f : 0.0f, dh32 + r0 * D, D,
                                 MT_F32));
            if (dW) MT_TRY(be->ops->gemm(be, 1, 0, Vc, D, R, 1.0f, dlog, Vc, ht, D, dt, 1.0f, dW, D, MT_F32));
        }
        MT_TRY(src->grad_end(src->ctx, ca, cb, dW));
    }
    if (dt != MT_F32) MT_TRY(be->ops->from_f32(be, dh, dt, dh_acc, N * D, 0, 0, 0));
    if (comm) MT_TRY(mt_comm_all_reduce(comm, dh, N * D, dt == MT_F32 ? MT_COMM_F32 : MT_COMM_BF16));
    return MT_OK;
}
