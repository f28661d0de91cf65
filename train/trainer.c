/* train/trainer.c: the single-device training loop, evaluation and train-state
 * checkpoints (see trainer.h). */
#define _XOPEN_SOURCE 700 /* realpath */
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
#include "parallel/mesh.h"
#include "parallel/zero1.h"
#include "runtime/dtype.h"
#include "runtime/log.h"
#include "runtime/timer.h"
#include "train/data.h"
#include "train/estimate.h"
#include "train/optimizer.h"

#define MT_TRAIN_STATE_FORMAT "meshtrain-train-state"
#define MT_TRAIN_STATE_VERSION "1"
#define MT_PATH 2048
#define MT_ID_LEN 40

struct mt_trainer {
    mt_train_config cfg;
    mt_backend *be;
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
    char run_dir[MT_PATH];
    /* which history the checkpoints belong to (see "checkpoint identity" below) */
    char run_id[MT_ID_LEN];         /* this run's, in every checkpoint it writes ("" until chosen) */
    char resume_run_id[MT_ID_LEN];  /* load_checkpoint's ("" for one written before ids) */
    double time_sum;          /* wall seconds of the steps of this process */
    int64_t timed_steps;
    /* parallelism (see "parallel step" below) */
    mt_mesh *mesh;            /* data x fsdp x context x tensor communicators */
    mt_grad_sync gs;          /* gradient reduction, ZeRO-1 shard, grad_dtype accumulators */
    mt_param_info *sparams;   /* parameter table cut to this rank's optimizer shard */
    int nsparams;
    float *last_grad;         /* mean gradient of the last step (full, or the ZeRO-1 shard) */
    int chunked_grad;         /* the last step's gradient is read chunk by chunk (mt_grad_sync_read) */
    float last_inv_count;     /* its 1 / token count */
    uint64_t last_step_bytes; /* bytes this rank sent during the last step */
    /* host pool of offloaded activations (train/estimate.h, models/remat.h) */
    mt_plan *host_plan;
    mt_arena host_arena;
    int have_host_arena;
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

/* Remove a directory of plain files (a checkpoint directory); missing is fine, and a
 * plain file of that name is removed. */
static mt_status remove_flat_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) return MT_OK;
        if (errno == ENOTDIR && unlink(path) == 0) return MT_OK; /* a stray file under that name */
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

/* ---------------------------------------------------- checkpoint identity ----
 * A checkpoint records which history it belongs to and which save wrote it, in
 * train_state.safetensors (__metadata__ "step", "run_id", "checkpoint_id") and in
 * model.safetensors ("meshtrain_step", "meshtrain_run_id", "meshtrain_checkpoint_id";
 * config.json stays a plain Hugging Face file: it is the same for every step of a run
 * and is compared with the configured model on load). checkpoint_id is drawn for every
 * save; run_id when a run directory starts a history (a fresh run, or a resume into a
 * directory that holds no checkpoint yet: a branch) and kept by a resume in place. On
 * load the two files must record the same step and checkpoint_id, a step_<N> directory
 * must hold step N, and a step_<N>.tmp directory (a write that did not finish) is
 * refused; on resume every checkpoint already in the run directory must carry
 * load_checkpoint's run_id (checkpoints written before the ids: load_checkpoint must
 * be one of that directory's own). Hugging Face checkpoints (load_parameters_path)
 * carry none of this and are not checked. */

/* 16 random hex digits (/dev/urandom; else the clock and the process id mixed). */
static void new_id(char out[MT_ID_LEN]) {
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    const int ok = f && fread(&v, sizeof v, 1, f) == 1;
    if (f) fclose(f);
    if (!ok) { /* splitmix64 finaliser of the time and pid */
        v = (uint64_t)(mt_time_now() * 1e9) ^ ((uint64_t)getpid() << 40);
        v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
        v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
        v ^= v >> 31;
    }
    snprintf(out, MT_ID_LEN, "%016" PRIx64, v);
}

/* N of a directory name "step_<digits>" (at most 18 digits), else -1. */
static int64_t step_of_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5] || strlen(name + 5) > 18) return -1;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    return strtoll(name + 5, NULL, 10);
}

/* The last component of path (trailing slashes ignored) into out[n]. */
static void base_name(const char *path, char *out, size_t n) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && path[b - 1] != '/') b--;
    snprintf(out, n, "%.*s", (int)(len - b), path + b);
}

/* Is ckdir/name a directory holding a checkpoint's three files? */
static int holds_checkpoint(const char *ckdir, const char *name) {
    static const char *const files[] = {"config.json", "model.safetensors", "train_state.safetensors"};
    char dir[MT_PATH], f[MT_PATH];
    struct stat sb;
    if (!path_join(dir, sizeof dir, ckdir, name) || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (!path_join(f, sizeof f, dir, files[i]) || stat(f, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    return 1;
}

static int cmp_i64(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The steps of the complete checkpoints under ckdir (directories step_<digits>
 * holding config.json, model.safetensors and train_state.safetensors; an empty
 * directory or a file of that name is not one), ascending, in *steps (malloc'ed, the
 * caller frees; NULL when none) and their count in *n. A missing ckdir has none.
 * Errors: MT_ERR_OOM. */
static mt_status scan_checkpoints(const char *ckdir, int64_t **steps, int *n) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(ckdir);
    if (!d) return MT_OK;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const int64_t v = step_of_name(e->d_name);
        if (v < 0 || !holds_checkpoint(ckdir, e->d_name)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *p = realloc(*steps, sizeof(int64_t) * (size_t)cap);
            if (!p) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                *n = 0;
                return mt_set_error(MT_ERR_OOM, "out of memory listing '%s'", ckdir);
            }
            *steps = p;
        }
        (*steps)[(*n)++] = v;
    }
    closedir(d);
    if (*n > 1) qsort(*steps, (size_t)*n, sizeof(int64_t), cmp_i64);
    return MT_OK;
}

/* "step_a, step_b, ..." of steps[0..n) into buf[size] (cut with ", ..." when full). */
static void format_steps(const int64_t *steps, int n, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        char one[40];
        snprintf(one, sizeof one, "%sstep_%" PRId64, i ? ", " : "", steps[i]);
        if (used + strlen(one) + 6 >= size) {
            snprintf(buf + used, size - used, ", ...");
            return;
        }
        memcpy(buf + used, one, strlen(one) + 1);
        used += strlen(one);
    }
}

/* The newest complete checkpoint step_<digits> under ckdir (scan_checkpoints), or -1. */
static int64_t latest_checkpoint(const char *ckdir) {
    int64_t *steps = NULL;
    int n = 0;
    if (scan_checkpoints(ckdir, &steps, &n) != MT_OK) return -1;
    const int64_t best = n > 0 ? steps[n - 1] : -1;
    free(steps);
    return best;
}

/* The complete checkpoints under ckdir with a step above `after`: their count, and
 * their names in step order ("step_4, step_6, ..."; cut with "..." when buf is full)
 * in buf. */
static int later_checkpoints(const char *ckdir, int64_t after, char *buf, size_t n) {
    int64_t *steps = NULL;
    int count = 0;
    buf[0] = '\0';
    if (scan_checkpoints(ckdir, &steps, &count) != MT_OK) return 0;
    int first = 0;
    while (first < count && steps[first] <= after) first++;
    format_steps(steps + first, count - first, buf, n);
    free(steps);
    return count - first;
}

/* What one checkpoint file records of its checkpoint (-1 / "" when absent). */
typedef struct ck_ident {
    int64_t step;
    char run_id[MT_ID_LEN], ck_id[MT_ID_LEN];
} ck_ident;

/* The identity keys of a safetensors file's __metadata__ ("step", "run_id",
 * "checkpoint_id" after prefix). Errors: those of mt_safetensors_open. */
static mt_status read_ident(const char *path, const char *prefix, ck_ident *id) {
    id->step = -1;
    id->run_id[0] = id->ck_id[0] = '\0';
    mt_safetensors *f = NULL;
    MT_TRY(mt_safetensors_open(&f, path));
    char key[64];
    snprintf(key, sizeof key, "%sstep", prefix);
    const char *v = mt_safetensors_metadata(f, key);
    char *end = NULL;
    if (v && *v) {
        errno = 0;
        long long s = strtoll(v, &end, 10);
        if (!*end && !errno && s >= 0) id->step = (int64_t)s;
    }
    snprintf(key, sizeof key, "%srun_id", prefix);
    if ((v = mt_safetensors_metadata(f, key))) snprintf(id->run_id, sizeof id->run_id, "%s", v);
    snprintf(key, sizeof key, "%scheckpoint_id", prefix);
    if ((v = mt_safetensors_metadata(f, key))) snprintf(id->ck_id, sizeof id->ck_id, "%s", v);
    mt_safetensors_close(f);
    return MT_OK;
}

/* The files of checkpoint dir (load_checkpoint) belong together and to the step its
 * name says (see "checkpoint identity"); t->resume_run_id gets its run_id. A missing
 * file is left to the loaders to report. Errors: MT_ERR_INVALID naming the file that
 * does not belong, MT_ERR_IO / MT_ERR_FORMAT (unreadable header). */
static mt_status check_checkpoint_identity(mt_trainer *t, const char *dir) {
    char ts[MT_PATH], mp[MT_PATH], base[256];
    struct stat sb;
    if (!path_join(ts, sizeof ts, dir, "train_state.safetensors") || !path_join(mp, sizeof mp, dir, "model.safetensors"))
        return mt_set_error(MT_ERR_IO, "path too long: '%s'", dir);
    if (stat(ts, &sb) != 0 || stat(mp, &sb) != 0) return MT_OK;
    ck_ident a, b; /* train state, model */
    MT_TRY(read_ident(ts, "", &a));
    MT_TRY(read_ident(mp, "meshtrain_", &b));
    base_name(dir, base, sizeof base);
    const int64_t named = step_of_name(base);
    if (a.step >= 0 && b.step >= 0 && a.step != b.step) {
        if (named == a.step || named == b.step) {
            const int model_odd = named == a.step;
            return mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s: %s does not belong to this checkpoint: it "
                                "records step %" PRId64 ", while %s and the directory name say step %" PRId64
                                " (files of two checkpoints were mixed; copy a step_<N> directory whole)", dir,
                                model_odd ? mp : ts, model_odd ? b.step : a.step,
                                model_odd ? "train_state.safetensors" : "model.safetensors", named);
        }
        return mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s: %s records step %" PRId64 " but %s step %" PRId64
                            ": the files come from two checkpoints (copy a step_<N> directory whole)", dir, mp,
                            b.step, ts, a.step);
    }
    if (strcmp(a.ck_id, b.ck_id) != 0) {
        if (!a.ck_id[0] || !b.ck_id[0])
            return mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s: %s does not belong to this checkpoint: it "
                                "records no checkpoint id, %s records '%s' (files of two checkpoints were mixed; "
                                "copy a step_<N> directory whole)", dir, b.ck_id[0] ? ts : mp,
                                b.ck_id[0] ? "model.safetensors" : "train_state.safetensors",
                                b.ck_id[0] ? b.ck_id : a.ck_id);
        return mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s: %s (checkpoint id '%s') and %s (checkpoint id "
                            "'%s') were written by two different saves of step %" PRId64 ": one of them was copied "
                            "from another checkpoint (copy a step_<N> directory whole)", dir, mp, b.ck_id, ts,
                            a.ck_id, a.step);
    }
    if (named >= 0 && a.step >= 0 && named != a.step)
        return mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s: the directory is named step_%" PRId64 " but its "
                            "files record step %" PRId64 " (%s): a renamed or copied checkpoint would resume at "
                            "step %" PRId64 ", not %" PRId64 ". Give the directory of the step you mean, named "
                            "step_%" PRId64, dir, named, a.step, ts, a.step, named, a.step);
    snprintf(t->resume_run_id, sizeof t->resume_run_id, "%s", a.run_id);
    return MT_OK;
}

/* -------------------------------------------------------------- building ---- */

/* What the backend of cfg->backend cannot run, from its capabilities alone (before any
 * device is probed: kernels/backend.h mt_backend_kind_caps), each refusal naming the key:
 * dtype (compute) and weight_dtype (master weights: float32 on every backend),
 * grad_dtype, parameter/optimizer host offload. More than one rank is checked against
 * caps.multi_rank once the world size is known (setup_mesh). */
mt_status mt_trainer_check_caps(const mt_train_config *cfg, const mt_backend_caps *caps, const char *backend) {
    if (!mt_backend_has_dtype(caps, cfg->dtype))
        return mt_set_error(MT_ERR_UNSUPPORTED,
                            "dtype=%s is not supported on the %s backend (float32 only; "
                            "use dtype=float32)",
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

/* Divisibility of the model and batch by the layout (every combination of the four axes runs). */
static mt_status check_layout(const mt_train_config *cfg, const int dims[MT_MESH_AXES]) {
    const mt_layout_sizes ls = {cfg->model.num_query_heads, cfg->model.num_kv_heads, cfg->model.mlp_dim,
                                cfg->model.vocab_size, cfg->max_target_length, cfg->per_device_batch_size};
    return mt_mesh_check_layout(dims, &ls);
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
    return check_layout(cfg, dims);
}

/* The process group and the mesh of the ici_* keys (checked before any compute), and
 * the refusal of more than one rank on a backend without caps->multi_rank (made from
 * the config's backend kind, before any device is probed). */
static mt_status setup_mesh(mt_trainer *t, const mt_backend_caps *caps, const char *backend) {
    MT_TRY(mt_comm_world_init());
    mt_comm_set_timeout(t->cfg.collective_timeout_s);
    int64_t ici[MT_MESH_AXES];
    int dims[MT_MESH_AXES];
    cfg_ici(&t->cfg, ici);
    MT_TRY(mt_mesh_resolve(ici, mt_comm_world_size(), dims));
    MT_TRY(check_layout(&t->cfg, dims));
    if (mt_comm_world_size() > 1 && !caps->multi_rank)
        return mt_set_error(MT_ERR_UNSUPPORTED, "backend=%s with %d ranks: the trainer does not run multi-rank "
                            "on this backend yet (its optimizer and checkpoint collectives use host buffers; "
                            "parallel/comm.h's NCCL communicators are not wired in); multi-rank runs use "
                            "backend=cpu", backend, mt_comm_world_size());
    return mt_mesh_create(&t->mesh, dims);
}

/* Rank and size of this process in the data x fsdp group (data loading: the batch is split over data x fsdp). */
static int dp_rank(const mt_mesh *m) { return m->coord[MT_AXIS_DATA] * m->dims[MT_AXIS_FSDP] + m->coord[MT_AXIS_FSDP]; }
static int dp_size(const mt_mesh *m) { return m->dims[MT_AXIS_DATA] * m->dims[MT_AXIS_FSDP]; }

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

/* The gradient sync's tensor group and the ranges of replicated gradients (after
 * mt_model_set_tensor_parallel). */
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
    mt_status st = mt_model_create(model, &cfg->model, be, cfg->per_device_batch_size,
                                   cfg->max_target_length, cfg->num_vocab_tiling);
    if (st == MT_OK) st = mt_model_set_tensor_parallel(*model, tp_comm, tp_n, tp_rank);
    if (st == MT_OK) st = mt_model_set_context_parallel(*model, cp_comm, cp_n, cp_rank,
                                                         cfg->context_parallel_strategy);
    if (st == MT_OK) st = mt_model_set_sequence_parallel(*model, cfg->tensor_sequence_parallelism);
    if (st == MT_OK) st = mt_model_set_fsdp(*model, fsdp_comm, fsdp_n, fsdp_rank);
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
    if (st == MT_OK) st = mt_model_add_to_plan(*model, *plan);
    if (st == MT_OK) st = mt_grad_sync_add_to_plan(gs, *plan, mt_model_phase_count(*model) - 1);
    if (st == MT_OK) {
        mt_adamw_init(opt, be, mt_grad_sync_opt_numel(gs), cfg->adam_b1, cfg->adam_b2, cfg->adam_eps,
                      cfg->adam_weight_decay);
        /* optimizer_memory_host_offload: the moments live in the host pool (host plan) */
        st = mt_adamw_add_to_plan(opt, cfg->optimizer_memory_host_offload ? host : *plan,
                                  mt_model_phase_count(*model));
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
    mt_grad_sync_free(&gs);
    mt_plan_free(host);
    MT_TRY(st);
    if (num_params) *num_params = mt_model_numel(model);
    mt_model_free(model);
    return MT_OK;
}

mt_status mt_trainer_plan_with_host(const mt_train_config *cfg, mt_plan **plan, mt_plan **host_plan,
                                     int64_t *num_params) {
    *plan = *host_plan = NULL;
    /* Sizing does not need the device: check the chosen backend's capabilities, size with
     * the CPU backend object (the plan does not depend on the backend). */
    const mt_backend_caps caps = mt_backend_kind_caps(cfg->backend);
    MT_TRY(mt_trainer_check_caps(cfg, &caps, kind_name(cfg->backend)));
    mt_backend *be = mt_cpu_backend();
    int dims[MT_MESH_AXES];
    MT_TRY(plan_dims(cfg, dims));
    mt_model *model;
    mt_adamw opt;
    mt_grad_sync gs;
    MT_TRY(mt_plan_new(host_plan));
    mt_status st = build_plan(cfg, be, &model, plan, &opt, &gs, NULL, dims, *host_plan, 0);
    mt_grad_sync_free(&gs);
    if (st != MT_OK) {
        mt_plan_free(*host_plan);
        *host_plan = NULL;
        return st;
    }
    st = mt_model_add_to_host_plan(model, *host_plan);
    if (st == MT_OK) st = mt_plan_finalize(*host_plan);
    if (num_params) *num_params = mt_model_numel(model);
    mt_model_free(model);
    if (st != MT_OK) {
        mt_plan_free(*plan);
        mt_plan_free(*host_plan);
        *plan = *host_plan = NULL;
    }
    return st;
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
            /* the part of this tensor inside this rank's optimizer shard [lo, hi) */
            const int64_t a = p->offset > t->gs.lo ? p->offset : t->gs.lo;
            const int64_t b = p->offset + n < t->gs.hi ? p->offset + n : t->gs.hi;
            if (st == MT_OK && b > a) {
                float *dst = (which ? t->opt.v : t->opt.m) + (a - t->gs.lo);
                st = t->be->ops->copy_to_device(t->be, dst, host + (a - p->offset), (size_t)(b - a) * sizeof(float));
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
    {
        /* The data position counts windows of this batch shape over these data ranks
         * (written since the keys were added; older train states lack them). */
        const char *mk[3] = {"per_device_batch_size", "max_target_length", "data_parallel_ranks"};
        const int64_t now[3] = {t->cfg.per_device_batch_size, t->cfg.max_target_length, dp_size(t->mesh)};
        for (int i = 0; i < 3; i++) {
            const char *sv = mt_safetensors_metadata(f, mk[i]);
            if (sv && strtoll(sv, NULL, 10) != now[i]) {
                const char *key = i == 2 ? "ici_data_parallelism" : mk[i];
                st = mt_set_error(MT_ERR_INVALID, "%s: key '%s': the checkpoint's data position was made with "
                                  "%s = %s, this run has %" PRId64 "%s; resume with the same batch shape",
                                  path, key, mk[i], sv, now[i],
                                  i == 2 ? " (data x fsdp ranks)" : "");
                goto done;
            }
        }
    }
    {
        /* The order the position counts in: shuffled or not, its seed, and (shuffled)
         * the micro-batches of a unit. A train state without data_shuffle was written
         * in file order. */
        mt_data_options dopt;
        mt_trainer_data_options(&t->cfg, "train", &dopt);
        const char *sv_sh = mt_safetensors_metadata(f, "data_shuffle");
        const char *sv_seed = mt_safetensors_metadata(f, "data_shuffle_seed");
        const char *sv_ga = mt_safetensors_metadata(f, "gradient_accumulation_steps");
        const int was = sv_sh ? (int)strtol(sv_sh, NULL, 10) : 0;
        if (was != dopt.shuffle)
            st = mt_set_error(MT_ERR_INVALID, "%s: key 'enable_data_shuffling': the checkpoint's data position was "
                              "made with enable_data_shuffling = %s, this run has %s; resume with the same value",
                              path, was ? "true" : "false", dopt.shuffle ? "true" : "false");
        else if (was && sv_seed && strtoull(sv_seed, NULL, 10) != dopt.shuffle_seed) {
            /* data_shuffle_seed = -1 follows seed, which a resume may change (the
             * parameters come from the checkpoint): the run keeps its saved order. A
             * data_shuffle_seed set explicitly must match. */
            if (t->cfg.data_shuffle_seed >= 0)
                st = mt_set_error(MT_ERR_INVALID, "%s: key 'data_shuffle_seed': the checkpoint's data was shuffled "
                                  "with seed %s, this run has data_shuffle_seed = %" PRId64 "; resume with the same "
                                  "value (or -1 to keep the checkpoint's)", path, sv_seed, t->cfg.data_shuffle_seed);
            else
                mt_data_set_shuffle_seed(t->train, (uint64_t)strtoull(sv_seed, NULL, 10));
        }
        else if (was && sv_ga && strtoll(sv_ga, NULL, 10) != t->cfg.gradient_accumulation_steps)
            st = mt_set_error(MT_ERR_INVALID, "%s: key 'gradient_accumulation_steps': the checkpoint's shuffled data "
                              "position was made with gradient_accumulation_steps = %s, this run has %" PRId64
                              "; resume with the same batch shape", path, sv_ga,
                              t->cfg.gradient_accumulation_steps);
        if (st != MT_OK) goto done;
    }
    mt_data_position pos = {vals[1], vals[2], vals[3]};
    {
        /* The train split the position was made in (written since the keys were added). */
        const char *sv_n = mt_safetensors_metadata(f, "data_shards");
        const char *sv_t = mt_safetensors_metadata(f, "data_shard_tokens");
        const int64_t now_n = mt_data_shard_count(t->train), now_t = mt_data_shard_tokens(t->train, pos.shard);
        if ((sv_n && strtoll(sv_n, NULL, 10) != now_n) || (sv_t && now_t >= 0 && strtoll(sv_t, NULL, 10) != now_t)) {
            char now_s[64] = "";
            if (now_t >= 0) snprintf(now_s, sizeof now_s, ", that shard %" PRId64 " tokens", now_t);
            st = mt_set_error(MT_ERR_INVALID, "%s: key 'dataset_path' = '%s': a different dataset than the saved "
                              "run's: the checkpoint recorded %s train shard(s), shard %" PRId64 " of %s tokens; "
                              "this dataset has %" PRId64 " shard(s)%s. Resume with the same dataset (or start a "
                              "new run from the weights with load_parameters_path=%s)",
                              path, t->cfg.dataset_path, sv_n ? sv_n : "?", pos.shard, sv_t ? sv_t : "?", now_n,
                              now_s, dir);
            goto done;
        }
    }
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
    MT_TRY(mt_arena_create(&t->host_arena, t->host_plan, NULL, NULL, NULL));
    t->have_host_arena = 1;
    return mt_model_bind_host(t->model, &t->host_arena, t->host_plan);
}

/* The Hugging Face config.json field of a model key, for messages. */
static const char *hf_field(const char *key) {
    static const char *const map[][2] = {
        {"decoder_block", "model_type"}, {"vocab_size", "vocab_size"}, {"base_emb_dim", "hidden_size"},
        {"base_num_query_heads", "num_attention_heads"}, {"base_num_kv_heads", "num_key_value_heads"},
        {"head_dim", "head_dim"}, {"base_mlp_dim", "intermediate_size"},
        {"base_num_decoder_layers", "num_hidden_layers"}, {"mlp_activations", "hidden_act"},
        {"logits_via_embedding", "tie_word_embeddings"}, {"normalization_layer_epsilon", "rms_norm_eps"},
        {"rope_max_timescale", "rope_theta"}, {"rope_type", "rope_scaling"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i][0], key) == 0) return map[i][1];
    return key;
}

/* See trainer.h. */
mt_status mt_trainer_check_checkpoint_dir(const mt_train_config *cfg, const char *key, const char *dir, int compare) {
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return mt_set_error(MT_ERR_IO, "key '%s': checkpoint directory '%s' does not exist (%s)", key, dir,
                            strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return mt_set_error(MT_ERR_IO, "key '%s': '%s' is not a directory (give the checkpoint directory, "
                            "e.g. .../checkpoints/step_N)", key, dir);
    char base[256];
    base_name(dir, base, sizeof base);
    const size_t bl = strlen(base);
    if (bl > 4 && strcmp(base + bl - 4, ".tmp") == 0) { /* step_<N>.tmp: a save that did not finish */
        char parent[MT_PATH], newest[MT_PATH + 40] = "";
        snprintf(parent, sizeof parent, "%s", dir);
        size_t pl = strlen(parent);
        while (pl > 1 && parent[pl - 1] == '/') parent[--pl] = '\0';
        char *slash = strrchr(parent, '/');
        if (slash) *slash = '\0';
        else snprintf(parent, sizeof parent, ".");
        const int64_t n = latest_checkpoint(parent[0] ? parent : "/");
        if (n >= 0) snprintf(newest, sizeof newest, "; the newest complete one there is %s/step_%" PRId64, parent, n);
        return mt_set_error(MT_ERR_INVALID, "key '%s': '%s' is an incomplete checkpoint (a write that did not "
                            "finish: a checkpoint is written to step_<N>.tmp/ and renamed to step_<N>/ only when "
                            "complete)%s", key, dir, newest);
    }
    if (!compare) return MT_OK;
    char path[MT_PATH];
    if (!path_join(path, sizeof path, dir, "config.json")) return mt_set_error(MT_ERR_IO, "path too long: '%s'", dir);
    if (stat(path, &sb) != 0)
        return mt_set_error(MT_ERR_IO, "key '%s': '%s' is missing: a checkpoint directory holds config.json, "
                            "model.safetensors and train_state.safetensors", key, path);
    mt_model_config ck;
    MT_TRY(mt_hf_config_read(path, &ck));
    char va[128], vb[128];
    const mt_config_key *k = mt_model_config_diff(&cfg->model, &ck, NULL, va, vb, sizeof va);
    if (k)
        return mt_set_error(MT_ERR_INVALID, "%s: field '%s' gives %s = %s, but the configured model '%s' has "
                            "%s = %s: resume with the model the checkpoint was written with", path,
                            hf_field(k->name), k->name, vb, cfg->model.model_name, k->name, va);
    return MT_OK;
}

/* mt_checkpoint_load_model; under fsdp through a full host buffer of which this rank
 * keeps its shard. */
static mt_status load_model_params(mt_trainer *t, const char *dir) {
    if (!t->gs.params_sharded) return mt_checkpoint_load_model(dir, t->model);
    float *full = malloc(sizeof(float) * (size_t)t->numel);
    if (!full) return mt_set_error(MT_ERR_OOM, "fsdp: cannot allocate %lld floats", (long long)t->numel);
    mt_status st = mt_model_fsdp_bind_full(t->model, full);
    if (st == MT_OK) {
        st = mt_checkpoint_load_model(dir, t->model);
        mt_model_fsdp_bind_full(t->model, NULL);
    }
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
    mt_status st = setup_mesh(t, &kind_caps, kind_name(cfg->backend));
    if (st == MT_OK) st = mt_trainer_select_backend(cfg, &t->be);
    if (st == MT_OK) st = mt_plan_new(&t->host_plan);
    if (st == MT_OK)
        st = build_plan(cfg, t->be, &t->model, &t->plan, &t->opt, &t->gs, t->mesh, t->mesh->dims, t->host_plan,
                        full_grads);
    if (st == MT_OK) st = open_loader(&t->train, cfg, "train", dp_rank(t->mesh), dp_size(t->mesh));
    if (st == MT_OK && cfg->eval_interval > 0)
        st = open_loader(&t->val, cfg, "val", dp_rank(t->mesh), dp_size(t->mesh));
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
            if (st == MT_OK) st = check_checkpoint_identity(t, cfg->load_checkpoint);
            if (st == MT_OK) st = load_model_params(t, cfg->load_checkpoint);
            if (st == MT_OK) st = load_train_state(t, cfg->load_checkpoint);
            t->resumed = 1;
        } else if (cfg->load_parameters_path[0]) {
            st = mt_trainer_check_checkpoint_dir(cfg, "load_parameters_path", cfg->load_parameters_path, 0);
            if (st == MT_OK) st = load_model_params(t, cfg->load_parameters_path);
        } else {
            st = mt_model_init_params(t->model, (uint64_t)cfg->seed);
        }
    }
    if (st == MT_OK) {
        t->sched = mt_lr_schedule_make(cfg->learning_rate, cfg->warmup_steps_fraction,
                                       cfg->cosine_learning_rate_final_fraction, cfg->steps);
        t->flops_per_token = mt_flops_per_token(&cfg->model, cfg->max_target_length);
        t->peak_flops = t->be->caps.peak_flops;
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
    if (t->have_host_arena) mt_arena_destroy(&t->host_arena);
    mt_plan_free(t->host_plan);
    free(t->params);
    free(t->tokens);
    free(t->labels);
    free(t->sparams);
    mt_grad_sync_free(&t->gs);
    mt_mesh_free(t->mesh);
    mt_backend_free(t->be); /* after every buffer it allocated (the arena) */
    free(t);
}

int64_t mt_trainer_step_count(const mt_trainer *t) { return t->step; }
mt_model *mt_trainer_model(mt_trainer *t) { return t->model; }
const mt_train_config *mt_trainer_config(const mt_trainer *t) { return &t->cfg; }
const mt_plan *mt_trainer_get_plan(const mt_trainer *t) { return t->plan; }

int mt_trainer_world_rank(const mt_trainer *t) { return t->mesh->rank; }

static mt_status chunked_pass(mt_trainer *t, float inv, double *norm, float lr, float clip, float *host);

mt_status mt_trainer_gather_grad(mt_trainer *t, float *host) {
    if (t->chunked_grad) return chunked_pass(t, t->last_inv_count, NULL, 0.0f, 0.0f, host);
    if (!t->last_grad) return mt_set_error(MT_ERR_INVALID, "mt_trainer_gather_grad: no step has run");
    if (t->gs.zero1) return mt_grad_sync_gather(&t->gs, t->last_grad, host);
    MT_TRY(t->be->ops->copy_to_host(t->be, host, t->last_grad, (size_t)t->numel * sizeof(float)));
    return MT_OK;
}

/* Bytes of one all-reduce of S bytes on T ranks (parallel/comm.h accounting). */
static uint64_t ar_bytes(uint64_t S, uint64_t T) { return T > 1 ? 2 * (T - 1) * S / T : 0; }

/* Tensor-axis bytes of one micro-batch's forward + backward (models/model.h, all
 * tensors kept on the device; a remat policy that recomputes o_proj / mlpwo or the
 * q/k/v projections adds collectives this formula does not count): per layer the
 * o_proj and down_proj outputs and the two column-parallel input gradients (4
 * all-reduces of N x D floats; with tensor_sequence_parallelism 10 all-gathers /
 * reduce-scatters plus the final hidden state's all-gather); per loss tile the row
 * maxima (R floats) and the sum-exp / label logits (2R doubles); dh (N x D floats). */
static uint64_t tensor_model_bytes(const mt_trainer *t) {
    const uint64_t T = (uint64_t)t->mesh->dims[MT_AXIS_TENSOR];
    if (T <= 1) return 0;
    const int64_t C = t->mesh->dims[MT_AXIS_CONTEXT];
    const int64_t N = t->cfg.per_device_batch_size * t->cfg.max_target_length / C, D = t->cfg.model.emb_dim;
    const int64_t L = t->cfg.model.num_decoder_layers;
    int64_t K = t->cfg.num_vocab_tiling;
    if (K > N) K = N;
    const uint64_t ND4 = 4 * (uint64_t)(N * D);
    /* sequence parallelism (models/model.h): per layer 4 all-gathers / reduce-scatters
     * in the forward and 6 in the backward, (T - 1) / T of N x D floats each, plus the
     * final hidden state all-gathered; dh is still all-reduced by the loss */
    uint64_t b = t->cfg.tensor_sequence_parallelism ? 10 * (uint64_t)L * ((T - 1) * ND4 / T) + (T - 1) * ND4 / T
                                                    : 4 * (uint64_t)L * ar_bytes(ND4, T);
    b += ar_bytes(ND4, T);
    for (int64_t k = 0; k < K; k++) {
        const uint64_t R = (uint64_t)((k + 1) * N / K - k * N / K);
        b += ar_bytes(4 * R, T) + ar_bytes(16 * R, T);
    }
    return b;
}

/* Context-axis bytes of one micro-batch (models/model.h, all tensors kept): per layer
 * K and V all-gathered in the forward and again in the backward, dK and dV
 * reduce-scattered: 6 collectives moving (C - 1) x this rank's B x 2Tc x KVD floats
 * (blk); ring: (C - 1) x (2 + 4) blocks sent plus dK, dV sent home. */
static uint64_t context_model_bytes(const mt_trainer *t) {
    const int64_t C = t->mesh->dims[MT_AXIS_CONTEXT], T = t->mesh->dims[MT_AXIS_TENSOR];
    if (C <= 1) return 0;
    const int64_t rows = t->cfg.per_device_batch_size * t->cfg.max_target_length / C;
    const int64_t kvd = t->cfg.model.num_kv_heads / T * t->cfg.model.head_dim;
    const uint64_t blk = 4 * (uint64_t)(rows * kvd), L = (uint64_t)t->cfg.model.num_decoder_layers;
    if (t->cfg.context_parallel_strategy == 1) /* ring: (C-1) steps of K,V forward, K,V,dK,dV backward, dK,dV home */
        return L * ((uint64_t)(C - 1) * 6 * blk + 2 * blk);
    return 6 * L * (uint64_t)(C - 1) * blk;
}

void mt_trainer_step_bytes(const mt_trainer *t, uint64_t *measured, uint64_t *formula) {
    const uint64_t n = (uint64_t)t->gs.n;
    const uint64_t scalar = ar_bytes(8, n); /* one 8-byte all-reduce on data x fsdp */
    if (measured) *measured = t->last_step_bytes;
    if (formula)
        *formula = mt_grad_sync_step_bytes(&t->gs, t->cfg.gradient_accumulation_steps) +
                   (t->gs.zero1 ? 3 : 2) * scalar +
                   (uint64_t)t->cfg.gradient_accumulation_steps *
                       (tensor_model_bytes(t) + context_model_bytes(t) +
                        4 * (uint64_t)mt_model_fsdp_gather_floats(t->model)); /* fsdp parameter all-gathers */
}

/* ----------------------------------------------------------------- a step ---- */

/* ------------------------------------------------------- the parallel step ----
 * Micro-batch gradients of the summed token loss go through the gradient sync
 * (parallel/zero1.h: grad_dtype accumulator, all-reduce or ZeRO-1 reduce-scatter);
 * loss sums and token counts are all-reduced over data x fsdp x context, so the step's loss is
 * the token-weighted mean over all micro-batches and ranks; the reduced gradient is
 * divided by the global token count; the clip norm is the global one (the shards'
 * squared norms all-reduced under ZeRO-1); AdamW updates this rank's shard and the
 * updated parameters are all-gathered (under fsdp only over data x context, into this
 * rank's fsdp shard). A world of one runs the same code with no
 * communication. */

/* The gradient read chunk by chunk (parallel/zero1.h MT_GRAD_WINDOW_ACC without
 * ZeRO-1: no full fp32 gradient exists), each chunk a run of whole parameters scaled
 * by inv: with norm, *norm = the global norm (the same sums in the same order as
 * mt_grad_global_norm over the full buffer); with host, the gradient copied to
 * host[numel]; else AdamW on each chunk's parameters (moments at the same offsets). */
static mt_status chunked_pass(mt_trainer *t, float inv, double *norm, float lr, float clip, float *host) {
    const mt_param_info *sp = t->sparams;
    const int np = t->nsparams;
    mt_param_info *rel = malloc(sizeof(mt_param_info) * (size_t)(np > 0 ? np : 1));
    if (!rel) return mt_set_error(MT_ERR_OOM, "trainer: out of memory");
    float *params = mt_model_params(t->model);
    double ss = 0.0;
    mt_status st = MT_OK;
    for (int i0 = 0; st == MT_OK && i0 < np;) {
        const int64_t a = sp[i0].offset;
        int i1 = i0 + 1;
        while (i1 < np && sp[i1].offset + sp[i1].numel - a <= t->gs.chunk) i1++;
        const int64_t n = sp[i1 - 1].offset + sp[i1 - 1].numel - a;
        float *buf = NULL;
        st = mt_grad_sync_read(&t->gs, a, n, &buf);
        if (st != MT_OK) break;
        st = t->be->ops->scale(t->be, buf, inv, n);
        if (st != MT_OK) break;
        if (norm) {
            for (int i = i0; st == MT_OK && i < i1; i++) {
                double part = 0.0;
                st = t->be->ops->sumsq(t->be, buf + (sp[i].offset - a), sp[i].numel, &part);
                ss += part;
            }
        } else if (host) {
            st = t->be->ops->copy_to_host(t->be, host + a, buf, (size_t)n * sizeof(float));
        } else {
            mt_adamw sub = t->opt; /* the moments of [a, a + n) */
            sub.m += a;
            sub.v += a;
            sub.numel = n;
            for (int i = i0; i < i1; i++) {
                rel[i - i0] = sp[i];
                rel[i - i0].offset -= a;
            }
            st = mt_adamw_step(&sub, rel, i1 - i0, params + a, buf, lr, clip, t->step + 1);
        }
        i0 = i1;
    }
    free(rel);
    if (norm) *norm = sqrt(ss);
    return st;
}

mt_status mt_trainer_step(mt_trainer *t, mt_step_metrics *m) {
    const double t0 = mt_time_now();
    mt_backend *be = t->be;
    float *grads = mt_model_grads(t->model); /* NULL with gradient windows (parallel/zero1.h) */
    const size_t gbytes = (size_t)t->numel * sizeof(float);
    mt_comm *dp = t->mesh->grad;
    const uint64_t bytes0 = mt_mesh_bytes_total(t->mesh);
    double loss_sum = 0.0;
    int64_t count = 0;
    if (grads) MT_TRY(be->ops->zero(be, grads, gbytes));
    for (int64_t mb = 0; mb < t->cfg.gradient_accumulation_steps; mb++) {
        mt_grad_sync_set_microbatch(&t->gs, mb);
        MT_TRY(mt_data_next(t->train, t->tokens, t->labels));
        double ls = 0.0;
        int64_t c = 0;
        MT_TRY(mt_model_forward_backward(t->model, t->tokens, t->labels, 1.0f, &ls, &c));
        loss_sum += ls;
        count += c;
        int zero = 0;
        MT_TRY(mt_grad_sync_microbatch(&t->gs, grads, mb, &zero));
        if (zero && grads && mb + 1 < t->cfg.gradient_accumulation_steps) MT_TRY(be->ops->zero(be, grads, gbytes));
    }
    MT_TRY(mt_comm_all_reduce(dp, &loss_sum, 1, MT_COMM_F64));
    MT_TRY(mt_comm_all_reduce(dp, &count, 1, MT_COMM_I64));
    if (count <= 0)
        return mt_set_error(MT_ERR_RUNTIME, "step %" PRId64 ": no labelled token in the batch", t->step + 1);
    float *g = NULL;
    MT_TRY(mt_grad_sync_finish(&t->gs, grads, &g));
    const float inv = (float)(1.0 / (double)count);
    double norm = 0.0;
    t->last_grad = g;
    t->last_inv_count = inv;
    t->chunked_grad = g == NULL;
    if (g) {
        MT_TRY(be->ops->scale(be, g, inv, mt_grad_sync_opt_numel(&t->gs)));
        MT_TRY(mt_grad_global_norm(be, g, t->sparams, t->nsparams, &norm));
    } else {
        MT_TRY(chunked_pass(t, inv, &norm, 0.0f, 0.0f, NULL));
    }
    if (t->gs.zero1) {
        double sq = norm * norm;
        MT_TRY(mt_comm_all_reduce(dp, &sq, 1, MT_COMM_F64));
        norm = sqrt(sq);
    }
    if (!isfinite(norm))
        return mt_set_error(MT_ERR_RUNTIME, "step %" PRId64 ": gradient norm is %g (loss %g)", t->step + 1,
                            norm, loss_sum / (double)count);
    const double clip = mt_clip_scale(norm, t->cfg.gradient_clipping_threshold);
    const double lr = mt_lr_schedule_at(&t->sched, t->step);
    float *params = mt_model_params(t->model);
    /* fsdp: the model holds only its fsdp shard [flo, fhi), the optimizer's [lo, hi) inside
     * it (without fsdp flo = 0) */
    if (g)
        MT_TRY(mt_adamw_step(&t->opt, t->sparams, t->nsparams, params + (t->gs.lo - t->gs.flo), g,
                             (float)lr, (float)clip, t->step + 1));
    else
        MT_TRY(chunked_pass(t, inv, NULL, (float)lr, (float)clip, NULL));
    MT_TRY(mt_grad_sync_gather_params(&t->gs, params));
    t->last_step_bytes = mt_mesh_bytes_total(t->mesh) - bytes0;
    MT_TRY(be->ops->sync(be));
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
    /* each validation window at most once (a wrap would count tokens twice) */
    const int64_t windows = mt_data_windows_per_epoch(t->val);
    const int64_t n = t->cfg.eval_steps < windows ? t->cfg.eval_steps : windows;
    for (int64_t i = 0; i < n; i++) {
        MT_TRY(mt_data_next(t->val, t->tokens, t->labels));
        double ls = 0.0;
        int64_t c = 0;
        MT_TRY(mt_model_loss(t->model, t->tokens, t->labels, &ls, &c));
        sum += ls;
        count += c;
    }
    MT_TRY(mt_comm_all_reduce(t->mesh->grad, &sum, 1, MT_COMM_F64));
    MT_TRY(mt_comm_all_reduce(t->mesh->grad, &count, 1, MT_COMM_I64));
    *val_loss = count > 0 ? sum / (double)count : NAN;
    *val_tokens = count;
    return MT_OK;
}

/* ------------------------------------------------------------ checkpoints ---- */

/* train_state.safetensors of the current step into dir (rank 0; the other ranks pass
 * dir = NULL and join the gather), recording ckid and t->run_id. */
static mt_status write_train_state(mt_trainer *t, const char *dir, const char *ckid) {
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
    snprintf(dpw, sizeof dpw, "%d", dp_size(t->mesh));
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

static mt_status save_checkpoint(mt_trainer *t, char *out_path, size_t out_size);

mt_status mt_trainer_save_checkpoint(mt_trainer *t, char *out_path, size_t out_size) {
    mt_status st;
    if (t->gs.params_sharded) { /* fsdp: every rank joins the gather of the shards, rank 0 writes them */
        float *full = malloc(sizeof(float) * (size_t)t->numel);
        if (!full) return mt_set_error(MT_ERR_OOM, "fsdp: cannot allocate %lld floats", (long long)t->numel);
        st = mt_trainer_gather_params(t, full);
        if (st == MT_OK) st = mt_model_fsdp_bind_full(t->model, full);
        if (st == MT_OK) {
            st = save_checkpoint(t, out_path, out_size);
            mt_model_fsdp_bind_full(t->model, NULL);
        }
        free(full);
    } else {
        st = save_checkpoint(t, out_path, out_size);
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

static mt_status save_checkpoint(mt_trainer *t, char *out_path, size_t out_size) {
    char ckdir[MT_PATH], final[MT_PATH], tmp[MT_PATH + 8], old[MT_PATH + 8], name[48];
    if (t->mesh->rank != 0) { /* joins rank 0's gather of the optimizer shards; writes nothing */
        if (out_path && out_size) out_path[0] = '\0';
        MT_TRY(write_train_state(t, NULL, NULL));
        return mt_comm_barrier_wait(t->mesh->all, 3600.0); /* while rank 0 writes */
    }
    snprintf(name, sizeof name, "step_%" PRId64, t->step);
    if (!path_join(ckdir, sizeof ckdir, t->run_dir, "checkpoints") || !path_join(final, sizeof final, ckdir, name))
        return mt_set_error(MT_ERR_IO, "checkpoint path too long under '%s'", t->run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    snprintf(old, sizeof old, "%s.old", final);
    MT_TRY(mkdir_p(ckdir));
    MT_TRY(remove_flat_dir(tmp));
    MT_TRY(mkdir_p(tmp));
    /* both files record the step, the run's history and this save (see "checkpoint identity") */
    char ckid[MT_ID_LEN];
    if (!t->run_id[0]) new_id(t->run_id); /* a save outside mt_trainer_run (library sessions) */
    new_id(ckid);
    const char *meta[] = {"meshtrain_step", name + 5, "meshtrain_run_id", t->run_id, "meshtrain_checkpoint_id", ckid,
                          NULL};
    mt_status ws = mt_checkpoint_save_model_meta(tmp, t->model, MT_F32, meta);
    if (ws == MT_OK) ws = write_train_state(t, tmp, ckid);
    if (ws != MT_OK) {
        /* Writing into the directory just made failed (disk full, I/O error, short
         * write): a runtime failure (exit 1), and no half checkpoint is left. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mt_last_error());
        (void)remove_flat_dir(tmp);
        return mt_set_error(ws == MT_ERR_OOM ? MT_ERR_OOM : MT_ERR_RUNTIME,
                            "writing checkpoint '%s' failed (the partial '%s' was removed): %s", final, tmp, msg);
    }
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
    return mt_comm_barrier_wait(t->mesh->all, 3600.0); /* the other ranks wait for the files */
}

/* -------------------------------------------------------------------- run ---- */

/* Does the directory hold any entry? */
static int dir_has_entries(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    int any = 0;
    struct dirent *e;
    while (!any && (e = readdir(d))) any = strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return any;
}

/* The smallest step of the complete rows of metrics.jsonl (lines ending in a newline
 * and starting {"step": N, as mt_metrics_open_resume keeps them) with N <= upto, or -1. */
static int64_t first_metrics_row(const char *path, int64_t upto) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int64_t first = -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        if (line[len - 1] != '\n' || strncmp(line, "{\"step\": ", 9) != 0) continue;
        char *end = NULL;
        const long long v = strtoll(line + 9, &end, 10);
        if (end != line + 9 && v >= 0 && v <= upto && (first < 0 || v < first)) first = v;
    }
    free(line);
    fclose(f);
    return first;
}

/* Resuming into run directory t->run_dir (checkpoints ck, metrics mpath) continues
 * load_checkpoint's own history (see "checkpoint identity"): every checkpoint there
 * carries load_checkpoint's run_id (or, without ids, load_checkpoint is one of them),
 * and without any checkpoint there metrics.jsonl keeps no row of another run (no row
 * at or before the resumed step). Errors: MT_ERR_INVALID naming what belongs to
 * another history, MT_ERR_OOM. */
static mt_status check_history(const mt_trainer *t, const char *ck, const char *mpath) {
    const mt_train_config *c = &t->cfg;
    int64_t *steps = NULL;
    int n = 0;
    MT_TRY(scan_checkpoints(ck, &steps, &n));
    if (n == 0) {
        const int64_t first = first_metrics_row(mpath, t->step);
        if (first >= 0)
            return mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s resumes at step %" PRId64 " into %s, whose "
                                "metrics.jsonl holds rows of another run from step %" PRId64 " on (and no "
                                "checkpoint): they would be kept in front of this history. Write to another "
                                "run_name, or remove %s", c->load_checkpoint, t->step, t->run_dir, first, mpath);
        return MT_OK;
    }
    /* load_checkpoint's directory is the run's checkpoints/ (for checkpoints without ids) */
    char lreal[4096], creal[4096];
    int same_dir = realpath(c->load_checkpoint, lreal) && realpath(ck, creal);
    if (same_dir) {
        char *slash = strrchr(lreal, '/');
        if (slash && slash != lreal) *slash = '\0';
        same_dir = strcmp(lreal, creal) == 0;
    }
    int64_t *foreign = malloc(sizeof(int64_t) * (size_t)n);
    if (!foreign) {
        free(steps);
        return mt_set_error(MT_ERR_OOM, "out of memory");
    }
    int nf = 0;
    char other[MT_ID_LEN] = "";
    for (int i = 0; i < n; i++) {
        char name[48], dir[MT_PATH], ts[MT_PATH];
        ck_ident id = {-1, "", ""};
        snprintf(name, sizeof name, "step_%" PRId64, steps[i]);
        if (path_join(dir, sizeof dir, ck, name) && path_join(ts, sizeof ts, dir, "train_state.safetensors") &&
            read_ident(ts, "", &id) != MT_OK)
            id.run_id[0] = '\0'; /* unreadable: judged by where load_checkpoint is */
        const int same = id.run_id[0] && t->resume_run_id[0] ? strcmp(id.run_id, t->resume_run_id) == 0 : same_dir;
        if (!same) {
            foreign[nf++] = steps[i];
            if (!other[0]) snprintf(other, sizeof other, "%s", id.run_id);
        }
    }
    const int64_t newest = steps[n - 1];
    free(steps);
    mt_status st = MT_OK;
    if (nf > 0) {
        char list[256], ids[160] = "";
        format_steps(foreign, nf, list, sizeof list);
        if (other[0] && t->resume_run_id[0])
            snprintf(ids, sizeof ids, ", run id %s; load_checkpoint's is %s", other, t->resume_run_id);
        st = mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s is not a checkpoint of run '%s': %s holds "
                          "checkpoint(s) of another history (%s%s); resuming into it would mix two runs' metrics "
                          "and checkpoints. Resume run '%s' from its own newest checkpoint (load_checkpoint=%s/step_%"
                          PRId64 "), or start a new run_name from %s", c->load_checkpoint, c->run_name, ck, list, ids,
                          c->run_name, ck, newest, c->load_checkpoint);
    }
    free(foreign);
    return st;
}

static mt_status check_outputs_here(const mt_trainer *t) {
    const mt_train_config *c = &t->cfg;
    struct stat sb;
    if (!c->base_output_directory[0])
        return mt_set_error(MT_ERR_INVALID, "key 'base_output_directory' is empty: outputs go to "
                            "<base_output_directory>/<run_name>/ (use '.' for the current directory)");
    if (stat(c->base_output_directory, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return mt_set_error(MT_ERR_INVALID, "key 'base_output_directory' = '%s' exists and is not a directory",
                            c->base_output_directory);
    /* The nearest existing ancestor of the run directory must be writable. */
    char anc[MT_PATH];
    snprintf(anc, sizeof anc, "%s", t->run_dir);
    while (stat(anc, &sb) != 0) {
        char *slash = strrchr(anc, '/');
        if (!slash) {
            snprintf(anc, sizeof anc, ".");
            break;
        }
        if (slash == anc) slash[1] = '\0';
        else *slash = '\0';
        if (strcmp(anc, "/") == 0) break;
    }
    if (stat(anc, &sb) == 0 && S_ISDIR(sb.st_mode) && access(anc, W_OK | X_OK) != 0)
        return mt_set_error(MT_ERR_IO, "cannot write the run directory '%s': '%s' is not writable (%s)", t->run_dir,
                            anc, strerror(errno));
    if (stat(t->run_dir, &sb) != 0) return MT_OK; /* a new run directory */
    if (!S_ISDIR(sb.st_mode))
        return mt_set_error(MT_ERR_INVALID, "run directory '%s' exists and is not a directory (run_name '%s')",
                            t->run_dir, c->run_name);
    char ck[MT_PATH], mpath[MT_PATH];
    if (!path_join(ck, sizeof ck, t->run_dir, "checkpoints") || !path_join(mpath, sizeof mpath, t->run_dir, "metrics.jsonl"))
        return mt_set_error(MT_ERR_INVALID, "base_output_directory + run_name is too long");
    const int has_ck = stat(ck, &sb) == 0;
    if (has_ck && !S_ISDIR(sb.st_mode))
        return mt_set_error(MT_ERR_INVALID, "'%s' exists and is not a directory: checkpoints could not be written "
                            "there (remove it or choose another run_name)", ck);
    const int has_metrics = stat(mpath, &sb) == 0;
    if (has_metrics && !S_ISREG(sb.st_mode))
        return mt_set_error(MT_ERR_INVALID, "'%s' exists and is not a file", mpath);
    /* Found now, a directory that cannot be written is bad input (exit 2); once the run
     * is under way a failed write is a runtime failure (mt_trainer_run). */
    if (access(t->run_dir, W_OK | X_OK) != 0)
        return mt_set_error(MT_ERR_IO, "cannot write the run directory '%s' (%s)", t->run_dir, strerror(errno));
    if (has_ck && access(ck, W_OK | X_OK) != 0)
        return mt_set_error(MT_ERR_IO, "cannot write '%s' (%s): checkpoints could not be saved", ck, strerror(errno));
    if (c->load_checkpoint[0]) { /* resuming: metrics are cut back to the resumed step */
        /* The run directory's checkpoints and metrics must be load_checkpoint's history. */
        MT_TRY(check_history(t, ck, mpath));
        /* Checkpoints after the resumed step belong to the history being replaced: the
         * new run would overwrite some of them and leave the others, and a later resume
         * from one of those would mix the two histories. Refuse before writing. */
        const int64_t newest = has_ck && t->step < c->steps ? latest_checkpoint(ck) : -1;
        if (newest > t->step) {
            char later[512];
            const int count = later_checkpoints(ck, t->step, later, sizeof later);
            return mt_set_error(MT_ERR_INVALID, "load_checkpoint=%s resumes at step %" PRId64 " but %s already holds "
                                "%d later checkpoint(s) (%s) of run '%s': training on would overwrite some of them "
                                "and keep the others, mixing two histories. Resume from the latest (load_checkpoint=%s/step_%"
                                PRId64 "), write the new history to another run_name, or remove the later "
                                "checkpoints", c->load_checkpoint, t->step, ck, count, later, c->run_name, ck, newest);
        }
        return MT_OK;
    }
    if (has_metrics || (has_ck && dir_has_entries(ck))) {
        const int64_t n = latest_checkpoint(ck);
        if (n >= 0)
            return mt_set_error(MT_ERR_INVALID, "run directory %s already holds a run; resume with "
                                "load_checkpoint=%s/step_%" PRId64 " or choose another run_name", t->run_dir, ck, n);
        char what[160] = "";
        if (has_ck) { /* name what is there: it holds no complete checkpoint */
            DIR *d = opendir(ck);
            struct dirent *e;
            size_t used = 0;
            int shown = 0;
            while (d && (e = readdir(d)) && shown < 4) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
                int w = snprintf(what + used, sizeof what - used, "%s%.40s", shown ? ", " : "; checkpoints/ holds ",
                                 e->d_name);
                if (w < 0 || (size_t)w >= sizeof what - used) break;
                used += (size_t)w;
                shown++;
            }
            if (d) closedir(d);
            if (shown) snprintf(what + used, sizeof what - used, "%s, none of them a complete checkpoint",
                                shown == 4 ? ", ..." : "");
        }
        return mt_set_error(MT_ERR_INVALID, "run directory %s already holds a run (no complete checkpoint to "
                            "resume from%s); remove it or choose another run_name", t->run_dir, what);
    }
    return MT_OK;
}

mt_status mt_trainer_check_outputs(mt_trainer *t) {
    /* World rank 0 writes the run directory: it checks, and every rank learns the
     * verdict before any rank goes on (so no rank sees rank 0's first writes). */
    mt_status st = t->mesh->rank == 0 ? check_outputs_here(t) : MT_OK;
    int64_t bad = st != MT_OK;
    if (t->mesh->dims[0] * t->mesh->dims[1] * t->mesh->dims[2] * t->mesh->dims[3] > 1) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", mt_last_error());
        MT_TRY(mt_comm_all_reduce(t->mesh->all, &bad, 1, MT_COMM_I64));
        if (st != MT_OK) return mt_set_error(st, "%s", msg);
        if (bad) return mt_set_error(MT_ERR_INVALID, "rank 0 refused the run directory '%s'", t->run_dir);
    }
    return st;
}

mt_status mt_trainer_run(mt_trainer *t, mt_train_callback cb, void *user) {
    /* Under mpirun only world rank 0 writes the run directory and calls cb. */
    const int lead = t->mesh->rank == 0;
    mt_metrics_writer *mw = NULL;
    if (lead) {
        char mpath[MT_PATH], ck[MT_PATH];
        if (!path_join(mpath, sizeof mpath, t->run_dir, "metrics.jsonl") ||
            !path_join(ck, sizeof ck, t->run_dir, "checkpoints"))
            return mt_set_error(MT_ERR_IO, "path too long: '%s'", t->run_dir);
        /* The history this run's checkpoints carry (see "checkpoint identity"):
         * load_checkpoint's when resuming in place (the run directory holds its
         * history's checkpoints: mt_trainer_check_outputs), else a new one. */
        if (t->resumed && t->resume_run_id[0] && latest_checkpoint(ck) >= 0)
            memcpy(t->run_id, t->resume_run_id, sizeof t->run_id);
        else
            new_id(t->run_id);
        mt_status ws = mkdir_p(t->run_dir);
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
