/* tests/test_decode.c: incremental decoding with a KV cache (mt_model_decode_step,
 * models/model.h) against the full forward (mt_model_logits) on the CPU backend.
 *
 * - logits: for tiny llama3 / gemma / gemma2 / gemma3 configs (every optional path:
 *   llama3 RoPE scaling, tied embedding, Gemma 2 soft-caps and post-norms, sliding
 *   windows shorter than the sequence on local layers, Gemma 3 QK-norm and its local
 *   RoPE table), the decode model's logits at every position against row t of
 *   mt_model_logits on the whole sequence, same parameters;
 * - greedy sampling: the tokens of the pre-KV-cache sampling loop (a batch-1 model of
 *   n + 1 positions, the whole sequence recomputed by mt_model_logits for each token,
 *   argmax by mt_sample_pick) equal those of the decode loop, for 40 tokens;
 * - reset gives bitwise the same logits again; plan entries and byte counts; errors
 *   (full cache, bad token, training calls on a decode model, batch > 1). */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "train/sample.h"

typedef struct fixture {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
} fixture;

static void fx_init(fixture *f, const mt_model_config *c, int64_t T, int decode) {
    memset(f, 0, sizeof(*f));
    mt_backend *be = mt_cpu_backend();
    cr_assert_eq(mt_model_create(&f->m, c, be, 1, T, 1, NULL), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_set_decode(f->m, decode), MT_OK, "%s", mt_last_error());
    tu_model_plan_bind(f->m, be, &f->plan, &f->arena);
}

static void fx_free(fixture *f) {
    mt_arena_destroy(&f->arena);
    mt_plan_free(f->plan);
    mt_model_free(f->m);
}

/* Parameters off the linear regime of every nonlinearity (as tests/test_model.c):
 * matrices N(0, 0.16^2), norm scales moved by N(0, 0.2^2). Written into `m`, then
 * copied bitwise into `copy` (CPU backend: host memory). */
static void spread_params(mt_model *m, mt_model *copy, uint64_t seed) {
    cr_assert_eq(mt_model_init_params(m, seed), MT_OK);
    float *p = mt_model_params(m);
    for (int i = 0; i < mt_model_param_count(m); i++) {
        const mt_param_info *pi = mt_model_param(m, i);
        float *w = p + pi->offset;
        float *noise = malloc((size_t)pi->numel * sizeof(float));
        mt_rng_fill_normal(noise, (size_t)pi->numel, 0.2f, seed, 5000u + (uint64_t)i);
        for (int64_t j = 0; j < pi->numel; j++) w[j] = pi->ndim == 2 ? w[j] * 8.0f : w[j] + noise[j];
        free(noise);
    }
    cr_assert_eq(mt_model_numel(copy), mt_model_numel(m));
    memcpy(mt_model_params(copy), p, (size_t)mt_model_numel(m) * sizeof(float));
}

/* Llama 3 RoPE scaling with an original context of 8 (shorter than the decoded
 * sequence, so the scaled frequencies matter). */
static mt_model_config tiny_llama3(void) {
    mt_model_config c = tu_tiny_gqa(MT_DECODER_LLAMA2, 37, 2);
    c.rope_type = MT_ROPE_LLAMA3;
    c.rope_factor = 8.0f;
    c.rope_original_max_position = 8;
    return c;
}

static mt_model_config tiny_gemma(void) { return tu_tiny_mqa(MT_DECODER_GEMMA, 29, 2); }

/* Gemma 2 defaults (soft-caps 50 / 30, alternating local / global) with a window of
 * 3 positions, so the local layers' mask cuts the cache; soft-caps lowered so that
 * they bend the scores and logits of these spread parameters. */
static mt_model_config tiny_gemma2(void) {
    mt_model_config c = tu_tiny_gqa(MT_DECODER_GEMMA2, 33, 3);
    c.sliding_window_size = 3;
    c.attn_logits_soft_cap = 3.0f;
    c.final_logits_soft_cap = 5.0f;
    c.query_pre_attn_scalar = 8.0f;
    return c;
}

/* Gemma 3: QK-norm, local layers with their own RoPE base, window 4 < sequence. */
static mt_model_config tiny_gemma3(void) {
    mt_model_config c = tu_tiny_gqa(MT_DECODER_GEMMA3, 31, 3);
    c.sliding_window_size = 4;
    c.sliding_window_pattern = 2;
    c.query_pre_attn_scalar = 12.0f;
    return c;
}

/* Largest |decode - full| over row t divided by the largest |full| of the row, held to
 * the model-level bound of tests/test_fixtures.h: both paths compute the same fp32
 * math (u = 2^-24); only summation orders differ (a BLAS picks other kernels and
 * blockings for a 1-row GEMM than for a T-row one, and the attention sees the keys in
 * other blocks), so the rows differ by at most 2 lambda sqrt(S) u kappa, with
 *   S = tu_chain_terms(c, T, 0, 0): the terms on a logit's chain, 368 (llama3) to
 *       656 (gemma3) for these shapes at T = 16;
 *   kappa: the condition of the row's relative difference, evaluated below on the full
 *       model (every parameter times 1 + eta xi; the largest relative change of a row
 *       over eta): 1.7 (gemma) to 14 (gemma2, soft-caps) with the spread parameters.
 * The bound is 2.4e-5 (gemma) to 2.5e-4 (gemma2); the measured differences (printed)
 * are 2e-7 to 1.1e-6, ratio 0.003-0.008 to the bound (rounding errors of both signs
 * cancel, and S and lambda are worst cases). Old bound: 1e-5, from this machine's
 * 9e-7 and a guessed O(10) amplification. An error in a position, a cache row, a
 * window or a RoPE table moves logits by O(1) relative; an error of 4x the bound
 * planted in one logit of a row (DECODE_PLANT=4) fails every model. */
#ifndef DECODE_PLANT
#define DECODE_PLANT 0.0 /* a relative error planted in one logit, in units of the bound: shows the check can fail */
#endif

/* kappa of the rows of mt_model_logits(m) at ref (T x V): the largest over rows of
 * max_v |z'_v - z_v| / max_v |z_v| / eta, z' the logits with every parameter of m
 * multiplied by 1 + eta xi (xi = +-1 from Philox); m's parameters are restored. */
static double logits_kappa(mt_model *m, const int32_t *tok, const float *ref, int64_t T, int64_t V, uint64_t seed) {
    float *z = malloc(sizeof(float) * (size_t)(T * V)), *keep = tu_perturb_params(m, seed);
    cr_assert_eq(mt_model_logits(m, tok, z), MT_OK, "%s", mt_last_error());
    memcpy(mt_model_params(m), keep, sizeof(float) * (size_t)mt_model_numel(m));
    double kappa = 0.0;
    for (int64_t t = 0; t < T; t++) {
        double d = 0.0, r = 0.0;
        for (int64_t v = 0; v < V; v++) {
            d = fmax(d, fabs((double)z[t * V + v] - ref[t * V + v]));
            r = fmax(r, fabs((double)ref[t * V + v]));
        }
        kappa = fmax(kappa, d / r / TU_KAPPA_ETA);
    }
    free(keep);
    free(z);
    return kappa;
}

static double check_logits(const char *name, mt_model_config c, int64_t T, uint64_t seed) {
    fixture full, dec;
    fx_init(&full, &c, T, 0);
    fx_init(&dec, &c, T, 1);
    spread_params(full.m, dec.m, seed);
    const int64_t V = c.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T);
    float *ref = malloc(sizeof(float) * (size_t)(T * V));
    float *row = malloc(sizeof(float) * (size_t)V);
    float *all = malloc(sizeof(float) * (size_t)(T * V)); /* the decode logits of every position */
    for (int64_t t = 0; t < T; t++) {
        uint32_t r[4];
        mt_rng_u32x4(seed, 7, (uint64_t)t, r);
        tok[t] = (int32_t)(r[0] % (uint32_t)V);
    }
    cr_assert_eq(mt_model_logits(full.m, tok, ref), MT_OK, "%s", mt_last_error());
    const double kappa = logits_kappa(full.m, tok, ref, T, V, seed);
    const int64_t S = tu_chain_terms(&c, T, 0, 0);
    const double bound = tu_chain_bound(TU_U_F32, S, kappa);
    double worst = 0.0;
    for (int64_t t = 0; t < T; t++) {
        cr_assert_eq(mt_model_decode_length(dec.m), t);
        cr_assert_eq(mt_model_decode_step(dec.m, tok[t], row), MT_OK, "%s", mt_last_error());
        memcpy(all + t * V, row, sizeof(float) * (size_t)V);
        double dmax = 0.0, rmax = 0.0;
        for (int64_t v = 0; v < V; v++) rmax = fmax(rmax, fabs((double)ref[t * V + v]));
        if (DECODE_PLANT != 0.0 && t == T / 2) row[V / 2] += (float)(DECODE_PLANT * bound * rmax);
        for (int64_t v = 0; v < V; v++) {
            const double r = ref[t * V + v];
            cr_assert(isfinite(row[v]), "%s: position %lld logit %lld is %g", name, (long long)t, (long long)v,
                      (double)row[v]);
            dmax = fmax(dmax, fabs((double)row[v] - r));
        }
        cr_assert_gt(rmax, 0.1, "%s: position %lld: logits too small to compare", name, (long long)t);
        const double rel = dmax / rmax;
        worst = fmax(worst, rel);
        cr_expect_leq(rel, bound, "%s: position %lld: max |decode - full| / max |full| = %.3g > bound %.3g", name,
                      (long long)t, rel, bound);
    }
    /* the cache holds T positions: one more token is refused and changes nothing */
    cr_assert_eq(mt_model_decode_step(dec.m, tok[0], row), MT_ERR_INVALID);
    cr_assert_eq(mt_model_decode_length(dec.m), T);
    /* reset: the same tokens give bitwise the same logits again (deterministic ops,
     * nothing left over from the first pass) */
    cr_assert_eq(mt_model_decode_reset(dec.m), MT_OK);
    cr_assert_eq(mt_model_decode_length(dec.m), 0);
    for (int64_t t = 0; t < T; t++) {
        cr_assert_eq(mt_model_decode_step(dec.m, tok[t], row), MT_OK, "%s", mt_last_error());
        cr_assert_eq(memcmp(row, all + t * V, sizeof(float) * (size_t)V), 0, "%s: position %lld differs after reset",
                     name, (long long)t);
    }
    fprintf(stderr,
            "decode %-8s T=%lld: max relative logit difference %.3g, bound %.3g (S %lld, kappa %.3g): ratio %.3g\n",
            name, (long long)T, worst, bound, (long long)S, kappa, worst / bound);
    free(all);
    free(tok);
    free(ref);
    free(row);
    fx_free(&full);
    fx_free(&dec);
    return worst;
}

Test(decode, logits_llama3) { check_logits("llama3", tiny_llama3(), 16, 11); }
Test(decode, logits_gemma) { check_logits("gemma", tiny_gemma(), 16, 12); }
Test(decode, logits_gemma2) { check_logits("gemma2", tiny_gemma2(), 16, 13); }
Test(decode, logits_gemma3) { check_logits("gemma3", tiny_gemma3(), 16, 14); }

/* Sampling: the pre-KV-cache loop of train/sample.c (a model of n + 1 positions
 * holding BOS after the prefix, mt_model_logits on the whole sequence for each token,
 * mt_sample_pick on its row) against the decode loop (one row per token), with the
 * same uniform per position. Greedy (temperature 0) is what the task asks; random
 * tiny models fall into a short cycle under it, so temperature 1 with Philox uniforms
 * (as mt_sample_generate draws them) covers more varied prefixes. A flip would need a
 * logit tie, or u within ~1e-6 of a CDF step, at the check_logits bound above (at most
 * 2.5e-4 relative); the tokens must match exactly. */
static void check_sampling(const char *name, mt_model_config c, uint64_t seed, double temperature) {
    const int64_t n = 32, seq = n + 1, V = c.vocab_size;
    const int32_t bos = 1;
    fixture full, dec;
    fx_init(&full, &c, seq, 0);
    fx_init(&dec, &c, seq, 1);
    spread_params(full.m, dec.m, seed);
    int32_t *old_ids = malloc(sizeof(int32_t) * (size_t)seq), *new_ids = malloc(sizeof(int32_t) * (size_t)seq);
    float *lg = malloc(sizeof(float) * (size_t)(seq * V)), *row = malloc(sizeof(float) * (size_t)V);
    for (int64_t i = 0; i < seq; i++) old_ids[i] = bos;
    new_ids[0] = bos;
    int64_t distinct = 0;
    for (int64_t pos = 0; pos < n; pos++) {
        cr_assert_eq(mt_model_logits(full.m, old_ids, lg), MT_OK, "%s", mt_last_error());
        uint32_t w[4];
        mt_rng_u32x4(seed, 0x53414d50u, (uint64_t)pos, w);
        const double u = mt_rng_u01(w[0]);
        old_ids[pos + 1] = (int32_t)mt_sample_pick(lg + pos * V, V, temperature, 0, u);
        cr_assert_eq(mt_model_decode_step(dec.m, new_ids[pos], row), MT_OK, "%s", mt_last_error());
        new_ids[pos + 1] = (int32_t)mt_sample_pick(row, V, temperature, 0, u);
        cr_assert_eq(new_ids[pos + 1], old_ids[pos + 1], "%s: T=%g token %lld: decode %d, full recompute %d", name,
                     temperature, (long long)(pos + 1), (int)new_ids[pos + 1], (int)old_ids[pos + 1]);
        int seen = 0;
        for (int64_t j = 1; j <= pos; j++) seen |= old_ids[j] == old_ids[pos + 1];
        distinct += !seen;
    }
    /* sampled sequences must visit varied prefixes (greedy ones may cycle) */
    if (temperature > 0.0)
        cr_assert_geq(distinct, 5, "%s: sampled sequence has only %lld distinct tokens", name, (long long)distinct);
    free(old_ids);
    free(new_ids);
    free(lg);
    free(row);
    fx_free(&full);
    fx_free(&dec);
}

Test(decode, greedy_llama3) { check_sampling("llama3", tiny_llama3(), 21, 0.0); }
Test(decode, greedy_gemma) { check_sampling("gemma", tiny_gemma(), 22, 0.0); }
Test(decode, greedy_gemma2) { check_sampling("gemma2", tiny_gemma2(), 23, 0.0); }
Test(decode, greedy_gemma3) { check_sampling("gemma3", tiny_gemma3(), 24, 0.0); }
Test(decode, sampled_llama3) { check_sampling("llama3", tiny_llama3(), 31, 1.0); }
Test(decode, sampled_gemma2) { check_sampling("gemma2", tiny_gemma2(), 33, 1.0); }
Test(decode, sampled_gemma3) { check_sampling("gemma3", tiny_gemma3(), 34, 1.0); }

/* The plan holds the parameters and the decode.* entries only, the caches of
 * [L, 1, T, Hkv, Dh] floats each, all live over the whole step; the arena is the plan. */
Test(decode, plan_entries) {
    mt_model_config c = tiny_gemma3();
    const int64_t T = 50, L = c.num_decoder_layers;
    fixture f;
    fx_init(&f, &c, T, 1);
    const int k = mt_plan_find(f.plan, "decode.kv_cache.key"), v = mt_plan_find(f.plan, "decode.kv_cache.value");
    cr_assert(k >= 0 && v >= 0);
    const size_t cache = (size_t)(L * T * c.num_kv_heads * c.head_dim) * sizeof(float);
    cr_assert_eq(mt_plan_entry_get(f.plan, k)->bytes, cache);
    cr_assert_eq(mt_plan_entry_get(f.plan, v)->bytes, cache);
    cr_assert_eq(mt_plan_entry_get(f.plan, mt_plan_find(f.plan, "params"))->bytes,
                 (size_t)mt_model_numel(f.m) * sizeof(float));
    cr_assert_eq(mt_plan_find(f.plan, "grads"), -1);
    cr_assert_eq(mt_plan_find(f.plan, "layers.0.query_proj"), -1);
    size_t sum = 0;
    for (int i = 0; i < mt_plan_count(f.plan); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(f.plan, i);
        cr_assert(strcmp(e->name, "params") == 0 || strncmp(e->name, "decode.", 7) == 0, "entry %s", e->name);
        cr_assert_eq(e->first, 0);
        cr_assert_eq(e->last, mt_model_phase_count(f.m) - 1);
        sum += (e->bytes + MT_PLAN_ALIGN - 1) / MT_PLAN_ALIGN * MT_PLAN_ALIGN;
    }
    cr_assert_eq(mt_plan_peak(f.plan), sum); /* everything live together: no sharing */
    cr_assert_eq(f.arena.bytes, mt_plan_peak(f.plan));
    fx_free(&f);
}

Test(decode, errors) {
    mt_model_config c = tiny_llama3();
    mt_backend *be = mt_cpu_backend();
    mt_model *m;
    cr_assert_eq(mt_model_create(&m, &c, be, 2, 8, 1, NULL), MT_OK);
    cr_assert_eq(mt_model_set_decode(m, 1), MT_ERR_INVALID); /* batch 2 */
    mt_model_free(m);

    fixture f;
    fx_init(&f, &c, 4, 1);
    cr_assert_eq(mt_model_set_decode(f.m, 0), MT_ERR_INVALID); /* already planned */
    cr_assert_eq(mt_model_init_params(f.m, 3), MT_OK);
    float *row = malloc(sizeof(float) * (size_t)c.vocab_size);
    int32_t tok[4] = {1, 2, 3, 4}, lab[4] = {2, 3, 4, 5};
    cr_assert_eq(mt_model_decode_step(f.m, (int32_t)c.vocab_size, row), MT_ERR_INVALID);
    cr_assert_eq(mt_model_decode_step(f.m, -1, row), MT_ERR_INVALID);
    cr_assert_eq(mt_model_decode_step(f.m, 1, NULL), MT_ERR_INVALID);
    cr_assert_eq(mt_model_decode_length(f.m), 0);
    double ls;
    int64_t cnt;
    cr_assert_eq(mt_model_logits(f.m, tok, row), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "mt_model_decode_step") != NULL, "%s", mt_last_error());
    cr_assert_eq(mt_model_loss(f.m, tok, lab, &ls, &cnt), MT_ERR_INVALID);
    cr_assert_eq(mt_model_forward_backward(f.m, tok, lab, 1.0f, &ls, &cnt), MT_ERR_INVALID);
    fx_free(&f);

    /* a training model is not a decode model */
    fx_init(&f, &c, 4, 0);
    cr_assert_eq(mt_model_decode_step(f.m, 1, row), MT_ERR_INVALID);
    cr_assert_eq(mt_model_decode_reset(f.m), MT_ERR_INVALID);
    fx_free(&f);

    /* decoding runs on one rank with device parameters */
    const mt_model_layout offload = {.param_offload = 1};
    cr_assert_eq(mt_model_create(&m, &c, be, 1, 4, 1, &offload), MT_OK);
    cr_assert_eq(mt_model_set_decode(m, 1), MT_OK);
    mt_plan *p;
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(m, p), MT_ERR_UNSUPPORTED);
    mt_plan_free(p);
    mt_model_free(m);
    free(row);
}
