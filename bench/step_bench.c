/* bench/step_bench.c: time one meshtrain training step on the CPU backend.
 *
 * The same llama-shaped model and step as bench/torch_step.py: embedding, L decoder
 * layers, final norm, vocab-tiled cross-entropy (mean over tokens), backward, AdamW
 * (lr 1e-4, wd 0.1 on matrices), float32 or bfloat16 (bench_model.h). Prints one JSON
 * line with the dtype, the step times, the planned arena bytes by category and the
 * process peak RSS.
 * Usage: step_bench d_model layers heads kv_heads mlp seq batch vocab threads steps tiles [dtype] */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "bench_model.h"
#include "runtime/timer.h"
#include "train/json.h"

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
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_string(doc, "impl", "meshtrain");
    bad |= mt_json_add_int(doc, "threads", b.a[8]);
    bad |= mt_json_add_string(doc, "dtype", mt_dtype_name(b.dt));
    cJSON *step_ms = mt_json_add_array(doc, "step_ms");
    for (int s = 0; s <= steps; s++) {
        double t0 = mt_time_now();
        double sum = 0;
        int64_t cnt = 0;
        if ((err = bench_model_step(&b, be, s, &sum, &cnt)) != NULL) {
            cJSON_Delete(doc);
            return fail(err);
        }
        loss = sum / (double)cnt;
        double ms = (mt_time_now() - t0) * 1e3;
        if (s > 0) bad |= mt_json_add_double(step_ms, NULL, ms, "%.1f"); /* step 0 is warm-up */
    }
    size_t cat[MT_MEM_CATEGORY_COUNT];
    mt_plan_live_by_category(b.plan, cat, NULL);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    bad |= mt_json_add_double(doc, "loss", loss, "%.6f");
    bad |= mt_json_add_double(doc, "planned_peak_mib", mt_plan_peak(b.plan) / 1048576.0, "%.2f");
    cJSON *planned = mt_json_add_object(doc, "planned");
    for (int k = 0; k < MT_MEM_CATEGORY_COUNT; k++)
        bad |= mt_json_add_double(planned, mt_mem_category_name((mt_mem_category)k), cat[k] / 1048576.0, "%.2f");
    bad |= mt_json_add_double(doc, "peak_rss_mib", ru.ru_maxrss / 1024.0, "%.1f");
    bad = bad || mt_json_write_line(doc, stdout) != 0;
    cJSON_Delete(doc);
    bench_model_free(&b);
    if (bad) {
        fprintf(stderr, "step_bench: cannot write the JSON line (out of memory or stdout)\n");
        return 1;
    }
    return 0;
}
