/* models/model_internal.h: the private state of a model (models/model.h), shared by the
 * files that implement it, one idea each:
 *   model.c          create / free, the layout check, the parameter table, accessors, init
 *   model_plan.c     the plan entries (sizes, lifetimes), remat policy, binding
 *   model_windows.c  parameter windows (host offload, fsdp) and gradient windows (sink)
 *   model_shard.c    tensor / sequence / context / fsdp collectives and their set-up
 *   model_layers.c   one layer's forward, backward, recompute, offload / restore
 *   model_loss.c     the step: inputs, forward, tiled loss, backward; public entry points
 *   model_decode.c   incremental decoding with a KV cache
 *   model_gemma4.c   Gemma 4's layer (per-layer head dims and MLP widths, KV sharing,
 *                    v_norm, per-layer inputs, layer_scalar) and its per-layer inputs
 * Every file includes this header and no other file of the model: no include circle.
 * Functions shared between the files are prefixed mtm_ (meshtrain model, internal).
 *
 * State is one sub-struct per concern inside struct mt_model; each collective group
 * (tensor, context, fsdp) keeps its own error status: the first failed collective of
 * that group in the current pass (later collectives of the group are skipped, so a
 * pass that failed ends without waiting on peers of a broken communicator). */
#ifndef MT_MODELS_MODEL_INTERNAL_H
#define MT_MODELS_MODEL_INTERNAL_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "models/model.h"
#include "parallel/vocab_loss.h"

/* Activations, compute weights and their gradients are of m->dt (MT_F32 or MT_BF16:
 * the layout's dtype), m->es bytes each; parameter gradients (mtm_gw), the fp32 master,
 * norm statistics (rstd), the attention logsumexp and the loss tile are fp32.
 * AT(m, p, k): element k of an m->dt tensor p. */
#define AT(m, p, k) ((void *)((char *)(p) + (size_t)(k) * (m)->es))

/* ---- buffers that are not per layer (plan ids m->plan.gid, pointers m->plan.gptr) ---- */
enum {
    GB_PARAMS = 0, GB_GRADS,
    GB_TOKENS, GB_LABELS, GB_POSITIONS, GB_INV_FREQ,
    GB_FINAL_INPUT, GB_FINAL_RSTD, GB_FINAL_HIDDEN, GB_FINAL_HIDDEN_GRAD, GB_LOSS_TILE,
    GB_RESID_GRAD,
    GB_FWD_NORM, GB_FWD_RESID, GB_FWD_TMP, GB_FWD_GLU,
    GB_BWD_NORM, GB_BWD_RESID, GB_BWD_D1, GB_BWD_D2, GB_BWD_WORK,
    GB_SEGMENTS, GB_DOC_POS, /* packing only: [N] int32 segment ids, per-document RoPE positions */
    GB_STEP_STATS,           /* double[MT_MODEL_STATS] (mt_model_step_stats) */
    GB_COMPUTE_W,            /* dtype != float32: the compute copy of the parameters, [numel] of dt (fsdp:
                              * of this rank's shard, [hi - lo]; parameter offload: in the host pool) */
    GB_LOSS_DTILE,           /* dtype != float32: the loss tile's dlogits [rows, Vl] of dt */
    GB_LOSS_VOCAB_STATS,     /* tp > 1: the vocab-parallel loss's all-reduce payloads (mt_vocab_loss_scratch_bytes);
                              * vocabulary chunks: the chunked loss's (mt_vocab_chunked_scratch_bytes) */
    GB_LOSS_DH_ACC,          /* vocabulary chunks with dtype != float32: dloss/dh [N, D] fp32, summed over chunks */
    GB_WORKSPACE,            /* the backend's workspace: GEMM and op scratch (ops.h set_workspace, scratch_bytes) */
    GB_COUNT
};

/* ---- parameter windows (parameter host offload, fsdp): two layer slots (layer l in
 * slot l % 2) and the global window (embedding, then model.norm and lm_head), of the
 * compute dtype m->dt (the fp32 master, or its bf16 compute copy); with vocabulary
 * chunks (mtm_vocab_windows) the global window holds model.norm only and the embedding
 * and lm_head rows come one chunk at a time through the two vocabulary windows (the
 * lookup's, phase 0, and the loss's, phase L + 1) ---- */
enum { MT_PWIN_LAYER0 = 0, MT_PWIN_LAYER1, MT_PWIN_GLOBAL, MT_PWIN_VOCAB_EMBED, MT_PWIN_VOCAB_HEAD, MT_PWIN_COUNT };
#define MT_PWIN_LAYER_SLOTS 2

/* ---- gradient windows (gradient sink): one layer, the embedding, the tail (model.norm
 * and lm_head, flat [tail_off, numel)); with vocabulary chunks and an untied head
 * (mtm_vocab_grad_windows) the tail is model.norm only and the embedding's and
 * lm_head's gradients go to the sink one chunk at a time from the two vocabulary
 * windows ---- */
/* Gradient windows. A decoder layer's gradient goes to the sink one parameter at a
 * time: MT_GWIN_LAYER holds one layer parameter's gradient (the largest such tensor,
 * or with grad_window_chunks its largest row block: mtm_grad_window_numel), opened before its first write in the layer's backward
 * (mtm_grad_open) and handed over when the next one opens or the layer ends
 * (mtm_grad_layer_end); with an asynchronous sink the parameters alternate between it
 * and MT_GWIN_LAYER1, so that one's reduce-scatter overlaps the next one's backward. */
enum {
    MT_GWIN_LAYER = 0, MT_GWIN_EMBEDDING, MT_GWIN_TAIL, MT_GWIN_LAYER1, MT_GWIN_VOCAB_EMBED, MT_GWIN_VOCAB_HEAD,
    MT_GWIN_COUNT
};

/* ---- context-parallel buffers (plan names "cp.*", model_plan.c) ---- */
enum {
    CP_STAGE = 0, CP_K, CP_V, CP_DK, CP_DV, /* all_gather: [B, Tg, KVD] each */
    CP_KPOS,                                /* [Tg] int32 (both strategies) */
    CP_RK0, CP_RV0, CP_RK1, CP_RV1,         /* ring: K/V blocks in flight, [B, 2Tc, KVD] */
    CP_RDK0, CP_RDV0, CP_RDK1, CP_RDV1,     /* ring: their travelling gradients */
    CP_ROUT, CP_RLSE,                       /* ring: one block's output [N, QD] / lse [B, H, 2Tc] */
    CP_KSEG,                                /* packing: key segment ids [B, Tg] gathered order, ring:
                                             * [C][B, 2Tc] (block of rank src at src * N) */
    CP_COUNT
};

/* ---- buffers of a decode model (plan names "decode.<name>", model_decode.c) ---- */
enum {
    DEC_KCACHE = 0, DEC_VCACHE, /* [L, 1, T, Hkv, Dh]: rotated keys, values of every cached position */
    DEC_POS,                    /* [T] int32: 0, 1, ..., T - 1 (q_pos / k_pos / RoPE read slices) */
    DEC_TOKEN,                  /* [1] int32: the token of this step */
    DEC_INV_FREQ,               /* [Dh]: global then local RoPE table (as "rope_inv_freq") */
    DEC_X,                      /* [D] residual stream of the new row */
    DEC_NORM,                   /* [D] normalised input of a block, then the final hidden state */
    DEC_Q,                      /* [QD] rotated query */
    DEC_TMP,                    /* [max(D, QD)] pre-QK-norm projection, post-norm output */
    DEC_RSTD,                   /* [max(H, 1)] norm statistics (not needed after the op) */
    DEC_CTX,                    /* [QD] attention output */
    DEC_LSE,                    /* [H] its logsumexp */
    DEC_OUT,                    /* [D] o_proj / down_proj output before a post-norm */
    DEC_GATE, DEC_UP, DEC_GLU,  /* [F] each */
    DEC_LOGITS,                 /* [V] raw logits of the row */
    DEC_COUNT
};

/* Parameter indices of one layer (-1 when absent). gemma4 adds the per-layer-input
 * gate, projection and norm and the layer_scalar (a [1] constant: transformers' buffer,
 * held with the parameters so that checkpoints carry it, never given a gradient); its
 * KV-sharing layers have no k, v, k_norm. */
typedef struct layer_params {
    int in_norm, q, k, v, o, q_norm, k_norm, post_attn_norm, pre_mlp_norm, post_ffw_norm;
    int gate, up, down;
    int ple_gate, ple_proj, ple_norm, scalar;
} layer_params;

/* The parameter table (model.c): Hugging Face names and shapes, one flat layout. */
typedef struct mtm_param_table {
    mt_param_info *info;   /* [count] */
    int count;
    int64_t numel;         /* floats of the flat buffer */
    int embed, final_norm, lm_head; /* indices; lm_head -1 when logits_via_embedding */
    int ple_embed, ple_model_proj, ple_proj_norm; /* gemma4 per-layer inputs, -1 when none */
    layer_params *layer;   /* [L] */
    int *layer_of;         /* [count]: the parameter's layer, -1 for embed / final norm / head */
    int64_t layer_numel;   /* floats of the largest layer (input_layernorm .. mlp.down_proj, contiguous) */
    int64_t weight_numel;  /* floats of the largest single layer parameter (the weight windows' segment cap) */
    int64_t tail_off;      /* flat offset of model.norm: [tail_off, numel) is the tail */
} mtm_param_table;

/* Plan ids and bound pointers (model_plan.c). */
typedef struct mtm_plan_state {
    int planned, bound;
    size_t ws_bytes;       /* "workspace": the GEMM workspace and the ops' scratch (model_plan.c workspace_bytes) */
    int fwd_kept;          /* the saved activations hold a whole forward (mt_model_backward_hidden) */
    int gid[GB_COUNT];
    void *gptr[GB_COUNT];
    int (*lid)[MT_LT_COUNT];     /* [L]: per-layer saved tensors kept on the device, -1 none */
    float *(*lptr)[MT_LT_COUNT];
} mtm_plan_state;

/* Remat / offload (models/remat.h; model_plan.c sizes, model_layers.c runs it). */
typedef struct mtm_remat_state {
    mt_remat_policy policy;
    int has_offload;                       /* some tensor is offloaded */
    int fwd_id[MT_LT_COUNT], bwd_id[MT_LT_COUNT]; /* layer-sized scratch of non-kept tensors */
    float *fwd[MT_LT_COUNT], *bwd[MT_LT_COUNT];
} mtm_remat_state;

/* The host pool (mt_model_add_to_host_plan): offloaded tensors and, with parameter host
 * offload, the parameters (or this rank's fsdp shard of them) and, with dtype bfloat16,
 * their compute copy. */
typedef struct mtm_host_pool {
    int planned, bound;
    int (*act_id)[MT_LT_COUNT];            /* [L]: host entries of offloaded tensors, -1 none */
    float *(*act_ptr)[MT_LT_COUNT];
    int params_id;                         /* "params" / "params.shard", -1 none */
    int compute_id;                        /* dtype != float32: its compute copy, "params.compute" /
                                            * "params.compute.shard" (GB_COMPUTE_W), -1 none */
} mtm_host_pool;

/* The two layer slots of param_window_unit=weight: the segment (its flat start) each
 * holds, -1 none, and the slot opened last (model_windows.c wslots_take). */
typedef struct mtm_wslots {
    int64_t held[MT_PWIN_LAYER_SLOTS];
    int cur;
} mtm_wslots;

/* Parameter windows (model_windows.c): with parameter host offload or fsdp the device
 * holds these instead of the flat parameters. */
typedef struct mtm_param_windows {
    int offload;                           /* the layout's param_offload */
    int id[MT_PWIN_COUNT];
    void *ptr[MT_PWIN_COUNT];              /* of m->dt */
    int64_t layer[MT_PWIN_LAYER_SLOTS];    /* layer held by each layer slot, -1 none */
    /* param_window_unit=weight (mtm_param_open): the two slots hold a segment of a
     * layer each (consecutive parameters of at most seg_max elements) instead of a layer */
    int weights;
    int64_t *seg_a, *seg_n;                /* [par.count]: the flat range of layer parameter i's segment */
    int64_t seg_max;                       /* elements of a slot: the largest segment */
    mtm_wslots slots;                      /* which segment each slot holds */
    int pending;                           /* the slot an fsdp prefetch is filling, -1 none */
    int *order[2];                         /* the forward's / backward's opens (mtm_layer_param_order), */
    int64_t order_n[2];                    /* over the layers in the pass's order (planned) */
    int pass;                              /* 0 forward, 1 backward: the pass running */
    int64_t cursor;                        /* its next entry */
    int open;                              /* the parameter opened last, -1 none */
} mtm_param_windows;

/* Gradient sink (mt_model_set_grad_sink): instead of the full "grads" buffer, the
 * gradient windows MT_GWIN_*. */
typedef struct mtm_grad_sink {
    mt_grad_sink_fn fn;
    mt_grad_sink_wait_fn wait; /* asynchronous sink (mt_model_set_grad_sink_wait), else NULL */
    void *ctx;
    int id[MT_GWIN_COUNT];
    float *ptr[MT_GWIN_COUNT];
    int shares;      /* the sink adds a second share exactly (mt_model_set_grad_sink_shares) */
    int loss_shares; /* the loss of this backward handed the unembedding's chunks over (vocabulary chunks) */
    /* the layer parameter windows (mtm_grad_open, mtm_grad_layer_end) */
    int64_t layer;     /* the layer whose backward writes them, -1 none */
    int open;          /* the parameter whose window is open, -1 none */
    int64_t open_r0, open_r1; /* the rows of it the window holds (all but with grad_window_chunks) */
    float *open_win;   /* its window */
    int64_t chunks;    /* grad_window_chunks: a 2-D layer weight's gradient in this many row blocks */
    uint64_t done;     /* bit i - in_norm: parameter i of the layer handed over (a layer has < 64: layer_params) */
    int64_t handed;    /* layer parameters handed over this backward (the slot of the next: handed % 2) */
} mtm_grad_sink;

/* Vocabulary chunks (num_vocab_chunks; model_loss.c, model_windows.c): the embedding
 * lookup and its backward, and the unembedding inside the loss, taken C row chunks of
 * the vocabulary at a time, chunk c = rows [c V / C, (c + 1) V / C). Resolved when the
 * model is planned (the gradient sink is known then: mtm_vocab_resolve). */
typedef struct mtm_vocab_chunks {
    int64_t req_chunks;    /* num_vocab_chunks as given, 0 = auto */
    int64_t req_tiles;     /* num_vocab_tiling as given, 0 = auto */
    int64_t C;             /* chunks, >= 1 (1: the loss of kernels/tiled_loss.h or parallel/vocab_loss.h) */
    int64_t ple_C;         /* gemma4: chunks of the per-layer embedding table [V, L*P], >= 1 (1 whenever C is 1;
                            * mtm_vocab_resolve states the rule) */
    int64_t tile_rows;     /* rows the loss tile is planned for: >= every tile's (auto: the rule's R) */
} mtm_vocab_chunks;

/* Tensor parallelism and, on its group, sequence parallelism (model_shard.c). The
 * model's H, Hkv, F, QD, KVD are this rank's local sizes; the parameter table keeps
 * the global shapes. */
typedef struct mtm_tensor_state {
    mt_comm *comm;
    int size, rank;
    int64_t Vl, v0;        /* vocabulary slice [v0, v0 + Vl) of the loss */
    int64_t QDg, Fg;       /* global q width and mlp dim (row strides of o_proj, down_proj) */
    int64_t *off;          /* [count]: element offset of this rank's slice of each parameter (NULL: none) */
    mt_status status;      /* first failed collective of the tensor group in the current pass */
    int sp;                /* sequence parallelism */
    int64_t *sp_counts;    /* [size]: elements of each rank's residual rows (N / tp x D) */
} mtm_tensor_state;

/* Context parallelism (model_shard.c). The model's T and N are this rank's local rows
 * (chunks rank and 2C-1-rank of every sequence); m->Tg the caller's sequence length. */
typedef struct mtm_context_state {
    mt_comm *comm;
    int size, rank;
    int ring;              /* context_parallel_strategy=ring */
    int32_t *tok, *lab;    /* host [N]: this rank's rows of the caller's [B, Tg] (allocated by bind) */
    int32_t *kpos_host;    /* [Tg]: original positions of the gathered keys */
    int id[CP_COUNT];
    void *buf[CP_COUNT];
    mt_status status;      /* first failed collective of the context group in the current pass */
} mtm_context_state;

/* fsdp (model_shard.c): the parameter windows are filled by all-gather from the ranks'
 * shards; GB_PARAMS holds this rank's shard [lo, hi) of the flat buffer (rank r:
 * [r * per, (r + 1) * per) clipped to numel). */
typedef struct mtm_fsdp_state {
    mt_comm *comm;
    int size, rank;
    int64_t lo, hi, per;
    int64_t *counts;       /* [size] all-gather counts scratch */
    mt_comm_request *req;  /* the prefetch in flight (its layer's window slot is set), or NULL */
    mt_status status;      /* first failed collective of the fsdp group in the current pass */
} mtm_fsdp_state;

/* Document masking (the layout's packing): host scratch for the ids and positions
 * derived from the caller's tokens, allocated by mt_model_bind (model_loss.c fills it). */
typedef struct mtm_packing {
    int on;
    int32_t sep;
    int32_t *seg, *pos;    /* [B, Tg]: the whole window's ids / document positions */
    int32_t *lseg, *lpos;  /* [N]: this rank's rows (context parallelism), else NULL */
    int32_t *kseg;         /* [B * Tg]: key ids in the gathered (or ring block) order */
} mtm_packing;

/* Incremental decoding (mt_model_set_decode, model_decode.c): the plan holds the
 * parameters, the KV caches and one token's scratch (DEC_*) instead of the step's. */
typedef struct mtm_decode {
    int on;
    int64_t len;           /* positions in the cache (the next token's position) */
    int id[DEC_COUNT];
    void *buf[DEC_COUNT];
} mtm_decode;

/* ---- Gemma 4 buffers (plan names "gemma4.*", model_plan.c; model_gemma4.c uses them):
 * N rows, P = per_layer_input_dim, L layers, Dh = the largest head dim ---- */
enum {
    G4_PLE_ALL = 0,  /* [N, L*P] the per-layer inputs (HF per_layer_inputs after project_per_layer_inputs) */
    G4_PLE_DALL,     /* [N, L*P] their gradient (forward: the scaled-embedding temporary) */
    G4_PLE_TMP,      /* [N, L*P] backward temporary (the projection's gradient) */
    G4_PLE_ROWRSTD,  /* [N*L] fp32 per_layer_projection_norm statistics */
    G4_PLE_A, G4_PLE_B, G4_PLE_C, /* [N, P] a layer's gate / input / product temporaries (the backward writes the
                                   * gate's and the input's gradients over A and B: glu_bwd in place) */
    G4_YMID,         /* [N, D] the layer output before the per-layer input (backward) */
    G4_O,            /* [N, D] per_layer_projection output */
    G4_RSTD,         /* [N] fp32 post_per_layer_input_norm statistics */
    G4_VRSTD,        /* [N*Hkv] fp32 v_norm statistics */
    G4_VZERO,        /* [Dh] zeros: v_norm's weight (scale 1 + 0: no weight) */
    G4_VDW,          /* [Dh] fp32 the discarded gradient of that weight */
    G4_IDENT,        /* [P, P] identity: a strided column slice as a GEMM */
    G4_SKV_DK0, G4_SKV_DV0, G4_SKV_DK1, G4_SKV_DV1, /* [N, KVD] shared K/V gradients of the local (0) and global (1) donor */
    G4_GWIN_PLE,     /* fp32 gradient window of the per-layer-input globals (with a gradient sink; with
                      * mtm_g4_ple_grad_windows without the per-layer embedding table: mtm_g4_ple_window) */
    G4_PWIN_PLE,     /* their parameter window, of the compute dtype (fsdp, parameter offload; with
                      * mtm_g4_ple_windows likewise without the table) */
    G4_GWIN_PLE_VOCAB, /* [ceil(V / ple_C), L*P] fp32: one chunk of the table's gradient (mtm_g4_ple_grad_windows) */
    G4_PWIN_PLE_VOCAB, /* [ceil(V / ple_C), L*P] of the compute dtype: one chunk of its rows (mtm_g4_ple_windows) */
    G4_COUNT
};

typedef struct mtm_gemma4 {
    int on;                /* decoder_block == gemma4 */
    int64_t P;             /* per_layer_input_dim (0: no per-layer inputs) */
    int id[G4_COUNT];
    void *buf[G4_COUNT];
    void *ident_host;      /* [P, P] of the activation dtype: uploaded to G4_IDENT */
} mtm_gemma4;

struct mt_model {
    mt_model_config cfg;
    mt_backend *be;
    /* sizes this rank computes with (after the layout: local heads, mlp columns, rows) */
    int64_t B, T, N, tiles;
    int64_t Tg;            /* the caller's sequence length (T without context parallelism) */
    int64_t D, V, F, H, Hkv, Dh, QD, KVD;
    float eps, w_off, emb_scale;
    mt_dtype dt;           /* compute / activation dtype (the layout's dtype) */
    size_t es;             /* its element size */
    uint64_t sr_seed;      /* key of the compute weights' stochastic rounding (mt_model_set_compute_rounding) */
    int64_t sr_t;
    /* host copies of constant inputs */
    float *inv_freq_host;  /* [2 * Dh/2]: global table then local table */
    int32_t *pos_host;     /* [T]: the positions of one sequence (every row of the batch repeats them) */

    mtm_param_table par;
    mtm_plan_state plan;
    mtm_remat_state remat;
    mtm_host_pool host;
    mtm_param_windows pwin;
    mtm_grad_sink sink;
    mtm_vocab_chunks vc;
    mtm_tensor_state tp;
    mtm_context_state cp;
    mtm_fsdp_state fsdp;
    mtm_packing pack;
    mtm_decode dec;
    mtm_gemma4 g4;
};

/* ---- small helpers ---- */

/* Rows [a, b) of vocabulary chunk c of C: parallel/vocab_loss.h's split, so the lookup's
 * chunks are the loss's. */
static inline void mtm_vocab_chunk(const mt_model *m, int64_t c, int64_t *a, int64_t *b) {
    mt_vocab_chunk_rows(m->V, m->vc.C, c, a, b);
}
/* Rows in the largest chunk: ceil(V / C). */
static inline int64_t mtm_vocab_chunk_rows(const mt_model *m) { return (m->V + m->vc.C - 1) / m->vc.C; }

static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Phases (model.h). */
static inline int ph_fwd(const mt_model *m, int64_t l) { (void)m; return (int)(1 + l); }
static inline int ph_loss(const mt_model *m) { return (int)(m->cfg.num_decoder_layers + 1); }
static inline int ph_bwd(const mt_model *m, int64_t l) { return (int)(2 * m->cfg.num_decoder_layers + 1 - l); }
static inline int ph_embed_bwd(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 2); }
static inline int ph_optim(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 3); }

/* Rows of the residual stream this rank holds: N, or N / tp under sequence
 * parallelism (rows [seq_row0, seq_row0 + seq_rows) of the N local rows). */
static inline int64_t seq_rows(const mt_model *m) { return m->tp.sp ? m->N / m->tp.size : m->N; }
static inline int64_t seq_row0(const mt_model *m) { return m->tp.sp ? m->tp.rank * (m->N / m->tp.size) : 0; }

/* A layout axis size: 0 counts as 1, so a zeroed mt_model_layout is one process. */
static inline int mtm_axis_size(int n) { return n == 0 ? 1 : n; }

/* Layer l's widths on this rank (m->H, m->Hkv are this rank's heads after
 * model_shard.c tp_setup; every layer has the config's widths but gemma4's, whose
 * global layers have global_head_dim and whose KV-sharing layers may have a
 * double-wide MLP): head dim, query width H x Dh, kv width Hkv x Dh, and the MLP
 * width's tensor-parallel slice (mt_model_layer_mlp_dim / tp; the layout check keeps
 * mlp_dim, and so twice it, divisible). */
static inline int64_t mtm_layer_dh(const mt_model *m, int64_t l) { return mt_model_layer_head_dim(&m->cfg, l); }
static inline int64_t mtm_layer_qd(const mt_model *m, int64_t l) { return m->H * mtm_layer_dh(m, l); }
static inline int64_t mtm_layer_kvd(const mt_model *m, int64_t l) { return m->Hkv * mtm_layer_dh(m, l); }
static inline int64_t mtm_layer_f(const mt_model *m, int64_t l) {
    return mt_model_layer_mlp_dim(&m->cfg, l) / m->tp.size;
}

/* Floats of layer l's parameters (input_layernorm .. mlp.down_proj, contiguous): the
 * same for every layer but gemma4's, whose par.layer_numel is the largest (it sizes the
 * layer windows). */
/* Rows and columns of parameter p as the gradient windows cut it: [shape[0], shape[1]],
 * a 1-D parameter one row of numel. */
static inline int64_t mtm_param_rows(const mt_param_info *p) { return p->ndim == 2 ? p->shape[0] : 1; }
static inline int64_t mtm_param_cols(const mt_param_info *p) { return p->numel / mtm_param_rows(p); }

static inline int64_t mtm_layer_numel(const mt_model *m, int64_t l) {
    const layer_params *lp = &m->par.layer[l];
    return m->par.info[lp->down].offset + m->par.info[lp->down].numel - m->par.info[lp->in_norm].offset;
}

/* The parameters live in windows (parameter host offload or fsdp), not in GB_PARAMS. */
static inline int params_windowed(const mt_model *m) { return m->pwin.offload || m->fsdp.size > 1; }

/* fsdp with dtype bfloat16 and the shard on the device: no bf16 copy of the shard; each
 * gather rounds this rank's part into the window (model_shard.c mtm_fsdp_gather). */
static inline int mtm_fsdp_rounds_in_window(const mt_model *m) {
    return m->fsdp.size > 1 && !m->pwin.offload && m->dt != MT_F32;
}
/* Vocabulary chunks with parameter windows: the embedding and lm_head rows come
 * through the vocabulary windows, a chunk at a time (not in the global window). */
static inline int mtm_vocab_windows(const mt_model *m) { return m->vc.C > 1 && params_windowed(m); }
/* Vocabulary chunks with a gradient sink: the embedding's and the unembedding's
 * gradients go to the sink a chunk at a time (tied: the loss's share of a chunk in
 * the loss phase, the lookup's share added to it in the embedding's backward:
 * mt_grad_sink_fn's add; unless the sink cannot add shares exactly, when a tied
 * embedding's gradient stays whole as without chunks: mt_model_set_grad_sink_shares). */
static inline int mtm_vocab_grad_windows(const mt_model *m) {
    return m->vc.C > 1 && m->sink.fn && (m->sink.shares || !m->cfg.logits_via_embedding);
}
/* gemma4, the per-layer embedding table [V, L*P] in vocabulary chunks (vc.ple_C > 1):
 * with parameter windows its rows come a chunk at a time through G4_PWIN_PLE_VOCAB
 * (not in G4_PWIN_PLE), with a gradient sink its gradient goes to the sink a chunk at a
 * time from G4_GWIN_PLE_VOCAB (not from G4_GWIN_PLE). Chunk c is rows [c V / ple_C,
 * (c + 1) V / ple_C) (parallel/vocab_loss.h's split). */
static inline int mtm_g4_ple_windows(const mt_model *m) { return m->vc.ple_C > 1 && params_windowed(m); }
static inline int mtm_g4_ple_grad_windows(const mt_model *m) { return m->vc.ple_C > 1 && m->sink.fn; }
static inline void mtm_g4_ple_chunk(const mt_model *m, int64_t c, int64_t *a, int64_t *b) {
    mt_vocab_chunk_rows(m->V, m->vc.ple_C, c, a, b);
}
static inline int64_t mtm_g4_ple_chunk_rows(const mt_model *m) { return (m->V + m->vc.ple_C - 1) / m->vc.ple_C; }

/* Elements of the global parameter window: the embedding (unless it comes in chunks),
 * model.norm and lm_head (unless it comes in chunks). */
static inline int64_t mtm_global_window_numel(const mt_model *m) {
    const int64_t emb = m->par.info[m->par.embed].numel, tail = m->par.numel - m->par.tail_off;
    if (!mtm_vocab_windows(m)) return emb + tail;
    return tail - (m->par.lm_head >= 0 ? m->par.info[m->par.lm_head].numel : 0);
}
/* Elements of the tail gradient window: model.norm and lm_head, or model.norm alone
 * when lm_head's gradient comes in chunks. */
static inline int64_t mtm_tail_grad_numel(const mt_model *m) {
    const int64_t tail = m->par.numel - m->par.tail_off;
    return mtm_vocab_grad_windows(m) && m->par.lm_head >= 0 ? tail - m->par.info[m->par.lm_head].numel : tail;
}

/* The first failed collective of the pass: tensor group, then context, then fsdp
 * (MT_OK when none failed); and its reset at the start of a pass. */
static inline mt_status mtm_comm_status(const mt_model *m) {
    if (m->tp.status != MT_OK) return m->tp.status;
    if (m->cp.status != MT_OK) return m->cp.status;
    return m->fsdp.status;
}
static inline void mtm_comm_status_reset(mt_model *m) { m->tp.status = m->cp.status = m->fsdp.status = MT_OK; }

/* y[N, out] = x[N, in] W^T + beta y, W [out, in] (HF nn.Linear); all of m->dt. */
static inline mt_status MT_MUST_CHECK linear_fwd(const mt_model *m, void *y, const void *x, const void *W,
                                                 int64_t N, int64_t in, int64_t out, float beta) {
    return m->be->ops->gemm(m->be, 0, 1, N, out, in, 1.0f, x, in, W, in, m->dt, beta, y, out, m->dt);
}
/* dW[out, in] (fp32) += dy[N, out]^T x[N, in] */
static inline mt_status MT_MUST_CHECK linear_bwd_w(const mt_model *m, float *dW, const void *dy, const void *x,
                                                   int64_t N, int64_t in, int64_t out) {
    return m->be->ops->gemm(m->be, 1, 0, out, in, N, 1.0f, dy, out, x, in, m->dt, 1.0f, dW, in, MT_F32);
}
/* dx[N, in] = dy[N, out] W + beta dx */
static inline mt_status MT_MUST_CHECK linear_bwd_x(const mt_model *m, void *dx, const void *dy, const void *W,
                                                   int64_t N, int64_t in, int64_t out, float beta) {
    return m->be->ops->gemm(m->be, 0, 0, N, in, out, 1.0f, dy, out, W, in, m->dt, beta, dx, in, m->dt);
}

/* ---- model_plan.c ---- */

/* Elements of saved tensor j (mt_layer_tensor) of one layer; 0 when this config has none. */
int64_t mtm_act_elems(const mt_model *m, int j);
/* Its bytes: the norm statistics and the attention logsumexp fp32, the rest m->dt. */
size_t mtm_act_bytes(const mt_model *m, int j);
/* The same for layer l itself: equal to the above except on gemma4, whose layers differ
 * (head dims, MLP widths; no K/V on KV-sharing layers), where the above is the largest
 * over the layers (the size of the layer-sized scratch). */
int64_t mtm_act_elems_layer(const mt_model *m, int64_t l, int j);
size_t mtm_act_bytes_layer(const mt_model *m, int64_t l, int j);
/* The remat policy's action for saved tensor j (MT_RA_DEVICE for tensors without a name). */
mt_remat_action mtm_act_action(const mt_model *m, int j);
/* Add buffer g (GB_*) to plan, untagged (the category's tag). */
mt_status mtm_plan_add(mt_model *m, mt_plan *plan, int g, const char *name, mt_mem_category cat, size_t bytes,
                       int first, int last);

/* ---- model_windows.c ---- */

/* Parameter i (its tensor-parallel slice) as the layers compute with it. */
const void *mtm_pw(const mt_model *m, int i);
/* The gradient of parameter i (its tensor-parallel slice), fp32: in the full buffer, or
 * with a gradient sink in its window; for a layer parameter with a sink, the window
 * mtm_grad_open opened for it (NULL, and an assertion, when it is not the open one). */
float *mtm_gw(const mt_model *m, int i);
/* With a gradient sink, before the first write of layer parameter i's gradient in the
 * layer backward begun by mtm_grad_layer_begin: hand the open parameter over (its
 * gradient is complete) and open i's window, zeroed (with an asynchronous sink the two
 * layer windows alternate; the one taken is waited for first). So a layer backward
 * writes each parameter's gradient in one stretch and holds one gradient pointer at a
 * time. A no-op for the open parameter, without a sink and for other parameters.
 * Errors: the sink's (fn, wait), MT_ERR_INVALID for a parameter of another layer or
 * one written again after its hand-over. */
mt_status MT_MUST_CHECK mtm_grad_open(mt_model *m, int i);
/* Rows of layer parameter i whose gradient one window holds (grad_window_chunks): 1
 * for a 1-D parameter (its one row), the number of its rows, or with a gradient sink and
 * chunks k > 1 ceil(rows / k). */
int64_t mtm_grad_block_rows(const mt_model *m, int i);
/* Elements of a layer gradient window: the largest block a layer parameter's gradient
 * comes in (the largest layer weight, or with a sink and grad_window_chunks its largest
 * row block); >= 1. */
int64_t mtm_grad_window_numel(const mt_model *m);
/* dW_i[rows, cols] (fp32, row stride ldw) += dy[N, rows]^T x[N, cols] (dy, x of m->dt;
 * lda: dy's row stride; N the rows of dy and x: the micro-batch's, or under sequence
 * parallelism a residual-row slice's), the weight gradient of a linear layer, through the gradient
 * windows: with a sink and grad_window_chunks k > 1 in blocks of mtm_grad_block_rows
 * rows (ldw == cols: no tensor axis there), each handed over when the next opens (dy's
 * columns r0 .. r1 - 1 make rows r0 .. r1 - 1 of dW); else into mtm_grad_open(m, i)'s
 * window (or the full buffer) at its tensor-parallel offset. Errors: as mtm_grad_open,
 * the backend's gemm. */
mt_status MT_MUST_CHECK mtm_weight_grad(mt_model *m, int i, const void *dy, int64_t lda, const void *x, int64_t N,
                                        int64_t rows, int64_t cols, int64_t ldw);
/* linear_bwd_w into layer weight i's gradient windows: dW[out, in] += dy[N, out]^T x[N, in] */
static inline mt_status MT_MUST_CHECK mtm_linear_grad(mt_model *m, int i, const void *dy, const void *x, int64_t N,
                                                      int64_t in, int64_t out) {
    return mtm_weight_grad(m, i, dy, out, x, N, out, in, in);
}
/* Gradient sink, around the backward of layer l: begin (nothing open) and end, given
 * the backward's status: when it is MT_OK, hand the open parameter over, then every
 * parameter of the layer the backward did not write, as zeros (the sink sees each
 * element once: gemma4's layer_scalar); else hand nothing more over and return it.
 * Errors: the backward's, the sink's. Without a sink: returns `backward`. */
void mtm_grad_layer_begin(mt_model *m, int64_t l);
mt_status MT_MUST_CHECK mtm_grad_layer_end(mt_model *m, mt_status backward);
/* dtype != float32: round the compute copy (GB_COMPUTE_W) from the fp32 master
 * (GB_PARAMS), this rank's fsdp shard of it under fsdp (mt_model_set_compute_rounding). */
mt_status MT_MUST_CHECK mtm_refresh_compute(mt_model *m);
mt_status MT_MUST_CHECK mtm_fetch_layer(mt_model *m, int64_t l);
void mtm_prefetch_layer(mt_model *m, int64_t l);
/* param_window_unit=weight (parameter windows of a segment at a time): before a layer
 * parameter i is read (mtm_pw), make its segment resident in one of the two slots,
 * filled synchronously unless it is there or being prefetched, and start the
 * prefetch of the next segment the pass opens (fsdp) into the other slot; the slot
 * opened last is never overwritten. Each open must be the pass's next entry of
 * mtm_layer_param_order (repeats of the parameter opened last excepted): the gather
 * count of mt_model_fsdp_gather_floats follows that order. A no-op in layer units,
 * without parameter windows and for the embedding, final norm and head.
 * Errors: the fill's (copy, fsdp gather), MT_ERR_RUNTIME for an open out of order. */
mt_status MT_MUST_CHECK mtm_param_open(mt_model *m, int i);
/* param_window_unit=weight: the forward (backward = 0; the slots were emptied by
 * mtm_fetch_global) or the backward (1) of the layers begins: reset the pass's order
 * and prefetch its first segment. A no-op in layer units. Errors: the gather's. */
mt_status MT_MUST_CHECK mtm_param_pass_begin(mt_model *m, int backward);
/* param_window_unit=weight: the segments of the layer parameters (consecutive
 * parameters of a layer packed up to the largest parameter's numel) and, once the
 * remat policy is known (planning), the passes' orders. Errors: MT_ERR_OOM. */
mt_status MT_MUST_CHECK mtm_weight_segments(mt_model *m);
mt_status MT_MUST_CHECK mtm_weight_orders(mt_model *m);
/* Floats this rank gathers for the layer segments in one forward and backward
 * (param_window_unit=weight), per mtm_layer_param_order with the windows' choices;
 * own(m, r, a, b) the elements of [a, b) in rank r's shard. */
int64_t mtm_weight_gather_floats(const mt_model *m, int64_t (*own)(const mt_model *, int, int64_t, int64_t));
mt_status MT_MUST_CHECK mtm_fetch_global(mt_model *m);
mt_status MT_MUST_CHECK mtm_grad_windows_begin(mt_model *m);
/* Rows [a, b) of parameter i (the embedding or lm_head: [V, D]) as [b - a, D] of m->dt:
 * in place, or with vocabulary windows gathered (fsdp) or copied (parameter offload)
 * into window w (MT_PWIN_VOCAB_EMBED or MT_PWIN_VOCAB_HEAD); valid until the next call
 * for that window. Errors: the copy's, or the gather's (fsdp.status). */
mt_status MT_MUST_CHECK mtm_vocab_rows(mt_model *m, int i, int64_t a, int64_t b, int w, const void **rows);
/* Parameter window win[0, b - a) = flat parameters [a, b) of m->dt: all-gathered from
 * the fsdp shards (after the prefetch in flight), or with parameter host offload copied
 * from the host pool. Errors: the copy's, or the gather's (fsdp.status). */
mt_status MT_MUST_CHECK mtm_window_fill(mt_model *m, void *win, int64_t a, int64_t b);
/* One vocabulary chunk of a lookup table's gradient through the sink: rows [a, b) of
 * the table at flat offset off ([V, width] fp32 rows), dE[tok] += scale G into the
 * chunk window win (waited for, zeroed), then handed to the sink with `add`
 * (mt_grad_sink_fn: 1 for a tied embedding, whose rows the loss handed over first).
 * The embedding's and gemma4's per-layer table's chunked backward. Errors: the
 * backend's, the sink's. */
mt_status MT_MUST_CHECK mtm_table_chunk_backward(mt_model *m, float *win, int64_t off, const void *G,
                                                 const int32_t *tok, int64_t N, int64_t a, int64_t b, int64_t width,
                                                 float scale, int add);
/* Resolve num_vocab_chunks and num_vocab_tiling (0 = auto) for this layout and sink
 * (model.h mt_model_vocab_tiling states the rules). */
void mtm_vocab_resolve(mt_model *m);

/* ---- model_shard.c ---- */

/* Apply the (checked: model.c) layout's tensor, context, sequence and fsdp axes. */
mt_status mtm_shard_setup(mt_model *m, const mt_model_layout *lay);
void mtm_sp_gather(mt_model *m, void *full);
mt_status MT_MUST_CHECK mtm_norm_gather(mt_model *m, void *full, float *rstd, const void *x, int wi);
mt_status MT_MUST_CHECK mtm_add_norm_gather(mt_model *m, void *h, void *full, float *rstd, const void *x,
                                            const void *r, int wi);
const void *mtm_tp_sum_input_grad(mt_model *m, void *d, void *part);
mt_status MT_MUST_CHECK mtm_row_fwd(mt_model *m, void *y, const void *x, int pi, int64_t in_l, int64_t ldw,
                                    float beta, void *full, void *part);
mt_status MT_MUST_CHECK mtm_row_bwd_w(mt_model *m, int pi, const void *dy, const void *x, int64_t in_l,
                                      int64_t ldw);
mt_status MT_MUST_CHECK mtm_row_bwd_x(mt_model *m, void *dx, const void *dy, int pi, int64_t in_l, int64_t ldw,
                                      float beta);
mt_status MT_MUST_CHECK mtm_cp_attention_fwd(mt_model *m, int64_t l, void *out, float *lse, const void *q,
                                             const void *k, const void *v);
mt_status MT_MUST_CHECK mtm_cp_attention_bwd(mt_model *m, int64_t l, void *dq, void *dk, void *dv,
                                             const void *dout, const void *q, const void *k, const void *v,
                                             const void *out, const float *lse);
int32_t mtm_cp_position(const mt_model *m, int r, int64_t j);
const int32_t *mtm_cp_select(mt_model *m, const int32_t *full, int32_t *local);
void mtm_fsdp_gather(mt_model *m, void *win, int64_t a, int64_t b, int async);
void mtm_fsdp_wait(mt_model *m);

/* ---- model_layers.c ---- */

mt_attn_args mtm_attn_args(const mt_model *m, int64_t l);
/* Shared with model_gemma4.c: the RoPE positions of the local rows, layer l's RoPE
 * table, where layer l's saved tensors are (fwd 1: forward, 0: backward), their host
 * offload / restore, and whether saved tensor j is recomputed in the backward. */
const int32_t *mtm_rope_positions(const mt_model *m);
const float *mtm_layer_inv_freq(const mt_model *m, int64_t l);
void mtm_layer_ptrs(const mt_model *m, int64_t l, int fwd, void *a[MT_LT_COUNT]);
mt_status MT_MUST_CHECK mtm_layer_offload(mt_model *m, int64_t l, void *a[MT_LT_COUNT]);
mt_status MT_MUST_CHECK mtm_layer_restore(mt_model *m, int64_t l, void *a[MT_LT_COUNT]);
int mtm_la_is_remat(const mt_model *m, int j);
/* The attention backward's parts of bwd.work for a layer of widths QD, KVD (w NULL: only
 * the bytes, for the plan); model_layers.c says which tensor each part holds. */
#define MTM_BWD_ATTN_PARTS 5
size_t mtm_bwd_attn_parts(const mt_model *m, int64_t QD, int64_t KVD, void *w[MTM_BWD_ATTN_PARTS]);
mt_status MT_MUST_CHECK mtm_layer_forward(mt_model *m, int64_t l);
mt_status MT_MUST_CHECK mtm_layer_backward(mt_model *m, int64_t l);
/* The GLU MLP's backward in layer l's backward (both families): from dmlp [N, D] =
 * d(down_proj output), act(g) u recomputed into w0 [N, F], down_proj's gradient and
 * d(act(g) u) into w0, then dg, du written over a[MLPWI_0], a[MLPWI_1] (their last use),
 * gate_proj's and up_proj's gradients, and d2 [N, D] = d(normed input) from up then gate
 * (column-parallel: a partial sum the caller reduces). nrm: the normed input [N, D]; F,
 * Fg: this rank's and the whole MLP width (row stride of down_proj). Activation dtype
 * m->dt. Errors: the backend's, the gradient and parameter windows'. */
mt_status MT_MUST_CHECK mtm_mlp_backward(mt_model *m, int64_t l, void *a[MT_LT_COUNT], const void *dmlp,
                                         const void *nrm, void *w0, void *d2, int64_t F, int64_t Fg);
/* The layer parameters that layer l's forward (backward = 0) or backward (1) opens
 * (mtm_param_open) before reading them, in that order, a parameter opened twice in a
 * row listed once; the backward's depend on the remat policy (what it recomputes).
 * Writes at most MTM_LAYER_OPENS_MAX entries to out (asserted) and returns their
 * count. Dispatches to mtm_g4_layer_param_order (model_gemma4.c) for gemma4. */
#define MTM_LAYER_OPENS_MAX 48
int mtm_layer_param_order(const mt_model *m, int64_t l, int backward, int *out);
/* Append parameter i to an order out[*n] unless it is the last entry (asserted within
 * MTM_LAYER_OPENS_MAX): the order functions' one step. */
static inline void mtm_order_push(int *out, int *n, int i) {
    assert(*n < MTM_LAYER_OPENS_MAX);
    if (*n == 0 || out[*n - 1] != i) out[(*n)++] = i;
}
int mtm_g4_layer_param_order(const mt_model *m, int64_t l, int backward, int *out);
/* What layer l's backward recomputes that communicates (model_shard.c counts the
 * bytes): *norm_gathers, the input norm gathered again for q/k/v (sequence
 * parallelism: an all-gather of N x D); *row_fwds, the row-parallel out_proj / mlpwo
 * recomputed (an all-reduce, or with sequence parallelism a reduce-scatter, of N x D);
 * *context, 1 when the attention is recomputed (context parallelism: its K/V
 * gathered, or ringed, again). Dispatches to mtm_g4_layer_recomputes for gemma4. */
void mtm_layer_recomputes(const mt_model *m, int64_t l, int *norm_gathers, int *row_fwds, int *context);
/* gemma4's (model_gemma4.c): the same counts from its own recompute (g4_recompute: a
 * KV-sharing layer recomputes no K/V of its own; a donor's released K/V are). */
void mtm_g4_layer_recomputes(const mt_model *m, int64_t l, int *norm_gathers, int *row_fwds, int *context);

/* ---- model_loss.c ---- */

/* The unembedding matrix [V, D]: lm_head, or the embedding when tied. */
const void *mtm_unembedding(const mt_model *m);

/* ---- model_gemma4.c ---- */

/* Gemma 4's layer forward / backward (as mtm_layer_forward / _backward), its per-layer
 * inputs after the embedding (forward) and their backward into the embedding gradient
 * G[N, D] (+=) and the per-layer-input parameters, and the zeroing of the accumulated
 * gradients at the start of a backward. Every layout, as the other families (the file
 * comment of model_gemma4.c says how each axis meets the sharing and the per-layer
 * inputs). */
mt_status MT_MUST_CHECK mtm_g4_layer_forward(mt_model *m, int64_t l);
mt_status MT_MUST_CHECK mtm_g4_layer_backward(mt_model *m, int64_t l);
mt_status MT_MUST_CHECK mtm_g4_inputs_forward(mt_model *m);
mt_status MT_MUST_CHECK mtm_g4_backward_begin(mt_model *m);
mt_status MT_MUST_CHECK mtm_g4_inputs_backward(mt_model *m, void *G);
/* The flat range [*a, *a + *n) of the per-layer-input globals (the per-layer embedding,
 * its projection and norm: consecutive after the embedding); *n = 0 when there are none.
 * With a gradient sink their gradients go to window G4_GWIN_PLE, zeroed and handed to
 * the sink by mtm_g4_inputs_backward. */
void mtm_g4_ple_range(const mt_model *m, int64_t *a, int64_t *n);
/* The part of that range held by the window G4_PWIN_PLE (grad 0) or G4_GWIN_PLE (grad
 * 1): all of it, or without the per-layer embedding table (the first V x L*P elements)
 * when the table comes in chunks (mtm_g4_ple_windows / mtm_g4_ple_grad_windows). */
void mtm_g4_ple_window(const mt_model *m, int grad, int64_t *a, int64_t *n);
/* Whether layer l's K/V are used by KV-sharing layers (its key/value_proj are kept). */
int mtm_g4_is_donor(const mt_model *m, int64_t l);

/* ---- model_decode.c ---- */

mt_status mtm_decode_add_to_plan(mt_model *m, mt_plan *plan);

#endif
