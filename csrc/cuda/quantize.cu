// The CUDA launch behind the forward of the affine, min/max and amax families
// (quantize_stub of the kernel table): one set of constants that each thread
// makes itself (one parameter), or a table made by prepare_kernel (per channel,
// any broadcast), then quantize_kernel (kernels.cuh). Also the stream-capture
// query of the kernel table.
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

template <typename scalar_t, Format F, Output O, Window W, MaskOut M, typename Params>
void launch_quantize(const QuantizeJob& job, const Params& params) {
  constexpr int V = kVec<scalar_t>;
  const int64_t n = job.x.numel();
  const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
  scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
  auto* mp = M == MaskOut::kNone ? nullptr : static_cast<uint8_t*>(job.mask.mutable_data_ptr());
  // Vector accesses where input, output and a bool mask are aligned for them
  // (y and the mask are fresh allocations; input may be a view at any offset).
  const bool vectorised = aligned16(xp) && aligned16(yp) &&
                          (M != MaskOut::kBool || reinterpret_cast<uintptr_t>(mp) % V == 0);
  const int64_t n_vec = vectorised ? n / (kWarpSize * V) * (kWarpSize * V) : 0;
  const int64_t tiles = std::max(n_vec / (kWarpSize * V), (n - n_vec + kWarpSize - 1) / kWarpSize);
  const unsigned blocks = grid_for(tiles, job.x.get_device());
  launch_kernel(&quantize_kernel<scalar_t, F, O, W, M, Params>, blocks, at::cuda::getCurrentCUDAStream(),
                xp, yp, mp, n, n_vec, params);
}

void quantize_cuda(const QuantizeJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_quantize_cuda", [&] {
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
          const int64_t count = job.num_params;
          const int64_t bytes = count * static_cast<int64_t>(sizeof(Consts<C>));
          at::Tensor table = at::empty({bytes}, job.y.options().dtype(at::kByte));
          auto* tp = reinterpret_cast<Consts<C>*>(table.mutable_data_ptr());
          const auto blocks = static_cast<unsigned>((count + kThreads - 1) / kThreads);
          launch_kernel(&prepare_kernel<C, Family>, blocks, at::cuda::getCurrentCUDAStream(), tp, count,
                        family);
          // The caching allocator orders any reuse of `table` after this
          // stream's queued kernels, so it may be freed when this returns.
          launch_quantize<scalar_t, F, O, W, M>(
              job, TableParams<C>{tp, device_layout(job.layout), job.x.numel() < (int64_t{1} << 32)});
        });
      });
}

// While the current stream is being captured into a CUDA graph nothing may
// synchronise, so value checks are skipped then.
bool capturing_cuda(const c10::Device& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(device.index()), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(quantize_stub, FAKEQUANT_CUDA_SLOT, &quantize_cuda);
FAKEQUANT_REGISTER_KERNEL(capturing_stub, FAKEQUANT_CUDA_SLOT, &capturing_cuda);

}  // namespace gpu
}  // namespace fakequant
