/* train/step.c: one optimizer step (micro-batches, gradient reduction, clip, AdamW,
 * parameter all-gather), evaluation, the gradient read-out, and the collective bytes
 * of a step (see trainer.h). */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/checkpoint.h"
#include "models/safetensors.h"
#include "runtime/dtype.h"
#include "runtime/fileio.h"
#include "runtime/log.h"
#include "runtime/timer.h"
#include "train/trainer_private.h"

static mt_status chunked_pass(mt_trainer *t, float inv, double *norm, float lr, float clip, float *host);

mt_status mt_trainer_gather_grad(mt_trainer *t, float *host) {
    if (t->chunked_grad) return chunked_pass(t, t->last_inv_count, NULL, 0.0f, 0.0f, host);
    if (!t->last_grad) return mt_set_error(MT_ERR_INVALID, "mt_trainer_gather_grad: no step has run");
    if (t->gs.zero1) return mt_grad_sync_gather(&t->gs, t->last_grad, host);
    MT_TRY(t->be->ops->copy_to_host(t->be, host, t->last_grad, (size_t)t->numel * sizeof(float)));
    return MT_OK;
}

/* Bytes of one all-reduce of S bytes on T ranks (parallel/comm.h accounting). */
static uint64_t ar_bytes(uint64_t S, uint64_t T) { return T > 1 ? 2 * (T - 1) * S / T : 0; }

uint64_t mtt_step_bytes_formula(const mt_model *model, const mt_grad_sync *gs, int64_t ga) {
    const uint64_t scalar = ar_bytes(8, (uint64_t)gs->n); /* one 8-byte all-reduce on data x fsdp */
    int64_t twice0;
    const int64_t twice = mt_model_grad_twice(model, &twice0); /* a tied embedding's second share */
    return mt_grad_sync_step_bytes(gs, ga) + mt_grad_sync_range_bytes(gs, twice0, twice, ga) +
           (gs->zero1 ? 3 : 2) * scalar +
           (uint64_t)ga * (mt_model_shard_bytes(model) + /* tensor and context collectives */
                           (uint64_t)mt_dtype_size(mt_model_dtype(model)) * /* fsdp gathers, compute dtype */
                               (uint64_t)mt_model_fsdp_gather_floats(model));
}

void mt_trainer_step_bytes(const mt_trainer *t, uint64_t *measured, uint64_t *formula) {
    if (measured) *measured = t->last_step_bytes;
    if (formula) *formula = mtt_step_bytes_formula(t->model, &t->gs, t->cfg.gradient_accumulation_steps);
}

/* ----------------------------------------------------------------- a step ---- */

/* ------------------------------------------------------- the parallel step ----
 * Micro-batch gradients of the summed token loss go through the gradient sync
 * (parallel/zero1.h: grad_dtype accumulator, all-reduce or ZeRO-1 reduce-scatter);
 * loss sums and token counts are all-reduced over data x fsdp x context, so the step's loss is
 * the token-weighted mean over all micro-batches and ranks; the reduced gradient is
 * divided by the global token count; the clip norm is the global one (the shards'
 * squared norms all-reduced under ZeRO-1); AdamW updates this rank's shard and the
 * updated parameters are all-gathered (under fsdp only over data x context, into this
 * rank's fsdp shard). A world of one runs the same code with no
 * communication. */

/* The gradient read chunk by chunk (parallel/zero1.h MT_GRAD_WINDOW_ACC without
 * ZeRO-1: no full fp32 gradient exists), each chunk a run of whole parameters scaled
 * by inv: with norm, *norm = the global norm (the same sums in the same order as
 * mt_grad_global_norm over the full buffer); with host, the gradient copied to
 * host[numel]; else AdamW on each chunk's parameters (moments at the same offsets). */
static mt_status chunked_pass(mt_trainer *t, float inv, double *norm, float lr, float clip, float *host) {
    const mt_param_info *sp = t->sparams;
    const int np = t->nsparams;
    mt_param_info *rel = malloc(sizeof(mt_param_info) * (size_t)(np > 0 ? np : 1));
    if (!rel) return mt_set_error(MT_ERR_OOM, "trainer: out of memory");
    float *params = mt_model_params(t->model);
    double *acc = mt_model_step_stats(t->model) + 2; /* the squares' sum (model.h) */
    double ss = 0.0;
    mt_status st = MT_OK;
    if (norm) st = t->be->ops->zero(t->be, acc, sizeof(double));
    for (int i0 = 0; st == MT_OK && i0 < np;) {
        const int64_t a = sp[i0].offset;
        int i1 = i0 + 1;
        while (i1 < np && sp[i1].offset + sp[i1].numel - a <= t->gs.chunk) i1++;
        const int64_t n = sp[i1 - 1].offset + sp[i1 - 1].numel - a;
        float *buf = NULL;
        st = mt_grad_sync_read(&t->gs, a, n, &buf);
        if (st != MT_OK) break;
        st = t->be->ops->scale(t->be, buf, inv, n, MT_F32);
        if (st != MT_OK) break;
        if (norm) {
            for (int i = i0; st == MT_OK && i < i1; i++)
                st = t->be->ops->sumsq(t->be, buf + (sp[i].offset - a), sp[i].numel, acc);
        } else if (host) {
            st = t->be->ops->copy_to_host(t->be, host + a, buf, (size_t)n * sizeof(float));
        } else {
            mt_adamw sub = t->opt; /* the moments of [a, a + n) */
            sub.m += a;
            sub.v += a;
            sub.numel = n;
            for (int i = i0; i < i1; i++) {
                rel[i - i0] = sp[i];
                rel[i - i0].offset -= a;
            }
            st = mt_adamw_step(&sub, rel, i1 - i0, params + a, buf, lr, clip, t->step + 1);
        }
        i0 = i1;
    }
    free(rel);
    if (norm && st == MT_OK) st = t->be->ops->copy_to_host(t->be, &ss, acc, sizeof ss);
    if (norm) *norm = sqrt(ss);
    return st;
}

mt_status mt_trainer_step(mt_trainer *t, mt_step_metrics *m) {
    const double t0 = mt_time_now();
    mt_backend *be = t->be;
    float *grads = mt_model_grads(t->model); /* NULL with gradient windows (parallel/zero1.h) */
    const size_t gbytes = (size_t)t->numel * sizeof(float);
    mt_comm *dp = t->mesh->grad;
    const uint64_t bytes0 = mt_mesh_bytes_total(t->mesh);
    double *stats = mt_model_step_stats(t->model);
    /* bf16 compute weights: rounded from the master with the key of this update */
    mt_model_set_compute_rounding(t->model, (uint64_t)t->cfg.seed, t->step);
    if (grads) MT_TRY(be->ops->zero(be, grads, gbytes));
    MT_TRY(be->ops->zero(be, stats, MT_MODEL_STATS * sizeof(double)));
    for (int64_t mb = 0; mb < t->cfg.gradient_accumulation_steps; mb++) {
        mt_grad_sync_set_microbatch(&t->gs, mb);
        MT_TRY(mt_data_next(t->train, t->tokens, t->labels));
        /* adds the loss and count to stats, no host synchronisation */
        MT_TRY(mt_model_forward_backward_acc(t->model, t->tokens, t->labels, 1.0f));
        int zero = 0;
        MT_TRY(mt_grad_sync_microbatch(&t->gs, grads, mb, &zero));
        if (zero && grads && mb + 1 < t->cfg.gradient_accumulation_steps) MT_TRY(be->ops->zero(be, grads, gbytes));
    }
    double acc[2]; /* the step's first read of the device: loss sum and labelled count */
    MT_TRY(be->ops->copy_to_host(be, acc, stats, sizeof acc));
    double loss_sum = acc[0];
    int64_t count = (int64_t)acc[1];
    MT_TRY(mt_comm_all_reduce(dp, &loss_sum, 1, MT_COMM_F64));
    MT_TRY(mt_comm_all_reduce(dp, &count, 1, MT_COMM_I64));
    if (count <= 0)
        return mt_set_error(MT_ERR_RUNTIME, "step %" PRId64 ": no labelled token in the batch", t->step + 1);
    float *g = NULL;
    MT_TRY(mt_grad_sync_finish(&t->gs, grads, &g));
    const float inv = (float)(1.0 / (double)count);
    double norm = 0.0;
    t->last_grad = g;
    t->last_inv_count = inv;
    t->chunked_grad = g == NULL;
    if (g) {
        MT_TRY(be->ops->scale(be, g, inv, mt_grad_sync_opt_numel(&t->gs), MT_F32));
        MT_TRY(mt_grad_global_norm(be, g, t->sparams, t->nsparams, stats + 2, &norm));
    } else {
        MT_TRY(chunked_pass(t, inv, &norm, 0.0f, 0.0f, NULL));
    }
    if (t->gs.zero1) {
        double sq = norm * norm;
        MT_TRY(mt_comm_all_reduce(dp, &sq, 1, MT_COMM_F64));
        norm = sqrt(sq);
    }
    if (!isfinite(norm))
        return mt_set_error(MT_ERR_RUNTIME, "step %" PRId64 ": gradient norm is %g (loss %g)", t->step + 1,
                            norm, loss_sum / (double)count);
    const double clip = mt_clip_scale(norm, t->cfg.gradient_clipping_threshold);
    const double lr = mt_lr_schedule_at(&t->sched, t->step);
    float *params = mt_model_params(t->model);
    /* fsdp: the model holds only its fsdp shard [flo, fhi), the optimizer's [lo, hi) inside
     * it (without fsdp flo = 0) */
    if (g)
        MT_TRY(mt_adamw_step(&t->opt, t->sparams, t->nsparams, params + (t->gs.lo - t->gs.flo), g,
                             (float)lr, (float)clip, t->step + 1));
    else
        MT_TRY(chunked_pass(t, inv, NULL, (float)lr, (float)clip, NULL));
    MT_TRY(mt_grad_sync_gather_params(&t->gs, params));
    t->last_step_bytes = mt_mesh_bytes_total(t->mesh) - bytes0;
    /* No wait for the update: the next step's first read (or a checkpoint's copy) waits
     * for it, so the loss and norm reads are the step's only synchronisations
     * (tests/test_emu_syncs.c). step_ms then covers this step's forward, backward and
     * norm plus the previous step's update, which its first read waited for: the same
     * total over a run, the update counted one step later. */
    t->step++;
    const double dt = mt_time_now() - t0;
    t->time_sum += dt;
    t->timed_steps++;

    memset(m, 0, sizeof *m);
    m->step = t->step;
    m->has_train = 1;
    m->loss = loss_sum / (double)count;
    m->lr = lr;
    m->grad_norm = norm;
    m->tokens = count;
    m->step_ms = dt * 1e3;
    m->tokens_per_s = dt > 0 ? (double)count / dt : 0.0;
    m->mfu = mt_mfu(t->flops_per_token, m->tokens_per_s, t->peak_flops);
    m->total_steps = t->cfg.steps;
    m->eta_s = (double)(t->cfg.steps - t->step) * (t->time_sum / (double)t->timed_steps);
    return MT_OK;
}

mt_status mt_trainer_evaluate(mt_trainer *t, double *val_loss, int64_t *val_tokens) {
    if (!t->val) return mt_set_error(MT_ERR_INVALID, "evaluation is off (eval_interval <= 0)");
    mt_data_rewind(t->val);
    double sum = 0.0;
    int64_t count = 0;
    /* each validation window at most once (a wrap would count tokens twice) */
    const int64_t windows = mt_data_windows_per_epoch(t->val);
    const int64_t n = t->cfg.eval_steps < windows ? t->cfg.eval_steps : windows;
    mt_model_set_compute_rounding(t->model, (uint64_t)t->cfg.seed, t->step); /* the weights the next step sees */
    for (int64_t i = 0; i < n; i++) {
        MT_TRY(mt_data_next(t->val, t->tokens, t->labels));
        double ls = 0.0;
        int64_t c = 0;
        MT_TRY(mt_model_loss(t->model, t->tokens, t->labels, &ls, &c));
        sum += ls;
        count += c;
    }
    MT_TRY(mt_comm_all_reduce(t->mesh->grad, &sum, 1, MT_COMM_F64));
    MT_TRY(mt_comm_all_reduce(t->mesh->grad, &count, 1, MT_COMM_I64));
    *val_loss = count > 0 ? sum / (double)count : NAN;
    *val_tokens = count;
    return MT_OK;
}
