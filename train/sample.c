/* train/sample.c: vocabulary decoding and sampling from a checkpoint (see sample.h). */
#include "train/sample.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "models/checkpoint.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "train/tokenizer.h"
#include "train/trainer.h"

#define MT_SAMPLE_STREAM 0x53414d50u /* "SAMP" */

/* (logit, id) pairs sorted by logit descending, ties by lower id (for top-k). */
typedef struct scored { float v; int64_t id; } scored;
static int by_logit_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

int64_t mt_sample_pick(const float *logits, int64_t V, double temperature, int64_t top_k, double u) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0.0 || V <= 1 || top_k == 1) return best;
    scored *c = malloc(sizeof(scored) * (size_t)V);
    double *p = malloc(sizeof(double) * (size_t)V);
    if (!c || !p) {
        free(c);
        free(p);
        return best; /* out of memory: degrade to greedy */
    }
    for (int64_t i = 0; i < V; i++) c[i].v = logits[i], c[i].id = i;
    const int64_t k = (top_k > 0 && top_k < V) ? top_k : V;
    if (k < V) qsort(c, (size_t)V, sizeof(scored), by_logit_desc);
    const double mx = logits[best];
    double total = 0.0;
    for (int64_t r = 0; r < k; r++) {
        p[r] = exp(((double)c[r].v - mx) / temperature);
        total += p[r];
    }
    const double target = u * total;
    double cum = 0.0;
    int64_t pick = c[k - 1].id;
    for (int64_t r = 0; r < k; r++) {
        cum += p[r];
        if (cum > target) {
            pick = c[r].id;
            break;
        }
    }
    free(c);
    free(p);
    return pick;
}

void mt_sample_result_free(mt_sample_result *r) {
    if (!r) return;
    free(r->ids);
    free(r->text);
    memset(r, 0, sizeof *r);
}

mt_status mt_sample_parse_ids(const char *key, const char *s, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    int64_t cap = 0;
    const char *p = s, *end = s + strlen(s);
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r')) end--;
    if (*p == '[' && end > p + 1 && end[-1] == ']') p++, end--; /* a YAML list "[2, 651, 3]" */
    int after_id = 0; /* an id was read since the last comma */
    for (;;) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
        if (p < end && *p == ',') {
            if (!after_id) { /* "1,,2", ",1", "1," */
                free(*ids);
                *ids = NULL;
                *n = 0;
                return mt_set_error(MT_ERR_INVALID, "key '%s' = '%s': an empty entry (give token ids separated by "
                                    "commas or spaces)", key, s);
            }
            after_id = 0;
            p++;
            continue;
        }
        if (p >= end) {
            if (*n > 0 && !after_id) {
                free(*ids);
                *ids = NULL;
                *n = 0;
                return mt_set_error(MT_ERR_INVALID, "key '%s' = '%s': an empty entry after the last comma", key, s);
            }
            break;
        }
        after_id = 1;
        const char *w = p;
        long long v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 12) v = v * 10 + (*p++ - '0'), digits++;
        if (!digits || (p < end && *p != ',' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') || v > INT32_MAX) {
            int len = 0;
            while (w[len] && w[len] != ',' && w[len] != ' ' && len < 40) len++;
            free(*ids);
            *ids = NULL;
            *n = 0;
            return mt_set_error(MT_ERR_INVALID, "key '%s': '%.*s' is not a token id (decimal integers in [0, 2^31) "
                                "separated by commas or spaces)", key, len, w);
        }
        if (*n == cap) {
            cap = cap ? cap * 2 : 64;
            int32_t *q = realloc(*ids, sizeof(int32_t) * (size_t)cap);
            if (!q) {
                free(*ids);
                *ids = NULL;
                *n = 0;
                return mt_set_error(MT_ERR_OOM, "key '%s': out of memory", key);
            }
            *ids = q;
        }
        (*ids)[(*n)++] = (int32_t)v;
    }
    if (*n == 0) return mt_set_error(MT_ERR_INVALID, "key '%s' = '%s' holds no token id", key, s);
    return MT_OK;
}

mt_status mt_sample_generate(const mt_train_config *cfg, const char *checkpoint_dir, const int32_t *prompt,
                             int64_t nprompt, mt_sample_result *out) {
    memset(out, 0, sizeof *out);
    if (!checkpoint_dir || !checkpoint_dir[0])
        return mt_set_error(MT_ERR_INVALID, "sample: no checkpoint (set load_checkpoint=DIR)");
    /* the decode model holds sample_length + 1 positions, fewer than 2^31 (mt_model_create) */
    if (cfg->sample_length < 1 || cfg->sample_length > MT_SAMPLE_LENGTH_MAX)
        return mt_set_error(MT_ERR_INVALID, "key 'sample_length' = %lld: out of range; sample generates 1 to %lld "
                            "tokens (a KV cache of sample_length + 1 positions, fewer than 2^31)",
                            (long long)cfg->sample_length, (long long)MT_SAMPLE_LENGTH_MAX);
    if (!prompt) nprompt = 0;
    if (nprompt > MT_SAMPLE_LENGTH_MAX + 1 - cfg->sample_length)
        return mt_set_error(MT_ERR_INVALID, "key 'sample_length' = %lld after a prompt of %lld tokens: the KV cache "
                            "of prompt + sample_length positions must stay below 2^31", (long long)cfg->sample_length,
                            (long long)nprompt);
    mt_backend *be;
    MT_TRY(mt_trainer_select_backend(cfg, &be));
    /* exists, is a directory, not an unfinished step_<N>.tmp (the model is checked below,
     * from the checkpoint's own config.json) */
    MT_TRY(mt_trainer_check_checkpoint_dir(cfg, "load_checkpoint", checkpoint_dir, 0));
    if (!cfg->tokenizer_path[0])
        return mt_set_error(MT_ERR_INVALID, "key 'tokenizer_path' is empty: sample decodes with a tokenizer.json "
                            "or a SentencePiece .vocab file");
    struct stat sb;
    char inside[MT_CONFIG_PATH_MAX + 32];
    snprintf(inside, sizeof inside, "%s/tokenizer.json", cfg->tokenizer_path);
    if (stat(cfg->tokenizer_path, &sb) == 0 && S_ISDIR(sb.st_mode) && stat(inside, &sb) != 0)
        return mt_set_error(MT_ERR_IO, "key 'tokenizer_path' = '%s' is a directory without a tokenizer.json (give a "
                            "tokenizer.json, a directory holding one, or a SentencePiece .vocab)", cfg->tokenizer_path);
    mt_tokenizer *vocab = NULL;
    MT_TRY(mt_tokenizer_load(&vocab, cfg->tokenizer_path));
    const int64_t bos = mt_tokenizer_bos(vocab);
    mt_status st = MT_OK;
    if (nprompt == 0 && bos < 0)
        st = mt_set_error(MT_ERR_INVALID, "%s: the tokenizer defines no BOS to start from: give a prompt "
                          "(prompt=TEXT or prompt_ids=ID,...)", cfg->tokenizer_path);
    mt_model_config mc;
    char path[MT_CONFIG_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", checkpoint_dir);
    if (st == MT_OK) st = mt_hf_config_read(path, &mc);
    if (st == MT_OK) st = mt_model_config_validate(&mc);
    if (st == MT_OK && cfg->top_k > mc.vocab_size) /* (main.c validates it too; a library caller may not) */
        st = mt_set_error(MT_ERR_INVALID, "key 'top_k' = %lld is more than the model's vocab_size %lld (%s): top_k "
                          "keeps the k most likely of vocab_size tokens; give %lld or less (0 = all tokens)",
                          (long long)cfg->top_k, (long long)mc.vocab_size, path, (long long)mc.vocab_size);
    const int64_t ntok = mt_tokenizer_size(vocab);
    if (st == MT_OK && (ntok + MT_SAMPLE_VOCAB_PAD - 1) / MT_SAMPLE_VOCAB_PAD * MT_SAMPLE_VOCAB_PAD < mc.vocab_size)
        st = mt_set_error(MT_ERR_INVALID, "key 'tokenizer_path' = '%s' holds %lld ids, but the model (%s) has "
                          "vocab_size %lld: more than padding to a multiple of %lld, so it is another model's "
                          "tokenizer; give the one the model was trained with", cfg->tokenizer_path,
                          (long long)ntok, path, (long long)mc.vocab_size, (long long)MT_SAMPLE_VOCAB_PAD);
    if (st == MT_OK && nprompt == 0 && bos >= mc.vocab_size)
        st = mt_set_error(MT_ERR_INVALID, "BOS id %lld is outside the model's vocabulary %lld", (long long)bos,
                          (long long)mc.vocab_size);
    for (int64_t i = 0; st == MT_OK && i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= mc.vocab_size)
            st = mt_set_error(MT_ERR_INVALID, "prompt token %lld (id %d, key 'prompt_ids' or the encoded 'prompt') is "
                              "outside the model's vocabulary of %lld", (long long)i, (int)prompt[i],
                              (long long)mc.vocab_size);
    const int64_t start = nprompt ? nprompt : 1;   /* ids before the first generated one */
    const int64_t seq = cfg->sample_length + start;
    mt_model *model = NULL;
    mt_plan *plan = NULL;
    mt_arena arena;
    int have_arena = 0;
    float *logits = NULL;
    /* A decode model (models/model.h): a KV cache of seq positions, one row per step. */
    if (st == MT_OK) st = mt_model_create(&model, &mc, be, 1, seq, 1, NULL);
    if (st == MT_OK) st = mt_model_set_decode(model, 1);
    if (st == MT_OK) st = mt_plan_new(&plan);
    if (st == MT_OK) st = mt_model_add_to_plan(model, plan);
    if (st == MT_OK) st = mt_plan_finalize(plan);
    const int planned = st == MT_OK;
    if (st == MT_OK) st = mt_backend_arena_create(be, &arena, plan), have_arena = st == MT_OK;
    if (st == MT_ERR_OOM) { /* the model's tables and KV cache grow with sample_length: say so (still exit 1) */
        char why[256], size[96] = "";
        snprintf(why, sizeof why, "%s", mt_last_error());
        if (planned)
            snprintf(size, sizeof size, " needs %zu bytes (%.3f GiB), which", mt_plan_peak(plan),
                     (double)mt_plan_peak(plan) / 1073741824.0);
        st = mt_set_error(MT_ERR_OOM, "sample: the decode model of sample_length = %lld (the weights and a KV "
                          "cache of %lld positions)%s cannot be allocated (%s); lower key 'sample_length'",
                          (long long)cfg->sample_length, (long long)seq, size, why);
    }
    if (st == MT_OK) st = mt_model_bind(model, &arena, plan);
    if (st == MT_OK) st = mt_checkpoint_load_model(checkpoint_dir, model);
    if (st == MT_OK) {
        out->ids = malloc(sizeof(int32_t) * (size_t)seq);
        logits = malloc(sizeof(float) * (size_t)mc.vocab_size);
        if (!out->ids || !logits)
            st = mt_set_error(MT_ERR_OOM, "sample: cannot allocate the %lld generated ids of sample_length = %lld",
                              (long long)seq, (long long)cfg->sample_length);
    }
    if (st == MT_OK) {
        if (nprompt) memcpy(out->ids, prompt, sizeof(int32_t) * (size_t)nprompt);
        else out->ids[0] = (int32_t)bos;
        out->n = start;
        const int64_t V = mc.vocab_size < mt_tokenizer_size(vocab) ? mc.vocab_size : mt_tokenizer_size(vocab);
        for (int64_t pos = 0; pos + 1 < seq; pos++) {
            /* feed the token at pos (cached keys / values hold 0 .. pos - 1): its row's logits */
            st = mt_model_decode_step(model, out->ids[pos], logits);
            if (st != MT_OK) break;
            if (pos + 1 < start) continue; /* inside the prompt: its next token is given */
            uint32_t w[4];
            mt_rng_u32x4((uint64_t)cfg->seed, MT_SAMPLE_STREAM, (uint64_t)pos, w);
            const double u = mt_rng_u01(w[0]);
            const int64_t next = mt_sample_pick(logits, V, cfg->temperature, cfg->top_k, u);
            if (mt_tokenizer_is_stop(vocab, next)) break;
            out->ids[pos + 1] = (int32_t)next;
            out->n = pos + 2;
        }
    }
    if (st == MT_OK) st = mt_tokenizer_decode(vocab, out->ids, out->n, &out->text);
    free(logits);
    mt_model_free(model);
    if (have_arena) mt_arena_destroy(&arena);
    mt_plan_free(plan);
    mt_tokenizer_free(vocab);
    if (st != MT_OK) mt_sample_result_free(out);
    return st;
}
