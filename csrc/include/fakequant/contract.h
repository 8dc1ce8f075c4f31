#pragma once
// The element contract of every fakequant operator (docs/design.md, "Numerics
// contract"), written once for the CPU loops (csrc/cpu) and the CUDA kernels
// (csrc/cuda), which both call what is here:
//
//   - the constants and ranges (num_bits limits, the amax bound and range, the
//     tiny-amax epsilon; the float formats' maxima are in float_formats.h);
//   - correctly rounded arithmetic: the _rn intrinsics in device code, plain
//     operators on the host (built with -ffp-contract=off, no fast math);
//   - the validity of parameter values (an invalid parameter gives NaN outputs
//     and mask 0 where the values are not checked first: CUDA without
//     FAKEQUANT_CHECK_VALUES);
//   - the parameter-to-constants builder of each op family (affine, min/max,
//     amax with an integer or FP8 grid): parameter i -> Consts;
//   - the quantize and mask rule for every format, output kind and mask window;
//   - the block-wise rule: geometry, block scale, degenerate block, element;
//   - the LSQ gradient rule;
//   - the mask-backward select and the packed mask's bit order.
//
// Signed zeros: the integer grids return +0.0 where q is 0 (q + 0.0 before the
// multiply), as ONNX Runtime's DequantizeLinear does. The float grids (FP8 and
// the block-wise E2M1/E4M3/E5M2 elements) keep the sign of a zero: ONNX
// Runtime's float8 QuantizeLinear keeps it in the float8 code, and its
// DequantizeLinear (and the Div/Round/Mul graph of E2M1) give -0.0 for a tiny
// negative input, which these rules match.
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <math.h>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "float_formats.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_fp8.h>  // round_to_small_float, compute capability 8.9 on
#endif

namespace fakequant {

// --- constants and ranges ------------------------------------------------------------

// The integer widths every integer op accepts.
constexpr int64_t kMinNumBits = 2;
constexpr int64_t kMaxNumBits = 16;

// Below this, amax is treated as 0 and the output is 0 (pytorch-quantization's
// epsilon, the smallest float16 subnormal).
constexpr float kAmaxEpsilon = 1.0f / (1 << 24);

// The bound of the amax family: 2^(num_bits - 1 + unsigned) - 1, and the
// smallest integer of its range ([0, bound] unsigned, [-bound, bound] narrow,
// else [-bound - 1, bound]).
C10_HOST_DEVICE constexpr int64_t amax_bound(int64_t num_bits, bool is_unsigned) {
  return (int64_t{1} << (num_bits - 1 + (is_unsigned ? 1 : 0))) - 1;
}
C10_HOST_DEVICE constexpr int64_t amax_quant_min(int64_t bound, bool is_unsigned,
                                                 bool narrow_range) {
  return is_unsigned ? 0 : (narrow_range ? -bound : -bound - 1);
}

// The steps of fake_quantize_min_max's range: 2^num_bits - 1.
C10_HOST_DEVICE constexpr float min_max_levels(int64_t num_bits) {
  return static_cast<float>((int64_t{1} << num_bits) - 1);
}

// --- arithmetic: one rounding per operation ---------------------------------------------

// float32 math for float32/float16/bfloat16 inputs, float64 for float64.
template <typename scalar_t>
using compute_t = std::conditional_t<std::is_same_v<scalar_t, double>, double, float>;

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
// Round half to even (cvt.rni).
__device__ __forceinline__ float round_half_even(float v) { return rintf(v); }
__device__ __forceinline__ double round_half_even(double v) { return rint(v); }
__device__ __forceinline__ float to_float_rn(float v) { return v; }
__device__ __forceinline__ float to_float_rn(double v) { return __double2float_rn(v); }
__device__ __forceinline__ float abs_value(float v) { return fabsf(v); }
__device__ __forceinline__ double abs_value(double v) { return fabs(v); }
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ float copy_sign(float magnitude, float sign) { return copysignf(magnitude, sign); }
__device__ __forceinline__ float min_value(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ float max_value(float a, float b) { return fmaxf(a, b); }
#else
template <typename C>
inline C div_rn(C a, C b) { return a / b; }
template <typename C>
inline C mul_rn(C a, C b) { return a * b; }
template <typename C>
inline C add_rn(C a, C b) { return a + b; }
template <typename C>
inline C sub_rn(C a, C b) { return a - b; }
// The default rounding mode (ties to even), which PyTorch never changes; one
// vround/frintn instruction from SSE4.1 and Armv8 on.
template <typename C>
inline C round_half_even(C v) { return std::nearbyint(v); }
inline float to_float_rn(float v) { return v; }
inline float to_float_rn(double v) { return static_cast<float>(v); }
template <typename C>
inline C abs_value(C v) { return std::abs(v); }
inline float fma_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float copy_sign(float magnitude, float sign) { return std::copysign(magnitude, sign); }
inline float min_value(float a, float b) { return std::fmin(a, b); }
inline float max_value(float a, float b) { return std::fmax(a, b); }
#endif

template <typename C>
C10_HOST_DEVICE inline C clamp_nan(C v, C lo, C hi) {
  const C up = v < lo ? lo : v;  // NaN falls through both tests
  return up > hi ? hi : up;      // (two NaN-keeping min/max instructions on a GPU)
}

// The bounds of r = rint(x / scale) for the affine ops: quant_min - zero_point
// and quant_max - zero_point, which the rules clamp r to (so (q - zp) is never
// formed and rounded) and test for the mask. Both are integers; with ranges of
// more than 2^24 levels (float32) they need not be values of C. Rounding them
// inward (lo up, hi down) keeps the mask exact, and a clamped output inside the
// range. v is exact in double (|v| < 2^33 for int32 ranges and zero points).
C10_HOST_DEVICE inline float next_toward(float v, float to) { return nextafterf(v, to); }
C10_HOST_DEVICE inline double next_toward(double v, double to) { return nextafter(v, to); }

template <typename C>
C10_HOST_DEVICE inline C integer_bound(int64_t v, bool up) {
  const double exact = static_cast<double>(v);
  const C c = static_cast<C>(v);
  if (up && static_cast<double>(c) < exact) return next_toward(c, C(INFINITY));
  if (!up && static_cast<double>(c) > exact) return next_toward(c, C(-INFINITY));
  return c;
}

// --- the float grids --------------------------------------------------------------------------

// Rounding to the values of a small float format (float_formats.h), in float32 on
// every device: saturate to +-max, then round to the nearest value of the format,
// ties to even, as torch's float8 casts round. Branch-free bit arithmetic, so the
// CPU loops vectorise; NaN stays NaN.
//
// round_to_format_grid is the rounding without the saturation. The spacing of the format's
// values around v is q = 2^(e - M) where 2^e <= |v| < 2^(e+1), and 2^(min_exponent - M)
// among the subnormals. With c = 1.5 * 2^23 * q (made from v's exponent bits, a power of
// two times 1.5) and |v| < 2^22 q, v + c lies in [2^23 q, 2^24 q), whose float32 spacing is
// q: adding rounds v to the nearest multiple of q, ties to the even multiple (c / q is
// even), which is the format's even value; subtracting c again is exact. A carry into the
// next binade lands on a value of the format too. The sum loses the sign of a zero result,
// which copy_sign restores from v (a nonzero result has v's sign). |v| < 2^22 q holds for
// every |v| below 2^(M + 1) q, the top of v's binade, as M <= 3.
//
// For |v| < saturation_limit(f) (max + half the step of max's binade, below)
// round_to_format_grid gives round_to_format's value: a v beyond max is in max's binade (the
// limit is below the next power of two in every format), within half a step of max, and
// rounds to it. Kernels that know every |v| of a block below the limit use it.
//
// `sign`: where the result's sign comes from, v itself or a value of v's sign wherever v is
// not tiny (below 2^-39: such a v rounds to a zero in every format, whose sign is then
// sign's). The CUDA block kernels pass x for v = x / s computed without x's sign
// (quotient_of<false>), which keeps RN(x / s) but for tiny quotients, whose sign may be lost
// (a -0 dividend gives +0 where y_lo < 0): one instruction an element fewer.
C10_HOST_DEVICE inline float round_to_format_grid(float v, FloatFormat f, float sign) {
  const uint32_t exponent = float_to_bits(v) & 0x7f800000u;
  // c's bits: the exponent field's, the mantissa 0.5 (added: the exponent's low bits are 0)
  const uint32_t smallest = (static_cast<uint32_t>(f.min_exponent - f.mantissa_bits + 127 + 23) << 23) + 0x00400000u;
  uint32_t magic = exponent + (static_cast<uint32_t>(23 - f.mantissa_bits) << 23) + 0x00400000u;  // (NaN, inf: any c will do)
  magic = magic < smallest ? smallest : magic;
  const float c = bits_to_float(magic);
  return copy_sign(sub_rn(add_rn(v, c), c), sign);
}
C10_HOST_DEVICE inline float round_to_format_grid(float v, FloatFormat f) { return round_to_format_grid(v, f, v); }

C10_HOST_DEVICE inline float round_to_format(float v, FloatFormat f) {
  return round_to_format_grid(clamp_nan(v, -f.max, f.max), f);
}

// --- one divisor, many dividends -----------------------------------------------------------
// The CUDA kernels divide many x by one s (a tensor's, a channel's or a block's scale). A
// correctly rounded division (div_rn) costs about ten instructions an element on a GPU: a
// reciprocal refined on every call, a range check, three FMAs and a branch around its slow
// path. With s's reciprocal made once as a correctly rounded y = RN(1 / s) and the rest of it,
// y_lo = RN((1 - s * y) * y) (the residual 1 - s * y is exact: y is faithful), quotient_of
// costs four:
//
//   q0 = x * y + RN(x * y_lo),   q = q0 - (q0 * s - x) * y
//
// (each FMA rounded once). y + y_lo is 1 / s within 2^-47 of it (relatively: the residual is
// at most 2^-24, and y_lo's own error is about 2^-23 of y_lo), so x * y + RN(x * y_lo) is x / s
// within about 2^-46 of it, and q0, its one rounding, is within half an ulp and 2^-23 of one
// of x / s: faithful. Then the residual q0 * s - x is exact and q = RN(x / s) by Markstein's
// theorem (y correctly rounded, q0 faithful; P. Markstein, IBM Journal of Research and
// Development 34(1), 1990), wherever |x / s| >= 2^-125 and |x| >= 2^-100 (a subnormal
// x * y_lo is off by at most 2^-150, a quarter ulp of such a quotient). In the rest of the
// divisor's range (below) the quotient is tiny: |x / s| < 2^-125, or |x| < 2^-100 with
// s >= 2^-60. There q may differ from RN(x / s) by the rounding of subnormal intermediates
// (times y <= 2^60), but both are below 2^-39 in magnitude and q has the sign of x / s
// (copy_sign; s > 0). Every rule that consumes a quotient maps such values alike: rint and
// each float format round them to a zero of that sign, a clamp to a range holding zero keeps
// them (an integer grid then adds +0), and they are inside every mask bound (the integer
// ranges hold 0, the formats' limits are >= 7).
// Hence the element rules give the same bits with quotient_of as with div_rn (the LSQ
// gradient, which uses x / s itself, keeps div_rn). The fast range: 2^-60 <= s <= 2^60
// (Divisor::fast, decided once; then y_lo neither underflows, the residual being 0 or at
// least 2^-48, nor overflows) and |x| <= 2^60, NaN excluded (fast_dividend: per element, or
// per block from its amax); elsewhere the kernels call div_rn. tests/test_divisor.py checks
// the claim over millions of quotients, every x of some divisors in `make slow`.
struct Divisor {
  float s, y, y_lo;  // y + y_lo = 1 / s where fast (y = RN(1 / s)); else 1 and 0
  bool fast;
};

C10_HOST_DEVICE inline Divisor make_divisor(float s) {
  const bool fast = (s >= 0x1p-60f) & (s <= 0x1p60f);  // NaN: not fast (2^60: kFastDividend's bound)
  if (!fast) return Divisor{s, 1.0f, 0.0f, false};
  const float y = div_rn(1.0f, s);
  return Divisor{s, y, mul_rn(fma_rn(-s, y, 1.0f), y), true};
}

constexpr float kFastDividend = 0x1p60f;
C10_HOST_DEVICE inline bool fast_dividend(float x) { return abs_value(x) <= kFastDividend; }  // NaN: false
// The bound on |x| that makes x a fast dividend of d: kFastDividend, or -1 (none) where d is
// not fast, so that one comparison an element tests both (kernels that hold one Divisor).
C10_HOST_DEVICE inline float dividend_limit(const Divisor& d) { return d.fast ? kFastDividend : -1.0f; }

// The scale of the amax family's zero case (amax <= kAmaxEpsilon, range [0, 0]): every
// output is the clamp's 0 (or NaN) times the scale, so any positive scale gives the same
// bits (x / s only has to be NaN where x is: 0 * any scale is 0 of the same sign); this one
// is outside the fast division's range, so that a kernel's fast division never sees the
// zero case (quantize_value_of_quotient's kFinite float branch relies on it).
constexpr float kZeroAmaxScale = 0x1p-100f;
static_assert(kZeroAmaxScale < 0x1p-60f, "the zero case must not be fast (make_divisor)");

// x / s for a fast divisor and dividend, as the element rules see it (above). kSigned = false
// leaves out the sign's copy, for the integer grid's fast spelling alone (integer_code and
// dequantize_code with kFinite, below): q is RN(x / s), its sign included, wherever the
// division is exact; a tiny q, whatever its sign, rounds to a zero, which the range keeps (it
// holds 0) and the grid makes +0 ((q + 0) * s, or q + zp): the same bits and mask either way.
template <bool kSigned = true>
C10_HOST_DEVICE inline float quotient_of(float x, const Divisor& d) {
  const float q0 = fma_rn(x, d.y, mul_rn(x, d.y_lo));
  const float q = fma_rn(-fma_rn(q0, d.s, -x), d.y, q0);
  return kSigned ? copy_sign(q, x) : q;
}

// --- validity of parameter values ----------------------------------------------------------
// The CPU always checks values before it runs (value_checks.h raises with these
// rules); the builders below turn an invalid parameter into NaN constants.

C10_HOST_DEVICE inline bool valid_scale(float s) { return s > 0.0f && s < INFINITY; }
C10_HOST_DEVICE inline bool valid_zero_point(double zp, int64_t quant_min, int64_t quant_max) {
  return zp == round_half_even(zp) && zp >= static_cast<double>(quant_min) &&
         zp <= static_cast<double>(quant_max);
}
C10_HOST_DEVICE inline bool valid_amax(float a) { return a >= 0.0f && a < INFINITY; }
// min_max's scale, (max_range - min_range) / levels in float32, and its validity.
C10_HOST_DEVICE inline float min_max_step(float min_range, float max_range, float levels) {
  return div_rn(sub_rn(max_range, min_range), levels);
}
C10_HOST_DEVICE inline bool valid_min_max_step(float step) { return step > 0.0f && step < INFINITY; }

// --- parameters as stored ---------------------------------------------------------------------

// A contiguous parameter tensor read in its own dtype (on the host for CPU
// tensors, on the device for CUDA tensors), so that no conversion runs first.
enum class ParamType : int8_t { kFloat, kDouble, kHalf, kBFloat16, kUInt8, kInt8, kInt16, kInt32, kInt64 };

struct ParamPtr {
  const void* data;
  ParamType type;

  // The value as `.to(at::kDouble)` gives it (exact for every type here but
  // int64 beyond 2^53, which rounds to nearest as that conversion does).
  C10_HOST_DEVICE double as_double(int64_t i) const {
    switch (type) {
      case ParamType::kFloat: return static_cast<const float*>(data)[i];
      case ParamType::kDouble: return static_cast<const double*>(data)[i];
      case ParamType::kHalf: return static_cast<float>(static_cast<const c10::Half*>(data)[i]);
      case ParamType::kBFloat16:
        return static_cast<float>(static_cast<const c10::BFloat16*>(data)[i]);
      case ParamType::kUInt8: return static_cast<const uint8_t*>(data)[i];
      case ParamType::kInt8: return static_cast<const int8_t*>(data)[i];
      case ParamType::kInt16: return static_cast<const int16_t*>(data)[i];
      case ParamType::kInt32: return static_cast<const int32_t*>(data)[i];
      default: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    }
  }
  // The value as `.to(at::kFloat)` gives it (float64 rounds to nearest even).
  C10_HOST_DEVICE float as_float(int64_t i) const {
    switch (type) {
      case ParamType::kFloat: return static_cast<const float*>(data)[i];
      case ParamType::kHalf: return static_cast<float>(static_cast<const c10::Half*>(data)[i]);
      case ParamType::kBFloat16:
        return static_cast<float>(static_cast<const c10::BFloat16*>(data)[i]);
      default: return to_float_rn(as_double(i));
    }
  }
};

// --- the constants of one parameter ---------------------------------------------------------

// lo/hi bound rint(x / scale) (the quantization range less the zero point), or
// x / scale for the FP8 grids (+-max of the format); the mask window is
// [window_lo, window_hi] of x where the mask is the input window. Eight members,
// so that a CUDA table entry is two (float) or four (double) 128-bit loads; the last
// two keep the scale's Divisor where a table holds it (with_divisor: y and y_lo, y = 0
// where the scale is not fast), else 0.
template <typename C>
struct alignas(8 * sizeof(C)) Consts {
  C scale, lo, hi, zero_point, window_lo, window_hi, inverse, inverse_lo;
};

// A float32 entry with its scale's Divisor (contract's division, above) made once, for
// tables that many elements read (the CUDA per-channel kernels); divisor_of reads it back.
// An invalid entry (NaN scale) is not fast.
C10_HOST_DEVICE inline Consts<float> with_divisor(const Consts<float>& entry) {
  Consts<float> c = entry;
  const Divisor d = make_divisor(c.scale);
  c.inverse = d.fast ? d.y : 0.0f;  // a fast y is at least 2^-60
  c.inverse_lo = d.y_lo;
  return c;
}
C10_HOST_DEVICE inline Consts<double> with_divisor(const Consts<double>& c) { return c; }
C10_HOST_DEVICE inline Divisor divisor_of(const Consts<float>& c) {
  return Divisor{c.scale, c.inverse, c.inverse_lo, c.inverse != 0.0f};
}

// An invalid parameter: NaN outputs and mask 0 (every comparison with NaN is false).
template <typename C>
C10_HOST_DEVICE inline Consts<C> invalid_consts() {
  const C nan = std::numeric_limits<C>::quiet_NaN();
  return Consts<C>{nan, nan, nan, nan, nan, nan, C(0), C(0)};
}

// What the quantize rule returns, whatever the Format (float_formats.h): the value
// dequantized, (q - zp) * scale or fmt(clamp(x / scale, lo, hi)) * scale for a small
// float format fmt (fake quantization), or the integer q itself (the kInt format
// only: quantize_amax).
enum class Output { kFake, kInteger };
// The mask: rint(x / scale) unclamped in [lo, hi], x in [window_lo, window_hi], or |x| <=
// window_hi where window_lo = -window_hi (kSymmetricInput: the same bits in one comparison).
enum class Window { kQuantRange, kInput, kSymmetricInput };

// The mask of the input windows.
template <Window W, typename C>
C10_HOST_DEVICE inline bool in_window(C xv, C wlo, C whi) {
  if constexpr (W == Window::kSymmetricInput) {
    return abs_value(xv) <= whi;
  } else {
    return (xv >= wlo) & (xv <= whi);
  }
}
// What the op returns beside y: a packed mask (one bit per element in memory
// order), a bool mask shaped like y, or none (fake_quantize_lsq's forward).
enum class MaskOut { kPacked, kBool, kNone };

// The small float F's constants (float_formats.h; F is not kInt). (Device code
// may not refer to namespace-scope objects such as kE4M3 at run time, so the
// formats are copied into constexpr locals first.)
template <Format F>
C10_HOST_DEVICE constexpr FloatFormat float_format_of() {
  return F == Format::kE2M1   ? kE2M1
         : F == Format::kE3M2 ? kE3M2
         : F == Format::kE2M3 ? kE2M3
         : F == Format::kE4M3 ? kE4M3
                              : kE5M2;
}
static_assert(float_format_of<Format::kE2M1>().format == Format::kE2M1 &&
                  float_format_of<Format::kE3M2>().format == Format::kE3M2 &&
                  float_format_of<Format::kE2M3>().format == Format::kE2M3 &&
                  float_format_of<Format::kE4M3>().format == Format::kE4M3 &&
                  float_format_of<Format::kE5M2>().format == Format::kE5M2,
              "float_format_of names every small float by its own Format");

// --- the op families: parameter i -> its constants ----------------------------------------

// fake_quantize_affine (and LSQ): scale and zero point given.
struct AffineFamily {
  static constexpr Window kWindow = Window::kQuantRange;
  ParamPtr scale, zero_point;
  int64_t quant_min, quant_max;

  template <typename C>
  C10_HOST_DEVICE Consts<C> make(int64_t i) const {
    const float s = scale.as_float(i);
    const double z = zero_point.as_double(i);
    if (!(valid_scale(s) && valid_zero_point(z, quant_min, quant_max))) {
      return invalid_consts<C>();
    }
    const auto zi = static_cast<int64_t>(z);
    Consts<C> c{};
    c.scale = static_cast<C>(s);
    c.lo = integer_bound<C>(quant_min - zi, /*up=*/true);
    c.hi = integer_bound<C>(quant_max - zi, /*up=*/false);
    c.zero_point = static_cast<C>(zi);
    return c;
  }
};

// fake_quantize_min_max: scale = (max_range - min_range) / levels, the range
// starting at the integer min_range maps to; mask min_range <= x <= max_range.
struct MinMaxFamily {
  static constexpr Window kWindow = Window::kInput;
  ParamPtr min_range, max_range;
  float levels;  // min_max_levels(num_bits)

  template <typename C>
  C10_HOST_DEVICE Consts<C> make(int64_t i) const {
    const float mn = min_range.as_float(i);
    const float mx = max_range.as_float(i);
    const float step = min_max_step(mn, mx, levels);
    if (!valid_min_max_step(step)) return invalid_consts<C>();
    const float first = round_half_even(div_rn(mn, step));  // the integer min_range maps to
    Consts<C> c{};
    c.scale = static_cast<C>(step);
    c.lo = static_cast<C>(first);
    c.hi = static_cast<C>(add_rn(first, levels));
    c.window_lo = static_cast<C>(mn);
    c.window_hi = static_cast<C>(mx);
    return c;
  }
};

// The amax family (fake_quantize_amax, quantize_amax, fake_quantize_fp8):
// scale = amax / bound, range [quant_min, bound] of rint(x / scale) (integers,
// exact in float) or of x / scale (FP8: +-max of the format); mask |x| <= amax;
// amax <= kAmaxEpsilon quantizes everything to 0 (range [0, 0]; the scale
// kZeroAmaxScale, which the values and masks do not depend on).
struct AmaxFamily {
  static constexpr Window kWindow = Window::kSymmetricInput;  // [-amax, amax]
  ParamPtr amax;
  float bound, quant_min;

  template <typename C>
  C10_HOST_DEVICE Consts<C> make(int64_t i) const {
    const float a = amax.as_float(i);
    if (!valid_amax(a)) return invalid_consts<C>();
    const bool zero = a <= kAmaxEpsilon;
    Consts<C> c{};
    c.scale = zero ? C(kZeroAmaxScale) : static_cast<C>(div_rn(a, bound));
    c.lo = zero ? C(0) : static_cast<C>(quant_min);
    c.hi = zero ? C(0) : static_cast<C>(bound);
    c.zero_point = C(0);
    c.window_lo = -static_cast<C>(a);
    c.window_hi = static_cast<C>(a);
    return c;
  }
};

// round_to_format for the small float F, as the CUDA kernels compute it: on GPUs with FP8
// conversions (compute capability 8.9 on), E4M3 and E5M2 by the conversion instruction
// (cvt.rn.satfinite, through cuda_fp8.h) and back through float16, both exact where they
// agree: nearest, ties to even, a value beyond +-max to +-max, NaN to NaN, a zero keeping
// its sign. tests/fp8_check.cpp compares NVIDIA's host implementation of the conversion
// with round_to_format (every float32 in `make slow`); the other formats, and every other
// device, take round_to_format. kInside: |v| is below the format's saturation limit, where
// round_to_format_grid gives round_to_format's value without the saturation's instructions.
template <Format F, bool kInside = false>
C10_HOST_DEVICE inline float round_to_small_float(float v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (F == Format::kE4M3 || F == Format::kE5M2) {
    constexpr __nv_fp8_interpretation_t kind = F == Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kind), kind)));
  }
#endif
  return kInside ? round_to_format_grid(v, float_format_of<F>()) : round_to_format(v, float_format_of<F>());
}

// --- the quantize rule ------------------------------------------------------------------------

// One element x (in the compute type) with its parameter's constants: returns
// y and sets m to the mask bit (0 or 1). The constants come one by one so that
// the CPU loops can keep them in separate arrays (vectorised loads).
// From the quotient xs = x / s (correctly rounded, or contract's quotient_of), for kernels
// that form it in their own way.
// The integer grid's code of a quotient xs: r = rint(xs) clamped to [lo, hi], whether r
// was inside, and the code dequantized, (q + 0) * s: + 0.0 so that q = -0.0 (x in
// (-s/2, 0)) dequantizes to +0.0, as in ONNX Runtime.
//
// kFinite: the same bits in fewer operations where lo and hi are finite and xs is not NaN
// (the kernels' fast division: a fast Divisor, whose scale is valid, and fast dividends;
// an invalid parameter's NaN scale is never fast), or, for the fake output, where s is NaN
// too (an E8M0 block holding NaN: its scale is NaN). Without NaN, clamp_nan is min/max up to
// the sign of a zero r, r is inside exactly when the clamp leaves it alone (q == r, +0 ==
// -0 included; infinities too), and fma(q, s, +0) rounds q * s + 0 once: RN(q * s), except
// that an exact -0 becomes +0, which is (q + 0) * s. The one place q's zero sign could show
// is the integer output q + zp, where zp is an integer, +0 when zero: -0 + zp == +0 + zp.
// With xs and s NaN, both give NaN and mask 0. tests/divisor_check.cpp compares both spellings.
// (q returned, the mask bit through `inside`, not both in a struct: GCC does not vectorize the
// CPU loops over a {float, bool} result, whose halves it packs into one 64-bit register.)
template <bool kFinite, typename C, typename M>
C10_HOST_DEVICE inline C integer_code(C xs, C lo, C hi, M& inside) {
  const C r = round_half_even(xs);
  if constexpr (kFinite && std::is_same_v<C, float>) {
    const C q = min_value(max_value(r, lo), hi);
    inside = static_cast<M>(q == r);
    return q;
  } else {
    inside = static_cast<M>((r >= lo) & (r <= hi));
    return clamp_nan(r, lo, hi);
  }
}

template <bool kFinite, typename C>
C10_HOST_DEVICE inline C dequantize_code(C q, C s) {
  if constexpr (kFinite && std::is_same_v<C, float>) {
    return fma_rn(q, s, 0.0f);
  } else {
    return mul_rn(add_rn(q, C(0)), s);
  }
}

template <Format F, Output O, Window W, bool kFinite = false, typename C, typename M>
C10_HOST_DEVICE inline C quantize_value_of_quotient(C xv, C xs, C s, C lo, C hi, C zp, C wlo, C whi, M& m) {
  if constexpr (F != Format::kInt) {
    static_assert(W != Window::kQuantRange, "the FP8/FP6 mask is the input window |x| <= amax");
    static_assert(O == Output::kFake, "a float format has no integer output");
    // kFinite (the fast division): lo and hi are the format's -max and max (float formats
    // come with the amax family alone, fake_quantize_fp8, whose other range, the zero case's
    // [0, 0], is never fast: kZeroAmaxScale), and round_to_small_float saturates to them
    // itself (round_to_format clamps first; the FP8 conversion instruction is satfinite), so
    // the clamp would change nothing.
    const C c = kFinite ? xs : clamp_nan(xs, lo, hi);
    m = static_cast<M>(in_window<W>(xv, wlo, whi));
    // float64 goes through float32 first, as torch's double -> float8 cast does;
    // a zero keeps its sign (see the top of this file).
    return mul_rn(static_cast<C>(round_to_small_float<F>(to_float_rn(c))), s);
  } else {
    M inside;
    const C q = integer_code<kFinite>(xs, lo, hi, inside);
    m = W == Window::kQuantRange ? inside : static_cast<M>(in_window<W>(xv, wlo, whi));
    return O == Output::kFake ? dequantize_code<kFinite>(q, s) : add_rn(q, zp);
  }
}

template <Format F, Output O, Window W, typename C, typename M>
C10_HOST_DEVICE inline C quantize_value(C xv, C s, C lo, C hi, C zp, C wlo, C whi, M& m) {
  return quantize_value_of_quotient<F, O, W>(xv, div_rn(xv, s), s, lo, hi, zp, wlo, whi, m);
}

template <Format F, Output O, Window W, typename C, typename M>
C10_HOST_DEVICE inline C quantize_value(C xv, const Consts<C>& p, M& m) {
  return quantize_value<F, O, W>(xv, p.scale, p.lo, p.hi, p.zero_point, p.window_lo, p.window_hi, m);
}

// --- block-wise ---------------------------------------------------------------------------------

// The mask of a float element: |x / s| at most this, i.e. x / s rounds to the format
// without saturating: max + half the top step 2^(max_exponent - mantissa_bits), exact
// in float32. (At the tie itself E4M3 rounds down to max, the others up, which the
// mask ignores.)
constexpr float saturation_limit(FloatFormat f) {
  float half_step = 1.0f;
  for (int e = f.max_exponent - f.mantissa_bits - 1; e > 0; --e) half_step *= 2.0f;
  for (int e = f.max_exponent - f.mantissa_bits - 1; e < 0; ++e) half_step *= 0.5f;
  return f.max + half_step;
}
static_assert(saturation_limit(kE4M3) == 464.0f && saturation_limit(kE5M2) == 61440.0f &&
                  saturation_limit(kE2M1) == 7.0f && saturation_limit(kE3M2) == 30.0f &&
                  saturation_limit(kE2M3) == 7.75f,
              "max + half the top step");

// Blocks tile memory without gaps, walked as rows of row_len elements:
// row_len = block_size when it divides the last dimension (one block per row),
// else the last dimension (ceil(L / block_size) blocks, the last one shorter).
struct BlockGeometry {
  int64_t row_len;         // R
  int64_t block_size;      // full blocks; <= R unless one block covers a whole row
  int64_t blocks_per_row;  // ceil(R / block_size)
  int64_t last_len;        // length of a row's last block
};

C10_HOST_DEVICE inline BlockGeometry block_geometry(int64_t last_dim, int64_t block_size) {
  BlockGeometry geo{};
  if (last_dim % block_size == 0) {
    geo.row_len = block_size;
    geo.block_size = block_size;
    geo.blocks_per_row = 1;
    geo.last_len = block_size;
  } else {
    geo.row_len = last_dim;
    geo.block_size = block_size < last_dim ? block_size : last_dim;
    geo.blocks_per_row = (last_dim + block_size - 1) / block_size;
    geo.last_len = last_dim - (geo.blocks_per_row - 1) * geo.block_size;
  }
  return geo;
}

// The element rule's constants of one call.
template <typename C>
struct BlockRule {
  C quant_min, quant_max;  // integer elements: the clamp range of rint(x / s)
  C float_limit;           // float elements: the largest |x / s| not saturated
};

// How a block's scale comes from its amax: amax / elem_max in float32 (one level),
// that rounded to E4M3 against a per-tensor scale (two levels, NVFP4), or a power
// of two (E8M0, the OCP microscaling formats).
enum class BlockScale : int { kFloat32, kE4M3, kE8M0 };

// The block-scale rule of one call.
struct BlockScaleRule {
  BlockScale kind;
  float elem_max;      // kFloat32/kE4M3: the largest element magnitude (integer bound or format max)
  int32_t scale_emax;  // kE8M0: the element's largest exponent (emax of the MX specification)
};

// The E8M0 scale of a block (OCP Microscaling Formats v1.0, section 6.3): 2^(floor(log2
// amax) - emax), the exponent clamped to E8M0's [-127, 127]; NaN for an amax that is
// NaN or infinite (E8M0's NaN). floor(log2 amax) is the exponent field of a normal
// float32; a zero or subnormal amax gives an exponent below -126 - emax, clamped to
// -127. 2^-127 is a float32 subnormal: built from its bit pattern.
C10_HOST_DEVICE inline float e8m0_scale(float amax, int32_t emax) {
  const uint32_t field = float_to_bits(amax) >> 23;  // amax >= 0 (or NaN: field 255 or 511)
  if ((field & 0xffu) == 0xffu) return std::numeric_limits<float>::quiet_NaN();
  int32_t e = static_cast<int32_t>(field & 0xffu) - 127;  // -127 for zero and subnormals
  e -= emax;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return bits_to_float(e == -127 ? 0x00400000u : static_cast<uint32_t>(e + 127) << 23);
}

// The per-tensor scale of the block scales (two-level, NVFP4): scale_amax /
// (elem_max * 448), elem_max * 448 exact in float32; NaN for an invalid
// scale_amax, which then makes every output NaN.
C10_HOST_DEVICE inline float blockwise_global_scale(float scale_amax, float elem_max) {
  constexpr float kScaleMax = kE4M3.max;
  if (!valid_amax(scale_amax)) return std::numeric_limits<float>::quiet_NaN();
  return div_rn(scale_amax, mul_rn(elem_max, kScaleMax));
}

// A block's amax in float32: the largest bit pattern of |fp32(x)| (NaN
// propagates: NaN's patterns exceed inf's).
C10_HOST_DEVICE inline uint32_t abs_bits(float v) { return float_to_bits(v) & 0x7fffffffu; }

// The scale of a block with amax `amax` (float32). One level: amax / elem_max.
// Two levels: that scale rounded to E4M3 against the per-tensor scale g. E8M0:
// e8m0_scale.
//
// The divisions by elem_max and g: div_rn (D = float), or quotient_of with Divisors of them
// made once (D = Divisor: the CUDA vector kernels), which give the same scale for every block
// that is not degenerate, with amax <= 2^60 (fast_dividend), where both Divisors are fast:
// amax > kAmaxEpsilon = 2^-24 and elem_max <= 57344 < 2^16 put amax / elem_max in
// [2^-40, 2^60], a normal quotient of a dividend >= 2^-100, which quotient_of rounds
// correctly; that over g (fast: in [2^-60, 2^60]) is at most 2^120, correctly rounded where
// it is a normal float, and where it is not, both quotients are below 2^-39, which E4M3
// rounds to +0: the scale is 0 either way, and the block degenerate (blockwise_degenerate).
// E4M3 rounding by round_to_small_float: the conversion instruction where a GPU has one.
C10_HOST_DEVICE inline float divide_by(float x, float d) { return div_rn(x, d); }
C10_HOST_DEVICE inline float divide_by(float x, const Divisor& d) { return quotient_of(x, d); }
C10_HOST_DEVICE inline float value_of(float d) { return d; }
C10_HOST_DEVICE inline float value_of(const Divisor& d) { return d.s; }

template <BlockScale K, typename D>
C10_HOST_DEVICE inline float blockwise_scale(float amax, const BlockScaleRule& r, const D& elem_max, const D& g) {
  if constexpr (K == BlockScale::kE8M0) {
    return e8m0_scale(amax, r.scale_emax);
  } else {
    const float s = divide_by(amax, elem_max);
    return K == BlockScale::kE4M3 ? mul_rn(round_to_small_float<Format::kE4M3>(divide_by(s, g)), value_of(g)) : s;
  }
}

template <BlockScale K>
C10_HOST_DEVICE inline float blockwise_scale(float amax, const BlockScaleRule& r, float g) {
  return blockwise_scale<K>(amax, r, r.elem_max, g);
}

C10_HOST_DEVICE inline float blockwise_scale(float amax, const BlockScaleRule& r, float g) {
  switch (r.kind) {
    case BlockScale::kE8M0: return blockwise_scale<BlockScale::kE8M0>(amax, r, g);
    case BlockScale::kE4M3: return blockwise_scale<BlockScale::kE4M3>(amax, r, g);
    default: return blockwise_scale<BlockScale::kFloat32>(amax, r, g);
  }
}

// Whether a block is degenerate: its outputs are 0 (NaN staying NaN). g is 1
// for one-level scales; a NaN g (an invalid scale_amax on CUDA with value
// checks off) makes no block degenerate, so every output is NaN. E8M0 blocks
// follow the MX specification instead: never degenerate (an all-zero block has
// the scale 2^-127 and quantizes to zeros; a tiny amax keeps its values).
C10_HOST_DEVICE inline bool blockwise_degenerate(float amax, float s, float g, BlockScale kind) {
  return (kind != BlockScale::kE8M0) & (g == g) & ((amax <= kAmaxEpsilon) | (s == 0.0f) | (g <= 0.0f));
}

// --- centered blocks (per-token asymmetric: Model Optimizer's dynamic "max_min" bias) ---
// A centered block is quantized about its centre b = max / 2 + min / 2 (float32):
// y = q(x - b) + b, with the block's amax that of x - b. Its min and max come from
// order keys (unsigned integers ordered as the floats; NaN with a clear sign bit
// above +inf): the max key of x is the max, the max key of -x the negated min, so a
// NaN anywhere makes one of them NaN and the block's centre NaN.
C10_HOST_DEVICE inline uint32_t order_key(float v) {
  const uint32_t b = float_to_bits(v);
  return b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
}
C10_HOST_DEVICE inline float from_order_key(uint32_t k) {
  return bits_to_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}

struct Centered {
  float center, amax;
};

// From the max key of x and the max key of -x: the centre, and the amax of x - b as the
// element rule computes x - b in float32 (the block's extremes give the largest |x - b|).
C10_HOST_DEVICE inline Centered centered_block(uint32_t max_key, uint32_t neg_max_key) {
  const float mx = from_order_key(max_key), mn = -from_order_key(neg_max_key);
  const float b = add_rn(mul_rn(mx, 0.5f), mul_rn(mn, 0.5f));
  const float hi = sub_rn(mx, b), lo = sub_rn(b, mn);
  // NaN in, or +-inf at both ends (b = -inf: b - mn = -inf - -inf): the amax is NaN.
  return Centered{b, (hi < lo) | (lo != lo) ? lo : hi};
}

// An element of a degenerate block: +0, NaN staying NaN; the mask marks numbers.
template <typename C, typename M>
C10_HOST_DEVICE inline C degenerate_value(C xv, M& m) {
  const bool number = xv == xv;
  m = static_cast<M>(number);
  return number ? C(0) : xv;
}

// An element of a block with scale s. The mask marks elements rounding did not
// saturate: rint(x / s) within [quant_min, quant_max], or |x / s| within the
// format's limit. Integers give +0.0 for q = -0.0; float elements keep the sign.
// From the quotient xs = x / s (correctly rounded), for kernels that form it in
// their own way (e8m0_quotient).
//
// kInside (float formats): the caller knows |xs| < rule.float_limit, the format's saturation
// limit, for the whole block (the vector kernels: RN(amax / s) below it, which bounds every
// element's quotient, correct rounding being monotonic): the mask bit is 1 and the rounding
// needs no saturation (round_to_small_float's kInside).
template <Format F, bool kFinite = false, bool kInside = false, typename C, typename M>
C10_HOST_DEVICE inline C blockwise_value_of_quotient(C xs, C s, const BlockRule<C>& rule, M& m) {
  if constexpr (F == Format::kInt) {
    static_assert(!kInside, "integer blocks have no saturation limit");
    return dequantize_code<kFinite>(integer_code<kFinite>(xs, rule.quant_min, rule.quant_max, m), s);
  } else if constexpr (kInside) {
    m = static_cast<M>(1);
    return mul_rn(static_cast<C>(round_to_small_float<F, true>(to_float_rn(xs))), s);
  } else {
    m = static_cast<M>(abs_value(xs) <= rule.float_limit);
    return mul_rn(static_cast<C>(round_to_small_float<F>(to_float_rn(xs))), s);
  }
}

// blockwise_value_of_quotient's kInside value (mask bit 1) of x from q = x / s computed
// without x's sign (quotient_of<false>): RN(x / s) but where it is tiny, which rounds to a
// zero, whose sign is x's (round_to_format_grid's `sign`). For the formats rounded by bit
// arithmetic on every device: E4M3 and E5M2 take a conversion instruction where a GPU has one,
// which keeps q's sign.
template <Format F>
C10_HOST_DEVICE inline float blockwise_inside_value(float q, float x, float s) {
  static_assert(F != Format::kInt && F != Format::kE4M3 && F != Format::kE5M2, "a format rounded in bit arithmetic");
  return mul_rn(round_to_format_grid(q, float_format_of<F>(), x), s);
}

template <Format F, typename C, typename M>
C10_HOST_DEVICE inline C blockwise_value(C xv, C s, const BlockRule<C>& rule, M& m) {
  return blockwise_value_of_quotient<F>(div_rn(xv, s), s, rule, m);
}

// x / s for an E8M0 scale s (a power of two, 2^-127 to 2^127, or NaN) as the product
// x * inverse, inverse = 1 / s (exact: 2^127 to 2^-127, or NaN): both are the exact value
// x * 2^-k rounded once, so they are the same float (an underflow to a subnormal or to
// zero, an overflow, a signed zero and NaN included), at the cost of one multiply.
C10_HOST_DEVICE inline float e8m0_inverse(float s) { return div_rn(1.0f, s); }
template <typename C>
C10_HOST_DEVICE inline C e8m0_quotient(C xv, C inverse) { return mul_rn(xv, inverse); }

// --- LSQ ------------------------------------------------------------------------------------------

// The LSQ/LSQ+ gradient terms of one element: with v = x / s, r = rint(v) and
// inside = lo <= r <= hi,
//   d = inside ? r - v : clamp(r, lo, hi)   (grad * d sums into grad_scale),
//   z = inside ? 0 : 1                      (grad * z sums into grad_zero_point, times -s),
// and grad_input = grad where inside, else +0. A NaN x makes d and z NaN (as NaN
// makes the sums NaN in plain PyTorch); its grad_input is 0.
template <typename C>
struct LsqTerms {
  C d, z;
  bool inside;
};

template <typename C>
C10_HOST_DEVICE inline LsqTerms<C> lsq_terms(C xv, C s, C lo, C hi) {
  const C v = div_rn(xv, s);
  const C r = round_half_even(v);
  const bool inside = (r >= lo) & (r <= hi);
  const C q = clamp_nan(r, lo, hi);
  return LsqTerms<C>{inside ? sub_rn(r, v) : q, inside ? C(0) : (r == r ? C(1) : r), inside};
}

// grad * term in float64, the summand of both sums.
template <typename C>
C10_HOST_DEVICE inline double lsq_summand(C grad, C term) {
  return mul_rn(static_cast<double>(grad), static_cast<double>(term));
}

// The final gradients from a channel's sums: grad_factor * sum_d and
// grad_factor * (-s * sum_z), rounded to float32.
C10_HOST_DEVICE inline float lsq_grad_scale(double grad_factor, double sum_d) {
  return to_float_rn(mul_rn(grad_factor, sum_d));
}
C10_HOST_DEVICE inline float lsq_grad_zero_point(double grad_factor, float scale, double sum_z) {
  return to_float_rn(mul_rn(grad_factor, mul_rn(-static_cast<double>(scale), sum_z)));
}

// --- the moving-average min/max observer (fused_moving_avg_obs_fake_quant) -----------------------
// torch's rules, float for float as torch computes them: the running statistic
// starts at the first batch's (while it is infinite) and then moves toward each
// batch's by averaging_const; the scale and zero point come from the running
// [min, max] widened to hold 0, as ChooseQuantizationParams (fbgemm, the
// fused op's CPU path) chooses them, symmetric = its preserve_sparsity.

C10_HOST_DEVICE inline float moving_average(float running, float current, float averaging_const) {
  const bool first = (running == INFINITY) | (running == -INFINITY);
  return first ? current : add_rn(running, mul_rn(averaging_const, sub_rn(current, running)));
}

// Below this a chosen scale is raised to it, the range widened to match (torch's
// SMALL_SCALE_THRESHOLD, float16's smallest normal rounded).
constexpr float kSmallScale = 6.1e-5f;

struct MinMaxQParams {
  float scale;
  int32_t zero_point;
};

// NaN in min or max gives a NaN scale (torch raises there: a value check needing
// a sync); the quantize rule turns it into NaN outputs and mask 0.
C10_HOST_DEVICE inline MinMaxQParams min_max_qparams(float min, float max, int64_t quant_min,
                                                     int64_t quant_max, bool symmetric) {
  const int64_t qmin = quant_min, qmax = quant_max;
  if (min < 0.0f && max > 0.0f && symmetric) {
    const int64_t sym_qmin = -((qmax - qmin) / 2 + 1);
    const int64_t sym_qmax = (qmax - qmin) / 2;
    const float a = abs_value(div_rn(min, static_cast<float>(sym_qmin)));
    const float b = abs_value(div_rn(max, static_cast<float>(sym_qmax)));
    const double max_scale = static_cast<double>(a < b ? b : a);
    min = static_cast<float>(mul_rn(max_scale, static_cast<double>(sym_qmin)));
    max = static_cast<float>(mul_rn(max_scale, static_cast<double>(sym_qmax)));
  }
  min = 0.0f < min ? 0.0f : min;  // NaN stays
  max = max < 0.0f ? 0.0f : max;
  double scale = div_rn(sub_rn(static_cast<double>(max), static_cast<double>(min)),
                        static_cast<double>(qmax - qmin));
  const float scale32 = static_cast<float>(scale);
  const float inverse = div_rn(1.0f, scale32);
  if (scale32 == 0.0f || inverse == INFINITY || inverse == -INFINITY) scale = 0.1;
  if (scale < static_cast<double>(kSmallScale)) {
    const float original = static_cast<float>(scale);
    scale = kSmallScale;
    const float width = static_cast<float>(qmax - qmin);
    if (min == 0.0f) {
      max = mul_rn(kSmallScale, width);
    } else if (max == 0.0f) {
      min = mul_rn(-kSmallScale, width);
    } else {
      const float amplifier = div_rn(kSmallScale, original);
      min = mul_rn(min, amplifier);
      max = mul_rn(max, amplifier);
    }
  }
  const double from_min = sub_rn(static_cast<double>(qmin), div_rn(static_cast<double>(min), scale));
  const double from_max = sub_rn(static_cast<double>(qmax), div_rn(static_cast<double>(max), scale));
  const double error_min = sub_rn(static_cast<double>(qmin < 0 ? -qmin : qmin),
                                  abs_value(div_rn(static_cast<double>(min), scale)));
  const double error_max = sub_rn(static_cast<double>(qmax < 0 ? -qmax : qmax),
                                  abs_value(div_rn(static_cast<double>(max), scale)));
  double zero_point = error_min < error_max ? from_min : from_max;
  if (min < 0.0f && max > 0.0f && symmetric) {
    zero_point = div_rn(static_cast<double>(qmin + qmax), 2.0);
  }
  int32_t nudged = 0;
  if (zero_point < static_cast<double>(qmin)) {
    nudged = static_cast<int32_t>(qmin);
  } else if (zero_point > static_cast<double>(qmax)) {
    nudged = static_cast<int32_t>(qmax);
  } else if (zero_point == zero_point) {
    nudged = static_cast<int32_t>(round_half_even(zero_point));
  }
  return MinMaxQParams{static_cast<float>(scale), nudged};
}

// Channel i of the fused observer: the running range moved toward the batch's
// (where observe; x_min/x_max may then be null), then the qparams chosen from it
// (where quantize), as torch's fused op updates its buffers.
C10_HOST_DEVICE inline void observe_channel(int64_t i, const float* x_min, const float* x_max,
                                            float* running_min, float* running_max, float* scale,
                                            int32_t* zero_point, bool observe, bool quantize,
                                            float averaging_const, int64_t quant_min,
                                            int64_t quant_max, bool symmetric) {
  if (observe) {
    running_min[i] = moving_average(running_min[i], x_min[i], averaging_const);
    running_max[i] = moving_average(running_max[i], x_max[i], averaging_const);
  }
  if (quantize) {
    const MinMaxQParams q = min_max_qparams(running_min[i], running_max[i], quant_min, quant_max, symmetric);
    scale[i] = q.scale;
    zero_point[i] = q.zero_point;
  }
}

// --- backward and mask layout -----------------------------------------------------------------

// grad where m (0 or 1), else +0: selected on bit patterns (grad & -m), so that a
// NaN gradient is masked to +0 too.
template <typename bits_t>
C10_HOST_DEVICE inline bits_t select_bits(bits_t g, unsigned m) {
  return g & static_cast<bits_t>(bits_t(0) - static_cast<bits_t>(m));
}

// A packed mask holds element e (in memory order) at bit e % 8 of byte e / 8.
C10_HOST_DEVICE constexpr int64_t packed_mask_bytes(int64_t numel) { return (numel + 7) / 8; }

}  // namespace fakequant
