// The CUDA launch of fake_quantize_blockwise (blockwise_stub of the kernel table): the dtype's
// kernels, blockwise_typed (blockwise.cuh). float32's are compiled here, the others in
// blockwise_<dtype>.cu.
#include "blockwise.cuh"

namespace fakequant {
namespace gpu {
namespace {

void blockwise_cuda(const BlockwiseJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_blockwise_cuda",
                                  [&] { blockwise_typed<scalar_t>(job); });
}

}  // namespace

template void blockwise_typed<float>(const BlockwiseJob& job);

FAKEQUANT_REGISTER_KERNEL(blockwise_stub, FAKEQUANT_CUDA_SLOT, &blockwise_cuda);

}  // namespace gpu
}  // namespace fakequant
