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

    /* Bounds. Both sides compute the same sums in fp32 in different orders and
     * groupings (GEMMs over 48 rows vs over one document's rows, then added; attention
     * blocks of other lengths), so each value differs by rounding alone. A sum of K
     * terms errs by at most K u sum|terms| (Higham, 3.1) and, with independent
     * roundings, by about sqrt(K) u sum|terms| (Higham, 3.10's rule of thumb), which is
     * the scale used here. Gradients: a weight gradient sums N = 48 rows, each row's
     * terms come through chains of K <= max(D, F, Dh T) additions in each of L layers
     * forward and backward, so K = 48 + 2 L max(D, F, Dh T); sum|terms| taken as
     * 8 max|g| (mixed signs): tol = 8 sqrt(K) u max|g|. Loss sum: 47 labelled rows, each
     * through V + D terms of its logits and logsumexp, on hidden states carrying
     * L (D + F) u of relative error from the layers: tol = L (D + F) sqrt(47 (V + D)) u
     * |loss|. F and Dh are the largest over the layers (gemma4's differ). The tiny
     * Llama (D 16, F 24, Dh 8, V 37, 2 layers): K = 816, tol 1.4e-5 max|g| (measured
     * ~7e-7), 2.4e-4 |loss| (measured ~1e-8 relative). */
    int64_t F = 0, Dh = 0;
    for (int64_t l = 0; l < c->num_decoder_layers; l++) {
        F = F > mt_model_layer_mlp_dim(c, l) ? F : mt_model_layer_mlp_dim(c, l);
        Dh = Dh > mt_model_layer_head_dim(c, l) ? Dh : mt_model_layer_head_dim(c, l);
    }
    const double L = (double)c->num_decoder_layers, D = (double)c->emb_dim;
    const double chain = fmax(fmax(D, (double)F), (double)(Dh * T_));
    double gmax = 0.0, gerr = 0.0, uerr = 0.0;
    for (int64_t i = 0; i < numel; i++) {
        gmax = fmax(gmax, fabs((double)gr[i]));
        gerr = fmax(gerr, fabs((double)gp[i] - (double)gr[i]));
        uerr = fmax(uerr, fabs((double)gu[i] - (double)gr[i]));
    }
    const double gtol = 8.0 * sqrt(48.0 + 2.0 * L * chain) * U32 * gmax;
    const double ltol = L * (D + (double)F) * sqrt(47.0 * ((double)c->vocab_size + D)) * U32 * fabs(lr);
    if (getenv("MT_TEST_VERBOSE"))
        fprintf(stderr, "%s: loss %.9g vs %.9g (err %.3e tol %.3e, unpacked %.3e); grads err %.3e tol %.3e "
                "(max %.3e, unpacked err %.3e)\n", mt_decoder_block_name(c->decoder_block), lp, lr,
                fabs(lp - lr), ltol, fabs(lu - lr), gerr, gtol, gmax, uerr);
    cr_expect(fabs(lp - lr) <= ltol, "loss: packed %.9g vs documents alone %.9g (tol %.3e)", lp, lr, ltol);
    cr_expect(gerr <= gtol, "gradients: max error %.3e > %.3e", gerr, gtol);
    /* the check can fail: without masking the same window is outside the bounds, the
     * gradients far outside (the loss bound's L (D + F) is loose: gemma4's 5 layers put
     * its unpacked loss at ~10 bounds, the 2-layer models' at 20 and 130) */
    cr_expect(fabs(lu - lr) > 2 * ltol, "unpacked loss %.9g too close to %.9g", lu, lr);
    cr_expect(uerr > 10 * gtol, "unpacked gradients too close (%.3e)", uerr);
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
