/* parallel/zero1.c: data-parallel gradient reduction, ZeRO-1 shards and grad_dtype
 * accumulators (zero1.h). */
#include "parallel/zero1.h"

#include <stdlib.h>
#include <string.h>

static uint64_t data_bytes(const mt_grad_sync *g, int64_t K);

mt_status mt_grad_sync_init(mt_grad_sync *g, mt_comm *comm, int n, int rank, int64_t numel, int zero1,
                            mt_dtype grad_dtype, mt_ga_reduce sched, int64_t accum_steps) {
    memset(g, 0, sizeof *g);
    g->id_acc = g->id_shard_acc = g->id_shard = -1;
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
    if (zero1) {
        g->counts = malloc(sizeof(int64_t) * (size_t)n);
        if (!g->counts) return mt_set_error(MT_ERR_OOM, "gradient sync: out of memory");
        const int64_t per = (numel + n - 1) / n;
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
    free(g->rep_off);
    free(g->rep_n);
    g->counts = g->rep_off = g->rep_n = NULL;
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

/* Sum the full gradient over the tensor group, replicated ranges counted once. */
static mt_status tensor_reduce(mt_grad_sync *g, float *grads) {
    if (g->tp <= 1) return MT_OK;
    if (g->tp_rank != 0)
        for (int i = 0; i < g->nrep; i++) memset(grads + g->rep_off[i], 0, (size_t)g->rep_n[i] * sizeof(float));
    return mt_comm_all_reduce(g->tp_comm, grads, g->numel, MT_COMM_F32);
}

int64_t mt_grad_sync_opt_numel(const mt_grad_sync *g) { return g->hi - g->lo; }

mt_status mt_grad_sync_add_to_plan(mt_grad_sync *g, mt_plan *plan, int last) {
    const size_t es = mt_dtype_size(g->grad_dtype), S = (size_t)(g->hi - g->lo);
    if (g->zero1) MT_TRY(mt_plan_add(plan, "grad_shard", MT_MEM_COMM, S * sizeof(float), 0, last, &g->id_shard));
    if (g->direct) return MT_OK;
    if (g->sched == MT_GA_REDUCE_ONCE && g->grad_dtype != MT_F32)
        MT_TRY(mt_plan_add(plan, "grad_accumulator", MT_MEM_GRADS, (size_t)g->numel * es, 0, last, &g->id_acc));
    if (g->sched == MT_GA_REDUCE_EVERY)
        MT_TRY(mt_plan_add(plan, "grad_shard_accumulator", MT_MEM_GRADS, S * es, 0, last, &g->id_shard_acc));
    return MT_OK;
}

mt_status mt_grad_sync_bind(mt_grad_sync *g, const mt_arena *arena, const mt_plan *plan) {
    if (g->id_acc >= 0) g->acc = mt_arena_ptr(arena, plan, g->id_acc);
    if (g->id_shard_acc >= 0) g->shard_acc = mt_arena_ptr(arena, plan, g->id_shard_acc);
    if (g->id_shard >= 0) g->shard = mt_arena_ptr(arena, plan, g->id_shard);
    if ((g->id_acc >= 0 && !g->acc) || (g->id_shard_acc >= 0 && !g->shard_acc) || (g->id_shard >= 0 && !g->shard))
        return mt_set_error(MT_ERR_INVALID, "gradient sync: plan entries missing from the arena");
    return MT_OK;
}

/* acc[i] = round(acc[i] + x[i]) in dt (first: acc = round(x)); the add in fp32. */
static void accumulate(void *acc, mt_dtype dt, const float *x, int64_t n, int first) {
    if (dt == MT_F32) {
        float *a = acc;
        if (first) memcpy(a, x, (size_t)n * sizeof(float));
        else {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; i++) a[i] += x[i];
        }
        return;
    }
    mt_bf16 *a = acc;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) a[i] = mt_f32_to_bf16((first ? 0.0f : mt_bf16_to_f32(a[i])) + x[i]);
}

static void to_f32(float *dst, const void *acc, mt_dtype dt, int64_t n) {
    if (dt == MT_F32) memmove(dst, acc, (size_t)n * sizeof(float));
    else mt_bf16_to_f32_array(dst, acc, (size_t)n);
}

mt_status mt_grad_sync_microbatch(mt_grad_sync *g, float *grads, int64_t mb, int *zero_grads) {
    *zero_grads = 0;
    if (g->direct) return MT_OK;
    if (g->sched == MT_GA_REDUCE_EVERY) {
        MT_TRY(tensor_reduce(g, grads));
        MT_TRY(mt_comm_reduce_scatter(g->comm, grads, g->shard, g->counts, MT_COMM_F32));
        accumulate(g->shard_acc, g->grad_dtype, g->shard, g->hi - g->lo, mb == 0);
        *zero_grads = 1;
    } else if (g->grad_dtype != MT_F32) {
        accumulate(g->acc, g->grad_dtype, grads, g->numel, mb == 0);
        *zero_grads = 1;
    }
    return MT_OK;
}

mt_status mt_grad_sync_finish(mt_grad_sync *g, float *grads, float **out) {
    const int64_t S = g->hi - g->lo;
    if (g->sched == MT_GA_REDUCE_EVERY && !g->direct) {
        to_f32(g->shard, g->shard_acc, g->grad_dtype, S);
        *out = g->shard;
        return MT_OK;
    }
    if (g->grad_dtype != MT_F32 && !g->direct) to_f32(grads, g->acc, g->grad_dtype, g->numel);
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
        if (shard != full) memmove(full, shard, (size_t)g->numel * sizeof(float));
        return MT_OK;
    }
    return mt_comm_all_gather(g->comm, shard, full, g->counts, MT_COMM_F32);
}

mt_status mt_grad_sync_gather_params(mt_grad_sync *g, float *params) {
    if (!g->zero1 || g->params_sharded) return MT_OK;
    return mt_comm_all_gather(g->comm, params + g->lo, params, g->counts, MT_COMM_F32);
}

uint64_t mt_grad_sync_step_bytes(const mt_grad_sync *g, int64_t K) {
    const uint64_t G = 4 * (uint64_t)g->numel;
    uint64_t tp = 0;
    if (g->tp > 1)
        tp = (g->sched == MT_GA_REDUCE_EVERY ? (uint64_t)K : 1) * (2 * (uint64_t)(g->tp - 1) * G / (uint64_t)g->tp);
    return tp + data_bytes(g, K);
}

/* The data x fsdp part of mt_grad_sync_step_bytes. */
static uint64_t data_bytes(const mt_grad_sync *g, int64_t K) {
    const uint64_t n = (uint64_t)g->n, G = 4 * (uint64_t)g->numel;
    if (n == 1) return 0;
    if (!g->zero1) return 2 * (n - 1) * G / n;
    const uint64_t own = 4 * (uint64_t)(g->hi - g->lo);
    const uint64_t rs = G - own, ag = g->params_sharded ? 0 : G - own;
    return (g->sched == MT_GA_REDUCE_EVERY ? (uint64_t)K : 1) * rs + ag;
}
