// What limits the forward kernels short of torch.clone's bandwidth on a GPU (issue 36): the
// bytes a streaming kernel keeps in flight, or its instructions and registers. One program, no
// extension build (12 s of nvcc, 20 s in all on an H200): a copy in the loop shape of the
// kernels (K vectors of 16 bytes a lane a trip, warp tiles, grid_for's grid) at occupancies set
// by shared memory, beside the library's own per-tensor, last-axis and per-token kernels
// (csrc/cuda/kernels.cuh and blockwise.cuh, included as they are) and variants that differ from
// them in one thing: the vectors a trip, each loaded as its work begins ("in turn", as the
// kernels did before 2026-11-28) or all loaded first, the registers a thread may hold
// (__launch_bounds__), or per token the next row's prefetch to L2 (the library's since
// 2026-11-29) left out. Every variant's output and packed mask are compared bit for bit with
// the library kernel's (the program exits 2 where one differs). Times are medians of
// interleaved rounds of CUDA events; the ratio is to cudaMemcpyAsync's time for the same
// tensor (the packed mask's bytes count against the kernel). The H200's answer:
// benchmarks/results/gpu-2026-11-28-h200-loop-shapes.md.
//
//   TI=$(python -c "import torch.utils.cpp_extension as c; print(' '.join('-I' + p for p in c.include_paths()))")
//   nvcc -O3 -std=c++20 -arch=sm_90 -prec-div=true -prec-sqrt=true -ftz=false -fmad=false \
//     -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ \
//     -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -Icsrc/include -Icsrc/cuda $TI \
//     benchmarks/cuda_loop_shapes.cu -o /tmp/cuda_loop_shapes && /tmp/cuda_loop_shapes 28 25
//
// (arguments: log2 of the elements, rounds; the flags are setup.py's for the extension)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "blockwise.cuh"  // (kernels.cuh, and the block-wise kernels: per token)

using namespace fakequant;
using namespace fakequant::gpu;

#define CHECK(call)                                                                             \
  do {                                                                                          \
    const cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

// (a named namespace: nvcc's stubs cannot tell two anonymous namespaces holding kernels apart,
// this one and blockwise.cuh's)
namespace loop_shapes {

// Copy in the loop shape of quantize_kernel: a warp tile of K * 32 vectors, lane l's at
// l, l + 32, ...; all K loads first, then the K stores. (The launch's dynamic shared memory, which
// it does not use, sets the blocks an SM holds.)
template <typename T, int K>
__global__ void __launch_bounds__(kThreads) copy_tiles(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  constexpr int V = kVec<T>;
  constexpr int64_t kTile = int64_t{K} * kWarpSize * V;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t t = warp; t < n / kTile; t += nwarps) {
    const int64_t e0 = t * kTile + lane * V;
    Pack<T, V> v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = *reinterpret_cast<const Pack<T, V>*>(x + e0 + k * kWarpSize * V);
#pragma unroll
    for (int k = 0; k < K; ++k) *reinterpret_cast<Pack<T, V>*>(y + e0 + k * kWarpSize * V) = v[k];
  }
}

// quantize_kernel with K vectors a lane a trip (n a multiple of the tile): kLoadedFirst, the
// trip's loads made first (as the library's kernel makes them since 2026-11-28), or each made as
// its vector's work begins (as before): no load moves past the stores and out-of-line path of
// the vector before it.
template <typename T, int K, bool kLoadedFirst, typename Params>
__global__ void __launch_bounds__(kThreads)
    quantize_trips(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask, int64_t n,
                   const __grid_constant__ Params params) {
  constexpr int V = kVec<T>;
  constexpr int64_t kTile = int64_t{K} * kWarpSize * V;
  typename LookupFor<Params>::type lookup(params);
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t t = warp; t < n / kTile; t += nwarps) {
    const int64_t e0 = t * kTile + lane * V;
    Pack<T, V> in[K];
    if constexpr (kLoadedFirst) {
#pragma unroll
      for (int k = 0; k < K; ++k) in[k] = load_lane<V>(x, e0 + k * kWarpSize * V, n);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if constexpr (!kLoadedFirst) in[k] = load_lane<V>(x, e0 + k * kWarpSize * V, n);
      quantize_lane<V, Format::kInt, Output::kFake, Window::kQuantRange, MaskOut::kPacked>(
          x, y, mask, e0 + k * kWarpSize * V, n, in[k], lookup, params, lane);
    }
  }
}

// quantize_innermost_kernel with each vector loaded as its work begins (as before 2026-11-28).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    innermost_in_turn(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask, int64_t n,
                      int64_t threads, const __grid_constant__ TableParams<float> params) {
  constexpr int V = kVec<T>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid >= threads) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t channels = params.layout.sizes[params.layout.ndim - 1];
  const Consts<float>* first = params.table + tid % (channels / V) * V;
  Consts<float> c[V];
#pragma unroll
  for (int k = 0; k < V; ++k) c[k] = load_consts(first + k);  // (the bench's scales are all fast)
  for (int64_t v = tid; v - lane < n / V; v += 2 * threads) {
#pragma unroll
    for (int64_t e : {v * V, (v + threads) * V}) {
      quantize_lane_innermost<V, Format::kInt, Output::kFake, Window::kQuantRange, MaskOut::kPacked, true>(
          x, y, mask, e, n, load_lane<V, true>(x, e, n), c, params, lane);
    }
  }
}

// quantize_innermost_kernel with kTrip vectors a thread a trip (the library's: kInnermostTrip, 4 in
// float32, 2 in bfloat16).
template <typename T, int kTrip>
__global__ void __launch_bounds__(kThreads)
    innermost_trip(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask, int64_t n,
                   int64_t threads, const __grid_constant__ TableParams<float> params) {
  quantize_innermost<T, Format::kInt, Output::kFake, Window::kQuantRange, MaskOut::kPacked, kTrip>(x, y, mask, n,
                                                                                                 threads, params);
}

// quantize_innermost_kernel with at most 65536 / (kThreads * kMinBlocks) registers a thread.
template <typename T, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    innermost_bounded(const T* __restrict__ x, T* __restrict__ y, uint8_t* __restrict__ mask, int64_t n,
                      int64_t threads, const __grid_constant__ TableParams<float> params) {
  quantize_innermost<T, Format::kInt, Output::kFake, Window::kQuantRange, MaskOut::kPacked>(x, y, mask, n, threads,
                                                                                          params);
}

template <typename T>
__global__ void fill(T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = static_cast<T>((static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f) * 6.0f);
  }
}

__global__ void count_differences(const uint8_t* a, const uint8_t* b, int64_t n, unsigned long long* out) {
  unsigned long long d = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    d += a[i] != b[i];
  }
  if (d) atomicAdd(out, d);
}

int g_sms = 0;
int g_differ = 0;  // variants whose output or mask differ from the library kernel's

// grid_for (launch.cuh) without ATen: two waves of 8 blocks an SM, grid-stride past that.
unsigned grid_for_tiles(int64_t warp_tiles) {
  const int64_t wanted = (warp_tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t{g_sms} * 16)));
}

struct Variant {
  std::string name;
  double bytes;  // moved: read + write (+ the packed mask)
  std::function<void()> launch;
  std::vector<float> ms;
};

template <typename Kernel>
std::string occupancy(Kernel k, size_t smem) {
  int blocks = 0;
  cudaFuncAttributes a{};
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, kThreads, smem));
  CHECK(cudaFuncGetAttributes(&a, k));
  char s[96];
  std::snprintf(s, sizeof s, "%d regs, %d blocks/SM", a.numRegs, blocks);
  return s;
}

// Dynamic shared memory that leaves room for `blocks` thread blocks an SM.
size_t smem_for(int blocks) {
  int per_sm = 0;
  CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  return blocks <= 0 ? 0 : static_cast<size_t>(per_sm / blocks - 1024) / 1024 * 1024;
}

template <typename T>
void run_dtype(const char* dtype, int64_t n, int rounds, std::vector<Variant>& all) {
  constexpr int V = kVec<T>;
  T *x, *y, *y2;
  uint8_t *mask, *mask2;
  float* params_dev;  // [0]: the per-tensor scale, then zero points (int32 0) and channel scales
  const int channels = 256;
  CHECK(cudaMalloc(&x, n * sizeof(T)));
  CHECK(cudaMalloc(&y, n * sizeof(T)));
  CHECK(cudaMalloc(&y2, n * sizeof(T)));
  CHECK(cudaMalloc(&mask, n / 8));
  CHECK(cudaMalloc(&mask2, n / 8));
  CHECK(cudaMalloc(&params_dev, (1 + 2 * channels) * sizeof(float)));
  fill<<<1024, 256>>>(x, n);
  std::vector<float> host(1 + 2 * channels, 0.0f);
  host[0] = 0.02f;
  for (int c = 0; c < channels; ++c) host[1 + channels + c] = 0.02f + 0.0001f * c;
  CHECK(cudaMemcpy(params_dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  const ParamPtr scale{params_dev, ParamType::kFloat}, zero{params_dev + 1, ParamType::kInt32};
  const ParamPtr scales{params_dev + 1 + channels, ParamType::kFloat};
  const UniformParams<float, AffineFamily> uniform{AffineFamily{scale, zero, -128, 127}};
  // the last axis: [n / 256][256], a table entry a channel (prepare_kernel), the innermost kernel
  Consts<float>* table;
  CHECK(cudaMalloc(&table, channels * sizeof(Consts<float>)));
  prepare_kernel<float, AffineFamily><<<1, channels>>>(table, channels, AffineFamily{scales, zero, -128, 127});
  TableParams<float> tp{};
  tp.table = table;
  tp.layout.ndim = 2;
  tp.layout.sizes[0] = n / channels;
  tp.layout.sizes[1] = channels;
  tp.layout.param_strides[0] = 0;
  tp.layout.param_strides[1] = 1;
  tp.layout.dividers[0] = make_divider32(n / channels);
  tp.layout.dividers[1] = make_divider32(channels);
  tp.small_index = n < (int64_t{1} << 31);
  const int64_t period = std::lcm(int64_t{channels / V}, int64_t{kWarpSize});
  const int64_t most = int64_t{g_sms} * 16 * kThreads;
  const int64_t wanted = (n / V + 2 * period - 1) / (2 * period);
  const int64_t threads = period * std::max<int64_t>(1, std::min(most / period, wanted));
  const unsigned inner_blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);

  const double plain = 2.0 * n * sizeof(T), with_mask = plain + n / 8.0;
  auto add = [&](std::string name, double bytes, std::function<void()> f) {
    all.push_back({std::string(dtype) + " " + name, bytes, std::move(f), {}});
  };
  // a variant (into y2, mask2) and the library kernel it must match bit for bit (into y, mask)
  struct Check {
    std::string name;
    std::function<void()> mine, theirs;
  };
  std::vector<Check> checks;
  auto add_variant = [&](std::string name, std::function<void()> f, std::function<void()> library) {
    add(name, with_mask, f);
    checks.push_back({all.back().name, std::move(f), std::move(library)});
  };
  add("cudaMemcpyAsync", plain, [=] { CHECK(cudaMemcpyAsync(y2, x, n * sizeof(T), cudaMemcpyDeviceToDevice)); });
  auto copy_at = [&](auto kernel, int k, int blocks_per_sm) {
    const size_t smem = smem_for(blocks_per_sm);
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const unsigned grid = grid_for_tiles(n / (int64_t{k} * kWarpSize * V));
    add("copy K=" + std::to_string(k) + " (" + occupancy(kernel, smem) + ")", plain,
        [=] { kernel<<<grid, kThreads, smem>>>(x, y2, n); });
  };
  for (int b : {0, 6, 5, 4, 3, 2}) {
    copy_at(copy_tiles<T, 1>, 1, b);
    copy_at(copy_tiles<T, 2>, 2, b);
    copy_at(copy_tiles<T, 4>, 4, b);
    copy_at(copy_tiles<T, 8>, 8, b);
  }
  // the library's per-tensor kernel, as quantize.cuh launches it (n a multiple of its tile)
  auto lib = quantize_kernel<T, Format::kInt, Output::kFake, Window::kQuantRange, MaskOut::kPacked,
                             UniformParams<float, AffineFamily>>;
  const unsigned lib_grid = grid_for_tiles(n / kQuantizeTile<T>);
  const std::function<void()> per_tensor = [=] { lib<<<lib_grid, kThreads>>>(x, y, mask, n, n, uniform); };
  add("per tensor, library (" + occupancy(lib, 0) + ")", with_mask, per_tensor);
  auto trips = [&](auto kernel, int k) {
    // (k < 0: the trip's vectors loaded first)
    const unsigned grid = grid_for_tiles(n / (int64_t{std::abs(k)} * kWarpSize * V));
    add_variant("per tensor, K=" + std::to_string(std::abs(k)) + (k < 0 ? " loaded first" : " in turn") + " (" +
                    occupancy(kernel, 0) + ")",
                [=] { kernel<<<grid, kThreads>>>(x, y2, mask2, n, uniform); }, per_tensor);
  };
  using Uniform = UniformParams<float, AffineFamily>;
  trips(quantize_trips<T, 1, false, Uniform>, 1);
  trips(quantize_trips<T, 2, false, Uniform>, 2);
  trips(quantize_trips<T, 4, false, Uniform>, 4);
  trips(quantize_trips<T, 2, true, Uniform>, -2);
  trips(quantize_trips<T, 4, true, Uniform>, -4);
  trips(quantize_trips<T, 8, true, Uniform>, -8);
  auto inner = quantize_innermost_kernel<T, Format::kInt, Output::kFake, Window::kQuantRange, MaskOut::kPacked>;
  const std::function<void()> last_axis = [=] { inner<<<inner_blocks, kThreads>>>(x, y, mask, n, threads, tp); };
  add("last axis, library (" + occupancy(inner, 0) + ")", with_mask, last_axis);
  auto inner_variant = [&](std::string name, auto kernel) {
    add_variant("last axis, " + name + " (" + occupancy(kernel, 0) + ")",
                [=] { kernel<<<inner_blocks, kThreads>>>(x, y2, mask2, n, threads, tp); }, last_axis);
  };
  inner_variant("launch bounds 3", innermost_bounded<T, 3>);
  inner_variant("launch bounds 4", innermost_bounded<T, 4>);
  inner_variant("launch bounds 6", innermost_bounded<T, 6>);
  inner_variant("each vector loaded in turn", innermost_in_turn<T>);
  constexpr int other_trip = kInnermostTrip<T> == 4 ? 2 : 4;
  inner_variant(std::to_string(other_trip) + " vectors a trip loaded first", innermost_trip<T, other_trip>);

  // per token (int8, a float32 scale a row, not centered), as blockwise.cuh launches it: rows of
  // 4096 on a thread block (float32's 4096; bfloat16 takes a warp there), rows of whole warp
  // steps up to 16 on a warp (2048 float32, 4096 bfloat16), each with its next row prefetched
  // to L2 (the library's) and without
  const BlockRule<float> int8_rule{-128.0f, 127.0f, 0.0f};
  const ParamPtr no_scale_amax{params_dev, ParamType::kFloat};  // (read for two-level scales only)
  auto rows_of = [&](int64_t len) {
    LaunchGeometry geo{};
    geo.row_len = geo.block_size = geo.last_len = len;
    geo.blocks_per_row = 1;
    geo.total_blocks = n / len;
    geo.mask_bytes = n / 8;
    geo.aligned_words = true;
    geo.scale = BlockScaleRule{BlockScale::kFloat32, 127.0f, 0};
    geo.centered = false;
    return geo;
  };
  auto* words = reinterpret_cast<uint32_t*>(mask);
  auto* words2 = reinterpret_cast<uint32_t*>(mask2);
  const LaunchGeometry rows4096 = rows_of(4096), warp_rows = rows_of(kWarpSize * V * kWarpHeldSteps);
  const unsigned block_rows_grid = grid_for_tiles(rows4096.total_blocks * kWarpsPerBlock);
  const unsigned warp_rows_grid = grid_for_tiles(warp_rows.total_blocks);
  auto block_rows = blockwise_long_vector_kernel<T, Format::kInt, false, true, kThreads, true>;
  auto block_rows_np = blockwise_long_vector_kernel<T, Format::kInt, false, true, kThreads, false>;
  auto warp_rows_k = blockwise_long_vector_kernel<T, Format::kInt, false, true, kWarpSize, true>;
  auto warp_rows_np = blockwise_long_vector_kernel<T, Format::kInt, false, true, kWarpSize, false>;
  const std::string warp_len = std::to_string(warp_rows.block_size);
  const std::function<void()> block_library = [=] {
    block_rows<<<block_rows_grid, kThreads>>>(x, y, words, rows4096, int8_rule, no_scale_amax);
  };
  const std::function<void()> warp_library = [=] {
    warp_rows_k<<<warp_rows_grid, kThreads>>>(x, y, words, warp_rows, int8_rule, no_scale_amax);
  };
  add("per token 4096, a thread block a row, library (" + occupancy(block_rows, 0) + ")", with_mask, block_library);
  add_variant("per token 4096, a thread block a row, no prefetch (" + occupancy(block_rows_np, 0) + ")",
              [=] { block_rows_np<<<block_rows_grid, kThreads>>>(x, y2, words2, rows4096, int8_rule, no_scale_amax); },
              block_library);
  add("per token " + warp_len + ", a warp a row, library (" + occupancy(warp_rows_k, 0) + ")", with_mask, warp_library);
  add_variant("per token " + warp_len + ", a warp a row, no prefetch (" + occupancy(warp_rows_np, 0) + ")",
              [=] { warp_rows_np<<<warp_rows_grid, kThreads>>>(x, y2, words2, warp_rows, int8_rule, no_scale_amax); },
              warp_library);
  // rows of 8192: a group of warps a row, 16 steps of theirs (bfloat16: two warps; float32:
  // four), the library's, beside the thread block that held them before (4 or 8 of its steps)
  constexpr int kRowGroup = V == 8 ? 2 * kWarpSize : 4 * kWarpSize;
  const LaunchGeometry rows8192 = rows_of(8192);
  const unsigned group_rows_grid = grid_for_tiles(rows8192.total_blocks * (kRowGroup / kWarpSize));
  const unsigned block_rows8192_grid = grid_for_tiles(rows8192.total_blocks * kWarpsPerBlock);
  auto group_rows = blockwise_long_vector_kernel<T, Format::kInt, false, true, kRowGroup, true>;
  const std::function<void()> group_library = [=] {
    group_rows<<<group_rows_grid, kThreads>>>(x, y, words, rows8192, int8_rule, no_scale_amax);
  };
  add("per token 8192, " + std::to_string(kRowGroup / kWarpSize) + " warps a row, library (" +
          occupancy(group_rows, 0) + ")", with_mask, group_library);
  add_variant("per token 8192, a thread block a row (" + occupancy(block_rows, 0) + ")",
              [=] { block_rows<<<block_rows8192_grid, kThreads>>>(x, y2, words2, rows8192, int8_rule, no_scale_amax); },
              group_library);

  // int8 blocks of 32 and 128 with float32 scales (blockwise_vector_kernel, rows of 4096): the
  // library's trip (K = 4 vectors a lane where a block is 2 or 4 vectors, else 8) beside the other
  // K (8 where the library takes 4: two blocks a lane; 4 where it takes 8: fewer registers)
  auto blocks_of = [&](int64_t size) {
    LaunchGeometry geo = rows_of(4096);
    geo.block_size = geo.last_len = size;
    geo.blocks_per_row = 4096 / size;
    geo.total_blocks = n / size;
    geo.group_size = static_cast<int>(size / V);
    while ((1 << geo.group_shift) < geo.group_size) ++geo.group_shift;
    return geo;
  };
  // each block size's library kernel, then the other trip length against it
  auto blocks = [&](int64_t size, auto library, int k_library, auto other, int k_other) {
    const LaunchGeometry geo = blocks_of(size);
    auto grid = [&](int k) {
      return grid_for_tiles((n + int64_t{kWarpSize} * k * V - 1) / (int64_t{kWarpSize} * k * V));
    };
    const unsigned g_library = grid(k_library), g_other = grid(k_other);
    const std::string name = "int8 blocks of " + std::to_string(size) + ", K=";
    const std::function<void()> theirs = [=] {
      library<<<g_library, kThreads>>>(x, y, words, n, geo, int8_rule, no_scale_amax);
    };
    add(name + std::to_string(k_library) + ", library (" + occupancy(library, 0) + ")", with_mask, theirs);
    add_variant(name + std::to_string(k_other) + " (" + occupancy(other, 0) + ")",
                [=] { other<<<g_other, kThreads>>>(x, y2, words2, n, geo, int8_rule, no_scale_amax); }, theirs);
  };
  constexpr auto kF32 = BlockScale::kFloat32;
  if constexpr (V == 4) {  // float32: 32 = 8 vectors, 128 = 32
    blocks(32, blockwise_vector_kernel<T, Format::kInt, kF32, 8, 0>, 8,
           blockwise_vector_kernel<T, Format::kInt, kF32, 4, 0>, 4);
    blocks(128, blockwise_vector_kernel<T, Format::kInt, kF32, 8, 0>, 8,
           blockwise_vector_kernel<T, Format::kInt, kF32, 4, 0>, 4);
  } else {  // bfloat16: 32 = 4 vectors, 128 = 16
    blocks(32, blockwise_vector_kernel<T, Format::kInt, kF32, 4, 2>, 4,
           blockwise_vector_kernel<T, Format::kInt, kF32, 8, 2>, 8);
    blocks(128, blockwise_vector_kernel<T, Format::kInt, kF32, 8, 0>, 8,
           blockwise_vector_kernel<T, Format::kInt, kF32, 4, 0>, 4);
  }

  // the variants compute what the library computes, bit for bit
  unsigned long long* diff;
  CHECK(cudaMalloc(&diff, sizeof(unsigned long long)));
  auto same = [&](const char* what, std::function<void()> mine, std::function<void()> theirs) {
    CHECK(cudaMemset(y, 0xff, n * sizeof(T)));
    CHECK(cudaMemset(y2, 0, n * sizeof(T)));
    CHECK(cudaMemset(mask, 0xff, n / 8));
    CHECK(cudaMemset(mask2, 0, n / 8));
    theirs();
    mine();
    CHECK(cudaMemset(diff, 0, sizeof(unsigned long long)));
    count_differences<<<1024, 256>>>(reinterpret_cast<uint8_t*>(y), reinterpret_cast<uint8_t*>(y2), n * sizeof(T), diff);
    count_differences<<<1024, 256>>>(mask, mask2, n / 8, diff);
    unsigned long long d = 0;
    CHECK(cudaMemcpy(&d, diff, sizeof d, cudaMemcpyDeviceToHost));
    std::printf("check %s: %llu bytes differ\n", what, d);
    g_differ += d != 0;
  };
  for (const auto& c : checks) same(c.name.c_str(), c.mine, c.theirs);
  CHECK(cudaDeviceSynchronize());

  // interleaved rounds: every variant once a round
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int r = 0; r < rounds + 2; ++r) {
    for (auto& v : all) {
      if (v.name.rfind(dtype, 0) != 0) continue;
      CHECK(cudaEventRecord(a));
      v.launch();
      CHECK(cudaEventRecord(b));
      CHECK(cudaEventSynchronize(b));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, a, b));
      if (r >= 2) v.ms.push_back(ms);  // (two rounds of warm-up)
    }
  }
  CHECK(cudaGetLastError());
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  CHECK(cudaFree(y2));
  CHECK(cudaFree(mask));
  CHECK(cudaFree(mask2));
  CHECK(cudaFree(table));
  CHECK(cudaFree(params_dev));
  CHECK(cudaFree(diff));
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace loop_shapes

using namespace loop_shapes;

int main(int argc, char** argv) {
  const int log2n = argc > 1 ? std::atoi(argv[1]) : 28;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  const int64_t n = int64_t{1} << log2n;
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs; 2^%d elements, median of %d interleaved rounds\n", prop.name, g_sms, log2n, rounds);
  std::vector<Variant> all;
  run_dtype<float>("float32", n, rounds, all);
  run_dtype<c10::BFloat16>("bfloat16", n, rounds, all);
  std::printf("\n| kernel | ms | TB/s | time / memcpy's |\n|---|---:|---:|---:|\n");
  double memcpy_ms = 0;
  for (const auto& v : all) {
    const double ms = median(v.ms);
    if (v.name.find("cudaMemcpyAsync") != std::string::npos) memcpy_ms = ms;
    // the ratio compares times at equal tensor bytes: the mask's bytes count against the kernel
    std::printf("| %s | %.3f | %.2f | %.3f |\n", v.name.c_str(), ms, v.bytes / ms / 1e9, ms / memcpy_ms);
  }
  return g_differ == 0 ? 0 : 2;
}
