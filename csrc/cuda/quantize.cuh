#pragma once
// The forward kernels of the affine, min/max and amax families for one dtype
// (quantize_typed<scalar_t>): every rule combination with_quantize_rule names,
// each with one set of constants or a per-channel table. Instantiated once per
// dtype, each in a translation unit of its own (quantize.cu: float; the others
// in quantize_<dtype>.cu), so that a parallel build compiles them at once.
#include <limits>
#include <numeric>

#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

// Threads of quantize_innermost_kernel (kernels.cuh) for the table's layout: the channels
// innermost with consecutive entries and nothing else stepping through them, a multiple of V;
// 0 where that is not the layout, or where channels / V threads would be more than the grid.
// One trip of kTrip vectors a thread where the tensor is small, grid_for's grid above.
template <int V, int kTrip>
int64_t innermost_threads(const ParamLayout& layout, int64_t n, int device) {
  const auto nd = layout.sizes.size();
  if (layout.param_strides[nd - 1] != 1 || layout.sizes[nd - 1] % V != 0) return 0;
  for (size_t d = 0; d + 1 < nd; ++d) {
    if (layout.param_strides[d] != 0) return 0;
  }
  const int64_t period = std::lcm(layout.sizes[nd - 1] / V, int64_t{kWarpSize});
  const int64_t most = int64_t{grid_for(std::numeric_limits<int64_t>::max() / 2, device)} * kThreads;
  if (period > most) return 0;
  const int64_t trip = int64_t{kTrip} * period;  // a trip of each thread's vectors
  const int64_t wanted = (n / V + trip - 1) / trip;
  return period * std::max<int64_t>(1, std::min(most / period, wanted));
}

// Whether input, output and a bool mask are aligned for vector accesses of V elements
// (y and the mask are fresh allocations; input may be a view at any offset).
template <int V, MaskOut M>
bool vector_aligned(const void* x, const void* y, const void* mask) {
  return aligned16(x) && aligned16(y) && (M != MaskOut::kBool || reinterpret_cast<uintptr_t>(mask) % V == 0);
}

// Whether quantize_rows_kernel (kernels.cuh) takes the layout (float compute: the caller's): a
// short layout whose innermost run shares one parameter (step 0) and is a multiple of V long,
// at most kTileRows rows in any tile, and the tensors aligned for vectors.
template <typename scalar_t, MaskOut M>
bool rows_kernel_applies(const QuantizeJob& job, const ShortLayout& layout) {
  constexpr int V = kVec<scalar_t>;
  if (!layout.applies || layout.step != 0) return false;
  const int64_t inner = layout.inner.d;
  // a tile's rows: at most kRowsTile / inner + 2 (a partial row at each end)
  if (inner % V != 0 || kRowsTile<scalar_t> / inner + 2 > kTileRows) return false;
  return vector_aligned<V, M>(job.x.const_data_ptr(), job.y.const_data_ptr(),
                              M == MaskOut::kNone ? nullptr : job.mask.const_data_ptr());
}

template <typename scalar_t, Format F, Output O, Window W, MaskOut M, typename Family>
void launch_quantize_rows(const QuantizeJob& job, const RowParams<Family>& params) {
  constexpr int64_t kTile = kRowsTile<scalar_t>;
  const int64_t n = job.x.numel();
  const int64_t n_vec = n / kTile * kTile;
  const int64_t warp_tiles = std::max(n_vec / kTile * kWarpsPerBlock, (n - n_vec + kWarpSize - 1) / kWarpSize);
  auto* mp = M == MaskOut::kNone ? nullptr : static_cast<uint8_t*>(job.mask.mutable_data_ptr());
  launch_kernel(&quantize_rows_kernel<scalar_t, F, O, W, M, Family>, grid_for(warp_tiles, job.x.get_device()),
                at::cuda::getCurrentCUDAStream(), job.x.const_data_ptr<scalar_t>(),
                job.y.mutable_data_ptr<scalar_t>(), mp, n, n_vec, params);
}

template <typename scalar_t, Format F, Output O, Window W, MaskOut M, typename Params>
void launch_quantize(const QuantizeJob& job, const Params& params) {
  constexpr int V = kVec<scalar_t>;
  const int64_t n = job.x.numel();
  const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
  scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
  auto* mp = M == MaskOut::kNone ? nullptr : static_cast<uint8_t*>(job.mask.mutable_data_ptr());
  const bool vectorised = vector_aligned<V, M>(xp, yp, mp);
  if constexpr (std::is_same_v<Params, TableParams<float>>) {
    const int64_t threads =
        vectorised ? innermost_threads<V, kInnermostTrip<scalar_t>>(job.layout, n, job.x.get_device()) : 0;
    if (threads > 0) {
      const auto blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
      launch_kernel(&quantize_innermost_kernel<scalar_t, F, O, W, M>, blocks, at::cuda::getCurrentCUDAStream(), xp,
                    yp, mp, n, threads, params);
      return;
    }
  }
  constexpr int64_t kTile = kQuantizeTile<scalar_t>;
  const int64_t n_vec = vectorised ? n / kTile * kTile : 0;
  const int64_t tiles = std::max(n_vec / kTile, (n - n_vec + kWarpSize - 1) / kWarpSize);
  const unsigned blocks = grid_for(tiles, job.x.get_device());
  launch_kernel(&quantize_kernel<scalar_t, F, O, W, M, Params>, blocks, at::cuda::getCurrentCUDAStream(),
                xp, yp, mp, n, n_vec, params);
}

}  // namespace

template <typename scalar_t>
void quantize_typed(const QuantizeJob& job) {
  using C = compute_t<scalar_t>;
  with_quantize_rule(job, [&](const auto& family, auto f, auto o, auto w, auto m) {
    using Family = std::decay_t<decltype(family)>;
    constexpr Format F = decltype(f)::value;
    constexpr Output O = decltype(o)::value;
    constexpr Window W = decltype(w)::value;
    constexpr MaskOut M = decltype(m)::value;
    if (job.num_params == 1) {
      launch_quantize<scalar_t, F, O, W, M>(job, UniformParams<C, Family>{family});
      return;
    }
    const ShortLayout rows = short_layout(job.layout, job.x.numel());
    if constexpr (std::is_same_v<C, float>) {
      if (rows_kernel_applies<scalar_t, M>(job, rows)) {
        launch_quantize_rows<scalar_t, F, O, W, M>(job, RowParams<Family>{family, rows});
        return;
      }
    }
    const int64_t count = job.num_params;
    const int64_t bytes = count * static_cast<int64_t>(sizeof(Consts<C>));
    at::Tensor table = job.y.new_empty({bytes}, job.y.options().dtype(at::kByte));
    auto* tp = reinterpret_cast<Consts<C>*>(table.mutable_data_ptr());
    const auto blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
    launch_kernel(&prepare_kernel<C, Family>, blocks, at::cuda::getCurrentCUDAStream(), tp, count,
                  family);
    // The caching allocator orders any reuse of `table` after this
    // stream's queued kernels, so it may be freed when this returns.
    launch_quantize<scalar_t, F, O, W, M>(
        job, TableParams<C>{tp, device_layout(job.layout, job.x.numel()), small_index(job.x.numel()), rows});
  });
}

FAKEQUANT_EXTERN_PER_DTYPE(quantize_typed, QuantizeJob);

}  // namespace gpu
}  // namespace fakequant
