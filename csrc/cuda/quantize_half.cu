// The forward kernels of the affine, min/max and amax families for at::Half inputs
// (quantize.cuh; float32 and the dispatch: quantize.cu).
#include "quantize.cuh"

namespace fakequant {
namespace gpu {

template void quantize_typed<at::Half>(const QuantizeJob& job);

}  // namespace gpu
}  // namespace fakequant
