/* kernels/cuda/attention_mma.cu: FlashAttention-2 on the tensor cores for bf16 (Dao,
 * "FlashAttention-2", 2023, Algorithms 1 and 2; semantics in ops.h mt_attn_args).
 *
 * Every matrix product is mma.sync m16n8k16 bf16 x bf16 -> fp32 (kernels/cuda/ptx.cuh),
 * one warp owning 16 rows of the output tile; fragments of row-major tiles come from
 * ldmatrix.x4, tiles from global memory by cp.async into double-buffered shared memory.
 * ptx.cuh has no ldmatrix.trans, so the B operand of the products that contract over
 * the key (or query) index (P V, dS K, P^T dO, dS^T Q) is gathered with two 16-bit
 * shared loads per register instead; shared rows are padded by 8 elements (16 bytes)
 * so that neither those loads nor ldmatrix conflict on banks.
 *
 * Forward (mma_fwd_kernel<NW, BC, DV, DK>): a block of NW warps owns BR = 16 NW query
 * rows of one (batch, head) and a slice of DV output columns. Q [BR][Dp] stays in shared
 * memory; key tiles of BC rows (K [BC][Dp], V [BC][DV slice]) are double-buffered: the
 * next visited tile's cp.async is issued before the current one is used. S = Q K^T in
 * fp32 accumulators, then scale, soft-cap and mask, the online softmax (running max and
 * per-lane partial sums in fp32, in log2 units with exp2f), P rounded once to bf16 and
 * O += P V in fp32. out = O / l rounded once to bf16; lse = m + log l (natural log).
 * Output columns beyond a kernel's DV (the generic path's 128, the Dh-256 dk/dv's 128)
 * are split over blocks (grid z = B x slices): each slice recomputes S (and dP) over the
 * whole head dim, which bounds the accumulators' registers for any head dim up to 512.
 * Backward, deterministic and without atomics: D_i = <dout_i, out_i> (mma_dot_kernel),
 * then mma_dkdv_kernel (a block owns 16 NW keys of one kv head and loops over the group's
 * query heads and every query tile: S^T = K Q^T, P^T = exp(S^T - lse), dV += P^T dO,
 * dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q) and mma_dq_kernel (a block owns
 * 16 NW queries and loops over key tiles: dQ += dS K). As FlashAttention-2 does (and
 * ops.h asks), P and dS are computed in fp32 (dS from the fp32 P) and each rounded once
 * to bf16 as the A operand of the products that take them (mma_frag): 7 mma products
 * per (query, key) block pair, S and dP twice (once per kernel), dV, dK and dQ once.
 * dq, dk, dv accumulate in fp32 and are rounded once (dq, dk after the scale).
 * Tile skipping: a (query tile, key tile) pair is visited only if its position ranges
 * can hold an allowed pair, 0 <= qmax - kmin and (window <= 0 or qmin - kmax < window),
 * and the segment-id ranges overlap; the ranges are the tile's indices when q_pos/k_pos
 * are NULL, else min/max over 16-row chunks precomputed by mma_range_kernel (arbitrary,
 * e.g. context-parallel, positions). The test runs before the tile's cp.async is issued.
 * A pair whose ranges make every entry allowed skips the per-entry mask.
 * Tile shapes <warps, key (fwd, dq) or query (dkdv) tile rows, output columns per block>,
 * dynamic shared memory (opted in above 48 KiB; all under the 163 KiB of an A100 and the
 * 227 KiB of an H100/H200) and ptxas registers per thread (CUDA 13, sm_90a, no spills):
 *   Dh 64:  fwd <4, 64, 64> 46.5 KiB 128; dq <4, 64, 64> 55.5 KiB 168; dkdv <4, 64, 64> 56.5 KiB 236
 *   Dh 128: fwd <4, 64, 128> 86.5 KiB 168; dq 103.5 KiB 241; dkdv 104.5 KiB 255
 *   Dh 256: fwd <4, 32, 256> 100 KiB 254; dq <4, 32, 256> 133 KiB 254; dkdv <4, 32, 128>
 *           (2 slices) 133.5 KiB 254
 *   any other Dh % 8 == 0 up to 512 (zero-padded to a multiple of 16; sizes at 512):
 *           fwd <2, 32, 128> 115 KiB 168; dq <2, 16, 128> 130.5 KiB 168; dkdv <2, 16, 128>
 *           130.75 KiB 254.
 * UNVERIFIED on a device: tested on the CPU emulator (tests/cudaemu) against an fp64
 * reference (tests/test_gpu_attention_mma.c); speed needs a real GPU. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ptx.cuh"

#define MMA_LOG2E 1.4426950408889634f
#define MMA_LN2 0.6931471805599453f
#define MMA_DMAX 512
/* Full unrolling keeps the fragment arrays in registers on the device; the emulator
 * (host g++) has no use for it. */
#ifdef CUDAEMU
#define MMA_UNROLL
#else
#define MMA_UNROLL _Pragma("unroll")
#endif

/* Position and segment-id ranges of a run of rows (min/max over the valid rows). */
typedef struct mma_rng {
    long long pmin, pmax;
    int smin, smax;
} mma_rng;

typedef struct mma_p {
    int64_t B, Tq, Tk, H, Hkv, G, Dh;
    int Dp;   /* Dh rounded up to 16 (the mma's k), zero columns past Dh */
    int ld;   /* shared row stride (elements) of full-width tiles: Dp + 8 */
    int ldv;  /* shared row stride of the forward's V slice: min(DV, Dh) + 8 */
    int nsl;  /* column slices of the output (grid z = B * nsl) */
    float scale, scale_log2, softcap, inv_softcap, softcap_log2;
    int64_t window;
    const int32_t *q_pos, *k_pos, *q_seg, *k_seg;
    const mma_rng *q_rng, *k_rng; /* [B][ceil(T/16)] or NULL (no positions, no segments) */
} mma_p;

/* ---------------------------------------------------------------- device helpers */

/* (lo, hi) rounded to nearest even bf16, lo in bits 0..15 (an mma operand register). */
__device__ __forceinline__ uint32_t mma_pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}

/* mma's A fragment of the 16 x 16 block kc of a tile held in accumulator layout (x[nt]
 * = columns 8 nt .. 8 nt + 7): two adjacent accumulator tiles are exactly one A
 * fragment (FlashAttention-2's P in registers). Rounded to bf16. */
__device__ __forceinline__ void mma_frag(uint32_t a[4], const float (*x)[4], int kc) {
    a[0] = mma_pack(x[2 * kc][0], x[2 * kc][1]);
    a[1] = mma_pack(x[2 * kc][2], x[2 * kc][3]);
    a[2] = mma_pack(x[2 * kc + 1][0], x[2 * kc + 1][1]);
    a[3] = mma_pack(x[2 * kc + 1][2], x[2 * kc + 1][3]);
}

/* Row rr (0: the thread's row g, 1: row g + 8) of an accumulator tile set acc[DV / 8]
 * (accumulator layout: this thread holds columns 8 nt + 2 t4, +1 of tile nt), times
 * scale, rounded to bf16 pairs and stored at row[8 nt], for the tiles whose first column
 * 8 nt is below nc (the epilogue of every kernel here: O, dQ, dK, dV). */
template <int DV>
__device__ __forceinline__ void mma_store_row(uint16_t *row, const float (*acc)[4], int rr, float scale, int nc) {
MMA_UNROLL
    for (int nt = 0; nt < DV / 8; nt++) {
        if (8 * nt >= nc) break;
        *(uint32_t *)(row + 8 * nt) = mma_pack(scale * acc[nt][2 * rr], scale * acc[nt][2 * rr + 1]);
    }
}

/* (x[0], x[ld]): two consecutive rows of one column, as an mma operand register. */
__device__ __forceinline__ uint32_t mma_gather2(const uint16_t *x, int ld) {
    return (uint32_t)x[0] | ((uint32_t)x[ld] << 16);
}

/* mma's A fragment: rows [r0, r0 + 16) x columns [k0, k0 + 16) of a row-major tile. */
__device__ __forceinline__ void mma_lda(uint32_t a[4], const uint16_t *tile, int ld, int r0, int k0) {
    const int lane = threadIdx.x & 31, i = lane >> 3, r = lane & 7;
    mt_ldmatrix_x4(a, tile + (r0 + r + 8 * (i & 1)) * ld + k0 + 8 * (i >> 1));
}

/* mma's B fragments of two n-tiles whose columns are rows [n0, n0 + 16) of a row-major
 * [n][k] tile, k in [k0, k0 + 16): b[0..1] for rows n0..n0+7, b[2..3] for n0+8..n0+15. */
__device__ __forceinline__ void mma_ldb(uint32_t b[4], const uint16_t *tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31, i = lane >> 3, r = lane & 7;
    mt_ldmatrix_x4(b, tile + (n0 + r + 8 * (i >> 1)) * ld + k0 + 8 * (i & 1));
}

/* cp.async rows [r0, r0 + n) of head hh of x [B, T, heads, Dh], columns [c0, c0 + nc)
 * (multiples of 8), into dst [n][ld]; rows at or past T are zero (plain stores). */
__device__ __forceinline__ void mma_load(uint16_t *dst, int ld, const uint16_t *x, int64_t b, int64_t T,
                                         int64_t heads, int64_t hh, int64_t Dh, int64_t r0, int n, int c0, int nc) {
    const int cpr = nc >> 3;
    for (int idx = threadIdx.x; idx < n * cpr; idx += blockDim.x) {
        const int r = idx / cpr, c = (idx - r * cpr) << 3;
        uint16_t *d = dst + r * ld + c;
        const int64_t t = r0 + r;
        if (t < T) {
            mt_cp_async_16(d, x + ((b * T + t) * heads + hh) * Dh + c0 + c);
        } else {
            uint32_t *z = (uint32_t *)d;
            z[0] = z[1] = z[2] = z[3] = 0u;
        }
    }
}

/* Zero columns [c0, c1) (c1 - c0 is 0 or 8) of `rows` rows: the mma's k padding. */
__device__ __forceinline__ void mma_zero_cols(uint16_t *dst, int ld, int rows, int c0, int c1) {
    if (c1 <= c0) return;
    for (int r = threadIdx.x; r < rows; r += blockDim.x) {
        uint32_t *z = (uint32_t *)(dst + r * ld + c0);
        z[0] = z[1] = z[2] = z[3] = 0u;
    }
}

/* Positions and segment ids of rows [r0, r0 + n) of sequence b (0 past T: such rows are
 * excluded by index). */
__device__ __forceinline__ void mma_load_meta(int *pos, int *seg, const int32_t *gpos, const int32_t *gseg,
                                              int64_t b, int64_t T, int64_t r0, int n) {
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
        const int64_t t = r0 + r;
        pos[r] = t < T ? (gpos ? gpos[t] : (int)t) : 0;
        seg[r] = t < T && gseg ? gseg[b * T + t] : 0;
    }
}

/* ops.h's rule for one (query, key) pair of valid rows. */
__device__ __forceinline__ bool mma_allowed(const mma_p &p, int qp, int qs, int kp, int ks) {
    const long long d = (long long)qp - (long long)kp;
    return d >= 0 && (p.window <= 0 || d < p.window) && qs == ks;
}

/* Ranges of rows [t0, min(t0 + n, T)) of sequence b (t0 < T). */
__device__ __forceinline__ mma_rng mma_range(const mma_rng *rng, int64_t b, int64_t T, int64_t t0, int n) {
    const int64_t t1 = (t0 + n < T ? t0 + n : T) - 1;
    mma_rng r;
    if (!rng) {
        r.pmin = t0;
        r.pmax = t1;
        r.smin = r.smax = 0;
        return r;
    }
    const int64_t nch = (T + 15) / 16;
    r = rng[b * nch + t0 / 16];
    for (int64_t c = t0 / 16 + 1; c <= t1 / 16; c++) {
        const mma_rng x = rng[b * nch + c];
        r.pmin = x.pmin < r.pmin ? x.pmin : r.pmin;
        r.pmax = x.pmax > r.pmax ? x.pmax : r.pmax;
        r.smin = x.smin < r.smin ? x.smin : r.smin;
        r.smax = x.smax > r.smax ? x.smax : r.smax;
    }
    return r;
}

/* Some pair of the two row ranges may be allowed (a necessary condition). */
__device__ __forceinline__ bool mma_any(const mma_p &p, const mma_rng &q, const mma_rng &k) {
    return q.smax >= k.smin && k.smax >= q.smin && q.pmax - k.pmin >= 0 &&
           (p.window <= 0 || q.pmin - k.pmax < p.window);
}

/* Every pair of the two row ranges is allowed (a sufficient condition). */
__device__ __forceinline__ bool mma_all(const mma_p &p, const mma_rng &q, const mma_rng &k) {
    return q.smin == q.smax && k.smin == k.smax && q.smin == k.smin && q.pmin - k.pmax >= 0 &&
           (p.window <= 0 || q.pmax - k.pmin < p.window);
}

/* First key tile >= jt of size BC that may hold an allowed pair for query range qr. */
__device__ __forceinline__ int mma_next_k(const mma_p &p, const mma_rng &qr, int64_t b, int BC, int jt, int nKt) {
    for (; jt < nKt; jt++)
        if (mma_any(p, qr, mma_range(p.k_rng, b, p.Tk, (int64_t)jt * BC, BC))) break;
    return jt;
}

/* log2(e) times the score from the raw <q, k>: scale, then the optional soft-cap
 * s = softcap tanh(scale <q, k> / softcap); *dcap = ds / d(scale <q, k>). */
__device__ __forceinline__ float mma_logit2(const mma_p &p, float raw, float *dcap) {
    if (p.softcap > 0.0f) {
        const float th = tanhf(raw * p.scale * p.inv_softcap);
        *dcap = 1.0f - th * th;
        return p.softcap_log2 * th;
    }
    *dcap = 1.0f;
    return raw * p.scale_log2;
}

__device__ __forceinline__ float mma_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

/* Sum over the 4 lanes of a quad (one accumulator row); the same value in each lane. */
__device__ __forceinline__ float mma_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* The backward's two products over one tile, sharing the B-side loop: x = A1 B1^T and
 * y = A2 B2^T for this warp's 16 rows r0.. of A1 and A2 and the NB columns of B1 and B2
 * (rows of those tiles), Dp / 16 k-steps; x and y start at zero. The dQ kernel calls it
 * with (Q, dO) x (K, V) -> (S, dP), the dK/dV kernel with (K, V) x (Q, dO) -> (S^T, dP^T). */
template <int NB>
__device__ __forceinline__ void mma_two_products(float x[NB / 8][4], float y[NB / 8][4], const uint16_t *A1,
                                                 const uint16_t *A2, const uint16_t *B1, const uint16_t *B2, int ld,
                                                 int r0, int Dp) {
MMA_UNROLL
    for (int nt = 0; nt < NB / 8; nt++)
MMA_UNROLL
        for (int e = 0; e < 4; e++) x[nt][e] = y[nt][e] = 0.0f;
    for (int kc = 0; kc < Dp / 16; kc++) {
        uint32_t a1[4], a2[4];
        mma_lda(a1, A1, ld, r0, 16 * kc);
        mma_lda(a2, A2, ld, r0, 16 * kc);
MMA_UNROLL
        for (int np = 0; np < NB / 16; np++) {
            uint32_t b1[4], b2[4];
            mma_ldb(b1, B1, ld, 16 * np, 16 * kc);
            mma_ldb(b2, B2, ld, 16 * np, 16 * kc);
            mt_mma_bf16_16816(x[2 * np], a1, b1, x[2 * np]);
            mt_mma_bf16_16816(x[2 * np + 1], a1, b1 + 2, x[2 * np + 1]);
            mt_mma_bf16_16816(y[2 * np], a2, b2, y[2 * np]);
            mt_mma_bf16_16816(y[2 * np + 1], a2, b2 + 2, y[2 * np + 1]);
        }
    }
}

/* ---------------------------------------------------------------- kernels */

/* Ranges of every 16-row chunk of each sequence: dst [B][ceil(T/16)]. */
__global__ void mma_range_kernel(mma_rng *dst, const int32_t *pos, const int32_t *seg, int64_t B, int64_t T) {
    const int64_t nch = (T + 15) / 16;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < B * nch;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = idx / nch, t0 = (idx % nch) * 16, t1 = t0 + 16 < T ? t0 + 16 : T;
        mma_rng r;
        r.pmin = INT64_MAX;
        r.pmax = INT64_MIN;
        r.smin = INT32_MAX;
        r.smax = INT32_MIN;
        for (int64_t t = t0; t < t1; t++) {
            const long long ps = pos ? (long long)pos[t] : (long long)t;
            const int s = seg ? seg[b * T + t] : 0;
            r.pmin = ps < r.pmin ? ps : r.pmin;
            r.pmax = ps > r.pmax ? ps : r.pmax;
            r.smin = s < r.smin ? s : r.smin;
            r.smax = s > r.smax ? s : r.smax;
        }
        dst[idx] = r;
    }
}

template <int NW, int BC, int DV, int DK>
__global__ void __launch_bounds__(NW * 32)
    mma_fwd_kernel(mma_p p, uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v) {
    constexpr int BR = 16 * NW;
    extern __shared__ __align__(16) unsigned char mma_sm[];
    const int Dp = DK ? DK : p.Dp, ld = DK ? DK + 8 : p.ld, ldv = p.ldv, Dh = (int)p.Dh;
    const int64_t b = blockIdx.z / p.nsl, h = blockIdx.y, hk = h / p.G, i0 = (int64_t)blockIdx.x * BR;
    const int c0 = (int)(blockIdx.z % p.nsl) * DV, nc = Dh - c0 < DV ? Dh - c0 : DV;
    uint16_t *sQ = (uint16_t *)mma_sm;  /* [BR][ld] */
    uint16_t *sK = sQ + BR * ld;        /* [2][BC][ld] */
    uint16_t *sV = sK + 2 * BC * ld;    /* [2][BC][ldv]: columns [c0, c0 + nc) */
    int *sQp = (int *)(sV + 2 * BC * ldv), *sQs = sQp + BR, *sKp = sQs + BR, *sKs = sKp + 2 * BC;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3, r0 = 16 * w;
    const int nKt = (int)((p.Tk + BC - 1) / BC);

    mma_zero_cols(sQ, ld, BR, Dh, Dp);
    mma_zero_cols(sK, ld, 2 * BC, Dh, Dp);
    mma_load(sQ, ld, q, b, p.Tq, p.H, h, Dh, i0, BR, 0, Dh);
    mma_load_meta(sQp, sQs, p.q_pos, p.q_seg, b, p.Tq, i0, BR);
    const mma_rng qr = mma_range(p.q_rng, b, p.Tq, i0, BR);
    const bool qfull = i0 + BR <= p.Tq;
    int jt = mma_next_k(p, qr, b, BC, 0, nKt), buf = 0;
    if (jt < nKt) {
        mma_load(sK, ld, k, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jt * BC, BC, 0, Dh);
        mma_load(sV, ldv, v, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jt * BC, BC, c0, nc);
        mma_load_meta(sKp, sKs, p.k_pos, p.k_seg, b, p.Tk, (int64_t)jt * BC, BC);
    }
    mt_cp_async_commit();

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, o[DV / 8][4];
MMA_UNROLL
    for (int nt = 0; nt < DV / 8; nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;

    while (jt < nKt) {
        const int jn = mma_next_k(p, qr, b, BC, jt + 1, nKt);
        if (jn < nKt) { /* the other buffer was last read before the previous trailing barrier */
            const int nb = buf ^ 1;
            mma_load(sK + nb * BC * ld, ld, k, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jn * BC, BC, 0, Dh);
            mma_load(sV + nb * BC * ldv, ldv, v, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jn * BC, BC, c0, nc);
            mma_load_meta(sKp + nb * BC, sKs + nb * BC, p.k_pos, p.k_seg, b, p.Tk, (int64_t)jn * BC, BC);
        }
        mt_cp_async_commit();
        mt_cp_async_wait<1>(); /* this thread's copies of tile jt (and Q) have landed */
        __syncthreads();       /* ... and everyone else's */
        const int64_t j0 = (int64_t)jt * BC;
        const bool full = qfull && j0 + BC <= p.Tk && mma_all(p, qr, mma_range(p.k_rng, b, p.Tk, j0, BC));
        const uint16_t *K = sK + buf * BC * ld, *V = sV + buf * BC * ldv;
        const int *kp = sKp + buf * BC, *ks = sKs + buf * BC;

        /* S = Q K^T (16 rows of this warp x BC keys), fp32 */
        float s[BC / 8][4];
MMA_UNROLL
        for (int nt = 0; nt < BC / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        for (int kc = 0; kc < Dp / 16; kc++) {
            uint32_t a[4];
            mma_lda(a, sQ, ld, r0, 16 * kc);
MMA_UNROLL
            for (int np = 0; np < BC / 16; np++) {
                uint32_t bb[4];
                mma_ldb(bb, K, ld, 16 * np, 16 * kc);
                mt_mma_bf16_16816(s[2 * np], a, bb, s[2 * np]);
                mt_mma_bf16_16816(s[2 * np + 1], a, bb + 2, s[2 * np + 1]);
            }
        }
        /* mask, online softmax: lane holds rows g (e = 0, 1) and g + 8 (e = 2, 3) */
        float mx[2] = {-INFINITY, -INFINITY};
MMA_UNROLL
        for (int nt = 0; nt < BC / 8; nt++)
MMA_UNROLL
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1, r = r0 + g + 8 * rr, c = 8 * nt + 2 * t4 + (e & 1);
                float dc;
                float x = mma_logit2(p, s[nt][e], &dc);
                if (!full && !(i0 + r < p.Tq && j0 + c < p.Tk && mma_allowed(p, sQp[r], sQs[r], kp[c], ks[c])))
                    x = -INFINITY;
                s[nt][e] = x;
                mx[rr] = fmaxf(mx[rr], x);
            }
        float corr[2], ls[2] = {0.0f, 0.0f};
MMA_UNROLL
        for (int rr = 0; rr < 2; rr++) {
            const float mn = fmaxf(m[rr], mma_quad_max(mx[rr]));
            corr[rr] = mn == -INFINITY ? 1.0f : exp2f(m[rr] - mn); /* 0 when m was -inf */
            m[rr] = mn;
        }
MMA_UNROLL
        for (int nt = 0; nt < BC / 8; nt++)
MMA_UNROLL
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1;
                const float pe = m[rr] == -INFINITY ? 0.0f : exp2f(s[nt][e] - m[rr]); /* masked: exp2(-inf) = 0 */
                s[nt][e] = pe;
                ls[rr] += pe;
            }
MMA_UNROLL
        for (int rr = 0; rr < 2; rr++) l[rr] = l[rr] * corr[rr] + ls[rr];
MMA_UNROLL
        for (int nt = 0; nt < DV / 8; nt++)
MMA_UNROLL
            for (int e = 0; e < 4; e++) o[nt][e] *= corr[e >> 1];
        /* O += bf16(P) V[:, c0 .. c0 + nc): P's accumulator layout is mma's A layout */
MMA_UNROLL
        for (int kc = 0; kc < BC / 16; kc++) {
            uint32_t a[4];
            mma_frag(a, s, kc);
            const uint16_t *vk = V + (16 * kc + 2 * t4) * ldv + g;
MMA_UNROLL
            for (int nt = 0; nt < DV / 8; nt++) {
                if (8 * nt >= nc) break; /* block-uniform */
                const uint32_t bb[2] = {mma_gather2(vk + 8 * nt, ldv), mma_gather2(vk + 8 * ldv + 8 * nt, ldv)};
                mt_mma_bf16_16816(o[nt], a, bb, o[nt]);
            }
        }
        __syncthreads(); /* buffer `buf` is free for the prefetch two tiles on */
        buf ^= 1;
        jt = jn;
    }

MMA_UNROLL
    for (int rr = 0; rr < 2; rr++) {
        const float lt = mma_quad_sum(l[rr]);
        const int64_t i = i0 + r0 + g + 8 * rr;
        if (i >= p.Tq) continue;
        const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
        mma_store_row<DV>(out + ((b * p.Tq + i) * p.H + h) * p.Dh + c0 + 2 * t4, o, rr, inv, nc);
        if (c0 == 0 && t4 == 0) lse[(b * p.H + h) * p.Tq + i] = lt > 0.0f ? (m[rr] + log2f(lt)) * MMA_LN2 : -INFINITY;
    }
}

/* Dv[b, h, i] = <dout_i, out_i> in fp32 (exact bf16 products, a fixed lane tree): one
 * warp per (b, i, h) row. */
__global__ void mma_dot_kernel(float *Dv, const uint16_t *dout, const uint16_t *out, int64_t B, int64_t Tq,
                               int64_t H, int64_t Dh) {
    const int64_t rows = B * Tq * H;
    const int lane = threadIdx.x & 31;
    for (int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < rows;
         row += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        const uint16_t *a = dout + row * Dh, *o = out + row * Dh;
        float s = 0.0f;
        for (int64_t d = lane; d < Dh; d += 32)
            s += __uint_as_float((uint32_t)a[d] << 16) * __uint_as_float((uint32_t)o[d] << 16);
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        const int64_t h = row % H, bi = row / H, i = bi % Tq, b = bi / Tq;
        if (lane == 0) Dv[(b * H + h) * Tq + i] = s;
    }
}

/* dQ for 16 NW queries of one (batch, head), columns [c0, c0 + nc). */
template <int NW, int BK, int DV, int DK>
__global__ void __launch_bounds__(NW * 32)
    mma_dq_kernel(mma_p p, uint16_t *dq, const uint16_t *dout, const uint16_t *q, const uint16_t *k,
                  const uint16_t *v, const float *lse, const float *Dv) {
    constexpr int BQ = 16 * NW;
    extern __shared__ __align__(16) unsigned char mma_sm[];
    const int Dp = DK ? DK : p.Dp, ld = DK ? DK + 8 : p.ld, Dh = (int)p.Dh;
    const int64_t b = blockIdx.z / p.nsl, h = blockIdx.y, hk = h / p.G, i0 = (int64_t)blockIdx.x * BQ;
    const int c0 = (int)(blockIdx.z % p.nsl) * DV, nc = Dh - c0 < DV ? Dh - c0 : DV;
    uint16_t *sQ = (uint16_t *)mma_sm; /* [BQ][ld] */
    uint16_t *sO = sQ + BQ * ld;       /* [BQ][ld] dout */
    uint16_t *sK = sO + BQ * ld;       /* [2][BK][ld] */
    uint16_t *sV = sK + 2 * BK * ld;   /* [2][BK][ld] */
    int *sQp = (int *)(sV + 2 * BK * ld), *sQs = sQp + BQ, *sKp = sQs + BQ, *sKs = sKp + 2 * BK;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3, r0 = 16 * w;
    const int nKt = (int)((p.Tk + BK - 1) / BK);

    mma_zero_cols(sQ, ld, 2 * BQ, Dh, Dp); /* sQ and sO */
    mma_zero_cols(sK, ld, 4 * BK, Dh, Dp); /* sK and sV */
    mma_load(sQ, ld, q, b, p.Tq, p.H, h, Dh, i0, BQ, 0, Dh);
    mma_load(sO, ld, dout, b, p.Tq, p.H, h, Dh, i0, BQ, 0, Dh);
    mma_load_meta(sQp, sQs, p.q_pos, p.q_seg, b, p.Tq, i0, BQ);
    float L2[2], Di[2];
MMA_UNROLL
    for (int rr = 0; rr < 2; rr++) {
        const int64_t i = i0 + r0 + g + 8 * rr;
        L2[rr] = i < p.Tq ? lse[(b * p.H + h) * p.Tq + i] * MMA_LOG2E : 0.0f;
        Di[rr] = i < p.Tq ? Dv[(b * p.H + h) * p.Tq + i] : 0.0f;
    }
    const mma_rng qr = mma_range(p.q_rng, b, p.Tq, i0, BQ);
    const bool qfull = i0 + BQ <= p.Tq;
    int jt = mma_next_k(p, qr, b, BK, 0, nKt), buf = 0;
    if (jt < nKt) {
        mma_load(sK, ld, k, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jt * BK, BK, 0, Dh);
        mma_load(sV, ld, v, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jt * BK, BK, 0, Dh);
        mma_load_meta(sKp, sKs, p.k_pos, p.k_seg, b, p.Tk, (int64_t)jt * BK, BK);
    }
    mt_cp_async_commit();

    float acc[DV / 8][4];
MMA_UNROLL
    for (int nt = 0; nt < DV / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    while (jt < nKt) {
        const int jn = mma_next_k(p, qr, b, BK, jt + 1, nKt);
        if (jn < nKt) {
            const int nb = buf ^ 1;
            mma_load(sK + nb * BK * ld, ld, k, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jn * BK, BK, 0, Dh);
            mma_load(sV + nb * BK * ld, ld, v, b, p.Tk, p.Hkv, hk, Dh, (int64_t)jn * BK, BK, 0, Dh);
            mma_load_meta(sKp + nb * BK, sKs + nb * BK, p.k_pos, p.k_seg, b, p.Tk, (int64_t)jn * BK, BK);
        }
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        __syncthreads();
        const int64_t j0 = (int64_t)jt * BK;
        const bool full = qfull && j0 + BK <= p.Tk && mma_all(p, qr, mma_range(p.k_rng, b, p.Tk, j0, BK));
        const uint16_t *K = sK + buf * BK * ld, *V = sV + buf * BK * ld;
        const int *kp = sKp + buf * BK, *ks = sKs + buf * BK;

        /* S = Q K^T and dP = dO V^T */
        float s[BK / 8][4], dp[BK / 8][4];
        mma_two_products<BK>(s, dp, sQ, sO, K, V, ld, r0, Dp);
        /* dS = P (dP - D) (times the soft-cap's derivative); P = exp(s - lse) */
MMA_UNROLL
        for (int nt = 0; nt < BK / 8; nt++)
MMA_UNROLL
            for (int e = 0; e < 4; e++) {
                const int rr = e >> 1, r = r0 + g + 8 * rr, c = 8 * nt + 2 * t4 + (e & 1);
                float ds = 0.0f;
                if (full || (i0 + r < p.Tq && j0 + c < p.Tk && mma_allowed(p, sQp[r], sQs[r], kp[c], ks[c]))) {
                    float dc;
                    const float x = mma_logit2(p, s[nt][e], &dc);
                    ds = exp2f(x - L2[rr]) * (dp[nt][e] - Di[rr]) * dc;
                }
                s[nt][e] = ds;
            }
        /* dQ[:, c0 ..] += bf16(dS) K[:, c0 ..] */
MMA_UNROLL
        for (int kc = 0; kc < BK / 16; kc++) {
            uint32_t a[4];
            mma_frag(a, s, kc);
            const uint16_t *kk = K + (16 * kc + 2 * t4) * ld + c0 + g;
MMA_UNROLL
            for (int nt = 0; nt < DV / 8; nt++) {
                if (8 * nt >= nc) break;
                const uint32_t bb[2] = {mma_gather2(kk + 8 * nt, ld), mma_gather2(kk + 8 * ld + 8 * nt, ld)};
                mt_mma_bf16_16816(acc[nt], a, bb, acc[nt]);
            }
        }
        __syncthreads();
        buf ^= 1;
        jt = jn;
    }

MMA_UNROLL
    for (int rr = 0; rr < 2; rr++) {
        const int64_t i = i0 + r0 + g + 8 * rr;
        if (i >= p.Tq) continue;
        mma_store_row<DV>(dq + ((b * p.Tq + i) * p.H + h) * p.Dh + c0 + 2 * t4, acc, rr, p.scale, nc);
    }
}

/* dK, dV for 16 NW keys of one (batch, kv head), columns [c0, c0 + nc): loops over the
 * group's query heads and their query tiles (flattened f = head-in-group * nQt + tile). */
template <int NW, int BQ, int DV, int DK>
__global__ void __launch_bounds__(NW * 32)
    mma_dkdv_kernel(mma_p p, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                    const uint16_t *k, const uint16_t *v, const float *lse, const float *Dv) {
    constexpr int BKV = 16 * NW;
    extern __shared__ __align__(16) unsigned char mma_sm[];
    const int Dp = DK ? DK : p.Dp, ld = DK ? DK + 8 : p.ld, Dh = (int)p.Dh;
    const int64_t b = blockIdx.z / p.nsl, hk = blockIdx.y, j0 = (int64_t)blockIdx.x * BKV;
    const int c0 = (int)(blockIdx.z % p.nsl) * DV, nc = Dh - c0 < DV ? Dh - c0 : DV;
    uint16_t *sK = (uint16_t *)mma_sm; /* [BKV][ld] */
    uint16_t *sV = sK + BKV * ld;      /* [BKV][ld] */
    uint16_t *sQ = sV + BKV * ld;      /* [2][BQ][ld] */
    uint16_t *sO = sQ + 2 * BQ * ld;   /* [2][BQ][ld] dout */
    float *sL = (float *)(sO + 2 * BQ * ld), *sD = sL + 2 * BQ; /* [2][BQ] lse * log2(e), D */
    int *sQp = (int *)(sD + 2 * BQ), *sQs = sQp + 2 * BQ, *sKp = sQs + 2 * BQ, *sKs = sKp + BKV;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3, r0 = 16 * w;
    const int nQt = (int)((p.Tq + BQ - 1) / BQ), nF = (int)p.G * nQt;

    mma_zero_cols(sK, ld, 2 * BKV + 4 * BQ, Dh, Dp); /* sK, sV, sQ and sO */
    mma_load(sK, ld, k, b, p.Tk, p.Hkv, hk, Dh, j0, BKV, 0, Dh);
    mma_load(sV, ld, v, b, p.Tk, p.Hkv, hk, Dh, j0, BKV, 0, Dh);
    mma_load_meta(sKp, sKs, p.k_pos, p.k_seg, b, p.Tk, j0, BKV);
    const mma_rng kr = mma_range(p.k_rng, b, p.Tk, j0, BKV);
    const bool kfull = j0 + BKV <= p.Tk;

    /* first visited f >= f0 */
    auto next = [&](int f0) {
        for (int f = f0; f < nF; f++)
            if (mma_any(p, mma_range(p.q_rng, b, p.Tq, (int64_t)(f % nQt) * BQ, BQ), kr)) return f;
        return nF;
    };
    auto load_q = [&](int f, int nb) {
        const int64_t h = hk * p.G + f / nQt, i0 = (int64_t)(f % nQt) * BQ;
        mma_load(sQ + nb * BQ * ld, ld, q, b, p.Tq, p.H, h, Dh, i0, BQ, 0, Dh);
        mma_load(sO + nb * BQ * ld, ld, dout, b, p.Tq, p.H, h, Dh, i0, BQ, 0, Dh);
        mma_load_meta(sQp + nb * BQ, sQs + nb * BQ, p.q_pos, p.q_seg, b, p.Tq, i0, BQ);
        for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
            const int64_t i = i0 + r;
            sL[nb * BQ + r] = i < p.Tq ? lse[(b * p.H + h) * p.Tq + i] * MMA_LOG2E : 0.0f;
            sD[nb * BQ + r] = i < p.Tq ? Dv[(b * p.H + h) * p.Tq + i] : 0.0f;
        }
    };
    int f = next(0), buf = 0;
    if (f < nF) load_q(f, 0);
    mt_cp_async_commit();

    float adk[DV / 8][4], adv[DV / 8][4];
MMA_UNROLL
    for (int nt = 0; nt < DV / 8; nt++)
MMA_UNROLL
        for (int e = 0; e < 4; e++) adk[nt][e] = adv[nt][e] = 0.0f;

    while (f < nF) {
        const int fn = next(f + 1);
        if (fn < nF) load_q(fn, buf ^ 1);
        mt_cp_async_commit();
        mt_cp_async_wait<1>();
        __syncthreads();
        const int64_t i0 = (int64_t)(f % nQt) * BQ;
        const bool full = kfull && i0 + BQ <= p.Tq && mma_all(p, mma_range(p.q_rng, b, p.Tq, i0, BQ), kr);
        const uint16_t *Q = sQ + buf * BQ * ld, *O = sO + buf * BQ * ld;
        const float *L2 = sL + buf * BQ, *Dq = sD + buf * BQ;
        const int *qp = sQp + buf * BQ, *qs = sQs + buf * BQ;

        /* S^T = K Q^T and dP^T = V dO^T (16 keys of this warp x BQ queries) */
        float st[BQ / 8][4], dpt[BQ / 8][4];
        mma_two_products<BQ>(st, dpt, sK, sV, Q, O, ld, r0, Dp);
        /* P^T and dS^T: row = key r, column = query c */
MMA_UNROLL
        for (int nt = 0; nt < BQ / 8; nt++)
MMA_UNROLL
            for (int e = 0; e < 4; e++) {
                const int r = r0 + g + 8 * (e >> 1), c = 8 * nt + 2 * t4 + (e & 1);
                float pe = 0.0f, ds = 0.0f;
                if (full || (i0 + c < p.Tq && j0 + r < p.Tk && mma_allowed(p, qp[c], qs[c], sKp[r], sKs[r]))) {
                    float dc;
                    const float x = mma_logit2(p, st[nt][e], &dc);
                    pe = exp2f(x - L2[c]);
                    ds = pe * (dpt[nt][e] - Dq[c]) * dc;
                }
                st[nt][e] = pe;
                dpt[nt][e] = ds;
            }
        /* dV += bf16(P^T) dO[:, c0 ..], dK += bf16(dS^T) Q[:, c0 ..] */
MMA_UNROLL
        for (int kc = 0; kc < BQ / 16; kc++) {
            uint32_t ap[4], as[4];
            mma_frag(ap, st, kc);
            mma_frag(as, dpt, kc);
            const int off = (16 * kc + 2 * t4) * ld + c0 + g;
MMA_UNROLL
            for (int nt = 0; nt < DV / 8; nt++) {
                if (8 * nt >= nc) break;
                const uint32_t bo[2] = {mma_gather2(O + off + 8 * nt, ld), mma_gather2(O + off + 8 * ld + 8 * nt, ld)};
                const uint32_t bq[2] = {mma_gather2(Q + off + 8 * nt, ld), mma_gather2(Q + off + 8 * ld + 8 * nt, ld)};
                mt_mma_bf16_16816(adv[nt], ap, bo, adv[nt]);
                mt_mma_bf16_16816(adk[nt], as, bq, adk[nt]);
            }
        }
        __syncthreads();
        buf ^= 1;
        f = fn;
    }

MMA_UNROLL
    for (int rr = 0; rr < 2; rr++) {
        const int64_t j = j0 + r0 + g + 8 * rr;
        if (j >= p.Tk) continue;
        const int64_t base = ((b * p.Tk + j) * p.Hkv + hk) * p.Dh + c0 + 2 * t4;
        mma_store_row<DV>(dk + base, adk, rr, p.scale, nc);
        mma_store_row<DV>(dv + base, adv, rr, 1.0f, nc); /* x 1.0f: exact */
    }
}

/* ---------------------------------------------------------------- host side */

extern "C" int mt_cuda_attention_mma_supported(const mt_attn_args *a) {
    return a->dtype == MT_BF16 && a->Dh >= 8 && a->Dh <= MMA_DMAX && a->Dh % 8 == 0 && a->Hkv >= 1 &&
           a->H % a->Hkv == 0;
}

static mt_status mma_check(const mt_attn_args *a, const void *const *ptrs, int nptr) {
    if (!mt_cuda_attention_mma_supported(a))
        return mt_set_error(MT_ERR_INVALID, "cuda: attention (mma): unsupported arguments (dtype %d, head_dim %lld, "
                            "H %lld, Hkv %lld; bf16, head_dim a multiple of 8 in [8, 512], H %% Hkv == 0)",
                            (int)a->dtype, (long long)a->Dh, (long long)a->H, (long long)a->Hkv);
    if (a->H > 65535 || a->B * ((a->Dh + 127) / 128) > 65535)
        return mt_set_error(MT_ERR_INVALID, "cuda: attention (mma): H %lld or B %lld too large for the grid",
                            (long long)a->H, (long long)a->B);
    for (int i = 0; i < nptr; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0)
            return mt_set_error(MT_ERR_INVALID, "cuda: attention (mma): tensor argument %d is not 16-byte aligned", i);
    return MT_OK;
}

static mma_p mma_params(const mt_attn_args *a) {
    mma_p p;
    memset(&p, 0, sizeof p);
    p.B = a->B;
    p.Tq = a->Tq;
    p.Tk = a->Tk;
    p.H = a->H;
    p.Hkv = a->Hkv;
    p.G = a->H / a->Hkv;
    p.Dh = a->Dh;
    p.Dp = (int)((a->Dh + 15) / 16 * 16);
    p.ld = p.Dp + 8;
    p.scale = a->scale;
    p.scale_log2 = a->scale * MMA_LOG2E;
    p.softcap = a->softcap > 0.0f ? a->softcap : 0.0f;
    p.inv_softcap = a->softcap > 0.0f ? 1.0f / a->softcap : 0.0f;
    p.softcap_log2 = a->softcap > 0.0f ? a->softcap * MMA_LOG2E : 0.0f;
    p.window = a->window;
    p.q_pos = a->q_pos;
    p.k_pos = a->k_pos;
    const int seg = a->q_seg && a->k_seg;
    p.q_seg = seg ? a->q_seg : NULL;
    p.k_seg = seg ? a->k_seg : NULL;
    return p;
}

static size_t mma_align(size_t x) { return (x + 255) / 256 * 256; }

/* Scratch (the attention slot): [dv_bytes of D] [q ranges] [k ranges]; the range
 * kernel runs when positions or segment ids are given (else p.*_rng stay NULL). */
/* The layout of that scratch: the q ranges at *oq, the k ranges at *ok, total bytes returned. */
static size_t mma_scratch_layout(int64_t B, int64_t Tq, int64_t Tk, int ranges, size_t dv_bytes, size_t *oq,
                                 size_t *ok) {
    const size_t nq = (size_t)(B * ((Tq + 15) / 16)), nk = (size_t)(B * ((Tk + 15) / 16));
    *oq = mma_align(dv_bytes);
    *ok = *oq + mma_align(ranges ? nq * sizeof(mma_rng) : 0);
    return *ok + (ranges ? nk * sizeof(mma_rng) : 0);
}

extern "C" size_t mt_cuda_attention_mma_scratch(const mt_attn_args *a) {
    size_t oq, ok; /* the backward's: D = rowsum(dO * O) [B, H, Tq] fp32 first */
    return mma_scratch_layout(a->B, a->Tq, a->Tk, a->q_pos || a->k_pos || a->q_seg,
                              (size_t)(a->B * a->H * a->Tq) * sizeof(float), &oq, &ok);
}

static mt_status mma_scratch(mt_backend *be, mma_p *p, size_t dv_bytes, float **Dv) {
    const int ranges = p->q_pos || p->k_pos || p->q_seg;
    const size_t nq = (size_t)(p->B * ((p->Tq + 15) / 16)), nk = (size_t)(p->B * ((p->Tk + 15) / 16));
    size_t oq, ok;
    const size_t total = mma_scratch_layout(p->B, p->Tq, p->Tk, ranges, dv_bytes, &oq, &ok);
    unsigned char *s = NULL;
    if (total == 0) return MT_OK;
    MT_TRY(mt_cuda_scratch(be, MT_CUDA_SCRATCH_ATTN, total, (void **)&s));
    if (Dv) *Dv = (float *)s;
    if (!ranges) return MT_OK;
    p->q_rng = (const mma_rng *)(s + oq);
    p->k_rng = (const mma_rng *)(s + ok);
    mma_range_kernel<<<mt_cuda_blocks((int64_t)nq, 128), 128>>>((mma_rng *)(s + oq), p->q_pos, p->q_seg, p->B, p->Tq);
    MT_CUDA_LAUNCHED(be, "mma_range_kernel");
    mma_range_kernel<<<mt_cuda_blocks((int64_t)nk, 128), 128>>>((mma_rng *)(s + ok), p->k_pos, p->k_seg, p->B, p->Tk);
    MT_CUDA_LAUNCHED(be, "mma_range_kernel");
    return MT_OK;
}

/* Opt a kernel in to `bytes` of dynamic shared memory (above 48 KiB), if the device has it. */
template <typename K>
static mt_status mma_smem(mt_backend *be, K kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return MT_OK;
    int dev = 0, optin = 0;
    MT_CUDA_TRY(be, cudaGetDevice(&dev));
    MT_CUDA_TRY(be, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if ((size_t)optin < bytes)
        return mt_set_error(MT_ERR_UNSUPPORTED, "cuda: attention (mma): needs %zu bytes of shared memory per block, "
                            "the device allows %d", bytes, optin);
    MT_CUDA_TRY(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return MT_OK;
}

static int mma_slices(int64_t Dh, int DV) { return (int)((Dh + DV - 1) / DV); }

template <int NW, int BC, int DV, int DK>
static mt_status mma_fwd_launch(mt_backend *be, mma_p p, void *out, float *lse, const void *q, const void *k,
                                const void *v) {
    constexpr int BR = 16 * NW;
    p.nsl = mma_slices(p.Dh, DV);
    p.ldv = (int)(p.Dh < DV ? p.Dh : DV) + 8;
    const size_t smem = 2 * ((size_t)BR * p.ld + 2 * (size_t)BC * p.ld + 2 * (size_t)BC * p.ldv) +
                        sizeof(int) * (2 * BR + 4 * BC);
    MT_TRY(mma_smem(be, mma_fwd_kernel<NW, BC, DV, DK>, smem));
    const dim3 grid((unsigned)((p.Tq + BR - 1) / BR), (unsigned)p.H, (unsigned)(p.B * p.nsl));
    mma_fwd_kernel<NW, BC, DV, DK><<<grid, NW * 32, smem>>>(p, (uint16_t *)out, lse, (const uint16_t *)q,
                                                            (const uint16_t *)k, (const uint16_t *)v);
    MT_CUDA_LAUNCHED(be, "mma_fwd_kernel");
    return MT_OK;
}

template <int NW, int BK, int DV, int DK>
static mt_status mma_dq_launch(mt_backend *be, mma_p p, void *dq, const void *dout, const void *q, const void *k,
                               const void *v, const float *lse, const float *Dv) {
    constexpr int BQ = 16 * NW;
    p.nsl = mma_slices(p.Dh, DV);
    const size_t smem = 2 * (2 * (size_t)BQ * p.ld + 4 * (size_t)BK * p.ld) + sizeof(int) * (2 * BQ + 4 * BK);
    MT_TRY(mma_smem(be, mma_dq_kernel<NW, BK, DV, DK>, smem));
    const dim3 grid((unsigned)((p.Tq + BQ - 1) / BQ), (unsigned)p.H, (unsigned)(p.B * p.nsl));
    mma_dq_kernel<NW, BK, DV, DK><<<grid, NW * 32, smem>>>(p, (uint16_t *)dq, (const uint16_t *)dout,
                                                           (const uint16_t *)q, (const uint16_t *)k,
                                                           (const uint16_t *)v, lse, Dv);
    MT_CUDA_LAUNCHED(be, "mma_dq_kernel");
    return MT_OK;
}

template <int NW, int BQ, int DV, int DK>
static mt_status mma_dkdv_launch(mt_backend *be, mma_p p, void *dk, void *dv, const void *dout, const void *q,
                                 const void *k, const void *v, const float *lse, const float *Dv) {
    constexpr int BKV = 16 * NW;
    p.nsl = mma_slices(p.Dh, DV);
    const size_t smem = 2 * (2 * (size_t)BKV * p.ld + 4 * (size_t)BQ * p.ld) + 4 * (2 * BQ) * sizeof(float) +
                        sizeof(int) * (2 * BKV);
    MT_TRY(mma_smem(be, mma_dkdv_kernel<NW, BQ, DV, DK>, smem));
    const dim3 grid((unsigned)((p.Tk + BKV - 1) / BKV), (unsigned)p.Hkv, (unsigned)(p.B * p.nsl));
    mma_dkdv_kernel<NW, BQ, DV, DK><<<grid, NW * 32, smem>>>(p, (uint16_t *)dk, (uint16_t *)dv,
                                                             (const uint16_t *)dout, (const uint16_t *)q,
                                                             (const uint16_t *)k, (const uint16_t *)v, lse, Dv);
    MT_CUDA_LAUNCHED(be, "mma_dkdv_kernel");
    return MT_OK;
}

extern "C" mt_status mt_cuda_attention_mma_fwd(mt_backend *be, const mt_attn_args *a, void *out, float *lse,
                                               const void *q, const void *k, const void *v) {
    MT_CUDA_ENTER(be);
    const void *ptrs[] = {out, q, k, v};
    MT_TRY(mma_check(a, ptrs, 4));
    if (a->B <= 0 || a->Tq <= 0 || a->H <= 0) return MT_OK;
    mma_p p = mma_params(a);
    if (p.Tk > 0) MT_TRY(mma_scratch(be, &p, 0, NULL));
    switch (a->Dh) {
    case 64: return mma_fwd_launch<4, 64, 64, 64>(be, p, out, lse, q, k, v);
    case 128: return mma_fwd_launch<4, 64, 128, 128>(be, p, out, lse, q, k, v);
    case 256: return mma_fwd_launch<4, 32, 256, 256>(be, p, out, lse, q, k, v);
    default: return mma_fwd_launch<2, 32, 128, 0>(be, p, out, lse, q, k, v);
    }
}

extern "C" mt_status mt_cuda_attention_mma_bwd(mt_backend *be, const mt_attn_args *a, void *dq, void *dk, void *dv,
                                               const void *dout, const void *q, const void *k, const void *v,
                                               const void *out, const float *lse) {
    MT_CUDA_ENTER(be);
    const void *ptrs[] = {dq, dk, dv, dout, q, k, v, out};
    MT_TRY(mma_check(a, ptrs, 8));
    if (a->B <= 0 || a->H <= 0) return MT_OK;
    const size_t nq = (size_t)(a->B * a->Tq * a->H * a->Dh) * 2, nk = (size_t)(a->B * a->Tk * a->Hkv * a->Dh) * 2;
    if (a->Tq <= 0 || a->Tk <= 0) { /* nothing attends: zero gradients */
        if (nq) MT_CUDA_TRY(be, cudaMemsetAsync(dq, 0, nq, 0));
        if (nk) MT_CUDA_TRY(be, cudaMemsetAsync(dk, 0, nk, 0));
        if (nk) MT_CUDA_TRY(be, cudaMemsetAsync(dv, 0, nk, 0));
        return MT_OK;
    }
    mma_p p = mma_params(a);
    float *Dv = NULL;
    MT_TRY(mma_scratch(be, &p, (size_t)(p.B * p.H * p.Tq) * sizeof(float), &Dv));
    mma_dot_kernel<<<mt_cuda_blocks(p.B * p.Tq * p.H * 32, 256), 256>>>(Dv, (const uint16_t *)dout,
                                                                       (const uint16_t *)out, p.B, p.Tq, p.H, p.Dh);
    MT_CUDA_LAUNCHED(be, "mma_dot_kernel");
    switch (a->Dh) {
    case 64:
        MT_TRY((mma_dkdv_launch<4, 64, 64, 64>(be, p, dk, dv, dout, q, k, v, lse, Dv)));
        return mma_dq_launch<4, 64, 64, 64>(be, p, dq, dout, q, k, v, lse, Dv);
    case 128:
        MT_TRY((mma_dkdv_launch<4, 64, 128, 128>(be, p, dk, dv, dout, q, k, v, lse, Dv)));
        return mma_dq_launch<4, 64, 128, 128>(be, p, dq, dout, q, k, v, lse, Dv);
    case 256:
        MT_TRY((mma_dkdv_launch<4, 32, 128, 256>(be, p, dk, dv, dout, q, k, v, lse, Dv)));
        return mma_dq_launch<4, 32, 256, 256>(be, p, dq, dout, q, k, v, lse, Dv);
    default:
        MT_TRY((mma_dkdv_launch<2, 16, 128, 0>(be, p, dk, dv, dout, q, k, v, lse, Dv)));
        return mma_dq_launch<2, 16, 128, 0>(be, p, dq, dout, q, k, v, lse, Dv);
    }
}
