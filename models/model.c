/* models/model.c: the decoder (models/model.h) written against kernels/ops.h, with its
 * hand-written backward.
 *
 * Layer l, for N = batch x seq rows (Hugging Face modeling_llama.py / modeling_gemma*.py):
 *   n1 = input_layernorm(x)                         rstd saved
 *   q  = rope([q_norm](n1 Wq^T)), k = rope([k_norm](n1 Wk^T)), v = n1 Wv^T   saved
 *   c  = attention(q, k, v)                          saved with its logsumexp
 *   o  = c Wo^T                                      saved (out_proj)
 *   h  = x + [post_attention_layernorm](o)           recomputed in the backward
 *   n2 = pre-MLP norm(h)                             recomputed in the backward
 *   g  = n2 Wg^T, u = n2 Wu^T                        saved (mlpwi_0, mlpwi_1)
 *   y  = h + [post_feedforward_layernorm](act(g) u Wd^T)   (mlpwo saved when post-normed)
 * y is the next layer's decoder_layer_input. Everything else the backward needs (the
 * normalised inputs, h, act(g) u) is recomputed from saved tensors with the same
 * deterministic ops, so the saved set per layer is exactly the list in layer_act_elems.
 *
 * Backward: the gradient of the residual stream lives in one buffer G; every RMSNorm
 * backward accumulates into it (be->ops->rmsnorm_bwd adds to dx), which is the residual
 * connection's gradient for free. */
#include "models/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tiled_loss.h"
#include "parallel/mesh.h"
#include "parallel/vocab_loss.h"
#include "runtime/rng.h"

/* Activations, compute weights and their gradients are of m->dt (MT_F32 or MT_BF16:
 * mt_model_set_dtype), m->es bytes each; parameter gradients (GW), the fp32 master, norm
 * statistics (rstd), the attention logsumexp and the loss tile are fp32.
 * AT(m, p, k): element k of an m->dt tensor p. */
#define AT(m, p, k) ((void *)((char *)(p) + (size_t)(k) * (m)->es))

/* ---- per-layer saved activations: mt_layer_tensor (models/remat.h) ---- */

/* ---- buffers that are not per layer ---- */
enum {
    GB_PARAMS = 0, GB_GRADS,
    GB_TOKENS, GB_LABELS, GB_POSITIONS, GB_INV_FREQ,
    GB_FINAL_INPUT, GB_FINAL_RSTD, GB_FINAL_HIDDEN, GB_FINAL_HIDDEN_GRAD, GB_LOSS_TILE,
    GB_RESID_GRAD,
    GB_FWD_NORM, GB_FWD_RESID, GB_FWD_TMP, GB_FWD_GLU,
    GB_BWD_NORM, GB_BWD_RESID, GB_BWD_D1, GB_BWD_D2, GB_BWD_W0, GB_BWD_W1, GB_BWD_W2,
    GB_BWD_W3, GB_BWD_W4,
    GB_SEGMENTS, GB_DOC_POS, /* packing only: [N] int32 segment ids, per-document RoPE positions */
    GB_STEP_STATS,           /* double[MT_MODEL_STATS] (mt_model_step_stats) */
    GB_COMPUTE_W,            /* dtype != float32: the compute copy of the parameters, [numel] of dt */
    GB_LOSS_DTILE,           /* dtype != float32: the loss tile's dlogits [rows, Vl] of dt */
    GB_LOSS_VOCAB_STATS,     /* tp > 1: the vocab-parallel loss's all-reduce payloads (mt_vocab_loss_scratch_bytes) */
    GB_WORKSPACE,            /* the backend's GEMM workspace (caps.workspace_bytes; ops.h set_workspace) */
    GB_COUNT
};

/* Parameter indices of one layer (-1 when absent). */
typedef struct layer_params {
    int in_norm, q, k, v, o, q_norm, k_norm, post_attn_norm, pre_mlp_norm, post_ffw_norm;
    int gate, up, down;
} layer_params;

struct mt_model {
    mt_model_config cfg;
    mt_backend *be;
    int64_t B, T, N, tiles;
    int64_t D, V, F, H, Hkv, Dh, QD, KVD;
    float eps, w_off, emb_scale;
    mt_dtype dt;   /* compute / activation dtype (mt_model_set_dtype) */
    size_t es;     /* its element size */
    uint64_t sr_seed; /* key of the compute weights' stochastic rounding (mt_model_set_compute_rounding) */
    int64_t sr_t;

    /* parameter table */
    mt_param_info *params;
    int nparams;
    int64_t numel;
    int p_embed, p_final_norm, p_lm_head;
    layer_params *lp;

    /* host copies of constant inputs */
    float *inv_freq_host;  /* [2 * Dh/2]: global table then local table */
    int32_t *pos_host;     /* [T]: the positions of one sequence (every row of the batch repeats them) */

    /* plan ids and bound pointers */
    int planned, bound;
    int fwd_kept; /* the saved activations hold a whole forward (mt_model_backward_hidden) */
    int gid[GB_COUNT];
    void *gptr[GB_COUNT];
    int (*lid)[MT_LT_COUNT];
    float *(*lptr)[MT_LT_COUNT];

    /* remat / offload (models/remat.h) */
    mt_remat_policy remat;
    int has_offload;                   /* some tensor is offloaded */
    int host_planned, host_bound;
    int rs_fwd_id[MT_LT_COUNT], rs_bwd_id[MT_LT_COUNT]; /* layer-sized scratch of non-kept tensors */
    float *rs_fwd[MT_LT_COUNT], *rs_bwd[MT_LT_COUNT];
    int (*hid)[MT_LT_COUNT];              /* host pool entries of offloaded tensors */
    float *(*hptr)[MT_LT_COUNT];

    /* parameter host offload (mt_model_set_param_offload) */
    int param_offload;
    int *param_layer;                  /* per parameter: its layer, -1 for embed/final norm/head */
    int64_t layer_numel, tail_off;     /* floats of one layer; flat offset of model.norm */
    int pwin_id[3], hparams_id;        /* plan ids: two layer windows + the global window; host params */
    float *pwin[3];
    int64_t win_layer[2];              /* layer held by each layer window, -1 none */

    /* fsdp (mt_model_set_fsdp): the parameter windows above are filled by all-gather
     * from the ranks' shards; GB_PARAMS holds this rank's shard [flo, fhi) of the flat
     * buffer (rank r: [r * fper, (r + 1) * fper) clipped to numel). */
    mt_comm *fsdp_comm;
    int fsdp, fsdp_rank;
    int64_t flo, fhi, fper;
    int64_t *fsdp_counts;              /* [fsdp] all-gather counts scratch */
    mt_comm_request *fsdp_req;         /* the prefetch in flight (its layer's win_layer is set), or NULL */

    /* gradient sink (mt_model_set_grad_sink): instead of the full "grads" buffer, one
     * layer window (slot 0, layer_numel floats), the embedding window (slot 1) and the
     * tail window (slot 2: model.norm and lm_head, flat [tail_off, numel)) */
    mt_grad_sink_fn sink;
    void *sink_ctx;
    int gwin_id[3];
    float *gwin[3];

    /* tensor parallelism (mt_model_set_tensor_parallel): H, Hkv, F, QD, KVD above are
     * this rank's local sizes; the parameter table keeps the global shapes. */
    mt_comm *tp_comm;
    int tp, tp_rank;
    int64_t Vl, v0;     /* vocabulary slice [v0, v0 + Vl) of the loss */
    int64_t QDg, Fg;    /* global q width and mlp dim (row strides of o_proj, down_proj) */
    int64_t *tp_off;    /* per parameter: element offset of this rank's slice (NULL: none) */
    mt_status tp_status; /* first failed tensor-axis collective of the current pass */
    int sp;             /* sequence parallelism (mt_model_set_sequence_parallel) */
    int64_t *sp_counts; /* [tp]: elements of each rank's residual rows (N / tp x D) */

    /* context parallelism (mt_model_set_context_parallel): T and N above are this
     * rank's local rows (chunks cp_rank and 2C-1-cp_rank of every sequence). */
    mt_comm *cp_comm;
    int cp, cp_rank;
    int64_t Tg;                 /* global sequence length */
    int32_t *cp_tok, *cp_lab;   /* host [N]: this rank's rows of the caller's [B, Tg] */
    int32_t *cp_kpos_host;      /* [Tg] original positions of the gathered keys */
    int cp_ring;                /* context_parallel_strategy=ring */
    int cp_id[17];              /* plan ids of the CP_* buffers */
    void *cp_buf[17];

    /* document masking (mt_model_set_packing): host scratch for the ids and positions
     * derived from the caller's tokens, allocated by mt_model_bind */
    int packing;
    int32_t pack_sep;
    int32_t *pack_seg, *pack_pos;  /* [B, Tg]: the whole window's ids / document positions */
    int32_t *pack_lseg, *pack_lpos; /* [N]: this rank's rows (context parallelism), else NULL */
    int32_t *pack_kseg;            /* [B * Tg]: key ids in the gathered (or ring block) order */

    /* incremental decoding (mt_model_set_decode): the plan holds the parameters, the
     * KV caches and one token's scratch (DEC_* below) instead of the step's buffers */
    int decode;
    int64_t dec_len;            /* positions in the cache (the next token's position) */
    int dec_id[20];             /* plan ids of the DEC_* buffers */
    void *dec_buf[20];
};

/* ------------------------------------------------------------------------------ */
/* parameter table                                                                  */

static int add_param(mt_model *m, const char *name, int ndim, int64_t s0, int64_t s1) {
    mt_param_info *p = &m->params[m->nparams];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->shape[0] = s0;
    p->shape[1] = ndim == 2 ? s1 : 0;
    p->numel = ndim == 2 ? s0 * s1 : s0;
    p->offset = m->numel;
    p->weight_decay = ndim == 2;
    m->numel += p->numel;
    return m->nparams++;
}

static int add_layer_param(mt_model *m, int64_t l, const char *suffix, int ndim, int64_t s0,
                           int64_t s1) {
    char name[MT_PARAM_NAME_MAX];
    snprintf(name, sizeof(name), "model.layers.%lld.%s", (long long)l, suffix);
    return add_param(m, name, ndim, s0, s1);
}

static void build_param_table(mt_model *m) {
    const mt_model_config *c = &m->cfg;
    const int64_t D = m->D, F = m->F, QD = m->QD, KVD = m->KVD, Dh = m->Dh;
    m->p_embed = add_param(m, "model.embed_tokens.weight", 2, m->V, D);
    for (int64_t l = 0; l < c->num_decoder_layers; l++) {
        layer_params *lp = &m->lp[l];
        lp->in_norm = add_layer_param(m, l, "input_layernorm.weight", 1, D, 0);
        lp->q = add_layer_param(m, l, "self_attn.q_proj.weight", 2, QD, D);
        lp->k = add_layer_param(m, l, "self_attn.k_proj.weight", 2, KVD, D);
        lp->v = add_layer_param(m, l, "self_attn.v_proj.weight", 2, KVD, D);
        lp->o = add_layer_param(m, l, "self_attn.o_proj.weight", 2, D, QD);
        lp->q_norm = lp->k_norm = -1;
        if (c->use_qk_norm) {
            lp->q_norm = add_layer_param(m, l, "self_attn.q_norm.weight", 1, Dh, 0);
            lp->k_norm = add_layer_param(m, l, "self_attn.k_norm.weight", 1, Dh, 0);
        }
        /* HF naming: with a post-attention norm (gemma2/3) post_attention_layernorm is
         * that norm and pre_feedforward_layernorm the pre-MLP one; otherwise (llama,
         * gemma) post_attention_layernorm is the pre-MLP norm. */
        lp->post_attn_norm = -1;
        if (c->use_post_attn_norm) {
            lp->post_attn_norm = add_layer_param(m, l, "post_attention_layernorm.weight", 1, D, 0);
            lp->pre_mlp_norm = add_layer_param(m, l, "pre_feedforward_layernorm.weight", 1, D, 0);
        } else {
            lp->pre_mlp_norm = add_layer_param(m, l, "post_attention_layernorm.weight", 1, D, 0);
        }
        lp->post_ffw_norm = -1;
        if (c->use_post_ffw_norm)
            lp->post_ffw_norm = add_layer_param(m, l, "post_feedforward_layernorm.weight", 1, D, 0);
        lp->gate = add_layer_param(m, l, "mlp.gate_proj.weight", 2, F, D);
        lp->up = add_layer_param(m, l, "mlp.up_proj.weight", 2, F, D);
        lp->down = add_layer_param(m, l, "mlp.down_proj.weight", 2, D, F);
    }
    m->p_final_norm = add_param(m, "model.norm.weight", 1, D, 0);
    m->p_lm_head = -1;
    if (!c->logits_via_embedding) m->p_lm_head = add_param(m, "lm_head.weight", 2, m->V, D);
}

/* ------------------------------------------------------------------------------ */
/* create / free                                                                   */

mt_status mt_model_create(mt_model **out, const mt_model_config *cfg, mt_backend *be,
                          int64_t batch, int64_t seq, int64_t num_vocab_tiling) {
    if (!out || !cfg || !be) return mt_set_error(MT_ERR_INVALID, "mt_model_create: NULL argument");
    *out = NULL;
    MT_TRY(mt_model_config_validate(cfg));
    if (batch < 1) return mt_set_error(MT_ERR_INVALID, "per_device_batch_size=%lld must be >= 1", (long long)batch);
    if (seq < 1 || seq > INT32_MAX)
        return mt_set_error(MT_ERR_INVALID, "max_target_length=%lld must be in [1, 2^31)", (long long)seq);
    if (num_vocab_tiling < 1 || num_vocab_tiling > batch * seq)
        return mt_set_error(MT_ERR_INVALID, "num_vocab_tiling=%lld must be in [1, batch x seq = %lld]",
                            (long long)num_vocab_tiling, (long long)(batch * seq));

    mt_model *m = calloc(1, sizeof(*m));
    if (!m) return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    m->cfg = *cfg;
    m->be = be;
    m->B = batch;
    m->T = seq;
    m->N = batch * seq;
    m->tiles = num_vocab_tiling;
    m->D = cfg->emb_dim;
    m->V = cfg->vocab_size;
    m->F = cfg->mlp_dim;
    m->H = cfg->num_query_heads;
    m->Hkv = cfg->num_kv_heads;
    m->Dh = cfg->head_dim;
    m->QD = m->H * m->Dh;
    m->KVD = m->Hkv * m->Dh;
    m->tp = 1;
    m->fsdp = 1;
    m->cp = 1;
    m->Tg = m->T;
    for (int i = 0; i < 17; i++) m->cp_id[i] = -1;
    for (int i = 0; i < 20; i++) m->dec_id[i] = -1;
    m->Vl = m->V;
    m->QDg = m->QD;
    m->Fg = m->F;
    m->eps = cfg->normalization_layer_epsilon;
    m->dt = MT_F32;
    m->es = sizeof(float);
    m->w_off = (float)mt_model_norm_unit_offset(cfg);
    m->emb_scale = mt_model_embedding_scale(cfg);

    const int64_t L = cfg->num_decoder_layers;
    m->params = calloc((size_t)(13 * L + 3), sizeof(*m->params));
    m->lp = calloc((size_t)L, sizeof(*m->lp));
    m->lid = calloc((size_t)L, sizeof(*m->lid));
    m->lptr = calloc((size_t)L, sizeof(*m->lptr));
    m->hid = calloc((size_t)L, sizeof(*m->hid));
    m->hptr = calloc((size_t)L, sizeof(*m->hptr));
    m->inv_freq_host = calloc((size_t)m->Dh, sizeof(float));
    m->pos_host = calloc((size_t)m->T, sizeof(int32_t)); /* [T], not [B*T]: planning a huge batch allocates nothing of its size */
    if (!m->params || !m->lp || !m->lid || !m->lptr || !m->hid || !m->hptr || !m->inv_freq_host ||
        !m->pos_host) {
        mt_model_free(m);
        return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    }
    build_param_table(m);

    /* RoPE tables: global (a config with no local layers) and local (layer 0 made local). */
    mt_model_config g = *cfg, lc = *cfg;
    g.sliding_window_size = 0;
    lc.sliding_window_size = 1;
    lc.sliding_window_pattern = 2; /* layer 0 of a 2-period is local in every block */
    mt_rope_inv_freq(&g, 0, m->inv_freq_host);
    mt_rope_inv_freq(&lc, 0, m->inv_freq_host + m->Dh / 2);
    for (int64_t n = 0; n < m->T; n++) m->pos_host[n] = (int32_t)n;

    for (int i = 0; i < GB_COUNT; i++) m->gid[i] = -1;
    for (int64_t l = 0; l < L; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) m->lid[l][j] = m->hid[l][j] = -1;
    for (int j = 0; j < MT_LT_COUNT; j++) m->rs_fwd_id[j] = m->rs_bwd_id[j] = -1;
    m->remat = mt_remat_policy_keep_all();
    m->gwin_id[0] = m->gwin_id[1] = m->gwin_id[2] = -1;
    *out = m;
    return MT_OK;
}

void mt_model_free(mt_model *m) {
    if (!m) return;
    if (m->bound && m->gptr[GB_WORKSPACE]) { /* the backend no longer uses the plan's workspace */
        mt_status st = m->be->ops->sync(m->be); /* queued GEMMs done; a failure has no one to report to */
        const mt_status st2 = m->be->ops->set_workspace(m->be, NULL, 0);
        (void)st;
        (void)st2;
    }
    free(m->params);
    free(m->lp);
    free(m->lid);
    free(m->lptr);
    free(m->hid);
    free(m->hptr);
    free(m->param_layer);
    free(m->inv_freq_host);
    free(m->pos_host);
    free(m->tp_off);
    free(m->sp_counts);
    (void)mt_comm_wait(m->fsdp_req); /* NULL unless a pass stopped mid-way */
    free(m->fsdp_counts);
    free(m->cp_tok);
    free(m->cp_lab);
    free(m->cp_kpos_host);
    free(m->pack_seg);
    free(m->pack_pos);
    free(m->pack_lseg);
    free(m->pack_lpos);
    free(m->pack_kseg);
    free(m);
}

const mt_model_config *mt_model_get_config(const mt_model *m) { return &m->cfg; }

mt_backend *mt_model_backend(const mt_model *m) { return m->be; }

int mt_model_phase_count(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 4); }

/* Phases (model.h). */
static int ph_fwd(const mt_model *m, int64_t l) { (void)m; return (int)(1 + l); }
static int ph_loss(const mt_model *m) { return (int)(m->cfg.num_decoder_layers + 1); }
static int ph_bwd(const mt_model *m, int64_t l) { return (int)(2 * m->cfg.num_decoder_layers + 1 - l); }
static int ph_embed_bwd(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 2); }
static int ph_optim(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 3); }

/* ------------------------------------------------------------------------------ */
/* plan                                                                            */

/* Rows of the residual stream this rank holds: N, or N / tp under sequence
 * parallelism (rows [seq_row0, seq_row0 + seq_rows) of the N local rows). */
static int64_t seq_rows(const mt_model *m) { return m->sp ? m->N / m->tp : m->N; }
static int64_t seq_row0(const mt_model *m) { return m->sp ? m->tp_rank * (m->N / m->tp) : 0; }

/* Elements (floats) of saved tensor j of a layer; 0 when this config has none. */
static int64_t layer_act_elems(const mt_model *m, int j) {
    const mt_model_config *c = &m->cfg;
    const int64_t N = m->N, Ns = seq_rows(m);
    switch (j) {
    case MT_LT_DECODER_LAYER_INPUT: return Ns * m->D;
    case MT_LT_INPUT_NORM_RSTD: return Ns;
    case MT_LT_QUERY_NORM_RSTD: return c->use_qk_norm ? N * m->H : 0;
    case MT_LT_KEY_NORM_RSTD: return c->use_qk_norm ? N * m->Hkv : 0;
    case MT_LT_QUERY_PROJ: return N * m->QD;
    case MT_LT_KEY_PROJ: return N * m->KVD;
    case MT_LT_VALUE_PROJ: return N * m->KVD;
    case MT_LT_CONTEXT: return N * m->QD;
    case MT_LT_CONTEXT_LSE: return m->B * m->H * m->T;
    case MT_LT_OUT_PROJ: return Ns * m->D;
    case MT_LT_POST_ATTN_NORM_RSTD: return c->use_post_attn_norm ? Ns : 0;
    case MT_LT_PRE_MLP_NORM_RSTD: return Ns;
    case MT_LT_MLPWI_0: return N * m->F;
    case MT_LT_MLPWI_1: return N * m->F;
    case MT_LT_MLPWO: return c->use_post_ffw_norm ? Ns * m->D : 0;
    case MT_LT_POST_FFW_NORM_RSTD: return c->use_post_ffw_norm ? Ns : 0;
    default: return 0;
    }
}

/* Bytes of saved tensor j of a layer: the norm statistics (rstd) and the attention
 * logsumexp are fp32, every other tensor is of the activation dtype. */
static size_t layer_act_bytes(const mt_model *m, int j) {
    const int f32 = j == MT_LT_INPUT_NORM_RSTD || j == MT_LT_QUERY_NORM_RSTD || j == MT_LT_KEY_NORM_RSTD ||
                    j == MT_LT_CONTEXT_LSE || j == MT_LT_POST_ATTN_NORM_RSTD || j == MT_LT_PRE_MLP_NORM_RSTD ||
                    j == MT_LT_POST_FFW_NORM_RSTD;
    return (size_t)layer_act_elems(m, j) * (f32 ? sizeof(float) : m->es);
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* ---- remat / offload ---- */

static mt_remat_action la_action(const mt_model *m, int j) {
    int t = mt_layer_tensor_remat((mt_layer_tensor)j);
    return t < 0 ? MT_RA_DEVICE : m->remat.action[t];
}

mt_status mt_model_set_remat(mt_model *m, const mt_remat_policy *p) {
    if (!m || !p) return mt_set_error(MT_ERR_INVALID, "mt_model_set_remat: NULL argument");
    if (m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_remat: set the policy before planning");
    for (int t = 0; t < MT_RT_COUNT; t++)
        if ((int)p->action[t] < MT_RA_REMAT || (int)p->action[t] > MT_RA_DEVICE)
            return mt_set_error(MT_ERR_INVALID, "mt_model_set_remat: bad action %d for %s", (int)p->action[t],
                                mt_remat_tensor_name((mt_remat_tensor)t));
    if (p->action[MT_RT_DECODER_LAYER_INPUT] != MT_RA_DEVICE)
        return mt_set_error(MT_ERR_INVALID, "decoder_layer_input must be device (the backward recomputes from it)");
    m->remat = *p;
    m->has_offload = 0;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (la_action(m, j) == MT_RA_OFFLOAD && layer_act_elems(m, j) > 0) m->has_offload = 1;
    return MT_OK;
}

int64_t mt_model_remat_tensor_bytes(const mt_model *m, mt_remat_tensor t) {
    int64_t b = 0;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (mt_layer_tensor_remat((mt_layer_tensor)j) == (int)t) b += (int64_t)layer_act_bytes(m, j);
    return b;
}

static mt_status build_param_layer(mt_model *m);

mt_status mt_model_set_dtype(mt_model *m, mt_dtype dt) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_dtype: NULL model");
    if (m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_dtype: set the dtype before planning");
    if (dt != MT_F32 && dt != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "dtype=%s: the compute dtype is float32 or bfloat16", mt_dtype_name(dt));
    if (dt != MT_F32 && m->decode)
        return mt_set_error(MT_ERR_UNSUPPORTED, "dtype=%s: incremental decoding computes in float32",
                            mt_dtype_name(dt));
    m->dt = dt;
    m->es = mt_dtype_size(dt);
    return MT_OK;
}

void mt_model_set_compute_rounding(mt_model *m, uint64_t seed, int64_t t) {
    m->sr_seed = seed;
    m->sr_t = t;
}

mt_dtype mt_model_dtype(const mt_model *m) { return m->dt; }

mt_status mt_model_set_grad_sink(mt_model *m, mt_grad_sink_fn fn, void *ctx) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink: NULL model");
    if (m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink: set it before planning");
    m->sink = fn;
    m->sink_ctx = ctx;
    if (fn && !m->param_layer) return build_param_layer(m);
    return MT_OK;
}

mt_status mt_model_set_param_offload(mt_model *m, int on) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_param_offload: NULL model");
    if (m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_param_offload: set it before planning");
    m->param_offload = on != 0;
    if (!m->param_offload) return MT_OK;
    return build_param_layer(m);
}

/* Per-parameter layer index and the window geometry (layer_numel, tail_off) of the
 * parameter windows (host offload and fsdp). */
static mt_status build_param_layer(mt_model *m) {
    if (!m->param_layer) m->param_layer = malloc(sizeof(int) * (size_t)m->nparams);
    if (!m->param_layer) return mt_set_error(MT_ERR_OOM, "mt_model_set_param_offload: out of memory");
    for (int i = 0; i < m->nparams; i++) m->param_layer[i] = -1;
    /* each layer's parameters are consecutive entries of the table, contiguous in the
     * flat buffer, from input_layernorm to mlp.down_proj (build_param_table) */
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int i = m->lp[l].in_norm; i <= m->lp[l].down; i++) m->param_layer[i] = (int)l;
    const layer_params *l0 = &m->lp[0];
    m->layer_numel = m->params[l0->down].offset + m->params[l0->down].numel - m->params[l0->in_norm].offset;
    m->tail_off = m->params[m->p_final_norm].offset;
    m->win_layer[0] = m->win_layer[1] = -1;
    return MT_OK;
}

/* One layer's worth of scratch for every tensor that is not kept: the forward
 * computes it there (then copies it out when offloaded), the backward recomputes or
 * restores it there. Its size does not depend on the depth. */
static mt_status add_remat_scratch(mt_model *m, mt_plan *plan) {
    const int64_t L = m->cfg.num_decoder_layers;
    for (int j = 0; j < MT_LT_COUNT; j++) {
        m->rs_fwd_id[j] = m->rs_bwd_id[j] = -1;
        int64_t e = layer_act_elems(m, j);
        if (e == 0 || la_action(m, j) == MT_RA_DEVICE) continue;
        char name[MT_PLAN_NAME_MAX];
        snprintf(name, sizeof(name), "remat.fwd.%s", mt_layer_tensor_name((mt_layer_tensor)j));
        const mt_plan_tag tag = {-1, j, MT_PLAN_KIND_REMAT_SCRATCH};
        MT_TRY(mt_plan_add_tagged(plan, name, MT_MEM_SCRATCH, tag, layer_act_bytes(m, j), ph_fwd(m, 0),
                                  ph_fwd(m, L - 1), &m->rs_fwd_id[j]));
        snprintf(name, sizeof(name), "remat.bwd.%s", mt_layer_tensor_name((mt_layer_tensor)j));
        MT_TRY(mt_plan_add_tagged(plan, name, MT_MEM_SCRATCH, tag, layer_act_bytes(m, j), ph_bwd(m, L - 1),
                                  ph_bwd(m, 0), &m->rs_bwd_id[j]));
    }
    return MT_OK;
}

mt_status mt_model_add_to_host_plan(mt_model *m, mt_plan *host_plan) {
    if (!m || !host_plan) return mt_set_error(MT_ERR_INVALID, "mt_model_add_to_host_plan: NULL argument");
    if (!m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_add_to_host_plan: call mt_model_add_to_plan first");
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) {
            m->hid[l][j] = -1;
            int64_t e = layer_act_elems(m, j);
            if (e == 0 || la_action(m, j) != MT_RA_OFFLOAD) continue;
            char name[MT_PLAN_NAME_MAX];
            snprintf(name, sizeof(name), "layers.%lld.%s", (long long)l, mt_layer_tensor_name((mt_layer_tensor)j));
            const mt_plan_tag tag = {l, j, MT_PLAN_KIND_OFFLOAD};
            MT_TRY(mt_plan_add_tagged(host_plan, name, MT_MEM_ACTIVATIONS, tag, layer_act_bytes(m, j),
                                      ph_fwd(m, l), ph_bwd(m, l), &m->hid[l][j]));
        }
    m->hparams_id = -1;
    if (m->param_offload) /* under fsdp this rank's shard only */
        MT_TRY(mt_plan_add(host_plan, m->fsdp > 1 ? "params.shard" : "params", MT_MEM_PARAMS,
                           (size_t)(m->fsdp > 1 ? m->fhi - m->flo : m->numel) * sizeof(float), 0, ph_optim(m),
                           &m->hparams_id));
    m->host_planned = 1;
    m->host_bound = 0;
    return MT_OK;
}

static mt_status plan_add(mt_model *m, mt_plan *plan, int g, const char *name, mt_mem_category cat,
                          size_t bytes, int first, int last) {
    return mt_plan_add(plan, name, cat, bytes, first, last, &m->gid[g]);
}

/* A step input or constant table (tokens, positions, RoPE frequencies, ...). */
static mt_status plan_add_input(mt_model *m, mt_plan *plan, int g, const char *name, size_t bytes, int first,
                                int last) {
    const mt_plan_tag tag = {-1, -1, MT_PLAN_KIND_INPUT};
    return mt_plan_add_tagged(plan, name, MT_MEM_ACTIVATIONS, tag, bytes, first, last, &m->gid[g]);
}

static mt_status cp_add_to_plan(mt_model *m, mt_plan *plan, int first, int last);

static mt_status decode_add_to_plan(mt_model *m, mt_plan *plan);

mt_status mt_model_add_to_plan(mt_model *m, mt_plan *plan) {
    if (!m || !plan) return mt_set_error(MT_ERR_INVALID, "mt_model_add_to_plan: NULL argument");
    if (m->decode) return decode_add_to_plan(m, plan);
    const int64_t L = m->cfg.num_decoder_layers, N = m->N, D = m->D, F = m->F;
    const int64_t QD = m->QD, KVD = m->KVD;
    const size_t f4 = sizeof(float), i4 = sizeof(int32_t), es = m->es;
    const int last = ph_optim(m);
    const int fwd0 = ph_fwd(m, 0), fwd1 = ph_fwd(m, L - 1);
    const int bwd0 = ph_bwd(m, L - 1), bwd1 = ph_bwd(m, 0);
    const int loss = ph_loss(m);

    if (m->dt != MT_F32) {
        /* bf16 compute so far on one layout: the tensor- and context-axis collectives,
         * the fsdp windows and the parameter host pool still move fp32 */
        const char *what = m->tp > 1 ? "ici_tensor_parallelism > 1" : m->cp > 1 ? "ici_context_parallelism > 1"
                         : m->fsdp > 1 ? "ici_fsdp_parallelism > 1" : m->param_offload ? "parameter_memory_host_offload"
                         : NULL;
        if (what)
            return mt_set_error(MT_ERR_UNSUPPORTED, "dtype=%s with %s is not supported yet (use dtype=float32)",
                                mt_dtype_name(m->dt), what);
        MT_TRY(plan_add(m, plan, GB_COMPUTE_W, "params.compute", MT_MEM_PARAMS, (size_t)m->numel * es, 0, last));
    }
    if (!m->param_offload && m->fsdp == 1) {
        MT_TRY(plan_add(m, plan, GB_PARAMS, "params", MT_MEM_PARAMS, (size_t)m->numel * f4, 0, last));
    } else { /* the parameters live in the host pool (or, fsdp, as shards); the device holds windows */
        m->gid[GB_PARAMS] = -1;
        if (m->fsdp > 1 && !m->param_offload) /* with offload the shard is in the host pool */
            MT_TRY(plan_add(m, plan, GB_PARAMS, "params.shard", MT_MEM_PARAMS, (size_t)(m->fhi - m->flo) * f4, 0,
                            last));
        MT_TRY(mt_plan_add(plan, "params.window.layer0", MT_MEM_PARAMS, (size_t)m->layer_numel * f4, 0, last,
                           &m->pwin_id[0]));
        MT_TRY(mt_plan_add(plan, "params.window.layer1", MT_MEM_PARAMS, (size_t)m->layer_numel * f4, 0, last,
                           &m->pwin_id[1]));
        MT_TRY(mt_plan_add(plan, "params.window.global", MT_MEM_PARAMS,
                           (size_t)(m->params[m->p_embed].numel + m->numel - m->tail_off) * f4, 0, last,
                           &m->pwin_id[2]));
    }
    if (!m->sink) {
        MT_TRY(plan_add(m, plan, GB_GRADS, "grads", MT_MEM_GRADS, (size_t)m->numel * f4, 0, last));
    } else { /* gradient sink: windows live while their gradients are written (mt_model_set_grad_sink) */
        m->gid[GB_GRADS] = -1;
        MT_TRY(mt_plan_add(plan, "grads.window.layer", MT_MEM_GRADS, (size_t)m->layer_numel * f4, bwd0, bwd1,
                           &m->gwin_id[0]));
        MT_TRY(mt_plan_add(plan, "grads.window.embedding", MT_MEM_GRADS, (size_t)m->params[m->p_embed].numel * f4,
                           m->cfg.logits_via_embedding ? loss : ph_embed_bwd(m), ph_embed_bwd(m), &m->gwin_id[1]));
        MT_TRY(mt_plan_add(plan, "grads.window.tail", MT_MEM_GRADS, (size_t)(m->numel - m->tail_off) * f4, loss,
                           loss, &m->gwin_id[2]));
    }
    /* Step inputs: uploaded in phase 0 (labels in the loss phase), kept while used. */
    MT_TRY(plan_add_input(m, plan, GB_TOKENS, "tokens", (size_t)N * i4, 0, ph_embed_bwd(m)));
    MT_TRY(plan_add_input(m, plan, GB_LABELS, "labels", (size_t)N * i4, loss, loss));
    MT_TRY(plan_add_input(m, plan, GB_STEP_STATS, "step_stats", MT_MODEL_STATS * sizeof(double), 0, last));
    MT_TRY(plan_add_input(m, plan, GB_POSITIONS, "positions", (size_t)N * i4, 0, bwd1));
    MT_TRY(plan_add_input(m, plan, GB_INV_FREQ, "rope_inv_freq", (size_t)m->Dh * f4, 0, bwd1));
    if (m->packing) { /* document masking: written with the positions, read by every layer */
        MT_TRY(plan_add_input(m, plan, GB_SEGMENTS, "segment_ids", (size_t)N * i4, 0, bwd1));
        MT_TRY(plan_add_input(m, plan, GB_DOC_POS, "document_positions", (size_t)N * i4, 0, bwd1));
    }

    /* Saved activations of layer l: written in phase l (decoder_layer_input: by the
     * embedding or the previous layer) or 1 + l, read last by the layer's backward. */
    for (int64_t l = 0; l < L; l++) {
        for (int j = 0; j < MT_LT_COUNT; j++) {
            int64_t e = layer_act_elems(m, j);
            if (e == 0) continue;
            char name[MT_PLAN_NAME_MAX];
            snprintf(name, sizeof(name), "layers.%lld.%s", (long long)l, mt_layer_tensor_name((mt_layer_tensor)j));
            int first = j == MT_LT_DECODER_LAYER_INPUT ? (int)l : ph_fwd(m, l);
            m->lid[l][j] = -1;
            if (la_action(m, j) != MT_RA_DEVICE) continue; /* recomputed or offloaded */
            const mt_plan_tag tag = {l, j, MT_PLAN_KIND_SAVED};
            MT_TRY(mt_plan_add_tagged(plan, name, MT_MEM_ACTIVATIONS, tag, layer_act_bytes(m, j), first, ph_bwd(m, l),
                                      &m->lid[l][j]));
        }
    }
    const int64_t Ns = seq_rows(m); /* residual-stream rows (sequence parallelism: N / tp) */
    MT_TRY(plan_add(m, plan, GB_FINAL_INPUT, "final_norm_input", MT_MEM_ACTIVATIONS, (size_t)(Ns * D) * es,
                    fwd1, loss));
    MT_TRY(plan_add(m, plan, GB_FINAL_RSTD, "final_norm_rstd", MT_MEM_ACTIVATIONS, (size_t)Ns * f4, loss, loss));
    MT_TRY(plan_add(m, plan, GB_FINAL_HIDDEN, "final_hidden", MT_MEM_ACTIVATIONS, (size_t)(N * D) * es, loss,
                    loss));
    MT_TRY(plan_add(m, plan, GB_FINAL_HIDDEN_GRAD, "final_hidden_grad", MT_MEM_SCRATCH, (size_t)(N * D) * es,
                    loss, loss));
    MT_TRY(plan_add(m, plan, GB_LOSS_TILE, "loss_tile", MT_MEM_LOSS_TILE,
                    (size_t)(mt_tiled_loss_tile_rows(N, m->tiles) * m->Vl) * f4, loss, loss));
    if (m->dt != MT_F32) /* the dlogits operand of the loss tile's backward GEMMs (kernels/tiled_loss.h) */
        MT_TRY(plan_add(m, plan, GB_LOSS_DTILE, "loss_tile.dlogits", MT_MEM_LOSS_TILE,
                        (size_t)(mt_tiled_loss_tile_rows(N, m->tiles) * m->Vl) * es, loss, loss));
    if (m->tp > 1) /* the vocab-parallel loss's row max and sums, all-reduced over the tensor group */
        MT_TRY(plan_add(m, plan, GB_LOSS_VOCAB_STATS, "loss_tile.vocab_stats", MT_MEM_LOSS_TILE,
                        mt_vocab_loss_scratch_bytes(N, m->tiles), loss, loss));
    MT_TRY(plan_add(m, plan, GB_RESID_GRAD, "residual_grad", MT_MEM_SCRATCH, (size_t)(Ns * D) * es, loss,
                    ph_embed_bwd(m)));

    /* Forward scratch, shared by the layers' forward phases. */
    MT_TRY(plan_add(m, plan, GB_FWD_NORM, "fwd.normed", MT_MEM_SCRATCH, (size_t)(N * D) * es, fwd0, fwd1));
    MT_TRY(plan_add(m, plan, GB_FWD_RESID, "fwd.residual", MT_MEM_SCRATCH, (size_t)(Ns * D) * es, fwd0, fwd1));
    MT_TRY(plan_add(m, plan, GB_FWD_TMP, "fwd.tmp", MT_MEM_SCRATCH, (size_t)(N * max64(D, QD)) * es, fwd0,
                    fwd1));
    MT_TRY(plan_add(m, plan, GB_FWD_GLU, "fwd.glu", MT_MEM_SCRATCH, (size_t)(N * F) * es, fwd0, fwd1));
    /* Backward scratch, shared by the layers' backward phases. */
    MT_TRY(plan_add(m, plan, GB_BWD_NORM, "bwd.normed", MT_MEM_SCRATCH, (size_t)(N * D) * es, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_RESID, "bwd.residual", MT_MEM_SCRATCH, (size_t)(Ns * D) * es, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_D1, "bwd.d_model_a", MT_MEM_SCRATCH, (size_t)(N * D) * es, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_D2, "bwd.d_model_b", MT_MEM_SCRATCH, (size_t)(N * D) * es, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W0, "bwd.work0", MT_MEM_SCRATCH, (size_t)(N * max64(F, QD)) * es, bwd0,
                    bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W1, "bwd.work1", MT_MEM_SCRATCH, (size_t)(N * max64(F, QD)) * es, bwd0,
                    bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W2, "bwd.work2", MT_MEM_SCRATCH, (size_t)(N * max64(F, KVD)) * es, bwd0,
                    bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W3, "bwd.work3", MT_MEM_SCRATCH, (size_t)(N * KVD) * es, bwd0, bwd1));
    if (m->cfg.use_qk_norm)
        MT_TRY(plan_add(m, plan, GB_BWD_W4, "bwd.work4", MT_MEM_SCRATCH, (size_t)(N * QD) * es, bwd0, bwd1));
    if (m->be->caps.workspace_bytes > 0) /* cuBLASLt's, the whole step */
        MT_TRY(plan_add(m, plan, GB_WORKSPACE, "workspace.gemm", MT_MEM_WORKSPACE, m->be->caps.workspace_bytes, 0,
                        last));
    MT_TRY(add_remat_scratch(m, plan));
    MT_TRY(cp_add_to_plan(m, plan, fwd0, bwd1));
    m->planned = 1;
    m->host_planned = 0;
    m->host_bound = 0;
    m->bound = 0;
    return MT_OK;
}

static mt_status bind_one(const mt_arena *arena, const mt_plan *plan, int id, void **ptr) {
    *ptr = NULL;
    if (id < 0) return MT_OK;
    *ptr = mt_arena_ptr(arena, plan, id);
    if (!*ptr) return mt_set_error(MT_ERR_INVALID, "mt_model_bind: plan entry %d missing from the arena", id);
    return MT_OK;
}

mt_status mt_model_bind(mt_model *m, const mt_arena *arena, const mt_plan *plan) {
    if (!m || !arena || !plan) return mt_set_error(MT_ERR_INVALID, "mt_model_bind: NULL argument");
    if (!m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_bind: call mt_model_add_to_plan first");
    if (m->gid[GB_GRADS] >= mt_plan_count(plan))
        return mt_set_error(MT_ERR_INVALID, "mt_model_bind: not the plan this model was added to");
    if (m->cp > 1 && !m->cp_tok) { /* host [N] row selections of context parallelism */
        m->cp_tok = malloc(sizeof(int32_t) * (size_t)m->N);
        m->cp_lab = malloc(sizeof(int32_t) * (size_t)m->N);
        if (!m->cp_tok || !m->cp_lab) return mt_set_error(MT_ERR_OOM, "mt_model_bind: out of memory");
    }
    if (m->packing && !m->pack_seg) { /* host ids and positions of the whole window */
        const size_t full = sizeof(int32_t) * (size_t)(m->B * m->Tg);
        m->pack_seg = malloc(full);
        m->pack_pos = malloc(full);
        if (m->cp > 1) {
            m->pack_lseg = malloc(sizeof(int32_t) * (size_t)m->N);
            m->pack_lpos = malloc(sizeof(int32_t) * (size_t)m->N);
            m->pack_kseg = malloc(full);
        }
        if (!m->pack_seg || !m->pack_pos || (m->cp > 1 && (!m->pack_lseg || !m->pack_lpos || !m->pack_kseg)))
            return mt_set_error(MT_ERR_OOM, "mt_model_bind: out of memory");
    }
    m->fwd_kept = 0;
    for (int g = 0; g < GB_COUNT; g++) MT_TRY(bind_one(arena, plan, m->gid[g], &m->gptr[g]));
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) {
            void *p;
            MT_TRY(bind_one(arena, plan, m->lid[l][j], &p));
            m->lptr[l][j] = p;
        }
    for (int w = 0; (m->param_offload || m->fsdp > 1) && w < 3; w++) {
        void *p;
        MT_TRY(bind_one(arena, plan, m->pwin_id[w], &p));
        m->pwin[w] = p;
    }
    for (int w = 0; w < 3; w++) {
        void *p;
        MT_TRY(bind_one(arena, plan, m->sink ? m->gwin_id[w] : -1, &p));
        m->gwin[w] = p;
    }
    for (int j = 0; j < MT_LT_COUNT; j++) {
        void *p;
        MT_TRY(bind_one(arena, plan, m->rs_fwd_id[j], &p));
        m->rs_fwd[j] = p;
        MT_TRY(bind_one(arena, plan, m->rs_bwd_id[j], &p));
        m->rs_bwd[j] = p;
    }
    for (int i = 0; i < 17; i++) MT_TRY(bind_one(arena, plan, m->cp_id[i], &m->cp_buf[i]));
    for (int i = 0; i < 20; i++) MT_TRY(bind_one(arena, plan, m->dec_id[i], &m->dec_buf[i]));
    m->dec_len = 0; /* a new arena: the caches are empty */
    if (m->gptr[GB_WORKSPACE])
        MT_TRY(m->be->ops->set_workspace(m->be, m->gptr[GB_WORKSPACE], m->be->caps.workspace_bytes));
    m->bound = 1;
    return MT_OK;
}

mt_status mt_model_bind_host(mt_model *m, const mt_arena *host_arena, const mt_plan *host_plan) {
    if (!m || !host_arena || !host_plan) return mt_set_error(MT_ERR_INVALID, "mt_model_bind_host: NULL argument");
    if (!m->host_planned)
        return mt_set_error(MT_ERR_INVALID, "mt_model_bind_host: call mt_model_add_to_host_plan first");
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) {
            void *p;
            MT_TRY(bind_one(host_arena, host_plan, m->hid[l][j], &p));
            m->hptr[l][j] = p;
        }
    if (m->param_offload) MT_TRY(bind_one(host_arena, host_plan, m->hparams_id, &m->gptr[GB_PARAMS]));
    m->host_bound = 1;
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* parameters                                                                      */

int mt_model_param_count(const mt_model *m) { return m->nparams; }

const mt_param_info *mt_model_param(const mt_model *m, int i) {
    if (i < 0 || i >= m->nparams) return NULL;
    return &m->params[i];
}

int mt_model_param_find(const mt_model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

int64_t mt_model_numel(const mt_model *m) { return m->numel; }
float *mt_model_params(mt_model *m) { return m->gptr[GB_PARAMS]; }
float *mt_model_grads(mt_model *m) { return m->gptr[GB_GRADS]; }
double *mt_model_step_stats(mt_model *m) { return m->bound ? m->gptr[GB_STEP_STATS] : NULL; }

mt_status mt_model_init_params(mt_model *m, uint64_t seed) {
    if (!m->bound) return mt_set_error(MT_ERR_INVALID, "mt_model_init_params: model not bound to an arena");
    m->fwd_kept = 0; /* new weights: the saved activations are stale */
    float *base = m->gptr[GB_PARAMS];
    int64_t maxn = 0;
    for (int i = 0; i < m->nparams; i++) maxn = max64(maxn, m->params[i].numel);
    float *h = malloc((size_t)maxn * sizeof(float));
    if (!h) return mt_set_error(MT_ERR_OOM, "mt_model_init_params: cannot allocate %lld floats", (long long)maxn);
    const float norm_init = m->w_off != 0.0f ? 0.0f : 1.0f;
    for (int i = 0; i < m->nparams; i++) {
        const mt_param_info *p = &m->params[i];
        if (p->ndim == 2) {
            mt_rng_fill_normal(h, (size_t)p->numel, 0.02f, seed, (uint64_t)i);
        } else {
            for (int64_t j = 0; j < p->numel; j++) h[j] = norm_init;
        }
        if (m->fsdp > 1) { /* this rank's shard [flo, fhi) only */
            const int64_t a = p->offset > m->flo ? p->offset : m->flo;
            const int64_t b = p->offset + p->numel < m->fhi ? p->offset + p->numel : m->fhi;
            if (b > a) MT_TRY(m->be->ops->copy_to_device(m->be, base + (a - m->flo), h + (a - p->offset), (size_t)(b - a) * sizeof(float)));
            continue;
        }
        MT_TRY(m->be->ops->copy_to_device(m->be, base + p->offset, h, (size_t)p->numel * sizeof(float)));
    }
    free(h);
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* forward / backward                                                              */

/* Parameter i (its tensor-parallel slice: see "tensor parallelism" below) as the
 * layers compute with it: the fp32 master, or with dtype bfloat16 the bf16 compute copy
 * (GB_COMPUTE_W, the same flat layout). */
static const void *PW(const mt_model *m, int i) {
    const int64_t tp = m->tp_off ? m->tp_off[i] : 0;
    if (m->dt != MT_F32) return AT(m, m->gptr[GB_COMPUTE_W], m->params[i].offset + tp);
    if (!m->param_offload && m->fsdp == 1) return (const float *)m->gptr[GB_PARAMS] + m->params[i].offset + tp;
    /* parameter host offload / fsdp: the device window holding parameter i */
    const int64_t off = m->params[i].offset;
    const int l = m->param_layer[i];
    if (l < 0) {
        const int64_t emb = m->params[m->p_embed].numel;
        return m->pwin[2] + (off < emb ? off : emb + off - m->tail_off) + tp;
    }
    const int s = m->win_layer[0] == l ? 0 : 1;
    return m->pwin[s] + (off - m->params[m->lp[l].in_norm].offset) + tp;
}

/* Parameter host offload: bring layer l's parameters into its window (slot l % 2; a
 * no-op when it is there already), and the embedding, final norm and head into the
 * global window at the start of every forward (the optimizer may have changed them).
 * fsdp: first complete the prefetch in flight (prefetch_layer), which may be layer l. */
static void fsdp_gather(mt_model *m, float *win, int64_t a, int64_t b, int async);
static void fsdp_wait(mt_model *m);
static mt_status MT_MUST_CHECK fetch_layer(mt_model *m, int64_t l) {
    if (!m->param_offload && m->fsdp == 1) return MT_OK;
    fsdp_wait(m);
    const int s = (int)(l % 2);
    if (m->win_layer[s] == l) return MT_OK;
    const int64_t a = m->params[m->lp[l].in_norm].offset;
    if (m->fsdp > 1)
        fsdp_gather(m, m->pwin[s], a, a + m->layer_numel, 0);
    else
        MT_TRY(m->be->ops->copy_to_device(m->be, m->pwin[s], (const float *)m->gptr[GB_PARAMS] + a,
                               (size_t)m->layer_numel * sizeof(float)));
    m->win_layer[s] = l;
    return MT_OK;
}
/* fsdp prefetch: start the all-gather of layer l's window (slot l % 2) so that it
 * overlaps the layer being computed (forward: l = current + 1; backward: l = current -
 * 1, whose slot the current layer does not use); fetch_layer(l) waits for it. A no-op
 * outside [0, L), without fsdp, when l is in its slot already or while another
 * prefetch is in flight, so it gathers exactly the layers fetch_layer would have
 * (mt_model_fsdp_gather_floats holds) and needs no window beyond the two layer slots. */
static void prefetch_layer(mt_model *m, int64_t l) {
    if (m->fsdp == 1 || l < 0 || l >= m->cfg.num_decoder_layers || m->fsdp_req) return;
    const int s = (int)(l % 2);
    if (m->win_layer[s] == l) return;
    const int64_t a = m->params[m->lp[l].in_norm].offset;
    fsdp_gather(m, m->pwin[s], a, a + m->layer_numel, 1);
    m->win_layer[s] = m->tp_status == MT_OK ? l : -1;
}
static mt_status MT_MUST_CHECK fetch_global(mt_model *m) {
    if (!m->param_offload && m->fsdp == 1) return MT_OK;
    fsdp_wait(m);
    const int64_t emb = m->params[m->p_embed].numel;
    if (m->fsdp > 1) {
        fsdp_gather(m, m->pwin[2], 0, emb, 0);
        fsdp_gather(m, m->pwin[2] + emb, m->tail_off, m->numel, 0);
        m->win_layer[0] = m->win_layer[1] = -1;
        return MT_OK;
    }
    const float *host = m->gptr[GB_PARAMS];
    MT_TRY(m->be->ops->copy_to_device(m->be, m->pwin[2], host, (size_t)emb * sizeof(float)));
    MT_TRY(m->be->ops->copy_to_device(m->be, m->pwin[2] + emb, host + m->tail_off, (size_t)(m->numel - m->tail_off) * sizeof(float)));
    m->win_layer[0] = m->win_layer[1] = -1;
    return MT_OK;
}
/* The gradient of parameter i (its tensor-parallel slice): in the full buffer, or with
 * a gradient sink in the layer window (layer parameters), the embedding window or the
 * tail window (model.norm, lm_head). */
static float *GW(const mt_model *m, int i) {
    const int64_t tp = m->tp_off ? m->tp_off[i] : 0, off = m->params[i].offset;
    if (!m->sink) return (float *)m->gptr[GB_GRADS] + off + tp;
    const int l = m->param_layer[i];
    if (l >= 0) return m->gwin[0] + (off - m->params[m->lp[l].in_norm].offset) + tp;
    if (i == m->p_embed) return m->gwin[1] + tp;
    return m->gwin[2] + (off - m->tail_off) + tp;
}

/* Gradient sink, before a backward: zero the tail window and (tied: the loss adds to
 * it) the embedding window; an untied embedding window is zeroed before its backward. */
static mt_status MT_MUST_CHECK grad_windows_begin(mt_model *m) {
    if (!m->sink) return MT_OK;
    MT_TRY(m->be->ops->zero(m->be, m->gwin[2], (size_t)(m->numel - m->tail_off) * sizeof(float)));
    if (m->cfg.logits_via_embedding)
        MT_TRY(m->be->ops->zero(m->be, m->gwin[1], (size_t)m->params[m->p_embed].numel * sizeof(float)));
    return MT_OK;
}

/* y[N, out] = x[N, in] W^T + beta y, W [out, in] (HF nn.Linear); all of m->dt. */
static mt_status MT_MUST_CHECK linear_fwd(const mt_model *m, void *y, const void *x, const void *W, int64_t N,
                                          int64_t in, int64_t out, float beta) {
    return m->be->ops->gemm(m->be, 0, 1, N, out, in, 1.0f, x, in, W, in, m->dt, beta, y, out, m->dt);
}
/* dW[out, in] (fp32) += dy[N, out]^T x[N, in] */
static mt_status MT_MUST_CHECK linear_bwd_w(const mt_model *m, float *dW, const void *dy, const void *x, int64_t N,
                                            int64_t in, int64_t out) {
    return m->be->ops->gemm(m->be, 1, 0, out, in, N, 1.0f, dy, out, x, in, m->dt, 1.0f, dW, in, MT_F32);
}
/* dx[N, in] = dy[N, out] W + beta dx */
static mt_status MT_MUST_CHECK linear_bwd_x(const mt_model *m, void *dx, const void *dy, const void *W, int64_t N,
                                            int64_t in, int64_t out, float beta) {
    return m->be->ops->gemm(m->be, 0, 0, N, in, out, 1.0f, dy, out, W, in, m->dt, beta, dx, in, m->dt);
}

/* ---- tensor parallelism (Megatron-LM: Shoeybi et al. 2019, section 3) ----
 * Column-parallel q/k/v and gate/up: rank t computes its heads' / its mlp columns'
 * rows of the weight, a contiguous block (PW's slice offset is all it takes).
 * Row-parallel o_proj and down_proj: rank t reads the matching columns (row stride =
 * the global input width) and its output is a partial sum, all-reduced over the
 * tensor group. Backward: the column-parallel input gradient (d of the normed input)
 * is a partial sum, all-reduced before the norm's backward; the row-parallel input
 * gradient is local. With one rank these are exactly linear_fwd/_bwd_w/_bwd_x. */

static void tp_sum(mt_model *m, void *x, int64_t n) {
    if (m->tp > 1 && m->tp_status == MT_OK) m->tp_status = mt_comm_all_reduce(m->tp_comm, x, n, MT_COMM_F32);
}

/* ---- sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
 * Recomputation in Large Transformer Models", section 4.2.2), on top of tensor
 * parallelism: the residual stream (layer inputs, residual adds, norm inputs and
 * statistics, o_proj / down_proj outputs, its gradient) holds only this rank's
 * seq_rows = N / tp rows (a contiguous block of the N local rows). Each norm runs on
 * those rows and its output is all-gathered over the tensor group before the
 * column-parallel GEMMs; the row-parallel GEMM's partial sums are reduce-scattered
 * instead of all-reduced. Backward: the gradient entering a row-parallel GEMM is
 * all-gathered, the column-parallel input gradient reduce-scattered, and the norm
 * outputs the backward recomputes are all-gathered again (Megatron-LM does the same
 * rather than keep the full normed input). Per layer and micro-batch: 4 all-gathers /
 * reduce-scatters of N x D floats in the forward, 6 in the backward (all tensors
 * kept), each moving (tp - 1) / tp of N x D x 4 bytes. Without it these helpers are
 * the plain full-row ops. */

/* full[N, D]: this rank's rows [row0, row0 + rows) already written there; under
 * sequence parallelism all-gather the other ranks' rows (no-op otherwise). */
static void sp_gather(mt_model *m, void *full) {
    if (!m->sp || m->tp_status != MT_OK) return;
    m->tp_status = mt_comm_all_gather(m->tp_comm, AT(m, full, seq_row0(m) * m->D), full, m->sp_counts, MT_COMM_F32);
}

/* full[N, D] = RMSNorm(x) where x holds this rank's residual rows (all rows without
 * sequence parallelism); rstd gets this rank's rows' statistics. */
static mt_status MT_MUST_CHECK norm_gather(mt_model *m, void *full, float *rstd, const void *x, int wi) {
    MT_TRY(m->be->ops->rmsnorm_fwd(m->be, AT(m, full, seq_row0(m) * m->D), rstd, x, PW(m, wi), seq_rows(m), m->D, m->eps,
                                   m->w_off, m->dt));
    sp_gather(m, full);
    return MT_OK;
}

/* h = x + r on this rank's residual rows (one rounding), and full[N, D] = RMSNorm(h)
 * gathered as norm_gather does: the residual add fused into the norm (ops.h
 * add_rmsnorm_fwd), bitwise the copy + axpy + norm_gather it replaces. */
static mt_status MT_MUST_CHECK add_norm_gather(mt_model *m, void *h, void *full, float *rstd, const void *x,
                                               const void *r, int wi) {
    MT_TRY(m->be->ops->add_rmsnorm_fwd(m->be, h, AT(m, full, seq_row0(m) * m->D), rstd, x, r, PW(m, wi), seq_rows(m),
                                       m->D, m->eps, m->w_off, m->dt));
    sp_gather(m, full);
    return MT_OK;
}

/* The partial input gradient d[N, D] of the column-parallel GEMMs summed over the
 * tensor group: all-reduced in place (returns d), or under sequence parallelism
 * reduce-scattered into this rank's rows of part[seq_rows, D] (returns part). */
static const void *tp_sum_input_grad(mt_model *m, void *d, void *part) {
    if (!m->sp) {
        tp_sum(m, d, m->N * m->D);
        return d;
    }
    if (m->tp_status == MT_OK) m->tp_status = mt_comm_reduce_scatter(m->tp_comm, d, part, m->sp_counts, MT_COMM_F32);
    return part;
}

/* y = (beta: y +) sum over the group of x[N, in_l] W_slice^T; W_slice = columns of
 * parameter pi with row stride ldw. y has N rows, or seq_rows under sequence
 * parallelism (the sum reduce-scattered). full [N, D] scratch is needed under sequence
 * parallelism; part [N, D] (sequence parallel: [seq_rows, D]) when beta != 0 and tp > 1. */
static mt_status MT_MUST_CHECK row_fwd(mt_model *m, void *y, const void *x, int pi, int64_t in_l, int64_t ldw,
                                       float beta, void *full, void *part) {
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D;
    if (m->tp == 1)
        return be->ops->gemm(be, 0, 1, N, D, in_l, 1.0f, x, in_l, PW(m, pi), ldw, m->dt, beta, y, D, m->dt);
    void *dst = beta == 0.0f ? y : part;
    if (m->sp) {
        MT_TRY(be->ops->gemm(be, 0, 1, N, D, in_l, 1.0f, x, in_l, PW(m, pi), ldw, m->dt, 0.0f, full, D, m->dt));
        if (m->tp_status == MT_OK)
            m->tp_status = mt_comm_reduce_scatter(m->tp_comm, full, dst, m->sp_counts, MT_COMM_F32);
    } else {
        MT_TRY(be->ops->gemm(be, 0, 1, N, D, in_l, 1.0f, x, in_l, PW(m, pi), ldw, m->dt, 0.0f, dst, D, m->dt));
        tp_sum(m, dst, N * D);
    }
    if (beta != 0.0f) MT_TRY(be->ops->axpy(be, y, part, 1.0f, seq_rows(m) * D, m->dt));
    return MT_OK;
}
/* dW_slice[D, in_l] (fp32, row stride ldw) += dy[N, D]^T x[N, in_l] */
static mt_status MT_MUST_CHECK row_bwd_w(mt_model *m, int pi, const void *dy, const void *x, int64_t in_l,
                                         int64_t ldw) {
    return m->be->ops->gemm(m->be, 1, 0, m->D, in_l, m->N, 1.0f, dy, m->D, x, in_l, m->dt, 1.0f, GW(m, pi), ldw,
                            MT_F32);
}
/* dx[N, in_l] = dy[N, D] W_slice + beta dx */
static mt_status MT_MUST_CHECK row_bwd_x(mt_model *m, void *dx, const void *dy, int pi, int64_t in_l, int64_t ldw,
                                         float beta) {
    return m->be->ops->gemm(m->be, 0, 0, m->N, in_l, m->D, 1.0f, dy, m->D, PW(m, pi), ldw, m->dt, beta, dx, in_l,
                            m->dt);
}

static mt_attn_args attn_args(const mt_model *m, int64_t l) {
    mt_attn_args a;
    memset(&a, 0, sizeof(a));
    a.B = m->B;
    a.Tq = a.Tk = m->T;
    a.H = m->H;
    a.Hkv = m->Hkv;
    a.Dh = m->Dh;
    a.scale = mt_model_attn_scale(&m->cfg);
    a.softcap = m->cfg.attn_logits_soft_cap;
    a.window = mt_model_layer_is_local(&m->cfg, l) ? m->cfg.sliding_window_size : 0;
    a.dtype = m->dt;
    a.q_pos = NULL;
    a.k_pos = NULL;
    return a;
}

/* RoPE positions of the local rows: per document with packing, else the original ones. */
static const int32_t *rope_positions(const mt_model *m) {
    return m->gptr[m->packing ? GB_DOC_POS : GB_POSITIONS];
}

static const float *layer_inv_freq(const mt_model *m, int64_t l) {
    const float *t = m->gptr[GB_INV_FREQ];
    return mt_model_layer_is_local(&m->cfg, l) ? t + m->Dh / 2 : t;
}

/* ---- context parallelism (Liu et al., Ring Attention, 2023, arXiv:2310.01889;
 * Megatron-LM's causal load balancing): the sequence is cut into 2C chunks of Tc rows,
 * rank i holds chunks i and 2C-1-i of every sequence (rows [B, 2Tc]). RoPE and the
 * causal mask use the original positions. Forward: K and V (after RoPE) are
 * all-gathered over the context group and reordered to [B, Tg] (k_pos gives each
 * gathered row's original position), then attention of the local queries against
 * all keys. Backward: K and V are gathered again, the attention backward gives dK, dV
 * for all keys, which are reduce-scattered back to their owners. With one rank these
 * are exactly the attention ops. */

enum {
    CP_STAGE = 0, CP_K, CP_V, CP_DK, CP_DV, /* all_gather: [B, Tg, KVD] each */
    CP_KPOS,                                /* [Tg] int32 (both strategies) */
    CP_RK0, CP_RV0, CP_RK1, CP_RV1,         /* ring: K/V blocks in flight, [B, 2Tc, KVD] */
    CP_RDK0, CP_RDV0, CP_RDK1, CP_RDV1,     /* ring: their travelling gradients */
    CP_ROUT, CP_RLSE,                       /* ring: one block's output [N, QD] / lse [B, H, 2Tc] */
    CP_KSEG                                 /* packing: key segment ids [B, Tg] gathered order, ring:
                                             * [C][B, 2Tc] (block of rank src at src * N) */
};

static mt_status cp_add_to_plan(mt_model *m, mt_plan *plan, int first, int last) {
    if (m->cp == 1) return MT_OK;
    const size_t f4 = sizeof(float);
    MT_TRY(mt_plan_add(plan, "cp.k_positions", MT_MEM_COMM, (size_t)m->Tg * sizeof(int32_t), first, last,
                       &m->cp_id[CP_KPOS]));
    if (m->packing)
        MT_TRY(mt_plan_add(plan, "cp.k_segment_ids", MT_MEM_COMM, (size_t)(m->B * m->Tg) * sizeof(int32_t), first,
                           last, &m->cp_id[CP_KSEG]));
    if (!m->cp_ring) {
        const size_t full = (size_t)(m->B * m->Tg * m->KVD) * m->es;
        static const char *const names[5] = {"cp.gather_stage", "cp.k_full", "cp.v_full", "cp.dk_full",
                                             "cp.dv_full"};
        for (int i = 0; i < 5; i++) MT_TRY(mt_plan_add(plan, names[i], MT_MEM_COMM, full, first, last, &m->cp_id[i]));
        return MT_OK;
    }
    static const char *const rn[8] = {"cp.ring.k0", "cp.ring.v0", "cp.ring.k1", "cp.ring.v1",
                                      "cp.ring.dk0", "cp.ring.dv0", "cp.ring.dk1", "cp.ring.dv1"};
    for (int i = 0; i < 8; i++)
        MT_TRY(mt_plan_add(plan, rn[i], MT_MEM_COMM, (size_t)(m->N * m->KVD) * m->es, first, last, &m->cp_id[CP_RK0 + i]));
    MT_TRY(mt_plan_add(plan, "cp.ring.block_out", MT_MEM_COMM, (size_t)(m->N * m->QD) * m->es, first, last,
                       &m->cp_id[CP_ROUT]));
    return mt_plan_add(plan, "cp.ring.block_lse", MT_MEM_COMM, (size_t)(m->B * m->H * m->T) * f4, first, last,
                       &m->cp_id[CP_RLSE]);
}

/* ---- ring strategy: K/V blocks travel around the context group (rank r sends to
 * r + 1); after step s rank r holds the block of rank (r - s) mod C. Forward: each
 * block's attention (q_pos / k_pos the original positions) is merged into the
 * running output with the online-softmax rule (Milakov & Gimelshein 2018; the op
 * attn_merge of kernels/ops.h):
 * lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
 * Backward: with the final out and lse, each block's attention backward gives exact
 * per-block dq (summed here) and dK/dV, which travel with the block and are sent
 * home after the last step. */

static void cp_ring_pass(mt_model *m, void *const *send, void *const *recv, int nbuf) {
    const int C = m->cp, r = m->cp_rank;
    for (int i = 0; i < nbuf && m->tp_status == MT_OK; i++)
        m->tp_status = mt_comm_sendrecv(m->cp_comm, send[i], (r + 1) % C, recv[i], (r + C - 1) % C,
                                        m->N * m->KVD, MT_COMM_F32);
}

/* out/lse (running, [B, Tq, H, Dh] / [B, H, Tq]) merged with one block's ob/lb. */

static mt_status MT_MUST_CHECK cp_ring_fwd(mt_model *m, mt_attn_args *args, void *out, float *lse, const void *q,
                                           const void *k, const void *v) {
    const int C = m->cp, r = m->cp_rank;
    const size_t kvb = (size_t)(m->N * m->KVD) * m->es;
    void *kb[2] = {m->cp_buf[CP_RK0], m->cp_buf[CP_RK1]}, *vb[2] = {m->cp_buf[CP_RV0], m->cp_buf[CP_RV1]};
    MT_TRY(m->be->ops->copy(m->be, kb[0], k, kvb));
    MT_TRY(m->be->ops->copy(m->be, vb[0], v, kvb));
    for (int s = 0; s < C; s++) {
        const int cur = s & 1, src = (r - s + C) % C;
        args->k_pos = (const int32_t *)m->cp_buf[CP_KPOS] + (int64_t)src * m->T;
        if (m->packing) args->k_seg = (const int32_t *)m->cp_buf[CP_KSEG] + (int64_t)src * m->N;
        if (s == 0) {
            MT_TRY(m->be->ops->attention_fwd(m->be, args, out, lse, q, kb[cur], vb[cur]));
        } else {
            MT_TRY(m->be->ops->attention_fwd(m->be, args, m->cp_buf[CP_ROUT], m->cp_buf[CP_RLSE], q, kb[cur], vb[cur]));
            MT_TRY(m->be->ops->attn_merge(m->be, out, lse, m->cp_buf[CP_ROUT], m->cp_buf[CP_RLSE], m->B, m->T, m->H, m->Dh, m->dt));
        }
        if (s + 1 < C) {
            void *snd[2] = {kb[cur], vb[cur]}, *rcv[2] = {kb[!cur], vb[!cur]};
            cp_ring_pass(m, snd, rcv, 2);
        }
    }
    return MT_OK;
}

static mt_status MT_MUST_CHECK cp_ring_bwd(mt_model *m, mt_attn_args *args, void *dq, void *dk, void *dv,
                                           const void *dout, const void *q, const void *k, const void *v,
                                           const void *out, const float *lse) {
    const int C = m->cp, r = m->cp_rank;
    const int64_t nq = m->N * m->QD, nkv = m->N * m->KVD;
    const size_t kvb = (size_t)nkv * m->es;
    void *kb[2] = {m->cp_buf[CP_RK0], m->cp_buf[CP_RK1]}, *vb[2] = {m->cp_buf[CP_RV0], m->cp_buf[CP_RV1]};
    void *dkb[2] = {m->cp_buf[CP_RDK0], m->cp_buf[CP_RDK1]}, *dvb[2] = {m->cp_buf[CP_RDV0], m->cp_buf[CP_RDV1]};
    void *dqs = m->cp_buf[CP_ROUT];
    MT_TRY(m->be->ops->copy(m->be, kb[0], k, kvb));
    MT_TRY(m->be->ops->copy(m->be, vb[0], v, kvb));
    MT_TRY(m->be->ops->zero(m->be, dkb[0], kvb));
    MT_TRY(m->be->ops->zero(m->be, dvb[0], kvb));
    int cur = 0;
    for (int s = 0; s < C; s++) {
        cur = s & 1;
        const int src = (r - s + C) % C;
        args->k_pos = (const int32_t *)m->cp_buf[CP_KPOS] + (int64_t)src * m->T;
        if (m->packing) args->k_seg = (const int32_t *)m->cp_buf[CP_KSEG] + (int64_t)src * m->N;
        /* dk, dv (the caller's outputs) serve as this block's scratch */
        MT_TRY(m->be->ops->attention_bwd(m->be, args, s == 0 ? dq : dqs, dk, dv, dout, q, kb[cur], vb[cur], out, lse));
        if (s > 0) MT_TRY(m->be->ops->axpy(m->be, dq, dqs, 1.0f, nq, m->dt));
        MT_TRY(m->be->ops->axpy(m->be, dkb[cur], dk, 1.0f, nkv, m->dt));
        MT_TRY(m->be->ops->axpy(m->be, dvb[cur], dv, 1.0f, nkv, m->dt));
        if (s + 1 < C) {
            void *snd[4] = {kb[cur], vb[cur], dkb[cur], dvb[cur]}, *rcv[4] = {kb[!cur], vb[!cur], dkb[!cur], dvb[!cur]};
            cp_ring_pass(m, snd, rcv, 4);
        }
    }
    /* the block now here belongs to rank r + 1: send its gradients home, receive ours */
    void *snd[2] = {dkb[cur], dvb[cur]}, *rcv[2] = {dk, dv};
    cp_ring_pass(m, snd, rcv, 2);
    return MT_OK;
}

/* full[B, Tg, KVD] (rank-major chunks reordered per sequence) = gather of x[B, 2Tc, KVD]. */
static mt_status MT_MUST_CHECK cp_gather(mt_model *m, void *full, const void *x) {
    const int64_t C = m->cp, B = m->B, Tl = m->T, KVD = m->KVD, blk = B * Tl * KVD;
    void *stage = m->cp_buf[CP_STAGE];
    int64_t counts[C];
    for (int64_t r = 0; r < C; r++) counts[r] = blk;
    if (m->tp_status == MT_OK) m->tp_status = mt_comm_all_gather(m->cp_comm, x, stage, counts, MT_COMM_F32);
    for (int64_t r = 0; r < C; r++)
        for (int64_t b = 0; b < B; b++)
            MT_TRY(m->be->ops->copy(m->be, AT(m, full, (b * m->Tg + r * Tl) * KVD), AT(m, stage, r * blk + b * Tl * KVD),
                                    (size_t)(Tl * KVD) * m->es));
    return MT_OK;
}

/* x[B, 2Tc, KVD] = this rank's rows of the group's sum of full[B, Tg, KVD]. */
static mt_status MT_MUST_CHECK cp_scatter(mt_model *m, void *x, const void *full) {
    const int64_t C = m->cp, B = m->B, Tl = m->T, KVD = m->KVD, blk = B * Tl * KVD;
    void *stage = m->cp_buf[CP_STAGE];
    int64_t counts[C];
    for (int64_t r = 0; r < C; r++) {
        counts[r] = blk;
        for (int64_t b = 0; b < B; b++)
            MT_TRY(m->be->ops->copy(m->be, AT(m, stage, r * blk + b * Tl * KVD), AT(m, full, (b * m->Tg + r * Tl) * KVD),
                                    (size_t)(Tl * KVD) * m->es));
    }
    if (m->tp_status == MT_OK) m->tp_status = mt_comm_reduce_scatter(m->cp_comm, stage, x, counts, MT_COMM_F32);
    return MT_OK;
}

static mt_status MT_MUST_CHECK cp_attention_fwd(mt_model *m, int64_t l, void *out, float *lse, const void *q,
                                                const void *k, const void *v) {
    mt_attn_args args = attn_args(m, l);
    if (m->packing) args.q_seg = args.k_seg = m->gptr[GB_SEGMENTS]; /* k_seg: see the CP cases */
    if (m->cp == 1) {
        MT_TRY(m->be->ops->attention_fwd(m->be, &args, out, lse, q, k, v));
        return MT_OK;
    }
    args.q_pos = m->gptr[GB_POSITIONS]; /* the same 2Tc positions for every sequence */
    if (m->cp_ring) {
        MT_TRY(cp_ring_fwd(m, &args, out, lse, q, k, v));
        return MT_OK;
    }
    MT_TRY(cp_gather(m, m->cp_buf[CP_K], k));
    MT_TRY(cp_gather(m, m->cp_buf[CP_V], v));
    args.Tk = m->Tg;
    args.k_pos = m->cp_buf[CP_KPOS];
    if (m->packing) args.k_seg = m->cp_buf[CP_KSEG];
    MT_TRY(m->be->ops->attention_fwd(m->be, &args, out, lse, q, m->cp_buf[CP_K], m->cp_buf[CP_V]));
    return MT_OK;
}

static mt_status MT_MUST_CHECK cp_attention_bwd(mt_model *m, int64_t l, void *dq, void *dk, void *dv,
                                                const void *dout, const void *q, const void *k, const void *v,
                                                const void *out, const float *lse) {
    mt_attn_args args = attn_args(m, l);
    if (m->packing) args.q_seg = args.k_seg = m->gptr[GB_SEGMENTS];
    if (m->cp == 1) {
        MT_TRY(m->be->ops->attention_bwd(m->be, &args, dq, dk, dv, dout, q, k, v, out, lse));
        return MT_OK;
    }
    args.q_pos = m->gptr[GB_POSITIONS];
    if (m->cp_ring) {
        MT_TRY(cp_ring_bwd(m, &args, dq, dk, dv, dout, q, k, v, out, lse));
        return MT_OK;
    }
    MT_TRY(cp_gather(m, m->cp_buf[CP_K], k));
    MT_TRY(cp_gather(m, m->cp_buf[CP_V], v));
    args.Tk = m->Tg;
    args.k_pos = m->cp_buf[CP_KPOS];
    if (m->packing) args.k_seg = m->cp_buf[CP_KSEG];
    MT_TRY(m->be->ops->attention_bwd(m->be, &args, dq, m->cp_buf[CP_DK], m->cp_buf[CP_DV], dout, q, m->cp_buf[CP_K],
                          m->cp_buf[CP_V], out, lse));
    MT_TRY(cp_scatter(m, dk, m->cp_buf[CP_DK]));
    MT_TRY(cp_scatter(m, dv, m->cp_buf[CP_DV]));
    return MT_OK;
}

/* Original position of local row j (< 2Tc) of context rank r. */
static int32_t cp_position(const mt_model *m, int r, int64_t j) {
    const int64_t Tc = m->T / 2, chunk = j < Tc ? r : 2 * m->cp - 1 - r;
    return (int32_t)(chunk * Tc + j % Tc);
}

/* This rank's rows of the caller's full [B, Tg] tokens or labels. */
static const int32_t *cp_select(mt_model *m, const int32_t *full, int32_t *local) {
    if (m->cp == 1 || !full) return full;
    for (int64_t b = 0; b < m->B; b++)
        for (int64_t j = 0; j < m->T; j++) local[b * m->T + j] = full[b * m->Tg + cp_position(m, m->cp_rank, j)];
    return local;
}

static mt_status check_ids(const mt_model *m, const int32_t *ids, const char *what, int allow_ignore) {
    if (!ids) return mt_set_error(MT_ERR_INVALID, "%s is NULL", what);
    for (int64_t n = 0; n < m->N; n++) {
        int32_t t = ids[n];
        if (allow_ignore && t == MT_IGNORE_LABEL) continue;
        if (t < 0 || (int64_t)t >= m->V)
            return mt_set_error(MT_ERR_INVALID, "%s[%lld]=%d is outside [0, vocab_size=%lld)", what,
                                (long long)n, (int)t, (long long)m->V);
    }
    return MT_OK;
}

/* Where tensor j of layer l is during the forward (fwd = 1) or the backward (0):
 * its own plan entry when kept, else the layer-sized remat scratch. */
static void layer_ptrs(const mt_model *m, int64_t l, int fwd, void *a[MT_LT_COUNT]) {
    for (int j = 0; j < MT_LT_COUNT; j++)
        a[j] = m->lid[l][j] >= 0 ? m->lptr[l][j] : (fwd ? m->rs_fwd[j] : m->rs_bwd[j]);
}

/* After the forward of layer l: copy its offloaded tensors to the host pool. */
static mt_status MT_MUST_CHECK layer_offload(mt_model *m, int64_t l, void *a[MT_LT_COUNT]) {
    if (!m->has_offload) return MT_OK;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (m->hid[l][j] >= 0)
            MT_TRY(m->be->ops->copy_to_host(m->be, m->hptr[l][j], a[j], layer_act_bytes(m, j)));
    return MT_OK;
}

/* Before the backward of layer l: bring its offloaded tensors back. */
static mt_status MT_MUST_CHECK layer_restore(mt_model *m, int64_t l, void *a[MT_LT_COUNT]) {
    if (!m->has_offload) return MT_OK;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (m->hid[l][j] >= 0)
            MT_TRY(m->be->ops->copy_to_device(m->be, a[j], m->hptr[l][j], layer_act_bytes(m, j)));
    return MT_OK;
}

static int la_is_remat(const mt_model *m, int j) {
    return layer_act_elems(m, j) > 0 && la_action(m, j) == MT_RA_REMAT;
}

/* Forward of layer l (phase 1 + l): layer input -> next layer input. */
static mt_status MT_MUST_CHECK layer_forward(mt_model *m, int64_t l) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->lp[l];
    void *a[MT_LT_COUNT];
    layer_ptrs(m, l, 1, a);
    const int64_t N = m->N, D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh;
    const int64_t QD = m->QD, KVD = m->KVD;
    const int64_t Ns = seq_rows(m); /* residual rows (sequence parallelism: N / tp) */
    const size_t ND = (size_t)(Ns * D) * m->es;
    void *nrm = m->gptr[GB_FWD_NORM], *res = m->gptr[GB_FWD_RESID];
    void *tmp = m->gptr[GB_FWD_TMP], *glu = m->gptr[GB_FWD_GLU];
    const int32_t *pos = rope_positions(m);
    const float *inv_freq = layer_inv_freq(m, l);
    const void *x = a[MT_LT_DECODER_LAYER_INPUT];
    void *y = l + 1 < m->cfg.num_decoder_layers ? m->lptr[l + 1][MT_LT_DECODER_LAYER_INPUT] : m->gptr[GB_FINAL_INPUT];

    /* attention block */
    MT_TRY(norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], x, lp->in_norm));
    if (m->cfg.use_qk_norm) {
        MT_TRY(linear_fwd(m, tmp, nrm, PW(m, lp->q), N, D, QD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_QUERY_PROJ], a[MT_LT_QUERY_NORM_RSTD], tmp, PW(m, lp->q_norm), N * H, Dh, m->eps, m->w_off, m->dt));
        MT_TRY(linear_fwd(m, tmp, nrm, PW(m, lp->k), N, D, KVD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_KEY_PROJ], a[MT_LT_KEY_NORM_RSTD], tmp, PW(m, lp->k_norm), N * Hkv, Dh, m->eps, m->w_off, m->dt));
    } else {
        MT_TRY(linear_fwd(m, a[MT_LT_QUERY_PROJ], nrm, PW(m, lp->q), N, D, QD, 0.0f));
        MT_TRY(linear_fwd(m, a[MT_LT_KEY_PROJ], nrm, PW(m, lp->k), N, D, KVD, 0.0f));
    }
    MT_TRY(be->ops->rope_fwd(be, a[MT_LT_QUERY_PROJ], pos, inv_freq, N, H, Dh, m->dt));
    MT_TRY(be->ops->rope_fwd(be, a[MT_LT_KEY_PROJ], pos, inv_freq, N, Hkv, Dh, m->dt));
    MT_TRY(linear_fwd(m, a[MT_LT_VALUE_PROJ], nrm, PW(m, lp->v), N, D, KVD, 0.0f));
    MT_TRY(cp_attention_fwd(m, l, a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE], a[MT_LT_QUERY_PROJ], a[MT_LT_KEY_PROJ], a[MT_LT_VALUE_PROJ]));
    MT_TRY(row_fwd(m, a[MT_LT_OUT_PROJ], a[MT_LT_CONTEXT], lp->o, QD, m->QDg, 0.0f, tmp, NULL));
    const void *attn_out = a[MT_LT_OUT_PROJ];
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, a[MT_LT_POST_ATTN_NORM_RSTD], a[MT_LT_OUT_PROJ], PW(m, lp->post_attn_norm), Ns, D, m->eps, m->w_off, m->dt));
        attn_out = tmp;
    }

    /* MLP block: h = x + attention output, fused with the pre-MLP norm */
    MT_TRY(add_norm_gather(m, res, nrm, a[MT_LT_PRE_MLP_NORM_RSTD], x, attn_out, lp->pre_mlp_norm));
    MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_0], nrm, PW(m, lp->gate), N, D, F, 0.0f));
    MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_1], nrm, PW(m, lp->up), N, D, F, 0.0f));
    MT_TRY(be->ops->glu_fwd(be, glu, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
    MT_TRY(be->ops->copy(be, y, res, ND));
    if (m->cfg.use_post_ffw_norm) {
        MT_TRY(row_fwd(m, a[MT_LT_MLPWO], glu, lp->down, F, m->Fg, 0.0f, nrm, NULL));
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, a[MT_LT_POST_FFW_NORM_RSTD], a[MT_LT_MLPWO], PW(m, lp->post_ffw_norm), Ns, D, m->eps, m->w_off, m->dt));
        MT_TRY(be->ops->axpy(be, y, tmp, 1.0f, Ns * D, m->dt));
    } else {
        MT_TRY(row_fwd(m, y, glu, lp->down, F, m->Fg, 1.0f, nrm, tmp));
    }
    MT_TRY(layer_offload(m, l, a));
    return MT_OK;
}

/* Start of the backward of layer l, attention half: recompute the attention tensors
 * that were not kept, from decoder_layer_input, with the forward's exact op sequence
 * (so bitwise the forward's values). Uses nrm and w0 as temporaries. */
static mt_status MT_MUST_CHECK layer_recompute_attn(mt_model *m, int64_t l, void *a[MT_LT_COUNT]) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->lp[l];
    const int64_t N = m->N, D = m->D, H = m->H, Hkv = m->Hkv, Dh = m->Dh, QD = m->QD, KVD = m->KVD;
    const int rq = la_is_remat(m, MT_LT_QUERY_PROJ), rk = la_is_remat(m, MT_LT_KEY_PROJ), rv = la_is_remat(m, MT_LT_VALUE_PROJ);
    const int32_t *pos = rope_positions(m);
    const float *inv_freq = layer_inv_freq(m, l);
    void *nrm = m->gptr[GB_BWD_NORM], *tmp = m->gptr[GB_BWD_W0];
    if (rq || rk || rv) MT_TRY(norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], a[MT_LT_DECODER_LAYER_INPUT], lp->in_norm));
    if (rq) {
        if (m->cfg.use_qk_norm) {
            MT_TRY(linear_fwd(m, tmp, nrm, PW(m, lp->q), N, D, QD, 0.0f));
            MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_QUERY_PROJ], a[MT_LT_QUERY_NORM_RSTD], tmp, PW(m, lp->q_norm), N * H, Dh, m->eps, m->w_off, m->dt));
        } else {
            MT_TRY(linear_fwd(m, a[MT_LT_QUERY_PROJ], nrm, PW(m, lp->q), N, D, QD, 0.0f));
        }
        MT_TRY(be->ops->rope_fwd(be, a[MT_LT_QUERY_PROJ], pos, inv_freq, N, H, Dh, m->dt));
    }
    if (rk) {
        if (m->cfg.use_qk_norm) {
            MT_TRY(linear_fwd(m, tmp, nrm, PW(m, lp->k), N, D, KVD, 0.0f));
            MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_KEY_PROJ], a[MT_LT_KEY_NORM_RSTD], tmp, PW(m, lp->k_norm), N * Hkv, Dh, m->eps, m->w_off, m->dt));
        } else {
            MT_TRY(linear_fwd(m, a[MT_LT_KEY_PROJ], nrm, PW(m, lp->k), N, D, KVD, 0.0f));
        }
        MT_TRY(be->ops->rope_fwd(be, a[MT_LT_KEY_PROJ], pos, inv_freq, N, Hkv, Dh, m->dt));
    }
    if (rv) MT_TRY(linear_fwd(m, a[MT_LT_VALUE_PROJ], nrm, PW(m, lp->v), N, D, KVD, 0.0f));
    if (la_is_remat(m, MT_LT_CONTEXT)) {
        MT_TRY(cp_attention_fwd(m, l, a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE], a[MT_LT_QUERY_PROJ], a[MT_LT_KEY_PROJ], a[MT_LT_VALUE_PROJ]));
    }
    if (la_is_remat(m, MT_LT_OUT_PROJ)) MT_TRY(row_fwd(m, a[MT_LT_OUT_PROJ], a[MT_LT_CONTEXT], lp->o, QD, m->QDg, 0.0f, nrm, NULL));
    return MT_OK;
}

/* MLP half: given n2 = pre-MLP norm(h) in nrm, recompute mlpwi_0, mlpwi_1 and (with a
 * post-MLP norm) mlpwo when they were not kept. Uses glu and full [N, D] as temporaries. */
static mt_status MT_MUST_CHECK layer_recompute_mlp(mt_model *m, int64_t l, void *a[MT_LT_COUNT], const void *nrm,
                                                   void *glu, void *full) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->lp[l];
    const int64_t N = m->N, D = m->D, F = m->F;
    if (la_is_remat(m, MT_LT_MLPWI_0)) MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_0], nrm, PW(m, lp->gate), N, D, F, 0.0f));
    if (la_is_remat(m, MT_LT_MLPWI_1)) MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_1], nrm, PW(m, lp->up), N, D, F, 0.0f));
    if (la_is_remat(m, MT_LT_MLPWO)) {
        MT_TRY(be->ops->glu_fwd(be, glu, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
        MT_TRY(row_fwd(m, a[MT_LT_MLPWO], glu, lp->down, F, m->Fg, 0.0f, full, NULL));
    }
    return MT_OK;
}

/* Backward of layer l (phase 2L + 1 - l): on entry G = dloss/d(layer output), on exit
 * G = dloss/d(layer input); parameter gradients accumulated. */
static mt_status MT_MUST_CHECK layer_backward(mt_model *m, int64_t l) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->lp[l];
    void *a[MT_LT_COUNT];
    layer_ptrs(m, l, 0, a);
    MT_TRY(layer_restore(m, l, a));
    MT_TRY(layer_recompute_attn(m, l, a));
    const int64_t N = m->N, D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh;
    const int64_t QD = m->QD, KVD = m->KVD;
    const int64_t Ns = seq_rows(m), s0 = seq_row0(m); /* residual rows (sequence parallelism) */
    const size_t ND = (size_t)(Ns * D) * m->es;
    const float eps = m->eps, off = m->w_off;
    void *G = m->gptr[GB_RESID_GRAD];
    void *nrm = m->gptr[GB_BWD_NORM], *res = m->gptr[GB_BWD_RESID];
    void *d1 = m->gptr[GB_BWD_D1], *d2 = m->gptr[GB_BWD_D2];
    void *w0 = m->gptr[GB_BWD_W0], *w1 = m->gptr[GB_BWD_W1], *w2 = m->gptr[GB_BWD_W2];
    void *w3 = m->gptr[GB_BWD_W3], *w4 = m->gptr[GB_BWD_W4];
    const int32_t *pos = rope_positions(m);
    const float *inv_freq = layer_inv_freq(m, l);
    const void *x = a[MT_LT_DECODER_LAYER_INPUT];

    /* ---- MLP block: y = h + [post_ffw](down(act(g) u)) ---- */
    /* recompute h = x + [post_attn](o) and n2 = norm(h), then the MLP tensors not kept */
    const void *attn_out = a[MT_LT_OUT_PROJ];
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(be->ops->rmsnorm_fwd(be, d2, a[MT_LT_POST_ATTN_NORM_RSTD], a[MT_LT_OUT_PROJ], PW(m, lp->post_attn_norm), Ns, D, eps, off, m->dt));
        attn_out = d2;
    }
    MT_TRY(add_norm_gather(m, res, nrm, a[MT_LT_PRE_MLP_NORM_RSTD], x, attn_out, lp->pre_mlp_norm));
    MT_TRY(layer_recompute_mlp(m, l, a, nrm, w0, d2));
    /* d(down_proj output) [N, D]: under sequence parallelism this rank's rows are
     * written into d1 and all-gathered */
    const void *dmlp = G;
    if (m->cfg.use_post_ffw_norm) {
        MT_TRY(be->ops->zero(be, AT(m, d1, s0 * D), ND));
        MT_TRY(be->ops->rmsnorm_bwd(be, AT(m, d1, s0 * D), GW(m, lp->post_ffw_norm), G, a[MT_LT_MLPWO], PW(m, lp->post_ffw_norm),
                         a[MT_LT_POST_FFW_NORM_RSTD], Ns, D, off, m->dt));
        dmlp = d1;
    } else if (m->sp) {
        MT_TRY(be->ops->copy(be, AT(m, d1, s0 * D), G, ND));
        dmlp = d1;
    }
    sp_gather(m, d1);
    MT_TRY(be->ops->glu_fwd(be, w0, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
    MT_TRY(row_bwd_w(m, lp->down, dmlp, w0, F, m->Fg));
    MT_TRY(row_bwd_x(m, w0, dmlp, lp->down, F, m->Fg, 0.0f)); /* d(act(g) u) */
    MT_TRY(be->ops->glu_bwd(be, w1, w2, w0, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
    MT_TRY(linear_bwd_w(m, GW(m, lp->gate), w1, nrm, N, D, F));
    MT_TRY(linear_bwd_w(m, GW(m, lp->up), w2, nrm, N, D, F));
    MT_TRY(linear_bwd_x(m, d2, w1, PW(m, lp->gate), N, D, F, 0.0f));
    MT_TRY(linear_bwd_x(m, d2, w2, PW(m, lp->up), N, D, F, 1.0f));
    /* column-parallel gate/up: partial input gradient (d1 is free again) */
    const void *dn2 = tp_sum_input_grad(m, d2, d1);
    MT_TRY(be->ops->rmsnorm_bwd(be, G, GW(m, lp->pre_mlp_norm), dn2, res, PW(m, lp->pre_mlp_norm), a[MT_LT_PRE_MLP_NORM_RSTD], Ns, D,
                     off, m->dt));

    /* ---- attention block: h = x + [post_attn](o_proj(attn(...))) ---- */
    const void *dattn = G;
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(be->ops->zero(be, AT(m, d1, s0 * D), ND));
        MT_TRY(be->ops->rmsnorm_bwd(be, AT(m, d1, s0 * D), GW(m, lp->post_attn_norm), G, a[MT_LT_OUT_PROJ], PW(m, lp->post_attn_norm),
                         a[MT_LT_POST_ATTN_NORM_RSTD], Ns, D, off, m->dt));
        dattn = d1;
    } else if (m->sp) {
        MT_TRY(be->ops->copy(be, AT(m, d1, s0 * D), G, ND));
        dattn = d1;
    }
    sp_gather(m, d1);
    MT_TRY(row_bwd_w(m, lp->o, dattn, a[MT_LT_CONTEXT], QD, m->QDg));
    MT_TRY(row_bwd_x(m, w0, dattn, lp->o, QD, m->QDg, 0.0f)); /* dcontext */
    MT_TRY(cp_attention_bwd(m, l, w1, w2, w3, w0, a[MT_LT_QUERY_PROJ], a[MT_LT_KEY_PROJ], a[MT_LT_VALUE_PROJ], a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE]));
    MT_TRY(be->ops->rope_bwd(be, w1, pos, inv_freq, N, H, Dh, m->dt));
    MT_TRY(be->ops->rope_bwd(be, w2, pos, inv_freq, N, Hkv, Dh, m->dt));
    MT_TRY(norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], x, lp->in_norm)); /* recompute n1 */
    const void *dq = w1, *dk = w2, *dv = w3;
    if (m->cfg.use_qk_norm) {
        MT_TRY(linear_fwd(m, w0, nrm, PW(m, lp->q), N, D, QD, 0.0f)); /* q before q_norm */
        MT_TRY(be->ops->zero(be, w4, (size_t)(N * QD) * m->es));
        MT_TRY(be->ops->rmsnorm_bwd(be, w4, GW(m, lp->q_norm), w1, w0, PW(m, lp->q_norm), a[MT_LT_QUERY_NORM_RSTD], N * H, Dh, off, m->dt));
        MT_TRY(linear_fwd(m, w0, nrm, PW(m, lp->k), N, D, KVD, 0.0f)); /* k before k_norm */
        MT_TRY(be->ops->zero(be, w1, (size_t)(N * KVD) * m->es));
        MT_TRY(be->ops->rmsnorm_bwd(be, w1, GW(m, lp->k_norm), w2, w0, PW(m, lp->k_norm), a[MT_LT_KEY_NORM_RSTD], N * Hkv, Dh, off, m->dt));
        dq = w4;
        dk = w1;
    }
    MT_TRY(linear_bwd_w(m, GW(m, lp->q), dq, nrm, N, D, QD));
    MT_TRY(linear_bwd_w(m, GW(m, lp->k), dk, nrm, N, D, KVD));
    MT_TRY(linear_bwd_w(m, GW(m, lp->v), dv, nrm, N, D, KVD));
    MT_TRY(linear_bwd_x(m, d2, dq, PW(m, lp->q), N, D, QD, 0.0f));
    MT_TRY(linear_bwd_x(m, d2, dk, PW(m, lp->k), N, D, KVD, 1.0f));
    MT_TRY(linear_bwd_x(m, d2, dv, PW(m, lp->v), N, D, KVD, 1.0f));
    const void *dn1 = tp_sum_input_grad(m, d2, d1); /* column-parallel q/k/v: partial input gradient */
    MT_TRY(be->ops->rmsnorm_bwd(be, G, GW(m, lp->in_norm), dn1, x, PW(m, lp->in_norm), a[MT_LT_INPUT_NORM_RSTD], Ns, D, off, m->dt));
    return MT_OK;
}

/* Document masking (mt_model_set_packing): the segment ids and per-document positions
 * of the whole window, computed from the caller's tokens [B, Tg] (every context rank
 * has them all), then this rank's rows and, under context parallelism, the key ids in
 * the order its attention sees the keys: [B, Tg] with rank r's rows at r * 2Tc as
 * cp_gather lays them out, or (ring) the block of rank r at r * N. Uploaded to the
 * buffers the layers read. No-op without packing, or without tokens (checked later). */
static mt_status MT_MUST_CHECK packing_upload(mt_model *m, const int32_t *tokens) {
    if (!m->packing || !tokens) return MT_OK;
    const int64_t B = m->B, Tg = m->Tg, T = m->T;
    for (int64_t b = 0; b < B; b++) {
        int32_t id = 0;
        int64_t start = 0; /* rows before the first separator: a document from an earlier window */
        for (int64_t t = 0; t < Tg; t++) {
            const int64_t n = b * Tg + t;
            if (tokens[n] == m->pack_sep) {
                id++;
                start = t;
            }
            m->pack_seg[n] = id;
            m->pack_pos[n] = (int32_t)(t - start);
        }
    }
    mt_backend *be = m->be;
    const int32_t *seg = cp_select(m, m->pack_seg, m->pack_lseg), *pos = cp_select(m, m->pack_pos, m->pack_lpos);
    if (m->cp > 1) {
        for (int r = 0; r < m->cp; r++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t j = 0; j < T; j++) {
                    const int32_t id = m->pack_seg[b * Tg + cp_position(m, r, j)];
                    m->pack_kseg[m->cp_ring ? ((int64_t)r * B + b) * T + j : b * Tg + (int64_t)r * T + j] = id;
                }
        MT_TRY(be->ops->copy_to_device(be, m->cp_buf[CP_KSEG], m->pack_kseg, (size_t)(B * Tg) * sizeof(int32_t)));
    }
    MT_TRY(be->ops->copy_to_device(be, m->gptr[GB_SEGMENTS], seg, (size_t)m->N * sizeof(int32_t)));
    MT_TRY(be->ops->copy_to_device(be, m->gptr[GB_DOC_POS], pos, (size_t)m->N * sizeof(int32_t)));
    return MT_OK;
}

/* Phases 0 .. L and the final norm of phase L + 1: tokens -> final_hidden. */
static mt_status MT_MUST_CHECK model_forward(mt_model *m, const int32_t *tokens) {
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D;
    MT_TRY(be->ops->copy_to_device(be, m->gptr[GB_TOKENS], tokens, (size_t)N * sizeof(int32_t)));
    for (int64_t b = 0; b < m->B; b++) /* the same T positions for each of the B rows */
        MT_TRY(be->ops->copy_to_device(be, (int32_t *)m->gptr[GB_POSITIONS] + b * m->T, m->pos_host, (size_t)m->T * sizeof(int32_t)));
    if (m->cp > 1) MT_TRY(be->ops->copy_to_device(be, m->cp_buf[CP_KPOS], m->cp_kpos_host, (size_t)m->Tg * sizeof(int32_t)));
    MT_TRY(be->ops->copy_to_device(be, m->gptr[GB_INV_FREQ], m->inv_freq_host, (size_t)m->Dh * sizeof(float)));
    MT_TRY(fetch_global(m));
    if (m->dt != MT_F32) /* the compute copy from the fp32 master (mt_model_set_compute_rounding) */
        MT_TRY(be->ops->from_f32(be, m->gptr[GB_COMPUTE_W], m->dt, m->gptr[GB_PARAMS], m->numel, 1, m->sr_seed,
                                 (uint64_t)m->sr_t * (uint64_t)m->numel));
    const int64_t Ns = seq_rows(m), s0 = seq_row0(m); /* sequence parallelism: this rank's rows */
    MT_TRY(be->ops->embedding_fwd(be, m->lptr[0][MT_LT_DECODER_LAYER_INPUT], PW(m, m->p_embed), (const int32_t *)m->gptr[GB_TOKENS] + s0, Ns, D,
                       m->emb_scale, m->dt));
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) {
        MT_TRY(fetch_layer(m, l));
        prefetch_layer(m, l + 1); /* fsdp: layer l + 1's all-gather overlaps layer l */
        MT_TRY(layer_forward(m, l));
    }
    /* the loss needs every row's hidden state (each tensor rank computes its vocabulary
     * slice of all rows): under sequence parallelism all-gathered */
    MT_TRY(be->ops->rmsnorm_fwd(be, AT(m, m->gptr[GB_FINAL_HIDDEN], s0 * D), m->gptr[GB_FINAL_RSTD], m->gptr[GB_FINAL_INPUT],
                     PW(m, m->p_final_norm), Ns, D, m->eps, m->w_off, m->dt));
    sp_gather(m, m->gptr[GB_FINAL_HIDDEN]);
    return MT_OK;
}

static const void *unembedding(const mt_model *m) {
    return PW(m, m->cfg.logits_via_embedding ? m->p_embed : m->p_lm_head);
}

static mt_status check_ready(const mt_model *m, const char *fn) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "%s: model is NULL", fn);
    if (!m->bound) return mt_set_error(MT_ERR_INVALID, "%s: model not bound to an arena", fn);
    if (m->decode)
        return mt_set_error(MT_ERR_INVALID, "%s: this model was planned for incremental decoding "
                            "(mt_model_set_decode): use mt_model_decode_step", fn);
    if ((m->has_offload || m->param_offload) && !m->host_bound)
        return mt_set_error(MT_ERR_INVALID, "%s: the remat policy offloads tensors but no host pool is bound "
                            "(mt_model_add_to_host_plan + mt_model_bind_host)", fn);
    return MT_OK;
}

/* The backward of everything below the final hidden states, phases L + 1 (final norm)
 * to 2L + 2 (embedding), shared by mt_model_forward_backward and
 * mt_model_backward_hidden: reads dloss/dfinal_hidden from GB_FINAL_HIDDEN_GRAD and
 * the activations a whole forward saved (model_forward), ADDS into the gradients, and
 * leaves the saved activations consumed (the backward scratch reuses their memory). */
static mt_status backward_from_final_hidden(mt_model *m) {
    mt_backend *be = m->be;
    const int64_t D = m->D, Ns = seq_rows(m), s0 = seq_row0(m);
    m->fwd_kept = 0;
    void *G = m->gptr[GB_RESID_GRAD];
    MT_TRY(be->ops->zero(be, G, (size_t)(Ns * D) * m->es));
    /* dloss/dfinal_hidden [N, D] is the same on every tensor rank; under sequence
     * parallelism each rank takes its rows */
    MT_TRY(be->ops->rmsnorm_bwd(be, G, GW(m, m->p_final_norm), AT(m, m->gptr[GB_FINAL_HIDDEN_GRAD], s0 * D),
                     m->gptr[GB_FINAL_INPUT], PW(m, m->p_final_norm), m->gptr[GB_FINAL_RSTD], Ns, D, m->w_off, m->dt));
    /* The sink's work on a window (parallel/zero1.c: an op, or a collective that the
     * communicator orders after the compute stream with events) is queued after the
     * backward that wrote it and before the next write: no host wait here (a step reads
     * the device only for its loss and norm: tests/test_emu_syncs.c). */
    if (m->sink) { /* model.norm and lm_head are complete (phase L + 1): hand the tail window over */
        MT_TRY(m->sink(m->sink_ctx, m->tail_off, m->numel - m->tail_off, m->gwin[2]));
    }
    for (int64_t l = m->cfg.num_decoder_layers - 1; l >= 0; l--) {
        MT_TRY(fetch_layer(m, l));
        prefetch_layer(m, l - 1); /* fsdp: layer l - 1's all-gather overlaps layer l */
        if (m->sink) MT_TRY(be->ops->zero(be, m->gwin[0], (size_t)m->layer_numel * sizeof(float)));
        MT_TRY(layer_backward(m, l));
        if (m->sink) { /* layer l's gradient is complete: hand its window over */
            MT_TRY(m->tp_status);
            MT_TRY(m->sink(m->sink_ctx, m->params[m->lp[l].in_norm].offset, m->layer_numel, m->gwin[0]));
        }
    }
    MT_TRY(m->tp_status);
    /* phase 2L + 2 (tensor parallel: G is the same on every rank of the group; only
     * rank 0 adds it, so the group's sum of embedding gradients counts it once; under
     * sequence parallelism each rank adds its own rows) */
    if (m->sink && !m->cfg.logits_via_embedding)
        MT_TRY(be->ops->zero(be, m->gwin[1], (size_t)m->params[m->p_embed].numel * sizeof(float)));
    if (m->tp_rank == 0 || m->sp)
        MT_TRY(be->ops->embedding_bwd(be, GW(m, m->p_embed), G, (const int32_t *)m->gptr[GB_TOKENS] + s0, Ns, m->V, D,
                           m->emb_scale, m->dt));
    if (m->sink) { /* the embedding's gradient is complete: hand its window over */
        MT_TRY(m->sink(m->sink_ctx, 0, m->params[m->p_embed].numel, m->gwin[1]));
    }
    return MT_OK;
}

/* The forward (and with `backward` the backward) of one micro-batch, its loss sum and
 * labelled count ADDED to the step statistics (GB_STEP_STATS [0], [1]). */
static mt_status forward_loss(mt_model *m, const int32_t *tokens, const int32_t *labels, float dscale,
                              int backward) {
    MT_TRY(check_ready(m, backward ? "mt_model_forward_backward" : "mt_model_loss"));
    MT_TRY(packing_upload(m, tokens)); /* from the whole window, before the rank's rows are taken */
    tokens = cp_select(m, tokens, m->cp_tok);
    labels = cp_select(m, labels, m->cp_lab);
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    MT_TRY(check_ids(m, labels, "labels", 1));
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D;
    m->tp_status = MT_OK;
    m->fwd_kept = 0;
    MT_TRY(model_forward(m, tokens));
    MT_TRY(m->tp_status);

    /* phase L + 1: vocab-tiled loss (and its VJP), final norm backward */
    MT_TRY(be->ops->copy_to_device(be, m->gptr[GB_LABELS], labels, (size_t)N * sizeof(int32_t)));
    mt_tiled_loss_args la = {.N = N, .D = D, .V = m->V, .num_tiles = m->tiles,
                             .softcap = m->cfg.final_logits_soft_cap, .ignore_index = MT_IGNORE_LABEL,
                             .dscale = dscale};
    double *stats = m->gptr[GB_STEP_STATS];
    void *dh = backward ? m->gptr[GB_FINAL_HIDDEN_GRAD] : NULL;
    float *dW = NULL;
    if (backward) {
        MT_TRY(grad_windows_begin(m));
        dW = GW(m, m->cfg.logits_via_embedding ? m->p_embed : m->p_lm_head);
    }
    if (m->tp > 1) { /* vocab-parallel: this rank's rows [v0, v0 + Vl) of the unembedding */
        const mt_vocab_loss_args va = {.N = N, .D = D, .v0 = m->v0, .Vl = m->Vl, .num_tiles = m->tiles,
                                       .softcap = la.softcap, .ignore_index = la.ignore_index, .dscale = dscale};
        MT_TRY(mt_vocab_parallel_loss(be, m->tp_comm, &va, m->gptr[GB_FINAL_HIDDEN],
                                      (const float *)unembedding(m) + m->v0 * D, /* fp32 (dtype checked at planning) */
                                      m->gptr[GB_LABELS], m->gptr[GB_LOSS_TILE], m->gptr[GB_LOSS_VOCAB_STATS], dh,
                                      dW ? dW + m->v0 * D : NULL, stats));
    } else {
        MT_TRY(mt_tiled_loss(be, &la, m->gptr[GB_FINAL_HIDDEN], unembedding(m), m->dt, m->gptr[GB_LABELS],
                             m->gptr[GB_LOSS_TILE], m->gptr[GB_LOSS_DTILE], dh, dW, stats));
    }
    if (!backward) {
        m->fwd_kept = 1; /* mt_model_backward_hidden may follow */
        return MT_OK;
    }
    return backward_from_final_hidden(m);
}

/* Zero the loss statistics, run forward_loss, read them (one synchronising copy). */
static mt_status loss_read(mt_model *m, const int32_t *tokens, const int32_t *labels, float dscale, int backward,
                           double *loss_sum, int64_t *count) {
    MT_TRY(check_ready(m, backward ? "mt_model_forward_backward" : "mt_model_loss"));
    double acc[2] = {0.0, 0.0};
    MT_TRY(m->be->ops->copy_to_device(m->be, m->gptr[GB_STEP_STATS], acc, sizeof acc));
    MT_TRY(forward_loss(m, tokens, labels, dscale, backward));
    MT_TRY(m->be->ops->copy_to_host(m->be, acc, m->gptr[GB_STEP_STATS], sizeof acc));
    if (loss_sum) *loss_sum = acc[0];
    if (count) *count = (int64_t)acc[1];
    return MT_OK;
}

mt_status mt_model_forward_backward(mt_model *m, const int32_t *tokens, const int32_t *labels,
                                    float dscale, double *loss_sum, int64_t *count) {
    return loss_read(m, tokens, labels, dscale, 1, loss_sum, count);
}

mt_status mt_model_forward_backward_acc(mt_model *m, const int32_t *tokens, const int32_t *labels, float dscale) {
    return forward_loss(m, tokens, labels, dscale, 1);
}

mt_status mt_model_loss(mt_model *m, const int32_t *tokens, const int32_t *labels, double *loss_sum,
                        int64_t *count) {
    return loss_read(m, tokens, labels, 1.0f, 0, loss_sum, count);
}

mt_status mt_model_hidden(mt_model *m, const int32_t *tokens, float *hidden) {
    MT_TRY(check_ready(m, "mt_model_hidden"));
    if (m->cp > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_hidden: under context parallelism each rank holds only "
                            "its chunks");
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    if (!hidden) return mt_set_error(MT_ERR_INVALID, "mt_model_hidden: hidden is NULL");
    MT_TRY(packing_upload(m, tokens));
    m->tp_status = MT_OK;
    m->fwd_kept = 0;
    MT_TRY(model_forward(m, tokens));
    MT_TRY(m->tp_status); /* tensor parallel: the row-parallel all-reduces */
    const int64_t n = m->N * m->D;
    MT_TRY(m->be->ops->copy_to_host(m->be, hidden, m->gptr[GB_FINAL_HIDDEN], (size_t)n * m->es));
    if (m->dt == MT_BF16) /* widen in place from the end: element i's bf16 bits lie at or below its float */
        for (int64_t i = n - 1; i >= 0; i--) hidden[i] = mt_bf16_to_f32(((const mt_bf16 *)hidden)[i]);
    m->fwd_kept = 1; /* mt_model_backward_hidden may follow */
    return MT_OK;
}

mt_status mt_model_backward_hidden(mt_model *m, const float *dhidden) {
    MT_TRY(check_ready(m, "mt_model_backward_hidden"));
    if (!dhidden) return mt_set_error(MT_ERR_INVALID, "mt_model_backward_hidden: dhidden is NULL");
    if (m->cp > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_backward_hidden: under context parallelism each rank "
                            "holds only its chunks (as for mt_model_hidden)");
    if (!m->fwd_kept)
        return mt_set_error(MT_ERR_INVALID, "mt_model_backward_hidden: no forward to differentiate (call "
                            "mt_model_hidden or mt_model_loss first; a backward consumes the forward)");
    const int64_t n = m->N * m->D;
    if (m->dt == MT_BF16) { /* rounded to the activation dtype (RNE), as the loss's dh would be */
        mt_bf16 *h = malloc((size_t)n * sizeof(mt_bf16));
        if (!h) return mt_set_error(MT_ERR_OOM, "mt_model_backward_hidden: out of memory");
        mt_f32_to_bf16_array(h, dhidden, (size_t)n);
        const mt_status st = m->be->ops->copy_to_device(m->be, m->gptr[GB_FINAL_HIDDEN_GRAD], h, (size_t)n * m->es);
        free(h);
        MT_TRY(st);
    } else {
        MT_TRY(m->be->ops->copy_to_device(m->be, m->gptr[GB_FINAL_HIDDEN_GRAD], dhidden, (size_t)n * sizeof(float)));
    }
    m->tp_status = MT_OK;
    MT_TRY(grad_windows_begin(m));
    return backward_from_final_hidden(m);
}

mt_status mt_model_logits(mt_model *m, const int32_t *tokens, float *logits) {
    MT_TRY(check_ready(m, "mt_model_logits"));
    if (m->tp > 1 || m->cp > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_logits: full logits under tensor parallelism are not "
                            "gathered (use mt_model_loss)");
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    if (!logits) return mt_set_error(MT_ERR_INVALID, "mt_model_logits: logits is NULL");
    MT_TRY(packing_upload(m, tokens));
    m->fwd_kept = 0; /* mt_model_backward_hidden follows mt_model_hidden / mt_model_loss only */
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D, V = m->V;
    MT_TRY(model_forward(m, tokens));
    const void *h = m->gptr[GB_FINAL_HIDDEN];
    float *tile = m->gptr[GB_LOSS_TILE];
    const float cap = m->cfg.final_logits_soft_cap;
    for (int64_t t = 0; t < m->tiles; t++) {
        /* the row split of kernels/tiled_loss.h */
        const int64_t r0 = t * N / m->tiles, r1 = (t + 1) * N / m->tiles, R = r1 - r0;
        if (R <= 0) continue;
        MT_TRY(be->ops->gemm(be, 0, 1, R, V, D, 1.0f, AT(m, h, r0 * D), D, unembedding(m), D, m->dt, 0.0f, tile, V,
                             MT_F32));
        float *dst = logits + r0 * V;
        MT_TRY(be->ops->copy_to_host(be, dst, tile, (size_t)(R * V) * sizeof(float)));
        if (cap > 0.0f)
            for (int64_t i = 0; i < R * V; i++) dst[i] = cap * tanhf(dst[i] / cap);
    }
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* incremental decoding with a KV cache (mt_model_set_decode)                      */

/* Buffers of a decode model (plan names "decode.<name>"). */
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
_Static_assert(DEC_COUNT <= 20, "mt_model.dec_id / dec_buf hold 20 decode buffers");

static mt_status decode_add_to_plan(mt_model *m, mt_plan *plan) {
    if (m->tp > 1 || m->cp > 1 || m->fsdp > 1 || m->param_offload || m->sink)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_add_to_plan: incremental decoding runs on one rank with "
                            "device parameters (no tensor / context / fsdp parallelism, parameter offload or "
                            "gradient sink)");
    const int64_t L = m->cfg.num_decoder_layers, T = m->T, D = m->D, F = m->F, QD = m->QD, KVD = m->KVD;
    const size_t f4 = sizeof(float), i4 = sizeof(int32_t);
    const int last = ph_optim(m);
    static const char *const names[DEC_COUNT] = {
        "decode.kv_cache.key", "decode.kv_cache.value", "decode.positions", "decode.token", "decode.rope_inv_freq",
        "decode.residual", "decode.normed", "decode.query", "decode.tmp", "decode.rstd", "decode.context",
        "decode.context_lse", "decode.out", "decode.gate", "decode.up", "decode.glu", "decode.logits"};
    const int64_t elems[DEC_COUNT] = {L * T * KVD, L * T * KVD, T, 1, m->Dh, D, D, QD, max64(D, QD),
                                      max64(m->H, 1), QD, m->H, D, F, F, F, m->V};
    for (int g = 0; g < GB_COUNT; g++) m->gid[g] = -1;
    MT_TRY(plan_add(m, plan, GB_PARAMS, "params", MT_MEM_PARAMS, (size_t)m->numel * f4, 0, last));
    for (int i = 0; i < DEC_COUNT; i++) {
        const mt_mem_category cat = i <= DEC_VCACHE ? MT_MEM_ACTIVATIONS : MT_MEM_SCRATCH;
        const size_t es = (i == DEC_POS || i == DEC_TOKEN) ? i4 : f4;
        mt_plan_tag tag = mt_plan_tag_of_category(cat);
        if (i <= DEC_VCACHE) tag.kind = MT_PLAN_KIND_KV_CACHE;
        else if (i == DEC_POS || i == DEC_TOKEN || i == DEC_INV_FREQ) tag.kind = MT_PLAN_KIND_INPUT;
        MT_TRY(mt_plan_add_tagged(plan, names[i], cat, tag, (size_t)elems[i] * es, 0, last, &m->dec_id[i]));
    }
    m->planned = 1;
    m->bound = 0;
    m->dec_len = 0;
    return MT_OK;
}

mt_status mt_model_set_decode(mt_model *m, int on) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_decode: NULL model");
    if (m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_decode: set it before planning");
    if (on && m->B != 1)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_decode: the KV cache holds one sequence (batch %lld, "
                            "must be 1)", (long long)m->B);
    if (on && m->dt != MT_F32)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_set_decode: incremental decoding computes in float32 "
                            "(the model's dtype is %s)", mt_dtype_name(m->dt));
    m->decode = on != 0;
    return MT_OK;
}

mt_status mt_model_decode_reset(mt_model *m) {
    if (!m || !m->decode || !m->bound)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_reset: not a bound decode model (mt_model_set_decode)");
    m->dec_len = 0;
    return MT_OK;
}

int64_t mt_model_decode_length(const mt_model *m) { return m && m->decode ? m->dec_len : 0; }

/* One layer for the new row at position t (the same op sequence as layer_forward on
 * one row): its key and value go to the cache row t, its query attends over the
 * cached rows [k0, t] (k0 > 0 only on a sliding-window layer, whose mask excludes the
 * rows before). */
static mt_status MT_MUST_CHECK decode_layer(mt_model *m, int64_t l, int64_t t) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->lp[l];
    const int64_t D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh, QD = m->QD, KVD = m->KVD;
    float **b = (float **)m->dec_buf;
    float *x = b[DEC_X], *nrm = b[DEC_NORM], *q = b[DEC_Q], *tmp = b[DEC_TMP], *rstd = b[DEC_RSTD];
    float *out = b[DEC_OUT], *glu = b[DEC_GLU];
    float *kc = b[DEC_KCACHE] + l * m->T * KVD, *vc = b[DEC_VCACHE] + l * m->T * KVD;
    const int32_t *pos = m->dec_buf[DEC_POS];
    const float *inv_freq = (const float *)b[DEC_INV_FREQ] + (mt_model_layer_is_local(&m->cfg, l) ? Dh / 2 : 0);

    /* attention block */
    MT_TRY(be->ops->rmsnorm_fwd(be, nrm, rstd, x, PW(m, lp->in_norm), 1, D, m->eps, m->w_off, MT_F32));
    if (m->cfg.use_qk_norm) {
        MT_TRY(linear_fwd(m, tmp, nrm, PW(m, lp->q), 1, D, QD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, q, rstd, tmp, PW(m, lp->q_norm), H, Dh, m->eps, m->w_off, MT_F32));
        MT_TRY(linear_fwd(m, tmp, nrm, PW(m, lp->k), 1, D, KVD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, kc + t * KVD, rstd, tmp, PW(m, lp->k_norm), Hkv, Dh, m->eps, m->w_off, MT_F32));
    } else {
        MT_TRY(linear_fwd(m, q, nrm, PW(m, lp->q), 1, D, QD, 0.0f));
        MT_TRY(linear_fwd(m, kc + t * KVD, nrm, PW(m, lp->k), 1, D, KVD, 0.0f));
    }
    MT_TRY(be->ops->rope_fwd(be, q, pos + t, inv_freq, 1, H, Dh, MT_F32));
    MT_TRY(be->ops->rope_fwd(be, kc + t * KVD, pos + t, inv_freq, 1, Hkv, Dh, MT_F32));
    MT_TRY(linear_fwd(m, vc + t * KVD, nrm, PW(m, lp->v), 1, D, KVD, 0.0f));
    mt_attn_args a = attn_args(m, l);
    const int64_t k0 = a.window > 0 && t - a.window + 1 > 0 ? t - a.window + 1 : 0;
    a.Tq = 1;
    a.Tk = t + 1 - k0;
    a.q_pos = pos + t;
    a.k_pos = pos + k0;
    MT_TRY(be->ops->attention_fwd(be, &a, b[DEC_CTX], b[DEC_LSE], q, kc + k0 * KVD, vc + k0 * KVD));
    MT_TRY(linear_fwd(m, out, b[DEC_CTX], PW(m, lp->o), 1, QD, D, 0.0f));
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, rstd, out, PW(m, lp->post_attn_norm), 1, D, m->eps, m->w_off, MT_F32));
        MT_TRY(be->ops->axpy(be, x, tmp, 1.0f, D, MT_F32));
    } else {
        MT_TRY(be->ops->axpy(be, x, out, 1.0f, D, MT_F32));
    }

    /* MLP block */
    MT_TRY(be->ops->rmsnorm_fwd(be, nrm, rstd, x, PW(m, lp->pre_mlp_norm), 1, D, m->eps, m->w_off, MT_F32));
    MT_TRY(linear_fwd(m, b[DEC_GATE], nrm, PW(m, lp->gate), 1, D, F, 0.0f));
    MT_TRY(linear_fwd(m, b[DEC_UP], nrm, PW(m, lp->up), 1, D, F, 0.0f));
    MT_TRY(be->ops->glu_fwd(be, glu, b[DEC_GATE], b[DEC_UP], F, m->cfg.mlp_activation, MT_F32));
    if (m->cfg.use_post_ffw_norm) {
        MT_TRY(linear_fwd(m, out, glu, PW(m, lp->down), 1, F, D, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, rstd, out, PW(m, lp->post_ffw_norm), 1, D, m->eps, m->w_off, MT_F32));
        MT_TRY(be->ops->axpy(be, x, tmp, 1.0f, D, MT_F32));
    } else {
        MT_TRY(linear_fwd(m, x, glu, PW(m, lp->down), 1, F, D, 1.0f));
    }
    return MT_OK;
}

mt_status mt_model_decode_step(mt_model *m, int32_t token, float *logits) {
    if (!m || !m->decode || !m->bound)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: not a bound decode model (mt_model_set_decode)");
    if (!logits) return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: logits is NULL");
    if (token < 0 || (int64_t)token >= m->V)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: token %d is outside [0, vocab_size=%lld)",
                            (int)token, (long long)m->V);
    const int64_t t = m->dec_len;
    if (t >= m->T)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: the KV cache is full (%lld positions; "
                            "mt_model_decode_reset starts again)", (long long)m->T);
    mt_backend *be = m->be;
    const int64_t D = m->D, V = m->V;
    if (t == 0) { /* constant inputs: once per sequence (the arena may be new) */
        MT_TRY(be->ops->copy_to_device(be, m->dec_buf[DEC_POS], m->pos_host, (size_t)m->T * sizeof(int32_t)));
        MT_TRY(be->ops->copy_to_device(be, m->dec_buf[DEC_INV_FREQ], m->inv_freq_host, (size_t)m->Dh * sizeof(float)));
    }
    MT_TRY(be->ops->copy_to_device(be, m->dec_buf[DEC_TOKEN], &token, sizeof(int32_t)));
    MT_TRY(be->ops->embedding_fwd(be, m->dec_buf[DEC_X], PW(m, m->p_embed), m->dec_buf[DEC_TOKEN], 1, D, m->emb_scale, MT_F32));
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) MT_TRY(decode_layer(m, l, t));
    MT_TRY(be->ops->rmsnorm_fwd(be, m->dec_buf[DEC_NORM], m->dec_buf[DEC_RSTD], m->dec_buf[DEC_X], PW(m, m->p_final_norm), 1, D,
                     m->eps, m->w_off, MT_F32));
    MT_TRY(linear_fwd(m, m->dec_buf[DEC_LOGITS], m->dec_buf[DEC_NORM], unembedding(m), 1, D, V, 0.0f));
    MT_TRY(be->ops->copy_to_host(be, logits, m->dec_buf[DEC_LOGITS], (size_t)V * sizeof(float)));
    const float cap = m->cfg.final_logits_soft_cap; /* as mt_model_logits */
    if (cap > 0.0f)
        for (int64_t i = 0; i < V; i++) logits[i] = cap * tanhf(logits[i] / cap);
    m->dec_len = t + 1;
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* tensor parallelism: set-up (the compute is in row_fwd / tp_sum above)          */

mt_status mt_model_set_tensor_parallel(mt_model *m, mt_comm *comm, int size, int rank) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_tensor_parallel: model is NULL");
    if (m->planned || m->tp != 1)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_tensor_parallel: call once, before mt_model_add_to_plan");
    if (size < 1 || rank < 0 || rank >= size)
        return mt_set_error(MT_ERR_INVALID, "tensor parallelism: rank %d outside a group of %d", rank, size);
    if (size == 1) return MT_OK;
    const int64_t T = size;
    const mt_layout_sizes split = {.num_query_heads = m->H, .num_kv_heads = m->Hkv, .mlp_dim = m->F,
                                   .vocab_size = m->V};
    MT_TRY(mt_mesh_check_tensor_split(T, &split)); /* the rules shared with mesh and estimator */
    m->tp_off = calloc((size_t)m->nparams, sizeof(int64_t));
    if (!m->tp_off) return mt_set_error(MT_ERR_OOM, "mt_model_set_tensor_parallel: out of memory");
    m->tp = size;
    m->tp_rank = rank;
    m->tp_comm = comm;
    m->H /= T;
    m->Hkv /= T;
    m->F /= T;
    m->QD = m->H * m->Dh;
    m->KVD = m->Hkv * m->Dh;
    m->Vl = m->V / T;
    m->v0 = rank * m->Vl;
    const int64_t D = m->D;
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) {
        const layer_params *lp = &m->lp[l];
        m->tp_off[lp->q] = rank * m->QD * D;   /* column-parallel: rows of [out, in] */
        m->tp_off[lp->k] = rank * m->KVD * D;
        m->tp_off[lp->v] = rank * m->KVD * D;
        m->tp_off[lp->gate] = rank * m->F * D;
        m->tp_off[lp->up] = rank * m->F * D;
        m->tp_off[lp->o] = rank * m->QD;       /* row-parallel: columns of [out, in] */
        m->tp_off[lp->down] = rank * m->F;
    }
    return MT_OK;
}

int mt_model_tp_grad_replicated(const mt_model *m, int i) {
    if (!m || m->tp == 1 || m->sp || i < 0 || i >= m->nparams || m->params[i].ndim != 1) return 0;
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        if (i == m->lp[l].q_norm || i == m->lp[l].k_norm) return 0; /* summed over the heads of each rank */
    return 1;
}

/* ------------------------------------------------------------------------------ */
/* context parallelism: set-up (the compute is in cp_attention_fwd / _bwd above)  */

mt_status mt_model_set_context_parallel(mt_model *m, mt_comm *comm, int size, int rank, int ring) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_context_parallel: model is NULL");
    if (m->planned || m->cp != 1 || m->sp)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_context_parallel: call once, before "
                            "mt_model_set_sequence_parallel and mt_model_add_to_plan");
    if (size < 1 || rank < 0 || rank >= size)
        return mt_set_error(MT_ERR_INVALID, "context parallelism: rank %d outside a group of %d", rank, size);
    if (size == 1) return MT_OK;
    if (m->T % (2 * size) != 0)
        return mt_set_error(MT_ERR_INVALID, "max_target_length=%lld is not divisible by 2 x "
                            "ici_context_parallelism=%d", (long long)m->T, size);
    m->cp = size;
    m->cp_ring = ring != 0;
    m->cp_rank = rank;
    m->cp_comm = comm;
    m->Tg = m->T;
    m->T = m->Tg / size;
    m->N = m->B * m->T;
    /* cp_tok / cp_lab ([N] each) are allocated by mt_model_bind: planning allocates
     * nothing proportional to the batch. */
    m->cp_kpos_host = malloc(sizeof(int32_t) * (size_t)m->Tg);
    if (!m->cp_kpos_host) return mt_set_error(MT_ERR_OOM, "mt_model_set_context_parallel: out of memory");
    for (int64_t n = 0; n < m->T; n++) m->pos_host[n] = cp_position(m, rank, n);
    for (int r = 0; r < size; r++)
        for (int64_t j = 0; j < m->T; j++) m->cp_kpos_host[r * m->T + j] = cp_position(m, r, j);
    if (m->tiles > m->N) m->tiles = m->N;
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* document masking: set-up (the ids are computed per step by packing_upload)      */

mt_status mt_model_set_packing(mt_model *m, int on, int32_t separator) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_packing: model is NULL");
    if (m->planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_packing: call it before mt_model_add_to_plan");
    if (separator < 0)
        return mt_set_error(MT_ERR_INVALID, "packing_separator_id=%d: a token id is >= 0", (int)separator);
    m->packing = on != 0;
    m->pack_sep = separator;
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* sequence parallelism: set-up (the compute is in norm_gather / row_fwd /        */
/* tp_sum_input_grad above)                                                       */

mt_status mt_model_set_sequence_parallel(mt_model *m, int on) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_sequence_parallel: model is NULL");
    if (m->planned || m->sp)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_sequence_parallel: call once, before mt_model_add_to_plan");
    if (!on || m->tp == 1) return MT_OK; /* nothing to split without a tensor group */
    if (m->N % m->tp != 0)
        return mt_set_error(MT_ERR_INVALID, "tensor_sequence_parallelism: the %lld rows per rank "
                            "(per_device_batch_size=%lld x max_target_length=%lld / ici_context_parallelism=%d) "
                            "are not divisible by ici_tensor_parallelism=%d", (long long)m->N, (long long)m->B,
                            (long long)(m->cp > 1 ? m->Tg : m->T), m->cp, m->tp);
    m->sp_counts = malloc(sizeof(int64_t) * (size_t)m->tp);
    if (!m->sp_counts) return mt_set_error(MT_ERR_OOM, "mt_model_set_sequence_parallel: out of memory");
    for (int r = 0; r < m->tp; r++) m->sp_counts[r] = m->N / m->tp * m->D;
    m->sp = 1;
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* fsdp (ZeRO-3 style parameter sharding; Rajbhandari et al. 2020, Zhao et al. 2023 */
/* "PyTorch FSDP"): the flat parameter buffer is cut into equal contiguous shards   */
/* (the ZeRO-1 split of parallel/zero1.h), each rank keeps its own; the parameter    */
/* windows of the host-offload path are filled by all-gathers over the fsdp group     */
/* instead of host copies: the embedding, final norm and head at the start of every  */
/* forward, each layer before its forward (slot l % 2, overwriting layer l - 2), and */
/* in the backward each layer whose slot was reused (all but the last two). Layer    */
/* gathers are prefetched (prefetch_layer): started asynchronously while the layer   */
/* before (forward) or after (backward) computes, waited for before use.             */

/* Elements of [a, b) inside rank r's shard. */
static int64_t fsdp_own(const mt_model *m, int r, int64_t a, int64_t b) {
    int64_t lo = (int64_t)r * m->fper, hi = lo + m->fper;
    if (hi > m->numel) hi = m->numel;
    if (lo < a) lo = a;
    if (hi > b) hi = b;
    return hi > lo ? hi - lo : 0;
}

/* win[0, b - a) = flat parameters [a, b), gathered from the shards (each rank sends
 * its part; rank order is flat order). async: started only (m->fsdp_req, completed by
 * fsdp_wait; the shard and win are not touched meanwhile). Failures go to tp_status
 * (first of the pass). */
static void fsdp_gather(mt_model *m, float *win, int64_t a, int64_t b, int async) {
    if (m->tp_status != MT_OK) return;
    for (int r = 0; r < m->fsdp; r++) m->fsdp_counts[r] = fsdp_own(m, r, a, b);
    const int64_t own0 = a > m->flo ? a : m->flo;
    const float *send = m->fsdp_counts[m->fsdp_rank] > 0 ? (const float *)m->gptr[GB_PARAMS] + (own0 - m->flo)
                                                          : (const float *)m->gptr[GB_PARAMS];
    if (async)
        m->tp_status = mt_comm_all_gather_start(m->fsdp_comm, send, win, m->fsdp_counts, MT_COMM_F32, &m->fsdp_req);
    else
        m->tp_status = mt_comm_all_gather(m->fsdp_comm, send, win, m->fsdp_counts, MT_COMM_F32);
}

/* Complete the prefetch in flight, if any (its failure goes to tp_status). */
static void fsdp_wait(mt_model *m) {
    if (!m->fsdp_req) return;
    const mt_status st = mt_comm_wait(m->fsdp_req);
    m->fsdp_req = NULL;
    if (m->tp_status == MT_OK) m->tp_status = st;
}

mt_status mt_model_set_fsdp(mt_model *m, mt_comm *comm, int size, int rank) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_fsdp: model is NULL");
    if (m->planned || m->fsdp != 1)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_fsdp: call once, before mt_model_add_to_plan");
    if (size < 1 || rank < 0 || rank >= size)
        return mt_set_error(MT_ERR_INVALID, "fsdp: rank %d outside a group of %d", rank, size);
    if (size == 1) return MT_OK;
    if (m->numel < size)
        return mt_set_error(MT_ERR_INVALID, "ici_fsdp_parallelism=%d exceeds the %lld parameters", size,
                            (long long)m->numel);
    m->fsdp_counts = malloc(sizeof(int64_t) * (size_t)size);
    if (!m->fsdp_counts) return mt_set_error(MT_ERR_OOM, "mt_model_set_fsdp: out of memory");
    MT_TRY(build_param_layer(m));
    m->fsdp = size;
    m->fsdp_rank = rank;
    m->fsdp_comm = comm;
    m->fper = (m->numel + size - 1) / size;
    m->flo = (int64_t)rank * m->fper;
    m->fhi = m->flo + m->fper;
    if (m->flo > m->numel) m->flo = m->numel;
    if (m->fhi > m->numel) m->fhi = m->numel;
    return MT_OK;
}

void mt_model_fsdp_range(const mt_model *m, int64_t *lo, int64_t *hi) {
    *lo = m->fsdp > 1 ? m->flo : 0;
    *hi = m->fsdp > 1 ? m->fhi : m->numel;
}

int64_t mt_model_fsdp_gather_floats(const mt_model *m) {
    if (m->fsdp == 1) return 0;
    const int r = m->fsdp_rank;
    const int64_t emb = m->params[m->p_embed].numel, L = m->cfg.num_decoder_layers;
    int64_t f = (emb - fsdp_own(m, r, 0, emb)) + (m->numel - m->tail_off - fsdp_own(m, r, m->tail_off, m->numel));
    for (int64_t l = 0; l < L; l++) {
        const int64_t a = m->params[m->lp[l].in_norm].offset, n = m->layer_numel - fsdp_own(m, r, a, a + m->layer_numel);
        f += n;                 /* forward */
        if (l + 2 < L) f += n;  /* backward: slot l % 2 was reused by layer l + 2 */
    }
    return f;
}
