/* train/report.c: the output of `meshtrain plan` and `meshtrain estimate` (report.h). */
#include "train/report.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/json.h"

static const char *const k_axes[4] = {"data", "fsdp", "context", "tensor"};

void mt_report_human_bytes(double b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024.0 && i < 4) b /= 1024.0, i++;
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

/* doc (built without error when bad is 0) on one line of stdout (train/json.h), then
 * freed. Errors: MT_ERR_OOM, MT_ERR_RUNTIME (stdout cannot be written), naming what. */
static mt_status print_doc(cJSON *doc, int bad, const char *what) {
    char *line = bad ? NULL : mt_json_line(doc);
    cJSON_Delete(doc);
    if (!line) return mt_set_error(MT_ERR_OOM, "%s --json: out of memory", what);
    const int werr = printf("%s\n", line) < 0 || fflush(stdout) != 0;
    free(line);
    return werr ? mt_set_error(MT_ERR_RUNTIME, "%s --json: cannot write to stdout", what) : MT_OK;
}

/* "mesh": {"data": d, "fsdp": f, "context": c, "tensor": t} added to doc. */
static int json_mesh(cJSON *doc, const int dims[4]) {
    cJSON *mesh = mt_json_add_object(doc, "mesh");
    int bad = mesh == NULL;
    for (int a = 0; a < 4; a++) bad |= mt_json_add_int(mesh, k_axes[a], dims[a]);
    return bad;
}

/* Named tensor t is never saved, whatever the policy: mlpwo without a post-MLP norm
 * (models/model.h mt_model_remat_tensor_bytes: 0). plan and estimate print it alike. */
static int never_saved(const mt_train_config *cfg, int t) {
    return t == MT_RT_MLPWO && !cfg->model.use_post_ffw_norm;
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
static int json_rows(cJSON *doc, const char *key, const mt_memory_rows *r, const size_t *layer_kept) {
    cJSON *o = mt_json_add_object(doc, key);
    int bad = mt_json_add_size(o, "parameters", r->params);
    bad |= mt_json_add_size(o, "gradients_and_accumulators", r->grads);
    bad |= mt_json_add_size(o, "optimizer", r->optimizer);
    bad |= mt_json_add_size(o, "saved_activations", saved_sum(r));
    bad |= mt_json_add_size(o, "recompute_scratch", r->recompute_scratch);
    bad |= mt_json_add_size(o, "scratch", r->scratch);
    bad |= mt_json_add_size(o, "loss_tile", r->loss_tile);
    bad |= mt_json_add_size(o, "communication", r->comm);
    bad |= mt_json_add_size(o, "workspace", r->workspace);
    if (layer_kept) bad |= mt_json_add_size(o, "layer_kept", *layer_kept);
    return bad;
}

static int json_saved(cJSON *doc, const char *key, const mt_memory_rows *r) {
    cJSON *o = mt_json_add_object(doc, key);
    int bad = 0;
    for (int t = 0; t < MT_RT_COUNT; t++)
        bad |= mt_json_add_size(o, mt_remat_tensor_name((mt_remat_tensor)t), r->saved[t]);
    return bad | mt_json_add_size(o, "other", r->saved_other);
}

static mt_status plan_json(const mt_train_config *cfg, const mt_memory_report *r, const mt_plan *plan,
                           const mt_plan *host, const mt_remat_policy *pol) {
    size_t live[MT_MEM_CATEGORY_COUNT], total[MT_MEM_CATEGORY_COUNT];
    mt_plan_live_by_category(plan, live, NULL);
    mt_plan_total_by_category(plan, total);
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_string(doc, "model_name", cfg->model.model_name);
    bad |= mt_json_add_int(doc, "num_params", r->num_params);
    bad |= mt_json_add_int(doc, "per_device_batch_size", cfg->per_device_batch_size);
    bad |= mt_json_add_int(doc, "max_target_length", cfg->max_target_length);
    bad |= mt_json_add_int(doc, "gradient_accumulation_steps", cfg->gradient_accumulation_steps);
    bad |= mt_json_add_int(doc, "num_vocab_tiling", r->vocab_tiling[0]);
    bad |= mt_json_add_int(doc, "num_vocab_chunks", r->vocab_tiling[1]);
    if (r->vocab_tiling[2] > 0) /* gemma4: the per-layer embedding table's chunks (models/model.h) */
        bad |= mt_json_add_int(doc, "per_layer_embedding_chunks", r->vocab_tiling[2]);
    bad |= mt_json_add_string(doc, "dtype", mt_dtype_name(cfg->dtype));
    bad |= mt_json_add_string(doc, "grad_dtype", mt_dtype_name(cfg->grad_dtype));
    bad |= mt_json_add_string(doc, "remat_policy", mt_remat_policy_name((mt_remat_policy_kind)cfg->remat_policy));
    bad |= mt_json_add_int(doc, "num_devices", cfg->num_devices);
    bad |= json_mesh(doc, r->dims);
    bad |= mt_json_add_int(doc, "entries", mt_plan_count(plan));
    bad |= mt_json_add_int(doc, "peak_phase", r->peak_phase);
    bad |= mt_json_add_size(doc, "peak_bytes", r->peak);
    bad |= mt_json_add_size(doc, "live_at_peak_bytes", r->live_at_peak);
    /* per_device / saved: all entries of each row (any lifetime); the _live_at_peak
     * twins: the entries live at peak_phase (they add up to live_at_peak_bytes) */
    bad |= json_rows(doc, "per_device", &r->total, &r->layer_kept);
    bad |= json_rows(doc, "per_device_live_at_peak", &r->live, NULL);
    bad |= json_saved(doc, "saved", &r->total);
    bad |= json_saved(doc, "saved_live_at_peak", &r->live);
    cJSON *remat = mt_json_add_object(doc, "remat");
    for (int t = 0; t < MT_RT_COUNT; t++)
        bad |= mt_json_add_string(remat, mt_remat_tensor_name((mt_remat_tensor)t),
                                  never_saved(cfg, t) ? "never_saved" : mt_remat_action_name(pol->action[t]));
    cJSON *h = mt_json_add_object(doc, "host");
    bad |= mt_json_add_size(h, "activations", r->host_activations);
    bad |= mt_json_add_size(h, "parameters", r->host_params);
    bad |= mt_json_add_size(h, "optimizer", r->host_optimizer);
    bad |= mt_json_add_size(h, "total", r->host_total);
    bad |= mt_json_add_size(h, "pool_bytes", mt_plan_peak(host));
    const char *which[2] = {"live_at_peak", "total"};
    for (int w = 0; w < 2; w++) {
        cJSON *o = mt_json_add_object(doc, which[w]);
        for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++)
            bad |= mt_json_add_size(o, mt_mem_category_name((mt_mem_category)c), w ? total[c] : live[c]);
    }
    return print_doc(doc, bad, "plan");
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
        if (pol->action[t] == MT_RA_DEVICE && L > 0 && cfg->model.decoder_block == MT_DECODER_GEMMA4)
            snprintf(note, sizeof note, "device, %" PRId64 " layers of their own sizes", L); /* not alike */
        if (pol->action[t] != MT_RA_DEVICE && rt->saved[t] > 0) /* gemma4's KV donors (models/model_plan.c) */
            snprintf(note, sizeof note, "%s; the KV donors' kept for the sharing layers",
                     mt_remat_action_name(pol->action[t]));
        if (never_saved(cfg, t))
            snprintf(note, sizeof note, "never saved: no post-MLP norm needs it");
        print_bytes_row(label, &rl->saved[t], &rt->saved[t], note);
    }
}

static void plan_table(const mt_train_config *cfg, const mt_memory_report *r, const mt_remat_policy *pol) {
    const mt_memory_rows *rt = &r->total, *rl = &r->live;
    printf("memory plan of one device: %s, %.3fM params, batch %" PRId64 " x seq %" PRId64 ", %" PRId64
           " micro-batches, dtype %s, grad_dtype %s, %" PRId64 " vocab tiles%s, %" PRId64 " vocab chunks%s, "
           "remat_policy %s\n",
           cfg->model.model_name, (double)r->num_params / 1e6, cfg->per_device_batch_size, cfg->max_target_length,
           cfg->gradient_accumulation_steps, mt_dtype_name(cfg->dtype), mt_dtype_name(cfg->grad_dtype),
           r->vocab_tiling[0], cfg->num_vocab_tiling == 0 ? " (auto)" : "", r->vocab_tiling[1],
           cfg->num_vocab_chunks == 0 ? " (auto)" : "", mt_remat_policy_name((mt_remat_policy_kind)cfg->remat_policy));
    if (cfg->num_vocab_tiling == 0 || cfg->num_vocab_chunks == 0)
        printf("auto (num_vocab_tiling / num_vocab_chunks = 0): vocabulary chunks no larger than the largest "
               "decoder-layer weight (with grad_window_chunks, its largest row block: the layer gradient window) "
               "where fsdp, parameter offload or gradient windows hold the vocabulary (else 1); "
               "row tiles so that the loss tile is no larger than that weight (vocabulary in chunks) or one decoder "
               "layer's parameters (whole)\n");
    if (r->vocab_tiling[2] > 0)
        printf("per-layer embedding table [vocab, layers x per_layer_input_dim] in %" PRId64 " chunk(s): 1 when the "
               "vocabulary is whole, else the fewest no larger than the largest decoder-layer weight and at least "
               "the vocabulary chunks\n", r->vocab_tiling[2]);
    printf("mesh: %" PRId64 " device(s) = data %d x fsdp %d x context %d x tensor %d (rank 0: exactly what "
           "`train` allocates)\n", cfg->num_devices, r->dims[0], r->dims[1], r->dims[2], r->dims[3]);
    char col[48];
    snprintf(col, sizeof col, "live at peak (phase %d)", r->peak_phase);
    printf("  %-44s %27s %27s\n", "device buffers, bytes", col, "all entries (any phase)");
    const size_t ssl = saved_sum(rl), sst = saved_sum(rt), sl = rows_sum(rl), stt = rows_sum(rt);
    print_bytes_row("parameters", &rl->params, &rt->params,
                    cfg->parameter_memory_host_offload
                        ? (cfg->param_window_unit ? "(weight windows; rest on host)" : "(layer windows; rest on host)")
                        : "");
    print_bytes_row("gradients and accumulators", &rl->grads, &rt->grads, "");
    print_bytes_row("optimizer (AdamW m, v, segments)", &rl->optimizer, &rt->optimizer, "");
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

mt_status mt_report_plan(const mt_train_config *cfg, const mt_memory_report *r, const mt_plan *plan,
                         const mt_plan *host, const mt_remat_policy *pol, int json) {
    if (json) return plan_json(cfg, r, plan, host, pol);
    plan_table(cfg, r, pol);
    return MT_OK;
}

/* -------------------------------------------------------------- estimate ---- */

/* The action of tensor t in an estimate row as printed: mlpwo without a post-MLP norm
 * is never saved whatever the policy says (`plan` prints the same). */
static const char *estimate_action(const mt_train_config *cfg, const mt_estimate_row *row, int t) {
    if (never_saved(cfg, t)) return "-";
    return mt_remat_action_name(row->policy.action[t]);
}

/* "data fsdp" etc.: the axes searched (not held), or "none" into buf[n]. */
static void searched_axes(const mt_estimate_result *res, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int a = 0; a < 4; a++)
        if (!res->fixed_axes[a]) {
            int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", k_axes[a]);
            if (w > 0 && (size_t)w < n - used) used += (size_t)w;
        }
    if (!used) snprintf(buf, n, "none");
}

static mt_status estimate_json(const mt_train_config *cfg, const mt_estimate_result *res, const mt_step_model *sm,
                               const char (*commands)[MT_REPORT_COMMAND_MAX], const char *commands_file) {
    const int cpu = cfg->backend == MT_BACKEND_CPU; /* the step model is a GPU's */
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_string(doc, "model_name", cfg->model.model_name);
    bad |= mt_json_add_int(doc, "num_params", mt_model_num_parameters(&cfg->model));
    bad |= mt_json_add_int(doc, "max_target_length", cfg->max_target_length);
    bad |= mt_json_add_int(doc, "gradient_accumulation_steps", cfg->gradient_accumulation_steps);
    bad |= mt_json_add_int(doc, "num_devices", cfg->num_devices);
    bad |= json_mesh(doc, res->rows[0].dims); /* the top row's */
    cJSON *ms = mt_json_add_object(doc, "mesh_search");
    bad |= ms == NULL;
    cJSON *held = mt_json_add_array(ms, "held_axes");
    cJSON *free_axes = mt_json_add_array(ms, "searched_axes");
    bad |= held == NULL || free_axes == NULL;
    for (int a = 0; a < 4 && !bad; a++) {
        cJSON *w = cJSON_CreateString(k_axes[a]);
        bad |= w == NULL || !cJSON_AddItemToArray(res->fixed_axes[a] ? held : free_axes, w);
    }
    bad |= mt_json_add_int(ms, "candidates", res->candidates);
    bad |= mt_json_add_int(ms, "refused", res->refused);
    bad |= mt_json_add_int(ms, "no_fit", res->no_fit);
    bad |= mt_json_add_int(ms, "bounded", res->bounded);
    bad |= mt_json_add_int(ms, "searched", res->searched);
    bad |= mt_json_add_int(ms, "listed", res->nlayouts);
    bad |= mt_json_add_double(doc, "hbm_gib", cfg->hbm_gib, "%.17g");
    bad |= mt_json_add_size(doc, "budget_bytes", res->budget);
    bad |= mt_json_add_string(doc, "mode", res->mode == 1 ? "pareto" : "fixed_batch");
    bad |= mt_json_add_int(doc, "plans_evaluated", res->plans);
    bad |= mt_json_add_double(doc, "search_seconds", res->seconds, "%.6f");
    cJSON *m = mt_json_add_object(doc, "step_model");
    bad |= mt_json_add_double(m, "device_flops", sm->device_flops, "%.6g");
    bad |= mt_json_add_double(m, "host_bytes_per_s", sm->host_bw, "%.6g");
    bad |= mt_json_add_double(m, "link_bytes_per_s", sm->link_bw, "%.6g");
    bad |= mt_json_add_string(m, "device", sm->device);
    bad |= mt_json_add_bool(m, "applies_to_backend", !cpu);
    bad |= mt_json_add_string(doc, "commands_file", commands_file);
    cJSON *rows = mt_json_add_array(doc, "rows");
    bad |= rows == NULL;
    for (int i = 0; i < res->nrows; i++) {
        const mt_estimate_row *row = &res->rows[i];
        cJSON *o = mt_json_add_object(rows, NULL);
        bad |= mt_json_add_int(o, "rank", i + 1);
        bad |= mt_json_add_int(o, "layout", row->layout);
        bad |= json_mesh(o, row->dims);
        bad |= mt_json_add_int(o, "per_device_batch_size", row->batch);
        bad |= mt_json_add_size(o, "device_bytes", row->peak);
        bad |= mt_json_add_size(o, "host_bytes", row->host);
        bad |= mt_json_add_double(o, "step_s", row->step_s, "%.9g");
        bad |= mt_json_add_double(o, "flops", row->flops, "%.9g");
        bad |= mt_json_add_int(o, "collective_bytes", (int64_t)row->comm_bytes);
        bad |= mt_json_add_double(o, "tokens_per_s_per_device", row->tokens_per_s, "%.9g");
        cJSON *remat = mt_json_add_object(o, "remat");
        for (int t = 0; t < MT_RT_COUNT; t++) {
            const char *act = estimate_action(cfg, row, t);
            bad |= mt_json_add_string(remat, mt_remat_tensor_name((mt_remat_tensor)t),
                                      strcmp(act, "-") == 0 ? "never_saved" : act);
        }
        bad |= mt_json_add_string(o, "command", commands[i]);
    }
    return print_doc(doc, bad, "estimate");
}

static void estimate_table(const mt_train_config *cfg, const mt_estimate_result *res, const mt_step_model *sm,
                           const char *commands_file, int any_fixed) {
    const int cpu = cfg->backend == MT_BACKEND_CPU; /* the step model is a GPU's */
    char axes[64];
    searched_axes(res, axes, sizeof axes);
    printf("estimate: %s (%.3fB params), seq %" PRId64 ", %" PRId64 " micro-batch(es), %" PRId64
           " device(s), budget hbm_gib=%g (%zu bytes)\n",
           cfg->model.model_name, (double)mt_model_num_parameters(&cfg->model) / 1e9, cfg->max_target_length,
           cfg->gradient_accumulation_steps, cfg->num_devices, cfg->hbm_gib, res->budget);
    printf("mesh: data x fsdp x context x tensor = %" PRId64 ", axes searched: %s; %d layout(s): %d refused by the "
           "trainer's layout rules, %d do not fit, %d bounded out, %d searched; the best %d listed\n",
           cfg->num_devices, axes, res->candidates, res->refused, res->no_fit, res->bounded, res->searched,
           res->nlayouts);
    printf("plans: the trainer's own (exactly what `train` allocates on rank 0 of each layout)\n");
    printf("mode: %s%s; plans evaluated %d in %.3f s\n",
           res->mode == 1 ? "batch size and policy searched together (Pareto list per layout)"
                          : "fixed batch size, lightest policy that fits",
           any_fixed ? ", respecting the fixed tensors" : "", res->plans, res->seconds);
    printf("step model: %.0f TFLOP/s per device, host link %.0f GB/s, collective link %.0f GB/s, no overlap; "
           "dtype=%s (%s)\n", sm->device_flops / 1e12, sm->host_bw / 1e9, sm->link_bw / 1e9,
           mt_dtype_name(cfg->dtype), sm->device);
    if (cpu)
        printf("note: backend=cpu: the step model describes that GPU, not a CPU, so the step s and tokens/s "
               "columns (and the ranking) mean nothing here; the memory figures are exact\n");
    printf("%-4s %6s %5s %5s %7s %6s %6s %11s %9s %11s %9s %12s  %s\n", "rank", "layout", "data", "fsdp", "context",
           "tensor", "batch", "device GiB", "host GiB", "step s", "comm GB", "tokens/s/dev",
           "policy (q k v context out_proj mlpwi_0 mlpwi_1 mlpwo)");
    for (int i = 0; i < res->nrows; i++) {
        const mt_estimate_row *row = &res->rows[i];
        char pol[160] = "";
        size_t used = 0;
        for (int t = 1; t < MT_RT_COUNT; t++) {
            int w = snprintf(pol + used, sizeof pol - used, "%s%s", t > 1 ? " " : "", estimate_action(cfg, row, t));
            if (w > 0 && (size_t)w < sizeof pol - used) used += (size_t)w;
        }
        printf("%-4d %6d %5d %5d %7d %6d %6" PRId64 " %11.2f %9.2f %11.7g %9.2f %12.0f  %s\n", i + 1, row->layout,
               row->dims[0], row->dims[1], row->dims[2], row->dims[3], row->batch,
               (double)row->peak / 1073741824.0, (double)row->host / 1073741824.0, row->step_s,
               (double)row->comm_bytes / 1e9, row->tokens_per_s, pol);
    }
    if (!cfg->model.use_post_ffw_norm)
        printf("mlpwo '-': never saved (no post-MLP norm needs it), whatever the policy\n");
    printf("wrote %d command(s) to ./%s\n", res->nrows, commands_file);
}

mt_status mt_report_estimate(const mt_train_config *cfg, const mt_estimate_result *res, const mt_step_model *sm,
                             const char (*commands)[MT_REPORT_COMMAND_MAX], const char *commands_file, int any_fixed,
                             int json) {
    if (json) return estimate_json(cfg, res, sm, commands, commands_file);
    estimate_table(cfg, res, sm, commands_file, any_fixed);
    return MT_OK;
}

/* ------------------------------------------------------ estimate commands ---- */

/* s as one shell word: unchanged when it holds only characters no shell treats
 * specially, else in single quotes (each ' written as '\''). Returns 0 when buf was
 * too small. */
static int shell_word(char *buf, size_t n, const char *s) {
    int plain = s[0] != '\0';
    for (const char *c = s; *c && plain; c++)
        plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                strchr("_-./:=+,@%", *c) != NULL;
    size_t used = 0;
    if (!plain) buf[used++] = '\'';
    for (const char *c = s; *c; c++) {
        if (used + 6 >= n) return 0;
        if (!plain && *c == '\'') {
            memcpy(buf + used, "'\\''", 4);
            used += 4;
        } else {
            buf[used++] = *c;
        }
    }
    if (!plain) buf[used++] = '\'';
    buf[used] = '\0';
    return 1;
}

/* mt_report_estimate_command's line into buf[n]: 1, or 0 when buf was too small. */
static int command_line(char *buf, size_t n, const char *prog, const char *path, int argc, char *const *argv,
                        const mt_train_config *cfg, const int dims[4], const mt_estimate_row *row) {
    size_t used = 0;
    char word[2048];
#define CMD_ADD(...)                                                            \
    do {                                                                        \
        int w_ = snprintf(buf + used, n - used, __VA_ARGS__);                   \
        if (w_ < 0 || (size_t)w_ >= n - used) return 0;                         \
        used += (size_t)w_;                                                     \
    } while (0)
    buf[0] = '\0';
    if (cfg->num_devices > 1) CMD_ADD("mpirun -np %" PRId64 " ", cfg->num_devices);
    if (!shell_word(word, sizeof word, prog)) return 0;
    CMD_ADD("%s train", word);
    if (!shell_word(word, sizeof word, path)) return 0;
    CMD_ADD(" %s", word);
    static const char *const own[] = {"hbm_gib", "num_devices", "per_device_batch_size", "remat_policy",
                                      "ici_data_parallelism", "ici_fsdp_parallelism", "ici_context_parallelism",
                                      "ici_tensor_parallelism", NULL};
    for (int k = 1; k < argc; k++) {
        const char *eq = strchr(argv[k], '=');
        if (!eq) continue;
        size_t kl = (size_t)(eq - argv[k]);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(kl < 63 ? kl : 63), argv[k]);
        mt_remat_tensor t;
        int skip = mt_remat_tensor_parse(key, &t) == MT_OK;
        for (int i = 0; own[i] && !skip; i++) skip = strcmp(key, own[i]) == 0;
        if (skip) continue;
        if (!shell_word(word, sizeof word, argv[k])) return 0;
        CMD_ADD(" %s", word);
    }
    CMD_ADD(" per_device_batch_size=%" PRId64 " remat_policy=custom", row->batch);
    for (int t = 0; t < MT_RT_COUNT; t++) {
        if (never_saved(cfg, t)) continue; /* nothing to choose */
        CMD_ADD(" %s=%s", mt_remat_tensor_name((mt_remat_tensor)t), mt_remat_action_name(row->policy.action[t]));
    }
    if (cfg->num_devices > 1) CMD_ADD(" num_devices=%" PRId64, cfg->num_devices); /* = the world: train accepts it */
    CMD_ADD(" ici_data_parallelism=%d ici_fsdp_parallelism=%d ici_context_parallelism=%d ici_tensor_parallelism=%d",
            dims[0], dims[1], dims[2], dims[3]);
#undef CMD_ADD
    return 1;
}

mt_status mt_report_estimate_command(char *buf, size_t n, const char *prog, const char *path, int argc,
                                     char *const *argv, const mt_train_config *cfg, const int dims[4],
                                     const mt_estimate_row *row) {
    if (command_line(buf, n, prog, path, argc, argv, cfg, dims, row)) return MT_OK;
    if (n) buf[0] = '\0';
    return mt_set_error(MT_ERR_INVALID, "estimate: a command line is over %zu bytes", n);
}

mt_status mt_report_write_commands_file(const char *path, const mt_train_config *cfg, const mt_estimate_result *res,
                                        const char (*cmds)[MT_REPORT_COMMAND_MAX], int n) {
    const char *tmp = MT_REPORT_COMMANDS_FILE ".tmp";
    FILE *f = fopen(tmp, "w");
    if (!f) return mt_set_error(MT_ERR_IO, "cannot write %s in the current directory", tmp);
    char axes[64];
    searched_axes(res, axes, sizeof axes);
    fprintf(f, "# meshtrain estimate %s: hbm_gib=%g, %" PRId64 " device(s), axes searched: %s; best first: data %d x "
            "fsdp %d x context %d x tensor %d; ranked by modelled tokens/s, each line with its layout's ici_* keys; "
            "each runs as written from the directory estimate ran in%s\n",
            path, cfg->hbm_gib, cfg->num_devices, axes, res->rows[0].dims[0], res->rows[0].dims[1],
            res->rows[0].dims[2], res->rows[0].dims[3], cfg->num_devices > 1 ? " (mpirun -np N)" : "");
    for (int i = 0; i < n; i++) fprintf(f, "%s\n", cmds[i]);
    const int werr = ferror(f);
    if (fclose(f) != 0 || werr || rename(tmp, MT_REPORT_COMMANDS_FILE) != 0) {
        remove(tmp);
        return mt_set_error(MT_ERR_IO, "cannot write ./%s", MT_REPORT_COMMANDS_FILE);
    }
    return MT_OK;
}
