// fake_quantize_blockwise's CPU loop for float inputs (blockwise_loops.h).
#include "blockwise_loops.h"

namespace fakequant {
namespace cpu {

template void blockwise_typed<float>(const BlockwiseJob& job);

}  // namespace cpu
}  // namespace fakequant
