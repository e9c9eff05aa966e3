// The CUDA execution model in plain C++, enough of it to run cuda/kernels/*.cuh on a CPU.
//
// Build (what cuda/emulated.py runs):
//   c++ -std=c++17 -O2 -pthread -shared -fPIC -Icuda cuda/emulate/emulate.cpp -o /tmp/libdense_emu.so
//
// A grid is a loop over blocks; a block is a team of real threads (pthreads) that meet at a
// barrier. Concretely:
//   - blocks run one after another; blockDim.x·y·z real threads (kept in a pool between
//     launches) walk the blocks together, meeting at a pthread barrier after each block;
//   - __syncthreads() is pthread_barrier_wait on the block's barrier (ThreadSanitizer models
//     pthread barriers, so it sees the same happens-before edges the GPU guarantees);
//   - __shared__ becomes `static`: one copy per kernel instantiation, and since only one block
//     runs at a time, that is one copy per block, as on the GPU;
//   - threadIdx/blockIdx/blockDim/gridDim are thread_local variables set before the kernel runs;
//   - a warp is 32 consecutive threads (x fastest); __shfl_*_sync meet at a per-warp barrier and
//     exchange values through a per-warp buffer, so every lane of the warp must call them.
// Not modelled: warps executing in lock step (code relying on it without __syncwarp is a race
// here, as it is on Volta and later), timing, coalescing, caches, bank conflicts, the limits of
// registers and shared memory, and uninitialised shared memory (static storage starts at zero).
// A __syncthreads that not every thread of the block reaches deadlocks here; on a GPU it is
// undefined behaviour.
#pragma once

// Standard headers first: the macros below (e.g. __noinline__) would break their attributes.
#include <pthread.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
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

inline thread_local uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;

namespace emu {

inline void check(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "cuda_emu: %s failed (%d)\n", what, rc);
    std::abort();
  }
}

// One warp's meeting point for the shuffles.
struct Warp {
  pthread_barrier_t barrier;
  alignas(16) unsigned char slot[32][16];
};

struct Block {
  pthread_barrier_t barrier;
  std::vector<Warp> warps;
};

inline thread_local Block* current_block = nullptr;
inline thread_local unsigned lane_id = 0, warp_id = 0;

inline unsigned linear_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// Lane `lane` reads the value that lane `src(lane)` gave; lanes outside the warp read their own.
template <typename T, typename Src>
T exchange(T v, Src src) {
  static_assert(sizeof(T) <= 16, "shuffle of a type wider than 16 bytes");
  Warp& w = current_block->warps[warp_id];
  std::memcpy(w.slot[lane_id], &v, sizeof(T));
  pthread_barrier_wait(&w.barrier);
  const unsigned lanes = (warp_id + 1) * 32 <= blockDim.x * blockDim.y * blockDim.z
                             ? 32u
                             : blockDim.x * blockDim.y * blockDim.z - warp_id * 32;
  const unsigned from = src(lane_id);
  T out = v;
  if (from < lanes) std::memcpy(&out, w.slot[from], sizeof(T));
  pthread_barrier_wait(&w.barrier);  // nobody overwrites a slot before every lane has read it
  return out;
}

struct Launch {
  dim3 grid, block;
  void (*body)(void*);
  void* arg;
  Block shared_block;
};

// The threads of a block, kept between launches (creating up to 1024 OS threads per launch
// would cost more than most of the small kernels the tests run). Worker i plays thread i of
// every block of a launch; a launch wakes workers 0..n-1 and waits until all n are done.
class Pool {
 public:
  void run(Launch& l, unsigned n) {
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
    threadIdx = {i % l.block.x, (i / l.block.x) % l.block.y, i / (l.block.x * l.block.y)};
    blockDim = l.block;
    gridDim = l.grid;
    current_block = &l.shared_block;
    lane_id = i % 32;
    warp_id = i / 32;
    for (unsigned z = 0; z < l.grid.z; ++z)
      for (unsigned y = 0; y < l.grid.y; ++y)
        for (unsigned x = 0; x < l.grid.x; ++x) {
          blockIdx = {x, y, z};
          l.body(l.arg);
          // The block is over for everyone before the next one reuses its shared memory.
          pthread_barrier_wait(&l.shared_block.barrier);
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

// kernel<<<grid, block>>>(args...): `fn` is called by every thread of every block. Launches are
// serialised (the static "shared memory" belongs to one launch at a time).
template <typename F>
void launch(dim3 grid, dim3 block, F&& fn) {
  static std::mutex one_at_a_time;
  std::lock_guard<std::mutex> lock(one_at_a_time);
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n > 1024) {
    std::fprintf(stderr, "cuda_emu: invalid block of %u threads\n", n);
    std::abort();
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // an empty grid launches nothing
  Launch l{grid, block, [](void* f) { (*static_cast<std::remove_reference_t<F>*>(f))(); }, &fn, {}};
  check(pthread_barrier_init(&l.shared_block.barrier, nullptr, n), "pthread_barrier_init");
  l.shared_block.warps = std::vector<Warp>((n + 31) / 32);
  for (unsigned w = 0; w < l.shared_block.warps.size(); ++w) {
    const unsigned lanes = (w + 1) * 32 <= n ? 32 : n - w * 32;
    check(pthread_barrier_init(&l.shared_block.warps[w].barrier, nullptr, lanes), "pthread_barrier_init");
  }
  static Pool* pool = new Pool;  // never destroyed: its threads live as long as the process
  pool->run(l, n);
  for (auto& w : l.shared_block.warps) pthread_barrier_destroy(&w.barrier);
  pthread_barrier_destroy(&l.shared_block.barrier);
}

}  // namespace emu

inline void __syncthreads() { pthread_barrier_wait(&emu::current_block->barrier); }

// Warp shuffles (all 32 lanes of the warp take part: `mask` must be the full warp).
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta) {
  return emu::exchange(v, [delta](unsigned lane) { return lane + delta; });
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  return emu::exchange(v, [mask](unsigned lane) { return lane ^ unsigned(mask); });
}
