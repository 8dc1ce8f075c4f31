#pragma once
// The CUDA kernels and launch of fake_quantize_blockwise for one dtype
// (blockwise_typed<scalar_t>), instantiated once per dtype, each in a translation unit of its
// own (blockwise.cu: float32 and the dispatch, blockwise_stub of the kernel table; the others
// in blockwise_<dtype>.cu), so that a parallel build compiles them at once. The geometry, the
// block scale, the degenerate block and the element rule are contract.h's; memory is walked as
// rows of R elements (BlockGeometry), blocks tiling it without gaps.
//
// Whole blocks of 2 to 32 16-byte vectors tiling aligned memory (NVFP4's 16 elements, the MX
// formats' 32, int blocks of 8 to 256: the uniform geometry, not centered):
// blockwise_vector_kernel, one or more vectors a lane, the scale made once a block (below).
// Other blocks shorter than kLongBlock: a group of G lanes (a power of two, up to a
// warp) handles one block: each lane loads up to K of the block's elements
// (coalesced across the group) and keeps them in registers, the group's max of
// |x| comes from shuffles, every lane derives the scale itself, then quantizes
// its elements from registers. Blocks longer than G * 4 elements are read twice
// (the second time from L1/L2).
// Blocks of kLongBlock elements or more: a whole thread block handles one
// block (the max through shuffles and shared memory), so that a block of
// 70,000 elements does not run on one warp; but in aligned memory a block of at most
// 16 whole steps of a warp's vectors (per token: rows of the common hidden sizes,
// up to 4096 bfloat16 elements) takes one warp, and an integer or E4M3 block of at most 16
// whole steps of two or four warps' vectors (up to 8192 or 16384 bfloat16 elements: MLP
// widths) takes two or four (blockwise_long_vector_kernel).
//
// Mask bits are gathered with __ballot_sync. The mask is exactly ceil(n / 8)
// bytes. Where every 32-bit word of it has one writer (power-of-two blocks, or
// multiples of 32, in the uniform geometry) that writer stores the word whole,
// the mask's last word byte by byte; otherwise each block's bits are or-ed
// with 32-bit atomics into zeroed scratch words, copied into the mask after.
#include <algorithm>

#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

// Blocks of this many elements or more take a thread block each (or a warp: above).
constexpr int64_t kLongBlock = 1024;

// The contract's geometry and how the kernels walk it.
struct LaunchGeometry : BlockGeometry {
  int64_t total_blocks;
  int64_t mask_bytes;   // ceil(n / 8)
  int group_size;       // G: lanes per block, a power of two <= 32 (short blocks)
  int group_shift;      // log2(G) (blockwise_vector_kernel: vectors a block)
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

// --- whole blocks of 16-byte vectors --------------------------------------------------------
// Blocks of B = G * V elements (V = kVec<scalar_t>, G a power of two, 2 <= G <= 32) tiling
// 16-byte aligned input and output (the uniform geometry), not centered. A warp's trip is K
// loads of 32 consecutive vectors (load k of lane l: vector 32 k + l of the trip), each load
// 32 / G whole blocks, the trip 32 K / G of them; K = 4 for G of 2 and 4, 8 above, so that a
// lane has at least four 16-byte loads in flight (docs/cuda.md: one or two in flight leave an
// H200's memory waiting):
//  1. each lane loads its K vectors; the G lanes holding a block take its max by log2(G)
//     shuffles;
//  2. lane l takes blocks l + 32 r of the trip, r < K / G (two where G = 2, else one: lanes
//     from 32 K / G on take none): each one's amax (one shuffle a load), its scale (its
//     divisions by the launch's Divisors, contract.h's blockwise_scale) and the scale's
//     reciprocal (Divisor), made once a block rather than once a lane;
//  3. each lane fetches its blocks' scale and reciprocal (two shuffles a load; three where the
//     reciprocal is a Divisor's y and y_lo, not E8M0's exact one) and quantizes its
//     vectors from registers, x / s as quotient_of (E8M0 scales: e8m0_quotient, exact), where
//     every block of the trip is neither degenerate nor outside the divisor's fast range (one
//     warp-wide vote); otherwise the trip again out of line (Trip::kSlow), with div_rn;
//  4. stores its vectors, and gathers each load's mask bits by shuffles into the 32-bit words that
//     a lane of each 32 / V stores (a load covers 32 V elements from a multiple of 32 V), or,
//     in a trip of blocks inside the format's saturation limit (Trip, below), stores words of
//     ones.
// A trip past the end (n, a multiple of B, need not be one of 32 K V) leaves whole blocks of
// lanes without vectors: they load, store and mark nothing, and their blocks do not vote.
//
// The block scale's divisors of a launch (contract.h's blockwise_scale with D = Divisor): the
// element bound and the per-tensor scale g (1 for one level), made once a thread; `fast` when
// both are fast divisors (otherwise every trip takes the slow path).
struct ScaleDivisors {
  Divisor elem_max, g;
  bool fast;
};

__device__ __forceinline__ ScaleDivisors scale_divisors(const LaunchGeometry& geo, float g) {
  const Divisor e = make_divisor(geo.scale.elem_max), d = make_divisor(g);
  return {e, d, e.fast && d.fast};
}

// How a trip computes:
//  kFast: x / s as quotient_of (x * 1/s for E8M0 scales). Float formats with float32 or E4M3
//    scales (NVFP4) take their trips whose blocks all have RN(amax / s) below the format's
//    saturation limit without the saturation and the mask tests (blockwise_value_of_quotient's
//    kInside; the E4M3 rounding of NVFP4's scales leaves a block's quotients below about 6.4,
//    the limit being 7, unless its scale is subnormal or clamped), and hand the others to
//    kSaturating, out of line; E8M0 scales put about half the blocks' amax past the limit,
//    so those trips, and integer ones, take the full rule inline.
//  kSaturating: kFast with the full rule.
//  kSlow: div_rn, and degenerate blocks: what kFast hands a trip to when one of its blocks is
//    degenerate or outside the fast division's range.
enum class Trip : int { kFast, kSaturating, kSlow };

template <typename scalar_t, Format F, BlockScale S, int K, int kShift, bool kFull, Trip P>
__device__ __noinline__ void vector_trip_out_of_line(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                     uint32_t* __restrict__ mask_words, int64_t n, int64_t base,
                                                     const LaunchGeometry& geo, const BlockRule<float>& rule,
                                                     const ScaleDivisors divisors);

// One trip of the warp from element `base`: kFull, all 32 K V elements in the tensor (every
// lane holds K vectors, every mask word is whole); else the trip past the end, out of line.
template <typename scalar_t, Format F, BlockScale S, int K, int kShift, bool kFull, Trip P = Trip::kFast>
__device__ __forceinline__ void vector_trip(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                            uint32_t* __restrict__ mask_words, int64_t n, int64_t base,
                                            const LaunchGeometry& geo, const BlockRule<float>& rule, const ScaleDivisors divisors) {
  constexpr int V = kVec<scalar_t>;
  constexpr int kLanesPerWord = 32 / V;
  constexpr int64_t kLoad = int64_t{kWarpSize} * V;  // elements a load of the warp covers
  const float g = divisors.g.s;
  // G = 2^shift lanes a block: kShift where it is known at compile time (blocks of 2 or 4
  // vectors), so that the shifts, masks and the max's shuffle loop fold; blocks of 8, 16 or 32
  // vectors (kShift 0) read it from the geometry. R = K / G blocks a lane (1 where G >= K).
  // (the launch takes K = 8 with kShift 0, benchmarks/cuda_loop_shapes.cu also 4: K <= G there)
  static_assert(kShift == 0 ? (K == 4 || K == 8) : (K >> kShift) >= 1, "K loads of whole blocks");
  constexpr int R = kShift == 0 ? 1 : K >> kShift;
  const int shift = kShift != 0 ? kShift : geo.group_shift;
  const int G = 1 << shift;
  const int per_load = kWarpSize >> shift;  // blocks a load covers
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = base + static_cast<int64_t>(lane) * V;
  // The loads this lane holds: all K but in the trip past the end.
  const int loads = kFull ? K : static_cast<int>(min(int64_t{K}, (n - first + kLoad - 1) / kLoad));

  Pack<scalar_t, V> in[K];
  uint32_t amax[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    amax[k] = 0;
    if (kFull || k < loads) {
      in[k] = *reinterpret_cast<const Pack<scalar_t, V>*>(x + first + k * kLoad);
      amax[k] = abs_max_bits(in[k]);
    }
  }
  for (int lanes = 1; lanes < G; lanes *= 2) {
#pragma unroll
    for (int k = 0; k < K; ++k) amax[k] = max(amax[k], __shfl_xor_sync(kFullWarp, amax[k], lanes));
  }
  // Block `lane + 32 r` of the trip (r < R): load (lane + 32 r) / per_load = lane / per_load
  // + r G, lanes from (lane % per_load) * G, the same lanes for every r.
  uint32_t block_amax[R];
#pragma unroll
  for (int r = 0; r < R; ++r) block_amax[r] = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const uint32_t a = __shfl_sync(kFullWarp, amax[k], (lane & (per_load - 1)) << shift);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if ((lane >> (5 - shift)) + r * G == k) block_amax[r] = a;
    }
  }
  // kInside: every block of the trip has RN(amax / s) below the format's saturation limit
  // (float formats with float32 or E4M3 scales: with E4M3's rounding of the scale, the
  // quotients of NVFP4 blocks reach about 6.4 of the limit 7 unless the scale is subnormal
  // or clamped; E8M0 scales put half the blocks' amax above it, so MX trips do not look).
  constexpr bool kSlow = P == Trip::kSlow;
  constexpr bool kInside = P == Trip::kFast && F != Format::kInt && S != BlockScale::kE8M0;
  // kInside formats rounded in bit arithmetic (NVFP4's E2M1): x / s without x's sign, which the
  // rounding takes from x (blockwise_inside_value)
  constexpr bool kUnsigned = kInside && F != Format::kE4M3 && F != Format::kE5M2;
  float s[R], reciprocal[R], reciprocal_lo[R];
  bool outside = false;  // a block of this lane's that the trip's rule does not take
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float a = __uint_as_float(block_amax[r]);
    const int b = lane + kWarpSize * r;
    const bool in_trip = b < per_load * K && (kFull || base + (static_cast<int64_t>(b) << shift) * V < n);
    reciprocal_lo[r] = 0.0f;
    if constexpr (S == BlockScale::kE8M0) {
      s[r] = blockwise_scale<S>(a, geo.scale, g);
      reciprocal[r] = e8m0_inverse(s[r]);  // the product is exact, and E8M0 blocks are never degenerate
    } else if constexpr (!kSlow) {
      s[r] = blockwise_scale<S>(a, geo.scale, divisors.elem_max, divisors.g);
      const Divisor d = make_divisor(s[r]);
      reciprocal[r] = d.y;
      reciprocal_lo[r] = d.y_lo;
      const bool slow = blockwise_degenerate(a, s[r], g, S) | !d.fast | !fast_dividend(a) | !divisors.fast;
      if constexpr (kInside) {
        outside |= in_trip & (slow | !(quotient_of(a, d) < rule.float_limit));
      } else {
        outside |= in_trip & slow;
      }
    } else {
      s[r] = blockwise_scale<S>(a, geo.scale, g);
      reciprocal[r] = 1.0f;
    }
  }
  if constexpr (S != BlockScale::kE8M0 && !kSlow) {
    // one vote: kInside's trip with a block outside goes to kSaturating, which votes on `slow`
    // again; a trip with a slow block goes to kSlow
    if (__any_sync(kFullWarp, outside)) {
      vector_trip_out_of_line<scalar_t, F, S, K, kShift, kFull, kInside ? Trip::kSaturating : Trip::kSlow>(
          x, y, mask_words, n, base, geo, rule, divisors);
      return;
    }
  }

  float sk[K], yk[K], lk[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    // the lane that took this load's block, as its block r: block k per_load + lane / G
    const int r = R == 1 ? 0 : k >> kShift;
    const int owner = (R == 1 ? k : k & ((1 << kShift) - 1)) * per_load + (lane >> shift);
    sk[k] = __shfl_sync(kFullWarp, s[r], owner);
    yk[k] = __shfl_sync(kFullWarp, reciprocal[r], owner);
    lk[k] = S != BlockScale::kE8M0 && !kSlow ? __shfl_sync(kFullWarp, reciprocal_lo[r], owner) : 0.0f;
  }
  Pack<scalar_t, V> out[K];
  unsigned bits[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    bits[k] = 0;
    const Pack<float, V> xf = to_floats(in[k]);
    // (kSlow: this lane's blocks, from its group's amax)
    const ScaleOf<float> b{sk[k], kSlow && blockwise_degenerate(__uint_as_float(amax[k]), sk[k], g, S), false, 0.0f};
#pragma unroll
    for (int j = 0; j < V; ++j) {
      unsigned bit;
      const float xv = xf.v[j];
      float v;
      if constexpr (kSlow) {
        v = block_element<F>(xv, b, rule, bit);
      } else if constexpr (kUnsigned) {
        v = blockwise_inside_value<F>(quotient_of<false>(xv, Divisor{sk[k], yk[k], lk[k], true}), xv, sk[k]);
        bit = 1;
      } else {
        const float xs = S == BlockScale::kE8M0
                             ? e8m0_quotient(xv, yk[k])
                             : quotient_of<F != Format::kInt>(xv, Divisor{sk[k], yk[k], lk[k], true});
        // kFinite: the fast trips divide finite blocks by fast divisors (above); an E8M0
        // quotient is NaN only in a block holding NaN, whose scale is NaN (contract.h)
        v = blockwise_value_of_quotient<F, true, kInside>(xs, sk[k], rule, bit);
      }
      out[k].v[j] = static_cast<scalar_t>(v);
      bits[k] |= bit << j;
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (kFull || k < loads) *reinterpret_cast<Pack<scalar_t, V>*>(y + first + k * kLoad) = out[k];
  }
  // Each load's bits (none where the lane holds no vector): the first lane of each 32 / V
  // gathers theirs into the word it stores.
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t w = (first + k * kLoad) / 32;
    if (kFull && kInside) {  // every bit set
      if (lane % kLanesPerWord == 0) mask_words[w] = 0xffffffffu;
      continue;
    }
    if (!kFull && k >= loads) bits[k] = 0;
    bits[k] = gather_lane_bits<V, kLanesPerWord>(bits[k]);
    if (lane % kLanesPerWord == 0) {
      if (kFull) {
        mask_words[w] = bits[k];
      } else if (k < loads) {
        store_mask_word(mask_words, geo.mask_bytes, w, bits[k]);
      }
    }
  }
}

template <typename scalar_t, Format F, BlockScale S, int K, int kShift, bool kFull, Trip P>
__device__ __noinline__ void vector_trip_out_of_line(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                     uint32_t* __restrict__ mask_words, int64_t n, int64_t base,
                                                     const LaunchGeometry& geo, const BlockRule<float>& rule,
                                                     const ScaleDivisors divisors) {
  vector_trip<scalar_t, F, S, K, kShift, kFull, P>(x, y, mask_words, n, base, geo, rule, divisors);
}

template <typename scalar_t, Format F, BlockScale S, int K, int kShift>
__device__ __noinline__ void vector_trip_past_end(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                  uint32_t* __restrict__ mask_words, int64_t n, int64_t base,
                                                  const LaunchGeometry& geo, const BlockRule<float>& rule, const ScaleDivisors divisors) {
  vector_trip<scalar_t, F, S, K, kShift, false>(x, y, mask_words, n, base, geo, rule, divisors);
}

template <typename scalar_t, Format F, BlockScale S, int K, int kShift>
__global__ void __launch_bounds__(kThreads)
    blockwise_vector_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                            uint32_t* __restrict__ mask_words, int64_t n, const LaunchGeometry geo,
                            const BlockRule<float> rule, const ParamPtr scale_amax) {
  constexpr int64_t kTrip = int64_t{kWarpSize} * K * kVec<scalar_t>;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t trips = (n + kTrip - 1) / kTrip;
  const ScaleDivisors divisors = scale_divisors(geo, S == BlockScale::kE4M3 ? global_scale(geo, scale_amax) : 1.0f);
  for (int64_t t = warp; t < trips; t += nwarps) {  // the same for the whole warp
    const int64_t base = t * kTrip;
    if (base + kTrip <= n) {
      vector_trip<scalar_t, F, S, K, kShift, true>(x, y, mask_words, n, base, geo, rule, divisors);
    } else {
      vector_trip_past_end<scalar_t, F, S, K, kShift>(x, y, mask_words, n, base, geo, rule, divisors);
    }
  }
}

// The max of m and of n over the warp, in every lane. Every lane of the warp calls it together.
__device__ __forceinline__ void warp_max(uint32_t& m, uint32_t& n) {
  for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) {
    m = max(m, __shfl_xor_sync(kFullWarp, m, lanes));
    n = max(n, __shfl_xor_sync(kFullWarp, n, lanes));
  }
}

// The max of m and of n over the thread block, in every thread: shuffles within each warp, then
// the warps' through the block's shared words warp_amax and warp_neg (kWarpsPerBlock each),
// which are free again when it returns. Every thread of the block calls it together.
__device__ __forceinline__ void thread_block_max(uint32_t& m, uint32_t& n, uint32_t* warp_amax, uint32_t* warp_neg) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  warp_max(m, n);
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
}

// The max of m and of n over a group of kGroup / 32 warps (aligned in the thread block), in
// every thread: shuffles within each warp, then the group's warps' through the shared words of
// slot_amax and slot_neg (two sets of kWarpsPerBlock each, set `parity`). Every thread of the block calls
// it together, once a round of its loop, `parity` alternating from one round to the next: a
// round's slots are read before the next round's barrier, which every thread reaches, and are
// written again two rounds on, so one barrier a round is enough.
template <int kGroup>
__device__ __forceinline__ void group_max(uint32_t& m, uint32_t& n, uint32_t* slot_amax, uint32_t* slot_neg,
                                          int parity) {
  constexpr int kGroupWarps = kGroup / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int set = parity * kWarpsPerBlock;
  warp_max(m, n);
  if (lane == 0) {
    slot_amax[set + warp] = m;
    slot_neg[set + warp] = n;
  }
  __syncthreads();
  const int first = set + warp / kGroupWarps * kGroupWarps;
#pragma unroll
  for (int w = 0; w < kGroupWarps; ++w) {
    m = max(m, slot_amax[first + w]);
    n = max(n, slot_neg[first + w]);
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
    thread_block_max(m, n, warp_amax, warp_neg);
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

// Blocks of kLongBlock elements or more, whole multiples of 32 elements tiling aligned memory
// (per token: whole rows): blockwise_long_kernel's passes in 16-byte vectors, a thread V
// elements a step, and x / s as contract.h's quotient_of where the block's scale and amax are
// in the fast division's range and the block is not degenerate (otherwise
// long_vector_slow, out of line). kCentered: blocks quantized about their centre.
template <typename scalar_t, Format F, bool kCentered>
__device__ __noinline__ unsigned long_vector_slow(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                  float s, bool degenerate, float center,
                                                  const BlockRule<float> rule) {
  constexpr int V = kVec<scalar_t>;
  const Pack<scalar_t, V> in = *reinterpret_cast<const Pack<scalar_t, V>*>(x);
  Pack<scalar_t, V> out;
  const ScaleOf<float> b{s, degenerate, kCentered, center};
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    unsigned bit;
    out.v[j] = static_cast<scalar_t>(block_element<F>(static_cast<float>(in.v[j]), b, rule, bit));
    bits |= bit << j;
  }
  *reinterpret_cast<Pack<scalar_t, V>*>(y) = out;
  return bits;
}

// The mask bits of a step of a row (V a lane, the lane's vector at offset i, in the row where
// in_row): the first lane of each 32 / V gathers theirs into the word it stores, `word`, the
// row's word i / 32 (a row is whole words: its length is a multiple of 32). Every lane of the
// warp calls it together.
template <int V>
__device__ __forceinline__ void store_row_bits(uint32_t* __restrict__ word, bool in_row, unsigned bits) {
  constexpr int kLanesPerWord = 32 / V;
  bits = gather_lane_bits<V, kLanesPerWord>(bits);
  if (threadIdx.x % kLanesPerWord == 0 && in_row) *word = bits;
}

// The second pass of a row whose scale or amax is outside the fast division's range, or which
// is degenerate: long_vector_slow a vector, the row read again. The row's kGroup threads (t:
// this one's index among them) call it together.
template <typename scalar_t, Format F, bool kCentered, int kGroup>
__device__ __noinline__ void long_vector_row_slow(const scalar_t* __restrict__ xr, scalar_t* __restrict__ yr,
                                                  uint32_t* __restrict__ wr, int64_t len, float s,
                                                  bool degenerate, float center, const BlockRule<float> rule, int t) {
  constexpr int V = kVec<scalar_t>;
  for (int64_t i0 = 0; i0 < len; i0 += int64_t{kGroup} * V) {
    const int64_t i = i0 + int64_t{t} * V;
    const unsigned bits =
        i < len ? long_vector_slow<scalar_t, F, kCentered>(xr + i, yr + i, s, degenerate, center, rule) : 0u;
    store_row_bits<V>(wr + i / 32, i < len, bits);
  }
}

// kGroup, the threads that share a block: the thread block (kThreads), or a warp (kWarpSize),
// each warp of the thread block on blocks of its own, whose max is the warp's shuffles (no
// shared memory, no barrier), or two or four warps (64, 128: rows of up to 16 of their steps,
// 8192 or 16384 bfloat16 elements, 4096 or 8192 float32 ones), each group of the thread block
// on blocks of its own, whose max is its warps' shuffles and then their shared words
// (group_max: one barrier a round, every group of the thread block stepping through its loop
// together, a group without a block of its own in the last round included). Groups smaller
// than the thread block hold whole steps of their rows in registers, as a warp does, so that a
// thread holds up to 16 vectors and pays the row's max, scale and Divisor for them, where a
// thread block on a row of 8192 bfloat16 elements would hold four. kHeld: blocks of at most the group's held steps (kHeldSteps of
// the thread block's vectors: rows of up to 8192 float32 or 16384 bfloat16 elements;
// kWarpHeldSteps of a warp's: 2048 float32 or 4096 bfloat16, the common hidden sizes, where a
// thread block would hold one or two vectors a thread and pay the row's max, scale and Divisor
// for those), each thread's vectors held in registers between the passes, so that the block is
// read once; otherwise (the thread block only) any length, read twice (the second time from
// L2). A warp's blocks are whole steps (a multiple of 32 V elements: the launch sees to it), so
// that its steps test nothing but the block's end. kPrefetch (the held kernels): beside each of
// a block's loads the group asks L2 for the same vector of its next block (prefetch_l2), which
// the memory then fetches while the group reduces and quantizes this one, when the group's own
// loads have nothing in flight (benchmarks/cuda_loop_shapes.cu times both).
constexpr int kHeldSteps = 8;
constexpr int kWarpHeldSteps = 16;

template <typename scalar_t, Format F, bool kCentered, bool kHeld, int kGroup, bool kPrefetch>
__global__ void __launch_bounds__(kThreads)
    blockwise_long_vector_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                 uint32_t* __restrict__ mask_words, const LaunchGeometry geo,
                                 const BlockRule<float> rule, const ParamPtr scale_amax) {
  // groups of several warps: their max through shared memory, the thread block's rounds together
  constexpr bool kWarps = kGroup > kWarpSize && kGroup < kThreads;
  static_assert(kGroup == kThreads || ((kGroup == kWarpSize || kGroup == 2 * kWarpSize || kGroup == 4 * kWarpSize) && kHeld),
                "a thread block, or a warp or a group of two or four holding its rows");
  static_assert(kHeld || !kPrefetch, "a block read twice would compete with its prefetched successor for L2");
  constexpr int V = kVec<scalar_t>;
  constexpr int kGroups = kThreads / kGroup;  // blocks a thread block works on at once
  constexpr int kSteps = kGroup < kThreads ? kWarpHeldSteps : kHeldSteps;
  // Offsets within a row: 32-bit where the row is held (kSteps steps at most).
  using Off = std::conditional_t<kHeld, int, int64_t>;
  constexpr Off kStep = Off{kGroup} * V;
  constexpr bool kWholeSteps = kGroup < kThreads;
  FQ_SHARED(uint32_t, warp_amax, kWarpsPerBlock);
  FQ_SHARED(uint32_t, warp_neg, kWarpsPerBlock);
  // (kWarps: group_max's slots, two rounds' worth)
  FQ_SHARED(uint32_t, slot_amax, 2 * kWarpsPerBlock);
  FQ_SHARED(uint32_t, slot_neg, 2 * kWarpsPerBlock);
  // (the launch's blockDim.x is kThreads: a thread block's group is all of it)
  const int t = kGroup == kThreads ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % kGroup;
  const int group = kGroup == kThreads ? 0 : static_cast<int>(threadIdx.x) / kGroup;
  const float g = global_scale(geo, scale_amax);
  const Off len = static_cast<Off>(geo.block_size);  // every block whole (the uniform geometry)
  // the passes' steps: kSteps (some past the end) or as many as the block needs
  const Off steps = kHeld ? kSteps : (len + kStep - 1) / kStep;

  // (the same for the whole group; kWarps: for the whole thread block, whose groups without a
  // block of their own in the last round take part in its barrier and nothing else)
  int parity = 0;
  for (int64_t blk = int64_t{blockIdx.x} * kGroups + group; (kWarps ? blk - group : blk) < geo.total_blocks;
       blk += int64_t{gridDim.x} * kGroups, parity ^= 1) {
    // (a group without a block of its own reads the first block, and writes nothing)
    const bool active = !kWarps || blk < geo.total_blocks;
    const int64_t start = (active ? blk : 0) * geo.block_size;
    const scalar_t* __restrict__ xr = x + start;
    scalar_t* __restrict__ yr = y + start;
    uint32_t* __restrict__ wr = mask_words + start / 32;  // (blocks are whole words)
    // this thread's vector of step k at k * kStep from these (constant offsets where unrolled),
    // its mask word (where it stores one) at k * kStep / 32 words
    const scalar_t* __restrict__ xt = xr + Off{t} * V;
    scalar_t* __restrict__ yt = yr + Off{t} * V;
    uint32_t* __restrict__ wt = wr + Off{t} * V / 32;
    // kPrefetch: the same vector of the group's next block, asked of L2 beside each load
    const int64_t next = blk + int64_t{gridDim.x} * kGroups;
    const bool prefetch = kPrefetch && next < geo.total_blocks;
    const scalar_t* xn = prefetch ? xt + (next - blk) * geo.block_size : xt;
    Pack<scalar_t, V> held[kHeld ? kSteps : 1];
    RowKeys<scalar_t, kCentered> keys;
#pragma unroll
    for (Off k = 0; k < steps; ++k) {
      if (k * kStep >= len) break;  // (the whole group alike)
      const Off i = k * kStep + Off{t} * V;
      if (kWholeSteps || i < len) {  // (a group without a block reads the first: see `start`)
        const Pack<scalar_t, V> raw = load_read_only<V>(xt + k * kStep);
        if (prefetch) prefetch_l2(xn + k * kStep);
        if constexpr (kHeld) held[k] = raw;
        keys.add(raw);
      }
    }
    uint32_t m, n;
    keys.read(m, n);
    if constexpr (kGroup == kWarpSize) {
      warp_max(m, n);
    } else if constexpr (kWarps) {
      group_max<kGroup>(m, n, slot_amax, slot_neg, parity);
      if (!active) continue;  // (after the round's barrier)
    } else {
      thread_block_max(m, n, warp_amax, warp_neg);
    }
    float amax = __uint_as_float(m), center = 0.0f;
    if constexpr (kCentered) {
      const Centered cb = centered_block(m, n);
      amax = cb.amax;
      center = cb.center;
    }
    const float s = blockwise_scale(amax, geo.scale, g);
    const bool degenerate = blockwise_degenerate(amax, s, g, geo.scale.kind);
    const Divisor d = make_divisor(s);

    if (!(!degenerate & d.fast & fast_dividend(amax))) {  // (the same in every thread of the group)
      long_vector_row_slow<scalar_t, F, kCentered, kGroup>(xr, yr, wr, geo.block_size, s, degenerate, center, rule,
                                                           t);
      continue;
    }
#pragma unroll
    for (Off k = 0; k < steps; ++k) {
      if (k * kStep >= len) break;  // (the whole group alike)
      const Off i = k * kStep + Off{t} * V;
      unsigned bits = 0;
      if (kWholeSteps || i < len) {
        const Pack<float, V> in =
            to_floats(kHeld ? held[kHeld ? k : 0] : load_read_only<V>(xt + k * kStep));
        Pack<scalar_t, V> out;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          unsigned bit;
          const float xv = in.v[j];
          const float xc = kCentered ? sub_rn(xv, center) : xv;
          const float v = blockwise_value_of_quotient<F, true>(quotient_of<F != Format::kInt>(xc, d), s, rule, bit);
          out.v[j] = static_cast<scalar_t>(kCentered ? add_rn(v, center) : v);
          bits |= bit << j;
        }
        *reinterpret_cast<Pack<scalar_t, V>*>(yt + k * kStep) = out;
      }
      store_row_bits<V>(wt + k * kStep / 32, kWholeSteps || i < len, bits);
    }
  }
}

int next_pow2(int64_t v) {
  int p = 1;
  while (p < v && p < kWarpSize) p *= 2;
  return p;
}

}  // namespace

template <typename scalar_t>
void blockwise_typed(const BlockwiseJob& job) {
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

  [&] {  // (a lambda: its returns skip to the mask copy below)
    using C = compute_t<scalar_t>;
    const BlockRule<C> rule{static_cast<C>(job.rule.quant_min), static_cast<C>(job.rule.quant_max),
                            static_cast<C>(job.rule.float_limit)};
    const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
    scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
    if constexpr (!std::is_same_v<scalar_t, double>) {
      constexpr int V = kVec<scalar_t>;
      // Both vector kernels store whole words into the mask (`words`): their blocks are
      // multiples of 32 or powers of two in the uniform geometry, so aligned_words holds.
      if (long_blocks && uniform && geo.block_size % kWarpSize == 0 && aligned16(xp) && aligned16(yp)) {
        with_blockwise_format(job.format, [&](auto format_tag) {
          constexpr Format F = decltype(format_tag)::value;
          auto launch = [&](auto centered_tag) {
            constexpr bool kCentered = decltype(centered_tag)::value;
            // whole steps of `warps` warps' vectors, up to the held steps of a warp
            auto whole_steps = [&](int64_t warps) {
              const int64_t step = warps * kWarpSize * V;
              return geo.block_size <= step * kWarpHeldSteps && geo.block_size % step == 0;
            };
            // groups of two or four warps, for integer and E4M3 blocks (per token's formats): false
            // where none takes the blocks
            auto warp_groups = [&] {
              if constexpr (F == Format::kInt || F == Format::kE4M3) {
                for (int64_t warps : {2, 4}) {
                  if (!whole_steps(warps)) continue;
                  auto* kernel = warps == 2 ? &blockwise_long_vector_kernel<scalar_t, F, kCentered, true, 2 * kWarpSize, true>
                                            : &blockwise_long_vector_kernel<scalar_t, F, kCentered, true, 4 * kWarpSize, true>;
                  launch_kernel(kernel, grid_for(geo.total_blocks * warps, job.x.get_device()), stream, xp, yp, words,
                                geo, rule, job.scale_amax);
                  return true;
                }
              }
              return false;
            };
            if (whole_steps(1)) {  // a warp a block
              launch_kernel(&blockwise_long_vector_kernel<scalar_t, F, kCentered, true, kWarpSize, true>,
                            grid_for(geo.total_blocks, job.x.get_device()), stream, xp, yp, words, geo, rule,
                            job.scale_amax);
            } else if (warp_groups()) {
            } else if (geo.block_size <= int64_t{kThreads} * V * kHeldSteps) {
              launch_kernel(&blockwise_long_vector_kernel<scalar_t, F, kCentered, true, kThreads, true>, blocks, stream, xp,
                            yp, words, geo, rule, job.scale_amax);
            } else {
              launch_kernel(&blockwise_long_vector_kernel<scalar_t, F, kCentered, false, kThreads, false>, blocks, stream,
                            xp, yp, words, geo, rule, job.scale_amax);
            }
          };
          if (geo.centered) {
            launch(std::true_type{});
          } else {
            launch(std::false_type{});
          }
        });
        return;
      }
      const int64_t lanes = geo.block_size / V;  // vectors a block
      if (uniform && !geo.centered && geo.block_size % V == 0 && lanes >= 2 && lanes <= kWarpSize &&
          (lanes & (lanes - 1)) == 0 && aligned16(xp) && aligned16(yp) &&
          (geo.scale.kind != BlockScale::kE4M3 || job.format == Format::kE2M1)) {
        geo.group_size = static_cast<int>(lanes);
        while ((1 << geo.group_shift) < geo.group_size) ++geo.group_shift;
        // K loads a lane a trip: at least 4 (a lane of blocks of 2 vectors takes two blocks' scales)
        const int K = static_cast<int>(std::clamp<int64_t>(lanes, 4, 8));
        const unsigned vector_blocks = grid_for((n + kWarpSize * K * V - 1) / (kWarpSize * K * V), job.x.get_device());
        auto launch = [&](auto kernel) {
          launch_kernel(kernel, vector_blocks, stream, xp, yp, words, n, geo, rule, job.scale_amax);
        };
        with_blockwise_format(job.format, [&](auto format_tag) {
          constexpr Format F = decltype(format_tag)::value;
          auto with_k = [&](auto scale_tag) {
            constexpr BlockScale S = decltype(scale_tag)::value;
            if (lanes == 2) launch(&blockwise_vector_kernel<scalar_t, F, S, 4, 1>);
            else if (lanes == 4) launch(&blockwise_vector_kernel<scalar_t, F, S, 4, 2>);
            else launch(&blockwise_vector_kernel<scalar_t, F, S, 8, 0>);
          };
          if (geo.scale.kind == BlockScale::kE8M0) {
            with_k(std::integral_constant<BlockScale, BlockScale::kE8M0>{});
          } else if (geo.scale.kind == BlockScale::kFloat32) {
            with_k(std::integral_constant<BlockScale, BlockScale::kFloat32>{});
          } else if constexpr (F == Format::kE2M1) {
            with_k(std::integral_constant<BlockScale, BlockScale::kE4M3>{});
          }
        });
        return;
      }
    }
    with_blockwise_format(job.format, [&](auto format_tag) {
      constexpr Format F = decltype(format_tag)::value;
      auto* kernel = long_blocks            ? &blockwise_long_kernel<scalar_t, F>
                     : geo.iterations == 1 ? &blockwise_kernel<scalar_t, F, 1>
                     : geo.iterations <= 4 ? &blockwise_kernel<scalar_t, F, 4>
                                           : &blockwise_kernel<scalar_t, F, 0>;
      launch_kernel(kernel, blocks, stream, xp, yp, words, geo, rule, job.scale_amax);
    });
  }();
  if (!geo.aligned_words) job.mask.copy_(scratch.view(at::kByte).narrow(0, 0, geo.mask_bytes));
}

FAKEQUANT_EXTERN_PER_DTYPE(blockwise_typed, BlockwiseJob);

}  // namespace gpu
}  // namespace fakequant
