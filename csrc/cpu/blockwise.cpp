// The CPU loop of fake_quantize_blockwise (blockwise_stub): the input's dtype
// picks the loop of that dtype (blockwise_loops.h, compiled once per dtype in
// blockwise_<dtype>.cpp, so that a parallel build compiles the four at once).
#include <ATen/Dispatch.h>

#include "blockwise.h"
#include "fakequant/kernel_table.h"

namespace fakequant {
namespace cpu {
namespace {

void blockwise_cpu(const BlockwiseJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_blockwise",
                                  [&] { blockwise_typed<scalar_t>(job); });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(blockwise_stub, CPU, &blockwise_cpu);

}  // namespace cpu
}  // namespace fakequant
