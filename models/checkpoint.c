/* models/checkpoint.c: Hugging Face checkpoints (model.safetensors + config.json).
 *
 * config.json fields and their defaults when absent follow the transformers config
 * classes (LlamaConfig, GemmaConfig, Gemma2Config, Gemma3TextConfig in
 * configuration_*.py) and modeling_rope_utils.py for rope_scaling / rope_parameters,
 * so a published config.json that omits a field means what transformers means. */
#include "models/checkpoint.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/safetensors.h"
#include "runtime/fileio.h"

/* ---------------------------------------------------------------- small helpers */

static char *ck_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

/* Read a whole (small) text file: a config or index, at most 256 MiB, no NUL byte. */
static mt_status ck_read_text(const char *path, char **out) {
    size_t len = 0;
    MT_TRY(mt_file_read_all(path, (size_t)256 << 20, out, &len));
    if (strlen(*out) != len) {
        free(*out);
        *out = NULL;
        return mt_set_error(MT_ERR_FORMAT, "%s: contains a NUL byte", path);
    }
    return MT_OK;
}

static cJSON *ck_parse_json(const char *path, const char *text, mt_status *s) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(text, &end, 1);
    if (!j) {
        *s = mt_set_error(MT_ERR_FORMAT, "%s: invalid JSON near byte %zu", path, end ? (size_t)(end - text) : 0);
        return NULL;
    }
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        *s = mt_set_error(MT_ERR_FORMAT, "%s: top level is not a JSON object", path);
        return NULL;
    }
    *s = MT_OK;
    return j;
}

static void ck_shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++) k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* ---------------------------------------------------------------- config.json write */

/* A float as the shortest decimal that reads back as the same float32, as a double
 * (so cJSON prints "1e-06", not "9.99999997e-07"). */
static double ck_short(float v) {
    char b[48];
    for (int p = 6; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)v);
        if (strtof(b, NULL) == v) break;
    }
    return strtod(b, NULL);
}

/* Add v to o as a JSON number that always carries a fraction or exponent ("8.0", not
 * "8"): transformers' rope validation warns when rope_scaling's factor,
 * low_freq_factor or high_freq_factor is a JSON integer. */
static void ck_add_real(cJSON *o, const char *key, float v) {
    char b[64];
    for (int p = 6; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)v);
        if (strtof(b, NULL) == v) break;
    }
    if (!strpbrk(b, ".eEn")) strncat(b, ".0", sizeof b - strlen(b) - 1);
    cJSON_AddRawToObject(o, key, b);
}

static const char *ck_act_name(mt_activation a) {
    return a == MT_ACT_SILU ? "silu" : "gelu_pytorch_tanh";
}

/* The Gemma 4 keys of a Gemma4ForCausalLM config.json (configuration_gemma4.py
 * Gemma4TextConfig): global_head_dim as the published files have it (transformers 5.17
 * reads it too), rope_parameters per layer type, the KV-sharing and per-layer-input
 * keys, and the features this decoder does not have written off. */
static void ck_config_write_gemma4(cJSON *j, const mt_model_config *c) {
    cJSON_AddNumberToObject(j, "global_head_dim", (double)(c->global_head_dim > 0 ? c->global_head_dim : c->head_dim));
    cJSON_AddNumberToObject(j, "num_kv_shared_layers", (double)c->num_kv_shared_layers);
    cJSON_AddBoolToObject(j, "use_double_wide_mlp", c->use_double_wide_mlp != 0);
    cJSON_AddNumberToObject(j, "hidden_size_per_layer_input", (double)c->per_layer_input_dim);
    cJSON_AddNumberToObject(j, "vocab_size_per_layer_input", (double)c->vocab_size);
    cJSON_AddBoolToObject(j, "attention_k_eq_v", 0);
    cJSON_AddBoolToObject(j, "enable_moe_block", 0);
    cJSON_AddNullToObject(j, "use_bidirectional_attention");
    cJSON *rp = cJSON_AddObjectToObject(j, "rope_parameters");
    cJSON *full = cJSON_AddObjectToObject(rp, "full_attention");
    cJSON_AddStringToObject(full, "rope_type", c->rope_type == MT_ROPE_PROPORTIONAL ? "proportional" : "default");
    ck_add_real(full, "rope_theta", c->rope_max_timescale);
    if (c->rope_type == MT_ROPE_PROPORTIONAL) {
        ck_add_real(full, "partial_rotary_factor", c->rope_partial_rotary_factor);
        /* read by _compute_proportional_rope_parameters, but 5.17's rope validation
         * warns about it: written only when it is not the default 1 */
        if (c->rope_factor != 1.0f) ck_add_real(full, "factor", c->rope_factor);
    }
    cJSON *slide = cJSON_AddObjectToObject(rp, "sliding_attention");
    cJSON_AddStringToObject(slide, "rope_type", "default");
    ck_add_real(slide, "rope_theta", c->local_rope_max_timescale > 0 ? c->local_rope_max_timescale : c->rope_max_timescale);
}

static mt_status ck_config_write(const char *path, const mt_model_config *c, const char *torch_dtype) {
    static const char *const types[] = {"llama", "gemma", "gemma2", "gemma3_text", "gemma4_text"};
    static const char *const archs[] = {"LlamaForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM",
                                        "Gemma3ForCausalLM", "Gemma4ForCausalLM"};
    int b = (int)c->decoder_block;
    if (b < 0 || b > 4) return mt_set_error(MT_ERR_INVALID, "%s: unknown decoder_block %d", path, b);
    if (b == MT_DECODER_GEMMA4 && c->rope_type != MT_ROPE_DEFAULT && c->rope_type != MT_ROPE_PROPORTIONAL)
        return mt_set_error(MT_ERR_INVALID, "%s: gemma4 with rope_type %d has no config.json form", path,
                            (int)c->rope_type);
    int gemma = b != MT_DECODER_LLAMA2;
    int g4 = b == MT_DECODER_GEMMA4;
    int local_attn = b == MT_DECODER_GEMMA2 || b == MT_DECODER_GEMMA3 || g4;
    cJSON *j = cJSON_CreateObject();
    cJSON *ar = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(archs[b]));
    cJSON_AddStringToObject(j, "model_type", types[b]);
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", (double)c->emb_dim);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)c->mlp_dim);
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->num_decoder_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->num_query_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->num_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", (double)c->head_dim);
    cJSON_AddStringToObject(j, "hidden_act", ck_act_name(c->mlp_activation));
    if (gemma) cJSON_AddStringToObject(j, "hidden_activation", ck_act_name(c->mlp_activation));
    cJSON_AddNumberToObject(j, "rms_norm_eps", ck_short(c->normalization_layer_epsilon));
    if (g4) {
        ck_config_write_gemma4(j, c);
    } else {
    cJSON_AddNumberToObject(j, "rope_theta", ck_short(c->rope_max_timescale));
    if (c->rope_type == MT_ROPE_LLAMA3) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", "llama3");
        ck_add_real(r, "factor", c->rope_factor);
        ck_add_real(r, "low_freq_factor", c->rope_low_freq_factor);
        ck_add_real(r, "high_freq_factor", c->rope_high_freq_factor);
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", (double)c->rope_original_max_position);
    } else if (c->rope_type == MT_ROPE_LINEAR) {
        cJSON *r = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(r, "rope_type", "linear");
        ck_add_real(r, "factor", c->rope_factor);
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    }
    /* Not a field of mt_model_config: the value of the published files (Llama 3.1/3.2
     * with llama3 scaling and Gemma 3: 131072; Gemma 1/2 and Llama 3: 8192). */
    double maxpos = c->rope_type == MT_ROPE_LLAMA3 || b == MT_DECODER_GEMMA3 || g4 ? 131072.0 : 8192.0;
    cJSON_AddNumberToObject(j, "max_position_embeddings", maxpos);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->logits_via_embedding != 0);
    cJSON_AddBoolToObject(j, "attention_bias", 0);
    if (b == MT_DECODER_LLAMA2) cJSON_AddBoolToObject(j, "mlp_bias", 0);
    if (local_attn) {
        if (!g4) /* Gemma 4's scale is 1.0 with no key */
        cJSON_AddNumberToObject(j, "query_pre_attn_scalar",
                                c->query_pre_attn_scalar > 0 ? ck_short(c->query_pre_attn_scalar) : (double)c->head_dim);
        if (c->sliding_window_size > 0) cJSON_AddNumberToObject(j, "sliding_window", (double)c->sliding_window_size);
        else cJSON_AddNullToObject(j, "sliding_window");
        if (c->attn_logits_soft_cap > 0) cJSON_AddNumberToObject(j, "attn_logit_softcapping", ck_short(c->attn_logits_soft_cap));
        else if (!g4) cJSON_AddNullToObject(j, "attn_logit_softcapping");
        if (c->final_logits_soft_cap > 0 && g4) /* Gemma4TextConfig is strict: a float must look like one */
            ck_add_real(j, "final_logit_softcapping", c->final_logits_soft_cap);
        else if (c->final_logits_soft_cap > 0)
            cJSON_AddNumberToObject(j, "final_logit_softcapping", ck_short(c->final_logits_soft_cap));
        else cJSON_AddNullToObject(j, "final_logit_softcapping");
        if (b == MT_DECODER_GEMMA3) {
            cJSON_AddNumberToObject(j, "sliding_window_pattern", (double)c->sliding_window_pattern);
            cJSON_AddNumberToObject(j, "rope_local_base_freq",
                                    ck_short(c->local_rope_max_timescale > 0 ? c->local_rope_max_timescale
                                                                             : c->rope_max_timescale));
        }
        cJSON *lt = cJSON_AddArrayToObject(j, "layer_types");
        for (int64_t l = 0; l < c->num_decoder_layers; l++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(mt_model_layer_is_local(c, l) ? "sliding_attention"
                                                                                       : "full_attention"));
    }
    if (torch_dtype) cJSON_AddStringToObject(j, "torch_dtype", torch_dtype);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) return mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return mt_set_error(MT_ERR_OOM, "%s: out of memory", path);
    }
    t2[n] = '\n';
    t2[n + 1] = '\0';
    mt_status s = mt_file_write_atomic(path, t2, strlen(t2));
    free(t2);
    return s;
}

mt_status mt_hf_config_write(const char *path, const mt_model_config *c) {
    return ck_config_write(path, c, NULL);
}

/* ---------------------------------------------------------------- config.json read */

typedef struct ck_reader {
    const char *path;
    const cJSON *obj; /* the text model's object (text_config when nested) */
    const cJSON *top; /* the file's top level */
} ck_reader;

/* Look a key up in the text object, then (for nested files) at the top level. */
static const cJSON *ck_get(const ck_reader *r, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if (!v && r->obj != r->top) v = cJSON_GetObjectItemCaseSensitive(r->top, key);
    return v;
}

/* Integer >= lo; absent or null -> def. */
static mt_status ck_int(const ck_reader *r, const cJSON *o, const char *key, int64_t def, int64_t lo, int64_t *out) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : ck_get(r, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return MT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > 9007199254740992.0)
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s\" must be an integer >= %lld", r->path, key, (long long)lo);
    *out = (int64_t)v->valuedouble;
    return MT_OK;
}

/* Finite float > 0 (or >= 0 when zero_ok); absent -> def; null -> null_val. */
static mt_status ck_float(const ck_reader *r, const cJSON *o, const char *key, float def, float null_val, int zero_ok,
                          float *out) {
    const cJSON *v = o ? cJSON_GetObjectItemCaseSensitive(o, key) : ck_get(r, key);
    if (!v) {
        *out = def;
        return MT_OK;
    }
    if (cJSON_IsNull(v)) {
        *out = null_val;
        return MT_OK;
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    float f = (float)d;
    if (!isfinite(f) || f < 0 || (f == 0 && !zero_ok))
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s\" must be a finite number %s", r->path, key,
                            zero_ok ? ">= 0" : "> 0");
    *out = f;
    return MT_OK;
}

static mt_status ck_bool(const ck_reader *r, const char *key, int def, int *out) {
    const cJSON *v = ck_get(r, key);
    if (!v || cJSON_IsNull(v)) {
        *out = def;
        return MT_OK;
    }
    if (!cJSON_IsBool(v)) return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s\" must be true or false", r->path, key);
    *out = cJSON_IsTrue(v);
    return MT_OK;
}

static mt_status ck_act(const ck_reader *r, const char *key, const char *def, mt_activation *out) {
    const cJSON *v = ck_get(r, key);
    const char *s = def;
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s\" must be a string", r->path, key);
        s = v->valuestring;
    }
    if (strcmp(s, "silu") == 0 || strcmp(s, "swish") == 0) *out = MT_ACT_SILU;
    else if (strcmp(s, "gelu_pytorch_tanh") == 0 || strcmp(s, "gelu_new") == 0) *out = MT_ACT_GELU_TANH;
    else
        return mt_set_error(MT_ERR_FORMAT,
                            "%s: key \"%s\" = \"%s\" is not supported (silu, gelu_pytorch_tanh, gelu_new)", r->path,
                            key, s);
    return MT_OK;
}

/* One rope block: {"rope_type"|"type", "factor", ..., ["rope_theta"]} -> global RoPE. */
static mt_status ck_rope(const ck_reader *r, const cJSON *o, const char *key, int allow_scaling, mt_model_config *c,
                         float *theta) {
    if (!cJSON_IsObject(o)) return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s\" must be an object or null", r->path, key);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(o, "type");
    const char *ty = cJSON_IsString(t) ? t->valuestring : (t ? NULL : "default");
    if (!ty) return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s.rope_type\" must be a string", r->path, key);
    if (theta) MT_TRY(ck_float(r, o, "rope_theta", *theta, *theta, 0, theta));
    if (strcmp(ty, "default") == 0) {
        if (allow_scaling) c->rope_type = MT_ROPE_DEFAULT;
        return MT_OK;
    }
    if (!allow_scaling)
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s\": rope_type \"%s\" is not supported on sliding layers",
                            r->path, key, ty);
    if (strcmp(ty, "linear") == 0) {
        c->rope_type = MT_ROPE_LINEAR;
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "factor")))
            return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s.factor\" is required for rope_type linear", r->path, key);
        return ck_float(r, o, "factor", 0, 0, 0, &c->rope_factor);
    }
    if (strcmp(ty, "proportional") == 0) {
        /* modeling_rope_utils.py _compute_proportional_rope_parameters: factor and
         * partial_rotary_factor default to 1.0 */
        c->rope_type = MT_ROPE_PROPORTIONAL;
        MT_TRY(ck_float(r, o, "factor", 1.0f, 1.0f, 0, &c->rope_factor));
        MT_TRY(ck_float(r, o, "partial_rotary_factor", 1.0f, 1.0f, 0, &c->rope_partial_rotary_factor));
        if (c->rope_partial_rotary_factor > 1.0f)
            return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s.partial_rotary_factor\" must be in (0, 1]", r->path, key);
        return MT_OK;
    }
    if (strcmp(ty, "llama3") == 0) {
        c->rope_type = MT_ROPE_LLAMA3;
        static const char *const need[] = {"factor", "low_freq_factor", "high_freq_factor",
                                           "original_max_position_embeddings"};
        for (int k = 0; k < 4; k++)
            if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, need[k])))
                return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s.%s\" is required for rope_type llama3", r->path, key,
                                    need[k]);
        MT_TRY(ck_float(r, o, "factor", 0, 0, 0, &c->rope_factor));
        MT_TRY(ck_float(r, o, "low_freq_factor", 0, 0, 0, &c->rope_low_freq_factor));
        MT_TRY(ck_float(r, o, "high_freq_factor", 0, 0, 0, &c->rope_high_freq_factor));
        return ck_int(r, o, "original_max_position_embeddings", 0, 1, &c->rope_original_max_position);
    }
    return mt_set_error(MT_ERR_FORMAT,
                        "%s: key \"%s\": rope_type \"%s\" is not supported (default, linear, llama3, proportional)",
                        r->path, key, ty);
}

/* layer_types -> sliding_window_pattern (the last layer of each period is global). */
static mt_status ck_layer_types(const ck_reader *r, const cJSON *lt, mt_model_config *c) {
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->num_decoder_layers)
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"layer_types\" must be an array of num_hidden_layers = %lld strings",
                            r->path, (long long)c->num_decoder_layers);
    int64_t first_full = -1, n = 0, nfull = 0;
    for (const cJSON *e = lt->child; e; e = e->next, n++) {
        int full = cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0;
        int slide = cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0;
        if (!full && !slide)
            return mt_set_error(MT_ERR_FORMAT, "%s: key \"layer_types[%lld]\" must be \"full_attention\" or "
                                "\"sliding_attention\"", r->path, (long long)n);
        if (full && first_full < 0) first_full = n;
        nfull += full;
    }
    if (nfull == n) {
        c->sliding_window_size = 0; /* every layer global */
        return MT_OK;
    }
    /* Every layer sliding (e.g. a gemma3 with fewer layers than its period, which
     * transformers writes so): a period longer than the model, since pattern 0 means
     * "all global" on gemma2/3 blocks (mt_model_layer_is_local). */
    c->sliding_window_pattern = nfull == 0 ? c->num_decoder_layers + 1 : first_full + 1;
    if (c->sliding_window_size <= 0)
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"layer_types\" has sliding layers but \"sliding_window\" is not set",
                            r->path);
    n = 0;
    for (const cJSON *e = lt->child; e; e = e->next, n++) {
        int slide = strcmp(e->valuestring, "sliding_attention") == 0;
        if (slide != mt_model_layer_is_local(c, n))
            return mt_set_error(MT_ERR_FORMAT,
                                "%s: key \"layer_types\" is not a repeating pattern of sliding layers then one full layer "
                                "(layer %lld breaks period %lld)",
                                r->path, (long long)n, (long long)c->sliding_window_pattern);
    }
    return MT_OK;
}

/* Gemma 4 text keys (configuration_gemma4.py Gemma4TextConfig; defaults from its class
 * fields). The global head dim is "global_head_dim" (the published files, transformers
 * 5.5) or, as transformers 5.17 writes it, "per_layer_config": {"<layer>": {"head_dim":
 * n}} on the full-attention layers. Refused: what this decoder does not compute
 * (attention_k_eq_v, the MoE block, bidirectional attention, a per-layer table with a
 * vocabulary of its own). Called after layer_types has set the local/global pattern. */
static mt_status ck_gemma4(const ck_reader *r, mt_model_config *c) {
    c->query_pre_attn_scalar = 1.0f; /* Gemma4TextAttention.scaling = 1.0, no config key */
    c->attn_logits_soft_cap = 0.0f;  /* Gemma 4 has no attention soft-cap */
    MT_TRY(ck_int(r, NULL, "global_head_dim", 512, 1, &c->global_head_dim));
    const cJSON *plc = ck_get(r, "per_layer_config");
    if (plc && !cJSON_IsNull(plc)) {
        if (!cJSON_IsObject(plc))
            return mt_set_error(MT_ERR_FORMAT, "%s: key \"per_layer_config\" must be an object", r->path);
        int64_t gh = -1;
        for (const cJSON *e = plc->child; e; e = e->next) {
            char *end = NULL;
            long long l = strtoll(e->string, &end, 10);
            if (!end || *end || l < 0 || l >= c->num_decoder_layers || mt_model_layer_is_local(c, l) ||
                !cJSON_IsObject(e))
                return mt_set_error(MT_ERR_FORMAT, "%s: key \"per_layer_config.%s\": only full-attention layers may "
                                    "override (with an object)", r->path, e->string);
            for (const cJSON *f = e->child; f; f = f->next)
                if (strcmp(f->string, "head_dim") != 0)
                    return mt_set_error(MT_ERR_FORMAT, "%s: key \"per_layer_config.%s.%s\" is not supported (only "
                                        "head_dim)", r->path, e->string, f->string);
            int64_t h;
            MT_TRY(ck_int(r, e, "head_dim", c->head_dim, 1, &h));
            if (gh >= 0 && h != gh)
                return mt_set_error(MT_ERR_FORMAT, "%s: key \"per_layer_config\": full-attention layers with head_dim "
                                    "%lld and %lld", r->path, (long long)gh, (long long)h);
            gh = h;
        }
        /* the layers it does not list keep head_dim */
        for (int64_t l = 0; gh >= 0 && l < c->num_decoder_layers; l++) {
            char key[32];
            snprintf(key, sizeof key, "%lld", (long long)l);
            if (!mt_model_layer_is_local(c, l) && !cJSON_GetObjectItemCaseSensitive(plc, key)) gh = c->head_dim;
        }
        c->global_head_dim = gh >= 0 ? gh : c->head_dim;
    }
    MT_TRY(ck_int(r, NULL, "num_kv_shared_layers", 0, 0, &c->num_kv_shared_layers));
    MT_TRY(ck_bool(r, "use_double_wide_mlp", 0, &c->use_double_wide_mlp));
    MT_TRY(ck_int(r, NULL, "hidden_size_per_layer_input", 256, 0, &c->per_layer_input_dim));
    int64_t pv = 0;
    MT_TRY(ck_int(r, NULL, "vocab_size_per_layer_input", 262144, 1, &pv));
    if (c->per_layer_input_dim > 0 && pv != c->vocab_size)
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"vocab_size_per_layer_input\" = %lld differs from vocab_size = "
                            "%lld (not supported)", r->path, (long long)pv, (long long)c->vocab_size);
    static const char *const refused[] = {"attention_k_eq_v", "enable_moe_block"};
    for (int i = 0; i < 2; i++) {
        int on = 0;
        MT_TRY(ck_bool(r, refused[i], 0, &on));
        if (on) return mt_set_error(MT_ERR_FORMAT, "%s: key \"%s\" = true is not supported", r->path, refused[i]);
    }
    const cJSON *bi = ck_get(r, "use_bidirectional_attention");
    if (bi && !cJSON_IsNull(bi) && !(cJSON_IsString(bi) && strcmp(bi->valuestring, "vision") == 0))
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"use_bidirectional_attention\" is not supported (null or "
                            "\"vision\": text tokens attend causally)", r->path);
    return MT_OK;
}

static mt_status ck_config_read(ck_reader *r, mt_model_config *c) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(r->top, "text_config");
    if (tc && !cJSON_IsNull(tc)) {
        if (!cJSON_IsObject(tc)) return mt_set_error(MT_ERR_FORMAT, "%s: key \"text_config\" must be an object", r->path);
        r->obj = tc;
    }
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(r->obj, "model_type");
    if (!mt && r->obj != r->top) mt = cJSON_GetObjectItemCaseSensitive(r->top, "model_type");
    if (!cJSON_IsString(mt)) return mt_set_error(MT_ERR_FORMAT, "%s: key \"model_type\" is missing or not a string", r->path);
    mt_decoder_block b;
    const char *ty = mt->valuestring;
    if (strcmp(ty, "llama") == 0) b = MT_DECODER_LLAMA2;
    else if (strcmp(ty, "gemma") == 0) b = MT_DECODER_GEMMA;
    else if (strcmp(ty, "gemma2") == 0) b = MT_DECODER_GEMMA2;
    else if (strcmp(ty, "gemma3_text") == 0 || strcmp(ty, "gemma3") == 0) b = MT_DECODER_GEMMA3;
    else if (strcmp(ty, "gemma4_text") == 0 || strcmp(ty, "gemma4") == 0) b = MT_DECODER_GEMMA4;
    else
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"model_type\" = \"%s\" is not supported (llama, gemma, gemma2, "
                            "gemma3_text, gemma4_text)", r->path, ty);
    mt_model_config_defaults(c, b);

    /* transformers' class defaults for absent keys (-1: derived, see below). */
    static const struct ck_hf_defaults {
        int64_t vocab, hidden, inter, layers, heads, kv, head_dim;
        float theta;
        int tie;
    } k_defaults[] = {
        {32000, 4096, 11008, 32, 32, -1, -1, 10000.0f, 0},     /* LlamaConfig */
        {256000, 3072, 24576, 28, 16, 16, 256, 10000.0f, 1},   /* GemmaConfig */
        {256000, 2304, 9216, 26, 8, 4, 256, 10000.0f, 1},      /* Gemma2Config */
        {262208, 2304, 9216, 26, 8, 4, 256, 1000000.0f, 1},    /* Gemma3TextConfig */
        {262144, 2304, 9216, 30, 8, 4, 256, 1000000.0f, 1},    /* Gemma4TextConfig */
    };
    const struct ck_hf_defaults d = k_defaults[b];
    MT_TRY(ck_int(r, NULL, "vocab_size", d.vocab, 1, &c->vocab_size));
    MT_TRY(ck_int(r, NULL, "hidden_size", d.hidden, 1, &c->emb_dim));
    MT_TRY(ck_int(r, NULL, "intermediate_size", d.inter, 1, &c->mlp_dim));
    MT_TRY(ck_int(r, NULL, "num_hidden_layers", d.layers, 1, &c->num_decoder_layers));
    MT_TRY(ck_int(r, NULL, "num_attention_heads", d.heads, 1, &c->num_query_heads));
    MT_TRY(ck_int(r, NULL, "num_key_value_heads", d.kv > 0 ? d.kv : c->num_query_heads, 1, &c->num_kv_heads));
    MT_TRY(ck_int(r, NULL, "head_dim", d.head_dim > 0 ? d.head_dim : c->emb_dim / c->num_query_heads, 1, &c->head_dim));
    MT_TRY(ck_float(r, NULL, "rms_norm_eps", 1e-6f, -1.0f, 0, &c->normalization_layer_epsilon));
    if (c->normalization_layer_epsilon <= 0)
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"rms_norm_eps\" must be a number > 0", r->path);
    MT_TRY(ck_bool(r, "tie_word_embeddings", d.tie, &c->logits_via_embedding));
    int bias = 0;
    MT_TRY(ck_bool(r, "attention_bias", 0, &bias));
    if (bias) return mt_set_error(MT_ERR_FORMAT, "%s: key \"attention_bias\" = true is not supported", r->path);
    MT_TRY(ck_bool(r, "mlp_bias", 0, &bias));
    if (bias) return mt_set_error(MT_ERR_FORMAT, "%s: key \"mlp_bias\" = true is not supported", r->path);
    /* Gemma's MLP is tanh-approximate GELU (Google's gemma_pytorch, MaxText); the HF
     * key for it is hidden_activation (default gelu_pytorch_tanh), which Gemma 2/3's
     * modeling files read. Note: transformers 4.57's GemmaMLP (Gemma 1) reads the
     * legacy hidden_act instead, and the published gemma-2b/7b config.json files say
     * hidden_act "gelu" (exact erf GELU), so transformers runs those checkpoints with
     * exact GELU; we keep the model's own tanh GELU (our exports write both keys as
     * gelu_pytorch_tanh, so a round trip agrees with transformers). Llama reads
     * hidden_act. */
    if (b == MT_DECODER_LLAMA2) MT_TRY(ck_act(r, "hidden_act", "silu", &c->mlp_activation));
    else MT_TRY(ck_act(r, "hidden_activation", "gelu_pytorch_tanh", &c->mlp_activation));

    /* Attention features by family (HF modeling_*.py). */
    c->use_qk_norm = b == MT_DECODER_GEMMA3 || b == MT_DECODER_GEMMA4;
    c->use_post_attn_norm = c->use_post_ffw_norm = b != MT_DECODER_LLAMA2 && b != MT_DECODER_GEMMA;
    c->query_pre_attn_scalar = 0;
    c->attn_logits_soft_cap = c->final_logits_soft_cap = 0;
    c->sliding_window_size = 0;
    c->sliding_window_pattern = 0;
    c->local_rope_max_timescale = 0;
    if (b == MT_DECODER_GEMMA2 || b == MT_DECODER_GEMMA3 || b == MT_DECODER_GEMMA4) {
        int g2 = b == MT_DECODER_GEMMA2;
        MT_TRY(ck_float(r, NULL, "query_pre_attn_scalar", 256.0f, 0.0f, 0, &c->query_pre_attn_scalar));
        /* null means head_dim (0 in mt_model_config); store the value it stands for, as the
         * writer does, so a read -> write -> read round trip gives the same config. */
        if (c->query_pre_attn_scalar == 0.0f) c->query_pre_attn_scalar = (float)c->head_dim;
        const cJSON *sw = ck_get(r, "sliding_window");
        if (sw && cJSON_IsNull(sw)) c->sliding_window_size = 0; /* None: no sliding layers */
        else MT_TRY(ck_int(r, NULL, "sliding_window", b == MT_DECODER_GEMMA4 ? 512 : 4096, 1, &c->sliding_window_size));
        MT_TRY(ck_float(r, NULL, "attn_logit_softcapping", g2 ? 50.0f : 0.0f, 0.0f, 1, &c->attn_logits_soft_cap));
        MT_TRY(ck_float(r, NULL, "final_logit_softcapping", g2 ? 30.0f : 0.0f, 0.0f, 1, &c->final_logits_soft_cap));
        MT_TRY(ck_int(r, NULL, "sliding_window_pattern", g2 ? 2 : 6, 0, &c->sliding_window_pattern));
        const cJSON *lt = ck_get(r, "layer_types");
        if (lt && !cJSON_IsNull(lt)) MT_TRY(ck_layer_types(r, lt, c));
    }
    if (b == MT_DECODER_GEMMA4) MT_TRY(ck_gemma4(r, c));

    /* RoPE: rope_parameters (newer transformers) or rope_theta + rope_scaling. */
    float theta = d.theta;
    float local_theta = b == MT_DECODER_GEMMA3 || b == MT_DECODER_GEMMA4 ? 10000.0f : 0.0f;
    c->rope_type = MT_ROPE_DEFAULT;
    c->rope_partial_rotary_factor = 0.0f;
    if (b == MT_DECODER_GEMMA4 && !ck_get(r, "rope_parameters")) {
        /* Gemma4TextConfig.__post_init__'s default rope_parameters */
        c->rope_type = MT_ROPE_PROPORTIONAL;
        c->rope_factor = 1.0f;
        c->rope_partial_rotary_factor = 0.25f;
    }
    const cJSON *rp = ck_get(r, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            return mt_set_error(MT_ERR_FORMAT, "%s: key \"rope_parameters\" must be an object", r->path);
        MT_TRY(ck_float(r, NULL, "rope_theta", theta, theta, 0, &theta));
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        const cJSON *slide = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        if (full || slide) {
            if (full) MT_TRY(ck_rope(r, full, "rope_parameters.full_attention", 1, c, &theta));
            if (b == MT_DECODER_GEMMA3) MT_TRY(ck_float(r, NULL, "rope_local_base_freq", local_theta, local_theta, 0, &local_theta));
            if (slide) MT_TRY(ck_rope(r, slide, "rope_parameters.sliding_attention", 0, c, &local_theta));
        } else {
            MT_TRY(ck_rope(r, rp, "rope_parameters", 1, c, &theta));
            if (b == MT_DECODER_GEMMA3) MT_TRY(ck_float(r, NULL, "rope_local_base_freq", local_theta, local_theta, 0, &local_theta));
        }
    } else {
        MT_TRY(ck_float(r, NULL, "rope_theta", theta, theta, 0, &theta));
        const cJSON *rs = ck_get(r, "rope_scaling");
        if (rs && !cJSON_IsNull(rs)) MT_TRY(ck_rope(r, rs, "rope_scaling", 1, c, NULL));
        if (b == MT_DECODER_GEMMA3) MT_TRY(ck_float(r, NULL, "rope_local_base_freq", local_theta, local_theta, 0, &local_theta));
    }
    c->rope_max_timescale = theta;
    c->local_rope_max_timescale = local_theta;
    if (b == MT_DECODER_GEMMA4 && c->rope_type != MT_ROPE_DEFAULT && c->rope_type != MT_ROPE_PROPORTIONAL)
        return mt_set_error(MT_ERR_FORMAT, "%s: key \"rope_parameters.full_attention.rope_type\": gemma4 takes default "
                            "or proportional", r->path);
    return MT_OK;
}

mt_status mt_hf_config_read(const char *path, mt_model_config *c) {
    char *text = NULL;
    MT_TRY(ck_read_text(path, &text));
    mt_status s;
    cJSON *j = ck_parse_json(path, text, &s);
    free(text);
    if (!j) return s;
    ck_reader r = {path, j, j};
    mt_model_config tmp;
    s = ck_config_read(&r, &tmp);
    cJSON_Delete(j);
    if (s == MT_OK) *c = tmp;
    return s;
}

/* ---------------------------------------------------------------- weights */

typedef struct ck_save_ctx {
    mt_model *m;
    mt_backend *be;     /* NULL: params is host memory */
    const float *params;
    mt_dtype dtype;
    float *scratch; /* float32, largest parameter (BF16 only) */
} ck_save_ctx;

/* dst[n] (host) = src[n] of the parameter buffer: backend memory through be, or host memory (be NULL). */
static mt_status ck_copy(const ck_save_ctx *x, float *dst, const float *src, int64_t n) {
    if (!x->be) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return MT_OK;
    }
    return x->be->ops->copy_to_host(x->be, dst, src, (size_t)n * sizeof(float));
}

static mt_status ck_fetch_param(void *vctx, int i, void *dst, size_t bytes) {
    ck_save_ctx *x = vctx;
    const mt_param_info *p = mt_model_param(x->m, i);
    const float *src = x->params + p->offset;
    (void)bytes; /* numel x dtype, as the tensor list says */
    if (x->dtype == MT_F32) {
        MT_TRY(ck_copy(x, dst, src, p->numel));
    } else {
        MT_TRY(ck_copy(x, x->scratch, src, p->numel));
        mt_f32_to_bf16_array(dst, x->scratch, (size_t)p->numel);
    }
    return MT_OK;
}

static mt_status ck_save(const char *dir, mt_model *m, mt_backend *be, const float *params, mt_dtype dtype,
                         const char *const *metadata);

mt_status mt_checkpoint_save_model(const char *dir, mt_model *m, mt_dtype dtype) {
    return mt_checkpoint_save_model_meta(dir, m, dtype, NULL);
}

mt_status mt_checkpoint_save_model_meta(const char *dir, mt_model *m, mt_dtype dtype, const char *const *metadata) {
    mt_backend *be = mt_model_backend(m);
    float *params = mt_model_params(m);
    if (!be || !params) return mt_set_error(MT_ERR_INVALID, "%s: model parameters are not bound to memory", dir);
    return ck_save(dir, m, be, params, dtype, metadata);
}

mt_status mt_checkpoint_save_host(const char *dir, mt_model *m, const float *host_params, mt_dtype dtype,
                                  const char *const *metadata) {
    if (!host_params) return mt_set_error(MT_ERR_INVALID, "%s: no parameter buffer", dir);
    return ck_save(dir, m, NULL, host_params, dtype, metadata);
}

static mt_status ck_save(const char *dir, mt_model *m, mt_backend *be, const float *params, mt_dtype dtype,
                         const char *const *metadata) {
    if (dtype != MT_F32 && dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "%s: checkpoint dtype must be float32 or bfloat16, not %s", dir,
                            mt_dtype_name(dtype));
    MT_TRY(mt_file_mkdir_p(dir));
    int n = mt_model_param_count(m);
    mt_st_write_tensor *t = calloc(n > 0 ? (size_t)n : 1, sizeof *t);
    if (!t) return mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
    int64_t most = 1;
    for (int i = 0; i < n; i++) {
        const mt_param_info *p = mt_model_param(m, i);
        t[i].name = p->name;
        t[i].dtype = dtype;
        t[i].ndim = p->ndim;
        for (int d = 0; d < p->ndim; d++) t[i].shape[d] = p->shape[d];
        if (p->numel > most) most = p->numel;
    }
    ck_save_ctx x = {m, be, params, dtype, NULL};
    mt_status s = MT_OK;
    if (dtype == MT_BF16 && !(x.scratch = malloc((size_t)most * sizeof(float))))
        s = mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
    char *wpath = ck_join(dir, "model.safetensors"), *cpath = ck_join(dir, "config.json");
    if (s == MT_OK && (!wpath || !cpath)) s = mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
    /* "format": "pt" first (transformers reads it), then the caller's pairs */
    enum { CK_META_MAX = 16 };
    const char *meta[2 * CK_META_MAX + 3] = {"format", "pt"};
    int nm = 2;
    for (int i = 0; metadata && metadata[i] && metadata[i + 1]; i += 2) {
        if (nm + 2 > 2 * CK_META_MAX + 2 || strcmp(metadata[i], "format") == 0) {
            if (s == MT_OK)
                s = mt_set_error(MT_ERR_INVALID, "%s: metadata key '%s': 'format' is reserved and at most %d "
                                 "pairs are written", dir, metadata[i], CK_META_MAX);
            break;
        }
        meta[nm++] = metadata[i];
        meta[nm++] = metadata[i + 1];
    }
    meta[nm] = NULL;
    if (s == MT_OK) s = mt_safetensors_write_fetch(wpath, t, n, meta, ck_fetch_param, &x);
    if (s == MT_OK) s = ck_config_write(cpath, mt_model_get_config(m), dtype == MT_BF16 ? "bfloat16" : "float32");
    free(wpath);
    free(cpath);
    free(x.scratch);
    free(t);
    return s;
}

static int ck_starts(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* gemma4: a KV-sharing layer's k/v projections and norms ("model.layers.N.self_attn.
 * {k_proj,v_proj,k_norm,v_norm}.weight" with N a sharing layer), which published
 * checkpoints carry and transformers skips (Gemma4TextModel's
 * _keys_to_ignore_on_load_unexpected): that layer attends to its donor's K/V. */
static int ck_gemma4_shared_kv(const char *name, const mt_model_config *c) {
    static const char pre[] = "model.layers.";
    if (c->decoder_block != MT_DECODER_GEMMA4 || !ck_starts(name, pre)) return 0;
    char *end = NULL;
    long long l = strtoll(name + sizeof pre - 1, &end, 10);
    if (!end || end == name + sizeof pre - 1 || l < 0 || l >= c->num_decoder_layers) return 0;
    static const char *const kv[] = {".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
                                     ".self_attn.k_norm.weight", ".self_attn.v_norm.weight"};
    for (int i = 0; i < 4; i++)
        if (strcmp(end, kv[i]) == 0) return mt_model_layer_kv_donor(c, l) >= 0;
    return 0;
}

static int ck_ignorable(const char *name, int tied, int gemma3, const mt_model_config *c) {
    size_t n = strlen(name);
    static const char suf[] = "rotary_emb.inv_freq";
    if (n >= sizeof suf - 1 && strcmp(name + n - (sizeof suf - 1), suf) == 0) return 1;
    /* Gemma 4 multimodal checkpoints (Gemma4ForConditionalGeneration): the vision and
     * audio towers and their embedders are skipped */
    if (c->decoder_block == MT_DECODER_GEMMA4 &&
        (ck_starts(name, "model.vision_tower.") || ck_starts(name, "model.audio_tower.") ||
         ck_starts(name, "model.embed_vision.") || ck_starts(name, "model.embed_audio.")))
        return 1;
    if (ck_gemma4_shared_kv(name, c)) return 1;
    /* Gemma 3 multimodal checkpoints (Gemma3ForConditionalGeneration): only the text
     * model is loaded; the vision tower and its projector are skipped. */
    if (gemma3 && (ck_starts(name, "vision_tower.") || ck_starts(name, "multi_modal_projector.") ||
                   ck_starts(name, "model.vision_tower.") || ck_starts(name, "model.multi_modal_projector.")))
        return 1;
    return tied && strcmp(name, "lm_head.weight") == 0;
}

/* The text-model name of a tensor: Gemma 3 (and 4) multimodal checkpoints store the text
 * model as "language_model.model.*" / "language_model.lm_head.*" (transformers'
 * save_pretrained of Gemma3ForConditionalGeneration, and the published google/gemma-3-*
 * files) or "model.language_model.*" (its module names); these map to the
 * Gemma3ForCausalLM names "model.*" / "lm_head.*". Other names are returned as they are. */
static const char *ck_text_name(const char *name, char *buf, size_t n) {
    static const struct { const char *from, *to; } k_map[] = {
        {"language_model.model.", "model."},
        {"model.language_model.", "model."},
        {"language_model.lm_head.", "lm_head."},
    };
    for (size_t i = 0; i < sizeof k_map / sizeof k_map[0]; i++)
        if (ck_starts(name, k_map[i].from)) {
            snprintf(buf, n, "%s%s", k_map[i].to, name + strlen(k_map[i].from));
            return buf;
        }
    return name;
}

/* Where each model parameter lives. */
typedef struct ck_src {
    int file; /* -1: not found yet */
    int index;
} ck_src;

static mt_status ck_open_files(const char *dir, mt_safetensors ***files_out, int *nfiles_out, cJSON **wmap_out) {
    *files_out = NULL;
    *nfiles_out = 0;
    *wmap_out = NULL;
    char *ipath = ck_join(dir, "model.safetensors.index.json");
    if (!ipath) return mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
    mt_status s = MT_OK;
    if (access(ipath, F_OK) != 0) {
        free(ipath);
        char *p = ck_join(dir, "model.safetensors");
        if (!p) return mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
        mt_safetensors **files = calloc(1, sizeof *files);
        if (!files) s = mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
        else if (access(p, F_OK) != 0)
            s = mt_set_error(MT_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json in the checkpoint directory",
                             dir);
        else s = mt_safetensors_open(&files[0], p);
        free(p);
        if (s != MT_OK) {
            free(files);
            return s;
        }
        *files_out = files;
        *nfiles_out = 1;
        return MT_OK;
    }
    char *text = NULL;
    s = ck_read_text(ipath, &text);
    cJSON *root = s == MT_OK ? ck_parse_json(ipath, text, &s) : NULL;
    free(text);
    if (!root) {
        free(ipath);
        return s;
    }
    cJSON *wm = cJSON_DetachItemFromObjectCaseSensitive(root, "weight_map");
    cJSON_Delete(root);
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(wm);
        s = mt_set_error(MT_ERR_FORMAT, "%s: key \"weight_map\" is missing or not an object", ipath);
        free(ipath);
        return s;
    }
    /* Distinct shard files, in first-seen order. */
    int cap = cJSON_GetArraySize(wm) + 1, n = 0;
    mt_safetensors **files = calloc((size_t)cap, sizeof *files);
    if (!files) s = mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
    for (const cJSON *e = wm->child; e && s == MT_OK; e = e->next) {
        if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '/') ||
            strcmp(e->valuestring, "..") == 0 || strcmp(e->valuestring, ".") == 0) {
            s = mt_set_error(MT_ERR_FORMAT, "%s: weight_map[\"%s\"] must be a file name in the same directory", ipath,
                             e->string);
            break;
        }
        int seen = 0;
        for (int k = 0; k < n && !seen; k++) {
            const char *p = mt_safetensors_path(files[k]);
            seen = strcmp(p + strlen(dir) + 1, e->valuestring) == 0;
        }
        if (seen) continue;
        char *p = ck_join(dir, e->valuestring);
        if (!p) s = mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
        else s = mt_safetensors_open(&files[n], p);
        free(p);
        if (s == MT_OK) n++;
    }
    free(ipath);
    if (s != MT_OK) {
        for (int k = 0; k < n; k++) mt_safetensors_close(files[k]);
        free(files);
        cJSON_Delete(wm);
        return s;
    }
    *files_out = files;
    *nfiles_out = n;
    *wmap_out = wm;
    return MT_OK;
}

static mt_status ck_load(const char *dir, mt_model *m, mt_backend *be, float *params);

mt_status mt_checkpoint_load_model(const char *dir, mt_model *m) {
    mt_backend *be = mt_model_backend(m);
    float *params = mt_model_params(m);
    if (!be || !params) return mt_set_error(MT_ERR_INVALID, "%s: model parameters are not bound to memory", dir);
    return ck_load(dir, m, be, params);
}

mt_status mt_checkpoint_load_host(const char *dir, mt_model *m, float *host_params) {
    if (!host_params) return mt_set_error(MT_ERR_INVALID, "%s: no parameter buffer", dir);
    return ck_load(dir, m, NULL, host_params);
}

/* The body of both loads: into backend memory through be, or host memory (be NULL). */
static mt_status ck_load(const char *dir, mt_model *m, mt_backend *be, float *params) {
    const mt_model_config *cfg = mt_model_get_config(m);
    int tied = cfg->logits_via_embedding != 0;
    int gemma3 = cfg->decoder_block == MT_DECODER_GEMMA3;
    /* multimodal names (model.language_model.*) map to the text model's */
    int mm = gemma3 || cfg->decoder_block == MT_DECODER_GEMMA4;

    mt_safetensors **files = NULL;
    int nfiles = 0;
    cJSON *wmap = NULL;
    MT_TRY(ck_open_files(dir, &files, &nfiles, &wmap));
    int np = mt_model_param_count(m);
    ck_src *src = malloc((np > 0 ? (size_t)np : 1) * sizeof *src);
    float *host = NULL;
    mt_status s = MT_OK;
    if (!src) s = mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
    for (int i = 0; i < np && s == MT_OK; i++) src[i].file = -1;

    /* Every tensor in the files must be a parameter (once) or ignorable. */
    char unknown[512] = "";
    int nunknown = 0;
    for (int f = 0; f < nfiles && s == MT_OK; f++) {
        const char *fpath = mt_safetensors_path(files[f]);
        for (int k = 0; k < mt_safetensors_count(files[f]) && s == MT_OK; k++) {
            const mt_st_tensor *t = mt_safetensors_tensor(files[f], k);
            char mapped[sizeof t->name + 16];
            const char *pname = mm ? ck_text_name(t->name, mapped, sizeof mapped) : t->name;
            int pi = mt_model_param_find(m, pname);
            if (pi < 0) {
                if (ck_ignorable(pname, tied, gemma3, cfg)) continue;
                if (nunknown++ < 4) {
                    size_t u = strlen(unknown);
                    snprintf(unknown + u, sizeof unknown - u, "%s'%s'", u ? ", " : "", t->name);
                }
                continue;
            }
            if (src[pi].file >= 0) {
                s = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' is stored twice (also in %s)", fpath, t->name,
                                 mt_safetensors_path(files[src[pi].file]));
                break;
            }
            if (wmap) {
                const cJSON *w = cJSON_GetObjectItemCaseSensitive(wmap, t->name);
                const char *base = fpath + strlen(dir) + 1;
                if (!cJSON_IsString(w) || strcmp(w->valuestring, base) != 0) {
                    s = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' is in %s but the weight_map says %s", dir, t->name,
                                     base, cJSON_IsString(w) ? w->valuestring : "nothing");
                    break;
                }
            }
            src[pi].file = f;
            src[pi].index = k;
        }
    }
    if (s == MT_OK && nunknown)
        s = mt_set_error(MT_ERR_FORMAT, "%s: %d tensor(s) the %s model does not have: %s%s", dir, nunknown,
                         mt_decoder_block_name(cfg->decoder_block), unknown, nunknown > 4 ? ", ..." : "");

    /* Every parameter present with the same shape. */
    int64_t most = 1;
    for (int i = 0; i < np && s == MT_OK; i++) {
        const mt_param_info *p = mt_model_param(m, i);
        char want[96], got[96];
        ck_shape_str(want, sizeof want, p->ndim, p->shape);
        if (src[i].file < 0) {
            s = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' (expected shape %s) is missing from the checkpoint", dir,
                             p->name, want);
            break;
        }
        const mt_st_tensor *t = mt_safetensors_tensor(files[src[i].file], src[i].index);
        int same = t->ndim == p->ndim;
        for (int d = 0; d < p->ndim && same; d++) same = t->shape[d] == p->shape[d];
        if (!same) {
            ck_shape_str(got, sizeof got, t->ndim, t->shape);
            s = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model expects %s",
                             mt_safetensors_path(files[src[i].file]), p->name, got, want);
            break;
        }
        if (p->numel > most) most = p->numel;
    }

    if (s == MT_OK && !(host = malloc((size_t)most * sizeof(float)))) s = mt_set_error(MT_ERR_OOM, "%s: out of memory", dir);
    for (int i = 0; i < np && s == MT_OK; i++) {
        const mt_param_info *p = mt_model_param(m, i);
        if (!be) { /* straight into the host buffer */
            s = mt_safetensors_read_f32(files[src[i].file], src[i].index, params + p->offset, p->numel);
            continue;
        }
        s = mt_safetensors_read_f32(files[src[i].file], src[i].index, host, p->numel);
        if (s == MT_OK) s = be->ops->copy_to_device(be, params + p->offset, host, (size_t)p->numel * sizeof(float));
    }
    if (s == MT_OK && be) s = be->ops->sync(be);
    free(host);
    free(src);
    for (int f = 0; f < nfiles; f++) mt_safetensors_close(files[f]);
    free(files);
    cJSON_Delete(wmap);
    return s;
}
