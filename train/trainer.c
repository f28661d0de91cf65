/* train/trainer.c: the single-device training loop, evaluation and train-state
 * checkpoints (see trainer.h). */
#include "train/trainer.h"

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
#include "runtime/dtype.h"
#include "runtime/log.h"
#include "runtime/timer.h"
#include "train/data.h"
#include "train/optimizer.h"

#define MT_TRAIN_STATE_FORMAT "meshtrain-train-state"
#define MT_TRAIN_STATE_VERSION "1"
#define MT_PATH 2048

struct mt_trainer {
    mt_train_config cfg;
    const mt_ops *ops;
    mt_model *model;
    mt_plan *plan;
    mt_arena arena;
    int have_arena;
    mt_adamw opt;
    mt_param_info *params; /* copy of the model's parameter table */
    int nparams;
    int64_t numel;
    mt_lr_schedule sched;
    mt_data_loader *train, *val;
    int32_t *tokens, *labels; /* host [B*T] */
    int64_t step;             /* optimizer steps done */
    int resumed;
    double flops_per_token, peak_flops;
    mt_bf16 *acc16;           /* grad_dtype=bfloat16 accumulator (host) */
    float *stage;             /* host staging of one gradient */
    char run_dir[MT_PATH];
    double time_sum;          /* wall seconds of the steps of this process */
    int64_t timed_steps;
};

/* ------------------------------------------------------------ file helpers ---- */

static int path_join(char *out, size_t n, const char *a, const char *b) {
    int w = snprintf(out, n, "%s/%s", a, b);
    return w >= 0 && (size_t)w < n;
}

/* mkdir -p. Errors: MT_ERR_IO naming the directory. */
static mt_status mkdir_p(const char *path) {
    char buf[MT_PATH];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return mt_set_error(MT_ERR_IO, "path too long: '%s'", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return mt_set_error(MT_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return mt_set_error(MT_ERR_IO, "cannot create directory '%s': %s", buf, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return mt_set_error(MT_ERR_IO, "'%s' exists and is not a directory", buf);
    return MT_OK;
}

/* Remove a directory of plain files (a checkpoint directory); missing is fine. */
static mt_status remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return MT_OK;
        return mt_set_error(MT_ERR_IO, "cannot open directory '%s': %s", path, strerror(errno));
    }
    struct dirent *e;
    char f[MT_PATH];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (!path_join(f, sizeof f, path, e->d_name) || unlink(f) != 0) {
            closedir(d);
            return mt_set_error(MT_ERR_IO, "cannot remove '%s/%s': %s", path, e->d_name, strerror(errno));
        }
    }
    closedir(d);
    if (rmdir(path) != 0) return mt_set_error(MT_ERR_IO, "cannot remove '%s': %s", path, strerror(errno));
    return MT_OK;
}

/* -------------------------------------------------------------- building ---- */

/* What no backend computes yet: bfloat16 compute or master weights. */
static mt_status check_dtypes(const mt_train_config *cfg, const char *backend) {
    if (cfg->dtype != MT_F32)
        return mt_set_error(MT_ERR_UNSUPPORTED,
                            "dtype=%s is not supported on the %s backend (float32 only; "
                            "use dtype=float32)",
                            mt_dtype_name(cfg->dtype), backend);
    if (cfg->weight_dtype != MT_F32)
        return mt_set_error(MT_ERR_UNSUPPORTED,
                            "weight_dtype=%s is not supported: master weights are float32 "
                            "(use weight_dtype=float32)",
                            mt_dtype_name(cfg->weight_dtype));
    return MT_OK;
}

mt_status mt_trainer_select_backend(const mt_train_config *cfg, const mt_ops **ops) {
    const mt_ops *cuda = mt_cuda_ops();
    switch (cfg->backend) {
    case MT_BACKEND_CPU: *ops = mt_cpu_ops(); break;
    case MT_BACKEND_CUDA:
        if (!cuda)
            return mt_set_error(MT_ERR_UNSUPPORTED,
                                "backend=cuda: this build has no CUDA backend or no GPU is visible");
        *ops = cuda;
        break;
    case MT_BACKEND_AUTO:
    default: *ops = cuda ? cuda : mt_cpu_ops(); break;
    }
    return check_dtypes(cfg, (*ops)->name);
}

/* Model + plan (finalised) + optimizer entries for cfg with ops. */
static mt_status build_plan(const mt_train_config *cfg, const mt_ops *ops, mt_model **model, mt_plan **plan,
                            mt_adamw *opt) {
    *model = NULL;
    *plan = NULL;
    mt_status st = mt_model_create(model, &cfg->model, ops, cfg->per_device_batch_size,
                                   cfg->max_target_length, cfg->num_vocab_tiling);
    if (st == MT_OK) st = mt_plan_new(plan);
    if (st == MT_OK) st = mt_model_add_to_plan(*model, *plan);
    if (st == MT_OK) {
        mt_adamw_init(opt, ops, mt_model_numel(*model), cfg->adam_b1, cfg->adam_b2, cfg->adam_eps,
                      cfg->adam_weight_decay);
        st = mt_adamw_add_to_plan(opt, *plan, mt_model_phase_count(*model));
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

mt_status mt_trainer_plan(const mt_train_config *cfg, mt_plan **plan, int64_t *num_params) {
    /* Sizing does not need the device: without one, size with the CPU table. */
    const mt_ops *ops = mt_cuda_ops();
    if (cfg->backend == MT_BACKEND_CPU || !ops) ops = mt_cpu_ops();
    MT_TRY(check_dtypes(cfg, ops->name));
    mt_model *model;
    mt_adamw opt;
    MT_TRY(build_plan(cfg, ops, &model, plan, &opt));
    if (num_params) *num_params = mt_model_numel(model);
    mt_model_free(model);
    return MT_OK;
}

/* Read the train state of checkpoint dir into t (moments, step, data position). */
static mt_status load_train_state(mt_trainer *t, const char *dir) {
    char path[MT_PATH];
    if (!path_join(path, sizeof path, dir, "train_state.safetensors"))
        return mt_set_error(MT_ERR_IO, "path too long: '%s'", dir);
    mt_safetensors *f = NULL;
    MT_TRY(mt_safetensors_open(&f, path));
    mt_status st = MT_OK;
    const char *fmt = mt_safetensors_metadata(f, "format");
    const char *ver = mt_safetensors_metadata(f, "version");
    if (!fmt || strcmp(fmt, MT_TRAIN_STATE_FORMAT) != 0 || !ver || strcmp(ver, MT_TRAIN_STATE_VERSION) != 0) {
        st = mt_set_error(MT_ERR_FORMAT, "%s: not a meshtrain train state (format '%s' version '%s')", path,
                          fmt ? fmt : "(none)", ver ? ver : "(none)");
        goto done;
    }
    /* Integers in the metadata. */
    const char *keys[4] = {"step", "data_shard", "data_offset", "data_epoch"};
    int64_t vals[4];
    for (int i = 0; i < 4; i++) {
        const char *s = mt_safetensors_metadata(f, keys[i]);
        char *end = NULL;
        errno = 0;
        long long v = s ? strtoll(s, &end, 10) : -1;
        if (!s || !*s || *end || errno || v < 0) {
            st = mt_set_error(MT_ERR_FORMAT, "%s: metadata '%s' is missing or not a non-negative integer ('%s')",
                              path, keys[i], s ? s : "(none)");
            goto done;
        }
        vals[i] = (int64_t)v;
    }
    /* Moments: one tensor per parameter and moment, staged through one host buffer. */
    int64_t maxn = 0;
    for (int i = 0; i < t->nparams; i++)
        if (t->params[i].numel > maxn) maxn = t->params[i].numel;
    float *host = malloc((size_t)(maxn > 0 ? maxn : 1) * sizeof(float));
    if (!host) {
        st = mt_set_error(MT_ERR_OOM, "train state: cannot allocate %" PRId64 " floats", maxn);
        goto done;
    }
    for (int i = 0; i < t->nparams && st == MT_OK; i++) {
        const mt_param_info *p = &t->params[i];
        for (int which = 0; which < 2 && st == MT_OK; which++) {
            char name[MT_PARAM_NAME_MAX + 16];
            snprintf(name, sizeof name, "%s.%s", p->name, which ? "adam_v" : "adam_m");
            int idx = mt_safetensors_find(f, name);
            if (idx < 0) {
                st = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' is missing", path, name);
                break;
            }
            const mt_st_tensor *ti = mt_safetensors_tensor(f, idx);
            int64_t n = 1;
            for (int d = 0; d < ti->ndim; d++) n *= ti->shape[d];
            if (ti->dtype != MT_F32 || n != p->numel) {
                st = mt_set_error(MT_ERR_FORMAT, "%s: tensor '%s' has dtype %s and %" PRId64
                                  " elements, expected float32 and %" PRId64,
                                  path, name, mt_dtype_name(ti->dtype), n, p->numel);
                break;
            }
            st = mt_safetensors_read_f32(f, idx, host, n);
            if (st == MT_OK) {
                float *dst = (which ? t->opt.v : t->opt.m) + p->offset;
                t->ops->copy_to_device(dst, host, (size_t)n * sizeof(float));
            }
        }
    }
    free(host);
    if (st != MT_OK) goto done;
    if (vals[0] > t->cfg.steps) {
        st = mt_set_error(MT_ERR_INVALID, "%s: checkpoint is at step %" PRId64 " but steps = %" PRId64, path,
                          vals[0], t->cfg.steps);
        goto done;
    }
    mt_data_position pos = {vals[1], vals[2], vals[3]};
    st = mt_data_seek(t->train, pos);
    if (st != MT_OK) {
        st = mt_set_error(st, "%s: cannot restore the data position: %s", path, mt_last_error());
        goto done;
    }
    t->step = vals[0];
done:
    mt_safetensors_close(f);
    return st;
}

static mt_status open_loader(mt_data_loader **out, const mt_train_config *cfg, const char *split) {
    MT_TRY(mt_data_open(out, cfg->dataset_path, split, cfg->per_device_batch_size, cfg->max_target_length, 0, 1));
    int64_t mx = mt_data_max_token(*out);
    if (mx >= cfg->model.vocab_size)
        return mt_set_error(MT_ERR_INVALID, "dataset '%s' (%s split) holds token id %" PRId64
                            " but the model's vocab_size is %" PRId64,
                            cfg->dataset_path, split, mx, cfg->model.vocab_size);
    return MT_OK;
}

mt_status mt_trainer_create(mt_trainer **out, const mt_train_config *cfg) {
    *out = NULL;
    MT_TRY(mt_train_config_validate(cfg));
    mt_trainer *t = calloc(1, sizeof *t);
    if (!t) return mt_set_error(MT_ERR_OOM, "trainer: out of memory");
    t->cfg = *cfg;
    mt_status st = mt_trainer_select_backend(cfg, &t->ops);
    if (st == MT_OK) st = build_plan(cfg, t->ops, &t->model, &t->plan, &t->opt);
    if (st == MT_OK) st = open_loader(&t->train, cfg, "train");
    if (st == MT_OK && cfg->eval_interval > 0) st = open_loader(&t->val, cfg, "val");
    if (st == MT_OK) {
        st = mt_arena_create(&t->arena, t->plan, t->ops->alloc, t->ops->release);
        t->have_arena = st == MT_OK;
    }
    if (st == MT_OK) st = mt_model_bind(t->model, &t->arena, t->plan);
    if (st == MT_OK) st = mt_adamw_bind(&t->opt, &t->arena, t->plan);
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
    if (st == MT_OK && cfg->grad_dtype == MT_BF16) {
        t->acc16 = malloc((size_t)t->numel * sizeof(mt_bf16));
        t->stage = malloc((size_t)t->numel * sizeof(float));
        if (!t->acc16 || !t->stage) st = mt_set_error(MT_ERR_OOM, "trainer: no memory for the bf16 accumulator");
    }
    if (st == MT_OK) {
        if (cfg->load_checkpoint[0]) {
            st = mt_checkpoint_load_model(cfg->load_checkpoint, t->model);
            if (st == MT_OK) st = load_train_state(t, cfg->load_checkpoint);
            t->resumed = 1;
        } else if (cfg->load_parameters_path[0]) {
            st = mt_checkpoint_load_model(cfg->load_parameters_path, t->model);
        } else {
            st = mt_model_init_params(t->model, (uint64_t)cfg->seed);
        }
    }
    if (st == MT_OK) {
        t->sched = mt_lr_schedule_make(cfg->learning_rate, cfg->warmup_steps_fraction,
                                       cfg->cosine_learning_rate_final_fraction, cfg->steps);
        t->flops_per_token = mt_flops_per_token(&cfg->model, cfg->max_target_length);
        t->peak_flops = mt_backend_peak_flops(t->ops->name);
        char tmp[MT_PATH];
        if (!path_join(tmp, sizeof tmp, cfg->base_output_directory, cfg->run_name))
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
    mt_data_close(t->train);
    mt_data_close(t->val);
    mt_model_free(t->model);
    if (t->have_arena) mt_arena_destroy(&t->arena);
    mt_plan_free(t->plan);
    free(t->params);
    free(t->tokens);
    free(t->labels);
    free(t->acc16);
    free(t->stage);
    free(t);
}

int64_t mt_trainer_step_count(const mt_trainer *t) { return t->step; }
mt_model *mt_trainer_model(mt_trainer *t) { return t->model; }
const mt_train_config *mt_trainer_config(const mt_trainer *t) { return &t->cfg; }
const mt_plan *mt_trainer_get_plan(const mt_trainer *t) { return t->plan; }

/* ----------------------------------------------------------------- a step ---- */

/* acc = bf16(acc + g) with the add in fp32 (first: acc = bf16(g)). */
static void bf16_accumulate(mt_trainer *t, int first) {
    float *grads = mt_model_grads(t->model);
    t->ops->copy_to_host(t->stage, grads, (size_t)t->numel * sizeof(float));
    for (int64_t i = 0; i < t->numel; i++) {
        float prev = first ? 0.0f : mt_bf16_to_f32(t->acc16[i]);
        t->acc16[i] = mt_f32_to_bf16(prev + t->stage[i]);
    }
}

mt_status mt_trainer_step(mt_trainer *t, mt_step_metrics *m) {
    const double t0 = mt_time_now();
    const mt_ops *ops = t->ops;
    float *grads = mt_model_grads(t->model);
    const size_t gbytes = (size_t)t->numel * sizeof(float);
    const int bf16 = t->cfg.grad_dtype == MT_BF16;
    double loss_sum = 0.0;
    int64_t count = 0;
    ops->zero(grads, gbytes);
    for (int64_t mb = 0; mb < t->cfg.gradient_accumulation_steps; mb++) {
        MT_TRY(mt_data_next(t->train, t->tokens, t->labels));
        if (bf16 && mb > 0) ops->zero(grads, gbytes);
        double ls = 0.0;
        int64_t c = 0;
        MT_TRY(mt_model_forward_backward(t->model, t->tokens, t->labels, 1.0f, &ls, &c));
        loss_sum += ls;
        count += c;
        if (bf16) bf16_accumulate(t, mb == 0);
    }
    if (bf16) {
        mt_bf16_to_f32_array(t->stage, t->acc16, (size_t)t->numel);
        ops->copy_to_device(grads, t->stage, gbytes);
    }
    if (count <= 0)
        return mt_set_error(MT_ERR_RUNTIME, "step %" PRId64 ": no labelled token in the batch", t->step + 1);
    ops->scale(grads, (float)(1.0 / (double)count), t->numel);
    const double norm = mt_grad_global_norm(ops, grads, t->params, t->nparams);
    if (!isfinite(norm))
        return mt_set_error(MT_ERR_RUNTIME, "step %" PRId64 ": gradient norm is %g (loss %g)", t->step + 1,
                            norm, loss_sum / (double)count);
    const double clip = mt_clip_scale(norm, t->cfg.gradient_clipping_threshold);
    const double lr = mt_lr_schedule_at(&t->sched, t->step);
    MT_TRY(mt_adamw_step(&t->opt, t->params, t->nparams, mt_model_params(t->model), grads, (float)lr,
                         (float)clip, t->step + 1));
    ops->sync();
    t->step++;
    const double dt = mt_time_now() - t0;
    t->time_sum += dt;
    t->timed_steps++;

    memset(m, 0, sizeof *m);
    m->step = t->step;
    m->has_train = 1;
    m->loss = loss_sum / (double)count;
    m->lr = lr;
    m->grad_norm = norm;
    m->tokens = count;
    m->step_ms = dt * 1e3;
    m->tokens_per_s = dt > 0 ? (double)count / dt : 0.0;
    m->mfu = mt_mfu(t->flops_per_token, m->tokens_per_s, t->peak_flops);
    m->total_steps = t->cfg.steps;
    m->eta_s = (double)(t->cfg.steps - t->step) * (t->time_sum / (double)t->timed_steps);
    return MT_OK;
}

mt_status mt_trainer_evaluate(mt_trainer *t, double *val_loss, int64_t *val_tokens) {
    if (!t->val) return mt_set_error(MT_ERR_INVALID, "evaluation is off (eval_interval <= 0)");
    mt_data_rewind(t->val);
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t i = 0; i < t->cfg.eval_steps; i++) {
        MT_TRY(mt_data_next(t->val, t->tokens, t->labels));
        double ls = 0.0;
        int64_t c = 0;
        MT_TRY(mt_model_loss(t->model, t->tokens, t->labels, &ls, &c));
        sum += ls;
        count += c;
    }
    *val_loss = count > 0 ? sum / (double)count : NAN;
    *val_tokens = count;
    return MT_OK;
}

/* ------------------------------------------------------------ checkpoints ---- */

static mt_status write_train_state(mt_trainer *t, const char *dir) {
    const size_t bytes = (size_t)t->numel * sizeof(float);
    float *m = malloc(bytes ? bytes : 1), *v = malloc(bytes ? bytes : 1);
    mt_st_write_tensor *w = calloc((size_t)(2 * t->nparams + 1), sizeof *w);
    char (*names)[MT_PARAM_NAME_MAX + 16] = calloc((size_t)(2 * t->nparams + 1), sizeof *names);
    mt_status st = MT_OK;
    if (!m || !v || !w || !names) {
        st = mt_set_error(MT_ERR_OOM, "checkpoint: cannot allocate %zu bytes for the train state", 2 * bytes);
        goto done;
    }
    t->ops->copy_to_host(m, t->opt.m, bytes);
    t->ops->copy_to_host(v, t->opt.v, bytes);
    for (int i = 0; i < t->nparams; i++) {
        const mt_param_info *p = &t->params[i];
        for (int which = 0; which < 2; which++) {
            const int k = 2 * i + which;
            snprintf(names[k], sizeof names[k], "%s.%s", p->name, which ? "adam_v" : "adam_m");
            w[k].name = names[k];
            w[k].dtype = MT_F32;
            w[k].ndim = p->ndim;
            for (int d = 0; d < p->ndim; d++) w[k].shape[d] = p->shape[d];
            w[k].data = (which ? v : m) + p->offset;
        }
    }
    const mt_data_position pos = mt_data_tell(t->train);
    char step[32], shard[32], off[32], epoch[32], seed[32];
    snprintf(step, sizeof step, "%" PRId64, t->step);
    snprintf(shard, sizeof shard, "%" PRId64, pos.shard);
    snprintf(off, sizeof off, "%" PRId64, pos.offset);
    snprintf(epoch, sizeof epoch, "%" PRId64, pos.epoch);
    snprintf(seed, sizeof seed, "%" PRId64, t->cfg.seed);
    const char *meta[] = {"format", MT_TRAIN_STATE_FORMAT, "version", MT_TRAIN_STATE_VERSION,
                          "step", step, "data_shard", shard, "data_offset", off, "data_epoch", epoch,
                          "seed", seed, NULL};
    char path[MT_PATH];
    if (!path_join(path, sizeof path, dir, "train_state.safetensors"))
        st = mt_set_error(MT_ERR_IO, "path too long: '%s'", dir);
    else
        st = mt_safetensors_write(path, w, 2 * t->nparams, meta);
done:
    free(m);
    free(v);
    free(w);
    free(names);
    return st;
}

mt_status mt_trainer_save_checkpoint(mt_trainer *t, char *out_path, size_t out_size) {
    char ckdir[MT_PATH], final[MT_PATH], tmp[MT_PATH + 8], old[MT_PATH + 8], name[48];
    snprintf(name, sizeof name, "step_%" PRId64, t->step);
    if (!path_join(ckdir, sizeof ckdir, t->run_dir, "checkpoints") || !path_join(final, sizeof final, ckdir, name))
        return mt_set_error(MT_ERR_IO, "checkpoint path too long under '%s'", t->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    MT_TRY(mkdir_p(ckdir));
    MT_TRY(remove_flat_dir(tmp));
    MT_TRY(mkdir_p(tmp));
    MT_TRY(mt_checkpoint_save_model(tmp, t->model, MT_F32));
    MT_TRY(write_train_state(t, tmp));
    /* Swap into place: an existing step_N moves aside first, so step_N is always
     * either the old or the new complete checkpoint. */
    struct stat sb;
    int had_old = stat(final, &sb) == 0;
    if (had_old) {
        MT_TRY(remove_flat_dir(old));
        if (rename(final, old) != 0)
            return mt_set_error(MT_ERR_IO, "cannot move '%s' aside: %s", final, strerror(errno));
    }
    if (rename(tmp, final) != 0) return mt_set_error(MT_ERR_IO, "cannot rename '%s': %s", tmp, strerror(errno));
    if (had_old) MT_TRY(remove_flat_dir(old));
    if (out_path && out_size) snprintf(out_path, out_size, "%s", final);
    return MT_OK;
}

/* -------------------------------------------------------------------- run ---- */

mt_status mt_trainer_run(mt_trainer *t, mt_train_callback cb, void *user) {
    MT_TRY(mkdir_p(t->run_dir));
    char mpath[MT_PATH];
    if (!path_join(mpath, sizeof mpath, t->run_dir, "metrics.jsonl"))
        return mt_set_error(MT_ERR_IO, "path too long: '%s'", t->run_dir);
    mt_metrics_writer *mw = NULL;
    MT_TRY(mt_metrics_open(&mw, mpath, t->resumed));
    mt_status st = MT_OK;
    const mt_train_config *c = &t->cfg;
    if (t->resumed)
        MT_LOG_I("resumed from %s at step %" PRId64, c->load_checkpoint, t->step);
    if (t->step == 0 && t->val) {
        mt_step_metrics m;
        memset(&m, 0, sizeof m);
        m.step = 0;
        m.total_steps = c->steps;
        m.has_eval = 1;
        st = mt_trainer_evaluate(t, &m.val_loss, &m.val_tokens);
        if (st == MT_OK) st = mt_metrics_write(mw, &m);
        if (st == MT_OK && cb) cb(&m, user);
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
        st = mt_metrics_write(mw, &m);
        if (st != MT_OK) break;
        if (cb) cb(&m, user);
        if ((c->checkpoint_period > 0 && t->step % c->checkpoint_period == 0) || last) {
            char where[MT_PATH];
            st = mt_trainer_save_checkpoint(t, where, sizeof where);
            if (st == MT_OK) MT_LOG_I("saved checkpoint %s", where);
        }
    }
    mt_metrics_close(mw);
    return st;
}
