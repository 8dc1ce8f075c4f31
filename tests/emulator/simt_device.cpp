// The emulated device: a device type of its own for the emulation library
// (tools/emulate.py), so that fakequant's host functions (csrc/ops) take their
// device branches there, as on a GPU. Test infrastructure, like the emulator.
//
// Tensors of device type PrivateUse1 (named "simt" by tests/test_cuda_emulated.py
// with torch.utils.rename_privateuse1_backend) live in host memory that the host
// cannot read: every allocation is its own mapping, PROT_NONE except while device
// work runs, the way a GPU's memory is out of the host's reach. Device work is
//   - a kernel launch (launch_kernel in csrc/cuda/launch.cuh opens a
//     SimtDeviceAccess around the emulator's run),
//   - a copy between the device and the host, or within the device (_copy_from,
//     what Tensor.cpu(), .to(), .copy_() and .clone() reach), and a resize,
//   - any other torch operator on these tensors: the boxed fallback below is
//     torch's own CPU fallback (at::native::cpu_fallback), which copies the
//     arguments to the host, runs the CPU kernel and copies the results back:
//     torch's CUDA kernels, for the host code, with host copies in between.
// So host code that reads device memory directly (a data pointer dereferenced
// outside a kernel: a value check without on_host(), a parameter read with
// param_ptr(...).as_float() on a device tensor) faults, and the handler below
// says so and names the allocation. The data sit at the end of their mapping,
// with a guard page after it: a kernel reading or writing past the end of a
// tensor (rounded up to 16 bytes) faults too, while a launch runs.
//
// FAKEQUANT_SIMT_PROTECT=0 leaves the memory readable (for a debugger).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "simt_device.h"

namespace simt_device {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

struct Region {
  char* base;       // the mapping: data pages, then one guard page
  size_t length;    // data pages (the guard page not included)
  char* data;       // where the tensor's bytes begin (at the end of the data pages)
  size_t size;      // bytes asked for
};

std::mutex mutex;
std::map<char*, Region>* regions = new std::map<char*, Region>();  // by data pointer; never freed
int open_count = 0;  // device work running (nested, any thread)
size_t page = 4096;
bool protect = true;

void set_all(int prot) {
  for (auto& [data, r] : *regions) {
    if (r.length > 0 && mprotect(r.base, r.length, prot) != 0) std::abort();
  }
}

void segv_handler(int sig, siginfo_t* info, void* context);
struct sigaction previous_action;

void install_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const char* env = std::getenv("FAKEQUANT_SIMT_PROTECT");
    protect = env == nullptr || std::strcmp(env, "0") != 0;
    struct sigaction action {};
    action.sa_sigaction = segv_handler;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_action);
  });
}

void say(const char* text) { (void)!write(2, text, std::strlen(text)); }

// A fault in one of the mappings: say whose, then let the previous handler (or
// the default action) end the process.
void segv_handler(int /*sig*/, siginfo_t* info, void* /*context*/) {
  char* addr = static_cast<char*>(info->si_addr);
  for (auto& [data, r] : *regions) {  // (not async-signal-safe in general; the process is ending)
    if (addr >= r.base && addr < r.base + r.length + page) {
      char line[512];
      const char* where = addr >= r.data + r.size ? "past the end of" : (addr < r.data ? "before" : "inside");
      std::snprintf(line, sizeof line,
                    "\nsimt device: %s at %p, %s an emulated device allocation of %zu bytes at %p "
                    "(fakequant host code read device memory without a copy to the host, or a kernel "
                    "went past the end of a tensor; tests/emulator/simt_device.cpp)\n",
                    open_count > 0 ? "an access during device work" : "a host access outside device work",
                    static_cast<void*>(addr), where, r.size,
                    static_cast<void*>(r.data));
      say(line);
      break;
    }
  }
  sigaction(SIGSEGV, &previous_action, nullptr);
  // returning re-runs the access under the restored handler
}

void free_region(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = regions->find(static_cast<char*>(ptr));
  TORCH_INTERNAL_ASSERT(it != regions->end(), "simt device: freeing an unknown allocation");
  munmap(it->second.base, it->second.length + page);
  regions->erase(it);
}

struct Allocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    install_handler();
    const c10::Device device(kType, 0);
    if (n == 0) return {nullptr, nullptr, &free_region, device};
    const size_t rounded = (n + 15) / 16 * 16;  // 16-byte aligned data, as 128-bit accesses need
    const size_t length = (rounded + page - 1) / page * page;
    std::lock_guard<std::mutex> lock(mutex);
    const int prot = !protect || open_count > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    void* base = mmap(nullptr, length + page, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(base != MAP_FAILED, "simt device: out of memory (", n, " bytes)");
    mprotect(static_cast<char*>(base) + length, page, PROT_NONE);  // the guard page
    char* data = static_cast<char*>(base) + length - rounded;
    (*regions)[data] = Region{static_cast<char*>(base), length, data, n};
    return {data, data, &free_region, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_region; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    SimtDeviceAccess access;
    std::memcpy(dest, src, count);
  }
};

Allocator allocator;

struct GuardImpl final : c10::impl::NoOpDeviceGuardImpl<kType> {
  c10::Device exchangeDevice(c10::Device) const override { return {kType, 0}; }
  c10::Device getDevice() const override { return {kType, 0}; }
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kType, 0));
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};

// A CPU tensor over the same bytes as a device tensor (for the copies only).
at::Tensor host_view(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kType) return t;
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(t.storage().mutable_data(), c10::Device(c10::kCPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return at::empty({0}, t.options().device(c10::kCPU))
      .set_(storage, t.storage_offset(), t.sizes(), t.strides());
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout>, std::optional<at::Device>, std::optional<bool>,
                               std::optional<at::MemoryFormat> memory_format) {
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout>, std::optional<at::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  SimtDeviceAccess access;
  host_view(dst).copy_(host_view(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

const at::Tensor& resize(const at::Tensor& self, c10::IntArrayRef size,
                         std::optional<at::MemoryFormat> memory_format) {
  SimtDeviceAccess access;  // (a growing storage copies its old bytes)
  return at::native::resize_(self, size, memory_format);
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  TORCH_CHECK(op.schema().name().rfind("aten::", 0) == 0, "simt device: ", op.schema().name(),
              " has no kernel for the emulated device; only torch's operators fall back to the CPU");
  at::native::cpu_fallback(op, stack);
}

}  // namespace
}  // namespace simt_device

void simt_device_begin_access() {
  using namespace simt_device;
  std::lock_guard<std::mutex> lock(mutex);
  if (open_count++ == 0 && protect) set_all(PROT_READ | PROT_WRITE);
}

void simt_device_end_access() {
  using namespace simt_device;
  std::lock_guard<std::mutex> lock(mutex);
  if (--open_count == 0 && protect) set_all(PROT_NONE);
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, simt_device::GuardImpl);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &simt_device::allocator);

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &simt_device::empty_memory_format);
  m.impl("empty_strided", &simt_device::empty_strided);
  m.impl("_copy_from", &simt_device::copy_from);
  m.impl("_copy_from_and_resize", &simt_device::copy_from_and_resize);
  m.impl("resize_", &simt_device::resize);
  // views: the CPU's own, which only make a new TensorImpl over the same storage
  m.impl("as_strided", &at::native::as_strided_tensorimpl);
  m.impl("view", &at::native::view);
  m.impl("_reshape_alias", &at::native::_reshape_alias);
  m.impl("unfold", &at::native::unfold);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&simt_device::fallback>());
}
