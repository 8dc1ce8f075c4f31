#pragma once
// fake_quantize_blockwise's CPU loop for one dtype, defined in blockwise_loops.h
// and compiled in a translation unit per dtype (blockwise_<dtype>.cpp);
// blockwise.cpp dispatches on the input's dtype.
#include "fakequant/kernel_table.h"

namespace fakequant {
namespace cpu {

template <typename scalar_t>
void blockwise_typed(const BlockwiseJob& job);

}  // namespace cpu
}  // namespace fakequant
