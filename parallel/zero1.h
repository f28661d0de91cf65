/* parallel/zero1.h: gradient reduction over data x fsdp x context, ZeRO-1 sharding of the
 * optimizer, and the gradient-accumulation buffers in grad_dtype (ZeRO stage 1:
 * Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
 * Models", SC 2020, arXiv:1910.02054; a bf16 accumulator adds in fp32 and rounds once).
 *
 * The flat gradient (numel fp32, the model's layout) of each micro-batch holds the
 * gradient of the SUMMED token loss. With n ranks in the data x fsdp x context group:
 *   shard i = [lo_i, hi_i), lo_i = i * ceil(numel / n) clipped to numel (the last
 *   shards may be shorter or empty; no padding is communicated); under fsdp the shards
 *   nest inside the fsdp parameter shards instead (mt_grad_sync_set_fsdp).
 * Schedules (gradient_accumulation_reduce):
 *   once   the micro-batch gradients accumulate in a full-size buffer (the model's fp32
 *          gradient itself when grad_dtype=float32, else a numel x grad_dtype
 *          accumulator); after the last micro-batch one all-reduce (plain data
 *          parallelism) or one reduce-scatter into the shard (ZeRO-1).
 *   every  ZeRO-1 only: after each micro-batch's backward the fp32 gradient is
 *          reduce-scattered and added into a shard-sized grad_dtype accumulator
 *          (1/n of the memory), window by window (MT_GRAD_WINDOW_RS below: each
 *          parameter's reduce-scatter overlaps the next one's backward).
 * Every add into a bfloat16 accumulator is done in fp32 and rounded once to nearest
 * even (never bf16 + bf16). Sums are exact to fp32 rounding in a different order than
 * one process summing the whole batch, hence the 1e-5 relative test tolerance.
 *
 * Gradient paths (mt_grad_sync_set_path; K micro-batches): the model can hand its
 * gradient over in fp32 windows instead of one full buffer (models/model.h
 * mt_model_set_grad_sink: each layer parameter, the tail = model.norm + lm_head, the
 * embedding, or vocabulary chunks of the embedding and lm_head; each handed over once
 * its gradient is complete). The path is chosen by
 * the layout, the one with the smaller plan in each case:
 *   MT_GRAD_FULL        fp32 once (with or without ZeRO-1, K > 1) and K = 1 without
 *                       ZeRO-1: the model's full fp32 buffer, accumulated in place
 *                       (4 bytes per parameter and no accumulator: optimal here).
 *   MT_GRAD_WINDOW_ACC  bf16 once, K > 1, no fsdp: each window is folded into the
 *                       numel x bf16 accumulator right away (the same fp32 add and
 *                       single rounding per micro-batch as folding the full buffer:
 *                       bitwise the same accumulator); no full fp32 buffer. After the
 *                       last micro-batch the accumulator is reduced chunk by chunk
 *                       through an fp32 chunk window ("grads.window.reduce", chunk =
 *                       the largest parameter, live in the optimizer phase only):
 *                       ZeRO-1 reduce-scatters each chunk into the fp32 shard (bitwise
 *                       the whole-buffer result: the same sums of the same values);
 *                       without ZeRO-1 each chunk is all-reduced (tensor, then data)
 *                       and, when a reduction happened (n > 1 or tensor > 1), stored
 *                       back into the bf16 accumulator: ONE MORE ROUNDING of the
 *                       reduced sum (relative error <= 2^-8 per element) than the full
 *                       fp32 path had; the optimizer then reads the gradient chunk by
 *                       chunk (mt_grad_sync_read, whole parameters per chunk; the norm
 *                       sums the same terms in the same order).
 *   MT_GRAD_WINDOW_RS   ZeRO-1 with every or K = 1, and fsdp always: each window is
 *                       summed over the tensor group and reduce-scattered (each rank's
 *                       shard part of the window, uneven counts) right after its
 *                       backward: with K = 1 into the fp32 shard; with K > 1 in place
 *                       (the rank's part of the window receives the sum) and then
 *                       added into the shard x grad_dtype accumulator, so no fp32
 *                       shard is live in the backward: an fp32 accumulator is the
 *                       optimizer's gradient itself, a bf16 one is widened into the fp32
 *                       shard planned for the optimizer phase only (the same adds and
 *                       roundings as through the shard: bitwise the same). With more than one rank the
 *                       reduce-scatter is asynchronous: it runs while the model
 *                       computes the next parameter's gradient into its second layer
 *                       window, and completes before that window is written again
 *                       (mt_grad_sync_window_wait; the tensor-group sum before it stays
 *                       blocking). No full-size gradient buffer
 *                       anywhere: gradient memory = shard accumulator + windows. Under
 *                       fsdp with once and K > 1 this reduces every micro-batch (as
 *                       every: no full buffer holds the sum), so its bytes are every's.
 * A per-window reduce-scatter moves the same bytes as the whole-buffer one (the
 * windows partition [0, numel): the sum over windows of (window - own part) is G -
 * G_own), and so does a chunked all-reduce up to the integer division of each call
 * (exact when n divides 8 (n - 1) x floats, e.g. n = 2, 4, 8; the formula below sums
 * the chunks for MT_GRAD_WINDOW_ACC; per-window tensor all-reduces are counted as one).
 *
 * Buffers are backend memory: every loop over them (accumulation, conversion, zeroing,
 * copies) is an op of the backend set with mt_grad_sync_set_backend (grad_accumulate,
 * to_f32, zero, copy); the collectives pass them to parallel/comm.h. Plan entries:
 *   "grad_accumulator"        numel x grad_dtype, MT_MEM_GRADS (once + bfloat16, not fsdp)
 *   "grad_shard_accumulator"  shard x grad_dtype, MT_MEM_GRADS (every; fsdp with K > 1)
 *   "grads.window.reduce"     chunk x fp32, MT_MEM_GRADS, optimizer phase (WINDOW_ACC)
 *   "grad_shard"              shard x fp32, MT_MEM_COMM       (ZeRO-1: the reduced shard; WINDOW_RS
 *                             with K > 1: bf16 only, the optimizer phase only)
 * plus the model's windows ("grads.window.layer", with overlap also
 * "grads.window.layer.overlap", "grads.window.tail", "grads.window.embedding",
 * MT_MEM_GRADS) or its full "grads" (MT_GRAD_FULL), and the
 * optimizer moments shrink to the shard (mt_grad_sync_opt_numel).
 *
 * Bytes per rank per step on the data x fsdp x context group, G = 4 numel (fp32 gradient),
 * P = 4 numel (fp32 parameters), K micro-batches, n ranks (parallel/comm.h accounting):
 *   data parallel:        2 (n-1) G / n        (one all-reduce)
 *   ZeRO-1, once:         (G - G_own) + (P - P_own)   (reduce-scatter + all-gather)
 *   ZeRO-1, every:        K (G - G_own) + (P - P_own)
 *   fsdp:                 (1 or K) (G - G_own) + (P_f - P_own)  (the parameters stay
 *                         sharded over fsdp; P_f = 4 (fhi - flo): the all-gather of the
 *                         optimizer sub-shards over the data x context replica group,
 *                         0 with fsdp alone; n = data x fsdp x context)
 * plus the step's scalars (loss sum, token count, squared norm: 8 bytes each, all-reduced). */
#ifndef MT_PARALLEL_ZERO1_H
#define MT_PARALLEL_ZERO1_H

#include <stdint.h>
#include "kernels/backend.h"
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

/* Where the micro-batch gradients go (mt_grad_sync_set_path; header comment). */
typedef enum mt_grad_path {
    MT_GRAD_FULL = 0,       /* the model's full fp32 gradient buffer (the default) */
    MT_GRAD_WINDOW_ACC = 1, /* gradient windows folded into the numel x grad_dtype accumulator */
    MT_GRAD_WINDOW_RS = 2   /* gradient windows reduce-scattered into the shard (accumulator) */
} mt_grad_path;

/* Windows a rank may have in flight at once: the model keeps at most its two layer
 * parameter windows in flight (models/model.h mt_model_set_grad_sink_wait); two slots to spare. */
#define MT_GRAD_SYNC_PENDING 4

typedef struct mt_grad_sync {
    mt_backend *be;       /* the backend whose memory the buffers are in (mt_grad_sync_set_backend) */
    mt_comm *comm;        /* data x fsdp x context group (fsdp-major under fsdp); NULL = a group of one */
    int n, rank;          /* group size and this rank */
    int zero1;            /* shard_optimizer_over_data */
    mt_dtype grad_dtype;
    mt_ga_reduce sched;
    int direct;           /* one micro-batch per step: nothing accumulates, no accumulator */
    int64_t numel;
    int64_t lo, hi;       /* this rank's shard (the whole buffer without ZeRO-1) */
    int64_t *counts;      /* shard sizes of the n ranks (ZeRO-1) */
    int64_t per;          /* ceil(numel / n): shard i starts at i * per (ZeRO-1); under fsdp
                           * ceil(fper / rep): sub-shard j starts at j * per in its fsdp shard */
    int64_t *wcounts;     /* [n] scratch: one window's part of each shard (ZeRO-1) */
    mt_grad_path path;
    int64_t chunk;        /* floats of the fp32 chunk window (MT_GRAD_WINDOW_ACC) */
    int64_t mb;           /* the micro-batch in progress (mt_grad_sync_set_microbatch) */
    /* plan ids and bound buffers */
    int id_acc, id_shard_acc, id_shard, id_chunk;
    void *acc;            /* numel x grad_dtype (once + bf16) */
    void *shard_acc;      /* shard x grad_dtype (every; windows reduce-scattered with K > 1) */
    float *shard;         /* shard x fp32 (ZeRO-1; with windows and K > 1 only bf16's, optimizer phase) */
    float *chunk_buf;     /* chunk x fp32 (MT_GRAD_WINDOW_ACC) */
    /* tensor axis (mt_grad_sync_set_tensor) */
    mt_comm *tp_comm;
    int tp, tp_rank;
    int64_t *rep_off, *rep_n; /* ranges whose gradient every tensor rank holds whole */
    int nrep;
    /* fsdp (models/model.h mt_model_layout fsdp; mt_grad_sync_set_fsdp): the parameters
     * stay sharded over the fsdp group (the model gathers what it uses); the optimizer
     * shard [lo, hi) nests inside this rank's fsdp shard [flo, fhi), and
     * mt_grad_sync_gather_params all-gathers the updated sub-shards over the replica
     * group (data x context) into the fsdp shard; nothing when that group is one rank */
    int params_sharded;
    int64_t flo, fhi;     /* this rank's fsdp shard ([0, numel) without fsdp) */
    int64_t fper;         /* ceil(numel / fsdp): fsdp shard f starts at f * fper (numel without fsdp) */
    int fsdp;             /* fsdp group size (1 without fsdp) */
    mt_comm *rep_comm;    /* replica group: the data x context ranks holding the same fsdp shard */
    int rep, rep_rank;    /* its size n / fsdp and this rank's place in it, rank % rep */
    int64_t *rcounts;     /* [rep] the sub-shard sizes inside this rank's fsdp shard */
    /* overlap (mt_grad_sync_set_overlap): the reduce-scatter of a window runs while the
     * model computes the next gradient; at most MT_GRAD_SYNC_PENDING windows in flight,
     * each completed by mt_grad_sync_window_wait */
    int overlap;
    struct mt_grad_sync_pending {
        const float *w;       /* the window read by the collective, NULL = free slot */
        mt_comm_request *req; /* its reduce-scatter (NULL: done at start, a group of one) */
        int64_t own0, own;    /* this rank's part of the window's range */
        const float *sum;     /* where its reduced part lands: in the window (K > 1) or the shard */
        int add;              /* a second share of the range (mt_grad_sink_fn's add) */
    } pending[MT_GRAD_SYNC_PENDING];
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

/* The backend whose memory the accumulators, shard and windows are in and whose ops
 * accumulate, convert and zero them (init sets the CPU backend; the trainer passes its
 * own). be must outlive g. */
void mt_grad_sync_set_backend(mt_grad_sync *g, mt_backend *be);

/* Tensor parallelism: before every data reduction the gradient is all-reduced over
 * the tensor group `comm` (size ranks, this one `rank`) after ranks other than 0 zero
 * the n ranges [off[i], off[i] + num[i]) whose gradient every rank holds in full
 * (models/model.h mt_model_tp_grad_replicated), so the sum counts them once. Adds
 * (K or 1) x 2 (size-1)/size x 4 numel bytes on the tensor group per step.
 * Errors: MT_ERR_OOM. */
mt_status mt_grad_sync_set_tensor(mt_grad_sync *g, mt_comm *comm, int size, int rank, int n, const int64_t *off,
                                  const int64_t *num);

/* fsdp over `fsdp` ranks (this one `fsdp_rank`), after init with zero1 = 1, before
 * mt_grad_sync_set_path (HSDP-like nesting, the layout of MaxText's fsdp x data /
 * context: parameters sharded over fsdp only, gradients summed over all n ranks).
 * The group passed to init must be ordered fsdp-major: rank = fsdp_rank x rep + j with
 * rep = n / fsdp and j = this rank's place among the data x context ranks holding the
 * same fsdp shard (parallel/mesh.h grad_fsdp; j = its rank in `replica`, the group of
 * those rep ranks, NULL when planning). Shards:
 *   fsdp shard f = [f pf, (f + 1) pf) clipped to numel, pf = ceil(numel / fsdp) (the
 *                  model's split, mt_model_fsdp_range);
 *   optimizer shard of rank f rep + j = [flo + j ps, flo + (j + 1) ps) clipped to the
 *                  fsdp shard, ps = ceil(pf / rep),
 * so the optimizer shards in rank order partition [0, numel) in flat order and one
 * reduce-scatter over the group (counts = their sizes) leaves each rank its shard of
 * the summed gradient; optimizer state is numel / n per rank as under ZeRO-1. After
 * AdamW updated params[lo - flo, hi - flo) of the fsdp shard, mt_grad_sync_gather_params
 * all-gathers the rep sub-shards over `replica`. With rep = 1 (fsdp alone) this is the
 * plain ZeRO-1 split. Errors: MT_ERR_INVALID (no ZeRO-1, fsdp not dividing n, rank not
 * fsdp-major), MT_ERR_OOM. */
mt_status mt_grad_sync_set_fsdp(mt_grad_sync *g, mt_comm *replica, int fsdp, int fsdp_rank);

/* Choose the gradient path (after init and mt_grad_sync_set_tensor, before
 * mt_grad_sync_add_to_plan; without this call the path is MT_GRAD_FULL), by the rules
 * of the header comment: fsdp = 1 when the parameters are fsdp-sharded; chunk = floats
 * of the fp32 chunk window of MT_GRAD_WINDOW_ACC (clipped to numel; the trainer passes
 * the largest parameter so that chunks of whole parameters fit). Afterwards, when
 * g->path != MT_GRAD_FULL, the caller installs mt_grad_sync_window as the model's
 * gradient sink with g as its context (models/model.h mt_model_set_grad_sink).
 * Errors: MT_ERR_INVALID (chunk < 1). */
mt_status mt_grad_sync_set_path(mt_grad_sync *g, int fsdp, int64_t chunk);

/* Before each micro-batch's backward on a window path: mb = 0, 1, ... K - 1. */
void mt_grad_sync_set_microbatch(mt_grad_sync *g, int64_t mb);

/* The gradient sink (mt_grad_sink_fn of models/model.h; ctx = the mt_grad_sync): this
 * micro-batch's fp32 gradient of the flat range [offset, offset + numel) in w. Window
 * paths only. MT_GRAD_WINDOW_ACC: folded into the accumulator (fp32 add, one rounding);
 * MT_GRAD_WINDOW_RS: summed over the tensor group (replicated ranges once; w is
 * scratch), reduce-scattered (each rank's shard part of the range) and, with K > 1,
 * added into the shard accumulator. add = 1 (a tied embedding's second share, the
 * lookup's, of rows the loss handed over already): folded into the accumulator, or
 * reduce-scattered in place in w and added into the shard (K = 1: one fp32 add) or the
 * shard accumulator (K > 1), never overwriting the first share; with grad_dtype
 * bfloat16 and K > 1 those rows would be rounded once per share, which the trainer
 * avoids (mt_grad_sync_exact_shares). Errors: MT_ERR_INVALID (range outside
 * numel, no window path), MT_ERR_RUNTIME (a collective failed). */
mt_status mt_grad_sync_window(void *ctx, int64_t offset, int64_t numel, float *w, int add);

/* 1 when mt_grad_sync_window adds a second share of a range (add = 1) with the fp32
 * sum's rounding alone: fp32 accumulation (grad_dtype float32, or one micro-batch, whose
 * shard is fp32); 0 when each hand-over is rounded into a bfloat16 accumulator. The
 * trainer tells the model (models/model.h mt_model_set_grad_sink_shares), so that with
 * a bfloat16 accumulator a tied embedding's rows are rounded once per micro-batch. */
int mt_grad_sync_exact_shares(const mt_grad_sync *g);

/* 1 when the gradient path can overlap its reduce-scatters with the backward: the path
 * is MT_GRAD_WINDOW_RS and the data x fsdp x context group has more than one rank
 * (there is a collective to overlap). */
int mt_grad_sync_overlaps(const mt_grad_sync *g);

/* Overlap on (after mt_grad_sync_set_path; on = 1 needs mt_grad_sync_overlaps):
 * mt_grad_sync_window then only starts a window's reduce-scatter and
 * mt_grad_sync_window_wait completes it. The caller installs mt_grad_sync_window_wait
 * as the model's sink wait (models/model.h mt_model_set_grad_sink_wait), which gives
 * the model a second layer window so that the next parameter's backward overlaps one
 * parameter's reduce-scatter (Megatron-LM's overlap_grad_reduce; PyTorch FSDP's reduce-scatter
 * stream). Errors: MT_ERR_INVALID (on without an overlapping path). */
mt_status mt_grad_sync_set_overlap(mt_grad_sync *g, int on);

/* The model's sink wait (mt_grad_sink_wait_fn; ctx = the mt_grad_sync): complete the
 * reduce-scatter in flight on window w (every window when w is NULL) and, with K > 1,
 * add this rank's part into the shard accumulator (the same fp32 add and rounding as
 * the blocking path, so results are bitwise those of the blocking path). A window with
 * nothing in flight is a no-op. Errors: those of mt_comm_wait (a failed or timed-out
 * collective) and of the accumulation; after an error the other windows in flight are
 * still completed. */
mt_status mt_grad_sync_window_wait(void *ctx, const float *w);

/* MT_GRAD_WINDOW_ACC without ZeRO-1, after mt_grad_sync_finish (whose *out is then
 * NULL): the reduced gradient [a, a + n) converted to fp32 in the chunk window
 * (*out[n], valid until the next call; n <= g->chunk). The optimizer reads the
 * gradient this way, a chunk of whole parameters at a time.
 * Errors: MT_ERR_INVALID (another path, range outside numel or longer than chunk). */
mt_status mt_grad_sync_read(mt_grad_sync *g, int64_t a, int64_t n, float **out);

/* Elements of the optimizer state on this rank: hi - lo. */
int64_t mt_grad_sync_opt_numel(const mt_grad_sync *g);

/* Add the buffers of the header comment (phases [0, last_phase]). */
mt_status mt_grad_sync_add_to_plan(mt_grad_sync *g, mt_plan *plan, int last_phase);
mt_status mt_grad_sync_bind(mt_grad_sync *g, const mt_arena *arena, const mt_plan *plan);

/* After micro-batch `mb` (0-based) of a step: grads[numel] holds this micro-batch's
 * gradient (on mb == 0) or, with once + float32, the running sum. Folds it into the
 * accumulator of the schedule; may zero grads for the next micro-batch.
 * *zero_grads (out) says whether grads must be zeroed before the next backward.
 * On a window path it does nothing (grads may be NULL): the sink did the work. */
mt_status mt_grad_sync_microbatch(mt_grad_sync *g, float *grads, int64_t mb, int *zero_grads);

/* After the last micro-batch: the group's summed gradient. Without ZeRO-1 it is
 * all-reduced into grads[numel] and *out = grads; with ZeRO-1 *out = the fp32 shard
 * [hi - lo] (grads is used as scratch). Window paths (grads may be NULL): ZeRO-1 /
 * fsdp *out = the fp32 shard; MT_GRAD_WINDOW_ACC without ZeRO-1 *out = NULL and the
 * reduced gradient is read with mt_grad_sync_read. */
mt_status mt_grad_sync_finish(mt_grad_sync *g, float *grads, float **out);

/* ZeRO-1: every rank updated params[lo, hi); all-gather so every rank has all of
 * params[numel]. No-op without ZeRO-1. fsdp (mt_grad_sync_set_fsdp): params is the
 * fsdp shard [fhi - flo] of which this rank updated [lo - flo, hi - flo); the sub-shards
 * are all-gathered over the replica group (no-op when it is one rank). */
mt_status mt_grad_sync_gather_params(mt_grad_sync *g, float *params);

/* Gather a sharded fp32 state (this rank's [hi - lo] values in `shard`) into
 * full[numel] on every rank (checkpoints of sharded moments; under fsdp also the
 * parameters, shard = the model's fsdp shard + (lo - flo)). */
mt_status mt_grad_sync_gather(mt_grad_sync *g, const float *shard, float *full);

/* The bytes formula of the header comment for the gradient and parameter
 * collectives of one step with K micro-batches (scalars excluded). */
uint64_t mt_grad_sync_step_bytes(const mt_grad_sync *g, int64_t K);

/* Bytes of handing the range [a, a + n) to mt_grad_sync_window once more per
 * micro-batch (a tied embedding's second share: models/model.h mt_model_grad_twice),
 * K micro-batches: on MT_GRAD_WINDOW_RS the tensor all-reduce of 4n bytes (tensor axis
 * of more than one rank) and the reduce-scatter of the range less this rank's part
 * (parallel/comm.h accounting), K times (once with K = 1); 0 on the other paths, which
 * communicate at finish, not per window. */
uint64_t mt_grad_sync_range_bytes(const mt_grad_sync *g, int64_t a, int64_t n, int64_t K);

#ifdef __cplusplus
}
#endif
#endif
