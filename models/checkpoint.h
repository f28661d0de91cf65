/* models/checkpoint.h: model weights as Hugging Face safetensors + config.json.
 *
 * A checkpoint directory holds model.safetensors with Hugging Face tensor names
 * (models/model.h mt_model_param; linear weights [out, in]) and a config.json that
 * transformers' AutoConfig reads (llama / gemma / gemma2 / gemma3_text). Loading also
 * accepts sharded checkpoints (model.safetensors.index.json with a "weight_map" from
 * tensor name to shard file). Field names: transformers' configuration_llama.py /
 * configuration_gemma.py / configuration_gemma2.py / configuration_gemma3.py and the
 * published config.json of each model. */
#ifndef MT_MODELS_CHECKPOINT_H
#define MT_MODELS_CHECKPOINT_H

#include "models/config.h"
#include "models/model.h"
#include "runtime/dtype.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Write dir/model.safetensors (every parameter of m under its HF name, in dtype
 * MT_F32 or MT_BF16 (round to nearest even)) and dir/config.json
 * (mt_hf_config_write). Creates dir (and missing parents). Each file is written
 * atomically (tmp + fsync + rename). The parameters are copied to the host with the
 * model's be->ops->copy_to_host.
 * Errors: MT_ERR_INVALID (dtype not F32/BF16), MT_ERR_IO, MT_ERR_OOM. */
mt_status mt_checkpoint_save_model(const char *dir, mt_model *m, mt_dtype dtype);

/* mt_checkpoint_save_model with extra model.safetensors __metadata__: metadata is NULL
 * or a NULL-terminated list key, value, key, value, ..., NULL (at most 16 pairs; the
 * key "format" is reserved: it is always "pt", first). The trainer records there which
 * checkpoint the file belongs to (train/trainer.h). Errors: those of
 * mt_checkpoint_save_model; MT_ERR_INVALID for a "format" key or more than 16 pairs. */
mt_status mt_checkpoint_save_model_meta(const char *dir, mt_model *m, mt_dtype dtype, const char *const *metadata);

/* mt_checkpoint_save_model_meta from host_params[mt_model_numel(m)] (host memory, the
 * model's flat layout: mt_model_param offsets) instead of the model's bound parameters:
 * for a model whose parameters are sharded (fsdp), after the caller gathered them.
 * Errors: those of mt_checkpoint_save_model_meta; MT_ERR_INVALID (host_params NULL). */
mt_status mt_checkpoint_save_host(const char *dir, mt_model *m, const float *host_params, mt_dtype dtype,
                                  const char *const *metadata);

/* Load the parameters of m from dir/model.safetensors, or from the shards listed in
 * dir/model.safetensors.index.json when that exists. Every model parameter must be
 * present with the same shape (error names the tensor, the expected and the found
 * shapes); lm_head.weight may be absent when the model ties embeddings; tensors the
 * model does not have are an error naming them, except known-ignorable buffers
 * (names ending in "rotary_emb.inv_freq") and lm_head.weight in a tied model (some
 * tied HF checkpoints store the shared matrix twice; it is not read). For gemma3, a
 * multimodal checkpoint (Gemma3ForConditionalGeneration) loads its text model:
 * "language_model.model.*" / "model.language_model.*" are read as "model.*",
 * "language_model.lm_head.*" as "lm_head.*", and vision_tower / multi_modal_projector
 * tensors are skipped. For gemma4 (transformers modeling_gemma4.py) the same name
 * mapping applies to Gemma4ForConditionalGeneration files, whose vision_tower,
 * audio_tower, embed_vision and embed_audio tensors are skipped, and the k/v
 * projections and norms of KV-sharing layers, which published files carry, are
 * ignored (as transformers ignores them); "model.layers.N.layer_scalar" is read like a
 * parameter (mt_param_info.buffer). F32/BF16/F16/F64
 * data are converted to float32 (NaN/Inf rejected) and copied with
 * be->ops->copy_to_device, one tensor at a time through one host buffer.
 * Names and shapes are all checked before anything is copied into m; a NaN/Inf is
 * found while copying, so after that error m holds a mix of old and new values and
 * must not be used.
 * Errors: MT_ERR_IO (missing file), MT_ERR_FORMAT (bad file, missing/extra tensor,
 * shape mismatch, NaN), MT_ERR_OOM. */
mt_status mt_checkpoint_load_model(const char *dir, mt_model *m);

/* mt_checkpoint_load_model into host_params[mt_model_numel(m)] (host memory, the model's
 * flat layout) instead of the model's bound parameters, which are not touched: for a
 * sharded model (fsdp), whose caller keeps its shard. Same checks and errors;
 * MT_ERR_INVALID (host_params NULL). */
mt_status mt_checkpoint_load_host(const char *dir, mt_model *m, float *host_params);

/* Write a Hugging Face config.json for c: model_type llama | gemma | gemma2 |
 * gemma3_text | gemma4_text, architectures, vocab_size, hidden_size, intermediate_size,
 * num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
 * hidden_act / hidden_activation (silu | gelu_pytorch_tanh), rms_norm_eps, rope_theta,
 * rope_scaling (null, {"rope_type": "llama3", factor, low_freq_factor,
 * high_freq_factor, original_max_position_embeddings} or {"rope_type": "linear",
 * factor}), tie_word_embeddings, max_position_embeddings; gemma2 adds
 * query_pre_attn_scalar, sliding_window, attn_logit_softcapping,
 * final_logit_softcapping; gemma3 adds query_pre_attn_scalar, sliding_window,
 * sliding_window_pattern, rope_local_base_freq; gemma4 (Gemma4ForCausalLM,
 * transformers configuration_gemma4.py Gemma4TextConfig) writes rope_parameters per
 * layer type (full_attention proportional or default, sliding_attention default),
 * global_head_dim, num_kv_shared_layers, use_double_wide_mlp,
 * hidden_size_per_layer_input, vocab_size_per_layer_input (= vocab_size),
 * sliding_window, final_logit_softcapping (a JSON real: that class is strictly typed)
 * and layer_types, no query_pre_attn_scalar. Atomic (tmp + rename).
 * Errors: MT_ERR_IO, MT_ERR_OOM, MT_ERR_INVALID (gemma4 with llama3/linear RoPE). */
mt_status mt_hf_config_write(const char *path, const mt_model_config *c);

/* Read a Hugging Face config.json into c (filled from mt_model_config_defaults of
 * the block given by model_type, then the file's fields). Accepts rope_theta +
 * rope_scaling or rope_parameters (flat, or per attention type
 * {"full_attention": ..., "sliding_attention": ...}), gemma3 / gemma4 files that nest
 * the text model under "text_config", sliding_window_pattern or layer_types, and
 * hidden_act / hidden_activation. gemma4 (model_type gemma4 or gemma4_text): the global
 * head dim from global_head_dim (transformers 5.5) or per_layer_config (5.17), the
 * KV-sharing and per-layer-input keys, rope_type proportional; refuses
 * attention_k_eq_v, enable_moe_block, use_bidirectional_attention "all" and a per-layer
 * vocabulary other than vocab_size (MT_ERR_FORMAT naming the key). Unknown keys are
 * ignored.
 * Errors: MT_ERR_IO (cannot read), MT_ERR_FORMAT naming the file and the key (invalid
 * JSON, unknown model_type, wrong type or out-of-range value, unknown activation or
 * rope type), MT_ERR_OOM. The result is not validated (mt_model_config_validate). */
mt_status mt_hf_config_read(const char *path, mt_model_config *c);

#ifdef __cplusplus
}
#endif
#endif
