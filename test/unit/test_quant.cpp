// SPDX-License-Identifier: Apache-2.0
// FP8 e4m3 / NVFP4 e2m1 conversions and NVFP4 scale layouts (fiar/algo/quant.hpp), checked over every
// representable input, including saturation, NaN, +-0 and subnormals, against
//   - an independent reference written here from the format definitions (no CUDA, no fiar), and
//   - CUDA's own host conversions (__nv_cvt_float_to_fp8 / __nv_cvt_float_to_fp4), bit for bit.
//
// Special values, as pinned below (CUDA 13 host path of cuda_fp8.hpp / cuda_fp4.hpp):
//   e4m3, __NV_SATFINITE:  any NaN (either sign, any payload) -> 0x7f, the positive NaN: the host path
//                          canonicalises the NaN first, so the sign is dropped (the reference accepts either
//                          NaN encoding, 0x7f or 0xff, and requires NaN-ness; the CUDA value is pinned apart).
//                          +-inf -> +-448 (0x7e / 0xfe), like every finite value beyond 448 (satfinite).
//   e2m1, cudaRoundNearest: e2m1 has no NaN and no infinity: any NaN (either sign) -> 0x7 (+6, sign dropped);
//                          +-inf -> +-6 (0x7 / 0xf), like every finite value beyond 6.
//   Both: round to nearest, ties to the even code; |x| at or below half the smallest subnormal -> +-0 with the
//   sign of x (the tie at exactly half goes to the even code, zero).
#include <catch2/catch.hpp>
#include <fiar/algo/quant.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace {

using fiar::ScaleLayout;

// ---------------------------------------------------------------------------------------------------------
// Independent reference, from the format definitions only.
// ---------------------------------------------------------------------------------------------------------
namespace ref {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// 2^e, exactly (repeated doubling / halving; every intermediate is a power of two).
constexpr float pow2(int e) {
  float r = 1.0f;
  for (; e > 0; --e) r *= 2.0f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}

constexpr bool is_nan(float x) { return x != x; }

/// e4m3 "FN": s eeee mmm, bias 7. e == 0: subnormal (m / 8) * 2^-6; e == 15 && m == 7: NaN; no infinities.
constexpr float decode_e4m3(std::uint8_t b) {
  const int e = (b >> 3) & 0xf;
  const int m = b & 0x7;
  if (e == 15 && m == 7) return kNaN;
  const float mag = e == 0 ? static_cast<float>(m) * pow2(-9) : (1.0f + static_cast<float>(m) / 8.0f) * pow2(e - 7);
  return (b & 0x80) ? -mag : mag;
}

/// e2m1: s ee m, bias 1. e == 0: subnormal m * 0.5; no NaN, no infinities.
constexpr float decode_e2m1(std::uint8_t n) {
  const int e = (n >> 1) & 0x3;
  const int m = n & 0x1;
  const float mag = e == 0 ? static_cast<float>(m) * 0.5f : (1.0f + static_cast<float>(m) / 2.0f) * pow2(e - 1);
  return (n & 0x8) ? -mag : mag;
}

/// Magnitudes of the non-negative finite codes 0 .. N-1, increasing (code order is value order).
constexpr std::array<float, 127> kE4m3Mags = [] {
  std::array<float, 127> a{};
  for (int i = 0; i < 127; ++i) a[static_cast<std::size_t>(i)] = decode_e4m3(static_cast<std::uint8_t>(i));
  return a;
}();
constexpr std::array<float, 8> kE2m1Mags = [] {
  std::array<float, 8> a{};
  for (int i = 0; i < 8; ++i) a[static_cast<std::size_t>(i)] = decode_e2m1(static_cast<std::uint8_t>(i));
  return a;
}();

/// The code of the magnitude nearest to a >= 0 (not NaN), ties to the even code; at or beyond the largest
/// finite magnitude, that magnitude (satfinite; values in (max, max + ulp/2] round there anyway).
template <std::size_t N>
constexpr unsigned nearest_even(float a, const std::array<float, N>& mags) {
  if (a >= mags[N - 1]) return N - 1;
  const auto hi = static_cast<unsigned>(std::upper_bound(mags.begin(), mags.end(), a) - mags.begin());
  const unsigned lo = hi - 1;                                                                // mags[lo] <= a < mags[hi]
  const double mid = (static_cast<double>(mags[lo]) + static_cast<double>(mags[hi])) / 2.0;  // exact
  const double x = a;
  if (x < mid) return lo;
  if (x > mid) return hi;
  return lo % 2 == 0 ? lo : hi;
}

constexpr std::uint8_t encode_e4m3(float x) {
  if (is_nan(x)) return 0x7f;  // the NaN class; either 0x7f or 0xff is accepted (same_e4m3)
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const float a = std::bit_cast<float>(bits & 0x7fffffffu);
  return static_cast<std::uint8_t>(nearest_even(a, kE4m3Mags) | ((bits >> 31) << 7));
}

constexpr std::uint8_t encode_e2m1(float x) {
  if (is_nan(x)) return 0x7;  // pinned to CUDA: NaN -> +6
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const float a = std::bit_cast<float>(bits & 0x7fffffffu);
  return static_cast<std::uint8_t>(nearest_even(a, kE2m1Mags) | ((bits >> 31) << 3));
}

constexpr bool is_nan_e4m3(std::uint8_t q) { return (q & 0x7f) == 0x7f; }
/// Equal codes, or both NaN.
constexpr bool same_e4m3(std::uint8_t a, std::uint8_t b) { return a == b || (is_nan_e4m3(a) && is_nan_e4m3(b)); }

}  // namespace ref

// The reference against hand-computed values of the definitions.
static_assert(ref::kE4m3Mags[0] == 0.0f && ref::kE4m3Mags[1] == 0.001953125f && ref::kE4m3Mags[126] == 448.0f);
static_assert(ref::kE2m1Mags == std::array<float, 8>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f});

// ---------------------------------------------------------------------------------------------------------
// CUDA's host conversions, called directly.
// ---------------------------------------------------------------------------------------------------------
std::uint8_t cuda_e4m3(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}
std::uint8_t cuda_e2m1(float x) {  // not masked: the upper nibble must be zero too
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest));
}

std::string describe(float x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%a (%.9g, bits 0x%08x)", static_cast<double>(x), static_cast<double>(x),
                std::bit_cast<std::uint32_t>(x));
  return buf;
}

std::string hex(unsigned v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%02x", v);
  return buf;
}

bool same_float(float a, float b) {  // NaN-aware, and +0 != -0
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

/// Collects encode mismatches and reports the first few.
struct Mismatches {
  std::size_t checked = 0;
  std::size_t count = 0;
  std::string first;

  void add(const std::string& what) {
    if (++count <= 12) first += what + "\n";
  }
};

/// e4m3: fiar == CUDA bit for bit; fiar == reference (NaN-aware); when given, all == expected (NaN-aware).
void check_e4m3(Mismatches& mm, float x, int expected = -1) {
  ++mm.checked;
  const std::uint8_t f = fiar::algo::to_fp8_e4m3(x);
  const std::uint8_t c = cuda_e4m3(x);
  const std::uint8_t r = ref::encode_e4m3(x);
  bool ok = f == c && ref::same_e4m3(f, r);
  if (expected >= 0) ok = ok && ref::same_e4m3(r, static_cast<std::uint8_t>(expected));
  if (!ok) {
    mm.add("e4m3(" + describe(x) + "): fiar " + hex(f) + " cuda " + hex(c) + " reference " + hex(r) +
           (expected >= 0 ? " expected " + hex(static_cast<unsigned>(expected)) : std::string()));
  }
}

/// e2m1: fiar == CUDA == reference bit for bit; when given, all == expected.
void check_e2m1(Mismatches& mm, float x, int expected = -1) {
  ++mm.checked;
  const std::uint8_t f = fiar::algo::to_fp4_e2m1(x);
  const std::uint8_t c = cuda_e2m1(x);
  const std::uint8_t r = ref::encode_e2m1(x);
  bool ok = f == c && f == r;
  if (expected >= 0) ok = ok && r == expected;
  if (!ok) {
    mm.add("e2m1(" + describe(x) + "): fiar " + hex(f) + " cuda " + hex(c) + " reference " + hex(r) +
           (expected >= 0 ? " expected " + hex(static_cast<unsigned>(expected)) : std::string()));
  }
}

/// Checks x and -x, expecting code (and code | sign_bit).
template <class Check>
void check_both_signs(Check check, Mismatches& mm, float x, unsigned code, unsigned sign_bit) {
  check(mm, x, static_cast<int>(code));
  check(mm, -x, static_cast<int>(code | sign_bit));
}

/// For every pair of adjacent non-negative representable magnitudes (codes lo, lo + 1), both signs: the exact
/// midpoint (ties to the even code), its float neighbours, the neighbours of both ends, and interior points.
template <class Check, std::size_t N>
void check_adjacent_pairs(Check check, Mismatches& mm, const std::array<float, N>& mags, unsigned sign_bit) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (unsigned lo = 0; lo + 1 < N; ++lo) {
    const unsigned hi = lo + 1;
    const float a = mags[lo];
    const float b = mags[hi];
    const float mid = (a + b) / 2.0f;  // exact: both have at most 4 significant bits
    REQUIRE(static_cast<double>(mid) == (static_cast<double>(a) + static_cast<double>(b)) / 2.0);
    const unsigned even = lo % 2 == 0 ? lo : hi;
    check_both_signs(check, mm, mid, even, sign_bit);
    check_both_signs(check, mm, std::nextafter(mid, 0.0f), lo, sign_bit);
    check_both_signs(check, mm, std::nextafter(mid, kInf), hi, sign_bit);
    check_both_signs(check, mm, std::nextafter(a, kInf), lo, sign_bit);
    check_both_signs(check, mm, std::nextafter(b, 0.0f), hi, sign_bit);
    for (int eighth = 1; eighth < 8; ++eighth) {
      if (eighth == 4) continue;                                        // the midpoint
      const float x = a + (b - a) * static_cast<float>(eighth) / 8.0f;  // exact
      check_both_signs(check, mm, x, eighth < 4 ? lo : hi, sign_bit);
    }
  }
}

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

const std::vector<float> kNaNs = {
    std::numeric_limits<float>::quiet_NaN(),
    -std::numeric_limits<float>::quiet_NaN(),
    std::numeric_limits<float>::signaling_NaN(),
    from_bits(0x7f800001u),
    from_bits(0xff800001u),
    from_bits(0x7fc00000u),
    from_bits(0xffc00000u),
    from_bits(0x7fffffffu),
    from_bits(0xffffffffu),
    from_bits(0x7fa5a5a5u),
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------

TEST_CASE("quant: the reference encodes hand-computed roundings", "[quant]") {
  // e4m3: ties to even around subnormals, across the subnormal/normal boundary, in the normal range, at max.
  STATIC_REQUIRE(ref::encode_e4m3(0.0f) == 0x00);
  STATIC_REQUIRE(ref::encode_e4m3(-0.0f) == 0x80);
  STATIC_REQUIRE(ref::encode_e4m3(ref::pow2(-10)) == 0x00);  // half the smallest subnormal: tie -> 0
  STATIC_REQUIRE(ref::encode_e4m3(ref::pow2(-11)) == 0x00);
  STATIC_REQUIRE(ref::encode_e4m3(ref::pow2(-9)) == 0x01);
  STATIC_REQUIRE(ref::encode_e4m3(3.0f * ref::pow2(-10)) == 0x02);   // 1.5 subnormal ulps: tie -> even 0x02
  STATIC_REQUIRE(ref::encode_e4m3(15.0f * ref::pow2(-10)) == 0x08);  // 7.5 ulps: tie between 0x07 and 0x08
  STATIC_REQUIRE(ref::encode_e4m3(17.0f) == 0x58);                   // between 16 (0x58) and 18 (0x59)
  STATIC_REQUIRE(ref::encode_e4m3(19.0f) == 0x5a);                   // between 18 (0x59) and 20 (0x5a)
  STATIC_REQUIRE(ref::encode_e4m3(1.0f) == 0x38);
  STATIC_REQUIRE(ref::encode_e4m3(-448.0f) == 0xfe);
  STATIC_REQUIRE(ref::encode_e4m3(464.0f) == 0x7e);  // max + ulp/2: tie -> even 448
  STATIC_REQUIRE(ref::encode_e4m3(1e30f) == 0x7e);
  STATIC_REQUIRE(ref::encode_e4m3(-std::numeric_limits<float>::infinity()) == 0xfe);
  STATIC_REQUIRE(ref::is_nan_e4m3(ref::encode_e4m3(std::numeric_limits<float>::quiet_NaN())));
  // e2m1: every midpoint goes to the even code.
  STATIC_REQUIRE(ref::encode_e2m1(0.25f) == 0x0);
  STATIC_REQUIRE(ref::encode_e2m1(0.75f) == 0x2);
  STATIC_REQUIRE(ref::encode_e2m1(1.25f) == 0x2);
  STATIC_REQUIRE(ref::encode_e2m1(1.75f) == 0x4);
  STATIC_REQUIRE(ref::encode_e2m1(2.5f) == 0x4);
  STATIC_REQUIRE(ref::encode_e2m1(3.5f) == 0x6);
  STATIC_REQUIRE(ref::encode_e2m1(5.0f) == 0x6);
  STATIC_REQUIRE(ref::encode_e2m1(-5.0f) == 0xe);
  STATIC_REQUIRE(ref::encode_e2m1(7.0f) == 0x7);
  STATIC_REQUIRE(ref::encode_e2m1(-0.0f) == 0x8);
  STATIC_REQUIRE(ref::encode_e2m1(-std::numeric_limits<float>::infinity()) == 0xf);
}

TEST_CASE("quant: decoding every e4m3 byte and e2m1 nibble is exact", "[quant]") {
  STATIC_REQUIRE(fiar::algo::kFp8Max == 448.0f);
  STATIC_REQUIRE(fiar::algo::kFp4Max == 6.0f);
  STATIC_REQUIRE(fiar::algo::kNvfp4Block == 16);
  int nans = 0;
  for (unsigned b = 0; b < 256; ++b) {
    const auto q = static_cast<std::uint8_t>(b);
    const float got = fiar::algo::from_fp8_e4m3(q);
    const float want = ref::decode_e4m3(q);
    INFO("e4m3 byte " << hex(b) << ": fiar " << describe(got) << ", reference " << describe(want));
    CHECK(same_float(got, want));
    nans += std::isnan(want) ? 1 : 0;
  }
  CHECK(nans == 2);  // 0x7f and 0xff only
  CHECK(fiar::algo::from_fp8_e4m3(0x7e) == 448.0f);
  CHECK(fiar::algo::from_fp8_e4m3(0xfe) == -448.0f);
  CHECK(fiar::algo::from_fp8_e4m3(0x01) == std::ldexp(1.0f, -9));
  CHECK(std::signbit(fiar::algo::from_fp8_e4m3(0x80)));

  for (unsigned n = 0; n < 16; ++n) {
    const auto q = static_cast<std::uint8_t>(n);
    const float got = fiar::algo::from_fp4_e2m1(q);
    const float want = ref::decode_e2m1(q);
    INFO("e2m1 nibble " << hex(n) << ": fiar " << describe(got) << ", reference " << describe(want));
    CHECK(same_float(got, want));
    // Only the low nibble counts.
    CHECK(same_float(fiar::algo::from_fp4_e2m1(static_cast<std::uint8_t>(q | 0xa0)), want));
  }
  CHECK(std::signbit(fiar::algo::from_fp4_e2m1(0x8)));
}

TEST_CASE("quant: every finite representable value encodes to itself", "[quant]") {
  for (unsigned b = 0; b < 256; ++b) {
    const auto q = static_cast<std::uint8_t>(b);
    if (ref::is_nan_e4m3(q)) continue;
    const float v = ref::decode_e4m3(q);
    INFO("e4m3 byte " << hex(b) << " = " << describe(v));
    CHECK(unsigned{fiar::algo::to_fp8_e4m3(v)} == b);
    CHECK(unsigned{cuda_e4m3(v)} == b);
    CHECK(unsigned{ref::encode_e4m3(v)} == b);
    CHECK(unsigned{fiar::algo::to_fp8_e4m3(fiar::algo::from_fp8_e4m3(q))} == b);
  }
  for (unsigned n = 0; n < 16; ++n) {
    const auto q = static_cast<std::uint8_t>(n);
    const float v = ref::decode_e2m1(q);
    INFO("e2m1 nibble " << hex(n) << " = " << describe(v));
    CHECK(unsigned{fiar::algo::to_fp4_e2m1(v)} == n);
    CHECK(unsigned{cuda_e2m1(v)} == n);
    CHECK(unsigned{ref::encode_e2m1(v)} == n);
    CHECK(unsigned{fiar::algo::to_fp4_e2m1(fiar::algo::from_fp4_e2m1(q))} == n);
  }
}

TEST_CASE("quant: e4m3 rounding, saturation and special values", "[quant]") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Mismatches mm;
  SECTION("midpoints (ties to even), their neighbours and interior points of every adjacent pair") {
    check_adjacent_pairs(check_e4m3, mm, ref::kE4m3Mags, 0x80);
    CHECK(mm.checked == 126 * 2 * 11);
  }
  SECTION("beyond the largest finite value: saturate to +-448, infinities included") {
    for (float x :
         {std::nextafter(448.0f, kInf), 456.0f, std::nextafter(464.0f, 0.0f), 464.0f, std::nextafter(464.0f, kInf),
          479.0f, 480.0f, 481.0f, 512.0f, 1000.0f, 65504.0f, 1e10f, 1e30f, FLT_MAX, kInf}) {
      check_both_signs(check_e4m3, mm, x, 0x7e, 0x80);
    }
    // Pinned: CUDA's satfinite conversion maps infinities to the largest finite value, not to NaN.
    CHECK(unsigned{cuda_e4m3(kInf)} == 0x7eu);
    CHECK(unsigned{cuda_e4m3(-kInf)} == 0xfeu);
  }
  SECTION("tiny values: flush to +-0 at or below 2^-10, the smallest subnormal 2^-9 above") {
    for (float x : {std::numeric_limits<float>::denorm_min(), FLT_MIN, std::ldexp(1.0f, -20), std::ldexp(1.0f, -11),
                    std::nextafter(std::ldexp(1.0f, -10), 0.0f), std::ldexp(1.0f, -10), 0.0f}) {
      check_both_signs(check_e4m3, mm, x, 0x00, 0x80);
    }
    for (float x : {std::nextafter(std::ldexp(1.0f, -10), kInf), std::ldexp(1.0f, -9), std::ldexp(1.5f, -10)}) {
      check_both_signs(check_e4m3, mm, x, 0x01, 0x80);
    }
  }
  SECTION("NaN stays NaN") {
    for (float x : kNaNs) {
      check_e4m3(mm, x, 0x7f);  // NaN-aware: 0x7f or 0xff
      INFO("input " << describe(x));
      CHECK(ref::is_nan_e4m3(fiar::algo::to_fp8_e4m3(x)));
      CHECK(std::isnan(fiar::algo::from_fp8_e4m3(fiar::algo::to_fp8_e4m3(x))));
      // Pinned: CUDA's host conversion canonicalises every NaN to the positive one, 0x7f.
      CHECK(unsigned{cuda_e4m3(x)} == 0x7fu);
    }
  }
  INFO(mm.first);
  REQUIRE(mm.count == 0);
}

TEST_CASE("quant: e2m1 rounding, saturation and special values", "[quant]") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Mismatches mm;
  SECTION("midpoints (ties to even), their neighbours and interior points of every adjacent pair") {
    check_adjacent_pairs(check_e2m1, mm, ref::kE2m1Mags, 0x8);
    CHECK(mm.checked == 7 * 2 * 11);
  }
  SECTION("beyond the largest finite value: saturate to +-6, infinities included") {
    for (float x : {std::nextafter(6.0f, kInf), 6.5f, std::nextafter(7.0f, 0.0f), 7.0f, std::nextafter(7.0f, kInf),
                    8.0f, 100.0f, 448.0f, 1e30f, FLT_MAX, kInf}) {
      check_both_signs(check_e2m1, mm, x, 0x7, 0x8);
    }
    // Pinned: infinities saturate to +-6.
    CHECK(unsigned{cuda_e2m1(kInf)} == 0x7u);
    CHECK(unsigned{cuda_e2m1(-kInf)} == 0xfu);
  }
  SECTION("tiny values: flush to +-0 at or below 0.25, 0.5 above") {
    for (float x : {std::numeric_limits<float>::denorm_min(), FLT_MIN, std::ldexp(1.0f, -10), 0.125f,
                    std::nextafter(0.25f, 0.0f), 0.25f, 0.0f}) {
      check_both_signs(check_e2m1, mm, x, 0x0, 0x8);
    }
    check_both_signs(check_e2m1, mm, std::nextafter(0.25f, kInf), 0x1, 0x8);
  }
  SECTION("NaN: e2m1 has none; pinned to +6 (0x7) whatever the sign") {
    for (float x : kNaNs) {
      check_e2m1(mm, x, 0x7);
      INFO("input " << describe(x));
      CHECK(unsigned{cuda_e2m1(x)} == 0x7u);
      CHECK(unsigned{fiar::algo::to_fp4_e2m1(x)} == 0x7u);
    }
  }
  INFO(mm.first);
  REQUIRE(mm.count == 0);
}

TEST_CASE("quant: dense sweep of the float space, fiar == CUDA == reference", "[quant]") {
  // Every bit pattern that is a multiple of 4099 (a prime): ~1.05 million floats of every class and binade.
  constexpr std::uint64_t kStride = 4099;
  Mismatches fp8;
  Mismatches fp4;
  std::size_t nans = 0;
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += kStride) {
    const float x = from_bits(static_cast<std::uint32_t>(b));
    nans += std::isnan(x) ? 1 : 0;
    check_e4m3(fp8, x);
    check_e2m1(fp4, x);
  }
  CHECK(fp8.checked == (std::uint64_t{0xffffffffu} / kStride) + 1);
  CHECK(nans > 1000);  // both NaN signs are covered
  INFO("e4m3:\n" << fp8.first << "e2m1:\n" << fp4.first);
  CHECK(fp8.count == 0);
  CHECK(fp4.count == 0);
}

TEST_CASE("quant: fp8_dynamic_scale", "[quant]") {
  using fiar::algo::fp8_dynamic_scale;
  constexpr float kFloor = 1.0f / (512.0f * 448.0f);
  STATIC_REQUIRE(fp8_dynamic_scale(0.0f) == kFloor);
  STATIC_REQUIRE(fp8_dynamic_scale(-0.0f) == kFloor);
  STATIC_REQUIRE(fp8_dynamic_scale(448.0f) == 1.0f);
  STATIC_REQUIRE(fp8_dynamic_scale(896.0f) == 2.0f);
  STATIC_REQUIRE(fp8_dynamic_scale(1.0f / 512.0f) == kFloor);
  STATIC_REQUIRE(fp8_dynamic_scale(1e-30f) == kFloor);
  STATIC_REQUIRE(fp8_dynamic_scale(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());

  // Non-negative floats from 0 to +inf: equal to the formula, monotone, and the scaled amax quantizes to 448.
  std::size_t bad_formula = 0, bad_monotone = 0, bad_quant = 0;
  std::string first;
  float prev = 0.0f;
  for (std::uint64_t b = 0; b <= 0x7f800000u; b += 65521) {
    const float amax = from_bits(static_cast<std::uint32_t>(b));
    const float s = fp8_dynamic_scale(amax);
    const float want = std::max(amax / 448.0f, kFloor);
    if (!same_float(s, want)) {
      if (bad_formula++ == 0) first = "formula at amax " + describe(amax) + ": got " + describe(s);
    }
    if (s < prev) ++bad_monotone;
    prev = s;
    if (std::isfinite(amax) && amax >= 1.0f / 512.0f && fiar::algo::to_fp8_e4m3(amax / s) != 0x7e) ++bad_quant;
  }
  for (float amax : {FLT_MAX, std::numeric_limits<float>::infinity()}) {
    if (!same_float(fp8_dynamic_scale(amax), std::max(amax / 448.0f, kFloor))) ++bad_formula;
  }
  INFO(first);
  CHECK(bad_formula == 0);
  CHECK(bad_monotone == 0);
  CHECK(bad_quant == 0);
}

// The group scale against its definition restated with frexp (the smallest power of two at or above
// max(amax / 448, 1e-10)), on non-negative floats from 0 to +inf, exact multiples 448 x 2^k (no rounding up) and
// their neighbours; every code of a group it scales fits e4m3 (|n| / y <= 448). pow2_reciprocal against the
// division for every power of two; ue8m0_of is the biased exponent.
TEST_CASE("quant: fp8_group_scale, pow2_reciprocal, ue8m0_of", "[quant]") {
  using fiar::algo::fp8_group_scale;
  auto want = [](float amax) {
    const float y0 = std::max(amax / 448.0f, 1e-10f);
    if (std::isinf(y0)) return y0;
    int e = 0;
    const float m = std::frexp(y0, &e);
    return m == 0.5f ? y0 : std::ldexp(1.0f, e);
  };
  std::size_t checked = 0, bad = 0, too_small = 0;
  std::string first;
  auto check = [&](float amax) {
    ++checked;
    const float y = fp8_group_scale(amax);
    if (!same_float(y, want(amax)) && bad++ == 0) first = "amax " + describe(amax) + ": got " + describe(y);
    if (std::isfinite(y) && amax / y > 448.0f) ++too_small;
  };
  for (std::uint64_t b = 0; b <= 0x7f800000u; b += 65521) check(from_bits(static_cast<std::uint32_t>(b)));
  for (int k = -40; k < 100; ++k) {
    const float exact = std::ldexp(448.0f, k);
    for (float x : {exact, std::nextafter(exact, 0.0f), std::nextafter(exact, INFINITY)}) check(x);
  }
  CHECK(fp8_group_scale(0.0f) == std::ldexp(1.0f, -33));  // 1e-10 rounded up
  CHECK(fp8_group_scale(448.0f) == 1.0f);
  CHECK(fp8_group_scale(449.0f) == 2.0f);
  INFO(first);
  CHECK(checked > 30000);
  CHECK(bad == 0);
  CHECK(too_small == 0);
  int wrong = 0;
  for (int e = -126; e <= 127; ++e) {
    const float y = std::ldexp(1.0f, e);
    wrong += !same_float(fiar::algo::pow2_reciprocal(y), 1.0f / y);
    wrong += fiar::algo::ue8m0_of(y) != e + 127;
  }
  wrong += fiar::algo::pow2_reciprocal(INFINITY) != 0.0f;
  CHECK(wrong == 0);
}

// The MXFP8 block scale against its definition restated with frexp (the exponent of the smallest power of two at or
// above amax / 448, biased; 0 for amax 0 or below 2^-127 x 448; 254 at most), on non-negative finite floats and the
// exact multiples 448 x 2^k and their neighbours; every code it scales fits e4m3 where the quotient is a normal float
// (below, the fp32 quotient has lost bits, and a block's largest code may saturate at 448); e8m0_reciprocal is
// 2^(127 - byte).
TEST_CASE("quant: mxfp8_scale, e8m0_reciprocal", "[quant]") {
  auto want = [](float amax) -> int {
    if (amax == 0.0f) return 0;
    const float y0 = amax / 448.0f;
    int e = 0;
    const float m = std::frexp(y0, &e);
    return std::clamp((m == 0.5f ? e - 1 : e) + 127, 0, 254);
  };
  std::size_t checked = 0, bad = 0, too_small = 0;
  std::string first;
  auto check = [&](float amax) {
    ++checked;
    const int got = fiar::algo::mxfp8_scale(amax);
    if (got != want(amax) && bad++ == 0) first = "amax " + describe(amax) + ": got " + std::to_string(got);
    if (amax >= std::ldexp(448.0f, -126) && amax * fiar::algo::e8m0_reciprocal(static_cast<std::uint8_t>(got)) > 448.0f)
      ++too_small;
  };
  for (std::uint64_t b = 0; b < 0x7f800000u; b += 65521) check(from_bits(static_cast<std::uint32_t>(b)));
  for (int k = -140; k < 100; ++k) {
    const float exact = std::ldexp(448.0f, k);
    for (float x : {exact, std::nextafter(exact, 0.0f), std::nextafter(exact, INFINITY)}) check(x);
  }
  INFO(first);
  CHECK(checked > 30000);
  CHECK(bad == 0);
  CHECK(too_small == 0);
  int wrong = 0;
  for (int byte = 0; byte < 255; ++byte) {
    wrong += !same_float(fiar::algo::e8m0_reciprocal(static_cast<std::uint8_t>(byte)), std::ldexp(1.0f, 127 - byte));
  }
  CHECK(wrong == 0);
}

TEST_CASE("quant: NVFP4 scale layouts", "[quant]") {
  using fiar::algo::nvfp4_scale_bytes;
  using fiar::algo::nvfp4_scale_cols;
  using fiar::algo::nvfp4_scale_offset;
  constexpr auto kSw = ScaleLayout::Swizzled128x4;
  constexpr auto kLin = ScaleLayout::Linear;

  STATIC_REQUIRE(nvfp4_scale_cols(7168) == 448);
  STATIC_REQUIRE(nvfp4_scale_bytes(1, 64, kSw) == 512);
  STATIC_REQUIRE(nvfp4_scale_bytes(1, 64, kLin) == 4);
  STATIC_REQUIRE(nvfp4_scale_bytes(129, 80, kSw) == 256 * 8);
  STATIC_REQUIRE(nvfp4_scale_bytes(129, 80, kLin) == 129 * 5);
  STATIC_REQUIRE(nvfp4_scale_bytes(300, 7168, kSw) == 384 * 448);
  STATIC_REQUIRE(nvfp4_scale_offset(0, 0, 64, kSw) == 0);
  STATIC_REQUIRE(nvfp4_scale_offset(0, 3, 64, kSw) == 3);
  STATIC_REQUIRE(nvfp4_scale_offset(1, 0, 64, kSw) == 16);
  STATIC_REQUIRE(nvfp4_scale_offset(32, 0, 64, kSw) == 4);
  STATIC_REQUIRE(nvfp4_scale_offset(33, 1, 64, kSw) == 21);
  STATIC_REQUIRE(nvfp4_scale_offset(127, 3, 64, kSw) == 511);
  STATIC_REQUIRE(nvfp4_scale_offset(0, 4, 80, kSw) == 512);        // second column tile (padded: 5 -> 8 cols)
  STATIC_REQUIRE(nvfp4_scale_offset(128, 0, 80, kSw) == 2 * 512);  // second row tile
  STATIC_REQUIRE(nvfp4_scale_offset(3, 2, 80, kLin) == 3 * 5 + 2);

  const auto round_up = [](std::size_t x, std::size_t to) { return (x + to - 1) / to * to; };
  // The formula of anchors-behaviour.md §4, recomputed here: numKTiles = ceil(H / 64).
  const auto anchor_offset = [](std::size_t m, std::size_t k, std::size_t h) {
    const std::size_t num_k_tiles = (h + 63) / 64;
    return (m / 128) * (num_k_tiles * 512) + (k / 4) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
  };

  for (int t : {1, 127, 128, 129, 300}) {
    for (int h : {64, 2048, 7168, 8192, 80, 16}) {
      INFO("T = " << t << ", H = " << h);
      const auto T = static_cast<std::size_t>(t);
      const auto H = static_cast<std::size_t>(h);
      const std::size_t cols = H / 16;
      REQUIRE(static_cast<std::size_t>(nvfp4_scale_cols(h)) == cols);

      // Linear: row-major [T, H/16].
      REQUIRE(nvfp4_scale_bytes(t, h, kLin) == T * cols);
      std::size_t bad_linear = 0;
      for (std::size_t m = 0; m < T; ++m) {
        for (std::size_t k = 0; k < cols; ++k) {
          if (nvfp4_scale_offset(static_cast<int>(m), static_cast<int>(k), h, kLin) != m * cols + k) ++bad_linear;
        }
      }
      CHECK(bad_linear == 0);

      // Swizzled 128x4: rows padded to 128, columns to 4.
      const std::size_t rows_p = round_up(T, 128);
      const std::size_t cols_p = round_up(cols, 4);
      const std::size_t bytes = nvfp4_scale_bytes(t, h, kSw);
      REQUIRE(bytes == rows_p * cols_p);
      REQUIRE(bytes % 512 == 0);
      std::vector<unsigned char> seen(bytes, 0);
      std::size_t out_of_range = 0, duplicate = 0, bad_formula = 0;
      for (std::size_t m = 0; m < rows_p; ++m) {
        for (std::size_t k = 0; k < cols_p; ++k) {
          const std::size_t off = nvfp4_scale_offset(static_cast<int>(m), static_cast<int>(k), h, kSw);
          if (off != anchor_offset(m, k, H)) ++bad_formula;
          if (off >= bytes) {
            ++out_of_range;
          } else if (seen[off]++ != 0) {
            ++duplicate;
          }
        }
      }
      CHECK(bad_formula == 0);
      CHECK(out_of_range == 0);
      CHECK(duplicate == 0);
      CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<std::ptrdiff_t>(bytes));  // onto [0, bytes)

      // Each 128x4 tile is one contiguous, 512-aligned range; tiles row-major over the padded columns.
      std::size_t bad_tiles = 0;
      const std::size_t k_tiles = cols_p / 4;
      for (std::size_t mt = 0; mt < rows_p / 128; ++mt) {
        for (std::size_t kt = 0; kt < k_tiles; ++kt) {
          std::size_t lo = SIZE_MAX, hi = 0;
          for (std::size_t m = mt * 128; m < mt * 128 + 128; ++m) {
            for (std::size_t k = kt * 4; k < kt * 4 + 4; ++k) {
              const std::size_t off = nvfp4_scale_offset(static_cast<int>(m), static_cast<int>(k), h, kSw);
              lo = std::min(lo, off);
              hi = std::max(hi, off);
            }
          }
          if (lo != (mt * k_tiles + kt) * 512 || hi != lo + 511) ++bad_tiles;
        }
      }
      CHECK(bad_tiles == 0);
    }
  }
}
