/* bench/op_bench.c: where the time of one CPU training step goes, op by op.
 *
 * Runs the step of bench/step_bench.c (same model, same arguments) through a copy of the
 * CPU op table whose entries time each call with mt_time_now. GEMMs are kept apart by
 * shape (transposes, M, N, K, beta) and reported with their GFLOP/s next to a square
 * 1024^3 GEMM's, so slow shapes stand out. The first step is a warm-up; the rest are
 * summed. Prints a table sorted by time, largest first, with each GEMM shape's share of
 * the machine's fp32 FMA peak: measured first by fma_peak, a loop of independent
 * fused-multiply-add chains held in registers (AVX-512 where the CPU has it, else
 * AVX2 + FMA, chosen at run time), on one thread and on the run's threads. The GEMM
 * libraries and kernels in use (kernels/cpu/gemm.c mt_cpu_gemm_kernel) are printed with it.
 * With OP_BENCH_CLOCK=cpu in the environment, times are the process's CPU time instead
 * of wall time: on a machine shared with other jobs, CPU time at threads = 1 (or with
 * OMP_WAIT_POLICY=passive) compares two builds' work where wall time is mostly noise.
 * Usage: op_bench d_model layers heads kv_heads mlp seq batch vocab threads steps tiles
 *        op_bench gemm [threads [rounds [candidates]]]   (GEMM libraries side by side: gemm_compare) */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_model.h"
#include "kernels/cpu/cpu_dtype.h"
#include "kernels/cpu/cpu_ops.h"
#include "runtime/timer.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

/* 12 chains a = a * x + y, each 4-cycle FMA latency apart, so two FMA ports stay busy;
 * 16 lanes, 2 flops per lane. Fixed point 1: no overflow, no denormals. */
__attribute__((target("avx512f"))) static float fma_chains_512(long iters) {
    const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
    /* distinct starting values, so the compiler cannot merge identical chains */
    __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f);
    __m512 a3 = _mm512_set1_ps(1.3f), a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f);
    __m512 a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f), a8 = _mm512_set1_ps(1.8f);
    __m512 a9 = _mm512_set1_ps(1.9f), a10 = _mm512_set1_ps(2.0f), a11 = _mm512_set1_ps(2.1f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, x, y), a1 = _mm512_fmadd_ps(a1, x, y), a2 = _mm512_fmadd_ps(a2, x, y);
        a3 = _mm512_fmadd_ps(a3, x, y), a4 = _mm512_fmadd_ps(a4, x, y), a5 = _mm512_fmadd_ps(a5, x, y);
        a6 = _mm512_fmadd_ps(a6, x, y), a7 = _mm512_fmadd_ps(a7, x, y), a8 = _mm512_fmadd_ps(a8, x, y);
        a9 = _mm512_fmadd_ps(a9, x, y), a10 = _mm512_fmadd_ps(a10, x, y), a11 = _mm512_fmadd_ps(a11, x, y);
    }
    a0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                       _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    a0 = _mm512_add_ps(a0, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(a0);
}

/* The same with 10 chains of 8 lanes (16 ymm registers). */
__attribute__((target("avx2,fma"))) static float fma_chains_256(long iters) {
    const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
    __m256 a0 = _mm256_set1_ps(1.0f), a1 = _mm256_set1_ps(1.1f), a2 = _mm256_set1_ps(1.2f);
    __m256 a3 = _mm256_set1_ps(1.3f), a4 = _mm256_set1_ps(1.4f), a5 = _mm256_set1_ps(1.5f);
    __m256 a6 = _mm256_set1_ps(1.6f), a7 = _mm256_set1_ps(1.7f), a8 = _mm256_set1_ps(1.8f);
    __m256 a9 = _mm256_set1_ps(1.9f);
    for (long i = 0; i < iters; i++) {
        a0 = _mm256_fmadd_ps(a0, x, y), a1 = _mm256_fmadd_ps(a1, x, y), a2 = _mm256_fmadd_ps(a2, x, y);
        a3 = _mm256_fmadd_ps(a3, x, y), a4 = _mm256_fmadd_ps(a4, x, y), a5 = _mm256_fmadd_ps(a5, x, y);
        a6 = _mm256_fmadd_ps(a6, x, y), a7 = _mm256_fmadd_ps(a7, x, y), a8 = _mm256_fmadd_ps(a8, x, y);
        a9 = _mm256_fmadd_ps(a9, x, y);
    }
    a0 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                       _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    a0 = _mm256_add_ps(a0, _mm256_add_ps(a8, a9));
    float t[8];
    _mm256_storeu_ps(t, a0);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

static volatile float g_sink;

/* Seconds of CPU time this process has used (all threads). */
static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* fp32 FMA peak in GFLOP/s on `threads` threads (best of 3 runs of ~0.2 s); *isa names
 * the instruction set used ("none": no FMA, returns 0). With cpu set, timed by CPU time
 * divided by `threads` (what wall time would be on an idle machine). */
static double fma_peak_n(int threads, const char **isa, int cpu, long iters, int reps) {
#if defined(__GNUC__) && defined(__x86_64__)
    const int w512 = __builtin_cpu_supports("avx512f");
    const int w256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    *isa = w512 ? "AVX-512" : w256 ? "AVX2+FMA" : "none";
    if (!w512 && !w256) return 0.0;
    const double flop_per_thread = (double)iters * (w512 ? 12.0 * 16.0 : 10.0 * 8.0) * 2.0;
    double best = 0.0;
    for (int rep = 0; rep < reps; rep++) {
        const double t0 = cpu ? cpu_seconds() / threads : mt_time_now();
#pragma omp parallel num_threads(threads)
        g_sink = w512 ? fma_chains_512(iters) : fma_chains_256(iters);
        const double r = flop_per_thread * threads / ((cpu ? cpu_seconds() / threads : mt_time_now()) - t0) / 1e9;
        best = r > best ? r : best;
    }
    return best;
#else
    (void)threads, (void)cpu, (void)iters, (void)reps;
    *isa = "none";
    return 0.0;
#endif
}
static double fma_peak(int threads, const char **isa, int cpu) { return fma_peak_n(threads, isa, cpu, 20000000, 3); }

#define MAX_ROWS 256

typedef struct {
    char name[96];
    double sec, flop;
    long calls;
} row;

static row g_rows[MAX_ROWS];
static int g_nrows, g_on;
static mt_backend *g_cpu;
static int g_cpu_clock; /* OP_BENCH_CLOCK=cpu */

static double now(void) { return g_cpu_clock ? cpu_seconds() : mt_time_now(); }

static void add(const char *name, double sec, double flop) {
    if (!g_on) return;
    int i = 0;
    while (i < g_nrows && strcmp(g_rows[i].name, name) != 0) i++;
    if (i == g_nrows) {
        if (g_nrows == MAX_ROWS) return;
        snprintf(g_rows[g_nrows++].name, sizeof g_rows[0].name, "%s", name);
    }
    g_rows[i].sec += sec;
    g_rows[i].flop += flop;
    g_rows[i].calls++;
}

/* Time one op of the CPU backend and return its status (be_: the wrapping backend). */
#define TIMED(name, call)                   \
    do {                                    \
        (void)be_;                          \
        double t0_ = now();                 \
        const mt_status st_ = (call);       \
        add(name, now() - t0_, 0);          \
        return st_;                         \
    } while (0)

static mt_status w_gemm(mt_backend *be_, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                        int64_t lda, const void *B, int64_t ldb, mt_dtype abt, float beta, void *C, int64_t ldc,
                        mt_dtype ct) {
    char name[96];
    snprintf(name, sizeof name, "gemm %c%c M%-6lld N%-6lld K%-6lld b%g %s", ta ? 'T' : 'N', tb ? 'T' : 'N',
             (long long)M, (long long)N, (long long)K, (double)beta, abt == MT_BF16 ? "bf16" : "f32");
    (void)be_;
    double t0 = now();
    const mt_status st = g_cpu->ops->gemm(g_cpu, ta, tb, M, N, K, alpha, A, lda, B, ldb, abt, beta, C, ldc, ct);
    add(name, now() - t0, 2.0 * (double)M * (double)N * (double)K);
    return st;
}
static mt_status w_copy(mt_backend *be_, void *d, const void *s, size_t n) { TIMED("copy", g_cpu->ops->copy(g_cpu, d, s, n)); }
static mt_status w_zero(mt_backend *be_, void *p, size_t n) { TIMED("zero", g_cpu->ops->zero(g_cpu, p, n)); }
static mt_status w_emb_fwd(mt_backend *be_, void *o, const void *t, const int32_t *k, int64_t N, int64_t v0, int64_t V,
                           int64_t D, float s, mt_dtype dt) {
    TIMED("embedding_fwd", g_cpu->ops->embedding_fwd(g_cpu, o, t, k, N, v0, V, D, s, dt));
}
static mt_status w_emb_bwd(mt_backend *be_, float *dtab, const void *d, const int32_t *k, int64_t N, int64_t v0,
                           int64_t V, int64_t D, float s, mt_dtype dt) {
    TIMED("embedding_bwd", g_cpu->ops->embedding_bwd(g_cpu, dtab, d, k, N, v0, V, D, s, dt));
}
static mt_status w_rms_fwd(mt_backend *be_, void *y, float *r, const void *x, const void *w, int64_t N, int64_t D,
                           float e, float o, mt_dtype dt) {
    TIMED("rmsnorm_fwd", g_cpu->ops->rmsnorm_fwd(g_cpu, y, r, x, w, N, D, e, o, dt));
}
static mt_status w_add_rms_fwd(mt_backend *be_, void *h, void *y, float *r, const void *x, const void *res,
                               const void *w, int64_t N, int64_t D, float e, float o, mt_dtype dt) {
    TIMED("add_rmsnorm_fwd", g_cpu->ops->add_rmsnorm_fwd(g_cpu, h, y, r, x, res, w, N, D, e, o, dt));
}
static mt_status w_rms_bwd(mt_backend *be_, void *dx, float *dw, const void *dy, const void *x, const void *w,
                           const float *r, int64_t N, int64_t D, float o, mt_dtype dt) {
    TIMED("rmsnorm_bwd", g_cpu->ops->rmsnorm_bwd(g_cpu, dx, dw, dy, x, w, r, N, D, o, dt));
}
static mt_status w_rope_fwd(mt_backend *be_, void *x, const int32_t *p, const float *f, int64_t N, int64_t H,
                            int64_t Dh, mt_dtype dt) {
    TIMED("rope_fwd", g_cpu->ops->rope_fwd(g_cpu, x, p, f, N, H, Dh, dt));
}
static mt_status w_rope_bwd(mt_backend *be_, void *x, const int32_t *p, const float *f, int64_t N, int64_t H,
                            int64_t Dh, mt_dtype dt) {
    TIMED("rope_bwd", g_cpu->ops->rope_bwd(g_cpu, x, p, f, N, H, Dh, dt));
}
static mt_status w_att_fwd(mt_backend *be_, const mt_attn_args *a, void *o, float *l, const void *q, const void *k,
                           const void *v) {
    TIMED("attention_fwd", g_cpu->ops->attention_fwd(g_cpu, a, o, l, q, k, v));
}
static mt_status w_att_bwd(mt_backend *be_, const mt_attn_args *a, void *dq, void *dk, void *dv, const void *dout,
                           const void *q, const void *k, const void *v, const void *o, const float *l) {
    TIMED("attention_bwd", g_cpu->ops->attention_bwd(g_cpu, a, dq, dk, dv, dout, q, k, v, o, l));
}
static mt_status w_glu_fwd(mt_backend *be_, void *h, const void *g, const void *u, int64_t n, mt_activation act,
                           mt_dtype dt) {
    TIMED("glu_fwd", g_cpu->ops->glu_fwd(g_cpu, h, g, u, n, act, dt));
}
static mt_status w_glu_bwd(mt_backend *be_, void *dg, void *du, const void *dh, const void *g, const void *u, int64_t n,
                           mt_activation act, mt_dtype dt) {
    TIMED("glu_bwd", g_cpu->ops->glu_bwd(g_cpu, dg, du, dh, g, u, n, act, dt));
}
static mt_status w_xent(mt_backend *be_, float *z, void *dz, mt_dtype ddt, const int32_t *lab, int64_t R, int64_t V,
                        float cap, int32_t ign, float ds, double *stats) {
    TIMED("xent_tile", g_cpu->ops->xent_tile(g_cpu, z, dz, ddt, lab, R, V, cap, ign, ds, stats));
}
static mt_status w_axpy(mt_backend *be_, void *y, const void *x, float a, int64_t n, mt_dtype dt) {
    TIMED("axpy", g_cpu->ops->axpy(g_cpu, y, x, a, n, dt));
}
static mt_status w_adamw(mt_backend *be_, float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                         int nsegs, float lr, float b1, float b2, float eps, float wd, float gs, int64_t t) {
    TIMED("adamw", g_cpu->ops->adamw(g_cpu, p, g, m, v, segs, nsegs, lr, b1, b2, eps, wd, gs, t));
}

static int cmp_rows(const void *a, const void *b) {
    const double x = ((const row *)a)->sec, y = ((const row *)b)->sec;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* ---- op_bench gemm threads [rounds]: the GEMM candidates side by side ----
 * Each GEMM shape of the step above (bench/cpu_vs_torch.sh's model: d_model 512, mlp
 * 1376, 4096 token rows, vocab 32000 in 8 tiles of 512 rows; forward NT, backward NN
 * and TN) plus 2048^3, with the dtypes the model passes (bf16 model: bf16 C for
 * activations and their gradients, fp32 C for logits and weight gradients), through
 * each library that can run it: mt_cpu_gemm_with's OpenBLAS (tiles) and oneDNN paths,
 * and, for comparison only, OpenBLAS with its own threads (gemm.c's former path),
 * oneDNN's BLAS-like dnnl_sgemm / dnnl_gemm_bf16bf16f32 and BLIS's cblas_sgemm when
 * those libraries load. The candidates of a shape take turns, one call each per round,
 * so machine noise hits them alike; the best call of `rounds` (default 5) is reported,
 * in GFLOP/s and as a share of the fp32 FMA peak (measured again before each round, the
 * best kept; AMX or a full-rate vdpbf16ps could exceed it). Every output is compared with
 * the first candidate's (max |diff| / max |C|), and both bf16 paths of mt_cpu_gemm_with
 * (OpenBLAS, oneDNN) are checked to give the same bits on 1 to 4 threads. `candidates`,
 * digits 0-7 (columns of the table, left to right), runs only those. With
 * OP_BENCH_CLOCK=cpu, calls and the peak are timed by CPU time / threads (on a loaded
 * machine; spin-waiting threads count, so
 * use it with OMP_WAIT_POLICY=passive, or at 1 thread). */

typedef struct {
    char op[3];
    int64_t M, N, K;
    float beta;
    mt_dtype c_bf16; /* MT_BF16: C is bf16 in the bf16 model */
    const char *what;
} gshape;

static const gshape g_shapes[] = {
    {"NT", 4096, 512, 512, 0, MT_BF16, "q/k/v/o fwd"},
    {"NT", 4096, 1376, 512, 0, MT_BF16, "gate/up fwd"},
    {"NT", 4096, 512, 1376, 0, MT_BF16, "down fwd"},
    {"NT", 512, 32000, 512, 0, MT_F32, "logits tile"},
    {"NN", 4096, 512, 512, 0, MT_BF16, "q/k/v/o dx"},
    {"NN", 4096, 512, 1376, 0, MT_BF16, "gate/up dx"},
    {"NN", 4096, 1376, 512, 0, MT_BF16, "down dx"},
    {"NN", 512, 512, 32000, 0, MT_BF16, "tile dh"},
    {"TN", 512, 512, 4096, 1, MT_F32, "q/k/v/o dW"},
    {"TN", 1376, 512, 4096, 1, MT_F32, "gate/up dW"},
    {"TN", 512, 1376, 4096, 1, MT_F32, "down dW"},
    {"TN", 32000, 512, 512, 1, MT_F32, "unembed dW"},
    {"NN", 2048, 2048, 2048, 0, MT_F32, "square"},
};

typedef struct {
    void (*sgemm)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *, int);
    void (*ob_sgemm)(int, int, int, int, int, int, float, const float *, int, const float *, int, float, float *,
                     int);
    void (*blis_threads)(int64_t);
    int (*dnnl_sgemm)(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t, const float *, int64_t,
                      float, float *, int64_t);
    int (*dnnl_bf16)(char, char, int64_t, int64_t, int64_t, float, const mt_bf16 *, int64_t, const mt_bf16 *, int64_t,
                     float, float *, int64_t);
} gextra;

#define GEMM_CANDIDATES 8
#define GEMM_FIRST_BF16 5 /* candidates 0-4 take fp32 operands, 5-7 bf16 */
static const char *g_cand_names[GEMM_CANDIDATES] = {"OB tiles", "OB threads", "oneDNN mm", "dnnl_sgemm",
                                                    "BLIS",     "widen+OB",   "oneDNN mm", "dnnl_bf16"};

/* Runs candidate c on shape s (operands fA/fB fp32 or hA/hB bf16, C in C); -1: not available. */
static int gemm_candidate(int c, const gshape *s, const gextra *x, const float *fA, const float *fB,
                          const mt_bf16 *hA, const mt_bf16 *hB, void *C, mt_dtype *cdt) {
    const int ta = s->op[0] == 'T', tb = s->op[1] == 'T';
    const int64_t lda = ta ? s->M : s->K, ldb = tb ? s->K : s->N;
    const mt_dtype bc = s->c_bf16;
    *cdt = c == 5 || c == 6 ? bc : MT_F32;
    switch (c) {
    case 0: /* fp32: OpenBLAS single-threaded on tiles (kernels/cpu/gemm.c) */
        return mt_cpu_gemm_with(MT_CPU_GEMM_OPENBLAS, ta, tb, s->M, s->N, s->K, 1, fA, lda, fB, ldb, MT_F32, s->beta,
                                C, s->N, MT_F32) == MT_OK ? 0 : -1;
    case 1: /* fp32: OpenBLAS with its own threads (what gemm.c did before) */
        if (!x->ob_sgemm) return -1;
        x->ob_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, (int)s->M, (int)s->N, (int)s->K, 1, fA, (int)lda, fB,
                    (int)ldb, s->beta, C, (int)s->N);
        return 0;
    case 2: /* fp32: oneDNN matmul */
        return mt_cpu_gemm_with(MT_CPU_GEMM_ONEDNN, ta, tb, s->M, s->N, s->K, 1, fA, lda, fB, ldb, MT_F32, s->beta, C,
                                s->N, MT_F32) == MT_OK ? 0 : -1;
    case 3: /* fp32: dnnl_sgemm (row-major, like cblas) */
        if (!x->dnnl_sgemm) return -1;
        return x->dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', s->M, s->N, s->K, 1, fA, lda, fB, ldb, s->beta, C,
                             s->N) == 0 ? 0 : -1;
    case 4: /* fp32: BLIS */
        if (!x->sgemm) return -1;
        x->sgemm(101, ta ? 112 : 111, tb ? 112 : 111, (int)s->M, (int)s->N, (int)s->K, 1, fA, (int)lda, fB, (int)ldb,
                 s->beta, C, (int)s->N);
        return 0;
    case 5: /* bf16: widened for OpenBLAS */
        return mt_cpu_gemm_with(MT_CPU_GEMM_OPENBLAS, ta, tb, s->M, s->N, s->K, 1, hA, lda, hB, ldb, MT_BF16, s->beta,
                                C, s->N, bc) == MT_OK ? 0 : -1;
    case 6: /* bf16: oneDNN matmul */
        return mt_cpu_gemm_with(MT_CPU_GEMM_ONEDNN, ta, tb, s->M, s->N, s->K, 1, hA, lda, hB, ldb, MT_BF16, s->beta, C,
                                s->N, bc) == MT_OK ? 0 : -1;
    case 7: /* bf16: dnnl_gemm_bf16bf16f32 (fp32 C only) */
        if (!x->dnnl_bf16) return -1;
        return x->dnnl_bf16(ta ? 'T' : 'N', tb ? 'T' : 'N', s->M, s->N, s->K, 1, hA, lda, hB, ldb, s->beta, C, s->N) == 0
                   ? 0 : -1;
    }
    return -1;
}

static double max_abs_c(const void *c, int64_t n, mt_dtype dt) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        const double v = fabs((double)mt_cpu_ld(c, i, dt));
        m = v > m ? v : m;
    }
    return m;
}

/* Whether lib's bf16 path gives the same bits on 1 to 4 threads for shape s (operands hA,
 * hB, the model's C dtype); also 1 when lib cannot run it. Leaves `threads` threads set. */
static int gemm_same_bits(mt_cpu_gemm_lib lib, const gshape *s, const mt_bf16 *hA, const mt_bf16 *hB, int threads) {
    const int ta = s->op[0] == 'T', tb = s->op[1] == 'T';
    const int64_t nc = s->M * s->N;
    void *D[2] = {malloc((size_t)nc * 4), malloc((size_t)nc * 4)};
    int same = 1;
    for (int t = 1; t <= 4 && same; t++) {
        omp_set_num_threads(t);
        void *d = D[t > 1];
        for (int64_t i = 0; i < nc; i++) mt_cpu_st(d, i, 0.25f, s->c_bf16);
        const mt_status st = mt_cpu_gemm_with(lib, ta, tb, s->M, s->N, s->K, 1, hA, ta ? s->M : s->K, hB,
                                              tb ? s->K : s->N, MT_BF16, s->beta, d, s->N, s->c_bf16);
        if (st == MT_ERR_UNSUPPORTED) break;
        same = st == MT_OK && (t == 1 || memcmp(D[0], D[1], (size_t)nc * mt_dtype_size(s->c_bf16)) == 0);
    }
    omp_set_num_threads(threads);
    free(D[0]), free(D[1]);
    return same;
}

#define GEMM_SHAPES ((int)(sizeof g_shapes / sizeof g_shapes[0]))

static int gemm_compare(int threads, int rounds, const char *only) {
    omp_set_num_threads(threads);
    gextra x = {0};
    void *blis = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (blis) {
        *(void **)&x.sgemm = dlsym(blis, "cblas_sgemm");
        *(void **)&x.blis_threads = dlsym(blis, "bli_thread_set_num_threads");
        if (x.blis_threads) x.blis_threads(threads);
    }
    (void)mt_cpu_gemm_kernel(); /* loads OpenBLAS with its core chosen; then the same handle: */
    void *ob = dlopen(MT_OPENBLAS_PATH, RTLD_NOW | RTLD_LOCAL);
    if (ob) *(void **)&x.ob_sgemm = dlsym(ob, "cblas_sgemm");
    void *dnnl = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (dnnl) {
        *(void **)&x.dnnl_sgemm = dlsym(dnnl, "dnnl_sgemm");
        *(void **)&x.dnnl_bf16 = dlsym(dnnl, "dnnl_gemm_bf16bf16f32");
    }
    const char *isa = "none";
    g_cpu_clock = getenv("OP_BENCH_CLOCK") && strcmp(getenv("OP_BENCH_CLOCK"), "cpu") == 0;
    double peak = fma_peak(threads, &isa, g_cpu_clock);
    double sec[GEMM_SHAPES][GEMM_CANDIDATES], err[GEMM_SHAPES][GEMM_CANDIDATES];
    int ok[GEMM_SHAPES][GEMM_CANDIDATES], same[GEMM_SHAPES][2], bad = 0;
    for (int si = 0; si < GEMM_SHAPES; si++) {
        const gshape *s = &g_shapes[si];
        const int64_t na = s->M * s->K, nb = s->K * s->N, nc = s->M * s->N;
        float *fA = malloc((size_t)na * 4), *fB = malloc((size_t)nb * 4);
        mt_bf16 *hA = malloc((size_t)na * 2), *hB = malloc((size_t)nb * 2);
        void *Cs[GEMM_CANDIDATES];
        mt_dtype cdt[GEMM_CANDIDATES];
        for (int c = 0; c < GEMM_CANDIDATES; c++) Cs[c] = malloc((size_t)nc * 4);
        uint32_t r = 12345u + (uint32_t)si;
        for (int64_t i = 0; i < na + nb; i++) {
            r = r * 1664525u + 1013904223u;
            const mt_bf16 h = mt_f32_to_bf16((float)(r >> 8) / 16777216.0f - 0.5f);
            if (i < na)
                fA[i] = mt_bf16_to_f32(h), hA[i] = h;
            else
                fB[i - na] = mt_bf16_to_f32(h), hB[i - na] = h;
        }
        for (int c = 0; c < GEMM_CANDIDATES; c++) { /* first call: plans, JIT, page faults */
            sec[si][c] = 1e30;
            for (int64_t i = 0; i < nc; i++) mt_cpu_st(Cs[c], i, 0.25f, c == 5 || c == 6 ? s->c_bf16 : MT_F32);
            ok[si][c] = (!only || strchr(only, '0' + c)) &&
                        gemm_candidate(c, s, &x, fA, fB, hA, hB, Cs[c], &cdt[c]) == 0;
        }
        /* outputs after exactly one call (beta 1 adds to 0.25), against the first candidate's */
        int c0 = 0;
        while (c0 < GEMM_CANDIDATES - 1 && !ok[si][c0]) c0++;
        const double ref = max_abs_c(Cs[c0], nc, cdt[c0]);
        for (int c = 0; c < GEMM_CANDIDATES; c++) {
            err[si][c] = -1;
            if (!ok[si][c] || c == c0) continue;
            double e = 0;
            for (int64_t i = 0; i < nc; i++) {
                const double d = fabs((double)mt_cpu_ld(Cs[c], i, cdt[c]) - (double)mt_cpu_ld(Cs[c0], i, cdt[c0]));
                e = d > e ? d : e;
            }
            err[si][c] = e / (ref > 0 ? ref : 1);
            if (err[si][c] > (cdt[c] == MT_BF16 || cdt[c0] == MT_BF16 ? 1e-2 : 1e-4)) bad = 1;
        }
        for (int it = 0; it < rounds; it++) {
            /* the peak again (0.03 s), so that it too gets the quietest moments */
            const double p = fma_peak_n(threads, &isa, g_cpu_clock, 2000000, 1);
            peak = p > peak ? p : peak;
            for (int c = 0; c < GEMM_CANDIDATES; c++) {
                if (!ok[si][c]) continue;
                const double t0 = now();
                gemm_candidate(c, s, &x, fA, fB, hA, hB, Cs[c], &cdt[c]);
                const double t = (now() - t0) / (g_cpu_clock ? threads : 1);
                sec[si][c] = t < sec[si][c] ? t : sec[si][c];
            }
        }
        same[si][0] = gemm_same_bits(MT_CPU_GEMM_OPENBLAS, s, hA, hB, threads);
        same[si][1] = gemm_same_bits(MT_CPU_GEMM_ONEDNN, s, hA, hB, threads);
        bad |= !same[si][0] || !same[si][1];
        for (int c = 0; c < GEMM_CANDIDATES; c++) free(Cs[c]);
        free(fA), free(fB), free(hA), free(hB);
    }
    printf("GEMM candidates, %d threads, best of %d calls (%s); fp32 FMA peak (%s loop, best of the run) %.1f "
           "GFLOP/s\n", threads, rounds, g_cpu_clock ? "CPU time / threads" : "wall time", isa, peak);
    printf("auto: %s; BLIS %s\n", mt_cpu_gemm_kernel(), blis ? "libblis.so.4" : "not loaded");
    printf("%-12s %-2s %6s %6s %6s |", "shape", "op", "M", "N", "K");
    for (int c = 0; c < GEMM_CANDIDATES; c++) printf(" %s%-10s", c == GEMM_FIRST_BF16 ? "| " : "", g_cand_names[c]);
    printf("\n%38s|%-58s| %s\n", "", " fp32 operands: GFLOP/s (%peak)", "bf16 operands: GFLOP/s (%peak)");
    for (int si = 0; si < GEMM_SHAPES; si++) {
        const gshape *s = &g_shapes[si];
        const double flop = 2.0 * (double)s->M * (double)s->N * (double)s->K;
        printf("%-12s %-2s %6lld %6lld %6lld |", s->what, s->op, (long long)s->M, (long long)s->N, (long long)s->K);
        for (int c = 0; c < GEMM_CANDIDATES; c++) {
            char cell[32] = "-";
            if (ok[si][c])
                snprintf(cell, sizeof cell, "%.0f (%.0f%%)", flop / sec[si][c] / 1e9,
                         100.0 * flop / sec[si][c] / 1e9 / peak);
            printf("%s %-10s", c == GEMM_FIRST_BF16 ? " |" : "", cell);
        }
        printf("   max|diff|/max|C|:");
        for (int c = 0; c < GEMM_CANDIDATES; c++)
            if (err[si][c] >= 0) printf(" %.0e", err[si][c]);
        printf("%s%s\n", same[si][0] ? "" : "  widen+OB: threads change the bits",
               same[si][1] ? "" : "  oneDNN bf16: threads change the bits");
    }
    printf("%s\n", bad ? "FAILED: a candidate differs beyond rounding, or threads changed the bits"
                       : "outputs agree; bf16 paths give the same bits on 1 to 4 threads");
    return bad;
}

static int fail(const char *what) {
    fprintf(stderr, "op_bench: %s: %s\n", what, mt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "gemm") == 0)
        return gemm_compare(argc > 2 ? atoi(argv[2]) : 2, argc > 3 ? atoi(argv[3]) : 5, argc > 4 ? argv[4] : NULL);
    bench_model b;
    if (bench_model_args(&b, "op_bench", argc, argv) != 0) return 2;
    g_cpu = mt_cpu_backend();
    const char *clk = getenv("OP_BENCH_CLOCK");
    g_cpu_clock = clk && strcmp(clk, "cpu") == 0;
    mt_ops tab = *g_cpu->ops;
    mt_backend timed_be = *g_cpu; /* the CPU backend with every op timed */
    timed_be.ops = &tab;
    tab.gemm = w_gemm;
    tab.copy = w_copy;
    tab.zero = w_zero;
    tab.embedding_fwd = w_emb_fwd;
    tab.embedding_bwd = w_emb_bwd;
    tab.rmsnorm_fwd = w_rms_fwd;
    tab.rmsnorm_bwd = w_rms_bwd;
    tab.add_rmsnorm_fwd = w_add_rms_fwd;
    tab.rope_fwd = w_rope_fwd;
    tab.rope_bwd = w_rope_bwd;
    tab.attention_fwd = w_att_fwd;
    tab.attention_bwd = w_att_bwd;
    tab.glu_fwd = w_glu_fwd;
    tab.glu_bwd = w_glu_bwd;
    tab.xent_tile = w_xent;
    tab.axpy = w_axpy;
    tab.adamw = w_adamw;

    const char *err = bench_model_create(&b, &timed_be);
    if (err) return fail(err);

    const int threads = (int)b.a[8];
    const char *isa = "none";
    const double peak1 = fma_peak(1, &isa, 0), peak = threads > 1 ? fma_peak(threads, &isa, 0) : peak1;

    /* reference rate: a square GEMM, OpenBLAS's best case */
    const int64_t S = 1024;
    float *x = calloc((size_t)(3 * S * S), sizeof(float));
    for (int64_t i = 0; i < 2 * S * S; i++) x[i] = (float)(i % 7) * 0.1f;
    if (g_cpu->ops->gemm(g_cpu, 0, 0, S, S, S, 1.0f, x, S, x + S * S, S, MT_F32, 0.0f, x + 2 * S * S, S, MT_F32) != MT_OK)
        return fail("gemm");
    double t0 = now();
    if (g_cpu->ops->gemm(g_cpu, 0, 0, S, S, S, 1.0f, x, S, x + S * S, S, MT_F32, 0.0f, x + 2 * S * S, S, MT_F32) != MT_OK)
        return fail("gemm");
    const double ref = 2.0 * (double)(S * S * S) / (now() - t0) / 1e9;
    free(x);

    const int steps = (int)b.a[9];
    double total = 0;
    for (int s = 0; s <= steps; s++) {
        g_on = s > 0;
        double ts = now(), sum = 0;
        int64_t cnt = 0;
        if ((err = bench_model_step(&b, &timed_be, s, &sum, &cnt)) != NULL) return fail(err);
        if (s > 0) total += now() - ts;
    }
    qsort(g_rows, (size_t)g_nrows, sizeof(row), cmp_rows);
    double timed = 0;
    for (int i = 0; i < g_nrows; i++) timed += g_rows[i].sec;
    printf("step %.0f ms %s (mean of %d), be %.0f ms, square %lld^3 GEMM %.1f GFLOP/s\n", total * 1e3 / steps,
           g_cpu_clock ? "CPU time" : "wall", steps, timed * 1e3 / steps, (long long)S, ref);
    printf("fp32 FMA peak (%s loop): %.1f GFLOP/s on 1 thread, %.1f on %d threads; GEMM %s\n", isa,
           peak1, peak, threads, mt_cpu_gemm_kernel());
    printf("%-44s %6s %10s %6s %8s %7s\n", "op", "calls", "ms/step", "%", "GFLOP/s", "%peak");
    double gflop = 0.0, gsec = 0.0;
    for (int i = 0; i < g_nrows; i++) {
        const row *r = &g_rows[i];
        printf("%-44s %6ld %10.1f %6.1f", r->name, r->calls / steps, r->sec * 1e3 / steps, 100.0 * r->sec / total);
        if (r->flop > 0) {
            printf(" %8.1f", r->flop / r->sec / 1e9);
            if (peak > 0) printf(" %6.1f%%", 100.0 * r->flop / r->sec / 1e9 / peak);
            gflop += r->flop;
            gsec += r->sec;
        }
        printf("\n");
    }
    if (gsec > 0 && peak > 0)
        printf("all GEMMs: %.1f GFLOP/s, %.1f%% of the %d-thread peak\n", gflop / gsec / 1e9,
               100.0 * gflop / gsec / 1e9 / peak, threads);
    bench_model_free(&b);
    return 0;
}
