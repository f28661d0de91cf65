/* fuzz/hf_config_same.h: whether two model configs describe the same model, as the
 * decoder uses them (shared by fuzz/fuzz_hf_config.c and tests/tools/hf_config_check.c:
 * a config.json that meshtrain writes must read back as the model it was written from). */
#ifndef MT_FUZZ_HF_CONFIG_SAME_H
#define MT_FUZZ_HF_CONFIG_SAME_H

#include "models/config.h"

/* 1 when every model field agrees (model_name excluded; rope scaling constants only
 * where the rope type uses them; which layers are local, their window and, on gemma3
 * and gemma4, their RoPE base; gemma4's per-layer head dims, MLP widths, KV donors and
 * per-layer input width), else 0. */
static inline int mt_config_same(const mt_model_config *a, const mt_model_config *b) {
    int ok = a->decoder_block == b->decoder_block && a->vocab_size == b->vocab_size && a->emb_dim == b->emb_dim &&
             a->num_query_heads == b->num_query_heads && a->num_kv_heads == b->num_kv_heads &&
             a->head_dim == b->head_dim && a->mlp_dim == b->mlp_dim &&
             a->num_decoder_layers == b->num_decoder_layers && a->mlp_activation == b->mlp_activation &&
             a->normalization_layer_epsilon == b->normalization_layer_epsilon &&
             a->logits_via_embedding == b->logits_via_embedding &&
             a->final_logits_soft_cap == b->final_logits_soft_cap &&
             a->attn_logits_soft_cap == b->attn_logits_soft_cap && a->query_pre_attn_scalar == b->query_pre_attn_scalar &&
             a->rope_max_timescale == b->rope_max_timescale && a->rope_type == b->rope_type &&
             a->use_qk_norm == b->use_qk_norm && a->use_post_attn_norm == b->use_post_attn_norm &&
             a->use_post_ffw_norm == b->use_post_ffw_norm;
    if (ok && a->rope_type != MT_ROPE_DEFAULT) ok = a->rope_factor == b->rope_factor;
    if (ok && a->rope_type == MT_ROPE_PROPORTIONAL) ok = a->rope_partial_rotary_factor == b->rope_partial_rotary_factor;
    if (ok && a->rope_type == MT_ROPE_LLAMA3)
        ok = a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
             a->rope_original_max_position == b->rope_original_max_position;
    /* local layers and their window / RoPE base, as the model uses them */
    for (int64_t l = 0; ok && l < a->num_decoder_layers; l++) {
        int la = mt_model_layer_is_local(a, l), lb = mt_model_layer_is_local(b, l);
        ok = la == lb && (!la || a->sliding_window_size == b->sliding_window_size);
    }
    if (ok && (a->decoder_block == MT_DECODER_GEMMA3 || a->decoder_block == MT_DECODER_GEMMA4))
        ok = a->local_rope_max_timescale == b->local_rope_max_timescale;
    if (ok) ok = a->per_layer_input_dim == b->per_layer_input_dim;
    for (int64_t l = 0; ok && l < a->num_decoder_layers; l++)
        ok = mt_model_layer_head_dim(a, l) == mt_model_layer_head_dim(b, l) &&
             mt_model_layer_mlp_dim(a, l) == mt_model_layer_mlp_dim(b, l) &&
             mt_model_layer_kv_donor(a, l) == mt_model_layer_kv_donor(b, l);
    return ok;
}

#endif
