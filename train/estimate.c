/* train/estimate.c: per-device memory plan of a job, step-time model and the
 * batch-size / remat-policy estimator (see estimate.h). */
#include "train/estimate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/mesh.h"
#include "runtime/timer.h"
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
 * layout must pass the trainer's own checks (parallel/mesh.h mt_mesh_check_layout,
 * whose tensor rules refuse kv-head replication), with the trainer's message. */
static mt_status local_config(const mt_train_config *cfg, const int dims[4], mt_train_config *lc) {
    *lc = *cfg;
    const int64_t Tn = dims[MT_AXIS_TENSOR], Cn = dims[MT_AXIS_CONTEXT];
    mt_model_config *m = &lc->model;
    const mt_layout_sizes ls = {m->num_query_heads, m->num_kv_heads, m->mlp_dim, m->vocab_size,
                                cfg->max_target_length, cfg->per_device_batch_size};
    MT_TRY(mt_mesh_check_layout(dims, &ls));
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
                              int64_t *local) {
    mt_train_config lc = *cfg;
    lc.ici_data_parallelism = dims[MT_AXIS_DATA];
    lc.ici_fsdp_parallelism = dims[MT_AXIS_FSDP];
    lc.ici_context_parallelism = dims[MT_AXIS_CONTEXT];
    lc.ici_tensor_parallelism = dims[MT_AXIS_TENSOR];
    lc.num_devices = cfg->num_devices;
    return mt_trainer_plan(&lc, p, h, local);
}

mt_status mt_memory_plan_rank(const mt_train_config *cfg, mt_memory_report *rep, mt_plan **plan, mt_plan **host_plan) {
    if (plan) *plan = NULL;
    if (host_plan) *host_plan = NULL;
    memset(rep, 0, sizeof *rep);
    int dims[4];
    MT_TRY(job_dims(cfg, dims));
    mt_plan *p = NULL, *h = NULL;
    int64_t local = 0;
    /* The trainer's own plan for rank 0 of the whole mesh: exactly what that rank
     * allocates, every fsdp layout included; what it refuses is refused here. */
    mt_status st = trainer_plan(cfg, dims, &p, &h, &local);
    if (st == MT_OK) {
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

double mt_step_model_seconds(const mt_train_config *cfg, const mt_step_model *sm, double *flops_out,
                             double *offload_out, double *comm_out) {
    int dims[4];
    mt_train_config lc;
    if (job_dims(cfg, dims) != MT_OK || local_config(cfg, dims, &lc) != MT_OK) return INFINITY;
    mt_remat_policy pol;
    if (mt_memory_remat_policy(cfg, &pol) != MT_OK) return INFINITY;
    const mt_model_config *m = &lc.model;
    const double L = (double)m->num_decoder_layers;
    const double tokens = (double)(lc.per_device_batch_size * lc.max_target_length) *
                          (double)cfg->gradient_accumulation_steps;
    const double P = (double)mt_model_num_parameters(m);
    const double Pemb = (double)(m->vocab_size * m->emb_dim * (m->logits_via_embedding ? 1 : 2));
    const double Tfull = (double)cfg->max_target_length;
    double per_tok = 6.0 * (P - Pemb) + 12.0 * L * (double)(m->num_query_heads * m->head_dim) * Tfull +
                     6.0 * (double)(m->vocab_size * m->emb_dim); /* the logits GEMMs (fwd + 2 bwd) */
    double off_bytes = 0;
    for (int t = 1; t < MT_RT_COUNT; t++) {
        if (pol.action[t] == MT_RA_REMAT) per_tok += L * recompute_flops(m, (int64_t)Tfull, t);
        if (pol.action[t] == MT_RA_OFFLOAD)
            off_bytes += 2.0 * L * tensor_bytes(m, lc.per_device_batch_size, lc.max_target_length, t,
                                                (double)mt_dtype_size(cfg->dtype));
    }
    off_bytes *= (double)cfg->gradient_accumulation_steps;
    const double Fs = dims[MT_AXIS_FSDP], Dp = dims[MT_AXIS_DATA], Tn = dims[MT_AXIS_TENSOR];
    const double ga = (double)cfg->gradient_accumulation_steps;
    const double pbytes = P * 4.0;
    if (cfg->parameter_memory_host_offload) off_bytes += 2.0 * ga * pbytes / Fs;
    /* the moments are sharded over data with ZeRO-1, which fsdp implies (parallel/zero1.h) */
    if (cfg->optimizer_memory_host_offload)
        off_bytes += 2.0 * 2.0 * pbytes / (Fs * (cfg->shard_optimizer_over_data || Fs > 1 ? Dp : 1));
    double comm = 0;
    if (Fs > 1) { /* gather fwd + bwd and the gradient reduce-scatter over data x fsdp (every micro-batch),
                   * the optimizer sub-shards all-gathered over data (parallel/zero1.h) */
        comm += ga * 2.0 * pbytes * (Fs - 1) / Fs + ga * pbytes * (Fs * Dp - 1) / (Fs * Dp) +
                (pbytes / Fs) * (Dp - 1) / Dp;
    } else if (Dp > 1) {
        comm += 2.0 * pbytes * (Dp - 1) / Dp; /* data all-reduce (or RS + AG) */
    }
    if (Tn > 1) comm += ga * 8.0 * L * (double)(lc.per_device_batch_size * lc.max_target_length) *
                        (double)m->emb_dim * 4.0 * (Tn - 1) / Tn;   /* 2 all-reduces per layer, fwd + bwd */
    const double flops = per_tok * tokens;
    if (flops_out) *flops_out = flops;
    if (offload_out) *offload_out = off_bytes;
    if (comm_out) *comm_out = comm;
    return flops / sm->device_flops + off_bytes / sm->host_bw + comm / sm->link_bw;
}

/* ------------------------------------------------------------- estimator ---- */

typedef struct search {
    const mt_train_config *base;
    mt_train_config cfg;       /* scratch copy */
    size_t budget;
    int plans;
    /* peak(L) = a + L * b per (batch, policy), from plans of 2 and 3 layers */
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
 * additive in depth), so peak(L) = peak(3) + (L - 3) (peak(3) - peak(2)). The
 * frontier found this way is confirmed with exact plans afterwards. gemma4's layers are
 * not alike (head dims, MLP widths, KV sharing by position): its peak is always exact. */
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
        pk[i] = (double)r.peak;
    }
    *peak = pk[1] + (double)(L - 3) * (pk[1] - pk[0]);
    return MT_OK;
}

static mt_status fits(search *s, int64_t batch, const mt_remat_policy *p, int *ok) {
    double pk;
    s->cfg = *s->base;
    s->cfg.per_device_batch_size = batch;
    MT_TRY(fast_peak(s, batch, p, &pk));
    *ok = pk <= (double)s->budget;
    return MT_OK;
}

/* Largest batch in [1, hi] (hi = 0: unbounded) that fits p; 0 when none. */
static mt_status max_batch(search *s, const mt_remat_policy *p, int64_t hi, int64_t *out) {
    int ok;
    *out = 0;
    MT_TRY(fits(s, 1, p, &ok));
    if (!ok) return MT_OK;
    int64_t lo = 1, top;
    if (hi > 0) {
        top = hi;
        MT_TRY(fits(s, top, p, &ok));
        if (ok) return *out = top, MT_OK;
    } else {
        top = 2;
        for (;;) {
            MT_TRY(fits(s, top, p, &ok));
            if (!ok) break;
            lo = top;
            if (top >= ((int64_t)1 << 24)) return *out = top, MT_OK;
            top *= 2;
        }
    }
    /* lo fits, top does not */
    while (top - lo > 1) {
        int64_t mid = lo + (top - lo) / 2;
        MT_TRY(fits(s, mid, p, &ok));
        if (ok) lo = mid;
        else top = mid;
    }
    *out = lo;
    return MT_OK;
}

/* Exact confirmation, cached: the device plan depends only on which tensors are kept
 * (remat and offload both use the layer scratch), so one plan per (batch, kept set),
 * made with every other tensor offloaded, gives the device peak of all its remat /
 * offload mixes and the host bytes of each offloaded name. */
typedef struct confirm_entry {
    int64_t batch;
    unsigned kept;                  /* bit t: tensor t on the device */
    size_t peak, host_fixed;        /* device peak; host bytes that are not activations */
    size_t host_name[MT_RT_COUNT];  /* host bytes of each offloaded name */
} confirm_entry;
typedef struct confirm_cache {
    confirm_entry e[4 * MT_RT_COUNT + 8];
    int n;
} confirm_cache;

static mt_status confirm(search *s, confirm_cache *c, int64_t batch, const mt_remat_policy *p, size_t *peak,
                         size_t *host) {
    unsigned kept = 0;
    for (int t = 0; t < MT_RT_COUNT; t++)
        if (p->action[t] == MT_RA_DEVICE) kept |= 1u << t;
    confirm_entry *e = NULL;
    for (int i = 0; i < c->n; i++)
        if (c->e[i].batch == batch && c->e[i].kept == kept) e = &c->e[i];
    if (!e) {
        mt_remat_policy q = *p;
        for (int t = 1; t < MT_RT_COUNT; t++)
            if (q.action[t] != MT_RA_DEVICE) q.action[t] = MT_RA_OFFLOAD;
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
        e->peak = r.peak;
        e->host_fixed = r.host_total - r.host_activations;
        for (int i = 0; i < mt_plan_count(h); i++) {
            const mt_plan_entry *he = mt_plan_entry_get(h, i);
            const int t = saved_tensor(he);
            if (he->category == MT_MEM_ACTIVATIONS && t >= 0) e->host_name[t] += he->bytes;
        }
        mt_plan_free(h);
    }
    *peak = e->peak;
    *host = e->host_fixed;
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

static int has_row(const mt_estimate_result *r, int64_t batch, const mt_remat_policy *p) {
    for (int i = 0; i < r->nrows; i++)
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
static void pareto_filter(mt_estimate_result *r) {
    int kept = 0;
    for (int i = 0; i < r->nrows; i++) {
        int out = 0;
        for (int j = 0; j < r->nrows && !out; j++) {
            if (j == i) continue;
            out = dominates(&r->rows[j], &r->rows[i]) ||
                  (j < i && r->rows[j].batch == r->rows[i].batch && r->rows[j].step_s == r->rows[i].step_s);
        }
        if (!out) r->rows[kept++] = r->rows[i];
    }
    r->nrows = kept;
}

/* For each searched tensor order[0..n), the cheaper of remat and offload under the
 * step model (cheap[t]); the model is additive over tensors and linear in the batch,
 * so one comparison at batch 1 from the lightest policy decides for every row. */
static mt_status cheaper_non_kept(search *s, const mt_step_model *sm, const mt_remat_policy *lightest,
                                  const int *order, int n, int cheap[MT_RT_COUNT]) {
    for (int t = 0; t < MT_RT_COUNT; t++) cheap[t] = MT_RA_REMAT;
    s->cfg = *s->base;
    s->cfg.per_device_batch_size = 1;
    set_policy(&s->cfg, lightest);
    const double base = mt_step_model_seconds(&s->cfg, sm, NULL, NULL, NULL);
    if (!isfinite(base)) return mt_set_error(MT_ERR_INVALID, "estimator: the step model rejects the config");
    for (int k = 0; k < n; k++) {
        mt_remat_policy q = *lightest;
        q.action[order[k]] = MT_RA_OFFLOAD;
        set_policy(&s->cfg, &q);
        if (mt_step_model_seconds(&s->cfg, sm, NULL, NULL, NULL) < base) cheap[order[k]] = MT_RA_OFFLOAD;
    }
    return MT_OK;
}

static mt_status add_row(mt_estimate_result *r, int cap, int64_t batch, const mt_remat_policy *p) {
    if (r->nrows >= cap) return mt_set_error(MT_ERR_OOM, "estimator: too many rows");
    mt_estimate_row *row = &r->rows[r->nrows++];
    memset(row, 0, sizeof *row);
    row->batch = batch;
    row->policy = *p;
    return MT_OK;
}

/* Room for the rows: the walk (at most 2n + 1 rows) and a variant of each. */
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

/* Mode 1's walk: the largest batch under the lightest policy, then remat -> offload
 * and offload -> device one tensor at a time, smallest first, each step the largest
 * batch not above the previous one; every (batch, policy) step is a row. */
static mt_status walk_batch_and_policy(search *s, const searched *q, mt_estimate_result *out) {
    int64_t b = 0;
    mt_status st = max_batch(s, &q->lightest, 0, &b);
    if (st == MT_OK && b == 0) {
        mt_memory_report r;
        st = exact_peak(s, 1, &q->lightest, &r);
        if (st == MT_OK)
            st = mt_set_error(MT_ERR_INVALID, "does not fit: even per_device_batch_size=1 with every searchable "
                              "tensor rematerialised needs %zu bytes (%.2f GiB) per device, the budget is "
                              "hbm_gib=%g (%zu bytes)", r.peak, (double)r.peak / 1073741824.0, s->base->hbm_gib,
                              s->budget);
    }
    mt_remat_policy p = q->lightest;
    if (st == MT_OK) st = add_row(out, ROWS_CAP, b, &p);
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
            st = add_row(out, ROWS_CAP, nb, &p); /* every (batch, policy) step is a candidate */
            b = nb;
        }
    }
    return st;
}

/* Mode 2: an error if the lightest policy does not fit batch, else from all-device
 * step back (device -> offload, largest first, then offload -> remat) until it fits;
 * that policy is the one row. */
static mt_status walk_fixed_batch(search *s, const searched *q, int64_t batch, mt_estimate_result *out) {
    int ok = 0;
    mt_status st = fits(s, batch, &q->lightest, &ok);
    if (st == MT_OK && !ok) {
        mt_memory_report r;
        st = exact_peak(s, batch, &q->lightest, &r);
        if (st == MT_OK)
            st = mt_set_error(MT_ERR_INVALID, "does not fit: per_device_batch_size=%lld with every searchable "
                              "tensor rematerialised needs %zu bytes (%.2f GiB) per device, the budget is "
                              "hbm_gib=%g (%zu bytes)", (long long)batch, r.peak,
                              (double)r.peak / 1073741824.0, s->base->hbm_gib, s->budget);
    }
    mt_remat_policy p = q->heaviest;
    /* device -> offload largest first, then offload -> remat largest first */
    for (int phase = 0; st == MT_OK && phase < 3; phase++) {
        if (phase == 2) break;
        if (st == MT_OK) st = fits(s, batch, &p, &ok);
        if (st == MT_OK && ok) break;
        for (int i = 0; st == MT_OK && i < q->n; i++) {
            p.action[q->order[i]] = phase == 0 ? MT_RA_OFFLOAD : MT_RA_REMAT;
            st = fits(s, batch, &p, &ok);
            if (ok) break;
        }
        if (ok) break;
    }
    if (st == MT_OK) st = add_row(out, ROWS_CAP, batch, &p);
    return st;
}

/* Mode 1: each (batch, policy) of the walk also with every searched tensor that is
 * not kept on the device given the cheaper of remat and offload under the step
 * model (the walk's order may leave a tensor offloaded where recomputing it is
 * faster): the same kept set, so the same device plan and the same fit. */
static mt_status add_cheaper_variants(search *s, const searched *q, const mt_step_model *sm,
                                      mt_estimate_result *out) {
    int cheap[MT_RT_COUNT];
    mt_status st = cheaper_non_kept(s, sm, &q->lightest, q->order, q->n, cheap);
    const int walked = out->nrows;
    for (int i = 0; st == MT_OK && i < walked; i++) {
        mt_remat_policy v = out->rows[i].policy;
        for (int k = 0; k < q->n; k++)
            if (v.action[q->order[k]] != MT_RA_DEVICE) v.action[q->order[k]] = (mt_remat_action)cheap[q->order[k]];
        if (!has_row(out, out->rows[i].batch, &v)) st = add_row(out, ROWS_CAP, out->rows[i].batch, &v);
    }
    return st;
}

/* Confirm each row with the exact full-depth plan (stepping the batch down in the
 * unlikely case extrapolation was optimistic) and model its step time and tokens/s. */
static mt_status confirm_and_model(search *s, const mt_step_model *sm, mt_estimate_result *out) {
    const mt_train_config *cfg = s->base;
    confirm_cache cache;
    memset(&cache, 0, sizeof cache);
    mt_status st = MT_OK;
    for (int i = 0; st == MT_OK && i < out->nrows; i++) {
        mt_estimate_row *row = &out->rows[i];
        size_t peak = 0, host = 0;
        for (;;) {
            st = confirm(s, &cache, row->batch, &row->policy, &peak, &host);
            if (st != MT_OK || peak <= s->budget || row->batch <= 1 || out->mode == 2) break;
            row->batch--;
        }
        if (st != MT_OK) break;
        row->peak = peak;
        row->host = host;
        s->cfg = *s->base;
        s->cfg.per_device_batch_size = row->batch;
        set_policy(&s->cfg, &row->policy);
        row->step_s = mt_step_model_seconds(&s->cfg, sm, NULL, NULL, NULL);
        int dims[4];
        st = job_dims(cfg, dims);
        if (st != MT_OK) break;
        /* a tensor (or context) group shares its sequences: tokens per device */
        const double tokens = (double)(row->batch * cfg->max_target_length * cfg->gradient_accumulation_steps) /
                              (double)(dims[MT_AXIS_TENSOR] * dims[MT_AXIS_CONTEXT]);
        row->tokens_per_s = row->step_s > 0 ? tokens / row->step_s : 0;
    }
    return st;
}

mt_status mt_estimate(const mt_train_config *cfg, int64_t batch_fixed, const int fixed[MT_RT_COUNT],
                      const mt_step_model *sm, mt_estimate_result *out) {
    memset(out, 0, sizeof *out);
    if (!(cfg->hbm_gib > 0))
        return mt_set_error(MT_ERR_INVALID, "hbm_gib=%g: the device memory budget must be > 0 GiB", cfg->hbm_gib);
    /* GiB -> bytes: beyond 2^63 bytes the size_t conversion wraps (1e19 GiB read as 0
     * bytes) and no plan's int64 byte count could reach the budget anyway. */
    if (!(cfg->hbm_gib <= MT_HBM_GIB_MAX))
        return mt_set_error(MT_ERR_INVALID, "key 'hbm_gib' = %g: out of range; the device memory budget must be "
                            "in (0, %.0f] GiB (at most 2^63 bytes, the largest 64-bit byte count)", cfg->hbm_gib,
                            MT_HBM_GIB_MAX);
    const double t0 = mt_time_now();
    search s;
    memset(&s, 0, sizeof s);
    s.base = cfg;
    s.budget = (size_t)(cfg->hbm_gib * 1073741824.0);
    out->budget = s.budget;
    searched q;
    MT_TRY(searched_tensors(cfg, fixed, &q));
    out->rows = calloc((size_t)ROWS_CAP, sizeof *out->rows);
    if (!out->rows) return mt_set_error(MT_ERR_OOM, "estimator: out of memory");
    out->mode = batch_fixed <= 0 ? 1 : 2;
    mt_status st = out->mode == 1 ? walk_batch_and_policy(&s, &q, out) : walk_fixed_batch(&s, &q, batch_fixed, out);
    if (st == MT_OK && out->mode == 1) st = add_cheaper_variants(&s, &q, sm, out);
    /* then keep the Pareto list and rank */
    if (st == MT_OK) st = confirm_and_model(&s, sm, out);
    if (st == MT_OK) pareto_filter(out);
    if (st == MT_OK) qsort(out->rows, (size_t)out->nrows, sizeof *out->rows, cmp_rows);
    out->plans = s.plans;
    out->seconds = mt_time_now() - t0;
    if (st != MT_OK) mt_estimate_result_free(out);
    return st;
}

void mt_estimate_result_free(mt_estimate_result *r) {
    if (!r) return;
    free(r->rows);
    r->rows = NULL;
    r->nrows = 0;
}
