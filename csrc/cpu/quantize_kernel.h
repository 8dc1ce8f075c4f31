#pragma once
// The one CPU loop behind every forward operator. Each op family turns its
// arguments into per-parameter constants (QuantParams) and picks the output and
// mask rule as template arguments, so the element loop has no branches on
// flags and the compiler vectorises it.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <cstring>
#include <type_traits>
#include <vector>

#include "../float_formats.h"
#include "../op_args.h"
#include "../param_layout.h"

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

// float32 math for float32/float16/bfloat16 inputs, float64 for float64.
template <typename scalar_t>
using compute_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

// (q - zp) * scale, q itself, or fp8(clamp(x / scale, lo, hi)) * scale
enum class Output { kFake, kInteger, kFp8E4M3, kFp8E5M2 };
enum class Window { kQuantRange, kInput };  // mask: q unclamped in range, or x in [lo, hi]

// Per-parameter constants, one entry per element of the (broadcast) parameter
// array. lo/hi bound rint(x / scale) (the quantization range less the zero point);
// for the FP8 outputs they bound x / scale (+-max of the format).
template <typename C>
struct QuantParams {
  std::vector<C> scale, lo, hi, zero_point, window_lo, window_hi;
  explicit QuantParams(int64_t n)
      : scale(n), lo(n), hi(n), zero_point(n, C(0)), window_lo(n, C(0)), window_hi(n, C(0)) {}
};

// rint with ties to even (the default rounding mode, which PyTorch never
// changes); one vround/frintn instruction from SSE4.1 and Armv8 on.
template <typename C>
inline C round_half_even(C v) {
  return std::nearbyint(v);
}

constexpr bool is_fp8(Output o) { return o == Output::kFp8E4M3 || o == Output::kFp8E5M2; }

template <typename scalar_t, typename C, Output O, Window W>
inline void quantize_element(scalar_t x, scalar_t& y, uint8_t& m, C s, C lo, C hi, C zp, C wlo,
                             C whi) {
  const C xv = static_cast<C>(x);
  if constexpr (is_fp8(O)) {
    static_assert(W == Window::kInput, "the FP8 mask is the input window |x| <= amax");
    constexpr FloatFormat format = O == Output::kFp8E4M3 ? kE4M3 : kE5M2;
    const C xs = xv / s;
    const C c = xs < lo ? lo : (xs > hi ? hi : xs);  // NaN falls through both tests
    // float64 goes through float32 first, as torch's double -> float8 cast does.
    const float q = round_to_format(static_cast<float>(c), format);
    y = static_cast<scalar_t>(static_cast<C>(q) * s);
    m = static_cast<uint8_t>((xv >= wlo) & (xv <= whi));
  } else {
    const C r = round_half_even(xv / s);
    const C q = r < lo ? lo : (r > hi ? hi : r);  // NaN falls through both tests
    y = static_cast<scalar_t>(O == Output::kFake ? q * s : q + zp);
    m = W == Window::kQuantRange ? static_cast<uint8_t>((r >= lo) & (r <= hi))
                                 : static_cast<uint8_t>((xv >= wlo) & (xv <= whi));
  }
}

// A run of elements sharing one set of parameters (per-tensor, or the inner
// dimensions of a channel).
template <typename scalar_t, typename C, Output O, Window W>
FAKEQUANT_CPU_CLONES void run_uniform(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                        uint8_t* __restrict__ m, int64_t n, const QuantParams<C>& p, int64_t j) {
  const C s = p.scale[j], lo = p.lo[j], hi = p.hi[j], zp = p.zero_point[j];
  const C wlo = p.window_lo[j], whi = p.window_hi[j];
  for (int64_t k = 0; k < n; ++k) {
    quantize_element<scalar_t, C, O, W>(x[k], y[k], m[k], s, lo, hi, zp, wlo, whi);
  }
}

// A run whose parameters change with every element (channels innermost, as in
// channels_last activations quantized per channel).
template <typename scalar_t, typename C, Output O, Window W>
FAKEQUANT_CPU_CLONES void run_varying(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                        uint8_t* __restrict__ m, int64_t n, const QuantParams<C>& p, int64_t j) {
  const C* __restrict__ s = p.scale.data() + j;
  const C* __restrict__ lo = p.lo.data() + j;
  const C* __restrict__ hi = p.hi.data() + j;
  const C* __restrict__ zp = p.zero_point.data() + j;
  const C* __restrict__ wlo = p.window_lo.data() + j;
  const C* __restrict__ whi = p.window_hi.data() + j;
  for (int64_t k = 0; k < n; ++k) {
    quantize_element<scalar_t, C, O, W>(x[k], y[k], m[k], s[k], lo[k], hi[k], zp[k], wlo[k],
                                        whi[k]);
  }
}

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

// Runs the loop over `x`, which must be dense with the strides of `y`.
// `mask` is packed (uint8, ceil(n / 8) bytes) or bool shaped like y.
template <typename scalar_t, Output O, Window W>
void quantize_loop(const at::Tensor& x, at::Tensor& y, at::Tensor& mask, const ParamLayout& layout,
                   const QuantParams<compute_t<scalar_t>>& params) {
  using C = compute_t<scalar_t>;
  const int64_t n = x.numel();
  if (n == 0) return;
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  scalar_t* yp = y.mutable_data_ptr<scalar_t>();
  const bool packed = mask.scalar_type() == at::kByte;
  uint8_t* mp = packed ? mask.mutable_data_ptr<uint8_t>()
                       : reinterpret_cast<uint8_t*>(mask.mutable_data_ptr<bool>());
  const int64_t inner = layout.inner_size();
  const int64_t pstep = layout.inner_param_stride();
  const int64_t ntiles = (n + kTile - 1) / kTile;

  at::parallel_for(0, ntiles, kTilesPerTask, [&](int64_t t0, int64_t t1) {
    alignas(64) uint8_t local[kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t e0 = t * kTile, e1 = std::min(n, e0 + kTile);
      uint8_t* m = packed ? local : mp + e0;
      for (int64_t e = e0; e < e1;) {
        const int64_t row = e / inner, col = e - row * inner;
        const int64_t len = std::min(inner - col, e1 - e);
        const int64_t j = layout.row_param_offset(row) + col * pstep;
        if (pstep == 0) {
          run_uniform<scalar_t, C, O, W>(xp + e, yp + e, m + (e - e0), len, params, j);
        } else if (pstep == 1) {
          run_varying<scalar_t, C, O, W>(xp + e, yp + e, m + (e - e0), len, params, j);
        } else {
          for (int64_t k = 0; k < len; ++k) {
            run_uniform<scalar_t, C, O, W>(xp + e + k, yp + e + k, m + (e - e0) + k, 1, params,
                                           j + k * pstep);
          }
        }
        e += len;
      }
      if (packed) pack_bits(local, e1 - e0, mp + e0 / 8);
    }
  });
}

// Dispatches on input's dtype and runs the loop with the params that
// `make_params` (a templated functor taking the compute type) returns.
template <Output O, Window W, typename MakeParams>
std::tuple<at::Tensor, at::Tensor> run_quantize(const at::Tensor& input,
                                                at::IntArrayRef param_strides, bool pack_mask,
                                                const MakeParams& make_params) {
  at::Tensor y = at::empty_like(input);
  at::Tensor mask = new_mask(y, pack_mask);
  const at::Tensor x = dense_like(input, y);
  const ParamLayout layout = make_param_layout(y, param_strides);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "fakequant_quantize", [&] {
        const auto params = make_params(compute_t<scalar_t>{});
        quantize_loop<scalar_t, O, W>(x, y, mask, layout, params);
      });
  return {y, mask};
}

}  // namespace cpu
}  // namespace fakequant
