/* tests/test_safetensors.c: safetensors round trips, conversions, and rejection of
 * malformed files (each error must name the file and the tensor). Expected values
 * are written as IEEE bit patterns by hand, not produced by the code under test. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/safetensors.h"
#include "tests/test_fixtures.h"

static char g_dir[TU_TMPDIR_LEN];

static void setup(void) { tu_tmpdir_create(g_dir, "mt_st"); }
static void teardown(void) { tu_tmpdir_remove(g_dir); }

TestSuite(safetensors, .init = setup, .fini = teardown);

static char *path_in(const char *name) { return tu_path_in(g_dir, name); }

/* A file with the given header text (length prefix = strlen + extra_len) and data. */
static void write_raw(const char *path, const char *header, long long len_delta, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    uint64_t len = (uint64_t)((long long)strlen(header) + len_delta);
    unsigned char lb[8];
    for (int k = 0; k < 8; k++) lb[k] = (unsigned char)(len >> (8 * k));
    fwrite(lb, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

/* Opening must fail with `want`, and the message must mention every needle. */
static void expect_open_fails(const char *path, mt_status want, const char *needle1, const char *needle2) {
    mt_safetensors *f = (mt_safetensors *)0x1;
    mt_status s = mt_safetensors_open(&f, path);
    cr_assert_eq(s, want, "status %d, want %d (%s)", s, want, mt_last_error());
    cr_assert_null(f);
    cr_assert(strstr(mt_last_error(), path), "message does not name the file: %s", mt_last_error());
    if (needle1) cr_assert(strstr(mt_last_error(), needle1), "message lacks '%s': %s", needle1, mt_last_error());
    if (needle2) cr_assert(strstr(mt_last_error(), needle2), "message lacks '%s': %s", needle2, mt_last_error());
}

static float f32_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

Test(safetensors, round_trip_all_dtypes_and_metadata) {
    const float a[6] = {1.0f, -2.5f, 3.0e-39f /* subnormal */, 65504.0f, -0.0f, 1e30f};
    /* bf16 bits: 1.0, -2.0, 0.5, 1.5, 2^-133 (smallest positive subnormal bf16 is 2^-133). */
    const uint16_t bf[5] = {0x3F80, 0xC000, 0x3F00, 0x3FC0, 0x0001};
    const float bf_want[5] = {1.0f, -2.0f, 0.5f, 1.5f, f32_bits(0x00010000u)};
    /* f16 bits: 1.0, -2.0, 0.5, 65504 (max), 2^-24 (smallest subnormal), 2^-14 (smallest normal). */
    const uint16_t h[6] = {0x3C00, 0xC000, 0x3800, 0x7BFF, 0x0001, 0x0400};
    const float h_want[6] = {1.0f, -2.0f, 0.5f, 65504.0f, 5.9604644775390625e-08f, 6.103515625e-05f};
    const double g[3] = {0.1, -1e-300 /* rounds to -0 in float */, 12345.678};
    const int32_t iv[4] = {-1, 0, 7, INT32_MAX};
    const uint32_t uv[2] = {0xFFFFFFFFu, 3};
    const uint16_t u16[3] = {1, 65535, 9};
    mt_st_write_tensor t[] = {
        {"a.weight", MT_F32, 2, {2, 3}, a},
        {"bf", MT_BF16, 1, {5}, bf},
        {"half \"quoted\" \\ name", MT_F16, 3, {1, 2, 3}, h},
        {"dbl", MT_F64, 1, {3}, g},
        {"ints", MT_I32, 2, {2, 2}, iv},
        {"u32", MT_U32, 1, {2}, uv},
        {"u16", MT_U16, 1, {3}, u16},
        {"scalar", MT_F32, 0, {0}, a},
        {"empty", MT_F32, 2, {0, 4}, NULL},
    };
    const char *meta[] = {"format", "pt", "step", "12", NULL};
    const char *p = path_in("m.safetensors");
    cr_assert_eq(mt_safetensors_write(p, t, 9, meta), MT_OK, "%s", mt_last_error());

    /* Header length is a multiple of 8 and the header is JSON starting with '{'. */
    FILE *fp = fopen(p, "rb");
    unsigned char lb[8];
    cr_assert_eq(fread(lb, 1, 8, fp), 8u);
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = (hl << 8) | lb[k];
    cr_assert_eq(hl % 8, 0u);
    cr_assert_eq(fgetc(fp), '{');
    fclose(fp);
    struct stat st;
    stat(p, &st);
    /* data = 24 + 10 + 12 + 24 + 16 + 8 + 6 + 4 + 0 bytes */
    cr_assert_eq((uint64_t)st.st_size, 8 + hl + 104);
    cr_assert_neq(access(path_in("m.safetensors.tmp"), F_OK), 0, "tmp file left behind");

    mt_safetensors *f;
    cr_assert_eq(mt_safetensors_open(&f, p), MT_OK, "%s", mt_last_error());
    cr_assert_eq(mt_safetensors_count(f), 9);
    cr_assert_str_eq(mt_safetensors_metadata(f, "format"), "pt");
    cr_assert_str_eq(mt_safetensors_metadata(f, "step"), "12");
    cr_assert_null(mt_safetensors_metadata(f, "nope"));
    cr_assert_eq(mt_safetensors_find(f, "nope"), -1);

    int i = mt_safetensors_find(f, "a.weight");
    const mt_st_tensor *ti = mt_safetensors_tensor(f, i);
    cr_assert_eq(ti->dtype, MT_F32);
    cr_assert_eq(ti->ndim, 2);
    cr_assert_eq(ti->shape[0], 2);
    cr_assert_eq(ti->shape[1], 3);
    cr_assert_eq(ti->end - ti->begin, 24u);
    float out[6];
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 6), MT_OK, "%s", mt_last_error());
    cr_assert_eq(memcmp(out, a, sizeof a), 0, "F32 must round-trip bit for bit");

    i = mt_safetensors_find(f, "bf");
    cr_assert_eq(mt_safetensors_tensor(f, i)->dtype, MT_BF16);
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 5), MT_OK, "%s", mt_last_error());
    for (int k = 0; k < 5; k++) cr_assert_eq(out[k], bf_want[k], "bf16 element %d: %g", k, out[k]);

    i = mt_safetensors_find(f, "half \"quoted\" \\ name");
    cr_assert_geq(i, 0, "escaped name not found");
    cr_assert_eq(mt_safetensors_tensor(f, i)->ndim, 3);
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 6), MT_OK, "%s", mt_last_error());
    for (int k = 0; k < 6; k++) cr_assert_eq(out[k], h_want[k], "f16 element %d: %g", k, out[k]);

    i = mt_safetensors_find(f, "dbl");
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 3), MT_OK, "%s", mt_last_error());
    cr_assert_eq(out[0], 0.1f);
    cr_assert_eq(out[1], 0.0f);
    cr_assert(signbit(out[1]));
    cr_assert_eq(out[2], 12345.678f);

    int32_t io[4];
    i = mt_safetensors_find(f, "ints");
    cr_assert_eq(mt_safetensors_read_raw(f, i, io, sizeof io), MT_OK, "%s", mt_last_error());
    cr_assert_eq(memcmp(io, iv, sizeof iv), 0);
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 4), MT_ERR_FORMAT, "integer tensor read as float");
    cr_assert(strstr(mt_last_error(), "ints"));
    uint32_t uo[2];
    cr_assert_eq(mt_safetensors_read_raw(f, mt_safetensors_find(f, "u32"), uo, sizeof uo), MT_OK);
    cr_assert_eq(memcmp(uo, uv, sizeof uv), 0);
    uint16_t u16o[3];
    cr_assert_eq(mt_safetensors_read_raw(f, mt_safetensors_find(f, "u16"), u16o, sizeof u16o), MT_OK);
    cr_assert_eq(memcmp(u16o, u16, sizeof u16), 0);

    i = mt_safetensors_find(f, "scalar");
    cr_assert_eq(mt_safetensors_tensor(f, i)->ndim, 0);
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 1), MT_OK);
    cr_assert_eq(out[0], 1.0f);
    i = mt_safetensors_find(f, "empty");
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 0), MT_OK);

    /* Caller errors. */
    i = mt_safetensors_find(f, "a.weight");
    cr_assert_eq(mt_safetensors_read_f32(f, i, out, 5), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "a.weight"));
    cr_assert_eq(mt_safetensors_read_raw(f, i, out, 20), MT_ERR_INVALID);
    cr_assert_eq(mt_safetensors_read_f32(f, 99, out, 1), MT_ERR_INVALID);
    cr_assert_null(mt_safetensors_tensor(f, 99));
    mt_safetensors_close(f);
}

Test(safetensors, reads_a_hand_written_file) {
    /* Not produced by our writer: keys in another order, metadata last, no padding. */
    const float d[3] = {1.0f, 2.0f, 3.0f};
    const uint16_t b[2] = {0x4000 /* 2.0 */, 0xBF80 /* -1.0 */};
    unsigned char data[16];
    memcpy(data, b, 4);
    memcpy(data + 4, d, 12);
    const char *p = path_in("hand.safetensors");
    write_raw(p,
              "{\"w\": {\"shape\": [3], \"data_offsets\": [4, 16], \"dtype\": \"F32\"},"
              " \"v\": {\"dtype\": \"BF16\", \"data_offsets\": [0, 4], \"shape\": [2]},"
              " \"__metadata__\": {\"format\": \"pt\"}}",
              0, data, 16);
    mt_safetensors *f;
    cr_assert_eq(mt_safetensors_open(&f, p), MT_OK, "%s", mt_last_error());
    float out[3];
    cr_assert_eq(mt_safetensors_read_f32(f, mt_safetensors_find(f, "w"), out, 3), MT_OK);
    cr_assert(out[0] == 1.0f && out[1] == 2.0f && out[2] == 3.0f);
    cr_assert_eq(mt_safetensors_read_f32(f, mt_safetensors_find(f, "v"), out, 2), MT_OK);
    cr_assert(out[0] == 2.0f && out[1] == -1.0f);
    mt_safetensors_close(f);
}

Test(safetensors, truncated_and_bad_length) {
    const char *p = path_in("short.safetensors");
    FILE *f = fopen(p, "wb");
    fwrite("\x10\x00\x00", 1, 3, f);
    fclose(f);
    expect_open_fails(p, MT_ERR_FORMAT, "truncated", NULL);

    /* Header length 1000 but only a short header follows. */
    p = path_in("len.safetensors");
    write_raw(p, "{}", 998, NULL, 0);
    expect_open_fails(p, MT_ERR_FORMAT, "header length", NULL);

    /* A valid file cut short in its data. */
    const float d[4] = {1, 2, 3, 4};
    mt_st_write_tensor t = {"x", MT_F32, 1, {4}, d};
    p = path_in("cut.safetensors");
    cr_assert_eq(mt_safetensors_write(p, &t, 1, NULL), MT_OK);
    struct stat st;
    stat(p, &st);
    cr_assert_eq(truncate(p, st.st_size - 2), 0);
    expect_open_fails(p, MT_ERR_FORMAT, "'x'", NULL);

    expect_open_fails(path_in("missing.safetensors"), MT_ERR_IO, NULL, NULL);
}

Test(safetensors, invalid_json) {
    const char *p = path_in("json.safetensors");
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], ", 0, NULL, 0);
    expect_open_fails(p, MT_ERR_FORMAT, "JSON", NULL);
    write_raw(p, "[1, 2]   ", 0, NULL, 0);
    expect_open_fails(p, MT_ERR_FORMAT, "object", NULL);
    write_raw(p, "{} xx", 0, NULL, 0);
    expect_open_fails(p, MT_ERR_FORMAT, "JSON", NULL);
    const float d = 1;
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
                 "\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
              0, &d, 4);
    expect_open_fails(p, MT_ERR_FORMAT, "'x'", "twice");
    write_raw(p, "{\"__metadata__\": {\"step\": 3}}", 0, NULL, 0);
    expect_open_fails(p, MT_ERR_FORMAT, "step", NULL);
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 0, &d, 4);
    expect_open_fails(p, MT_ERR_FORMAT, "'x'", "shape");
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 0, &d, 4);
    expect_open_fails(p, MT_ERR_FORMAT, "'x'", "shape");
    write_raw(p, "{\"x\": {\"dtype\": \"F32\", \"shape\": [1]}}", 0, &d, 4);
    expect_open_fails(p, MT_ERR_FORMAT, "'x'", "data_offsets");
}

Test(safetensors, bad_offsets) {
    float d[8] = {0};
    const char *p = path_in("off.safetensors");
    /* a [0, 8), b [4, 12): overlap. */
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
              0, d, 12);
    expect_open_fails(p, MT_ERR_FORMAT, "'b'", "overlaps");
    /* b ends past the data. */
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}",
              0, d, 12);
    expect_open_fails(p, MT_ERR_FORMAT, "'b'", "outside");
    /* gap between a and b. */
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}",
              0, d, 20);
    expect_open_fails(p, MT_ERR_FORMAT, "'b'", "gap");
    /* data section longer than the tensors. */
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 0, d, 12);
    expect_open_fails(p, MT_ERR_FORMAT, "12 bytes", NULL);
    /* end - begin does not match shape x dtype. */
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 0, d, 8);
    expect_open_fails(p, MT_ERR_FORMAT, "'a'", "need 12");
    write_raw(p, "{\"a\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}}", 0, d, 16);
    expect_open_fails(p, MT_ERR_FORMAT, "'a'", "need 8");
    /* end < begin. */
    write_raw(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 0]}}", 0, d, 8);
    expect_open_fails(p, MT_ERR_FORMAT, "'a'", NULL);
}

Test(safetensors, unknown_dtype) {
    unsigned char d[4] = {0};
    const char *p = path_in("dt.safetensors");
    write_raw(p, "{\"q\": {\"dtype\": \"F8_E4M3\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 0, d, 4);
    expect_open_fails(p, MT_ERR_FORMAT, "'q'", "unsupported dtype");
    write_raw(p, "{\"q\": {\"dtype\": \"Q4\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 0, d, 4);
    expect_open_fails(p, MT_ERR_FORMAT, "'q'", "Q4");
    write_raw(p, "{\"q\": {\"dtype\": 3, \"shape\": [1], \"data_offsets\": [0, 4]}}", 0, d, 4);
    expect_open_fails(p, MT_ERR_FORMAT, "'q'", "dtype");
}

Test(safetensors, nan_and_inf_are_rejected) {
    const float a[5] = {1, 2, 3, NAN, 5};
    const uint16_t b[3] = {0x3F80, 0x7F80 /* bf16 +Inf */, 0};
    const uint16_t h[2] = {0xFC00 /* f16 -Inf */, 0};
    const double g[2] = {0, 1e300 /* finite, beyond float */};
    mt_st_write_tensor t[] = {
        {"has.nan", MT_F32, 1, {5}, a},
        {"has.inf", MT_BF16, 1, {3}, b},
        {"half.inf", MT_F16, 1, {2}, h},
        {"big", MT_F64, 1, {2}, g},
    };
    const char *p = path_in("nan.safetensors");
    cr_assert_eq(mt_safetensors_write(p, t, 4, NULL), MT_OK);
    mt_safetensors *f;
    cr_assert_eq(mt_safetensors_open(&f, p), MT_OK, "%s", mt_last_error());
    float out[5];
    cr_assert_eq(mt_safetensors_read_f32(f, 0, out, 5), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_error(), p) && strstr(mt_last_error(), "'has.nan'") &&
                  strstr(mt_last_error(), "element 3") && strstr(mt_last_error(), "NaN"),
              "%s", mt_last_error());
    cr_assert_eq(mt_safetensors_read_f32(f, 1, out, 3), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_error(), "'has.inf'") && strstr(mt_last_error(), "element 1") &&
                  strstr(mt_last_error(), "Inf"),
              "%s", mt_last_error());
    cr_assert_eq(mt_safetensors_read_f32(f, 2, out, 2), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_error(), "'half.inf'") && strstr(mt_last_error(), "element 0"), "%s", mt_last_error());
    cr_assert_eq(mt_safetensors_read_f32(f, 3, out, 2), MT_ERR_FORMAT);
    cr_assert(strstr(mt_last_error(), "'big'") && strstr(mt_last_error(), "element 1") && strstr(mt_last_error(), "1e+300"),
              "%s", mt_last_error());
    mt_safetensors_close(f);
}

/* Read tensor "x" of p and check it equals want[n]. */
static void expect_content(const char *p, const float *want, int64_t n) {
    mt_safetensors *f;
    cr_assert_eq(mt_safetensors_open(&f, p), MT_OK, "%s", mt_last_error());
    float out[16];
    cr_assert_eq(mt_safetensors_read_f32(f, mt_safetensors_find(f, "x"), out, n), MT_OK, "%s", mt_last_error());
    cr_assert_eq(memcmp(out, want, (size_t)n * 4), 0, "existing file changed");
    mt_safetensors_close(f);
}

static mt_status failing_fetch(void *ctx, int i, void *dst, size_t bytes) {
    (void)ctx;
    memset(dst, 0, bytes);
    if (i == 1) return mt_set_error(MT_ERR_RUNTIME, "fetch failed on purpose");
    return MT_OK;
}

Test(safetensors, failed_write_keeps_existing_file) {
    const float old[4] = {1, 2, 3, 4};
    const float neu[4] = {5, 6, 7, 8};
    const char *p = path_in("keep.safetensors");
    mt_st_write_tensor t = {"x", MT_F32, 1, {4}, old};
    cr_assert_eq(mt_safetensors_write(p, &t, 1, NULL), MT_OK);

    /* A bad tensor list: duplicate name. */
    mt_st_write_tensor bad[2] = {{"x", MT_F32, 1, {4}, neu}, {"x", MT_F32, 1, {4}, neu}};
    cr_assert_eq(mt_safetensors_write(p, bad, 2, NULL), MT_ERR_INVALID);
    cr_assert(strstr(mt_last_error(), "'x'"));
    /* Missing data, bad ndim, negative dim, reserved name. */
    mt_st_write_tensor b2 = {"x", MT_F32, 1, {4}, NULL};
    cr_assert_eq(mt_safetensors_write(p, &b2, 1, NULL), MT_ERR_INVALID);
    mt_st_write_tensor b3 = {"x", MT_F32, 9, {4}, neu};
    cr_assert_eq(mt_safetensors_write(p, &b3, 1, NULL), MT_ERR_INVALID);
    mt_st_write_tensor b4 = {"x", MT_F32, 1, {-4}, neu};
    cr_assert_eq(mt_safetensors_write(p, &b4, 1, NULL), MT_ERR_INVALID);
    mt_st_write_tensor b5 = {"__metadata__", MT_F32, 1, {4}, neu};
    cr_assert_eq(mt_safetensors_write(p, &b5, 1, NULL), MT_ERR_INVALID);
    expect_content(p, old, 4);

    /* The producer fails half way: the old file stays and no .tmp is left. */
    mt_st_write_tensor two[2] = {{"x", MT_F32, 1, {4}, NULL}, {"y", MT_F32, 1, {4}, NULL}};
    cr_assert_eq(mt_safetensors_write_fetch(p, two, 2, NULL, failing_fetch, NULL), MT_ERR_RUNTIME);
    cr_assert(strstr(mt_last_error(), "on purpose"));
    cr_assert_neq(access(path_in("keep.safetensors.tmp"), F_OK), 0);
    expect_content(p, old, 4);

    /* The temporary file cannot be created (a directory is in the way; works as root
     * too, unlike a read-only directory). */
    cr_assert_eq(mkdir(path_in("keep.safetensors.tmp"), 0755), 0);
    mt_st_write_tensor good = {"x", MT_F32, 1, {4}, neu};
    cr_assert_eq(mt_safetensors_write(p, &good, 1, NULL), MT_ERR_IO);
    cr_assert(strstr(mt_last_error(), "keep.safetensors.tmp"), "%s", mt_last_error());
    expect_content(p, old, 4);
    rmdir(path_in("keep.safetensors.tmp"));

    /* A missing target directory is an I/O error too. */
    cr_assert_eq(mt_safetensors_write(path_in("no/such/dir/x.safetensors"), &good, 1, NULL), MT_ERR_IO);

    /* And a successful write replaces it. */
    cr_assert_eq(mt_safetensors_write(p, &good, 1, NULL), MT_OK);
    expect_content(p, neu, 4);
}
