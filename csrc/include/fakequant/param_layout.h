#pragma once
// Maps the elements of a dense tensor, walked in memory order, to the entries of
// a broadcast parameter array (scale, zero point, amax: one entry per tensor,
// per channel or per broadcast block). Metadata only; shared by every backend.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <numeric>

namespace fakequant {

struct ParamLayout {
  // Dimensions in memory order, outermost first, with neighbours merged where
  // both the tensor and the parameter array step through them as one. The last
  // entry is the innermost run: the kernels loop over it with a parameter step
  // of 0 (one value for the whole run) or 1 (consecutive values), and anything
  // else falls back to a per-element lookup.
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> param_strides;

  int64_t inner_size() const { return sizes.back(); }
  int64_t inner_param_stride() const { return param_strides.back(); }

  // Parameter offset of the first element of `row`, a row being one run of the
  // innermost dimension.
  int64_t row_param_offset(int64_t row) const {
    int64_t offset = 0;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 2; d >= 0 && row > 0; --d) {
      offset += (row % sizes[d]) * param_strides[d];
      row /= sizes[d];
    }
    return offset;
  }
};

// `dense` must be non-overlapping and dense. `param_strides[d]` is how far the
// parameter array advances per step along dimension d of `dense` (0 where the
// parameters broadcast).
inline ParamLayout make_param_layout(const at::Tensor& dense, at::IntArrayRef param_strides) {
  const auto sizes = dense.sizes();
  const auto strides = dense.strides();
  c10::SmallVector<int64_t, 6> dims;
  for (int64_t d = 0; d < dense.dim(); ++d) {
    if (sizes[d] != 1) dims.push_back(d);
  }
  std::stable_sort(dims.begin(), dims.end(),
                   [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });

  ParamLayout layout;
  for (int64_t d : dims) {
    if (!layout.sizes.empty() &&
        layout.param_strides.back() == param_strides[d] * sizes[d]) {
      layout.sizes.back() *= sizes[d];
      layout.param_strides.back() = param_strides[d];
    } else {
      layout.sizes.push_back(sizes[d]);
      layout.param_strides.push_back(param_strides[d]);
    }
  }
  if (layout.sizes.empty()) {  // zero-dim or all-ones shape
    layout.sizes.push_back(1);
    layout.param_strides.push_back(0);
  }
  return layout;
}

// A dense tensor walked in memory order as [outer][channels][inner]: the
// elements of channel c are the runs of `inner` consecutive elements at
// (o * channels + c) * inner. Per-tensor is outer = channels = 1.
struct ChannelShape {
  int64_t outer = 1, channels = 1, inner = 1;
};

// `layout` from make_param_layout with the affine parameter strides (1 along
// the axis, 0 elsewhere): at most one of its dimensions steps through the
// parameters, the ones on either side are merged.
inline ChannelShape channel_shape(const ParamLayout& layout) {
  ChannelShape shape;
  int64_t axis = -1;
  const auto nd = static_cast<int64_t>(layout.sizes.size());
  for (int64_t d = 0; d < nd; ++d) {
    if (layout.param_strides[d] != 0) {
      TORCH_INTERNAL_ASSERT(axis < 0 && layout.param_strides[d] == 1);
      axis = d;
    }
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (axis < 0 || d > axis) {
      shape.inner *= layout.sizes[d];
    } else if (d == axis) {
      shape.channels = layout.sizes[d];
    } else {
      shape.outer *= layout.sizes[d];
    }
  }
  return shape;
}

}  // namespace fakequant
