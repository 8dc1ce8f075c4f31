// The CUDA launch of fake_quantize_blockwise (blockwise_stub of the kernel
// table). The geometry, the block scale, the degenerate block and the element
// rule are contract.h's; memory is walked as rows of R elements
// (BlockGeometry), blocks tiling it without gaps.
//
// Blocks shorter than kLongBlock: a group of G lanes (a power of two, up to a
// warp) handles one block: each lane loads up to K of the block's elements
// (coalesced across the group) and keeps them in registers, the group's max of
// |x| comes from shuffles, every lane derives the scale itself, then quantizes
// its elements from registers. Blocks longer than G * 4 elements are read twice
// (the second time from L1/L2).
// Blocks of kLongBlock elements or more: a whole thread block handles one
// block (the max through shuffles and shared memory), so that a block of
// 70,000 elements does not run on one warp.
//
// Mask bits are gathered with __ballot_sync. The mask is exactly ceil(n / 8)
// bytes. Where every 32-bit word of it has one writer (power-of-two blocks, or
// multiples of 32, in the uniform geometry) that writer stores the word whole,
// the mask's last word byte by byte; otherwise each block's bits are or-ed
// with 32-bit atomics into zeroed scratch words, copied into the mask after.
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

// Blocks of this many elements or more take a thread block each.
constexpr int64_t kLongBlock = 1024;

// The contract's geometry and how the kernels walk it.
struct LaunchGeometry : BlockGeometry {
  int64_t total_blocks;
  int64_t mask_bytes;   // ceil(n / 8)
  int group_size;       // G: lanes per block, a power of two <= 32 (short blocks)
  int iterations;       // ceil(block_size / G): the group's steps through a block
  bool aligned_words;   // every mask word has one writer, which stores it whole
  BlockScaleRule scale;
  bool centered;        // blocks quantized about their centre (contract.h)
};

// Where block `blk` starts and how long it is.
__device__ __forceinline__ void block_extent(const LaunchGeometry& geo, int64_t blk, int64_t& start,
                                             int64_t& len) {
  const int64_t r = geo.blocks_per_row == 1 ? blk : blk / geo.blocks_per_row;
  const int64_t j = blk - r * geo.blocks_per_row;
  start = r * geo.row_len + j * geo.block_size;
  len = j + 1 == geo.blocks_per_row ? geo.last_len : geo.block_size;
}

// A block's scale from the bit pattern of its amax (contract.h's rules).
template <typename C>
struct ScaleOf {
  C s;
  bool degenerate;
  bool centered;
  C center;  // centered blocks: the elements are quantized as x - center, plus center
};

// The keys a block reduces (max over its elements): the bits of |x|, or for centered
// blocks the order keys of x (in m) and of -x (in n). 0 is below every key.
__device__ __forceinline__ void reduce_keys(const LaunchGeometry& geo, float v, uint32_t& m, uint32_t& n) {
  if (geo.centered) {
    m = max(m, order_key(v));
    n = max(n, order_key(-v));
  } else {
    m = max(m, abs_bits(v));
  }
}

template <typename C>
__device__ __forceinline__ ScaleOf<C> block_scale(const LaunchGeometry& geo, uint32_t m, uint32_t n,
                                                  float g) {
  float amax = __uint_as_float(m), center = 0.0f;
  if (geo.centered) {
    const Centered cb = centered_block(m, n);
    amax = cb.amax;
    center = cb.center;
  }
  const float s32 = blockwise_scale(amax, geo.scale, g);
  return {static_cast<C>(s32), blockwise_degenerate(amax, s32, g, geo.scale.kind), geo.centered,
          static_cast<C>(center)};
}

template <Format F, typename C>
__device__ __forceinline__ C block_element(C xv, const ScaleOf<C>& b, const BlockRule<C>& rule,
                                           unsigned& bit) {
  const C xc = b.centered ? sub_rn(xv, b.center) : xv;
  const C v = b.degenerate ? degenerate_value(xc, bit) : blockwise_value<F>(xc, b.s, rule, bit);
  return b.centered ? add_rn(v, b.center) : v;
}

// The per-tensor scale of two-level blocks (1 for one level); an invalid
// scale_amax (possible only with value checks off) gives NaN.
__device__ __forceinline__ float global_scale(const LaunchGeometry& geo, const ParamPtr& scale_amax) {
  return geo.scale.kind == BlockScale::kE4M3
             ? blockwise_global_scale(scale_amax.as_float(0), geo.scale.elem_max)
             : 1.0f;
}

// The bits of elements [32 w, 32 w + 32), stored by the word's only writer;
// the mask's last word byte by byte, so that nothing past the mask is written.
__device__ __forceinline__ void store_mask_word(uint32_t* __restrict__ words, int64_t mask_bytes,
                                                int64_t w, uint32_t bits) {
  if ((w + 1) * 4 <= mask_bytes) {
    words[w] = bits;
    return;
  }
  uint8_t* bytes = reinterpret_cast<uint8_t*>(words + w);
  for (int64_t b = 0; w * 4 + b < mask_bytes; ++b) bytes[b] = static_cast<uint8_t>(bits >> (8 * b));
}

// Bit k of `bits` is the mask bit of element pos + k: or-ed into zeroed
// scratch words, which blocks may share.
__device__ __forceinline__ void or_mask_bits(uint32_t* __restrict__ words, int64_t pos, uint32_t bits) {
  if (bits == 0) return;
  const int shift = static_cast<int>(pos % 32);
  atomicOr(words + pos / 32, bits << shift);
  if (shift != 0 && (bits >> (32 - shift)) != 0) atomicOr(words + pos / 32 + 1, bits >> (32 - shift));
}

// K > 0: the block's elements stay in K registers per lane (blocks of at most
// G * K elements); K == 0: any length below kLongBlock, read again for the
// second pass.
template <typename scalar_t, Format F, int K>
__global__ void __launch_bounds__(kThreads)
    blockwise_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                     uint32_t* __restrict__ mask_words, const LaunchGeometry geo,
                     const BlockRule<compute_t<scalar_t>> rule, const ParamPtr scale_amax) {
  using C = compute_t<scalar_t>;
  const int G = geo.group_size;
  const int lane = threadIdx.x % kWarpSize;
  const int member = lane & (G - 1);
  const int group = lane / G;
  const int groups_per_warp = kWarpSize / G;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t warp_steps = (geo.total_blocks + groups_per_warp - 1) / groups_per_warp;
  const float g = global_scale(geo, scale_amax);

  // Every lane of a warp runs the same number of steps (the shuffles and
  // ballots need the whole warp); lanes without a block carry len = 0.
  for (int64_t step = warp; step < warp_steps; step += nwarps) {
    const int64_t blk = step * groups_per_warp + group;
    int64_t start = 0, len = 0;
    if (blk < geo.total_blocks) block_extent(geo, blk, start, len);

    uint32_t m = 0, n = 0;
    C v[K > 0 ? K : 1];
    if constexpr (K > 0) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t i = static_cast<int64_t>(k) * G + member;
        v[k] = i < len ? static_cast<C>(x[start + i]) : C(0);
        if (i < len) reduce_keys(geo, static_cast<float>(v[k]), m, n);
      }
    } else {
      for (int64_t i = member; i < len; i += G) reduce_keys(geo, static_cast<float>(x[start + i]), m, n);
    }
    for (int lanes = G / 2; lanes > 0; lanes /= 2) {
      m = max(m, __shfl_xor_sync(kFullWarp, m, lanes));
      n = max(n, __shfl_xor_sync(kFullWarp, n, lanes));
    }
    const ScaleOf<C> b = block_scale<C>(geo, m, n, g);

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
        y[start + i] = static_cast<scalar_t>(block_element<F>(xv, b, rule, bit));
      }
      const unsigned ballot = __ballot_sync(kFullWarp, bit);
      if (geo.aligned_words) {
        // The warp's step covers 32 consecutive elements from a multiple of 32
        // (one block of a multiple of 32, or 32 / G whole blocks of G).
        // Lane 0 leads group 0, the warp's first block: if that one has no
        // elements at this step, neither has any other.
        const int64_t first = G == kWarpSize ? start + offset : step * kWarpSize;
        if (lane == 0 && offset < len) store_mask_word(mask_words, geo.mask_bytes, first / 32, ballot);
      } else if (member == 0 && offset < len) {
        const unsigned width_mask = G == kWarpSize ? 0xffffffffu : ((1u << G) - 1u);
        or_mask_bits(mask_words, start + offset, (ballot >> (group * G)) & width_mask);
      }
    }
  }
}

// Blocks of kLongBlock elements or more: thread block b takes blocks b,
// b + gridDim.x, ...; its threads stride through the block twice (the max,
// then the elements), one warp's 32 consecutive elements at a time.
template <typename scalar_t, Format F>
__global__ void __launch_bounds__(kThreads)
    blockwise_long_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                          uint32_t* __restrict__ mask_words, const LaunchGeometry geo,
                          const BlockRule<compute_t<scalar_t>> rule, const ParamPtr scale_amax) {
  using C = compute_t<scalar_t>;
  FQ_SHARED(uint32_t, warp_amax, kWarpsPerBlock);
  FQ_SHARED(uint32_t, warp_neg, kWarpsPerBlock);
  const int t = threadIdx.x;
  const int lane = t % kWarpSize;
  const int warp = t / kWarpSize;
  const float g = global_scale(geo, scale_amax);

  for (int64_t blk = blockIdx.x; blk < geo.total_blocks; blk += gridDim.x) {  // the same for the whole block
    int64_t start = 0, len = 0;
    block_extent(geo, blk, start, len);

    uint32_t m = 0, n = 0;
    for (int64_t i = t; i < len; i += kThreads) reduce_keys(geo, static_cast<float>(x[start + i]), m, n);
    for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) {
      m = max(m, __shfl_xor_sync(kFullWarp, m, lanes));
      n = max(n, __shfl_xor_sync(kFullWarp, n, lanes));
    }
    if (lane == 0) {
      warp_amax[warp] = m;
      warp_neg[warp] = n;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      m = max(m, warp_amax[w]);
      n = max(n, warp_neg[w]);
    }
    __syncthreads();  // warp_amax and warp_neg are written again for the next block
    const ScaleOf<C> b = block_scale<C>(geo, m, n, g);

    for (int64_t base = 0; base < len; base += kThreads) {
      const int64_t i = base + t;
      unsigned bit = 0;
      if (i < len) y[start + i] = static_cast<scalar_t>(block_element<F>(static_cast<C>(x[start + i]), b, rule, bit));
      const unsigned ballot = __ballot_sync(kFullWarp, bit);
      const int64_t first = base + static_cast<int64_t>(warp) * kWarpSize;  // the warp's first element
      if (lane == 0 && first < len) {
        if (geo.aligned_words) {
          store_mask_word(mask_words, geo.mask_bytes, (start + first) / 32, ballot);
        } else {
          or_mask_bits(mask_words, start + first, ballot);
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
  const bool long_blocks = geo.block_size >= kLongBlock;
  geo.total_blocks = n / geo.row_len * geo.blocks_per_row;
  geo.mask_bytes = packed_mask_bytes(n);
  geo.group_size = next_pow2(geo.block_size);
  geo.iterations = static_cast<int>(
      std::min<int64_t>((geo.block_size + geo.group_size - 1) / geo.group_size, INT32_MAX));
  geo.aligned_words = uniform && (geo.block_size % kWarpSize == 0 || kWarpSize % geo.block_size == 0);
  geo.scale = job.scale;
  geo.centered = job.centered;

  const auto stream = at::cuda::getCurrentCUDAStream();
  // Whole words straight into the mask (a fresh allocation, aligned for them),
  // or or-ed into zeroed scratch words.
  at::Tensor scratch;
  uint32_t* words = nullptr;
  if (geo.aligned_words) {
    words = static_cast<uint32_t*>(job.mask.mutable_data_ptr());
    TORCH_INTERNAL_ASSERT(reinterpret_cast<uintptr_t>(words) % alignof(uint32_t) == 0);
  } else {
    scratch = job.x.new_zeros({(n + 31) / 32}, job.x.options().dtype(at::kInt));
    words = reinterpret_cast<uint32_t*>(scratch.mutable_data_ptr<int32_t>());
  }

  const int64_t groups_per_warp = kWarpSize / geo.group_size;
  const int64_t warp_steps = (geo.total_blocks + groups_per_warp - 1) / groups_per_warp;
  const unsigned blocks = long_blocks ? grid_for(geo.total_blocks * kWarpsPerBlock, job.x.get_device())
                                      : grid_for(warp_steps, job.x.get_device());

  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_blockwise_cuda", [&] {
        using C = compute_t<scalar_t>;
        const BlockRule<C> rule{static_cast<C>(job.rule.quant_min), static_cast<C>(job.rule.quant_max),
                                static_cast<C>(job.rule.float_limit)};
        const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
        scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
        with_blockwise_format(job.format, [&](auto format_tag) {
          constexpr Format F = decltype(format_tag)::value;
          auto* kernel = long_blocks            ? &blockwise_long_kernel<scalar_t, F>
                         : geo.iterations == 1 ? &blockwise_kernel<scalar_t, F, 1>
                         : geo.iterations <= 4 ? &blockwise_kernel<scalar_t, F, 4>
                                               : &blockwise_kernel<scalar_t, F, 0>;
          launch_kernel(kernel, blocks, stream, xp, yp, words, geo, rule, job.scale_amax);
        });
      });
  if (!geo.aligned_words) job.mask.copy_(scratch.view(at::kByte).narrow(0, 0, geo.mask_bytes));
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(blockwise_stub, FAKEQUANT_CUDA_SLOT, &blockwise_cuda);

}  // namespace gpu
}  // namespace fakequant
