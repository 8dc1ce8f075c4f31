// CPU kernels of the learned step size ops (LSQ, LSQ+). The forward is
// fake_quantize_affine's; the backward reads input and grad once, writes
// grad_input and sums the scale and zero-point gradients of each channel.
//
// The sums are deterministic whatever the number of threads: the elements are
// cut into blocks whose size depends only on the tensor's size and channel
// count, each block sums its elements in a fixed order into its own row of
// partial sums (float64), and the rows are added in block order at the end.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "../lsq_args.h"
#include "../quant_bounds.h"
#include "../value_checks.h"
#include "quantize_kernel.h"

namespace fakequant {
namespace cpu {
namespace {

template <typename scalar_t>
struct BitsOf;
template <> struct BitsOf<double> { using type = uint64_t; };
template <> struct BitsOf<float> { using type = uint32_t; };
template <> struct BitsOf<c10::Half> { using type = uint16_t; };
template <> struct BitsOf<c10::BFloat16> { using type = uint16_t; };

// One element: with v = x / s, r = rint(v), inside = lo <= r <= hi,
//   grad_input = grad where inside else +0 (selected on bits: a NaN grad outside gives 0),
//   ts = grad * (inside ? r - v : clamp(r, lo, hi)), the scale term,
//   tz = grad * (inside ? 0 : 1), the zero-point term before the factor -s.
// A NaN x (r NaN, not inside, the clamp passing NaN through) makes both terms
// NaN, as NaN makes the sums NaN in plain PyTorch; its grad_input is 0.
template <typename scalar_t, typename C>
inline void lsq_element(const scalar_t* __restrict__ x, const scalar_t* __restrict__ g,
                        typename BitsOf<scalar_t>::type* __restrict__ gi, double* __restrict__ ts,
                        double* __restrict__ tz, int64_t k, C s, C lo, C hi) {
  using bits_t = typename BitsOf<scalar_t>::type;
  const C v = static_cast<C>(x[k]) / s;
  const C r = round_half_even(v);
  const bool inside = (r >= lo) & (r <= hi);
  const C q = r < lo ? lo : (r > hi ? hi : r);
  const C d = inside ? r - v : q;
  const C z = inside ? C(0) : (r == r ? C(1) : r);
  const double gd = static_cast<double>(static_cast<C>(g[k]));
  ts[k] = gd * static_cast<double>(d);
  tz[k] = gd * static_cast<double>(z);
  bits_t gb;
  std::memcpy(&gb, g + k, sizeof(bits_t));
  gi[k] = gb & static_cast<bits_t>(bits_t(0) - static_cast<bits_t>(inside));
}

// A run of elements of one channel.
template <typename scalar_t, typename C>
FAKEQUANT_CPU_CLONES void lsq_uniform(const scalar_t* __restrict__ x, const scalar_t* __restrict__ g,
                                      typename BitsOf<scalar_t>::type* __restrict__ gi,
                                      double* __restrict__ ts, double* __restrict__ tz, int64_t n,
                                      C s, C lo, C hi) {
  for (int64_t k = 0; k < n; ++k) lsq_element<scalar_t, C>(x, g, gi, ts, tz, k, s, lo, hi);
}

// A run whose channel changes with every element (channels innermost).
template <typename scalar_t, typename C>
FAKEQUANT_CPU_CLONES void lsq_varying(const scalar_t* __restrict__ x, const scalar_t* __restrict__ g,
                                      typename BitsOf<scalar_t>::type* __restrict__ gi,
                                      double* __restrict__ ts, double* __restrict__ tz, int64_t n,
                                      const C* __restrict__ s, const C* __restrict__ lo,
                                      const C* __restrict__ hi) {
  for (int64_t k = 0; k < n; ++k) lsq_element<scalar_t, C>(x, g, gi, ts, tz, k, s[k], lo[k], hi[k]);
}

// The sum of p[0..n) in an order fixed by this code alone (eight lanes, then a
// fixed tree), whatever vector width the clone that runs it has.
FAKEQUANT_CPU_CLONES double sum_lanes(const double* __restrict__ p, int64_t n) {
  typedef double lanes_t __attribute__((vector_size(8 * sizeof(double))));
  lanes_t acc = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    lanes_t v;
    std::memcpy(&v, p + k, sizeof(v));
    acc += v;
  }
  double tail = 0.0;
  for (; k < n; ++k) tail += p[k];
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

FAKEQUANT_CPU_CLONES void add_into(double* __restrict__ dst, const double* __restrict__ src,
                                   int64_t n) {
  for (int64_t k = 0; k < n; ++k) dst[k] += src[k];
}

// Per-channel constants in the compute type and the float32 scale.
template <typename C>
struct LsqParams {
  std::vector<C> scale, lo, hi;
  std::vector<float> scale32;
};

template <typename C>
LsqParams<C> make_lsq_params(const at::Tensor& scale, const at::Tensor& zero_point,
                             int64_t quant_min, int64_t quant_max) {
  const at::Tensor s = scale.to(at::kFloat).contiguous();
  const at::Tensor z = zero_point.to(at::kDouble).contiguous();  // exact for int32 values
  const int64_t n = s.numel();
  const float* sp = s.const_data_ptr<float>();
  const double* zp = z.const_data_ptr<double>();
  LsqParams<C> p;
  p.scale.resize(n);
  p.lo.resize(n);
  p.hi.resize(n);
  p.scale32.assign(sp, sp + n);
  for (int64_t i = 0; i < n; ++i) {
    const auto zpi = static_cast<int64_t>(zp[i]);
    p.scale[i] = static_cast<C>(sp[i]);
    p.lo[i] = integer_bound<C>(quant_min - zpi, /*up=*/true);
    p.hi[i] = integer_bound<C>(quant_max - zpi, /*up=*/false);
  }
  return p;
}

template <typename scalar_t>
void lsq_backward_loop(const at::Tensor& x, const at::Tensor& g, at::Tensor& gi,
                       const ChannelShape& shape, const LsqParams<compute_t<scalar_t>>& p,
                       double grad_factor, float* grad_scale, float* grad_zero_point) {
  using C = compute_t<scalar_t>;
  using bits_t = typename BitsOf<scalar_t>::type;
  const int64_t n = x.numel();
  const int64_t channels = shape.channels;
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* gp = g.const_data_ptr<scalar_t>();
  auto* op = static_cast<bits_t*>(gi.mutable_data_ptr());

  // Blocks of whole tiles, at least 64 elements per channel so that the
  // partial sums stay under a quarter of the input's size.
  const int64_t tiles_per_block = std::max<int64_t>(kTilesPerTask, (64 * channels + kTile - 1) / kTile);
  const int64_t block = tiles_per_block * kTile;
  const int64_t nblocks = (n + block - 1) / block;
  std::vector<double> partial(static_cast<size_t>(nblocks * 2 * channels));
  // Channels innermost (inner == 1, several channels): runs step through channels.
  const bool varying = shape.inner == 1 && channels > 1;
  const int64_t run = varying ? channels : shape.inner;

  at::parallel_for(0, nblocks, 1, [&](int64_t b0, int64_t b1) {
    alignas(64) double ts[kTile];
    alignas(64) double tz[kTile];
    for (int64_t b = b0; b < b1; ++b) {
      double* ps = partial.data() + b * 2 * channels;
      double* pz = ps + channels;
      std::fill(ps, ps + 2 * channels, 0.0);
      const int64_t end = std::min(n, (b + 1) * block);
      for (int64_t e0 = b * block; e0 < end; e0 += kTile) {
        const int64_t e1 = std::min(end, e0 + kTile);
        for (int64_t e = e0; e < e1;) {
          const int64_t row = e / run, col = e - row * run;
          const int64_t len = std::min(run - col, e1 - e);
          double* t_s = ts + (e - e0);
          double* t_z = tz + (e - e0);
          if (varying) {
            lsq_varying<scalar_t, C>(xp + e, gp + e, op + e, t_s, t_z, len, p.scale.data() + col,
                                     p.lo.data() + col, p.hi.data() + col);
            add_into(ps + col, t_s, len);
            add_into(pz + col, t_z, len);
          } else {
            const int64_t c = row % channels;
            lsq_uniform<scalar_t, C>(xp + e, gp + e, op + e, t_s, t_z, len, p.scale[c], p.lo[c],
                                     p.hi[c]);
            ps[c] += sum_lanes(t_s, len);
            pz[c] += sum_lanes(t_z, len);
          }
          e += len;
        }
      }
    }
  });

  for (int64_t c = 0; c < channels; ++c) {
    double sum_s = 0.0, sum_z = 0.0;
    for (int64_t b = 0; b < nblocks; ++b) {
      sum_s += partial[b * 2 * channels + c];
      sum_z += partial[b * 2 * channels + channels + c];
    }
    grad_scale[c] = static_cast<float>(grad_factor * sum_s);
    grad_zero_point[c] = static_cast<float>(grad_factor * (-static_cast<double>(p.scale32[c]) * sum_z));
  }
}

at::Tensor fake_quantize_lsq(const at::Tensor& input, const at::Tensor& scale,
                             const at::Tensor& zero_point, std::optional<int64_t> axis,
                             int64_t quant_min, int64_t quant_max, double grad_factor) {
  return lsq_forward(input, scale, zero_point, axis, quant_min, quant_max, grad_factor);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quantize_lsq_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale,
    const at::Tensor& zero_point, std::optional<int64_t> axis, int64_t quant_min,
    int64_t quant_max, double grad_factor) {
  const AffineArgs args = check_lsq_backward_args(grad, input, scale, zero_point, axis, quant_min,
                                                  quant_max, grad_factor);
  check_affine_values(scale, zero_point, quant_min, quant_max);
  // grad_input is laid out like input (as the forward's output), so that in
  // training neither input nor grad is copied.
  at::Tensor grad_input = at::empty_like(input);
  const at::Tensor x = dense_like(input, grad_input);
  const at::Tensor g = dense_like(grad, grad_input);
  at::Tensor grad_scale = at::empty(scale.sizes(), scale.options().dtype(at::kFloat));
  at::Tensor grad_zero_point = at::empty(zero_point.sizes(), zero_point.options().dtype(at::kFloat));
  if (input.numel() == 0) {
    grad_scale.zero_();
    grad_zero_point.zero_();
    return {grad_input, grad_scale, grad_zero_point};
  }
  // A channel dimension of size 1 drops out of the layout: one parameter,
  // the per-tensor case.
  const ChannelShape shape = channel_shape(make_param_layout(grad_input, args.param_strides));
  TORCH_INTERNAL_ASSERT(shape.channels == args.channels);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "fakequant_lsq_backward", [&] {
        using C = compute_t<scalar_t>;
        const auto params = make_lsq_params<C>(scale, zero_point, quant_min, quant_max);
        lsq_backward_loop<scalar_t>(x, g, grad_input, shape, params, grad_factor,
                                    grad_scale.mutable_data_ptr<float>(),
                                    grad_zero_point.mutable_data_ptr<float>());
      });
  return {grad_input, grad_scale, grad_zero_point};
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CPU, m) {
  m.impl("fake_quantize_lsq", &fake_quantize_lsq);
  m.impl("fake_quantize_lsq_backward", &fake_quantize_lsq_backward);
}

}  // namespace cpu
}  // namespace fakequant
