/* tests/tools/hf_parity.c: the meshtrain side of the Hugging Face transformers parity
 * test (tests/test_hf_parity.sh, tests/reference/hf_parity.py).
 *
 *   hf_parity run HFDIR OUTDIR B T TILES
 *       Read HFDIR/config.json (mt_hf_config_read), build the model for micro-batches
 *       of B x T tokens with the loss cut into TILES row tiles, load HFDIR's weights
 *       (mt_checkpoint_load_model), read OUTDIR/tokens.bin and OUTDIR/labels.bin
 *       (int32 [B*T], label -1 = ignored) and write to OUTDIR (raw little-endian):
 *         logits.bin            float32 [B*T, V] (mt_model_logits)
 *         loss.bin              float64 [2]: summed token loss, labelled token count
 *         grad.<hf name>.bin    float32, d(mean loss)/d(param) (mt_model_forward_backward)
 *       then save the loaded model with mt_checkpoint_save_model to OUTDIR/ckpt (F32).
 *
 *   hf_parity same DIR_A DIR_B
 *       Read both config.json files and require the same model config, then load both
 *       checkpoints into one model each and require every parameter to be bitwise
 *       identical (memcmp of the float32 values). Prints the first differences.
 *
 * Exit status 0 on success, 1 on any failure (message on stderr). CPU backend. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/tools/tool_backend.h"
#include "kernels/backend.h"
#include "models/checkpoint.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/plan.h"

#define CHECK(expr)                                                                       \
    do {                                                                                  \
        mt_status s_ = (expr);                                                            \
        if (s_ != MT_OK) {                                                                \
            fprintf(stderr, "hf_parity: %s failed: %s\n", #expr, mt_last_error());        \
            return 1;                                                                     \
        }                                                                                 \
    } while (0)

typedef struct hp_model {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
} hp_model;

/* Create, plan, allocate and bind a model for cfg on the CPU backend. */
static int hp_model_open(hp_model *h, const mt_model_config *cfg, int64_t b, int64_t t, int64_t tiles) {
    mt_backend *be = mt_cpu_backend();
    memset(h, 0, sizeof *h);
    CHECK(mt_model_config_validate(cfg));
    CHECK(mt_model_create(&h->m, cfg, be, b, t, tiles, NULL));
    CHECK(mt_plan_new(&h->plan));
    CHECK(mt_model_add_to_plan(h->m, h->plan));
    CHECK(mt_plan_finalize(h->plan));
    CHECK(mt_backend_arena_create(be, &h->arena, h->plan));
    CHECK(mt_model_bind(h->m, &h->arena, h->plan));
    return 0;
}

static void hp_model_close(hp_model *h) {
    mt_model_free(h->m);
    mt_arena_destroy(&h->arena);
    mt_plan_free(h->plan);
}

static int read_bin(const char *dir, const char *name, void *data, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "hf_parity: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t r = fread(data, 1, bytes, f);
    int extra = fgetc(f);
    fclose(f);
    if (r != bytes || extra != EOF) {
        fprintf(stderr, "hf_parity: %s does not hold exactly %zu bytes\n", path, bytes);
        return -1;
    }
    return 0;
}

static int write_bin(const char *dir, const char *name, const void *data, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "hf_parity: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t w = fwrite(data, 1, bytes, f);
    int rc = fclose(f);
    if (w != bytes || rc != 0) {
        fprintf(stderr, "hf_parity: short write to %s\n", path);
        return -1;
    }
    return 0;
}

static int read_config(const char *dir, mt_model_config *cfg) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    CHECK(mt_hf_config_read(path, cfg));
    return 0;
}

static int cmd_run(const char *hfdir, const char *outdir, int64_t b, int64_t t, int64_t tiles) {
    mt_model_config cfg;
    if (read_config(hfdir, &cfg)) return 1;
    snprintf(cfg.model_name, sizeof(cfg.model_name), "hf-parity");
    hp_model h;
    if (hp_model_open(&h, &cfg, b, t, tiles)) return 1;
    CHECK(mt_checkpoint_load_model(hfdir, h.m));

    const int64_t n = b * t, v = cfg.vocab_size;
    int32_t *tokens = malloc((size_t)n * sizeof(int32_t)), *labels = malloc((size_t)n * sizeof(int32_t));
    float *logits = malloc((size_t)(n * v) * sizeof(float));
    if (!tokens || !labels || !logits) {
        fprintf(stderr, "hf_parity: out of memory\n");
        return 1;
    }
    if (read_bin(outdir, "tokens.bin", tokens, (size_t)n * sizeof(int32_t)) ||
        read_bin(outdir, "labels.bin", labels, (size_t)n * sizeof(int32_t)))
        return 1;

    CHECK(mt_model_logits(h.m, tokens, logits));
    int rc = write_bin(outdir, "logits.bin", logits, (size_t)(n * v) * sizeof(float));

    /* Gradient of the mean loss: the summed-loss gradient scaled by 1/count, with the
     * count taken from a loss-only pass first. */
    double loss_sum = 0.0;
    int64_t count = 0;
    CHECK(mt_model_loss(h.m, tokens, labels, &loss_sum, &count));
    if (count <= 0) {
        fprintf(stderr, "hf_parity: no labelled tokens\n");
        return 1;
    }
    mt_backend *be = mt_cpu_backend();
    float *grads = mt_model_grads(h.m);
    TOOL_OK(be->ops->zero(be, grads, (size_t)mt_model_numel(h.m) * sizeof(float)));
    double ls = 0.0;
    int64_t cnt = 0;
    CHECK(mt_model_forward_backward(h.m, tokens, labels, (float)(1.0 / (double)count), &ls, &cnt));
    double loss[2] = {ls, (double)cnt};
    rc |= write_bin(outdir, "loss.bin", loss, sizeof loss);
    for (int i = 0; i < mt_model_param_count(h.m); i++) {
        const mt_param_info *p = mt_model_param(h.m, i);
        if (p->buffer) continue; /* transformers' buffers have no gradient */
        char name[256];
        snprintf(name, sizeof(name), "grad.%s.bin", p->name);
        rc |= write_bin(outdir, name, grads + p->offset, (size_t)p->numel * sizeof(float));
    }

    char ckpt[1024];
    snprintf(ckpt, sizeof(ckpt), "%s/ckpt", outdir);
    CHECK(mt_checkpoint_save_model(ckpt, h.m, MT_F32));
    free(tokens);
    free(labels);
    free(logits);
    hp_model_close(&h);
    return rc ? 1 : 0;
}

/* Field-by-field comparison of two model configs (model_name excluded). Returns the
 * number of differing fields, each printed. */
static int config_diff(const mt_model_config *a, const mt_model_config *b) {
    int nd = 0;
#define HP_I(f)                                                                                        \
    if (a->f != b->f) {                                                                                \
        fprintf(stderr, "hf_parity: config field " #f ": %lld vs %lld\n", (long long)a->f, (long long)b->f); \
        nd++;                                                                                          \
    }
#define HP_F(f)                                                                                        \
    if (a->f != b->f) {                                                                                \
        fprintf(stderr, "hf_parity: config field " #f ": %.9g vs %.9g\n", (double)a->f, (double)b->f); \
        nd++;                                                                                          \
    }
    HP_I(decoder_block) HP_I(vocab_size) HP_I(emb_dim) HP_I(num_query_heads) HP_I(num_kv_heads)
    HP_I(head_dim) HP_I(mlp_dim) HP_I(num_decoder_layers) HP_I(mlp_activation) HP_F(normalization_layer_epsilon)
    HP_I(logits_via_embedding) HP_F(final_logits_soft_cap) HP_F(attn_logits_soft_cap) HP_I(sliding_window_size)
    HP_I(sliding_window_pattern) HP_F(query_pre_attn_scalar) HP_F(rope_max_timescale) HP_I(rope_type)
    HP_I(use_qk_norm) HP_I(use_post_attn_norm) HP_I(use_post_ffw_norm) HP_F(local_rope_max_timescale)
    HP_I(global_head_dim) HP_I(num_kv_shared_layers) HP_I(use_double_wide_mlp) HP_I(per_layer_input_dim)
    HP_F(rope_partial_rotary_factor)
    if (a->rope_type != MT_ROPE_DEFAULT) { HP_F(rope_factor) }
    if (a->rope_type == MT_ROPE_LLAMA3) {
        HP_F(rope_low_freq_factor) HP_F(rope_high_freq_factor) HP_I(rope_original_max_position)
    }
#undef HP_I
#undef HP_F
    return nd;
}

static int cmd_same(const char *dir_a, const char *dir_b) {
    mt_model_config ca, cb;
    if (read_config(dir_a, &ca) || read_config(dir_b, &cb)) return 1;
    if (config_diff(&ca, &cb)) {
        fprintf(stderr, "hf_parity: %s/config.json and %s/config.json describe different models\n", dir_a, dir_b);
        return 1;
    }
    snprintf(ca.model_name, sizeof(ca.model_name), "hf-parity");
    hp_model ha, hb;
    if (hp_model_open(&ha, &ca, 1, 1, 1) || hp_model_open(&hb, &ca, 1, 1, 1)) return 1;
    CHECK(mt_checkpoint_load_model(dir_a, ha.m));
    CHECK(mt_checkpoint_load_model(dir_b, hb.m));
    const float *pa = mt_model_params(ha.m), *pb = mt_model_params(hb.m);
    int bad = 0;
    for (int i = 0; i < mt_model_param_count(ha.m); i++) {
        const mt_param_info *p = mt_model_param(ha.m, i);
        if (memcmp(pa + p->offset, pb + p->offset, (size_t)p->numel * sizeof(float)) != 0) {
            int64_t j = 0;
            while (memcmp(pa + p->offset + j, pb + p->offset + j, sizeof(float)) == 0) j++;
            if (bad++ < 8)
                fprintf(stderr, "hf_parity: %s differs first at element %lld: %.9g vs %.9g\n", p->name,
                        (long long)j, (double)pa[p->offset + j], (double)pb[p->offset + j]);
        }
    }
    printf("hf_parity: %d parameters (%lld values) compared, %d differ\n", mt_model_param_count(ha.m),
           (long long)mt_model_numel(ha.m), bad);
    hp_model_close(&ha);
    hp_model_close(&hb);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 7 && strcmp(argv[1], "run") == 0) {
        char *e1, *e2, *e3;
        long long b = strtoll(argv[4], &e1, 10), t = strtoll(argv[5], &e2, 10), tiles = strtoll(argv[6], &e3, 10);
        if (*e1 || *e2 || *e3 || b < 1 || t < 1 || tiles < 1) {
            fprintf(stderr, "hf_parity: B, T and TILES must be positive integers\n");
            return 1;
        }
        return cmd_run(argv[2], argv[3], b, t, tiles);
    }
    if (argc == 4 && strcmp(argv[1], "same") == 0) return cmd_same(argv[2], argv[3]);
    fprintf(stderr, "usage: hf_parity run HFDIR OUTDIR B T TILES | hf_parity same DIR_A DIR_B\n");
    return 1;
}
