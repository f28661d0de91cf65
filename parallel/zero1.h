/* parallel/zero1.h: gradient reduction over data x fsdp, ZeRO-1 sharding of the
 * optimizer, and the gradient-accumulation buffers in grad_dtype (DESIGN.md sections
 * 2, 4 and 5; REFERENCE.md "ZeRO-1", "Gradient accumulation").
 *
 * The flat gradient (numel fp32, the model's layout) of each micro-batch holds the
 * gradient of the SUMMED token loss. With n ranks in the data x fsdp group:
 *   shard i = [lo_i, hi_i), lo_i = i * ceil(numel / n) clipped to numel (the last
 *   shards may be shorter or empty; no padding is communicated).
 * Schedules (gradient_accumulation_reduce):
 *   once   the micro-batch gradients accumulate in a full-size buffer (the model's fp32
 *          gradient itself when grad_dtype=float32, else a numel x grad_dtype
 *          accumulator); after the last micro-batch one all-reduce (plain data
 *          parallelism) or one reduce-scatter into the shard (ZeRO-1).
 *   every  ZeRO-1 only: after each micro-batch's backward the fp32 gradient is
 *          reduce-scattered and added into a shard-sized grad_dtype accumulator
 *          (1/n of the memory; on a GPU the reduce-scatter overlaps the next
 *          micro-batch's compute).
 * Every add into a bfloat16 accumulator is done in fp32 and rounded once to nearest
 * even (never bf16 + bf16). Sums are exact to fp32 rounding in a different order than
 * one process summing the whole batch, hence the 1e-5 relative test tolerance.
 *
 * Buffers are HOST memory (the MPI backend, CPU ops); they are plan entries:
 *   "grad_accumulator"        numel x grad_dtype, MT_MEM_GRADS (once + bfloat16)
 *   "grad_shard_accumulator"  shard x grad_dtype, MT_MEM_GRADS (every)
 *   "grad_shard"              shard x fp32, MT_MEM_COMM       (ZeRO-1: the reduced shard)
 * and the optimizer moments shrink to the shard (mt_grad_sync_opt_numel).
 *
 * Bytes per rank per step on the data x fsdp group, G = 4 numel (fp32 gradient),
 * P = 4 numel (fp32 parameters), K micro-batches, n ranks (parallel/comm.h accounting):
 *   data parallel:        2 (n-1) G / n        (one all-reduce)
 *   ZeRO-1, once:         (G - G_own) + (P - P_own)   (reduce-scatter + all-gather)
 *   ZeRO-1, every:        K (G - G_own) + (P - P_own)
 * plus the step's scalars (loss sum, token count, squared norm: 8 bytes each, all-reduced). */
#ifndef MT_PARALLEL_ZERO1_H
#define MT_PARALLEL_ZERO1_H

#include <stdint.h>
#include "parallel/comm.h"
#include "runtime/dtype.h"
#include "runtime/plan.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mt_ga_reduce {
    MT_GA_REDUCE_ONCE = 0,  /* reduce once after the last micro-batch */
    MT_GA_REDUCE_EVERY = 1  /* reduce-scatter every micro-batch into the shard accumulator */
} mt_ga_reduce;

typedef struct mt_grad_sync {
    mt_comm *comm;        /* data x fsdp group; NULL = a group of one */
    int n, rank;          /* group size and this rank */
    int zero1;            /* shard_optimizer_over_data */
    mt_dtype grad_dtype;
    mt_ga_reduce sched;
    int direct;           /* one micro-batch per step: nothing accumulates, no accumulator */
    int64_t numel;
    int64_t lo, hi;       /* this rank's shard (the whole buffer without ZeRO-1) */
    int64_t *counts;      /* shard sizes of the n ranks (ZeRO-1) */
    /* plan ids and bound buffers */
    int id_acc, id_shard_acc, id_shard;
    void *acc;            /* numel x grad_dtype (once + bf16) */
    void *shard_acc;      /* shard x grad_dtype (every) */
    float *shard;         /* shard x fp32 (ZeRO-1) */
    /* tensor axis (mt_grad_sync_set_tensor) */
    mt_comm *tp_comm;
    int tp, tp_rank;
    int64_t *rep_off, *rep_n; /* ranges whose gradient every tensor rank holds whole */
    int nrep;
    /* fsdp (models/model.h mt_model_set_fsdp; the trainer turns ZeRO-1 on with it, on
     * the same shards): the parameters stay sharded (the model gathers what it uses), so
     * mt_grad_sync_gather_params does nothing and the step's bytes have no gather */
    int params_sharded;
} mt_grad_sync;

/* Set up for a group of n ranks where this is `rank` (comm may be NULL at planning
 * time; then n and rank describe the layout being planned), for accum_steps
 * micro-batches per step: with 1 nothing accumulates, so there is no accumulator
 * (grad_dtype plays no part) and both schedules reduce the fp32 gradient once.
 * Errors: MT_ERR_INVALID (n < 1, rank outside [0, n), every without ZeRO-1, grad_dtype
 * not float32/bfloat16), MT_ERR_OOM. */
mt_status mt_grad_sync_init(mt_grad_sync *g, mt_comm *comm, int n, int rank, int64_t numel, int zero1,
                            mt_dtype grad_dtype, mt_ga_reduce sched, int64_t accum_steps);
void mt_grad_sync_free(mt_grad_sync *g);

/* Tensor parallelism: before every data reduction the gradient is all-reduced over
 * the tensor group `comm` (size ranks, this one `rank`) after ranks other than 0 zero
 * the n ranges [off[i], off[i] + num[i]) whose gradient every rank holds in full
 * (models/model.h mt_model_tp_grad_replicated), so the sum counts them once. Adds
 * (K or 1) x 2 (size-1)/size x 4 numel bytes on the tensor group per step.
 * Errors: MT_ERR_OOM. */
mt_status mt_grad_sync_set_tensor(mt_grad_sync *g, mt_comm *comm, int size, int rank, int n, const int64_t *off,
                                  const int64_t *num);

/* Elements of the optimizer state on this rank: hi - lo. */
int64_t mt_grad_sync_opt_numel(const mt_grad_sync *g);

/* Add the buffers of the header comment (phases [0, last_phase]). */
mt_status mt_grad_sync_add_to_plan(mt_grad_sync *g, mt_plan *plan, int last_phase);
mt_status mt_grad_sync_bind(mt_grad_sync *g, const mt_arena *arena, const mt_plan *plan);

/* After micro-batch `mb` (0-based) of a step: grads[numel] holds this micro-batch's
 * gradient (on mb == 0) or, with once + float32, the running sum. Folds it into the
 * accumulator of the schedule; may zero grads for the next micro-batch.
 * *zero_grads (out) says whether grads must be zeroed before the next backward. */
mt_status mt_grad_sync_microbatch(mt_grad_sync *g, float *grads, int64_t mb, int *zero_grads);

/* After the last micro-batch: the group's summed gradient. Without ZeRO-1 it is
 * all-reduced into grads[numel] and *out = grads; with ZeRO-1 *out = the fp32 shard
 * [hi - lo] (grads is used as scratch). */
mt_status mt_grad_sync_finish(mt_grad_sync *g, float *grads, float **out);

/* ZeRO-1: every rank updated params[lo, hi); all-gather so every rank has all of
 * params[numel]. No-op without ZeRO-1. */
mt_status mt_grad_sync_gather_params(mt_grad_sync *g, float *params);

/* Gather a sharded fp32 state (this rank's [hi - lo] values in `shard`) into
 * full[numel] on every rank (checkpoints of sharded moments). */
mt_status mt_grad_sync_gather(mt_grad_sync *g, const float *shard, float *full);

/* The bytes formula of the header comment for the gradient and parameter
 * collectives of one step with K micro-batches (scalars excluded). */
uint64_t mt_grad_sync_step_bytes(const mt_grad_sync *g, int64_t K);

#ifdef __cplusplus
}
#endif
#endif
