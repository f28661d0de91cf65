/* train/rundir.c: the run directory policy of the trainer: checkpoint directory
 * discovery, the checkpoint identity checks of a resume, run_id, and the refusal to
 * overwrite another run's outputs (metrics.jsonl history against the checkpoints). */
#define _XOPEN_SOURCE 700 /* realpath */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/checkpoint.h"
#include "models/safetensors.h"
#include "runtime/dtype.h"
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/timer.h"
#include "train/trainer_private.h"

/* ------------------------------------------------------------ file helpers ---- */


/* Remove a directory of plain files (a checkpoint directory); missing is fine, and a
 * plain file of that name is removed. */
mt_status mt_rundir_remove_flat_dir(const char *path) {
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
        if (!mt_trainer_path_join(f, sizeof f, path, e->d_name) || unlink(f) != 0) {
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
void mt_rundir_new_id(char out[MT_ID_LEN]) {
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
    if (!mt_trainer_path_join(dir, sizeof dir, ckdir, name) || stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (!mt_trainer_path_join(f, sizeof f, dir, files[i]) || stat(f, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
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
int64_t mt_rundir_latest_checkpoint(const char *ckdir) {
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
mt_status mt_rundir_check_identity(mt_trainer *t, const char *dir) {
    char ts[MT_PATH], mp[MT_PATH], base[256];
    struct stat sb;
    if (!mt_trainer_path_join(ts, sizeof ts, dir, "train_state.safetensors") || !mt_trainer_path_join(mp, sizeof mp, dir, "model.safetensors"))
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
        const int64_t n = mt_rundir_latest_checkpoint(parent[0] ? parent : "/");
        if (n >= 0) snprintf(newest, sizeof newest, "; the newest complete one there is %s/step_%" PRId64, parent, n);
        return mt_set_error(MT_ERR_INVALID, "key '%s': '%s' is an incomplete checkpoint (a write that did not "
                            "finish: a checkpoint is written to step_<N>.tmp/ and renamed to step_<N>/ only when "
                            "complete)%s", key, dir, newest);
    }
    if (!compare) return MT_OK;
    char path[MT_PATH];
    if (!mt_trainer_path_join(path, sizeof path, dir, "config.json")) return mt_set_error(MT_ERR_IO, "path too long: '%s'", dir);
    const int resume = compare == 1;
    if (stat(path, &sb) != 0) {
        if (!resume) return MT_OK; /* weights alone: mt_checkpoint_load_model checks their shapes */
        return mt_set_error(MT_ERR_IO, "key '%s': '%s' is missing: a checkpoint directory holds config.json, "
                            "model.safetensors and train_state.safetensors", key, path);
    }
    mt_model_config ck;
    MT_TRY(mt_hf_config_read(path, &ck));
    char va[128], vb[128];
    const mt_config_key *k = mt_model_config_diff(&cfg->model, &ck, NULL, va, vb, sizeof va);
    if (!k) return MT_OK;
    const mt_config_key *name_key = mt_config_key_find("model_name");
    const int default_name = name_key && name_key->def && strcmp(cfg->model.model_name, name_key->def) == 0;
    char hint[512] = "";
    if (strcmp(k->name, "decoder_block") == 0)
        snprintf(hint, sizeof hint, " (config.json is a %s model: set model_name to a configs/models/<name>.yml "
                 "of that family%s%s%s)", vb, default_name ? "; model_name=" : "",
                 default_name ? cfg->model.model_name : "", default_name ? " is also the built-in default" : "");
    if (resume)
        return mt_set_error(MT_ERR_INVALID, "%s: field '%s' gives %s = %s, but the configured model '%s' has "
                            "%s = %s%s: resume with the model the checkpoint was written with", path,
                            mt_model_config_hf_field(k->name), k->name, vb, cfg->model.model_name, k->name, va, hint);
    return mt_set_error(MT_ERR_INVALID, "key '%s': %s: field '%s' gives %s = %s, but the configured model "
                        "(model_name = %s%s) has %s = %s%s: the run would train another model than the one "
                        "the weights were made for; set model_name (or the model key) to match the directory",
                        key, path, mt_model_config_hf_field(k->name), k->name, vb, cfg->model.model_name,
                        default_name ? ", the default" : "", k->name, va, hint);
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
        if (mt_trainer_path_join(dir, sizeof dir, ck, name) && mt_trainer_path_join(ts, sizeof ts, dir, "train_state.safetensors") &&
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

/* Can run_dir's missing directories be created? Each is made and removed again
 * (deepest first), so that a base_output_directory or run_name that cannot hold a run
 * (a read-only file system, /proc, a file in the way, no permission) is bad input found
 * at start-up, and nothing is left behind. Errors: MT_ERR_IO naming the key
 * (base_output_directory, or run_name when only the last component fails), the
 * directory and the reason. */
static mt_status probe_run_dir(const mt_train_config *c, const char *run_dir) {
    char buf[MT_PATH];
    snprintf(buf, sizeof buf, "%s", run_dir);
    size_t base_len = strlen(c->base_output_directory);
    while (base_len > 1 && c->base_output_directory[base_len - 1] == '/') base_len--;
    enum { PROBE_MAX = 256 };
    size_t made[PROBE_MAX];
    int nmade = 0;
    mt_status st = MT_OK;
    const size_t len = strlen(buf);
    for (size_t i = 1; i <= len && st == MT_OK && nmade < PROBE_MAX; i++) {
        if ((buf[i] != '/' && buf[i] != '\0') || buf[i - 1] == '/') continue;
        const char save = buf[i];
        buf[i] = '\0';
        struct stat sb;
        if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            if (mkdir(buf, 0755) == 0) {
                made[nmade++] = i;
            } else {
                const int e = errno;
                const int base = i <= base_len;
                st = mt_set_error(MT_ERR_IO, "key '%s' = '%s': cannot create directory '%s' (%s%s)",
                                  base ? "base_output_directory" : "run_name",
                                  base ? c->base_output_directory : c->run_name, buf, strerror(e),
                                  e == EEXIST ? ": a file is in the way" : "");
            }
        }
        buf[i] = save;
    }
    for (int k = nmade - 1; k >= 0; k--) {
        buf[made[k]] = '\0';
        rmdir(buf);
    }
    return st;
}

/* The refusal of a run directory whose lock `path` another process holds (exit 2). */
static mt_status busy_error(const mt_trainer *t, const char *path) {
    return mt_set_error(MT_ERR_INVALID, "run directory %s is in use by another meshtrain process (it holds '%s'): "
                        "wait for it to end or choose another run_name", t->run_dir, path);
}

/* Whether another process holds the run directory's lock (lock_run_dir), found without
 * creating anything: an existing <run_dir>/.lock is opened read-only and locked and
 * unlocked at once. Not called while this process holds it (a second open file of the
 * same lock would find this process's own flock). A lock that cannot be probed (no
 * file, no permission) is left to lock_run_dir. */
static mt_status check_not_busy(const mt_trainer *t) {
    char path[MT_PATH];
    if (t->have_lock || !mt_trainer_path_join(path, sizeof path, t->run_dir, ".lock")) return MT_OK;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return MT_OK;
    const int held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd); /* drops the probe's lock, if it took it */
    return held ? busy_error(t, path) : MT_OK;
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
    /* A directory another process trains in is reported first, whatever else it holds:
     * "already holds a run; resume with ..." would send the user into the same lock. */
    MT_TRY(check_not_busy(t));
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
    if (stat(anc, &sb) == 0 && S_ISDIR(sb.st_mode) && access(anc, W_OK | X_OK) != 0) {
        if (strcmp(anc, t->run_dir) == 0) /* the run directory itself exists and is read-only */
            return mt_set_error(MT_ERR_IO, "key 'run_name' = '%s': the run directory '%s' is not writable (%s)",
                                c->run_name, t->run_dir, strerror(errno));
        return mt_set_error(MT_ERR_IO, "key 'base_output_directory' = '%s': cannot write the run directory '%s': "
                            "'%s' is not writable (%s)", c->base_output_directory, t->run_dir, anc, strerror(errno));
    }
    if (stat(t->run_dir, &sb) != 0) return probe_run_dir(c, t->run_dir); /* a new run directory */
    if (!S_ISDIR(sb.st_mode))
        return mt_set_error(MT_ERR_INVALID, "run directory '%s' exists and is not a directory (run_name '%s')",
                            t->run_dir, c->run_name);
    char ck[MT_PATH], mpath[MT_PATH];
    if (!mt_trainer_path_join(ck, sizeof ck, t->run_dir, "checkpoints") || !mt_trainer_path_join(mpath, sizeof mpath, t->run_dir, "metrics.jsonl"))
        return mt_set_error(MT_ERR_INVALID, "base_output_directory + run_name is too long");
    const int has_ck = stat(ck, &sb) == 0;
    if (has_ck && !S_ISDIR(sb.st_mode))
        return mt_set_error(MT_ERR_INVALID, "'%s' exists and is not a directory: checkpoints could not be written "
                            "there (remove it or choose another run_name)", ck);
    const int has_metrics = stat(mpath, &sb) == 0;
    if (has_metrics && !S_ISREG(sb.st_mode))
        return mt_set_error(MT_ERR_INVALID, "'%s' exists and is not a file", mpath);
    /* An empty metrics.jsonl (a run that died in start-up, before its first row) holds no
     * run: without checkpoints the directory is started afresh. */
    const int has_rows = has_metrics && sb.st_size > 0;
    /* Found now, a directory that cannot be written is bad input (exit 2); once the run
     * is under way a failed write is a runtime failure (mt_trainer_run). */
    if (access(t->run_dir, W_OK | X_OK) != 0)
        return mt_set_error(MT_ERR_IO, "cannot write the run directory '%s' (%s)", t->run_dir, strerror(errno));
    if (has_ck && access(ck, W_OK | X_OK) != 0)
        return mt_set_error(MT_ERR_IO, "cannot write '%s' (%s): checkpoints could not be saved", ck, strerror(errno));
    if (c->load_checkpoint[0]) { /* resuming: metrics are cut back to the resumed step */
        /* Every row readable (a torn last one is dropped, with a warning, when the
         * file is rewritten: mt_metrics_open_resume); a corrupt one is bad input. */
        int64_t torn;
        if (has_metrics) MT_TRY(mt_metrics_check(mpath, &torn));
        /* The run directory's checkpoints and metrics must be load_checkpoint's history. */
        MT_TRY(check_history(t, ck, mpath));
        /* Checkpoints after the resumed step belong to the history being replaced: the
         * new run would overwrite some of them and leave the others, and a later resume
         * from one of those would mix the two histories. Refuse before writing. */
        const int64_t newest = has_ck && t->step < c->steps ? mt_rundir_latest_checkpoint(ck) : -1;
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
    if (has_rows || (has_ck && dir_has_entries(ck))) {
        const int64_t n = mt_rundir_latest_checkpoint(ck);
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

/* One process per run directory: an exclusive flock(2) on <run_dir>/.lock, held until
 * mt_trainer_free (or the process ends: the kernel drops it, so a killed run leaves no
 * stale lock). Two trains started at once into one run_name both pass the checks of
 * an empty directory; without the lock both wrote metrics and checkpoints over each
 * other. The directory is created for it (a run writes there first anyway); the file
 * stays, empty (a resume that writes nothing changes nothing). Errors:
 * MT_ERR_INVALID when another process holds it (exit 2: choose another run_name or wait
 * for that run), MT_ERR_IO when it cannot be created. */
static mt_status lock_run_dir(mt_trainer *t) {
    if (t->have_lock) return MT_OK;
    char path[MT_PATH];
    if (!mt_trainer_path_join(path, sizeof path, t->run_dir, ".lock"))
        return mt_set_error(MT_ERR_INVALID, "base_output_directory + run_name is too long");
    MT_TRY(mt_file_mkdir_p(t->run_dir));
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return mt_set_error(MT_ERR_IO, "cannot create the run directory's lock '%s' (%s)", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        close(fd);
        if (e == EWOULDBLOCK) return busy_error(t, path);
        return mt_set_error(MT_ERR_IO, "cannot lock '%s' (%s)", path, strerror(e));
    }
    t->lock_fd = fd;
    t->have_lock = 1;
    return MT_OK;
}

mt_status mt_trainer_check_outputs(mt_trainer *t) {
    /* World rank 0 writes the run directory: it checks, locks it (lock_run_dir) and checks
     * again under the lock (another process may have written between the two), and every
     * rank learns the verdict before any rank goes on (so no rank sees rank 0's first
     * writes). */
    mt_status st = MT_OK;
    if (t->mesh->rank == 0) {
        st = check_outputs_here(t);
        if (st == MT_OK) st = lock_run_dir(t);
        if (st == MT_OK) st = check_outputs_here(t);
    }
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
