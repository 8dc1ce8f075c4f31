#pragma once
// The CUDA runtime calls of the launch code (csrc/cuda/*.cu), for the
// emulation build (FAKEQUANT_SIMT_EMULATOR; see simt_emulator.h): tensors are
// CPU tensors, everything is synchronous, there is one stream and it is never
// being captured. The number of multiprocessors, which sets the grid cap of
// grid_for (csrc/cuda/launch.cuh), comes from FAKEQUANT_SIMT_SMS (default 1:
// a grid of at most 16 blocks, so that modest tensors already take several
// grid-stride steps), read at every launch so that a test can change it.
#if defined(__CUDACC__) || !defined(FAKEQUANT_SIMT_EMULATOR)
#error "simt_runtime.h is for the emulation build only"
#endif

#include <c10/util/Exception.h>

#include "simt_device.h"

#include <cstdlib>
#include <string>

using cudaError_t = int;
constexpr cudaError_t cudaSuccess = 0;
using cudaStream_t = struct simt_stream*;

enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone, cudaStreamCaptureStatusActive };

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int /*device*/) {
  TORCH_INTERNAL_ASSERT(attr == cudaDevAttrMultiProcessorCount);
  const char* env = std::getenv("FAKEQUANT_SIMT_SMS");
  *value = env != nullptr ? std::atoi(env) : 1;
  TORCH_CHECK(*value >= 1, "FAKEQUANT_SIMT_SMS must be a positive integer, got ", env);
  return cudaSuccess;
}

inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

#define C10_CUDA_CHECK(expr) TORCH_CHECK((expr) == cudaSuccess, "simt runtime: ", #expr, " failed")
#define C10_CUDA_KERNEL_LAUNCH_CHECK() \
  do {                                 \
  } while (0)

namespace at {
namespace cuda {
struct SimtStream {
  operator cudaStream_t() const { return nullptr; }
};
inline SimtStream getCurrentCUDAStream(int /*device*/ = -1) { return {}; }
}  // namespace cuda
}  // namespace at
