/* models/model_plan.c: every buffer a model uses as an entry of the memory plan
 * (runtime/plan.h), with its size and lifetime in phases (models/model.h), the remat
 * policy that decides which per-layer tensors get an entry (models/remat.h), the host
 * pool of offloaded tensors and parameters, and binding the entries to an arena.
 *
 * Sizes, per rank, N = batch x local sequence rows, Ns = N or N / tp under sequence
 * parallelism (the residual stream's rows), es = the activation dtype's bytes:
 *   params numel x 4 (fp32 master; + "params.compute" numel x es with bf16), or the
 *   fsdp shard ceil(numel / fsdp) x 4 and the windows (two layers + embedding / tail)
 *   x es (with bf16 each gather rounds the rank's part into the window: no bf16 copy
 *   of the shard); with parameter host offload the master (or shard) and its compute
 *   copy are in the host pool;
 *   grads numel x 4, or with a gradient sink one layer + embedding + tail;
 *   per layer the saved tensors of mtm_act_elems (Ns x D residual tensors, N x local
 *   widths for q / k / v / context / mlp), each kept, recomputed into the layer-sized
 *   "remat.*" scratch, or offloaded to the host pool;
 *   the loss tile ceil(N / tiles) x V / tp x 4 (kernels/tiled_loss.h), or with
 *   vocabulary chunks ceil(N / tiles) x ceil(V / C) x 4 and the chunks' windows (one
 *   chunk of rows x D, es per parameter, 4 per gradient; mtm_vocab_resolve); gemma4's
 *   per-layer-input globals' windows (their numel, es / 4) or, with vocabulary chunks,
 *   those without the table plus one chunk of the table, ceil(V / ple_C) x L x P;
 *   context parallelism: "cp.*" gather buffers of B x seq x KVD each, or ring blocks
 *   of N x KVD. */
#include "models/model_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "kernels/tiled_loss.h"
#include "parallel/vocab_loss.h"

/* ------------------------------------------------------------------------------ */
/* per-layer saved tensors and the remat policy                                    */

/* Elements (floats) of saved tensor j of a layer; 0 when this config has none. */
int64_t mtm_act_elems(const mt_model *m, int j) {
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

static int act_is_f32(int j) {
    return j == MT_LT_INPUT_NORM_RSTD || j == MT_LT_QUERY_NORM_RSTD || j == MT_LT_KEY_NORM_RSTD ||
           j == MT_LT_CONTEXT_LSE || j == MT_LT_POST_ATTN_NORM_RSTD || j == MT_LT_PRE_MLP_NORM_RSTD ||
           j == MT_LT_POST_FFW_NORM_RSTD;
}

/* Bytes of saved tensor j of a layer: the norm statistics (rstd) and the attention
 * logsumexp are fp32, every other tensor is of the activation dtype. */
size_t mtm_act_bytes(const mt_model *m, int j) {
    return (size_t)mtm_act_elems(m, j) * (act_is_f32(j) ? sizeof(float) : m->es);
}

int64_t mtm_act_elems_layer(const mt_model *m, int64_t l, int j) {
    if (!m->g4.on) return mtm_act_elems(m, j);
    /* gemma4: the layer's own head dim and MLP width (this rank's slice); a KV-sharing
     * layer saves no K/V */
    const mt_model_config *c = &m->cfg;
    const int64_t N = m->N, Dh = mtm_layer_dh(m, l), F = mtm_layer_f(m, l);
    const int own = mt_model_layer_kv_donor(c, l) < 0;
    switch (j) {
    case MT_LT_QUERY_PROJ: return N * m->H * Dh;
    case MT_LT_KEY_PROJ: return own ? N * m->Hkv * Dh : 0;
    case MT_LT_VALUE_PROJ: return own ? N * m->Hkv * Dh : 0;
    case MT_LT_KEY_NORM_RSTD: return own ? N * m->Hkv : 0;
    case MT_LT_CONTEXT: return N * m->H * Dh;
    case MT_LT_MLPWI_0: return N * F;
    case MT_LT_MLPWI_1: return N * F;
    default: return mtm_act_elems(m, j);
    }
}

size_t mtm_act_bytes_layer(const mt_model *m, int64_t l, int j) {
    return (size_t)mtm_act_elems_layer(m, l, j) * (act_is_f32(j) ? sizeof(float) : m->es);
}


/* ---- remat / offload ---- */

mt_remat_action mtm_act_action(const mt_model *m, int j) {
    int t = mt_layer_tensor_remat((mt_layer_tensor)j);
    return t < 0 ? MT_RA_DEVICE : m->remat.policy.action[t];
}

mt_status mt_model_set_remat(mt_model *m, const mt_remat_policy *p) {
    if (!m || !p) return mt_set_error(MT_ERR_INVALID, "mt_model_set_remat: NULL argument");
    if (m->plan.planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_remat: set the policy before planning");
    for (int t = 0; t < MT_RT_COUNT; t++)
        if ((int)p->action[t] < MT_RA_REMAT || (int)p->action[t] > MT_RA_DEVICE)
            return mt_set_error(MT_ERR_INVALID, "mt_model_set_remat: bad action %d for %s", (int)p->action[t],
                                mt_remat_tensor_name((mt_remat_tensor)t));
    if (p->action[MT_RT_DECODER_LAYER_INPUT] != MT_RA_DEVICE)
        return mt_set_error(MT_ERR_INVALID, "decoder_layer_input must be device (the backward recomputes from it)");
    m->remat.policy = *p;
    m->remat.has_offload = 0;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (mtm_act_action(m, j) == MT_RA_OFFLOAD && mtm_act_elems(m, j) > 0) m->remat.has_offload = 1;
    return MT_OK;
}

int64_t mt_model_remat_tensor_bytes(const mt_model *m, mt_remat_tensor t) {
    int64_t b = 0;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (mt_layer_tensor_remat((mt_layer_tensor)j) == (int)t) b += (int64_t)mtm_act_bytes(m, j);
    return b;
}

/* One layer's worth of scratch for every tensor that is not kept: the forward
 * computes it there (then copies it out when offloaded), the backward recomputes or
 * restores it there. Its size does not depend on the depth. */
static mt_status add_remat_scratch(mt_model *m, mt_plan *plan) {
    const int64_t L = m->cfg.num_decoder_layers;
    for (int j = 0; j < MT_LT_COUNT; j++) {
        m->remat.fwd_id[j] = m->remat.bwd_id[j] = -1;
        int64_t e = mtm_act_elems(m, j);
        if (e == 0 || mtm_act_action(m, j) == MT_RA_DEVICE) continue;
        char name[MT_PLAN_NAME_MAX];
        snprintf(name, sizeof(name), "remat.fwd.%s", mt_layer_tensor_name((mt_layer_tensor)j));
        const mt_plan_tag tag = {-1, j, MT_PLAN_KIND_REMAT_SCRATCH};
        MT_TRY(mt_plan_add_tagged(plan, name, MT_MEM_SCRATCH, tag, mtm_act_bytes(m, j), ph_fwd(m, 0),
                                  ph_fwd(m, L - 1), &m->remat.fwd_id[j]));
        snprintf(name, sizeof(name), "remat.bwd.%s", mt_layer_tensor_name((mt_layer_tensor)j));
        MT_TRY(mt_plan_add_tagged(plan, name, MT_MEM_SCRATCH, tag, mtm_act_bytes(m, j), ph_bwd(m, L - 1),
                                  ph_bwd(m, 0), &m->remat.bwd_id[j]));
    }
    return MT_OK;
}

mt_status mt_model_add_to_host_plan(mt_model *m, mt_plan *host_plan) {
    if (!m || !host_plan) return mt_set_error(MT_ERR_INVALID, "mt_model_add_to_host_plan: NULL argument");
    if (!m->plan.planned)
        return mt_set_error(MT_ERR_INVALID, "mt_model_add_to_host_plan: call mt_model_add_to_plan first");
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) {
            m->host.act_id[l][j] = -1;
            int64_t e = mtm_act_elems_layer(m, l, j);
            if (e == 0 || mtm_act_action(m, j) != MT_RA_OFFLOAD) continue;
            char name[MT_PLAN_NAME_MAX];
            snprintf(name, sizeof(name), "layers.%lld.%s", (long long)l, mt_layer_tensor_name((mt_layer_tensor)j));
            const mt_plan_tag tag = {l, j, MT_PLAN_KIND_OFFLOAD};
            MT_TRY(mt_plan_add_tagged(host_plan, name, MT_MEM_ACTIVATIONS, tag, mtm_act_bytes_layer(m, l, j),
                                      ph_fwd(m, l), ph_bwd(m, l), &m->host.act_id[l][j]));
        }
    m->host.params_id = m->host.compute_id = -1;
    const int64_t pn = m->fsdp.size > 1 ? m->fsdp.hi - m->fsdp.lo : m->par.numel;
    if (m->pwin.offload) /* under fsdp this rank's shard only */
        MT_TRY(mt_plan_add(host_plan, m->fsdp.size > 1 ? "params.shard" : "params", MT_MEM_PARAMS,
                           (size_t)pn * sizeof(float), 0, ph_optim(m), &m->host.params_id));
    if (m->pwin.offload && m->dt != MT_F32) /* its compute copy, which the windows are filled from */
        MT_TRY(mt_plan_add(host_plan, m->fsdp.size > 1 ? "params.compute.shard" : "params.compute", MT_MEM_PARAMS,
                           (size_t)pn * m->es, 0, ph_optim(m), &m->host.compute_id));
    m->host.planned = 1;
    m->host.bound = 0;
    return MT_OK;
}

mt_status mtm_plan_add(mt_model *m, mt_plan *plan, int g, const char *name, mt_mem_category cat, size_t bytes,
                       int first, int last) {
    return mt_plan_add(plan, name, cat, bytes, first, last, &m->plan.gid[g]);
}

/* A step input or constant table (tokens, positions, RoPE frequencies, ...). */
static mt_status plan_add_input(mt_model *m, mt_plan *plan, int g, const char *name, size_t bytes, int first,
                                int last) {
    const mt_plan_tag tag = {-1, -1, MT_PLAN_KIND_INPUT};
    return mt_plan_add_tagged(plan, name, MT_MEM_ACTIVATIONS, tag, bytes, first, last, &m->plan.gid[g]);
}

static mt_status cp_add_to_plan(mt_model *m, mt_plan *plan, int first, int last) {
    if (m->cp.size == 1) return MT_OK;
    const size_t f4 = sizeof(float);
    MT_TRY(mt_plan_add(plan, "cp.k_positions", MT_MEM_COMM, (size_t)m->Tg * sizeof(int32_t), first, last,
                       &m->cp.id[CP_KPOS]));
    if (m->pack.on)
        MT_TRY(mt_plan_add(plan, "cp.k_segment_ids", MT_MEM_COMM, (size_t)(m->B * m->Tg) * sizeof(int32_t), first,
                           last, &m->cp.id[CP_KSEG]));
    if (!m->cp.ring) {
        const size_t full = (size_t)(m->B * m->Tg * m->KVD) * m->es;
        static const char *const names[5] = {"cp.gather_stage", "cp.k_full", "cp.v_full", "cp.dk_full",
                                             "cp.dv_full"};
        for (int i = 0; i < 5; i++) MT_TRY(mt_plan_add(plan, names[i], MT_MEM_COMM, full, first, last, &m->cp.id[i]));
        return MT_OK;
    }
    static const char *const rn[8] = {"cp.ring.k0", "cp.ring.v0", "cp.ring.k1", "cp.ring.v1",
                                      "cp.ring.dk0", "cp.ring.dv0", "cp.ring.dk1", "cp.ring.dv1"};
    for (int i = 0; i < 8; i++)
        MT_TRY(mt_plan_add(plan, rn[i], MT_MEM_COMM, (size_t)(m->N * m->KVD) * m->es, first, last,
                           &m->cp.id[CP_RK0 + i]));
    MT_TRY(mt_plan_add(plan, "cp.ring.block_out", MT_MEM_COMM, (size_t)(m->N * m->QD) * m->es, first, last,
                       &m->cp.id[CP_ROUT]));
    return mt_plan_add(plan, "cp.ring.block_lse", MT_MEM_COMM, (size_t)(m->B * m->H * m->T) * f4, first, last,
                       &m->cp.id[CP_RLSE]);
}

/* ------------------------------------------------------------------------------ */
/* vocabulary chunks and row tiles of the loss                                      */

void mtm_vocab_resolve(mt_model *m) {
    const int64_t V = m->V, D = m->D, N = m->N, layer = m->par.layer_numel > 0 ? m->par.layer_numel : 1;
    /* the unit of the auto chunks: the layer gradient window (the layers hand their
     * gradients over one parameter at a time: the largest decoder-layer weight, or with
     * grad_window_chunks its largest row block), so that no vocabulary window or gradient
     * window is larger than the layers' */
    const int64_t weight = mtm_grad_window_numel(m);
    int64_t C = m->vc.req_chunks;
    if (C == 0) /* auto: chunks no larger than a layer weight where windows hold the vocabulary */
        C = !m->dec.on && m->tp.size == 1 && (params_windowed(m) || m->sink.fn) ? (V * D + weight - 1) / weight : 1;
    m->vc.C = C < 1 ? 1 : C > V ? V : C;
    /* gemma4's per-layer embedding table [V, L P] in chunks of its own whenever the
     * vocabulary comes in chunks: the table is L P / D times as wide as the embedding
     * (gemma4-e2b: 35 x 256 / 1536 = 5.8), so one vocabulary chunk of it would be 5.8
     * times the embedding's chunk (and 1.6 GB of fp32 gradient window whole at E2B);
     * instead the fewest chunks no larger than the largest layer weight, ceil(V L P /
     * weight), and never fewer than the vocabulary's C, so that a given num_vocab_chunks
     * cuts it at least as finely. */
    m->vc.ple_C = 1;
    if (m->vc.C > 1 && m->g4.on && m->g4.P > 0) {
        const int64_t wide = V * m->cfg.num_decoder_layers * m->g4.P;
        const int64_t Cp = max64(m->vc.C, (wide + weight - 1) / weight);
        m->vc.ple_C = Cp > V ? V : Cp;
    }
    int64_t T = m->vc.req_tiles;
    if (T == 0) { /* auto: a loss tile no larger than a layer's parameters in the activation dtype, or with
                   * the vocabulary in chunks than the largest layer weight */
        const int64_t cols = m->vc.C > 1 ? mtm_vocab_chunk_rows(m) : m->tp.Vl;
        const int64_t row = cols * (int64_t)(sizeof(float) + (m->dt != MT_F32 ? m->es : 0));
        const int64_t R = max64(1, (m->vc.C > 1 ? weight : layer) * (int64_t)m->es / row);
        m->tiles = (N + R - 1) / R;
        /* the tile buffer holds R rows (or N), a bound on every tile's ceil(N / T) rows that
         * grows with N, so the plan's peak never falls as the batch grows (the estimator's
         * batch search relies on it) */
        m->vc.tile_rows = R < N ? R : N;
        return;
    }
    m->tiles = T < 1 ? 1 : T > N ? N : T;
    m->vc.tile_rows = mt_tiled_loss_tile_rows(N, m->tiles);
}

void mt_model_vocab_tiling(const mt_model *m, int64_t *tiles, int64_t *chunks) {
    if (tiles) *tiles = m ? m->tiles : 0;
    if (chunks) *chunks = m ? m->vc.C : 0;
}

int64_t mt_model_grad_twice(const mt_model *m, int64_t *offset) {
    *offset = 0;
    if (!m || !m->plan.planned || !mtm_vocab_grad_windows(m) || !m->cfg.logits_via_embedding) return 0;
    *offset = m->par.info[m->par.embed].offset;
    return m->par.info[m->par.embed].numel;
}

int64_t mt_model_per_layer_input_chunks(const mt_model *m) {
    return m && m->g4.on && m->g4.P > 0 ? m->vc.ple_C : 0;
}

/* Parameters (or their windows, and the compute copy) and gradients (or their windows). */
static mt_status add_weights(mt_model *m, mt_plan *plan) {
    const int64_t L = m->cfg.num_decoder_layers;
    const size_t f4 = sizeof(float), es = m->es;
    const int last = ph_optim(m), loss = ph_loss(m);
    const int bwd0 = ph_bwd(m, L - 1), bwd1 = ph_bwd(m, 0);
    if (m->dt != MT_F32) {
        /* with parameter host offload the compute copy lives in the host pool next to the
         * master (mt_model_add_to_host_plan) and is rounded there by the backend's
         * from_f32: a backend whose ops run on host memory */
        if (m->pwin.offload && !m->be->caps.host_offload)
            return mt_set_error(MT_ERR_UNSUPPORTED, "dtype=%s with parameter_memory_host_offload is not supported on "
                                "the %s backend (the compute copy is rounded in the host pool; use backend=cpu or "
                                "dtype=float32)", mt_dtype_name(m->dt), m->be->name);
        /* the compute copy: of the whole flat buffer, or under fsdp of this rank's shard
         * (the windows are gathered from it) */
        if (m->pwin.offload || mtm_fsdp_rounds_in_window(m)) /* fsdp: each gather rounds its part */
            m->plan.gid[GB_COMPUTE_W] = -1;
        else
            MT_TRY(mtm_plan_add(m, plan, GB_COMPUTE_W, "params.compute", MT_MEM_PARAMS, (size_t)m->par.numel * es, 0,
                                last));
    }
    if (!params_windowed(m)) {
        MT_TRY(mtm_plan_add(m, plan, GB_PARAMS, "params", MT_MEM_PARAMS, (size_t)m->par.numel * f4, 0, last));
    } else { /* the parameters live in the host pool (or, fsdp, as shards); the device holds windows of the
              * compute dtype */
        m->plan.gid[GB_PARAMS] = -1;
        if (m->fsdp.size > 1 && !m->pwin.offload) /* with offload the shard is in the host pool */
            MT_TRY(mtm_plan_add(m, plan, GB_PARAMS, "params.shard", MT_MEM_PARAMS,
                                (size_t)(m->fsdp.hi - m->fsdp.lo) * f4, 0, last));
        if (m->pwin.weights) { /* param_window_unit=weight: a segment of a layer each (model_windows.c) */
            MT_TRY(mt_plan_add(plan, "params.window.weight0", MT_MEM_PARAMS, (size_t)m->pwin.seg_max * es, 0, last,
                               &m->pwin.id[MT_PWIN_LAYER0]));
            MT_TRY(mt_plan_add(plan, "params.window.weight1", MT_MEM_PARAMS, (size_t)m->pwin.seg_max * es, 0, last,
                               &m->pwin.id[MT_PWIN_LAYER1]));
        } else {
            MT_TRY(mt_plan_add(plan, "params.window.layer0", MT_MEM_PARAMS, (size_t)m->par.layer_numel * es, 0,
                               last, &m->pwin.id[MT_PWIN_LAYER0]));
            MT_TRY(mt_plan_add(plan, "params.window.layer1", MT_MEM_PARAMS, (size_t)m->par.layer_numel * es, 0,
                               last, &m->pwin.id[MT_PWIN_LAYER1]));
        }
        MT_TRY(mt_plan_add(plan, "params.window.global", MT_MEM_PARAMS, (size_t)mtm_global_window_numel(m) * es, 0,
                           last, &m->pwin.id[MT_PWIN_GLOBAL]));
        if (mtm_vocab_windows(m)) { /* a chunk of embedding rows for the lookup, one of the unembedding for the loss */
            const size_t chunk = (size_t)(mtm_vocab_chunk_rows(m) * m->D) * es;
            MT_TRY(mt_plan_add(plan, "params.window.vocab.embedding", MT_MEM_PARAMS, chunk, 0, 0,
                               &m->pwin.id[MT_PWIN_VOCAB_EMBED]));
            MT_TRY(mt_plan_add(plan, "params.window.vocab.unembedding", MT_MEM_PARAMS, chunk, loss, loss,
                               &m->pwin.id[MT_PWIN_VOCAB_HEAD]));
        }
    }
    if (!m->sink.fn) {
        MT_TRY(mtm_plan_add(m, plan, GB_GRADS, "grads", MT_MEM_GRADS, (size_t)m->par.numel * f4, 0, last));
    } else { /* gradient sink: windows live while their gradients are written (mt_model_set_grad_sink) */
        m->plan.gid[GB_GRADS] = -1;
        const size_t gwin = (size_t)mtm_grad_window_numel(m) * f4;
        MT_TRY(mt_plan_add(plan, "grads.window.layer", MT_MEM_GRADS, gwin, bwd0, bwd1,
                           &m->sink.id[MT_GWIN_LAYER]));
        m->sink.id[MT_GWIN_LAYER1] = -1;
        if (m->sink.wait) /* asynchronous sink: the second, alternating window (mt_model_set_grad_sink_wait) */
            MT_TRY(mt_plan_add(plan, "grads.window.layer.overlap", MT_MEM_GRADS, gwin, bwd0,
                               bwd1, &m->sink.id[MT_GWIN_LAYER1]));
        if (mtm_vocab_grad_windows(m)) { /* the embedding's and lm_head's gradients a chunk at a time */
            const size_t chunk = (size_t)(mtm_vocab_chunk_rows(m) * m->D) * f4;
            MT_TRY(mt_plan_add(plan, "grads.window.vocab.embedding", MT_MEM_GRADS, chunk, ph_embed_bwd(m),
                               ph_embed_bwd(m), &m->sink.id[MT_GWIN_VOCAB_EMBED]));
            MT_TRY(mt_plan_add(plan, "grads.window.vocab.lm_head", MT_MEM_GRADS, chunk, loss, loss,
                               &m->sink.id[MT_GWIN_VOCAB_HEAD]));
        } else {
            MT_TRY(mt_plan_add(plan, "grads.window.embedding", MT_MEM_GRADS,
                               (size_t)m->par.info[m->par.embed].numel * f4,
                               m->cfg.logits_via_embedding ? loss : ph_embed_bwd(m), ph_embed_bwd(m),
                               &m->sink.id[MT_GWIN_EMBEDDING]));
        }
        MT_TRY(mt_plan_add(plan, "grads.window.tail", MT_MEM_GRADS, (size_t)mtm_tail_grad_numel(m) * f4, loss, loss,
                           &m->sink.id[MT_GWIN_TAIL]));
    }
    return MT_OK;
}

/* Step inputs and constant tables. */
static mt_status add_inputs(mt_model *m, mt_plan *plan) {
    const int64_t N = m->N;
    const size_t f4 = sizeof(float), i4 = sizeof(int32_t);
    const int last = ph_optim(m), loss = ph_loss(m), bwd1 = ph_bwd(m, 0);
    /* Step inputs: uploaded in phase 0 (labels in the loss phase), kept while used. */
    MT_TRY(plan_add_input(m, plan, GB_TOKENS, "tokens", (size_t)N * i4, 0, ph_embed_bwd(m)));
    MT_TRY(plan_add_input(m, plan, GB_LABELS, "labels", (size_t)N * i4, loss, loss));
    MT_TRY(plan_add_input(m, plan, GB_STEP_STATS, "step_stats", MT_MODEL_STATS * sizeof(double), 0, last));
    MT_TRY(plan_add_input(m, plan, GB_POSITIONS, "positions", (size_t)N * i4, 0, bwd1));
    MT_TRY(plan_add_input(m, plan, GB_INV_FREQ, "rope_inv_freq", (size_t)m->Dh * f4, 0, bwd1));
    if (m->pack.on) { /* document masking: written with the positions, read by every layer */
        MT_TRY(plan_add_input(m, plan, GB_SEGMENTS, "segment_ids", (size_t)N * i4, 0, bwd1));
        MT_TRY(plan_add_input(m, plan, GB_DOC_POS, "document_positions", (size_t)N * i4, 0, bwd1));
    }
    return MT_OK;
}

/* Saved activations of layer l: written in phase l (decoder_layer_input: by the
 * embedding or the previous layer) or 1 + l, read last by the layer's backward.
 * gemma4: sizes per layer (mtm_act_elems_layer: no K/V on KV-sharing layers); a
 * donor's key / value_proj are kept whatever the policy, until its own backward when
 * the policy keeps them, else until the backward of the first sharing layer (the
 * last of the sharing layers' backwards), after which the donor's backward recomputes
 * or restores them into the remat scratch (model_gemma4.c). */
static mt_status add_saved(mt_model *m, mt_plan *plan) {
    const int64_t L = m->cfg.num_decoder_layers;
    for (int64_t l = 0; l < L; l++) {
        for (int j = 0; j < MT_LT_COUNT; j++) {
            m->plan.lid[l][j] = -1;
            int64_t e = mtm_act_elems_layer(m, l, j);
            if (e == 0) continue;
            char name[MT_PLAN_NAME_MAX];
            snprintf(name, sizeof(name), "layers.%lld.%s", (long long)l, mt_layer_tensor_name((mt_layer_tensor)j));
            int first = j == MT_LT_DECODER_LAYER_INPUT ? (int)l : ph_fwd(m, l), last = ph_bwd(m, l);
            m->plan.lid[l][j] = -1;
            /* gemma4: a donor's K/V are read by the sharing layers' forward and backward,
             * between its own: kept whatever the policy */
            const int donor_kv = m->g4.on && (j == MT_LT_KEY_PROJ || j == MT_LT_VALUE_PROJ) && mtm_g4_is_donor(m, l);
            if (mtm_act_action(m, j) != MT_RA_DEVICE && !donor_kv) continue; /* recomputed or offloaded */
            if (donor_kv && mtm_act_action(m, j) != MT_RA_DEVICE)
                last = ph_bwd(m, m->cfg.num_decoder_layers - m->cfg.num_kv_shared_layers);
            /* gemma4: the embedding output also feeds the per-layer inputs' backward */
            if (m->g4.on && m->g4.P > 0 && l == 0 && j == MT_LT_DECODER_LAYER_INPUT) last = ph_embed_bwd(m);
            const mt_plan_tag tag = {l, j, MT_PLAN_KIND_SAVED};
            MT_TRY(mt_plan_add_tagged(plan, name, MT_MEM_ACTIVATIONS, tag, mtm_act_bytes_layer(m, l, j), first, last,
                                      &m->plan.lid[l][j]));
        }
    }
    return MT_OK;
}

/* The final norm, the loss tile and the residual stream's gradient (phase L + 1 on). */
static mt_status add_loss_buffers(mt_model *m, mt_plan *plan) {
    const int64_t L = m->cfg.num_decoder_layers, N = m->N, D = m->D;
    const size_t f4 = sizeof(float), es = m->es;
    const int fwd1 = ph_fwd(m, L - 1), loss = ph_loss(m);
    const int64_t Ns = seq_rows(m); /* residual-stream rows (sequence parallelism: N / tp) */
    MT_TRY(mtm_plan_add(m, plan, GB_FINAL_INPUT, "final_norm_input", MT_MEM_ACTIVATIONS, (size_t)(Ns * D) * es,
                    fwd1, loss));
    MT_TRY(mtm_plan_add(m, plan, GB_FINAL_RSTD, "final_norm_rstd", MT_MEM_ACTIVATIONS, (size_t)Ns * f4, loss, loss));
    MT_TRY(mtm_plan_add(m, plan, GB_FINAL_HIDDEN, "final_hidden", MT_MEM_ACTIVATIONS, (size_t)(N * D) * es, loss,
                    loss));
    MT_TRY(mtm_plan_add(m, plan, GB_FINAL_HIDDEN_GRAD, "final_hidden_grad", MT_MEM_SCRATCH, (size_t)(N * D) * es,
                    loss, loss));
    /* a tile of rows x the tensor rank's vocabulary slice, or x one vocabulary chunk */
    const int64_t tile = m->vc.tile_rows * (m->vc.C > 1 ? mtm_vocab_chunk_rows(m) : m->tp.Vl);
    MT_TRY(mtm_plan_add(m, plan, GB_LOSS_TILE, "loss_tile", MT_MEM_LOSS_TILE, (size_t)tile * f4, loss, loss));
    if (m->dt != MT_F32) /* the dlogits operand of the loss tile's backward GEMMs (kernels/tiled_loss.h) */
        MT_TRY(mtm_plan_add(m, plan, GB_LOSS_DTILE, "loss_tile.dlogits", MT_MEM_LOSS_TILE, (size_t)tile * es, loss,
                            loss));
    if (m->tp.size > 1) /* the vocab-parallel loss's row max and sums, all-reduced over the tensor group */
        MT_TRY(mtm_plan_add(m, plan, GB_LOSS_VOCAB_STATS, "loss_tile.vocab_stats", MT_MEM_LOSS_TILE,
                        mt_vocab_loss_scratch_bytes(m->vc.tile_rows, 1), loss, loss)); /* tile_rows >= any tile */
    if (m->vc.C > 1) { /* the chunked loss's row max and sums of all N rows (parallel/vocab_loss.h) */
        MT_TRY(mtm_plan_add(m, plan, GB_LOSS_VOCAB_STATS, "loss_tile.vocab_stats", MT_MEM_LOSS_TILE,
                            mt_vocab_chunked_scratch_bytes(N), loss, loss));
        if (m->dt != MT_F32) /* dloss/dh summed over the chunks in fp32, rounded once */
            MT_TRY(mtm_plan_add(m, plan, GB_LOSS_DH_ACC, "loss_tile.dh_acc", MT_MEM_LOSS_TILE,
                                (size_t)(N * D) * f4, loss, loss));
    }
    MT_TRY(mtm_plan_add(m, plan, GB_RESID_GRAD, "residual_grad", MT_MEM_SCRATCH, (size_t)(Ns * D) * es, loss,
                    ph_embed_bwd(m)));
    return MT_OK;
}

/* Bytes of the plan's "workspace": the backend's GEMM workspace (caps.workspace_bytes)
 * or the scratch its ops take for this model's calls (ops.h scratch_bytes), the larger:
 * they share one buffer. The largest attention call: this rank's query rows against the
 * context group's keys, with positions under context parallelism or packing. */
static size_t workspace_bytes(const mt_model *m) {
    static const int32_t present = 0; /* "positions / segment ids are passed" (mt_scratch_query) */
    mt_scratch_query q = {.rows = m->N, .width = m->D, .heads = m->H, .kv_heads = m->Hkv, .head_dim = m->Dh,
                          .attn = mtm_attn_args(m, 0), .loss_rows = m->vc.tile_rows};
    q.attn.Tk = m->T * m->cp.size;
    q.attn.Dh = m->Dh; /* the largest (gemma4: global layers) */
    if (m->cp.size > 1 || m->pack.on) q.attn.q_pos = q.attn.k_pos = &present;
    if (m->pack.on) q.attn.q_seg = q.attn.k_seg = &present;
    const size_t ops = m->be->ops->scratch_bytes(m->be, &q);
    return ops > m->be->caps.workspace_bytes ? ops : m->be->caps.workspace_bytes;
}

/* Per-op temporaries shared by the layers' forward phases, then by their backward
 * phases, and the workspace (GEMM and op scratch). */
static mt_status add_scratch(mt_model *m, mt_plan *plan) {
    const int64_t L = m->cfg.num_decoder_layers, N = m->N, D = m->D, F = m->F;
    const int64_t QD = m->QD, KVD = m->KVD, Ns = seq_rows(m);
    const size_t es = m->es;
    const int last = ph_optim(m);
    const int fwd0 = ph_fwd(m, 0), fwd1 = ph_fwd(m, L - 1);
    const int bwd0 = ph_bwd(m, L - 1), bwd1 = ph_bwd(m, 0);
    /* Forward scratch, shared by the layers' forward phases. */
    MT_TRY(mtm_plan_add(m, plan, GB_FWD_NORM, "fwd.normed", MT_MEM_SCRATCH, (size_t)(N * D) * es, fwd0, fwd1));
    MT_TRY(mtm_plan_add(m, plan, GB_FWD_RESID, "fwd.residual", MT_MEM_SCRATCH, (size_t)(Ns * D) * es, fwd0, fwd1));
    MT_TRY(mtm_plan_add(m, plan, GB_FWD_TMP, "fwd.tmp", MT_MEM_SCRATCH, (size_t)(N * max64(D, QD)) * es, fwd0,
                    fwd1));
    MT_TRY(mtm_plan_add(m, plan, GB_FWD_GLU, "fwd.glu", MT_MEM_SCRATCH, (size_t)(N * F) * es, fwd0, fwd1));
    /* Backward scratch, shared by the layers' backward phases. */
    MT_TRY(mtm_plan_add(m, plan, GB_BWD_NORM, "bwd.normed", MT_MEM_SCRATCH, (size_t)(N * D) * es, bwd0, bwd1));
    MT_TRY(mtm_plan_add(m, plan, GB_BWD_RESID, "bwd.residual", MT_MEM_SCRATCH, (size_t)(Ns * D) * es, bwd0, bwd1));
    /* d1 [N, D]: a post-attention / post-MLP norm's input gradient, sequence
     * parallelism's gathered rows and reduce-scatter output (mtm_sp_gather,
     * mtm_tp_sum_input_grad), gemma4's layer-scalar and per-layer-input gradients.
     * Without these the backward never touches it (plain tensor parallelism sums in
     * place): no entry, and the pointer is NULL. */
    if (m->g4.on || m->cfg.use_post_attn_norm || m->cfg.use_post_ffw_norm || m->tp.sp)
        MT_TRY(mtm_plan_add(m, plan, GB_BWD_D1, "bwd.d_model_a", MT_MEM_SCRATCH, (size_t)(N * D) * es, bwd0,
                            bwd1));
    MT_TRY(mtm_plan_add(m, plan, GB_BWD_D2, "bwd.d_model_b", MT_MEM_SCRATCH, (size_t)(N * D) * es, bwd0, bwd1));
    /* One work buffer for a layer backward's temporaries, which come in two sets that
     * are never live together: the MLP's [N, F] act(g) u, overwritten by its gradient
     * (dg and du go in place of g and u), and after it the attention's, live at once:
     * dcontext, dq, dk, dv as attention_bwd reads and writes them, and with qk_norm at
     * q_norm's backward q, dq before and after the norm, dk and dv (3 QD + 2 KVD; the
     * layout is model_layers.c mtm_bwd_attn_parts). */
    const size_t mlp = (size_t)(N * F) * es, attn = mtm_bwd_attn_parts(m, QD, KVD, NULL);
    MT_TRY(mtm_plan_add(m, plan, GB_BWD_WORK, "bwd.work", MT_MEM_SCRATCH, mlp > attn ? mlp : attn, bwd0, bwd1));
    m->plan.ws_bytes = workspace_bytes(m);
    if (m->plan.ws_bytes > 0) /* cuBLASLt's and the ops' scratch, the whole step */
        MT_TRY(mtm_plan_add(m, plan, GB_WORKSPACE, "workspace", MT_MEM_WORKSPACE, m->plan.ws_bytes, 0, last));
    return MT_OK;
}

/* gemma4's buffers (model_internal.h G4_*): the per-layer inputs and their gradient
 * (embedding to its backward), the per-layer temporaries, the v_norm constants and the
 * identity (the whole step: one layer's worth, not per layer), and the shared-KV
 * gradient accumulators (the layers' backwards, only with KV sharing). */
static mt_status add_gemma4(mt_model *m, mt_plan *plan) {
    if (!m->g4.on) return MT_OK;
    const int64_t N = m->N, D = m->D, P = m->g4.P, L = m->cfg.num_decoder_layers;
    const size_t es = m->es, f4 = sizeof(float);
    const int last = ph_optim(m), eb = ph_embed_bwd(m);
    /* the per-layer inputs and their statistics from the embedding (phase 0) to the
     * embedding's backward, their gradient likewise (a temporary in phase 0, then
     * accumulated by the layers' backwards), the projection's gradient in the
     * embedding's backward only; the other buffers for the whole step */
    struct { int id; const char *name; size_t bytes; int first, last; } b[] = {
        {G4_PLE_ALL, "gemma4.per_layer_inputs", (size_t)(N * L * P) * es, 0, eb},
        {G4_PLE_DALL, "gemma4.per_layer_inputs_grad", (size_t)(N * L * P) * es, 0, eb},
        {G4_PLE_TMP, "gemma4.per_layer_projection_grad", (size_t)(N * L * P) * es, eb, eb},
        {G4_PLE_ROWRSTD, "gemma4.per_layer_projection_rstd", (size_t)(N * L) * f4 * (P > 0), 0, eb},
        {G4_PLE_A, "gemma4.ple_gate", (size_t)(N * P) * es, 0, last},
        {G4_PLE_B, "gemma4.ple_input", (size_t)(N * P) * es, 0, last},
        {G4_PLE_C, "gemma4.ple_product", (size_t)(N * P) * es, 0, last},
        {G4_YMID, "gemma4.layer_output_before_ple", (size_t)(N * D) * es * (P > 0), 0, last},
        {G4_O, "gemma4.ple_projection", (size_t)(N * D) * es * (P > 0), 0, last},
        {G4_RSTD, "gemma4.ple_norm_rstd", (size_t)N * f4 * (P > 0), 0, last},
        {G4_IDENT, "gemma4.identity", (size_t)(P * P) * es, 0, last},
        {G4_VRSTD, "gemma4.v_norm_rstd", (size_t)(N * m->Hkv) * f4, 0, last},
        {G4_VZERO, "gemma4.v_norm_zero_weight", (size_t)m->Dh * es, 0, last},
        {G4_VDW, "gemma4.v_norm_weight_grad", (size_t)m->Dh * f4, 0, last},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i].bytes > 0)
            MT_TRY(mt_plan_add(plan, b[i].name, MT_MEM_SCRATCH, b[i].bytes, b[i].first, b[i].last,
                               &m->g4.id[b[i].id]));
    int64_t pa, pn, gn, wn;
    mtm_g4_ple_range(m, &pa, &pn);
    mtm_g4_ple_window(m, 1, &pa, &gn);
    mtm_g4_ple_window(m, 0, &pa, &wn);
    /* one chunk of the per-layer embedding table's rows, [ceil(V / ple_C), L P] */
    const int64_t chunk = mtm_g4_ple_chunk_rows(m) * L * P;
    if (m->sink.fn && pn > 0) /* the per-layer-input globals' gradient window: the embedding's backward */
        MT_TRY(mt_plan_add(plan, "grads.window.per_layer_inputs", MT_MEM_GRADS, (size_t)gn * f4, eb, eb,
                           &m->g4.id[G4_GWIN_PLE]));
    if (mtm_g4_ple_grad_windows(m) && pn > 0) /* the table's gradient a chunk at a time, the same phase */
        MT_TRY(mt_plan_add(plan, "grads.window.vocab.per_layer_embedding", MT_MEM_GRADS, (size_t)chunk * f4, eb, eb,
                           &m->g4.id[G4_GWIN_PLE_VOCAB]));
    if (params_windowed(m) && pn > 0) /* their parameter window: filled in phase 0, read until their backward */
        MT_TRY(mt_plan_add(plan, "params.window.per_layer_inputs", MT_MEM_PARAMS, (size_t)wn * es, 0, eb,
                           &m->g4.id[G4_PWIN_PLE]));
    if (mtm_g4_ple_windows(m) && pn > 0) /* the table's rows a chunk at a time: the lookup, phase 0 */
        MT_TRY(mt_plan_add(plan, "params.window.vocab.per_layer_embedding", MT_MEM_PARAMS, (size_t)chunk * es, 0, 0,
                           &m->g4.id[G4_PWIN_PLE_VOCAB]));
    if (m->cfg.num_kv_shared_layers > 0) {
        static const char *const nm[4] = {"gemma4.shared_dk.local", "gemma4.shared_dv.local", "gemma4.shared_dk.global",
                                          "gemma4.shared_dv.global"};
        for (int i = 0; i < 4; i++)
            MT_TRY(mt_plan_add(plan, nm[i], MT_MEM_SCRATCH, (size_t)(N * m->KVD) * es, ph_bwd(m, L - 1), ph_bwd(m, 0),
                               &m->g4.id[G4_SKV_DK0 + i]));
    }
    return MT_OK;
}

mt_status mt_model_add_to_plan(mt_model *m, mt_plan *plan) {
    if (!m || !plan) return mt_set_error(MT_ERR_INVALID, "mt_model_add_to_plan: NULL argument");
    mtm_vocab_resolve(m); /* the gradient sink (and decoding) is known now */
    if (m->dec.on) return mtm_decode_add_to_plan(m, plan);
    MT_TRY(add_weights(m, plan));
    MT_TRY(add_inputs(m, plan));
    MT_TRY(add_saved(m, plan));
    MT_TRY(mtm_weight_orders(m)); /* what the backward recomputes is known now (gemma4: plan.lid too) */
    MT_TRY(add_loss_buffers(m, plan));
    MT_TRY(add_scratch(m, plan));
    MT_TRY(add_remat_scratch(m, plan));
    MT_TRY(add_gemma4(m, plan));
    MT_TRY(cp_add_to_plan(m, plan, ph_fwd(m, 0), ph_bwd(m, 0)));
    m->plan.planned = 1;
    m->host.planned = 0;
    m->host.bound = 0;
    m->plan.bound = 0;
    return MT_OK;
}

/* ------------------------------------------------------------------------------ */
/* binding                                                                         */

static mt_status bind_one(const mt_arena *arena, const mt_plan *plan, int id, void **ptr) {
    *ptr = NULL;
    if (id < 0) return MT_OK;
    *ptr = mt_arena_ptr(arena, plan, id);
    if (!*ptr) return mt_set_error(MT_ERR_INVALID, "mt_model_bind: plan entry %d missing from the arena", id);
    return MT_OK;
}

mt_status mt_model_bind(mt_model *m, const mt_arena *arena, const mt_plan *plan) {
    if (!m || !arena || !plan) return mt_set_error(MT_ERR_INVALID, "mt_model_bind: NULL argument");
    if (!m->plan.planned) return mt_set_error(MT_ERR_INVALID, "mt_model_bind: call mt_model_add_to_plan first");
    if (m->plan.gid[GB_GRADS] >= mt_plan_count(plan))
        return mt_set_error(MT_ERR_INVALID, "mt_model_bind: not the plan this model was added to");
    if (m->cp.size > 1 && !m->cp.tok) { /* host [N] row selections of context parallelism */
        m->cp.tok = malloc(sizeof(int32_t) * (size_t)m->N);
        m->cp.lab = malloc(sizeof(int32_t) * (size_t)m->N);
        if (!m->cp.tok || !m->cp.lab) return mt_set_error(MT_ERR_OOM, "mt_model_bind: out of memory");
    }
    if (m->pack.on && !m->pack.seg) { /* host ids and positions of the whole window */
        const size_t full = sizeof(int32_t) * (size_t)(m->B * m->Tg);
        m->pack.seg = malloc(full);
        m->pack.pos = malloc(full);
        if (m->cp.size > 1) {
            m->pack.lseg = malloc(sizeof(int32_t) * (size_t)m->N);
            m->pack.lpos = malloc(sizeof(int32_t) * (size_t)m->N);
            m->pack.kseg = malloc(full);
        }
        if (!m->pack.seg || !m->pack.pos || (m->cp.size > 1 && (!m->pack.lseg || !m->pack.lpos || !m->pack.kseg)))
            return mt_set_error(MT_ERR_OOM, "mt_model_bind: out of memory");
    }
    m->plan.fwd_kept = 0;
    for (int g = 0; g < GB_COUNT; g++) MT_TRY(bind_one(arena, plan, m->plan.gid[g], &m->plan.gptr[g]));
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) {
            void *p;
            MT_TRY(bind_one(arena, plan, m->plan.lid[l][j], &p));
            m->plan.lptr[l][j] = p;
        }
    for (int w = 0; params_windowed(m) && w < MT_PWIN_COUNT; w++) {
        void *p;
        MT_TRY(bind_one(arena, plan, m->pwin.id[w], &p));
        m->pwin.ptr[w] = p;
    }
    for (int w = 0; w < MT_GWIN_COUNT; w++) {
        void *p;
        MT_TRY(bind_one(arena, plan, m->sink.fn ? m->sink.id[w] : -1, &p));
        m->sink.ptr[w] = p;
    }
    for (int j = 0; j < MT_LT_COUNT; j++) {
        void *p;
        MT_TRY(bind_one(arena, plan, m->remat.fwd_id[j], &p));
        m->remat.fwd[j] = p;
        MT_TRY(bind_one(arena, plan, m->remat.bwd_id[j], &p));
        m->remat.bwd[j] = p;
    }
    for (int i = 0; i < CP_COUNT; i++) MT_TRY(bind_one(arena, plan, m->cp.id[i], &m->cp.buf[i]));
    for (int i = 0; i < DEC_COUNT; i++) MT_TRY(bind_one(arena, plan, m->dec.id[i], &m->dec.buf[i]));
    for (int i = 0; i < G4_COUNT; i++) MT_TRY(bind_one(arena, plan, m->g4.id[i], &m->g4.buf[i]));
    m->dec.len = 0; /* a new arena: the caches are empty */
    if (m->plan.gptr[GB_WORKSPACE])
        MT_TRY(m->be->ops->set_workspace(m->be, m->plan.gptr[GB_WORKSPACE], m->plan.ws_bytes));
    m->plan.bound = 1;
    return MT_OK;
}

mt_status mt_model_bind_host(mt_model *m, const mt_arena *host_arena, const mt_plan *host_plan) {
    if (!m || !host_arena || !host_plan) return mt_set_error(MT_ERR_INVALID, "mt_model_bind_host: NULL argument");
    if (!m->host.planned)
        return mt_set_error(MT_ERR_INVALID, "mt_model_bind_host: call mt_model_add_to_host_plan first");
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        for (int j = 0; j < MT_LT_COUNT; j++) {
            void *p;
            MT_TRY(bind_one(host_arena, host_plan, m->host.act_id[l][j], &p));
            m->host.act_ptr[l][j] = p;
        }
    if (m->pwin.offload) MT_TRY(bind_one(host_arena, host_plan, m->host.params_id, &m->plan.gptr[GB_PARAMS]));
    if (m->pwin.offload && m->dt != MT_F32)
        MT_TRY(bind_one(host_arena, host_plan, m->host.compute_id, &m->plan.gptr[GB_COMPUTE_W]));
    m->host.bound = 1;
    return MT_OK;
}
