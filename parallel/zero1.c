/* parallel/zero1.c: data-parallel gradient reduction, ZeRO-1 shards and grad_dtype
 * accumulators (zero1.h). */
#include "parallel/zero1.h"

#include <stdlib.h>
#include <string.h>

static uint64_t data_bytes(const mt_grad_sync *g, int64_t K);

/* The reduction runs after every micro-batch: every, or (fsdp) windows reduce-scattered
 * as they come with more than one micro-batch. */
static int per_microbatch(const mt_grad_sync *g) {
    return !g->direct && (g->sched == MT_GA_REDUCE_EVERY || g->path == MT_GRAD_WINDOW_RS);
}

/* Bytes of all-reducing the gradient chunk by chunk (chunk floats) on T ranks: the
 * per-call integer division of parallel/comm.h, summed. */
static uint64_t chunked_ar_bytes(const mt_grad_sync *g, uint64_t T) {
    uint64_t b = 0;
    for (int64_t a = 0; a < g->numel; a += g->chunk) {
        const uint64_t S = 4 * (uint64_t)(g->numel - a < g->chunk ? g->numel - a : g->chunk);
        b += 2 * (T - 1) * S / T;
    }
    return b;
}

mt_status mt_grad_sync_init(mt_grad_sync *g, mt_comm *comm, int n, int rank, int64_t numel, int zero1,
                            mt_dtype grad_dtype, mt_ga_reduce sched, int64_t accum_steps) {
    memset(g, 0, sizeof *g);
    g->id_acc = g->id_shard_acc = g->id_shard = g->id_chunk = -1;
    if (n < 1 || rank < 0 || rank >= n)
        return mt_set_error(MT_ERR_INVALID, "gradient sync: rank %d outside a group of %d", rank, n);
    if (grad_dtype != MT_F32 && grad_dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "grad_dtype=%s: float32 or bfloat16 only", mt_dtype_name(grad_dtype));
    if (sched == MT_GA_REDUCE_EVERY && !zero1)
        return mt_set_error(MT_ERR_INVALID, "gradient_accumulation_reduce=every reduce-scatters into the ZeRO-1 "
                            "shard: it needs shard_optimizer_over_data=true");
    if (numel < 1) return mt_set_error(MT_ERR_INVALID, "gradient sync: numel=%lld", (long long)numel);
    g->comm = comm;
    g->n = n;
    g->rank = rank;
    g->zero1 = zero1;
    g->grad_dtype = grad_dtype;
    g->sched = sched;
    g->direct = accum_steps <= 1;
    g->numel = numel;
    g->lo = 0;
    g->hi = numel;
    g->per = numel;
    g->flo = 0;
    g->fhi = numel;
    g->fper = numel;
    g->fsdp = 1;
    g->rep = n;
    g->rep_rank = rank;
    g->be = mt_cpu_backend();
    if (zero1) {
        g->counts = malloc(sizeof(int64_t) * (size_t)n);
        if (!g->counts) return mt_set_error(MT_ERR_OOM, "gradient sync: out of memory");
        const int64_t per = (numel + n - 1) / n;
        g->per = per;
        g->wcounts = malloc(sizeof(int64_t) * (size_t)n);
        if (!g->wcounts) return mt_set_error(MT_ERR_OOM, "gradient sync: out of memory");
        for (int i = 0; i < n; i++) {
            int64_t a = (int64_t)i * per, b = a + per;
            if (a > numel) a = numel;
            if (b > numel) b = numel;
            g->counts[i] = b - a;
            if (i == rank) {
                g->lo = a;
                g->hi = b;
            }
        }
    }
    return MT_OK;
}

void mt_grad_sync_free(mt_grad_sync *g) {
    if (!g) return;
    free(g->counts);
    free(g->wcounts);
    free(g->rep_off);
    free(g->rep_n);
    free(g->rcounts);
    g->counts = g->wcounts = g->rep_off = g->rep_n = g->rcounts = NULL;
}

/* Optimizer shard [*lo, *hi) of group rank r: sub-shard r % rep of fsdp shard r / rep
 * (without fsdp rep = n, fper = numel: the plain ZeRO-1 split). */
static void shard_of(const mt_grad_sync *g, int r, int64_t *lo, int64_t *hi) {
    int64_t fa = (int64_t)(r / g->rep) * g->fper, fb = fa + g->fper;
    if (fa > g->numel) fa = g->numel;
    if (fb > g->numel) fb = g->numel;
    int64_t a = fa + (int64_t)(r % g->rep) * g->per, b = a + g->per;
    if (a > fb) a = fb;
    if (b > fb) b = fb;
    *lo = a;
    *hi = b;
}

mt_status mt_grad_sync_set_fsdp(mt_grad_sync *g, mt_comm *replica, int fsdp, int fsdp_rank) {
    if (!g->zero1 || fsdp < 1 || g->n % fsdp != 0 || fsdp_rank < 0 || fsdp_rank >= fsdp ||
        g->rank / (g->n / fsdp) != fsdp_rank)
        return mt_set_error(MT_ERR_INVALID, "gradient sync: fsdp %d (rank %d) needs ZeRO-1 on a group of a multiple "
                            "of %d ranks ordered fsdp-major (group rank %d of %d)", fsdp, fsdp_rank, fsdp, g->rank,
                            g->n);
    g->fsdp = fsdp;
    g->rep = g->n / fsdp;
    g->rep_rank = g->rank % g->rep;
    g->rep_comm = replica;
    g->fper = (g->numel + fsdp - 1) / fsdp;
    g->per = (g->fper + g->rep - 1) / g->rep;
    g->params_sharded = 1;
    free(g->rcounts);
    g->rcounts = malloc(sizeof(int64_t) * (size_t)g->rep);
    if (!g->rcounts) return mt_set_error(MT_ERR_OOM, "gradient sync: out of memory");
    for (int r = 0; r < g->n; r++) {
        int64_t a, b;
        shard_of(g, r, &a, &b);
        g->counts[r] = b - a;
        if (r / g->rep == fsdp_rank) g->rcounts[r % g->rep] = b - a;
        if (r == g->rank) {
            g->lo = a;
            g->hi = b;
        }
    }
    g->flo = (int64_t)fsdp_rank * g->fper;
    g->fhi = g->flo + g->fper;
    if (g->flo > g->numel) g->flo = g->numel;
    if (g->fhi > g->numel) g->fhi = g->numel;
    return MT_OK;
}

mt_status mt_grad_sync_set_tensor(mt_grad_sync *g, mt_comm *comm, int size, int rank, int n, const int64_t *off,
                                  const int64_t *num) {
    g->tp_comm = comm;
    g->tp = size;
    g->tp_rank = rank;
    g->nrep = n;
    g->rep_off = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    g->rep_n = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (!g->rep_off || !g->rep_n) return mt_set_error(MT_ERR_OOM, "gradient sync: out of memory");
    for (int i = 0; i < n; i++) {
        g->rep_off[i] = off[i];
        g->rep_n[i] = num[i];
    }
    return MT_OK;
}

/* Sum x = the gradient of the flat range [a, a + n) over the tensor group, the
 * replicated ranges counted once (ranks other than 0 zero their part of them). */
static mt_status tensor_reduce_range(mt_grad_sync *g, float *x, int64_t a, int64_t n) {
    if (g->tp <= 1) return MT_OK;
    if (g->tp_rank != 0)
        for (int i = 0; i < g->nrep; i++) {
            const int64_t lo = g->rep_off[i] > a ? g->rep_off[i] : a;
            const int64_t hi = g->rep_off[i] + g->rep_n[i] < a + n ? g->rep_off[i] + g->rep_n[i] : a + n;
            if (hi > lo) MT_TRY(g->be->ops->zero(g->be, x + (lo - a), (size_t)(hi - lo) * sizeof(float)));
        }
    return mt_comm_all_reduce(g->tp_comm, x, n, MT_COMM_F32);
}

/* Sum the full gradient over the tensor group, replicated ranges counted once. */
static mt_status tensor_reduce(mt_grad_sync *g, float *grads) { return tensor_reduce_range(g, grads, 0, g->numel); }

/* Windows reduce-scattered in place (MT_GRAD_WINDOW_RS with K > 1): the sum lands in the
 * window and is added into the accumulator from there; no fp32 shard in the backward. */
static int windows_in_place(const mt_grad_sync *g) { return g->path == MT_GRAD_WINDOW_RS && !g->direct; }

/* ZeRO-1: reduce-scatter x = the gradient of [a, a + n) over the group, each rank
 * receiving its shard's part of the range (uneven counts, empty ones included) into
 * the fp32 shard at the same place, or in place (windows_in_place, or `add`: a second
 * share of the range, which must not overwrite the first: into x at the part's own
 * place). *own0 / *own: that part, [own0, own0 + own); *sum: where it lands. req
 * non-NULL: started only (mt_comm_reduce_scatter_start; the counts are copied). */
static mt_status reduce_scatter_range(mt_grad_sync *g, float *x, int64_t a, int64_t n, int add, int64_t *own0,
                                      int64_t *own, const float **sum, mt_comm_request **req) {
    for (int r = 0; r < g->n; r++) {
        int64_t lo, hi;
        shard_of(g, r, &lo, &hi);
        if (lo < a) lo = a;
        if (hi > a + n) hi = a + n;
        g->wcounts[r] = hi > lo ? hi - lo : 0;
    }
    *own0 = g->lo > a ? g->lo : a;
    *own = g->wcounts[g->rank];
    float *dst = windows_in_place(g) || add ? x + (*own0 - a) : g->shard + (*own > 0 ? *own0 - g->lo : 0);
    *sum = dst;
    if (req) return mt_comm_reduce_scatter_start(g->comm, x, dst, g->wcounts, MT_COMM_F32, req);
    return mt_comm_reduce_scatter(g->comm, x, dst, g->wcounts, MT_COMM_F32);
}

int64_t mt_grad_sync_opt_numel(const mt_grad_sync *g) { return g->hi - g->lo; }

mt_status mt_grad_sync_add_to_plan(mt_grad_sync *g, mt_plan *plan, int last) {
    const size_t es = mt_dtype_size(g->grad_dtype), S = (size_t)(g->hi - g->lo);
    if (g->zero1 && !windows_in_place(g))
        MT_TRY(mt_plan_add(plan, "grad_shard", MT_MEM_COMM, S * sizeof(float), 0, last, &g->id_shard));
    else if (g->zero1 && g->grad_dtype != MT_F32) /* the widened accumulator, for the optimizer */
        MT_TRY(mt_plan_add(plan, "grad_shard", MT_MEM_COMM, S * sizeof(float), last, last, &g->id_shard));
    if (g->direct) return MT_OK;
    if (g->path == MT_GRAD_WINDOW_ACC)
        MT_TRY(mt_plan_add(plan, "grads.window.reduce", MT_MEM_GRADS, (size_t)g->chunk * sizeof(float), last, last,
                           &g->id_chunk));
    if (g->sched == MT_GA_REDUCE_ONCE && g->grad_dtype != MT_F32 && g->path != MT_GRAD_WINDOW_RS)
        MT_TRY(mt_plan_add(plan, "grad_accumulator", MT_MEM_GRADS, (size_t)g->numel * es, 0, last, &g->id_acc));
    if (g->sched == MT_GA_REDUCE_EVERY || g->path == MT_GRAD_WINDOW_RS)
        MT_TRY(mt_plan_add(plan, "grad_shard_accumulator", MT_MEM_GRADS, S * es, 0, last, &g->id_shard_acc));
    return MT_OK;
}

mt_status mt_grad_sync_bind(mt_grad_sync *g, const mt_arena *arena, const mt_plan *plan) {
    if (g->id_acc >= 0) g->acc = mt_arena_ptr(arena, plan, g->id_acc);
    if (g->id_shard_acc >= 0) g->shard_acc = mt_arena_ptr(arena, plan, g->id_shard_acc);
    if (g->id_shard >= 0) g->shard = mt_arena_ptr(arena, plan, g->id_shard);
    if (g->id_chunk >= 0) g->chunk_buf = mt_arena_ptr(arena, plan, g->id_chunk);
    if ((g->id_acc >= 0 && !g->acc) || (g->id_shard_acc >= 0 && !g->shard_acc) || (g->id_shard >= 0 && !g->shard) ||
        (g->id_chunk >= 0 && !g->chunk_buf))
        return mt_set_error(MT_ERR_INVALID, "gradient sync: plan entries missing from the arena");
    return MT_OK;
}

/* acc[i] = round(acc[i] + x[i]) in dt (first: acc = round(x)); the add in fp32, through
 * the backend's grad_accumulate op (kernels/ops.h): the buffers may be device memory. */
static mt_status accumulate(const mt_grad_sync *g, void *acc, mt_dtype dt, const float *x, int64_t n, int first) {
    return g->be->ops->grad_accumulate(g->be, acc, dt, x, n, first);
}

/* dst[n] (fp32) = acc[n] of dt, through the backend's to_f32 op. */
static mt_status to_f32(const mt_grad_sync *g, float *dst, const void *acc, mt_dtype dt, int64_t n) {
    return g->be->ops->to_f32(g->be, dst, acc, dt, n);
}

void mt_grad_sync_set_backend(mt_grad_sync *g, mt_backend *be) { g->be = be; }

mt_status mt_grad_sync_set_path(mt_grad_sync *g, int fsdp, int64_t chunk) {
    if (chunk < 1) return mt_set_error(MT_ERR_INVALID, "gradient sync: chunk of %lld floats", (long long)chunk);
    g->chunk = chunk < g->numel ? chunk : g->numel;
    g->path = MT_GRAD_FULL;
    if (fsdp || (g->zero1 && (g->sched == MT_GA_REDUCE_EVERY || g->direct)))
        g->path = MT_GRAD_WINDOW_RS;
    else if (!g->direct && g->sched == MT_GA_REDUCE_ONCE && g->grad_dtype != MT_F32)
        g->path = MT_GRAD_WINDOW_ACC;
    return MT_OK;
}

void mt_grad_sync_set_microbatch(mt_grad_sync *g, int64_t mb) { g->mb = mb; }

/* This rank's reduced part [own0, own0 + own) of a window, at sum: with K > 1 (in the
 * window) added into the shard accumulator, the first share of micro-batch 0 stored;
 * with K = 1 already in the fp32 shard, unless it is a second share (add, in the
 * window), added to the first there in fp32. */
static mt_status add_own(mt_grad_sync *g, int64_t own0, int64_t own, const float *sum, int add) {
    if (own <= 0) return MT_OK;
    if (g->direct) return add ? accumulate(g, g->shard + (own0 - g->lo), MT_F32, sum, own, 0) : MT_OK;
    const size_t es = mt_dtype_size(g->grad_dtype);
    return accumulate(g, (char *)g->shard_acc + (size_t)(own0 - g->lo) * es, g->grad_dtype, sum, own,
                      g->mb == 0 && !add);
}

mt_status mt_grad_sync_window(void *ctx, int64_t a, int64_t n, float *w, int add) {
    mt_grad_sync *g = ctx;
    const size_t es = mt_dtype_size(g->grad_dtype);
    if (a < 0 || n < 0 || a + n > g->numel)
        return mt_set_error(MT_ERR_INVALID, "gradient sync: window [%lld, +%lld) outside the %lld gradients",
                            (long long)a, (long long)n, (long long)g->numel);
    if (g->path == MT_GRAD_WINDOW_ACC) { /* the tensor / data reductions come once, at finish */
        return accumulate(g, (char *)g->acc + (size_t)a * es, g->grad_dtype, w, n, g->mb == 0 && !add);
    }
    if (g->path != MT_GRAD_WINDOW_RS) return mt_set_error(MT_ERR_INVALID, "gradient sync: no window path chosen");
    MT_TRY(tensor_reduce_range(g, w, a, n));
    int64_t own0, own;
    if (g->overlap) { /* start it; mt_grad_sync_window_wait completes it */
        struct mt_grad_sync_pending *slot = NULL;
        for (int i = 0; i < MT_GRAD_SYNC_PENDING && !slot; i++)
            if (!g->pending[i].w) slot = &g->pending[i];
        if (!slot)
            return mt_set_error(MT_ERR_INVALID, "gradient sync: more than %d windows in flight (the model waits "
                                "before it reuses a window)", MT_GRAD_SYNC_PENDING);
        mt_comm_request *req = NULL;
        const float *sum = NULL;
        MT_TRY(reduce_scatter_range(g, w, a, n, add, &own0, &own, &sum, &req));
        *slot = (struct mt_grad_sync_pending){w, req, own0, own, sum, add};
        return MT_OK;
    }
    const float *sum = NULL;
    MT_TRY(reduce_scatter_range(g, w, a, n, add, &own0, &own, &sum, NULL));
    return add_own(g, own0, own, sum, add);
}

int mt_grad_sync_exact_shares(const mt_grad_sync *g) { return g->grad_dtype == MT_F32 || g->direct; }

int mt_grad_sync_overlaps(const mt_grad_sync *g) { return g->path == MT_GRAD_WINDOW_RS && g->n > 1; }

mt_status mt_grad_sync_set_overlap(mt_grad_sync *g, int on) {
    if (on && !mt_grad_sync_overlaps(g))
        return mt_set_error(MT_ERR_INVALID, "gradient sync: no per-window reduce-scatter over more than one rank "
                            "to overlap");
    g->overlap = on;
    return MT_OK;
}

mt_status mt_grad_sync_window_wait(void *ctx, const float *w) {
    mt_grad_sync *g = ctx;
    mt_status first = MT_OK;
    for (int i = 0; i < MT_GRAD_SYNC_PENDING; i++) {
        struct mt_grad_sync_pending *p = &g->pending[i];
        if (!p->w || (w && p->w != w)) continue;
        mt_status st = mt_comm_wait(p->req);
        if (st == MT_OK) st = add_own(g, p->own0, p->own, p->sum, p->add);
        *p = (struct mt_grad_sync_pending){0};
        if (first == MT_OK) first = st;
    }
    return first;
}

/* Window paths, after the last micro-batch (see the header comment). */
static mt_status finish_windows(mt_grad_sync *g, float **out) {
    const int64_t S = g->hi - g->lo;
    if (g->path == MT_GRAD_WINDOW_RS) { /* every window was reduce-scattered already */
        if (!g->direct && g->grad_dtype == MT_F32) { /* the fp32 accumulator is the gradient */
            *out = g->shard_acc;
            return MT_OK;
        }
        if (!g->direct) MT_TRY(to_f32(g, g->shard, g->shard_acc, g->grad_dtype, S));
        *out = g->shard;
        return MT_OK;
    }
    const size_t es = mt_dtype_size(g->grad_dtype);
    const int store = !g->zero1 && (g->n > 1 || g->tp > 1); /* a reduced sum goes back into the accumulator */
    for (int64_t a = 0; a < g->numel; a += g->chunk) {
        const int64_t n = g->numel - a < g->chunk ? g->numel - a : g->chunk;
        void *acc = (char *)g->acc + (size_t)a * es;
        MT_TRY(to_f32(g, g->chunk_buf, acc, g->grad_dtype, n));
        MT_TRY(tensor_reduce_range(g, g->chunk_buf, a, n));
        if (g->zero1) {
            int64_t own0, own;
            const float *sum = NULL;
            MT_TRY(reduce_scatter_range(g, g->chunk_buf, a, n, 0, &own0, &own, &sum, NULL));
        } else if (g->comm && g->n > 1) {
            MT_TRY(mt_comm_all_reduce(g->comm, g->chunk_buf, n, MT_COMM_F32));
        }
        if (store) MT_TRY(accumulate(g, acc, g->grad_dtype, g->chunk_buf, n, 1));
    }
    *out = g->zero1 ? g->shard : NULL;
    return MT_OK;
}

mt_status mt_grad_sync_read(mt_grad_sync *g, int64_t a, int64_t n, float **out) {
    *out = NULL;
    if (g->path != MT_GRAD_WINDOW_ACC || g->zero1 || !g->chunk_buf)
        return mt_set_error(MT_ERR_INVALID, "mt_grad_sync_read: the gradient is not kept in chunks");
    if (a < 0 || n < 1 || n > g->chunk || a + n > g->numel)
        return mt_set_error(MT_ERR_INVALID, "mt_grad_sync_read: [%lld, +%lld) is not inside the gradient in chunks "
                            "of %lld", (long long)a, (long long)n, (long long)g->chunk);
    MT_TRY(to_f32(g, g->chunk_buf, (const char *)g->acc + (size_t)a * mt_dtype_size(g->grad_dtype), g->grad_dtype, n));
    *out = g->chunk_buf;
    return MT_OK;
}

mt_status mt_grad_sync_microbatch(mt_grad_sync *g, float *grads, int64_t mb, int *zero_grads) {
    *zero_grads = 0;
    if (g->direct || g->path != MT_GRAD_FULL) return MT_OK;
    if (g->sched == MT_GA_REDUCE_EVERY) {
        MT_TRY(tensor_reduce(g, grads));
        MT_TRY(mt_comm_reduce_scatter(g->comm, grads, g->shard, g->counts, MT_COMM_F32));
        MT_TRY(accumulate(g, g->shard_acc, g->grad_dtype, g->shard, g->hi - g->lo, mb == 0));
        *zero_grads = 1;
    } else if (g->grad_dtype != MT_F32) {
        MT_TRY(accumulate(g, g->acc, g->grad_dtype, grads, g->numel, mb == 0));
        *zero_grads = 1;
    }
    return MT_OK;
}

mt_status mt_grad_sync_finish(mt_grad_sync *g, float *grads, float **out) {
    const int64_t S = g->hi - g->lo;
    if (g->path != MT_GRAD_FULL) return finish_windows(g, out);
    if (g->sched == MT_GA_REDUCE_EVERY && !g->direct) {
        MT_TRY(to_f32(g, g->shard, g->shard_acc, g->grad_dtype, S));
        *out = g->shard;
        return MT_OK;
    }
    if (g->grad_dtype != MT_F32 && !g->direct) MT_TRY(to_f32(g, grads, g->acc, g->grad_dtype, g->numel));
    MT_TRY(tensor_reduce(g, grads));
    if (g->zero1) {
        MT_TRY(mt_comm_reduce_scatter(g->comm, grads, g->shard, g->counts, MT_COMM_F32));
        *out = g->shard;
    } else {
        if (g->comm) MT_TRY(mt_comm_all_reduce(g->comm, grads, g->numel, MT_COMM_F32));
        *out = grads;
    }
    return MT_OK;
}

mt_status mt_grad_sync_gather(mt_grad_sync *g, const float *shard, float *full) {
    if (!g->zero1) {
        return shard != full ? g->be->ops->copy(g->be, full, shard, (size_t)g->numel * sizeof(float)) : MT_OK;
    }
    return mt_comm_all_gather(g->comm, shard, full, g->counts, MT_COMM_F32);
}

mt_status mt_grad_sync_gather_params(mt_grad_sync *g, float *params) {
    if (g->params_sharded) /* the sub-shards over the replica group, in place into the fsdp shard */
        return g->rep > 1 ? mt_comm_all_gather(g->rep_comm, params + (g->lo - g->flo), params, g->rcounts, MT_COMM_F32)
                          : MT_OK;
    if (!g->zero1) return MT_OK;
    return mt_comm_all_gather(g->comm, params + g->lo, params, g->counts, MT_COMM_F32);
}

uint64_t mt_grad_sync_step_bytes(const mt_grad_sync *g, int64_t K) {
    const uint64_t G = 4 * (uint64_t)g->numel;
    uint64_t tp = 0;
    if (g->tp > 1) {
        if (g->path == MT_GRAD_WINDOW_ACC) /* chunk by chunk at finish */
            tp = chunked_ar_bytes(g, (uint64_t)g->tp);
        else
            tp = (per_microbatch(g) ? (uint64_t)K : 1) * (2 * (uint64_t)(g->tp - 1) * G / (uint64_t)g->tp);
    }
    return tp + data_bytes(g, K);
}

uint64_t mt_grad_sync_range_bytes(const mt_grad_sync *g, int64_t a, int64_t n, int64_t K) {
    if (g->path != MT_GRAD_WINDOW_RS || n <= 0) return 0;
    const uint64_t S = 4 * (uint64_t)n;
    uint64_t b = g->tp > 1 ? 2 * (uint64_t)(g->tp - 1) * S / (uint64_t)g->tp : 0;
    if (g->n > 1) {
        const int64_t lo = g->lo > a ? g->lo : a, hi = g->hi < a + n ? g->hi : a + n;
        b += S - 4 * (uint64_t)(hi > lo ? hi - lo : 0);
    }
    return (g->direct ? 1 : (uint64_t)K) * b;
}

/* The data x fsdp part of mt_grad_sync_step_bytes. */
static uint64_t data_bytes(const mt_grad_sync *g, int64_t K) {
    const uint64_t n = (uint64_t)g->n, G = 4 * (uint64_t)g->numel;
    if (n == 1) return 0;
    if (!g->zero1) return g->path == MT_GRAD_WINDOW_ACC ? chunked_ar_bytes(g, n) : 2 * (n - 1) * G / n;
    const uint64_t own = 4 * (uint64_t)(g->hi - g->lo);
    const uint64_t rs = G - own, ag = (g->params_sharded ? 4 * (uint64_t)(g->fhi - g->flo) : G) - own;
    return (per_microbatch(g) ? (uint64_t)K : 1) * rs + ag;
}
