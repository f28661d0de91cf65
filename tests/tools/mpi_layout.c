/* tests/tools/mpi_layout.c: runs a few training steps of one mesh layout and dumps what
 * the layout tests compare (tests/test_mpi_layouts.sh).
 *
 *   mpi_layout data DIR               deterministic tiny llm.c shards (train + val)
 *   mpi_layout run OUT CONFIG [k=v]   3 steps (steps key must be >= 3); rank 0 writes
 *                                     OUT/index.txt (name offset numel per parameter),
 *                                     OUT/loss.txt (loss of steps 1..3, %.17g),
 *                                     OUT/grad.bin (mean gradient of step 1, fp32),
 *                                     OUT/params.bin (parameters after step 3, fp32);
 *                                     every rank writes OUT/bytes.<rank>.txt
 *                                     ("measured formula" bytes sent in each step)
 *   mpi_layout run-full-grads OUT CONFIG [k=v]
 *                                     run, with the model's full gradient buffer instead
 *                                     of the gradient windows (parallel/zero1.h): the
 *                                     behaviour before windows, as a reference
 *   mpi_layout plan CONFIG [k=v]      the trainer's own plan of rank 0 of the layout
 *                                     (no mpirun): "params P grads G optimizer O
 *                                     peak K maxgrad M maxwin NAME chunks C" (bytes; P =
 *                                     sum of the params entries, M = the largest
 *                                     gradient entry, NAME the largest parameter or
 *                                     gradient window, C the vocabulary chunks)
 *   mpi_layout compare REF RUN TOL [PABS]
 *                                     loss, every parameter's gradient and every
 *                                     parameter after 3 steps: relative error
 *                                     ||a - b|| / ||b|| per tensor <= TOL; with PABS
 *                                     the parameters instead elementwise
 *                                     |a - b| <= PABS (absolute); exit 1 if not.
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

/* full_grads: the model's full gradient buffer instead of the gradient windows the
 * trainer would choose (mt_trainer_create_ex): the pre-window behaviour, as reference. */
static int cmd_run(const char *out, const char *config, int n, const char *const *ov, int full_grads) {
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
    float *buf = malloc(sizeof(float) * (size_t)numel);
    double loss[3];
    char path[1024], bytes_txt[512] = "";
    mkdir(out, 0755);
    for (int s = 0; s < 3; s++) {
        mt_step_metrics sm;
        if (mt_trainer_step(t, &sm) != MT_OK) return die("step");
        loss[s] = sm.loss;
        uint64_t meas = 0, form = 0;
        mt_trainer_step_bytes(t, &meas, &form);
        if (s == 0 && rank == 0 && !full_grads && plan_bytes_differ(&cfg, form)) return 1;
        size_t len = strlen(bytes_txt);
        snprintf(bytes_txt + len, sizeof bytes_txt - len, "%llu %llu\n", (unsigned long long)meas,
                 (unsigned long long)form);
        if (s == 0) {
            if (mt_trainer_gather_grad(t, buf) != MT_OK) return die("gather grad");
            snprintf(path, sizeof path, "%s/grad.bin", out);
            if (rank == 0 && write_floats(path, buf, numel)) return die(path);
        }
    }
    /* every rank joins the gather (fsdp: each holds a shard) */
    if (mt_trainer_gather_params(t, buf) != MT_OK) return die("gather params");
    snprintf(path, sizeof path, "%s/bytes.%d.txt", out, rank);
    FILE *f = fopen(path, "w");
    if (!f) return die(path);
    fputs(bytes_txt, f);
    fclose(f);
    if (rank == 0) {
        snprintf(path, sizeof path, "%s/params.bin", out);
        if (write_floats(path, buf, numel)) return die(path);
        snprintf(path, sizeof path, "%s/loss.txt", out);
        f = fopen(path, "w");
        for (int s = 0; s < 3; s++) fprintf(f, "%.17g\n", loss[s]);
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
    int64_t vt[2] = {0, 0};
    if (mt_trainer_plan_ex(&cfg, &plan, NULL, &np, NULL, vt) != MT_OK) return die("plan");
    size_t tot[MT_MEM_CATEGORY_COUNT], maxgrad = 0, maxwin = 0;
    const char *win = "none";
    mt_plan_total_by_category(plan, tot);
    for (int i = 0; i < mt_plan_count(plan); i++) {
        const mt_plan_entry *e = mt_plan_entry_get(plan, i);
        if (e->category == MT_MEM_GRADS && e->bytes > maxgrad) maxgrad = e->bytes;
        if ((!strncmp(e->name, "params.window.", 14) || !strncmp(e->name, "grads.window.", 13)) &&
            e->bytes > maxwin) {
            maxwin = e->bytes;
            win = e->name;
        }
    }
    printf("params %zu grads %zu optimizer %zu peak %zu maxgrad %zu maxwin %s chunks %lld\n", tot[MT_MEM_PARAMS],
           tot[MT_MEM_GRADS], tot[MT_MEM_OPTIMIZER], mt_plan_peak(plan), maxgrad, win, (long long)vt[1]);
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

static int cmd_compare(const char *ref, const char *run, double tol, double pabs) {
    char p[1024];
    snprintf(p, sizeof p, "%s/index.txt", ref);
    FILE *f = fopen(p, "r");
    if (!f) return fprintf(stderr, "mpi_layout: cannot read %s\n", p), 1;
    char names[512][96];
    long long off[512], cnt[512];
    int np = 0;
    while (np < 512 && fscanf(f, "%95s %lld %lld", names[np], &off[np], &cnt[np]) == 3) np++;
    fclose(f);
    const int64_t numel = off[np - 1] + cnt[np - 1];
    int bad = 0;
    double lr[3], lx[3];
    for (int w = 0; w < 2; w++) {
        snprintf(p, sizeof p, "%s/loss.txt", w ? run : ref);
        f = fopen(p, "r");
        for (int s = 0; s < 3; s++)
            if (!f || fscanf(f, "%lf", w ? &lx[s] : &lr[s]) != 1) return fprintf(stderr, "bad %s\n", p), 1;
        fclose(f);
    }
    double worst_loss = 0;
    for (int s = 0; s < 3; s++) {
        double e = fabs(lx[s] - lr[s]) / fabs(lr[s]);
        if (e > worst_loss) worst_loss = e;
    }
    printf("loss: %.9f %.9f %.9f vs reference %.9f %.9f %.9f (max rel %.2e)\n", lx[0], lx[1], lx[2], lr[0],
           lr[1], lr[2], worst_loss);
    if (!(worst_loss <= tol)) bad++;
    const char *files[2] = {"grad.bin", "params.bin"};
    for (int w = 0; w < 2; w++) {
        float *a = read_floats(run, files[w], numel), *b = read_floats(ref, files[w], numel);
        const int absolute = w == 1 && pabs >= 0; /* parameters, elementwise absolute */
        const double lim = absolute ? pabs : tol;
        double worst = 0;
        int wi = 0;
        for (int i = 0; i < np; i++) {
            double d = 0, r = 0, mx = 0;
            for (long long j = off[i]; j < off[i] + cnt[i]; j++) {
                const double dj = (double)a[j] - b[j];
                d += dj * dj;
                r += (double)b[j] * b[j];
                if (!(fabs(dj) <= mx)) mx = fabs(dj);
            }
            double e = absolute ? mx : r > 0 ? sqrt(d / r) : sqrt(d);
            if (!(e <= lim)) {
                printf("FAIL %s %s: %s error %.3e > %.1e\n", files[w], names[i], absolute ? "absolute" : "relative",
                       e, lim);
                bad++;
            }
            if (e > worst || e != e) {
                worst = e;
                wi = i;
            }
        }
        printf("%s: %d tensors, worst %s error %.3e (%s)\n", files[w], np, absolute ? "absolute" : "relative", worst,
               names[wi]);
        free(a);
        free(b);
    }
    return bad ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "data") == 0) return cmd_data(argv[2]);
    if (argc >= 4 && strcmp(argv[1], "run") == 0)
        return cmd_run(argv[2], argv[3], argc - 4, (const char *const *)argv + 4, 0);
    if (argc >= 4 && strcmp(argv[1], "run-full-grads") == 0)
        return cmd_run(argv[2], argv[3], argc - 4, (const char *const *)argv + 4, 1);
    if (argc >= 3 && strcmp(argv[1], "plan") == 0) return cmd_plan(argv[2], argc - 3, (const char *const *)argv + 3);
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "compare") == 0)
        return cmd_compare(argv[2], argv[3], atof(argv[4]), argc == 6 ? atof(argv[5]) : -1.0);
    fprintf(stderr, "usage: mpi_layout data DIR | run OUT CONFIG [k=v ...] | run-full-grads OUT CONFIG [k=v ...] | "
            "plan CONFIG [k=v ...] | compare REF RUN TOL [PABS]\n");
    return 2;
}
