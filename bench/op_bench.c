/* bench/op_bench.c: where the time of one CPU training step goes, op by op.
 *
 * Runs the step of bench/step_bench.c (same model, same arguments) through a copy of the
 * CPU op table whose entries time each call with mt_time_now. GEMMs are kept apart by
 * shape (transposes, M, N, K, beta) and reported with their GFLOP/s next to a square
 * 1024^3 GEMM's, so slow shapes stand out. The first step is a warm-up; the rest are
 * summed. Prints a table sorted by time, largest first.
 * With OP_BENCH_CLOCK=cpu in the environment, times are the process's CPU time instead
 * of wall time: on a machine shared with other jobs, CPU time at threads = 1 (or with
 * OMP_WAIT_POLICY=passive) compares two builds' work where wall time is mostly noise.
 * Usage: op_bench d_model layers heads kv_heads mlp seq batch vocab threads steps tiles */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_model.h"
#include "runtime/timer.h"

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
    printf("%-44s %6s %10s %6s %8s\n", "op", "calls", "ms/step", "%", "GFLOP/s");
    for (int i = 0; i < g_nrows; i++) {
        const row *r = &g_rows[i];
        printf("%-44s %6ld %10.1f %6.1f", r->name, r->calls / steps, r->sec * 1e3 / steps, 100.0 * r->sec / total);
        if (r->flop > 0) printf(" %8.1f", r->flop / r->sec / 1e9);
        printf("\n");
    }
    bench_model_free(&b);
    return 0;
}
