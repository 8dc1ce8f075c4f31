#pragma once
// The CPU loop of fake_quantize_blockwise (blockwise_stub), for the translation
// units of one dtype each (blockwise_<dtype>.cpp; blockwise.cpp dispatches): blocks of
// block_size consecutive elements along the last dimension, each quantized with
// its own scale from amax = max |x| over the block, found in the same pass (the
// block is read from memory once; the second read hits L1). The geometry, the
// block scale, the degenerate block and the element rule are contract.h's.
//
// Memory is walked as rows of R elements (BlockGeometry). Tiles are
// whole rows and start on a byte of the packed mask, so every block lies in one
// tile and every tile owns its mask bytes. Within a tile, simple loops over
// L1-resident data: the amax of every block (the integer max of |x|'s bit
// patterns: branch-free, vectorised, and NaN propagates because NaN's patterns
// exceed inf's), the scales of every block (vectorised across blocks), the
// elements. Where such a tile would exceed kMaxTile elements (blocks or ragged
// rows of thousands of elements), the amax of every block is found first, in
// a pass of its own, and the elements follow in tiles of 2048 (x is read twice).
#include <numeric>
#include <vector>

#include "blockwise.h"
#include "fakequant/kernel_table.h"
#include "fakequant/static_switch.h"
#include "loop.h"

namespace fakequant {
namespace cpu {
namespace {

// The contract's geometry and the rows of a tile.
struct Geometry : BlockGeometry {
  int64_t rows_per_tile;  // a multiple of 8 / gcd(R, 8): tiles start on a mask byte
};

// The rules of one call: the element rule's constants (passed by value into the
// loops: a copy in registers, no reloads after every store) and the block scales'.
template <typename C>
struct BlockwiseRules {
  BlockRule<C> rule;
  BlockScaleRule scale;
  float g;  // the per-tensor scale of two-level scales (else 1)
  bool centered;  // blocks quantized about their centre (contract.h, centered blocks)
};

// The scales of n blocks and whether each is degenerate; any_degenerate ors them.
inline void block_scales(const float* __restrict__ amax, float* __restrict__ scale,
                         uint8_t* __restrict__ degenerate, int64_t n, const BlockScaleRule& r,
                         float g, uint8_t& any_degenerate) {
  static_switch<BlockScale, BlockScale::kFloat32, BlockScale::kE4M3, BlockScale::kE8M0>(
      r.kind, [&](auto kind) {
        constexpr BlockScale K = decltype(kind)::value;
        for (int64_t i = 0; i < n; ++i) scale[i] = blockwise_scale<K>(amax[i], r, g);
        uint8_t any = 0;
        for (int64_t i = 0; i < n; ++i) {
          const uint8_t d = blockwise_degenerate(amax[i], scale[i], g, K);
          degenerate[i] = d;
          any |= d;
        }
        any_degenerate = any;
      });
}

// max |x| over a block, in float32: the largest bit pattern of |fp32(x)|.
template <int kLen, typename scalar_t>
inline float block_amax(const scalar_t* __restrict__ x, int64_t len) {
  const int64_t n = kLen > 0 ? kLen : len;
  uint32_t m = 0;
  for (int64_t k = 0; k < n; ++k) {
    const uint32_t b = abs_bits(static_cast<float>(x[k]));
    m = b > m ? b : m;
  }
  return bits_to_float(m);
}

// The centre and amax of a centered block, from its elements' order keys (branch-free,
// vectorised: two integer max reductions).
template <typename scalar_t>
inline Centered block_centered(const scalar_t* __restrict__ x, int64_t len) {
  uint32_t hi = 0, neg = 0;
  for (int64_t k = 0; k < len; ++k) {
    const float v = static_cast<float>(x[k]);
    const uint32_t a = order_key(v), b = order_key(-v);
    hi = a > hi ? a : hi;
    neg = b > neg ? b : neg;
  }
  return centered_block(hi, neg);
}

// One element of a block with scale s (the mask byte in m).
template <Format F, typename scalar_t, typename C>
inline scalar_t quantize_element(scalar_t x, C s, uint8_t& m, const BlockRule<C> c) {
  return static_cast<scalar_t>(blockwise_value<F>(static_cast<C>(x), s, c, m));
}

// A block of kLen (or len) elements sharing the scale s.
template <Format F, int kLen, typename scalar_t, typename C>
inline void quantize_block(const scalar_t* __restrict__ x, C s, scalar_t* __restrict__ y,
                           uint8_t* __restrict__ m, int64_t len, const BlockRule<C> c) {
  const int64_t n = kLen > 0 ? kLen : len;
  for (int64_t k = 0; k < n; ++k) y[k] = quantize_element<F>(x[k], s, m[k], c);
}

// Two neighbouring blocks of kLen in one loop: GCC vectorises a 16-element
// block with 128-bit vectors only, a 32-element loop with the widest.
template <Format F, int kLen, typename scalar_t, typename C>
inline void quantize_block_pair(const scalar_t* __restrict__ x, C s0, C s1,
                                scalar_t* __restrict__ y, uint8_t* __restrict__ m,
                                const BlockRule<C> c) {
  for (int64_t k = 0; k < 2 * kLen; ++k) {
    y[k] = quantize_element<F>(x[k], k < kLen ? s0 : s1, m[k], c);
  }
}

// A run of elements, each with its own scale s[k].
template <Format F, typename scalar_t, typename C>
inline void quantize_run(const scalar_t* __restrict__ x, const C* __restrict__ s,
                         scalar_t* __restrict__ y, uint8_t* __restrict__ m, int64_t n,
                         const BlockRule<C> c) {
  for (int64_t k = 0; k < n; ++k) y[k] = quantize_element<F>(x[k], s[k], m[k], c);
}

// A run of elements of centered blocks: each with its own scale s[k] and centre b[k].
template <Format F, typename scalar_t, typename C>
inline void quantize_run_centered(const scalar_t* __restrict__ x, const C* __restrict__ s,
                                  const C* __restrict__ b, scalar_t* __restrict__ y,
                                  uint8_t* __restrict__ m, int64_t n, const BlockRule<C> c) {
  for (int64_t k = 0; k < n; ++k) {
    const C v = blockwise_value<F>(sub_rn(static_cast<C>(x[k]), b[k]), s[k], c, m[k]);
    y[k] = static_cast<scalar_t>(add_rn(v, b[k]));
  }
}

template <typename C>
inline void fill(C* __restrict__ p, int64_t n, C v) {
  for (int64_t k = 0; k < n; ++k) p[k] = v;
}

// A degenerate block (degenerate_value for each element).
template <typename scalar_t, typename C>
inline void zero_block(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                       uint8_t* __restrict__ m, int64_t n) {
  for (int64_t k = 0; k < n; ++k) y[k] = static_cast<scalar_t>(degenerate_value(static_cast<C>(x[k]), m[k]));
}

// A degenerate centered block: its centre (degenerate_value of x - b, plus b).
template <typename scalar_t, typename C>
inline void zero_block_centered(const scalar_t* __restrict__ x, C b, scalar_t* __restrict__ y,
                                uint8_t* __restrict__ m, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    y[k] = static_cast<scalar_t>(add_rn(degenerate_value(sub_rn(static_cast<C>(x[k]), b), m[k]), b));
  }
}

template <typename C>
struct Scratch {
  std::vector<float> amax, scale, center;  // per block (center: centered blocks only)
  std::vector<uint8_t> degenerate;         // per block
  std::vector<C> element_scale;            // per element (blocks of a run-time size only)
  std::vector<C> element_center;           // per element (centered blocks only)
  std::vector<uint8_t> mask;               // per element, 0 or 1
  Scratch(int64_t blocks, int64_t elements, bool per_element_scale, bool centered)
      : amax(blocks),
        scale(blocks),
        center(centered ? blocks : 0),
        degenerate(blocks),
        element_scale(per_element_scale ? elements : 0),
        element_center(centered ? elements : 0),
        mask(elements) {}
};

// `rows` rows of x/y; the mask bytes go to scratch.mask. Simple loops over
// L1-resident data, each of which vectorises: the amax of every block, the
// scale of every block (across blocks), the elements, and the rare degenerate
// blocks again. kBS > 0: every row is one block of kBS elements (a compile-time
// trip count). kBS == 0: any geometry; the scales are spread over the elements
// first, so that the elements are one run whatever the block size.
template <typename scalar_t, Format F, int kBS, bool kCentered>
FAKEQUANT_CPU_CLONES void blockwise_tile(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                         int64_t rows, const Geometry& geo,
                                         const BlockwiseRules<compute_t<scalar_t>>& c,
                                         Scratch<compute_t<scalar_t>>& sc) {
  using C = compute_t<scalar_t>;
  const int64_t R = geo.row_len, bs = kBS > 0 ? kBS : geo.block_size;
  const int64_t nb = kBS > 0 ? 1 : geo.blocks_per_row, last = kBS > 0 ? kBS : geo.last_len;
  const int64_t nblocks = rows * nb;
  float* __restrict__ amax = sc.amax.data();
  float* __restrict__ scale = sc.scale.data();
  uint8_t* __restrict__ degenerate = sc.degenerate.data();
  uint8_t* __restrict__ mask = sc.mask.data();

  static_assert(!kCentered || kBS == 0, "centered blocks take the run-time geometry");
  if constexpr (kCentered) {
    float* __restrict__ center = sc.center.data();
    for (int64_t r = 0, i = 0; r < rows; ++r) {
      const scalar_t* xr = x + r * R;
      for (int64_t j = 0; j < nb; ++j, ++i) {
        const Centered cb = block_centered(xr + j * bs, j + 1 < nb ? bs : last);
        center[i] = cb.center;
        amax[i] = cb.amax;
      }
    }
  } else if constexpr (kBS > 0) {
    for (int64_t i = 0; i < nblocks; ++i) amax[i] = block_amax<kBS>(x + i * kBS, kBS);
  } else {
    for (int64_t r = 0, i = 0; r < rows; ++r) {
      const scalar_t* xr = x + r * R;
      for (int64_t j = 0; j + 1 < nb; ++j) amax[i++] = block_amax<0>(xr + j * bs, bs);
      amax[i++] = block_amax<0>(xr + (nb - 1) * bs, last);
    }
  }

  // The next tile's amax pass would read x from memory in one burst, with the
  // elements pass in between leaving the hardware prefetcher idle: ask for the
  // next tile now, while this one computes from L1 (about 6% faster at 2^24
  // float32; prefetches past the end of x are harmless).
  {
    const uintptr_t next = reinterpret_cast<uintptr_t>(x + rows * R);
    const int64_t bytes =
        std::min<int64_t>(rows * R * static_cast<int64_t>(sizeof(scalar_t)), 16384);
    for (int64_t b = 0; b < bytes; b += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(next + b), 0, 3);
    }
  }

  const BlockRule<C> rule = c.rule;
  uint8_t any_degenerate = 0;
  block_scales(amax, scale, degenerate, nblocks, c.scale, c.g, any_degenerate);

  if constexpr (kBS > 0 && kBS < 32) {
    int64_t i = 0;
    for (; i + 1 < nblocks; i += 2) {
      const int64_t e = i * kBS;
      quantize_block_pair<F, kBS>(x + e, static_cast<C>(scale[i]), static_cast<C>(scale[i + 1]),
                                  y + e, mask + e, rule);
    }
    if (i < nblocks) {
      const int64_t e = i * kBS;
      quantize_block<F, kBS>(x + e, static_cast<C>(scale[i]), y + e, mask + e, kBS, rule);
    }
  } else if constexpr (kBS > 0) {
    for (int64_t i = 0; i < nblocks; ++i) {
      const int64_t e = i * kBS;
      quantize_block<F, kBS>(x + e, static_cast<C>(scale[i]), y + e, mask + e, kBS, rule);
    }
  } else {
    C* __restrict__ es = sc.element_scale.data();
    for (int64_t r = 0, i = 0; r < rows; ++r) {
      C* er = es + r * R;
      for (int64_t j = 0; j + 1 < nb; ++j) fill(er + j * bs, bs, static_cast<C>(scale[i++]));
      fill(er + (nb - 1) * bs, last, static_cast<C>(scale[i++]));
    }
    if constexpr (kCentered) {
      C* __restrict__ ec = sc.element_center.data();
      const float* __restrict__ center = sc.center.data();
      for (int64_t r = 0, i = 0; r < rows; ++r) {
        C* cr = ec + r * R;
        for (int64_t j = 0; j + 1 < nb; ++j) fill(cr + j * bs, bs, static_cast<C>(center[i++]));
        fill(cr + (nb - 1) * bs, last, static_cast<C>(center[i++]));
      }
      quantize_run_centered<F>(x, es, ec, y, mask, rows * R, rule);
    } else {
      quantize_run<F>(x, es, y, mask, rows * R, rule);
    }
  }

  if (any_degenerate) {
    for (int64_t r = 0, i = 0; r < rows; ++r) {
      for (int64_t j = 0; j < nb; ++j, ++i) {
        if (degenerate[i]) {
          const int64_t e = r * R + j * bs;
          if constexpr (kCentered) {
            zero_block_centered<scalar_t, C>(x + e, static_cast<C>(sc.center[i]), y + e, mask + e,
                                             j + 1 < nb ? bs : last);
          } else {
            zero_block<scalar_t, C>(x + e, y + e, mask + e, j + 1 < nb ? bs : last);
          }
        }
      }
    }
  }
}

template <typename scalar_t, Format F, int kBS, bool kCentered = false>
void blockwise_loop(const at::Tensor& x, at::Tensor& y, at::Tensor& mask, const Geometry& geo,
                    const BlockwiseRules<compute_t<scalar_t>>& c) {
  const int64_t n = x.numel();
  const int64_t R = geo.row_len;
  const int64_t rows = n / R;
  const int64_t tile_rows = std::min(geo.rows_per_tile, rows);
  const int64_t ntiles = (rows + tile_rows - 1) / tile_rows;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (tile_rows * R));
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  scalar_t* yp = y.mutable_data_ptr<scalar_t>();
  uint8_t* mp = mask.mutable_data_ptr<uint8_t>();
  at::parallel_for(0, ntiles, grain, [&](int64_t t0, int64_t t1) {
    Scratch<compute_t<scalar_t>> sc(tile_rows * geo.blocks_per_row, tile_rows * R, kBS == 0, kCentered);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * tile_rows, nrows = std::min(rows, r0 + tile_rows) - r0;
      const int64_t e0 = r0 * R;  // a multiple of 8
      blockwise_tile<scalar_t, F, kBS, kCentered>(xp + e0, yp + e0, nrows, geo, c, sc);
      pack_bits(sc.mask.data(), nrows * R, mp + e0 / 8);
    }
  });
}

// --- long blocks and long ragged rows: amax first, then the elements --------------

template <typename scalar_t>
FAKEQUANT_CPU_CLONES float long_block_amax(const scalar_t* __restrict__ x, int64_t len) {
  return block_amax<0>(x, len);
}

// Elements [e0, e1) of memory, through the blocks they meet.
template <typename scalar_t, Format F>
FAKEQUANT_CPU_CLONES void long_blocks_tile(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                           uint8_t* __restrict__ mask, int64_t e0, int64_t e1,
                                           const Geometry& geo, const float* scale,
                                           const uint8_t* degenerate, const float* center,
                                           const BlockRule<compute_t<scalar_t>> rule) {
  using C = compute_t<scalar_t>;
  const int64_t R = geo.row_len, bs = geo.block_size, nb = geo.blocks_per_row;
  int64_t row = e0 / R, col = e0 - row * R, j = col / bs;
  for (int64_t e = e0; e < e1;) {
    const int64_t block_end = std::min(R, (j + 1) * bs);  // a column
    const int64_t len = std::min(e1 - e, block_end - col);
    const int64_t b = row * nb + j;
    if (center != nullptr) {  // centered blocks (contract.h)
      const C cb = static_cast<C>(center[b]);
      if (degenerate[b]) {
        zero_block_centered<scalar_t, C>(x + e, cb, y + e, mask + (e - e0), len);
      } else {
        for (int64_t k = 0; k < len; ++k) {
          const C v = blockwise_value<F>(sub_rn(static_cast<C>(x[e + k]), cb), static_cast<C>(scale[b]),
                                         rule, mask[e - e0 + k]);
          y[e + k] = static_cast<scalar_t>(add_rn(v, cb));
        }
      }
    } else if (degenerate[b]) {
      zero_block<scalar_t, C>(x + e, y + e, mask + (e - e0), len);
    } else {
      quantize_block<F, 0>(x + e, static_cast<C>(scale[b]), y + e, mask + (e - e0), len, rule);
    }
    e += len;
    col += len;
    if (col == block_end) {
      ++j;
      if (col == R) {
        col = 0;
        j = 0;
        ++row;
      }
    }
  }
}

template <typename scalar_t, Format F>
void long_blocks_loop(const at::Tensor& x, at::Tensor& y, at::Tensor& mask, const Geometry& geo,
                      const BlockwiseRules<compute_t<scalar_t>>& c) {
  const int64_t n = x.numel();
  const int64_t R = geo.row_len, bs = geo.block_size, nb = geo.blocks_per_row;
  const int64_t nblocks = n / R * nb;
  const scalar_t* xp = x.const_data_ptr<scalar_t>();
  scalar_t* yp = y.mutable_data_ptr<scalar_t>();
  uint8_t* mp = mask.mutable_data_ptr<uint8_t>();
  std::vector<float> scale(nblocks), center(c.centered ? nblocks : 0);
  std::vector<uint8_t> degenerate(nblocks);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / bs);
  at::parallel_for(0, nblocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t row = b / nb, j = b - row * nb;
      const int64_t len = j + 1 == nb ? geo.last_len : bs;
      float amax;
      if (c.centered) {
        const Centered cb = block_centered(xp + row * R + j * bs, len);
        center[b] = cb.center;
        amax = cb.amax;
      } else {
        amax = long_block_amax(xp + row * R + j * bs, len);
      }
      const float s = blockwise_scale(amax, c.scale, c.g);
      scale[b] = s;
      degenerate[b] = blockwise_degenerate(amax, s, c.g, c.scale.kind);
    }
  });
  const int64_t ntiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, ntiles, kTilesPerTask, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> local(kTile);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t e0 = t * kTile, e1 = std::min(n, e0 + kTile);
      long_blocks_tile<scalar_t, F>(xp, yp, local.data(), e0, e1, geo, scale.data(),
                                    degenerate.data(), c.centered ? center.data() : nullptr, c.rule);
      pack_bits(local.data(), e1 - e0, mp + e0 / 8);
    }
  });
}

// The most elements of a tile of whole rows (the scratch of a task is about
// five bytes per element); beyond, long_blocks_loop.
constexpr int64_t kMaxTile = int64_t{1} << 16;

Geometry make_geometry(const BlockGeometry& block) {
  Geometry geo;
  static_cast<BlockGeometry&>(geo) = block;
  constexpr int64_t kTargetTile = 2048;  // elements
  const int64_t unit = 8 / std::gcd<int64_t>(geo.row_len, 8);
  const int64_t units = std::max<int64_t>(1, kTargetTile / (unit * geo.row_len));
  geo.rows_per_tile = unit * units;
  return geo;
}

}  // namespace

// The loop of one dtype (scalar_t), every format and geometry: instantiated by
// blockwise_<dtype>.cpp, one translation unit per dtype, so that a parallel
// build compiles them at once (each is hundreds of vectorised loops, four clones
// each: the slowest file of the build when they were one).
template <typename scalar_t>
void blockwise_typed(const BlockwiseJob& job) {
  const Geometry geo = make_geometry(job.geometry);
  const at::Tensor& x = job.x;
  at::Tensor y = job.y;
  at::Tensor mask = job.mask;
  const float g = job.scale.kind == BlockScale::kE4M3
                      ? blockwise_global_scale(job.scale_amax.as_float(0), job.scale.elem_max)
                      : 1.0f;
  using C = compute_t<scalar_t>;
  const BlockwiseRules<C> c{
      {static_cast<C>(job.rule.quant_min), static_cast<C>(job.rule.quant_max),
       static_cast<C>(job.rule.float_limit)},
      job.scale, g, job.centered};
  with_blockwise_format(job.format, [&](auto format_tag) {
    constexpr Format F = decltype(format_tag)::value;
    if (geo.rows_per_tile * geo.row_len > kMaxTile) {
      long_blocks_loop<scalar_t, F>(x, y, mask, geo, c);
      return;
    }
    if (c.centered) {
      blockwise_loop<scalar_t, F, 0, true>(x, y, mask, geo, c);
      return;
    }
    // Compile-time block sizes where every row is one block.
    switch (geo.blocks_per_row == 1 && geo.row_len == geo.block_size ? geo.block_size : 0) {
      case 16: blockwise_loop<scalar_t, F, 16>(x, y, mask, geo, c); break;
      case 32: blockwise_loop<scalar_t, F, 32>(x, y, mask, geo, c); break;
      case 64: blockwise_loop<scalar_t, F, 64>(x, y, mask, geo, c); break;
      case 128: blockwise_loop<scalar_t, F, 128>(x, y, mask, geo, c); break;
      default: blockwise_loop<scalar_t, F, 0>(x, y, mask, geo, c); break;
    }
  });
}

}  // namespace cpu
}  // namespace fakequant
