/* train/optimizer.c: LR schedule, global-norm clipping, AdamW (see optimizer.h). */
#include "train/optimizer.h"

#include <math.h>
#include <string.h>

#define MT_PI 3.14159265358979323846

mt_lr_schedule mt_lr_schedule_make(double learning_rate, double warmup_steps_fraction,
                                   double final_fraction, int64_t steps) {
    mt_lr_schedule s;
    s.peak = learning_rate;
    s.final_fraction = final_fraction;
    s.total_steps = steps;
    /* MaxText: int(learning_rate_schedule_steps * warmup_steps_fraction), truncation. */
    s.warmup_steps = (int64_t)((double)steps * warmup_steps_fraction);
    if (s.warmup_steps < 0) s.warmup_steps = 0;
    if (s.warmup_steps > steps) s.warmup_steps = steps;
    return s;
}

double mt_lr_schedule_at(const mt_lr_schedule *sch, int64_t s) {
    if (s < 0) s = 0;
    const double final_lr = sch->peak * sch->final_fraction;
    if (s < sch->warmup_steps) return sch->peak * (double)s / (double)sch->warmup_steps;
    const int64_t cos_steps = sch->total_steps - sch->warmup_steps;
    if (cos_steps <= 0) return final_lr;
    double pct = (double)(s - sch->warmup_steps) / (double)cos_steps;
    if (pct > 1.0) pct = 1.0;
    const double a = 0.5 * (cos(MT_PI * pct) + 1.0);
    return sch->peak * a + final_lr * (1.0 - a);
}

mt_status mt_grad_global_norm(mt_backend *be, const float *grads, const mt_param_info *params, int n, double *norm) {
    double ss = 0.0;
    for (int i = 0; i < n; i++) {
        double part;
        MT_TRY(be->ops->sumsq(be, grads + params[i].offset, params[i].numel, &part));
        ss += part;
    }
    *norm = sqrt(ss);
    return MT_OK;
}

double mt_clip_scale(double norm, double threshold) {
    if (threshold > 0.0 && norm > threshold) return threshold / norm;
    return 1.0;
}

void mt_adamw_init(mt_adamw *o, mt_backend *be, int64_t numel, double b1, double b2, double eps,
                   double weight_decay) {
    memset(o, 0, sizeof *o);
    o->be = be;
    o->numel = numel;
    o->b1 = (float)b1;
    o->b2 = (float)b2;
    o->eps = (float)eps;
    o->weight_decay = (float)weight_decay;
    o->plan_m = o->plan_v = -1;
}

mt_status mt_adamw_add_to_plan(mt_adamw *o, mt_plan *plan, int num_phases) {
    const size_t bytes = (size_t)o->numel * sizeof(float);
    const int last = num_phases > 0 ? num_phases - 1 : 0;
    MT_TRY(mt_plan_add(plan, "optimizer.adam_m", MT_MEM_OPTIMIZER, bytes, 0, last, &o->plan_m));
    MT_TRY(mt_plan_add(plan, "optimizer.adam_v", MT_MEM_OPTIMIZER, bytes, 0, last, &o->plan_v));
    return MT_OK;
}

mt_status mt_adamw_bind(mt_adamw *o, const mt_arena *arena, const mt_plan *plan) {
    o->m = mt_arena_ptr(arena, plan, o->plan_m);
    o->v = mt_arena_ptr(arena, plan, o->plan_v);
    if (!o->m || !o->v) return mt_set_error(MT_ERR_INVALID, "adamw: moments are not in the plan");
    MT_TRY(o->be->ops->zero(o->be, o->m, (size_t)o->numel * sizeof(float)));
    MT_TRY(o->be->ops->zero(o->be, o->v, (size_t)o->numel * sizeof(float)));
    return MT_OK;
}

mt_status mt_adamw_step(mt_adamw *o, const mt_param_info *params, int n, float *p, const float *g,
                        float lr, float grad_scale, int64_t t) {
    if (t < 1) return mt_set_error(MT_ERR_INVALID, "adamw: step t = %lld must be >= 1", (long long)t);
    for (int i = 0; i < n; i++) {
        const mt_param_info *pi = &params[i];
        if (pi->offset < 0 || pi->numel < 0 || pi->offset + pi->numel > o->numel)
            return mt_set_error(MT_ERR_INVALID, "adamw: tensor '%s' [%lld, +%lld) outside the %lld moments",
                                pi->name, (long long)pi->offset, (long long)pi->numel, (long long)o->numel);
        const float wd = pi->weight_decay ? o->weight_decay : 0.0f;
        MT_TRY(o->be->ops->adamw(o->be, p + pi->offset, g + pi->offset, o->m + pi->offset, o->v + pi->offset, pi->numel, lr,
                      o->b1, o->b2, o->eps, wd, grad_scale, t));
    }
    return MT_OK;
}
