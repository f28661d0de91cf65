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

static char g_dir[64];

static void setup(void) {
    strcpy(g_dir, "/tmp/mt_data_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(data, .init = setup, .fini = teardown);

static char *path_in(const char *name) {
    static char buf[32][256];
    static int k;
    char *p = buf[k++ % 32];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

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
