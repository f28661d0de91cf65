/* meshtrain.h: the public C API of libmeshtrain, for research code.
 *
 * Self-contained: needs only <stddef.h> and <stdint.h>, so an installed copy works
 * without the library's internal headers. Link with libmeshtrain (shared or static):
 * CMake `find_package(meshtrain)` -> `meshtrain::meshtrain`, or
 * `pkg-config --cflags --libs meshtrain`.
 *
 * A session (mt_session) is one model on one device with its memory plan and arena,
 * built from a run configuration (MaxText key names, the same keys and files as the
 * `meshtrain train` CLI, README.md) or from a Hugging Face checkpoint directory.
 * Through it research code can
 *   - run the library's own training step (data loader, loss, AdamW, clipping),
 *   - run the forward alone and read the final hidden states,
 *   - run forward + backward on its own tokens and labels with its own loss weight,
 *   - back-propagate its own gradient of the final hidden states through the decoder,
 *   - call the vocab-tiled loss and its VJP on hidden states and labels it provides,
 *   - read and write every parameter and gradient by its Hugging Face name,
 *   - read a named activation saved by the forward (a probe),
 *   - plan memory, save and load checkpoints.
 *
 * Conventions.
 *   - Every function that can fail returns mt_status (MT_OK == 0); on failure
 *     mt_last_error() gives the text (per thread, valid until the next failure).
 *   - The library never exits the process and prints nothing unless asked
 *     (mt_set_verbosity).
 *   - Tensors crossing the API are host memory, row-major, contiguous: float32 for
 *     values, int32 for token ids and labels. "rows" means batch x sequence
 *     (N = per_device_batch_size * max_target_length), row r = b * T + t.
 *   - Parameter names and shapes are Hugging Face's (linear weights [out, in]),
 *     e.g. "model.layers.0.self_attn.q_proj.weight".
 *   - A session is not thread-safe: call it from one thread at a time.
 *
 * Math: the decoder is models/model.h (HF modeling_llama.py, modeling_gemma*.py),
 * the loss kernels/tiled_loss.h (MaxText vocab tiling; Wijmans et al. 2024), the
 * optimizer train/optimizer.h (torch.optim.AdamW). */
#ifndef MESHTRAIN_H
#define MESHTRAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MESHTRAIN_VERSION_MAJOR 0
#define MESHTRAIN_VERSION_MINOR 1
#define MESHTRAIN_VERSION_PATCH 0

/* ------------------------------------------------------------------ status ---- */

/* The same codes as the library's runtime/status.h. Code inside the library's source
 * tree that also uses internal headers includes them before this one (then
 * runtime/status.h has defined these and this block is skipped). */
#ifndef MT_RUNTIME_STATUS_H
typedef enum mt_status {
    MT_OK = 0,
    MT_ERR_INVALID = 1,     /* bad input: config key or value, shape, argument */
    MT_ERR_IO = 2,          /* a file is missing, unreadable or unwritable */
    MT_ERR_FORMAT = 3,      /* a file exists but its contents are malformed */
    MT_ERR_OOM = 4,         /* an allocation failed */
    MT_ERR_RUNTIME = 5,     /* a failure while running: numerics, device, comm */
    MT_ERR_UNSUPPORTED = 6  /* a valid request this build cannot do */
} mt_status;

/* Short constant name of a status ("invalid input", ...). Never NULL. */
const char *mt_status_str(mt_status s);

/* The message of the last failing call on this thread, or "" if none. The pointer
 * stays valid until the next failure on this thread. */
const char *mt_last_error(void);
#endif

/* Library version as "major.minor.patch". Never NULL. */
const char *mt_version(void);

/* Log lines of the library to stderr: 0 = silent (the default), 1 = info
 * (e.g. "saved checkpoint ..."), 2 = debug. Process-wide.
 * Errors: MT_ERR_INVALID when level is outside [0, 2]. */
mt_status mt_set_verbosity(int level);

/* ------------------------------------------------------------ processes ---- */

/* Join the processes of a multi-process run (the mesh axes are
 * then taken from the ici_*_parallelism keys of each session's config). mpi_comm is
 * a pointer to the caller's MPI_Comm (e.g. &MPI_COMM_WORLD or a sub-communicator),
 * passed as void * so this header does not need mpi.h; NULL means MPI_COMM_WORLD, or
 * a single process when the program was not started by mpirun.
 * With a communicator, the caller initialised MPI and finalises it; the library
 * duplicates the communicator and installs no exit handler or watchdog. With NULL
 * under mpirun the library initialises MPI itself (and finalises it at exit). Call it
 * before creating sessions; every rank of the communicator must then create its
 * sessions with the same config (ici_* keys whose product is world_size) and call
 * mt_session_step together. Sessions without data (dataset_path=) are single-process.
 * *rank / *world_size receive this process's rank and the world size (may be NULL).
 * Errors: MT_ERR_INVALID (MPI not initialised by the caller, or already joined to
 * another communicator), MT_ERR_RUNTIME (MPI failure), MT_ERR_UNSUPPORTED (a
 * communicator given to a build without MPI). */
mt_status mt_distributed_init(void *mpi_comm, int *rank, int *world_size);

/* ----------------------------------------------------------------- session ---- */

typedef struct mt_session mt_session;

/* A session from a run configuration: built-in defaults < the model file
 * configs/models/<model_name>.yml < config_path (may be NULL: key=value pairs
 * alone) < the n_overrides strings "key=value" (MaxText keys; README.md; every
 * string non-NULL).
 * If dataset_path (or train_files) is non-empty the session owns the library's trainer: its train
 * shards are opened and checked (and the val shards when eval_interval > 0), and
 * mt_session_step / mt_session_next_batch / mt_session_evaluate work. With
 * dataset_path= (empty) no data is opened; forward, loss, backward and tensor access
 * work on tokens the caller provides. Parameters come from load_checkpoint (resume:
 * weights, AdamW moments, step, data position), else load_parameters_path (weights
 * only), else a seeded initialisation (seed).
 * Allocates the whole memory plan (mt_session_memory) once, here.
 * Errors: MT_ERR_INVALID / MT_ERR_UNSUPPORTED (config: the message names the key; a
 * NULL override string), MT_ERR_IO / MT_ERR_FORMAT (config, data or checkpoint files,
 * naming them), MT_ERR_OOM. */
mt_status mt_session_create(mt_session **out, const char *config_path,
                            int n_overrides, const char *const *overrides);

/* A session from a Hugging Face directory hf_dir holding config.json and
 * model.safetensors (or a sharded model.safetensors.index.json): the model keys come
 * from config.json (llama, gemma, gemma2, gemma3_text), the weights from the
 * safetensors files, the run keys from their defaults with dataset_path empty, then
 * the overrides (e.g. "per_device_batch_size=1", "max_target_length=128",
 * "dataset_path=..."). Errors: those of mt_session_create; MT_ERR_IO / MT_ERR_FORMAT
 * naming hf_dir's file that is missing or malformed. */
mt_status mt_session_create_hf(mt_session **out, const char *hf_dir,
                               int n_overrides, const char *const *overrides);

/* Free everything the session allocated. NULL is fine. */
void mt_session_free(mt_session *s);

/* Shapes of a session. */
typedef struct mt_session_info {
    int64_t batch;        /* per_device_batch_size: sequences per micro-batch (B) */
    int64_t seq;          /* max_target_length: tokens per sequence (T) */
    int64_t rows;         /* B * T: rows of tokens, labels, hidden states */
    int64_t emb_dim;      /* D: hidden size */
    int64_t vocab_size;   /* V */
    int64_t num_layers;   /* decoder layers */
    int64_t num_params;   /* parameter elements (a tied unembedding counted once) */
    int64_t num_tensors;  /* named parameter tensors (mt_session_param_info) */
    int64_t step;         /* optimizer steps done by mt_session_step (or resumed) */
    int has_data;         /* 1 when dataset_path was given (the trainer exists) */
} mt_session_info;

/* Errors: MT_ERR_INVALID (NULL argument). */
mt_status mt_session_get_info(const mt_session *s, mt_session_info *info);

/* Text form of configuration key `key` (as a config file would write it) into
 * buf[n]. Errors: MT_ERR_INVALID (unknown key, NULL, n too small). */
mt_status mt_session_config_get(const mt_session *s, const char *key, char *buf, size_t n);

/* ---------------------------------------------------- the library's step ---- */

/* One optimizer step's numbers (the metrics.jsonl row, docs/resume.md). */
typedef struct mt_step_result {
    int64_t step;         /* steps done after this one (1-based) */
    double loss;          /* token-mean cross-entropy of the step (nats) */
    double lr;            /* learning rate used by the update */
    double grad_norm;     /* global gradient norm before clipping */
    int64_t tokens;       /* labelled tokens in the step (all micro-batches) */
    double tokens_per_s;  /* tokens / step wall time */
    double step_ms;       /* step wall time, milliseconds */
    double mfu;           /* model FLOP utilisation in [0, 1]; NaN when unknown (CPU) */
    uint64_t bytes_communicated; /* bytes this process sent during the step (0 single-process) */
} mt_step_result;

/* One training step of the library's trainer (train/trainer.h): gradient_accumulation_
 * steps micro-batches from the train shards, token-mean loss, global-norm clipping,
 * AdamW with the warmup-cosine schedule. out may be NULL.
 * Errors: MT_ERR_INVALID (session has no data), data loader errors, MT_ERR_RUNTIME
 * (non-finite gradient norm, no labelled token). */
mt_status mt_session_step(mt_session *s, mt_step_result *out);

/* Validation loss over eval_steps batches of the val shards (token mean, nats) and
 * the labelled tokens counted. Errors: MT_ERR_INVALID (no data, or eval_interval <= 0
 * so no val split was opened). */
mt_status mt_session_evaluate(mt_session *s, double *val_loss, int64_t *val_tokens);

/* The whole run of the config, like `meshtrain train`: steps to `steps`, evaluating,
 * writing <base_output_directory>/<run_name>/metrics.jsonl and checkpoints.
 * Errors: those of mt_session_step; MT_ERR_IO (output directory). */
mt_status mt_session_train(mt_session *s);

/* --------------------------------------------- pieces of a custom step ---- */

/* The next micro-batch of the train shards: tokens[rows] and next-token labels[rows]
 * (int32). This is the session's own reader (llm.c order, shuffled as the config says,
 * train/data.h), starting at
 * the beginning of the split, independent of the position mt_session_step reads.
 * Errors: MT_ERR_INVALID (no data, NULL), MT_ERR_FORMAT (bad shard). */
mt_status mt_session_next_batch(mt_session *s, int32_t *tokens, int32_t *labels);

/* Forward only: tokens[rows] -> hidden[rows, emb_dim], the final hidden states after
 * the final norm (the input of the unembedding). Afterwards the saved activations
 * can be read with mt_session_activation, and mt_session_backward_hidden can follow.
 * Errors: MT_ERR_INVALID (NULL, a token outside [0, vocab_size), naming it). */
mt_status mt_session_forward(mt_session *s, const int32_t *tokens, float *hidden);

/* Forward + loss, no gradients: *loss_sum = summed cross-entropy over rows whose
 * label is not -1 (fp64, nats), *count = those rows. Saved activations readable after.
 * Errors: MT_ERR_INVALID (NULL, token or label out of range). */
mt_status mt_session_loss(mt_session *s, const int32_t *tokens, const int32_t *labels,
                          double *loss_sum, int64_t *count);

/* Set every gradient to zero. Errors: MT_ERR_INVALID (NULL). */
mt_status mt_session_zero_grads(mt_session *s);

/* Forward + backward of the LM loss on the caller's batch: ADDS dscale * d(sum of
 * token losses)/d(params) into the gradients (zero them first with
 * mt_session_zero_grads). dscale = 1 / count gives the token mean; calling it again
 * with other labels and another weight adds another loss term (a weighted sum of
 * cross-entropies of the same hidden states, e.g. a multi-token-prediction term).
 * labels[rows] int32, -1 = ignored. *loss_sum / *count as mt_session_loss (may be NULL).
 * Errors: MT_ERR_INVALID (NULL tokens/labels, ids out of range, dscale not finite). */
mt_status mt_session_forward_backward(mt_session *s, const int32_t *tokens, const int32_t *labels,
                                      float dscale, double *loss_sum, int64_t *count);

/* Backward of the decoder from a caller-computed gradient of the final hidden states:
 * the way to train through a loss of one's own on the hidden states.
 *   in: dhidden[rows, emb_dim] float32 = d(loss)/d(hidden) for the hidden states
 *       (after the final norm) of the last mt_session_forward (or mt_session_loss),
 *       on the same tokens and with the same parameters.
 * ADDS to the gradients the VJP through the final norm, every decoder layer (the
 * remat policy's recompute / restore as in mt_session_forward_backward, from the same
 * code) and the embedding. The unembedding gets nothing here: a loss through it adds
 * its share itself (mt_session_tiled_loss with add_unembedding_grad). So
 *   forward -> tiled_loss(dscale, dhidden, add_unembedding_grad=1) -> backward_hidden
 * gives the gradients of mt_session_forward_backward(dscale), and dhidden may carry
 * any other term on the hidden states (e.g. + d(aux)/d(hidden)).
 * The backward consumes the forward: call mt_session_forward again before the next
 * backward_hidden (a step, forward_backward, set_param or load_model also drop it).
 * Errors: MT_ERR_INVALID (NULL, or no forward to differentiate since the last step,
 * backward or parameter write). */
mt_status mt_session_backward_hidden(mt_session *s, const float *dhidden);

/* The vocab-tiled cross-entropy and its VJP on caller-provided hidden states, with
 * the session's unembedding W[vocab_size, emb_dim] (lm_head.weight, or the embedding
 * when tied) and final soft-cap, cut into num_vocab_tiling row tiles (at most rows):
 *   in:  hidden[rows, emb_dim] float32, labels[rows] int32 (-1 = ignored), any rows >= 1
 *   out: *loss_sum (fp64 sum over labelled rows, nats), *count (labelled rows);
 *        if dhidden != NULL: dhidden[rows, emb_dim] = dscale * dloss/dhidden;
 *        if add_unembedding_grad: the unembedding's gradient += dscale * dloss/dW.
 * Full [rows, vocab] logits are never formed (kernels/tiled_loss.h).
 * Errors: MT_ERR_INVALID (NULL, rows < 1, a label outside [0, vocab_size) and not
 * -1, naming the row), MT_ERR_OOM (tile scratch). */
mt_status mt_session_tiled_loss(mt_session *s, const float *hidden, const int32_t *labels,
                                int64_t rows, float dscale, float *dhidden,
                                int add_unembedding_grad, double *loss_sum, int64_t *count);

/* ------------------------------------------------ parameters and grads ---- */

#define MT_TENSOR_NAME_MAX 96

/* One named tensor. */
typedef struct mt_tensor_info {
    char name[MT_TENSOR_NAME_MAX]; /* Hugging Face name */
    int ndim;                      /* 1 or 2 */
    int64_t shape[2];              /* [out, in] for linear weights; [n, 1] for 1-D tensors */
    int64_t numel;                 /* elements */
} mt_tensor_info;

/* Tensor i in [0, num_tensors) in the model's order (embedding, layers, final norm,
 * lm_head). Errors: MT_ERR_INVALID (index out of range, NULL). */
mt_status mt_session_param_info(const mt_session *s, int64_t index, mt_tensor_info *info);

/* The tensor called name. Errors: MT_ERR_INVALID (no such parameter, naming it). */
mt_status mt_session_param_find(const mt_session *s, const char *name, mt_tensor_info *info);

/* Copy parameter / gradient `name` to out[numel] or from in[numel] (float32 host).
 * numel must equal the tensor's element count. Writing a parameter changes what the
 * next forward and mt_session_step use (the AdamW moments are not touched).
 * Errors: MT_ERR_INVALID (unknown name, NULL, numel mismatch naming both counts). */
mt_status mt_session_get_param(mt_session *s, const char *name, float *out, int64_t numel);
mt_status mt_session_set_param(mt_session *s, const char *name, const float *in, int64_t numel);
mt_status mt_session_get_grad(mt_session *s, const char *name, float *out, int64_t numel);
mt_status mt_session_set_grad(mt_session *s, const char *name, const float *in, int64_t numel);

/* ------------------------------------------------------------- activations ---- */

/* Copy a named activation saved by the last forward (mt_session_forward or
 * mt_session_loss) into out[capacity] (float32 host); *numel (may be NULL) gets its
 * element count; out may be NULL to ask only for the count. Names are the memory
 * plan's (MaxText's remat names per layer):
 *   "layers.<l>.decoder_layer_input" [rows, emb_dim]  residual stream entering layer l
 *   "layers.<l>.query_proj" [rows, heads*head_dim] (after RoPE), "layers.<l>.key_proj",
 *   "layers.<l>.value_proj" [rows, kv_heads*head_dim], "layers.<l>.context"
 *   [rows, heads*head_dim], "layers.<l>.out_proj" [rows, emb_dim],
 *   "layers.<l>.mlpwi_0" (gate, pre-activation) and "layers.<l>.mlpwi_1" (up)
 *   [rows, mlp_dim], "final_norm_input" [rows, emb_dim] (output of the last layer),
 *   "final_hidden" [rows, emb_dim].
 * Only tensors the remat policy keeps on the device can be read (remat_policy: a
 * rematerialised or offloaded tensor is refused, naming it); decoder_layer_input and
 * the final_* tensors are always kept. Reads are copies; the forward is not changed.
 * Errors: MT_ERR_INVALID (unknown or not saved name, capacity < numel, or no forward
 * since the last backward/step: call mt_session_forward first). */
mt_status mt_session_activation(mt_session *s, const char *name, float *out, int64_t capacity,
                                int64_t *numel);

/* ------------------------------------------------------------------ memory ---- */

#define MT_MEMORY_CATEGORIES 8

/* The memory plan of a training step (docs/memory.md), bytes of backend memory.
 * Categories, in order: params, grads, optimizer, activations, scratch, loss_tile,
 * comm, workspace (mt_memory_category_name). */
typedef struct mt_memory_info {
    size_t peak_bytes;                            /* the arena: exactly what a step allocates */
    size_t live_bytes[MT_MEMORY_CATEGORIES];      /* live per category at the peak phase */
    size_t total_bytes[MT_MEMORY_CATEGORIES];     /* all entries per category, any lifetime */
    int peak_phase;                               /* step phase where live bytes peak */
    int num_entries;                              /* buffers in the plan */
    int64_t num_params;                           /* parameter elements */
} mt_memory_info;

/* Lower-case name of category c ("params", ...), or "unknown". Never NULL. */
const char *mt_memory_category_name(int c);

/* The plan of a run configuration (same layering as mt_session_create) without
 * allocating tensors or opening data. Errors: those of configuration loading. */
mt_status mt_memory_from_config(const char *config_path, int n_overrides,
                                const char *const *overrides, mt_memory_info *out);

/* The plan a session allocated. Errors: MT_ERR_INVALID (NULL). */
mt_status mt_session_memory(const mt_session *s, mt_memory_info *out);

/* ------------------------------------------------------------- checkpoints ---- */

/* Full training checkpoint of a session with data, like the CLI's:
 * <base_output_directory>/<run_name>/checkpoints/step_<N>/ (model.safetensors,
 * config.json, train_state.safetensors), atomic. path[path_size] (may be NULL) gets
 * the directory. Resume with the key load_checkpoint=<that directory>.
 * Errors: MT_ERR_INVALID (session without data; or path_size too small for the
 * directory name: the checkpoint is then written and the message names it),
 * MT_ERR_IO, MT_ERR_RUNTIME (a write failed), MT_ERR_OOM. */
mt_status mt_session_save_checkpoint(mt_session *s, char *path, size_t path_size);

/* Weights only, as a Hugging Face directory (dir/model.safetensors in float32, or
 * bfloat16 when bf16 != 0, and dir/config.json), creating dir.
 * Errors: MT_ERR_IO, MT_ERR_OOM. */
mt_status mt_session_save_model(mt_session *s, const char *dir, int bf16);

/* Replace the weights from dir/model.safetensors (or its sharded index); every
 * parameter must be present with its shape. Errors: MT_ERR_IO, MT_ERR_FORMAT. */
mt_status mt_session_load_model(mt_session *s, const char *dir);

#ifdef __cplusplus
}
#endif
#endif
