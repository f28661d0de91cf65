/* train/config.h: the run configuration (MaxText key names) and its key table.
 *
 * One table of keys (mt_config_key) drives parsing, defaults, validation, printing
 * and `meshtrain --help`: every key has a name, a type, a field offset, its allowed
 * values or range and a one-line doc. Run keys carry their default as text, parsed
 * by the same code as a config file, so configs/base.yml (which documents every run
 * key) and the built-in defaults cannot drift apart unnoticed (tests/test_config.c).
 * Model keys (configs/models/<model_name>.yml) take their defaults from
 * mt_model_config_defaults of the resolved decoder_block.
 *
 * Precedence (lowest first): built-in defaults < the model file
 * configs/models/<model_name>.yml < CONFIG.yml < key=value overrides. */
#ifndef MT_TRAIN_CONFIG_H
#define MT_TRAIN_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "models/config.h"
#include "models/remat.h"
#include "kernels/backend.h" /* mt_backend_kind: backend=auto|cpu|cuda */
#include "runtime/dtype.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_CONFIG_PATH_MAX 1024
#define MT_CONFIG_NAME_MAX 128
#define MT_CONFIG_PROMPT_MAX 4096 /* `sample`'s prompt and prompt_ids, bytes with the NUL */
#define MT_CONFIG_FILES_MAX 4096 /* train_files / eval_files: a list of paths */


typedef struct mt_train_config {
    mt_model_config model;                          /* model keys; model.model_name = model_name */
    char run_name[MT_CONFIG_NAME_MAX];              /* output subdirectory name */
    char base_output_directory[MT_CONFIG_PATH_MAX]; /* outputs go to <this>/<run_name>/ */
    char dataset_path[MT_CONFIG_PATH_MAX];          /* directory (or glob) of train_*.bin / val_*.bin */
    /* ---- data: splits and shuffling (train/data.h) ---- */
    char train_files[MT_CONFIG_FILES_MAX];          /* train shards: files/globs, "" = from dataset_path */
    char eval_files[MT_CONFIG_FILES_MAX];           /* val shards: files/globs, "" = from dataset_path */
    int enable_data_shuffling;                      /* permute shards and units of the train split per epoch */
    int64_t data_shuffle_seed;                      /* Philox key of the shuffle, -1 = seed */
    char tokenizer_path[MT_CONFIG_PATH_MAX];        /* SentencePiece .vocab ("piece\tscore") */
    int64_t per_device_batch_size;                  /* sequences per micro-batch */
    int64_t max_target_length;                      /* tokens per sequence */
    int64_t steps;                                  /* optimizer steps of the run */
    double learning_rate;                           /* peak LR */
    double warmup_steps_fraction;                   /* warmup steps = int(steps * this) */
    double cosine_learning_rate_final_fraction;     /* final LR = learning_rate * this */
    double adam_b1, adam_b2, adam_eps, adam_weight_decay;
    double gradient_clipping_threshold;             /* global-norm clip, 0 = off */
    int64_t gradient_accumulation_steps;            /* micro-batches per step */
    int64_t num_vocab_tiling;                       /* row tiles of the loss, 0 = auto */
    int64_t num_vocab_chunks;                       /* vocabulary chunks, 0 = auto (models/model.h) */
    mt_dtype dtype;                                 /* compute dtype */
    mt_dtype weight_dtype;                          /* master weight dtype */
    mt_dtype grad_dtype;                            /* gradient accumulator dtype */
    int64_t eval_interval;                          /* steps between evals, <= 0 = off */
    int64_t eval_steps;                             /* val batches per eval */
    int64_t checkpoint_period;                      /* steps between checkpoints, 0 = end only */
    char load_checkpoint[MT_CONFIG_PATH_MAX];       /* checkpoint dir to resume, "" = none */
    char load_parameters_path[MT_CONFIG_PATH_MAX];  /* dir with model.safetensors, "" = none */
    int64_t seed;                                   /* init and sampling seed */
    mt_backend_kind backend;
    int64_t log_period;                             /* console line every this many steps */
    int64_t sample_length;                          /* `meshtrain sample`: tokens to generate */
    double temperature;                             /* sampling temperature, 0 = greedy */
    int64_t top_k;                                  /* sample among the k most likely, 0 = all */
    /* ---- `sample` prompt and `prepare` (train/tokenizer.h, scripts/prepare_data.py) ---- */
    char prompt[MT_CONFIG_PROMPT_MAX];              /* text to continue, encoded by the tokenizer */
    char prompt_ids[MT_CONFIG_PROMPT_MAX];          /* or token ids to continue, "1,2,3" (used as given) */
    /* ---- packed documents: document masking (models/model.h mt_model_layout packing) ---- */
    int packing;                                    /* attention within documents, positions per document */
    int64_t packing_separator_id;                   /* the token that starts each document (BOS) */
    /* ---- parallelism (parallel/mesh.h, parallel/zero1.h) ---- */
    int64_t ici_data_parallelism;                   /* data axis size, -1 = fill */
    int64_t ici_fsdp_parallelism;                   /* fsdp axis size, -1 = fill */
    int64_t ici_context_parallelism;                /* context axis size, -1 = fill */
    int64_t ici_tensor_parallelism;                 /* tensor axis size, -1 = fill */
    int shard_optimizer_over_data;                  /* ZeRO-1: optimizer state sharded over data x fsdp */
    int gradient_accumulation_reduce;               /* mt_ga_reduce: 0 once, 1 every micro-batch */
    int overlap_grad_reduce;                        /* per-layer reduce-scatters overlap the backward */
    int context_parallel_strategy;                  /* 0 all_gather, 1 ring */
    int tensor_sequence_parallelism;                /* sequence parallelism on the tensor axis */
    double collective_timeout_s;                    /* watchdog limit of one collective (seconds) */
    /* ---- memory: remat, host offload, planning (models/remat.h, train/estimate.h) ---- */
    int remat_policy;                               /* mt_remat_policy_kind */
    int remat_custom[MT_RT_COUNT];                  /* mt_remat_action per name (remat_policy=custom) */
    int parameter_memory_host_offload;              /* parameters in host memory */
    int param_window_unit;                          /* 0 layer, 1 weight (models/model.h weight_windows) */
    int64_t grad_window_chunks;                     /* row blocks of a layer weight's gradient window */
    int optimizer_memory_host_offload;              /* optimizer state in host memory */
    double hbm_gib;                                 /* `estimate`: device memory budget (GiB), 0 = unset */
    int64_t num_devices;                            /* `plan`/`estimate`: devices of the job */
} mt_train_config;

typedef enum mt_key_type {
    MT_KEY_INT = 0,    /* int64_t */
    MT_KEY_FLOAT,      /* float (model keys) */
    MT_KEY_DOUBLE,     /* double (run keys) */
    MT_KEY_BOOL,       /* int 0/1; true|false (any case) */
    MT_KEY_STRING,     /* char[size] */
    MT_KEY_ENUM,       /* int-sized enum; one of `choices` */
    MT_KEY_ACTIVATIONS /* mlp_activations list: [silu, linear] | [gelu, linear] */
} mt_key_type;

/* One configuration key. */
typedef struct mt_config_key {
    const char *name;
    mt_key_type type;
    size_t offset;               /* offsetof(mt_train_config, field) */
    size_t size;                 /* MT_KEY_STRING: capacity in bytes including the NUL */
    const char *const *choices;  /* MT_KEY_ENUM: NULL-terminated names ... */
    const int *choice_values;    /* ... and the enum value of each */
    int is_model;                /* 1: model key (default from the decoder block) */
    const char *def;             /* run keys: the default as config text */
    int has_min, has_max;        /* range checks for numbers (inclusive) */
    double min, max;
    const char *doc;
} mt_config_key;

/* The key table: count and key i (NULL when out of range), and lookup by name. */
int mt_config_key_count(void);
const mt_config_key *mt_config_key_get(int i);
const mt_config_key *mt_config_key_find(const char *name);

/* Human name of a key's type ("integer", "float", "bool", "string", "one of a|b",
 * "list"), for messages and help. Writes at most n bytes to buf and returns buf. */
const char *mt_config_key_type_str(const mt_config_key *k, char *buf, size_t n);

/* What number key k accepts, as its range messages say it: "in [0, 1)", "-1 (fill the
 * world) or >= 1", ">= 1" (the table's bounds where no other check narrows them), or ""
 * for a key without a range. Writes at most n bytes to buf and returns buf. */
const char *mt_config_key_accepts(const mt_config_key *k, char *buf, size_t n);

/* Built-in defaults: every run key from its table default, the model fields from
 * mt_model_config_defaults(MT_DECODER_LLAMA2) with zero dimensions. */
void mt_train_config_defaults(mt_train_config *cfg);

/* Set key `name` from its text form, as it would appear in a config file;
 * `source` names where it came from for error messages ("run.yml:12",
 * "command line"). Does not run cross-key validation.
 * Errors: MT_ERR_INVALID naming the source, the key and the value: unknown key
 * (with the closest known key suggested), wrong type (with the expected type),
 * enum value not allowed (listing the allowed values), out of range, string too long. */
mt_status mt_train_config_set(mt_train_config *cfg, const char *name, const char *value,
                              const char *source);

/* Apply every key of the YAML file `path` (a flat mapping of scalars; mlp_activations
 * may be a sequence) onto cfg, in file order. No model file lookup, no validation.
 * Errors: MT_ERR_IO (cannot open), MT_ERR_INVALID (YAML syntax, not a flat mapping,
 * any mt_train_config_set error; messages carry "path:line"). */
mt_status mt_train_config_apply_file(mt_train_config *cfg, const char *path);

/* Load a full run configuration: defaults; the model file <model_name>.yml, looked
 * up in (1) <dir of config_path>/models/, (2) $MESHTRAIN_CONFIG_DIR/models/,
 * (3) <dir of config_path>/configs/models/, (4) ./configs/models/; then config_path
 * (may be NULL); then the n overrides "key=value" (model_name may be overridden here,
 * which selects another model file). The model defaults come from
 * mt_model_config_defaults of the decoder_block set by the last of these layers.
 * Then validates (mt_train_config_validate).
 * Errors: MT_ERR_IO (config_path unreadable), MT_ERR_INVALID (any key error, an
 * override without '=', a model file that cannot be found (naming the directories
 * tried), a model file setting model_name or any run key, a key set twice in one file
 * (naming both lines), a model dimension no layer sets, no decoder_block, validation).
 * A config_path that sets decoder_block but not model_name (nor does the command
 * line) is the model file itself: model_name becomes its file name without extension
 * and no other model file is read. */
mt_status mt_train_config_load(mt_train_config *cfg, const char *config_path, int n_overrides,
                               const char *const *overrides);

/* mt_train_config_load without the final mt_train_config_validate, for a caller that
 * changes cfg first and then validates it: `sample` puts its checkpoint's model (its
 * config.json) in place of the config's, since that is the model it runs and top_k is
 * checked against. Same errors, but validation's. */
mt_status mt_train_config_read(mt_train_config *cfg, const char *config_path, int n_overrides,
                               const char *const *overrides);

/* Cross-key and range validation: mt_model_config_validate, per_device_batch_size,
 * max_target_length, steps, gradient_accumulation_steps, eval_steps, log_period >= 1;
 * 0 <= num_vocab_tiling <= batch*seq (0 = auto); 0 <= num_vocab_chunks <= vocab_size;
 * learning_rate >= 0; warmup and final fractions
 * in [0, 1]; adam_b1, adam_b2 in [0, 1); adam_eps > 0; weight decay, clipping
 * threshold, checkpoint_period, temperature >= 0; 0 <= top_k <= vocab_size (0 = all;
 * more would keep more tokens than the model has); run_name non-empty and
 * without '/'; load_checkpoint and load_parameters_path not both set; the step's byte
 * counts (activations, parameter state) within int64. Errors: MT_ERR_INVALID naming
 * the key and value. */
mt_status mt_train_config_validate(const mt_train_config *cfg);

/* The first model key on which a and b differ, among those a checkpoint's config.json
 * pins: every field that changes the parameter shapes or the math of a step
 * (decoder_block, the dimensions, mlp_activations, logits_via_embedding,
 * normalization_layer_epsilon, the soft-caps, the sliding window and its pattern,
 * query_pre_attn_scalar, the RoPE base, scaling and local base, the QK / post norms).
 * Fields without effect are ignored and "0 = derived" ones resolved first (e.g.
 * query_pre_attn_scalar 0 equals head_dim; rope_factor counts only with a rope_type
 * that reads it). only_key (may be NULL) compares that key alone. va and vb (n bytes
 * each) receive the two values as config text. Returns NULL when they agree (or on
 * OOM). Used by resume, `sample` and load_parameters_path (one rule). */
/* The Hugging Face config.json field that holds model key `key` (for messages), or
 * `key` itself when there is none. */
const char *mt_model_config_hf_field(const char *key);

const mt_config_key *mt_model_config_diff(const mt_model_config *a, const mt_model_config *b, const char *only_key,
                                          char *va, char *vb, size_t n);

/* Text form of key k's value in cfg (the same text mt_train_config_set accepts;
 * floats in the shortest form that reads back exactly). Returns buf. */
const char *mt_train_config_format(const mt_train_config *cfg, const mt_config_key *k, char *buf,
                                   size_t n);

/* The whole resolved config as text: one "key=value\n" line per key of the table, in
 * table order (run keys, model keys and the remat_custom tensors alike), each value as
 * mt_train_config_format writes it with '\\' and a newline escaped ("\\\\", "\\n"),
 * so that every key is exactly one line and two configs hold the same values iff their
 * texts are equal. Under mpirun the ranks compare it (train/main.c agree_on_inputs).
 * *text is malloc'ed (the caller frees) and NUL-terminated; *len (may be NULL) is its
 * strlen. Errors: MT_ERR_OOM. */
mt_status mt_train_config_text(const mt_train_config *cfg, char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
