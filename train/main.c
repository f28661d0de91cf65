/* train/main.c: the `meshtrain` command line (README.md, docs/configuration.md).
 *
 *   meshtrain train  CONFIG.yml [key=value ...]
 *   meshtrain sample CONFIG.yml load_checkpoint=DIR [key=value ...]
 *   meshtrain plan   CONFIG.yml [--json] [key=value ...]
 *   meshtrain estimate CONFIG.yml hbm_gib=N [--json] [per_device_batch_size=B] [NAME=ACTION ...] [key=value ...]
 *   meshtrain prepare --tokenizer TOK --output DIR [options] INPUT...   (scripts/prepare_data.py)
 *   meshtrain --help | meshtrain <command> --help
 *
 * A thin client of the library: it parses arguments, prints, and is the only place
 * that maps a status to an exit code (0 done, 1 runtime failure, 2 bad input), with
 * the message on stderr as "meshtrain: error: <mt_last_error()>". */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "models/checkpoint.h"
#include "models/model.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "runtime/log.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "train/config.h"
#include "train/estimate.h"
#include "train/metrics.h"
#include "train/report.h"
#include "train/sample.h"
#include "train/tokenizer.h"
#include "train/trainer.h"

static int fail(mt_status st) {
    fprintf(stderr, "meshtrain: error: %s\n", mt_last_error()[0] ? mt_last_error() : mt_status_str(st));
    return mt_status_exit_code(st);
}

static int usage_error(const char *msg) {
    fprintf(stderr, "meshtrain: error: %s (see meshtrain --help)\n", msg);
    return 2;
}

static void print_keys(FILE *out) {
    mt_train_config def;
    mt_train_config_defaults(&def);
    char val[256], type[256];
    fprintf(out, "\nRun keys (default in brackets; configs/base.yml lists them all):\n");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            fprintf(out, "\nModel keys (configs/models/<model_name>.yml; defaults from decoder_block):\n");
        for (int i = 0; i < mt_config_key_count(); i++) {
            const mt_config_key *k = mt_config_key_get(i);
            if (k->is_model != pass) continue;
            mt_config_key_type_str(k, type, sizeof type);
            if (!k->is_model) {
                mt_train_config_format(&def, k, val, sizeof val);
                fprintf(out, "  %-36s %s [%s]\n      %s\n", k->name, type, val[0] ? val : "\"\"", k->doc);
            } else {
                fprintf(out, "  %-36s %s\n      %s\n", k->name, type, k->doc);
            }
        }
    }
}

static void print_help(const char *cmd) {
    FILE *o = stdout;
    if (!cmd) {
        fprintf(o,
                "usage: meshtrain <command> CONFIG.yml [key=value ...]\n\n"
                "commands:\n"
                "  train   train a model; outputs under <base_output_directory>/<run_name>/\n"
                "  sample  generate text from a checkpoint (load_checkpoint=DIR)\n"
                "  plan    print the per-device memory plan (--json for JSON)\n"
                "  estimate  batch size, remat policy and layout for a memory budget (hbm_gib=N)\n"
                "  prepare text / JSONL / Parquet into llm.c token shards with a tokenizer.json or\n"
                "          SentencePiece model (meshtrain prepare --help; no CONFIG.yml)\n\n"
                "Precedence: built-in defaults < configs/models/<model_name>.yml < CONFIG.yml <\n"
                "key=value. The model file is looked up in <CONFIG dir>/models/,\n"
                "$MESHTRAIN_CONFIG_DIR/models/, <CONFIG dir>/configs/models/, ./configs/models/.\n"
                "Exit codes: 0 done, 1 runtime failure, 2 bad input.\n");
    } else if (strcmp(cmd, "train") == 0) {
        fprintf(o,
                "usage: meshtrain train CONFIG.yml [key=value ...]\n\n"
                "Trains for `steps` steps. Writes <base_output_directory>/<run_name>/metrics.jsonl\n"
                "(one JSON object per step) and checkpoints/step_<N>/ every checkpoint_period steps\n"
                "and at the end. load_checkpoint=DIR resumes a run bitwise (exit 2 when the run\n"
                "directory holds checkpoints after DIR's step or of another run, or DIR is not one\n"
                "complete checkpoint); load_parameters_path=DIR starts from a\n"
                "model.safetensors. The world is mpirun -np N, the mesh the ici_* keys (num_devices is\n"
                "for plan/estimate; train refuses one that differs from N).\n");
    } else if (strcmp(cmd, "sample") == 0) {
        fprintf(o,
                "usage: meshtrain sample CONFIG.yml load_checkpoint=DIR [prompt=TEXT | prompt_ids=ID,...]\n"
                "                        [key=value ...]\n\n"
                "Generates sample_length tokens from the checkpoint DIR with temperature and top_k\n"
                "after the prompt (prompt=TEXT, encoded by the tokenizer with its BOS, through\n"
                "scripts/prepare_data.py; or prompt_ids used as given; neither: the tokenizer's BOS),\n"
                "decoding with tokenizer_path (a tokenizer.json, a directory holding one, or a\n"
                "SentencePiece .vocab), and prints the prompt and its continuation. The model is the\n"
                "checkpoint's (its config.json); model_name or a model key given on the command line\n"
                "must describe that same model (exit 2 otherwise).\n");
    } else if (strcmp(cmd, "plan") == 0) {
        fprintf(o,
                "usage: meshtrain plan CONFIG.yml [--json] [key=value ...]\n\n"
                "Prints the memory of one device for a training step: parameters, gradients and\n"
                "accumulators, optimizer, saved activations per named tensor (remat_policy), recompute\n"
                "scratch, loss tile, communication buffers, workspace, each as the bytes live at the\n"
                "peak phase and the sum of all its buffers (any phase), the arena size (peak), and the\n"
                "host offload bytes. Needs no data and no device. num_devices=N (and the ici_* keys)\n"
                "plan one rank of a larger job. docs/memory.md explains the figures.\n");
    } else if (strcmp(cmd, "estimate") == 0) {
        fprintf(o,
                "usage: meshtrain estimate CONFIG.yml hbm_gib=N [--json] [per_device_batch_size=B]\n"
                "                          [num_devices=N [ici_*_parallelism=K ...]]\n"
                "                          [remat_policy=custom NAME=ACTION ...] [key=value ...]\n\n"
                "Searches batch size and remat policy (MaxText's estimator) against exact plans:\n"
                "without per_device_batch_size, the Pareto list of (batch, policy); with it, the lightest\n"
                "policy that fits; NAME=ACTION (device|remat|offload) fixes a tensor.\n"
                "With num_devices=N it also searches the layout: every data x fsdp x context x tensor = N\n"
                "that the trainer's layout check accepts (heads, kv heads, mlp and vocab divisible by\n"
                "tensor, max_target_length by 2 x context, the layouts dtype runs on). An ici_* key given\n"
                "on the command line (even =1), or set to anything but 1 in the config, is held, not\n"
                "searched (-1: the axis that fills the rest): what you state is kept, and a config's 1\n"
                "cannot be told from base.yml's default, so it is searched. Give all four to estimate\n"
                "one mesh (all 1: fsdp over N). Layouts are searched best bound first until none can\n"
                "enter the best %d, which are listed, each with its own rows. Ranks by a modelled step\n"
                "time (FLOPs: the trainer's mfu formula; collective bytes: the trainer's own formula for\n"
                "that layout) and writes runnable commands to ./remat_commands_from_estimator.txt (the\n"
                "current directory; written whole, then renamed): each line carries its layout's ici_*\n"
                "keys and, for num_devices > 1, its `mpirun -np N`. --json prints the rows, budget, mesh\n"
                "search, search time and commands as one JSON object. Each line starts with this\n"
                "binary's path as invoked, so it runs as written from this directory. The step model\n"
                "assumes an H100/H200-class GPU (no key changes it; meaningless for backend=cpu).\n"
                "Exit 2 when nothing fits, no layout of num_devices passes the layout check,\n"
                "num_devices is outside [1, 2^30], or hbm_gib is outside (0, %.0f]; a failed estimate\n"
                "changes no file.\n",
                MT_ESTIMATE_TOP_LAYOUTS, MT_HBM_GIB_MAX);
    }
    print_keys(o);
}

/* The CONFIG.yml argument must come first: a first argument of the form key=value
 * that is not a file is a misplaced override. */
static mt_status check_config_first(const char *path) {
    const char *eq = strchr(path, '=');
    FILE *f = eq ? fopen(path, "rb") : NULL;
    if (f) fclose(f);
    if (eq && !f)
        return mt_set_error(MT_ERR_INVALID, "'%s' is not a config file: CONFIG.yml must come first and key=value "
                            "overrides after it (meshtrain <command> CONFIG.yml [key=value ...])", path);
    return MT_OK;
}

/* Load CONFIG.yml + overrides from argv (after the command); --json (accepted
 * anywhere when json is non-NULL) is taken out. */
static mt_status load_config_ex(int argc, char **argv, mt_train_config *cfg, int *json, int validate) {
    const char **ov = calloc((size_t)argc + 1, sizeof(char *));
    if (!ov) return mt_set_error(MT_ERR_OOM, "out of memory");
    const char *path = NULL;
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (json && strcmp(argv[i], "--json") == 0) *json = 1;
        else if (!path) path = argv[i];
        else ov[n++] = argv[i];
    }
    mt_status st = path ? check_config_first(path) : mt_set_error(MT_ERR_INVALID, "missing CONFIG.yml");
    if (st == MT_OK) st = validate ? mt_train_config_load(cfg, path, n, ov) : mt_train_config_read(cfg, path, n, ov);
    free(ov);
    return st;
}

static mt_status load_config(int argc, char **argv, mt_train_config *cfg, int *json) {
    return load_config_ex(argc, argv, cfg, json, 1);
}

static void human_duration(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

/* ---- a single process stopped by SIGINT / SIGTERM says so (under mpirun
 * parallel/comm_mpi.c reports "stopped by the launcher" instead) ----
 * The handler writes one prepared line with write(2) (async-signal-safe) and dies of
 * the signal as before (exit 130 / 143). The line names the newest complete checkpoint
 * to resume from. It is prepared after every step (on_step) into the slot the handler
 * is not reading, then published by one sig_atomic_t store. A step's checkpoint is
 * saved after on_step: the handler stat(2)s (async-signal-safe) that checkpoint's
 * train_state.safetensors, which exists only once step_<N>/ is renamed into place. */
#define STOP_LINE (2 * MT_CONFIG_PATH_MAX + 160)
typedef struct stop_note {
    char done[STOP_LINE];       /* tail of the line when the pending checkpoint is not there */
    char pending[STOP_LINE];    /* ... when it is */
    char pending_file[STOP_LINE]; /* <ckdir>/step_<s>/train_state.safetensors, or "" */
} stop_note;
static stop_note g_stop[2];                  /* only the CLI: the handler's prepared text */
static volatile sig_atomic_t g_stop_slot = -1; /* the published slot, -1 before any */

static void put_stderr(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_stop_signal(int sig) {
    const int slot = g_stop_slot;
    put_stderr(sig == SIGINT ? "meshtrain: stopped by SIGINT" : "meshtrain: stopped by SIGTERM");
    if (slot >= 0) {
        const stop_note *n = &g_stop[slot];
        struct stat sb;
        put_stderr(n->pending_file[0] && stat(n->pending_file, &sb) == 0 ? n->pending : n->done);
    } else {
        put_stderr("\n");
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

typedef struct console {
    int64_t log_period;
    int note;                  /* keep g_stop up to date (one process) */
    int64_t checkpoint_period; /* the run's, to know which steps save */
    char ckdir[2 * MT_CONFIG_PATH_MAX + 16]; /* <base_output_directory>/<run_name>/checkpoints */
} console;

/* Publish the stop line after step `step` (its checkpoint, if it saves one, is written
 * after this call): the newest saved checkpoint so far, and this step's to come. */
static void stop_note_update(const console *c, int64_t step, int64_t total) {
    const int cur = g_stop_slot, next = cur == 0 ? 1 : 0;
    stop_note *n = &g_stop[next];
    struct stat sb;
    if (cur >= 0) { /* the previous pending checkpoint, if saved, is now the newest */
        const stop_note *o = &g_stop[cur];
        snprintf(n->done, sizeof n->done, "%s",
                 o->pending_file[0] && stat(o->pending_file, &sb) == 0 ? o->pending : o->done);
    }
    n->pending_file[0] = n->pending[0] = '\0';
    if (step > 0 && ((c->checkpoint_period > 0 && step % c->checkpoint_period == 0) || step == total)) {
        snprintf(n->pending_file, sizeof n->pending_file, "%s/step_%" PRId64 "/train_state.safetensors", c->ckdir,
                 step);
        snprintf(n->pending, sizeof n->pending, "; the newest checkpoint is step %" PRId64 ": resume with "
                 "load_checkpoint=%s/step_%" PRId64 "\n", step, c->ckdir, step);
    }
    g_stop_slot = next;
}

static void on_step(const mt_step_metrics *m, void *user) {
    const console *c = user;
    if (c->note) stop_note_update(c, m->step, m->total_steps);
    if (m->has_train && (m->step % c->log_period == 0 || m->step == 1 || m->step == m->total_steps)) {
        char eta[32];
        human_duration(m->eta_s, eta, sizeof eta);
        printf("step %" PRId64 "/%" PRId64 " | loss %.4f | lr %.3e | grad norm %.4f | %.0f tok/s | %.1f ms",
               m->step, m->total_steps, m->loss, m->lr, m->grad_norm, m->tokens_per_s, m->step_ms);
        if (isfinite(m->mfu)) printf(" | mfu %.1f%%", 100.0 * m->mfu);
        printf(" | ETA %s\n", eta);
    }
    if (m->has_eval)
        printf("eval step %" PRId64 " | val_loss %.4f | %" PRId64 " tokens\n", m->step, m->val_loss, m->val_tokens);
    fflush(stdout);
}

/* An allocation that the run's memory plan sizes failed in mt_trainer_create: keep the
 * status (MT_ERR_OOM, exit 1) and add to its message the plan's device bytes (rank 0 of
 * this world, train/estimate.h mt_memory_plan_rank, when it can be computed), where to
 * see it (`meshtrain plan`) and the keys that size it. */
static mt_status train_oom(const mt_train_config *cfg) {
    char why[512], size[96] = "";
    snprintf(why, sizeof why, "%s", mt_last_error());
    mt_train_config c = *cfg;
    c.num_devices = mt_comm_world_size();
    mt_memory_report r;
    if (mt_memory_plan_rank(&c, &r, NULL, NULL) == MT_OK) {
        char h[32];
        mt_report_human_bytes((double)r.peak, h, sizeof h);
        snprintf(size, sizeof size, " (%zu bytes = %s per device)", r.peak, h);
    }
    return mt_set_error(MT_ERR_OOM, "%s: this run's memory plan%s cannot be allocated here; `meshtrain plan` with "
                        "the same config and key=value overrides prints it. per_device_batch_size = %" PRId64
                        ", max_target_length = %" PRId64 ", remat_policy = %s and the model dims (base_emb_dim, "
                        "base_mlp_dim, base_num_decoder_layers, vocab_size) size it: lower them or save less",
                        why, size, cfg->per_device_batch_size, cfg->max_target_length,
                        mt_remat_policy_name((mt_remat_policy_kind)cfg->remat_policy));
}

/* FNV-1a 64 of s[0..n). */
static uint64_t fnv1a64(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

/* Line i (0-based) of text: its start and, in *n, its length without the '\n'; NULL
 * when text has no line i (a line runs to '\n'). */
static const char *line_at(const char *text, int i, int *n) {
    for (; i > 0 && text; i--) {
        text = strchr(text, '\n');
        if (text) text++;
    }
    const char *end = text ? strchr(text, '\n') : NULL;
    if (!end) return NULL;
    *n = (int)(end - text);
    return text;
}

/* ---- the same config on every rank ----
 * mpirun can start ranks with different arguments (MPMD `-np 1 A : -np 1 B`, or a
 * wrapper that varies them), and nothing else compares them: a different learning_rate
 * trained diverging replicas silently, a different steps hung in the last collective,
 * a different model_name died in MPI with a truncated message, a different run_name was
 * ignored (rank 0 alone writes). So the ranks compare their whole resolved config
 * (train/config.h mt_train_config_text: every run key, model key and remat tensor,
 * after CONFIG.yml, the model file and the overrides), as a digest in agree_on_inputs'
 * exchange. Every key is compared: no key legitimately differs per rank. What is per
 * rank (the rank, the GPU, which a rank takes from its node-local rank, the data shard)
 * is derived from the world, not configured; the paths (dataset_path, run_name,
 * load_checkpoint, ...) are compared as text too, since every rank must read the same
 * data and checkpoint and agree on the run directory (give them one spelling); and
 * keys that only one command reads (prompt, hbm_gib, ...) cost nothing to keep equal.
 *
 * When the digests differ, every rank's text is gathered (rare: only on this error) and
 * every rank finds the same verdict: the first key in table order that differs between
 * rank 0 and some rank, and the lowest such rank. Rank 0 prints it; every rank exits 2.
 * Returns the exit code (2; 1 when the exchange itself failed), or -1 when the texts
 * agree after all (a digest collision). */
static int differing_configs(mt_comm *world, const char *text, size_t len) {
    const int size = mt_comm_world_size(), rank = mt_comm_world_rank();
    int64_t *words = calloc((size_t)size, sizeof *words), *ones = calloc((size_t)size, sizeof *ones);
    const int64_t mywords = (int64_t)(len / 8 + 1); /* the text and its NUL in int64 words */
    int64_t *mine = calloc((size_t)mywords, sizeof *mine), *all = NULL;
    mt_status cs = words && ones && mine ? MT_OK : mt_set_error(MT_ERR_OOM, "out of memory");
    for (int r = 0; cs == MT_OK && r < size; r++) ones[r] = 1;
    if (cs == MT_OK) {
        memcpy(mine, text, len);
        cs = mt_comm_all_gather(world, &mywords, words, ones, MT_COMM_I64);
    }
    int64_t total = 0;
    for (int r = 0; cs == MT_OK && r < size; r++) total += words[r];
    if (cs == MT_OK && !(all = calloc((size_t)total, sizeof *all))) cs = mt_set_error(MT_ERR_OOM, "out of memory");
    if (cs == MT_OK) cs = mt_comm_all_gather(world, mine, all, words, MT_COMM_I64);
    free(ones);
    free(mine);
    if (cs != MT_OK) {
        free(words);
        free(all);
        return fail(cs);
    }
    /* rank r's text: (const char *)(all + offset of r); the first differing line */
    const char *t0 = (const char *)all;
    int best_line = -1, best_rank = -1, ndiff = 0;
    int64_t off = words[0];
    for (int r = 1; r < size; off += words[r], r++) {
        const char *a = t0, *b = (const char *)(all + off);
        int line = 0;
        while (*a && *a == *b) {
            if (*a == '\n') line++;
            a++, b++;
        }
        if (*a == *b) continue; /* equal */
        ndiff++;
        if (best_line < 0 || line < best_line) best_line = line, best_rank = r;
    }
    int code = -1;
    if (ndiff > 0) {
        off = 0;
        for (int r = 0; r < best_rank; r++) off += words[r];
        int n0, nr;
        const char *l0 = line_at(t0, best_line, &n0), *lr = line_at((const char *)(all + off), best_line, &nr);
        const char *e0 = l0 ? memchr(l0, '=', (size_t)n0) : NULL, *er = lr ? memchr(lr, '=', (size_t)nr) : NULL;
        char key[128] = "";
        if (e0 && er && e0 - l0 == er - lr && memcmp(l0, lr, (size_t)(e0 - l0)) == 0)
            snprintf(key, sizeof key, "%.*s", (int)(e0 - l0), l0);
        char others[96] = "";
        if (size > 2)
            snprintf(others, sizeof others, " (%d of the %d ranks differ from rank 0)", ndiff, size);
        if (key[0]) {
            const mt_config_key *k = mt_config_key_find(key);
            const char *q = k && k->type == MT_KEY_STRING ? "'" : ""; /* strings quoted, as elsewhere */
            n0 -= (int)(e0 - l0) + 1, nr -= (int)(er - lr) + 1;
            mt_set_error(MT_ERR_INVALID, "the ranks were started with different configs: key '%s' = %s%.*s%s on rank "
                         "0 but %s%.*s%s on rank %d%s: every rank must be given the same CONFIG.yml and key=value "
                         "overrides", key, q, n0 > 300 ? 300 : n0, e0 + 1, q, q, nr > 300 ? 300 : nr, er + 1, q,
                         best_rank, others);
        } else { /* not the same key table: another meshtrain binary */
            mt_set_error(MT_ERR_INVALID, "the ranks were started with different configs: rank %d's keys are not rank "
                         "0's (line %d of the resolved config: %.*s on rank 0, %.*s on rank %d; another meshtrain "
                         "build?)%s: every rank must run the same meshtrain with the same CONFIG.yml and key=value "
                         "overrides", best_rank, best_line + 1, l0 ? (n0 > 100 ? 100 : n0) : 6, l0 ? l0 : "(none)",
                         lr ? (nr > 100 ? 100 : nr) : 6, lr ? lr : "(none)", best_rank, others);
        }
        if (rank == 0) fprintf(stderr, "meshtrain: error: %s\n", mt_last_error());
        code = 2;
    }
    free(words);
    free(all);
    return code;
}

/* ---- errors under mpirun: each one printed once ----
 * Every rank reads the same config and checks the same layout, so a bad key or mesh is
 * every rank's error, and each rank printing it gave N copies. At a point every rank
 * reaches with no collective in flight and nothing written, the ranks exchange their
 * statuses and a hash of their messages (an all-gather over the world): a failed rank
 * prints its message unless a lower rank failed with the same status and message, so an
 * error that every rank found is printed once (rank 0) and one that a rank alone found
 * (its own file) by that rank. leader_only: the verdict is rank 0's (the run directory,
 * which rank 0 alone checks; the others fail with "rank 0 refused"), so rank 0 prints,
 * and another rank only when rank 0 did not fail. Every failed rank exits with its own
 * status's code, one that did not with the lowest failed rank's (2 for bad input).
 * cfg (NULL: not compared): when no rank failed, the same exchange carries a digest of
 * each rank's resolved config, and ranks that differ exit 2 naming the first differing
 * key (differing_configs).
 * Returns -1 when no rank failed. One process: fail(st) when st failed. */
static int agree_on_inputs(mt_status st, int leader_only, const mt_train_config *cfg) {
    const int size = mt_comm_world_size(), rank = mt_comm_world_rank();
    if (size <= 1) return st == MT_OK ? -1 : fail(st);
    char *text = NULL;
    size_t tlen = 0;
    if (st == MT_OK && cfg) st = mt_train_config_text(cfg, &text, &tlen);
    const uint64_t digest = text ? fnv1a64(text, tlen) : 0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", st == MT_OK ? "" : mt_last_error()[0] ? mt_last_error() : mt_status_str(st));
    const uint64_t hash = fnv1a64(msg, strlen(msg));
    int64_t mine[3] = {(int64_t)st, (int64_t)hash, (int64_t)digest}, *all = calloc((size_t)size * 3, sizeof *all);
    int64_t *counts = calloc((size_t)size, sizeof *counts);
    mt_comm *world = NULL;
    mt_status cs = all && counts ? MT_OK : mt_set_error(MT_ERR_OOM, "out of memory");
    for (int r = 0; cs == MT_OK && r < size; r++) counts[r] = 3;
    if (cs == MT_OK) cs = mt_comm_split(&world, 0, rank, "startup");
    if (cs == MT_OK) cs = mt_comm_all_gather(world, mine, all, counts, MT_COMM_I64);
    free(counts);
    if (cs != MT_OK) { /* no verdict from the others: say what this rank knows */
        mt_comm_free(world);
        free(all);
        free(text);
        if (st == MT_OK) return fail(cs);
        fprintf(stderr, "meshtrain: error: %s\n", msg);
        return mt_status_exit_code(st);
    }
    int first = -1, dup = 0, same_cfg = 1; /* the lowest failed rank; a lower one failed with this message */
    for (int r = 0; r < size; r++) {
        same_cfg &= all[3 * r + 2] == all[2];
        if (all[3 * r] == MT_OK) continue;
        if (first < 0) first = r;
        if (r < rank && all[3 * r] == mine[0] && all[3 * r + 1] == mine[1]) dup = 1;
    }
    const mt_status lead = first >= 0 ? (mt_status)all[3 * first] : MT_OK;
    const int rank0_failed = all[0] != MT_OK;
    free(all);
    if (first < 0) { /* every rank's inputs are fine: are they the same? */
        const int code = cfg && !same_cfg ? differing_configs(world, text, tlen) : -1;
        mt_comm_free(world);
        free(text);
        return code;
    }
    mt_comm_free(world);
    free(text);
    if (st == MT_OK) return mt_status_exit_code(lead); /* another rank's error, printed there */
    const int speak = leader_only ? rank == 0 || !rank0_failed : !dup;
    if (speak) fprintf(stderr, "meshtrain: error: %s\n", msg);
    return mt_status_exit_code(st);
}

static int cmd_train(int argc, char **argv) {
    mt_train_config cfg;
    /* The process group first (under mpirun; nothing without it), so that the ranks
     * agree on the checks that need only the config and the world: load, validation,
     * mesh and layout, the backend kind, num_devices. */
    mt_status st = mt_comm_world_init();
    if (st != MT_OK) return fail(st);
    st = load_config(argc, argv, &cfg, NULL);
    if (st == MT_OK) st = mt_trainer_check_config(&cfg);
    /* num_devices describes the job to plan/estimate; train takes the world from
     * mpirun -np (1 = the default, never an error). */
    if (st == MT_OK && cfg.num_devices != 1 && cfg.num_devices != mt_comm_world_size())
        st = mt_set_error(MT_ERR_INVALID, "key 'num_devices' = %" PRId64 " but this job has %d rank(s): "
                          "num_devices is a plan/estimate key; train takes the mesh from mpirun -np N and the "
                          "ici_* keys (launch `mpirun -np %" PRId64 " meshtrain train ...`, or drop "
                          "num_devices)", cfg.num_devices, mt_comm_world_size(), cfg.num_devices);
    int code = agree_on_inputs(st, 0, &cfg);
    if (code >= 0) return code;
    mt_trainer *t = NULL;
    st = mt_trainer_create(&t, &cfg);
    if (st == MT_ERR_OOM) st = train_oom(&cfg);
    if (st != MT_OK) return fail(st);
    /* Every input is checked; the outputs last, before anything is written (rank 0
     * checks them; every rank has its verdict when this returns). */
    st = mt_trainer_check_outputs(t);
    code = agree_on_inputs(st, 1, NULL);
    if (code >= 0) {
        mt_trainer_free(t);
        return code;
    }
    char peak[32];
    mt_report_human_bytes((double)mt_plan_peak(mt_trainer_get_plan(t)), peak, sizeof peak);
    const mt_model *model = mt_trainer_model(t);
    const int lead = mt_trainer_world_rank(t) == 0; /* under mpirun rank 0 prints the banner */
    /* the global batch: per_device_batch_size x accumulation on each data x fsdp rank
     * (tensor ranks share their sequences, context ranks split them) */
    const int64_t ici[MT_MESH_AXES] = {cfg.ici_data_parallelism, cfg.ici_fsdp_parallelism,
                                       cfg.ici_context_parallelism, cfg.ici_tensor_parallelism};
    int dims[MT_MESH_AXES];
    const int64_t reps = mt_mesh_resolve(ici, mt_comm_world_size(), dims) == MT_OK
                                 ? (int64_t)dims[MT_AXIS_DATA] * dims[MT_AXIS_FSDP] : 1;
    if (lead) printf("meshtrain: model %s (%s, %.3fM params), batch %" PRId64 " x %" PRId64 " x %" PRId64
           " accumulation per device (%" PRId64 " sequences a step over %" PRId64 " data x fsdp rank%s), %" PRId64
           " steps, memory plan %s\n",
           cfg.model.model_name, mt_decoder_block_name(cfg.model.decoder_block),
           (double)mt_model_numel(model) / 1e6, cfg.per_device_batch_size, cfg.max_target_length,
           cfg.gradient_accumulation_steps, cfg.per_device_batch_size * cfg.gradient_accumulation_steps * reps, reps,
           reps == 1 ? "" : "s", cfg.steps, peak);
    if (lead) printf("meshtrain: outputs in %s/%s\n", cfg.base_output_directory, cfg.run_name);
    if (lead && mt_trainer_step_count(t) > 0)
        printf("meshtrain: resuming at step %" PRId64 " from %s\n", mt_trainer_step_count(t), cfg.load_checkpoint);
    if (mt_trainer_step_count(t) >= cfg.steps) {
        if (lead) printf("meshtrain: the run is already complete: %s is at step %" PRId64 " and steps = %" PRId64
               "; nothing to do (set steps higher to train on)\n",
               cfg.load_checkpoint, mt_trainer_step_count(t), cfg.steps);
        mt_trainer_free(t);
        return 0;
    }
    fflush(stdout);
    console c = {cfg.log_period, mt_comm_world_size() == 1, cfg.checkpoint_period, ""};
    snprintf(c.ckdir, sizeof c.ckdir, "%s/%s/checkpoints", cfg.base_output_directory, cfg.run_name);
    if (c.note) { /* the line before the first step: the resumed checkpoint, or none */
        stop_note *n = &g_stop[0];
        if (cfg.load_checkpoint[0])
            snprintf(n->done, sizeof n->done, "; the newest checkpoint is step %" PRId64 " (the one it resumed "
                     "from): resume with load_checkpoint=%s\n", mt_trainer_step_count(t), cfg.load_checkpoint);
        else
            snprintf(n->done, sizeof n->done, "; no checkpoint was saved yet (checkpoint_period = %" PRId64
                     "): nothing to resume from\n", cfg.checkpoint_period);
        n->pending_file[0] = n->pending[0] = '\0';
        g_stop_slot = 0;
        signal(SIGINT, on_stop_signal);
        signal(SIGTERM, on_stop_signal);
    }
    st = mt_trainer_run(t, on_step, &c);
    mt_trainer_free(t);
    if (st != MT_OK) return fail(st);
    return 0;
}

/* ---- scripts/prepare_data.py: `meshtrain prepare` and sample's text prompt ----
 * The script is found beside this binary: <bin>/../scripts (a build directory in the
 * source tree), <bin>/../../scripts, or <bin>/../share/meshtrain/scripts (installed).
 * Its Python: $MESHTRAIN_PYTHON, else <source tree>/.venv-hf/bin/python (made by
 * scripts/setup-hf-venv.sh, with tokenizers, sentencepiece and pyarrow), else python3. */
/* Whether `cmd` runs as execvp would find it: a path (with '/') to an executable file,
 * or a name of one in a $PATH directory. */
static int is_executable_file(const char *cmd) {
    struct stat sb;
    if (strchr(cmd, '/')) return stat(cmd, &sb) == 0 && S_ISREG(sb.st_mode) && access(cmd, X_OK) == 0;
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    char buf[MT_CONFIG_PATH_MAX];
    for (const char *p = path;;) {
        const char *colon = strchr(p, ':');
        const size_t n = colon ? (size_t)(colon - p) : strlen(p);
        if (snprintf(buf, sizeof buf, "%.*s/%s", (int)n, n ? p : ".", cmd) < (int)sizeof buf && stat(buf, &sb) == 0 &&
            S_ISREG(sb.st_mode) && access(buf, X_OK) == 0)
            return 1;
        if (!colon) return 0;
        p = colon + 1;
    }
}

static mt_status find_helper(char *script, size_t ns, char *python, size_t np) {
    char exe[MT_CONFIG_PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return mt_set_error(MT_ERR_RUNTIME, "cannot find this binary's directory (/proc/self/exe)");
    exe[len] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    static const char *const rel[] = {"/../scripts", "/../../scripts", "/../share/meshtrain/scripts"};
    script[0] = '\0';
    for (size_t i = 0; i < sizeof rel / sizeof rel[0] && !script[0]; i++) {
        snprintf(script, ns, "%s%s/prepare_data.py", exe, rel[i]);
        if (access(script, R_OK) != 0) script[0] = '\0';
    }
    if (!script[0])
        return mt_set_error(MT_ERR_RUNTIME, "scripts/prepare_data.py not found beside %s (looked in ../scripts, "
                            "../../scripts, ../share/meshtrain/scripts)", exe);
    const char *env = getenv("MESHTRAIN_PYTHON");
    if (env && env[0]) { /* the user's choice: one that cannot run is bad input (exit 2) */
        snprintf(python, np, "%s", env);
        if (!is_executable_file(env))
            return mt_set_error(MT_ERR_INVALID, "environment variable MESHTRAIN_PYTHON = '%s': %s (give a Python 3 "
                                "executable, or unset it to use .venv-hf/bin/python or python3)", env,
                                strchr(env, '/') ? "no executable file there" : "no executable of that name on PATH");
        return MT_OK;
    }
    snprintf(python, np, "%s", script);
    char *s = strrchr(python, '/');
    if (s) *s = '\0'; /* .../scripts */
    s = strrchr(python, '/');
    if (s) *s = '\0'; /* the source tree */
    const size_t used = strlen(python);
    snprintf(python + used, np - used, "/.venv-hf/bin/python");
    if (access(python, X_OK) != 0) snprintf(python, np, "python3");
    return MT_OK;
}

/* `meshtrain prepare ARGS`: runs scripts/prepare_data.py prepare ARGS in place of this
 * process, so its exit code (0, 1, 2: bad input, named) is the command's. */
static int cmd_prepare(int argc, char **argv) {
    char script[MT_CONFIG_PATH_MAX + 64], python[MT_CONFIG_PATH_MAX + 64];
    mt_status st = find_helper(script, sizeof script, python, sizeof python);
    if (st != MT_OK) return fail(st);
    char **av = calloc((size_t)argc + 4, sizeof(char *));
    if (!av) return fail(mt_set_error(MT_ERR_OOM, "out of memory"));
    av[0] = python, av[1] = script, av[2] = "prepare";
    for (int i = 0; i < argc; i++) av[3 + i] = argv[i];
    fflush(stdout);
    execvp(python, av);
    const int e = errno;
    free(av);
    return fail(mt_set_error(MT_ERR_RUNTIME, "cannot run %s (%s): run scripts/setup-hf-venv.sh, or set "
                             "MESHTRAIN_PYTHON", python, strerror(e)));
}

/* sample's prompt=TEXT: the ids scripts/prepare_data.py encode prints for it (the
 * tokenizer's BOS, the text, no trailing special token). A text prompt with a .vocab
 * needs the SentencePiece .model beside it. */
static mt_status encode_prompt(const mt_train_config *cfg, int32_t **ids, int64_t *n) {
    mt_tokenizer *tok;
    MT_TRY(mt_tokenizer_load(&tok, cfg->tokenizer_path));
    char enc[MT_CONFIG_PATH_MAX + 64];
    snprintf(enc, sizeof enc, "%s", mt_tokenizer_encoder_path(tok));
    const int spm = strcmp(mt_tokenizer_kind(tok), "sentencepiece") == 0;
    mt_tokenizer_free(tok);
    if (spm && access(enc, R_OK) != 0)
        return mt_set_error(MT_ERR_IO, "key 'prompt': encoding text needs the SentencePiece model '%s' beside key "
                            "'tokenizer_path' = '%s' (or give prompt_ids=ID,...)", enc, cfg->tokenizer_path);
    char script[MT_CONFIG_PATH_MAX + 64], python[MT_CONFIG_PATH_MAX + 64];
    MT_TRY(find_helper(script, sizeof script, python, sizeof python));
    int fd[2];
    if (pipe(fd) != 0) return mt_set_error(MT_ERR_RUNTIME, "key 'prompt': pipe: %s", strerror(errno));
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        return mt_set_error(MT_ERR_RUNTIME, "key 'prompt': fork: %s", strerror(errno));
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]), close(fd[1]);
        char *av[] = {python, script, "encode", "--tokenizer", enc, "--text", (char *)cfg->prompt, NULL};
        execvp(python, av);
        fprintf(stderr, "meshtrain: error: cannot run %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    size_t cap = 4096, used = 0;
    char *buf = malloc(cap);
    ssize_t got = 0;
    while (buf && (got = read(fd[0], buf + used, cap - used - 1)) > 0) {
        used += (size_t)got;
        if (used + 1 == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) free(buf);
            buf = b, cap *= 2;
        }
    }
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!buf) return mt_set_error(MT_ERR_OOM, "key 'prompt': out of memory");
    buf[used] = '\0';
    mt_status st = MT_OK;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        st = mt_set_error(WIFEXITED(status) && WEXITSTATUS(status) == 2 ? MT_ERR_INVALID : MT_ERR_RUNTIME,
                          "key 'prompt': encoding it with %s (%s encode) failed%s", enc, script,
                          WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (no Python: run scripts/setup-hf-venv.sh "
                          "or set MESHTRAIN_PYTHON)" : " (the encoder's own message, if it printed one, is above)");
    else
        st = mt_sample_parse_ids("prompt", buf, ids, n);
    free(buf);
    return st;
}

/* `sample` builds the checkpoint's model (its config.json): a model key given on the
 * command line must agree with it, or it would be silently ignored. */
static mt_status check_sample_overrides(int argc, char **argv, const mt_train_config *cfg) {
    char path[MT_CONFIG_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/config.json", cfg->load_checkpoint);
    mt_train_config ck;
    int have_ck = 0;
    for (int i = 1; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!eq) continue;
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)((size_t)(eq - argv[i]) < 63 ? (size_t)(eq - argv[i]) : 63), argv[i]);
        const mt_config_key *k = mt_config_key_find(key);
        const int by_name = k && strcmp(k->name, "model_name") == 0;
        if (!k || (!k->is_model && !by_name)) continue;
        if (!have_ck) {
            FILE *f = fopen(path, "rb");
            if (!f) return MT_OK; /* mt_sample_generate reports the missing checkpoint */
            fclose(f);
            memset(&ck, 0, sizeof ck);
            MT_TRY(mt_hf_config_read(path, &ck.model));
            have_ck = 1;
        }
        char want[128], have[128];
        if (by_name) { /* config.json has no name: model_name must describe the checkpoint's model */
            const mt_config_key *d = mt_model_config_diff(&cfg->model, &ck.model, NULL, want, have, sizeof want);
            if (d)
                return mt_set_error(MT_ERR_INVALID, "key 'model_name' = %s describes another model than the "
                                    "checkpoint's %s (%s = %s there, %s in %s.yml): sample uses the checkpoint's "
                                    "model; drop model_name", cfg->model.model_name, path, d->name, have, want,
                                    cfg->model.model_name);
            continue;
        }
        mt_train_config_format(cfg, k, want, sizeof want);
        mt_train_config_format(&ck, k, have, sizeof have);
        if (strcmp(want, have) != 0)
            return mt_set_error(MT_ERR_INVALID, "key '%s' = %s conflicts with the checkpoint's %s (%s = %s): sample "
                                "uses the checkpoint's model; drop the override", k->name, want, path, k->name, have);
    }
    return MT_OK;
}

static int cmd_sample(int argc, char **argv) {
    mt_train_config cfg;
    /* validated once the checkpoint's model is in (top_k is checked against its
     * vocab_size): the config's model file may describe another one */
    mt_status st = load_config_ex(argc, argv, &cfg, NULL, 0);
    if (st != MT_OK) return fail(st);
    if (!cfg.load_checkpoint[0]) return usage_error("sample needs load_checkpoint=DIR");
    st = check_sample_overrides(argc, argv, &cfg);
    if (st != MT_OK) return fail(st);
    char ckjson[MT_CONFIG_PATH_MAX + 16];
    snprintf(ckjson, sizeof ckjson, "%s/config.json", cfg.load_checkpoint);
    mt_model_config ckmodel;
    if (access(ckjson, R_OK) == 0 && mt_hf_config_read(ckjson, &ckmodel) == MT_OK) {
        /* (an unreadable one: mt_sample_generate names the checkpoint's problem) */
        memcpy(ckmodel.model_name, cfg.model.model_name, sizeof ckmodel.model_name);
        cfg.model = ckmodel;
    }
    st = mt_train_config_validate(&cfg);
    if (st != MT_OK) return fail(st);
    int32_t *prompt = NULL;
    int64_t nprompt = 0;
    if (cfg.prompt[0] && cfg.prompt_ids[0])
        return fail(mt_set_error(MT_ERR_INVALID, "keys 'prompt' and 'prompt_ids' are both set: give one"));
    if (cfg.prompt_ids[0]) st = mt_sample_parse_ids("prompt_ids", cfg.prompt_ids, &prompt, &nprompt);
    else if (cfg.prompt[0]) st = encode_prompt(&cfg, &prompt, &nprompt);
    if (st != MT_OK) return fail(st);
    mt_sample_result r;
    st = mt_sample_generate(&cfg, cfg.load_checkpoint, prompt, nprompt, &r);
    free(prompt);
    if (st != MT_OK) return fail(st);
    printf("%s\n", r.text);
    mt_sample_result_free(&r);
    return 0;
}

/* `meshtrain plan`: one rank's memory (train/estimate.h mt_memory_plan_rank). */
static int cmd_plan(int argc, char **argv) {
    mt_train_config cfg;
    int json = 0;
    mt_status st = load_config(argc, argv, &cfg, &json);
    if (st != MT_OK) return fail(st);
    mt_plan *plan = NULL, *host = NULL;
    mt_memory_report r;
    st = mt_memory_plan_rank(&cfg, &r, &plan, &host);
    if (st != MT_OK) return fail(st);
    mt_remat_policy pol;
    st = mt_memory_remat_policy(&cfg, &pol);
    if (st != MT_OK) return fail(st);
    st = mt_report_plan(&cfg, &r, plan, host, &pol, json);
    mt_plan_free(plan);
    mt_plan_free(host);
    return st == MT_OK ? 0 : fail(st);
}

/* argv[0] as the user invoked meshtrain (set by main): estimate's command lines start
 * with it, so they run as written from the directory estimate ran in. */
static const char *g_prog = "meshtrain";

/* `meshtrain estimate`: batch size and remat policy for a memory budget. The commands
 * file is written whole to a temporary name and renamed on success; a failed estimate
 * touches no file (bad input loses nothing), and when ./remat_commands_from_estimator.txt
 * exists its message says that file is an earlier run's, not this one's. The written
 * lines start with g_prog, the binary as invoked. */
static int cmd_estimate(int argc, char **argv) {
    const char *prog = g_prog;
    int json = 0, m = 0;
    for (int i = 0; i < argc; i++) /* --json anywhere after the command */
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else argv[m++] = argv[i];
    argc = m;
    if (argc < 1) return usage_error("missing CONFIG.yml");
    const char *path = argv[0];
    if (check_config_first(path) != MT_OK) return fail(MT_ERR_INVALID);
    const char **ov = calloc((size_t)argc + 1, sizeof(char *));
    if (!ov) return fail(mt_set_error(MT_ERR_OOM, "out of memory"));
    int n = 0, fixed[MT_RT_COUNT] = {0}, batch_given = 0, axis_given[4] = {0};
    int64_t batch = 0;
    for (int i = 1; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (eq) {
            char key[64];
            size_t kl = (size_t)(eq - argv[i]);
            snprintf(key, sizeof key, "%.*s", (int)(kl < 63 ? kl : 63), argv[i]);
            mt_remat_tensor t;
            if (mt_remat_tensor_parse(key, &t) == MT_OK) {
                mt_remat_action a;
                if (mt_remat_action_parse(eq + 1, &a) != MT_OK) {
                    free(ov);
                    return fail(mt_set_error(MT_ERR_INVALID, "%s: unknown action '%s' for tensor '%s' (device, "
                                             "remat or offload)", argv[i], eq + 1, key));
                }
                fixed[t] = 1;
            } else if (strcmp(key, "per_device_batch_size") == 0) {
                batch_given = 1; /* the config parses and range-checks the value (no atoll wrap) */
            }
            for (int a = 0; a < 4; a++) /* an ici_* key on the command line holds its axis */
                if (strcmp(key, mt_mesh_axis_key((mt_mesh_axis)a)) == 0) axis_given[a] = 1;
        }
        ov[n++] = argv[i];
    }
    mt_train_config cfg;
    mt_status st = mt_train_config_load(&cfg, path, n, ov);
    free(ov);
    if (st != MT_OK) return fail(st);
    if (batch_given) batch = cfg.per_device_batch_size; /* a command-line batch is fixed (mode 2) */
    int any_fixed = 0;
    for (int t = 0; t < MT_RT_COUNT; t++) any_fixed |= fixed[t];
    if (any_fixed && cfg.remat_policy != MT_REMAT_CUSTOM)
        return fail(mt_set_error(MT_ERR_INVALID, "tensor actions on the command line need remat_policy=custom"));
    /* The axes searched: an ici_* key given on the command line, or set to anything but 1
     * (CONFIG.yml, whose 1 cannot be told from base.yml's default), is held; the rest are
     * searched over the factorisations of num_devices (one device: nothing to search). */
    const int64_t ici[4] = {cfg.ici_data_parallelism, cfg.ici_fsdp_parallelism, cfg.ici_context_parallelism,
                            cfg.ici_tensor_parallelism};
    for (int a = 0; a < 4; a++) axis_given[a] |= ici[a] != 1 || cfg.num_devices == 1;
    const mt_step_model sm = mt_step_model_default();
    mt_estimate_result res;
    if (!(cfg.hbm_gib > 0))
        st = mt_set_error(MT_ERR_INVALID, "estimate needs hbm_gib=N, the device memory budget in GiB (> 0; e.g. "
                          "hbm_gib=80 for an 80 GiB device)");
    else
        st = mt_estimate_mesh(&cfg, axis_given, MT_ESTIMATE_TOP_LAYOUTS, batch, fixed, &sm, &res);
    if (st != MT_OK) {
        int code = fail(st);
        FILE *old = fopen(MT_REPORT_COMMANDS_FILE, "r");
        if (old) { /* left as it was: bad input loses nothing */
            fclose(old);
            fprintf(stderr, "meshtrain: note: ./%s is from an earlier estimate, not this one (left unchanged)\n",
                    MT_REPORT_COMMANDS_FILE);
        }
        return code;
    }
    /* every command first (the file and --json print the same lines) */
    char (*cmds)[MT_REPORT_COMMAND_MAX] = calloc((size_t)res.nrows, sizeof *cmds);
    /* C11: a pointer to array gains const only by a cast */
    const char (*ccmds)[MT_REPORT_COMMAND_MAX] = (const char (*)[MT_REPORT_COMMAND_MAX])cmds;
    st = cmds ? MT_OK : mt_set_error(MT_ERR_OOM, "estimate: out of memory");
    for (int i = 0; st == MT_OK && i < res.nrows; i++)
        st = mt_report_estimate_command(cmds[i], sizeof cmds[i], prog, path, argc, argv, &cfg, res.rows[i].dims,
                                        &res.rows[i]);
    if (st == MT_OK) st = mt_report_write_commands_file(path, &cfg, &res, ccmds, res.nrows);
    if (st == MT_OK) st = mt_report_estimate(&cfg, &res, &sm, ccmds, MT_REPORT_COMMANDS_FILE, any_fixed, json);
    free(cmds);
    mt_estimate_result_free(&res);
    return st == MT_OK ? 0 : fail(st);
}

int main(int argc, char **argv) {
    mt_log_set_level(MT_LOG_INFO);
    mt_comm_set_process_control(1); /* the CLI owns the process: watchdog + SIGTERM report */
    if (argc < 2) return usage_error("missing command (train, sample, plan, estimate, prepare)");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        print_help(NULL);
        return 0;
    }
    const char *cmd = argv[1];
    int (*run)(int, char **) = NULL;
    g_prog = argv[0]; /* estimate's command lines start with it */
    if (strcmp(cmd, "prepare") == 0) return cmd_prepare(argc - 2, argv + 2); /* its own options and --help */
    if (strcmp(cmd, "train") == 0) run = cmd_train;
    else if (strcmp(cmd, "sample") == 0) run = cmd_sample;
    else if (strcmp(cmd, "plan") == 0) run = cmd_plan;
    else if (strcmp(cmd, "estimate") == 0) run = cmd_estimate;
    else {
        char msg[256];
        snprintf(msg, sizeof msg, "unknown command '%s' (train, sample, plan, estimate, prepare)", cmd);
        return usage_error(msg);
    }
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(cmd);
            return 0;
        }
    if (argc < 3) return usage_error("missing CONFIG.yml");
    const int code = run(argc - 2, argv + 2);
    mt_comm_set_exit_status(code); /* decided: mpirun's SIGTERM while exiting keeps it */
    return code;
}
