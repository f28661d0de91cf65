/* models/model_gemma4.c: the Gemma 4 decoder layer and its per-layer inputs, forward
 * and backward (transformers models/gemma4/modeling_gemma4.py, 5.17:
 * Gemma4TextDecoderLayer, Gemma4TextAttention, Gemma4TextModel.get_per_layer_inputs /
 * project_per_layer_inputs).
 *
 * Layer l, N rows, Dh / QD / KVD / F of the layer (global layers have global_head_dim,
 * KV-sharing layers 2 x mlp_dim with use_double_wide_mlp), every RMSNorm with plain w:
 *   n1 = input_layernorm(x)
 *   q  = rope(q_norm(n1 Wq^T))
 *   own K/V:  k = rope(k_norm(n1 Wk^T)), v = v_norm(n1 Wv^T) (v_norm: no weight)
 *   sharing:  k, v = the donor's (the last earlier layer of the same kind), as saved
 *   c  = attention(q, k, v), scale 1.0, window on local layers
 *   h  = x + post_attention_layernorm(c Wo^T)
 *   y1 = h + post_feedforward_layernorm(down(gelu(gate(n2)) up(n2))), n2 = pre_feedforward_layernorm(h)
 *   y2 = y1 + post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(y1)) * P_l))
 *   y  = y2 * layer_scalar
 * and before the layers, from the scaled embedding x0 and the tokens:
 *   P = (RMSNorm_P(reshape(x0 Wplmp^T * D^-0.5, [N, L, P])) + E_ple[tokens] * sqrt(P)) * 2^-0.5
 * P_l = P[:, l, :] is a strided column block of the [N, L*P] buffer: it is copied out
 * (and its gradient back in) by a GEMM with a [P, P] identity, which is exact (one
 * product by 1 and sums with exact zeros).
 *
 * Gradients: a sharing layer's dK / dV (with respect to the donor's post-RoPE K and
 * post-norm V) are summed into an accumulator per kind, which the donor's backward
 * adds to its own before the RoPE / norm backward: every sharing layer's gradient
 * reaches the donor's projections. layer_scalar gets none (a buffer in transformers).
 * The donor's key_proj / value_proj are kept from its forward to its backward
 * whatever the remat policy (model_plan.c), since the sharing layers read them in
 * between.
 *
 * Parallelism (model_shard.c, as for the other families). Tensor: q/k/v and gate/up
 * column-parallel, o_proj and down_proj row-parallel, with each layer's own widths (its
 * head dim, its MLP width / tp: mtm_layer_qd / mtm_layer_f); q_norm / k_norm / v_norm
 * are per head, so local. A sharing layer's K/V are the donor's local kv heads, which
 * are its own too, so the accumulators stay per rank. The per-layer inputs and each
 * layer's per-layer-input block run whole on every rank from the replicated residual
 * stream: their parameters' gradients are replicated (mt_model_tp_grad_replicated).
 * Sequence parallelism: the residual stream, the per-layer inputs (from this rank's
 * rows of the embedding and tokens) and the per-layer-input blocks hold this rank's
 * seq_rows; their gradients are then partial and summed over the group. Context: each
 * layer, a sharing one included, gathers (or rings) the K/V it attends to with its own
 * width; a sharing layer's dK / dV come back to this rank's rows before they reach the
 * accumulator. Packing: the segment ids and per-document positions reach the attention
 * and RoPE as for the other families. Gradient windows (ZeRO-1): the layer windows are
 * the largest layer weight's and each layer hands its parameters over one at a time,
 * layer_scalar (no gradient) as zeros (model_windows.c); the
 * per-layer-input globals have their own window (G4_GWIN_PLE, ple_gw), fp32, for the
 * embedding's backward phase. Parameter windows (fsdp, parameter offload): the layer
 * windows are the largest layer's (with param_window_unit=weight a segment each, opened
 * in the order of mtm_g4_layer_param_order), and the per-layer-input globals, which the
 * global window does not hold, have their own (G4_PWIN_PLE, ple_pw), all-gathered or copied once per forward
 * and kept until their backward. Whole, both would hold the per-layer embedding table
 * V x L x P (E2B: 2.35G elements, 4.7 GB in bf16, 9.4 GB as the fp32 gradient). When
 * the vocabulary comes in chunks (model_loss.c) the table does too, in vc.ple_C chunks
 * of its own (model_plan.c mtm_vocab_resolve: none larger than a decoder layer): the
 * lookup takes each chunk's rows gathered or copied into G4_PWIN_PLE_VOCAB
 * (ple_table_rows; the backward does not read the table), and its backward hands each
 * chunk's gradient to the sink from G4_GWIN_PLE_VOCAB (ple_table_backward); the two
 * windows above then hold the projection and its norm only (mtm_g4_ple_window). */
#include "models/model_internal.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define G4B(m, i) ((m)->g4.buf[i])

static int64_t g4_dh(const mt_model *m, int64_t l) { return mtm_layer_dh(m, l); }
/* The layer's MLP width on this rank (its tensor-parallel slice) and in all: the
 * latter is the row stride of the row-parallel down_proj. */
static int64_t g4_f(const mt_model *m, int64_t l) { return mtm_layer_f(m, l); }
static int64_t g4_fg(const mt_model *m, int64_t l) { return mt_model_layer_mlp_dim(&m->cfg, l); }
/* The layer's query width in all (this rank's is H x Dh): the row stride of o_proj. */
static int64_t g4_qdg(const mt_model *m, int64_t l) { return m->tp.size * m->H * g4_dh(m, l); }
static int g4_kind(const mt_model *m, int64_t l) { return mt_model_layer_is_local(&m->cfg, l) ? 0 : 1; }

int mtm_g4_is_donor(const mt_model *m, int64_t l) {
    const int64_t L = m->cfg.num_decoder_layers;
    for (int64_t s = L - m->cfg.num_kv_shared_layers; s < L; s++)
        if (mt_model_layer_kv_donor(&m->cfg, s) == l) return 1;
    return 0;
}

/* dst[Ns, P] = all[:, l*P : (l+1)*P] of all [Ns, L*P] (GEMM with the identity); Ns =
 * seq_rows, this rank's residual rows (all N without sequence parallelism). */
static mt_status ple_slice(mt_model *m, void *dst, const void *all, int64_t l) {
    const int64_t N = seq_rows(m), P = m->g4.P, LP = m->cfg.num_decoder_layers * P;
    return m->be->ops->gemm(m->be, 0, 0, N, P, P, 1.0f, AT(m, all, l * P), LP, G4B(m, G4_IDENT), P, m->dt, 0.0f,
                            dst, P, m->dt);
}

/* all[:, l*P : (l+1)*P] += src[Ns, P]. */
static mt_status ple_unslice_add(mt_model *m, void *all, const void *src, int64_t l) {
    const int64_t N = seq_rows(m), P = m->g4.P, LP = m->cfg.num_decoder_layers * P;
    return m->be->ops->gemm(m->be, 0, 0, N, P, P, 1.0f, src, P, G4B(m, G4_IDENT), P, m->dt, 1.0f,
                            AT(m, all, l * P), LP, m->dt);
}

/* y[Ns*D] = x[Ns*D] * s[0] with s the layer_scalar parameter (a [1] tensor in backend
 * memory): a GEMM [Ns*D, 1] x [1, 1], one exact product per element. */
static mt_status times_scalar(mt_model *m, void *y, const void *x, int pi) {
    MT_TRY(mtm_param_open(m, pi));
    return m->be->ops->gemm(m->be, 0, 0, seq_rows(m) * m->D, 1, 1, 1.0f, x, 1, mtm_pw(m, pi), 1, m->dt, 0.0f, y, 1,
                            m->dt);
}

/* ------------------------------------------------------------------ per-layer inputs */

void mtm_g4_ple_range(const mt_model *m, int64_t *a, int64_t *n) {
    *a = *n = 0;
    if (!m->g4.on || m->par.ple_embed < 0) return;
    const mt_param_info *first = &m->par.info[m->par.ple_embed], *last = &m->par.info[m->par.ple_proj_norm];
    *a = first->offset;
    *n = last->offset + last->numel - first->offset;
}

void mtm_g4_ple_window(const mt_model *m, int grad, int64_t *a, int64_t *n) {
    mtm_g4_ple_range(m, a, n);
    if (*n > 0 && (grad ? mtm_g4_ple_grad_windows(m) : mtm_g4_ple_windows(m))) {
        const int64_t table = m->par.info[m->par.ple_embed].numel; /* the first of the range */
        *a += table;
        *n -= table;
    }
}

/* Per-layer-input global i as the layers compute with it: mtm_pw, or with parameter
 * windows (fsdp, parameter offload) its place in G4_PWIN_PLE, which ple_fetch fills at
 * the start of each forward (the global window holds the embedding and the tail only).
 * Not for the per-layer embedding table when it comes in chunks (ple_table_rows). */
static const void *ple_pw(const mt_model *m, int i) {
    if (!params_windowed(m)) return mtm_pw(m, i);
    int64_t a, n;
    mtm_g4_ple_window(m, 0, &a, &n);
    return AT(m, G4B(m, G4_PWIN_PLE), m->par.info[i].offset - a);
}

/* Fill G4_PWIN_PLE: all-gathered from the fsdp shards, or (parameter offload) copied
 * from the host pool's compute copy / master, as model_windows.c fills the others. */
static mt_status ple_fetch(mt_model *m) {
    if (!params_windowed(m)) return MT_OK;
    int64_t a, n;
    mtm_g4_ple_window(m, 0, &a, &n);
    return mtm_window_fill(m, G4B(m, G4_PWIN_PLE), a, a + n);
}

/* Rows [r0, r1) of the per-layer embedding table, [r1 - r0, L*P] of m->dt: in place
 * (G4_PWIN_PLE or the flat parameters), or with chunk windows (mtm_g4_ple_windows)
 * gathered from the fsdp shards or copied from the host pool into G4_PWIN_PLE_VOCAB,
 * valid until the next call. */
static mt_status ple_table_rows(mt_model *m, int64_t r0, int64_t r1, const void **rows) {
    const int64_t LP = m->cfg.num_decoder_layers * m->g4.P, off = m->par.info[m->par.ple_embed].offset + r0 * LP;
    if (!mtm_g4_ple_windows(m)) {
        *rows = AT(m, ple_pw(m, m->par.ple_embed), r0 * LP);
        return MT_OK;
    }
    *rows = G4B(m, G4_PWIN_PLE_VOCAB);
    return mtm_window_fill(m, G4B(m, G4_PWIN_PLE_VOCAB), off, off + (r1 - r0) * LP);
}

/* The gradient of per-layer-input global i: mtm_gw, or with a gradient sink its place
 * in the window G4_GWIN_PLE (these parameters are replicated on the tensor group, so
 * there is no slice offset). Not for the per-layer embedding table when its gradient
 * comes in chunks (ple_table_backward). */
static float *ple_gw(mt_model *m, int i) {
    if (!m->sink.fn) return mtm_gw(m, i);
    int64_t a, n;
    mtm_g4_ple_window(m, 1, &a, &n);
    return (float *)G4B(m, G4_GWIN_PLE) + (m->par.info[i].offset - a);
}

/* The per-layer embedding table's backward, dE[tokens] += scale dall: one vocabulary
 * chunk at a time (vc.ple_C of them; each chunk's rows of other tokens are skipped, so
 * the chunks together are bitwise the whole-table call), into the gradient's rows, or
 * with chunk windows (mtm_g4_ple_grad_windows) into G4_GWIN_PLE_VOCAB, zeroed once the
 * sink is done with the previous chunk and handed to the sink on its own. */
static mt_status ple_table_backward(mt_model *m, const void *dall, const int32_t *tok, int64_t N, float scale) {
    mt_backend *be = m->be;
    const int64_t LP = m->cfg.num_decoder_layers * m->g4.P, e0 = m->par.info[m->par.ple_embed].offset;
    for (int64_t c = 0; c < m->vc.ple_C; c++) {
        int64_t a, b;
        mtm_g4_ple_chunk(m, c, &a, &b);
        if (!mtm_g4_ple_grad_windows(m)) {
            MT_TRY(be->ops->embedding_bwd(be, ple_gw(m, m->par.ple_embed) + a * LP, dall, tok, N, a, b - a, LP,
                                          scale, m->dt));
            continue;
        }
        MT_TRY(mtm_table_chunk_backward(m, G4B(m, G4_GWIN_PLE_VOCAB), e0, dall, tok, N, a, b, LP, scale, 0));
    }
    return MT_OK;
}

mt_status mtm_g4_inputs_forward(mt_model *m) {
    mt_backend *be = m->be;
    MT_TRY(be->ops->zero(be, G4B(m, G4_VZERO), (size_t)m->Dh * m->es));
    if (m->g4.P == 0) return MT_OK;
    /* this rank's residual rows (sequence parallelism: the layers read P for those only) */
    const int64_t N = seq_rows(m), D = m->D, P = m->g4.P, L = m->cfg.num_decoder_layers, LP = L * P;
    const int32_t *tok = (const int32_t *)m->plan.gptr[GB_TOKENS] + seq_row0(m);
    const size_t nlp = (size_t)(N * LP);
    if (!m->g4.ident_host) { /* the [P, P] identity of the activation dtype (bf16 one: 0x3f80) */
        m->g4.ident_host = calloc((size_t)(P * P), m->es);
        if (!m->g4.ident_host) return mt_set_error(MT_ERR_OOM, "gemma4: out of memory");
        for (int64_t i = 0; i < P; i++) {
            if (m->es == sizeof(float)) ((float *)m->g4.ident_host)[i * P + i] = 1.0f;
            else ((uint16_t *)m->g4.ident_host)[i * P + i] = 0x3f80;
        }
    }
    MT_TRY(be->ops->copy_to_device(be, G4B(m, G4_IDENT), m->g4.ident_host, (size_t)(P * P) * m->es));
    MT_TRY(ple_fetch(m));
    const void *x0 = m->plan.lptr[0][MT_LT_DECODER_LAYER_INPUT];
    void *all = G4B(m, G4_PLE_ALL), *tmp = G4B(m, G4_PLE_DALL);
    /* per_layer_model_projection(inputs_embeds) * hidden_size**-0.5, normed per layer */
    MT_TRY(linear_fwd(m, tmp, x0, ple_pw(m, m->par.ple_model_proj), N, D, LP, 0.0f));
    MT_TRY(be->ops->scale(be, tmp, (float)(1.0 / sqrt((double)D)), (int64_t)nlp, m->dt));
    MT_TRY(be->ops->rmsnorm_fwd(be, all, G4B(m, G4_PLE_ROWRSTD), tmp, ple_pw(m, m->par.ple_proj_norm), N * L, P, m->eps,
                                m->w_off, m->dt));
    /* + embed_tokens_per_layer(ids) * sqrt(hidden_size_per_layer_input), then * 2**-0.5 */
    for (int64_t c = 0; c < m->vc.ple_C; c++) { /* each chunk of table rows fills the rows of its tokens */
        int64_t a, b;
        const void *E = NULL;
        mtm_g4_ple_chunk(m, c, &a, &b);
        MT_TRY(ple_table_rows(m, a, b, &E));
        MT_TRY(be->ops->embedding_fwd(be, tmp, E, tok, N, a, b - a, LP, (float)sqrt((double)P), m->dt));
    }
    MT_TRY(be->ops->axpy(be, all, tmp, 1.0f, (int64_t)nlp, m->dt));
    return be->ops->scale(be, all, (float)(1.0 / sqrt(2.0)), (int64_t)nlp, m->dt);
}

mt_status mtm_g4_backward_begin(mt_model *m) {
    mt_backend *be = m->be;
    const size_t kv = (size_t)(m->N * m->KVD) * m->es;
    for (int i = G4_SKV_DK0; i <= G4_SKV_DV1; i++)
        if (G4B(m, i)) MT_TRY(be->ops->zero(be, G4B(m, i), kv));
    if (m->g4.P > 0)
        MT_TRY(be->ops->zero(be, G4B(m, G4_PLE_DALL),
                             (size_t)(m->N * m->cfg.num_decoder_layers * m->g4.P) * m->es));
    return MT_OK;
}

mt_status mtm_g4_inputs_backward(mt_model *m, void *G) {
    if (m->g4.P == 0) return MT_OK;
    mt_backend *be = m->be;
    const int64_t N = seq_rows(m), D = m->D, P = m->g4.P, L = m->cfg.num_decoder_layers, LP = L * P;
    const int32_t *tok = (const int32_t *)m->plan.gptr[GB_TOKENS] + seq_row0(m);
    const size_t nlp = (size_t)(N * LP);
    int64_t ga, gn; /* with a gradient sink the flat range of their window G4_GWIN_PLE */
    mtm_g4_ple_window(m, 1, &ga, &gn);
    if (m->sink.fn) MT_TRY(be->ops->zero(be, G4B(m, G4_GWIN_PLE), (size_t)gn * sizeof(float)));
    const float dscale = (float)(1.0 / sqrt((double)D));
    const void *x0 = m->plan.lptr[0][MT_LT_DECODER_LAYER_INPUT];
    void *all = G4B(m, G4_PLE_ALL), *dall = G4B(m, G4_PLE_DALL), *dproj = G4B(m, G4_PLE_TMP);
    /* d(sum) = dP * 2**-0.5 reaches both the scaled per-layer embedding and the norm */
    MT_TRY(be->ops->scale(be, dall, (float)(1.0 / sqrt(2.0)), (int64_t)nlp, m->dt));
    MT_TRY(ple_table_backward(m, dall, tok, N, (float)sqrt((double)P)));
    /* the projection before its norm, recomputed (the forward's op sequence) */
    MT_TRY(linear_fwd(m, all, x0, ple_pw(m, m->par.ple_model_proj), N, D, LP, 0.0f));
    MT_TRY(be->ops->scale(be, all, dscale, (int64_t)nlp, m->dt));
    MT_TRY(be->ops->zero(be, dproj, nlp * m->es));
    MT_TRY(be->ops->rmsnorm_bwd(be, dproj, ple_gw(m, m->par.ple_proj_norm), dall, all, ple_pw(m, m->par.ple_proj_norm),
                                G4B(m, G4_PLE_ROWRSTD), N * L, P, m->w_off, m->dt));
    MT_TRY(be->ops->scale(be, dproj, dscale, (int64_t)nlp, m->dt));
    MT_TRY(linear_bwd_w(m, ple_gw(m, m->par.ple_model_proj), dproj, x0, N, D, LP));
    MT_TRY(linear_bwd_x(m, G, dproj, ple_pw(m, m->par.ple_model_proj), N, D, LP, 1.0f));
    /* the globals' gradients are complete: hand their window over (an asynchronous sink
     * is waited for with the embedding's window, model_loss.c) */
    if (m->sink.fn) MT_TRY(m->sink.fn(m->sink.ctx, ga, gn, G4B(m, G4_GWIN_PLE), 0));
    return MT_OK;
}

/* ------------------------------------------------------------------ the layer */

/* A donor's key or value_proj that the policy does not keep: its plan entry ends with
 * the sharing layers' backwards (model_plan.c add_saved), and its own backward takes
 * it from the remat scratch, recomputed or restored as the policy says. */
static int g4_donor_released(const mt_model *m, int64_t l, int j) {
    return (j == MT_LT_KEY_PROJ || j == MT_LT_VALUE_PROJ) && mtm_act_action(m, j) != MT_RA_DEVICE &&
           mtm_g4_is_donor(m, l);
}

/* Where layer l's tensors are; a sharing layer's key / value_proj are its donor's. */
static void g4_ptrs(const mt_model *m, int64_t l, int fwd, void *a[MT_LT_COUNT]) {
    mtm_layer_ptrs(m, l, fwd, a);
    const int64_t d = mt_model_layer_kv_donor(&m->cfg, l);
    if (d >= 0) {
        a[MT_LT_KEY_PROJ] = m->plan.lptr[d][MT_LT_KEY_PROJ];
        a[MT_LT_VALUE_PROJ] = m->plan.lptr[d][MT_LT_VALUE_PROJ];
    }
    for (int j = MT_LT_KEY_PROJ; !fwd && j <= MT_LT_VALUE_PROJ; j++) /* adjacent in mt_layer_tensor */
        if (g4_donor_released(m, l, j)) a[j] = m->remat.bwd[j];
}

/* Recomputed in the backward: a named tensor the policy does not keep and the plan
 * did not keep anyway, or a donor's released K/V (g4_donor_released). */
static int g4_recompute(const mt_model *m, int64_t l, int j) {
    return mtm_la_is_remat(m, j) && (m->plan.lid[l][j] < 0 || g4_donor_released(m, l, j));
}

/* q = rope(q_norm(n1 Wq^T)) into a[QUERY_PROJ] (tmp [N, QD] scratch). */
static mt_status g4_q_fwd(mt_model *m, int64_t l, void *a[MT_LT_COUNT], const void *n1, void *tmp) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t N = m->N, D = m->D, H = m->H, Dh = g4_dh(m, l), QD = H * Dh;
    MT_TRY(mtm_param_open(m, lp->q));
    MT_TRY(linear_fwd(m, tmp, n1, mtm_pw(m, lp->q), N, D, QD, 0.0f));
    MT_TRY(mtm_param_open(m, lp->q_norm));
    MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_QUERY_PROJ], a[MT_LT_QUERY_NORM_RSTD], tmp, mtm_pw(m, lp->q_norm), N * H, Dh,
                                m->eps, m->w_off, m->dt));
    return be->ops->rope_fwd(be, a[MT_LT_QUERY_PROJ], mtm_rope_positions(m), mtm_layer_inv_freq(m, l), N, H, Dh, m->dt);
}

/* k = rope(k_norm(n1 Wk^T)) into a[KEY_PROJ] (when want_k), v = v_norm(n1 Wv^T) into
 * a[VALUE_PROJ] (when want_v; its statistics into G4_VRSTD). */
static mt_status g4_kv_fwd(mt_model *m, int64_t l, void *a[MT_LT_COUNT], const void *n1, void *tmp, int want_k,
                           int want_v) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t N = m->N, D = m->D, Hkv = m->Hkv, Dh = g4_dh(m, l), KVD = Hkv * Dh;
    if (want_k) {
        MT_TRY(mtm_param_open(m, lp->k));
        MT_TRY(linear_fwd(m, tmp, n1, mtm_pw(m, lp->k), N, D, KVD, 0.0f));
        MT_TRY(mtm_param_open(m, lp->k_norm));
        MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_KEY_PROJ], a[MT_LT_KEY_NORM_RSTD], tmp, mtm_pw(m, lp->k_norm), N * Hkv,
                                    Dh, m->eps, m->w_off, m->dt));
        MT_TRY(be->ops->rope_fwd(be, a[MT_LT_KEY_PROJ], mtm_rope_positions(m), mtm_layer_inv_freq(m, l), N, Hkv, Dh,
                                 m->dt));
    }
    if (want_v) {
        MT_TRY(mtm_param_open(m, lp->v));
        MT_TRY(linear_fwd(m, tmp, n1, mtm_pw(m, lp->v), N, D, KVD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, a[MT_LT_VALUE_PROJ], G4B(m, G4_VRSTD), tmp, G4B(m, G4_VZERO), N * Hkv, Dh,
                                    m->eps, 1.0f, m->dt));
    }
    return MT_OK;
}

/* y += post_per_layer_input_norm(per_layer_projection(gelu(per_layer_input_gate(y)) *
 * P_l)) on this rank's residual rows; out [Ns, D] scratch for the norm's output. */
static mt_status g4_ple_fwd(mt_model *m, int64_t l, void *y, void *out) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t N = seq_rows(m), D = m->D, P = m->g4.P;
    MT_TRY(mtm_param_open(m, lp->ple_gate));
    MT_TRY(linear_fwd(m, G4B(m, G4_PLE_A), y, mtm_pw(m, lp->ple_gate), N, D, P, 0.0f));
    MT_TRY(ple_slice(m, G4B(m, G4_PLE_B), G4B(m, G4_PLE_ALL), l));
    MT_TRY(be->ops->glu_fwd(be, G4B(m, G4_PLE_C), G4B(m, G4_PLE_A), G4B(m, G4_PLE_B), N * P, m->cfg.mlp_activation,
                            m->dt));
    MT_TRY(mtm_param_open(m, lp->ple_proj));
    MT_TRY(linear_fwd(m, G4B(m, G4_O), G4B(m, G4_PLE_C), mtm_pw(m, lp->ple_proj), N, P, D, 0.0f));
    MT_TRY(mtm_param_open(m, lp->ple_norm));
    MT_TRY(be->ops->rmsnorm_fwd(be, out, G4B(m, G4_RSTD), G4B(m, G4_O), mtm_pw(m, lp->ple_norm), N, D, m->eps,
                                m->w_off, m->dt));
    return be->ops->axpy(be, y, out, 1.0f, N * D, m->dt);
}

mt_status mtm_g4_layer_forward(mt_model *m, int64_t l) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    void *a[MT_LT_COUNT];
    g4_ptrs(m, l, 1, a);
    const int64_t N = m->N, D = m->D, Dh = g4_dh(m, l), QD = m->H * Dh, F = g4_f(m, l);
    const int64_t Ns = seq_rows(m); /* residual rows (sequence parallelism: N / tp) */
    const size_t ND = (size_t)(Ns * D) * m->es;
    void *nrm = m->plan.gptr[GB_FWD_NORM], *res = m->plan.gptr[GB_FWD_RESID];
    void *tmp = m->plan.gptr[GB_FWD_TMP], *glu = m->plan.gptr[GB_FWD_GLU];
    const void *x = a[MT_LT_DECODER_LAYER_INPUT];
    void *y = l + 1 < m->cfg.num_decoder_layers ? m->plan.lptr[l + 1][MT_LT_DECODER_LAYER_INPUT]
                                                : m->plan.gptr[GB_FINAL_INPUT];
    /* attention */
    MT_TRY(mtm_norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], x, lp->in_norm));
    MT_TRY(g4_q_fwd(m, l, a, nrm, tmp));
    if (mt_model_layer_kv_donor(&m->cfg, l) < 0) MT_TRY(g4_kv_fwd(m, l, a, nrm, tmp, 1, 1));
    MT_TRY(mtm_cp_attention_fwd(m, l, a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE], a[MT_LT_QUERY_PROJ], a[MT_LT_KEY_PROJ],
                                a[MT_LT_VALUE_PROJ]));
    MT_TRY(mtm_row_fwd(m, a[MT_LT_OUT_PROJ], a[MT_LT_CONTEXT], lp->o, QD, g4_qdg(m, l), 0.0f, tmp, NULL));
    MT_TRY(mtm_param_open(m, lp->post_attn_norm));
    MT_TRY(be->ops->rmsnorm_fwd(be, tmp, a[MT_LT_POST_ATTN_NORM_RSTD], a[MT_LT_OUT_PROJ], mtm_pw(m, lp->post_attn_norm),
                                Ns, D, m->eps, m->w_off, m->dt));
    /* MLP */
    MT_TRY(mtm_add_norm_gather(m, res, nrm, a[MT_LT_PRE_MLP_NORM_RSTD], x, tmp, lp->pre_mlp_norm));
    MT_TRY(mtm_param_open(m, lp->gate));
    MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_0], nrm, mtm_pw(m, lp->gate), N, D, F, 0.0f));
    MT_TRY(mtm_param_open(m, lp->up));
    MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_1], nrm, mtm_pw(m, lp->up), N, D, F, 0.0f));
    MT_TRY(be->ops->glu_fwd(be, glu, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
    MT_TRY(mtm_row_fwd(m, a[MT_LT_MLPWO], glu, lp->down, F, g4_fg(m, l), 0.0f, nrm, NULL));
    MT_TRY(mtm_param_open(m, lp->post_ffw_norm));
    MT_TRY(be->ops->rmsnorm_fwd(be, tmp, a[MT_LT_POST_FFW_NORM_RSTD], a[MT_LT_MLPWO], mtm_pw(m, lp->post_ffw_norm), Ns,
                                D, m->eps, m->w_off, m->dt));
    MT_TRY(be->ops->copy(be, y, res, ND));
    MT_TRY(be->ops->axpy(be, y, tmp, 1.0f, Ns * D, m->dt));
    /* per-layer input, then layer_scalar */
    if (m->g4.P > 0) MT_TRY(g4_ple_fwd(m, l, y, tmp));
    MT_TRY(be->ops->copy(be, res, y, ND));
    MT_TRY(times_scalar(m, y, res, lp->scalar));
    return mtm_layer_offload(m, l, a);
}

/* The attention tensors the backward needs and did not keep, from decoder_layer_input
 * with the forward's op sequence (bitwise the forward's values). Uses nrm and tmp. */
static mt_status g4_recompute_attn(mt_model *m, int64_t l, void *a[MT_LT_COUNT], void *nrm, void *tmp) {
    const layer_params *lp = &m->par.layer[l];
    const int own = mt_model_layer_kv_donor(&m->cfg, l) < 0;
    const int rq = g4_recompute(m, l, MT_LT_QUERY_PROJ);
    const int rk = own && g4_recompute(m, l, MT_LT_KEY_PROJ), rv = own && g4_recompute(m, l, MT_LT_VALUE_PROJ);
    const int64_t QD = m->H * g4_dh(m, l);
    if (rq || rk || rv)
        MT_TRY(mtm_norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], a[MT_LT_DECODER_LAYER_INPUT], lp->in_norm));
    if (rq) MT_TRY(g4_q_fwd(m, l, a, nrm, tmp));
    if (rk || rv) MT_TRY(g4_kv_fwd(m, l, a, nrm, tmp, rk, rv));
    if (g4_recompute(m, l, MT_LT_CONTEXT))
        MT_TRY(mtm_cp_attention_fwd(m, l, a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE], a[MT_LT_QUERY_PROJ],
                                    a[MT_LT_KEY_PROJ], a[MT_LT_VALUE_PROJ]));
    if (g4_recompute(m, l, MT_LT_OUT_PROJ))
        MT_TRY(mtm_row_fwd(m, a[MT_LT_OUT_PROJ], a[MT_LT_CONTEXT], lp->o, QD, g4_qdg(m, l), 0.0f, nrm, NULL));
    return MT_OK;
}

/* Backward of the per-layer input: on entry G = dloss/dy2, res = h and a[MLPWO] (with
 * its norm statistics) as the forward had them; on exit G = dloss/dy1, the gate /
 * projection / norm gradients added and dP_l added into G4_PLE_DALL. d1, d2 [N, D]
 * scratch. */
static mt_status g4_ple_bwd(mt_model *m, int64_t l, void *a[MT_LT_COUNT], void *G, const void *res, void *d1,
                            void *d2) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    const int64_t N = seq_rows(m), D = m->D, P = m->g4.P; /* this rank's residual rows */
    void *ymid = G4B(m, G4_YMID), *o = G4B(m, G4_O);
    void *pa = G4B(m, G4_PLE_A), *pb = G4B(m, G4_PLE_B), *pc = G4B(m, G4_PLE_C);
    void *pd = pa, *pe = pb; /* d(gate), d(input) written over the gate and input (glu_bwd in place) */
    /* recompute y1 = h + post_feedforward_layernorm(mlpwo), then the gate, input, product, projection */
    MT_TRY(mtm_param_open(m, lp->post_ffw_norm));
    MT_TRY(be->ops->rmsnorm_fwd(be, d2, a[MT_LT_POST_FFW_NORM_RSTD], a[MT_LT_MLPWO], mtm_pw(m, lp->post_ffw_norm), N, D,
                                m->eps, m->w_off, m->dt));
    MT_TRY(be->ops->copy(be, ymid, res, (size_t)(N * D) * m->es));
    MT_TRY(be->ops->axpy(be, ymid, d2, 1.0f, N * D, m->dt));
    MT_TRY(mtm_param_open(m, lp->ple_gate));
    MT_TRY(linear_fwd(m, pa, ymid, mtm_pw(m, lp->ple_gate), N, D, P, 0.0f));
    MT_TRY(ple_slice(m, pb, G4B(m, G4_PLE_ALL), l));
    MT_TRY(be->ops->glu_fwd(be, pc, pa, pb, N * P, m->cfg.mlp_activation, m->dt));
    MT_TRY(mtm_param_open(m, lp->ple_proj));
    MT_TRY(linear_fwd(m, o, pc, mtm_pw(m, lp->ple_proj), N, P, D, 0.0f));
    MT_TRY(mtm_param_open(m, lp->ple_norm));
    MT_TRY(be->ops->rmsnorm_fwd(be, d2, G4B(m, G4_RSTD), o, mtm_pw(m, lp->ple_norm), N, D, m->eps, m->w_off, m->dt));
    /* backward */
    MT_TRY(be->ops->zero(be, d1, (size_t)(N * D) * m->es));
    MT_TRY(mtm_grad_open(m, lp->ple_norm));
    MT_TRY(mtm_param_open(m, lp->ple_norm));
    MT_TRY(be->ops->rmsnorm_bwd(be, d1, mtm_gw(m, lp->ple_norm), G, o, mtm_pw(m, lp->ple_norm), G4B(m, G4_RSTD), N, D,
                                m->w_off, m->dt));
    MT_TRY(mtm_linear_grad(m, lp->ple_proj, d1, pc, N, P, D));
    MT_TRY(mtm_param_open(m, lp->ple_proj));
    MT_TRY(linear_bwd_x(m, pc, d1, mtm_pw(m, lp->ple_proj), N, P, D, 0.0f));
    MT_TRY(be->ops->glu_bwd(be, pd, pe, pc, pa, pb, N * P, m->cfg.mlp_activation, m->dt));
    MT_TRY(ple_unslice_add(m, G4B(m, G4_PLE_DALL), pe, l));
    MT_TRY(mtm_linear_grad(m, lp->ple_gate, pd, ymid, N, D, P));
    MT_TRY(mtm_param_open(m, lp->ple_gate));
    return linear_bwd_x(m, G, pd, mtm_pw(m, lp->ple_gate), N, D, P, 1.0f);
}

mt_status mtm_g4_layer_backward(mt_model *m, int64_t l) {
    mt_backend *be = m->be;
    const layer_params *lp = &m->par.layer[l];
    void *a[MT_LT_COUNT];
    g4_ptrs(m, l, 0, a);
    MT_TRY(mtm_layer_restore(m, l, a));
    const int64_t N = m->N, D = m->D, H = m->H, Hkv = m->Hkv, Dh = g4_dh(m, l), F = g4_f(m, l);
    const int64_t QD = H * Dh, KVD = Hkv * Dh;
    const int64_t Ns = seq_rows(m), s0 = seq_row0(m); /* residual rows (sequence parallelism) */
    const size_t ND = (size_t)(Ns * D) * m->es;
    const float eps = m->eps, off = m->w_off;
    const int64_t donor = mt_model_layer_kv_donor(&m->cfg, l);
    const int k = g4_kind(m, l);
    void *G = m->plan.gptr[GB_RESID_GRAD];
    void *nrm = m->plan.gptr[GB_BWD_NORM], *res = m->plan.gptr[GB_BWD_RESID];
    void *d1 = m->plan.gptr[GB_BWD_D1], *d2 = m->plan.gptr[GB_BWD_D2];
    void *w[MTM_BWD_ATTN_PARTS]; /* w0: all of bwd.work in the MLP half, its first part after */
    (void)mtm_bwd_attn_parts(m, QD, KVD, w);
    void *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3], *w4 = w[4];
    const int32_t *pos = mtm_rope_positions(m);
    const float *inv_freq = mtm_layer_inv_freq(m, l);
    const void *x = a[MT_LT_DECODER_LAYER_INPUT];
    MT_TRY(g4_recompute_attn(m, l, a, nrm, w0));

    /* y = y2 * layer_scalar: G <- G * layer_scalar (no gradient for the scalar) */
    MT_TRY(be->ops->copy(be, d1, G, ND));
    MT_TRY(times_scalar(m, G, d1, lp->scalar));
    /* recompute h and n2, then the MLP tensors not kept */
    MT_TRY(mtm_param_open(m, lp->post_attn_norm));
    MT_TRY(be->ops->rmsnorm_fwd(be, d2, a[MT_LT_POST_ATTN_NORM_RSTD], a[MT_LT_OUT_PROJ], mtm_pw(m, lp->post_attn_norm),
                                Ns, D, eps, off, m->dt));
    MT_TRY(mtm_add_norm_gather(m, res, nrm, a[MT_LT_PRE_MLP_NORM_RSTD], x, d2, lp->pre_mlp_norm));
    if (g4_recompute(m, l, MT_LT_MLPWI_0)) {
        MT_TRY(mtm_param_open(m, lp->gate));
        MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_0], nrm, mtm_pw(m, lp->gate), N, D, F, 0.0f));
    }
    if (g4_recompute(m, l, MT_LT_MLPWI_1)) {
        MT_TRY(mtm_param_open(m, lp->up));
        MT_TRY(linear_fwd(m, a[MT_LT_MLPWI_1], nrm, mtm_pw(m, lp->up), N, D, F, 0.0f));
    }
    if (g4_recompute(m, l, MT_LT_MLPWO)) {
        MT_TRY(be->ops->glu_fwd(be, w0, a[MT_LT_MLPWI_0], a[MT_LT_MLPWI_1], N * F, m->cfg.mlp_activation, m->dt));
        MT_TRY(mtm_row_fwd(m, a[MT_LT_MLPWO], w0, lp->down, F, g4_fg(m, l), 0.0f, d2, NULL));
    }
    /* y2 = y1 + per-layer input: G <- dloss/dy1 */
    if (m->g4.P > 0) MT_TRY(g4_ple_bwd(m, l, a, G, res, d1, d2));

    /* ---- MLP: y1 = h + post_ffw(down(act(g) u)) ---- */
    /* d(down_proj output) [N, D]: under sequence parallelism this rank's rows, all-gathered */
    MT_TRY(be->ops->zero(be, AT(m, d1, s0 * D), ND));
    MT_TRY(mtm_grad_open(m, lp->post_ffw_norm));
    MT_TRY(mtm_param_open(m, lp->post_ffw_norm));
    MT_TRY(be->ops->rmsnorm_bwd(be, AT(m, d1, s0 * D), mtm_gw(m, lp->post_ffw_norm), G, a[MT_LT_MLPWO],
                                mtm_pw(m, lp->post_ffw_norm), a[MT_LT_POST_FFW_NORM_RSTD], Ns, D, off, m->dt));
    mtm_sp_gather(m, d1);
    MT_TRY(mtm_mlp_backward(m, l, a, d1, nrm, w0, d2, F, g4_fg(m, l)));
    const void *dn2 = mtm_tp_sum_input_grad(m, d2, d1); /* column-parallel gate/up: partial sums */
    MT_TRY(mtm_grad_open(m, lp->pre_mlp_norm));
    MT_TRY(mtm_param_open(m, lp->pre_mlp_norm));
    MT_TRY(be->ops->rmsnorm_bwd(be, G, mtm_gw(m, lp->pre_mlp_norm), dn2, res, mtm_pw(m, lp->pre_mlp_norm),
                                a[MT_LT_PRE_MLP_NORM_RSTD], Ns, D, off, m->dt));

    /* ---- attention: h = x + post_attn(o_proj(attn(q, k, v))) ---- */
    MT_TRY(be->ops->zero(be, AT(m, d1, s0 * D), ND));
    MT_TRY(mtm_grad_open(m, lp->post_attn_norm));
    MT_TRY(mtm_param_open(m, lp->post_attn_norm));
    MT_TRY(be->ops->rmsnorm_bwd(be, AT(m, d1, s0 * D), mtm_gw(m, lp->post_attn_norm), G, a[MT_LT_OUT_PROJ],
                                mtm_pw(m, lp->post_attn_norm), a[MT_LT_POST_ATTN_NORM_RSTD], Ns, D, off, m->dt));
    mtm_sp_gather(m, d1);
    MT_TRY(mtm_row_bwd_w(m, lp->o, d1, a[MT_LT_CONTEXT], QD, g4_qdg(m, l)));
    MT_TRY(mtm_row_bwd_x(m, w0, d1, lp->o, QD, g4_qdg(m, l), 0.0f)); /* dcontext */
    MT_TRY(mtm_cp_attention_bwd(m, l, w1, w2, w3, w0, a[MT_LT_QUERY_PROJ], a[MT_LT_KEY_PROJ], a[MT_LT_VALUE_PROJ],
                                a[MT_LT_CONTEXT], a[MT_LT_CONTEXT_LSE]));
    void *acc_k = G4B(m, k ? G4_SKV_DK1 : G4_SKV_DK0), *acc_v = G4B(m, k ? G4_SKV_DV1 : G4_SKV_DV0);
    if (donor >= 0) { /* the donor's K/V: their gradient waits in the kind's accumulator */
        MT_TRY(be->ops->axpy(be, acc_k, w2, 1.0f, N * KVD, m->dt));
        MT_TRY(be->ops->axpy(be, acc_v, w3, 1.0f, N * KVD, m->dt));
    } else if (mtm_g4_is_donor(m, l)) { /* add every sharing layer's */
        MT_TRY(be->ops->axpy(be, w2, acc_k, 1.0f, N * KVD, m->dt));
        MT_TRY(be->ops->axpy(be, w3, acc_v, 1.0f, N * KVD, m->dt));
    }
    MT_TRY(be->ops->rope_bwd(be, w1, pos, inv_freq, N, H, Dh, m->dt));
    MT_TRY(mtm_norm_gather(m, nrm, a[MT_LT_INPUT_NORM_RSTD], x, lp->in_norm)); /* recompute n1 */
    /* q: through q_norm to q_proj */
    MT_TRY(mtm_param_open(m, lp->q));
    MT_TRY(linear_fwd(m, w0, nrm, mtm_pw(m, lp->q), N, D, QD, 0.0f));
    MT_TRY(be->ops->zero(be, w4, (size_t)(N * QD) * m->es));
    MT_TRY(mtm_grad_open(m, lp->q_norm));
    MT_TRY(mtm_param_open(m, lp->q_norm));
    MT_TRY(be->ops->rmsnorm_bwd(be, w4, mtm_gw(m, lp->q_norm), w1, w0, mtm_pw(m, lp->q_norm), a[MT_LT_QUERY_NORM_RSTD],
                                N * H, Dh, off, m->dt));
    MT_TRY(mtm_linear_grad(m, lp->q, w4, nrm, N, D, QD));
    MT_TRY(mtm_param_open(m, lp->q));
    MT_TRY(linear_bwd_x(m, d2, w4, mtm_pw(m, lp->q), N, D, QD, 0.0f));
    if (donor < 0) {
        /* k: RoPE, k_norm, k_proj */
        MT_TRY(be->ops->rope_bwd(be, w2, pos, inv_freq, N, Hkv, Dh, m->dt));
        MT_TRY(mtm_param_open(m, lp->k));
        MT_TRY(linear_fwd(m, w0, nrm, mtm_pw(m, lp->k), N, D, KVD, 0.0f));
        MT_TRY(be->ops->zero(be, w1, (size_t)(N * KVD) * m->es));
        MT_TRY(mtm_grad_open(m, lp->k_norm));
        MT_TRY(mtm_param_open(m, lp->k_norm));
        MT_TRY(be->ops->rmsnorm_bwd(be, w1, mtm_gw(m, lp->k_norm), w2, w0, mtm_pw(m, lp->k_norm),
                                    a[MT_LT_KEY_NORM_RSTD], N * Hkv, Dh, off, m->dt));
        /* v: v_norm (statistics recomputed; its weightless scale's gradient discarded), v_proj */
        MT_TRY(mtm_param_open(m, lp->v));
        MT_TRY(linear_fwd(m, w0, nrm, mtm_pw(m, lp->v), N, D, KVD, 0.0f));
        MT_TRY(be->ops->rmsnorm_fwd(be, w2, G4B(m, G4_VRSTD), w0, G4B(m, G4_VZERO), N * Hkv, Dh, eps, 1.0f, m->dt));
        MT_TRY(be->ops->zero(be, w2, (size_t)(N * KVD) * m->es));
        MT_TRY(be->ops->zero(be, G4B(m, G4_VDW), (size_t)m->Dh * sizeof(float)));
        MT_TRY(be->ops->rmsnorm_bwd(be, w2, G4B(m, G4_VDW), w3, w0, G4B(m, G4_VZERO), G4B(m, G4_VRSTD), N * Hkv, Dh,
                                    1.0f, m->dt));
        MT_TRY(mtm_linear_grad(m, lp->k, w1, nrm, N, D, KVD));
        MT_TRY(mtm_linear_grad(m, lp->v, w2, nrm, N, D, KVD));
        MT_TRY(mtm_param_open(m, lp->k));
        MT_TRY(linear_bwd_x(m, d2, w1, mtm_pw(m, lp->k), N, D, KVD, 1.0f));
        MT_TRY(mtm_param_open(m, lp->v));
        MT_TRY(linear_bwd_x(m, d2, w2, mtm_pw(m, lp->v), N, D, KVD, 1.0f));
    }
    const void *dn1 = mtm_tp_sum_input_grad(m, d2, d1); /* column-parallel q/k/v: partial sums */
    MT_TRY(mtm_grad_open(m, lp->in_norm));
    MT_TRY(mtm_param_open(m, lp->in_norm));
    return be->ops->rmsnorm_bwd(be, G, mtm_gw(m, lp->in_norm), dn1, x, mtm_pw(m, lp->in_norm), a[MT_LT_INPUT_NORM_RSTD],
                                Ns, D, off, m->dt);
}

void mtm_g4_layer_recomputes(const mt_model *m, int64_t l, int *norm_gathers, int *row_fwds, int *context) {
    /* g4_recompute_attn and the MLP's recompute in mtm_g4_layer_backward */
    const int own = mt_model_layer_kv_donor(&m->cfg, l) < 0;
    *norm_gathers = g4_recompute(m, l, MT_LT_QUERY_PROJ) || (own && g4_recompute(m, l, MT_LT_KEY_PROJ)) ||
                    (own && g4_recompute(m, l, MT_LT_VALUE_PROJ));
    *row_fwds = g4_recompute(m, l, MT_LT_OUT_PROJ) + g4_recompute(m, l, MT_LT_MLPWO);
    *context = g4_recompute(m, l, MT_LT_CONTEXT);
}

/* Mirrors mtm_g4_layer_forward and mtm_g4_layer_backward above (g4_q_fwd, g4_kv_fwd,
 * g4_ple_fwd, g4_recompute_attn, g4_ple_bwd, times_scalar): each mtm_param_open in
 * order (as mtm_layer_param_order for the Llama family; checked against the code at
 * every open). A KV-sharing layer has no k / v / k_norm of its own. */
int mtm_g4_layer_param_order(const mt_model *m, int64_t l, int backward, int *out) {
    const layer_params *lp = &m->par.layer[l];
    const int own = mt_model_layer_kv_donor(&m->cfg, l) < 0, ple = m->g4.P > 0;
    int n = 0;
#define OPEN(i) mtm_order_push(out, &n, (i))
    if (!backward) {
        OPEN(lp->in_norm);
        OPEN(lp->q);
        OPEN(lp->q_norm);
        if (own) {
            OPEN(lp->k);
            OPEN(lp->k_norm);
            OPEN(lp->v);
        }
        OPEN(lp->o);
        OPEN(lp->post_attn_norm);
        OPEN(lp->pre_mlp_norm);
        OPEN(lp->gate);
        OPEN(lp->up);
        OPEN(lp->down);
        OPEN(lp->post_ffw_norm);
        if (ple) {
            OPEN(lp->ple_gate);
            OPEN(lp->ple_proj);
            OPEN(lp->ple_norm);
        }
        OPEN(lp->scalar);
        return n;
    }
    /* g4_recompute_attn */
    const int rq = g4_recompute(m, l, MT_LT_QUERY_PROJ);
    const int rk = own && g4_recompute(m, l, MT_LT_KEY_PROJ), rv = own && g4_recompute(m, l, MT_LT_VALUE_PROJ);
    if (rq || rk || rv) OPEN(lp->in_norm);
    if (rq) {
        OPEN(lp->q);
        OPEN(lp->q_norm);
    }
    if (rk) {
        OPEN(lp->k);
        OPEN(lp->k_norm);
    }
    if (rv) OPEN(lp->v);
    if (g4_recompute(m, l, MT_LT_OUT_PROJ)) OPEN(lp->o);
    OPEN(lp->scalar);
    /* h, n2 and the MLP's recompute */
    OPEN(lp->post_attn_norm);
    OPEN(lp->pre_mlp_norm);
    if (g4_recompute(m, l, MT_LT_MLPWI_0)) OPEN(lp->gate);
    if (g4_recompute(m, l, MT_LT_MLPWI_1)) OPEN(lp->up);
    if (g4_recompute(m, l, MT_LT_MLPWO)) OPEN(lp->down);
    if (ple) { /* g4_ple_bwd */
        OPEN(lp->post_ffw_norm);
        OPEN(lp->ple_gate);
        OPEN(lp->ple_proj);
        OPEN(lp->ple_norm);
        OPEN(lp->ple_proj);
        OPEN(lp->ple_gate);
    }
    /* the MLP */
    OPEN(lp->post_ffw_norm);
    OPEN(lp->down);
    OPEN(lp->up);
    OPEN(lp->gate);
    OPEN(lp->pre_mlp_norm);
    /* the attention */
    OPEN(lp->post_attn_norm);
    OPEN(lp->o);
    OPEN(lp->in_norm);
    OPEN(lp->q);
    OPEN(lp->q_norm);
    OPEN(lp->q);
    if (own) {
        OPEN(lp->k);
        OPEN(lp->k_norm);
        OPEN(lp->v);
        OPEN(lp->k);
        OPEN(lp->v);
    }
    OPEN(lp->in_norm);
#undef OPEN
    return n;
}
