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
    /* the same ops on the same values: the loss sums agree to fp64 summation order */
    cr_assert(fabs(ls1 - ls2) <= 1e-9 * fabs(ls2), "%s: loss %.12g vs %.12g", what, ls1, ls2);

    for (int64_t i = 0; i < in.num_tensors; i++) {
        mt_tensor_info ti;
        mt_session_param_info(s, i, &ti);
        float amax = 0.0f;
        for (int64_t j = off[i]; j < off[i + 1]; j++) amax = fmaxf(amax, fabsf(g2[j]));
        cr_assert_gt(amax, 0.0f, "%s: %s has an all-zero gradient", what, ti.name);
        /* Both paths run the same fp32 ops in the same order (the tiled loss with the
         * model's tile count, then the shared backward), so they agree to far better
         * than 1e-6 of the tensor's largest entry; 1e-6 leaves room only for a
         * different summation order, not for a missing or doubled term. */
        for (int64_t j = off[i]; j < off[i + 1]; j++)
            cr_assert(fabsf(g1[j] - g2[j]) <= 1e-6f * amax, "%s: %s[%lld]: backward_hidden %.9g vs "
                      "forward_backward %.9g", what, ti.name, (long long)(j - off[i]), g1[j], g2[j]);
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
         * e = 0 is |g|^2, i.e. every element of g weighted by itself. eps makes the loss
         * move by ~1e-3 of L0 (|g|^2 eps = 1e-3 L0): the fp32 noise of L (~1e-7 L0,
         * rounding of the hidden states) is then ~1e-4 of the difference, and the
         * central difference's O(eps^2) term is of the same order for this smooth
         * loss (measured: at most 8e-5 over these tensors and both models). 5e-4
         * relative leaves a 6x margin and still catches a wrong or missing term (those
         * are O(1) of some tensor's gradient). */
        const double eps = 1e-3 * L0 / gg;
        double Lpm[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            const double e = sgn == 0 ? eps : -eps;
            for (int64_t i = 0; i < ti.numel; i++) p[i] = (float)(p0[i] + e * g[i]);
            cr_assert_eq(mt_session_set_param(s, names[k], p, ti.numel), MT_OK);
            Lpm[sgn] = custom_loss(s, tok, t, D, h, NULL);
        }
        cr_assert_eq(mt_session_set_param(s, names[k], p0, ti.numel), MT_OK);
        /* the step actually taken: the float32 parameters differ from p0 + e g */
        double taken = 0.0;
        for (int64_t i = 0; i < ti.numel; i++) {
            const double up = (float)(p0[i] + eps * g[i]), dn = (float)(p0[i] - eps * g[i]);
            taken += (up - dn) * g[i];
        }
        /* to first order L(up) - L(dn) = sum_i g_i (up_i - dn_i) = taken; scaled by |g|^2 */
        const double fd = (Lpm[0] - Lpm[1]) / taken * gg;
        cr_assert(fabs(fd - gg) <= 5e-4 * gg, "%s: %s: finite difference %.9g vs |g|^2 %.9g (rel %.2g)", model,
                  names[k], fd, gg, fabs(fd - gg) / gg);
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
