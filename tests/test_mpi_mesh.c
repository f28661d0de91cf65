/* tests/test_mpi_mesh.c: the parts of parallel/ that need no second process: mesh
 * sizes (-1 fill, errors naming the keys and numbers), layout divisibility, rank
 * coordinates, ZeRO-1 shard bounds and the grad_dtype accumulators on a group of one,
 * and the byte formulas. The multi-rank behaviour is tests/test_mpi_*.sh under mpirun. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/backend.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "parallel/zero1.h"

Test(mesh, resolve_fill_and_products) {
    int d[4];
    int64_t a[4] = {2, 1, 1, -1};
    cr_assert_eq(mt_mesh_resolve(a, 8, d), MT_OK);
    cr_assert(d[0] == 2 && d[1] == 1 && d[2] == 1 && d[3] == 4);
    int64_t b[4] = {2, 1, 2, 2};
    cr_assert_eq(mt_mesh_resolve(b, 8, d), MT_OK);
    cr_assert_eq(mt_mesh_resolve(b, 4, d), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "= 8 but the world has 4 ranks"), "%s", mt_last_error());
    int64_t c[4] = {-1, 3, 1, 1};
    cr_assert_eq(mt_mesh_resolve(c, 8, d), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "ici_data_parallelism=-1") && strstr(mt_last_error(), "8 ranks") &&
              strstr(mt_last_error(), "product 3"), "%s", mt_last_error());
    int64_t e[4] = {-1, -1, 1, 1};
    cr_assert_eq(mt_mesh_resolve(e, 4, d), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "ici_fsdp_parallelism"), "%s", mt_last_error());
    int64_t z[4] = {1, 1, 0, 1};
    cr_assert_eq(mt_mesh_resolve(z, 1, d), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "ici_context_parallelism=0"), "%s", mt_last_error());
}

Test(mesh, layout_divisibility_names_key_and_numbers) {
    mt_layout_sizes s = {.num_query_heads = 4, .num_kv_heads = 2, .mlp_dim = 64, .vocab_size = 64, .seq = 16,
                         .batch = 2};
    int ok[4] = {1, 1, 2, 2};
    cr_assert_eq(mt_mesh_check_layout(ok, &s), MT_OK);
    int tp4[4] = {1, 1, 1, 4};
    cr_assert_eq(mt_mesh_check_layout(tp4, &s), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "base_num_kv_heads=2 is not divisible by ici_tensor_parallelism=4"), "%s",
              mt_last_error());
    s.vocab_size = 63;
    cr_assert_eq(mt_mesh_check_layout(ok, &s), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "vocab_size=63"), "%s", mt_last_error());
    s.vocab_size = 64;
    int cp3[4] = {1, 1, 3, 1};
    cr_assert_eq(mt_mesh_check_layout(cp3, &s), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "max_target_length=16 is not divisible by 2 x ici_context_parallelism=3"),
              "%s", mt_last_error());
}

Test(mesh, coordinates_tensor_fastest) {
    int dims[4] = {2, 1, 2, 2}, c[4];
    mt_mesh_coords(dims, 0, c);
    cr_assert(c[0] == 0 && c[2] == 0 && c[3] == 0);
    mt_mesh_coords(dims, 1, c);
    cr_assert(c[0] == 0 && c[2] == 0 && c[3] == 1);
    mt_mesh_coords(dims, 6, c);
    cr_assert(c[0] == 1 && c[2] == 1 && c[3] == 0);
}

Test(mesh, world_of_one) {
    cr_assert_eq(mt_comm_world_init(), MT_OK);
    cr_assert_eq(mt_comm_world_size(), 1);
    int dims[4] = {1, 1, 1, 1};
    mt_mesh *m = NULL;
    cr_assert_eq(mt_mesh_create(&m, dims), MT_OK);
    float x[3] = {1, 2, 3};
    cr_assert_eq(mt_comm_all_reduce(m->data_fsdp, x, 3, MT_COMM_F32), MT_OK);
    cr_assert(x[0] == 1 && x[2] == 3);
    cr_assert_eq(mt_mesh_bytes_total(m), 0);
    int bad[4] = {2, 1, 1, 1};
    mt_mesh *m2 = NULL;
    cr_assert_eq(mt_mesh_create(&m2, bad), MT_ERR_INVALID);
    mt_mesh_free(m);
}

/* The asynchronous collectives on a group of one: done at _start (req NULL), the
 * local copy made, 0 bytes counted; argument errors as for the blocking calls. */
Test(comm, async_on_a_group_of_one) {
    cr_assert_eq(mt_comm_world_init(), MT_OK);
    mt_comm *c = NULL;
    cr_assert_eq(mt_comm_split(&c, 0, 0, "one"), MT_OK);
    float send[3] = {1, 2, 3}, recv[3] = {0, 0, 0};
    int64_t counts[1] = {3};
    mt_comm_request *q = (mt_comm_request *)1;
    cr_assert_eq(mt_comm_all_gather_start(c, send, recv, counts, MT_COMM_F32, &q), MT_OK);
    cr_assert_null(q);
    cr_assert_eq(mt_comm_wait(q), MT_OK);
    cr_assert(recv[0] == 1 && recv[1] == 2 && recv[2] == 3);
    float rs[3] = {0, 0, 0};
    cr_assert_eq(mt_comm_reduce_scatter_start(c, send, rs, counts, MT_COMM_F32, &q), MT_OK);
    cr_assert(q == NULL && rs[2] == 3);
    cr_assert_eq(mt_comm_all_reduce_start(c, send, 3, MT_COMM_F32, &q), MT_OK);
    cr_assert(q == NULL && send[1] == 2);
    cr_assert_eq(mt_comm_bytes_total(c), 0);
    cr_assert_eq(mt_comm_all_gather_start(c, send, recv, counts, MT_COMM_F32, NULL), MT_ERR_INVALID);
    cr_assert_eq(mt_comm_reduce_scatter_start(c, send, rs, counts, MT_COMM_U16, &q), MT_ERR_INVALID);
    cr_assert_eq(mt_comm_all_reduce_start(c, send, -1, MT_COMM_F32, &q), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "count -1"), "%s", mt_last_error());
    cr_assert_eq(mt_comm_is_device(c), 0);
    mt_comm_free(c);
}

/* A device communicator needs NCCL in the build and a visible GPU; the error says
 * which is missing. */
Test(comm, device_split_needs_nccl_and_a_gpu) {
    cr_assert_eq(mt_comm_world_init(), MT_OK);
    mt_comm *c = NULL;
    const mt_status st = mt_comm_split_on(&c, 0, 0, "dev", MT_COMM_DEVICE);
    if (!mt_comm_have_nccl()) {
        cr_assert_eq(st, MT_ERR_UNSUPPORTED);
        cr_assert(strstr(mt_last_error(), "'dev'") && strstr(mt_last_error(), "no NCCL"), "%s", mt_last_error());
    } else if (!mt_cuda_backend_available()) {
        cr_assert_eq(st, MT_ERR_UNSUPPORTED);
        cr_assert(strstr(mt_last_error(), "none is visible"), "%s", mt_last_error());
    } else {
        cr_assert_eq(st, MT_OK, "%s", mt_last_error());
        cr_assert_eq(mt_comm_is_device(c), 1);
        mt_comm_free(c);
    }
}

Test(zero1, shards_cover_the_buffer) {
    /* numel 10 over 4 ranks: ceil = 3 -> [0,3) [3,6) [6,9) [9,10) */
    const int64_t lo[4] = {0, 3, 6, 9}, hi[4] = {3, 6, 9, 10};
    for (int r = 0; r < 4; r++) {
        mt_grad_sync g;
        cr_assert_eq(mt_grad_sync_init(&g, NULL, 4, r, 10, 1, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
        cr_assert(g.lo == lo[r] && g.hi == hi[r], "rank %d: [%lld, %lld)", r, (long long)g.lo, (long long)g.hi);
        /* bytes: reduce-scatter and all-gather of everything but the own chunk */
        cr_assert_eq(mt_grad_sync_step_bytes(&g, 1), 2 * 4 * (uint64_t)(10 - (hi[r] - lo[r])));
        mt_grad_sync_free(&g);
    }
    mt_grad_sync g;
    cr_assert_eq(mt_grad_sync_init(&g, NULL, 2, 0, 10, 0, MT_F32, MT_GA_REDUCE_EVERY, 2), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "shard_optimizer_over_data=true"));
    cr_assert_eq(mt_grad_sync_init(&g, NULL, 4, 0, 10, 0, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
    cr_assert_eq(mt_grad_sync_step_bytes(&g, 1), 2 * 3 * 40 / 4); /* ring all-reduce 2(n-1)/n */
    mt_grad_sync_free(&g);
}

/* bf16 accumulation on a group of one: each add is done in fp32 and rounded once, so
 * the result equals the explicit rounding sequence bitwise, and the plan holds the
 * accumulator of the schedule. */
Test(zero1, bf16_accumulator_rounds_once_per_add) {
    for (int sched = 0; sched < 2; sched++) {
        mt_grad_sync g;
        cr_assert_eq(mt_grad_sync_init(&g, NULL, 1, 0, 5, 1, MT_BF16, (mt_ga_reduce)sched, 3), MT_OK);
        mt_plan *plan = NULL;
        cr_assert_eq(mt_plan_new(&plan), MT_OK);
        cr_assert_eq(mt_grad_sync_add_to_plan(&g, plan, 3), MT_OK);
        cr_assert_eq(mt_plan_finalize(plan), MT_OK);
        const char *acc = sched ? "grad_shard_accumulator" : "grad_accumulator";
        int id = mt_plan_find(plan, acc);
        cr_assert(id >= 0, "%s missing", acc);
        cr_assert_eq(mt_plan_entry_get(plan, id)->bytes, 5 * 2);
        mt_arena arena;
        cr_assert_eq(mt_arena_create(&arena, plan, NULL, NULL, NULL), MT_OK);
        cr_assert_eq(mt_grad_sync_bind(&g, &arena, plan), MT_OK);
        const float mb[3][5] = {{1.0f, 1e-3f, -2.5f, 3.14159f, 100.0f},
                                {1e-3f, 1.0f, 2.5f, 1e-4f, 0.37f},
                                {0.0078125f, -1.0f, 1e-5f, 2.0f, -100.0f}};
        float grads[5], expect[5] = {0};
        for (int k = 0; k < 3; k++) {
            memcpy(grads, mb[k], sizeof grads);
            int zero = 0;
            cr_assert_eq(mt_grad_sync_microbatch(&g, grads, k, &zero), MT_OK);
            cr_assert(zero);
            for (int i = 0; i < 5; i++) expect[i] = mt_bf16_to_f32(mt_f32_to_bf16(expect[i] + mb[k][i]));
        }
        float *out = NULL;
        cr_assert_eq(mt_grad_sync_finish(&g, grads, &out), MT_OK);
        for (int i = 0; i < 5; i++) cr_assert_eq(out[i], expect[i], "sched %d elem %d: %g vs %g", sched, i, out[i], expect[i]);
        mt_arena_destroy(&arena);
        mt_plan_free(plan);
        mt_grad_sync_free(&g);
    }
}

/* One micro-batch per step: nothing accumulates, so neither schedule plans an
 * accumulator; ZeRO-1 still plans the fp32 shard the reduce-scatter writes. */
Test(zero1, single_microbatch_has_no_accumulator) {
    for (int sched = 0; sched < 2; sched++) {
        mt_grad_sync g;
        cr_assert_eq(mt_grad_sync_init(&g, NULL, 4, 1, 10, 1, MT_BF16, (mt_ga_reduce)sched, 1), MT_OK);
        mt_plan *plan = NULL;
        cr_assert_eq(mt_plan_new(&plan), MT_OK);
        cr_assert_eq(mt_grad_sync_add_to_plan(&g, plan, 3), MT_OK);
        cr_assert_eq(mt_plan_find(plan, "grad_accumulator"), -1);
        cr_assert_eq(mt_plan_find(plan, "grad_shard_accumulator"), -1);
        int id = mt_plan_find(plan, "grad_shard");
        cr_assert(id >= 0);
        cr_assert_eq(mt_plan_entry_get(plan, id)->bytes, 3 * sizeof(float)); /* [3, 6) of 10 over 4 */
        mt_plan_free(plan);
        mt_grad_sync_free(&g);
    }
}

/* Per-window reduce-scatters with K > 1 run in place (each rank's part of the window
 * receives the sum and is added into the shard accumulator from there), so the plan
 * holds no fp32 gradient shard in the backward: with fp32 the accumulator is the
 * optimizer's gradient, with bf16 the fp32 shard it is widened into lives in the
 * optimizer phase only; one micro-batch reduce-scatters straight into the shard, which
 * lives the whole step. (4 ranks, 10 gradients: rank 1 owns [3, 6).) */
Test(zero1, windows_in_place_hold_no_fp32_shard_in_the_backward) {
    const mt_dtype dts[2] = {MT_F32, MT_BF16};
    for (int d = 0; d < 2; d++)
        for (int K = 1; K <= 3; K += 2) {
            mt_grad_sync g;
            cr_assert_eq(mt_grad_sync_init(&g, NULL, 4, 1, 10, 1, dts[d], MT_GA_REDUCE_EVERY, K), MT_OK);
            cr_assert_eq(mt_grad_sync_set_path(&g, 0, 4), MT_OK);
            mt_plan *plan = NULL;
            cr_assert_eq(mt_plan_new(&plan), MT_OK);
            cr_assert_eq(mt_grad_sync_add_to_plan(&g, plan, 3), MT_OK);
            const int id = mt_plan_find(plan, "grad_shard"), acc = mt_plan_find(plan, "grad_shard_accumulator");
            if (K == 1) {
                cr_assert(id >= 0 && acc < 0, "one micro-batch: the shard, no accumulator");
                cr_assert_eq(mt_plan_entry_get(plan, id)->first, 0);
            } else {
                cr_assert(acc >= 0);
                cr_assert_eq(mt_plan_entry_get(plan, acc)->bytes, 3 * mt_dtype_size(dts[d]));
                if (dts[d] == MT_F32) {
                    cr_assert_eq(id, -1, "fp32: the accumulator is the gradient, no shard");
                } else {
                    cr_assert(id >= 0);
                    const mt_plan_entry *e = mt_plan_entry_get(plan, id);
                    cr_assert(e->first == 3 && e->last == 3 && e->bytes == 3 * sizeof(float),
                              "bf16: the widened shard in the optimizer phase only, [%d, %d] %zu bytes", e->first,
                              e->last, e->bytes);
                }
            }
            mt_plan_free(plan);
            mt_grad_sync_free(&g);
        }
}
