/* models/model_shard.c: the collectives that cut a layer over ranks, which know the
 * layer's shapes, and their set-up from the layout:
 *   tensor parallelism    Megatron-LM, Shoeybi et al. 2019 (arXiv:1909.08053), section 3
 *   sequence parallelism  Korthikanti et al. 2022 (arXiv:2205.05198), section 4.2.2
 *   context parallelism   Liu et al. 2023, Ring Attention (arXiv:2310.01889), with
 *                         Megatron-LM's causal load balancing; all-gather or ring
 *   fsdp                  ZeRO-3 style sharding: Rajbhandari et al. 2020 (arXiv:1910.02054),
 *                         Zhao et al. 2023, "PyTorch FSDP" (arXiv:2304.11277)
 * Each group keeps the first failure of the pass in its own status (m->tp.status,
 * m->cp.status, m->fsdp.status; model_internal.h) and skips its later collectives;
 * the step checks them (mtm_comm_status) where it needs the results.
 *
 * Bytes per rank and micro-batch, payloads of the activation dtype (es = 4 bytes with
 * float32, 2 with bfloat16; the loss's row statistics stay fp32 / fp64), N = batch x
 * local rows, D = emb_dim, KVD = local kv width, L layers; the bytes a rank SENDS, as
 * parallel/comm.h accounts them: an all-reduce of S elements 2 (n - 1) / n x es S, an
 * all-gather or reduce-scatter of S elements in total (n - 1) / n x es S over a group
 * of n:
 *   tensor (no sequence parallelism): per layer 2 all-reduces of N x D in the forward
 *     (o_proj, down_proj outputs), 2 in the backward (the q/k/v and gate/up input
 *     gradients), plus one per recomputed out_proj / mlpwo (remat); the loss's
 *     vocab-parallel max and sums (parallel/vocab_loss.h).
 *   sequence parallelism: the same all-reduces become 4 all-gathers / reduce-scatters
 *     of N x D in the forward and 6 in the backward per layer (all tensors kept), plus
 *     one all-gather of the input norm when q / k / v are recomputed and one
 *     reduce-scatter per recomputed out_proj / mlpwo (mtm_layer_recomputes), and one
 *     all-gather of the final hidden states.
 *   context, all-gather (C ranks): per layer 2 all-gathers of B x seq x KVD (K, V) in
 *     the forward, 2 more in the backward (plus 2 when context is recomputed) and 2
 *     reduce-scatters of the same size (dK, dV).
 *   context, ring: per layer 2 (C - 1) sends of N x KVD x es bytes in the forward,
 *     4 (C - 1) + 2 in the backward (blocks travel with their gradients, then home),
 *     plus the forward's 2 (C - 1) again when context is recomputed.
 *   fsdp: mt_model_fsdp_gather_floats (model.h) x es bytes (4 fp32, 2 with dtype
 *     bfloat16: the compute copy's values) per forward + backward: the
 *     embedding and tail minus this rank's part once, each layer's window minus its
 *     part once in the forward and again in the backward for layers 0 .. L - 3. */
#include "models/model_internal.h"

#include <stdlib.h>

/* ------------------------------------------------------------------------------ */
/* tensor parallelism                                                              */

/* Column-parallel q/k/v and gate/up: rank t computes its heads' / its mlp columns'
 * rows of the weight, a contiguous block (mtm_pw's slice offset is all it takes).
 * Row-parallel o_proj and down_proj: rank t reads the matching columns (row stride =
 * the global input width) and its output is a partial sum, all-reduced over the
 * tensor group. Backward: the column-parallel input gradient (d of the normed input)
 * is a partial sum, all-reduced before the norm's backward; the row-parallel input
 * gradient is local. With one rank these are exactly linear_fwd/_bwd_w/_bwd_x. */

/* The payload type of the activation collectives (tensor, sequence, context): the
 * activation dtype m->dt. With bfloat16 the payloads are bf16 and so are the sums.
 * Where the rounding happens (dtype=bfloat16): as Megatron-LM does (its tensor-parallel
 * all-reduce and reduce-scatter take the activations in the model's dtype:
 * megatron/core/tensor_parallel/mappings.py _reduce, _reduce_scatter_along_first_dim),
 * each rank's GEMM rounds its partial sum to bf16 once, and the group sums the bf16
 * partials with parallel/comm.h's bf16 sum (fp32 add of the widened values, one rounding
 * per step). The alternative, fp32 partial sums reduced in fp32 and rounded once, would
 * be closer to one process (one rounding in all) at twice the bytes and an fp32 copy of
 * each reduced buffer. One process rounds the whole fp32 sum p = p_1 + ... + p_n once;
 * a group of n rounds 2n - 1 times (the n partials, n - 1 combinations): |result - p|
 * <= (2n - 1) u sum_i |p_i| to first order, u = 2^-8, so the two differ by 2n roundings
 * (tests/test_mpi_layouts.sh derives its bound from this count). Gathers and ring sends
 * move bf16 values unchanged (exact). */
static mt_comm_dtype act_cd(const mt_model *m) { return m->dt == MT_F32 ? MT_COMM_F32 : MT_COMM_BF16; }

/* x[n] of m->dt summed over the tensor group in place (an all-reduce of n elements). */
static void tp_sum(mt_model *m, void *x, int64_t n) {
    if (m->tp.size > 1 && m->tp.status == MT_OK) m->tp.status = mt_comm_all_reduce(m->tp.comm, x, n, act_cd(m));
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
 * reduce-scatters of N x D elements in the forward, 6 in the backward (all tensors
 * kept), each moving (tp - 1) / tp of N x D x es bytes. Without it these helpers are
 * the plain full-row ops. */

/* full[N, D]: this rank's rows [row0, row0 + rows) already written there; under
 * sequence parallelism all-gather the other ranks' rows (no-op otherwise). */
void mtm_sp_gather(mt_model *m, void *full) {
    if (!m->tp.sp || m->tp.status != MT_OK) return;
    m->tp.status = mt_comm_all_gather(m->tp.comm, AT(m, full, seq_row0(m) * m->D), full, m->tp.sp_counts, act_cd(m));
}

/* full[N, D] = RMSNorm(x) where x holds this rank's residual rows (all rows without
 * sequence parallelism); rstd gets this rank's rows' statistics. */
mt_status mtm_norm_gather(mt_model *m, void *full, float *rstd, const void *x, int wi) {
    MT_TRY(mtm_param_open(m, wi));
    MT_TRY(m->be->ops->rmsnorm_fwd(m->be, AT(m, full, seq_row0(m) * m->D), rstd, x, mtm_pw(m, wi), seq_rows(m), m->D,
                                   m->eps, m->w_off, m->dt));
    mtm_sp_gather(m, full);
    return MT_OK;
}

/* h = x + r on this rank's residual rows (one rounding), and full[N, D] = RMSNorm(h)
 * gathered as mtm_norm_gather does: the residual add fused into the norm (ops.h
 * add_rmsnorm_fwd), bitwise the copy + axpy + mtm_norm_gather it replaces. */
mt_status mtm_add_norm_gather(mt_model *m, void *h, void *full, float *rstd, const void *x,
                                               const void *r, int wi) {
    MT_TRY(mtm_param_open(m, wi));
    MT_TRY(m->be->ops->add_rmsnorm_fwd(m->be, h, AT(m, full, seq_row0(m) * m->D), rstd, x, r, mtm_pw(m, wi),
                                       seq_rows(m), m->D, m->eps, m->w_off, m->dt));
    mtm_sp_gather(m, full);
    return MT_OK;
}

/* The partial input gradient d[N, D] of the column-parallel GEMMs summed over the
 * tensor group: all-reduced in place (returns d), or under sequence parallelism
 * reduce-scattered into this rank's rows of part[seq_rows, D] (returns part). */
const void *mtm_tp_sum_input_grad(mt_model *m, void *d, void *part) {
    if (!m->tp.sp) {
        tp_sum(m, d, m->N * m->D);
        return d;
    }
    if (m->tp.status == MT_OK) m->tp.status = mt_comm_reduce_scatter(m->tp.comm, d, part, m->tp.sp_counts, act_cd(m));
    return part;
}

/* y = (beta: y +) sum over the group of x[N, in_l] W_slice^T; W_slice = columns of
 * parameter pi with row stride ldw. y has N rows, or seq_rows under sequence
 * parallelism (the sum reduce-scattered). full [N, D] scratch is needed under sequence
 * parallelism; part [N, D] (sequence parallel: [seq_rows, D]) when beta != 0 and tp > 1. */
mt_status mtm_row_fwd(mt_model *m, void *y, const void *x, int pi, int64_t in_l, int64_t ldw,
                                       float beta, void *full, void *part) {
    mt_backend *be = m->be;
    const int64_t N = m->N, D = m->D;
    MT_TRY(mtm_param_open(m, pi));
    if (m->tp.size == 1)
        return be->ops->gemm(be, 0, 1, N, D, in_l, 1.0f, x, in_l, mtm_pw(m, pi), ldw, m->dt, beta, y, D, m->dt);
    void *dst = beta == 0.0f ? y : part;
    if (m->tp.sp) {
        MT_TRY(be->ops->gemm(be, 0, 1, N, D, in_l, 1.0f, x, in_l, mtm_pw(m, pi), ldw, m->dt, 0.0f, full, D, m->dt));
        if (m->tp.status == MT_OK)
            m->tp.status = mt_comm_reduce_scatter(m->tp.comm, full, dst, m->tp.sp_counts, act_cd(m));
    } else {
        MT_TRY(be->ops->gemm(be, 0, 1, N, D, in_l, 1.0f, x, in_l, mtm_pw(m, pi), ldw, m->dt, 0.0f, dst, D, m->dt));
        tp_sum(m, dst, N * D);
    }
    if (beta != 0.0f) MT_TRY(be->ops->axpy(be, y, part, 1.0f, seq_rows(m) * D, m->dt));
    return MT_OK;
}
/* dW_slice[D, in_l] (fp32, row stride ldw) += dy[N, D]^T x[N, in_l]; with a gradient
 * sink, into the window mtm_grad_open opens for pi here */
mt_status mtm_row_bwd_w(mt_model *m, int pi, const void *dy, const void *x, int64_t in_l,
                                         int64_t ldw) {
    return mtm_weight_grad(m, pi, dy, m->D, x, m->N, m->D, in_l, ldw);
}
/* dx[N, in_l] = dy[N, D] W_slice + beta dx */
mt_status mtm_row_bwd_x(mt_model *m, void *dx, const void *dy, int pi, int64_t in_l, int64_t ldw,
                                         float beta) {
    MT_TRY(mtm_param_open(m, pi));
    return m->be->ops->gemm(m->be, 0, 0, m->N, in_l, m->D, 1.0f, dy, m->D, mtm_pw(m, pi), ldw, m->dt, beta, dx, in_l,
                            m->dt);
}

/* gemma4's per-layer-input parameters: the per-layer embedding, its projection and
 * norm, and each layer's gate, projection and norm. Every tensor rank computes them
 * whole from the replicated residual stream (model_gemma4.c), so without sequence
 * parallelism their gradients are replicated, 2-D ones included. */
static int g4_ple_param(const mt_model *m, int i) {
    if (i == m->par.ple_embed || i == m->par.ple_model_proj || i == m->par.ple_proj_norm) return 1;
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) {
        const layer_params *lp = &m->par.layer[l];
        if (i == lp->ple_gate || i == lp->ple_proj || i == lp->ple_norm) return 1;
    }
    return 0;
}

int mt_model_tp_grad_replicated(const mt_model *m, int i) {
    if (!m || m->tp.size == 1 || m->tp.sp || i < 0 || i >= m->par.count) return 0;
    if (m->g4.on && g4_ple_param(m, i)) return 1;
    if (m->par.info[i].ndim != 1) return 0;
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++)
        if (i == m->par.layer[l].q_norm || i == m->par.layer[l].k_norm)
            return 0; /* summed over the heads of each rank */
    return 1;
}

/* ------------------------------------------------------------------------------ */
/* context parallelism                                                             */

/* The sequence is cut into 2C chunks of Tc rows, rank i holds chunks i and 2C-1-i of
 * every sequence (rows [B, 2Tc]). RoPE and the causal mask use the original positions.
 * All-gather strategy: K and V (after RoPE) are all-gathered over the context group
 * and reordered to [B, Tg] (k_pos gives each gathered row's original position), then
 * attention of the local queries against all keys; backward: K and V are gathered
 * again, the attention backward gives dK, dV for all keys, which are reduce-scattered
 * back to their owners. With one rank these are exactly the attention ops. */

/* ---- ring strategy: K/V blocks travel around the context group (rank r sends to
 * r + 1); after step s rank r holds the block of rank (r - s) mod C. Forward: each
 * block's attention (q_pos / k_pos the original positions) is merged into the
 * running output with the online-softmax rule (Milakov & Gimelshein 2018; the op
 * attn_merge of kernels/ops.h):
 * lse = log(e^lse_a + e^lse_b), out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
 * Backward: with the final out and lse, each block's attention backward gives exact
 * per-block dq (summed here) and dK/dV, which travel with the block and are sent
 * home after the last step. */

/* The layer's K/V width on this rank: Hkv x the attention's head dim (gemma4's
 * global layers have a larger one than m->Dh's local layers; the buffers are sized by
 * the largest, m->KVD). */
static int64_t cp_kvd(const mt_model *m, const mt_attn_args *args) { return m->Hkv * args->Dh; }

/* Each of send[nbuf] ([N, kvd] blocks) to rank r + 1, recv[] from rank r - 1. */
static void cp_ring_pass(mt_model *m, void *const *send, void *const *recv, int nbuf, int64_t kvd) {
    const int C = m->cp.size, r = m->cp.rank;
    for (int i = 0; i < nbuf && m->cp.status == MT_OK; i++)
        m->cp.status = mt_comm_sendrecv(m->cp.comm, send[i], (r + 1) % C, recv[i], (r + C - 1) % C, m->N * kvd,
                                        act_cd(m));
}

/* out/lse (running, [B, Tq, H, Dh] / [B, H, Tq]) merged with one block's ob/lb. */

static mt_status MT_MUST_CHECK cp_ring_fwd(mt_model *m, mt_attn_args *args, void *out, float *lse, const void *q,
                                           const void *k, const void *v) {
    const int C = m->cp.size, r = m->cp.rank;
    const int64_t kvd = cp_kvd(m, args);
    const size_t kvb = (size_t)(m->N * kvd) * m->es;
    void *kb[2] = {m->cp.buf[CP_RK0], m->cp.buf[CP_RK1]}, *vb[2] = {m->cp.buf[CP_RV0], m->cp.buf[CP_RV1]};
    MT_TRY(m->be->ops->copy(m->be, kb[0], k, kvb));
    MT_TRY(m->be->ops->copy(m->be, vb[0], v, kvb));
    for (int s = 0; s < C; s++) {
        const int cur = s & 1, src = (r - s + C) % C;
        args->k_pos = (const int32_t *)m->cp.buf[CP_KPOS] + (int64_t)src * m->T;
        if (m->pack.on) args->k_seg = (const int32_t *)m->cp.buf[CP_KSEG] + (int64_t)src * m->N;
        if (s == 0) {
            MT_TRY(m->be->ops->attention_fwd(m->be, args, out, lse, q, kb[cur], vb[cur]));
        } else {
            MT_TRY(m->be->ops->attention_fwd(m->be, args, m->cp.buf[CP_ROUT], m->cp.buf[CP_RLSE], q, kb[cur], vb[cur]));
            MT_TRY(m->be->ops->attn_merge(m->be, out, lse, m->cp.buf[CP_ROUT], m->cp.buf[CP_RLSE], m->B, m->T, m->H,
                                          args->Dh, m->dt));
        }
        if (s + 1 < C) {
            void *snd[2] = {kb[cur], vb[cur]}, *rcv[2] = {kb[!cur], vb[!cur]};
            cp_ring_pass(m, snd, rcv, 2, kvd);
        }
    }
    return MT_OK;
}

static mt_status MT_MUST_CHECK cp_ring_bwd(mt_model *m, mt_attn_args *args, void *dq, void *dk, void *dv,
                                           const void *dout, const void *q, const void *k, const void *v,
                                           const void *out, const float *lse) {
    const int C = m->cp.size, r = m->cp.rank;
    const int64_t kvd = cp_kvd(m, args), nq = m->N * m->H * args->Dh, nkv = m->N * kvd;
    const size_t kvb = (size_t)nkv * m->es;
    void *kb[2] = {m->cp.buf[CP_RK0], m->cp.buf[CP_RK1]}, *vb[2] = {m->cp.buf[CP_RV0], m->cp.buf[CP_RV1]};
    void *dkb[2] = {m->cp.buf[CP_RDK0], m->cp.buf[CP_RDK1]}, *dvb[2] = {m->cp.buf[CP_RDV0], m->cp.buf[CP_RDV1]};
    void *dqs = m->cp.buf[CP_ROUT];
    MT_TRY(m->be->ops->copy(m->be, kb[0], k, kvb));
    MT_TRY(m->be->ops->copy(m->be, vb[0], v, kvb));
    MT_TRY(m->be->ops->zero(m->be, dkb[0], kvb));
    MT_TRY(m->be->ops->zero(m->be, dvb[0], kvb));
    int cur = 0;
    for (int s = 0; s < C; s++) {
        cur = s & 1;
        const int src = (r - s + C) % C;
        args->k_pos = (const int32_t *)m->cp.buf[CP_KPOS] + (int64_t)src * m->T;
        if (m->pack.on) args->k_seg = (const int32_t *)m->cp.buf[CP_KSEG] + (int64_t)src * m->N;
        /* dk, dv (the caller's outputs) serve as this block's scratch */
        MT_TRY(m->be->ops->attention_bwd(m->be, args, s == 0 ? dq : dqs, dk, dv, dout, q, kb[cur], vb[cur], out, lse));
        if (s > 0) MT_TRY(m->be->ops->axpy(m->be, dq, dqs, 1.0f, nq, m->dt));
        MT_TRY(m->be->ops->axpy(m->be, dkb[cur], dk, 1.0f, nkv, m->dt));
        MT_TRY(m->be->ops->axpy(m->be, dvb[cur], dv, 1.0f, nkv, m->dt));
        if (s + 1 < C) {
            void *snd[4] = {kb[cur], vb[cur], dkb[cur], dvb[cur]}, *rcv[4] = {kb[!cur], vb[!cur], dkb[!cur], dvb[!cur]};
            cp_ring_pass(m, snd, rcv, 4, kvd);
        }
    }
    /* the block now here belongs to rank r + 1: send its gradients home, receive ours */
    void *snd[2] = {dkb[cur], dvb[cur]}, *rcv[2] = {dk, dv};
    cp_ring_pass(m, snd, rcv, 2, kvd);
    return MT_OK;
}

/* full[B, Tg, KVD] (rank-major chunks reordered per sequence) = gather of x[B, 2Tc, KVD]. */
static mt_status MT_MUST_CHECK cp_gather(mt_model *m, void *full, const void *x, int64_t KVD) {
    const int64_t C = m->cp.size, B = m->B, Tl = m->T, blk = B * Tl * KVD;
    void *stage = m->cp.buf[CP_STAGE];
    int64_t counts[C];
    for (int64_t r = 0; r < C; r++) counts[r] = blk;
    if (m->cp.status == MT_OK) m->cp.status = mt_comm_all_gather(m->cp.comm, x, stage, counts, act_cd(m));
    for (int64_t r = 0; r < C; r++)
        for (int64_t b = 0; b < B; b++)
            MT_TRY(m->be->ops->copy(m->be, AT(m, full, (b * m->Tg + r * Tl) * KVD),
                                    AT(m, stage, r * blk + b * Tl * KVD), (size_t)(Tl * KVD) * m->es));
    return MT_OK;
}

/* x[B, 2Tc, KVD] = this rank's rows of the group's sum of full[B, Tg, KVD]. */
static mt_status MT_MUST_CHECK cp_scatter(mt_model *m, void *x, const void *full, int64_t KVD) {
    const int64_t C = m->cp.size, B = m->B, Tl = m->T, blk = B * Tl * KVD;
    void *stage = m->cp.buf[CP_STAGE];
    int64_t counts[C];
    for (int64_t r = 0; r < C; r++) {
        counts[r] = blk;
        for (int64_t b = 0; b < B; b++)
            MT_TRY(m->be->ops->copy(m->be, AT(m, stage, r * blk + b * Tl * KVD),
                                    AT(m, full, (b * m->Tg + r * Tl) * KVD), (size_t)(Tl * KVD) * m->es));
    }
    if (m->cp.status == MT_OK) m->cp.status = mt_comm_reduce_scatter(m->cp.comm, stage, x, counts, act_cd(m));
    return MT_OK;
}

/* Context all-gather: the group's K and V into CP_K / CP_V, and args set to attend to
 * them (all Tg keys with their gathered positions and, with packing, segments). */
static mt_status cp_gather_kv(mt_model *m, mt_attn_args *args, const void *k, const void *v) {
    MT_TRY(cp_gather(m, m->cp.buf[CP_K], k, cp_kvd(m, args)));
    MT_TRY(cp_gather(m, m->cp.buf[CP_V], v, cp_kvd(m, args)));
    args->Tk = m->Tg;
    args->k_pos = m->cp.buf[CP_KPOS];
    if (m->pack.on) args->k_seg = m->cp.buf[CP_KSEG];
    return MT_OK;
}

mt_status mtm_cp_attention_fwd(mt_model *m, int64_t l, void *out, float *lse, const void *q,
                                                const void *k, const void *v) {
    mt_attn_args args = mtm_attn_args(m, l);
    if (m->pack.on) args.q_seg = args.k_seg = m->plan.gptr[GB_SEGMENTS]; /* k_seg: see the CP cases */
    if (m->cp.size == 1) {
        MT_TRY(m->be->ops->attention_fwd(m->be, &args, out, lse, q, k, v));
        return MT_OK;
    }
    args.q_pos = m->plan.gptr[GB_POSITIONS]; /* the same 2Tc positions for every sequence */
    if (m->cp.ring) {
        MT_TRY(cp_ring_fwd(m, &args, out, lse, q, k, v));
        return MT_OK;
    }
    MT_TRY(cp_gather_kv(m, &args, k, v));
    MT_TRY(m->be->ops->attention_fwd(m->be, &args, out, lse, q, m->cp.buf[CP_K], m->cp.buf[CP_V]));
    return MT_OK;
}

mt_status mtm_cp_attention_bwd(mt_model *m, int64_t l, void *dq, void *dk, void *dv,
                                                const void *dout, const void *q, const void *k, const void *v,
                                                const void *out, const float *lse) {
    mt_attn_args args = mtm_attn_args(m, l);
    if (m->pack.on) args.q_seg = args.k_seg = m->plan.gptr[GB_SEGMENTS];
    if (m->cp.size == 1) {
        MT_TRY(m->be->ops->attention_bwd(m->be, &args, dq, dk, dv, dout, q, k, v, out, lse));
        return MT_OK;
    }
    args.q_pos = m->plan.gptr[GB_POSITIONS];
    if (m->cp.ring) {
        MT_TRY(cp_ring_bwd(m, &args, dq, dk, dv, dout, q, k, v, out, lse));
        return MT_OK;
    }
    MT_TRY(cp_gather_kv(m, &args, k, v));
    MT_TRY(m->be->ops->attention_bwd(m->be, &args, dq, m->cp.buf[CP_DK], m->cp.buf[CP_DV], dout, q, m->cp.buf[CP_K],
                          m->cp.buf[CP_V], out, lse));
    MT_TRY(cp_scatter(m, dk, m->cp.buf[CP_DK], cp_kvd(m, &args)));
    MT_TRY(cp_scatter(m, dv, m->cp.buf[CP_DV], cp_kvd(m, &args)));
    return MT_OK;
}

/* Original position of local row j (< 2Tc) of context rank r. */
int32_t mtm_cp_position(const mt_model *m, int r, int64_t j) {
    const int64_t Tc = m->T / 2, chunk = j < Tc ? r : 2 * m->cp.size - 1 - r;
    return (int32_t)(chunk * Tc + j % Tc);
}

/* This rank's rows of the caller's full [B, Tg] tokens or labels. */
const int32_t *mtm_cp_select(mt_model *m, const int32_t *full, int32_t *local) {
    if (m->cp.size == 1 || !full) return full;
    for (int64_t b = 0; b < m->B; b++)
        for (int64_t j = 0; j < m->T; j++) local[b * m->T + j] = full[b * m->Tg + mtm_cp_position(m, m->cp.rank, j)];
    return local;
}

/* ------------------------------------------------------------------------------ */
/* fsdp                                                                            */

/* The flat parameter buffer is cut into equal contiguous shards (the ZeRO-1 split of
 * parallel/zero1.h), each rank keeps its own; the parameter windows of the host-offload
 * path (model_windows.c) are filled by all-gathers over the fsdp group instead of host
 * copies: the embedding, final norm and head at the start of every forward, each layer
 * before its forward (slot l % 2, overwriting layer l - 2), and in the backward each
 * layer whose slot was reused (all but the last two). Layer gathers are prefetched
 * (mtm_prefetch_layer): started asynchronously while the layer before (forward) or
 * after (backward) computes, waited for before use. */

/* Elements of [a, b) inside rank r's shard. */
static int64_t fsdp_own(const mt_model *m, int r, int64_t a, int64_t b) {
    int64_t lo = (int64_t)r * m->fsdp.per, hi = lo + m->fsdp.per;
    if (hi > m->par.numel) hi = m->par.numel;
    if (lo < a) lo = a;
    if (hi > b) hi = b;
    return hi > lo ? hi - lo : 0;
}

/* win[0, b - a) = flat parameters [a, b) of m->dt, gathered from the shards (each rank
 * sends its part; rank order is flat order): the fp32 master shard, or with dtype
 * bfloat16 16-bit payloads (half the bytes), bitwise the slice of the one-process
 * compute copy (mtm_refresh_compute's rounding key): without parameter offload each
 * rank rounds its part of [a, b) from its fp32 master straight into its own place in
 * win and the gather runs in place, so no bf16 copy of the shard is kept (ZeRO-3 as in
 * Rajbhandari et al. 2020 keeps the fp16 shard instead; rounding at each gather costs an
 * elementwise pass over 1 / fsdp of the window and no bytes on the wire); with offload
 * from the host pool's compute copy. async: started only (m->fsdp.req, completed by
 * mtm_fsdp_wait; the shard and win are not touched meanwhile). Failures go to
 * fsdp.status (first of the pass). */
void mtm_fsdp_gather(mt_model *m, void *win, int64_t a, int64_t b, int async) {
    if (m->fsdp.status != MT_OK) return;
    int64_t before = 0; /* elements of [a, b) on the ranks before this one: its place in win */
    for (int r = 0; r < m->fsdp.size; r++) {
        m->fsdp.counts[r] = fsdp_own(m, r, a, b);
        if (r < m->fsdp.rank) before += m->fsdp.counts[r];
    }
    const int64_t own0 = a > m->fsdp.lo ? a : m->fsdp.lo, own = m->fsdp.counts[m->fsdp.rank];
    const mt_comm_dtype cd = m->dt != MT_F32 ? MT_COMM_U16 : MT_COMM_F32;
    const void *send;
    if (mtm_fsdp_rounds_in_window(m)) {
        send = AT(m, win, before);
        if (own > 0) { /* the compute copy's key: element g at t * numel + g */
            m->fsdp.status = m->be->ops->from_f32(m->be, AT(m, win, before), m->dt,
                                                  (const float *)m->plan.gptr[GB_PARAMS] + (own0 - m->fsdp.lo), own,
                                                  1, m->sr_seed,
                                                  (uint64_t)m->sr_t * (uint64_t)m->par.numel + (uint64_t)own0);
            if (m->fsdp.status != MT_OK) return;
        }
    } else {
        const void *shard = m->plan.gptr[m->dt != MT_F32 ? GB_COMPUTE_W : GB_PARAMS];
        send = own > 0 ? AT(m, shard, own0 - m->fsdp.lo) : shard;
    }
    if (async)
        m->fsdp.status = mt_comm_all_gather_start(m->fsdp.comm, send, win, m->fsdp.counts, cd, &m->fsdp.req);
    else
        m->fsdp.status = mt_comm_all_gather(m->fsdp.comm, send, win, m->fsdp.counts, cd);
}

/* Complete the prefetch in flight, if any (its failure goes to fsdp.status). */
void mtm_fsdp_wait(mt_model *m) {
    if (!m->fsdp.req) return;
    const mt_status st = mt_comm_wait(m->fsdp.req);
    m->fsdp.req = NULL;
    if (m->fsdp.status == MT_OK) m->fsdp.status = st;
}

void mt_model_fsdp_range(const mt_model *m, int64_t *lo, int64_t *hi) {
    *lo = m->fsdp.size > 1 ? m->fsdp.lo : 0;
    *hi = m->fsdp.size > 1 ? m->fsdp.hi : m->par.numel;
}

int64_t mt_model_fsdp_gather_floats(const mt_model *m) {
    if (m->fsdp.size == 1) return 0;
    const int r = m->fsdp.rank;
    const int64_t emb = m->par.info[m->par.embed].numel, L = m->cfg.num_decoder_layers;
    int64_t f = 0;
    if (mtm_vocab_windows(m)) { /* model.norm in the global window; the embedding's chunks once (the lookup),
                                 * the unembedding's three times (the chunked loss's three passes) */
        const int64_t e0 = m->par.info[m->par.embed].offset, g = mtm_global_window_numel(m);
        const int un = m->cfg.logits_via_embedding ? m->par.embed : m->par.lm_head;
        const int64_t u0 = m->par.info[un].offset, un_n = m->par.info[un].numel;
        f = (g - fsdp_own(m, r, m->par.tail_off, m->par.tail_off + g)) + (emb - fsdp_own(m, r, e0, e0 + emb)) +
            3 * (un_n - fsdp_own(m, r, u0, u0 + un_n));
    } else {
        f = (emb - fsdp_own(m, r, 0, emb)) +
            (m->par.numel - m->par.tail_off - fsdp_own(m, r, m->par.tail_off, m->par.numel));
    }
    if (m->pwin.weights) /* a segment at a time, in the layer code's order (model_windows.c) */
        f += mtm_weight_gather_floats(m, fsdp_own);
    else
        for (int64_t l = 0; l < L; l++) { /* each layer's own size (gemma4's differ) */
            const int64_t a = m->par.info[m->par.layer[l].in_norm].offset, ln = mtm_layer_numel(m, l),
                          n = ln - fsdp_own(m, r, a, a + ln);
            f += n;                 /* forward */
            if (l + 2 < L) f += n;  /* backward: slot l % 2 was reused by layer l + 2 */
        }
    int64_t pa, pn; /* gemma4's per-layer-input globals: their window, once per forward */
    mtm_g4_ple_range(m, &pa, &pn);
    return f + (pn - fsdp_own(m, r, pa, pa + pn));
}

/* Bytes of one all-reduce of S bytes on n ranks (parallel/comm.h accounting). */
static uint64_t ar_bytes(uint64_t S, uint64_t n) { return n > 1 ? 2 * (n - 1) * S / n : 0; }

uint64_t mt_model_shard_bytes(const mt_model *m) {
    const uint64_t T = (uint64_t)m->tp.size, C = (uint64_t)m->cp.size, L = (uint64_t)m->cfg.num_decoder_layers;
    const int64_t N = m->N;
    uint64_t b = 0;
    const uint64_t es = (uint64_t)m->es; /* the activation payloads' element bytes */
    if (T > 1) { /* the header's tensor and sequence-parallel counts, the loss's max and sums, dh */
        const uint64_t ND = es * (uint64_t)(N * m->D);
        b += m->tp.sp ? 10 * L * ((T - 1) * ND / T) + (T - 1) * ND / T : 4 * L * ar_bytes(ND, T);
        b += ar_bytes(ND, T);
        for (int64_t l = 0; l < (int64_t)L; l++) { /* what the backward recomputes (remat) */
            int ng, nr, nc;
            mtm_layer_recomputes(m, l, &ng, &nr, &nc);
            b += m->tp.sp ? (uint64_t)(ng + nr) * ((T - 1) * ND / T) : (uint64_t)nr * ar_bytes(ND, T);
        }
        const int64_t K = m->tiles < N ? m->tiles : N;
        for (int64_t k = 0; k < K; k++) {
            const uint64_t R = (uint64_t)((k + 1) * N / K - k * N / K);
            b += ar_bytes(4 * R, T) + ar_bytes(16 * R, T);
        }
    }
    if (C > 1) /* blocks of this rank's rows x the layer's local kv width (gemma4's vary) */
        for (int64_t l = 0; l < (int64_t)L; l++) {
            const uint64_t blk = es * (uint64_t)(N * mtm_layer_kvd(m, l));
            int ng, nr, nc; /* the forward's K/V traffic again when the backward recomputes the attention */
            mtm_layer_recomputes(m, l, &ng, &nr, &nc);
            b += (m->cp.ring ? (C - 1) * 6 * blk + 2 * blk : 6 * (C - 1) * blk) + (uint64_t)nc * 2 * (C - 1) * blk;
        }
    return b;
}

/* ------------------------------------------------------------------------------ */
/* set-up from the layout (checked by model.c check_layout)                        */

/* Local sizes and each parameter's slice offset: heads / kv heads / mlp columns /
 * vocabulary rows divided by the group size. */
static mt_status tp_setup(mt_model *m, mt_comm *comm, int size, int rank) {
    if (size == 1) return MT_OK;
    const int64_t T = size;
    m->tp.off = calloc((size_t)m->par.count, sizeof(int64_t));
    if (!m->tp.off) return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    m->tp.size = size;
    m->tp.rank = rank;
    m->tp.comm = comm;
    m->H /= T;
    m->Hkv /= T;
    m->F /= T;
    m->QD = m->H * m->Dh;
    m->KVD = m->Hkv * m->Dh;
    m->tp.Vl = m->V / T;
    m->tp.v0 = rank * m->tp.Vl;
    const int64_t D = m->D;
    for (int64_t l = 0; l < m->cfg.num_decoder_layers; l++) { /* each layer's own widths (gemma4's differ) */
        const layer_params *lp = &m->par.layer[l];
        const int64_t QD = mtm_layer_qd(m, l), KVD = mtm_layer_kvd(m, l), F = mtm_layer_f(m, l);
        m->tp.off[lp->q] = rank * QD * D; /* column-parallel: rows of [out, in] */
        if (lp->k >= 0) m->tp.off[lp->k] = rank * KVD * D; /* gemma4's KV-sharing layers have no k, v */
        if (lp->v >= 0) m->tp.off[lp->v] = rank * KVD * D;
        m->tp.off[lp->gate] = rank * F * D;
        m->tp.off[lp->up] = rank * F * D;
        m->tp.off[lp->o] = rank * QD; /* row-parallel: columns of [out, in] */
        m->tp.off[lp->down] = rank * F;
    }
    return MT_OK;
}

/* This rank's rows (T = seq / C per sequence), their original positions and those of
 * every rank's rows (the gathered keys'). */
static mt_status cp_setup(mt_model *m, mt_comm *comm, int size, int rank, int ring) {
    if (size == 1) return MT_OK;
    m->cp.size = size;
    m->cp.ring = ring != 0;
    m->cp.rank = rank;
    m->cp.comm = comm;
    m->Tg = m->T;
    m->T = m->Tg / size;
    m->N = m->B * m->T;
    /* cp.tok / cp.lab ([N] each) are allocated by mt_model_bind: planning allocates
     * nothing proportional to the batch. */
    m->cp.kpos_host = malloc(sizeof(int32_t) * (size_t)m->Tg);
    if (!m->cp.kpos_host) return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    for (int64_t n = 0; n < m->T; n++) m->pos_host[n] = mtm_cp_position(m, rank, n);
    for (int r = 0; r < size; r++)
        for (int64_t j = 0; j < m->T; j++) m->cp.kpos_host[r * m->T + j] = mtm_cp_position(m, r, j);
    if (m->tiles > m->N) m->tiles = m->N;
    return MT_OK;
}

/* Sequence parallelism on the tensor group: N / tp residual rows per rank. */
static mt_status sp_setup(mt_model *m, int on) {
    if (!on || m->tp.size == 1) return MT_OK; /* nothing to split without a tensor group */
    m->tp.sp_counts = malloc(sizeof(int64_t) * (size_t)m->tp.size);
    if (!m->tp.sp_counts) return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    for (int r = 0; r < m->tp.size; r++) m->tp.sp_counts[r] = m->N / m->tp.size * m->D;
    m->tp.sp = 1;
    return MT_OK;
}

/* This rank's shard [lo, hi) of ceil(numel / size) floats (clipped). */
static mt_status fsdp_setup(mt_model *m, mt_comm *comm, int size, int rank) {
    if (size == 1) return MT_OK;
    m->fsdp.counts = malloc(sizeof(int64_t) * (size_t)size);
    if (!m->fsdp.counts) return mt_set_error(MT_ERR_OOM, "mt_model_create: out of memory");
    m->fsdp.size = size;
    m->fsdp.rank = rank;
    m->fsdp.comm = comm;
    m->fsdp.per = (m->par.numel + size - 1) / size;
    m->fsdp.lo = (int64_t)rank * m->fsdp.per;
    m->fsdp.hi = m->fsdp.lo + m->fsdp.per;
    if (m->fsdp.lo > m->par.numel) m->fsdp.lo = m->par.numel;
    if (m->fsdp.hi > m->par.numel) m->fsdp.hi = m->par.numel;
    return MT_OK;
}

mt_status mtm_shard_setup(mt_model *m, const mt_model_layout *lay) {
    MT_TRY(tp_setup(m, lay->tensor_comm, mtm_axis_size(lay->tensor_size), lay->tensor_rank));
    MT_TRY(cp_setup(m, lay->context_comm, mtm_axis_size(lay->context_size), lay->context_rank, lay->context_ring));
    MT_TRY(sp_setup(m, lay->sequence_parallel));
    return fsdp_setup(m, lay->fsdp_comm, mtm_axis_size(lay->fsdp_size), lay->fsdp_rank);
}
