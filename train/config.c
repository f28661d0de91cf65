/* train/config.c: the key table, YAML loading (libyaml), precedence and validation
 * (see config.h). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "train/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

_Static_assert(sizeof(mt_dtype) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(mt_backend_kind) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(mt_decoder_block) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(mt_rope_type) == sizeof(int), "enum keys are stored as int");
_Static_assert(sizeof(mt_activation) == sizeof(int), "enum keys are stored as int");

/* ---------------------------------------------------------------- key table ---- */

static const char *const decoder_names[] = {"llama2", "gemma", "gemma2", "gemma3", "gemma4", NULL};
static const int decoder_values[] = {MT_DECODER_LLAMA2, MT_DECODER_GEMMA, MT_DECODER_GEMMA2,
                                     MT_DECODER_GEMMA3, MT_DECODER_GEMMA4};
static const char *const rope_names[] = {"default", "llama3", "linear", "proportional", NULL};
static const int rope_values[] = {MT_ROPE_DEFAULT, MT_ROPE_LLAMA3, MT_ROPE_LINEAR, MT_ROPE_PROPORTIONAL};
static const char *const dtype_names[] = {"float32", "bfloat16", NULL};
static const int dtype_values[] = {MT_F32, MT_BF16};
static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};
static const char *const ga_reduce_names[] = {"once", "every", NULL};
static const int ga_reduce_values[] = {0, 1};
static const char *const cp_strategy_names[] = {"all_gather", "ring", NULL};
static const int cp_strategy_values[] = {0, 1};
static const char *const param_window_names[] = {"layer", "weight", NULL};
static const int param_window_values[] = {0, 1};
static const int backend_values[] = {MT_BACKEND_AUTO, MT_BACKEND_CPU, MT_BACKEND_CUDA};

#define POLICY_NAME_(id, name, ...) name,
#define POLICY_VALUE_(id, ...) MT_REMAT_##id,
static const char *const remat_policy_names[] = {MT_REMAT_POLICIES(POLICY_NAME_) NULL};
static const int remat_policy_values[] = {MT_REMAT_POLICIES(POLICY_VALUE_)};
static const char *const remat_action_names[] = {"remat", "offload", "device", NULL};
static const int remat_action_values[] = {MT_RA_REMAT, MT_RA_OFFLOAD, MT_RA_DEVICE};
/* One enum key per remat name (the RT rows of models/remat.h MT_LAYER_TENSORS):
 * remat_custom[MT_RT_id], default DEVICE -> "device", REMAT -> "remat". */
#define REMAT_DEFAULT_DEVICE "device"
#define REMAT_DEFAULT_REMAT "remat"
#define REMAT_SKIP_(...)
#define REMAT_KEY_(id, name, def, doc)                                                                   \
    {name, MT_KEY_ENUM, offsetof(mt_train_config, remat_custom) + (MT_RT_##id) * sizeof(int), 0,          \
     remat_action_names, remat_action_values, 0, REMAT_DEFAULT_##def, 0, 0, 0, 0, doc},

#define OFF(f) offsetof(mt_train_config, f)
#define MOFF(f) (offsetof(mt_train_config, model) + offsetof(mt_model_config, f))
#define SZ(f) sizeof(((mt_train_config *)0)->f)
#define MSZ(f) sizeof(((mt_train_config *)0)->model.f)

/* Model keys: no textual default (it comes from the decoder block). */
#define MKEY_INT(n, f, lo, doc) {n, MT_KEY_INT, MOFF(f), 0, NULL, NULL, 1, NULL, 1, 0, lo, 0, doc}
#define MKEY_FLT(n, f, lo, doc) {n, MT_KEY_FLOAT, MOFF(f), 0, NULL, NULL, 1, NULL, 1, 0, lo, 0, doc}
#define MKEY_BOOL(n, f, doc) {n, MT_KEY_BOOL, MOFF(f), 0, NULL, NULL, 1, NULL, 0, 0, 0, 0, doc}
/* Run keys. */
#define RKEY_INT(n, def, lo, doc) {#n, MT_KEY_INT, OFF(n), 0, NULL, NULL, 0, def, 1, 0, lo, 0, doc}
#define RKEY_DBL(n, def, hasmin, lo, hasmax, hi, doc) \
    {#n, MT_KEY_DOUBLE, OFF(n), 0, NULL, NULL, 0, def, hasmin, hasmax, lo, hi, doc}
#define RKEY_STR(n, def, doc) {#n, MT_KEY_STRING, OFF(n), SZ(n), NULL, NULL, 0, def, 0, 0, 0, 0, doc}
#define RKEY_ENUM(n, names, values, def, doc) \
    {#n, MT_KEY_ENUM, OFF(n), 0, names, values, 0, def, 0, 0, 0, 0, doc}

static const mt_config_key mt_keys[] = {
    /* ---- run keys (configs/base.yml documents each with the same default) ---- */
    {"model_name", MT_KEY_STRING, MOFF(model_name), MSZ(model_name), NULL, NULL, 0, "llama3-tiny",
     0, 0, 0, 0, "model file configs/models/<model_name>.yml"},
    RKEY_STR(run_name, "run", "outputs go to <base_output_directory>/<run_name>/"),
    RKEY_STR(base_output_directory, "outputs", "root directory of run outputs"),
    RKEY_STR(dataset_path, "data/kjv", "directory (or glob) of llm.c shards: train_*.bin / val_*.bin or llm.c's "
             "<name>_train_*.bin / <name>_val_*.bin (one naming per split)"),
    /* data: splits and shuffling (train/data.h) */
    RKEY_STR(train_files, "", "train shards: a file, a glob or a list ([a, b] or a,b); \"\" or [] = unset: "
             "dataset_path's train split; an empty entry or a glob matching nothing is an error"),
    RKEY_STR(eval_files, "", "validation shards: a file, a glob or a list; \"\" or [] = dataset_path's val split; "
             "checked whenever set, even with eval_interval <= 0"),
    {"enable_data_shuffling", MT_KEY_BOOL, OFF(enable_data_shuffling), 0, NULL, NULL, 0, "true", 0, 0, 0, 0,
     "shuffle the train split: shard order and step order within each shard permuted every epoch (the val "
     "split never is); false = file order"},
    RKEY_INT(data_shuffle_seed, "-1", -1, "seed of the data shuffle (Philox); -1 = seed"),
    RKEY_STR(tokenizer_path, "data/kjv/tokenizer.vocab",
             "`sample`'s tokenizer: a Hugging Face tokenizer.json (or a model directory holding one) or a "
             "SentencePiece .vocab (piece<TAB>score per id; its .model beside it encodes a text prompt); the model's "
             "vocab_size may exceed its size only by padding to a multiple of 1024"),
    RKEY_INT(per_device_batch_size, "8", 1, "sequences per micro-batch on each device"),
    RKEY_INT(max_target_length, "256", 1, "tokens per sequence"),
    RKEY_INT(steps, "1000", 1, "optimizer steps; the LR schedule ends here"),
    RKEY_DBL(learning_rate, "0.0003", 1, 0, 0, 0, "peak learning rate (after warmup)"),
    RKEY_DBL(warmup_steps_fraction, "0.1", 1, 0, 1, 1,
             "linear warmup from 0 over int(steps * this) steps"),
    RKEY_DBL(cosine_learning_rate_final_fraction, "0.1", 1, 0, 1, 1,
             "cosine decay to learning_rate * this at `steps`"),
    RKEY_DBL(adam_b1, "0.9", 1, 0, 1, 1, "AdamW beta1 (< 1)"),
    RKEY_DBL(adam_b2, "0.95", 1, 0, 1, 1, "AdamW beta2 (< 1)"),
    RKEY_DBL(adam_eps, "1e-08", 0, 0, 0, 0, "AdamW epsilon (> 0), added to sqrt(v_hat)"),
    RKEY_DBL(adam_weight_decay, "0.1", 1, 0, 0, 0,
             "decoupled weight decay on matrices (not norm scales)"),
    RKEY_DBL(gradient_clipping_threshold, "1", 1, 0, 0, 0, "clip the global gradient norm; 0 = off"),
    RKEY_INT(gradient_accumulation_steps, "1", 1, "micro-batches per optimizer step"),
    RKEY_INT(num_vocab_tiling, "0", 0, "row tiles of the vocab-tiled loss (1..batch*seq); 0 = auto: the fewest "
             "tiles whose loss tile is no larger than one decoder layer's parameters, or with the vocabulary in chunks "
             "than the largest layer weight (plan prints the count)"),
    RKEY_INT(num_vocab_chunks, "0", 0, "vocabulary chunks the embedding, lm_head and loss are taken in "
             "(1..vocab_size); 0 = auto: with fsdp, parameter offload or gradient windows and no tensor axis, the "
             "fewest chunks no larger than the largest decoder-layer weight (the layer gradient window: with "
             "grad_window_chunks its largest row block), else 1; "
             "with more than 1, gemma4's per-layer embedding table comes in chunks too, at least as many and none "
             "larger than that weight (plan prints both)"),
    RKEY_ENUM(dtype, dtype_names, dtype_values, "float32", "compute and activation dtype"),
    RKEY_ENUM(weight_dtype, dtype_names, dtype_values, "float32",
              "master weight dtype: float32 only for now (bfloat16 masters are refused; dtype=bfloat16 computes in "
              "bf16 from fp32 masters)"),
    RKEY_ENUM(grad_dtype, dtype_names, dtype_values, "float32",
              "gradient accumulation dtype (bfloat16: fp32 add, one rounding per micro-batch)"),
    RKEY_INT(eval_interval, "100", -1, "evaluate every this many steps (and at step 0); <= 0 = off"),
    RKEY_INT(eval_steps, "10", 1, "validation batches per evaluation (capped at one pass over the val split)"),
    RKEY_INT(checkpoint_period, "1000", 0, "checkpoint every this many steps and at the end; 0 = end only"),
    RKEY_STR(load_checkpoint, "", "checkpoint directory (.../checkpoints/step_N) to resume from"),
    RKEY_STR(load_parameters_path, "", "directory with model.safetensors to start from (no optimizer state)"),
    RKEY_INT(seed, "0", 0, "seed of parameter init and sampling (Philox)"),
    RKEY_ENUM(backend, backend_names, backend_values, "auto", "auto = cuda when a GPU is visible, else cpu"),
    RKEY_INT(log_period, "10", 1, "console line every this many steps"),
    RKEY_INT(sample_length, "64", 1, "`sample`: tokens to generate after <s>"),
    RKEY_DBL(temperature, "1", 1, 0, 0, 0, "`sample`: softmax temperature; 0 = greedy"),
    RKEY_INT(top_k, "0", 0, "`sample`: keep the k most likely tokens (k <= vocab_size); 0 = all"),
    /* `sample`'s prompt (train/tokenizer.h, scripts/prepare_data.py) */
    RKEY_STR(prompt, "", "`sample`: text to continue, encoded by the tokenizer (MaxText's key); \"\" = start from BOS"),
    RKEY_STR(prompt_ids, "", "`sample`: token ids to continue (\"2,651,3\", \"2 651 3\" or [2, 651, 3]), used as given "
             "(BOS included); instead of prompt; \"\" or [] = unset; an empty entry (1,,2) is an error"),
    /* packed documents: document masking (models/model.h mt_model_layout packing) */
    {"packing", MT_KEY_BOOL, OFF(packing), 0, NULL, NULL, 0, "false", 0, 0, 0, 0,
     "document masking (MaxText's packing): each packing_separator_id token starts a document; attention "
     "stays inside documents and RoPE positions restart at each; every label still counts"},
    {"packing_separator_id", MT_KEY_INT, OFF(packing_separator_id), 0, NULL, NULL, 0, "1", 1, 1, 0, 2147483647.0, "with packing: the token that starts each document, the tokenizer's "
             "BOS (1: the demo corpus, Llama 2; 2: Gemma; 128000: Llama 3)"},
    /* parallelism (parallel/mesh.h, parallel/zero1.h) */
    RKEY_INT(ici_data_parallelism, "1", -1, "data-parallel axis size; -1 = fill the world"),
    RKEY_INT(ici_fsdp_parallelism, "1", -1,
             "fsdp axis size (parameters sharded over it; optimizer state over data x fsdp x context); -1 = fill"),
    RKEY_INT(ici_context_parallelism, "1", -1, "context-parallel axis size (sequence in 2C chunks); -1 = fill"),
    RKEY_INT(ici_tensor_parallelism, "1", -1, "tensor-parallel axis size (Megatron column/row); -1 = fill"),
    {"shard_optimizer_over_data", MT_KEY_BOOL, OFF(shard_optimizer_over_data), 0, NULL, NULL, 0, "false", 0, 0,
     0, 0, "ZeRO-1: fp32 master and AdamW moments sharded over data x context (always on with fsdp), "
     "gradients reduce-scattered"},
    RKEY_ENUM(gradient_accumulation_reduce, ga_reduce_names, ga_reduce_values, "once",
              "once = reduce after the last micro-batch (full accumulator); every = reduce-scatter each "
              "micro-batch into the ZeRO-1 shard accumulator"),
    {"overlap_grad_reduce", MT_KEY_BOOL, OFF(overlap_grad_reduce), 0, NULL, NULL, 0, "false", 0, 0, 0, 0,
     "true: where layer gradients are reduce-scattered one parameter at a time (ZeRO-1, fsdp) over more than "
     "one rank, each parameter's reduce-scatter runs while the next one's gradient is computed, for one more "
     "fp32 gradient window of the largest layer parameter (\"grads.window.layer.overlap\"; 3.49 GB per device "
     "for llama3.1-405b); false: blocking, one window (Megatron-LM's overlap_grad_reduce, off by default there "
     "too)"},
    RKEY_ENUM(context_parallel_strategy, cp_strategy_names, cp_strategy_values, "all_gather",
              "context parallelism: all_gather keys/values, or pass them around a ring"),
    {"tensor_sequence_parallelism", MT_KEY_BOOL, OFF(tensor_sequence_parallelism), 0, NULL, NULL, 0, "false", 0,
     0, 0, 0, "Megatron sequence parallelism on the tensor axis: norms and residual adds on sequence shards, "
     "reduce-scatter / all-gather instead of all-reduce"},
    RKEY_DBL(collective_timeout_s, "30", 0, 0, 0, 0,
             "a collective running longer than this (seconds, > 0) ends the rank with a message"),
    /* memory: remat, host offload, planning (models/remat.h, train/estimate.h) */
    RKEY_ENUM(remat_policy, remat_policy_names, remat_policy_values, "minimal_with_context",
              "what each layer keeps for the backward (MaxText names); minimal_with_context keeps all, "
              "full keeps only decoder_layer_input, custom reads the nine tensor keys"),
    MT_LAYER_TENSORS(REMAT_SKIP_, REMAT_KEY_)
    {"parameter_memory_host_offload", MT_KEY_BOOL, OFF(parameter_memory_host_offload), 0, NULL, NULL, 0, "false",
     0, 0, 0, 0, "parameters live in a host pool (page-locked on cuda), moved to the device a layer at a time"},
    RKEY_ENUM(param_window_unit, param_window_names, param_window_values, "layer",
              "with fsdp or parameter_memory_host_offload, what the device's two parameter windows hold: "
              "layer = a decoder layer each (gathered once per forward and once per backward); weight = a "
              "weight each (the largest parameter's size, ~1/4 of a Llama layer's: for llama3.1-405b in bf16 "
              "the two windows are 3.49 GB instead of 12.75 GB per device), gathered in the order the layer "
              "reads them, so with remat the backward gathers some again (llama3.1-405b on fsdp 1024 with "
              "remat_policy=full: +11.6% of the step's collective bytes; more with few layers)"),
    RKEY_INT(grad_window_chunks, "1", 0,
             "where layer gradients go to a gradient sink (fsdp, ZeRO-1) one parameter at a time, each weight's "
             "fp32 gradient in this many row blocks, each reduce-scattered on its own, so the gradient window is "
             "1/k of the largest weight (0 or 1: whole weights; not with ici_tensor_parallelism > 1); each block "
             "is its own GEMM, which may sum in another order: results within fp32 rounding, not bitwise"),
    {"optimizer_memory_host_offload", MT_KEY_BOOL, OFF(optimizer_memory_host_offload), 0, NULL, NULL, 0, "false",
     0, 0, 0, 0, "AdamW moments live in a host pool apart from the device arena (page-locked on cuda: AdamW "
     "reads and writes them in place)"},
    RKEY_DBL(hbm_gib, "0", 1, 0, 0, 0, "`estimate`: device memory budget in GiB (> 0 there); 0 = unset"),
    RKEY_INT(num_devices, "1", 1,
             "`plan`/`estimate`: devices of the job; the ici_* axes multiply to it (an ici_* axis of -1 takes what the others leave; all 1 = fsdp)"),
    /* ---- model keys (configs/models/<model_name>.yml) ---- */
    {"decoder_block", MT_KEY_ENUM, MOFF(decoder_block), 0, decoder_names, decoder_values, 1, NULL, 0,
     0, 0, 0, "decoder family"},
    MKEY_INT("vocab_size", vocab_size, 1, "vocabulary size"),
    MKEY_INT("base_emb_dim", emb_dim, 1, "model width d_model"),
    MKEY_INT("base_num_query_heads", num_query_heads, 1, "query heads"),
    MKEY_INT("base_num_kv_heads", num_kv_heads, 1, "key/value heads (GQA)"),
    MKEY_INT("head_dim", head_dim, 1, "per-head dimension"),
    MKEY_INT("base_mlp_dim", mlp_dim, 1, "MLP hidden size"),
    MKEY_INT("base_num_decoder_layers", num_decoder_layers, 1, "decoder layers"),
    {"mlp_activations", MT_KEY_ACTIVATIONS, MOFF(mlp_activation), 0, NULL, NULL, 1, NULL, 0, 0, 0, 0,
     "[silu, linear] (SwiGLU) or [gelu, linear] (GeGLU, tanh gelu)"},
    MKEY_FLT("normalization_layer_epsilon", normalization_layer_epsilon, 0, "RMSNorm epsilon"),
    MKEY_BOOL("logits_via_embedding", logits_via_embedding, "tie the unembedding to the embedding"),
    MKEY_FLT("final_logits_soft_cap", final_logits_soft_cap, 0, "final logit soft-cap; 0 = off"),
    MKEY_FLT("attn_logits_soft_cap", attn_logits_soft_cap, 0, "attention logit soft-cap; 0 = off"),
    MKEY_INT("sliding_window_size", sliding_window_size, 0, "sliding window of local layers; 0 = off"),
    MKEY_INT("sliding_window_pattern", sliding_window_pattern, 0,
             "local/global layer period, its last layer global; 0 = none (gemma4: >= 1)"),
    MKEY_FLT("query_pre_attn_scalar", query_pre_attn_scalar, 0, "attention scale^-2; 0 = head_dim"),
    MKEY_FLT("rope_max_timescale", rope_max_timescale, 0, "RoPE base theta"),
    {"rope_type", MT_KEY_ENUM, MOFF(rope_type), 0, rope_names, rope_values, 1, NULL, 0, 0, 0, 0,
     "RoPE frequency scaling"},
    MKEY_FLT("rope_factor", rope_factor, 0, "RoPE scaling factor"),
    MKEY_FLT("rope_low_freq_factor", rope_low_freq_factor, 0, "llama3 RoPE low_freq_factor"),
    MKEY_FLT("rope_high_freq_factor", rope_high_freq_factor, 0, "llama3 RoPE high_freq_factor"),
    MKEY_INT("rope_original_max_position", rope_original_max_position, 0,
             "llama3 RoPE original_max_position_embeddings"),
    MKEY_FLT("local_rope_max_timescale", local_rope_max_timescale, 0,
             "RoPE base of local layers (gemma3); 0 = rope_max_timescale"),
    MKEY_BOOL("use_qk_norm", use_qk_norm, "RMSNorm on each query/key head (gemma3)"),
    MKEY_BOOL("use_post_attn_norm", use_post_attn_norm, "norm after attention (gemma2/3)"),
    MKEY_BOOL("use_post_ffw_norm", use_post_ffw_norm, "norm after the MLP (gemma2/3/4)"),
    MKEY_INT("global_head_dim", global_head_dim, 0, "head_dim of global layers (gemma4); 0 = head_dim"),
    MKEY_INT("num_kv_shared_layers", num_kv_shared_layers, 0,
             "the last N layers reuse the K/V of the last earlier layer of their kind (gemma4)"),
    MKEY_BOOL("use_double_wide_mlp", use_double_wide_mlp, "2 x base_mlp_dim on KV-sharing layers (gemma4)"),
    MKEY_INT("per_layer_input_dim", per_layer_input_dim, 0,
             "per-layer embedding width per layer (gemma4 hidden_size_per_layer_input); 0 = none"),
    MKEY_FLT("rope_partial_rotary_factor", rope_partial_rotary_factor, 0,
             "rope_type=proportional: share of the frequencies that rotate, in (0, 1] (gemma4 0.25)"),
};

#define MT_KEY_N ((int)(sizeof mt_keys / sizeof mt_keys[0]))
#define PATH_MAX_MT 4096 /* realpath(3) output (PATH_MAX on Linux) */

/* What a number key accepts, where the table's inclusive bounds (has_min / has_max)
 * would say less than the checks after them (mt_train_config_validate,
 * mt_model_config_validate, `estimate`, `sample`): a range message prints this instead,
 * so that it never offers a value that another check refuses (hbm_gib=-1 said ">= 0",
 * and estimate refuses 0). tests/test_config.c range_messages_say_what_is_accepted
 * holds each bare text to what a load accepts. */
static const struct { const char *key, *accepts; } key_accepts[] = {
    {"ici_data_parallelism", "-1 (fill the world) or >= 1"},
    {"ici_fsdp_parallelism", "-1 (fill the world) or >= 1"},
    {"ici_context_parallelism", "-1 (fill the world) or >= 1"},
    {"ici_tensor_parallelism", "-1 (fill the world) or >= 1"},
    {"adam_b1", "in [0, 1)"},
    {"adam_b2", "in [0, 1)"},
    {"hbm_gib", "> 0 (GiB), or 0 = unset (estimate needs a budget > 0)"},
    {"num_devices", "in [1, 2^30]"},
    {"top_k", "in [0, vocab_size] (0 = all)"},
    {"sample_length", "in [1, 2147483646]"},
    {"num_vocab_tiling", "0 (auto) or in [1, per_device_batch_size * max_target_length]"},
    {"num_vocab_chunks", "0 (auto) or in [1, vocab_size]"},
    {"packing_separator_id", "in [0, 2147483647], and below vocab_size with packing=true"},
    {"vocab_size", "in [1, 2147483647]"},
    {"base_num_kv_heads", ">= 1, dividing base_num_query_heads"},
    {"head_dim", "even, in [2, 256]"},
    {"normalization_layer_epsilon", "> 0"},
    {"sliding_window_pattern", ">= 0 (0 = no pattern), and >= 1 with decoder_block=gemma4"},
    {"rope_max_timescale", "> 0"},
    {"rope_factor", ">= 0, and > 0 with rope_type linear, llama3 or proportional"},
    {"rope_low_freq_factor", ">= 0, and > 0 with rope_type llama3"},
    {"rope_high_freq_factor", ">= 0, and above rope_low_freq_factor with rope_type llama3"},
    {"rope_original_max_position", ">= 0, and >= 1 with rope_type llama3"},
    {"global_head_dim", "even, in [0, 512] (0 = head_dim; gemma4 only)"},
    {"num_kv_shared_layers", "in [0, base_num_decoder_layers) (gemma4 only)"},
    {"per_layer_input_dim", ">= 0 (0 = none; gemma4 only)"},
    {"rope_partial_rotary_factor", ">= 0, and in (0, 1] with rope_type proportional"},
};

const char *mt_config_key_accepts(const mt_config_key *k, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    buf[0] = '\0';
    if (!k) return buf;
    for (size_t i = 0; i < sizeof key_accepts / sizeof key_accepts[0]; i++)
        if (strcmp(key_accepts[i].key, k->name) == 0) {
            snprintf(buf, n, "%s", key_accepts[i].accepts);
            return buf;
        }
    /* integers whole (packing's 2147483647, not %g's 2.14748e+09) */
    const char *f = k->type == MT_KEY_INT ? "%.0f" : "%g";
    char lo[64], hi[64];
    snprintf(lo, sizeof lo, f, k->min);
    snprintf(hi, sizeof hi, f, k->max);
    if (k->has_min && k->has_max) snprintf(buf, n, "in [%s, %s]", lo, hi);
    else if (k->has_min) snprintf(buf, n, ">= %s", lo);
    else if (k->has_max) snprintf(buf, n, "<= %s", hi);
    return buf;
}

int mt_config_key_count(void) { return MT_KEY_N; }

const mt_config_key *mt_config_key_get(int i) { return i >= 0 && i < MT_KEY_N ? &mt_keys[i] : NULL; }

const mt_config_key *mt_config_key_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < MT_KEY_N; i++)
        if (strcmp(mt_keys[i].name, name) == 0) return &mt_keys[i];
    return NULL;
}

static void choices_str(const mt_config_key *k, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; k->choices[i]; i++) {
        int w = snprintf(buf + used, n - used, "%s%s", i ? "|" : "", k->choices[i]);
        if (w < 0 || (size_t)w >= n - used) break;
        used += (size_t)w;
    }
}

const char *mt_config_key_type_str(const mt_config_key *k, char *buf, size_t n) {
    if (!buf || n == 0) return buf;
    switch (k->type) {
    case MT_KEY_INT: snprintf(buf, n, "integer"); break;
    case MT_KEY_FLOAT:
    case MT_KEY_DOUBLE: snprintf(buf, n, "number"); break;
    case MT_KEY_BOOL: snprintf(buf, n, "bool"); break;
    case MT_KEY_STRING: snprintf(buf, n, "string"); break;
    case MT_KEY_ENUM: {
        char c[256];
        choices_str(k, c, sizeof c);
        snprintf(buf, n, "one of %s", c);
        break;
    }
    case MT_KEY_ACTIVATIONS: snprintf(buf, n, "list [silu|gelu, linear]"); break;
    }
    return buf;
}

/* ------------------------------------------------------------- suggestions ---- */

/* Levenshtein distance (two-row DP), capped at 64-character names. */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64) la = 64;
    if (lb > 64) lb = 64;
    int prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (lb + 1));
    }
    return prev[lb];
}

static const char *closest_key(const char *name) {
    const char *best = NULL;
    int bestd = 1 << 30;
    /* case-insensitive: STEPS suggests steps (every key is lower case) */
    char low[65];
    size_t i0 = 0;
    for (; name[i0] && i0 < sizeof low - 1; i0++) low[i0] = (char)tolower((unsigned char)name[i0]);
    low[i0] = '\0';
    name = low;
    for (int i = 0; i < MT_KEY_N; i++) {
        int d = edit_distance(name, mt_keys[i].name);
        if (d < bestd) bestd = d, best = mt_keys[i].name;
    }
    int len = (int)strlen(name);
    int limit = len / 3 > 2 ? len / 3 : 2;
    return bestd <= limit ? best : NULL;
}

/* ---------------------------------------------------------- value parsing ---- */

/* 1 = parsed; 0 = not an integer; -1 = an integer outside int64_t. */
/* Decimal digits with an optional leading '-' (docs/configuration.md): strtoll alone
 * would also take leading blanks and a '+'. 1 parsed, 0 not an integer, -1 out of range. */
static int parse_int(const char *s, int64_t *out) {
    if (!s || !*s) return 0;
    for (const char *c = s + (*s == '-'); ; c++) {
        if (!isdigit((unsigned char)*c)) return 0;
        if (!c[1]) break;
    }
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end) return 0;
    if (errno == ERANGE) return -1;
    if (errno) return 0;
    *out = (int64_t)v;
    return 1;
}

/* A decimal number (strtod would also take hex floats (0x10), inf and nan, and leading
 * blanks). 1 parsed, 0 not a decimal number, -1 a decimal number beyond the double
 * range (1e400). */
static int parse_double(const char *s, double *out) {
    if (!s || !*s) return 0;
    for (const char *c = s; *c; c++)
        if (!isdigit((unsigned char)*c) && !strchr("+-.eE", *c)) return 0;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end) return 0;
    if (errno == ERANGE && fabs(v) == HUGE_VAL) return -1;
    if (!isfinite(v)) return 0;
    *out = v;
    return 1;
}

static int str_ieq(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
    return *a == *b;
}

/* true | false (any case, as YAML writes True/TRUE): what --help documents; yes/no/on/off/1/0 are refused. */
static int parse_bool(const char *s, int *out) {
    if (str_ieq(s, "true")) return *out = 1, 1;
    if (str_ieq(s, "false")) return *out = 0, 1;
    return 0;
}

/* Split "[a, b]" / "a,b" into at most `max` trimmed items (quotes removed). */
static int split_list(const char *s, char items[][32], int max) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    char *p = buf;
    while (isspace((unsigned char)*p)) p++;
    size_t len = strlen(p);
    while (len && isspace((unsigned char)p[len - 1])) p[--len] = '\0';
    if (*p == '[') {
        if (len < 2 || p[len - 1] != ']') return -1;
        p[len - 1] = '\0';
        p++;
    }
    int n = 0;
    for (char *tok = p;;) {
        char *comma = strchr(tok, ',');
        if (comma) *comma = '\0';
        while (isspace((unsigned char)*tok) || *tok == '"' || *tok == '\'') tok++;
        size_t tl = strlen(tok);
        while (tl && (isspace((unsigned char)tok[tl - 1]) || tok[tl - 1] == '"' || tok[tl - 1] == '\''))
            tok[--tl] = '\0';
        if (tl == 0 || tl >= 32 || n >= max) return -1;
        memcpy(items[n++], tok, tl + 1);
        if (!comma) break;
        tok = comma + 1;
    }
    return n;
}

mt_status mt_train_config_set(mt_train_config *cfg, const char *name, const char *value,
                              const char *source) {
    if (!source) source = "config";
    if (!value) value = "";
    const mt_config_key *k = mt_config_key_find(name);
    if (!k) {
        const char *near = closest_key(name ? name : "");
        if (near)
            return mt_set_error(MT_ERR_INVALID, "%s: unknown key '%s' (did you mean '%s'?)", source,
                                name ? name : "", near);
        return mt_set_error(MT_ERR_INVALID, "%s: unknown key '%s' (see meshtrain --help)", source,
                            name ? name : "");
    }
    char *field = (char *)cfg + k->offset;
    char tbuf[300];
    double num = 0;
    switch (k->type) {
    case MT_KEY_INT: {
        int64_t v;
        const int pr = parse_int(value, &v);
        if (pr < 0 && (k->has_min || k->has_max))
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': out of range (a 64-bit integer, %" PRId64
                                " to %" PRId64 "); must be %s", source, k->name, value, (int64_t)INT64_MIN,
                                (int64_t)INT64_MAX, mt_config_key_accepts(k, tbuf, sizeof tbuf));
        if (pr < 0)
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': out of range (an integer from %" PRId64 " to "
                                "%" PRId64 ")", source, k->name, value, (int64_t)INT64_MIN, (int64_t)INT64_MAX);
        if (!pr)
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': expected an integer", source,
                                k->name, value);
        memcpy(field, &v, sizeof v);
        num = (double)v;
        break;
    }
    case MT_KEY_FLOAT:
    case MT_KEY_DOUBLE: {
        double v;
        const int pr = parse_double(value, &v);
        if (pr < 0)
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': out of range (beyond the double range, "
                                "about 1.8e308)", source, k->name, value);
        if (!pr)
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': expected a decimal number", source,
                                k->name, value);
        if (k->type == MT_KEY_FLOAT) {
            float f = (float)v;
            if (!isfinite(f))
                return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': out of float range", source,
                                    k->name, value);
            memcpy(field, &f, sizeof f);
        } else {
            memcpy(field, &v, sizeof v);
        }
        num = v;
        break;
    }
    case MT_KEY_BOOL: {
        int v;
        if (!parse_bool(value, &v))
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': expected a bool (true|false)",
                                source, k->name, value);
        memcpy(field, &v, sizeof v);
        return MT_OK;
    }
    case MT_KEY_STRING: {
        /* The list keys: an empty list ([] in YAML or on the command line) is the same as
         * an empty value, i.e. unset (the default); an empty entry inside a list is an
         * error, found where the list is read (train/data.c, mt_sample_parse_ids). */
        if (strcmp(k->name, "train_files") == 0 || strcmp(k->name, "eval_files") == 0 ||
            strcmp(k->name, "prompt_ids") == 0) {
            const char *b = value;
            while (isspace((unsigned char)*b)) b++;
            if (*b == '[') {
                b++;
                while (isspace((unsigned char)*b)) b++;
                if (*b == ']') {
                    b++;
                    while (isspace((unsigned char)*b)) b++;
                    if (!*b) value = "";
                }
            }
        }
        size_t len = strlen(value);
        if (len >= k->size)
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s': value of %zu bytes is too long (max %zu)",
                                source, k->name, len, k->size - 1);
        memcpy(field, value, len + 1);
        return MT_OK;
    }
    case MT_KEY_ENUM: {
        for (int i = 0; k->choices[i]; i++) {
            if (strcmp(value, k->choices[i]) == 0) {
                memcpy(field, &k->choice_values[i], sizeof(int));
                return MT_OK;
            }
        }
        choices_str(k, tbuf, sizeof tbuf);
        return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': expected one of %s", source, k->name,
                            value, tbuf);
    }
    case MT_KEY_ACTIVATIONS: {
        char items[4][32];
        int n = split_list(value, items, 4);
        int act = -1;
        if (n == 2 && strcmp(items[1], "linear") == 0) {
            if (strcmp(items[0], "silu") == 0) act = MT_ACT_SILU;
            else if (strcmp(items[0], "gelu") == 0) act = MT_ACT_GELU_TANH;
        }
        if (act < 0)
            return mt_set_error(MT_ERR_INVALID,
                                "%s: key '%s' = '%s': expected [silu, linear] or [gelu, linear]",
                                source, k->name, value);
        memcpy(field, &act, sizeof act);
        return MT_OK;
    }
    }
    if ((k->has_min && num < k->min) || (k->has_max && num > k->max))
        return mt_set_error(MT_ERR_INVALID, "%s: key '%s' = '%s': must be %s", source, k->name, value,
                            mt_config_key_accepts(k, tbuf, sizeof tbuf));
    return MT_OK;
}

const char *mt_train_config_format(const mt_train_config *cfg, const mt_config_key *k, char *buf,
                                   size_t n) {
    const char *field = (const char *)cfg + k->offset;
    switch (k->type) {
    case MT_KEY_INT: {
        int64_t v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%lld", (long long)v);
        break;
    }
    case MT_KEY_FLOAT:
    case MT_KEY_DOUBLE: {
        double v;
        if (k->type == MT_KEY_FLOAT) {
            float f;
            memcpy(&f, field, sizeof f);
            v = f;
        } else {
            memcpy(&v, field, sizeof v);
        }
        /* Shortest %g form that reads back to the same value in the field's type. */
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, v);
            double back = strtod(buf, NULL);
            if (k->type == MT_KEY_FLOAT ? (float)back == (float)v : back == v) break;
        }
        break;
    }
    case MT_KEY_BOOL: {
        int v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "%s", v ? "true" : "false");
        break;
    }
    case MT_KEY_STRING: snprintf(buf, n, "%s", field); break;
    case MT_KEY_ENUM: {
        int v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "?");
        for (int i = 0; k->choices[i]; i++)
            if (k->choice_values[i] == v) snprintf(buf, n, "%s", k->choices[i]);
        break;
    }
    case MT_KEY_ACTIVATIONS: {
        int v;
        memcpy(&v, field, sizeof v);
        snprintf(buf, n, "[%s, linear]", v == MT_ACT_GELU_TANH ? "gelu" : "silu");
        break;
    }
    }
    return buf;
}

mt_status mt_train_config_text(const mt_train_config *cfg, char **text, size_t *len) {
    enum { VAL = MT_CONFIG_FILES_MAX + MT_CONFIG_PROMPT_MAX }; /* above every key's capacity */
    char *val = malloc(VAL);
    size_t cap = 16384, used = 0;
    char *out = malloc(cap);
    mt_status st = val && out ? MT_OK : mt_set_error(MT_ERR_OOM, "out of memory formatting the config");
    for (int i = 0; st == MT_OK && i < MT_KEY_N; i++) {
        const mt_config_key *k = &mt_keys[i];
        mt_train_config_format(cfg, k, val, VAL);
        const size_t need = used + strlen(k->name) + 2 * strlen(val) + 3; /* '=', '\n', NUL */
        if (need > cap) {
            while (need > cap) cap *= 2;
            char *o = realloc(out, cap);
            if (!o) {
                st = mt_set_error(MT_ERR_OOM, "out of memory formatting the config");
                break;
            }
            out = o;
        }
        used += (size_t)sprintf(out + used, "%s=", k->name);
        for (const char *v = val; *v; v++) {
            if (*v == '\\' || *v == '\n') out[used++] = '\\';
            out[used++] = *v == '\n' ? 'n' : *v;
        }
        out[used++] = '\n';
        out[used] = '\0';
    }
    free(val);
    if (st != MT_OK) {
        free(out);
        return st;
    }
    *text = out;
    if (len) *len = used;
    return MT_OK;
}

void mt_train_config_defaults(mt_train_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    mt_model_config_defaults(&cfg->model, MT_DECODER_LLAMA2);
    for (int i = 0; i < MT_KEY_N; i++) {
        if (!mt_keys[i].def) continue;
        /* The table's defaults are valid by construction (tests/test_config.c). */
        mt_status s = mt_train_config_set(cfg, mt_keys[i].name, mt_keys[i].def, "default");
        (void)s;
    }
}

/* Model keys that a checkpoint's config.json pins (every field that changes the
 * parameter shapes or the math of a step; a resumed, sampled or fine-tuned model must
 * agree on them), each with its Hugging Face config.json field. */
static const char *const checkpoint_model_keys[][2] = {
    {"decoder_block", "model_type"}, {"vocab_size", "vocab_size"}, {"base_emb_dim", "hidden_size"},
    {"base_num_query_heads", "num_attention_heads"}, {"base_num_kv_heads", "num_key_value_heads"},
    {"head_dim", "head_dim"}, {"base_mlp_dim", "intermediate_size"},
    {"base_num_decoder_layers", "num_hidden_layers"}, {"mlp_activations", "hidden_act/hidden_activation"},
    {"logits_via_embedding", "tie_word_embeddings"}, {"normalization_layer_epsilon", "rms_norm_eps"},
    {"final_logits_soft_cap", "final_logit_softcapping"}, {"attn_logits_soft_cap", "attn_logit_softcapping"},
    {"sliding_window_size", "sliding_window"}, {"sliding_window_pattern", "sliding_window_pattern/layer_types"},
    {"query_pre_attn_scalar", "query_pre_attn_scalar"}, {"rope_max_timescale", "rope_theta"},
    {"rope_type", "rope_scaling.rope_type"}, {"rope_factor", "rope_scaling.factor"},
    {"rope_low_freq_factor", "rope_scaling.low_freq_factor"},
    {"rope_high_freq_factor", "rope_scaling.high_freq_factor"},
    {"rope_original_max_position", "rope_scaling.original_max_position_embeddings"},
    {"local_rope_max_timescale", "rope_local_base_freq"}, {"use_qk_norm", "model_type"},
    {"use_post_attn_norm", "model_type"}, {"use_post_ffw_norm", "model_type"},
    {"global_head_dim", "global_head_dim/per_layer_config"}, {"num_kv_shared_layers", "num_kv_shared_layers"},
    {"use_double_wide_mlp", "use_double_wide_mlp"}, {"per_layer_input_dim", "hidden_size_per_layer_input"},
    {"rope_partial_rotary_factor", "rope_parameters.full_attention.partial_rotary_factor"}, {NULL, NULL}};

const char *mt_model_config_hf_field(const char *key) {
    for (int i = 0; key && checkpoint_model_keys[i][0]; i++)
        if (strcmp(checkpoint_model_keys[i][0], key) == 0) return checkpoint_model_keys[i][1];
    return key;
}

/* The model c computes, with the fields that have no effect cleared and the "0 =
 * derived" ones resolved (models/config.h), so that two descriptions of one model
 * compare equal: query_pre_attn_scalar 0 is head_dim; without local layers the window,
 * its pattern and the local RoPE base mean nothing; a local RoPE base equal to the
 * global default one is the same as none; the rope_* factors only count for the
 * scaling that reads them (models/config.c mt_rope_inv_freq). */
static mt_model_config model_effective(const mt_model_config *c) {
    mt_model_config e = *c;
    if (e.query_pre_attn_scalar <= 0.0f) e.query_pre_attn_scalar = (float)e.head_dim;
    int any_local = 0;
    for (int64_t l = 0; !any_local && l < e.num_decoder_layers; l++) any_local = mt_model_layer_is_local(&e, l);
    if (!any_local) e.sliding_window_size = 0, e.sliding_window_pattern = 0, e.local_rope_max_timescale = 0;
    if (e.local_rope_max_timescale == e.rope_max_timescale && e.rope_type == MT_ROPE_DEFAULT)
        e.local_rope_max_timescale = 0;
    if (e.rope_type == MT_ROPE_DEFAULT) e.rope_factor = 0;
    if (e.rope_type != MT_ROPE_PROPORTIONAL) e.rope_partial_rotary_factor = 0;
    if (e.global_head_dim == e.head_dim) e.global_head_dim = 0;
    if (e.rope_type != MT_ROPE_LLAMA3)
        e.rope_low_freq_factor = e.rope_high_freq_factor = 0, e.rope_original_max_position = 0;
    return e;
}

const mt_config_key *mt_model_config_diff(const mt_model_config *a, const mt_model_config *b, const char *only_key,
                                          char *va, char *vb, size_t n) {
    mt_train_config *ta = calloc(2, sizeof *ta);
    if (!ta) return NULL;
    ta[0].model = model_effective(a);
    ta[1].model = model_effective(b);
    const mt_config_key *found = NULL;
    for (int i = 0; !found && checkpoint_model_keys[i][0]; i++) {
        if (only_key && strcmp(only_key, checkpoint_model_keys[i][0]) != 0) continue;
        const mt_config_key *k = mt_config_key_find(checkpoint_model_keys[i][0]);
        mt_train_config_format(&ta[0], k, va, n);
        mt_train_config_format(&ta[1], k, vb, n);
        if (strcmp(va, vb) != 0) found = k;
    }
    free(ta);
    return found;
}

/* -------------------------------------------------------------- YAML files ---- */

typedef struct cfg_entry {
    char *key;
    char *value;
    char source[MT_CONFIG_PATH_MAX + 32];
} cfg_entry;

typedef struct cfg_layer {
    cfg_entry *e;
    int n, cap;
} cfg_layer;

static void layer_free(cfg_layer *l) {
    for (int i = 0; i < l->n; i++) free(l->e[i].key), free(l->e[i].value);
    free(l->e);
    memset(l, 0, sizeof *l);
}

static mt_status layer_add(cfg_layer *l, const char *key, size_t klen, const char *value,
                           const char *source) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 32;
        cfg_entry *e = realloc(l->e, sizeof(cfg_entry) * (size_t)cap);
        if (!e) return mt_set_error(MT_ERR_OOM, "config: out of memory");
        l->e = e, l->cap = cap;
    }
    cfg_entry *e = &l->e[l->n];
    e->key = malloc(klen + 1);
    e->value = strdup(value);
    if (!e->key || !e->value) {
        free(e->key), free(e->value);
        return mt_set_error(MT_ERR_OOM, "config: out of memory");
    }
    memcpy(e->key, key, klen);
    e->key[klen] = '\0';
    snprintf(e->source, sizeof e->source, "%s", source);
    l->n++;
    return MT_OK;
}

/* The last value of `key` in the layer, or NULL. */
static const cfg_entry *layer_last(const cfg_layer *l, const char *key) {
    for (int i = l->n - 1; i >= 0; i--)
        if (strcmp(l->e[i].key, key) == 0) return &l->e[i];
    return NULL;
}

/* A plain null scalar (~, null, empty) reads as "" (for strings: unset). */
static const char *scalar_text(const yaml_event_t *ev) {
    const char *v = (const char *)ev->data.scalar.value;
    if (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
        (strcmp(v, "~") == 0 || strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0))
        return "";
    return v;
}

/* A key set twice in one file is an error (YAML says keys are unique; last-wins
 * would hide a typo'd edit). The layer holds this file's entries only. */
static mt_status layer_check_duplicate(const cfg_layer *l, const char *key, const char *path, size_t line) {
    const cfg_entry *e = layer_last(l, key);
    if (!e) return MT_OK;
    const char *colon = strrchr(e->source, ':');
    return mt_set_error(MT_ERR_INVALID, "%s:%zu: key '%s' is set twice (lines %s and %zu)", path, line, key,
                        colon ? colon + 1 : "?", line);
}

/* Parse a flat YAML mapping of scalars (values may be a flow or block sequence of
 * scalars, joined as "[a, b]") into a layer; keys are not checked here. */
static mt_status layer_parse_file(cfg_layer *l, const char *path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return mt_set_error(MT_ERR_IO, "config file '%s' is a directory, not a YAML file", path);
    FILE *f = fopen(path, "rb");
    if (!f) return mt_set_error(MT_ERR_IO, "cannot open config file '%s': %s", path, strerror(errno));
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return mt_set_error(MT_ERR_OOM, "config: yaml_parser_initialize failed");
    }
    yaml_parser_set_input_file(&parser, f);
    mt_status st = MT_OK;
    int depth = 0;        /* 1 inside the top mapping */
    int docs = 0;
    char *key = NULL;     /* pending key */
    size_t key_line = 0;
    char seq[MT_CONFIG_FILES_MAX + 16]; /* sequence being collected (train_files may be a long list) */
    int in_seq = 0;
    char src[MT_CONFIG_PATH_MAX + 32];
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            st = mt_set_error(MT_ERR_INVALID, "%s:%zu: YAML syntax error: %s", path,
                              parser.problem_mark.line + 1, parser.problem ? parser.problem : "?");
            break;
        }
        size_t line = ev.start_mark.line + 1;
        yaml_event_type_t t = ev.type;
        int done = 0;
        switch (t) {
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_END_EVENT: break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) st = mt_set_error(MT_ERR_INVALID, "%s:%zu: only one YAML document allowed", path, line);
            break;
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_MAPPING_START_EVENT:
            if (depth == 0 && !in_seq) depth = 1;
            else st = mt_set_error(MT_ERR_INVALID, "%s:%zu: nested mappings are not allowed (%s)", path,
                                   line, key ? key : "top level");
            break;
        case YAML_MAPPING_END_EVENT: depth = 0; break;
        case YAML_SEQUENCE_START_EVENT:
            if (depth == 1 && key && !in_seq) {
                in_seq = 1;
                snprintf(seq, sizeof seq, "[");
            } else {
                st = mt_set_error(MT_ERR_INVALID, "%s:%zu: unexpected sequence (%s)", path, line,
                                  key ? key : "the top level must be a mapping of key: value");
            }
            break;
        case YAML_SEQUENCE_END_EVENT: {
            size_t len = strlen(seq);
            snprintf(seq + len, sizeof seq - len, "]");
            snprintf(src, sizeof src, "%s:%zu", path, key_line);
            st = layer_check_duplicate(l, key, path, key_line);
            if (st == MT_OK) st = layer_add(l, key, strlen(key), seq, src);
            free(key), key = NULL;
            in_seq = 0;
            break;
        }
        case YAML_SCALAR_EVENT:
            if (depth != 1) {
                st = mt_set_error(MT_ERR_INVALID, "%s:%zu: the top level must be a mapping of key: value",
                                  path, line);
            } else if (in_seq) {
                size_t len = strlen(seq);
                const int w = snprintf(seq + len, sizeof seq - len, "%s%s", len > 1 ? ", " : "", scalar_text(&ev));
                if (w < 0 || (size_t)w + 2 > sizeof seq - len) /* room for "]" too */
                    st = mt_set_error(MT_ERR_INVALID, "%s:%zu: the list of key '%s' is longer than %zu bytes", path,
                                      line, key, sizeof seq - 16);
            } else if (!key) {
                key = strdup((const char *)ev.data.scalar.value);
                key_line = line;
                if (!key) st = mt_set_error(MT_ERR_OOM, "config: out of memory");
            } else {
                snprintf(src, sizeof src, "%s:%zu", path, key_line);
                st = layer_check_duplicate(l, key, path, key_line);
                if (st == MT_OK) st = layer_add(l, key, strlen(key), scalar_text(&ev), src);
                free(key), key = NULL;
            }
            break;
        case YAML_ALIAS_EVENT:
            st = mt_set_error(MT_ERR_INVALID, "%s:%zu: YAML aliases are not supported", path, line);
            break;
        default: break;
        }
        yaml_event_delete(&ev);
        if (st != MT_OK || done) break;
    }
    free(key);
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}

static mt_status layer_apply(mt_train_config *cfg, const cfg_layer *l) {
    for (int i = 0; i < l->n; i++) MT_TRY(mt_train_config_set(cfg, l->e[i].key, l->e[i].value, l->e[i].source));
    return MT_OK;
}

/* Check every key of a layer exists before anything else (so a misspelt key is
 * reported even when the model file lookup would fail first). */
static mt_status layer_check_keys(const cfg_layer *l) {
    for (int i = 0; i < l->n; i++)
        if (!mt_config_key_find(l->e[i].key)) {
            mt_train_config tmp;
            memset(&tmp, 0, sizeof tmp);
            return mt_train_config_set(&tmp, l->e[i].key, l->e[i].value, l->e[i].source);
        }
    return MT_OK;
}

mt_status mt_train_config_apply_file(mt_train_config *cfg, const char *path) {
    cfg_layer l = {0};
    mt_status st = layer_parse_file(&l, path);
    if (st == MT_OK) st = layer_apply(cfg, &l);
    layer_free(&l);
    return st;
}

/* ------------------------------------------------------------- validation ---- */

mt_status mt_train_config_validate(const mt_train_config *c) {
    /* Per-key ranges again (a caller may have filled the struct directly). */
    char buf[128];
    for (int i = 0; i < MT_KEY_N; i++) {
        const mt_config_key *k = &mt_keys[i];
        if (k->type != MT_KEY_INT && k->type != MT_KEY_FLOAT && k->type != MT_KEY_DOUBLE) continue;
        if (k->is_model) continue; /* mt_model_config_validate owns the model keys */
        mt_train_config_format(c, k, buf, sizeof buf);
        double v = strtod(buf, NULL);
        if ((k->has_min && v < k->min) || (k->has_max && v > k->max)) {
            char acc[160];
            return mt_set_error(MT_ERR_INVALID, "key '%s' = %s: must be %s", k->name, buf,
                                mt_config_key_accepts(k, acc, sizeof acc));
        }
    }
    if (!c->run_name[0] || strchr(c->run_name, '/') || strcmp(c->run_name, ".") == 0 ||
        strcmp(c->run_name, "..") == 0)
        return mt_set_error(MT_ERR_INVALID, "key 'run_name' = '%s': must be a non-empty name without '/'",
                            c->run_name);
    if (!c->model.model_name[0]) return mt_set_error(MT_ERR_INVALID, "key 'model_name' is empty");
    if (c->adam_b1 >= 1.0) return mt_set_error(MT_ERR_INVALID, "key 'adam_b1' = %g: must be in [0, 1)", c->adam_b1);
    if (c->adam_b2 >= 1.0) return mt_set_error(MT_ERR_INVALID, "key 'adam_b2' = %g: must be in [0, 1)", c->adam_b2);
    if (!(c->adam_eps > 0)) return mt_set_error(MT_ERR_INVALID, "key 'adam_eps' = %g: must be > 0", c->adam_eps);
    if (!(c->collective_timeout_s > 0))
        return mt_set_error(MT_ERR_INVALID, "key 'collective_timeout_s' = %g: must be > 0", c->collective_timeout_s);
    if (c->packing && c->packing_separator_id >= c->model.vocab_size)
        return mt_set_error(MT_ERR_INVALID, "key 'packing_separator_id' = %lld is outside the model's vocabulary "
                            "(vocab_size %lld): no token would start a document, so packing would do nothing",
                            (long long)c->packing_separator_id, (long long)c->model.vocab_size);
    if (c->gradient_accumulation_reduce == 1 && !c->shard_optimizer_over_data)
        return mt_set_error(MT_ERR_INVALID, "key 'gradient_accumulation_reduce' = every reduce-scatters into the "
                            "ZeRO-1 shard accumulator: it needs shard_optimizer_over_data=true");
    if (c->remat_policy == MT_REMAT_CUSTOM) {
        mt_remat_policy rp;
        mt_remat_action acts[MT_RT_COUNT];
        for (int i = 0; i < MT_RT_COUNT; i++) acts[i] = (mt_remat_action)c->remat_custom[i];
        MT_TRY(mt_remat_policy_resolve(MT_REMAT_CUSTOM, acts, &rp));
    } else { /* the nine tensor keys are read with custom only: a changed one would be ignored */
        mt_remat_policy dflt;
        MT_TRY(mt_remat_policy_resolve(MT_REMAT_CUSTOM, NULL, &dflt));
        for (int i = 0; i < MT_RT_COUNT; i++)
            if (c->remat_custom[i] != (int)dflt.action[i])
                return mt_set_error(MT_ERR_INVALID, "key '%s' = %s is read only with remat_policy=custom (here "
                                    "remat_policy=%s, which decides every tensor itself): set remat_policy=custom "
                                    "or drop the key", mt_remat_tensor_name((mt_remat_tensor)i),
                                    mt_remat_action_name((mt_remat_action)c->remat_custom[i]),
                                    mt_remat_policy_name((mt_remat_policy_kind)c->remat_policy));
    }
    if (c->load_checkpoint[0] && c->load_parameters_path[0])
        return mt_set_error(MT_ERR_INVALID, "keys 'load_checkpoint' = '%s' and 'load_parameters_path' = '%s' "
                            "conflict: set one (load_checkpoint resumes a run, load_parameters_path starts one "
                            "from weights)", c->load_checkpoint, c->load_parameters_path);
    /* Byte counts of the step must fit int64 (plans are sized in bytes): bound the
     * activations, about (layers + 2) x 16 buffers of tokens x the widest row of float32,
     * and the parameter state (16 bytes per parameter), computed in double. */
    {
        const mt_model_config *mc = &c->model;
        double w = (double)mc->emb_dim;
        const double widths[] = {(double)mc->mlp_dim, (double)mc->num_query_heads * (double)mc->head_dim,
                                 (double)mc->vocab_size / (double)(c->num_vocab_tiling > 0 ? c->num_vocab_tiling : 1)};
        for (int i = 0; i < 3; i++)
            if (widths[i] > w) w = widths[i];
        const double tokens = (double)c->per_device_batch_size * (double)c->max_target_length;
        const double act = tokens * w * 4.0 * ((double)mc->num_decoder_layers + 2.0) * 16.0;
        /* gemma4: the wider global head dim, the double-wide MLP and the per-layer inputs
         * (the table V x L x P, and per layer a gate and a projection of P x D) */
        const double dh = (double)(mc->global_head_dim > mc->head_dim ? mc->global_head_dim : mc->head_dim);
        const double f = (double)mc->mlp_dim * (mc->use_double_wide_mlp ? 2.0 : 1.0);
        const double ple = (double)mc->per_layer_input_dim * (double)mc->num_decoder_layers *
                           ((double)mc->vocab_size + 3.0 * (double)mc->emb_dim);
        const double par = ((double)mc->vocab_size * (double)mc->emb_dim * 2.0 +
                            (double)mc->num_decoder_layers * (double)mc->emb_dim *
                                (f * 3.0 + dh * ((double)mc->num_query_heads * 2.0 + (double)mc->num_kv_heads * 2.0)) +
                            ple) * 16.0;
        const double lim = 9.2e18; /* INT64_MAX */
        if (tokens * 4.0 * (double)c->gradient_accumulation_steps > lim || act > lim)
            return mt_set_error(MT_ERR_INVALID, "key '%s' = %lld (with %s = %lld): the step's activations "
                                "(%.3g bytes) overflow a 64-bit byte count",
                                c->per_device_batch_size >= c->max_target_length ? "per_device_batch_size"
                                                                                  : "max_target_length",
                                (long long)(c->per_device_batch_size >= c->max_target_length
                                                ? c->per_device_batch_size : c->max_target_length),
                                c->per_device_batch_size >= c->max_target_length ? "max_target_length"
                                                                                  : "per_device_batch_size",
                                (long long)(c->per_device_batch_size >= c->max_target_length
                                                ? c->max_target_length : c->per_device_batch_size),
                                act);
        if (par > lim)
            return mt_set_error(MT_ERR_INVALID, "model '%s': the parameter state (%.3g bytes) overflows a "
                                "64-bit byte count (check vocab_size, base_emb_dim, base_mlp_dim, "
                                "base_num_decoder_layers%s)", mc->model_name, par,
                                mc->per_layer_input_dim > 0 ? ", per_layer_input_dim" : "");
    }
    int64_t rows = c->per_device_batch_size * c->max_target_length;
    if (c->num_vocab_tiling < 0 || c->num_vocab_tiling > rows)
        return mt_set_error(MT_ERR_INVALID,
                            "key 'num_vocab_tiling' = %lld: must be 0 (auto) or between 1 and "
                            "per_device_batch_size * max_target_length = %lld",
                            (long long)c->num_vocab_tiling, (long long)rows);
    if (c->num_vocab_chunks < 0 || c->num_vocab_chunks > c->model.vocab_size)
        return mt_set_error(MT_ERR_INVALID, "key 'num_vocab_chunks' = %lld: must be 0 (auto) or between 1 and "
                            "vocab_size = %lld", (long long)c->num_vocab_chunks, (long long)c->model.vocab_size);
    MT_TRY(mt_model_config_validate(&c->model));
    if (c->top_k > c->model.vocab_size) /* after the model's own check: vocab_size is valid */
        return mt_set_error(MT_ERR_INVALID, "key 'top_k' = %lld is more than the model's vocab_size %lld: top_k "
                            "keeps the k most likely of vocab_size tokens; give %lld or less (0 = all tokens)",
                            (long long)c->top_k, (long long)c->model.vocab_size, (long long)c->model.vocab_size);
    return MT_OK;
}

/* --------------------------------------------------------------- loading ---- */

static int file_readable(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fclose(f);
    return 1;
}

/* Directory part of path ("." when it has none). */
static void dir_of(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

/* out = a + b + c; 0 when it does not fit. */
static int path_cat(char *out, size_t n, const char *a, const char *b, const char *c) {
    int w = snprintf(out, n, "%s%s%s", a, b, c);
    return w >= 0 && (size_t)w < n;
}

static mt_status find_model_file(const char *config_path, const char *model_name, char *out, size_t n) {
    if (!model_name[0] || strchr(model_name, '/'))
        return mt_set_error(MT_ERR_INVALID, "key 'model_name' = '%s': must be a name without '/'", model_name);
    char dirs[4][MT_CONFIG_PATH_MAX];
    int nd = 0;
    char cdir[MT_CONFIG_PATH_MAX];
    if (config_path) {
        dir_of(config_path, cdir, sizeof cdir);
        if (path_cat(dirs[nd], MT_CONFIG_PATH_MAX, cdir, "/models", "")) nd++;
    }
    const char *env = getenv("MESHTRAIN_CONFIG_DIR");
    if (env && env[0] && path_cat(dirs[nd], MT_CONFIG_PATH_MAX, env, "/models", "")) nd++;
    if (config_path && path_cat(dirs[nd], MT_CONFIG_PATH_MAX, cdir, "/configs/models", "")) nd++;
    if (path_cat(dirs[nd], MT_CONFIG_PATH_MAX, "configs/models", "", "")) nd++;
    /* The directories tried, each once, by their real path (./configs/models and
     * <CONFIG dir>/models are often the same directory). The message names the ones
     * that exist; candidates that do not (e.g. <CONFIG dir>/configs/models, which is
     * configs/configs/models for configs/base.yml) only when none exists. */
    char tried[4 * (MT_CONFIG_PATH_MAX + 24) + 16] = "";
    char real[4][PATH_MAX_MT];
    int real_exists[4] = {0};
    int nreal = 0;
    for (int i = 0; i < nd; i++) {
        char shown[PATH_MAX_MT];
        int exists = realpath(dirs[i], shown) != NULL;
        char cwd[PATH_MAX_MT / 2];
        const size_t ld = strlen(dirs[i]);
        if (!exists) snprintf(shown, sizeof shown, "%s", dirs[i]);
        if (!exists && dirs[i][0] != '/' && getcwd(cwd, sizeof cwd) && strlen(cwd) + 1 + ld < sizeof shown) {
            const size_t lc = strlen(cwd); /* absolute, as the real paths are */
            memcpy(shown, cwd, lc);
            shown[lc] = '/';
            memcpy(shown + lc + 1, dirs[i], ld + 1);
        }
        int dup = 0;
        for (int j = 0; j < nreal; j++) dup |= strcmp(real[j], shown) == 0;
        if (dup) continue;
        real_exists[nreal] = exists;
        snprintf(real[nreal++], sizeof real[0], "%s", shown);
        if (path_cat(out, n, dirs[i], "/", model_name) && strlen(out) + 5 < n) {
            strcat(out, ".yml");
            if (file_readable(out)) return MT_OK;
        }
    }
    int any_exists = 0;
    for (int i = 0; i < nreal; i++) any_exists |= real_exists[i];
    for (int i = 0; i < nreal; i++) {
        if (any_exists && !real_exists[i]) continue;
        size_t len = strlen(tried);
        int w = snprintf(tried + len, sizeof tried - len, "%s%s%s", len ? ", " : "", real[i],
                         real_exists[i] ? "" : " (no such directory)");
        if (w < 0 || (size_t)w >= sizeof tried - len) break;
    }
    return mt_set_error(MT_ERR_INVALID, "model_name '%s': no model file %s.yml in %s", model_name, model_name,
                        tried);
}

static mt_status config_load(mt_train_config *cfg, const char *config_path, int n_overrides,
                             const char *const *overrides, int validate) {
    cfg_layer lfile = {0}, lcli = {0}, lmodel = {0};
    mt_status st = MT_OK;
    if (config_path) st = layer_parse_file(&lfile, config_path);
    for (int i = 0; st == MT_OK && i < n_overrides; i++) {
        const char *eq = strchr(overrides[i], '=');
        if (!eq || eq == overrides[i]) {
            st = mt_set_error(MT_ERR_INVALID, "command line: '%s' is not key=value", overrides[i]);
            break;
        }
        /* as in a YAML file, a key given twice is an error (last-wins would hide a typo) */
        const size_t kl = (size_t)(eq - overrides[i]);
        for (int j = 0; st == MT_OK && j < lcli.n; j++)
            if (strlen(lcli.e[j].key) == kl && strncmp(lcli.e[j].key, overrides[i], kl) == 0)
                st = mt_set_error(MT_ERR_INVALID, "command line: key '%s' is set twice ('%s=%s' and '%s'); give "
                                  "each key once", lcli.e[j].key, lcli.e[j].key, lcli.e[j].value, overrides[i]);
        if (st != MT_OK) break;
        st = layer_add(&lcli, overrides[i], kl, eq + 1, "command line");
    }
    if (st == MT_OK) st = layer_check_keys(&lfile);
    if (st == MT_OK) st = layer_check_keys(&lcli);

    /* model_name, then the model file. */
    mt_train_config_defaults(cfg);
    const cfg_entry *e;
    if (st == MT_OK && (e = layer_last(&lfile, "model_name"))) st = mt_train_config_set(cfg, e->key, e->value, e->source);
    if (st == MT_OK && (e = layer_last(&lcli, "model_name"))) st = mt_train_config_set(cfg, e->key, e->value, e->source);
    char model_path[MT_CONFIG_PATH_MAX + 80];
    /* CONFIG.yml that sets decoder_block and no model_name (e.g. configs/models/x.yml
     * itself) describes the whole model: it is the model file, and model_name is its
     * file name, so what is printed is what is used (no other model file mixed in). */
    const int self_model = st == MT_OK && config_path && layer_last(&lfile, "decoder_block") &&
                           !layer_last(&lfile, "model_name") && !layer_last(&lcli, "model_name");
    if (self_model) {
        const char *base = strrchr(config_path, '/');
        base = base ? base + 1 : config_path;
        size_t bl = strlen(base);
        const char *dot = strrchr(base, '.');
        if (dot && dot != base) bl = (size_t)(dot - base);
        if (bl >= sizeof cfg->model.model_name) bl = sizeof cfg->model.model_name - 1;
        memcpy(cfg->model.model_name, base, bl);
        cfg->model.model_name[bl] = '\0';
        snprintf(model_path, sizeof model_path, "%s", config_path);
    }
    if (st == MT_OK && !self_model) {
        st = find_model_file(config_path, cfg->model.model_name, model_path, sizeof model_path);
        if (st == MT_OK) st = layer_parse_file(&lmodel, model_path);
        if (st == MT_OK) st = layer_check_keys(&lmodel);
        if (st == MT_OK && (e = layer_last(&lmodel, "model_name")))
            st = mt_set_error(MT_ERR_INVALID, "%s: a model file must not set model_name", e->source);
        for (int i = 0; st == MT_OK && i < lmodel.n; i++)
            if (!mt_config_key_find(lmodel.e[i].key)->is_model)
                st = mt_set_error(MT_ERR_INVALID, "%s: '%s' is a run key; a model file (%s) may only hold model "
                                  "keys: set it in the run config or on the command line",
                                  lmodel.e[i].source, lmodel.e[i].key, model_path);
    }

    /* decoder_block: the last layer that sets it decides the model defaults. */
    const cfg_entry *blk = NULL;
    if (st == MT_OK) {
        blk = layer_last(&lcli, "decoder_block");
        if (!blk) blk = layer_last(&lfile, "decoder_block");
        if (!blk) blk = layer_last(&lmodel, "decoder_block");
        if (!blk) st = mt_set_error(MT_ERR_INVALID, "%s: decoder_block is not set", model_path);
    }
    if (st == MT_OK) {
        char name[sizeof cfg->model.model_name];
        memcpy(name, cfg->model.model_name, sizeof name);
        st = mt_train_config_set(cfg, blk->key, blk->value, blk->source);
        if (st == MT_OK) {
            mt_decoder_block b = cfg->model.decoder_block;
            mt_model_config_defaults(&cfg->model, b);
            cfg->model.decoder_block = b;
            memcpy(cfg->model.model_name, name, sizeof name);
        }
    }
    if (st == MT_OK) st = layer_apply(cfg, &lmodel);
    if (st == MT_OK) st = layer_apply(cfg, &lfile);
    if (st == MT_OK) st = layer_apply(cfg, &lcli);
    /* A model dimension no layer sets keeps the block's 0: say it is missing, rather
     * than "= 0 must be positive". */
    for (int i = 0; st == MT_OK && i < MT_KEY_N; i++) {
        const mt_config_key *k = &mt_keys[i];
        if (!k->is_model || k->type != MT_KEY_INT || !(k->has_min && k->min >= 1)) continue;
        int64_t v;
        memcpy(&v, (const char *)cfg + k->offset, sizeof v);
        if (v < 1 && !layer_last(&lmodel, k->name) && !layer_last(&lfile, k->name) && !layer_last(&lcli, k->name))
            st = mt_set_error(MT_ERR_INVALID, "%s: model key '%s' is missing from the model file (decoder_block %s "
                              "has no default for it)", model_path, k->name, blk ? blk->value : "?");
    }
    if (st == MT_OK && validate) st = mt_train_config_validate(cfg);
    layer_free(&lfile);
    layer_free(&lcli);
    layer_free(&lmodel);
    return st;
}

mt_status mt_train_config_load(mt_train_config *cfg, const char *config_path, int n_overrides,
                               const char *const *overrides) {
    return config_load(cfg, config_path, n_overrides, overrides, 1);
}

mt_status mt_train_config_read(mt_train_config *cfg, const char *config_path, int n_overrides,
                               const char *const *overrides) {
    return config_load(cfg, config_path, n_overrides, overrides, 0);
}
