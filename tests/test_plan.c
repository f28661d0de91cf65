/* tests/test_plan.c: the memory plan and arena. Random plans are checked against
 * the invariants the plan promises (no overlap of live buffers, alignment, peak
 * bounds, live-by-category at the true maximum), computed here by brute force. */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/plan.h"

static uint64_t rs = 0x243F6A8885A308D3ull;
static uint64_t rnd(void) { /* xorshift64* */
    rs ^= rs >> 12;
    rs ^= rs << 25;
    rs ^= rs >> 27;
    return rs * 0x2545F4914F6CDD1Dull;
}

static size_t aligned(size_t b) { return (b + MT_PLAN_ALIGN - 1) / MT_PLAN_ALIGN * MT_PLAN_ALIGN; }

/* Build a random plan of n entries over `phases` phases. */
static mt_plan *random_plan(int n, int phases, size_t max_bytes) {
    mt_plan *p = NULL;
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "buf%d", i);
        int a = (int)(rnd() % (uint64_t)phases), b = (int)(rnd() % (uint64_t)phases);
        if (a > b) { int t = a; a = b; b = t; }
        /* a mix of sizes: tiny, unaligned, zero, and large */
        size_t bytes;
        switch (rnd() % 4) {
        case 0: bytes = (size_t)(rnd() % 300); break;
        case 1: bytes = (size_t)(rnd() % max_bytes); break;
        case 2: bytes = (size_t)(rnd() % 16) * MT_PLAN_ALIGN; break;
        default: bytes = (size_t)(rnd() % (max_bytes / 16 + 1)); break;
        }
        int id = -1;
        cr_assert_eq(mt_plan_add(p, name, (mt_mem_category)(rnd() % MT_MEM_CATEGORY_COUNT), bytes, a - 3, b - 3, &id),
                     MT_OK);
        cr_assert_eq(id, i);
    }
    cr_assert_eq(mt_plan_finalize(p), MT_OK);
    return p;
}

static void check_plan_invariants(const mt_plan *p, int phase_lo, int phase_hi) {
    const int n = mt_plan_count(p);
    const size_t peak = mt_plan_peak(p);
    size_t sum_aligned = 0;
    for (int i = 0; i < n; i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        cr_assert_not_null(e);
        cr_assert_eq(e->offset % MT_PLAN_ALIGN, 0, "entry %d offset %zu unaligned", i, e->offset);
        cr_assert_leq(e->offset + e->bytes, peak, "entry %d beyond peak", i);
        sum_aligned += aligned(e->bytes);
        for (int j = i + 1; j < n; j++) {
            const mt_plan_entry *f = mt_plan_entry_get(p, j);
            if (e->bytes == 0 || f->bytes == 0) continue;
            int live_together = e->first <= f->last && f->first <= e->last;
            int mem_overlap = e->offset < f->offset + f->bytes && f->offset < e->offset + e->bytes;
            cr_assert(!(live_together && mem_overlap),
                      "entries %d [%d,%d] @%zu+%zu and %d [%d,%d] @%zu+%zu collide", i, e->first, e->last,
                      e->offset, e->bytes, j, f->first, f->last, f->offset, f->bytes);
        }
    }
    /* brute force over every phase: live requested bytes and live aligned bytes */
    size_t max_live = 0, max_live_aligned = 0;
    int found = 0;
    for (int ph = phase_lo; ph <= phase_hi; ph++) {
        size_t live = 0, live_al = 0;
        for (int i = 0; i < n; i++) {
            const mt_plan_entry *e = mt_plan_entry_get(p, i);
            if (e->first <= ph && ph <= e->last) {
                live += e->bytes;
                live_al += aligned(e->bytes);
            }
        }
        if (!found || live > max_live) {
            max_live = live;
            found = 1;
        }
        if (live_al > max_live_aligned) max_live_aligned = live_al;
    }
    cr_assert_geq(peak, max_live_aligned, "peak %zu below live bytes %zu", peak, max_live_aligned);
    cr_assert_leq(peak, sum_aligned, "peak %zu above sum of sizes %zu", peak, sum_aligned);

    size_t by_cat[MT_MEM_CATEGORY_COUNT], total[MT_MEM_CATEGORY_COUNT];
    int phase = -12345;
    mt_plan_live_by_category(p, by_cat, &phase);
    size_t s = 0;
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++) s += by_cat[c];
    cr_assert_eq(s, max_live, "live_by_category total %zu, brute force max %zu", s, max_live);
    /* the reported phase is a phase attaining the maximum, and the breakdown is
     * that phase's live bytes per category */
    size_t want_cat[MT_MEM_CATEGORY_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        if (e->first <= phase && phase <= e->last) want_cat[e->category] += e->bytes;
    }
    cr_assert_arr_eq(by_cat, want_cat, sizeof by_cat);
    cr_assert_leq(s, peak);

    mt_plan_total_by_category(p, total);
    size_t want_total[MT_MEM_CATEGORY_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        want_total[e->category] += e->bytes;
    }
    cr_assert_arr_eq(total, want_total, sizeof total);
}

Test(plan, random_plans_invariants) {
    for (int trial = 0; trial < 40; trial++) {
        int n = 1 + (int)(rnd() % 300);
        int phases = 1 + (int)(rnd() % 60);
        mt_plan *p = random_plan(n, phases, (size_t)1 << (10 + rnd() % 20));
        check_plan_invariants(p, -3, phases - 4);
        mt_plan_free(p);
    }
}

Test(plan, deterministic_and_idempotent) {
    uint64_t save = rs;
    mt_plan *a = random_plan(200, 30, 1 << 20);
    rs = save;
    mt_plan *b = random_plan(200, 30, 1 << 20);
    cr_assert_eq(mt_plan_peak(a), mt_plan_peak(b));
    for (int i = 0; i < 200; i++)
        cr_assert_eq(mt_plan_entry_get(a, i)->offset, mt_plan_entry_get(b, i)->offset);
    size_t peak = mt_plan_peak(a);
    cr_assert_eq(mt_plan_finalize(a), MT_OK);
    cr_assert_eq(mt_plan_peak(a), peak);
    mt_plan_free(a);
    mt_plan_free(b);
}

Test(plan, sharing_and_packing_small_cases) {
    mt_plan *p = NULL;
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    cr_expect_eq(mt_plan_peak(p), 0, "not finalised -> 0");
    /* two same-size buffers with disjoint lifetimes share memory */
    cr_assert_eq(mt_plan_add(p, "a", MT_MEM_ACTIVATIONS, 1000, 0, 2, NULL), MT_OK);
    cr_assert_eq(mt_plan_add(p, "b", MT_MEM_ACTIVATIONS, 1000, 3, 5, NULL), MT_OK);
    cr_assert_eq(mt_plan_finalize(p), MT_OK);
    cr_expect_eq(mt_plan_peak(p), aligned(1000));
    cr_expect_eq(mt_plan_entry_get(p, 0)->offset, mt_plan_entry_get(p, 1)->offset);
    mt_plan_free(p);

    /* overlapping lifetimes: sizes add, each rounded up to the alignment */
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    cr_assert_eq(mt_plan_add(p, "x", MT_MEM_PARAMS, 100, 0, 1, NULL), MT_OK);
    cr_assert_eq(mt_plan_add(p, "y", MT_MEM_GRADS, 300, 1, 2, NULL), MT_OK);
    cr_assert_eq(mt_plan_add(p, "empty", MT_MEM_SCRATCH, 0, 0, 2, NULL), MT_OK);
    cr_assert_eq(mt_plan_finalize(p), MT_OK);
    cr_expect_eq(mt_plan_peak(p), 256 + 512);
    size_t live[MT_MEM_CATEGORY_COUNT];
    int phase = -1;
    mt_plan_live_by_category(p, live, &phase);
    cr_expect_eq(phase, 1);
    cr_expect_eq(live[MT_MEM_PARAMS], 100);
    cr_expect_eq(live[MT_MEM_GRADS], 300);
    cr_expect_eq(live[MT_MEM_SCRATCH], 0);
    cr_expect_eq(mt_plan_find(p, "y"), 1);
    cr_expect_eq(mt_plan_find(p, "z"), -1);
    cr_expect_null(mt_plan_entry_get(p, 3));
    cr_expect_null(mt_plan_entry_get(p, -1));
    cr_expect_str_eq(mt_plan_entry_get(p, 1)->name, "y");
    mt_plan_free(p);

    /* L1 [0,1] and L2 [2,3] are never live together, so they share one 4096-byte
     * block; s [1,2] is live with both, so it must go above that block. */
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    cr_assert_eq(mt_plan_add(p, "L1", MT_MEM_ACTIVATIONS, 4096, 0, 1, NULL), MT_OK);
    cr_assert_eq(mt_plan_add(p, "L2", MT_MEM_ACTIVATIONS, 4096, 2, 3, NULL), MT_OK);
    cr_assert_eq(mt_plan_add(p, "s", MT_MEM_SCRATCH, 256, 1, 2, NULL), MT_OK);
    cr_assert_eq(mt_plan_finalize(p), MT_OK);
    cr_expect_eq(mt_plan_peak(p), 4096 + 256);
    check_plan_invariants(p, 0, 3);
    mt_plan_free(p);
}

Test(plan, category_names) {
    cr_expect_str_eq(mt_mem_category_name(MT_MEM_PARAMS), "params");
    cr_expect_str_eq(mt_mem_category_name(MT_MEM_GRADS), "grads");
    for (int a = 0; a < MT_MEM_CATEGORY_COUNT; a++)
        for (int b = a + 1; b < MT_MEM_CATEGORY_COUNT; b++)
            cr_expect_str_neq(mt_mem_category_name((mt_mem_category)a), mt_mem_category_name((mt_mem_category)b));
}

Test(plan, bad_input) {
    mt_plan *p = NULL;
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    mt_clear_error();
    cr_expect_eq(mt_plan_add(p, "a", MT_MEM_PARAMS, 10, 3, 2, NULL), MT_ERR_INVALID, "first > last");
    cr_expect_str_neq(mt_last_error(), "");
    cr_expect_eq(mt_plan_add(p, "", MT_MEM_PARAMS, 10, 0, 0, NULL), MT_ERR_INVALID, "empty name");
    cr_expect_eq(mt_plan_add(p, NULL, MT_MEM_PARAMS, 10, 0, 0, NULL), MT_ERR_INVALID, "NULL name");
    char longname[MT_PLAN_NAME_MAX + 1];
    memset(longname, 'n', MT_PLAN_NAME_MAX);
    longname[MT_PLAN_NAME_MAX] = '\0';
    cr_expect_eq(mt_plan_add(p, longname, MT_MEM_PARAMS, 10, 0, 0, NULL), MT_ERR_INVALID, "name too long");
    longname[MT_PLAN_NAME_MAX - 1] = '\0'; /* exactly the longest allowed */
    cr_expect_eq(mt_plan_add(p, longname, MT_MEM_PARAMS, 10, 0, 0, NULL), MT_OK);
    cr_expect_eq(mt_plan_add(p, "c", MT_MEM_CATEGORY_COUNT, 10, 0, 0, NULL), MT_ERR_INVALID, "bad category");
    cr_expect_eq(mt_plan_count(p), 1);
    mt_arena a;
    cr_expect_eq(mt_arena_create(&a, p, NULL, NULL, NULL), MT_ERR_INVALID, "arena before finalise");
    cr_assert_eq(mt_plan_finalize(p), MT_OK);
    cr_expect_eq(mt_plan_add(p, "late", MT_MEM_PARAMS, 10, 0, 0, NULL), MT_ERR_INVALID, "add after finalise");
    cr_expect_eq(mt_plan_count(p), 1);
    mt_plan_free(p);
}

static int counting_allocs;
static size_t counting_last;
static mt_status counting_alloc(void *ctx, size_t n, void **out) {
    (void)ctx;
    counting_allocs++;
    counting_last = n;
    *out = malloc(n);
    return *out ? MT_OK : MT_ERR_OOM;
}
static void counting_release(void *ctx, void *ptr) {
    (void)ctx;
    counting_allocs--;
    free(ptr);
}

Test(plan, arena) {
    mt_plan *p = random_plan(100, 20, 1 << 16);
    size_t peak = mt_plan_peak(p);
    mt_arena a;
    cr_assert_eq(mt_arena_create(&a, p, NULL, NULL, NULL), MT_OK);
    cr_expect_eq(a.bytes, peak);
    cr_expect_eq((uintptr_t)a.base % MT_PLAN_ALIGN, 0);
    const unsigned char *bytes = a.base;
    for (size_t i = 0; i < peak; i++) cr_assert_eq(bytes[i], 0, "arena byte %zu not zero", i);
    for (int i = 0; i < mt_plan_count(p); i++) {
        char *ptr = mt_arena_ptr(&a, p, i);
        cr_assert_eq(ptr, (char *)a.base + mt_plan_entry_get(p, i)->offset);
        cr_assert_eq((uintptr_t)ptr % MT_PLAN_ALIGN, 0);
        memset(ptr, 0xab, mt_plan_entry_get(p, i)->bytes); /* within the arena (ASan/valgrind) */
    }
    cr_expect_null(mt_arena_ptr(&a, p, -1));
    cr_expect_null(mt_arena_ptr(&a, p, mt_plan_count(p)));
    mt_arena_destroy(&a);
    cr_expect_null(a.base);
    mt_arena_destroy(&a); /* twice is harmless */

    cr_assert_eq(mt_arena_create(&a, p, counting_alloc, counting_release, NULL), MT_OK);
    cr_expect_eq(counting_allocs, 1);
    cr_expect_eq(counting_last, peak);
    cr_expect_eq(a.bytes, peak);
    mt_arena_destroy(&a);
    cr_expect_eq(counting_allocs, 0);
    mt_plan_free(p);
}
