// The CUDA launch of fake_quantize_blockwise (blockwise_stub of the kernel
// table). The geometry, the block scale, the degenerate block and the element
// rule are contract.h's; memory is walked as rows of R elements
// (BlockGeometry), blocks tiling it without gaps.
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
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

// The contract's geometry and how the kernel walks it.
struct LaunchGeometry : BlockGeometry {
  int64_t total_blocks;
  int64_t n;
  int group_size;       // G: lanes per block, a power of two <= 32
  int iterations;       // ceil(block_size / G): the group's steps through a block
  bool aligned_words;   // a warp's ballot in a step is one aligned mask word
  bool two_level;
};

// K > 0: the block's elements stay in K registers per lane (blocks of at most
// G * K elements); K == 0: any length, read again for the second pass.
template <typename scalar_t, Elem E, int K>
__global__ void __launch_bounds__(kThreads)
    blockwise_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                     uint32_t* __restrict__ mask_words, const LaunchGeometry geo,
                     const BlockRule<compute_t<scalar_t>> rule, const float elem_max,
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

  // An invalid scale_amax (possible only with value checks off) gives NaN.
  const float g = geo.two_level ? blockwise_global_scale(scale_amax.as_float(0), elem_max) : 1.0f;

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
        const C yv = degenerate ? degenerate_value(xv, bit) : blockwise_value<E>(xv, s, rule, bit);
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

void blockwise_cuda(const BlockwiseJob& job) {
  const int64_t n = job.x.numel();
  LaunchGeometry geo{};
  static_cast<BlockGeometry&>(geo) = job.geometry;
  const bool uniform = geo.blocks_per_row == 1 && geo.row_len == geo.block_size;
  geo.total_blocks = n / geo.row_len * geo.blocks_per_row;
  geo.n = n;
  geo.group_size = next_pow2(geo.block_size);
  geo.iterations = static_cast<int>(
      std::min<int64_t>((geo.block_size + geo.group_size - 1) / geo.group_size, INT32_MAX));
  geo.aligned_words = uniform && (geo.block_size % kWarpSize == 0 || kWarpSize % geo.block_size == 0);
  geo.two_level = job.two_level;

  const auto stream = at::cuda::getCurrentCUDAStream();
  // The mask's storage holds whole 32-bit words; the atomics below or into it,
  // so it starts zeroed unless every word is stored whole.
  auto* words_ptr = static_cast<uint32_t*>(job.mask.storage().mutable_data());
  if (!geo.aligned_words) {
    C10_CUDA_CHECK(cudaMemsetAsync(words_ptr, 0, (n + 31) / 32 * 4, stream));
  }

  const int64_t groups_per_warp = kWarpSize / geo.group_size;
  const int64_t warp_steps = (geo.total_blocks + groups_per_warp - 1) / groups_per_warp;
  const unsigned blocks = grid_for(warp_steps, job.x.get_device());

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_blockwise_cuda", [&] {
        using C = compute_t<scalar_t>;
        const BlockRule<C> rule{static_cast<C>(job.rule.quant_min), static_cast<C>(job.rule.quant_max),
                                static_cast<C>(job.rule.float_limit)};
        const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
        scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
        const float emax = job.elem_max;
        const ParamPtr sa = job.scale_amax;
        with_elem(job.elem, [&](auto elem_tag) {
          constexpr Elem E = decltype(elem_tag)::value;
          if (geo.iterations == 1) {
            blockwise_kernel<scalar_t, E, 1>
                <<<blocks, kThreads, 0, stream>>>(xp, yp, words_ptr, geo, rule, emax, sa);
          } else if (geo.iterations <= 4) {
            blockwise_kernel<scalar_t, E, 4>
                <<<blocks, kThreads, 0, stream>>>(xp, yp, words_ptr, geo, rule, emax, sa);
          } else {
            blockwise_kernel<scalar_t, E, 0>
                <<<blocks, kThreads, 0, stream>>>(xp, yp, words_ptr, geo, rule, emax, sa);
          }
          C10_CUDA_KERNEL_LAUNCH_CHECK();
        });
      });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(blockwise_stub, CUDA, &blockwise_cuda);

}  // namespace gpu
}  // namespace fakequant
