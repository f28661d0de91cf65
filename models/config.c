/* models/config.c: decoder-block defaults, validation and the derived quantities of a
 * model config (norm offset, embedding scale, local/global layers, RoPE frequencies,
 * attention scale, parameter count). Facts: Hugging Face transformers'
 * modeling_llama.py / modeling_gemma*.py / modeling_rope_utils.py. */
#include "models/config.h"

#include <math.h>
#include <string.h>

static const char *const k_block_names[] = {"llama2", "gemma", "gemma2", "gemma3"};

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
    default:
        break;
    }
}

mt_status mt_model_config_validate(const mt_model_config *c) {
    if (!c) return mt_set_error(MT_ERR_INVALID, "model config is NULL");
    if ((int)c->decoder_block < 0 || (int)c->decoder_block > (int)MT_DECODER_GEMMA3)
        return mt_set_error(MT_ERR_INVALID, "decoder_block=%d is not one of llama2|gemma|gemma2|gemma3",
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
        return mt_set_error(MT_ERR_INVALID, "rope_type=%d is not one of default|llama3|linear",
                            (int)c->rope_type);
    }
    return MT_OK;
}

mt_status mt_decoder_block_parse(const char *s, mt_decoder_block *out) {
    if (s)
        for (int i = 0; i < 4; i++)
            if (strcmp(s, k_block_names[i]) == 0) {
                *out = (mt_decoder_block)i;
                return MT_OK;
            }
    return mt_set_error(MT_ERR_INVALID, "decoder_block=%s is not one of llama2|gemma|gemma2|gemma3",
                        s ? s : "(null)");
}

const char *mt_decoder_block_name(mt_decoder_block b) {
    if ((int)b < 0 || (int)b > 3) return "unknown";
    return k_block_names[b];
}

int mt_model_norm_unit_offset(const mt_model_config *c) {
    return c->decoder_block != MT_DECODER_LLAMA2;
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
    /* HF gemma2: sliding on even layers; gemma3: sliding unless (layer+1) % pattern == 0.
     * Both are "the last layer of each period is global". */
    return ((layer + 1) % c->sliding_window_pattern) != 0;
}

void mt_rope_inv_freq(const mt_model_config *c, int64_t layer, float *inv_freq) {
    const int64_t half = c->head_dim / 2;
    const int local = mt_model_layer_is_local(c, layer) && c->local_rope_max_timescale > 0.0f;
    const double base = local ? (double)c->local_rope_max_timescale : (double)c->rope_max_timescale;
    const mt_rope_type type = local ? MT_ROPE_DEFAULT : c->rope_type;
    const double factor = (double)c->rope_factor;
    const double pi = 3.14159265358979323846;
    for (int64_t i = 0; i < half; i++) {
        /* _compute_default_rope_parameters: 1 / base^(2i / dim) */
        double f = 1.0 / pow(base, (double)(2 * i) / (double)c->head_dim);
        if (type == MT_ROPE_LINEAR) {
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

int64_t mt_model_num_parameters(const mt_model_config *c) {
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
