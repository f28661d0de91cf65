/* parallel/vocab_loss.c: vocab-parallel tiled cross-entropy (vocab_loss.h). */
#include "parallel/vocab_loss.h"

#include <math.h>
#include <stdlib.h>

mt_status mt_vocab_parallel_loss(mt_backend *be, mt_comm *comm, const mt_vocab_loss_args *a, const float *h,
                                 const float *W_l, const int32_t *labels, float *tile, float *dh, float *dW_l,
                                 double *loss_sum, int64_t *count) {
    const int64_t N = a->N, D = a->D, Vl = a->Vl, v0 = a->v0;
    const float cap = a->softcap;
    int64_t T = a->num_tiles;
    if (N <= 0) return MT_OK;
    if (T < 1) T = 1;
    if (T > N) T = N;
    const int64_t Rmax = (N + T - 1) / T;
    float *mx = malloc(sizeof(float) * (size_t)Rmax);
    double *sz = malloc(sizeof(double) * (size_t)(2 * Rmax));
    if (!mx || !sz) {
        free(mx);
        free(sz);
        return mt_set_error(MT_ERR_OOM, "vocab-parallel loss: out of memory");
    }
    mt_status st = MT_OK;
    double ls = 0.0;
    int64_t cnt = 0;
    for (int64_t t = 0; t < T && st == MT_OK; t++) {
        const int64_t r0 = t * N / T, r1 = (t + 1) * N / T, R = r1 - r0;
        if (R == 0) continue;
        const float *ht = h + r0 * D;
        MT_TRY(be->ops->gemm(be, 0, 1, R, Vl, D, 1.0f, ht, D, W_l, D, MT_F32, 0.0f, tile, Vl, MT_F32));
        for (int64_t r = 0; r < R; r++) {
            float *z = tile + r * Vl, m = -INFINITY;
            for (int64_t j = 0; j < Vl; j++) {
                if (cap > 0.0f) z[j] = cap * tanhf(z[j] / cap);
                if (z[j] > m) m = z[j];
            }
            mx[r] = m;
        }
        st = mt_comm_all_reduce_max(comm, mx, R, MT_COMM_F32);
        if (st != MT_OK) break;
        for (int64_t r = 0; r < R; r++) {
            const float *z = tile + r * Vl;
            double s = 0.0;
            for (int64_t j = 0; j < Vl; j++) s += exp((double)z[j] - mx[r]);
            const int32_t lab = labels[r0 + r];
            sz[2 * r] = s;
            sz[2 * r + 1] = lab != a->ignore_index && lab >= v0 && lab < v0 + Vl ? (double)z[lab - v0] : 0.0;
        }
        st = mt_comm_all_reduce(comm, sz, 2 * R, MT_COMM_F64);
        if (st != MT_OK) break;
        for (int64_t r = 0; r < R; r++) {
            float *z = tile + r * Vl;
            const int32_t lab = labels[r0 + r];
            if (lab == a->ignore_index) {
                for (int64_t j = 0; j < Vl; j++) z[j] = 0.0f;
                continue;
            }
            const double lse = mx[r] + log(sz[2 * r]);
            ls += lse - sz[2 * r + 1];
            cnt++;
            if (!dh) continue;
            for (int64_t j = 0; j < Vl; j++) {
                double g = exp((double)z[j] - lse) - (v0 + j == lab ? 1.0 : 0.0);
                if (cap > 0.0f) {
                    const double u = (double)z[j] / cap;
                    g *= 1.0 - u * u;
                }
                z[j] = (float)(a->dscale * g);
            }
        }
        if (!dh) continue;
        MT_TRY(be->ops->gemm(be, 0, 0, R, D, Vl, 1.0f, tile, Vl, W_l, D, MT_F32, 0.0f, dh + r0 * D, D, MT_F32));
        if (dW_l) MT_TRY(be->ops->gemm(be, 1, 0, Vl, D, R, 1.0f, tile, Vl, ht, D, MT_F32, 1.0f, dW_l, D, MT_F32));
    }
    free(mx);
    free(sz);
    if (st == MT_OK && dh) st = mt_comm_all_reduce(comm, dh, N * D, MT_COMM_F32);
    if (st == MT_OK) {
        *loss_sum += ls;
        *count += cnt;
    }
    return st;
}
