/* models/config.h: the model description, with MaxText's key names.
 *
 * A model is data: one decoder, configured by these fields (STYLE.md: no copy-paste
 * variants per model). configs/models/<model_name>.yml sets them with the same key
 * names (train/config.c parses them). Dimensions follow transformers' configuration_*.py and
 * the published Hugging Face config.json of each model. */
#ifndef MT_MODELS_CONFIG_H
#define MT_MODELS_CONFIG_H

#include <stdint.h>
#include "kernels/backend.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* MaxText's decoder_block values. llama2 covers Llama 2 and Llama 3 (which differ
 * only in data: GQA, rope base and scaling, vocabulary). */
typedef enum mt_decoder_block {
    MT_DECODER_LLAMA2 = 0,
    MT_DECODER_GEMMA = 1,
    MT_DECODER_GEMMA2 = 2,
    MT_DECODER_GEMMA3 = 3,
    MT_DECODER_GEMMA4 = 4  /* Gemma 4 small (E2B, E4B): transformers models/gemma4/modeling_gemma4.py */
} mt_decoder_block;

typedef enum mt_rope_type {
    MT_ROPE_DEFAULT = 0, /* inv_freq[i] = base^(-2i/Dh) */
    MT_ROPE_LLAMA3 = 1,  /* Llama 3.1 frequency scaling (transformers
                          * modeling_rope_utils.py _compute_llama3_parameters) */
    MT_ROPE_LINEAR = 2,  /* positions divided by rope_factor (HF "linear") */
    MT_ROPE_PROPORTIONAL = 3 /* Gemma 4 global layers (HF "proportional",
                          * modeling_rope_utils.py _compute_proportional_rope_parameters):
                          * the first int(rope_partial_rotary_factor * Dh / 2) frequencies
                          * base^(-2i/Dh), the rest 0 (those dims do not rotate), all
                          * divided by rope_factor */
} mt_rope_type;

typedef struct mt_model_config {
    char model_name[64];
    mt_decoder_block decoder_block;   /* decoder_block */
    int64_t vocab_size;               /* vocab_size */
    int64_t emb_dim;                  /* base_emb_dim (d_model) */
    int64_t num_query_heads;          /* base_num_query_heads */
    int64_t num_kv_heads;             /* base_num_kv_heads */
    int64_t head_dim;                 /* head_dim */
    int64_t mlp_dim;                  /* base_mlp_dim */
    int64_t num_decoder_layers;       /* base_num_decoder_layers */
    mt_activation mlp_activation;     /* mlp_activations: silu | gelu */
    float normalization_layer_epsilon;/* normalization_layer_epsilon */
    int logits_via_embedding;         /* logits_via_embedding: tied unembedding */
    float final_logits_soft_cap;      /* final_logits_soft_cap (0 = off) */
    float attn_logits_soft_cap;       /* attn_logits_soft_cap (0 = off) */
    int64_t sliding_window_size;      /* sliding_window_size (0 = off) on local layers */
    int64_t sliding_window_pattern;   /* local layers per period: gemma2 2 (1 local, 1
                                         global), gemma3 6 (5 local, 1 global); 0 = all
                                         layers global (or all local if a window is set
                                         on a gemma/llama block); gemma4 needs >= 1 */
    float query_pre_attn_scalar;      /* attention scale = this^-0.5 (0 = head_dim) */
    /* RoPE on global layers */
    float rope_max_timescale;         /* rope_max_timescale (base theta) */
    mt_rope_type rope_type;           /* rope_type: default | llama3 | linear */
    float rope_factor;                /* rope_factor (llama3 8, gemma3 global 8) */
    float rope_low_freq_factor;       /* rope_low_freq_factor (llama3 1) */
    float rope_high_freq_factor;      /* rope_high_freq_factor (llama3 4) */
    int64_t rope_original_max_position; /* rope_original_max_position (llama3 8192) */
    /* RoPE on local (sliding) layers, gemma3: default rope with this base */
    float local_rope_max_timescale;   /* local_rope_max_timescale (0 = same as global) */
    int use_qk_norm;                  /* gemma3 QK-norm */
    int use_post_attn_norm;           /* gemma2/3 post-attention norm */
    int use_post_ffw_norm;            /* gemma2/3 post-feedforward norm */
    /* Gemma 4 (transformers configuration_gemma4.py Gemma4TextConfig; zero for the
     * other blocks, which must leave them zero) */
    int64_t global_head_dim;          /* global_head_dim: head_dim of global layers (0 = head_dim) */
    int64_t num_kv_shared_layers;     /* num_kv_shared_layers: the last this many layers have no
                                         k/v of their own and attend to a donor's (0 = none) */
    int use_double_wide_mlp;          /* use_double_wide_mlp: 2 x base_mlp_dim on KV-sharing layers */
    int64_t per_layer_input_dim;      /* hidden_size_per_layer_input: width of each layer's slice
                                         of the per-layer embeddings (0 = none) */
    float rope_partial_rotary_factor; /* rope_type=proportional: share of a global head's
                                         frequencies that are non-zero (HF partial_rotary_factor) */
} mt_model_config;

/* Fill the defaults of a decoder block (norm offsets, activation, scaling, eps);
 * dimensions are left zero for the config file to set. */
void mt_model_config_defaults(mt_model_config *c, mt_decoder_block block);

/* The most decoder layers a config may have: the memory plan holds about 25 entries per
 * layer (runtime/plan.h; 16000 layers plan in under a second, bench/plan_depth.sh), and
 * the largest released models have under 200 layers. */
#define MT_MODEL_MAX_LAYERS 65536

/* Check a filled config: positive dimensions, num_query_heads % num_kv_heads == 0,
 * even head_dim <= 256 (global_head_dim <= 512), num_decoder_layers <=
 * MT_MODEL_MAX_LAYERS, known enums; gemma4: every KV-sharing
 * layer has a donor, sliding_window_pattern >= 1, rope_type default or proportional,
 * the three norms on; the gemma4 keys are zero on other blocks. Returns MT_ERR_INVALID
 * naming the key and value. */
mt_status mt_model_config_validate(const mt_model_config *c);

/* Parse / print decoder_block ("llama2", "gemma", "gemma2", "gemma3", "gemma4"). */
mt_status mt_decoder_block_parse(const char *s, mt_decoder_block *out);
const char *mt_decoder_block_name(mt_decoder_block b);

/* 1 for Gemma 1-3 (RMSNorm scale 1 + w), 0 for llama and gemma4 (plain w:
 * modeling_gemma4.py Gemma4RMSNorm); the embedding is scaled by sqrt(emb_dim) on every
 * Gemma block. */
int mt_model_norm_unit_offset(const mt_model_config *c);
float mt_model_embedding_scale(const mt_model_config *c);

/* Whether decoder layer `layer` uses the sliding window (a "local" layer). gemma4's
 * last layer is always global (configuration_gemma4.py forces layer_types[-1]). */
int mt_model_layer_is_local(const mt_model_config *c, int64_t layer);

/* Per-layer shapes (gemma4 varies them; every other block returns head_dim, mlp_dim):
 * the head dimension of layer `layer` (global_head_dim on gemma4 global layers,
 * modeling_gemma4.py Gemma4TextAttention.head_dim) and its MLP width (2 x mlp_dim on
 * KV-sharing layers with use_double_wide_mlp, Gemma4TextMLP). */
int64_t mt_model_layer_head_dim(const mt_model_config *c, int64_t layer);
int64_t mt_model_layer_mlp_dim(const mt_model_config *c, int64_t layer);

/* KV sharing (gemma4, modeling_gemma4.py Gemma4TextAttention.is_kv_shared_layer and
 * store_full_length_kv): the layers >= L - num_kv_shared_layers have no k/v projections
 * or norms and attend to the post-norm, post-RoPE K/V of their donor, the last layer
 * before L - num_kv_shared_layers of the same (local/global) kind. Returns the donor's
 * index, or -1 when `layer` computes its own K/V (and for a sharing layer without a
 * donor, which mt_model_config_validate refuses). */
int64_t mt_model_layer_kv_donor(const mt_model_config *c, int64_t layer);

/* inv_freq[Dh/2] for layer `layer` (Dh = mt_model_layer_head_dim), including llama3 /
 * linear / proportional scaling (linear scaling divides the frequencies by rope_factor,
 * which equals dividing positions). Math: HF modeling_rope_utils.py
 * (_compute_default_rope_parameters, _compute_llama3_parameters,
 * _compute_linear_scaling_rope_parameters, _compute_proportional_rope_parameters). */
void mt_rope_inv_freq(const mt_model_config *c, int64_t layer, float *inv_freq);

/* Attention score scale: query_pre_attn_scalar^-0.5 if set, else head_dim^-0.5. */
float mt_model_attn_scale(const mt_model_config *c);

/* Number of parameters (elements), counting the unembedding once when tied; as
 * transformers' num_parameters() counts them (gemma4: per-layer embeddings and their
 * projection included, k/v of KV-sharing layers and the layer_scalar buffers not). */
int64_t mt_model_num_parameters(const mt_model_config *c);

#ifdef __cplusplus
}
#endif
#endif
