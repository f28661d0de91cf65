/* train/estimate.c: per-device memory plan of a job, step-time model, the
 * batch-size / remat-policy estimator of one mesh and the search over meshes (see
 * estimate.h). */
#include "train/estimate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/mesh.h"
#include "runtime/timer.h"
#include "train/metrics.h"
#include "train/trainer.h"

/* ------------------------------------------------------------------ mesh ---- */

static mt_status job_dims(const mt_train_config *cfg, int dims[4]) {
    const int64_t ici[4] = {cfg->ici_data_parallelism, cfg->ici_fsdp_parallelism, cfg->ici_context_parallelism,
                            cfg->ici_tensor_parallelism};
    if (cfg->num_devices < 1 || cfg->num_devices > (1 << 30))
        return mt_set_error(MT_ERR_INVALID, "key 'num_devices' = %lld: must be in [1, 2^30]",
                            (long long)cfg->num_devices);
    int all_one = 1;
    for (int a = 0; a < 4; a++) all_one &= ici[a] == 1;
    if (all_one) {
        dims[MT_AXIS_DATA] = 1;
        dims[MT_AXIS_FSDP] = (int)cfg->num_devices;
        dims[MT_AXIS_CONTEXT] = 1;
        dims[MT_AXIS_TENSOR] = 1;
        return MT_OK;
    }
    return mt_mesh_resolve(ici, (int)cfg->num_devices, dims);
}

/* The config of one rank's local model: heads, kv heads and mlp split by tensor,
 * vocabulary split by tensor (vocab-parallel), sequence by context; one device. The
 * layout must pass the trainer's own check (train/trainer.h mt_trainer_check_layout,
 * parallel/mesh.h's rules: no kv-head replication, 2C chunks, ...), with its message. */
static mt_status local_config(const mt_train_config *cfg, const int dims[4], mt_train_config *lc) {
    *lc = *cfg;
    const int64_t Tn = dims[MT_AXIS_TENSOR], Cn = dims[MT_AXIS_CONTEXT];
    mt_model_config *m = &lc->model;
    MT_TRY(mt_trainer_check_layout(cfg, dims));
    m->num_query_heads /= Tn;
    m->num_kv_heads /= Tn;
    m->mlp_dim /= Tn;
    m->vocab_size /= Tn;
    if (Cn > 1) {
        lc->max_target_length /= Cn;
        if (lc->num_vocab_tiling > lc->per_device_batch_size * lc->max_target_length)
            lc->num_vocab_tiling = lc->per_device_batch_size * lc->max_target_length;
    }
    lc->ici_data_parallelism = lc->ici_fsdp_parallelism = lc->ici_context_parallelism = lc->ici_tensor_parallelism = 1;
    lc->shard_optimizer_over_data = 0;
    lc->gradient_accumulation_reduce = 0;
    lc->num_devices = 1;
    lc->parameter_memory_host_offload = lc->optimizer_memory_host_offload = 0;
    return MT_OK;
}

/* -------------------------------------------------------------- the plan ---- */

/* The remat name a per-layer activation entry belongs to (context_lse: context), or
 * -1 (norm statistics, entries of no layer). Read from the entry's tag. */
static int saved_tensor(const mt_plan_entry *e) {
    if (e->tag.layer < 0 || e->tag.tensor < 0) return -1;
    return mt_layer_tensor_remat((mt_layer_tensor)e->tag.tensor);
}

/* Add entry e of the device plan to its row of r. */
static void add_to_row(mt_memory_rows *r, const mt_plan_entry *e) {
    switch (e->category) {
    case MT_MEM_PARAMS: r->params += e->bytes; break;
    case MT_MEM_GRADS: r->grads += e->bytes; break;
    case MT_MEM_OPTIMIZER: r->optimizer += e->bytes; break;
    case MT_MEM_ACTIVATIONS: {
        const int t = saved_tensor(e);
        if (t >= 0) r->saved[t] += e->bytes;
        else r->saved_other += e->bytes;
        break;
    }
    case MT_MEM_SCRATCH:
        if (e->tag.kind == MT_PLAN_KIND_REMAT_SCRATCH) r->recompute_scratch += e->bytes;
        else r->scratch += e->bytes;
        break;
    case MT_MEM_LOSS_TILE: r->loss_tile += e->bytes; break;
    case MT_MEM_COMM: r->comm += e->bytes; break;
    case MT_MEM_WORKSPACE: r->workspace += e->bytes; break;
    default: break;
    }
}

static void fill_report(mt_memory_report *r, const mt_plan *p, const mt_plan *h) {
    size_t live[MT_MEM_CATEGORY_COUNT];
    mt_plan_live_by_category(p, live, &r->peak_phase);
    r->live_at_peak = 0;
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++) r->live_at_peak += live[c];
    r->peak = mt_plan_peak(p);
    for (int i = 0; i < mt_plan_count(p); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        add_to_row(&r->total, e);
        if (e->first <= r->peak_phase && r->peak_phase <= e->last) add_to_row(&r->live, e);
        if (e->category == MT_MEM_ACTIVATIONS && e->tag.layer == 0)
            r->layer_kept += e->bytes;
    }
    for (int i = 0; h && i < mt_plan_count(h); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(h, i);
        if (e->category == MT_MEM_PARAMS) r->host_params += e->bytes;
        else if (e->category == MT_MEM_OPTIMIZER) r->host_optimizer += e->bytes;
        else r->host_activations += e->bytes;
        r->host_total += e->bytes;
    }
}

/* The trainer's own plan of rank 0 of the full data x fsdp x context x tensor mesh,
 * each axis given explicitly (mt_trainer_plan resolves a -1 axis to 1). */
static mt_status trainer_plan(const mt_train_config *cfg, const int dims[4], mt_plan **p, mt_plan **h,
                              int64_t *local, uint64_t *step_bytes, int64_t vocab_tiling[3]) {
    mt_train_config lc = *cfg;
    lc.ici_data_parallelism = dims[MT_AXIS_DATA];
    lc.ici_fsdp_parallelism = dims[MT_AXIS_FSDP];
    lc.ici_context_parallelism = dims[MT_AXIS_CONTEXT];
    lc.ici_tensor_parallelism = dims[MT_AXIS_TENSOR];
    lc.num_devices = cfg->num_devices;
    return mt_trainer_plan_ex(&lc, p, h, local, step_bytes, vocab_tiling);
}

mt_status mt_memory_plan_rank(const mt_train_config *cfg, mt_memory_report *rep, mt_plan **plan, mt_plan **host_plan) {
    if (plan) *plan = NULL;
    if (host_plan) *host_plan = NULL;
    memset(rep, 0, sizeof *rep);
    int dims[4];
    MT_TRY(job_dims(cfg, dims));
    mt_plan *p = NULL, *h = NULL;
    int64_t local = 0;
    uint64_t bytes = 0;
    /* The trainer's own plan for rank 0 of the whole mesh: exactly what that rank
     * allocates, every fsdp layout included; what it refuses is refused here. */
    mt_status st = trainer_plan(cfg, dims, &p, &h, &local, &bytes, rep->vocab_tiling);
    if (st == MT_OK) {
        rep->step_bytes = bytes;
        memcpy(rep->dims, dims, sizeof dims);
        rep->num_params = mt_model_num_parameters(&cfg->model);
        rep->local_params = local;
        fill_report(rep, p, h);
    }
    if (st != MT_OK || !plan) mt_plan_free(p);
    else *plan = p;
    if (st != MT_OK || !host_plan) mt_plan_free(h);
    else *host_plan = h;
    return st;
}

/* ------------------------------------------------------------ step model ---- */

mt_step_model mt_step_model_default(void) {
    mt_step_model s = {989e12, 55e9, 50e9,
                       "an H100/H200 SXM GPU (dense bf16 peak), PCIe 5 x16 host link, 400 Gb/s InfiniBand"};
    return s;
}

/* Forward FLOPs per token of recomputing named tensor t of one layer (local dims,
 * sequence T of the attention). */
static double recompute_flops(const mt_model_config *m, int64_t T, int t) {
    const double D = (double)m->emb_dim, QD = (double)(m->num_query_heads * m->head_dim);
    const double KVD = (double)(m->num_kv_heads * m->head_dim), F = (double)m->mlp_dim;
    switch (t) {
    case MT_RT_QUERY_PROJ: return 2 * D * QD;
    case MT_RT_KEY_PROJ:
    case MT_RT_VALUE_PROJ: return 2 * D * KVD;
    case MT_RT_CONTEXT: return 4.0 * (double)T * QD;
    case MT_RT_OUT_PROJ: return 2 * QD * D;
    case MT_RT_MLPWI_0:
    case MT_RT_MLPWI_1: return 2 * D * F;
    case MT_RT_MLPWO: return m->use_post_ffw_norm ? 2 * F * D : 0.0;
    default: return 0.0;
    }
}

/* Bytes of named tensor t of one layer (what the model's plan saves for it): es bytes
 * per element of the activation dtype, the attention logsumexp in fp32. */
static double tensor_bytes(const mt_model_config *m, int64_t B, int64_t T, int t, double es) {
    const double N = (double)(B * T), f4 = es;
    const double D = (double)m->emb_dim, QD = (double)(m->num_query_heads * m->head_dim);
    const double KVD = (double)(m->num_kv_heads * m->head_dim), F = (double)m->mlp_dim;
    switch (t) {
    case MT_RT_DECODER_LAYER_INPUT: return N * D * f4;
    case MT_RT_QUERY_PROJ: return N * QD * f4;
    case MT_RT_KEY_PROJ:
    case MT_RT_VALUE_PROJ: return N * KVD * f4;
    case MT_RT_CONTEXT: return N * QD * f4 + (double)B * (double)m->num_query_heads * (double)T * 4.0;
    case MT_RT_OUT_PROJ: return N * D * f4;
    case MT_RT_MLPWI_0:
    case MT_RT_MLPWI_1: return N * F * f4;
    case MT_RT_MLPWO: return m->use_post_ffw_norm ? N * D * f4 : 0.0;
    default: return 0.0;
    }
}

/* Tokens one device is credited with per step: a tensor x context group shares its
 * sequences (train/metrics.h: the job's tokens over the world). */
static double device_tokens(const mt_train_config *cfg, const int dims[4], int64_t batch) {
    return (double)batch * (double)cfg->max_target_length * (double)cfg->gradient_accumulation_steps /
           ((double)dims[MT_AXIS_CONTEXT] * (double)dims[MT_AXIS_TENSOR]);
}

/* Model FLOPs of one device's step without recompute: the trainer's mfu formula. */
static double model_flops(const mt_train_config *cfg, const int dims[4], int64_t batch) {
    return mt_flops_per_token(&cfg->model, cfg->max_target_length) * device_tokens(cfg, dims, batch);
}

/* Modelled seconds of cfg on the mesh dims with `comm` collective bytes (the caller's
 * figure: the trainer's formula, or 0 where only policies of one layout and batch are
 * compared, which send the same bytes). INFINITY when the layout or policy is refused. */
static double step_time(const mt_train_config *cfg, const int dims[4], const mt_step_model *sm, double comm,
                        double *flops_out, double *offload_out) {
    mt_train_config lc;
    if (local_config(cfg, dims, &lc) != MT_OK) return INFINITY;
    mt_remat_policy pol;
    if (mt_memory_remat_policy(cfg, &pol) != MT_OK) return INFINITY;
    const mt_model_config *m = &lc.model;
    const double L = (double)m->num_decoder_layers, ga = (double)cfg->gradient_accumulation_steps;
    /* this rank's rows: a tensor rank recomputes its slice of every row of its group */
    const double rows = (double)(lc.per_device_batch_size * lc.max_target_length) * ga;
    double recompute = 0, off_bytes = 0;
    for (int t = 1; t < MT_RT_COUNT; t++) {
        if (pol.action[t] == MT_RA_REMAT) recompute += L * recompute_flops(m, cfg->max_target_length, t);
        if (pol.action[t] == MT_RA_OFFLOAD)
            off_bytes += 2.0 * L * tensor_bytes(m, lc.per_device_batch_size, lc.max_target_length, t,
                                                (double)mt_dtype_size(cfg->dtype));
    }
    off_bytes *= ga;
    const double Fs = dims[MT_AXIS_FSDP], Dp = dims[MT_AXIS_DATA];
    const double pbytes = (double)mt_model_num_parameters(m) * 4.0;
    /* the windows' host-to-device copies, of the compute dtype (the bf16 compute copy with dtype=bfloat16) */
    if (cfg->parameter_memory_host_offload)
        off_bytes += 2.0 * ga * (double)mt_model_num_parameters(m) * (double)mt_dtype_size(cfg->dtype) / Fs;
    /* the moments are sharded over data with ZeRO-1, which fsdp implies (parallel/zero1.h) */
    if (cfg->optimizer_memory_host_offload)
        off_bytes += 2.0 * 2.0 * pbytes / (Fs * (cfg->shard_optimizer_over_data || Fs > 1 ? Dp : 1));
    const double flops = model_flops(cfg, dims, cfg->per_device_batch_size) + recompute * rows;
    if (flops_out) *flops_out = flops;
    if (offload_out) *offload_out = off_bytes;
    return flops / sm->device_flops + off_bytes / sm->host_bw + comm / sm->link_bw;
}

double mt_step_model_seconds(const mt_train_config *cfg, const mt_step_model *sm, double *flops_out,
                             double *offload_out, double *comm_out) {
    int dims[4];
    mt_memory_report r;
    if (job_dims(cfg, dims) != MT_OK || mt_memory_plan_rank(cfg, &r, NULL, NULL) != MT_OK) return INFINITY;
    if (comm_out) *comm_out = (double)r.step_bytes;
    return step_time(cfg, dims, sm, (double)r.step_bytes, flops_out, offload_out);
}

/* ------------------------------------------------------------- estimator ---- */

/* Exact confirmation, cached: the device plan depends only on which tensors are kept
 * (remat and offload both use the layer scratch), so one plan per (batch, kept set),
 * made with every other tensor offloaded, gives the device peak of all its remat /
 * offload mixes and the host bytes of each offloaded name. The step's collective bytes
 * depend on what is recomputed where the recompute communicates (a tensor or context
 * axis: models/model.h mt_model_shard_bytes; fsdp with param_window_unit=weight, whose
 * recompute gathers weights again: mt_model_fsdp_gather_floats): there the recomputed
 * set is part of the key and those tensors stay recomputed in the plan. */
typedef struct confirm_entry {
    int64_t batch;
    unsigned kept;                  /* bit t: tensor t on the device */
    unsigned remat;                 /* bit t: tensor t recomputed (only with a tensor or context axis) */
    size_t peak, host_fixed;        /* device peak; host bytes that are not activations */
    size_t host_name[MT_RT_COUNT];  /* host bytes of each offloaded name */
    uint64_t step_bytes;            /* collective bytes of rank 0 per step */
} confirm_entry;
typedef struct confirm_cache {
    confirm_entry e[4 * MT_RT_COUNT + 8];
    int n;
} confirm_cache;

/* The search of one layout. */
typedef struct search {
    mt_train_config layout_cfg;  /* the job's config with ici_* = dims */
    const mt_train_config *base; /* &layout_cfg */
    mt_train_config cfg;         /* scratch copy */
    int dims[4];
    int64_t unit;                /* batches searched are multiples of it (the layout's smallest batch) */
    size_t budget;
    int plans;
    confirm_cache cache;
} search;

static void set_policy(mt_train_config *c, const mt_remat_policy *p) {
    c->remat_policy = MT_REMAT_CUSTOM;
    for (int t = 0; t < MT_RT_COUNT; t++) c->remat_custom[t] = (int)p->action[t];
}

/* Exact device peak of (batch, policy) with the full depth. */
static mt_status exact_peak(search *s, int64_t batch, const mt_remat_policy *p, mt_memory_report *rep) {
    s->cfg = *s->base;
    s->cfg.per_device_batch_size = batch;
    set_policy(&s->cfg, p);
    s->plans++;
    return mt_memory_plan_rank(&s->cfg, rep, NULL, NULL);
}

/* Device peak by depth extrapolation: every layer adds the same kept bytes and the
 * scratch is one layer's worth (tests/test_plan_remat.c checks that the plan is
 * additive in depth), so live(L) = live(3) + (L - 3) (live(3) - live(2)), live being
 * the bytes live at the peak phase: a lower bound of the arena (which packs them with
 * some fragmentation, not additive in depth to the byte), and exact in depth, so the
 * frontier found this way is never below the true one and the exact plans that confirm
 * it afterwards only step down. gemma4's layers are not alike (head dims, MLP widths,
 * KV sharing by position): its peak is always exact. */
static mt_status fast_peak(search *s, int64_t batch, const mt_remat_policy *p, double *peak) {
    const int64_t L = s->base->model.num_decoder_layers;
    if (L <= 4 || s->base->model.decoder_block == MT_DECODER_GEMMA4) {
        mt_memory_report r;
        MT_TRY(exact_peak(s, batch, p, &r));
        *peak = (double)r.peak;
        return MT_OK;
    }
    double pk[2];
    for (int i = 0; i < 2; i++) {
        s->cfg = *s->base;
        s->cfg.per_device_batch_size = batch;
        s->cfg.model.num_decoder_layers = 2 + i;
        set_policy(&s->cfg, p);
        mt_memory_report r;
        s->plans++;
        MT_TRY(mt_memory_plan_rank(&s->cfg, &r, NULL, NULL));
        pk[i] = (double)r.live_at_peak;
    }
    *peak = pk[1] + (double)(L - 3) * (pk[1] - pk[0]);
    return MT_OK;
}

static mt_status fits(search *s, int64_t batch, const mt_remat_policy *p, int *ok) {
    double pk;
    MT_TRY(fast_peak(s, batch, p, &pk));
    *ok = pk <= (double)s->budget;
    return MT_OK;
}

/* Largest batch in [1, hi] (hi = 0: unbounded) that fits p and is a multiple of
 * s->unit; 0 when none. */
static mt_status max_batch(search *s, const mt_remat_policy *p, int64_t hi, int64_t *out) {
    const int64_t u = s->unit;
    int ok;
    *out = 0;
    if (hi > 0 && hi < u) return MT_OK;
    MT_TRY(fits(s, u, p, &ok));
    if (!ok) return MT_OK;
    int64_t lo = 1, top; /* in units */
    if (hi > 0) {
        top = hi / u;
        MT_TRY(fits(s, top * u, p, &ok));
        if (ok) return *out = top * u, MT_OK;
    } else {
        top = 2;
        for (;;) {
            MT_TRY(fits(s, top * u, p, &ok));
            if (!ok) break;
            lo = top;
            if (top * u >= ((int64_t)1 << 24)) return *out = top * u, MT_OK;
            top *= 2;
        }
    }
    /* lo fits, top does not */
    while (top - lo > 1) {
        int64_t mid = lo + (top - lo) / 2;
        MT_TRY(fits(s, mid * u, p, &ok));
        if (ok) lo = mid;
        else top = mid;
    }
    *out = lo * u;
    return MT_OK;
}

static mt_status confirm(search *s, int64_t batch, const mt_remat_policy *p, size_t *peak, size_t *host,
                         uint64_t *step_bytes) {
    confirm_cache *c = &s->cache;
    unsigned kept = 0, remat = 0;
    /* context, tensor; fsdp with weight windows (the recompute reads, and gathers, weights again) */
    const int recompute_talks = s->dims[MT_AXIS_CONTEXT] > 1 || s->dims[MT_AXIS_TENSOR] > 1 ||
                                (s->dims[MT_AXIS_FSDP] > 1 && s->base->param_window_unit);
    for (int t = 0; t < MT_RT_COUNT; t++) {
        if (p->action[t] == MT_RA_DEVICE) kept |= 1u << t;
        if (p->action[t] == MT_RA_REMAT && recompute_talks) remat |= 1u << t;
    }
    confirm_entry *e = NULL;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].batch == batch && c->e[i].kept == kept && c->e[i].remat == remat) e = &c->e[i];
    if (!e) {
        mt_remat_policy q = *p;
        for (int t = 1; t < MT_RT_COUNT; t++)
            if (q.action[t] != MT_RA_DEVICE && !(remat >> t & 1)) q.action[t] = MT_RA_OFFLOAD;
        s->cfg = *s->base;
        s->cfg.per_device_batch_size = batch;
        set_policy(&s->cfg, &q);
        s->plans++;
        mt_memory_report r;
        mt_plan *h = NULL;
        MT_TRY(mt_memory_plan_rank(&s->cfg, &r, NULL, &h));
        e = &c->e[c->n < (int)(sizeof c->e / sizeof c->e[0]) ? c->n++ : c->n - 1];
        memset(e, 0, sizeof *e);
        e->batch = batch;
        e->kept = kept;
        e->remat = remat;
        e->peak = r.peak;
        e->host_fixed = r.host_total - r.host_activations;
        e->step_bytes = r.step_bytes;
        for (int i = 0; i < mt_plan_count(h); i++) {
            const mt_plan_entry *he = mt_plan_entry_get(h, i);
            const int t = saved_tensor(he);
            if (he->category == MT_MEM_ACTIVATIONS && t >= 0) e->host_name[t] += he->bytes;
        }
        mt_plan_free(h);
    }
    *peak = e->peak;
    *host = e->host_fixed;
    *step_bytes = e->step_bytes;
    for (int t = 0; t < MT_RT_COUNT; t++)
        if (p->action[t] == MT_RA_OFFLOAD) *host += e->host_name[t];
    return MT_OK;
}

static int cmp_rows(const void *a, const void *b) {
    const mt_estimate_row *x = a, *y = b;
    if (x->tokens_per_s != y->tokens_per_s) return x->tokens_per_s > y->tokens_per_s ? -1 : 1;
    return (x->batch < y->batch) - (x->batch > y->batch);
}

static int same_policy(const mt_remat_policy *a, const mt_remat_policy *b) {
    for (int t = 0; t < MT_RT_COUNT; t++)
        if (a->action[t] != b->action[t]) return 0;
    return 1;
}

/* The rows of one layout: rows[0..n) of capacity cap. */
typedef struct row_list {
    mt_estimate_row *rows;
    int n, cap;
} row_list;

static int has_row(const row_list *r, int64_t batch, const mt_remat_policy *p) {
    for (int i = 0; i < r->n; i++)
        if (r->rows[i].batch == batch && same_policy(&r->rows[i].policy, p)) return 1;
    return 0;
}

/* Row a dominates row b: a batch at least as large and a modelled step at most as
 * long, one of them strictly. */
static int dominates(const mt_estimate_row *a, const mt_estimate_row *b) {
    return a->batch >= b->batch && a->step_s <= b->step_s && (a->batch > b->batch || a->step_s < b->step_s);
}

/* Keep the rows no other row dominates (the Pareto list of batch size against
 * modelled step time); of rows equal in both, the first. */
static void pareto_filter(row_list *r) {
    int kept = 0;
    for (int i = 0; i < r->n; i++) {
        int out = 0;
        for (int j = 0; j < r->n && !out; j++) {
            if (j == i) continue;
            out = dominates(&r->rows[j], &r->rows[i]) ||
                  (j < i && r->rows[j].batch == r->rows[i].batch && r->rows[j].step_s == r->rows[i].step_s);
        }
        if (!out) r->rows[kept++] = r->rows[i];
    }
    r->n = kept;
}

/* For each searched tensor order[0..n), the cheaper of remat and offload under the
 * step model (cheap[t]); the model is additive over tensors and linear in the batch,
 * and the collective bytes do not depend on the policy (compared at 0), so one
 * comparison at the smallest batch from the lightest policy decides for every row. */
static mt_status cheaper_non_kept(search *s, const mt_step_model *sm, const mt_remat_policy *lightest,
                                  const int *order, int n, int cheap[MT_RT_COUNT]) {
    for (int t = 0; t < MT_RT_COUNT; t++) cheap[t] = MT_RA_REMAT;
    s->cfg = *s->base;
    s->cfg.per_device_batch_size = s->unit;
    set_policy(&s->cfg, lightest);
    const double base = step_time(&s->cfg, s->dims, sm, 0.0, NULL, NULL);
    if (!isfinite(base)) return mt_set_error(MT_ERR_INVALID, "estimator: the step model rejects the config");
    for (int k = 0; k < n; k++) {
        mt_remat_policy q = *lightest;
        q.action[order[k]] = MT_RA_OFFLOAD;
        set_policy(&s->cfg, &q);
        if (step_time(&s->cfg, s->dims, sm, 0.0, NULL, NULL) < base) cheap[order[k]] = MT_RA_OFFLOAD;
    }
    return MT_OK;
}

static mt_status add_row(row_list *r, int64_t batch, const mt_remat_policy *p) {
    if (r->n >= r->cap) return mt_set_error(MT_ERR_OOM, "estimator: too many rows");
    mt_estimate_row *row = &r->rows[r->n++];
    memset(row, 0, sizeof *row);
    row->batch = batch;
    row->policy = *p;
    return MT_OK;
}

/* Room for one layout's rows: the walk (at most 2n + 1 rows) and a variant of each. */
enum { ROWS_CAP = 4 * (MT_RT_COUNT + 1) };

/* The tensors searched and the policies at both ends of the search. */
typedef struct searched {
    int order[MT_RT_COUNT];      /* searchable tensors, largest first (ties: MaxText's name order) */
    int n;
    mt_remat_policy lightest;    /* every searched tensor remat, the fixed ones as cfg says */
    mt_remat_policy heaviest;    /* every searched tensor on the device */
} searched;

/* The starting policy: fixed tensors from cfg's custom keys, the rest searched
 * (tensors of zero size left remat), ordered by size. */
static mt_status searched_tensors(const mt_train_config *cfg, const int fixed[MT_RT_COUNT], searched *q) {
    mt_remat_policy user;
    mt_remat_action acts[MT_RT_COUNT];
    for (int t = 0; t < MT_RT_COUNT; t++) acts[t] = (mt_remat_action)cfg->remat_custom[t];
    MT_TRY(mt_remat_policy_resolve(MT_REMAT_CUSTOM, acts, &user));
    int *order = q->order, n = 0;
    double sz[MT_RT_COUNT];
    for (int t = 1; t < MT_RT_COUNT; t++) {
        sz[t] = tensor_bytes(&cfg->model, 1, cfg->max_target_length, t, (double)mt_dtype_size(cfg->dtype));
        if (fixed && fixed[t]) continue;
        if (sz[t] <= 0) {
            user.action[t] = MT_RA_REMAT;
            continue;
        }
        order[n++] = t;
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && sz[order[j]] > sz[order[j - 1]]; j--) {
            int x = order[j];
            order[j] = order[j - 1];
            order[j - 1] = x;
        }
    q->n = n;
    q->lightest = q->heaviest = user;
    for (int i = 0; i < n; i++) {
        q->lightest.action[order[i]] = MT_RA_REMAT;
        q->heaviest.action[order[i]] = MT_RA_DEVICE;
    }
    return MT_OK;
}

/* Mode 1's walk from b (> 0), the largest batch under the lightest policy: remat ->
 * offload and offload -> device one tensor at a time, smallest first, each step the
 * largest batch not above the previous one; every (batch, policy) step is a row. */
static mt_status walk_batch_and_policy(search *s, const searched *q, int64_t b, row_list *out) {
    mt_remat_policy p = q->lightest;
    mt_status st = add_row(out, b, &p);
    /* remat -> offload, smallest first; then offload -> device, smallest first */
    for (int phase = 0; st == MT_OK && phase < 2 && b > 0; phase++) {
        for (int i = q->n - 1; st == MT_OK && i >= 0 && b > 0; i--) {
            p.action[q->order[i]] = phase == 0 ? MT_RA_OFFLOAD : MT_RA_DEVICE;
            int64_t nb = 0;
            st = max_batch(s, &p, b, &nb);
            if (st != MT_OK || nb == 0) {
                b = 0;
                break;
            }
            st = add_row(out, nb, &p); /* every (batch, policy) step is a candidate */
            b = nb;
        }
    }
    return st;
}

/* fits, and then (fast_peak is a lower bound of the arena) the exact full-depth plan's
 * peak within the budget too (confirm: the plan confirm_and_model then finds cached). */
static mt_status fits_exact(search *s, int64_t batch, const mt_remat_policy *p, int *ok) {
    MT_TRY(fits(s, batch, p, ok));
    if (!*ok) return MT_OK;
    size_t peak = 0, host = 0;
    uint64_t bytes = 0;
    MT_TRY(confirm(s, batch, p, &peak, &host, &bytes));
    *ok = peak <= s->budget;
    return MT_OK;
}

/* Mode 2 (the lightest policy fits batch, checked by the caller): from all-device step
 * back (device -> offload, largest first, then offload -> remat) until it fits at full
 * depth (fits_exact: the arena's packing can put a policy that fits by extrapolation
 * over the budget); that policy is the one row. */
static mt_status walk_fixed_batch(search *s, const searched *q, int64_t batch, row_list *out) {
    int ok = 0;
    mt_status st = MT_OK;
    mt_remat_policy p = q->heaviest;
    /* device -> offload largest first, then offload -> remat largest first */
    for (int phase = 0; st == MT_OK && phase < 2; phase++) {
        st = fits_exact(s, batch, &p, &ok);
        if (st != MT_OK || ok) break;
        for (int i = 0; st == MT_OK && i < q->n; i++) {
            p.action[q->order[i]] = phase == 0 ? MT_RA_OFFLOAD : MT_RA_REMAT;
            st = fits_exact(s, batch, &p, &ok);
            if (ok) break;
        }
        if (ok) break;
    }
    if (st == MT_OK) st = add_row(out, batch, &p);
    return st;
}

/* Mode 1: each (batch, policy) of the walk also with every searched tensor that is
 * not kept on the device given the cheaper of remat and offload under the step
 * model (the walk's order may leave a tensor offloaded where recomputing it is
 * faster): the same kept set, so the same device plan and the same fit. */
static mt_status add_cheaper_variants(search *s, const searched *q, const mt_step_model *sm, row_list *out) {
    int cheap[MT_RT_COUNT];
    mt_status st = cheaper_non_kept(s, sm, &q->lightest, q->order, q->n, cheap);
    const int walked = out->n;
    for (int i = 0; st == MT_OK && i < walked; i++) {
        mt_remat_policy v = out->rows[i].policy;
        for (int k = 0; k < q->n; k++)
            if (v.action[q->order[k]] != MT_RA_DEVICE) v.action[q->order[k]] = (mt_remat_action)cheap[q->order[k]];
        if (!has_row(out, out->rows[i].batch, &v)) st = add_row(out, out->rows[i].batch, &v);
    }
    return st;
}

/* Confirm each row with the exact full-depth plan and model its step time (collective
 * bytes: the trainer's formula from that plan) and tokens/s. The extrapolation from 2
 * and 3 layers is exact for the bytes live at each phase, but the arena's packing can
 * leave a gap at full depth that the shallow plans did not have (the peak is the
 * packed arena's size): a row over the budget at full depth steps its batch down by the
 * layout's unit, and one that does not fit at its smallest (or, mode 2, its fixed)
 * batch is dropped. */
static mt_status confirm_and_model(search *s, int mode, const mt_step_model *sm, row_list *out) {
    mt_status st = MT_OK;
    int kept = 0;
    for (int i = 0; st == MT_OK && i < out->n; i++) {
        mt_estimate_row *row = &out->rows[kept];
        if (kept != i) *row = out->rows[i];
        size_t peak = 0, host = 0;
        uint64_t bytes = 0;
        for (;;) {
            st = confirm(s, row->batch, &row->policy, &peak, &host, &bytes);
            if (st != MT_OK || peak <= s->budget || row->batch <= s->unit || mode == 2) break;
            row->batch -= s->unit;
        }
        if (st != MT_OK) break;
        if (peak > s->budget) continue; /* does not fit at full depth: dropped */
        kept++;
        memcpy(row->dims, s->dims, sizeof row->dims);
        row->peak = peak;
        row->host = host;
        row->comm_bytes = bytes;
        s->cfg = *s->base;
        s->cfg.per_device_batch_size = row->batch;
        set_policy(&s->cfg, &row->policy);
        row->step_s = step_time(&s->cfg, s->dims, sm, (double)bytes, &row->flops, NULL);
        const double tokens = device_tokens(s->base, s->dims, row->batch);
        row->tokens_per_s = row->step_s > 0 ? tokens / row->step_s : 0;
    }
    if (st == MT_OK) out->n = kept;
    return st;
}

/* ------------------------------------------------------------ mesh search ---- */

/* One candidate layout of the mesh search. */
typedef struct layout_cand {
    int dims[4];
    int64_t unit;       /* its smallest batch */
    int64_t batch;      /* mode 1: largest batch under the lightest policy; mode 2: the fixed batch */
    double bound;       /* upper bound of its rows' modelled tokens/s per device */
    double smallest;    /* extrapolated device peak of (unit or fixed batch, lightest policy) */
    int fits;
} layout_cand;

static void search_init(search *s, const mt_train_config *cfg, const int dims[4], size_t budget) {
    memset(s, 0, sizeof *s);
    s->layout_cfg = *cfg;
    s->layout_cfg.ici_data_parallelism = dims[MT_AXIS_DATA];
    s->layout_cfg.ici_fsdp_parallelism = dims[MT_AXIS_FSDP];
    s->layout_cfg.ici_context_parallelism = dims[MT_AXIS_CONTEXT];
    s->layout_cfg.ici_tensor_parallelism = dims[MT_AXIS_TENSOR];
    s->base = &s->layout_cfg;
    memcpy(s->dims, dims, sizeof s->dims);
    s->budget = budget;
    s->unit = 1;
}

/* The smallest batch in [1, tensor] the trainer's layout check accepts for cfg on dims
 * (a divisibility rule of the batch: sequence-parallel rows), or 0 with the check's
 * error (the first refusal at batch 1) when none does. */
static int64_t layout_unit(const mt_train_config *cfg, const int dims[4], mt_status *st) {
    mt_train_config c = *cfg;
    mt_status first = MT_OK;
    char msg[512] = "";
    for (int64_t b = 1; b <= dims[MT_AXIS_TENSOR]; b++) {
        c.per_device_batch_size = b;
        const mt_status r = mt_trainer_check_layout(&c, dims);
        if (r == MT_OK) {
            *st = MT_OK;
            return b;
        }
        if (b == 1) {
            first = r;
            snprintf(msg, sizeof msg, "%s", mt_last_error());
        }
    }
    *st = mt_set_error(first, "%s", msg);
    return 0;
}

/* Enumeration of the factorisations of n: each axis fixed (its ici value), free
 * (searched over the divisors of n) or derived (what the others leave: the -1 fill
 * axis, else the last free axis). */
enum { AXIS_FIXED, AXIS_FREE, AXIS_DERIVED };
typedef struct enum_ctx {
    int role[4];
    int64_t dims[4];
    const int64_t *divs; /* the divisors of n, ascending */
    int ndivs;
    int derived;         /* the derived axis, or -1 */
    layout_cand *c;
    int nc, cap;         /* nc counts past cap when more exist */
} enum_ctx;

static void enum_free(enum_ctx *e, int a, int64_t left) {
    if (a == 4) {
        if (e->derived >= 0) e->dims[e->derived] = left;
        else if (left != 1) return;
        if (e->nc < e->cap)
            for (int k = 0; k < 4; k++) e->c[e->nc].dims[k] = (int)e->dims[k];
        e->nc++;
        return;
    }
    if (e->role[a] != AXIS_FREE) {
        enum_free(e, a + 1, left);
        return;
    }
    for (int i = 0; i < e->ndivs && e->divs[i] <= left; i++)
        if (left % e->divs[i] == 0) {
            e->dims[a] = e->divs[i];
            enum_free(e, a + 1, left / e->divs[i]);
        }
}

/* Every dims with product n, the axes with fixed[a] set held at ici[a] (-1: the
 * axis filling the rest), in lexicographic order of (data, fsdp, context, tensor),
 * into c[0..cap); returns their number (which may exceed cap), 0 when the fixed
 * axes do not divide n. */
static int factorisations(int64_t n, const int64_t ici[4], const int fixed[4], layout_cand *c, int cap) {
    int64_t divs[2048];
    int nd = 0, nhi = 0;
    int64_t hi[1024];
    for (int64_t v = 1; v * v <= n && nd < 1024; v++)
        if (n % v == 0) {
            divs[nd++] = v;
            if (v * v != n) hi[nhi++] = n / v;
        }
    for (int i = nhi - 1; i >= 0; i--) divs[nd++] = hi[i];
    enum_ctx e;
    memset(&e, 0, sizeof e);
    e.divs = divs;
    e.ndivs = nd;
    e.derived = -1;
    e.c = c;
    e.cap = cap;
    int64_t left = n;
    for (int a = 0; a < 4; a++) {
        e.role[a] = fixed[a] ? AXIS_FIXED : AXIS_FREE;
        if (fixed[a] && ici[a] == -1) {
            e.role[a] = AXIS_DERIVED;
            e.derived = a;
        } else if (fixed[a]) {
            if (ici[a] < 1 || left % ici[a] != 0) return 0;
            e.dims[a] = ici[a];
            left /= ici[a];
        }
    }
    if (e.derived < 0)
        for (int a = 3; a >= 0 && e.derived < 0; a--)
            if (e.role[a] == AXIS_FREE) {
                e.role[a] = AXIS_DERIVED;
                e.derived = a;
            }
    enum_free(&e, 0, left);
    return e.nc;
}

/* Upper bound of the modelled tokens/s per device of any row of a layout whose rows
 * have batches <= b: no recompute, no offload, and the collective bytes of batch b
 * (bytes, the trainer's formula). The modelled step is FLOPs linear in the batch
 * plus bytes c0 + c1 x batch (c0: parameter and gradient collectives, c1: tensor and
 * context activations), so tokens / step grows with the batch and b gives the bound. */
static double layout_bound(const mt_train_config *cfg, const int dims[4], int64_t b, uint64_t bytes,
                           const mt_step_model *sm) {
    const double t = model_flops(cfg, dims, b) / sm->device_flops + (double)bytes / sm->link_bw;
    return t > 0 ? device_tokens(cfg, dims, b) / t : INFINITY;
}

/* Phase 1 of the mesh search for candidate c: the trainer's layout check (its smallest
 * batch), the fit of the lightest policy at that batch (mode 1) or the fixed batch,
 * then (mode 1) the largest batch of the lightest policy and the bound. *refused (the
 * check's status, its message in mt_last_error()) and c->fits report the outcome; an
 * error of the trainer beyond the layout rules is returned (the same for every layout:
 * e.g. a dtype the backend refuses). */
static mt_status screen_layout(const mt_train_config *cfg, int mode, int64_t batch_fixed, const searched *q,
                               const mt_step_model *sm, size_t budget, layout_cand *c, mt_status *refused,
                               int *plans) {
    mt_train_config bc = *cfg;
    mt_status st = MT_OK;
    *refused = MT_OK;
    c->fits = 0;
    if (mode == 2) {
        bc.per_device_batch_size = batch_fixed;
        st = mt_trainer_check_layout(&bc, c->dims);
        c->unit = batch_fixed;
    } else {
        c->unit = layout_unit(cfg, c->dims, &st);
    }
    if (st != MT_OK) {
        *refused = st;
        return MT_OK;
    }
    search s;
    search_init(&s, cfg, c->dims, budget);
    s.unit = mode == 2 ? 1 : c->unit;
    st = fast_peak(&s, c->unit, &q->lightest, &c->smallest);
    if (st == MT_OK && c->smallest <= (double)budget) {
        c->batch = c->unit;
        if (mode == 1) st = max_batch(&s, &q->lightest, 0, &c->batch);
        mt_memory_report r;
        if (st == MT_OK) st = exact_peak(&s, c->batch, &q->lightest, &r);
        if (st == MT_OK) {
            c->bound = layout_bound(cfg, c->dims, c->batch, r.step_bytes, sm);
            c->fits = 1;
        }
    }
    *plans += s.plans;
    return st;
}

/* Phase 2: the batch / remat frontier of candidate c (as for one layout), its rows
 * ranked best first into rl. */
static mt_status search_layout(const mt_train_config *cfg, int mode, const searched *q, const mt_step_model *sm,
                               size_t budget, const layout_cand *c, row_list *rl, int *plans) {
    search s;
    search_init(&s, cfg, c->dims, budget);
    s.unit = mode == 2 ? 1 : c->unit;
    mt_status st = mode == 1 ? walk_batch_and_policy(&s, q, c->batch, rl) : walk_fixed_batch(&s, q, c->batch, rl);
    if (st == MT_OK && mode == 1) st = add_cheaper_variants(&s, q, sm, rl);
    if (st == MT_OK) st = confirm_and_model(&s, mode, sm, rl);
    if (st == MT_OK) {
        pareto_filter(rl);
        qsort(rl->rows, (size_t)rl->n, sizeof *rl->rows, cmp_rows);
    }
    *plans += s.plans;
    return st;
}

static int cmp_bound(const void *a, const void *b) {
    const layout_cand *x = a, *y = b;
    if (x->bound != y->bound) return x->bound > y->bound ? -1 : 1;
    for (int k = 0; k < 4; k++)
        if (x->dims[k] != y->dims[k]) return x->dims[k] < y->dims[k] ? -1 : 1;
    return 0;
}

/* A searched layout: its rows and best modelled tokens/s. */
typedef struct layout_rows {
    row_list rl;
    double best;
    int order; /* bound order, for ties */
} layout_rows;

static int cmp_layout_rows(const void *a, const void *b) {
    const layout_rows *x = a, *y = b;
    if (x->best != y->best) return x->best > y->best ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* Insert v into the descending list top[0..k) (a value below top[k - 1] drops out). */
static void top_insert(double *top, int k, double v) {
    if (!(v > top[k - 1])) return;
    int i = k - 1;
    for (; i > 0 && top[i - 1] < v; i--) top[i] = top[i - 1];
    top[i] = v;
}

/* The "does not fit" error: the smallest lightest plan of the candidates that pass the
 * layout rules, exact at full depth. */
static mt_status no_fit_error(const mt_train_config *cfg, int mode, int64_t batch_fixed, const searched *q,
                              size_t budget, const layout_cand *c, int nc, int npassed, int all_fixed) {
    int best = -1;
    for (int i = 0; i < nc; i++)
        if (c[i].unit > 0 && (best < 0 || c[i].smallest < c[best].smallest)) best = i;
    search s;
    search_init(&s, cfg, c[best].dims, budget);
    mt_memory_report r;
    MT_TRY(exact_peak(&s, c[best].unit, &q->lightest, &r));
    char where[256] = "";
    if (!all_fixed)
        snprintf(where, sizeof where, " on the smallest of the %d layouts the trainer accepts (data %d x fsdp %d x "
                 "context %d x tensor %d)", npassed, c[best].dims[0], c[best].dims[1], c[best].dims[2],
                 c[best].dims[3]);
    if (mode == 1)
        return mt_set_error(MT_ERR_INVALID, "does not fit: even per_device_batch_size=%lld with every searchable "
                            "tensor rematerialised needs %zu bytes (%.2f GiB) per device%s, the budget is "
                            "hbm_gib=%g (%zu bytes)", (long long)c[best].unit, r.peak,
                            (double)r.peak / 1073741824.0, where, cfg->hbm_gib, budget);
    return mt_set_error(MT_ERR_INVALID, "does not fit: per_device_batch_size=%lld with every searchable "
                        "tensor rematerialised needs %zu bytes (%.2f GiB) per device%s, the budget is "
                        "hbm_gib=%g (%zu bytes)", (long long)batch_fixed, r.peak, (double)r.peak / 1073741824.0,
                        where, cfg->hbm_gib, budget);
}

/* The candidates of the search: every factorisation of num_devices with the fixed
 * axes held, or (every axis fixed) the one mesh job_dims resolves. */
static mt_status candidates(const mt_train_config *cfg, const int axis_fixed[4], layout_cand **out, int *n) {
    *out = NULL;
    *n = 0;
    int all_fixed = 1;
    for (int a = 0; a < 4; a++) all_fixed &= axis_fixed[a] != 0;
    if (all_fixed) {
        int dims[4];
        MT_TRY(job_dims(cfg, dims));
        *out = calloc(1, sizeof **out);
        if (!*out) return mt_set_error(MT_ERR_OOM, "estimator: out of memory");
        memcpy((*out)[0].dims, dims, sizeof dims);
        *n = 1;
        return MT_OK;
    }
    int64_t ici[4];
    ici[MT_AXIS_DATA] = cfg->ici_data_parallelism;
    ici[MT_AXIS_FSDP] = cfg->ici_fsdp_parallelism;
    ici[MT_AXIS_CONTEXT] = cfg->ici_context_parallelism;
    ici[MT_AXIS_TENSOR] = cfg->ici_tensor_parallelism;
    int fills = 0;
    for (int a = 0; a < 4; a++) {
        if (!axis_fixed[a]) continue;
        if (ici[a] == -1) fills++;
        else if (ici[a] < 1)
            return mt_set_error(MT_ERR_INVALID, "%s=%lld must be >= 1 or -1 (fill)", mt_mesh_axis_key((mt_mesh_axis)a),
                                (long long)ici[a]);
    }
    if (fills > 1) return mt_set_error(MT_ERR_INVALID, "at most one ici_* axis may be -1 (fill the world)");
    const int total = factorisations(cfg->num_devices, ici, axis_fixed, NULL, 0);
    if (total == 0) {
        char fixedk[256] = "";
        size_t used = 0;
        for (int a = 0; a < 4; a++)
            if (axis_fixed[a] && ici[a] != -1) {
                int w = snprintf(fixedk + used, sizeof fixedk - used, "%s%s=%lld", used ? " x " : "",
                                 mt_mesh_axis_key((mt_mesh_axis)a), (long long)ici[a]);
                if (w > 0 && (size_t)w < sizeof fixedk - used) used += (size_t)w;
            }
        return mt_set_error(MT_ERR_INVALID, "key 'num_devices' = %lld is not a multiple of the fixed axes' product "
                            "%s", (long long)cfg->num_devices, fixedk);
    }
    *out = calloc((size_t)total, sizeof **out);
    if (!*out) return mt_set_error(MT_ERR_OOM, "estimator: out of memory");
    *n = factorisations(cfg->num_devices, ici, axis_fixed, *out, total);
    return MT_OK;
}

static mt_status check_inputs(const mt_train_config *cfg) {
    if (!(cfg->hbm_gib > 0))
        return mt_set_error(MT_ERR_INVALID, "hbm_gib=%g: the device memory budget must be > 0 GiB", cfg->hbm_gib);
    /* GiB -> bytes: beyond 2^63 bytes the size_t conversion wraps (1e19 GiB read as 0
     * bytes) and no plan's int64 byte count could reach the budget anyway. */
    if (!(cfg->hbm_gib <= MT_HBM_GIB_MAX))
        return mt_set_error(MT_ERR_INVALID, "key 'hbm_gib' = %g: out of range; the device memory budget must be "
                            "in (0, %.0f] GiB (at most 2^63 bytes, the largest 64-bit byte count)", cfg->hbm_gib,
                            MT_HBM_GIB_MAX);
    if (cfg->num_devices < 1 || cfg->num_devices > (1 << 30))
        return mt_set_error(MT_ERR_INVALID, "key 'num_devices' = %lld: must be in [1, 2^30]",
                            (long long)cfg->num_devices);
    return MT_OK;
}

/* Phase 1 over all candidates: screened, then the feasible ones moved to the front
 * sorted by bound; *nfeasible of them. */
static mt_status screen_all(const mt_train_config *cfg, int mode, int64_t batch_fixed, const searched *q,
                            const mt_step_model *sm, size_t budget, layout_cand *c, int nc, int all_fixed,
                            mt_estimate_result *out, int *nfeasible) {
    char refusal[512] = "";
    mt_status refusal_st = MT_OK;
    int npassed = 0, nf = 0;
    for (int i = 0; i < nc; i++) {
        mt_status refused = MT_OK;
        MT_TRY(screen_layout(cfg, mode, batch_fixed, q, sm, budget, &c[i], &refused, &out->plans));
        if (refused != MT_OK) {
            out->refused++;
            c[i].unit = 0;
            if (refusal_st == MT_OK) {
                refusal_st = refused;
                snprintf(refusal, sizeof refusal, "%s", mt_last_error());
            }
            continue;
        }
        npassed++;
        if (!c[i].fits) out->no_fit++;
    }
    if (npassed == 0) {
        if (all_fixed) return mt_set_error(refusal_st, "%s", refusal);
        return mt_set_error(MT_ERR_INVALID, "key 'num_devices' = %lld: none of its %d layouts passes the trainer's "
                            "layout rules (parallel/mesh.h); the first: %s", (long long)cfg->num_devices, nc, refusal);
    }
    for (int i = 0; i < nc; i++)
        if (c[i].fits) {
            layout_cand x = c[i];
            c[i] = c[nf];
            c[nf++] = x;
        }
    if (nf == 0) return no_fit_error(cfg, mode, batch_fixed, q, budget, c, nc, npassed, all_fixed);
    qsort(c, (size_t)nf, sizeof *c, cmp_bound);
    *nfeasible = nf;
    return MT_OK;
}

mt_status mt_estimate_mesh(const mt_train_config *cfg, const int axis_fixed[4], int top, int64_t batch_fixed,
                           const int fixed[MT_RT_COUNT], const mt_step_model *sm, mt_estimate_result *out) {
    memset(out, 0, sizeof *out);
    MT_TRY(check_inputs(cfg));
    const double t0 = mt_time_now();
    const size_t budget = (size_t)(cfg->hbm_gib * 1073741824.0);
    out->budget = budget;
    out->mode = batch_fixed <= 0 ? 1 : 2;
    if (top < 1) top = 1;
    int all_fixed = 1;
    for (int a = 0; a < 4; a++) {
        out->fixed_axes[a] = axis_fixed[a] != 0;
        all_fixed &= out->fixed_axes[a];
    }
    searched q;
    MT_TRY(searched_tensors(cfg, fixed, &q));
    layout_cand *c = NULL;
    int nc = 0, nf = 0, nl = 0;
    MT_TRY(candidates(cfg, out->fixed_axes, &c, &nc));
    out->candidates = nc;
    mt_status st = screen_all(cfg, out->mode, batch_fixed, &q, sm, budget, c, nc, all_fixed, out, &nf);
    layout_rows *lr = st == MT_OK ? calloc((size_t)nf, sizeof *lr) : NULL;
    mt_estimate_row *buf = st == MT_OK ? calloc((size_t)nf * ROWS_CAP, sizeof *buf) : NULL;
    double *best = st == MT_OK ? malloc((size_t)top * sizeof *best) : NULL; /* the top bests, descending */
    if (st == MT_OK && (!lr || !buf || !best)) st = mt_set_error(MT_ERR_OOM, "estimator: out of memory");
    for (int k = 0; st == MT_OK && k < top; k++) best[k] = -INFINITY;
    /* phase 2: full searches in bound order, until no bound can enter the top */
    for (int i = 0; st == MT_OK && i < nf; i++) {
        if (c[i].bound * (1.0 + 1e-6) < best[top - 1]) {
            out->bounded = nf - i;
            break;
        }
        layout_rows *l = &lr[nl];
        l->rl.rows = buf + (size_t)nl * ROWS_CAP;
        l->rl.cap = ROWS_CAP;
        l->order = i;
        st = search_layout(cfg, out->mode, &q, sm, budget, &c[i], &l->rl, &out->plans);
        if (st != MT_OK) break;
        if (l->rl.n == 0) { /* every row over the budget at full depth (confirm_and_model) */
            out->no_fit++;
            continue;
        }
        l->best = l->rl.rows[0].tokens_per_s;
        top_insert(best, top, l->best);
        nl++;
    }
    out->searched = nl;
    if (st == MT_OK && nl == 0)
        st = no_fit_error(cfg, out->mode, batch_fixed, &q, budget, c, nc, out->candidates - out->refused, all_fixed);
    if (st == MT_OK) {
        qsort(lr, (size_t)nl, sizeof *lr, cmp_layout_rows);
        out->nlayouts = nl < top ? nl : top;
        int n = 0;
        for (int k = 0; k < out->nlayouts; k++) n += lr[k].rl.n;
        out->rows = calloc((size_t)(n > 0 ? n : 1), sizeof *out->rows);
        if (!out->rows) st = mt_set_error(MT_ERR_OOM, "estimator: out of memory");
        for (int k = 0; st == MT_OK && k < out->nlayouts; k++)
            for (int j = 0; j < lr[k].rl.n; j++) {
                out->rows[out->nrows] = lr[k].rl.rows[j];
                out->rows[out->nrows++].layout = k + 1;
            }
    }
    free(best);
    free(buf);
    free(lr);
    free(c);
    out->seconds = mt_time_now() - t0;
    if (st != MT_OK) mt_estimate_result_free(out);
    return st;
}

mt_status mt_estimate(const mt_train_config *cfg, int64_t batch_fixed, const int fixed[MT_RT_COUNT],
                      const mt_step_model *sm, mt_estimate_result *out) {
    const int all[4] = {1, 1, 1, 1};
    return mt_estimate_mesh(cfg, all, 1, batch_fixed, fixed, sm, out);
}

void mt_estimate_result_free(mt_estimate_result *r) {
    if (!r) return;
    free(r->rows);
    r->rows = NULL;
    r->nrows = 0;
    r->nlayouts = 0;
}
