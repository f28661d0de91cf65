/* tests/tools/mpi_layout.c: runs a few training steps of one mesh layout and dumps what
 * the layout tests compare (tests/test_mpi_layouts.sh).
 *
 *   mpi_layout data DIR               deterministic tiny llm.c shards (train + val)
 *   mpi_layout run OUT CONFIG [k=v]   `steps` steps (>= 3; at most 64 dumped); rank 0 writes
 *                                     OUT/index.txt (name offset numel per parameter),
 *                                     OUT/loss.txt (loss of each step, %.17g),
 *                                     OUT/grad.bin (mean gradient of step 1, fp32;
 *                                     grad2.bin, grad3.bin, ...: the later steps),
 *                                     OUT/chain.txt (term counts S_loss S_grad of
 *                                     tests/test_bounds.h, learning rate, adam_eps,
 *                                     adam_b2, adam_b1),
 *                                     OUT/params.bin (parameters after the last step,
 *                                     fp32; compare assumes steps = 3);
 *                                     every rank writes OUT/bytes.<rank>.txt
 *                                     ("measured formula" bytes sent in each step)
 *   mpi_layout run-kappa OUT CONFIG [k=v]
 *                                     run (one process), with every parameter times
 *                                     1 + eta xi before step 1 (tests/test_bounds.h:
 *                                     the condition of what compare checks); the
 *                                     injected perturbation is subtracted from
 *                                     params.bin again, so that it holds the updates'
 *                                     response only; OUT/p0.bin: the unperturbed
 *                                     initial parameters
 *   mpi_layout run-acc OUT CONFIG [k=v]
 *                                     run (one process, the model's full gradient
 *                                     buffer), and before each step s the step's K
 *                                     micro-batches again through the model at its
 *                                     parameters (a second loader over the same
 *                                     windows): OUT/acc<s>.bin = sum_k |G_k| / N
 *                                     elementwise (G_k = g_1 + ... + g_k, the partial
 *                                     sums a grad_dtype accumulator rounds, g_k the
 *                                     gradient of micro-batch k's summed token loss, N
 *                                     the step's labelled tokens: the mean gradient's
 *                                     scale), OUT/acc.txt = K; with a last argument
 *                                     acc_groups=R, micro-batch k's partial sums are
 *                                     those of group k mod R (R data-parallel ranks'
 *                                     accumulators, each reading every R-th window)
 *                                     and acc.txt = K / R; for bounds ACC_DTYPE and
 *                                     compare derived-bf16acc
 *   mpi_layout run-full-grads OUT CONFIG [k=v]
 *                                     run, with the model's full gradient buffer instead
 *                                     of the gradient windows (parallel/zero1.h): the
 *                                     behaviour before windows, as a reference
 *   mpi_layout plan CONFIG [k=v]      the trainer's own plan of rank 0 of the layout
 *                                     (no mpirun): "params P grads G optimizer O
 *                                     peak K maxgrad M maxwin NAME chunks C ple_chunks E"
 *                                     (bytes; P = sum of the params entries, M = the
 *                                     largest gradient entry, NAME the largest parameter
 *                                     or gradient window, C the vocabulary chunks, E
 *                                     gemma4's per-layer embedding table chunks, 0 for
 *                                     other models) "maxple B gwlayer W" (B the largest
 *                                     window of gemma4's per-layer-input globals or of a
 *                                     chunk of their table, W the layer gradient window:
 *                                     the largest layer parameter, 0 when there is none)
 *   mpi_layout bounds REF K [ACC_DTYPE]
 *                                     the derived bounds of REF's first K steps (with
 *                                     REF_kappa): "step loss grad_norm" relative;
 *                                     with ACC_DTYPE (bfloat16) those of a run that
 *                                     differs from REF in its gradient accumulator's
 *                                     dtype too (REF from run-acc: derive_bounds)
 *   mpi_layout compare REF RUN TOL [PABS]
 *                                     loss, every parameter's gradient and every
 *                                     parameter after 3 steps: relative error
 *                                     ||a - b|| / ||b|| per tensor <= TOL; with PABS
 *                                     the parameters instead elementwise
 *                                     |a - b| <= PABS (absolute); exit 1 if not.
 *                                     TOL = derived: the fp32 bounds derived from REF's
 *                                     perturbed run REF_kappa (run-kappa; cmd_compare
 *                                     says how), per tensor and per step; derived=BASE:
 *                                     the condition from the fp32 pair BASE and
 *                                     BASE_kappa (a bf16 REF of the same model);
 *                                     TOL = rounded=M:BASE (with PABS): a bf16 layout
 *                                     whose collectives round each summed element up
 *                                     to M times otherwise than REF, bounded with
 *                                     BASE's condition (rounded_bounds);
 *                                     TOL = derived-bf16acc[=BASE]: derived, for a RUN
 *                                     with bf16 gradient accumulators against REF from
 *                                     run-acc (derive_bounds' uacc)
 * Per-tensor norms rather than elementwise: a gradient element near zero has no
 * meaningful relative error, the tensor as a whole does. PABS is for parameters that
 * start at zero (Gemma's norm scales, 1 + w): their norm after k Adam steps is about
 * k lr sqrt(n), so a relative error says little, and an elementwise bound on the
 * difference of two Adam trajectories does (tests/test_mpi_layouts.sh). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "models/model.h"
#include "train/config.h"
#include "train/data.h"
#include "train/trainer.h"
#include "tests/test_bounds.h"

#define MAXSTEPS 64 /* steps a run dumps (losses and gradients) */

static int die(const char *what) {
    fprintf(stderr, "mpi_layout: %s: %s\n", what, mt_last_error());
    return 1;
}

static int cmd_data(const char *dir) {
    mkdir(dir, 0755);
    /* A noisy repeating pattern over 64 ids: learnable, deterministic. */
    const int64_t n = 20000;
    uint32_t *tok = malloc(sizeof(uint32_t) * (size_t)n);
    uint64_t s = 12345;
    for (int64_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        tok[i] = (uint32_t)((i * 7 + (int64_t)((s >> 33) % 5)) % 64);
    }
    char p[1024];
    snprintf(p, sizeof p, "%s/train_000.bin", dir);
    if (mt_data_write_shard(p, tok, n, 0) != MT_OK) return die(p);
    snprintf(p, sizeof p, "%s/val_000.bin", dir);
    if (mt_data_write_shard(p, tok + 1000, 4000, 0) != MT_OK) return die(p);
    free(tok);
    return 0;
}

static int write_floats(const char *path, const float *x, int64_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof(float), (size_t)n, f) != (size_t)n) return 1;
    return fclose(f) != 0;
}

/* 1 (with a message) when the plan's step bytes (mt_trainer_plan_ex: the formula made
 * from the planned model of rank 0, what the estimator's step model uses) differ from
 * rank 0's formula in the running trainer; layouts with a -1 axis are not planned
 * (the plan reads -1 as 1). */
static int plan_bytes_differ(const mt_train_config *cfg, uint64_t form) {
    if (cfg->ici_data_parallelism < 1 || cfg->ici_fsdp_parallelism < 1 || cfg->ici_context_parallelism < 1 ||
        cfg->ici_tensor_parallelism < 1)
        return 0;
    mt_plan *plan = NULL;
    uint64_t pb = 0;
    if (mt_trainer_plan_ex(cfg, &plan, NULL, NULL, &pb, NULL) != MT_OK) return die("plan");
    mt_plan_free(plan);
    if (pb == form) return 0;
    fprintf(stderr, "mpi_layout: the plan's step bytes %llu differ from the running trainer's formula %llu\n",
            (unsigned long long)pb, (unsigned long long)form);
    return 1;
}

/* run-acc, before step s (s from 1): the step's K micro-batches read from dl (a second
 * loader over the trainer's windows in the trainer's order) and run through the
 * trainer's model m at its current parameters, each gradient g_k of the summed token
 * loss in m's full gradient buffer; OUT/acc<s>.bin gets sum_k |G_k| / N elementwise,
 * G_k the partial sum of micro-batch k's group (k mod groups) up to k: with groups = 1
 * g_1 + ... + g_k; with groups = R the accumulators of R data-parallel ranks that each
 * read every R-th of these windows (fp64 sums, N the labelled tokens of the K
 * micro-batches). The trainer's step zeroes the gradients and the step statistics
 * before it uses them, so this pass leaves its step unchanged. */
static int acc_partials(mt_model *m, mt_data_loader *dl, const mt_train_config *cfg, int s, const char *out,
                        int32_t *tok, int32_t *lab, float *buf, double *G, double *sum, int groups) {
    mt_backend *be = mt_model_backend(m);
    const int64_t numel = mt_model_numel(m);
    double count = 0;
    memset(G, 0, sizeof(double) * (size_t)(numel * groups));
    memset(sum, 0, sizeof(double) * (size_t)numel);
    mt_model_set_compute_rounding(m, (uint64_t)cfg->seed, s - 1); /* as the trainer's step s */
    for (int64_t k = 0; k < cfg->gradient_accumulation_steps; k++) {
        double st[MT_MODEL_STATS];
        if (be->ops->zero(be, mt_model_grads(m), sizeof(float) * (size_t)numel) != MT_OK ||
            be->ops->zero(be, mt_model_step_stats(m), sizeof st) != MT_OK || mt_data_next(dl, tok, lab) != MT_OK ||
            mt_model_forward_backward_acc(m, tok, lab, 1.0f) != MT_OK ||
            be->ops->copy_to_host(be, buf, mt_model_grads(m), sizeof(float) * (size_t)numel) != MT_OK ||
            be->ops->copy_to_host(be, st, mt_model_step_stats(m), sizeof st) != MT_OK || be->ops->sync(be) != MT_OK)
            return die("micro-batch gradient");
        count += st[1];
        double *Gg = G + (k % groups) * numel; /* micro-batch k's group: its rank's accumulator */
        for (int64_t j = 0; j < numel; j++) {
            Gg[j] += buf[j];
            sum[j] += fabs(Gg[j]);
        }
    }
    for (int64_t j = 0; j < numel; j++) buf[j] = (float)(sum[j] / count);
    char path[1024];
    snprintf(path, sizeof path, "%s/acc%d.bin", out, s);
    return write_floats(path, buf, numel) ? die(path) : 0;
}

/* full_grads: the model's full gradient buffer instead of the gradient windows the
 * trainer would choose (mt_trainer_create_ex): the pre-window behaviour, as reference.
 * kappa: the perturbed run of run-kappa (one process, parameters in the model's flat
 * buffer). Every run writes OUT/chain.txt: the term counts S of tests/test_bounds.h
 * to the loss (the logits, the cross-entropy's V + 2) and to a parameter gradient
 * (the rows of a step, N, in the weight gradient's sum). */
static int cmd_run(const char *out, const char *config, int n, const char *const *ov, int full_grads, int kappa,
                   int acc) {
    int groups = 1; /* run-acc: acc_groups=R (not a config key) */
    if (acc && n > 0 && strncmp(ov[n - 1], "acc_groups=", 11) == 0) groups = atoi(ov[--n] + 11);
    if (groups < 1) return fprintf(stderr, "mpi_layout: acc_groups must be >= 1\n"), 2;
    mt_train_config cfg;
    if (mt_train_config_load(&cfg, config, n, ov) != MT_OK) return die("config");
    mt_trainer *t = NULL;
    mt_status st = mt_trainer_create_ex(&t, &cfg, full_grads);
    if (st != MT_OK) {
        fprintf(stderr, "mpi_layout: %s\n", mt_last_error());
        return mt_status_exit_code(st);
    }
    const int rank = mt_trainer_world_rank(t);
    mt_model *m = mt_trainer_model(t);
    const int64_t numel = mt_model_numel(m);
    float *buf = malloc(sizeof(float) * (size_t)numel), *p0 = NULL, *pk = NULL;
    const int K = (int)(cfg.steps < MAXSTEPS ? cfg.steps : MAXSTEPS); /* compare reads the first 3 */
    double loss[MAXSTEPS];
    char path[1024], bytes_txt[512] = "";
    mkdir(out, 0755);
    if (kappa) {
        mt_backend *be = mt_model_backend(m);
        p0 = malloc(sizeof(float) * (size_t)numel);
        pk = malloc(sizeof(float) * (size_t)numel);
        if (be->ops->copy_to_host(be, p0, mt_model_params(m), (size_t)numel * sizeof(float)) != MT_OK ||
            be->ops->sync(be) != MT_OK)
            return die("read parameters");
        memcpy(pk, p0, sizeof(float) * (size_t)numel);
        tu_perturb_values(pk, numel, 29);
        if (be->ops->copy_to_device(be, mt_model_params(m), pk, (size_t)numel * sizeof(float)) != MT_OK ||
            be->ops->sync(be) != MT_OK)
            return die("write parameters");
        snprintf(path, sizeof path, "%s/p0.bin", out);
        if (write_floats(path, p0, numel)) return die(path);
    }
    {
        const mt_model_config *c = mt_model_get_config(m);
        const int64_t T = cfg.max_target_length, N = cfg.per_device_batch_size * T * cfg.gradient_accumulation_steps;
        snprintf(path, sizeof path, "%s/chain.txt", out);
        FILE *f = fopen(path, "w");
        if (!f) return die(path);
        fprintf(f, "%lld %lld %.17g %.17g %.17g %.17g\n", (long long)(tu_chain_terms(c, T, 0, 0) + c->vocab_size + 2),
                (long long)tu_chain_terms(c, T, 1, N), cfg.learning_rate, cfg.adam_eps, cfg.adam_b2, cfg.adam_b1);
        fclose(f);
    }
    mt_data_loader *dl = NULL; /* run-acc: the micro-batches again */
    int32_t *tok = NULL, *lab = NULL;
    double *G = NULL, *sum = NULL;
    if (acc) {
        mt_data_options opt;
        const int64_t bt = cfg.per_device_batch_size * cfg.max_target_length;
        mt_trainer_data_options(&cfg, "train", &opt);
        if (mt_trainer_world_rank(t) != 0 || !mt_model_grads(m)) return die("run-acc runs one process");
        if (mt_data_open_ex(&dl, cfg.dataset_path, "train", &opt, cfg.per_device_batch_size, cfg.max_target_length, 0,
                            1) != MT_OK)
            return die("data");
        tok = malloc(sizeof(int32_t) * (size_t)bt);
        lab = malloc(sizeof(int32_t) * (size_t)bt);
        G = malloc(sizeof(double) * (size_t)(numel * groups));
        sum = malloc(sizeof(double) * (size_t)numel);
        snprintf(path, sizeof path, "%s/acc.txt", out);
        FILE *f = fopen(path, "w");
        if (!f) return die(path);
        if (cfg.gradient_accumulation_steps % groups) return fprintf(stderr, "mpi_layout: acc_groups\n"), 2;
        fprintf(f, "%lld\n", (long long)(cfg.gradient_accumulation_steps / groups));
        fclose(f);
    }
    for (int s = 0; s < K; s++) {
        mt_step_metrics sm;
        if (acc && acc_partials(m, dl, &cfg, s + 1, out, tok, lab, buf, G, sum, groups)) return 1;
        if (mt_trainer_step(t, &sm) != MT_OK) return die("step");
        loss[s] = sm.loss;
        uint64_t meas = 0, form = 0;
        mt_trainer_step_bytes(t, &meas, &form);
        if (s == 0 && rank == 0 && !full_grads && plan_bytes_differ(&cfg, form)) return 1;
        size_t len = strlen(bytes_txt);
        snprintf(bytes_txt + len, sizeof bytes_txt - len, "%llu %llu\n", (unsigned long long)meas,
                 (unsigned long long)form);
        /* every step's gradient: compare checks step 1's and bounds the parameters
         * with all three */
        if (mt_trainer_gather_grad(t, buf) != MT_OK) return die("gather grad");
        if (s == 0) snprintf(path, sizeof path, "%s/grad.bin", out);
        else snprintf(path, sizeof path, "%s/grad%d.bin", out, s + 1);
        if (rank == 0 && write_floats(path, buf, numel)) return die(path);
    }
    /* every rank joins the gather (fsdp: each holds a shard) */
    if (mt_trainer_gather_params(t, buf) != MT_OK) return die("gather params");
    snprintf(path, sizeof path, "%s/bytes.%d.txt", out, rank);
    FILE *f = fopen(path, "w");
    if (!f) return die(path);
    fputs(bytes_txt, f);
    fclose(f);
    if (kappa) /* the injected perturbation out again (fp64, then one rounding) */
        for (int64_t i = 0; i < numel; i++) buf[i] = (float)((double)buf[i] - ((double)pk[i] - (double)p0[i]));
    free(p0);
    free(pk);
    free(tok), free(lab), free(G), free(sum);
    mt_data_close(dl);
    if (rank == 0) {
        snprintf(path, sizeof path, "%s/params.bin", out);
        if (write_floats(path, buf, numel)) return die(path);
        snprintf(path, sizeof path, "%s/loss.txt", out);
        f = fopen(path, "w");
        for (int s = 0; s < K; s++) fprintf(f, "%.17g\n", loss[s]);
        fclose(f);
        snprintf(path, sizeof path, "%s/index.txt", out);
        f = fopen(path, "w");
        for (int i = 0; i < mt_model_param_count(m); i++) {
            const mt_param_info *p = mt_model_param(m, i);
            fprintf(f, "%s %lld %lld\n", p->name, (long long)p->offset, (long long)p->numel);
        }
        fclose(f);
    }
    free(buf);
    mt_trainer_free(t);
    return 0;
}

static int cmd_plan(const char *config, int n, const char *const *ov) {
    mt_train_config cfg;
    if (mt_train_config_load(&cfg, config, n, ov) != MT_OK) return die("config");
    mt_plan *plan = NULL;
    int64_t np = 0;
    int64_t vt[3] = {0, 0, 0};
    if (mt_trainer_plan_ex(&cfg, &plan, NULL, &np, NULL, vt) != MT_OK) return die("plan");
    size_t tot[MT_MEM_CATEGORY_COUNT], maxgrad = 0, maxwin = 0, maxple = 0, gwlayer = 0;
    const char *win = "none";
    mt_plan_total_by_category(plan, tot);
    for (int i = 0; i < mt_plan_count(plan); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(plan, i);
        if (e->category == MT_MEM_GRADS && e->bytes > maxgrad) maxgrad = e->bytes;
        if (!strcmp(e->name, "grads.window.layer")) gwlayer = e->bytes;
        if (strstr(e->name, "window.per_layer_inputs") || strstr(e->name, "window.vocab.per_layer_embedding"))
            maxple = e->bytes > maxple ? e->bytes : maxple;
        if ((!strncmp(e->name, "params.window.", 14) || !strncmp(e->name, "grads.window.", 13)) &&
            e->bytes > maxwin) {
            maxwin = e->bytes;
            win = e->name;
        }
    }
    printf("params %zu grads %zu optimizer %zu peak %zu maxgrad %zu maxwin %s chunks %lld ple_chunks %lld "
           "maxple %zu gwlayer %zu\n", tot[MT_MEM_PARAMS], tot[MT_MEM_GRADS], tot[MT_MEM_OPTIMIZER], mt_plan_peak(plan),
           maxgrad, win, (long long)vt[1], (long long)vt[2], maxple, gwlayer);
    mt_plan_free(plan);
    return 0;
}

static float *read_floats(const char *dir, const char *name, int64_t n) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    float *x = malloc(sizeof(float) * (size_t)n);
    if (!f || fread(x, sizeof(float), (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "mpi_layout: cannot read %s\n", p);
        exit(1);
    }
    fclose(f);
    return x;
}

/* Relative norm ||a - b|| / ||b|| of x[off, off + cnt) (the absolute norm if b is 0). */
static double rel_norm(const float *a, const float *b, long long off, long long cnt) {
    double d = 0, r = 0;
    for (long long j = off; j < off + cnt; j++) {
        const double dj = (double)a[j] - b[j];
        d += dj * dj;
        r += (double)b[j] * b[j];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static int read_losses(const char *dir, double *l, int K) {
    char p[1024];
    snprintf(p, sizeof p, "%s/loss.txt", dir);
    FILE *f = fopen(p, "r");
    for (int s = 0; s < K; s++)
        if (!f || fscanf(f, "%lf", &l[s]) != 1) return fprintf(stderr, "bad %s\n", p), 1;
    fclose(f);
    return 0;
}

/* tol < 0 (TOL = derived): two fp32 runs of the same math in other summation orders
 * (the layouts change only where and in what order the sums are done), each quantity
 * held to a bound derived from tests/test_bounds.h (lambda = 6, u = 2^-24):
 *   S from REF/chain.txt: S_loss to a step-1 loss, S_grad to a step-1 gradient; a
 *     step-m gradient's chain runs through m - 1 updates more (m S_grad);
 *   kappa per tensor: BASE_kappa's step-1 gradient against BASE's (run-kappa: every
 *     parameter times 1 + eta xi), the change over eta, relative in the norm (kappa2)
 *     and in the largest element (kappaM); BASE = REF unless given (derived=BASE: the
 *     fp32 run of a bf16 REF's model);
 *   step-1 gradient of a tensor: 2 lambda sqrt(S_grad) u kappa2, relative norm;
 *   parameters after step 3, elementwise (AdamW; g_m the reference's step-m gradient):
 *     element i's gradient difference at step m is at most
 *       D_mi = 2 lambda sqrt(m S_grad) u kappaM max|g_m| (its tensor's rounding)
 *            + |gk_i - g_i| / eta (|dp_{m-1}| / |p|) (the earlier parameter difference
 *              dp, global norm, taken as a relative perturbation of the parameters:
 *              the element's own response in the perturbed run, scaled to its size)
 *            + |g_mi| |D_m| / |g_m| (gradient clipping's scale, moved by at most the
 *              global relative difference);
 *     the bias-corrected moments move by at most D = max_{j <= m} D_ji (convex
 *     combinations: m^ directly, sqrt(v^) a weighted l2 norm), so the update
 *     m^ / (sqrt(v^) + eps) by at most D / (s + eps) + |m^| D / ((s + eps) (s - D + eps))
 *     with s = sqrt(v^) from the reference's gradients and |m^| <= 1.003 s (b1 = 0.9,
 *     b2 = 0.95, steps <= 3); the parameter by lr times that per step (weight decay
 *     shrinks differences: 1 - lr wd <= 1): dp_mi, summed over the steps. Elements whose
 *     sqrt(v^) is near eps make the bound large (up to lr D / eps): the reason for
 *     adam_eps = 1e-5 in these tests;
 *   loss of step s: 2 lambda sqrt(S_loss + (s - 1) S_grad) u kappa_L (kappa_L: BASE's
 *     loss change over eta, at least its first-order expectation
 *     sqrt(sum_i (p0_i g_i)^2) / |L|, so that one draw that cancels cannot make it
 *     small), plus, from s = 2, lambda sqrt(sum_i (g_si dp_{s-1,i})^2) / |L| (the
 *     loss's response to dp; the elements' differences come from independent
 *     roundings, so the signed sum adds in quadrature, as in the model);
 *   a run whose gradient accumulator has unit roundoff uacc > 0 (bounds REF K bfloat16,
 *     REF from run-acc; the reference accumulates in fp32): it holds A_k =
 *     r(fl32(A_{k-1} + g_k)) after micro-batch k where the reference holds the fp32 sum
 *     F_k of the partial sum G_k = g_1 + ... + g_k; round to nearest errs by at most u
 *     relative (|r(x) - x| <= u |x|, Higham, "Accuracy and Stability of Numerical
 *     Algorithms", 2nd ed., Thm 2.2), so |A_k - F_k| <= (1 + v) |A_{k-1} - F_{k-1}| +
 *     v |G_k| with v = uacc + 2^-22 (the accumulator's rounding, the fp32 add before it
 *     and the reference's own fp32 add, 2^-24 each, with their cross terms), and after
 *     K micro-batches |A_K - F_K| <= v (1 + v)^(K - 1) sum_k |G_k|: per element and per
 *     step m, that times REF/acc<m>.bin (sum_k |G_k| / N, the mean gradient's scale)
 *     adds to D_mi; it is a worst case per element (every rounding the full u), and the
 *     elements' roundings are independent, so the responses above still add in
 *     quadrature. */
/* The derived bounds (above) of the first K steps of REF: lbound[K] (each step's loss,
 * relative), gnbound[K] (each step's gradient norm, relative), gbound[np] (the step-1
 * gradient of each tensor, relative norm), pel[numel] (each parameter after K steps,
 * absolute); when mdiff is not NULL also the AdamW moments after K steps, elementwise:
 * mdiff, vdiff[numel] (bounds on their differences: m = b1 m + (1 - b1) g moves by
 * b1 dm + (1 - b1) D, v = b2 v + (1 - b2) g^2 by b2 dv + (1 - b2)(2 |g| D + D^2), D the
 * step's gradient difference bound) and mref, vref[numel] (the reference's moments);
 * kbase: the fp32 run whose perturbed twin kbase_kappa gives the conditions; uacc:
 * the unit roundoff of the compared run's gradient accumulator (0: fp32, as REF's).
 * Returns 1 (with a message) on a missing file. */
static int derive_bounds(const char *ref, const char *kbase, int K, int np, const long long *off,
                         const long long *cnt, double *lbound, double *gnbound, double *gbound, double *pel,
                         double *mdiff, double *vdiff, double *mref, double *vref, double uacc) {
    char p[1024], kdir[1024];
    const int64_t numel = off[np - 1] + cnt[np - 1];
    snprintf(kdir, sizeof kdir, "%s_kappa", kbase);
    long long S_loss = 0, S_grad = 0;
    double lr = 0, eps = 1, b2 = 0, b1 = 0, lk[MAXSTEPS], lb[MAXSTEPS];
    snprintf(p, sizeof p, "%s/chain.txt", ref);
    FILE *f = fopen(p, "r");
    if (!f || fscanf(f, "%lld %lld %lf %lf %lf %lf", &S_loss, &S_grad, &lr, &eps, &b2, &b1) != 6)
        return fprintf(stderr, "bad %s\n", p), 1;
    fclose(f);
    if (read_losses(kdir, lk, K) || read_losses(kbase, lb, K)) return 1;
    float *p0 = read_floats(kdir, "p0.bin", numel), *gk = read_floats(kdir, "grad.bin", numel);
    float **g = malloc(sizeof(float *) * (size_t)K);
    for (int m = 0; m < K; m++) {
        char name[32];
        if (m == 0) snprintf(name, sizeof name, "grad.bin");
        else snprintf(name, sizeof name, "grad%d.bin", m + 1);
        g[m] = read_floats(kbase, name, numel);
    }
    float **ga = NULL; /* uacc > 0: each step's v (1 + v)^(K - 1) sum_k |G_k| / N (above) */
    if (uacc > 0) {
        long long mb = 0;
        snprintf(p, sizeof p, "%s/acc.txt", ref);
        f = fopen(p, "r");
        if (!f || fscanf(f, "%lld", &mb) != 1 || mb < 1) return fprintf(stderr, "bad %s (run-acc)\n", p), 1;
        fclose(f);
        const double v = uacc + 0x1p-22, c = v * pow(1.0 + v, (double)(mb - 1));
        ga = malloc(sizeof(float *) * (size_t)K);
        for (int m = 0; m < K; m++) {
            char name[32];
            snprintf(name, sizeof name, "acc%d.bin", m + 1);
            ga[m] = read_floats(ref, name, numel);
            for (int64_t j = 0; j < numel; j++) ga[m][j] = (float)(c * ga[m][j]);
        }
    }
    double kappa_an = 0, pnorm = 0;
    for (int64_t j = 0; j < numel; j++) {
        kappa_an += ((double)p0[j] * g[0][j]) * ((double)p0[j] * g[0][j]);
        pnorm += (double)p0[j] * p0[j];
    }
    kappa_an = sqrt(kappa_an) / fabs(lb[0]);
    pnorm = sqrt(pnorm);
    double *kapm = calloc((size_t)np, sizeof(double)), *gmax = calloc((size_t)(K * np), sizeof(double));
    for (int i = 0; i < np; i++) {
        gbound[i] = tu_chain_bound(TU_U_F32, S_grad, rel_norm(gk, g[0], off[i], cnt[i]) / TU_KAPPA_ETA);
        if (ga) { /* the accumulator's rounding, elementwise worst case, as a relative norm */
            double a2 = 0, g2 = 0;
            for (long long j = off[i]; j < off[i] + cnt[i]; j++) {
                a2 += (double)ga[0][j] * ga[0][j];
                g2 += (double)g[0][j] * g[0][j];
            }
            gbound[i] += g2 > 0 ? sqrt(a2 / g2) : sqrt(a2);
        }
        double d = 0, r = 0;
        for (long long j = off[i]; j < off[i] + cnt[i]; j++) {
            d = fmax(d, fabs((double)gk[j] - g[0][j]));
            r = fmax(r, fabs((double)g[0][j]));
        }
        kapm[i] = r > 0 ? d / r / TU_KAPPA_ETA : 0;
        for (int m = 0; m < K; m++)
            for (long long j = off[i]; j < off[i] + cnt[i]; j++)
                gmax[m * np + i] = fmax(gmax[m * np + i], fabs((double)g[m][j]));
    }
    memset(pel, 0, sizeof(double) * (size_t)numel);
    if (mdiff)
        for (int64_t j = 0; j < numel; j++) mdiff[j] = vdiff[j] = mref[j] = vref[j] = 0;
    double *dmax = calloc((size_t)numel, sizeof(double)), *v = calloc((size_t)numel, sizeof(double));
    double dpn = 0; /* global norm of the parameter difference bound after the last step */
    for (int m = 0; m < K; m++) {
        lbound[m] = 0;
        if (m > 0) { /* the loss of step m + 1 sees the parameters after step m */
            double t = 0;
            for (int64_t j = 0; j < numel; j++) t += ((double)g[m][j] * pel[j]) * ((double)g[m][j] * pel[j]);
            lbound[m] = TU_LAMBDA * sqrt(t) / fabs(lb[m]);
        }
        double dn = 0, gn = 0;
        for (int i = 0; i < np; i++)
            for (long long j = off[i]; j < off[i] + cnt[i]; j++) {
                const double d = tu_chain_bound(TU_U_F32, (m + 1) * S_grad, kapm[i]) * gmax[m * np + i] +
                                 fabs((double)gk[j] - g[0][j]) / TU_KAPPA_ETA * (dpn / pnorm) +
                                 (ga ? (double)ga[m][j] : 0.0);
                dn += d * d;
                gn += (double)g[m][j] * g[m][j];
                dmax[j] = fmax(dmax[j], d); /* the clipping term is added below */
            }
        const double rel = gn > 0 ? sqrt(dn / gn) : 0, bc = 1.0 - pow(b2, m + 1);
        gnbound[m] = rel;
        dpn = 0;
        for (int64_t j = 0; j < numel; j++) {
            const double D = dmax[j] + fabs((double)g[m][j]) * rel;
            if (mdiff) {
                mdiff[j] = b1 * mdiff[j] + (1.0 - b1) * D;
                vdiff[j] = b2 * vdiff[j] + (1.0 - b2) * (2.0 * fabs((double)g[m][j]) * D + D * D);
                mref[j] = b1 * mref[j] + (1.0 - b1) * g[m][j];
            }
            v[j] = b2 * v[j] + (1.0 - b2) * (double)g[m][j] * g[m][j];
            if (mdiff) vref[j] = v[j];
            const double sv = sqrt(v[j] / bc);
            /* at most 2 x 1.003 (each direction is at most 1.003 in size) */
            pel[j] += lr * fmin(D / (sv + eps) + 1.003 * sv * D / ((sv + eps) * (fmax(sv - D, 0.0) + eps)), 2.006);
            dpn += pel[j] * pel[j];
        }
        dpn = sqrt(dpn);
    }
    for (int s = 0; s < K; s++) {
        const double kl = fmax(kappa_an, fabs(lk[s] - lb[s]) / fabs(lb[s]) / TU_KAPPA_ETA);
        lbound[s] += tu_chain_bound(TU_U_F32, S_loss + s * S_grad, kl);
    }
    free(kapm), free(gmax), free(dmax), free(v), free(p0), free(gk);
    for (int m = 0; m < K; m++) {
        free(g[m]);
        if (ga) free(ga[m]);
    }
    free(g);
    free(ga);
    return 0;
}

static int read_index(const char *ref, char names[][96], long long *off, long long *cnt) {
    char p[1024];
    snprintf(p, sizeof p, "%s/index.txt", ref);
    FILE *f = fopen(p, "r");
    if (!f) return fprintf(stderr, "mpi_layout: cannot read %s\n", p), -1;
    int np = 0;
    while (np < 512 && fscanf(f, "%95s %lld %lld", names[np], &off[np], &cnt[np]) == 3) np++;
    fclose(f);
    return np;
}

/* mpi_layout bounds REF K [bfloat16]: the derived bounds of REF's first K steps
 * (REF_kappa next to it; with bfloat16, against a run with bf16 gradient accumulators:
 * uacc of derive_bounds), one line per step: "step loss_bound grad_norm_bound" (relative), for the suites
 * that compare the trainer's own metrics (tests/lib.sh mt_fp32_bounds); and
 * REF/tensor_bounds.txt, a line per parameter tensor after step K (REF must have run K
 * steps): "name params adam_m adam_v", the relative norm bounds |bound| / |reference|
 * of the parameter and its two moments (a checkpoint's tensors). */
static int cmd_bounds(const char *ref, int K, double uacc) {
    static char names[512][96];
    long long off[512], cnt[512];
    const int np = read_index(ref, names, off, cnt);
    if (np <= 0 || K < 1 || K > MAXSTEPS) return 1;
    const int64_t numel = off[np - 1] + cnt[np - 1];
    double lb[MAXSTEPS], gnb[MAXSTEPS], *gb = calloc((size_t)np, sizeof(double));
    double *e[5];
    for (int k = 0; k < 5; k++) e[k] = calloc((size_t)numel, sizeof(double));
    int bad = derive_bounds(ref, ref, K, np, off, cnt, lb, gnb, gb, e[0], e[1], e[2], e[3], e[4], uacc);
    for (int s = 0; s < K && !bad; s++) printf("%d %.3e %.3e\n", s + 1, lb[s], gnb[s]);
    if (!bad) {
        float *pr = read_floats(ref, "params.bin", numel);
        char path[1024];
        snprintf(path, sizeof path, "%s/tensor_bounds.txt", ref);
        FILE *f = fopen(path, "w");
        if (!f) bad = 1;
        for (int i = 0; i < np && f; i++) {
            double n[3] = {0, 0, 0}, r[3] = {0, 0, 0};
            for (long long j = off[i]; j < off[i] + cnt[i]; j++) {
                const double ref_of[3] = {pr[j], e[3][j], e[4][j]}, bnd[3] = {e[0][j], e[1][j], e[2][j]};
                for (int k = 0; k < 3; k++) {
                    n[k] += bnd[k] * bnd[k];
                    r[k] += ref_of[k] * ref_of[k];
                }
            }
            fprintf(f, "%s", names[i]);
            for (int k = 0; k < 3; k++) fprintf(f, " %.3e", r[k] > 0 ? sqrt(n[k] / r[k]) : (n[k] > 0 ? INFINITY : 0.0));
            fprintf(f, "\n");
        }
        if (f) fclose(f);
        free(pr);
    }
    free(gb);
    for (int k = 0; k < 5; k++) free(e[k]);
    return bad;
}

/* compare REF RUN rounded=M:BASE PABS: a bf16 layout (dtype=bfloat16) against the
 * one-process bf16 REF, where the layout's activation collectives round each element of
 * their sums up to M times more or otherwise than REF does (M counts both runs'
 * roundings: tests/test_mpi_layouts.sh gives it per layout), everything else the same
 * bf16 math. First order, the difference of a compared value is J eps, eps the relative
 * perturbations of the summed elements: each the sum of at most M independent roundings
 * of mean zero and size <= u = 2^-8 (Higham and Mary 2019, the model of
 * tests/test_bounds.h), so E eps_k^2 <= M u^2. The condition measured on BASE (the fp32
 * run of the same model) and BASE_kappa, every parameter times 1 + eta xi: a weight's
 * perturbation perturbs each product of its GEMM relatively by eta, as a rounding of the
 * GEMM's output does (tests/test_bounds.h), and every GEMM output is reached, the
 * collectives' sums among them; independent perturbations add in quadrature, so a
 * subset of them moves a value less. Hence E |J eps|^2 <= M u^2 (kappa |value|)^2, with
 * kappa = (relative change of the value) / eta:
 *   step-1 gradient of tensor t: 2 sqrt(M) u kappa_t, relative norm (kappa_t: BASE's
 *     relative norm change of that tensor's gradient over eta);
 *   loss of step s: 2 sqrt(M) u kappa_L,s (BASE's loss change over eta, at least its
 *     first-order expectation, as derive_bounds) plus, from s = 2, the response to the
 *     parameter difference, at most PABS (s - 1) / 3 per element after s - 1 of the 3
 *     steps PABS covers: lambda (PABS (s - 1) / 3) |g_s| / |L_s| (g_s REF's gradient,
 *     the elements' differences independent: in quadrature, lambda = 6);
 *   parameters after step 3: PABS elementwise (tests/test_mpi_layouts.sh derives it).
 * The factor 2: |J eps| is one draw of a norm whose square has mean at most
 * M u^2 (kappa |value|)^2; round to nearest's relative error is spread over [-u, u]
 * (rms about u / sqrt(3)), so 2 sqrt(M) u kappa is 2 sqrt(3) = 3.5 times the rms, and
 * even a single Gaussian direction (chi-square of one degree, the least concentrated
 * case) exceeds 3.5 times its rms with probability 5e-4; a tensor's norm over many
 * elements exceeds it far less often. */
static int rounded_bounds(const char *ref, const char *kbase, double M, double pabs, int np, const long long *off,
                          const long long *cnt, double *lbound, double *gbound) {
    char kdir[1024];
    const int64_t numel = off[np - 1] + cnt[np - 1];
    double lk[3], lb[3], lr[3];
    snprintf(kdir, sizeof kdir, "%s_kappa", kbase);
    if (pabs < 0) return fprintf(stderr, "mpi_layout: rounded=M:BASE needs PABS\n"), 1;
    if (read_losses(kdir, lk, 3) || read_losses(kbase, lb, 3) || read_losses(ref, lr, 3)) return 1;
    float *g0 = read_floats(kbase, "grad.bin", numel), *gk = read_floats(kdir, "grad.bin", numel);
    float *p0 = read_floats(kdir, "p0.bin", numel);
    const double c = 2.0 * sqrt(M) * TU_U_BF16;
    double kappa_an = 0;
    for (int64_t j = 0; j < numel; j++) kappa_an += ((double)p0[j] * g0[j]) * ((double)p0[j] * g0[j]);
    kappa_an = sqrt(kappa_an) / fabs(lb[0]);
    for (int i = 0; i < np; i++) gbound[i] = c * rel_norm(gk, g0, off[i], cnt[i]) / TU_KAPPA_ETA;
    for (int s = 0; s < 3; s++) {
        lbound[s] = c * fmax(kappa_an, fabs(lk[s] - lb[s]) / fabs(lb[s]) / TU_KAPPA_ETA);
        if (s > 0) {
            char name[32];
            snprintf(name, sizeof name, "grad%d.bin", s + 1);
            float *g = read_floats(ref, name, numel);
            double n2 = 0;
            for (int64_t j = 0; j < numel; j++) n2 += (double)g[j] * g[j];
            lbound[s] += TU_LAMBDA * (pabs * s / 3.0) * sqrt(n2) / fabs(lr[s]);
            free(g);
        }
    }
    free(g0), free(gk), free(p0);
    return 0;
}

static int cmd_compare(const char *ref, const char *run, double tol, double pabs, const char *kbase, double mround,
                       double uacc) {
    static char names[512][96];
    long long off[512], cnt[512];
    const int np = read_index(ref, names, off, cnt);
    if (np <= 0) return 1;
    const int64_t numel = off[np - 1] + cnt[np - 1];
    const int derived = tol < 0 && mround <= 0, bounded = tol < 0; /* bounded: derived or rounded */
    int bad = 0;
    double lr3[3], lx[3];
    if (read_losses(ref, lr3, 3) || read_losses(run, lx, 3)) return 1;
    /* the bounds: loss per step, gradient per tensor, parameters per element (derived)
     * or per tensor (tol) */
    double lbound[3] = {tol, tol, tol}, gnb[3];
    double *gbound = calloc((size_t)np, sizeof(double)), *pbound = calloc((size_t)np, sizeof(double));
    double *pel = NULL; /* derived: the elementwise parameter bounds */
    for (int i = 0; i < np; i++) gbound[i] = pbound[i] = tol;
    if (derived) {
        pel = calloc((size_t)numel, sizeof(double));
        if (derive_bounds(ref, kbase ? kbase : ref, 3, np, off, cnt, lbound, gnb, gbound, pel, NULL, NULL, NULL, NULL, uacc))
            return 1;
    }
    if (mround > 0 && rounded_bounds(ref, kbase, mround, pabs, np, off, cnt, lbound, gbound)) return 1;
    /* MT_COMPARE_PLANT=x: RUN's values moved by x times their derived bound (each loss,
     * each tensor scaled by 1 + x bound; with PABS each parameter moved by x PABS):
     * shows that the bounds can fail */
    const double plant = bounded && getenv("MT_COMPARE_PLANT") ? atof(getenv("MT_COMPARE_PLANT")) : 0.0;
    double worst_loss = 0, worst_ratio = 0;
    for (int s = 0; s < 3; s++) {
        lx[s] += plant * lbound[s] * lr3[s];
        const double e = fabs(lx[s] - lr3[s]) / fabs(lr3[s]);
        if (bounded) {
            printf("loss step %d: relative error %.3e, bound %.2e\n", s + 1, e, lbound[s]);
            worst_ratio = fmax(worst_ratio, e / lbound[s]);
        }
        if (!(e <= lbound[s])) {
            printf("FAIL loss step %d: relative error %.3e > %.2e\n", s + 1, e, lbound[s]);
            bad++;
        }
        if (e > worst_loss) worst_loss = e;
    }
    printf("loss: %.9f %.9f %.9f vs reference %.9f %.9f %.9f (max rel %.2e)\n", lx[0], lx[1], lx[2], lr3[0],
           lr3[1], lr3[2], worst_loss);
    const char *files[2] = {"grad.bin", "params.bin"};
    for (int w = 0; w < 2; w++) {
        float *a = read_floats(run, files[w], numel), *b = read_floats(ref, files[w], numel);
        const int absolute = w == 1 && pabs >= 0; /* parameters, elementwise absolute */
        double worst = 0, bmin = INFINITY, bmax = 0, wr = 0;
        int wi = 0;
        for (int i = 0; i < np; i++) {
            double lim = absolute ? pabs : w ? pbound[i] : gbound[i], e;
            if (derived && w == 1 && !absolute) { /* elementwise: the worst ratio to the element's bound */
                double r = 0, mb = 0;
                for (long long j = off[i]; j < off[i] + cnt[i]; j++) {
                    a[j] += (float)(plant * pel[j] * (b[j] < 0 ? -1 : 1));
                    const double d = fabs((double)a[j] - b[j]);
                    mb = fmax(mb, pel[j]);
                    r = fmax(r, d > 0 ? d / pel[j] : 0.0);
                }
                e = r; /* compared with 1 */
                lim = 1.0;
                bmin = fmin(bmin, mb);
                bmax = fmax(bmax, mb);
                wr = fmax(wr, r);
            } else {
                if (bounded)
                    for (long long j = off[i]; j < off[i] + cnt[i]; j++)
                        a[j] += (float)(absolute ? plant * lim * (b[j] < 0 ? -1 : 1) : plant * lim * b[j]);
                double mx = 0;
                for (long long j = off[i]; j < off[i] + cnt[i]; j++) mx = fmax(mx, fabs((double)a[j] - b[j]));
                e = absolute ? mx : rel_norm(a, b, off[i], cnt[i]);
                if (bounded) {
                    bmin = fmin(bmin, lim);
                    bmax = fmax(bmax, lim);
                    if (lim > 0) wr = fmax(wr, e / lim);
                }
            }
            if (!(e <= lim)) {
                printf("FAIL %s %s: %s error %.3e > %.2e\n", files[w], names[i],
                       derived && w == 1 && !absolute ? "elementwise ratio to the bound" :
                       absolute ? "absolute" : "relative", e, lim);
                bad++;
            }
            if (e > worst || e != e) {
                worst = e;
                wi = i;
            }
        }
        printf("%s: %d tensors, worst %s %.3e (%s)", files[w], np,
               derived && w == 1 && !absolute ? "elementwise ratio to the bound" :
               absolute ? "absolute error" : "relative error", worst, names[wi]);
        if (bounded)
            printf(", %s bounds %.2e to %.2e, worst ratio %.3g",
                   absolute ? "absolute" : w ? "largest elementwise" : "relative", bmin, bmax, wr);
        printf("\n");
        worst_ratio = fmax(worst_ratio, wr);
        free(a);
        free(b);
    }
    if (bounded) printf("worst ratio to the derived bound %.3g\n", worst_ratio);
    free(gbound);
    free(pbound);
    free(pel);
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "data") == 0) return cmd_data(argv[2]);
    if (argc >= 4 && strcmp(argv[1], "run") == 0)
        return cmd_run(argv[2], argv[3], argc - 4, (const char *const *)argv + 4, 0, 0, 0);
    if (argc == 4 && strcmp(argv[1], "bounds") == 0) return cmd_bounds(argv[2], atoi(argv[3]), 0.0);
    if (argc == 5 && strcmp(argv[1], "bounds") == 0 && strcmp(argv[4], "bfloat16") == 0)
        return cmd_bounds(argv[2], atoi(argv[3]), TU_U_BF16);
    if (argc >= 4 && strcmp(argv[1], "run-kappa") == 0)
        return cmd_run(argv[2], argv[3], argc - 4, (const char *const *)argv + 4, 0, 1, 0);
    if (argc >= 4 && strcmp(argv[1], "run-acc") == 0)
        return cmd_run(argv[2], argv[3], argc - 4, (const char *const *)argv + 4, 1, 0, 1);
    if (argc >= 4 && strcmp(argv[1], "run-full-grads") == 0)
        return cmd_run(argv[2], argv[3], argc - 4, (const char *const *)argv + 4, 1, 0, 0);
    if (argc >= 3 && strcmp(argv[1], "plan") == 0) return cmd_plan(argv[2], argc - 3, (const char *const *)argv + 3);
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "compare") == 0) {
        if (strncmp(argv[4], "derived-bf16acc", 15) == 0) /* REF from run-acc: bf16 accumulators */
            return cmd_compare(argv[2], argv[3], -1.0, argc == 6 ? atof(argv[5]) : -1.0,
                               argv[4][15] == '=' ? argv[4] + 16 : NULL, 0.0, TU_U_BF16);
        const int derived = strncmp(argv[4], "derived", 7) == 0, rounded = strncmp(argv[4], "rounded=", 8) == 0;
        const char *colon = rounded ? strchr(argv[4], ':') : NULL;
        if (rounded && (!colon || atof(argv[4] + 8) <= 0)) return fprintf(stderr, "mpi_layout: rounded=M:BASE\n"), 2;
        return cmd_compare(argv[2], argv[3], derived || rounded ? -1.0 : atof(argv[4]),
                           argc == 6 ? atof(argv[5]) : -1.0,
                           rounded ? colon + 1 : derived && argv[4][7] == '=' ? argv[4] + 8 : NULL,
                           rounded ? atof(argv[4] + 8) : 0.0, 0.0);
    }
    fprintf(stderr, "usage: mpi_layout data DIR | run OUT CONFIG [k=v ...] | run-kappa OUT CONFIG [k=v ...] | "
            "run-full-grads OUT CONFIG [k=v ...] | "
            "run-acc OUT CONFIG [k=v ...] | plan CONFIG [k=v ...] | compare REF RUN TOL|derived[=BASE]|derived-bf16acc[=BASE]|rounded=M:BASE [PABS] | "
            "bounds REF K [bfloat16]\n");
    return 2;
}
