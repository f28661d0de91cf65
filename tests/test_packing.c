/* tests/test_packing.c: document masking for packed sequences at the model level
 * (mt_model_layout packing; the op-level checks are in tests/test_ops_attention.c and
 * tests/test_gpu_ops.c, the context-parallel ones in tests/test_mpi_packing.sh).
 *
 * The reference runs each document alone: a model of the same parameters with the
 * document's length as its sequence, positions from 0 and no other document to attend
 * to, with the labels the document's rows have in the packed window. Loss sums and
 * gradients are sums over rows, so the packed window (one model, packing on) must give
 * the sum of the per-document runs. A window that starts inside a document (rows before
 * the first separator, segment 0) is such a document too. The same window without
 * packing must differ by far more than the bound, or the check could not fail.
 * (Restarted RoPE positions cannot be told apart here: scores depend on position
 * differences only, so they change rounding, not the result.) Llama, Gemma 3 and
 * Gemma 4 (KV sharing and per-layer inputs). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include "tests/test_ops_util.h"

#define SEP 1                  /* the separator (BOS) */

typedef struct fixture {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
} fixture;

static void fx_init(fixture *f, const mt_model_config *c, int64_t B, int64_t T, int packing) {
    memset(f, 0, sizeof(*f));
    mt_backend *be = mt_cpu_backend();
    const mt_model_layout lay = {.packing = packing, .packing_separator = SEP};
    cr_assert_eq(mt_model_create(&f->m, c, be, B, T, 1, &lay), MT_OK, "%s", mt_last_error());
    tu_model_plan_bind(f->m, be, &f->plan, &f->arena);
}

static void fx_free(fixture *f) {
    mt_arena_destroy(&f->arena);
    mt_plan_free(f->plan);
    mt_model_free(f->m);
}

/* loss sum and gradients (dscale 1, so both are plain sums over rows) */
static double step(fixture *f, const float *params, const int32_t *tok, const int32_t *lab, float *grads) {
    const int64_t numel = mt_model_numel(f->m);
    memcpy(mt_model_params(f->m), params, (size_t)numel * sizeof(float));
    memset(mt_model_grads(f->m), 0, (size_t)numel * sizeof(float));
    double ls;
    int64_t cnt;
    cr_assert_eq(mt_model_forward_backward(f->m, tok, lab, 1.0f, &ls, &cnt), MT_OK, "%s", mt_last_error());
    memcpy(grads, mt_model_grads(f->m), (size_t)numel * sizeof(float));
    return ls;
}

#define B_ 2
#define T_ 24

/* Row 0: documents at 0, 7, 8 (a one-token document) and 15. Row 1 starts inside a
 * document (rows 0..4, segment 0), then documents at 5 and 17. Other tokens are drawn
 * from [2, V); labels are the next token of the row (the separator for a document's
 * last row), the window's last label drawn too, one label ignored. */
static const int k_starts[B_][4] = {{0, 7, 8, 15}, {5, 17, -1, -1}};

static void make_window(int64_t V, int32_t *tok, int32_t *lab) {
    for (int64_t b = 0; b < B_; b++)
        for (int64_t t = 0; t < T_; t++) {
            uint32_t r[4];
            mt_rng_u32x4(2026, 3, (uint64_t)(b * T_ + t), r);
            int32_t x = 2 + (int32_t)(r[0] % (uint32_t)(V - 2));
            for (int s = 0; s < 4; s++)
                if (k_starts[b][s] == t) x = SEP;
            tok[b * T_ + t] = x;
            lab[b * T_ + t] = (int32_t)(r[1] % (uint32_t)V);
        }
    for (int64_t b = 0; b < B_; b++)
        for (int64_t t = 0; t + 1 < T_; t++) lab[b * T_ + t] = tok[b * T_ + t + 1];
    lab[1 * T_ + 10] = MT_IGNORE_LABEL;
}

/* The term count S of tests/test_bounds.h for c, overcounted where the tiny Gemma 4
 * goes beyond tu_chain_terms' one head dim and MLP width: the largest of each over the
 * layers, and its per-layer inputs (models/model_gemma4.c): per layer the gate (D
 * terms), gelu (2), the product by P_l (1), the projection (P), its norm (D), the
 * residual and the layer scalar (2): 2 D + P + 5; before the layers the projection of
 * the embedding (D), its norm (P) and four scalings and sums (4); the backward mirrors
 * them. */
static int64_t chain_terms(const mt_model_config *c, int64_t T, int backward, int64_t N) {
    mt_model_config m = *c;
    for (int64_t l = 0; l < c->num_decoder_layers; l++) {
        if (mt_model_layer_head_dim(c, l) > m.head_dim) m.head_dim = mt_model_layer_head_dim(c, l);
        if (mt_model_layer_mlp_dim(c, l) > m.mlp_dim) m.mlp_dim = mt_model_layer_mlp_dim(c, l);
    }
    int64_t S = tu_chain_terms(&m, T, backward, N);
    if (c->decoder_block == MT_DECODER_GEMMA4 && c->per_layer_input_dim > 0) {
        const int64_t D = c->emb_dim, P = c->per_layer_input_dim, L = c->num_decoder_layers;
        S += (L * (2 * D + P + 5) + D + P + 4) * (backward ? 2 : 1);
    }
    return S;
}

static void check_packed_equals_documents_alone(const mt_model_config *c) {
    int32_t tok[B_ * T_], lab[B_ * T_];
    make_window(c->vocab_size, tok, lab);
    fixture fp;
    fx_init(&fp, c, B_, T_, 1);
    const int64_t numel = mt_model_numel(fp.m);
    cr_assert_eq(mt_model_init_params(fp.m, 7), MT_OK);
    float *params = malloc((size_t)numel * sizeof(float));
    memcpy(params, mt_model_params(fp.m), (size_t)numel * sizeof(float));
    for (int64_t i = 0; i < numel; i++) params[i] *= 4.0f; /* off the near-linear regime of the init */
    float *gp = malloc((size_t)numel * sizeof(float)), *gr = calloc((size_t)numel, sizeof(float));
    float *gd = malloc((size_t)numel * sizeof(float)), *gu = malloc((size_t)numel * sizeof(float));
    const double lp = step(&fp, params, tok, lab, gp);
    /* the conditions of the packed model at these parameters (tests/test_bounds.h): each
     * tensor's gradient kappa (tu_grad_kappa) and the labelled rows' loss error delta
     * (tu_loss_delta, on the mean over the 47 labelled rows) */
    const int np = mt_model_param_count(fp.m);
    double *kappa = malloc((size_t)np * sizeof(double));
    tu_grad_kappa(fp.m, tok, lab, 1.0f, kappa, NULL);
    const int64_t S_loss = chain_terms(c, T_, 0, 0) + c->vocab_size + 2;
    const int64_t S_grad = chain_terms(c, T_, 1, B_ * T_) + 7; /* + the sum of the 7 documents' */
    const double delta = tu_loss_delta(fp.m, tok, lab, B_ * T_, c->vocab_size, S_loss);
    mt_param_info *info = malloc((size_t)np * sizeof(mt_param_info));
    for (int i = 0; i < np; i++) info[i] = *mt_model_param(fp.m, i);
    fx_free(&fp);

    /* each document alone: rows [s, e) of a row of the window */
    double lr = 0.0;
    int ndocs = 0;
    for (int64_t b = 0; b < B_; b++) {
        int64_t cuts[6], nc = 0;
        cuts[nc++] = 0;
        for (int s = 0; s < 4; s++)
            if (k_starts[b][s] > 0) cuts[nc++] = k_starts[b][s];
        cuts[nc++] = T_;
        for (int64_t d = 0; d + 1 < nc; d++) {
            const int64_t s0 = cuts[d], len = cuts[d + 1] - cuts[d];
            fixture fd;
            fx_init(&fd, c, 1, len, 0);
            lr += step(&fd, params, tok + b * T_ + s0, lab + b * T_ + s0, gd);
            for (int64_t i = 0; i < numel; i++) gr[i] += gd[i];
            fx_free(&fd);
            ndocs++;
        }
    }
    cr_assert_eq(ndocs, 7);

    /* the same window without packing: attention crosses documents */
    fixture fu;
    fx_init(&fu, c, B_, T_, 0);
    const double lu = step(&fu, params, tok, lab, gu);
    fx_free(&fu);

    /* Bounds (tests/test_bounds.h; Higham and Mary 2019, Theorem 3.1, u = 2^-24,
     * lambda = 6). Both sides compute the same sums in fp32 in different orders and
     * groupings (GEMMs over 48 rows vs over one document's rows, then added; attention
     * blocks of other lengths): two evaluations of the same exact values. Gradients: per
     * tensor, within tu_chain_bound(u, S_grad, kappa) max |g| of each other, S_grad the
     * backward chain over the window's 48 rows (chain_terms) + 7 for the sum of the
     * documents' gradients, kappa the tensor's measured condition. Loss sum: each side
     * within 47 delta of the exact sum (delta: the mean labelled row loss's bound,
     * tu_loss_delta, S_loss = the chain to a logit + V + 2), so the two within 94 delta.
     * Was: tol = 8 sqrt(K) u max|g| with sum|terms| taken as 8 max|g| by hand, and
     * L (D + F) sqrt(47 (V + D)) u |loss|. Measured (MT_TEST_VERBOSE=1): gradients at
     * most 0.003 of their bounds, the loss 2e-4 to 4e-4 (S_loss 439 to 2714, S_grad 1025
     * to 6162); unpacked: 379 to 6300 bounds off on some tensor, the loss 240 to 1800. */
    double gworst = 0.0, uworst = 0.0;
    for (int i = 0; i < np; i++) {
        double tmax = 0.0, terr = 0.0, tuerr = 0.0;
        for (int64_t j = info[i].offset; j < info[i].offset + info[i].numel; j++) {
            tmax = fmax(tmax, fabs((double)gr[j]));
            terr = fmax(terr, fabs((double)gp[j] - (double)gr[j]));
            tuerr = fmax(tuerr, fabs((double)gu[j] - (double)gr[j]));
        }
        const double tb = tu_chain_bound(U32, S_grad, kappa[i]) * tmax;
        if (tb > 0.0) {
            gworst = fmax(gworst, terr / tb);
            cr_expect(terr <= tb, "%s: packed vs documents alone %.3e > bound %.3e (kappa %.3g)", info[i].name, terr,
                      tb, kappa[i]);
            uworst = fmax(uworst, tuerr / tb);
        } else {
            cr_expect(terr == 0.0, "%s: zero gradient, packed differs by %.3e", info[i].name, terr);
        }
    }
    const double ltol = 2.0 * 47.0 * delta;
    if (getenv("MT_TEST_VERBOSE"))
        fprintf(stderr, "%s: S %lld / %lld; loss %.9g vs %.9g (err %.3e tol %.3e, unpacked %.3e); grads worst %.3g "
                "of the bound; unpacked: %.3g bounds on the tensor it differs most\n",
                mt_decoder_block_name(c->decoder_block), (long long)S_loss, (long long)S_grad, lp, lr, fabs(lp - lr),
                ltol, fabs(lu - lr), gworst, uworst);
    cr_expect(fabs(lp - lr) <= ltol, "loss: packed %.9g vs documents alone %.9g (tol %.3e)", lp, lr, ltol);
    /* the check can fail: without masking the same window is outside the bounds, the
     * gradients far outside */
    cr_expect(fabs(lu - lr) > 2 * ltol, "unpacked loss %.9g too close to %.9g", lu, lr);
    cr_expect(uworst > 10, "unpacked gradients too close (%.3g bounds at most)", uworst);
    free(kappa);
    free(info);
    free(params);
    free(gp);
    free(gr);
    free(gd);
    free(gu);
}

Test(packing, llama_documents_alone) {
    mt_model_config c = tu_tiny_llama3();
    check_packed_equals_documents_alone(&c);
}

Test(packing, gemma3_documents_alone) {
    /* Gemma 3: local (window 3) and global layers, QK-norm, soft-caps. */
    mt_model_config c = tu_tiny_gemma3_capped(2);
    check_packed_equals_documents_alone(&c);
}

Test(packing, gemma4_documents_alone) {
    /* Gemma 4: KV sharing (layers 2-4 read 0 and 1's K/V), per-layer inputs, double-wide
     * MLPs, head dims 8 / 16 (proportional RoPE on the global layers), window 3. */
    mt_model_config c = tu_tiny_gemma4();
    check_packed_equals_documents_alone(&c);
}

Test(packing, off_is_bitwise_unchanged) {
    /* packing off (the default) takes exactly the old path: same bits as a model that
     * never heard of it */
    mt_model_config c = tu_tiny_llama3();
    int32_t tok[B_ * T_], lab[B_ * T_];
    make_window(c.vocab_size, tok, lab);
    fixture a;
    fx_init(&a, &c, B_, T_, 0);
    const int64_t numel = mt_model_numel(a.m);
    cr_assert_eq(mt_model_init_params(a.m, 7), MT_OK);
    float *params = malloc((size_t)numel * sizeof(float)), *g0 = malloc((size_t)numel * sizeof(float));
    float *g1 = malloc((size_t)numel * sizeof(float));
    memcpy(params, mt_model_params(a.m), (size_t)numel * sizeof(float));
    const double l0 = step(&a, params, tok, lab, g0);
    fx_free(&a);
    mt_model *m;
    cr_assert_eq(mt_model_create(&m, &c, mt_cpu_backend(), B_, T_, 1, NULL), MT_OK);
    mt_plan *plan;
    cr_assert_eq(mt_plan_new(&plan), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(m, plan), MT_OK);
    cr_assert_eq(mt_plan_finalize(plan), MT_OK);
    fixture b = {m, plan, {0}};
    cr_assert_eq(mt_backend_arena_create(mt_cpu_backend(), &b.arena, plan), MT_OK);
    cr_assert_eq(mt_model_bind(m, &b.arena, plan), MT_OK);
    const double l1 = step(&b, params, tok, lab, g1);
    cr_expect_eq(l0, l1);
    cr_expect(memcmp(g0, g1, (size_t)numel * sizeof(float)) == 0);
    fx_free(&b);
    /* the layout's separator is a token id (packing is fixed at creation: no setter to refuse after planning) */
    const mt_model_layout bad = {.packing = 1, .packing_separator = -1};
    cr_expect_eq(mt_model_create(&m, &c, mt_cpu_backend(), B_, T_, 1, &bad), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "packing_separator_id=-1") != NULL, "%s", mt_last_error());
    free(params);
    free(g0);
    free(g1);
}
