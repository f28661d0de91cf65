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
 * backward only when layer l + 2 reused the slot. With param_window_unit=weight the two
 * slots hold a segment of a layer each (about one weight; below, mtm_param_open).
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
 * reduce-scatter of one parameter overlaps the backward of the next. With
 * grad_window_chunks = k a 2-D layer weight's gradient comes in k row blocks, each
 * its own window and hand-over (mtm_weight_grad), so a window is 1/k of the weight. */
#include "models/model_internal.h"

#include <assert.h>
#include <stdlib.h>

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
    if (m->pwin.weights) { /* the slot holding its segment (mtm_param_open) */
        const int64_t a = m->pwin.seg_a[i];
        const int s = m->pwin.slots.held[0] == a ? 0 : m->pwin.slots.held[1] == a ? 1 : -1;
        assert(s >= 0); /* mtm_param_open(m, i) first */
        return s >= 0 ? AT(m, m->pwin.ptr[MT_PWIN_LAYER0 + s], (off - a) + tp) : NULL;
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
    if (!params_windowed(m) || m->pwin.weights) return MT_OK; /* weight units: mtm_param_open */
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
    if (m->fsdp.size == 1 || m->pwin.weights || l < 0 || l >= m->cfg.num_decoder_layers || m->fsdp.req) return;
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
    m->pwin.slots.held[0] = m->pwin.slots.held[1] = -1;
    m->pwin.slots.cur = m->pwin.pending = -1; /* the wait above completed any prefetch */
    return MT_OK;
}

/* ---- param_window_unit=weight: the layer slots hold a segment each ----
 * A layer's parameters (consecutive in the flat buffer) are packed in order into
 * segments of at most the largest one's numel, so each slot is the size of the largest
 * weight (mlp.down_proj's, say) instead of a layer. The layer code opens each parameter
 * before reading it (mtm_param_open), in the order mtm_layer_param_order lists; the
 * segment goes to the slot not opened last unless it is resident, and the next segment
 * of that order is prefetched (fsdp) into the other slot while this one computes. With
 * remat the backward reads a layer's weights twice (recompute, then the input
 * gradients), so segments that left the slots between are gathered again: the price of
 * the smaller windows, counted by mtm_weight_gather_floats from the same order and the
 * same slot choices (wslots_step). */

/* The slot segment a (flat start) is opened in: the one holding it, else the slot not
 * opened last, then holding a (*fill = 1: it must be filled). */
static int wslots_take(mtm_wslots *w, int64_t a, int *fill) {
    *fill = 0;
    for (int s = 0; s < MT_PWIN_LAYER_SLOTS; s++)
        if (w->held[s] == a) return s;
    *fill = 1;
    const int s = w->cur < 0 ? 0 : 1 - w->cur;
    w->held[s] = a;
    return s;
}

mt_status mtm_weight_segments(mt_model *m) {
    if (!m->pwin.weights) return MT_OK;
    m->pwin.seg_a = malloc(sizeof(int64_t) * (size_t)m->par.count);
    m->pwin.seg_n = malloc(sizeof(int64_t) * (size_t)m->par.count);
    if (!m->pwin.seg_a || !m->pwin.seg_n) return mt_set_error(MT_ERR_OOM, "model: out of memory (segments)");
    const int64_t cap = m->par.weight_numel;
    m->pwin.seg_max = 0;
    for (int i = 0; i < m->par.count; i++) m->pwin.seg_a[i] = m->pwin.seg_n[i] = -1;
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) {
        const layer_params *lp = &m->par.layer[l];
        int first = lp->in_norm; /* the segment being packed: parameters first .. i - 1 */
        for (int i = lp->in_norm; i <= lp->down + 1; i++) {
            const int64_t a = m->par.info[first].offset;
            const int end = i > lp->down;
            if (!end && m->par.info[i].offset + m->par.info[i].numel - a <= cap) continue;
            const int64_t n = m->par.info[i - 1].offset + m->par.info[i - 1].numel - a;
            for (int j = first; j < i; j++) {
                m->pwin.seg_a[j] = a;
                m->pwin.seg_n[j] = n;
            }
            m->pwin.seg_max = max64(m->pwin.seg_max, n);
            first = i;
        }
    }
    return MT_OK;
}

mt_status mtm_weight_orders(mt_model *m) {
    if (!m->pwin.weights) return MT_OK;
    const int64_t L = m->cfg.num_decoder_layers;
    for (int p = 0; p < 2; p++) {
        free(m->pwin.order[p]);
        m->pwin.order[p] = malloc(sizeof(int) * (size_t)(L * MTM_LAYER_OPENS_MAX));
        if (!m->pwin.order[p]) return mt_set_error(MT_ERR_OOM, "model: out of memory (window order)");
        int64_t n = 0;
        for (int64_t k = 0; k < L; k++) /* forward: layers 0 .. L - 1, backward: L - 1 .. 0 */
            n += mtm_layer_param_order(m, p ? L - 1 - k : k, p, m->pwin.order[p] + n);
        m->pwin.order_n[p] = n;
    }
    return MT_OK;
}

/* The pass's next segment after entry k that is not segment a, or -1. */
static int64_t next_segment(const mt_model *m, int pass, int64_t k, int64_t a) {
    for (; k < m->pwin.order_n[pass]; k++) {
        const int64_t b = m->pwin.seg_a[m->pwin.order[pass][k]];
        if (b != a) return m->pwin.order[pass][k];
    }
    return -1;
}

/* One step of pass p's opens, the one decision the windows (mtm_param_pass_begin,
 * mtm_param_open) and the gather count (mtm_weight_gather_floats) both take, so that
 * they agree: entry k of the order is opened (k = -1: the pass begins, nothing opened),
 * its segment taken into a slot (*open_slot, -1 for k = -1; *open_fill 1 when it must be
 * filled), then with fsdp the next segment of the order prefetched into the other slot
 * unless it is there (*pre the parameter whose segment is, -1 none; *pre_slot). */
static void wslots_step(const mt_model *m, mtm_wslots *w, int p, int64_t k, int *open_slot, int *open_fill,
                        int *pre, int *pre_slot) {
    const int *o = m->pwin.order[p];
    *open_slot = *pre = *pre_slot = -1;
    *open_fill = 0;
    int64_t a = -1;
    if (k >= 0) {
        a = m->pwin.seg_a[o[k]];
        *open_slot = wslots_take(w, a, open_fill);
        w->cur = *open_slot;
    }
    const int next = k < 0 ? (m->pwin.order_n[p] > 0 ? o[0] : -1) : (int)next_segment(m, p, k + 1, a);
    if (next < 0 || m->fsdp.size == 1) return; /* parameter offload alone: each open copies */
    int fill;
    const int s = wslots_take(w, m->pwin.seg_a[next], &fill);
    if (!fill) return;
    *pre = next;
    *pre_slot = s;
}

/* Start the gather of parameter i's segment into slot s (asynchronous: completed by
 * mtm_fsdp_wait, one in flight at a time). */
static void weight_prefetch(mt_model *m, int i, int s) {
    if (i < 0) return;
    mtm_fsdp_wait(m);
    mtm_fsdp_gather(m, m->pwin.ptr[MT_PWIN_LAYER0 + s], m->pwin.seg_a[i], m->pwin.seg_a[i] + m->pwin.seg_n[i], 1);
    m->pwin.pending = s;
}

mt_status mtm_param_pass_begin(mt_model *m, int backward) {
    if (!m->pwin.weights) return MT_OK;
    m->pwin.pass = backward != 0;
    m->pwin.cursor = 0;
    m->pwin.open = -1;
    int s, fill, pre, ps;
    wslots_step(m, &m->pwin.slots, m->pwin.pass, -1, &s, &fill, &pre, &ps);
    weight_prefetch(m, pre, ps);
    return mtm_comm_status(m);
}

mt_status mtm_param_open(mt_model *m, int i) {
    if (!m->pwin.weights || m->par.layer_of[i] < 0 || m->pwin.open == i) return MT_OK;
    const int p = m->pwin.pass;
    const int64_t k = m->pwin.cursor;
    if (k >= m->pwin.order_n[p] || m->pwin.order[p][k] != i)
        return mt_set_error(MT_ERR_RUNTIME, "model: %s opened out of its planned order in the %s pass (entry %lld: "
                            "%s expected; mtm_layer_param_order and the layer code disagree)", m->par.info[i].name,
                            p ? "backward" : "forward", (long long)k,
                            k < m->pwin.order_n[p] ? m->par.info[m->pwin.order[p][k]].name : "nothing");
    m->pwin.cursor++;
    m->pwin.open = i;
    const int64_t a = m->pwin.seg_a[i], n = m->pwin.seg_n[i];
    int s, fill, pre, ps;
    wslots_step(m, &m->pwin.slots, p, k, &s, &fill, &pre, &ps);
    if (fill) {
        const mt_status st = mtm_window_fill(m, m->pwin.ptr[MT_PWIN_LAYER0 + s], a, a + n); /* waits first */
        if (st != MT_OK) { /* the slots hold nothing usable; the next forward starts over */
            m->pwin.slots.held[s] = -1;
            if (ps >= 0) m->pwin.slots.held[ps] = -1; /* its prefetch was not started */
            m->pwin.open = -1;
            return st;
        }
    } else if (m->pwin.pending == s) {
        mtm_fsdp_wait(m);
    }
    if (m->fsdp.req == NULL) m->pwin.pending = -1;
    weight_prefetch(m, pre, ps);
    return mtm_comm_status(m);
}

int64_t mtm_weight_gather_floats(const mt_model *m, int64_t (*own)(const mt_model *, int, int64_t, int64_t)) {
    if (!m->pwin.weights) return 0;
    mtm_wslots w = {{-1, -1}, -1}; /* emptied by the forward's mtm_fetch_global */
    int64_t f = 0;
    for (int p = 0; p < 2; p++) /* one forward, then one backward, as the windows step through them */
        for (int64_t k = -1; k < m->pwin.order_n[p]; k++) {
            int s, fill, pre, ps;
            wslots_step(m, &w, p, k, &s, &fill, &pre, &ps);
            const int fills[2] = {fill && k >= 0 ? m->pwin.order[p][k] : -1, pre};
            for (int j = 0; j < 2; j++)
                if (fills[j] >= 0) {
                    const int64_t a = m->pwin.seg_a[fills[j]], n = m->pwin.seg_n[fills[j]];
                    f += n - own(m, m->fsdp.rank, a, a + n);
                }
        }
    return f;
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
    const int64_t cols = mtm_param_cols(&m->par.info[i]);
    if (m->sink.open_r1 == mtm_param_rows(&m->par.info[i])) m->sink.done |= 1ull << (i - m->par.layer[m->sink.layer].in_norm);
    m->sink.handed++;
    MT_TRY(mtm_comm_status(m));
    return m->sink.fn(m->sink.ctx, m->par.info[i].offset + m->sink.open_r0 * cols,
                      (m->sink.open_r1 - m->sink.open_r0) * cols, m->sink.open_win, 0);
}

int64_t mtm_grad_block_rows(const mt_model *m, int i) {
    const int64_t rows = mtm_param_rows(&m->par.info[i]);
    return !m->sink.fn || m->sink.chunks <= 1 ? rows : (rows + m->sink.chunks - 1) / m->sink.chunks;
}

int64_t mtm_grad_window_numel(const mt_model *m) {
    int64_t n = 1;
    for (int i = 0; i < m->par.count; i++)
        if (m->par.layer_of[i] >= 0)
            n = max64(n, mtm_grad_block_rows(m, i) * mtm_param_cols(&m->par.info[i]));
    return n;
}

/* Open the window of rows [r0, r1) of layer parameter i (1-D: its one row): hand the
 * open block over and take the next slot, zeroed. Rows of a parameter come in order, in
 * one stretch. */
static mt_status grad_open_rows(mt_model *m, int i, int64_t r0, int64_t r1) {
    if (m->sink.open == i && m->sink.open_r0 == r0) return MT_OK;
    const int again = m->sink.open == i && r0 == m->sink.open_r1; /* the next block of the open one */
    MT_TRY(grad_hand_over(m));
    const int64_t l = m->sink.layer;
    if (l < 0 || m->par.layer_of[i] != l)
        return mt_set_error(MT_ERR_INVALID, "model: the gradient of %s written outside its layer's backward",
                            m->par.info[i].name);
    if (m->sink.done >> (i - m->par.layer[l].in_norm) & 1 || (r0 > 0 && !again))
        return mt_set_error(MT_ERR_INVALID, "model: the gradient of %s written again after its hand-over to the "
                            "gradient sink", m->par.info[i].name);
    /* the next slot (alternating with an asynchronous sink, once the reduce-scatter that
     * last read it is complete), zeroed */
    float *win = m->sink.ptr[m->sink.wait && m->sink.handed % 2 ? MT_GWIN_LAYER1 : MT_GWIN_LAYER];
    if (m->sink.wait) MT_TRY(m->sink.wait(m->sink.ctx, win));
    MT_TRY(m->be->ops->zero(m->be, win, (size_t)((r1 - r0) * mtm_param_cols(&m->par.info[i])) * sizeof(float)));
    m->sink.open = i;
    m->sink.open_r0 = r0;
    m->sink.open_r1 = r1;
    m->sink.open_win = win;
    return MT_OK;
}

mt_status mtm_grad_open(mt_model *m, int i) {
    if (!m->sink.fn || m->par.layer_of[i] < 0 || (m->sink.open == i && m->sink.open_r0 == 0)) return MT_OK;
    const int64_t rows = mtm_param_rows(&m->par.info[i]);
    assert(mtm_grad_block_rows(m, i) == rows); /* blocks: mtm_weight_grad */
    return grad_open_rows(m, i, 0, rows);
}

mt_status mtm_weight_grad(mt_model *m, int i, const void *dy, int64_t lda, const void *x, int64_t N, int64_t rows,
                          int64_t cols, int64_t ldw) {
    const int64_t R = mtm_grad_block_rows(m, i);
    if (R >= rows) { /* whole (no sink, or no blocks) */
        MT_TRY(mtm_grad_open(m, i));
        return m->be->ops->gemm(m->be, 1, 0, rows, cols, N, 1.0f, dy, lda, x, cols, m->dt, 1.0f, mtm_gw(m, i),
                                ldw, MT_F32);
    }
    assert(ldw == cols); /* blocks: tensor parallelism is refused (model.c), so no slice offset or stride */
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        const int64_t r1 = r0 + R < rows ? r0 + R : rows;
        MT_TRY(grad_open_rows(m, i, r0, r1));
        MT_TRY(m->be->ops->gemm(m->be, 1, 0, r1 - r0, cols, N, 1.0f, AT(m, dy, r0), lda, x, cols, m->dt, 1.0f,
                                m->sink.open_win, ldw, MT_F32));
    }
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
            const int64_t rows = mtm_param_rows(&m->par.info[i]), R = mtm_grad_block_rows(m, i);
            for (int64_t r0 = 0; st == MT_OK && r0 < rows; r0 += R) /* each block's open hands the last over */
                st = grad_open_rows(m, i, r0, r0 + R < rows ? r0 + R : rows);
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
