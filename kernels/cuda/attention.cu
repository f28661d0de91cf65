/* kernels/cuda/attention.cu: block-wise attention with an online softmax, fp32 compute
 * (Dao, "FlashAttention-2", 2023, algorithms 1 and 2; semantics in ops.h mt_attn_args).
 *
 * Why this shape: it is the simplest kernel that keeps no [Tq, Tk] matrix, handles
 * every case the op table allows (GQA/MQA, sliding window, soft-cap, arbitrary
 * q_pos/k_pos, any head_dim up to 512) with one template argument for the head_dim's
 * range (NC, below), and is deterministic without atomics. It is a correctness
 * baseline, not the fast path: the bf16 wgmma/TMA kernel of issue 4 replaces it for speed.
 * - Forward: one block (4 warps) per (query tile of 16 rows, head, batch). Each warp
 *   owns 4 query rows. Key/value tiles of 32 rows are staged in shared memory; lane j
 *   scores key j of the tile (K rows padded to Dh + 1 floats so the 32 lanes hit 32
 *   banks), the warp's max/sum shuffles give the online-softmax update, and each lane
 *   accumulates output columns d = lane + 32 c (c < NC) with p_j broadcast by shuffle.
 *   The scale is folded into the staged queries, as on the CPU.
 * - NC, the output columns per lane, is a compile-time argument chosen by head_dim
 *   (att_nc): 8 for Dh <= 256 (the kernels as they were before head_dim 512: the same
 *   code and registers), 16 for 256 < Dh <= 512 (Gemma 4's global layers). The
 *   accumulators are registers indexed by the unrolled c; a run-time column count
 *   would put them in local memory. Shared memory grows with Dh: at 512 the forward
 *   stages 160 KiB, each backward kernel 193 KiB, under sm_90's 227 KiB opt-in.
 * - A (query tile, key tile) pair with no allowed entry is skipped (a block vote), which
 *   gives the causal and windowed savings for any positions. Document masking
 *   (q_seg / k_seg, packed sequences) stages each tile's segment ids beside its
 *   positions (0 for every row when the op has none) and every per-entry test, the
 *   vote's included, also requires equal ids, so the vote stays exact.
 * - Backward: D_i = <dout_i, out_i> first (one warp per row). Then two kernels, each
 *   output owned by one thread that adds in a fixed order: dq per (query tile, head,
 *   batch) looping over key tiles (as the forward, recomputing P from lse), and dk/dv
 *   per (16 keys, kv head, batch) looping over the group's query heads in order and
 *   query tiles of 32 in increasing order, lane = query: P_ij and dS_ij are recomputed
 *   and broadcast by shuffle. No atomics anywhere, so results are bitwise reproducible.
 * - Dtypes (a->dtype): q, k, v, out, dout, dq, dk, dv are float or bfloat16, each kernel a
 *   template on that type S. Tiles are widened to fp32 as they are staged, so scores,
 *   max, sum, D_i and every accumulator are fp32 as for MT_F32; with bfloat16 the
 *   operands FlashAttention-2's bf16 kernels feed to the tensor cores are rounded to bf16
 *   (mt_round_as) where ops.h says: the forward's probabilities before the P @ V product
 *   (the sum l uses the fp32 ones), the backward's recomputed P_ij before dv += P^T dout
 *   and dS_ij (formed from the fp32 P) before dq += dS k and dk += dS^T (scale q); every
 *   output is rounded once when it is written (common.cuh mt_st). lse and D_i stay fp32.
 * UNVERIFIED on a device (written without a GPU; tests/test_gpu_ops.c checks it
 * against kernels/cpu/attention.c). */
#include <math.h>

#include "kernels/cuda/attention_mma.cuh" /* bf16: the tensor-core kernels */
#include "kernels/cuda/common.cuh"

#define AT_WARPS 4
#define AT_THREADS (AT_WARPS * 32)
#define AT_RW 4                    /* rows per warp */
#define AT_BQ (AT_WARPS * AT_RW)   /* 16 query rows per forward / dq block */
#define AT_BK 32                   /* keys per staged tile (one per lane) */
#define AT_BKV (AT_WARPS * AT_RW)  /* 16 key rows per dk/dv block */
#define AT_BQ2 32                  /* queries per dk/dv tile (one per lane) */
#define AT_NC_SMALL 8              /* output columns per lane for Dh <= 256 */
#define AT_NC_LARGE 16             /* ... for 256 < Dh <= 512 */
#define AT_DMAX (32 * AT_NC_LARGE)

typedef struct att_p {
    int64_t B, Tq, Tk, H, Hkv, Dh, G;
    float scale, softcap;
    int64_t window;
    const int32_t *q_pos, *k_pos;
    const int32_t *q_seg, *k_seg; /* [B, Tq] / [B, Tk] or both NULL */
} att_p;

__device__ __forceinline__ int att_allowed(const att_p &p, int64_t qp, int64_t kp) {
    const int64_t diff = qp - kp;
    return diff >= 0 && (p.window <= 0 || diff < p.window);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Stage rows [r0, r0 + nrows) of a [B, T, heads, Dh] tensor's head `hh` (float or
 * bfloat16, widened) into dst (fp32) with row stride ld, times mul; rows past T are zero. */
template <typename S>
__device__ __forceinline__ void att_stage(float *dst, int ld, const S *src, const att_p &p, int64_t b, int64_t T,
                                          int64_t heads, int64_t hh, int64_t r0, int nrows, float mul) {
    const int Dh = (int)p.Dh;
    for (int idx = threadIdx.x; idx < nrows * Dh; idx += blockDim.x) {
        const int r = idx / Dh, d = idx % Dh;
        const int64_t t = r0 + r;
        dst[r * ld + d] = t < T ? mul * mt_ld(src, ((b * T + t) * heads + hh) * p.Dh + d) : 0.0f;
    }
}

/* Positions of rows [r0, r0 + n); rows past T get a flag value never allowed. */
__device__ __forceinline__ void att_stage_pos(long long *dst, const int32_t *pos, int64_t T, int64_t r0, int n) {
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        const int64_t t = r0 + r;
        dst[r] = t < T ? (pos ? (long long)pos[t] : (long long)t) : (long long)INT64_MIN / 2;
    }
}

/* Segment ids of rows [r0, r0 + n) of sequence b (seg is [B, T]); 0 for every row when
 * seg is NULL (no document masking) and for rows past T (their positions already
 * exclude them). */
__device__ __forceinline__ void att_stage_seg(int *dst, const int32_t *seg, int64_t b, int64_t T, int64_t r0,
                                              int n) {
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        const int64_t t = r0 + r;
        dst[r] = seg && t < T ? (int)seg[b * T + t] : 0;
    }
}

/* 1 if any (query, key) pair of the staged tiles is allowed (block-wide vote): the same
 * test as each entry's, positions and segment ids. */
__device__ __forceinline__ int att_tile_any(const att_p &p, const long long *qp, const int *qs, int nq,
                                            const long long *kp, const int *ks, int nk) {
    int any = 0;
    const long long bad = (long long)INT64_MIN / 2;
    for (int idx = threadIdx.x; idx < nq * nk && !any; idx += blockDim.x) {
        const int i = idx / nk, j = idx % nk;
        const long long a = qp[i], c = kp[j];
        any = a != bad && c != bad && att_allowed(p, a, c) && qs[i] == ks[j];
    }
    return __syncthreads_or(any);
}

__device__ __forceinline__ float att_cap(const att_p &p, float s, float *t_out) {
    if (p.softcap > 0.0f) {
        const float t = tanhf(s * (1.0f / p.softcap));
        *t_out = t;
        return p.softcap * t;
    }
    *t_out = 0.0f;
    return s;
}

template <typename S, int NC>
__global__ void __launch_bounds__(AT_THREADS) att_fwd_kernel(att_p p, S *out, float *lse, const S *q, const S *k,
                                                             const S *v) {
    extern __shared__ float sm[];
    const int Dh = (int)p.Dh, ldk = Dh + 1;
    float *sQ = sm;                   /* [BQ][Dh], scaled */
    float *sK = sQ + AT_BQ * Dh;      /* [BK][Dh + 1] */
    float *sV = sK + AT_BK * ldk;     /* [BK][Dh] */
    long long *sQp = (long long *)(sV + AT_BK * Dh);
    long long *sKp = sQp + AT_BQ;
    int *sQs = (int *)(sKp + AT_BK); /* segment ids */
    int *sKs = sQs + AT_BQ;
    const int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * AT_BQ, hk = h / p.G;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    att_stage(sQ, Dh, q, p, b, p.Tq, p.H, h, i0, AT_BQ, p.scale);
    att_stage_pos(sQp, p.q_pos, p.Tq, i0, AT_BQ);
    att_stage_seg(sQs, p.q_seg, b, p.Tq, i0, AT_BQ);
    float m[AT_RW], l[AT_RW], acc[AT_RW][NC];
    for (int rr = 0; rr < AT_RW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
        for (int c = 0; c < NC; c++) acc[rr][c] = 0.0f;
    }
    for (int64_t j0 = 0; j0 < p.Tk; j0 += AT_BK) {
        __syncthreads(); /* the previous tile is no longer read */
        att_stage(sK, ldk, k, p, b, p.Tk, p.Hkv, hk, j0, AT_BK, 1.0f);
        att_stage(sV, Dh, v, p, b, p.Tk, p.Hkv, hk, j0, AT_BK, 1.0f);
        att_stage_pos(sKp, p.k_pos, p.Tk, j0, AT_BK);
        att_stage_seg(sKs, p.k_seg, b, p.Tk, j0, AT_BK);
        __syncthreads();
        if (!att_tile_any(p, sQp, sQs, AT_BQ, sKp, sKs, AT_BK)) continue;
        for (int rr = 0; rr < AT_RW; rr++) {
            const int r = w * AT_RW + rr;
            if (i0 + r >= p.Tq) break; /* warp-uniform */
            const long long kp = sKp[lane];
            const int ok = kp != (long long)INT64_MIN / 2 && att_allowed(p, sQp[r], kp) && sQs[r] == sKs[lane];
            float s = -INFINITY;
            if (ok) {
                float dot = 0.0f;
                for (int d = 0; d < Dh; d++) dot += sQ[r * Dh + d] * sK[lane * ldk + d];
                float t;
                s = att_cap(p, dot, &t);
            }
            const float mnew = fmaxf(m[rr], warp_max(s));
            if (mnew == -INFINITY) continue; /* nothing allowed yet for this row */
            const float pj = ok ? expf(s - mnew) : 0.0f;
            const float pv = mt_round_as(q, pj); /* P as the P @ V operand: bf16 for bf16 */
            const float corr = expf(m[rr] - mnew); /* 0 when m was -inf */
            l[rr] = l[rr] * corr + warp_sum(pj);
            for (int c = 0; c < NC; c++) acc[rr][c] *= corr;
            for (int jj = 0; jj < AT_BK; jj++) {
                const float pb = __shfl_sync(0xffffffffu, pv, jj);
                for (int c = 0; c < NC; c++) {
                    const int d = lane + 32 * c;
                    if (d < Dh) acc[rr][c] += pb * sV[jj * Dh + d];
                }
            }
            m[rr] = mnew;
        }
    }
    for (int rr = 0; rr < AT_RW; rr++) {
        const int64_t i = i0 + w * AT_RW + rr;
        if (i >= p.Tq) break;
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
        S *o = out + ((b * p.Tq + i) * p.H + h) * p.Dh;
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < Dh) mt_st(o, d, acc[rr][c] * inv);
        }
        if (lane == 0) lse[(b * p.H + h) * p.Tq + i] = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    }
}

/* Dv[b, h, i] = <dout_i, out_i> (fp32): one warp per (b, i, h) row. */
template <typename S>
__global__ void att_bwd_dot_kernel(att_p p, float *Dv, const S *dout, const S *out) {
    const int64_t rows = p.B * p.Tq * p.H;
    const int lane = threadIdx.x & 31;
    for (int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows;
         row += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        const S *a = dout + row * p.Dh, *o = out + row * p.Dh;
        float s = 0.0f;
        for (int64_t d = lane; d < p.Dh; d += 32) s += mt_ld(a, d) * mt_ld(o, d);
        s = warp_sum(s);
        const int64_t h = row % p.H, bi = row / p.H, i = bi % p.Tq, b = bi / p.Tq;
        if (lane == 0) Dv[(b * p.H + h) * p.Tq + i] = s;
    }
}

template <typename S, int NC>
__global__ void __launch_bounds__(AT_THREADS) att_bwd_dq_kernel(att_p p, S *dq, const S *dout, const S *q,
                                                                const S *k, const S *v, const float *lse,
                                                                const float *Dv) {
    extern __shared__ float sm[];
    const int Dh = (int)p.Dh, ldk = Dh + 1;
    float *sQ = sm;                 /* [BQ][Dh], scaled */
    float *sO = sQ + AT_BQ * Dh;    /* [BQ][Dh], dout */
    float *sK = sO + AT_BQ * Dh;    /* [BK][Dh + 1] */
    float *sV = sK + AT_BK * ldk;   /* [BK][Dh + 1] */
    long long *sQp = (long long *)(sV + AT_BK * ldk);
    long long *sKp = sQp + AT_BQ;
    int *sQs = (int *)(sKp + AT_BK); /* segment ids */
    int *sKs = sQs + AT_BQ;
    const int64_t b = blockIdx.z, h = blockIdx.y, i0 = (int64_t)blockIdx.x * AT_BQ, hk = h / p.G;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    att_stage(sQ, Dh, q, p, b, p.Tq, p.H, h, i0, AT_BQ, p.scale);
    att_stage(sO, Dh, dout, p, b, p.Tq, p.H, h, i0, AT_BQ, 1.0f);
    att_stage_pos(sQp, p.q_pos, p.Tq, i0, AT_BQ);
    att_stage_seg(sQs, p.q_seg, b, p.Tq, i0, AT_BQ);
    float L[AT_RW], Di[AT_RW], acc[AT_RW][NC];
    for (int rr = 0; rr < AT_RW; rr++) {
        const int64_t i = i0 + w * AT_RW + rr;
        L[rr] = i < p.Tq ? lse[(b * p.H + h) * p.Tq + i] : 0.0f;
        Di[rr] = i < p.Tq ? Dv[(b * p.H + h) * p.Tq + i] : 0.0f;
        for (int c = 0; c < NC; c++) acc[rr][c] = 0.0f;
    }
    for (int64_t j0 = 0; j0 < p.Tk; j0 += AT_BK) {
        __syncthreads();
        att_stage(sK, ldk, k, p, b, p.Tk, p.Hkv, hk, j0, AT_BK, 1.0f);
        att_stage(sV, ldk, v, p, b, p.Tk, p.Hkv, hk, j0, AT_BK, 1.0f);
        att_stage_pos(sKp, p.k_pos, p.Tk, j0, AT_BK);
        att_stage_seg(sKs, p.k_seg, b, p.Tk, j0, AT_BK);
        __syncthreads();
        if (!att_tile_any(p, sQp, sQs, AT_BQ, sKp, sKs, AT_BK)) continue;
        for (int rr = 0; rr < AT_RW; rr++) {
            const int r = w * AT_RW + rr;
            if (i0 + r >= p.Tq) break;
            const long long kp = sKp[lane];
            const int ok = kp != (long long)INT64_MIN / 2 && att_allowed(p, sQp[r], kp) && sQs[r] == sKs[lane];
            float ds = 0.0f;
            if (ok) {
                float dot = 0.0f, dp = 0.0f;
                for (int d = 0; d < Dh; d++) {
                    dot += sQ[r * Dh + d] * sK[lane * ldk + d];
                    dp += sO[r * Dh + d] * sV[lane * ldk + d];
                }
                float t;
                const float s = att_cap(p, dot, &t);
                const float pr = expf(s - L[rr]);
                ds = pr * (dp - Di[rr]);
                if (p.softcap > 0.0f) ds *= 1.0f - t * t;
                ds = mt_round_as(q, ds); /* dS as the dS K operand: bf16 for bf16 */
            }
            for (int jj = 0; jj < AT_BK; jj++) {
                const float db = __shfl_sync(0xffffffffu, ds, jj);
                for (int c = 0; c < NC; c++) {
                    const int d = lane + 32 * c;
                    if (d < Dh) acc[rr][c] += db * sK[jj * ldk + d];
                }
            }
        }
    }
    for (int rr = 0; rr < AT_RW; rr++) {
        const int64_t i = i0 + w * AT_RW + rr;
        if (i >= p.Tq) break;
        S *o = dq + ((b * p.Tq + i) * p.H + h) * p.Dh;
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < Dh) mt_st(o, d, p.scale * acc[rr][c]);
        }
    }
}

template <typename S, int NC>
__global__ void __launch_bounds__(AT_THREADS) att_bwd_dkdv_kernel(att_p p, S *dk, S *dv, const S *dout,
                                                                  const S *q, const S *k, const S *v,
                                                                  const float *lse, const float *Dv) {
    extern __shared__ float sm[];
    const int Dh = (int)p.Dh, ldq = Dh + 1;
    float *sK = sm;                  /* [BKV][Dh] */
    float *sV = sK + AT_BKV * Dh;    /* [BKV][Dh] */
    float *sQ = sV + AT_BKV * Dh;    /* [BQ2][Dh + 1], scaled */
    float *sO = sQ + AT_BQ2 * ldq;   /* [BQ2][Dh + 1], dout */
    float *sL = sO + AT_BQ2 * ldq;   /* [BQ2] lse */
    float *sD = sL + AT_BQ2;         /* [BQ2] D_i */
    long long *sQp = (long long *)(sD + AT_BQ2);
    long long *sKp = sQp + AT_BQ2;
    int *sQs = (int *)(sKp + AT_BKV); /* segment ids */
    int *sKs = sQs + AT_BQ2;
    const int64_t b = blockIdx.z, hk = blockIdx.y, j0 = (int64_t)blockIdx.x * AT_BKV;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    att_stage(sK, Dh, k, p, b, p.Tk, p.Hkv, hk, j0, AT_BKV, 1.0f);
    att_stage(sV, Dh, v, p, b, p.Tk, p.Hkv, hk, j0, AT_BKV, 1.0f);
    att_stage_pos(sKp, p.k_pos, p.Tk, j0, AT_BKV);
    att_stage_seg(sKs, p.k_seg, b, p.Tk, j0, AT_BKV);
    float adk[AT_RW][NC], adv[AT_RW][NC];
    for (int rr = 0; rr < AT_RW; rr++)
        for (int c = 0; c < NC; c++) adk[rr][c] = adv[rr][c] = 0.0f;
    for (int64_t gi = 0; gi < p.G; gi++) {
        const int64_t h = hk * p.G + gi;
        for (int64_t i0 = 0; i0 < p.Tq; i0 += AT_BQ2) {
            __syncthreads();
            att_stage(sQ, ldq, q, p, b, p.Tq, p.H, h, i0, AT_BQ2, p.scale);
            att_stage(sO, ldq, dout, p, b, p.Tq, p.H, h, i0, AT_BQ2, 1.0f);
            att_stage_pos(sQp, p.q_pos, p.Tq, i0, AT_BQ2);
            att_stage_seg(sQs, p.q_seg, b, p.Tq, i0, AT_BQ2);
            for (int r = threadIdx.x; r < AT_BQ2; r += blockDim.x) {
                const int64_t i = i0 + r;
                sL[r] = i < p.Tq ? lse[(b * p.H + h) * p.Tq + i] : 0.0f;
                sD[r] = i < p.Tq ? Dv[(b * p.H + h) * p.Tq + i] : 0.0f;
            }
            __syncthreads();
            if (!att_tile_any(p, sQp, sQs, AT_BQ2, sKp, sKs, AT_BKV)) continue;
            for (int rr = 0; rr < AT_RW; rr++) {
                const int jr = w * AT_RW + rr;
                if (j0 + jr >= p.Tk) break;
                const long long qp = sQp[lane];
                const int ok = qp != (long long)INT64_MIN / 2 && att_allowed(p, qp, sKp[jr]) && sQs[lane] == sKs[jr];
                float pr = 0.0f, ds = 0.0f;
                if (ok) {
                    float dot = 0.0f, dp = 0.0f;
                    for (int d = 0; d < Dh; d++) {
                        dot += sQ[lane * ldq + d] * sK[jr * Dh + d];
                        dp += sO[lane * ldq + d] * sV[jr * Dh + d];
                    }
                    float t;
                    const float s = att_cap(p, dot, &t);
                    pr = expf(s - sL[lane]);
                    ds = pr * (dp - sD[lane]);
                    if (p.softcap > 0.0f) ds *= 1.0f - t * t;
                    /* P and dS as the P^T dout and dS^T q operands (dS took the fp32 P) */
                    pr = mt_round_as(q, pr);
                    ds = mt_round_as(q, ds);
                }
                for (int ii = 0; ii < AT_BQ2; ii++) {
                    const float pb = __shfl_sync(0xffffffffu, pr, ii);
                    const float db = __shfl_sync(0xffffffffu, ds, ii);
                    for (int c = 0; c < NC; c++) {
                        const int d = lane + 32 * c;
                        if (d < Dh) {
                            adv[rr][c] += pb * sO[ii * ldq + d];
                            adk[rr][c] += db * sQ[ii * ldq + d]; /* sQ carries the scale */
                        }
                    }
                }
            }
        }
    }
    for (int rr = 0; rr < AT_RW; rr++) {
        const int64_t j = j0 + w * AT_RW + rr;
        if (j >= p.Tk) break;
        S *ok_ = dk + ((b * p.Tk + j) * p.Hkv + hk) * p.Dh;
        S *ov = dv + ((b * p.Tk + j) * p.Hkv + hk) * p.Dh;
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < Dh) {
                mt_st(ok_, d, adk[rr][c]);
                mt_st(ov, d, adv[rr][c]);
            }
        }
    }
}

static att_p att_params(const mt_attn_args *a) {
    att_p p;
    p.B = a->B;
    p.Tq = a->Tq;
    p.Tk = a->Tk;
    p.H = a->H;
    p.Hkv = a->Hkv;
    p.Dh = a->Dh;
    p.G = a->H / a->Hkv;
    p.scale = a->scale;
    p.softcap = a->softcap;
    p.window = a->window;
    p.q_pos = a->q_pos;
    p.k_pos = a->k_pos;
    p.q_seg = a->q_seg && a->k_seg ? a->q_seg : NULL;
    p.k_seg = a->q_seg && a->k_seg ? a->k_seg : NULL;
    return p;
}

/* MT_ERR_INVALID for a shape these kernels do not handle (not sticky: nothing ran). */
static mt_status att_check(const mt_attn_args *a) {
    if (a->Dh > AT_DMAX || a->Dh <= 0 || a->Hkv <= 0 || a->H % a->Hkv != 0 || a->H > 65535 || a->B > 65535)
        return mt_set_error(MT_ERR_INVALID, "cuda: attention: unsupported shape (head_dim %lld, H %lld, Hkv %lld, "
                            "B %lld; head_dim 1..512, H %% Hkv == 0, H and B <= 65535)", (long long)a->Dh,
                            (long long)a->H, (long long)a->Hkv, (long long)a->B);
    return MT_OK;
}

/* Dynamic shared memory above 48 KiB needs an opt-in per kernel. */
template <typename K>
static mt_status att_smem(mt_backend *be, K kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        MT_CUDA_TRY(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return MT_OK;
}

template <typename S, int NC>
static mt_status att_fwd_run(mt_backend *be, const att_p &p, S *out, float *lse, const S *q, const S *k,
                             const S *v) {
    const size_t Dh = (size_t)p.Dh;
    const size_t smem = (AT_BQ * Dh + AT_BK * (Dh + 1) + AT_BK * Dh) * sizeof(float) +
                        (AT_BQ + AT_BK) * (sizeof(long long) + sizeof(int));
    MT_TRY(att_smem(be, att_fwd_kernel<S, NC>, smem));
    dim3 grid((unsigned)((p.Tq + AT_BQ - 1) / AT_BQ), (unsigned)p.H, (unsigned)p.B);
    att_fwd_kernel<S, NC><<<grid, AT_THREADS, smem>>>(p, out, lse, q, k, v);
    MT_CUDA_LAUNCHED(be, "att_fwd_kernel");
    return MT_OK;
}

/* The columns per lane for p.Dh (att_check has held it to 1..AT_DMAX): the file comment's NC. */
static int att_nc(const att_p &p) { return p.Dh <= 32 * AT_NC_SMALL ? AT_NC_SMALL : AT_NC_LARGE; }

template <typename S>
static mt_status att_fwd_any(mt_backend *be, const att_p &p, S *out, float *lse, const S *q, const S *k,
                             const S *v) {
    if (att_nc(p) == AT_NC_SMALL) return att_fwd_run<S, AT_NC_SMALL>(be, p, out, lse, q, k, v);
    return att_fwd_run<S, AT_NC_LARGE>(be, p, out, lse, q, k, v);
}

/* The backward's scratch: D = rowsum(dO * O), [B, H, Tq] fp32. */
static size_t att_d_bytes(int64_t B, int64_t H, int64_t Tq) { return (size_t)(B * H * Tq) * sizeof(float); }

size_t mt_cuda_attention_scratch(const mt_attn_args *a) {
    if (mt_cuda_attention_mma_supported(a)) return mt_cuda_attention_mma_scratch(a);
    return att_d_bytes(a->B, a->H, a->Tq);
}

mt_status mt_cuda_attention_fwd(mt_backend *be, const mt_attn_args *a, void *out, float *lse, const void *q,
                                const void *k, const void *v) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "attention_fwd", a->dtype));
    if (mt_cuda_attention_mma_supported(a)) return mt_cuda_attention_mma_fwd(be, a, out, lse, q, k, v);
    if (a->B <= 0 || a->Tq <= 0 || a->H <= 0) return MT_OK;
    MT_TRY(att_check(a));
    const att_p p = att_params(a);
    if (a->dtype == MT_BF16)
        return att_fwd_any(be, p, (__nv_bfloat16 *)out, lse, (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k,
                           (const __nv_bfloat16 *)v);
    return att_fwd_any(be, p, (float *)out, lse, (const float *)q, (const float *)k, (const float *)v);
}

template <typename S, int NC>
static mt_status att_bwd_run(mt_backend *be, const att_p &p, S *dq, S *dk, S *dv, const S *dout, const S *q,
                             const S *k, const S *v, const S *out, const float *lse) {
    const size_t Dh = (size_t)p.Dh;
    if (p.Tq <= 0 || p.Tk <= 0) { /* nothing attends: zero gradients */
        if (p.Tq > 0) MT_CUDA_TRY(be, cudaMemsetAsync(dq, 0, (size_t)(p.B * p.Tq * p.H) * Dh * sizeof(S), 0));
        if (p.Tk > 0) {
            MT_CUDA_TRY(be, cudaMemsetAsync(dk, 0, (size_t)(p.B * p.Tk * p.Hkv) * Dh * sizeof(S), 0));
            MT_CUDA_TRY(be, cudaMemsetAsync(dv, 0, (size_t)(p.B * p.Tk * p.Hkv) * Dh * sizeof(S), 0));
        }
        return MT_OK;
    }
    float *Dv = NULL;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_ATTN, att_d_bytes(p.B, p.H, p.Tq), (void **)&Dv));
    att_bwd_dot_kernel<S><<<mt_cuda_blocks(p.B * p.Tq * p.H * 32, 256), 256>>>(p, Dv, dout, out);
    MT_CUDA_LAUNCHED(be, "att_bwd_dot_kernel");
    const size_t smem_dq = (2 * AT_BQ * Dh + 2 * AT_BK * (Dh + 1)) * sizeof(float) +
                           (AT_BQ + AT_BK) * (sizeof(long long) + sizeof(int));
    MT_TRY(att_smem(be, att_bwd_dq_kernel<S, NC>, smem_dq));
    dim3 gq((unsigned)((p.Tq + AT_BQ - 1) / AT_BQ), (unsigned)p.H, (unsigned)p.B);
    att_bwd_dq_kernel<S, NC><<<gq, AT_THREADS, smem_dq>>>(p, dq, dout, q, k, v, lse, Dv);
    MT_CUDA_LAUNCHED(be, "att_bwd_dq_kernel");
    const size_t smem_kv = (2 * AT_BKV * Dh + 2 * AT_BQ2 * (Dh + 1) + 2 * AT_BQ2) * sizeof(float) +
                           (AT_BQ2 + AT_BKV) * (sizeof(long long) + sizeof(int));
    MT_TRY(att_smem(be, att_bwd_dkdv_kernel<S, NC>, smem_kv));
    dim3 gk((unsigned)((p.Tk + AT_BKV - 1) / AT_BKV), (unsigned)p.Hkv, (unsigned)p.B);
    att_bwd_dkdv_kernel<S, NC><<<gk, AT_THREADS, smem_kv>>>(p, dk, dv, dout, q, k, v, lse, Dv);
    MT_CUDA_LAUNCHED(be, "att_bwd_dkdv_kernel");
    return MT_OK;
}

template <typename S>
static mt_status att_bwd_any(mt_backend *be, const att_p &p, S *dq, S *dk, S *dv, const S *dout, const S *q,
                             const S *k, const S *v, const S *out, const float *lse) {
    if (att_nc(p) == AT_NC_SMALL) return att_bwd_run<S, AT_NC_SMALL>(be, p, dq, dk, dv, dout, q, k, v, out, lse);
    return att_bwd_run<S, AT_NC_LARGE>(be, p, dq, dk, dv, dout, q, k, v, out, lse);
}

mt_status mt_cuda_attention_bwd(mt_backend *be, const mt_attn_args *a, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v, const void *out,
                                const float *lse) {
    MT_CUDA_ENTER(be);
    MT_TRY(mt_cuda_check_dtype(be, "attention_bwd", a->dtype));
    if (mt_cuda_attention_mma_supported(a))
        return mt_cuda_attention_mma_bwd(be, a, dq, dk, dv, dout, q, k, v, out, lse);
    if (a->B <= 0 || a->H <= 0) return MT_OK;
    MT_TRY(att_check(a));
    const att_p p = att_params(a);
    if (a->dtype == MT_BF16) {
        typedef __nv_bfloat16 S;
        return att_bwd_any(be, p, (S *)dq, (S *)dk, (S *)dv, (const S *)dout, (const S *)q, (const S *)k,
                           (const S *)v, (const S *)out, lse);
    }
    return att_bwd_any(be, p, (float *)dq, (float *)dk, (float *)dv, (const float *)dout, (const float *)q,
                       (const float *)k, (const float *)v, (const float *)out, lse);
}
