/* train/report.c: the output of `meshtrain plan` and `meshtrain estimate` (report.h). */
#include "train/report.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *const k_axes[4] = {"data", "fsdp", "context", "tensor"};

void mt_report_human_bytes(double b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) b /= 1024.0, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
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

/* ------------------------------------------------------------------ plan ---- */

/* One row of `plan`'s table: the bytes live at the peak phase and the sum of all the
 * row's entries (any lifetime), each as a count and in binary units; a NULL column is
 * left blank. */
static void print_bytes_row(const char *label, const size_t *live, const size_t *total, const char *note) {
    char h[2][32] = {"", ""}, b[2][32] = {"", ""};
    const size_t *v[2] = {live, total};
    for (int k = 0; k < 2; k++)
        if (v[k]) {
            snprintf(b[k], sizeof b[k], "%zu", *v[k]);
            mt_report_human_bytes((double)*v[k], h[k], sizeof h[k]);
        }
    printf("  %-44s %15s %11s %15s %11s%s%s\n", label, b[0], h[0], b[1], h[1], note && note[0] ? "  " : "",
           note ? note : "");
}

/* Saved activations of r (every named tensor and the norm statistics / step inputs),
 * and the sum of every row. */
static size_t saved_sum(const mt_memory_rows *r) {
    size_t s = r->saved_other;
    for (int t = 0; t < MT_RT_COUNT; t++) s += r->saved[t];
    return s;
}

static size_t rows_sum(const mt_memory_rows *r) {
    return r->params + r->grads + r->optimizer + saved_sum(r) + r->recompute_scratch + r->scratch + r->loss_tile +
           r->comm + r->workspace;
}

/* `"key": {...}` of the table's top rows under their JSON names (layer_kept: added
 * when non-NULL), and of the saved activations per named tensor. */
static void print_json_rows(const char *key, const mt_memory_rows *r, const size_t *layer_kept) {
    printf(", \"%s\": {\"parameters\": %zu, \"gradients_and_accumulators\": %zu, \"optimizer\": %zu"
           ", \"saved_activations\": %zu, \"recompute_scratch\": %zu, \"scratch\": %zu, \"loss_tile\": %zu"
           ", \"communication\": %zu, \"workspace\": %zu",
           key, r->params, r->grads, r->optimizer, saved_sum(r), r->recompute_scratch, r->scratch, r->loss_tile,
           r->comm, r->workspace);
    if (layer_kept) printf(", \"layer_kept\": %zu", *layer_kept);
    printf("}");
}

static void print_json_saved(const char *key, const mt_memory_rows *r) {
    printf(", \"%s\": {", key);
    for (int t = 0; t < MT_RT_COUNT; t++)
        printf("%s\"%s\": %zu", t ? ", " : "", mt_remat_tensor_name((mt_remat_tensor)t), r->saved[t]);
    printf(", \"other\": %zu}", r->saved_other);
}

static void plan_json(const mt_train_config *cfg, const mt_memory_report *r, const mt_plan *plan,
                      const mt_plan *host, const mt_remat_policy *pol) {
    size_t live[MT_MEM_CATEGORY_COUNT], total[MT_MEM_CATEGORY_COUNT];
    mt_plan_live_by_category(plan, live, NULL);
    mt_plan_total_by_category(plan, total);
    printf("{\"model_name\": ");
    print_json_str(cfg->model.model_name);
    printf(", \"num_params\": %" PRId64 ", \"per_device_batch_size\": %" PRId64 ", \"max_target_length\": %" PRId64
           ", \"gradient_accumulation_steps\": %" PRId64 ", \"num_vocab_tiling\": %" PRId64
           ", \"grad_dtype\": \"%s\", \"remat_policy\": \"%s\", \"num_devices\": %" PRId64 ", \"mesh\": {",
           r->num_params, cfg->per_device_batch_size, cfg->max_target_length, cfg->gradient_accumulation_steps,
           cfg->num_vocab_tiling, mt_dtype_name(cfg->grad_dtype),
           mt_remat_policy_name((mt_remat_policy_kind)cfg->remat_policy), cfg->num_devices);
    for (int a = 0; a < 4; a++) printf("%s\"%s\": %d", a ? ", " : "", k_axes[a], r->dims[a]);
    printf("}, \"entries\": %d, \"peak_phase\": %d, \"peak_bytes\": %zu, \"live_at_peak_bytes\": %zu",
           mt_plan_count(plan), r->peak_phase, r->peak, r->live_at_peak);
    /* per_device / saved: all entries of each row (any lifetime); the _live_at_peak
     * twins: the entries live at peak_phase (they add up to live_at_peak_bytes) */
    print_json_rows("per_device", &r->total, &r->layer_kept);
    print_json_rows("per_device_live_at_peak", &r->live, NULL);
    print_json_saved("saved", &r->total);
    print_json_saved("saved_live_at_peak", &r->live);
    printf(", \"remat\": {");
    for (int t = 0; t < MT_RT_COUNT; t++)
        printf("%s\"%s\": \"%s\"", t ? ", " : "", mt_remat_tensor_name((mt_remat_tensor)t),
               mt_remat_action_name(pol->action[t]));
    printf("}, \"host\": {\"activations\": %zu, \"parameters\": %zu, \"optimizer\": %zu, \"total\": %zu, "
           "\"pool_bytes\": %zu}",
           r->host_activations, r->host_params, r->host_optimizer, r->host_total, mt_plan_peak(host));
    const char *which[2] = {"live_at_peak", "total"};
    for (int w = 0; w < 2; w++) {
        printf(", \"%s\": {", which[w]);
        for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++)
            printf("%s\"%s\": %zu", c ? ", " : "", mt_mem_category_name((mt_mem_category)c),
                   w ? total[c] : live[c]);
        printf("}");
    }
    printf("}\n");
}

/* The saved-activation rows of the table: one per named tensor, with its action. */
static void plan_table_saved(const mt_train_config *cfg, const mt_memory_report *r, const mt_remat_policy *pol) {
    const int64_t L = cfg->model.num_decoder_layers;
    const mt_memory_rows *rt = &r->total, *rl = &r->live;
    for (int t = 0; t < MT_RT_COUNT; t++) {
        char label[64], note[96];
        snprintf(label, sizeof label, "  %s", mt_remat_tensor_name((mt_remat_tensor)t));
        snprintf(note, sizeof note, "%s%s", mt_remat_action_name(pol->action[t]),
                 pol->action[t] == MT_RA_DEVICE ? "" : " (not on the device)");
        if (pol->action[t] == MT_RA_DEVICE && L > 0)
            snprintf(note, sizeof note, "device, %" PRId64 " layers x %zu", L, rt->saved[t] / (size_t)L);
        if (t == MT_RT_MLPWO && !cfg->model.use_post_ffw_norm)
            snprintf(note, sizeof note, "never saved: no post-MLP norm needs it");
        print_bytes_row(label, &rl->saved[t], &rt->saved[t], note);
    }
}

static void plan_table(const mt_train_config *cfg, const mt_memory_report *r, const mt_remat_policy *pol) {
    const mt_memory_rows *rt = &r->total, *rl = &r->live;
    printf("memory plan of one device: %s, %.3fM params, batch %" PRId64 " x seq %" PRId64 ", %" PRId64
           " micro-batches, grad_dtype %s, %" PRId64 " vocab tiles, remat_policy %s\n",
           cfg->model.model_name, (double)r->num_params / 1e6, cfg->per_device_batch_size, cfg->max_target_length,
           cfg->gradient_accumulation_steps, mt_dtype_name(cfg->grad_dtype), cfg->num_vocab_tiling,
           mt_remat_policy_name((mt_remat_policy_kind)cfg->remat_policy));
    printf("mesh: %" PRId64 " device(s) = data %d x fsdp %d x context %d x tensor %d (rank 0: exactly what "
           "`train` allocates)\n", cfg->num_devices, r->dims[0], r->dims[1], r->dims[2], r->dims[3]);
    char col[48];
    snprintf(col, sizeof col, "live at peak (phase %d)", r->peak_phase);
    printf("  %-44s %27s %27s\n", "device buffers, bytes", col, "all entries (any phase)");
    const size_t ssl = saved_sum(rl), sst = saved_sum(rt), sl = rows_sum(rl), stt = rows_sum(rt);
    print_bytes_row("parameters", &rl->params, &rt->params,
                    cfg->parameter_memory_host_offload ? "(layer window; rest on host)" : "");
    print_bytes_row("gradients and accumulators", &rl->grads, &rt->grads, "");
    print_bytes_row("optimizer (AdamW m, v)", &rl->optimizer, &rt->optimizer, "");
    print_bytes_row("saved activations", &ssl, &sst, "");
    plan_table_saved(cfg, r, pol);
    print_bytes_row("  norm statistics, step inputs, final norm", &rl->saved_other, &rt->saved_other, "");
    print_bytes_row("recompute scratch (one layer, fwd + bwd)", &rl->recompute_scratch, &rt->recompute_scratch,
                    "");
    print_bytes_row("other scratch (per-op temporaries)", &rl->scratch, &rt->scratch, "");
    print_bytes_row("loss tile", &rl->loss_tile, &rt->loss_tile, "");
    print_bytes_row("communication buffers", &rl->comm, &rt->comm, "");
    print_bytes_row("workspace", &rl->workspace, &rt->workspace, "");
    print_bytes_row("sum of buffers", &sl, &stt, "");
    print_bytes_row("peak (arena size)", &r->peak, NULL, "every entry packed by lifetime");
    print_bytes_row("one more layer adds (its kept tensors)", NULL, &r->layer_kept, "+ its parameter state");
    printf("  %-44s %27s %27s\n", "host memory (apart from the device), bytes", "", "all entries");
    print_bytes_row("offloaded activations", NULL, &r->host_activations, "");
    print_bytes_row("parameters", NULL, &r->host_params, "");
    print_bytes_row("optimizer", NULL, &r->host_optimizer, "");
    print_bytes_row("host offload total", NULL, &r->host_total, "");
}

void mt_report_plan(const mt_train_config *cfg, const mt_memory_report *r, const mt_plan *plan,
                    const mt_plan *host, const mt_remat_policy *pol, int json) {
    if (json) plan_json(cfg, r, plan, host, pol);
    else plan_table(cfg, r, pol);
}

/* -------------------------------------------------------------- estimate ---- */

/* The action of tensor t in an estimate row as printed: mlpwo without a post-MLP norm
 * is never saved whatever the policy says (`plan` prints the same). */
static const char *estimate_action(const mt_train_config *cfg, const mt_estimate_row *row, int t) {
    if (t == MT_RT_MLPWO && !cfg->model.use_post_ffw_norm) return "-";
    return mt_remat_action_name(row->policy.action[t]);
}

static void estimate_json(const mt_train_config *cfg, const mt_memory_report *r0, const mt_estimate_result *res,
                          const mt_step_model *sm, const char (*commands)[MT_REPORT_COMMAND_MAX],
                          const char *commands_file) {
    const int cpu = cfg->backend == MT_BACKEND_CPU; /* the step model is a GPU's */
    printf("{\"model_name\": ");
    print_json_str(cfg->model.model_name);
    printf(", \"num_params\": %" PRId64 ", \"max_target_length\": %" PRId64 ", \"gradient_accumulation_steps\": %"
           PRId64 ", \"num_devices\": %" PRId64 ", \"mesh\": {", r0->num_params, cfg->max_target_length,
           cfg->gradient_accumulation_steps, cfg->num_devices);
    for (int a = 0; a < 4; a++) printf("%s\"%s\": %d", a ? ", " : "", k_axes[a], r0->dims[a]);
    printf("}, \"hbm_gib\": %.17g, \"budget_bytes\": %zu, \"mode\": \"%s\", \"plans_evaluated\": %d"
           ", \"search_seconds\": %.6f, \"step_model\": {\"device_flops\": %.6g, \"host_bytes_per_s\": %.6g"
           ", \"link_bytes_per_s\": %.6g, \"device\": ",
           cfg->hbm_gib, res->budget, res->mode == 1 ? "pareto" : "fixed_batch", res->plans, res->seconds,
           sm->device_flops, sm->host_bw, sm->link_bw);
    print_json_str(sm->device);
    printf(", \"applies_to_backend\": %s}, \"commands_file\": \"%s\", \"rows\": [", cpu ? "false" : "true",
           commands_file);
    for (int i = 0; i < res->nrows; i++) {
        const mt_estimate_row *row = &res->rows[i];
        printf("%s{\"rank\": %d, \"per_device_batch_size\": %" PRId64 ", \"device_bytes\": %zu, \"host_bytes\": "
               "%zu, \"step_s\": %.9g, \"tokens_per_s_per_device\": %.9g, \"remat\": {", i ? ", " : "", i + 1,
               row->batch, row->peak, row->host, row->step_s, row->tokens_per_s);
        for (int t = 0; t < MT_RT_COUNT; t++) {
            const char *act = estimate_action(cfg, row, t);
            printf("%s\"%s\": \"%s\"", t ? ", " : "", mt_remat_tensor_name((mt_remat_tensor)t),
                   strcmp(act, "-") == 0 ? "never_saved" : act);
        }
        printf("}, \"command\": ");
        print_json_str(commands[i]);
        printf("}");
    }
    printf("]}\n");
}

static void estimate_table(const mt_train_config *cfg, const mt_memory_report *r0, const mt_estimate_result *res,
                           const mt_step_model *sm, const char *commands_file, int any_fixed) {
    const int cpu = cfg->backend == MT_BACKEND_CPU; /* the step model is a GPU's */
    printf("estimate: %s (%.3fB params), seq %" PRId64 ", %" PRId64 " micro-batch(es), %" PRId64
           " device(s) = data %d x fsdp %d x context %d x tensor %d, budget hbm_gib=%g (%zu bytes)\n",
           cfg->model.model_name, (double)r0->num_params / 1e9, cfg->max_target_length,
           cfg->gradient_accumulation_steps, cfg->num_devices, r0->dims[0], r0->dims[1], r0->dims[2], r0->dims[3],
           cfg->hbm_gib, res->budget);
    printf("plans: the trainer's own (exactly what `train` allocates on rank 0)\n");
    printf("mode: %s%s; plans evaluated %d in %.3f s\n",
           res->mode == 1 ? "batch size and policy searched together (Pareto list)"
                          : "fixed batch size, lightest policy that fits",
           any_fixed ? ", respecting the fixed tensors" : "", res->plans, res->seconds);
    printf("step model: %.0f TFLOP/s per device, host link %.0f GB/s, collective link %.0f GB/s, no overlap; "
           "float32 buffers (%s)\n", sm->device_flops / 1e12, sm->host_bw / 1e9, sm->link_bw / 1e9, sm->device);
    if (cpu)
        printf("note: backend=cpu: the step model describes that GPU, not a CPU, so the step s and tokens/s "
               "columns (and the ranking) mean nothing here; the memory figures are exact\n");
    printf("%-4s %6s %12s %10s %12s %14s  %s\n", "rank", "batch", "device GiB", "host GiB", "step s",
           "tokens/s/dev", "policy (q k v context out_proj mlpwi_0 mlpwi_1 mlpwo)");
    for (int i = 0; i < res->nrows; i++) {
        const mt_estimate_row *row = &res->rows[i];
        char pol[160] = "";
        size_t used = 0;
        for (int t = 1; t < MT_RT_COUNT; t++) {
            int w = snprintf(pol + used, sizeof pol - used, "%s%s", t > 1 ? " " : "", estimate_action(cfg, row, t));
            if (w > 0 && (size_t)w < sizeof pol - used) used += (size_t)w;
        }
        printf("%-4d %6" PRId64 " %12.2f %10.2f %12.7g %14.0f  %s\n", i + 1, row->batch,
               (double)row->peak / 1073741824.0, (double)row->host / 1073741824.0, row->step_s,
               row->tokens_per_s, pol);
    }
    if (!cfg->model.use_post_ffw_norm)
        printf("mlpwo '-': never saved (no post-MLP norm needs it), whatever the policy\n");
    printf("wrote %d command(s) to ./%s\n", res->nrows, commands_file);
}

void mt_report_estimate(const mt_train_config *cfg, const mt_memory_report *r0, const mt_estimate_result *res,
                        const mt_step_model *sm, const char (*commands)[MT_REPORT_COMMAND_MAX],
                        const char *commands_file, int any_fixed, int json) {
    if (json) estimate_json(cfg, r0, res, sm, commands, commands_file);
    else estimate_table(cfg, r0, res, sm, commands_file, any_fixed);
}
