/* kernels/cpu/attention.c: block-wise causal attention with an online softmax
 * (Dao, "FlashAttention-2", 2023, algorithms 1 and 2) for one CPU.
 *
 * Why this shape:
 * - Queries are cut into blocks of BQ rows and keys into blocks of MT_ATT_BK; a thread
 *   holds one query block, one key block and BQ x BK scores in scratch (a few hundred
 *   KiB at head_dim 256, sized to stay in L2). No [Tq, Tk] matrix ever exists.
 * - Every block product is one small routine, att_mm, whose vectors run along
 *   contiguous rows (keys are transposed into Kt[Dh][BK] on load) with a 6 x 16 block of
 *   the output held in registers, so no horizontal reductions are needed; exp/tanh come
 *   from vmath.h so the softmax loops vectorise too. CBLAS is not used: OpenBLAS's
 *   thread pool must not be entered from inside an OpenMP region, and these products
 *   are too small for it anyway.
 * - Loads are reused while they fit in MT_ATT_KCACHE floats per thread: the forward
 *   keeps the transposed key blocks of the (batch, kv head) a thread last worked on, so
 *   consecutive query blocks of a head do not transpose the same keys again (values are
 *   read in place), and the by_kv backward keeps its task's loaded query blocks instead
 *   of reloading them for every key block. Reuse changes no value. The softmax loops of
 *   the forward and of each backward block pair run with a fused-multiply-add exp where
 *   the CPU has AVX2 and FMA, else in AVX2 or baseline clones (MT_CPU_SIMD_CLONES).
 * - The scale is folded into the query copy, so the kernels see s = (scale q) . k.
 * - A (query block, key block) pair whose position ranges make every entry masked is
 *   skipped; one where every entry is allowed skips the per-element mask test. With
 *   document masking (q_seg / k_seg) a pair is also skipped when the blocks' segment id
 *   ranges do not meet, and is "all allowed" only when every row of both blocks has one
 *   and the same id; otherwise the per-element test checks the ids as well.
 * Forward: one task per (batch, head, query block), each writing disjoint rows of out
 * and lse, so it is deterministic under any schedule.
 * Backward: dq sums over key blocks and dk/dv sum over query blocks and over the G = H /
 * Hkv query heads sharing a kv head; without atomics each sum needs one owner that adds
 * in a fixed order. Two schedules give bitwise the same result:
 *   by_kv:  one task per (batch, kv head) walks key blocks, then the group's heads, then
 *           query blocks, owning dk/dv of its key block and dq of its heads (no
 *           recomputation, but only B * Hkv tasks);
 *   split:  tasks per (batch, kv head, key block) compute dk/dv, then tasks per (batch,
 *           head, query block) compute dq, recomputing scores (about 7/5 the work, but
 *           plenty of tasks).
 * by_kv is used when B * Hkv covers the threads. Both add the same products in the same
 * order (dq over increasing key blocks; dk/dv over heads of the group, then increasing
 * query blocks), so the choice, and hence the thread count, never changes a bit.
 * bf16 (mt_attn_args.dtype, cpu_dtype.h): q, k, v, dout and out are widened exactly as
 * they are loaded into the fp32 blocks above (the forward then also widens each value
 * block, which fp32 reads in place); scores, max, sums and every accumulator are fp32,
 * and each output (out, dq, dk, dv) is rounded once when it is stored. Inside, the
 * operands that FlashAttention-2's bf16 kernels feed to the tensor cores are rounded to
 * bf16 (to nearest even) where ops.h says: the forward's P = exp(s - m) after the online
 * softmax has added it to l and before P @ V; the backward's recomputed P = exp(s - lse)
 * before dV += P^T dO, and dS = P (dP - D) (times the soft-cap derivative, from the fp32
 * P) before dQ += dS K and dK += dS^T (scale q) (att_bwd_pair). The backward runs the
 * split schedule only, since by_kv adds dq straight into the output tensor, which a bf16
 * dq cannot hold; the result is therefore again fixed by the shapes. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vmath.h"

#define MT_ATT_BK 64 /* keys per block: the length of every vectorised score row */

/* Query rows per block: smaller at large head_dim so the scratch stays in L2. */
static int64_t att_bq(int64_t Dh) { return Dh <= 128 ? 64 : 32; }

typedef struct att_geom {
    int64_t B, Tq, Tk, H, Hkv, Dh, G;
    int64_t q_rs, k_rs; /* row strides: H * Dh for q/out/dq, Hkv * Dh for k/v/dk/dv */
    int64_t bq, nqb, nkb;
    float scale, softcap;
    int64_t window;
    const int32_t *q_pos, *k_pos;
    const int32_t *q_seg, *k_seg; /* [B, Tq] / [B, Tk] or NULL (no document masking) */
    mt_dtype dt;                  /* of q, k, v, out, dout, dq, dk, dv */
} att_geom;

static att_geom att_geom_make(const mt_attn_args *a) {
    att_geom g;
    g.B = a->B;
    g.Tq = a->Tq;
    g.Tk = a->Tk;
    g.H = a->H;
    g.Hkv = a->Hkv;
    g.Dh = a->Dh;
    g.G = a->H / a->Hkv;
    g.q_rs = a->H * a->Dh;
    g.k_rs = a->Hkv * a->Dh;
    g.bq = att_bq(a->Dh);
    g.nqb = (a->Tq + g.bq - 1) / g.bq;
    g.nkb = (a->Tk + MT_ATT_BK - 1) / MT_ATT_BK;
    g.scale = a->scale;
    g.softcap = a->softcap;
    g.window = a->window;
    g.q_pos = a->q_pos;
    g.k_pos = a->k_pos;
    g.q_seg = a->q_seg && a->k_seg ? a->q_seg : NULL;
    g.k_seg = a->q_seg && a->k_seg ? a->k_seg : NULL;
    g.dt = a->dtype;
    return g;
}

static inline int64_t att_qpos(const att_geom *g, int64_t i) {
    return g->q_pos ? (int64_t)g->q_pos[i] : i;
}
static inline int64_t att_kpos(const att_geom *g, int64_t j) {
    return g->k_pos ? (int64_t)g->k_pos[j] : j;
}
static inline int att_allowed(const att_geom *g, int64_t qp, int64_t kp) {
    const int64_t d = qp - kp;
    return d >= 0 && (g->window <= 0 || d < g->window);
}

/* Same document: always true without segment ids. */
static inline int att_same_seg(const att_geom *g, int64_t b, int64_t i, int64_t j) {
    return !g->q_seg || g->q_seg[b * g->Tq + i] == g->k_seg[b * g->Tk + j];
}

enum { ATT_SKIP = 0, ATT_PARTIAL = 1, ATT_FULL = 2 };

/* Whether the pair (query rows [i0, i0+nq), key rows [j0, j0+nk)) of sequence b is
 * entirely masked, entirely allowed, or mixed, judged from the position ranges
 * (positions need not be sorted: context parallelism passes two chunks) and, with
 * document masking, the segment id ranges (ids need not be sorted either). */
static int att_pair_kind(const att_geom *g, int64_t b, int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
    int64_t qmin = INT64_MAX, qmax = INT64_MIN, kmin = INT64_MAX, kmax = INT64_MIN;
    for (int64_t i = i0; i < i0 + nq; i++) {
        const int64_t p = att_qpos(g, i);
        qmin = p < qmin ? p : qmin;
        qmax = p > qmax ? p : qmax;
    }
    for (int64_t j = j0; j < j0 + nk; j++) {
        const int64_t p = att_kpos(g, j);
        kmin = p < kmin ? p : kmin;
        kmax = p > kmax ? p : kmax;
    }
    if (qmax < kmin || (g->window > 0 && qmin - kmax >= g->window)) return ATT_SKIP;
    int kind = qmin >= kmax && (g->window <= 0 || qmax - kmin < g->window) ? ATT_FULL : ATT_PARTIAL;
    if (g->q_seg) {
        const int32_t *qs = g->q_seg + b * g->Tq + i0, *ks = g->k_seg + b * g->Tk + j0;
        int32_t qsmin = INT32_MAX, qsmax = INT32_MIN, ksmin = INT32_MAX, ksmax = INT32_MIN;
        for (int64_t i = 0; i < nq; i++) {
            qsmin = qs[i] < qsmin ? qs[i] : qsmin;
            qsmax = qs[i] > qsmax ? qs[i] : qsmax;
        }
        for (int64_t j = 0; j < nk; j++) {
            ksmin = ks[j] < ksmin ? ks[j] : ksmin;
            ksmax = ks[j] > ksmax ? ks[j] : ksmax;
        }
        if (qsmax < ksmin || ksmax < qsmin) return ATT_SKIP; /* no id in common */
        if (!(qsmin == qsmax && ksmin == ksmax && qsmin == ksmin)) kind = ATT_PARTIAL;
    }
    return kind;
}

/* ---- block kernels (rows of S and P have MT_ATT_BK entries) ---- */

/* C[m, n] += sum_{k < K} A[m rs_a + k cs_a] B[k ldb + n] for m < M, n < N: the one
 * product every step of the algorithm is made of (strided A gives the transposed
 * products for dk and dv). Each C element is summed in increasing k on top of its old
 * value, whichever path below handles it, so the result is fixed by the shapes.
 * The main path keeps a 6 x 16 (or 4 x 16) block of C in registers (GCC vector extensions; a
 * plain loop re-loads and re-stores C for every k and runs at about half the speed). */
#if defined(__GNUC__)
typedef float att_v8 __attribute__((vector_size(32)));
/* unaligned, aliasing view of 8 floats (macros, not functions: passing 32-byte vectors
 * by value to a function compiled without AVX is an ABI hazard GCC warns about) */
typedef float att_v8u __attribute__((vector_size(32), aligned(4), may_alias));
#define att_ld(p) ((att_v8)(*(const att_v8u *)(p)))
#define att_st(p, v) (*(att_v8u *)(p) = (v))

/* One R x 16 tile of C at (m, n): C[m + r, n..n+15] += sum_k a[r rs_a + k cs_a] *
 * B[k ldb + n..n+15], each element summed in increasing k (a = A + m rs_a). ROWS is
 * ATT_ROWS6 or ATT_ROWS4: it applies a per-row macro to rows 0..R-1 in order, so the
 * R rows' loads, multiply-adds (row by row within each k) and stores are written once. */
#define ATT_ROWS6(F) F(0) F(1) F(2) F(3) F(4) F(5)
#define ATT_ROWS4(F) F(0) F(1) F(2) F(3)
#define ATT_ROW_LD(r) \
    att_v8 x##r##0 = att_ld(C + (m + r) * ldc + n), x##r##1 = att_ld(C + (m + r) * ldc + n + 8);
#define ATT_ROW_MADD(r)                  \
    {                                    \
        const float a##r = ak[r * rs_a]; \
        ATT_MADD(x##r##0, a##r, b0);     \
        ATT_MADD(x##r##1, a##r, b1);     \
    }
#define ATT_ROW_ST(r)                       \
    att_st(C + (m + r) * ldc + n, x##r##0); \
    att_st(C + (m + r) * ldc + n + 8, x##r##1);
#define ATT_TILE(ROWS)                                           \
    do {                                                         \
        ROWS(ATT_ROW_LD)                                         \
        const float *restrict bk = B + n, *restrict ak = a;      \
        for (int64_t k = 0; k < K; k++, bk += ldb, ak += cs_a) { \
            const att_v8 b0 = att_ld(bk), b1 = att_ld(bk + 8);   \
            ROWS(ATT_ROW_MADD)                                   \
        }                                                        \
        ROWS(ATT_ROW_ST)                                         \
    } while (0)

/* The loops of att_mm_plain and att_mm_fma (they differ only in ATT_MADD, defined
 * before each): C[M, N] += A[M, K] B[K, N] with A strided (rs_a, cs_a). First 6 x 16
 * tiles (12 accumulators + 2 B vectors fill the 16 ymm registers), then 4 x 16, the
 * columns past the last multiple of 16 of those rows, then the remaining rows (k outer,
 * n inner). Uses C, ldc, A, rs_a, cs_a, B, ldb, M, N, K and m (0 on entry). */
#define ATT_MM_TILED_ROWS()                                                                    \
    const int64_t N16 = N / 16 * 16;                                                           \
    for (; m + 4 <= M;) {                                                                      \
        const float *restrict a = A + m * rs_a;                                                \
        const int six = m + 6 <= M;                                                            \
        for (int64_t n = 0; n < N16; n += 16) {                                                \
            if (six)                                                                           \
                ATT_TILE(ATT_ROWS6);                                                           \
            else                                                                               \
                ATT_TILE(ATT_ROWS4);                                                           \
        }                                                                                      \
        const int64_t R = six ? 6 : 4;                                                         \
        for (int64_t r = 0; r < R && N16 < N; r++) /* columns N16..N-1 */                      \
            for (int64_t k = 0; k < K; k++) {                                                  \
                const float ak = a[r * rs_a + k * cs_a];                                       \
                for (int64_t n = N16; n < N; n++) C[(m + r) * ldc + n] += ak * B[k * ldb + n]; \
            }                                                                                  \
        m += R;                                                                                \
    }
#endif

/* The rows below the last tile, k outer, n inner (every compiler). */
#define ATT_MM_LAST_ROWS()                                     \
    for (; m < M; m++) {                                       \
        float *restrict c = C + m * ldc;                       \
        for (int64_t k = 0; k < K; k++) {                      \
            const float ak = A[m * rs_a + k * cs_a];           \
            const float *restrict b = B + k * ldb;             \
            _Pragma("omp simd")                                \
            for (int64_t n = 0; n < N; n++) c[n] += ak * b[n]; \
        }                                                      \
    }

#define ATT_MADD(x, a, b) ((x) += (a) * (b))
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
/* An AVX2 clone, chosen at load time where the CPU has it, runs the 8-wide vectors as
 * single ymm operations and broadcasts A from memory; products and sums stay unfused. */
__attribute__((target_clones("avx2", "default")))
#endif
static void att_mm_plain(float *restrict C, int64_t ldc, const float *restrict A, int64_t rs_a,
                   int64_t cs_a, const float *restrict B, int64_t ldb, int64_t M, int64_t N,
                   int64_t K) {
    int64_t m = 0;
#if defined(__GNUC__)
    ATT_MM_TILED_ROWS();
#endif
    ATT_MM_LAST_ROWS();
}
#undef ATT_MADD

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include <immintrin.h>
/* The same loops with each product and sum fused (one rounding, FMA3), used where the
 * CPU has AVX2 and FMA: about 1.6x the throughput of the unfused ymm clone. Which
 * variant runs depends only on the CPU, never on the thread count or schedule, so every
 * result is still fixed by the shapes on a given machine. */
#define ATT_MADD(x, a, b) ((x) = (att_v8)_mm256_fmadd_ps(_mm256_set1_ps(a), (__m256)(b), (__m256)(x)))
__attribute__((target("avx2,fma"))) static void att_mm_fma(float *restrict C, int64_t ldc, const float *restrict A, int64_t rs_a,
                   int64_t cs_a, const float *restrict B, int64_t ldb, int64_t M, int64_t N,
                   int64_t K) {
    int64_t m = 0;
    ATT_MM_TILED_ROWS();
    ATT_MM_LAST_ROWS();
}
#undef ATT_MADD
#endif

/* 1 where the CPU has AVX2 and FMA: the fused variants below run there. */
static int att_cpu_fma(void) {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    /* reads the CPU model that libgcc fills in at load time (no write, no race) */
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

static void att_mm(float *restrict C, int64_t ldc, const float *restrict A, int64_t rs_a,
                   int64_t cs_a, const float *restrict B, int64_t ldb, int64_t M, int64_t N,
                   int64_t K) {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    if (att_cpu_fma()) {
        att_mm_fma(C, ldc, A, rs_a, cs_a, B, ldb, M, N, K);
        return;
    }
#endif
    att_mm_plain(C, ldc, A, rs_a, cs_a, B, ldb, M, N, K);
}

/* S[i, j] = sum_d A[i, d] Bt[d, j] for i < nq and all MT_ATT_BK columns. */
static void att_scores(float *restrict S, const float *restrict A, const float *restrict Bt,
                       int64_t nq, int64_t Dh) {
    memset(S, 0, (size_t)(nq * MT_ATT_BK) * sizeof(float));
    att_mm(S, MT_ATT_BK, A, Dh, 1, Bt, MT_ATT_BK, nq, MT_ATT_BK, Dh);
}

/* Soft-cap and mask the scores in place: columns >= nk and disallowed pairs (positions,
 * or different documents) of sequence b get -inf. */
static void att_cap_mask(const att_geom *g, float *restrict S, int64_t b, int64_t i0, int64_t nq,
                         int64_t j0, int64_t nk, int kind) {
    const float cap = g->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t i = 0; i < nq; i++) {
        float *restrict s = S + i * MT_ATT_BK;
        if (cap > 0.0f) {
#pragma omp simd
            for (int64_t j = 0; j < MT_ATT_BK; j++) s[j] = cap * mt_vtanhf(s[j] * inv_cap);
        }
        if (kind == ATT_PARTIAL) {
            const int64_t qp = att_qpos(g, i0 + i);
            for (int64_t j = 0; j < nk; j++)
                if (!att_allowed(g, qp, att_kpos(g, j0 + j)) || !att_same_seg(g, b, i0 + i, j0 + j))
                    s[j] = -INFINITY;
        }
        for (int64_t j = nk; j < MT_ATT_BK; j++) s[j] = -INFINITY;
    }
}

/* O[i, :] += sum_{j < nk} P[i, j] X[j, :], rows of O strided by o_rs, of X by x_rs. */
static void att_acc_rows(float *restrict O, int64_t o_rs, const float *restrict P,
                         const float *restrict X, int64_t x_rs, int64_t nq, int64_t nk,
                         int64_t Dh) {
    att_mm(O, o_rs, P, MT_ATT_BK, 1, X, x_rs, nq, Dh, nk);
}

/* Acc[j, :] += sum_{i < nq} P[i, j] X[i, :] (the transposed product, for dk and dv). */
static void att_acc_cols(float *restrict Acc, const float *restrict P, const float *restrict X,
                         int64_t nq, int64_t nk, int64_t Dh) {
    att_mm(Acc, Dh, P, 1, MT_ATT_BK, X, Dh, nk, Dh, nq);
}

/* ---- the exponentials ----
 * The softmax loops take about a quarter of the forward. Where the CPU has AVX2 and FMA
 * they run with mt_vexpf_fma (vmath.h: the same exp with fused steps, about half the
 * instructions); elsewhere with mt_vexpf in the AVX2 or baseline clone. As with att_mm,
 * the variant depends only on the CPU, so results stay fixed by the shapes on a given
 * machine; forward and backward use the same exp. */

/* The online-softmax step of one block pair (FlashAttention-2 algorithm 1): for each of
 * the nq rows of S (MT_ATT_BK scores, masked ones -inf) the running max m[i] and sum l[i]
 * are updated, the row becomes P = exp(s - m_new), and row i of O ([nq][Dh]) is rescaled
 * by exp(m_old - m_new). A row with nothing allowed yet becomes zeros. */
#define ATT_ONLINE_SOFTMAX(EXP)                                             \
    for (int64_t i = 0; i < nq; i++) {                                      \
        float *restrict s = S + i * MT_ATT_BK;                              \
        float mx = -INFINITY;                                               \
        _Pragma("omp simd reduction(max : mx)")                             \
        for (int64_t j = 0; j < MT_ATT_BK; j++) mx = s[j] > mx ? s[j] : mx; \
        const float mnew = m[i] > mx ? m[i] : mx;                           \
        if (mnew == -INFINITY) { /* nothing allowed yet in this row */      \
            for (int64_t j = 0; j < MT_ATT_BK; j++) s[j] = 0.0f;            \
            continue;                                                       \
        }                                                                   \
        float sum = 0.0f;                                                   \
        _Pragma("omp simd reduction(+ : sum)")                              \
        for (int64_t j = 0; j < MT_ATT_BK; j++) {                           \
            const float p = EXP(s[j] - mnew);                               \
            s[j] = p;                                                       \
            sum += p;                                                       \
        }                                                                   \
        const float alpha = EXP(m[i] - mnew);                               \
        l[i] = l[i] * alpha + sum;                                          \
        m[i] = mnew;                                                        \
        if (alpha != 1.0f) {                                                \
            float *restrict o = O + i * Dh;                                 \
            _Pragma("omp simd")                                             \
            for (int64_t d = 0; d < Dh; d++) o[d] *= alpha;                 \
        }                                                                   \
    }

/* P[i, :] = exp(S[i, :] - lse[i]) for the nq rows of one block pair (the backward's
 * recomputed probabilities); a row whose lse is -inf (no allowed key) becomes zeros. */
#define ATT_PROBS(EXP)                                                \
    for (int64_t i = 0; i < nq; i++) {                                \
        const float L = lse[i];                                       \
        float *restrict p = P + i * MT_ATT_BK;                        \
        const float *restrict s = S + i * MT_ATT_BK;                  \
        if (L == -INFINITY) {                                         \
            for (int64_t j = 0; j < MT_ATT_BK; j++) p[j] = 0.0f;      \
            continue;                                                 \
        }                                                             \
        _Pragma("omp simd")                                           \
        for (int64_t j = 0; j < MT_ATT_BK; j++) p[j] = EXP(s[j] - L); \
    }

MT_CPU_SIMD_CLONES
static void att_online_softmax_plain(float *restrict S, float *restrict m, float *restrict l,
                                     float *restrict O, int64_t nq, int64_t Dh) {
    ATT_ONLINE_SOFTMAX(mt_vexpf)
}

MT_CPU_SIMD_CLONES
static void att_probs_plain(float *restrict P, const float *restrict S, const float *restrict lse,
                            int64_t nq) {
    ATT_PROBS(mt_vexpf)
}

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void att_online_softmax_fma(float *restrict S, float *restrict m,
                                                                       float *restrict l, float *restrict O,
                                                                       int64_t nq, int64_t Dh) {
    ATT_ONLINE_SOFTMAX(mt_vexpf_fma)
}

__attribute__((target("avx2,fma"))) static void att_probs_fma(float *restrict P, const float *restrict S,
                                                              const float *restrict lse, int64_t nq) {
    ATT_PROBS(mt_vexpf_fma)
}
#endif

static void att_online_softmax(float *S, float *m, float *l, float *O, int64_t nq, int64_t Dh) {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    if (att_cpu_fma()) {
        att_online_softmax_fma(S, m, l, O, nq, Dh);
        return;
    }
#endif
    att_online_softmax_plain(S, m, l, O, nq, Dh);
}

static void att_probs(float *P, const float *S, const float *lse, int64_t nq) {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
    if (att_cpu_fma()) {
        att_probs_fma(P, S, lse, nq);
        return;
    }
#endif
    att_probs_plain(P, S, lse, nq);
}

/* Copy key rows [j0, j0+nk) of head hk (src of g->dt, widened to fp32): transposed
 * into Xt[Dh][BK] (zero-padded to BK columns) when Xt is non-NULL, row-major into
 * X[nk][Dh] when X is non-NULL. */
static void att_load_keys(const att_geom *g, float *restrict Xt, float *restrict X,
                          const void *src, int64_t b, int64_t hk, int64_t j0, int64_t nk) {
    const int64_t Dh = g->Dh;
    for (int64_t j = 0; j < nk; j++) {
        const int64_t off = ((b * g->Tk + j0 + j) * g->Hkv + hk) * Dh;
        if (X) mt_cpu_load(X + j * Dh, src, off, Dh, g->dt);
        if (Xt)
            for (int64_t d = 0; d < Dh; d++) Xt[d * MT_ATT_BK + j] = mt_cpu_ld(src, off + d, g->dt);
    }
    if (Xt)
        for (int64_t d = 0; d < Dh; d++)
            for (int64_t j = nk; j < MT_ATT_BK; j++) Xt[d * MT_ATT_BK + j] = 0.0f;
}

/* x[0, n) = x rounded to bf16 (nearest even) and widened back: a tensor-core operand of
 * the bf16 path (ops.h attention_fwd / attention_bwd). */
static void att_round_bf16(float *restrict x, int64_t n) {
    for (int64_t e = 0; e < n; e++) x[e] = mt_bf16_to_f32(mt_f32_to_bf16(x[e]));
}

/* Fill n floats with NaN: the visible result of a failed scratch allocation (the op has
 * no status to return; a NaN loss is caught by the trainer). */
static void att_fill_nan(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

/* ---- forward ---- */

/* Per-thread limit (floats, here 4 MiB) of the reused loads: the forward's transposed
 * key blocks of the last (batch, kv head) a thread saw (a thread's consecutive tasks are
 * mostly query blocks of one head, and each would otherwise transpose the same key
 * blocks again) and the by_kv backward's query blocks. Beyond it, loads repeat. */
#define MT_ATT_KCACHE ((int64_t)1 << 20)

typedef struct att_fwd_scratch {
    float *Qs, *Kt, *S, *O, *m, *l;
    float *Vb; /* bf16 only: one value block [BK][Dh], widened */
    /* key-block cache: Kt is nkb blocks of [Dh][BK] when kcache is set, else one block;
     * block kb holds (b, hk) = (kc_b, kc_hk) when have[kb] is set */
    int kcache;
    int64_t kc_b, kc_hk;
    unsigned char *have;
} att_fwd_scratch;

static float *att_scratch_alloc(size_t floats) {
    size_t bytes = (floats * sizeof(float) + 255) / 256 * 256;
    return aligned_alloc(256, bytes);
}

MT_CPU_SIMD_CLONES /* the softmax loops: 8-wide exp where the CPU has AVX2 */
static void att_fwd_task(const att_geom *g, att_fwd_scratch *sc, int64_t b, int64_t h,
                         int64_t qb, void *out, float *lse, const void *q, const void *k,
                         const void *v) {
    const int64_t Dh = g->Dh, i0 = qb * g->bq;
    const int64_t nq = g->Tq - i0 < g->bq ? g->Tq - i0 : g->bq;
    const int64_t hk = h / g->G;
    float *restrict Qs = sc->Qs, *restrict O = sc->O, *restrict m = sc->m, *restrict l = sc->l;
    float *restrict S = sc->S;

    for (int64_t i = 0; i < nq; i++) {
        const float scale = g->scale;
        mt_cpu_load(Qs + i * Dh, q, (b * g->Tq + i0 + i) * g->q_rs + h * Dh, Dh, g->dt);
#pragma omp simd
        for (int64_t d = 0; d < Dh; d++) Qs[i * Dh + d] = scale * Qs[i * Dh + d];
        m[i] = -INFINITY;
        l[i] = 0.0f;
    }
    memset(O, 0, (size_t)(nq * Dh) * sizeof(float));

    for (int64_t kb = 0; kb < g->nkb; kb++) {
        const int64_t j0 = kb * MT_ATT_BK;
        const int64_t nk = g->Tk - j0 < MT_ATT_BK ? g->Tk - j0 : MT_ATT_BK;
        const int kind = att_pair_kind(g, b, i0, nq, j0, nk);
        if (kind == ATT_SKIP) continue;
        float *Kt = sc->Kt;
        if (sc->kcache) {
            if (sc->kc_b != b || sc->kc_hk != hk) {
                memset(sc->have, 0, (size_t)g->nkb);
                sc->kc_b = b;
                sc->kc_hk = hk;
            }
            Kt += kb * Dh * MT_ATT_BK;
            if (!sc->have[kb]) att_load_keys(g, Kt, NULL, k, b, hk, j0, nk);
            sc->have[kb] = 1;
        } else {
            att_load_keys(g, Kt, NULL, k, b, hk, j0, nk);
        }
        att_scores(S, Qs, Kt, nq, Dh);
        att_cap_mask(g, S, b, i0, nq, j0, nk, kind);
        att_online_softmax(S, m, l, O, nq, Dh);
        if (g->dt == MT_F32) {
            att_acc_rows(O, Dh, S, (const float *)v + ((b * g->Tk + j0) * g->Hkv + hk) * Dh, g->k_rs, nq, nk, Dh);
        } else {
            /* P to bf16 (after l took the fp32 values), the value block widened */
            att_round_bf16(S, nq * MT_ATT_BK);
            att_load_keys(g, NULL, sc->Vb, v, b, hk, j0, nk);
            att_acc_rows(O, Dh, S, sc->Vb, Dh, nq, nk, Dh);
        }
    }

    for (int64_t i = 0; i < nq; i++) {
        const int64_t off = (b * g->Tq + i0 + i) * g->q_rs + h * Dh;
        float *L = lse + (b * g->H + h) * g->Tq + i0 + i;
        if (l[i] == 0.0f) {
            mt_cpu_fill(out, off, 0.0f, Dh, g->dt);
            *L = -INFINITY;
        } else {
            const float inv = 1.0f / l[i];
            float *restrict o = O + i * Dh;
#pragma omp simd
            for (int64_t d = 0; d < Dh; d++) o[d] = o[d] * inv;
            mt_cpu_store(out, off, o, Dh, g->dt);
            *L = m[i] + logf(l[i]);
        }
    }
}

mt_status mt_cpu_attention_fwd(mt_backend *be, const mt_attn_args *a, void *out, float *lse, const void *q,
                               const void *k, const void *v) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("attention_fwd", a->dtype));
    const att_geom g = att_geom_make(a);
    if (g.B <= 0 || g.Tq <= 0 || g.H <= 0) return MT_OK;
    const int64_t ntask = g.B * g.H * g.nqb;
    const int kcache = g.Dh * g.nkb * MT_ATT_BK <= MT_ATT_KCACHE;
    const int64_t kt = kcache ? g.Dh * g.nkb * MT_ATT_BK : g.Dh * MT_ATT_BK;
    const int64_t vb = g.dt == MT_F32 ? 0 : g.Dh * MT_ATT_BK; /* widened value block */
    const size_t per = (size_t)(g.bq * g.Dh * 2 + kt + g.bq * MT_ATT_BK + g.bq * 2 + vb +
                                (kcache ? g.nkb / 4 + 1 : 0) + 64);
    int failed = 0;
#pragma omp parallel
    {
        float *buf = att_scratch_alloc(per);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        att_fwd_scratch sc = {0};
        if (buf) {
            sc.Qs = buf;
            sc.O = sc.Qs + g.bq * g.Dh;
            sc.Kt = sc.O + g.bq * g.Dh;
            sc.S = sc.Kt + kt;
            sc.m = sc.S + g.bq * MT_ATT_BK;
            sc.l = sc.m + g.bq;
            sc.kcache = kcache;
            sc.kc_b = -1; /* no block cached yet */
            sc.Vb = sc.l + g.bq;
            sc.have = (unsigned char *)(sc.Vb + vb);
        }
        /* Later query blocks see more keys under a causal mask: hand them out first. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < ntask; t++) {
            if (!buf) continue;
            const int64_t qb = g.nqb - 1 - t % g.nqb, bh = t / g.nqb;
            att_fwd_task(&g, &sc, bh / g.H, bh % g.H, qb, out, lse, q, k, v);
        }
        free(buf);
    }
    if (failed) {
        mt_cpu_fill(out, 0, NAN, g.B * g.Tq * g.q_rs, g.dt);
        att_fill_nan(lse, g.B * g.H * g.Tq);
    }
    return MT_OK;
}

/* ---- backward ---- */

typedef struct att_bwd_scratch {
    float *Qs, *dO, *dQ, *lse, *Di; /* query block: scaled q, dout, dq accumulator */
    float *Kt, *Kb, *Vt, *dK, *dV;  /* key block */
    float *S, *P, *dS;              /* [bq][BK] */
    float *Ow;                      /* bf16 only: one row of out, widened */
    /* by_kv only, when it fits in MT_ATT_KCACHE floats: the loaded query blocks (Qs, dO,
     * lse, Di) of every (head of the group, query block) of the current (b, kv head),
     * so each is loaded once per task instead of once per key block; NULL otherwise */
    float *Qc;
    unsigned char *qhave; /* [G * nqb]: slot loaded */
} att_bwd_scratch;

/* Floats of one query-block slot of the by_kv cache. */
static int64_t att_qslot(const att_geom *g) { return g->bq * (2 * g->Dh + 2); }

static size_t att_bwd_floats(const att_geom *g) {
    return (size_t)(g->bq * g->Dh * 3 + g->bq * 2 + g->Dh * MT_ATT_BK * 5 +
                    g->bq * MT_ATT_BK * 3 + g->Dh + 64);
}

static void att_bwd_carve(const att_geom *g, float *buf, att_bwd_scratch *sc) {
    const int64_t qd = g->bq * g->Dh, kd = g->Dh * MT_ATT_BK, ss = g->bq * MT_ATT_BK;
    sc->Qs = buf;
    sc->dO = sc->Qs + qd;
    sc->dQ = sc->dO + qd;
    sc->Kt = sc->dQ + qd;
    sc->Kb = sc->Kt + kd;
    sc->Vt = sc->Kb + kd;
    sc->dK = sc->Vt + kd;
    sc->dV = sc->dK + kd;
    sc->S = sc->dV + kd;
    sc->P = sc->S + ss;
    sc->dS = sc->P + ss;
    sc->lse = sc->dS + ss;
    sc->Di = sc->lse + g->bq;
    sc->Ow = sc->Di + g->bq;
}

/* Load query block qb of head h: scaled q, dout, lse and D_i = <dout_i, out_i> (q, dout
 * and out of g->dt, widened). */
static void att_bwd_load_q(const att_geom *g, const att_bwd_scratch *sc, int64_t b, int64_t h,
                           int64_t i0, int64_t nq, const void *q, const void *dout,
                           const void *out, const float *lse) {
    const int64_t Dh = g->Dh;
    for (int64_t i = 0; i < nq; i++) {
        const int64_t off = (b * g->Tq + i0 + i) * g->q_rs + h * Dh;
        float *restrict Qs = sc->Qs + i * Dh, *restrict dO = sc->dO + i * Dh;
        float di = 0.0f;
        if (g->dt == MT_F32) {
            const float *restrict qs = (const float *)q + off, *restrict dos = (const float *)dout + off,
                                  *restrict os = (const float *)out + off;
#pragma omp simd reduction(+ : di)
            for (int64_t d = 0; d < Dh; d++) {
                Qs[d] = g->scale * qs[d];
                dO[d] = dos[d];
                di += dos[d] * os[d];
            }
        } else {
            float *restrict os = sc->Ow;
            mt_cpu_load(Qs, q, off, Dh, g->dt);
            mt_cpu_load(dO, dout, off, Dh, g->dt);
            mt_cpu_load(os, out, off, Dh, g->dt);
#pragma omp simd reduction(+ : di)
            for (int64_t d = 0; d < Dh; d++) {
                Qs[d] = g->scale * Qs[d];
                di += dO[d] * os[d];
            }
        }
        sc->Di[i] = di;
        sc->lse[i] = lse[(b * g->H + h) * g->Tq + i0 + i];
    }
}

/* Load key block [j0, j0+nk) of kv head hk: Kt and Vt transposed, Kb row-major. */
static void att_bwd_load_kv(const att_geom *g, const att_bwd_scratch *sc, int64_t b,
                            int64_t hk, int64_t j0, int64_t nk, const void *k,
                            const void *v) {
    att_load_keys(g, sc->Kt, sc->Kb, k, b, hk, j0, nk);
    att_load_keys(g, sc->Vt, NULL, v, b, hk, j0, nk);
}

/* One (query block, key block) pair of algorithm 2: recompute P = exp(s - lse), then
 * dV += P^T dO and dK += dS^T (scale q) into the key-block accumulators when dkv is set,
 * and dq[i, :] += dS K (unscaled; rows strided by dq_rs) when dq is non-NULL, where
 * dS = P (dP - D_i) times the soft-cap derivative 1 - (s_capped / cap)^2. With bf16
 * (ops.h attention_bwd) dS is formed from the fp32 P, then P and dS are each rounded to
 * bf16 before their products; fp32 keeps both unrounded (and its order: dV first). */
MT_CPU_SIMD_CLONES /* the exp and dS loops: 8-wide where the CPU has AVX2 */
static void att_bwd_pair(const att_geom *g, const att_bwd_scratch *sc, int64_t b, int64_t i0, int64_t nq,
                         int64_t j0, int64_t nk, int kind, int dkv, float *dq, int64_t dq_rs) {
    const int64_t Dh = g->Dh;
    const int bf16 = g->dt != MT_F32;
    float *restrict S = sc->S, *restrict P = sc->P, *restrict dS = sc->dS;
    att_scores(S, sc->Qs, sc->Kt, nq, Dh);
    att_cap_mask(g, S, b, i0, nq, j0, nk, kind);
    att_probs(P, S, sc->lse, nq);
    if (dkv && !bf16) att_acc_cols(sc->dV, P, sc->dO, nq, nk, Dh);
    att_scores(dS, sc->dO, sc->Vt, nq, Dh); /* dP */
    const float cap = g->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t i = 0; i < nq; i++) {
        float *restrict ds = dS + i * MT_ATT_BK;
        const float *restrict p = P + i * MT_ATT_BK, *restrict s = S + i * MT_ATT_BK;
        const float di = sc->Di[i];
        if (cap > 0.0f) {
#pragma omp simd
            for (int64_t j = 0; j < MT_ATT_BK; j++) {
                /* masked entries have s = -inf and p = 0: th = 0 keeps ds at 0 (a bit
                 * mask, not ?:, so the loop still vectorises; see vmath.h) */
                const float th = mt_vfloat(mt_vbits(s[j] * inv_cap) & mt_vmask(p[j] != 0.0f));
                ds[j] = p[j] * (ds[j] - di) * (1.0f - th * th);
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < MT_ATT_BK; j++) ds[j] = p[j] * (ds[j] - di);
        }
    }
    if (bf16) { /* the tensor-core operands: P after dS took its fp32 value, and dS */
        if (dkv) {
            att_round_bf16(P, nq * MT_ATT_BK);
            att_acc_cols(sc->dV, P, sc->dO, nq, nk, Dh);
        }
        att_round_bf16(dS, nq * MT_ATT_BK);
    }
    if (dq) att_acc_rows(dq, dq_rs, dS, sc->Kb, Dh, nq, nk, Dh);
    if (dkv) att_acc_cols(sc->dK, dS, sc->Qs, nq, nk, Dh);
}

/* Store key-block accumulators into dk/dv rows [j0, j0+nk) of kv head hk (g->dt: a bf16
 * row rounded once). */
static void att_bwd_store_kv(const att_geom *g, const att_bwd_scratch *sc, void *dk, void *dv,
                             int64_t b, int64_t hk, int64_t j0, int64_t nk) {
    for (int64_t j = 0; j < nk; j++) {
        const int64_t off = (b * g->Tk + j0 + j) * g->k_rs + hk * g->Dh;
        mt_cpu_store(dk, off, sc->dK + j * g->Dh, g->Dh, g->dt);
        mt_cpu_store(dv, off, sc->dV + j * g->Dh, g->Dh, g->dt);
    }
}

typedef struct att_bwd_io {
    void *dq, *dk, *dv; /* of g->dt; dq is accumulated in place (fp32 only) by by_kv */
    const void *dout, *q, *k, *v, *out;
    const float *lse;
} att_bwd_io;

/* dk/dv of key block kb of (b, hk): sum over the group's heads, then query blocks. With
 * dq_direct set, also add this key block's dq terms straight into io->dq (by_kv). */
static void att_bwd_key_block(const att_geom *g, const att_bwd_scratch *sc,
                              const att_bwd_io *io, int64_t b, int64_t hk, int64_t kb,
                              int dq_direct) {
    const int64_t j0 = kb * MT_ATT_BK;
    const int64_t nk = g->Tk - j0 < MT_ATT_BK ? g->Tk - j0 : MT_ATT_BK;
    att_bwd_load_kv(g, sc, b, hk, j0, nk, io->k, io->v);
    memset(sc->dK, 0, (size_t)(nk * g->Dh) * sizeof(float));
    memset(sc->dV, 0, (size_t)(nk * g->Dh) * sizeof(float));
    for (int64_t hh = 0; hh < g->G; hh++) {
        const int64_t h = hk * g->G + hh;
        for (int64_t qb = 0; qb < g->nqb; qb++) {
            const int64_t i0 = qb * g->bq;
            const int64_t nq = g->Tq - i0 < g->bq ? g->Tq - i0 : g->bq;
            const int kind = att_pair_kind(g, b, i0, nq, j0, nk);
            if (kind == ATT_SKIP) continue;
            att_bwd_scratch qs = *sc; /* with the query block's arrays in its cache slot */
            if (dq_direct && sc->Qc) {
                const int64_t slot = hh * g->nqb + qb;
                qs.Qs = sc->Qc + slot * att_qslot(g);
                qs.dO = qs.Qs + g->bq * g->Dh;
                qs.lse = qs.dO + g->bq * g->Dh;
                qs.Di = qs.lse + g->bq;
                if (!sc->qhave[slot]) att_bwd_load_q(g, &qs, b, h, i0, nq, io->q, io->dout, io->out, io->lse);
                sc->qhave[slot] = 1;
            } else {
                att_bwd_load_q(g, &qs, b, h, i0, nq, io->q, io->dout, io->out, io->lse);
            }
            float *dq = dq_direct ? (float *)io->dq + (b * g->Tq + i0) * g->q_rs + h * g->Dh : NULL;
            att_bwd_pair(g, &qs, b, i0, nq, j0, nk, kind, 1, dq, g->q_rs);
        }
    }
    att_bwd_store_kv(g, sc, io->dk, io->dv, b, hk, j0, nk);
}

/* by_kv schedule (fp32 only: dq is summed in the output tensor): everything for (b, hk). */
static void att_bwd_by_kv(const att_geom *g, const att_bwd_scratch *sc, const att_bwd_io *io,
                          int64_t b, int64_t hk) {
    const int64_t Dh = g->Dh;
    float *dq = io->dq;
    if (sc->Qc) memset(sc->qhave, 0, (size_t)(g->G * g->nqb));
    for (int64_t i = 0; i < g->Tq; i++)
        memset(dq + (b * g->Tq + i) * g->q_rs + hk * g->G * Dh, 0,
               (size_t)(g->G * Dh) * sizeof(float));
    for (int64_t kb = 0; kb < g->nkb; kb++) att_bwd_key_block(g, sc, io, b, hk, kb, 1);
    for (int64_t i = 0; i < g->Tq; i++) {
        float *restrict r = dq + (b * g->Tq + i) * g->q_rs + hk * g->G * Dh;
        for (int64_t d = 0; d < g->G * Dh; d++) r[d] = r[d] * g->scale;
    }
}

/* split schedule, second pass: dq of query block qb of (b, h), key blocks in order. */
static void att_bwd_query_block(const att_geom *g, const att_bwd_scratch *sc,
                                const att_bwd_io *io, int64_t b, int64_t h, int64_t qb) {
    const int64_t Dh = g->Dh, i0 = qb * g->bq, hk = h / g->G;
    const int64_t nq = g->Tq - i0 < g->bq ? g->Tq - i0 : g->bq;
    att_bwd_load_q(g, sc, b, h, i0, nq, io->q, io->dout, io->out, io->lse);
    memset(sc->dQ, 0, (size_t)(nq * Dh) * sizeof(float));
    for (int64_t kb = 0; kb < g->nkb; kb++) {
        const int64_t j0 = kb * MT_ATT_BK;
        const int64_t nk = g->Tk - j0 < MT_ATT_BK ? g->Tk - j0 : MT_ATT_BK;
        const int kind = att_pair_kind(g, b, i0, nq, j0, nk);
        if (kind == ATT_SKIP) continue;
        att_bwd_load_kv(g, sc, b, hk, j0, nk, io->k, io->v);
        att_bwd_pair(g, sc, b, i0, nq, j0, nk, kind, 0, sc->dQ, Dh);
    }
    for (int64_t i = 0; i < nq; i++) {
        float *restrict r = sc->dQ + i * Dh;
        for (int64_t d = 0; d < Dh; d++) r[d] = r[d] * g->scale;
        mt_cpu_store(io->dq, (b * g->Tq + i0 + i) * g->q_rs + h * Dh, r, Dh, g->dt);
    }
}

mt_status mt_cpu_attention_bwd(mt_backend *be, const mt_attn_args *a, void *dq, void *dk, void *dv,
                               const void *dout, const void *q, const void *k, const void *v, const void *out,
                               const float *lse) {
    (void)be;
    MT_TRY(mt_cpu_check_dtype("attention_bwd", a->dtype));
    const att_geom g = att_geom_make(a);
    if (g.B <= 0 || g.H <= 0) return MT_OK;
    const att_bwd_io io = {dq, dk, dv, dout, q, k, v, out, lse};
    const int by_kv = g.dt == MT_F32 && g.B * g.Hkv >= (int64_t)omp_get_max_threads();
    const int64_t qc = g.G * g.nqb * att_qslot(&g);
    const int qcache = by_kv && qc <= MT_ATT_KCACHE;
    const size_t per = att_bwd_floats(&g) + (qcache ? (size_t)(qc + g.G * g.nqb / 4 + 1) : 0);
    int failed = 0;
#pragma omp parallel
    {
        float *buf = att_scratch_alloc(per);
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
        att_bwd_scratch sc = {0};
        if (buf) att_bwd_carve(&g, buf, &sc);
        if (buf && qcache) {
            sc.Qc = buf + att_bwd_floats(&g);
            sc.qhave = (unsigned char *)(sc.Qc + qc);
        }
        if (by_kv) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < g.B * g.Hkv; t++)
                if (buf) att_bwd_by_kv(&g, &sc, &io, t / g.Hkv, t % g.Hkv);
        } else {
            const int64_t nkt = g.B * g.Hkv * g.nkb, nqt = g.B * g.H * g.nqb;
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < nkt; t++) {
                if (!buf) continue;
                const int64_t bh = t / g.nkb;
                att_bwd_key_block(&g, &sc, &io, bh / g.Hkv, bh % g.Hkv, t % g.nkb, 0);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t t = 0; t < nqt; t++) {
                if (!buf) continue;
                const int64_t qb = g.nqb - 1 - t % g.nqb, bh = t / g.nqb;
                att_bwd_query_block(&g, &sc, &io, bh / g.H, bh % g.H, qb);
            }
        }
        free(buf);
    }
    if (failed) {
        mt_cpu_fill(dq, 0, NAN, g.B * g.Tq * g.q_rs, g.dt);
        mt_cpu_fill(dk, 0, NAN, g.B * g.Tk * g.k_rs, g.dt);
        mt_cpu_fill(dv, 0, NAN, g.B * g.Tk * g.k_rs, g.dt);
    }
    return MT_OK;
}
