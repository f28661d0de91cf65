/* models/model_loss.c: the step of a model (models/model.h): the inputs of a
 * micro-batch (tokens, positions, the document ids of packing), the forward through
 * embedding, layers and final norm, the vocab-tiled loss (kernels/tiled_loss.h; under
 * tensor parallelism the vocab-parallel loss of parallel/vocab_loss.h) with its VJP,
 * and the backward from the final hidden states down to the embedding; the public
 * entry points that run them (forward_backward, loss, hidden, backward_hidden, logits).
 *
 * Phases (model.h): 0 embed, 1 + l forward of layer l, L + 1 final norm and loss and
 * the final norm's backward, 2L + 1 - l backward of layer l, 2L + 2 embedding backward.
 * The tiled loss never holds full logits: per tile of rows, logits = h W^T, the loss,
 * dlogits in place, dh = dlogits W and dW += dlogits^T h (MaxText vocab tiling;
 * Wijmans et al. 2024, "Cut Your Losses in Large-Vocabulary Language Models"). With
 * vocabulary chunks (num_vocab_chunks > 1, model.h mt_model_vocab_tiling) the embedding
 * lookup and its backward and the unembedding inside the loss take the vocabulary a
 * chunk of rows at a time (parallel/vocab_loss.h mt_vocab_chunked_loss): under fsdp or
 * parameter offload each chunk is gathered or copied into a window, and with a gradient
 * sink each chunk's gradient goes to the sink on its own, so no [V, D] parameter or
 * gradient buffer is live. */
#include "models/model_internal.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/tiled_loss.h"
#include "parallel/vocab_loss.h"

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

/* Document masking (the layout's packing): the segment ids and per-document positions
 * of the whole window, computed from the caller's tokens [B, Tg] (every context rank
 * has them all), then this rank's rows and, under context parallelism, the key ids in
 * the order its attention sees the keys: [B, Tg] with rank r's rows at r * 2Tc as
 * cp_gather lays them out, or (ring) the block of rank r at r * N. Uploaded to the
 * buffers the layers read. No-op without packing, or without tokens (checked later). */
static mt_status MT_MUST_CHECK packing_upload(mt_model *m, const int32_t *tokens) {
    if (!m->pack.on || !tokens) return MT_OK;
    const int64_t B = m->B, Tg = m->Tg, T = m->T;
    for (int64_t b = 0; b < B; b++) {
        int32_t id = 0;
        int64_t start = 0; /* rows before the first separator: a document from an earlier window */
        for (int64_t t = 0; t < Tg; t++) {
            const int64_t n = b * Tg + t;
            if (tokens[n] == m->pack.sep) {
                id++;
                start = t;
            }
            m->pack.seg[n] = id;
            m->pack.pos[n] = (int32_t)(t - start);
        }
    }
    mt_backend *be = m->be;
    const int32_t *seg = mtm_cp_select(m, m->pack.seg, m->pack.lseg),
                  *pos = mtm_cp_select(m, m->pack.pos, m->pack.lpos);
    if (m->cp.size > 1) {
        for (int r = 0; r < m->cp.size; r++)
            for (int64_t b = 0; b < B; b++)
                for (int64_t j = 0; j < T; j++) {
                    const int32_t id = m->pack.seg[b * Tg + mtm_cp_position(m, r, j)];
                    m->pack.kseg[m->cp.ring ? ((int64_t)r * B + b) * T + j : b * Tg + (int64_t)r * T + j] = id;
                }
        MT_TRY(be->ops->copy_to_device(be, m->cp.buf[CP_KSEG], m->pack.kseg, (size_t)(B * Tg) * sizeof(int32_t)));
    }
    MT_TRY(be->ops->copy_to_device(be, m->plan.gptr[GB_SEGMENTS], seg, (size_t)m->N * sizeof(int32_t)));
    MT_TRY(be->ops->copy_to_device(be, m->plan.gptr[GB_DOC_POS], pos, (size_t)m->N * sizeof(int32_t)));
    return MT_OK;
}

/* Phases 0 .. L and the final norm of phase L + 1: tokens -> final_hidden. */
static mt_status MT_MUST_CHECK model_forward(mt_model *m, const int32_t *tokens) {
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D;
    MT_TRY(be->ops->copy_to_device(be, m->plan.gptr[GB_TOKENS], tokens, (size_t)N * sizeof(int32_t)));
    for (int64_t b = 0; b < m->B; b++) /* the same T positions for each of the B rows */
        MT_TRY(be->ops->copy_to_device(be, (int32_t *)m->plan.gptr[GB_POSITIONS] + b * m->T, m->pos_host,
                                       (size_t)m->T * sizeof(int32_t)));
    if (m->cp.size > 1)
        MT_TRY(be->ops->copy_to_device(be, m->cp.buf[CP_KPOS], m->cp.kpos_host, (size_t)m->Tg * sizeof(int32_t)));
    MT_TRY(be->ops->copy_to_device(be, m->plan.gptr[GB_INV_FREQ], m->inv_freq_host, (size_t)m->Dh * sizeof(float)));
    /* the compute copy from the fp32 master (mt_model_set_compute_rounding), before the
     * windows are filled from it */
    MT_TRY(mtm_refresh_compute(m));
    MT_TRY(mtm_fetch_global(m));
    MT_TRY(mtm_param_pass_begin(m, 0)); /* param_window_unit=weight: layer 0's first segment, prefetched */
    const int64_t Ns = seq_rows(m), s0 = seq_row0(m); /* sequence parallelism: this rank's rows */
    void *x0 = m->plan.lptr[0][MT_LT_DECODER_LAYER_INPUT];
    const int32_t *tok = (const int32_t *)m->plan.gptr[GB_TOKENS] + s0;
    if (mtm_vocab_windows(m)) { /* each chunk of embedding rows fills the rows of its tokens */
        for (int64_t c = 0; c < m->vc.C; c++) {
            int64_t a, b;
            const void *E = NULL;
            mtm_vocab_chunk(m, c, &a, &b);
            MT_TRY(mtm_vocab_rows(m, m->par.embed, a, b, MT_PWIN_VOCAB_EMBED, &E));
            MT_TRY(be->ops->embedding_fwd(be, x0, E, tok, Ns, a, b - a, D, m->emb_scale, m->dt));
        }
    } else {
        MT_TRY(be->ops->embedding_fwd(be, x0, mtm_pw(m, m->par.embed), tok, Ns, 0, m->V, D, m->emb_scale, m->dt));
    }
    if (m->g4.on) MT_TRY(mtm_g4_inputs_forward(m));
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) {
        MT_TRY(mtm_fetch_layer(m, l));
        mtm_prefetch_layer(m, l + 1); /* fsdp: layer l + 1's all-gather overlaps layer l */
        MT_TRY(mtm_layer_forward(m, l));
    }
    /* the loss needs every row's hidden state (each tensor rank computes its vocabulary
     * slice of all rows): under sequence parallelism all-gathered */
    MT_TRY(be->ops->rmsnorm_fwd(be, AT(m, m->plan.gptr[GB_FINAL_HIDDEN], s0 * D), m->plan.gptr[GB_FINAL_RSTD],
                                m->plan.gptr[GB_FINAL_INPUT], mtm_pw(m, m->par.final_norm), Ns, D, m->eps, m->w_off,
                                m->dt));
    mtm_sp_gather(m, m->plan.gptr[GB_FINAL_HIDDEN]);
    return MT_OK;
}

/* The unembedding's parameter: lm_head, or the tied embedding. */
static int unembedding_index(const mt_model *m) {
    return m->cfg.logits_via_embedding ? m->par.embed : m->par.lm_head;
}

const void *mtm_unembedding(const mt_model *m) { return mtm_pw(m, unembedding_index(m)); }

/* ---- the unembedding in vocabulary chunks (mt_vocab_chunk_source over the model) ---- */

static mt_status unembedding_rows(void *ctx, int64_t a, int64_t b, const void **W) {
    mt_model *m = ctx;
    return mtm_vocab_rows(m, unembedding_index(m), a, b, MT_PWIN_VOCAB_HEAD, W);
}

/* Where rows [a, b) of the unembedding's gradient add up: the chunk window (zeroed,
 * once the sink is done with the previous chunk), or the rows of the whole gradient
 * (no sink, or no chunks: tied, the embedding's window then collects the loss's and
 * the lookup's shares until the lookup's backward). */
static mt_status unembedding_grad_begin(void *ctx, int64_t a, int64_t b, float **dW) {
    mt_model *m = ctx;
    if (!mtm_vocab_grad_windows(m)) {
        *dW = mtm_gw(m, unembedding_index(m)) + a * m->D;
        return MT_OK;
    }
    float *win = m->sink.ptr[MT_GWIN_VOCAB_HEAD];
    if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, win));
    MT_TRY(m->be->ops->zero(m->be, win, (size_t)((b - a) * m->D) * sizeof(float)));
    *dW = win;
    return MT_OK;
}

static mt_status unembedding_grad_end(void *ctx, int64_t a, int64_t b, float *dW) {
    mt_model *m = ctx;
    if (!mtm_vocab_grad_windows(m)) return MT_OK;
    MT_TRY(mtm_comm_status(m));
    /* tied: the loss's share of the embedding's rows, the first of two (embedding_backward) */
    return m->sink.fn(m->sink.ctx, m->par.info[unembedding_index(m)].offset + a * m->D, (b - a) * m->D, dW, 0);
}

/* A backward without the loss (mt_model_backward_hidden) with the unembedding in
 * chunks: an untied lm_head's gradient, zero, handed over chunk by chunk all the same,
 * so that every element reaches the sink once (a tied table's rows go once, from the
 * lookup, with add = 0). */
static mt_status unembedding_zero_shares(mt_model *m) {
    if (!mtm_vocab_grad_windows(m) || m->sink.loss_shares || m->cfg.logits_via_embedding) return MT_OK;
    for (int64_t c = 0; c < m->vc.C; c++) {
        int64_t a, b;
        float *dW = NULL;
        mtm_vocab_chunk(m, c, &a, &b);
        MT_TRY(unembedding_grad_begin(m, a, b, &dW));
        MT_TRY(unembedding_grad_end(m, a, b, dW));
    }
    if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, m->sink.ptr[MT_GWIN_VOCAB_HEAD]));
    return MT_OK;
}

/* The embedding's backward, phase 2L + 2: dE += the rows of G by token; with chunked
 * gradient windows one chunk of rows at a time, each handed to the sink (tied: as the
 * second share of rows the loss handed over already, add = 1). */
static mt_status embedding_backward(mt_model *m, const void *G) {
    mt_backend *be = m->be;
    const int64_t D = m->D, Ns = seq_rows(m);
    const int32_t *tok = (const int32_t *)m->plan.gptr[GB_TOKENS] + seq_row0(m);
    if (!mtm_vocab_grad_windows(m)) {
        if (m->sink.fn && !m->cfg.logits_via_embedding)
            MT_TRY(be->ops->zero(be, m->sink.ptr[MT_GWIN_EMBEDDING],
                                 (size_t)m->par.info[m->par.embed].numel * sizeof(float)));
        if (m->tp.rank == 0 || m->tp.sp)
            MT_TRY(be->ops->embedding_bwd(be, mtm_gw(m, m->par.embed), G, tok, Ns, 0, m->V, D, m->emb_scale, m->dt));
        if (m->sink.fn) { /* the embedding's gradient is complete: hand its window over */
            MT_TRY(m->sink.fn(m->sink.ctx, m->par.info[m->par.embed].offset, m->par.info[m->par.embed].numel,
                              m->sink.ptr[MT_GWIN_EMBEDDING], 0));
            if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, NULL)); /* every window is done when we return */
        }
        return MT_OK;
    }
    float *win = m->sink.ptr[MT_GWIN_VOCAB_EMBED]; /* no tensor axis with chunks (mt_model_create) */
    for (int64_t c = 0; c < m->vc.C; c++) {
        int64_t a, b;
        mtm_vocab_chunk(m, c, &a, &b);
        MT_TRY(mtm_table_chunk_backward(m, win, m->par.info[m->par.embed].offset, G, tok, Ns, a, b, D, m->emb_scale,
                                        m->cfg.logits_via_embedding && m->sink.loss_shares));
    }
    if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, NULL));
    return MT_OK;
}

static mt_status check_ready(const mt_model *m, const char *fn) {
    if (!m) return mt_set_error(MT_ERR_INVALID, "%s: model is NULL", fn);
    if (!m->plan.bound) return mt_set_error(MT_ERR_INVALID, "%s: model not bound to an arena", fn);
    if (m->dec.on)
        return mt_set_error(MT_ERR_INVALID, "%s: this model was planned for incremental decoding "
                            "(mt_model_set_decode): use mt_model_decode_step", fn);
    if ((m->remat.has_offload || m->pwin.offload) && !m->host.bound)
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
    m->plan.fwd_kept = 0;
    void *G = m->plan.gptr[GB_RESID_GRAD];
    MT_TRY(be->ops->zero(be, G, (size_t)(Ns * D) * m->es));
    if (m->g4.on) MT_TRY(mtm_g4_backward_begin(m));
    /* dloss/dfinal_hidden [N, D] is the same on every tensor rank; under sequence
     * parallelism each rank takes its rows */
    MT_TRY(be->ops->rmsnorm_bwd(be, G, mtm_gw(m, m->par.final_norm), AT(m, m->plan.gptr[GB_FINAL_HIDDEN_GRAD], s0 * D),
                                m->plan.gptr[GB_FINAL_INPUT], mtm_pw(m, m->par.final_norm), m->plan.gptr[GB_FINAL_RSTD],
                                Ns, D, m->w_off, m->dt));
    /* The sink's work on a window (parallel/zero1.c: an op, or a collective that the
     * communicator orders after the compute stream with events) is queued after the
     * backward that wrote it and before the next write: no host wait here (a step reads
     * the device only for its loss and norm: tests/test_emu_syncs.c). */
    MT_TRY(unembedding_zero_shares(m));
    if (m->sink.fn) { /* model.norm and lm_head are complete (phase L + 1): hand the tail window over */
        float *tail = m->sink.ptr[MT_GWIN_TAIL];
        MT_TRY(m->sink.fn(m->sink.ctx, m->par.tail_off, mtm_tail_grad_numel(m), tail, 0));
        /* the tail window is planned for the loss phase alone (the layer windows may
         * reuse its memory): an asynchronous sink finishes it here */
        if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, tail));
    }
    MT_TRY(mtm_param_pass_begin(m, 1)); /* param_window_unit=weight */
    for (int64_t l = m->cfg.num_decoder_layers - 1; l >= 0; l--) {
        MT_TRY(mtm_fetch_layer(m, l));
        mtm_prefetch_layer(m, l - 1); /* fsdp: layer l - 1's all-gather overlaps layer l */
        /* with a sink each parameter's window is opened before its first write
         * (mtm_grad_open) and handed over when the next opens; the last, and those not
         * written, at the layer's end */
        mtm_grad_layer_begin(m, l);
        MT_TRY(mtm_grad_layer_end(m, mtm_layer_backward(m, l)));
    }
    MT_TRY(mtm_comm_status(m));
    /* the layer windows end with phase 2L + 1: an asynchronous sink finishes them here */
    if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, NULL));
    /* phase 2L + 2 (tensor parallel: G is the same on every rank of the group; only
     * rank 0 adds it, so the group's sum of embedding gradients counts it once; under
     * sequence parallelism each rank adds its own rows) */
    if (m->g4.on) MT_TRY(mtm_g4_inputs_backward(m, G)); /* adds the per-layer inputs' share to G */
    return embedding_backward(m, G);
}

/* The forward (and with `backward` the backward) of one micro-batch, its loss sum and
 * labelled count ADDED to the step statistics (GB_STEP_STATS [0], [1]). */
static mt_status forward_loss(mt_model *m, const int32_t *tokens, const int32_t *labels, float dscale,
                              int backward) {
    MT_TRY(check_ready(m, backward ? "mt_model_forward_backward" : "mt_model_loss"));
    MT_TRY(packing_upload(m, tokens)); /* from the whole window, before the rank's rows are taken */
    tokens = mtm_cp_select(m, tokens, m->cp.tok);
    labels = mtm_cp_select(m, labels, m->cp.lab);
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    MT_TRY(check_ids(m, labels, "labels", 1));
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D;
    mtm_comm_status_reset(m);
    m->plan.fwd_kept = 0;
    MT_TRY(model_forward(m, tokens));
    MT_TRY(mtm_comm_status(m));

    /* phase L + 1: vocab-tiled loss (and its VJP), final norm backward */
    MT_TRY(be->ops->copy_to_device(be, m->plan.gptr[GB_LABELS], labels, (size_t)N * sizeof(int32_t)));
    mt_tiled_loss_args la = {.N = N, .D = D, .V = m->V, .num_tiles = m->tiles,
                             .softcap = m->cfg.final_logits_soft_cap, .ignore_index = MT_IGNORE_LABEL,
                             .dscale = dscale};
    double *stats = m->plan.gptr[GB_STEP_STATS];
    void *dh = backward ? m->plan.gptr[GB_FINAL_HIDDEN_GRAD] : NULL;
    float *dW = NULL;
    if (backward) MT_TRY(mtm_grad_windows_begin(m));
    if (backward && m->vc.C == 1) dW = mtm_gw(m, unembedding_index(m));
    if (m->vc.C > 1) { /* the unembedding in vocabulary chunks (no tensor axis: mt_model_create) */
        const mt_vocab_loss_args va = {.N = N, .D = D, .v0 = 0, .Vl = m->V, .num_tiles = m->tiles,
                                       .softcap = la.softcap, .ignore_index = la.ignore_index, .dscale = dscale};
        const mt_vocab_chunk_source src = {m->vc.C, m, unembedding_rows, unembedding_grad_begin,
                                           unembedding_grad_end};
        MT_TRY(mt_vocab_chunked_loss(be, NULL, &va, &src, m->plan.gptr[GB_FINAL_HIDDEN], m->dt,
                                     m->plan.gptr[GB_LABELS], m->plan.gptr[GB_LOSS_TILE], m->plan.gptr[GB_LOSS_DTILE],
                                     m->plan.gptr[GB_LOSS_VOCAB_STATS], m->plan.gptr[GB_LOSS_DH_ACC], dh, stats));
        m->sink.loss_shares = backward && mtm_vocab_grad_windows(m); /* this loss handed its chunks over */
        /* the chunk window lives in the loss phase alone: an asynchronous sink finishes it here */
        if (m->sink.loss_shares && m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, m->sink.ptr[MT_GWIN_VOCAB_HEAD]));
    } else if (m->tp.size > 1) { /* vocab-parallel: this rank's rows [v0, v0 + Vl) of the unembedding */
        const mt_vocab_loss_args va = {.N = N, .D = D, .v0 = m->tp.v0, .Vl = m->tp.Vl, .num_tiles = m->tiles,
                                       .softcap = la.softcap, .ignore_index = la.ignore_index, .dscale = dscale};
        MT_TRY(mt_vocab_parallel_loss(be, m->tp.comm, &va, m->plan.gptr[GB_FINAL_HIDDEN],
                                      AT(m, mtm_unembedding(m), m->tp.v0 * D), m->dt, m->plan.gptr[GB_LABELS],
                                      m->plan.gptr[GB_LOSS_TILE], m->plan.gptr[GB_LOSS_DTILE],
                                      m->plan.gptr[GB_LOSS_VOCAB_STATS], dh, dW ? dW + m->tp.v0 * D : NULL, stats));
    } else {
        MT_TRY(mt_tiled_loss(be, &la, m->plan.gptr[GB_FINAL_HIDDEN], mtm_unembedding(m), m->dt, m->plan.gptr[GB_LABELS],
                             m->plan.gptr[GB_LOSS_TILE], m->plan.gptr[GB_LOSS_DTILE], dh, dW, stats));
    }
    if (!backward) {
        m->plan.fwd_kept = 1; /* mt_model_backward_hidden may follow */
        return MT_OK;
    }
    return backward_from_final_hidden(m);
}

/* Zero the loss statistics, run forward_loss, read them (one synchronising copy). */
static mt_status loss_read(mt_model *m, const int32_t *tokens, const int32_t *labels, float dscale, int backward,
                           double *loss_sum, int64_t *count) {
    MT_TRY(check_ready(m, backward ? "mt_model_forward_backward" : "mt_model_loss"));
    double acc[2] = {0.0, 0.0};
    MT_TRY(m->be->ops->copy_to_device(m->be, m->plan.gptr[GB_STEP_STATS], acc, sizeof acc));
    MT_TRY(forward_loss(m, tokens, labels, dscale, backward));
    MT_TRY(m->be->ops->copy_to_host(m->be, acc, m->plan.gptr[GB_STEP_STATS], sizeof acc));
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
    if (m->cp.size > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_hidden: under context parallelism each rank holds only "
                            "its chunks");
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    if (!hidden) return mt_set_error(MT_ERR_INVALID, "mt_model_hidden: hidden is NULL");
    MT_TRY(packing_upload(m, tokens));
    mtm_comm_status_reset(m);
    m->plan.fwd_kept = 0;
    MT_TRY(model_forward(m, tokens));
    MT_TRY(mtm_comm_status(m)); /* tensor parallel: the row-parallel all-reduces */
    const int64_t n = m->N * m->D;
    MT_TRY(m->be->ops->copy_to_host(m->be, hidden, m->plan.gptr[GB_FINAL_HIDDEN], (size_t)n * m->es));
    if (m->dt == MT_BF16) /* widen in place from the end: element i's bf16 bits lie at or below its float */
        for (int64_t i = n - 1; i >= 0; i--) hidden[i] = mt_bf16_to_f32(((const mt_bf16 *)hidden)[i]);
    m->plan.fwd_kept = 1; /* mt_model_backward_hidden may follow */
    return MT_OK;
}

mt_status mt_model_backward_hidden(mt_model *m, const float *dhidden) {
    MT_TRY(check_ready(m, "mt_model_backward_hidden"));
    if (!dhidden) return mt_set_error(MT_ERR_INVALID, "mt_model_backward_hidden: dhidden is NULL");
    if (m->cp.size > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_backward_hidden: under context parallelism each rank "
                            "holds only its chunks (as for mt_model_hidden)");
    if (!m->plan.fwd_kept)
        return mt_set_error(MT_ERR_INVALID, "mt_model_backward_hidden: no forward to differentiate (call "
                            "mt_model_hidden or mt_model_loss first; a backward consumes the forward)");
    const int64_t n = m->N * m->D;
    if (m->dt == MT_BF16) { /* rounded to the activation dtype (RNE), as the loss's dh would be */
        mt_bf16 *h = malloc((size_t)n * sizeof(mt_bf16));
        if (!h) return mt_set_error(MT_ERR_OOM, "mt_model_backward_hidden: out of memory");
        mt_f32_to_bf16_array(h, dhidden, (size_t)n);
        const mt_status st =
                m->be->ops->copy_to_device(m->be, m->plan.gptr[GB_FINAL_HIDDEN_GRAD], h, (size_t)n * m->es);
        free(h);
        MT_TRY(st);
    } else {
        MT_TRY(m->be->ops->copy_to_device(m->be, m->plan.gptr[GB_FINAL_HIDDEN_GRAD], dhidden,
                                          (size_t)n * sizeof(float)));
    }
    mtm_comm_status_reset(m);
    MT_TRY(mtm_grad_windows_begin(m));
    return backward_from_final_hidden(m);
}

mt_status mt_model_logits(mt_model *m, const int32_t *tokens, float *logits) {
    MT_TRY(check_ready(m, "mt_model_logits"));
    if (m->tp.size > 1 || m->cp.size > 1)
        return mt_set_error(MT_ERR_UNSUPPORTED, "mt_model_logits: full logits under tensor parallelism are not "
                            "gathered (use mt_model_loss)");
    MT_TRY(check_ids(m, tokens, "tokens", 0));
    if (!logits) return mt_set_error(MT_ERR_INVALID, "mt_model_logits: logits is NULL");
    MT_TRY(packing_upload(m, tokens));
    m->plan.fwd_kept = 0; /* mt_model_backward_hidden follows mt_model_hidden / mt_model_loss only */
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D, V = m->V;
    MT_TRY(model_forward(m, tokens));
    const void *h = m->plan.gptr[GB_FINAL_HIDDEN];
    float *tile = m->plan.gptr[GB_LOSS_TILE];
    const float cap = m->cfg.final_logits_soft_cap;
    for (int64_t t = 0; t < m->tiles; t++) {
        /* the row split of kernels/tiled_loss.h */
        const int64_t r0 = t * N / m->tiles, r1 = (t + 1) * N / m->tiles, R = r1 - r0;
        if (R <= 0) continue;
        float *dst = logits + r0 * V;
        for (int64_t c = 0; c < m->vc.C; c++) { /* the vocabulary chunks (one: the whole unembedding) */
            int64_t a, b;
            const void *W = NULL;
            mtm_vocab_chunk(m, c, &a, &b);
            MT_TRY(mtm_vocab_rows(m, unembedding_index(m), a, b, MT_PWIN_VOCAB_HEAD, &W));
            MT_TRY(be->ops->gemm(be, 0, 1, R, b - a, D, 1.0f, AT(m, h, r0 * D), D, W, D, m->dt, 0.0f, tile, b - a,
                                 MT_F32));
            if (b - a == V)
                MT_TRY(be->ops->copy_to_host(be, dst, tile, (size_t)(R * V) * sizeof(float)));
            else
                for (int64_t r = 0; r < R; r++)
                    MT_TRY(be->ops->copy_to_host(be, dst + r * V + a, tile + r * (b - a),
                                                 (size_t)(b - a) * sizeof(float)));
        }
        if (cap > 0.0f)
            for (int64_t i = 0; i < R * V; i++) dst[i] = cap * tanhf(dst[i] / cap);
    }
    return MT_OK;
}
