/* tests/test_checkpoint.c: model checkpoints (safetensors + HF config.json).
 *
 * - save a tiny model, load it into a differently initialised one: bitwise equal
 *   (F32), or equal to round-to-nearest-even bf16 of the original (BF16);
 * - sharded checkpoints via model.safetensors.index.json;
 * - missing tensor, shape mismatch, unknown tensor, NaN: errors naming them;
 *   ignorable extras (rotary inv_freq; lm_head.weight of a tied model) accepted;
 * - config.json round trips for llama3 (rope llama3), gemma, gemma2, gemma3, and
 *   hand-written files in the published shapes (gemma3 nested text_config, the newer
 *   rope_parameters), whose expected values come from the published configs and the
 *   transformers config-class defaults, not from the code. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "runtime/plan.h"

static char g_dir[TU_TMPDIR_LEN];

static void setup(void) { tu_tmpdir_create(g_dir, "mt_ckpt"); }
static void teardown(void) { tu_tmpdir_remove(g_dir); }

TestSuite(checkpoint, .init = setup, .fini = teardown);
TestSuite(hf_config, .init = setup, .fini = teardown);

/* Paths live in a ring of 32 buffers: copy one that must outlive 31 more calls. */
static char *path_in(const char *name) { return tu_path_in(g_dir, name); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

/* ---------------------------------------------------------------- tiny models */

static mt_model_config tiny_llama(void) { return tu_model_shape(MT_DECODER_LLAMA2, 64, 16, 4, 2, 4, 24, 2); }

static mt_model_config tiny_gemma3(void) {
    mt_model_config c = tu_model_shape(MT_DECODER_GEMMA3, 48, 16, 2, 1, 8, 32, 2);
    c.sliding_window_size = 4;
    c.sliding_window_pattern = 2;
    c.local_rope_max_timescale = 20000.0f; /* not the default: the round trip must carry it */
    c.query_pre_attn_scalar = 8.0f;        /* HF needs a number; 0 (= head_dim) is written as 8 */
    return c;
}

typedef struct fixture {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
} fixture;

static void fx_init(fixture *f, const mt_model_config *c, uint64_t seed) {
    memset(f, 0, sizeof *f);
    mt_backend *be = mt_cpu_backend();
    cr_assert_eq(mt_model_create(&f->m, c, be, 1, 4, 1, NULL), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_new(&f->plan), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(f->m, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_finalize(f->plan), MT_OK);
    cr_assert_eq(mt_backend_arena_create(be, &f->arena, f->plan), MT_OK);
    cr_assert_eq(mt_model_bind(f->m, &f->arena, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_init_params(f->m, seed), MT_OK);
    /* Norm scales start constant (1 or 0): give them distinct values so a swap shows. */
    float *p = mt_model_params(f->m);
    for (int i = 0; i < mt_model_param_count(f->m); i++) {
        const mt_param_info *pi = mt_model_param(f->m, i);
        if (pi->ndim == 1)
            for (int64_t j = 0; j < pi->numel; j++) p[pi->offset + j] += 0.01f * (float)(j + 1) * (float)(seed + (uint64_t)i);
    }
}

static void fx_free(fixture *f) {
    mt_arena_destroy(&f->arena);
    mt_plan_free(f->plan);
    mt_model_free(f->m);
}

/* Write the model's parameters as a safetensors file with edits: skip tensor `skip`,
 * transpose tensor `transpose`, add `extra` names (float [2]), poison tensor `nan`. */
typedef struct edits {
    const char *skip, *transpose, *nan;
    const char *extra[3];
} edits;

static void write_edited(const char *path, mt_model *m, edits e) {
    int n = mt_model_param_count(m);
    mt_st_write_tensor t[64];
    static const float two[2] = {1.0f, 2.0f};
    float *p = mt_model_params(m);
    float *poisoned = NULL;
    int k = 0;
    for (int i = 0; i < n; i++) {
        const mt_param_info *pi = mt_model_param(m, i);
        if (e.skip && strcmp(pi->name, e.skip) == 0) continue;
        t[k] = (mt_st_write_tensor){pi->name, MT_F32, pi->ndim, {pi->shape[0], pi->shape[1]}, p + pi->offset};
        if (e.transpose && strcmp(pi->name, e.transpose) == 0) {
            t[k].shape[0] = pi->shape[1];
            t[k].shape[1] = pi->shape[0];
        }
        if (e.nan && strcmp(pi->name, e.nan) == 0) {
            poisoned = malloc((size_t)pi->numel * 4);
            memcpy(poisoned, p + pi->offset, (size_t)pi->numel * 4);
            poisoned[pi->numel - 1] = NAN;
            t[k].data = poisoned;
        }
        k++;
    }
    for (int j = 0; j < 3 && e.extra[j]; j++) t[k++] = (mt_st_write_tensor){e.extra[j], MT_F32, 1, {2}, two};
    cr_assert_eq(mt_safetensors_write(path, t, k, NULL), MT_OK, "%s", mt_last_error());
    free(poisoned);
}

static void expect_params_equal(mt_model *a, mt_model *b) {
    cr_assert_eq(mt_model_numel(a), mt_model_numel(b));
    cr_assert_eq(memcmp(mt_model_params(a), mt_model_params(b), (size_t)mt_model_numel(a) * 4), 0,
                 "parameters differ after load");
}

static void expect_load_fails(const char *dir, mt_model *m, const char *n1, const char *n2, const char *n3) {
    int64_t n = mt_model_numel(m);
    float *before = malloc((size_t)n * 4);
    memcpy(before, mt_model_params(m), (size_t)n * 4);
    mt_status s = mt_checkpoint_load_model(dir, m);
    cr_assert_eq(s, MT_ERR_FORMAT, "status %d: %s", s, mt_last_error());
    if (n1) cr_assert(strstr(mt_last_error(), n1), "message lacks '%s': %s", n1, mt_last_error());
    if (n2) cr_assert(strstr(mt_last_error(), n2), "message lacks '%s': %s", n2, mt_last_error());
    if (n3) cr_assert(strstr(mt_last_error(), n3), "message lacks '%s': %s", n3, mt_last_error());
    cr_assert_eq(memcmp(before, mt_model_params(m), (size_t)n * 4), 0, "failed load changed the model");
    free(before);
}

static void expect_config_equal(const mt_model_config *a, const mt_model_config *b);

/* ---------------------------------------------------------------- weights */

Test(checkpoint, save_load_f32_bitwise_llama_and_gemma3) {
    mt_model_config cs[2] = {tiny_llama(), tiny_gemma3()};
    for (int k = 0; k < 2; k++) {
        fixture a, b;
        fx_init(&a, &cs[k], 1);
        fx_init(&b, &cs[k], 2);
        cr_assert_neq(memcmp(mt_model_params(a.m), mt_model_params(b.m), (size_t)mt_model_numel(a.m) * 4), 0);
        char *dir = path_in(k ? "g3/step_1" : "llama/step_1"); /* parents created too */
        cr_assert_eq(mt_checkpoint_save_model(dir, a.m, MT_F32), MT_OK, "%s", mt_last_error());
        cr_assert_eq(mt_checkpoint_load_model(dir, b.m), MT_OK, "%s", mt_last_error());
        expect_params_equal(a.m, b.m);

        /* The file has HF names, F32, and the config reads back as the model's. */
        char p[300];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        mt_safetensors *f;
        cr_assert_eq(mt_safetensors_open(&f, p), MT_OK);
        cr_assert_eq(mt_safetensors_count(f), mt_model_param_count(a.m));
        int e = mt_safetensors_find(f, "model.embed_tokens.weight");
        cr_assert_geq(e, 0);
        cr_assert_eq(mt_safetensors_tensor(f, e)->dtype, MT_F32);
        cr_assert_eq(mt_safetensors_tensor(f, e)->shape[0], cs[k].vocab_size);
        cr_assert_eq(mt_safetensors_tensor(f, e)->shape[1], cs[k].emb_dim);
        cr_assert_geq(mt_safetensors_find(f, "model.layers.1.mlp.down_proj.weight"), 0);
        cr_assert_eq(mt_safetensors_find(f, "lm_head.weight") >= 0, k == 0, "lm_head only when untied");
        if (k == 1) cr_assert_geq(mt_safetensors_find(f, "model.layers.0.self_attn.q_norm.weight"), 0);
        cr_assert_str_eq(mt_safetensors_metadata(f, "format"), "pt");
        mt_safetensors_close(f);
        snprintf(p, sizeof p, "%s/config.json", dir);
        mt_model_config back;
        cr_assert_eq(mt_hf_config_read(p, &back), MT_OK, "%s", mt_last_error());
        expect_config_equal(&back, &cs[k]);
        fx_free(&a);
        fx_free(&b);
    }
}

Test(checkpoint, save_bf16_rounds_to_nearest_even) {
    mt_model_config c = tiny_llama();
    fixture a, b;
    fx_init(&a, &c, 3);
    fx_init(&b, &c, 4);
    char *dir = path_in("bf16");
    cr_assert_eq(mt_checkpoint_save_model(dir, a.m, MT_BF16), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_checkpoint_load_model(dir, b.m), MT_OK, "%s", mt_last_error());
    const float *pa = mt_model_params(a.m), *pb = mt_model_params(b.m);
    for (int64_t i = 0; i < mt_model_numel(a.m); i++) {
        /* bf16 keeps the top 16 bits, rounded to nearest even (dtype.h, checked in
         * its own tests): the loaded value must be exactly that. */
        float want = mt_bf16_to_f32(mt_f32_to_bf16(pa[i]));
        cr_assert_eq(pb[i], want, "element %lld: %g vs %g", (long long)i, pb[i], want);
    }
    cr_assert_eq(mt_checkpoint_save_model(dir, a.m, MT_F16), MT_ERR_INVALID);
    fx_free(&a);
    fx_free(&b);
}

Test(checkpoint, sharded_index) {
    mt_model_config c = tiny_llama();
    fixture a, b;
    fx_init(&a, &c, 5);
    fx_init(&b, &c, 6);
    /* Shard 1: embeddings + layer 0; shard 2: the rest; plus an ignorable buffer. */
    mt_model *m = a.m;
    mt_st_write_tensor t1[32], t2[32];
    int n1 = 0, n2 = 0;
    cJSON *idx = cJSON_CreateObject();
    cJSON_AddObjectToObject(idx, "metadata");
    cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int i = 0; i < mt_model_param_count(m); i++) {
        const mt_param_info *pi = mt_model_param(m, i);
        mt_st_write_tensor t = {pi->name, MT_F32, pi->ndim, {pi->shape[0], pi->shape[1]}, mt_model_params(m) + pi->offset};
        int first = strstr(pi->name, "embed") || strstr(pi->name, "layers.0.");
        if (first) t1[n1++] = t;
        else t2[n2++] = t;
        cJSON_AddStringToObject(wm, pi->name, first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    }
    static const float inv[2] = {1, 0.5f};
    t2[n2++] = (mt_st_write_tensor){"model.layers.1.self_attn.rotary_emb.inv_freq", MT_F32, 1, {2}, inv};
    cJSON_AddStringToObject(wm, "model.layers.1.self_attn.rotary_emb.inv_freq", "model-00002-of-00002.safetensors");
    cr_assert_gt(n1, 0);
    cr_assert_gt(n2, 1);
    char dir[256];
    strcpy(dir, path_in("sharded"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    cr_assert_eq(mt_safetensors_write(path_in("sharded/model-00001-of-00002.safetensors"), t1, n1, NULL), MT_OK);
    cr_assert_eq(mt_safetensors_write(path_in("sharded/model-00002-of-00002.safetensors"), t2, n2, NULL), MT_OK);
    char *text = cJSON_Print(idx);
    write_text(path_in("sharded/model.safetensors.index.json"), text);
    cr_assert_eq(mt_checkpoint_load_model(dir, b.m), MT_OK, "%s", mt_last_error());
    expect_params_equal(a.m, b.m);
    free(text);

    /* The same tensor in both shards. */
    fx_free(&b);
    fx_init(&b, &c, 6);
    t2[n2++] = t1[0];
    cr_assert_eq(mt_safetensors_write(path_in("sharded/model-00002-of-00002.safetensors"), t2, n2, NULL), MT_OK);
    expect_load_fails(dir, b.m, t1[0].name, "twice", NULL);
    n2--;
    cr_assert_eq(mt_safetensors_write(path_in("sharded/model-00002-of-00002.safetensors"), t2, n2, NULL), MT_OK);

    /* A weight_map that points a tensor at the wrong shard. */
    fx_free(&b);
    fx_init(&b, &c, 6);
    cJSON_ReplaceItemInObject(wm, "model.norm.weight", cJSON_CreateString("model-00001-of-00002.safetensors"));
    text = cJSON_Print(idx);
    write_text(path_in("sharded/model.safetensors.index.json"), text);
    free(text);
    expect_load_fails(dir, b.m, "model.norm.weight", "weight_map", NULL);
    /* A weight_map naming a file that is not there. */
    cJSON_ReplaceItemInObject(wm, "model.norm.weight", cJSON_CreateString("model-00003-of-00002.safetensors"));
    text = cJSON_Print(idx);
    write_text(path_in("sharded/model.safetensors.index.json"), text);
    free(text);
    cr_assert_eq(mt_checkpoint_load_model(dir, b.m), MT_ERR_IO);
    cr_assert(strstr(mt_last_error(), "model-00003-of-00002.safetensors"), "%s", mt_last_error());
    /* A path outside the directory. */
    cJSON_ReplaceItemInObject(wm, "model.norm.weight", cJSON_CreateString("../x.safetensors"));
    text = cJSON_Print(idx);
    write_text(path_in("sharded/model.safetensors.index.json"), text);
    free(text);
    expect_load_fails(dir, b.m, "model.norm.weight", NULL, NULL);
    cJSON_Delete(idx);
    fx_free(&a);
    fx_free(&b);
}

Test(checkpoint, missing_shape_unknown_nan) {
    mt_model_config c = tiny_llama();
    fixture a, b;
    fx_init(&a, &c, 7);
    fx_init(&b, &c, 8);
    char dir[256];
    strcpy(dir, path_in("bad"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    char *file = path_in("bad/model.safetensors");

    write_edited(file, a.m, (edits){.skip = "model.layers.1.self_attn.k_proj.weight"});
    /* k_proj is [Hkv * Dh, D] = [8, 16] */
    expect_load_fails(dir, b.m, "model.layers.1.self_attn.k_proj.weight", "missing", "[8, 16]");

    write_edited(file, a.m, (edits){.skip = "lm_head.weight"});
    expect_load_fails(dir, b.m, "lm_head.weight", "missing", "[64, 16]");

    /* gate_proj is [F, D] = [24, 16]; stored transposed. */
    write_edited(file, a.m, (edits){.transpose = "model.layers.0.mlp.gate_proj.weight"});
    expect_load_fails(dir, b.m, "model.layers.0.mlp.gate_proj.weight", "[16, 24]", "[24, 16]");

    write_edited(file, a.m, (edits){.extra = {"model.layers.0.self_attn.q_proj.bias", "vision_tower.x"}});
    expect_load_fails(dir, b.m, "model.layers.0.self_attn.q_proj.bias", "vision_tower.x", NULL);

    write_edited(file, a.m, (edits){.nan = "model.norm.weight"});
    mt_status s = mt_checkpoint_load_model(dir, b.m);
    cr_assert_eq(s, MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_error(), "model.norm.weight") && strstr(mt_last_error(), "NaN"), "%s", mt_last_error());

    /* Ignorable extras load fine. */
    write_edited(file, a.m, (edits){.extra = {"model.layers.0.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq"}});
    cr_assert_eq(mt_checkpoint_load_model(dir, b.m), MT_OK, "%s", mt_last_error());
    expect_params_equal(a.m, b.m);

    /* No checkpoint at all. */
    cr_assert_eq(mt_checkpoint_load_model(path_in("none"), b.m), MT_ERR_IO);
    cr_assert(strstr(mt_last_error(), "model.safetensors"), "%s", mt_last_error());
    fx_free(&a);
    fx_free(&b);
}

Test(checkpoint, tied_model_ignores_stored_lm_head) {
    mt_model_config c = tiny_gemma3();
    fixture a, b;
    fx_init(&a, &c, 9);
    fx_init(&b, &c, 10);
    cr_assert_lt(mt_model_param_find(a.m, "lm_head.weight"), 0, "tied model has no lm_head parameter");
    char *dir = path_in("tied");
    cr_assert_eq(mkdir(dir, 0755), 0);
    write_edited(path_in("tied/model.safetensors"), a.m, (edits){.extra = {"lm_head.weight"}});
    cr_assert_eq(mt_checkpoint_load_model(dir, b.m), MT_OK, "%s", mt_last_error());
    expect_params_equal(a.m, b.m);
    /* ...but an untied model given a gemma3 file misses lm_head and has unknown norms. */
    mt_model_config l = tiny_llama();
    fixture u;
    fx_init(&u, &l, 11);
    cr_assert_eq(mt_checkpoint_load_model(dir, u.m), MT_ERR_FORMAT);
    fx_free(&u);
    fx_free(&a);
    fx_free(&b);
}

/* ---------------------------------------------------------------- config.json */

static void expect_config_equal(const mt_model_config *a, const mt_model_config *b) {
    cr_assert_eq(a->decoder_block, b->decoder_block);
    cr_assert_eq(a->vocab_size, b->vocab_size);
    cr_assert_eq(a->emb_dim, b->emb_dim);
    cr_assert_eq(a->num_query_heads, b->num_query_heads);
    cr_assert_eq(a->num_kv_heads, b->num_kv_heads);
    cr_assert_eq(a->head_dim, b->head_dim);
    cr_assert_eq(a->mlp_dim, b->mlp_dim);
    cr_assert_eq(a->num_decoder_layers, b->num_decoder_layers);
    cr_assert_eq(a->mlp_activation, b->mlp_activation);
    cr_assert_eq(a->normalization_layer_epsilon, b->normalization_layer_epsilon);
    cr_assert_eq(a->logits_via_embedding, b->logits_via_embedding);
    cr_assert_eq(a->final_logits_soft_cap, b->final_logits_soft_cap);
    cr_assert_eq(a->attn_logits_soft_cap, b->attn_logits_soft_cap);
    cr_assert_eq(a->sliding_window_size, b->sliding_window_size);
    cr_assert_eq(a->sliding_window_pattern, b->sliding_window_pattern, "%lld vs %lld",
                 (long long)a->sliding_window_pattern, (long long)b->sliding_window_pattern);
    cr_assert_eq(a->query_pre_attn_scalar, b->query_pre_attn_scalar);
    cr_assert_eq(a->rope_max_timescale, b->rope_max_timescale);
    cr_assert_eq(a->rope_type, b->rope_type);
    if (a->rope_type != MT_ROPE_DEFAULT) cr_assert_eq(a->rope_factor, b->rope_factor);
    if (a->rope_type == MT_ROPE_LLAMA3) {
        cr_assert_eq(a->rope_low_freq_factor, b->rope_low_freq_factor);
        cr_assert_eq(a->rope_high_freq_factor, b->rope_high_freq_factor);
        cr_assert_eq(a->rope_original_max_position, b->rope_original_max_position);
    }
    cr_assert_eq(a->local_rope_max_timescale, b->local_rope_max_timescale);
    cr_assert_eq(a->use_qk_norm, b->use_qk_norm);
    cr_assert_eq(a->use_post_attn_norm, b->use_post_attn_norm);
    cr_assert_eq(a->use_post_ffw_norm, b->use_post_ffw_norm);
}

static cJSON *load_json(const char *path) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    cr_assert_not_null(j, "written config.json is not JSON");
    return j;
}

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsString(v), "key %s missing", k);
    return v->valuestring;
}

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsNumber(v), "key %s missing", k);
    return v->valuedouble;
}

Test(hf_config, llama3_round_trip) {
    /* Llama 3.1 8B (published config.json). */
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_LLAMA2);
    c.vocab_size = 128256;
    c.emb_dim = 4096;
    c.num_query_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.mlp_dim = 14336;
    c.num_decoder_layers = 32;
    c.rope_max_timescale = 500000.0f;
    c.rope_type = MT_ROPE_LLAMA3;
    c.rope_factor = 8;
    c.rope_low_freq_factor = 1;
    c.rope_high_freq_factor = 4;
    c.rope_original_max_position = 8192;
    c.normalization_layer_epsilon = 1e-5f;
    char *p = path_in("llama.json");
    cr_assert_eq(mt_hf_config_write(p, &c), MT_OK, "%s", mt_last_error());
    mt_model_config back;
    cr_assert_eq(mt_hf_config_read(p, &back), MT_OK, "%s", mt_last_error());
    expect_config_equal(&c, &back);

    /* The field names and values transformers expects. */
    cJSON *j = load_json(p);
    cr_assert_str_eq(jstr(j, "model_type"), "llama");
    cr_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "architectures"), 0)->valuestring, "LlamaForCausalLM");
    cr_assert_str_eq(jstr(j, "hidden_act"), "silu");
    cr_assert_eq(jnum(j, "hidden_size"), 4096);
    cr_assert_eq(jnum(j, "num_key_value_heads"), 8);
    cr_assert_eq(jnum(j, "rope_theta"), 500000.0);
    cr_assert_eq(jnum(j, "rms_norm_eps"), 1e-5, "eps must be written as the decimal 1e-05");
    cr_assert_eq(jnum(j, "max_position_embeddings"), 131072);
    cr_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "tie_word_embeddings")));
    const cJSON *rs = cJSON_GetObjectItem(j, "rope_scaling");
    cr_assert_str_eq(jstr(rs, "rope_type"), "llama3");
    cr_assert_eq(jnum(rs, "factor"), 8.0);
    cr_assert_eq(jnum(rs, "low_freq_factor"), 1.0);
    cr_assert_eq(jnum(rs, "high_freq_factor"), 4.0);
    cr_assert_eq(jnum(rs, "original_max_position_embeddings"), 8192);
    cJSON_Delete(j);
}

Test(hf_config, gemma_family_round_trips) {
    /* gemma-2b, gemma2-2b, gemma3-4b dimensions (their published config.json), with their families'
     * defaults from mt_model_config_defaults. */
    mt_model_config c[3];
    mt_model_config_defaults(&c[0], MT_DECODER_GEMMA);
    c[0].vocab_size = 256000, c[0].emb_dim = 2048, c[0].num_query_heads = 8, c[0].num_kv_heads = 1;
    c[0].head_dim = 256, c[0].mlp_dim = 16384, c[0].num_decoder_layers = 18;
    mt_model_config_defaults(&c[1], MT_DECODER_GEMMA2);
    c[1].vocab_size = 256000, c[1].emb_dim = 2304, c[1].num_query_heads = 8, c[1].num_kv_heads = 4;
    c[1].head_dim = 256, c[1].mlp_dim = 9216, c[1].num_decoder_layers = 26, c[1].query_pre_attn_scalar = 256;
    mt_model_config_defaults(&c[2], MT_DECODER_GEMMA3);
    c[2].vocab_size = 262208, c[2].emb_dim = 2560, c[2].num_query_heads = 8, c[2].num_kv_heads = 4;
    c[2].head_dim = 256, c[2].mlp_dim = 10240, c[2].num_decoder_layers = 34, c[2].query_pre_attn_scalar = 256;
    static const char *const types[3] = {"gemma", "gemma2", "gemma3_text"};
    for (int k = 0; k < 3; k++) {
        char *p = path_in(types[k]);
        cr_assert_eq(mt_hf_config_write(p, &c[k]), MT_OK, "%s", mt_last_error());
        mt_model_config back;
        cr_assert_eq(mt_hf_config_read(p, &back), MT_OK, "%s: %s", types[k], mt_last_error());
        expect_config_equal(&c[k], &back);
        cJSON *j = load_json(p);
        cr_assert_str_eq(jstr(j, "model_type"), types[k]);
        cr_assert_str_eq(jstr(j, "hidden_activation"), "gelu_pytorch_tanh");
        cr_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "tie_word_embeddings")));
        cr_assert_eq(jnum(j, "rms_norm_eps"), 1e-6);
        if (k == 1) {
            cr_assert_eq(jnum(j, "sliding_window"), 4096);
            cr_assert_eq(jnum(j, "attn_logit_softcapping"), 50.0);
            cr_assert_eq(jnum(j, "final_logit_softcapping"), 30.0);
            cr_assert_eq(jnum(j, "query_pre_attn_scalar"), 256);
            const cJSON *lt = cJSON_GetObjectItem(j, "layer_types");
            cr_assert_eq(cJSON_GetArraySize(lt), 26);
            cr_assert_str_eq(cJSON_GetArrayItem(lt, 0)->valuestring, "sliding_attention");
            cr_assert_str_eq(cJSON_GetArrayItem(lt, 1)->valuestring, "full_attention");
        }
        if (k == 2) {
            cr_assert_eq(jnum(j, "sliding_window"), 1024);
            cr_assert_eq(jnum(j, "sliding_window_pattern"), 6);
            cr_assert_eq(jnum(j, "rope_theta"), 1000000.0);
            cr_assert_eq(jnum(j, "rope_local_base_freq"), 10000.0);
            const cJSON *rs = cJSON_GetObjectItem(j, "rope_scaling");
            cr_assert_str_eq(jstr(rs, "rope_type"), "linear");
            cr_assert_eq(jnum(rs, "factor"), 8.0);
            cr_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "final_logit_softcapping")));
            const cJSON *lt = cJSON_GetObjectItem(j, "layer_types");
            cr_assert_str_eq(cJSON_GetArrayItem(lt, 4)->valuestring, "sliding_attention");
            cr_assert_str_eq(cJSON_GetArrayItem(lt, 5)->valuestring, "full_attention");
        }
        cJSON_Delete(j);
    }
}

Test(hf_config, gemma3_nested_text_config) {
    /* The shape of google/gemma-3-4b-it's config.json: most text fields omitted and
     * taken from Gemma3TextConfig's defaults (vocab 262208, 8 heads / 4 kv, head_dim
     * 256, rope_theta 1e6, rope_local_base_freq 1e4, query_pre_attn_scalar 256,
     * sliding_window_pattern 6, eps 1e-6, tied, no soft-caps). */
    char *p = path_in("g3.json");
    write_text(p, "{\n"
                  "  \"architectures\": [\"Gemma3ForConditionalGeneration\"],\n"
                  "  \"model_type\": \"gemma3\",\n"
                  "  \"mm_tokens_per_image\": 256,\n"
                  "  \"text_config\": {\n"
                  "    \"hidden_size\": 2560,\n"
                  "    \"intermediate_size\": 10240,\n"
                  "    \"model_type\": \"gemma3_text\",\n"
                  "    \"num_hidden_layers\": 34,\n"
                  "    \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"},\n"
                  "    \"sliding_window\": 1024\n"
                  "  },\n"
                  "  \"torch_dtype\": \"bfloat16\",\n"
                  "  \"vision_config\": {\"hidden_size\": 1152, \"model_type\": \"siglip_vision_model\"}\n"
                  "}\n");
    mt_model_config c;
    cr_assert_eq(mt_hf_config_read(p, &c), MT_OK, "%s", mt_last_error());
    cr_assert_eq(c.decoder_block, MT_DECODER_GEMMA3);
    cr_assert_eq(c.vocab_size, 262208);
    cr_assert_eq(c.emb_dim, 2560);
    cr_assert_eq(c.mlp_dim, 10240);
    cr_assert_eq(c.num_decoder_layers, 34);
    cr_assert_eq(c.num_query_heads, 8);
    cr_assert_eq(c.num_kv_heads, 4);
    cr_assert_eq(c.head_dim, 256);
    cr_assert_eq(c.sliding_window_size, 1024);
    cr_assert_eq(c.sliding_window_pattern, 6);
    cr_assert_eq(c.rope_max_timescale, 1e6f);
    cr_assert_eq(c.rope_type, MT_ROPE_LINEAR);
    cr_assert_eq(c.rope_factor, 8.0f);
    cr_assert_eq(c.local_rope_max_timescale, 1e4f);
    cr_assert_eq(c.query_pre_attn_scalar, 256.0f);
    cr_assert_eq(c.normalization_layer_epsilon, 1e-6f);
    cr_assert_eq(c.final_logits_soft_cap, 0.0f);
    cr_assert_eq(c.attn_logits_soft_cap, 0.0f);
    cr_assert_eq(c.mlp_activation, MT_ACT_GELU_TANH);
    cr_assert(c.logits_via_embedding && c.use_qk_norm && c.use_post_attn_norm && c.use_post_ffw_norm);
    cr_assert_eq(mt_model_config_validate(&c), MT_OK, "%s", mt_last_error());
}

Test(hf_config, rope_parameters_files) {
    /* transformers v5 style: rope_parameters instead of rope_theta + rope_scaling. */
    char *p = path_in("l.json");
    write_text(p, "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 2048,"
                  " \"intermediate_size\": 8192, \"num_hidden_layers\": 16, \"num_attention_heads\": 32,"
                  " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": true,"
                  " \"some_future_key\": {\"x\": [1, 2]},"
                  " \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0,"
                  " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}");
    mt_model_config c;
    cr_assert_eq(mt_hf_config_read(p, &c), MT_OK, "%s", mt_last_error());
    cr_assert_eq(c.decoder_block, MT_DECODER_LLAMA2);
    cr_assert_eq(c.head_dim, 64, "head_dim absent: hidden_size / heads");
    cr_assert_eq(c.rope_max_timescale, 500000.0f);
    cr_assert_eq(c.rope_type, MT_ROPE_LLAMA3);
    cr_assert_eq(c.rope_factor, 32.0f);
    cr_assert_eq(c.rope_low_freq_factor, 1.0f);
    cr_assert_eq(c.rope_high_freq_factor, 4.0f);
    cr_assert_eq(c.rope_original_max_position, 8192);
    cr_assert_eq(c.normalization_layer_epsilon, 1e-5f);
    cr_assert_eq(c.logits_via_embedding, 1);
    cr_assert_eq(c.mlp_activation, MT_ACT_SILU);

    /* Gemma 3 with one rope block per attention type, and layer_types. */
    p = path_in("g.json");
    write_text(p, "{\"model_type\": \"gemma3_text\", \"vocab_size\": 262144, \"hidden_size\": 640,"
                  " \"intermediate_size\": 2048, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
                  " \"num_key_value_heads\": 1, \"head_dim\": 256, \"sliding_window\": 512,"
                  " \"layer_types\": [\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"],"
                  " \"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 4.0, \"rope_theta\": 1000000.0},"
                  " \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 20000.0}}}");
    cr_assert_eq(mt_hf_config_read(p, &c), MT_OK, "%s", mt_last_error());
    cr_assert_eq(c.sliding_window_size, 512);
    cr_assert_eq(c.sliding_window_pattern, 2);
    cr_assert_eq(c.rope_type, MT_ROPE_LINEAR);
    cr_assert_eq(c.rope_factor, 4.0f);
    cr_assert_eq(c.rope_max_timescale, 1e6f);
    cr_assert_eq(c.local_rope_max_timescale, 20000.0f);
    cr_assert(mt_model_layer_is_local(&c, 0) && !mt_model_layer_is_local(&c, 1) && mt_model_layer_is_local(&c, 2));
}

static void expect_read_fails(const char *name, const char *text, mt_status want, const char *needle) {
    char *p = path_in(name);
    write_text(p, text);
    mt_model_config c;
    mt_status s = mt_hf_config_read(p, &c);
    cr_assert_eq(s, want, "%s: status %d (%s)", name, s, mt_last_error());
    cr_assert(strstr(mt_last_error(), p), "message does not name the file: %s", mt_last_error());
    if (needle) cr_assert(strstr(mt_last_error(), needle), "message lacks '%s': %s", needle, mt_last_error());
}

Test(hf_config, bad_values) {
    expect_read_fails("a.json", "{\"model_type\": \"llama\", \"hidden_size\": \"big\"}", MT_ERR_FORMAT, "hidden_size");
    expect_read_fails("b.json", "{\"model_type\": \"llama\", \"num_attention_heads\": 0}", MT_ERR_FORMAT,
                      "num_attention_heads");
    expect_read_fails("c.json", "{\"model_type\": \"llama\", \"head_dim\": 12.5}", MT_ERR_FORMAT, "head_dim");
    expect_read_fails("d.json", "{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
                      MT_ERR_FORMAT, "yarn");
    expect_read_fails("e.json", "{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}}",
                      MT_ERR_FORMAT, "low_freq_factor");
    expect_read_fails("f.json", "{\"model_type\": \"mistral\"}", MT_ERR_FORMAT, "mistral");
    expect_read_fails("g.json", "{\"hidden_size\": 8}", MT_ERR_FORMAT, "model_type");
    expect_read_fails("h.json", "{\"model_type\": \"llama\",", MT_ERR_FORMAT, "JSON");
    expect_read_fails("i.json", "{\"model_type\": \"llama\", \"hidden_act\": \"relu\"}", MT_ERR_FORMAT, "hidden_act");
    expect_read_fails("j.json", "{\"model_type\": \"llama\", \"rms_norm_eps\": -1}", MT_ERR_FORMAT, "rms_norm_eps");
    expect_read_fails("k.json", "{\"model_type\": \"llama\", \"tie_word_embeddings\": 1}", MT_ERR_FORMAT,
                      "tie_word_embeddings");
    expect_read_fails("l.json", "{\"model_type\": \"llama\", \"attention_bias\": true}", MT_ERR_FORMAT, "attention_bias");
    expect_read_fails("m.json",
                      "{\"model_type\": \"gemma2\", \"num_hidden_layers\": 3, \"layer_types\": "
                      "[\"sliding_attention\", \"full_attention\", \"full_attention\"]}",
                      MT_ERR_FORMAT, "layer_types");
    expect_read_fails("n.json", "{\"model_type\": \"gemma2\", \"num_hidden_layers\": 3, \"layer_types\": []}",
                      MT_ERR_FORMAT, "layer_types");
    mt_model_config c;
    cr_assert_eq(mt_hf_config_read(path_in("missing.json"), &c), MT_ERR_IO);
}
