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

mt_plan_tag mt_plan_tag_of_category(mt_mem_category cat) {
    static const mt_plan_kind kinds[MT_MEM_CATEGORY_COUNT] = {
        MT_PLAN_KIND_PARAMS, MT_PLAN_KIND_GRADS, MT_PLAN_KIND_OPTIMIZER, MT_PLAN_KIND_SAVED,
        MT_PLAN_KIND_SCRATCH, MT_PLAN_KIND_LOSS_TILE, MT_PLAN_KIND_COMM, MT_PLAN_KIND_WORKSPACE};
    mt_plan_tag t = {-1, -1, MT_PLAN_KIND_SCRATCH};
    if ((int)cat >= 0 && cat < MT_MEM_CATEGORY_COUNT) t.kind = kinds[cat];
    return t;
}

mt_status mt_plan_add(mt_plan *p, const char *name, mt_mem_category cat, size_t bytes, int first,
                      int last, int *id) {
    return mt_plan_add_tagged(p, name, cat, mt_plan_tag_of_category(cat), bytes, first, last, id);
}

mt_status mt_plan_add_tagged(mt_plan *p, const char *name, mt_mem_category cat, mt_plan_tag tag, size_t bytes,
                             int first, int last, int *id) {
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
    if ((int)tag.kind < 0 || tag.kind >= MT_PLAN_KIND_COUNT)
        return mt_set_error(MT_ERR_INVALID, "mt_plan_add: '%s': bad kind %d", name, (int)tag.kind);
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
    e->tag = tag;
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

/* A union of occupied memory spans: disjoint, non-touching blocks sorted by lo (so
 * also by hi). Touching spans merge, so one block can stand for many entries. */
typedef struct {
    mt_plan_span *b;
    int n, cap;
} mt_plan_blocks;

/* Index of the first block with hi > x (n if none): blocks are sorted by hi. */
static int mt_plan_blocks_upper(const mt_plan_blocks *s, size_t x) {
    int lo = 0, hi = s->n;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (s->b[mid].hi > x) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Add [lo, hi) to the union, merging every block it overlaps or touches. 0, or -1
 * when out of memory (the set is unchanged then). */
static int mt_plan_blocks_add(mt_plan_blocks *s, size_t lo, size_t hi) {
    /* blocks [i, j) overlap or touch [lo, hi]: b.hi >= lo and b.lo <= hi */
    const int i = lo ? mt_plan_blocks_upper(s, lo - 1) : 0;
    int j = i;
    while (j < s->n && s->b[j].lo <= hi) j++;
    if (i == j) {
        if (s->n == s->cap) {
            const int ncap = s->cap ? s->cap * 2 : 4;
            mt_plan_span *nb = realloc(s->b, (size_t)ncap * sizeof(mt_plan_span));
            if (!nb) return -1;
            s->b = nb;
            s->cap = ncap;
        }
        memmove(&s->b[i + 1], &s->b[i], (size_t)(s->n - i) * sizeof(mt_plan_span));
        s->b[i].lo = lo;
        s->b[i].hi = hi;
        s->n++;
        return 0;
    }
    if (s->b[i].lo < lo) lo = s->b[i].lo;
    if (s->b[j - 1].hi > hi) hi = s->b[j - 1].hi;
    s->b[i].lo = lo;
    s->b[i].hi = hi;
    memmove(&s->b[i + 1], &s->b[j], (size_t)(s->n - j) * sizeof(mt_plan_span));
    s->n -= j - i - 1;
    return 0;
}

/* End of the block that [x, x + size) collides with, or 0 if it is free in s. */
static size_t mt_plan_blocks_collide(const mt_plan_blocks *s, size_t x, size_t size) {
    const int k = mt_plan_blocks_upper(s, x);
    return (k < s->n && s->b[k].lo < x + size) ? s->b[k].hi : 0;
}

/* The placed entries, indexed by lifetime: a segment tree over the distinct phases
 * (leaves 0..width-1 at nodes width..2*width-1, node v's children 2v and 2v+1). An
 * entry whose lifetime covers leaves [a, b] is added to `own` of the O(log) nodes of
 * the canonical cover of [a, b], and to `below` of those nodes and all their
 * ancestors. Two lifetimes overlap iff a node of one's cover is an ancestor-or-self
 * of a node of the other's, so the entries overlapping [c, d] are, over the cover
 * nodes v of [c, d], below(v) and own(w) of v's strict ancestors w: O(log) unions. */
typedef struct {
    mt_plan_blocks *own, *below;
    int *stamp; /* visit marks, one per node */
    int width;
    int clock;
} mt_plan_tree;

/* The canonical cover of leaves [a, b]: at most 2 log2(width) nodes into nodes[]. */
static int mt_plan_tree_cover(const mt_plan_tree *t, int a, int b, int *nodes) {
    int n = 0;
    for (int l = a + t->width, r = b + t->width + 1; l < r; l >>= 1, r >>= 1) {
        if (l & 1) nodes[n++] = l++;
        if (r & 1) nodes[n++] = --r;
    }
    return n;
}

/* Record a placed entry: memory [lo, hi), lifetime leaves [a, b]. 0, or -1 when out
 * of memory. Each node's `below` gets it once (the walks up stop at marked nodes). */
static int mt_plan_tree_add(mt_plan_tree *t, int a, int b, size_t lo, size_t hi) {
    int nodes[2 * 32]; /* width <= 2^29 (mt_plan_finalize): a cover has <= 58 nodes */
    const int nc = mt_plan_tree_cover(t, a, b, nodes);
    t->clock++;
    for (int k = 0; k < nc; k++) {
        if (mt_plan_blocks_add(&t->own[nodes[k]], lo, hi)) return -1;
        for (int w = nodes[k]; w >= 1 && t->stamp[w] != t->clock; w >>= 1) {
            t->stamp[w] = t->clock;
            if (mt_plan_blocks_add(&t->below[w], lo, hi)) return -1;
        }
    }
    return 0;
}

/* Lowest offset x >= 0 such that [x, x + size) meets no placed entry whose lifetime
 * overlaps leaves [a, b]. Every union that [x, x + size) collides with moves x to the
 * end of the colliding block (no lower x can be free: the block is occupied through
 * the lifetime); x is the answer once every union has been checked without a move. */
static size_t mt_plan_tree_lowest_fit(mt_plan_tree *t, int a, int b, size_t size) {
    int nodes[2 * 32];
    const mt_plan_blocks *sets[4 * 32]; /* <= 58 cover nodes + 58 distinct ancestors */
    int ns = 0;
    const int nc = mt_plan_tree_cover(t, a, b, nodes);
    t->clock++;
    for (int k = 0; k < nc; k++) {
        if (t->below[nodes[k]].n) sets[ns++] = &t->below[nodes[k]];
        for (int w = nodes[k] >> 1; w >= 1 && t->stamp[w] != t->clock; w >>= 1) {
            t->stamp[w] = t->clock;
            if (t->own[w].n) sets[ns++] = &t->own[w];
        }
    }
    size_t x = 0;
    for (int k = 0, clean = 0; clean < ns;) {
        const size_t end = mt_plan_blocks_collide(sets[k], x, size);
        if (end) {
            x = end;
            clean = 0;
        } else {
            clean++;
            k = (k + 1) % ns;
        }
    }
    return x;
}

static int mt_plan_cmp_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Leaf of phase `ph` among the sorted distinct phases[0..np). */
static int mt_plan_leaf(const int *phases, int np, int ph) {
    int lo = 0, hi = np - 1;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (phases[mid] < ph) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Place the entries in `order` (phases[0..nd): the sorted distinct phases): offsets
 * into the entries, the peak into *peak. 0, or -1 when out of memory. */
static int mt_plan_place(mt_plan *p, const mt_plan_order *order, const int *phases, int nd, size_t *peak) {
    mt_plan_tree t = {0};
    t.width = 1;
    while (t.width < nd) t.width *= 2;
    t.own = calloc(2 * (size_t)t.width, sizeof(mt_plan_blocks));
    t.below = calloc(2 * (size_t)t.width, sizeof(mt_plan_blocks));
    t.stamp = calloc(2 * (size_t)t.width, sizeof(int));
    int rc = (t.own && t.below && t.stamp) ? 0 : -1;
    *peak = 0;
    for (int oi = 0; oi < p->count && rc == 0; oi++) {
        mt_plan_entry *e = &p->entries[order[oi].index];
        const size_t size = order[oi].size;
        if (size == 0) { /* takes no space: offset 0, never collides */
            e->offset = 0;
            continue;
        }
        const int a = mt_plan_leaf(phases, nd, e->first), b = mt_plan_leaf(phases, nd, e->last);
        e->offset = mt_plan_tree_lowest_fit(&t, a, b, size);
        rc = mt_plan_tree_add(&t, a, b, e->offset, e->offset + size);
        if (e->offset + size > *peak) *peak = e->offset + size;
    }
    for (size_t v = 0; v < 2 * (size_t)t.width; v++) {
        if (t.own) free(t.own[v].b);
        if (t.below) free(t.below[v].b);
    }
    free(t.own);
    free(t.below);
    free(t.stamp);
    return rc;
}

/* Greedy by size: for each entry, largest first, the lowest offset whose span is free
 * of every already placed entry of overlapping lifetime. The placed entries are kept
 * as unions of memory spans in a segment tree over the lifetimes (mt_plan_tree), so a
 * placement costs O(log^2 n) per block of those unions that it steps over (about 11
 * per entry for the llama plans of 1000 to 64000 layers), where collecting and
 * sorting the span of every overlapping entry cost O(n log n) per placement and was
 * quadratic overall for deep models, whose saved activations all overlap. Both give
 * the lowest free offset, hence the same offsets. */
mt_status mt_plan_finalize(mt_plan *p) {
    if (!p) return mt_set_error(MT_ERR_INVALID, "mt_plan_finalize: NULL plan");
    if (p->finalized) return MT_OK;
    const int n = p->count;
    if (n > (1 << 28)) /* 2n phases, 4n tree nodes: int indices */
        return mt_set_error(MT_ERR_INVALID, "mt_plan_finalize: %d entries (max %d)", n, 1 << 28);
    const size_t n1 = (size_t)(n ? n : 1);
    mt_plan_order *order = malloc(n1 * sizeof(mt_plan_order));
    int *phases = malloc(2 * n1 * sizeof(int));
    size_t peak = 0;
    int rc = -1;
    if (order && phases) {
        int nd = 0;
        for (int i = 0; i < n; i++) {
            order[i].size = mt_plan_aligned(p->entries[i].bytes);
            order[i].index = i;
            phases[2 * i] = p->entries[i].first;
            phases[2 * i + 1] = p->entries[i].last;
        }
        qsort(order, (size_t)n, sizeof(mt_plan_order), mt_plan_cmp_order);
        qsort(phases, 2 * (size_t)n, sizeof(int), mt_plan_cmp_int);
        for (int i = 0; i < 2 * n; i++)
            if (nd == 0 || phases[nd - 1] != phases[i]) phases[nd++] = phases[i];
        rc = mt_plan_place(p, order, phases, nd, &peak);
    }
    free(order);
    free(phases);
    if (rc)
        return mt_set_error(MT_ERR_OOM, "mt_plan_finalize: out of memory for %d entries", n);
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
mt_status mt_arena_create(mt_arena *a, const mt_plan *p, mt_arena_alloc_fn alloc, mt_arena_release_fn release,
                          void *ctx) {
    if (!a) return mt_set_error(MT_ERR_INVALID, "mt_arena_create: NULL arena");
    memset(a, 0, sizeof *a);
    if (!p || !p->finalized) return mt_set_error(MT_ERR_INVALID, "mt_arena_create: plan not finalised");
    if ((alloc == NULL) != (release == NULL))
        return mt_set_error(MT_ERR_INVALID, "mt_arena_create: alloc and release must both be given or both NULL");
    const size_t bytes = p->peak;
    const size_t request = bytes ? bytes : MT_PLAN_ALIGN;
    void *base = NULL;
    if (alloc) {
        const mt_status st = alloc(ctx, request, &base);
        if (st != MT_OK || !base)
            return mt_set_error(st != MT_OK ? st : MT_ERR_OOM, "mt_arena_create: cannot allocate %zu bytes (%.3f GiB): %s",
                                request, (double)request / (1024.0 * 1024.0 * 1024.0), mt_last_error());
    } else {
        base = mt_arena_host_alloc(request);
        if (!base)
            return mt_set_error(MT_ERR_OOM, "mt_arena_create: cannot allocate %zu bytes (%.3f GiB)", request,
                                (double)request / (1024.0 * 1024.0 * 1024.0));
    }
    a->base = base;
    a->bytes = bytes;
    a->release = release;
    a->ctx = ctx;
    return MT_OK;
}

void mt_arena_destroy(mt_arena *a) {
    if (!a) return;
    if (a->base) {
        if (a->release) a->release(a->ctx, a->base);
        else free(a->base);
    }
    memset(a, 0, sizeof *a);
}

void *mt_arena_ptr(const mt_arena *a, const mt_plan *p, int id) {
    if (!a || !a->base || !p || !p->finalized || id < 0 || id >= p->count) return NULL;
    return (char *)a->base + p->entries[id].offset;
}
