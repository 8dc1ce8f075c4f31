#pragma once
// llama.cpp's Q8_0 and Q4_0 blocks (fake_quantize_ggml): the block and element rule, written
// once for the CPU loop (csrc/cpu/ggml.cpp) and the CUDA kernels (csrc/cuda/ggml.cu). It is
// not the numerics contract of the other operators (docs/design.md) but ggml's reference
// quantization (ggml-quants.c, quantize_row_q8_0_ref / q4_0_ref) followed by its
// dequantization, as fakequant/composite/rules.py's fake_quantize_ggml states it in plain
// PyTorch (the reference the tests compare with). Everything is float32, whatever the dtype
// of x (float64 inputs are rounded to float32 first), each operation rounded once:
//
//   Q8_0:  d = amax / 127 (amax = max |x| over the block)     codes q = roundf(x * inv)
//          y = (q + 0.0) * fp32(fp16(d))
//   Q4_0:  d = m / -8 (m: the block's first element of largest |x|, signed)
//          c = trunc(x * inv + 8.5);  y = fp32(fp16(d)) * (min(c, 15) - 8)
//
// with inv = 1 / d (0 where d = 0). The mask (the gradient's): y is finite and, for Q4_0,
// c <= 15. NaN in a block makes its d NaN and so every output of the block NaN.
#include <c10/macros/Macros.h>
#include <c10/util/Half.h>

#include <math.h>
#include <cmath>
#include <cstdint>

#include "contract.h"

namespace fakequant {

// The GGML block types, by their code width (num_bits).
enum class GgmlType : int { kQ4_0 = 4, kQ8_0 = 8 };

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float floor_value(float v) { return floorf(v); }
__device__ __forceinline__ float trunc_value(float v) { return truncf(v); }
#else
inline float floor_value(float v) { return std::floor(v); }
inline float trunc_value(float v) { return std::trunc(v); }
#endif

// A block's constants: the reciprocal of its float32 scale d (the codes) and d rounded to
// float16 and back (the values, as the GGUF file stores the scale).
struct GgmlScale {
  float inv;
  float d16;
};

// The constants of a block from m: its max |x| (Q8_0) or its first element of largest |x|,
// signed (Q4_0). d rounds to float16 to nearest even (subnormals; +-inf above 65519.99..).
template <GgmlType T>
C10_HOST_DEVICE inline GgmlScale ggml_scale(float m) {
  const float d = div_rn(m, T == GgmlType::kQ8_0 ? 127.0f : -8.0f);
  const float inv = d == 0.0f ? 0.0f : div_rn(1.0f, d);
  return GgmlScale{inv, static_cast<float>(c10::Half(d))};
}

// The key of an element for a block's reduction: the bit pattern of |x| (NaN above +inf).
// Q8_0's amax is the float of the largest key; Q4_0 keeps the first element of the largest.
C10_HOST_DEVICE inline uint32_t ggml_key(float x) { return abs_bits(x); }

// One element x of a block with constants s; m gets the mask bit.
template <GgmlType T, typename M>
C10_HOST_DEVICE inline float ggml_value(float x, const GgmlScale& s, M& m) {
  const float v = mul_rn(x, s.inv);
  if constexpr (T == GgmlType::kQ8_0) {
    // roundf(v): halves away from zero, from the exact fraction |v| - floor(|v|); +0.0 for -0.0
    const float a = abs_value(v);
    const float f = floor_value(a);
    const float r = add_rn(f, sub_rn(a, f) >= 0.5f ? 1.0f : 0.0f);
    const float q = add_rn(copy_sign(r, v), 0.0f);
    const float y = mul_rn(q, s.d16);
    m = static_cast<M>(abs_value(y) < INFINITY);
    return y;
  } else {
    const float c = trunc_value(add_rn(v, 8.5f));
    const float y = mul_rn(s.d16, sub_rn(c > 15.0f ? 15.0f : c, 8.0f));  // (NaN stays NaN)
    m = static_cast<M>((c <= 15.0f) & (abs_value(y) < INFINITY));
    return y;
  }
}

}  // namespace fakequant
