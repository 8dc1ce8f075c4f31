// The CUDA launch behind the forward of the affine, min/max and amax families
// (quantize_stub of the kernel table): one set of constants that each thread
// makes itself (one parameter), or a table made by prepare_kernel (per channel,
// any broadcast), then quantize_kernel (kernels.cuh). Also the stream-capture
// query of the kernel table.
#include "quantize.cuh"

namespace fakequant {
namespace gpu {
namespace {

void quantize_cuda(const QuantizeJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_quantize_cuda",
                                  [&] { quantize_typed<scalar_t>(job); });
}

// While the current stream is being captured into a CUDA graph nothing may
// synchronise, so value checks are skipped then.
bool capturing_cuda(const c10::Device& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(device.index()), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

// float32's kernels (double, half and bfloat16: quantize_<dtype>.cu)
template void quantize_typed<float>(const QuantizeJob& job);

FAKEQUANT_REGISTER_KERNEL(quantize_stub, FAKEQUANT_CUDA_SLOT, &quantize_cuda);
FAKEQUANT_REGISTER_KERNEL(capturing_stub, FAKEQUANT_CUDA_SLOT, &capturing_cuda);

}  // namespace gpu
}  // namespace fakequant
