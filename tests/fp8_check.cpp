// Checks that the FP8 conversion instruction of GPUs from compute capability 8.9 on
// (cvt.rn.satfinite.{e4m3,e5m2}x2.f32, which contract.h's round_to_small_float uses there)
// computes the element rule's value, round_to_format: NVIDIA's own host implementation of
// the conversion (cuda_fp8.h, the same function as on the device, and back through float16)
// against round_to_format for float32 inputs, E4M3 and E5M2, bit for bit (NaN: any NaN).
// Built and run by tests/test_fp8_convert.py:
//
//   fp8_check sampled COUNT SEED   COUNT random bit patterns, then every third float of the
//                                  subnormal and saturating ranges of both formats
//   fp8_check every SIGN           every float32 bit pattern whose sign bit is SIGN (0 or 1)
//
// Prints "checked N values" and exits 0, or prints the first counterexample and exits 1.
#include <cuda_fp8.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "check_bits.h"
#include "fakequant/contract.h"

using namespace fakequant;

namespace {

int failures = 0;

float converted(float v, __nv_fp8_interpretation_t kind) {
  const __nv_fp8_storage_t b = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, kind)));
}

void check(float v) {
  const float a = round_to_format(v, kE4M3), b = converted(v, __NV_E4M3);
  const float c = round_to_format(v, kE5M2), d = converted(v, __NV_E5M2);
  const bool e4m3 = same_bits(a, b);
  const bool e5m2 = same_bits(c, d);
  if (!(e4m3 && e5m2) && failures++ == 0) {
    std::printf("%s: v = %a (0x%08" PRIx32 "): round_to_format %a, conversion %a\n", e4m3 ? "E5M2" : "E4M3",
                static_cast<double>(v), bits_of(v), static_cast<double>(e4m3 ? c : a),
                static_cast<double>(e4m3 ? d : b));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  uint64_t checked = 0;
  if (std::strcmp(argv[1], "sampled") == 0 && argc == 4) {
    const uint64_t count = std::strtoull(argv[2], nullptr, 10);
    std::mt19937_64 rng(std::strtoull(argv[3], nullptr, 10));
    for (uint64_t i = 0; i < count; ++i) check(float_of(static_cast<uint32_t>(rng())));
    checked += count;
    // every third float of each range where the formats' rounding changes character: E4M3's
    // subnormals and smallest normals (2^-12 to 2^-5), E5M2's (2^-18 to 2^-13), and both
    // formats' top binades and saturation (256 to 2^17), both signs
    const uint32_t ranges[3][2] = {{0x39800000u, 0x3d000000u}, {0x36800000u, 0x39000000u}, {0x43800000u, 0x48000000u}};
    for (const auto& r : ranges) {
      for (uint32_t b = r[0]; b <= r[1]; b += 3) {
        check(float_of(b));
        check(float_of(b | 0x80000000u));
        checked += 2;
      }
    }
  } else if (std::strcmp(argv[1], "every") == 0 && argc == 3) {
    const uint32_t sign = std::strtoul(argv[2], nullptr, 10) ? 0x80000000u : 0u;
    for (uint32_t b = 0; b <= 0x7fffffffu; ++b) check(float_of(b | sign));
    checked = uint64_t{1} << 31;
  } else {
    return 2;
  }
  if (failures) {
    std::printf("%d failures\n", failures);
    return 1;
  }
  std::printf("checked %" PRIu64 " values\n", checked);
  return 0;
}
