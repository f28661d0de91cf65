/* tests/test_plan_estimate.c: the estimator's result list (train/estimate.h mt_estimate).
 *
 * The invariant of mode 1 (batch size and policy searched), checked against plans made
 * here with mt_memory_plan_rank, for a Llama and a Gemma 2 decoder, on one device and
 * on an fsdp job: the rows are the Pareto list (no row has a batch >= and a modelled
 * step <= another's, one strictly), ranked by modelled tokens/s; each row's plan fits
 * the budget and equals the row's peak, and its policy at batch + 1 does not fit. The
 * budget is the full-remat plan of batch 1 plus 5 x what batch 2 adds, so several
 * batch sizes are in reach. The step model decides remat against offload for a tensor
 * not kept: with the default host link recomputing is cheaper (the rows hold no
 * offload), with a free host link offloading is (the rows hold no remat). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "models/model.h"
#include "models/remat.h"
#include "parallel/mesh.h"
#include "train/config.h"
#include "train/estimate.h"
#include "train/metrics.h"
#include "train/trainer.h"
#include "tests/test_fixtures.h"

static void one_thread(void) { setenv("OMP_NUM_THREADS", "1", 1); }
TestSuite(plan_estimate, .init = one_thread);

static void base_cfg(mt_train_config *c, mt_decoder_block blk, int64_t devices) {
    mt_train_config_defaults(c);
    c->model = tu_plan_model(blk, 6);
    snprintf(c->model.model_name, sizeof c->model.model_name, "test");
    c->per_device_batch_size = 1;
    c->max_target_length = 32;
    c->num_vocab_tiling = 1;
    c->backend = MT_BACKEND_CPU;
    c->num_devices = devices;
}

static size_t peak_of(const mt_train_config *base, int64_t batch, const mt_remat_policy *p) {
    mt_train_config c = *base;
    c.per_device_batch_size = batch;
    c.remat_policy = MT_REMAT_CUSTOM;
    for (int t = 0; t < MT_RT_COUNT; t++) c.remat_custom[t] = (int)p->action[t];
    mt_memory_report r;
    cr_assert_eq(mt_memory_plan_rank(&c, &r, NULL, NULL), MT_OK, "%s", mt_last_error());
    return r.peak;
}

/* Runs mode 1 on c and checks the invariant; returns the number of rows and counts
 * the searched non-kept tensors by action. */
static int check_mode1(mt_train_config *c, const mt_step_model *sm, int counts[3]) {
    mt_remat_policy full;
    mt_remat_action acts[MT_RT_COUNT];
    for (int t = 0; t < MT_RT_COUNT; t++) acts[t] = MT_RA_REMAT;
    acts[MT_RT_DECODER_LAYER_INPUT] = MT_RA_DEVICE;
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_CUSTOM, acts, &full), MT_OK);
    const size_t p1 = peak_of(c, 1, &full), p2 = peak_of(c, 2, &full);
    const size_t budget = p1 + 5 * (p2 - p1);
    c->hbm_gib = (double)budget / 1073741824.0;
    c->remat_policy = MT_REMAT_CUSTOM;
    for (int t = 0; t < MT_RT_COUNT; t++) c->remat_custom[t] = (int)acts[t];
    mt_estimate_result res;
    cr_assert_eq(mt_estimate(c, 0, NULL, sm, &res), MT_OK, "%s", mt_last_error());
    const size_t b = res.budget;
    cr_expect_leq(b, budget);
    cr_expect_geq(b + 1, budget, "hbm_gib round trip");
    cr_expect_eq(res.mode, 1);
    cr_assert_geq(res.nrows, 2, "a budget of several batches gives more than one Pareto row");
    for (int i = 0; i < res.nrows; i++) {
        const mt_estimate_row *x = &res.rows[i];
        for (int j = 0; j < res.nrows; j++) {
            const mt_estimate_row *y = &res.rows[j];
            if (i == j) continue;
            cr_expect_not(y->batch >= x->batch && y->step_s <= x->step_s &&
                              (y->batch > x->batch || y->step_s < x->step_s),
                          "row %d (batch %lld, %.9g s) dominated by row %d (batch %lld, %.9g s)", i,
                          (long long)x->batch, x->step_s, j, (long long)y->batch, y->step_s);
        }
        if (i > 0) cr_expect_geq(res.rows[i - 1].tokens_per_s, x->tokens_per_s, "ranked by tokens/s");
        const size_t pk = peak_of(c, x->batch, &x->policy), pk1 = peak_of(c, x->batch + 1, &x->policy);
        cr_expect_eq(pk, x->peak, "row %d: the plan's peak", i);
        cr_expect_leq(pk, b, "row %d (batch %lld) over the budget: %zu > %zu", i, (long long)x->batch, pk, b);
        cr_expect_gt(pk1, b, "row %d: batch %lld fits too (%zu <= %zu): not the largest", i,
                     (long long)x->batch + 1, pk1, b);
        for (int t = 1; t < MT_RT_COUNT; t++)
            if (!(t == MT_RT_MLPWO && !c->model.use_post_ffw_norm)) counts[x->policy.action[t]]++;
    }
    const int n = res.nrows;
    mt_estimate_result_free(&res);
    return n;
}

Test(plan_estimate, pareto_rows_fit_and_are_maximal) {
    const mt_decoder_block blks[2] = {MT_DECODER_LLAMA2, MT_DECODER_GEMMA2};
    const int64_t devs[2] = {1, 4};
    const mt_step_model sm = mt_step_model_default();
    for (int bi = 0; bi < 2; bi++)
        for (int di = 0; di < 2; di++) {
            mt_train_config c;
            base_cfg(&c, blks[bi], devs[di]);
            int counts[3] = {0, 0, 0};
            int n = check_mode1(&c, &sm, counts);
            cr_log_info("block %d, %lld device(s): %d rows", bi, (long long)devs[di], n);
            cr_expect_eq(counts[MT_RA_OFFLOAD], 0, "default step model: recomputing is cheaper than offloading");
        }
}

Test(plan_estimate, free_host_link_prefers_offload) {
    mt_step_model sm = mt_step_model_default();
    sm.host_bw = 1e30; /* offloading costs nothing */
    mt_train_config c;
    base_cfg(&c, MT_DECODER_GEMMA2, 1);
    int counts[3] = {0, 0, 0};
    check_mode1(&c, &sm, counts);
    cr_expect_eq(counts[MT_RA_REMAT], 0, "a free host link: every tensor not kept is offloaded");
    cr_expect_gt(counts[MT_RA_OFFLOAD], 0);
}

/* The tensor-parallel split rules are parallel/mesh.h mt_mesh_check_tensor_split,
 * shared by the trainer, the model and the estimator. 4 query / 2 kv heads on a
 * tensor axis of 4: the estimator's step model used to replicate the kv heads (one
 * per rank) and model a layout the trainer refuses; now the trainer's plan, the
 * model, the step model and the estimator refuse it with one message. */
Test(plan_estimate, tensor_axis_beyond_kv_heads_refused_as_by_the_trainer) {
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2, 4);
    c.ici_tensor_parallelism = 4;
    c.hbm_gib = 80;
    cr_assert_eq(c.model.num_query_heads, 4);
    cr_assert_eq(c.model.num_kv_heads, 2);
    const mt_layout_sizes s = {.num_query_heads = 4, .num_kv_heads = 2, .mlp_dim = c.model.mlp_dim,
                               .vocab_size = c.model.vocab_size};
    cr_assert_eq(mt_mesh_check_tensor_split(4, &s), MT_ERR_INVALID);
    char want[512];
    snprintf(want, sizeof want, "%s", mt_last_error());
    cr_assert_str_eq(want, "base_num_kv_heads=2 is not divisible by ici_tensor_parallelism=4");

    mt_plan *p = NULL, *h = NULL;
    cr_assert_eq(mt_trainer_plan(&c, &p, &h, NULL), MT_ERR_INVALID, "the trainer refuses tp > kv heads");
    cr_expect_str_eq(mt_last_error(), want);
    cr_assert_null(p);

    mt_model *m = NULL;
    const mt_model_layout tp4 = {.tensor_size = 4};
    cr_expect_eq(mt_model_create(&m, &c.model, mt_cpu_backend(), 1, 32, 1, &tp4), MT_ERR_INVALID);
    cr_expect_str_eq(mt_last_error(), want);
    cr_expect_null(m);

    const mt_step_model sm = mt_step_model_default();
    cr_expect(isinf(mt_step_model_seconds(&c, &sm, NULL, NULL, NULL)), "no step time for a refused layout");
    cr_expect_str_eq(mt_last_error(), want);
    mt_memory_report r;
    cr_expect_eq(mt_memory_plan_rank(&c, &r, NULL, NULL), MT_ERR_INVALID);
    cr_expect_str_eq(mt_last_error(), want);
    mt_estimate_result res;
    cr_expect_eq(mt_estimate(&c, 0, NULL, &sm, &res), MT_ERR_INVALID, "the estimator proposes no row");
    cr_expect_str_eq(mt_last_error(), want);

    /* a tensor axis of 2 divides every size: modelled and planned */
    c.ici_tensor_parallelism = 2;
    c.num_devices = 2;
    cr_expect(isfinite(mt_step_model_seconds(&c, &sm, NULL, NULL, NULL)), "%s", mt_last_error());
    cr_expect_eq(mt_memory_plan_rank(&c, &r, NULL, NULL), MT_OK, "%s", mt_last_error());
}

/* The trainer's mfu FLOPs per token (train/metrics.h, MaxText's convention): the
 * logits matmul, 6 V D, counted once whether lm_head is tied to the embedding (Gemma)
 * or not (Llama), the embedding lookup not at all: 6 N + 12 L H Dh T tied,
 * 6 (N - V D) + 12 L H Dh T untied. */
Test(plan_estimate, flops_per_token_counts_the_logits_once) {
    const mt_decoder_block blks[2] = {MT_DECODER_LLAMA2, MT_DECODER_GEMMA2};
    for (int bi = 0; bi < 2; bi++) {
        const mt_model_config m = tu_plan_model(blks[bi], 6);
        cr_assert_eq(m.logits_via_embedding, bi == 1, "the Gemma 2 test model ties its head, the Llama not");
        const double V = (double)m.vocab_size, D = (double)m.emb_dim, N = (double)mt_model_num_parameters(&m);
        const double attn = 12.0 * (double)(m.num_decoder_layers * m.num_query_heads * m.head_dim) * 32.0;
        const double want = (m.logits_via_embedding ? 6.0 * N : 6.0 * (N - V * D)) + attn;
        /* bitwise (was 1e-12 relative, by hand): every term, product and sum on both sides
         * is an integer below 2^53, so exact in fp64 (Higham 2002, section 2.1) */
        cr_expect_eq(mt_flops_per_token(&m, 32), want, "block %d: %.17g, want %.17g", bi,
                           mt_flops_per_token(&m, 32), want);
    }
}

/* The estimator's step model takes the trainer's formulas: with every tensor kept (no
 * recompute, no offload) its FLOPs are mt_flops_per_token x the tokens one device is
 * credited with (train/metrics.h: a tensor group shares its sequences), its collective
 * bytes rank 0's by the trainer's formula (mt_trainer_plan_ex), and the step is their
 * sum over the rates; every estimate row carries the bytes of its own batch's plan. */
Test(plan_estimate, step_model_takes_the_trainers_flops_and_bytes) {
    const mt_decoder_block blks[2] = {MT_DECODER_LLAMA2, MT_DECODER_GEMMA2};
    const int64_t lay[3][2] = {{1, 1}, {4, 1}, {4, 2}}; /* devices, tensor */
    const mt_step_model sm = mt_step_model_default();
    for (int bi = 0; bi < 2; bi++)
        for (int li = 0; li < 3; li++) {
            mt_train_config c;
            base_cfg(&c, blks[bi], lay[li][0]);
            if (lay[li][1] > 1) {
                c.ici_tensor_parallelism = lay[li][1];
                c.ici_fsdp_parallelism = lay[li][0] / lay[li][1];
            }
            c.per_device_batch_size = 2;
            c.remat_policy = MT_REMAT_CUSTOM;
            for (int t = 0; t < MT_RT_COUNT; t++) c.remat_custom[t] = MT_RA_DEVICE;
            double flops = 0, comm = -1;
            const double s = mt_step_model_seconds(&c, &sm, &flops, NULL, &comm);
            cr_assert(isfinite(s), "%s", mt_last_error());
            const double tokens = (double)(c.per_device_batch_size * c.max_target_length) / (double)lay[li][1];
            const double want = mt_flops_per_token(&c.model, c.max_target_length) * tokens;
            /* bitwise (was 1e-12 relative, by hand): train/estimate.c model_flops is the same
             * mt_flops_per_token times device_tokens, the same rounded quotient of the same
             * integers (B T, 1 accumulation step, over the tensor axis), plus 0 recompute
             * (every tensor kept): the same fp64 operations in the same order */
            cr_expect_eq(flops, want, "block %d layout %d: %.17g vs %.17g", bi, li, flops, want);
            mt_memory_report r;
            cr_assert_eq(mt_memory_plan_rank(&c, &r, NULL, NULL), MT_OK, "%s", mt_last_error());
            cr_expect_eq(comm, (double)r.step_bytes);
            cr_expect_eq(r.step_bytes > 0, lay[li][0] > 1, "bytes %llu on %lld device(s)",
                         (unsigned long long)r.step_bytes, (long long)lay[li][0]);
            /* bitwise (was 1e-12): step_time's flops / device_flops + 0 / host_bw (nothing
             * offloaded: + 0 is exact) + comm / link_bw, the same operations in order */
            cr_expect_eq(s, flops / sm.device_flops + comm / sm.link_bw, "%.17g", s);
            if (lay[li][0] == 1) continue;
            mt_estimate_result res;
            c.hbm_gib = 80;
            cr_assert_eq(mt_estimate(&c, 0, NULL, &sm, &res), MT_OK, "%s", mt_last_error());
            for (int i = 0; i < res.nrows; i++) {
                mt_train_config rc = c; /* the row's batch and policy: its recompute communicates too */
                rc.per_device_batch_size = res.rows[i].batch;
                for (int t = 0; t < MT_RT_COUNT; t++) rc.remat_custom[t] = (int)res.rows[i].policy.action[t];
                cr_assert_eq(mt_memory_plan_rank(&rc, &r, NULL, NULL), MT_OK, "%s", mt_last_error());
                cr_expect_eq(res.rows[i].comm_bytes, r.step_bytes, "row %d (batch %lld)", i,
                             (long long)res.rows[i].batch);
            }
            mt_estimate_result_free(&res);
        }
}

/* ------------------------------------------------------------ the mesh search ---- */

/* c with its ici_* keys set to dims (the config of one layout). */
static mt_train_config on_layout(const mt_train_config *c, const int dims[4]) {
    mt_train_config l = *c;
    l.ici_data_parallelism = dims[MT_AXIS_DATA];
    l.ici_fsdp_parallelism = dims[MT_AXIS_FSDP];
    l.ici_context_parallelism = dims[MT_AXIS_CONTEXT];
    l.ici_tensor_parallelism = dims[MT_AXIS_TENSOR];
    return l;
}

/* Best modelled tokens/s of each layout that the trainer accepts and where something
 * fits, found by brute force: mt_estimate (one mesh) on every factorisation of
 * num_devices (no axis held). Returns how many; best[] descending. */
static int brute_force_bests(const mt_train_config *c, int64_t batch_fixed, const mt_step_model *sm, double *best,
                             int cap) {
    const int64_t n = c->num_devices;
    int nb = 0;
    for (int64_t d = 1; d <= n; d++)
        for (int64_t f = 1; d * f <= n; f++)
            for (int64_t x = 1; d * f * x <= n; x++) {
                if (n % (d * f * x)) continue;
                const int dims[4] = {(int)d, (int)f, (int)x, (int)(n / (d * f * x))};
                mt_train_config l = on_layout(c, dims);
                mt_estimate_result r;
                if (mt_estimate(&l, batch_fixed, NULL, sm, &r) != MT_OK) continue; /* refused, or does not fit */
                cr_assert_lt(nb, cap);
                best[nb++] = r.rows[0].tokens_per_s;
                mt_estimate_result_free(&r);
            }
    for (int i = 1; i < nb; i++) /* descending */
        for (int j = i; j > 0 && best[j] > best[j - 1]; j--) {
            const double t = best[j];
            best[j] = best[j - 1];
            best[j - 1] = t;
        }
    return nb;
}

/* Every row of a mesh search: a factorisation of num_devices that the trainer's layout
 * check accepts, the held axes at their values, the trainer's full plan of the row's
 * (layout, batch, policy) passing and equal to the row's peak within the budget, its
 * collective bytes the trainer's formula; layouts ranked by their best row, each
 * layout's rows by tokens/s. Returns the number of layouts listed. */
static int check_mesh_rows(const mt_train_config *c, const mt_estimate_result *res, const int held[4]) {
    cr_assert_gt(res->nrows, 0);
    double prev_best = INFINITY;
    for (int i = 0; i < res->nrows; i++) {
        const mt_estimate_row *x = &res->rows[i];
        int64_t prod = 1;
        for (int a = 0; a < 4; a++) prod *= x->dims[a];
        cr_expect_eq(prod, c->num_devices, "row %d: %d x %d x %d x %d is not num_devices", i, x->dims[0], x->dims[1],
                     x->dims[2], x->dims[3]);
        const int64_t ici[4] = {c->ici_data_parallelism, c->ici_fsdp_parallelism, c->ici_context_parallelism,
                                c->ici_tensor_parallelism};
        for (int a = 0; a < 4; a++)
            if (held && held[a] && ici[a] != -1)
                cr_expect_eq(x->dims[a], ici[a], "row %d: held axis %d moved to %d", i, a, x->dims[a]);
        mt_train_config l = on_layout(c, x->dims);
        l.per_device_batch_size = x->batch;
        l.remat_policy = MT_REMAT_CUSTOM;
        for (int t = 0; t < MT_RT_COUNT; t++) l.remat_custom[t] = (int)x->policy.action[t];
        cr_expect_eq(mt_trainer_check_layout(&l, x->dims), MT_OK, "row %d: the trainer refuses it: %s", i,
                     mt_last_error());
        mt_memory_report r;
        cr_assert_eq(mt_memory_plan_rank(&l, &r, NULL, NULL), MT_OK, "row %d: %s", i, mt_last_error());
        cr_expect_eq(r.peak, x->peak, "row %d: the plan's peak", i);
        cr_expect_leq(r.peak, res->budget, "row %d over the budget", i);
        cr_expect_eq(r.step_bytes, x->comm_bytes, "row %d: collective bytes are not the trainer's formula", i);
        if (i > 0 && x->layout == res->rows[i - 1].layout)
            cr_expect_geq(res->rows[i - 1].tokens_per_s, x->tokens_per_s, "row %d: ranked within its layout", i);
        if (i == 0 || x->layout != res->rows[i - 1].layout) {
            cr_expect_eq(x->layout, i == 0 ? 1 : res->rows[i - 1].layout + 1);
            cr_expect_geq(prev_best, x->tokens_per_s, "layout %d ranked by its best row", x->layout);
            prev_best = x->tokens_per_s;
        }
    }
    return res->rows[res->nrows - 1].layout;
}

/* The budget of check_mode1 for c's fsdp-over-num_devices plan: batch 1 under full remat
 * plus 5 x what batch 2 adds. */
static void roomy_budget(mt_train_config *c) {
    mt_remat_policy full;
    mt_remat_action acts[MT_RT_COUNT];
    for (int t = 0; t < MT_RT_COUNT; t++) acts[t] = MT_RA_REMAT;
    acts[MT_RT_DECODER_LAYER_INPUT] = MT_RA_DEVICE;
    cr_assert_eq(mt_remat_policy_resolve(MT_REMAT_CUSTOM, acts, &full), MT_OK);
    const size_t p1 = peak_of(c, 1, &full), p2 = peak_of(c, 2, &full);
    c->hbm_gib = (double)(p1 + 5 * (p2 - p1)) / 1073741824.0;
}

/* Branch and bound returns the same best layouts as estimating every layout: for a
 * Llama and a Gemma 2 decoder on 4, 6 and 8 devices, both modes. */
Test(plan_estimate, mesh_search_is_exact_and_its_rows_pass_the_trainer) {
    const mt_decoder_block blks[2] = {MT_DECODER_LLAMA2, MT_DECODER_GEMMA2};
    const int64_t devs[3] = {4, 6, 8};
    const mt_step_model sm = mt_step_model_default();
    const int none[4] = {0, 0, 0, 0};
    for (int bi = 0; bi < 2; bi++)
        for (int di = 0; di < 3; di++)
            for (int64_t batch = 0; batch <= 2; batch += 2) {
                mt_train_config c;
                base_cfg(&c, blks[bi], devs[di]);
                roomy_budget(&c);
                mt_estimate_result res;
                cr_assert_eq(mt_estimate_mesh(&c, none, 3, batch, NULL, &sm, &res), MT_OK, "%s", mt_last_error());
                const int listed = check_mesh_rows(&c, &res, NULL);
                double best[64];
                const int nb = brute_force_bests(&c, batch, &sm, best, 64);
                cr_log_info("block %d, %lld devices, batch %lld: %d candidates, %d refused, %d no fit, %d bounded, "
                            "%d searched; brute force %d", bi, (long long)devs[di], (long long)batch, res.candidates,
                            res.refused, res.no_fit, res.bounded, res.searched, nb);
                cr_expect_eq(listed, nb < 3 ? nb : 3, "listed layouts");
                cr_expect_eq(res.searched + res.bounded + res.no_fit + res.refused, res.candidates);
                for (int k = 0, i = 0; k < listed && i < res.nrows; i++)
                    if (i == 0 || res.rows[i].layout != res.rows[i - 1].layout) {
                        /* bitwise (was 1e-12): both rows come from train/estimate.c
                         * confirm_and_model on the same layout, batch and policy */
                        cr_expect_eq(res.rows[i].tokens_per_s, best[k],
                                           "layout %d: %.17g tokens/s, brute force %.17g", k + 1,
                                           res.rows[i].tokens_per_s, best[k]);
                        k++;
                    }
                mt_estimate_result_free(&res);
            }
}

/* Held axes stay where the user put them; -1 fills what the searched axes leave. */
Test(plan_estimate, mesh_search_holds_given_axes) {
    const mt_step_model sm = mt_step_model_default();
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2, 8);
    roomy_budget(&c);
    const int held_t[4] = {0, 0, 0, 1}, held_cx[4] = {0, 0, 1, 0}, held_df[4] = {1, 1, 0, 0};
    mt_estimate_result res;
    c.ici_tensor_parallelism = 2;
    cr_assert_eq(mt_estimate_mesh(&c, held_t, 5, 0, NULL, &sm, &res), MT_OK, "%s", mt_last_error());
    check_mesh_rows(&c, &res, held_t);
    cr_expect_eq(res.candidates, 6, "4 = data x fsdp x context: 6 factorisations");
    mt_estimate_result_free(&res);
    c.ici_tensor_parallelism = 1;
    c.ici_context_parallelism = 2;
    cr_assert_eq(mt_estimate_mesh(&c, held_cx, 5, 0, NULL, &sm, &res), MT_OK, "%s", mt_last_error());
    check_mesh_rows(&c, &res, held_cx);
    mt_estimate_result_free(&res);
    c.ici_context_parallelism = 1;
    c.ici_data_parallelism = 2;
    c.ici_fsdp_parallelism = -1; /* fills: context and tensor searched, fsdp = 4 / (context x tensor) */
    cr_assert_eq(mt_estimate_mesh(&c, held_df, 5, 0, NULL, &sm, &res), MT_OK, "%s", mt_last_error());
    check_mesh_rows(&c, &res, held_df);
    cr_expect_eq(res.candidates, 6, "context x tensor x fsdp = 4: 6 factorisations");
    mt_estimate_result_free(&res);
    /* nothing of 8 devices is a multiple of a held 3 */
    c.ici_data_parallelism = 3;
    cr_expect_eq(mt_estimate_mesh(&c, held_df, 5, 0, NULL, &sm, &res), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "num_devices"), "%s", mt_last_error());
    c.num_devices = 0;
    cr_expect_eq(mt_estimate_mesh(&c, held_df, 5, 0, NULL, &sm, &res), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "num_devices"), "%s", mt_last_error());
}

/* dtype=bfloat16 runs on every layout (models/model.h mt_model_check_dtype_layout): the
 * search refuses exactly the layouts it refuses in float32 (the shape rules), every row
 * it lists passes the trainer's check, and the trainer accepts fsdp 8 in bf16. */
Test(plan_estimate, mesh_search_bf16_lists_only_layouts_the_trainer_runs) {
    const mt_step_model sm = mt_step_model_default();
    const int none[4] = {0, 0, 0, 0};
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2, 8);
    c.ici_data_parallelism = 8;
    roomy_budget(&c);
    c.ici_data_parallelism = 1;
    mt_estimate_result r32, r16;
    cr_assert_eq(mt_estimate_mesh(&c, none, 5, 0, NULL, &sm, &r32), MT_OK, "%s", mt_last_error());
    c.dtype = MT_BF16;
    cr_assert_eq(mt_estimate_mesh(&c, none, 5, 0, NULL, &sm, &r16), MT_OK, "%s", mt_last_error());
    check_mesh_rows(&c, &r16, NULL);
    cr_expect_eq(r16.candidates, r32.candidates);
    cr_expect_eq(r16.refused, r32.refused, "bf16 refused %d layouts, float32 %d", r16.refused, r32.refused);
    cr_expect_lt(r16.refused, r16.candidates - 1, "bf16: only one layout left");
    mt_estimate_result_free(&r32);
    mt_estimate_result_free(&r16);
    const int fsdp8[4] = {1, 8, 1, 1};
    cr_expect_eq(mt_trainer_check_layout(&c, fsdp8), MT_OK, "%s", mt_last_error());
}

/* param_window_unit=weight: under fsdp the recompute gathers weights again, so each
 * row's collective bytes depend on its own remat policy (train/estimate.c confirm keys
 * its cache by the recomputed set there); every row's bytes are the trainer's formula for
 * that row (check_mesh_rows: the row's own policy, batch and layout planned again), and
 * a layout's full-remat row counts more bytes than its all-kept row would. */
Test(plan_estimate, mesh_search_with_weight_windows_counts_the_rows_own_gathers) {
    const mt_step_model sm = mt_step_model_default();
    const int none[4] = {0, 0, 0, 0};
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2, 8);
    roomy_budget(&c);
    c.param_window_unit = 1;
    mt_estimate_result res;
    cr_assert_eq(mt_estimate_mesh(&c, none, 5, 0, NULL, &sm, &res), MT_OK, "%s", mt_last_error());
    check_mesh_rows(&c, &res, NULL);
    mt_estimate_result_free(&res);
    const int fsdp8[4] = {1, 8, 1, 1};
    uint64_t bytes[2];
    for (int k = 0; k < 2; k++) { /* all kept, then all recomputed, on fsdp 8 */
        mt_train_config l = on_layout(&c, fsdp8);
        l.per_device_batch_size = 1;
        l.remat_policy = MT_REMAT_CUSTOM;
        for (int t = 0; t < MT_RT_COUNT; t++) l.remat_custom[t] = k && t > 0 ? MT_RA_REMAT : MT_RA_DEVICE;
        mt_memory_report r;
        cr_assert_eq(mt_memory_plan_rank(&l, &r, NULL, NULL), MT_OK, "%s", mt_last_error());
        bytes[k] = r.step_bytes;
    }
    cr_expect_gt(bytes[1], bytes[0], "fsdp 8, weight windows: recompute %llu bytes, all kept %llu",
                 (unsigned long long)bytes[1], (unsigned long long)bytes[0]);
}
