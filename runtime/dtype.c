/* runtime/dtype.c: dtype names, bfloat16 array conversions, IEEE half conversion
 * (see dtype.h). */
#include "runtime/dtype.h"

#include "runtime/rng.h"

/* Parallelise element loops only above this many elements. */
#define MT_DTYPE_PAR_MIN 65536

typedef struct {
    const char *name;
    mt_dtype type;
} mt_dtype_spelling;

/* Canonical names first (mt_dtype_name returns these), then aliases. */
static const mt_dtype_spelling mt_dtype_spellings[] = {
    {"float32", MT_F32},  {"bfloat16", MT_BF16}, {"float16", MT_F16},
    {"int32", MT_I32},    {"uint16", MT_U16},    {"uint32", MT_U32},
    {"float64", MT_F64},  {"fp32", MT_F32},      {"bf16", MT_BF16},
    {"fp16", MT_F16},     {"fp64", MT_F64},      {"f32", MT_F32},
    {"f16", MT_F16},      {"f64", MT_F64},       {"i32", MT_I32},
    {"u16", MT_U16},      {"u32", MT_U32},
};

size_t mt_dtype_size(mt_dtype t) {
    switch (t) {
    case MT_F32: return 4;
    case MT_BF16: return 2;
    case MT_F16: return 2;
    case MT_I32: return 4;
    case MT_U16: return 2;
    case MT_U32: return 4;
    case MT_F64: return 8;
    case MT_DTYPE_COUNT: break;
    }
    return 0;
}

const char *mt_dtype_name(mt_dtype t) {
    for (size_t i = 0; i < sizeof mt_dtype_spellings / sizeof mt_dtype_spellings[0]; i++)
        if (mt_dtype_spellings[i].type == t) return mt_dtype_spellings[i].name;
    return "unknown";
}

mt_status mt_dtype_parse(const char *s, mt_dtype *out) {
    if (!s || !out)
        return mt_set_error(MT_ERR_INVALID, "dtype: NULL argument");
    for (size_t i = 0; i < sizeof mt_dtype_spellings / sizeof mt_dtype_spellings[0]; i++) {
        if (strcmp(s, mt_dtype_spellings[i].name) == 0) {
            *out = mt_dtype_spellings[i].type;
            return MT_OK;
        }
    }
    return mt_set_error(MT_ERR_INVALID,
                        "unknown dtype '%s' (allowed: float32|fp32, bfloat16|bf16, "
                        "float16|fp16, float64|fp64, int32, uint16, uint32)",
                        s);
}

void mt_f32_to_bf16_array(mt_bf16 *dst, const float *src, size_t n) {
    const int64_t nn = (int64_t)n;
#pragma omp parallel for schedule(static) if (n >= MT_DTYPE_PAR_MIN)
    for (int64_t i = 0; i < nn; i++) dst[i] = mt_f32_to_bf16(src[i]);
}

void mt_bf16_to_f32_array(float *dst, const mt_bf16 *src, size_t n) {
    const int64_t nn = (int64_t)n;
#pragma omp parallel for schedule(static) if (n >= MT_DTYPE_PAR_MIN)
    for (int64_t i = 0; i < nn; i++) dst[i] = mt_bf16_to_f32(src[i]);
}

/* Element i uses word (offset + i) % 4 of Philox block (offset + i) / 4 on stream
 * MT_SR_STREAM, low 16 bits: its bits depend only on (seed, offset + i), so splitting
 * the array across calls, threads or ranks (with matching offsets) changes nothing. */
void mt_f32_to_bf16_sr_array(mt_bf16 *dst, const float *src, size_t n, uint64_t seed, uint64_t offset) {
    if (n == 0) return;
    const uint64_t first_block = offset / 4;
    const uint64_t last_block = (offset + n - 1) / 4;
    const int64_t nblocks = (int64_t)(last_block - first_block + 1);
#pragma omp parallel for schedule(static) if (n >= MT_DTYPE_PAR_MIN)
    for (int64_t b = 0; b < nblocks; b++) {
        uint32_t w[4];
        const uint64_t blk = first_block + (uint64_t)b;
        mt_rng_u32x4(seed, MT_SR_STREAM, blk, w);
        for (uint64_t k = 0; k < 4; k++) {
            const uint64_t g = blk * 4 + k; /* global element index */
            if (g < offset || g >= offset + n) continue;
            const size_t i = (size_t)(g - offset);
            dst[i] = mt_f32_to_bf16_sr(src[i], w[k] & 0xffffu);
        }
    }
}

/* IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (mant << 13); /* inf, or NaN keeping its payload */
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (mant << 13); /* 127 - 15 = 112 */
    } else if (mant == 0) {
        u = sign;
    } else {
        /* subnormal: mant * 2^-24; normalise so the leading 1 sits at bit 10 */
        uint32_t e = 113; /* exponent field for 2^-14 */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        u = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float32 -> binary16, round to nearest, ties to even; overflow to inf; NaN stays a
 * quiet NaN with the top of its payload. */
uint16_t mt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u) {
        if (u == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
    }
    if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (u >= 0x38800000u) {
        /* normal half: rebias the exponent, round away the low 13 mantissa bits; a
         * carry out of the mantissa correctly bumps the exponent. */
        uint32_t h = ((u - 0x38000000u) >> 13);
        uint32_t rem = u & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
    if (u <= 0x33000000u) return sign; /* <= 2^-25: rounds to zero (2^-25 is a tie to 0) */
    /* subnormal half: value = m * 2^(e-150) with the implicit bit; result mantissa
     * = m * 2^(e-126) = m >> (126 - e), shift in [14, 24]. */
    uint32_t e = u >> 23;
    uint32_t m = (u & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;
    uint32_t h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
