/* train/metrics.c: FLOP accounting and metrics.jsonl (see metrics.h). */
#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/log.h"
#include "train/json.h"

/* gemma4: MaxText's calculate_gemma4_small_tflops_training_per_device per token (metrics.h). */
static double gemma4_flops_per_token(const mt_model_config *c, int64_t seq) {
    const double T = (double)seq, D = (double)c->emb_dim, H = (double)c->num_query_heads;
    const double L = (double)c->num_decoder_layers, P = (double)c->per_layer_input_dim;
    const double w = c->sliding_window_size > 0 && c->sliding_window_size < seq ? (double)c->sliding_window_size : T;
    double attn = 0.0, weights = 2.0 * D * L * P + L * 4.0 * D * P + 2.0 * D * (double)c->vocab_size;
    for (int64_t l = 0; l < c->num_decoder_layers; l++) {
        const double dh = (double)mt_model_layer_head_dim(c, l), F = (double)mt_model_layer_mlp_dim(c, l);
        attn += mt_model_layer_is_local(c, l) ? 4.0 * (T * w - 0.5 * w * w) / T * H * dh : 2.0 * T * H * dh;
        weights += 4.0 * D * H * dh + 6.0 * D * F;
        if (mt_model_layer_kv_donor(c, l) < 0) weights += 4.0 * D * (double)c->num_kv_heads * dh;
    }
    return 3.0 * (attn + weights);
}

double mt_flops_per_token(const mt_model_config *c, int64_t seq) {
    if (c->decoder_block == MT_DECODER_GEMMA4) return gemma4_flops_per_token(c, seq);
    const double n = (double)mt_model_num_parameters(c);
    const double vd = (double)c->vocab_size * (double)c->emb_dim;
    const double n_emb = vd * (c->logits_via_embedding ? 1.0 : 2.0); /* embedding (+ untied lm_head) */
    double head_dims = 0.0; /* sum over the layers of the head dim */
    for (int64_t l = 0; l < c->num_decoder_layers; l++) head_dims += (double)mt_model_layer_head_dim(c, l);
    const double attn = 12.0 * (double)c->num_query_heads * head_dims * (double)seq;
    return 6.0 * (n - n_emb) + 6.0 * vd + attn; /* the logits matmul once, tied or not */
}

double mt_mfu(double flops_per_token, double tokens_per_s, double peak_flops) {
    if (!(peak_flops > 0.0)) return NAN;
    return flops_per_token * tokens_per_s / peak_flops;
}

int mt_metrics_format_json(const mt_step_metrics *m, char *buf, size_t n) {
    cJSON *row = cJSON_CreateObject();
    int bad = mt_json_add_int(row, "step", m->step);
    if (m->has_train) {
        bad |= mt_json_add_double(row, "loss", m->loss, "%.17g");
        bad |= mt_json_add_double(row, "lr", m->lr, "%.17g");
        bad |= mt_json_add_double(row, "grad_norm", m->grad_norm, "%.17g");
        bad |= mt_json_add_int(row, "tokens", m->tokens);
        bad |= mt_json_add_double(row, "tokens_per_s", m->tokens_per_s, "%.17g");
        bad |= mt_json_add_double(row, "step_ms", m->step_ms, "%.17g");
        bad |= mt_json_add_double(row, "mfu", m->mfu, "%.17g");
    }
    if (m->has_eval) {
        bad |= mt_json_add_double(row, "val_loss", m->val_loss, "%.17g");
        bad |= mt_json_add_int(row, "val_tokens", m->val_tokens);
    }
    char *line = bad ? NULL : mt_json_line(row);
    cJSON_Delete(row);
    const size_t len = line ? strlen(line) : 0;
    const int fits = line && len < n;
    if (fits) memcpy(buf, line, len + 1);
    free(line);
    return fits ? (int)len : -1;
}

struct mt_metrics_writer {
    FILE *f;
    char path[1100];
};

mt_status mt_metrics_open(mt_metrics_writer **out, const char *path, int append) {
    *out = NULL;
    mt_metrics_writer *w = calloc(1, sizeof *w);
    if (!w) return mt_set_error(MT_ERR_OOM, "metrics: out of memory");
    snprintf(w->path, sizeof w->path, "%s", path);
    w->f = fopen(path, append ? "ab" : "wb");
    if (!w->f) {
        mt_status s = mt_set_error(MT_ERR_IO, "cannot open metrics file '%s': %s", path, strerror(errno));
        free(w);
        return s;
    }
    *out = w;
    return MT_OK;
}

mt_status mt_metrics_write(mt_metrics_writer *w, const mt_step_metrics *m) {
    char line[1024];
    if (mt_metrics_format_json(m, line, sizeof line) < 0)
        return mt_set_error(MT_ERR_RUNTIME, "metrics: cannot format the row of step %lld (out of memory)",
                            (long long)m->step);
    if (fprintf(w->f, "%s\n", line) < 0 || fflush(w->f) != 0)
        return mt_set_error(MT_ERR_RUNTIME, "cannot write metrics file '%s': %s", w->path, strerror(errno));
    return MT_OK;
}

/* The step of a complete row `{"step": N, ...}` (line without its newline), or -1. */
static int64_t row_step(const char *line) {
    static const char head[] = "{\"step\": ";
    if (strncmp(line, head, sizeof head - 1) != 0) return -1;
    const char *p = line + sizeof head - 1;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (errno || end == p || v < 0 || (*end != ',' && *end != '}')) return -1;
    size_t len = strlen(line);
    if (len == 0 || line[len - 1] != '}') return -1;
    return (int64_t)v;
}

/* Why `line` (len bytes, its newline taken off) is not a row, or NULL when it is one:
 * the layout row_step reads ({"step": N, ...}) and a JSON object whose "step" is N. */
static const char *row_problem(const char *line, size_t len) {
    if (len == 0) return "an empty line";
    if (strlen(line) != len) return "a NUL byte inside";
    const int64_t s = row_step(line);
    if (s < 0) return "it does not start {\"step\": N, with N >= 0, and end in }";
    cJSON *row = cJSON_Parse(line);
    const cJSON *st = row ? cJSON_GetObjectItemCaseSensitive(row, "step") : NULL;
    const char *why = !row ? "not JSON" : !cJSON_IsObject(row) ? "not a JSON object"
                      : !cJSON_IsNumber(st) || st->valuedouble != (double)s ? "its \"step\" is not N" : NULL;
    cJSON_Delete(row);
    return why;
}

mt_status mt_metrics_check(const char *path, int64_t *torn_line) {
    *torn_line = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? MT_OK : mt_set_error(MT_ERR_IO, "cannot read metrics file '%s': %s", path,
                                                           strerror(errno));
    mt_status st = MT_OK;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    for (int64_t no = 1; st == MT_OK && (len = getline(&line, &cap, f)) > 0; no++) {
        if (line[len - 1] != '\n') { /* only the last line can lack one (getline) */
            *torn_line = no;
            break;
        }
        line[len - 1] = '\0';
        const char *why = row_problem(line, (size_t)len - 1);
        if (why)
            st = mt_set_error(MT_ERR_INVALID, "metrics file '%s' line %lld is not a metrics row (%s): resuming keeps "
                              "the rows up to the resumed step and cannot tell what this one held; the file is left "
                              "unchanged: repair or remove the line", path, (long long)no, why);
    }
    if (st == MT_OK && ferror(f)) st = mt_set_error(MT_ERR_IO, "cannot read metrics file '%s'", path);
    free(line);
    fclose(f);
    return st;
}

mt_status mt_metrics_open_resume(mt_metrics_writer **out, const char *path, int64_t step) {
    *out = NULL;
    int64_t torn = 0;
    MT_TRY(mt_metrics_check(path, &torn)); /* a corrupt row: nothing rewritten */
    FILE *in = fopen(path, "rb");
    if (!in) {
        if (errno != ENOENT)
            return mt_set_error(MT_ERR_IO, "cannot read metrics file '%s': %s", path, strerror(errno));
        return mt_metrics_open(out, path, 1);
    }
    char tmp[1100];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        fclose(in);
        return mt_set_error(MT_ERR_IO, "metrics path too long: '%s'", path);
    }
    FILE *o = fopen(tmp, "wb");
    if (!o) {
        mt_status s = mt_set_error(MT_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
        fclose(in);
        return s;
    }
    mt_status st = MT_OK;
    size_t cap = 4096, len = 0;
    char *line = malloc(cap);
    if (!line) st = mt_set_error(MT_ERR_OOM, "metrics: out of memory");
    for (int c; st == MT_OK && (c = fgetc(in)) != EOF;) {
        if (len + 1 >= cap) {
            char *p = realloc(line, cap * 2);
            if (!p) {
                st = mt_set_error(MT_ERR_OOM, "metrics: out of memory");
                break;
            }
            line = p, cap *= 2;
        }
        if (c != '\n') {
            line[len++] = (char)c;
            continue;
        }
        line[len] = '\0';
        const int64_t s = row_step(line); /* every complete line is a row (mt_metrics_check) */
        if (s >= 0 && s <= step && fprintf(o, "%s\n", line) < 0)
            st = mt_set_error(MT_ERR_RUNTIME, "cannot write '%s': %s", tmp, strerror(errno));
        len = 0; /* a last line without its newline (a crash mid-write) is dropped: torn */
    }
    if (st == MT_OK && ferror(in)) st = mt_set_error(MT_ERR_IO, "cannot read metrics file '%s'", path);
    free(line);
    fclose(in);
    if (fflush(o) != 0 || fsync(fileno(o)) != 0) {
        if (st == MT_OK) st = mt_set_error(MT_ERR_RUNTIME, "cannot write '%s': %s", tmp, strerror(errno));
    }
    if (fclose(o) != 0 && st == MT_OK) st = mt_set_error(MT_ERR_RUNTIME, "cannot write '%s': %s", tmp, strerror(errno));
    if (st == MT_OK && rename(tmp, path) != 0)
        st = mt_set_error(MT_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (st != MT_OK) {
        remove(tmp); /* the original file is untouched */
        return st;
    }
    if (torn > 0)
        MT_LOG_W("metrics file '%s' line %lld: a row cut short (no newline: the run stopped while writing it) was "
                 "dropped", path, (long long)torn);
    return mt_metrics_open(out, path, 1);
}

void mt_metrics_close(mt_metrics_writer *w) {
    if (!w) return;
    if (w->f) fclose(w->f);
    free(w);
}
