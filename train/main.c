/* train/main.c: the `meshtrain` command line (DESIGN.md section 6).
 *
 *   meshtrain train  CONFIG.yml [key=value ...]
 *   meshtrain sample CONFIG.yml load_checkpoint=DIR [key=value ...]
 *   meshtrain plan   CONFIG.yml [--json] [key=value ...]
 *   meshtrain --help | meshtrain <command> --help
 *
 * A thin client of the library: it parses arguments, prints, and is the only place
 * that maps a status to an exit code (0 done, 1 runtime failure, 2 bad input), with
 * the message on stderr as "meshtrain: error: <mt_last_error()>". */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/model.h"
#include "runtime/log.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/sample.h"
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
                "  plan    print the per-device memory plan (--json for JSON)\n\n"
                "Precedence: built-in defaults < configs/models/<model_name>.yml < CONFIG.yml <\n"
                "key=value. The model file is looked up in <CONFIG dir>/models/,\n"
                "$MESHTRAIN_CONFIG_DIR/models/, <CONFIG dir>/configs/models/, ./configs/models/.\n"
                "Exit codes: 0 done, 1 runtime failure, 2 bad input.\n");
    } else if (strcmp(cmd, "train") == 0) {
        fprintf(o,
                "usage: meshtrain train CONFIG.yml [key=value ...]\n\n"
                "Trains for `steps` steps. Writes <base_output_directory>/<run_name>/metrics.jsonl\n"
                "(one JSON object per step) and checkpoints/step_<N>/ every checkpoint_period steps\n"
                "and at the end. load_checkpoint=DIR resumes a run bitwise; load_parameters_path=DIR\n"
                "starts from a model.safetensors.\n");
    } else if (strcmp(cmd, "sample") == 0) {
        fprintf(o,
                "usage: meshtrain sample CONFIG.yml load_checkpoint=DIR [key=value ...]\n\n"
                "Generates sample_length tokens after <s> from the checkpoint DIR with temperature\n"
                "and top_k, decoding with tokenizer_path, and prints the text.\n");
    } else if (strcmp(cmd, "plan") == 0) {
        fprintf(o,
                "usage: meshtrain plan CONFIG.yml [--json] [key=value ...]\n\n"
                "Prints the memory plan of one training step: bytes live per category at the\n"
                "peak phase, bytes per category over the whole step, and the arena size.\n");
    }
    print_keys(o);
}

/* Load CONFIG.yml + overrides from argv (after the command); --json is taken out. */
static mt_status load_config(int argc, char **argv, mt_train_config *cfg, int *json) {
    const char *path = argv[0];
    const char **ov = calloc((size_t)argc + 1, sizeof(char *));
    if (!ov) return mt_set_error(MT_ERR_OOM, "out of memory");
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (json && strcmp(argv[i], "--json") == 0) *json = 1;
        else ov[n++] = argv[i];
    }
    mt_status st = mt_train_config_load(cfg, path, n, ov);
    free(ov);
    return st;
}

/* A JSON string literal of s (quotes, backslashes and control bytes escaped). */
static void print_json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void human_bytes(double b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) b /= 1024.0, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

static void human_duration(double s, char *buf, size_t n) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, n, "%lds", t);
}

typedef struct console {
    int64_t log_period;
} console;

static void on_step(const mt_step_metrics *m, void *user) {
    const console *c = user;
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

static int cmd_train(int argc, char **argv) {
    mt_train_config cfg;
    mt_status st = load_config(argc, argv, &cfg, NULL);
    if (st != MT_OK) return fail(st);
    mt_trainer *t = NULL;
    st = mt_trainer_create(&t, &cfg);
    if (st != MT_OK) return fail(st);
    char peak[32];
    human_bytes((double)mt_plan_peak(mt_trainer_get_plan(t)), peak, sizeof peak);
    const mt_model *model = mt_trainer_model(t);
    printf("meshtrain: model %s (%s, %.3fM params), batch %" PRId64 " x %" PRId64 " x %" PRId64
           " accumulation, %" PRId64 " steps, memory plan %s\n",
           cfg.model.model_name, mt_decoder_block_name(cfg.model.decoder_block),
           (double)mt_model_numel(model) / 1e6, cfg.per_device_batch_size, cfg.max_target_length,
           cfg.gradient_accumulation_steps, cfg.steps, peak);
    printf("meshtrain: outputs in %s/%s\n", cfg.base_output_directory, cfg.run_name);
    if (mt_trainer_step_count(t) > 0)
        printf("meshtrain: resuming at step %" PRId64 " from %s\n", mt_trainer_step_count(t), cfg.load_checkpoint);
    fflush(stdout);
    console c = {cfg.log_period};
    st = mt_trainer_run(t, on_step, &c);
    mt_trainer_free(t);
    if (st != MT_OK) return fail(st);
    return 0;
}

static int cmd_sample(int argc, char **argv) {
    mt_train_config cfg;
    mt_status st = load_config(argc, argv, &cfg, NULL);
    if (st != MT_OK) return fail(st);
    if (!cfg.load_checkpoint[0]) return usage_error("sample needs load_checkpoint=DIR");
    mt_sample_result r;
    st = mt_sample_generate(&cfg, cfg.load_checkpoint, &r);
    if (st != MT_OK) return fail(st);
    printf("%s\n", r.text);
    mt_sample_result_free(&r);
    return 0;
}

static int cmd_plan(int argc, char **argv) {
    mt_train_config cfg;
    int json = 0;
    mt_status st = load_config(argc, argv, &cfg, &json);
    if (st != MT_OK) return fail(st);
    mt_plan *plan = NULL;
    int64_t nparams = 0;
    st = mt_trainer_plan(&cfg, &plan, &nparams);
    if (st != MT_OK) return fail(st);
    size_t live[MT_MEM_CATEGORY_COUNT], total[MT_MEM_CATEGORY_COUNT];
    int phase = 0;
    mt_plan_live_by_category(plan, live, &phase);
    mt_plan_total_by_category(plan, total);
    const size_t peak = mt_plan_peak(plan);
    if (json) {
        printf("{\"model_name\": ");
        print_json_str(cfg.model.model_name);
        printf(", \"num_params\": %" PRId64 ", \"per_device_batch_size\": %" PRId64
               ", \"max_target_length\": %" PRId64 ", \"num_vocab_tiling\": %" PRId64
               ", \"entries\": %d, \"peak_phase\": %d, \"peak_bytes\": %zu",
               nparams, cfg.per_device_batch_size, cfg.max_target_length,
               cfg.num_vocab_tiling, mt_plan_count(plan), phase, peak);
        const char *which[2] = {"live_at_peak", "total"};
        for (int w = 0; w < 2; w++) {
            printf(", \"%s\": {", which[w]);
            for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++)
                printf("%s\"%s\": %zu", c ? ", " : "", mt_mem_category_name((mt_mem_category)c),
                       w ? total[c] : live[c]);
            printf("}");
        }
        printf("}\n");
    } else {
        char a[32], b[32];
        printf("memory plan: %s, %.3fM params, batch %" PRId64 " x seq %" PRId64 ", %" PRId64
               " vocab tiles, %d buffers\n",
               cfg.model.model_name, (double)nparams / 1e6, cfg.per_device_batch_size, cfg.max_target_length,
               cfg.num_vocab_tiling, mt_plan_count(plan));
        printf("%-12s %16s %12s %16s %12s\n", "category", "live at peak", "", "total", "");
        size_t sl = 0, stt = 0;
        for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++) {
            human_bytes((double)live[c], a, sizeof a);
            human_bytes((double)total[c], b, sizeof b);
            printf("%-12s %16zu %12s %16zu %12s\n", mt_mem_category_name((mt_mem_category)c), live[c], a, total[c], b);
            sl += live[c];
            stt += total[c];
        }
        human_bytes((double)sl, a, sizeof a);
        human_bytes((double)stt, b, sizeof b);
        printf("%-12s %16zu %12s %16zu %12s\n", "sum", sl, a, stt, b);
        human_bytes((double)peak, a, sizeof a);
        printf("peak (arena) %16zu %12s   at phase %d\n", peak, a, phase);
    }
    mt_plan_free(plan);
    return 0;
}

int main(int argc, char **argv) {
    mt_log_set_level(MT_LOG_INFO);
    if (argc < 2) return usage_error("missing command (train, sample, plan)");
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        print_help(NULL);
        return 0;
    }
    const char *cmd = argv[1];
    int (*run)(int, char **) = NULL;
    if (strcmp(cmd, "train") == 0) run = cmd_train;
    else if (strcmp(cmd, "sample") == 0) run = cmd_sample;
    else if (strcmp(cmd, "plan") == 0) run = cmd_plan;
    else {
        char msg[256];
        snprintf(msg, sizeof msg, "unknown command '%s' (train, sample, plan)", cmd);
        return usage_error(msg);
    }
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(cmd);
            return 0;
        }
    if (argc < 3) return usage_error("missing CONFIG.yml");
    return run(argc - 2, argv + 2);
}
