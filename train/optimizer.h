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
 * AdamW: one be->ops->adamw per step (per chunk on the gradient-window path,
 * train/step.c) over the whole parameter table (kernels/ops.h gives the math and the
 * multi-tensor form, as torch's fused AdamW): the table becomes segments
 * (mt_adamw_segment, adjacent tensors with the same decay flag merged), weight decay
 * only on tensors with mt_param_info.weight_decay (matrices, not norm scales), moments
 * m and v in fp32 in backend memory laid out like the flat parameter buffer. */
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
 * backend memory, float32, laid out by params[i].offset / numel). fp64: the squares
 * are summed into acc (one double of backend memory, zeroed first) and read with one
 * synchronising copy. Errors: those of be->ops->sumsq or the copy (a backend failure). */
mt_status mt_grad_global_norm(mt_backend *be, const float *grads, const mt_param_info *params, int n, double *acc,
                              double *norm);

/* Gradient multiplier of clip_by_global_norm: threshold / norm when threshold > 0
 * and norm > threshold, else 1. */
double mt_clip_scale(double norm, double threshold);

/* AdamW hyper-parameters and state. m and v are backend memory of numel floats each,
 * segs backend memory of max_segments mt_adamw_segment (arena entries added by
 * mt_adamw_add_to_plan, in the memory of the plan it is given: the host pool's with
 * optimizer_memory_host_offload). */
typedef struct mt_adamw {
    mt_backend *be;
    float *m, *v;
    int64_t numel;
    float b1, b2, eps, weight_decay;
    mt_adamw_segment *segs; /* the segment table of the last step (rewritten by each) */
    int max_segments;
    int plan_m, plan_v, plan_segs; /* plan entry ids */
} mt_adamw;

/* Initialise hyper-parameters (no memory). */
void mt_adamw_init(mt_adamw *o, mt_backend *be, int64_t numel, double b1, double b2, double eps,
                   double weight_decay);

/* Add "optimizer.adam_m" and "optimizer.adam_v" (numel fp32 each) and
 * "optimizer.segments" (max_tensors x 24 bytes: the segment table of a step over at
 * most max_tensors tensors, the model's parameter count), category MT_MEM_OPTIMIZER,
 * live over phases [0, num_phases - 1]: they persist across steps.
 * Errors: MT_ERR_INVALID (max_tensors < 0), those of mt_plan_add. */
mt_status mt_adamw_add_to_plan(mt_adamw *o, mt_plan *plan, int num_phases, int max_tensors);

/* Point m, v and the segment table into the arena and zero the moments.
 * Errors: MT_ERR_INVALID if the plan lacks the entries. */
mt_status mt_adamw_bind(mt_adamw *o, const mt_arena *arena, const mt_plan *plan);

/* The segments of the n tensors of params (sorted by offset, disjoint) into out[n] (host
 * memory): tensors of numel 0 dropped, a tensor that starts where the previous ends and
 * has the same weight_decay flag merged into its segment. *nsegs gets the count (<= n).
 * Errors: MT_ERR_INVALID naming a tensor with a negative offset or numel, or one that
 * precedes or overlaps the one before it. */
mt_status mt_adamw_segments(const mt_param_info *params, int n, mt_adamw_segment *out, int *nsegs);

/* One AdamW update of every parameter: params[i] (sorted by offset, disjoint) over
 * p/g/m/v + params[i].offset, learning rate lr, gradients multiplied by grad_scale (clip
 * factor times any normalisation), t = 1-based step for the bias corrections. One
 * be->ops->adamw call: the segment table (mt_adamw_segments) is uploaded into o->segs
 * with copy_to_device (no wait for the device: on CUDA the upload is queued after the
 * previous call's kernel, so calls in a row may rewrite the table) and the op runs over
 * it. Errors: MT_ERR_INVALID (t < 1, a tensor outside [0, numel), out of order, or more
 * segments than the plan's table holds), MT_ERR_OOM, the op's and the copy's. */
mt_status mt_adamw_step(mt_adamw *o, const mt_param_info *params, int n, float *p, const float *g,
                        float lr, float grad_scale, int64_t t);

#ifdef __cplusplus
}
#endif
#endif
