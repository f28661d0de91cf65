/* runtime/plan.c: memory plan (greedy-by-size offset assignment) and arena
 * (see plan.h; Pisarchyk & Lee 2020, TFLite's arena planner). */
#include "runtime/plan.h"

#include <stdlib.h>
#include <string.h>

struct mt_plan {
    mt_plan_entry *entries;
    int count;
    int cap;
    int finalized;
    size_t peak;
};

static const char *const mt_mem_category_names[MT_MEM_CATEGORY_COUNT] = {
    "params", "grads", "optimizer", "activations", "scratch", "loss_tile", "comm", "workspace",
};

const char *mt_mem_category_name(mt_mem_category c) {
    if ((int)c < 0 || c >= MT_MEM_CATEGORY_COUNT) return "unknown";
    return mt_mem_category_names[c];
}

/* Size rounded up to the alignment, so every offset stays a multiple of it. */
static size_t mt_plan_aligned(size_t bytes) {
    return (bytes + (MT_PLAN_ALIGN - 1)) / MT_PLAN_ALIGN * MT_PLAN_ALIGN;
}

mt_status mt_plan_new(mt_plan **out) {
    if (!out) return mt_set_error(MT_ERR_INVALID, "mt_plan_new: NULL out");
    *out = calloc(1, sizeof(mt_plan));
    if (!*out) return mt_set_error(MT_ERR_OOM, "mt_plan_new: out of memory (%zu bytes)", sizeof(mt_plan));
    return MT_OK;
}

void mt_plan_free(mt_plan *p) {
    if (!p) return;
    free(p->entries);
    free(p);
}

mt_status mt_plan_add(mt_plan *p, const char *name, mt_mem_category cat, size_t bytes, int first,
                      int last, int *id) {
    if (!p) return mt_set_error(MT_ERR_INVALID, "mt_plan_add: NULL plan");
    if (p->finalized)
        return mt_set_error(MT_ERR_INVALID, "mt_plan_add: plan already finalised (adding '%s')",
                            name ? name : "(null)");
    if (!name || !name[0]) return mt_set_error(MT_ERR_INVALID, "mt_plan_add: empty entry name");
    size_t len = strlen(name);
    if (len > MT_PLAN_NAME_MAX - 1)
        return mt_set_error(MT_ERR_INVALID, "mt_plan_add: name '%.40s...' is %zu bytes (max %d)", name,
                            len, MT_PLAN_NAME_MAX - 1);
    if ((int)cat < 0 || cat >= MT_MEM_CATEGORY_COUNT)
        return mt_set_error(MT_ERR_INVALID, "mt_plan_add: '%s': bad category %d", name, (int)cat);
    if (first > last)
        return mt_set_error(MT_ERR_INVALID, "mt_plan_add: '%s': lifetime first %d > last %d", name,
                            first, last);
    if (bytes > SIZE_MAX - MT_PLAN_ALIGN)
        return mt_set_error(MT_ERR_INVALID, "mt_plan_add: '%s': size %zu too large", name, bytes);
    if (p->count == p->cap) {
        int ncap = p->cap ? p->cap * 2 : 64;
        mt_plan_entry *ne = realloc(p->entries, (size_t)ncap * sizeof(mt_plan_entry));
        if (!ne)
            return mt_set_error(MT_ERR_OOM, "mt_plan_add: out of memory growing to %d entries", ncap);
        p->entries = ne;
        p->cap = ncap;
    }
    mt_plan_entry *e = &p->entries[p->count];
    memset(e, 0, sizeof *e);
    memcpy(e->name, name, len + 1);
    e->category = cat;
    e->bytes = bytes;
    e->offset = 0;
    e->first = first;
    e->last = last;
    if (id) *id = p->count;
    p->count++;
    return MT_OK;
}

/* Placement order: larger aligned size first, then earlier add; a total order, so
 * the result does not depend on qsort's instability. */
typedef struct {
    size_t size; /* aligned bytes */
    int index;
} mt_plan_order;

static int mt_plan_cmp_order(const void *a, const void *b) {
    const mt_plan_order *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

typedef struct {
    size_t lo, hi; /* [lo, hi) occupied */
} mt_plan_span;

static int mt_plan_cmp_span(const void *a, const void *b) {
    const mt_plan_span *x = a, *y = b;
    if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
    return (x->hi > y->hi) - (x->hi < y->hi);
}

/* Greedy by size: for each entry, largest first, collect the memory spans of
 * already placed entries whose lifetimes overlap it, sorted by offset, and take the
 * lowest gap that fits. O(n^2 log n), fine for the few thousand entries of a plan. */
mt_status mt_plan_finalize(mt_plan *p) {
    if (!p) return mt_set_error(MT_ERR_INVALID, "mt_plan_finalize: NULL plan");
    if (p->finalized) return MT_OK;
    const int n = p->count;
    mt_plan_order *order = malloc((size_t)(n ? n : 1) * sizeof(mt_plan_order));
    int *placed = malloc((size_t)(n ? n : 1) * sizeof(int));
    mt_plan_span *spans = malloc((size_t)(n ? n : 1) * sizeof(mt_plan_span));
    if (!order || !placed || !spans) {
        free(order);
        free(placed);
        free(spans);
        return mt_set_error(MT_ERR_OOM, "mt_plan_finalize: out of memory for %d entries", n);
    }
    for (int i = 0; i < n; i++) {
        order[i].size = mt_plan_aligned(p->entries[i].bytes);
        order[i].index = i;
    }
    qsort(order, (size_t)n, sizeof(mt_plan_order), mt_plan_cmp_order);

    int nplaced = 0;
    size_t peak = 0;
    for (int oi = 0; oi < n; oi++) {
        mt_plan_entry *e = &p->entries[order[oi].index];
        const size_t size = order[oi].size;
        if (size == 0) { /* takes no space: offset 0, never collides */
            e->offset = 0;
            continue;
        }
        int ns = 0;
        for (int j = 0; j < nplaced; j++) {
            const mt_plan_entry *q = &p->entries[placed[j]];
            if (q->first <= e->last && e->first <= q->last) {
                spans[ns].lo = q->offset;
                spans[ns].hi = q->offset + mt_plan_aligned(q->bytes);
                ns++;
            }
        }
        qsort(spans, (size_t)ns, sizeof(mt_plan_span), mt_plan_cmp_span);
        size_t off = 0;
        for (int s = 0; s < ns; s++) {
            if (spans[s].lo >= off + size) break; /* gap [off, spans[s].lo) fits */
            if (spans[s].hi > off) off = spans[s].hi;
        }
        e->offset = off;
        placed[nplaced++] = order[oi].index;
        if (off + size > peak) peak = off + size;
    }
    free(order);
    free(placed);
    free(spans);
    p->peak = peak;
    p->finalized = 1;
    return MT_OK;
}

int mt_plan_count(const mt_plan *p) { return p ? p->count : 0; }

const mt_plan_entry *mt_plan_entry_get(const mt_plan *p, int i) {
    if (!p || i < 0 || i >= p->count) return NULL;
    return &p->entries[i];
}

int mt_plan_find(const mt_plan *p, const char *name) {
    if (!p || !name) return -1;
    for (int i = 0; i < p->count; i++)
        if (strcmp(p->entries[i].name, name) == 0) return i;
    return -1;
}

size_t mt_plan_peak(const mt_plan *p) { return (p && p->finalized) ? p->peak : 0; }

typedef struct {
    long long phase; /* 64-bit so last + 1 cannot overflow */
    long long delta; /* +bytes at first, -bytes at last + 1 */
} mt_plan_event;

static int mt_plan_cmp_event(const void *a, const void *b) {
    const mt_plan_event *x = a, *y = b;
    if (x->phase != y->phase) return x->phase < y->phase ? -1 : 1;
    return (x->delta > y->delta) - (x->delta < y->delta);
}

/* Sweep over lifetime boundaries to find the first phase with the largest total of
 * requested bytes live, then sum that phase's entries per category. Counts
 * requested (not aligned) bytes, so the breakdown reads as what the model needs. */
void mt_plan_live_by_category(const mt_plan *p, size_t out[MT_MEM_CATEGORY_COUNT], int *phase) {
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++) out[c] = 0;
    if (phase) *phase = 0;
    if (!p || p->count == 0) return;
    const int n = p->count;
    mt_plan_event *ev = malloc((size_t)n * 2 * sizeof(mt_plan_event));
    int best_phase = p->entries[0].first;
    if (ev) {
        for (int i = 0; i < n; i++) {
            ev[2 * i].phase = p->entries[i].first;
            ev[2 * i].delta = (long long)p->entries[i].bytes;
            ev[2 * i + 1].phase = (long long)p->entries[i].last + 1;
            ev[2 * i + 1].delta = -(long long)p->entries[i].bytes;
        }
        qsort(ev, (size_t)n * 2, sizeof(mt_plan_event), mt_plan_cmp_event);
        long long live = 0, best = -1;
        for (int k = 0; k < 2 * n;) {
            long long ph = ev[k].phase;
            while (k < 2 * n && ev[k].phase == ph) live += ev[k++].delta;
            if (live > best) {
                best = live;
                best_phase = (int)ph;
            }
        }
        free(ev);
    } else {
        /* Out of memory for the sweep: fall back to checking every start phase. */
        size_t best = 0;
        for (int i = 0; i < n; i++) {
            size_t live = 0;
            int ph = p->entries[i].first;
            for (int j = 0; j < n; j++)
                if (p->entries[j].first <= ph && ph <= p->entries[j].last) live += p->entries[j].bytes;
            if (live > best || i == 0) {
                best = live;
                best_phase = ph;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        const mt_plan_entry *e = &p->entries[i];
        if (e->first <= best_phase && best_phase <= e->last) out[e->category] += e->bytes;
    }
    if (phase) *phase = best_phase;
}

void mt_plan_total_by_category(const mt_plan *p, size_t out[MT_MEM_CATEGORY_COUNT]) {
    for (int c = 0; c < MT_MEM_CATEGORY_COUNT; c++) out[c] = 0;
    if (!p) return;
    for (int i = 0; i < p->count; i++) out[p->entries[i].category] += p->entries[i].bytes;
}

static void *mt_arena_host_alloc(size_t bytes) {
    /* aligned_alloc needs a size that is a multiple of the alignment; peaks are. */
    void *b = aligned_alloc(MT_PLAN_ALIGN, mt_plan_aligned(bytes));
    if (b) memset(b, 0, bytes);
    return b;
}

/* An empty plan (peak 0) still gets one MT_PLAN_ALIGN block so that base is a real
 * pointer; a->bytes is the peak either way. */
mt_status mt_arena_create(mt_arena *a, const mt_plan *p, void *(*alloc)(size_t), void (*release)(void *)) {
    if (!a) return mt_set_error(MT_ERR_INVALID, "mt_arena_create: NULL arena");
    memset(a, 0, sizeof *a);
    if (!p || !p->finalized) return mt_set_error(MT_ERR_INVALID, "mt_arena_create: plan not finalised");
    if ((alloc == NULL) != (release == NULL))
        return mt_set_error(MT_ERR_INVALID, "mt_arena_create: alloc and release must both be given or both NULL");
    const size_t bytes = p->peak;
    const size_t request = bytes ? bytes : MT_PLAN_ALIGN;
    void *base = alloc ? alloc(request) : mt_arena_host_alloc(request);
    if (!base)
        return mt_set_error(MT_ERR_OOM, "mt_arena_create: cannot allocate %zu bytes (%.3f GiB)", request,
                            (double)request / (1024.0 * 1024.0 * 1024.0));
    a->base = base;
    a->bytes = bytes;
    a->release = alloc ? release : free;
    return MT_OK;
}

void mt_arena_destroy(mt_arena *a) {
    if (!a) return;
    if (a->base && a->release) a->release(a->base);
    memset(a, 0, sizeof *a);
}

void *mt_arena_ptr(const mt_arena *a, const mt_plan *p, int id) {
    if (!a || !a->base || !p || !p->finalized || id < 0 || id >= p->count) return NULL;
    return (char *)a->base + p->entries[id].offset;
}
