/* tests/test_grad_sink.c: the model's per-layer gradient windows
 * (models/model.h mt_model_set_grad_sink) on the CPU backend.
 *
 * Two models of the same config and parameters, one with the full "grads" buffer and
 * one with a sink that copies every window it is handed into a host array: after one
 * backward (mt_model_forward_backward, or mt_model_hidden + mt_model_backward_hidden)
 * the sink has seen every element exactly once, in the documented ranges and order
 * (tail, layers L-1 .. 0, embedding), and its values are bitwise the full buffer's
 * (the same ops on the same values write them: tolerance 0). The sink model's arena is
 * poisoned with NaN first and a second backward on another batch must again equal a
 * full-buffer backward from zero, so every window is zeroed before it is written.
 * Llama (untied head), Gemma (tied embedding: the loss and the embedding backward both
 * write it), Gemma 3 (QK norms, post norms, soft-caps), kept and under remat full, and
 * Gemma 4 (layers of three sizes: global head dim, KV-sharing layers without k/v and
 * with a double-wide MLP; the per-layer-input globals in a fourth window handed over
 * between layer 0 and the embedding; with vocabulary chunks their table a chunk at a
 * time from a fifth).
 * Also: the plan entries (no "grads", the three windows with their sizes and phases),
 * mt_model_grads NULL, and a sink error stopping the backward.
 * Asynchronous sink (mt_model_set_grad_sink_wait): the sink only notes each window and
 * copies it when the model waits for it, so a window the model zeroed or wrote before
 * waiting would show in the copy; the results must again be bitwise the full buffer's,
 * nothing may be left unwaited when a backward returns, the layer windows must
 * alternate (two layers in flight at once: the overlap) and the plan must hold the
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

typedef struct collector {
    float *got;      /* [numel] host copy of what the sink received */
    int *seen;       /* [numel] times each element was handed over */
    int64_t off[64]; /* offsets of the calls, in order */
    int64_t num[64];
    int calls;
    mt_status fail;  /* returned by the sink when not MT_OK */
    /* asynchronous: windows handed over and not yet waited for */
    float *pend_w[8];
    int64_t pend_off[8], pend_num[8];
    int pending, max_pending, waits;
} collector;

static void copy_in(collector *c, int64_t offset, int64_t numel, const float *grad) {
    memcpy(c->got + offset, grad, (size_t)numel * sizeof(float));
    for (int64_t i = 0; i < numel; i++) c->seen[offset + i]++;
}

static mt_status sink(void *ctx, int64_t offset, int64_t numel, float *grad) {
    collector *c = ctx;
    if (c->fail != MT_OK) return mt_set_error(c->fail, "test sink refuses");
    cr_assert_lt(c->calls, 64);
    c->off[c->calls] = offset;
    c->num[c->calls++] = numel;
    copy_in(c, offset, numel, grad);
    return MT_OK;
}

/* The asynchronous sink: note the window; async_wait reads it. */
static mt_status async_sink(void *ctx, int64_t offset, int64_t numel, float *grad) {
    collector *c = ctx;
    if (c->fail != MT_OK) return mt_set_error(c->fail, "test sink refuses");
    cr_assert_lt(c->calls, 64);
    cr_assert_lt(c->pending, 8);
    for (int i = 0; i < c->pending; i++) cr_assert_neq(c->pend_w[i], grad, "window handed over twice unwaited");
    c->off[c->calls] = offset;
    c->num[c->calls++] = numel;
    c->pend_w[c->pending] = grad;
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
            copy_in(c, c->pend_off[i], c->pend_num[i], c->pend_w[i]);
        } else {
            c->pend_w[k] = c->pend_w[i];
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
        col->got[i] = NAN;
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

/* Every element once; calls: tail, layers L-1 .. 0, (gemma4) the per-layer-input
 * globals (with their table in Cp > 1 chunks: each chunk of the table, then the rest),
 * embedding, with the layout's ranges. */
static void check_calls(const collector *col, const mt_model *m, const char *what) {
    const mt_model_config *c = mt_model_get_config(m);
    const int64_t L = c->num_decoder_layers, numel = mt_model_numel(m), pn = ple_numel(m);
    const int64_t Cp = pn > 0 ? mt_model_per_layer_input_chunks(m) : 1, V = c->vocab_size;
    const int64_t LP = L * c->per_layer_input_dim, tc = Cp > 1 ? Cp : 0; /* the table's own calls */
    for (int64_t i = 0; i < numel; i++) cr_assert_eq(col->seen[i], 1, "%s: element %lld handed %d times", what,
                                                     (long long)i, col->seen[i]);
    cr_assert_eq(col->calls, L + 2 + (pn > 0) + tc, "%s: %d sink calls", what, col->calls);
    const int fn = mt_model_param_find(m, "model.norm.weight"), emb = mt_model_param_find(m, "model.embed_tokens.weight");
    cr_assert_eq(col->off[0], mt_model_param(m, fn)->offset, "%s: first call is not the tail", what);
    cr_assert_eq(col->off[0] + col->num[0], numel);
    for (int64_t l = L - 1; l >= 0; l--) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
        cr_assert_eq(col->off[1 + (L - 1 - l)], mt_model_param(m, mt_model_param_find(m, name))->offset,
                     "%s: call %lld is not layer %lld", what, (long long)(1 + (L - 1 - l)), (long long)l);
    }
    const int64_t e = mt_model_param(m, emb)->numel; /* the globals follow the embedding */
    for (int64_t k = 0; k < tc; k++) { /* chunk k: rows [k V / Cp, (k + 1) V / Cp) (parallel/vocab_loss.h) */
        const int64_t a = k * V / Cp, b = (k + 1) * V / Cp;
        cr_assert_eq(col->off[L + 1 + k], e + a * LP, "%s: call %lld is not table chunk %lld", what,
                     (long long)(L + 1 + k), (long long)k);
        cr_assert_eq(col->num[L + 1 + k], (b - a) * LP, "%s: table chunk %lld of %lld floats", what, (long long)k,
                     (long long)col->num[L + 1 + k]);
    }
    if (pn > 0) {
        cr_assert_eq(col->off[L + 1 + tc], e + (tc ? V * LP : 0), "%s: the globals' window", what);
        cr_assert_eq(col->num[L + 1 + tc], pn - (tc ? V * LP : 0));
    }
    cr_assert_eq(col->off[L + 1 + (pn > 0) + tc], 0);
    cr_assert_eq(col->num[L + 1 + (pn > 0) + tc], e);
}

/* chunks: num_vocab_chunks of both models (0 = auto). */
static void check_model(const mt_model_config *c, int remat_full, int async, int64_t chunks, const char *what) {
    fixture a, b;
    collector col = {0};
    fx_init(&a, c, remat_full, NULL, 0, chunks);
    fx_init(&b, c, remat_full, &col, async, chunks);
    const int64_t numel = mt_model_numel(a.m), L = c->num_decoder_layers, N = 12, D = c->emb_dim;
    col.got = malloc((size_t)numel * sizeof(float));
    col.seen = malloc((size_t)numel * sizeof(int));
    cr_assert_null(mt_model_grads(b.m), "%s: a full gradient buffer with a sink", what);

    /* plan: no "grads"; the windows with their sizes and lifetimes (models/model.h) */
    const mt_param_info *e0 = mt_model_param(a.m, mt_model_param_find(a.m, "model.embed_tokens.weight"));
    const mt_param_info *fnp = mt_model_param(a.m, mt_model_param_find(a.m, "model.norm.weight"));
    int64_t layer = 0; /* the largest layer (gemma4's differ) */
    for (int64_t l = 0; l < L; l++) {
        const int64_t n = (l + 1 < L ? layer_off(a.m, l + 1) : fnp->offset) - layer_off(a.m, l);
        if (n > layer) layer = n;
    }
    const int64_t pn = ple_numel(a.m), Cp = pn > 0 ? mt_model_per_layer_input_chunks(b.m) : 1;
    const int64_t LP = L * c->per_layer_input_dim, table = Cp > 1 ? c->vocab_size * LP : 0;
    int found = 0;
    for (int i = 0; i < mt_plan_count(b.plan); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(b.plan, i);
        cr_assert_str_neq(e->name, "grads", "%s: the full buffer is still planned", what);
        if (strcmp(e->name, "grads.window.layer") == 0 || strcmp(e->name, "grads.window.layer.overlap") == 0) {
            cr_expect_eq(e->bytes, (size_t)layer * 4);
            cr_expect(e->first == L + 2 && e->last == 2 * L + 1, "%s: layer window [%d, %d]", what, e->first, e->last);
            found++;
        } else if (strcmp(e->name, "grads.window.tail") == 0) {
            cr_expect_eq(e->bytes, (size_t)(numel - fnp->offset) * 4);
            cr_expect(e->first == L + 1 && e->last == L + 1);
            found++;
        } else if (strcmp(e->name, "grads.window.embedding") == 0) {
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
    cr_assert_eq(found, 3 + async + (pn > 0) + (Cp > 1), "%s: %d of the %d windows planned", what, found,
                 3 + async + (pn > 0) + (Cp > 1));
    cr_assert_lt(mt_plan_peak(b.plan), mt_plan_peak(a.plan), "%s: windows do not lower the peak", what);

    int32_t tok[12], lab[12];
    float *h = malloc((size_t)(N * D) * sizeof(float)), *dh = malloc((size_t)(N * D) * sizeof(float));
    for (int k = 0; k < 3; k++) { /* batch 1, batch 2 (windows re-zeroed), then backward_hidden */
        batch(c, 40 + (uint64_t)k, tok, lab);
        reset(&col, numel);
        memset(mt_model_grads(a.m), 0, (size_t)numel * sizeof(float));
        if (k < 2) {
            double la, lb;
            int64_t ca, cb;
            cr_assert_eq(mt_model_forward_backward(a.m, tok, lab, 0.1f, &la, &ca), MT_OK, "%s", mt_last_error());
            cr_assert_eq(mt_model_forward_backward(b.m, tok, lab, 0.1f, &lb, &cb), MT_OK, "%s", mt_last_error());
            cr_assert(la == lb && ca == cb, "%s: loss %.17g vs %.17g", what, la, lb);
        } else {
            cr_assert_eq(mt_model_hidden(a.m, tok, h), MT_OK, "%s", mt_last_error());
            cr_assert_eq(mt_model_hidden(b.m, tok, h), MT_OK, "%s", mt_last_error());
            mt_rng_fill_normal(dh, (size_t)(N * D), 0.5f, 3, 0);
            cr_assert_eq(mt_model_backward_hidden(a.m, dh), MT_OK, "%s", mt_last_error());
            cr_assert_eq(mt_model_backward_hidden(b.m, dh), MT_OK, "%s", mt_last_error());
        }
        check_calls(&col, b.m, what);
        cr_assert_eq(col.pending, 0, "%s pass %d: %d windows unwaited after the backward", what, k, col.pending);
        if (async) /* layer l - 1 handed over while layer l is in flight */
            cr_assert_geq(col.max_pending, 2, "%s pass %d: at most %d windows in flight", what, k, col.max_pending);
        const float *g = mt_model_grads(a.m);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < numel; i++) {
            cr_assert(memcmp(&g[i], &col.got[i], sizeof(float)) == 0, "%s pass %d: element %lld: sink %.9g, full %.9g",
                      what, k, (long long)i, col.got[i], g[i]);
            nonzero += g[i] != 0.0f;
        }
        cr_assert_gt(nonzero, numel / 2, "%s pass %d: mostly zero gradients (vacuous)", what, k);
    }
    /* a failing sink stops the backward with its status */
    col.fail = MT_ERR_RUNTIME;
    double ls;
    int64_t cnt;
    cr_assert_eq(mt_model_forward_backward(b.m, tok, lab, 1.0f, &ls, &cnt), MT_ERR_RUNTIME);
    cr_assert(strstr(mt_last_error(), "test sink refuses"));
    free(h);
    free(dh);
    free(col.got);
    free(col.seen);
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
