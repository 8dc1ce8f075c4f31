// Every operator's host function, registered for CPU and, in CUDA builds
// (setup.py defines FAKEQUANT_WITH_CUDA), for CUDA: the same function, which
// reaches the device's loop through the kernel table.
#include "fakequant/library.h"

#include "host.h"

namespace fakequant {
namespace {

void register_host_functions(torch::Library& m) {
#define FAKEQUANT_REGISTER(op) m.impl(#op, &op);
  FAKEQUANT_OPERATORS(FAKEQUANT_REGISTER)
#undef FAKEQUANT_REGISTER
}

}  // namespace

FAKEQUANT_LIBRARY_IMPL(CPU, m) { register_host_functions(m); }

#if defined(FAKEQUANT_WITH_CUDA)
FAKEQUANT_LIBRARY_IMPL(CUDA, m) { register_host_functions(m); }
#endif

#if defined(FAKEQUANT_EMULATION_LIBRARY)
// The emulation library's device (tests/emulator/simt_device.cpp): tensors that are
// not CPU tensors, so the host functions take their device branches.
FAKEQUANT_LIBRARY_IMPL(PrivateUse1, m) { register_host_functions(m); }
#endif

}  // namespace fakequant
