/* bench/step_bench.c: time one meshtrain training step on the CPU backend.
 *
 * The same llama-shaped model and step as bench/torch_step.py: embedding, L decoder
 * layers, final norm, vocab-tiled cross-entropy (mean over tokens), backward, AdamW
 * (lr 1e-4, wd 0.1 on matrices), float32. Prints one JSON line with the step times,
 * the planned arena bytes by category and the process peak RSS.
 * Usage: step_bench d_model layers heads kv_heads mlp seq batch vocab threads steps tiles */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "bench_model.h"
#include "runtime/timer.h"

static int fail(const char *what) {
    fprintf(stderr, "step_bench: %s: %s\n", what, mt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    bench_model b;
    if (bench_model_args(&b, "step_bench", argc, argv) != 0) return 2;
    mt_backend *be = mt_cpu_backend();
    const char *err = bench_model_create(&b, be);
    if (err) return fail(err);
    int steps = (int)b.a[9];
    double loss = 0;
    printf("{\"impl\": \"meshtrain\", \"threads\": %ld, \"step_ms\": [", b.a[8]);
    for (int s = 0; s <= steps; s++) {
        double t0 = mt_time_now();
        double sum = 0;
        int64_t cnt = 0;
        if ((err = bench_model_step(&b, be, s, &sum, &cnt)) != NULL) return fail(err);
        loss = sum / (double)cnt;
        double ms = (mt_time_now() - t0) * 1e3;
        if (s > 0) printf("%s%.1f", s > 1 ? ", " : "", ms); /* step 0 is warm-up */
    }
    size_t cat[MT_MEM_CATEGORY_COUNT];
    mt_plan_live_by_category(b.plan, cat, NULL);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("], \"loss\": %.6f, \"planned_peak_mib\": %.2f, \"planned\": {", loss, mt_plan_peak(b.plan) / 1048576.0);
    for (int k = 0; k < MT_MEM_CATEGORY_COUNT; k++)
        printf("%s\"%s\": %.2f", k ? ", " : "", mt_mem_category_name((mt_mem_category)k), cat[k] / 1048576.0);
    printf("}, \"peak_rss_mib\": %.1f}\n", ru.ru_maxrss / 1024.0);
    bench_model_free(&b);
    return 0;
}
