/* bench/op_bench.c: where the time of one CPU training step goes, op by op.
 *
 * Runs the step of bench/step_bench.c (same model, same arguments) through a copy of the
 * CPU op table whose entries time each call with mt_time_now. GEMMs are kept apart by
 * shape (transposes, M, N, K, beta) and reported with their GFLOP/s next to a square
 * 1024^3 GEMM's, so slow shapes stand out. The first step is a warm-up; the rest are
 * summed. Prints a table sorted by time, largest first, with each GEMM shape's share of
 * the machine's fp32 FMA peak: measured first by fma_peak, a loop of independent
 * fused-multiply-add chains held in registers (AVX-512 where the CPU has it, else
 * AVX2 + FMA, chosen at run time), on one thread and on the run's threads. The OpenBLAS
 * kernel set in use (kernels/cpu/gemm.c) is printed with it.
 * With OP_BENCH_CLOCK=cpu in the environment, times are the process's CPU time instead
 * of wall time: on a machine shared with other jobs, CPU time at threads = 1 (or with
 * OMP_WAIT_POLICY=passive) compares two builds' work where wall time is mostly noise.
 * Usage: op_bench d_model layers heads kv_heads mlp seq batch vocab threads steps tiles */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_model.h"
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

/* fp32 FMA peak in GFLOP/s on `threads` threads (best of 3 runs of ~0.2 s); *isa names
 * the instruction set used ("none": no FMA, returns 0). */
static double fma_peak(int threads, const char **isa) {
#if defined(__GNUC__) && defined(__x86_64__)
    const int w512 = __builtin_cpu_supports("avx512f");
    const int w256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    *isa = w512 ? "AVX-512" : w256 ? "AVX2+FMA" : "none";
    if (!w512 && !w256) return 0.0;
    const long iters = 20000000;
    const double flop_per_thread = (double)iters * (w512 ? 12.0 * 16.0 : 10.0 * 8.0) * 2.0;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        const double t0 = mt_time_now();
#pragma omp parallel num_threads(threads)
        g_sink = w512 ? fma_chains_512(iters) : fma_chains_256(iters);
        const double r = flop_per_thread * threads / (mt_time_now() - t0) / 1e9;
        best = r > best ? r : best;
    }
    return best;
#else
    (void)threads;
    *isa = "none";
    return 0.0;
#endif
}

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

static double now(void) {
    if (!g_cpu_clock) return mt_time_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

static mt_status w_gemm(mt_backend *be_, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                   int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    char name[96];
    snprintf(name, sizeof name, "gemm %c%c M%-6lld N%-6lld K%-6lld b%g", ta ? 'T' : 'N', tb ? 'T' : 'N',
             (long long)M, (long long)N, (long long)K, (double)beta);
    (void)be_;
    double t0 = now();
    const mt_status st = g_cpu->ops->gemm(g_cpu, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    add(name, now() - t0, 2.0 * (double)M * (double)N * (double)K);
    return st;
}
static mt_status w_copy(mt_backend *be_, void *d, const void *s, size_t n) { TIMED("copy", g_cpu->ops->copy(g_cpu, d, s, n)); }
static mt_status w_zero(mt_backend *be_, void *p, size_t n) { TIMED("zero", g_cpu->ops->zero(g_cpu, p, n)); }
static mt_status w_emb_fwd(mt_backend *be_, float *o, const float *t, const int32_t *k, int64_t N, int64_t D, float s) {
    TIMED("embedding_fwd", g_cpu->ops->embedding_fwd(g_cpu, o, t, k, N, D, s));
}
static mt_status w_emb_bwd(mt_backend *be_, float *dt, const float *d, const int32_t *k, int64_t N, int64_t V, int64_t D, float s) {
    TIMED("embedding_bwd", g_cpu->ops->embedding_bwd(g_cpu, dt, d, k, N, V, D, s));
}
static mt_status w_rms_fwd(mt_backend *be_, float *y, float *r, const float *x, const float *w, int64_t N, int64_t D, float e,
                      float o) {
    TIMED("rmsnorm_fwd", g_cpu->ops->rmsnorm_fwd(g_cpu, y, r, x, w, N, D, e, o));
}
static mt_status w_rms_bwd(mt_backend *be_, float *dx, float *dw, const float *dy, const float *x, const float *w, const float *r,
                      int64_t N, int64_t D, float o) {
    TIMED("rmsnorm_bwd", g_cpu->ops->rmsnorm_bwd(g_cpu, dx, dw, dy, x, w, r, N, D, o));
}
static mt_status w_rope_fwd(mt_backend *be_, float *x, const int32_t *p, const float *f, int64_t N, int64_t H, int64_t Dh) {
    TIMED("rope_fwd", g_cpu->ops->rope_fwd(g_cpu, x, p, f, N, H, Dh));
}
static mt_status w_rope_bwd(mt_backend *be_, float *x, const int32_t *p, const float *f, int64_t N, int64_t H, int64_t Dh) {
    TIMED("rope_bwd", g_cpu->ops->rope_bwd(g_cpu, x, p, f, N, H, Dh));
}
static mt_status w_att_fwd(mt_backend *be_, const mt_attn_args *a, float *o, float *l, const float *q, const float *k,
                      const float *v) {
    TIMED("attention_fwd", g_cpu->ops->attention_fwd(g_cpu, a, o, l, q, k, v));
}
static mt_status w_att_bwd(mt_backend *be_, const mt_attn_args *a, float *dq, float *dk, float *dv, const float *dout,
                      const float *q, const float *k, const float *v, const float *o, const float *l) {
    TIMED("attention_bwd", g_cpu->ops->attention_bwd(g_cpu, a, dq, dk, dv, dout, q, k, v, o, l));
}
static mt_status w_glu_fwd(mt_backend *be_, float *h, const float *g, const float *u, int64_t n, mt_activation act) {
    TIMED("glu_fwd", g_cpu->ops->glu_fwd(g_cpu, h, g, u, n, act));
}
static mt_status w_glu_bwd(mt_backend *be_, float *dg, float *du, const float *dh, const float *g, const float *u, int64_t n,
                      mt_activation act) {
    TIMED("glu_bwd", g_cpu->ops->glu_bwd(g_cpu, dg, du, dh, g, u, n, act));
}
static mt_status w_xent(mt_backend *be_, float *z, const int32_t *lab, int64_t R, int64_t V, float cap, int32_t ign, float ds,
                   double *ls, int64_t *cnt) {
    TIMED("xent_tile", g_cpu->ops->xent_tile(g_cpu, z, lab, R, V, cap, ign, ds, ls, cnt));
}
static mt_status w_axpy(mt_backend *be_, float *y, const float *x, float a, int64_t n) { TIMED("axpy", g_cpu->ops->axpy(g_cpu, y, x, a, n)); }
static mt_status w_adamw(mt_backend *be_, float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                    float eps, float wd, float gs, int64_t t) {
    TIMED("adamw", g_cpu->ops->adamw(g_cpu, p, g, m, v, n, lr, b1, b2, eps, wd, gs, t));
}

static int cmp_rows(const void *a, const void *b) {
    const double x = ((const row *)a)->sec, y = ((const row *)b)->sec;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int fail(const char *what) {
    fprintf(stderr, "op_bench: %s: %s\n", what, mt_last_error());
    return 1;
}

int main(int argc, char **argv) {
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
    const double peak1 = fma_peak(1, &isa), peak = threads > 1 ? fma_peak(threads, &isa) : peak1;

    /* reference rate: a square GEMM, OpenBLAS's best case */
    const int64_t S = 1024;
    float *x = calloc((size_t)(3 * S * S), sizeof(float));
    for (int64_t i = 0; i < 2 * S * S; i++) x[i] = (float)(i % 7) * 0.1f;
    if (g_cpu->ops->gemm(g_cpu, 0, 0, S, S, S, 1.0f, x, S, x + S * S, S, 0.0f, x + 2 * S * S, S) != MT_OK)
        return fail("gemm");
    double t0 = now();
    if (g_cpu->ops->gemm(g_cpu, 0, 0, S, S, S, 1.0f, x, S, x + S * S, S, 0.0f, x + 2 * S * S, S) != MT_OK)
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
    printf("fp32 FMA peak (%s loop): %.1f GFLOP/s on 1 thread, %.1f on %d threads; OpenBLAS kernels %s\n", isa,
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
