/* tests/test_json.c: train/json.h (the JSON documents meshtrain writes) and the
 * metrics.jsonl row built with it (train/metrics.h). Expected texts are written out by
 * hand; the bitwise read-back is checked with strtod on random doubles from the tests'
 * own generator, and against cJSON's own number printing, which drops bits. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "train/json.h"
#include "train/metrics.h"

/* xorshift64*: the tests' own random source. */
static uint64_t rand_state = 0x9E3779B97F4A7C15ull;
static uint64_t rand64(void) {
    uint64_t x = rand_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rand_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* doc's line (mt_json_line), compared with want; doc is freed. */
static void expect_line(cJSON *doc, int bad, const char *want) {
    cr_assert_eq(bad, 0, "an adder failed");
    char *line = mt_json_line(doc);
    cr_assert_not_null(line);
    cr_expect_str_eq(line, want);
    free(line);
    cJSON_Delete(doc);
}

Test(json, layout_order_and_types) {
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_int(doc, "step", 7);
    bad |= mt_json_add_string(doc, "name", "tiny");
    bad |= mt_json_add_bool(doc, "yes", 1);
    bad |= mt_json_add_bool(doc, "no", 0);
    cJSON *mesh = mt_json_add_object(doc, "mesh");
    bad |= mt_json_add_int(mesh, "data", 2);
    bad |= mt_json_add_int(mesh, "fsdp", 4);
    cJSON *a = mt_json_add_array(doc, "ms");
    bad |= mt_json_add_double(a, NULL, 1.3, "%.1f");
    bad |= mt_json_add_double(a, NULL, 3.0, "%.1f");
    bad |= mt_json_add_object(a, NULL) == NULL;
    bad |= mt_json_add_array(doc, "none") == NULL;
    expect_line(doc, bad,
                "{\"step\": 7, \"name\": \"tiny\", \"yes\": true, \"no\": false, \"mesh\": {\"data\": 2, \"fsdp\": 4}, "
                "\"ms\": [1.3, 3.0, {}], \"none\": []}");
}

Test(json, strings_escaped_and_separators_in_strings_kept) {
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_string(doc, "model_name", "a\"b\\c");
    bad |= mt_json_add_string(doc, "text", "x: 1, y\n\x01");
    bad |= mt_json_add_string(doc, "k\"ey", "");
    expect_line(doc, bad,
                "{\"model_name\": \"a\\\"b\\\\c\", \"text\": \"x: 1, y\\n\\u0001\", \"k\\\"ey\": \"\"}");
}

Test(json, integers_exact_and_non_finite_null) {
    cJSON *doc = cJSON_CreateObject();
    int bad = mt_json_add_int(doc, "min", INT64_MIN);
    bad |= mt_json_add_int(doc, "pb", INT64_C(1000000000000000)); /* cJSON itself prints 1e+15 */
    bad |= mt_json_add_size(doc, "max", SIZE_MAX);
    bad |= mt_json_add_double(doc, "nan", NAN, "%.17g");
    bad |= mt_json_add_double(doc, "inf", INFINITY, "%.2f");
    bad |= mt_json_add_double(doc, "ninf", -INFINITY, "%.17g");
    bad |= mt_json_add_double(doc, "tenth", 0.1, "%.17g");
    char want[256];
    snprintf(want, sizeof want,
             "{\"min\": -9223372036854775808, \"pb\": 1000000000000000, \"max\": %zu, \"nan\": null, "
             "\"inf\": null, \"ninf\": null, \"tenth\": 0.10000000000000001}",
             (size_t)SIZE_MAX);
    expect_line(doc, bad, want);
}

Test(json, null_parent_fails) {
    cr_expect_eq(mt_json_add_int(NULL, "x", 1), -1);
    cr_expect_eq(mt_json_add_double(NULL, "x", NAN, "%.17g"), -1);
    cr_expect_eq(mt_json_add_string(NULL, "x", "s"), -1);
    cr_expect_null(mt_json_add_object(NULL, "x"));
    cr_expect_null(mt_json_line(NULL));
    cr_expect_eq(mt_json_write_line(NULL, stdout), -1);
}

/* "%.17g" reads back bitwise for every double; cJSON_PrintUnformatted (1.7.15: %1.15g
 * accepted within an epsilon) does not for a good part of them, which is why numbers
 * are ours. */
Test(json, doubles_read_back_bitwise) {
    int cjson_lossy = 0;
    for (int i = 0; i < 20000; i++) {
        double v;
        uint64_t u = rand64();
        memcpy(&v, &u, sizeof v);
        if (!isfinite(v)) continue;
        cJSON *a = cJSON_CreateArray();
        cr_assert_eq(mt_json_add_double(a, NULL, v, "%.17g"), 0);
        char *line = mt_json_line(a);
        cr_assert_not_null(line);
        const double back = strtod(line + 1, NULL);
        cr_assert(memcmp(&back, &v, sizeof v) == 0, "%s does not read back as %a", line, v);
        free(line);
        cJSON_Delete(a);
        cJSON *n = cJSON_CreateNumber(v);
        char *c = cJSON_PrintUnformatted(n);
        const double cb = strtod(c, NULL);
        cjson_lossy += memcmp(&cb, &v, sizeof v) != 0;
        cJSON_free(c);
        cJSON_Delete(n);
    }
    cr_log_info("cJSON's own number printing changed %d of 20000 doubles", cjson_lossy);
}

/* The metrics.jsonl rows of train/metrics.h: keys in order, %.17g, NaN -> null. */
Test(json, metrics_rows) {
    char buf[1024];
    mt_step_metrics m = {.step = 0, .has_eval = 1, .val_loss = 4.5, .val_tokens = 64};
    cr_assert_gt(mt_metrics_format_json(&m, buf, sizeof buf), 0);
    cr_expect_str_eq(buf, "{\"step\": 0, \"val_loss\": 4.5, \"val_tokens\": 64}");
    m = (mt_step_metrics){.step = 3, .has_train = 1, .loss = 4.1, .lr = 0.0, .grad_norm = 1.5, .tokens = 32,
                          .tokens_per_s = 640.0, .step_ms = 50.0, .mfu = NAN, .has_eval = 1, .val_loss = NAN,
                          .val_tokens = 0};
    const int n = mt_metrics_format_json(&m, buf, sizeof buf);
    const char *want = "{\"step\": 3, \"loss\": 4.0999999999999996, \"lr\": 0, \"grad_norm\": 1.5, \"tokens\": 32, "
                       "\"tokens_per_s\": 640, \"step_ms\": 50, \"mfu\": null, \"val_loss\": null, \"val_tokens\": 0}";
    cr_expect_str_eq(buf, want);
    cr_expect_eq(n, (int)strlen(want));
    cr_expect_eq(mt_metrics_format_json(&m, buf, strlen(want)), -1, "a buffer one byte short fits");
    cr_expect_eq(mt_metrics_format_json(&m, buf, strlen(want) + 1), n);
}
