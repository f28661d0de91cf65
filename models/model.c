/* models/model.c: a model's life and its parameters (models/model.h): create (with the
 * layout check, one place for every rule a layout must satisfy) and free, the parameter
 * table, accessors and the deterministic initialisation. The decoder itself is spread
 * over the files listed in models/model_internal.h.
 *
 * The decoder, layer l, for N = batch x seq rows (Hugging Face modeling_llama.py /
 * modeling_gemma*.py):
 *   n1 = input_layernorm(x)                         rstd saved
 *   q  = rope([q_norm](n1 Wq^T)), k = rope([k_norm](n1 Wk^T)), v = n1 Wv^T   saved
 *   c  = attention(q, k, v)                          saved with its logsumexp
 *   o  = c Wo^T                                      saved (out_proj)
 *   h  = x + [post_attention_layernorm](o)           recomputed in the backward
 *   n2 = pre-MLP norm(h)                             recomputed in the backward
 *   g  = n2 Wg^T, u = n2 Wu^T                        saved (mlpwi_0, mlpwi_1)
 *   y  = h + [post_feedforward_layernorm](act(g) u Wd^T)   (mlpwo saved when post-normed)
 * y is the next layer's decoder_layer_input (model_layers.c). Parameter names and shapes
 * are Hugging Face's (linear weights [out, in]), in one flat buffer in table order. */
#include "models/model_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/mesh.h"
#include "runtime/rng.h"

/* Most parameters a layer has (4 projections, q/k norms, 4 norms, 3 MLP matrices) and
 * outside the layers (embedding, final norm, lm_head): the table's capacity. */
#define MT_PARAMS_PER_LAYER_MAX 17 /* + gemma4's per-layer-input gate, projection, norm, layer_scalar */
#define MT_PARAMS_GLOBAL_MAX 6     /* + gemma4's per-layer embedding, its projection and norm */

/* ------------------------------------------------------------------------------ */
/* parameter table                                                                  */

static int add_param(mt_model *m, const char *name, int ndim, int64_t s0, int64_t s1) {
    mt_param_info *p = &m->par.info[m->par.count];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->shape[0] = s0;
    p->shape[1] = ndim == 2 ? s1 : 0;
    p->numel = ndim == 2 ? s0 * s1 : s0;
    p->offset = m->par.numel;
    p->weight_decay = ndim == 2;
    m->par.numel += p->numel;
    return m->par.count++;
}

static int add_layer_param(mt_model *m, int64_t l, const char *suffix, int ndim, int64_t s0,
                           int64_t s1) {
    char name[MT_PARAM_NAME_MAX];
    snprintf(name, sizeof(name), "model.layers.%lld.%s", (long long)l, suffix);
    return add_param(m, name, ndim, s0, s1);
}

/* Gemma 4 (modeling_gemma4.py; HF names of Gemma4ForCausalLM): per-layer head dims and
 * MLP widths, q_norm everywhere, k/v and k_norm only on layers with their own K/V, four
 * block norms, the per-layer-input gate / projection / norm and layer_scalar (a [1]
 * buffer; model_internal.h layer_params), and after the embedding the per-layer
 * embedding [V, L*P], its projection [L*P, D] and norm [P]. Each layer's entries are
 * consecutive from input_layernorm to mlp.down_proj, as build_param_layer expects. */
static void build_param_table_gemma4(mt_model *m) {
    const mt_model_config *c = &m->cfg;
    const int64_t D = m->D, H = m->H, Hkv = m->Hkv, P = m->g4.P, L = c->num_decoder_layers;
    m->par.embed = add_param(m, "model.embed_tokens.weight", 2, m->V, D);
    m->par.ple_embed = m->par.ple_model_proj = m->par.ple_proj_norm = -1;
    if (P > 0) {
        m->par.ple_embed = add_param(m, "model.embed_tokens_per_layer.weight", 2, m->V, L * P);
        m->par.ple_model_proj = add_param(m, "model.per_layer_model_projection.weight", 2, L * P, D);
        m->par.ple_proj_norm = add_param(m, "model.per_layer_projection_norm.weight", 1, P, 0);
    }
    for (int64_t l = 0; l < L; l++) {
        layer_params *lp = &m->par.layer[l];
        const int64_t Dh = mt_model_layer_head_dim(c, l), F = mt_model_layer_mlp_dim(c, l);
        const int own = mt_model_layer_kv_donor(c, l) < 0;
        lp->in_norm = add_layer_param(m, l, "input_layernorm.weight", 1, D, 0);
        lp->q = add_layer_param(m, l, "self_attn.q_proj.weight", 2, H * Dh, D);
        lp->k = own ? add_layer_param(m, l, "self_attn.k_proj.weight", 2, Hkv * Dh, D) : -1;
        lp->v = own ? add_layer_param(m, l, "self_attn.v_proj.weight", 2, Hkv * Dh, D) : -1;
        lp->o = add_layer_param(m, l, "self_attn.o_proj.weight", 2, D, H * Dh);
        lp->q_norm = add_layer_param(m, l, "self_attn.q_norm.weight", 1, Dh, 0);
        lp->k_norm = own ? add_layer_param(m, l, "self_attn.k_norm.weight", 1, Dh, 0) : -1;
        lp->post_attn_norm = add_layer_param(m, l, "post_attention_layernorm.weight", 1, D, 0);
        lp->pre_mlp_norm = add_layer_param(m, l, "pre_feedforward_layernorm.weight", 1, D, 0);
        lp->post_ffw_norm = add_layer_param(m, l, "post_feedforward_layernorm.weight", 1, D, 0);
        lp->gate = add_layer_param(m, l, "mlp.gate_proj.weight", 2, F, D);
        lp->up = add_layer_param(m, l, "mlp.up_proj.weight", 2, F, D);
        lp->ple_gate = lp->ple_proj = lp->ple_norm = -1;
        if (P > 0) {
            lp->ple_gate = add_layer_param(m, l, "per_layer_input_gate.weight", 2, P, D);
            lp->ple_proj = add_layer_param(m, l, "per_layer_projection.weight", 2, D, P);
            lp->ple_norm = add_layer_param(m, l, "post_per_layer_input_norm.weight", 1, D, 0);
        }
        lp->scalar = add_layer_param(m, l, "layer_scalar", 1, 1, 0);
        m->par.info[lp->scalar].buffer = 1;
        lp->down = add_layer_param(m, l, "mlp.down_proj.weight", 2, D, F);
    }
    m->par.final_norm = add_param(m, "model.norm.weight", 1, D, 0);
    m->par.lm_head = -1;
    if (!c->logits_via_embedding) m->par.lm_head = add_param(m, "lm_head.weight", 2, m->V, D);
}

static void build_param_table(mt_model *m) {
    const mt_model_config *c = &m->cfg;
    if (m->g4.on) {
        build_param_table_gemma4(m);
        return;
    }
    m->par.ple_embed = m->par.ple_model_proj = m->par.ple_proj_norm = -1;
    const int64_t D = m->D, F = m->F, QD = m->QD, KVD = m->KVD, Dh = m->Dh;
    m->par.embed = add_param(m, "model.embed_tokens.weight", 2, m->V, D);
    for (int64_t l = 0; l < c->num_decoder_layers; l++) {
        layer_params *lp = &m->par.layer[l];
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
        lp->ple_gate = lp->ple_proj = lp->ple_norm = lp->scalar = -1;
    }
    m->par.final_norm = add_param(m, "model.norm.weight", 1, D, 0);
    m->par.lm_head = -1;
    if (!c->logits_via_embedding) m->par.lm_head = add_param(m, "lm_head.weight", 2, m->V, D);
}

/* Per-parameter layer index and the window geometry (layer_numel, tail_off) of the
 * parameter windows (host offload, fsdp) and the gradient windows (gradient sink). */
static void build_param_layer(mt_model *m) {
    for (int i = 0; i < m->par.count; i++) m->par.layer_of[i] = -1;
    /* each layer's parameters are consecutive entries of the table, contiguous in the
     * flat buffer, from input_layernorm to mlp.down_proj (build_param_table) */
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int i = m->par.layer[l].in_norm; i <= m->par.layer[l].down; i++) m->par.layer_of[i] = (int)l;
    m->par.layer_numel = 0; /* the largest layer's (gemma4's differ: mtm_layer_numel) */
    m->par.weight_numel = 0;
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) {
        m->par.layer_numel = max64(m->par.layer_numel, mtm_layer_numel(m, l));
        for (int i = m->par.layer[l].in_norm; i <= m->par.layer[l].down; i++)
            m->par.weight_numel = max64(m->par.weight_numel, m->par.info[i].numel);
    }
    m->par.tail_off = m->par.info[m->par.final_norm].offset;
}

/* ------------------------------------------------------------------------------ */
/* the layout                                                                      */

/* Every rule a layout must satisfy, with the messages users of the trainer see: the
 * ranks inside their groups, then the divisibility rules of parallel/mesh.h
 * mt_mesh_check_layout (tensor split, 2C context chunks, sequence-parallel rows, fsdp
 * <= numel: the trainer and the estimator check the same function), dtype, packing;
 * numel is the parameter count. */
static mt_status check_layout(const mt_model_config *cfg, int64_t batch, int64_t seq, int64_t numel,
                              const mt_model_layout *lay) {
    const int tp = mtm_axis_size(lay->tensor_size), cp = mtm_axis_size(lay->context_size);
    const int fsdp = mtm_axis_size(lay->fsdp_size);
    if (tp < 1 || lay->tensor_rank < 0 || lay->tensor_rank >= tp)
        return mt_set_error(MT_ERR_INVALID, "tensor parallelism: rank %d outside a group of %d", lay->tensor_rank, tp);
    if (cp < 1 || lay->context_rank < 0 || lay->context_rank >= cp)
        return mt_set_error(MT_ERR_INVALID, "context parallelism: rank %d outside a group of %d", lay->context_rank,
                            cp);
    if (fsdp < 1 || lay->fsdp_rank < 0 || lay->fsdp_rank >= fsdp)
        return mt_set_error(MT_ERR_INVALID, "fsdp: rank %d outside a group of %d", lay->fsdp_rank, fsdp);
    /* the divisibility rules shared with the trainer and the estimator (parallel/mesh.h) */
    const int dims[MT_MESH_AXES] = {[MT_AXIS_DATA] = 1, [MT_AXIS_FSDP] = fsdp, [MT_AXIS_CONTEXT] = cp,
                                    [MT_AXIS_TENSOR] = tp};
    const mt_layout_sizes ls = {cfg->num_query_heads, cfg->num_kv_heads, cfg->mlp_dim, cfg->vocab_size, seq, batch,
                                lay->sequence_parallel, numel};
    MT_TRY(mt_mesh_check_layout(dims, &ls));
    MT_TRY(mt_model_check_dtype_layout(lay));
    if (lay->packing_separator < 0)
        return mt_set_error(MT_ERR_INVALID, "packing_separator_id=%d: a token id is >= 0",
                            (int)lay->packing_separator);
    return MT_OK;
}

mt_status mt_model_check_memory_layout(const mt_model_config *cfg, const mt_model_layout *lay) {
    const int tp = mtm_axis_size(lay->tensor_size);
    if (lay->vocab_chunks > 1 && tp > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "num_vocab_chunks=%lld with ici_tensor_parallelism=%d: the tensor "
                            "axis computes the loss vocabulary-parallel over whole slices (use num_vocab_chunks=0 "
                            "or 1)", (long long)lay->vocab_chunks, tp);
    if (lay->grad_window_chunks < 0)
        return mt_set_error(MT_ERR_INVALID, "grad_window_chunks=%lld must be >= 0", (long long)lay->grad_window_chunks);
    if (lay->grad_window_chunks > 1 && tp > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "grad_window_chunks=%lld with ici_tensor_parallelism=%d: a tensor "
                            "rank writes a slice of each weight's rows or columns, not row blocks (use "
                            "grad_window_chunks=1)", (long long)lay->grad_window_chunks, tp);
    int64_t rows = cfg->emb_dim; /* o_proj and down_proj's rows; q_proj's and the MLP's per layer */
    for (int64_t l = 0; l < cfg->num_decoder_layers; l++)
        rows = max64(rows, max64(cfg->num_query_heads * mt_model_layer_head_dim(cfg, l), mt_model_layer_mlp_dim(cfg, l)));
    if (lay->grad_window_chunks > rows)
        return mt_set_error(MT_ERR_INVALID, "grad_window_chunks=%lld: more row blocks than the largest layer weight "
                            "has rows (%lld; a block is at least a row)", (long long)lay->grad_window_chunks,
                            (long long)rows);
    return MT_OK;
}

mt_status mt_model_check_dtype_layout(const mt_model_layout *lay) {
    /* float32 and bfloat16 run on every layout (bf16 payloads on the tensor, context and
     * fsdp collectives, the compute copy in the host pool with parameter offload) */
    if (lay->dtype != MT_F32 && lay->dtype != MT_BF16)
        return mt_set_error(MT_ERR_INVALID, "dtype=%s: the compute dtype is float32 or bfloat16",
                            mt_dtype_name(lay->dtype));
    return MT_OK;
}

/* The checked layout applied: the axes (model_shard.c), then dtype, packing, offload. */
static mt_status apply_layout(mt_model *m, const mt_model_layout *lay) {
    MT_TRY(mtm_shard_setup(m, lay));
    m->dt = lay->dtype;
    m->es = mt_dtype_size(lay->dtype);
    m->pack.on = lay->packing != 0;
    m->pack.sep = lay->packing_separator;
    m->pwin.offload = lay->param_offload != 0;
    /* param_window_unit=weight: only where there are parameter windows */
    m->pwin.weights = lay->weight_windows != 0 && params_windowed(m);
    m->sink.chunks = lay->grad_window_chunks > 1 ? lay->grad_window_chunks : 1;
    return mtm_weight_segments(m);
}

/* ------------------------------------------------------------------------------ */
/* create / free                                                                   */

/* The sizes and defaults of one process, float32, nothing planned. */
static void init_fields(mt_model *m, const mt_model_config *cfg, mt_backend *be, int64_t batch, int64_t seq,
                        int64_t num_vocab_tiling) {
    m->cfg = *cfg;
    m->be = be;
    m->B = batch;
    m->T = seq;
    m->Tg = seq;
    m->N = batch * seq;
    m->tiles = num_vocab_tiling; /* 0 = auto: mtm_vocab_resolve */
    m->vc.req_tiles = num_vocab_tiling;
    m->vc.C = 1;
    m->D = cfg->emb_dim;
    m->V = cfg->vocab_size;
    m->F = cfg->mlp_dim;
    m->H = cfg->num_query_heads;
    m->Hkv = cfg->num_kv_heads;
    m->Dh = cfg->head_dim;
    m->QD = m->H * m->Dh;
    m->KVD = m->Hkv * m->Dh;
    m->g4.on = cfg->decoder_block == MT_DECODER_GEMMA4;
    if (m->g4.on) { /* the largest over the layers: every buffer sized by them holds any layer's */
        m->g4.P = cfg->per_layer_input_dim;
        for (int64_t l = 0; l < cfg->num_decoder_layers; l++) {
            m->Dh = max64(m->Dh, mt_model_layer_head_dim(cfg, l));
            m->F = max64(m->F, mt_model_layer_mlp_dim(cfg, l));
        }
        m->QD = m->H * m->Dh;
        m->KVD = m->Hkv * m->Dh;
    }
    for (int i = 0; i < G4_COUNT; i++) m->g4.id[i] = -1;
    m->eps = cfg->normalization_layer_epsilon;
    m->dt = MT_F32;
    m->es = sizeof(float);
    m->w_off = (float)mt_model_norm_unit_offset(cfg);
    m->emb_scale = mt_model_embedding_scale(cfg);
    m->tp.size = m->cp.size = m->fsdp.size = 1;
    m->tp.Vl = m->V;
    m->tp.QDg = m->QD;
    m->tp.Fg = m->F;
    for (int i = 0; i < GB_COUNT; i++) m->plan.gid[i] = -1;
    for (int j = 0; j < MT_LT_COUNT; j++) m->remat.fwd_id[j] = m->remat.bwd_id[j] = -1;
    m->remat.policy = mt_remat_policy_keep_all();
    m->host.params_id = m->host.compute_id = -1;
    for (int w = 0; w < MT_PWIN_COUNT; w++) m->pwin.id[w] = -1;
    for (int s = 0; s < MT_PWIN_LAYER_SLOTS; s++) m->pwin.layer[s] = m->pwin.slots.held[s] = -1;
    m->pwin.slots.cur = m->pwin.pending = m->pwin.open = -1;
    for (int w = 0; w < MT_GWIN_COUNT; w++) m->sink.id[w] = -1;
    for (int i = 0; i < CP_COUNT; i++) m->cp.id[i] = -1;
    for (int i = 0; i < DEC_COUNT; i++) m->dec.id[i] = -1;
}

/* The host tables: parameter table, per-layer plan ids, RoPE frequencies, positions. */
static mt_status alloc_tables(mt_model *m) {
    const int64_t L = m->cfg.num_decoder_layers;
    const size_t maxp = (size_t)(MT_PARAMS_PER_LAYER_MAX * L + MT_PARAMS_GLOBAL_MAX);
    m->par.info = calloc(maxp, sizeof(*m->par.info));
    m->par.layer_of = calloc(maxp, sizeof(*m->par.layer_of));
    m->par.layer = calloc((size_t)L, sizeof(*m->par.layer));
    m->plan.lid = calloc((size_t)L, sizeof(*m->plan.lid));
    m->plan.lptr = calloc((size_t)L, sizeof(*m->plan.lptr));
    m->host.act_id = calloc((size_t)L, sizeof(*m->host.act_id));
    m->host.act_ptr = calloc((size_t)L, sizeof(*m->host.act_ptr));
    m->inv_freq_host = calloc((size_t)m->Dh, sizeof(float));
    /* [T], not [B*T]: planning a huge batch allocates nothing of its size */
    m->pos_host = calloc((size_t)m->T, sizeof(int32_t));
    if (!m->par.info || !m->par.layer_of || !m->par.layer || !m->plan.lid || !m->plan.lptr || !m->host.act_id ||
        !m->host.act_ptr || !m->inv_freq_host || !m->pos_host)
        return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    for (int64_t l = 0; l < L; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) m->plan.lid[l][j] = m->host.act_id[l][j] = -1;

    /* RoPE tables: global (a config with no local layers) and local (layer 0 made local). */
    mt_model_config g = m->cfg, lc = m->cfg;
    g.sliding_window_size = 0;
    lc.sliding_window_size = 1;
    lc.sliding_window_pattern = 2; /* layer 0 of a 2-period is local in every block */
    lc.num_decoder_layers = 2;     /* ... and not gemma4's always-global last layer */
    mt_rope_inv_freq(&g, 0, m->inv_freq_host);
    mt_rope_inv_freq(&lc, 0, m->inv_freq_host + m->Dh / 2);
    for (int64_t n = 0; n < m->T; n++) m->pos_host[n] = (int32_t)n;
    return MT_OK;
}

mt_status mt_model_create(mt_model **out, const mt_model_config *cfg, mt_backend *be,
                          int64_t batch, int64_t seq, int64_t num_vocab_tiling, const mt_model_layout *layout) {
    static const mt_model_layout one_process; /* zeroed: one process, float32, no packing */
    if (!out || !cfg || !be) return mt_set_error(MT_ERR_INVALID, "mt_model_create: NULL argument");
    *out = NULL;
    if (!layout) layout = &one_process;
    MT_TRY(mt_model_config_validate(cfg));
    if (batch < 1) return mt_set_error(MT_ERR_INVALID, "per_device_batch_size=%lld must be >= 1", (long long)batch);
    if (seq < 1 || seq > INT32_MAX)
        return mt_set_error(MT_ERR_INVALID, "max_target_length=%lld must be in [1, 2^31)", (long long)seq);
    if (num_vocab_tiling < 0 || num_vocab_tiling > batch * seq)
        return mt_set_error(MT_ERR_INVALID, "num_vocab_tiling=%lld must be 0 (auto) or in [1, batch x seq = %lld]",
                            (long long)num_vocab_tiling, (long long)(batch * seq));
    if (layout->vocab_chunks < 0 || layout->vocab_chunks > cfg->vocab_size)
        return mt_set_error(MT_ERR_INVALID, "num_vocab_chunks=%lld must be 0 (auto) or in [1, vocab_size = %lld]",
                            (long long)layout->vocab_chunks, (long long)cfg->vocab_size);
    MT_TRY(mt_model_check_memory_layout(cfg, layout));

    mt_model *m = calloc(1, sizeof(*m));
    if (!m) return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    init_fields(m, cfg, be, batch, seq, num_vocab_tiling);
    mt_status st = alloc_tables(m);
    if (st == MT_OK) {
        build_param_table(m);
        build_param_layer(m);
        st = check_layout(cfg, batch, seq, m->par.numel, layout);
    }
    if (st == MT_OK) st = apply_layout(m, layout);
    if (st != MT_OK) {
        mt_model_free(m);
        return st;
    }
    m->vc.req_chunks = layout->vocab_chunks;
    mtm_vocab_resolve(m); /* again when planned, once the gradient sink is known */
    *out = m;
    return MT_OK;
}

void mt_model_free(mt_model *m) {
    if (!m) return;
    if (m->plan.bound && m->plan.gptr[GB_WORKSPACE]) { /* the backend no longer uses the plan's workspace */
        mt_status st = m->be->ops->sync(m->be); /* queued GEMMs done; a failure has no one to report to */
        const mt_status st2 = m->be->ops->set_workspace(m->be, NULL, 0);
        (void)st;
        (void)st2;
    }
    free(m->par.info);
    free(m->par.layer_of);
    free(m->pwin.seg_a);
    free(m->pwin.seg_n);
    free(m->pwin.order[0]);
    free(m->pwin.order[1]);
    free(m->par.layer);
    free(m->plan.lid);
    free(m->plan.lptr);
    free(m->host.act_id);
    free(m->host.act_ptr);
    free(m->inv_freq_host);
    free(m->pos_host);
    free(m->g4.ident_host);
    free(m->tp.off);
    free(m->tp.sp_counts);
    (void)mt_comm_wait(m->fsdp.req); /* NULL unless a pass stopped mid-way */
    free(m->fsdp.counts);
    free(m->cp.tok);
    free(m->cp.lab);
    free(m->cp.kpos_host);
    free(m->pack.seg);
    free(m->pack.pos);
    free(m->pack.lseg);
    free(m->pack.lpos);
    free(m->pack.kseg);
    free(m);
}

const mt_model_config *mt_model_get_config(const mt_model *m) { return &m->cfg; }

mt_backend *mt_model_backend(const mt_model *m) { return m->be; }

int mt_model_phase_count(const mt_model *m) { return (int)(2 * m->cfg.num_decoder_layers + 4); }

void mt_model_set_compute_rounding(mt_model *m, uint64_t seed, int64_t t) {
    m->sr_seed = seed;
    m->sr_t = t;
}

mt_dtype mt_model_dtype(const mt_model *m) { return m->dt; }

mt_status mt_model_set_grad_sink(mt_model *m, mt_grad_sink_fn fn, void *ctx) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink: NULL model");
    if (m->plan.planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink: set it before planning");
    m->sink.fn = fn;
    m->sink.ctx = ctx;
    m->sink.shares = 1;
    m->sink.layer = -1;
    m->sink.open = -1;
    if (!fn) m->sink.wait = NULL;
    return MT_OK;
}

mt_status mt_model_set_grad_sink_shares(mt_model *m, int exact) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink_shares: NULL model");
    if (m->plan.planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink_shares: set it before planning");
    if (!m->sink.fn)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink_shares: no gradient sink (mt_model_set_grad_sink)");
    m->sink.shares = exact != 0;
    return MT_OK;
}

mt_status mt_model_set_grad_sink_wait(mt_model *m, mt_grad_sink_wait_fn wait) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink_wait: NULL model");
    if (m->plan.planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink_wait: set it before planning");
    if (wait && !m->sink.fn)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_grad_sink_wait: no gradient sink (mt_model_set_grad_sink)");
    m->sink.wait = wait;
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* parameters                                                                      */

int mt_model_param_count(const mt_model *m) { return m->par.count; }

const mt_param_info *mt_model_param(const mt_model *m, int i) {
    if (i < 0 || i >= m->par.count) return NULL;
    return &m->par.info[i];
}

int mt_model_param_find(const mt_model *m, const char *name) {
    for (int i = 0; i < m->par.count; i++)
        if (strcmp(m->par.info[i].name, name) == 0) return i;
    return -1;
}

int64_t mt_model_numel(const mt_model *m) { return m->par.numel; }
float *mt_model_params(mt_model *m) { return m->plan.gptr[GB_PARAMS]; }
float *mt_model_grads(mt_model *m) { return m->plan.gptr[GB_GRADS]; }
double *mt_model_step_stats(mt_model *m) { return m->plan.bound ? m->plan.gptr[GB_STEP_STATS] : NULL; }

mt_status mt_model_init_params(mt_model *m, uint64_t seed) {
    if (!m->plan.bound) return mt_set_error(MT_ERR_INVALID, "mt_model_init_params: model not bound to an arena");
    m->plan.fwd_kept = 0; /* new weights: the saved activations are stale */
    float *base = m->plan.gptr[GB_PARAMS];
    int64_t maxn = 0;
    for (int i = 0; i < m->par.count; i++) maxn = max64(maxn, m->par.info[i].numel);
    float *h = malloc((size_t)maxn * sizeof(float));
    if (!h) return mt_set_error(MT_ERR_OOM, "mt_model_init_params: cannot allocate %lld floats", (long long)maxn);
    const float norm_init = m->w_off != 0.0f ? 0.0f : 1.0f;
    for (int i = 0; i < m->par.count; i++) {
        const mt_param_info *p = &m->par.info[i];
        if (p->ndim == 2) {
            mt_rng_fill_normal(h, (size_t)p->numel, 0.02f, seed, (uint64_t)i);
        } else {
            for (int64_t j = 0; j < p->numel; j++) h[j] = norm_init;
        }
        if (m->fsdp.size > 1) { /* this rank's shard [lo, hi) only */
            const int64_t a = p->offset > m->fsdp.lo ? p->offset : m->fsdp.lo;
            const int64_t b = p->offset + p->numel < m->fsdp.hi ? p->offset + p->numel : m->fsdp.hi;
            if (b > a)
                MT_TRY(m->be->ops->copy_to_device(m->be, base + (a - m->fsdp.lo), h + (a - p->offset),
                                                  (size_t)(b - a) * sizeof(float)));
            continue;
        }
        MT_TRY(m->be->ops->copy_to_device(m->be, base + p->offset, h, (size_t)p->numel * sizeof(float)));
    }
    free(h);
    return MT_OK;
}
