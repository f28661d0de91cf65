/* models/model_layers.c: one decoder layer's forward and hand-written backward
 * (Hugging Face modeling_llama.py / modeling_gemma*.py; the per-layer equations are in
 * models/model.c's header), the recomputation of the tensors the remat policy did not
 * keep, and the copies of offloaded tensors to and from the host pool.
 *
 * Forward of layer l (phase 1 + l): decoder_layer_input -> the next layer's input. The
 * saved set is exactly the list of model_plan.c mtm_act_elems. Everything else the
 * backward needs (the normalised inputs, h, act(g) u) is recomputed from saved tensors
 * with the same deterministic ops, and a tensor that was not kept is recomputed
 * (remat) or restored (offload) into the layer-sized scratch before the layer's
 * backward, so results are bitwise those of keeping everything.
 *
 * Backward: the gradient of the residual stream lives in one buffer G; every RMSNorm
 * backward accumulates into it (be->ops->rmsnorm_bwd adds to dx), which is the residual
 * connection's gradient for free. The tensor / sequence / context parallel collectives
 * are model_shard.c's (mtm_row_*, mtm_norm_gather, mtm_cp_attention_*). */
#include "models/model_internal.h"

#include <assert.h>
#include <string.h>

mt_attn_args mtm_attn_args(const mt_model *m, int64_t l) {
    mt_attn_args a;
    memset(&a, 0, sizeof(a));
    a.B = m->B;
    a.Tq = a.Tk = m->T;
    a.H = m->H;
    a.Hkv = m->Hkv;
    a.Dh = mt_model_layer_head_dim(&m->cfg, l); /* m->Dh but on gemma4's global layers */
    a.scale = mt_model_attn_scale(&m->cfg);
    a.softcap = m->cfg.attn_logits_soft_cap;
    a.window = mt_model_layer_is_local(&m->cfg, l) ? m->cfg.sliding_window_size : 0;
    a.dtype = m->dt;
    a.q_pos = NULL;
    a.k_pos = NULL;
    return a;
}

/* RoPE positions of the local rows: per document with packing, else the original ones. */
const int32_t *mtm_rope_positions(const mt_model *m) {
    return m->plan.gptr[m->pack.on ? GB_DOC_POS : GB_POSITIONS];
}

const float *mtm_layer_inv_freq(const mt_model *m, int64_t l) {
    const float *t = m->plan.gptr[GB_INV_FREQ];
    return mt_model_layer_is_local(&m->cfg, l) ? t + m->Dh / 2 : t;
}

/* Where tensor j of layer l is during the forward (fwd = 1) or the backward (0):
 * its own plan entry when kept, else the layer-sized remat scratch. */
void mtm_layer_ptrs(const mt_model *m, int64_t l, int fwd, void *a[MT_LT_COUNT]) {
    for (int j = 0; j < MT_LT_COUNT; j++)
        a[j] = m->plan.lid[l][j] >= 0 ? m->plan.lptr[l][j] : (fwd ? m->remat.fwd[j] : m->remat.bwd[j]);
}

/* After the forward of layer l: copy its offloaded tensors to the host pool. */
mt_status mtm_layer_offload(mt_model *m, int64_t l, void *a[MT_LT_COUNT]) {
    if (!m->remat.has_offload) return MT_OK;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (m->host.act_id[l][j] >= 0)
            MT_TRY(m->be->ops->copy_to_host(m->be, m->host.act_ptr[l][j], a[j], mtm_act_bytes_layer(m, l, j)));
    return MT_OK;
}

/* Before the backward of layer l: bring its offloaded tensors back. */
mt_status mtm_layer_restore(mt_model *m, int64_t l, void *a[MT_LT_COUNT]) {
    if (!m->remat.has_offload) return MT_OK;
    for (int j = 0; j < MT_LT_COUNT; j++)
        if (m->host.act_id[l][j] >= 0)
            MT_TRY(m->be->ops->copy_to_device(m->be, a[j], m->host.act_ptr[l][j], mtm_act_bytes_layer(m, l, j)));
    return MT_OK;
}

int mtm_la_is_remat(const mt_model *m, int j) {
    return mtm_act_elems(m, j) > 0 && mtm_act_action(m, j) == MT_RA_REMAT;
}

/* bwd.work (model_plan.c add_scratch) holds a layer backward's temporaries: first the
 * MLP's [N, F] act(g) u and its gradient, using it whole, then the attention's, which
 * are live together and so take disjoint parts of it, each MT_PLAN_ALIGN-aligned (as a
 * plan entry of its own would be):
 *   w[0] [N, max(QD, KVD)]  dcontext; with qk_norm then q, k (gemma4: v) before their norm
 *   w[1] [N, max(QD, KVD)]  dq; with qk_norm then dk through k_norm
 *   w[2] [N, KVD]           dk (gemma4: then v_norm's output, then dv through v_norm)
 *   w[3] [N, KVD]           dv
 *   w[4] [N, QD]            qk_norm only (else NULL): dq through q_norm
 * QD, KVD are the layer's (gemma4's vary by layer; the plan asks with the largest).
 * Fills w from m->plan.gptr[GB_BWD_WORK] unless w is NULL; returns the bytes the parts
 * span. */
size_t mtm_bwd_attn_parts(const mt_model *m, int64_t QD, int64_t KVD, void *w[MTM_BWD_ATTN_PARTS]) {
    const int64_t width[MTM_BWD_ATTN_PARTS] = {max64(QD, KVD), max64(QD, KVD), KVD, KVD,
                                               m->cfg.use_qk_norm ? QD : 0};
    size_t off = 0;
    for (int i = 0; i < MTM_BWD_ATTN_PARTS; i++) {
        if (w) w[i] = width[i] > 0 ? (char *)m->plan.gptr[GB_BWD_WORK] + off : NULL;
        const size_t bytes = (size_t)(m->N * width[i]) * m->es;
        off += (bytes + MT_PLAN_ALIGN - 1) / MT_PLAN_ALIGN * MT_PLAN_ALIGN;
    }
    return off;
}

/* Forward of layer l (phase 1 + l): layer input -> next layer input. */
mt_status mtm_layer_forward(mt_model *m, int64_t l) {
    if (m->g4.on) return mtm_g4_layer_forward(m, l);
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    void *a[MT_LT_COUNT];
    mtm_layer_ptrs(m, l, 1, a);
    const int64_t N = m->N, D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh;
    const int64_t QD = m->QD, KVD = m->KVD;
    const int64_t Ns = seq_rows(m); /* residual rows (sequence parallelism: N / tp) */
    const size_t ND = (size_t)(Ns * D) * m->es;
    void *nrm = m->plan.gptr[GB_FWD_NORM], *res = m->plan.gptr[GB_FWD_RESID];
    void *tmp = m->plan.gptr[GB_FWD_TMP], *glu = m->plan.gptr[GB_FWD_GLU];
    const int32_t *pos = mtm_rope_positions(m);
    const float *inv_freq = mtm_layer_inv_freq(m, l);
    const void *x = a[MT_LT_DECODER_LAYER_INPUT];
    void *y = l + 1 < m->cfg.num_decoder_layers ? m->plan.lptr[l + 1][MT_LT_DECODER_LAYER_INPUT]
                                                : m->plan.gptr[GB_FINAL_INPUT];

    /* attention block */
    MT_TRY(mtm_norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], x, lp->in_norm));
    if (m->cfg.use_qk_norm) {
        MT_TRY(mtm_param_open(m, lp->q));
        MT_TRY(linear_fwd(m, tmp, nrm, mtm_pw(m, lp->q), N, D, QD, 0.0f));
        MT_TRY(mtm_param_open(m, lp->q_norm));
        MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_QUERY_PROJ], a[MT_LT_QUERY_NORM_RSTD], tmp, mtm_pw(m, lp->q_norm),
                                    N * H, Dh, m->eps, m->w_off, m->dt));
        MT_TRY(mtm_param_open(m, lp->k));
        MT_TRY(linear_fwd(m, tmp, nrm, mtm_pw(m, lp->k), N, D, KVD, 0.0f));
        MT_TRY(mtm_param_open(m, lp->k_norm));
        MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_KEY_PROJ], a[MT_LT_KEY_NORM_RSTD], tmp, mtm_pw(m, lp->k_norm), N * Hkv,
                                    Dh, m->eps, m->w_off, m->dt));
    } else {
        MT_TRY(mtm_param_open(m, lp->q));
        MT_TRY(linear_fwd(m, a[MT_LT_QUERY_PROJ], nrm, mtm_pw(m, lp->q), N, D, QD, 0.0f));
        MT_TRY(mtm_param_open(m, lp->k));
        MT_TRY(linear_fwd(m, a[MT_LT_KEY_PROJ], nrm, mtm_pw(m, lp->k), N, D, KVD, 0.0f));
    }
    MT_TRY(be->ops->rope_fwd(be, a[MT_LT_QUERY_PROJ], pos, inv_freq, N, H, Dh, m->dt));
    MT_TRY(be->ops->rope_fwd(be, a[MT_LT_KEY_PROJ], pos, inv_freq, N, Hkv, Dh, m->dt));
    MT_TRY(mtm_param_open(m, lp->v));
    MT_TRY(linear_fwd(m, a[MT_LT_VALUE_PROJ], nrm, mtm_pw(m, lp->v), N, D, KVD, 0.0f));
    MT_TRY(mtm_cp_attention_fwd(m, l, a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE], a[MT_LT_QUERY_PROJ], a[MT_LT_KEY_PROJ],
                                a[MT_LT_VALUE_PROJ]));
    MT_TRY(mtm_row_fwd(m, a[MT_LT_OUT_PROJ], a[MT_LT_CONTEXT], lp->o, QD, m->tp.QDg, 0.0f, tmp, NULL));
    const void *attn_out = a[MT_LT_OUT_PROJ];
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(mtm_param_open(m, lp->post_attn_norm));
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, a[MT_LT_POST_ATTN_NORM_RSTD], a[MT_LT_OUT_PROJ],
                                    mtm_pw(m, lp->post_attn_norm), Ns, D, m->eps, m->w_off, m->dt));
        attn_out = tmp;
    }

    /* MLP block: h = x + attention output, fused with the pre-MLP norm */
    MT_TRY(mtm_add_norm_gather(m, res, nrm, a[MT_LT_PRE_MLP_NORM_RSTD], x, attn_out, lp->pre_mlp_norm));
    MT_TRY(mtm_param_open(m, lp->gate));
    MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_0], nrm, mtm_pw(m, lp->gate), N, D, F, 0.0f));
    MT_TRY(mtm_param_open(m, lp->up));
    MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_1], nrm, mtm_pw(m, lp->up), N, D, F, 0.0f));
    MT_TRY(be->ops->glu_fwd(be, glu, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
    MT_TRY(be->ops->copy(be, y, res, ND));
    if (m->cfg.use_post_ffw_norm) {
        MT_TRY(mtm_row_fwd(m, a[MT_LT_MLPWO], glu, lp->down, F, m->tp.Fg, 0.0f, nrm, NULL));
        MT_TRY(mtm_param_open(m, lp->post_ffw_norm));
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, a[MT_LT_POST_FFW_NORM_RSTD], a[MT_LT_MLPWO], mtm_pw(m, lp->post_ffw_norm),
                                    Ns, D, m->eps, m->w_off, m->dt));
        MT_TRY(be->ops->axpy(be, y, tmp, 1.0f, Ns * D, m->dt));
    } else {
        MT_TRY(mtm_row_fwd(m, y, glu, lp->down, F, m->tp.Fg, 1.0f, nrm, tmp));
    }
    MT_TRY(mtm_layer_offload(m, l, a));
    return MT_OK;
}

/* Start of the backward of layer l, attention half: recompute the attention tensors
 * that were not kept, from decoder_layer_input, with the forward's exact op sequence
 * (so bitwise the forward's values). Uses nrm and w0 as temporaries. */
static mt_status MT_MUST_CHECK layer_recompute_attn(mt_model *m, int64_t l, void *a[MT_LT_COUNT]) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t N = m->N, D = m->D, H = m->H, Hkv = m->Hkv, Dh = m->Dh, QD = m->QD, KVD = m->KVD;
    const int rq = mtm_la_is_remat(m, MT_LT_QUERY_PROJ), rk = mtm_la_is_remat(m, MT_LT_KEY_PROJ),
              rv = mtm_la_is_remat(m, MT_LT_VALUE_PROJ);
    const int32_t *pos = mtm_rope_positions(m);
    const float *inv_freq = mtm_layer_inv_freq(m, l);
    void *nrm = m->plan.gptr[GB_BWD_NORM], *tmp = m->plan.gptr[GB_BWD_WORK];
    if (rq || rk || rv)
        MT_TRY(mtm_norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], a[MT_LT_DECODER_LAYER_INPUT], lp->in_norm));
    if (rq) {
        MT_TRY(mtm_param_open(m, lp->q));
        if (m->cfg.use_qk_norm) {
            MT_TRY(linear_fwd(m, tmp, nrm, mtm_pw(m, lp->q), N, D, QD, 0.0f));
            MT_TRY(mtm_param_open(m, lp->q_norm));
            MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_QUERY_PROJ], a[MT_LT_QUERY_NORM_RSTD], tmp, mtm_pw(m, lp->q_norm),
                                        N * H, Dh, m->eps, m->w_off, m->dt));
        } else {
            MT_TRY(linear_fwd(m, a[MT_LT_QUERY_PROJ], nrm, mtm_pw(m, lp->q), N, D, QD, 0.0f));
        }
        MT_TRY(be->ops->rope_fwd(be, a[MT_LT_QUERY_PROJ], pos, inv_freq, N, H, Dh, m->dt));
    }
    if (rk) {
        MT_TRY(mtm_param_open(m, lp->k));
        if (m->cfg.use_qk_norm) {
            MT_TRY(linear_fwd(m, tmp, nrm, mtm_pw(m, lp->k), N, D, KVD, 0.0f));
            MT_TRY(mtm_param_open(m, lp->k_norm));
            MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_KEY_PROJ], a[MT_LT_KEY_NORM_RSTD], tmp, mtm_pw(m, lp->k_norm),
                                        N * Hkv, Dh, m->eps, m->w_off, m->dt));
        } else {
            MT_TRY(linear_fwd(m, a[MT_LT_KEY_PROJ], nrm, mtm_pw(m, lp->k), N, D, KVD, 0.0f));
        }
        MT_TRY(be->ops->rope_fwd(be, a[MT_LT_KEY_PROJ], pos, inv_freq, N, Hkv, Dh, m->dt));
    }
    if (rv) {
        MT_TRY(mtm_param_open(m, lp->v));
        MT_TRY(linear_fwd(m, a[MT_LT_VALUE_PROJ], nrm, mtm_pw(m, lp->v), N, D, KVD, 0.0f));
    }
    if (mtm_la_is_remat(m, MT_LT_CONTEXT)) {
        MT_TRY(mtm_cp_attention_fwd(m, l, a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE], a[MT_LT_QUERY_PROJ],
                                    a[MT_LT_KEY_PROJ], a[MT_LT_VALUE_PROJ]));
    }
    if (mtm_la_is_remat(m, MT_LT_OUT_PROJ))
        MT_TRY(mtm_row_fwd(m, a[MT_LT_OUT_PROJ], a[MT_LT_CONTEXT], lp->o, QD, m->tp.QDg, 0.0f, nrm, NULL));
    return MT_OK;
}

/* MLP half: given n2 = pre-MLP norm(h) in nrm, recompute mlpwi_0, mlpwi_1 and (with a
 * post-MLP norm) mlpwo when they were not kept. Uses glu and full [N, D] as temporaries. */
static mt_status MT_MUST_CHECK layer_recompute_mlp(mt_model *m, int64_t l, void *a[MT_LT_COUNT], const void *nrm,
                                                   void *glu, void *full) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t N = m->N, D = m->D, F = m->F;
    if (mtm_la_is_remat(m, MT_LT_MLPWI_0)) {
        MT_TRY(mtm_param_open(m, lp->gate));
        MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_0], nrm, mtm_pw(m, lp->gate), N, D, F, 0.0f));
    }
    if (mtm_la_is_remat(m, MT_LT_MLPWI_1)) {
        MT_TRY(mtm_param_open(m, lp->up));
        MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_1], nrm, mtm_pw(m, lp->up), N, D, F, 0.0f));
    }
    if (mtm_la_is_remat(m, MT_LT_MLPWO)) {
        MT_TRY(be->ops->glu_fwd(be, glu, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
        MT_TRY(mtm_row_fwd(m, a[MT_LT_MLPWO], glu, lp->down, F, m->tp.Fg, 0.0f, full, NULL));
    }
    return MT_OK;
}

mt_status mtm_mlp_backward(mt_model *m, int64_t l, void *a[MT_LT_COUNT], const void *dmlp, const void *nrm, void *w0,
                           void *d2, int64_t F, int64_t Fg) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t N = m->N, D = m->D;
    MT_TRY(be->ops->glu_fwd(be, w0, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
    MT_TRY(mtm_row_bwd_w(m, lp->down, dmlp, w0, F, Fg));
    MT_TRY(mtm_row_bwd_x(m, w0, dmlp, lp->down, F, Fg, 0.0f)); /* d(act(g) u) */
    /* dg, du in place of g, u: this is their last use (ops.h glu_bwd allows it) */
    void *dg = a[MT_LT_MLPWI_0], *du = a[MT_LT_MLPWI_1];
    MT_TRY(be->ops->glu_bwd(be, dg, du, w0, dg, du, N * F, m->cfg.mlp_activation, m->dt));
    MT_TRY(mtm_linear_grad(m, lp->gate, dg, nrm, N, D, F));
    MT_TRY(mtm_linear_grad(m, lp->up, du, nrm, N, D, F));
    /* up before gate: after down_proj's window the recomputed up_proj's is still there */
    MT_TRY(mtm_param_open(m, lp->up));
    MT_TRY(linear_bwd_x(m, d2, du, mtm_pw(m, lp->up), N, D, F, 0.0f));
    MT_TRY(mtm_param_open(m, lp->gate));
    return linear_bwd_x(m, d2, dg, mtm_pw(m, lp->gate), N, D, F, 1.0f);
}

/* Backward of layer l (phase 2L + 1 - l): on entry G = dloss/d(layer output), on exit
 * G = dloss/d(layer input); parameter gradients accumulated. */
mt_status mtm_layer_backward(mt_model *m, int64_t l) {
    if (m->g4.on) return mtm_g4_layer_backward(m, l);
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    void *a[MT_LT_COUNT];
    mtm_layer_ptrs(m, l, 0, a);
    MT_TRY(mtm_layer_restore(m, l, a));
    MT_TRY(layer_recompute_attn(m, l, a));
    const int64_t N = m->N, D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh;
    const int64_t QD = m->QD, KVD = m->KVD;
    const int64_t Ns = seq_rows(m), s0 = seq_row0(m); /* residual rows (sequence parallelism) */
    const size_t ND = (size_t)(Ns * D) * m->es;
    const float eps = m->eps, off = m->w_off;
    void *G = m->plan.gptr[GB_RESID_GRAD];
    void *nrm = m->plan.gptr[GB_BWD_NORM], *res = m->plan.gptr[GB_BWD_RESID];
    void *d1 = m->plan.gptr[GB_BWD_D1], *d2 = m->plan.gptr[GB_BWD_D2]; /* d1: NULL unless post norms or SP */
    void *w[MTM_BWD_ATTN_PARTS]; /* w0: all of bwd.work in the MLP half, its first part after */
    (void)mtm_bwd_attn_parts(m, QD, KVD, w);
    void *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4];
    const int32_t *pos = mtm_rope_positions(m);
    const float *inv_freq = mtm_layer_inv_freq(m, l);
    const void *x = a[MT_LT_DECODER_LAYER_INPUT];

    /* ---- MLP block: y = h + [post_ffw](down(act(g) u)) ---- */
    /* recompute h = x + [post_attn](o) and n2 = norm(h), then the MLP tensors not kept */
    const void *attn_out = a[MT_LT_OUT_PROJ];
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(mtm_param_open(m, lp->post_attn_norm));
        MT_TRY(be->ops->rmsnorm_fwd(be, d2, a[MT_LT_POST_ATTN_NORM_RSTD], a[MT_LT_OUT_PROJ],
                                    mtm_pw(m, lp->post_attn_norm), Ns, D, eps, off, m->dt));
        attn_out = d2;
    }
    MT_TRY(mtm_add_norm_gather(m, res, nrm, a[MT_LT_PRE_MLP_NORM_RSTD], x, attn_out, lp->pre_mlp_norm));
    MT_TRY(layer_recompute_mlp(m, l, a, nrm, w0, d2));
    /* d(down_proj output) [N, D]: under sequence parallelism this rank's rows are
     * written into d1 and all-gathered */
    const void *dmlp = G;
    if (m->cfg.use_post_ffw_norm) {
        MT_TRY(be->ops->zero(be, AT(m, d1, s0 * D), ND));
        MT_TRY(mtm_grad_open(m, lp->post_ffw_norm));
        MT_TRY(mtm_param_open(m, lp->post_ffw_norm));
        MT_TRY(be->ops->rmsnorm_bwd(be, AT(m, d1, s0 * D), mtm_gw(m, lp->post_ffw_norm), G, a[MT_LT_MLPWO],
                                    mtm_pw(m, lp->post_ffw_norm), a[MT_LT_POST_FFW_NORM_RSTD], Ns, D, off, m->dt));
        dmlp = d1;
    } else if (m->tp.sp) {
        MT_TRY(be->ops->copy(be, AT(m, d1, s0 * D), G, ND));
        dmlp = d1;
    }
    mtm_sp_gather(m, d1);
    MT_TRY(mtm_mlp_backward(m, l, a, dmlp, nrm, w0, d2, F, m->tp.Fg));
    /* column-parallel gate/up: partial input gradient (d1 is free again) */
    const void *dn2 = mtm_tp_sum_input_grad(m, d2, d1);
    MT_TRY(mtm_grad_open(m, lp->pre_mlp_norm));
    MT_TRY(mtm_param_open(m, lp->pre_mlp_norm));
    MT_TRY(be->ops->rmsnorm_bwd(be, G, mtm_gw(m, lp->pre_mlp_norm), dn2, res, mtm_pw(m, lp->pre_mlp_norm),
                                a[MT_LT_PRE_MLP_NORM_RSTD], Ns, D, off, m->dt));

    /* ---- attention block: h = x + [post_attn](o_proj(attn(...))) ---- */
    const void *dattn = G;
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(be->ops->zero(be, AT(m, d1, s0 * D), ND));
        MT_TRY(mtm_grad_open(m, lp->post_attn_norm));
        MT_TRY(mtm_param_open(m, lp->post_attn_norm));
        MT_TRY(be->ops->rmsnorm_bwd(be, AT(m, d1, s0 * D), mtm_gw(m, lp->post_attn_norm), G, a[MT_LT_OUT_PROJ],
                                    mtm_pw(m, lp->post_attn_norm), a[MT_LT_POST_ATTN_NORM_RSTD], Ns, D, off, m->dt));
        dattn = d1;
    } else if (m->tp.sp) {
        MT_TRY(be->ops->copy(be, AT(m, d1, s0 * D), G, ND));
        dattn = d1;
    }
    mtm_sp_gather(m, d1);
    MT_TRY(mtm_row_bwd_w(m, lp->o, dattn, a[MT_LT_CONTEXT], QD, m->tp.QDg));
    MT_TRY(mtm_row_bwd_x(m, w0, dattn, lp->o, QD, m->tp.QDg, 0.0f)); /* dcontext */
    MT_TRY(mtm_cp_attention_bwd(m, l, w1, w2, w3, w0, a[MT_LT_QUERY_PROJ], a[MT_LT_KEY_PROJ], a[MT_LT_VALUE_PROJ],
                                a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE]));
    MT_TRY(be->ops->rope_bwd(be, w1, pos, inv_freq, N, H, Dh, m->dt));
    MT_TRY(be->ops->rope_bwd(be, w2, pos, inv_freq, N, Hkv, Dh, m->dt));
    MT_TRY(mtm_norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], x, lp->in_norm)); /* recompute n1 */
    const void *dq = w1, *dk = w2, *dv = w3;
    if (m->cfg.use_qk_norm) {
        MT_TRY(mtm_param_open(m, lp->q));
        MT_TRY(linear_fwd(m, w0, nrm, mtm_pw(m, lp->q), N, D, QD, 0.0f)); /* q before q_norm */
        MT_TRY(be->ops->zero(be, w4, (size_t)(N * QD) * m->es));
        MT_TRY(mtm_grad_open(m, lp->q_norm));
        MT_TRY(mtm_param_open(m, lp->q_norm));
        MT_TRY(be->ops->rmsnorm_bwd(be, w4, mtm_gw(m, lp->q_norm), w1, w0, mtm_pw(m, lp->q_norm),
                                    a[MT_LT_QUERY_NORM_RSTD], N * H, Dh, off, m->dt));
        MT_TRY(mtm_param_open(m, lp->k));
        MT_TRY(linear_fwd(m, w0, nrm, mtm_pw(m, lp->k), N, D, KVD, 0.0f)); /* k before k_norm */
        MT_TRY(be->ops->zero(be, w1, (size_t)(N * KVD) * m->es));
        MT_TRY(mtm_grad_open(m, lp->k_norm));
        MT_TRY(mtm_param_open(m, lp->k_norm));
        MT_TRY(be->ops->rmsnorm_bwd(be, w1, mtm_gw(m, lp->k_norm), w2, w0, mtm_pw(m, lp->k_norm),
                                    a[MT_LT_KEY_NORM_RSTD], N * Hkv, Dh, off, m->dt));
        dq = w4;
        dk = w1;
    }
    MT_TRY(mtm_linear_grad(m, lp->q, dq, nrm, N, D, QD));
    MT_TRY(mtm_linear_grad(m, lp->k, dk, nrm, N, D, KVD));
    MT_TRY(mtm_linear_grad(m, lp->v, dv, nrm, N, D, KVD));
    MT_TRY(mtm_param_open(m, lp->q));
    MT_TRY(linear_bwd_x(m, d2, dq, mtm_pw(m, lp->q), N, D, QD, 0.0f));
    MT_TRY(mtm_param_open(m, lp->k));
    MT_TRY(linear_bwd_x(m, d2, dk, mtm_pw(m, lp->k), N, D, KVD, 1.0f));
    MT_TRY(mtm_param_open(m, lp->v));
    MT_TRY(linear_bwd_x(m, d2, dv, mtm_pw(m, lp->v), N, D, KVD, 1.0f));
    const void *dn1 = mtm_tp_sum_input_grad(m, d2, d1); /* column-parallel q/k/v: partial input gradient */
    MT_TRY(mtm_grad_open(m, lp->in_norm));
    MT_TRY(mtm_param_open(m, lp->in_norm));
    MT_TRY(be->ops->rmsnorm_bwd(be, G, mtm_gw(m, lp->in_norm), dn1, x, mtm_pw(m, lp->in_norm), a[MT_LT_INPUT_NORM_RSTD],
                                Ns, D, off, m->dt));
    return MT_OK;
}

/* Mirrors mtm_layer_forward and mtm_layer_backward above (with their recompute
 * helpers): each mtm_param_open they make, in order. model_windows.c checks every open
 * against this list, so a change to the layer code that opens differently fails at
 * its first run with param_window_unit=weight (tests/test_mpi_layouts.sh). */
int mtm_layer_param_order(const mt_model *m, int64_t l, int backward, int *out) {
    if (m->g4.on) return mtm_g4_layer_param_order(m, l, backward, out);
    const layer_params *lp = &m->par.layer[l];
    const mt_model_config *c = &m->cfg;
    int n = 0;
#define OPEN(i) mtm_order_push(out, &n, (i))
    if (!backward) {
        OPEN(lp->in_norm);
        OPEN(lp->q);
        if (c->use_qk_norm) OPEN(lp->q_norm);
        OPEN(lp->k);
        if (c->use_qk_norm) OPEN(lp->k_norm);
        OPEN(lp->v);
        OPEN(lp->o);
        if (c->use_post_attn_norm) OPEN(lp->post_attn_norm);
        OPEN(lp->pre_mlp_norm);
        OPEN(lp->gate);
        OPEN(lp->up);
        OPEN(lp->down);
        if (c->use_post_ffw_norm) OPEN(lp->post_ffw_norm);
        return n;
    }
    /* layer_recompute_attn */
    const int rq = mtm_la_is_remat(m, MT_LT_QUERY_PROJ), rk = mtm_la_is_remat(m, MT_LT_KEY_PROJ),
              rv = mtm_la_is_remat(m, MT_LT_VALUE_PROJ);
    if (rq || rk || rv) OPEN(lp->in_norm);
    if (rq) {
        OPEN(lp->q);
        if (c->use_qk_norm) OPEN(lp->q_norm);
    }
    if (rk) {
        OPEN(lp->k);
        if (c->use_qk_norm) OPEN(lp->k_norm);
    }
    if (rv) OPEN(lp->v);
    if (mtm_la_is_remat(m, MT_LT_OUT_PROJ)) OPEN(lp->o);
    /* the MLP block: h, n2 and layer_recompute_mlp */
    if (c->use_post_attn_norm) OPEN(lp->post_attn_norm);
    OPEN(lp->pre_mlp_norm);
    if (mtm_la_is_remat(m, MT_LT_MLPWI_0)) OPEN(lp->gate);
    if (mtm_la_is_remat(m, MT_LT_MLPWI_1)) OPEN(lp->up);
    if (mtm_la_is_remat(m, MT_LT_MLPWO)) OPEN(lp->down);
    if (c->use_post_ffw_norm) OPEN(lp->post_ffw_norm);
    OPEN(lp->down);
    OPEN(lp->up);
    OPEN(lp->gate);
    OPEN(lp->pre_mlp_norm);
    /* the attention block */
    if (c->use_post_attn_norm) OPEN(lp->post_attn_norm);
    OPEN(lp->o);
    OPEN(lp->in_norm);
    if (c->use_qk_norm) {
        OPEN(lp->q);
        OPEN(lp->q_norm);
        OPEN(lp->k);
        OPEN(lp->k_norm);
    }
    OPEN(lp->q);
    OPEN(lp->k);
    OPEN(lp->v);
    OPEN(lp->in_norm);
#undef OPEN
    return n;
}

void mtm_layer_recomputes(const mt_model *m, int64_t l, int *norm_gathers, int *row_fwds, int *context) {
    if (m->g4.on) {
        mtm_g4_layer_recomputes(m, l, norm_gathers, row_fwds, context);
        return;
    }
    /* layer_recompute_attn, layer_recompute_mlp */
    *norm_gathers = mtm_la_is_remat(m, MT_LT_QUERY_PROJ) || mtm_la_is_remat(m, MT_LT_KEY_PROJ) ||
                    mtm_la_is_remat(m, MT_LT_VALUE_PROJ);
    *row_fwds = mtm_la_is_remat(m, MT_LT_OUT_PROJ) + mtm_la_is_remat(m, MT_LT_MLPWO);
    *context = mtm_la_is_remat(m, MT_LT_CONTEXT);
}
