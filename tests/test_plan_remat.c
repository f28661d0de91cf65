/* tests/test_plan_remat.c: the memory plan under remat policies (train/estimate.h).
 *
 * Backward memory is bounded by construction: planning 2, 8 and 35 layers, each added
 * layer must add exactly its kept tensors (aligned plan entries "layers.<l>.*") plus
 * its parameter state (parameters, gradients, AdamW m and v: 4 x 4 bytes per
 * parameter, the layer's parameter count computed here from the shapes; the AdamW
 * segment table, 24 bytes per parameter tensor, grows with it in one entry), and the
 * recompute scratch must not change with depth. The host pool grows by exactly the
 * offloaded bytes of one layer. And the plan is what `train` allocates: the trainer's
 * arena (and host pool) equal mt_memory_plan_rank's peaks for several configs,
 * policies, accumulation settings and grad dtypes, and a trainer with activation and
 * optimizer offload runs the same losses as one keeping all. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/remat.h"
#include "runtime/plan.h"
#include "train/config.h"
#include "train/estimate.h"
#include "train/trainer.h"
#include "tests/test_fixtures.h"

static void one_thread(void) { setenv("OMP_NUM_THREADS", "1", 1); }
TestSuite(plan_remat, .init = one_thread);

static size_t al(size_t b) { return (b + MT_PLAN_ALIGN - 1) / MT_PLAN_ALIGN * MT_PLAN_ALIGN; }

/* d_model 64 (tu_plan_model): every per-layer parameter block is a multiple of 256
 * bytes, so the parameter state grows by whole alignment units. */
static void base_cfg(mt_train_config *c, mt_decoder_block blk) {
    mt_train_config_defaults(c);
    c->model = tu_plan_model(blk, 2);
    snprintf(c->model.model_name, sizeof c->model.model_name, "test");
    c->per_device_batch_size = 2;
    c->max_target_length = 16;
    c->num_vocab_tiling = 2;
    c->backend = MT_BACKEND_CPU;
}

static int64_t layer_params(const mt_model_config *m) {
    const int64_t D = m->emb_dim, QD = m->num_query_heads * m->head_dim, KVD = m->num_kv_heads * m->head_dim;
    int64_t norms = 2 * D + (m->use_post_attn_norm ? D : 0) + (m->use_post_ffw_norm ? D : 0) +
                    (m->use_qk_norm ? 2 * m->head_dim : 0);
    return D * QD + 2 * D * KVD + QD * D + 3 * D * m->mlp_dim + norms;
}

static void set_policy(mt_train_config *c, int k, const mt_remat_action *custom) {
    c->remat_policy = k;
    if (custom)
        for (int t = 0; t < MT_RT_COUNT; t++) c->remat_custom[t] = (int)custom[t];
}

static const mt_remat_action k_mix[MT_RT_COUNT] = {MT_RA_DEVICE, MT_RA_OFFLOAD, MT_RA_REMAT, MT_RA_DEVICE,
                                                   MT_RA_OFFLOAD, MT_RA_REMAT, MT_RA_DEVICE, MT_RA_OFFLOAD,
                                                   MT_RA_OFFLOAD};

typedef struct depth_point {
    size_t peak, host_peak, scratch, layer0_aligned, layer0_host;
    size_t segs_aligned; /* the AdamW segment table (train/optimizer.h), aligned */
} depth_point;

/* Bytes of the AdamW segment table of a Llama (train/optimizer.h: 24 bytes per
 * parameter tensor of the whole model, on every rank): 2 norms and 7 matrices per
 * layer, embedding, final norm and lm_head. */
static size_t llama_seg_bytes(const mt_model_config *m) { return 24 * (size_t)(9 * m->num_decoder_layers + 3); }

static depth_point plan_at(mt_train_config *c, int64_t L) {
    c->model.num_decoder_layers = L;
    mt_memory_report r;
    mt_plan *p = NULL, *h = NULL;
    cr_assert_eq(mt_memory_plan_rank(c, &r, &p, &h), MT_OK, "%s", mt_last_error());
    depth_point d = {r.peak, mt_plan_peak(h), r.total.recompute_scratch, 0, 0, 0};
    for (int i = 0; i < mt_plan_count(p); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        if (strncmp(e->name, "layers.0.", 9) == 0) d.layer0_aligned += al(e->bytes);
        if (strcmp(e->name, "optimizer.segments") == 0) d.segs_aligned = al(e->bytes);
    }
    for (int i = 0; i < mt_plan_count(h); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(h, i);
        if (strncmp(e->name, "layers.0.", 9) == 0) d.layer0_host += al(e->bytes);
    }
    mt_plan_free(p);
    mt_plan_free(h);
    return d;
}

static void check_depths(mt_decoder_block blk, int k, const mt_remat_action *custom, const char *what) {
    mt_train_config c;
    base_cfg(&c, blk);
    set_policy(&c, k, custom);
    depth_point d2 = plan_at(&c, 2), d8 = plan_at(&c, 8), d35 = plan_at(&c, 35);
    const size_t per_layer = d2.layer0_aligned + 16 * (size_t)layer_params(&c.model);
    cr_expect(d2.segs_aligned > 0 && d8.segs_aligned > d2.segs_aligned, "%s: no AdamW segment table", what);
    cr_expect_eq(d8.peak - d2.peak, 6 * per_layer + d8.segs_aligned - d2.segs_aligned,
                 "%s: 2 -> 8 layers adds %zu, expected 6 x %zu + the segment table's %zu", what, d8.peak - d2.peak,
                 per_layer, d8.segs_aligned - d2.segs_aligned);
    cr_expect_eq(d35.peak - d8.peak, 27 * per_layer + d35.segs_aligned - d8.segs_aligned,
                 "%s: 8 -> 35 layers adds %zu, expected 27 x %zu + the segment table's %zu", what,
                 d35.peak - d8.peak, per_layer, d35.segs_aligned - d8.segs_aligned);
    cr_expect_eq(d2.scratch, d35.scratch, "%s: recompute scratch %zu at 2 layers, %zu at 35", what, d2.scratch,
                 d35.scratch);
    cr_expect_eq(d8.scratch, d35.scratch, "%s: recompute scratch changes with depth", what);
    cr_expect_eq(d35.host_peak - d2.host_peak, 33 * d2.layer0_host, "%s: host pool grows by %zu, expected 33 x %zu",
                 what, d35.host_peak - d2.host_peak, d2.layer0_host);
}

Test(plan_remat, depth_adds_exactly_one_layer) {
    const mt_decoder_block blocks[3] = {MT_DECODER_LLAMA2, MT_DECODER_GEMMA2, MT_DECODER_GEMMA3};
    const char *names[3] = {"llama", "gemma2", "gemma3"};
    const int policies[5] = {MT_REMAT_MINIMAL_WITH_CONTEXT, MT_REMAT_FULL, MT_REMAT_SAVE_DOT_EXCEPT_MLP,
                             MT_REMAT_MINIMAL_OFFLOADED, MT_REMAT_CUSTOM};
    for (int b = 0; b < 3; b++)
        for (int i = 0; i < 5; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s %s", names[b], mt_remat_policy_name((mt_remat_policy_kind)policies[i]));
            check_depths(blocks[b], policies[i], policies[i] == MT_REMAT_CUSTOM ? k_mix : NULL, what);
        }
}

/* Remat saves exactly the bytes not kept; full remat keeps only the layer inputs. */
Test(plan_remat, full_remat_keeps_only_layer_inputs) {
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2);
    c.model.num_decoder_layers = 4;
    set_policy(&c, MT_REMAT_FULL, NULL);
    mt_memory_report r;
    cr_assert_eq(mt_memory_plan_rank(&c, &r, NULL, NULL), MT_OK, "%s", mt_last_error());
    const size_t N = 2 * 16, D = 64;
    cr_expect_eq(r.total.saved[MT_RT_DECODER_LAYER_INPUT], 4 * N * D * 4);
    for (int t = 1; t < MT_RT_COUNT; t++) cr_expect_eq(r.total.saved[t], 0, "%d", t);
    /* scratch: q [N,128], k, v [N,64], context [N,128] + lse [B,H,T], out [N,64],
     * mlpwi_0/1 [N,128]; llama has no mlpwo; forward and backward copies */
    const size_t one = 4 * (N * 128 + 2 * N * 64 + N * 128 + 2 * 4 * 16 + N * 64 + 2 * N * 128);
    cr_expect_eq(r.total.recompute_scratch, 2 * one, "scratch %zu, expected %zu", r.total.recompute_scratch, 2 * one);
}


/* The two columns of `meshtrain plan` (mt_memory_report total / live). One device,
 * grad_dtype bfloat16, 2 micro-batches: the gradient is held as the bf16 accumulator
 * (2 bytes x numel, live over the whole step) plus four fp32 windows that are never
 * live together (models/model.h mt_model_set_grad_sink, parallel/zero1.h): the largest
 * layer parameter (the layers' backward: a layer's gradient goes over one parameter at
 * a time), model.norm + lm_head (the loss phase), the
 * embedding (its backward; llama's is untied) and the reduce chunk of the largest
 * parameter (the optimizer phase). `total` holds all four, sizes from the shapes
 * here; `live` the accumulator and at most the largest window. The live rows add up
 * to live_at_peak and, category by category, to runtime/plan.c's own sweep
 * (mt_plan_live_by_category); the total rows to mt_plan_total_by_category. */
Test(plan_remat, live_rows_count_only_the_peak_phase) {
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2);
    c.model.num_decoder_layers = 4;
    c.grad_dtype = MT_BF16;
    c.gradient_accumulation_steps = 2;
    mt_memory_report r;
    mt_plan *p = NULL;
    cr_assert_eq(mt_memory_plan_rank(&c, &r, &p, NULL), MT_OK, "%s", mt_last_error());
    const mt_model_config *m = &c.model;
    const size_t D = (size_t)m->emb_dim, QD = (size_t)(m->num_query_heads * m->head_dim), F = (size_t)m->mlp_dim;
    const size_t numel = (size_t)r.num_params;
    const size_t emb = (size_t)m->vocab_size * D, tail = emb + D;
    const size_t weight = D * QD > D * F ? D * QD : D * F; /* the largest layer parameter: q/o or an MLP matrix */
    size_t biggest = weight > emb ? weight : emb;        /* of all parameters: the reduce chunk */
    size_t win = weight > tail ? weight : tail;
    if (biggest > win) win = biggest;
    const size_t acc = 2 * numel;
    cr_expect_eq(r.total.grads, acc + 4 * (weight + tail + emb + biggest),
                 "total grads %zu: accumulator %zu + windows of %zu, %zu, %zu, %zu floats", r.total.grads, acc, weight,
                 tail, emb, biggest);
    cr_expect_geq(r.live.grads, acc, "the accumulator is live at the peak");
    cr_expect_leq(r.live.grads, acc + 4 * win, "live grads %zu: more than the accumulator %zu and one window %zu",
                  r.live.grads, acc, 4 * win);
    size_t live[MT_MEM_CATEGORY_COUNT], total[MT_MEM_CATEGORY_COUNT];
    int phase = -1;
    mt_plan_live_by_category(p, live, &phase);
    mt_plan_total_by_category(p, total);
    cr_expect_eq(phase, r.peak_phase);
    const mt_memory_rows *rows[2] = {&r.live, &r.total};
    const size_t *want[2] = {live, total};
    for (int k = 0; k < 2; k++) {
        const mt_memory_rows *x = rows[k];
        size_t saved = x->saved_other;
        for (int t = 0; t < MT_RT_COUNT; t++) saved += x->saved[t];
        cr_expect_eq(x->params, want[k][MT_MEM_PARAMS], "%s", k ? "total" : "live");
        cr_expect_eq(x->grads, want[k][MT_MEM_GRADS], "%s", k ? "total" : "live");
        cr_expect_eq(x->optimizer, want[k][MT_MEM_OPTIMIZER], "%s", k ? "total" : "live");
        cr_expect_eq(saved, want[k][MT_MEM_ACTIVATIONS], "%s", k ? "total" : "live");
        cr_expect_eq(x->recompute_scratch + x->scratch, want[k][MT_MEM_SCRATCH], "%s", k ? "total" : "live");
        cr_expect_eq(x->loss_tile, want[k][MT_MEM_LOSS_TILE], "%s", k ? "total" : "live");
        cr_expect_eq(x->comm, want[k][MT_MEM_COMM], "%s", k ? "total" : "live");
        cr_expect_eq(x->workspace, want[k][MT_MEM_WORKSPACE], "%s", k ? "total" : "live");
        if (k == 0)
            cr_expect_eq(x->params + x->grads + x->optimizer + saved + x->recompute_scratch + x->scratch +
                             x->loss_tile + x->comm + x->workspace,
                         r.live_at_peak);
    }
    cr_expect_leq(r.live_at_peak, r.peak);
    mt_plan_free(p);
}
/* ---- the run allocates exactly the plan ---- */

static char g_dir[256];

/* A tiny llm.c shard dataset: train_000.bin and val_000.bin (uint16 tokens). */
static void make_dataset(int vocab) {
    snprintf(g_dir, sizeof g_dir, "/tmp/mt_plan_remat_%d", (int)getpid());
    char path[512];
    snprintf(path, sizeof path, "mkdir -p %s", g_dir);
    cr_assert_eq(system(path), 0);
    const char *split[2] = {"train", "val"};
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof path, "%s/%s_000.bin", g_dir, split[s]);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        int32_t hdr[256] = {20240520, 1, 4096};
        fwrite(hdr, sizeof hdr, 1, f);
        for (int i = 0; i < 4096; i++) {
            uint16_t t = (uint16_t)((i * 7919u + (unsigned)s * 13u) % (unsigned)vocab);
            fwrite(&t, sizeof t, 1, f);
        }
        fclose(f);
    }
}

static void trainer_run(mt_train_config *c, double loss[3], size_t *dev, size_t *host) {
    mt_trainer *t = NULL;
    cr_assert_eq(mt_trainer_create(&t, c), MT_OK, "%s", mt_last_error());
    *dev = mt_trainer_device_bytes(t);
    *host = mt_trainer_host_bytes(t);
    cr_expect_eq(*dev, mt_plan_peak(mt_trainer_get_plan(t)));
    for (int s = 0; s < 3; s++) {
        mt_step_metrics m;
        cr_assert_eq(mt_trainer_step(t, &m), MT_OK, "%s", mt_last_error());
        loss[s] = m.loss;
    }
    mt_trainer_free(t);
}

Test(plan_remat, run_allocates_exactly_the_plan) {
    make_dataset(96);
    const mt_decoder_block blocks[2] = {MT_DECODER_LLAMA2, MT_DECODER_GEMMA2};
    const int policies[4] = {MT_REMAT_MINIMAL_WITH_CONTEXT, MT_REMAT_FULL, MT_REMAT_QKV_PROJ_OFFLOADED,
                             MT_REMAT_CUSTOM};
    for (int b = 0; b < 2; b++) {
        double ref[3] = {0};
        for (int i = 0; i < 4; i++) {
            mt_train_config c;
            base_cfg(&c, blocks[b]);
            snprintf(c.dataset_path, sizeof c.dataset_path, "%s", g_dir);
            c.model.num_decoder_layers = 3; /* parameter windows hold 2 of them */
            c.eval_interval = 0;
            c.steps = 3;
            c.gradient_accumulation_steps = 1 + i % 2;
            c.grad_dtype = i == 3 ? MT_BF16 : MT_F32;
            c.optimizer_memory_host_offload = i == 2; /* AdamW moments in the host pool */
            c.parameter_memory_host_offload = i == 2; /* parameters too, a layer at a time on the device */
            set_policy(&c, policies[i], policies[i] == MT_REMAT_CUSTOM ? k_mix : NULL);
            mt_memory_report r;
            mt_plan *h = NULL;
            cr_assert_eq(mt_memory_plan_rank(&c, &r, NULL, &h), MT_OK, "%s", mt_last_error());
            const size_t host_plan = mt_plan_peak(h);
            mt_plan_free(h);
            double loss[3];
            size_t dev, host;
            trainer_run(&c, loss, &dev, &host);
            cr_expect_eq(dev, r.peak, "block %d policy %d: arena %zu, plan %zu", b, policies[i], dev, r.peak);
            cr_expect_eq(host, host_plan, "block %d policy %d: host pool %zu, plan %zu", b, policies[i], host,
                         host_plan);
            if (policies[i] == MT_REMAT_QKV_PROJ_OFFLOADED || policies[i] == MT_REMAT_CUSTOM)
                cr_expect_gt(host, 0, "offloading policy with no host pool");
            if (i == 2) {
                cr_expect_eq(r.total.optimizer, 0, "optimizer offloaded but %zu bytes on the device",
                             r.total.optimizer);
                cr_expect_gt(r.host_optimizer, 0);
                /* the device keeps two layer windows and the embedding / norm / head window */
                const size_t lp = (size_t)layer_params(&c.model) * 4;
                const size_t L = (size_t)c.model.num_decoder_layers;
                cr_expect_eq(r.total.params, 2 * lp + (r.host_params - L * lp), "device params %zu", r.total.params);
                cr_expect_lt(r.total.params, r.host_params);
                cr_expect_eq(r.host_params, 4 * (size_t)r.num_params);
            }
            if (i == 0) memcpy(ref, loss, sizeof ref);
            if (i == 2) /* same ga (1) and grad_dtype as the reference: bitwise losses */
                for (int s = 0; s < 3; s++)
                    cr_expect(memcmp(&loss[s], &ref[s], sizeof(double)) == 0, "block %d step %d: %.17g vs %.17g",
                              b, s + 1, loss[s], ref[s]);
        }
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_expect_eq(system(cmd), 0);
}

/* Parameter sharding over a job: an fsdp layout the trainer runs is the trainer's own
 * plan (models/model.h mt_model_layout fsdp): the parameter shard p = ceil(numel / 8)
 * floats, the windows of two layers and of embedding + final norm + head, the AdamW
 * moments on the same shard (fsdp implies ZeRO-1); activations as on one device.
 * Gradients are the trainer's business (not asserted beyond "not more"). */
Test(plan_remat, num_devices_shards_parameter_state) {
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2);
    c.model.num_decoder_layers = 4;
    mt_memory_report r1, r8;
    cr_assert_eq(mt_memory_plan_rank(&c, &r1, NULL, NULL), MT_OK, "%s", mt_last_error());
    c.num_devices = 8;
    cr_assert_eq(mt_memory_plan_rank(&c, &r8, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(r8.dims[1], 8, "all devices on fsdp by default");
    const mt_model_config *m = &c.model;
    const size_t lp = (size_t)layer_params(m), glob = (size_t)(2 * m->vocab_size * m->emb_dim + m->emb_dim);
    const size_t numel = 4 * lp + glob, shard = (numel + 7) / 8;
    cr_expect_eq((size_t)r8.num_params, numel);
    cr_expect_eq(r1.total.params, 4 * numel);
    cr_expect_eq(r8.total.params, 4 * (shard + 2 * lp + glob),
                 "params %zu: shard %zu + 2 layers of %zu + global %zu floats", r8.total.params, shard, lp, glob);
    cr_expect_eq(r8.total.optimizer, 2 * 4 * shard + llama_seg_bytes(m));
    cr_expect_leq(r8.total.grads, r1.total.grads);
    for (int t = 0; t < MT_RT_COUNT; t++) cr_expect_eq(r8.total.saved[t], r1.total.saved[t]);
    /* optimizer on the host */
    c.optimizer_memory_host_offload = 1;
    mt_memory_report ro;
    cr_assert_eq(mt_memory_plan_rank(&c, &ro, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(ro.total.optimizer, 0);
    cr_expect_eq(ro.host_optimizer, r8.total.optimizer);
    cr_expect_lt(ro.peak, r8.peak);
    /* fsdp x tensor: the trainer's plan too */
    c.optimizer_memory_host_offload = 0;
    c.ici_fsdp_parallelism = -1;
    c.ici_tensor_parallelism = 2;
    mt_memory_report rt;
    cr_assert_eq(mt_memory_plan_rank(&c, &rt, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(rt.dims[1], 4);
    cr_expect_eq(rt.dims[3], 2);
}

/* fsdp composed with data or context is the trainer's own plan (parallel/zero1.h
 * mt_grad_sync_set_fsdp): parameters sharded over fsdp only (shard ceil(numel / 4) + the
 * windows of two layers and of embedding + final norm + head, as for fsdp alone), the
 * optimizer shard nested in it over the 2 data (or context) ranks, rank 0's sub-shard
 * ceil(ceil(numel / 4) / 2) floats: AdamW state 1/8 per rank. With parameter host
 * offload too, the trainer's plan as well: the shard moves to the host pool, the device
 * keeps the windows. */
Test(plan_remat, fsdp_with_data_or_context_is_the_trainers_plan) {
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2);
    c.model.num_decoder_layers = 4;
    c.num_devices = 8;
    c.ici_data_parallelism = 2;
    c.ici_fsdp_parallelism = -1;
    const mt_model_config *m = &c.model;
    const size_t lp = (size_t)layer_params(m), glob = (size_t)(2 * m->vocab_size * m->emb_dim + m->emb_dim);
    const size_t numel = 4 * lp + glob, fshard = (numel + 3) / 4, sub = (fshard + 1) / 2;
    mt_memory_report rm, rc, r1;
    cr_assert_eq(mt_memory_plan_rank(&c, &rm, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(rm.dims[0], 2);
    cr_expect_eq(rm.dims[1], 4);
    cr_expect_eq(rm.total.params, 4 * (fshard + 2 * lp + glob), "params %zu: shard %zu + 2 layers of %zu + global %zu",
                 rm.total.params, fshard, lp, glob);
    cr_expect_eq(rm.total.optimizer, 2 * 4 * sub + llama_seg_bytes(m),
                 "optimizer %zu: 2 moments x %zu floats and the segment table", rm.total.optimizer, sub);
    /* context x fsdp: the same shards */
    c.ici_data_parallelism = 1;
    c.ici_context_parallelism = 2;
    cr_assert_eq(mt_memory_plan_rank(&c, &rc, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(rc.dims[2], 2);
    cr_expect_eq(rc.dims[1], 4);
    cr_expect_eq(rc.total.params, rm.total.params);
    cr_expect_eq(rc.total.optimizer, rm.total.optimizer);
    /* one device of the same model: the optimizer state is 8 times (to the rounding) */
    c.num_devices = 1;
    c.ici_context_parallelism = 1;
    c.ici_fsdp_parallelism = 1;
    cr_assert_eq(mt_memory_plan_rank(&c, &r1, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(r1.total.optimizer, 2 * 4 * numel + llama_seg_bytes(m));
    /* data x fsdp with parameter host offload */
    c.num_devices = 8;
    c.ici_data_parallelism = 2;
    c.ici_fsdp_parallelism = -1;
    c.parameter_memory_host_offload = 1;
    mt_memory_report rp;
    cr_assert_eq(mt_memory_plan_rank(&c, &rp, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(rp.host_params, 4 * fshard);
    cr_expect_eq(rp.total.params, 4 * (2 * lp + glob), "device params %zu: the windows only", rp.total.params);
    cr_expect_eq(rp.total.optimizer, rm.total.optimizer);
}

/* A data-parallel ZeRO-1 job is planned by the trainer itself (exact): the optimizer
 * state is a quarter per rank on 4 data ranks. */
Test(plan_remat, zero1_job_is_the_trainers_plan) {
    mt_train_config c;
    base_cfg(&c, MT_DECODER_LLAMA2);
    mt_memory_report r1, r4;
    cr_assert_eq(mt_memory_plan_rank(&c, &r1, NULL, NULL), MT_OK, "%s", mt_last_error());
    c.num_devices = 4;
    c.ici_data_parallelism = -1;
    c.shard_optimizer_over_data = 1;
    cr_assert_eq(mt_memory_plan_rank(&c, &r4, NULL, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(r4.dims[0], 4);
    cr_expect_eq(r4.dims[1], 1);
    const size_t numel = (size_t)r1.num_params;
    cr_expect_eq(r4.total.optimizer, 2 * ((numel + 3) / 4) * 4 + llama_seg_bytes(&c.model),
                 "optimizer %zu for %zu params", r4.total.optimizer, numel);
    cr_expect_eq(r4.total.params, r1.total.params);
}


/* ---- gemma4 (issue 18): backward memory bounded by construction ----
 * gemma4-e2b at max_target_length 24576, per_device_batch_size 8 (the MaxText report of
 * peak HBM past 400 GB), planned at 35 and 70 layers with the same 20 KV-sharing
 * layers: the 35 added layers are 7 periods of 4 local + 1 global layer with their own
 * K/V, and each period must cost exactly what layers 0-4 cost at 35 layers (their
 * aligned "layers.<l>.*" entries), plus the parameter state of the added parameters
 * (16 bytes each in fp32: parameters, gradients, AdamW m and v, and the AdamW segment
 * table's 24 bytes per tensor; alignment aside), plus
 * the added layers' share of the per-layer inputs and their gradient (2 x N x 256
 * floats and N norm statistics per layer): nothing else may grow with depth. */
typedef struct g4_point {
    size_t peak, period, state, ple;
    int64_t numel;
    int donor_k_last, donor_v_last; /* last phase of layers.13.key_proj / value_proj (-1: none) */
} g4_point;

static g4_point g4_plan_at(mt_train_config *c, int64_t L) {
    c->model.num_decoder_layers = L;
    mt_memory_report r;
    mt_plan *p = NULL;
    cr_assert_eq(mt_memory_plan_rank(c, &r, &p, NULL), MT_OK, "%s", mt_last_error());
    g4_point d = {r.peak, 0, 0, 0, 0, -1, -1};
    char last[32];
    snprintf(last, sizeof last, "layers.%lld.", (long long)(L - 1));
    d.numel = mt_model_num_parameters(&c->model) + L; /* + the layer_scalar buffers */
    for (int i = 0; i < mt_plan_count(p); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(p, i);
        if (e->category == MT_MEM_PARAMS || e->category == MT_MEM_GRADS || e->category == MT_MEM_OPTIMIZER)
            d.state += al(e->bytes);
        if (strncmp(e->name, "layers.", 7) == 0 && e->name[7] >= '0' && e->name[7] <= '4' && e->name[8] == '.')
            d.period += al(e->bytes);
        if (strncmp(e->name, "gemma4.per_layer_inputs", 23) == 0 ||
            strcmp(e->name, "gemma4.per_layer_projection_rstd") == 0)
            d.ple += al(e->bytes);
        /* a KV-sharing layer saves no K/V of its own */
        if (strcmp(e->name, "layers.13.key_proj") == 0) d.donor_k_last = e->last;
        if (strcmp(e->name, "layers.13.value_proj") == 0) d.donor_v_last = e->last;
        if (strncmp(e->name, last, strlen(last)) == 0)
            cr_expect(strstr(e->name, "key_proj") == NULL && strstr(e->name, "value_proj") == NULL &&
                          strstr(e->name, "key_norm") == NULL,
                      "sharing layer %lld has %s", (long long)(L - 1), e->name);
    }
    mt_plan_free(p);
    return d;
}

/* keep_kv: the policy keeps key / value_proj (the donor's live until its own backward,
 * else until the backward of layer 15, the first KV-sharing layer). */
static void g4_check_depth(const char *policy, int keep_kv) {
    mt_train_config c;
    char base[512];
    snprintf(base, sizeof base, "%s/configs/base.yml", MT_SOURCE_DIR);
    char pol[64];
    snprintf(pol, sizeof pol, "remat_policy=%s", policy);
    const char *ov[] = {"model_name=gemma4-e2b", "max_target_length=24576", "per_device_batch_size=8", pol,
                        "backend=cpu"};
    cr_assert_eq(mt_train_config_load(&c, base, 5, ov), MT_OK, "%s", mt_last_error());
    const g4_point a = g4_plan_at(&c, 35), b = g4_plan_at(&c, 70);
    const int want_last = 2 * 35 + 1 - (keep_kv ? 13 : 15); /* models/model.h phases: backward of layer l = 2L + 1 - l */
    cr_expect(a.donor_k_last == want_last && a.donor_v_last == want_last,
              "%s: the local donor's K/V end in phases %d / %d, expected %d", policy, a.donor_k_last, a.donor_v_last,
              want_last);
    const int64_t N = 8 * 24576;
    const size_t dstate = b.state - a.state, dple = b.ple - a.ple;
    /* the parameter state: 16 bytes per added parameter and the AdamW segment table's 24
     * per added tensor (17 in a layer with its own K/V and per-layer inputs), up to each
     * entry's alignment */
    const size_t want_state = 16 * (size_t)(b.numel - a.numel) + 24 * 17 * 35;
    cr_expect(dstate >= want_state - 8 * MT_PLAN_ALIGN && dstate <= want_state + 8 * MT_PLAN_ALIGN,
              "%s: parameter state grows by %zu, expected 16 x %lld", policy, dstate, (long long)(b.numel - a.numel));
    const size_t want_ple = 35 * (size_t)N * (2 * 256 * 4 + 4);
    cr_expect(dple >= want_ple && dple - want_ple < 3 * MT_PLAN_ALIGN, "%s: per-layer inputs grow by %zu, expected %zu",
              policy, dple, want_ple);
    cr_expect_eq(b.peak - a.peak, 7 * a.period + dstate + dple,
                 "%s: 35 -> 70 layers adds %zu bytes, expected 7 periods x %zu + parameter state %zu + per-layer "
                 "inputs %zu",
                 policy, b.peak - a.peak, a.period, dstate, dple);
    cr_log_info("gemma4-e2b %s: peak %.2f GiB at 35 layers, %.2f GiB at 70; a period of 5 layers keeps %.2f GiB",
                policy, (double)a.peak / 1073741824.0, (double)b.peak / 1073741824.0,
                (double)a.period / 1073741824.0);
}

Test(plan_remat, gemma4_e2b_depth_adds_a_constant_per_period) {
    g4_check_depth("minimal_with_context", 1);
    g4_check_depth("full", 0);
}
