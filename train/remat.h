/* train/remat.h: the config's settings that shape a model's memory plan (remat
 * policy, packing, parameter host offload), applied in one place for the trainer
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

/* mt_model_set_dtype(model, cfg->dtype), mt_model_set_remat(model,
 * mt_memory_remat_policy(cfg)), mt_model_set_packing(model, cfg->packing,
 * cfg->packing_separator_id) and mt_model_set_param_offload(model,
 * cfg->parameter_memory_host_offload): the config's settings that shape the model's
 * plan. Errors: those of the five calls. */
mt_status mt_memory_apply_remat(const mt_train_config *cfg, mt_model *model);

#ifdef __cplusplus
}
#endif
#endif
