/* tests/tools/model_dump.c: run a tiny decoder on the CPU backend and dump everything
 * the independent PyTorch reference (tests/reference/torch_decoder.py) checks.
 *
 *   model_dump PRESET OUTDIR        PRESET: llama3 | gemma | gemma2 | gemma3
 *
 * Writes to OUTDIR (raw little-endian arrays, row-major):
 *   tokens.bin, labels.bin            int32 [B*T] (labels may be -1 = ignored)
 *   param.<hf name>.bin               float32, the initial parameters
 *   grad.<hf name>.bin                float32, d(mean loss)/d(param) at the initial parameters
 *   logits.bin                        float32 [B*T, V] (after the final soft-cap)
 *   losses.bin                        float32 [5], mean loss before each AdamW step
 *   manifest.json                     config (MaxText key names), shapes, optimizer
 *                                     settings, loss and losses in float64
 * Exit status 0 on success, 1 on any failure (message on stderr). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/tools/tool_backend.h"
#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "train/optimizer.h"

#define STEPS 5
#define B 2
#define T 11
#define TILES 3 /* B*T = 22 rows: tiles of 7, 7 and 8 rows */

static const float k_lr = 1e-3f, k_b1 = 0.9f, k_b2 = 0.95f, k_eps = 1e-8f, k_wd = 0.1f;

typedef struct preset {
    const char *name;
    float mat_std_scale; /* matrices ~ N(0, (0.02 * this)^2) so activations are O(1) */
} preset;

static int make_config(const char *name, mt_model_config *c, preset *p) {
    p->name = name;
    p->mat_std_scale = 8.0f;
    if (strcmp(name, "llama3") == 0) {
        /* Llama 3 style: GQA 4/2, llama3 RoPE scaling with a short original context so
         * that all three frequency bands (kept, blended, divided) occur with Dh = 16. */
        mt_model_config_defaults(c, MT_DECODER_LLAMA2);
        c->vocab_size = 67;
        c->emb_dim = 32;
        c->num_query_heads = 4;
        c->num_kv_heads = 2;
        c->head_dim = 16;
        c->mlp_dim = 48;
        c->num_decoder_layers = 2;
        c->rope_max_timescale = 10000.0f;
        c->rope_type = MT_ROPE_LLAMA3;
        c->rope_factor = 8.0f;
        c->rope_low_freq_factor = 1.0f;
        c->rope_high_freq_factor = 4.0f;
        c->rope_original_max_position = 256;
    } else if (strcmp(name, "gemma") == 0) {
        /* Gemma 2B style: MQA (8/1 in the real model; 2/1 here), head_dim 256, tied,
         * GeGLU, 1 + w norms, embedding scaled by sqrt(d_model). */
        mt_model_config_defaults(c, MT_DECODER_GEMMA);
        c->vocab_size = 61;
        c->emb_dim = 48;
        c->num_query_heads = 2;
        c->num_kv_heads = 1;
        c->head_dim = 256;
        c->mlp_dim = 96;
        c->num_decoder_layers = 2;
    } else if (strcmp(name, "gemma2") == 0) {
        /* Gemma 2 style: local/global alternation with a window shorter than T,
         * soft-caps small enough to be nonlinear at these activation sizes,
         * query_pre_attn_scalar different from head_dim. */
        mt_model_config_defaults(c, MT_DECODER_GEMMA2);
        c->vocab_size = 53;
        c->emb_dim = 32;
        c->num_query_heads = 4;
        c->num_kv_heads = 2;
        c->head_dim = 16;
        c->mlp_dim = 64;
        c->num_decoder_layers = 2;
        c->sliding_window_size = 4;
        c->attn_logits_soft_cap = 2.0f;
        c->final_logits_soft_cap = 1.5f;
        c->query_pre_attn_scalar = 24.0f;
    } else if (strcmp(name, "gemma3") == 0) {
        /* Gemma 3 style: 2 local then 1 global (pattern 3), QK-norm, local RoPE base
         * 10000, global base 1e6 with linear scaling 8. */
        mt_model_config_defaults(c, MT_DECODER_GEMMA3);
        c->vocab_size = 59;
        c->emb_dim = 32;
        c->num_query_heads = 4;
        c->num_kv_heads = 2;
        c->head_dim = 16;
        c->mlp_dim = 64;
        c->num_decoder_layers = 3;
        c->sliding_window_size = 4;
        c->sliding_window_pattern = 3;
        c->query_pre_attn_scalar = 24.0f;
    } else {
        return -1;
    }
    snprintf(c->model_name, sizeof(c->model_name), "tiny-%s", name);
    return 0;
}

static int write_bin(const char *dir, const char *name, const void *data, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "model_dump: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t w = fwrite(data, 1, bytes, f);
    int rc = fclose(f);
    if (w != bytes || rc != 0) {
        fprintf(stderr, "model_dump: short write to %s\n", path);
        return -1;
    }
    return 0;
}

static cJSON *config_json(const mt_model_config *c) {
    static const char *const rope_names[] = {"default", "llama3", "linear"};
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model_name", c->model_name);
    cJSON_AddStringToObject(j, "decoder_block", mt_decoder_block_name(c->decoder_block));
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->vocab_size);
    cJSON_AddNumberToObject(j, "base_emb_dim", (double)c->emb_dim);
    cJSON_AddNumberToObject(j, "base_num_query_heads", (double)c->num_query_heads);
    cJSON_AddNumberToObject(j, "base_num_kv_heads", (double)c->num_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", (double)c->head_dim);
    cJSON_AddNumberToObject(j, "base_mlp_dim", (double)c->mlp_dim);
    cJSON_AddNumberToObject(j, "base_num_decoder_layers", (double)c->num_decoder_layers);
    cJSON *act = cJSON_AddArrayToObject(j, "mlp_activations");
    cJSON_AddItemToArray(act, cJSON_CreateString(c->mlp_activation == MT_ACT_SILU ? "silu" : "gelu"));
    cJSON_AddItemToArray(act, cJSON_CreateString("linear"));
    cJSON_AddNumberToObject(j, "normalization_layer_epsilon", (double)c->normalization_layer_epsilon);
    cJSON_AddBoolToObject(j, "logits_via_embedding", c->logits_via_embedding != 0);
    cJSON_AddNumberToObject(j, "final_logits_soft_cap", (double)c->final_logits_soft_cap);
    cJSON_AddNumberToObject(j, "attn_logits_soft_cap", (double)c->attn_logits_soft_cap);
    cJSON_AddNumberToObject(j, "sliding_window_size", (double)c->sliding_window_size);
    cJSON_AddNumberToObject(j, "sliding_window_pattern", (double)c->sliding_window_pattern);
    cJSON_AddNumberToObject(j, "query_pre_attn_scalar", (double)c->query_pre_attn_scalar);
    cJSON_AddNumberToObject(j, "rope_max_timescale", (double)c->rope_max_timescale);
    cJSON_AddStringToObject(j, "rope_type", rope_names[c->rope_type]);
    cJSON_AddNumberToObject(j, "rope_factor", (double)c->rope_factor);
    cJSON_AddNumberToObject(j, "rope_low_freq_factor", (double)c->rope_low_freq_factor);
    cJSON_AddNumberToObject(j, "rope_high_freq_factor", (double)c->rope_high_freq_factor);
    cJSON_AddNumberToObject(j, "rope_original_max_position", (double)c->rope_original_max_position);
    cJSON_AddNumberToObject(j, "local_rope_max_timescale", (double)c->local_rope_max_timescale);
    cJSON_AddBoolToObject(j, "use_qk_norm", c->use_qk_norm != 0);
    cJSON_AddBoolToObject(j, "use_post_attn_norm", c->use_post_attn_norm != 0);
    cJSON_AddBoolToObject(j, "use_post_ffw_norm", c->use_post_ffw_norm != 0);
    return j;
}

#define CHECK(expr)                                                                      \
    do {                                                                                 \
        mt_status s_ = (expr);                                                           \
        if (s_ != MT_OK) {                                                               \
            fprintf(stderr, "model_dump: %s failed: %s\n", #expr, mt_last_error());      \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: model_dump llama3|gemma|gemma2|gemma3 OUTDIR\n");
        return 1;
    }
    const char *dir = argv[2];
    mt_model_config cfg;
    preset pr;
    if (make_config(argv[1], &cfg, &pr) != 0) {
        fprintf(stderr, "model_dump: unknown preset '%s'\n", argv[1]);
        return 1;
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "model_dump: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }
    mt_backend *be = mt_cpu_backend();
    const uint64_t seed = 1234;
    mt_model *m = NULL;
    CHECK(mt_model_create(&m, &cfg, be, B, T, TILES, NULL));
    mt_plan *plan = NULL;
    CHECK(mt_plan_new(&plan));
    CHECK(mt_model_add_to_plan(m, plan));
    CHECK(mt_plan_finalize(plan));
    mt_arena arena;
    CHECK(mt_backend_arena_create(be, &arena, plan));
    CHECK(mt_model_bind(m, &arena, plan));
    CHECK(mt_model_init_params(m, seed));

    /* Spread the parameters so every nonlinearity works away from its linear regime:
     * matrices scaled up, norm scales moved off their init value (so 1 + w and w
     * differ visibly). The CPU backend's memory is host memory. */
    const int64_t numel = mt_model_numel(m);
    float *params = mt_model_params(m), *grads = mt_model_grads(m);
    const int np = mt_model_param_count(m);
    for (int i = 0; i < np; i++) {
        const mt_param_info *p = mt_model_param(m, i);
        float *w = params + p->offset;
        if (p->ndim == 2) {
            for (int64_t j = 0; j < p->numel; j++) w[j] *= pr.mat_std_scale;
        } else {
            float *noise = malloc((size_t)p->numel * sizeof(float));
            mt_rng_fill_normal(noise, (size_t)p->numel, 0.2f, seed, 100000u + (uint64_t)i);
            for (int64_t j = 0; j < p->numel; j++) w[j] += noise[j];
            free(noise);
        }
    }

    /* tokens and next-token labels, a few labels ignored */
    const int64_t N = B * T, V = cfg.vocab_size;
    int32_t tokens[B * T], labels[B * T];
    for (int64_t n = 0; n < N; n++) {
        uint32_t r[4];
        mt_rng_u32x4(seed, 7, (uint64_t)n, r);
        tokens[n] = (int32_t)(r[0] % (uint32_t)V);
    }
    for (int64_t n = 0; n < N; n++) {
        uint32_t r[4];
        mt_rng_u32x4(seed, 8, (uint64_t)n, r);
        labels[n] = (n % T) + 1 < T ? tokens[n + 1] : (int32_t)(r[0] % (uint32_t)V);
    }
    labels[3] = MT_IGNORE_LABEL;
    labels[T - 1] = MT_IGNORE_LABEL;
    labels[T + 5] = MT_IGNORE_LABEL;

    int rc = 0;
    rc |= write_bin(dir, "tokens.bin", tokens, sizeof(tokens));
    rc |= write_bin(dir, "labels.bin", labels, sizeof(labels));
    for (int i = 0; i < np; i++) {
        const mt_param_info *p = mt_model_param(m, i);
        char name[256];
        snprintf(name, sizeof(name), "param.%s.bin", p->name);
        rc |= write_bin(dir, name, params + p->offset, (size_t)p->numel * sizeof(float));
    }

    float *logits = malloc((size_t)(N * V) * sizeof(float));
    CHECK(mt_model_logits(m, tokens, logits));
    rc |= write_bin(dir, "logits.bin", logits, (size_t)(N * V) * sizeof(float));
    free(logits);

    double loss_sum = 0.0;
    int64_t count = 0;
    CHECK(mt_model_loss(m, tokens, labels, &loss_sum, &count));
    if (count <= 0) {
        fprintf(stderr, "model_dump: no labelled tokens\n");
        return 1;
    }
    const float dscale = (float)(1.0 / (double)count);

    /* 5 AdamW steps (torch.optim.AdamW semantics, be->ops->adamw over the parameter table's
     * segments, train/optimizer.h); decay on matrices only */
    float *mom1 = tool_alloc(be, (size_t)numel * sizeof(float));
    float *mom2 = tool_alloc(be, (size_t)numel * sizeof(float));
    mt_param_info *ptab = malloc(sizeof(mt_param_info) * (size_t)np);
    mt_adamw_segment *htab = malloc(sizeof(mt_adamw_segment) * (size_t)np);
    mt_adamw_segment *segs = tool_alloc(be, sizeof(mt_adamw_segment) * (size_t)np);
    int nsegs = 0;
    if (!ptab || !htab || !segs) {
        fprintf(stderr, "model_dump: out of memory\n");
        return 1;
    }
    for (int i = 0; i < np; i++) ptab[i] = *mt_model_param(m, i);
    TOOL_OK(mt_adamw_segments(ptab, np, htab, &nsegs));
    TOOL_OK(be->ops->copy_to_device(be, segs, htab, sizeof(mt_adamw_segment) * (size_t)nsegs));
    free(ptab);
    free(htab);
    TOOL_OK(be->ops->zero(be, mom1, (size_t)numel * sizeof(float)));
    TOOL_OK(be->ops->zero(be, mom2, (size_t)numel * sizeof(float)));
    float losses[STEPS];
    double losses_d[STEPS];
    double loss0 = 0.0;
    for (int step = 1; step <= STEPS; step++) {
        TOOL_OK(be->ops->zero(be, grads, (size_t)numel * sizeof(float)));
        double ls = 0.0;
        int64_t cnt = 0;
        CHECK(mt_model_forward_backward(m, tokens, labels, dscale, &ls, &cnt));
        losses_d[step - 1] = ls / (double)cnt;
        losses[step - 1] = (float)losses_d[step - 1];
        if (step == 1) {
            loss0 = losses_d[0];
            for (int i = 0; i < np; i++) {
                const mt_param_info *p = mt_model_param(m, i);
                char name[256];
                snprintf(name, sizeof(name), "grad.%s.bin", p->name);
                rc |= write_bin(dir, name, grads + p->offset, (size_t)p->numel * sizeof(float));
            }
        }
        TOOL_OK(be->ops->adamw(be, params, grads, mom1, mom2, segs, nsegs, k_lr, k_b1, k_b2, k_eps, k_wd, 1.0f, step));
    }
    be->ops->release(be, segs);
    rc |= write_bin(dir, "losses.bin", losses, sizeof(losses));

    cJSON *man = cJSON_CreateObject();
    cJSON_AddStringToObject(man, "preset", pr.name);
    cJSON_AddItemToObject(man, "config", config_json(&cfg));
    cJSON_AddNumberToObject(man, "batch", B);
    cJSON_AddNumberToObject(man, "seq", T);
    cJSON_AddNumberToObject(man, "num_vocab_tiling", TILES);
    cJSON_AddNumberToObject(man, "seed", (double)seed);
    cJSON_AddNumberToObject(man, "ignore_label", MT_IGNORE_LABEL);
    cJSON_AddNumberToObject(man, "loss", loss0);
    cJSON_AddNumberToObject(man, "count", (double)count);
    cJSON_AddItemToObject(man, "losses", cJSON_CreateDoubleArray(losses_d, STEPS));
    cJSON *opt = cJSON_AddObjectToObject(man, "adamw");
    cJSON_AddNumberToObject(opt, "lr", (double)k_lr);
    cJSON_AddNumberToObject(opt, "b1", (double)k_b1);
    cJSON_AddNumberToObject(opt, "b2", (double)k_b2);
    cJSON_AddNumberToObject(opt, "eps", (double)k_eps);
    cJSON_AddNumberToObject(opt, "weight_decay", (double)k_wd);
    cJSON_AddNumberToObject(opt, "steps", STEPS);
    cJSON *plist = cJSON_AddArrayToObject(man, "params");
    for (int i = 0; i < np; i++) {
        const mt_param_info *p = mt_model_param(m, i);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", p->name);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < p->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->shape[d]));
        cJSON_AddBoolToObject(e, "weight_decay", p->weight_decay != 0);
        cJSON_AddItemToArray(plist, e);
    }
    char *text = cJSON_Print(man);
    rc |= write_bin(dir, "manifest.json", text, strlen(text));
    free(text);
    cJSON_Delete(man);

    be->ops->release(be, mom1);
    be->ops->release(be, mom2);
    mt_arena_destroy(&arena);
    mt_plan_free(plan);
    mt_model_free(m);
    if (rc) return 1;
    printf("model_dump: %s: %d tensors, loss %.6f over %lld tokens, written to %s\n", pr.name, np, loss0,
           (long long)count, dir);
    return 0;
}
