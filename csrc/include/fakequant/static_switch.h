#pragma once
// Runtime flags become template constants here, once: a call
//
//   static_switch<Elem, Elem::kInt, Elem::kE2M1>(elem, [&](auto e) {
//     constexpr Elem E = decltype(e)::value;
//     ...
//   });
//
// runs the lambda with std::integral_constant<Elem, v> for the listed value v
// equal to `elem` (each listed value instantiates the lambda once; a value not
// listed is an internal error). bool_switch does the same for a bool;
// with_quantize_rule and with_elem name the combinations the ops use. Host code
// only (it launches CUDA kernels from the lambda, never runs on the device).
#include <c10/util/Exception.h>

#include "kernel_table.h"

#include <cstdint>
#include <type_traits>

namespace fakequant {

template <typename T, T... kValues, typename F>
void static_switch(T value, F&& f) {
  const bool matched =
      ((value == kValues ? (f(std::integral_constant<T, kValues>{}), true) : false) || ...);
  TORCH_INTERNAL_ASSERT(matched, "fakequant: no instantiation for value ", static_cast<int>(value));
}

template <typename F>
void bool_switch(bool value, F&& f) {
  if (value) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// The (family, output, window, mask) combinations a QuantizeJob may hold, as
// template constants: f(family, O, W, M) with O, W and M std::integral_constants
// of Output, Window and MaskOut. Only these are instantiated: the affine family
// with every mask kind (bool masks for torch-compatible callers, none for LSQ's
// forward), the min/max family packed, the amax family with every output, packed.
template <typename F>
void with_quantize_rule(const QuantizeJob& job, F&& f) {
  std::visit(
      [&](const auto& family) {
        using Family = std::decay_t<decltype(family)>;
        using W = std::integral_constant<Window, Family::kWindow>;
        using Fake = std::integral_constant<Output, Output::kFake>;
        using Packed = std::integral_constant<MaskOut, MaskOut::kPacked>;
        if constexpr (std::is_same_v<Family, AffineFamily>) {
          TORCH_INTERNAL_ASSERT(job.output == Output::kFake);
          static_switch<MaskOut, MaskOut::kPacked, MaskOut::kBool, MaskOut::kNone>(
              job.mask_out, [&](auto m) { f(family, Fake{}, W{}, m); });
        } else if constexpr (std::is_same_v<Family, MinMaxFamily>) {
          TORCH_INTERNAL_ASSERT(job.output == Output::kFake && job.mask_out == MaskOut::kPacked);
          f(family, Fake{}, W{}, Packed{});
        } else {
          TORCH_INTERNAL_ASSERT(job.mask_out == MaskOut::kPacked);
          static_switch<Output, Output::kFake, Output::kInteger, Output::kFp8E4M3, Output::kFp8E5M2,
                        Output::kFp6E3M2, Output::kFp6E2M3>(
              job.output, [&](auto o) { f(family, o, W{}, Packed{}); });
        }
      },
      job.family);
}

// f(bits_t{}) with bits_t the unsigned integer of a 2-, 4- or 8-byte element
// (loops that select on bit patterns serve every dtype of that size).
template <typename F>
void with_bits_type(int64_t element_size, F&& f) {
  switch (element_size) {
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    default: TORCH_INTERNAL_ASSERT(element_size == 8); f(uint64_t{}); break;
  }
}

// The element formats of fake_quantize_blockwise.
template <typename F>
void with_elem(Elem elem, F&& f) {
  static_switch<Elem, Elem::kInt, Elem::kE2M1, Elem::kE3M2, Elem::kE2M3, Elem::kE4M3, Elem::kE5M2>(
      elem, std::forward<F>(f));
}

}  // namespace fakequant
