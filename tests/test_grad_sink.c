/* tests/test_grad_sink.c: the model's gradient windows, a decoder layer's gradient
 * handed over one parameter at a time (models/model.h mt_model_set_grad_sink) on the
 * CPU backend.
 *
 * Two models of the same config and parameters, one with the full "grads" buffer and
 * one with a sink that copies every window it is handed into a host array: after one
 * backward (mt_model_forward_backward, or mt_model_hidden + mt_model_backward_hidden)
 * the sink has seen every element exactly once, in the documented ranges and order
 * (tail, layers L-1 .. 0 one parameter per call, embedding; with num_vocab_chunks auto
 * the chunks no larger than the largest layer parameter), and its values are bitwise
 * the full buffer's
 * (the same ops on the same values write them: tolerance 0). The sink model's arena is
 * poisoned with NaN first and a second backward on another batch must again equal a
 * full-buffer backward from zero, so every window is zeroed before it is written.
 * Llama (untied head), Gemma (tied embedding: the loss and the embedding backward both
 * write it), Gemma 3 (QK norms, post norms, soft-caps), kept and under remat full, and
 * Gemma 4 (layers of three sizes: global head dim, KV-sharing layers without k/v and
 * with a double-wide MLP; the per-layer-input globals in a fourth window handed over
 * between layer 0 and the embedding; with vocabulary chunks their table a chunk at a
 * time from a fifth). With the vocabulary in chunks the unembedding's and the
 * embedding's gradients come a chunk at a time; a tied embedding's rows then come
 * twice (the loss's share, then the lookup's with add = 1), each share bitwise an
 * untied twin's lm_head and embedding gradients.
 * Also: the plan entries (no "grads", the three windows with their sizes and phases),
 * mt_model_grads NULL, and a sink error stopping the backward.
 * Asynchronous sink (mt_model_set_grad_sink_wait): the sink only notes each window and
 * copies it when the model waits for it, so a window the model zeroed or wrote before
 * waiting would show in the copy; the results must again be bitwise the full buffer's,
 * nothing may be left unwaited when a backward returns, the layer windows must
 * alternate (two parameters in flight at once: the overlap) and the plan must hold the
 * second layer window. A window that shares memory with one in flight (the planner
 * reusing a dead entry's bytes) shows as a window handed over twice unwaited. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "models/remat.h"
#include "runtime/plan.h"
#include "runtime/rng.h"

#define MAX_CALLS 1024

typedef struct collector {
    float *got;      /* [numel] host copy of what the sink received (add = 0) */
    float *got2;     /* [numel] the second shares (add = 1: a tied embedding in chunks) */
    int *seen;       /* [numel] times each element was handed over */
    int64_t off[MAX_CALLS]; /* offsets of the calls, in order */
    int64_t num[MAX_CALLS];
    int add[MAX_CALLS];
    int calls;
    mt_status fail;  /* returned by the sink when not MT_OK */
    int fail_at;     /* > 0: the sink fails its call number fail_at (counting from 1) of a backward */
    /* asynchronous: windows handed over and not yet waited for */
    float *pend_w[8];
    int64_t pend_off[8], pend_num[8];
    int pend_add[8];
    int pending, max_pending, waits;
} collector;

/* A second share (add) must come after the first, once. */
static void copy_in(collector *c, int64_t offset, int64_t numel, const float *grad, int add) {
    memcpy((add ? c->got2 : c->got) + offset, grad, (size_t)numel * sizeof(float));
    for (int64_t i = 0; i < numel; i++) {
        cr_assert_eq(c->seen[offset + i], add, "element %lld: share %d handed over after %d", (long long)(offset + i),
                     add + 1, c->seen[offset + i]);
        c->seen[offset + i]++;
    }
}

static mt_status sink(void *ctx, int64_t offset, int64_t numel, float *grad, int add) {
    collector *c = ctx;
    if (c->fail != MT_OK || c->fail_at == c->calls + 1) return mt_set_error(MT_ERR_RUNTIME, "test sink refuses");
    cr_assert_lt(c->calls, MAX_CALLS);
    c->off[c->calls] = offset;
    c->add[c->calls] = add;
    c->num[c->calls++] = numel;
    copy_in(c, offset, numel, grad, add);
    return MT_OK;
}

/* The asynchronous sink: note the window; async_wait reads it. */
static mt_status async_sink(void *ctx, int64_t offset, int64_t numel, float *grad, int add) {
    collector *c = ctx;
    if (c->fail != MT_OK || c->fail_at == c->calls + 1) return mt_set_error(MT_ERR_RUNTIME, "test sink refuses");
    cr_assert_lt(c->calls, MAX_CALLS);
    cr_assert_lt(c->pending, 8);
    for (int i = 0; i < c->pending; i++) cr_assert_neq(c->pend_w[i], grad, "window handed over twice unwaited");
    c->off[c->calls] = offset;
    c->add[c->calls] = add;
    c->num[c->calls++] = numel;
    c->pend_w[c->pending] = grad;
    c->pend_add[c->pending] = add;
    c->pend_off[c->pending] = offset;
    c->pend_num[c->pending++] = numel;
    if (c->pending > c->max_pending) c->max_pending = c->pending;
    return MT_OK;
}

static mt_status async_wait(void *ctx, const float *w) {
    collector *c = ctx;
    c->waits++;
    int k = 0;
    for (int i = 0; i < c->pending; i++) {
        if (!w || c->pend_w[i] == w) {
            copy_in(c, c->pend_off[i], c->pend_num[i], c->pend_w[i], c->pend_add[i]);
        } else {
            c->pend_w[k] = c->pend_w[i];
            c->pend_add[k] = c->pend_add[i];
            c->pend_off[k] = c->pend_off[i];
            c->pend_num[k++] = c->pend_num[i];
        }
    }
    c->pending = k;
    return MT_OK;
}

typedef struct fixture {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
} fixture;

/* mt_model_set_grad_sink_shares of the sink models (1, the default: the sink adds a
 * second share exactly; 0: a tied embedding keeps one whole gradient window). */
static int g_shares = 1;

/* chunks: the layout's num_vocab_chunks (0 = auto). */
static void fx_init(fixture *f, const mt_model_config *c, int remat_full, collector *col, int async, int64_t chunks) {
    memset(f, 0, sizeof *f);
    mt_backend *be = mt_cpu_backend();
    const mt_model_layout lay = {.vocab_chunks = chunks};
    cr_assert_eq(mt_model_create(&f->m, c, be, 2, 6, 3, &lay), MT_OK, "%s", mt_last_error());
    if (remat_full) {
        mt_remat_policy p;
        cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_FULL, NULL, &p), MT_OK);
        cr_assert_eq(mt_model_set_remat(f->m, &p), MT_OK, "%s", mt_last_error());
    }
    if (col)
        cr_assert_eq(mt_model_set_grad_sink(f->m, async ? async_sink : sink, col), MT_OK, "%s", mt_last_error());
    if (async) cr_assert_eq(mt_model_set_grad_sink_wait(f->m, async_wait), MT_OK, "%s", mt_last_error());
    if (col && !g_shares) cr_assert_eq(mt_model_set_grad_sink_shares(f->m, 0), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_new(&f->plan), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(f->m, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_finalize(f->plan), MT_OK);
    cr_assert_eq(mt_arena_create(&f->arena, f->plan, NULL, NULL, NULL), MT_OK, "%s", mt_last_error());
    if (col) { /* every byte NaN: a window read before it is zeroed poisons the result */
        float *p = f->arena.base;
        for (size_t i = 0; i < f->arena.bytes / sizeof(float); i++) p[i] = NAN;
    }
    cr_assert_eq(mt_model_bind(f->m, &f->arena, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_init_params(f->m, 11), MT_OK);
    /* off the linear regime: matrices x 8 (as tests/test_model.c) */
    float *w = mt_model_params(f->m);
    for (int i = 0; i < mt_model_param_count(f->m); i++) {
        const mt_param_info *pi = mt_model_param(f->m, i);
        for (int64_t j = 0; j < pi->numel; j++) w[pi->offset + j] *= pi->ndim == 2 ? 8.0f : 1.0f;
    }
}

static void fx_free(fixture *f) {
    mt_arena_destroy(&f->arena);
    mt_plan_free(f->plan);
    mt_model_free(f->m);
}

static void batch(const mt_model_config *c, uint64_t seed, int32_t *tok, int32_t *lab) {
    for (int n = 0; n < 12; n++) {
        uint32_t r[4];
        mt_rng_u32x4(seed, 1, (uint64_t)n, r);
        tok[n] = (int32_t)(r[0] % (uint32_t)c->vocab_size);
        lab[n] = n % 5 == 1 ? MT_IGNORE_LABEL : (int32_t)(r[1] % (uint32_t)c->vocab_size);
    }
}

static void reset(collector *col, int64_t numel) {
    for (int64_t i = 0; i < numel; i++) {
        col->got[i] = col->got2[i] = NAN;
        col->seen[i] = 0;
    }
    col->calls = 0;
}

/* Offset of layer l's first parameter (input_layernorm). */
static int64_t layer_off(const mt_model *m, int64_t l) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
    return mt_model_param(m, mt_model_param_find(m, name))->offset;
}

/* Floats of the per-layer-input globals (gemma4: between the embedding and layer 0). */
static int64_t ple_numel(const mt_model *m) {
    const mt_param_info *e0 = mt_model_param(m, mt_model_param_find(m, "model.embed_tokens.weight"));
    return layer_off(m, 0) - e0->numel;
}

/* The model's vocabulary chunks (models/model.h mt_model_vocab_tiling). */
static int64_t vocab_chunks(const mt_model *m) {
    int64_t tiles, chunks;
    mt_model_vocab_tiling(m, &tiles, &chunks);
    return chunks;
}

/* Parameters of layer l: [layer_off(l), the next layer's or model.norm's offset). */
static int64_t layer_end(const mt_model *m, int64_t l) {
    return l + 1 < mt_model_get_config(m)->num_decoder_layers
               ? layer_off(m, l + 1)
               : mt_model_param(m, mt_model_param_find(m, "model.norm.weight"))->offset;
}

/* Every element once (a tied embedding in C > 1 vocabulary chunks after a loss: twice,
 * the loss's share first, add = 0, the lookup's second, add = 1); calls: (C > 1) the
 * unembedding's C chunks (without a loss, loss = 0: an untied lm_head's zero gradient,
 * none for a tied one), then the tail, layers L-1 .. 0 one call per parameter (each of
 * the layer's parameters once, whole, in the order the backward completes them), (gemma4)
 * the per-layer-input globals (with their table in Cp > 1 chunks: each chunk of the
 * table, then the rest), the embedding (C > 1: its C chunks), with the layout's ranges.
 * Chunk k of C is rows [k V / C, (k + 1) V / C) (parallel/vocab_loss.h). */
static void check_calls(const collector *col, const mt_model *m, const char *what, int loss) {
    const mt_model_config *c = mt_model_get_config(m);
    const int64_t L = c->num_decoder_layers, numel = mt_model_numel(m), pn = ple_numel(m), D = c->emb_dim;
    const int64_t Cp = pn > 0 ? mt_model_per_layer_input_chunks(m) : 1, V = c->vocab_size, C = vocab_chunks(m);
    const int64_t LP = L * c->per_layer_input_dim, tc = Cp > 1 ? Cp : 0; /* the table's own calls */
    const int tied = c->logits_via_embedding, vg = C > 1 && (!tied || g_shares), twice = tied && vg && loss;
    const int64_t uc = vg && (loss || !tied) ? C : 0, ec = vg ? C : 1; /* unembedding's, embedding's calls */
    const int fn = mt_model_param_find(m, "model.norm.weight"), emb = mt_model_param_find(m, "model.embed_tokens.weight");
    const int64_t e = mt_model_param(m, emb)->numel; /* the globals follow the embedding at 0 */
    int64_t lp = 0; /* the layers' parameters: one call each */
    for (int i = 0; i < mt_model_param_count(m); i++) {
        const int64_t o = mt_model_param(m, i)->offset;
        lp += o >= layer_off(m, 0) && o < layer_end(m, L - 1);
    }
    for (int64_t i = 0; i < numel; i++)
        cr_assert_eq(col->seen[i], 1 + (twice && i < e), "%s: element %lld handed %d times", what, (long long)i,
                     col->seen[i]);
    cr_assert_eq(col->calls, uc + 1 + lp + tc + (pn > 0) + ec, "%s: %d sink calls", what, col->calls);
    const int64_t u0 = tied ? 0 : mt_model_param(m, mt_model_param_find(m, "lm_head.weight"))->offset;
    for (int64_t k = 0; k < uc; k++) {
        const int64_t a = k * V / C, b = (k + 1) * V / C;
        cr_assert(col->off[k] == u0 + a * D && col->num[k] == (b - a) * D && col->add[k] == 0,
                  "%s: call %lld is not unembedding chunk %lld", what, (long long)k, (long long)k);
    }
    cr_assert_eq(col->off[uc], mt_model_param(m, fn)->offset, "%s: call %lld is not the tail", what, (long long)uc);
    cr_assert_eq(col->num[uc], (vg && !tied ? u0 : numel) - col->off[uc], "%s: the tail's size", what);
    int64_t k = uc + 1;
    for (int64_t l = L - 1; l >= 0; l--) { /* the calls of layer l: its parameters, each once and whole */
        const int64_t lo = layer_off(m, l), hi = layer_end(m, l);
        int64_t nl = 0;
        for (int i = 0; i < mt_model_param_count(m); i++)
            nl += mt_model_param(m, i)->offset >= lo && mt_model_param(m, i)->offset < hi;
        for (int i = 0; i < mt_model_param_count(m); i++) {
            const mt_param_info *pi = mt_model_param(m, i);
            if (pi->offset < lo || pi->offset >= hi) continue;
            int64_t hits = 0;
            for (int64_t j = k; j < k + nl; j++)
                hits += col->off[j] == pi->offset && col->num[j] == pi->numel && col->add[j] == 0;
            cr_assert_eq(hits, 1, "%s: %s handed over %lld times whole", what, pi->name, (long long)hits);
        }
        for (int64_t j = k; j < k + nl; j++)
            cr_assert(col->off[j] >= lo && col->off[j] + col->num[j] <= hi, "%s: call %lld is not in layer %lld", what,
                      (long long)j, (long long)l);
        k += nl;
    }
    const int64_t t0 = k;
    for (int64_t k = 0; k < tc; k++) { /* table chunk k: rows [k V / Cp, (k + 1) V / Cp) */
        const int64_t a = k * V / Cp, b = (k + 1) * V / Cp;
        cr_assert_eq(col->off[t0 + k], e + a * LP, "%s: call %lld is not table chunk %lld", what,
                     (long long)(t0 + k), (long long)k);
        cr_assert_eq(col->num[t0 + k], (b - a) * LP, "%s: table chunk %lld of %lld floats", what, (long long)k,
                     (long long)col->num[t0 + k]);
    }
    if (pn > 0) {
        cr_assert_eq(col->off[t0 + tc], e + (tc ? V * LP : 0), "%s: the globals' window", what);
        cr_assert_eq(col->num[t0 + tc], pn - (tc ? V * LP : 0));
    }
    for (int64_t k = 0; k < ec; k++) {
        const int64_t a = k * V / ec, b = (k + 1) * V / ec, j = t0 + tc + (pn > 0) + k;
        cr_assert(col->off[j] == a * D && col->num[j] == (b - a) * D && col->add[j] == twice,
                  "%s: call %lld is not embedding chunk %lld of %lld (offset %lld, %lld floats, add %d)", what,
                  (long long)j, (long long)k, (long long)ec, (long long)col->off[j], (long long)col->num[j],
                  col->add[j]);
    }
}

/* chunks: num_vocab_chunks of both models (0 = auto). */
static void check_model(const mt_model_config *c, int remat_full, int async, int64_t chunks, const char *what) {
    fixture a, b;
    collector col = {0};
    fx_init(&b, c, remat_full, &col, async, chunks);
    /* auto (chunks 0): with a sink, the fewest chunks no larger than the largest layer
     * parameter (the layer gradient window), ceil(V D / weight) (models/model.h); the
     * full-buffer model (no windows: auto is 1 there) is taken in the same chunks */
    int64_t weight = 0;
    for (int i = 0; i < mt_model_param_count(b.m); i++) {
        const mt_param_info *pi = mt_model_param(b.m, i);
        if (pi->offset >= layer_off(b.m, 0) && pi->offset < layer_end(b.m, c->num_decoder_layers - 1) &&
            pi->numel > weight)
            weight = pi->numel;
    }
    if (chunks == 0) {
        const int64_t want = ((int64_t)c->vocab_size * c->emb_dim + weight - 1) / weight;
        cr_assert_eq(vocab_chunks(b.m), want < c->vocab_size ? want : c->vocab_size, "%s: auto gave %lld chunks", what,
                     (long long)vocab_chunks(b.m));
    }
    fx_init(&a, c, remat_full, NULL, 0, vocab_chunks(b.m));
    const int64_t numel = mt_model_numel(a.m), L = c->num_decoder_layers, N = 12, D = c->emb_dim;
    col.got = malloc((size_t)numel * sizeof(float));
    col.got2 = malloc((size_t)numel * sizeof(float));
    col.seen = malloc((size_t)numel * sizeof(int));
    cr_assert_null(mt_model_grads(b.m), "%s: a full gradient buffer with a sink", what);
    const int64_t C = vocab_chunks(b.m), V = c->vocab_size, E = (int64_t)c->vocab_size * D;
    cr_assert_eq(vocab_chunks(a.m), C, "%s: the full-buffer model in other chunks", what);
    /* A tied embedding in chunks: its rows come in two shares (the loss's, the lookup's)
     * whose sum is the full buffer's in another order; each share is checked bitwise
     * against an untied twin (the same parameters, lm_head = the embedding) with a sink:
     * the loss's share its lm_head gradient, the lookup's its embedding gradient. */
    const int vg = C > 1 && (!c->logits_via_embedding || g_shares); /* the vocabulary's gradient in chunks */
    const int twin = c->logits_via_embedding && vg;
    fixture t;
    collector colt = {0};
    if (twin) {
        mt_model_config ct = *c;
        ct.logits_via_embedding = 0;
        fx_init(&t, &ct, remat_full, &colt, async, vocab_chunks(b.m));
        cr_assert_eq(mt_model_numel(t.m), numel + E);
        cr_assert_eq(vocab_chunks(t.m), C);
        float *wt = mt_model_params(t.m);
        memcpy(wt, mt_model_params(a.m), (size_t)numel * sizeof(float)); /* lm_head comes last */
        memcpy(wt + numel, mt_model_params(a.m), (size_t)E * sizeof(float));
        colt.got = malloc((size_t)(numel + E) * sizeof(float));
        colt.got2 = malloc((size_t)(numel + E) * sizeof(float));
        colt.seen = malloc((size_t)(numel + E) * sizeof(int));
    }

    /* plan: no "grads"; the windows with their sizes and lifetimes (models/model.h) */
    const mt_param_info *e0 = mt_model_param(a.m, mt_model_param_find(a.m, "model.embed_tokens.weight"));
    const mt_param_info *fnp = mt_model_param(a.m, mt_model_param_find(a.m, "model.norm.weight"));
    const int64_t pn = ple_numel(a.m), Cp = pn > 0 ? mt_model_per_layer_input_chunks(b.m) : 1;
    const int64_t LP = L * c->per_layer_input_dim, table = Cp > 1 ? c->vocab_size * LP : 0;
    int found = 0;
    for (int i = 0; i < mt_plan_count(b.plan); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(b.plan, i);
        cr_assert_str_neq(e->name, "grads", "%s: the full buffer is still planned", what);
        if (strcmp(e->name, "grads.window.layer") == 0 || strcmp(e->name, "grads.window.layer.overlap") == 0) {
            cr_expect_eq(e->bytes, (size_t)weight * 4, "%s: a layer gradient window of %zu bytes", what, e->bytes);
            cr_expect(e->first == L + 2 && e->last == 2 * L + 1, "%s: layer window [%d, %d]", what, e->first, e->last);
            found++;
        } else if (strcmp(e->name, "grads.window.tail") == 0) { /* model.norm (+ lm_head unless chunked) */
            cr_expect_eq(e->bytes, (size_t)(numel - fnp->offset - (vg && !c->logits_via_embedding ? E : 0)) * 4);
            cr_expect(e->first == L + 1 && e->last == L + 1);
            found++;
        } else if (strcmp(e->name, "grads.window.vocab.lm_head") == 0 ||
                   strcmp(e->name, "grads.window.vocab.embedding") == 0) { /* one chunk of rows, its phase */
            const int loss = strcmp(e->name, "grads.window.vocab.lm_head") == 0;
            cr_expect_eq(e->bytes, (size_t)((V + C - 1) / C * D) * 4, "%s: %s", what, e->name);
            cr_expect(e->first == (loss ? L + 1 : 2 * L + 2) && e->last == e->first, "%s: %s [%d, %d]", what,
                      e->name, e->first, e->last);
            cr_expect(vg, "%s: %s without the vocabulary's gradient in chunks", what, e->name);
            found++;
        } else if (strcmp(e->name, "grads.window.embedding") == 0) { /* whole: without chunks only */
            cr_expect(!vg, "%s: a whole embedding gradient window in %lld chunks", what, (long long)C);
            cr_expect_eq(e->bytes, (size_t)e0->numel * 4);
            cr_expect_eq(e->first, c->logits_via_embedding ? L + 1 : 2 * L + 2, "%s: embedding window from %d", what,
                         e->first);
            cr_expect_eq(e->last, 2 * L + 2);
            found++;
        } else if (strcmp(e->name, "grads.window.per_layer_inputs") == 0) { /* without the table when chunked */
            cr_expect_eq(e->bytes, (size_t)(pn - table) * 4);
            cr_expect(e->first == 2 * L + 2 && e->last == 2 * L + 2, "%s: globals' window [%d, %d]", what, e->first,
                      e->last);
            found++;
        } else if (strcmp(e->name, "grads.window.vocab.per_layer_embedding") == 0) { /* one chunk of the table */
            cr_expect_eq(e->bytes, (size_t)((c->vocab_size + Cp - 1) / Cp * LP) * 4);
            cr_expect(e->first == 2 * L + 2 && e->last == 2 * L + 2, "%s: table window [%d, %d]", what, e->first,
                      e->last);
            found++;
        }
        if (e->category == MT_MEM_GRADS) cr_expect_lt(e->bytes, (size_t)numel * 4);
    }
    cr_assert_eq(found, 3 + async + (pn > 0) + (Cp > 1) + vg, "%s: %d of the %d windows planned", what, found,
                 3 + async + (pn > 0) + (Cp > 1) + vg);
    cr_assert_lt(mt_plan_peak(b.plan), mt_plan_peak(a.plan), "%s: windows do not lower the peak", what);

    int32_t tok[12], lab[12];
    float *h = malloc((size_t)(N * D) * sizeof(float)), *dh = malloc((size_t)(N * D) * sizeof(float));
    for (int k = 0; k < 3; k++) { /* batch 1, batch 2 (windows re-zeroed), then backward_hidden */
        batch(c, 40 + (uint64_t)k, tok, lab);
        reset(&col, numel);
        if (twin) reset(&colt, numel + E);
        memset(mt_model_grads(a.m), 0, (size_t)numel * sizeof(float));
        if (k < 2) {
            double la, lb, lt;
            int64_t ca, cb, ct;
            cr_assert_eq(mt_model_forward_backward(a.m, tok, lab, 0.1f, &la, &ca), MT_OK, "%s", mt_last_error());
            cr_assert_eq(mt_model_forward_backward(b.m, tok, lab, 0.1f, &lb, &cb), MT_OK, "%s", mt_last_error());
            cr_assert(la == lb && ca == cb, "%s: loss %.17g vs %.17g", what, la, lb);
            if (twin) {
                cr_assert_eq(mt_model_forward_backward(t.m, tok, lab, 0.1f, &lt, &ct), MT_OK, "%s", mt_last_error());
                cr_assert(lt == la && ct == ca, "%s: the untied twin's loss %.17g vs %.17g", what, lt, la);
            }
        } else {
            cr_assert_eq(mt_model_hidden(a.m, tok, h), MT_OK, "%s", mt_last_error());
            cr_assert_eq(mt_model_hidden(b.m, tok, h), MT_OK, "%s", mt_last_error());
            mt_rng_fill_normal(dh, (size_t)(N * D), 0.5f, 3, 0);
            cr_assert_eq(mt_model_backward_hidden(a.m, dh), MT_OK, "%s", mt_last_error());
            cr_assert_eq(mt_model_backward_hidden(b.m, dh), MT_OK, "%s", mt_last_error());
            if (twin) {
                cr_assert_eq(mt_model_hidden(t.m, tok, h), MT_OK, "%s", mt_last_error());
                cr_assert_eq(mt_model_backward_hidden(t.m, dh), MT_OK, "%s", mt_last_error());
            }
        }
        /* backward_hidden has no loss: no loss's shares (check_calls), an untied lm_head's
         * zero gradient handed over all the same */
        check_calls(&col, b.m, what, k < 2);
        if (twin) check_calls(&colt, t.m, what, k < 2);
        cr_assert_eq(col.pending, 0, "%s pass %d: %d windows unwaited after the backward", what, k, col.pending);
        if (async) /* layer l - 1 handed over while layer l is in flight */
            cr_assert_geq(col.max_pending, 2, "%s pass %d: at most %d windows in flight", what, k, col.max_pending);
        const float *g = mt_model_grads(a.m);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < numel; i++) {
            nonzero += g[i] != 0.0f;
            if (twin && i < E) { /* the two shares against the twin's lm_head and embedding gradients */
                const float *lo = k < 2 ? &col.got[i] : NULL, *hi = k < 2 ? &col.got2[i] : &col.got[i];
                if (lo)
                    cr_assert(memcmp(lo, &colt.got[numel + i], sizeof(float)) == 0,
                              "%s pass %d: embedding element %lld: the loss's share %.9g, the twin's lm_head %.9g",
                              what, k, (long long)i, *lo, colt.got[numel + i]);
                cr_assert(memcmp(hi, &colt.got[i], sizeof(float)) == 0,
                          "%s pass %d: embedding element %lld: the lookup's share %.9g, the twin's %.9g", what, k,
                          (long long)i, *hi, colt.got[i]);
                if (k == 2) /* no loss: one share, the full buffer's exactly */
                    cr_assert(memcmp(&g[i], hi, sizeof(float)) == 0, "%s pass %d: element %lld", what, k,
                              (long long)i);
                continue;
            }
            cr_assert(memcmp(&g[i], &col.got[i], sizeof(float)) == 0, "%s pass %d: element %lld: sink %.9g, full %.9g",
                      what, k, (long long)i, col.got[i], g[i]);
            if (twin) /* the twin's other gradients: bitwise too */
                cr_assert(memcmp(&g[i], &colt.got[i], sizeof(float)) == 0, "%s pass %d: twin element %lld", what, k,
                          (long long)i);
        }
        cr_assert_gt(nonzero, numel / 2, "%s pass %d: mostly zero gradients (vacuous)", what, k);
    }
    /* a failing sink stops the backward with its status */
    col.fail = MT_ERR_RUNTIME;
    double ls;
    int64_t cnt;
    cr_assert_eq(mt_model_forward_backward(b.m, tok, lab, 1.0f, &ls, &cnt), MT_ERR_RUNTIME);
    cr_assert(strstr(mt_last_error(), "test sink refuses"));
    /* ... and one failing in the middle of a layer's hand-overs (the third parameter of
     * layer L - 1, after the unembedding's chunks and the tail) stops it there; the next
     * backward starts clean (nothing left open or handed over from the failed one) and
     * is bitwise the full buffer's again */
    col.fail = MT_OK;
    reset(&col, numel);
    col.pending = 0;
    col.fail_at = (int)(vg ? C : 0) + 1 + 3;
    cr_assert_eq(mt_model_forward_backward(b.m, tok, lab, 1.0f, &ls, &cnt), MT_ERR_RUNTIME, "%s", what);
    cr_assert(strstr(mt_last_error(), "test sink refuses"));
    cr_assert_eq(col.calls, col.fail_at - 1, "%s: %d calls before the failing one", what, col.calls);
    col.fail_at = 0;
    reset(&col, numel);
    col.pending = 0; /* a failed backward leaves windows unwaited: a sink that failed is not waited for */
    memset(mt_model_grads(a.m), 0, (size_t)numel * sizeof(float));
    double la2, lb2;
    int64_t ca2, cb2;
    cr_assert_eq(mt_model_forward_backward(a.m, tok, lab, 0.1f, &la2, &ca2), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_forward_backward(b.m, tok, lab, 0.1f, &lb2, &cb2), MT_OK, "%s", mt_last_error());
    check_calls(&col, b.m, what, 1);
    if (!twin)
        for (int64_t i = 0; i < numel; i++)
            cr_assert(memcmp(&mt_model_grads(a.m)[i], &col.got[i], sizeof(float)) == 0,
                      "%s after a failed backward: element %lld: sink %.9g, full %.9g", what, (long long)i,
                      col.got[i], mt_model_grads(a.m)[i]);
    free(h);
    free(dh);
    free(col.got);
    free(col.got2);
    free(col.seen);
    if (twin) {
        free(colt.got);
        free(colt.got2);
        free(colt.seen);
        fx_free(&t);
    }
    fx_free(&a);
    fx_free(&b);
}

static mt_model_config tiny(mt_decoder_block blk) {
    mt_model_config c = tu_tiny_gqa(blk, 37, 3);
    if (blk == MT_DECODER_GEMMA3) {
        c.sliding_window_size = 3;
        c.sliding_window_pattern = 2;
        c.attn_logits_soft_cap = 2.0f;
        c.final_logits_soft_cap = 3.0f;
    }
    return c;
}

Test(grad_sink, gemma4_layers_of_three_sizes) {
    mt_model_config c = tu_tiny_gemma4(); /* tests/test_fixtures.h */
    check_model(&c, 0, 0, 0, "gemma4");
    check_model(&c, 1, 0, 0, "gemma4, remat full");
    check_model(&c, 0, 1, 0, "gemma4, asynchronous");
}

/* Vocabulary chunks (3 of V 41) take the per-layer embedding table [41, 5 x 4] in chunks
 * of its own (models/model.h mt_model_per_layer_input_chunks: here the vocabulary's 3,
 * the tiny table being smaller than a layer), each chunk's gradient handed over on its
 * own (rows 0-12, 13-26, 27-40) before the projection's and norm's window; bitwise the
 * full buffer of a model in the same chunks. */
Test(grad_sink, gemma4_per_layer_table_in_chunks) {
    mt_model_config c = tu_tiny_gemma4();
    mt_model *m = NULL;
    const mt_model_layout lay = {.vocab_chunks = 3};
    cr_assert_eq(mt_model_create(&m, &c, mt_cpu_backend(), 2, 6, 3, &lay), MT_OK, "%s", mt_last_error());
    mt_plan *p = NULL;
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(m, p), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_per_layer_input_chunks(m), 3, "the table in %lld chunks",
                 (long long)mt_model_per_layer_input_chunks(m));
    mt_plan_free(p);
    mt_model_free(m);
    check_model(&c, 0, 0, 3, "gemma4 in 3 chunks");
    check_model(&c, 1, 1, 3, "gemma4 in 3 chunks, asynchronous, remat full");
}

Test(grad_sink, llama_untied) {
    mt_model_config c = tiny(MT_DECODER_LLAMA2);
    cr_assert_eq(c.logits_via_embedding, 0);
    check_model(&c, 0, 0, 0, "llama");
    check_model(&c, 1, 0, 0, "llama, remat full");
}

Test(grad_sink, gemma_tied) {
    mt_model_config c = tiny(MT_DECODER_GEMMA);
    cr_assert_eq(c.logits_via_embedding, 1);
    check_model(&c, 0, 0, 0, "gemma");
    check_model(&c, 1, 0, 0, "gemma, remat full");
}

/* The vocabulary in 3 chunks (V 37: rows 0-11, 12-23, 24-36): the unembedding's
 * gradient handed over a chunk at a time in the loss, the embedding's after its
 * backward; an untied lm_head's zero gradient chunk by chunk after mt_model_hidden
 * (no loss); a tied embedding's rows in two shares, each bitwise an untied twin's, or,
 * when the sink cannot add shares exactly (mt_model_set_grad_sink_shares 0), in one
 * whole window handed over once as without chunks. */
Test(grad_sink, vocabulary_chunks) {
    mt_model_config c = tiny(MT_DECODER_LLAMA2);
    check_model(&c, 0, 0, 3, "llama in 3 chunks");
    check_model(&c, 1, 1, 3, "llama in 3 chunks, asynchronous, remat full");
    c = tiny(MT_DECODER_GEMMA);
    check_model(&c, 0, 0, 3, "gemma (tied) in 3 chunks");
    check_model(&c, 1, 1, 3, "gemma (tied) in 3 chunks, asynchronous, remat full");
    g_shares = 0; /* a sink that rounds each hand-over: the tied gradient whole, handed over once */
    check_model(&c, 0, 0, 3, "gemma (tied) in 3 chunks, shares not exact");
    check_model(&c, 0, 1, 3, "gemma (tied) in 3 chunks, shares not exact, asynchronous");
    c = tiny(MT_DECODER_LLAMA2); /* untied: in chunks all the same */
    check_model(&c, 0, 0, 3, "llama in 3 chunks, shares not exact");
    g_shares = 1;
}

Test(grad_sink, gemma3_every_optional_path) {
    mt_model_config c = tiny(MT_DECODER_GEMMA3);
    check_model(&c, 0, 0, 0, "gemma3");
}

Test(grad_sink, asynchronous_sink) {
    mt_model_config c = tiny(MT_DECODER_LLAMA2);
    check_model(&c, 0, 1, 0, "llama, asynchronous");
    check_model(&c, 1, 1, 0, "llama, asynchronous, remat full");
    c = tiny(MT_DECODER_GEMMA);
    check_model(&c, 0, 1, 0, "gemma, asynchronous");
}

Test(grad_sink, set_after_planning_is_refused) {
    mt_model_config c = tiny(MT_DECODER_LLAMA2);
    fixture f;
    fx_init(&f, &c, 0, NULL, 0, 0);
    collector col = {0};
    cr_assert_eq(mt_model_set_grad_sink(f.m, sink, &col), MT_ERR_INVALID);
    cr_assert_eq(mt_model_set_grad_sink(NULL, sink, &col), MT_ERR_INVALID);
    cr_assert_eq(mt_model_set_grad_sink_wait(f.m, async_wait), MT_ERR_INVALID);
    cr_assert_eq(mt_model_set_grad_sink_wait(NULL, async_wait), MT_ERR_INVALID);
    fx_free(&f);
    /* a wait without a sink is refused */
    mt_model *m;
    cr_assert_eq(mt_model_create(&m, &c, mt_cpu_backend(), 2, 6, 3, NULL), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_set_grad_sink_wait(m, async_wait), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "no gradient sink"), "%s", mt_last_error());
    mt_model_free(m);
}
