// The CUDA launch of the LSQ/LSQ+ backward (lsq_backward_stub of the kernel
// table): reads input and grad once, writes grad_input and sums the scale and
// zero-point gradients of each channel, with the rule lsq_terms of contract.h.
//
// The sums are deterministic (no atomics): the first kernel gives each unit of
// work (a warp or a block) its own slot of float64 partial sums, written in a
// fixed order; a second kernel adds each channel's partial sums in a fixed
// order. How the work is cut depends only on the tensor's shape and dtype
// alignment, not on the GPU.
//
// Two ways through a dense tensor seen as [outer][channels][inner]:
//  - rows (inner >= 32, or one channel): a warp takes a chunk of one
//    channel's elements, which come in runs of `inner` (vector loads where
//    aligned);
//  - columns (inner < 32, channels innermost as in channels_last): a thread
//    takes one column of the [outer][channels * inner] matrix over a range of
//    rows, so that a warp reads consecutive elements.
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
// One element: adds the summands grad * d and grad * z of lsq_terms to acc_s
// and acc_z, and returns grad where inside, else +0.
template <typename scalar_t, typename C>
__device__ __forceinline__ scalar_t lsq_element(scalar_t xs, scalar_t gs, const Consts<C>& p,
                                                double& acc_s, double& acc_z) {
  const LsqTerms<C> t = lsq_terms(static_cast<C>(xs), p.scale, p.lo, p.hi);
  const C gc = static_cast<C>(gs);
  acc_s = add_rn(acc_s, lsq_summand(gc, t.d));
  acc_z = add_rn(acc_z, lsq_summand(gc, t.z));
  return t.inside ? gs : static_cast<scalar_t>(0.0f);
}

// Butterfly sum: every lane ends with the same value, in a fixed order.
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = add_rn(v, __shfl_xor_sync(kFullWarp, v, offset));
  }
  return v;
}

struct RowsGrid {
  int64_t outer, channels, inner;
  int64_t chunk;   // elements of one channel per warp item, a multiple of 256
  int64_t splits;  // items per channel
};

// Item (c, s) = c * splits + s covers elements [s * chunk, (s + 1) * chunk) of
// channel c's outer * inner elements; its sums go to part_*[item]. With V > 1,
// inner is a multiple of V and the pointers are 16-byte aligned.
template <typename scalar_t, int V, bool kOuter>
__global__ void __launch_bounds__(kThreads)
    lsq_rows_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ g,
                    scalar_t* __restrict__ gi, const RowsGrid grid,
                    const AffineFamily family, double* __restrict__ part_s,
                    double* __restrict__ part_z) {
  using C = compute_t<scalar_t>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t per_channel = grid.outer * grid.inner;
  const int64_t items = grid.channels * grid.splits;
  for (int64_t item = warp; item < items; item += nwarps) {
    const int64_t c = item / grid.splits;
    const int64_t s = item - c * grid.splits;
    const Consts<C> p = family.template make<C>(c);
    const int64_t j1 = min64((s + 1) * grid.chunk, per_channel);
    double acc_s = 0.0, acc_z = 0.0;
    for (int64_t j = s * grid.chunk + lane * V; j < j1; j += kWarpSize * V) {
      int64_t e;
      if constexpr (kOuter) {
        const int64_t o = j / grid.inner;
        e = (o * grid.channels + c) * grid.inner + (j - o * grid.inner);
      } else {
        e = c * grid.inner + j;
      }
      const Pack<scalar_t, V> xv = *reinterpret_cast<const Pack<scalar_t, V>*>(x + e);
      const Pack<scalar_t, V> gv = *reinterpret_cast<const Pack<scalar_t, V>*>(g + e);
      Pack<scalar_t, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) out.v[k] = lsq_element(xv.v[k], gv.v[k], p, acc_s, acc_z);
      *reinterpret_cast<Pack<scalar_t, V>*>(gi + e) = out;
    }
    acc_s = warp_sum(acc_s);
    acc_z = warp_sum(acc_z);
    if (lane == 0) {
      part_s[item] = acc_s;
      part_z[item] = acc_z;
    }
  }
}

struct ColumnsGrid {
  int64_t outer, cols, inner;  // cols = channels * inner, the row length
  int cols_per_block;          // min(cols, kThreads)
  int rows_per_step;           // kThreads / cols_per_block rows side by side in a block
  int64_t rows_per_unit;       // rows of one unit: rows_per_step * rows per thread
  int64_t splits;              // units along the rows
  int64_t col_blocks;          // units along a row
};

// Unit (s, cb) covers rows [s * rows_per_unit, (s + 1) * rows_per_unit) of
// columns [cb * cols_per_block, (cb + 1) * cols_per_block). Column col =
// c * inner + i of unit row s sums into part_*[c * splits * inner + s * inner + i].
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    lsq_columns_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ g,
                       scalar_t* __restrict__ gi, const ColumnsGrid grid,
                       const AffineFamily family, double* __restrict__ part_s,
                       double* __restrict__ part_z) {
  using C = compute_t<scalar_t>;
  FQ_SHARED(double, shared_s, kThreads);
  FQ_SHARED(double, shared_z, kThreads);
  const int t = threadIdx.x;
  const int row_lane = t / grid.cols_per_block;
  const int col_lane = t - row_lane * grid.cols_per_block;
  const int64_t units = grid.splits * grid.col_blocks;
  const int64_t k_per_channel = grid.splits * grid.inner;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {  // the same for the whole block
    const int64_t s = u / grid.col_blocks;
    const int64_t cb = u - s * grid.col_blocks;
    const int64_t col = cb * grid.cols_per_block + col_lane;
    double acc_s = 0.0, acc_z = 0.0;
    if (row_lane < grid.rows_per_step && col < grid.cols) {
      const Consts<C> p = family.template make<C>(col / grid.inner);
      const int64_t o1 = min64((s + 1) * grid.rows_per_unit, grid.outer);
      for (int64_t o = s * grid.rows_per_unit + row_lane; o < o1; o += grid.rows_per_step) {
        const int64_t e = o * grid.cols + col;
        gi[e] = lsq_element(x[e], g[e], p, acc_s, acc_z);
      }
    }
    shared_s[t] = acc_s;
    shared_z[t] = acc_z;
    __syncthreads();
    if (t < grid.cols_per_block) {
      const int64_t col_t = cb * grid.cols_per_block + t;
      if (col_t < grid.cols) {
        double sum_s = 0.0, sum_z = 0.0;
        for (int r = 0; r < grid.rows_per_step; ++r) {
          sum_s = add_rn(sum_s, shared_s[r * grid.cols_per_block + t]);
          sum_z = add_rn(sum_z, shared_z[r * grid.cols_per_block + t]);
        }
        const int64_t c = col_t / grid.inner;
        const int64_t slot = c * k_per_channel + s * grid.inner + (col_t - c * grid.inner);
        part_s[slot] = sum_s;
        part_z[slot] = sum_z;
      }
    }
    __syncthreads();
  }
}

// One warp per channel: the channel's k partial sums (at c * k), lanes
// striding, then the butterfly; the gradients are lsq_grad_scale and
// lsq_grad_zero_point of contract.h.
__global__ void __launch_bounds__(kThreads)
    lsq_reduce_kernel(const double* __restrict__ part_s, const double* __restrict__ part_z,
                      int64_t channels, int64_t k, const ParamPtr scale, double grad_factor,
                      float* __restrict__ grad_scale, float* __restrict__ grad_zero_point) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t c = warp; c < channels; c += nwarps) {
    double sum_s = 0.0, sum_z = 0.0;
    for (int64_t i = lane; i < k; i += kWarpSize) {
      sum_s = add_rn(sum_s, part_s[c * k + i]);
      sum_z = add_rn(sum_z, part_z[c * k + i]);
    }
    sum_s = warp_sum(sum_s);
    sum_z = warp_sum(sum_z);
    if (lane == 0) {
      grad_scale[c] = lsq_grad_scale(grad_factor, sum_s);
      grad_zero_point[c] = lsq_grad_zero_point(grad_factor, scale.as_float(c), sum_z);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename scalar_t>
void launch_lsq_backward(const LsqBackwardJob& job) {
  const at::Tensor& x = job.x;
  const ChannelShape& shape = job.shape;
  const AffineFamily& family = job.family;
  const int64_t n = x.numel();
  const int device = x.get_device();
  const auto stream = at::cuda::getCurrentCUDAStream();
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  const scalar_t* gp = job.grad.const_data_ptr<scalar_t>();
  scalar_t* op = job.grad_input.mutable_data_ptr<scalar_t>();
  const auto options = x.options().dtype(at::kDouble);
  at::Tensor partial;
  int64_t k = 0;  // partial sums per channel

  if (shape.inner >= kWarpSize || shape.channels == 1) {
    // About 8192 items (two waves of warps on large GPUs), 2048 elements at least.
    RowsGrid grid{shape.outer, shape.channels, shape.inner, 0, 0};
    grid.chunk = std::max<int64_t>(2048, ceil_div(ceil_div(n, 8192), 256) * 256);
    grid.splits = ceil_div(shape.outer * shape.inner, grid.chunk);
    k = grid.splits;
    partial = x.new_empty({2, shape.channels * k}, options);
    double* ps = partial.mutable_data_ptr<double>();
    double* pz = ps + shape.channels * k;
    const unsigned blocks = grid_for(shape.channels * grid.splits, device);
    constexpr int V = kVec<scalar_t>;
    const bool vectorised = shape.inner % V == 0 && aligned16(xp) && aligned16(gp) && aligned16(op);
    auto launch = [&](auto vec_tag, auto outer_tag) {
      constexpr int kV = decltype(vec_tag)::value;
      constexpr bool kOuter = decltype(outer_tag)::value;
      launch_kernel(&lsq_rows_kernel<scalar_t, kV, kOuter>, blocks, stream, xp, gp, op, grid, family, ps, pz);
    };
    using Vec = std::integral_constant<int, V>;
    using One = std::integral_constant<int, 1>;
    using Outer = std::true_type;
    using NoOuter = std::false_type;
    if (vectorised) {
      shape.outer > 1 ? launch(Vec{}, Outer{}) : launch(Vec{}, NoOuter{});
    } else {
      shape.outer > 1 ? launch(One{}, Outer{}) : launch(One{}, NoOuter{});
    }
  } else {
    ColumnsGrid grid{};
    grid.outer = shape.outer;
    grid.inner = shape.inner;
    grid.cols = shape.channels * shape.inner;
    grid.cols_per_block = static_cast<int>(std::min<int64_t>(grid.cols, kThreads));
    grid.rows_per_step = kThreads / grid.cols_per_block;
    // Rows per thread: about 2^18 threads in all, 32 to 512 rows each (so the
    // partial sums take at most a quarter of a byte per element).
    const int64_t rows_per_thread = std::min<int64_t>(512, std::max<int64_t>(32, ceil_div(n, int64_t{1} << 18)));
    grid.rows_per_unit = grid.rows_per_step * rows_per_thread;
    grid.splits = ceil_div(shape.outer, grid.rows_per_unit);
    grid.col_blocks = ceil_div(grid.cols, grid.cols_per_block);
    k = grid.splits * shape.inner;
    partial = x.new_empty({2, shape.channels * k}, options);
    double* ps = partial.mutable_data_ptr<double>();
    double* pz = ps + shape.channels * k;
    const unsigned blocks = grid_for(grid.splits * grid.col_blocks * kWarpsPerBlock, device);
    launch_kernel(&lsq_columns_kernel<scalar_t>, blocks, stream, xp, gp, op, grid, family, ps, pz);
  }

  const double* ps = partial.const_data_ptr<double>();
  const unsigned blocks = grid_for(shape.channels, device);
  launch_kernel(&lsq_reduce_kernel, blocks, stream, ps, ps + shape.channels * k, shape.channels, k,
                family.scale, job.grad_factor, job.grad_scale.mutable_data_ptr<float>(),
                job.grad_zero_point.mutable_data_ptr<float>());
  // The caching allocator orders any reuse of `partial` after this stream's
  // queued kernels, so it may be freed when this returns.
}

void lsq_backward_cuda(const LsqBackwardJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, job.x.scalar_type(),
                                  "fakequant_lsq_backward_cuda",
                                  [&] { launch_lsq_backward<scalar_t>(job); });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(lsq_backward_stub, FAKEQUANT_CUDA_SLOT, &lsq_backward_cuda);

}  // namespace gpu
}  // namespace fakequant
