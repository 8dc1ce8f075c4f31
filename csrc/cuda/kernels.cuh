#pragma once
// Device code of the forward of the affine, min/max and amax families and of
// mask_backward: the family's builder (contract.h) makes each parameter's
// constants on the device, and one kernel applies the element rule
// quantize_value (contract.h) with the format, output and mask as template
// constants.
// Launches are in quantize.cu and mask_backward.cu; this header needs no CUDA
// runtime API.
//
// Work is split into warp tiles. In a tile each lane handles kVec consecutive
// elements (one 128-bit load and store where input and output are 16-byte
// aligned, one element otherwise), and the lanes' mask bits are gathered with
// warp shuffles into whole bytes that one lane stores: no atomics, and every
// tile starts on a byte boundary of the packed mask.
//
// Exactness: every operation of the contract is a correctly rounded
// intrinsic (div_rn, mul_rn, ... of contract.h), so neither --use_fast_math
// nor FMA contraction could change a result; setup.py passes -fmad=false as well.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "fakequant/contract.h"
#include "fakequant/divider.h"

namespace fakequant {
namespace gpu {

// Shared memory of the block: `T name[n]` (the emulator gives each block its own).
#if !defined(FQ_SHARED)
#define FQ_SHARED(T, name, n) __shared__ T name[n]
#endif

constexpr int kWarpSize = 32;
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarpSize;
constexpr unsigned kFullWarp = 0xffffffffu;

// --- per-parameter constants ---------------------------------------------------

// One table entry (Consts, contract.h) in 128-bit loads.
template <typename C>
__device__ __forceinline__ Consts<C> load_consts(const Consts<C>* p) {
  using V = std::conditional_t<std::is_same_v<C, float>, float4, double2>;
  constexpr int kParts = sizeof(Consts<C>) / sizeof(V);
  union {
    V parts[kParts];
    Consts<C> c;
  } u;
  const V* src = reinterpret_cast<const V*>(p);
#pragma unroll
  for (int i = 0; i < kParts; ++i) u.parts[i] = __ldg(src + i);
  return u.c;
}

// --- parameter lookup ------------------------------------------------------------

// ParamLayout (csrc/include/fakequant/param_layout.h) by value, for the kernel's parameter space.
// 25 is the most dimensions a TensorIterator takes; coalesced layouts rarely
// have more than 3.
struct DeviceLayout {
  static constexpr int kMaxDims = 25;
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t param_strides[kMaxDims];
  Divider32 dividers[kMaxDims];  // the sizes, where the tensor has fewer than 2^31 elements
};

// Parameter offset of the first element of `row` (one run of the innermost
// dimension), in index type I (32-bit where the tensor allows: a multiply for each division).
template <typename I>
__device__ __forceinline__ int64_t row_param_offset(const DeviceLayout& L, I row) {
  int64_t offset = 0;
  for (int d = L.ndim - 2; d > 0; --d) {
    I next;
    if constexpr (std::is_same_v<I, uint32_t>) {
      next = L.dividers[d].div(row);
    } else {
      next = row / static_cast<I>(L.sizes[d]);
    }
    offset += static_cast<int64_t>(row - next * static_cast<I>(L.sizes[d])) * L.param_strides[d];
    row = next;
  }
  if (L.ndim >= 2) offset += static_cast<int64_t>(row) * L.param_strides[0];  // row < sizes[0]
  return offset;
}

// Per-tensor: one set of constants, which each thread makes from the
// parameters itself (no table, no extra launch).
template <typename C, typename Family>
struct UniformParams {
  Family family;
};

// With float compute it also holds the scale's Divisor (contract.h), so that a vector whose
// elements are all in its fast range divides by two multiplies and three FMAs an element, and
// the bound of that range (dividend_limit: one comparison an element, the Divisor's own test
// folded in).
template <typename C>
struct UniformLookup {
  Consts<C> c;
  Divisor d;
  float limit;
  template <typename Family>
  __device__ explicit UniformLookup(const UniformParams<C, Family>& p)
      : c(p.family.template make<C>(0)), d(make_divisor(static_cast<float>(c.scale))), limit(dividend_limit(d)) {}
  __device__ __forceinline__ void seek(int64_t) {}
  __device__ __forceinline__ const Consts<C>& get(int) { return c; }
};

// Per-channel or any broadcast: a table of constants (one entry per
// parameter, made by prepare_kernel, float32 entries with their Divisor) and the
// layout that maps element e, in memory order, to its entry.
// The layouts of per-channel quantization ([channels][inner], [outer][channels][inner],
// [rows][channels]; fewer than 2^31 elements) as three levels, in 32-bit arithmetic:
// element e is in row r = e / inner at column e % inner, and its entry is
// (r % mid) * mid_stride + (r / mid) * outer_stride + column * step (mid = 1 with one
// level, the first dimension with two).
struct ShortLayout {
  bool applies;
  Divider32 inner, mid;
  uint32_t step, mid_stride, outer_stride;

  // The entry of row r's first element (its column 0).
  __device__ __forceinline__ uint32_t row_entry(uint32_t r) const {
    const uint32_t outer = mid.div(r);
    return (r - outer * mid.d) * mid_stride + outer * outer_stride;
  }
};

template <typename C>
struct TableParams {
  const Consts<C>* table;
  DeviceLayout layout;
  bool small_index;  // numel < 2^31: 32-bit index arithmetic (DeviceLayout::dividers)
  ShortLayout short_layout;
};

template <typename C>
struct TableLookup {
  const TableParams<C>& p;
  int64_t inner, step;  // innermost run length and its parameter step (0, 1 or any)
  int64_t row = 0, col = 0, j = 0, loaded = -1;
  Consts<C> c;

  __device__ explicit TableLookup(const TableParams<C>& params)
      : p(params),
        inner(params.layout.sizes[params.layout.ndim - 1]),
        step(params.layout.param_strides[params.layout.ndim - 1]) {}

  __device__ __forceinline__ int64_t row_offset(int64_t r) const {
    return p.small_index ? row_param_offset<uint32_t>(p.layout, static_cast<uint32_t>(r))
                         : row_param_offset<uint64_t>(p.layout, static_cast<uint64_t>(r));
  }
  // Positions the lookup at element e (one division per lane and tile).
  __device__ __forceinline__ void seek(int64_t e) {
    if (short_layout()) {
      seek_short(e);
      return;
    }
    row = static_cast<int64_t>(static_cast<uint64_t>(e) / static_cast<uint64_t>(inner));
    col = e - row * inner;
    j = row_offset(row) + col * step;
  }
  // seek where short_layout() applies, in line and in 32-bit arithmetic.
  __device__ __forceinline__ void seek_short(int64_t e) {
    uint32_t c32, j32;
    row = locate_short(static_cast<uint32_t>(e), c32, j32);
    col = c32;
    j = j32;
  }
  // Element e's row, column (returned in col32) and entry (in entry), where short_layout().
  __device__ __forceinline__ uint32_t locate_short(uint32_t e, uint32_t& col32, uint32_t& entry) const {
    const ShortLayout& L = p.short_layout;
    const uint32_t r = L.inner.div(e);
    col32 = e - r * L.inner.d;
    entry = L.row_entry(r) + col32 * L.step;
    return r;
  }
  __device__ __forceinline__ bool short_layout() const { return p.short_layout.applies; }

  // Constants of the k-th element from the seek; k counts up from 0 by 1.
  __device__ __forceinline__ const Consts<C>& get(int k) {
    if (k > 0) {
      if (++col == inner) {
        col = 0;
        j = row_offset(++row);
      } else {
        j += step;
      }
    }
    if (j != loaded) {  // elements that share a channel load its constants once
      c = load_consts(p.table + j);
      loaded = j;
    }
    return c;
  }
};

// Per channel without a table (quantize_rows_kernel): layouts whose innermost run shares one
// parameter (a ShortLayout with step 0: weights per output channel, NCHW activations per
// channel, a calibrated amax per block), each row's constants made from the parameters where
// they are used. RowLookup serves an element at a time (the scalar tail).
template <typename Family>
struct RowParams {
  Family family;
  ShortLayout layout;

  __device__ __forceinline__ Consts<float> row_consts(uint32_t r) const {
    return with_divisor(family.template make<float>(layout.row_entry(r)));
  }
};

template <typename Family>
struct RowLookup {
  const RowParams<Family>& p;
  uint32_t row = 0, loaded = 0xffffffffu;  // no row has that index: fewer than 2^31 elements
  Consts<float> c;

  __device__ explicit RowLookup(const RowParams<Family>& params) : p(params) {}
  __device__ __forceinline__ void seek(int64_t e) { row = p.layout.inner.div(static_cast<uint32_t>(e)); }
  __device__ __forceinline__ const Consts<float>& get(int) {  // V == 1: one element a seek
    if (row != loaded) {
      c = p.row_consts(row);
      loaded = row;
    }
    return c;
  }
};

template <typename Params>
struct LookupFor;
template <typename Family>
struct LookupFor<RowParams<Family>> {
  using type = RowLookup<Family>;
};
template <typename C, typename Family>
struct LookupFor<UniformParams<C, Family>> {
  using type = UniformLookup<C>;
};
template <typename C>
struct LookupFor<TableParams<C>> {
  using type = TableLookup<C>;
};

// Elements per 128-bit access.
template <typename scalar_t>
constexpr int kVec = 16 / static_cast<int>(sizeof(scalar_t));

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V>
struct MaskBytes;  // V bytes of a bool mask as one access
template <> struct MaskBytes<1> { using type = uint8_t; };
template <> struct MaskBytes<2> { using type = uint16_t; };
template <> struct MaskBytes<4> { using type = uint32_t; };
template <> struct MaskBytes<8> { using type = uint2; };

// A vector's elements in float32. bfloat16 from its 32-bit words, by a shift or a mask: one
// instruction an element, where the conversion of one element takes two for the upper
// half of a word (extract, then shift).
template <typename scalar_t, int V>
__device__ __forceinline__ Pack<float, V> to_floats(const Pack<scalar_t, V> in) {  // (by value: a copy in registers)
  Pack<float, V> out;
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && V % 2 == 0) {
    uint32_t w[V / 2];
    memcpy(w, &in, sizeof(w));
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      out.v[2 * k] = __uint_as_float(w[k] << 16);
      out.v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = static_cast<float>(in.v[k]);
  }
  return out;
}

// The largest abs_bits (contract.h: the bits of |x| in float32, NaN above inf) of a vector's
// elements. bfloat16: on both halves of its 32-bit words at once (a bfloat16's float32 bits
// are its 16 bits shifted up, so its magnitude bits order as the float32 ones do): an AND and
// a 16-bit-pair max a word, where the float32 route takes a conversion, an AND and a max an
// element.
template <typename scalar_t, int V>
__device__ __forceinline__ uint32_t abs_max_bits(const Pack<scalar_t, V>& in) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && V % 2 == 0) {
    uint32_t w[V / 2];
    memcpy(w, &in, sizeof(w));
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < V / 2; ++k) m = __vmaxu2(m, w[k] & 0x7fff7fffu);
    return max(m & 0xffff0000u, m << 16);
  } else {
    const Pack<float, V> f = to_floats(in);
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < V; ++k) m = max(m, abs_bits(f.v[k]));
    return m;
  }
}

// A row's largest keys, gathered vector by vector and read once (the per-token kernels): the
// largest abs_bits in m, or for centered rows (kCentered) the largest order keys (contract.h)
// of x in m and of -x in n; the least key (of no number) when nothing was added.
// bfloat16: on both 16-bit halves of each word at once. Plain rows take the max of the halves'
// abs_bits. Centered rows take, of the raw bits h, the max as signed 16-bit integers (the
// largest number with a clear sign bit: positives, +0 and NaNs order so), and the max and the
// min as unsigned ones (the max, where it has the sign bit, the most negative number; the min,
// the least positive one, or where there is none, the negative nearest zero): one 16-bit-pair
// max or min each a word (VIMNMX), where an order key takes four instructions a word. read()
// makes the row's max and min from them and their float32 keys: a bfloat16's 16-bit order key
// h ^ (sign ? 0xffff : 0x8000) orders as its float32 key does (that key is the 16-bit one
// shifted up, its low half all ones for a clear top bit), and the keys' order is the order of
// numbers that these maxima and minima follow (-NaN least, -0 below +0, +NaN greatest).
template <typename scalar_t, bool kCentered>
struct RowKeys {
  static constexpr bool kPairs = std::is_same_v<scalar_t, c10::BFloat16>;
  // bfloat16 centered: m the signed max, n the unsigned max, u the unsigned min (their
  // identities: -32768, 0, 0xffff); otherwise m, n the keys
  uint32_t m = kPairs && kCentered ? 0x80008000u : 0u, n = 0u, u = 0xffffffffu;

  template <int V>
  __device__ __forceinline__ void add(const Pack<scalar_t, V>& in) {
    if constexpr (kPairs && V % 2 == 0) {
      uint32_t w[V / 2];
      memcpy(w, &in, sizeof(w));
#pragma unroll
      for (int k = 0; k < V / 2; ++k) {
        if constexpr (kCentered) {
          m = __vmaxs2(m, w[k]);
          n = __vmaxu2(n, w[k]);
          u = __vminu2(u, w[k]);
        } else {
          m = __vmaxu2(m, w[k] & 0x7fff7fffu);
        }
      }
    } else {
      const Pack<float, V> f = to_floats(in);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if constexpr (kCentered) {
          m = max(m, order_key(f.v[k]));
          n = max(n, order_key(-f.v[k]));
        } else {
          m = max(m, abs_bits(f.v[k]));
        }
      }
    }
  }

  // The float32 keys: m, and n (centered).
  __device__ __forceinline__ void read(uint32_t& max_key, uint32_t& neg_max_key) const {
    if constexpr (!kPairs) {
      max_key = m;
      neg_max_key = n;
    } else if constexpr (kCentered) {
      const uint32_t signed_max = static_cast<uint16_t>(max(static_cast<int16_t>(m >> 16), static_cast<int16_t>(m)));
      const uint32_t unsigned_max = max(n >> 16, n & 0xffffu), unsigned_min = min(u >> 16, u & 0xffffu);
      const bool negative = unsigned_max >= 0x8000u, positive = unsigned_min < 0x8000u;  // neither: nothing added
      const uint32_t hi = positive ? signed_max : negative ? unsigned_min : 0xffffu;  // the max's bits
      const uint32_t lo = negative ? unsigned_max : positive ? unsigned_min : 0x7fffu;  // the min's
      max_key = widen(key16(hi));
      neg_max_key = widen(key16(lo ^ 0x8000u));  // -min's
    } else {
      max_key = max(m & 0xffff0000u, m << 16);
      neg_max_key = 0;
    }
  }

 private:
  // A bfloat16's 16-bit order key, and its float32 one from that.
  __device__ __forceinline__ static uint32_t key16(uint32_t h) { return h ^ ((h & 0x8000u) ? 0xffffu : 0x8000u); }
  __device__ __forceinline__ static uint32_t widen(uint32_t key16) {
    return (key16 << 16) | ((key16 & 0x8000u) ? 0u : 0xffffu);
  }
};

// Spreads V mask bits (element k at bit k) over V bool bytes.
template <int V>
__device__ __forceinline__ void store_bool_mask(uint8_t* dst, unsigned bits) {
  union {
    typename MaskBytes<V>::type word;
    uint8_t bytes[V];
  } m;
#pragma unroll
  for (int k = 0; k < V; ++k) m.bytes[k] = static_cast<uint8_t>((bits >> k) & 1u);
  *reinterpret_cast<typename MaskBytes<V>::type*>(dst) = m.word;
}

// --- one vector of V elements: the fast division where it applies, else out of line -------
//
// Each returns the vector's mask bits (element k at bit k). The out-of-line ones
// (__noinline__) load and store the vector themselves and divide by div_rn, so that the
// fast paths keep everything in registers: vectors with an element beyond 2^60 or NaN, an
// invalid or extreme scale, or (per channel) constants that change inside the vector.

// V elements with one set of constants, each x / s by div_rn.
template <int V, Format F, Output O, Window W, typename scalar_t, typename C>
__device__ __noinline__ unsigned quantize_vector_slow(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                      C s, C lo, C hi, C zp, C wlo, C whi) {
  const Pack<scalar_t, V> in = *reinterpret_cast<const Pack<scalar_t, V>*>(x);
  Pack<scalar_t, V> out;
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    unsigned m;
    out.v[k] = static_cast<scalar_t>(quantize_value<F, O, W>(static_cast<C>(in.v[k]), s, lo, hi, zp, wlo, whi, m));
    bits |= m << k;
  }
  *reinterpret_cast<Pack<scalar_t, V>*>(y) = out;
  return bits;
}

// V elements from element e0 of the table's layout, each with its own lookup (the general
// per-channel case: a vector across the end of a run of the innermost dimension).
template <int V, Format F, Output O, Window W, typename scalar_t>
__device__ __noinline__ unsigned quantize_vector_table(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                       int64_t e0, const TableParams<float>& params) {
  TableLookup<float> lookup(params);
  lookup.seek(e0);
  const Pack<scalar_t, V> in = *reinterpret_cast<const Pack<scalar_t, V>*>(x + e0);
  Pack<scalar_t, V> out;
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    unsigned m;
    out.v[k] = static_cast<scalar_t>(quantize_value<F, O, W>(static_cast<float>(in.v[k]), lookup.get(k), m));
    bits |= m << k;
  }
  *reinterpret_cast<Pack<scalar_t, V>*>(y + e0) = out;
  return bits;
}

// Stores the V outputs of elements xf, element k with constants consts(k) and their Divisor
// divisor(k), all in the fast division's range; returns the mask bits.
template <int V, Format F, Output O, Window W, typename scalar_t, typename ConstsOf, typename DivisorOf>
__device__ __forceinline__ unsigned quantize_fast(scalar_t* __restrict__ y, const Pack<float, V>& xf,
                                                  ConstsOf consts, DivisorOf divisor) {
  Pack<scalar_t, V> out;
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    unsigned m;
    const float xv = xf.v[k];
    const Consts<float>& c = consts(k);
    out.v[k] = static_cast<scalar_t>(quantize_value_of_quotient<F, O, W, true>(
        xv, quotient_of<F != Format::kInt>(xv, divisor(k)), c.scale, c.lo, c.hi, c.zero_point, c.window_lo,
        c.window_hi, m));
    bits |= m << k;
  }
  *reinterpret_cast<Pack<scalar_t, V>*>(y) = out;
  return bits;
}

// `fast` and whether every element of the vector is in the fast division's range
// (fast_dividend), in one chain of predicates; or, given a float, whether every |element| is
// at most that bound (dividend_limit: the divisor's test and the elements' in one).
template <int V>
__device__ __forceinline__ bool fast_dividends(const Pack<float, V>& xf, bool fast = true) {
#pragma unroll
  for (int k = 0; k < V; ++k) fast &= fast_dividend(xf.v[k]);
  return fast;
}
template <int V>
__device__ __forceinline__ bool fast_dividends(const Pack<float, V>& xf, float limit) {
  bool fast = true;
#pragma unroll
  for (int k = 0; k < V; ++k) fast &= abs_value(xf.v[k]) <= limit;
  return fast;
}

// V elements with one set of constants and its Divisor, where the divisor and every
// element allow the fast division (`fast`: the Divisor's own test, or its dividend_limit):
// returns false (and writes nothing) where not.
template <int V, Format F, Output O, Window W, typename scalar_t, typename Fast>
__device__ __forceinline__ bool quantize_vector_one(scalar_t* __restrict__ y, const Pack<scalar_t, V>& in,
                                                    const Consts<float>& c, const Divisor& d, Fast fast,
                                                    unsigned& bits) {
  const Pack<float, V> xf = to_floats(in);
  if (!fast_dividends(xf, fast)) return false;
  bits = quantize_fast<V, F, O, W>(y, xf, [&](int) -> const Consts<float>& { return c; },
                                   [&](int) -> const Divisor& { return d; });
  return true;
}

// The vectors of a table that quantize_vector_one does not take: V consecutive entries
// (channels innermost, as in channels_last activations or the last axis quantized per
// channel) with the fast division where it applies, else quantize_vector_table.
template <int V, Format F, Output O, Window W, typename scalar_t>
__device__ __noinline__ unsigned quantize_vector_other(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                       int64_t e0, const TableParams<float>& params) {
  TableLookup<float> lookup(params);
  if (!lookup.short_layout()) return quantize_vector_table<V, F, O, W>(x, y, e0, params);
  lookup.seek_short(e0);
  if (lookup.step != 1 || lookup.col + V > lookup.inner) return quantize_vector_table<V, F, O, W>(x, y, e0, params);
  const Pack<float, V> xf = to_floats(*reinterpret_cast<const Pack<scalar_t, V>*>(x + e0));
  Consts<float> c[V];
  bool fast = fast_dividends(xf);
#pragma unroll
  for (int k = 0; k < V; ++k) {
    c[k] = load_consts(params.table + lookup.j + k);
    fast &= c[k].inverse != 0.0f;  // (with_divisor: 0 where not fast)
  }
  if (!fast) return quantize_vector_table<V, F, O, W>(x, y, e0, params);
  return quantize_fast<V, F, O, W>(y + e0, xf, [&](int k) -> const Consts<float>& { return c[k]; },
                                   [&](int k) { return divisor_of(c[k]); });
}

// A vector of float compute (V > 1): per tensor, one set of constants; per channel, one set
// in line where the vector lies in one run of a channel, else out of line.
template <int V, Format F, Output O, Window W, typename scalar_t, typename C, typename Family>
__device__ __forceinline__ unsigned quantize_vector(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                    int64_t e0, const Pack<scalar_t, V>& in,
                                                    UniformLookup<C>& lookup, const UniformParams<C, Family>&) {
  unsigned bits;
  if (quantize_vector_one<V, F, O, W>(y + e0, in, lookup.c, lookup.d, lookup.limit, bits)) return bits;
  const Consts<C>& c = lookup.c;
  return quantize_vector_slow<V, F, O, W>(x + e0, y + e0, c.scale, c.lo, c.hi, c.zero_point, c.window_lo, c.window_hi);
}
template <int V, Format F, Output O, Window W, typename scalar_t>
__device__ __forceinline__ unsigned quantize_vector(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                    int64_t e0, const Pack<scalar_t, V>& in,
                                                    TableLookup<float>& lookup, const TableParams<float>& params) {
  if (lookup.short_layout()) {
    uint32_t col, entry;
    lookup.locate_short(static_cast<uint32_t>(e0), col, entry);
    if ((params.short_layout.step == 0) & (col + V <= params.short_layout.inner.d)) {
      const Consts<float> c = load_consts(params.table + entry);
      const Divisor d = divisor_of(c);
      unsigned bits;
      if (quantize_vector_one<V, F, O, W>(y + e0, in, c, d, d.fast, bits)) return bits;
    }
  }
  return quantize_vector_other<V, F, O, W>(x, y, e0, params);
}

// The mask bits of kLanes consecutive lanes (a power of two; the group's first lane a multiple of
// it), V a lane, gathered into the first one's: lane i of the group's bits at V * i. (What the
// other lanes get is not used.) Every lane of the warp calls it together. The packed mask's
// bytes (store_packed_mask) and the block-wise kernels' 32-bit words are made by it.
template <int V, int kLanes>
__device__ __forceinline__ unsigned gather_lane_bits(unsigned bits) {
#pragma unroll
  for (int s = 1; s < kLanes; s *= 2) bits |= __shfl_down_sync(kFullWarp, bits, s) << (V * s);
  return bits;
}

// A packed mask's bits of a lane's V elements from e0 (bit k: element e0 + k; 0 past n): the
// first of each 8 / V lanes, whose vectors are consecutive, gathers their bits into the byte it
// stores. Every lane of the warp calls it together.
template <int V, MaskOut M>
__device__ __forceinline__ void store_packed_mask(uint8_t* __restrict__ mask, int64_t e0, int64_t n, unsigned bits,
                                                  int lane) {
  if constexpr (M == MaskOut::kPacked) {
    constexpr int kLanesPerByte = 8 / V;
    bits = gather_lane_bits<V, kLanesPerByte>(bits);
    if (lane % kLanesPerByte == 0 && e0 < n) mask[e0 / 8] = static_cast<uint8_t>(bits);
  }
}

// A lane's elements e0 .. e0 + V - 1, 16-byte aligned where V > 1; kGuarded (always with V ==
// 1): e0 may be past the end, and the lane gets zeros that nothing uses. A kernel loads a
// trip's vectors before it computes any: no load moves past a store or an out-of-line path, so
// loads made as each vector's work begins are in flight one at a time, and a streaming kernel
// needs several 16-byte loads a lane in flight to keep the memory busy.
template <int V, bool kGuarded = (V == 1), typename scalar_t>
__device__ __forceinline__ Pack<scalar_t, V> load_lane(const scalar_t* __restrict__ x, int64_t e0, int64_t n) {
  Pack<scalar_t, V> in{};
  if (!kGuarded || e0 < n) in = *reinterpret_cast<const Pack<scalar_t, V>*>(x + e0);
  return in;
}

// Asks L2 for the memory at p ahead of its loads (prefetch.global.L2): no register waits for
// it, so the memory fetches what a kernel reads next while the kernel works on what it holds
// (per token: a row's reduction and work have no loads of their own in flight). Nothing in the
// emulator, whose memory has no cache.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(FAKEQUANT_SIMT_EMULATOR)
  (void)p;
#else
  asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
#endif
}

// A 16-byte vector by the read-only path (LDG.E.128.CONSTANT, ld.global.nc), which nvcc takes
// for a plain load of const __restrict__ memory only where the kernel has no asm statement
// (prefetch_l2's) that might write it.
template <int V, typename scalar_t>
__device__ __forceinline__ Pack<scalar_t, V> load_read_only(const scalar_t* __restrict__ p) {
  static_assert(sizeof(Pack<scalar_t, V>) == sizeof(uint4), "a 16-byte vector");
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  Pack<scalar_t, V> out;
  memcpy(&out, &u, sizeof(out));
  return out;
}

// One lane's part of a warp tile: elements e0 .. e0 + V - 1, loaded (load_lane) as `in`.
// Every lane of the warp calls it together (the mask shuffles).
template <int V, Format F, Output O, Window W, MaskOut M, typename scalar_t, typename Lookup, typename Params>
__device__ __forceinline__ void quantize_lane(const scalar_t* __restrict__ x,
                                              scalar_t* __restrict__ y,
                                              uint8_t* __restrict__ mask, int64_t e0, int64_t n,
                                              const Pack<scalar_t, V>& in, Lookup& lookup, const Params& params,
                                              int lane) {
  using C = compute_t<scalar_t>;
  unsigned bits = 0;
  if (V > 1 || e0 < n) {
    if constexpr (std::is_same_v<C, float> && V > 1) {
      bits = quantize_vector<V, F, O, W>(x, y, e0, in, lookup, params);
    } else {
      Pack<scalar_t, V> out;
      lookup.seek(e0);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        unsigned m;
        const C v = quantize_value<F, O, W>(static_cast<C>(in.v[k]), lookup.get(k), m);
        out.v[k] = static_cast<scalar_t>(v);
        bits |= m << k;
      }
      *reinterpret_cast<Pack<scalar_t, V>*>(y + e0) = out;
    }
    if constexpr (M == MaskOut::kBool) store_bool_mask<V>(mask + e0, bits);
  }
  store_packed_mask<V, M>(mask, e0, n, bits, lane);
}

// Elements [0, n_vec) in tiles of kQuantizeTile (kQuantizeTrip vector loads a lane, all before
// any vector's work, at constant offsets from the first, so that one address serves them and
// the loop's own instructions count once for all), then [n_vec, n) in tiles of 32 (scalar
// loads). n_vec is a multiple of kQuantizeTile, so of 8. Four vectors, 64 bytes a lane in
// flight: on an H200 at 2^28 elements (benchmarks/cuda_loop_shapes.cu) the per-tensor kernel
// takes 1.09 (float32) and 1.08 (bfloat16) times cudaMemcpyAsync's time with four, 1.15 and
// 1.08-1.13 with two, 1.19 and 1.18 with two loaded one at a time.
constexpr int kQuantizeTrip = 4;
template <typename scalar_t>
constexpr int64_t kQuantizeTile = int64_t{kQuantizeTrip} * kWarpSize * kVec<scalar_t>;

template <typename scalar_t, Format F, Output O, Window W, MaskOut M, typename Params>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                    uint8_t* __restrict__ mask, int64_t n, int64_t n_vec,
                    const __grid_constant__ Params params) {
  constexpr int V = kVec<scalar_t>;
  constexpr int64_t kTileV = kWarpSize * V;
  typename LookupFor<Params>::type lookup(params);
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;

  const int64_t vec_tiles = n_vec / kQuantizeTile<scalar_t>;
  for (int64_t t = warp; t < vec_tiles; t += nwarps) {
    const int64_t e0 = t * kQuantizeTile<scalar_t> + lane * V;
    Pack<scalar_t, V> in[kQuantizeTrip];
#pragma unroll
    for (int k = 0; k < kQuantizeTrip; ++k) in[k] = load_lane<V>(x, e0 + k * kTileV, n);
#pragma unroll
    for (int k = 0; k < kQuantizeTrip; ++k) {
      quantize_lane<V, F, O, W, M>(x, y, mask, e0 + k * kTileV, n, in[k], lookup, params, lane);
    }
  }
  const int64_t scalar_tiles = (n - n_vec + kWarpSize - 1) / kWarpSize;
  for (int64_t t = warp; t < scalar_tiles; t += nwarps) {
    const int64_t e = n_vec + t * kWarpSize + lane;
    quantize_lane<1, F, O, W, M>(x, y, mask, e, n, load_lane<1>(x, e, n), lookup, params, lane);
  }
}

// --- per channel, the channels innermost ----------------------------------------------------
// The table's layout [rows][channels] with consecutive entries along the channels (the last
// axis quantized per channel, channels_last activations), channels a multiple of V, input and
// output aligned for vectors. The grid's `threads` (a multiple of channels / V and of the warp:
// innermost_threads, quantize.cuh) walk the vectors tid, tid + threads, ...: a thread's vectors
// hold the same V channels, whose constants it loads once, before its loop, so that the loop
// is the per-tensor one with an entry an element. kInnermostTrip vectors a trip, loaded first; a
// vector with an element outside the fast division's range, or a
// channel whose scale is, goes out of line (quantize_vector_table). The channels' test is made
// once, before the loop, and picks one of two loops (kFastChannels), so that the loop tests the
// elements alone.
// The vectors of a trip: four for 4- and 8-byte dtypes, as the per-tensor kernel (on an H200 two
// loaded first took 1.33 of a copy's time in float32, the per-tensor kernel's four 1.09; four hold
// 104-122 registers, two thread blocks an SM as two did); two for 2-byte ones, whose V = 8 channels'
// constants a thread holds (four took 126-152 registers, one block an SM or spills, in sm_90's
// build). benchmarks/cuda_loop_shapes.cu times the other trip beside each.
template <typename scalar_t>
constexpr int kInnermostTrip = sizeof(scalar_t) >= 4 ? kQuantizeTrip : 2;

template <int V, Format F, Output O, Window W, MaskOut M, bool kFastChannels, typename scalar_t>
__device__ __forceinline__ void quantize_lane_innermost(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                        uint8_t* __restrict__ mask, int64_t e0, int64_t n,
                                                        const Pack<scalar_t, V>& in, const Consts<float> (&c)[V],
                                                        const TableParams<float>& params, int lane) {
  unsigned bits = 0;
  if (e0 < n) {
    const Pack<float, V> xf = to_floats(in);
    if (kFastChannels && fast_dividends(xf)) {
      bits = quantize_fast<V, F, O, W>(y + e0, xf, [&](int k) -> const Consts<float>& { return c[k]; },
                                       [&](int k) { return divisor_of(c[k]); });
    } else {
      bits = quantize_vector_table<V, F, O, W>(x, y, e0, params);
    }
    if constexpr (M == MaskOut::kBool) store_bool_mask<V>(mask + e0, bits);
  }
  store_packed_mask<V, M>(mask, e0, n, bits, lane);
}

// The thread's vectors tid, tid + threads, ...: the warp's, v - lane, the same for every lane,
// decides the trip of kTrip vectors; their loads (all but the first may be past the end) before
// any one's work.
template <int V, Format F, Output O, Window W, MaskOut M, bool kFastChannels, int kTrip, typename scalar_t>
__device__ __forceinline__ void quantize_innermost_loop(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                        uint8_t* __restrict__ mask, int64_t n, int64_t threads,
                                                        int64_t tid, const Consts<float> (&c)[V],
                                                        const TableParams<float>& params, int lane) {
  for (int64_t v = tid; v - lane < n / V; v += kTrip * threads) {
    Pack<scalar_t, V> in[kTrip];
#pragma unroll
    for (int k = 0; k < kTrip; ++k) in[k] = load_lane<V, true>(x, (v + k * threads) * V, n);
#pragma unroll
    for (int k = 0; k < kTrip; ++k) {
      quantize_lane_innermost<V, F, O, W, M, kFastChannels>(x, y, mask, (v + k * threads) * V, n, in[k], c, params,
                                                            lane);
    }
  }
}

// The kernel's body, kInnermostTrip vectors a trip (benchmarks/cuda_loop_shapes.cu compiles it
// with the other trip and under other launch bounds too).
template <typename scalar_t, Format F, Output O, Window W, MaskOut M, int kTrip = kInnermostTrip<scalar_t>>
__device__ __forceinline__ void quantize_innermost(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                   uint8_t* __restrict__ mask, int64_t n, int64_t threads,
                                                   const TableParams<float>& params) {
  constexpr int V = kVec<scalar_t>;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (tid >= threads) return;  // whole warps: threads is a multiple of the warp
  const int lane = threadIdx.x % kWarpSize;
  const int64_t channels = params.layout.sizes[params.layout.ndim - 1];
  const Consts<float>* first = params.table + tid % (channels / V) * V;
  Consts<float> c[V];
  bool fast = true;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    c[k] = load_consts(first + k);
    fast &= c[k].inverse != 0.0f;  // (with_divisor: 0 where not fast)
  }
  if (fast) {
    quantize_innermost_loop<V, F, O, W, M, true, kTrip>(x, y, mask, n, threads, tid, c, params, lane);
  } else {
    quantize_innermost_loop<V, F, O, W, M, false, kTrip>(x, y, mask, n, threads, tid, c, params, lane);
  }
}

template <typename scalar_t, Format F, Output O, Window W, MaskOut M>
__global__ void __launch_bounds__(kThreads)
    quantize_innermost_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                              uint8_t* __restrict__ mask, int64_t n, int64_t threads,
                              const __grid_constant__ TableParams<float> params) {
  quantize_innermost<scalar_t, F, O, W, M>(x, y, mask, n, threads, params);
}

// --- per channel, each tile's rows in shared memory ------------------------------------------
// RowParams' layouts (step 0), rows a multiple of V elements, input and output aligned for
// vectors. A thread block walks tiles of kRowsTile elements (kQuantizeTrip vectors a thread,
// each kThreads vectors after the one before, consecutive lanes on consecutive vectors, all
// loaded before the tile's work); the block's threads make the constants of the tile's rows
// (at most kTileRows: rows_kernel_applies, quantize.cuh) into shared memory, one a thread in
// turn, and each vector reads its row's there: no table in global memory and no kernel to make
// one, where a table entry (32 bytes) a row of 32 elements would add a quarter (float32) or
// half (bfloat16) to the bytes moved, and every row's constants cost one thread once instead
// of every vector's lane. Two buffers, so one barrier a tile: a tile writes the buffer that the
// tile before the last read, and every thread passed the last tile's barrier after its reads.
// Then [n_vec, n) an element a lane (RowLookup).
template <typename scalar_t>
constexpr int64_t kRowsTile = int64_t{kQuantizeTrip} * kThreads * kVec<scalar_t>;
// Rows a tile may touch, at most kRowsTile / inner + 2 (a partial row at each end): with these
// rows of 3 vectors or more (12 float32, 24 bfloat16 elements) take the kernel, as they did
// with two vectors a thread and a row a thread.
constexpr int kTileRows = kQuantizeTrip / 2 * kThreads;

// Row r's constants into *dst: out of line, since only the threads of the tile's rows run it
// (the warps past them skip it whole).
template <typename Family>
__device__ __noinline__ void make_row(Consts<float>* dst, const RowParams<Family>& params, uint32_t r) {
  *dst = params.row_consts(r);
}

template <int V, Format F, Output O, Window W, MaskOut M, typename scalar_t>
__device__ __forceinline__ void quantize_lane_row(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                                                  uint8_t* __restrict__ mask, int64_t e0, int64_t n,
                                                  const Pack<scalar_t, V>& in, const Consts<float>& c, int lane) {
  const Divisor d = divisor_of(c);
  unsigned bits;
  if (!quantize_vector_one<V, F, O, W>(y + e0, in, c, d, d.fast, bits)) {
    bits = quantize_vector_slow<V, F, O, W>(x + e0, y + e0, c.scale, c.lo, c.hi, c.zero_point, c.window_lo,
                                            c.window_hi);
  }
  if constexpr (M == MaskOut::kBool) store_bool_mask<V>(mask + e0, bits);
  store_packed_mask<V, M>(mask, e0, n, bits, lane);
}

template <typename scalar_t, Format F, Output O, Window W, MaskOut M, typename Family>
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                         uint8_t* __restrict__ mask, int64_t n, int64_t n_vec,
                         const __grid_constant__ RowParams<Family> params) {
  constexpr int V = kVec<scalar_t>;
  constexpr auto kTile = static_cast<uint32_t>(kRowsTile<scalar_t>);
  FQ_SHARED(Consts<float>, rows, 2 * kTileRows);
  const Divider32& inner = params.layout.inner;
  const int lane = threadIdx.x % kWarpSize;
  const auto tiles = static_cast<uint32_t>(n_vec / kTile);  // n < 2^31
  uint32_t buffer = 0;
  for (uint32_t t = blockIdx.x; t < tiles; t += gridDim.x, buffer ^= kTileRows) {
    const uint32_t t0 = t * kTile;
    // the tile's loads first: in flight over the rows' constants and the barrier
    uint32_t e[kQuantizeTrip];
    Pack<scalar_t, V> in[kQuantizeTrip];
#pragma unroll
    for (int h = 0; h < kQuantizeTrip; ++h) {
      e[h] = t0 + (h * kThreads + threadIdx.x) * V;
      in[h] = load_lane<V>(x, e[h], n);
    }
    const uint32_t first = inner.div(t0), count = inner.div(t0 + kTile - 1) - first + 1;
    for (uint32_t r = threadIdx.x; r < count; r += kThreads) make_row(rows + buffer + r, params, first + r);
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kQuantizeTrip; ++h) {
      quantize_lane_row<V, F, O, W, M>(x, y, mask, e[h], n, in[h], rows[buffer + inner.div(e[h]) - first], lane);
    }
  }
  RowLookup<Family> lookup(params);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int64_t scalar_tiles = (n - n_vec + kWarpSize - 1) / kWarpSize;
  for (int64_t t = warp; t < scalar_tiles; t += nwarps) {
    const int64_t e = n_vec + t * kWarpSize + lane;
    quantize_lane<1, F, O, W, M>(x, y, mask, e, n, load_lane<1>(x, e, n), lookup, params, lane);
  }
}

// The table of TableParams: the constants of each parameter.
template <typename C, typename Family>
__global__ void prepare_kernel(Consts<C>* __restrict__ table, int64_t count, const Family family) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) table[i] = with_divisor(family.template make<C>(i));
}

// --- backward: grad where mask, else +0 --------------------------------------------

// Elements [0, n_vec) as 128-bit vectors, then [n_vec, n) one by one. A packed
// mask holds element e at bit e % 8 of byte e / 8; a bool mask one byte per
// element, used as it is (0 or 1), as the CPU kernel does.
template <typename bits_t, bool kPacked>
__global__ void __launch_bounds__(kThreads)
    mask_backward_kernel(const bits_t* __restrict__ grad, const uint8_t* __restrict__ mask,
                         bits_t* __restrict__ out, int64_t n, int64_t n_vec) {
  constexpr int V = 16 / static_cast<int>(sizeof(bits_t));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < n_vec / V; i += stride) {
    const int64_t e0 = i * V;
    const Pack<bits_t, V> g = *reinterpret_cast<const Pack<bits_t, V>*>(grad + e0);
    Pack<bits_t, V> o;
    if constexpr (kPacked) {
      const unsigned bits = mask[e0 / 8] >> (e0 % 8);  // V divides 8
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = select_bits(g.v[k], (bits >> k) & 1u);
    } else {
      union {
        typename MaskBytes<V>::type word;
        uint8_t bytes[V];
      } m;
      m.word = *reinterpret_cast<const typename MaskBytes<V>::type*>(mask + e0);
#pragma unroll
      for (int k = 0; k < V; ++k) o.v[k] = select_bits(g.v[k], m.bytes[k]);
    }
    *reinterpret_cast<Pack<bits_t, V>*>(out + e0) = o;
  }
  for (int64_t e = n_vec + tid; e < n; e += stride) {
    const unsigned m = kPacked ? (mask[e / 8] >> (e % 8)) & 1u : mask[e];
    out[e] = select_bits(grad[e], m);
  }
}

// --- packed mask words (the block-wise kernels: blockwise.cu, ggml.cu) ----------------------

// The bits of elements [32 w, 32 w + 32), stored by the word's only writer;
// the mask's last word byte by byte, so that nothing past the mask is written.
inline __device__ __noinline__ void store_mask_tail(uint32_t* __restrict__ words, int64_t mask_bytes,
                                                    int64_t w, uint32_t bits) {
  uint8_t* bytes = reinterpret_cast<uint8_t*>(words + w);
  for (int64_t b = 0; w * 4 + b < mask_bytes; ++b) bytes[b] = static_cast<uint8_t>(bits >> (8 * b));
}

__device__ __forceinline__ void store_mask_word(uint32_t* __restrict__ words, int64_t mask_bytes,
                                                int64_t w, uint32_t bits) {
  if ((w + 1) * 4 <= mask_bytes) {
    words[w] = bits;
  } else {
    store_mask_tail(words, mask_bytes, w, bits);
  }
}

// Bit k of `bits` is the mask bit of element pos + k: or-ed into zeroed
// scratch words, which blocks may share.
__device__ __forceinline__ void or_mask_bits(uint32_t* __restrict__ words, int64_t pos, uint32_t bits) {
  if (bits == 0) return;
  const int shift = static_cast<int>(pos % 32);
  atomicOr(words + pos / 32, bits << shift);
  if (shift != 0 && (bits >> (32 - shift)) != 0) atomicOr(words + pos / 32 + 1, bits >> (32 - shift));
}

}  // namespace gpu
}  // namespace fakequant
