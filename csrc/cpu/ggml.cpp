// The CPU loop of fake_quantize_ggml (ggml_stub): llama.cpp's Q8_0/Q4_0 blocks of
// block_size consecutive elements along the last dimension, the rule of
// csrc/include/fakequant/ggml.h. Memory is walked as rows of R elements (BlockGeometry).
//
// Tiles of whole rows that start on a byte of the packed mask (as the block-wise loop's,
// csrc/cpu/blockwise_loops.h): each block's reduction, then its elements from L1, their mask bytes
// into the tile's scratch, packed at the end of the tile. Where a tile of whole rows would
// exceed kMaxTile elements (blocks or ragged rows of thousands), the constants of every block
// are made first, in a pass of their own, and the elements follow in tiles of kTile.
#include <ATen/Dispatch.h>

#include <numeric>
#include <vector>

#include "fakequant/ggml.h"
#include "fakequant/kernel_table.h"
#include "loop.h"

namespace fakequant {
namespace cpu {
namespace {

// The constants of the block of len elements at x.
template <GgmlType T, typename scalar_t>
inline GgmlScale block_constants(const scalar_t* __restrict__ x, int64_t len) {
  if constexpr (T == GgmlType::kQ8_0) {
    uint32_t m = 0;
    for (int64_t k = 0; k < len; ++k) {
      const uint32_t b = ggml_key(static_cast<float>(x[k]));
      m = b > m ? b : m;
    }
    return ggml_scale<T>(bits_to_float(m));
  } else {
    uint32_t m = 0;
    int64_t at = 0;  // the first element of the largest key (ties: the first index)
    for (int64_t k = 0; k < len; ++k) {
      const uint32_t b = ggml_key(static_cast<float>(x[k]));
      if (b > m) {
        m = b;
        at = k;
      }
    }
    return ggml_scale<T>(static_cast<float>(x[at]));
  }
}

// len elements of one block with constants s; the mask bytes into m.
template <GgmlType T, typename scalar_t>
inline void block_elements(const scalar_t* __restrict__ x, scalar_t* __restrict__ y, uint8_t* __restrict__ m,
                           int64_t len, const GgmlScale s) {
  for (int64_t k = 0; k < len; ++k) y[k] = static_cast<scalar_t>(ggml_value<T>(static_cast<float>(x[k]), s, m[k]));
}

// `rows` whole rows at x/y; their mask bytes into mask.
template <GgmlType T, typename scalar_t>
FAKEQUANT_CPU_CLONES void rows_tile(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                    uint8_t* __restrict__ mask, int64_t rows, const BlockGeometry& geo) {
  const int64_t R = geo.row_len, bs = geo.block_size, nb = geo.blocks_per_row;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t e = r * R + j * bs, len = j + 1 < nb ? bs : geo.last_len;
      block_elements<T>(x + e, y + e, mask + e, len, block_constants<T>(x + e, len));
    }
  }
}

// The most elements of a tile of whole rows; beyond, long_blocks.
constexpr int64_t kMaxTile = int64_t{1} << 16;

template <GgmlType T, typename scalar_t>
void rows_loop(const scalar_t* xp, scalar_t* yp, uint8_t* mp, int64_t n, const BlockGeometry& geo,
               int64_t tile_rows) {
  const int64_t R = geo.row_len, rows = n / R;
  tile_rows = std::min(tile_rows, rows);
  const int64_t ntiles = (rows + tile_rows - 1) / tile_rows;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (tile_rows * R));
  at::parallel_for(0, ntiles, grain, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> bytes(tile_rows * R);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = t * tile_rows, nrows = std::min(rows, r0 + tile_rows) - r0;
      const int64_t e0 = r0 * R;  // a multiple of 8
      rows_tile<T>(xp + e0, yp + e0, bytes.data(), nrows, geo);
      pack_bits(bytes.data(), nrows * R, mp + e0 / 8);
    }
  });
}

// Elements [e0, e1) of memory, through the blocks they meet (constants in s).
template <GgmlType T, typename scalar_t>
FAKEQUANT_CPU_CLONES void long_tile(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                    uint8_t* __restrict__ mask, int64_t e0, int64_t e1, const BlockGeometry& geo,
                                    const GgmlScale* s) {
  const int64_t R = geo.row_len, bs = geo.block_size, nb = geo.blocks_per_row;
  int64_t row = e0 / R, col = e0 - row * R;
  for (int64_t e = e0; e < e1;) {
    const int64_t j = col / bs;
    const int64_t len = std::min(e1 - e, std::min(R, (j + 1) * bs) - col);
    block_elements<T>(x + e, y + e, mask + (e - e0), len, s[row * nb + j]);
    e += len;
    col += len;
    if (col == R) {
      col = 0;
      ++row;
    }
  }
}

template <GgmlType T, typename scalar_t>
void long_blocks(const scalar_t* xp, scalar_t* yp, uint8_t* mp, int64_t n, const BlockGeometry& geo) {
  const int64_t R = geo.row_len, bs = geo.block_size, nb = geo.blocks_per_row;
  const int64_t nblocks = n / R * nb;
  std::vector<GgmlScale> s(nblocks);
  at::parallel_for(0, nblocks, std::max<int64_t>(1, (int64_t{1} << 15) / bs), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t row = b / nb, j = b - row * nb;
      s[b] = block_constants<T>(xp + row * R + j * bs, j + 1 == nb ? geo.last_len : bs);
    }
  });
  const int64_t ntiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, ntiles, kTilesPerTask, [&](int64_t t0, int64_t t1) {
    std::vector<uint8_t> bytes(kTile);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t e0 = t * kTile, e1 = std::min(n, e0 + kTile);
      long_tile<T>(xp, yp, bytes.data(), e0, e1, geo, s.data());
      pack_bits(bytes.data(), e1 - e0, mp + e0 / 8);
    }
  });
}

template <typename scalar_t>
void ggml_typed(const GgmlJob& job) {
  const BlockGeometry& geo = job.geometry;
  const int64_t n = job.x.numel();
  const scalar_t* xp = job.x.const_data_ptr<scalar_t>();
  scalar_t* yp = job.y.mutable_data_ptr<scalar_t>();
  uint8_t* mp = job.mask.mutable_data_ptr<uint8_t>();
  // Tiles of a multiple of 8 / gcd(R, 8) rows (they start on a mask byte), about kTile elements.
  const int64_t unit = 8 / std::gcd<int64_t>(geo.row_len, 8);
  const int64_t tile_rows = unit * std::max<int64_t>(1, kTile / (unit * geo.row_len));
  auto run = [&](auto type_tag) {
    constexpr GgmlType T = decltype(type_tag)::value;
    if (tile_rows * geo.row_len > kMaxTile) {
      long_blocks<T>(xp, yp, mp, n, geo);
    } else {
      rows_loop<T>(xp, yp, mp, n, geo, tile_rows);
    }
  };
  if (job.type == GgmlType::kQ8_0) {
    run(std::integral_constant<GgmlType, GgmlType::kQ8_0>{});
  } else {
    run(std::integral_constant<GgmlType, GgmlType::kQ4_0>{});
  }
}

void ggml_cpu(const GgmlJob& job) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, job.x.scalar_type(), "fakequant_ggml",
                                  [&] { ggml_typed<scalar_t>(job); });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(ggml_stub, CPU, &ggml_cpu);

}  // namespace cpu
}  // namespace fakequant
