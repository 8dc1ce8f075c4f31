// The CPU loop behind the forward of the affine, min/max and amax families
// (quantize_stub): the family's constants of every parameter, made by the
// builders of contract.h and kept as separate arrays (vectorised loads), and the
// element rule quantize_value with the format, output and mask as template
// constants, so that the loop has no branches on flags and the compiler
// vectorises it.
#include <ATen/Dispatch.h>

#include <vector>

#include "fakequant/kernel_table.h"
#include "fakequant/static_switch.h"
#include "loop.h"

namespace fakequant {
namespace cpu {
namespace {

// The constants of every parameter, one array per member.
template <typename C>
struct ParamArrays {
  std::vector<C> scale, lo, hi, zero_point, window_lo, window_hi;

  template <typename Family>
  ParamArrays(const Family& family, int64_t n)
      : scale(n), lo(n), hi(n), zero_point(n), window_lo(n), window_hi(n) {
    for (int64_t i = 0; i < n; ++i) {
      const Consts<C> c = family.template make<C>(i);
      scale[i] = c.scale;
      lo[i] = c.lo;
      hi[i] = c.hi;
      zero_point[i] = c.zero_point;
      window_lo[i] = c.window_lo;
      window_hi[i] = c.window_hi;
    }
  }
};

template <Format F, Output O, Window W, MaskOut M, typename scalar_t, typename C>
inline void quantize_element(scalar_t x, scalar_t& y, uint8_t& m, C s, C lo, C hi, C zp, C wlo,
                             C whi) {
  uint8_t bit;
  y = static_cast<scalar_t>(
      quantize_value<F, O, W>(static_cast<C>(x), s, lo, hi, zp, wlo, whi, bit));
  if constexpr (M != MaskOut::kNone) m = bit;
}

// A run of elements sharing one set of parameters (per-tensor, or the inner
// dimensions of a channel).
template <Format F, Output O, Window W, MaskOut M, typename scalar_t, typename C>
FAKEQUANT_CPU_CLONES void run_uniform(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                      uint8_t* __restrict__ m, int64_t n,
                                      const ParamArrays<C>& p, int64_t j) {
  const C s = p.scale[j], lo = p.lo[j], hi = p.hi[j], zp = p.zero_point[j];
  const C wlo = p.window_lo[j], whi = p.window_hi[j];
  for (int64_t k = 0; k < n; ++k) {
    quantize_element<F, O, W, M>(x[k], y[k], m[k], s, lo, hi, zp, wlo, whi);
  }
}

// A run whose parameters change with every element (channels innermost, as in
// channels_last activations quantized per channel).
template <Format F, Output O, Window W, MaskOut M, typename scalar_t, typename C>
FAKEQUANT_CPU_CLONES void run_varying(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                      uint8_t* __restrict__ m, int64_t n,
                                      const ParamArrays<C>& p, int64_t j) {
  const C* __restrict__ s = p.scale.data() + j;
  const C* __restrict__ lo = p.lo.data() + j;
  const C* __restrict__ hi = p.hi.data() + j;
  const C* __restrict__ zp = p.zero_point.data() + j;
  const C* __restrict__ wlo = p.window_lo.data() + j;
  const C* __restrict__ whi = p.window_hi.data() + j;
  for (int64_t k = 0; k < n; ++k) {
    quantize_element<F, O, W, M>(x[k], y[k], m[k], s[k], lo[k], hi[k], zp[k], wlo[k], whi[k]);
  }
}

// The loop over x (dense, with y's strides) in tiles; the mask bytes of a tile
// go to a local buffer that is packed into bits (packed mask), straight into
// a bool mask, or nowhere (no mask).
template <Format F, Output O, Window W, MaskOut M, typename scalar_t>
void quantize_loop(const QuantizeJob& job, const ParamArrays<compute_t<scalar_t>>& params) {
  const int64_t n = job.x.numel();
  const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
  scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
  uint8_t* mp = M == MaskOut::kNone ? nullptr : static_cast<uint8_t*>(job.mask.mutable_data_ptr());
  const ParamLayout& layout = job.layout;
  const int64_t inner = layout.inner_size();
  const int64_t pstep = layout.inner_param_stride();
  const int64_t ntiles = (n + kTile - 1) / kTile;

  at::parallel_for(0, ntiles, kTilesPerTask, [&](int64_t t0, int64_t t1) {
    alignas(64) uint8_t local[kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t e0 = t * kTile, e1 = std::min(n, e0 + kTile);
      uint8_t* m = M == MaskOut::kBool ? mp + e0 : local;
      for (int64_t e = e0; e < e1;) {
        const int64_t row = e / inner, col = e - row * inner;
        const int64_t len = std::min(inner - col, e1 - e);
        const int64_t j = layout.row_param_offset(row) + col * pstep;
        if (pstep == 0) {
          run_uniform<F, O, W, M>(xp + e, yp + e, m + (e - e0), len, params, j);
        } else if (pstep == 1) {
          run_varying<F, O, W, M>(xp + e, yp + e, m + (e - e0), len, params, j);
        } else {
          for (int64_t k = 0; k < len; ++k) {
            run_uniform<F, O, W, M>(xp + e + k, yp + e + k, m + (e - e0) + k, 1, params,
                                 j + k * pstep);
          }
        }
        e += len;
      }
      if constexpr (M == MaskOut::kPacked) pack_bits(local, e1 - e0, mp + e0 / 8);
    }
  });
}

void quantize_cpu(const QuantizeJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_quantize", [&] {
    using C = compute_t<scalar_t>;
    with_quantize_rule(job, [&](const auto& family, auto f, auto o, auto w, auto m) {
      const ParamArrays<C> params(family, job.num_params);
      quantize_loop<decltype(f)::value, decltype(o)::value, decltype(w)::value, decltype(m)::value,
                    scalar_t>(job, params);
    });
  });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(quantize_stub, CPU, &quantize_cpu);

}  // namespace cpu
}  // namespace fakequant
