/* tests/test_ops_backend.c: the backend object and registry (kernels/backend.h) and
 * the ops that took over host loops from models/ and parallel/ (kernels/ops.h):
 * attn_merge (the ring-attention log-sum-exp merge), grad_accumulate and to_f32, on
 * the CPU backend against fp64 references or exact expectations. The same cases run
 * CPU vs CUDA in tests/test_gpu_ops.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/backend.h"
#include "runtime/dtype.h"
#include "tests/test_backend_util.h"
#include "tests/test_ops_util.h"

static mt_backend *cpu(void) { return mt_cpu_backend(); }

Test(backend, registry_and_caps) {
    mt_backend *be = NULL;
    TU_OK(mt_backend_create(MT_BACKEND_CPU, &be));
    cr_assert_eq(be, mt_cpu_backend());
    cr_expect_eq(be->caps.device_memory, 0);
    cr_expect(mt_backend_has_dtype(&be->caps, MT_F32));
    cr_expect(mt_backend_has_dtype(&be->caps, MT_BF16));
    cr_expect(!mt_backend_has_dtype(&be->caps, MT_F16));
    cr_expect_eq(be->caps.multi_rank, 1);
    cr_expect_eq(be->caps.host_offload, 1);
    cr_expect(!(be->caps.peak_flops > 0.0));
    mt_backend_free(be); /* the shared CPU object: a no-op */
    cr_expect_eq(mt_cpu_backend()->ops, be->ops);

    const mt_backend_caps cu = mt_backend_kind_caps(MT_BACKEND_CUDA);
    cr_expect_eq(cu.device_memory, 1);
    cr_expect_eq(cu.multi_rank, 1);
    cr_expect_eq(cu.host_offload, 1); /* the host pool is page-locked: kernels reach it */
    cr_expect(cu.peak_flops > 0.0);

    mt_backend_kind k;
    TU_OK(mt_backend_kind_parse("cuda", &k));
    cr_expect_eq(k, MT_BACKEND_CUDA);
    cr_expect_eq(mt_backend_kind_parse("tpu", &k), MT_ERR_INVALID);

    if (!mt_cuda_backend_available()) { /* no device here (or no CUDA build): a named refusal */
        cr_expect_eq(mt_backend_create(MT_BACKEND_CUDA, &be), MT_ERR_UNSUPPORTED);
        cr_expect(strstr(mt_last_error(), "backend=cuda") != NULL, "%s", mt_last_error());
        TU_OK(mt_backend_create(MT_BACKEND_AUTO, &be));
        cr_expect_eq(be, mt_cpu_backend());
    }
}

/* fp64 reference of ops.h attn_merge for one row. */
static void merge_ref(double *o, double *l, const float *oa, float la, const float *ob, float lb, int64_t Dh) {
    if (lb == -INFINITY) {
        for (int64_t d = 0; d < Dh; d++) o[d] = oa[d];
        *l = la;
        return;
    }
    const double mx = la > lb ? la : lb;
    const double ln = mx + log(exp((double)la - mx) + exp((double)lb - mx));
    const double wa = la == -INFINITY ? 0.0 : exp((double)la - ln), wb = exp((double)lb - ln);
    for (int64_t d = 0; d < Dh; d++) o[d] = wa * oa[d] + wb * ob[d];
    *l = ln;
}

Test(ops_attn_merge, against_fp64_and_edge_rows) {
    const int64_t B = 2, T = 5, H = 3, Dh = 7, rows = B * H * T, n = B * T * H * Dh;
    tu_rng r = {42};
    float *out = tu_falloc(n), *outb = tu_falloc(n), *out0 = tu_falloc(n);
    float *lse = tu_falloc(rows), *lseb = tu_falloc(rows), *lse0 = tu_falloc(rows);
    tu_fill_normal(&r, out, n, 1.0);
    tu_fill_normal(&r, outb, n, 1.0);
    for (int64_t i = 0; i < rows; i++) {
        lse[i] = (float)(4.0 * tu_normal(&r));
        lseb[i] = (float)(4.0 * tu_normal(&r));
    }
    lseb[3] = -INFINITY;              /* b saw no key: row unchanged */
    lse[7] = -INFINITY;               /* a saw no key: out = out_b */
    lse[11] = -INFINITY, lseb[11] = -INFINITY;
    lse[13] = 80.0f, lseb[13] = -80.0f; /* one side negligible */
    memcpy(out0, out, (size_t)n * sizeof(float));
    memcpy(lse0, lse, (size_t)rows * sizeof(float));
    TU_OK(cpu()->ops->attn_merge(cpu(), out, lse, outb, lseb, B, T, H, Dh, MT_F32));
    double o[16], l;
    for (int64_t row = 0; row < rows; row++) {
        const int64_t b = row / (H * T), h = (row / T) % H, i = row % T;
        const int64_t off = ((b * T + i) * H + h) * Dh;
        merge_ref(o, &l, out0 + off, lse0[row], outb + off, lseb[row], Dh);
        if (lseb[row] == -INFINITY) {
            cr_expect(memcmp(out + off, out0 + off, (size_t)Dh * sizeof(float)) == 0, "row %ld changed", (long)row);
            cr_expect(memcmp(&lse[row], &lse0[row], sizeof(float)) == 0, "row %ld lse changed", (long)row);
            continue;
        }
        /* weights rounded to fp32 (1 ulp each), two fp32 products and a sum: |err| <=
         * 4 u (|wa oa| + |wb ob|) <= 4 u max(|oa|, |ob|) since wa + wb = 1 (+1 u slack) */
        for (int64_t d = 0; d < Dh; d++) {
            const double bound = 5.0 * 0x1.0p-24 * fmax(fabs(out0[off + d]), fabs(outb[off + d])) + 1e-30;
            cr_expect(fabs(out[off + d] - o[d]) <= bound, "row %ld d %ld: %.9g vs %.17g", (long)row, (long)d,
                      (double)out[off + d], o[d]);
        }
        cr_expect(fabs(lse[row] - l) <= 0x1.0p-24 * fabs(l) + 1e-30, "row %ld lse %.9g vs %.17g", (long)row,
                  (double)lse[row], l);
    }
    /* merging with an empty block is the identity (bitwise) */
    for (int64_t i = 0; i < rows; i++) lseb[i] = -INFINITY;
    memcpy(out0, out, (size_t)n * sizeof(float));
    TU_OK(cpu()->ops->attn_merge(cpu(), out, lse, outb, lseb, B, T, H, Dh, MT_F32));
    cr_expect(memcmp(out, out0, (size_t)n * sizeof(float)) == 0);
    free(out), free(outb), free(out0), free(lse), free(lseb), free(lse0);
}

Test(ops_grad_accumulate, bf16_adds_in_fp32_and_rounds_once) {
    const int64_t n = 100003; /* above the parallel threshold */
    tu_rng r = {7};
    float *x = tu_falloc(n), *y = tu_falloc(n), *back = tu_falloc(n);
    tu_fill_normal(&r, x, n, 1.0);
    tu_fill_normal(&r, y, n, 1e-3);
    mt_bf16 *acc = calloc((size_t)n, sizeof(mt_bf16));
    TU_OK(cpu()->ops->grad_accumulate(cpu(), acc, MT_BF16, x, n, 1));
    for (int64_t i = 0; i < n; i++) cr_assert_eq(acc[i], mt_f32_to_bf16(x[i]), "first, element %ld", (long)i);
    TU_OK(cpu()->ops->grad_accumulate(cpu(), acc, MT_BF16, y, n, 0));
    for (int64_t i = 0; i < n; i++) {
        /* exact expectation: the fp32 sum of the widened accumulator and y, rounded once */
        const mt_bf16 want = mt_f32_to_bf16(mt_bf16_to_f32(mt_f32_to_bf16(x[i])) + y[i]);
        cr_assert_eq(acc[i], want, "element %ld: %04x vs %04x", (long)i, acc[i], want);
    }
    /* 1 + 2^-9 is below half a bf16 ulp of 1 (2^-8): rounds back to 1 */
    mt_bf16 one = mt_f32_to_bf16(1.0f);
    const float tiny[1] = {0x1.0p-9f};
    TU_OK(cpu()->ops->grad_accumulate(cpu(), &one, MT_BF16, tiny, 1, 0));
    cr_expect_eq(mt_bf16_to_f32(one), 1.0f, "1 + 2^-9 rounds to even (1)");
    TU_OK(cpu()->ops->to_f32(cpu(), back, acc, MT_BF16, n));
    for (int64_t i = 0; i < n; i++) cr_assert_eq(back[i], mt_bf16_to_f32(acc[i]));
    /* NaN stays NaN */
    const float nan1[1] = {NAN};
    mt_bf16 h = 0;
    TU_OK(cpu()->ops->grad_accumulate(cpu(), &h, MT_BF16, nan1, 1, 1));
    cr_expect(isnan(mt_bf16_to_f32(h)));
    free(x), free(y), free(back), free(acc);
}

Test(ops_grad_accumulate, f32_and_bad_dtype) {
    const int64_t n = 1000;
    tu_rng r = {9};
    float *x = tu_falloc(n), *y = tu_falloc(n), *acc = tu_falloc(n), *c = tu_falloc(n);
    tu_fill_normal(&r, x, n, 1.0);
    tu_fill_normal(&r, y, n, 1.0);
    TU_OK(cpu()->ops->grad_accumulate(cpu(), acc, MT_F32, x, n, 1));
    cr_expect(memcmp(acc, x, (size_t)n * sizeof(float)) == 0);
    TU_OK(cpu()->ops->grad_accumulate(cpu(), acc, MT_F32, y, n, 0));
    for (int64_t i = 0; i < n; i++) cr_assert_eq(acc[i], x[i] + y[i]);
    TU_OK(cpu()->ops->to_f32(cpu(), c, acc, MT_F32, n));
    cr_expect(memcmp(c, acc, (size_t)n * sizeof(float)) == 0);
    cr_expect_eq(cpu()->ops->grad_accumulate(cpu(), acc, MT_F16, x, n, 0), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "float16") != NULL, "%s", mt_last_error());
    cr_expect_eq(cpu()->ops->to_f32(cpu(), c, acc, MT_I32, n), MT_ERR_INVALID);
    free(x), free(y), free(acc), free(c);
}
