/* tests/test_tiled_loss.c: vocab-tiled cross-entropy (kernels/tiled_loss.c) on the CPU
 * backend.
 *
 * 1. Tiling must not change the result: num_tiles = 2 and 7 (7 does not divide the 23
 *    rows, so tiles hold 3 or 4 rows) against num_tiles = 1, for the loss, the token
 *    count, dh and the accumulated dW. Only the row grouping of the GEMMs and the order
 *    in which dW sums over rows change, so they agree to fp32 rounding of those sums.
 * 2. The untiled result against a naive fp64 full softmax cross-entropy with its
 *    analytic gradients (softmax - onehot, times the soft-cap derivative).
 * Ignored rows, dW accumulation (+=), the balanced split, loss-only calls and the size of
 * the tile buffer are checked on the way. MT_TEST_VERBOSE=1 prints the errors. */
#include <criterion/criterion.h>

#include "kernels/tiled_loss.h"
#include "tests/test_ops_util.h"

#define EXPECT_ERR(what, err, tol)                                                      \
    do {                                                                                \
        double e_ = (err);                                                              \
        tu_report(what, e_, tol);                                                       \
        cr_expect(e_ <= (tol), "%s: error %.3e exceeds %.1e", what, e_, (double)(tol)); \
    } while (0)

enum { N = 23, D = 32, V = 160, IGNORE = -100 };
#define CANARY 12345.0f
#define TOL_GEMM 2e-6 /* see the comments at its uses */
#define GUARD 64

typedef struct result {
    double loss;
    int64_t count;
    float *dh, *dW;
} result;

/* Run the tiled loss with a tile buffer of exactly mt_tiled_loss_tile_rows * V floats
 * followed by a guard band that must stay untouched. */
static result run_tiled(int64_t T, float softcap, const float *h, const float *W,
                        const int32_t *labels, const float *dW0, float dscale) {
    const int64_t rows = mt_tiled_loss_tile_rows(N, T);
    float *tile = tu_falloc(rows * V + GUARD);
    for (int64_t i = rows * V; i < rows * V + GUARD; i++) tile[i] = CANARY;
    result r = {0.25, 2, tu_falloc(N * D), tu_falloc(V * D)}; /* totals are += */
    memcpy(r.dW, dW0, sizeof(float) * V * D);
    mt_tiled_loss_args a = {N, D, V, T, softcap, IGNORE, dscale};
    mt_tiled_loss(mt_cpu_ops(), &a, h, W, labels, tile, r.dh, r.dW, &r.loss, &r.count);
    r.loss -= 0.25;
    r.count -= 2;
    int intact = 1;
    for (int64_t i = rows * V; i < rows * V + GUARD; i++) intact &= tile[i] == CANARY;
    cr_expect(intact, "num_tiles=%ld wrote past its tile buffer", (long)T);
    free(tile);
    return r;
}

static double rel_f(const float *got, const float *want, int64_t n) {
    double *w = tu_to_double(want, n);
    double e = tu_rel_err(got, w, n);
    free(w);
    return e;
}

static void tiled_case(float softcap) {
    tu_rng rng = {softcap > 0 ? 5u : 6u};
    float *h = tu_falloc(N * D), *W = tu_falloc(V * D), *dW0 = tu_falloc(V * D);
    tu_fill_normal(&rng, h, N * D, 1.0);
    tu_fill_normal(&rng, W, V * D, 0.5);
    tu_fill_normal(&rng, dW0, V * D, 0.01);
    int32_t labels[N];
    for (int i = 0; i < N; i++) labels[i] = (int32_t)tu_below(&rng, V);
    labels[0] = labels[9] = labels[22] = IGNORE; /* padding rows, incl. first and last */
    const int64_t labelled = N - 3;
    const float dscale = 1.0f / (float)labelled;

    /* fp64 reference: full [N, V] logits, softmax cross-entropy, analytic gradients */
    double *g = tu_dalloc(N * V), *dh_ref = tu_dalloc(N * D), *dW_ref = tu_dalloc(V * D);
    double loss_ref = 0.0;
    for (int64_t r = 0; r < N; r++) {
        if (labels[r] == IGNORE) continue;
        double z[V], mx = -INFINITY, s = 0.0;
        for (int64_t v = 0; v < V; v++) {
            double x = 0.0;
            for (int64_t d = 0; d < D; d++) x += (double)h[r * D + d] * (double)W[v * D + d];
            z[v] = softcap > 0 ? softcap * tanh(x / softcap) : x;
            mx = z[v] > mx ? z[v] : mx;
        }
        for (int64_t v = 0; v < V; v++) s += exp(z[v] - mx);
        loss_ref += mx + log(s) - z[labels[r]];
        for (int64_t v = 0; v < V; v++) {
            const double dz = softcap > 0 ? 1.0 - (z[v] / softcap) * (z[v] / softcap) : 1.0;
            g[r * V + v] = (double)dscale * (exp(z[v] - mx) / s - (v == labels[r])) * dz;
        }
    }
    for (int64_t r = 0; r < N; r++)
        for (int64_t v = 0; v < V; v++)
            for (int64_t d = 0; d < D; d++) {
                dh_ref[r * D + d] += g[r * V + v] * (double)W[v * D + d];
                dW_ref[v * D + d] += g[r * V + v] * (double)h[r * D + d];
            }
    for (int64_t i = 0; i < V * D; i++) dW_ref[i] += (double)dW0[i];

    result r1 = run_tiled(1, softcap, h, W, labels, dW0, dscale);
    char what[96];
    cr_expect(r1.count == labelled, "count = labelled rows");
    /* Untiled vs fp64. The loss: D = 32-term fp32 logits (|x| ~ 3) into an fp64 log-sum,
     * measured <= 1e-9 relative. dh = dlogits W sums V = 160 terms whose partial sums are
     * as large as the result (the label's -W row dominates), so an fp32 GEMM is off by
     * ~sqrt(V) u |dh| ~ 7.5e-7 of the largest entry; dW likewise (dlogits errors plus
     * N-term sums). Measured <= 6.1e-7 for both, hence TOL_GEMM = 2e-6. */
    snprintf(what, sizeof what, "cap=%g T=1 loss vs fp64", softcap);
    EXPECT_ERR(what, fabs(r1.loss - loss_ref) / loss_ref, 2e-8);
    snprintf(what, sizeof what, "cap=%g T=1 dh vs fp64", softcap);
    EXPECT_ERR(what, tu_rel_err(r1.dh, dh_ref, N * D), TOL_GEMM);
    snprintf(what, sizeof what, "cap=%g T=1 dW (+=) vs fp64", softcap);
    EXPECT_ERR(what, tu_rel_err(r1.dW, dW_ref, V * D), TOL_GEMM);
    for (int d = 0; d < D; d++)
        cr_expect(r1.dh[9 * D + d] == 0.0f && r1.dh[22 * D + d] == 0.0f, "ignored rows: dh = 0");

    const int64_t tiles[] = {2, 7, N};
    for (int t = 0; t < 3; t++) {
        result rt = run_tiled(tiles[t], softcap, h, W, labels, dW0, dscale);
        cr_expect(rt.count == r1.count, "count with num_tiles=%ld", (long)tiles[t]);
        /* Same rows and the same fp32 ops; what changes is the GEMMs' row grouping, and
         * OpenBLAS picks M-dependent kernels that sum in a different order (checked: a
         * 23-row product and its 11 + 12-row halves differ in 44% of their entries),
         * plus dW's summation over tiles. So tiled and untiled differ by fp32 GEMM
         * rounding, the same sqrt(V) u scale as above: measured loss <= 2e-8, dh
         * <= 7.2e-7, dW <= 6e-7 of the largest entry; held to the 1e-6. */
        snprintf(what, sizeof what, "cap=%g T=%ld vs T=1 loss", softcap, (long)tiles[t]);
        EXPECT_ERR(what, fabs(rt.loss - r1.loss) / fabs(r1.loss), 1e-7);
        snprintf(what, sizeof what, "cap=%g T=%ld vs T=1 dh", softcap, (long)tiles[t]);
        EXPECT_ERR(what, rel_f(rt.dh, r1.dh, N * D), 1e-6);
        snprintf(what, sizeof what, "cap=%g T=%ld vs T=1 dW", softcap, (long)tiles[t]);
        EXPECT_ERR(what, rel_f(rt.dW, r1.dW, V * D), 1e-6);
        free(rt.dh);
        free(rt.dW);
    }
    free(r1.dh);
    free(r1.dW);
    free(h);
    free(W);
    free(dW0);
    free(g);
    free(dh_ref);
    free(dW_ref);
}

Test(tiled_loss, tiles_match_untiled_and_fp64) { tiled_case(0.0f); }
Test(tiled_loss, tiles_match_untiled_and_fp64_softcap) { tiled_case(8.0f); }

Test(tiled_loss, balanced_split_sizes) {
    cr_expect(mt_tiled_loss_tile_rows(23, 1) == 23);
    cr_expect(mt_tiled_loss_tile_rows(23, 2) == 12);
    cr_expect(mt_tiled_loss_tile_rows(23, 7) == 4); /* tiles of 3 or 4 rows */
    cr_expect(mt_tiled_loss_tile_rows(23, 23) == 1);
    cr_expect(mt_tiled_loss_tile_rows(24, 4) == 6);
}

Test(tiled_loss, loss_only_and_no_dW) {
    tu_rng rng = {9};
    float *h = tu_falloc(N * D), *W = tu_falloc(V * D), *tile = tu_falloc(4 * V);
    float *dh2 = tu_falloc(N * D), *dh3 = tu_falloc(N * D), *dW = tu_falloc(V * D);
    tu_fill_normal(&rng, h, N * D, 1.0);
    tu_fill_normal(&rng, W, V * D, 0.5);
    int32_t labels[N];
    for (int i = 0; i < N; i++) labels[i] = (int32_t)tu_below(&rng, V);
    mt_tiled_loss_args a = {N, D, V, 7, 0.0f, IGNORE, 1.0f};
    double l1 = 0.0, l2 = 0.0, l3 = 0.0;
    int64_t c1 = 0, c2 = 0, c3 = 0;
    mt_tiled_loss(mt_cpu_ops(), &a, h, W, labels, tile, NULL, NULL, &l1, &c1);
    mt_tiled_loss(mt_cpu_ops(), &a, h, W, labels, tile, dh2, NULL, &l2, &c2);
    mt_tiled_loss(mt_cpu_ops(), &a, h, W, labels, tile, dh3, dW, &l3, &c3);
    /* neither the loss nor dh depends on which gradients are asked for: bitwise */
    cr_expect(l1 == l2 && l2 == l3 && c1 == N && c2 == N && c3 == N);
    cr_expect(tu_bitwise_equal(dh2, dh3, N * D));
    free(h);
    free(W);
    free(tile);
    free(dh2);
    free(dh3);
    free(dW);
}
