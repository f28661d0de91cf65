/* models/config.c: decoder-block defaults, validation and the derived quantities of a
 * model config (norm offset, embedding scale, local/global layers, RoPE frequencies,
 * attention scale, parameter count). Facts: Hugging Face transformers'
 * modeling_llama.py / modeling_gemma*.py / modeling_rope_utils.py. */
#include "models/config.h"

#include <math.h>
#include <string.h>

static const char *const k_block_names[] = {"llama2", "gemma", "gemma2", "gemma3", "gemma4"};
#define K_BLOCK_COUNT ((int)(sizeof k_block_names / sizeof k_block_names[0]))

void mt_model_config_defaults(mt_model_config *c, mt_decoder_block block) {
    memset(c, 0, sizeof(*c));
    c->decoder_block = block;
    /* RoPE: base 10000, no scaling; the llama3 scaling constants (Llama 3.1) are
     * pre-filled so that rope_type=llama3 alone selects the published values. */
    c->rope_max_timescale = 10000.0f;
    c->rope_type = MT_ROPE_DEFAULT;
    c->rope_factor = 8.0f;
    c->rope_low_freq_factor = 1.0f;
    c->rope_high_freq_factor = 4.0f;
    c->rope_original_max_position = 8192;
    switch (block) {
    case MT_DECODER_LLAMA2:
        c->mlp_activation = MT_ACT_SILU;
        c->normalization_layer_epsilon = 1e-5f;
        c->logits_via_embedding = 0;
        break;
    case MT_DECODER_GEMMA:
        c->mlp_activation = MT_ACT_GELU_TANH;
        c->normalization_layer_epsilon = 1e-6f;
        c->logits_via_embedding = 1;
        break;
    case MT_DECODER_GEMMA2:
        /* Gemma 2: alternate local (window 4096) / global starting local, soft-caps
         * 50 (attention) and 30 (final), pre and post norms around both blocks. */
        c->mlp_activation = MT_ACT_GELU_TANH;
        c->normalization_layer_epsilon = 1e-6f;
        c->logits_via_embedding = 1;
        c->attn_logits_soft_cap = 50.0f;
        c->final_logits_soft_cap = 30.0f;
        c->sliding_window_size = 4096;
        c->sliding_window_pattern = 2;
        c->use_post_attn_norm = 1;
        c->use_post_ffw_norm = 1;
        break;
    case MT_DECODER_GEMMA3:
        /* Gemma 3 (4b and up): 5 local (window 1024) then 1 global; QK-norm; local
         * RoPE base 10000, global base 1e6 with linear scaling 8; no soft-caps. */
        c->mlp_activation = MT_ACT_GELU_TANH;
        c->normalization_layer_epsilon = 1e-6f;
        c->logits_via_embedding = 1;
        c->sliding_window_size = 1024;
        c->sliding_window_pattern = 6;
        c->use_qk_norm = 1;
        c->use_post_attn_norm = 1;
        c->use_post_ffw_norm = 1;
        c->rope_max_timescale = 1000000.0f;
        c->rope_type = MT_ROPE_LINEAR;
        c->rope_factor = 8.0f;
        c->local_rope_max_timescale = 10000.0f;
        break;
    case MT_DECODER_GEMMA4:
        /* Gemma 4 small (configuration_gemma4.py Gemma4TextConfig defaults, and
         * modeling_gemma4.py): window 512, 5 local then 1 global (E2B sets 5), head_dim
         * 512 on global layers, QK-norm (and v_norm) with plain-w RMSNorm, attention
         * scale 1.0 (query_pre_attn_scalar 1), final soft-cap 30 (the published
         * configs), per-layer embeddings of 256 per layer, RoPE 1e4 on local layers and
         * proportional 1e6 with 1/4 of the frequencies on global layers. */
        c->mlp_activation = MT_ACT_GELU_TANH;
        c->normalization_layer_epsilon = 1e-6f;
        c->logits_via_embedding = 1;
        c->final_logits_soft_cap = 30.0f;
        c->sliding_window_size = 512;
        c->sliding_window_pattern = 6;
        c->query_pre_attn_scalar = 1.0f;
        c->use_qk_norm = 1;
        c->use_post_attn_norm = 1;
        c->use_post_ffw_norm = 1;
        c->rope_max_timescale = 1000000.0f;
        c->rope_type = MT_ROPE_PROPORTIONAL;
        c->rope_factor = 1.0f;
        c->rope_partial_rotary_factor = 0.25f;
        c->local_rope_max_timescale = 10000.0f;
        c->global_head_dim = 512;
        c->per_layer_input_dim = 256;
        break;
    default:
        break;
    }
}

/* The gemma4 keys: zero on the other blocks; on gemma4 a global head_dim that the
 * attention can take, a donor for every KV-sharing layer, and the norms its layer always
 * has (transformers models/gemma4/modeling_gemma4.py: Gemma4TextAttention's q_norm /
 * k_norm, Gemma4TextDecoderLayer's post_attention_layernorm and
 * post_feedforward_layernorm; models/model_gemma4.c runs them unconditionally). */
static mt_status validate_gemma4(const mt_model_config *c) {
    if (c->decoder_block != MT_DECODER_GEMMA4) {
        struct { const char *key; double v; } g4[] = {
            {"global_head_dim", (double)c->global_head_dim},
            {"num_kv_shared_layers", (double)c->num_kv_shared_layers},
            {"use_double_wide_mlp", (double)c->use_double_wide_mlp},
            {"per_layer_input_dim", (double)c->per_layer_input_dim},
        };
        for (size_t i = 0; i < sizeof(g4) / sizeof(g4[0]); i++)
            if (g4[i].v != 0.0)
                return mt_set_error(MT_ERR_INVALID, "%s=%g is a gemma4 key (decoder_block=%s must leave it 0)",
                                    g4[i].key, g4[i].v, mt_decoder_block_name(c->decoder_block));
        if (c->rope_type == MT_ROPE_PROPORTIONAL)
            return mt_set_error(MT_ERR_INVALID, "rope_type=proportional is gemma4's (decoder_block=%s)",
                                mt_decoder_block_name(c->decoder_block));
        return MT_OK;
    }
    {
        struct { const char *key; int v; } on[] = {
            {"use_qk_norm", c->use_qk_norm},
            {"use_post_attn_norm", c->use_post_attn_norm},
            {"use_post_ffw_norm", c->use_post_ffw_norm},
        };
        for (size_t i = 0; i < sizeof(on) / sizeof(on[0]); i++)
            if (!on[i].v)
                return mt_set_error(MT_ERR_INVALID, "%s=false: decoder_block=gemma4 always has this norm", on[i].key);
    }
    /* Gemma4TextConfig's layer_types: sliding unless (layer + 1) % pattern == 0; a
     * pattern of 0 has no such layers (transformers divides by it) and here made every
     * layer global while the window and the local RoPE base read as set */
    if (c->sliding_window_pattern < 1)
        return mt_set_error(MT_ERR_INVALID, "sliding_window_pattern=%lld: decoder_block=gemma4 needs a period >= 1 "
                            "(the last layer of each period is global, the others local; 1 = every layer global)",
                            (long long)c->sliding_window_pattern);
    /* config.json's rope_parameters.full_attention takes only these two (models/checkpoint.c):
     * another would train a model that its own checkpoint cannot describe */
    if (c->rope_type == MT_ROPE_LLAMA3 || c->rope_type == MT_ROPE_LINEAR)
        return mt_set_error(MT_ERR_INVALID, "rope_type=%s: decoder_block=gemma4 takes default or proportional",
                            c->rope_type == MT_ROPE_LLAMA3 ? "llama3" : "linear");
    if (c->global_head_dim < 0 || c->global_head_dim % 2 != 0 || c->global_head_dim > 512)
        return mt_set_error(MT_ERR_INVALID, "global_head_dim=%lld must be even, in [0, 512] (0 = head_dim)",
                            (long long)c->global_head_dim);
    if (c->per_layer_input_dim < 0)
        return mt_set_error(MT_ERR_INVALID, "per_layer_input_dim=%lld must be >= 0", (long long)c->per_layer_input_dim);
    if (c->num_kv_shared_layers < 0 || c->num_kv_shared_layers >= c->num_decoder_layers)
        return mt_set_error(MT_ERR_INVALID, "num_kv_shared_layers=%lld must be in [0, base_num_decoder_layers=%lld)",
                            (long long)c->num_kv_shared_layers, (long long)c->num_decoder_layers);
    for (int64_t l = c->num_decoder_layers - c->num_kv_shared_layers; l < c->num_decoder_layers; l++)
        if (mt_model_layer_kv_donor(c, l) < 0)
            return mt_set_error(MT_ERR_INVALID,
                                "num_kv_shared_layers=%lld: KV-sharing layer %lld (%s) has no earlier %s layer to "
                                "share with",
                                (long long)c->num_kv_shared_layers, (long long)l,
                                mt_model_layer_is_local(c, l) ? "local" : "global",
                                mt_model_layer_is_local(c, l) ? "local" : "global");
    return MT_OK;
}

mt_status mt_model_config_validate(const mt_model_config *c) {
    if (!c) return mt_set_error(MT_ERR_INVALID, "model config is NULL");
    if ((int)c->decoder_block < 0 || (int)c->decoder_block >= K_BLOCK_COUNT)
        return mt_set_error(MT_ERR_INVALID, "decoder_block=%d is not one of llama2|gemma|gemma2|gemma3|gemma4",
                            (int)c->decoder_block);
    struct { const char *key; int64_t v; } dims[] = {
        {"vocab_size", c->vocab_size},
        {"base_emb_dim", c->emb_dim},
        {"base_num_query_heads", c->num_query_heads},
        {"base_num_kv_heads", c->num_kv_heads},
        {"head_dim", c->head_dim},
        {"base_mlp_dim", c->mlp_dim},
        {"base_num_decoder_layers", c->num_decoder_layers},
    };
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++)
        if (dims[i].v < 1)
            return mt_set_error(MT_ERR_INVALID, "%s=%lld must be positive", dims[i].key,
                                (long long)dims[i].v);
    if (c->num_decoder_layers > MT_MODEL_MAX_LAYERS)
        return mt_set_error(MT_ERR_INVALID, "base_num_decoder_layers=%lld: at most %d (the memory plan holds entries "
                            "per layer)", (long long)c->num_decoder_layers, MT_MODEL_MAX_LAYERS);
    if (c->vocab_size > INT32_MAX)
        return mt_set_error(MT_ERR_INVALID, "vocab_size=%lld exceeds the int32 token range",
                            (long long)c->vocab_size);
    if (c->num_query_heads % c->num_kv_heads != 0)
        return mt_set_error(MT_ERR_INVALID,
                            "base_num_kv_heads=%lld must divide base_num_query_heads=%lld",
                            (long long)c->num_kv_heads, (long long)c->num_query_heads);
    if (c->head_dim % 2 != 0 || c->head_dim > 256)
        return mt_set_error(MT_ERR_INVALID, "head_dim=%lld must be even and at most 256",
                            (long long)c->head_dim);
    MT_TRY(validate_gemma4(c));
    if (c->mlp_activation != MT_ACT_SILU && c->mlp_activation != MT_ACT_GELU_TANH)
        return mt_set_error(MT_ERR_INVALID, "mlp_activations=%d is not silu or gelu",
                            (int)c->mlp_activation);
    if (!(c->normalization_layer_epsilon > 0.0f) || !isfinite(c->normalization_layer_epsilon))
        return mt_set_error(MT_ERR_INVALID, "normalization_layer_epsilon=%g must be positive",
                            (double)c->normalization_layer_epsilon);
    if (!(c->final_logits_soft_cap >= 0.0f))
        return mt_set_error(MT_ERR_INVALID, "final_logits_soft_cap=%g must be >= 0",
                            (double)c->final_logits_soft_cap);
    if (!(c->attn_logits_soft_cap >= 0.0f))
        return mt_set_error(MT_ERR_INVALID, "attn_logits_soft_cap=%g must be >= 0",
                            (double)c->attn_logits_soft_cap);
    if (c->sliding_window_size < 0)
        return mt_set_error(MT_ERR_INVALID, "sliding_window_size=%lld must be >= 0",
                            (long long)c->sliding_window_size);
    if (c->sliding_window_pattern < 0)
        return mt_set_error(MT_ERR_INVALID, "sliding_window_pattern=%lld must be >= 0",
                            (long long)c->sliding_window_pattern);
    if (!(c->query_pre_attn_scalar >= 0.0f))
        return mt_set_error(MT_ERR_INVALID, "query_pre_attn_scalar=%g must be >= 0 (0 = head_dim)",
                            (double)c->query_pre_attn_scalar);
    if (!(c->rope_max_timescale > 0.0f))
        return mt_set_error(MT_ERR_INVALID, "rope_max_timescale=%g must be positive",
                            (double)c->rope_max_timescale);
    if (!(c->local_rope_max_timescale >= 0.0f))
        return mt_set_error(MT_ERR_INVALID, "local_rope_max_timescale=%g must be >= 0",
                            (double)c->local_rope_max_timescale);
    switch (c->rope_type) {
    case MT_ROPE_DEFAULT:
        break;
    case MT_ROPE_PROPORTIONAL:
        if (!(c->rope_partial_rotary_factor > 0.0f && c->rope_partial_rotary_factor <= 1.0f))
            return mt_set_error(MT_ERR_INVALID,
                                "rope_partial_rotary_factor=%g must be in (0, 1] for rope_type=proportional",
                                (double)c->rope_partial_rotary_factor);
        if (!(c->rope_factor > 0.0f)) /* the frequencies are divided by it */
            return mt_set_error(MT_ERR_INVALID, "rope_factor=%g must be positive for rope_type=proportional",
                                (double)c->rope_factor);
        break;
    case MT_ROPE_LINEAR:
        if (!(c->rope_factor > 0.0f))
            return mt_set_error(MT_ERR_INVALID, "rope_factor=%g must be positive for rope_type=linear",
                                (double)c->rope_factor);
        break;
    case MT_ROPE_LLAMA3:
        if (!(c->rope_factor > 0.0f))
            return mt_set_error(MT_ERR_INVALID, "rope_factor=%g must be positive for rope_type=llama3",
                                (double)c->rope_factor);
        if (!(c->rope_low_freq_factor > 0.0f))
            return mt_set_error(MT_ERR_INVALID, "rope_low_freq_factor=%g must be positive",
                                (double)c->rope_low_freq_factor);
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return mt_set_error(MT_ERR_INVALID,
                                "rope_high_freq_factor=%g must exceed rope_low_freq_factor=%g",
                                (double)c->rope_high_freq_factor, (double)c->rope_low_freq_factor);
        if (c->rope_original_max_position < 1)
            return mt_set_error(MT_ERR_INVALID, "rope_original_max_position=%lld must be positive",
                                (long long)c->rope_original_max_position);
        break;
    default:
        return mt_set_error(MT_ERR_INVALID, "rope_type=%d is not one of default|llama3|linear|proportional",
                            (int)c->rope_type);
    }
    return MT_OK;
}

mt_status mt_decoder_block_parse(const char *s, mt_decoder_block *out) {
    if (s)
        for (int i = 0; i < K_BLOCK_COUNT; i++)
            if (strcmp(s, k_block_names[i]) == 0) {
                *out = (mt_decoder_block)i;
                return MT_OK;
            }
    return mt_set_error(MT_ERR_INVALID, "decoder_block=%s is not one of llama2|gemma|gemma2|gemma3|gemma4",
                        s ? s : "(null)");
}

const char *mt_decoder_block_name(mt_decoder_block b) {
    if ((int)b < 0 || (int)b >= K_BLOCK_COUNT) return "unknown";
    return k_block_names[b];
}

int mt_model_norm_unit_offset(const mt_model_config *c) {
    return c->decoder_block != MT_DECODER_LLAMA2 && c->decoder_block != MT_DECODER_GEMMA4;
}

float mt_model_embedding_scale(const mt_model_config *c) {
    /* HF GemmaModel: normalizer = torch.tensor(hidden_size**0.5, dtype=hidden.dtype);
     * for float32 that is the correctly rounded sqrt. */
    if (c->decoder_block == MT_DECODER_LLAMA2) return 1.0f;
    return (float)sqrt((double)c->emb_dim);
}

int mt_model_layer_is_local(const mt_model_config *c, int64_t layer) {
    if (c->sliding_window_size <= 0) return 0;
    /* no pattern (config.h): a window on a llama/gemma block makes every layer local;
     * gemma2/3 without a pattern have only global layers */
    if (c->sliding_window_pattern <= 0)
        return c->decoder_block == MT_DECODER_LLAMA2 || c->decoder_block == MT_DECODER_GEMMA;
    /* gemma4: the last layer is global whatever the pattern (Gemma4TextConfig.__post_init__) */
    if (c->decoder_block == MT_DECODER_GEMMA4 && layer == c->num_decoder_layers - 1) return 0;
    /* HF gemma2: sliding on even layers; gemma3/4: sliding unless (layer+1) % pattern == 0.
     * Both are "the last layer of each period is global". */
    return ((layer + 1) % c->sliding_window_pattern) != 0;
}

int64_t mt_model_layer_head_dim(const mt_model_config *c, int64_t layer) {
    if (c->decoder_block == MT_DECODER_GEMMA4 && c->global_head_dim > 0 && !mt_model_layer_is_local(c, layer))
        return c->global_head_dim;
    return c->head_dim;
}

int64_t mt_model_layer_mlp_dim(const mt_model_config *c, int64_t layer) {
    const int shared = layer >= c->num_decoder_layers - c->num_kv_shared_layers && c->num_kv_shared_layers > 0;
    return c->use_double_wide_mlp && shared ? 2 * c->mlp_dim : c->mlp_dim;
}

int64_t mt_model_layer_kv_donor(const mt_model_config *c, int64_t layer) {
    const int64_t first = c->num_decoder_layers - c->num_kv_shared_layers;
    if (c->num_kv_shared_layers <= 0 || layer < first) return -1;
    const int local = mt_model_layer_is_local(c, layer);
    for (int64_t d = first - 1; d >= 0; d--)
        if (mt_model_layer_is_local(c, d) == local) return d;
    return -1;
}

void mt_rope_inv_freq(const mt_model_config *c, int64_t layer, float *inv_freq) {
    const int64_t Dh = mt_model_layer_head_dim(c, layer), half = Dh / 2;
    const int local = mt_model_layer_is_local(c, layer) && c->local_rope_max_timescale > 0.0f;
    const double base = local ? (double)c->local_rope_max_timescale : (double)c->rope_max_timescale;
    const mt_rope_type type = local ? MT_ROPE_DEFAULT : c->rope_type;
    const double factor = (double)c->rope_factor;
    const double pi = 3.14159265358979323846;
    /* _compute_proportional_rope_parameters: rope_angles = int(factor * Dh // 2) */
    const int64_t angles = type == MT_ROPE_PROPORTIONAL
                               ? (int64_t)floor((double)c->rope_partial_rotary_factor * (double)Dh / 2.0)
                               : half;
    for (int64_t i = 0; i < half; i++) {
        /* _compute_default_rope_parameters: 1 / base^(2i / dim) */
        double f = 1.0 / pow(base, (double)(2 * i) / (double)Dh);
        if (type == MT_ROPE_PROPORTIONAL) {
            f = i < angles ? f / factor : 0.0;
        } else if (type == MT_ROPE_LINEAR) {
            f /= factor; /* _compute_linear_scaling_rope_parameters */
        } else if (type == MT_ROPE_LLAMA3) {
            /* _compute_llama3_parameters */
            const double old_len = (double)c->rope_original_max_position;
            const double lo = (double)c->rope_low_freq_factor, hi = (double)c->rope_high_freq_factor;
            const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
            const double wavelen = 2.0 * pi / f;
            if (wavelen > low_freq_wavelen) {
                f = f / factor;
            } else if (wavelen >= high_freq_wavelen) {
                const double s = (old_len / wavelen - lo) / (hi - lo);
                f = (1.0 - s) * f / factor + s * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

float mt_model_attn_scale(const mt_model_config *c) {
    double s = c->query_pre_attn_scalar > 0.0f ? (double)c->query_pre_attn_scalar : (double)c->head_dim;
    return (float)(1.0 / sqrt(s));
}

/* gemma4 (modeling_gemma4.py Gemma4TextModel, Gemma4TextDecoderLayer): per-layer head
 * dims and MLP widths, no k/v (nor k_norm) on KV-sharing layers, v_norm without a
 * weight, four block norms, the per-layer-input gate / projection / norm in every
 * layer, and the per-layer embedding table with its projection and norm. */
static int64_t gemma4_num_parameters(const mt_model_config *c) {
    const int64_t D = c->emb_dim, V = c->vocab_size, P = c->per_layer_input_dim, L = c->num_decoder_layers;
    int64_t n = V * D + D; /* embed_tokens (tied lm_head), norm */
    if (P > 0) n += V * L * P + L * P * D + P; /* embed_tokens_per_layer, per_layer_model_projection, _norm */
    for (int64_t l = 0; l < L; l++) {
        const int64_t Dh = mt_model_layer_head_dim(c, l), F = mt_model_layer_mlp_dim(c, l);
        const int64_t QD = c->num_query_heads * Dh, KVD = c->num_kv_heads * Dh;
        n += 4 * D + 2 * QD * D + Dh + 3 * F * D; /* norms, q, o, q_norm, mlp */
        if (mt_model_layer_kv_donor(c, l) < 0) n += 2 * KVD * D + Dh; /* k, v, k_norm */
        if (P > 0) n += 2 * P * D + D;                                 /* gate, projection, post norm */
    }
    if (!c->logits_via_embedding) n += V * D;
    return n;
}

int64_t mt_model_num_parameters(const mt_model_config *c) {
    if (c->decoder_block == MT_DECODER_GEMMA4) return gemma4_num_parameters(c);
    const int64_t D = c->emb_dim, V = c->vocab_size, F = c->mlp_dim, Dh = c->head_dim;
    const int64_t QD = c->num_query_heads * Dh, KVD = c->num_kv_heads * Dh;
    int64_t layer = D                       /* input_layernorm */
                    + QD * D + 2 * KVD * D  /* q, k, v */
                    + D * QD                /* o */
                    + D                     /* post_attention_layernorm */
                    + 3 * F * D;            /* gate, up, down */
    if (c->use_qk_norm) layer += 2 * Dh;
    if (c->use_post_attn_norm) layer += D; /* pre_feedforward_layernorm */
    if (c->use_post_ffw_norm) layer += D;
    int64_t n = V * D + c->num_decoder_layers * layer + D;
    if (!c->logits_via_embedding) n += V * D;
    return n;
}
