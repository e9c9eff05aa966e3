// The CUDA execution model in plain C++, enough of it to run cuda/kernels/*.cuh on a CPU.
//
// Build (what cuda/emulated.py runs):
//   c++ -std=c++17 -O2 -pthread -shared -fPIC -fvisibility=hidden -Icuda cuda/emulate/emulate.cpp -o /tmp/libdense_emu.so
//
// A grid is a loop over blocks; a block is a team of threads that meet at barriers. Blocks run
// one after another. The threads of a block are fibers (cuda/emulate/fibers.h): one OS thread
// switches between them, a few nanoseconds a switch.
//   - A launch starts the block's blockDim.x·y·z fibers and resumes, in thread order, every one
//     that can run, until all have returned.
//   - __syncthreads() is a barrier: a fiber that reaches it waits (switches away); the last of
//     the block to reach it releases the others and goes on.
//   - When no fiber can run and some have not returned, a thread waits at a barrier that another
//     will never reach (a __syncthreads inside a branch that not every thread takes): the launch
//     stops and says so. On a GPU that hangs or worse.
//   - __shared__ becomes `static`: one copy per kernel instantiation, and since only one block
//     runs at a time, that is one copy per block, as on the GPU.
//   - threadIdx/blockIdx/blockDim/gridDim are variables the scheduler sets before it resumes a
//     fiber (one GPU thread runs at a time).
//   - a warp is 32 consecutive threads (x fastest); __shfl_*_sync meet at a per-warp barrier and
//     exchange values through a per-warp buffer, so every lane of the warp must call them.
// With -DCUDA_EMU_THREADS, and always under ThreadSanitizer, the threads of a block are real OS
// threads (a pool, kept between launches) meeting at pthread barriers: ThreadSanitizer models
// pthread barriers, so it sees the happens-before edges the GPU guarantees and reports a race
// between two threads of a block. Every barrier then wakes OS threads (microseconds, not
// nanoseconds), and a barrier not every thread reaches hangs, as on a GPU.
// With -DCUDA_EMU_COUNT (cuda/emulate/counters.cpp, built by cuda/counters.py), every __shared__
// array lies in one known address range, and the scheduler tells the counters where each block-wide
// barrier ends an interval of accesses and which blocks of the grid to run (a sample): the
// compiler's instrumentation of every load and store does the rest, the kernels stay unchanged.
// Not modelled: warps executing in lock step (code relying on it without __syncwarp is a race
// here, as it is on Volta and later), timing, caches, the limits of registers (but for setmaxnreg's
// pool, hopper.h) and shared memory, and uninitialised shared memory (static storage starts at zero). Coalescing and bank conflicts
// are counted, not timed, by the CUDA_EMU_COUNT build alone.
#pragma once

// Standard headers first: the macros below (e.g. __noinline__) would break their attributes.
#include <pthread.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#define CUDA_EMU_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CUDA_EMU_THREADS 1
#endif
#endif
#ifdef CUDA_EMU_THREADS
#define CUDA_EMU_PER_THREAD thread_local
#else
#include "fibers.h"
#define CUDA_EMU_PER_THREAD
#endif

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#ifdef CUDA_EMU_COUNT
#ifdef CUDA_EMU_THREADS
#error "the memory counters run the fiber emulation (one OS thread, a deterministic order)"
#endif
// Shared arrays become thread-local: then they, and nothing else of the emulation (whose state is
// not thread-local with fibers), lie in this library's thread-local block, whose bounds tell the
// counters that an address is shared memory. (A linker section would be neater, but GCC ignores
// section attributes on the static variables of function templates.)
#define __shared__ static thread_local
#else
#define __shared__ static
#endif
#define __restrict__ __restrict

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) double2 {
  double x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

// bfloat16 and float16 as CUDA's headers define them for device code built by torch: a 16-bit
// pattern and no implicit conversions (torch compiles with -D__CUDA_NO_BFLOAT16_CONVERSIONS__ and
// the like), only the named intrinsics below. From float32 they round to nearest, ties to even,
// as cvt.rn does on the GPU: a NaN becomes the canonical 0x7FFF (torch gives 0x7FC0 for
// bfloat16: both are NaN), overflow becomes ±inf, and float16 keeps its subnormals.
struct __nv_bfloat16 {
  unsigned short __x;
};
struct __half {
  unsigned short __x;
};
inline float emu_bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t emu_float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __bfloat162float(__nv_bfloat16 v) { return emu_bits_to_float(uint32_t(v.__x) << 16); }
inline __nv_bfloat16 __float2bfloat16(float f) {
  const uint32_t u = emu_float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fff};
  // Add just under half of the dropped 16 bits' unit, plus the kept part's lowest bit: a tie rounds
  // up only when that bit is 1 (to even); a carry runs into the exponent (and to inf) as it should.
  return {static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
inline float __half2float(__half h) {
  const uint32_t sign = uint32_t(h.__x & 0x8000u) << 16, e = (h.__x >> 10) & 0x1fu, m = h.__x & 0x3ffu;
  if (e == 0x1f && m == 0) return emu_bits_to_float(sign | 0x7f800000u);  // ±inf
  if (e == 0x1f) return emu_bits_to_float(sign | 0x7fc00000u | (m << 13));  // NaN, quieted, its payload kept
  if (e != 0) return emu_bits_to_float(sign | ((e + 112) << 23) | (m << 13));  // 112 = 127 - 15
  return emu_bits_to_float(sign) + (sign ? -1.0f : 1.0f) * std::ldexp(float(m), -24);  // zero, subnormal
}
// The kept bits of x >> shift, rounded to nearest, ties to even.
inline uint32_t emu_round_shift(uint32_t x, int shift) {
  const uint32_t kept = x >> shift, rest = x & ((1u << shift) - 1), half = 1u << (shift - 1);
  return kept + (rest > half || (rest == half && (kept & 1u)));
}
inline __half __float2half(float f) {
  const uint32_t u = emu_float_to_bits(f), sign = (u >> 16) & 0x8000u, x = u & 0x7fffffffu;
  if (x > 0x7f800000u) return {0x7fff};
  const int e = int(x >> 23) - 127;
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  uint32_t h;
  if (x == 0x7f800000u || e > 15) h = 0x7c00u;           // inf, or beyond float16's range
  else if (e >= -14) h = emu_round_shift(((uint32_t(e + 15) << 23) | (m & 0x7fffffu)), 13);  // normal
  else if (e >= -25) h = emu_round_shift(m, -(e + 1));  // subnormal: m·2^(e+1) units of 2^-24
  else h = 0;                                            // under half the smallest subnormal
  if (h > 0x7c00u) h = 0x7c00u;
  return {static_cast<unsigned short>(sign | h)};
}

inline CUDA_EMU_PER_THREAD uint3 threadIdx, blockIdx;
inline CUDA_EMU_PER_THREAD dim3 blockDim, gridDim;
constexpr int warpSize = 32;

#ifdef CUDA_EMU_COUNT
// Defined by the counters (cuda/emulate/counters.cpp).
namespace emu::count {
void launch_begin(unsigned gx, unsigned gy, unsigned gz, unsigned threads);
bool block_wanted();  // this blockIdx is in the sample the counters emulate
void interval_end();  // every thread of the block is at __syncthreads, or has returned
void launch_end();
void cp_async(const void* shared_dst, const void* global_src, unsigned bytes);  // one thread's copy, as issued
}  // namespace emu::count
#define CUDA_EMU_COUNT_HOOK(call) emu::count::call
#else
#define CUDA_EMU_COUNT_HOOK(call) ((void)0)
#endif

namespace emu {

// What a launch returns: 0, kBarrierNeverReached (the block could not finish), or
// kProtocolError (a kernel broke a rule of an asynchronous instruction: hopper.h reports which).
constexpr int kBarrierNeverReached = 2;
constexpr int kProtocolError = 4;
inline std::atomic<int> protocol_error{0};
inline void report_protocol_error() { protocol_error.store(kProtocolError); }

inline void check(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "cuda_emu: %s failed (%d)\n", what, rc);
    std::abort();
  }
}

#ifdef CUDA_EMU_THREADS
struct Barrier {
  pthread_barrier_t b;
  void init(unsigned n) { check(pthread_barrier_init(&b, nullptr, n), "pthread_barrier_init"); }
  void destroy() { pthread_barrier_destroy(&b); }
  void wait() { pthread_barrier_wait(&b); }
};
#else
struct Barrier {
  unsigned expected = 0, arrived = 0;
  std::vector<unsigned> waiting;  // the fibers (thread indices) that wait here
  void init(unsigned n) {
    expected = n;
    waiting.reserve(n);
  }
  void destroy() {}
  void wait();  // below, with the scheduler
};
#endif

// One warp's meeting point for the shuffles.
struct Warp {
  Barrier barrier;
  alignas(16) unsigned char slot[32][16];
  alignas(16) unsigned char wide[32][64];  // the operands of the matrix instructions (warp_matrix.h)
};

// One thread's cp.async copies in flight (cuda/kernels/instructions.cuh): made at the wait that
// completes their group, not at issue.
struct PendingCopy {
  void* dst;
  const void* src;
  unsigned bytes;
};
struct AsyncCopies {
  std::vector<PendingCopy> copies;   // in issue order
  std::vector<size_t> group_ends;    // committed groups: the end index of each in `copies`
};

// Four consecutive warps (128 threads), which the Hopper instructions (hopper.h) act on together.
struct Warpgroup {
  Barrier barrier;
  alignas(16) unsigned char slot[128][32];
};

struct Block {
  Barrier barrier;
  std::vector<Warp> warps;
  std::vector<AsyncCopies> copies;  // per thread of the block
  std::vector<Warpgroup> warpgroups;
  unsigned char* dynamic_shared = nullptr;  // the launch's dynamic shared memory (1024-byte aligned)
  size_t dynamic_bytes = 0;
  // Registers a thread at launch: ptxas's count for the kernel, where the kernel declares it (the
  // pool setmaxnreg moves registers in; hopper.h); 0 where it does not.
  unsigned launch_registers = 0;
  // Per thread, the block-wide barriers (__syncthreads) it has passed: every thread passes the same
  // ones, so a thread whose count exceeds another's count at some moment has passed a barrier that
  // the other reached after that moment (hopper.h orders a fence before a read with it). Each thread
  // writes only its own count.
  std::vector<unsigned> syncs;
  std::atomic<bool> hopper{false};  // a Hopper instruction ran in this launch (hopper.h keeps its state)
};
// Set by hopper.h: what a new block of the launch starts from, what it must finish at its end
// (TMA copies that land, wgmma's never waited for), and what the threads that cannot go on wait for.
inline void (*hopper_block_start)(Block&) = nullptr;
inline void (*hopper_thread_end)(Block&) = nullptr;
inline unsigned (*hopper_report_waits)(Block&) = nullptr;  // prints them; returns how many threads wait
// With fibers: called before the scheduler resumes thread i and after it switched back (hopper.h
// attributes the shared-memory bytes that changed meanwhile to thread i, and arms thread i's
// floating-point trap while its wgmma accumulators are in flight).
inline void (*hopper_fiber_enter)(Block&, unsigned) = nullptr;
inline void (*hopper_fiber_left)(Block&, unsigned) = nullptr;
// Set by an emulated instruction between two waits of its own: the fiber, resumed from the first,
// ran none of the kernel's code before the second, so hopper_fiber_left need not look for its stores.
inline bool fiber_quiet = false;

inline CUDA_EMU_PER_THREAD Block* current_block = nullptr;
inline CUDA_EMU_PER_THREAD unsigned lane_id = 0, warp_id = 0;

// Lane `lane` reads the value that lane `src(lane)` gave; lanes outside the warp read their own.
template <typename T, typename Src>
T exchange(T v, Src src) {
  static_assert(sizeof(T) <= 16, "shuffle of a type wider than 16 bytes");
  Warp& w = current_block->warps[warp_id];
  std::memcpy(w.slot[lane_id], &v, sizeof(T));
  w.barrier.wait();
  const unsigned lanes = (warp_id + 1) * 32 <= blockDim.x * blockDim.y * blockDim.z
                             ? 32u
                             : blockDim.x * blockDim.y * blockDim.z - warp_id * 32;
  const unsigned from = src(lane_id);
  T out = v;
  if (from < lanes) std::memcpy(&out, w.slot[from], sizeof(T));
  w.barrier.wait();  // nobody overwrites a slot before every lane has read it
  return out;
}

// The order blocks run in. A GPU runs them in no promised order (and many at once), so a result
// must not depend on it: with a seed other than 0 the emulation visits the grid's blocks in a
// shuffled order (a fixed permutation per seed), which tests use to show that a kernel's bits do
// not change with it.
inline unsigned block_order_seed = 0;
inline std::vector<uint3> block_order(dim3 grid) {
  std::vector<uint3> order;
  order.reserve(size_t(grid.x) * grid.y * grid.z);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) order.push_back({x, y, z});
  if (block_order_seed != 0) {  // Fisher-Yates with a small LCG: the same order for the same seed
    uint64_t state = block_order_seed;
    for (size_t i = order.size(); i > 1; --i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      std::swap(order[i - 1], order[(state >> 33) % i]);
    }
  }
  return order;
}

inline unsigned thread_index() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// The bytes of a completed copy. Not instrumented in the counting build: the counters count the
// cp.async where it is issued (emu::count::cp_async), and this is the hardware's side of it.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((no_sanitize_address, noinline))
#endif
inline void copy_bytes(void* dst, const void* src, unsigned bytes) {
  auto* d = static_cast<volatile unsigned char*>(dst);
  const auto* from = static_cast<const volatile unsigned char*>(src);
  for (unsigned i = 0; i < bytes; ++i) d[i] = from[i];
}

inline void cp_async(void* dst, const void* src, unsigned bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || reinterpret_cast<uintptr_t>(src) % bytes != 0) {
    std::fprintf(stderr, "cuda_emu: cp.async of %u bytes from %p to %p: both addresses must be %u-byte aligned "
                 "(a misaligned-address fault on a GPU)\n", bytes, src, dst, bytes);
    std::abort();
  }
  CUDA_EMU_COUNT_HOOK(cp_async(dst, src, bytes));
  current_block->copies[thread_index()].copies.push_back({dst, src, bytes});
}
inline void cp_async_commit() {
  AsyncCopies& c = current_block->copies[thread_index()];
  c.group_ends.push_back(c.copies.size());
}
// Complete every committed group but the `pending` most recent ones (cp.async.wait_group).
inline void cp_async_wait(int pending) {
  AsyncCopies& c = current_block->copies[thread_index()];
  if (pending < 0 || c.group_ends.size() <= size_t(pending)) return;
  const size_t groups = c.group_ends.size() - size_t(pending), done = c.group_ends[groups - 1];
  for (size_t i = 0; i < done; ++i) copy_bytes(c.copies[i].dst, c.copies[i].src, c.copies[i].bytes);
  c.copies.erase(c.copies.begin(), c.copies.begin() + done);
  c.group_ends.erase(c.group_ends.begin(), c.group_ends.begin() + groups);
  for (size_t& end : c.group_ends) end -= done;
}
// A thread that returns with copies in flight: they land (as they would on a GPU, eventually).
inline void finish_copies() {
  AsyncCopies& c = current_block->copies[thread_index()];
  for (const PendingCopy& p : c.copies) copy_bytes(p.dst, p.src, p.bytes);
  c.copies.clear();
  c.group_ends.clear();
}

struct Launch {
  dim3 grid, block;
  void (*body)(void*);
  void* arg;
  Block shared_block;
  std::vector<uint3> order;  // the blocks, in the order they run (block_order)
};

// Thread i of a block: its threadIdx, lane and warp.
inline void become_thread(const Launch& l, unsigned i) {
  threadIdx = {i % l.block.x, (i / l.block.x) % l.block.y, i / (l.block.x * l.block.y)};
  lane_id = i % 32;
  warp_id = i / 32;
}

#ifdef CUDA_EMU_THREADS
// The threads of a block, kept between launches (creating up to 1024 OS threads per launch
// would cost more than most of the small kernels the tests run). Worker i plays thread i of
// every block of a launch; a launch wakes workers 0..n-1 and waits until all n are done.
class Pool {
 public:
  int run(Launch& l, unsigned n) {
    std::unique_lock<std::mutex> lock(mutex_);
    while (threads_.size() < n) {
      threads_.emplace_back();
      starts_.push_back({this, static_cast<unsigned>(threads_.size() - 1)});
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setstacksize(&attr, 1 << 20);  // kernels keep little on the stack
      check(pthread_create(&threads_.back(), &attr, &Pool::entry, &starts_.back()), "pthread_create");
      pthread_attr_destroy(&attr);
    }
    launch_ = &l;
    active_ = n;
    remaining_ = n;
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [this] { return remaining_ == 0; });
    launch_ = nullptr;
    return 0;
  }

 private:
  struct Start {
    Pool* pool;
    unsigned index;
  };
  static void* entry(void* p) {
    const Start s = *static_cast<Start*>(p);
    s.pool->work(s.index);
    return nullptr;
  }
  void work(unsigned i) {
    unsigned long seen = 0;
    for (;;) {
      Launch* l;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen && i < active_; });
        seen = generation_;
        l = launch_;
      }
      run_thread(*l, i);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--remaining_ == 0) done_.notify_one();
    }
  }
  static void run_thread(Launch& l, unsigned i) {
    become_thread(l, i);
    blockDim = l.block;
    gridDim = l.grid;
    current_block = &l.shared_block;
    for (const uint3 b : l.order) {
      blockIdx = b;
      l.body(l.arg);
      finish_copies();
      if (l.shared_block.hopper.load() && hopper_thread_end) hopper_thread_end(l.shared_block);
      // The block is over for everyone before the next one reuses its shared memory.
      l.shared_block.barrier.wait();
      if (l.shared_block.hopper.load()) {  // one thread resets the Hopper state, then everyone goes on
        if (i == 0 && hopper_block_start) hopper_block_start(l.shared_block);
        l.shared_block.barrier.wait();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<pthread_t> threads_;
  std::deque<Start> starts_;  // (a deque: pointers to its elements stay valid as it grows)
  Launch* launch_ = nullptr;
  unsigned active_ = 0, remaining_ = 0;
  unsigned long generation_ = 0;
};
inline Pool& executor() {
  static Pool* pool = new Pool;  // never destroyed: its threads live as long as the process
  return *pool;
}
#else
// Runs a launch's blocks one after another, each as blockDim.x·y·z fibers on the calling thread.
class Scheduler {
 public:
  int run(Launch& l, unsigned n) {
    while (fibers_.size() < n) fibers_.push_back({{}, fiber::new_stack(kStackBytes), false, false});
    launch_ = &l;
    blockDim = l.block;
    gridDim = l.grid;
    current_block = &l.shared_block;
    for (const uint3 b : l.order) {
      blockIdx = b;
#ifdef CUDA_EMU_COUNT
      if (!count::block_wanted()) continue;
#endif
      if (l.shared_block.hopper.load() && hopper_block_start) hopper_block_start(l.shared_block);
      for (unsigned i = 0; i < n; ++i) {
        fiber::prepare(fibers_[i].context, fibers_[i].stack, kStackBytes, &Scheduler::thread_body, this);
        fibers_[i].ready = true;
        fibers_[i].done = false;
      }
      unsigned finished = 0;
      while (finished < n) {
        bool resumed = false;
        for (unsigned i = 0; i < n; ++i) {
          if (!fibers_[i].ready) continue;
          resumed = true;
          current_ = i;
          become_thread(l, i);
          const bool hopper = l.shared_block.hopper.load();
          if (hopper && hopper_fiber_enter) hopper_fiber_enter(l.shared_block, i);
          fiber::switch_to(self_, fibers_[i].context);
          if ((hopper || l.shared_block.hopper.load()) && hopper_fiber_left) hopper_fiber_left(l.shared_block, i);
          finished += fibers_[i].done;
        }
        if (!resumed) return never_reached(l, n, finished);
      }
      CUDA_EMU_COUNT_HOOK(interval_end());
    }
    return 0;
  }

  // The running fiber waits in `waiting` until wake() releases it (hopper.h's mbarriers).
  void suspend(std::vector<unsigned>& waiting) {
    const unsigned me = current_;
    waiting.push_back(me);
    fibers_[me].ready = false;
    fiber::switch_to(fibers_[me].context, self_);
  }
  void wake(std::vector<unsigned>& waiting) {
    for (unsigned i : waiting) fibers_[i].ready = true;
    waiting.clear();
  }

  // Called by a fiber at a barrier: the last to arrive releases the others and goes on.
  void wait(Barrier& b) {
    if (++b.arrived == b.expected) {
      if (&b == &current_block->barrier) CUDA_EMU_COUNT_HOOK(interval_end());
      b.arrived = 0;
      for (unsigned i : b.waiting) fibers_[i].ready = true;
      b.waiting.clear();
      return;
    }
    const unsigned me = current_;
    b.waiting.push_back(me);
    fibers_[me].ready = false;
    switched_ = true;
    fiber::switch_to(fibers_[me].context, self_);
  }
  // Whether the running fiber's last wait() switched away (it was not the last to arrive), which it
  // asks right after that wait.
  bool switched() {
    const bool s = switched_;
    switched_ = false;
    return s;
  }

 private:
  static constexpr size_t kStackBytes = 256 << 10;  // mapped, not committed: kernels use a few KiB
  struct Fiber {
    fiber::Context context;
    void* stack;
    bool ready, done;
  };

  static void thread_body(void* self) {
    Scheduler& s = *static_cast<Scheduler*>(self);
    s.launch_->body(s.launch_->arg);
    finish_copies();
    if (s.launch_->shared_block.hopper.load() && hopper_thread_end) hopper_thread_end(s.launch_->shared_block);
    Fiber& f = s.fibers_[s.current_];
    f.ready = false;
    f.done = true;
    fiber::exit_to(f.context, s.self_);
  }

  int never_reached(const Launch& l, unsigned n, unsigned finished) {
    const unsigned at_sync = static_cast<unsigned>(l.shared_block.barrier.waiting.size());
    const unsigned at_mbarrier = l.shared_block.hopper.load() && hopper_report_waits
                                     ? hopper_report_waits(const_cast<Block&>(l.shared_block))
                                     : 0;
    std::fprintf(stderr,
                 "cuda_emu: block (%u,%u,%u) of a %u-thread launch cannot finish: %u threads wait at "
                 "__syncthreads, %u on an mbarrier, %u at a warp-wide instruction, %u have returned. A wait that "
                 "nothing will end hangs (or worse) on a GPU.\n",
                 blockIdx.x, blockIdx.y, blockIdx.z, n, at_sync, at_mbarrier, n - finished - at_sync - at_mbarrier,
                 finished);
    return kBarrierNeverReached;
  }

  std::deque<Fiber> fibers_;  // (a deque: a fiber's context stays where it is as more are added)
  fiber::Context self_;       // the launching thread, while fibers run
  Launch* launch_ = nullptr;
  unsigned current_ = 0;
  bool switched_ = false;
};
inline Scheduler& executor() {
  static Scheduler* scheduler = new Scheduler;  // never destroyed: it keeps the fibers' stacks
  return *scheduler;
}
inline void Barrier::wait() { executor().wait(*this); }
#endif

// kernel<<<grid, block>>>(args...): `fn` is called by every thread of every block. Launches are
// serialised (the static "shared memory" belongs to one launch at a time). Returns 0 or
// kBarrierNeverReached.
// `dynamic_bytes` of dynamic shared memory (kernel<<<grid, block, bytes>>>), which the kernel
// reaches through dynamic_shared().
// `launch_registers`: ptxas's registers a thread for the kernel, where it declares them (0: not).
template <typename F>
int launch(dim3 grid, dim3 block, F&& fn, size_t dynamic_bytes = 0, unsigned launch_registers = 0) {
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > 1024) {
    std::fprintf(stderr, "cuda_emu: invalid block of %u threads\n", n);
    std::abort();
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return 0;  // an empty grid launches nothing
  Launch l{grid, block, [](void* f) { (*static_cast<std::remove_reference_t<F>*>(f))(); }, &fn, {}, block_order(grid)};
  CUDA_EMU_COUNT_HOOK(launch_begin(grid.x, grid.y, grid.z, n));
  l.shared_block.barrier.init(n);
  l.shared_block.warps = std::vector<Warp>((n + 31) / 32);
  l.shared_block.copies = std::vector<AsyncCopies>(n);
  for (unsigned w = 0; w < l.shared_block.warps.size(); ++w)
    l.shared_block.warps[w].barrier.init((w + 1) * 32 <= n ? 32 : n - w * 32);
  l.shared_block.warpgroups = std::vector<Warpgroup>(n / 128);
  std::unique_ptr<unsigned char, void (*)(void*)> dynamic(
      dynamic_bytes ? static_cast<unsigned char*>(std::aligned_alloc(1024, (dynamic_bytes + 1023) / 1024 * 1024)) : nullptr,
      std::free);
  l.shared_block.dynamic_shared = dynamic.get();
  l.shared_block.dynamic_bytes = dynamic_bytes;
  l.shared_block.launch_registers = launch_registers;
  l.shared_block.syncs.assign(n, 0);
  for (auto& g : l.shared_block.warpgroups) g.barrier.init(128);
  protocol_error.store(0);
  if (hopper_block_start) hopper_block_start(l.shared_block);  // nothing left of an earlier launch
  int status = executor().run(l, n);
  CUDA_EMU_COUNT_HOOK(launch_end());
  for (auto& w : l.shared_block.warps) w.barrier.destroy();
  for (auto& g : l.shared_block.warpgroups) g.barrier.destroy();
  l.shared_block.barrier.destroy();
  if (status == 0) status = protocol_error.load();
  return status;
}

}  // namespace emu

inline void __syncthreads() {
  emu::current_block->barrier.wait();
  ++emu::current_block->syncs[emu::thread_index()];
}
namespace emu {
inline unsigned char* dynamic_shared() { return current_block->dynamic_shared; }
}  // namespace emu

// Warp shuffles (all 32 lanes of the warp take part: `mask` must be the full warp).
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
  return emu::exchange(v, [delta](unsigned lane) { return lane + delta; });
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  return emu::exchange(v, [mask](unsigned lane) { return lane ^ unsigned(mask); });
}

#include "warp_matrix.h"  // mma.sync, ldmatrix, cvt.rna.tf32 (needs the warps and barriers above)
#include "hopper.h"       // wgmma, TMA, mbarrier
