/* bench/step_bench.c: time one meshtrain training step on the CPU backend.
 *
 * The same llama-shaped model and step as bench/torch_step.py: embedding, L decoder
 * layers, final norm, vocab-tiled cross-entropy (mean over tokens), backward, AdamW
 * (lr 1e-4, wd 0.1 on matrices), float32. Prints one JSON line with the step times,
 * the planned arena bytes by category and the process peak RSS.
 * Usage: step_bench d_model layers heads kv_heads mlp seq batch vocab threads steps tiles */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "kernels/ops.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "runtime/timer.h"

static int fail(const char *what) {
    fprintf(stderr, "step_bench: %s: %s\n", what, mt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 12) {
        fprintf(stderr, "usage: step_bench d_model layers heads kv_heads mlp seq batch vocab threads steps tiles\n");
        return 2;
    }
    long a[11];
    for (int i = 0; i < 11; i++) a[i] = strtol(argv[i + 1], NULL, 10);
    const int64_t B = a[6], T = a[5], V = a[7];
    omp_set_num_threads((int)a[8]);
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_LLAMA2);
    c.emb_dim = a[0];
    c.num_decoder_layers = a[1];
    c.num_query_heads = a[2];
    c.num_kv_heads = a[3];
    c.head_dim = a[0] / a[2];
    c.mlp_dim = a[4];
    c.vocab_size = V;
    c.rope_max_timescale = 10000.0f;
    const mt_ops *ops = mt_cpu_ops();
    mt_model *m;
    if (mt_model_create(&m, &c, ops, B, T, a[10]) != MT_OK) return fail("model");
    mt_plan *plan;
    if (mt_plan_new(&plan) != MT_OK || mt_model_add_to_plan(m, plan) != MT_OK) return fail("plan");
    int64_t n = mt_model_numel(m);
    int idm, idv;
    if (mt_plan_add(plan, "adamw.m", MT_MEM_OPTIMIZER, (size_t)n * 4, 0, mt_model_phase_count(m) - 1, &idm) != MT_OK ||
        mt_plan_add(plan, "adamw.v", MT_MEM_OPTIMIZER, (size_t)n * 4, 0, mt_model_phase_count(m) - 1, &idv) != MT_OK ||
        mt_plan_finalize(plan) != MT_OK)
        return fail("plan");
    mt_arena arena;
    if (mt_arena_create(&arena, plan, NULL, NULL) != MT_OK) return fail("arena");
    if (mt_model_bind(m, &arena, plan) != MT_OK || mt_model_init_params(m, 1) != MT_OK) return fail("bind");
    float *mom = mt_arena_ptr(&arena, plan, idm), *vel = mt_arena_ptr(&arena, plan, idv);

    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * T + 1));
    for (int64_t i = 0; i < B * T + 1; i++) {
        uint32_t w[4];
        mt_rng_u32x4(7, 0, (uint64_t)i, w);
        tok[i] = (int32_t)(w[0] % (uint32_t)V);
    }
    int steps = (int)a[9];
    double loss = 0;
    printf("{\"impl\": \"meshtrain\", \"threads\": %ld, \"step_ms\": [", a[8]);
    for (int s = 0; s <= steps; s++) {
        double t0 = mt_time_now();
        double sum = 0;
        int64_t cnt = 0;
        ops->zero(mt_model_grads(m), (size_t)n * 4);
        if (mt_model_forward_backward(m, tok, tok + 1, 1.0f / (float)(B * T), &sum, &cnt) != MT_OK) return fail("step");
        for (int i = 0; i < mt_model_param_count(m); i++) {
            const mt_param_info *p = mt_model_param(m, i);
            ops->adamw(mt_model_params(m) + p->offset, mt_model_grads(m) + p->offset, mom + p->offset,
                       vel + p->offset, p->numel, 1e-4f, 0.9f, 0.999f, 1e-8f, p->weight_decay ? 0.1f : 0.0f,
                       1.0f, s + 1);
        }
        loss = sum / (double)cnt;
        double ms = (mt_time_now() - t0) * 1e3;
        if (s > 0) printf("%s%.1f", s > 1 ? ", " : "", ms); /* step 0 is warm-up */
    }
    size_t cat[MT_MEM_CATEGORY_COUNT];
    mt_plan_live_by_category(plan, cat, NULL);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("], \"loss\": %.6f, \"planned_peak_mib\": %.2f, \"planned\": {", loss, mt_plan_peak(plan) / 1048576.0);
    for (int k = 0; k < MT_MEM_CATEGORY_COUNT; k++)
        printf("%s\"%s\": %.2f", k ? ", " : "", mt_mem_category_name((mt_mem_category)k), cat[k] / 1048576.0);
    printf("}, \"peak_rss_mib\": %.1f}\n", ru.ru_maxrss / 1024.0);
    mt_arena_destroy(&arena);
    mt_plan_free(plan);
    mt_model_free(m);
    free(tok);
    return 0;
}
