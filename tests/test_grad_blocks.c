/* tests/test_grad_blocks.c: a layer weight's gradient handed to the gradient sink in
 * row blocks (grad_window_chunks, models/model_windows.c mtm_weight_grad) on the CPU
 * backend: which ranges the sink receives and in what order, not the values (the
 * layouts of tests/test_mpi_layouts.sh hold those to one process within the derived
 * fp32 bound of a reordering: each block is a GEMM of its own shape).
 *
 * A sink that records each call. With k blocks, a backward hands every layer parameter
 * over as ceil(rows / ceil(rows / k)) consecutive row blocks of ceil(rows / k) rows (the
 * last shorter), in row order, each once, and every element of the model exactly once;
 * no window is larger than the largest block (the plan's "grads.window.layer"). The
 * hand-over as zeros of parameters a layer's backward does not write (gemma4's
 * layer_scalar; a 2-D one in blocks, which no model has yet: reached through the
 * model's internal calls, a white-box test) must also come in blocks, without the
 * "written again" error it gave before. */
#include <criterion/criterion.h>

#include "tests/test_backend_util.h"
#include "tests/test_fixtures.h"
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/model.h"
#include "models/model_internal.h"
#include "runtime/plan.h"

#define MAX_CALLS 4096

typedef struct recorder {
    int64_t off[MAX_CALLS], num[MAX_CALLS];
    int calls;
    int *seen; /* [numel] */
    int nonzero;
} recorder;

static mt_status rec_sink(void *ctx, int64_t offset, int64_t numel, float *grad, int add) {
    recorder *r = ctx;
    cr_assert_lt(r->calls, MAX_CALLS);
    cr_assert_eq(add, 0);
    r->off[r->calls] = offset;
    r->num[r->calls] = numel;
    r->calls++;
    for (int64_t i = 0; i < numel; i++) {
        r->seen[offset + i]++;
        r->nonzero += grad[i] != 0.0f;
    }
    return MT_OK;
}

typedef struct fx {
    mt_model *m;
    mt_plan *plan;
    mt_arena arena;
} fx;

static void fx_init(fx *f, const mt_model_config *c, int64_t chunks, recorder *r) {
    memset(f, 0, sizeof *f);
    const mt_model_layout lay = {.grad_window_chunks = chunks};
    cr_assert_eq(mt_model_create(&f->m, c, mt_cpu_backend(), 2, 6, 3, &lay), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_set_grad_sink(f->m, rec_sink, r), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_new(&f->plan), MT_OK);
    cr_assert_eq(mt_model_add_to_plan(f->m, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_plan_finalize(f->plan), MT_OK);
    cr_assert_eq(mt_arena_create(&f->arena, f->plan, NULL, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_bind(f->m, &f->arena, f->plan), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_model_init_params(f->m, 5), MT_OK);
    r->seen = calloc((size_t)mt_model_numel(f->m), sizeof(int));
    cr_assert_not_null(r->seen);
}

static void fx_free(fx *f, recorder *r) {
    free(r->seen);
    mt_arena_destroy(&f->arena);
    mt_plan_free(f->plan);
    mt_model_free(f->m);
}

/* The rows of parameter p's blocks with k chunks: ceil(rows / k) (1-D: one row). */
static int64_t block_rows(const mt_param_info *p, int64_t k) {
    return p->ndim == 2 ? (p->shape[0] + k - 1) / k : 1;
}

/* The calls cover layer parameter p from call *j on in blocks, in row order. */
static void expect_blocks(const recorder *r, const mt_param_info *p, int64_t k, int *j) {
    const int64_t rows = p->ndim == 2 ? p->shape[0] : 1, cols = p->numel / rows, R = block_rows(p, k);
    for (int64_t r0 = 0; r0 < rows; r0 += R, (*j)++) {
        const int64_t r1 = r0 + R < rows ? r0 + R : rows;
        cr_assert_lt(*j, r->calls, "%s: blocks missing", p->name);
        cr_expect_eq(r->off[*j], p->offset + r0 * cols, "%s rows %lld..: call %d at %lld", p->name, (long long)r0, *j,
                     (long long)r->off[*j]);
        cr_expect_eq(r->num[*j], (r1 - r0) * cols, "%s rows %lld..: call %d of %lld floats", p->name, (long long)r0,
                     *j, (long long)r->num[*j]);
    }
}

/* Layer l's parameters from the table: those whose name starts "model.layers.l.". */
static int in_layer(const mt_param_info *p, int64_t l) {
    char pre[32];
    snprintf(pre, sizeof pre, "model.layers.%lld.", (long long)l);
    return strncmp(p->name, pre, strlen(pre)) == 0;
}

Test(grad_blocks, a_backward_hands_each_weight_over_in_row_blocks) {
    for (int64_t k = 2; k <= 5; k += 3) {
        const mt_model_config c = tu_tiny_gqa(MT_DECODER_LLAMA2, 37, 2);
        recorder r = {0};
        fx f;
        fx_init(&f, &c, k, &r);
        int32_t tok[12], lab[12];
        for (int i = 0; i < 12; i++) tok[i] = lab[i] = (i * 7 + 3) % 37;
        double loss = 0;
        int64_t count = 0;
        cr_assert_eq(mt_model_forward_backward(f.m, tok, lab, 1.0f, &loss, &count), MT_OK, "%s", mt_last_error());
        const int64_t numel = mt_model_numel(f.m);
        for (int64_t i = 0; i < numel; i++) cr_assert_eq(r.seen[i], 1, "k %lld: element %lld handed %d times",
                                                         (long long)k, (long long)i, r.seen[i]);
        cr_expect_gt(r.nonzero, 0);
        /* the layers' calls, L - 1 .. 0, each parameter's blocks together and in row order */
        int64_t largest = 0;
        for (int64_t l = 1; l >= 0; l--)
            for (int i = 0; i < mt_model_param_count(f.m); i++) {
                const mt_param_info *p = mt_model_param(f.m, i);
                if (!in_layer(p, l)) continue;
                const int64_t cols = p->ndim == 2 ? p->shape[1] : p->numel;
                largest = largest > block_rows(p, k) * cols ? largest : block_rows(p, k) * cols;
                int j = 0;
                while (j < r.calls && r.off[j] != p->offset) j++;
                cr_assert_lt(j, r.calls, "k %lld: %s never handed over", (long long)k, p->name);
                expect_blocks(&r, p, k, &j);
            }
        /* the plan's layer gradient window is the largest block */
        int found = 0;
        for (int e = 0; e < mt_plan_count(f.plan); e++) {
            const mt_plan_entry *pe = mt_plan_entry_get(f.plan, e);
            if (strcmp(pe->name, "grads.window.layer") != 0) continue;
            found = 1;
            cr_expect_eq(pe->bytes, (size_t)largest * sizeof(float), "k %lld: window %zu bytes, largest block %lld",
                         (long long)k, pe->bytes, (long long)largest);
        }
        cr_expect(found, "no grads.window.layer entry");
        fx_free(&f, &r);
    }
}

/* White box (models/model_internal.h): a layer backward that writes nothing hands every
 * parameter of the layer over as zeros, 2-D ones in row blocks (the path of gemma4's
 * layer_scalar, for a weight); it failed with "written again after its hand-over". */
Test(grad_blocks, unwritten_weights_are_handed_over_as_zeros_in_blocks) {
    const int64_t k = 3;
    const mt_model_config c = tu_tiny_gqa(MT_DECODER_LLAMA2, 37, 2);
    recorder r = {0};
    fx f;
    fx_init(&f, &c, k, &r);
    cr_assert_eq(mtm_grad_windows_begin(f.m), MT_OK, "%s", mt_last_error());
    r.calls = 0;
    mtm_grad_layer_begin(f.m, 1);
    cr_assert_eq(mtm_grad_layer_end(f.m, MT_OK), MT_OK, "%s", mt_last_error());
    cr_expect_eq(r.nonzero, 0, "zeros handed over");
    int j = 0;
    for (int i = 0; i < mt_model_param_count(f.m); i++) { /* in the layer's parameter order */
        const mt_param_info *p = mt_model_param(f.m, i);
        if (in_layer(p, 1)) expect_blocks(&r, p, k, &j);
    }
    cr_expect_eq(j, r.calls, "%d calls, %d expected", r.calls, j);
    fx_free(&f, &r);
}
