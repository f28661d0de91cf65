/* bench/gpu_bench.c: the GPU figures of issue 4, written as JSON files into OUTDIR.
 *
 *   gemm.json       C = A B at LLM shapes through the backend's gemm (cuBLASLt, fp32
 *                   compute, no TF32) in fp32 and, when the backend lists bfloat16
 *                   among its compute dtypes, bf16 operands and output; next to
 *                   cuBLASLt called directly for the same shape in fp32 and in bf16
 *                   (fp32 accumulation): the library's own figures.
 *   attention.json  attention forward + backward TFLOP/s, causal, head_dim 128 and 256,
 *                   sequence 4096 and 8192 (FLOPs: 4 B H T^2 Dh / 2 forward, 2.5 times
 *                   that backward, the FlashAttention-2 paper's convention), in fp32 and
 *                   bf16 (the tensor-core kernels of kernels/cuda/attention_mma.cu),
 *                   next to the target: FlashAttention-2's ~330 TFLOP/s forward +
 *                   backward at head_dim 128 (Dao 2023, arXiv:2307.08691, on an H100).
 *   step.json       one training step (forward, backward, global norm, AdamW) of
 *                   gemma-2b- and llama3.1-8b-shaped models, fp32 and bf16 (bf16
 *                   activations and compute weights, fp32 master, gradients and
 *                   moments: mt_model_layout dtype): tokens/s, MFU against 989
 *                   TFLOP/s (H100/H200 dense bf16) with 6 N + 6 L H Dh T FLOPs per token
 *                   (PaLM's formula, attention halved for causality), and planned
 *                   (mt_plan_peak, which holds the GEMM workspace, + AdamW moments and segments) against measured
 *                   (cudaMemGetInfo before/after) device memory. Layers are removed
 *                   until the fp32 step fits in 85% of the device.
 *
 * Each file is one cJSON document (cJSON_Print's indented layout; a figure that was not
 * measured, NaN or infinite, is null), rewritten after every row so that a run cut
 * short leaves valid JSON holding the rows done.
 *
 * Usage: gpu_bench OUTDIR [SOURCE_DIR]   (SOURCE_DIR holds configs/models/NAME.yml)
 * Exit 77 when no CUDA device is visible. The whole run is sized for under 3 minutes
 * on an H200 with the fp32 baseline kernels. MT_GPU_BENCH_SMOKE=1 shrinks every shape
 * (GEMMs of 64, sequences of 128, llama3-tiny for the step) so that the same code runs
 * in seconds on the CUDA emulator (tests/test_emu_gpu_bench.sh checks its JSON); its
 * figures mean nothing.
 * Not yet run on a GPU: no device has been lent since it was written. */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/tools/tool_backend.h"
#include "kernels/backend.h"
#include "models/config.h"
#include "models/model.h"
#include "runtime/plan.h"
#include "runtime/status.h"
#include "train/config.h"
#include "train/json.h"
#include "train/optimizer.h"

#define PEAK_TFLOPS 989.0

static mt_backend *G;
static int g_smoke; /* MT_GPU_BENCH_SMOKE=1: tiny shapes (see the top) */

/* Milliseconds per call of fn(ctx), after one warm-up, averaged over reps. */
static double time_ms(void (*fn)(void *), void *ctx, int reps) {
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    fn(ctx);
    cudaDeviceSynchronize();
    cudaEventRecord(a, 0);
    for (int i = 0; i < reps; i++) fn(ctx);
    cudaEventRecord(b, 0);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return ms / reps;
}

/* Device buffer filled with N(0,1)-ish fp32 values (a 4 MiB random pattern repeated):
 * zeros would flatter the tensor cores' power draw. */
static void fill_random(void *p, size_t bytes);

static void *dalloc_fill(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return NULL;
    fill_random(p, bytes);
    return p;
}

/* n elements of dt, filled like dalloc_fill (bf16: the same values rounded, all finite). */
static void *dalloc_fill_dt(int64_t n, mt_dtype dt) {
    if (dt == MT_F32) return dalloc_fill((size_t)n * 4);
    void *p = NULL, *tmp = dalloc_fill((size_t)n * 4);
    if (!tmp || cudaMalloc(&p, (size_t)n * 2) != cudaSuccess) {
        cudaFree(tmp);
        return NULL;
    }
    TOOL_OK(G->ops->from_f32(G, p, MT_BF16, tmp, n, 0, 0, 0));
    cudaFree(tmp);
    return p;
}

static void fill_random(void *p, size_t bytes) {
    enum { PAT = 1 << 20 };
    static float *pat;
    if (!pat) {
        pat = malloc(PAT * sizeof(float));
        uint64_t s = 88172645463325252ull;
        for (int i = 0; i < PAT; i++) {
            float u = 0;
            for (int j = 0; j < 4; j++) { /* sum of 4 uniforms, centred: roughly normal */
                s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                u += (float)(s >> 40) * (1.0f / 16777216.0f);
            }
            pat[i] = (u - 2.0f) * 1.7f;
        }
    }
    for (size_t off = 0; off < bytes; off += PAT * sizeof(float)) {
        const size_t n = bytes - off < PAT * sizeof(float) ? bytes - off : PAT * sizeof(float);
        cudaMemcpy((char *)p + off, pat, n, cudaMemcpyHostToDevice);
    }
}

/* ---- GEMM ---- */

typedef struct gemm_ctx {
    int64_t M, N, K;
    mt_dtype dt; /* of A, B and C in gemm_ours */
    float *A, *B, *C;
    /* direct cuBLASLt */
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    const void *dA, *dB;
    void *dC;
} gemm_ctx;

static void gemm_ours(void *p) {
    gemm_ctx *c = p;
    TOOL_OK(G->ops->gemm(G, 0, 1, c->M, c->N, c->K, 1.0f, c->A, c->K, c->B, c->K, c->dt, 0.0f, c->C, c->N,
                         c->dt)); /* x W^T */
}

static void gemm_direct(void *p) {
    gemm_ctx *c = p;
    const float one = 1.0f, zero = 0.0f;
    cublasLtMatmul(c->lt, c->desc, &one, c->dB, c->la, c->dA, c->lb, &zero, c->dC, c->lc, c->dC, c->lc, &c->algo, c->ws,
                   (size_t)32 << 20, 0);
}

/* Set up the direct cuBLASLt call for C[M,N] = A[M,K] W[N,K]^T in `type` (fp32 or bf16
 * inputs/outputs, fp32 compute without TF32). Returns 0 when no algorithm is found. */
static int direct_setup(gemm_ctx *c, cudaDataType_t type, const void *A, const void *B, void *C) {
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescCreate(&c->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulDescSetAttribute(c->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(c->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    cublasLtMatrixLayoutCreate(&c->la, type, (uint64_t)c->K, (uint64_t)c->N, c->K);
    cublasLtMatrixLayoutCreate(&c->lb, type, (uint64_t)c->K, (uint64_t)c->M, c->K);
    cublasLtMatrixLayoutCreate(&c->lc, type, (uint64_t)c->N, (uint64_t)c->M, c->N);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    size_t ws = (size_t)32 << 20;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(c->lt, c->desc, c->la, c->lb, c->lc, c->lc, pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    c->algo = res.algo;
    c->dA = A;
    c->dB = B;
    c->dC = C;
    return found > 0;
}

static void direct_teardown(gemm_ctx *c) {
    cublasLtMatrixLayoutDestroy(c->la);
    cublasLtMatrixLayoutDestroy(c->lb);
    cublasLtMatrixLayoutDestroy(c->lc);
    cublasLtMatmulDescDestroy(c->desc);
}

/* doc (built without error when bad is 0) as dir/name, cJSON_Print's layout and a
 * newline. Returns 0, or 1 when bad, out of memory or the file cannot be written. */
static int write_doc(const char *dir, const char *name, const cJSON *doc, int bad) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = bad ? NULL : cJSON_Print(doc);
    FILE *f = text ? fopen(path, "w") : NULL;
    int err = !f || fputs(text, f) == EOF || fputc('\n', f) == EOF;
    if (f && fclose(f) != 0) err = 1;
    if (err) fprintf(stderr, "gpu_bench: cannot write %s\n", path);
    cJSON_free(text);
    return err;
}

static int bench_gemm(const char *dir) {
    static const int64_t full[][3] = {
        {8192, 4096, 4096},   /* llama3.1-8b q_proj / o_proj, 8k tokens */
        {8192, 14336, 4096},  /* llama3.1-8b gate / up */
        {8192, 4096, 14336},  /* llama3.1-8b down */
        {8192, 16384, 2048},  /* gemma-2b gate / up */
        {8192, 32768, 2048},  /* a vocabulary tile of gemma-2b's unembedding */
    };
    static const int64_t smoke[][3] = {{64, 48, 32}, {32, 64, 96}};
    const int64_t(*shapes)[3] = g_smoke ? smoke : full;
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_double(doc, "device_peak_bf16_tflops", PEAK_TFLOPS, "%.1f");
    cJSON *rows = mt_json_add_array(doc, "gemm");
    if (write_doc(dir, "gemm.json", doc, bad || !rows)) {
        cJSON_Delete(doc);
        return 1;
    }
    cublasLtHandle_t lt;
    cublasLtCreate(&lt);
    void *ws = dalloc_fill((size_t)32 << 20);
    const int ns = g_smoke ? (int)(sizeof smoke / sizeof smoke[0]) : (int)(sizeof full / sizeof full[0]);
    for (int s = 0; s < ns; s++) {
        gemm_ctx c;
        memset(&c, 0, sizeof c);
        c.M = shapes[s][0];
        c.N = shapes[s][1];
        c.K = shapes[s][2];
        c.lt = lt;
        c.ws = ws;
        c.A = dalloc_fill((size_t)(c.M * c.K) * 4);
        c.B = dalloc_fill((size_t)(c.N * c.K) * 4);
        c.C = dalloc_fill((size_t)(c.M * c.N) * 4);
        const double flop = 2.0 * c.M * c.N * c.K;
        c.dt = MT_F32;
        const double t_ours = time_ms(gemm_ours, &c, 5);
        double t_ours_bf16 = NAN, t_f32 = NAN, t_bf16 = NAN;
        if (mt_backend_has_dtype(&G->caps, MT_BF16)) { /* the fp32 buffers read as bf16, as below */
            c.dt = MT_BF16;
            t_ours_bf16 = time_ms(gemm_ours, &c, 5);
        }
        if (direct_setup(&c, CUDA_R_32F, c.A, c.B, c.C)) t_f32 = time_ms(gemm_direct, &c, 5);
        direct_teardown(&c);
        /* bf16 reuses the fp32 buffers (read as bf16 pairs: finite values but for ~1/256) */
        if (direct_setup(&c, CUDA_R_16BF, c.A, c.B, c.C)) t_bf16 = time_ms(gemm_direct, &c, 5);
        direct_teardown(&c);
        cJSON *row = mt_json_add_object(rows, NULL); /* TFLOP/s with two decimals, null: not measured */
        bad |= mt_json_add_int(row, "M", c.M);
        bad |= mt_json_add_int(row, "N", c.N);
        bad |= mt_json_add_int(row, "K", c.K);
        bad |= mt_json_add_double(row, "meshtrain_fp32_tflops", flop / t_ours / 1e9, "%.2f");
        bad |= mt_json_add_double(row, "meshtrain_bf16_tflops", flop / t_ours_bf16 / 1e9, "%.2f");
        bad |= mt_json_add_double(row, "cublaslt_fp32_tflops", flop / t_f32 / 1e9, "%.2f");
        bad |= mt_json_add_double(row, "cublaslt_bf16_tflops", flop / t_bf16 / 1e9, "%.2f");
        bad |= write_doc(dir, "gemm.json", doc, bad);
        cudaFree(c.A);
        cudaFree(c.B);
        cudaFree(c.C);
    }
    cJSON_Delete(doc);
    cudaFree(ws);
    cublasLtDestroy(lt);
    return bad ? 1 : 0;
}

/* ---- attention ---- */

typedef struct att_ctx {
    mt_attn_args a;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv; /* of a.dtype */
    float *lse;
} att_ctx;

static void att_fwd(void *p) {
    att_ctx *c = p;
    TOOL_OK(G->ops->attention_fwd(G, &c->a, c->o, c->lse, c->q, c->k, c->v));
}

static void att_bwd(void *p) {
    att_ctx *c = p;
    TOOL_OK(G->ops->attention_bwd(G, &c->a, c->dq, c->dk, c->dv, c->dout, c->q, c->k, c->v, c->o, c->lse));
}

static int bench_attention(const char *dir) {
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_bool(doc, "causal", 1);
    bad |= mt_json_add_double(doc, "target_fwd_bwd_tflops_hd128", 330.0, "%.0f"); /* FlashAttention-2, H100 */
    cJSON *rows = mt_json_add_array(doc, "attention");
    if (write_doc(dir, "attention.json", doc, bad || !rows)) {
        cJSON_Delete(doc);
        return 1;
    }
    static const int64_t full[][4] = {{128, 4096, 16, 8}, {128, 8192, 16, 8}, {256, 4096, 8, 4}, {256, 8192, 8, 4}};
    static const int64_t smoke[][4] = {{128, 128, 2, 1}, {64, 96, 2, 2}};
    const int64_t(*cases)[4] = g_smoke ? smoke : full;
    const int ncases = g_smoke ? 2 : 4;
    for (int i = 0; i < 2 * ncases; i++) {
        const mt_dtype dt = i < ncases ? MT_F32 : MT_BF16;
        if (dt == MT_BF16 && !mt_backend_has_dtype(&G->caps, MT_BF16)) break;
        att_ctx c;
        memset(&c, 0, sizeof c);
        const int64_t *cs = cases[i % ncases];
        const int64_t Dh = cs[0], T = cs[1], H = cs[2], Hkv = cs[3], B = 1;
        c.a = (mt_attn_args){.B = B, .Tq = T, .Tk = T, .H = H, .Hkv = Hkv, .Dh = Dh,
                             .scale = (float)(1.0 / sqrt((double)Dh)), .softcap = 0.0f, .window = 0, .dtype = dt};
        const int64_t nq = B * T * H * Dh, nk = B * T * Hkv * Dh;
        c.q = dalloc_fill_dt(nq, dt), c.o = dalloc_fill_dt(nq, dt), c.dout = dalloc_fill_dt(nq, dt);
        c.dq = dalloc_fill_dt(nq, dt), c.k = dalloc_fill_dt(nk, dt), c.v = dalloc_fill_dt(nk, dt);
        c.dk = dalloc_fill_dt(nk, dt), c.dv = dalloc_fill_dt(nk, dt);
        c.lse = dalloc_fill((size_t)(B * H * T) * 4);
        if (!c.q || !c.o || !c.dout || !c.dq || !c.k || !c.v || !c.dk || !c.dv || !c.lse) {
            fprintf(stderr, "gpu_bench: attention: out of device memory\n");
            return 1;
        }
        att_fwd(&c); /* o and lse of these inputs, as the backward expects */
        const double fwd_flop = 4.0 * B * H * (double)T * T * Dh / 2.0;
        const double tf = time_ms(att_fwd, &c, 2), tb = time_ms(att_bwd, &c, 2);
        cJSON *row = mt_json_add_object(rows, NULL);
        bad |= mt_json_add_string(row, "dtype", dt == MT_BF16 ? "bf16" : "fp32");
        bad |= mt_json_add_int(row, "head_dim", Dh);
        bad |= mt_json_add_int(row, "seq", T);
        bad |= mt_json_add_int(row, "heads", H);
        bad |= mt_json_add_int(row, "kv_heads", Hkv);
        bad |= mt_json_add_double(row, "fwd_ms", tf, "%.3f");
        bad |= mt_json_add_double(row, "bwd_ms", tb, "%.3f");
        bad |= mt_json_add_double(row, "fwd_tflops", fwd_flop / tf / 1e9, "%.2f");
        bad |= mt_json_add_double(row, "bwd_tflops", 2.5 * fwd_flop / tb / 1e9, "%.2f");
        bad |= mt_json_add_double(row, "fwd_bwd_tflops", 3.5 * fwd_flop / (tf + tb) / 1e9, "%.2f");
        bad |= write_doc(dir, "attention.json", doc, bad);
        cudaFree(c.q), cudaFree(c.o), cudaFree(c.dout), cudaFree(c.dq), cudaFree(c.k), cudaFree(c.v);
        cudaFree(c.dk), cudaFree(c.dv), cudaFree(c.lse);
    }
    cJSON_Delete(doc);
    return bad ? 1 : 0;
}

/* ---- training step ---- */

typedef struct step_ctx {
    mt_model *m;
    float *mom, *var;
    mt_adamw_segment *segs; /* device: the parameter table's segments (train/optimizer.h) */
    int nsegs;
    int32_t *tok, *lab;
    int64_t P, ntok, t;
} step_ctx;

static void train_step(void *p) {
    step_ctx *c = p;
    TOOL_OK(G->ops->zero(G, mt_model_grads(c->m), (size_t)c->P * 4));
    double l = 0;
    int64_t n = 0;
    if (mt_model_forward_backward(c->m, c->tok, c->lab, 1.0f / (float)c->ntok, &l, &n) != MT_OK)
        fprintf(stderr, "gpu_bench: step: %s\n", mt_last_error());
    const double norm = sqrt(tool_sumsq(G, mt_model_grads(c->m), c->P));
    const float gs = norm > 1.0 ? (float)(1.0 / norm) : 1.0f;
    c->t++;
    TOOL_OK(G->ops->adamw(G, mt_model_params(c->m), mt_model_grads(c->m), c->mom, c->var, c->segs, c->nsegs, 1e-4f, 0.9f,
                          0.95f, 1e-8f, 0.1f, gs, c->t));
}

/* One training step of model `name` (SOURCE_DIR/configs/models/name.yml) at batch B x
 * seq T in compute dtype dt, appended to rows as an object. Returns 0, or 1 on a
 * failure (printed). */
static int bench_step_model(cJSON *rows, const char *src, const char *name, int64_t B, int64_t T, mt_dtype dt) {
    char path[4096];
    snprintf(path, sizeof path, "%s/configs/models/%s.yml", src, name);
    static mt_train_config cfg;
    if (mt_train_config_load(&cfg, path, 0, NULL) != MT_OK) {
        fprintf(stderr, "gpu_bench: %s: %s\n", path, mt_last_error());
        return 1;
    }
    mt_model_config mc = cfg.model;
    const int64_t full_layers = mc.num_decoder_layers;
    size_t freeb = 0, total = 0;
    cudaMemGetInfo(&freeb, &total);
    mt_model *m = NULL;
    mt_plan *plan = NULL;
    size_t planned = 0;
    const int64_t tiles = 8;
    const mt_model_layout lay = {.dtype = dt};
    for (;;) { /* drop layers until the step fits in 85% of the device */
        if (mt_model_create(&m, &mc, G, B, T, tiles, &lay) != MT_OK ||
            mt_plan_new(&plan) != MT_OK || mt_model_add_to_plan(m, plan) != MT_OK || mt_plan_finalize(plan) != MT_OK) {
            fprintf(stderr, "gpu_bench: %s: %s\n", name, mt_last_error());
            return 1;
        }
        planned = mt_plan_peak(plan) + 2 * (size_t)mt_model_numel(m) * 4 +
                  sizeof(mt_adamw_segment) * (size_t)mt_model_param_count(m);
        if (planned <= total / 100 * 85 || mc.num_decoder_layers <= 1) break;
        mt_plan_free(plan);
        mt_model_free(m);
        mc.num_decoder_layers = mc.num_decoder_layers * 3 / 4;
    }
    cudaDeviceSynchronize();
    cudaMemGetInfo(&freeb, &total);
    const size_t free0 = freeb;
    mt_arena arena;
    if (mt_backend_arena_create(G, &arena, plan) != MT_OK || mt_model_bind(m, &arena, plan) != MT_OK) {
        fprintf(stderr, "gpu_bench: %s: %s\n", name, mt_last_error());
        return 1;
    }
    step_ctx c = {.m = m, .P = mt_model_numel(m), .ntok = B * T};
    c.mom = tool_alloc(G, (size_t)c.P * 4);
    c.var = tool_alloc(G, (size_t)c.P * 4);
    TOOL_OK(G->ops->zero(G, c.mom, (size_t)c.P * 4));
    TOOL_OK(G->ops->zero(G, c.var, (size_t)c.P * 4));
    { /* the trainer's AdamW: one call over the segments, weight decay on matrices */
        const int np = mt_model_param_count(m);
        mt_param_info *pt = malloc(sizeof(mt_param_info) * (size_t)np);
        mt_adamw_segment *ht = malloc(sizeof(mt_adamw_segment) * (size_t)np);
        c.segs = tool_alloc(G, sizeof(mt_adamw_segment) * (size_t)np);
        if (!pt || !ht || !c.segs) {
            fprintf(stderr, "gpu_bench: %s: out of memory for the segment table\n", name);
            return 1;
        }
        for (int i = 0; i < np; i++) pt[i] = *mt_model_param(m, i);
        TOOL_OK(mt_adamw_segments(pt, np, ht, &c.nsegs));
        TOOL_OK(G->ops->copy_to_device(G, c.segs, ht, sizeof(mt_adamw_segment) * (size_t)c.nsegs));
        free(pt);
        free(ht);
    }
    /* mt_model_init_params draws billions of normals on the host (a minute at 8B):
     * the timing needs only realistic magnitudes, so parameters are a repeated random
     * pattern times 0.02 (the init's std). */
    fill_random(mt_model_params(m), (size_t)c.P * 4);
    TOOL_OK(G->ops->scale(G, mt_model_params(m), 0.02f, c.P, MT_F32));
    c.tok = malloc((size_t)(B * T) * sizeof(int32_t));
    c.lab = malloc((size_t)(B * T) * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) {
        c.tok[i] = (int32_t)((i * 7919) % mc.vocab_size);
        c.lab[i] = (int32_t)((i * 104729 + 1) % mc.vocab_size);
    }
    const double ms = time_ms(train_step, &c, 3);
    cudaDeviceSynchronize();
    cudaMemGetInfo(&freeb, &total);
    const size_t measured = free0 - freeb;
    const double N = (double)c.P;
    const double L = (double)mc.num_decoder_layers;
    const double flop_tok = 6.0 * N + 6.0 * L * mc.num_query_heads * mc.head_dim * (double)T;
    const double tps = (double)(B * T) / (ms / 1e3);
    cJSON *row = mt_json_add_object(rows, NULL);
    int bad = mt_json_add_string(row, "model", name);
    bad |= mt_json_add_string(row, "dtype", dt == MT_BF16 ? "bf16" : "fp32");
    bad |= mt_json_add_int(row, "layers", mc.num_decoder_layers);
    bad |= mt_json_add_int(row, "full_layers", full_layers);
    bad |= mt_json_add_int(row, "params", c.P);
    bad |= mt_json_add_int(row, "batch", B);
    bad |= mt_json_add_int(row, "seq", T);
    bad |= mt_json_add_int(row, "vocab_tiles", tiles);
    bad |= mt_json_add_double(row, "step_ms", ms, "%.2f");
    bad |= mt_json_add_double(row, "tokens_per_s", tps, "%.1f");
    bad |= mt_json_add_double(row, "model_tflops", flop_tok * tps / 1e12, "%.2f");
    bad |= mt_json_add_double(row, "mfu", flop_tok * tps / 1e12 / PEAK_TFLOPS, "%.4f");
    bad |= mt_json_add_size(row, "planned_bytes", planned);
    bad |= mt_json_add_size(row, "measured_bytes", measured);
    bad |= mt_json_add_size(row, "device_bytes", total);
    G->ops->release(G, c.mom);
    G->ops->release(G, c.var);
    G->ops->release(G, c.segs);
    free(c.tok);
    free(c.lab);
    mt_arena_destroy(&arena);
    mt_plan_free(plan);
    mt_model_free(m);
    return bad ? 1 : 0;
}

static int bench_step(const char *dir, const char *src) {
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_double(doc, "peak_tflops", PEAK_TFLOPS, "%.1f");
    bad |= mt_json_add_string(doc, "flops_per_token", "6N + 6 L H Dh T");
    cJSON *rows = mt_json_add_array(doc, "step");
    int rc = write_doc(dir, "step.json", doc, bad || !rows);
    for (int i = 0; !rc && i < (g_smoke ? 2 : 4); i++) {
        const mt_dtype dt = i % 2 ? MT_BF16 : MT_F32;
        if (dt == MT_BF16 && !mt_backend_has_dtype(&G->caps, MT_BF16)) continue;
        if (g_smoke)
            rc |= bench_step_model(rows, src, "llama3-tiny", 1, 64, dt);
        else
            rc |= i < 2 ? bench_step_model(rows, src, "gemma-2b", 2, 2048, dt)
                        : bench_step_model(rows, src, "llama3.1-8b", 1, 4096, dt);
        rc |= write_doc(dir, "step.json", doc, 0);
    }
    cJSON_Delete(doc);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_bench OUTDIR [SOURCE_DIR]\n");
        return 2;
    }
    if (mt_backend_create(MT_BACKEND_CUDA, &G) != MT_OK) G = NULL;
    if (!G) {
        fprintf(stderr, "gpu_bench: no CUDA device\n");
        return 77;
    }
#ifdef MT_SOURCE_DIR
    const char *src = argc > 2 ? argv[2] : MT_SOURCE_DIR;
#else
    const char *src = argc > 2 ? argv[2] : ".";
#endif
    int rc = 0;
    const char *smoke = getenv("MT_GPU_BENCH_SMOKE");
    g_smoke = smoke && strcmp(smoke, "1") == 0;
    const char *only = getenv("MT_GPU_BENCH_ONLY"); /* gemm | attention | step */
    if (!only || !strcmp(only, "gemm")) rc |= bench_gemm(argv[1]);
    fprintf(stderr, "gpu_bench: gemm done\n");
    if (!only || !strcmp(only, "attention")) rc |= bench_attention(argv[1]);
    fprintf(stderr, "gpu_bench: attention done\n");
    if (!only || !strcmp(only, "step")) rc |= bench_step(argv[1], src);
    fprintf(stderr, "gpu_bench: step done\n");
    return rc;
}
