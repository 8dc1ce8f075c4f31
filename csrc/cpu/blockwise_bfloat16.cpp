// fake_quantize_blockwise's CPU loop for at::BFloat16 inputs (blockwise_loops.h).
#include "blockwise_loops.h"

namespace fakequant {
namespace cpu {

template void blockwise_typed<at::BFloat16>(const BlockwiseJob& job);

}  // namespace cpu
}  // namespace fakequant
