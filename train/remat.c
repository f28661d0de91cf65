/* train/remat.c: the config's settings that shape a model's plan (see remat.h): the
 * layout keys fixed at creation and the remat policy set before planning. */
#include "train/remat.h"

#include <string.h>

mt_status mt_memory_remat_policy(const mt_train_config *cfg, mt_remat_policy *out) {
    mt_remat_action acts[MT_RT_COUNT];
    for (int i = 0; i < MT_RT_COUNT; i++) acts[i] = (mt_remat_action)cfg->remat_custom[i];
    return mt_remat_policy_resolve((mt_remat_policy_kind)cfg->remat_policy, acts, out);
}

void mt_memory_model_layout(const mt_train_config *cfg, mt_model_layout *out) {
    memset(out, 0, sizeof *out); /* one process: the caller adds the mesh's groups */
    out->sequence_parallel = cfg->tensor_sequence_parallelism;
    out->context_ring = cfg->context_parallel_strategy;
    out->packing = cfg->packing;
    out->packing_separator = (int32_t)cfg->packing_separator_id;
    out->dtype = cfg->dtype;
    out->param_offload = cfg->parameter_memory_host_offload;
    out->weight_windows = cfg->param_window_unit;
    out->grad_window_chunks = cfg->grad_window_chunks;
    out->vocab_chunks = cfg->num_vocab_chunks;
}

mt_status mt_memory_apply_remat(const mt_train_config *cfg, mt_model *model) {
    mt_remat_policy p;
    MT_TRY(mt_memory_remat_policy(cfg, &p));
    return mt_model_set_remat(model, &p);
}
