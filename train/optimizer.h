/* train/optimizer.h: learning-rate schedule, global-norm clipping and AdamW over a
 * model's parameter table.
 *
 * Schedule: MaxText's create_learning_rate_schedule (MaxText/maxtext_utils.py,
 * after Llama 2, arXiv:2307.09288 section 2.2) with learning_rate_schedule_steps =
 * steps: W = int(steps * warmup_steps_fraction) warmup steps, C = steps - W cosine
 * steps, and for the 0-based update index s (optax's `count`: the first update has
 * s = 0):
 *   s <  W:  lr(s) = peak * s / W                                  (optax linear_schedule)
 *   s >= W:  p = min((s - W) / C, 1), a = (1 + cos(pi p)) / 2,
 *            lr(s) = peak * a + peak * final_fraction * (1 - a)
 * so with warmup the first update runs at lr 0, exactly as in MaxText.
 *
 * Clipping: optax.clip_by_global_norm: norm = sqrt(sum over tensors of sum g^2)
 * (per-tensor be->ops->sumsq in fp64, summed in table order, sqrt in fp64); when
 * threshold > 0 and norm > threshold the gradients are scaled by threshold / norm
 * (passed to be->ops->adamw as grad_scale, not applied in a separate pass).
 *
 * AdamW: one be->ops->adamw per parameter tensor (kernels/ops.h gives the math), weight
 * decay only on tensors with mt_param_info.weight_decay (matrices, not norm scales),
 * moments m and v in fp32 in backend memory laid out like the flat parameter buffer. */
#ifndef MT_TRAIN_OPTIMIZER_H
#define MT_TRAIN_OPTIMIZER_H

#include <stdint.h>
#include "kernels/backend.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_lr_schedule {
    double peak;            /* learning_rate */
    double final_fraction;  /* cosine_learning_rate_final_fraction */
    int64_t warmup_steps;   /* W = int(steps * warmup_steps_fraction) */
    int64_t total_steps;    /* steps */
} mt_lr_schedule;

/* Schedule for a run of `steps` steps (see the header comment). */
mt_lr_schedule mt_lr_schedule_make(double learning_rate, double warmup_steps_fraction,
                                   double final_fraction, int64_t steps);

/* Learning rate of the update with 0-based index s (s >= 0; s >= steps stays at the
 * final value). Pure function of (schedule, s): resuming reproduces it exactly. */
double mt_lr_schedule_at(const mt_lr_schedule *sch, int64_t s);

/* *norm = global L2 norm of the gradients of the n parameters (flat buffer `grads` in
 * backend memory, float32, laid out by params[i].offset / numel). fp64.
 * Errors: those of be->ops->sumsq (a backend failure). */
mt_status mt_grad_global_norm(mt_backend *be, const float *grads, const mt_param_info *params, int n, double *norm);

/* Gradient multiplier of clip_by_global_norm: threshold / norm when threshold > 0
 * and norm > threshold, else 1. */
double mt_clip_scale(double norm, double threshold);

/* AdamW hyper-parameters and state. m and v are backend memory of numel floats each
 * (arena entries added by mt_adamw_add_to_plan). */
typedef struct mt_adamw {
    mt_backend *be;
    float *m, *v;
    int64_t numel;
    float b1, b2, eps, weight_decay;
    int plan_m, plan_v; /* plan entry ids */
} mt_adamw;

/* Initialise hyper-parameters (no memory). */
void mt_adamw_init(mt_adamw *o, mt_backend *be, int64_t numel, double b1, double b2, double eps,
                   double weight_decay);

/* Add "optimizer.adam_m" and "optimizer.adam_v" (numel fp32 each, category
 * MT_MEM_OPTIMIZER, live over phases [0, num_phases - 1]: they persist across steps).
 * Errors: those of mt_plan_add. */
mt_status mt_adamw_add_to_plan(mt_adamw *o, mt_plan *plan, int num_phases);

/* Point m and v into the arena and zero them. Errors: MT_ERR_INVALID if the plan
 * lacks the entries. */
mt_status mt_adamw_bind(mt_adamw *o, const mt_arena *arena, const mt_plan *plan);

/* One AdamW update of every parameter: params[i] over p/g/m/v + params[i].offset,
 * learning rate lr, gradients multiplied by grad_scale (clip factor times any
 * normalisation), t = 1-based step for the bias corrections.
 * Errors: MT_ERR_INVALID (t < 1, a tensor outside [0, numel)). */
mt_status mt_adamw_step(mt_adamw *o, const mt_param_info *params, int n, float *p, const float *g,
                        float lr, float grad_scale, int64_t t);

#ifdef __cplusplus
}
#endif
#endif
