// The CPU loop of the LSQ/LSQ+ backward (lsq_backward_stub): reads input and
// grad once, writes grad_input and sums the scale and zero-point gradients of
// each channel, with the rule lsq_terms of contract.h.
//
// The sums are deterministic whatever the number of threads: the elements are
// cut into blocks whose size depends only on the tensor's size and channel
// count, each block sums its elements in a fixed order into its own row of
// partial sums (float64), and the rows are added in block order at the end.
#include <ATen/Dispatch.h>

#include <cstring>
#include <vector>

#include "fakequant/kernel_table.h"
#include "loop.h"

namespace fakequant {
namespace cpu {
namespace {

// One element: the summands grad * d and grad * z of lsq_terms, and grad_input
// (grad where inside, else +0, selected on bits).
template <typename scalar_t, typename C>
inline void lsq_element(const scalar_t* __restrict__ x, const scalar_t* __restrict__ g,
                        typename BitsOf<scalar_t>::type* __restrict__ gi, double* __restrict__ ts,
                        double* __restrict__ tz, int64_t k, C s, C lo, C hi) {
  using bits_t = typename BitsOf<scalar_t>::type;
  const LsqTerms<C> t = lsq_terms(static_cast<C>(x[k]), s, lo, hi);
  const C gc = static_cast<C>(g[k]);
  ts[k] = lsq_summand(gc, t.d);
  tz[k] = lsq_summand(gc, t.z);
  bits_t gb;
  std::memcpy(&gb, g + k, sizeof(bits_t));
  gi[k] = select_bits<bits_t>(gb, t.inside);
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

// Per-channel constants (AffineFamily's) in the compute type, and the float32
// scale of the zero point's gradient.
template <typename C>
struct LsqParams {
  std::vector<C> scale, lo, hi;
  std::vector<float> scale32;

  LsqParams(const AffineFamily& family, int64_t n) : scale(n), lo(n), hi(n), scale32(n) {
    for (int64_t i = 0; i < n; ++i) {
      const Consts<C> c = family.make<C>(i);
      scale[i] = c.scale;
      lo[i] = c.lo;
      hi[i] = c.hi;
      scale32[i] = family.scale.as_float(i);
    }
  }
};

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
    grad_scale[c] = lsq_grad_scale(grad_factor, sum_s);
    grad_zero_point[c] = lsq_grad_zero_point(grad_factor, p.scale32[c], sum_z);
  }
}

void lsq_backward_cpu(const LsqBackwardJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_lsq_backward", [&] {
        using C = compute_t<scalar_t>;
        const LsqParams<C> params(job.family, job.shape.channels);
        at::Tensor grad_input = job.grad_input;
        lsq_backward_loop<scalar_t>(job.x, job.grad, grad_input, job.shape, params, job.grad_factor,
                                    job.grad_scale.mutable_data_ptr<float>(),
                                    job.grad_zero_point.mutable_data_ptr<float>());
      });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(lsq_backward_stub, CPU, &lsq_backward_cpu);

}  // namespace cpu
}  // namespace fakequant
