/* train/remat.h: the config's settings that shape a model's memory plan (the layout
 * keys: sequence parallelism, context strategy, packing, dtype, parameter host
 * offload; and the remat policy), taken in one place for the trainer
 * (train/trainer.c), the estimator (train/estimate.c) and the public API (train/api.c). */
#ifndef MT_TRAIN_REMAT_H
#define MT_TRAIN_REMAT_H

#include "models/model.h"
#include "models/remat.h"
#include "runtime/status.h"
#include "train/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The remat policy cfg asks for (remat_policy + the nine tensor keys).
 * Errors: MT_ERR_INVALID (decoder_layer_input not device). */
mt_status mt_memory_remat_policy(const mt_train_config *cfg, mt_remat_policy *out);

/* The model layout (models/model.h) of cfg for one process: sequence_parallel =
 * tensor_sequence_parallelism, context_ring = context_parallel_strategy, packing,
 * packing_separator = packing_separator_id, dtype, param_offload =
 * parameter_memory_host_offload; axis sizes 1 and no communicators, which a
 * multi-rank caller fills in from its mesh (train/trainer.c). */
void mt_memory_model_layout(const mt_train_config *cfg, mt_model_layout *out);

/* mt_model_set_remat(model, mt_memory_remat_policy(cfg)), before planning.
 * Errors: those of the two calls. */
mt_status mt_memory_apply_remat(const mt_train_config *cfg, mt_model *model);

#ifdef __cplusplus
}
#endif
#endif
