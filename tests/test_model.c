/* tests/test_model.c: models/config.c and models/model*.c on the CPU backend.
 *
 * - config: published parameter counts, local/global layer patterns, RoPE tables,
 *   validation messages;
 * - plan: lifetimes inside the step, layer entries inside their layer's phases, one
 *   more layer adds exactly one layer's saved activations; and lifetimes are honest:
 *   the packed plan (buffers sharing memory) gives bitwise the results of a plan where
 *   every buffer lives the whole step, with the arena poisoned with NaN;
 * - gradients against central finite differences (llama, gemma, gemma3-style);
 * - bad tokens / labels rejected before any compute;
 * - num_vocab_tiling 1 vs 3, tied and untied.
 * The float64 PyTorch comparison is tests/test_torch_reference.sh. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include "tests/test_ops_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/rng.h"

/* ---------------------------------------------------------------------------- */
/* fixtures                                                                       */

typedef struct fixture {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
    int64_t B, T;
} fixture;

static void fx_init(fixture *f, const mt_model_config *c, int64_t B, int64_t T, int64_t tiles) {
    memset(f, 0, sizeof(*f));
    f->B = B;
    f->T = T;
    mt_backend *be = mt_cpu_backend();
    cr_assert_eq(mt_model_create(&f->m, c, be, B, T, tiles, NULL), MT_OK, "%s", mt_last_error());
    tu_model_plan_bind(f->m, be, &f->plan, &f->arena);
}

static void fx_free(fixture *f) {
    mt_arena_destroy(&f->arena);
    mt_plan_free(f->plan);
    mt_model_free(f->m);
}

/* Parameters that put every nonlinearity off its linear regime: matrices N(0, 0.16^2)
 * (init x 8), norm scales moved by N(0, 0.2^2). */
static void spread_params(mt_model *m, uint64_t seed) {
    cr_assert_eq(mt_model_init_params(m, seed), MT_OK);
    float *p = mt_model_params(m);
    for (int i = 0; i < mt_model_param_count(m); i++) {
        const mt_param_info *pi = mt_model_param(m, i);
        float *w = p + pi->offset;
        if (pi->ndim == 2) {
            for (int64_t j = 0; j < pi->numel; j++) w[j] *= 8.0f;
        } else {
            float *noise = malloc((size_t)pi->numel * sizeof(float));
            mt_rng_fill_normal(noise, (size_t)pi->numel, 0.2f, seed, 5000u + (uint64_t)i);
            for (int64_t j = 0; j < pi->numel; j++) w[j] += noise[j];
            free(noise);
        }
    }
}

static void make_batch(int64_t N, int64_t T, int64_t V, int32_t *tokens, int32_t *labels) {
    for (int64_t n = 0; n < N; n++) {
        uint32_t r[4];
        mt_rng_u32x4(99, 1, (uint64_t)n, r);
        tokens[n] = (int32_t)(r[0] % (uint32_t)V);
        labels[n] = (int32_t)(r[1] % (uint32_t)V);
        if ((n % T) == 1) labels[n] = MT_IGNORE_LABEL;
    }
}

/* The tiny shapes of tests/test_fixtures.h: Llama 3 RoPE, Gemma MQA, and Gemma 3 with
 * Gemma 2's soft-caps switched on too (every optional path). */
static mt_model_config tiny_llama(void) { return tu_tiny_llama3(); }
static mt_model_config tiny_gemma(void) { return tu_tiny_mqa(MT_DECODER_GEMMA, 29, 2); }
static mt_model_config tiny_gemma3(void) { return tu_tiny_gemma3_capped(2); }

/* ---------------------------------------------------------------------------- */
/* config                                                                         */

Test(config, published_parameter_counts) {
    /* Hugging Face model cards / safetensors totals (independent of this code). */
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_LLAMA2);
    c.vocab_size = 32000; c.emb_dim = 4096; c.num_query_heads = 32; c.num_kv_heads = 32;
    c.head_dim = 128; c.mlp_dim = 11008; c.num_decoder_layers = 32;
    cr_expect_eq(mt_model_num_parameters(&c), 6738415616LL, "llama2-7b");
    c.vocab_size = 128256; c.num_kv_heads = 8; c.mlp_dim = 14336;
    cr_expect_eq(mt_model_num_parameters(&c), 8030261248LL, "llama3.1-8b");
    mt_model_config_defaults(&c, MT_DECODER_GEMMA);
    c.vocab_size = 256000; c.emb_dim = 2048; c.num_query_heads = 8; c.num_kv_heads = 1;
    c.head_dim = 256; c.mlp_dim = 16384; c.num_decoder_layers = 18;
    cr_expect_eq(mt_model_num_parameters(&c), 2506172416LL, "gemma-2b");
    mt_model_config_defaults(&c, MT_DECODER_GEMMA2);
    c.vocab_size = 256000; c.emb_dim = 2304; c.num_query_heads = 8; c.num_kv_heads = 4;
    c.head_dim = 256; c.mlp_dim = 9216; c.num_decoder_layers = 26;
    cr_expect_eq(mt_model_num_parameters(&c), 2614341888LL, "gemma-2-2b");
}

Test(config, local_global_patterns) {
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_GEMMA2);
    for (int l = 0; l < 6; l++) cr_expect_eq(mt_model_layer_is_local(&c, l), l % 2 == 0, "gemma2 layer %d", l);
    mt_model_config_defaults(&c, MT_DECODER_GEMMA3);
    for (int l = 0; l < 12; l++)
        cr_expect_eq(mt_model_layer_is_local(&c, l), l != 5 && l != 11, "gemma3 layer %d", l);
    c.sliding_window_pattern = 0; /* gemma3 block, no pattern: all global */
    cr_expect_eq(mt_model_layer_is_local(&c, 0), 0);
    mt_model_config_defaults(&c, MT_DECODER_LLAMA2);
    cr_expect_eq(mt_model_layer_is_local(&c, 0), 0);
    c.sliding_window_size = 16; /* a window on a llama block, no pattern: all local */
    cr_expect_eq(mt_model_layer_is_local(&c, 0), 1);
    cr_expect_eq(mt_model_layer_is_local(&c, 7), 1);
}

Test(config, rope_tables) {
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_LLAMA2);
    c.head_dim = 128;
    c.rope_max_timescale = 500000.0f;
    float f[64];
    mt_rope_inv_freq(&c, 0, f);
    /* Bounds: mt_rope_inv_freq computes each frequency in fp64 and rounds it once to
     * fp32. Where the test's own fp64 expression is the same value up to a few fp64
     * roundings (pow vs 1 / pow), the two fp32 roundings agree unless a rounding
     * boundary lies between them: one fp32 ulp, at most 2^-23 of the value. Where the
     * expressions are the same, or differ by an exact scaling by 8, the results are
     * bitwise equal (tolerance 0). */
    const float ulp = 0x1p-23f;
    /* default: base^(-2i/Dh); base^0 = 1 exactly */
    cr_expect_eq(f[0], 1.0f);
    cr_expect_float_eq(f[32], (float)pow(500000.0, -0.5), ulp * f[32]);
    /* llama3.1 (transformers modeling_rope_utils.py _compute_llama3_parameters): wavelength < 8192/4 kept, > 8192 divided by 8 */
    c.rope_type = MT_ROPE_LLAMA3;
    float g[64];
    mt_rope_inv_freq(&c, 0, g);
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < 64; i++) {
        double wl = 2.0 * 3.14159265358979323846 / f[i];
        if (wl < 2048.0) {
            cr_expect_eq(g[i], f[i], "i=%d", i); /* the same fp64 value, rounded once */
            kept++;
        } else if (wl > 8192.0) {
            cr_expect_eq(g[i], f[i] / 8.0f, "i=%d", i); /* / 8 is exact in fp64 and fp32 */
            divided++;
        } else {
            /* The blend e = (1 - s) f / 8 + s f, s = (8192 / wl - 1) / 3, from the fp32
             * f[i] (within 2^-24 of the fp64 f the code uses): s = (8192 f / 2 pi - 1) / 3
             * moves by (3s + 1) / 3 2^-24 <= (4/3) 2^-24, e by f 7/8 that (e >= f / 8:
             * 7 (4/3) 2^-24 relative) plus f's own 2^-24, plus each side's final rounding
             * 2^-24: within 12 x 2^-24 = 6 x 2^-23 of e. */
            double sb = (8192.0 / wl - 1.0) / 3.0;
            double e = (1.0 - sb) * f[i] / 8.0 + sb * f[i];
            cr_expect_float_eq(g[i], (float)e, 6.0f * ulp * (float)e, "i=%d", i);
            blended++;
        }
    }
    cr_expect(kept > 0 && divided > 0 && blended > 0);
    /* gemma3: local layers use the local base without scaling, global the scaled one */
    mt_model_config_defaults(&c, MT_DECODER_GEMMA3);
    c.head_dim = 16;
    mt_rope_inv_freq(&c, 0, f); /* local */
    mt_rope_inv_freq(&c, 5, g); /* global */
    cr_expect_float_eq(f[1], (float)pow(10000.0, -2.0 / 16.0), ulp * f[1]);
    cr_expect_float_eq(g[1], (float)(pow(1e6, -2.0 / 16.0) / 8.0), ulp * g[1]);
    /* attention and embedding scales: 1 / sqrt in fp64, rounded once; 1/16 is exact,
     * 1/12 one fp32 ulp at most from 1.0f / 12.0f (two roundings against one) */
    mt_model_config_defaults(&c, MT_DECODER_GEMMA);
    c.head_dim = 256;
    c.emb_dim = 2048;
    cr_expect_eq(mt_model_attn_scale(&c), 1.0f / 16.0f);
    cr_expect_eq(mt_model_embedding_scale(&c), (float)sqrt(2048.0));
    c.query_pre_attn_scalar = 144.0f;
    cr_expect_float_eq(mt_model_attn_scale(&c), 1.0f / 12.0f, ulp / 12.0f);
}

Test(config, validation_names_the_key) {
    mt_model_config c = tiny_llama();
    cr_expect_eq(mt_model_config_validate(&c), MT_OK);
    c.num_kv_heads = 3;
    cr_expect_eq(mt_model_config_validate(&c), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "base_num_kv_heads=3") != NULL, "%s", mt_last_error());
    c = tiny_llama();
    c.head_dim = 7;
    cr_expect_eq(mt_model_config_validate(&c), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "head_dim=7") != NULL, "%s", mt_last_error());
    c = tiny_llama();
    c.vocab_size = 0;
    cr_expect_eq(mt_model_config_validate(&c), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "vocab_size=0") != NULL, "%s", mt_last_error());
    mt_decoder_block b;
    cr_expect_eq(mt_decoder_block_parse("gemma3", &b), MT_OK);
    cr_expect_eq(b, MT_DECODER_GEMMA3);
    cr_expect_eq(mt_decoder_block_parse("gpt2", &b), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "decoder_block=gpt2") != NULL);
}

/* ---------------------------------------------------------------------------- */
/* plan                                                                           */

static size_t layer_entry_bytes(const mt_plan *p, int64_t l, mt_mem_category cat) {
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "layers.%lld.", (long long)l);
    size_t s = 0;
    for (int i = 0; i < mt_plan_count(p); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        if (e->category == cat && strncmp(e->name, prefix, strlen(prefix)) == 0) s += e->bytes;
    }
    return s;
}

static void check_plan(const mt_model_config *c, int64_t B, int64_t T, size_t expect_layer_bytes) {
    fixture f;
    fx_init(&f, c, B, T, 2);
    const int64_t L = c->num_decoder_layers;
    const int P = mt_model_phase_count(f.m);
    cr_assert_eq(P, 2 * L + 4);
    cr_expect_eq(mt_model_numel(f.m), mt_model_num_parameters(c));
    for (int i = 0; i < mt_plan_count(f.plan); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(f.plan, i);
        cr_expect(e->first >= 0 && e->first <= e->last && e->last < P, "%s [%d, %d]", e->name, e->first, e->last);
        long long l;
        if (sscanf(e->name, "layers.%lld.", &l) == 1) {
            /* written by the embedding / previous layer or the layer's forward, read last
             * by its backward */
            cr_expect(e->first == l || e->first == 1 + l, "%s first %d", e->name, e->first);
            cr_expect_eq(e->last, (int)(2 * L + 1 - l), "%s last %d", e->name, e->last);
            cr_expect_eq(e->category, MT_MEM_ACTIVATIONS, "%s", e->name);
        }
        if (strstr(e->name, "query_proj") || strstr(e->name, "mlpwi_0"))
            cr_expect(strncmp(e->name, "layers.", 7) == 0);
    }
    const int tile = mt_plan_find(f.plan, "loss_tile");
    cr_assert(tile >= 0);
    cr_expect_eq(mt_plan_entry_get(f.plan, tile)->category, MT_MEM_LOSS_TILE);
    cr_expect_eq(mt_plan_entry_get(f.plan, tile)->bytes, (size_t)((B * T + 1) / 2 * c->vocab_size) * sizeof(float));
    cr_expect(mt_plan_find(f.plan, "layers.0.query_proj") >= 0);
    cr_expect(mt_plan_find(f.plan, "layers.1.mlpwi_1") >= 0);
    size_t one = layer_entry_bytes(f.plan, 0, MT_MEM_ACTIVATIONS);
    cr_expect_eq(one, expect_layer_bytes, "layer bytes %zu, expected %zu", one, expect_layer_bytes);
    size_t tot[MT_MEM_CATEGORY_COUNT];
    mt_plan_total_by_category(f.plan, tot);

    mt_model_config c2 = *c;
    c2.num_decoder_layers = L + 1;
    fixture g;
    fx_init(&g, &c2, B, T, 2);
    size_t tot2[MT_MEM_CATEGORY_COUNT];
    mt_plan_total_by_category(g.plan, tot2);
    cr_expect_eq(tot2[MT_MEM_ACTIVATIONS] - tot[MT_MEM_ACTIVATIONS], expect_layer_bytes);
    cr_expect_eq(layer_entry_bytes(g.plan, L, MT_MEM_ACTIVATIONS), expect_layer_bytes);
    fx_free(&g);
    fx_free(&f);
}

Test(plan, lifetimes_and_layer_bytes) {
    const int64_t B = 2, T = 5, N = B * T;
    mt_model_config c = tiny_llama();
    const int64_t D = c.emb_dim, QD = c.num_query_heads * c.head_dim, KVD = c.num_kv_heads * c.head_dim;
    const int64_t F = c.mlp_dim, H = c.num_query_heads;
    /* saved per layer: input, q, k, v, context, out_proj [N, D or heads]; logsumexp
     * [B, H, T]; gate and up [N, F]; two norm rstd [N] */
    size_t llama = sizeof(float) * (size_t)(N * D + N * QD + 2 * N * KVD + N * QD + B * H * T + N * D + 2 * N * F + 2 * N);
    check_plan(&c, B, T, llama);
    /* gemma3 adds the q/k-norm rstd, the post-attention and post-FFW norm rstd and mlpwo */
    c = tiny_gemma3();
    const int64_t QD3 = c.num_query_heads * c.head_dim, KVD3 = c.num_kv_heads * c.head_dim;
    const int64_t Hk3 = c.num_kv_heads, H3 = c.num_query_heads;
    size_t g3 = sizeof(float) * (size_t)(N * c.emb_dim + N * QD3 + 2 * N * KVD3 + N * QD3 + B * H3 * T +
                                         N * c.emb_dim + 2 * N * c.mlp_dim + N * c.emb_dim + 4 * N + N * H3 +
                                         N * Hk3);
    check_plan(&c, B, T, g3);
}

/* Run forward_backward; returns the mean loss, grads in the model. */
static double run_step(mt_model *m, const int32_t *tok, const int32_t *lab) {
    double ls;
    int64_t cnt;
    cr_assert_eq(mt_model_loss(m, tok, lab, &ls, &cnt), MT_OK, "%s", mt_last_error());
    cr_assert(cnt > 0);
    memset(mt_model_grads(m), 0, (size_t)mt_model_numel(m) * sizeof(float));
    double ls2;
    int64_t cnt2;
    cr_assert_eq(mt_model_forward_backward(m, tok, lab, (float)(1.0 / (double)cnt), &ls2, &cnt2), MT_OK, "%s",
                 mt_last_error());
    cr_assert_eq(cnt2, cnt);
    cr_assert_eq(ls2, ls, "forward_backward and loss disagree: %.17g vs %.17g", ls2, ls);
    return ls / (double)cnt;
}

static void poison(mt_arena *a) {
    float *p = a->base;
    size_t n = a->bytes / sizeof(float);
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}

static void check_honest_lifetimes(const mt_model_config *c) {
    const int64_t B = 2, T = 6, N = B * T;
    fixture f;
    fx_init(&f, c, B, T, 3);
    spread_params(f.m, 7);
    const int64_t numel = mt_model_numel(f.m);
    float *params = malloc((size_t)numel * sizeof(float));
    memcpy(params, mt_model_params(f.m), (size_t)numel * sizeof(float));
    int32_t tok[64], lab[64];
    make_batch(N, T, c->vocab_size, tok, lab);

    /* the same entries in the same order (so the same ids), each live the whole step */
    mt_plan *flat;
    cr_assert_eq(mt_plan_new(&flat), MT_OK);
    const int P = mt_model_phase_count(f.m);
    for (int i = 0; i < mt_plan_count(f.plan); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(f.plan, i);
        cr_assert_eq(mt_plan_add(flat, e->name, e->category, e->bytes, 0, P - 1, NULL), MT_OK);
    }
    cr_assert_eq(mt_plan_finalize(flat), MT_OK);
    cr_assert(mt_plan_peak(flat) > mt_plan_peak(f.plan), "packing shares nothing: test would be vacuous");

    float *out[2];
    double loss[2];
    float *logits[2];
    for (int k = 0; k < 2; k++) {
        mt_arena arena;
        const mt_plan *pl = k == 0 ? f.plan : flat;
        cr_assert_eq(mt_arena_create(&arena, pl, NULL, NULL, NULL), MT_OK);
        poison(&arena);
        cr_assert_eq(mt_model_bind(f.m, &arena, pl), MT_OK, "%s", mt_last_error());
        memcpy(mt_model_params(f.m), params, (size_t)numel * sizeof(float));
        loss[k] = run_step(f.m, tok, lab);
        out[k] = malloc((size_t)numel * sizeof(float));
        memcpy(out[k], mt_model_grads(f.m), (size_t)numel * sizeof(float));
        logits[k] = malloc((size_t)(N * c->vocab_size) * sizeof(float));
        cr_assert_eq(mt_model_logits(f.m, tok, logits[k]), MT_OK);
        mt_arena_destroy(&arena);
    }
    cr_expect(isfinite(loss[0]));
    cr_expect_eq(loss[0], loss[1]);
    cr_expect_eq(memcmp(out[0], out[1], (size_t)numel * sizeof(float)), 0, "grads differ between layouts");
    cr_expect_eq(memcmp(logits[0], logits[1], (size_t)(N * c->vocab_size) * sizeof(float)), 0);
    for (int64_t i = 0; i < numel; i++) cr_assert(isfinite(out[0][i]), "grad %lld not finite", (long long)i);
    for (int k = 0; k < 2; k++) {
        free(out[k]);
        free(logits[k]);
    }
    free(params);
    mt_plan_free(flat);
    /* the model now points into a released arena; only the fixture is freed below */
    fx_free(&f);
}

Test(plan, honest_lifetimes_llama) {
    mt_model_config c = tiny_llama();
    check_honest_lifetimes(&c);
}

Test(plan, honest_lifetimes_gemma3) {
    mt_model_config c = tiny_gemma3();
    check_honest_lifetimes(&c);
}

/* ---------------------------------------------------------------------------- */
/* finite differences                                                             */

/* Mean loss of m on the batch (fp64 sum of fp32 row losses over the counted rows). */
static double mean_loss(mt_model *m, const int32_t *tok, const int32_t *lab) {
    double l;
    int64_t cnt;
    cr_assert_eq(mt_model_loss(m, tok, lab, &l, &cnt), MT_OK, "%s", mt_last_error());
    return l / (double)cnt;
}

/* Central difference (L(w + h) - L(w - h)) / (w + h - (w - h)) of the mean loss along
 * parameter j, with the step the fp32 parameters actually take (within ulp(w) of 2h;
 * the midpoint moves by at most ulp(w) / 2 = 2^-24 |w|, which changes the derivative by
 * |L''| 2^-24 |w|: negligible). */
static double central(mt_model *m, int64_t j, float h, const int32_t *tok, const int32_t *lab) {
    float *p = mt_model_params(m);
    const float w0 = p[j], wp = w0 + h, wm = w0 - h;
    p[j] = wp;
    const double lp = mean_loss(m, tok, lab);
    p[j] = wm;
    const double lm = mean_loss(m, tok, lab);
    p[j] = w0;
    return (lp - lm) / ((double)wp - (double)wm);
}

/* For each listed tensor, the coordinate with the largest |gradient| g is checked
 * against Richardson's extrapolation of central differences of the mean loss L:
 *   D(h) = (L(w + h) - L(w - h)) / 2h = g + c2 h^2 + c4 h^4 + ...,
 *   R(h) = (4 D(h) - D(2h)) / 3 = g - 4 c4 h^4 + O(h^6),
 * so |R(h) - g| <= trunc + round with
 *   trunc = 2 |R(h) - R(2h)| / 15: R(2h) - R(h) = -60 c4 h^4 + O(h^6) estimates the h^4
 *     term (Richardson's error estimate); the 2 covers an h^6 remainder up to half of it;
 *   round = 2 delta / h: each loss evaluation is within delta of the exact loss, so
 *     D(h) within delta / h, R(h) within (4 delta / h + delta / 2h) / 3 = 1.5 delta / h,
 *     and the estimate trunc carries 2/15 (1.5 + 0.75) delta / h = 0.3 delta / h more;
 *   delta = the fp32 forward error of the mean loss (tu_loss_delta: each row loss within
 *     lambda sqrt(S) u kappa_t |l_t|, tests/test_fixtures.h, S = tu_chain_terms to the
 *     logits plus the cross-entropy's V + 2 terms, kappa_t evaluated here): 2e-6 to 4e-6
 *     of L on these models.
 * The step balances the two: trunc grows as h^4 and round falls as 1 / h. At h =
 * FD_STEP = 2^-5 round is 5e-4 to 9e-4 and trunc up to 3e-4 (the embedding rows, whose
 * h^4 coefficient is largest); at 2^-7 round grows 4x, to 11% of the smallest |g|; at
 * 2^-3 the h^6 remainder is no longer small (trunc underestimates the error, up to 2x).
 * The bound is 0.07% to 2.7% of |g| here (a bound over 5% of |g| fails the test: it
 * could not tell a missing term); the measured |R - g| is at most 0.1 of the bound
 * (embedding rows; most below 0.01). A backward off by 10% fails every coordinate
 * (FD_PLANT=0.1 scales the analytic g by 1.1). Old bound: 1e-4 + 5e-3 |g| with
 * one step of 1e-2, from observed errors. */
#ifndef FD_STEP
#define FD_STEP 0x1p-5f
#endif
#ifndef FD_PLANT
#define FD_PLANT 0.0
#endif
static void check_fd(const mt_model_config *c, const char *const *names, int nnames) {
    const int64_t B = 2, T = 6, N = B * T;
    fixture f;
    fx_init(&f, c, B, T, 2);
    spread_params(f.m, 11);
    int32_t tok[64], lab[64];
    make_batch(N, T, c->vocab_size, tok, lab);
    run_step(f.m, tok, lab);
    const int64_t numel = mt_model_numel(f.m);
    float *g = malloc((size_t)numel * sizeof(float));
    memcpy(g, mt_model_grads(f.m), (size_t)numel * sizeof(float));
    const int64_t S = tu_chain_terms(c, T, 0, 0) + c->vocab_size + 2;
    const double L = mean_loss(f.m, tok, lab), delta = tu_loss_delta(f.m, tok, lab, N, c->vocab_size, S);
    const float h = FD_STEP;
    for (int k = 0; k < nnames; k++) {
        int idx = mt_model_param_find(f.m, names[k]);
        cr_assert(idx >= 0, "no parameter %s", names[k]);
        const mt_param_info *pi = mt_model_param(f.m, idx);
        int64_t best = pi->offset;
        for (int64_t j = pi->offset; j < pi->offset + pi->numel; j++)
            if (fabsf(g[j]) > fabsf(g[best])) best = j;
        const double d1 = central(f.m, best, h, tok, lab), d2 = central(f.m, best, 2 * h, tok, lab);
        const double d4 = central(f.m, best, 4 * h, tok, lab);
        const double r1 = (4 * d1 - d2) / 3, r2 = (4 * d2 - d4) / 3;
        const double trunc = 2 * fabs(r1 - r2) / 15, round = 2 * delta / h, bound = trunc + round;
        const double an = g[best] * (1.0 + FD_PLANT);
        cr_log_info("%s[%lld]: analytic %.6g, Richardson %.6g, |diff| %.2e, bound %.2e (trunc %.1e, round %.1e): "
                    "ratio %.3f, bound/|g| %.4f",
                    names[k], (long long)(best - pi->offset), an, r1, fabs(r1 - an), bound, trunc, round,
                    fabs(r1 - an) / bound, bound / fabs(an));
        cr_expect(fabs(r1 - an) <= bound, "%s[%lld]: analytic %.6g, Richardson %.6g, bound %.2e", names[k],
                  (long long)(best - pi->offset), an, r1, bound);
        cr_expect(bound <= 0.05 * fabs(an), "%s: bound %.2e is over 5%% of |g| %.3g: the check could miss a term",
                  names[k], bound, an);
    }
    cr_log_info("L %.6g, S %lld, delta %.3g (%.2g of L)", L, (long long)S, delta, delta / L);
    free(g);
    fx_free(&f);
}

Test(gradients, finite_differences_llama) {
    static const char *const names[] = {
        "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.norm.weight",
        "lm_head.weight"};
    mt_model_config c = tiny_llama();
    check_fd(&c, names, (int)(sizeof(names) / sizeof(names[0])));
}

Test(gradients, finite_differences_gemma) {
    static const char *const names[] = {
        "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
        "model.layers.1.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight"};
    mt_model_config c = tiny_gemma();
    check_fd(&c, names, (int)(sizeof(names) / sizeof(names[0])));
}

Test(gradients, finite_differences_gemma3) {
    static const char *const names[] = {
        "model.embed_tokens.weight", "model.layers.0.self_attn.q_norm.weight",
        "model.layers.0.self_attn.k_norm.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.self_attn.k_proj.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.1.pre_feedforward_layernorm.weight", "model.layers.0.post_feedforward_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight", "model.norm.weight"};
    mt_model_config c = tiny_gemma3();
    check_fd(&c, names, (int)(sizeof(names) / sizeof(names[0])));
}

/* ---------------------------------------------------------------------------- */
/* input validation                                                               */

Test(inputs, out_of_range_tokens_and_labels) {
    mt_model_config c = tiny_llama();
    fixture f;
    fx_init(&f, &c, 2, 4, 1);
    spread_params(f.m, 3);
    int32_t tok[8], lab[8];
    make_batch(8, 4, c.vocab_size, tok, lab);
    float *g = mt_model_grads(f.m);
    memset(g, 0, (size_t)mt_model_numel(f.m) * sizeof(float));
    double ls = -1.0;
    int64_t cnt = -1;

    tok[5] = (int32_t)c.vocab_size;
    cr_expect_eq(mt_model_forward_backward(f.m, tok, lab, 1.0f, &ls, &cnt), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "tokens[5]=37") != NULL, "%s", mt_last_error());
    tok[5] = -1;
    cr_expect_eq(mt_model_loss(f.m, tok, lab, &ls, &cnt), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "tokens[5]=-1") != NULL, "%s", mt_last_error());
    float logits[8 * 37];
    cr_expect_eq(mt_model_logits(f.m, tok, logits), MT_ERR_INVALID);
    tok[5] = 0;
    lab[2] = -2;
    cr_expect_eq(mt_model_forward_backward(f.m, tok, lab, 1.0f, &ls, &cnt), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "labels[2]=-2") != NULL, "%s", mt_last_error());
    lab[2] = 40;
    cr_expect_eq(mt_model_forward_backward(f.m, tok, lab, 1.0f, &ls, &cnt), MT_ERR_INVALID);
    /* rejected before any compute: gradients untouched, outputs untouched */
    for (int64_t i = 0; i < mt_model_numel(f.m); i++) cr_assert_eq(g[i], 0.0f);
    cr_expect_eq(ls, -1.0);
    cr_expect_eq(cnt, -1);
    lab[2] = MT_IGNORE_LABEL;
    cr_expect_eq(mt_model_forward_backward(f.m, tok, lab, 1.0f, &ls, &cnt), MT_OK, "%s", mt_last_error());

    mt_model *m2;
    cr_expect_eq(mt_model_create(&m2, &c, mt_cpu_backend(), 2, 4, 9, NULL), MT_ERR_INVALID);
    cr_expect_eq(mt_model_create(&m2, &c, mt_cpu_backend(), 0, 4, 1, NULL), MT_ERR_INVALID);
    fx_free(&f);
}

/* ---------------------------------------------------------------------------- */
/* vocab tiling                                                                   */

/* num_vocab_tiling 1 and 3 must agree. The forward up to the final hidden state is the
 * same code on the same values (bitwise); the tiles change the shapes of the logits
 * GEMM (R = 4, 5, 5 rows or 14), of dh = dz W and of dW (one GEMM over all rows or
 * three accumulated), whose kernels and summation orders a BLAS may pick by shape; the
 * differences then run through the whole backward. Each is held to the model-level
 * bound of tests/test_fixtures.h, 2 lambda sqrt(S) u kappa (u = 2^-24):
 *   logits: S = D (the GEMM) + 2 (the soft-cap); kappa the row's condition (every
 *     parameter times 1 + eta xi), max |z - z'| / max |z| per row: bound 4e-6 to 1e-5;
 *   loss: twice the mean row loss's fp32 error delta (tu_loss_delta, as check_fd): 3e-6
 *     to 7e-6 relative;
 *   each gradient tensor (max |a - b| / max |b|): S = tu_chain_terms(c, T, 1, N),
 *     kappa per tensor (tu_grad_kappa, 1.9 to 15): bound 4e-5 to 3.3e-4.
 * Measured here: the logits, the loss and most gradients bitwise equal; the unembedding
 * (lm_head, or the tied embedding) 3e-8 to 5e-8 (ratio < 1e-3 to the bound); printed
 * with --verbose. An element off by 4x its tensor's bound fails every tensor
 * (TILING_PLANT=4). Old bound: 1e-6 relative, from "float32 roundoff (~1e-7 relative)
 * is all that may separate them". */
#ifndef TILING_PLANT
#define TILING_PLANT 0.0
#endif
static void check_tiling(const mt_model_config *c) {
    const int64_t B = 2, T = 7, N = B * T, V = c->vocab_size; /* 14 rows: tiles of 4, 5, 5 */
    int32_t tok[64], lab[64];
    make_batch(N, T, V, tok, lab);
    fixture f1, f3;
    fx_init(&f1, c, B, T, 1);
    fx_init(&f3, c, B, T, 3);
    spread_params(f1.m, 5);
    spread_params(f3.m, 5);
    double l1 = run_step(f1.m, tok, lab), l3 = run_step(f3.m, tok, lab);
    const int64_t S_loss = tu_chain_terms(c, T, 0, 0) + V + 2, S_grad = tu_chain_terms(c, T, 1, N);
    const double lbound = 2.0 * tu_loss_delta(f1.m, tok, lab, N, V, S_loss) / fabs(l1);
    cr_expect(fabs(l1 - l3) <= lbound * fabs(l1), "loss %.9g vs %.9g, bound %.3g relative", l1, l3, lbound);
    cr_log_info("loss: relative difference %.3g, bound %.3g", fabs(l1 - l3) / fabs(l1), lbound);
    const int np = mt_model_param_count(f1.m);
    double *kappa = malloc(sizeof(double) * (size_t)np);
    int64_t cnt = 0;
    for (int64_t i = 0; i < N; i++) cnt += lab[i] != MT_IGNORE_LABEL;
    float *g1 = mt_model_grads(f1.m);
    const float *g3 = mt_model_grads(f3.m);
    tu_grad_kappa(f1.m, tok, lab, (float)(1.0 / (double)cnt), kappa, NULL); /* g1 restored */
    for (int i = 0; i < np; i++) {
        const mt_param_info *pi = mt_model_param(f1.m, i);
        const double bound = tu_chain_bound(TU_U_F32, S_grad, kappa[i]);
        double dmax = 0.0, gmax = 0.0;
        for (int64_t j = pi->offset; j < pi->offset + pi->numel; j++) gmax = fmax(gmax, fabs((double)g1[j]));
        if (TILING_PLANT != 0.0) g1[pi->offset] += (float)(TILING_PLANT * bound * gmax);
        for (int64_t j = pi->offset; j < pi->offset + pi->numel; j++) dmax = fmax(dmax, fabs((double)g1[j] - g3[j]));
        cr_expect(gmax > 0.0, "%s: zero gradient", pi->name);
        cr_expect(dmax <= bound * gmax, "%s: max diff %g, max |g| %g, bound %.3g relative", pi->name, dmax, gmax,
                  bound);
        cr_log_info("%s: relative difference %.3g, bound %.3g (kappa %.3g)", pi->name, dmax / gmax, bound, kappa[i]);
    }
    free(kappa);
    float *z1 = malloc((size_t)(N * V) * sizeof(float));
    float *z3 = malloc((size_t)(N * V) * sizeof(float));
    float *zp = malloc((size_t)(N * V) * sizeof(float));
    cr_assert_eq(mt_model_logits(f1.m, tok, z1), MT_OK);
    cr_assert_eq(mt_model_logits(f3.m, tok, z3), MT_OK);
    float *keep = tu_perturb_params(f1.m, 31);
    cr_assert_eq(mt_model_logits(f1.m, tok, zp), MT_OK);
    memcpy(mt_model_params(f1.m), keep, sizeof(float) * (size_t)mt_model_numel(f1.m));
    free(keep);
    for (int64_t t = 0; t < N; t++) {
        double d = 0.0, dp = 0.0, r = 0.0;
        for (int64_t v = 0; v < V; v++) {
            d = fmax(d, fabs((double)z1[t * V + v] - z3[t * V + v]));
            dp = fmax(dp, fabs((double)zp[t * V + v] - z1[t * V + v]));
            r = fmax(r, fabs((double)z1[t * V + v]));
        }
        const double bound = tu_chain_bound(TU_U_F32, c->emb_dim + 2, dp / r / TU_KAPPA_ETA);
        cr_expect(d <= bound * r, "row %lld: logits differ by %.3g of the row's max, bound %.3g", (long long)t, d / r,
                  bound);
        if (t == 0) cr_log_info("logits row 0: relative difference %.3g, bound %.3g", d / r, bound);
    }
    free(z1);
    free(z3);
    free(zp);
    fx_free(&f1);
    fx_free(&f3);
}

Test(tiling, one_vs_three_untied) {
    mt_model_config c = tiny_llama();
    check_tiling(&c);
}

Test(tiling, one_vs_three_tied) {
    mt_model_config c = tiny_gemma3();
    check_tiling(&c);
}

/* Vocabulary chunks (models/model.h num_vocab_chunks, layout vocab_chunks): logits taken
 * a chunk of unembedding rows at a time against the whole unembedding at once, the same
 * parameters. Each logit is the dot product of a final hidden row h (fp32) and an
 * unembedding row w over D terms, a GEMM element either way (only the GEMM's column
 * count differs), so each is within gamma_D sum_d |h_d w_d| of the exact product (Higham
 * eq. 3.5) and the two within twice that; soft-capping (gemma3 has none) is the same
 * elementwise map of both. Untied and tied, C = 4 of V. */
static void check_chunk_logits(const mt_model_config *c) {
    const int64_t B = 2, T = 7, N = B * T, V = c->vocab_size, D = c->emb_dim;
    int32_t tok[64], lab[64];
    make_batch(N, T, V, tok, lab);
    fixture f1, f4;
    fx_init(&f1, c, B, T, 3);
    memset(&f4, 0, sizeof f4);
    f4.B = B, f4.T = T;
    const mt_model_layout lay = {.vocab_chunks = 4};
    mt_backend *be = mt_cpu_backend();
    cr_assert_eq(mt_model_create(&f4.m, c, be, B, T, 3, &lay), MT_OK, "%s", mt_last_error());
    tu_model_plan_bind(f4.m, be, &f4.plan, &f4.arena);
    int64_t tiles = 0, chunks = 0;
    mt_model_vocab_tiling(f4.m, &tiles, &chunks);
    cr_assert_eq(chunks, 4, "num_vocab_chunks 4 resolved to %lld", (long long)chunks);
    spread_params(f1.m, 5);
    memcpy(mt_model_params(f4.m), mt_model_params(f1.m), (size_t)mt_model_numel(f1.m) * sizeof(float));
    float *z1 = malloc((size_t)(N * V) * sizeof(float)), *z4 = malloc((size_t)(N * V) * sizeof(float));
    float *h = malloc((size_t)(N * D) * sizeof(float));
    cr_assert_eq(mt_model_hidden(f1.m, tok, h), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_logits(f1.m, tok, z1), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_logits(f4.m, tok, z4), MT_OK, "%s", mt_last_error());
    const float *W = NULL;
    for (int i = 0; i < mt_model_param_count(f1.m); i++) {
        const mt_param_info *pi = mt_model_param(f1.m, i);
        if (!strcmp(pi->name, "lm_head.weight") || (!W && !strcmp(pi->name, "model.embed_tokens.weight")))
            W = mt_model_params(f1.m) + pi->offset;
    }
    cr_assert_not_null(W);
    double worst = 0.0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t v = 0; v < V; v++) {
            double s = 0.0;
            for (int64_t d = 0; d < D; d++) s += fabs((double)h[n * D + d] * W[v * D + d]);
            const double b = 2.0 * GAMMA(D) * s + 0x1p-149, e = fabs((double)z1[n * V + v] - z4[n * V + v]) / b;
            worst = e > worst ? e : worst;
        }
    cr_expect(worst <= 1.0, "logits in 4 chunks vs whole: worst error / bound %.3g", worst);
    free(z1), free(z4), free(h);
    fx_free(&f1);
    fx_free(&f4);
}

Test(vocab_chunks, logits_untied) {
    mt_model_config c = tiny_llama();
    check_chunk_logits(&c);
}

Test(vocab_chunks, logits_tied) {
    mt_model_config c = tiny_gemma3();
    check_chunk_logits(&c);
}
