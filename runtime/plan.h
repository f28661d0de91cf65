/* runtime/plan.h: the memory plan and the arena it sizes (every device buffer is an entry sized
 * before anything is allocated, so `meshtrain plan` and the estimator are exact).
 *
 * Every buffer of a training step is an entry with a name, a category, a size in
 * bytes and a lifetime [first, last] measured in step phases (integers chosen by the
 * caller, e.g. forward of layer l, loss, backward of layer l, optimizer). Finalising
 * the plan assigns each entry an offset so that two entries whose lifetimes overlap
 * never overlap in memory; the peak is the largest offset + size. The run then
 * allocates one arena of exactly the peak and hands out base + offset.
 *
 * Offsets come from greedy-by-size packing (largest entry first, lowest offset that
 * does not collide with an already placed entry of overlapping lifetime), as in
 * Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net Inference"
 * (2020), the strategy of TensorFlow Lite's arena planner. Offsets are aligned to
 * MT_PLAN_ALIGN bytes. The result is deterministic for a given sequence of adds.
 * Finalising n entries takes O(n log^2 n) time when the occupied memory stays in few
 * blocks, as in model plans (the placed entries are indexed by lifetime, see plan.c;
 * a placement steps over at most the spans of the entries overlapping it, as the
 * former scan did): 176k entries, 16000 layers, in under a second. */
#ifndef MT_RUNTIME_PLAN_H
#define MT_RUNTIME_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "runtime/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MT_PLAN_ALIGN 256
#define MT_PLAN_NAME_MAX 96

typedef enum mt_mem_category {
    MT_MEM_PARAMS = 0,      /* master weights and compute copies */
    MT_MEM_GRADS,           /* gradients and gradient accumulators */
    MT_MEM_OPTIMIZER,       /* AdamW moments (and sharded masters) */
    MT_MEM_ACTIVATIONS,     /* tensors saved by the forward for the backward */
    MT_MEM_SCRATCH,         /* per-op temporaries and recompute buffers */
    MT_MEM_LOSS_TILE,       /* one vocabulary tile of logits / dlogits */
    MT_MEM_COMM,            /* communication buffers */
    MT_MEM_WORKSPACE,       /* GEMM and library workspaces */
    MT_MEM_CATEGORY_COUNT
} mt_mem_category;

/* Lower-case name of a category ("params", "grads", ...). */
const char *mt_mem_category_name(mt_mem_category c);

/* What a buffer is, finer than its category; set by whoever adds the entry, so that
 * readers of a plan (train/estimate.c, train/api.c) never parse entry names. */
typedef enum mt_plan_kind {
    MT_PLAN_KIND_PARAMS = 0,     /* weights: masters, shards, layer windows */
    MT_PLAN_KIND_GRADS,          /* gradients, their windows and accumulators */
    MT_PLAN_KIND_OPTIMIZER,      /* AdamW moments */
    MT_PLAN_KIND_INPUT,          /* step inputs and constant tables (tokens, positions, RoPE) */
    MT_PLAN_KIND_SAVED,          /* activation saved by the forward for the backward (device) */
    MT_PLAN_KIND_OFFLOAD,        /* host pool copy of an offloaded activation */
    MT_PLAN_KIND_REMAT_SCRATCH,  /* one layer's worth of a non-kept tensor ("remat.fwd/bwd.*") */
    MT_PLAN_KIND_KV_CACHE,       /* incremental decoding's key / value cache */
    MT_PLAN_KIND_SCRATCH,        /* other per-op temporaries */
    MT_PLAN_KIND_LOSS_TILE,      /* one vocabulary tile of logits / dlogits */
    MT_PLAN_KIND_COMM,           /* communication buffers */
    MT_PLAN_KIND_WORKSPACE,      /* GEMM and library workspaces */
    MT_PLAN_KIND_COUNT
} mt_plan_kind;

/* The identity of an entry: layer -1 = not a per-layer buffer; tensor -1 = none,
 * else an mt_layer_tensor (models/remat.h: the one list of a decoder layer's saved
 * tensors and their names). */
typedef struct mt_plan_tag {
    int64_t layer;
    int tensor;
    mt_plan_kind kind;
} mt_plan_tag;

/* The tag mt_plan_add gives: no layer, no tensor, the kind matching cat
 * (activations: MT_PLAN_KIND_SAVED). */
mt_plan_tag mt_plan_tag_of_category(mt_mem_category cat);

typedef struct mt_plan_entry {
    char name[MT_PLAN_NAME_MAX];
    mt_mem_category category;
    mt_plan_tag tag;
    size_t bytes;   /* requested size */
    size_t offset;  /* assigned by mt_plan_finalize; multiple of MT_PLAN_ALIGN */
    int first;      /* first phase in which the buffer is live (inclusive) */
    int last;       /* last phase in which the buffer is live (inclusive) */
} mt_plan_entry;

typedef struct mt_plan mt_plan;

/* Create an empty plan. Returns MT_ERR_OOM on allocation failure. */
mt_status mt_plan_new(mt_plan **out);
void mt_plan_free(mt_plan *p);

/* Add an entry; *id receives its index (may be NULL). bytes may be 0 (the entry
 * then takes no space). Errors: MT_ERR_INVALID if first > last, the name is empty or
 * longer than MT_PLAN_NAME_MAX-1, or the plan is already finalised; MT_ERR_OOM. */
mt_status mt_plan_add(mt_plan *p, const char *name, mt_mem_category cat, size_t bytes,
                      int first, int last, int *id);

/* mt_plan_add with an explicit tag. Errors: those of mt_plan_add, and MT_ERR_INVALID
 * for a kind out of range. */
mt_status mt_plan_add_tagged(mt_plan *p, const char *name, mt_mem_category cat, mt_plan_tag tag, size_t bytes,
                             int first, int last, int *id);

/* Assign offsets. Idempotent. Errors: MT_ERR_OOM (the plan stays unfinalised);
 * MT_ERR_INVALID for a NULL plan or more than 2^28 entries. */
mt_status mt_plan_finalize(mt_plan *p);

/* Number of entries, and entry i (NULL if out of range). */
int mt_plan_count(const mt_plan *p);
const mt_plan_entry *mt_plan_entry_get(const mt_plan *p, int i);

/* Index of the entry called `name`, or -1. */
int mt_plan_find(const mt_plan *p, const char *name);

/* Peak bytes: max(offset + aligned size) over entries; the arena size. Requires a
 * finalised plan (0 otherwise). */
size_t mt_plan_peak(const mt_plan *p);

/* Live bytes per category at the phase where the total live bytes are largest
 * (the "peak by category" breakdown), out[MT_MEM_CATEGORY_COUNT]. *phase gets that
 * phase (may be NULL). The sum of out[] is <= mt_plan_peak (packing can leave gaps). */
void mt_plan_live_by_category(const mt_plan *p, size_t out[MT_MEM_CATEGORY_COUNT], int *phase);

/* Total bytes per category over all entries regardless of lifetime. */
void mt_plan_total_by_category(const mt_plan *p, size_t out[MT_MEM_CATEGORY_COUNT]);

/* An allocator for an arena: alloc sets *out to `bytes` (or returns a status with
 * its message set); release frees what alloc gave. ctx is passed through (a backend:
 * kernels/backend.h mt_backend_arena_create). */
typedef mt_status (*mt_arena_alloc_fn)(void *ctx, size_t bytes, void **out);
typedef void (*mt_arena_release_fn)(void *ctx, void *p);

/* One allocation sized by a finalised plan. */
typedef struct mt_arena {
    void *base;
    size_t bytes;
    mt_arena_release_fn release; /* NULL: host free() */
    void *ctx;
} mt_arena;

/* Allocate exactly mt_plan_peak(p) bytes with alloc(ctx, ...), or, when alloc and
 * release are NULL, aligned host memory (zero-filled). Errors: MT_ERR_INVALID if p is
 * not finalised or only one of alloc/release is given; MT_ERR_OOM naming the byte
 * count (or alloc's own status and message). */
mt_status mt_arena_create(mt_arena *a, const mt_plan *p, mt_arena_alloc_fn alloc, mt_arena_release_fn release,
                          void *ctx);
void mt_arena_destroy(mt_arena *a);

/* Pointer to entry `id` inside the arena, or NULL if id is out of range. */
void *mt_arena_ptr(const mt_arena *a, const mt_plan *p, int id);

#ifdef __cplusplus
}
#endif
#endif
