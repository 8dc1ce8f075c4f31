// The CUDA launch of fake_quantize_ggml (ggml_stub of the kernel table): llama.cpp's Q8_0/Q4_0
// blocks, the rule of csrc/include/fakequant/ggml.h; memory walked as rows of R elements
// (BlockGeometry), blocks tiling it without gaps.
//
// Whole blocks of 1 to 32 16-byte vectors (a power of two) tiling aligned memory, float32,
// float16 or bfloat16 (GGUF's blocks of 32: 8 vectors of float32, 4 of 16-bit elements):
// ggml_vector_kernel. A warp's trip is K loads of 32 consecutive vectors (load k of lane l:
// vector 32 k + l of the trip), each load 32 / G whole blocks of G lanes, K <= G so that the
// trip holds at most 32 blocks:
//  1. each lane loads its K vectors (all K in flight at once) and reduces each to its key
//     (Q8_0: the largest |x|; Q4_0: the first of the largest |x|, with its signed value); the
//     G lanes of a block take the block's largest key by log2(G) shuffles (Q4_0: then a ballot
//     of the lanes holding it, the first of which hands its element over by one shuffle: ties
//     go to the first index);
//  2. lane b < 32 K / G takes block b of the trip (one shuffle a load) and makes its constants,
//     the reciprocal of d and d rounded to float16, once a block; each lane fetches its blocks'
//     (two shuffles a load);
//  3. quantizes its vectors from registers, stores them (16-byte stores), and the first lane of
//     each 32 / V gathers their mask bits by shuffles into the 32-bit word it stores (a load
//     covers 32 V elements from a multiple of 32 V: whole words, one writer each).
// Anything else (ragged rows, odd block sizes, unaligned tensors, float64): ggml_kernel, a
// warp per block, the block read twice (the second time from L1/L2), its key by shuffles,
// each 32 consecutive elements' mask bits by ballot, or-ed with atomics into zeroed scratch
// words (blocks need not start on a word), copied into the mask after.
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

// Q4_0: the value of a block's first element of largest key m, from the G lanes (aligned groups)
// that hold the block in order, each its own first of its largest (`value`): the first lane
// whose key is m hands its value over. Every lane of the warp calls it.
__device__ __forceinline__ float first_largest(uint32_t key, uint32_t m, float value, int G, int lane) {
  const int first_lane = lane & ~(G - 1);
  const unsigned group_bits = (__ballot_sync(kFullWarp, key == m) >> first_lane) &
                              (G == kWarpSize ? kFullWarp : (1u << G) - 1u);
  return __shfl_sync(kFullWarp, value, first_lane + __ffs(static_cast<int>(group_bits)) - 1);
}

// Q4_0 in bfloat16: the key of an element that is its block's first of the largest |x| by
// itself, and holds x: |x|'s 16 bits (bits 16-30: ordered as the float32 keys, a bfloat16's
// float32 bits being its own and 16 zeros), 255 less its index in the block (bits 8-15: of
// equal |x| the first is the largest) and x's sign (bit 7). A lane's elements are words of two,
// the low one first: the key of element 2 i + h of the lane is the PRMT of its word and of the
// lane's index bytes `at` (255 - the block index of its elements 4 c to 4 c + 3, c = i / 2),
// and a mask. Blocks of up to 256 elements.
__device__ __forceinline__ uint32_t packed_key(uint32_t word, uint32_t at, int i, int h) {
  const uint32_t hi = 2 * h + 1, lo = 2 * h;  // the element's bytes in the word
  const uint32_t index = 4 + (2 * i + h) % 4;  // its index byte in `at`
  return __byte_perm(word, at, (hi << 12) | (lo << 8) | (index << 4) | hi) & 0x7fffff80u;
}
// The element that a largest packed key names, as float32.
__device__ __forceinline__ float packed_key_value(uint32_t key) {
  return __uint_as_float((key & 0x7fff0000u) | ((key & 0x80u) << 24));
}

// The key of V elements (and Q4_0's first element of the largest).
template <GgmlType T, int V>
__device__ __forceinline__ uint32_t vector_key(const Pack<float, V>& in, float& value) {
  uint32_t m = 0;
  value = in.v[0];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const uint32_t b = ggml_key(in.v[j]);
    if constexpr (T == GgmlType::kQ4_0) value = b > m ? in.v[j] : value;
    m = max(m, b);
  }
  return m;
}

// One trip of the warp from element `base`. kFull: all 32 K V elements in the tensor; else the
// trip past the end (n, a multiple of the block, need not be one of 32 K V), where whole blocks
// of lanes hold no vector: they load, store and mark nothing. G = 2^shift lanes a block:
// kShift where it is known at compile time (GGUF's blocks of 32: 8 float32 vectors, 4 of 16-bit
// elements), so that the lane arithmetic and the max's shuffle loop fold; -1: `runtime_shift`.
template <typename scalar_t, GgmlType T, int K, int kShift, bool kFull>
__device__ __forceinline__ void vector_trip(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                            uint32_t* __restrict__ mask_words, int64_t n, int64_t mask_bytes,
                                            int64_t base, int runtime_shift) {
  constexpr int V = kVec<scalar_t>;
  constexpr int kLanesPerWord = 32 / V;
  constexpr int64_t kLoad = int64_t{kWarpSize} * V;  // elements a load of the warp covers
  const int shift = kShift >= 0 ? kShift : runtime_shift;
  const int G = 1 << shift;                 // lanes a block
  const int per_load = kWarpSize >> shift;  // blocks a load covers
  const int lane = threadIdx.x % kWarpSize;
  const int64_t first = base + static_cast<int64_t>(lane) * V;

  // Every load first (K in flight), then the keys, then the blocks' largest by shuffles.
  Pack<scalar_t, V> raw[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (kFull || first + k * kLoad < n) raw[k] = *reinterpret_cast<const Pack<scalar_t, V>*>(x + first + k * kLoad);
  }
  // Q4_0 in bfloat16: packed keys (packed_key), whose largest names the block's first of the
  // largest |x| and holds it, where the others take a ballot and a shuffle after the max
  constexpr bool kPacked = T == GgmlType::kQ4_0 && std::is_same_v<scalar_t, c10::BFloat16>;
  static_assert(!kPacked || V == 8, "bfloat16 vectors of 8");
  uint32_t at[2] = {0, 0};  // kPacked: the index bytes of this lane's elements 0-3 and 4-7
  if constexpr (kPacked) {
    const uint32_t top = 255u - static_cast<uint32_t>((lane & (G - 1)) * V);  // (blocks of up to 32 vectors)
    at[0] = top * 0x01010101u - 0x03020100u;
    at[1] = (top - 4u) * 0x01010101u - 0x03020100u;
  }
  Pack<float, V> in[K];
  uint32_t key[K], mk[K];
  float value[K], m[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    key[k] = 0;
    value[k] = 0.0f;
    if (kFull || first + k * kLoad < n) {
      in[k] = to_floats(raw[k]);
      if constexpr (kPacked) {
        uint32_t w[V / 2];
        memcpy(w, &raw[k], sizeof(w));
#pragma unroll
        for (int i = 0; i < V / 2; ++i) {
#pragma unroll
          for (int h = 0; h < 2; ++h) key[k] = max(key[k], packed_key(w[i], at[i / 2], i, h));
        }
      } else {
        key[k] = vector_key<T>(in[k], value[k]);
      }
    }
    mk[k] = key[k];
  }
  for (int lanes = 1; lanes < G; lanes *= 2) {
#pragma unroll
    for (int k = 0; k < K; ++k) mk[k] = max(mk[k], __shfl_xor_sync(kFullWarp, mk[k], lanes));
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if constexpr (T == GgmlType::kQ8_0) {
      m[k] = __uint_as_float(mk[k]);
    } else if constexpr (kPacked) {
      m[k] = packed_key_value(mk[k]);
    } else {
      m[k] = first_largest(key[k], mk[k], value[k], G, lane);
    }
  }
  // Block `lane` of the trip: load lane / per_load, its lanes from (lane % per_load) * G.
  float block_m = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const float a = __shfl_sync(kFullWarp, m[k], (lane & (per_load - 1)) << shift);
    if ((lane >> (5 - shift)) == k) block_m = a;
  }
  const GgmlScale own = ggml_scale<T>(block_m);

#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int owner = k * per_load + (lane >> shift);  // the lane that took this load's block
    const GgmlScale s{__shfl_sync(kFullWarp, own.inv, owner), __shfl_sync(kFullWarp, own.d16, owner)};
    const bool held = kFull || first + k * kLoad < n;
    unsigned bits = 0;
    if (held) {
      Pack<scalar_t, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        unsigned bit;
        out.v[j] = static_cast<scalar_t>(ggml_value<T>(in[k].v[j], s, bit));
        bits |= bit << j;
      }
      *reinterpret_cast<Pack<scalar_t, V>*>(y + first + k * kLoad) = out;
    }
    // The first lane of each 32 / V gathers their bits into the word it stores.
    bits = gather_lane_bits<V, kLanesPerWord>(bits);
    if (lane % kLanesPerWord == 0 && held) {
      const int64_t w = (first + k * kLoad) / 32;
      if (kFull) {
        mask_words[w] = bits;
      } else {
        store_mask_word(mask_words, mask_bytes, w, bits);
      }
    }
  }
}

template <typename scalar_t, GgmlType T, int K, int kShift>
__device__ __noinline__ void vector_trip_past_end(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                  uint32_t* __restrict__ mask_words, int64_t n, int64_t mask_bytes,
                                                  int64_t base, int shift) {
  vector_trip<scalar_t, T, K, kShift, false>(x, y, mask_words, n, mask_bytes, base, shift);
}

template <typename scalar_t, GgmlType T, int K, int kShift>
__global__ void __launch_bounds__(kThreads)
    ggml_vector_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, uint32_t* __restrict__ mask_words,
                       int64_t n, int64_t mask_bytes, int shift) {
  constexpr int64_t kTrip = int64_t{kWarpSize} * K * kVec<scalar_t>;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t trips = (n + kTrip - 1) / kTrip;
  for (int64_t t = warp; t < trips; t += nwarps) {  // the same for the whole warp
    const int64_t base = t * kTrip;
    if (base + kTrip <= n) {
      vector_trip<scalar_t, T, K, kShift, true>(x, y, mask_words, n, mask_bytes, base, shift);
    } else {
      vector_trip_past_end<scalar_t, T, K, kShift>(x, y, mask_words, n, mask_bytes, base, shift);
    }
  }
}

// Any geometry: warp w takes blocks w, w + (warps of the grid), ...
template <typename scalar_t, GgmlType T>
__global__ void __launch_bounds__(kThreads)
    ggml_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, uint32_t* __restrict__ mask_words,
                const BlockGeometry geo, int64_t total_blocks) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t blk = warp; blk < total_blocks; blk += nwarps) {  // the same for the whole warp
    const int64_t r = blk / geo.blocks_per_row, j = blk - r * geo.blocks_per_row;
    const int64_t start = r * geo.row_len + j * geo.block_size;
    const int64_t len = j + 1 == geo.blocks_per_row ? geo.last_len : geo.block_size;

    // The largest key and, Q4_0, the first index holding it: each lane's own (its elements in
    // order), then the warp's.
    uint32_t key = 0;
    int64_t at = lane < len ? lane : len;  // (a lane without elements loses every tie)
    for (int64_t i = lane; i < len; i += kWarpSize) {
      const uint32_t b = ggml_key(static_cast<float>(x[start + i]));
      if (b > key) {
        key = b;
        at = i;
      }
    }
    for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) {
      const uint32_t other = __shfl_xor_sync(kFullWarp, key, lanes);
      if constexpr (T == GgmlType::kQ4_0) {
        const int64_t other_at = __shfl_xor_sync(kFullWarp, at, lanes);
        at = other > key || (other == key && other_at < at) ? other_at : at;
      }
      key = max(key, other);
    }
    float m;
    if constexpr (T == GgmlType::kQ8_0) {
      m = __uint_as_float(key);
    } else {
      m = static_cast<float>(x[start + at]);
    }
    const GgmlScale s = ggml_scale<T>(m);

    for (int64_t base = 0; base < len; base += kWarpSize) {
      const int64_t i = base + lane;
      unsigned bit = 0;
      if (i < len) y[start + i] = static_cast<scalar_t>(ggml_value<T>(static_cast<float>(x[start + i]), s, bit));
      const unsigned ballot = __ballot_sync(kFullWarp, bit);
      if (lane == 0) or_mask_bits(mask_words, start + base, ballot);
    }
  }
}

void ggml_cuda(const GgmlJob& job) {
  const int64_t n = job.x.numel();
  const BlockGeometry& geo = job.geometry;
  const bool uniform = geo.blocks_per_row == 1 && geo.row_len == geo.block_size;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int device = job.x.get_device();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_ggml_cuda", [&] {
    const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
    scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
    auto with_type = [&](auto launch) {
      if (job.type == GgmlType::kQ8_0) {
        launch(std::integral_constant<GgmlType, GgmlType::kQ8_0>{});
      } else {
        launch(std::integral_constant<GgmlType, GgmlType::kQ4_0>{});
      }
    };
    if constexpr (!std::is_same_v<scalar_t, double>) {
      constexpr int V = kVec<scalar_t>;
      const int64_t lanes = geo.block_size / V;  // vectors a block
      if (uniform && geo.block_size % V == 0 && lanes >= 1 && lanes <= kWarpSize && (lanes & (lanes - 1)) == 0 &&
          aligned16(xp) && aligned16(yp)) {
        int shift = 0;
        while ((int64_t{1} << shift) < lanes) ++shift;
        // Whole words straight into the mask (a fresh allocation, aligned for them).
        auto* words = static_cast<uint32_t*>(job.mask.mutable_data_ptr());
        TORCH_INTERNAL_ASSERT(reinterpret_cast<uintptr_t>(words) % alignof(uint32_t) == 0);
        const int64_t mask_bytes = packed_mask_bytes(n);
        const int K = static_cast<int>(std::min<int64_t>(lanes, 4));  // K <= G
        const unsigned blocks = grid_for((n + kWarpSize * K * V - 1) / (kWarpSize * K * V), device);
        with_type([&](auto type_tag) {
          constexpr GgmlType T = decltype(type_tag)::value;
          // (GGUF's blocks of 32 elements with the shift known at compile time)
          constexpr int kGguf = V == 4 ? 3 : 2;
          auto* kernel = K == 1       ? &ggml_vector_kernel<scalar_t, T, 1, -1>
                         : K == 2     ? &ggml_vector_kernel<scalar_t, T, 2, -1>
                         : shift == kGguf ? &ggml_vector_kernel<scalar_t, T, 4, kGguf>
                                      : &ggml_vector_kernel<scalar_t, T, 4, -1>;
          launch_kernel(kernel, blocks, stream, xp, yp, words, n, mask_bytes, shift);
        });
        return;
      }
    }
    // Bits or-ed into zeroed scratch words, copied into the mask after.
    at::Tensor scratch = job.x.new_zeros({(n + 31) / 32}, job.x.options().dtype(at::kInt));
    auto* words = reinterpret_cast<uint32_t*>(scratch.mutable_data_ptr<int32_t>());
    const int64_t total_blocks = n / geo.row_len * geo.blocks_per_row;
    with_type([&](auto type_tag) {
      constexpr GgmlType T = decltype(type_tag)::value;
      launch_kernel(&ggml_kernel<scalar_t, T>, grid_for(total_blocks, device), stream, xp, yp, words, geo,
                    total_blocks);
    });
    job.mask.copy_(scratch.view(at::kByte).narrow(0, 0, packed_mask_bytes(n)));
  });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(ggml_stub, FAKEQUANT_CUDA_SLOT, &ggml_cuda);

}  // namespace gpu
}  // namespace fakequant
