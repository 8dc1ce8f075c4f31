// The forward kernels of the affine, min/max and amax families for double inputs
// (quantize.cuh; float32 and the dispatch: quantize.cu).
#include "quantize.cuh"

namespace fakequant {
namespace gpu {

template void quantize_typed<double>(const QuantizeJob& job);

}  // namespace gpu
}  // namespace fakequant
