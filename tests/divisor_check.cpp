// Checks contract.h's quotient_of against the correctly rounded division: for every
// divisor s and dividend x in its fast range, the quotient equals RN(x / s) bit for bit,
// or both are below 2^-39 in magnitude with the same sign (without the sign's copy,
// quotient_of<false>: of either sign, and the integer grid's rules give the same bits from
// it); and the element rules (the
// integer grid's rint, clamp and mask; each float format's rounding and mask) give the
// same bits from either, the integer grid's also in the kFinite spelling that the
// fast-division paths use. Built and run by tests/test_divisor.py:
//
//   divisor_check sampled COUNT SEED   COUNT random dividends for each of many divisors
//   divisor_check every S...           every float32 bit pattern as the dividend of each S
//   divisor_check integers COUNT SEED  divider.h's Divider32 against n / d: COUNT random n
//                                      and the multiples of d (and their neighbours) of many d
//   divisor_check every-integer D...   every n below 2^31 for each divisor D
//   divisor_check scales COUNT SEED    blockwise_scale with Divisors of elem_max and g (the
//                                      CUDA vector kernels) against div_rn's: COUNT random
//                                      amax for each pair
//   divisor_check inside               every float32 strictly between a small float format's
//                                      max and its saturation limit: the kInside rounding and
//                                      element (no saturation, mask 1) against the full ones
//
// Prints "checked N quotients" and exits 0, or prints the first counterexample and exits 1.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "check_bits.h"
#include "fakequant/contract.h"
#include "fakequant/divider.h"

using namespace fakequant;

namespace {


int failures = 0;
// Whether check() also compares the integer grid's two spellings (sampled mode; the exhaustive
// mode checks the quotient and the rules that consume it, at a fifth of the cost).
bool check_spellings = false;

void fail(const char* what, float x, float s, float got, float want) {
  if (failures++ == 0) {
    std::printf("%s: x = %a, s = %a: %a (0x%08" PRIx32 "), correctly rounded: %a (0x%08" PRIx32 ")\n", what,
                static_cast<double>(x), static_cast<double>(s), static_cast<double>(got), bits_of(got),
                static_cast<double>(want), bits_of(want));
  }
}

template <Format F>
void check_format(float q, float r, float s, float x) {
  const BlockRule<float> rule{-127.0f, 127.0f, saturation_limit(float_format_of<F>())};
  unsigned ma = 0, mb = 0;
  const float a = blockwise_value_of_quotient<F>(q, s, rule, ma);
  const float b = blockwise_value_of_quotient<F>(r, s, rule, mb);
  if (!same_bits(a, b) || ma != mb) fail("element", x, s, a, b);
}

// The integer grid's rules in their kFinite spelling (the fast-division paths), from the
// fast quotient q, against the general spelling from the correctly rounded r: the fake and
// the integer outputs, both masks, affine bounds about a zero point and the block rule.
void check_finite(float x, float q, float r, float s) {
  for (const float zp : {0.0f, 3.0f, -128.0f}) {
    const float lo = -128.0f - zp, hi = 127.0f - zp, wlo = -127.5f * s, whi = 127.5f * s;
    unsigned ma = 0, mb = 0;
    float a = quantize_value_of_quotient<Format::kInt, Output::kFake, Window::kQuantRange, true>(x, q, s, lo, hi, zp,
                                                                                                  wlo, whi, ma);
    float b = quantize_value_of_quotient<Format::kInt, Output::kFake, Window::kQuantRange>(x, r, s, lo, hi, zp, wlo,
                                                                                           whi, mb);
    if (!same_bits(a, b) || ma != mb) fail("finite integer element", x, s, a, b);
    a = quantize_value_of_quotient<Format::kInt, Output::kInteger, Window::kInput, true>(x, q, s, lo, hi, zp, wlo,
                                                                                         whi, ma);
    b = quantize_value_of_quotient<Format::kInt, Output::kInteger, Window::kInput>(x, r, s, lo, hi, zp, wlo, whi, mb);
    if (!same_bits(a, b) || ma != mb) fail("finite integer output", x, s, a, b);
  }
  const BlockRule<float> ints{0.0f, 15.0f, 0.0f};  // an unsigned range: its lower end is +0
  unsigned ma = 0, mb = 0;
  float a = blockwise_value_of_quotient<Format::kInt, true>(q, s, ints, ma);
  float b = blockwise_value_of_quotient<Format::kInt>(r, s, ints, mb);
  if (!same_bits(a, b) || ma != mb) fail("finite block element", x, s, a, b);
  // an E8M0 block holding NaN: quotient and scale NaN; and an infinite quotient
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const float v : {nan, INFINITY, -INFINITY}) {
    const float sv = v == v ? s : nan;
    a = blockwise_value_of_quotient<Format::kInt, true>(v, sv, ints, ma);
    b = blockwise_value_of_quotient<Format::kInt>(v, sv, ints, mb);
    if (!same_bits(a, b) || ma != mb) fail("block element of a NaN or infinite quotient", v, sv, a, b);
  }
}

// The quotient without its sign's copy (quotient_of<false>, the integer grid's fast paths):
// the integer grid's kFinite rules give the bits and masks of the correctly rounded r.
void check_unsigned(float x, float u, float r, float s) {
  const BlockRule<float> ints{-128.0f, 127.0f, 0.0f}, unsigned_ints{0.0f, 15.0f, 0.0f};
  for (const BlockRule<float>& rule : {ints, unsigned_ints}) {
    unsigned ma = 0, mb = 0;
    const float a = blockwise_value_of_quotient<Format::kInt, true>(u, s, rule, ma);
    const float b = blockwise_value_of_quotient<Format::kInt>(r, s, rule, mb);
    if (!same_bits(a, b) || ma != mb) fail("unsigned quotient's block element", x, s, a, b);
  }
  for (const float zp : {0.0f, 3.0f, -128.0f}) {
    const float lo = -128.0f - zp, hi = 127.0f - zp;
    unsigned ma = 0, mb = 0;
    const float a = quantize_value_of_quotient<Format::kInt, Output::kInteger, Window::kQuantRange, true>(
        x, u, s, lo, hi, zp, 0.0f, 0.0f, ma);
    const float b = quantize_value_of_quotient<Format::kInt, Output::kInteger, Window::kQuantRange>(
        x, r, s, lo, hi, zp, 0.0f, 0.0f, mb);
    if (!same_bits(a, b) || ma != mb) fail("unsigned quotient's integer output", x, s, a, b);
  }
}

// One dividend: the quotient's claim, then the element rules.
inline void check(float x, const Divisor& d) {
  if (!(d.fast && fast_dividend(x))) return;
  const float q = quotient_of(x, d);
  const float r = x / d.s;
  const bool tiny = std::fabs(q) < 0x1p-39f && std::fabs(r) < 0x1p-39f && std::signbit(q) == std::signbit(r);
  if (!(same_bits(q, r) || tiny)) fail("quotient", x, d.s, q, r);
  const float u = quotient_of<false>(x, d);
  if (!(same_bits(u, r) || (std::fabs(u) < 0x1p-39f && std::fabs(r) < 0x1p-39f))) fail("unsigned quotient", x, d.s, u, r);
  if (!same_bits(u, r)) check_unsigned(x, u, r, d.s);
  if (check_spellings) check_finite(x, q, r, d.s);
  if (same_bits(q, r)) return;  // the element rules see the same value
  const BlockRule<float> ints{-128.0f, 127.0f, 0.0f};
  unsigned ma = 0, mb = 0;
  const float a = blockwise_value_of_quotient<Format::kInt>(q, d.s, ints, ma);
  const float b = blockwise_value_of_quotient<Format::kInt>(r, d.s, ints, mb);
  if (!same_bits(a, b) || ma != mb) fail("integer element", x, d.s, a, b);
  check_format<Format::kE2M1>(q, r, d.s, x);
  check_format<Format::kE3M2>(q, r, d.s, x);
  check_format<Format::kE2M3>(q, r, d.s, x);
  check_format<Format::kE4M3>(q, r, d.s, x);
  check_format<Format::kE5M2>(q, r, d.s, x);
}

// Divisors: the ends of the fast range, powers of two, the scales of the formats' grids
// (amax / bound for round amaxes), E4M3 block scales times per-tensor scales (NVFP4), and
// log-uniform random ones.
std::vector<float> divisors(std::mt19937_64& rng) {
  std::vector<float> out = {0x1p-60f, 0x1p60f, 1.0f, 0x1p-20f, 0x1p20f, 1.0f / 3.0f, 6.0f, 127.0f, 448.0f,
                            1.0f / 127.0f, 0.1f, 3.0f / 7.0f, std::nextafter(1.0f, 2.0f), std::nextafter(2.0f, 0.0f)};
  for (int e = -9; e <= 8; ++e) {
    for (int m = 0; m < 8; ++m) {
      const float e4m3 = std::ldexp(1.0f + m / 8.0f, e);
      out.push_back(e4m3 * (0.731f / (6.0f * 448.0f)));
    }
  }
  std::uniform_real_distribution<double> exponent(-60.0, 60.0);
  for (int i = 0; i < 100; ++i) out.push_back(static_cast<float>(std::exp2(exponent(rng))));
  return out;
}

// One amax of a block: with D = Divisor, the same scale wherever the div_rn scale's block is
// not degenerate and amax is a fast dividend, and degenerate exactly where that one is.
template <BlockScale K>
void check_scale(float amax, const BlockScaleRule& r, float g) {
  const Divisor e = make_divisor(r.elem_max), d = make_divisor(g);
  if (!(e.fast && d.fast && fast_dividend(amax))) return;
  const float want = blockwise_scale<K>(amax, r, g);
  const float got = blockwise_scale<K>(amax, r, e, d);
  const bool degenerate = blockwise_degenerate(amax, want, g, K);
  if (degenerate != blockwise_degenerate(amax, got, g, K)) fail("degenerate block", amax, g, got, want);
  if (!degenerate && !same_bits(got, want)) fail("block scale", amax, g, got, want);
}

// The kInside rule of one format at v: what the full rule gives, the mask bit 1.
template <Format F>
void check_inside(float v) {
  const BlockRule<float> rule{-127.0f, 127.0f, saturation_limit(float_format_of<F>())};
  unsigned ma = 0, mb = 0;
  const float a = blockwise_value_of_quotient<F, true, true>(v, 0.75f, rule, ma);
  const float b = blockwise_value_of_quotient<F>(v, 0.75f, rule, mb);
  if (!same_bits(a, b) || ma != mb || ma != 1) fail("inside element", v, 0.75f, a, b);
  const float c = round_to_format_grid(v, float_format_of<F>()), d = round_to_format(v, float_format_of<F>());
  if (!same_bits(c, d)) fail("inside rounding", v, 1.0f, c, d);
}

// Every float32 strictly between max and the saturation limit, both signs, and a few around
// zero and max; returns how many.
template <Format F>
uint64_t check_inside_range() {
  const FloatFormat f = float_format_of<F>();
  uint64_t n = 0;
  for (uint32_t b = bits_of(std::nextafter(f.max, INFINITY)); float_of(b) < saturation_limit(f); ++b, ++n) {
    check_inside<F>(float_of(b));
    check_inside<F>(-float_of(b));
  }
  for (const float v : {0.0f, -0.0f, 0x1p-149f, f.max, 0.3f * f.max}) check_inside<F>(v);
  return 2 * n + 5;
}

// Divider32 against the division, for one n.
inline void check_integer(uint32_t n, const Divider32& v) {
  if (v.div(n) != n / v.d && failures++ == 0) {
    std::printf("integer: %" PRIu32 " / %" PRIu32 ": %" PRIu32 ", not %" PRIu32 "\n", n, v.d, v.div(n), n / v.d);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  uint64_t checked = 0;
  if (std::strcmp(argv[1], "sampled") == 0 && argc == 4) {
    check_spellings = true;
    const uint64_t count = std::strtoull(argv[2], nullptr, 10);
    std::mt19937_64 rng(std::strtoull(argv[3], nullptr, 10));
    for (const float s : divisors(rng)) {
      const Divisor d = make_divisor(s);
      // random bit patterns (every exponent), then dividends near the grid's
      // rounding boundaries: (k + 1/2) * s and (k + 1/4) * s, a few ulps either side
      for (uint64_t i = 0; i < count; ++i) check(float_of(static_cast<uint32_t>(rng())), d);
      for (int k = -600; k <= 600; ++k) {
        for (const float frac : {0.5f, 0.25f, 0.75f, 0.0f}) {
          const float x = (static_cast<float>(k) + frac) * s;
          float lo = x, hi = x;
          for (int u = 0; u < 4; ++u) {
            check(lo, d);
            check(hi, d);
            lo = std::nextafter(lo, -INFINITY);
            hi = std::nextafter(hi, INFINITY);
          }
        }
      }
      checked += count + 1201 * 4 * 8;
      if (failures) break;
    }
  } else if (std::strcmp(argv[1], "every") == 0) {
    for (int i = 2; i < argc; ++i) {
      const Divisor d = make_divisor(std::strtof(argv[i], nullptr));
      for (uint64_t b = 0; b <= 0xffffffffull && !failures; ++b) check(float_of(static_cast<uint32_t>(b)), d);
      checked += uint64_t{1} << 32;
    }
  } else if (std::strcmp(argv[1], "integers") == 0 && argc == 4) {
    const uint64_t count = std::strtoull(argv[2], nullptr, 10);
    std::mt19937_64 rng(std::strtoull(argv[3], nullptr, 10));
    std::vector<int64_t> ds = {1, 2, 3, 5, 7, 16, 41, 67, 96, 335, 4095, 4096, 4097, 65537, 1000003,
                               (int64_t{1} << 30) + 1, (int64_t{1} << 31) - 1};
    for (int i = 0; i < 40; ++i) ds.push_back(static_cast<int64_t>(rng() % ((uint64_t{1} << 31) - 1)) + 1);
    for (const int64_t d : ds) {
      const Divider32 v = make_divider32(d);
      for (uint64_t i = 0; i < count; ++i) check_integer(static_cast<uint32_t>(rng() >> 33), v);
      // multiples of d and their neighbours, up to 2^31 - 1: every one for large d, 100000 otherwise
      const uint64_t multiples = ((uint64_t{1} << 31) - 1) / static_cast<uint64_t>(d);
      const uint64_t stride = multiples > 100000 ? multiples / 100000 : 1;
      for (uint64_t k = 1; k <= multiples; k += stride) {
        const uint64_t n = k * static_cast<uint64_t>(d);
        check_integer(static_cast<uint32_t>(n - 1), v);
        check_integer(static_cast<uint32_t>(n), v);
        if (n + 1 < (uint64_t{1} << 31)) check_integer(static_cast<uint32_t>(n + 1), v);
        checked += 3;
      }
      check_integer(0x7fffffffu, v);
      checked += count + 1;
    }
  } else if (std::strcmp(argv[1], "every-integer") == 0) {
    for (int i = 2; i < argc; ++i) {
      const Divider32 v = make_divider32(std::strtoll(argv[i], nullptr, 10));
      for (uint32_t n = 0; n < 0x80000000u && !failures; ++n) check_integer(n, v);
      checked += uint64_t{1} << 31;
    }
  } else if (std::strcmp(argv[1], "scales") == 0 && argc == 4) {
    const uint64_t count = std::strtoull(argv[2], nullptr, 10);
    std::mt19937_64 rng(std::strtoull(argv[3], nullptr, 10));
    std::uniform_real_distribution<double> exponent(-64.0, 64.0);
    // per-tensor scales: NVFP4's of amax 0.731, 1, the fast range's ends, NaN, 0 and random
    std::vector<float> gs = {0.731f / (6.0f * 448.0f), 1.0f, 0x1p-60f, 0x1p60f, 0.0f, std::numeric_limits<float>::quiet_NaN()};
    for (int i = 0; i < 20; ++i) gs.push_back(static_cast<float>(std::exp2(exponent(rng))));
    for (const float elem_max : {6.0f, 7.5f, 28.0f, 448.0f, 57344.0f, 7.0f, 127.0f, 32767.0f}) {
      const BlockScaleRule r{BlockScale::kE4M3, elem_max, 0};
      for (const float g : gs) {
        for (uint64_t i = 0; i < count; ++i) {
          // log-uniform amax, and random bit patterns (every exponent, NaN, inf)
          const float amax = i % 2 ? static_cast<float>(std::exp2(exponent(rng))) : float_of(static_cast<uint32_t>(rng() >> 33));
          check_scale<BlockScale::kE4M3>(amax, r, g);
          check_scale<BlockScale::kFloat32>(amax, r, g);
        }
        checked += 2 * count;
      }
    }
  } else if (std::strcmp(argv[1], "inside") == 0) {
    checked += check_inside_range<Format::kE2M1>() + check_inside_range<Format::kE3M2>() +
               check_inside_range<Format::kE2M3>() + check_inside_range<Format::kE4M3>() +
               check_inside_range<Format::kE5M2>();
  } else {
    return 2;
  }
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("checked %" PRIu64 " quotients\n", checked);  // (integer ones too)
  return 0;
}
