// The CUDA launch of fused_moving_avg_obs_fake_quant's observer (observer_stub):
// a thread per channel runs observe_channel of contract.h, reading the flags on
// the device (no synchronisation).
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

__global__ void __launch_bounds__(kThreads)
observer_kernel(const float* __restrict__ x_min, const float* __restrict__ x_max,
                float* __restrict__ running_min, float* __restrict__ running_max,
                float* __restrict__ scale, int32_t* __restrict__ zero_point, ParamPtr observer_on,
                ParamPtr fake_quant_on, int64_t channels, float averaging_const, int64_t quant_min,
                int64_t quant_max, bool symmetric) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= channels) return;
  const bool observe = x_min != nullptr && observer_on.as_double(0) != 0.0;
  const bool quantize = fake_quant_on.as_double(0) != 0.0;
  observe_channel(i, x_min, x_max, running_min, running_max, scale, zero_point, observe, quantize,
                  averaging_const, quant_min, quant_max, symmetric);
}

void observer_cuda(const ObserverJob& job) {
  const bool batch = job.x_min.defined();
  const auto blocks = static_cast<unsigned>((job.num_channels + kThreads - 1) / kThreads);
  launch_kernel(&observer_kernel, blocks, at::cuda::getCurrentCUDAStream(),
                batch ? job.x_min.const_data_ptr<float>() : static_cast<const float*>(nullptr),
                batch ? job.x_max.const_data_ptr<float>() : static_cast<const float*>(nullptr),
                job.running_min.mutable_data_ptr<float>(), job.running_max.mutable_data_ptr<float>(),
                job.scale.mutable_data_ptr<float>(), job.zero_point.mutable_data_ptr<int32_t>(),
                job.observer_on, job.fake_quant_on, job.num_channels, job.averaging_const,
                job.quant_min, job.quant_max, job.symmetric);
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(observer_stub, FAKEQUANT_CUDA_SLOT, &observer_cuda);

}  // namespace gpu
}  // namespace fakequant
