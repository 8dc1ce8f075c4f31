#pragma once
// A SIMT emulator of ours: the CUDA device code of csrc/cuda compiles with the
// host C++ compiler against this header (FAKEQUANT_SIMT_EMULATOR defined, no
// __CUDACC__), and its kernels then run on the CPU so that tests can compare
// them bit for bit with the CPU operators, under AddressSanitizer, UBSan and
// ThreadSanitizer. Nothing here is used by the real CUDA build: it is test
// infrastructure, kept with the tests and left out of the sdist and the wheel
// (tools/check_dist.py fails a distribution that holds it).
//
// What it models
// - gridDim, blockDim, blockIdx, threadIdx (x, y, z). Every thread of a block
//   is a fiber (ucontext, its own stack) of the launching OS thread, and all of
//   them are alive at once: a fiber runs until it waits (at __syncthreads or in
//   a warp-level call) or returns, then the next one that can run does, in
//   thread order, so runs are deterministic. The blocks of a grid run one after
//   another. Fibers switch in about a microsecond, where OS threads took
//   hundreds at every warp-level call.
// - ThreadSanitizer (when the file is built with it) sees every thread of a
//   block as a thread of its own, with the happens-before edges of the CUDA
//   model only: a barrier, a warp-level call among its lanes, an atomic. So two
//   threads of a block, or of two blocks, writing one global or shared address
//   (or one writing, one reading) without those in between are reported, as a
//   GPU would race. AddressSanitizer is told which stack is in use.
// - __syncthreads() as a barrier of the block's threads (a thread that has
//   returned from the kernel counts as arrived, as on sm_70 and later);
//   shared memory per block (FQ_SHARED; a plain __shared__ is accepted as one
//   static copy, which blocks take in turn); __launch_bounds__ is accepted and
//   launches with more threads than it allows are refused, as the driver does.
// - Warps of 32 lanes (warpSize): __shfl_sync, __shfl_up_sync,
//   __shfl_down_sync, __shfl_xor_sync (any width that is a power of two up to
//   32), __ballot_sync, __any_sync, __all_sync, __activemask. A warp-level call
//   completes when every lane named in its mask has reached the same call.
//   A lane named in the mask that has returned from the kernel, waits at
//   __syncthreads, or reaches a warp-level call with another mask, is reported
//   as divergence: the launch fails with a message, it does not hang; so is a
//   block in which no thread can run any more. Reading
//   a lane outside the mask, or a calling lane missing from its own mask, is
//   reported too. Two groups of lanes of one warp in calls with disjoint masks
//   at the same time (legal on sm_70 and later) are reported as divergence as
//   well: the kernels here name one mask per call site.
// - Atomics (atomicAdd, atomicSub, atomicOr, atomicAnd, atomicXor, atomicMax,
//   atomicMin, atomicExch, atomicCAS) on 32- and 64-bit integers, atomicAdd on
//   float and double, as sequentially consistent host atomics (ThreadSanitizer
//   understands them).
// - The correctly rounded intrinsics (__fdiv_rn, __fmul_rn, __fadd_rn, __fsub_rn,
//   their double forms, __float2int_rn, __double2float_rn, ...) as the plain
//   host operators, which round to nearest even once per operation when the
//   file is compiled with -ffp-contract=off and without -ffast-math (setup.py
//   and the emulation build do so); bit casts, __ldg, __popc, __ffs, __clz, __vmaxu2, __vminu2, __vmaxs2, __byte_perm.
// - Vector types (float2, float4, double2, int2, int4, uint2, uint4, ...) with
//   their CUDA alignment; simt::check_aligned and fq_load/fq_store helpers
//   report any vector access whose address is not a multiple of its size, as
//   the GPU would fault on it (UBSan's alignment check catches a plain
//   dereference of a misaligned aligned type too).
// - half and bfloat16 through c10::Half and c10::BFloat16, which the kernels
//   use on both targets.
//
// What it does not model: the memory consistency model (host atomics are
// stronger than the GPU's; a missing __threadfence is invisible), timing,
// occupancy, shared-memory bank conflicts, the limits of shared memory and
// registers, warp scheduling (lanes of a warp run one after another between
// warp-level calls; a result that depends on their interleaving shows up only
// through ThreadSanitizer), blocks running at the same time (they run one after
// another; ThreadSanitizer still reports their conflicting accesses), a thread
// that spins waiting for another without a barrier or warp-level call (it
// never yields: the launch hangs), streams (everything is synchronous), and
// dynamic parallelism. __activemask() returns the lanes of the warp that have
// not returned.
#if defined(__CUDACC__)
#error "simt_emulator.h is for the host compiler only"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>

// --- qualifiers -------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __grid_constant__
#define __shared__ static
#define __constant__ static
#define __launch_bounds__(...)

// --- index types ------------------------------------------------------------------

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

namespace simt {

inline thread_local uint3 thread_idx{0, 0, 0};
inline thread_local uint3 block_idx{0, 0, 0};
inline thread_local dim3 block_dim{1, 1, 1};
inline thread_local dim3 grid_dim{1, 1, 1};

}  // namespace simt

#define threadIdx (::simt::thread_idx)
#define blockIdx (::simt::block_idx)
#define blockDim (::simt::block_dim)
#define gridDim (::simt::grid_dim)
constexpr int warpSize = 32;

// --- vector types -------------------------------------------------------------------

#define FQ_SIMT_VECTOR2(name, T, align) \
  struct alignas(align) name {          \
    T x, y;                             \
  };
#define FQ_SIMT_VECTOR4(name, T, align) \
  struct alignas(align) name {          \
    T x, y, z, w;                       \
  };
FQ_SIMT_VECTOR2(float2, float, 8)
FQ_SIMT_VECTOR4(float4, float, 16)
FQ_SIMT_VECTOR2(double2, double, 16)
FQ_SIMT_VECTOR2(int2, int, 8)
FQ_SIMT_VECTOR4(int4, int, 16)
FQ_SIMT_VECTOR2(uint2, unsigned int, 8)
FQ_SIMT_VECTOR4(uint4, unsigned int, 16)
FQ_SIMT_VECTOR2(longlong2, long long, 16)
FQ_SIMT_VECTOR2(ulonglong2, unsigned long long, 16)
FQ_SIMT_VECTOR2(short2, short, 4)
FQ_SIMT_VECTOR2(ushort2, unsigned short, 4)
FQ_SIMT_VECTOR4(ushort4, unsigned short, 8)
#undef FQ_SIMT_VECTOR2
#undef FQ_SIMT_VECTOR4

namespace simt {

// The error a launch reports; what() says what went wrong where.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown inside the other threads of a block once one has failed, to unwind them.
struct Aborted {};

[[noreturn]] void fail(const std::string& what);

// The address of every vector access must be a multiple of its size.
inline void check_aligned(const void* p, size_t size, const char* what = "vector access") {
  if (reinterpret_cast<uintptr_t>(p) % size != 0) {
    std::ostringstream s;
    s << "misaligned " << what << ": address " << p << " is not a multiple of " << size
      << " bytes (thread " << thread_idx.x << " of block " << block_idx.x << ")";
    fail(s.str());
  }
}

// --- one block's threads, as fibers ------------------------------------------------

// Sanitizer support: fiber switches are announced to AddressSanitizer (the
// stack in use) and to ThreadSanitizer (each thread of a block is a fiber of
// its own, switched without synchronisation; the happens-before edges of the
// CUDA model, barriers and warp-level calls, are announced explicitly, and the
// emulator's own bookkeeping is hidden from it).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FQ_SIMT_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define FQ_SIMT_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FQ_SIMT_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define FQ_SIMT_TSAN 1
#endif
#if defined(FQ_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(FQ_SIMT_TSAN)
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

enum class State : uint8_t { kRunnable, kAtBarrier, kAtWarpCall, kExited };

// Hides the emulator's own reads and writes from ThreadSanitizer.
struct Quiet {
  Quiet() {
#if defined(FQ_SIMT_TSAN)
    __tsan_ignore_thread_begin();
#endif
  }
  ~Quiet() {
#if defined(FQ_SIMT_TSAN)
    __tsan_ignore_thread_end();
#endif
  }
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;
};

inline void release(void* sync) {
#if defined(FQ_SIMT_TSAN)
  __tsan_release(sync);
#else
  (void)sync;
#endif
}
inline void acquire(void* sync) {
#if defined(FQ_SIMT_TSAN)
  __tsan_acquire(sync);
#else
  (void)sync;
#endif
}

struct Warp {
  uint64_t generation = 0;  // completed warp-level calls
  unsigned arrived = 0;     // lanes waiting in the current call
  unsigned call_mask = 0;   // the mask of the current call
  uint64_t value[32] = {};  // what each lane put in
  char sync[2] = {};        // happens-before of even and odd calls (ThreadSanitizer)
};

// One thread's fiber: its stack (mmap-ed, above a guard page), context, and
// ThreadSanitizer fiber. Kept from launch to launch by the OS thread that launches.
struct Fiber {
  // (AddressSanitizer clears a stack's shadow at every switch to it: kept
  // small enough for that to be a memset, not a remapping)
  static constexpr size_t kStack =
#if defined(FQ_SIMT_ASAN)
      size_t{128} << 10;
#elif defined(FQ_SIMT_TSAN)
      size_t{1} << 20;
#else
      size_t{256} << 10;
#endif
  static constexpr size_t kGuard = 4096;
  char* mapping = nullptr;
  ucontext_t context;
  void* tsan = nullptr;
  State state = State::kRunnable;
  uint64_t snapshot[32] = {};  // the warp's values at this thread's last completed warp call

  char* stack() const { return mapping + kGuard; }
  void allocate() {
    void* p = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw Error("simt emulator: cannot map a fiber stack");
    mapping = static_cast<char*>(p);
    mprotect(mapping, kGuard, PROT_NONE);  // a stack overflow faults instead of corrupting memory
#if defined(FQ_SIMT_TSAN)
    tsan = __tsan_create_fiber(0);
#endif
  }
  void release_resources() {
    if (mapping != nullptr) munmap(mapping, kStack + kGuard);
    mapping = nullptr;
#if defined(FQ_SIMT_TSAN)
    if (tsan != nullptr) __tsan_destroy_fiber(tsan);
#endif
    tsan = nullptr;
  }
  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber() { release_resources(); }
};

constexpr unsigned kMaxThreads = 1024;
// Fiber sets: block b runs on set b % kFiberSets. Under ThreadSanitizer a
// fiber is one logical thread, so the threads of blocks on different sets are
// unordered and their conflicting accesses reported (16 sets: every block of
// a grid of up to 16 blocks, or any two of 16 consecutive ones); one set
// otherwise.
#if defined(FQ_SIMT_TSAN)
constexpr unsigned kFiberSets = 16;
#else
constexpr unsigned kFiberSets = 1;
#endif

// The state of one launch: the block being run, its barrier and warps.
struct Launch {
  dim3 grid, block;
  unsigned threads = 0;
  const std::function<void()>* body = nullptr;
  std::vector<std::unique_ptr<Fiber>>* fibers = nullptr;
  std::vector<Warp> warps;
  unsigned at_barrier = 0, exited = 0;
  uint64_t barrier_generation = 0;
  bool aborted = false;
  std::string error;
  ucontext_t scheduler;
  void* scheduler_tsan = nullptr;
  const void* scheduler_stack = nullptr;  // (AddressSanitizer)
  size_t scheduler_stack_size = 0;
  char start_sync = 0, done_sync = 0, barrier_sync[2] = {};
  // Blocks on one fiber set are ordered (their shared memory is one copy).
  char set_sync[kFiberSets] = {};

  unsigned set = 0;  // the fiber set of the running block
  Fiber& fiber(unsigned tid) { return *(*fibers)[set * kMaxThreads + tid]; }
};

inline thread_local Launch* current = nullptr;
inline thread_local unsigned linear_tid = 0;

inline void abort_launch(Launch& L, const std::string& what) {
  if (!L.aborted) {
    L.aborted = true;
    L.error = what;
  }
}

[[noreturn]] inline void fail(const std::string& what) {
  Launch* L = current;
  if (L == nullptr) throw Error(what);
  {
    Quiet q;
    abort_launch(*L, what);
  }
  throw Aborted{};
}

inline std::string where(unsigned tid) {
  std::ostringstream s;
  s << "thread " << tid << " (warp " << tid / 32 << ", lane " << tid % 32 << ") of block ("
    << block_idx.x << ", " << block_idx.y << ", " << block_idx.z << ")";
  return s.str();
}

// The fiber of thread `tid` runs until it waits or returns.
inline void switch_to(Launch& L, unsigned tid) {
  Fiber& f = L.fiber(tid);
#if defined(FQ_SIMT_TSAN)
  __tsan_switch_to_fiber(f.tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(FQ_SIMT_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack(), Fiber::kStack);
#endif
  swapcontext(&L.scheduler, &f.context);
#if defined(FQ_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// The running fiber hands back to the scheduler (for good when `finished`).
// What it needs of the launch is read quietly first: a finished fiber is not
// resumed, so it must not switch inside a Quiet scope.
inline void yield(Launch& L, bool finished = false) {
  Fiber* f;
  ucontext_t* scheduler;
  [[maybe_unused]] void* scheduler_tsan;
  [[maybe_unused]] const void* stack;
  [[maybe_unused]] size_t stack_size;
  {
    Quiet q;
    f = &L.fiber(linear_tid);
    scheduler = &L.scheduler;
    scheduler_tsan = L.scheduler_tsan;
    stack = L.scheduler_stack;
    stack_size = L.scheduler_stack_size;
  }
#if defined(FQ_SIMT_TSAN)
  __tsan_switch_to_fiber(scheduler_tsan, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(FQ_SIMT_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, stack, stack_size);
#endif
  swapcontext(&f->context, scheduler);
#if defined(FQ_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  (void)finished;
}

// Divergence: a lane that the current warp call of `warp` waits for can never come.
inline void check_warp_divergence(Launch& L, unsigned warp) {
  Warp& w = L.warps[warp];
  if (w.arrived == 0) return;
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (!(w.call_mask >> lane & 1u) || (w.arrived >> lane & 1u)) continue;
    const unsigned tid = warp * 32 + lane;
    if (tid >= L.threads) {
      abort_launch(L, "divergence: a warp-level call names lane " + std::to_string(lane) +
                          ", which does not exist in a block of " + std::to_string(L.threads) +
                          " threads (" + where(warp * 32 + __builtin_ctz(w.arrived)) + ")");
      return;
    }
    const State s = L.fiber(tid).state;
    if (s == State::kExited || s == State::kAtBarrier) {
      abort_launch(L, std::string("divergence: a warp-level call waits for ") + where(tid) +
                          (s == State::kExited ? ", which has returned" : ", which waits at __syncthreads"));
      return;
    }
  }
}

// The thread changes state (to the barrier, or out of the kernel): a warp call
// waiting for it can no longer complete.
inline void set_state(Launch& L, State s) {
  L.fiber(linear_tid).state = s;
  if (s == State::kExited || s == State::kAtBarrier) check_warp_divergence(L, linear_tid / 32);
}

inline void complete_barrier(Launch& L) {
  L.at_barrier = 0;
  ++L.barrier_generation;
  for (unsigned t = 0; t < L.threads; ++t) {
    if (L.fiber(t).state == State::kAtBarrier) L.fiber(t).state = State::kRunnable;
  }
}

inline void syncthreads() {
  Launch& L = *current;
  Quiet q;
  if (L.aborted) throw Aborted{};
  set_state(L, State::kAtBarrier);
  if (L.aborted) throw Aborted{};
  const uint64_t gen = L.barrier_generation;
  release(&L.barrier_sync[gen & 1]);
  if (++L.at_barrier + L.exited == L.threads) {
    complete_barrier(L);
  } else {
    yield(L);
    if (L.aborted) throw Aborted{};  // resumed only to unwind
  }
  acquire(&L.barrier_sync[gen & 1]);
}

// One warp-level call: each lane of `mask` puts in a 64-bit value; returns the
// values of the whole warp as they were when the last lane of `mask` arrived.
inline const uint64_t* warp_exchange(unsigned mask, uint64_t v, const char* what) {
  Launch& L = *current;
  Quiet q;
  const unsigned tid = linear_tid, warp = tid / 32, lane = tid % 32;
  Warp& w = L.warps[warp];
  if (L.aborted) throw Aborted{};
  if (!(mask >> lane & 1u)) {
    abort_launch(L, std::string(what) + ": the calling lane is not in its mask (" + where(tid) + ")");
    throw Aborted{};
  }
  if (w.arrived != 0 && w.call_mask != mask) {
    std::ostringstream s;
    s << "divergence: " << where(tid) << " calls " << what << " with mask 0x" << std::hex << mask
      << " while lanes 0x" << w.arrived << " wait in a call with mask 0x" << w.call_mask;
    abort_launch(L, s.str());
    throw Aborted{};
  }
  w.call_mask = mask;
  w.arrived |= 1u << lane;
  w.value[lane] = v;
  const uint64_t gen = w.generation;
  release(&w.sync[gen & 1]);
  if ((w.arrived & mask) == mask) {
    for (unsigned l = 0; l < 32; ++l) {
      if ((mask >> l & 1u) && warp * 32 + l < L.threads) {
        Fiber& f = L.fiber(warp * 32 + l);
        std::copy(std::begin(w.value), std::end(w.value), std::begin(f.snapshot));
        f.state = State::kRunnable;
      }
    }
    w.arrived = 0;
    ++w.generation;
  } else {
    L.fiber(tid).state = State::kAtWarpCall;
    check_warp_divergence(L, warp);
    if (L.aborted) throw Aborted{};
    yield(L);
    if (L.aborted) throw Aborted{};  // resumed only to unwind
  }
  acquire(&w.sync[gen & 1]);
  return L.fiber(tid).snapshot;
}

template <typename T>
uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "a warp shuffle moves 8 bytes at most");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

inline unsigned lane_id() { return linear_tid % 32; }

inline void check_width(int width, const char* what) {
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
    fail(std::string(what) + ": width must be a power of two in [1, 32], got " + std::to_string(width));
  }
}

// The value of lane `src` of the warp, which must have taken part in the call.
template <typename T>
T read_lane(const uint64_t* values, unsigned mask, unsigned src, const char* what) {
  if (!(mask >> src & 1u)) {
    fail(std::string(what) + ": " + where(linear_tid) + " reads lane " + std::to_string(src) +
         ", which is not in the mask");
  }
  return from_bits<T>(values[src]);
}

template <typename T>
T shfl(unsigned mask, T v, int src_lane, int width) {
  check_width(width, "__shfl_sync");
  const uint64_t* all = warp_exchange(mask, to_bits(v), "__shfl_sync");
  const unsigned base = lane_id() / width * width;
  return read_lane<T>(all, mask, base + (static_cast<unsigned>(src_lane) % width), "__shfl_sync");
}

template <typename T>
T shfl_up(unsigned mask, T v, unsigned delta, int width) {
  check_width(width, "__shfl_up_sync");
  const uint64_t* all = warp_exchange(mask, to_bits(v), "__shfl_up_sync");
  const unsigned lane = lane_id(), in = lane % width;
  return in >= delta ? read_lane<T>(all, mask, lane - delta, "__shfl_up_sync") : v;
}

template <typename T>
T shfl_down(unsigned mask, T v, unsigned delta, int width) {
  check_width(width, "__shfl_down_sync");
  const uint64_t* all = warp_exchange(mask, to_bits(v), "__shfl_down_sync");
  const unsigned lane = lane_id(), in = lane % width;
  return in + delta < static_cast<unsigned>(width) ? read_lane<T>(all, mask, lane + delta, "__shfl_down_sync")
                                                  : v;
}

template <typename T>
T shfl_xor(unsigned mask, T v, int lane_mask, int width) {
  check_width(width, "__shfl_xor_sync");
  const uint64_t* all = warp_exchange(mask, to_bits(v), "__shfl_xor_sync");
  const unsigned lane = lane_id(), src = lane ^ static_cast<unsigned>(lane_mask);
  // A source outside this lane's group of `width` lanes gives the lane's own value.
  if (src / width != lane / width || src >= 32) return v;
  return read_lane<T>(all, mask, src, "__shfl_xor_sync");
}

inline unsigned ballot(unsigned mask, int predicate) {
  const uint64_t* all = warp_exchange(mask, predicate != 0, "__ballot_sync");
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; ++l) {
    if ((mask >> l & 1u) && all[l] != 0) bits |= 1u << l;
  }
  return bits;
}

inline unsigned activemask() {
  Launch& L = *current;
  Quiet q;
  const unsigned warp = linear_tid / 32;
  unsigned bits = 0;
  for (unsigned l = 0; l < 32 && warp * 32 + l < L.threads; ++l) {
    if (L.fiber(warp * 32 + l).state != State::kExited) bits |= 1u << l;
  }
  return bits;
}

// Shared memory: FQ_SHARED(T, name, n) declares `T name[n]` for the block, one
// copy per fiber set (the lambda makes each declaration, in each template
// instantiation, a storage of its own). A plain __shared__ is one static copy
// for all blocks: right while blocks run one after another, but ThreadSanitizer
// would take two blocks' uses of it for a race.
template <typename T, size_t N, typename Tag>
T* shared_array(Tag) {
  alignas(16) static T storage[kFiberSets][N];
  return storage[current->set];
}
#define FQ_SHARED(T, name, n) T* const name = ::simt::shared_array<T, (n)>([] {})

// --- launching --------------------------------------------------------------------------

constexpr unsigned kMaxThreadsPerBlock = kMaxThreads;

// Where every fiber starts: the kernel for one block, then back to the scheduler for good.
inline void fiber_main() {
  Launch* launch;
  unsigned tid;
  const std::function<void()>* body;
  {
    Quiet q;
    launch = current;
    tid = linear_tid;
    body = launch->body;
#if defined(FQ_SIMT_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &launch->scheduler_stack, &launch->scheduler_stack_size);
#endif
  }
  Launch& L = *launch;
  try {
    acquire(&L.start_sync);
    acquire(&L.set_sync[L.set]);
    (*body)();
  } catch (const Aborted&) {
  } catch (const std::exception& e) {
    Quiet q;
    abort_launch(L, where(tid) + ": " + e.what());
  }
  {
    Quiet q;
    if (!L.aborted) {
      set_state(L, State::kExited);
      ++L.exited;
      // A barrier that waited for this thread may now be complete.
      if (L.at_barrier > 0 && L.at_barrier + L.exited == L.threads) complete_barrier(L);
    } else {
      L.fiber(tid).state = State::kExited;
    }
    release(&L.done_sync);
    release(&L.set_sync[L.set]);
  }
  yield(L, /*finished=*/true);
  __builtin_unreachable();
}

// The fiber set to run fiber_main on its own stack (kept out of launch(),
// which getcontext would otherwise return to twice).
__attribute__((noinline)) inline void start_fiber(Fiber& f) {
  f.state = State::kRunnable;
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack();
  f.context.uc_stack.ss_size = Fiber::kStack;
  f.context.uc_link = nullptr;
  makecontext(&f.context, &fiber_main, 0);
#if defined(FQ_SIMT_ASAN)
  ASAN_UNPOISON_MEMORY_REGION(f.stack(), Fiber::kStack);
#endif
}

// What waits when no thread of the block can run.
inline std::string describe_hang(Launch& L) {
  std::ostringstream s;
  s << "hang: no thread of block (" << block_idx.x << ", " << block_idx.y << ", " << block_idx.z
    << ") can run:";
  unsigned shown = 0;
  for (unsigned t = 0; t < L.threads && shown < 4; ++t) {
    const State st = L.fiber(t).state;
    if (st == State::kAtBarrier || st == State::kAtWarpCall) {
      s << " " << where(t) << (st == State::kAtBarrier ? " waits at __syncthreads;" : " waits in a warp-level call;");
      ++shown;
    }
  }
  return s.str();
}

// Runs `body` (the kernel with its arguments) on every thread of every block of
// `grid`, blocks one after another, each block's threads as fibers of the
// calling OS thread. Throws simt::Error on the first error of any thread
// (divergence, misaligned access, hang, or an exception thrown by the body).
inline void launch(dim3 grid, dim3 block, unsigned max_threads, const std::function<void()>& body) {
  const uint64_t threads64 = uint64_t{block.x} * block.y * block.z;
  if (threads64 == 0 || threads64 > std::min(max_threads, kMaxThreadsPerBlock)) {
    throw Error("launch: " + std::to_string(threads64) + " threads per block, the kernel allows 1 to " +
                std::to_string(std::min(max_threads, kMaxThreadsPerBlock)));
  }
  if (uint64_t{grid.x} * grid.y * grid.z == 0) throw Error("launch: the grid is empty");
  if (current != nullptr) throw Error("launch: a kernel cannot launch another in the emulator");
  static thread_local std::vector<std::unique_ptr<Fiber>> pool;
  Launch L;
  L.grid = grid;
  L.block = block;
  L.threads = static_cast<unsigned>(threads64);
  L.body = &body;
  L.fibers = &pool;
  L.warps.resize((L.threads + 31) / 32);
  const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
  const unsigned sets = static_cast<unsigned>(std::min<uint64_t>(blocks, kFiberSets));
  pool.resize(kFiberSets * kMaxThreads);
  for (unsigned set = 0; set < sets; ++set) {
    for (unsigned t = 0; t < L.threads; ++t) {
      auto& f = pool[set * kMaxThreads + t];
      if (f == nullptr) f = std::make_unique<Fiber>();
      if (f->mapping == nullptr) f->allocate();
    }
  }
#if defined(FQ_SIMT_TSAN)
  L.scheduler_tsan = __tsan_get_current_fiber();
#endif
  release(&L.start_sync);
  {
    Quiet q;  // (the scheduler's writes, current and threadIdx among them, are not the kernel's)
    current = &L;
    for (uint64_t b = 0; b < blocks && !L.aborted; ++b) {
      L.set = static_cast<unsigned>(b % kFiberSets);
      block_idx = uint3{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                        static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
      block_dim = block;
      grid_dim = grid;
      L.at_barrier = L.exited = 0;
      for (auto& w : L.warps) w.arrived = 0;
      for (unsigned t = 0; t < L.threads; ++t) {
        start_fiber(L.fiber(t));
      }
      while (L.exited < L.threads && !L.aborted) {
        bool ran = false;
        for (unsigned t = 0; t < L.threads && !L.aborted; ++t) {
          if (L.fiber(t).state != State::kRunnable) continue;
          linear_tid = t;
          thread_idx = uint3{t % block.x, t / block.x % block.y, t / (block.x * block.y)};
          switch_to(L, t);
          ran = true;
        }
        if (!ran && !L.aborted && L.exited < L.threads) abort_launch(L, describe_hang(L));
      }
    }
    // After an error the threads still waiting are resumed once, to unwind.
    for (unsigned t = 0; t < L.threads && L.aborted; ++t) {
      if (L.fiber(t).state == State::kExited) continue;
      linear_tid = t;
      switch_to(L, t);
    }
    current = nullptr;
  }
  acquire(&L.done_sync);
  if (L.aborted) throw Error("simt emulator: " + L.error);
}

}  // namespace simt

// --- the CUDA names ----------------------------------------------------------------------

inline void __syncthreads() { simt::syncthreads(); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
  return simt::shfl(mask, v, src_lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return simt::shfl_up(mask, v, delta, width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return simt::shfl_down(mask, v, delta, width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  return simt::shfl_xor(mask, v, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) { return simt::ballot(mask, predicate); }
inline int __any_sync(unsigned mask, int predicate) { return simt::ballot(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return simt::ballot(mask, predicate) == mask; }
inline unsigned __activemask() { return simt::activemask(); }

// Atomics: the old value, as CUDA returns it.
#define FQ_SIMT_ATOMIC(name, builtin)                                   \
  template <typename T>                                                 \
  T name(T* address, T v) {                                             \
    static_assert(std::is_integral_v<T>, #name " takes an integer");   \
    return builtin(address, v, __ATOMIC_SEQ_CST);                      \
  }
FQ_SIMT_ATOMIC(atomicOr, __atomic_fetch_or)
FQ_SIMT_ATOMIC(atomicAnd, __atomic_fetch_and)
FQ_SIMT_ATOMIC(atomicXor, __atomic_fetch_xor)
FQ_SIMT_ATOMIC(atomicSub, __atomic_fetch_sub)
FQ_SIMT_ATOMIC(atomicExch, __atomic_exchange_n)
#undef FQ_SIMT_ATOMIC

template <typename T>
T atomicCAS(T* address, T compare, T v) {
  __atomic_compare_exchange_n(address, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;  // the value found: `compare` itself when the swap happened
}

template <typename T, typename Op>
T simt_atomic_update(T* address, Op op) {
  T old = __atomic_load_n(address, __ATOMIC_SEQ_CST);
  while (!__atomic_compare_exchange_n(address, &old, op(old), true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}

template <typename T>
T atomicAdd(T* address, T v) {
  if constexpr (std::is_integral_v<T>) {
    return __atomic_fetch_add(address, v, __ATOMIC_SEQ_CST);
  } else {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "atomicAdd: float or double");
    using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
    auto* bits = reinterpret_cast<Bits*>(address);
    const Bits old = simt_atomic_update(bits, [v](Bits b) {
      T f;
      std::memcpy(&f, &b, sizeof f);
      f = f + v;
      Bits r;
      std::memcpy(&r, &f, sizeof r);
      return r;
    });
    T f;
    std::memcpy(&f, &old, sizeof f);
    return f;
  }
}
template <typename T>
T atomicMax(T* address, T v) {
  static_assert(std::is_integral_v<T>, "atomicMax takes an integer");
  return simt_atomic_update(address, [v](T o) { return o < v ? v : o; });
}
template <typename T>
T atomicMin(T* address, T v) {
  static_assert(std::is_integral_v<T>, "atomicMin takes an integer");
  return simt_atomic_update(address, [v](T o) { return v < o ? v : o; });
}

// Correctly rounded arithmetic: one IEEE operation each (no contraction here).
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline int __float2int_rn(float v) { return static_cast<int>(std::nearbyint(v)); }
inline int __float2int_rz(float v) { return static_cast<int>(v); }
inline long long __float2ll_rn(float v) { return static_cast<long long>(std::nearbyint(v)); }
inline int __double2int_rn(double v) { return static_cast<int>(std::nearbyint(v)); }
inline long long __double2ll_rn(double v) { return static_cast<long long>(std::nearbyint(v)); }
inline float __double2float_rn(double v) { return static_cast<float>(v); }
inline float __int2float_rn(int v) { return static_cast<float>(v); }
inline double __int2double_rn(int v) { return static_cast<double>(v); }
inline float __ll2float_rn(long long v) { return static_cast<float>(v); }
inline double __ll2double_rn(long long v) { return static_cast<double>(v); }

inline unsigned __float_as_uint(float v) { return simt::from_bits<unsigned>(simt::to_bits(v)); }
inline float __uint_as_float(unsigned v) { return simt::from_bits<float>(simt::to_bits(v)); }
inline int __float_as_int(float v) { return simt::from_bits<int>(simt::to_bits(v)); }
inline float __int_as_float(int v) { return simt::from_bits<float>(simt::to_bits(v)); }
inline long long __double_as_longlong(double v) { return simt::from_bits<long long>(simt::to_bits(v)); }
inline double __longlong_as_double(long long v) { return simt::from_bits<double>(simt::to_bits(v)); }

// The device's min and max overloads for the types the kernels use.
#define FQ_SIMT_MINMAX(T)                              \
  inline T max(T a, T b) { return a < b ? b : a; } \
  inline T min(T a, T b) { return b < a ? b : a; }
FQ_SIMT_MINMAX(int)
FQ_SIMT_MINMAX(unsigned int)
FQ_SIMT_MINMAX(long long)
FQ_SIMT_MINMAX(unsigned long long)
FQ_SIMT_MINMAX(long)
FQ_SIMT_MINMAX(unsigned long)
#undef FQ_SIMT_MINMAX

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz(static_cast<unsigned>(v)); }
// SIMD on the two unsigned 16-bit halves of a word (VIMNMX.U16x2 on compute capability 9.0).
inline unsigned __vmaxu2(unsigned a, unsigned b) {
  const unsigned hi = std::max(a >> 16, b >> 16), lo = std::max(a & 0xffffu, b & 0xffffu);
  return (hi << 16) | lo;
}
inline unsigned __vminu2(unsigned a, unsigned b) {
  const unsigned hi = std::min(a >> 16, b >> 16), lo = std::min(a & 0xffffu, b & 0xffffu);
  return (hi << 16) | lo;
}
// ... and on the two signed 16-bit halves (VIMNMX.S16x2).
inline unsigned __vmaxs2(unsigned a, unsigned b) {
  const auto half = [](unsigned v, int k) { return static_cast<int>(static_cast<int16_t>(v >> (16 * k))); };
  const unsigned hi = static_cast<uint16_t>(std::max(half(a, 1), half(b, 1)));
  const unsigned lo = static_cast<uint16_t>(std::max(half(a, 0), half(b, 0)));
  return (hi << 16) | lo;
}
// PRMT: byte n of the result is byte (s >> 4 n) & 7 of the eight bytes of x (0-3) and y (4-7).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long bytes = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<unsigned>((bytes >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
}
inline unsigned __brev(unsigned v) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}

// __ldg: a read-only load; a vector type must be aligned to its size.
template <typename T>
T __ldg(const T* p) {
  if constexpr (alignof(T) > 1 && sizeof(T) >= 8) simt::check_aligned(p, sizeof(T), "__ldg");
  return *p;
}

// Explicitly checked vector accesses, usable on both targets (the CUDA build's
// definitions are plain loads and stores).
template <typename V>
inline V fq_load(const V* p) {
  simt::check_aligned(p, sizeof(V));
  return *p;
}
template <typename V>
inline void fq_store(V* p, const V& v) {
  simt::check_aligned(p, sizeof(V));
  *p = v;
}

// The emulated form of `kernel<<<grid, block, shmem, stream>>>(args...)`.
// max_threads: the kernel's __launch_bounds__ (1024 when it has none).
template <typename... KernelArgs, typename... Args>
void simt_launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, unsigned max_threads,
                 Args&&... args) {
  auto bound = [&] { kernel(args...); };
  simt::launch(grid, block, max_threads, bound);
}
