/* models/model_windows.c: where the layers find a parameter and put its gradient.
 *
 * Parameter windows (the layout's param_offload, and fsdp): the device holds two
 * layer windows (layer l in slot l % 2, layer_numel elements of the compute dtype
 * each) and a global window (embedding, then model.norm and lm_head) instead of the
 * flat parameters; they are filled from the host pool by copies (offload), or by
 * all-gathers of the ranks' shards (fsdp: model_shard.c mtm_fsdp_gather) of the fp32
 * master or, with dtype bfloat16, of bf16 values each rank rounds from its master into
 * its place in the window (the bits of the compute copy, mtm_refresh_compute), the
 * layer gathers prefetched one
 * layer ahead. A layer's window is fetched before its forward and again before its
 * backward only when layer l + 2 reused the slot.
 *
 * Gradient windows (mt_model_set_grad_sink): one layer parameter's gradient at a time
 * (opened by the layer backward before its first write, mtm_grad_open, handed over when
 * the next one opens, so that the window is the largest weight, not the layer), the
 * embedding's and the tail's (model.norm, lm_head) instead of the full buffer, or with
 * the vocabulary in chunks one chunk of the unembedding's rows in the loss and one of
 * the embedding's in its backward (a tied table's rows are handed over twice, the second
 * share added: mt_grad_sink_fn); each is zeroed before its first write and handed to
 * the sink when complete (model_loss.c). With an asynchronous sink
 * (mt_model_set_grad_sink_wait) two layer windows alternate, so that the sink's
 * reduce-scatter of one parameter overlaps the backward of the next. */
#include "models/model_internal.h"

#include <assert.h>

/* Parameter i (its tensor-parallel slice: model_shard.c) as the layers compute with
 * it, of m->dt: the fp32 master, or with dtype bfloat16 the bf16 compute copy
 * (GB_COMPUTE_W, the same flat layout); with parameter windows the window holding it
 * (filled from the master or, bf16, from the compute copy). */
const void *mtm_pw(const mt_model *m, int i) {
    const int64_t tp = m->tp.off ? m->tp.off[i] : 0, off = m->par.info[i].offset;
    if (!params_windowed(m))
        return AT(m, m->plan.gptr[m->dt != MT_F32 ? GB_COMPUTE_W : GB_PARAMS], off + tp);
    /* parameter host offload / fsdp: the device window holding parameter i */
    const int l = m->par.layer_of[i];
    if (l < 0) { /* with vocabulary windows the embedding and lm_head come from mtm_vocab_rows */
        const int64_t emb = mtm_vocab_windows(m) ? 0 : m->par.info[m->par.embed].numel;
        return AT(m, m->pwin.ptr[MT_PWIN_GLOBAL], (off < emb ? off : emb + off - m->par.tail_off) + tp);
    }
    const int s = m->pwin.layer[0] == l ? 0 : 1; /* the slot holding layer l */
    return AT(m, m->pwin.ptr[MT_PWIN_LAYER0 + s], (off - m->par.info[m->par.layer[l].in_norm].offset) + tp);
}

/* The compute copy of dtype bfloat16, element g of the flat buffer rounded with the
 * stochastic-rounding bits of (seed, t * numel + g) whichever rank holds it: an fsdp
 * shard [lo, hi) rounds its elements at offset t * numel + lo, so it is bitwise that
 * slice of the one-process copy (layout-invariant). The fsdp gathers then move the
 * compute copy (es bytes per element), never the fp32 master. Complete the fsdp
 * prefetch in flight first (it may read the old copy). */
mt_status mtm_refresh_compute(mt_model *m) {
    if (m->dt == MT_F32) return MT_OK;
    mtm_fsdp_wait(m);
    if (mtm_fsdp_rounds_in_window(m)) return MT_OK; /* no copy: each gather rounds its part */
    const int64_t lo = m->fsdp.size > 1 ? m->fsdp.lo : 0, hi = m->fsdp.size > 1 ? m->fsdp.hi : m->par.numel;
    return m->be->ops->from_f32(m->be, m->plan.gptr[GB_COMPUTE_W], m->dt, m->plan.gptr[GB_PARAMS], hi - lo, 1,
                                m->sr_seed, (uint64_t)m->sr_t * (uint64_t)m->par.numel + (uint64_t)lo);
}

/* The source of the parameter windows without fsdp (parameter host offload): the fp32
 * master, or the compute copy (both in the host pool). */
static const void *window_source(const mt_model *m) {
    return m->plan.gptr[m->dt != MT_F32 ? GB_COMPUTE_W : GB_PARAMS];
}

/* Parameter host offload: bring layer l's parameters into its window (slot l % 2; a
 * no-op when it is there already), and the embedding, final norm and head into the
 * global window at the start of every forward (the optimizer may have changed them).
 * fsdp: first complete the prefetch in flight (mtm_prefetch_layer), which may be layer l. */
mt_status mtm_fetch_layer(mt_model *m, int64_t l) {
    if (!params_windowed(m)) return MT_OK;
    mtm_fsdp_wait(m);
    const int s = (int)(l % 2);
    if (m->pwin.layer[s] == l) return MT_OK;
    const int64_t a = m->par.info[m->par.layer[l].in_norm].offset, n = mtm_layer_numel(m, l);
    MT_TRY(mtm_window_fill(m, m->pwin.ptr[MT_PWIN_LAYER0 + s], a, a + n));
    m->pwin.layer[s] = l;
    return MT_OK;
}

/* fsdp prefetch: start the all-gather of layer l's window (slot l % 2) so that it
 * overlaps the layer being computed (forward: l = current + 1; backward: l = current -
 * 1, whose slot the current layer does not use); mtm_fetch_layer(l) waits for it. A no-op
 * outside [0, L), without fsdp, when l is in its slot already or while another
 * prefetch is in flight, so it gathers exactly the layers mtm_fetch_layer would have
 * (mt_model_fsdp_gather_floats holds) and needs no window beyond the two layer slots. */
void mtm_prefetch_layer(mt_model *m, int64_t l) {
    if (m->fsdp.size == 1 || l < 0 || l >= m->cfg.num_decoder_layers || m->fsdp.req) return;
    const int s = (int)(l % 2);
    if (m->pwin.layer[s] == l) return;
    const int64_t a = m->par.info[m->par.layer[l].in_norm].offset;
    mtm_fsdp_gather(m, m->pwin.ptr[MT_PWIN_LAYER0 + s], a, a + mtm_layer_numel(m, l), 1);
    m->pwin.layer[s] = m->fsdp.status == MT_OK ? l : -1;
}

/* The global window (embedding, model.norm, lm_head; with vocabulary windows model.norm
 * only: mtm_global_window_numel), at the start of every forward. */
mt_status mtm_fetch_global(mt_model *m) {
    if (!params_windowed(m)) return MT_OK;
    mtm_fsdp_wait(m);
    const int64_t n = mtm_global_window_numel(m), emb = mtm_vocab_windows(m) ? 0 : m->par.info[m->par.embed].numel;
    if (emb > 0) MT_TRY(mtm_window_fill(m, m->pwin.ptr[MT_PWIN_GLOBAL], 0, emb));
    MT_TRY(mtm_window_fill(m, AT(m, m->pwin.ptr[MT_PWIN_GLOBAL], emb), m->par.tail_off, m->par.tail_off + n - emb));
    m->pwin.layer[0] = m->pwin.layer[1] = -1;
    return MT_OK;
}

mt_status mtm_window_fill(mt_model *m, void *win, int64_t a, int64_t b) {
    if (m->fsdp.size > 1) {
        mtm_fsdp_wait(m);
        mtm_fsdp_gather(m, win, a, b, 0);
        return m->fsdp.status;
    }
    return m->be->ops->copy_to_device(m->be, win, AT(m, window_source(m), a), (size_t)(b - a) * m->es);
}

mt_status mtm_vocab_rows(mt_model *m, int i, int64_t a, int64_t b, int w, const void **rows) {
    const int64_t D = m->D, off = m->par.info[i].offset + a * D;
    if (!mtm_vocab_windows(m)) {
        *rows = AT(m, mtm_pw(m, i), a * D);
        return MT_OK;
    }
    *rows = m->pwin.ptr[w];
    return mtm_window_fill(m, m->pwin.ptr[w], off, off + (b - a) * D);
}

mt_status mtm_table_chunk_backward(mt_model *m, float *win, int64_t off, const void *G, const int32_t *tok, int64_t N,
                                   int64_t a, int64_t b, int64_t width, float scale, int add) {
    mt_backend *be = m->be;
    if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, win));
    MT_TRY(be->ops->zero(be, win, (size_t)((b - a) * width) * sizeof(float)));
    MT_TRY(be->ops->embedding_bwd(be, win, G, tok, N, a, b - a, width, scale, m->dt));
    return m->sink.fn(m->sink.ctx, off + a * width, (b - a) * width, win, add);
}

/* sink.done has a bit per parameter of a layer */
_Static_assert(sizeof(layer_params) / sizeof(int) < 64, "a layer has fewer than 64 parameters");

/* Hand the open layer parameter's window over to the sink: its gradient is complete
 * (the layer backwards write each parameter in one stretch, opened by mtm_grad_open). */
static mt_status grad_hand_over(mt_model *m) {
    const int i = m->sink.open;
    if (i < 0) return MT_OK;
    m->sink.open = -1;
    m->sink.done |= 1ull << (i - m->par.layer[m->sink.layer].in_norm);
    m->sink.handed++;
    MT_TRY(mtm_comm_status(m));
    return m->sink.fn(m->sink.ctx, m->par.info[i].offset, m->par.info[i].numel, m->sink.open_win, 0);
}

mt_status mtm_grad_open(mt_model *m, int i) {
    if (!m->sink.fn || m->par.layer_of[i] < 0 || m->sink.open == i) return MT_OK;
    MT_TRY(grad_hand_over(m));
    const int64_t l = m->sink.layer;
    if (l < 0 || m->par.layer_of[i] != l)
        return mt_set_error(MT_ERR_INVALID, "model: the gradient of %s written outside its layer's backward",
                            m->par.info[i].name);
    if (m->sink.done >> (i - m->par.layer[l].in_norm) & 1)
        return mt_set_error(MT_ERR_INVALID, "model: the gradient of %s written again after its hand-over to the "
                            "gradient sink", m->par.info[i].name);
    /* the next slot (alternating with an asynchronous sink, once the reduce-scatter that
     * last read it is complete), zeroed */
    float *win = m->sink.ptr[m->sink.wait && m->sink.handed % 2 ? MT_GWIN_LAYER1 : MT_GWIN_LAYER];
    if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, win));
    MT_TRY(m->be->ops->zero(m->be, win, (size_t)m->par.info[i].numel * sizeof(float)));
    m->sink.open = i;
    m->sink.open_win = win;
    return MT_OK;
}

/* The gradient of parameter i (its tensor-parallel slice): in the full buffer, or with
 * a gradient sink in its own window (layer parameters: opened by mtm_grad_open), the
 * embedding window or the tail window (model.norm, lm_head). */
float *mtm_gw(const mt_model *m, int i) {
    const int64_t tp = m->tp.off ? m->tp.off[i] : 0, off = m->par.info[i].offset;
    if (!m->sink.fn) return (float *)m->plan.gptr[GB_GRADS] + off + tp;
    if (m->par.layer_of[i] >= 0) {
        assert(m->sink.open == i); /* mtm_grad_open(m, i) first */
        return m->sink.open == i ? m->sink.open_win + tp : NULL;
    }
    if (i == m->par.embed) return m->sink.ptr[MT_GWIN_EMBEDDING] + tp;
    return m->sink.ptr[MT_GWIN_TAIL] + (off - m->par.tail_off) + tp;
}

void mtm_grad_layer_begin(mt_model *m, int64_t l) {
    m->sink.layer = l;
    m->sink.open = -1;
    m->sink.done = 0;
}

mt_status mtm_grad_layer_end(mt_model *m, mt_status backward) {
    if (!m->sink.fn || m->sink.layer < 0) return backward;
    mt_status st = backward;
    if (st == MT_OK) st = grad_hand_over(m);
    const layer_params *lp = &m->par.layer[m->sink.layer];
    for (int i = lp->in_norm; st == MT_OK && i <= lp->down; i++) /* not written by this backward: zeros */
        if (!(m->sink.done >> (i - lp->in_norm) & 1)) {
            st = mtm_grad_open(m, i);
            if (st == MT_OK) st = grad_hand_over(m);
        }
    m->sink.layer = -1;
    m->sink.open = -1;
    return st;
}

/* Gradient sink, before a backward: zero the tail window and (tied: the loss adds to
 * it) the embedding window; an untied embedding window is zeroed before its backward. */
mt_status mtm_grad_windows_begin(mt_model *m) {
    if (!m->sink.fn) return MT_OK;
    m->sink.loss_shares = 0;
    m->sink.handed = 0;
    MT_TRY(m->be->ops->zero(m->be, m->sink.ptr[MT_GWIN_TAIL], (size_t)mtm_tail_grad_numel(m) * sizeof(float)));
    if (m->cfg.logits_via_embedding && !mtm_vocab_grad_windows(m)) /* else the chunk windows */
        MT_TRY(m->be->ops->zero(m->be, m->sink.ptr[MT_GWIN_EMBEDDING],
                                (size_t)m->par.info[m->par.embed].numel * sizeof(float)));
    return MT_OK;
}
