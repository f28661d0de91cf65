/* tests/test_runtime.c: status, log, dtype (bf16 / f16 conversions), Philox RNG,
 * tensor views, the timer and the memory plan's exact offsets. References are computed
 * independently of the code under test (neighbour search in double, table look-up,
 * published Philox vectors, greedy-by-size placement by exhaustive search). */
#include <criterion/criterion.h>

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dtype.h"
#include "runtime/log.h"
#include "runtime/plan.h"
#include "runtime/rng.h"
#include "runtime/status.h"
#include "runtime/tensor.h"
#include "runtime/timer.h"

/* xorshift64*: the tests' own random source, independent of the Philox under test. */
static uint64_t test_rand_state = 0x9E3779B97F4A7C15ull;
static uint64_t test_rand64(void) {
    uint64_t x = test_rand_state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    test_rand_state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ---------------------------------------------------------------- status */

Test(status, text_and_exit_codes) {
    cr_expect_eq(MT_OK, 0);
    cr_expect_eq(mt_status_exit_code(MT_OK), 0);
    cr_expect_eq(mt_status_exit_code(MT_ERR_INVALID), 2);
    cr_expect_eq(mt_status_exit_code(MT_ERR_IO), 2);
    cr_expect_eq(mt_status_exit_code(MT_ERR_FORMAT), 2);
    cr_expect_eq(mt_status_exit_code(MT_ERR_UNSUPPORTED), 2);
    cr_expect_eq(mt_status_exit_code(MT_ERR_OOM), 1);
    cr_expect_eq(mt_status_exit_code(MT_ERR_RUNTIME), 1);
    cr_expect_eq(mt_status_exit_code((mt_status)99), 1);
    /* every status has a distinct non-empty name */
    for (int a = MT_OK; a <= MT_ERR_UNSUPPORTED; a++) {
        cr_assert_not_null(mt_status_str((mt_status)a));
        cr_expect_gt(strlen(mt_status_str((mt_status)a)), 0);
        for (int b = a + 1; b <= MT_ERR_UNSUPPORTED; b++)
            cr_expect_str_neq(mt_status_str((mt_status)a), mt_status_str((mt_status)b));
    }
    cr_expect_not_null(mt_status_str((mt_status)99));
}

Test(status, set_clear_truncate_and_self_reference) {
    mt_clear_error();
    cr_expect_str_eq(mt_last_error(), "");
    cr_expect_eq(mt_set_error(MT_ERR_IO, "cannot open %s (%d)", "x.bin", 7), MT_ERR_IO);
    cr_expect_str_eq(mt_last_error(), "cannot open x.bin (7)");
    /* adding context by formatting the previous message into the new one */
    mt_set_error(MT_ERR_IO, "loading shard: %s", mt_last_error());
    cr_expect_str_eq(mt_last_error(), "loading shard: cannot open x.bin (7)");
    /* truncation to 1023 bytes */
    char big[3000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    mt_set_error(MT_ERR_RUNTIME, "%s", big);
    cr_expect_eq(strlen(mt_last_error()), 1023);
    mt_clear_error();
    cr_expect_str_eq(mt_last_error(), "");
}

static void *status_thread(void *arg) {
    int *ok = arg;
    ok[0] = strcmp(mt_last_error(), "") == 0; /* main thread's error is not visible */
    mt_set_error(MT_ERR_RUNTIME, "thread error");
    ok[1] = strcmp(mt_last_error(), "thread error") == 0;
    return NULL;
}

Test(status, error_is_thread_local) {
    mt_set_error(MT_ERR_INVALID, "main error");
    int ok[2] = {0, 0};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, status_thread, ok), 0);
    pthread_join(th, NULL);
    cr_expect(ok[0], "a new thread must start with an empty error");
    cr_expect(ok[1], "the thread must see its own error");
    cr_expect_str_eq(mt_last_error(), "main error");
}

/* ---------------------------------------------------------------- log */

typedef struct {
    int calls;
    mt_log_level level;
    char line[4096];
} log_capture;

static void capture_sink(mt_log_level level, const char *line, void *user) {
    log_capture *c = user;
    c->calls++;
    c->level = level;
    snprintf(c->line, sizeof c->line, "%s", line);
}

Test(log, default_off_levels_and_sink) {
    cr_expect_eq(mt_log_get_level(), MT_LOG_OFF);
    log_capture cap = {0};
    mt_log_set_sink(capture_sink, &cap);
    MT_LOG_E("dropped %d", 1); /* level OFF drops everything */
    cr_expect_eq(cap.calls, 0);
    mt_log_set_level(MT_LOG_WARN);
    MT_LOG_I("info dropped");
    cr_expect_eq(cap.calls, 0);
    MT_LOG_W("warn %s %d", "kept", 3);
    cr_expect_eq(cap.calls, 1);
    cr_expect_eq(cap.level, MT_LOG_WARN);
    cr_expect_str_eq(cap.line, "warn kept 3");
    MT_LOG_E("trailing newline\n");
    cr_expect_str_eq(cap.line, "trailing newline");
    char big[5000];
    memset(big, 'b', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    MT_LOG_E("%s", big);
    cr_expect_eq(strlen(cap.line), 2047);
    mt_log_set_level(MT_LOG_DEBUG);
    MT_LOG_D("debug");
    cr_expect_eq(cap.level, MT_LOG_DEBUG);
    mt_log_set_sink(NULL, NULL);
    mt_log_set_level(MT_LOG_OFF);
    int before = cap.calls;
    MT_LOG_E("to nowhere");
    cr_expect_eq(cap.calls, before);
}

/* ---------------------------------------------------------------- dtype names */

Test(dtype, names_sizes_parse) {
    struct {
        const char *s;
        mt_dtype t;
    } ok[] = {{"float32", MT_F32}, {"fp32", MT_F32},   {"bfloat16", MT_BF16}, {"bf16", MT_BF16},
              {"float16", MT_F16}, {"fp16", MT_F16},   {"int32", MT_I32},     {"uint16", MT_U16},
              {"uint32", MT_U32},  {"float64", MT_F64}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        mt_dtype t = MT_DTYPE_COUNT;
        cr_expect_eq(mt_dtype_parse(ok[i].s, &t), MT_OK, "%s", ok[i].s);
        cr_expect_eq(t, ok[i].t, "%s", ok[i].s);
    }
    cr_expect_str_eq(mt_dtype_name(MT_F32), "float32");
    cr_expect_str_eq(mt_dtype_name(MT_BF16), "bfloat16");
    cr_expect_str_eq(mt_dtype_name(MT_F16), "float16");
    cr_expect_str_eq(mt_dtype_name(MT_I32), "int32");
    /* name -> parse round trip for every dtype */
    for (int t = 0; t < MT_DTYPE_COUNT; t++) {
        mt_dtype back;
        cr_expect_eq(mt_dtype_parse(mt_dtype_name((mt_dtype)t), &back), MT_OK);
        cr_expect_eq((int)back, t);
    }
    size_t sizes[MT_DTYPE_COUNT] = {4, 2, 2, 4, 2, 4, 8};
    for (int t = 0; t < MT_DTYPE_COUNT; t++) cr_expect_eq(mt_dtype_size((mt_dtype)t), sizes[t]);
    mt_dtype t;
    mt_clear_error();
    cr_expect_eq(mt_dtype_parse("float8", &t), MT_ERR_INVALID);
    cr_expect(strstr(mt_last_error(), "bfloat16") != NULL, "message lists allowed names: %s", mt_last_error());
    cr_expect_eq(mt_dtype_parse("", &t), MT_ERR_INVALID);
    cr_expect_eq(mt_dtype_parse("BF16 ", &t), MT_ERR_INVALID);
    cr_expect_eq(mt_dtype_parse(NULL, &t), MT_ERR_INVALID);
}

/* ---------------------------------------------------------------- bf16 RNE */

/* Independent reference: the two bf16 neighbours of |f| are its truncation and
 * truncation + 1 ulp (the bit pattern after 0x7f7f is inf, standing for 2^128 as
 * IEEE overflow rounding prescribes); pick the nearer in double, ties to even. */
static uint16_t ref_bf16_rne(float f) {
    uint32_t u = f32_bits(f);
    if (isnan(f)) return 0x7fc0;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t mag = u & 0x7fffffffu;
    if (mag == 0x7f800000u) return sign | 0x7f80u;
    uint16_t lo = (uint16_t)(mag >> 16), hi = (uint16_t)(lo + 1);
    double x = fabs((double)f);
    double dlo = (double)bits_f32((uint32_t)lo << 16);
    double dhi = hi == 0x7f80u ? ldexp(1.0, 128) : (double)bits_f32((uint32_t)hi << 16);
    uint16_t r;
    if (x - dlo < dhi - x) r = lo;
    else if (x - dlo > dhi - x) r = hi;
    else r = (lo & 1u) ? hi : lo;
    return sign | r;
}

static void check_bf16(uint32_t u) {
    float f = bits_f32(u);
    uint16_t got = mt_f32_to_bf16(f);
    if (isnan(f)) {
        cr_assert(isnan(mt_bf16_to_f32(got)), "NaN %08x -> %04x not NaN", u, got);
        cr_assert(got & 0x0040u, "NaN %08x -> %04x not quiet", u, got);
        cr_assert_eq(got & 0x8000u, (u >> 16) & 0x8000u, "NaN sign");
        return;
    }
    uint16_t want = ref_bf16_rne(f);
    cr_assert_eq(got, want, "bf16(%08x = %.9g) = %04x, want %04x", u, (double)f, got, want);
}

Test(dtype, bf16_rne_matches_reference) {
    /* every sign/exponent/top-mantissa pattern with low halves at and around the tie
     * point, plus random low halves: covers ties, subnormals, max-finite and NaNs. */
    static const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    for (uint32_t hi = 0; hi < 65536; hi++) {
        for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++) check_bf16((hi << 16) | lows[k]);
        check_bf16((hi << 16) | (uint32_t)(test_rand64() & 0xffffu));
    }
    for (int i = 0; i < 1000000; i++) check_bf16((uint32_t)(test_rand64() >> 32));
    /* named special cases */
    cr_expect_eq(mt_f32_to_bf16(-0.0f), 0x8000);
    cr_expect_eq(mt_f32_to_bf16(0.0f), 0x0000);
    cr_expect_eq(mt_f32_to_bf16(INFINITY), 0x7f80);
    cr_expect_eq(mt_f32_to_bf16(-INFINITY), 0xff80);
    cr_expect_eq(mt_f32_to_bf16(bits_f32(0x7f7fffffu)), 0x7f80, "FLT_MAX rounds to inf");
    cr_expect_eq(mt_f32_to_bf16(bits_f32(0x7f7f8000u)), 0x7f80, "tie above max finite (odd) goes to inf");
    cr_expect_eq(mt_f32_to_bf16(bits_f32(0x7f7f7fffu)), 0x7f7f);
    cr_expect_eq(mt_f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80, "tie to even (down)");
    cr_expect_eq(mt_f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82, "tie to even (up)");
    cr_expect_eq(mt_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(mt_f32_to_bf16(bits_f32(0x00000001u)), 0x0000, "smallest subnormal");
    cr_expect_eq(mt_f32_to_bf16(bits_f32(0x00018000u)), 0x0002, "subnormal tie to even");
    cr_expect(isnan(mt_bf16_to_f32(mt_f32_to_bf16(bits_f32(0x7f800001u)))), "signalling NaN stays NaN");
    /* array variants agree with the scalar functions */
    enum { N = 1000 };
    float src[N], back[N];
    mt_bf16 dst[N];
    for (int i = 0; i < N; i++) src[i] = bits_f32((uint32_t)(test_rand64() >> 32));
    mt_f32_to_bf16_array(dst, src, N);
    mt_bf16_to_f32_array(back, dst, N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(dst[i], mt_f32_to_bf16(src[i]));
        cr_assert_eq(f32_bits(back[i]), (uint32_t)dst[i] << 16);
    }
}

/* ---------------------------------------------------------------- bf16 SR */

Test(dtype, bf16_sr_scalar_exact_rounding_probability) {
    /* Over all 65536 values of rand16, x rounds up (away from zero) for exactly
     * low16(x) of them, i.e. P(up) = (|x| - lo) / (hi - lo): E[result] == x exactly. */
    static const float xs[] = {1.0f + 1.0f / 3.0f, -2.71828f, 1e-30f, 3.0e38f, 0.1f, -7.3e-39f};
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        uint32_t u = f32_bits(xs[k]);
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        uint32_t ups = 0;
        for (uint32_t r = 0; r < 65536; r++) {
            uint16_t b = mt_f32_to_bf16_sr(xs[k], r);
            cr_assert(b == lo || b == hi, "SR result %04x not a neighbour of %08x", b, u);
            ups += b == hi;
        }
        cr_expect_eq(ups, u & 0xffffu, "x=%g", (double)xs[k]);
    }
    /* exactly representable values never move */
    for (uint32_t r = 0; r < 65536; r += 97) cr_assert_eq(mt_f32_to_bf16_sr(1.5f, r), 0x3fc0);
    cr_expect_eq(mt_f32_to_bf16_sr(INFINITY, 0xffff), 0x7f80);
    cr_expect_eq(mt_f32_to_bf16_sr(-INFINITY, 0xffff), 0xff80);
    cr_expect(isnan(mt_bf16_to_f32(mt_f32_to_bf16_sr(NAN, 0xffff))));
    cr_expect(isnan(mt_bf16_to_f32(mt_f32_to_bf16_sr(bits_f32(0x7f800001u), 0))));
}

Test(dtype, bf16_sr_array_unbiased_and_neighbours) {
    enum { N = 1 << 20 };
    float *src = malloc(N * sizeof(float));
    mt_bf16 *dst = malloc(N * sizeof(mt_bf16));
    cr_assert(src && dst);
    static const float xs[] = {1.0f + 1.0f / 3.0f, -0.0123456f, 1000.1f, 5e-39f};
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        float x = xs[k];
        for (int i = 0; i < N; i++) src[i] = x;
        mt_f32_to_bf16_sr_array(dst, src, N, 1234 + k, 77);
        uint32_t u = f32_bits(x);
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
        double dlo = mt_bf16_to_f32(lo), dhi = mt_bf16_to_f32(hi);
        double sum = 0;
        for (int i = 0; i < N; i++) {
            cr_assert(dst[i] == lo || dst[i] == hi, "element %d: %04x", i, dst[i]);
            sum += mt_bf16_to_f32(dst[i]);
        }
        double mean = sum / N;
        /* Each draw is lo + (hi-lo)*Bernoulli(p), p = (x-lo)/(hi-lo): the mean's
         * standard error is |hi-lo|*sqrt(p(1-p)/N). 5 standard errors: a false
         * failure has probability < 1e-6. */
        double p = ((double)x - dlo) / (dhi - dlo);
        double se = fabs(dhi - dlo) * sqrt(p * (1 - p) / N);
        cr_expect_leq(fabs(mean - (double)x), 5 * se, "x=%g mean=%.10g se=%g", (double)x, mean, se);
        /* RNE would be biased by |x - nearest|, far more than 5 se here: the test
         * can tell SR from RNE. */
        cr_assert_gt(fabs((double)mt_bf16_to_f32(mt_f32_to_bf16(x)) - (double)x), 20 * se);
    }
    free(src);
    free(dst);
}

Test(dtype, bf16_sr_array_split_invariant) {
    /* element i's bits depend only on (seed, offset + i): converting in pieces with
     * the matching offsets gives the same result as one call. */
    enum { N = 1003 };
    float src[N];
    mt_bf16 whole[N], parts[N], other[N];
    for (int i = 0; i < N; i++) src[i] = (float)((double)(test_rand64() >> 11) * 0x1p-53 * 8.0 - 4.0);
    mt_f32_to_bf16_sr_array(whole, src, N, 42, 5);
    mt_f32_to_bf16_sr_array(parts, src, 7, 42, 5);
    mt_f32_to_bf16_sr_array(parts + 7, src + 7, 500, 42, 5 + 7);
    mt_f32_to_bf16_sr_array(parts + 507, src + 507, N - 507, 42, 5 + 507);
    cr_expect_arr_eq(whole, parts, sizeof whole);
    mt_f32_to_bf16_sr_array(other, src, N, 43, 5);
    int diff = 0;
    for (int i = 0; i < N; i++) diff += other[i] != whole[i];
    cr_expect_gt(diff, N / 10, "a different seed must change many roundings (%d)", diff);
}

/* ---------------------------------------------------------------- f16 */

/* Independent decoding of a binary16 bit pattern. */
static double ref_f16_value(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp((double)(1024 + m), e - 25);
    return sign ? -v : v;
}

Test(dtype, f16_all_halfs_decode_and_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = mt_f16_to_f32((uint16_t)h);
        double want = ref_f16_value((uint16_t)h);
        if (isnan(want)) {
            cr_assert(isnan(f), "%04x", h);
            uint16_t back = mt_f32_to_f16(f);
            cr_assert(isnan(ref_f16_value(back)), "NaN %04x -> %04x", h, back);
            cr_assert_eq(back & 0x8000u, h & 0x8000u);
            continue;
        }
        cr_assert_eq((double)f, want, "f16 %04x -> %.10g, want %.10g", h, (double)f, want);
        cr_assert_eq(signbit(f) != 0, (h & 0x8000u) != 0, "%04x sign", h);
        cr_assert_eq(mt_f32_to_f16(f), (uint16_t)h, "round trip %04x", h);
    }
}

/* Reference RNE float -> half: binary search in the table of all finite non-negative
 * halfs (monotone in their bit pattern), nearest in double, ties to the even
 * pattern; the pattern after 0x7bff is inf standing for 2^16. */
static double half_table[0x7c01];
static uint16_t ref_f16_rne(float f) {
    if (isnan(f)) return 0x7e00;
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double x = fabs((double)f);
    if (isinf(f)) return sign | 0x7c00;
    int lo = 0, hi = 0x7c00; /* half_table[lo] <= x < half_table[hi] or hi = inf */
    if (x >= half_table[0x7c00]) return sign | 0x7c00;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (half_table[mid] <= x) lo = mid;
        else hi = mid;
    }
    double dlo = x - half_table[lo], dhi = half_table[hi] - x;
    int r = dlo < dhi ? lo : dlo > dhi ? hi : ((lo & 1) ? hi : lo);
    return sign | (uint16_t)r;
}

Test(dtype, f16_rne_matches_reference) {
    for (int h = 0; h < 0x7c00; h++) half_table[h] = ref_f16_value((uint16_t)h);
    half_table[0x7c00] = 65536.0;
    /* random floats concentrated on the half range (exponents 2^-26 .. 2^17), and
     * exact midpoints between adjacent halfs (ties) */
    for (int i = 0; i < 2000000; i++) {
        uint64_t r = test_rand64();
        uint32_t exp = 101 + (uint32_t)(r % 44); /* 2^-26 .. 2^17 */
        uint32_t u = (uint32_t)((r >> 8) & 0x807fffffu) | (exp << 23);
        float f = bits_f32(u);
        uint16_t got = mt_f32_to_f16(f), want = ref_f16_rne(f);
        cr_assert_eq(got, want, "f16(%08x = %.9g) = %04x want %04x", u, (double)f, got, want);
    }
    for (int h = 0; h < 0x7c00; h++) {
        double mid = 0.5 * (half_table[h] + half_table[h + 1]); /* exact in float */
        float f = (float)mid;
        cr_assert_eq((double)f, mid);
        cr_assert_eq(mt_f32_to_f16(f), ref_f16_rne(f), "tie above %04x", h);
        cr_assert_eq(mt_f32_to_f16(-f), ref_f16_rne(-f), "tie above -%04x", h);
        cr_assert_eq(mt_f32_to_f16(f), (h & 1) ? h + 1 : h, "tie above %04x to even", h);
    }
    cr_expect_eq(mt_f32_to_f16(65504.0f), 0x7bff);
    cr_expect_eq(mt_f32_to_f16(65519.99f), 0x7bff);
    cr_expect_eq(mt_f32_to_f16(65520.0f), 0x7c00);
    cr_expect_eq(mt_f32_to_f16(1e10f), 0x7c00);
    cr_expect_eq(mt_f32_to_f16(-1e10f), 0xfc00);
    cr_expect_eq(mt_f32_to_f16(-0.0f), 0x8000);
    cr_expect_eq(mt_f32_to_f16(bits_f32(0x33000000u)), 0x0000, "2^-25 ties to zero");
    cr_expect_eq(mt_f32_to_f16(bits_f32(0x33000001u)), 0x0001);
    cr_expect_eq(mt_f32_to_f16(bits_f32(0x00000001u)), 0x0000);
    cr_expect(isnan(ref_f16_value(mt_f32_to_f16(NAN))));
}

/* ---------------------------------------------------------------- Philox */

Test(rng, philox_known_answers) {
    /* Random123 kat_vectors, "philox4x32 10" lines: counter[4], key[2] -> out[4]. */
    static const uint32_t kat[3][10] = {
        {0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000,
         0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
         0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0,
         0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        mt_philox4x32_10(&kat[k][0], &kat[k][4], out);
        for (int j = 0; j < 4; j++)
            cr_expect_eq(out[j], kat[k][6 + j], "vector %d word %d: %08x want %08x", k, j, out[j], kat[k][6 + j]);
    }
    /* mt_rng_u32x4 packs counter = {index lo, hi, stream lo, hi}, key = {seed lo, hi} */
    uint32_t a[4];
    mt_rng_u32x4(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull, a);
    for (int j = 0; j < 4; j++) cr_expect_eq(a[j], kat[2][6 + j]);
}

Test(rng, u01_range) {
    cr_expect_eq(mt_rng_u01(0), 0.0f);
    cr_expect_lt(mt_rng_u01(0xffffffffu), 1.0f);
    cr_expect_eq(mt_rng_u01(0xffffffffu), 1.0f - 0x1p-24f);
    cr_expect_eq(mt_rng_u01(0x80000000u), 0.5f);
}

Test(rng, fill_normal_moments) {
    enum { N = 1 << 20 };
    const double sd = 2.0;
    float *x = malloc(N * sizeof(float));
    cr_assert(x);
    mt_rng_fill_normal(x, N, (float)sd, 2024, 3);
    double s1 = 0, s2 = 0, s4 = 0;
    long within = 0;
    for (int i = 0; i < N; i++) {
        double v = x[i];
        cr_assert(isfinite(v));
        s1 += v;
        s2 += v * v;
        s4 += v * v * v * v;
        within += fabs(v) < sd;
    }
    double m1 = s1 / N, m2 = s2 / N, m4 = s4 / N;
    /* Standard errors for N iid N(0, sd^2) samples: mean sd/sqrt(N); E[x^2] has
     * variance 2 sd^4 / N; E[x^4] = 3 sd^4 has variance (105 - 9) sd^8 / N;
     * P(|x| < sd) = 0.682689 is a Bernoulli proportion. 5 standard errors each
     * (false failure < 1e-6 per check). */
    double sd2 = sd * sd, sd4 = sd2 * sd2;
    cr_expect_leq(fabs(m1), 5 * sd / sqrt(N), "mean %g", m1);
    cr_expect_leq(fabs(m2 - sd2), 5 * sd2 * sqrt(2.0 / N), "E[x^2] %g", m2);
    cr_expect_leq(fabs(m4 - 3 * sd4), 5 * sd4 * sqrt(96.0 / N), "E[x^4] %g", m4);
    double p = 0.682689492137, ph = (double)within / N;
    cr_expect_leq(fabs(ph - p), 5 * sqrt(p * (1 - p) / N), "P(|x|<sd) %g", ph);
    /* odd and even positions (cos and sin halves of each Box-Muller pair) are each
     * standard normal and uncorrelated: E[x_{2k} x_{2k+1}] = 0, se sd^2 / sqrt(N/2) */
    double c = 0;
    for (int i = 0; i < N; i += 2) c += (double)x[i] * x[i + 1];
    c /= N / 2;
    cr_expect_leq(fabs(c), 5 * sd2 / sqrt(N / 2.0), "pair correlation %g", c);
    free(x);
}

Test(rng, fill_deterministic_and_prefix_stable) {
    enum { N = 1001 };
    float a[N], b[N], c[N];
    mt_rng_fill_normal(a, N, 1.0f, 7, 11);
    mt_rng_fill_normal(b, N, 1.0f, 7, 11);
    cr_expect_arr_eq(a, b, sizeof a, "same seed, same numbers");
    /* element i depends only on i: any shorter fill is a prefix, whatever its
     * alignment to the 4-word Philox block */
    for (size_t m = 1; m < 12; m++) {
        mt_rng_fill_normal(c, m, 1.0f, 7, 11);
        cr_expect_arr_eq(c, a, m * sizeof(float), "prefix of %zu", m);
    }
    /* std = 0.5 scales by a power of two, which commutes with rounding: exact */
    mt_rng_fill_normal(c, N, 0.5f, 7, 11);
    for (int i = 0; i < N; i++) cr_assert_eq(c[i], 0.5f * a[i], "%d", i);
    /* seed and stream both matter */
    mt_rng_fill_normal(b, N, 1.0f, 8, 11);
    mt_rng_fill_normal(c, N, 1.0f, 7, 12);
    int db = 0, dc = 0;
    for (int i = 0; i < N; i++) {
        db += a[i] != b[i];
        dc += a[i] != c[i];
    }
    cr_expect_eq(db, N);
    cr_expect_eq(dc, N);
    /* large fills (threaded path) agree with small ones */
    enum { L = 200000 };
    float *big = malloc(L * sizeof(float));
    cr_assert(big);
    mt_rng_fill_normal(big, L, 1.0f, 7, 11);
    cr_expect_arr_eq(big, a, sizeof a);
    free(big);
}

Test(rng, fill_uniform) {
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof(float));
    cr_assert(x);
    mt_rng_fill_uniform(x, N, -3.0f, 5.0f, 99, 1);
    double s = 0;
    for (int i = 0; i < N; i++) {
        cr_assert(x[i] >= -3.0f && x[i] < 5.0f, "%g", (double)x[i]);
        s += x[i];
    }
    /* U[-3,5): mean 1, sd 8/sqrt(12); 5 standard errors */
    cr_expect_leq(fabs(s / N - 1.0), 5 * (8.0 / sqrt(12.0)) / sqrt(N));
    float y[5];
    mt_rng_fill_uniform(y, 5, -3.0f, 5.0f, 99, 1);
    cr_expect_arr_eq(y, x, sizeof y);
    free(x);
}

/* ---------------------------------------------------------------- tensor, timer */

Test(tensor, init_numel_bytes) {
    mt_tensor t;
    int64_t shape[3] = {2, 3, 5};
    float buf[30];
    cr_assert_eq(mt_tensor_init(&t, buf, MT_BF16, 3, shape), MT_OK);
    cr_expect_eq(mt_tensor_numel(&t), 30);
    cr_expect_eq(mt_tensor_bytes(&t), 60);
    cr_expect_eq(t.shape[3], 1);
    cr_expect_eq(t.data, buf);
    cr_assert_eq(mt_tensor_init(&t, buf, MT_F32, 0, NULL), MT_OK);
    cr_expect_eq(mt_tensor_numel(&t), 1);
    int64_t big[2] = {1 << 20, 1 << 20};
    cr_assert_eq(mt_tensor_init(&t, NULL, MT_F64, 2, big), MT_OK);
    cr_expect_eq(mt_tensor_bytes(&t), (size_t)8 << 40, "sizes do not overflow int");
    int64_t neg[1] = {-1};
    cr_expect_eq(mt_tensor_init(&t, buf, MT_F32, 1, neg), MT_ERR_INVALID);
    cr_expect_eq(mt_tensor_init(&t, buf, MT_F32, 5, shape), MT_ERR_INVALID);
    cr_expect_eq(mt_tensor_init(&t, buf, MT_DTYPE_COUNT, 1, shape), MT_ERR_INVALID);
}

Test(timer, monotonic) {
    double t0 = mt_time_now();
    volatile double s = 0;
    for (int i = 0; i < 1000000; i++) s += i;
    double t1 = mt_time_now();
    cr_expect_gt(t0, 0.0);
    cr_expect_geq(t1, t0);
    cr_expect_lt(t1 - t0, 60.0);
}

/* ---------------------------------------------------------------- plan offsets */

/* Greedy by size (plan.h) straight from its definition: entries in order of aligned
 * size, largest first, ties by add order; each takes the lowest offset x >= 0 at which
 * [x, x + size) meets no already placed entry whose lifetime overlaps its own. That
 * lowest x is 0 or the end of a placed overlapping entry (lower it until it touches
 * one), so every such candidate is tried in increasing order and the first free one
 * is kept: O(n^3), for small plans only. Writes offsets[] and returns the peak. */
typedef struct {
    size_t bytes;
    int first, last;
} ref_entry;

static size_t ref_align(size_t b) { return (b + MT_PLAN_ALIGN - 1) / MT_PLAN_ALIGN * MT_PLAN_ALIGN; }

static size_t ref_greedy_by_size(const ref_entry *e, int n, size_t *offsets) {
    int *order = malloc((size_t)n * sizeof(int)), *placed = malloc((size_t)n * sizeof(int));
    size_t *cand = malloc(((size_t)n + 1) * sizeof(size_t));
    cr_assert(order && placed && cand);
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort: stable, so ties keep add order */
        for (int j = i; j > 0 && ref_align(e[order[j]].bytes) > ref_align(e[order[j - 1]].bytes); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int np = 0;
    size_t peak = 0;
    for (int k = 0; k < n; k++) {
        const int i = order[k];
        const size_t size = ref_align(e[i].bytes);
        offsets[i] = 0;
        if (size == 0) continue;
        int nc = 0;
        cand[nc++] = 0;
        for (int j = 0; j < np; j++) {
            const int q = placed[j];
            if (e[q].first <= e[i].last && e[i].first <= e[q].last) cand[nc++] = offsets[q] + ref_align(e[q].bytes);
        }
        size_t best = SIZE_MAX;
        for (int c = 0; c < nc; c++) {
            if (cand[c] >= best) continue;
            int free_here = 1;
            for (int j = 0; j < np && free_here; j++) {
                const int q = placed[j];
                if (e[q].first <= e[i].last && e[i].first <= e[q].last && offsets[q] < cand[c] + size &&
                    cand[c] < offsets[q] + ref_align(e[q].bytes))
                    free_here = 0;
            }
            if (free_here) best = cand[c];
        }
        offsets[i] = best;
        placed[np++] = i;
        if (best + size > peak) peak = best + size;
    }
    free(order);
    free(placed);
    free(cand);
    return peak;
}

/* Plan e[0..n) with mt_plan and require the reference's offsets and peak, byte for
 * byte (the plan's promise: "deterministic for a given sequence of adds"). */
static void check_plan_against_reference(const ref_entry *e, int n, const char *what) {
    mt_plan *p = NULL;
    cr_assert_eq(mt_plan_new(&p), MT_OK);
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "e%d", i);
        cr_assert_eq(mt_plan_add(p, name, MT_MEM_SCRATCH, e[i].bytes, e[i].first, e[i].last, NULL), MT_OK);
    }
    cr_assert_eq(mt_plan_finalize(p), MT_OK);
    size_t *ref = malloc((size_t)(n ? n : 1) * sizeof(size_t));
    cr_assert(ref);
    const size_t ref_peak = ref_greedy_by_size(e, n, ref);
    cr_expect_eq(mt_plan_peak(p), ref_peak, "%s: peak %zu, reference %zu", what, mt_plan_peak(p), ref_peak);
    int bad = 0;
    for (int i = 0; i < n && bad < 5; i++) {
        const size_t got = mt_plan_entry_get(p, i)->offset;
        if (got != ref[i]) {
            cr_expect_eq(got, ref[i], "%s: entry %d (bytes %zu, phases [%d, %d]) at %zu, reference %zu", what, i,
                         e[i].bytes, e[i].first, e[i].last, got, ref[i]);
            bad++;
        }
    }
    free(ref);
    mt_plan_free(p);
}

/* Random plans of every shape the greedy can meet: few phases (much sharing) and
 * many (little), sizes with many ties and zero sizes, single-phase and whole-range
 * lifetimes, negative and extreme phases. */
Test(plan, offsets_match_reference_greedy_random) {
    ref_entry e[320];
    const int phase_counts[] = {1, 3, 17, 100, 1000};
    for (int trial = 0; trial < 40; trial++) {
        const int n = 1 + (int)(test_rand64() % 320);
        const int nph = phase_counts[trial % 5];
        const int base = (trial % 3 == 0) ? -500 : 0;
        for (int i = 0; i < n; i++) {
            const uint64_t r = test_rand64();
            switch (r % 4) {
            case 0: e[i].bytes = 0; break;                                        /* no space */
            case 1: e[i].bytes = (size_t)(1 + test_rand64() % 4) * MT_PLAN_ALIGN; break; /* ties */
            default: e[i].bytes = (size_t)(test_rand64() % 100000); break;
            }
            int a = base + (int)(test_rand64() % (uint64_t)nph), b = base + (int)(test_rand64() % (uint64_t)nph);
            if ((r >> 8) % 10 == 0) b = a; /* one phase */
            e[i].first = a < b ? a : b;
            e[i].last = a < b ? b : a;
            if ((r >> 16) % 50 == 0) e[i].first = INT_MIN;
            if ((r >> 24) % 50 == 0) e[i].last = INT_MAX;
        }
        char what[64];
        snprintf(what, sizeof what, "random plan %d (%d entries, %d phases)", trial, n, nph);
        check_plan_against_reference(e, n, what);
    }
    check_plan_against_reference(e, 0, "empty plan");
}

/* The shape of a deep model's plan (models/model_plan.c): whole-step parameters, gradients
 * and moments; per layer saved tensors of several sizes live from that layer's
 * forward to its backward (nested lifetimes, all overlapping at the loss); per-op
 * scratch reused by every layer's forward and by every backward; a loss tile. The
 * unions of placed spans then have gaps of every kind for the search to step over. */
Test(plan, offsets_match_reference_greedy_nested_layers) {
    for (int variant = 0; variant < 3; variant++) {
        const int layers = 40 + 20 * variant, per = 6;
        const int last = 2 * layers + 3;
        ref_entry e[4 + 80 * 6 + 8];
        int n = 0;
        for (int k = 0; k < 4; k++) e[n++] = (ref_entry){(size_t)(k + 1) * 70000, 0, last};
        for (int l = 0; l < layers; l++) {
            const size_t sizes[6] = {65536, 65536, 16384, 180224 + 256 * (size_t)(variant == 2 && l % 3 == 0),
                                     8192, 300};
            for (int k = 0; k < per; k++) e[n++] = (ref_entry){sizes[k], l + (k > 0), last - 1 - l};
        }
        for (int k = 0; k < 4; k++) e[n++] = (ref_entry){(size_t)(k % 2 ? 65536 : 180224), 1, layers};
        for (int k = 0; k < 3; k++) e[n++] = (ref_entry){(size_t)(k + 1) * 65536, layers + 2, last - 1};
        e[n++] = (ref_entry){2097152 >> variant, layers + 1, layers + 1};
        char what[64];
        snprintf(what, sizeof what, "nested plan, %d layers", layers);
        check_plan_against_reference(e, n, what);
    }
}
