/* models/model_decode.c: incremental decoding with a KV cache (models/model.h
 * mt_model_set_decode, mt_model_decode_step): a decode model's plan (the parameters,
 * the caches "decode.kv_cache.key / value" [L, 1, T, Hkv, Dh] each and one row's
 * scratch, DEC_* of model_internal.h) and the forward of one new row at position t,
 * the same op sequence as model_layers.c's layer forward on one row, attending over
 * the cached rotated keys and values (Pope et al. 2022, "Efficiently Scaling
 * Transformer Inference", the KV cache; the sliding window of Gemma 2 / 3 keeps only
 * its last window rows in view, Hugging Face modeling_gemma2.py). */
#include "models/model_internal.h"

#include <math.h>

mt_status mtm_decode_add_to_plan(mt_model *m, mt_plan *plan) {
    if (m->tp.size > 1 || m->cp.size > 1 || m->fsdp.size > 1 || m->pwin.offload || m->sink.fn)
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
    for (int g = 0; g < GB_COUNT; g++) m->plan.gid[g] = -1;
    MT_TRY(mtm_plan_add(m, plan, GB_PARAMS, "params", MT_MEM_PARAMS, (size_t)m->par.numel * f4, 0, last));
    for (int i = 0; i < DEC_COUNT; i++) {
        const mt_mem_category cat = i <= DEC_VCACHE ? MT_MEM_ACTIVATIONS : MT_MEM_SCRATCH;
        const size_t es = (i == DEC_POS || i == DEC_TOKEN) ? i4 : f4;
        mt_plan_tag tag = mt_plan_tag_of_category(cat);
        if (i <= DEC_VCACHE) tag.kind = MT_PLAN_KIND_KV_CACHE;
        else if (i == DEC_POS || i == DEC_TOKEN || i == DEC_INV_FREQ) tag.kind = MT_PLAN_KIND_INPUT;
        MT_TRY(mt_plan_add_tagged(plan, names[i], cat, tag, (size_t)elems[i] * es, 0, last, &m->dec.id[i]));
    }
    m->plan.planned = 1;
    m->plan.bound = 0;
    m->dec.len = 0;
    return MT_OK;
}

mt_status mt_model_set_decode(mt_model *m, int on) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "mt_model_set_decode: NULL model");
    if (m->plan.planned) return mt_set_error(MT_ERR_INVALID, "mt_model_set_decode: set it before planning");
    if (on && m->g4.on)
        return mt_set_error(MT_ERR_UNSUPPORTED, "decoder_block=gemma4: `sample` (incremental decoding with a "
                            "KV cache) does not support Gemma 4's KV-sharing layers and per-layer inputs yet; "
                            "train, evaluate and save it, and sample with Hugging Face transformers");
    if (on && m->B != 1)
        return mt_set_error(MT_ERR_INVALID, "mt_model_set_decode: the KV cache holds one sequence (batch %lld, "
                            "must be 1)", (long long)m->B);
    if (on && m->dt != MT_F32)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_set_decode: incremental decoding computes in float32 "
                            "(the model's dtype is %s)", mt_dtype_name(m->dt));
    m->dec.on = on != 0;
    return MT_OK;
}

mt_status mt_model_decode_reset(mt_model *m) {
    if (!m || !m->dec.on || !m->plan.bound)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_reset: not a bound decode model (mt_model_set_decode)");
    m->dec.len = 0;
    return MT_OK;
}

int64_t mt_model_decode_length(const mt_model *m) { return m && m->dec.on ? m->dec.len : 0; }

/* One layer for the new row at position t (the same op sequence as layer_forward on
 * one row): its key and value go to the cache row t, its query attends over the
 * cached rows [k0, t] (k0 > 0 only on a sliding-window layer, whose mask excludes the
 * rows before). */
static mt_status MT_MUST_CHECK decode_layer(mt_model *m, int64_t l, int64_t t) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t D = m->D, F = m->F, H = m->H, Hkv = m->Hkv, Dh = m->Dh, QD = m->QD, KVD = m->KVD;
    float **b = (float **)m->dec.buf;
    float *x = b[DEC_X], *nrm = b[DEC_NORM], *q = b[DEC_Q], *tmp = b[DEC_TMP], *rstd = b[DEC_RSTD];
    float *out = b[DEC_OUT], *glu = b[DEC_GLU];
    float *kc = b[DEC_KCACHE] + l * m->T * KVD, *vc = b[DEC_VCACHE] + l * m->T * KVD;
    const int32_t *pos = m->dec.buf[DEC_POS];
    const float *inv_freq = (const float *)b[DEC_INV_FREQ] + (mt_model_layer_is_local(&m->cfg, l) ? Dh / 2 : 0);

    /* attention block */
    MT_TRY(be->ops->rmsnorm_fwd(be, nrm, rstd, x, mtm_pw(m, lp->in_norm), 1, D, m->eps, m->w_off, MT_F32));
    if (m->cfg.use_qk_norm) {
        MT_TRY(linear_fwd(m, tmp, nrm, mtm_pw(m, lp->q), 1, D, QD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, q, rstd, tmp, mtm_pw(m, lp->q_norm), H, Dh, m->eps, m->w_off, MT_F32));
        MT_TRY(linear_fwd(m, tmp, nrm, mtm_pw(m, lp->k), 1, D, KVD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, kc + t * KVD, rstd, tmp, mtm_pw(m, lp->k_norm), Hkv, Dh, m->eps, m->w_off,
                                    MT_F32));
    } else {
        MT_TRY(linear_fwd(m, q, nrm, mtm_pw(m, lp->q), 1, D, QD, 0.0f));
        MT_TRY(linear_fwd(m, kc + t * KVD, nrm, mtm_pw(m, lp->k), 1, D, KVD, 0.0f));
    }
    MT_TRY(be->ops->rope_fwd(be, q, pos + t, inv_freq, 1, H, Dh, MT_F32));
    MT_TRY(be->ops->rope_fwd(be, kc + t * KVD, pos + t, inv_freq, 1, Hkv, Dh, MT_F32));
    MT_TRY(linear_fwd(m, vc + t * KVD, nrm, mtm_pw(m, lp->v), 1, D, KVD, 0.0f));
    mt_attn_args a = mtm_attn_args(m, l);
    const int64_t k0 = a.window > 0 && t - a.window + 1 > 0 ? t - a.window + 1 : 0;
    a.Tq = 1;
    a.Tk = t + 1 - k0;
    a.q_pos = pos + t;
    a.k_pos = pos + k0;
    MT_TRY(be->ops->attention_fwd(be, &a, b[DEC_CTX], b[DEC_LSE], q, kc + k0 * KVD, vc + k0 * KVD));
    MT_TRY(linear_fwd(m, out, b[DEC_CTX], mtm_pw(m, lp->o), 1, QD, D, 0.0f));
    if (m->cfg.use_post_attn_norm) {
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, rstd, out, mtm_pw(m, lp->post_attn_norm), 1, D, m->eps, m->w_off, MT_F32));
        MT_TRY(be->ops->axpy(be, x, tmp, 1.0f, D, MT_F32));
    } else {
        MT_TRY(be->ops->axpy(be, x, out, 1.0f, D, MT_F32));
    }

    /* MLP block */
    MT_TRY(be->ops->rmsnorm_fwd(be, nrm, rstd, x, mtm_pw(m, lp->pre_mlp_norm), 1, D, m->eps, m->w_off, MT_F32));
    MT_TRY(linear_fwd(m, b[DEC_GATE], nrm, mtm_pw(m, lp->gate), 1, D, F, 0.0f));
    MT_TRY(linear_fwd(m, b[DEC_UP], nrm, mtm_pw(m, lp->up), 1, D, F, 0.0f));
    MT_TRY(be->ops->glu_fwd(be, glu, b[DEC_GATE], b[DEC_UP], F, m->cfg.mlp_activation, MT_F32));
    if (m->cfg.use_post_ffw_norm) {
        MT_TRY(linear_fwd(m, out, glu, mtm_pw(m, lp->down), 1, F, D, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, tmp, rstd, out, mtm_pw(m, lp->post_ffw_norm), 1, D, m->eps, m->w_off, MT_F32));
        MT_TRY(be->ops->axpy(be, x, tmp, 1.0f, D, MT_F32));
    } else {
        MT_TRY(linear_fwd(m, x, glu, mtm_pw(m, lp->down), 1, F, D, 1.0f));
    }
    return MT_OK;
}

mt_status mt_model_decode_step(mt_model *m, int32_t token, float *logits) {
    if (!m || !m->dec.on || !m->plan.bound)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: not a bound decode model (mt_model_set_decode)");
    if (!logits) return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: logits is NULL");
    if (token < 0 || (int64_t)token >= m->V)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: token %d is outside [0, vocab_size=%lld)",
                            (int)token, (long long)m->V);
    const int64_t t = m->dec.len;
    if (t >= m->T)
        return mt_set_error(MT_ERR_INVALID, "mt_model_decode_step: the KV cache is full (%lld positions; "
                            "mt_model_decode_reset starts again)", (long long)m->T);
    mt_backend *be = m->be;
    const int64_t D = m->D, V = m->V;
    if (t == 0) { /* constant inputs: once per sequence (the arena may be new) */
        MT_TRY(be->ops->copy_to_device(be, m->dec.buf[DEC_POS], m->pos_host, (size_t)m->T * sizeof(int32_t)));
        MT_TRY(be->ops->copy_to_device(be, m->dec.buf[DEC_INV_FREQ], m->inv_freq_host, (size_t)m->Dh * sizeof(float)));
    }
    MT_TRY(be->ops->copy_to_device(be, m->dec.buf[DEC_TOKEN], &token, sizeof(int32_t)));
    MT_TRY(be->ops->embedding_fwd(be, m->dec.buf[DEC_X], mtm_pw(m, m->par.embed), m->dec.buf[DEC_TOKEN], 1, 0, m->V, D,
                                  m->emb_scale, MT_F32));
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) MT_TRY(decode_layer(m, l, t));
    MT_TRY(be->ops->rmsnorm_fwd(be, m->dec.buf[DEC_NORM], m->dec.buf[DEC_RSTD], m->dec.buf[DEC_X],
                                mtm_pw(m, m->par.final_norm), 1, D, m->eps, m->w_off, MT_F32));
    MT_TRY(linear_fwd(m, m->dec.buf[DEC_LOGITS], m->dec.buf[DEC_NORM], mtm_unembedding(m), 1, D, V, 0.0f));
    MT_TRY(be->ops->copy_to_host(be, logits, m->dec.buf[DEC_LOGITS], (size_t)V * sizeof(float)));
    const float cap = m->cfg.final_logits_soft_cap; /* as mt_model_logits */
    if (cap > 0.0f)
        for (int64_t i = 0; i < V; i++) logits[i] = cap * tanhf(logits[i] / cap);
    m->dec.len = t + 1;
    return MT_OK;
}
