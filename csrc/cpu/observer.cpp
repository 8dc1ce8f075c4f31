// The CPU loop of fused_moving_avg_obs_fake_quant's observer (observer_stub):
// observe_channel of contract.h for every channel.
#include "fakequant/kernel_table.h"
#include "loop.h"

namespace fakequant {
namespace cpu {
namespace {

void observer_cpu(const ObserverJob& job) {
  const bool observe = job.x_min.defined() && job.observer_on.as_double(0) != 0.0;
  const bool quantize = job.fake_quant_on.as_double(0) != 0.0;
  const float* x_min = observe ? job.x_min.const_data_ptr<float>() : nullptr;
  const float* x_max = observe ? job.x_max.const_data_ptr<float>() : nullptr;
  float* running_min = job.running_min.mutable_data_ptr<float>();
  float* running_max = job.running_max.mutable_data_ptr<float>();
  float* scale = job.scale.mutable_data_ptr<float>();
  int32_t* zero_point = job.zero_point.mutable_data_ptr<int32_t>();
  for (int64_t i = 0; i < job.num_channels; ++i) {
    observe_channel(i, x_min, x_max, running_min, running_max, scale, zero_point, observe, quantize,
                    job.averaging_const, job.quant_min, job.quant_max, job.symmetric);
  }
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(observer_stub, CPU, &observer_cpu);

}  // namespace cpu
}  // namespace fakequant
