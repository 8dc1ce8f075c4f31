#pragma once
// Runtime flags become template constants here, once: a call
//
//   static_switch<Format, Format::kInt, Format::kE2M1>(format, [&](auto f) {
//     constexpr Format F = decltype(f)::value;
//     ...
//   });
//
// runs the lambda with std::integral_constant<Format, v> for the listed value v
// equal to `format` (each listed value instantiates the lambda once; a value not
// listed is an internal error). bool_switch does the same for a bool;
// with_quantize_rule and with_blockwise_format name the combinations the ops
// use. Host code only (it launches CUDA kernels from the lambda, never runs on
// the device).
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

// The (family, format, output, window, mask) combinations a QuantizeJob may
// hold, as template constants: f(family, F, O, W, M) with F, O, W and M
// std::integral_constants of Format, Output, Window and MaskOut. Only these are
// instantiated: the affine family (integers, fake) with every mask kind (bool
// masks for torch-compatible callers, none for LSQ's forward), the min/max
// family (integers, fake) packed, the amax family packed with integers, fake or
// integer output, and with the FP8 and FP6 formats, fake.
template <typename F>
void with_quantize_rule(const QuantizeJob& job, F&& f) {
  std::visit(
      [&](const auto& family) {
        using Family = std::decay_t<decltype(family)>;
        using W = std::integral_constant<Window, Family::kWindow>;
        using Int = std::integral_constant<Format, Format::kInt>;
        using Fake = std::integral_constant<Output, Output::kFake>;
        using Packed = std::integral_constant<MaskOut, MaskOut::kPacked>;
        if constexpr (std::is_same_v<Family, AffineFamily>) {
          TORCH_INTERNAL_ASSERT(job.format == Format::kInt && job.output == Output::kFake);
          static_switch<MaskOut, MaskOut::kPacked, MaskOut::kBool, MaskOut::kNone>(
              job.mask_out, [&](auto m) { f(family, Int{}, Fake{}, W{}, m); });
        } else if constexpr (std::is_same_v<Family, MinMaxFamily>) {
          TORCH_INTERNAL_ASSERT(job.format == Format::kInt && job.output == Output::kFake &&
                                job.mask_out == MaskOut::kPacked);
          f(family, Int{}, Fake{}, W{}, Packed{});
        } else {
          TORCH_INTERNAL_ASSERT(job.mask_out == MaskOut::kPacked);
          if (job.format == Format::kInt) {
            static_switch<Output, Output::kFake, Output::kInteger>(
                job.output, [&](auto o) { f(family, Int{}, o, W{}, Packed{}); });
          } else {
            TORCH_INTERNAL_ASSERT(job.output == Output::kFake);
            static_switch<Format, Format::kE4M3, Format::kE5M2, Format::kE3M2, Format::kE2M3>(
                job.format, [&](auto fmt) { f(family, fmt, Fake{}, W{}, Packed{}); });
          }
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

// The element formats of fake_quantize_blockwise: every one.
template <typename F>
void with_blockwise_format(Format format, F&& f) {
  static_switch<Format, Format::kInt, Format::kE2M1, Format::kE3M2, Format::kE2M3, Format::kE4M3,
                Format::kE5M2>(format, std::forward<F>(f));
}

}  // namespace fakequant
