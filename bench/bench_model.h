/* bench/bench_model.h: the model, plan and step shared by bench/step_bench.c and
 * bench/op_bench.c (header-only, static inline: each benchmark is one translation unit).
 *
 * Both take the same 11 command-line numbers and an optional compute dtype
 *   d_model layers heads kv_heads mlp seq batch vocab threads steps tiles [float32|bfloat16]
 * and build the same llama-shaped model (head_dim = d_model / heads, RoPE
 * timescale 1e4, params initialised with seed 1), an arena planned with the model's
 * entries plus the AdamW moments m and v (n floats each, live over every phase) and the
 * segment table of the parameters (train/optimizer.h mt_adamw_segments), and
 * batch x seq + 1 tokens drawn from mt_rng_u32x4(7, 0, i) modulo vocab. One step
 * zeroes the gradients, runs mt_model_forward_backward (mean over tokens) and AdamW
 * (one be->ops->adamw over the table: lr 1e-4, betas 0.9 / 0.999, eps 1e-8, weight decay
 * 0.1 on matrices), the same step as bench/torch_step.py. With bfloat16 the activations
 * and the compute copy of the weights are bf16 (refreshed from the fp32 master with
 * stochastic rounding keyed by the step: mt_model_set_compute_rounding), master
 * weights, gradients and moments fp32, as the trainer runs dtype=bfloat16. */
#ifndef MT_BENCH_MODEL_H
#define MT_BENCH_MODEL_H

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/backend.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "train/optimizer.h"

typedef struct {
    long a[11];      /* the command-line numbers, in the order of the usage line */
    mt_dtype dt;     /* compute dtype (the optional 12th argument; float32 by default) */
    int64_t B, T, V; /* batch, sequence length, vocabulary */
    int64_t n;       /* parameter count (floats) */
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
    float *mom, *vel; /* AdamW moments in the arena, n floats each */
    mt_adamw_segment *segs; /* the parameters' segments in the arena (nsegs) */
    int nsegs;
    int32_t *tok;     /* B x T + 1 tokens: inputs tok[0..BT), targets tok[1..BT] */
} bench_model;

/* Parses argv into b->a (prog names the program in the usage message) and sets the
 * OpenMP thread count. Returns 0, or 2 after printing the usage line to stderr. */
static inline int bench_model_args(bench_model *b, const char *prog, int argc, char **argv) {
    b->dt = MT_F32;
    if ((argc != 12 && argc != 13) || (argc == 13 && mt_dtype_parse(argv[12], &b->dt) != MT_OK) ||
        (b->dt != MT_F32 && b->dt != MT_BF16)) {
        fprintf(stderr, "usage: %s d_model layers heads kv_heads mlp seq batch vocab threads steps tiles "
                "[float32|bfloat16]\n", prog);
        return 2;
    }
    for (int i = 0; i < 11; i++) b->a[i] = strtol(argv[i + 1], NULL, 10);
    b->B = b->a[6];
    b->T = b->a[5];
    b->V = b->a[7];
    omp_set_num_threads((int)b->a[8]);
    return 0;
}

/* Creates the model on be (kept by the model: must outlive it), plans and binds the
 * arena, initialises the parameters and draws the tokens. Returns NULL, or the name of
 * the stage that failed ("model", "plan", "arena", "bind"; mt_last_error() has why). */
static inline const char *bench_model_create(bench_model *b, mt_backend *be) {
    const long *a = b->a;
    mt_model_config c;
    mt_model_config_defaults(&c, MT_DECODER_LLAMA2);
    c.emb_dim = a[0];
    c.num_decoder_layers = a[1];
    c.num_query_heads = a[2];
    c.num_kv_heads = a[3];
    c.head_dim = a[0] / a[2];
    c.mlp_dim = a[4];
    c.vocab_size = b->V;
    c.rope_max_timescale = 10000.0f;
    const mt_model_layout lay = {.dtype = b->dt};
    if (mt_model_create(&b->m, &c, be, b->B, b->T, a[10], &lay) != MT_OK) return "model";
    if (mt_plan_new(&b->plan) != MT_OK || mt_model_add_to_plan(b->m, b->plan) != MT_OK) return "plan";
    b->n = mt_model_numel(b->m);
    const int last = mt_model_phase_count(b->m) - 1;
    const int np = mt_model_param_count(b->m);
    int idm, idv, ids;
    if (mt_plan_add(b->plan, "adamw.m", MT_MEM_OPTIMIZER, (size_t)b->n * 4, 0, last, &idm) != MT_OK ||
        mt_plan_add(b->plan, "adamw.v", MT_MEM_OPTIMIZER, (size_t)b->n * 4, 0, last, &idv) != MT_OK ||
        mt_plan_add(b->plan, "adamw.segments", MT_MEM_OPTIMIZER, sizeof(mt_adamw_segment) * (size_t)np, 0, last,
                    &ids) != MT_OK ||
        mt_plan_finalize(b->plan) != MT_OK)
        return "plan";
    if (mt_arena_create(&b->arena, b->plan, NULL, NULL, NULL) != MT_OK) return "arena";
    if (mt_model_bind(b->m, &b->arena, b->plan) != MT_OK || mt_model_init_params(b->m, 1) != MT_OK) return "bind";
    b->mom = mt_arena_ptr(&b->arena, b->plan, idm);
    b->vel = mt_arena_ptr(&b->arena, b->plan, idv);
    b->segs = mt_arena_ptr(&b->arena, b->plan, ids);
    mt_param_info *pt = malloc(sizeof(mt_param_info) * (size_t)np);
    mt_adamw_segment *ht = malloc(sizeof(mt_adamw_segment) * (size_t)np);
    if (!pt || !ht) {
        free(pt);
        free(ht);
        return "plan";
    }
    for (int i = 0; i < np; i++) pt[i] = *mt_model_param(b->m, i);
    mt_status st = mt_adamw_segments(pt, np, ht, &b->nsegs);
    if (st == MT_OK) st = be->ops->copy_to_device(be, b->segs, ht, sizeof(mt_adamw_segment) * (size_t)b->nsegs);
    free(pt);
    free(ht);
    if (st != MT_OK) return "bind";
    b->tok = malloc(sizeof(int32_t) * (size_t)(b->B * b->T + 1));
    for (int64_t i = 0; i < b->B * b->T + 1; i++) {
        uint32_t w[4];
        mt_rng_u32x4(7, 0, (uint64_t)i, w);
        b->tok[i] = (int32_t)(w[0] % (uint32_t)b->V);
    }
    return NULL;
}

/* One training step s (0-based; AdamW's step count is s + 1) through be's zero and
 * adamw: *sum and *cnt receive the loss sum and the token count. Returns NULL, or
 * "step" / "zero" / "adamw" naming what failed (message in mt_last_error()). */
static inline const char *bench_model_step(bench_model *b, mt_backend *be, int s, double *sum, int64_t *cnt) {
    mt_model *m = b->m;
    mt_model_set_compute_rounding(m, 1, s); /* bf16: this step's rounding of the compute weights */
    if (be->ops->zero(be, mt_model_grads(m), (size_t)b->n * 4) != MT_OK) return "zero";
    if (mt_model_forward_backward(m, b->tok, b->tok + 1, 1.0f / (float)(b->B * b->T), sum, cnt) != MT_OK)
        return "step";
    if (be->ops->adamw(be, mt_model_params(m), mt_model_grads(m), b->mom, b->vel, b->segs, b->nsegs, 1e-4f, 0.9f,
                       0.999f, 1e-8f, 0.1f, 1.0f, s + 1) != MT_OK)
        return "adamw";
    return NULL;
}

/* Frees what bench_model_create made (after a successful create). */
static inline void bench_model_free(bench_model *b) {
    mt_arena_destroy(&b->arena);
    mt_plan_free(b->plan);
    mt_model_free(b->m);
    free(b->tok);
}

#endif
