/* train/optimizer.c: LR schedule, global-norm clipping, AdamW (see optimizer.h). */
#include "train/optimizer.h"

#include <math.h>
#include <stdlib.h>
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

mt_status mt_grad_global_norm(mt_backend *be, const float *grads, const mt_param_info *params, int n, double *acc,
                              double *norm) {
    MT_TRY(be->ops->zero(be, acc, sizeof(double)));
    for (int i = 0; i < n; i++) MT_TRY(be->ops->sumsq(be, grads + params[i].offset, params[i].numel, acc));
    double ss = 0.0;
    MT_TRY(be->ops->copy_to_host(be, &ss, acc, sizeof ss));
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
    o->plan_m = o->plan_v = o->plan_segs = -1;
}

mt_status mt_adamw_add_to_plan(mt_adamw *o, mt_plan *plan, int num_phases, int max_tensors) {
    if (max_tensors < 0) return mt_set_error(MT_ERR_INVALID, "adamw: %d tensors", max_tensors);
    const size_t bytes = (size_t)o->numel * sizeof(float);
    const int last = num_phases > 0 ? num_phases - 1 : 0;
    MT_TRY(mt_plan_add(plan, "optimizer.adam_m", MT_MEM_OPTIMIZER, bytes, 0, last, &o->plan_m));
    MT_TRY(mt_plan_add(plan, "optimizer.adam_v", MT_MEM_OPTIMIZER, bytes, 0, last, &o->plan_v));
    MT_TRY(mt_plan_add(plan, "optimizer.segments", MT_MEM_OPTIMIZER, (size_t)max_tensors * sizeof(mt_adamw_segment),
                       0, last, &o->plan_segs));
    o->max_segments = max_tensors;
    return MT_OK;
}

mt_status mt_adamw_bind(mt_adamw *o, const mt_arena *arena, const mt_plan *plan) {
    o->m = mt_arena_ptr(arena, plan, o->plan_m);
    o->v = mt_arena_ptr(arena, plan, o->plan_v);
    o->segs = mt_arena_ptr(arena, plan, o->plan_segs);
    if (!o->m || !o->v || !o->segs)
        return mt_set_error(MT_ERR_INVALID, "adamw: the moments or the segment table are not in the plan");
    MT_TRY(o->be->ops->zero(o->be, o->m, (size_t)o->numel * sizeof(float)));
    MT_TRY(o->be->ops->zero(o->be, o->v, (size_t)o->numel * sizeof(float)));
    return MT_OK;
}

mt_status mt_adamw_segments(const mt_param_info *params, int n, mt_adamw_segment *out, int *nsegs) {
    int k = 0;
    int64_t end = 0; /* end of the previous tensor */
    for (int i = 0; i < n; i++) {
        const mt_param_info *pi = &params[i];
        if (pi->offset < 0 || pi->numel < 0 || pi->offset > INT64_MAX - pi->numel || pi->offset < end)
            return mt_set_error(MT_ERR_INVALID, "adamw: tensor '%s' [%lld, +%lld) is negative, or overlaps or "
                                "precedes the tensor before it (the table must be sorted by offset)", pi->name,
                                (long long)pi->offset, (long long)pi->numel);
        end = pi->offset + pi->numel;
        if (pi->numel == 0) continue;
        const int32_t decay = pi->weight_decay ? 1 : 0;
        if (k > 0 && out[k - 1].decay == decay && out[k - 1].offset + out[k - 1].numel == pi->offset) {
            out[k - 1].numel += pi->numel;
            continue;
        }
        out[k].offset = pi->offset;
        out[k].numel = pi->numel;
        out[k].decay = decay;
        out[k].reserved = 0;
        k++;
    }
    *nsegs = k;
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
    }
    if (n <= 0) return MT_OK;
    mt_adamw_segment *segs = malloc(sizeof *segs * (size_t)n);
    if (!segs) return mt_set_error(MT_ERR_OOM, "adamw: out of memory for %d segments", n);
    int ns = 0;
    mt_status st = mt_adamw_segments(params, n, segs, &ns);
    if (st == MT_OK && ns > o->max_segments)
        st = mt_set_error(MT_ERR_INVALID, "adamw: %d segments, the plan's table holds %d", ns, o->max_segments);
    /* from pageable memory: queued without waiting for the device, the buffer free at once */
    if (st == MT_OK && ns > 0)
        st = o->be->ops->copy_to_device(o->be, o->segs, segs, sizeof *segs * (size_t)ns);
    free(segs);
    if (st == MT_OK && ns > 0)
        st = o->be->ops->adamw(o->be, p, g, o->m, o->v, o->segs, ns, lr, o->b1, o->b2, o->eps, o->weight_decay,
                               grad_scale, t);
    return st;
}
