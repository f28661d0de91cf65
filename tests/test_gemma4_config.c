/* tests/test_gemma4_config.c: the Gemma 4 model description (issue 18):
 * configs/models/gemma4-e2b.yml and -e4b.yml read through the run config loader, their
 * parameter counts against transformers' own count, the per-layer facts (local /
 * global, head dims, MLP widths, KV donors) against transformers' modeling_gemma4.py,
 * the proportional RoPE table, and the refusals of bad gemma4 keys.
 *
 * The expected figures come from transformers 5.17.0 (scripts/setup-hf5-overlay.sh),
 * not from this code: tests/reference/gemma4_param_counts.py builds
 * Gemma4ForCausalLM(Gemma4TextConfig(...)) on the meta device from each yml's values
 * and prints model.num_parameters() and, per layer, self_attn.head_dim,
 * mlp.intermediate_size and the donor (store_full_length_kv of the same layer type). */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "models/config.h"
#include "train/config.h"
#include "train/metrics.h"

static mt_train_config load_model(const char *name) {
    mt_train_config cfg;
    char base[512], ov[128];
    snprintf(base, sizeof base, "%s/configs/base.yml", MT_SOURCE_DIR);
    snprintf(ov, sizeof ov, "model_name=%s", name);
    const char *ovs[] = {ov};
    mt_status s = mt_train_config_load(&cfg, base, 1, ovs);
    cr_assert_eq(s, MT_OK, "%s: %s", name, mt_last_error());
    return cfg;
}

Test(gemma4_config, parameter_counts_equal_transformers) {
    mt_train_config e2b = load_model("gemma4-e2b"), e4b = load_model("gemma4-e4b");
    cr_expect_eq(mt_model_num_parameters(&e2b.model), 4628569344LL, "gemma4-e2b: %lld",
                 (long long)mt_model_num_parameters(&e2b.model));
    cr_expect_eq(mt_model_num_parameters(&e4b.model), 7463013376LL, "gemma4-e4b: %lld",
                 (long long)mt_model_num_parameters(&e4b.model));
}

Test(gemma4_config, e2b_layers) {
    mt_train_config t = load_model("gemma4-e2b");
    const mt_model_config *c = &t.model;
    cr_assert_eq(c->decoder_block, MT_DECODER_GEMMA4);
    cr_expect_eq(mt_model_norm_unit_offset(c), 0, "Gemma4RMSNorm scales by w, not 1 + w");
    cr_expect_float_eq(mt_model_attn_scale(c), 1.0f, 0.0f, "Gemma4TextAttention.scaling = 1.0");
    for (int64_t l = 0; l < 35; l++) {
        const int global = l % 5 == 4; /* layer_types = ([sliding] * 4 + [full]) * 7 */
        cr_expect_eq(mt_model_layer_is_local(c, l), !global, "layer %lld", (long long)l);
        cr_expect_eq(mt_model_layer_head_dim(c, l), global ? 512 : 256, "layer %lld", (long long)l);
        cr_expect_eq(mt_model_layer_mlp_dim(c, l), l >= 15 ? 12288 : 6144, "layer %lld", (long long)l);
        cr_expect_eq(mt_model_layer_kv_donor(c, l), l < 15 ? -1 : global ? 14 : 13, "layer %lld", (long long)l);
    }
}

Test(gemma4_config, e4b_layers) {
    mt_train_config t = load_model("gemma4-e4b");
    const mt_model_config *c = &t.model;
    for (int64_t l = 0; l < 42; l++) {
        const int global = l % 6 == 5;
        cr_expect_eq(mt_model_layer_is_local(c, l), !global, "layer %lld", (long long)l);
        cr_expect_eq(mt_model_layer_head_dim(c, l), global ? 512 : 256, "layer %lld", (long long)l);
        cr_expect_eq(mt_model_layer_mlp_dim(c, l), 10240, "layer %lld", (long long)l);
        cr_expect_eq(mt_model_layer_kv_donor(c, l), l < 24 ? -1 : global ? 23 : 22, "layer %lld", (long long)l);
    }
}

Test(gemma4_config, last_layer_is_global) {
    /* configuration_gemma4.py forces layer_types[-1] = "full_attention" */
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_GEMMA4);
    c.num_decoder_layers = 7; /* pattern 6: layer 6 would be local */
    cr_expect_eq(mt_model_layer_is_local(&c, 6), 0);
    cr_expect_eq(mt_model_layer_is_local(&c, 4), 1);
    cr_expect_eq(mt_model_layer_is_local(&c, 5), 0);
    mt_model_config_defaults(&c, MT_DECODER_GEMMA3); /* gemma3 has no such rule */
    c.num_decoder_layers = 7;
    cr_expect_eq(mt_model_layer_is_local(&c, 6), 1);
}

Test(gemma4_config, proportional_rope) {
    /* _compute_proportional_rope_parameters, global_head_dim 512, partial 0.25, theta
     * 1e6: rope_angles = int(0.25 * 512 // 2) = 64 frequencies 1e6^(-2i/512), then 192
     * zeros; local layers the default 1e4^(-2i/256). mt_rope_inv_freq computes
     * 1 / pow(base, 2i / Dh) in fp64 (the exponent exact: a division by a power of two;
     * pow within 1 ulp (glibc), the reciprocal and / factor (1.0: exact) one rounding
     * each: < 3 u64) and rounds it to fp32 once (u32 = 2^-24 relative); want here is
     * pow(base, -2i / Dh), one pow (< 2 u64). So |f - want| <= (u32 + 5 u64) want (Higham,
     * "Accuracy and Stability of Numerical Algorithms", 2002, eq. 2.4 for each rounding;
     * the products of the factors are ~1e-23, inside the slack). */
    const double tol = 0x1p-24 + 5 * 0x1p-53;
    mt_train_config t = load_model("gemma4-e2b");
    float f[256];
    mt_rope_inv_freq(&t.model, 4, f);
    for (int i = 0; i < 256; i++) {
        const double want = i < 64 ? pow(1e6, -(double)(2 * i) / 512.0) : 0.0;
        cr_expect(fabs(f[i] - want) <= tol * want, "global inv_freq[%d] = %.9g, want %.9g", i, f[i], want);
    }
    mt_rope_inv_freq(&t.model, 0, f);
    for (int i = 0; i < 128; i++) {
        const double want = pow(1e4, -(double)(2 * i) / 256.0);
        cr_expect(fabs(f[i] - want) <= tol * want, "local inv_freq[%d] = %.9g, want %.9g", i, f[i], want);
    }
}

static void expect_refused(const mt_model_config *c, const char *key) {
    cr_expect_eq(mt_model_config_validate(c), MT_ERR_INVALID, "%s accepted", key);
    cr_expect(strstr(mt_last_error(), key) != NULL, "message '%s' does not name %s", mt_last_error(), key);
}

Test(gemma4_config, bad_keys_refused) {
    mt_train_config t = load_model("gemma4-e2b");
    cr_assert_eq(mt_model_config_validate(&t.model), MT_OK, "%s", mt_last_error());
    mt_model_config c = t.model;
    /* layers 0-4 before the sharing ones: 4 is the only global, but with pattern 6 every
     * layer before 5 is local and the globals after it have no donor */
    c.num_decoder_layers = 10, c.num_kv_shared_layers = 5, c.sliding_window_pattern = 6;
    expect_refused(&c, "num_kv_shared_layers");
    c = t.model, c.num_kv_shared_layers = 35;
    expect_refused(&c, "num_kv_shared_layers");
    c = t.model, c.global_head_dim = 1024;
    expect_refused(&c, "global_head_dim");
    c = t.model, c.rope_partial_rotary_factor = 0.0f;
    expect_refused(&c, "rope_partial_rotary_factor");
    /* the layer always has these norms (it crashed without them) */
    c = t.model, c.use_qk_norm = 0;
    expect_refused(&c, "use_qk_norm");
    c = t.model, c.use_post_attn_norm = 0;
    expect_refused(&c, "use_post_attn_norm");
    c = t.model, c.use_post_ffw_norm = 0;
    expect_refused(&c, "use_post_ffw_norm");
    /* a pattern of 0 made every layer global with the window still set (transformers
     * divides by it); 1 is every layer global, as layer_types of full_attention only */
    c = t.model, c.sliding_window_pattern = 0;
    expect_refused(&c, "sliding_window_pattern");
    c = t.model, c.sliding_window_pattern = -3;
    expect_refused(&c, "sliding_window_pattern");
    c = t.model, c.sliding_window_pattern = 1, c.num_kv_shared_layers = 0;
    cr_expect_eq(mt_model_config_validate(&c), MT_OK, "pattern 1: %s", mt_last_error());
    /* config.json's gemma4 rope_parameters take default or proportional only */
    c = t.model, c.rope_type = MT_ROPE_LLAMA3;
    expect_refused(&c, "rope_type");
    c = t.model, c.rope_type = MT_ROPE_LINEAR;
    expect_refused(&c, "rope_type");
    c = t.model, c.rope_type = MT_ROPE_DEFAULT;
    cr_expect_eq(mt_model_config_validate(&c), MT_OK, "rope_type default: %s", mt_last_error());
    c = t.model, c.global_head_dim = 7;
    expect_refused(&c, "global_head_dim");
    c = t.model, c.global_head_dim = -2;
    expect_refused(&c, "global_head_dim");
    c = t.model, c.per_layer_input_dim = -1;
    expect_refused(&c, "per_layer_input_dim");
    c = t.model, c.num_kv_shared_layers = -1;
    expect_refused(&c, "num_kv_shared_layers");
    c = t.model, c.rope_partial_rotary_factor = 1.5f;
    expect_refused(&c, "rope_partial_rotary_factor");
    /* a per-layer embedding table V x L x P past a 64-bit byte count (the run config's
     * parameter-state bound counts it: 1e15 wrapped the parameter count) */
    mt_train_config big = t;
    big.model.per_layer_input_dim = 1000000000000000LL;
    cr_expect_eq(mt_train_config_validate(&big), MT_ERR_INVALID, "per_layer_input_dim 1e15 accepted");
    cr_expect(strstr(mt_last_error(), "per_layer_input_dim") != NULL, "%s", mt_last_error());
    mt_model_config g3;
    mt_model_config_defaults(&g3, MT_DECODER_GEMMA3);
    g3.vocab_size = 64, g3.emb_dim = 32, g3.num_query_heads = 4, g3.num_kv_heads = 2, g3.head_dim = 8;
    g3.mlp_dim = 64, g3.num_decoder_layers = 2;
    cr_assert_eq(mt_model_config_validate(&g3), MT_OK, "%s", mt_last_error());
    g3.per_layer_input_dim = 8;
    expect_refused(&g3, "per_layer_input_dim");
    g3.per_layer_input_dim = 0, g3.rope_type = MT_ROPE_PROPORTIONAL;
    expect_refused(&g3, "proportional");
}

/* ---- config.json (models/checkpoint.c mt_hf_config_read / _write) ---- */

#include "models/checkpoint.h"

static mt_model_config read_seed(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/tests/fuzz_corpus/hf_config/%s", MT_SOURCE_DIR, name);
    mt_model_config c;
    cr_assert_eq(mt_hf_config_read(path, &c), MT_OK, "%s: %s", name, mt_last_error());
    return c;
}

Test(gemma4_config, published_config_json_is_the_yml_model) {
    /* gemma4_e2b_multimodal_tf5.5.4.json: Gemma4Config(text_config=E2B, no towers) as
     * transformers 5.5.4 writes it (model_type gemma4, global_head_dim key) */
    mt_model_config hf = read_seed("gemma4_e2b_multimodal_tf5.5.4.json");
    mt_train_config yml = load_model("gemma4-e2b");
    char va[128], vb[128];
    const mt_config_key *k = mt_model_config_diff(&hf, &yml.model, NULL, va, vb, sizeof va);
    cr_expect_null(k, "config.json and gemma4-e2b.yml differ on %s: %s vs %s", k ? k->name : "", va, vb);
    cr_expect_eq(mt_model_num_parameters(&hf), 4628569344LL);
}

Test(gemma4_config, transformers_5_17_config_json) {
    /* gemma4_text_tiny_tf5.17.0.json: a Gemma4TextConfig as 5.17 writes it (global head
     * dim only in per_layer_config, layers 2, 5 and 6 full) */
    mt_model_config c = read_seed("gemma4_text_tiny_tf5.17.0.json");
    cr_expect_eq(c.decoder_block, MT_DECODER_GEMMA4);
    cr_expect_eq(c.global_head_dim, 32);
    cr_expect_eq(c.head_dim, 16);
    cr_expect_eq(c.num_kv_shared_layers, 3);
    cr_expect_eq(c.use_double_wide_mlp, 1);
    cr_expect_eq(c.per_layer_input_dim, 8);
    cr_expect_eq(c.sliding_window_size, 5);
    cr_expect_float_eq(c.final_logits_soft_cap, 30.0f, 0.0f);
    cr_expect_float_eq(c.query_pre_attn_scalar, 1.0f, 0.0f);
    cr_expect_eq(c.rope_type, MT_ROPE_PROPORTIONAL);
    cr_expect_float_eq(c.rope_partial_rotary_factor, 0.25f, 0.0f);
    cr_expect_float_eq(c.local_rope_max_timescale, 10000.0f, 0.0f);
    static const int local[7] = {1, 1, 0, 1, 1, 0, 0};
    static const int donor[7] = {-1, -1, -1, -1, 3, 2, 2}; /* layers 4-6 share: last earlier local 3, global 2 */
    for (int l = 0; l < 7; l++) {
        cr_expect_eq(mt_model_layer_is_local(&c, l), local[l], "layer %d", l);
        cr_expect_eq(mt_model_layer_kv_donor(&c, l), donor[l], "layer %d", l);
    }
    cr_expect_eq(mt_model_config_validate(&c), MT_OK, "%s", mt_last_error());
}

Test(gemma4_config, flops_per_token) {
    /* MaxText's calculate_gemma4_small_tflops_training_per_device (train/metrics.h), by
     * hand for gemma4-e2b at T = 24576 per token: 35 layers, global 4, 9, ..., 34 (7),
     * KV-sharing 15..34 (20: globals 19, 24, 29, 34), H 8, Hkv 1, Dh 256 local / 512
     * global, D 1536, F 6144 (12288 sharing), P 256, V 262144, window 512:
     *   attention 7 x 2 T 8 x 512 + 28 x 4 (T 512 - 512^2 / 2) / T 8 x 256
     *   q, o      7 x 4 D 8 x 512 + 28 x 4 D 8 x 256
     *   k, v      3 x 4 D 512 + 12 x 4 D 256 (the 15 layers that own K/V)
     *   MLP       15 x 6 D 6144 + 20 x 6 D 12288
     *   PLE       2 D 35 x 256 + 35 x 4 D 256;  logits 2 D V;  all x 3 */
    mt_train_config t = load_model("gemma4-e2b");
    const double T = 24576.0, D = 1536.0;
    const double attn =
        7.0 * 2.0 * T * 8.0 * 512.0 + 28.0 * 4.0 * (T * 512.0 - 0.5 * 512.0 * 512.0) / T * 8.0 * 256.0;
    const double qo = 7.0 * 4.0 * D * 8.0 * 512.0 + 28.0 * 4.0 * D * 8.0 * 256.0;
    const double kv = 3.0 * 4.0 * D * 512.0 + 12.0 * 4.0 * D * 256.0;
    const double mlp = 15.0 * 6.0 * D * 6144.0 + 20.0 * 6.0 * D * 12288.0;
    const double ple = 2.0 * D * 35.0 * 256.0 + 35.0 * 4.0 * D * 256.0, logits = 2.0 * D * 262144.0;
    const double want = 3.0 * (attn + qo + kv + mlp + ple + logits);
    /* Every term is positive and all but the local attention's are integers below 2^53
     * (exact in fp64); a local term (T w - w^2 / 2) / T H dh rounds at most 3 times (the
     * division and two products). train/metrics.c gemma4_flops_per_token: 35 layer terms
     * (3 each), 34 sums of them, + weights and x 3: at most 141 roundings, relative
     * gamma_141 (Higham 2002, Lemma 3.1 and eq. 3.5, u = 2^-53); want here: 3 + 5 sums
     * + x 3 < 10 roundings, gamma_10. Was 1e-12 relative, by hand; now 1.7e-14. */
    const double tol = 141 * 0x1p-53 / (1 - 141 * 0x1p-53) + 10 * 0x1p-53 / (1 - 10 * 0x1p-53);
    cr_expect(fabs(mt_flops_per_token(&t.model, 24576) - want) <= tol * want, "%.17g vs %.17g",
              mt_flops_per_token(&t.model, 24576), want);
}

Test(gemma4_config, config_json_refusals_name_the_key) {
    /* what the decoder does not compute is refused with MT_ERR_FORMAT naming the key */
    static const struct { const char *json, *key; } bad[] = {
        {"{\"model_type\": \"gemma4_text\", \"attention_k_eq_v\": true}", "attention_k_eq_v"},
        {"{\"model_type\": \"gemma4_text\", \"enable_moe_block\": true}", "enable_moe_block"},
        {"{\"model_type\": \"gemma4_text\", \"use_bidirectional_attention\": \"all\"}", "use_bidirectional_attention"},
        {"{\"model_type\": \"gemma4_text\", \"vocab_size\": 100, \"vocab_size_per_layer_input\": 99}",
         "vocab_size_per_layer_input"},
        {"{\"model_type\": \"gemma4_text\", \"num_hidden_layers\": 6, \"layer_types\": [\"sliding_attention\", "
         "\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"], "
         "\"per_layer_config\": {\"0\": {\"head_dim\": 512}}}",
         "per_layer_config.0"},
    };
    char path[] = "/tmp/mt_test_gemma4_XXXXXX";
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        cr_assert_not_null(f);
        fputs(bad[i].json, f);
        fclose(f);
        mt_model_config c;
        cr_expect_eq(mt_hf_config_read(path, &c), MT_ERR_FORMAT, "%s accepted", bad[i].key);
        cr_expect(strstr(mt_last_error(), bad[i].key) != NULL, "'%s' does not name %s", mt_last_error(), bad[i].key);
    }
    unlink(path);
}
