/* tests/test_fixtures.h: set-up shared by the Criterion tests.
 *
 * - A temporary directory per test (create in the suite's .init, remove in .fini),
 *   paths inside it, model YAMLs written into it, token batches.
 * - The tiny model shapes several tests build on: one function per shape, so that a
 *   test names the shape it needs and sets only what differs.
 * - A created model planned, given an arena and bound (tu_model_plan_bind).
 *
 * Header-only (static inline): each test executable gets its own copy. */
#ifndef MT_TESTS_TEST_FIXTURES_H
#define MT_TESTS_TEST_FIXTURES_H

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/rng.h"
#include "runtime/plan.h"
#include "tests/test_bounds.h"

/* ------------------------------------------------------------ temporary directory */

/* Room for "/tmp/<prefix>_XXXXXX" with a short prefix. */
#define TU_TMPDIR_LEN 64

/* Create a fresh directory /tmp/<prefix>_XXXXXX (mkdtemp) and write its path into
 * dir[TU_TMPDIR_LEN]; asserts success. */
static inline void tu_tmpdir_create(char *dir, const char *prefix) {
    int n = snprintf(dir, TU_TMPDIR_LEN, "/tmp/%s_XXXXXX", prefix);
    cr_assert(n > 0 && n < TU_TMPDIR_LEN, "tmpdir prefix too long: %s", prefix);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s", dir);
}

/* Remove dir and everything under it (rm -rf); asserts success. */
static inline void tu_tmpdir_remove(const char *dir) {
    char cmd[TU_TMPDIR_LEN + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* "<dir>/<name>" in a ring of 32 buffers: copy a path that must outlive 31 more calls. */
static inline char *tu_path_in(const char *dir, const char *name) {
    static char buf[32][256];
    static int k;
    char *p = buf[k++ % 32];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

/* Write text to path (created or truncated); asserts success. */
static inline void tu_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert(fputs(text, f) >= 0 && fclose(f) == 0, "cannot write %s", path);
}

/* The tiny Llama of tests/lib.sh `mt_tiny_model FILE llama`: vocabulary 64, d_model 32,
 * 4 query / 2 kv heads of 8, MLP 64 (SwiGLU), 2 layers, untied, RoPE base 1e4. */
#define TU_TINY_LLAMA_YML                                                                    \
    "decoder_block: llama2\nvocab_size: 64\nbase_emb_dim: 32\nbase_num_query_heads: 4\n" \
    "base_num_kv_heads: 2\nhead_dim: 8\nbase_mlp_dim: 64\nbase_num_decoder_layers: 2\n"  \
    "mlp_activations: [\"silu\", \"linear\"]\nrope_max_timescale: 10000\n"

/* Write yml to "<dir>/models/<name>.yml" (model_name: <name> in a run.yml in dir),
 * creating <dir>/models when missing; asserts success. */
static inline void tu_write_model(const char *dir, const char *name, const char *yml) {
    char p[TU_TMPDIR_LEN + 160];
    snprintf(p, sizeof p, "%s/models", dir);
    cr_assert(mkdir(p, 0755) == 0 || errno == EEXIST, "mkdir %s", p);
    int w = snprintf(p, sizeof p, "%s/models/%s.yml", dir, name);
    cr_assert(w > 0 && (size_t)w < sizeof p, "model name too long: %s", name);
    tu_write_file(p, yml);
}

/* n tokens and labels in [0, vocab) from a linear congruential sequence (Numerical
 * Recipes' constants) started at seed; labels[3] = -1 (one ignored row; n > 3). */
static inline void tu_fill_tokens(int32_t *tok, int32_t *lab, int n, int vocab, unsigned seed) {
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        tok[i] = (int32_t)((seed >> 10) % (unsigned)vocab);
        lab[i] = (int32_t)((seed >> 20) % (unsigned)vocab);
    }
    lab[3] = -1;
}

/* ----------------------------------------------------------------- model shapes */

/* Block blk's defaults (mt_model_config_defaults) with the given shape: vocabulary,
 * d_model, query heads, kv heads, head_dim, MLP width, layers. */
static inline mt_model_config tu_model_shape(mt_decoder_block blk, int64_t vocab, int64_t emb, int64_t heads,
                                             int64_t kv_heads, int64_t head_dim, int64_t mlp, int64_t layers) {
    mt_model_config c;
    mt_model_config_defaults(&c, blk);
    c.vocab_size = vocab;
    c.emb_dim = emb;
    c.num_query_heads = heads;
    c.num_kv_heads = kv_heads;
    c.head_dim = head_dim;
    c.mlp_dim = mlp;
    c.num_decoder_layers = layers;
    return c;
}

/* The tiny GQA shape: d_model 16, 4 query / 2 kv heads of 8, MLP 24. */
static inline mt_model_config tu_tiny_gqa(mt_decoder_block blk, int64_t vocab, int64_t layers) {
    return tu_model_shape(blk, vocab, 16, 4, 2, 8, 24, layers);
}

/* The tiny MQA shape (Gemma 2B's: one kv head): d_model 16, 2 query / 1 kv head of 16,
 * MLP 32. */
static inline mt_model_config tu_tiny_mqa(mt_decoder_block blk, int64_t vocab, int64_t layers) {
    return tu_model_shape(blk, vocab, 16, 2, 1, 16, 32, layers);
}

/* Llama with Llama 3 RoPE scaling (original context 64): tu_tiny_gqa, vocabulary 37,
 * 2 layers. */
static inline mt_model_config tu_tiny_llama3(void) {
    mt_model_config c = tu_tiny_gqa(MT_DECODER_LLAMA2, 37, 2);
    c.rope_type = MT_ROPE_LLAMA3;
    c.rope_original_max_position = 64;
    return c;
}

/* Gemma 3 block with Gemma 2's soft-caps switched on too (2 on scores, 3 on logits),
 * window 3 on every 2nd layer, query_pre_attn_scalar 12: every optional path.
 * tu_tiny_gqa, vocabulary 31. */
static inline mt_model_config tu_tiny_gemma3_capped(int64_t layers) {
    mt_model_config c = tu_tiny_gqa(MT_DECODER_GEMMA3, 31, layers);
    c.sliding_window_size = 3;
    c.sliding_window_pattern = 2;
    c.attn_logits_soft_cap = 2.0f;
    c.final_logits_soft_cap = 3.0f;
    c.query_pre_attn_scalar = 12.0f;
    return c;
}

/* A tiny Gemma 4 (models/model_gemma4.c): 5 layers, vocabulary 41, d_model 32, 4 query
 * / 2 kv heads, head dim 8 on local layers and 16 on the global ones (1, 3 and 4, the
 * last forced global), window 3, the last 3 layers sharing K/V (with layer 0, local, and
 * 1, global) with double-wide MLPs (96), per-layer inputs of 4, final soft-cap 3. */
static inline mt_model_config tu_tiny_gemma4(void) {
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_GEMMA4);
    c.vocab_size = 41, c.emb_dim = 32, c.num_query_heads = 4, c.num_kv_heads = 2, c.head_dim = 8;
    c.global_head_dim = 16, c.mlp_dim = 48, c.num_decoder_layers = 5, c.sliding_window_size = 3;
    c.sliding_window_pattern = 2, c.num_kv_shared_layers = 3, c.use_double_wide_mlp = 1;
    c.per_layer_input_dim = 4, c.final_logits_soft_cap = 3.0f;
    return c;
}

/* The plan tests' model: d_model 64 (every per-layer parameter block a multiple of 256
 * bytes), 4 query / 2 kv heads of 32 (QK-norm scales: 2 x 32 floats = 256 bytes),
 * MLP 128, vocabulary 96; Gemma 2 with window 4 on every 2nd layer. */
static inline mt_model_config tu_plan_model(mt_decoder_block blk, int64_t layers) {
    mt_model_config c = tu_model_shape(blk, 96, 64, 4, 2, 32, 128, layers);
    if (blk == MT_DECODER_GEMMA2) {
        c.sliding_window_size = 4;
        c.sliding_window_pattern = 2;
    }
    return c;
}

/* ------------------------------------------------------------ a bound model */

/* Plan the created model m (its own entries only), allocate the plan on backend be into
 * *arena and bind m to it; *plan is the caller's to free (mt_plan_free) after
 * mt_arena_destroy. Fails the test on any error. */
static inline void tu_model_plan_bind(mt_model *m, mt_backend *be, mt_plan **plan, mt_arena *arena) {
    cr_assert_eq(mt_plan_new(plan), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(m, *plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_finalize(*plan), MT_OK);
    cr_assert_eq(mt_backend_arena_create(be, arena, *plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_bind(m, arena, *plan), MT_OK, "%s", mt_last_error());
}

/* model-level error bounds: tests/test_bounds.h */

/* The parameters of m (host memory: a CPU-backend model) times 1 + eta xi, xi = +-1
 * from Philox stream `seed` (the perturbation of the condition above); *keep gets the
 * old values, to be restored by the caller (memcpy back) and freed. */
static inline float *tu_perturb_params(mt_model *m, uint64_t seed) {
    const int64_t P = mt_model_numel(m);
    float *p = mt_model_params(m), *keep = malloc(sizeof(float) * (size_t)P);
    memcpy(keep, p, sizeof(float) * (size_t)P);
    tu_perturb_values(p, P, seed);
    return keep;
}

/* kappa[i] for each parameter tensor i of m (CPU backend): max |g' - g| / max |g| / eta
 * over the tensor, g the gradient of mt_model_forward_backward(tok, lab, dscale) at m's
 * parameters and g' at the perturbed ones (tu_perturb_params); the condition of the
 * comparison max |diff| / max |g| per tensor. kappa_loss (may be NULL) gets the loss
 * sum's |L' - L| / |L| / eta. m's parameters are restored; its gradients hold g. */
static inline void tu_grad_kappa(mt_model *m, const int32_t *tok, const int32_t *lab, float dscale, double *kappa,
                                 double *kappa_loss) {
    const int64_t P = mt_model_numel(m);
    float *g = mt_model_grads(m), *g0 = malloc(sizeof(float) * (size_t)P);
    double l0, l1;
    int64_t cnt;
    memset(g, 0, sizeof(float) * (size_t)P);
    cr_assert_eq(mt_model_forward_backward(m, tok, lab, dscale, &l0, &cnt), MT_OK, "%s", mt_last_error());
    memcpy(g0, g, sizeof(float) * (size_t)P);
    float *keep = tu_perturb_params(m, 29);
    memset(g, 0, sizeof(float) * (size_t)P);
    cr_assert_eq(mt_model_forward_backward(m, tok, lab, dscale, &l1, &cnt), MT_OK, "%s", mt_last_error());
    memcpy(mt_model_params(m), keep, sizeof(float) * (size_t)P);
    free(keep);
    for (int i = 0; i < mt_model_param_count(m); i++) {
        const mt_param_info *pi = mt_model_param(m, i);
        double d = 0.0, r = 0.0;
        for (int64_t j = pi->offset; j < pi->offset + pi->numel; j++) {
            d = fmax(d, fabs((double)g[j] - g0[j]));
            r = fmax(r, fabs((double)g0[j]));
        }
        kappa[i] = r > 0.0 ? d / r / TU_KAPPA_ETA : 0.0;
    }
    if (kappa_loss) *kappa_loss = fabs(l1 - l0) / fabs(l0) / TU_KAPPA_ETA;
    memcpy(g, g0, sizeof(float) * (size_t)P);
    free(g0);
}

/* Row losses l_t = logsumexp(z_t) - z_t[y_t] (fp64 from the fp32 logits) of m's batch
 * into l[N] (0 for ignored rows). */
static inline void tu_row_losses(mt_model *m, const int32_t *tok, const int32_t *lab, int64_t N, int64_t V,
                                 double *l) {
    float *z = malloc(sizeof(float) * (size_t)(N * V));
    cr_assert_eq(mt_model_logits(m, tok, z), MT_OK, "%s", mt_last_error());
    for (int64_t t = 0; t < N; t++) {
        l[t] = 0.0;
        if (lab[t] == MT_IGNORE_LABEL) continue;
        double mx = -INFINITY, se = 0.0;
        for (int64_t v = 0; v < V; v++) mx = fmax(mx, z[t * V + v]);
        for (int64_t v = 0; v < V; v++) se += exp((double)z[t * V + v] - mx);
        l[t] = mx + log(se) - z[t * V + lab[t]];
    }
    free(z);
}

/* delta: a bound on the fp32 forward error of the mean loss of m (CPU backend) over the
 * labelled rows, on the model of tests/test_bounds.h: each row loss l_t is within
 * lambda sqrt(S) u kappa_t |l_t| of exact, kappa_t its condition evaluated here (every
 * parameter times 1 + eta xi: kappa_t |l_t| = |l_t' - l_t| / eta), and the mean within
 * the mean of those, summed without cancellation between rows. */
static inline double tu_loss_delta(mt_model *m, const int32_t *tok, const int32_t *lab, int64_t N, int64_t V,
                                   int64_t S) {
    double *l0 = malloc(sizeof(double) * (size_t)N), *l1 = malloc(sizeof(double) * (size_t)N);
    tu_row_losses(m, tok, lab, N, V, l0);
    float *keep = tu_perturb_params(m, 17);
    tu_row_losses(m, tok, lab, N, V, l1);
    memcpy(mt_model_params(m), keep, sizeof(float) * (size_t)mt_model_numel(m));
    double sum = 0.0;
    int64_t n = 0;
    for (int64_t t = 0; t < N; t++) {
        if (lab[t] == MT_IGNORE_LABEL) continue;
        sum += fabs(l1[t] - l0[t]) / TU_KAPPA_ETA;
        n++;
    }
    free(keep);
    free(l0);
    free(l1);
    return TU_LAMBDA * sqrt((double)S) * TU_U_F32 * sum / (double)n;
}

#endif
