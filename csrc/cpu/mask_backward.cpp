// The CPU loop of the backward of every fake-quant op (mask_backward_stub):
// grad where mask, else +0 (select_bits of contract.h).
#include <array>

#include "fakequant/kernel_table.h"
#include "fakequant/static_switch.h"
#include "loop.h"

namespace fakequant {
namespace cpu {
namespace {

// kUnpacked[b] holds the eight bits of b as eight bytes of 0 or 1.
constexpr std::array<uint64_t, 256> make_unpack_table() {
  std::array<uint64_t, 256> table{};
  for (int b = 0; b < 256; ++b) {
    uint64_t v = 0;
    for (int j = 0; j < 8; ++j) v |= static_cast<uint64_t>((b >> j) & 1) << (8 * j);
    table[b] = v;
  }
  return table;
}
constexpr std::array<uint64_t, 256> kUnpacked = make_unpack_table();

// Selecting on the bit pattern vectorises for every dtype.
template <typename bits_t>
FAKEQUANT_CPU_CLONES void select_masked(const bits_t* __restrict__ grad,
                                        const uint8_t* __restrict__ mask,
                                        bits_t* __restrict__ out, int64_t n) {
  for (int64_t k = 0; k < n; ++k) out[k] = select_bits<bits_t>(grad[k], mask[k]);
}

template <typename bits_t>
void mask_backward_loop(const at::Tensor& grad, const at::Tensor& mask, at::Tensor& out) {
  const int64_t n = grad.numel();
  const auto* gp = static_cast<const bits_t*>(grad.const_data_ptr());
  auto* op = static_cast<bits_t*>(out.mutable_data_ptr());
  const bool packed = mask.scalar_type() == at::kByte;
  const uint8_t* mp = packed ? mask.const_data_ptr<uint8_t>()
                             : reinterpret_cast<const uint8_t*>(mask.const_data_ptr<bool>());
  const int64_t ntiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, ntiles, kTilesPerTask, [&](int64_t t0, int64_t t1) {
    alignas(64) uint8_t local[kTile];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t e0 = t * kTile, e1 = std::min(n, e0 + kTile);
      const uint8_t* m = mp + e0;
      if (packed) {
        for (int64_t b = 0; b < (e1 - e0 + 7) / 8; ++b) {
          std::memcpy(local + 8 * b, &kUnpacked[mp[e0 / 8 + b]], 8);
        }
        m = local;
      }
      select_masked<bits_t>(gp + e0, m, op + e0, e1 - e0);
    }
  });
}

void mask_backward_cpu(const at::Tensor& grad, const at::Tensor& mask, at::Tensor& out) {
  with_bits_type(grad.element_size(), [&](auto bits) {
    mask_backward_loop<decltype(bits)>(grad, mask, out);
  });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(mask_backward_stub, CPU, &mask_backward_cpu);

}  // namespace cpu
}  // namespace fakequant
