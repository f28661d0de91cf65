/* train/trainer.c: building a trainer (backend, mesh, model, plan, data), the training
 * loop and checkpoint saving (see trainer.h; the step is train/step.c, the run
 * directory train/rundir.c, the train state train/train_state.c). */
#define _XOPEN_SOURCE 700 /* realpath */
#include "train/trainer_private.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/checkpoint.h"
#include "models/safetensors.h"
#include "parallel/mesh.h"
#include "parallel/zero1.h"
#include "runtime/dtype.h"
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/timer.h"
#include "train/data.h"
#include "train/remat.h"
#include "train/optimizer.h"

/* -------------------------------------------------------------- building ---- */

/* What the backend of cfg->backend cannot run, from its capabilities alone (before any
 * device is probed: kernels/backend.h mt_backend_kind_caps), each refusal naming the key:
 * dtype (compute) and weight_dtype (master weights: float32 on every backend),
 * grad_dtype, parameter/optimizer host offload. More than one rank is checked against
 * caps.multi_rank once the world size is known (setup_mesh). */
mt_status mt_trainer_check_caps(const mt_train_config *cfg, const mt_backend_caps *caps, const char *backend) {
    if (!mt_backend_has_dtype(caps, cfg->dtype))
        return mt_set_error(MT_ERR_UNSUPPORTED,
                            "dtype=%s is not supported on the %s backend (use dtype=float32 or "
                            "dtype=bfloat16)",
                            mt_dtype_name(cfg->dtype), backend);
    if (cfg->weight_dtype != MT_F32)
        return mt_set_error(MT_ERR_UNSUPPORTED,
                            "weight_dtype=%s is not supported: master weights are float32 "
                            "(use weight_dtype=float32)",
                            mt_dtype_name(cfg->weight_dtype));
    if (!((caps->grad_dtypes >> (unsigned)cfg->grad_dtype) & 1u))
        return mt_set_error(MT_ERR_UNSUPPORTED, "grad_dtype=%s is not supported on the %s backend",
                            mt_dtype_name(cfg->grad_dtype), backend);
    if ((cfg->parameter_memory_host_offload || cfg->optimizer_memory_host_offload) && !caps->host_offload)
        return mt_set_error(MT_ERR_UNSUPPORTED, "%s=true is not supported on the %s backend yet (the host pool's "
                            "parameter and optimizer paths run on backends with host memory only; use "
                            "backend=cpu or drop the key)",
                            cfg->parameter_memory_host_offload ? "parameter_memory_host_offload"
                                                               : "optimizer_memory_host_offload",
                            backend);
    return MT_OK;
}

static const char *kind_name(mt_backend_kind k) {
    return k == MT_BACKEND_CPU ? "cpu" : k == MT_BACKEND_CUDA ? "cuda" : "auto-selected";
}

mt_status mt_trainer_select_backend(const mt_train_config *cfg, mt_backend **be) {
    *be = NULL;
    /* From the config first, so a refusal names the key even where no device is visible. */
    if (cfg->backend != MT_BACKEND_AUTO) {
        const mt_backend_caps caps = mt_backend_kind_caps(cfg->backend);
        MT_TRY(mt_trainer_check_caps(cfg, &caps, kind_name(cfg->backend)));
    }
    /* one process per GPU: a rank of a multi-rank job takes its node-local device before
     * the backend makes its first CUDA call (a single process keeps the current device,
     * which a library user may have chosen) */
    if (mt_comm_world_size() > 1)
        MT_TRY(mt_backend_bind_device(cfg->backend, mt_comm_local_rank(), mt_comm_local_size()));
    MT_TRY(mt_backend_create(cfg->backend, be));
    const mt_status st = mt_trainer_check_caps(cfg, &(*be)->caps, (*be)->name);
    if (st != MT_OK) {
        mt_backend_free(*be);
        *be = NULL;
    }
    return st;
}

/* -------------------------------------------------------- parallel set-up ---- */

static void cfg_ici(const mt_train_config *cfg, int64_t ici[MT_MESH_AXES]) {
    ici[MT_AXIS_DATA] = cfg->ici_data_parallelism;
    ici[MT_AXIS_FSDP] = cfg->ici_fsdp_parallelism;
    ici[MT_AXIS_CONTEXT] = cfg->ici_context_parallelism;
    ici[MT_AXIS_TENSOR] = cfg->ici_tensor_parallelism;
}

mt_status mt_trainer_check_layout(const mt_train_config *cfg, const int dims[MT_MESH_AXES]) {
    const mt_layout_sizes ls = {cfg->model.num_query_heads, cfg->model.num_kv_heads, cfg->model.mlp_dim,
                                cfg->model.vocab_size, cfg->max_target_length, cfg->per_device_batch_size,
                                cfg->tensor_sequence_parallelism, mt_model_num_parameters(&cfg->model)};
    MT_TRY(mt_mesh_check_layout(dims, &ls));
    mt_model_layout lay; /* the layouts the compute dtype runs on (the model's rule) */
    mt_memory_model_layout(cfg, &lay);
    lay.tensor_size = dims[MT_AXIS_TENSOR];
    lay.context_size = dims[MT_AXIS_CONTEXT];
    lay.fsdp_size = dims[MT_AXIS_FSDP];
    MT_TRY(mt_model_check_dtype_layout(&lay));
    return mt_model_check_memory_layout(&cfg->model, &lay);
}

/* Axis sizes for planning without a process group: the world is the product of the
 * explicit sizes (a -1 axis gets 1). */
static mt_status plan_dims(const mt_train_config *cfg, int dims[MT_MESH_AXES]) {
    int64_t ici[MT_MESH_AXES];
    cfg_ici(cfg, ici);
    int64_t world = 1;
    for (int a = 0; a < MT_MESH_AXES; a++)
        if (ici[a] > 0) world *= ici[a];
    if (world > INT32_MAX) return mt_set_error(MT_ERR_INVALID, "mesh of %lld ranks is too large", (long long)world);
    MT_TRY(mt_mesh_resolve(ici, (int)world, dims));
    return mt_trainer_check_layout(cfg, dims);
}

/* The process group and the mesh sizes of the ici_* keys (checked before any compute),
 * and the refusal of more than one rank on a backend without caps->multi_rank (made
 * from the config's backend kind, before any device is probed). */
static mt_status setup_layout(const mt_train_config *cfg, const mt_backend_caps *caps, const char *backend,
                              int dims[MT_MESH_AXES]) {
    MT_TRY(mt_comm_world_init());
    mt_comm_set_timeout(cfg->collective_timeout_s);
    int64_t ici[MT_MESH_AXES];
    cfg_ici(cfg, ici);
    MT_TRY(mt_mesh_resolve(ici, mt_comm_world_size(), dims));
    MT_TRY(mt_trainer_check_layout(cfg, dims));
    if (mt_comm_world_size() > 1 && !caps->multi_rank)
        return mt_set_error(MT_ERR_UNSUPPORTED, "backend=%s with %d ranks: the trainer does not run multi-rank "
                            "on this backend; multi-rank runs use backend=cpu or backend=cuda", backend,
                            mt_comm_world_size());
    return MT_OK;
}

mt_status mt_trainer_check_config(const mt_train_config *cfg) {
    MT_TRY(mt_train_config_validate(cfg));
    const mt_backend_caps kind_caps = mt_backend_kind_caps(cfg->backend);
    int dims[MT_MESH_AXES];
    MT_TRY(setup_layout(cfg, &kind_caps, kind_name(cfg->backend), dims));
    if (cfg->backend != MT_BACKEND_AUTO) /* as mt_trainer_select_backend does first */
        MT_TRY(mt_trainer_check_caps(cfg, &kind_caps, kind_name(cfg->backend)));
    return MT_OK;
}

/* The mesh's communicators, once the backend exists (its device is bound): with a
 * device backend they carry NCCL where this build has it, and the other device buffers
 * are staged through host memory (parallel/comm.h). */
static mt_status setup_mesh(mt_trainer *t, const int dims[MT_MESH_AXES]) {
    const int device = t->be->caps.device_memory;
    if (device) mt_comm_set_device_backend(t->be);
    return mt_mesh_create_on(&t->mesh, dims, device && mt_comm_have_nccl() ? MT_COMM_DEVICE : MT_COMM_HOST);
}


/* The parameter table cut to the optimizer shard [lo, hi), offsets relative to lo. */
static mt_status build_shard_table(mt_trainer *t) {
    const int64_t lo = t->gs.lo, hi = t->gs.hi;
    t->sparams = malloc(sizeof(mt_param_info) * (size_t)(t->nparams > 0 ? t->nparams : 1));
    if (!t->sparams) return mt_set_error(MT_ERR_OOM, "trainer: out of memory");
    t->nsparams = 0;
    for (int i = 0; i < t->nparams; i++) {
        const mt_param_info *p = &t->params[i];
        int64_t a = p->offset > lo ? p->offset : lo, b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        if (b <= a) continue;
        mt_param_info q = *p;
        q.offset = a - lo;
        q.numel = b - a;
        t->sparams[t->nsparams++] = q;
    }
    return MT_OK;
}

/* The gradient sync's tensor group and the ranges of replicated gradients (of a model
 * created with its tensor group: mt_model_tp_grad_replicated). */
static mt_status setup_tensor(mt_model *model, mt_grad_sync *gs, mt_comm *comm, int size, int rank) {
    if (size <= 1) return MT_OK;
    const int np = mt_model_param_count(model);
    int64_t *off = malloc(sizeof(int64_t) * (size_t)np), *num = malloc(sizeof(int64_t) * (size_t)np);
    int n = 0;
    mt_status st = off && num ? MT_OK : mt_set_error(MT_ERR_OOM, "trainer: out of memory");
    for (int i = 0; st == MT_OK && i < np; i++) {
        if (!mt_model_tp_grad_replicated(model, i)) continue;
        off[n] = mt_model_param(model, i)->offset;
        num[n++] = mt_model_param(model, i)->numel;
    }
    if (st == MT_OK) st = mt_grad_sync_set_tensor(gs, comm, size, rank, n, off, num);
    free(off);
    free(num);
    return st;
}

/* Elements of the largest parameter tensor (the chunk of mt_grad_sync_set_path). */
static int64_t max_param_numel(const mt_model *model) {
    int64_t n = 1;
    for (int i = 0; i < mt_model_param_count(model); i++)
        if (mt_model_param(model, i)->numel > n) n = mt_model_param(model, i)->numel;
    return n;
}

/* Model + plan (finalised) + gradient-sync and optimizer entries for cfg with be, for
 * this rank of `mesh`, or (mesh NULL: only planning) for rank 0 of a mesh of dims.
 * full_grads = 1 keeps the model's full gradient buffer (no gradient windows: the
 * library API's sessions, which read named gradients from it); 0 lets the gradient
 * sync choose its path (parallel/zero1.h), installing the model's gradient sink. */
static mt_status build_plan(const mt_train_config *cfg, mt_backend *be, mt_model **model, mt_plan **plan,
                            mt_adamw *opt, mt_grad_sync *gs, const mt_mesh *mesh, const int dims[MT_MESH_AXES],
                            mt_plan *host, int full_grads) {
    *model = NULL;
    *plan = NULL;
    /* gradients add up over data x fsdp x context, reduced on that group ordered
     * fsdp-major (mesh->grad_fsdp: the optimizer shards nest inside the fsdp shards,
     * parallel/zero1.h mt_grad_sync_set_fsdp; the same order as mesh->grad without fsdp) */
    mt_comm *dp_comm = mesh ? mesh->grad_fsdp : NULL, *tp_comm = mesh ? mesh->axis[MT_AXIS_TENSOR] : NULL;
    mt_comm *cp_comm = mesh ? mesh->axis[MT_AXIS_CONTEXT] : NULL, *fsdp_comm = mesh ? mesh->axis[MT_AXIS_FSDP] : NULL;
    const int fsdp_n = dims[MT_AXIS_FSDP], fsdp_rank = mesh ? mesh->coord[MT_AXIS_FSDP] : 0;
    const int dp_n = dims[MT_AXIS_DATA] * dims[MT_AXIS_FSDP] * dims[MT_AXIS_CONTEXT], tp_n = dims[MT_AXIS_TENSOR];
    const int cp_n = dims[MT_AXIS_CONTEXT];
    const int dp_rank = mesh ? mt_comm_rank(mesh->grad_fsdp) : 0;
    const int tp_rank = mesh ? mesh->coord[MT_AXIS_TENSOR] : 0, cp_rank = mesh ? mesh->coord[MT_AXIS_CONTEXT] : 0;
    memset(gs, 0, sizeof *gs);
    mt_model_layout lay; /* the config's layout keys, then this rank's groups of the mesh */
    mt_memory_model_layout(cfg, &lay);
    lay.tensor_comm = tp_comm;
    lay.tensor_size = tp_n;
    lay.tensor_rank = tp_rank;
    lay.context_comm = cp_comm;
    lay.context_size = cp_n;
    lay.context_rank = cp_rank;
    lay.fsdp_comm = fsdp_comm;
    lay.fsdp_size = fsdp_n;
    lay.fsdp_rank = fsdp_rank;
    mt_status st = mt_model_create(model, &cfg->model, be, cfg->per_device_batch_size,
                                   cfg->max_target_length, cfg->num_vocab_tiling, &lay);
    if (st == MT_OK) st = mt_memory_apply_remat(cfg, *model);
    if (st == MT_OK) st = mt_plan_new(plan);
    if (st == MT_OK)
        st = mt_grad_sync_init(gs, dp_comm, dp_n, dp_rank, mt_model_numel(*model),
                               cfg->shard_optimizer_over_data || fsdp_n > 1, cfg->grad_dtype,
                               (mt_ga_reduce)cfg->gradient_accumulation_reduce, cfg->gradient_accumulation_steps);
    if (st == MT_OK) mt_grad_sync_set_backend(gs, be);
    if (st == MT_OK && fsdp_n > 1) { /* fsdp implies ZeRO-1, its shards nested in the fsdp shards */
        st = mt_grad_sync_set_fsdp(gs, mesh ? mesh->replica : NULL, fsdp_n, fsdp_rank);
        int64_t lo, hi;
        mt_model_fsdp_range(*model, &lo, &hi);
        if (st == MT_OK && (lo != gs->flo || hi != gs->fhi))
            st = mt_set_error(MT_ERR_RUNTIME, "fsdp shard [%lld, %lld) differs from the gradient sync's [%lld, %lld)",
                              (long long)lo, (long long)hi, (long long)gs->flo, (long long)gs->fhi);
    }
    if (st == MT_OK) st = setup_tensor(*model, gs, tp_comm, tp_n, tp_rank);
    /* the gradient path: windows whenever they save memory (parallel/zero1.h) */
    if (st == MT_OK && !full_grads) st = mt_grad_sync_set_path(gs, fsdp_n > 1, max_param_numel(*model));
    if (st == MT_OK && gs->path != MT_GRAD_FULL) st = mt_model_set_grad_sink(*model, mt_grad_sync_window, gs);
    if (st == MT_OK && gs->path != MT_GRAD_FULL) st = mt_model_set_grad_sink_shares(*model, mt_grad_sync_exact_shares(gs));
    if (st == MT_OK && cfg->overlap_grad_reduce && mt_grad_sync_overlaps(gs)) { /* overlap the next gradient's backward */
        st = mt_grad_sync_set_overlap(gs, 1);
        if (st == MT_OK) st = mt_model_set_grad_sink_wait(*model, mt_grad_sync_window_wait);
    }
    if (st == MT_OK) st = mt_model_add_to_plan(*model, *plan);
    if (st == MT_OK) st = mt_grad_sync_add_to_plan(gs, *plan, mt_model_phase_count(*model) - 1);
    if (st == MT_OK) {
        mt_adamw_init(opt, be, mt_grad_sync_opt_numel(gs), cfg->adam_b1, cfg->adam_b2, cfg->adam_eps,
                      cfg->adam_weight_decay);
        /* optimizer_memory_host_offload: the moments live in the host pool (host plan) */
        st = mt_adamw_add_to_plan(opt, cfg->optimizer_memory_host_offload ? host : *plan,
                                  mt_model_phase_count(*model), mt_model_param_count(*model));
    }
    if (st == MT_OK) st = mt_plan_finalize(*plan);
    if (st != MT_OK) {
        mt_plan_free(*plan);
        mt_model_free(*model);
        *plan = NULL;
        *model = NULL;
    }
    return st;
}

mt_status mt_trainer_plan(const mt_train_config *cfg, mt_plan **plan, mt_plan **host_plan, int64_t *num_params) {
    return mt_trainer_plan_ex(cfg, plan, host_plan, num_params, NULL, NULL);
}

mt_status mt_trainer_plan_ex(const mt_train_config *cfg, mt_plan **plan, mt_plan **host_plan, int64_t *num_params,
                             uint64_t *step_bytes, int64_t vocab_tiling[3]) {
    *plan = NULL;
    if (step_bytes) *step_bytes = 0;
    if (host_plan) *host_plan = NULL;
    /* Sizing does not need the device: check the chosen backend's capabilities, size with
     * the CPU backend object (the plan does not depend on the backend). */
    const mt_backend_caps caps = mt_backend_kind_caps(cfg->backend);
    MT_TRY(mt_trainer_check_caps(cfg, &caps, kind_name(cfg->backend)));
    mt_backend *be = mt_cpu_backend();
    /* The plan of data x fsdp rank 0 of the layout the ici_* keys give (-1 counts as 1). */
    int dims[MT_MESH_AXES];
    MT_TRY(plan_dims(cfg, dims));
    mt_model *model;
    mt_adamw opt;
    mt_grad_sync gs;
    mt_plan *host = NULL;
    MT_TRY(mt_plan_new(&host));
    mt_status st = build_plan(cfg, be, &model, plan, &opt, &gs, NULL, dims, host, 0);
    if (st == MT_OK && step_bytes) *step_bytes = mtt_step_bytes_formula(model, &gs, cfg->gradient_accumulation_steps);
    mt_grad_sync_free(&gs);
    if (st == MT_OK && host_plan) {
        st = mt_model_add_to_host_plan(model, host);
        if (st == MT_OK) st = mt_plan_finalize(host);
    }
    if (st == MT_OK && num_params) *num_params = mt_model_numel(model);
    if (st == MT_OK && vocab_tiling) {
        mt_model_vocab_tiling(model, &vocab_tiling[0], &vocab_tiling[1]);
        vocab_tiling[2] = mt_model_per_layer_input_chunks(model);
    }
    if (model) mt_model_free(model);
    if (st == MT_OK && host_plan) {
        *host_plan = host;
        host = NULL;
    }
    mt_plan_free(host);
    if (st != MT_OK) {
        mt_plan_free(*plan);
        *plan = NULL;
    }
    return st;
}

static mt_status open_loader(mt_data_loader **out, const mt_train_config *cfg, const char *split, int rank,
                             int world) {
    mt_data_options opt;
    mt_trainer_data_options(cfg, split, &opt);
    if (!cfg->dataset_path[0] && !opt.files[0])
        return mt_set_error(MT_ERR_INVALID, "key 'dataset_path' is empty: training needs a directory of "
                            "train_*.bin (and val_*.bin) shards, or %s", opt.files_key);
    MT_TRY(mt_data_open_ex(out, cfg->dataset_path, split, &opt, cfg->per_device_batch_size, cfg->max_target_length,
                           rank, world));
    int64_t mx = mt_data_max_token(*out);
    if (mx >= cfg->model.vocab_size)
        return mt_set_error(MT_ERR_INVALID, "dataset '%s' (%s split) holds token id %" PRId64
                            " but the model's vocab_size is %" PRId64,
                            opt.files[0] ? opt.files : cfg->dataset_path, split, mx, cfg->model.vocab_size);
    return MT_OK;
}

/* The host pool of offloaded activations: its own plan and arena (host memory, apart
 * from the device arena), bound to the model. Parameter and optimizer host offload are
 * planned (train/estimate.h) but not run yet. */
static mt_status setup_host_pool(mt_trainer *t) {
    MT_TRY(mt_model_add_to_host_plan(t->model, t->host_plan));
    MT_TRY(mt_plan_finalize(t->host_plan));
    MT_TRY(mt_backend_host_arena_create(t->be, &t->host_arena, t->host_plan));
    t->have_host_arena = 1;
    return mt_model_bind_host(t->model, &t->host_arena, t->host_plan);
}

/* mt_checkpoint_load_model; under fsdp through a full host buffer of which this rank
 * keeps its shard. */
static mt_status load_model_params(mt_trainer *t, const char *dir) {
    if (!t->gs.params_sharded) return mt_checkpoint_load_model(dir, t->model);
    float *full = malloc(sizeof(float) * (size_t)t->numel);
    if (!full) return mt_set_error(MT_ERR_OOM, "fsdp: cannot allocate %lld floats", (long long)t->numel);
    mt_status st = mt_checkpoint_load_host(dir, t->model, full);
    if (st == MT_OK)
        st = t->be->ops->copy_to_device(t->be, mt_model_params(t->model), full + t->gs.flo,
                                        (size_t)(t->gs.fhi - t->gs.flo) * sizeof(float));
    free(full);
    return st;
}

size_t mt_trainer_host_bytes(const mt_trainer *t) { return t->have_host_arena ? t->host_arena.bytes : 0; }
size_t mt_trainer_device_bytes(const mt_trainer *t) { return t->have_arena ? t->arena.bytes : 0; }

mt_status mt_trainer_create(mt_trainer **out, const mt_train_config *cfg) {
    return mt_trainer_create_ex(out, cfg, 0);
}

mt_status mt_trainer_create_ex(mt_trainer **out, const mt_train_config *cfg, int full_grads) {
    *out = NULL;
    MT_TRY(mt_train_config_validate(cfg));
    mt_trainer *t = calloc(1, sizeof *t);
    if (!t) return mt_set_error(MT_ERR_OOM, "trainer: out of memory");
    t->cfg = *cfg;
    const mt_backend_caps kind_caps = mt_backend_kind_caps(cfg->backend);
    int dims[MT_MESH_AXES];
    mt_status st = setup_layout(cfg, &kind_caps, kind_name(cfg->backend), dims);
    if (st == MT_OK) st = mt_trainer_select_backend(cfg, &t->be);
    if (st == MT_OK) st = setup_mesh(t, dims);
    if (st == MT_OK) st = mt_plan_new(&t->host_plan);
    if (st == MT_OK)
        st = build_plan(cfg, t->be, &t->model, &t->plan, &t->opt, &t->gs, t->mesh, t->mesh->dims, t->host_plan,
                        full_grads);
    if (st == MT_OK) st = open_loader(&t->train, cfg, "train", mt_trainer_dp_rank(t->mesh), mt_trainer_dp_size(t->mesh));
    if (st == MT_OK && (cfg->eval_interval > 0 || cfg->eval_files[0]))
        st = open_loader(&t->val, cfg, "val", mt_trainer_dp_rank(t->mesh), mt_trainer_dp_size(t->mesh));
    if (st == MT_OK && cfg->eval_interval <= 0) { /* eval_files checked (bad input even when unused), then closed */
        mt_data_close(t->val);
        t->val = NULL;
    }
    if (st == MT_OK && t->val && t->mesh->rank == 0 && cfg->eval_steps > mt_data_windows_per_epoch(t->val))
        MT_LOG_I("eval_steps=%" PRId64 " is more than the validation split holds: each evaluation reads its %" PRId64
                 " window(s) once", cfg->eval_steps, mt_data_windows_per_epoch(t->val));
    if (st == MT_OK) {
        st = mt_backend_arena_create(t->be, &t->arena, t->plan);
        t->have_arena = st == MT_OK;
    }
    if (st == MT_OK) st = mt_model_bind(t->model, &t->arena, t->plan);
    if (st == MT_OK) st = setup_host_pool(t);
    if (st == MT_OK)
        st = cfg->optimizer_memory_host_offload ? mt_adamw_bind(&t->opt, &t->host_arena, t->host_plan)
                                                : mt_adamw_bind(&t->opt, &t->arena, t->plan);
    if (st == MT_OK) st = mt_grad_sync_bind(&t->gs, &t->arena, t->plan);
    if (st == MT_OK) {
        t->nparams = mt_model_param_count(t->model);
        t->numel = mt_model_numel(t->model);
        t->params = malloc(sizeof(mt_param_info) * (size_t)(t->nparams > 0 ? t->nparams : 1));
        const size_t rows = (size_t)(cfg->per_device_batch_size * cfg->max_target_length);
        t->tokens = malloc(rows * sizeof(int32_t));
        t->labels = malloc(rows * sizeof(int32_t));
        if (!t->params || !t->tokens || !t->labels) st = mt_set_error(MT_ERR_OOM, "trainer: out of memory");
        for (int i = 0; st == MT_OK && i < t->nparams; i++) t->params[i] = *mt_model_param(t->model, i);
    }
    if (st == MT_OK) st = build_shard_table(t);
    if (st == MT_OK) {
        if (cfg->load_checkpoint[0]) {
            st = mt_trainer_check_checkpoint_dir(cfg, "load_checkpoint", cfg->load_checkpoint, 1);
            if (st == MT_OK) st = mt_rundir_check_identity(t, cfg->load_checkpoint);
            if (st == MT_OK) st = load_model_params(t, cfg->load_checkpoint);
            if (st == MT_OK) st = mt_train_state_load(t, cfg->load_checkpoint);
            t->resumed = 1;
        } else if (cfg->load_parameters_path[0]) {
            st = mt_trainer_check_checkpoint_dir(cfg, "load_parameters_path", cfg->load_parameters_path, 2);
            if (st == MT_OK) st = load_model_params(t, cfg->load_parameters_path);
        } else {
            st = mt_model_init_params(t->model, (uint64_t)cfg->seed);
        }
    }
    if (st == MT_OK) {
        t->sched = mt_lr_schedule_make(cfg->learning_rate, cfg->warmup_steps_fraction,
                                       cfg->cosine_learning_rate_final_fraction, cfg->steps);
        t->flops_per_token = mt_flops_per_token(&cfg->model, cfg->max_target_length);
        /* the step's token count is the job's (summed over data x fsdp x context), so its
         * FLOPs are set against the peak of every device of the job */
        t->peak_flops = t->be->caps.peak_flops * (double)t->mesh->world;
        char tmp[MT_PATH];
        if (!mt_trainer_path_join(tmp, sizeof tmp, cfg->base_output_directory, cfg->run_name))
            st = mt_set_error(MT_ERR_INVALID, "base_output_directory + run_name is too long");
        else
            memcpy(t->run_dir, tmp, sizeof t->run_dir);
    }
    if (st != MT_OK) {
        mt_trainer_free(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

void mt_trainer_free(mt_trainer *t) {
    if (!t) return;
    if (t->have_lock) close(t->lock_fd); /* releases the run directory's lock */
    mt_data_close(t->train);
    mt_data_close(t->val);
    mt_model_free(t->model);
    if (t->have_arena) mt_arena_destroy(&t->arena);
    mt_plan_free(t->plan);
    if (t->have_host_arena) mt_arena_destroy(&t->host_arena);
    mt_plan_free(t->host_plan);
    free(t->params);
    free(t->tokens);
    free(t->labels);
    free(t->sparams);
    mt_grad_sync_free(&t->gs);
    mt_mesh_free(t->mesh);
    if (t->be && t->be->caps.device_memory) mt_comm_set_device_backend(NULL);
    mt_backend_free(t->be); /* after every buffer it allocated (the arena) */
    free(t);
}

int64_t mt_trainer_step_count(const mt_trainer *t) { return t->step; }
mt_model *mt_trainer_model(mt_trainer *t) { return t->model; }
const mt_train_config *mt_trainer_config(const mt_trainer *t) { return &t->cfg; }
const mt_plan *mt_trainer_get_plan(const mt_trainer *t) { return t->plan; }

int mt_trainer_world_rank(const mt_trainer *t) { return t->mesh->rank; }

static mt_status save_checkpoint(mt_trainer *t, const float *full, char *out_path, size_t out_size);

mt_status mt_trainer_save_checkpoint(mt_trainer *t, char *out_path, size_t out_size) {
    mt_status st;
    if (t->gs.params_sharded) { /* fsdp: every rank joins the gather of the shards, rank 0 writes them */
        float *full = malloc(sizeof(float) * (size_t)t->numel);
        if (!full) return mt_set_error(MT_ERR_OOM, "fsdp: cannot allocate %lld floats", (long long)t->numel);
        st = mt_trainer_gather_params(t, full);
        if (st == MT_OK) st = save_checkpoint(t, full, out_path, out_size);
        free(full);
    } else {
        st = save_checkpoint(t, NULL, out_path, out_size);
    }
    /* Saving happens while a run is under way: a directory that cannot be made,
     * cleared or renamed is a write failure like a full disk (exit 1), not bad input. */
    if (st == MT_ERR_IO) st = mt_set_error(MT_ERR_RUNTIME, "%s", mt_last_error());
    return st;
}

mt_status mt_trainer_gather_params(mt_trainer *t, float *host) {
    if (t->gs.params_sharded) /* each rank's optimizer sub-shard of its up-to-date fsdp shard */
        return mt_grad_sync_gather(&t->gs, mt_model_params(t->model) + (t->gs.lo - t->gs.flo), host);
    MT_TRY(t->be->ops->copy_to_host(t->be, host, mt_model_params(t->model), (size_t)t->numel * sizeof(float)));
    return MT_OK;
}

/* Write checkpoints/step_N (rank 0; the others join the train-state gather and wait):
 * the model's parameters from the device, or from full[numel] (host) when not NULL. */
static mt_status save_checkpoint(mt_trainer *t, const float *full, char *out_path, size_t out_size) {
    char ckdir[MT_PATH], final[MT_PATH], tmp[MT_PATH + 8], old[MT_PATH + 8], name[48];
    if (t->mesh->rank != 0) { /* joins rank 0's gather of the optimizer shards; writes nothing */
        if (out_path && out_size) out_path[0] = '\0';
        MT_TRY(mt_train_state_write(t, NULL, NULL));
        return mt_comm_barrier_wait(t->mesh->all, 3600.0); /* while rank 0 writes */
    }
    snprintf(name, sizeof name, "step_%" PRId64, t->step);
    if (!mt_trainer_path_join(ckdir, sizeof ckdir, t->run_dir, "checkpoints") || !mt_trainer_path_join(final, sizeof final, ckdir, name))
        return mt_set_error(MT_ERR_IO, "checkpoint path too long under '%s'", t->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    MT_TRY(mt_file_mkdir_p(ckdir));
    MT_TRY(mt_rundir_remove_flat_dir(tmp));
    MT_TRY(mt_file_mkdir_p(tmp));
    /* both files record the step, the run's history and this save (see "checkpoint identity") */
    char ckid[MT_ID_LEN];
    if (!t->run_id[0]) mt_rundir_new_id(t->run_id); /* a save outside mt_trainer_run (library sessions) */
    mt_rundir_new_id(ckid);
    const char *meta[] = {"meshtrain_step", name + 5, "meshtrain_run_id", t->run_id, "meshtrain_checkpoint_id", ckid,
                          NULL};
    mt_status ws = full ? mt_checkpoint_save_host(tmp, t->model, full, MT_F32, meta)
                        : mt_checkpoint_save_model_meta(tmp, t->model, MT_F32, meta);
    if (ws == MT_OK) ws = mt_train_state_write(t, tmp, ckid);
    if (ws != MT_OK) {
        /* Writing into the directory just made failed (disk full, I/O error, short
         * write): a runtime failure (exit 1), and no half checkpoint is left. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mt_last_error());
        (void)mt_rundir_remove_flat_dir(tmp);
        return mt_set_error(ws == MT_ERR_OOM ? MT_ERR_OOM : MT_ERR_RUNTIME,
                            "writing checkpoint '%s' failed (the partial '%s' was removed): %s", final, tmp, msg);
    }
    /* Swap into place: an existing step_N moves aside first, so step_N is always
     * either the old or the new complete checkpoint. */
    struct stat sb;
    int had_old = stat(final, &sb) == 0;
    if (had_old) {
        MT_TRY(mt_rundir_remove_flat_dir(old));
        if (rename(final, old) != 0)
            return mt_set_error(MT_ERR_IO, "cannot move '%s' aside: %s", final, strerror(errno));
    }
    if (rename(tmp, final) != 0) return mt_set_error(MT_ERR_IO, "cannot rename '%s': %s", tmp, strerror(errno));
    if (had_old) MT_TRY(mt_rundir_remove_flat_dir(old));
    if (out_path && out_size) snprintf(out_path, out_size, "%s", final);
    return mt_comm_barrier_wait(t->mesh->all, 3600.0); /* the other ranks wait for the files */
}

mt_status mt_trainer_run(mt_trainer *t, mt_train_callback cb, void *user) {
    /* Under mpirun only world rank 0 writes the run directory and calls cb. */
    const int lead = t->mesh->rank == 0;
    mt_metrics_writer *mw = NULL;
    if (lead) {
        char mpath[MT_PATH], ck[MT_PATH];
        if (!mt_trainer_path_join(mpath, sizeof mpath, t->run_dir, "metrics.jsonl") ||
            !mt_trainer_path_join(ck, sizeof ck, t->run_dir, "checkpoints"))
            return mt_set_error(MT_ERR_IO, "path too long: '%s'", t->run_dir);
        /* The history this run's checkpoints carry (see "checkpoint identity"):
         * load_checkpoint's when resuming in place (the run directory holds its
         * history's checkpoints: mt_trainer_check_outputs), else a new one. */
        if (t->resumed && t->resume_run_id[0] && mt_rundir_latest_checkpoint(ck) >= 0)
            memcpy(t->run_id, t->resume_run_id, sizeof t->run_id);
        else
            mt_rundir_new_id(t->run_id);
        mt_status ws = mt_file_mkdir_p(t->run_dir);
        /* resumed: keep the complete rows up to the resumed step (atomic rewrite) */
        if (ws == MT_OK) ws = t->resumed ? mt_metrics_open_resume(&mw, mpath, t->step) : mt_metrics_open(&mw, mpath, 0);
        /* the outputs were checked (mt_trainer_check_outputs): a write failing now is a
         * runtime failure (exit 1), as a full disk is */
        if (ws == MT_ERR_IO) ws = mt_set_error(MT_ERR_RUNTIME, "%s", mt_last_error());
        MT_TRY(ws);
    }
    mt_status st = MT_OK;
    const mt_train_config *c = &t->cfg;
    if (t->step == 0 && t->val) {
        mt_step_metrics m;
        memset(&m, 0, sizeof m);
        m.step = 0;
        m.total_steps = c->steps;
        m.has_eval = 1;
        st = mt_trainer_evaluate(t, &m.val_loss, &m.val_tokens);
        if (st == MT_OK && lead) st = mt_metrics_write(mw, &m);
        if (st == MT_OK && cb && lead) cb(&m, user);
    }
    while (st == MT_OK && t->step < c->steps) {
        mt_step_metrics m;
        st = mt_trainer_step(t, &m);
        if (st != MT_OK) break;
        const int last = t->step == c->steps;
        if (t->val && (t->step % c->eval_interval == 0 || last)) {
            m.has_eval = 1;
            st = mt_trainer_evaluate(t, &m.val_loss, &m.val_tokens);
            if (st != MT_OK) break;
        }
        if (lead) st = mt_metrics_write(mw, &m);
        if (st != MT_OK) break;
        if (cb && lead) cb(&m, user);
        if ((c->checkpoint_period > 0 && t->step % c->checkpoint_period == 0) || last) {
            char where[MT_PATH];
            st = mt_trainer_save_checkpoint(t, where, sizeof where);
            if (st == MT_OK && lead) MT_LOG_I("saved checkpoint %s", where);
        }
    }
    if (mw) mt_metrics_close(mw);
    return st;
}
