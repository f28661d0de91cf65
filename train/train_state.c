/* train/train_state.c: train_state.safetensors, the optimizer shard, step, data
 * position and RNG of a checkpoint (docs/resume.md), read and written. */
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
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "train/trainer_private.h"

/* The data loader options of a split (trainer.h): here, with the data position the
 * train state records, whose meaning they fix. */
void mt_trainer_data_options(const mt_train_config *cfg, const char *split, mt_data_options *opt) {
    const int train = strcmp(split, "train") == 0;
    opt->files = train ? cfg->train_files : cfg->eval_files;
    opt->files_key = train ? "train_files" : "eval_files";
    /* The val split is never shuffled: each evaluation reads the same first eval_steps
     * windows, so val_loss compares across steps and across runs of any seed. */
    opt->shuffle = train && cfg->enable_data_shuffling;
    opt->shuffle_seed = (uint64_t)(cfg->data_shuffle_seed >= 0 ? cfg->data_shuffle_seed : cfg->seed);
    opt->micro_batches = cfg->gradient_accumulation_steps;
}

/* Read the train state of checkpoint dir into t (moments, step, data position). */
/* The format and version marks and the integers of the metadata: vals = step, data
 * shard, offset and epoch. */
static mt_status ts_read_header(mt_safetensors *f, const char *path, int64_t vals[4]) {
    const char *fmt = mt_safetensors_metadata(f, "format");
    const char *ver = mt_safetensors_metadata(f, "version");
    if (!fmt || strcmp(fmt, MT_TRAIN_STATE_FORMAT) != 0 || !ver || strcmp(ver, MT_TRAIN_STATE_VERSION) != 0)
        return mt_set_error(MT_ERR_FORMAT, "%s: not a meshtrain train state (format '%s' version '%s')", path,
                            fmt ? fmt : "(none)", ver ? ver : "(none)");
    const char *keys[4] = {"step", "data_shard", "data_offset", "data_epoch"};
    for (int i = 0; i < 4; i++) {
        const char *s = mt_safetensors_metadata(f, keys[i]);
        char *end = NULL;
        errno = 0;
        long long v = s ? strtoll(s, &end, 10) : -1;
        if (!s || !*s || *end || errno || v < 0)
            return mt_set_error(MT_ERR_FORMAT, "%s: metadata '%s' is missing or not a non-negative integer ('%s')",
                                path, keys[i], s ? s : "(none)");
        vals[i] = (int64_t)v;
    }
    return MT_OK;
}

/* The AdamW moments: one tensor per parameter and moment, this rank's part of each
 * (its optimizer shard [lo, hi)) staged through one host buffer to the device. */
static mt_status ts_load_moments(mt_trainer *t, mt_safetensors *f, const char *path) {
    int64_t maxn = 0;
    for (int i = 0; i < t->nparams; i++)
        if (t->params[i].numel > maxn) maxn = t->params[i].numel;
    float *host = malloc((size_t)(maxn > 0 ? maxn : 1) * sizeof(float));
    if (!host) return mt_set_error(MT_ERR_OOM, "train state: cannot allocate %" PRId64 " floats", maxn);
    mt_status st = MT_OK;
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
            const int64_t a = p->offset > t->gs.lo ? p->offset : t->gs.lo;
            const int64_t b = p->offset + n < t->gs.hi ? p->offset + n : t->gs.hi;
            if (st == MT_OK && b > a) {
                float *dst = (which ? t->opt.v : t->opt.m) + (a - t->gs.lo);
                st = t->be->ops->copy_to_device(t->be, dst, host + (a - p->offset), (size_t)(b - a) * sizeof(float));
            }
        }
    }
    free(host);
    return st;
}

/* The data position counts windows of this batch shape over these data ranks (written
 * since the keys were added; older train states lack them). */
static mt_status ts_check_batch_shape(const mt_trainer *t, mt_safetensors *f, const char *path) {
    const char *mk[3] = {"per_device_batch_size", "max_target_length", "data_parallel_ranks"};
    const int64_t now[3] = {t->cfg.per_device_batch_size, t->cfg.max_target_length, mt_trainer_dp_size(t->mesh)};
    for (int i = 0; i < 3; i++) {
        const char *sv = mt_safetensors_metadata(f, mk[i]);
        if (sv && strtoll(sv, NULL, 10) != now[i]) {
            const char *key = i == 2 ? "ici_data_parallelism x ici_fsdp_parallelism" : mk[i];
            return mt_set_error(MT_ERR_INVALID, "%s: key '%s': the checkpoint's data position was made with "
                                "%s = %s, this run has %" PRId64 "%s; resume with the same batch shape",
                                path, key, mk[i], sv, now[i], i == 2 ? " (data x fsdp ranks)" : "");
        }
    }
    return MT_OK;
}

/* The order the position counts in: shuffled or not, its seed, and (shuffled) the
 * micro-batches of a unit. A train state without data_shuffle was written in file
 * order. A data_shuffle_seed of -1 follows seed, which a resume may change (the
 * parameters come from the checkpoint): the run keeps its saved order; one set
 * explicitly must match. */
static mt_status ts_check_order(mt_trainer *t, mt_safetensors *f, const char *path) {
    mt_data_options dopt;
    mt_trainer_data_options(&t->cfg, "train", &dopt);
    const char *sv_sh = mt_safetensors_metadata(f, "data_shuffle");
    const char *sv_seed = mt_safetensors_metadata(f, "data_shuffle_seed");
    const char *sv_ga = mt_safetensors_metadata(f, "gradient_accumulation_steps");
    const int was = sv_sh ? (int)strtol(sv_sh, NULL, 10) : 0;
    if (was != dopt.shuffle)
        return mt_set_error(MT_ERR_INVALID, "%s: key 'enable_data_shuffling': the checkpoint's data position was "
                            "made with enable_data_shuffling = %s, this run has %s; resume with the same value",
                            path, was ? "true" : "false", dopt.shuffle ? "true" : "false");
    if (was && sv_seed && strtoull(sv_seed, NULL, 10) != dopt.shuffle_seed) {
        if (t->cfg.data_shuffle_seed >= 0)
            return mt_set_error(MT_ERR_INVALID, "%s: key 'data_shuffle_seed': the checkpoint's data was shuffled "
                                "with seed %s, this run has data_shuffle_seed = %" PRId64 "; resume with the same "
                                "value (or -1 to keep the checkpoint's)", path, sv_seed, t->cfg.data_shuffle_seed);
        mt_data_set_shuffle_seed(t->train, (uint64_t)strtoull(sv_seed, NULL, 10));
        return MT_OK;
    }
    if (was && sv_ga && strtoll(sv_ga, NULL, 10) != t->cfg.gradient_accumulation_steps)
        return mt_set_error(MT_ERR_INVALID, "%s: key 'gradient_accumulation_steps': the checkpoint's shuffled data "
                            "position was made with gradient_accumulation_steps = %s, this run has %" PRId64
                            "; resume with the same batch shape", path, sv_ga, t->cfg.gradient_accumulation_steps);
    return MT_OK;
}

/* The train split the position was made in (written since the keys were added). */
static mt_status ts_check_dataset(const mt_trainer *t, mt_safetensors *f, const char *path, const char *dir,
                                  const mt_data_position *pos) {
    const char *sv_n = mt_safetensors_metadata(f, "data_shards");
    const char *sv_t = mt_safetensors_metadata(f, "data_shard_tokens");
    const int64_t now_n = mt_data_shard_count(t->train), now_t = mt_data_shard_tokens(t->train, pos->shard);
    if ((sv_n && strtoll(sv_n, NULL, 10) != now_n) || (sv_t && now_t >= 0 && strtoll(sv_t, NULL, 10) != now_t)) {
        char now_s[64] = "";
        if (now_t >= 0) snprintf(now_s, sizeof now_s, ", that shard %" PRId64 " tokens", now_t);
        return mt_set_error(MT_ERR_INVALID, "%s: key 'dataset_path' = '%s': a different dataset than the saved "
                            "run's: the checkpoint recorded %s train shard(s), shard %" PRId64 " of %s tokens; "
                            "this dataset has %" PRId64 " shard(s)%s. Resume with the same dataset (or start a "
                            "new run from the weights with load_parameters_path=%s)",
                            path, t->cfg.dataset_path, sv_n ? sv_n : "?", pos->shard, sv_t ? sv_t : "?", now_n,
                            now_s, dir);
    }
    return MT_OK;
}

mt_status mt_train_state_load(mt_trainer *t, const char *dir) {
    char path[MT_PATH];
    if (!mt_trainer_path_join(path, sizeof path, dir, "train_state.safetensors"))
        return mt_set_error(MT_ERR_IO, "path too long: '%s'", dir);
    mt_safetensors *f = NULL;
    MT_TRY(mt_safetensors_open(&f, path));
    int64_t vals[4] = {0, 0, 0, 0};
    mt_status st = ts_read_header(f, path, vals);
    if (st == MT_OK) st = ts_load_moments(t, f, path);
    if (st == MT_OK && vals[0] > t->cfg.steps)
        st = mt_set_error(MT_ERR_INVALID, "%s: checkpoint is at step %" PRId64 " but steps = %" PRId64, path,
                          vals[0], t->cfg.steps);
    if (st == MT_OK) st = ts_check_batch_shape(t, f, path);
    if (st == MT_OK) st = ts_check_order(t, f, path);
    const mt_data_position pos = {vals[1], vals[2], vals[3]};
    if (st == MT_OK) st = ts_check_dataset(t, f, path, dir, &pos);
    if (st == MT_OK) {
        st = mt_data_seek(t->train, pos);
        if (st != MT_OK) st = mt_set_error(st, "%s: cannot restore the data position: %s", path, mt_last_error());
    }
    if (st == MT_OK) t->step = vals[0];
    mt_safetensors_close(f);
    return st;
}


/* ------------------------------------------------------------ checkpoints ---- */

/* train_state.safetensors of the current step into dir (rank 0; the other ranks pass
 * dir = NULL and join the gather), recording ckid and t->run_id. */
mt_status mt_train_state_write(mt_trainer *t, const char *dir, const char *ckid) {
    const size_t bytes = (size_t)t->numel * sizeof(float);
    float *m = malloc(bytes ? bytes : 1), *v = malloc(bytes ? bytes : 1);
    mt_st_write_tensor *w = calloc((size_t)(2 * t->nparams + 1), sizeof *w);
    char (*names)[MT_PARAM_NAME_MAX + 16] = calloc((size_t)(2 * t->nparams + 1), sizeof *names);
    mt_status st = MT_OK;
    if (!m || !v || !w || !names) {
        st = mt_set_error(MT_ERR_OOM, "checkpoint: cannot allocate %zu bytes for the train state", 2 * bytes);
        goto done;
    }
    if (t->gs.zero1) { /* host buffers: the MPI backend runs on the CPU backend only */
        st = mt_grad_sync_gather(&t->gs, t->opt.m, m);
        if (st == MT_OK) st = mt_grad_sync_gather(&t->gs, t->opt.v, v);
        if (st != MT_OK) goto done;
    } else {
        st = t->be->ops->copy_to_host(t->be, m, t->opt.m, bytes);
        if (st == MT_OK) st = t->be->ops->copy_to_host(t->be, v, t->opt.v, bytes);
        if (st != MT_OK) goto done;
    }
    if (t->mesh->rank != 0) goto done; /* every rank took part in the gather; rank 0 writes */
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
    char step[32], shard[32], off[32], epoch[32], seed[32], bsz[32], seq[32], dpw[32], nsh[32], shtok[32];
    char shuf[32], shseed[32], gas[32];
    mt_data_options dopt;
    mt_trainer_data_options(&t->cfg, "train", &dopt);
    snprintf(shuf, sizeof shuf, "%d", dopt.shuffle);
    snprintf(shseed, sizeof shseed, "%" PRIu64, mt_data_shuffle_seed(t->train)); /* the saved run's on resume */
    snprintf(gas, sizeof gas, "%" PRId64, t->cfg.gradient_accumulation_steps);
    snprintf(nsh, sizeof nsh, "%" PRId64, mt_data_shard_count(t->train));
    snprintf(shtok, sizeof shtok, "%" PRId64, mt_data_shard_tokens(t->train, pos.shard));
    snprintf(bsz, sizeof bsz, "%" PRId64, t->cfg.per_device_batch_size);
    snprintf(seq, sizeof seq, "%" PRId64, t->cfg.max_target_length);
    snprintf(dpw, sizeof dpw, "%d", mt_trainer_dp_size(t->mesh));
    snprintf(step, sizeof step, "%" PRId64, t->step);
    snprintf(shard, sizeof shard, "%" PRId64, pos.shard);
    snprintf(off, sizeof off, "%" PRId64, pos.offset);
    snprintf(epoch, sizeof epoch, "%" PRId64, pos.epoch);
    snprintf(seed, sizeof seed, "%" PRId64, t->cfg.seed);
    const char *meta[] = {"format", MT_TRAIN_STATE_FORMAT, "version", MT_TRAIN_STATE_VERSION,
                          "step", step, "data_shard", shard, "data_offset", off, "data_epoch", epoch,
                          "seed", seed,
                          /* the batch shape the data position was made with (checked on resume) */
                          "per_device_batch_size", bsz, "max_target_length", seq, "data_parallel_ranks", dpw,
                          /* the train split's shape (a different dataset is named on resume) */
                          "data_shards", nsh, "data_shard_tokens", shtok,
                          /* the order the position counts in (train/data.h; checked on resume) */
                          "data_shuffle", shuf, "data_shuffle_seed", shseed, "gradient_accumulation_steps", gas,
                          /* which history and which save (see "checkpoint identity") */
                          "run_id", t->run_id, "checkpoint_id", ckid, NULL};
    char path[MT_PATH];
    if (!mt_trainer_path_join(path, sizeof path, dir, "train_state.safetensors"))
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
