/* tests/test_optimizer.c: the LR schedule (against MaxText's formula written out
 * independently here), global-norm clipping, and AdamW over a parameter table
 * (against a double-precision re-implementation of torch.optim.AdamW's update). */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "train/optimizer.h"

static const double PI = 3.14159265358979323846;

/* MaxText maxtext_utils.create_learning_rate_schedule, learning_rate_schedule_steps
 * = steps: optax.linear_schedule(0, lr, W) joined with
 * make_cos_schedule(lr, lr * f, steps - W) at boundary W. */
static double ref_lr(double lr, double frac, double f, long steps, long s) {
    long w = (long)(steps * frac);
    if (s < w) return lr * (double)s / (double)w;
    double pct = (double)(s - w) / (double)(steps - w);
    double a = 0.5 * (cos(PI * pct) + 1.0);
    return lr * a + lr * f * (1.0 - a);
}

/* Unit roundoffs (fp64 2^-53, fp32 2^-24) and gamma_n = n u / (1 - n u), the bound on
 * the relative error of n rounded operations' product of (1 + delta) factors, and of a
 * sum of n + 1 terms of one sign in any order (Higham, "Accuracy and Stability of
 * Numerical Algorithms", 2nd ed., 2002, Lemma 3.1 and eq. 3.5). */
#define U64 0x1p-53
#define U32 0x1p-24
#define GAMMA64(n) ((double)(n) * U64 / (1.0 - (double)(n) * U64))
#define GAMMA32(n) ((double)(n) * U32 / (1.0 - (double)(n) * U32))

/* Relative tolerance for the schedule's doubles against ref_lr, the same formula in
 * another association order: each side is lr (a + f (1 - a)) or lr s / w with
 * a = 0.5 (cos(pi pct) + 1), pct = (s - w) / (steps - w): at most 8 roundings (the
 * division, pi pct, cos (glibc: < 1 ulp = 2u), + 1, 0.5 (exact), 1 - a, the products by
 * f and lr, the sum), so each is within gamma_9 of lr (the terms a and f (1 - a) are
 * non-negative: no cancellation in the sum; an absolute error of a, which cancellation
 * in cos + 1 leaves, is absolute in lr too), and the two within 2 gamma_9 of each other
 * as a fraction of lr: 2e-15. */
#define DTOL (2.0 * GAMMA64(9))

Test(schedule, warmup_and_cosine) {
    const double lr = 3e-4, f = 0.1;
    mt_lr_schedule s = mt_lr_schedule_make(lr, 0.1, f, 100);
    cr_assert_eq(s.warmup_steps, 10);
    cr_expect_eq(mt_lr_schedule_at(&s, 0), 0.0, "warmup starts at 0");
    cr_expect_float_eq(mt_lr_schedule_at(&s, 5), lr * 0.5, lr * DTOL, "middle of warmup");
    cr_expect_float_eq(mt_lr_schedule_at(&s, 9), lr * 0.9, lr * DTOL);
    cr_expect_float_eq(mt_lr_schedule_at(&s, 10), lr, lr * DTOL, "end of warmup = peak");
    cr_expect_float_eq(mt_lr_schedule_at(&s, 55), 0.5 * lr + 0.5 * lr * f, lr * DTOL, "cosine midpoint");
    cr_expect_float_eq(mt_lr_schedule_at(&s, 100), lr * f, lr * DTOL, "final value at steps");
    cr_expect_float_eq(mt_lr_schedule_at(&s, 1000), lr * f, lr * DTOL, "stays final past steps");
    for (long i = 0; i <= 100; i++)
        cr_expect_float_eq(mt_lr_schedule_at(&s, i), ref_lr(lr, 0.1, f, 100, i), lr * DTOL, "s=%ld", i);
    /* Monotone decreasing after warmup. */
    for (long i = 11; i <= 100; i++) cr_expect_lt(mt_lr_schedule_at(&s, i), mt_lr_schedule_at(&s, i - 1));
}

Test(schedule, truncation_and_edges) {
    /* int(15 * 0.1) = 1 warmup step (truncation, as in MaxText). */
    mt_lr_schedule s = mt_lr_schedule_make(1.0, 0.1, 0.0, 15);
    cr_expect_eq(s.warmup_steps, 1);
    cr_expect_eq(mt_lr_schedule_at(&s, 0), 0.0);
    cr_expect_float_eq(mt_lr_schedule_at(&s, 1), 1.0, DTOL);
    for (long i = 0; i <= 15; i++)
        cr_expect_float_eq(mt_lr_schedule_at(&s, i), ref_lr(1.0, 0.1, 0.0, 15, i), DTOL, "s=%ld", i);
    /* No warmup: the first update runs at the peak. */
    mt_lr_schedule n = mt_lr_schedule_make(2.0, 0.0, 0.5, 10);
    cr_expect_eq(mt_lr_schedule_at(&n, 0), 2.0);
    cr_expect_float_eq(mt_lr_schedule_at(&n, 10), 1.0, DTOL);
    /* Final fraction 1: constant after warmup. */
    mt_lr_schedule c = mt_lr_schedule_make(2.0, 0.0, 1.0, 10);
    for (long i = 0; i < 10; i++) cr_expect_eq(mt_lr_schedule_at(&c, i), 2.0);
    /* Warmup over the whole run: linear ramp, never reaching the peak. */
    mt_lr_schedule w = mt_lr_schedule_make(1.0, 1.0, 0.1, 4);
    cr_expect_float_eq(mt_lr_schedule_at(&w, 3), 0.75, DTOL);
}

/* Two tensors: a matrix (weight decay) and a norm scale (none). */
static mt_param_info table[2];
static void make_table(void) {
    memset(table, 0, sizeof table);
    strcpy(table[0].name, "w");
    table[0].ndim = 2, table[0].shape[0] = 7, table[0].shape[1] = 5;
    table[0].offset = 0, table[0].numel = 35, table[0].weight_decay = 1;
    strcpy(table[1].name, "norm");
    table[1].ndim = 1, table[1].shape[0] = 9;
    table[1].offset = 35, table[1].numel = 9, table[1].weight_decay = 0;
}
#define NUMEL 44

Test(clip, global_norm_and_scale) {
    make_table();
    mt_backend *be = mt_cpu_backend();
    float g[NUMEL];
    long double ss = 0;
    for (int i = 0; i < NUMEL; i++) {
        g[i] = (float)(0.37 * sin(1.3 * i + 0.2) * (i % 3 + 1));
        ss += (long double)g[i] * g[i];
    }
    double norm = 0.0, acc = 0.0; /* acc: the sumsq accumulator (host memory is the CPU backend's) */
    cr_assert_eq(mt_grad_global_norm(be, g, table, 2, &acc, &norm), MT_OK);
    /* Each square of a float is exact in fp64 (24 + 24 bits); the fp64 sum of the 44
     * non-negative squares (and the zeroed accumulator), in any chunk order, is within
     * gamma_44 relative; sqrt halves that and rounds once: gamma_44 / 2 + u64. The long
     * double reference errs by < 44 2^-64 and its conversion by u64: 2.7e-15 in all. */
    cr_assert_float_eq(norm, (double)sqrtl(ss), (GAMMA64(44) / 2 + 2 * U64 + 44 * 0x1p-64) * norm);
    cr_expect_eq(mt_clip_scale(norm, 0.0), 1.0, "threshold 0 = off");
    cr_expect_eq(mt_clip_scale(norm, norm * 2), 1.0, "below the threshold: untouched");
    const double thr = norm / 3.0;
    double sc = mt_clip_scale(norm, thr);
    /* sc = fl(fl(norm / 3) / norm) = (1/3)(1 + d1)(1 + d2), fl(1/3) one more rounding */
    cr_expect_float_eq(sc, 1.0 / 3.0, (GAMMA64(2) + U64) / 3.0);
    TU_OK(be->ops->scale(be, g, (float)sc, NUMEL, MT_F32));
    double clipped = 0.0;
    cr_assert_eq(mt_grad_global_norm(be, g, table, 2, &acc, &clipped), MT_OK);
    /* clipped / thr = (1 + d')(1 + d1)(1 + eta)(1 + e2) / (1 + e1): fl32(sc) (d1 <= u32)
     * and the fp32 scale op rounding each element once (|eta| <= u32: the 2-norm of
     * elements each moved by at most u32 relative) give gamma32_2; sc's division d'
     * (u64), the two norms' fp64 errors e1, e2 (above: 24 u64 each) and thr's division
     * give at most 50 u64 (gamma64_50; the cross terms, ~1e-21, fit in its slack):
     * 1.19e-7 relative. */
    cr_expect_float_eq(clipped, thr, (GAMMA32(2) + GAMMA64(50)) * thr, "clipped norm %.9g vs threshold %.9g", clipped,
                       thr);
}

/* torch.optim.AdamW.step (decoupled weight decay: p *= 1 - lr wd, then the Adam
 * step), in double. Mathematically equal to the ops.h form. Alongside, e[i] bounds
 * |p_fp32 - p| for the fp32 kernel (kernels/cpu/adamw.c adamw_scalar, and its AVX2 copy
 * operation for operation) run on the same fp32 inputs, em / ev the same for m and v
 * (first order in u; u = u32 + u64 at every rounding site also covers this reference's
 * own fp64 rounding there). Per element, Higham 2002 Lemma 3.1 (each rounded op
 * (1 + delta), |delta| <= u; an FMA only removes roundings):
 *   gi = gs g                         eg = u |gi|
 *   m = b1 m' + c1 gi                 em = b1 em' + c1 eg + 2u (b1 |m'| + c1 |gi|)
 *   v = b2 v' + c2 gi^2               ev = b2 ev' + 2 c2 |gi| eg + 3u (b2 v' + c2 gi^2)
 *   n = m ib1 (ib1 = fl32(fp64 1 / (1 - b1^t)): u + (b1^t / (1 - b1^t) + 3) u64 = rb1)
 *                                     en = ib1 em + (rb1 + u) ib1 |m|
 *   q = v ib2                         eq = ib2 ev + (rb2 + u) ib2 v
 *   s = sqrt(q)                       es = eq / (2 s) + u s
 *   den = s + eps                     ed = es + u den
 *   upd = n / den                     eu = en / den + |n| ed / den^2 + u |upd|
 *   a = upd + wd p'                   ea = eu + wd e' + 2u (|upd| + wd |p'|)
 *   p = p' - lr a                     e = e' + lr ea + u lr |a| + u |p|
 * (c1 = 1 - b1 and c2 are exact in fp32: Sterbenz; the constants are the fp32 values
 * the op receives, so both sides use them.) The factor 1 + 2^-10 in the check covers
 * the neglected second-order terms (relative size ~ 10 u). */
static void ref_adamw(double *p, const double *g, double *m, double *v, double *e, double *em, double *ev, int n,
                      double lr, double b1, double b2, double eps, double wd, double gs, long t) {
    const double u = U32 + U64;
    const double bt1 = pow(b1, (double)t), bt2 = pow(b2, (double)t);
    const double rb1 = u + (bt1 / (1 - bt1) + 3) * U64, rb2 = u + (bt2 / (1 - bt2) + 3) * U64;
    const double ib1 = 1 / (1 - bt1), ib2 = 1 / (1 - bt2);
    for (int i = 0; i < n; i++) {
        double gi = g[i] * gs;
        double pd = p[i] * (1.0 - lr * wd);
        const double p0 = p[i], eg = u * fabs(gi);
        em[i] = b1 * em[i] + (1 - b1) * eg + 2 * u * (b1 * fabs(m[i]) + (1 - b1) * fabs(gi));
        ev[i] = b2 * ev[i] + 2 * (1 - b2) * fabs(gi) * eg + 3 * u * (b2 * v[i] + (1 - b2) * gi * gi);
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mh = m[i] / (1 - pow(b1, (double)t)), vh = v[i] / (1 - pow(b2, (double)t));
        const double en = ib1 * em[i] + (rb1 + u) * ib1 * fabs(m[i]);
        const double eq = ib2 * ev[i] + (rb2 + u) * ib2 * v[i];
        const double sq = sqrt(vh), es = eq / (2 * sq) + u * sq, den = sq + eps, ed = es + u * den;
        const double upd = mh / den, eu = en / den + fabs(mh) * ed / (den * den) + u * fabs(upd);
        const double ea = eu + wd * e[i] + 2 * u * (fabs(upd) + wd * fabs(p0));
        p[i] = pd - lr * mh / (sqrt(vh) + eps);
        e[i] = e[i] + lr * ea + u * lr * fabs(upd + wd * p0) + u * fabs(p[i]);
    }
}

Test(adamw, parameter_table) {
    make_table();
    mt_backend *be = mt_cpu_backend();
    mt_adamw opt;
    mt_adamw_init(&opt, be, NUMEL, 0.9, 0.95, 1e-8, 0.1);
    mt_plan *plan = NULL;
    cr_assert_eq(mt_plan_new(&plan), MT_OK);
    cr_assert_eq(mt_adamw_add_to_plan(&opt, plan, 4, 2), MT_OK);
    cr_assert_eq(mt_plan_finalize(plan), MT_OK);
    size_t cat[MT_MEM_CATEGORY_COUNT];
    mt_plan_total_by_category(plan, cat);
    /* m and v, and the table of at most 2 segments (24 bytes each) */
    cr_expect_eq(sizeof(mt_adamw_segment), 24);
    cr_expect_eq(cat[MT_MEM_OPTIMIZER], 2 * NUMEL * sizeof(float) + 2 * sizeof(mt_adamw_segment));
    mt_arena arena;
    cr_assert_eq(mt_arena_create(&arena, plan, NULL, NULL, NULL), MT_OK);
    cr_assert_eq(mt_adamw_bind(&opt, &arena, plan), MT_OK);

    float p[NUMEL], g[NUMEL];
    double pr[NUMEL], gr[NUMEL], mr[NUMEL] = {0}, vr[NUMEL] = {0}, er[NUMEL] = {0}, emr[NUMEL] = {0};
    double evr[NUMEL] = {0};
    /* the fp32 hyperparameters the op receives (mt_adamw_init rounds them) */
    const double b1 = (double)0.9f, b2 = (double)0.95f, eps = (double)1e-8f, wd = (double)0.1f;
    for (int i = 0; i < NUMEL; i++) pr[i] = p[i] = (float)(0.5 * cos(0.7 * i));
    for (long t = 1; t <= 3; t++) {
        for (int i = 0; i < NUMEL; i++) gr[i] = g[i] = (float)(0.1 * sin(0.9 * i + t) + 0.01 * t);
        const double lr = 1e-2 * (double)t, gs = 0.5;
        cr_assert_eq(mt_adamw_step(&opt, table, 2, p, g, (float)lr, (float)gs, t), MT_OK);
        ref_adamw(pr, gr, mr, vr, er, emr, evr, 35, (double)(float)lr, b1, b2, eps, wd, gs, t);
        ref_adamw(pr + 35, gr + 35, mr + 35, vr + 35, er + 35, emr + 35, evr + 35, 9, (double)(float)lr, b1, b2, eps,
                  0.0, gs, t);
    }
    /* Each parameter within its bound e (ref_adamw): 1.2e-7 to 1.6e-7 here, measured at
     * most 0.4 of it; a missing or misplaced weight decay would differ by lr wd p ~ 1e-3. */
    double worst = 0.0;
    for (int i = 0; i < NUMEL; i++) {
        const double bound = (1.0 + 0x1p-10) * er[i];
        worst = fmax(worst, fabs(p[i] - pr[i]) / bound);
        cr_expect(fabs(p[i] - pr[i]) <= bound, "p[%d] = %.9g, reference %.9g, bound %.3g", i, p[i], pr[i], bound);
    }
    if (getenv("MT_TEST_VERBOSE")) fprintf(stderr, "  adamw p vs fp64: %.3f of the bound\n", worst);
    cr_expect_eq(mt_adamw_step(&opt, table, 2, p, g, 0.1f, 1.0f, 0), MT_ERR_INVALID, "t must be >= 1");
    mt_arena_destroy(&arena);
    mt_plan_free(plan);
}

/* ---- one op call per step: the segment table ---- */

/* The CPU backend with adamw and copy_to_device counted, the last table kept. */
static int g_adamw_calls, g_uploads;
static mt_adamw_segment g_seen[16];
static int g_nseen;
static mt_backend *g_inner;
static mt_status count_adamw(mt_backend *be, float *p, const float *g, float *m, float *v, const mt_adamw_segment *segs,
                             int nsegs, float lr, float b1, float b2, float eps, float wd, float gs, int64_t t) {
    (void)be;
    g_adamw_calls++;
    g_nseen = nsegs < 16 ? nsegs : 16;
    memcpy(g_seen, segs, sizeof *segs * (size_t)g_nseen);
    return g_inner->ops->adamw(g_inner, p, g, m, v, segs, nsegs, lr, b1, b2, eps, wd, gs, t);
}
static mt_status count_upload(mt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    g_uploads++;
    return g_inner->ops->copy_to_device(g_inner, dst, src, bytes);
}

/* Six tensors (a gap after the third; numel 0 for the fifth): runs of the same decay
 * flag merge where one tensor ends at the next one's offset, nowhere else. */
static mt_param_info tab6[6];
static void make_tab6(void) {
    const int64_t off[6] = {0, 10, 15, 20, 26, 26}, num[6] = {10, 5, 3, 6, 0, 4};
    const int wd[6] = {1, 1, 0, 0, 1, 1};
    memset(tab6, 0, sizeof tab6);
    for (int i = 0; i < 6; i++) {
        snprintf(tab6[i].name, sizeof tab6[i].name, "t%d", i);
        tab6[i].ndim = 1, tab6[i].shape[0] = num[i];
        tab6[i].offset = off[i], tab6[i].numel = num[i], tab6[i].weight_decay = wd[i];
    }
}
#define NUMEL6 32

Test(adamw, segments_merge_adjacent_tensors) {
    make_tab6();
    mt_adamw_segment s[6];
    int n = -1;
    cr_assert_eq(mt_adamw_segments(tab6, 6, s, &n), MT_OK, "%s", mt_last_error());
    const mt_adamw_segment want[4] = {{0, 15, 1, 0}, {15, 3, 0, 0}, {20, 6, 0, 0}, {26, 4, 1, 0}};
    cr_assert_eq(n, 4, "%d segments", n);
    for (int i = 0; i < 4; i++)
        cr_expect(s[i].offset == want[i].offset && s[i].numel == want[i].numel && s[i].decay == want[i].decay &&
                      s[i].reserved == 0,
                  "segment %d: [%lld, +%lld) decay %d", i, (long long)s[i].offset, (long long)s[i].numel, s[i].decay);
    /* out of order, overlapping, negative: refused, naming the tensor */
    mt_param_info bad[2] = {tab6[1], tab6[0]};
    cr_expect_eq(mt_adamw_segments(bad, 2, s, &n), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "'t0'") != NULL, "%s", mt_last_error());
    bad[0] = tab6[0], bad[1] = tab6[1];
    bad[1].offset = 9;
    cr_expect_eq(mt_adamw_segments(bad, 2, s, &n), MT_ERR_INVALID);
    bad[1].offset = 10, bad[1].numel = -1;
    cr_expect_eq(mt_adamw_segments(bad, 2, s, &n), MT_ERR_INVALID);
}

/* mt_adamw_step makes one upload and one adamw call for the whole table, and its
 * parameters, moments and untouched gap are bitwise those of one call per tensor. */
Test(adamw, one_op_call_per_step) {
    make_tab6();
    g_inner = mt_cpu_backend();
    mt_ops tab = *g_inner->ops;
    tab.adamw = count_adamw;
    tab.copy_to_device = count_upload;
    mt_backend counted = *g_inner;
    counted.ops = &tab;
    mt_adamw opt;
    mt_adamw_init(&opt, &counted, NUMEL6, 0.9, 0.95, 1e-8, 0.1);
    mt_plan *plan = NULL;
    cr_assert_eq(mt_plan_new(&plan), MT_OK);
    cr_assert_eq(mt_adamw_add_to_plan(&opt, plan, 1, 6), MT_OK);
    cr_assert_eq(mt_plan_finalize(plan), MT_OK);
    mt_arena arena;
    cr_assert_eq(mt_arena_create(&arena, plan, NULL, NULL, NULL), MT_OK);
    cr_assert_eq(mt_adamw_bind(&opt, &arena, plan), MT_OK);
    float p[NUMEL6], g[NUMEL6], pr[NUMEL6], mr[NUMEL6] = {0}, vr[NUMEL6] = {0};
    for (int i = 0; i < NUMEL6; i++) pr[i] = p[i] = (float)(0.5 * cos(0.7 * i));
    for (int64_t t = 1; t <= 3; t++) {
        for (int i = 0; i < NUMEL6; i++) g[i] = (float)(0.1 * sin(0.9 * i + (double)t));
        g_adamw_calls = g_uploads = 0;
        cr_assert_eq(mt_adamw_step(&opt, tab6, 6, p, g, 1e-2f, 0.5f, t), MT_OK, "%s", mt_last_error());
        cr_expect_eq(g_adamw_calls, 1, "step %lld: %d adamw calls", (long long)t, g_adamw_calls);
        cr_expect_eq(g_uploads, 1, "step %lld: %d uploads", (long long)t, g_uploads);
        cr_expect_eq(g_nseen, 4, "step %lld: %d segments", (long long)t, g_nseen);
        for (int i = 0; i < 6; i++) { /* the per-tensor calls of before */
            const mt_adamw_segment one = {tab6[i].offset, tab6[i].numel, tab6[i].weight_decay, 0};
            TU_OK(g_inner->ops->adamw(g_inner, pr, g, mr, vr, &one, 1, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t));
        }
    }
    cr_expect(memcmp(p, pr, sizeof p) == 0, "parameters differ from the per-tensor calls");
    cr_expect(memcmp(opt.m, mr, sizeof mr) == 0 && memcmp(opt.v, vr, sizeof vr) == 0,
              "moments differ from the per-tensor calls");
    cr_expect(p[18] == (float)(0.5 * cos(0.7 * 18)) && p[19] == (float)(0.5 * cos(0.7 * 19)),
              "the gap [18, 20) moved");
    /* more segments than the plan's table holds: refused, nothing called */
    mt_adamw small = opt;
    small.max_segments = 3;
    g_adamw_calls = 0;
    cr_expect_eq(mt_adamw_step(&small, tab6, 6, p, g, 1e-2f, 0.5f, 4), MT_ERR_INVALID);
    cr_expect_eq(g_adamw_calls, 0);
    mt_arena_destroy(&arena);
    mt_plan_free(plan);
}
