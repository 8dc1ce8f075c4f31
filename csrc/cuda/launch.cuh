#pragma once
// What the CUDA launches share: grid sizes, alignment, the parameter layout
// as a kernel argument, and launch_kernel, the one way a kernel is launched.
// Everything launches on the current stream and nothing synchronises with the
// device, so CUDA graphs capture it.
//
// Two targets: nvcc for GPUs, and the host C++ compiler with
// FAKEQUANT_SIMT_EMULATOR defined (tools/emulate.py, which puts tests/emulator
// on the include path), where tests/emulator/simt_emulator.h stands in for the
// device and tests/emulator/simt_runtime.h for the few CUDA runtime calls, and
// the kernels serve the CPU tensors and the emulated device of a library of their own
// (tests/test_cuda_emulated.py compares it with the CPU kernels).
// (<ATen/core/Tensor.h>, not <ATen/ATen.h>: scratch tensors come from Tensor::new_empty and
// new_zeros; the whole of ATen costs every .cu file about 25 s of nvcc per architecture)
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <utility>

#include "fakequant/kernel_table.h"
#include "fakequant/param_layout.h"
#include "fakequant/static_switch.h"

#if defined(FAKEQUANT_SIMT_EMULATOR)
#include "simt_emulator.h"
#include "simt_runtime.h"
// The emulated kernels take the CUDA slots of the emulation library, which serve
// its CPU tensors and its emulated device's (kernel_table.h).
#define FAKEQUANT_CUDA_SLOT CUDA
#else
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#define FAKEQUANT_CUDA_SLOT CUDA
#endif

#include "kernels.cuh"

namespace fakequant {
namespace gpu {

// Tensors of fewer than 2^31 elements take 32-bit index arithmetic (Divider32).
inline bool small_index(int64_t numel) { return numel < (int64_t{1} << 31); }

inline DeviceLayout device_layout(const ParamLayout& layout, int64_t numel) {
  const int nd = static_cast<int>(layout.sizes.size());
  TORCH_CHECK_VALUE(nd <= DeviceLayout::kMaxDims,
                    "fakequant: on CUDA, parameters may broadcast over at most ",
                    DeviceLayout::kMaxDims, " separate runs of input's dimensions, got ", nd);
  DeviceLayout d{};
  d.ndim = nd;
  for (int i = 0; i < nd; ++i) {
    d.sizes[i] = layout.sizes[i];
    d.param_strides[i] = layout.param_strides[i];
    if (small_index(numel)) d.dividers[i] = make_divider32(layout.sizes[i]);
  }
  return d;
}

// The layout as ShortLayout, where it applies (fewer than 2^31 elements, at most three dimensions).
inline ShortLayout short_layout(const ParamLayout& layout, int64_t numel) {
  ShortLayout s{};
  const int nd = static_cast<int>(layout.sizes.size());
  s.applies = small_index(numel) && nd <= 3;
  if (!s.applies) return s;
  s.inner = make_divider32(layout.sizes[nd - 1]);
  s.step = static_cast<uint32_t>(layout.param_strides[nd - 1]);
  s.mid = make_divider32(nd >= 2 ? layout.sizes[nd - 2] : 1);
  s.mid_stride = nd >= 2 ? static_cast<uint32_t>(layout.param_strides[nd - 2]) : 0;
  s.outer_stride = nd == 3 ? static_cast<uint32_t>(layout.param_strides[0]) : 0;
  return s;
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

// The four dtypes' instantiations of the launch `fn<scalar_t>(const Job&)`, declared where it is
// defined (a header), each compiled in one translation unit only (fn.cu for float32,
// fn_<dtype>.cu for the others), so that a parallel build compiles them at once.
#define FAKEQUANT_EXTERN_PER_DTYPE(fn, Job)                \
  extern template void fn<float>(const Job& job);        \
  extern template void fn<double>(const Job& job);       \
  extern template void fn<at::Half>(const Job& job);     \
  extern template void fn<at::BFloat16>(const Job& job)

// kernel<<<blocks, kThreads, 0, stream>>>(args...) and the launch check; in the
// emulation build, the same kernel run by the SIMT emulator on the CPU.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), unsigned blocks, cudaStream_t stream, Args&&... args) {
#if defined(FAKEQUANT_SIMT_EMULATOR)
  (void)stream;
  const SimtDeviceAccess device_memory;  // readable for the launch (tests/emulator/simt_device.cpp)
  simt_launch(kernel, dim3(blocks), dim3(kThreads), kThreads, std::forward<Args>(args)...);
#else
  kernel<<<blocks, kThreads, 0, stream>>>(std::forward<Args>(args)...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
#endif
}

}  // namespace gpu
}  // namespace fakequant
