/* tests/test_data.c: llm.c token shards and the loader's order, slicing, wrap-around,
 * resume and rejection of malformed shards. Expected positions are derived by hand
 * from llm.c's rule (llmc/dataloader.h) in the comments, not from the code. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/data.h"
#include "tests/test_fixtures.h"

static char g_dir[TU_TMPDIR_LEN];

static void setup(void) { tu_tmpdir_create(g_dir, "mt_data"); }
static void teardown(void) { tu_tmpdir_remove(g_dir); }

TestSuite(data, .init = setup, .fini = teardown);

static char *path_in(const char *name) { return tu_path_in(g_dir, name); }

/* Token i of shard s: distinct everywhere, so a token says where it came from. */
static uint32_t tok(int s, int64_t i, uint32_t base) { return base + (uint32_t)(s * 1000 + i); }

static void make_shard(const char *name, int s, int64_t count, int wide, uint32_t base) {
    uint32_t *t = malloc((size_t)count * 4);
    for (int64_t i = 0; i < count; i++) t[i] = tok(s, i, base);
    cr_assert_eq(mt_data_write_shard(path_in(name), t, count, wide), MT_OK, "%s", mt_last_error());
    free(t);
}

/* The window read at (shard s, token offset o): tokens o.., labels o+1.. */
static void expect_window(const int32_t *x, const int32_t *y, int64_t n, int s, int64_t o, uint32_t base) {
    for (int64_t i = 0; i < n; i++) {
        cr_assert_eq((uint32_t)x[i], tok(s, o + i, base), "input %lld: %d, want shard %d offset %lld", (long long)i,
                     x[i], s, (long long)(o + i));
        cr_assert_eq((uint32_t)y[i], tok(s, o + i + 1, base), "label %lld", (long long)i);
    }
}

Test(data, shard_bytes_match_llm_c_layout) {
    const uint32_t t[3] = {1, 258, 65535};
    cr_assert_eq(mt_data_write_shard(path_in("a.bin"), t, 3, 0), MT_OK);
    FILE *f = fopen(path_in("a.bin"), "rb");
    int32_t h[256];
    cr_assert_eq(fread(h, 4, 256, f), 256u);
    cr_assert_eq(h[0], 20240520);
    cr_assert_eq(h[1], 1);
    cr_assert_eq(h[2], 3);
    for (int k = 3; k < 256; k++) cr_assert_eq(h[k], 0);
    unsigned char b[7];
    cr_assert_eq(fread(b, 1, 7, f), 6u, "file must be 1024 + 2*3 bytes");
    fclose(f);
    const unsigned char want[6] = {1, 0, 2, 1, 0xff, 0xff}; /* little-endian uint16 */
    cr_assert_eq(memcmp(b, want, 6), 0);

    const uint32_t w[2] = {70000, 5};
    cr_assert_eq(mt_data_write_shard(path_in("b.bin"), w, 2, 1), MT_OK);
    f = fopen(path_in("b.bin"), "rb");
    cr_assert_eq(fread(h, 4, 256, f), 256u);
    cr_assert(h[0] == 20240801 && h[1] == 7 && h[2] == 2);
    uint32_t r[3];
    cr_assert_eq(fread(r, 4, 3, f), 2u);
    cr_assert(r[0] == 70000 && r[1] == 5);
    fclose(f);

    cr_assert_eq(mt_data_write_shard(path_in("c.bin"), w, 2, 0), MT_ERR_INVALID, "70000 does not fit uint16");
    cr_assert(strstr(mt_last_error(), "70000"), "%s", mt_last_error());
    cr_assert_neq(access(path_in("c.bin"), F_OK), 0);
    cr_assert_neq(access(path_in("c.bin.tmp"), F_OK), 0);
}

Test(data, order_labels_wrap_and_epoch) {
    /* B=2, T=4: window 8 tokens (+1 for the last label). Shard 0 has 30 tokens, shard 1
     * has 20. llm.c advances by 8 and moves on when offset + 9 > count:
     *   shard 0: 0 (0+9<=30), 8 (17<=30), 16 (25<=30), 24 (33>30 -> next shard)
     *   shard 1: 0, 8 (17<=20), 16 (25>20 -> wrap to shard 0, epoch 1). */
    make_shard("train_000001.bin", 1, 20, 0, 0);
    make_shard("train_000000.bin", 0, 30, 0, 0);
    make_shard("val_000000.bin", 7, 30, 0, 0);     /* other split: ignored */
    make_shard("train_notes.txt", 8, 30, 0, 0);    /* not .bin: ignored */
    mt_data_loader *d;
    cr_assert_eq(mt_data_open(&d, g_dir, "train", 2, 4, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_data_shard_count(d), 2);
    cr_assert_eq(mt_data_total_tokens(d), 50);
    cr_assert_eq(mt_data_max_token(d), 1019); /* tok(1, 19) */
    const struct { int s; int64_t o, e; } want[] = {{0, 0, 0}, {0, 8, 0}, {0, 16, 0}, {1, 0, 0},
                                                   {1, 8, 0}, {0, 0, 1}, {0, 8, 1}};
    int32_t x[8], y[8];
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        mt_data_position p = mt_data_tell(d);
        cr_assert(p.shard == want[k].s && p.offset == want[k].o && p.epoch == want[k].e,
                  "step %zu at (%lld, %lld, %lld)", k, (long long)p.shard, (long long)p.offset, (long long)p.epoch);
        cr_assert_eq(mt_data_next(d, x, y), MT_OK);
        expect_window(x, y, 8, want[k].s, want[k].o, 0);
    }
    mt_data_rewind(d);
    mt_data_position p = mt_data_tell(d);
    cr_assert(p.shard == 0 && p.offset == 0 && p.epoch == 0);
    cr_assert_eq(mt_data_next(d, x, y), MT_OK);
    expect_window(x, y, 8, 0, 0, 0);
    mt_data_close(d);

    cr_assert_eq(mt_data_open(&d, g_dir, "val", 2, 4, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_data_next(d, x, y), MT_OK);
    expect_window(x, y, 8, 7, 0, 0);
    mt_data_close(d);
}

Test(data, ranks_slice_the_global_window) {
    /* world 2, B=1, T=4: the global window is 8; rank r reads at offset + 4r. Together
     * the two ranks see exactly what one process with B=2 sees, step by step. */
    make_shard("train_000000.bin", 0, 41, 0, 0);
    make_shard("train_000001.bin", 1, 26, 0, 0);
    mt_data_loader *r0, *r1, *one;
    cr_assert_eq(mt_data_open(&r0, g_dir, "train", 1, 4, 0, 2), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_data_open(&r1, g_dir, "train", 1, 4, 1, 2), MT_OK);
    cr_assert_eq(mt_data_open(&one, g_dir, "train", 2, 4, 0, 1), MT_OK);
    for (int step = 0; step < 12; step++) {
        int32_t x0[4], y0[4], x1[4], y1[4], x[8], y[8];
        mt_data_position p0 = mt_data_tell(r0), p1 = mt_data_tell(r1);
        cr_assert(p0.shard == p1.shard && p0.offset == p1.offset && p0.epoch == p1.epoch);
        cr_assert_eq(mt_data_next(r0, x0, y0), MT_OK);
        cr_assert_eq(mt_data_next(r1, x1, y1), MT_OK);
        cr_assert_eq(mt_data_next(one, x, y), MT_OK);
        expect_window(x0, y0, 4, (int)p0.shard, p0.offset, 0);
        expect_window(x1, y1, 4, (int)p0.shard, p0.offset + 4, 0);
        cr_assert_eq(memcmp(x, x0, 16), 0, "step %d", step);
        cr_assert_eq(memcmp(x + 4, x1, 16), 0, "step %d", step);
        cr_assert_eq(memcmp(y, y0, 16), 0);
        cr_assert_eq(memcmp(y + 4, y1, 16), 0);
    }
    /* 41 tokens: offsets 0, 8, 16, 24, 32 (32+9=41 fits) then shard 1: 0, 8, 16 (25<=26),
     * then epoch 1: after 8 steps we are back at shard 0; 12 steps -> (0, 32, 1). */
    mt_data_position p = mt_data_tell(r0);
    cr_assert(p.shard == 0 && p.offset == 32 && p.epoch == 1, "(%lld, %lld, %lld)", (long long)p.shard,
              (long long)p.offset, (long long)p.epoch);
    mt_data_close(r0);
    mt_data_close(r1);
    mt_data_close(one);
    /* rank outside [0, world) */
    mt_data_loader *bad = (mt_data_loader *)0x1;
    cr_assert_eq(mt_data_open(&bad, g_dir, "train", 1, 4, 2, 2), MT_ERR_INVALID);
    cr_assert_null(bad);
}

Test(data, tell_seek_resumes_the_same_batches) {
    make_shard("train_000000.bin", 0, 50, 0, 0);
    make_shard("train_000001.bin", 1, 33, 0, 0);
    mt_data_loader *a, *b;
    cr_assert_eq(mt_data_open(&a, g_dir, "train", 2, 3, 0, 1), MT_OK, "%s", mt_last_error());
    int32_t x[6], y[6], xs[10][6], ys[10][6];
    for (int k = 0; k < 9; k++) cr_assert_eq(mt_data_next(a, x, y), MT_OK);
    mt_data_position p = mt_data_tell(a);
    for (int k = 0; k < 10; k++) cr_assert_eq(mt_data_next(a, xs[k], ys[k]), MT_OK);
    mt_data_close(a);

    cr_assert_eq(mt_data_open(&b, g_dir, "train", 2, 3, 0, 1), MT_OK);
    cr_assert_eq(mt_data_seek(b, p), MT_OK, "%s", mt_last_error());
    for (int k = 0; k < 10; k++) {
        cr_assert_eq(mt_data_next(b, x, y), MT_OK);
        cr_assert_eq(memcmp(x, xs[k], sizeof x), 0, "batch %d after resume differs", k);
        cr_assert_eq(memcmp(y, ys[k], sizeof y), 0);
    }
    /* Invalid positions. */
    mt_data_position q = {0, 5, 0}; /* not a multiple of the window 6 */
    cr_assert_eq(mt_data_seek(b, q), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "offset 5"), "%s", mt_last_error());
    q = (mt_data_position){2, 0, 0};
    cr_assert_eq(mt_data_seek(b, q), MT_ERR_INVALID);
    q = (mt_data_position){1, 30, 0}; /* 30 + 7 > 33 */
    cr_assert_eq(mt_data_seek(b, q), MT_ERR_INVALID);
    q = (mt_data_position){0, 0, -1};
    cr_assert_eq(mt_data_seek(b, q), MT_ERR_INVALID);
    mt_data_close(b);
}

Test(data, uint32_shards) {
    /* Tokens above 65535 need the 20240801 / version 7 format. */
    make_shard("train_000000.bin", 0, 20, 1, 200000);
    make_shard("train_000001.bin", 1, 20, 0, 0); /* uint16 and uint32 shards may mix */
    mt_data_loader *d;
    cr_assert_eq(mt_data_open(&d, g_dir, "train", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_data_max_token(d), 200019);
    int32_t x[8], y[8];
    cr_assert_eq(mt_data_next(d, x, y), MT_OK);
    expect_window(x, y, 8, 0, 0, 200000);
    cr_assert_eq(mt_data_next(d, x, y), MT_OK); /* 8 + 9 <= 20 */
    expect_window(x, y, 8, 0, 8, 200000);
    cr_assert_eq(mt_data_next(d, x, y), MT_OK); /* 16 + 9 > 20: shard 1 */
    expect_window(x, y, 8, 1, 0, 0);
    mt_data_close(d);
}

static void write_header(const char *path, int32_t magic, int32_t version, int32_t count, int64_t ntok_bytes) {
    FILE *f = fopen(path, "wb");
    int32_t h[256] = {0};
    h[0] = magic;
    h[1] = version;
    h[2] = count;
    fwrite(h, 4, 256, f);
    for (int64_t i = 0; i < ntok_bytes; i++) fputc(1, f);
    fclose(f);
}

static void expect_open_fails(mt_status want, const char *n1, const char *n2) {
    mt_data_loader *d = (mt_data_loader *)0x1;
    mt_status s = mt_data_open(&d, g_dir, "train", 2, 4, 0, 1);
    cr_assert_eq(s, want, "status %d (%s)", s, mt_last_error());
    cr_assert_null(d);
    if (n1) cr_assert(strstr(mt_last_error(), n1), "message lacks '%s': %s", n1, mt_last_error());
    if (n2) cr_assert(strstr(mt_last_error(), n2), "message lacks '%s': %s", n2, mt_last_error());
}

Test(data, malformed_shards) {
    make_shard("train_000000.bin", 0, 30, 0, 0);
    const char *p = path_in("train_000001.bin");

    write_header(p, 20240521, 1, 30, 60);
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "20240521");
    write_header(p, 20240520, 2, 30, 60);
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "version 2");
    write_header(p, 20240801, 1, 30, 120);
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "version 1");
    write_header(p, 20240520, 1, 30, 59); /* one byte short */
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "1083");
    write_header(p, 20240520, 1, 30, 62); /* two bytes too many */
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "1086");
    write_header(p, 20240520, 1, -3, 0);
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "-3");
    FILE *f = fopen(p, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "truncated");
    /* Shorter than one window: B*T + 1 = 9 tokens needed. */
    make_shard("train_000001.bin", 1, 8, 0, 0);
    expect_open_fails(MT_ERR_FORMAT, "train_000001.bin", "8 tokens");
    make_shard("train_000001.bin", 1, 9, 0, 0);
    mt_data_loader *d;
    cr_assert_eq(mt_data_open(&d, g_dir, "train", 2, 4, 0, 1), MT_OK, "exactly one window must do: %s",
                 mt_last_error());
    mt_data_close(d);
}

Test(data, missing_directory_or_shards) {
    mt_data_loader *d = (mt_data_loader *)0x1;
    char missing[128];
    snprintf(missing, sizeof missing, "%s/nope", g_dir);
    cr_assert_eq(mt_data_open(&d, missing, "train", 1, 4, 0, 1), MT_ERR_IO);
    cr_assert_null(d);
    cr_assert(strstr(mt_last_error(), missing) && strstr(mt_last_error(), "train_*.bin"), "%s", mt_last_error());
    make_shard("val_000000.bin", 0, 30, 0, 0);
    cr_assert_eq(mt_data_open(&d, g_dir, "train", 1, 4, 0, 1), MT_ERR_IO);
    cr_assert(strstr(mt_last_error(), g_dir) && strstr(mt_last_error(), "train_*.bin"), "%s", mt_last_error());
    cr_assert_eq(mt_data_open(&d, g_dir, "val", 0, 4, 0, 1), MT_ERR_INVALID);
}

/* ---------------------------------------------- naming, globs and lists ---- */

static mt_data_options files_opt(const char *files) {
    return (mt_data_options){files, "train_files", 0, 0, 1};
}

/* The base names of d's shards, joined by spaces. */
static const char *shard_names(const mt_data_loader *d) {
    static char buf[1024];
    buf[0] = '\0';
    for (int64_t i = 0; i < mt_data_shard_count(d); i++) {
        const char *p = strrchr(mt_data_shard_path(d, i), '/');
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? " " : "", p ? p + 1 : "");
    }
    return buf;
}

Test(data, llm_c_names_in_natural_order) {
    /* llm.c's dev/data scripts: <name>_val_000000.bin, <name>_train_000001.bin ..., and
     * tinyshakespeare.py's <name>_train.bin. Natural order puts 2 before 10 (strcmp
     * would not). */
    make_shard("fw_train_10.bin", 3, 20, 0, 0);
    make_shard("fw_train_2.bin", 2, 20, 0, 0);
    make_shard("fw_train_000001.bin", 1, 20, 0, 0);
    make_shard("fw_val_000000.bin", 0, 20, 0, 0);
    make_shard("notes_training.bin", 5, 20, 0, 0); /* "_training" is not "_train_" */
    make_shard("_train_1.bin", 6, 20, 0, 0);       /* no <name> before _train_ */
    mt_data_loader *d;
    cr_assert_eq(mt_data_open(&d, g_dir, "train", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "fw_train_000001.bin fw_train_2.bin fw_train_10.bin");
    int32_t x[8], y[8];
    for (int s = 1; s <= 3; s++)
        for (int64_t o = 0; o < 16; o += 8) {
            cr_assert_eq(mt_data_next(d, x, y), MT_OK);
            expect_window(x, y, 8, s, o, 0);
        }
    mt_data_close(d);
    cr_assert_eq(mt_data_open(&d, g_dir, "val", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "fw_val_000000.bin");
    mt_data_close(d);
    make_shard("tiny_shakespeare_val.bin", 7, 20, 0, 0);
    cr_assert_eq(mt_data_open(&d, g_dir, "val", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "fw_val_000000.bin tiny_shakespeare_val.bin");
    mt_data_close(d);
}

Test(data, two_namings_in_one_directory_are_an_error) {
    make_shard("train_000.bin", 0, 20, 0, 0);
    make_shard("x_train_000000.bin", 1, 20, 0, 0);
    make_shard("val_000.bin", 2, 20, 0, 0);
    mt_data_loader *d = (mt_data_loader *)0x1;
    cr_assert_eq(mt_data_open(&d, g_dir, "train", 1, 8, 0, 1), MT_ERR_INVALID, "%s", mt_last_error());
    cr_assert_null(d);
    const char *m = mt_last_error();
    cr_assert(strstr(m, "train_000.bin") && strstr(m, "x_train_000000.bin") && strstr(m, "dataset_path"), "%s", m);
    /* the val split has one naming: fine */
    cr_assert_eq(mt_data_open(&d, g_dir, "val", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    mt_data_close(d);
    /* a glob that selects one naming is not ambiguous */
    char glob[300];
    snprintf(glob, sizeof glob, "%s/x_*", g_dir);
    cr_assert_eq(mt_data_open(&d, glob, "train", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "x_train_000000.bin");
    mt_data_close(d);
}

Test(data, dataset_path_glob_and_file_lists) {
    make_shard("a_train_1.bin", 1, 20, 0, 0);
    make_shard("a_train_3.bin", 3, 20, 0, 0);
    make_shard("b_train_2.bin", 2, 20, 0, 0);
    make_shard("a_val_1.bin", 4, 20, 0, 0);
    mt_data_loader *d;
    char p[1024];
    /* dataset_path as a glob: the split is still chosen by naming */
    snprintf(p, sizeof p, "%s/a_*.bin", g_dir);
    cr_assert_eq(mt_data_open(&d, p, "train", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "a_train_1.bin a_train_3.bin");
    mt_data_close(d);
    cr_assert_eq(mt_data_open(&d, p, "val", 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "a_val_1.bin");
    mt_data_close(d);
    snprintf(p, sizeof p, "%s/b_*.bin", g_dir);
    cr_assert_eq(mt_data_open(&d, p, "val", 1, 8, 0, 1), MT_ERR_IO);
    cr_assert(strstr(mt_last_error(), "b_*.bin") && strstr(mt_last_error(), "val"), "%s", mt_last_error());

    /* a list: entries in list order, a glob's matches in natural order; dataset_path unused */
    snprintf(p, sizeof p, "[%s/b_train_2.bin, '%s/a_train_*.bin']", g_dir, g_dir);
    mt_data_options o = files_opt(p);
    cr_assert_eq(mt_data_open_ex(&d, "/no/such/dir", "train", &o, 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "b_train_2.bin a_train_1.bin a_train_3.bin");
    int32_t x[8], y[8];
    cr_assert_eq(mt_data_next(d, x, y), MT_OK);
    expect_window(x, y, 8, 2, 0, 0);
    mt_data_close(d);
    snprintf(p, sizeof p, "%s/a_val_1.bin,%s/a_train_3.bin", g_dir, g_dir); /* command-line form */
    o = files_opt(p);
    cr_assert_eq(mt_data_open_ex(&d, NULL, "val", &o, 1, 8, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_str_eq(shard_names(d), "a_val_1.bin a_train_3.bin");
    mt_data_close(d);

    /* errors name the key and the entry */
    struct { const char *fmt; mt_status want; const char *says; } bad[] = {
        {"%s/a_train_1.bin, %s/missing.bin", MT_ERR_IO, "missing.bin"},
        {"%s/a_train_1.bin, %s/z_*.bin", MT_ERR_IO, "z_*.bin"},
        {"%s/a_train_*.bin, %s/a_train_3.bin", MT_ERR_INVALID, "a_train_3.bin"},
        {"%s/a_train_1.bin,, %s", MT_ERR_INVALID, "empty"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(p, sizeof p, bad[i].fmt, g_dir, g_dir);
        o = files_opt(p);
        d = (mt_data_loader *)0x1;
        cr_assert_eq(mt_data_open_ex(&d, g_dir, "train", &o, 1, 8, 0, 1), bad[i].want, "case %zu: %s", i,
                     mt_last_error());
        cr_assert_null(d);
        cr_assert(strstr(mt_last_error(), "train_files") && strstr(mt_last_error(), bad[i].says), "case %zu: %s", i,
                  mt_last_error());
    }
    o = files_opt(g_dir); /* a directory is not a shard */
    cr_assert_eq(mt_data_open_ex(&d, g_dir, "train", &o, 1, 8, 0, 1), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "train_files"), "%s", mt_last_error());
}

/* ---------------------------------------------------------------- shuffle ---- */

static mt_data_options shuffle_opt(uint64_t seed, int64_t micro_batches) {
    return (mt_data_options){NULL, NULL, 1, seed, micro_batches};
}

/* Three shards of 2, 4 and 3 windows (B=2, T=4: window 8, units of 8 tokens). */
static const int64_t k_counts[3] = {20, 40, 30};
static const int64_t k_windows = 2 + 4 + 3;

/* Read one epoch's windows as shard*100 + offset/8, checking each window's tokens
 * and that the position's epoch is e until the last window is read. */
static void read_epoch(mt_data_loader *d, int64_t e, int out[]) {
    int32_t x[8], y[8];
    for (int64_t k = 0; k < k_windows; k++) {
        cr_assert_eq(mt_data_tell(d).epoch, e, "window %lld of epoch %lld", (long long)k, (long long)e);
        cr_assert_eq(mt_data_next(d, x, y), MT_OK, "%s", mt_last_error());
        const int s = x[0] / 1000;
        const int64_t o = x[0] % 1000;
        cr_assert(s >= 0 && s < 3 && o % 8 == 0 && o + 9 <= k_counts[s], "window at shard %d offset %lld", s,
                  (long long)o);
        expect_window(x, y, 8, s, o, 0);
        out[k] = s * 100 + (int)(o / 8);
    }
    cr_assert_eq(mt_data_tell(d).epoch, e + 1);
    cr_assert_eq(mt_data_tell(d).shard, 0);
    cr_assert_eq(mt_data_tell(d).offset, 0);
}

static void make_three(void) {
    for (int s = 0; s < 3; s++) {
        char n[32];
        snprintf(n, sizeof n, "train_%06d.bin", s);
        make_shard(n, s, k_counts[s], 0, 0);
    }
}

Test(data, shuffle_permutes_every_window_once_per_epoch) {
    make_three();
    mt_data_loader *d, *other;
    mt_data_options o = shuffle_opt(7, 1);
    cr_assert_eq(mt_data_open_ex(&d, g_dir, "train", &o, 2, 4, 0, 1), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_data_windows_per_epoch(d), k_windows);
    o.shuffle_seed = 8;
    cr_assert_eq(mt_data_open_ex(&other, g_dir, "train", &o, 2, 4, 0, 1), MT_OK);
    enum { EPOCHS = 12 };
    int seen[EPOCHS][9], alt[9];
    int file_order = 0, first_shards = 0;
    for (int e = 0; e < EPOCHS; e++) {
        read_epoch(d, e, seen[e]);
        /* every window exactly once */
        int hits[3][4] = {{0}};
        for (int k = 0; k < k_windows; k++) hits[seen[e][k] / 100][seen[e][k] % 100]++;
        for (int s = 0; s < 3; s++)
            for (int w = 0; w < 4; w++)
                cr_assert_eq(hits[s][w], w < (k_counts[s] - 1) / 8 ? 1 : 0, "epoch %d: shard %d window %d read %d times",
                             e, s, w, hits[s][w]);
        /* a shard's windows are read together (llm.c shuffles shards, then within one) */
        for (int k = 1; k < k_windows; k++)
            if (seen[e][k] / 100 != seen[e][k - 1] / 100)
                for (int j = k + 1; j < k_windows; j++)
                    cr_assert_neq(seen[e][j] / 100, seen[e][k - 1] / 100, "epoch %d: shard %d read in two parts", e,
                                  seen[e][k - 1] / 100);
        static const int identity[9] = {0, 1, 100, 101, 102, 103, 200, 201, 202};
        file_order += memcmp(seen[e], identity, sizeof identity) == 0;
        first_shards |= 1 << (seen[e][0] / 100);
        if (e > 0) cr_assert_neq(memcmp(seen[e], seen[e - 1], sizeof seen[e]), 0, "epochs %d and %d read the same order",
                                 e - 1, e);
        read_epoch(other, e, alt);
        cr_assert_neq(memcmp(seen[e], alt, sizeof alt), 0, "seeds 7 and 8 give the same order in epoch %d", e);
    }
    cr_assert_eq(file_order, 0, "a shuffled epoch came out in file order");
    cr_assert_eq(first_shards, 7, "over %d epochs not every shard came first (mask %d)", EPOCHS, first_shards);
    mt_data_close(d);
    mt_data_close(other);
    /* the same seed gives the same order */
    o.shuffle_seed = 7;
    cr_assert_eq(mt_data_open_ex(&d, g_dir, "train", &o, 2, 4, 0, 1), MT_OK);
    for (int e = 0; e < 2; e++) {
        read_epoch(d, e, alt);
        cr_assert_eq(memcmp(alt, seen[e], sizeof alt), 0, "epoch %d differs for the same seed", e);
    }
    mt_data_close(d);
}

Test(data, shuffle_seek_resumes_mid_epoch_and_across_epochs) {
    make_three();
    mt_data_options o = shuffle_opt(3, 1);
    mt_data_loader *a, *b;
    cr_assert_eq(mt_data_open_ex(&a, g_dir, "train", &o, 2, 4, 0, 1), MT_OK, "%s", mt_last_error());
    enum { N = 12 * 9 }; /* twelve epochs: some end on the shard the next one starts with */
    int32_t xs[N][8], ys[N][8];
    mt_data_position at[N];
    for (int k = 0; k < N; k++) {
        at[k] = mt_data_tell(a);
        cr_assert_eq(mt_data_next(a, xs[k], ys[k]), MT_OK);
    }
    mt_data_close(a);
    /* from every position of twelve epochs: mid-shard, at a shard start, just before
     * and at an epoch boundary; a fresh loader each time (nothing cached carries over) */
    for (int k = 0; k < N - 1; k++) {
        cr_assert_eq(mt_data_open_ex(&b, g_dir, "train", &o, 2, 4, 0, 1), MT_OK);
        cr_assert_eq(mt_data_seek(b, at[k]), MT_OK, "%s", mt_last_error());
        for (int j = k; j < N && j < k + 12; j++) {
            int32_t x[8], y[8];
            cr_assert_eq(mt_data_next(b, x, y), MT_OK);
            cr_assert(memcmp(x, xs[j], sizeof x) == 0 && memcmp(y, ys[j], sizeof y) == 0,
                      "resumed at window %d (shard slot %lld, offset %lld, epoch %lld): window %d differs", k,
                      (long long)at[k].shard, (long long)at[k].offset, (long long)at[k].epoch, j);
        }
        mt_data_close(b);
    }
    cr_assert_eq(at[k_windows].epoch, 1);
    cr_assert_eq(at[3 * k_windows + 1].epoch, 3);
    /* an offset past the units of the shard at that slot */
    cr_assert_eq(mt_data_open_ex(&b, g_dir, "train", &o, 2, 4, 0, 1), MT_OK);
    int bad = 0;
    for (int64_t slot = 0; slot < 3; slot++)
        bad += mt_data_seek(b, (mt_data_position){slot, 24, 0}) == MT_ERR_INVALID; /* 24 fits shard 1 only */
    cr_assert_eq(bad, 2);
    mt_data_close(b);
}

Test(data, shuffle_same_global_batch_for_any_layout) {
    make_three();
    /* world 2 x B=1 and world 1 x B=2 read the same windows (each rank its slice) */
    mt_data_options o = shuffle_opt(11, 1);
    mt_data_loader *r0, *r1, *one;
    cr_assert_eq(mt_data_open_ex(&r0, g_dir, "train", &o, 1, 4, 0, 2), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_data_open_ex(&r1, g_dir, "train", &o, 1, 4, 1, 2), MT_OK);
    cr_assert_eq(mt_data_open_ex(&one, g_dir, "train", &o, 2, 4, 0, 1), MT_OK);
    for (int k = 0; k < 3 * k_windows; k++) {
        int32_t x0[4], y0[4], x1[4], y1[4], x[8], y[8];
        cr_assert_eq(mt_data_next(r0, x0, y0), MT_OK);
        cr_assert_eq(mt_data_next(r1, x1, y1), MT_OK);
        cr_assert_eq(mt_data_next(one, x, y), MT_OK);
        cr_assert(memcmp(x, x0, 16) == 0 && memcmp(x + 4, x1, 16) == 0, "window %d: ranks differ from one process", k);
        cr_assert(memcmp(y, y0, 16) == 0 && memcmp(y + 4, y1, 16) == 0);
    }
    mt_data_close(r0);
    mt_data_close(r1);
    mt_data_close(one);
    /* B=1 x 2 micro-batches reads what B=2 x 1 reads: a shuffled unit is one step */
    mt_data_loader *ga, *big;
    o = shuffle_opt(11, 2);
    cr_assert_eq(mt_data_open_ex(&ga, g_dir, "train", &o, 1, 4, 0, 1), MT_OK, "%s", mt_last_error());
    o = shuffle_opt(11, 1);
    cr_assert_eq(mt_data_open_ex(&big, g_dir, "train", &o, 2, 4, 0, 1), MT_OK);
    cr_assert_eq(mt_data_windows_per_epoch(ga), 2 * k_windows);
    for (int k = 0; k < 3 * k_windows; k++) {
        int32_t a[8], al[8], x[8], y[8];
        cr_assert_eq(mt_data_next(ga, a, al), MT_OK);
        cr_assert_eq(mt_data_next(ga, a + 4, al + 4), MT_OK);
        cr_assert_eq(mt_data_next(big, x, y), MT_OK);
        cr_assert(memcmp(a, x, sizeof x) == 0 && memcmp(al, y, sizeof y) == 0, "step %d: micro-batches differ", k);
    }
    mt_data_close(ga);
    mt_data_close(big);
    /* shards shorter than a step's unit are refused when shuffling (named) */
    o = shuffle_opt(11, 3); /* unit 24 + 1 > 20 tokens of shard 0 */
    mt_data_loader *d = (mt_data_loader *)0x1;
    cr_assert_eq(mt_data_open_ex(&d, g_dir, "train", &o, 2, 4, 0, 1), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_error(), "train_000000.bin") && strstr(mt_last_error(), "gradient_accumulation_steps"),
              "%s", mt_last_error());
}
