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
 * backward accumulates into it (ops->rmsnorm_bwd adds to dx), which is the residual
 * connection's gradient for free. */
#include "models/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tiled_loss.h"
#include "runtime/rng.h"

/* ---- per-layer saved activations (MaxText remat names where they exist) ---- */
enum {
    LA_INPUT = 0,    /* decoder_layer_input [N, D] */
    LA_RSTD_IN,      /* input_layernorm rstd [N] */
    LA_RSTD_QN,      /* q_norm rstd [N*H] (qk-norm) */
    LA_RSTD_KN,      /* k_norm rstd [N*Hkv] (qk-norm) */
    LA_Q,            /* query_proj [N, H*Dh] after qk-norm and RoPE */
    LA_K,            /* key_proj [N, Hkv*Dh] after qk-norm and RoPE */
    LA_V,            /* value_proj [N, Hkv*Dh] */
    LA_CTX,          /* context [N, H*Dh] */
    LA_LSE,          /* context logsumexp [B, H, T] */
    LA_OUT,          /* out_proj [N, D] (o_proj output, before any post-attention norm) */
    LA_RSTD_PA,      /* post-attention norm rstd [N] (gemma2/3) */
    LA_RSTD_MLP,     /* pre-MLP norm rstd [N] */
    LA_GATE,         /* mlpwi_0 [N, F] gate pre-activation */
    LA_UP,           /* mlpwi_1 [N, F] up projection */
    LA_MLPWO,        /* mlpwo [N, D] down projection output (only with a post-FFW norm) */
    LA_RSTD_PF,      /* post-feedforward norm rstd [N] */
    LA_COUNT
};

static const char *const k_layer_act_names[LA_COUNT] = {
    "decoder_layer_input", "input_norm_rstd", "query_norm_rstd", "key_norm_rstd",
    "query_proj", "key_proj", "value_proj", "context", "context_lse", "out_proj",
    "post_attn_norm_rstd", "pre_mlp_norm_rstd", "mlpwi_0", "mlpwi_1", "mlpwo",
    "post_ffw_norm_rstd"};

/* ---- buffers that are not per layer ---- */
enum {
    GB_PARAMS = 0, GB_GRADS,
    GB_TOKENS, GB_LABELS, GB_POSITIONS, GB_INV_FREQ,
    GB_FINAL_INPUT, GB_FINAL_RSTD, GB_FINAL_HIDDEN, GB_FINAL_HIDDEN_GRAD, GB_LOSS_TILE,
    GB_RESID_GRAD,
    GB_FWD_NORM, GB_FWD_RESID, GB_FWD_TMP, GB_FWD_GLU,
    GB_BWD_NORM, GB_BWD_RESID, GB_BWD_D1, GB_BWD_D2, GB_BWD_W0, GB_BWD_W1, GB_BWD_W2,
    GB_BWD_W3, GB_BWD_W4,
    GB_COUNT
};

/* Parameter indices of one layer (-1 when absent). */
typedef struct layer_params {
    int in_norm, q, k, v, o, q_norm, k_norm, post_attn_norm, pre_mlp_norm, post_ffw_norm;
    int gate, up, down;
} layer_params;

struct mt_model {
    mt_model_config cfg;
    const mt_ops *ops;
    int64_t B, T, N, tiles;
    int64_t D, V, F, H, Hkv, Dh, QD, KVD;
    float eps, w_off, emb_scale;

    /* parameter table */
    mt_param_info *params;
    int nparams;
    int64_t numel;
    int p_embed, p_final_norm, p_lm_head;
    layer_params *lp;

    /* host copies of constant inputs */
    float *inv_freq_host;  /* [2 * Dh/2]: global table then local table */
    int32_t *pos_host;     /* [N] */

    /* plan ids and bound pointers */
    int planned, bound;
    int gid[GB_COUNT];
    void *gptr[GB_COUNT];
    int (*lid)[LA_COUNT];
    float *(*lptr)[LA_COUNT];
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

mt_status mt_model_create(mt_model **out, const mt_model_config *cfg, const mt_ops *ops,
                          int64_t batch, int64_t seq, int64_t num_vocab_tiling) {
    if (!out || !cfg || !ops) return mt_set_error(MT_ERR_INVALID, "mt_model_create: NULL argument");
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
    m->ops = ops;
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
    m->eps = cfg->normalization_layer_epsilon;
    m->w_off = (float)mt_model_norm_unit_offset(cfg);
    m->emb_scale = mt_model_embedding_scale(cfg);

    const int64_t L = cfg->num_decoder_layers;
    m->params = calloc((size_t)(13 * L + 3), sizeof(*m->params));
    m->lp = calloc((size_t)L, sizeof(*m->lp));
    m->lid = calloc((size_t)L, sizeof(*m->lid));
    m->lptr = calloc((size_t)L, sizeof(*m->lptr));
    m->inv_freq_host = calloc((size_t)m->Dh, sizeof(float));
    m->pos_host = calloc((size_t)m->N, sizeof(int32_t));
    if (!m->params || !m->lp || !m->lid || !m->lptr || !m->inv_freq_host || !m->pos_host) {
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
    for (int64_t n = 0; n < m->N; n++) m->pos_host[n] = (int32_t)(n % m->T);

    for (int i = 0; i < GB_COUNT; i++) m->gid[i] = -1;
    for (int64_t l = 0; l < L; l++)
        for (int j = 0; j < LA_COUNT; j++) m->lid[l][j] = -1;
    *out = m;
    return MT_OK;
}

void mt_model_free(mt_model *m) {
    if (!m) return;
    free(m->params);
    free(m->lp);
    free(m->lid);
    free(m->lptr);
    free(m->inv_freq_host);
    free(m->pos_host);
    free(m);
}

const mt_model_config *mt_model_get_config(const mt_model *m) { return &m->cfg; }

const mt_ops *mt_model_ops(const mt_model *m) { return m->ops; }

int mt_model_phase_count(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 4); }

/* Phases (model.h). */
static int ph_fwd(const mt_model *m, int64_t l) { (void)m; return (int)(1 + l); }
static int ph_loss(const mt_model *m) { return (int)(m->cfg.num_decoder_layers + 1); }
static int ph_bwd(const mt_model *m, int64_t l) { return (int)(2 * m->cfg.num_decoder_layers + 1 - l); }
static int ph_embed_bwd(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 2); }
static int ph_optim(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 3); }

/* ------------------------------------------------------------------------------ */
/* plan                                                                            */

/* Elements (floats) of saved tensor j of a layer; 0 when this config has none. */
static int64_t layer_act_elems(const mt_model *m, int j) {
    const mt_model_config *c = &m->cfg;
    const int64_t N = m->N;
    switch (j) {
    case LA_INPUT: return N * m->D;
    case LA_RSTD_IN: return N;
    case LA_RSTD_QN: return c->use_qk_norm ? N * m->H : 0;
    case LA_RSTD_KN: return c->use_qk_norm ? N * m->Hkv : 0;
    case LA_Q: return N * m->QD;
    case LA_K: return N * m->KVD;
    case LA_V: return N * m->KVD;
    case LA_CTX: return N * m->QD;
    case LA_LSE: return m->B * m->H * m->T;
    case LA_OUT: return N * m->D;
    case LA_RSTD_PA: return c->use_post_attn_norm ? N : 0;
    case LA_RSTD_MLP: return N;
    case LA_GATE: return N * m->F;
    case LA_UP: return N * m->F;
    case LA_MLPWO: return c->use_post_ffw_norm ? N * m->D : 0;
    case LA_RSTD_PF: return c->use_post_ffw_norm ? N : 0;
    default: return 0;
    }
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static mt_status plan_add(mt_model *m, mt_plan *plan, int g, const char *name, mt_mem_category cat,
                          size_t bytes, int first, int last) {
    return mt_plan_add(plan, name, cat, bytes, first, last, &m->gid[g]);
}

mt_status mt_model_add_to_plan(mt_model *m, mt_plan *plan) {
    if (!m || !plan) return mt_set_error(MT_ERR_INVALID, "mt_model_add_to_plan: NULL argument");
    const int64_t L = m->cfg.num_decoder_layers, N = m->N, D = m->D, F = m->F;
    const int64_t QD = m->QD, KVD = m->KVD;
    const size_t f4 = sizeof(float), i4 = sizeof(int32_t);
    const int last = ph_optim(m);
    const int fwd0 = ph_fwd(m, 0), fwd1 = ph_fwd(m, L - 1);
    const int bwd0 = ph_bwd(m, L - 1), bwd1 = ph_bwd(m, 0);
    const int loss = ph_loss(m);

    MT_TRY(plan_add(m, plan, GB_PARAMS, "params", MT_MEM_PARAMS, (size_t)m->numel * f4, 0, last));
    MT_TRY(plan_add(m, plan, GB_GRADS, "grads", MT_MEM_GRADS, (size_t)m->numel * f4, 0, last));
    /* Step inputs: uploaded in phase 0 (labels in the loss phase), kept while used. */
    MT_TRY(plan_add(m, plan, GB_TOKENS, "tokens", MT_MEM_ACTIVATIONS, (size_t)N * i4, 0, ph_embed_bwd(m)));
    MT_TRY(plan_add(m, plan, GB_LABELS, "labels", MT_MEM_ACTIVATIONS, (size_t)N * i4, loss, loss));
    MT_TRY(plan_add(m, plan, GB_POSITIONS, "positions", MT_MEM_ACTIVATIONS, (size_t)N * i4, 0, bwd1));
    MT_TRY(plan_add(m, plan, GB_INV_FREQ, "rope_inv_freq", MT_MEM_ACTIVATIONS, (size_t)m->Dh * f4, 0, bwd1));

    /* Saved activations of layer l: written in phase l (decoder_layer_input: by the
     * embedding or the previous layer) or 1 + l, read last by the layer's backward. */
    for (int64_t l = 0; l < L; l++) {
        for (int j = 0; j < LA_COUNT; j++) {
            int64_t e = layer_act_elems(m, j);
            if (e == 0) continue;
            char name[MT_PLAN_NAME_MAX];
            snprintf(name, sizeof(name), "layers.%lld.%s", (long long)l, k_layer_act_names[j]);
            int first = j == LA_INPUT ? (int)l : ph_fwd(m, l);
            MT_TRY(mt_plan_add(plan, name, MT_MEM_ACTIVATIONS, (size_t)e * f4, first, ph_bwd(m, l),
                               &m->lid[l][j]));
        }
    }
    MT_TRY(plan_add(m, plan, GB_FINAL_INPUT, "final_norm_input", MT_MEM_ACTIVATIONS, (size_t)(N * D) * f4,
                    fwd1, loss));
    MT_TRY(plan_add(m, plan, GB_FINAL_RSTD, "final_norm_rstd", MT_MEM_ACTIVATIONS, (size_t)N * f4, loss, loss));
    MT_TRY(plan_add(m, plan, GB_FINAL_HIDDEN, "final_hidden", MT_MEM_ACTIVATIONS, (size_t)(N * D) * f4, loss,
                    loss));
    MT_TRY(plan_add(m, plan, GB_FINAL_HIDDEN_GRAD, "final_hidden_grad", MT_MEM_SCRATCH, (size_t)(N * D) * f4,
                    loss, loss));
    MT_TRY(plan_add(m, plan, GB_LOSS_TILE, "loss_tile", MT_MEM_LOSS_TILE,
                    (size_t)(mt_tiled_loss_tile_rows(N, m->tiles) * m->V) * f4, loss, loss));
    MT_TRY(plan_add(m, plan, GB_RESID_GRAD, "residual_grad", MT_MEM_SCRATCH, (size_t)(N * D) * f4, loss,
                    ph_embed_bwd(m)));

    /* Forward scratch, shared by the layers' forward phases. */
    MT_TRY(plan_add(m, plan, GB_FWD_NORM, "fwd.normed", MT_MEM_SCRATCH, (size_t)(N * D) * f4, fwd0, fwd1));
    MT_TRY(plan_add(m, plan, GB_FWD_RESID, "fwd.residual", MT_MEM_SCRATCH, (size_t)(N * D) * f4, fwd0, fwd1));
    MT_TRY(plan_add(m, plan, GB_FWD_TMP, "fwd.tmp", MT_MEM_SCRATCH, (size_t)(N * max64(D, QD)) * f4, fwd0,
                    fwd1));
    MT_TRY(plan_add(m, plan, GB_FWD_GLU, "fwd.glu", MT_MEM_SCRATCH, (size_t)(N * F) * f4, fwd0, fwd1));
    /* Backward scratch, shared by the layers' backward phases. */
    MT_TRY(plan_add(m, plan, GB_BWD_NORM, "bwd.normed", MT_MEM_SCRATCH, (size_t)(N * D) * f4, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_RESID, "bwd.residual", MT_MEM_SCRATCH, (size_t)(N * D) * f4, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_D1, "bwd.d_model_a", MT_MEM_SCRATCH, (size_t)(N * D) * f4, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_D2, "bwd.d_model_b", MT_MEM_SCRATCH, (size_t)(N * D) * f4, bwd0, bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W0, "bwd.work0", MT_MEM_SCRATCH, (size_t)(N * max64(F, QD)) * f4, bwd0,
                    bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W1, "bwd.work1", MT_MEM_SCRATCH, (size_t)(N * max64(F, QD)) * f4, bwd0,
                    bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W2, "bwd.work2", MT_MEM_SCRATCH, (size_t)(N * max64(F, KVD)) * f4, bwd0,
                    bwd1));
    MT_TRY(plan_add(m, plan, GB_BWD_W3, "bwd.work3", MT_MEM_SCRATCH, (size_t)(N * KVD) * f4, bwd0, bwd1));
    if (m->cfg.use_qk_norm)
        MT_TRY(plan_add(m, plan, GB_BWD_W4, "bwd.work4", MT_MEM_SCRATCH, (size_t)(N * QD) * f4, bwd0, bwd1));
    m->planned = 1;
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
    if (m->gid[GB_PARAMS] >= mt_plan_count(plan))
        return mt_set_error(MT_ERR_INVALID, "mt_model_bind: not the plan this model was added to");
    for (int g = 0; g < GB_COUNT; g++) MT_TRY(bind_one(arena, plan, m->gid[g], &m->gptr[g]));
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int j = 0; j < LA_COUNT; j++) {
            void *p;
            MT_TRY(bind_one(arena, plan, m->lid[l][j], &p));
            m->lptr[l][j] = p;
        }
    m->bound = 1;
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

mt_status mt_model_init_params(mt_model *m, uint64_t seed) {
    if (!m->bound) return mt_set_error(MT_ERR_INVALID, "mt_model_init_params: model not bound to an arena");
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
        m->ops->copy_to_device(base + p->offset, h, (size_t)p->numel * sizeof(float));
    }
    free(h);
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* forward / backward                                                              */

static const float *PW(const mt_model *m, int i) {
    return (const float *)m->gptr[GB_PARAMS] + m->params[i].offset;
}
static float *GW(const mt_model *m, int i) { return (float *)m->gptr[GB_GRADS] + m->params[i].offset; }

/* y[N, out] = x[N, in] W^T + beta y, W [out, in] (HF nn.Linear). */
static void linear_fwd(const mt_ops *ops, float *y, const float *x, const float *W, int64_t N,
                       int64_t in, int64_t out, float beta) {
    ops->gemm(0, 1, N, out, in, 1.0f, x, in, W, in, beta, y, out);
}
/* dW[out, in] += dy[N, out]^T x[N, in] */
static void linear_bwd_w(const mt_ops *ops, float *dW, const float *dy, const float *x, int64_t N,
                         int64_t in, int64_t out) {
    ops->gemm(1, 0, out, in, N, 1.0f, dy, out, x, in, 1.0f, dW, in);
}
/* dx[N, in] = dy[N, out] W + beta dx */
static void linear_bwd_x(const mt_ops *ops, float *dx, const float *dy, const float *W, int64_t N,
                         int64_t in, int64_t out, float beta) {
    ops->gemm(0, 0, N, in, out, 1.0f, dy, out, W, in, beta, dx, in);
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
    a.q_pos = NULL;
    a.k_pos = NULL;
    return a;
}

static const float *layer_inv_freq(const mt_model *m, int64_t l) {
    const float *t = m->gptr[GB_INV_FREQ];
    return mt_model_layer_is_local(&m->cfg, l) ? t + m->Dh / 2 : t;
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

/* Forward of layer l (phase 1 + l): layer input -> next layer input. */
static void layer_forward(mt_model *m, int64_t l) {
    const mt_ops *ops = m->ops;
    const layer_params *lp = &m->lp[l];
    float **a = m->lptr[l];
    const int64_t N = m->N, D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh;
    const int64_t QD = m->QD, KVD = m->KVD;
    const size_t ND = (size_t)(N * D) * sizeof(float);
    float *nrm = m->gptr[GB_FWD_NORM], *res = m->gptr[GB_FWD_RESID];
    float *tmp = m->gptr[GB_FWD_TMP], *glu = m->gptr[GB_FWD_GLU];
    const int32_t *pos = m->gptr[GB_POSITIONS];
    const float *inv_freq = layer_inv_freq(m, l);
    const float *x = a[LA_INPUT];
    float *y = l + 1 < m->cfg.num_decoder_layers ? m->lptr[l + 1][LA_INPUT] : m->gptr[GB_FINAL_INPUT];

    /* attention block */
    ops->rmsnorm_fwd(nrm, a[LA_RSTD_IN], x, PW(m, lp->in_norm), N, D, m->eps, m->w_off);
    if (m->cfg.use_qk_norm) {
        linear_fwd(ops, tmp, nrm, PW(m, lp->q), N, D, QD, 0.0f);
        ops->rmsnorm_fwd(a[LA_Q], a[LA_RSTD_QN], tmp, PW(m, lp->q_norm), N * H, Dh, m->eps, m->w_off);
        linear_fwd(ops, tmp, nrm, PW(m, lp->k), N, D, KVD, 0.0f);
        ops->rmsnorm_fwd(a[LA_K], a[LA_RSTD_KN], tmp, PW(m, lp->k_norm), N * Hkv, Dh, m->eps, m->w_off);
    } else {
        linear_fwd(ops, a[LA_Q], nrm, PW(m, lp->q), N, D, QD, 0.0f);
        linear_fwd(ops, a[LA_K], nrm, PW(m, lp->k), N, D, KVD, 0.0f);
    }
    ops->rope_fwd(a[LA_Q], pos, inv_freq, N, H, Dh);
    ops->rope_fwd(a[LA_K], pos, inv_freq, N, Hkv, Dh);
    linear_fwd(ops, a[LA_V], nrm, PW(m, lp->v), N, D, KVD, 0.0f);
    mt_attn_args args = attn_args(m, l);
    ops->attention_fwd(&args, a[LA_CTX], a[LA_LSE], a[LA_Q], a[LA_K], a[LA_V]);
    linear_fwd(ops, a[LA_OUT], a[LA_CTX], PW(m, lp->o), N, QD, D, 0.0f);
    ops->copy(res, x, ND);
    if (m->cfg.use_post_attn_norm) {
        ops->rmsnorm_fwd(tmp, a[LA_RSTD_PA], a[LA_OUT], PW(m, lp->post_attn_norm), N, D, m->eps, m->w_off);
        ops->axpy(res, tmp, 1.0f, N * D);
    } else {
        ops->axpy(res, a[LA_OUT], 1.0f, N * D);
    }

    /* MLP block */
    ops->rmsnorm_fwd(nrm, a[LA_RSTD_MLP], res, PW(m, lp->pre_mlp_norm), N, D, m->eps, m->w_off);
    linear_fwd(ops, a[LA_GATE], nrm, PW(m, lp->gate), N, D, F, 0.0f);
    linear_fwd(ops, a[LA_UP], nrm, PW(m, lp->up), N, D, F, 0.0f);
    ops->glu_fwd(glu, a[LA_GATE], a[LA_UP], N * F, m->cfg.mlp_activation);
    ops->copy(y, res, ND);
    if (m->cfg.use_post_ffw_norm) {
        linear_fwd(ops, a[LA_MLPWO], glu, PW(m, lp->down), N, F, D, 0.0f);
        ops->rmsnorm_fwd(tmp, a[LA_RSTD_PF], a[LA_MLPWO], PW(m, lp->post_ffw_norm), N, D, m->eps, m->w_off);
        ops->axpy(y, tmp, 1.0f, N * D);
    } else {
        linear_fwd(ops, y, glu, PW(m, lp->down), N, F, D, 1.0f);
    }
}

/* Backward of layer l (phase 2L + 1 - l): on entry G = dloss/d(layer output), on exit
 * G = dloss/d(layer input); parameter gradients accumulated. */
static void layer_backward(mt_model *m, int64_t l) {
    const mt_ops *ops = m->ops;
    const layer_params *lp = &m->lp[l];
    float **a = m->lptr[l];
    const int64_t N = m->N, D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh;
    const int64_t QD = m->QD, KVD = m->KVD;
    const size_t ND = (size_t)(N * D) * sizeof(float);
    const float eps = m->eps, off = m->w_off;
    float *G = m->gptr[GB_RESID_GRAD];
    float *nrm = m->gptr[GB_BWD_NORM], *res = m->gptr[GB_BWD_RESID];
    float *d1 = m->gptr[GB_BWD_D1], *d2 = m->gptr[GB_BWD_D2];
    float *w0 = m->gptr[GB_BWD_W0], *w1 = m->gptr[GB_BWD_W1], *w2 = m->gptr[GB_BWD_W2];
    float *w3 = m->gptr[GB_BWD_W3], *w4 = m->gptr[GB_BWD_W4];
    const int32_t *pos = m->gptr[GB_POSITIONS];
    const float *inv_freq = layer_inv_freq(m, l);
    const float *x = a[LA_INPUT];

    /* ---- MLP block: y = h + [post_ffw](down(act(g) u)) ---- */
    const float *dmlp = G;
    if (m->cfg.use_post_ffw_norm) {
        ops->zero(d1, ND);
        ops->rmsnorm_bwd(d1, GW(m, lp->post_ffw_norm), G, a[LA_MLPWO], PW(m, lp->post_ffw_norm),
                         a[LA_RSTD_PF], N, D, off);
        dmlp = d1;
    }
    /* recompute h = x + [post_attn](o) and n2 = norm(h) */
    ops->copy(res, x, ND);
    if (m->cfg.use_post_attn_norm) {
        ops->rmsnorm_fwd(d2, a[LA_RSTD_PA], a[LA_OUT], PW(m, lp->post_attn_norm), N, D, eps, off);
        ops->axpy(res, d2, 1.0f, N * D);
    } else {
        ops->axpy(res, a[LA_OUT], 1.0f, N * D);
    }
    ops->rmsnorm_fwd(nrm, a[LA_RSTD_MLP], res, PW(m, lp->pre_mlp_norm), N, D, eps, off);
    ops->glu_fwd(w0, a[LA_GATE], a[LA_UP], N * F, m->cfg.mlp_activation);
    linear_bwd_w(ops, GW(m, lp->down), dmlp, w0, N, F, D);
    linear_bwd_x(ops, w0, dmlp, PW(m, lp->down), N, F, D, 0.0f); /* d(act(g) u) */
    ops->glu_bwd(w1, w2, w0, a[LA_GATE], a[LA_UP], N * F, m->cfg.mlp_activation);
    linear_bwd_w(ops, GW(m, lp->gate), w1, nrm, N, D, F);
    linear_bwd_w(ops, GW(m, lp->up), w2, nrm, N, D, F);
    linear_bwd_x(ops, d2, w1, PW(m, lp->gate), N, D, F, 0.0f);
    linear_bwd_x(ops, d2, w2, PW(m, lp->up), N, D, F, 1.0f);
    ops->rmsnorm_bwd(G, GW(m, lp->pre_mlp_norm), d2, res, PW(m, lp->pre_mlp_norm), a[LA_RSTD_MLP], N, D,
                     off);

    /* ---- attention block: h = x + [post_attn](o_proj(attn(...))) ---- */
    const float *dattn = G;
    if (m->cfg.use_post_attn_norm) {
        ops->zero(d1, ND);
        ops->rmsnorm_bwd(d1, GW(m, lp->post_attn_norm), G, a[LA_OUT], PW(m, lp->post_attn_norm),
                         a[LA_RSTD_PA], N, D, off);
        dattn = d1;
    }
    linear_bwd_w(ops, GW(m, lp->o), dattn, a[LA_CTX], N, QD, D);
    linear_bwd_x(ops, w0, dattn, PW(m, lp->o), N, QD, D, 0.0f); /* dcontext */
    mt_attn_args args = attn_args(m, l);
    ops->attention_bwd(&args, w1, w2, w3, w0, a[LA_Q], a[LA_K], a[LA_V], a[LA_CTX], a[LA_LSE]);
    ops->rope_bwd(w1, pos, inv_freq, N, H, Dh);
    ops->rope_bwd(w2, pos, inv_freq, N, Hkv, Dh);
    ops->rmsnorm_fwd(nrm, a[LA_RSTD_IN], x, PW(m, lp->in_norm), N, D, eps, off); /* recompute n1 */
    const float *dq = w1, *dk = w2, *dv = w3;
    if (m->cfg.use_qk_norm) {
        linear_fwd(ops, w0, nrm, PW(m, lp->q), N, D, QD, 0.0f); /* q before q_norm */
        ops->zero(w4, (size_t)(N * QD) * sizeof(float));
        ops->rmsnorm_bwd(w4, GW(m, lp->q_norm), w1, w0, PW(m, lp->q_norm), a[LA_RSTD_QN], N * H, Dh, off);
        linear_fwd(ops, w0, nrm, PW(m, lp->k), N, D, KVD, 0.0f); /* k before k_norm */
        ops->zero(w1, (size_t)(N * KVD) * sizeof(float));
        ops->rmsnorm_bwd(w1, GW(m, lp->k_norm), w2, w0, PW(m, lp->k_norm), a[LA_RSTD_KN], N * Hkv, Dh, off);
        dq = w4;
        dk = w1;
    }
    linear_bwd_w(ops, GW(m, lp->q), dq, nrm, N, D, QD);
    linear_bwd_w(ops, GW(m, lp->k), dk, nrm, N, D, KVD);
    linear_bwd_w(ops, GW(m, lp->v), dv, nrm, N, D, KVD);
    linear_bwd_x(ops, d2, dq, PW(m, lp->q), N, D, QD, 0.0f);
    linear_bwd_x(ops, d2, dk, PW(m, lp->k), N, D, KVD, 1.0f);
    linear_bwd_x(ops, d2, dv, PW(m, lp->v), N, D, KVD, 1.0f);
    ops->rmsnorm_bwd(G, GW(m, lp->in_norm), d2, x, PW(m, lp->in_norm), a[LA_RSTD_IN], N, D, off);
}

/* Phases 0 .. L and the final norm of phase L + 1: tokens -> final_hidden. */
static void model_forward(mt_model *m, const int32_t *tokens) {
    const mt_ops *ops = m->ops;
    const int64_t N = m->N, D = m->D;
    ops->copy_to_device(m->gptr[GB_TOKENS], tokens, (size_t)N * sizeof(int32_t));
    ops->copy_to_device(m->gptr[GB_POSITIONS], m->pos_host, (size_t)N * sizeof(int32_t));
    ops->copy_to_device(m->gptr[GB_INV_FREQ], m->inv_freq_host, (size_t)m->Dh * sizeof(float));
    ops->embedding_fwd(m->lptr[0][LA_INPUT], PW(m, m->p_embed), m->gptr[GB_TOKENS], N, D, m->emb_scale);
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) layer_forward(m, l);
    ops->rmsnorm_fwd(m->gptr[GB_FINAL_HIDDEN], m->gptr[GB_FINAL_RSTD], m->gptr[GB_FINAL_INPUT],
                     PW(m, m->p_final_norm), N, D, m->eps, m->w_off);
}

static const float *unembedding(const mt_model *m) {
    return PW(m, m->cfg.logits_via_embedding ? m->p_embed : m->p_lm_head);
}

static mt_status check_ready(const mt_model *m, const char *fn) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "%s: model is NULL", fn);
    if (!m->bound) return mt_set_error(MT_ERR_INVALID, "%s: model not bound to an arena", fn);
    return MT_OK;
}

static mt_status forward_loss(mt_model *m, const int32_t *tokens, const int32_t *labels, float dscale,
                              int backward, double *loss_sum, int64_t *count) {
    MT_TRY(check_ready(m, backward ? "mt_model_forward_backward" : "mt_model_loss"));
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    MT_TRY(check_ids(m, labels, "labels", 1));
    const mt_ops *ops = m->ops;
    const int64_t N = m->N, D = m->D;
    model_forward(m, tokens);

    /* phase L + 1: vocab-tiled loss (and its VJP), final norm backward */
    ops->copy_to_device(m->gptr[GB_LABELS], labels, (size_t)N * sizeof(int32_t));
    mt_tiled_loss_args la = {.N = N, .D = D, .V = m->V, .num_tiles = m->tiles,
                             .softcap = m->cfg.final_logits_soft_cap, .ignore_index = MT_IGNORE_LABEL,
                             .dscale = dscale};
    double ls = 0.0;
    int64_t cnt = 0;
    float *dh = backward ? m->gptr[GB_FINAL_HIDDEN_GRAD] : NULL;
    float *dW = NULL;
    if (backward) dW = GW(m, m->cfg.logits_via_embedding ? m->p_embed : m->p_lm_head);
    mt_tiled_loss(ops, &la, m->gptr[GB_FINAL_HIDDEN], unembedding(m), m->gptr[GB_LABELS],
                  m->gptr[GB_LOSS_TILE], dh, dW, &ls, &cnt);
    if (loss_sum) *loss_sum = ls;
    if (count) *count = cnt;
    if (!backward) return MT_OK;

    float *G = m->gptr[GB_RESID_GRAD];
    ops->zero(G, (size_t)(N * D) * sizeof(float));
    ops->rmsnorm_bwd(G, GW(m, m->p_final_norm), dh, m->gptr[GB_FINAL_INPUT], PW(m, m->p_final_norm),
                     m->gptr[GB_FINAL_RSTD], N, D, m->w_off);
    for (int64_t l = m->cfg.num_decoder_layers - 1; l >= 0; l--) layer_backward(m, l);
    /* phase 2L + 2 */
    ops->embedding_bwd(GW(m, m->p_embed), G, m->gptr[GB_TOKENS], N, m->V, D, m->emb_scale);
    ops->sync();
    return MT_OK;
}

mt_status mt_model_forward_backward(mt_model *m, const int32_t *tokens, const int32_t *labels,
                                    float dscale, double *loss_sum, int64_t *count) {
    return forward_loss(m, tokens, labels, dscale, 1, loss_sum, count);
}

mt_status mt_model_loss(mt_model *m, const int32_t *tokens, const int32_t *labels, double *loss_sum,
                        int64_t *count) {
    return forward_loss(m, tokens, labels, 1.0f, 0, loss_sum, count);
}

mt_status mt_model_hidden(mt_model *m, const int32_t *tokens, float *hidden) {
    MT_TRY(check_ready(m, "mt_model_hidden"));
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    if (!hidden) return mt_set_error(MT_ERR_INVALID, "mt_model_hidden: hidden is NULL");
    model_forward(m, tokens);
    m->ops->copy_to_host(hidden, m->gptr[GB_FINAL_HIDDEN], (size_t)(m->N * m->D) * sizeof(float));
    return MT_OK;
}

mt_status mt_model_logits(mt_model *m, const int32_t *tokens, float *logits) {
    MT_TRY(check_ready(m, "mt_model_logits"));
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    if (!logits) return mt_set_error(MT_ERR_INVALID, "mt_model_logits: logits is NULL");
    const mt_ops *ops = m->ops;
    const int64_t N = m->N, D = m->D, V = m->V;
    model_forward(m, tokens);
    const float *h = m->gptr[GB_FINAL_HIDDEN];
    float *tile = m->gptr[GB_LOSS_TILE];
    const float cap = m->cfg.final_logits_soft_cap;
    for (int64_t t = 0; t < m->tiles; t++) {
        /* the row split of kernels/tiled_loss.h */
        const int64_t r0 = t * N / m->tiles, r1 = (t + 1) * N / m->tiles, R = r1 - r0;
        if (R <= 0) continue;
        ops->gemm(0, 1, R, V, D, 1.0f, h + r0 * D, D, unembedding(m), D, 0.0f, tile, V);
        float *dst = logits + r0 * V;
        ops->copy_to_host(dst, tile, (size_t)(R * V) * sizeof(float));
        if (cap > 0.0f)
            for (int64_t i = 0; i < R * V; i++) dst[i] = cap * tanhf(dst[i] / cap);
    }
    return MT_OK;
}
