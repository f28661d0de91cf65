/* tests/cudaemu/selftest/test_runtime_bf16.cpp: the emulator's cuda_bf16.h on the edge
 * cases of round-to-nearest-even (ties both ways, carries into the exponent, overflow
 * to infinity at the largest finite value plus half an ulp, NaN, infinities, signed
 * zero, subnormals), truncation, the pair helpers and fp32-then-round arithmetic.
 * Expected bit patterns are worked out by hand from the binary32 encodings.
 * Returns the number of failed checks. */
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime_check.h"

static float f_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define CHECK_BITS(h, want) CHECK(__bfloat16_as_ushort(h) == (want), "got 0x%04x, want 0x%04x", __bfloat16_as_ushort(h), (unsigned)(want))

int main() {
    /* round to nearest even on the 16 dropped bits */
    CHECK_BITS(__float2bfloat16(f_bits(0x3F808000u)), 0x3F80);  /* tie, even below: down */
    CHECK_BITS(__float2bfloat16(f_bits(0x3F818000u)), 0x3F82);  /* tie, odd below: up */
    CHECK_BITS(__float2bfloat16(f_bits(0x3F808001u)), 0x3F81);  /* just over the tie */
    CHECK_BITS(__float2bfloat16(f_bits(0x3F817FFFu)), 0x3F81);  /* just under the tie */
    CHECK_BITS(__float2bfloat16(f_bits(0xBF818000u)), 0xBF82);  /* negative tie: magnitude rounds */
    CHECK_BITS(__float2bfloat16(f_bits(0x3FFF8000u)), 0x4000);  /* carry into the exponent: 2.0 */
    CHECK_BITS(__float2bfloat16_rn(1.0f), 0x3F80);
    /* largest finite 0x7F7F = 0x1.FEp127; the tie with infinity rounds to even: inf */
    CHECK_BITS(__float2bfloat16(f_bits(0x7F7F7FFFu)), 0x7F7F);
    CHECK_BITS(__float2bfloat16(f_bits(0x7F7F8000u)), 0x7F80);
    CHECK_BITS(__float2bfloat16(f_bits(0x7F7FFFFFu)), 0x7F80);  /* FLT_MAX -> inf */
    CHECK_BITS(__float2bfloat16_rz(f_bits(0x7F7FFFFFu)), 0x7F7F); /* truncation keeps the max */
    CHECK_BITS(__float2bfloat16(INFINITY), 0x7F80);
    CHECK_BITS(__float2bfloat16(-INFINITY), 0xFF80);
    CHECK_BITS(__float2bfloat16(-0.0f), 0x8000);
    /* NaN: any payload, either sign, even one whose top bits alone would read as inf */
    CHECK_BITS(__float2bfloat16(NAN), 0x7FFF);
    CHECK_BITS(__float2bfloat16(f_bits(0x7F800001u)), 0x7FFF);
    CHECK_BITS(__float2bfloat16(f_bits(0xFFFFFFFFu)), 0x7FFF);
    CHECK_BITS(__float2bfloat16_rz(f_bits(0x7F800001u)), 0x7FFF);
    CHECK(std::isnan(__bfloat162float(__float2bfloat16(NAN))), "NaN lost");
    /* subnormals: smallest bf16 subnormal is 0x0001 = 2^-133; half of it ties to 0 */
    CHECK_BITS(__float2bfloat16(f_bits(0x00008000u)), 0x0000);
    CHECK_BITS(__float2bfloat16(f_bits(0x00018000u)), 0x0002);
    CHECK_BITS(__float2bfloat16_rz(f_bits(0x3F81FFFFu)), 0x3F81);
    CHECK_BITS(__float2bfloat16_rz(f_bits(0xBF81FFFFu)), 0xBF81);
    /* widening is exact */
    CHECK(__bfloat162float(__ushort_as_bfloat16(0x4049)) == 3.140625f, "0x4049 -> %g",
          __bfloat162float(__ushort_as_bfloat16(0x4049)));
    /* pairs */
    __nv_bfloat162 p = __floats2bfloat162_rn(1.5f, f_bits(0x3F818000u));
    CHECK(__low2float(p) == 1.5f && __high2float(p) == f_bits(0x3F820000u), "pair %g %g", __low2float(p),
          __high2float(p));
    CHECK_BITS(__high2bfloat16(p), 0x3F82);
    /* arithmetic: fp32 then one RNE rounding. 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even is 1 */
    const __nv_bfloat16 one = __float2bfloat16(1.0f), tiny = __float2bfloat16(ldexpf(1.0f, -8));
    CHECK_BITS(__hadd(one, tiny), 0x3F80);
    CHECK_BITS(__hadd(__ushort_as_bfloat16(0x3F81), tiny), 0x3F82); /* odd below: up */
    CHECK_BITS(__hmul(__float2bfloat16(3.0f), __float2bfloat16(1.0f / 3.0f)), 0x3F80);
    CHECK_BITS(__hfma(__float2bfloat16(2.0f), __float2bfloat16(3.0f), __float2bfloat16(-6.0f)), 0x0000);
    CHECK_BITS(__hsub(one, one), 0x0000);
    /* C++ operators and conversions */
    __nv_bfloat16 x = 2.5f, y = 0.5f;
    x += y;
    CHECK(float(x) == 3.0f && x > y && !(x == y) && float(-x) == -3.0f && float(x * y) == 1.5f, "operators %g", float(x));
    CHECK(!(__float2bfloat16(NAN) == __float2bfloat16(NAN)), "NaN compares equal");
    printf("test_runtime_bf16: %d failure(s)\n", g_failures);
    return g_failures != 0;
}
