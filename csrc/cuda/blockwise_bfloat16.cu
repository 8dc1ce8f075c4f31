// The block-wise kernels for at::BFloat16 inputs (blockwise.cuh; float32 and the dispatch: blockwise.cu).
#include "blockwise.cuh"

namespace fakequant {
namespace gpu {

template void blockwise_typed<at::BFloat16>(const BlockwiseJob& job);

}  // namespace gpu
}  // namespace fakequant
