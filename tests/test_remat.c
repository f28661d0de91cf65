/* tests/test_remat.c: remat and offload (models/remat.h, models/model_plan.c, models/model_layers.c).
 *
 * Every remat policy, a custom mix of device / remat / offload, and full offload must
 * give BITWISE the losses, gradients and parameters (after three AdamW steps) of
 * keeping everything: recomputation replays the forward's exact op sequence on the
 * same inputs, and offload copies bytes. fp32, CPU backend. Three decoders cover
 * every optional path (llama GQA; gemma2 post-norms, which save mlpwo, soft-caps and
 * sliding windows; gemma3 QK-norm; gemma4 its whole layer, numbers only). The plan must shrink by exactly the bytes not kept
 * and grow by one layer's worth of scratch; the host pool holds exactly the
 * offloaded bytes. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/model.h"
#include "models/remat.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "train/optimizer.h"

static mt_model_config cfg_gemma2(void) {
    mt_model_config c = tu_tiny_mqa(MT_DECODER_GEMMA2, 29, 3);
    c.sliding_window_size = 3;
    c.sliding_window_pattern = 2;
    c.attn_logits_soft_cap = 2.0f;
    c.final_logits_soft_cap = 3.0f;
    return c;
}
static mt_model_config cfg_gemma3(void) {
    mt_model_config c = tu_tiny_gqa(MT_DECODER_GEMMA3, 31, 3);
    c.sliding_window_size = 3;
    c.sliding_window_pattern = 2;
    return c;
}


/* Tiny tensors: one thread (thread start-up dominates on a shared 2-core machine;
 * the ops are deterministic for any thread count). */
static void one_thread(void) { setenv("OMP_NUM_THREADS", "1", 1); }
TestSuite(remat, .init = one_thread);

#define B 2
#define T 8
#define STEPS 3

typedef struct run_out {
    double loss[STEPS];
    float *grads, *params;
    int64_t numel;
    size_t act_bytes, remat_scratch, host_bytes, peak;
    int layer_entries[MT_RT_COUNT]; /* device plan entries per name (all layers) */
} run_out;

static void batch(int64_t V, int step, int32_t *tok, int32_t *lab) {
    for (int n = 0; n < B * T; n++) {
        uint32_t r[4];
        mt_rng_u32x4(7, (uint64_t)step, (uint64_t)n, r);
        tok[n] = (int32_t)(r[0] % (uint32_t)V);
        lab[n] = (n % T == 2) ? MT_IGNORE_LABEL : (int32_t)(r[1] % (uint32_t)V);
    }
}

static int name_of(const char *entry) {
    const char *dot = strrchr(entry, '.');
    if (strncmp(entry, "layers.", 7) != 0 || !dot) return -1;
    if (strcmp(dot + 1, "context_lse") == 0) return -1; /* counted with context */
    for (int t = 0; t < MT_RT_COUNT; t++)
        if (strcmp(dot + 1, mt_remat_tensor_name((mt_remat_tensor)t)) == 0) return t;
    return -1;
}

static int g_param_offload; /* parameters in the host pool, a layer window on the device */

static void run(const mt_model_config *c, const mt_remat_policy *pol, run_out *o) {
    memset(o, 0, sizeof *o);
    mt_backend *be = mt_cpu_backend();
    mt_model *m;
    /* the vocabulary whole (num_vocab_chunks = 1) as in the reference: with parameter
     * windows auto would cut it into chunks (models/model.h), whose loss sums in another
     * order; tests/test_mpi_layouts.sh checks parameter offload in chunks */
    const mt_model_layout lay = {.param_offload = g_param_offload, .vocab_chunks = 1};
    cr_assert_eq(mt_model_create(&m, c, be, B, T, 2, &lay), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_set_remat(m, pol), MT_OK, "%s", mt_last_error());
    mt_plan *p, *h;
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    cr_assert_eq(mt_plan_new(&h), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(m, p), MT_OK, "%s", mt_last_error());
    mt_adamw opt;
    mt_adamw_init(&opt, be, mt_model_numel(m), 0.9, 0.95, 1e-8, 0.1);
    cr_assert_eq(mt_adamw_add_to_plan(&opt, p, mt_model_phase_count(m), mt_model_param_count(m)), MT_OK);
    cr_assert_eq(mt_model_add_to_host_plan(m, h), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_finalize(p), MT_OK);
    cr_assert_eq(mt_plan_finalize(h), MT_OK);
    for (int i = 0; i < mt_plan_count(p); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        if (e->category == MT_MEM_ACTIVATIONS) o->act_bytes += e->bytes;
        if (strncmp(e->name, "remat.", 6) == 0) o->remat_scratch += e->bytes;
        int t = name_of(e->name);
        if (t >= 0) o->layer_entries[t]++;
    }
    for (int i = 0; i < mt_plan_count(h); i++)
        if (mt_plan_entry_get(h, i)->category == MT_MEM_ACTIVATIONS) o->host_bytes += mt_plan_entry_get(h, i)->bytes;
    o->peak = mt_plan_peak(p);
    mt_arena a, ha;
    cr_assert_eq(mt_backend_arena_create(be, &a, p), MT_OK);
    cr_assert_eq(mt_arena_create(&ha, h, NULL, NULL, NULL), MT_OK);
    cr_assert_eq(mt_model_bind(m, &a, p), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_adamw_bind(&opt, &a, p), MT_OK);
    int offloads = 0;
    for (int t = 0; t < MT_RT_COUNT; t++) offloads += pol->action[t] == MT_RA_OFFLOAD;
    if ((offloads || g_param_offload) && mt_plan_count(h) > 0) {
        int32_t tok[B * T], lab[B * T];
        batch(c->vocab_size, 0, tok, lab);
        double ls;
        int64_t cnt;
        cr_assert_neq(mt_model_forward_backward(m, tok, lab, 1.0f, &ls, &cnt), MT_OK,
                      "a model that offloads must refuse to run without its host pool");
    }
    cr_assert_eq(mt_model_bind_host(m, &ha, h), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_init_params(m, 11), MT_OK);
    const int n = mt_model_param_count(m);
    mt_param_info *pi = malloc(sizeof(mt_param_info) * (size_t)n);
    for (int i = 0; i < n; i++) pi[i] = *mt_model_param(m, i);
    o->numel = mt_model_numel(m);
    for (int s = 0; s < STEPS; s++) {
        int32_t tok[B * T], lab[B * T];
        TU_OK(be->ops->zero(be, mt_model_grads(m), (size_t)o->numel * sizeof(float)));
        double ls = 0;
        int64_t cnt = 0;
        /* two micro-batches: accumulation passes through the same buffers */
        for (int mb = 0; mb < 2; mb++) {
            batch(c->vocab_size, 2 * s + mb, tok, lab);
            double l1;
            int64_t c1;
            cr_assert_eq(mt_model_forward_backward(m, tok, lab, 1.0f, &l1, &c1), MT_OK, "%s", mt_last_error());
            ls += l1;
            cnt += c1;
        }
        o->loss[s] = ls / (double)cnt;
        if (s == STEPS - 1) {
            o->grads = malloc((size_t)o->numel * sizeof(float));
            memcpy(o->grads, mt_model_grads(m), (size_t)o->numel * sizeof(float));
        }
        cr_assert_eq(mt_adamw_step(&opt, pi, n, mt_model_params(m), mt_model_grads(m), 1e-2f,
                                   (float)(1.0 / (double)cnt), s + 1), MT_OK);
    }
    o->params = malloc((size_t)o->numel * sizeof(float));
    memcpy(o->params, mt_model_params(m), (size_t)o->numel * sizeof(float));
    free(pi);
    mt_arena_destroy(&a);
    mt_arena_destroy(&ha);
    mt_plan_free(p);
    mt_plan_free(h);
    mt_model_free(m);
}

static void run_free(run_out *o) {
    free(o->grads);
    free(o->params);
}

/* Bytes of one layer's named tensor t, from the shapes (remat.h), independently of
 * the model code. */
static size_t tensor_bytes(const mt_model_config *c, int t) {
    const size_t N = B * T, D = (size_t)c->emb_dim, QD = (size_t)(c->num_query_heads * c->head_dim);
    const size_t KVD = (size_t)(c->num_kv_heads * c->head_dim), F = (size_t)c->mlp_dim;
    switch (t) {
    case MT_RT_DECODER_LAYER_INPUT: return 4 * N * D;
    case MT_RT_QUERY_PROJ: return 4 * N * QD;
    case MT_RT_KEY_PROJ:
    case MT_RT_VALUE_PROJ: return 4 * N * KVD;
    case MT_RT_CONTEXT: return 4 * (N * QD + (size_t)(B * c->num_query_heads * T));
    case MT_RT_OUT_PROJ: return 4 * N * D;
    case MT_RT_MLPWI_0:
    case MT_RT_MLPWI_1: return 4 * N * F;
    case MT_RT_MLPWO: return c->use_post_ffw_norm ? 4 * N * D : 0;
    }
    return 0;
}

static void compare_policy(const mt_model_config *c, const char *cname, const mt_remat_policy *pol,
                           const char *pname, const run_out *ref) {
    run_out o;
    run(c, pol, &o);
    for (int s = 0; s < STEPS; s++)
        cr_expect(memcmp(&o.loss[s], &ref->loss[s], sizeof(double)) == 0, "%s %s: step %d loss %.17g vs %.17g",
                  cname, pname, s + 1, o.loss[s], ref->loss[s]);
    cr_expect(memcmp(o.grads, ref->grads, (size_t)o.numel * sizeof(float)) == 0, "%s %s: gradients differ",
              cname, pname);
    cr_expect(memcmp(o.params, ref->params, (size_t)o.numel * sizeof(float)) == 0,
              "%s %s: parameters differ after %d steps", cname, pname, STEPS);
    /* plan: kept entries, saved bytes, scratch, host pool */
    const size_t L = (size_t)c->num_decoder_layers;
    size_t not_kept = 0, scratch = 0, host = 0;
    for (int t = 0; t < MT_RT_COUNT; t++) {
        const size_t b = tensor_bytes(c, t);
        const int kept = pol->action[t] == MT_RA_DEVICE;
        if (b > 0)
            cr_expect_eq(o.layer_entries[t], kept ? (int)L : 0, "%s %s: %s has %d layer entries", cname, pname,
                         mt_remat_tensor_name((mt_remat_tensor)t), o.layer_entries[t]);
        if (!kept) {
            not_kept += L * b;
            scratch += 2 * b; /* forward and backward scratch, one layer each */
        }
        if (pol->action[t] == MT_RA_OFFLOAD) host += L * b;
    }
    cr_expect_eq(ref->act_bytes - o.act_bytes, not_kept, "%s %s: activations shrink by %zu, expected %zu", cname,
                 pname, ref->act_bytes - o.act_bytes, not_kept);
    cr_expect_eq(o.remat_scratch, scratch, "%s %s: recompute scratch %zu, expected %zu", cname, pname,
                 o.remat_scratch, scratch);
    cr_expect_eq(o.host_bytes, host, "%s %s: host pool %zu, expected %zu", cname, pname, o.host_bytes, host);
    run_free(&o);
}

static void all_policies(const mt_model_config *c, const char *cname) {
    mt_remat_policy keep = mt_remat_policy_keep_all();
    run_out ref;
    run(c, &keep, &ref);
    cr_assert_eq(ref.remat_scratch, 0);
    for (int k = 0; k < MT_REMAT_POLICY_COUNT; k++) {
        mt_remat_policy pol;
        cr_assert_eq(mt_remat_policy_resolve((mt_remat_policy_kind)k, NULL, &pol), MT_OK, "%s", mt_last_error());
        compare_policy(c, cname, &pol, mt_remat_policy_name((mt_remat_policy_kind)k), &ref);
    }
    /* a custom mix of all three actions, and everything offloaded */
    const mt_remat_action mix[MT_RT_COUNT] = {MT_RA_DEVICE, MT_RA_OFFLOAD, MT_RA_REMAT, MT_RA_DEVICE, MT_RA_OFFLOAD,
                                             MT_RA_REMAT, MT_RA_DEVICE, MT_RA_OFFLOAD, MT_RA_OFFLOAD};
    mt_remat_policy pol;
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_CUSTOM, mix, &pol), MT_OK);
    compare_policy(c, cname, &pol, "custom mix", &ref);
    mt_remat_action off[MT_RT_COUNT];
    for (int t = 0; t < MT_RT_COUNT; t++) off[t] = t ? MT_RA_OFFLOAD : MT_RA_DEVICE;
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_CUSTOM, off, &pol), MT_OK);
    compare_policy(c, cname, &pol, "all offloaded", &ref);
    /* parameters in the host pool as well (parameter_memory_host_offload) */
    g_param_offload = 1;
    compare_policy(c, cname, &pol, "all offloaded + parameters", &ref);
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_FULL, NULL, &pol), MT_OK);
    compare_policy(c, cname, &pol, "full + parameters", &ref);
    g_param_offload = 0;
    run_free(&ref);
}

Test(remat, llama_every_policy_bitwise) {
    mt_model_config c = tu_tiny_gqa(MT_DECODER_LLAMA2, 37, 3);
    all_policies(&c, "llama");
}

Test(remat, gemma2_every_policy_bitwise) {
    mt_model_config c = cfg_gemma2();
    all_policies(&c, "gemma2");
}

Test(remat, gemma3_every_policy_bitwise) {
    mt_model_config c = cfg_gemma3();
    all_policies(&c, "gemma3");
}

/* gemma4: losses, gradients and parameters bitwise for every policy and the custom
 * mixes. Its plan sizes are not tensor_bytes' (per-layer head dims and MLP widths, the
 * donors' K/V kept whatever the policy) and it refuses parameter host offload, so only
 * the numbers are compared here. */
Test(remat, gemma4_every_policy_bitwise) {
    mt_model_config c = tu_tiny_gemma4(); /* tests/test_fixtures.h */
    cr_assert_eq(mt_model_config_validate(&c), MT_OK, "%s", mt_last_error());
    mt_remat_policy keep = mt_remat_policy_keep_all();
    run_out ref;
    run(&c, &keep, &ref);
    const mt_remat_action mix[MT_RT_COUNT] = {MT_RA_DEVICE, MT_RA_OFFLOAD, MT_RA_REMAT, MT_RA_DEVICE, MT_RA_OFFLOAD,
                                             MT_RA_REMAT, MT_RA_DEVICE, MT_RA_OFFLOAD, MT_RA_OFFLOAD};
    for (int k = 0; k <= MT_REMAT_POLICY_COUNT; k++) {
        mt_remat_policy pol;
        const char *name = k < MT_REMAT_POLICY_COUNT ? mt_remat_policy_name((mt_remat_policy_kind)k) : "custom mix";
        cr_assert_eq(mt_remat_policy_resolve(k < MT_REMAT_POLICY_COUNT ? (mt_remat_policy_kind)k : MT_REMAT_CUSTOM,
                                             k < MT_REMAT_POLICY_COUNT ? NULL : mix, &pol),
                     MT_OK, "%s", mt_last_error());
        run_out o;
        run(&c, &pol, &o);
        for (int s = 0; s < STEPS; s++)
            cr_expect(memcmp(&o.loss[s], &ref.loss[s], sizeof(double)) == 0, "gemma4 %s: step %d loss %.17g vs %.17g",
                      name, s + 1, o.loss[s], ref.loss[s]);
        cr_expect(memcmp(o.grads, ref.grads, (size_t)o.numel * sizeof(float)) == 0, "gemma4 %s: gradients differ",
                  name);
        cr_expect(memcmp(o.params, ref.params, (size_t)o.numel * sizeof(float)) == 0,
                  "gemma4 %s: parameters differ after %d steps", name, STEPS);
        run_free(&o);
    }
    run_free(&ref);
}

/* MaxText's policy table (src/MaxText/layers/decoders.py get_remat_policy), spelled out here independently. */
Test(remat, policy_table) {
    struct { const char *name; const char *kept; } t[] = {
        {"full", ""},
        {"minimal", "query_proj key_proj value_proj out_proj mlpwi_0 mlpwi_1 mlpwo"},
        {"minimal_with_context", "query_proj key_proj value_proj context out_proj mlpwi_0 mlpwi_1 mlpwo"},
        {"save_dot_with_context_except_mlp", "query_proj key_proj value_proj context out_proj"},
        {"save_dot_except_mlpwi", "query_proj key_proj value_proj out_proj mlpwo"},
        {"save_dot_except_mlp", "query_proj key_proj value_proj out_proj"},
        {"save_qkv_proj", "query_proj key_proj value_proj"},
        {"save_out_proj", "out_proj"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        mt_remat_policy_kind k;
        cr_assert_eq(mt_remat_policy_parse(t[i].name, &k), MT_OK);
        mt_remat_policy p;
        cr_assert_eq(mt_remat_policy_resolve(k, NULL, &p), MT_OK);
        cr_expect_eq(p.action[MT_RT_DECODER_LAYER_INPUT], MT_RA_DEVICE);
        for (int r = 1; r < MT_RT_COUNT; r++) {
            char word[32];
            snprintf(word, sizeof word, "%s", mt_remat_tensor_name((mt_remat_tensor)r));
            int listed = 0;
            char kept[256];
            snprintf(kept, sizeof kept, "%s", t[i].kept);
            for (char *tok = strtok(kept, " "); tok; tok = strtok(NULL, " ")) listed |= strcmp(tok, word) == 0;
            cr_expect_eq(p.action[r], listed ? MT_RA_DEVICE : MT_RA_REMAT, "%s: %s", t[i].name, word);
        }
    }
    mt_remat_policy p;
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_QKV_PROJ_OFFLOADED, NULL, &p), MT_OK);
    cr_expect(p.action[MT_RT_QUERY_PROJ] == MT_RA_OFFLOAD && p.action[MT_RT_KEY_PROJ] == MT_RA_OFFLOAD &&
              p.action[MT_RT_VALUE_PROJ] == MT_RA_OFFLOAD && p.action[MT_RT_CONTEXT] == MT_RA_REMAT &&
              p.action[MT_RT_MLPWI_0] == MT_RA_REMAT);
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_MINIMAL_OFFLOADED, NULL, &p), MT_OK);
    for (int r = 1; r < MT_RT_COUNT; r++)
        cr_expect_eq(p.action[r], r == MT_RT_CONTEXT ? MT_RA_REMAT : MT_RA_OFFLOAD, "minimal_offloaded %d", r);
    /* custom defaults: everything remat but the layer input */
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_CUSTOM, NULL, &p), MT_OK);
    for (int r = 1; r < MT_RT_COUNT; r++) cr_expect_eq(p.action[r], MT_RA_REMAT);
}

Test(remat, bad_names_rejected) {
    mt_remat_tensor t;
    mt_remat_action a;
    mt_remat_policy_kind k;
    cr_expect_eq(mt_remat_tensor_parse("query_projection", &t), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "query_projection") != NULL, "%s", mt_last_error());
    cr_expect_eq(mt_remat_action_parse("keep", &a), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "keep") != NULL, "%s", mt_last_error());
    cr_expect_eq(mt_remat_policy_parse("minimal_flash", &k), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "minimal_flash") != NULL, "%s", mt_last_error());
    mt_remat_action acts[MT_RT_COUNT];
    for (int i = 0; i < MT_RT_COUNT; i++) acts[i] = MT_RA_REMAT;
    mt_remat_policy p;
    cr_expect_eq(mt_remat_policy_resolve(MT_REMAT_CUSTOM, acts, &p), MT_ERR_INVALID,
                 "decoder_layer_input=remat must be refused");
    cr_expect(strstr(mt_last_error(), "decoder_layer_input") != NULL, "%s", mt_last_error());
}
