/* tests/test_backward_hidden.c: mt_session_backward_hidden (include/meshtrain.h), the
 * backward of the decoder from a caller-supplied gradient of the final hidden states.
 *
 * Expected values come from definitions, not from the implementation:
 *   - consistency: the LM loss computed by the test itself on the hidden states
 *     (mt_session_forward, then the tiled-loss VJP giving dhidden and the unembedding
 *     gradient, then backward_hidden) is the loss mt_session_forward_backward
 *     differentiates, so the two must give the same gradients; under several remat
 *     policies (recompute, host offload) and a tied, soft-capped, post-normed gemma2;
 *   - a loss the built-in path cannot express, 0.5 * mean over rows of
 *     ||h_r - t_r||^2 with fixed random targets t, against central finite differences
 *     of that loss evaluated in float64 on the hidden states of the forward;
 *   - misuse: no forward, a forward consumed by a backward, parameters written after
 *     the forward, NULL. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* internal headers first (they define mt_status; meshtrain.h then skips its copy) */
#include "tests/test_fixtures.h"
#include "meshtrain.h"

#define V 64
#define B 2
#define T 16
#define N (B * T)

static char g_dir[TU_TMPDIR_LEN];
static char g_cfg[256];

/* Two tiny models next to run.yml: a llama (untied lm_head) and a gemma2 (tied
 * embedding, final soft-cap, post-attention and post-MLP norms, local/global layers). */
static void setup(void) {
    tu_tmpdir_create(g_dir, "mt_bwdh");
    tu_write_model(g_dir, "tiny", TU_TINY_LLAMA_YML);
    tu_write_model(g_dir, "tinyg2",
                   "decoder_block: gemma2\nvocab_size: 64\nbase_emb_dim: 32\nbase_num_query_heads: 4\n"
                   "base_num_kv_heads: 2\nhead_dim: 8\nbase_mlp_dim: 64\nbase_num_decoder_layers: 2\n"
                   "mlp_activations: [\"gelu\", \"linear\"]\nnormalization_layer_epsilon: 1.0e-6\n"
                   "logits_via_embedding: true\nattn_logits_soft_cap: 50.0\nfinal_logits_soft_cap: 30.0\n"
                   "sliding_window_size: 4\nsliding_window_pattern: 2\nquery_pre_attn_scalar: 8\n"
                   "use_post_attn_norm: true\nuse_post_ffw_norm: true\nrope_max_timescale: 10000\n");
    snprintf(g_cfg, sizeof g_cfg, "%s/run.yml", g_dir);
    char run[512];
    snprintf(run, sizeof run,
             "model_name: tiny\nbase_output_directory: %s/out\ndataset_path:\n"
             "per_device_batch_size: 2\nmax_target_length: 16\nseed: 3\nnum_vocab_tiling: 3\n",
             g_dir);
    tu_write_file(g_cfg, run);
}

static void teardown(void) { tu_tmpdir_remove(g_dir); }

TestSuite(backward_hidden, .init = setup, .fini = teardown);

static mt_session *open_session(int n, const char *const *ov) {
    mt_session *s = NULL;
    mt_status st = mt_session_create(&s, g_cfg, n, ov);
    cr_assert_eq(st, MT_OK, "create: %s", mt_last_error());
    return s;
}

/* All gradients, concatenated in the model's tensor order; offsets in off[i]. */
static float *all_grads(mt_session *s, int64_t *off) {
    mt_session_info in;
    cr_assert_eq(mt_session_get_info(s, &in), MT_OK);
    float *g = malloc((size_t)in.num_params * sizeof(float));
    int64_t o = 0;
    for (int64_t i = 0; i < in.num_tensors; i++) {
        mt_tensor_info ti;
        cr_assert_eq(mt_session_param_info(s, i, &ti), MT_OK);
        off[i] = o;
        cr_assert_eq(mt_session_get_grad(s, ti.name, g + o, ti.numel), MT_OK, "%s", mt_last_error());
        o += ti.numel;
    }
    off[in.num_tensors] = o;
    return g;
}

/* forward -> tiled-loss VJP (dhidden + unembedding gradient) -> backward_hidden gives
 * the gradients of forward_backward with the same dscale, tensor by tensor. */
static void check_consistency(int n, const char *const *ov, const char *what) {
    mt_session *s = open_session(n, ov);
    mt_session_info in;
    cr_assert_eq(mt_session_get_info(s, &in), MT_OK);
    const int64_t D = in.emb_dim;
    int32_t tok[N], lab[N];
    tu_fill_tokens(tok, lab, N, V, 17);
    float *h = malloc((size_t)(N * D) * sizeof(float)), *dh = malloc((size_t)(N * D) * sizeof(float));
    int64_t *off = malloc((size_t)(in.num_tensors + 1) * sizeof(int64_t));
    const float dscale = 1.0f / (N - 1);

    double ls1 = 0.0, ls2 = 0.0;
    int64_t c1 = 0, c2 = 0;
    cr_assert_eq(mt_session_zero_grads(s), MT_OK);
    cr_assert_eq(mt_session_forward(s, tok, h), MT_OK, "%s: %s", what, mt_last_error());
    cr_assert_eq(mt_session_tiled_loss(s, h, lab, N, dscale, dh, 1, &ls1, &c1), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_OK, "%s: %s", what, mt_last_error());
    float *g1 = all_grads(s, off);

    cr_assert_eq(mt_session_zero_grads(s), MT_OK);
    cr_assert_eq(mt_session_forward_backward(s, tok, lab, dscale, &ls2, &c2), MT_OK, "%s", mt_last_error());
    float *g2 = all_grads(s, off);
    cr_assert_eq(c1, N - 1);
    cr_assert_eq(c2, c1);
    /* Tolerance 0, loss and gradients: both paths call the same kernels with the same
     * shapes on the same values in the same order (the forward; mt_tiled_loss with the
     * session's num_vocab_tiling, which adds the unembedding's gradient first; then the
     * shared backward), and each op is deterministic for its inputs and shape on any
     * machine (README: reruns and thread counts are bitwise), so every rounding is the
     * same. Old bounds: 1e-9 relative (loss) and 1e-6 of the tensor's largest entry,
     * "room for a different summation order" that the paths do not have. */
    cr_assert(ls1 == ls2, "%s: loss %.17g vs %.17g", what, ls1, ls2);

    for (int64_t i = 0; i < in.num_tensors; i++) {
        mt_tensor_info ti;
        mt_session_param_info(s, i, &ti);
        float amax = 0.0f;
        for (int64_t j = off[i]; j < off[i + 1]; j++) amax = fmaxf(amax, fabsf(g2[j]));
        cr_assert_gt(amax, 0.0f, "%s: %s has an all-zero gradient", what, ti.name);
        for (int64_t j = off[i]; j < off[i + 1]; j++) /* bitwise (above) */
            cr_assert(g1[j] == g2[j], "%s: %s[%lld]: backward_hidden %.9g vs forward_backward %.9g", what, ti.name,
                      (long long)(j - off[i]), g1[j], g2[j]);
    }
    free(g1);
    free(g2);
    free(h);
    free(dh);
    free(off);
    mt_session_free(s);
}

Test(backward_hidden, lm_loss_matches_forward_backward) {
    const char *keep[] = {"model_name=tiny"};
    check_consistency(1, keep, "llama, all kept");
}

Test(backward_hidden, lm_loss_matches_forward_backward_remat) {
    const char *full[] = {"model_name=tiny", "remat_policy=full"};
    check_consistency(2, full, "llama, remat_policy=full");
    const char *off[] = {"model_name=tiny", "remat_policy=minimal_offloaded"};
    check_consistency(2, off, "llama, remat_policy=minimal_offloaded");
}

Test(backward_hidden, lm_loss_matches_forward_backward_gemma2_tied) {
    const char *g2[] = {"model_name=tinyg2"};
    check_consistency(1, g2, "gemma2, tied");
}

/* The custom loss L(h) = 0.5 / N * sum_r ||h_r - t_r||^2 of the hidden states of
 * tokens, in float64; its gradient dL/dh_r = (h_r - t_r) / N into dh when non-NULL. */
static double custom_loss(mt_session *s, const int32_t *tok, const float *t, int64_t D, float *h, float *dh) {
    cr_assert_eq(mt_session_forward(s, tok, h), MT_OK, "%s", mt_last_error());
    double L = 0.0;
    for (int64_t i = 0; i < N * D; i++) {
        const double e = (double)h[i] - t[i];
        L += 0.5 * e * e / N;
        if (dh) dh[i] = (float)(e / N);
    }
    return L;
}

/* The model's shape (setup's YAML) for the chain count of tests/test_fixtures.h. */
static mt_model_config model_shape(const char *model) {
    const int g2 = strstr(model, "tinyg2") != NULL;
    mt_model_config c = tu_model_shape(g2 ? MT_DECODER_GEMMA2 : MT_DECODER_LLAMA2, V, 32, 4, 2, 8, 64, 2);
    c.use_post_attn_norm = c.use_post_ffw_norm = g2;
    c.attn_logits_soft_cap = g2 ? 50.0f : 0.0f;
    return c;
}

/* delta: a bound on the fp32 forward error of custom_loss (tests/test_fixtures.h): the
 * hidden states of row r are within lambda sqrt(S) u of exact relative to their
 * perturbation response, S the terms on the chain to a hidden state (the layers and
 * the final norm); the row's share L_r = 0.5 ||h_r - t_r||^2 / N moves with them, and
 * its condition is evaluated here (every parameter times 1 + eta xi: kappa_r |L_r| =
 * |L_r' - L_r| / eta); the rows' errors are summed without cancellation. */
static double custom_loss_delta(mt_session *s, const int32_t *tok, const float *t, int64_t D, int64_t S) {
    mt_session_info in;
    cr_assert_eq(mt_session_get_info(s, &in), MT_OK);
    float *h0 = malloc((size_t)(N * D) * sizeof(float)), *h1 = malloc((size_t)(N * D) * sizeof(float));
    cr_assert_eq(mt_session_forward(s, tok, h0), MT_OK, "%s", mt_last_error());
    float **keep = malloc(sizeof(float *) * (size_t)in.num_tensors);
    uint64_t k = 0;
    for (int64_t i = 0; i < in.num_tensors; i++) {
        mt_tensor_info ti;
        cr_assert_eq(mt_session_param_info(s, i, &ti), MT_OK);
        keep[i] = malloc((size_t)ti.numel * sizeof(float));
        float *w = malloc((size_t)ti.numel * sizeof(float));
        cr_assert_eq(mt_session_get_param(s, ti.name, keep[i], ti.numel), MT_OK);
        for (int64_t j = 0; j < ti.numel; j++, k++) {
            uint32_t r[4];
            mt_rng_u32x4(23, 0x4b415050u, k, r);
            w[j] = (float)(keep[i][j] * (1.0 + ((r[0] & 1u) ? TU_KAPPA_ETA : -TU_KAPPA_ETA)));
        }
        cr_assert_eq(mt_session_set_param(s, ti.name, w, ti.numel), MT_OK);
        free(w);
    }
    cr_assert_eq(mt_session_forward(s, tok, h1), MT_OK, "%s", mt_last_error());
    for (int64_t i = 0; i < in.num_tensors; i++) {
        mt_tensor_info ti;
        cr_assert_eq(mt_session_param_info(s, i, &ti), MT_OK);
        cr_assert_eq(mt_session_set_param(s, ti.name, keep[i], ti.numel), MT_OK);
        free(keep[i]);
    }
    free(keep);
    double sum = 0.0;
    for (int64_t r = 0; r < N; r++) {
        double l0 = 0.0, l1 = 0.0;
        for (int64_t d = 0; d < D; d++) {
            const double e0 = (double)h0[r * D + d] - t[r * D + d], e1 = (double)h1[r * D + d] - t[r * D + d];
            l0 += 0.5 * e0 * e0 / N;
            l1 += 0.5 * e1 * e1 / N;
        }
        sum += fabs(l1 - l0) / TU_KAPPA_ETA;
    }
    free(h0);
    free(h1);
    return TU_LAMBDA * sqrt((double)S) * TU_U_F32 * sum;
}

#ifndef FD_STEP
#define FD_STEP 8e-3 /* the step e of L(p + e g), in units of L0 / |g|^2 */
#endif
#ifndef FD_PLANT
#define FD_PLANT 0.0 /* relative error planted in |g|^2: shows the check can fail */
#endif

static void check_custom_loss_fd(const char *model) {
    const char *ov[] = {model};
    mt_session *s = open_session(1, ov);
    mt_session_info in;
    cr_assert_eq(mt_session_get_info(s, &in), MT_OK);
    const int64_t D = in.emb_dim;
    int32_t tok[N], lab[N];
    tu_fill_tokens(tok, lab, N, V, 29);
    float *h = malloc((size_t)(N * D) * sizeof(float)), *dh = malloc((size_t)(N * D) * sizeof(float));
    float *t = malloc((size_t)(N * D) * sizeof(float));
    unsigned r = 99;
    for (int64_t i = 0; i < N * D; i++) { /* targets uniform in [-1, 1) */
        r = r * 1664525u + 1013904223u;
        t[i] = (float)((r >> 8) * (2.0 / 16777216.0) - 1.0);
    }
    cr_assert_eq(mt_session_zero_grads(s), MT_OK);
    const mt_model_config cs = model_shape(model);
    const int64_t S = tu_chain_terms(&cs, T, 0, 0) - cs.emb_dim; /* to the final norm's output */
    const double delta = custom_loss_delta(s, tok, t, D, S);
    const double L0 = custom_loss(s, tok, t, D, h, dh);
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_OK, "%s", mt_last_error());

    /* The hidden states get no gradient through an unembedding here: lm_head's
     * gradient must stay exactly zero (a tied embedding gets its input-side one). */
    const char *names[] = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                           "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.down_proj.weight",
                           "model.norm.weight"};
    const int tied = strstr(model, "tinyg2") != NULL;
    if (!tied) {
        float *gl = malloc((size_t)(V * D) * sizeof(float));
        cr_assert_eq(mt_session_get_grad(s, "lm_head.weight", gl, V * D), MT_OK);
        for (int64_t i = 0; i < V * D; i++) cr_assert_eq(gl[i], 0.0f, "lm_head grad[%lld] = %g", (long long)i, gl[i]);
        free(gl);
    }
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        mt_tensor_info ti;
        cr_assert_eq(mt_session_param_find(s, names[k], &ti), MT_OK);
        float *p0 = malloc((size_t)ti.numel * sizeof(float)), *g = malloc((size_t)ti.numel * sizeof(float));
        float *p = malloc((size_t)ti.numel * sizeof(float));
        cr_assert_eq(mt_session_get_param(s, names[k], p0, ti.numel), MT_OK);
        cr_assert_eq(mt_session_get_grad(s, names[k], g, ti.numel), MT_OK);
        double gg = 0.0;
        for (int64_t i = 0; i < ti.numel; i++) gg += (double)g[i] * g[i];
        cr_assert_gt(gg, 0.0, "%s: %s has an all-zero gradient", model, names[k]);
        /* Directional derivative along the tensor's own gradient g: d/de L(p + e g) at
         * e = 0 is |g|^2 (every element of g weighted by itself). Central differences
         * D(e) = (L(p + e g) - L(p - e g)) / 2e = |g|^2 + c2 e^2 + c4 e^4 + ..., and
         * Richardson's R(e) = (4 D(e) - D(2e)) / 3 = |g|^2 + O(e^4), held to
         *   trunc = 2 |R(e) - R(2e)| / 15 (the estimate of the e^4 term; the 2 covers
         *     an e^6 remainder up to half of it), plus
         *   round = 2 delta / e: each L within delta of exact (custom_loss_delta), so
         *     D(e) within delta / e, R(e) within 1.5 delta / e, the estimate 0.3 more.
         * The step e = FD_STEP L0 / |g|^2 (FD_STEP = 8e-3) moves L by 0.8% of L0 and
         * balances the two: round is 7e-4 to 1.2e-3 of |g|^2 here, trunc (e^4) up to
         * 3e-4 of it. At 4e-3 round doubles; at 1.6e-2 trunc dominates and the measured
         * error reaches 0.8 of the bound (the e^6 remainder is no longer small); at
         * 3.2e-2 the estimate fails. The bound is 7e-4 to 1.2e-3 of |g|^2 (over 1% fails:
         * too loose to see a missing term); measured |R - |g|^2| at most 0.14 of the
         * bound (most below 0.01). A gradient off by 1% fails every tensor
         * (FD_PLANT=0.01). The steps are those the fp32 parameters
         * take: D is scaled by |g|^2 / sum_i g_i (up_i - dn_i), exact to first order when
         * the gradient is right. Old bound: 5e-4 relative with one step, from a
         * measured 8e-5. */
        const double e1 = FD_STEP * L0 / gg;
        double Dk[3];
        for (int q = 0; q < 3; q++) {
            const double e = e1 * (double)(1 << q);
            double Lpm[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                for (int64_t i = 0; i < ti.numel; i++) p[i] = (float)(p0[i] + (sgn ? -e : e) * g[i]);
                cr_assert_eq(mt_session_set_param(s, names[k], p, ti.numel), MT_OK);
                Lpm[sgn] = custom_loss(s, tok, t, D, h, NULL);
            }
            double taken = 0.0;
            for (int64_t i = 0; i < ti.numel; i++) {
                const double up = (float)(p0[i] + e * g[i]), dn = (float)(p0[i] - e * g[i]);
                taken += (up - dn) * g[i];
            }
            Dk[q] = (Lpm[0] - Lpm[1]) / taken * gg;
        }
        cr_assert_eq(mt_session_set_param(s, names[k], p0, ti.numel), MT_OK);
        const double r1 = (4 * Dk[0] - Dk[1]) / 3, r2 = (4 * Dk[1] - Dk[2]) / 3;
        const double trunc = 2 * fabs(r1 - r2) / 15, round = 2 * delta / e1, bound = trunc + round;
        const double an = gg * (1.0 + FD_PLANT);
        cr_log_info("%s: %s: Richardson %.9g vs |g|^2 %.9g: |diff| %.2e, bound %.2e (trunc %.1e, round %.1e), "
                    "ratio %.3f, bound / |g|^2 %.2e",
                    model, names[k], r1, an, fabs(r1 - an), bound, trunc, round, fabs(r1 - an) / bound, bound / an);
        cr_expect(fabs(r1 - an) <= bound, "%s: %s: Richardson %.9g vs |g|^2 %.9g (rel %.2g, bound %.2g)", model,
                  names[k], r1, an, fabs(r1 - an) / an, bound / an);
        cr_assert(bound <= 1e-2 * an, "%s: %s: bound %.2g of |g|^2 is too loose to see a missing term", model,
                  names[k], bound / an);
        free(p0);
        free(p);
        free(g);
    }
    free(h);
    free(dh);
    free(t);
    mt_session_free(s);
}

Test(backward_hidden, custom_loss_matches_finite_differences) {
    check_custom_loss_fd("model_name=tiny");
}

Test(backward_hidden, custom_loss_matches_finite_differences_gemma2) {
    check_custom_loss_fd("model_name=tinyg2");
}

Test(backward_hidden, refuses_without_a_forward) {
    const char *ov[] = {"model_name=tiny"};
    mt_session *s = open_session(1, ov);
    mt_session_info in;
    cr_assert_eq(mt_session_get_info(s, &in), MT_OK);
    const int64_t D = in.emb_dim;
    int32_t tok[N], lab[N];
    tu_fill_tokens(tok, lab, N, V, 5);
    float *h = malloc((size_t)(N * D) * sizeof(float)), *dh = calloc((size_t)(N * D), sizeof(float));
    float *w = malloc((size_t)(D) * sizeof(float));

    /* a fresh session: nothing to differentiate */
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "mt_session_forward"), "message: %s", mt_last_error());
    cr_assert_eq(mt_session_backward_hidden(NULL, dh), MT_ERR_INVALID);
    cr_assert_eq(mt_session_backward_hidden(s, NULL), MT_ERR_INVALID);

    /* one backward per forward */
    cr_assert_eq(mt_session_forward(s, tok, h), MT_OK);
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_ERR_INVALID);

    /* mt_session_loss is a forward too; forward_backward consumes it */
    double ls;
    int64_t c;
    cr_assert_eq(mt_session_loss(s, tok, lab, &ls, &c), MT_OK);
    cr_assert_eq(mt_session_forward_backward(s, tok, lab, 1.0f, NULL, NULL), MT_OK);
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_ERR_INVALID);

    /* writing a parameter after the forward makes its activations stale */
    cr_assert_eq(mt_session_forward(s, tok, h), MT_OK);
    cr_assert_eq(mt_session_get_param(s, "model.norm.weight", w, D), MT_OK);
    cr_assert_eq(mt_session_set_param(s, "model.norm.weight", w, D), MT_OK);
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_ERR_INVALID);

    /* a zero dhidden adds nothing (the accumulate-only contract) */
    cr_assert_eq(mt_session_zero_grads(s), MT_OK);
    cr_assert_eq(mt_session_loss(s, tok, lab, &ls, &c), MT_OK);
    cr_assert_eq(mt_session_backward_hidden(s, dh), MT_OK, "%s", mt_last_error());
    int64_t *off = malloc((size_t)(in.num_tensors + 1) * sizeof(int64_t));
    float *g = all_grads(s, off);
    for (int64_t i = 0; i < in.num_params; i++) cr_assert_eq(g[i], 0.0f, "grad[%lld] = %g", (long long)i, g[i]);
    free(g);
    free(off);
    free(h);
    free(dh);
    free(w);
    mt_session_free(s);
}
