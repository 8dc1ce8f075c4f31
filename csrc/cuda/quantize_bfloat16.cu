// The forward kernels of the affine, min/max and amax families for at::BFloat16 inputs
// (quantize.cuh; float32 and the dispatch: quantize.cu).
#include "quantize.cuh"

namespace fakequant {
namespace gpu {

template void quantize_typed<at::BFloat16>(const QuantizeJob& job);

}  // namespace gpu
}  // namespace fakequant
