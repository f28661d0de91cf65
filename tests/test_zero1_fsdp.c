/* tests/test_zero1_fsdp.c: the optimizer shards of fsdp composed with data / context
 * (parallel/zero1.h mt_grad_sync_set_fsdp), worked by hand on small buffers: shards in
 * rank order partition the buffer in flat order (one reduce-scatter over the fsdp-major
 * group), each nested in its rank's fsdp shard (the model's split), uneven and empty
 * ones included, and the bytes formula of one step. The multi-rank numbers (losses,
 * gradients, parameters and bytes measured against one process) are in
 * tests/test_mpi_layouts.sh. */
#include <criterion/criterion.h>
#include <string.h>

#include "parallel/zero1.h"

/* numel 23, fsdp 2, rep 3 (data x context): fsdp shards ceil(23 / 2) = 12 -> [0,12)
 * [12,23); sub-shards ceil(12 / 3) = 4 -> [0,4) [4,8) [8,12) | [12,16) [16,20) [20,23). */
Test(zero1_fsdp, shards_nest_in_the_fsdp_shards) {
    const int64_t lo[6] = {0, 4, 8, 12, 16, 20}, hi[6] = {4, 8, 12, 16, 20, 23};
    for (int r = 0; r < 6; r++) {
        mt_grad_sync g;
        cr_assert_eq(mt_grad_sync_init(&g, NULL, 6, r, 23, 1, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
        cr_assert_eq(mt_grad_sync_set_fsdp(&g, NULL, 2, r / 3), MT_OK, "%s", mt_last_error());
        cr_assert(g.lo == lo[r] && g.hi == hi[r], "rank %d: [%lld, %lld)", r, (long long)g.lo, (long long)g.hi);
        cr_assert_eq(g.flo, r < 3 ? 0 : 12);
        cr_assert_eq(g.fhi, r < 3 ? 12 : 23);
        cr_assert_eq(g.params_sharded, 1);
        cr_assert_eq(g.rep, 3);
        cr_assert_eq(g.rep_rank, r % 3);
        for (int i = 0; i < 6; i++) cr_assert_eq(g.counts[i], hi[i] - lo[i], "rank %d count %d", r, i);
        for (int j = 0; j < 3; j++) cr_assert_eq(g.rcounts[j], hi[(r / 3) * 3 + j] - lo[(r / 3) * 3 + j]);
        cr_assert_eq(mt_grad_sync_opt_numel(&g), hi[r] - lo[r]);
        /* one step: reduce-scatter of G - G_own, all-gather of the fsdp shard minus own */
        const uint64_t own = hi[r] - lo[r], fs = r < 3 ? 12 : 11;
        cr_assert_eq(mt_grad_sync_step_bytes(&g, 1), 4 * (23 - own) + 4 * (fs - own));
        mt_grad_sync_free(&g);
    }
}

/* rep = 1 (fsdp alone) is the plain ZeRO-1 split and gathers nothing; empty sub-shards
 * (numel 5 over fsdp 2 x rep 4: [0,3) cut in 1s gives [0,1) [1,2) [2,3) [3,3)). */
Test(zero1_fsdp, fsdp_alone_and_empty_subshards) {
    for (int r = 0; r < 4; r++) {
        mt_grad_sync g, z;
        cr_assert_eq(mt_grad_sync_init(&g, NULL, 4, r, 10, 1, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
        cr_assert_eq(mt_grad_sync_init(&z, NULL, 4, r, 10, 1, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
        cr_assert_eq(mt_grad_sync_set_fsdp(&g, NULL, 4, r), MT_OK);
        cr_assert(g.lo == z.lo && g.hi == z.hi && g.flo == z.lo && g.fhi == z.hi);
        cr_assert_eq(mt_grad_sync_step_bytes(&g, 1), 4 * (uint64_t)(10 - (z.hi - z.lo))); /* no gather */
        mt_grad_sync_free(&g);
        mt_grad_sync_free(&z);
    }
    const int64_t lo[8] = {0, 1, 2, 3, 3, 4, 5, 5}, hi[8] = {1, 2, 3, 3, 4, 5, 5, 5};
    for (int r = 0; r < 8; r++) {
        mt_grad_sync g;
        cr_assert_eq(mt_grad_sync_init(&g, NULL, 8, r, 5, 1, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
        cr_assert_eq(mt_grad_sync_set_fsdp(&g, NULL, 2, r / 4), MT_OK);
        cr_assert(g.lo == lo[r] && g.hi == hi[r], "rank %d: [%lld, %lld)", r, (long long)g.lo, (long long)g.hi);
        mt_grad_sync_free(&g);
    }
}

/* ZeRO-1 is required, fsdp must divide the group, the rank must be fsdp-major. */
Test(zero1_fsdp, bad_groups_are_refused) {
    mt_grad_sync g;
    cr_assert_eq(mt_grad_sync_init(&g, NULL, 4, 0, 10, 0, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
    cr_assert_eq(mt_grad_sync_set_fsdp(&g, NULL, 2, 0), MT_ERR_INVALID);
    mt_grad_sync_free(&g);
    cr_assert_eq(mt_grad_sync_init(&g, NULL, 6, 0, 10, 1, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
    cr_assert_eq(mt_grad_sync_set_fsdp(&g, NULL, 4, 0), MT_ERR_INVALID);
    mt_grad_sync_free(&g);
    /* group rank 1 of 4 with fsdp 2 belongs to fsdp rank 0, not 1 */
    cr_assert_eq(mt_grad_sync_init(&g, NULL, 4, 1, 10, 1, MT_F32, MT_GA_REDUCE_ONCE, 1), MT_OK);
    cr_assert_eq(mt_grad_sync_set_fsdp(&g, NULL, 2, 1), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "fsdp-major") != NULL, "%s", mt_last_error());
    mt_grad_sync_free(&g);
}
