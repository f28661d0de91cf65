/* train/trainer.h: the training loop on one device: micro-batches, the
 * vocab-tiled loss, the backward, gradient sync, clipping and AdamW.
 *
 * A step: zero the gradients; for each of gradient_accumulation_steps micro-batches
 * read the next batch and run mt_model_forward_backward with dscale = 1 (summed token
 * losses); divide the gradients by the total labelled-token count (the token-weighted
 * mean over all micro-batches, MaxText's gradient-accumulation semantics); clip by
 * the global norm; AdamW with the scheduled learning rate (train/optimizer.h).
 *
 * With grad_dtype=bfloat16 the accumulator is bfloat16: each micro-batch's fp32
 * gradient is added to it in fp32 and rounded once to nearest-even (never
 * two bf16 values added in bf16). Accumulators, the gradient reduction over data x fsdp (all-reduce, or
 * ZeRO-1 reduce-scatter with gradient_accumulation_reduce=once|every) and the shard
 * of the optimizer state are parallel/zero1.h's; they are plan entries. Under mpirun
 * the ici_* keys give the mesh (parallel/mesh.h), each data x fsdp rank reads its
 * slice of the global batch, and world rank 0 alone writes metrics and checkpoints.
 *
 * Outputs under <base_output_directory>/<run_name>/ (docs/resume.md):
 * metrics.jsonl (train/metrics.h; on resume cut back atomically to the rows up to the
 * resumed step, then appended) and checkpoints/step_<N>/ holding model.safetensors
 * + config.json (mt_checkpoint_save_model, F32) and train_state.safetensors:
 * "<hf name>.adam_m" and "<hf name>.adam_v" (F32, the parameter's shape) for every
 * parameter, and __metadata__ {format: "meshtrain-train-state", version: "1", step,
 * data_shard, data_offset, data_epoch, seed, the batch shape and train split the data
 * position belongs to, run_id, checkpoint_id}; model.safetensors' __metadata__ adds
 * meshtrain_step, meshtrain_run_id and meshtrain_checkpoint_id. checkpoint_id (16 hex
 * digits) is drawn for every save; run_id names the history: drawn when a run
 * directory starts one (a fresh run, or a resume into a directory without checkpoints)
 * and kept by a resume in place. A checkpoint is written to step_<N>.tmp/ and renamed
 * into place, so a crash never leaves a half checkpoint; only step_<digits>
 * directories holding config.json, model.safetensors and train_state.safetensors count
 * as checkpoints.
 * There is no other training state: the schedule is a function of the step, the data
 * position is saved and init/sampling randomness is counter-based (Philox), so a
 * resumed run reproduces the uninterrupted run's losses bitwise. */
#ifndef MT_TRAIN_TRAINER_H
#define MT_TRAIN_TRAINER_H

#include <stddef.h>
#include <stdint.h>
#include "kernels/backend.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "train/config.h"
#include "train/data.h"
#include "train/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Refuse what a backend with capabilities `caps` (kernels/backend.h) cannot run,
 * naming the key: dtype not in caps->compute_dtypes, weight_dtype other than float32,
 * grad_dtype not in caps->grad_dtypes, parameter_memory_host_offload or
 * optimizer_memory_host_offload without caps->host_offload. `backend` names it in
 * the message. Errors: MT_ERR_UNSUPPORTED. (More than one rank without
 * caps->multi_rank is refused by mt_trainer_create once the world size is known.) */
mt_status mt_trainer_check_caps(const mt_train_config *cfg, const mt_backend_caps *caps, const char *backend);

/* *be = a new backend for cfg->backend (kernels/backend.h registry: cpu, cuda, auto =
 * cuda when built with it and a device is visible, else cpu), after
 * mt_trainer_check_caps: for cpu and cuda the capability check runs from the config
 * before any device probe, so a refused key is named even where no GPU is visible.
 * The caller releases it with mt_backend_free. Errors: MT_ERR_UNSUPPORTED (a refused
 * key; cuda not built or no device visible), MT_ERR_OOM. */
mt_status mt_trainer_select_backend(const mt_train_config *cfg, mt_backend **be);

/* The trainer's layout check of cfg on the mesh dims (data, fsdp, context, tensor;
 * parallel/mesh.h order), run before any compute by mt_trainer_create and
 * mt_trainer_plan: parallel/mesh.h mt_mesh_check_layout on cfg's model sizes,
 * max_target_length, per_device_batch_size, tensor_sequence_parallelism and parameter
 * count, then models/model.h mt_model_check_dtype_layout (the layouts dtype runs on).
 * The estimator's mesh search (train/estimate.h) filters its layouts with this same
 * function. Errors: MT_ERR_INVALID naming the keys and numbers of the first rule
 * broken; MT_ERR_UNSUPPORTED for a dtype the layout does not run yet. */
mt_status mt_trainer_check_layout(const mt_train_config *cfg, const int dims[4]);

/* The checks of mt_trainer_create that need only cfg and the size of the world: no
 * device, no file but the config's, no collective but the process group's start
 * (mt_comm_world_init): mt_train_config_validate, the mesh of the ici_* keys over the
 * world (parallel/mesh.h mt_mesh_resolve), mt_trainer_check_layout, more than one rank
 * on a backend kind without multi_rank, and for backend cpu or cuda
 * mt_trainer_check_caps. Every rank of a job finds the same verdict from the same
 * config: the CLI runs it before mt_trainer_create so that the ranks can agree on it and
 * print an error once (train/main.c). Errors: those of mt_trainer_create for these
 * checks (MT_ERR_INVALID, MT_ERR_UNSUPPORTED), MT_ERR_RUNTIME (MPI start). */
mt_status mt_trainer_check_config(const mt_train_config *cfg);

/* The finalised memory plan of a training step for cfg without allocating anything
 * or opening data: the model's buffers (mt_model_add_to_plan) plus the gradient sync's
 * and the AdamW moments, for rank 0 of the layout the ici_* keys give (a -1 axis counts
 * as 1). Used by `meshtrain plan` and the estimator; the caller frees it with
 * mt_plan_free. *host_plan (host_plan may be NULL) gets the host plan of offloaded
 * activations, parameters and optimizer moments (models/model.h
 * mt_model_add_to_host_plan; finalised, possibly empty), which the caller frees too.
 * *num_params (may be NULL) gets the parameter count. The plan is sized with the CPU
 * op table when backend=cuda has no device here (the plan does not depend on the
 * backend). On error *plan (and *host_plan) are NULL.
 * Errors: MT_ERR_INVALID (config, layout), MT_ERR_UNSUPPORTED (a key the backend
 * refuses), MT_ERR_OOM. */
mt_status mt_trainer_plan(const mt_train_config *cfg, mt_plan **plan, mt_plan **host_plan, int64_t *num_params);

/* mt_trainer_plan, and *step_bytes (may be NULL) = the bytes rank 0 of that layout
 * sends in one optimizer step: mt_trainer_step_bytes' formula (the gradient reduction
 * and ZeRO-1 / fsdp parameter all-gathers of parallel/zero1.h, the step's 8-byte
 * all-reduces, and per micro-batch models/model_shard.c's tensor / context collectives
 * and fsdp layer all-gathers, with every activation kept), made from the planned model
 * and gradient sync without any communicator. The estimator's step model takes its
 * collective bytes from here, so it counts exactly what the trainer counts.
 * vocab_tiling (may be NULL) gets the model's resolved counts: [0] the loss's row tiles,
 * [1] its vocabulary chunks (models/model.h mt_model_vocab_tiling), [2] gemma4's
 * per-layer embedding table chunks (mt_model_per_layer_input_chunks; 0 without one).
 * Errors: those of mt_trainer_plan. */
mt_status mt_trainer_plan_ex(const mt_train_config *cfg, mt_plan **plan, mt_plan **host_plan, int64_t *num_params,
                             uint64_t *step_bytes, int64_t vocab_tiling[3]);

typedef struct mt_trainer mt_trainer;

/* Build everything a run needs and check all inputs, without writing anything:
 * backend, model, plan, arena, the train loader (and the val loader when
 * eval_interval > 0; token ids must be < vocab_size), then the parameters from
 * load_checkpoint (parameters, AdamW moments, step, data position), else
 * load_parameters_path (parameters only), else mt_model_init_params(seed).
 * load_checkpoint must be one checkpoint: not a step_<N>.tmp directory (an unfinished
 * save), its model.safetensors and train_state.safetensors recording the same step
 * and checkpoint_id (when they record them), a step_<N> name matching the recorded
 * step. Errors: MT_ERR_INVALID / MT_ERR_UNSUPPORTED (config; a checkpoint that fails
 * those checks, naming the file or directory), MT_ERR_IO / MT_ERR_FORMAT (data or
 * checkpoint files, naming them), MT_ERR_OOM. */
mt_status mt_trainer_create(mt_trainer **out, const mt_train_config *cfg);

/* mt_trainer_create with full_grads = 1: the model keeps its full fp32 gradient
 * buffer (mt_model_grads) instead of the gradient windows the gradient sync
 * chooses when they save memory (parallel/zero1.h); the library API's sessions use it
 * because they read and write named gradients there. The plan then differs from
 * mt_trainer_plan's where windows apply. full_grads = 0 is mt_trainer_create. */
mt_status mt_trainer_create_ex(mt_trainer **out, const mt_train_config *cfg, int full_grads);

/* The data loader options of split "train" or "val" under cfg (train/data.h): the
 * split's file list key, shuffling (train only; seed data_shuffle_seed, or seed when it
 * is -1) and micro-batches per step. opt->files points into cfg. */
void mt_trainer_data_options(const mt_train_config *cfg, const char *split, mt_data_options *opt);
void mt_trainer_free(mt_trainer *t);

/* Steps done so far (the step a resumed run starts from), the model, the config. */
int64_t mt_trainer_step_count(const mt_trainer *t);
mt_model *mt_trainer_model(mt_trainer *t);
const mt_train_config *mt_trainer_config(const mt_trainer *t);
const mt_plan *mt_trainer_get_plan(const mt_trainer *t);
/* Bytes of the host pool of offloaded activations (0 when nothing is offloaded). */
size_t mt_trainer_host_bytes(const mt_trainer *t);
/* Bytes of the device arena (allocated from the plan: equals mt_plan_peak). */
size_t mt_trainer_device_bytes(const mt_trainer *t);

/* World rank of this process (0 without mpirun). */
int mt_trainer_world_rank(const mt_trainer *t);

/* The mean gradient of the last step (before clipping), all numel fp32 values in the
 * model's flat layout, copied to host[numel] on every rank (a collective under ZeRO-1:
 * every rank must call it). Errors: MT_ERR_INVALID before the first step. */
mt_status mt_trainer_gather_grad(mt_trainer *t, float *host);

/* The parameters, all numel fp32 values in the model's flat layout, copied to
 * host[numel] on every rank (a collective under fsdp, where each rank holds a shard:
 * every rank must call it). Errors: those of the gather. */
mt_status mt_trainer_gather_params(mt_trainer *t, float *host);

/* Bytes this rank sent during the last step (parallel/comm.h accounting) and the
 * layout's formula for them (parallel/zero1.h: gradient and parameter collectives plus
 * the 8-byte all-reduces of loss sum, token count and, under ZeRO-1, squared norm). */
void mt_trainer_step_bytes(const mt_trainer *t, uint64_t *measured, uint64_t *formula);

/* One optimizer step (see the header comment). Fills m's train fields (step, loss,
 * lr, grad_norm, tokens, tokens_per_s, step_ms, mfu); has_eval = 0.
 * Errors: those of the data loader and the model; MT_ERR_RUNTIME when the gradient
 * norm is not finite (naming the step) or a step has no labelled token. */
mt_status mt_trainer_step(mt_trainer *t, mt_step_metrics *m);

/* Validation loss: the val loader rewound, min(eval_steps, windows of one pass over
 * the val split) batches (each window at most once), sum of token losses / labelled
 * tokens; val_tokens = the tokens actually counted. Errors: MT_ERR_INVALID when the run has no val loader. */
mt_status mt_trainer_evaluate(mt_trainer *t, double *val_loss, int64_t *val_tokens);

/* Write <run dir>/checkpoints/step_<N>/ for the current step N (replacing an
 * existing one). path (may be NULL) receives the directory. A failed write (disk
 * full, I/O error, short write) removes step_<N>.tmp/ and is MT_ERR_RUNTIME (exit 1),
 * as is a directory that cannot be created, cleared or renamed.
 * Errors: MT_ERR_RUNTIME, MT_ERR_OOM. */
mt_status mt_trainer_save_checkpoint(mt_trainer *t, char *path, size_t path_size);

/* The checkpoint directory `dir`, given by config key `key` (named in messages), exists,
 * is a directory and is not a step_<N>.tmp (a save that did not finish; the message names
 * the newest complete checkpoint next to it). compare 0: nothing more; 1 (resume): its
 * config.json must exist and describe cfg's model (mt_hf_config_read,
 * mt_model_config_diff: every model-defining field); 2 (weights to start from, e.g. a
 * Hugging Face directory): the same when it has a config.json. Used by `train`
 * (load_checkpoint, load_parameters_path) and `sample`.
 * Errors: MT_ERR_IO (no such directory, not a directory, no config.json), MT_ERR_FORMAT
 * (config.json), MT_ERR_INVALID (a .tmp directory; a model mismatch, naming the file,
 * the field and both values). */
mt_status mt_trainer_check_checkpoint_dir(const mt_train_config *cfg, const char *key, const char *dir, int compare);

/* Check the outputs before anything is written (the CLI calls it after
 * mt_trainer_create and before mt_trainer_run): base_output_directory is non-empty
 * and a directory if it exists, the run directory's nearest existing ancestor is
 * writable, <run dir>, <run dir>/checkpoints and metrics.jsonl are of the right kind,
 * an existing run directory and checkpoints/ are writable, and, unless load_checkpoint
 * resumes, the run directory does not already hold a run (metrics.jsonl, or anything
 * under checkpoints/): its message names the newest complete checkpoint to resume
 * from. When resuming, the run directory must hold load_checkpoint's own history:
 * every complete checkpoint there carries load_checkpoint's run_id (without ids:
 * load_checkpoint is in that checkpoints/), no checkpoint there is later than the
 * resumed step, and without checkpoints metrics.jsonl holds no row at or before the
 * resumed step (another run's rows would be kept). Then it takes the run directory for
 * this process: an exclusive flock(2) on <run dir>/.lock (created, with the directory,
 * if missing; held until mt_trainer_free or the process ends) and checks again under
 * it, so two processes started at once into one run_name cannot both write there.
 * World rank 0 checks and locks; under mpirun every rank gets the verdict (a collective
 * on the world). Errors: MT_ERR_INVALID naming the key or path, or when another
 * process holds the lock; MT_ERR_IO (not writable). */
mt_status mt_trainer_check_outputs(mt_trainer *t);

/* Called after every step (and after the evaluation before training) with that
 * step's metrics row; the CLI prints from it. */
typedef void (*mt_train_callback)(const mt_step_metrics *m, void *user);

/* The whole run: creates the run directory, opens metrics.jsonl (appending when
 * resuming, truncating otherwise), evaluates before training (fresh runs), then
 * steps to cfg->steps, evaluating every eval_interval steps and at the end, writing
 * one metrics row per step and a checkpoint every checkpoint_period steps and at the
 * end. Errors: any of the above; a write to the run directory that fails (it was
 * checked by mt_trainer_check_outputs) is MT_ERR_RUNTIME. */
mt_status mt_trainer_run(mt_trainer *t, mt_train_callback cb, void *user);

#ifdef __cplusplus
}
#endif
#endif
