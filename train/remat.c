/* train/remat.c: the config's compute dtype, remat policy, packing and parameter
 * offload applied to a model (see remat.h). */
#include "train/remat.h"

mt_status mt_memory_remat_policy(const mt_train_config *cfg, mt_remat_policy *out) {
    mt_remat_action acts[MT_RT_COUNT];
    for (int i = 0; i < MT_RT_COUNT; i++) acts[i] = (mt_remat_action)cfg->remat_custom[i];
    return mt_remat_policy_resolve((mt_remat_policy_kind)cfg->remat_policy, acts, out);
}

mt_status mt_memory_apply_remat(const mt_train_config *cfg, mt_model *model) {
    mt_remat_policy p;
    MT_TRY(mt_memory_remat_policy(cfg, &p));
    MT_TRY(mt_model_set_dtype(model, cfg->dtype)); /* before the remat sizes are taken */
    MT_TRY(mt_model_set_remat(model, &p));
    MT_TRY(mt_model_set_packing(model, cfg->packing, (int32_t)cfg->packing_separator_id)); /* adds plan entries */
    return mt_model_set_param_offload(model, cfg->parameter_memory_host_offload);
}
