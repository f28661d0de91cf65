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
#include "tests/test_backend_util.h"
#include "tests/test_ops_util.h"

enum { N = 23, D = 32, V = 160, IGNORE = -100 };
#define CANARY 12345.0f
#define GUARD 64
/* U32 and GAMMA(n) (tests/test_ops_util.h; Higham, Lemma 3.1 and Eq. 3.5): an fp32 sum
 * of n products, in any order, with or without FMA, is within gamma_n sum |terms| of the
 * exact sum. That covers every OpenBLAS kernel (SSE3, AVX2, AVX-512) and every blocking. */

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
    double stats[2] = {r.loss, (double)r.count}; /* the CPU backend's memory is host memory */
    TU_OK(mt_tiled_loss(mt_cpu_backend(), &a, h, W, MT_F32, labels, tile, NULL, r.dh, r.dW, stats));
    r.loss = stats[0] - 0.25;
    r.count = (int64_t)stats[1] - 2;
    int intact = 1;
    for (int64_t i = rows * V; i < rows * V + GUARD; i++) intact &= tile[i] == CANARY;
    cr_expect(intact, "num_tiles=%ld wrote past its tile buffer", (long)T);
    free(tile);
    return r;
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

    /* fp64 reference: full [N, V] logits, softmax cross-entropy, analytic gradients,
     * and next to each value a first-order bound on the fp32 kernel's error (U32, GAMMA):
     *  - logit x_rv, an fp32 D-term dot product: ex = gamma_D sum_d |h_rd W_vd|.
     *  - soft-cap z = cap tanh(x inv_cap), inv_cap = 1/8 exact: |dz/dx| <= 1, plus the
     *    product x inv_cap (u), tanh of vmath.h (1 - 2 / (exp(2|x|) + 1) over a 2-ulp exp,
     *    or its odd polynomial: < 8u relative) and the product by cap (u): ez = ex + 10u|z|.
     *  - log-sum-exp: dlse = sum_v p_v ez_v (the softmax weights the logit errors), plus
     *    the fp32 z - max (u |z - max|) and exp (2.5 ulp = 5u, Test vmath in test_ops.c)
     *    of each term: es = sum_v p_v (u |z_v - max| + 5u) relative = absolute error of
     *    log(sum); their fp64 sum S, V terms of one sign in any order, within gamma64_V S
     *    (u64 = 2^-53): g64 = gamma64_V / (1 - gamma64_V) absolute on log S.
     *  - row loss l = max + log(sum) - z_label in fp64: log within 1 ulp (glibc manual;
     *    2 u64 |log S|) and the two additions (u64 (|max + log S| + |l|)):
     *    e64 = g64 + 2 u64 |log S| + u64 (|max + log S| + |l|), el = dlse + es + ez_label +
     *    2 e64 (the fp64 reference makes the fp64 errors too; its share of the fp32 terms,
     *    2^-29 of them, is inside the factor 1.01 below). The rows and the stats' starting
     *    0.25 (run_tiled subtracts it again): gamma64_(N+2) (0.25 + sum |l|); the
     *    reference's own row sum gamma64_N sum |l|.
     *  - gradient g = dscale (p - onehot) dz: p = exp(z - max) (1/sum) carries the
     *    logit shift (ez_v + dlse), es, 2 g64 (the kernel's and the reference's fp64 sums),
     *    its own z - max (u |z - max|), exp's 5u, 1/sum's and the product's 2u; the label's
     *    p - 1 one more u; dz = 1 - (z inv_cap)^2
     *    moves by 2 |z| ez / cap^2 and rounds three times (3u), dscale's product one more u (the reference uses the
     *    same fp32 dscale, so dscale itself carries no error):
     *    eg = dscale (p (ez + dlse + es + 2 g64 + u |z - max| + 8u) |dz|
     *                 + |p - onehot| (edz + 4u |dz|)).
     *  - dh = g W, a V-term fp32 sum: gamma_V sum_v (|g| + eg) |W| + sum_v eg |W|.
     *  - dW = dW0 + sum_r g h, summed over the N rows and dW0 in some order (tiles add with
     *    beta = 1): gamma_(N+1) (sum_r (|g| + eg) |h| + |dW0|) + sum_r eg |h|.
     *  - higher orders: the relative errors d_k along a chain compound to at most
     *    eps / (1 - eps), eps = sum |d_k| <= the largest relative error of p plus 4u,
     *    which is within 1.01 of first order, with the reference's 2^-29 share of the fp32
     *    terms (its fp64 logits, dh and dW sums), while eps <= 0.0099 (checked): every
     *    bound x 1.01. */
    double *g = tu_dalloc(N * V), *dh_ref = tu_dalloc(N * D), *dW_ref = tu_dalloc(V * D);
    double *eg = tu_dalloc(N * V), *dh_bnd = tu_dalloc(N * D), *dW_bnd = tu_dalloc(V * D);
    double loss_ref = 0.0, loss_bnd = 0.0, lsum = 0.0, eps = 0.0;
    for (int64_t r = 0; r < N; r++) {
        if (labels[r] == IGNORE) continue;
        double z[V], ez[V], p[V], mx = -INFINITY, s = 0.0, dlse = 0.0, es = 0.0;
        for (int64_t v = 0; v < V; v++) {
            double x = 0.0, sa = 0.0;
            for (int64_t d = 0; d < D; d++) {
                x += (double)h[r * D + d] * (double)W[v * D + d];
                sa += fabs((double)h[r * D + d] * (double)W[v * D + d]);
            }
            z[v] = softcap > 0 ? softcap * tanh(x / softcap) : x;
            ez[v] = GAMMA(D) * sa + (softcap > 0 ? 10.0 * U32 * fabs(z[v]) : 0.0);
            mx = z[v] > mx ? z[v] : mx;
        }
        for (int64_t v = 0; v < V; v++) s += exp(z[v] - mx);
        for (int64_t v = 0; v < V; v++) {
            p[v] = exp(z[v] - mx) / s;
            dlse += p[v] * ez[v];
            es += p[v] * U32 * (fabs(z[v] - mx) + 5.0);
        }
        const double l = mx + log(s) - z[labels[r]], g64 = GAMMA64(V) / (1.0 - GAMMA64(V));
        const double e64 = g64 + 2 * U64 * fabs(log(s)) + U64 * (fabs(mx + log(s)) + fabs(l));
        loss_ref += l;
        lsum += fabs(l);
        loss_bnd += dlse + es + ez[labels[r]] + 2 * e64;
        for (int64_t v = 0; v < V; v++) {
            const double t = softcap > 0 ? z[v] / softcap : 0.0, dz = 1.0 - t * t;
            const double edz = softcap > 0 ? 2.0 * fabs(t) * ez[v] / softcap + 3.0 * U32 : 0.0;
            const double pm = p[v] - (v == labels[r]);
            g[r * V + v] = (double)dscale * pm * dz;
            const double rp = ez[v] + dlse + es + 2 * g64 + U32 * fabs(z[v] - mx) + 8.0 * U32;
            eg[r * V + v] = 1.01 * (double)dscale * (p[v] * rp * fabs(dz) + fabs(pm) * (edz + 4.0 * U32 * fabs(dz)));
            eps = fmax(eps, rp + 4.0 * U32);
        }
    }
    loss_bnd = 1.01 * (loss_bnd + GAMMA64(N + 2) * (0.25 + lsum) + GAMMA64(N) * lsum);
    EXPECT_ERR("first-order eps of the chains (<= 0.0099)", eps, 0.0099);
    for (int64_t r = 0; r < N; r++)
        for (int64_t v = 0; v < V; v++)
            for (int64_t d = 0; d < D; d++) {
                const double ag = fabs(g[r * V + v]) + eg[r * V + v];
                dh_ref[r * D + d] += g[r * V + v] * (double)W[v * D + d];
                dW_ref[v * D + d] += g[r * V + v] * (double)h[r * D + d];
                dh_bnd[r * D + d] += 1.01 * GAMMA(V) * ag * fabs((double)W[v * D + d]) +
                                     eg[r * V + v] * fabs((double)W[v * D + d]);
                dW_bnd[v * D + d] += 1.01 * GAMMA(N + 1) * ag * fabs((double)h[r * D + d]) +
                                     eg[r * V + v] * fabs((double)h[r * D + d]);
            }
    for (int64_t i = 0; i < V * D; i++) {
        dW_ref[i] += (double)dW0[i];
        dW_bnd[i] += 1.01 * GAMMA(N + 1) * fabs((double)dW0[i]);
    }
    for (int64_t i = 0; i < N * D; i++) dh_bnd[i] += 1e-30; /* ignored rows: exact zeros */

    result r1 = run_tiled(1, softcap, h, W, labels, dW0, dscale);
    char what[96];
    cr_expect(r1.count == labelled, "count = labelled rows");
    /* Untiled vs fp64: every entry within the bound derived above (the error divided by
     * its bound <= 1); the loss within loss_bnd, the sum of the row bounds. */
    snprintf(what, sizeof what, "cap=%g T=1 loss vs fp64 (/bound)", softcap);
    EXPECT_ERR(what, fabs(r1.loss - loss_ref) / loss_bnd, 1.0);
    snprintf(what, sizeof what, "cap=%g T=1 dh vs fp64 (/bound)", softcap);
    EXPECT_ERR(what, tu_bound_ratio(r1.dh, dh_ref, dh_bnd, N * D), 1.0);
    snprintf(what, sizeof what, "cap=%g T=1 dW (+=) vs fp64 (/bound)", softcap);
    EXPECT_ERR(what, tu_bound_ratio(r1.dW, dW_ref, dW_bnd, V * D), 1.0);
    for (int d = 0; d < D; d++)
        cr_expect(r1.dh[9 * D + d] == 0.0f && r1.dh[22 * D + d] == 0.0f, "ignored rows: dh = 0");

    const int64_t tiles[] = {2, 7, N};
    for (int t = 0; t < 3; t++) {
        result rt = run_tiled(tiles[t], softcap, h, W, labels, dW0, dscale);
        cr_expect(rt.count == r1.count, "count with num_tiles=%ld", (long)tiles[t]);
        /* Same rows and the same fp32 ops; what changes is the GEMMs' row grouping (OpenBLAS
         * picks M-dependent kernels that sum in another order) and dW's summation over
         * tiles, i.e. only the order of the sums the bounds above already cover. Both
         * results are within those bounds of the fp64 reference, so they are within twice
         * the bound of each other (triangle inequality). */
        snprintf(what, sizeof what, "cap=%g T=%ld vs T=1 loss (/2 bound)", softcap, (long)tiles[t]);
        EXPECT_ERR(what, fabs(rt.loss - r1.loss) / (2.0 * loss_bnd), 1.0);
        double *d1 = tu_to_double(r1.dh, N * D), *w1 = tu_to_double(r1.dW, V * D);
        for (int64_t i = 0; i < N * D; i++) dh_bnd[i] *= 2.0;
        for (int64_t i = 0; i < V * D; i++) dW_bnd[i] *= 2.0;
        snprintf(what, sizeof what, "cap=%g T=%ld vs T=1 dh (/2 bound)", softcap, (long)tiles[t]);
        EXPECT_ERR(what, tu_bound_ratio(rt.dh, d1, dh_bnd, N * D), 1.0);
        snprintf(what, sizeof what, "cap=%g T=%ld vs T=1 dW (/2 bound)", softcap, (long)tiles[t]);
        EXPECT_ERR(what, tu_bound_ratio(rt.dW, w1, dW_bnd, V * D), 1.0);
        for (int64_t i = 0; i < N * D; i++) dh_bnd[i] *= 0.5;
        for (int64_t i = 0; i < V * D; i++) dW_bnd[i] *= 0.5;
        free(d1);
        free(w1);
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
    free(eg);
    free(dh_bnd);
    free(dW_bnd);
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
    double s1[2] = {0, 0}, s2[2] = {0, 0}, s3[2] = {0, 0}; /* {loss sum, count} */
    TU_OK(mt_tiled_loss(mt_cpu_backend(), &a, h, W, MT_F32, labels, tile, NULL, NULL, NULL, s1));
    TU_OK(mt_tiled_loss(mt_cpu_backend(), &a, h, W, MT_F32, labels, tile, NULL, dh2, NULL, s2));
    TU_OK(mt_tiled_loss(mt_cpu_backend(), &a, h, W, MT_F32, labels, tile, NULL, dh3, dW, s3));
    /* neither the loss nor dh depends on which gradients are asked for: bitwise */
    cr_expect(s1[0] == s2[0] && s2[0] == s3[0] && s1[1] == N && s2[1] == N && s3[1] == N);
    cr_expect(tu_bitwise_equal(dh2, dh3, N * D));
    free(h);
    free(W);
    free(tile);
    free(dh2);
    free(dh3);
    free(dW);
}
