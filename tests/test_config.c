/* tests/test_config.c: the run configuration: built-in defaults against
 * configs/base.yml, precedence (defaults < model file < CONFIG.yml < key=value),
 * model file lookup, and the error messages for bad input. Every test writes its own
 * model and run files into a temporary directory. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/config.h"

#define TINY_MODEL                                                                        \
    "decoder_block: llama2\nvocab_size: 256\nbase_emb_dim: 64\nbase_num_query_heads: 4\n" \
    "base_num_kv_heads: 2\nhead_dim: 16\nbase_mlp_dim: 128\nbase_num_decoder_layers: 2\n" \
    "mlp_activations: [\"silu\", \"linear\"]\nrope_max_timescale: 500000\n"

static char tmpdir[256];

static const char *tpath(const char *rel) {
    static char path[4][512];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", tmpdir, rel);
    return path[k];
}

static void write_file(const char *rel, const char *text) {
    const char *path = tpath(rel);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mt_test_config_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    cr_assert_eq(mkdir(tpath("models"), 0755), 0);
    write_file("models/tm.yml", TINY_MODEL);
    unsetenv("MESHTRAIN_CONFIG_DIR");
}

static void teardown(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* Load with the given run file text (NULL = no CONFIG.yml) and overrides. */
static mt_status load(mt_train_config *c, const char *run_text, int n, const char *const *ov) {
    if (run_text) write_file("run.yml", run_text);
    return mt_train_config_load(c, run_text ? tpath("run.yml") : NULL, n, ov);
}

TestSuite(config, .init = setup, .fini = teardown);

/* configs/base.yml documents every run key with exactly the built-in default. The
 * file is applied onto a struct whose run fields start at zero, so a key missing
 * from the file shows up as a difference (keys whose default is 0 or "" are caught
 * by the text scan below). */
Test(config, defaults_equal_base_yml) {
    mt_train_config def, fromfile;
    mt_train_config_defaults(&def);
    memset(&fromfile, 0, sizeof fromfile);
    fromfile.model = def.model;
    fromfile.model.model_name[0] = '\0';
    cr_assert_eq(mt_train_config_apply_file(&fromfile, MT_SOURCE_DIR "/configs/base.yml"), MT_OK, "%s",
                 mt_last_error());

    FILE *f = fopen(MT_SOURCE_DIR "/configs/base.yml", "rb");
    cr_assert_not_null(f);
    static char text[65536];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';

    int run_keys = 0;
    for (int i = 0; i < mt_config_key_count(); i++) {
        const mt_config_key *k = mt_config_key_get(i);
        if (k->is_model) continue;
        run_keys++;
        char a[256], b[256];
        mt_train_config_format(&def, k, a, sizeof a);
        mt_train_config_format(&fromfile, k, b, sizeof b);
        cr_expect_str_eq(a, b, "key %s: built-in default '%s' but base.yml says '%s'", k->name, a, b);
        /* The default text of the table parses to the same value. */
        char line[160];
        snprintf(line, sizeof line, "\n%s:", k->name);
        cr_expect_not_null(strstr(text, line), "base.yml does not document run key %s", k->name);
        cr_expect_not_null(k->doc, "key %s has no doc", k->name);
    }
    cr_assert_geq(run_keys, 30);
}

/* Every key's printed value reads back to the same value. */
Test(config, format_roundtrip) {
    mt_train_config c;
    cr_assert_eq(load(&c, "model_name: tm\nlearning_rate: 0.1\nadam_eps: 3e-9\n", 0, NULL), MT_OK, "%s",
                 mt_last_error());
    for (int i = 0; i < mt_config_key_count(); i++) {
        const mt_config_key *k = mt_config_key_get(i);
        char a[256], b[256];
        mt_train_config c2 = c;
        mt_train_config_format(&c, k, a, sizeof a);
        cr_assert_eq(mt_train_config_set(&c2, k->name, a, "test"), MT_OK, "%s: %s", k->name, mt_last_error());
        cr_assert_eq(memcmp(&c, &c2, sizeof c), 0, "key %s = '%s' does not read back", k->name, a);
        mt_train_config_format(&c2, k, b, sizeof b);
        cr_assert_str_eq(a, b);
    }
}

Test(config, precedence) {
    mt_train_config c;
    const char *ov[] = {"steps=9", "adam_b1=0.5"};
    cr_assert_eq(load(&c,
                      "model_name: tm\nsteps: 7\nbase_emb_dim: 32\nlearning_rate: 0.01\n"
                      "run_name: hello\nadam_b1: 0.8\n",
                      2, ov),
                 MT_OK, "%s", mt_last_error());
    cr_expect_eq(c.model.emb_dim, 32, "CONFIG.yml beats the model file");
    cr_expect_eq(c.model.vocab_size, 256, "model file beats defaults");
    cr_expect_float_eq(c.model.rope_max_timescale, 500000.0f, 0.0, "model file beats defaults");
    cr_expect_float_eq(c.model.normalization_layer_epsilon, 1e-5f, 0.0, "llama2 block default");
    cr_expect_eq(c.steps, 9, "command line beats CONFIG.yml");
    cr_expect_eq(c.adam_b1, 0.5);
    cr_expect_eq(c.learning_rate, 0.01);
    cr_expect_str_eq(c.run_name, "hello");
    cr_expect_eq(c.per_device_batch_size, 8, "built-in default kept");
    cr_expect_str_eq(c.model.model_name, "tm");
    cr_expect_eq(c.model.mlp_activation, MT_ACT_SILU);
}

/* model_name on the command line selects another model file, and the defaults of
 * its decoder block. */
Test(config, model_name_override) {
    write_file("models/tg.yml",
               "decoder_block: gemma\nvocab_size: 300\nbase_emb_dim: 64\nbase_num_query_heads: 4\n"
               "base_num_kv_heads: 1\nhead_dim: 16\nbase_mlp_dim: 128\nbase_num_decoder_layers: 1\n"
               "mlp_activations:\n  - gelu\n  - linear\n");
    mt_train_config c;
    const char *ov[] = {"model_name=tg"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov), MT_OK, "%s", mt_last_error());
    cr_expect_str_eq(c.model.model_name, "tg");
    cr_expect_eq(c.model.decoder_block, MT_DECODER_GEMMA);
    cr_expect_eq(c.model.vocab_size, 300);
    cr_expect_eq(c.model.logits_via_embedding, 1, "gemma block default");
    cr_expect_float_eq(c.model.normalization_layer_epsilon, 1e-6f, 0.0);
    cr_expect_eq(c.model.mlp_activation, MT_ACT_GELU_TANH);
    cr_expect_float_eq(c.model.rope_max_timescale, 10000.0f, 0.0, "tm's rope base must not leak into tg");
}

Test(config, list_on_command_line) {
    mt_train_config c;
    const char *ov[] = {"mlp_activations=[gelu, linear]"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov), MT_OK, "%s", mt_last_error());
    cr_expect_eq(c.model.mlp_activation, MT_ACT_GELU_TANH);
    const char *bad[] = {"mlp_activations=[relu, linear]"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, bad), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "mlp_activations"), "%s", mt_last_error());
}

Test(config, model_dir_from_environment) {
    /* The run file lives in a directory without models/; MESHTRAIN_CONFIG_DIR points
     * at tmpdir, whose models/ holds tm.yml. */
    cr_assert_eq(mkdir(tpath("elsewhere"), 0755), 0);
    write_file("elsewhere/run.yml", "model_name: tm\n");
    mt_train_config c;
    cr_assert_eq(mt_train_config_load(&c, tpath("elsewhere/run.yml"), 0, NULL), MT_ERR_INVALID);
    setenv("MESHTRAIN_CONFIG_DIR", tmpdir, 1);
    cr_assert_eq(mt_train_config_load(&c, tpath("elsewhere/run.yml"), 0, NULL), MT_OK, "%s", mt_last_error());
    cr_expect_eq(c.model.vocab_size, 256);
}

Test(config, unknown_key_in_file) {
    mt_train_config c;
    cr_assert_eq(load(&c, "model_name: tm\nlerning_rate: 0.1\n", 0, NULL), MT_ERR_INVALID);
    const char *e = mt_last_error();
    cr_expect_not_null(strstr(e, "lerning_rate"), "%s", e);
    cr_expect_not_null(strstr(e, "run.yml:2"), "names file and line: %s", e);
    cr_expect_not_null(strstr(e, "'learning_rate'"), "suggests the closest key: %s", e);
}

Test(config, unknown_key_on_command_line) {
    mt_train_config c;
    const char *ov[] = {"stepz=3"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "stepz"), "%s", mt_last_error());
    cr_expect_not_null(strstr(mt_last_error(), "command line"), "%s", mt_last_error());
    const char *noeq[] = {"steps"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, noeq), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "key=value"), "%s", mt_last_error());
}

Test(config, unknown_key_in_model_file) {
    write_file("models/tb.yml", TINY_MODEL "num_layerz: 3\n");
    mt_train_config c;
    cr_assert_eq(load(&c, "model_name: tb\n", 0, NULL), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "num_layerz"), "%s", mt_last_error());
    cr_expect_not_null(strstr(mt_last_error(), "tb.yml"), "%s", mt_last_error());
}

Test(config, wrong_type) {
    mt_train_config c;
    cr_assert_eq(load(&c, "model_name: tm\nsteps: abc\n", 0, NULL), MT_ERR_INVALID);
    const char *e = mt_last_error();
    cr_expect(strstr(e, "steps") && strstr(e, "abc") && strstr(e, "integer"), "%s", e);
    const char *ov[] = {"learning_rate=fast"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov), MT_ERR_INVALID);
    e = mt_last_error();
    cr_expect(strstr(e, "learning_rate") && strstr(e, "fast") && strstr(e, "number"), "%s", e);
    const char *ov2[] = {"logits_via_embedding=maybe"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov2), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "bool"), "%s", mt_last_error());
    const char *ov3[] = {"steps=1.5"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov3), MT_ERR_INVALID);
}

Test(config, enum_lists_allowed_values) {
    mt_train_config c;
    const char *ov[] = {"dtype=fp8"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov), MT_ERR_INVALID);
    const char *e = mt_last_error();
    cr_expect(strstr(e, "dtype") && strstr(e, "fp8") && strstr(e, "float32|bfloat16"), "%s", e);
    const char *ov2[] = {"backend=tpu"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov2), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "auto|cpu|cuda"), "%s", mt_last_error());
    const char *ov3[] = {"decoder_block=gpt2"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, ov3), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "llama2|gemma|gemma2|gemma3"), "%s", mt_last_error());
}

Test(config, missing_model_file) {
    mt_train_config c;
    cr_assert_eq(load(&c, "model_name: nope\n", 0, NULL), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "nope.yml"), "%s", mt_last_error());
    cr_expect_not_null(strstr(mt_last_error(), tmpdir), "names the directories tried: %s", mt_last_error());
}

Test(config, missing_config_file) {
    mt_train_config c;
    cr_assert_eq(mt_train_config_load(&c, tpath("absent.yml"), 0, NULL), MT_ERR_IO);
    cr_expect_not_null(strstr(mt_last_error(), "absent.yml"), "%s", mt_last_error());
}

Test(config, ranges) {
    mt_train_config c;
    const char *cases[][2] = {
        {"per_device_batch_size=0", "per_device_batch_size"},
        {"num_vocab_tiling=-1", "num_vocab_tiling"}, {"num_vocab_chunks=-1", "num_vocab_chunks"},
        {"learning_rate=-1", "learning_rate"},
        {"warmup_steps_fraction=1.5", "warmup_steps_fraction"},
        {"cosine_learning_rate_final_fraction=-0.1", "cosine_learning_rate_final_fraction"},
        {"adam_b2=1", "adam_b2"},
        {"adam_eps=0", "adam_eps"},
        {"gradient_accumulation_steps=0", "gradient_accumulation_steps"},
        {"steps=0", "steps"},
        {"run_name=a/b", "run_name"},
        {"base_num_query_heads=3", "head"}, /* 3 % 2 kv heads: the model validation */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *ov[] = {cases[i][0]};
        cr_expect_eq(load(&c, "model_name: tm\n", 1, ov), MT_ERR_INVALID, "%s accepted", cases[i][0]);
        cr_expect_not_null(strstr(mt_last_error(), cases[i][1]), "%s: %s", cases[i][0], mt_last_error());
    }
    /* num_vocab_tiling is bounded by batch * seq. */
    const char *ov[] = {"per_device_batch_size=2", "max_target_length=3", "num_vocab_tiling=7"};
    cr_expect_eq(load(&c, "model_name: tm\n", 3, ov), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "num_vocab_tiling"), "%s", mt_last_error());
    ov[2] = "num_vocab_tiling=6";
    cr_expect_eq(load(&c, "model_name: tm\n", 3, ov), MT_OK, "%s", mt_last_error());
    ov[2] = "num_vocab_tiling=0"; /* auto (models/model.h mt_model_vocab_tiling) */
    cr_expect_eq(load(&c, "model_name: tm\n", 3, ov), MT_OK, "%s", mt_last_error());
    /* num_vocab_chunks is bounded by vocab_size (0 = auto) */
    ov[2] = "num_vocab_chunks=100000000";
    cr_expect_eq(load(&c, "model_name: tm\n", 3, ov), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "num_vocab_chunks"), "%s", mt_last_error());
    ov[2] = "num_vocab_chunks=3";
    cr_expect_eq(load(&c, "model_name: tm\n", 3, ov), MT_OK, "%s", mt_last_error());
}

/* A range message says what the key accepts (a new-user trial: hbm_gib=-1 said ">= 0"
 * where estimate refuses 0, adam_b1=2 "<= 1" where 1 is refused, ici_*=-2 ">= -1" where
 * 0 is refused). For every number key a value past its table bound is refused with the
 * text mt_config_key_accepts gives; where that text is the bare bound (">= 0",
 * "<= 1", "in [0, 1]"), a full load takes the values it offers (the bound, and the
 * next two integers above a lower one); the keys that other checks narrow carry their
 * own text, checked below and in the CLI tests (tests/test_cli_bad_input.sh). */
Test(config, range_messages_say_what_is_accepted) {
    mt_train_config def;
    mt_train_config_defaults(&def);
    int checked = 0;
    for (int i = 0; i < mt_config_key_count(); i++) {
        const mt_config_key *k = mt_config_key_get(i);
        if (k->type != MT_KEY_INT && k->type != MT_KEY_FLOAT && k->type != MT_KEY_DOUBLE) continue;
        if (!k->has_min && !k->has_max) continue;
        const char *f = k->type == MT_KEY_INT ? "%.0f" : "%g";
        char acc[200], lo[64], hi[64], bare[160], val[96];
        mt_config_key_accepts(k, acc, sizeof acc);
        cr_assert(acc[0], "key %s has a range but no text for it", k->name);
        snprintf(lo, sizeof lo, f, k->min);
        snprintf(hi, sizeof hi, f, k->max);
        if (k->has_min && k->has_max) snprintf(bare, sizeof bare, "in [%s, %s]", lo, hi);
        else if (k->has_min) snprintf(bare, sizeof bare, ">= %s", lo);
        else snprintf(bare, sizeof bare, "<= %s", hi);
        /* past the bound: refused, naming the key and the text */
        snprintf(val, sizeof val, f, k->has_min ? k->min - 1 : k->max + 1);
        mt_train_config c = def;
        cr_expect_eq(mt_train_config_set(&c, k->name, val, "test"), MT_ERR_INVALID, "%s=%s accepted", k->name, val);
        cr_expect(strstr(mt_last_error(), k->name) && strstr(mt_last_error(), acc),
                  "%s=%s: the message does not say '%s': %s", k->name, val, acc, mt_last_error());
        checked++;
        if (strcmp(acc, bare) != 0) continue; /* narrowed by another check: its own text */
        /* the values the bare text offers load */
        double offers[4];
        int n = 0;
        if (k->has_min) {
            offers[n++] = k->min;
            if (k->type == MT_KEY_INT) offers[n++] = k->min + 1, offers[n++] = k->min + 2;
        }
        if (k->has_max) offers[n++] = k->max;
        for (int j = 0; j < n; j++) {
            char ov0[128];
            snprintf(val, sizeof val, f, offers[j]);
            snprintf(ov0, sizeof ov0, "%s=%s", k->name, val);
            /* a query head count must stay a multiple of the kv heads' */
            const char *ov[] = {ov0, "base_num_kv_heads=1"};
            const int nov = strcmp(k->name, "base_num_query_heads") == 0 ? 2 : 1;
            cr_expect_eq(load(&c, "model_name: tm\n", nov, ov), MT_OK, "key %s: the message offers '%s' but %s is "
                         "refused: %s", k->name, bare, ov0, mt_last_error());
        }
    }
    cr_expect_geq(checked, 30);
    /* integers whole: not %g's 2.14748e+09 for 2147483647 */
    mt_train_config c = def;
    cr_expect_eq(mt_train_config_set(&c, "packing_separator_id", "3000000000", "test"), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "2147483647") != NULL, "%s", mt_last_error());
    /* the narrowed ones, at config load: what their text offers loads, what it excludes
     * does not (the ici_* axes and hbm_gib are checked where the mesh and estimate are:
     * tests/test_cli_bad_input.sh, tests/test_cli_estimate_inputs.sh) */
    const struct { const char *ov, *needle; int ok; } narrowed[] = {
        {"adam_b1=0", NULL, 1}, {"adam_b1=0.999", NULL, 1}, {"adam_b1=1", "[0, 1)", 0}, {"adam_b1=2", "[0, 1)", 0},
        {"adam_b2=1", "[0, 1)", 0},
        {"top_k=256", NULL, 1}, {"top_k=0", NULL, 1}, {"top_k=257", "vocab_size 256", 0},
        {"head_dim=2", NULL, 1}, {"head_dim=0", "even, in [2, 256]", 0}, {"head_dim=258", "256", 0},
        {"normalization_layer_epsilon=0", "positive", 0}, {"normalization_layer_epsilon=-1", "> 0", 0},
        {"rope_max_timescale=0", "positive", 0}, {"rope_max_timescale=-1", "> 0", 0},
        {"sliding_window_pattern=0", NULL, 1}, /* llama: no pattern */
        {"num_vocab_chunks=0", NULL, 1}, {"num_vocab_chunks=-1", "0 (auto) or in [1, vocab_size]", 0},
        /* past int64: it said "an integer from -1 to 9223372036854775807" */
        {"ici_tensor_parallelism=99999999999999999999", "-1 (fill the world) or >= 1", 0},
        {"top_k=99999999999999999999", "in [0, vocab_size]", 0},
    };
    for (size_t i = 0; i < sizeof narrowed / sizeof narrowed[0]; i++) {
        const char *ov[] = {narrowed[i].ov};
        const mt_status st = load(&c, "model_name: tm\n", 1, ov);
        if (narrowed[i].ok) {
            cr_expect_eq(st, MT_OK, "%s refused: %s", narrowed[i].ov, mt_last_error());
        } else {
            cr_expect_eq(st, MT_ERR_INVALID, "%s accepted", narrowed[i].ov);
            cr_expect(strstr(mt_last_error(), narrowed[i].needle) != NULL, "%s: %s", narrowed[i].ov, mt_last_error());
        }
    }
}

/* top_k beyond the model's vocabulary keeps more tokens than there are: refused at
 * config validation (train, plan, the library's config load), naming top_k, the value
 * and vocab_size; top_k = vocab_size and 0 (all) are the same sampling. */
Test(config, top_k_within_vocab) {
    mt_train_config c;
    const char *bad[] = {"top_k=257"};
    cr_assert_eq(load(&c, "model_name: tm\n", 1, bad), MT_ERR_INVALID, "top_k=257 accepted for vocab_size 256");
    cr_expect(strstr(mt_last_error(), "top_k") && strstr(mt_last_error(), "257") &&
                  strstr(mt_last_error(), "vocab_size 256"), "%s", mt_last_error());
    cr_expect_eq(load(&c, "model_name: tm\ntop_k: 100000\n", 0, NULL), MT_ERR_INVALID, "top_k in CONFIG.yml");
    const char *good[] = {"top_k=256"};
    cr_expect_eq(load(&c, "model_name: tm\n", 1, good), MT_OK, "%s", mt_last_error());
    /* a caller that fills the struct itself */
    cr_assert_eq(load(&c, "model_name: tm\n", 0, NULL), MT_OK, "%s", mt_last_error());
    c.top_k = 1000;
    cr_expect_eq(mt_train_config_validate(&c), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "top_k") != NULL, "%s", mt_last_error());
}

Test(config, yaml_errors) {
    mt_train_config c;
    cr_assert_eq(load(&c, "model_name: tm\nsteps: [1\n", 0, NULL), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "run.yml"), "%s", mt_last_error());
    cr_assert_eq(load(&c, "model_name: tm\nopt:\n  lr: 1\n", 0, NULL), MT_ERR_INVALID);
    cr_expect_not_null(strstr(mt_last_error(), "nested"), "%s", mt_last_error());
    /* Empty strings and null read as unset paths. */
    cr_assert_eq(load(&c, "model_name: tm\nload_checkpoint: ~\nload_parameters_path: ''\n", 0, NULL), MT_OK,
                 "%s", mt_last_error());
    cr_expect_str_eq(c.load_checkpoint, "");
}

Test(config, no_config_file) {
    /* Only overrides: the model file is found through MESHTRAIN_CONFIG_DIR. */
    setenv("MESHTRAIN_CONFIG_DIR", tmpdir, 1);
    mt_train_config c;
    const char *ov[] = {"model_name=tm", "steps=3"};
    cr_assert_eq(mt_train_config_load(&c, NULL, 2, ov), MT_OK, "%s", mt_last_error());
    cr_expect_eq(c.steps, 3);
    cr_expect_eq(c.model.num_decoder_layers, 2);
}

/* mt_train_config_text (the ranks compare it, train/main.c agree_on_inputs): one line
 * per key of the table, "key=value" as mt_train_config_format writes it, a newline and
 * a backslash in a value escaped so that it stays one line; another value of one key
 * changes that key's line alone. */
Test(config, text_one_line_per_key) {
    mt_train_config a, b;
    const char *ov[] = {"learning_rate=0.002"};
    cr_assert_eq(load(&a, "model_name: tm\n", 1, ov), MT_OK, "%s", mt_last_error());
    snprintf(a.prompt, sizeof a.prompt, "x\ny\\z"); /* a value with a newline (a YAML block) */
    b = a;
    b.steps = a.steps + 1;
    char *ta = NULL, *tb = NULL;
    size_t la = 0;
    cr_assert_eq(mt_train_config_text(&a, &ta, &la), MT_OK);
    cr_assert_eq(mt_train_config_text(&b, &tb, NULL), MT_OK);
    cr_assert_eq(la, strlen(ta));
    int lines = 0, differ = 0;
    const char *pa = ta, *pb = tb;
    for (int i = 0; i < mt_config_key_count(); i++) {
        const char *ea = strchr(pa, '\n'), *eb = strchr(pb, '\n');
        cr_assert(ea && eb, "line %d missing", i);
        char want[64];
        snprintf(want, sizeof want, "%s=", mt_config_key_get(i)->name);
        cr_assert_eq(strncmp(pa, want, strlen(want)), 0, "line %d: '%.*s', want key %s", i, (int)(ea - pa), pa,
                     want);
        if (ea - pa != eb - pb || memcmp(pa, pb, (size_t)(ea - pa)) != 0) {
            differ++;
            cr_assert_eq(strcmp(mt_config_key_get(i)->name, "steps"), 0, "line %d differs", i);
        }
        lines++, pa = ea + 1, pb = eb + 1;
    }
    cr_assert_eq(*pa, '\0', "text after the last key: %s", pa);
    cr_assert_eq(differ, 1);
    cr_assert_not_null(strstr(ta, "\nprompt=x\\ny\\\\z\n"), "prompt not escaped: %s", strstr(ta, "prompt="));
    cr_assert_not_null(strstr(ta, "\nlearning_rate=0.002\n"));
    cr_assert_eq(strncmp(ta, "model_name=tm\n", 14), 0);
    free(ta);
    free(tb);
}
