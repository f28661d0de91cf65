/* train/estimate.h: the per-device memory plan of a (possibly large) job, and the
 * batch-size / remat-policy estimator (after MaxText's src/MaxText/estimator.py), which
 * also searches the mesh of num_devices (mt_estimate_mesh; MaxText's searches batch and
 * remat for a given mesh only).
 *
 * Planning needs no device, no data and no mpirun. The plan of one rank is the
 * trainer's own plan (mt_trainer_plan) for rank 0 of the data x fsdp x
 * context x tensor mesh the keys give, with fsdp, remat, activation offload and
 * parameter / optimizer host offload as the trainer runs them: exactly what that rank
 * allocates (every fsdp layout: fsdp alone or with the tensor, data and context axes,
 * and with parameter host offload). A config the trainer refuses is refused here with
 * the trainer's message. The trainer's own entries (gradient buffers, accumulators,
 * windows) are never re-derived here, so changes to them flow through.
 * Activations and the compute copy of the weights are of the config's dtype (float32 or
 * bfloat16), master weights and optimizer moments float32, gradient accumulators of
 * grad_dtype, as the trainer allocates them. */
#ifndef MT_TRAIN_ESTIMATE_H
#define MT_TRAIN_ESTIMATE_H

#include <stddef.h>
#include <stdint.h>
#include "models/model.h"
#include "models/remat.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "train/config.h"
#include "train/remat.h" /* mt_memory_remat_policy, for the estimator's callers */

#ifdef __cplusplus
extern "C" {
#endif

/* Device bytes of one rank per row of `meshtrain plan`'s table. Each plan entry
 * counts in exactly one row (by its category, and for activations and scratch by its
 * tag, runtime/plan.h: the layer tensor of "layers.<l>.<tensor>", the kind of "remat.*"),
 * so the rows add up to the requested
 * bytes of the entries counted. */
typedef struct mt_memory_rows {
    size_t params, grads, optimizer;
    size_t saved[MT_RT_COUNT];    /* device-kept activations per named tensor, all layers */
    size_t saved_other;           /* norm statistics, step inputs, final norm */
    size_t recompute_scratch;     /* "remat.*": one layer's worth of non-kept tensors */
    size_t scratch;               /* other per-op temporaries */
    size_t loss_tile, comm, workspace;
} mt_memory_rows;

/* One rank's memory, in bytes. `total` sums every plan entry of each row, whatever
 * its lifetime (e.g. every gradient window, although they are never live
 * together); `live` sums the entries live at peak_phase only (the phase with the most
 * requested bytes live, runtime/plan.h mt_plan_live_by_category), its rows adding up
 * to live_at_peak. peak is the arena size (>= live_at_peak: alignment, packing). */
typedef struct mt_memory_report {
    int dims[4];                  /* data, fsdp, context, tensor */
    int64_t num_params;           /* of the whole model */
    int64_t local_params;         /* held by this rank's model before fsdp sharding */
    size_t peak;                  /* device arena bytes: mt_plan_peak */
    size_t live_at_peak;          /* requested bytes live at the peak phase */
    int peak_phase;
    mt_memory_rows total;         /* device rows, all entries */
    mt_memory_rows live;          /* device rows, entries live at peak_phase */
    size_t host_activations;      /* offloaded activations (host pool) */
    size_t host_params, host_optimizer;
    size_t host_total;
    size_t layer_kept;            /* device bytes one layer adds (its kept tensors) */
    uint64_t step_bytes;          /* bytes rank 0 sends in one optimizer step: the trainer's formula
                                   * (train/trainer.h mt_trainer_plan_ex, mt_trainer_step_bytes) */
    int64_t vocab_tiling[3];      /* the loss's row tiles and vocabulary chunks as the model resolved them
                                   * (num_vocab_tiling / num_vocab_chunks 0 = auto: models/model.h), and
                                   * gemma4's per-layer embedding table chunks (0 without one) */
} mt_memory_report;

/* Plan rank 0 of cfg (num_devices and the ici_* keys give the mesh; when every
 * ici_* is 1 and num_devices > 1 the fsdp axis takes all devices, MaxText's default
 * ici_fsdp_parallelism = -1): the trainer's plan (see the top of this file).
 * *plan / *host_plan (may be NULL) receive the finalised plans, which the caller frees.
 * Errors: MT_ERR_INVALID (config, a mesh that does not match num_devices, a layout the
 * model does not divide: the message names the keys), MT_ERR_UNSUPPORTED (what the
 * trainer refuses for every layout: e.g. weight_dtype other than float32),
 * MT_ERR_OOM. */
mt_status mt_memory_plan_rank(const mt_train_config *cfg, mt_memory_report *rep, mt_plan **plan, mt_plan **host_plan);

/* Step-time model of the estimator (constants printed with its output). */
typedef struct mt_step_model {
    double device_flops;  /* FLOP/s of one device */
    double host_bw;       /* bytes/s host <-> device, each direction */
    double link_bw;       /* bytes/s of one device's collective link */
    const char *device;   /* the hardware these constants describe, in words (static) */
} mt_step_model;

/* H100/H200 SXM dense bf16 peak 989e12 FLOP/s, PCIe 5 x16 55e9 B/s, 400 Gb/s
 * InfiniBand per GPU 50e9 B/s: a GPU whatever cfg->backend says (no key changes
 * them), so for backend=cpu the modelled step times mean nothing. */
mt_step_model mt_step_model_default(void);

/* Largest hbm_gib mt_estimate takes: 2^33 GiB = 2^63 bytes. */
#define MT_HBM_GIB_MAX 8589934592.0

/* Modelled seconds of one optimizer step of cfg (all micro-batches) on one device of
 * the mesh job_dims gives (num_devices and the ici_* keys, all 1 = fsdp over
 * num_devices), no overlap:
 *   FLOPs / device_flops + offloaded bytes (out and back) / host_bw
 *   + collective bytes / link_bw
 * FLOPs: the trainer's mfu formula (train/metrics.h mt_flops_per_token: MaxText's
 * maxtext_utils.py calculate_tflops_training_per_device convention, the logits matmul
 * counted once, tied or not) times the tokens one device is credited with,
 * per_device_batch_size x max_target_length x gradient_accumulation_steps / (context x
 * tensor), plus the forward FLOPs of every recomputed tensor on this rank's local
 * (tensor-split) dims and rows. Collective bytes: the trainer's own formula for rank 0
 * (mt_memory_report.step_bytes from the full plan: parallel/zero1.h gradient and
 * parameter collectives, models/model_shard.c tensor / context and fsdp bytes), so the
 * estimator and `train` count the same bytes. Each term is returned too (may be NULL).
 * INFINITY for a config or layout the trainer refuses (train/trainer.h
 * mt_trainer_check_layout), with its message in mt_last_error(). */
double mt_step_model_seconds(const mt_train_config *cfg, const mt_step_model *sm, double *flops,
                             double *offload_bytes, double *comm_bytes);

/* One estimator result: a layout, a batch and a policy. */
typedef struct mt_estimate_row {
    int dims[4];                /* the mesh: data, fsdp, context, tensor (parallel/mesh.h order) */
    int layout;                 /* 1-based rank of its layout in the result */
    int64_t batch;              /* per_device_batch_size */
    mt_remat_policy policy;
    size_t peak;                /* device bytes (exact plan) */
    size_t host;                /* host bytes */
    double step_s, tokens_per_s;
    double flops;               /* modelled FLOPs of one step on one device (mt_step_model_seconds) */
    uint64_t comm_bytes;        /* bytes rank 0 sends in one step: the trainer's formula */
} mt_estimate_row;

typedef struct mt_estimate_result {
    int mode;                   /* 1: batch and policy searched, 2: batch fixed */
    mt_estimate_row *rows;      /* the listed layouts' rows: layouts best first (by their best row's
                                 * modelled tokens/s per device), each layout's rows ranked by it
                                 * (mode 1: that layout's Pareto list) */
    int nrows;
    int nlayouts;               /* layouts listed (rows[].layout in 1..nlayouts) */
    int plans;                  /* plans evaluated */
    double seconds;             /* wall time of the search */
    size_t budget;              /* bytes */
    /* the mesh search (mt_estimate_mesh) */
    int fixed_axes[4];          /* 1: the axis was held at its ici_* value, not searched */
    int candidates;             /* factorisations of num_devices with the fixed axes held */
    int refused;                /* of them, refused by the trainer's layout check */
    int no_fit;                 /* passed it, but the lightest policy at the smallest batch does not fit
                                 * (by the extrapolated peak, or at full depth once searched) */
    int bounded;                /* fit, but their bound could not reach the listed layouts: not searched */
    int searched;               /* searched in full */
} mt_estimate_result;

/* The estimator on cfg's one mesh (num_devices and the ici_* keys, all 1 = fsdp over
 * num_devices; mt_estimate_mesh with every axis fixed), after MaxText's estimator.py:
 * search the remat policy tensor by tensor, then the batch. Tensors not in `fixed` (fixed[t] = 1:
 * left at cfg's custom action) are searched, ordered by size; tensors of zero size
 * (mlpwo without a post-MLP norm) are left remat. batch_fixed = 0: binary-search
 * the largest batch under full remat, then step toward more memory (remat ->
 * offload one tensor at a time, smallest first, then offload -> device), each step
 * binary-searching the largest batch not above the previous one; the candidates are
 * every (batch, policy) pair of that walk plus, for each, the same policy with every
 * searched tensor that is not on the device given the cheaper of remat and offload
 * under sm (same kept set: same device plan, same fit). Returned: the Pareto list of
 * the candidates, no row dominated by another (a batch at least as large with a
 * modelled step at most as long, one strictly; of exact ties the first), ranked by
 * modelled tokens per second per device. Each row fits the budget (exact full-depth
 * plan) and its policy does not fit batch + 1, the walk's batches being maxima and
 * the device plan growing with the kept set (tests/test_cli_estimate.sh checks both
 * with `meshtrain plan`). batch_fixed > 0: error if the lightest policy does not fit, else
 * from all-device step back (device -> offload, largest first, then offload ->
 * remat) until it fits, by the exact full-depth plan. Budget: cfg->hbm_gib GiB, in (0, MT_HBM_GIB_MAX].
 * Errors: MT_ERR_INVALID (hbm_gib <= 0 or > MT_HBM_GIB_MAX, naming the range; config),
 * MT_ERR_OOM; MT_ERR_INVALID with
 * "does not fit" and the smallest plan's bytes against the budget when nothing fits. */
mt_status mt_estimate(const mt_train_config *cfg, int64_t batch_fixed, const int fixed[MT_RT_COUNT],
                      const mt_step_model *sm, mt_estimate_result *out);

/* Most layouts mt_estimate_mesh lists for the CLI. */
#define MT_ESTIMATE_TOP_LAYOUTS 5

/* The estimator over layouts too: mt_estimate on every mesh of num_devices devices the
 * trainer accepts. MaxText's estimator searches batch and remat for one mesh only.
 * Candidates: every factorisation data x fsdp x context x tensor = num_devices, an axis
 * with axis_fixed[a] set held at its ici_* value of cfg (-1: the axis filling what the
 * others leave); with every axis fixed, the one mesh of mt_estimate (all ici_* = 1:
 * fsdp over num_devices). Each candidate is checked with the trainer's own layout
 * check (train/trainer.h mt_trainer_check_layout: tensor split of heads, kv heads,
 * mlp_dim and vocab_size, max_target_length by 2 x context, sequence-parallel rows,
 * fsdp <= parameters, the layouts dtype runs on) at its smallest batch, batches being searched in multiples of
 * it; then the lightest policy must fit that batch (mode 2: the fixed batch). Of those,
 * each gets an upper bound of its modelled tokens/s per device (the largest batch of
 * the lightest policy, its collective bytes from the exact plan, no recompute or
 * offload: the step is FLOPs linear in the batch plus bytes affine in it, so tokens /
 * step is largest at the largest batch); in bound order each layout is searched in
 * full as mt_estimate does, until the next bound is below the top-th best found
 * (branch and bound: the listed layouts are the top `top` of all that fit, whatever
 * was left unsearched). Every row is confirmed by the trainer's full plan of its
 * (layout, batch, policy), which passes the trainer's checks and fits the budget.
 * top >= 1 (smaller reads as 1); out (rows in bytes, seconds and tokens/s per device,
 * as mt_estimate's) is freed with mt_estimate_result_free.
 * Errors: those of mt_estimate; MT_ERR_INVALID naming num_devices when it is outside
 * [1, 2^30], not a multiple of the fixed axes' product, or none of its layouts passes
 * the layout check (the first refusal's message); "does not fit" with the smallest
 * plan's bytes (and its layout) when no layout fits. */
mt_status mt_estimate_mesh(const mt_train_config *cfg, const int axis_fixed[4], int top, int64_t batch_fixed,
                           const int fixed[MT_RT_COUNT], const mt_step_model *sm, mt_estimate_result *out);
void mt_estimate_result_free(mt_estimate_result *r);

#ifdef __cplusplus
}
#endif
#endif
