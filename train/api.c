/* train/api.c: the public API (include/meshtrain.h) over train/trainer.h, models/ and
 * kernels/tiled_loss.h.
 *
 * A session with data owns an mt_trainer (the library's step, evaluation and
 * checkpoints) and uses its model; a session without data builds the model, its plan
 * and arena itself (no optimizer state). Everything else goes through the model:
 * tensors by name through the parameter table, saved activations through the plan's
 * entry names (an arena pointer is base + entry offset, runtime/plan.h). */
#include "runtime/status.h" /* first: meshtrain.h then skips its copy of mt_status */

#include "meshtrain.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tiled_loss.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "parallel/comm.h"
#include "runtime/log.h"
#include "runtime/plan.h"
#include "train/config.h"
#include "train/data.h"
#include "train/estimate.h"
#include "train/remat.h"
#include "train/trainer.h"

_Static_assert(MT_MEMORY_CATEGORIES == MT_MEM_CATEGORY_COUNT, "memory categories differ from runtime/plan.h");
_Static_assert(MT_TENSOR_NAME_MAX == MT_PARAM_NAME_MAX, "tensor name size differs from models/model.h");

#define API_PATH 2048

struct mt_session {
    mt_train_config cfg;
    mt_trainer *trainer;     /* with data; owns model, plan and arena */
    /* without data: */
    mt_model *own_model;
    mt_plan *own_plan;
    mt_arena arena;
    int have_arena;
    mt_plan *host_plan;      /* offloaded activations (remat policy), possibly empty */
    mt_arena host_arena;
    int have_host_arena;
    /* either way: */
    mt_model *model;
    const mt_plan *plan;
    mt_backend *be;
    mt_data_loader *reader;  /* mt_session_next_batch, opened on first use */
    int fwd_fresh;           /* saved activations hold the last forward */
};

/* -------------------------------------------------------------- misc ---- */

const char *mt_version(void) {
#define MT_STR2(x) #x
#define MT_STR(x) MT_STR2(x)
    return MT_STR(MESHTRAIN_VERSION_MAJOR) "." MT_STR(MESHTRAIN_VERSION_MINOR) "." MT_STR(MESHTRAIN_VERSION_PATCH);
}

mt_status mt_set_verbosity(int level) {
    if (level < 0 || level > 2) return mt_set_error(MT_ERR_INVALID, "mt_set_verbosity: level %d not in [0, 2]", level);
    mt_log_set_sink(NULL, NULL);
    mt_log_set_level(level == 0 ? MT_LOG_OFF : level == 1 ? MT_LOG_INFO : MT_LOG_DEBUG);
    return MT_OK;
}

/* --------------------------------------------------------- processes ---- */

mt_status mt_distributed_init(void *mpi_comm, int *rank, int *world_size) {
    MT_TRY(mt_comm_world_init_from(mpi_comm));
    if (rank) *rank = mt_comm_world_rank();
    if (world_size) *world_size = mt_comm_world_size();
    return MT_OK;
}

/* ----------------------------------------------------------- creation ---- */

/* Apply "key=value" strings to cfg (no validation). */
static mt_status apply_overrides(mt_train_config *cfg, int n, const char *const *ov) {
    if (n < 0 || (n > 0 && !ov)) return mt_set_error(MT_ERR_INVALID, "overrides: bad count %d or NULL list", n);
    for (int i = 0; i < n; i++) {
        const char *eq = ov[i] ? strchr(ov[i], '=') : NULL;
        if (!eq || eq == ov[i])
            return mt_set_error(MT_ERR_INVALID, "override '%s' is not key=value", ov[i] ? ov[i] : "(null)");
        char key[128];
        size_t kl = (size_t)(eq - ov[i]);
        if (kl >= sizeof key) return mt_set_error(MT_ERR_INVALID, "override '%s': key too long", ov[i]);
        memcpy(key, ov[i], kl);
        key[kl] = '\0';
        MT_TRY(mt_train_config_set(cfg, key, eq + 1, "override"));
    }
    return MT_OK;
}

/* The model, plan and arena of a session without data (no optimizer), with the
 * config's remat policy and the host pool of offloaded activations, as the trainer
 * builds them (train/trainer.c). */
static mt_status build_standalone(mt_session *s) {
    const mt_train_config *c = &s->cfg;
    MT_TRY(mt_trainer_select_backend(c, &s->be));
    mt_model_layout lay; /* one process */
    mt_memory_model_layout(c, &lay);
    MT_TRY(mt_model_create(&s->own_model, &c->model, s->be, c->per_device_batch_size, c->max_target_length,
                           c->num_vocab_tiling, &lay));
    MT_TRY(mt_memory_apply_remat(c, s->own_model));
    mt_model_set_compute_rounding(s->own_model, (uint64_t)c->seed, 0);
    MT_TRY(mt_plan_new(&s->own_plan));
    MT_TRY(mt_model_add_to_plan(s->own_model, s->own_plan));
    MT_TRY(mt_plan_finalize(s->own_plan));
    MT_TRY(mt_backend_arena_create(s->be, &s->arena, s->own_plan));
    s->have_arena = 1;
    MT_TRY(mt_model_bind(s->own_model, &s->arena, s->own_plan));
    MT_TRY(mt_plan_new(&s->host_plan));
    MT_TRY(mt_model_add_to_host_plan(s->own_model, s->host_plan));
    MT_TRY(mt_plan_finalize(s->host_plan));
    if (mt_plan_count(s->host_plan) > 0) {
        MT_TRY(mt_backend_host_arena_create(s->be, &s->host_arena, s->host_plan));
        s->have_host_arena = 1;
        MT_TRY(mt_model_bind_host(s->own_model, &s->host_arena, s->host_plan));
    }
    s->model = s->own_model;
    s->plan = s->own_plan;
    if (c->load_checkpoint[0]) return mt_checkpoint_load_model(c->load_checkpoint, s->model);
    if (c->load_parameters_path[0]) return mt_checkpoint_load_model(c->load_parameters_path, s->model);
    return mt_model_init_params(s->model, (uint64_t)c->seed);
}

/* Build a session from a validated-or-not cfg; frees everything on failure. */
static mt_status finish_create(mt_session **out, mt_session *s) {
    mt_status st = mt_distributed_init(NULL, NULL, NULL);
    if (st == MT_OK) st = mt_train_config_validate(&s->cfg);
    if (st == MT_OK) {
        if (s->cfg.dataset_path[0] || s->cfg.train_files[0]) {
            st = mt_trainer_create_ex(&s->trainer, &s->cfg, 1); /* named gradients live in the full buffer */
            if (st == MT_OK) {
                s->model = mt_trainer_model(s->trainer);
                s->plan = mt_trainer_get_plan(s->trainer);
                s->be = mt_model_backend(s->model);
            }
        } else if (mt_comm_world_size() > 1) {
            st = mt_set_error(MT_ERR_INVALID,
                              "a session without data (dataset_path empty) is single-process, but "
                              "this process is rank %d of %d; give dataset_path",
                              mt_comm_world_rank(), mt_comm_world_size());
        } else {
            st = build_standalone(s);
        }
    }
    if (st != MT_OK) {
        mt_session_free(s);
        return st;
    }
    *out = s;
    return MT_OK;
}

mt_status mt_session_create(mt_session **out, const char *config_path, int n_overrides,
                            const char *const *overrides) {
    if (!out) return mt_set_error(MT_ERR_INVALID, "mt_session_create: out is NULL");
    *out = NULL;
    if (n_overrides < 0 || (n_overrides > 0 && !overrides))
        return mt_set_error(MT_ERR_INVALID, "mt_session_create: bad override count %d or NULL list", n_overrides);
    mt_session *s = calloc(1, sizeof *s);
    if (!s) return mt_set_error(MT_ERR_OOM, "mt_session_create: out of memory");
    for (int i = 0; i < n_overrides; i++)
        if (!overrides[i]) {
            free(s);
            return mt_set_error(MT_ERR_INVALID, "mt_session_create: overrides[%d] is NULL", i);
        }
    mt_status st = mt_train_config_load(&s->cfg, config_path, n_overrides, overrides);
    if (st != MT_OK) {
        free(s);
        return st;
    }
    return finish_create(out, s);
}

mt_status mt_session_create_hf(mt_session **out, const char *hf_dir, int n_overrides,
                               const char *const *overrides) {
    if (!out) return mt_set_error(MT_ERR_INVALID, "mt_session_create_hf: out is NULL");
    *out = NULL;
    if (!hf_dir || !*hf_dir) return mt_set_error(MT_ERR_INVALID, "mt_session_create_hf: hf_dir is NULL or empty");
    char path[API_PATH];
    if (snprintf(path, sizeof path, "%s/config.json", hf_dir) >= (int)sizeof path)
        return mt_set_error(MT_ERR_INVALID, "mt_session_create_hf: path too long: '%s'", hf_dir);
    mt_model_config mc;
    MT_TRY(mt_hf_config_read(path, &mc));
    mt_session *s = calloc(1, sizeof *s);
    if (!s) return mt_set_error(MT_ERR_OOM, "mt_session_create_hf: out of memory");
    mt_train_config_defaults(&s->cfg);
    s->cfg.model = mc;
    if (!s->cfg.model.model_name[0]) snprintf(s->cfg.model.model_name, sizeof s->cfg.model.model_name, "hf");
    s->cfg.dataset_path[0] = '\0';
    mt_status st = apply_overrides(&s->cfg, n_overrides, overrides);
    if (st == MT_OK && !s->cfg.load_checkpoint[0] && !s->cfg.load_parameters_path[0]) {
        if (strlen(hf_dir) >= sizeof s->cfg.load_parameters_path)
            st = mt_set_error(MT_ERR_INVALID, "mt_session_create_hf: hf_dir too long");
        else
            snprintf(s->cfg.load_parameters_path, sizeof s->cfg.load_parameters_path, "%s", hf_dir);
    }
    if (st != MT_OK) {
        free(s);
        return st;
    }
    return finish_create(out, s);
}

void mt_session_free(mt_session *s) {
    if (!s) return;
    mt_data_close(s->reader);
    mt_trainer_free(s->trainer);
    mt_model_free(s->own_model);
    if (s->have_arena) mt_arena_destroy(&s->arena);
    mt_plan_free(s->own_plan);
    if (s->have_host_arena) mt_arena_destroy(&s->host_arena);
    mt_plan_free(s->host_plan);
    if (!s->trainer) mt_backend_free(s->be); /* a standalone session's own; else the trainer's */
    free(s);
}

#define NEED(cond, fn)                                                          \
    do {                                                                        \
        if (!(cond)) return mt_set_error(MT_ERR_INVALID, "%s: NULL argument", fn); \
    } while (0)

mt_status mt_session_get_info(const mt_session *s, mt_session_info *info) {
    NEED(s && info, "mt_session_get_info");
    const mt_model_config *c = mt_model_get_config(s->model);
    memset(info, 0, sizeof *info);
    info->batch = s->cfg.per_device_batch_size;
    info->seq = s->cfg.max_target_length;
    info->rows = info->batch * info->seq;
    info->emb_dim = c->emb_dim;
    info->vocab_size = c->vocab_size;
    info->num_layers = c->num_decoder_layers;
    info->num_params = mt_model_numel(s->model);
    info->num_tensors = mt_model_param_count(s->model);
    info->step = s->trainer ? mt_trainer_step_count(s->trainer) : 0;
    info->has_data = s->trainer != NULL;
    return MT_OK;
}

mt_status mt_session_config_get(const mt_session *s, const char *key, char *buf, size_t n) {
    NEED(s && key && buf, "mt_session_config_get");
    const mt_config_key *k = mt_config_key_find(key);
    if (!k) return mt_set_error(MT_ERR_INVALID, "mt_session_config_get: unknown key '%s'", key);
    char tmp[API_PATH + 64];
    mt_train_config_format(&s->cfg, k, tmp, sizeof tmp);
    size_t len = strlen(tmp);
    if (len + 1 > n)
        return mt_set_error(MT_ERR_INVALID, "mt_session_config_get: '%s' needs %zu bytes, buffer has %zu", key,
                            len + 1, n);
    memcpy(buf, tmp, len + 1);
    return MT_OK;
}

/* ------------------------------------------------------ library step ---- */

static mt_status need_data(const mt_session *s, const char *fn) {
    if (!s) return mt_set_error(MT_ERR_INVALID, "%s: session is NULL", fn);
    if (!s->trainer)
        return mt_set_error(MT_ERR_INVALID, "%s: the session has no data (dataset_path is empty)", fn);
    return MT_OK;
}

mt_status mt_session_step(mt_session *s, mt_step_result *out) {
    MT_TRY(need_data(s, "mt_session_step"));
    s->fwd_fresh = 0;
    mt_step_metrics m;
    MT_TRY(mt_trainer_step(s->trainer, &m));
    if (out) {
        out->step = m.step;
        out->loss = m.loss;
        out->lr = m.lr;
        out->grad_norm = m.grad_norm;
        out->tokens = m.tokens;
        out->tokens_per_s = m.tokens_per_s;
        out->step_ms = m.step_ms;
        out->mfu = m.mfu;
        uint64_t measured = 0, formula = 0;
        mt_trainer_step_bytes(s->trainer, &measured, &formula);
        out->bytes_communicated = measured;
    }
    return MT_OK;
}

mt_status mt_session_evaluate(mt_session *s, double *val_loss, int64_t *val_tokens) {
    MT_TRY(need_data(s, "mt_session_evaluate"));
    NEED(val_loss && val_tokens, "mt_session_evaluate");
    s->fwd_fresh = 0;
    return mt_trainer_evaluate(s->trainer, val_loss, val_tokens);
}

mt_status mt_session_train(mt_session *s) {
    MT_TRY(need_data(s, "mt_session_train"));
    s->fwd_fresh = 0;
    return mt_trainer_run(s->trainer, NULL, NULL);
}

/* ------------------------------------------------------- custom step ---- */

mt_status mt_session_next_batch(mt_session *s, int32_t *tokens, int32_t *labels) {
    MT_TRY(need_data(s, "mt_session_next_batch"));
    NEED(tokens && labels, "mt_session_next_batch");
    if (!s->reader) {
        mt_data_options opt;
        mt_trainer_data_options(&s->cfg, "train", &opt);
        MT_TRY(mt_data_open_ex(&s->reader, s->cfg.dataset_path, "train", &opt, s->cfg.per_device_batch_size,
                               s->cfg.max_target_length, 0, 1));
    }
    return mt_data_next(s->reader, tokens, labels);
}

mt_status mt_session_forward(mt_session *s, const int32_t *tokens, float *hidden) {
    NEED(s && tokens && hidden, "mt_session_forward");
    s->fwd_fresh = 0;
    MT_TRY(mt_model_hidden(s->model, tokens, hidden));
    s->fwd_fresh = 1;
    return MT_OK;
}

mt_status mt_session_loss(mt_session *s, const int32_t *tokens, const int32_t *labels, double *loss_sum,
                          int64_t *count) {
    NEED(s && tokens && labels && loss_sum && count, "mt_session_loss");
    s->fwd_fresh = 0;
    MT_TRY(mt_model_loss(s->model, tokens, labels, loss_sum, count));
    s->fwd_fresh = 1;
    return MT_OK;
}

mt_status mt_session_zero_grads(mt_session *s) {
    NEED(s, "mt_session_zero_grads");
    MT_TRY(s->be->ops->zero(s->be, mt_model_grads(s->model), (size_t)mt_model_numel(s->model) * sizeof(float)));
    return MT_OK;
}

mt_status mt_session_forward_backward(mt_session *s, const int32_t *tokens, const int32_t *labels, float dscale,
                                      double *loss_sum, int64_t *count) {
    NEED(s && tokens && labels, "mt_session_forward_backward");
    if (!isfinite(dscale))
        return mt_set_error(MT_ERR_INVALID, "mt_session_forward_backward: dscale = %g must be finite", (double)dscale);
    s->fwd_fresh = 0;
    double ls = 0.0;
    int64_t c = 0;
    MT_TRY(mt_model_forward_backward(s->model, tokens, labels, dscale, &ls, &c));
    if (loss_sum) *loss_sum = ls;
    if (count) *count = c;
    return MT_OK;
}

mt_status mt_session_backward_hidden(mt_session *s, const float *dhidden) {
    NEED(s && dhidden, "mt_session_backward_hidden");
    if (!s->fwd_fresh)
        return mt_set_error(MT_ERR_INVALID,
                            "mt_session_backward_hidden: no forward to differentiate since the last step, "
                            "backward or parameter write (call mt_session_forward or mt_session_loss first)");
    s->fwd_fresh = 0; /* the backward consumes the saved activations */
    return mt_model_backward_hidden(s->model, dhidden);
}

/* Index of the unembedding parameter (lm_head, or the embedding when tied). */
static int unembedding_index(const mt_model *m) {
    const mt_model_config *c = mt_model_get_config(m);
    return mt_model_param_find(m, c->logits_via_embedding ? "model.embed_tokens.weight" : "lm_head.weight");
}

mt_status mt_session_tiled_loss(mt_session *s, const float *hidden, const int32_t *labels, int64_t rows,
                                float dscale, float *dhidden, int add_unembedding_grad, double *loss_sum,
                                int64_t *count) {
    NEED(s && hidden && labels && loss_sum && count, "mt_session_tiled_loss");
    if (rows < 1) return mt_set_error(MT_ERR_INVALID, "mt_session_tiled_loss: rows = %" PRId64 " < 1", rows);
    const mt_model_config *c = mt_model_get_config(s->model);
    const int64_t D = c->emb_dim, V = c->vocab_size;
    for (int64_t r = 0; r < rows; r++)
        if (labels[r] != MT_IGNORE_LABEL && (labels[r] < 0 || labels[r] >= V))
            return mt_set_error(MT_ERR_INVALID,
                                "mt_session_tiled_loss: label %" PRId32 " at row %" PRId64
                                " is outside [0, %" PRId64 ") and not -1",
                                labels[r], r, V);
    const int ui = unembedding_index(s->model);
    if (ui < 0) return mt_set_error(MT_ERR_RUNTIME, "mt_session_tiled_loss: model has no unembedding");
    const mt_param_info *up = mt_model_param(s->model, ui);
    const float *W = mt_model_params(s->model) + up->offset;
    float *dW = add_unembedding_grad ? mt_model_grads(s->model) + up->offset : NULL;
    /* the tiled loss writes dW only when dh is given: route through a scratch dh */
    const int need_dh = dhidden != NULL || dW != NULL;

    mt_tiled_loss_args a;
    memset(&a, 0, sizeof a);
    a.N = rows;
    a.D = D;
    a.V = V;
    int64_t tiles = s->cfg.num_vocab_tiling; /* as given, else the model's rule (models/model.h) */
    if (tiles == 0) mt_model_vocab_tiling(s->model, &tiles, NULL);
    a.num_tiles = tiles < rows ? tiles : rows;
    a.softcap = c->final_logits_soft_cap;
    a.ignore_index = MT_IGNORE_LABEL;
    a.dscale = dscale;
    mt_backend *be = s->be;
    const size_t hbytes = (size_t)(rows * D) * sizeof(float);
    const size_t tbytes = (size_t)(mt_tiled_loss_tile_rows(rows, a.num_tiles) * V) * sizeof(float);
    void *h = NULL, *tile = NULL, *lab = NULL, *dh = NULL, *stats = NULL;
    mt_status st = be->ops->alloc(be, hbytes, &h);
    if (st == MT_OK) st = be->ops->alloc(be, tbytes, &tile);
    if (st == MT_OK) st = be->ops->alloc(be, (size_t)rows * sizeof(int32_t), &lab);
    if (st == MT_OK) st = be->ops->alloc(be, 2 * sizeof(double), &stats);
    if (st == MT_OK && need_dh) st = be->ops->alloc(be, hbytes, &dh);
    if (st != MT_OK) {
        st = mt_set_error(st, "mt_session_tiled_loss: cannot allocate %zu bytes of scratch: %s",
                          2 * hbytes + tbytes + (size_t)rows * sizeof(int32_t) + 2 * sizeof(double),
                          mt_last_error());
    } else {
        double acc[2] = {0.0, 0.0}; /* loss sum, labelled count (xent_tile's stats) */
        st = be->ops->copy_to_device(be, h, hidden, hbytes);
        if (st == MT_OK) st = be->ops->copy_to_device(be, lab, labels, (size_t)rows * sizeof(int32_t));
        if (st == MT_OK) st = be->ops->copy_to_device(be, stats, acc, sizeof acc);
        /* fp32 on the fp32 master weights, whatever the session's compute dtype */
        if (st == MT_OK) st = mt_tiled_loss(be, &a, h, W, MT_F32, lab, tile, NULL, dh, dW, stats);
        if (st == MT_OK) st = be->ops->copy_to_host(be, acc, stats, sizeof acc);
        if (st == MT_OK && dhidden) st = be->ops->copy_to_host(be, dhidden, dh, hbytes);
        if (st == MT_OK) {
            *loss_sum = acc[0];
            *count = (int64_t)acc[1];
        }
    }
    if (h) be->ops->release(be, h);
    if (tile) be->ops->release(be, tile);
    if (lab) be->ops->release(be, lab);
    if (dh) be->ops->release(be, dh);
    if (stats) be->ops->release(be, stats);
    return st;
}

/* ------------------------------------------------------------ tensors ---- */

static void fill_info(const mt_param_info *p, mt_tensor_info *info) {
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", p->name);
    info->ndim = p->ndim;
    info->shape[0] = p->shape[0];
    info->shape[1] = p->ndim == 2 ? p->shape[1] : 1;
    info->numel = p->numel;
}

mt_status mt_session_param_info(const mt_session *s, int64_t index, mt_tensor_info *info) {
    NEED(s && info, "mt_session_param_info");
    if (index < 0 || index >= mt_model_param_count(s->model))
        return mt_set_error(MT_ERR_INVALID, "mt_session_param_info: index %" PRId64 " not in [0, %d)", index,
                            mt_model_param_count(s->model));
    fill_info(mt_model_param(s->model, (int)index), info);
    return MT_OK;
}

static mt_status find_param(const mt_session *s, const char *name, const char *fn, const mt_param_info **p) {
    if (!s || !name) return mt_set_error(MT_ERR_INVALID, "%s: NULL argument", fn);
    int i = mt_model_param_find(s->model, name);
    if (i < 0) return mt_set_error(MT_ERR_INVALID, "%s: the model has no parameter '%s'", fn, name);
    *p = mt_model_param(s->model, i);
    return MT_OK;
}

mt_status mt_session_param_find(const mt_session *s, const char *name, mt_tensor_info *info) {
    const mt_param_info *p;
    MT_TRY(find_param(s, name, "mt_session_param_find", &p));
    NEED(info, "mt_session_param_find");
    fill_info(p, info);
    return MT_OK;
}

/* Copy tensor `name` of the params (grad = 0) or grads (grad = 1) buffer. */
static mt_status copy_tensor(mt_session *s, const char *name, float *host, int64_t numel, int grad, int to_host,
                             const char *fn) {
    const mt_param_info *p;
    MT_TRY(find_param(s, name, fn, &p));
    NEED(host, fn);
    if (numel != p->numel)
        return mt_set_error(MT_ERR_INVALID, "%s: '%s' has %" PRId64 " elements, %" PRId64 " given", fn, name,
                            p->numel, numel);
    float *dev = (grad ? mt_model_grads(s->model) : mt_model_params(s->model)) + p->offset;
    const size_t bytes = (size_t)numel * sizeof(float);
    if (to_host)
        MT_TRY(s->be->ops->copy_to_host(s->be, host, dev, bytes));
    else
        MT_TRY(s->be->ops->copy_to_device(s->be, dev, host, bytes));
    if (!to_host && !grad) s->fwd_fresh = 0;
    return MT_OK;
}

mt_status mt_session_get_param(mt_session *s, const char *name, float *out, int64_t numel) {
    return copy_tensor(s, name, out, numel, 0, 1, "mt_session_get_param");
}
mt_status mt_session_set_param(mt_session *s, const char *name, const float *in, int64_t numel) {
    return copy_tensor(s, name, (float *)in, numel, 0, 0, "mt_session_set_param");
}
mt_status mt_session_get_grad(mt_session *s, const char *name, float *out, int64_t numel) {
    return copy_tensor(s, name, out, numel, 1, 1, "mt_session_get_grad");
}
mt_status mt_session_set_grad(mt_session *s, const char *name, const float *in, int64_t numel) {
    return copy_tensor(s, name, (float *)in, numel, 1, 0, "mt_session_set_grad");
}

/* -------------------------------------------------------- activations ---- */

mt_status mt_session_activation(mt_session *s, const char *name, float *out, int64_t capacity, int64_t *numel) {
    NEED(s && name, "mt_session_activation");
    const mt_plan_entry *e = mt_plan_entry_get(s->plan, mt_plan_find(s->plan, name));
    if (!e)
        return mt_set_error(MT_ERR_INVALID,
                            "mt_session_activation: '%s' is not kept on the device by this model's plan "
                            "(unknown name, layer or tensor, or rematerialised / offloaded; names: "
                            "layers.<l>.<tensor>, final_norm_input, final_hidden)",
                            name);
    /* A layer's saved tensor, or one of the two final-norm activations. */
    const int readable = e->tag.kind == MT_PLAN_KIND_SAVED &&
                         (e->tag.layer >= 0 || strcmp(name, "final_norm_input") == 0 ||
                          strcmp(name, "final_hidden") == 0);
    if (!readable)
        return mt_set_error(MT_ERR_INVALID,
                            "mt_session_activation: '%s' is not an activation name (layers.<l>.<tensor>, "
                            "final_norm_input, final_hidden)",
                            name);
    const int64_t n = (int64_t)(e->bytes / sizeof(float));
    if (numel) *numel = n;
    if (!out) return MT_OK;
    if (capacity < n)
        return mt_set_error(MT_ERR_INVALID, "mt_session_activation: '%s' has %" PRId64 " elements, capacity %" PRId64,
                            name, n, capacity);
    if (!s->fwd_fresh)
        return mt_set_error(MT_ERR_INVALID,
                            "mt_session_activation: no forward since the last step or backward "
                            "(call mt_session_forward or mt_session_loss first)");
    const int pid = mt_plan_find(s->plan, "params");
    const mt_plan_entry *pe = mt_plan_entry_get(s->plan, pid);
    if (!pe) return mt_set_error(MT_ERR_RUNTIME, "mt_session_activation: the plan has no 'params' entry");
    const char *base = (const char *)mt_model_params(s->model) - pe->offset;
    MT_TRY(s->be->ops->copy_to_host(s->be, out, base + e->offset, (size_t)n * sizeof(float)));
    return MT_OK;
}

/* ------------------------------------------------------------- memory ---- */

const char *mt_memory_category_name(int c) {
    if (c < 0 || c >= MT_MEM_CATEGORY_COUNT) return "unknown";
    return mt_mem_category_name((mt_mem_category)c);
}

static void fill_memory(const mt_plan *p, int64_t num_params, mt_memory_info *out) {
    memset(out, 0, sizeof *out);
    out->peak_bytes = mt_plan_peak(p);
    mt_plan_live_by_category(p, out->live_bytes, &out->peak_phase);
    mt_plan_total_by_category(p, out->total_bytes);
    out->num_entries = mt_plan_count(p);
    out->num_params = num_params;
}

mt_status mt_memory_from_config(const char *config_path, int n_overrides, const char *const *overrides,
                                mt_memory_info *out) {
    NEED(out, "mt_memory_from_config");
    mt_train_config *cfg = malloc(sizeof *cfg);
    if (!cfg) return mt_set_error(MT_ERR_OOM, "mt_memory_from_config: out of memory");
    mt_plan *plan = NULL;
    int64_t np = 0;
    mt_status st = mt_train_config_load(cfg, config_path, n_overrides, overrides);
    if (st == MT_OK) st = mt_trainer_plan(cfg, &plan, NULL, &np);
    if (st == MT_OK) fill_memory(plan, np, out);
    mt_plan_free(plan);
    free(cfg);
    return st;
}

mt_status mt_session_memory(const mt_session *s, mt_memory_info *out) {
    NEED(s && out, "mt_session_memory");
    fill_memory(s->plan, mt_model_numel(s->model), out);
    return MT_OK;
}

/* -------------------------------------------------------- checkpoints ---- */

mt_status mt_session_save_checkpoint(mt_session *s, char *path, size_t path_size) {
    MT_TRY(need_data(s, "mt_session_save_checkpoint"));
    char where[4096];
    MT_TRY(mt_trainer_save_checkpoint(s->trainer, where, sizeof where));
    if (path && path_size > 0) {
        if (strlen(where) >= path_size)
            return mt_set_error(MT_ERR_INVALID,
                                "mt_session_save_checkpoint: the checkpoint was written to '%s', but the "
                                "path buffer has %zu bytes and needs %zu",
                                where, path_size, strlen(where) + 1);
        memcpy(path, where, strlen(where) + 1);
    }
    return MT_OK;
}

mt_status mt_session_save_model(mt_session *s, const char *dir, int bf16) {
    NEED(s && dir, "mt_session_save_model");
    return mt_checkpoint_save_model(dir, s->model, bf16 ? MT_BF16 : MT_F32);
}

mt_status mt_session_load_model(mt_session *s, const char *dir) {
    NEED(s && dir, "mt_session_load_model");
    s->fwd_fresh = 0;
    return mt_checkpoint_load_model(dir, s->model);
}
