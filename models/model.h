/* models/model.h: the decoder, its parameters, and its hand-written backward.
 *
 * One decoder for every family (models/config.h). Per layer (Hugging Face order):
 *   h = x + [post_attn_norm]( o_proj( attn( rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1) ) ) ),
 *       n1 = input_layernorm(x)  (gemma3: q_norm / k_norm on each head before RoPE)
 *   y = h + [post_ffw_norm]( down_proj( act(gate_proj(n2)) * up_proj(n2) ) ),
 *       n2 = post_attention_layernorm(h)  (gemma2/3: pre_feedforward_layernorm)
 * then model.norm and the vocab-tiled loss (kernels/tiled_loss.h) against
 * lm_head.weight, or model.embed_tokens.weight when logits_via_embedding.
 * References: HF transformers modeling_llama.py, modeling_gemma.py, modeling_gemma2.py,
 * modeling_gemma3.py.
 *
 * Memory: the model contributes every buffer it uses to an mt_plan (parameters,
 * gradients, saved activations per layer, scratch, loss tile, token buffers) and
 * works only inside the arena the caller allocates from that plan.
 *
 * Phases of a step (lifetimes in the plan), for L layers:
 *   0 embed, 1 + l forward of layer l, L + 1 loss, L + 2 + (L - 1 - l) backward of
 *   layer l, 2L + 2 embedding backward, 2L + 3 optimizer.
 * mt_model_phase_count() returns 2L + 4. */
#ifndef MT_MODELS_MODEL_H
#define MT_MODELS_MODEL_H

#include <stdint.h>
#include "kernels/backend.h"
#include "models/config.h"
#include "parallel/comm.h"
#include "models/remat.h"
#include "runtime/plan.h"
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_IGNORE_LABEL (-1) /* labels equal to this are padding: no loss, no gradient */
#define MT_PARAM_NAME_MAX 96

/* One named parameter tensor inside the flat parameter buffer. Names and shapes are
 * Hugging Face's (linear weights [out, in]). */
typedef struct mt_param_info {
    char name[MT_PARAM_NAME_MAX];
    int ndim;             /* 1 or 2 */
    int64_t shape[2];
    int64_t offset;       /* element offset in the flat buffer */
    int64_t numel;
    int weight_decay;     /* 1 for matrices (ndim == 2), 0 for norm scales */
    int buffer;           /* 1: a constant held with the parameters so that checkpoints carry it
                           * (gemma4's layer_scalar, a transformers buffer): its gradient is
                           * always 0 and it has no weight decay, so AdamW leaves it unchanged */
} mt_param_info;

typedef struct mt_model mt_model;

/* How this rank's model is cut and computed: everything that shapes the plan and is
 * fixed for the model's life, given once to mt_model_create. A zeroed layout (or a
 * NULL one) is one process, float32, no packing, parameters on the device; an axis
 * size of 0 counts as 1. Communicators may be NULL when only planning.
 *
 * Tensor parallelism (tensor_*: the tensor group, its size T and this rank), Megatron-LM's
 * split (Shoeybi et al. 2019): this rank computes query/kv heads [rank*H/T, ...), mlp
 * columns [rank*F/T, ...) and vocabulary rows [rank*V/T, ...) of the loss
 * (parallel/vocab_loss.h); o_proj / down_proj outputs and the column-parallel input
 * gradients are all-reduced over the group. Parameters and gradients keep the full flat
 * layout: this rank's gradient holds its slices of the split matrices, its embedding
 * rows' share (the embedding backward runs on rank 0 only) and the 1-D norm gradients
 * (with gemma4 the per-layer-input parameters too), which are identical on every rank
 * (mt_model_tp_grad_replicated): summing the group's
 * gradients with the replicated ones taken from one rank gives the full gradient.
 * Activation buffers shrink to the local heads / mlp columns / vocab slice.
 *
 * Sequence parallelism (sequence_parallel, Korthikanti et al. 2022, section 4.2.2) on the
 * tensor group; off, or a group of one, leaves the model as it is. The residual stream
 * (layer inputs and outputs, norms, residual adds, their gradients) holds only this
 * rank's block of N / tp of the N local rows (N = batch x local sequence); norm outputs
 * are all-gathered before the column-parallel GEMMs and the row-parallel outputs
 * reduce-scattered instead of all-reduced (and the mirror image in the backward). The
 * 1-D norm gradients then cover this rank's rows only, so none is replicated
 * (mt_model_tp_grad_replicated returns 0) and every rank adds its rows' embedding
 * gradient. Results equal the plain tensor-parallel run up to fp32 summation order.
 *
 * Context parallelism (context_*: group, size C, rank, ring). The caller still passes
 * whole sequences (tokens, labels [batch * seq]); the model keeps chunks rank and
 * 2C-1-rank of the 2C chunks of each sequence (causal load balance), RoPE and the mask
 * follow the original positions, K/V are all-gathered over the group for the attention
 * and their gradients reduce-scattered back (ring = 0), or (ring = 1) passed around the
 * group block by block with an online-softmax merge, their gradients travelling with
 * them. Loss sums and gradients cover this rank's rows only: the caller sums them over
 * the context group (with data). mt_model_hidden / mt_model_logits are
 * MT_ERR_UNSUPPORTED under it.
 *
 * fsdp (fsdp_*: group, size, rank). The flat parameter buffer is cut into equal shards
 * (rank r: [r p, (r + 1) p) with p = ceil(numel / size), clipped: the fsdp shards of
 * parallel/zero1.h); the plan holds this rank's shard ("params.shard") and the windows
 * of the host-offload path (two layers, plus embedding / final norm / head), which are
 * filled by all-gathers over the group: the global window at the start of each
 * forward, layer l's window (slot l % 2) before its forward, and again before its
 * backward when layer l + 2 reused the slot; the layer gathers are prefetched (started
 * asynchronously, mt_comm_all_gather_start, while the previous layer computes: l - 1 in
 * the forward, l + 1 in the backward, and waited for before use), so no window beyond
 * these is needed. mt_model_params then returns the shard (element i is flat element
 * lo + i, mt_model_fsdp_range); mt_model_grads stays the full buffer, which the caller
 * reduce-scatters (ZeRO-1), unless a gradient sink reduce-scatters it window by window
 * (mt_model_set_grad_sink; the trainer does). mt_model_init_params writes the shard of
 * the same values. With param_offload the shard lives in the host pool.
 * With weight_windows (param_window_unit=weight) the two layer windows hold a segment of
 * a layer each instead (consecutive parameters packed up to the largest one's numel:
 * about one weight, "params.window.weight0/1"), filled in the order the layer code
 * reads them (under fsdp the next one prefetched; with offload alone each is a copy
 * when it is needed); with remat the backward fills again the segments it reads after
 * they left the two slots (models/model_windows.c). With grad_window_chunks = k > 1 and
 * a gradient sink, each 2-D layer weight's gradient is handed over in k row blocks
 * (models/model_windows.c mtm_weight_grad), so the layer gradient windows are 1/k of
 * the largest weight (refused with a tensor axis: MT_ERR_UNSUPPORTED).
 *
 * Document masking (packing, packing_separator: config keys packing,
 * packing_separator_id). With packing != 0 every sequence of the caller's tokens is
 * read as documents that each start with the token `packing_separator` (BOS): row t of
 * sequence b belongs to segment id = number of separators in tokens[b, 0..t] (rows
 * before the first separator continue a document of an earlier window, id 0).
 * Attention then stays inside a segment (ops.h mt_attn_args q_seg / k_seg; MaxText's
 * packing: segment ids and AttentionOp.generate_attention_mask in
 * MaxText/layers/attentions.py) and RoPE takes per-document positions (t minus the row
 * of the document's separator, or t in segment 0; MaxText's inputs_position; RoPE
 * scores depend on position differences only, so this changes rounding, not the math,
 * and keeps the angles those of a document trained alone). The loss is unchanged: every
 * label counts, including the separator that ends a document's last row (the
 * end-of-document prediction; MaxText masks only padding, targets_segmentation == 0, in
 * MaxText/train.py loss_fn). Under context parallelism every rank derives the ids of
 * all rows from the whole tokens it is given, so the key ids that go with gathered or
 * ringed K/V need no communication. packing = 0 changes nothing, bitwise. The plan
 * then holds the int32 buffers segment_ids and document_positions [batch * seq], and
 * cp.k_segment_ids under context parallelism. A decode model ignores it.
 *
 * Compute dtype (dtype): MT_F32 or MT_BF16, mixed precision as in Micikevicius et al.
 * 2018 ("Mixed Precision Training") with bf16: the plan then holds a bf16 compute copy
 * of the parameters ("params.compute", numel x 2 bytes) next to the fp32 master
 * ("params"), which every forward refreshes from the master with stochastic rounding
 * (be->ops->from_f32, key mt_model_set_compute_rounding); every activation, saved
 * tensor and activation gradient is bf16 (norm statistics, the attention logsumexp and
 * the loss tile's logits stay fp32, plus a bf16 dlogits tile "loss_tile.dlogits");
 * parameter gradients are fp32 (GEMMs write them in fp32). kernels/ops.h says where
 * each op rounds. Element g of the compute copy is rounded with the bits of its global
 * index, so under fsdp each rank rounds its part of every window it gathers straight
 * from its fp32 master shard into its own place in the window (bitwise the one-process
 * values; no bf16 copy of the shard is kept) and the gather moves 2 bytes per
 * parameter, not the master's 4. The tensor, sequence
 * and context collectives move bf16 activations, and their sums add bf16 partials
 * (parallel/comm.h MT_COMM_BF16; the choice and its error: models/model_shard.c). bf16
 * with parameter host offload is refused (MT_ERR_UNSUPPORTED) by mt_model_add_to_plan,
 * and decoding by mt_model_set_decode.
 *
 * Parameter host offload (param_offload: parameter_memory_host_offload): the flat
 * parameter buffer (mt_model_params) lives in the host pool (mt_model_add_to_host_plan,
 * "params") and the device arena holds two layer windows ("params.window.layer0/1",
 * one layer's parameters each) and a global window (embedding, final norm, head). The
 * forward copies the global window and each layer's parameters into its window
 * (slot l % 2) before use; the backward re-fetches a layer only when its window was
 * reused. Gradients stay on the device. Results are bitwise those without offload.
 * mt_model_params then returns HOST memory: callers move it with the op table's
 * copies, which is only right on the CPU backend (the trainer refuses others). With
 * fsdp the host pool holds this rank's shard ("params.shard") and the windows are
 * all-gathered from the host shards. */
typedef struct mt_model_layout {
    mt_comm *tensor_comm;
    int tensor_size, tensor_rank;
    int sequence_parallel;          /* on the tensor group */
    mt_comm *context_comm;
    int context_size, context_rank;
    int context_ring;               /* context_parallel_strategy=ring */
    mt_comm *fsdp_comm;
    int fsdp_size, fsdp_rank;
    int packing;
    int32_t packing_separator;      /* >= 0, checked even when packing is off */
    mt_dtype dtype;                 /* MT_F32 (0) or MT_BF16 */
    int param_offload;
    int weight_windows;             /* param_window_unit=weight: parameter windows of a weight, not a layer */
    int64_t grad_window_chunks;     /* grad_window_chunks: with a gradient sink, a layer weight's gradient in
                                     * this many row blocks (0 or 1: whole; not with a tensor axis) */
    int64_t vocab_chunks;           /* num_vocab_chunks: 0 = auto (mt_model_vocab_tiling), else 1..vocab_size */
} mt_model_layout;

/* The compute dtype of a layout: float32 or bfloat16, each on every layout (bf16
 * payloads on the tensor, context and fsdp collectives; the bf16 compute copy in the
 * host pool with parameter offload). Checked by mt_model_create and, before any plan, by
 * the trainer's layout check (train/trainer.h mt_trainer_check_layout), so the
 * estimator's mesh search never proposes a layout the model refuses. Only lay's dtype is
 * read. Errors: MT_ERR_INVALID naming a dtype that is neither. */
mt_status mt_model_check_dtype_layout(const mt_model_layout *lay);

/* The memory keys of a layout against the model (and its tensor axis, lay's
 * tensor_size), with the messages users of the trainer see: vocab_chunks > 1 with a
 * tensor axis (the loss is vocabulary-parallel there), grad_window_chunks < 0, or > 1
 * with a tensor axis (a tensor rank writes a slice of each weight's rows or columns,
 * not row blocks), or above the rows of the largest layer weight (a block is at least
 * a row). Checked by mt_model_create and, before any plan, by the trainer's layout
 * check (so the estimator's mesh search counts such layouts as refused). Errors: MT_ERR_INVALID
 * (negative or too many chunks), MT_ERR_UNSUPPORTED (the combinations). */
mt_status mt_model_check_memory_layout(const mt_model_config *cfg, const mt_model_layout *lay);

/* Create a model for micro-batches of `batch` sequences of `seq` tokens, with the
 * loss cut into `num_vocab_tiling` row tiles (0 = auto: mt_model_vocab_tiling), cut
 * and computed as `layout` says (NULL:
 * one process, float32). Allocates no tensor memory. The layout is checked here, in
 * this order: tensor (rank inside the group; heads, kv heads, mlp_dim and vocab_size
 * divisible: the rules and messages of parallel/mesh.h mt_mesh_check_tensor_split),
 * context (rank; seq divisible by 2 x size), sequence parallelism (N divisible by the
 * tensor size), fsdp (rank; at least as many parameters as ranks), dtype (and the
 * layouts it runs on: mt_model_check_dtype_layout), packing separator.
 * Errors: MT_ERR_INVALID (config invalid, batch/seq < 1, tiling < 0 or > batch*seq,
 * vocab_chunks < 0 or > vocab_size, a layout that fails those checks),
 * MT_ERR_UNSUPPORTED (vocab_chunks > 1 with a tensor axis), MT_ERR_OOM.
 *
 * What may still change after creation, before mt_model_add_to_plan:
 * mt_model_set_remat, mt_model_set_grad_sink, mt_model_set_decode; at any time:
 * mt_model_set_compute_rounding. Everything in the layout is fixed. */
mt_status mt_model_create(mt_model **out, const mt_model_config *cfg, mt_backend *be,
                          int64_t batch, int64_t seq, int64_t num_vocab_tiling, const mt_model_layout *layout);
void mt_model_free(mt_model *m);

const mt_model_config *mt_model_get_config(const mt_model *m);
/* The op table the model was created with (for host <-> backend copies of params). */
mt_backend *mt_model_backend(const mt_model *m);
int mt_model_phase_count(const mt_model *m);

/* Add all of the model's buffers to `plan` (not yet finalised). */
mt_status mt_model_add_to_plan(mt_model *m, mt_plan *plan);

/* The loss's row tiles and vocabulary chunks as the model computes them (final once
 * the model is planned: the gradient sink counts). Given (> 0) values are kept (tiles
 * at most the N rows); 0 = auto:
 *   chunks: with parameter windows (fsdp, parameter offload) or a gradient sink, and no
 *     tensor axis, the fewest chunks no larger than the largest decoder-layer weight
 *     (the layer gradient window: mt_model_set_grad_sink; with a sink and
 *     grad_window_chunks, its largest row block), ceil(V D / weight), so that
 *     the embedding's and lm_head's windows and gradient windows cost no more than the
 *     layers'; else 1 (the unembedding whole);
 *   tiles: the fewest row tiles whose loss tile (rows x the vocabulary chunk, or the
 *     tensor rank's slice, x (4 + the activation dtype's bytes if not float32)) is no
 *     larger than, in the activation dtype, that weight when the vocabulary is in
 *     chunks, else one decoder layer's parameters (the size of a layer window), at
 *     least 1 row per tile.
 * Either pointer may be NULL. */
void mt_model_vocab_tiling(const mt_model *m, int64_t *tiles, int64_t *chunks);

/* gemma4: the vocabulary chunks its per-layer embedding table [V, L x P] is looked up and
 * differentiated in (models/model_gemma4.c), as resolved with the loss's (final once the
 * model is planned): 1 whenever the vocabulary is not chunked, else the fewest chunks
 * no larger than the largest decoder-layer weight, ceil(V L P / weight), and at
 * least the vocabulary's; with fsdp or parameter offload each chunk's rows pass through
 * "params.window.vocab.per_layer_embedding", with a gradient sink each chunk's gradient
 * through "grads.window.vocab.per_layer_embedding" to the sink. 0 for a model without
 * per-layer inputs (or m NULL). */
int64_t mt_model_per_layer_input_chunks(const mt_model *m);

/* Remat and offload (models/remat.h). Set before mt_model_add_to_plan; the default
 * keeps every named tensor on the device. Per layer, a tensor whose action is device
 * gets its own plan entry; remat and offload tensors are computed in the forward into
 * one layer-sized scratch ("remat.fwd.<name>", live over the forward phases) and are
 * recomputed from decoder_layer_input, or copied back from the host pool, into one
 * layer-sized scratch ("remat.bwd.<name>", live over the backward phases) before each
 * layer's backward. Results are bitwise those of keeping everything (the same ops on
 * the same inputs). Errors: MT_ERR_INVALID (NULL, already planned, or
 * decoder_layer_input not device). */
mt_status mt_model_set_remat(mt_model *m, const mt_remat_policy *p);

/* Gradient sink: receives the gradient of the flat range [offset, offset + numel) of
 * the parameter layout in grad[numel] (backend memory, float32; for tensor-parallel
 * slices and replicated ranges the same content the full buffer would hold there).
 * add = 0: the range's first hand-over in this backward; add = 1: a second share of a
 * range already handed over in this backward, which the sink adds to the first (only
 * the tied embedding's vocabulary chunks, see below). The window is the model's: read
 * or reduce it before returning; it is overwritten after. A non-OK status stops the
 * backward and is returned by it. */
typedef mt_status (*mt_grad_sink_fn)(void *ctx, int64_t offset, int64_t numel, float *grad, int add);

/* Gradient windows, before planning (fn NULL turns them off again). The plan
 * then holds no full "grads" buffer (mt_model_grads returns NULL) but fp32 windows,
 * each live only while its gradients are written:
 *   "grads.window.layer"      one decoder-layer parameter (the largest of any layer:
 *                             a layer's gradient goes over one parameter at a time),
 *                             the layers' backward phases L + 2 .. 2L + 1;
 *   "grads.window.tail"       model.norm (+ lm_head), flat [model.norm offset, numel),
 *                             the loss phase L + 1 (the loss writes lm_head, then the
 *                             final norm's backward);
 *   "grads.window.embedding"  the embedding, phase 2L + 2, or from the loss phase on
 *                             when it is tied (logits_via_embedding: the loss adds to
 *                             it too, so it lives through the whole backward);
 *   "grads.window.per_layer_inputs"  gemma4 with per-layer inputs: the per-layer
 *                             embedding, its projection and norm (flat, right after the
 *                             embedding), phase 2L + 2.
 * With the vocabulary in chunks (mt_model_vocab_tiling) the embedding's and the
 * unembedding's gradients come a chunk of rows at a time instead, through
 * "grads.window.vocab.lm_head" (the loss phase: the unembedding's rows, lm_head's or,
 * tied, the embedding's) and "grads.window.vocab.embedding" (phase 2L + 2: the
 * lookup's rows), and the tail window holds model.norm alone; no window of the whole
 * [V, D] table is planned, tied or not.
 * Each backward (mt_model_forward_backward, mt_model_backward_hidden) zeroes a window
 * before its first write and calls fn once its gradient is complete (tensor-axis
 * collectives included): fn(ctx, model.norm offset, numel - that, tail) after the final
 * norm's backward, fn(ctx, offset of parameter i, its numel, its window) for every
 * parameter of layer l as its gradient is complete in layer l's backward (l = L-1 .. 0;
 * in the order the backward writes them, then as zeros those it does not write:
 * gemma4's layer_scalar), (gemma4) fn(ctx, embedding numel,
 * their numel, per-layer-input window) when those are complete, fn(ctx, 0, embedding
 * numel, embedding window) after the embedding backward; in chunks, each unembedding
 * chunk as the loss finishes it (before the tail) and each embedding chunk after the
 * embedding backward of its rows. So a backward hands over THIS micro-batch's gradient
 * (times dscale), each element exactly once with add = 0, each element bitwise what the
 * full buffer would have received; except a tied embedding in vocabulary chunks, whose
 * rows are handed over twice: the loss's share h (add = 0, in the loss phase) and the
 * lookup's share e (add = 1, summed from zero), so their sum is h + e in another order
 * than the full buffer's ((h + e_1) + e_2 ...: the rounding of one fp32 sum more; a
 * tied table does not stay whole for it, unless the sink says it cannot add shares
 * exactly: mt_model_set_grad_sink_shares). The caller accumulates or reduces it
 * (parallel/zero1.h). Works with every parallel layout, remat / offload and parameter
 * host offload. Errors: MT_ERR_INVALID (NULL model, already planned), MT_ERR_OOM. */
mt_status mt_model_set_grad_sink(mt_model *m, mt_grad_sink_fn fn, void *ctx);

/* Whether the sink adds a second share of a range (mt_grad_sink_fn's add) with no
 * rounding but the fp32 sum's: 1 (the default of mt_model_set_grad_sink) lets a tied
 * embedding in vocabulary chunks hand its rows over in two shares; 0 (a sink that
 * rounds each hand-over, e.g. into a bfloat16 accumulator: parallel/zero1.h
 * mt_grad_sync_exact_shares) keeps a tied embedding's gradient in one whole window
 * ("grads.window.embedding", from the loss phase on) so that its rows are handed over
 * once, as without chunks. After mt_model_set_grad_sink, before planning.
 * Errors: MT_ERR_INVALID (NULL model, already planned, no sink set). */
mt_status mt_model_set_grad_sink_shares(mt_model *m, int exact);

/* The range of the flat parameters a backward hands to the sink twice (add = 0, then
 * add = 1: a tied embedding in vocabulary chunks, mt_grad_sink_fn): returns its numel
 * and sets *offset, or returns 0 (no such range; m NULL, unplanned or without a sink). */
int64_t mt_model_grad_twice(const mt_model *m, int64_t *offset);

/* Completes the sink's work on a handed-over window: window w (NULL: every window). */
typedef mt_status (*mt_grad_sink_wait_fn)(void *ctx, const float *window);

/* Asynchronous gradient sink, after mt_model_set_grad_sink and before planning (wait
 * NULL turns it off again): fn may return while its work on the window is still in
 * flight (a reduce-scatter overlapping the next parameter's backward). The plan then
 * holds a second layer window, "grads.window.layer.overlap" (same size and phases as
 * "grads.window.layer"; the layer parameters alternate between the two in the order
 * they are handed over), so that the sink's work on one parameter overlaps the backward
 * of the next. Each backward calls wait(ctx, window) before it zeroes a layer window it
 * handed over earlier, wait(ctx, tail) right after handing
 * over the tail (its window is planned for the loss phase only), wait(ctx, NULL) after
 * the last layer (before the embedding's backward: the layer windows end there) and
 * again after handing over the embedding's window; when a backward returns the sink
 * has finished with every window. Results are those of a synchronous sink.
 * Errors: MT_ERR_INVALID (NULL model, already planned, no sink set). */
mt_status mt_model_set_grad_sink_wait(mt_model *m, mt_grad_sink_wait_fn wait);

/* The compute dtype of the layout. */
mt_dtype mt_model_dtype(const mt_model *m);

/* The key of the compute copy's stochastic rounding (dtype bfloat16): element i of the
 * flat parameter buffer is rounded with the Philox bits of (seed, offset t * numel + i)
 * (kernels/ops.h from_f32), so the compute weights are a pure function of the master
 * weights, seed and t. The trainer passes its seed and the number of updates applied so
 * far (0 before the first), so a resumed run refreshes them bitwise as the uninterrupted
 * one. Default (0, 0). No effect with float32. */
void mt_model_set_compute_rounding(mt_model *m, uint64_t seed, int64_t t);

/* Bytes of named tensor t of ONE layer as saved for the backward (context includes
 * its logsumexp; mlpwo is 0 for models without a post-MLP norm, which never need
 * it). The per-row norm statistics (rstd) are always kept and belong to no name. */
int64_t mt_model_remat_tensor_bytes(const mt_model *m, mt_remat_tensor t);

/* Add the host pool of offloaded tensors to `host_plan` (a plan of its own, allocated
 * apart from the device arena): "layers.<l>.<name>" for every offloaded tensor,
 * category MT_MEM_ACTIVATIONS, live from the layer's forward to its backward. Adds
 * nothing when no tensor is offloaded. Call after mt_model_add_to_plan. */
mt_status mt_model_add_to_host_plan(mt_model *m, mt_plan *host_plan);

/* Point the offload slots into `host_arena` (allocated from the finalised host plan).
 * A model with offloaded tensors refuses to run until this is done. */
mt_status mt_model_bind_host(mt_model *m, const mt_arena *host_arena, const mt_plan *host_plan);

/* This rank's fsdp shard [lo, hi) of the flat buffer ([0, numel) without fsdp). */
void mt_model_fsdp_range(const mt_model *m, int64_t *lo, int64_t *hi);

/* Parameters (elements) this rank sends in the fsdp all-gathers of one
 * mt_model_forward_backward (parallel/comm.h accounting: each gather of a range of S
 * elements costs S minus this rank's part of it); 0 without fsdp. The gathers move the
 * compute dtype: 4 bytes per element with float32 (the master), 2 with bfloat16 (the
 * compute copy), mt_dtype_size(mt_model_dtype(m)). With weight windows the count
 * depends on the remat policy (what the backward recomputes reads weights again) and
 * is only known once the model is planned (mt_model_add_to_plan). */
int64_t mt_model_fsdp_gather_floats(const mt_model *m);

/* Bytes this rank sends on the tensor and context groups in one
 * mt_model_forward_backward under the remat policy set (the formulas at the top of
 * models/model_shard.c, what the backward recomputes included: the out_proj / mlpwo
 * partial sums, the input norm's gather under sequence parallelism, the attention's
 * K/V again); 0 with neither axis. */
uint64_t mt_model_shard_bytes(const mt_model *m);

/* 1 when parameter i's gradient is identical on every rank of the tensor group (the
 * 1-D norm scales except q_norm / k_norm, and gemma4's per-layer-input parameters:
 * the per-layer embedding, its projection and norm, each layer's per_layer_input_gate,
 * per_layer_projection and post_per_layer_input_norm), 0 otherwise, under sequence
 * parallelism and without tensor parallelism. */
int mt_model_tp_grad_replicated(const mt_model *m, int i);

/* Point the model's buffers into `arena` (allocated from the finalised plan). */
mt_status mt_model_bind(mt_model *m, const mt_arena *arena, const mt_plan *plan);

/* Parameter table, flat parameter and gradient buffers (backend memory, float32,
 * mt_model_numel elements each, same layout). mt_model_grads is NULL with a gradient
 * sink (mt_model_set_grad_sink). mt_model_numel is mt_model_num_parameters plus the
 * buffers held with the parameters (mt_param_info.buffer: gemma4's L layer_scalars). */
int mt_model_param_count(const mt_model *m);
const mt_param_info *mt_model_param(const mt_model *m, int i);
int mt_model_param_find(const mt_model *m, const char *name); /* index or -1 */
int64_t mt_model_numel(const mt_model *m);
float *mt_model_params(mt_model *m);
float *mt_model_grads(mt_model *m);

/* Deterministic initialisation from `seed`: matrices N(0, 0.02^2) (Philox stream =
 * parameter index), norm scales 1 (Llama, Gemma 4, and gemma4's layer_scalar) or 0
 * (Gemma 1-3, scale 1 + w). */
mt_status mt_model_init_params(mt_model *m, uint64_t seed);

/* Forward and backward of one micro-batch. tokens and labels are host int32
 * [batch * seq]; labels equal to MT_IGNORE_LABEL are ignored. Gradients of the
 * *summed* token loss times `dscale` are ADDED to mt_model_grads (zero it first), or
 * with a gradient sink handed to it window by window;
 * *loss_sum gets the summed loss (fp64) and *count the number of labelled tokens.
 * Errors: MT_ERR_INVALID naming a token or label outside [0, vocab_size). */
mt_status mt_model_forward_backward(mt_model *m, const int32_t *tokens, const int32_t *labels,
                                    float dscale, double *loss_sum, int64_t *count);

/* The step statistics in backend memory: double[MT_MODEL_STATS] (plan entry
 * "step_stats", live the whole step) = {loss sum, labelled count, gradient sum of
 * squares, spare}. mt_model_forward_backward_acc ADDS a micro-batch's loss and count
 * to [0] and [1] without any host synchronisation; the trainer zeroes them at the start
 * of a step, accumulates the gradient norm's squares into [2] (be->ops->sumsq) and
 * reads all of them with one copy_to_host per step. NULL before mt_model_bind. */
#define MT_MODEL_STATS 4
double *mt_model_step_stats(mt_model *m);

/* mt_model_forward_backward without the read: the loss sum and count are added to
 * mt_model_step_stats [0] and [1] (backend memory). Errors: as mt_model_forward_backward. */
mt_status mt_model_forward_backward_acc(mt_model *m, const int32_t *tokens, const int32_t *labels, float dscale);

/* Forward and loss only (evaluation). Same outputs, gradients untouched. */
mt_status mt_model_loss(mt_model *m, const int32_t *tokens, const int32_t *labels,
                        double *loss_sum, int64_t *count);

/* Forward only; copies the final hidden states (after model.norm) to host
 * hidden[batch * seq, emb_dim]. */
mt_status mt_model_hidden(mt_model *m, const int32_t *tokens, float *hidden);

/* Backward from a caller-supplied gradient of the final hidden states: dhidden is host
 * float32 [batch * seq, emb_dim], d(loss)/d(hidden) for the hidden states (after
 * model.norm) of the preceding forward. ADDS to mt_model_grads (with a gradient sink:
 * hands to it, window by window) the VJP through
 * model.norm, every layer (in reverse, with the remat policy's recompute / restore and
 * the tensor-parallel collectives) and the embedding: exactly the backward that
 * mt_model_forward_backward runs after its loss, from the same code, so the
 * unembedding gets no gradient here (the caller's loss owns it, e.g. the tiled loss
 * with dW). The forward is the last mt_model_hidden or mt_model_loss on this model
 * (with the same parameters: writing mt_model_params in between is the caller's
 * error); both keep every activation the backward needs. A backward consumes it:
 * mt_model_forward_backward, mt_model_backward_hidden, mt_model_logits,
 * mt_model_init_params and mt_model_bind leave no forward to differentiate. Under
 * tensor parallelism every rank of the group passes the same dhidden (the embedding
 * gradient is added on rank 0, as in mt_model_forward_backward).
 * Errors: MT_ERR_INVALID (NULL, no forward to differentiate), MT_ERR_UNSUPPORTED
 * (context parallelism, like mt_model_hidden), MT_ERR_RUNTIME (a tensor-axis
 * collective failed). */
mt_status mt_model_backward_hidden(mt_model *m, const float *dhidden);

/* Forward only; copies logits (after the final soft-cap) of every row to host
 * logits[batch * seq, vocab_size], computed tile by tile. For tests and sampling. */
mt_status mt_model_logits(mt_model *m, const int32_t *tokens, float *logits);

/* ---- incremental decoding with a KV cache (sampling) ----
 * A decode model is created with batch 1 and seq = T (the cache length: the most
 * tokens one sequence may feed) and mt_model_set_decode(m, 1) before
 * mt_model_add_to_plan. Its plan then holds only "params" and the "decode.*" entries,
 * each live over the whole step (phases 0 .. 2L + 3), so the arena is exactly the plan:
 *   decode.kv_cache.key, decode.kv_cache.value   float32 [L, 1, T, Hkv, Dh] each
 *                         (keys after QK-norm and RoPE, as the attention reads them;
 *                         category activations),
 *   decode.positions int32 [T], decode.token int32 [1], decode.rope_inv_freq [Dh],
 *   decode.residual / normed / out [D], query / context [H*Dh], tmp [max(D, H*Dh)],
 *   rstd [H], context_lse [H], gate / up / glu [mlp_dim], logits [V]  (scratch).
 * The training entry points (mt_model_forward_backward, mt_model_loss,
 * mt_model_hidden, mt_model_backward_hidden, mt_model_logits) refuse a decode model
 * with MT_ERR_INVALID; mt_model_params, mt_model_init_params and checkpoint loading
 * work as usual. on = 0 turns it off again.
 * Errors: MT_ERR_INVALID (NULL, already planned, batch != 1). mt_model_add_to_plan
 * then returns MT_ERR_UNSUPPORTED under tensor / context / fsdp parallelism,
 * parameter host offload or a gradient sink. */
mt_status mt_model_set_decode(mt_model *m, int on);

/* Empty the KV cache: the next mt_model_decode_step is position 0. Binding does this
 * too. Errors: MT_ERR_INVALID (not a bound decode model). */
mt_status mt_model_decode_reset(mt_model *m);

/* Positions in the KV cache (tokens fed since the last reset / bind); 0 for a model
 * that is not a decode model. */
int64_t mt_model_decode_length(const mt_model *m);

/* Feed `token` (int32 id in [0, vocab_size)) at position t = mt_model_decode_length:
 * run only that row through every layer (the op sequence of the full forward on one
 * row: norms, QK-norm, RoPE at position t with the layer's global / local table),
 * append its rotated key and value to each layer's cache row t, attend over the cached
 * rows with be->ops->attention_fwd (Tq = 1, Tk = rows kept, q_pos = [t], k_pos = their
 * positions; a sliding-window layer passes only its last window rows, which are the
 * only ones its mask allows; attention soft-cap per the config), then the final norm
 * and the logits of that row into host logits[vocab_size] (after the final soft-cap,
 * as mt_model_logits). Row t of mt_model_logits on the same t + 1 tokens is the same
 * up to fp32 summation order (one-row GEMMs, other attention blocks): tests/test_decode.c.
 * Cost per token: one pass over the parameters plus O(layers x t x H x Dh) for the
 * attention, against a whole forward of seq rows (and their logits) per token when
 * recomputing with mt_model_logits.
 * Errors: MT_ERR_INVALID (not a bound decode model, NULL logits, token out of range,
 * cache full: t == seq; nothing is changed then). */
mt_status mt_model_decode_step(mt_model *m, int32_t token, float *logits);

#ifdef __cplusplus
}
#endif
#endif
