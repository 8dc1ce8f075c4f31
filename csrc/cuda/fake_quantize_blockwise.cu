// CUDA kernel of fake_quantize_blockwise (the CPU twin is
// csrc/cpu/fake_quantize_blockwise.cpp; the checks, the layout rule and the
// block scale are shared in blockwise_args.h).
//
// Memory is walked as rows of R elements, as on the CPU: R = block_size when it
// divides the last dimension (one block per row), else the last dimension
// (ceil(L / block_size) blocks, the last one shorter). Blocks tile memory
// without gaps, block b + 1 starting where b ends.
//
// A group of G lanes (a power of two, up to a warp) handles one block: each
// lane loads up to K of the block's elements (coalesced across the group) and
// keeps them in registers, the group's max of |x| comes from shuffles, every
// lane derives the scale itself, then quantizes its elements from registers.
// Blocks longer than G * 4 elements are read twice (the second time from L1/L2).
// Mask bits are gathered with __ballot_sync. With power-of-two blocks in the
// uniform geometry a warp's 32 bits are one aligned word of the packed mask,
// which one lane stores; otherwise a group's bits are or-ed into a zeroed mask
// with 32-bit atomics. The mask's storage is padded to whole words.
#include <torch/library.h>

#include "../blockwise_args.h"
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

struct BlockGeometry {
  int64_t row_len;         // R
  int64_t block_size;      // full blocks
  int64_t blocks_per_row;  // ceil(R / block_size)
  int64_t last_len;        // a row's last block
  int64_t total_blocks;
  int64_t n;
  int group_size;       // G: lanes per block, a power of two <= 32
  int iterations;       // ceil(block_size / G): the group's steps through a block
  bool aligned_words;   // a warp's ballot in a step is one aligned mask word
  bool two_level;
};

template <typename C>
struct Rule {
  C quant_min, quant_max;  // integer elements: the clamp range of rint(x / s)
  C float_limit;          // float elements: the largest |x / s| not saturated
};

template <Elem E, typename C>
__device__ __forceinline__ C blockwise_value(C xv, C s, const Rule<C>& r, unsigned& m) {
  const C xs = div_rn(xv, s);
  C q;
  if constexpr (E == Elem::kInt) {
    const C t = round_half_even(xs);
    q = t < r.quant_min ? r.quant_min : (t > r.quant_max ? r.quant_max : t);  // NaN falls through
  } else {
    constexpr FloatFormat kFormat = float_format_of<E>();
    q = static_cast<C>(round_to_format(static_cast<float>(xs), kFormat));
  }
  // not saturated: rint(xs) within [quant_min, quant_max], or |xs| within the format's limit
  m = E == Elem::kInt ? static_cast<unsigned>((round_half_even(xs) >= r.quant_min) &
                                              (round_half_even(xs) <= r.quant_max))
                      : static_cast<unsigned>(fabs(xs) <= r.float_limit);
  return mul_rn(q, s);
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// K > 0: the block's elements stay in K registers per lane (blocks of at most
// G * K elements); K == 0: any length, read again for the second pass.
template <typename scalar_t, Elem E, int K>
__global__ void __launch_bounds__(kThreads)
    blockwise_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                     uint32_t* __restrict__ mask_words, const BlockGeometry geo,
                     const Rule<compute_t<scalar_t>> rule, const float elem_max,
                     const ParamPtr scale_amax) {
  using C = compute_t<scalar_t>;
  const int G = geo.group_size;
  const int lane = threadIdx.x % kWarpSize;
  const int member = lane & (G - 1);
  const int group = lane / G;
  const int groups_per_warp = kWarpSize / G;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t warp_steps = (geo.total_blocks + groups_per_warp - 1) / groups_per_warp;

  float g = 1.0f;
  if (geo.two_level) {
    const float sa = scale_amax.as_float(0);
    // An invalid scale_amax (possible only with value checks off) gives NaN.
    g = (sa >= 0.0f && isfinite(sa)) ? blockwise_global_scale(sa, elem_max)
                                     : __int_as_float(0x7fffffff);
  }

  // Every lane of a warp runs the same number of steps (the shuffles and
  // ballots need the whole warp); lanes without a block carry len = 0.
  for (int64_t step = warp; step < warp_steps; step += nwarps) {
    const int64_t blk = step * groups_per_warp + group;
    int64_t start = 0, len = 0;
    if (blk < geo.total_blocks) {
      const int64_t r = geo.blocks_per_row == 1 ? blk : blk / geo.blocks_per_row;
      const int64_t j = blk - r * geo.blocks_per_row;
      start = r * geo.row_len + j * geo.block_size;
      len = j + 1 == geo.blocks_per_row ? geo.last_len : geo.block_size;
    }

    uint32_t m = 0;
    C v[K > 0 ? K : 1];
    if constexpr (K > 0) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t i = static_cast<int64_t>(k) * G + member;
        v[k] = i < len ? static_cast<C>(x[start + i]) : C(0);
        m = max(m, abs_bits(static_cast<float>(v[k])));
      }
    } else {
      for (int64_t i = member; i < len; i += G) {
        m = max(m, abs_bits(static_cast<float>(x[start + i])));
      }
    }
    for (int lanes = G / 2; lanes > 0; lanes /= 2) {
      m = max(m, __shfl_xor_sync(kFullWarp, m, lanes));
    }

    const float amax = __uint_as_float(m);
    const float s32 = geo.two_level ? blockwise_scale<true>(amax, elem_max, g)
                                    : blockwise_scale<false>(amax, elem_max, 1.0f);
    const bool degenerate = blockwise_degenerate(amax, s32, g);
    const C s = static_cast<C>(s32);

    const int iterations = K > 0 ? K : geo.iterations;
#pragma unroll
    for (int k = 0; k < iterations; ++k) {
      const int64_t offset = static_cast<int64_t>(k) * G;
      const int64_t i = offset + member;
      unsigned bit = 0;
      if (i < len) {
        C xv;
        if constexpr (K > 0) {
          xv = v[k];
        } else {
          xv = static_cast<C>(x[start + i]);
        }
        C yv;
        if (degenerate) {
          bit = static_cast<unsigned>(xv == xv);
          yv = xv == xv ? C(0) : xv;  // 0, NaN staying NaN
        } else {
          yv = blockwise_value<E>(xv, s, rule, bit);
        }
        y[start + i] = static_cast<scalar_t>(yv);
      }
      const unsigned ballot = __ballot_sync(kFullWarp, bit);
      if (geo.aligned_words) {
        // The warp's step covers 32 consecutive elements from a multiple of 32
        // (one block of a multiple of 32, or 32 / G whole blocks of G).
        // Lane 0 leads group 0, the warp's first block: if that one has no
        // elements at this step, neither has any other.
        const int64_t first = G == kWarpSize ? start + offset : step * kWarpSize;
        if (lane == 0 && offset < len) mask_words[first / 32] = ballot;
      } else if (member == 0 && offset < len) {
        const unsigned width_mask = G == kWarpSize ? 0xffffffffu : ((1u << G) - 1u);
        const unsigned bits = (ballot >> (group * G)) & width_mask;
        const int64_t pos = start + offset;
        const int shift = static_cast<int>(pos % 32);
        if (bits != 0) {
          atomicOr(mask_words + pos / 32, bits << shift);
          if (shift != 0 && (bits >> (32 - shift)) != 0) {
            atomicOr(mask_words + pos / 32 + 1, bits >> (32 - shift));
          }
        }
      }
    }
  }
}

int next_pow2(int64_t v) {
  int p = 1;
  while (p < v && p < kWarpSize) p *= 2;
  return p;
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_blockwise(
    const at::Tensor& input, int64_t block_size, int64_t num_bits, bool is_unsigned,
    bool narrow_range, int64_t exponent_bits, const std::optional<at::Tensor>& scale_amax) {
  const BlockwiseArgs args = check_blockwise_args(input, block_size, num_bits, is_unsigned,
                                                  narrow_range, exponent_bits, scale_amax);
  const c10::cuda::CUDAGuard guard(input.device());
  if (args.two_level && run_value_checks()) check_scale_amax_value(*scale_amax);

  const bool keep = blockwise_keeps_layout(input);
  at::Tensor y = keep ? at::empty_like(input) : at::empty(input.sizes(), input.options());
  const int64_t n = input.numel();
  if (n == 0) return {y, new_mask(y, /*packed=*/true)};
  const at::Tensor x = keep ? input : input.contiguous();
  TORCH_INTERNAL_ASSERT(x.strides() == y.strides());

  const int64_t last_dim = input.dim() == 0 ? 1 : input.size(-1);
  BlockGeometry geo{};
  const bool uniform = last_dim % block_size == 0;
  geo.row_len = uniform ? block_size : last_dim;
  geo.block_size = uniform ? block_size : std::min(block_size, last_dim);
  geo.blocks_per_row = uniform ? 1 : (last_dim + block_size - 1) / block_size;
  geo.last_len = geo.row_len - (geo.blocks_per_row - 1) * geo.block_size;
  geo.total_blocks = n / geo.row_len * geo.blocks_per_row;
  geo.n = n;
  geo.group_size = next_pow2(geo.block_size);
  geo.iterations = static_cast<int>(
      std::min<int64_t>((geo.block_size + geo.group_size - 1) / geo.group_size, INT32_MAX));
  geo.aligned_words = uniform && (block_size % kWarpSize == 0 || kWarpSize % block_size == 0);
  geo.two_level = args.two_level;

  const int64_t words = (n + 31) / 32;
  const auto byte_options = y.options().dtype(at::kByte);
  at::Tensor buffer = geo.aligned_words ? at::empty({words * 4}, byte_options)
                                        : at::zeros({words * 4}, byte_options);
  // The mask: the buffer's first ceil(n / 8) bytes, as a tensor of its own (not
  // a view, as the fake kernel's).
  at::Tensor mask = at::empty({0}, byte_options);
  mask.set_(buffer.storage(), 0, {(n + 7) / 8}, {1});
  auto* words_ptr = reinterpret_cast<uint32_t*>(buffer.mutable_data_ptr<uint8_t>());

  at::Tensor sa;
  ParamPtr sa_ptr{nullptr, ParamType::kFloat};
  if (args.two_level) {
    sa = device_param(*scale_amax);
    sa_ptr = param_ptr(sa);
  }

  const int64_t groups_per_warp = kWarpSize / geo.group_size;
  const int64_t warp_steps = (geo.total_blocks + groups_per_warp - 1) / groups_per_warp;
  const unsigned blocks = grid_for(warp_steps, x.get_device());
  const auto stream = at::cuda::getCurrentCUDAStream();

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "fakequant_blockwise_cuda", [&] {
        using C = compute_t<scalar_t>;
        const Rule<C> rule{static_cast<C>(args.quant_min), static_cast<C>(args.quant_max),
                           static_cast<C>(args.float_limit)};
        const scalar_t* xp = x.const_data_ptr<scalar_t>();
        scalar_t* yp = y.mutable_data_ptr<scalar_t>();
        auto launch = [&](auto elem_tag) {
          constexpr Elem E = decltype(elem_tag)::value;
          const float emax = args.elem_max;
          if (geo.iterations == 1) {
            blockwise_kernel<scalar_t, E, 1>
                <<<blocks, kThreads, 0, stream>>>(xp, yp, words_ptr, geo, rule, emax, sa_ptr);
          } else if (geo.iterations <= 4) {
            blockwise_kernel<scalar_t, E, 4>
                <<<blocks, kThreads, 0, stream>>>(xp, yp, words_ptr, geo, rule, emax, sa_ptr);
          } else {
            blockwise_kernel<scalar_t, E, 0>
                <<<blocks, kThreads, 0, stream>>>(xp, yp, words_ptr, geo, rule, emax, sa_ptr);
          }
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        };
        switch (args.elem) {
          case Elem::kInt: launch(std::integral_constant<Elem, Elem::kInt>{}); break;
          case Elem::kE2M1: launch(std::integral_constant<Elem, Elem::kE2M1>{}); break;
          case Elem::kE4M3: launch(std::integral_constant<Elem, Elem::kE4M3>{}); break;
          case Elem::kE5M2: launch(std::integral_constant<Elem, Elem::kE5M2>{}); break;
        }
      });
  return {y, mask};
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CUDA, m) {
  m.impl("fake_quantize_blockwise", &fake_quantize_blockwise);
}

}  // namespace gpu
}  // namespace fakequant
