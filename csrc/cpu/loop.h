#pragma once
// What the CPU loops share: the multiversioned clones, the tile sizes and the
// packing of mask bytes into bits. The element rules are in contract.h.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <cstdint>
#include <cstring>

#include "fakequant/contract.h"

namespace fakequant {
namespace cpu {

// The element loops are compiled for several x86-64 levels and the loader picks
// the best the CPU has (GCC/Clang function multiversioning): the extension is
// built once, without -march, and still runs 256/512-bit vectors where present.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FAKEQUANT_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "arch=x86-64-v2", "default")))
#else
#define FAKEQUANT_CPU_CLONES
#endif

// Packs n bytes holding 0/1 into bits, element k at bit k % 8 of byte k / 8.
inline void pack_bits(const uint8_t* bytes, int64_t n, uint8_t* bits) {
  int64_t k = 0;
#if defined(__SSE2__)
  for (; k + 16 <= n; k += 16) {  // byte j's low bit moved to its sign bit, gathered by movemask
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + k));
    const auto b = static_cast<uint16_t>(_mm_movemask_epi8(_mm_slli_epi16(v, 7)));
    std::memcpy(bits + k / 8, &b, 2);  // little-endian: elements k..k+7 in the first byte
  }
#endif
  for (; k + 8 <= n; k += 8) {
    uint64_t v;
    std::memcpy(&v, bytes + k, 8);
    // Moves bit 0 of byte j to bit 56 + j; the partial products never overlap.
    bits[k / 8] = static_cast<uint8_t>(((v & 0x0101010101010101ULL) * 0x0102040810204080ULL) >> 56);
  }
  if (k < n) {
    uint8_t b = 0;
    for (int64_t j = 0; k + j < n; ++j) b |= static_cast<uint8_t>((bytes[k + j] & 1) << j);
    bits[k / 8] = b;
  }
}

constexpr int64_t kTile = 2048;       // elements per tile; a multiple of 8
constexpr int64_t kTilesPerTask = 16;  // parallel grain: 32768 elements

// The unsigned integer type of a scalar's bit pattern.
template <typename scalar_t>
struct BitsOf;
template <> struct BitsOf<double> { using type = uint64_t; };
template <> struct BitsOf<float> { using type = uint32_t; };
template <> struct BitsOf<c10::Half> { using type = uint16_t; };
template <> struct BitsOf<c10::BFloat16> { using type = uint16_t; };

}  // namespace cpu
}  // namespace fakequant
