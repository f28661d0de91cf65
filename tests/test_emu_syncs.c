/* tests/test_emu_syncs.c: a training step of the CUDA backend makes the host wait for the
 * device exactly as often as the design says, counted by the CPU emulator of the CUDA
 * runtime (tests/cudaemu/include/cudaemu_stats.h). Built against meshtrain_emu only
 * (cmake/cudaemu_backend.cmake), label emu.
 *
 * The budget of one optimizer step (train/step.c mt_trainer_step), whatever the number of
 * micro-batches (gradient_accumulation_steps), of loss tiles (num_vocab_tiling) and the
 * gradient path (full buffer or gradient windows):
 *  - device -> host copies: MT_STEP_D2H = 2
 *      1. the loss sum and labelled-token count (models/model.h mt_model_step_stats[0..1]:
 *         every micro-batch's xent_tile adds to them on the device; one 16-byte read after
 *         the last micro-batch);
 *      2. the squared gradient norm (stats[2], summed on the device by sumsq over every
 *         parameter: train/optimizer.c mt_grad_global_norm, or step.c chunked_pass on the
 *         window path), which the host needs for the clip scale and to refuse a
 *         non-finite step.
 *    Nothing else leaves the device: embedding_bwd sorts the tokens on the device
 *    (kernels/cuda/embedding_bwd.cu), the metrics (loss, norm, tokens, step_ms) are
 *    those two reads and the host clock.
 *  - synchronisations: MT_STEP_SYNCS = 2, the same two reads (a cudaMemcpy to the host
 *    waits for the queue before it). None else:
 *      - the uploads of each micro-batch's tokens, labels, positions and RoPE
 *        frequencies are asynchronous copies from pageable memory, staged without
 *        waiting for the device (kernels/cuda/cuda_backend.cu copy_to_device); they are
 *        counted (h2d_copies) but are no budget;
 *      - gradient windows go to their sink without a wait (models/model_loss.c);
 *      - the step does not wait for its AdamW update at its end: the next step's loss
 *        read does (train/step.c).
 *    Not covered (they need several ranks): tensor parallelism's loss (models/model_loss.c
 *    reads and rewrites the step statistics per micro-batch around
 *    parallel/vocab_loss.c) and the communicators' own waits (parallel/comm_nccl.c).
 *
 * Each case builds the trainer `meshtrain train` uses (backend=cuda) on a tiny Llama 3
 * (the block of configs/models/llama3-tiny.yml, scaled down so the emulator runs a step in
 * well under a second), runs one warm-up step (scratch buffers grow there: the cudaFree of
 * a buffer that grows is a synchronisation), resets the counters, runs one step and
 * compares. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cudaemu_stats.h"
#include "kernels/backend.h"
#include "runtime/dtype.h"
#include "train/config.h"
#include "train/data.h"
#include "train/trainer.h"
#include "tests/test_fixtures.h"

/* The design's per-step budget (see the top of this file). */
#define MT_STEP_D2H 2
#define MT_STEP_SYNCS 2

static char g_dir[TU_TMPDIR_LEN];
static char g_cfg[256];

/* models/tiny3.yml (llama3-tiny's block: GQA, SwiGLU, untied, llama3 RoPE; smaller),
 * run.yml and a train shard of a noisy repeating pattern. */
static void setup(void) {
    tu_tmpdir_create(g_dir, "mt_emu_syncs");
    char p[512];
    tu_write_model(g_dir, "tiny3",
                   "decoder_block: llama2\nvocab_size: 64\nbase_emb_dim: 32\nbase_num_query_heads: 4\n"
                   "base_num_kv_heads: 2\nhead_dim: 8\nbase_mlp_dim: 48\nbase_num_decoder_layers: 2\n"
                   "mlp_activations: [\"silu\", \"linear\"]\nlogits_via_embedding: false\n"
                   "rope_max_timescale: 500000\nrope_type: \"llama3\"\nrope_factor: 8.0\n"
                   "rope_low_freq_factor: 1.0\nrope_high_freq_factor: 4.0\nrope_original_max_position: 64\n");
    snprintf(g_cfg, sizeof g_cfg, "%s/run.yml", g_dir);
    char run[1024];
    snprintf(run, sizeof run,
             "model_name: tiny3\nbackend: cuda\nbase_output_directory: %s/out\ndataset_path: %s/data\n"
             "per_device_batch_size: 2\nmax_target_length: 16\nsteps: 10\nlearning_rate: 0.001\n"
             "warmup_steps_fraction: 0\neval_interval: 0\ncheckpoint_period: 0\nseed: 5\n",
             g_dir, g_dir);
    tu_write_file(g_cfg, run);
    snprintf(p, sizeof p, "%s/data", g_dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    enum { NTOK = 4000 };
    uint32_t *tok = malloc(NTOK * sizeof(uint32_t));
    cr_assert_not_null(tok);
    unsigned r = 777;
    for (int i = 0; i < NTOK; i++) {
        r = r * 1103515245u + 12345u;
        tok[i] = (uint32_t)((i % 7) * 9 % 64);
        if ((r >> 16) % 10 == 0) tok[i] = (r >> 8) % 64;
    }
    snprintf(p, sizeof p, "%s/data/train_000.bin", g_dir);
    cr_assert_eq(mt_data_write_shard(p, tok, NTOK, 0), MT_OK);
    free(tok);
}

static void teardown(void) { tu_tmpdir_remove(g_dir); }

TestSuite(emu_syncs, .init = setup, .fini = teardown);

/* One warm-up step, then the counters of one step of the trainer `meshtrain train` runs
 * (mt_trainer_create: gradient windows where they save memory) with the overrides. */
static cudaemu_stats measure_step(int n, const char *const *overrides) {
    mt_train_config cfg;
    cr_assert_eq(mt_train_config_load(&cfg, g_cfg, n, overrides), MT_OK, "config: %s", mt_last_error());
    mt_trainer *t = NULL;
    cr_assert_eq(mt_trainer_create(&t, &cfg), MT_OK, "create: %s", mt_last_error());
    mt_step_metrics m0, m1;
    cr_assert_eq(mt_trainer_step(t, &m0), MT_OK, "warm-up step: %s", mt_last_error());
    cudaemu_stats_reset();
    cr_assert_eq(mt_trainer_step(t, &m1), MT_OK, "step: %s", mt_last_error());
    cudaemu_stats st;
    cudaemu_stats_get(&st);
    /* every label of the shard counts: the step ran all its micro-batches */
    const int64_t tokens = cfg.gradient_accumulation_steps * cfg.per_device_batch_size * cfg.max_target_length;
    cr_assert(m1.tokens == tokens && m1.loss > 0.0 && m1.grad_norm > 0.0,
              "step 2: loss %g, norm %g, %lld tokens (want %lld)", m1.loss, m1.grad_norm, (long long)m1.tokens,
              (long long)tokens);
    mt_trainer_free(t);
    cr_log_info("%s %s: d2h %llu h2d %llu syncs %llu (device %llu stream %llu event %llu copy %llu free %llu)",
                n > 0 ? overrides[0] : "", n > 1 ? overrides[1] : "", (unsigned long long)st.d2h_copies,
                (unsigned long long)st.h2d_copies, (unsigned long long)st.syncs,
                (unsigned long long)st.device_syncs, (unsigned long long)st.stream_syncs,
                (unsigned long long)st.event_syncs, (unsigned long long)st.copy_syncs,
                (unsigned long long)st.free_syncs);
    return st;
}

/* The budget, stated in the file's opening comment. */
static void expect_budget(cudaemu_stats st, const char *what) {
    cr_expect_eq(st.d2h_copies, MT_STEP_D2H, "%s: %llu device -> host copies in a step, the design allows %d",
                 what, (unsigned long long)st.d2h_copies, MT_STEP_D2H);
    cr_expect_eq(st.syncs, MT_STEP_SYNCS,
                 "%s: %llu synchronisations in a step (device %llu, stream %llu, event %llu, copies %llu, "
                 "frees %llu), the design allows %d",
                 what, (unsigned long long)st.syncs, (unsigned long long)st.device_syncs,
                 (unsigned long long)st.stream_syncs, (unsigned long long)st.event_syncs,
                 (unsigned long long)st.copy_syncs, (unsigned long long)st.free_syncs, MT_STEP_SYNCS);
}

Test(emu_syncs, one_microbatch) {
    const char *ov[] = {"gradient_accumulation_steps=1"};
    expect_budget(measure_step(1, ov), "gradient_accumulation_steps=1");
}

/* More micro-batches accumulate on the device: the same budget. */
Test(emu_syncs, two_microbatches) {
    const char *ov[] = {"gradient_accumulation_steps=2"};
    expect_budget(measure_step(1, ov), "gradient_accumulation_steps=2");
}

/* bfloat16 gradient accumulators over 2 micro-batches: the model hands each layer's
 * gradient to the accumulator through a window (parallel/zero1.h MT_GRAD_WINDOW_ACC) and
 * the norm and AdamW read the gradient chunk by chunk (train/step.c chunked_pass): the
 * same budget. */
Test(emu_syncs, gradient_windows) {
    const char *ov[] = {"grad_dtype=bfloat16", "gradient_accumulation_steps=2"};
    expect_budget(measure_step(2, ov), "grad_dtype=bfloat16, gradient_accumulation_steps=2");
}

/* More loss tiles add to the same device statistics: the same budget. */
Test(emu_syncs, vocab_tiles) {
    const char *ov[] = {"num_vocab_tiling=4", "gradient_accumulation_steps=2"};
    expect_budget(measure_step(2, ov), "num_vocab_tiling=4, gradient_accumulation_steps=2");
}

/* The op the old design read the device for: embedding_bwd (kernels/cuda/embedding_bwd.cu)
 * makes no copy and no wait, and stays bitwise the CPU backend's (ops.h: fp32 sums in
 * increasing n), for row counts around the sort's shared-memory tile of 1024 keys (1,
 * 1024 and 1025 rows; 3000 rows pad to 4096 keys: merges across tiles) and, when the
 * backend computes in it, a bfloat16 dout. The largest case comes first: its scratch
 * buffer serves the others (growing it would free the old one, a synchronisation). */
Test(emu_syncs, embedding_bwd_on_device) {
    mt_backend *G = NULL, *C = mt_cpu_backend();
    cr_assert_eq(mt_backend_create(MT_BACKEND_CUDA, &G), MT_OK, "%s", mt_last_error());
    const int64_t V = 300, D = 300, rows[] = {3000, 1025, 1024, 97, 1};
    const float scale = 3.7f;
    unsigned r = 99;
    for (int dti = 0; dti < 2; dti++) {
        const mt_dtype dt = dti ? MT_BF16 : MT_F32;
        if (!mt_backend_has_dtype(&G->caps, dt)) {
            cr_log_info("embedding_bwd: the cuda backend does not compute in %s: not checked", mt_dtype_name(dt));
            continue;
        }
        const size_t es = mt_dtype_size(dt);
        for (size_t c = 0; c < sizeof rows / sizeof rows[0]; c++) {
            const int64_t N = rows[c];
            int32_t *tok = malloc((size_t)N * sizeof(int32_t));
            void *dout = malloc((size_t)(N * D) * es);
            float *dt0 = malloc((size_t)(V * D) * sizeof(float)), *dtc = malloc((size_t)(V * D) * sizeof(float)),
                  *dtg = malloc((size_t)(V * D) * sizeof(float));
            cr_assert(tok && dout && dt0 && dtc && dtg);
            for (int64_t n = 0; n < N; n++) { /* a frequent token, a few common ones, the rest spread */
                r = r * 1664525u + 1013904223u;
                tok[n] = (r >> 28) < 4 ? 7 : (r >> 28) < 10 ? (int32_t)((r >> 8) % 5) : (int32_t)((r >> 8) % V);
            }
            tok[N - 1] = (int32_t)(V - 1);
            for (int64_t i = 0; i < N * D; i++) {
                r = r * 1664525u + 1013904223u;
                const float x = (float)((int32_t)r >> 8) * 0x1p-23f;
                if (dt == MT_F32)
                    ((float *)dout)[i] = x;
                else
                    ((mt_bf16 *)dout)[i] = mt_f32_to_bf16(x);
            }
            for (int64_t i = 0; i < V * D; i++) {
                r = r * 1664525u + 1013904223u;
                dt0[i] = dtc[i] = (float)((int32_t)r >> 8) * 0x1p-23f;
            }
            cr_assert_eq(C->ops->embedding_bwd(C, dtc, dout, tok, N, 0, V, D, scale, dt), MT_OK, "%s", mt_last_error());
            void *gdout = NULL, *gtok = NULL, *gtab = NULL;
            cr_assert_eq(G->ops->alloc(G, (size_t)(N * D) * es, &gdout), MT_OK);
            cr_assert_eq(G->ops->alloc(G, (size_t)N * sizeof(int32_t), &gtok), MT_OK);
            cr_assert_eq(G->ops->alloc(G, (size_t)(V * D) * sizeof(float), &gtab), MT_OK);
            cr_assert_eq(G->ops->copy_to_device(G, gdout, dout, (size_t)(N * D) * es), MT_OK);
            cr_assert_eq(G->ops->copy_to_device(G, gtok, tok, (size_t)N * sizeof(int32_t)), MT_OK);
            cr_assert_eq(G->ops->copy_to_device(G, gtab, dt0, (size_t)(V * D) * sizeof(float)), MT_OK);
            cudaemu_stats_reset();
            cr_assert_eq(G->ops->embedding_bwd(G, gtab, gdout, gtok, N, 0, V, D, scale, dt), MT_OK, "%s",
                         mt_last_error());
            cudaemu_stats st;
            cudaemu_stats_get(&st);
            cr_expect(st.d2h_copies == 0 && st.h2d_copies == 0 && st.syncs == 0,
                      "embedding_bwd (%s, N %lld): %llu device -> host, %llu host -> device copies, %llu syncs",
                      mt_dtype_name(dt), (long long)N, (unsigned long long)st.d2h_copies,
                      (unsigned long long)st.h2d_copies, (unsigned long long)st.syncs);
            cr_assert_eq(G->ops->copy_to_host(G, dtg, gtab, (size_t)(V * D) * sizeof(float)), MT_OK);
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < V * D; i++)
                if (memcmp(&dtg[i], &dtc[i], sizeof(float)) != 0 && bad++ == 0) first = i;
            cr_expect_eq(bad, 0, "embedding_bwd (%s, N %lld): %lld of %lld entries differ from the CPU's, first "
                         "[%lld, %lld]: %a vs %a", mt_dtype_name(dt), (long long)N, (long long)bad,
                         (long long)(V * D), (long long)(first / D), (long long)(first % D),
                         first >= 0 ? dtg[first] : 0.0f, first >= 0 ? dtc[first] : 0.0f);
            (void)G->ops->release(G, gdout);
            (void)G->ops->release(G, gtok);
            (void)G->ops->release(G, gtab);
            free(tok), free(dout), free(dt0), free(dtc), free(dtg);
        }
    }
    mt_backend_free(G);
}
