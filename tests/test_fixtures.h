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

/* ------------------------------------------------ model-level error bounds
 *
 * The bound every model-level comparison of two evaluations of the same math is held
 * to (tests/test_decode.c, test_model.c, test_backward_hidden.c, test_gpu_ops.c), so
 * that it is derived once and each test states only its numbers.
 *
 * Error model. u is the unit roundoff of the arithmetic compared (fp32 2^-24, bf16
 * 2^-8). A rounded operation summing n terms (a dot product, a softmax denominator, a
 * norm's sum of squares) returns the exact sum of its terms each perturbed relatively
 * by theta with |theta| <= lambda sqrt(n) u, with probability at least
 * 1 - 2n exp(-lambda^2 (1 - u)^2 / 2), when the roundings are independent and of mean
 * zero (Higham and Mary, "A New Approach to Probabilistic Rounding Error Analysis",
 * SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1), in any summation order: so it holds
 * whatever order a BLAS kernel, a thread count or a block size picks. An elementwise op
 * counts n = 1. Along the dependency chain that ends in a compared value, these
 * relative perturbations add; the chain's term count S = sum of n over the operations
 * on it (tu_chain_terms) bounds them together by lambda sqrt(S) u (the same theorem
 * applied to the chain as one sum; an overcount where the chain is shorter).
 *
 * Condition. How far a relative perturbation of the operations' terms moves the
 * compared value is the condition kappa of the value: the relative change of the
 * value (measured as the comparison measures it, e.g. max |diff| / max |value| of a
 * row) per unit relative perturbation of the terms. Each test evaluates it on its own
 * model, in exact terms of the function and not of rounding: every parameter w is
 * multiplied by (1 + eta xi), xi = +-1 independent, eta = TU_KAPPA_ETA, and kappa =
 * (relative change of the value) / eta. eta = 2^-12 is small enough for the first-order
 * term (kappa moves by under 1% between eta = 2^-10 and 2^-14 on test_decode's models)
 * and large enough that the two evaluations' own rounding (~1e-6 relative) adds under
 * 1% to it. A weight perturbed by eta xi
 * perturbs each product of the GEMMs it enters relatively by eta, as rounding does;
 * the parameter-free operations (scores, softmax, norms) are covered by counting
 * their terms in S.
 *
 * Bound. Each evaluation is within lambda sqrt(S) u kappa of the exact value, two
 * evaluations within twice that of each other: tu_chain_bound. lambda = TU_LAMBDA = 6
 * gives a failure probability below 2 S exp(-18) = 3.1e-8 S per compared value.
 * The bound is a worst case over orders; the measured differences sit far below it
 * (each test says by how much): rounding errors of opposite signs cancel, and most
 * terms are not near the largest. */
#define TU_LAMBDA 6.0
#define TU_KAPPA_ETA 0x1p-12
#define TU_U_F32 0x1p-24
#define TU_U_BF16 0x1p-8

/* Term count S of the longest dependency chain of model c (d_model D, heads H of
 * Dh, kv heads Hk, MLP F, vocabulary V, L layers) over T positions that ends in a
 * logit (backward = 0) or, backward = 1, in a parameter gradient summed over N rows:
 *   forward per layer: input norm D, q/k/v D, QK-norm Dh (if on), RoPE 2, score Dh,
 *     soft-cap 2 (if on), softmax T + 2, P V T, output H Dh, post-attention norm D
 *     (if on), residual 1, norm D, gate / up D, activation 2, down F, post-feedforward
 *     norm D (if on), residual 1;
 *   head: final norm D, logits D, soft-cap 2 (if on);
 *   backward (after the forward): cross-entropy V + 2, dh V, final norm D, per layer
 *     the forward's mirror: down^T D, activation 3, gate / up^T 2F, norm D, residual
 *     1, output^T D, dP Dh, softmax T + 2, dq / dk T, q/k/v^T (H + 2 Hk) Dh, norm D,
 *     residual 1; then the weight gradient's sum over N rows. */
static inline int64_t tu_chain_terms(const mt_model_config *c, int64_t T, int backward, int64_t N) {
    const int64_t D = c->emb_dim, H = c->num_query_heads, Hk = c->num_kv_heads, Dh = c->head_dim;
    const int64_t F = c->mlp_dim, V = c->vocab_size, L = c->num_decoder_layers;
    const int64_t post = (c->use_post_attn_norm ? D : 0) + (c->use_post_ffw_norm ? D : 0);
    const int64_t fwd = D + D + (c->use_qk_norm ? Dh : 0) + 2 + Dh + (c->attn_logits_soft_cap > 0 ? 2 : 0) + T + 2 +
                        T + H * Dh + post + 1 + D + D + 2 + F + 1;
    int64_t S = L * fwd + D + D + (c->final_logits_soft_cap > 0 ? 2 : 0);
    if (backward) {
        const int64_t bwd = D + 3 + 2 * F + D + 1 + D + Dh + T + 2 + T + (H + 2 * Hk) * Dh + D + 1 + post;
        S += V + 2 + V + D + L * bwd + N;
    }
    return S;
}

/* 2 lambda sqrt(S) u kappa: the bound on two evaluations' difference (above). */
static inline double tu_chain_bound(double u, int64_t S, double kappa) {
    return 2.0 * TU_LAMBDA * sqrt((double)S) * u * kappa;
}

/* The parameters of m (host memory: a CPU-backend model) times 1 + eta xi, xi = +-1
 * from Philox stream `seed` (the perturbation of the condition above); *keep gets the
 * old values, to be restored by the caller (memcpy back) and freed. */
static inline float *tu_perturb_params(mt_model *m, uint64_t seed) {
    const int64_t P = mt_model_numel(m);
    float *p = mt_model_params(m), *keep = malloc(sizeof(float) * (size_t)P);
    memcpy(keep, p, sizeof(float) * (size_t)P);
    for (int64_t i = 0; i < P; i++) {
        uint32_t r[4];
        mt_rng_u32x4(seed, 0x4b415050u, (uint64_t)i, r);
        p[i] = (float)(keep[i] * (1.0 + ((r[0] & 1u) ? TU_KAPPA_ETA : -TU_KAPPA_ETA)));
    }
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
static inline void tu_row_losses(mt_model *m, const int32_t *tok, const int32_t *lab, int64_t N, int64_t V, double *l) {
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
 * labelled rows, on the model above:
 * each row loss l_t is within lambda sqrt(S) u kappa_t |l_t| of exact, kappa_t its
 * condition evaluated here (every parameter times 1 + eta xi: kappa_t |l_t| =
 * |l_t' - l_t| / eta), and the mean within the mean of those, summed without
 * cancellation between rows. */
static inline double tu_loss_delta(mt_model *m, const int32_t *tok, const int32_t *lab, int64_t N, int64_t V, int64_t S) {
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
