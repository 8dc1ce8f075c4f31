// fake_quantize_blockwise's CPU loop for double inputs (blockwise_loops.h).
#include "blockwise_loops.h"

namespace fakequant {
namespace cpu {

template void blockwise_typed<double>(const BlockwiseJob& job);

}  // namespace cpu
}  // namespace fakequant
