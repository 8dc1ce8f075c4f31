// Self-test of tests/emulator/simt_emulator.h: each case launches a small kernel and
// checks what the emulator must do (block barrier and shared memory, every warp
// intrinsic, atomics, and the errors it must report instead of hanging).
// `simt_selftest` runs every case; `simt_selftest race` runs a kernel with a
// planted race on shared memory, which ThreadSanitizer must report.
#include "simt_emulator.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

int failures = 0;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

constexpr unsigned kFull = 0xffffffffu;

// --- kernels -------------------------------------------------------------------

__global__ void block_sum_kernel(const int* in, int* out) {
  FQ_SHARED(int, buf, 256);
  const unsigned t = threadIdx.x;
  buf[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (t < s) buf[t] += buf[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = buf[0];
}

__global__ void shuffle_kernel(int* out, int width) {
  const int t = threadIdx.x, lane = t % 32;
  int* o = out + t * 6;
  o[0] = __shfl_sync(kFull, lane * 10, 3, width);
  o[1] = __shfl_up_sync(kFull, lane * 10, 2, width);
  o[2] = __shfl_down_sync(kFull, lane * 10, 5, width);
  o[3] = __shfl_xor_sync(kFull, lane * 10, 1, width);
  o[4] = static_cast<int>(__ballot_sync(kFull, lane % 3 == 0));
  o[5] = __any_sync(kFull, lane == 7) * 2 + __all_sync(kFull, lane < 32);
}

__global__ void double_shuffle_kernel(double* out) {
  const int lane = threadIdx.x % 32;
  double v = 0.5 * lane;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFull, v, offset);
  out[threadIdx.x] = v;
}

__global__ void atomics_kernel(int* counter, unsigned* bits, int* maximum, float* fsum, unsigned long long* big) {
  const unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(counter, 1);
  atomicOr(bits + g / 32 % 4, 1u << (g % 32));
  atomicMax(maximum, static_cast<int>(g));
  atomicAdd(fsum, 1.0f);
  atomicAdd(big, 1ull << 32);
}

__global__ void index_kernel(unsigned* out) {
  const unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  out[b * (blockDim.x * blockDim.y * blockDim.z) + t] = b * 1000 + t;
}

__global__ void early_exit_kernel(int* out) {
  if (threadIdx.x == 0) return;  // lane 0 leaves; the others shuffle with it
  out[threadIdx.x] = __shfl_sync(kFull, 1, 0);
}

__global__ void barrier_vs_shuffle_kernel(int* out) {
  if (threadIdx.x % 32 == 5) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_down_sync(kFull, 1, 1);
  }
}

__global__ void mask_mismatch_kernel(int* out) {
  const unsigned lane = threadIdx.x % 32;
  out[threadIdx.x] = __shfl_sync(lane < 16 ? 0x0000ffffu : kFull, 1, 0);
}

__global__ void not_in_mask_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x1u, 1, 0);  // every lane but 0 calls without itself in the mask
}

__global__ void partial_mask_kernel(int* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane < 8) out[threadIdx.x] = __shfl_sync(0xffu, static_cast<int>(lane) + 100, 7);
}

__global__ void read_outside_mask_kernel(int* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane < 8) out[threadIdx.x] = __shfl_sync(0xffu, 1, 9);
}

__global__ void misaligned_kernel(const float* in, float* out) {
  const float4 v = fq_load(reinterpret_cast<const float4*>(in + 1));
  out[threadIdx.x] = v.x;
}

__global__ void race_kernel(int* out) {
  FQ_SHARED(int, cell, 1);
  cell[0] = static_cast<int>(threadIdx.x);  // every thread writes the same cell, unsynchronised
  __syncthreads();
  out[threadIdx.x] = cell[0];
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const simt::Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

void run_all() {
  {  // barrier and shared memory, several blocks one after another
    std::vector<int> in(4 * 256), out(4, 0);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<int>(i);
    simt_launch(block_sum_kernel, dim3(4), dim3(256), 256, in.data(), out.data());
    for (int b = 0; b < 4; ++b) CHECK(out[b] == 256 * 256 * b + 255 * 256 / 2);
  }
  for (int width : {32, 16, 8}) {  // every shuffle against its definition
    std::vector<int> out(64 * 6, -1);
    simt_launch(shuffle_kernel, dim3(1), dim3(64), 1024, out.data(), width);
    for (int t = 0; t < 64; ++t) {
      const int lane = t % 32, in = lane % width, base = lane - in;
      const int* o = out.data() + t * 6;
      CHECK(o[0] == (base + 3 % width) * 10);
      CHECK(o[1] == (in >= 2 ? lane - 2 : lane) * 10);
      CHECK(o[2] == (in + 5 < width ? lane + 5 : lane) * 10);
      CHECK(o[3] == (lane ^ 1) * 10);
      CHECK(static_cast<unsigned>(o[4]) == 0x49249249u);
      CHECK(o[5] == 3);
    }
  }
  {  // 64-bit values through a shuffle
    std::vector<double> out(32);
    simt_launch(double_shuffle_kernel, dim3(1), dim3(32), 1024, out.data());
    for (double v : out) CHECK(v == 0.5 * 31 * 32 / 2);
  }
  {
    int counter = 0, maximum = -1;
    unsigned bits[4] = {0, 0, 0, 0};
    float fsum = 0;
    unsigned long long big = 0;
    simt_launch(atomics_kernel, dim3(3), dim3(128), 1024, &counter, bits, &maximum, &fsum, &big);
    CHECK(counter == 384);
    for (unsigned b : bits) CHECK(b == 0xffffffffu);
    CHECK(maximum == 383);
    CHECK(fsum == 384.0f);
    CHECK(big == 384ull << 32);
  }
  {  // 3-D grid and block indices
    std::vector<unsigned> out(2 * 3 * 2 * 4 * 2 * 2, 0);
    simt_launch(index_kernel, dim3(2, 3, 2), dim3(4, 2, 2), 1024, out.data());
    for (unsigned b = 0; b < 12; ++b) {
      for (unsigned t = 0; t < 16; ++t) CHECK(out[b * 16 + t] == b * 1000 + t);
    }
  }
  {  // a partial mask is fine when its lanes alone take part
    std::vector<int> out(32, -1);
    simt_launch(partial_mask_kernel, dim3(1), dim3(32), 1024, out.data());
    for (int l = 0; l < 8; ++l) CHECK(out[l] == 107);
    for (int l = 8; l < 32; ++l) CHECK(out[l] == -1);
  }
  std::vector<int> out(64, 0);
  std::vector<float> fin(64, 0.0f);
  const std::string exited = error_of([&] { simt_launch(early_exit_kernel, dim3(2), dim3(64), 1024, out.data()); });
  CHECK(contains(exited, "divergence") && contains(exited, "returned"));
  const std::string barrier = error_of([&] { simt_launch(barrier_vs_shuffle_kernel, dim3(1), dim3(64), 1024, out.data()); });
  CHECK(contains(barrier, "divergence"));
  const std::string mismatch = error_of([&] { simt_launch(mask_mismatch_kernel, dim3(1), dim3(32), 1024, out.data()); });
  CHECK(contains(mismatch, "divergence") || contains(mismatch, "not in"));
  const std::string self = error_of([&] { simt_launch(not_in_mask_kernel, dim3(1), dim3(32), 1024, out.data()); });
  CHECK(contains(self, "not in its mask") || contains(self, "divergence"));
  const std::string outside = error_of([&] { simt_launch(read_outside_mask_kernel, dim3(1), dim3(32), 1024, out.data()); });
  CHECK(contains(outside, "not in the mask"));
  const std::string misaligned = error_of([&] { simt_launch(misaligned_kernel, dim3(1), dim3(4), 1024, fin.data(), fin.data()); });
  CHECK(contains(misaligned, "misaligned"));
  const std::string bounds = error_of([&] { simt_launch(block_sum_kernel, dim3(1), dim3(512), 256, out.data(), out.data()); });
  CHECK(contains(bounds, "threads per block"));
  {  // the emulator still works after failed launches
    std::vector<int> in(256, 1), sum(1, 0);
    simt_launch(block_sum_kernel, dim3(1), dim3(256), 256, in.data(), sum.data());
    CHECK(sum[0] == 256);
  }
  for (const std::string* s : {&exited, &barrier, &mismatch, &self, &outside, &misaligned, &bounds}) {
    std::printf("reported: %s\n", s->c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "race") {
    std::vector<int> out(64);
    simt_launch(race_kernel, dim3(1), dim3(64), 1024, out.data());
    return 0;
  }
  run_all();
  std::printf("%d failed checks\n", failures);
  return failures == 0 ? 0 : 1;
}
