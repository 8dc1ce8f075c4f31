#pragma once
// Host side of the CUDA operators: parameters to device reads, grid sizes,
// value checks, and run_quantize, the forward that every op family shares.
// Everything launches on the current stream and nothing synchronises with the
// device (unless value checks are switched on), so CUDA graphs capture it.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>

#include "../checks.h"
#include "../op_args.h"
#include "../param_layout.h"
#include "../value_checks.h"
#include "kernels.cuh"

namespace fakequant {
namespace gpu {

// A contiguous tensor whose dtype ParamPtr reads: `t` itself when it is one
// already, else a converted copy (float32 for floating types such as float8,
// float64 for other integer types; both exact, as the CPU kernels convert).
// Keep the result alive until the launch.
inline at::Tensor device_param(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
      return t.contiguous();
    default:
      return t.to(at::isFloatingType(t.scalar_type()) ? at::kFloat : at::kDouble).contiguous();
  }
}

inline ParamPtr param_ptr(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.is_contiguous());
  ParamType type = ParamType::kFloat;
  switch (t.scalar_type()) {
    case at::kFloat: type = ParamType::kFloat; break;
    case at::kDouble: type = ParamType::kDouble; break;
    case at::kHalf: type = ParamType::kHalf; break;
    case at::kBFloat16: type = ParamType::kBFloat16; break;
    case at::kByte: type = ParamType::kUInt8; break;
    case at::kChar: type = ParamType::kInt8; break;
    case at::kShort: type = ParamType::kInt16; break;
    case at::kInt: type = ParamType::kInt32; break;
    case at::kLong: type = ParamType::kInt64; break;
    default: TORCH_INTERNAL_ASSERT(false, "fakequant: no device read for ", t.scalar_type());
  }
  return ParamPtr{t.const_data_ptr(), type};
}

inline DeviceLayout device_layout(const ParamLayout& layout) {
  const int nd = static_cast<int>(layout.sizes.size());
  TORCH_CHECK_VALUE(nd <= DeviceLayout::kMaxDims,
                    "fakequant: on CUDA, parameters may broadcast over at most ",
                    DeviceLayout::kMaxDims, " separate runs of input's dimensions, got ", nd);
  DeviceLayout d{};
  d.ndim = nd;
  for (int i = 0; i < nd; ++i) {
    d.sizes[i] = layout.sizes[i];
    d.param_strides[i] = layout.param_strides[i];
  }
  return d;
}

inline int multiprocessor_count(int device) {
  static std::array<std::atomic<int>, 64> cache{};
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  int count = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (cached) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

// Blocks for `warp_tiles` units of warp work: up to two full waves of the GPU,
// with grid-stride loops past that.
inline unsigned grid_for(int64_t warp_tiles, int device) {
  const int64_t wanted = (warp_tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int64_t cap = static_cast<int64_t>(multiprocessor_count(device)) * (2048 / kThreads) * 2;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(wanted, cap)));
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// While the current stream is being captured into a CUDA graph nothing may
// synchronise, so value checks are skipped then.
inline bool stream_capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

// Whether this call checks parameter values (FAKEQUANT_CHECK_VALUES=1, not
// capturing). Call it with the input's device current.
inline bool run_value_checks() { return value_checks_enabled() && !stream_capturing(); }

template <typename scalar_t, Output O, Window W, bool kPacked, typename Params>
void launch_quantize(const at::Tensor& x, at::Tensor& y, at::Tensor& mask, const Params& params) {
  constexpr int V = kVec<scalar_t>;
  const int64_t n = x.numel();
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  scalar_t* yp = y.mutable_data_ptr<scalar_t>();
  uint8_t* mp = static_cast<uint8_t*>(mask.mutable_data_ptr());
  // Vector accesses where input, output and a bool mask are aligned for them
  // (y and the mask are fresh allocations; input may be a view at any offset).
  const bool vectorised = aligned16(xp) && aligned16(yp) &&
                          (kPacked || reinterpret_cast<uintptr_t>(mp) % V == 0);
  const int64_t n_vec = vectorised ? n / (kWarpSize * V) * (kWarpSize * V) : 0;
  const int64_t tiles = std::max(n_vec / (kWarpSize * V), (n - n_vec + kWarpSize - 1) / kWarpSize);
  const unsigned blocks = grid_for(tiles, x.get_device());
  quantize_kernel<scalar_t, O, W, kPacked, Params>
      <<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(xp, yp, mp, n, n_vec, params);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The forward of every op: y laid out like input, the mask, and the kernel run
// with the constants of `make_family(C{})` (a functor with
// `__device__ Consts<C> make(int64_t i) const` for parameter i), where
// `param_strides` maps input's dimensions onto the `num_params` parameters.
template <Output O, Window W, bool kBoolMaskAllowed, typename MakeFamily>
std::tuple<at::Tensor, at::Tensor> run_quantize(const at::Tensor& input,
                                                at::IntArrayRef param_strides, int64_t num_params,
                                                bool pack_mask, const MakeFamily& make_family) {
  TORCH_INTERNAL_ASSERT(pack_mask || kBoolMaskAllowed);
  at::Tensor y = at::empty_like(input);
  at::Tensor mask = new_mask(y, pack_mask);
  const at::Tensor x = dense_like(input, y);
  const int64_t n = x.numel();
  if (n == 0) return {y, mask};
  const ParamLayout layout = make_param_layout(y, param_strides);
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, input.scalar_type(), "fakequant_quantize_cuda", [&] {
        using C = compute_t<scalar_t>;
        const auto family = make_family(C{});
        using Family = std::decay_t<decltype(family)>;
        auto launch = [&](const auto& params) {
          using Params = std::decay_t<decltype(params)>;
          if constexpr (kBoolMaskAllowed) {
            if (!pack_mask) {
              launch_quantize<scalar_t, O, W, false, Params>(x, y, mask, params);
              return;
            }
          }
          launch_quantize<scalar_t, O, W, true, Params>(x, y, mask, params);
        };
        if (num_params == 1) {
          launch(UniformParams<C, Family>{family});
        } else {
          const int64_t bytes = num_params * static_cast<int64_t>(sizeof(Consts<C>));
          at::Tensor table = at::empty({bytes}, y.options().dtype(at::kByte));
          auto* tp = reinterpret_cast<Consts<C>*>(table.mutable_data_ptr());
          const auto blocks = static_cast<unsigned>((num_params + kThreads - 1) / kThreads);
          prepare_kernel<C, Family>
              <<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(tp, num_params, family);
          C10_CUDA_KERNEL_LAUNCH_CHECK();
          // The caching allocator orders any reuse of `table` after this
          // stream's queued kernels, so it may be freed when this returns.
          launch(TableParams<C>{tp, device_layout(layout), n < (int64_t{1} << 32)});
        }
      });
  return {y, mask};
}

}  // namespace gpu
}  // namespace fakequant
